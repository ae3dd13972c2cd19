//! Cost models: how much arithmetic an op does (FLOPs), for passes that trade compute for
//! memory (`remat`) and for reports; and a roofline time model, for passes that choose between
//! equivalent programs (`eqsat`).
//!
//! FLOPs. Multiply-add heavy ops count two FLOPs per multiply-add: `matmul` is `2·M·N·K` per
//! batch, `conv2d` and its two gradients `2 · output elements · C/groups · kH · kW` (the same
//! contraction seen from each side). Pooling counts one per window element. Ops that only
//! relabel or alias a buffer (`reshape`, `identity`, `stop_gradient`, `const`) cost nothing.
//! Everything else costs one per element of its largest operand or result (elementwise ops,
//! reductions, softmax, data movement).
//!
//! Time. A kernel takes `launch + max(FLOPs / peak, bytes / bandwidth)` ([`Machine`]): the bytes
//! are its operands read and its result written. A matrix or convolution kernel large enough
//! to be split among the threads also pays a synchronisation (publishing the work, waiting for
//! the slowest thread). Constants, when all the program's fit in the last-level cache together,
//! stay there between runs and are read at the cache's bandwidth (a batch-1 recurrent cell's
//! weights: its products are bound by reading them, several times faster than from memory).
//! A chain of elementwise ops is one kernel (as the CPU backend fuses them): a value made by an
//! elementwise op and read only by elementwise ops is never stored, and costs neither the
//! write, the reads nor a launch. A matmul or convolution whose only reader is elementwise runs
//! it as an epilogue: its result is not stored and the reader starts no kernel. An op whose
//! operands are all constants is folded at compile time and costs nothing; so do ops that only
//! relabel a buffer. [`estimate`] applies this to a function, [`Dag`] to any program in that
//! shape (the e-graph's extractions).
use tcc_ir::{Function, Op, OpKind, TensorType};

/// The FLOPs of `op` in `f` under the model above.
pub fn flops(f: &Function, op: Op) -> u64 {
    let d = f.op(op);
    let args: Vec<&TensorType> = d.args.iter().map(|&a| f.ty(a)).collect();
    let results: Vec<&TensorType> = d.results.iter().map(|&r| f.ty(r)).collect();
    op_flops(&d.kind, &args, &results)
}

/// The FLOPs of an op `kind` with operands and results of these types.
pub fn op_flops(kind: &OpKind, args: &[&TensorType], results: &[&TensorType]) -> u64 {
    let numel = |i: usize| args[i].numel();
    let out = || results[0].numel();
    let window = |k: [u64; 2]| k[0].saturating_mul(k[1]);
    match kind {
        OpKind::Const { .. } | OpKind::Reshape { .. } | OpKind::Identity | OpKind::StopGradient => {
            0
        }
        // Copies between memory spaces: bytes over a link, no arithmetic.
        OpKind::SwapOut | OpKind::SwapIn => 0,
        OpKind::MatMul | OpKind::MatMulInteger => {
            let k = args[0].dims().last().copied().unwrap_or(1);
            out().saturating_mul(k).saturating_mul(2)
        }
        // The filter is operand 1 of conv2d and conv2d_grad_input; its shape is an attribute
        // of conv2d_grad_filter.
        OpKind::Conv2d(_)
        | OpKind::ConvInteger(_)
        | OpKind::Conv2dNchwc { .. }
        | OpKind::Conv2dGradInput { .. } => {
            let w = args[1].dims();
            let taps = w[1..].iter().product::<u64>();
            let y = match kind {
                OpKind::Conv2d(_) | OpKind::ConvInteger(_) => out(),
                // The padding lanes of the output's last block are not computed.
                OpKind::Conv2dNchwc { .. } => {
                    let yd = results[0].dims();
                    yd[0] * w[0] * yd[2] * yd[3]
                }
                _ => numel(0),
            };
            y.saturating_mul(taps).saturating_mul(2)
        }
        OpKind::Conv2dGradFilter { shape, .. } => {
            let taps = shape[1..].iter().product::<u64>();
            numel(1).saturating_mul(taps).saturating_mul(2)
        }
        OpKind::MaxPool2d(p) | OpKind::AvgPool2d { pool: p, .. } => {
            out().saturating_mul(window(p.kernel))
        }
        OpKind::MaxPool2dGrad(p) | OpKind::AvgPool2dGrad { pool: p, .. } => {
            let dy = if matches!(kind, OpKind::MaxPool2dGrad(_)) {
                numel(1)
            } else {
                numel(0)
            };
            dy.saturating_mul(window(p.kernel))
        }
        OpKind::TopK { axis, .. } => {
            // A sort of each line: n log n comparisons.
            let x = args[0].dims();
            let len = tcc_ir::ops::normalize_axis(*axis, x.len()).map_or(1, |a| x[a]);
            numel(0).saturating_mul(64 - len.max(1).leading_zeros() as u64)
        }
        // The nudge and the rounding: about twenty operations per element.
        OpKind::FakeQuant { .. } => out().saturating_mul(20),
        OpKind::Unary(_)
        | OpKind::Binary(_)
        | OpKind::Compare(_)
        | OpKind::QuantizeLinear
        | OpKind::DequantizeLinear
        | OpKind::Select
        | OpKind::BroadcastTo { .. }
        | OpKind::Cast { .. }
        | OpKind::GlobalAvgPool
        | OpKind::Reduce { .. }
        | OpKind::Softmax { .. }
        | OpKind::LogSoftmax { .. }
        | OpKind::SoftmaxCrossEntropy
        | OpKind::SoftmaxCrossEntropyGrad
        | OpKind::BatchNorm { .. }
        | OpKind::BatchNormTrain { .. }
        | OpKind::Transpose { .. }
        | OpKind::Concat { .. }
        | OpKind::Slice { .. }
        | OpKind::SliceGrad { .. }
        | OpKind::ToNchwc { .. }
        | OpKind::FromNchwc { .. }
        | OpKind::Gather { .. }
        | OpKind::ScatterAdd { .. } => (args.iter().chain(results))
            .map(|t| t.numel())
            .max()
            .unwrap_or(0),
    }
}

/// The constants of the time model. Fixed defaults keep passes that use it deterministic on
/// every machine; measured ones or the user's go in explicitly.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Machine {
    /// Sustained arithmetic of the tuned matrix and convolution kernels, GFLOP/s.
    pub gflops: f64,
    /// Sustained arithmetic of generated kernels (elementwise, reductions, data movement),
    /// GFLOP/s.
    pub vector_gflops: f64,
    /// Sustained memory bandwidth, GB/s.
    pub gbps: f64,
    /// Fixed cost of running one kernel, microseconds.
    pub launch_us: f64,
    /// Further fixed cost of a matrix or convolution kernel split among the threads,
    /// microseconds.
    pub sync_us: f64,
    /// Size of the last-level cache, MiB.
    pub cache_mib: f64,
    /// Bandwidth of reads from the last-level cache, GB/s.
    pub cache_gbps: f64,
}

/// Bytes a kernel moves: from and to memory, and read from the last-level cache.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Traffic {
    /// Bytes read from or written to memory.
    pub memory: u64,
    /// Bytes read from the last-level cache.
    pub cached: u64,
}

impl Traffic {
    /// `bytes` from or to memory.
    pub fn memory(bytes: u64) -> Traffic {
        Traffic {
            memory: bytes,
            cached: 0,
        }
    }
}

/// A matrix or convolution kernel with at least this many multiply-adds is split among the
/// threads (the CPU backend's threshold for a matrix-vector product, its smallest split).
const SPLIT_MULADDS: u64 = 1 << 16;

impl Machine {
    /// Two cores of a 2021 server CPU with AVX2 and FMA (an EPYC Zen 3 VM, measured with `tcc
    /// calibrate`): about 140 GFLOP/s in a large sgemm, 24 GFLOP/s in generated 4-lane kernels
    /// (one operation per lane per cycle at 3 GHz), 20 GB/s streaming from memory, 100 GB/s
    /// from its 32 MiB L3, half a microsecond to run a small kernel and two and a half more to
    /// split one among the threads and wait for them.
    pub const DEFAULT: Machine = Machine {
        gflops: 140.0,
        vector_gflops: 24.0,
        gbps: 20.0,
        launch_us: 0.5,
        sync_us: 2.5,
        cache_mib: 32.0,
        cache_gbps: 100.0,
    };

    /// Seconds for a kernel of `kind` doing `flops` and moving `bytes`, launch included.
    pub fn kernel_time(&self, kind: &OpKind, flops: u64, bytes: Traffic) -> f64 {
        let split = is_library(kind) && flops / 2 >= SPLIT_MULADDS;
        let fixed = self.launch_us + if split { self.sync_us } else { 0.0 };
        fixed * 1e-6 + self.body_time(kind, flops, bytes)
    }

    /// Seconds for `flops` and `bytes` of a kernel of `kind`, without the launch.
    pub fn body_time(&self, kind: &OpKind, flops: u64, bytes: Traffic) -> f64 {
        let rate = match kind {
            OpKind::MatMul
            | OpKind::MatMulInteger
            | OpKind::Conv2d(_)
            | OpKind::Conv2dNchwc { .. }
            | OpKind::Conv2dGradInput { .. }
            | OpKind::Conv2dGradFilter { .. } => self.gflops,
            _ => self.vector_gflops,
        };
        let moving =
            bytes.memory as f64 / (self.gbps * 1e9) + bytes.cached as f64 / (self.cache_gbps * 1e9);
        (flops as f64 / (rate * 1e9)).max(moving)
    }

    /// Whether constants of `bytes` in all fit in the last-level cache.
    pub fn fits_in_cache(&self, bytes: u64) -> bool {
        bytes as f64 <= self.cache_mib * (1u64 << 20) as f64
    }
}

impl Default for Machine {
    fn default() -> Machine {
        Machine::DEFAULT
    }
}

/// Arithmetic per element of an elementwise op relative to an add, for the time model: the
/// transcendental functions are polynomial expansions of a dozen or more operations, division
/// and square roots take several cycles, and `pow` (but for exponents 0, 1, 2 and -1) runs on
/// the reference kernels, in f64: about 60 ns an element measured (Inception-v1's local
/// response normalisation on an EPYC Zen 3), a thousand generated adds. (The FLOP
/// model counts one for each; `remat` ranks by it.)
pub fn elementwise_weight(kind: &OpKind) -> u64 {
    use tcc_ir::{BinaryOp as B, UnaryOp as U};
    match kind {
        OpKind::Unary(U::Exp | U::Log | U::Sigmoid | U::Tanh) => 12,
        OpKind::Unary(U::Erf | U::Gelu) => 16,
        OpKind::Unary(U::Sqrt | U::Rsqrt | U::Reciprocal) | OpKind::Binary(B::Div) => 4,
        OpKind::Binary(B::Pow) => 1000,
        _ => 1,
    }
}

/// The FLOPs the time model charges for an op: [`op_flops`], elementwise ops weighted by
/// [`elementwise_weight`].
pub fn time_flops(kind: &OpKind, args: &[&TensorType], results: &[&TensorType]) -> u64 {
    op_flops(kind, args, results).saturating_mul(elementwise_weight(kind))
}

/// Whether an op only relabels or aliases its operand's buffer (no kernel runs).
pub fn is_free(kind: &OpKind) -> bool {
    matches!(
        kind,
        OpKind::Const { .. } | OpKind::Reshape { .. } | OpKind::Identity | OpKind::StopGradient
    )
}

/// Where an operand of a [`Dag`] op comes from.
#[derive(Clone, Debug)]
pub enum Operand {
    /// A function input: read from memory.
    Input(TensorType),
    /// A constant: read from memory, but an op reading only constants is folded away.
    Const(TensorType),
    /// The result of an earlier op of the dag, by index.
    Op(usize),
}

/// One op of a [`Dag`].
#[derive(Clone, Debug)]
pub struct DagOp {
    /// What it computes.
    pub kind: OpKind,
    /// Its operands.
    pub args: Vec<Operand>,
    /// Its (first) result's type.
    pub ty: TensorType,
    /// Whether the result leaves the program (and so is stored).
    pub returned: bool,
}

/// A program as the time model sees it: ops in a topological order.
#[derive(Clone, Debug, Default)]
pub struct Dag {
    /// The ops; an op reads only earlier ones.
    pub ops: Vec<DagOp>,
}

impl Dag {
    /// The dag of a function's scheduled ops (constants become [`Operand::Const`]).
    pub fn of_function(f: &Function) -> Dag {
        let mut index = cranelift_entity::SecondaryMap::<tcc_ir::Value, Option<usize>>::new();
        let mut dag = Dag::default();
        for &op in f.schedule() {
            let d = f.op(op);
            if matches!(d.kind, OpKind::Const { .. }) {
                continue;
            }
            let args = (d.args.iter())
                .map(|&a| match (index[a], f.def_op(a).map(|o| &f.op(o).kind)) {
                    (Some(i), _) => Operand::Op(i),
                    (None, Some(OpKind::Const { ty, .. })) => Operand::Const(ty.clone()),
                    (None, _) => Operand::Input(f.ty(a).clone()),
                })
                .collect();
            for &r in &d.results {
                index[r] = Some(dag.ops.len());
            }
            dag.ops.push(DagOp {
                kind: d.kind.clone(),
                args,
                ty: f.ty(d.results[0]).clone(),
                returned: false,
            });
        }
        for &r in f.results() {
            if let Some(i) = index[r] {
                dag.ops[i].returned = true;
            }
        }
        dag
    }

    /// The type of the value `a` reads.
    fn operand_ty<'a>(&'a self, a: &'a Operand) -> &'a TensorType {
        match a {
            Operand::Input(t) | Operand::Const(t) => t,
            Operand::Op(j) => &self.ops[*j].ty,
        }
    }

    /// Estimated seconds to run the dag on `m`, under the model in the module docs.
    pub fn time(&self, m: &Machine) -> f64 {
        let mut readers_fuse = vec![true; self.ops.len()];
        let mut folded = vec![false; self.ops.len()];
        for (i, op) in self.ops.iter().enumerate() {
            folded[i] = op.args.iter().all(|a| match a {
                Operand::Const(_) => true,
                Operand::Input(_) => false,
                Operand::Op(j) => folded[*j],
            }) && !op.args.is_empty();
            for a in &op.args {
                if let Operand::Op(j) = a {
                    readers_fuse[*j] &= op.kind.is_elementwise();
                }
            }
        }
        // A value is kept in registers when an elementwise op makes it and only elementwise ops
        // read it.
        let fused = |i: usize| {
            self.ops[i].kind.is_elementwise() && readers_fuse[i] && !self.ops[i].returned
        };
        // A matmul or convolution whose one reader is elementwise runs that reader as its
        // epilogue, on the tile in registers (the CPU backend's fused bias and activation).
        let mut readers = vec![0usize; self.ops.len()];
        for op in &self.ops {
            let mut seen: Vec<usize> = Vec::new();
            for a in &op.args {
                if let Operand::Op(j) = a
                    && !seen.contains(j)
                {
                    seen.push(*j);
                    readers[*j] += 1;
                }
            }
        }
        let epilogue = |i: usize| {
            let o = &self.ops[i];
            is_library(&o.kind) && readers[i] == 1 && readers_fuse[i] && !o.returned
        };
        // Constants, and results folded from constants (merged weights).
        let constant = |a: &Operand| match a {
            Operand::Const(_) => true,
            Operand::Input(_) => false,
            Operand::Op(j) => folded[*j],
        };
        let consts: u64 = (self.ops.iter().enumerate())
            .filter(|&(i, op)| !folded[i] && !is_free(&op.kind))
            .flat_map(|(_, op)| &op.args)
            .filter(|a| constant(a))
            .map(|a| self.operand_ty(a).size_bytes())
            .sum();
        let cached_consts = m.fits_in_cache(consts);
        let mut total = 0.0;
        for (i, op) in self.ops.iter().enumerate() {
            if folded[i] || is_free(&op.kind) {
                continue;
            }
            let mut bytes = Traffic::default();
            let mut is_epilogue = false;
            let mut tys = Vec::with_capacity(op.args.len());
            for a in &op.args {
                let ty = self.operand_ty(a);
                tys.push(ty);
                let from_epilogue = matches!(a, Operand::Op(j) if epilogue(*j));
                is_epilogue |= from_epilogue;
                let in_registers = matches!(a, Operand::Op(j) if fused(*j)) || from_epilogue;
                if constant(a) && cached_consts {
                    bytes.cached += ty.size_bytes();
                } else if !in_registers {
                    bytes.memory += ty.size_bytes();
                }
            }
            let flops = time_flops(&op.kind, &tys, &[&op.ty]);
            if !(fused(i) || epilogue(i)) {
                bytes.memory += op.ty.size_bytes();
            }
            total += if fused(i) || is_epilogue {
                m.body_time(&op.kind, flops, bytes)
            } else {
                m.kernel_time(&op.kind, flops, bytes)
            };
        }
        total
    }
}

/// Whether an op runs on the tuned matrix kernels (which take elementwise epilogues).
pub fn is_library(kind: &OpKind) -> bool {
    matches!(
        kind,
        OpKind::MatMul | OpKind::Conv2d(_) | OpKind::Conv2dNchwc { .. }
    )
}

/// Estimated seconds to run `f` on `m` (see the module docs).
pub fn estimate(f: &Function, m: &Machine) -> f64 {
    Dag::of_function(f).time(m)
}

#[cfg(test)]
mod tests {
    use super::flops;
    use tcc_ir::parse_function;

    #[test]
    fn matmul_conv_and_elementwise() {
        let f = parse_function(
            "func @f(%a: f32[2,3,4], %b: f32[4,5], %x: f32[1,3,8,8], %w: f32[6,3,3,3]) -> (f32[2,3,5], f32[1,6,6,6]) {
  %m = matmul %a, %b : f32[2,3,5]
  %t = tanh %m : f32[2,3,5]
  %r = reshape %t {shape=[30]} : f32[30]
  %c = conv2d %x, %w : f32[1,6,6,6]
  %p = max_pool2d %c {kernel=[2,2]} : f32[1,6,5,5]
  return %t, %c
}",
        )
        .unwrap();
        let costs: Vec<u64> = f.schedule().iter().map(|&op| flops(&f, op)).collect();
        // 2*3*5 outputs x K=4 x 2; 30 elements; a reshape is free; 216 outputs x 27 taps x 2;
        // 150 outputs x 4 window elements.
        assert_eq!(costs, vec![240, 30, 0, 216 * 27 * 2, 150 * 4]);
    }
}

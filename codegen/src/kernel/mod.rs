//! The backend-neutral kernel layer: which planned kernels can be written as loops over an
//! expression body, how their operands are indexed, and the bodies themselves.
//!
//! A backend takes a kernel's shape from here (elementwise; a softmax row; a reduction
//! `[a, l, b]` over its middle axes; reductions over rows with the ops around them, [`rows`]), its operands' [`Access`] patterns, and the [`expr::Body`]
//! of each part (prologue, epilogue, the row's passes) built by [`lower`] from the ops. It then
//! decides only how to loop and how to render each node: Cranelift in `cpu/jit/`, and the
//! same bodies are what a GPU backend renders per thread. The transcendental functions are
//! expanded here once ([`math`]).

pub mod expr;
pub mod lower;
pub mod math;
pub mod rows;

use crate::plan::{KernelData, KernelKind};
use expr::Lane;
use tcc_ir::{BinaryOp, DType, Function, OpKind, Value};

/// How an operand is indexed for output element `i`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Access {
    /// Element `i`.
    Same,
    /// One value for every element (an immediate if `Some`).
    Scalar(Option<f64>),
    /// Element `(i / inner) % n`.
    Block {
        /// Output elements per operand element.
        inner: u64,
        /// Operand elements.
        n: u64,
    },
    /// Element `((i / outer_inner) % outer_n) * n + (i / inner) % n`: the operand's axes are
    /// two runs of output axes with broadcast axes between them (`[N, 1, H, W]` read for
    /// `[N, C, H, W]`, a mean over channels kept for a subtraction).
    Gapped {
        /// Output elements per step of the inner run.
        inner: u64,
        /// Operand elements of the inner run.
        n: u64,
        /// Output elements per step of the outer run.
        outer_inner: u64,
        /// Operand elements of the outer run.
        outer_n: u64,
    },
}

/// The access pattern for an operand of `dims` broadcast to `out`, if it is one of the four.
pub fn access(dims: &[u64], out: &[u64]) -> Option<Access> {
    let numel: u64 = dims.iter().product();
    let out_numel: u64 = out.iter().product();
    if dims.len() > out.len() {
        return None;
    }
    if dims == out {
        return Some(Access::Same);
    }
    if numel == 1 {
        return Some(Access::Scalar(None));
    }
    // The operand's non-1 axes must match the output's, in at most two runs of adjacent axes.
    let offset = out.len() - dims.len();
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for k in (0..dims.len()).filter(|&k| dims[k] != 1) {
        let o = k + offset;
        if out[o] != dims[k] {
            return None;
        }
        match runs.last_mut() {
            Some(r) if r.1 == o => r.1 = o + 1,
            _ => runs.push((o, o + 1)),
        }
    }
    let span = |(a, b): (usize, usize)| -> (u64, u64) {
        (out[a..b].iter().product(), out[b..].iter().product())
    };
    match runs[..] {
        [run] => {
            let (n, inner) = span(run);
            if n * inner == out_numel && inner == 1 && run.0 == 0 {
                return Some(Access::Same);
            }
            Some(Access::Block { inner, n })
        }
        [outer, run] => {
            let (n, inner) = span(run);
            let (outer_n, outer_inner) = span(outer);
            Some(Access::Gapped {
                inner,
                n,
                outer_inner,
                outer_n,
            })
        }
        _ => None,
    }
}

/// Whether the expression form has elementwise op `op` of `f`.
pub fn supported_op(f: &Function, op: tcc_ir::Op) -> bool {
    let d = f.op(op);
    match &d.kind {
        OpKind::Unary(_) => true,
        OpKind::Binary(BinaryOp::Pow) => pow_exponent(f, d.args[1]).is_some(),
        OpKind::Binary(_) => true,
        OpKind::Identity | OpKind::StopGradient | OpKind::BroadcastTo { .. } => true,
        OpKind::FakeQuant { .. } => true,
        // Between dtype families (floats and bytes): not in one lane; the reference kernels
        // run them for now.
        OpKind::QuantizeLinear | OpKind::DequantizeLinear => false,
        // Masks: comparisons, used by `select` and casts in the same kernel.
        OpKind::Compare(_) | OpKind::Select => true,
        OpKind::Cast { to } => !matches!(to, DType::Bool | DType::I64),
        // Not elementwise: rows, reductions and library kernels handle these.
        OpKind::Const { .. }
        | OpKind::MatMul
        | OpKind::MatMulInteger
        | OpKind::ConvInteger(_)
        | OpKind::Conv2d(_)
        | OpKind::Conv2dNchwc { .. }
        | OpKind::ToNchwc { .. }
        | OpKind::FromNchwc { .. }
        | OpKind::MaxPool2d(_)
        | OpKind::AvgPool2d { .. }
        | OpKind::GlobalAvgPool
        | OpKind::Reduce { .. }
        | OpKind::Softmax { .. }
        | OpKind::LogSoftmax { .. }
        | OpKind::SoftmaxCrossEntropy
        | OpKind::TopK { .. }
        | OpKind::BatchNorm { .. }
        | OpKind::BatchNormTrain { .. }
        | OpKind::Reshape { .. }
        | OpKind::Transpose { .. }
        | OpKind::Concat { .. }
        | OpKind::Slice { .. }
        | OpKind::Gather { .. }
        | OpKind::ScatterAdd { .. }
        | OpKind::SwapOut
        | OpKind::SwapIn
        | OpKind::Conv2dGradInput { .. }
        | OpKind::Conv2dGradFilter { .. }
        | OpKind::SoftmaxCrossEntropyGrad
        | OpKind::MaxPool2dGrad(_)
        | OpKind::AvgPool2dGrad { .. }
        | OpKind::SliceGrad { .. } => false,
    }
}

/// The exponent of a `pow` whose exponent `e` is a constant the expression form computes
/// exactly as the reference does (correctly rounded): 0, 1, 2 (`x * x`) and -1 (`1 / x`), on
/// floats. Other powers stay on the reference kernels.
pub fn pow_exponent(f: &Function, e: Value) -> Option<f64> {
    if !f.ty(e).dtype().is_float() {
        return None;
    }
    splat_number(f, e).filter(|e| [0.0, 1.0, 2.0, -1.0].contains(e))
}

/// The lane kernel `k` computes in, if every value but the masks has a dtype of one family:
///
/// - `F32` or `F64`: every value of that dtype; `f64` kernels may not use the transcendental
///   functions, whose approximations are tuned for `f32` (those stay on the reference kernels);
/// - `I32`: every value `i32`, `i8` or `u8` (8-bit values are widened to 32-bit lanes when
///   loaded and wrapped back after each op), and no division (whose error on a zero divisor
///   the reference kernels report).
///
/// Masks are `bool` values that comparisons produce (inside the kernel, or in another kernel
/// that stored them) and only `select` conditions and casts consume. An `f32` kernel may also compare `i32` values (one-hot
/// masks: integer labels against class ids) or convert them to `f32` (integer products'
/// accumulators), reading them as their bits: [`int_bits`].
pub fn kernel_lane(f: &Function, k: &KernelData) -> Option<Lane> {
    // The dtype of the last result that is not a mask; a kernel of comparisons only computes
    // in its operands' dtype.
    let dtype = (k.ops.iter().rev())
        .map(|&op| f.ty(f.op(op).results[0]).dtype())
        .find(|&d| d != DType::Bool)
        .or_else(|| k.ops.first().map(|&op| f.ty(f.op(op).args[0]).dtype()))?;
    let lane = match dtype {
        DType::F32 => Lane::F32,
        DType::F64 => Lane::F64,
        DType::I32 | DType::I8 | DType::U8 => Lane::I32,
        DType::I64 | DType::Bool => return None,
    };
    let int = lane == Lane::I32;
    // The masks the kernel computes itself (sets: kernels can hold thousands of ops).
    let masks: std::collections::HashSet<Value> = k
        .ops
        .iter()
        .filter(|&&p| matches!(f.op(p).kind, OpKind::Compare(_)))
        .map(|&p| f.op(p).results[0])
        .collect();
    let stored: std::collections::HashSet<Value> = k.outputs.iter().copied().collect();
    // Masks from memory: `bool` inputs (a comparison another kernel stored, as the backward
    // of a `select` reads the forward's). Bool values read or stored are bytes, in the scalar
    // loop.
    let inside =
        |v: Value| masks.contains(&v) || (f.ty(v).dtype() == DType::Bool && k.inputs.contains(&v));
    let num = |v: &Value| {
        let d = f.ty(*v).dtype();
        if int {
            matches!(d, DType::I32 | DType::I8 | DType::U8)
        } else {
            d == dtype
        }
    };
    let bits =
        |v: &Value| lane == Lane::F32 && f.ty(*v).dtype() == DType::I32 && !stored.contains(v);
    k.ops
        .iter()
        .all(|&op| {
            let d = f.op(op);
            match d.kind {
                OpKind::Compare(_) => d.args.iter().all(num) || d.args.iter().all(bits),
                OpKind::BroadcastTo { .. } | OpKind::Identity | OpKind::StopGradient
                    if d.args.iter().chain(&d.results).all(bits) =>
                {
                    true
                }
                OpKind::Select => {
                    inside(d.args[0]) && d.args[1..].iter().chain(&d.results).all(num)
                }
                // An `f32` kernel converts `i32` operands read as bits (the accumulators of
                // integer products, scaled back to floats).
                OpKind::Cast { .. } => {
                    (inside(d.args[0]) || num(&d.args[0]) || bits(&d.args[0]))
                        && d.results.iter().all(num)
                }
                OpKind::Unary(u) if lane == Lane::F64 && math::approximated(u) => false,
                OpKind::Binary(BinaryOp::Div) if int => false,
                _ => d.args.iter().chain(&d.results).all(num),
            }
        })
        .then_some(lane)
}

/// Whether every value of kernel `k` is `f32` but for masks (see [`kernel_lane`]): what row and
/// reduction kernels need (they read no integer bits).
pub fn f32_with_masks(f: &Function, k: &KernelData) -> bool {
    let bool_io = (k.inputs.iter().chain(&k.outputs)).any(|&v| f.ty(v).dtype() == DType::Bool);
    !bool_io
        && kernel_lane(f, k) == Some(Lane::F32)
        && k.ops.iter().all(|&op| {
            let d = f.op(op);
            d.args
                .iter()
                .chain(&d.results)
                .all(|&v| !int_bits(f, v, Lane::F32))
        })
}

/// Whether value `v` of a kernel computing in `lane` is an `i32` it only compares or converts,
/// read as its bits (an `f32` kernel's integer operands, see [`kernel_lane`]). Such operands are loaded
/// raw, never as an immediate number.
pub fn int_bits(f: &Function, v: Value, lane: Lane) -> bool {
    lane == Lane::F32 && f.ty(v).dtype() == DType::I32
}

/// The splat value of `v` if it is defined by a splat constant a lane holds exactly (a float,
/// or an `i32`, `i8` or `u8`).
pub fn splat_number(f: &Function, v: Value) -> Option<f64> {
    match f.def_op(v).map(|op| &f.op(op).kind) {
        Some(OpKind::Const { value, .. }) => match value.as_splat()? {
            tcc_ir::Scalar::F32(x) => Some(x as f64),
            tcc_ir::Scalar::F64(x) => Some(x),
            tcc_ir::Scalar::I32(x) => Some(x as f64),
            tcc_ir::Scalar::I8(x) => Some(x as f64),
            tcc_ir::Scalar::U8(x) => Some(x as f64),
            tcc_ir::Scalar::I64(_) | tcc_ir::Scalar::Bool(_) => None,
        },
        _ => None,
    }
}

/// The lane of `k` if it is an elementwise kernel in this form (see [`kernel_lane`]), made of
/// supported ops whose operands it can index.
pub fn elementwise_lane(f: &Function, k: &KernelData) -> Option<Lane> {
    if k.kind != KernelKind::Elementwise {
        return None;
    }
    let out = f.ty(f.op(k.ops[0]).results[0]).dims();
    let readable = k.ops.iter().all(|&op| supported_op(f, op))
        && k.inputs
            .iter()
            .all(|&v| access(f.ty(v).dims(), out).is_some());
    if readable { kernel_lane(f, k) } else { None }
}

/// Whether `k` is an elementwise kernel in this form.
pub fn can_compile(f: &Function, k: &KernelData) -> bool {
    elementwise_lane(f, k).is_some()
}

/// The loop nest a kernel is written as, if it is in this form: decided once per kernel, then
/// handed to the backend.
pub enum Shape {
    /// Elementwise, computing in this lane.
    Elementwise(Lane),
    /// A softmax row kernel.
    Row(RowShape),
    /// A reduction kernel.
    Reduction(ReduceShape),
    /// Reductions over rows with the elementwise ops around them.
    RowPasses(rows::RowPasses),
}

/// The shape of kernel `k`, if it is in this form.
pub fn shape(f: &Function, k: &KernelData) -> Option<Shape> {
    match k.kind {
        KernelKind::Elementwise => elementwise_lane(f, k).map(Shape::Elementwise),
        KernelKind::Row { .. } => row_shape(f, k).map(Shape::Row),
        KernelKind::Reduction { .. } => reduce_shape(f, k).map(Shape::Reduction),
        KernelKind::RowPasses => rows::row_passes(f, k).map(Shape::RowPasses),
        KernelKind::Library { .. } | KernelKind::View | KernelKind::Generic => None,
    }
}

/// The layout of a row kernel: its softmax (or log_softmax) op and the row length.
pub struct RowShape {
    /// The softmax op.
    pub root: tcc_ir::Op,
    /// Elements per row (the last axis).
    pub len: u64,
}

/// The bodies of a softmax (or log-softmax) row kernel, in the three passes every backend
/// runs over a row: the prologue's value of the softmax input; the steps of the max pass
/// (accumulator, value) and of the sum pass (accumulator, value, max: adds `e^(value - max)`)
/// and the sum of two partial sums; the row's constants from its max and sum (`1/sum`, and
/// `max + log(sum)` for log-softmax); and the last pass, which normalises (given the row's
/// max, `1/sum` and shift after the kernel's inputs) and runs the epilogue.
pub struct RowBodies {
    /// The softmax input from the kernel's inputs.
    pub input: expr::Body,
    /// `max(acc, x)` (a comparison and select: a NaN value does not win).
    pub max_step: expr::Body,
    /// `acc + e^(x - max)`.
    pub sum_step: expr::Body,
    /// `a + b`.
    pub add: expr::Body,
    /// `(max, sum) -> (1/sum, max + log(sum))`.
    pub row_consts: expr::Body,
    /// The kernel's outputs from its inputs and the row's max, `1/sum` and shift.
    pub output: expr::Body,
}

/// The steps of a softmax's passes over a row (as in [`RowBodies`]): `max(acc, x)`,
/// `acc + e^(x - max)` and `a + b`; cross-entropy kernels take them too.
pub fn softmax_steps() -> [expr::Body; 3] {
    use expr::Cmp;
    use lower::small_body;
    [
        small_body(2, |b, a| b.select_if(Cmp::Lt, a[0], a[1], a[1], a[0])),
        small_body(3, |b, a| {
            let d = b.sub(a[1], a[2]);
            let t = math::exp(b, d);
            b.add(a[0], t)
        }),
        small_body(2, |b, a| b.add(a[0], a[1])),
    ]
}

/// The bodies of row kernel `k` of shape `row` (see [`RowBodies`]).
pub fn row_bodies(f: &Function, k: &KernelData, &RowShape { root, .. }: &RowShape) -> RowBodies {
    use expr::Body;
    use lower::{body, lower_ops};
    let log_softmax = matches!(f.op(root).kind, OpKind::LogSoftmax { .. });
    let pos = (k.ops.iter().position(|&o| o == root)).expect("the root is a member");
    let (pro, epi) = (&k.ops[..pos], &k.ops[pos + 1..]);
    let (x_in, y_out) = (f.op(root).args[0], f.op(root).results[0]);
    let row_consts = {
        let mut b = Body::new(Lane::F32);
        let (mx, sum) = (b.arg(), b.arg());
        let one = b.c(1.0);
        let inv = b.div(one, sum);
        let lse = math::log(&mut b, sum);
        let shift = b.add(mx, lse);
        b.results = vec![inv, shift];
        b
    };
    let [max_step, sum_step, add] = softmax_steps();
    RowBodies {
        input: body(Lane::F32, f, &k.inputs, 0, pro, |_, _, _| {}, &[x_in]),
        max_step,
        sum_step,
        add,
        row_consts,
        output: body(
            Lane::F32,
            f,
            &k.inputs,
            3,
            pro,
            |b, vals, row| {
                let x = vals[&x_in];
                let y = if log_softmax {
                    b.sub(x, row[2])
                } else {
                    let d = b.sub(x, row[0]);
                    let t = math::exp(b, d);
                    b.mul(t, row[1])
                };
                vals.insert(y_out, y);
                lower_ops(b, f, epi, vals);
            },
            &k.outputs,
        ),
    }
}

/// The layout of row kernel `k` if it is in this form: a softmax over a contiguous last axis,
/// in `f32`, whose prologue and epilogue it supports and whose operands it can index.
fn row_shape(f: &Function, k: &KernelData) -> Option<RowShape> {
    let KernelKind::Row { root } = k.kind else {
        return None;
    };
    let (OpKind::Softmax { axis } | OpKind::LogSoftmax { axis }) = f.op(root).kind else {
        return None;
    };
    let dims = f.ty(f.op(root).args[0]).dims();
    let a = tcc_ir::ops::normalize_axis(axis, dims.len())?;
    let len = dims[a];
    if a + 1 != dims.len() || len == 0 {
        return None;
    }
    let all_f32 = f32_with_masks(f, k);
    let others = k
        .ops
        .iter()
        .filter(|&&op| op != root)
        .all(|&op| supported_op(f, op));
    let readable = k
        .inputs
        .iter()
        .all(|&v| access(f.ty(v).dims(), dims).is_some());
    (all_f32 && others && readable).then_some(RowShape { root, len })
}

/// The layout of a compilable reduction kernel: the reduce op, its kind, and the input viewed as
/// `[a, l, b]` with the reduced axes (contiguous) in the middle.
pub struct ReduceShape {
    /// The reduce op.
    pub root: tcc_ir::Op,
    /// Its combining function.
    pub op: tcc_ir::ReduceOp,
    /// Elements before the reduced axes (the iteration space).
    pub a: u64,
    /// Elements along the reduced axes.
    pub l: u64,
    /// Elements after them.
    pub b: u64,
}

/// The layout of reduction kernel `k` if it is in this form: a `reduce_*` in `f32` over
/// contiguous axes of a non-empty extent, with supported prologue and epilogue ops and no
/// prologue value stored.
fn reduce_shape(f: &Function, k: &KernelData) -> Option<ReduceShape> {
    let KernelKind::Reduction { root } = k.kind else {
        return None;
    };
    let OpKind::Reduce { op, axes, .. } = &f.op(root).kind else {
        return None;
    };
    let dims = f.ty(f.op(root).args[0]).dims();
    let mut ax: Vec<usize> = axes
        .iter()
        .map(|&a| tcc_ir::ops::normalize_axis(a, dims.len()))
        .collect::<Option<_>>()?;
    ax.sort_unstable();
    let (i0, i1) = (ax[0], ax[ax.len() - 1]);
    if i1 - i0 + 1 != ax.len() {
        return None;
    }
    let (a, l, b) = (
        dims[..i0].iter().product(),
        dims[i0..=i1].iter().product::<u64>(),
        dims[i1 + 1..].iter().product(),
    );
    let all_f32 = f32_with_masks(f, k);
    let pos = k.ops.iter().position(|&o| o == root)?;
    let supported = k
        .ops
        .iter()
        .filter(|&&o| o != root)
        .all(|&o| supported_op(f, o));
    // Outputs may only be the reduction or epilogue values.
    let late: Vec<Value> = k.ops[pos..]
        .iter()
        .flat_map(|&o| f.op(o).results.clone())
        .collect();
    let outputs_late = k.outputs.iter().all(|o| late.contains(o));
    let (pro_in, epi_in) = reduce_inputs(f, k, pos);
    let out_dims = f.ty(f.op(root).results[0]).dims();
    let readable = pro_in
        .iter()
        .all(|&v| access(f.ty(v).dims(), dims).is_some())
        && epi_in
            .iter()
            .all(|&v| access(f.ty(v).dims(), out_dims).is_some());
    (l > 0 && all_f32 && supported && outputs_late && readable).then_some(ReduceShape {
        root,
        op: *op,
        a,
        l,
        b,
    })
}

/// The bodies of a reduction kernel, the same for every backend: the prologue's value of the
/// reduced input (from the inputs read before the reduction), the step that combines an
/// accumulator with a value (from the reduction's identity `init`), and the finish (the
/// mean's scale, then the epilogue, from the inputs read after it and the accumulator).
pub struct ReduceBodies {
    /// Kernel inputs the prologue reads (arguments of `input`).
    pub pro_in: Vec<Value>,
    /// Kernel inputs the epilogue reads (arguments of `output`, before the accumulator).
    pub epi_in: Vec<Value>,
    /// The reduction's identity.
    pub init: f32,
    /// The reduced input.
    pub input: expr::Body,
    /// `(acc, x) -> acc'`.
    pub step: expr::Body,
    /// The kernel's outputs.
    pub output: expr::Body,
}

/// The reduction's identity and step (`max`, or `+` for sums and means).
pub fn reduce_step(op: tcc_ir::ReduceOp) -> (f32, expr::Body) {
    match op {
        tcc_ir::ReduceOp::Max => (
            f32::NEG_INFINITY,
            lower::small_body(2, |b, a| b.bin(expr::Bin::Max, a[0], a[1])),
        ),
        tcc_ir::ReduceOp::Sum | tcc_ir::ReduceOp::Mean => {
            (0.0, lower::small_body(2, |b, a| b.add(a[0], a[1])))
        }
    }
}

/// The bodies of reduction kernel `k` of shape `red` (see [`ReduceBodies`]).
pub fn reduce_bodies(f: &Function, k: &KernelData, red: &ReduceShape) -> ReduceBodies {
    let &ReduceShape { root, op, l, .. } = red;
    let pos = (k.ops.iter().position(|&o| o == root)).expect("the root is a member");
    let (pro, epi) = (&k.ops[..pos], &k.ops[pos + 1..]);
    let (x_in, y_out) = (f.op(root).args[0], f.op(root).results[0]);
    let (pro_in, epi_in) = reduce_inputs(f, k, pos);
    let (init, step) = reduce_step(op);
    let input = lower::body(Lane::F32, f, &pro_in, 0, pro, |_, _, _| {}, &[x_in]);
    let output = lower::body(
        Lane::F32,
        f,
        &epi_in,
        1,
        &[],
        |b, vals, acc| {
            let r = if op == tcc_ir::ReduceOp::Mean {
                let inv = b.c((1.0 / l as f32) as f64);
                b.mul(acc[0], inv)
            } else {
                acc[0]
            };
            vals.insert(y_out, r);
            lower::lower_ops(b, f, epi, vals);
        },
        &k.outputs,
    );
    ReduceBodies {
        pro_in,
        epi_in,
        init,
        input,
        step,
        output,
    }
}

/// Kernel inputs read before and at the reduction, and those read after it.
pub fn reduce_inputs(f: &Function, k: &KernelData, pos: usize) -> (Vec<Value>, Vec<Value>) {
    let reads = |ops: &[tcc_ir::Op]| -> Vec<Value> {
        k.inputs
            .iter()
            .copied()
            .filter(|v| ops.iter().any(|&o| f.op(o).args.contains(v)))
            .collect()
    };
    (reads(&k.ops[..=pos]), reads(&k.ops[pos + 1..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The body of a kernel parsed from `src`'s single function, one kernel long.
    fn body(src: &str) -> expr::Body {
        let m = tcc_ir::parse_module(src).unwrap();
        let f = &m.functions[0];
        let p = crate::plan::plan(f);
        let (_, kd) = p.kernels.iter().next().unwrap();
        assert!(can_compile(f, kd));
        let nothing = |_: &mut expr::Body, _: &mut _, _: &[expr::E]| {};
        lower::body(Lane::F32, f, &kd.inputs, 0, &kd.ops, nothing, &kd.outputs)
    }

    #[test]
    fn ops_lower_to_nodes() {
        let b = body(
            "func @f(%x: f32[8], %y: f32[8]) -> (f32[8]) {\n\
             \x20 %s = add %x, %y : f32[8]\n\
             \x20 %r = relu %s : f32[8]\n\
             \x20 return %r\n}\n",
        );
        assert_eq!(
            b.to_string(),
            "body F32 (2 args)\n  e0 = Arg(0)\n  e1 = Arg(1)\n  e2 = Bin(Add, e0, e1)\n  \
             e3 = Num(0.0)\n  e4 = Cmp(Lt, e2, e3)\n  e5 = Select(e4, e3, e2)\n  results e5\n"
        );
    }

    #[test]
    fn every_unary_op_lowers() {
        // Each unary op (exp's polynomial and bit tricks included) becomes nodes of the three
        // classes, every operand defined before its use, and one result of class Num.
        for u in tcc_ir::UnaryOp::ALL {
            let src = format!(
                "func @f(%x: f32[8]) -> (f32[8]) {{\n  %r = {} %x : f32[8]\n  return %r\n}}\n",
                tcc_ir::OpKind::Unary(u).mnemonic()
            );
            let b = body(&src);
            assert_eq!(b.results.len(), 1, "{u:?}");
            assert_eq!(b.class(b.results[0]), expr::Class::Num, "{u:?}");
            let text = b.to_string();
            // Line i + 1 defines node i; its right-hand side may name only nodes before it.
            for (i, line) in text.lines().skip(1).enumerate() {
                let rhs = line.split_once(" = ").map_or(line, |(_, r)| r);
                for tok in rhs.split(|c: char| !c.is_alphanumeric()).filter(|t| {
                    t.len() > 1 && t.starts_with('e') && t[1..].chars().all(|c| c.is_ascii_digit())
                }) {
                    let n: usize = tok[1..].parse().unwrap();
                    assert!(n < i, "{u:?}: {tok} used before it is defined:\n{text}");
                }
            }
        }
    }

    #[test]
    fn access_patterns() {
        assert_eq!(access(&[4, 8], &[4, 8]), Some(Access::Same));
        assert_eq!(access(&[], &[4, 8]), Some(Access::Scalar(None)));
        assert_eq!(access(&[1, 1], &[4, 8]), Some(Access::Scalar(None)));
        assert_eq!(
            access(&[8], &[4, 8]),
            Some(Access::Block { inner: 1, n: 8 })
        );
        assert_eq!(
            access(&[16, 1, 1], &[2, 16, 5, 5]),
            Some(Access::Block { inner: 25, n: 16 })
        );
        assert_eq!(
            access(&[4, 1], &[4, 8]),
            Some(Access::Block { inner: 8, n: 4 })
        );
        assert_eq!(
            access(&[1, 8], &[4, 8]),
            Some(Access::Block { inner: 1, n: 8 })
        );
        assert_eq!(
            access(&[3, 1, 5], &[3, 4, 5]),
            Some(Access::Gapped {
                inner: 1,
                n: 5,
                outer_inner: 20,
                outer_n: 3
            })
        );
        assert_eq!(
            access(&[2, 1, 6, 1], &[2, 3, 6, 4]),
            Some(Access::Gapped {
                inner: 4,
                n: 6,
                outer_inner: 72,
                outer_n: 2
            })
        );
        // Three runs, and a dim that does not match.
        assert_eq!(access(&[3, 1, 5, 1, 2], &[3, 4, 5, 6, 2]), None);
        assert_eq!(access(&[3, 2], &[3, 4]), None);
    }
}

//! The PTX backend: the kernel plan as NVIDIA PTX, with a launch manifest, and the same
//! kernels run by an emulator on the CPU.
//!
//! Each kernel of the plan is lowered to the GPU kernel form ([`prog`]: typed instructions
//! over virtual registers, what one thread runs), which [`print`] writes as a PTX `.entry`
//! and [`emu`] runs on the CPU, block by block and thread by thread with barrier semantics.
//! Memory comes from the same plan as the CPU backend's ([`crate::memory`]): one arena, the
//! caller's parameters, constants and output buffers; the [`Launch`] manifest gives each
//! kernel's grid, block, shared memory and the storage of each of its parameters.
//!
//! The kernels are lowered in `elementwise.rs`, `reduce.rs`, `rows.rs` (softmax rows,
//! cross-entropy, `top_k`), `gemm/` (matmuls, convolutions and their gradients) and
//! `movement.rs` (data movement, casts, pooling and the one-op kernels), all on the context of
//! `lower.rs`; a function with a kernel none of them has is a compile error naming the op
//! (docs/codegen.md lists what compiles). [`Ptx`] is a [`Backend`]: `compile` makes a
//! [`Module`] and `run` runs it in the emulator, so every test of a backend applies to it.

#[cfg(feature = "cuda")]
pub mod cuda;
mod elementwise;
pub mod emu;
mod gemm;
mod lower;
mod movement;
pub mod print;
pub mod prog;
mod reduce;
mod rows;

pub use gemm::GemmTiles;

use crate::backend::{Backend, CompileError, RunError};
use crate::kernel::{Shape, shape};
use crate::memory::{MemoryPlan, Storage};
use crate::plan::{KernelData, KernelKind, Plan};
use std::collections::HashMap;
use std::fmt::{self, Write};
use tcc_ir::{Function, OpKind, Tensor, Value, ValueDef};

/// The PTX backend and its options.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ptx {
    /// The GPU architecture, as in `sm_80` (80) or `sm_90` (90).
    pub sm: u32,
    /// The output tiles of GEMM kernels (by the problem's size unless forced).
    pub tiles: GemmTiles,
}

impl Ptx {
    /// The backend for `sm_{sm}`, everything else by default.
    pub fn new(sm: u32) -> Ptx {
        Ptx {
            sm,
            tiles: GemmTiles::Auto,
        }
    }
}

impl Default for Ptx {
    fn default() -> Ptx {
        Ptx::new(80)
    }
}

/// The architectures modules may target: the PTX ISA version [`print::VERSION`] covers them.
pub const ARCHS: &[u32] = &[80, 86, 87, 89, 90];

/// One step of a run: a kernel launch (which kernel, its grid and block, its shared memory,
/// and its parameters, each a value whose storage the memory plan gives) or a copy between
/// device and host memory (a `swap_out` or `swap_in`: `args[0]`'s bytes to `args[1]`).
#[derive(Clone, Debug, PartialEq)]
pub struct Launch {
    /// Index of the kernel in [`Module::kernels`]; `None` for a copy (grid, block and shared
    /// memory 0).
    pub kernel: Option<usize>,
    /// Blocks in the grid (x).
    pub grid: u32,
    /// Threads per block (x).
    pub block: u32,
    /// Bytes of shared memory per block.
    pub shared: u32,
    /// The values whose addresses the parameters are, in order (views resolved to the value
    /// holding the storage).
    pub args: Vec<Value>,
    /// The arena offset of the plan kernel's scratch, where it has any: the address of the
    /// last parameter, after `args`.
    pub scratch: Option<u64>,
    /// What it computes, for profiles ([`crate::plan::describe`] of its plan kernel).
    pub what: String,
}

/// A function compiled for the GPU: the kernels, their launches in order, and the memory plan
/// their operands live in.
pub struct Module {
    func: Function,
    mem: MemoryPlan,
    sm: u32,
    /// The kernels, in launch order.
    pub kernels: Vec<prog::Kernel>,
    /// The launches, in order.
    pub launches: Vec<Launch>,
    /// The constants kernels read, by value.
    consts: HashMap<Value, Tensor>,
    /// The value whose storage each view uses.
    origin: HashMap<Value, Value>,
}

impl Module {
    /// The PTX module's text.
    pub fn text(&self) -> String {
        print::module(&self.kernels, self.sm)
    }

    /// The memory plan.
    pub fn memory(&self) -> &MemoryPlan {
        &self.mem
    }

    /// Where value `v` lives, as the manifest says it.
    fn place_text(&self, v: Value) -> String {
        let f = &self.func;
        match self.mem.storage[v] {
            Storage::Arena(off) => format!("arena+{off}"),
            Storage::Output(i) => format!("output {i}"),
            Storage::Param => match f.value(v).def {
                ValueDef::Param(i) => format!("param {i}"),
                ValueDef::Result(..) => "param".to_string(),
            },
            Storage::Const => "const".to_string(),
            Storage::Host(off) => format!("host+{off}"),
            Storage::None => "none".to_string(),
        }
    }

    /// The launch manifest as text: the arena's size, then per launch its kernel, grid,
    /// block, shared memory and each parameter's value and storage.
    pub fn manifest(&self) -> String {
        let f = &self.func;
        let mut s = format!(
            "// manifest: @{}, arena {} bytes, {} launches\n",
            f.name,
            self.mem.arena_bytes,
            self.launches.len()
        );
        for l in &self.launches {
            match l.kernel {
                Some(k) => {
                    let k = &self.kernels[k];
                    let _ = write!(
                        s,
                        "// {} grid {} block {} shared {}:",
                        k.name, l.grid, l.block, l.shared
                    );
                }
                None => {
                    let bytes = f.ty(l.args[1]).size_bytes();
                    let _ = write!(s, "// copy {bytes} bytes:");
                }
            }
            for (j, &v) in l.args.iter().enumerate() {
                let sep = if j == 0 { " " } else { ", " };
                let mut name = String::new();
                let _ = tcc_ir::printer::write_name(&mut name, '%', f.name(v));
                let _ = write!(s, "{sep}{name} {}", self.place_text(v));
            }
            if let Some(off) = l.scratch {
                let _ = write!(s, ", scratch arena+{off}");
            }
            s.push('\n');
        }
        s
    }
}

/// Compiles `f` for NVIDIA GPU `ordinal` (the newest PTX target it runs) and runs it once on
/// `inputs`; with `profile`, then times each launch over ten more runs
/// ([`cuda::Loaded::profile`]). Without the `cuda` feature, an error saying how to build with
/// it; on a machine without a driver or that device, an error saying so.
pub fn run_on_gpu(
    f: &Function,
    inputs: &[Tensor],
    ordinal: usize,
    profile: bool,
) -> Result<(Vec<Tensor>, Option<crate::Profile>), String> {
    #[cfg(feature = "cuda")]
    {
        let gpu = cuda::Gpu::new(ordinal).map_err(|e| e.0)?;
        let backend = gpu.backend().map_err(|e| e.0)?;
        let m = crate::compile(&backend, f).map_err(|e| e.0)?;
        let loaded = gpu.load(m).map_err(|e| e.0)?;
        let results = loaded.run(inputs).map_err(|e| e.0)?;
        let profile = match profile {
            true => Some(loaded.profile(inputs, 10).map_err(|e| e.0)?),
            false => None,
        };
        Ok((results, profile))
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (f, inputs, ordinal, profile);
        Err(
            "this build of tcc has no CUDA runtime: build it with `--features cuda` \
             (the PTX itself needs none: `tcc ptx`, or `--device gpu-emulator`)"
                .to_string(),
        )
    }
}

/// Where a value lives while a module runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    /// In the arena at this byte offset.
    Arena(u64),
    /// The caller's input `i`.
    Param(usize),
    /// Constant `v`'s buffer.
    Const(Value),
    /// Output buffer `i`.
    Output(usize),
    /// In the host pool at this byte offset (a swapped-out value).
    Host(u64),
}

impl Module {
    /// Where value `v` (a view resolved to the value holding its storage) lives.
    fn place(&self, v: Value) -> Result<Place, RunError> {
        let f = &self.func;
        let v = self.origin.get(&v).copied().unwrap_or(v);
        Ok(match self.mem.storage[v] {
            Storage::Arena(off) => Place::Arena(off),
            Storage::Output(i) => Place::Output(i),
            Storage::Param => match f.value(v).def {
                ValueDef::Param(i) => Place::Param(i),
                ValueDef::Result(..) => unreachable!("parameter storage for an op result"),
            },
            Storage::Const if self.consts.contains_key(&v) => Place::Const(v),
            Storage::Const => {
                return Err(RunError(format!(
                    "constant %{} was not materialised",
                    f.name(v)
                )));
            }
            Storage::Host(off) => Place::Host(off),
            Storage::None => {
                return Err(RunError(format!("%{} has no storage", f.name(v))));
            }
        })
    }
}

impl fmt::Debug for Module {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(&self.manifest())
    }
}

/// `name` with every character PTX identifiers may not hold replaced by `_`.
fn identifier(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if s.starts_with(|c: char| c.is_ascii_digit()) || s.is_empty() {
        format!("_{s}")
    } else {
        s
    }
}

/// The GPU form of kernel `kd` of `f`, named `name`: `None` where it has none yet, an error
/// where its lowering fails.
fn lower_kernel(
    f: &Function,
    plan: &Plan,
    kd: &KernelData,
    tiles: GemmTiles,
    name: String,
) -> Option<Result<lower::Lowered, String>> {
    match shape(f, kd) {
        Some(Shape::Elementwise(lane)) => return Some(elementwise::elementwise(f, kd, lane, name)),
        Some(Shape::Reduction(red)) => return Some(reduce::reduction(f, kd, &red, name)),
        Some(Shape::Row(row)) => return Some(rows::row(f, kd, &row, name)),
        Some(Shape::RowPasses(_)) | None => {}
    }
    if let KernelKind::Library { root } = kd.kind {
        if !epilogue_in_form(f, kd) {
            return None;
        }
        let d = f.op(root);
        return match d.kind {
            OpKind::MatMul => {
                let folded = |v| crate::plan::folded_transpose(f, plan, v).is_some();
                Some(gemm::matmul(
                    f,
                    kd,
                    (folded(d.args[0]), folded(d.args[1])),
                    tiles,
                    name,
                ))
            }
            OpKind::Conv2d(_) => Some(gemm::conv2d(f, kd, tiles, name)),
            OpKind::Conv2dGradInput { .. } | OpKind::Conv2dGradFilter { .. } => {
                Some(gemm::conv2d_grad(f, kd, tiles, name))
            }
            _ => None,
        };
    }
    if cross_entropy_in_form(f, kd) {
        return Some(rows::cross_entropy(f, kd, name));
    }
    if movement::handles(f, kd) {
        return Some(movement::lower(f, kd, name));
    }
    let [op] = kd.ops[..] else { return None };
    Some(match f.op(op).kind {
        OpKind::Binary(tcc_ir::BinaryOp::Pow) => elementwise::pow(f, kd, name),
        OpKind::QuantizeLinear | OpKind::DequantizeLinear => {
            elementwise::quantize_linear(f, kd, name)
        }
        OpKind::MatMulInteger => gemm::matmul_integer(f, kd, name),
        OpKind::ConvInteger(_) => gemm::conv_integer(f, kd, name),
        OpKind::Softmax { .. } | OpKind::LogSoftmax { .. } => rows::row_strided(f, kd, name),
        OpKind::TopK { .. } => rows::top_k(f, kd, name),
        OpKind::SoftmaxCrossEntropyGrad => rows::cross_entropy_grad(f, kd, name),
        OpKind::BatchNormTrain { .. } => reduce::batch_norm_train(f, kd, name),
        _ => return None,
    })
}

/// Whether the epilogue of library kernel `kd` (its ops after the first) is made of
/// elementwise ops the kernel layer has, in f32 (masks from comparisons among them), reading
/// f32 operands it can index over the output's shape.
fn epilogue_in_form(f: &Function, kd: &KernelData) -> bool {
    use tcc_ir::DType;
    let out = f.ty(f.op(kd.ops[0]).results[0]).dims();
    let epi = &kd.ops[1..];
    epi.iter().all(|&op| crate::kernel::supported_op(f, op))
        && f.ty(f.op(kd.ops[0]).results[0]).dtype() == DType::F32
        && (epi.iter().flat_map(|&op| f.op(op).results.iter()))
            .all(|&v| matches!(f.ty(v).dtype(), DType::F32 | DType::Bool))
        && (kd.inputs.iter())
            .filter(|v| epi.iter().any(|&o| f.op(o).args.contains(v)))
            .all(|&v| {
                f.ty(v).dtype() == DType::F32
                    && crate::kernel::access(f.ty(v).dims(), out).is_some()
            })
}

/// Whether `kd` is a softmax cross-entropy (f32 logits) whose prologue and epilogue are
/// elementwise ops of the kernel layer in f32.
fn cross_entropy_in_form(f: &Function, kd: &KernelData) -> bool {
    let Some(pos) =
        (kd.ops.iter()).position(|&o| matches!(f.op(o).kind, OpKind::SoftmaxCrossEntropy))
    else {
        return false;
    };
    let root = f.op(kd.ops[pos]);
    let others = kd.ops.iter().enumerate().filter(|&(i, _)| i != pos);
    f.ty(root.args[0]).dtype() == tcc_ir::DType::F32
        && others
            .clone()
            .all(|(_, &op)| crate::kernel::supported_op(f, op))
        && others
            .flat_map(|(_, &op)| f.op(op).args.iter().chain(&f.op(op).results))
            .all(|&v| f.ty(v).dtype() == tcc_ir::DType::F32)
}

/// Why kernel `kd` of `f` has no GPU form yet.
fn unsupported(f: &Function, kd: &KernelData) -> CompileError {
    // The op to blame: one the kernel layer has no form of (a `pow` with an exponent it does
    // not compute exactly), else a cast between dtype families (a kernel mixing them), else
    // the kernel's root or first op.
    let odd = (kd.ops.iter()).find(|&&op| {
        let d = f.op(op);
        let mixed = matches!(d.kind, OpKind::Cast { .. }) && kd.ops.len() > 1;
        (!crate::kernel::supported_op(f, op) && !matches!(d.kind, OpKind::Const { .. })) || mixed
    });
    let op = match (kd.kind.clone(), odd) {
        (KernelKind::Elementwise, Some(&op)) => op,
        (
            KernelKind::Reduction { root }
            | KernelKind::Row { root }
            | KernelKind::Library { root },
            _,
        ) => root,
        _ => kd.ops[0],
    };
    let types: Vec<String> = (f.op(op).results.iter())
        .map(|&r| f.ty(r).to_string())
        .collect();
    CompileError(format!(
        "the PTX backend has no kernel for {} : {} yet (docs/codegen.md lists what it compiles)",
        f.describe_op(op),
        types.join(", ")
    ))
}

impl Backend for Ptx {
    type Compiled = Module;

    /// Kernels the plan fused that have no GPU form as one loop (elementwise ops the kernel
    /// layer cannot write in one dtype family, such as a cast from bytes fused with the
    /// arithmetic after it; a reduction or row with such a prologue) run one op at a time.
    fn fuse(&self, f: &Function, plan: Plan) -> Plan {
        let split: Vec<crate::plan::Kernel> = (plan.kernels.iter())
            .filter(|(_, kd)| {
                kd.ops.len() > 1
                    && matches!(
                        kd.kind,
                        KernelKind::Elementwise
                            | KernelKind::Reduction { .. }
                            | KernelKind::Row { .. }
                    )
                    && shape(f, kd).is_none()
                    && !cross_entropy_in_form(f, kd)
            })
            .map(|(k, _)| k)
            .collect();
        if split.is_empty() {
            plan
        } else {
            plan.split(f, &split)
        }
    }

    /// Products too small to fill the device split `k` and keep the pieces' partial matrices
    /// in scratch; nothing else needs any.
    fn scratch_bytes(&self, f: &Function, kd: &KernelData) -> u64 {
        match kd.kind {
            KernelKind::Library { .. } => gemm::scratch_bytes(f, kd, self.tiles),
            _ => 0,
        }
    }

    fn compile(&self, f: &Function, plan: Plan, mem: MemoryPlan) -> Result<Module, CompileError> {
        if !ARCHS.contains(&self.sm) {
            return Err(CompileError(format!(
                "no PTX target sm_{}: the targets are {}",
                self.sm,
                ARCHS
                    .iter()
                    .map(|a| format!("sm_{a}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        let mut origin: HashMap<Value, Value> = HashMap::new();
        let mut kernels = Vec::new();
        let mut launches = Vec::new();
        for (k, kd) in plan.kernels.iter() {
            if kd.kind == KernelKind::View {
                let d = f.op(kd.ops[0]);
                let root = origin.get(&d.args[0]).copied().unwrap_or(d.args[0]);
                origin.insert(d.results[0], root);
                continue;
            }
            if kd.outputs.is_empty() {
                // Nothing it computes is used.
                continue;
            }
            if let [op] = kd.ops[..]
                && f.op(op).kind.is_swap()
            {
                let d = f.op(op);
                let src = origin.get(&d.args[0]).copied().unwrap_or(d.args[0]);
                launches.push(Launch {
                    kernel: None,
                    grid: 0,
                    block: 0,
                    shared: 0,
                    args: vec![src, d.results[0]],
                    scratch: None,
                    what: crate::plan::describe(f, kd),
                });
                continue;
            }
            let name = identifier(&format!("{}_{k}", f.name));
            let low = lower_kernel(f, &plan, kd, self.tiles, name)
                .ok_or_else(|| unsupported(f, kd))?
                .map_err(|e| {
                    CompileError(format!("kernel {k} ({}): {e}", f.describe_op(kd.ops[0])))
                })?;
            let args: Vec<Value> = (kd.inputs.iter().chain(&kd.outputs))
                .map(|v| origin.get(v).copied().unwrap_or(*v))
                .collect();
            let scratch = (mem.slots.iter())
                .find(|s| s.scratch_for == Some(k))
                .map(|s| s.offset);
            let mut next = Some(low);
            while let Some(low) = next {
                if low.then.is_some() && scratch.is_none() {
                    return Err(CompileError(format!(
                        "kernel {k} ({}): split into two kernels without scratch space",
                        f.describe_op(kd.ops[0])
                    )));
                }
                launches.push(Launch {
                    kernel: Some(kernels.len()),
                    grid: low.grid,
                    block: low.kernel.block,
                    shared: low.kernel.shared,
                    args: args.clone(),
                    scratch,
                    what: crate::plan::describe(f, kd),
                });
                kernels.push(low.kernel);
                next = low.then.map(|b| *b);
            }
        }
        let mut consts = HashMap::new();
        for &op in &plan.constants {
            let OpKind::Const { ty, value } = &f.op(op).kind else {
                unreachable!("planned as a constant")
            };
            let v = f.op(op).results[0];
            if mem.storage[v] != Storage::Const {
                continue;
            }
            let t = Tensor::from_literal(ty, value).map_err(|e| CompileError(e.to_string()))?;
            consts.insert(v, t);
        }
        Ok(Module {
            func: f.clone(),
            mem,
            sm: self.sm,
            kernels,
            launches,
            consts,
            origin,
        })
    }

    /// Runs `m` in the emulator.
    fn run(&self, m: &Module, inputs: &[Tensor]) -> Result<Vec<Tensor>, RunError> {
        let f = &m.func;
        tcc_ir::interp::check_inputs(f, inputs).map_err(|e| RunError(e.0))?;
        let mut dev = emu::Memory::default();
        let arena = dev.alloc(vec![0; m.mem.arena_bytes as usize]);
        // Host memory is another buffer here.
        let host = dev.alloc(vec![0; m.mem.host_bytes as usize]);
        let params: Vec<u64> = inputs.iter().map(|t| dev.alloc(t.to_le_bytes())).collect();
        let consts: HashMap<Value, u64> = (m.consts.iter())
            .map(|(&v, t)| (v, dev.alloc(t.to_le_bytes())))
            .collect();
        let outputs: Vec<u64> = (m.mem.outputs.iter())
            .map(|&v| dev.alloc(vec![0; f.ty(v).size_bytes() as usize]))
            .collect();
        let addr = |v: Value| -> Result<u64, RunError> {
            Ok(match m.place(v)? {
                Place::Arena(off) => arena + off,
                Place::Output(i) => outputs[i],
                Place::Param(i) => params[i],
                Place::Const(c) => consts[&c],
                Place::Host(off) => host + off,
            })
        };
        for l in &m.launches {
            let mut args = l
                .args
                .iter()
                .map(|&v| addr(v))
                .collect::<Result<Vec<_>, _>>()?;
            args.extend(l.scratch.map(|off| arena + off));
            match l.kernel {
                Some(k) => emu::run(&m.kernels[k], l.grid, &args, &mut dev).map_err(RunError)?,
                None => {
                    let bytes = f.ty(l.args[1]).size_bytes();
                    dev.copy(args[0], args[1], bytes).map_err(RunError)?;
                }
            }
        }
        f.results()
            .iter()
            .map(|&r| {
                let ty = f.ty(r);
                let bytes = dev.read(addr(r)?, ty.size_bytes()).map_err(RunError)?;
                Tensor::from_le_bytes(ty, bytes).map_err(|e| RunError(e.0))
            })
            .collect()
    }
}

//! Lowering: the step each kernel of the plan runs as, chosen once at compile time.
//!
//! In order of preference: a loop the JIT compiles (elementwise, row or reduction kernels), a
//! library call (matmul, convolutions) with its epilogue compiled as an elementwise loop, a
//! hand-written kernel for a single op (`native.rs`), and otherwise the reference
//! interpreter's kernels on the same arena, so every function runs. One exception: a softmax
//! or log-softmax alone over contiguous f32 rows takes its hand-written AVX2 kernel before the
//! JIT.

use super::bytes::{lines, write_data};
use super::conv::{Conv, ConvMode, NchwcConv};
use super::jit::{self, Jit};
use super::matmul::{MatMul, matmul_step, own_gemm};
use super::post::{Layout, Post};
use super::{Cpu, Executable, native};
use crate::backend::CompileError;
use crate::memory::{MemoryPlan, Storage};
use crate::plan::{Kernel, KernelData, KernelKind, Plan};
use std::collections::HashMap;
use tcc_ir::{DType, Function, OpKind, Tensor, Value};

/// A compiled loop: its entry point, the values whose addresses it takes (inputs, then
/// outputs) and its iteration space.
pub(super) struct Loop {
    pub code: jit::KernelFn,
    pub args: Vec<Value>,
    pub space: jit::Space,
}

/// Told when elements of a library call's output are final: `finish(range)` with flat element
/// indices, on the thread that wrote them, so the kernel's epilogue runs there while they are
/// in cache. A library call reports every element of its output exactly once.
pub(super) type Finish<'a> = Option<&'a (dyn Fn(std::ops::Range<usize>) + Sync)>;

/// The library call a library kernel starts with.
pub(super) enum LibOp {
    MatMul(MatMul),
    Conv(Conv),
    Nchwc(NchwcConv),
}

impl LibOp {
    pub(super) fn dst(&mut self) -> Value {
        match self {
            LibOp::MatMul(m) => m.dst,
            LibOp::Conv(c) => *c.dst(),
            LibOp::Nchwc(c) => c.dst(),
        }
    }

    fn set_dst(&mut self, v: Value) {
        match self {
            LibOp::MatMul(m) => m.dst = v,
            LibOp::Conv(c) => *c.dst() = v,
            LibOp::Nchwc(c) => c.y = v,
        }
    }
}

/// What one kernel runs as.
pub(super) enum Step {
    /// A compiled elementwise kernel.
    Jit(Loop),
    /// A library call, then its epilogue compiled as an elementwise loop reading the result.
    Library { op: LibOp, epilogue: Option<Loop> },
    /// One op on a hand-written kernel.
    Native(native::Native),
    /// A `swap_out` or `swap_in`: a copy of `bytes` from `src`'s storage to `dst`'s, handed to
    /// the copy thread (`cpu::copies`).
    Swap {
        src: Value,
        dst: Value,
        bytes: usize,
    },
    /// The kernel on the reference kernels.
    Reference,
}

/// Compiles `f`, cut into kernels by `plan` with storage from `mem`, for `cpu`.
pub(super) fn compile(
    cpu: &Cpu,
    f: &Function,
    plan: Plan,
    mem: MemoryPlan,
) -> Result<Executable, CompileError> {
    let mut jit = Jit::new(cpu.target.as_deref()).map_err(CompileError)?;
    let features = cpu.features().map_err(CompileError)?;
    let mut libraries: HashMap<Kernel, (LibOp, Option<(KernelData, Value)>)> = HashMap::new();
    for (k, kd) in plan.kernels.iter() {
        let name = format!("{}_{k}", f.name);
        let err = |e: String| CompileError(format!("compiling kernel {k}: {e}"));
        // A softmax (or log-softmax) alone over contiguous f32 rows runs faster on its
        // hand-written kernel.
        if matches!(kd.kind, KernelKind::Row { .. })
            && let [op] = kd.ops[..]
            && native::wide_softmax(f, op, &features)
        {
            continue;
        }
        let whole = jit.compile(f, k, kd, &name).map_err(err)?;
        if whole.is_none()
            && let Some(lib) = library_step(f, &plan, kd, scratch_offset(&mem, k), &features)
        {
            if let Some((epi, _)) = &lib.1 {
                jit.compile(f, k, epi, &name)
                    .map_err(err)?
                    .expect("library_step checked that the JIT compiles the epilogue");
            }
            libraries.insert(k, lib);
        }
    }
    let (code, compiled) = jit.finish().map_err(CompileError)?;
    let mut steps = Vec::new();
    let mut origin = HashMap::new();
    let users = tcc_ir::edit::Users::new(f);
    for (k, kd) in plan.kernels.iter() {
        if kd.kind == KernelKind::View {
            let op = kd.ops[0];
            let (src, out) = (f.op(op).args[0], f.op(op).results[0]);
            let root = origin.get(&src).copied().unwrap_or(src);
            origin.insert(out, root);
            continue;
        }
        if kd.outputs.is_empty() {
            // Nothing it computes is used: dead code the planner kept, skipped at run time.
            continue;
        }
        if let [op] = kd.ops[..]
            && f.op(op).kind.is_swap()
        {
            let d = f.op(op);
            let bytes = usize::try_from(f.ty(d.results[0]).size_bytes())
                .map_err(|_| CompileError(format!("{} is too large", f.describe_op(op))))?;
            let src = d.args[0];
            let src = origin.get(&src).copied().unwrap_or(src);
            let dst = d.results[0];
            steps.push((k, Step::Swap { src, dst, bytes }));
            continue;
        }
        let step = match (libraries.remove(&k), compiled.get(&k)) {
            (Some((mut op, epi)), code) => {
                let dst = op.dst();
                let epilogue = epi.map(|(e, product)| {
                    let &(code, space) = code.expect("epilogue compiled");
                    Loop {
                        code,
                        // The epilogue reads the product where the matmul wrote it.
                        args: e
                            .inputs
                            .iter()
                            .map(|&v| if v == product { dst } else { v })
                            .chain(e.outputs.iter().copied())
                            .collect(),
                        space,
                    }
                });
                Step::Library { op, epilogue }
            }
            (None, Some(&(code, space))) => Step::Jit(Loop {
                code,
                args: kd.inputs.iter().chain(&kd.outputs).copied().collect(),
                space,
            }),
            (None, None) => match native_step(f, &users, kd, &features) {
                Some(n) => Step::Native(n),
                None => Step::Reference,
            },
        };
        steps.push((k, step));
    }
    // Constants that library steps packed at compile time and nothing else reads are not
    // materialised again (a transformer's weights would otherwise be held twice).
    let mut packed: HashMap<Value, usize> = HashMap::new();
    for v in (steps.iter()).flat_map(|(_, s)| match s {
        Step::Library {
            op: LibOp::MatMul(m),
            ..
        } => m.packed().into_iter().collect(),
        Step::Library {
            op: LibOp::Nchwc(c),
            ..
        } => c.packed(),
        _ => Vec::new(),
    }) {
        *packed.entry(v).or_default() += 1;
    }
    // Every reader packed it (each reads it once, as its right operand or filter).
    let only_packed = |v: Value| {
        let uses = users.uses(v);
        packed.get(&v) == Some(&uses.len())
            && !users.is_returned(v)
            && uses.iter().all(|&(_, i)| i == 1)
    };
    let mut consts = HashMap::new();
    for &op in &plan.constants {
        let OpKind::Const { ty, value } = &f.op(op).kind else {
            unreachable!("planned as a constant")
        };
        if only_packed(f.op(op).results[0]) {
            continue;
        }
        if ty.size_bytes() > MAX_CONST_BYTES {
            return Err(CompileError(format!(
                "constant %{} of type {ty} is larger than the 1 GiB the runtime materialises",
                f.name(f.op(op).results[0])
            )));
        }
        let t = Tensor::from_literal(ty, value).map_err(|e| CompileError(e.to_string()))?;
        let mut buf = lines(ty.size_bytes());
        // SAFETY: `buf` holds at least the constant's `size_bytes`, and is a fresh allocation.
        unsafe { write_data(buf.as_mut_ptr() as *mut u8, &t) };
        consts.insert(f.op(op).results[0], buf);
    }
    let profile = cpu
        .profile
        .then(|| std::sync::Mutex::new((0, vec![std::time::Duration::ZERO; steps.len()])));
    let waits = copy_waits(f, &plan, &mem, &steps, &origin);
    Ok(Executable {
        func: f.clone(),
        plan,
        mem,
        waits,
        link_bandwidth: cpu.link_bandwidth,
        copying: cpu.copies,
        steps,
        origin,
        consts,
        arenas: std::sync::Mutex::new(Vec::new()),
        profile,
        _code: code,
    })
}

/// A library kernel's matmul and, if it has one, its epilogue as an elementwise kernel that
/// reads the product (the value returned with it). `None` when this backend cannot run it that
/// way yet (then it runs on the reference kernels).
fn library_step(
    f: &Function,
    plan: &Plan,
    kd: &KernelData,
    scratch: Option<u64>,
    features: &super::Features,
) -> Option<(LibOp, Option<(KernelData, Value)>)> {
    let d = f.op(kd.ops[0]);
    let r = d.results[0];
    let dtype = f.ty(r).dtype();
    if !matches!(dtype, DType::F32 | DType::F64) {
        return None;
    }
    // Library ops take two operands; anything else is not one.
    let (&a0, &a1) = (d.args.first()?, d.args.get(1)?);
    let conv =
        |mode, c, xwy: [Value; 3]| LibOp::Conv(Conv::new(f, mode, c, xwy, scratch, features));
    let mut lib = match &d.kind {
        OpKind::MatMul => LibOp::MatMul(matmul_step(f, plan, [a0, a1, r], own_gemm(features))),
        OpKind::Conv2d(c) => conv(ConvMode::Forward, c, [a0, a1, r]),
        OpKind::Conv2dGradInput { conv: c, .. } => conv(ConvMode::GradInput, c, [r, a1, a0]),
        OpKind::Conv2dGradFilter { conv: c, .. } => conv(ConvMode::GradFilter, c, [a0, r, a1]),
        OpKind::Conv2dNchwc { conv: c, block } => {
            LibOp::Nchwc(NchwcConv::new(f, c, *block, [a0, a1, r], features)?)
        }
        _ => return None,
    };
    if kd.ops.len() == 1 {
        return Some((lib, None));
    }
    // A depthwise convolution fused with the 1x1 convolution that reads its output (the
    // backend merged their kernels: see `Cpu::fuse`).
    // Every epilogue knows whether the CPU has AVX-512F (SiLU then runs on sixteen lanes).
    let post_of = |layout, ops: &[tcc_ir::Op], r, outputs: &[Value]| {
        let (post, out) = Post::of(f, layout, ops, r, outputs)?;
        let avx512 = features.avx512f;
        Some((Post { avx512, ..post }, out))
    };
    if let LibOp::Nchwc(dw) = &mut lib
        && let Some(i) = (kd.ops.iter().skip(1))
            .position(|&op| matches!(f.op(op).kind, OpKind::Conv2dNchwc { .. }))
    {
        let (i, pd) = (i + 1, f.op(kd.ops[i + 1]));
        let OpKind::Conv2dNchwc { conv: c, block } = &pd.kind else {
            unreachable!("found as one")
        };
        let mid = pd.args[0];
        let mut pw = NchwcConv::new(f, c, *block, [mid, pd.args[1], pd.results[0]], features)?;
        let (dpost, dy) = post_of(Layout::Blocked, &kd.ops[1..i], r, &[mid])?;
        let (ppost, py) = post_of(
            Layout::Blocked,
            &kd.ops[i + 1..],
            pd.results[0],
            &kd.outputs,
        )?;
        (dw.y, pw.y) = (dy, py);
        dw.set_post(dpost, features);
        pw.set_post(ppost, features);
        dw.then = Some(Box::new(pw));
        return Some((lib, None));
    }
    // A blocked convolution applies a bias, scale, residual, clamps and activations itself as
    // it stores.
    if let LibOp::Nchwc(cv) = &mut lib
        && let Some((post, out)) = post_of(Layout::Blocked, &kd.ops[1..], r, &kd.outputs)
    {
        cv.set_post(post, features);
        cv.y = out;
        return Some((lib, None));
    }
    // So does an f32 matmul, on the rows of its product as they become final.
    if let LibOp::MatMul(mm) = &mut lib
        && dtype == DType::F32
        && features.avx2
        && features.fma
        && let Some((post, out)) = post_of(Layout::Rows, &kd.ops[1..], r, &kd.outputs)
    {
        mm.post = Some(post);
        mm.dst = out;
        return Some((lib, None));
    }
    let (epi, dst) = epilogue(f, kd, r)?;
    lib.set_dst(dst);
    Some((lib, Some((epi, r))))
}

/// The epilogue of a library kernel whose call produces `r`, as an elementwise kernel reading
/// `r`, and where the call should write `r`: its own storage if it is stored, else over an
/// epilogue output of its type (the epilogue then runs in place, reading each element before
/// writing it). `None` if the epilogue cannot be compiled or no storage fits.
fn epilogue(f: &Function, kd: &KernelData, r: Value) -> Option<(KernelData, Value)> {
    let ops = kd.ops[1..].to_vec();
    let mut inputs = Vec::new();
    for &op in &ops {
        for &a in &f.op(op).args {
            if !ops.iter().any(|&o| f.op(o).results.contains(&a)) && !inputs.contains(&a) {
                inputs.push(a);
            }
        }
    }
    let outputs: Vec<Value> = kd.outputs.iter().copied().filter(|&o| o != r).collect();
    let epi = KernelData {
        kind: KernelKind::Elementwise,
        ops,
        inputs,
        outputs,
    };
    if !crate::kernel::can_compile(f, &epi) {
        return None;
    }
    let dst = if kd.outputs.contains(&r) {
        r
    } else {
        *epi.outputs.iter().find(|&&o| f.ty(o) == f.ty(r))?
    };
    Some((epi, dst))
}

/// A single-op kernel on a hand-written kernel, if there is one for it (or a `conv_integer`
/// with its requantizing chain).
fn native_step(
    f: &Function,
    users: &tcc_ir::edit::Users,
    kd: &KernelData,
    features: &super::Features,
) -> Option<native::Native> {
    match (&kd.kind, kd.ops.as_slice()) {
        (KernelKind::Generic | KernelKind::Reduction { .. } | KernelKind::Row { .. }, &[op]) => {
            native::Native::for_op(f, op, &kd.outputs, features)
        }
        // A `conv_integer` with its requantizing chain (see `Cpu::fuse`).
        (KernelKind::Generic, ops) => native::Native::conv_chain(f, users, ops, features),
        _ => None,
    }
}

/// The largest constant the runtime materialises (1 GiB).
const MAX_CONST_BYTES: u64 = 1 << 30;

/// `v`'s value when it is an f32 constant, for steps that pack their weights at compile time.
pub(super) fn f32_constant(f: &Function, v: Value) -> Option<Tensor> {
    let OpKind::Const { ty, value } = &f.op(f.def_op(v)?).kind else {
        return None;
    };
    if ty.dtype() != DType::F32 {
        return None;
    }
    Tensor::from_literal(ty, value).ok()
}

/// The arena offset of the scratch space the memory plan set aside for kernel `k`.
/// Where a value's bytes lie, for [`copy_waits`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    /// A byte range of the arena.
    Arena(u64, u64),
    /// A byte range of the host pool.
    Host(u64, u64),
    /// An output buffer.
    Output(usize),
    /// Storage no step writes (parameters, constants) or none.
    Fixed,
}

impl Place {
    fn of(f: &Function, mem: &MemoryPlan, v: Value) -> Place {
        let n = f.ty(v).size_bytes();
        match mem.storage[v] {
            Storage::Arena(at) => Place::Arena(at, at + n),
            Storage::Host(at) => Place::Host(at, at + n),
            Storage::Output(i) => Place::Output(i),
            Storage::Param | Storage::Const | Storage::None => Place::Fixed,
        }
    }

    fn overlaps(self, other: Place) -> bool {
        match (self, other) {
            (Place::Arena(a, b), Place::Arena(c, d)) | (Place::Host(a, b), Place::Host(c, d)) => {
                a < d && c < b
            }
            (Place::Output(i), Place::Output(j)) => i == j,
            _ => false,
        }
    }
}

/// For each step, the swap steps whose copies must be done before it runs: a swap-in's before
/// the first step that reads its result (through views), a swap-out's before the first step
/// that writes any of the bytes it reads (an output or scratch placed over them). The copies
/// among themselves need no waits: the copy thread runs them in order.
fn copy_waits(
    f: &Function,
    plan: &Plan,
    mem: &MemoryPlan,
    steps: &[(Kernel, Step)],
    origin: &HashMap<Value, Value>,
) -> Vec<Vec<usize>> {
    let mut waits = vec![Vec::new(); steps.len()];
    let root = |v: Value| origin.get(&v).copied().unwrap_or(v);
    for (s, (_, step)) in steps.iter().enumerate() {
        let Step::Swap { src, dst, .. } = *step else {
            continue;
        };
        let read = Place::of(f, mem, src);
        let first = steps[s + 1..].iter().position(|&(k, _)| {
            let kd = &plan.kernels[k];
            if f.is_host(src) {
                kd.inputs.iter().any(|&v| root(v) == dst)
            } else {
                let scratch = (mem.slots.iter())
                    .filter(|slot| slot.scratch_for == Some(k))
                    .map(|slot| Place::Arena(slot.offset, slot.offset + slot.size));
                (kd.outputs.iter().map(|&v| Place::of(f, mem, v)))
                    .chain(scratch)
                    .any(|w| w.overlaps(read))
            }
        });
        if let Some(j) = first {
            waits[s + 1 + j].push(s);
        }
    }
    waits
}

fn scratch_offset(mem: &MemoryPlan, k: Kernel) -> Option<u64> {
    mem.slots
        .iter()
        .find(|s| s.scratch_for == Some(k))
        .map(|s| s.offset)
}

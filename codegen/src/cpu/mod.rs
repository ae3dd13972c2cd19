//! The CPU backend: compile a function once, run it many times.
//!
//! [`Executable::compile`] plans kernels and memory, JIT-compiles every kernel the Cranelift
//! code generator supports (today: fused elementwise `f32` kernels, see [`jit`]) and materialises
//! constants. Kernels it does not compile yet run through the reference interpreter's kernels on
//! the same arena, so every function runs; [`Executable::stats`] says how many of each there are.
//!
//! Each [`Executable::run`] checks its inputs against the parameters, takes an arena of the
//! planned size (reused from an earlier run when one is free, so concurrent runs never share one),
//! runs the steps in order and copies the results out. Executables are
//! `Send + Sync`: compiled code and constants are immutable, and runs share nothing else.

mod accuracy;
mod jit;
mod math;
mod native;

mod sgemm;
mod target;

pub use accuracy::max_ulp_error;

use crate::memory::{MemoryPlan, Storage, plan_memory};
use crate::plan::{Kernel, KernelData, KernelKind, Plan, plan};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::Module;
use std::collections::HashMap;
use std::fmt;
use tcc_ir::interp::{check_inputs, eval_op};
use tcc_ir::{DType, Data, Function, OpKind, Tensor, TensorType, Value, ValueDef};

/// A function that could not be compiled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompileError(pub String);

impl fmt::Display for CompileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CompileError {}

/// A run that failed: bad inputs, or a run-time error in an op.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunError(pub String);

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RunError {}

/// 64 bytes, 64-byte aligned: the unit of every buffer the runtime allocates.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// Zeroed, 64-byte-aligned storage of at least `bytes` bytes.
fn lines(bytes: u64) -> Vec<Line> {
    vec![Line([0; 64]); bytes.div_ceil(64) as usize]
}

/// Owns the JIT's code memory.
struct Code(Option<JITModule>);

// SAFETY: after `finalize_definitions` the module is never used again except to free its memory
// on drop; the code it owns is immutable and safe to call from any thread.
unsafe impl Send for Code {}
unsafe impl Sync for Code {}

impl Drop for Code {
    fn drop(&mut self) {
        if let Some(m) = self.0.take() {
            // SAFETY: the function pointers into this memory live in the same `Executable` and
            // are dropped with it.
            unsafe { m.free_memory() }
        }
    }
}

/// A compiled elementwise loop: its entry point, the values whose addresses it takes (inputs,
/// then outputs) and its element count.
struct Loop {
    code: jit::KernelFn,
    args: Vec<Value>,
    n: u64,
    /// Elements per index of the iteration space: 1 for elementwise loops, the row length for
    /// row kernels.
    unit: u64,
}

/// A matrix product through `gemm`, batch by batch, into the storage of `dst`.
struct MatMul {
    a: Value,
    b: Value,
    /// Whether `a` (`b`) is read through a folded transpose: the value is then its source, and
    /// the GEMM reads it with swapped strides.
    ta: bool,
    tb: bool,
    dst: Value,
    dtype: DType,
    m: usize,
    n: usize,
    k: usize,
    /// For each output batch, the batch index into `a` and into `b` (batch dims broadcast).
    batches: Vec<(usize, usize)>,
}

/// Which product a convolution step computes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ConvMode {
    /// `y = conv2d(x, w)`: im2col, then `W · cols`.
    Forward,
    /// `x = conv2d_grad_input(y, w)`: `W^T · dy`, then col2im.
    GradInput,
    /// `w = conv2d_grad_filter(x, y)`: im2col, then `dW += dy · cols^T` over the batch.
    GradFilter,
}

/// A convolution or one of its gradients as im2col/col2im through scratch space (skipped for a
/// plain 1x1) and one `gemm` per image and group. `x`, `w` and `y` are the forward input, filter
/// and output (or their gradients); the one the mode computes is written.
struct Conv {
    mode: ConvMode,
    x: Value,
    w: Value,
    y: Value,
    dtype: DType,
    attrs: tcc_ir::Conv2d,
    /// `[N, C, H, W]`, `[O, C/groups, kH, kW]` and `[N, O, oH, oW]`.
    xd: [usize; 4],
    wd: [usize; 4],
    yd: [usize; 4],
    /// Arena offset of the scratch (`memory::scratch_bytes`); none for a plain 1x1 done image by
    /// image.
    scratch: Option<u64>,
    /// Images side by side in one GEMM (`memory::conv_group`).
    group: usize,
    /// A constant filter packed for the f32 GEMM, one per group (forward only).
    packed: Vec<sgemm::PackedA>,
}

/// The library call a library kernel starts with.
enum LibOp {
    MatMul(MatMul),
    Conv(Conv),
}

impl Conv {
    fn dst(&mut self) -> &mut Value {
        match self.mode {
            ConvMode::Forward => &mut self.y,
            ConvMode::GradInput => &mut self.x,
            ConvMode::GradFilter => &mut self.w,
        }
    }
}

impl LibOp {
    fn dst(&mut self) -> Value {
        match self {
            LibOp::MatMul(m) => m.dst,
            LibOp::Conv(c) => *c.dst(),
        }
    }

    fn set_dst(&mut self, v: Value) {
        match self {
            LibOp::MatMul(m) => m.dst = v,
            LibOp::Conv(c) => *c.dst() = v,
        }
    }
}

enum Step {
    /// A compiled elementwise kernel.
    Jit(Loop),
    /// A library call, then its epilogue compiled as an elementwise loop reading the result.
    Library { op: LibOp, epilogue: Option<Loop> },
    /// One op on a hand-written kernel.
    Native(native::Native),
    /// A kernel run by the reference kernels.
    Reference(Kernel),
}

/// For each element of the broadcast batch shape `out`, the flat batch index into `from`.
fn batch_map(from: &[u64], out: &[u64]) -> Vec<usize> {
    let mut st = vec![0usize; out.len()];
    let mut s = 1usize;
    for (i, &d) in from.iter().enumerate().rev() {
        let o = out.len() - from.len() + i;
        st[o] = if d == 1 { 0 } else { s };
        s *= d as usize;
    }
    let total: u64 = out.iter().product();
    (0..total as usize)
        .map(|mut i| {
            let mut idx = 0;
            for (k, &d) in out.iter().enumerate().rev() {
                idx += (i % d as usize) * st[k];
                i /= d as usize;
            }
            idx
        })
        .collect()
}

/// A library kernel's matmul and, if it has one, its epilogue as an elementwise kernel that
/// reads the product (the value returned with it). `None` when this backend cannot run it that
/// way yet (then it runs on the reference kernels).
fn library_step(
    f: &Function,
    plan: &Plan,
    kd: &KernelData,
    scratch: Option<u64>,
) -> Option<(LibOp, Option<(KernelData, Value)>)> {
    let d = f.op(kd.ops[0]);
    let r = d.results[0];
    let dtype = f.ty(r).dtype();
    if !matches!(dtype, DType::F32 | DType::F64) {
        return None;
    }
    let dims4 = |v: Value| -> [usize; 4] { std::array::from_fn(|i| f.ty(v).dims()[i] as usize) };
    // Library ops take two operands; anything else is not one.
    let (&a0, &a1) = (d.args.first()?, d.args.get(1)?);
    let conv = |mode, attrs: &tcc_ir::Conv2d, x: Value, w: Value, y: Value| {
        LibOp::Conv(Conv {
            mode,
            x,
            w,
            y,
            dtype,
            attrs: attrs.clone(),
            xd: dims4(x),
            wd: dims4(w),
            yd: dims4(y),
            scratch,
            group: crate::memory::conv_group(
                f.ty(x).dims()[0],
                f.ty(y).dims()[2] * f.ty(y).dims()[3],
            ) as usize,
            packed: if mode == ConvMode::Forward {
                pack_filter(f, w, attrs.groups as usize)
            } else {
                Vec::new()
            },
        })
    };
    let mut lib = match &d.kind {
        OpKind::MatMul => LibOp::MatMul(matmul_step(f, plan, a0, a1, r)),
        OpKind::Conv2d(c) => conv(ConvMode::Forward, c, a0, a1, r),
        OpKind::Conv2dGradInput { conv: c, .. } => conv(ConvMode::GradInput, c, r, a1, a0),
        OpKind::Conv2dGradFilter { conv: c, .. } => conv(ConvMode::GradFilter, c, a0, r, a1),
        _ => return None,
    };
    if kd.ops.len() == 1 {
        return Some((lib, None));
    }
    let (epi, dst) = epilogue(f, kd, r)?;
    lib.set_dst(dst);
    Some((lib, Some((epi, r))))
}

/// A constant f32 filter `[O, C/g, kH, kW]` packed for the AVX-512 GEMM, one `[O/g, C/g·kH·kW]`
/// matrix per group; empty when the filter is not a constant or that GEMM is not used.
fn pack_filter(f: &Function, w: Value, groups: usize) -> Vec<sgemm::PackedA> {
    let ty = f.ty(w);
    if ty.dtype() != DType::F32 || !sgemm::available() {
        return Vec::new();
    }
    let Some(OpKind::Const { ty, value }) = f.def_op(w).map(|op| &f.op(op).kind) else {
        return Vec::new();
    };
    let Ok(t) = Tensor::from_literal(ty, value) else {
        return Vec::new();
    };
    let data = t.as_f32().expect("an f32 constant");
    let d = ty.dims();
    let (og, kk) = (d[0] as usize / groups, (d[1] * d[2] * d[3]) as usize);
    (0..groups)
        .map(|g| {
            let a = sgemm::Mat {
                ptr: data[g * og * kk..].as_ptr(),
                rs: kk,
                cs: 1,
            };
            // SAFETY: group g's rows of the filter are og x kk elements of `data`.
            unsafe { sgemm::PackedA::new(og, kk, a) }
        })
        .collect()
}

fn matmul_step(f: &Function, plan: &Plan, a: Value, b: Value, r: Value) -> MatMul {
    let dtype = f.ty(r).dtype();
    let (ad, bd, od) = (f.ty(a).dims(), f.ty(b).dims(), f.ty(r).dims());
    let (m, k, n) = (
        ad[ad.len() - 2] as usize,
        ad[ad.len() - 1] as usize,
        bd[bd.len() - 1] as usize,
    );
    let batch = &od[..od.len() - 2];
    let batches = batch_map(&ad[..ad.len() - 2], batch)
        .into_iter()
        .zip(batch_map(&bd[..bd.len() - 2], batch))
        .collect();
    let (sa, sb) = (
        crate::plan::folded_transpose(f, plan, a),
        crate::plan::folded_transpose(f, plan, b),
    );
    MatMul {
        a: sa.unwrap_or(a),
        b: sb.unwrap_or(b),
        ta: sa.is_some(),
        tb: sb.is_some(),
        dst: r,
        dtype,
        m,
        n,
        k,
        batches,
    }
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
    if !jit::can_compile(f, &epi) {
        return None;
    }
    let dst = if kd.outputs.contains(&r) {
        r
    } else {
        *epi.outputs.iter().find(|&&o| f.ty(o) == f.ty(r))?
    };
    Some((epi, dst))
}

/// Loops of at least this many elements are split across threads.
const PARALLEL_ELEMENTS: u64 = 1 << 16;

/// The pointer table of a kernel call, shareable across the threads that run its pieces.
struct Ptrs(Vec<*mut u8>);

// SAFETY: the pieces of one loop write disjoint element ranges of its outputs and only read
// its inputs, so sharing the table between threads for the duration of the call is sound.
unsafe impl Sync for Ptrs {}

fn run_loop(l: &Loop, addr: &dyn Fn(Value) -> *mut u8) {
    let ptrs = Ptrs(l.args.iter().map(|&v| addr(v)).collect());
    let threads = rayon::current_num_threads() as u64;
    if l.n * l.unit < PARALLEL_ELEMENTS || threads < 2 || l.n < 2 {
        // SAFETY: each pointer addresses storage of its value's type (inputs are checked, the
        // arena is sized by the memory plan), and the kernel touches elements 0..n only.
        unsafe { (l.code)(ptrs.0.as_ptr(), 0, l.n) };
        return;
    }
    // Elementwise pieces start at multiples of 64 elements so every piece but the last
    // vectorises fully; row kernels split by rows.
    let round = if l.unit == 1 { 64 } else { 1 };
    let piece = l.n.div_ceil(threads).div_ceil(round) * round;
    let ptrs = &ptrs;
    rayon::scope(|s| {
        for start in (0..l.n).step_by(piece as usize) {
            let end = (start + piece).min(l.n);
            // SAFETY: as above; pieces cover disjoint ranges of an elementwise loop.
            s.spawn(move |_| unsafe { (l.code)(ptrs.0.as_ptr(), start, end) });
        }
    });
}

/// Below this many multiply-adds a matmul runs on one thread.
const PARALLEL_FLOPS: usize = 1 << 18;

/// A matrix operand of [`gemm`]: element `(i, j)` at `ptr + i * rs + j * cs`.
#[derive(Clone, Copy)]
struct Mat<T> {
    ptr: *const T,
    rs: usize,
    cs: usize,
}

impl<T> Mat<T> {
    /// A row-major matrix with leading dimension `ld`.
    fn rows(ptr: *const T, ld: usize) -> Mat<T> {
        Mat { ptr, rs: ld, cs: 1 }
    }

    /// The transpose of a row-major matrix with leading dimension `ld`.
    fn transposed(ptr: *const T, ld: usize) -> Mat<T> {
        Mat { ptr, rs: 1, cs: ld }
    }
}

/// `C = A · B` (or `C += A · B` with `accumulate`) for a row-major `C` with leading dimension
/// `ldc` and strided `A`, `B`, through our AVX-512 kernel for f32 where the CPU has it and the
/// `gemm` crate otherwise. The one place a GEMM is chosen.
///
/// # Safety
/// `a`, `b` and `c` address `m×k`, `k×n` and `m×n` matrices of `T`; `c` overlaps neither input.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm<T: Copy + Default + 'static>(
    m: usize,
    n: usize,
    k: usize,
    a: Mat<T>,
    b: Mat<T>,
    c: *mut T,
    ldc: usize,
    accumulate: bool,
    one: T,
    parallel: bool,
) {
    if std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>() && sgemm::available() {
        let threads = if parallel {
            rayon::current_num_threads()
        } else {
            1
        };
        let f = |x: Mat<T>| sgemm::Mat {
            ptr: x.ptr as *const f32,
            rs: x.rs,
            cs: x.cs,
        };
        // SAFETY: T is f32 here; the caller's contract is sgemm's.
        unsafe { sgemm::sgemm(m, n, k, f(a), f(b), c as *mut f32, ldc, accumulate, threads) };
        return;
    }
    let par = if parallel && m * n * k >= PARALLEL_FLOPS {
        gemm::Parallelism::Rayon(0)
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: the caller's contract; gemm computes c := alpha * c + 1 * a * b, reading c only
    // when accumulating.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c,
            1,
            ldc as isize,
            accumulate,
            a.ptr,
            a.cs as isize,
            a.rs as isize,
            b.ptr,
            b.cs as isize,
            b.rs as isize,
            if accumulate { one } else { T::default() },
            one,
            false,
            false,
            false,
            par,
        )
    };
}

fn run_matmul(mm: &MatMul, addr: &dyn Fn(Value) -> *mut u8) {
    let (a, b, dst) = (addr(mm.a), addr(mm.b), addr(mm.dst));
    // SAFETY: a, b and dst hold tensors of the dims recorded at compile time, of `dtype`.
    unsafe {
        match mm.dtype {
            DType::F32 if mm.m == 1 && !mm.ta => gemv(mm, a as _, b as _, dst as _),
            DType::F32 => matmul_batches::<f32>(mm, a as _, b as _, dst as _, 1.0),
            DType::F64 => matmul_batches::<f64>(mm, a as _, b as _, dst as _, 1.0),
            _ => unreachable!("library matmuls are f32 or f64"),
        }
    }
}

/// A row vector times a matrix, per batch: packing the matrix for a GEMM would cost more than
/// the product. With B transposed (a `[n, k]` weight, as `Gemm` with `transB` and fully
/// connected layers store it) each output is a dot product of two contiguous rows; otherwise
/// the output row accumulates `a[p] * B[p, ..]`. Outputs are split among threads.
///
/// # Safety
/// As for `matmul_batches`, with `m == 1` and `a` not transposed.
unsafe fn gemv(mm: &MatMul, a: *const f32, b: *const f32, dst: *mut f32) {
    let (n, k) = (mm.n, mm.k);
    let (pa, pb, pd) = (Ptr(a as *mut f32), Ptr(b as *mut f32), Ptr(dst));
    for (i, &(ab, bb)) in mm.batches.iter().enumerate() {
        let chunk = n.div_ceil(rayon::current_num_threads()).max(64);
        let job = move |j0: usize| {
            let (pa, pb, pd) = (pa, pb, pd);
            let j1 = (j0 + chunk).min(n);
            // SAFETY: the batch's operands are in bounds (the caller's contract); each job
            // writes outputs j0..j1 only.
            unsafe {
                let x = std::slice::from_raw_parts(pa.0.add(ab * k), k);
                let y = std::slice::from_raw_parts_mut(pd.0.add(i * n + j0), j1 - j0);
                let w = pb.0.add(bb * k * n);
                if mm.tb {
                    for (j, y) in (j0..j1).zip(y.iter_mut()) {
                        let row = std::slice::from_raw_parts(w.add(j * k), k);
                        *y = dot(x, row);
                    }
                } else {
                    y.fill(0.0);
                    for (p, &xp) in x.iter().enumerate() {
                        let row = std::slice::from_raw_parts(w.add(p * n + j0), j1 - j0);
                        for (y, &v) in y.iter_mut().zip(row) {
                            *y += xp * v;
                        }
                    }
                }
            }
        };
        if n * k < 1 << 16 {
            (0..n).step_by(chunk).for_each(job);
            continue;
        }
        rayon::scope(|s| {
            for j0 in (0..n).step_by(chunk) {
                s.spawn(move |_| job(j0));
            }
        });
    }
}

/// A dot product in eight independent partial sums, so it vectorises.
fn dot(x: &[f32], y: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (xc, yc) = (x.chunks_exact(8), y.chunks_exact(8));
    let tail: f32 = xc
        .remainder()
        .iter()
        .zip(yc.remainder())
        .map(|(a, b)| a * b)
        .sum();
    for (a, b) in xc.zip(yc) {
        for t in 0..8 {
            acc[t] += a[t] * b[t];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// One GEMM per output batch.
///
/// # Safety
/// `a`, `b` and `dst` hold `[batches.., m, k]` (or, transposed, `[.., k, m]`), `[.., k, n]` (or
/// `[.., n, k]`) and `[.., m, n]` elements; `dst` overlaps neither operand.
unsafe fn matmul_batches<T: Copy + Default + 'static>(
    mm: &MatMul,
    a: *const T,
    b: *const T,
    dst: *mut T,
    one: T,
) {
    let (m, n, k) = (mm.m, mm.n, mm.k);
    for (i, &(ab, bb)) in mm.batches.iter().enumerate() {
        // SAFETY: the offsets stay inside the operands (the caller's contract).
        let (pa, pb, pd) = unsafe { (a.add(ab * m * k), b.add(bb * k * n), dst.add(i * m * n)) };
        let ma = if mm.ta {
            Mat::transposed(pa, m)
        } else {
            Mat::rows(pa, k)
        };
        let mb = if mm.tb {
            Mat::transposed(pb, k)
        } else {
            Mat::rows(pb, n)
        };
        // SAFETY: as above.
        unsafe { gemm::<T>(m, n, k, ma, mb, pd, n, false, one, true) };
    }
}

/// A single-op kernel on a hand-written kernel, if there is one for it.
fn native_step(f: &Function, kd: &KernelData) -> Option<native::Native> {
    match (&kd.kind, kd.ops.as_slice()) {
        (KernelKind::Generic | KernelKind::Reduction { .. }, &[op]) => {
            native::Native::for_op(f, op, &kd.outputs)
        }
        _ => None,
    }
}

/// A compiled function.
pub struct Executable {
    func: Function,
    plan: Plan,
    mem: MemoryPlan,
    steps: Vec<Step>,
    /// The value whose storage each value uses (itself, or a view's source).
    origin: HashMap<Value, Value>,
    consts: HashMap<Value, Vec<Line>>,
    /// Arenas of finished runs, reused by later ones (one per concurrent run at most).
    arenas: std::sync::Mutex<Vec<Vec<Line>>>,
    /// With `TCC_PROFILE` set: the time spent in each step over all runs, printed on drop.
    profile: Option<std::sync::Mutex<Vec<std::time::Duration>>>,
    _code: Code,
}

impl Drop for Executable {
    /// With `TCC_PROFILE` set, prints where the time went, largest first.
    fn drop(&mut self) {
        let Some(Ok(times)) = self.profile.as_ref().map(|p| p.lock()) else {
            return;
        };
        let total: f64 = times.iter().map(|t| t.as_secs_f64()).sum();
        let mut rows: Vec<(f64, String)> = self
            .steps
            .iter()
            .zip(times.iter())
            .map(|(s, t)| {
                let (what, op) = match s {
                    Step::Jit(_) => ("jit", None),
                    Step::Library { op, .. } => (
                        "library",
                        Some(match op {
                            LibOp::MatMul(m) => m.dst,
                            LibOp::Conv(c) => c.y,
                        }),
                    ),
                    Step::Native(n) => ("native", Some(self.func.op(n.op()).results[0])),
                    Step::Reference(k) => (
                        "reference",
                        Some(self.func.op(self.plan.kernels[*k].ops[0]).results[0]),
                    ),
                };
                let name = op.map_or(String::new(), |v| {
                    let d = self.func.def_op(v).map(|o| self.func.op(o).kind.mnemonic());
                    format!("{} %{}", d.unwrap_or(""), self.func.name(v))
                });
                (t.as_secs_f64(), format!("{what:<9} {name}"))
            })
            .collect();
        rows.sort_by(|a, b| b.0.total_cmp(&a.0));
        eprintln!(
            "TCC_PROFILE @{}: {:.3} ms in {} steps",
            self.func.name,
            total * 1e3,
            rows.len()
        );
        for (t, what) in rows.iter().take(25) {
            eprintln!(
                "  {:>9.3} ms {:>5.1}%  {what}",
                t * 1e3,
                100.0 * t / total.max(1e-12)
            );
        }
    }
}

/// How a compiled function's kernels run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stats {
    /// Kernels compiled to machine code.
    pub compiled: usize,
    /// Single ops run by hand-written kernels.
    pub native: usize,
    /// Kernels run by the reference kernels.
    pub reference: usize,
    /// View kernels (no work).
    pub views: usize,
    /// Kernels none of whose results are used (skipped).
    pub dead: usize,
    /// Arena bytes per run.
    pub arena_bytes: u64,
    /// Bytes of results written straight into the returned tensors, per run.
    pub output_bytes: u64,
}

/// The largest constant the runtime materialises (1 GiB).
const MAX_CONST_BYTES: u64 = 1 << 30;

fn write_data(dst: *mut u8, t: &Tensor) {
    // SAFETY (callers): `dst` points at storage of `t`'s type, which holds `size_bytes` bytes.
    let (src, len) = match t.data() {
        Data::F32(v) => (v.as_ptr() as *const u8, v.len() * 4),
        Data::F64(v) => (v.as_ptr() as *const u8, v.len() * 8),
        Data::I8(v) => (v.as_ptr() as *const u8, v.len()),
        Data::U8(v) => (v.as_ptr(), v.len()),
        Data::I32(v) => (v.as_ptr() as *const u8, v.len() * 4),
        Data::I64(v) => (v.as_ptr() as *const u8, v.len() * 8),
        Data::Bool(v) => (v.as_ptr() as *const u8, v.len()),
    };
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
}

/// Copies a tensor of type `ty` out of memory at `src`.
///
/// # Safety
/// `src` must point at `ty.size_bytes()` readable bytes holding valid elements of `ty`, aligned
/// for its dtype.
unsafe fn read_data(src: *const u8, ty: &TensorType) -> Tensor {
    let n = ty.numel() as usize;
    unsafe {
        let data = match ty.dtype() {
            DType::F32 => Data::F32(std::slice::from_raw_parts(src as *const f32, n).to_vec()),
            DType::F64 => Data::F64(std::slice::from_raw_parts(src as *const f64, n).to_vec()),
            DType::I8 => Data::I8(std::slice::from_raw_parts(src as *const i8, n).to_vec()),
            DType::U8 => Data::U8(std::slice::from_raw_parts(src, n).to_vec()),
            DType::I32 => Data::I32(std::slice::from_raw_parts(src as *const i32, n).to_vec()),
            DType::I64 => Data::I64(std::slice::from_raw_parts(src as *const i64, n).to_vec()),
            DType::Bool => Data::Bool(
                std::slice::from_raw_parts(src, n)
                    .iter()
                    .map(|&b| b != 0)
                    .collect(),
            ),
        };
        Tensor::new(ty.clone(), data).expect("sized from the type")
    }
}

/// Asks the kernel to back `len` bytes at `ptr` with transparent huge pages, so that a large
/// fresh buffer takes a few page faults instead of one per 4 KiB. Only a hint; no effect on small
/// buffers or other systems.
fn advise_huge_pages(ptr: *mut u8, len: usize) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        if len >= 2 * HUGE {
            let start = (ptr as usize).next_multiple_of(4096);
            let end = (ptr as usize + len) & !4095;
            // SAFETY: the range lies inside one live allocation; MADV_HUGEPAGE changes only how
            // it is backed, never its contents.
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (ptr, len);
}

/// The start of `d`'s allocation (its capacity), to be written through.
fn capacity_ptr(d: &mut Data) -> *mut u8 {
    match d {
        Data::F32(v) => v.as_mut_ptr() as *mut u8,
        Data::F64(v) => v.as_mut_ptr() as *mut u8,
        Data::I8(v) => v.as_mut_ptr() as *mut u8,
        Data::U8(v) => v.as_mut_ptr(),
        Data::I32(v) => v.as_mut_ptr() as *mut u8,
        Data::I64(v) => v.as_mut_ptr() as *mut u8,
        Data::Bool(v) => v.as_mut_ptr() as *mut u8,
    }
}

/// Sets the length of `d`'s vector.
///
/// # Safety
/// The first `n` elements (within capacity) must have been initialised with valid values.
unsafe fn set_len(d: &mut Data, n: usize) {
    unsafe {
        match d {
            Data::F32(v) => v.set_len(n),
            Data::F64(v) => v.set_len(n),
            Data::I8(v) => v.set_len(n),
            Data::U8(v) => v.set_len(n),
            Data::I32(v) => v.set_len(n),
            Data::I64(v) => v.set_len(n),
            Data::Bool(v) => v.set_len(n),
        }
    }
}

fn data_ptr(t: &Tensor) -> *const u8 {
    match t.data() {
        Data::F32(v) => v.as_ptr() as *const u8,
        Data::F64(v) => v.as_ptr() as *const u8,
        Data::I8(v) => v.as_ptr() as *const u8,
        Data::U8(v) => v.as_ptr(),
        Data::I32(v) => v.as_ptr() as *const u8,
        Data::I64(v) => v.as_ptr() as *const u8,
        Data::Bool(v) => v.as_ptr() as *const u8,
    }
}

/// The arena offset of the scratch space the memory plan set aside for kernel `k`.
fn scratch_offset(mem: &MemoryPlan, k: Kernel) -> Option<u64> {
    mem.slots
        .iter()
        .find(|s| s.scratch_for == Some(k))
        .map(|s| s.offset)
}

fn run_conv(cv: &Conv, addr: &dyn Fn(Value) -> *mut u8, base: *mut u8) {
    let (x, w, y) = (addr(cv.x), addr(cv.w), addr(cv.y));
    let scratch = cv.scratch.map(|off| base.wrapping_add(off as usize));
    // SAFETY: x, w and y hold tensors of the dims recorded at compile time, and the scratch
    // slot holds C/groups * kH * kW * oH * oW elements (memory::scratch_bytes).
    unsafe {
        match cv.dtype {
            DType::F32 => {
                conv_gemm::<f32>(cv, x as _, w as _, y as _, scratch.map(|p| p as _), 1.0)
            }
            DType::F64 => {
                conv_gemm::<f64>(cv, x as _, w as _, y as _, scratch.map(|p| p as _), 1.0)
            }
            _ => unreachable!("library convolutions are f32 or f64"),
        }
    }
}

/// The outputs `lo..hi` (of `n_out`) whose tap reads inside an axis of length `len`, when output
/// `o` reads position `o * stride + off`; `(0, 0)` when there are none.
pub(crate) fn in_bounds(off: isize, stride: isize, len: isize, n_out: usize) -> (usize, usize) {
    let (lo, hi) = if stride == 1 {
        ((-off).max(0), (len - off).min(n_out as isize))
    } else {
        let lo = if off >= 0 {
            0
        } else {
            (-off + stride - 1) / stride
        };
        let hi = if len - 1 - off < 0 {
            0
        } else {
            ((len - 1 - off) / stride + 1).min(n_out as isize)
        };
        (lo, hi)
    };
    if hi <= lo {
        (0, 0)
    } else {
        (lo as usize, hi as usize)
    }
}

/// An `h x w` plane with its columns split by phase for a column stride `s`: phase `q` holds
/// columns `q, q + s, ...` of every row, `w.div_ceil(s)` per row, so strided reads along a row
/// become contiguous ones.
pub(crate) fn phase_split<T: Copy + Default>(x: &[T], h: usize, w: usize, s: usize) -> Vec<T> {
    let pw = w.div_ceil(s);
    let mut v = vec![T::default(); s * h * pw];
    for q in 0..s.min(w) {
        for r in 0..h {
            let dst = &mut v[(q * h + r) * pw..(q * h + r + 1) * pw];
            for (d, &e) in dst
                .iter_mut()
                .zip(x[r * w + q..(r + 1) * w].iter().step_by(s))
            {
                *d = e;
            }
        }
    }
    v
}

/// For each of `kw` window columns (dilation `d`, padding `p` before, column stride `s`): the
/// outputs `lo..hi` (of `ow`) whose tap is inside a row of `w`, and where their inputs start in
/// the [`phase_split`] plane of `h` rows (row 0; add `row * w.div_ceil(s)`).
pub(crate) fn phase_spans(
    kw: usize,
    d: isize,
    p: isize,
    s: usize,
    (h, w, ow): (usize, usize, usize),
) -> Vec<(usize, usize, usize)> {
    let pw = w.div_ceil(s);
    (0..kw)
        .map(|kx| {
            let off = kx as isize * d - p;
            let (lo, hi) = in_bounds(off, s as isize, w as isize, ow);
            if hi == lo {
                return (0, 0, 0);
            }
            let first = (lo as isize * s as isize + off) as usize;
            (lo, hi, (first % s) * h * pw + first / s)
        })
        .collect()
}

/// The position in the padded input that tap `(ky, kx)` of output `(oy, ox)` reads, if it is
/// inside the image: one function for im2col and col2im.
struct Taps {
    h: isize,
    w: isize,
    s: [isize; 2],
    d: [isize; 2],
    p: [isize; 2],
}

impl Taps {
    fn new(cv: &Conv) -> Taps {
        Taps {
            h: cv.xd[2] as isize,
            w: cv.xd[3] as isize,
            s: cv.attrs.strides.map(|v| v as isize),
            d: cv.attrs.dilations.map(|v| v as isize),
            p: [cv.attrs.pads[0] as isize, cv.attrs.pads[1] as isize],
        }
    }

    /// Calls `f(column row, first column, first image index, length)` for every run of in-image
    /// taps along one output row: columns `j..j+len` of the row read image positions `i`,
    /// `i + stride`, ... (one channel group).
    fn runs(&self, cv: &Conv, mut f: impl FnMut(usize, usize, usize, usize)) {
        let [_, cg, kh, kw] = cv.wd;
        let [_, _, oh, ow] = cv.yd;
        let (h, w, s) = (self.h, self.w, self.s[1]);
        for ci in 0..cg {
            for ky in 0..kh {
                for kx in 0..kw {
                    let row = (ci * kh + ky) * kw + kx;
                    // ix = ox * s + off must lie in 0..w.
                    let off = kx as isize * self.d[1] - self.p[1];
                    let (lo, hi) = in_bounds(off, s, w, ow);
                    if hi == lo {
                        continue;
                    }
                    let len = hi - lo;
                    for oy in 0..oh {
                        let iy = oy as isize * self.s[0] + ky as isize * self.d[0] - self.p[0];
                        if iy < 0 || iy >= h {
                            continue;
                        }
                        let ix = lo as isize * s + off;
                        let i = (ci * h as usize + iy as usize) * w as usize + ix as usize;
                        f(row, oy * ow + lo, i, len);
                    }
                }
            }
        }
    }

    /// im2col of one image (group): `m` columns of `cols [kk, ld]` from `image`, zeros where
    /// padding is read.
    ///
    /// # Safety
    /// `image` holds the group's channels, `cols` `kk * m` elements.
    unsafe fn im2col<T: Copy + Default>(
        &self,
        cv: &Conv,
        image: *const T,
        cols: *mut T,
        m: usize,
        ld: usize,
    ) {
        let [_, cg, kh, kw] = cv.wd;
        let s = self.s[1] as usize;
        // SAFETY: the caller's contract; runs stay inside their row and the image.
        unsafe {
            for row in 0..cg * kh * kw {
                std::slice::from_raw_parts_mut(cols.add(row * ld), m).fill(T::default());
            }
            self.runs(cv, |row, j, i, len| {
                let dst = std::slice::from_raw_parts_mut(cols.add(row * ld + j), len);
                if s == 1 {
                    dst.copy_from_slice(std::slice::from_raw_parts(image.add(i), len));
                } else {
                    for (t, d) in dst.iter_mut().enumerate() {
                        *d = *image.add(i + t * s);
                    }
                }
            });
        }
    }

    /// col2im of one image (group): adds each column element into the image position it read.
    ///
    /// # Safety
    /// As for `im2col`.
    unsafe fn col2im<T: Copy + std::ops::AddAssign>(
        &self,
        cv: &Conv,
        cols: *const T,
        image: *mut T,
        ld: usize,
    ) {
        let s = self.s[1] as usize;
        // SAFETY: as for `im2col`.
        unsafe {
            self.runs(cv, |row, j, i, len| {
                let src = std::slice::from_raw_parts(cols.add(row * ld + j), len);
                for (t, &v) in src.iter().enumerate() {
                    *image.add(i + t * s) += v;
                }
            });
        }
    }
}

/// Raw pointers handed to the threads of one convolution; each thread writes only its own
/// images (or its own partial filter gradient).
#[derive(Clone, Copy)]
struct Ptr<T>(*mut T);
// SAFETY: see `conv_gemm`: the ranges written through these pointers are disjoint per thread.
unsafe impl<T> Send for Ptr<T> {}
unsafe impl<T> Sync for Ptr<T> {}

/// A convolution or one of its gradients by im2col/col2im and `gemm`. Images are split among
/// threads, each with its own columns buffer (the planned scratch slot for the first) and, for
/// the filter gradient, its own partial sum, added up at the end.
///
/// # Safety
/// As for `run_conv`; `scratch` is `None` only for a plain 1x1 convolution.
unsafe fn conv_gemm<
    T: Copy + Default + Send + Sync + std::ops::AddAssign + std::ops::Mul<Output = T> + 'static,
>(
    cv: &Conv,
    x: *mut T,
    w: *mut T,
    y: *mut T,
    scratch: Option<*mut T>,
    one: T,
) {
    let nb = cv.xd[0];
    let [o, cg, kh, kw] = cv.wd;
    let dims = |d: [usize; 4]| d.map(|v| v as u64);
    let cols_len =
        crate::memory::conv_scratch_elements(&cv.attrs, &dims(cv.xd), &dims(cv.wd), &dims(cv.yd))
            as usize;
    if cv.mode == ConvMode::Forward && cg == 1 && o == cv.xd[1] && cv.attrs.groups as usize == o {
        // SAFETY: the caller's contract.
        unsafe { depthwise(cv, x, w, y) };
        return;
    }
    let parts = rayon::current_num_threads().min(nb).max(1);
    let per = nb.div_ceil(parts);
    if cv.mode == ConvMode::GradInput {
        // SAFETY: dx holds nb * C * H * W elements.
        unsafe { std::ptr::write_bytes(x, 0, nb * cv.xd[1] * cv.xd[2] * cv.xd[3]) };
    }
    if parts == 1 {
        // SAFETY: the caller's contract, all images on this thread.
        unsafe { conv_images(cv, 0..nb, x, w, y, scratch, one, true) };
        return;
    }
    let wlen = o * cg * kh * kw;
    // Thread t > 0 gets its own columns and, for the filter gradient, its own partial sum.
    let mut spare: Vec<(Vec<T>, Vec<T>)> = (1..parts)
        .map(|_| {
            let cols = vec![T::default(); cols_len];
            let dw = if cv.mode == ConvMode::GradFilter {
                vec![T::default(); wlen]
            } else {
                Vec::new()
            };
            (cols, dw)
        })
        .collect();
    let (px, pw, py) = (Ptr(x), Ptr(w), Ptr(y));
    let jobs: Vec<(usize, Option<Ptr<T>>, Ptr<T>)> = std::iter::once((0, scratch.map(Ptr), pw))
        .chain(spare.iter_mut().enumerate().map(|(t, (cols, dw))| {
            let cols = scratch.map(|_| Ptr(cols.as_mut_ptr()));
            let w = if cv.mode == ConvMode::GradFilter {
                Ptr(dw.as_mut_ptr())
            } else {
                pw
            };
            (t + 1, cols, w)
        }))
        .collect();
    rayon::scope(|s| {
        for &(t, cols, wt) in &jobs {
            let images = t * per..((t + 1) * per).min(nb);
            s.spawn(move |_| {
                // Move the wrappers whole (not their pointer fields), so the closure is Send.
                let (px, py, wt, cols) = (px, py, wt, cols);
                // SAFETY: threads work on disjoint image ranges of x and y, their own columns,
                // and (for the filter gradient) their own partial sums.
                unsafe { conv_images(cv, images, px.0, wt.0, py.0, cols.map(|c| c.0), one, false) };
            });
        }
    });
    if cv.mode == ConvMode::GradFilter {
        // SAFETY: dw holds wlen elements; the partial sums are separate buffers.
        let dw = unsafe { std::slice::from_raw_parts_mut(w, wlen) };
        for (_, part) in &spare {
            for (d, &p) in dw.iter_mut().zip(part) {
                *d += p;
            }
        }
    }
}

/// A depthwise convolution (one filter per channel, `groups == C == O`) computed directly: a
/// GEMM per channel would multiply a 1 x kH*kW filter by its columns, all overhead. Channels are
/// split among threads; see [`depthwise_plane`] for one channel.
///
/// # Safety
/// `x`, `w` and `y` hold tensors of the dims `cv` records.
unsafe fn depthwise<T>(cv: &Conv, x: *mut T, w: *mut T, y: *mut T)
where
    T: Copy + Default + Send + Sync + std::ops::AddAssign + std::ops::Mul<Output = T> + 'static,
{
    let [nb, c, h, wd] = cv.xd;
    let [_, _, kh, kw] = cv.wd;
    let [_, _, oh, ow] = cv.yd;
    let taps = Taps::new(cv);
    let s = taps.s[1] as usize;
    let g = Depthwise {
        spans: phase_spans(kw, taps.d[1], taps.p[1], s, (h, wd, ow)),
        taps,
        kh,
        kw,
        oh,
        ow,
    };
    let f32_fma = std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>() && has_avx2_fma();
    let (px, pw, py) = (Ptr(x), Ptr(w), Ptr(y));
    let plane = |ch: usize, px: Ptr<T>, pw: Ptr<T>, py: Ptr<T>| {
        let (px, pw, py) = (px, pw, py);
        // SAFETY: channel `ch` of image `ch / c` is in bounds of x and y, its filter of w; each
        // call writes only its own output plane.
        unsafe {
            let xin = std::slice::from_raw_parts(px.0.add(ch * h * wd), h * wd);
            let out = std::slice::from_raw_parts_mut(py.0.add(ch * oh * ow), oh * ow);
            let f = std::slice::from_raw_parts(pw.0.add((ch % c) * kh * kw), kh * kw);
            if f32_fma {
                let cast = |s: &[T]| std::slice::from_raw_parts(s.as_ptr() as *const f32, s.len());
                let out = std::slice::from_raw_parts_mut(out.as_mut_ptr() as *mut f32, out.len());
                depthwise_plane_fma(&g, cast(xin), cast(f), out);
            } else {
                depthwise_plane::<T, false>(&g, xin, f, out);
            }
        }
    };
    use rayon::prelude::*;
    (0..nb * c)
        .into_par_iter()
        .with_min_len(4)
        .for_each(|ch| plane(ch, px, pw, py));
}

/// Whether this CPU has AVX2 and FMA (the depthwise kernel's wide version).
fn has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// What every channel of a depthwise convolution shares: the taps, the filter and output sizes,
/// and each filter column's span ([`phase_spans`]).
struct Depthwise {
    taps: Taps,
    kh: usize,
    kw: usize,
    oh: usize,
    ow: usize,
    spans: Vec<(usize, usize, usize)>,
}

/// [`depthwise_plane`] for f32 compiled for AVX2 with fused multiply-adds.
///
/// # Safety
/// The CPU must have AVX2 and FMA ([`has_avx2_fma`]).
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx2,fma"))]
unsafe fn depthwise_plane_fma(g: &Depthwise, x: &[f32], f: &[f32], out: &mut [f32]) {
    depthwise_plane::<f32, true>(g, x, f, out)
}

/// One channel of a depthwise convolution: `x` the input plane, `f` the channel's filter. For each output row and filter tap, the in-image span of the row is
/// one multiply-add run over contiguous input. With a column stride `s > 1` the input rows are
/// first split by column phase (`x[.., q::s]` for each `q < s`), so the runs stay contiguous and
/// vectorise. `FMA` fuses each multiply-add (f32 with the CPU feature only).
#[inline(always)]
fn depthwise_plane<T, const FMA: bool>(g: &Depthwise, x: &[T], f: &[T], out: &mut [T])
where
    T: Copy + Default + std::ops::AddAssign + std::ops::Mul<Output = T> + 'static,
{
    let (taps, kh, kw, oh, ow) = (&g.taps, g.kh, g.kw, g.oh, g.ow);
    let (h, w) = (taps.h as usize, taps.w as usize);
    let (sy, sx) = (taps.s[0], taps.s[1]);
    let s = sx as usize;
    let pw = w.div_ceil(s);
    let split;
    let src: &[T] = if s == 1 {
        x
    } else {
        split = phase_split(x, h, w, s);
        &split
    };
    out.fill(T::default());
    for oy in 0..oh {
        let row = &mut out[oy * ow..(oy + 1) * ow];
        for ky in 0..kh {
            let iy = oy as isize * sy + ky as isize * taps.d[0] - taps.p[0];
            if iy < 0 || iy >= taps.h {
                continue;
            }
            for (kx, &(lo, hi, start)) in g.spans.iter().enumerate() {
                if hi > lo {
                    let b = start + iy as usize * pw;
                    depthwise_run::<T, FMA>(
                        &mut row[lo..hi],
                        &src[b..b + hi - lo],
                        f[ky * kw + kx],
                    );
                }
            }
        }
    }
}

/// `out += wv * input`, elementwise (fused when `FMA`, where T is f32).
#[inline(always)]
fn depthwise_run<T, const FMA: bool>(out: &mut [T], input: &[T], wv: T)
where
    T: Copy + std::ops::AddAssign + std::ops::Mul<Output = T> + 'static,
{
    if FMA {
        // SAFETY: T is f32 (only `depthwise_plane_fma` sets FMA).
        let (o, i, wv) = unsafe {
            (
                std::slice::from_raw_parts_mut(out.as_mut_ptr() as *mut f32, out.len()),
                std::slice::from_raw_parts(input.as_ptr() as *const f32, input.len()),
                *(&wv as *const T as *const f32),
            )
        };
        for (o, &v) in o.iter_mut().zip(i) {
            *o = v.mul_add(wv, *o);
        }
    } else {
        for (o, &v) in out.iter_mut().zip(input) {
            *o += wv * v;
        }
    }
}

/// The convolution of `images` on one thread (see `conv_gemm`), `cv.group` images side by side
/// per GEMM, with `parallel` GEMMs when the thread has all the images. For a chunk of `B`
/// images the scratch holds the columns `cols [kk, B*m]` (image `i` in columns `i*m..`) and the
/// output-side rows `rows [og, B*m]`:
///
/// - forward: im2col, `rows = W_g · cols`, rows copied to `y`;
/// - filter gradient: im2col, `dy` gathered into `rows`, `dW_g += rows · cols^T`;
/// - input gradient: `dy` gathered, `cols = W_g^T · rows`, col2im.
///
/// With one image the rows are that image's own output (nothing to copy), and a plain 1x1 with
/// no scratch reads (or writes) the image itself as its columns.
///
/// # Safety
/// As for `conv_gemm`; `w` is the filter (or this thread's partial filter gradient); the scratch
/// holds what `memory::scratch_bytes` says.
#[allow(clippy::too_many_arguments)]
unsafe fn conv_images<T: Copy + Default + std::ops::AddAssign + 'static>(
    cv: &Conv,
    images: std::ops::Range<usize>,
    x: *mut T,
    w: *mut T,
    y: *mut T,
    scratch: Option<*mut T>,
    one: T,
    parallel: bool,
) {
    let [_, c, h, wd] = cv.xd;
    let [o, cg, kh, kw] = cv.wd;
    let [_, _, oh, ow] = cv.yd;
    let g = cv.attrs.groups as usize;
    let og = o / g;
    let (kk, m) = (cg * kh * kw, oh * ow);
    let taps = Taps::new(cv);
    let (first, end) = (images.start, images.end);
    for n0 in images.step_by(cv.group.max(1)) {
        let b = cv.group.max(1).min(end - n0);
        let ld = b * m;
        // SAFETY (block): every pointer stays inside its tensor or the scratch; the GEMM's
        // destination overlaps neither operand.
        unsafe {
            for gi in 0..g {
                let image = |i: usize| x.add(((n0 + i) * c + gi * cg) * h * wd);
                let out = |i: usize| y.add(((n0 + i) * o + gi * og) * m);
                let filt = w.add(gi * og * kk);
                let cols = scratch.unwrap_or_else(|| image(0));
                let rows = match scratch {
                    Some(s) if b > 1 => s.add(kk * cv.group * m),
                    _ => out(0),
                };
                // The gathered panels index image rows with 32-bit offsets.
                let narrow = wd < 1 << 30 && cv.attrs.strides[1] < 1 << 20;
                let implicit = cv.mode == ConvMode::Forward
                    && std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>()
                    && sgemm::available()
                    && narrow
                    && (scratch.is_some() || !cv.packed.is_empty());
                if implicit {
                    // The f32 GEMM gathers its columns from the images itself (a plain 1x1
                    // reads its one image as they are).
                    let view = sgemm::Im2col {
                        x: image(0) as *const f32,
                        image_stride: c * h * wd,
                        h,
                        w: wd,
                        kh,
                        kw,
                        oh,
                        ow,
                        stride: cv.attrs.strides.map(|v| v as usize),
                        dilation: cv.attrs.dilations.map(|v| v as usize),
                        pad: [cv.attrs.pads[0] as usize, cv.attrs.pads[1] as usize],
                    };
                    let a = match cv.packed.get(gi) {
                        Some(p) => sgemm::A::Packed(p),
                        None => sgemm::A::Mat(sgemm::Mat {
                            ptr: filt as *const f32,
                            rs: kk,
                            cs: 1,
                        }),
                    };
                    let threads = if parallel {
                        rayon::current_num_threads()
                    } else {
                        1
                    };
                    let b = match scratch {
                        Some(_) => sgemm::B::Im2col(view),
                        None => sgemm::B::Mat(sgemm::Mat {
                            ptr: cols as *const f32,
                            rs: m,
                            cs: 1,
                        }),
                    };
                    sgemm::product(og, ld, kk, a, b, rows as *mut f32, ld, false, threads);
                } else if cv.mode != ConvMode::GradInput && scratch.is_some() {
                    for i in 0..b {
                        taps.im2col(cv, image(i), cols.add(i * m), m, ld);
                    }
                }
                if cv.mode != ConvMode::Forward && b > 1 {
                    for i in 0..b {
                        for r in 0..og {
                            std::ptr::copy_nonoverlapping(
                                out(i).add(r * m),
                                rows.add(r * ld + i * m),
                                m,
                            );
                        }
                    }
                }
                match cv.mode {
                    ConvMode::Forward if implicit => {}
                    ConvMode::Forward => gemm(
                        og,
                        ld,
                        kk,
                        Mat::rows(filt, kk),
                        Mat::rows(cols, ld),
                        rows,
                        ld,
                        false,
                        one,
                        parallel,
                    ),
                    ConvMode::GradFilter => gemm(
                        og,
                        kk,
                        ld,
                        Mat::rows(rows, ld),
                        Mat::transposed(cols, ld),
                        filt,
                        kk,
                        n0 > first,
                        one,
                        parallel,
                    ),
                    ConvMode::GradInput => gemm(
                        kk,
                        ld,
                        og,
                        Mat::transposed(filt, kk),
                        Mat::rows(rows, ld),
                        cols,
                        ld,
                        false,
                        one,
                        parallel,
                    ),
                }
                if cv.mode == ConvMode::Forward && b > 1 {
                    for i in 0..b {
                        for r in 0..og {
                            std::ptr::copy_nonoverlapping(
                                rows.add(r * ld + i * m),
                                out(i).add(r * m),
                                m,
                            );
                        }
                    }
                }
                if cv.mode == ConvMode::GradInput && scratch.is_some() {
                    for i in 0..b {
                        taps.col2im(cv, cols.add(i * m), image(i), ld);
                    }
                }
            }
        }
    }
}

impl Executable {
    /// Compiles `f`, which must verify, for the host CPU with every feature it has.
    pub fn compile(f: &Function) -> Result<Executable, CompileError> {
        Executable::compile_for(f, None)
    }

    /// Compiles `f` for a target spec: `host` or the host's triple, optionally followed by
    /// CPU features to turn off, as in `host,-fma,-avx2` (see `tcc run --target`).
    pub fn compile_for(f: &Function, target: Option<&str>) -> Result<Executable, CompileError> {
        tcc_ir::verify_function(f)
            .map_err(|d| CompileError(format!("the function does not verify:\n{d}")))?;
        let plan = plan(f);
        let mem = plan_memory(f, &plan);
        let isa = target::isa(target).map_err(CompileError)?;
        let builder = JITBuilder::with_isa(isa, cranelift_module::default_libcall_names());
        let mut module = JITModule::new(builder);
        let tg = jit::Target {
            fma: module
                .isa()
                .isa_flags()
                .iter()
                .any(|f| f.name == "has_fma" && f.as_bool() == Some(true)),
        };
        let mut ids = Vec::new();
        let mut libraries: HashMap<Kernel, (LibOp, Option<(KernelData, Value)>)> = HashMap::new();
        for (k, kd) in plan.kernels.iter() {
            let name = format!("{}_{k}", f.name);
            let err = |e: String| CompileError(format!("compiling kernel {k}: {e}"));
            if jit::can_compile(f, kd) {
                ids.push((k, jit::compile(&mut module, tg, f, kd, &name).map_err(err)?));
            } else if jit::can_compile_row(f, kd) {
                ids.push((
                    k,
                    jit::compile_row(&mut module, tg, f, kd, &name).map_err(err)?,
                ));
            } else if jit::can_compile_reduce(f, kd) {
                ids.push((
                    k,
                    jit::compile_reduce(&mut module, tg, f, kd, &name).map_err(err)?,
                ));
            } else if let Some(lib) = library_step(f, &plan, kd, scratch_offset(&mem, k)) {
                if let Some((epi, _)) = &lib.1 {
                    ids.push((
                        k,
                        jit::compile(&mut module, tg, f, epi, &name).map_err(err)?,
                    ));
                }
                libraries.insert(k, lib);
            }
        }
        module
            .finalize_definitions()
            .map_err(|e| CompileError(format!("linking compiled kernels: {e}")))?;
        let compiled: HashMap<Kernel, jit::KernelFn> = ids
            .into_iter()
            .map(|(k, id)| {
                let ptr = module.get_finalized_function(id);
                // SAFETY: `jit::compile` defined this function with the `KernelFn` signature.
                (k, unsafe {
                    std::mem::transmute::<*const u8, jit::KernelFn>(ptr)
                })
            })
            .collect();
        let mut steps = Vec::new();
        let mut origin = HashMap::new();
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
            steps.push(match (libraries.remove(&k), compiled.get(&k)) {
                (Some((mut op, epi)), code) => {
                    let dst = op.dst();
                    let epilogue = epi.map(|(e, product)| Loop {
                        code: *code.expect("epilogue compiled"),
                        // The epilogue reads the product where the matmul wrote it.
                        args: e
                            .inputs
                            .iter()
                            .map(|&v| if v == product { dst } else { v })
                            .chain(e.outputs.iter().copied())
                            .collect(),
                        n: f.ty(product).numel(),
                        unit: 1,
                    });
                    Step::Library { op, epilogue }
                }
                (None, Some(&code)) => {
                    let elements = f.ty(f.op(kd.ops[0]).results[0]).numel();
                    let (n, unit) = match kd.kind {
                        KernelKind::Row { .. } => {
                            let rows = jit::row_count(f, kd);
                            (rows, elements / rows.max(1))
                        }
                        KernelKind::Reduction { root } => {
                            let a = jit::reduce_count(f, kd);
                            (a, f.ty(f.op(root).args[0]).numel() / a.max(1))
                        }
                        _ => (elements, 1),
                    };
                    Step::Jit(Loop {
                        code,
                        args: kd.inputs.iter().chain(&kd.outputs).copied().collect(),
                        n,
                        unit,
                    })
                }
                (None, None) => match native_step(f, kd) {
                    Some(n) => Step::Native(n),
                    None => Step::Reference(k),
                },
            });
        }
        let n_steps = steps.len();
        let mut consts = HashMap::new();
        for &op in &plan.constants {
            let OpKind::Const { ty, value } = &f.op(op).kind else {
                unreachable!("planned as a constant")
            };
            if ty.size_bytes() > MAX_CONST_BYTES {
                return Err(CompileError(format!(
                    "constant %{} of type {ty} is larger than the 1 GiB the runtime materialises",
                    f.name(f.op(op).results[0])
                )));
            }
            let t = Tensor::from_literal(ty, value).map_err(|e| CompileError(e.to_string()))?;
            let mut buf = lines(ty.size_bytes());
            write_data(buf.as_mut_ptr() as *mut u8, &t);
            consts.insert(f.op(op).results[0], buf);
        }
        Ok(Executable {
            func: f.clone(),
            plan,
            mem,
            steps,
            origin,
            consts,
            arenas: std::sync::Mutex::new(Vec::new()),
            profile: std::env::var_os("TCC_PROFILE")
                .map(|_| std::sync::Mutex::new(vec![std::time::Duration::ZERO; n_steps])),
            _code: Code(Some(module)),
        })
    }

    /// How the kernels run, and the arena size.
    pub fn stats(&self) -> Stats {
        let count = |pred: fn(&Step) -> bool| self.steps.iter().filter(|s| pred(s)).count();
        Stats {
            compiled: count(|s| matches!(s, Step::Jit(_) | Step::Library { .. })),
            native: count(|s| matches!(s, Step::Native(_))),
            reference: count(|s| matches!(s, Step::Reference(_))),
            dead: self
                .plan
                .kernels
                .values()
                .filter(|k| k.outputs.is_empty())
                .count(),
            views: self
                .plan
                .kernels
                .values()
                .filter(|k| k.kind == KernelKind::View)
                .count(),
            arena_bytes: self.mem.arena_bytes,
            output_bytes: self.mem.output_bytes,
        }
    }

    /// The mnemonics of the ops in kernels that run on the reference kernels, in order.
    pub fn reference_ops(&self) -> Vec<&'static str> {
        self.steps
            .iter()
            .filter_map(|s| match s {
                Step::Reference(k) => Some(&self.plan.kernels[*k].ops),
                _ => None,
            })
            .flatten()
            .map(|&op| self.func.op(op).kind.mnemonic())
            .collect()
    }

    /// The compiled function.
    pub fn function(&self) -> &Function {
        &self.func
    }

    /// Runs on `inputs` (one per parameter, of its type) and returns the results.
    pub fn run(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>, RunError> {
        let f = &self.func;
        check_inputs(f, inputs).map_err(|e| RunError(e.0))?;
        let pooled = self.arenas.lock().map(|mut p| p.pop()).unwrap_or(None);
        let mut arena = pooled.unwrap_or_else(|| {
            let mut a = lines(self.mem.arena_bytes);
            advise_huge_pages(a.as_mut_ptr() as *mut u8, a.len() * 64);
            a
        });
        let base = arena.as_mut_ptr() as *mut u8;
        // Output buffers: allocated with capacity only, written by the kernels, returned.
        let mut outs: Vec<Data> = self
            .mem
            .outputs
            .iter()
            .map(|&v| Data::with_capacity(f.ty(v).dtype(), f.ty(v).numel() as usize))
            .collect();
        let out_ptrs: Vec<*mut u8> = outs.iter_mut().map(capacity_ptr).collect();
        for (&p, &v) in out_ptrs.iter().zip(&self.mem.outputs) {
            advise_huge_pages(p, f.ty(v).size_bytes() as usize);
        }
        let addr = |v: Value| -> *mut u8 {
            let v = self.origin.get(&v).copied().unwrap_or(v);
            match self.mem.storage[v] {
                Storage::Arena(off) => base.wrapping_add(off as usize),
                Storage::Output(i) => out_ptrs[i],
                Storage::Param => match f.value(v).def {
                    ValueDef::Param(i) => data_ptr(&inputs[i]) as *mut u8,
                    ValueDef::Result(..) => unreachable!("parameter storage for an op result"),
                },
                Storage::Const => self.consts[&v].as_ptr() as *mut u8,
                Storage::None => unreachable!("a value read outside its kernel is stored"),
            }
        };
        let profile = self.profile.is_some();
        for (si, step) in self.steps.iter().enumerate() {
            let t0 = profile.then(std::time::Instant::now);
            match step {
                Step::Jit(l) => run_loop(l, &addr),
                Step::Library { op, epilogue } => {
                    match op {
                        LibOp::MatMul(mm) => run_matmul(mm, &addr),
                        LibOp::Conv(cv) => run_conv(cv, &addr, base),
                    }
                    if let Some(l) = epilogue {
                        run_loop(l, &addr);
                    }
                }
                // SAFETY: the memory plan gives every value storage of its type, and only
                // elementwise results share storage with their operands.
                Step::Native(n) => unsafe { n.run(f, &addr) }.map_err(|msg| {
                    RunError(format!(
                        "in `@{}`, {}: {msg}",
                        f.name,
                        f.describe_op(n.op())
                    ))
                })?,
                Step::Reference(k) => self.run_reference(*k, &addr)?,
            }
            if let (Some(t0), Some(p)) = (t0, &self.profile)
                && let Ok(mut p) = p.lock()
            {
                p[si] += t0.elapsed();
            }
        }
        // Every step ran, so every output buffer is fully written.
        for (d, &v) in outs.iter_mut().zip(&self.mem.outputs) {
            // SAFETY: the kernels wrote all `numel` elements of the buffer, each a valid value
            // of the buffer's dtype (bools as 0 or 1).
            unsafe { set_len(d, f.ty(v).numel() as usize) };
        }
        let mut outs: Vec<Option<Data>> = outs.into_iter().map(Some).collect();
        let mut given: HashMap<usize, usize> = HashMap::new();
        let mut results: Vec<Tensor> = Vec::with_capacity(f.results().len());
        for &r in f.results() {
            let root = self.origin.get(&r).copied().unwrap_or(r);
            let t = match self.mem.storage[root] {
                Storage::Output(i) => {
                    let data = match outs[i].take() {
                        Some(d) => d,
                        None => results[given[&i]].data().clone(),
                    };
                    given.entry(i).or_insert(results.len());
                    Tensor::new(f.ty(r).clone(), data)
                        .expect("an output buffer of the result's size")
                }
                // SAFETY: parameters and constants hold values of their type.
                _ => unsafe { read_data(addr(r), f.ty(r)) },
            };
            results.push(t);
        }
        if let Ok(mut pool) = self.arenas.lock() {
            pool.push(arena);
        }
        Ok(results)
    }

    /// Runs one kernel with the reference kernels. All inputs are read before any output is
    /// written, so outputs planned in place over inputs are safe.
    fn run_reference(&self, k: Kernel, addr: &dyn Fn(Value) -> *mut u8) -> Result<(), RunError> {
        let f = &self.func;
        let kd = &self.plan.kernels[k];
        let mut vals: HashMap<Value, Tensor> = HashMap::new();
        for &v in &kd.inputs {
            let t = match crate::plan::folded_transpose(f, &self.plan, v) {
                // A transpose planned as a view for the GEMM: materialise it here.
                Some(src) => {
                    // SAFETY: the source is a stored value of its type.
                    let s = unsafe { read_data(addr(src), f.ty(src)) };
                    let op = f.def_op(v).expect("a transpose result");
                    eval_op(&f.op(op).kind, &[&s], &[f.ty(v).clone()])
                        .map_err(RunError)?
                        .remove(0)
                }
                // SAFETY: kernel inputs are stored values of their type.
                None => unsafe { read_data(addr(v), f.ty(v)) },
            };
            vals.insert(v, t);
        }
        for &op in &kd.ops {
            let d = f.op(op);
            let args: Vec<&Tensor> = d.args.iter().map(|a| &vals[a]).collect();
            let tys: Vec<TensorType> = d.results.iter().map(|&r| f.ty(r).clone()).collect();
            let outs = eval_op(&d.kind, &args, &tys).map_err(|msg| {
                RunError(format!("in `@{}`, {}: {msg}", f.name, f.describe_op(op)))
            })?;
            for (&r, t) in d.results.iter().zip(outs) {
                vals.insert(r, t);
            }
        }
        for &o in &kd.outputs {
            write_data(addr(o), &vals[&o]);
        }
        Ok(())
    }
}

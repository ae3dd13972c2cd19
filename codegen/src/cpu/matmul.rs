//! Matrix products on the CPU: the one place a GEMM is chosen (our AVX-512 or AVX2+FMA kernel
//! in `sgemm/` for f32 where the target has one of them, the `gemm` crate otherwise), batched products with
//! broadcast batch dims and folded transposes, and a GEMV for single rows.

use super::lower::Finish;
use super::post::Post;
use super::send_ptr::SendPtr;
use super::sgemm;
use crate::plan::Plan;
use tcc_ir::{DType, Function, Value};

/// A matrix product through `gemm`, batch by batch, into the storage of `dst`.
pub(super) struct MatMul {
    a: Value,
    b: Value,
    /// Whether `a` (`b`) is read through a folded transpose: the value is then its source, and
    /// the GEMM reads it with swapped strides.
    ta: bool,
    tb: bool,
    pub dst: Value,
    dtype: DType,
    m: usize,
    n: usize,
    k: usize,
    /// For each output batch, the batch index into `a` and into `b` (batch dims broadcast).
    batches: Vec<(usize, usize)>,
    /// Our kernel for f32 products, if the target has one ([`own_gemm`]).
    own: Option<sgemm::Isa>,
    /// B packed for our kernel at compile time, when it is a constant the batches share.
    packed_b: Option<sgemm::PackedB>,
    /// The epilogue applied in registers to the product's rows as they become final (f32, on
    /// a CPU with AVX2 and FMA), in place in `dst`.
    pub post: Option<Post>,
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

/// The step for `r = matmul(a, b)`, reading folded transposes through strides.
pub(super) fn matmul_step(
    f: &Function,
    plan: &Plan,
    [a, b, r]: [Value; 3],
    own: Option<sgemm::Isa>,
) -> MatMul {
    let dtype = f.ty(r).dtype();
    let (ad, bd, od) = (f.ty(a).dims(), f.ty(b).dims(), f.ty(r).dims());
    let (m, k, n) = (
        ad[ad.len() - 2] as usize,
        ad[ad.len() - 1] as usize,
        bd[bd.len() - 1] as usize,
    );
    let batch = &od[..od.len() - 2];
    let mut batches: Vec<(usize, usize)> = batch_map(&ad[..ad.len() - 2], batch)
        .into_iter()
        .zip(batch_map(&bd[..bd.len() - 2], batch))
        .collect();
    let (sa, sb) = (
        crate::plan::folded_transpose(f, plan, a),
        crate::plan::folded_transpose(f, plan, b),
    );
    // `[B..., m, k] @ [k, n]`: one GEMM of B·m rows rather than B GEMMs of m rows each reading
    // all of the right side (a sequence-first transformer's projections have m = 1).
    let mut m = m;
    if sa.is_none() && batches.iter().enumerate().all(|(i, &ab)| ab == (i, 0)) {
        m *= batches.len();
        batches = vec![(0, 0)];
    }
    let (b, tb) = (sb.unwrap_or(b), sb.is_some());
    // A constant right side of an f32 product with rows to share it (a weight matrix) is
    // packed once, here.
    let packed_b = match own {
        Some(isa) if m > 1 && batches.iter().all(|&(_, bb)| bb == 0) => {
            super::lower::f32_constant(f, b).map(|t| {
                let data = t.as_f32().expect("an f32 constant");
                let mb = if tb {
                    Mat::transposed(data.as_ptr(), k)
                } else {
                    Mat::rows(data.as_ptr(), n)
                };
                // SAFETY: the constant holds the k x n matrix B (or its transpose).
                unsafe { sgemm::PackedB::new(isa, k, n, mb) }
            })
        }
        _ => None,
    };
    MatMul {
        a: sa.unwrap_or(a),
        b,
        ta: sa.is_some(),
        tb,
        dst: r,
        dtype,
        m,
        n,
        k,
        batches,
        own,
        packed_b,
        post: None,
    }
}

impl MatMul {
    /// The constant this step packed at compile time and no longer reads, if any.
    pub(super) fn packed(&self) -> Option<Value> {
        self.packed_b.as_ref().map(|_| self.b)
    }
}

/// Our kernel for the f32 GEMMs compiled for `features` ([`sgemm::Isa::for_target`]):
/// AVX-512F's where the target has it and the CPU runs it at full width, else AVX2+FMA's (so a
/// spec such as `host,-avx512f` picks the second), else none.
pub(super) fn own_gemm(features: &super::Features) -> Option<sgemm::Isa> {
    sgemm::Isa::for_target(features)
}

/// Below this many multiply-adds a matmul runs on one thread.
const PARALLEL_FLOPS: usize = 1 << 18;

/// A strided matrix operand: element `(i, j)` is at `ptr + i * rs + j * cs`.
#[derive(Clone, Copy)]
pub(crate) struct Mat<T> {
    pub ptr: *const T,
    pub rs: usize,
    pub cs: usize,
}

impl<T> Mat<T> {
    /// The same matrix read as elements of `U` (for a `T` known to be `U`).
    pub(crate) fn cast<U>(self) -> Mat<U> {
        Mat {
            ptr: self.ptr as *const U,
            rs: self.rs,
            cs: self.cs,
        }
    }

    /// A row-major matrix with leading dimension `ld`.
    pub(crate) fn rows(ptr: *const T, ld: usize) -> Mat<T> {
        Mat { ptr, rs: ld, cs: 1 }
    }

    /// The transpose of a row-major matrix with leading dimension `ld`.
    pub(crate) fn transposed(ptr: *const T, ld: usize) -> Mat<T> {
        Mat { ptr, rs: 1, cs: ld }
    }
}

/// `C = A · B` (or `C += A · B` with `accumulate`) for a row-major `C` with leading dimension
/// `ldc` and strided `A`, `B`, through our kernel `own` for f32 (the compile target's, see
/// [`own_gemm`]) and the `gemm` crate otherwise. The one place a GEMM is chosen. `done` hears
/// of each row of C when it is final (see [`sgemm::Done`]).
///
/// # Safety
/// `a`, `b` and `c` address `m×k`, `k×n` and `m×n` matrices of `T`; `c` overlaps neither input.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn gemm<T: Copy + Default + 'static>(
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
    own: Option<sgemm::Isa>,
    done: sgemm::Done,
) {
    if let (true, Some(isa)) = (
        std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>(),
        own,
    ) {
        let threads = if parallel { super::pool::threads() } else { 1 };
        // SAFETY: T is f32 here; the caller's contract is sgemm's.
        unsafe {
            sgemm::sgemm(
                isa,
                m,
                n,
                k,
                a.cast(),
                b.cast(),
                c as *mut f32,
                ldc,
                accumulate,
                threads,
                done,
            )
        };
        return;
    }
    let par = if parallel && m * n * k >= PARALLEL_FLOPS {
        gemm::Parallelism::Rayon(super::pool::threads())
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
    if let Some(done) = done {
        for i in 0..m {
            done(i, 0..n);
        }
    }
}

/// Runs the product, telling `finish` of its output's elements as they become final (after
/// its own epilogue, if it has one).
pub(super) fn run_matmul(mm: &MatMul, addr: &dyn Fn(Value) -> *mut u8, finish: Finish) {
    #[cfg(target_arch = "x86_64")]
    if let Some(post) = &mm.post {
        let mut ptrs = Vec::new();
        let bound = post.bind(addr, &mut ptrs);
        // SAFETY: each piece of the output is transformed by the thread that wrote it, once.
        let y = unsafe { SendPtr::new(addr(mm.dst) as *mut f32) };
        let piece = |r: std::ops::Range<usize>| {
            // SAFETY: the step was built with a post only for an f32 product on a CPU with
            // AVX2 and FMA; `r` lies in the output.
            unsafe { bound.rows(y.get(), r.clone(), mm.n) };
            if let Some(finish) = finish {
                finish(r);
            }
        };
        return product(mm, addr, Some(&piece));
    }
    product(mm, addr, finish)
}

/// The product itself, telling `finish` of its output's elements as they become final.
fn product(mm: &MatMul, addr: &dyn Fn(Value) -> *mut u8, finish: Finish) {
    // A packed B is not materialised (see `MatMul::packed`): its address is never asked for.
    let b = match mm.packed_b {
        Some(_) => std::ptr::null_mut(),
        None => addr(mm.b),
    };
    let (a, dst) = (addr(mm.a), addr(mm.dst));
    // SAFETY: a, b and dst hold tensors of the dims recorded at compile time, of `dtype`.
    unsafe {
        match mm.dtype {
            DType::F32 if mm.m == 1 && !mm.ta => gemv(mm, a as _, b as _, dst as _, finish),
            DType::F32 => matmul_batches::<f32>(mm, a as _, b as _, dst as _, 1.0, finish),
            DType::F64 => matmul_batches::<f64>(mm, a as _, b as _, dst as _, 1.0, finish),
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
unsafe fn gemv(mm: &MatMul, a: *const f32, b: *const f32, dst: *mut f32, finish: Finish) {
    let (n, k) = (mm.n, mm.k);
    let threads = super::pool::threads();
    // Our GEMM's kernels need AVX2 and FMA: so do these.
    let wide = cfg!(target_arch = "x86_64") && mm.own.is_some();
    // With B not transposed, threads splitting the outputs would each read a short piece of
    // every row of B (measured 1.4-2x slower for 512-4096 outputs); they split B's rows
    // instead, each into its own partial vector, so that each streams one contiguous block,
    // and the partial vectors are added up after.
    let by_rows = !mm.tb && threads > 1 && n * k >= 1 << 16;
    // SAFETY: the jobs only read `a` and `b`, and each writes its own outputs j0..j1 of `dst`.
    let (pa, pb, pd) = unsafe { (SendPtr::new(a), SendPtr::new(b), SendPtr::new(dst)) };
    for (i, &(ab, bb)) in mm.batches.iter().enumerate() {
        if by_rows {
            let parts = threads.min(k.div_ceil(64));
            let mut partial = vec![0f32; (parts - 1) * n];
            let pp = unsafe { SendPtr::new(partial.as_mut_ptr()) };
            let job = move |t: usize| {
                let (p0, p1) = (t * k / parts, (t + 1) * k / parts);
                // SAFETY: part 0 writes the batch's output row, part t > 0 its own partial
                // row; rows p0..p1 of B lie in the batch's operand.
                unsafe {
                    let x = std::slice::from_raw_parts(pa.get().add(ab * k), k);
                    let y = match t {
                        0 => std::slice::from_raw_parts_mut(pd.get().add(i * n), n),
                        _ => std::slice::from_raw_parts_mut(pp.get().add((t - 1) * n), n),
                    };
                    y.fill(0.0);
                    rows_times(x, pb.get().add(bb * k * n), n, p0..p1, 0..n, y, wide);
                }
            };
            super::pool::for_each(parts, &job);
            // SAFETY: the batch's output row, which no job writes any more.
            let y = unsafe { std::slice::from_raw_parts_mut(dst.add(i * n), n) };
            for part in partial.chunks_exact(n) {
                for (y, p) in y.iter_mut().zip(part) {
                    *y += p;
                }
            }
            if let Some(finish) = finish {
                finish(i * n..i * n + n);
            }
            continue;
        }
        let chunk = n.div_ceil(threads).max(64);
        let job = move |j0: usize| {
            let j1 = (j0 + chunk).min(n);
            // SAFETY: the batch's operands are in bounds (the caller's contract); each job
            // writes outputs j0..j1 only.
            unsafe {
                let x = std::slice::from_raw_parts(pa.get().add(ab * k), k);
                let y = std::slice::from_raw_parts_mut(pd.get().add(i * n + j0), j1 - j0);
                let w = pb.get().add(bb * k * n);
                if mm.tb {
                    for (j, y) in (j0..j1).zip(y.iter_mut()) {
                        let row = std::slice::from_raw_parts(w.add(j * k), k);
                        *y = if wide { wide_dot(x, row) } else { dot(x, row) };
                    }
                } else {
                    y.fill(0.0);
                    rows_times(x, w, n, 0..k, j0..j1, y, wide);
                }
            }
            if let Some(finish) = finish {
                finish(i * n + j0..i * n + j1);
            }
        };
        if n * k < 1 << 16 {
            (0..n).step_by(chunk).for_each(job);
            continue;
        }
        super::pool::for_each(n.div_ceil(chunk), &|i| job(i * chunk));
    }
}

/// `y += x[p] * w[p, cols]` for the rows `p` of a `[k, n]` matrix `w` (`y` is `cols` long),
/// four rows a pass where the CPU has AVX2 and FMA (`wide`), in the order of `p` either way.
///
/// # Safety
/// `w` holds `[k, n]` floats with `rows` below `k` and `cols` below `n`.
unsafe fn rows_times(
    x: &[f32],
    w: *const f32,
    n: usize,
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    y: &mut [f32],
    wide: bool,
) {
    // SAFETY: row p's columns `cols` lie in `w` (the caller's contract).
    let row =
        |p: usize| unsafe { std::slice::from_raw_parts(w.add(p * n + cols.start), cols.len()) };
    let mut p = rows.start;
    if wide {
        while p + 4 <= rows.end {
            wide_axpy4(
                [x[p], x[p + 1], x[p + 2], x[p + 3]],
                [row(p), row(p + 1), row(p + 2), row(p + 3)],
                y,
            );
            p += 4;
        }
    }
    for (p, &xp) in x.iter().enumerate().take(rows.end).skip(p) {
        if wide {
            wide_axpy(xp, row(p), y);
        } else {
            for (y, &v) in y.iter_mut().zip(row(p)) {
                *y += xp * v;
            }
        }
    }
}

/// [`super::simd::axpy4`], on a CPU with AVX2 and FMA (the caller checked).
fn wide_axpy4(a: [f32; 4], r: [&[f32]; 4], y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: as for `wide_dot`.
    unsafe {
        super::simd::axpy4(a, r, y)
    };
    #[cfg(not(target_arch = "x86_64"))]
    for (r, a) in r.iter().zip(a) {
        for (y, &x) in y.iter_mut().zip(*r) {
            *y += a * x;
        }
    }
}

/// [`super::simd::dot`], on a CPU with AVX2 and FMA (the caller checked).
fn wide_dot(x: &[f32], y: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller checked that the target (a subset of the host) has AVX2 and FMA.
    return unsafe { super::simd::dot(x, y) };
    #[cfg(not(target_arch = "x86_64"))]
    dot(x, y)
}

/// [`super::simd::axpy`], on a CPU with AVX2 and FMA (the caller checked).
fn wide_axpy(a: f32, x: &[f32], y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: as for `wide_dot`.
    unsafe {
        super::simd::axpy(a, x, y)
    };
    #[cfg(not(target_arch = "x86_64"))]
    for (y, &x) in y.iter_mut().zip(x) {
        *y += a * x;
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
    finish: Finish,
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
        // Row r of this batch's C starts at flat element (i * m + r) * n of the output.
        let rows;
        let done: sgemm::Done = match finish {
            Some(finish) => {
                rows = move |r: usize, cols: std::ops::Range<usize>| {
                    let at = (i * m + r) * n;
                    finish(at + cols.start..at + cols.end)
                };
                Some(&rows)
            }
            None => None,
        };
        match (&mm.packed_b, mm.own) {
            // SAFETY: as above; T is f32 (B is packed only for f32 products).
            (Some(pb), Some(isa)) => unsafe {
                sgemm::product(
                    isa,
                    m,
                    n,
                    k,
                    sgemm::A::Mat(ma.cast()),
                    sgemm::B::Packed(pb),
                    pd as *mut f32,
                    n,
                    false,
                    super::pool::threads(),
                    done,
                )
            },
            // SAFETY: as above.
            _ => unsafe { gemm::<T>(m, n, k, ma, mb, pd, n, false, one, true, mm.own, done) },
        }
    }
}

//! Single-precision matrix product with an AVX-512 microkernel (BLIS-style).
//!
//! `C (+)= A · B` for `A [m, k]` and `B [k, n]` with any row and column strides (so transposed
//! operands cost nothing extra) and a row-major `C [m, n]` with a leading dimension. B is
//! packed into panels of `NR = 32` columns and A into panels of `MR = 12` rows, for blocks of
//! `KC` along k; a 12×32 microkernel keeps 24 `zmm` accumulators and reads each packed element
//! once per block. Threads take disjoint column ranges of C and pack their own panels. The
//! `gemm` crate is used instead where AVX-512F is missing (its own AVX-512 kernels need a
//! nightly compiler).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

const MR: usize = 12;
const NR: usize = 32;
const KC: usize = 256;
const MC: usize = 144;
const NC: usize = 3072;

/// Whether this CPU runs the AVX-512 kernel.
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// A raw pointer that may cross threads; the column ranges the threads write are disjoint.
#[derive(Clone, Copy)]
struct Shared(*mut f32);
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

/// A matrix operand: element `(i, j)` is at `ptr + i * rs + j * cs`.
#[derive(Clone, Copy)]
pub(crate) struct Mat {
    pub ptr: *const f32,
    pub rs: usize,
    pub cs: usize,
}

/// `C = A · B`, or `C += A · B` with `accumulate`.
///
/// # Safety
/// `available()` must be true; `a` and `b` must address `m×k` and `k×n` matrices with their
/// strides, `c` an `m×n` row-major matrix with leading dimension `ldc` that overlaps neither.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn sgemm(
    m: usize,
    n: usize,
    k: usize,
    a: Mat,
    b: Mat,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    threads: usize,
) {
    if m == 0 || n == 0 || (k == 0 && accumulate) {
        return;
    }
    if k == 0 {
        for i in 0..m {
            unsafe { std::ptr::write_bytes(c.add(i * ldc), 0, n) };
        }
        return;
    }
    // Split the columns among threads in multiples of NR, when there is enough work.
    let parts = if m * n * k >= 1 << 18 {
        threads.clamp(1, n.div_ceil(NR))
    } else {
        1
    };
    let cols = n.div_ceil(parts).div_ceil(NR) * NR;
    let (ap, bp, cp) = (
        Shared(a.ptr as *mut f32),
        Shared(b.ptr as *mut f32),
        Shared(c),
    );
    let run = move |j0: usize| {
        // Move the wrappers (not their pointer fields) into the closure, so it is Send.
        let (ap, bp, cp) = (ap, bp, cp);
        let j1 = (j0 + cols).min(n);
        let a = Mat { ptr: ap.0, ..a };
        let b = Mat {
            ptr: unsafe { bp.0.add(j0 * b.cs) },
            ..b
        };
        // SAFETY: as for `sgemm`; this call writes columns j0..j1 of C only.
        unsafe { block(m, j1 - j0, k, a, b, cp.0.add(j0), ldc, accumulate) };
    };
    if parts == 1 {
        run(0);
    } else {
        rayon::scope(|s| {
            for j0 in (0..n).step_by(cols) {
                s.spawn(move |_| run(j0));
            }
        });
    }
}

/// 16 floats on a 64-byte boundary: packed panels are built of these so that every `zmm` load
/// of a panel is aligned (an unaligned one splits a cache line).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([f32; 16]);

/// A zeroed, 64-byte-aligned buffer of at least `n` floats.
fn aligned(n: usize) -> Vec<Line> {
    vec![Line([0.0; 16]); n.div_ceil(16)]
}

/// The blocked product on one thread.
#[allow(clippy::too_many_arguments)]
unsafe fn block(
    m: usize,
    n: usize,
    k: usize,
    a: Mat,
    b: Mat,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    let kc_max = KC.min(k);
    let (nb, na) = (
        kc_max * NC.min(n.div_ceil(NR) * NR),
        kc_max * MC.min(m.div_ceil(MR) * MR),
    );
    // The packing buffers live on per thread and grow as needed: a small GEMM (one image of a
    // convolution) must not pay for allocating and zeroing them on every call.
    PANELS.with(|cell| {
        let mut bufs = cell.borrow_mut();
        let (bp_buf, ap_buf) = &mut *bufs;
        for (buf, len) in [(&mut *bp_buf, nb), (&mut *ap_buf, na)] {
            if buf.len() * 16 < len {
                *buf = aligned(len);
            }
        }
        // SAFETY: `Line` is 16 plain f32s, so the buffers are at least `len` contiguous floats.
        let bp = unsafe { std::slice::from_raw_parts_mut(bp_buf.as_mut_ptr() as *mut f32, nb) };
        let ap = unsafe { std::slice::from_raw_parts_mut(ap_buf.as_mut_ptr() as *mut f32, na) };
        // SAFETY: the caller's contract.
        unsafe { block_in(m, n, k, a, b, c, ldc, accumulate, bp, ap) }
    })
}

thread_local! {
    /// Each thread's packed panels of B and A.
    static PANELS: std::cell::RefCell<(Vec<Line>, Vec<Line>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// `block` with its packing buffers.
#[allow(clippy::too_many_arguments)]
unsafe fn block_in(
    m: usize,
    n: usize,
    k: usize,
    a: Mat,
    b: Mat,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    bp: &mut [f32],
    ap: &mut [f32],
) {
    for jc in (0..n).step_by(NC) {
        let nc = NC.min(n - jc);
        for pc in (0..k).step_by(KC) {
            let kc = KC.min(k - pc);
            // Pack B[pc.., jc..] into panels of NR columns, zero-padded.
            for (jp, j0) in (0..nc).step_by(NR).enumerate() {
                let w = NR.min(nc - j0);
                let panel = &mut bp[jp * kc * NR..(jp + 1) * kc * NR];
                if b.cs != 1 && b.rs == 1 {
                    // A transposed B: walk each column down, reading memory in order.
                    panel.fill(0.0);
                    for j in 0..w {
                        let col = unsafe { b.ptr.add(pc + (jc + j0 + j) * b.cs) };
                        for p in 0..kc {
                            panel[p * NR + j] = unsafe { *col.add(p) };
                        }
                    }
                } else {
                    for p in 0..kc {
                        let start = unsafe { b.ptr.add((pc + p) * b.rs + (jc + j0) * b.cs) };
                        let dst = &mut panel[p * NR..p * NR + w];
                        if b.cs == 1 {
                            dst.copy_from_slice(unsafe { std::slice::from_raw_parts(start, w) });
                        } else {
                            for (j, d) in dst.iter_mut().enumerate() {
                                *d = unsafe { *start.add(j * b.cs) };
                            }
                        }
                        panel[p * NR + w..(p + 1) * NR].fill(0.0);
                    }
                }
            }
            for ic in (0..m).step_by(MC) {
                let mc = MC.min(m - ic);
                // Pack A[ic.., pc..] into panels of MR rows, zero-padded.
                for (ip, i0) in (0..mc).step_by(MR).enumerate() {
                    let h = MR.min(mc - i0);
                    let panel = &mut ap[ip * kc * MR..(ip + 1) * kc * MR];
                    if a.cs == 1 {
                        // A row-major A: walk each row along k, reading memory in order.
                        if h < MR {
                            panel.fill(0.0);
                        }
                        for ii in 0..h {
                            let row = unsafe { a.ptr.add((ic + i0 + ii) * a.rs + pc) };
                            for p in 0..kc {
                                panel[p * MR + ii] = unsafe { *row.add(p) };
                            }
                        }
                    } else {
                        for p in 0..kc {
                            for ii in 0..MR {
                                panel[p * MR + ii] = if ii < h {
                                    unsafe { *a.ptr.add((ic + i0 + ii) * a.rs + (pc + p) * a.cs) }
                                } else {
                                    0.0
                                };
                            }
                        }
                    }
                }
                for (jp, j0) in (0..nc).step_by(NR).enumerate() {
                    for (ip, i0) in (0..mc).step_by(MR).enumerate() {
                        let cp = unsafe { c.add((ic + i0) * ldc + jc + j0) };
                        unsafe {
                            micro(
                                kc,
                                ap.as_ptr().add(ip * kc * MR),
                                bp.as_ptr().add(jp * kc * NR),
                                cp,
                                ldc,
                                accumulate || pc > 0,
                                MR.min(mc - i0),
                                NR.min(nc - j0),
                            )
                        };
                    }
                }
            }
        }
    }
}

/// One MR×NR tile: `C (+)= Ap · Bp` over `kc`, writing only the `h × w` valid part.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn micro(
    kc: usize,
    ap: *const f32,
    bp: *const f32,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    h: usize,
    w: usize,
) {
    let mut acc = [[_mm512_setzero_ps(); 2]; MR];
    for p in 0..kc {
        let (b0, b1) = unsafe {
            (
                _mm512_loadu_ps(bp.add(p * NR)),
                _mm512_loadu_ps(bp.add(p * NR + 16)),
            )
        };
        for (i, row) in acc.iter_mut().enumerate() {
            let av = _mm512_set1_ps(unsafe { *ap.add(p * MR + i) });
            row[0] = _mm512_fmadd_ps(av, b0, row[0]);
            row[1] = _mm512_fmadd_ps(av, b1, row[1]);
        }
    }
    if h == MR && w == NR {
        for (i, row) in acc.iter().enumerate() {
            for (half, v) in row.iter().enumerate() {
                let dst = unsafe { c.add(i * ldc + half * 16) };
                let v = if accumulate {
                    _mm512_add_ps(*v, unsafe { _mm512_loadu_ps(dst) })
                } else {
                    *v
                };
                unsafe { _mm512_storeu_ps(dst, v) };
            }
        }
        return;
    }
    let mut tile = [0.0f32; MR * NR];
    for (i, row) in acc.iter().enumerate() {
        for (half, v) in row.iter().enumerate() {
            unsafe { _mm512_storeu_ps(tile.as_mut_ptr().add(i * NR + half * 16), *v) };
        }
    }
    for i in 0..h {
        for j in 0..w {
            let dst = unsafe { c.add(i * ldc + j) };
            unsafe {
                *dst = if accumulate {
                    *dst + tile[i * NR + j]
                } else {
                    tile[i * NR + j]
                }
            };
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
#[allow(clippy::too_many_arguments)]
unsafe fn micro(
    _: usize,
    _: *const f32,
    _: *const f32,
    _: *mut f32,
    _: usize,
    _: bool,
    _: usize,
    _: usize,
) {
    unreachable!("only called when available()")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_a_plain_product() {
        if !available() {
            return;
        }
        for &(m, n, k) in &[
            (1, 1, 1),
            (12, 32, 5),
            (13, 33, 385),
            (70, 100, 30),
            (5, 3, 800),
            (130, 65, 400),
        ] {
            let a: Vec<f32> = (0..m * k)
                .map(|i| ((i * 7 % 13) as f32 - 6.0) / 8.0)
                .collect();
            let b: Vec<f32> = (0..k * n)
                .map(|i| ((i * 5 % 11) as f32 - 5.0) / 4.0)
                .collect();
            // Plain, then with A read transposed from its transpose and B likewise, then
            // accumulating onto the first product.
            let at: Vec<f32> = (0..k * m).map(|i| a[(i % m) * k + i / m]).collect();
            let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
            let plain = (
                Mat {
                    ptr: a.as_ptr(),
                    rs: k,
                    cs: 1,
                },
                Mat {
                    ptr: b.as_ptr(),
                    rs: n,
                    cs: 1,
                },
            );
            let strided = (
                Mat {
                    ptr: at.as_ptr(),
                    rs: 1,
                    cs: m,
                },
                Mat {
                    ptr: bt.as_ptr(),
                    rs: 1,
                    cs: k,
                },
            );
            let mut c = vec![f32::NAN; m * n];
            for (pass, (ma, mb), acc) in [
                (1.0, plain, false),
                (1.0, strided, false),
                (2.0, strided, true),
            ] {
                unsafe { sgemm(m, n, k, ma, mb, c.as_mut_ptr(), n, acc, 2) };
                for i in 0..m {
                    for j in 0..n {
                        let want: f64 = pass
                            * (0..k)
                                .map(|p| a[i * k + p] as f64 * b[p * n + j] as f64)
                                .sum::<f64>();
                        let got = c[i * n + j] as f64;
                        assert!(
                            (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                            "{m}x{n}x{k} at ({i},{j}), pass {pass}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}

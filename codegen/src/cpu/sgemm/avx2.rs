//! The AVX2+FMA kernel: 6×16 tiles of C in 12 `ymm` accumulators (two vectors per row), each
//! step of k one broadcast of A per row and two loads of B, leaving 3 of the 16 registers for
//! the operands; edge tiles stored with masks.

use super::{APanel, Im2col, Kernel, Segment, a_rows, im2col_rows};
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

pub(super) struct Avx2;

impl Kernel for Avx2 {
    const MR: usize = 6;
    const NR: usize = 16;
    const KC: usize = 256;
    const MC: usize = 192;
    const NC: usize = 3072;

    unsafe fn micro(
        kc: usize,
        a: APanel,
        bp: *const f32,
        fetch: *const f32,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
        h: usize,
        w: usize,
    ) {
        // SAFETY: the trait's contract.
        unsafe {
            if a.in_place() {
                micro::<false>(kc, a, bp, fetch, c, ldc, accumulate, h, w)
            } else {
                micro::<true>(kc, a, bp, fetch, c, ldc, accumulate, h, w)
            }
        }
    }

    unsafe fn pack_im2col(
        v: &Im2col,
        pc: usize,
        kc: usize,
        j0: usize,
        w: usize,
        panel: &mut [f32],
    ) {
        // SAFETY: the trait's contract.
        unsafe { pack_im2col(v, pc, kc, j0, w, panel) }
    }
}

const MR: usize = Avx2::MR;
const NR: usize = Avx2::NR;

/// The lanes of half `half` (columns `8 * half..`) of a panel row that fall in `lo..hi`, as a
/// mask vector (all ones in a lane that does).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn lanes(half: usize, lo: usize, hi: usize) -> __m256i {
    let idx = _mm256_add_epi32(
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        _mm256_set1_epi32(8 * half as i32),
    );
    let above = _mm256_cmpgt_epi32(idx, _mm256_set1_epi32(lo as i32 - 1));
    let below = _mm256_cmpgt_epi32(_mm256_set1_epi32(hi as i32), idx);
    _mm256_and_si256(above, below)
}

/// See [`Kernel::micro`].
///
/// # Safety
/// As there; the CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn micro<const PACKED: bool>(
    kc: usize,
    a: APanel,
    bp: *const f32,
    fetch: *const f32,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    h: usize,
    w: usize,
) {
    let mut acc = [[_mm256_setzero_ps(); 2]; MR];
    // Each row's element at depth 0, and the distance between depths (rows past `h` of A read
    // in place repeat the last: their sums are never stored).
    let (rows, ds) = a_rows::<MR, PACKED>(a, h);
    for i in 0..h {
        // SAFETY: a hint only; row i < h of the tile is valid.
        _mm_prefetch::<_MM_HINT_T0>(unsafe { c.add(i * ldc) } as *const i8);
    }
    // One step of depth p: two vectors of B, each row's broadcast element of A.
    let step = |acc: &mut [[__m256; 2]; MR], p: usize| {
        // SAFETY (this function): Bp and Ap hold kc panel rows of NR and MR floats (aligned: a
        // packed panel starts on a 64-byte line), and C has
        // h x w valid elements at c with leading dimension ldc (the caller's contract).
        let (b0, b1) = unsafe {
            (
                _mm256_load_ps(bp.add(p * NR)),
                _mm256_load_ps(bp.add(p * NR + 8)),
            )
        };
        for (i, row) in acc.iter_mut().enumerate() {
            // SAFETY: element i of depth p of the tile's rows of A.
            let av = _mm256_broadcast_ss(unsafe { &*rows[i].add(p * ds) });
            row[0] = _mm256_fmadd_ps(av, b0, row[0]);
            row[1] = _mm256_fmadd_ps(av, b1, row[1]);
        }
    };
    // Four steps per iteration, with the B panel fetched 8 rows ahead.
    let quads = kc / 4 * 4;
    for p in (0..quads).step_by(4) {
        // SAFETY: a hint only.
        _mm_prefetch::<_MM_HINT_T0>(bp.wrapping_add((p + 8) * NR) as *const i8);
        _mm_prefetch::<_MM_HINT_T0>(bp.wrapping_add((p + 10) * NR) as *const i8);
        if !fetch.is_null() {
            // A hint only: the four steps' lines of the panel to come.
            for q in 0..4 {
                _mm_prefetch::<_MM_HINT_T1>(fetch.wrapping_add((p + q) * NR) as *const i8);
            }
        }
        for q in 0..4 {
            step(&mut acc, p + q);
        }
    }
    for p in quads..kc {
        step(&mut acc, p);
    }
    let full = w >= NR;
    let masks = [lanes(0, 0, w), lanes(1, 0, w)];
    for (i, row) in acc.iter().enumerate().take(h) {
        for (half, (v, &m)) in row.iter().zip(&masks).enumerate() {
            // SAFETY: row i < h; in a partial tile only the masked lanes (columns < w) are
            // read and written.
            unsafe {
                let dst = c.add(i * ldc + half * 8);
                if full {
                    let v = if accumulate {
                        _mm256_add_ps(*v, _mm256_loadu_ps(dst))
                    } else {
                        *v
                    };
                    _mm256_storeu_ps(dst, v);
                } else {
                    let v = if accumulate {
                        _mm256_add_ps(*v, _mm256_maskload_ps(dst, m))
                    } else {
                        *v
                    };
                    _mm256_maskstore_ps(dst, m, v);
                }
            }
        }
    }
}

/// # Safety
/// Never called: [`super::Isa::for_target`] picks no kernel off x86-64.
#[cfg(not(target_arch = "x86_64"))]
#[allow(clippy::too_many_arguments)]
unsafe fn micro<const PACKED: bool>(
    _: usize,
    _: APanel,
    _: *const f32,
    _: *const f32,
    _: *mut f32,
    _: usize,
    _: bool,
    _: usize,
    _: usize,
) {
    unreachable!("no kernel off x86-64")
}

/// See [`Kernel::pack_im2col`]: each panel row is assembled in two registers by masked loads
/// (stride 1) or masked gathers (the lanes of a segment from its image row, zeros elsewhere)
/// and stored once.
///
/// # Safety
/// As there; the CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn pack_im2col(v: &Im2col, pc: usize, kc: usize, j0: usize, w: usize, panel: &mut [f32]) {
    let sx = v.stride[1];
    let row = |dst: &mut [f32], segments: &[Segment]| {
        let mut halves = [_mm256_setzero_ps(); 2];
        for s in segments {
            for (half, acc) in halves.iter_mut().enumerate() {
                if s.lane >= 8 * half + 8 || s.lane + s.len <= 8 * half {
                    continue;
                }
                let m = lanes(half, s.lane, s.lane + s.len);
                if sx == 1 {
                    // Lane i of the half reads base[i] (masked-off lanes read nothing, give 0).
                    let base = s.first.wrapping_sub(s.lane).wrapping_add(8 * half);
                    // SAFETY: the unmasked lanes are the segment's elements.
                    let got = unsafe { _mm256_maskload_ps(base, m) };
                    *acc = _mm256_or_ps(*acc, got);
                } else {
                    // Lane i of the half reads first[(8 * half + i - lane) * sx].
                    let idx = _mm256_mullo_epi32(
                        _mm256_add_epi32(
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                            _mm256_set1_epi32(8 * half as i32 - s.lane as i32),
                        ),
                        _mm256_set1_epi32(sx as i32),
                    );
                    // SAFETY: only unmasked lanes are gathered, each an element of the segment.
                    *acc = unsafe {
                        _mm256_mask_i32gather_ps::<4>(*acc, s.first, idx, _mm256_castsi256_ps(m))
                    };
                }
            }
        }
        // SAFETY: `dst` is one panel row of NR = 16 floats.
        unsafe {
            _mm256_storeu_ps(dst.as_mut_ptr(), halves[0]);
            _mm256_storeu_ps(dst.as_mut_ptr().add(8), halves[1]);
        }
    };
    // SAFETY: the caller's contract; w <= NR <= MAX_NR.
    unsafe { im2col_rows(v, NR, pc, kc, j0, w, panel, row) }
}

/// # Safety
/// Never called: [`super::Isa::for_target`] picks no kernel off x86-64.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn pack_im2col(_: &Im2col, _: usize, _: usize, _: usize, _: usize, _: &mut [f32]) {
    unreachable!("no kernel off x86-64")
}

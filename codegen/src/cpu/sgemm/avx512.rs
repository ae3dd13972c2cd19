//! The AVX-512F kernel: 12×32 tiles of C in 24 `zmm` accumulators (two vectors per row), each
//! step of k one broadcast of A per row and two loads of B; edge tiles stored with masks.

use super::{APanel, Im2col, Kernel, Segment, a_rows, im2col_rows};
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

pub(super) struct Avx512;

impl Kernel for Avx512 {
    const MR: usize = 12;
    const NR: usize = 32;
    const KC: usize = 256;
    const MC: usize = 144;
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

const MR: usize = Avx512::MR;
const NR: usize = Avx512::NR;

/// See [`Kernel::micro`].
///
/// # Safety
/// As there; the CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
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
    let mut acc = [[_mm512_setzero_ps(); 2]; MR];
    // Each row's element at depth 0, and the distance between depths (rows past `h` of A read
    // in place repeat the last: their sums are never stored).
    let (rows, ds) = a_rows::<MR, PACKED>(a, h);
    for i in 0..h {
        // SAFETY: row i < h of the tile is valid (prefetching is only a hint).
        _mm_prefetch::<_MM_HINT_T0>(unsafe { c.add(i * ldc) } as *const i8);
    }
    for p in 0..kc {
        // SAFETY (this function): Bp and Ap hold kc panel rows of NR and MR floats (aligned: a
        // packed panel starts on a 64-byte line), and C has
        // h x w valid elements at c with leading dimension ldc (the caller's contract).
        let (b0, b1) = unsafe {
            (
                _mm512_load_ps(bp.add(p * NR)),
                _mm512_load_ps(bp.add(p * NR + 16)),
            )
        };
        if !fetch.is_null() {
            // A hint only: the step's two lines of the panel to come.
            _mm_prefetch::<_MM_HINT_T1>(fetch.wrapping_add(p * NR) as *const i8);
            _mm_prefetch::<_MM_HINT_T1>(fetch.wrapping_add(p * NR + 16) as *const i8);
        }
        for (i, row) in acc.iter_mut().enumerate() {
            // SAFETY: element i of depth p of the tile's rows of A.
            let av = _mm512_set1_ps(unsafe { *rows[i].add(p * ds) });
            row[0] = _mm512_fmadd_ps(av, b0, row[0]);
            row[1] = _mm512_fmadd_ps(av, b1, row[1]);
        }
    }
    // Lanes of each half that are columns of the tile.
    let mask = if w >= NR { u32::MAX } else { (1u32 << w) - 1 };
    let halves = [mask as u16, (mask >> 16) as u16];
    for (i, row) in acc.iter().enumerate().take(h) {
        for (half, (v, &m)) in row.iter().zip(&halves).enumerate() {
            // SAFETY: row i < h; the masked lanes are columns < w of the tile, the rest are
            // neither read nor written.
            unsafe {
                let dst = c.add(i * ldc + half * 16);
                let v = if accumulate {
                    _mm512_add_ps(*v, _mm512_maskz_loadu_ps(m, dst))
                } else {
                    *v
                };
                _mm512_mask_storeu_ps(dst, m, v);
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
/// As there; the CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn pack_im2col(v: &Im2col, pc: usize, kc: usize, j0: usize, w: usize, panel: &mut [f32]) {
    let sx = v.stride[1];
    let row = |dst: &mut [f32], segments: &[Segment]| {
        let (mut v0, mut v1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        for s in segments {
            let mask = ((1u64 << s.len) - 1) << s.lane;
            let (m0, m1) = (mask as u16, (mask >> 16) as u16);
            if sx == 1 {
                // Lane i reads base[i].
                let base = s.first.wrapping_sub(s.lane);
                if m0 != 0 {
                    // SAFETY: masked lanes are not read; the others are the segment's elements.
                    v0 = unsafe { _mm512_mask_loadu_ps(v0, m0, base) };
                }
                if m1 != 0 {
                    // SAFETY: as above.
                    v1 = unsafe { _mm512_mask_loadu_ps(v1, m1, base.wrapping_add(16)) };
                }
            } else {
                // Lane i reads first[(i - lane) * sx].
                let lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
                let at = |half: i32| {
                    let i = _mm512_add_epi32(lane, _mm512_set1_epi32(16 * half - s.lane as i32));
                    _mm512_mullo_epi32(i, _mm512_set1_epi32(sx as i32))
                };
                if m0 != 0 {
                    // SAFETY: only unmasked lanes are gathered, each an element of the segment.
                    v0 = unsafe { _mm512_mask_i32gather_ps::<4>(v0, m0, at(0), s.first) };
                }
                if m1 != 0 {
                    // SAFETY: as above.
                    v1 = unsafe { _mm512_mask_i32gather_ps::<4>(v1, m1, at(1), s.first) };
                }
            }
        }
        // SAFETY: `dst` is one panel row of NR = 32 floats.
        unsafe {
            _mm512_storeu_ps(dst.as_mut_ptr(), v0);
            _mm512_storeu_ps(dst.as_mut_ptr().add(16), v1);
        }
    };
    // SAFETY: the caller's contract; w <= NR = MAX_NR.
    unsafe { im2col_rows(v, NR, pc, kc, j0, w, panel, row) }
}

/// # Safety
/// Never called: [`super::Isa::for_target`] picks no kernel off x86-64.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn pack_im2col(_: &Im2col, _: usize, _: usize, _: usize, _: usize, _: &mut [f32]) {
    unreachable!("no kernel off x86-64")
}

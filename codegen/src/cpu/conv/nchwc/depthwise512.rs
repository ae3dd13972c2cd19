//! The depthwise kernel on pairs of blocks with 512-bit library kernels: sixteen channels
//! (blocks `b` and `b + 1`, each half of a `zmm` register) of eight outputs of a row at a time,
//! the same products in the same order per lane as the eight-channel kernel of `depthwise.rs`
//! (so the same bits), in half the multiply-adds. Each input pixel is two 256-bit loads, one
//! from each block's plane, joined in a register; the sums go through the 512-bit tile store,
//! whose epilogues run on sixteen lanes. Only the filters with a kernel of their own
//! ([`fixed`]) and at most [`MAX_KH`] rows run here, on whole blocks.

use super::depthwise::{MAX_KH, depthwise_store, fixed, inside, mostly_inside};
use super::{B, Geom, NchwcConv, Out};
#[cfg(target_arch = "x86_64")]
use crate::cpu::simd::{high, join};
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Taps of the filters that run here, at most: [`MAX_KH`] rows of seven.
const MAX_TAPS: usize = MAX_KH * 7;

impl NchwcConv {
    /// Whether blocks `b` and `b + 1` of this depthwise step run as one pair in `zmm`
    /// registers: 512-bit library kernels, a filter with a kernel here, both blocks whole.
    pub(super) fn pair_at(&self, b: usize) -> bool {
        self.pairs && fixed(&self.g) && self.g.kh <= MAX_KH && (b + 2) * B <= self.g.c
    }

    /// The depthwise kernel over output rows `rows` of blocks `blocks`, block `b`'s output at
    /// `out(b)` and block `b + 1`'s `stride` floats after it: two blocks at once where
    /// [`NchwcConv::pair_at`] allows, the others one by one.
    ///
    /// # Safety
    /// As for [`NchwcConv::depthwise`], for every block.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn depthwise_blocks<'o>(
        &self,
        f: &[[f32; B]],
        blocks: std::ops::Range<usize>,
        ximg: &[f32],
        out: impl Fn(usize) -> Out<'o>,
        stride: usize,
        rows: std::ops::Range<usize>,
        buf: &mut Vec<f32>,
    ) {
        let mut b = blocks.start;
        while b < blocks.end {
            // SAFETY (both): the caller's contract.
            if b + 1 < blocks.end && self.pair_at(b) {
                unsafe { self.depthwise_pair(f, b, ximg, out(b), stride, rows.clone(), buf) };
                b += 2;
            } else {
                unsafe { self.depthwise(f, b, ximg, out(b), rows.clone(), buf) };
                b += 1;
            }
        }
    }

    /// [`NchwcConv::depthwise`] for blocks `b` and `b + 1` at once ([`NchwcConv::pair_at`]):
    /// block `b + 1`'s output rows are `stride` floats after block `b`'s at `out`. In place
    /// where [`NchwcConv::depthwise`] reads in place, else over a padded copy of both blocks'
    /// rows.
    ///
    /// # Safety
    /// As for [`NchwcConv::depthwise`], for both blocks; the CPU has AVX-512F.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn depthwise_pair(
        &self,
        f: &[[f32; B]],
        b: usize,
        ximg: &[f32],
        out: Out,
        stride: usize,
        rows: std::ops::Range<usize>,
        buf: &mut Vec<f32>,
    ) {
        let Geom {
            h,
            w,
            kh,
            kw,
            ow,
            sh,
            dh,
            pl,
            ..
        } = self.g;
        debug_assert!(self.pair_at(b));
        // Each tap's sixteen weights, block b's then block b + 1's.
        let taps = kh * kw;
        let mut joined = [[0f32; 2 * B]; MAX_TAPS];
        for (t, j) in joined.iter_mut().enumerate().take(taps) {
            j[..B].copy_from_slice(&f[b * taps + t]);
            j[B..].copy_from_slice(&f[(b + 1) * taps + t]);
        }
        let joined = &joined[..taps];
        // Output row oy of the pair.
        let yrow = |oy: usize| {
            let at = (oy - rows.start) * ow * B;
            Out {
                // SAFETY: the block's output row oy holds ow pixels of eight floats.
                y: unsafe { out.y.add(at) },
                at: out.at + at,
                post: out.post,
            }
        };
        if self.blocked && mostly_inside(&self.g) {
            // In place, as `depthwise_in_place`: rows outside the image read zeros.
            buf.clear();
            buf.resize(self.cols(ow).max(pl + w) * B, 0.0);
            let plane = |b: usize| &ximg[b * h * w * B..(b + 1) * h * w * B];
            for oy in rows.clone() {
                let mut src = [[buf.as_ptr(); MAX_KH]; 2];
                for ky in 0..kh {
                    if let Some(ir) = self.input_row(oy * sh + ky * dh, w) {
                        for (half, s) in src.iter_mut().enumerate() {
                            s[ky] = plane(b + half)[ir * w * B..].as_ptr().wrapping_sub(pl * B);
                        }
                    }
                }
                // SAFETY: each row pointer addresses an image row (or zeros) at padded column
                // 0, read only at columns pl..pl + w; the caller's contract.
                unsafe { pair_rows(&src, joined, &self.g, yrow(oy), stride, b, true) };
            }
            return;
        }
        // A padded copy: block b's band, then block b + 1's.
        let row = self.cols(ow) * B;
        let half = self.band_input_rows(&rows) * row;
        if buf.len() < 2 * half {
            buf.resize(2 * half, 0.0);
        }
        let mut copied = 0;
        for oy in rows.clone() {
            let need = self.band_input_rows(&(rows.start..oy + 1));
            while copied < need {
                let r = rows.start * sh + copied;
                self.copy_row(ximg, b, r, &mut buf[copied * row..][..row]);
                self.copy_row(ximg, b + 1, r, &mut buf[half + copied * row..][..row]);
                copied += 1;
            }
            let base = (oy - rows.start) * sh * row;
            let src: [[*const f32; MAX_KH]; 2] = std::array::from_fn(|blk| {
                std::array::from_fn(|ky| {
                    (buf.as_ptr()).wrapping_add(blk * half + base + ky * dh * row)
                })
            });
            // SAFETY: the buffer covers every tap of every (rounded-up) output column of
            // both blocks; the caller's contract.
            unsafe { pair_rows(&src, joined, &self.g, yrow(oy), stride, b, false) };
        }
    }
}

/// One output row of blocks `b` and `b + 1`: `src[0][ky]` and `src[1][ky]` are the input rows
/// filter row `ky` reads in each block, at padded column 0; `taps` the joined weights. With
/// `edges`, the tiles whose columns reach past the image (`pl..pl + w`) load zeros there.
///
/// # Safety
/// The CPU has AVX-512F, AVX2 and FMA; [`fixed`] holds for `g`; each row pointer plus `c * 8`
/// floats is readable for every column `c` a tile of the row reads (with `edges`, those in
/// `pl..pl + w`); `yrow` holds `ow` pixels of block `b`, block `b + 1`'s `stride` floats on.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn pair_rows(
    src: &[[*const f32; MAX_KH]; 2],
    taps: &[[f32; 2 * B]],
    g: &Geom,
    yrow: Out,
    stride: usize,
    b: usize,
    edges: bool,
) {
    // SAFETY (every arm): the caller's contract.
    unsafe {
        match (g.kw, g.sw) {
            (3, 1) => pair_row::<3, 1>(src, taps, g, yrow, stride, b, edges),
            (5, 1) => pair_row::<5, 1>(src, taps, g, yrow, stride, b, edges),
            (7, 1) => pair_row::<7, 1>(src, taps, g, yrow, stride, b, edges),
            (3, 2) => pair_row::<3, 2>(src, taps, g, yrow, stride, b, edges),
            (5, 2) => pair_row::<5, 2>(src, taps, g, yrow, stride, b, edges),
            _ => unreachable!("`fixed` admits these"),
        }
    }
}

/// [`pair_rows`] for filters `KW` wide at column stride `SW`.
///
/// # Safety
/// As for [`pair_rows`], with `g.kw == KW` and `g.sw == SW`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn pair_row<const KW: usize, const SW: usize>(
    src: &[[*const f32; MAX_KH]; 2],
    taps: &[[f32; 2 * B]],
    g: &Geom,
    yrow: Out,
    stride: usize,
    b: usize,
    edges: bool,
) {
    let Geom { kh, ow, pl, w, .. } = *g;
    let rows = (&src[0][..kh], &src[1][..kh]);
    for ox in (0..ow).step_by(B) {
        // SAFETY: the caller's contract; unchecked loads only where every column is readable.
        let acc = unsafe {
            if edges && !inside(g, ox) {
                pair_tile::<KW, SW, true>(rows, taps, ox, pl, w)
            } else {
                pair_tile::<KW, SW, false>(rows, taps, ox, pl, w)
            }
        };
        // SAFETY: pixels ox.. of the row, of both blocks.
        unsafe {
            match yrow.post.simple(b * B) {
                // A bias and a clamp at most: here, inlined, the sums still in registers.
                Some(s) => {
                    let e = s.pair(0);
                    for (j, &a) in acc.iter().enumerate().take(ow - ox) {
                        let (y, v) = (yrow.y.add((ox + j) * B), e.apply(a));
                        _mm256_storeu_ps(y, _mm512_castps512_ps256(v));
                        _mm256_storeu_ps(y.add(stride), high(v));
                    }
                }
                None => store_pair(acc, ox, ow, yrow, stride, b),
            }
        }
    }
}

/// The sums of outputs `ox..ox + 8` of [`pair_row`], the products of `in_place_tile` (and
/// `depthwise_fixed`) in their order on sixteen lanes. With `CHECKED`, columns outside `pl..pl
/// + w` read as zeros.
///
/// # Safety
/// As for [`pair_rows`]; without `CHECKED`, every column the tile reads is readable.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
unsafe fn pair_tile<const KW: usize, const SW: usize, const CHECKED: bool>(
    (lo, hi): (&[*const f32], &[*const f32]),
    taps: &[[f32; 2 * B]],
    ox: usize,
    pl: usize,
    w: usize,
) -> [__m512; B] {
    let mut acc = [_mm512_setzero_ps(); B];
    for (ky, (&l, &h)) in lo.iter().zip(hi).enumerate() {
        // SAFETY: the filter row's KW taps of sixteen floats each.
        let wv: [__m512; KW] =
            std::array::from_fn(|kx| unsafe { _mm512_loadu_ps(taps[ky * KW + kx].as_ptr()) });
        for phase in 0..SW {
            let kp = (KW - phase).div_ceil(SW);
            for i in 0..B + kp - 1 {
                let col = (ox + i) * SW + phase;
                let v = if CHECKED && !(pl..pl + w).contains(&col) {
                    _mm512_setzero_ps()
                } else {
                    // SAFETY: column `col` of both rows is readable (checked, or the
                    // caller's contract).
                    unsafe {
                        join(
                            _mm256_loadu_ps(l.wrapping_add(col * B)),
                            _mm256_loadu_ps(h.wrapping_add(col * B)),
                        )
                    }
                };
                for t in 0..kp {
                    if i >= t && i - t < B {
                        acc[i - t] = _mm512_fmadd_ps(v, wv[t * SW + phase], acc[i - t]);
                    }
                }
            }
        }
    }
    acc
}

/// Stores the sums of outputs `ox..` of a pair's row (those before `ow`): through the 512-bit
/// tile store where the epilogue has a form there, else each block's half as the
/// eight-channel kernel stores it.
///
/// # Safety
/// As for [`pair_rows`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
unsafe fn store_pair(acc: [__m512; B], ox: usize, ow: usize, yrow: Out, stride: usize, b: usize) {
    let n = B.min(ow - ox);
    // A copy that the store reads by reference (see `direct::store512`).
    let sums: [[__m512; 1]; B] = std::array::from_fn(|j| [acc[j]]);
    // SAFETY: pixels ox..ox + n of both blocks; the epilogue's operands cover the output.
    unsafe {
        let (y, at) = (yrow.y.add(ox * B), yrow.at + ox * B);
        if (yrow.post).store_tile512(&sums, n, b * B, stride, y, at) {
            return;
        }
        let mut lo: [__m256; B] = std::array::from_fn(|j| _mm512_castps512_ps256(acc[j]));
        let mut hi: [__m256; B] = std::array::from_fn(|j| high(acc[j]));
        depthwise_store(&mut lo, ox, ow, yrow, b);
        let next = Out {
            y: yrow.y.add(stride),
            at: yrow.at + stride,
            post: yrow.post,
        };
        depthwise_store(&mut hi, ox, ow, next, b + 1);
    }
}

/// Never called: `pair_at` is false off x86-64 (no library kernels there).
#[cfg(not(target_arch = "x86_64"))]
unsafe fn pair_rows(
    _: &[[*const f32; MAX_KH]; 2],
    _: &[[f32; 2 * B]],
    _: &Geom,
    _: Out,
    _: usize,
    _: usize,
    _: bool,
) {
    unreachable!("no AVX-512 off x86-64")
}

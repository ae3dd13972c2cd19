//! The depthwise kernel on blocks of eight channels: eight outputs of a row at a time over a
//! padded band copied row by row (see the module docs of [`super`]), or over the image's rows
//! in place where most tiles of a row lie inside the image.

use super::{B, Geom, NchwcConv, Out, padded_row};
#[cfg(target_arch = "x86_64")]
use crate::cpu::conv::depthwise::pixels;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

impl NchwcConv {
    /// The depthwise kernel over output rows `rows` of output block `b`, stored from `out` on
    /// (output row `rows.start` of the block), rows `ow * 8` floats apart.
    ///
    /// # Safety
    /// `out` holds the block's `rows.len()` output rows.
    pub(super) unsafe fn depthwise(
        &self,
        f: &[[f32; B]],
        b: usize,
        ximg: &[f32],
        out: Out,
        rows: std::ops::Range<usize>,
        buf: &mut Vec<f32>,
    ) {
        let Geom {
            c, kh, kw, ow, sh, ..
        } = self.g;
        let row = self.cols(ow) * B;
        let cn = B.min(c - b * B);
        let taps = &f[b * kh * kw..(b + 1) * kh * kw];
        if self.blocked && cn == B && kh <= MAX_KH && fixed(&self.g) && mostly_inside(&self.g) {
            // SAFETY: the caller's contract.
            unsafe { self.depthwise_in_place(taps, b, ximg, out, rows, buf) };
            return;
        }
        let n_rows = self.band_input_rows(&rows);
        // Every float of the band is written below, so the buffer need not be cleared.
        if buf.len() < n_rows * row {
            buf.resize(n_rows * row, 0.0);
        }
        // Rows are copied as the output rows first need them, so that each is still in L1
        // when read, and reading the input overlaps computing the rows before.
        let mut copied = 0;
        for oy in rows.clone() {
            let base = (oy - rows.start) * sh * row;
            let need = self.band_input_rows(&(rows.start..oy + 1));
            while copied < need {
                let dst = &mut buf[copied * row..(copied + 1) * row];
                self.copy_row(ximg, b, rows.start * sh + copied, dst);
                copied += 1;
            }
            let at = (oy - rows.start) * ow * B;
            // SAFETY: the output block's row oy holds ow pixels of eight floats.
            let yrow = Out {
                y: unsafe { out.y.add(at) },
                at: out.at + at,
                post: out.post,
            };
            // SAFETY: as for `direct`; the buffer covers every tap of every (rounded-up)
            // output column.
            unsafe { depthwise_row(buf, base, row, taps, &self.g, yrow, b) };
        }
    }

    /// Copies padded input row `r` of block `b` into `dst` (a row of the depthwise kernel's
    /// band, `cols(ow)` pixels): zeros outside the image and in the lanes past the last
    /// channel.
    pub(super) fn copy_row(&self, ximg: &[f32], b: usize, r: usize, dst: &mut [f32]) {
        let Geom {
            c, h, w, ow, pl, ..
        } = self.g;
        let cn = B.min(c - b * B);
        let wn = w.min(self.cols(ow).saturating_sub(pl));
        let Some(ir) = self.input_row(r, wn) else {
            dst.fill(0.0);
            return;
        };
        if self.blocked {
            padded_row(dst, Some(&ximg[((b * h + ir) * w) * B..][..wn * B]), pl * B);
            if cn < B {
                for px in dst.chunks_exact_mut(B) {
                    px[cn..].fill(0.0);
                }
            }
        } else {
            // SAFETY: the CPU has AVX2 (`new` checked the target's features).
            #[cfg(target_arch = "x86_64")]
            unsafe {
                pixels(&ximg[(b * B * h + ir) * w..], h * w, cn, wn, pl, dst)
            };
        }
    }

    /// [`NchwcConv::depthwise`] for a blocked input of whole blocks and a filter with a kernel
    /// of its own ([`fixed`]): the kernel reads the image's rows where they are, a row above
    /// or below the image is a row of zeros (`buf`), and only the tiles whose columns reach
    /// into the padding check each load. Copying the band was a fifth of the time of a
    /// 3x3 layer at 28x28, a third at 7x7 with the zeroing.
    ///
    /// # Safety
    /// As for [`NchwcConv::depthwise`].
    unsafe fn depthwise_in_place(
        &self,
        taps: &[[f32; B]],
        b: usize,
        ximg: &[f32],
        out: Out,
        rows: std::ops::Range<usize>,
        buf: &mut Vec<f32>,
    ) {
        let Geom {
            h,
            w,
            kh,
            ow,
            sh,
            dh,
            pl,
            ..
        } = self.g;
        // Zeros for the rows outside the image: every padded column a load may reach.
        let zeros = (self.cols(ow).max(pl + w)) * B;
        buf.clear();
        buf.resize(zeros, 0.0);
        let plane = &ximg[b * h * w * B..(b + 1) * h * w * B];
        for oy in rows.clone() {
            // Each filter row's input row, at padded column 0 (column -pl of the image).
            let mut src = [buf.as_ptr(); MAX_KH];
            for (ky, p) in src.iter_mut().enumerate().take(kh) {
                if let Some(ir) = self.input_row(oy * sh + ky * dh, w) {
                    *p = plane[ir * w * B..].as_ptr().wrapping_sub(pl * B);
                }
            }
            let at = (oy - rows.start) * ow * B;
            // SAFETY: the output block's row oy holds ow pixels of eight floats.
            let yrow = Out {
                y: unsafe { out.y.add(at) },
                at: out.at + at,
                post: out.post,
            };
            // SAFETY: each row pointer addresses an image row (or zeros) at padded column 0,
            // and the kernel loads only columns pl..pl + w of it.
            unsafe { depthwise_rows(&src[..kh], taps, &self.g, yrow, b) };
        }
    }
}

/// Stores the sums `acc` of outputs `ox..` of a depthwise row as [`depthwise_store`] does:
/// an epilogue of a bias and a clamp at most here, inlined into the kernel (the sums
/// stay in registers; a call took them through memory, a quarter of a 3x3 layer's time), the
/// rest through that call.
///
/// Safety: as for [`depthwise_store`]; used inside an `unsafe` block of a function with AVX2
/// and FMA.
macro_rules! store8 {
    ($acc:expr, $ox:expr, $ow:expr, $yrow:expr, $b:expr) => {{
        let (mut acc, ox, ow, yrow, b): ([__m256; B], usize, usize, Out, usize) =
            ($acc, $ox, $ow, $yrow, $b);
        match yrow.post.simple(b * B) {
            Some(s) => {
                let e = s.block(0);
                for (j, &a) in acc.iter().enumerate().take(ow - ox) {
                    _mm256_storeu_ps(yrow.y.add((ox + j) * B), e.apply(a));
                }
            }
            _ => depthwise_store(&mut acc, ox, ow, yrow, b),
        }
    }};
}

/// Filter rows the in-place depthwise kernel takes (its row pointers live on the stack).
pub(super) const MAX_KH: usize = 8;

/// Whether the tile of outputs `ox..ox + 8` of a row reads only columns inside the image.
pub(super) fn inside(g: &Geom, ox: usize) -> bool {
    ox * g.sw >= g.pl && (ox + B - 1) * g.sw + g.kw - 1 < g.pl + g.w
}

/// Whether at least half of a row's tiles read only columns inside the image, so that reading
/// in place pays: its checked tiles (at the edges) run slower than tiles on a padded copy, and
/// rows of 7 and 14 outputs have no other kind (measured 10% slower at 14x14, 5-17% faster at
/// 28x28 and 56x56, on one and two threads).
pub(super) fn mostly_inside(g: &Geom) -> bool {
    let tiles = g.ow.div_ceil(B);
    2 * (0..tiles).filter(|&t| inside(g, t * B)).count() >= tiles
}

/// Whether the depthwise filter of `g` has a kernel of its own: 3x3 and 5x5 at column strides
/// 1 and 2 and 7x7 at stride 1, undilated along the row (any filter height).
pub(super) fn fixed(g: &Geom) -> bool {
    matches!((g.kw, g.sw, g.dw), (3 | 5 | 7, 1, 1) | (3 | 5, 2, 1))
}

/// One output row of block `b` of a depthwise convolution read in place: `src[ky]` is the
/// input row filter row `ky` reads, at padded column 0. Tiles of eight outputs whose columns
/// all lie in the image load unchecked; the others load zeros for columns in the padding.
///
/// # Safety
/// The CPU has AVX2 and FMA; [`fixed`] holds for `g`; each `src[ky]` plus `c * 8` floats is
/// readable for every padded column `c` in `pl..pl + w`; `yrow` holds `ow` pixels.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn depthwise_rows(src: &[*const f32], taps: &[[f32; B]], g: &Geom, yrow: Out, b: usize) {
    // SAFETY (every arm): the caller's contract.
    unsafe {
        match (g.kw, g.sw) {
            (3, 1) => in_place::<3, 1>(src, taps, g, yrow, b),
            (5, 1) => in_place::<5, 1>(src, taps, g, yrow, b),
            (7, 1) => in_place::<7, 1>(src, taps, g, yrow, b),
            (3, 2) => in_place::<3, 2>(src, taps, g, yrow, b),
            (5, 2) => in_place::<5, 2>(src, taps, g, yrow, b),
            _ => unreachable!("`fixed` admits these"),
        }
    }
}

/// [`depthwise_rows`] for filters `KW` wide at column stride `SW`.
///
/// # Safety
/// As for [`depthwise_rows`], with `g.kw == KW` and `g.sw == SW`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn in_place<const KW: usize, const SW: usize>(
    src: &[*const f32],
    taps: &[[f32; B]],
    g: &Geom,
    yrow: Out,
    b: usize,
) {
    let Geom { ow, pl, w, .. } = *g;
    for ox in (0..ow).step_by(B) {
        // SAFETY: the caller's contract; unchecked loads only where every column is inside.
        let acc = unsafe {
            if inside(g, ox) {
                in_place_tile::<KW, SW, false>(src, taps, ox, pl, w)
            } else {
                in_place_tile::<KW, SW, true>(src, taps, ox, pl, w)
            }
        };
        // SAFETY: pixels ox.. of the row.
        unsafe { store8!(acc, ox, ow, yrow, b) };
    }
}

/// The sums of outputs `ox..ox + 8` of [`in_place`], as [`depthwise_fixed`] computes them
/// (the same products in the same order, a zero for every padded column: the same bits).
/// With `CHECKED`, columns outside `pl..pl + w` read as zeros.
///
/// # Safety
/// As for [`depthwise_rows`]; without `CHECKED`, every column the tile reads is inside.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn in_place_tile<const KW: usize, const SW: usize, const CHECKED: bool>(
    src: &[*const f32],
    taps: &[[f32; B]],
    ox: usize,
    pl: usize,
    w: usize,
) -> [__m256; B] {
    let mut acc = [_mm256_setzero_ps(); B];
    for (ky, &row) in src.iter().enumerate() {
        // SAFETY: the filter row's KW taps of eight floats each.
        let wv: [__m256; KW] =
            std::array::from_fn(|kx| unsafe { _mm256_loadu_ps(taps[ky * KW + kx].as_ptr()) });
        for phase in 0..SW {
            let kp = (KW - phase).div_ceil(SW);
            for i in 0..B + kp - 1 {
                let col = (ox + i) * SW + phase;
                let v = if CHECKED && !(pl..pl + w).contains(&col) {
                    _mm256_setzero_ps()
                } else {
                    // SAFETY: column `col` is inside (checked, or the caller's contract).
                    unsafe { _mm256_loadu_ps(row.wrapping_add(col * B)) }
                };
                for t in 0..kp {
                    if i >= t && i - t < B {
                        acc[i - t] = _mm256_fmadd_ps(v, wv[t * SW + phase], acc[i - t]);
                    }
                }
            }
        }
    }
    acc
}

/// One output row of block `b` of a depthwise convolution: `ow` pixels at `yrow`, eight at a
/// time, each the sum over taps of the padded buffer's pixel times the tap's weights, through
/// the epilogue. The row's taps start at `base` in `buf`, rows `row` floats apart.
///
/// 3x3 and 5x5 filters at column strides 1 and 2, undilated (the depthwise layers of MobileNet
/// and EfficientNet), and 7x7 at stride 1 (ConvNeXt's) have a kernel of their own that loads
/// each input pixel of a filter row once and multiplies it into every output it feeds: a 3x3
/// row of eight outputs takes 30 loads instead of 72 at stride 1 (1.3-1.5x faster on those
/// networks' layers), 51 at stride 2 (up to 1.1x; strided layers are bound by reading their
/// input); 7x7, 98 instead of 392 (1.07x: its seven weight vectors and eight sums fill the
/// registers).
///
/// # Safety
/// The CPU has AVX2 and FMA; `buf` covers every tap of `ow` rounded up to eight outputs;
/// `yrow` holds `ow` pixels.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn depthwise_row(
    buf: &[f32],
    base: usize,
    row: usize,
    taps: &[[f32; B]],
    g: &Geom,
    yrow: Out,
    b: usize,
) {
    // SAFETY (every arm): the caller's contract.
    unsafe {
        match (g.kw, g.sw, g.dw) {
            (3, 1, 1) => depthwise_fixed::<3, 1>(buf, base, row, taps, g, yrow, b),
            (5, 1, 1) => depthwise_fixed::<5, 1>(buf, base, row, taps, g, yrow, b),
            (7, 1, 1) => depthwise_fixed::<7, 1>(buf, base, row, taps, g, yrow, b),
            (3, 2, 1) => depthwise_fixed::<3, 2>(buf, base, row, taps, g, yrow, b),
            (5, 2, 1) => depthwise_fixed::<5, 2>(buf, base, row, taps, g, yrow, b),
            _ => depthwise_any(buf, base, row, taps, g, yrow, b),
        }
    }
}

/// [`depthwise_row`] for filters `KW` wide at column stride `SW`, undilated. The taps go in
/// `SW` phases (the taps `kx` with `kx % SW == phase` read input columns `j * SW + phase + t *
/// SW` for output `j`); within a phase each input pixel eight outputs read is loaded once and
/// multiplied into every output it feeds.
///
/// # Safety
/// As for [`depthwise_row`], with `g.kw == KW`, `g.sw == SW` and `g.dw == 1`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn depthwise_fixed<const KW: usize, const SW: usize>(
    buf: &[f32],
    base: usize,
    row: usize,
    taps: &[[f32; B]],
    g: &Geom,
    yrow: Out,
    b: usize,
) {
    debug_assert!(g.kw == KW && g.sw == SW && g.dw == 1);
    let Geom { kh, ow, dh, .. } = *g;
    for ox in (0..ow).step_by(B) {
        let mut acc = [_mm256_setzero_ps(); B];
        for ky in 0..kh {
            // SAFETY: the filter row's KW taps of eight floats each.
            let wv: [__m256; KW] =
                std::array::from_fn(|kx| unsafe { _mm256_loadu_ps(taps[ky * KW + kx].as_ptr()) });
            let at = base + ky * dh * row + ox * SW * B;
            for phase in 0..SW {
                // Taps phase, phase + SW, ...: input column (i * SW + phase) feeds output i - t
                // through tap t * SW + phase.
                let kp = (KW - phase).div_ceil(SW);
                for i in 0..B + kp - 1 {
                    // SAFETY: input pixel (ox + i) * SW + phase of the buffer's row, at most
                    // (ox + 7) * SW + KW - 1 (the caller's contract).
                    let v = unsafe { _mm256_loadu_ps(buf.as_ptr().add(at + (i * SW + phase) * B)) };
                    for t in 0..kp {
                        if i >= t && i - t < B {
                            acc[i - t] = _mm256_fmadd_ps(v, wv[t * SW + phase], acc[i - t]);
                        }
                    }
                }
            }
        }
        // SAFETY: pixels ox.. of the row.
        unsafe { store8!(acc, ox, ow, yrow, b) };
    }
}

/// [`depthwise_row`] for any filter, stride and dilation: one load per tap and output.
///
/// # Safety
/// As for [`depthwise_row`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn depthwise_any(
    buf: &[f32],
    base: usize,
    row: usize,
    taps: &[[f32; B]],
    g: &Geom,
    yrow: Out,
    b: usize,
) {
    let Geom {
        kh,
        kw,
        ow,
        sw,
        dh,
        dw,
        ..
    } = *g;
    for ox in (0..ow).step_by(B) {
        let mut acc = [_mm256_setzero_ps(); B];
        for ky in 0..kh {
            for kx in 0..kw {
                // SAFETY: one filter tap of eight floats.
                let wv = unsafe { _mm256_loadu_ps(taps[ky * kw + kx].as_ptr()) };
                let at = base + ky * dh * row + (ox * sw + kx * dw) * B;
                for (j, a) in acc.iter_mut().enumerate() {
                    // SAFETY: pixel (ox + j) * sw + kx * dw of the buffer's row (the caller's
                    // contract).
                    let v = unsafe { _mm256_loadu_ps(buf.as_ptr().add(at + j * sw * B)) };
                    *a = _mm256_fmadd_ps(v, wv, *a);
                }
            }
        }
        // SAFETY: pixels ox.. of the row.
        unsafe { store8!(acc, ox, ow, yrow, b) };
    }
}

/// Stores the sums of outputs `ox..` of a depthwise row (those before `ow`) through the
/// epilogue.
///
/// # Safety
/// The CPU has AVX2 and FMA; `yrow` holds `ow` pixels.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline(never)]
pub(super) unsafe fn depthwise_store(
    acc: &mut [__m256; B],
    ox: usize,
    ow: usize,
    yrow: Out,
    b: usize,
) {
    let n = B.min(ow - ox);
    // SAFETY (both): pixels ox..ox + n of the row; the epilogue's operands cover the output.
    if yrow.post.tile_form() {
        // Eight pixels of one block: the tile store loads the per-channel operand once.
        let tile: [[__m256; 1]; B] = std::array::from_fn(|j| [acc[j]]);
        unsafe {
            let y = yrow.y.add(ox * B);
            (yrow.post).store_tile::<1, B>(&tile, n, b * B, 0, y, yrow.at + ox * B)
        }
    } else {
        unsafe { (yrow.post).store(&mut acc[..n], |_| b * B, |j| (ox + j) * B, yrow.y, yrow.at) }
    }
}

/// Never called: `NchwcConv::new` declines off x86-64.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn depthwise_rows(_: &[*const f32], _: &[[f32; B]], _: &Geom, _: Out, _: usize) {
    unreachable!("no AVX2 off x86-64")
}

/// Never called: `NchwcConv::new` declines off x86-64.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn depthwise_row(_: &[f32], _: usize, _: usize, _: &[[f32; B]], _: &Geom, _: Out, _: usize) {
    unreachable!("no AVX2 off x86-64")
}

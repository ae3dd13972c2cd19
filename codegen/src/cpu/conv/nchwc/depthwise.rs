//! The depthwise kernel on blocks of eight channels: eight outputs of a row at a time over a
//! padded band copied row by row (see the module docs of [`super`]).

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
            c,
            h,
            w,
            kh,
            kw,
            ow,
            sh,
            pl,
            ..
        } = self.g;
        let cols = self.cols(ow);
        let row = cols * B;
        let n_rows = self.band_input_rows(&rows);
        // Every float of the band is written below, so the buffer need not be cleared.
        if buf.len() < n_rows * row {
            buf.resize(n_rows * row, 0.0);
        }
        let wn = w.min(cols.saturating_sub(pl));
        let cn = B.min(c - b * B);
        // Copies row r of the band (zero outside the image).
        let copy = |r: usize, buf: &mut [f32]| {
            let dst = &mut buf[r * row..(r + 1) * row];
            let Some(ir) = self.input_row(rows.start * sh + r, wn) else {
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
        };
        let taps = &f[b * kh * kw..(b + 1) * kh * kw];
        // Rows are copied as the output rows first need them, so that each is still in L1
        // when read, and reading the input overlaps computing the rows before.
        let mut copied = 0;
        for oy in rows.clone() {
            let base = (oy - rows.start) * sh * row;
            let need = self.band_input_rows(&(rows.start..oy + 1));
            while copied < need {
                copy(copied, buf);
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
        unsafe { depthwise_store(&mut acc, ox, ow, yrow, b) };
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
        unsafe { depthwise_store(&mut acc, ox, ow, yrow, b) };
    }
}

/// Stores the sums of outputs `ox..` of a depthwise row (those before `ow`) through the
/// epilogue.
///
/// # Safety
/// The CPU has AVX2 and FMA; `yrow` holds `ow` pixels.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn depthwise_store(acc: &mut [__m256; B], ox: usize, ow: usize, yrow: Out, b: usize) {
    let n = B.min(ow - ox);
    // SAFETY: pixels ox..ox + n of the row; the epilogue's operands cover the output.
    unsafe { (yrow.post).store(&mut acc[..n], |_| b * B, |j| (ox + j) * B, yrow.y, yrow.at) };
}

/// Never called: `NchwcConv::new` declines off x86-64.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn depthwise_row(_: &[f32], _: usize, _: usize, _: &[[f32; B]], _: &Geom, _: Out, _: usize) {
    unreachable!("no AVX2 off x86-64")
}

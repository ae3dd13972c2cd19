//! Depthwise convolutions (one filter per channel, `groups == C == O`), computed directly: a
//! GEMM per channel would multiply a 1 x kH*kW filter by its columns, all overhead. Each output
//! piece is reported to `finish` as soon as it is written.
//!
//! Two kernels:
//!
//! - f32 with AVX2 and FMA ([`block_avx2`]): blocks of eight channels, split among threads.
//!   A block's input is transposed, a strip of rows at a time, into a zero-padded buffer of
//!   pixels, each pixel the block's eight channels in one vector. Every tap of every output is
//!   then one aligned-to-the-pixel vector load and multiply-add, whatever the strides, the
//!   dilations or the plane's size (7x7 planes and stride 2 need no special case); eight
//!   outputs of a row accumulate in registers over all taps and are transposed back into the
//!   eight output planes. It is the NCHW8c direct convolution, run on an NCHW tensor by
//!   transposing in cache.
//! - any other case ([`plane`]): per channel, per output row and tap, one multiply-add run over
//!   the span of the row inside the image.

use super::{Conv, Finish, SendPtr, Taps, phase_spans, phase_split};
#[cfg(target_arch = "x86_64")]
use crate::cpu::simd::{first, transpose};
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Runs a depthwise convolution: `x`, `w`, `y` are its input, filter and output.
///
/// # Safety
/// `x`, `w` and `y` hold tensors of the dims `cv` records.
pub(super) unsafe fn depthwise<T>(cv: &Conv, x: *mut T, w: *mut T, y: *mut T, finish: Finish)
where
    T: Copy + Default + Send + Sync + std::ops::AddAssign + std::ops::Mul<Output = T> + 'static,
{
    let [nb, c, h, wd] = cv.xd;
    let [_, _, kh, kw] = cv.wd;
    let [_, _, oh, ow] = cv.yd;
    let taps = Taps::new(cv);
    let s = taps.s[1] as usize;
    let g = Geometry {
        spans: phase_spans(kw, taps.d[1], taps.p[1], s, (h, wd, ow)),
        taps,
        kh,
        kw,
        oh,
        ow,
    };
    let f32_fma = std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>() && cv.fma;
    // SAFETY: x and w are only read; each call writes only its own output planes.
    let (px, pw, py) = unsafe { (SendPtr::new(x), SendPtr::new(w), SendPtr::new(y)) };
    if f32_fma {
        let blocks = c.div_ceil(LANES);
        let taps = kh * kw;
        // The filter regrouped once per call: for each block and tap, the block's channels
        // (zero past the last channel).
        // SAFETY: w holds c filters of kh * kw f32 (T is f32).
        let filt = unsafe { std::slice::from_raw_parts(w as *const f32, c * taps) };
        let mut grouped = vec![[0f32; LANES]; blocks * taps];
        for (ch, f) in filt.chunks_exact(taps).enumerate() {
            for (k, &v) in f.iter().enumerate() {
                grouped[(ch / LANES) * taps + k][ch % LANES] = v;
            }
        }
        let one = |i: usize| {
            let c0 = i % blocks * LANES;
            let cn = LANES.min(c - c0);
            // The block's first channel, counting over images.
            let ch = i / blocks * c + c0;
            let f = &grouped[i % blocks * taps..(i % blocks + 1) * taps];
            // SAFETY: channels ch..ch+cn of image i / blocks are in bounds of x and y; each
            // call writes only its own output planes. T is f32.
            unsafe {
                let x = std::slice::from_raw_parts(
                    px.get().add(ch * h * wd) as *const f32,
                    cn * h * wd,
                );
                let y = std::slice::from_raw_parts_mut(
                    py.get().add(ch * oh * ow) as *mut f32,
                    cn * oh * ow,
                );
                BUFFER.with(|buf| block_avx2(&g, cn, x, f, y, &mut buf.borrow_mut()));
            }
            if let Some(finish) = finish {
                finish(ch * oh * ow..(ch + cn) * oh * ow);
            }
        };
        crate::cpu::pool::for_each(nb * blocks, &one);
        return;
    }
    let one = |ch: usize| {
        // SAFETY: channel `ch` of image `ch / c` is in bounds of x and y, its filter of w; each
        // call writes only its own output plane.
        unsafe {
            let xin = std::slice::from_raw_parts(px.get().add(ch * h * wd), h * wd);
            let out = std::slice::from_raw_parts_mut(py.get().add(ch * oh * ow), oh * ow);
            let f = std::slice::from_raw_parts(pw.get().add((ch % c) * kh * kw), kh * kw);
            plane::<T>(&g, xin, f, out);
        }
        if let Some(finish) = finish {
            finish(ch * oh * ow..(ch + 1) * oh * ow);
        }
    };
    // Four planes at a time: a plane of a small image is little work.
    let n = nb * c;
    crate::cpu::pool::for_each(n.div_ceil(4), &|i| {
        (4 * i..(4 * i + 4).min(n)).for_each(one)
    });
}

/// What every channel of a depthwise convolution shares: the taps, the filter and output sizes,
/// and each filter column's span ([`phase_spans`]).
struct Geometry {
    taps: Taps,
    kh: usize,
    kw: usize,
    oh: usize,
    ow: usize,
    spans: Vec<(usize, usize, usize)>,
}

thread_local! {
    /// Each thread's padded, transposed input strip for [`block_avx2`].
    static BUFFER: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Channels per block, and outputs per row computed together: one vector of f32.
const LANES: usize = 8;

/// At most this many bytes of a block's padded input are transposed at a time (whole planes
/// when they fit): the strip stays in L2 while its outputs are computed.
const STRIP_BYTES: usize = 96 << 10;

/// A block of `cn <= 8` channels of a depthwise convolution in f32 with AVX2 and FMA: `x` their
/// input planes, `f` their filters (per tap, the block's channels), `y` their output planes, `buf` working space.
///
/// The buffer holds a strip of padded input rows, row `r` being padded row `r0 + r` (input row
/// `r0 + r - pad_top`), each row `cols` pixels of eight floats (the channels; zero past `cn`),
/// pixel `c` being input column `c - pad_left`, zero outside the image. `cols` covers every tap
/// of every output column rounded up to whole vectors, so the loads of a partial last vector of
/// outputs stay inside the buffer (those lanes are never stored).
///
/// # Safety
/// The CPU has AVX2 and FMA (`Conv::fma`: the target has them, and a target only turns off
/// features the host has).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn block_avx2(
    g: &Geometry,
    cn: usize,
    x: &[f32],
    f: &[[f32; LANES]],
    y: &mut [f32],
    buf: &mut Vec<f32>,
) {
    let t = &g.taps;
    let (h, w) = (t.h as usize, t.w as usize);
    let [sy, sx] = t.s.map(|v| v as usize);
    let [dy, dx] = t.d.map(|v| v as usize);
    let [pt, pl] = t.p.map(|v| v as usize);
    let (kh, kw, oh, ow) = (g.kh, g.kw, g.oh, g.ow);
    debug_assert!(cn <= LANES && x.len() == cn * h * w && y.len() == cn * oh * ow);
    let cols = (ow.next_multiple_of(LANES) - 1) * sx + (kw - 1) * dx + 1;
    let row = cols * LANES;
    // Padded rows one output row reads, and output rows per strip.
    let span = (kh - 1) * dy + 1;
    let fit = (STRIP_BYTES / 4 / row).max(span);
    let strip = ((fit - span) / sy + 1).min(oh);
    // Every row the strip uses is written before it is read: no need to clear.
    let need = ((strip - 1) * sy + span) * row;
    if buf.len() < need {
        buf.resize(need, 0.0);
    }
    let buf = &mut buf[..need];
    // Input columns that land in the buffer, at pixel `pl` on.
    let wn = w.min(cols.saturating_sub(pl));
    for y0 in (0..oh).step_by(strip) {
        let y1 = (y0 + strip).min(oh);
        for (r, dst) in buf
            .chunks_exact_mut(row)
            .take((y1 - 1 - y0) * sy + span)
            .enumerate()
        {
            // Padded rows above the image wrap around to large numbers: also outside.
            match (y0 * sy + r).wrapping_sub(pt) {
                ir if ir < h => pixels(&x[ir * w..], h * w, cn, wn, pl, dst),
                _ => dst.fill(0.0),
            }
        }
        for oy in y0..y1 {
            let base = (oy - y0) * sy * row;
            for ox in (0..ow).step_by(LANES) {
                let mut acc = [_mm256_setzero_ps(); LANES];
                for ky in 0..kh {
                    for kx in 0..kw {
                        // SAFETY: one filter tap of LANES floats.
                        let wv = unsafe { _mm256_loadu_ps(f[ky * kw + kx].as_ptr()) };
                        let at = base + ky * dy * row + (ox * sx + kx * dx) * LANES;
                        for (j, a) in acc.iter_mut().enumerate() {
                            // SAFETY: pixel ox * sx + kx * dx + j * sx < cols of a buffer row
                            // (ox + j < ow rounded up to LANES), row oy - y0 + ky * dy < rows.
                            let v =
                                unsafe { _mm256_loadu_ps(buf.as_ptr().add(at + j * sx * LANES)) };
                            *a = _mm256_fmadd_ps(v, wv, *a);
                        }
                    }
                }
                // Lane c of acc[j] is channel c of output ox + j: transposed, acc[c] holds
                // outputs ox..ox+8 of channel c.
                transpose(&mut acc);
                let n = LANES.min(ow - ox);
                for (c, a) in acc.iter().enumerate().take(cn) {
                    let at = c * oh * ow + oy * ow + ox;
                    let dst = &mut y[at..at + n];
                    // SAFETY: `dst` holds n floats, all the mask covers.
                    unsafe {
                        if n == LANES {
                            _mm256_storeu_ps(dst.as_mut_ptr(), *a)
                        } else {
                            _mm256_maskstore_ps(dst.as_mut_ptr(), first(n), *a)
                        }
                    };
                }
            }
        }
    }
}

/// One padded row of a block's input as pixels: `x` starts at the row in the block's first
/// channel, whose planes are `plane` apart; input columns `0..wn` go to pixels `pl..pl + wn` of
/// `dst`, eight floats each, and every other pixel and lane past `cn` is zero.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(super) fn pixels(x: &[f32], plane: usize, cn: usize, wn: usize, pl: usize, dst: &mut [f32]) {
    let cols = dst.len() / LANES;
    dst[..pl.min(cols) * LANES].fill(0.0);
    dst[(pl + wn).min(cols) * LANES..].fill(0.0);
    for ic in (0..wn).step_by(LANES) {
        let n = LANES.min(wn - ic);
        let mut v = [_mm256_setzero_ps(); LANES];
        for (c, v) in v.iter_mut().enumerate().take(cn) {
            let src = &x[c * plane + ic..c * plane + ic + n];
            // SAFETY: the mask covers the n floats of `src`.
            *v = unsafe { _mm256_maskload_ps(src.as_ptr(), first(n)) };
        }
        transpose(&mut v);
        let out = &mut dst[(pl + ic) * LANES..(pl + ic + n) * LANES];
        for (j, v) in v.iter().enumerate().take(n) {
            // SAFETY: `out` holds n pixels of LANES floats.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(j * LANES), *v) };
        }
    }
}

/// Never called: `Conv::fma` is false off x86-64.
#[cfg(not(target_arch = "x86_64"))]
fn block_avx2(_: &Geometry, _: usize, _: &[f32], _: &[[f32; 8]], _: &mut [f32], _: &mut Vec<f32>) {
    unreachable!("no AVX2 off x86-64")
}

/// One channel of a depthwise convolution: `x` the input plane, `f` the channel's filter. For
/// each output row and filter tap, the in-image span of the row is one multiply-add run over
/// contiguous input. With a column stride `s > 1` the input rows are first split by column
/// phase (`x[.., q::s]` for each `q < s`), so the runs stay contiguous and vectorise.
fn plane<T>(g: &Geometry, x: &[T], f: &[T], out: &mut [T])
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
                    let wv = f[ky * kw + kx];
                    for (o, &v) in row[lo..hi].iter_mut().zip(&src[b..b + hi - lo]) {
                        *o += wv * v;
                    }
                }
            }
        }
    }
}

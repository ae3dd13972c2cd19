//! Depthwise convolutions (one filter per channel, `groups == C == O`), computed directly: a
//! GEMM per channel would multiply a 1 x kH*kW filter by its columns, all overhead. Channels are
//! split among threads, and each output plane is reported to `finish` as soon as it is written.
//!
//! Two kernels for a plane:
//!
//! - f32 with AVX2 and FMA ([`plane_avx2`]): the input plane is first copied into a zero-padded
//!   buffer with its columns split by phase of the column stride, so that every tap of every
//!   output is an unconditional, contiguous vector load; each output row is then computed in
//!   registers, four vectors of eight outputs at a time, all taps accumulated before a single
//!   store (no bounds checks in the loop, no passes over the output per tap).
//! - any other case ([`plane`]): per output row and tap, one multiply-add run over the span of
//!   the row inside the image.

use super::{Conv, Finish, SendPtr, Taps, phase_spans, phase_split};
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
    // SAFETY: x and w are only read; each channel's call writes only its own output plane.
    let (px, pw, py) = unsafe { (SendPtr::new(x), SendPtr::new(w), SendPtr::new(y)) };
    let one = |ch: usize| {
        // SAFETY: channel `ch` of image `ch / c` is in bounds of x and y, its filter of w; each
        // call writes only its own output plane.
        unsafe {
            let xin = std::slice::from_raw_parts(px.get().add(ch * h * wd), h * wd);
            let out = std::slice::from_raw_parts_mut(py.get().add(ch * oh * ow), oh * ow);
            let f = std::slice::from_raw_parts(pw.get().add((ch % c) * kh * kw), kh * kw);
            if f32_fma {
                let cast = |s: &[T]| std::slice::from_raw_parts(s.as_ptr() as *const f32, s.len());
                let out = std::slice::from_raw_parts_mut(out.as_mut_ptr() as *mut f32, out.len());
                PADDED.with(|buf| plane_avx2(&g, cast(xin), cast(f), out, &mut buf.borrow_mut()));
            } else {
                plane::<T>(&g, xin, f, out);
            }
        }
        if let Some(finish) = finish {
            finish(ch * oh * ow..(ch + 1) * oh * ow);
        }
    };
    use rayon::prelude::*;
    (0..nb * c).into_par_iter().with_min_len(4).for_each(one);
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
    /// Each thread's padded input plane for [`plane_avx2`].
    static PADDED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Outputs per vector.
const LANES: usize = 8;

/// Vectors of outputs accumulated together along a row (registers: this many accumulators, one
/// broadcast filter tap, one input vector).
const GROUP: usize = 4;

/// One channel of a depthwise convolution in f32 with AVX2 and FMA: `x` the input plane, `f` the
/// channel's filter, `buf` working space.
///
/// The padded plane covers every row and column some tap of some output reads, padding as
/// zeros: row `r` is input row `r - pad_top`, column `c` input column `c - pad_left`. Its
/// columns are split by phase of the column stride `s` (phase `c % s` holds `c / s` at
/// position `c / s`), so tap `kx` of outputs `ox..ox+8` reads positions `ox + kx·d / s ..` of
/// phase `kx·d % s`: contiguous. Each phase row is padded past the last output to a whole
/// vector, so the loads of a partial last vector stay inside the buffer (the extra lanes are
/// never stored).
///
/// # Safety
/// The CPU has AVX2 and FMA (`Conv::fma`: the target has them, and a target only turns off
/// features the host has).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn plane_avx2(g: &Geometry, x: &[f32], f: &[f32], out: &mut [f32], buf: &mut Vec<f32>) {
    let t = &g.taps;
    let (h, w) = (t.h as usize, t.w as usize);
    let [sy, s] = t.s.map(|v| v as usize);
    let [dy, dx] = t.d.map(|v| v as usize);
    let [pt, pl] = t.p.map(|v| v as usize);
    let (kh, kw, oh, ow) = (g.kh, g.kw, g.oh, g.ow);
    // Padded rows and, per phase, positions read.
    let rows = (oh - 1) * sy + (kh - 1) * dy + 1;
    let pw = ow.next_multiple_of(LANES) + (kw - 1) * dx / s;
    buf.clear();
    buf.resize(s * rows * pw, 0.0);
    for r in pt.min(rows)..(pt + h).min(rows) {
        let src = &x[(r - pt) * w..(r - pt + 1) * w];
        for q in 0..s {
            // The input columns of phase q: ix with (ix + pl) % s == q, from the first.
            let ix0 = (q + s - pl % s) % s;
            if ix0 >= w {
                continue;
            }
            let dst = &mut buf[(q * rows + r) * pw..(q * rows + r + 1) * pw];
            let dst = &mut dst[((ix0 + pl) / s).min(pw)..];
            if s == 1 {
                let n = dst.len().min(w);
                copy(&src[..n], &mut dst[..n]);
            } else {
                for (d, &v) in dst.iter_mut().zip(src[ix0..].iter().step_by(s)) {
                    *d = v;
                }
            }
        }
    }
    let buf = &buf[..];
    // Each tap's filter value and where it reads in `buf` for output (0, 0); output row oy
    // reads oy * sy rows further.
    let taps: Vec<(f32, usize)> = (0..kh * kw)
        .map(|t| {
            let (r, c) = (t / kw * dy, t % kw * dx);
            (f[t], ((c % s) * rows + r) * pw + c / s)
        })
        .collect();
    // Whole groups of GROUP vectors along each row: GROUP independent accumulators.
    let grouped = ow / (GROUP * LANES) * (GROUP * LANES);
    for oy in 0..oh {
        let down = oy * sy * pw;
        let row = &mut out[oy * ow..(oy + 1) * ow];
        for ox in (0..grouped).step_by(GROUP * LANES) {
            let mut acc = [_mm256_setzero_ps(); GROUP];
            for &(wt, at) in &taps {
                let wv = _mm256_set1_ps(wt);
                let at = at + down + ox;
                let src = &buf[at..at + GROUP * LANES];
                for (u, a) in acc.iter_mut().enumerate() {
                    // SAFETY: `src` holds GROUP * LANES floats.
                    let v = unsafe { _mm256_loadu_ps(src.as_ptr().add(u * LANES)) };
                    *a = _mm256_fmadd_ps(wv, v, *a);
                }
            }
            let dst = &mut row[ox..ox + GROUP * LANES];
            for (u, a) in acc.iter().enumerate() {
                // SAFETY: `dst` holds GROUP * LANES floats.
                unsafe { _mm256_storeu_ps(dst.as_mut_ptr().add(u * LANES), *a) };
            }
        }
    }
    // The vectors left of each row (all of a short row), GROUP rows at a time, again with
    // independent accumulators: one would wait on each multiply-add before the next.
    for ox in (grouped..ow).step_by(LANES) {
        let n = LANES.min(ow - ox);
        for oy in (0..oh).step_by(GROUP) {
            let rows_here = GROUP.min(oh - oy);
            let mut acc = [_mm256_setzero_ps(); GROUP];
            for &(wt, at) in &taps {
                let wv = _mm256_set1_ps(wt);
                for (r, a) in acc.iter_mut().enumerate().take(rows_here) {
                    let at = at + (oy + r) * sy * pw + ox;
                    let src = &buf[at..at + LANES];
                    // SAFETY: `src` holds LANES floats (the rows are padded to whole vectors).
                    let v = unsafe { _mm256_loadu_ps(src.as_ptr()) };
                    *a = _mm256_fmadd_ps(wv, v, *a);
                }
            }
            for (r, a) in acc.iter().enumerate().take(rows_here) {
                let dst = &mut out[(oy + r) * ow + ox..(oy + r) * ow + ox + n];
                // SAFETY: the mask covers the n floats of `dst`.
                unsafe { _mm256_maskstore_ps(dst.as_mut_ptr(), first(n), *a) };
            }
        }
    }
}

/// A mask of the first `n` of eight lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn first(n: usize) -> __m256i {
    let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), lane)
}

/// `dst.copy_from_slice(src)` in vectors, the last one masked: the rows of a plane are short
/// (7 to 112 floats), too short to pay for a call to `memcpy` each.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn copy(src: &[f32], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len());
    let n = src.len();
    let mut i = 0;
    while i + LANES <= n {
        // SAFETY: i + LANES <= n, inside both slices.
        unsafe {
            _mm256_storeu_ps(
                dst.as_mut_ptr().add(i),
                _mm256_loadu_ps(src.as_ptr().add(i)),
            )
        };
        i += LANES;
    }
    if i < n {
        let m = first(n - i);
        // SAFETY: the mask covers the n - i floats left in both slices.
        unsafe {
            let v = _mm256_maskload_ps(src.as_ptr().add(i), m);
            _mm256_maskstore_ps(dst.as_mut_ptr().add(i), m, v);
        }
    }
}

/// Never called: `Conv::fma` is false off x86-64.
#[cfg(not(target_arch = "x86_64"))]
fn plane_avx2(_: &Geometry, _: &[f32], _: &[f32], _: &mut [f32], _: &mut Vec<f32>) {
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

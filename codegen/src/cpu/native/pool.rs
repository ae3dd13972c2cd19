//! Max and average pooling and their gradients over NCHW planes, and pooling over channel
//! blocks (NCHWc), in f32.

use super::for_planes;
use tcc_ir::Pool2d;

/// `max_pool2d`: tiled windows in one pass, otherwise row by row (`wide`: the rows' loops
/// compiled for AVX2, which the CPU has).
pub(super) fn max_pool(
    p: &Pool2d,
    (xd, yd): ([usize; 4], [usize; 4]),
    x: &[f32],
    y: &mut [f32],
    wide: bool,
) {
    if tiles(p) {
        max_pool_tiled(p, xd, yd, x, y);
    } else {
        max_pool_rows(p, xd, yd, x, y, wide);
    }
}

/// `max_pool2d_grad`: each window's cotangent goes to the first position holding its maximum
/// (NaN counts as the maximum).
pub(super) fn max_pool_grad(
    p: &Pool2d,
    xd: [usize; 4],
    yd: [usize; 4],
    x: &[f32],
    dy: &[f32],
    dx: &mut [f32],
) {
    if tiles(p) {
        return max_pool_grad_tiled(p, xd, yd, x, dy, dx);
    }
    pool_backward(p, xd, yd, dy, dx, |b, w, g, dx| {
        let plane = &x[b..b + dx.len()];
        let mut best = usize::MAX;
        let mut m = f32::NEG_INFINITY;
        w.each(|i| {
            let v = plane[i];
            if best == usize::MAX || v > m || (v.is_nan() && !m.is_nan()) {
                best = i;
                m = v;
            }
        });
        dx[best] += g;
    });
}

/// `avg_pool2d`: each window's mean, over the whole window or its unpadded part.
pub(super) fn avg_pool(
    p: &Pool2d,
    include_pad: bool,
    xd: [usize; 4],
    yd: [usize; 4],
    x: &[f32],
    y: &mut [f32],
) {
    let full = (p.kernel[0] * p.kernel[1]) as f32;
    pool_forward(p, xd, yd, x, y, |plane, w| {
        let mut s = 0.0f32;
        w.each(|i| s += plane[i]);
        s / if include_pad { full } else { w.count() as f32 }
    });
}

/// `avg_pool2d_grad`: each window's cotangent spread evenly over the positions its divisor
/// counts.
pub(super) fn avg_pool_grad(
    p: &Pool2d,
    include_pad: bool,
    xd: [usize; 4],
    yd: [usize; 4],
    dy: &[f32],
    dx: &mut [f32],
) {
    let full = (p.kernel[0] * p.kernel[1]) as f32;
    pool_backward(p, xd, yd, dy, dx, |_, w, g, dx| {
        let g = g / if include_pad { full } else { w.count() as f32 };
        w.each(|i| dx[i] += g);
    });
}

/// The real (unpadded) part of one pooling window inside its plane.
struct Window {
    y: std::ops::Range<usize>,
    x: std::ops::Range<usize>,
    w: usize,
}

impl Window {
    /// Calls `f` with the in-plane index of each element, row-major.
    #[inline]
    fn each(&self, mut f: impl FnMut(usize)) {
        for iy in self.y.clone() {
            for ix in self.x.clone() {
                f(iy * self.w + ix);
            }
        }
    }

    fn count(&self) -> usize {
        self.y.len() * self.x.len()
    }
}

/// The window of output `(oy, ox)` of a plane of height `h` and width `w`.
#[inline]
fn window(p: &Pool2d, h: usize, w: usize, oy: usize, ox: usize) -> Window {
    let span = |o: usize, i: usize, n: usize| {
        let lo = (o * p.strides[i] as usize) as isize - p.pads[i] as isize;
        let hi = (lo + p.kernel[i] as isize).min(n as isize);
        lo.max(0) as usize..hi.max(0) as usize
    };
    Window {
        y: span(oy, 0, h),
        x: span(ox, 1, w),
        w,
    }
}

/// Whether pooling windows tile the input: no padding and strides equal to the window, so each
/// input element is in at most one window.
fn tiles(p: &Pool2d) -> bool {
    p.pads == [0; 4] && p.strides == p.kernel
}

/// Whether any element is NaN (branch-free, so it vectorises).
fn has_nan(xs: &[f32]) -> bool {
    xs.iter().fold(false, |a, v| a | v.is_nan())
}

/// `max_pool2d` with padding or overlapping windows, planes in parallel. A plane without NaN is
/// done row by row ([`max_plane`]); a plane holding a NaN takes the exact path, window by
/// window, where NaN wins. With `wide` the plane's loops run as AVX2 vectors
/// (resnet18's int8 stem pool, which stays f32 and NCHW).
fn max_pool_rows(p: &Pool2d, xd: [usize; 4], yd: [usize; 4], x: &[f32], y: &mut [f32], wide: bool) {
    let (xs, ys) = (xd[2] * xd[3], yd[2] * yd[3]);
    let work = |(plane, out): (usize, &mut [f32])| {
        let xp = &x[plane * xs..(plane + 1) * xs];
        #[cfg(target_arch = "x86_64")]
        if wide {
            // SAFETY: `wide` only where the CPU has AVX2.
            unsafe { max_plane_avx2(p, (xd, yd), xp, out) };
            return;
        }
        let _ = wide;
        max_plane(p, (xd, yd), xp, out);
    };
    for_planes(y, ys, work);
}

/// [`max_plane`] compiled for AVX2.
///
/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn max_plane_avx2(p: &Pool2d, dims: ([usize; 4], [usize; 4]), xp: &[f32], out: &mut [f32]) {
    max_plane(p, dims, xp, out)
}

/// One plane of [`max_pool_rows`].
#[inline(always)]
fn max_plane(p: &Pool2d, (xd, yd): ([usize; 4], [usize; 4]), xp: &[f32], out: &mut [f32]) {
    let [_, _, h, w] = xd;
    let [_, _, oh, ow] = yd;
    if has_nan(xp) {
        for oy in 0..oh {
            for ox in 0..ow {
                let mut m = f32::NEG_INFINITY;
                window(p, h, w, oy, ox).each(|i| {
                    let v = xp[i];
                    if v > m || v.is_nan() {
                        m = v;
                    }
                });
                out[oy * ow + ox] = m;
            }
        }
        return;
    }
    // As the integer pool (splitting the plane into column phases first took half the time).
    rows_then_columns(p, (xd, yd), xp, out, f32::NEG_INFINITY, f32::max);
}

/// `max_pool2d` of integers (u8 or i8 levels; a quantized model's pooling), for every window
/// shape, planes in parallel: per output row, the maximum over the window's input rows into a
/// buffer bordered by `lowest` (the type's least value) for the padding, then each output the
/// maximum of its window's columns there.
pub(super) fn max_pool_int<T: Copy + Ord + Default + Send + Sync>(
    p: &Pool2d,
    xd: [usize; 4],
    yd: [usize; 4],
    x: &[T],
    y: &mut [T],
    lowest: T,
) {
    let (xs, ys) = (xd[2] * xd[3], yd[2] * yd[3]);
    let work = |(plane, out): (usize, &mut [T])| {
        let xp = &x[plane * xs..(plane + 1) * xs];
        rows_then_columns(p, (xd, yd), xp, out, lowest, T::max);
    };
    for_planes(y, ys, work);
}

/// One plane of a max pool: per output row, the maximum (`max`) over the window's input rows
/// into a buffer bordered by `lowest` for the padding, then each output the maximum of its
/// window's columns there (the common windows written out, so that they vectorise).
#[inline(always)]
fn rows_then_columns<T: Copy>(
    p: &Pool2d,
    (xd, yd): ([usize; 4], [usize; 4]),
    xp: &[T],
    out: &mut [T],
    lowest: T,
    max: impl Fn(T, T) -> T + Copy,
) {
    let [_, _, h, w] = xd;
    let [_, _, _, ow] = yd;
    let (kh, kw) = (p.kernel[0] as usize, p.kernel[1] as usize);
    let (sy, sx) = (p.strides[0] as usize, p.strides[1] as usize);
    let (py, px) = (p.pads[0] as isize, p.pads[1] as usize);
    // Every window's columns lie in `0..px + w + kw` of the bordered row.
    let width = ((ow - 1) * sx + kw).max(px + w);
    let mut rows = vec![lowest; width];
    for (oy, orow) in out.chunks_exact_mut(ow).enumerate() {
        let inside = &mut rows[px..px + w];
        inside.fill(lowest);
        for ky in 0..kh {
            let iy = (oy * sy + ky) as isize - py;
            if (0..h as isize).contains(&iy) {
                let src = &xp[iy as usize * w..][..w];
                for (m, &v) in inside.iter_mut().zip(src) {
                    *m = max(*m, v);
                }
            }
        }
        match (kw, sx) {
            (3, 2) => {
                for (o, r) in orow.iter_mut().zip(rows.windows(3).step_by(2)) {
                    *o = max(max(r[0], r[1]), r[2]);
                }
            }
            (2, 2) => {
                for (o, r) in orow.iter_mut().zip(rows.chunks_exact(2)) {
                    *o = max(r[0], r[1]);
                }
            }
            _ => {
                for (ox, o) in orow.iter_mut().enumerate() {
                    let win = &rows[ox * sx..ox * sx + kw];
                    *o = win.iter().copied().fold(lowest, max);
                }
            }
        }
    }
}

/// `max_pool2d` for tiling windows: row by row of windows, planes in parallel.
fn max_pool_tiled(p: &Pool2d, xd: [usize; 4], yd: [usize; 4], x: &[f32], y: &mut [f32]) {
    let [_, _, h, w] = xd;
    let [_, _, oh, ow] = yd;
    let (kh, kw) = (p.kernel[0] as usize, p.kernel[1] as usize);
    let (xs, ys) = (h * w, oh * ow);
    let work = |(plane, out): (usize, &mut [f32])| {
        let xp = &x[plane * xs..(plane + 1) * xs];
        // Branch-free maxima (random data defeats branch prediction); a plane holding a NaN
        // takes the exact path, where NaN wins.
        let nan = has_nan(xp);
        if kh == 2 && kw == 2 && !nan {
            // The common 2x2 case as one expression per output, which vectorises.
            for oy in 0..oh {
                let r0 = &xp[2 * oy * w..2 * oy * w + 2 * ow];
                let r1 = &xp[(2 * oy + 1) * w..(2 * oy + 1) * w + 2 * ow];
                let orow = &mut out[oy * ow..(oy + 1) * ow];
                for (ox, o) in orow.iter_mut().enumerate() {
                    let a = r0[2 * ox].max(r0[2 * ox + 1]);
                    let b = r1[2 * ox].max(r1[2 * ox + 1]);
                    *o = a.max(b);
                }
            }
            return;
        }
        for oy in 0..oh {
            let orow = &mut out[oy * ow..(oy + 1) * ow];
            orow.fill(f32::NEG_INFINITY);
            for ky in 0..kh {
                let irow = &xp[(oy * kh + ky) * w..(oy * kh + ky) * w + ow * kw];
                for (o, win) in orow.iter_mut().zip(irow.chunks_exact(kw)) {
                    for &v in win {
                        if nan {
                            if v > *o || v.is_nan() {
                                *o = v;
                            }
                        } else {
                            *o = o.max(v);
                        }
                    }
                }
            }
        }
    };
    for_planes(y, ys, work);
}

/// `max_pool2d_grad` for tiling windows: each window's gradient is written at its first
/// maximum and zeros around it, plane by plane in parallel.
fn max_pool_grad_tiled(
    p: &Pool2d,
    xd: [usize; 4],
    yd: [usize; 4],
    x: &[f32],
    dy: &[f32],
    dx: &mut [f32],
) {
    let [_, _, h, w] = xd;
    let [_, _, oh, ow] = yd;
    let (kh, kw) = (p.kernel[0] as usize, p.kernel[1] as usize);
    let (xs, ys) = (h * w, oh * ow);
    let work = |(plane, out): (usize, &mut [f32])| {
        let xp = &x[plane * xs..(plane + 1) * xs];
        let g = &dy[plane * ys..(plane + 1) * ys];
        // Rows and columns past the last window get nothing.
        if oh * kh < h || ow * kw < w {
            out.fill(0.0);
        }
        let nan = has_nan(xp);
        for oy in 0..oh {
            for ox in 0..ow {
                let base = oy * kh * w + ox * kw;
                let mut best = base;
                let mut m = xp[base];
                for ky in 0..kh {
                    for kx in 0..kw {
                        let i = base + ky * w + kx;
                        let v = xp[i];
                        // The exact rule (NaN wins) only where a NaN exists; otherwise
                        // conditional moves, not branches.
                        let better = if nan {
                            v > m || (v.is_nan() && !m.is_nan())
                        } else {
                            v > m
                        };
                        m = if better { v } else { m };
                        best = if better { i } else { best };
                        out[i] = 0.0;
                    }
                }
                out[best] = g[oy * ow + ox];
            }
        }
    };
    for_planes(dx, xs, work);
}

/// Pooling forward: each output plane from its input plane, planes in parallel.
fn pool_forward(
    p: &Pool2d,
    xd: [usize; 4],
    yd: [usize; 4],
    x: &[f32],
    y: &mut [f32],
    f: impl Fn(&[f32], &Window) -> f32 + Sync,
) {
    let [_, _, h, w] = xd;
    let [_, _, oh, ow] = yd;
    let (xs, ys) = (h * w, oh * ow);
    let work = |(plane, out): (usize, &mut [f32])| {
        let xp = &x[plane * xs..(plane + 1) * xs];
        for oy in 0..oh {
            for ox in 0..ow {
                out[oy * ow + ox] = f(xp, &window(p, h, w, oy, ox));
            }
        }
    };
    for_planes(y, ys, work);
}

/// Pooling backward: each input-gradient plane (zeroed, then `f(plane offset, window, dy,
/// plane)` per output) from its output-gradient plane, planes in parallel.
fn pool_backward(
    p: &Pool2d,
    xd: [usize; 4],
    yd: [usize; 4],
    dy: &[f32],
    dx: &mut [f32],
    f: impl Fn(usize, &Window, f32, &mut [f32]) + Sync,
) {
    let [_, _, h, w] = xd;
    let [_, _, oh, ow] = yd;
    let (xs, ys) = (h * w, oh * ow);
    let work = |(plane, out): (usize, &mut [f32])| {
        out.fill(0.0);
        let g = &dy[plane * ys..(plane + 1) * ys];
        for oy in 0..oh {
            for ox in 0..ow {
                f(plane * xs, &window(p, h, w, oy, ox), g[oy * ow + ox], out);
            }
        }
    };
    for_planes(dx, xs, work);
}

/// `max_pool2d` (`avg` is `None`) or `avg_pool2d` (`Some(count_include_pad)`) over channel
/// blocks `[N, Cb, H, W, b]` (`xd`) into `yd`: every lane pooled as a channel of its own, a
/// window's lanes together at each tap (one AVX2 vector with `wide`, for blocks of eight).
/// NaN wins a max, as in [`max_pool_rows`].
pub(super) fn pool_blocked(
    p: &Pool2d,
    avg: Option<bool>,
    [xd, yd]: [[usize; 5]; 2],
    wide: bool,
    x: &[f32],
    y: &mut [f32],
) {
    let [_, _, h, w, b] = xd;
    let [_, _, oh, ow, _] = yd;
    let full = (p.kernel[0] * p.kernel[1]) as f32;
    // Output columns whose windows lie inside the rows (no clipping at the left or right).
    let inner = {
        let (s, pad, k) = (
            p.strides[1] as usize,
            p.pads[1] as usize,
            p.kernel[1] as usize,
        );
        let lo = pad.div_ceil(s);
        let hi = if w + pad >= k {
            (w + pad - k) / s + 1
        } else {
            0
        };
        lo.min(ow)..hi.clamp(lo.min(ow), ow)
    };
    // In AVX2, those columns go a row at a time, and the others a window at a time.
    let rowwise = cfg!(target_arch = "x86_64") && wide && !inner.is_empty();
    #[cfg(target_arch = "x86_64")]
    let fold = match avg {
        None => Fold::Max,
        Some(include_pad) => Fold::Mean { include_pad, full },
    };
    let work = |(plane, out): (usize, &mut [f32])| {
        let xp = &x[plane * h * w * b..(plane + 1) * h * w * b];
        for oy in 0..oh {
            #[cfg(target_arch = "x86_64")]
            if rowwise {
                // SAFETY: `wide` means b = 8 and AVX2; the windows of `inner` lie in the plane.
                unsafe { pool8_row(p, fold, xp, h, w, oy, &inner, &mut out[oy * ow * b..]) };
            }
            for ox in 0..ow {
                if rowwise && inner.contains(&ox) {
                    continue;
                }
                let win = window(p, h, w, oy, ox);
                let o = &mut out[(oy * ow + ox) * b..(oy * ow + ox + 1) * b];
                #[cfg(target_arch = "x86_64")]
                if wide {
                    // SAFETY: `wide` means b = 8 and AVX2.
                    unsafe { pool8(fold, xp, &win, o) };
                    continue;
                }
                match avg {
                    None => {
                        o.fill(f32::NEG_INFINITY);
                        win.each(|i| {
                            for (m, &v) in o.iter_mut().zip(&xp[i * b..(i + 1) * b]) {
                                *m = if v > *m || v.is_nan() { v } else { *m };
                            }
                        });
                    }
                    Some(include_pad) => {
                        o.fill(0.0);
                        win.each(|i| {
                            for (s, &v) in o.iter_mut().zip(&xp[i * b..(i + 1) * b]) {
                                *s += v;
                            }
                        });
                        let n = if include_pad {
                            full
                        } else {
                            win.count() as f32
                        };
                        o.iter_mut().for_each(|s| *s /= n);
                    }
                }
            }
        }
    };
    for_planes(y, oh * ow * b, work);
}

/// How a blocked pooling window's taps combine.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
enum Fold {
    /// The maximum, NaN winning.
    Max,
    /// The sum in the window's order, divided by the whole window's size (`full`) or, without
    /// `include_pad`, by the taps inside the image.
    Mean { include_pad: bool, full: f32 },
}

#[cfg(target_arch = "x86_64")]
impl Fold {
    /// The value before the first tap.
    #[target_feature(enable = "avx2")]
    fn start(self) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        match self {
            Fold::Max => _mm256_set1_ps(f32::NEG_INFINITY),
            Fold::Mean { .. } => _mm256_setzero_ps(),
        }
    }

    /// One more tap.
    #[target_feature(enable = "avx2")]
    fn tap(
        self,
        acc: std::arch::x86_64::__m256,
        v: std::arch::x86_64::__m256,
    ) -> std::arch::x86_64::__m256 {
        match self {
            Fold::Max => crate::cpu::simd::max_nan(acc, v),
            Fold::Mean { .. } => std::arch::x86_64::_mm256_add_ps(acc, v),
        }
    }

    /// The result of a window of `taps` taps inside the image.
    #[target_feature(enable = "avx2")]
    fn finish(self, acc: std::arch::x86_64::__m256, taps: usize) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        match self {
            Fold::Max => acc,
            Fold::Mean { include_pad, full } => {
                let n = if include_pad { full } else { taps as f32 };
                _mm256_div_ps(acc, _mm256_set1_ps(n))
            }
        }
    }
}

/// The windows of output row `oy`, columns `cols` (whose windows are not clipped left or
/// right), over a plane of eight-float pixels into the row `o`: four outputs at a time, their
/// taps interleaved, each in the order [`pool8`] takes them (so the same NaN wins a maximum
/// and a mean sums in the same order). One window after another, each a chain of dependent
/// maxima, ran 2.5x slower than onnxruntime's pooling; means went through a scalar loop
/// (Inception-v3's 3x3 average pools, 10x slower than onnxruntime's).
///
/// # Safety
/// The CPU has AVX2; `xp` holds the `h x w` plane; `o` holds the row's outputs.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
unsafe fn pool8_row(
    p: &Pool2d,
    fold: Fold,
    xp: &[f32],
    h: usize,
    w: usize,
    oy: usize,
    cols: &std::ops::Range<usize>,
    o: &mut [f32],
) {
    use std::arch::x86_64::*;
    const N: usize = 4;
    let rows = window(p, h, w, oy, cols.start).y;
    let (s, kw) = (p.strides[1] as usize, p.kernel[1] as usize);
    let x0 = |ox: usize| ox * s - p.pads[1] as usize;
    let mut ox = cols.start;
    while ox < cols.end {
        let n = N.min(cols.end - ox);
        let mut m = [fold.start(); N];
        for iy in rows.clone() {
            for kx in 0..kw {
                for (j, m) in m.iter_mut().enumerate().take(n) {
                    // SAFETY: the window of output ox + j is inside the plane.
                    let v =
                        unsafe { _mm256_loadu_ps(xp.as_ptr().add((iy * w + x0(ox + j) + kx) * 8)) };
                    *m = fold.tap(*m, v);
                }
            }
        }
        for (j, m) in m.iter().enumerate().take(n) {
            // SAFETY: output ox + j of the row.
            unsafe {
                _mm256_storeu_ps(
                    o.as_mut_ptr().add((ox + j) * 8),
                    fold.finish(*m, rows.len() * kw),
                )
            };
        }
        ox += n;
    }
}

/// One window over a plane of eight-float pixels into `o`.
///
/// # Safety
/// The CPU has AVX2; the window's pixels lie in `xp`; `o` holds eight floats.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn pool8(fold: Fold, xp: &[f32], win: &Window, o: &mut [f32]) {
    use std::arch::x86_64::*;
    let mut m = fold.start();
    for iy in win.y.clone() {
        for ix in win.x.clone() {
            let i = iy * win.w + ix;
            // SAFETY: pixel i of the plane.
            let v = unsafe { _mm256_loadu_ps(xp.as_ptr().add(i * 8)) };
            m = fold.tap(m, v);
        }
    }
    // SAFETY: `o` holds eight floats.
    unsafe { _mm256_storeu_ps(o.as_mut_ptr(), fold.finish(m, win.count())) };
}

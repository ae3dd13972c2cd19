//! Kernels along lines of a tensor, in f32: reductions over any axes, softmax over any axis,
//! softmax cross-entropy and its gradient, batch norm in both forms, and `top_k`.

use super::for_planes;
use tcc_ir::{DType, ReduceOp};

/// The class index of each row, checked against the number of classes.
///
/// # Safety
/// `labels` holds `rows` elements of `dtype` (i32 or i64).
pub(super) unsafe fn read_labels(
    labels: *const u8,
    dtype: DType,
    rows: usize,
    classes: usize,
) -> Result<Vec<usize>, String> {
    (0..rows)
        .map(|r| {
            // SAFETY: r < rows (the caller's contract).
            let l = unsafe {
                match dtype {
                    DType::I32 => *(labels as *const i32).add(r) as i64,
                    _ => *(labels as *const i64).add(r),
                }
            };
            usize::try_from(l)
                .ok()
                .filter(|&l| l < classes)
                .ok_or_else(|| {
                    format!("label {l} in row {r} is out of range for {classes} classes")
                })
        })
        .collect()
}

/// The mean cross-entropy of `rows` rows of `x` (each `classes` long) against `labels`, with
/// the sums in f64.
pub(super) fn cross_entropy(x: &[f32], labels: &[usize], classes: usize) -> f32 {
    let mut total = 0.0f64;
    for (r, &l) in labels.iter().enumerate() {
        let row = &x[r * classes..(r + 1) * classes];
        let m = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let s: f64 = row.iter().map(|&v| ((v - m) as f64).exp()).sum();
        total -= (row[l] - m) as f64 - s.ln();
    }
    (total / labels.len() as f64) as f32
}

/// The gradient of [`cross_entropy`]: `(softmax(x) - onehot(labels)) * dy / rows`.
pub(super) fn cross_entropy_grad(
    x: &[f32],
    labels: &[usize],
    classes: usize,
    dy: f32,
    dx: &mut [f32],
) {
    let k = dy / labels.len() as f32;
    for (r, &l) in labels.iter().enumerate() {
        let row = &x[r * classes..(r + 1) * classes];
        let out = &mut dx[r * classes..(r + 1) * classes];
        let m = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let mut s = 0.0f32;
        for (o, &v) in out.iter_mut().zip(row) {
            *o = (v - m).exp();
            s += *o;
        }
        let scale = k / s;
        out.iter_mut().for_each(|o| *o *= scale);
        out[l] -= k;
    }
}

/// Softmax (or log-softmax) of `x` viewed as `[outer, len, inner]` along its middle axis, with
/// the sums in f64. NaN anywhere in a line makes the line NaN, as in the reference.
pub(super) fn softmax(x: &[f32], y: &mut [f32], len: usize, inner: usize, log: bool) {
    for_planes(y, len * inner, |(o, y)| {
        let xs = &x[o * len * inner..(o + 1) * len * inner];
        for i in 0..inner {
            let m = (0..len)
                .map(|j| xs[j * inner + i])
                .fold(f32::NEG_INFINITY, |m, v| {
                    if m.is_nan() || !(v.is_nan() || v > m) {
                        m
                    } else {
                        v
                    }
                });
            let s: f64 = (0..len)
                .map(|j| ((xs[j * inner + i] - m) as f64).exp())
                .sum();
            for j in 0..len {
                let d = (xs[j * inner + i] - m) as f64;
                y[j * inner + i] = if log { d - s.ln() } else { d.exp() / s } as f32;
            }
        }
    });
}

/// Softmax (or, with `log`, log-softmax) of `x` along contiguous rows of `len`, in AVX2
/// vectors: the row's maximum, then `e^(x - max)` once (stored, for softmax) with its sum in
/// eight f32 lanes, then each stored value divided by the sum (or `x - max - ln(sum)`). Rows go
/// to threads in chunks of at least 4096 elements. NaN anywhere in a row makes the row NaN, as
/// in the reference (so does a row of -inf: `-inf - -inf`).
///
/// # Safety
/// The CPU has AVX2 and FMA; `x` and `y` hold whole rows of `len`.
#[cfg(target_arch = "x86_64")]
pub(super) unsafe fn softmax_rows(x: &[f32], y: &mut [f32], len: usize, log: bool) {
    if len == 0 {
        return;
    }
    let rows = 4096usize.div_ceil(len);
    for_planes(y, rows * len, |(c, y)| {
        for (r, y) in y.chunks_exact_mut(len).enumerate() {
            let at = (c * rows + r) * len;
            // SAFETY: the caller's contract.
            unsafe { softmax_row(&x[at..at + len], y, log) };
        }
    });
}

/// One row of [`softmax_rows`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn softmax_row(x: &[f32], y: &mut [f32], log: bool) {
    use crate::cpu::simd::{exp, first};
    use std::arch::x86_64::*;
    let n = x.len();
    let whole = n / 8 * 8;
    let tail = first(n - whole);
    // SAFETY (every load and store): offsets below `whole` hold whole vectors; the tail's are
    // masked to the row.
    let load = |i: usize| unsafe { _mm256_loadu_ps(x.as_ptr().add(i)) };
    let load_tail = || unsafe { _mm256_maskload_ps(x.as_ptr().add(whole), tail) };
    let tail_lanes = _mm256_castsi256_ps(tail);
    // The maximum, and whether any element is NaN.
    let (mut m, mut nan) = (_mm256_set1_ps(f32::NEG_INFINITY), _mm256_setzero_ps());
    let mut take = |v: __m256| {
        nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
        m = _mm256_max_ps(m, v);
    };
    for i in (0..whole).step_by(8) {
        take(load(i));
    }
    if whole < n {
        // Lanes past the row are -inf, which no maximum takes.
        take(_mm256_blendv_ps(
            _mm256_set1_ps(f32::NEG_INFINITY),
            load_tail(),
            tail_lanes,
        ));
    }
    if _mm256_movemask_ps(nan) != 0 {
        y.fill(f32::NAN);
        return;
    }
    let mut lanes = [0f32; 8];
    // SAFETY: `lanes` holds eight floats.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), m) };
    let mx = _mm256_set1_ps(lanes.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)));
    // e^(x - max), stored for softmax, and its sum.
    let mut sum = _mm256_setzero_ps();
    for i in (0..whole).step_by(8) {
        let e = exp(_mm256_sub_ps(load(i), mx));
        sum = _mm256_add_ps(sum, e);
        if !log {
            unsafe { _mm256_storeu_ps(y.as_mut_ptr().add(i), e) };
        }
    }
    if whole < n {
        let e = exp(_mm256_sub_ps(load_tail(), mx));
        sum = _mm256_add_ps(sum, _mm256_and_ps(e, tail_lanes));
        if !log {
            unsafe { _mm256_maskstore_ps(y.as_mut_ptr().add(whole), tail, e) };
        }
    }
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), sum) };
    let total = lanes.iter().sum::<f32>();
    if log {
        // x - max - ln(sum).
        let ln = _mm256_set1_ps(total.ln());
        let out = |v: __m256| _mm256_sub_ps(_mm256_sub_ps(v, mx), ln);
        for i in (0..whole).step_by(8) {
            unsafe { _mm256_storeu_ps(y.as_mut_ptr().add(i), out(load(i))) };
        }
        if whole < n {
            unsafe { _mm256_maskstore_ps(y.as_mut_ptr().add(whole), tail, out(load_tail())) };
        }
        return;
    }
    let s = _mm256_set1_ps(total);
    for i in (0..whole).step_by(8) {
        unsafe {
            let p = y.as_mut_ptr().add(i);
            _mm256_storeu_ps(p, _mm256_div_ps(_mm256_loadu_ps(p), s));
        }
    }
    if whole < n {
        unsafe {
            let p = y.as_mut_ptr().add(whole);
            _mm256_maskstore_ps(p, tail, _mm256_div_ps(_mm256_maskload_ps(p, tail), s));
        }
    }
}

/// Inference batch norm of `x` viewed as `[N, c, inner]`: `(x - mean) * scale + beta` in f64,
/// rounded once, as the reference does.
pub(super) fn batch_norm(
    x: &[f32],
    [g, b, m, v]: [&[f32]; 4],
    y: &mut [f32],
    eps: f64,
    c: usize,
    inner: usize,
) {
    let scale: Vec<f64> = (0..c)
        .map(|ch| g[ch] as f64 / (v[ch] as f64 + eps).sqrt())
        .collect();
    for_planes(y, inner, |(p, y)| {
        let ch = p % c;
        let (s, mu, beta) = (scale[ch], m[ch] as f64, b[ch] as f64);
        let xs = &x[p * inner..(p + 1) * inner];
        for (yo, &xv) in y.iter_mut().zip(xs) {
            *yo = ((xv as f64 - mu) * s + beta) as f32;
        }
    });
}

/// Training batch norm of `x` viewed as `[n, c, inner]`: the batch mean and (biased) variance
/// per channel in f64, and `y` normalised with them.
pub(super) fn batch_norm_train(
    x: &[f32],
    [g, b]: [&[f32]; 2],
    [y, mean, var]: [&mut [f32]; 3],
    eps: f64,
    [n, c, inner]: [usize; 3],
) {
    let m = (n * inner) as f64;
    for ch in 0..c {
        let plane = |b_: usize| &x[(b_ * c + ch) * inner..(b_ * c + ch + 1) * inner];
        let s: f64 = (0..n)
            .map(|b_| plane(b_).iter().map(|&v| v as f64).sum::<f64>())
            .sum();
        let mu = s / m;
        let ss: f64 = (0..n)
            .map(|b_| {
                plane(b_)
                    .iter()
                    .map(|&v| (v as f64 - mu).powi(2))
                    .sum::<f64>()
            })
            .sum();
        let va = ss / m;
        mean[ch] = mu as f32;
        var[ch] = va as f32;
        // (x - mean) * scale + beta in f64, rounded once: the scale is large when the variance
        // is tiny, and f32 rounding of x - mean would show.
        let scale = g[ch] as f64 / (va + eps).sqrt();
        let shift = b[ch] as f64;
        for b_ in 0..n {
            let o = (b_ * c + ch) * inner;
            for (yo, &xv) in y[o..o + inner].iter_mut().zip(plane(b_)) {
                *yo = ((xv as f64 - mu) * scale + shift) as f32;
            }
        }
    }
}

/// `top_k` of `x` viewed as `[lines, len, inner]` along its middle axis: the values into
/// `values`, and the indices returned. By value (NaN above every number), ties by index, as
/// the reference orders them.
pub(super) fn top_k(
    x: &[f32],
    values: &mut [f32],
    [len, inner, k]: [usize; 3],
    largest: bool,
) -> Vec<i64> {
    let lines = x.len().checked_div(len * inner).unwrap_or(0);
    let mut index = vec![0i64; lines * k * inner];
    let mut line: Vec<usize> = Vec::with_capacity(len);
    for o in 0..lines {
        for i in 0..inner {
            let at = |j: usize| x[(o * len + j) * inner + i];
            line.clear();
            line.extend(0..len);
            let by = |p: &usize, q: &usize| {
                let (a, b) = (at(*p), at(*q));
                let c = match (a.is_nan(), b.is_nan()) {
                    (true, true) => std::cmp::Ordering::Equal,
                    (true, false) => std::cmp::Ordering::Greater,
                    (false, true) => std::cmp::Ordering::Less,
                    _ => a.partial_cmp(&b).expect("not NaN"),
                };
                if largest { c.reverse() } else { c }.then(p.cmp(q))
            };
            if k < len {
                line.select_nth_unstable_by(k, by);
                line.truncate(k);
            }
            line.sort_by(by);
            for (r, &j) in line.iter().take(k).enumerate() {
                values[(o * k + r) * inner + i] = at(j);
                index[(o * k + r) * inner + i] = j as i64;
            }
        }
    }
    index
}

/// The sum of `xs` with eight running partial sums, so that it vectorises.
pub(super) fn sum(xs: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut chunks = xs.chunks_exact(8);
    for c in &mut chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += v;
        }
    }
    let tail: f32 = chunks.remainder().iter().sum();
    acc.iter().sum::<f32>() + tail
}

/// Reduces `x` (dims `dims`) over the axes marked in `reduced` into `y` (kept axes in order).
pub(super) fn reduce(op: ReduceOp, x: &[f32], y: &mut [f32], dims: &[usize], reduced: &[bool]) {
    let init = if op == ReduceOp::Max {
        f32::NEG_INFINITY
    } else {
        0.0
    };
    y.fill(init);
    // Output stride of each input axis (0 for reduced axes).
    let r = dims.len();
    let mut ost = vec![0usize; r];
    let mut s = 1;
    for i in (0..r).rev() {
        if !reduced[i] {
            ost[i] = s;
            s *= dims[i];
        }
    }
    let inner = if r == 0 { 1 } else { dims[r - 1] };
    let outer = x.len() / inner.max(1);
    let mut idx = vec![0usize; r.saturating_sub(1)];
    let mut obase = 0usize;
    let last_reduced = r > 0 && reduced[r - 1];
    for o in 0..outer {
        let row = &x[o * inner..(o + 1) * inner];
        if last_reduced {
            let v = match op {
                ReduceOp::Max => {
                    row.iter().fold(
                        f32::NEG_INFINITY,
                        |m, &v| if v > m || v.is_nan() { v } else { m },
                    )
                }
                _ => sum(row),
            };
            let t = &mut y[obase];
            *t = if op == ReduceOp::Max {
                if v > *t || v.is_nan() { v } else { *t }
            } else {
                *t + v
            };
        } else {
            let out = &mut y[obase..obase + inner];
            match op {
                ReduceOp::Max => out.iter_mut().zip(row).for_each(|(t, &v)| {
                    if v > *t || v.is_nan() {
                        *t = v
                    }
                }),
                _ => out.iter_mut().zip(row).for_each(|(t, &v)| *t += v),
            }
        }
        // Advance the multi-index over the outer axes.
        for ax in (0..r.saturating_sub(1)).rev() {
            idx[ax] += 1;
            obase += ost[ax];
            if idx[ax] < dims[ax] {
                break;
            }
            obase -= ost[ax] * dims[ax];
            idx[ax] = 0;
        }
    }
    if op == ReduceOp::Mean {
        let count: usize = dims
            .iter()
            .zip(reduced)
            .filter(|(_, r)| **r)
            .map(|(d, _)| d)
            .product();
        let k = 1.0 / count as f32;
        y.iter_mut().for_each(|v| *v *= k);
    }
}

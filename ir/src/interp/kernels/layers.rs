//! The interpreter's ops over whole axes and windows: reductions, softmax, batch norm's
//! normalisation and statistics, convolution taps and pooling windows.

use super::R;
use super::index::{for_each_index, numel, split, strides};
use super::scalar::binary_f;
use crate::interp::{Buf, Val};
use crate::ops::{BinaryOp, Conv2d, Pool2d, ReduceOp, normalize_axis};
use crate::types::TensorType;

pub(super) fn reduce(op: ReduceOp, x: &Val, axes: &[i64], out: &TensorType) -> R<Buf> {
    let dims = x.dims();
    let mut kept: Vec<u64> = dims.to_vec();
    let mut reduced = vec![false; dims.len()];
    for &a in axes {
        let i = normalize_axis(a, dims.len()).expect("verified axes");
        reduced[i] = true;
        kept[i] = 1;
    }
    let ks = strides(&kept);
    let st: Vec<usize> = (0..dims.len())
        .map(|i| if reduced[i] { 0 } else { ks[i] })
        .collect();
    let n_out = out.numel() as usize;
    let count: usize = (0..dims.len())
        .filter(|&i| reduced[i])
        .map(|i| dims[i] as usize)
        .product();
    if op == ReduceOp::Max && count == 0 && n_out > 0 {
        return Err("reduce_max over an empty axis has no value".into());
    }
    let mut target = Vec::with_capacity(numel(dims));
    for_each_index(dims, |ix| {
        target.push(ix.iter().zip(&st).map(|(i, s)| i * s).sum::<usize>())
    });
    Ok(match &x.buf {
        Buf::F(v) => {
            let init = if op == ReduceOp::Max {
                f64::NEG_INFINITY
            } else {
                0.0
            };
            let mut acc = vec![init; n_out];
            for (k, &t) in target.iter().enumerate() {
                acc[t] = match op {
                    ReduceOp::Max => binary_f(BinaryOp::Max, acc[t], v[k]),
                    _ => acc[t] + v[k],
                };
            }
            if op == ReduceOp::Mean {
                acc.iter_mut().for_each(|a| *a /= count as f64);
            }
            Buf::F(acc)
        }
        Buf::I(v) => {
            let init = if op == ReduceOp::Max { i64::MIN } else { 0 };
            let mut acc = vec![init; n_out];
            for (k, &t) in target.iter().enumerate() {
                acc[t] = if op == ReduceOp::Max {
                    acc[t].max(v[k])
                } else {
                    acc[t].wrapping_add(v[k])
                };
            }
            Buf::I(acc)
        }
        Buf::B(_) => unreachable!("type rules forbid reducing bool"),
    })
}

pub(super) fn softmax(x: &Val, axis: i64, log: bool) -> Buf {
    let v = x.f();
    let a = normalize_axis(axis, x.ty.rank()).expect("verified axis");
    let (outer, n, inner) = split(x.dims(), a);
    let mut out = vec![0.0; v.len()];
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| (o * n + j) * inner + i;
            let m = (0..n)
                .map(|j| v[at(j)])
                .fold(f64::NEG_INFINITY, |m, y| binary_f(BinaryOp::Max, m, y));
            let s: f64 = (0..n).map(|j| (v[at(j)] - m).exp()).sum();
            for j in 0..n {
                out[at(j)] = if log {
                    v[at(j)] - m - s.ln()
                } else {
                    (v[at(j)] - m).exp() / s
                };
            }
        }
    }
    Buf::F(out)
}

/// Applies `(x - mean) / sqrt(var + eps) * gamma + beta` per channel (axis 1).
pub(super) fn normalize(
    x: &Val,
    gamma: &[f64],
    beta: &[f64],
    mean: &[f64],
    var: &[f64],
    eps: f64,
) -> Buf {
    let (_, c, inner) = split(x.dims(), 1);
    let v = x.f();
    Buf::F(
        (0..v.len())
            .map(|k| {
                let ch = (k / inner) % c;
                (v[k] - mean[ch]) / (var[ch] + eps).sqrt() * gamma[ch] + beta[ch]
            })
            .collect(),
    )
}

pub(super) fn batch_stats(x: &Val) -> (Vec<f64>, Vec<f64>) {
    let (outer, c, inner) = split(x.dims(), 1);
    let v = x.f();
    let count = (outer * inner) as f64;
    let mut mean = vec![0.0; c];
    for (k, &a) in v.iter().enumerate() {
        mean[(k / inner) % c] += a;
    }
    mean.iter_mut().for_each(|m| *m /= count);
    let mut var = vec![0.0; c];
    for (k, &a) in v.iter().enumerate() {
        let ch = (k / inner) % c;
        var[ch] += (a - mean[ch]) * (a - mean[ch]);
    }
    var.iter_mut().for_each(|s| *s /= count);
    (mean, var)
}

/// Calls `f(x_index, w_index, y_index)` for every multiply-add of a `conv2d` with input dims
/// `xd`, filter dims `wd` and output dims `yd` (flat row-major indices), in the order the forward
/// op accumulates them.
pub(super) fn conv_taps(
    c: &Conv2d,
    xd: &[u64],
    wd: &[u64],
    yd: &[u64],
    mut f: impl FnMut(usize, usize, usize),
) {
    let [_, ch, h, w] = [0, 1, 2, 3].map(|i| xd[i] as usize);
    let [_, cg, kh, kw] = [0, 1, 2, 3].map(|i| wd[i] as usize);
    let [_, o, oh, ow] = [0, 1, 2, 3].map(|i| yd[i] as usize);
    let og = o / c.groups as usize;
    let (sh, sw) = (c.strides[0] as i64, c.strides[1] as i64);
    let (dh, dw) = (c.dilations[0] as i64, c.dilations[1] as i64);
    let (pt, pl) = (c.pads[0] as i64, c.pads[1] as i64);
    let mut yi = 0;
    for_each_index(yd, |ix| {
        let [b, oc, y, xx] = [ix[0], ix[1], ix[2], ix[3]];
        let g = oc / og;
        for ci in 0..cg {
            let cin = g * cg + ci;
            for ky in 0..kh {
                let iy = y as i64 * sh - pt + ky as i64 * dh;
                if iy < 0 || iy >= h as i64 {
                    continue;
                }
                for kx in 0..kw {
                    let ix_ = xx as i64 * sw - pl + kx as i64 * dw;
                    if ix_ < 0 || ix_ >= w as i64 {
                        continue;
                    }
                    let xi = ((b * ch + cin) * h + iy as usize) * w + ix_ as usize;
                    f(xi, ((oc * cg + ci) * kh + ky) * kw + kx, yi);
                }
            }
        }
        yi += 1;
    });
    debug_assert_eq!(yi, numel(&[yd[0], o as u64, oh as u64, ow as u64]));
}

/// The flat indices of the real (unpadded) input elements in the pooling window at output
/// position `[b, c, y, x]` of an input with dims `xd`.
pub(super) fn pool_window(p: &Pool2d, xd: [usize; 4], at: [usize; 4]) -> Vec<usize> {
    let [_, ch, h, wd] = xd;
    let [b, c, y, xx] = at;
    let mut v = Vec::new();
    for ky in 0..p.kernel[0] as i64 {
        let iy = y as i64 * p.strides[0] as i64 - p.pads[0] as i64 + ky;
        for kx in 0..p.kernel[1] as i64 {
            let ix_ = xx as i64 * p.strides[1] as i64 - p.pads[1] as i64 + kx;
            if (0..h as i64).contains(&iy) && (0..wd as i64).contains(&ix_) {
                v.push(((b * ch + c) * h + iy as usize) * wd + ix_ as usize);
            }
        }
    }
    v
}

//! One plain implementation per op over wide values (see the module docs of `interp`).
//! Operands are assumed to satisfy the type rules (the function was verified).
//!
//! This file is the dispatch, one arm per op; the arms call the pieces in `index.rs`
//! (strides, broadcasting, layouts), `scalar.rs` (element-by-element semantics) and
//! `layers.rs` (reductions, softmax, batch norm, convolution and pooling windows).

mod index;
mod layers;
mod scalar;

use super::{Buf, Val, round};
use crate::ops::{BinaryOp, OpKind, normalize_axis};
use crate::types::{DType, TensorType};
use crate::typing::slice_range;
use index::{bcast_map, for_each_index, from_nchwc, index, numel, split, strides, take, to_nchwc};
use layers::{batch_stats, conv_taps, normalize, pool_window, reduce, softmax};
use scalar::{binary_f, binary_i, cast, compare, literal, quantize, unary_f, unary_i};

type R<T> = Result<T, String>;

/// Evaluates `kind` on `args`, producing values of types `tys`.
pub(crate) fn eval(kind: &OpKind, args: &[&Val], tys: &[TensorType]) -> R<Vec<Val>> {
    let out = &tys[0];
    let n = out.numel() as usize;
    let make = |ty: &TensorType, buf: Buf| Val {
        ty: ty.clone(),
        buf: round(ty.dtype(), buf),
    };
    let buf = match kind {
        OpKind::Const { ty, value } => literal(ty, value),
        OpKind::Unary(u) => match &args[0].buf {
            Buf::F(x) => Buf::F(x.iter().map(|&v| unary_f(*u, v)).collect()),
            Buf::I(x) => Buf::I(x.iter().map(|&v| unary_i(*u, v)).collect()),
            Buf::B(_) => unreachable!("type rules forbid unary ops on bool"),
        },
        OpKind::Binary(b) => {
            let (ia, ib) = (
                bcast_map(args[0].dims(), out.dims()),
                bcast_map(args[1].dims(), out.dims()),
            );
            match (&args[0].buf, &args[1].buf) {
                (Buf::F(x), Buf::F(y)) => {
                    Buf::F((0..n).map(|k| binary_f(*b, x[ia[k]], y[ib[k]])).collect())
                }
                (Buf::I(x), Buf::I(y)) => Buf::I(
                    (0..n)
                        .map(|k| binary_i(*b, out.dtype(), x[ia[k]], y[ib[k]]))
                        .collect::<R<_>>()?,
                ),
                _ => unreachable!("type rules: numeric operands of one dtype"),
            }
        }
        OpKind::Compare(c) => {
            let (ia, ib) = (
                bcast_map(args[0].dims(), out.dims()),
                bcast_map(args[1].dims(), out.dims()),
            );
            Buf::B(match (&args[0].buf, &args[1].buf) {
                (Buf::F(x), Buf::F(y)) => (0..n).map(|k| compare(*c, x[ia[k]], y[ib[k]])).collect(),
                (Buf::I(x), Buf::I(y)) => (0..n).map(|k| compare(*c, x[ia[k]], y[ib[k]])).collect(),
                (Buf::B(x), Buf::B(y)) => (0..n).map(|k| compare(*c, x[ia[k]], y[ib[k]])).collect(),
                _ => unreachable!("type rules: operands of one dtype"),
            })
        }
        OpKind::FakeQuant { bits, narrow } => {
            let (ix, il, ih) = (
                bcast_map(args[0].dims(), out.dims()),
                bcast_map(args[1].dims(), out.dims()),
                bcast_map(args[2].dims(), out.dims()),
            );
            let (x, lo, hi) = (args[0].f(), args[1].f(), args[2].f());
            let f32 = out.dtype() == crate::types::DType::F32;
            Buf::F(
                (0..n)
                    .map(|k| super::fake_quant(x[ix[k]], lo[il[k]], hi[ih[k]], *bits, *narrow, f32))
                    .collect(),
            )
        }
        OpKind::QuantizeLinear | OpKind::DequantizeLinear => {
            let (ix, is) = (
                bcast_map(args[0].dims(), out.dims()),
                bcast_map(args[1].dims(), out.dims()),
            );
            let (scale, zero) = (args[1].f(), args[2].i());
            if let Some(s) = scale.iter().find(|s| !(s.is_finite() && **s > 0.0)) {
                return Err(format!(
                    "a scale is {s}: scales must be positive and finite"
                ));
            }
            let f32 = args[1].ty.dtype() == DType::F32;
            if matches!(kind, OpKind::QuantizeLinear) {
                let x = args[0].f();
                let (lo, hi) = if out.dtype() == DType::U8 {
                    (0, 255)
                } else {
                    (-128, 127)
                };
                Buf::I(
                    (0..n)
                        .map(|k| quantize(x[ix[k]], scale[is[k]], zero[is[k]], f32, (lo, hi)))
                        .collect(),
                )
            } else {
                let q = args[0].i();
                // In f32, (q - zero) rounded to f32 times the scale: the product of two f32
                // values is exact in f64, so rounding it once to f32 is f32's multiplication.
                let level = |d: i64| if f32 { d as f32 as f64 } else { d as f64 };
                Buf::F(
                    (0..n)
                        .map(|k| level(q[ix[k]] - zero[is[k]]) * scale[is[k]])
                        .collect(),
                )
            }
        }
        OpKind::Select => {
            let ic = bcast_map(args[0].dims(), out.dims());
            let (ia, ib) = (
                bcast_map(args[1].dims(), out.dims()),
                bcast_map(args[2].dims(), out.dims()),
            );
            let cond = args[0].b();
            // Element `k` of the result: element `i` of operand `w`.
            let pick = |k: usize| if cond[ic[k]] { (1, ia[k]) } else { (2, ib[k]) };
            fn chosen<'a, T: Copy + 'a>(
                n: usize,
                pick: impl Fn(usize) -> (usize, usize),
                of: impl Fn(usize) -> &'a [T],
            ) -> Vec<T> {
                (0..n)
                    .map(|k| {
                        let (w, i) = pick(k);
                        of(w)[i]
                    })
                    .collect()
            }
            match &args[1].buf {
                Buf::F(_) => Buf::F(chosen(n, pick, |w| args[w].f())),
                Buf::I(_) => Buf::I(chosen(n, pick, |w| args[w].i())),
                Buf::B(_) => Buf::B(chosen(n, pick, |w| args[w].b())),
            }
        }
        OpKind::BroadcastTo { .. } => take(
            &args[0].buf,
            bcast_map(args[0].dims(), out.dims()).into_iter(),
        ),
        OpKind::Cast { to } => cast(args[0], *to),
        // A copy between memory spaces: the same elements.
        OpKind::SwapOut | OpKind::SwapIn => args[0].buf.clone(),
        OpKind::StopGradient | OpKind::Identity | OpKind::Reshape { .. } => args[0].buf.clone(),
        OpKind::MatMul => {
            let (a, b) = (args[0], args[1]);
            let (ad, bd, od) = (a.dims(), b.dims(), out.dims());
            let (m, k) = (ad[ad.len() - 2] as usize, ad[ad.len() - 1] as usize);
            let nn = bd[bd.len() - 1] as usize;
            let batch = &od[..od.len() - 2];
            let am = bcast_map(&ad[..ad.len() - 2], batch);
            let bm = bcast_map(&bd[..bd.len() - 2], batch);
            match (&a.buf, &b.buf) {
                (Buf::F(x), Buf::F(y)) => {
                    let mut o = vec![0.0; n];
                    for (bi, (&ao, &bo)) in am.iter().zip(&bm).enumerate() {
                        for i in 0..m {
                            for j in 0..nn {
                                // From +0.0, as a GEMM's accumulators start (and numpy
                                // and PyTorch give for k = 0): `Sum for f64` starts at -0.0.
                                let s = (0..k).fold(0.0, |s, p| {
                                    s + x[ao * m * k + i * k + p] * y[bo * k * nn + p * nn + j]
                                });
                                o[(bi * m + i) * nn + j] = s;
                            }
                        }
                    }
                    Buf::F(o)
                }
                (Buf::I(x), Buf::I(y)) => {
                    let mut o = vec![0i64; n];
                    for (bi, (&ao, &bo)) in am.iter().zip(&bm).enumerate() {
                        for i in 0..m {
                            for j in 0..nn {
                                o[(bi * m + i) * nn + j] = (0..k).fold(0i64, |s, p| {
                                    s.wrapping_add(
                                        x[ao * m * k + i * k + p]
                                            .wrapping_mul(y[bo * k * nn + p * nn + j]),
                                    )
                                });
                            }
                        }
                    }
                    Buf::I(o)
                }
                _ => unreachable!("type rules: numeric operands of one dtype"),
            }
        }
        OpKind::MatMulInteger => {
            // The operands less their zero points, multiplied as integers; the i32 result
            // wraps.
            let shifted = |v: &Val, z: &Val| {
                let map = bcast_map(z.dims(), v.dims());
                let (q, zero) = (v.i(), z.i());
                Val {
                    ty: v.ty.clone(),
                    buf: Buf::I(q.iter().zip(&map).map(|(&x, &i)| x - zero[i]).collect()),
                }
            };
            let (a, b) = (shifted(args[0], args[2]), shifted(args[1], args[3]));
            return eval(&OpKind::MatMul, &[&a, &b], tys);
        }
        OpKind::Conv2d(c) => {
            let (x, w) = (args[0].f(), args[1].f());
            let mut res = vec![0.0; n];
            conv_taps(
                c,
                args[0].dims(),
                args[1].dims(),
                out.dims(),
                |xi, wi, yi| res[yi] += x[xi] * w[wi],
            );
            Buf::F(res)
        }
        OpKind::ConvInteger(c) => {
            // The operands less their zero points (padding is the input's zero point, so it
            // adds nothing); the i32 sums wrap.
            let shifted = |v: &Val, z: &Val| -> Vec<i64> {
                let map = bcast_map(z.dims(), v.dims());
                let (q, zero) = (v.i(), z.i());
                q.iter().zip(&map).map(|(&x, &i)| x - zero[i]).collect()
            };
            let (x, w) = (shifted(args[0], args[2]), shifted(args[1], args[3]));
            let mut res = vec![0i32; n];
            conv_taps(
                c,
                args[0].dims(),
                args[1].dims(),
                out.dims(),
                |xi, wi, yi| res[yi] = res[yi].wrapping_add((x[xi] * w[wi]) as i32),
            );
            Buf::I(res.into_iter().map(i64::from).collect())
        }
        OpKind::Conv2dNchwc { conv, block } => {
            // `conv2d` on the plain input, then blocked.
            let (x, w) = (args[0], args[1]);
            let (d, wd) = (x.dims(), w.dims());
            let xd = [d[0], wd[1] * conv.groups, d[2], d[3]];
            let yd = [out.dims()[0], wd[0], out.dims()[2], out.dims()[3]];
            let plain = |dims: [u64; 4]| {
                TensorType::new(out.dtype(), dims.to_vec()).map_err(|e| e.to_string())
            };
            let x = Val {
                ty: plain(xd)?,
                buf: if d.len() == 5 {
                    from_nchwc(&x.buf, &xd, *block)
                } else {
                    x.buf.clone()
                },
            };
            let y = eval(&OpKind::Conv2d(conv.clone()), &[&x, w], &[plain(yd)?])?.remove(0);
            to_nchwc(&y.buf, &yd, *block)
        }
        OpKind::Conv2dGradInput { conv, .. } => {
            let (dy, w) = (args[0].f(), args[1].f());
            let mut res = vec![0.0; n];
            conv_taps(
                conv,
                out.dims(),
                args[1].dims(),
                args[0].dims(),
                |xi, wi, yi| res[xi] += dy[yi] * w[wi],
            );
            Buf::F(res)
        }
        OpKind::Conv2dGradFilter { conv, .. } => {
            let (x, dy) = (args[0].f(), args[1].f());
            let mut res = vec![0.0; n];
            conv_taps(
                conv,
                args[0].dims(),
                out.dims(),
                args[1].dims(),
                |xi, wi, yi| res[wi] += dy[yi] * x[xi],
            );
            Buf::F(res)
        }
        OpKind::MaxPool2d(_) | OpKind::AvgPool2d { .. } if args[0].dims().len() == 5 => {
            // Channel blocks: every lane pooled as a channel of its own.
            let (xd, yd) = (args[0].dims(), out.dims());
            let lanes = |d: &[u64]| [d[0], d[1] * d[4], d[2], d[3]];
            let plain = |d: &[u64]| TensorType::new(out.dtype(), lanes(d).to_vec());
            let x = Val {
                ty: plain(xd).map_err(|e| e.to_string())?,
                buf: from_nchwc(&args[0].buf, &lanes(xd), xd[4]),
            };
            let y = eval(kind, &[&x], &[plain(yd).map_err(|e| e.to_string())?])?.remove(0);
            to_nchwc(&y.buf, &lanes(yd), yd[4])
        }
        OpKind::MaxPool2d(p) | OpKind::AvgPool2d { pool: p, .. } => {
            let x = args[0];
            let [nb, ch, h, wd] = [0, 1, 2, 3].map(|i| x.dims()[i] as usize);
            let [_, _, oh, ow] = [0, 1, 2, 3].map(|i| out.dims()[i] as usize);
            let include_pad = matches!(
                kind,
                OpKind::AvgPool2d {
                    count_include_pad: true,
                    ..
                }
            );
            let is_max = matches!(kind, OpKind::MaxPool2d(_));
            let window = |b, c, y, xx| pool_window(p, [nb, ch, h, wd], [b, c, y, xx]);
            let dims = [nb as u64, ch as u64, oh as u64, ow as u64];
            let full = (p.kernel[0] * p.kernel[1]) as f64;
            match &x.buf {
                Buf::F(v) => {
                    let mut res = Vec::with_capacity(n);
                    for_each_index(&dims, |ix| {
                        let w = window(ix[0], ix[1], ix[2], ix[3]);
                        res.push(if is_max {
                            w.iter()
                                .fold(f64::NEG_INFINITY, |m, &i| binary_f(BinaryOp::Max, m, v[i]))
                        } else {
                            w.iter().map(|&i| v[i]).sum::<f64>()
                                / if include_pad { full } else { w.len() as f64 }
                        });
                    });
                    Buf::F(res)
                }
                Buf::I(v) => {
                    let mut res = Vec::with_capacity(n);
                    for_each_index(&dims, |ix| {
                        let w = window(ix[0], ix[1], ix[2], ix[3]);
                        res.push(
                            w.iter()
                                .map(|&i| v[i])
                                .max()
                                .expect("pads are smaller than the kernel"),
                        );
                    });
                    Buf::I(res)
                }
                Buf::B(_) => unreachable!("type rules forbid pooling bool"),
            }
        }
        OpKind::MaxPool2dGrad(p) => {
            let (x, dy) = (args[0].f(), args[1].f());
            let xd = [0, 1, 2, 3].map(|i| args[0].dims()[i] as usize);
            let mut res = vec![0.0; n];
            let mut k = 0;
            for_each_index(args[1].dims(), |ix| {
                let w = pool_window(p, xd, [ix[0], ix[1], ix[2], ix[3]]);
                // The first position holding the window's maximum (NaN counts as the maximum).
                let mut best = w[0];
                for &i in &w[1..] {
                    if x[i] > x[best] || (x[i].is_nan() && !x[best].is_nan()) {
                        best = i;
                    }
                }
                res[best] += dy[k];
                k += 1;
            });
            Buf::F(res)
        }
        OpKind::AvgPool2dGrad {
            pool: p,
            count_include_pad,
            ..
        } => {
            let dy = args[0].f();
            let xd = [0, 1, 2, 3].map(|i| out.dims()[i] as usize);
            let full = (p.kernel[0] * p.kernel[1]) as f64;
            let mut res = vec![0.0; n];
            let mut k = 0;
            for_each_index(args[0].dims(), |ix| {
                let w = pool_window(p, xd, [ix[0], ix[1], ix[2], ix[3]]);
                let div = if *count_include_pad {
                    full
                } else {
                    w.len() as f64
                };
                for &i in &w {
                    res[i] += dy[k] / div;
                }
                k += 1;
            });
            Buf::F(res)
        }
        OpKind::GlobalAvgPool => {
            let x = args[0].f();
            let hw = numel(&args[0].dims()[2..]);
            Buf::F(
                (0..n)
                    .map(|k| x[k * hw..(k + 1) * hw].iter().sum::<f64>() / hw as f64)
                    .collect(),
            )
        }
        OpKind::Reduce { op, axes, .. } => reduce(*op, args[0], axes, out)?,
        OpKind::Softmax { axis } => softmax(args[0], *axis, false),
        OpKind::LogSoftmax { axis } => softmax(args[0], *axis, true),
        OpKind::SoftmaxCrossEntropyGrad => {
            let (x, labels, dy) = (args[0], args[1].i(), args[2].f()[0]);
            let (rows, classes) = (x.dims()[0] as usize, x.dims()[1] as usize);
            let Buf::F(mut p) = softmax(x, 1, false) else {
                unreachable!()
            };
            for (r, &l) in labels.iter().enumerate() {
                if !(0..classes as i64).contains(&l) {
                    return Err(format!(
                        "label {l} in row {r} is out of range for {classes} classes"
                    ));
                }
                p[r * classes + l as usize] -= 1.0;
            }
            let k = dy / rows as f64;
            Buf::F(p.into_iter().map(|v| v * k).collect())
        }
        OpKind::SoftmaxCrossEntropy => {
            let (x, labels) = (args[0], args[1].i());
            let (rows, classes) = (x.dims()[0] as usize, x.dims()[1] as usize);
            let logp = softmax(x, 1, true);
            let Buf::F(lp) = logp else { unreachable!() };
            let mut total = 0.0;
            for (r, &l) in labels.iter().enumerate() {
                if !(0..classes as i64).contains(&l) {
                    return Err(format!(
                        "label {l} in row {r} is out of range for {classes} classes"
                    ));
                }
                total -= lp[r * classes + l as usize];
            }
            Buf::F(vec![total / rows as f64])
        }
        OpKind::BatchNorm { eps } => {
            let [g, b, m, v] = [1, 2, 3, 4].map(|i| args[i].f());
            normalize(args[0], g, b, m, v, eps.0)
        }
        OpKind::TopK { k, axis, largest } => {
            let a = normalize_axis(*axis, args[0].ty.rank()).expect("verified axis");
            let (outer, len, inner) = split(args[0].dims(), a);
            let k = *k as usize;
            let key = |i: usize| match &args[0].buf {
                Buf::F(v) => v[i],
                Buf::I(v) => v[i] as f64,
                Buf::B(_) => unreachable!("type rules: numeric"),
            };
            // Descending (or ascending) by value, NaN above every number, ties by index.
            let order = |x: f64, y: f64| {
                let c = match (x.is_nan(), y.is_nan()) {
                    (true, true) => std::cmp::Ordering::Equal,
                    (true, false) => std::cmp::Ordering::Greater,
                    (false, true) => std::cmp::Ordering::Less,
                    _ => x.partial_cmp(&y).expect("not NaN"),
                };
                if *largest { c.reverse() } else { c }
            };
            let mut picked = Vec::with_capacity(outer * k * inner);
            let mut index = vec![0usize; outer * k * inner];
            let mut line: Vec<usize> = Vec::with_capacity(len);
            for o in 0..outer {
                for i in 0..inner {
                    line.clear();
                    line.extend(0..len);
                    let at = |j: usize| (o * len + j) * inner + i;
                    line.sort_by(|&p, &q| order(key(at(p)), key(at(q))).then(p.cmp(&q)));
                    for (r, &j) in line[..k].iter().enumerate() {
                        index[(o * k + r) * inner + i] = j;
                    }
                }
            }
            for o in 0..outer {
                for r in 0..k {
                    for i in 0..inner {
                        picked.push((o * len + index[(o * k + r) * inner + i]) * inner + i);
                    }
                }
            }
            let values = take(&args[0].buf, picked.into_iter());
            let indices = Buf::I(index.into_iter().map(|j| j as i64).collect());
            return Ok(vec![make(&tys[0], values), make(&tys[1], indices)]);
        }
        OpKind::BatchNormTrain { eps } => {
            let (mean, var) = batch_stats(args[0]);
            let y = normalize(args[0], args[1].f(), args[2].f(), &mean, &var, eps.0);
            return Ok(vec![
                make(&tys[0], y),
                make(&tys[1], Buf::F(mean)),
                make(&tys[2], Buf::F(var)),
            ]);
        }
        OpKind::Transpose { perm } => {
            let ins = strides(args[0].dims());
            let st: Vec<usize> = perm.iter().map(|&p| ins[p as usize]).collect();
            let mut idx = Vec::with_capacity(n);
            for_each_index(out.dims(), |ix| {
                idx.push(ix.iter().zip(&st).map(|(i, s)| i * s).sum())
            });
            take(&args[0].buf, idx.into_iter())
        }
        OpKind::Concat { axis } => {
            let a = normalize_axis(*axis, out.rank()).expect("verified axis");
            let (outer, _, inner) = split(out.dims(), a);
            let mut idx: Vec<(usize, usize)> = Vec::with_capacity(n);
            for o in 0..outer {
                for (t, v) in args.iter().enumerate() {
                    let slab = v.dims()[a] as usize * inner;
                    idx.extend((0..slab).map(|i| (t, o * slab + i)));
                }
            }
            match &args[0].buf {
                Buf::F(_) => Buf::F(idx.iter().map(|&(t, i)| args[t].f()[i]).collect()),
                Buf::I(_) => Buf::I(idx.iter().map(|&(t, i)| args[t].i()[i]).collect()),
                Buf::B(_) => Buf::B(idx.iter().map(|&(t, i)| args[t].b()[i]).collect()),
            }
        }
        OpKind::ToNchwc { block } => to_nchwc(&args[0].buf, args[0].dims(), *block),
        OpKind::FromNchwc { .. } => {
            let b = *args[0].dims().last().expect("type rules: rank 3 or more");
            from_nchwc(&args[0].buf, out.dims(), b)
        }
        OpKind::Slice {
            starts,
            ends,
            steps,
        } => {
            let dims = args[0].dims();
            let ins = strides(dims);
            let starts: Vec<i64> = (0..dims.len())
                .map(|i| slice_range(dims[i], starts[i], ends[i], steps[i]).0)
                .collect();
            let mut idx = Vec::with_capacity(n);
            for_each_index(out.dims(), |ix| {
                idx.push(
                    (0..ix.len())
                        .map(|a| (starts[a] + ix[a] as i64 * steps[a]) as usize * ins[a])
                        .sum(),
                )
            });
            take(&args[0].buf, idx.into_iter())
        }
        OpKind::SliceGrad {
            starts,
            ends,
            steps,
            ..
        } => {
            let dims = out.dims();
            let outs = strides(dims);
            let starts: Vec<i64> = (0..dims.len())
                .map(|i| slice_range(dims[i], starts[i], ends[i], steps[i]).0)
                .collect();
            let dy = args[0].f();
            let mut res = vec![0.0; n];
            let mut k = 0;
            for_each_index(args[0].dims(), |ix| {
                let t: usize = (0..ix.len())
                    .map(|a| (starts[a] + ix[a] as i64 * steps[a]) as usize * outs[a])
                    .sum();
                res[t] = dy[k];
                k += 1;
            });
            Buf::F(res)
        }
        OpKind::Gather { axis } => {
            let a = normalize_axis(*axis, args[0].ty.rank()).expect("verified axis");
            let (outer, len, inner) = split(args[0].dims(), a);
            let ids = args[1].i();
            let mut idx = Vec::with_capacity(n);
            for o in 0..outer {
                for &j in ids {
                    let j = index(j, len)?;
                    idx.extend((0..inner).map(|i| (o * len + j) * inner + i));
                }
            }
            take(&args[0].buf, idx.into_iter())
        }
        OpKind::ScatterAdd { axis } => {
            let a = normalize_axis(*axis, args[0].ty.rank()).expect("verified axis");
            let (outer, len, inner) = split(args[0].dims(), a);
            let ids = args[1].i();
            let mut targets = Vec::with_capacity(numel(args[2].dims()));
            for o in 0..outer {
                for &j in ids {
                    let j = index(j, len)?;
                    targets.extend((0..inner).map(|i| (o * len + j) * inner + i));
                }
            }
            match (&args[0].buf, &args[2].buf) {
                (Buf::F(d), Buf::F(u)) => {
                    let mut o = d.clone();
                    targets.iter().zip(u).for_each(|(&t, &x)| o[t] += x);
                    Buf::F(o)
                }
                (Buf::I(d), Buf::I(u)) => {
                    let mut o = d.clone();
                    targets
                        .iter()
                        .zip(u)
                        .for_each(|(&t, &x)| o[t] = o[t].wrapping_add(x));
                    Buf::I(o)
                }
                _ => unreachable!("type rules: numeric data and updates of one dtype"),
            }
        }
    };
    Ok(vec![make(out, buf)])
}

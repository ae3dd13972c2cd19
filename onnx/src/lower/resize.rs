//! `Resize` (and the older `Upsample`), one axis at a time.
//!
//! Interpolation is separable, so each resized axis is its own step: the source position of
//! every output index is computed at import time (in f64, as ONNX's reference does), with the
//! `n` input neighbours it reads and their weights (`n` is 2 for nearest and linear, 4 for
//! cubic, more for antialiased downsampling). The step is then `n` constant-index `gather`s
//! along the axis, each times its weight column, summed; nearest becomes a single gather
//! because its weights are one-hot. Everything is an ordinary differentiable op (the gradient
//! of `gather` is a `scatter_add`), so resized models train too.

use crate::ctx::{Ctx, Node, binary, const_input, tensor_i64};
use crate::{Error, Result};
use tcc_ir::{BinaryOp, DType, Data, OpKind, Tensor, Value};

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Nearest,
    Linear,
    Cubic,
}

#[derive(Clone, Copy, PartialEq)]
enum Transform {
    HalfPixel,
    HalfPixelSymmetric,
    PytorchHalfPixel,
    AlignCorners,
    Asymmetric,
    TfCropAndResize,
}

#[derive(Clone, Copy, PartialEq)]
enum Nearest {
    RoundPreferFloor,
    RoundPreferCeil,
    Floor,
    Ceil,
}

/// How one axis is resized.
struct Options {
    mode: Mode,
    transform: Transform,
    nearest: Nearest,
    cubic_a: f64,
    exclude_outside: bool,
    extrapolation: f64,
    antialias: bool,
}

/// `Resize` (opset 10 and newer) and `Upsample` (7 to 9).
pub(super) fn resize(cx: &mut Ctx, n: &Node) -> Result<Value> {
    let x = n.input(0, "X")?;
    let dims = cx.dims(x);
    let r = dims.len();
    let upsample = n.op_type() == "Upsample";
    let opset10 = upsample || n.opset < 11;
    let mode = match n.string("mode", "nearest")?.as_str() {
        "nearest" => Mode::Nearest,
        "linear" | "bilinear" => Mode::Linear,
        "cubic" if !upsample => Mode::Cubic,
        other => return Err(Error::invalid(format!("unknown mode `{other}`"))),
    };
    let transform = if opset10 {
        Transform::Asymmetric
    } else {
        match n
            .string("coordinate_transformation_mode", "half_pixel")?
            .as_str()
        {
            "half_pixel" => Transform::HalfPixel,
            "half_pixel_symmetric" => Transform::HalfPixelSymmetric,
            "pytorch_half_pixel" => Transform::PytorchHalfPixel,
            "align_corners" => Transform::AlignCorners,
            "asymmetric" => Transform::Asymmetric,
            "tf_crop_and_resize" => Transform::TfCropAndResize,
            "tf_half_pixel_for_nn" => {
                return n.unsupported("coordinate_transformation_mode=\"tf_half_pixel_for_nn\"");
            }
            other => {
                return Err(Error::invalid(format!(
                    "unknown coordinate_transformation_mode `{other}`"
                )));
            }
        }
    };
    let nearest = if opset10 {
        Nearest::Floor
    } else {
        match n.string("nearest_mode", "round_prefer_floor")?.as_str() {
            "round_prefer_floor" => Nearest::RoundPreferFloor,
            "round_prefer_ceil" => Nearest::RoundPreferCeil,
            "floor" => Nearest::Floor,
            "ceil" => Nearest::Ceil,
            other => return Err(Error::invalid(format!("unknown nearest_mode `{other}`"))),
        }
    };
    let opts = Options {
        mode,
        transform,
        nearest,
        cubic_a: n.float("cubic_coeff_a", -0.75)? as f64,
        exclude_outside: n.int("exclude_outside", 0)? != 0,
        extrapolation: n.float("extrapolation_value", 0.0)? as f64,
        antialias: n.int("antialias", 0)? != 0,
    };
    if opts.antialias && mode == Mode::Nearest {
        return Err(Error::invalid(
            "antialias applies to linear and cubic modes only",
        ));
    }
    if mode != Mode::Nearest && !cx.dtype(x).is_float() {
        return n.unsupported(format_args!(
            "a {} input in a non-nearest mode",
            cx.dtype(x)
        ));
    }

    // The resized axes, and per axis its scale, output size and region of interest.
    let axes: Vec<usize> = match n.ints("axes")? {
        Some(a) => a
            .iter()
            .map(|&a| crate::ctx::axis(a, r))
            .collect::<Result<_>>()?,
        None => (0..r).collect(),
    };
    let floats = |t: &Tensor| -> Vec<f64> {
        (0..t.ty().numel() as usize)
            .map(|i| t.data().get(i).to_f64())
            .collect()
    };
    let present = |i: usize| n.opt(i).filter(|&v| cx.ty(v).numel() > 0);
    let (roi, scales, sizes) = if upsample && n.opset < 9 {
        let s = n
            .floats("scales")?
            .ok_or_else(|| Error::invalid("Upsample needs `scales`"))?;
        (
            None,
            Some(s.iter().map(|&v| v as f64).collect::<Vec<f64>>()),
            None,
        )
    } else if opset10 {
        (None, Some(floats(&const_input(cx, n, 1, "scales")?)), None)
    } else {
        let roi = present(1)
            .map(|_| const_input(cx, n, 1, "roi"))
            .transpose()?;
        let scales = present(2)
            .map(|_| const_input(cx, n, 2, "scales"))
            .transpose()?;
        let sizes = present(3)
            .map(|_| crate::ctx::const_ints(cx, n, 3, "sizes"))
            .transpose()?;
        (roi.map(|t| floats(&t)), scales.map(|t| floats(&t)), sizes)
    };
    let k = axes.len();
    let mut scale = vec![1.0f64; r];
    let mut out: Vec<u64> = dims.clone();
    match (scales, sizes) {
        (Some(s), None) => {
            if s.len() != k {
                return Err(Error::invalid(format!(
                    "scales has {} entries for {k} resized axes",
                    s.len()
                )));
            }
            for (&a, &s) in axes.iter().zip(&s) {
                if s.is_nan() || s <= 0.0 || s.is_infinite() {
                    return Err(Error::invalid(format!("scale {s} must be positive")));
                }
                scale[a] = s;
                out[a] = (s * dims[a] as f64) as u64;
            }
        }
        (None, Some(sz)) => {
            if sz.len() != k {
                return Err(Error::invalid(format!(
                    "sizes has {} entries for {k} resized axes",
                    sz.len()
                )));
            }
            let sz = crate::ctx::non_negative(&sz, "sizes")?;
            for (&a, &s) in axes.iter().zip(&sz) {
                if dims[a] == 0 {
                    return Err(Error::invalid("cannot resize an axis of size 0"));
                }
                scale[a] = s as f64 / dims[a] as f64;
                out[a] = s;
            }
            let policy = n.string("keep_aspect_ratio_policy", "stretch")?;
            let pick =
                |f: fn(f64, f64) -> f64| axes.iter().map(|&a| scale[a]).fold(scale[axes[0]], f);
            let s = match policy.as_str() {
                "stretch" => None,
                "not_larger" => Some(pick(f64::min)),
                "not_smaller" => Some(pick(f64::max)),
                other => {
                    return Err(Error::invalid(format!(
                        "unknown keep_aspect_ratio_policy `{other}`"
                    )));
                }
            };
            if let Some(s) = s.filter(|_| k > 0) {
                for &a in &axes {
                    scale[a] = s;
                    out[a] = (s * dims[a] as f64 + 0.5) as u64;
                }
            }
        }
        (Some(_), Some(_)) => {
            return Err(Error::invalid("give scales or sizes, not both"));
        }
        (None, None) => return Err(Error::invalid("needs scales or sizes")),
    }
    let roi = match roi {
        Some(v) if v.len() == 2 * k => Some(v),
        Some(v) => {
            return Err(Error::invalid(format!(
                "roi has {} entries, expected {} (starts then ends of the resized axes)",
                v.len(),
                2 * k
            )));
        }
        None if transform == Transform::TfCropAndResize => {
            return Err(Error::invalid("tf_crop_and_resize needs roi"));
        }
        None => None,
    };
    if out.iter().product::<u64>() > 1 << 40 {
        return Err(Error::invalid(format!(
            "the output {out:?} is absurdly large"
        )));
    }

    let mut y = x;
    for (i, &a) in axes.iter().enumerate() {
        let axis_roi = roi.as_ref().map(|v| [v[i], v[k + i]]);
        let trivial_roi = axis_roi.is_none_or(|[s, e]| s == 0.0 && e == 1.0);
        if (scale[a] - 1.0).abs() < 1e-9 && out[a] == dims[a] && trivial_roi {
            continue;
        }
        let plan = plan_axis(&opts, dims[a], out[a], scale[a], axis_roi);
        y = apply(cx, y, a, &plan, opts.extrapolation)?;
    }
    Ok(y)
}

/// One axis's resize: per output index, `n` input indices and their weights, and whether it
/// lies outside the region (tf_crop_and_resize's extrapolation).
struct AxisPlan {
    out: usize,
    n: usize,
    /// `[out][n]`, row-major.
    index: Vec<i64>,
    weight: Vec<f64>,
    outside: Vec<bool>,
}

/// The neighbours and weights of each output index along an axis of `len` resized to `out`,
/// exactly as ONNX's reference computes them.
fn plan_axis(o: &Options, len: u64, out: u64, scale: f64, roi: Option<[f64; 2]>) -> AxisPlan {
    let (len_f, width) = (len as f64, scale * len as f64);
    let mut rows: Vec<(f64, bool)> = Vec::with_capacity(out as usize);
    for j in 0..out {
        let y = j as f64;
        let (x, outside) = match o.transform {
            Transform::AlignCorners if width == 1.0 => (0.0, false),
            Transform::AlignCorners => (y * (len_f - 1.0) / (width - 1.0), false),
            Transform::Asymmetric => (y / scale, false),
            Transform::TfCropAndResize => {
                let [s, e] = roi.unwrap_or([0.0, 1.0]);
                let x = if width == 1.0 {
                    (e - s) * (len_f - 1.0) / 2.0
                } else {
                    y * (e - s) * (len_f - 1.0) / (width - 1.0)
                } + s * (len_f - 1.0);
                (x, x < 0.0 || x > len_f - 1.0)
            }
            Transform::PytorchHalfPixel if width == 1.0 => (-0.5, false),
            Transform::PytorchHalfPixel | Transform::HalfPixel => ((y + 0.5) / scale - 0.5, false),
            Transform::HalfPixelSymmetric => {
                let adjustment = out as f64 / width;
                let offset = len_f / 2.0 * (1.0 - adjustment);
                (offset + (y + 0.5) / scale - 0.5, false)
            }
        };
        rows.push((x, outside));
    }
    let coeffs = |ratio: f64| -> Vec<f64> {
        match o.mode {
            Mode::Nearest => {
                let up = if ratio == 1.0 {
                    true
                } else {
                    match o.nearest {
                        Nearest::RoundPreferFloor => ratio > 0.5,
                        Nearest::RoundPreferCeil => ratio >= 0.5,
                        Nearest::Floor => false,
                        Nearest::Ceil => true,
                    }
                };
                vec![if up { 0.0 } else { 1.0 }, if up { 1.0 } else { 0.0 }]
            }
            Mode::Linear if o.antialias => {
                let s = scale.min(1.0);
                let start = (-1.0 / s).floor() as i64 + 1;
                let footprint = 2 - 2 * start;
                let c: Vec<f64> = (start..start + footprint)
                    .map(|i| (1.0 - ((i as f64 - ratio) * s).abs()).clamp(0.0, 1.0))
                    .collect();
                let sum: f64 = c.iter().sum();
                c.iter().map(|v| v / sum).collect()
            }
            Mode::Linear => vec![1.0 - ratio, ratio],
            Mode::Cubic if o.antialias => {
                let s = scale.min(1.0);
                let a = o.cubic_a;
                let w = |x: f64| {
                    let x = x.abs();
                    let (x2, x3) = (x * x, x * x * x);
                    if x <= 1.0 {
                        (a + 2.0) * x3 - (a + 3.0) * x2 + 1.0
                    } else if x < 2.0 {
                        a * x3 - 5.0 * a * x2 + 8.0 * a * x - 4.0 * a
                    } else {
                        0.0
                    }
                };
                let start = (-2.0 / s).floor() as i64 + 1;
                let c: Vec<f64> = (start..2 - start)
                    .map(|i| w(s * (i as f64 - ratio)))
                    .collect();
                let sum: f64 = c.iter().sum();
                c.iter().map(|v| v / sum).collect()
            }
            Mode::Cubic => {
                let (a, r) = (o.cubic_a, ratio);
                let q = 1.0 - r;
                vec![
                    ((a * (r + 1.0) - 5.0 * a) * (r + 1.0) + 8.0 * a) * (r + 1.0) - 4.0 * a,
                    ((a + 2.0) * r - (a + 3.0)) * r * r + 1.0,
                    ((a + 2.0) * q - (a + 3.0)) * q * q + 1.0,
                    ((a * (q + 1.0) - 5.0 * a) * (q + 1.0) + 8.0 * a) * (q + 1.0) - 4.0 * a,
                ]
            }
        }
    };
    let n = coeffs(0.5).len();
    let pad = n.div_ceil(2) as f64;
    let mut plan = AxisPlan {
        out: out as usize,
        n,
        index: Vec::with_capacity(out as usize * n),
        weight: Vec::with_capacity(out as usize * n),
        outside: Vec::with_capacity(out as usize),
    };
    for (x, outside) in rows {
        let ratio = if x == x.floor() { 1.0 } else { x - x.floor() };
        let mut c = coeffs(ratio);
        // The n neighbours nearest x (ties to the smaller index), in edge-padded coordinates.
        let xp = x + pad;
        let p = xp.floor();
        let frac = xp - p;
        let offset = if n % 2 == 0 {
            if frac == 0.0 {
                -(n as i64 / 2)
            } else {
                -(n as i64 / 2) + 1
            }
        } else {
            let base = -((n as i64 - 1) / 2);
            if frac <= 0.5 { base } else { base + 1 }
        };
        let start = p as i64 + offset - pad as i64;
        let idx: Vec<i64> = (0..n as i64).map(|k| start + k).collect();
        if o.exclude_outside {
            for (ck, &i) in c.iter_mut().zip(&idx) {
                if i < 0 || i >= len as i64 {
                    *ck = 0.0;
                }
            }
            let sum: f64 = c.iter().sum();
            let sum = if sum == 0.0 { 1.0 } else { sum };
            c.iter_mut().for_each(|v| *v /= sum);
        }
        plan.index
            .extend(idx.iter().map(|&i| i.clamp(0, len as i64 - 1)));
        plan.weight.extend(c);
        plan.outside.push(outside);
    }
    plan
}

/// Resizes axis `a` of `y` by `plan`.
fn apply(cx: &mut Ctx, y: Value, a: usize, plan: &AxisPlan, extrapolation: f64) -> Result<Value> {
    let dt = cx.dtype(y);
    let rank = cx.dims(y).len();
    let (out, n) = (plan.out, plan.n);
    let gather = |cx: &mut Ctx, idx: Vec<i64>| -> Result<Value> {
        let idx = cx.constant(tensor_i64(&[out as u64], idx)?)?;
        cx.op1(OpKind::Gather { axis: a as i64 }, &[y, idx])
    };
    // A weight column shaped to broadcast along axis a.
    let mut wdims = vec![1u64; rank - a];
    wdims[0] = out as u64;
    let column = |cx: &mut Ctx, v: Vec<f64>| -> Result<Value> {
        let data = match dt {
            DType::F64 => Data::F64(v),
            _ => Data::F32(v.into_iter().map(|x| x as f32).collect()),
        };
        let t = Tensor::from_data(&wdims, data).map_err(|e| Error::invalid(e.to_string()))?;
        cx.constant(t)
    };
    let one_hot = (0..out).all(|j| {
        let w = &plan.weight[j * n..(j + 1) * n];
        w.iter().filter(|&&v| v == 1.0).count() == 1 && w.iter().all(|&v| v == 0.0 || v == 1.0)
    });
    let mut acc = if one_hot || !dt.is_float() {
        // Nearest: each output reads the one neighbour of weight 1.
        let picked = (0..out)
            .map(|j| {
                let w = &plan.weight[j * n..(j + 1) * n];
                let k = w.iter().position(|&v| v == 1.0).unwrap_or(0);
                plan.index[j * n + k]
            })
            .collect();
        gather(cx, picked)?
    } else {
        let mut acc: Option<Value> = None;
        for k in 0..n {
            let w: Vec<f64> = (0..out).map(|j| plan.weight[j * n + k]).collect();
            if w.iter().all(|&v| v == 0.0) {
                continue;
            }
            let g = gather(cx, (0..out).map(|j| plan.index[j * n + k]).collect())?;
            let wv = column(cx, w)?;
            let t = binary(cx, BinaryOp::Mul, g, wv)?;
            acc = Some(match acc {
                Some(s) => binary(cx, BinaryOp::Add, s, t)?,
                None => t,
            });
        }
        match acc {
            Some(v) => v,
            None => {
                // Every weight zero (exclude_outside with nothing inside): zeros.
                let g = gather(cx, vec![0; out])?;
                let z = cx.scalar(dt, 0.0)?;
                binary(cx, BinaryOp::Mul, g, z)?
            }
        }
    };
    if plan.outside.iter().any(|&o| o) {
        let mask = Tensor::from_data(&wdims, Data::Bool(plan.outside.clone()))
            .map_err(|e| Error::invalid(e.to_string()))?;
        let mask = cx.constant(mask)?;
        let e = cx.scalar(dt, extrapolation)?;
        acc = cx.op1(OpKind::Select, &[mask, e, acc])?;
    }
    Ok(acc)
}

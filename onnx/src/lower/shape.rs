//! Data movement: Reshape targets, Slice, Split, Pad, Trilu, and constants.

use crate::ctx::{Ctx, Node, axis, const_input, const_ints, non_negative, tensor_i64};
use crate::proto::attribute_proto::AttributeType;
use crate::{Error, Result, tensor};
use tcc_ir::{Data, OpKind, Scalar, Tensor, TensorType, Value};

/// `x` with `before` and `after` elements of `fill` added along `axis`.
pub(super) fn pad_axis(
    cx: &mut Ctx,
    x: Value,
    axis: usize,
    before: u64,
    after: u64,
    fill: f64,
) -> Result<Value> {
    if before == 0 && after == 0 {
        return Ok(x);
    }
    let dt = cx.dtype(x);
    let mut parts = Vec::with_capacity(3);
    for (count, is_x) in [(before, false), (0, true), (after, false)] {
        if is_x {
            parts.push(x);
        } else if count > 0 {
            let mut dims = cx.dims(x);
            dims[axis] = count;
            let ty = TensorType::new(dt, dims).map_err(|e| Error::invalid(e.to_string()))?;
            parts.push(cx.splat(ty, Scalar::from_f64(dt, fill))?);
        }
    }
    cx.op1(OpKind::Concat { axis: axis as i64 }, &parts)
}

/// `Split`: slices along `axis`, sized by the `split` input (opset 13+), the `split` attribute,
/// or evenly (`num_outputs` from opset 18, else the output count; the last part smaller).
pub(super) fn split(cx: &mut Ctx, n: &Node) -> Result<Vec<Option<Value>>> {
    let x = n.input(0, "input")?;
    let dims = cx.dims(x);
    let a = axis(n.int("axis", 0)?, dims.len())?;
    let len = dims[a];
    let outs = n.p.output.len() as u64;
    let sizes: Vec<u64> = match if n.opset >= 13 {
        n.opt(1)
            .map(|_| const_ints(cx, n, 1, "split"))
            .transpose()?
    } else {
        n.ints("split")?
    } {
        Some(s) => non_negative(&s, "split")?,
        None => {
            let parts = if n.opset >= 18 {
                n.attr("num_outputs")
                    .map(|_| n.int("num_outputs", 0))
                    .transpose()?
                    .unwrap_or(outs as i64) as u64
            } else {
                outs
            };
            if parts == 0 {
                return Err(Error::invalid("Split into 0 parts"));
            }
            let each = len.div_ceil(parts);
            (0..parts)
                .map(|i| each.min(len.saturating_sub(i * each)))
                .collect()
        }
    };
    if sizes.iter().sum::<u64>() != len {
        return Err(Error::invalid(format!(
            "split sizes {sizes:?} do not add up to axis {a} of length {len}"
        )));
    }
    let r = dims.len();
    let mut start = 0;
    let mut res = Vec::with_capacity(sizes.len());
    for &sz in &sizes {
        let (mut starts, mut ends, steps) = (vec![0; r], vec![i64::MAX; r], vec![1; r]);
        starts[a] = start as i64;
        ends[a] = (start + sz) as i64;
        res.push(Some(cx.op1(
            OpKind::Slice {
                starts,
                ends,
                steps,
            },
            &[x],
        )?));
        start += sz;
    }
    Ok(res)
}

/// `Pad` in `constant` mode: negative pads crop (a slice), positive ones concatenate constant
/// blocks.
pub(super) fn pad(cx: &mut Ctx, n: &Node) -> Result<Value> {
    let x = n.input(0, "data")?;
    let mode = n.string("mode", "constant")?;
    if !matches!(mode.as_str(), "constant" | "reflect" | "edge" | "wrap") {
        return Err(Error::invalid(format!(
            "unknown mode `{mode}` (constant, reflect, edge or wrap)"
        )));
    }
    let r = cx.ty(x).rank();
    let (pads, value, axes) = if n.opset < 11 {
        let p = n
            .ints("pads")?
            .ok_or_else(|| Error::invalid("Pad needs `pads`"))?;
        (p, n.float("value", 0.0)? as f64, None)
    } else {
        let p = const_ints(cx, n, 1, "pads")?;
        let v = match n.opt(2) {
            Some(_) => {
                let t = const_input(cx, n, 2, "constant_value")?;
                if t.ty().numel() == 0 {
                    0.0
                } else {
                    t.data().get(0).to_f64()
                }
            }
            None => 0.0,
        };
        let axes = n.opt(3).map(|_| const_ints(cx, n, 3, "axes")).transpose()?;
        (p, v, axes)
    };
    let axes: Vec<usize> = match axes {
        Some(a) => a.iter().map(|&a| axis(a, r)).collect::<Result<_>>()?,
        None => (0..r).collect(),
    };
    let k = axes.len();
    if pads.len() != 2 * k {
        return Err(Error::invalid(format!(
            "pads {pads:?} must have 2 entries per padded axis ({k} axes)"
        )));
    }
    // Crop first (negative pads), then pad.
    let dims = cx.dims(x);
    let (mut starts, mut ends, steps) = (vec![0i64; r], vec![i64::MAX; r], vec![1i64; r]);
    let mut crop = false;
    for (i, &a) in axes.iter().enumerate() {
        let (b, e) = (pads[i], pads[k + i]);
        if b < 0 {
            starts[a] = -b;
            crop = true;
        }
        if e < 0 {
            ends[a] = dims[a] as i64 + e;
            crop = true;
        }
    }
    let mut y = x;
    if crop {
        y = cx.op1(
            OpKind::Slice {
                starts,
                ends,
                steps,
            },
            &[x],
        )?;
    }
    for (i, &a) in axes.iter().enumerate() {
        let (b, e) = (pads[i].max(0) as u64, pads[k + i].max(0) as u64);
        if b > 1 << 40 || e > 1 << 40 {
            return Err(Error::invalid(format!("pads {pads:?} are absurdly large")));
        }
        y = match mode.as_str() {
            "constant" => pad_axis(cx, y, a, b, e, value)?,
            _ => pad_from_inside(cx, y, a, b, e, &mode)?,
        };
    }
    Ok(y)
}

/// Pads axis `a` with values taken from the tensor itself, as numpy's `pad` modes do:
/// `reflect` mirrors without repeating the edge, `edge` repeats it, `wrap` continues from the
/// other end. One constant-index `gather` (so it is differentiable).
fn pad_from_inside(
    cx: &mut Ctx,
    x: Value,
    a: usize,
    before: u64,
    after: u64,
    mode: &str,
) -> Result<Value> {
    if before == 0 && after == 0 {
        return Ok(x);
    }
    let len = cx.dims(x)[a] as i64;
    if len == 0 {
        return Err(Error::invalid(format!(
            "cannot pad an empty axis {a} in mode `{mode}`"
        )));
    }
    let total = before + len as u64 + after;
    let index: Vec<i64> = (0..total as i64)
        .map(|i| {
            let j = i - before as i64;
            match mode {
                "edge" => j.clamp(0, len - 1),
                "wrap" => j.rem_euclid(len),
                _ if len == 1 => 0,
                _ => {
                    let period = 2 * (len - 1);
                    let k = j.rem_euclid(period);
                    if k >= len { period - k } else { k }
                }
            }
        })
        .collect();
    let idx = cx.constant(tensor_i64(&[total], index)?)?;
    cx.op1(OpKind::Gather { axis: a as i64 }, &[x, idx])
}

/// `Trilu`: the lower (`upper=0`) or upper triangle of the last two axes, shifted by `k`, as a
/// select with a constant mask.
pub(super) fn trilu(cx: &mut Ctx, n: &Node) -> Result<Value> {
    let x = n.input(0, "input")?;
    let dims = cx.dims(x);
    let r = dims.len();
    if r < 2 {
        return Err(Error::invalid(format!(
            "Trilu needs rank 2 or more, found {}",
            cx.ty(x)
        )));
    }
    let k = match n.opt(1) {
        Some(_) => const_input(cx, n, 1, "k")?.data().get(0).to_f64() as i64,
        None => 0,
    };
    let upper = n.int("upper", 1)? != 0;
    let (rows, cols) = (dims[r - 2], dims[r - 1]);
    if rows.saturating_mul(cols) > 1 << 24 {
        return n.unsupported(format_args!("a {rows}x{cols} matrix"));
    }
    let mask: Vec<bool> = (0..rows as i64)
        .flat_map(|i| (0..cols as i64).map(move |j| if upper { j - i >= k } else { j - i <= k }))
        .collect();
    let m = cx.constant(
        Tensor::from_data(&[rows, cols], Data::Bool(mask)).map_err(|e| Error::invalid(e.0))?,
    )?;
    let zero = cx.scalar(cx.dtype(x), 0.0)?;
    cx.op1(OpKind::Select, &[m, x, zero])
}

/// `Reshape`'s target: `0` copies the input dim (unless `allowzero`), one `-1` is inferred.
pub(super) fn reshape_dims(input: &[u64], shape: &[i64], allowzero: bool) -> Result<Vec<u64>> {
    let mut dims = Vec::with_capacity(shape.len());
    let mut infer = None;
    for (i, &s) in shape.iter().enumerate() {
        dims.push(match s {
            -1 if infer.is_none() => {
                infer = Some(i);
                1
            }
            -1 => {
                return Err(Error::invalid(format!(
                    "shape {shape:?} has more than one -1"
                )));
            }
            0 if !allowzero => *input.get(i).ok_or_else(|| {
                Error::invalid(format!(
                    "shape {shape:?} copies dimension {i} (0), but the input has rank {}",
                    input.len()
                ))
            })?,
            s if s >= 0 => s as u64,
            s => {
                return Err(Error::invalid(format!(
                    "shape {shape:?} has a negative entry {s}"
                )));
            }
        });
    }
    let total: u128 = input.iter().map(|&d| d as u128).product();
    if let Some(i) = infer {
        let known: u128 = dims.iter().map(|&d| d as u128).product();
        if known == 0 || !total.is_multiple_of(known) {
            return Err(Error::invalid(format!(
                "cannot reshape {input:?} to {shape:?}: {total} elements do not divide evenly"
            )));
        }
        dims[i] = (total / known) as u64;
    }
    if dims.iter().map(|&d| d as u128).product::<u128>() != total {
        return Err(Error::invalid(format!(
            "cannot reshape {input:?} ({total} elements) to {shape:?}"
        )));
    }
    Ok(dims)
}

pub(super) fn slice(cx: &mut Ctx, n: &Node) -> Result<Value> {
    let x = n.input(0, "data")?;
    let dims = cx.dims(x);
    let r = dims.len();
    let (starts, ends, axes, steps) = if n.opset < 10 {
        let starts = n
            .ints("starts")?
            .ok_or_else(|| Error::invalid("Slice needs `starts`"))?;
        let ends = n
            .ints("ends")?
            .ok_or_else(|| Error::invalid("Slice needs `ends`"))?;
        (starts, ends, n.ints("axes")?, None)
    } else {
        let starts = const_ints(cx, n, 1, "starts")?;
        let ends = const_ints(cx, n, 2, "ends")?;
        let axes = n.opt(3).map(|_| const_ints(cx, n, 3, "axes")).transpose()?;
        let steps = n
            .opt(4)
            .map(|_| const_ints(cx, n, 4, "steps"))
            .transpose()?;
        (starts, ends, axes, steps)
    };
    let k = starts.len();
    let axes = axes.unwrap_or_else(|| (0..k as i64).collect());
    let steps = steps.unwrap_or_else(|| vec![1; k]);
    if ends.len() != k || axes.len() != k || steps.len() != k {
        return Err(Error::invalid(format!(
            "starts, ends, axes and steps differ in length ({k}, {}, {}, {})",
            ends.len(),
            axes.len(),
            steps.len()
        )));
    }
    let mut s = vec![0i64; r];
    let mut e = vec![i64::MAX; r];
    let mut st = vec![1i64; r];
    let mut seen = vec![false; r];
    for i in 0..k {
        let a = axis(axes[i], r)?;
        if std::mem::replace(&mut seen[a], true) {
            return Err(Error::invalid(format!("axes {axes:?} repeat axis {a}")));
        }
        if steps[i] == 0 {
            return Err(Error::invalid("a slice step is 0"));
        }
        (s[a], e[a], st[a]) = (starts[i], ends[i], steps[i]);
    }
    if (0..r).all(|a| s[a] == 0 && e[a] >= dims[a] as i64 && st[a] == 1) {
        return Ok(x);
    }
    cx.op1(
        OpKind::Slice {
            starts: s,
            ends: e,
            steps: st,
        },
        &[x],
    )
}

/// The `Constant` op: one of `value`, `value_float(s)`, `value_int(s)`.
pub(super) fn constant(cx: &mut Ctx, n: &Node) -> Result<Value> {
    if let Some(t) = n.tensor("value")? {
        let t = tensor::from_proto(t, n.dir, "attribute `value`")?;
        return cx.constant(t);
    }
    if let Some(a) = n.typed("value_float", AttributeType::Float)? {
        let t = Tensor::from_f32(&[], vec![a.f.unwrap_or(0.0)])
            .map_err(|e| Error::invalid(e.to_string()))?;
        return cx.constant(t);
    }
    if let Some(v) = n.floats("value_floats")? {
        let len = v.len() as u64;
        let t = Tensor::from_f32(&[len], v).map_err(|e| Error::invalid(e.to_string()))?;
        return cx.constant(t);
    }
    if let Some(a) = n.typed("value_int", AttributeType::Int)? {
        return cx.constant(tensor_i64(&[], vec![a.i.unwrap_or(0)])?);
    }
    if let Some(v) = n.ints("value_ints")? {
        let len = v.len() as u64;
        return cx.constant(tensor_i64(&[len], v)?);
    }
    for other in ["sparse_value", "value_string", "value_strings"] {
        if n.attr(other).is_some() {
            return n.unsupported(format_args!("`{other}`"));
        }
    }
    Err(Error::invalid(
        "Constant needs one of value, value_float(s) or value_int(s)",
    ))
}

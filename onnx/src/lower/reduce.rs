//! Reductions and normalisations: the Reduce family, Softmax, LRN, BatchNormalization in
//! training mode, LayerNormalization.

use crate::ctx::{Ctx, Node, axes_of, axis, binary, cast, matrix_view, reshape, unary};
use crate::{Error, Result};
use tcc_ir::ops::F64;
use tcc_ir::{BinaryOp, DType, OpKind, Pool2d, ReduceOp, Scalar, TensorType, UnaryOp, Value};

/// `ReduceSum/Mean/Max`: axes from the attribute (before `input_since`) or input 1; no axes
/// reduce everything unless `noop_with_empty_axes`.
pub(super) fn reduce(cx: &mut Ctx, n: &Node, op: ReduceOp, input_since: i64) -> Result<Value> {
    let x = n.input(0, "data")?;
    if cx.dtype(x) == DType::Bool && op == ReduceOp::Max {
        // `any`, as a maximum over 0/1.
        let b = cast(cx, x, DType::U8)?;
        let y = reduce_with(cx, n, op, input_since, b)?;
        return cast(cx, y, DType::Bool);
    }
    reduce_with(cx, n, op, input_since, x)
}

/// Reduces `x` over the node's axes (see [`reduce`]).
pub(super) fn reduce_with(
    cx: &mut Ctx,
    n: &Node,
    op: ReduceOp,
    input_since: i64,
    x: Value,
) -> Result<Value> {
    let r = cx.ty(x).rank();
    let keepdims = n.int("keepdims", 1)? != 0;
    let axes = axes_of(cx, n, input_since)?.filter(|a| !a.is_empty());
    let axes: Vec<i64> = match axes {
        Some(a) => a,
        None if n.int("noop_with_empty_axes", 0)? != 0 => return Ok(x),
        None => (0..r as i64).collect(),
    };
    if axes.is_empty() {
        return Ok(x);
    }
    let mut norm: Vec<usize> = axes.iter().map(|&a| axis(a, r)).collect::<Result<_>>()?;
    norm.sort_unstable();
    norm.dedup();
    let dims = cx.dims(x);
    if op == ReduceOp::Max && norm.iter().any(|&a| dims[a] == 0) {
        // The maximum of nothing: -inf (the smallest value for integers), as ONNX defines it.
        let out: Vec<u64> = (0..r)
            .filter_map(|i| match (norm.contains(&i), keepdims) {
                (false, _) => Some(dims[i]),
                (true, true) => Some(1),
                (true, false) => None,
            })
            .collect();
        let dt = cx.dtype(x);
        let ty = TensorType::new(dt, out).map_err(|e| Error::invalid(e.to_string()))?;
        return cx.splat(ty, Scalar::from_f64(dt, f64::NEG_INFINITY));
    }
    cx.op1(
        OpKind::Reduce {
            op,
            axes: norm.iter().map(|&a| a as i64).collect(),
            keepdims,
        },
        &[x],
    )
}

/// The reductions built from `reduce_sum` and `reduce_max` (axes as inputs from opset 18).
pub(super) fn reduce_composite(cx: &mut Ctx, n: &Node) -> Result<Value> {
    let x = n.input(0, "data")?;
    let dt = cx.dtype(x);
    if !dt.is_float() {
        return n.unsupported(format_args!("{dt} data (floats only)"));
    }
    let sum = |cx: &mut Ctx, v| reduce_with(cx, n, ReduceOp::Sum, 18, v);
    match n.op_type() {
        "ReduceMin" => {
            let neg = unary(cx, UnaryOp::Neg, x)?;
            let m = reduce_with(cx, n, ReduceOp::Max, 18, neg)?;
            unary(cx, UnaryOp::Neg, m)
        }
        "ReduceL1" => {
            let a = unary(cx, UnaryOp::Abs, x)?;
            sum(cx, a)
        }
        "ReduceSumSquare" | "ReduceL2" => {
            let sq = binary(cx, BinaryOp::Mul, x, x)?;
            let s = sum(cx, sq)?;
            if n.op_type() == "ReduceL2" {
                unary(cx, UnaryOp::Sqrt, s)
            } else {
                Ok(s)
            }
        }
        "ReduceLogSum" => {
            let s = sum(cx, x)?;
            unary(cx, UnaryOp::Log, s)
        }
        _ => {
            // ReduceLogSumExp: m + log(sum(exp(x - m))), m the maximum (kept as size-1 axes for
            // the subtraction, then reduced the node's way).
            let m = reduce_keepdims(cx, n, x)?;
            let d = binary(cx, BinaryOp::Sub, x, m)?;
            let e = unary(cx, UnaryOp::Exp, d)?;
            let s = sum(cx, e)?;
            let l = unary(cx, UnaryOp::Log, s)?;
            let mr = reduce_with(cx, n, ReduceOp::Max, 18, x)?;
            binary(cx, BinaryOp::Add, l, mr)
        }
    }
}

/// The maximum over the node's axes with the reduced axes kept (size 1).
pub(super) fn reduce_keepdims(cx: &mut Ctx, n: &Node, x: Value) -> Result<Value> {
    let m = reduce_with(cx, n, ReduceOp::Max, 18, x)?;
    if n.int("keepdims", 1)? != 0 || m == x {
        return Ok(m);
    }
    // Put the reduced axes back as ones.
    let r = cx.ty(x).rank();
    let axes = axes_of(cx, n, 18)?.filter(|a| !a.is_empty());
    let axes: Vec<usize> = match axes {
        Some(a) => a.iter().map(|&a| axis(a, r)).collect::<Result<_>>()?,
        None => (0..r).collect(),
    };
    let dims: Vec<u64> = cx
        .dims(x)
        .iter()
        .enumerate()
        .map(|(i, &d)| if axes.contains(&i) { 1 } else { d })
        .collect();
    reshape(cx, m, &dims)
}

/// `Softmax`/`LogSoftmax`. Before opset 13 the input is viewed as 2-D `[prod(dims[..axis]),
/// prod(dims[axis..])]` and normalised along the second axis (default axis 1).
pub(super) fn softmax(cx: &mut Ctx, n: &Node) -> Result<Value> {
    let x = n.input(0, "the input")?;
    let log = n.op_type() == "LogSoftmax";
    let make = |axis| {
        if log {
            OpKind::LogSoftmax { axis }
        } else {
            OpKind::Softmax { axis }
        }
    };
    let dims = cx.dims(x);
    if n.opset >= 13 {
        let a = axis(n.int("axis", -1)?, dims.len())?;
        return cx.op1(make(a as i64), &[x]);
    }
    let view = matrix_view(&dims, n.int("axis", 1)?)?;
    let x2 = reshape(cx, x, &view)?;
    let y = cx.op1(make(1), &[x2])?;
    reshape(cx, y, &dims)
}

/// `LRN` across channels: `x / (bias + alpha/size * sum of x^2 over the channel window)^beta`.
/// The window sum is an average pool (padded positions counted) over a `[N, 1, C, H*W]` view.
pub(super) fn lrn(cx: &mut Ctx, n: &Node) -> Result<Value> {
    let x = n.input(0, "X")?;
    let d = cx.dims(x);
    if d.len() < 3 {
        return Err(Error::invalid(format!(
            "LRN needs [N, C, ...], found {}",
            cx.ty(x)
        )));
    }
    let size = u64::try_from(n.int("size", 0)?)
        .ok()
        .filter(|&s| s > 0)
        .ok_or_else(|| Error::invalid("LRN needs a positive `size`"))?;
    let (alpha, beta, bias) = (
        n.float("alpha", 1e-4)? as f64,
        n.float("beta", 0.75)? as f64,
        n.float("bias", 1.0)? as f64,
    );
    let dt = cx.dtype(x);
    let sq = binary(cx, BinaryOp::Mul, x, x)?;
    let rest: u64 = d[2..].iter().product();
    let v = reshape(cx, sq, &[d[0], 1, d[1], rest])?;
    let (before, after) = ((size - 1) / 2, size - 1 - (size - 1) / 2);
    let avg = cx.op1(
        OpKind::AvgPool2d {
            pool: Pool2d {
                kernel: [size, 1],
                strides: [1, 1],
                pads: [before, 0, after, 0],
            },
            count_include_pad: true,
        },
        &[v],
    )?;
    let avg = reshape(cx, avg, &d)?;
    let a = cx.scalar(dt, alpha)?;
    let scaled = binary(cx, BinaryOp::Mul, avg, a)?;
    let b = cx.scalar(dt, bias)?;
    let base = binary(cx, BinaryOp::Add, scaled, b)?;
    let e = cx.scalar(dt, beta)?;
    let den = binary(cx, BinaryOp::Pow, base, e)?;
    binary(cx, BinaryOp::Div, x, den)
}

/// `BatchNormalization` with `training_mode=1`: normalises with the batch statistics (biased
/// variance) and returns the running statistics updated with `momentum`.
pub(super) fn batch_norm_training(cx: &mut Ctx, n: &Node) -> Result<Vec<Option<Value>>> {
    let eps = n.float("epsilon", 1e-5)? as f64;
    let momentum = n.float("momentum", 0.9)? as f64;
    let (x, scale, b) = (n.input(0, "X")?, n.input(1, "scale")?, n.input(2, "B")?);
    let (mean, var) = (n.input(3, "input_mean")?, n.input(4, "input_var")?);
    let r = cx.op(OpKind::BatchNormTrain { eps: F64(eps) }, &[x, scale, b])?;
    let dt = cx.dtype(x);
    let m = cx.scalar(dt, momentum)?;
    let m1 = cx.scalar(dt, 1.0 - momentum)?;
    let mut running = |old: Value, batch: Value| -> Result<Value> {
        let a = binary(cx, BinaryOp::Mul, old, m)?;
        let b = binary(cx, BinaryOp::Mul, batch, m1)?;
        binary(cx, BinaryOp::Add, a, b)
    };
    let running_mean = running(mean, r[1])?;
    let running_var = running(var, r[2])?;
    Ok(vec![Some(r[0]), Some(running_mean), Some(running_var)])
}

/// `LayerNormalization` over the axes from `axis` on: outputs `Y`, `Mean` and `InvStdDev`.
pub(super) fn layer_norm(cx: &mut Ctx, n: &Node) -> Result<Vec<Option<Value>>> {
    let x = n.input(0, "X")?;
    let scale = n.input(1, "Scale")?;
    let r = cx.ty(x).rank();
    let a = axis(n.int("axis", -1)?, r)?;
    let eps = n.float("epsilon", 1e-5)? as f64;
    let dt = cx.dtype(x);
    let axes: Vec<i64> = (a as i64..r as i64).collect();
    let mean_op = |axes: &Vec<i64>| OpKind::Reduce {
        op: ReduceOp::Mean,
        axes: axes.clone(),
        keepdims: true,
    };
    let mean = cx.op1(mean_op(&axes), &[x])?;
    let d = binary(cx, BinaryOp::Sub, x, mean)?;
    let d2 = binary(cx, BinaryOp::Mul, d, d)?;
    let var = cx.op1(mean_op(&axes), &[d2])?;
    let e = cx.scalar(dt, eps)?;
    let ve = binary(cx, BinaryOp::Add, var, e)?;
    let inv = unary(cx, UnaryOp::Rsqrt, ve)?;
    let norm = binary(cx, BinaryOp::Mul, d, inv)?;
    let mut y = binary(cx, BinaryOp::Mul, norm, scale)?;
    if let Some(b) = n.opt(2) {
        y = binary(cx, BinaryOp::Add, y, b)?;
    }
    Ok(vec![Some(y), Some(mean), Some(inv)])
}

/// `TopK`: `k` from the attribute (before opset 10) or input 1, which must be known at import
/// time. Always sorted (`sorted=0` leaves the order to the implementation).
pub(super) fn top_k(cx: &mut Ctx, n: &Node) -> Result<Vec<Option<Value>>> {
    let x = n.input(0, "X")?;
    let k = if n.opset < 10 {
        n.int("k", -1)?
    } else {
        let v = crate::ctx::const_ints(cx, n, 1, "K")?;
        match v[..] {
            [k] => k,
            _ => {
                return Err(Error::invalid(format!(
                    "K must hold one value, found {v:?}"
                )));
            }
        }
    };
    let k = u64::try_from(k)
        .map_err(|_| Error::invalid(format!("k must be non-negative, found {k}")))?;
    let largest = n.opset < 11 || n.int("largest", 1)? != 0;
    let axis = n.int("axis", -1)?;
    let r = cx.op(OpKind::TopK { k, axis, largest }, &[x])?;
    Ok(vec![Some(r[0]), Some(r[1])])
}

/// `ArgMax` / `ArgMin`: the index of the first (or, with `select_last_index`, last) extreme
/// along `axis`, as int64. Composed: the extreme `m` (a `reduce_max`, of `-x` for the minimum),
/// the positions equal to it (NaN counts as the extreme, as numpy's `argmax` has it), and a
/// `reduce_max` over `len - i` (first) or `i + 1` (last) at those positions. Integers compute
/// in f64, exactly for every value below 2^53.
pub(super) fn arg_extreme(cx: &mut Ctx, n: &Node, max: bool) -> Result<Value> {
    let x = n.input(0, "data")?;
    let dims = cx.dims(x);
    let r = dims.len();
    let a = axis(n.int("axis", 0)?, r.max(1))?;
    if r == 0 {
        return Err(Error::invalid("the input must have rank 1 or more"));
    }
    let keep = n.int("keepdims", 1)? != 0;
    let last = n.int("select_last_index", 0)? != 0;
    let len = dims[a];
    if len == 0 {
        return Err(Error::invalid(format!(
            "axis {a} is empty: there is no extreme"
        )));
    }
    let x = match cx.dtype(x) {
        DType::F32 | DType::F64 => x,
        DType::Bool => {
            let u = cast(cx, x, DType::U8)?;
            cast(cx, u, DType::F64)?
        }
        _ => cast(cx, x, DType::F64)?,
    };
    let v = if max { x } else { unary(cx, UnaryOp::Neg, x)? };
    let reduce_max = |cx: &mut Ctx, v: Value, keepdims: bool| {
        cx.op1(
            OpKind::Reduce {
                op: ReduceOp::Max,
                axes: vec![a as i64],
                keepdims,
            },
            &[v],
        )
    };
    let m = reduce_max(cx, v, true)?;
    let eq = crate::ctx::compare(cx, tcc_ir::CmpOp::Eq, v, m)?;
    let m_nan = crate::ctx::compare(cx, tcc_ir::CmpOp::Ne, m, m)?;
    let v_nan = crate::ctx::compare(cx, tcc_ir::CmpOp::Ne, v, v)?;
    let hit = cx.op1(OpKind::Select, &[m_nan, v_nan, eq])?;
    // Position weights along the axis: len - i picks the first hit, i + 1 the last.
    let idt = if len < 1 << 24 {
        DType::F32
    } else {
        DType::F64
    };
    let mut wd = vec![1u64; r - a];
    wd[0] = len;
    let w: Vec<f64> = (0..len)
        .map(|i| {
            if last {
                i as f64 + 1.0
            } else {
                (len - i) as f64
            }
        })
        .collect();
    let data = match idt {
        DType::F32 => tcc_ir::Data::F32(w.into_iter().map(|v| v as f32).collect()),
        _ => tcc_ir::Data::F64(w),
    };
    let w = cx.constant(
        tcc_ir::Tensor::from_data(&wd, data).map_err(|e| Error::invalid(e.to_string()))?,
    )?;
    let zero = cx.scalar(idt, 0.0)?;
    let picked = cx.op1(OpKind::Select, &[hit, w, zero])?;
    let best = reduce_max(cx, picked, keep)?;
    let pos = if last {
        let one = cx.scalar(idt, 1.0)?;
        binary(cx, BinaryOp::Sub, best, one)?
    } else {
        let l = cx.scalar(idt, len as f64)?;
        binary(cx, BinaryOp::Sub, l, best)?
    };
    cast(cx, pos, DType::I64)
}

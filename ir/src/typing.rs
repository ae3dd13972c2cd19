//! Type rules: the result types of an op given its operand types.
//!
//! [`infer`] is used by the builder (shape inference) and by the verifier (which compares it with
//! the declared result types). Errors are plain sentences; the caller adds the op and location.

use crate::ops::{BinaryOp, OpKind, ReduceOp, UnaryOp, normalize_axis};
use crate::types::{DType, TensorType};

type R<T> = Result<T, String>;

fn tt(dtype: DType, shape: Vec<u64>) -> R<TensorType> {
    TensorType::new(dtype, shape).map_err(|e| e.to_string())
}

/// Numpy broadcasting of two shapes.
pub fn broadcast_shapes(a: &[u64], b: &[u64]) -> R<Vec<u64>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let da = if i + a.len() >= n {
            a[i + a.len() - n]
        } else {
            1
        };
        let db = if i + b.len() >= n {
            b[i + b.len() - n]
        } else {
            1
        };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            (x, y) => {
                return Err(format!(
                    "shapes {} and {} do not broadcast: axis {i} has {x} vs {y}",
                    crate::types::Shape(a.to_vec()),
                    crate::types::Shape(b.to_vec())
                ));
            }
        };
    }
    Ok(out)
}

/// Whether `from` broadcasts to exactly `to`.
pub fn broadcasts_to(from: &[u64], to: &[u64]) -> bool {
    from.len() <= to.len() && broadcast_shapes(from, to).is_ok_and(|s| s == to)
}

/// The start and length of a Python-style slice `start:end:step` over an axis of size `n`.
/// `step` must be non-zero. The start is only meaningful when the length is non-zero.
pub fn slice_range(n: u64, start: i64, end: i64, step: i64) -> (i64, u64) {
    let n = n as i128;
    let (s, e, k) = (start as i128, end as i128, step as i128);
    let clamp = |x: i128, lo: i128, hi: i128| x.max(lo).min(hi);
    let (s, e) = if k > 0 {
        (
            if s < 0 {
                clamp(s + n, 0, n)
            } else {
                clamp(s, 0, n)
            },
            if e < 0 {
                clamp(e + n, 0, n)
            } else {
                clamp(e, 0, n)
            },
        )
    } else {
        (
            if s < 0 {
                clamp(s + n, -1, n - 1)
            } else {
                clamp(s, -1, n - 1)
            },
            if e < 0 {
                clamp(e + n, -1, n - 1)
            } else {
                clamp(e, -1, n - 1)
            },
        )
    };
    let len = if k > 0 {
        if e > s { (e - s + k - 1) / k } else { 0 }
    } else if s > e {
        (s - e + (-k) - 1) / (-k)
    } else {
        0
    };
    (s as i64, len as u64)
}

/// The shape of `a x b` as `matmul` multiplies them (matrices of the last two axes, batch axes
/// broadcast).
fn matmul_dims(a: &TensorType, b: &TensorType) -> R<Vec<u64>> {
    if a.rank() < 2 || b.rank() < 2 {
        return Err(format!(
            "`matmul` needs operands of rank 2 or more, found {a} and {b}; reshape vectors to matrices"
        ));
    }
    let (ad, bd) = (a.dims(), b.dims());
    let (m, k1) = (ad[ad.len() - 2], ad[ad.len() - 1]);
    let (k2, n) = (bd[bd.len() - 2], bd[bd.len() - 1]);
    if k1 != k2 {
        return Err(format!("inner dims {k1} != {k2} ({a} x {b})"));
    }
    let mut s = broadcast_shapes(&ad[..ad.len() - 2], &bd[..bd.len() - 2])
        .map_err(|e| format!("batch dims: {e}"))?;
    s.extend([m, n]);
    Ok(s)
}

fn need_float(t: &TensorType, what: &str) -> R<()> {
    if t.dtype().is_float() {
        Ok(())
    } else {
        Err(format!("{what} must be f32 or f64, found {}", t.dtype()))
    }
}

fn need_numeric(t: &TensorType, what: &str) -> R<()> {
    if t.dtype().is_numeric() {
        Ok(())
    } else {
        Err(format!("{what} must be numeric, found {}", t.dtype()))
    }
}

fn same_dtype(a: &TensorType, b: &TensorType, what: &str) -> R<()> {
    if a.dtype() == b.dtype() {
        Ok(())
    } else {
        Err(format!(
            "{what} have different dtypes {} and {}; insert a `cast`",
            a.dtype(),
            b.dtype()
        ))
    }
}

fn need_rank(t: &TensorType, rank: usize, what: &str) -> R<()> {
    if t.rank() == rank {
        Ok(())
    } else {
        Err(format!("{what} must have rank {rank}, found {t}"))
    }
}

fn axis(axis: i64, rank: usize) -> R<usize> {
    normalize_axis(axis, rank).ok_or_else(|| format!("axis {axis} is out of range for rank {rank}"))
}

/// Output extent of a windowed op along one axis, or an error if the window does not fit.
fn window_out(
    n: u64,
    kernel: u64,
    stride: u64,
    dilation: u64,
    pad_lo: u64,
    pad_hi: u64,
    axis_name: &str,
) -> R<u64> {
    if stride == 0 || dilation == 0 || kernel == 0 {
        return Err(format!(
            "kernel, stride and dilation along {axis_name} must be positive"
        ));
    }
    let span = (dilation as i128) * (kernel as i128 - 1) + 1;
    let padded = n as i128 + pad_lo as i128 + pad_hi as i128;
    if span > padded {
        return Err(format!(
            "window of extent {span} along {axis_name} does not fit the padded input extent {padded}"
        ));
    }
    Ok(((padded - span) / stride as i128 + 1) as u64)
}

/// The output dims of `conv2d` with attributes `c` on an NCHW input of dims `x` and a filter of
/// dims `w`, after checking that they fit.
fn conv_dims(c: &crate::ops::Conv2d, x: &[u64], w: &[u64]) -> R<Vec<u64>> {
    let (n, ch, h, wd) = (x[0], x[1], x[2], x[3]);
    let (o, cg, kh, kw) = (w[0], w[1], w[2], w[3]);
    let g = c.groups;
    if g == 0 || ch % g != 0 || o % g != 0 {
        return Err(format!(
            "groups={g} must divide both input channels {ch} and output channels {o}"
        ));
    }
    if cg != ch / g {
        return Err(format!(
            "filter has {cg} input channels per group, expected {} (= {ch} channels / {g} groups)",
            ch / g
        ));
    }
    let oh = window_out(
        h,
        kh,
        c.strides[0],
        c.dilations[0],
        c.pads[0],
        c.pads[2],
        "H",
    )?;
    let ow = window_out(
        wd,
        kw,
        c.strides[1],
        c.dilations[1],
        c.pads[1],
        c.pads[3],
        "W",
    )?;
    Ok(vec![n, o, oh, ow])
}

/// The largest block of channels `to_nchwc` and `conv2d_nchwc` accept.
pub const MAX_BLOCK: u64 = 64;

fn need_block(block: u64) -> R<()> {
    if (1..=MAX_BLOCK).contains(&block) {
        Ok(())
    } else {
        Err(format!(
            "block={block} must be between 1 and {MAX_BLOCK} channels"
        ))
    }
}

/// The dims of `[N, C, d...]` with its channels in blocks of `block`:
/// `[N, ceil(C/block), d..., block]`.
pub fn nchwc_dims(plain: &[u64], block: u64) -> Vec<u64> {
    let mut d = vec![plain[0], plain[1].div_ceil(block)];
    d.extend_from_slice(&plain[2..]);
    d.push(block);
    d
}

/// Infers the result types of `kind` applied to operands of types `args`.
///
/// The operand count is checked first; every other rule assumes it.
pub fn infer(kind: &OpKind, args: &[&TensorType]) -> R<Vec<TensorType>> {
    let arity = kind.arity();
    if !arity.accepts(args.len()) {
        return Err(format!(
            "`{}` takes {arity}, found {}",
            kind.mnemonic(),
            args.len()
        ));
    }
    let one = |t: TensorType| Ok(vec![t]);
    match kind {
        OpKind::Const { ty, value } => {
            if value.dtype() != ty.dtype() {
                return Err(format!(
                    "constant value is {} but the result type is {ty}",
                    value.dtype()
                ));
            }
            if let crate::literal::Literal::Dense(d) = value
                && d.len() as u64 != ty.numel()
            {
                return Err(format!(
                    "constant has {} elements but {ty} has {}",
                    d.len(),
                    ty.numel()
                ));
            }
            one(ty.clone())
        }
        OpKind::Unary(u) => {
            let x = args[0];
            match u {
                UnaryOp::Neg => {
                    if !(x.dtype().is_float()
                        || matches!(x.dtype(), DType::I8 | DType::I32 | DType::I64))
                    {
                        return Err(format!("`neg` needs a signed type, found {}", x.dtype()));
                    }
                }
                UnaryOp::Abs | UnaryOp::Relu => need_numeric(x, "the operand")?,
                UnaryOp::Exp
                | UnaryOp::Log
                | UnaryOp::Sqrt
                | UnaryOp::Rsqrt
                | UnaryOp::Reciprocal
                | UnaryOp::Tanh
                | UnaryOp::Sigmoid
                | UnaryOp::Erf
                | UnaryOp::Gelu
                | UnaryOp::Floor
                | UnaryOp::Ceil
                | UnaryOp::Round => need_float(x, "the operand")?,
            }
            one(x.clone())
        }
        OpKind::Binary(b) => {
            let (x, y) = (args[0], args[1]);
            same_dtype(x, y, "the operands")?;
            if *b == BinaryOp::Pow {
                need_float(x, "the operands of `pow`")?;
            } else {
                need_numeric(x, "the operands")?;
            }
            one(tt(x.dtype(), broadcast_shapes(x.dims(), y.dims())?)?)
        }
        OpKind::Compare(c) => {
            let (x, y) = (args[0], args[1]);
            same_dtype(x, y, "the operands")?;
            if x.dtype() == DType::Bool
                && !matches!(c, crate::ops::CmpOp::Eq | crate::ops::CmpOp::Ne)
            {
                return Err(format!(
                    "`{}` is not defined on bool; only eq and ne are",
                    c.mnemonic()
                ));
            }
            one(tt(DType::Bool, broadcast_shapes(x.dims(), y.dims())?)?)
        }
        OpKind::Select => {
            let (c, a, b) = (args[0], args[1], args[2]);
            if c.dtype() != DType::Bool {
                return Err(format!("the condition must be bool, found {}", c.dtype()));
            }
            same_dtype(a, b, "the two branches")?;
            let s = broadcast_shapes(c.dims(), a.dims())?;
            one(tt(a.dtype(), broadcast_shapes(&s, b.dims())?)?)
        }
        OpKind::BroadcastTo { shape } => {
            let x = args[0];
            if !broadcasts_to(x.dims(), shape) {
                return Err(format!(
                    "{} does not broadcast to {}",
                    x.shape(),
                    crate::types::Shape(shape.clone())
                ));
            }
            one(tt(x.dtype(), shape.clone())?)
        }
        OpKind::Cast { to } => one(tt(*to, args[0].dims().to_vec())?),
        OpKind::StopGradient | OpKind::Identity => one(args[0].clone()),
        // Which space a value lives in is the verifier's to check (`swap_in` reads host values).
        OpKind::SwapOut | OpKind::SwapIn => one(args[0].clone()),
        OpKind::MatMul => {
            let (a, b) = (args[0], args[1]);
            same_dtype(a, b, "the operands")?;
            need_numeric(a, "the operands")?;
            one(tt(a.dtype(), matmul_dims(a, b)?)?)
        }
        OpKind::MatMulInteger => {
            let (a, b, az, bz) = (args[0], args[1], args[2], args[3]);
            for (v, z, what, per) in [
                (a, az, "left", "[M, 1] per row"),
                (b, bz, "right", "[N] per column"),
            ] {
                if !matches!(v.dtype(), DType::U8 | DType::I8) {
                    return Err(format!(
                        "the {what} operand must be u8 or i8, found {}",
                        v.dtype()
                    ));
                }
                same_dtype(v, z, &format!("the {what} operand and its zero point"))?;
                if !broadcasts_to(z.dims(), v.dims()) {
                    return Err(format!(
                        "the {what} zero point {} must broadcast to the operand's shape {} \
                         (a scalar, or {per})",
                        z.shape(),
                        v.shape()
                    ));
                }
            }
            one(tt(DType::I32, matmul_dims(a, b)?)?)
        }
        OpKind::Conv2d(c) => {
            let (x, w) = (args[0], args[1]);
            need_rank(x, 4, "the input (NCHW)")?;
            need_rank(w, 4, "the filter ([O, C/groups, kH, kW])")?;
            same_dtype(x, w, "input and filter")?;
            need_float(x, "the input")?;
            one(tt(x.dtype(), conv_dims(c, x.dims(), w.dims())?)?)
        }
        OpKind::ConvInteger(c) => {
            let (x, w, xz, wz) = (args[0], args[1], args[2], args[3]);
            need_rank(x, 4, "the input (NCHW)")?;
            need_rank(w, 4, "the filter ([O, C/groups, kH, kW])")?;
            let o = w.dims()[0];
            for (v, z, what, per_channel, per) in [
                (x, xz, "input", false, "a scalar"),
                (
                    w,
                    wz,
                    "filter",
                    true,
                    "a scalar, or [O, 1, 1, 1] per output channel",
                ),
            ] {
                if !matches!(v.dtype(), DType::U8 | DType::I8) {
                    return Err(format!("the {what} must be u8 or i8, found {}", v.dtype()));
                }
                same_dtype(v, z, &format!("the {what} and its zero point"))?;
                let zd = z.dims();
                let scalar = zd.iter().all(|&d| d == 1);
                let per_channel = per_channel && zd == [o, 1, 1, 1];
                if zd.len() > 4 || !(scalar || per_channel) {
                    return Err(format!(
                        "the {what}'s zero point {} must be {per}",
                        z.shape()
                    ));
                }
            }
            one(tt(DType::I32, conv_dims(c, x.dims(), w.dims())?)?)
        }
        OpKind::Conv2dNchwc { conv, block } => {
            let (x, w) = (args[0], args[1]);
            need_block(*block)?;
            need_rank(w, 4, "the filter ([O, C/groups, kH, kW])")?;
            same_dtype(x, w, "input and filter")?;
            need_float(x, "the input")?;
            let plain = match x.rank() {
                4 => x.dims().to_vec(),
                5 => {
                    let d = x.dims();
                    if d[4] != *block {
                        return Err(format!(
                            "the input's blocks have {} channels, but block={block}",
                            d[4]
                        ));
                    }
                    let channels = w.dims()[1].saturating_mul(conv.groups);
                    if d[1] != channels.div_ceil(*block) {
                        return Err(format!(
                            "the input has {} blocks of {block} channels, but the filter reads {channels} channels ({} per group x {} groups), which need {}",
                            d[1],
                            w.dims()[1],
                            conv.groups,
                            channels.div_ceil(*block)
                        ));
                    }
                    vec![d[0], channels, d[2], d[3]]
                }
                _ => {
                    return Err(format!(
                        "the input must be NCHWc [N, C/{block}, H, W, {block}] or NCHW, found {x}"
                    ));
                }
            };
            let y = conv_dims(conv, &plain, w.dims())?;
            one(tt(x.dtype(), nchwc_dims(&y, *block))?)
        }
        OpKind::MaxPool2d(p) | OpKind::AvgPool2d { pool: p, .. } => {
            let x = args[0];
            if !matches!(x.rank(), 4 | 5) {
                return Err(format!(
                    "the input must be NCHW (rank 4) or NCHWc (rank 5), found {x}"
                ));
            }
            if matches!(kind, OpKind::AvgPool2d { .. }) {
                need_float(x, "the input")?;
            } else {
                need_numeric(x, "the input")?;
            }
            for (i, axis_name) in ["H", "W"].iter().enumerate() {
                if p.pads[i] >= p.kernel[i] || p.pads[i + 2] >= p.kernel[i] {
                    return Err(format!(
                        "padding along {axis_name} must be smaller than the kernel ({})",
                        p.kernel[i]
                    ));
                }
            }
            let d = x.dims();
            let oh = window_out(
                d[2],
                p.kernel[0],
                p.strides[0],
                1,
                p.pads[0],
                p.pads[2],
                "H",
            )?;
            let ow = window_out(
                d[3],
                p.kernel[1],
                p.strides[1],
                1,
                p.pads[1],
                p.pads[3],
                "W",
            )?;
            let mut out = vec![d[0], d[1], oh, ow];
            out.extend_from_slice(&d[4..]);
            one(tt(x.dtype(), out)?)
        }
        OpKind::GlobalAvgPool => {
            let x = args[0];
            need_rank(x, 4, "the input (NCHW)")?;
            need_float(x, "the input")?;
            one(tt(x.dtype(), vec![x.dims()[0], x.dims()[1], 1, 1])?)
        }
        OpKind::Reduce { op, axes, keepdims } => {
            let x = args[0];
            if *op == ReduceOp::Mean {
                need_float(x, "the operand of `reduce_mean`")?;
            } else {
                need_numeric(x, "the operand")?;
            }
            if axes.is_empty() {
                return Err("`axes` must name at least one axis".into());
            }
            let mut reduced = vec![false; x.rank()];
            for &a in axes {
                let i = axis(a, x.rank())?;
                if std::mem::replace(&mut reduced[i], true) {
                    return Err(format!("axis {a} is listed twice"));
                }
            }
            let mut s = Vec::new();
            for (i, &d) in x.dims().iter().enumerate() {
                if !reduced[i] {
                    s.push(d);
                } else if *keepdims {
                    s.push(1);
                }
            }
            one(tt(x.dtype(), s)?)
        }
        OpKind::FakeQuant { bits, .. } => {
            let (x, lo, hi) = (args[0], args[1], args[2]);
            need_float(x, "the operand")?;
            if !(2..=16).contains(bits) {
                return Err(format!("bits must be 2 to 16, found {bits}"));
            }
            same_dtype(x, lo, "the operand and min")?;
            same_dtype(x, hi, "the operand and max")?;
            for (v, what) in [(lo, "min"), (hi, "max")] {
                if !broadcasts_to(v.dims(), x.dims()) {
                    return Err(format!(
                        "{what} {} must broadcast to the operand's shape {}",
                        v.shape(),
                        x.shape()
                    ));
                }
            }
            one(x.clone())
        }
        OpKind::QuantizeLinear | OpKind::DequantizeLinear => {
            let quantize = matches!(kind, OpKind::QuantizeLinear);
            let (x, scale, zero) = (args[0], args[1], args[2]);
            need_float(scale, "the scale")?;
            if quantize {
                need_float(x, "the operand")?;
                same_dtype(x, scale, "the operand and the scale")?;
            } else if !matches!(x.dtype(), DType::U8 | DType::I8 | DType::I32) {
                return Err(format!(
                    "the operand must be u8, i8 or i32, found {}",
                    x.dtype()
                ));
            }
            // An i32 zero point only for dequantizing i32 values (a bias).
            let byte = matches!(zero.dtype(), DType::U8 | DType::I8);
            if !byte && (quantize || zero.dtype() != DType::I32) {
                return Err(format!(
                    "the zero point must be u8 or i8 (the quantized dtype), found {}",
                    zero.dtype()
                ));
            }
            if !quantize {
                same_dtype(x, zero, "the operand and the zero point")?;
            }
            if scale.dims() != zero.dims() {
                return Err(format!(
                    "the scale {} and the zero point {} must have one shape",
                    scale.shape(),
                    zero.shape()
                ));
            }
            if !broadcasts_to(scale.dims(), x.dims()) {
                return Err(format!(
                    "the scale and zero point {} must broadcast to the operand's shape {} \
                     (per channel of axis 1 of NCHW: [C, 1, 1])",
                    scale.shape(),
                    x.shape()
                ));
            }
            let dtype = if quantize {
                zero.dtype()
            } else {
                scale.dtype()
            };
            one(tt(dtype, x.dims().to_vec())?)
        }
        OpKind::TopK { k, axis: a, .. } => {
            let x = args[0];
            need_numeric(x, "the operand")?;
            let a = axis(*a, x.rank())?;
            let len = x.dims()[a];
            if *k > len {
                return Err(format!(
                    "k = {k} is more than the {len} elements along axis {a}"
                ));
            }
            let mut d = x.dims().to_vec();
            d[a] = *k;
            Ok(vec![tt(x.dtype(), d.clone())?, tt(DType::I64, d)?])
        }
        OpKind::Softmax { axis: a } | OpKind::LogSoftmax { axis: a } => {
            let x = args[0];
            need_float(x, "the operand")?;
            axis(*a, x.rank())?;
            one(x.clone())
        }
        OpKind::SoftmaxCrossEntropyGrad => {
            let (logits, dy) = (args[0], args[2]);
            infer(&OpKind::SoftmaxCrossEntropy, &args[..2])?;
            if dy.rank() != 0 || dy.dtype() != logits.dtype() {
                return Err(format!(
                    "the cotangent must be a {} scalar, found {dy}",
                    logits.dtype()
                ));
            }
            one(logits.clone())
        }
        OpKind::SoftmaxCrossEntropy => {
            let (logits, labels) = (args[0], args[1]);
            need_float(logits, "the logits")?;
            need_rank(logits, 2, "the logits ([N, C])")?;
            if !matches!(labels.dtype(), DType::I32 | DType::I64) {
                return Err(format!(
                    "labels must be i32 or i64, found {}",
                    labels.dtype()
                ));
            }
            if labels.dims() != [logits.dims()[0]] {
                return Err(format!(
                    "labels must have shape [{}] to match logits {logits}, found {}",
                    logits.dims()[0],
                    labels.shape()
                ));
            }
            one(TensorType::scalar(logits.dtype()))
        }
        OpKind::BatchNorm { .. } | OpKind::BatchNormTrain { .. } => {
            let x = args[0];
            need_float(x, "the input")?;
            if x.rank() < 2 {
                return Err(format!(
                    "the input must have rank 2 or more (N, C, ...), found {x}"
                ));
            }
            let c = x.dims()[1];
            let names = ["gamma", "beta", "mean", "var"];
            for (i, t) in args[1..].iter().enumerate() {
                same_dtype(x, t, &format!("input and {}", names[i]))?;
                if t.dims() != [c] {
                    return Err(format!(
                        "{} must have shape [{c}] (channels of {x}), found {}",
                        names[i],
                        t.shape()
                    ));
                }
            }
            let stat = tt(x.dtype(), vec![c])?;
            Ok(if matches!(kind, OpKind::BatchNorm { .. }) {
                vec![x.clone()]
            } else {
                vec![x.clone(), stat.clone(), stat]
            })
        }
        OpKind::Reshape { shape } => {
            let x = args[0];
            let t = tt(x.dtype(), shape.clone())?;
            if t.numel() != x.numel() {
                return Err(format!(
                    "cannot reshape {x} ({} elements) to {} ({} elements)",
                    x.numel(),
                    t.shape(),
                    t.numel()
                ));
            }
            one(t)
        }
        OpKind::Transpose { perm } => {
            let x = args[0];
            let mut seen = vec![false; x.rank()];
            let ok = perm.len() == x.rank()
                && perm.iter().all(|&p| {
                    (p as usize) < x.rank() && !std::mem::replace(&mut seen[p as usize], true)
                });
            if !ok {
                return Err(format!(
                    "perm {perm:?} is not a permutation of the {} axes of {x}",
                    x.rank()
                ));
            }
            one(tt(
                x.dtype(),
                perm.iter().map(|&p| x.dims()[p as usize]).collect(),
            )?)
        }
        OpKind::Concat { axis: a } => {
            let x = args[0];
            let i = axis(*a, x.rank())?;
            let mut total: u64 = 0;
            for (k, t) in args.iter().enumerate() {
                same_dtype(x, t, &format!("operands 0 and {k}"))?;
                let compatible = t.rank() == x.rank()
                    && t.dims()
                        .iter()
                        .zip(x.dims())
                        .enumerate()
                        .all(|(j, (p, q))| j == i || p == q);
                if !compatible {
                    return Err(format!(
                        "operand {k} ({t}) does not match operand 0 ({x}) outside axis {i}"
                    ));
                }
                total = total
                    .checked_add(t.dims()[i])
                    .ok_or_else(|| "concatenated extent overflows".to_string())?;
            }
            let mut s = x.dims().to_vec();
            s[i] = total;
            one(tt(x.dtype(), s)?)
        }
        OpKind::ToNchwc { block } => {
            let x = args[0];
            need_block(*block)?;
            if x.rank() < 2 {
                return Err(format!(
                    "the operand must have a batch and a channel axis (rank 2 or more), found {x}"
                ));
            }
            one(tt(x.dtype(), nchwc_dims(x.dims(), *block))?)
        }
        OpKind::FromNchwc { channels } => {
            let x = args[0];
            if x.rank() < 3 {
                return Err(format!(
                    "the operand must be channel-blocked [N, Cb, ..., b] (rank 3 or more), found {x}"
                ));
            }
            let d = x.dims();
            let b = d[d.len() - 1];
            if b == 0 || channels.div_ceil(b) != d[1] {
                return Err(format!(
                    "{channels} channels do not fill {} blocks of {b}",
                    d[1]
                ));
            }
            let mut dims = vec![d[0], *channels];
            dims.extend_from_slice(&d[2..d.len() - 1]);
            one(tt(x.dtype(), dims)?)
        }
        OpKind::Slice {
            starts,
            ends,
            steps,
        } => {
            let x = args[0];
            let r = x.rank();
            if starts.len() != r || ends.len() != r || steps.len() != r {
                return Err(format!(
                    "starts, ends and steps need one entry per axis ({r}), found {}, {} and {}",
                    starts.len(),
                    ends.len(),
                    steps.len()
                ));
            }
            let mut s = Vec::with_capacity(r);
            for i in 0..r {
                if steps[i] == 0 {
                    return Err(format!("step along axis {i} is zero"));
                }
                s.push(slice_range(x.dims()[i], starts[i], ends[i], steps[i]).1);
            }
            one(tt(x.dtype(), s)?)
        }
        OpKind::Gather { axis: a } => {
            let (data, idx) = (args[0], args[1]);
            if !matches!(idx.dtype(), DType::I32 | DType::I64) {
                return Err(format!("indices must be i32 or i64, found {}", idx.dtype()));
            }
            let i = axis(*a, data.rank())?;
            let d = data.dims();
            let s: Vec<u64> = d[..i]
                .iter()
                .chain(idx.dims())
                .chain(&d[i + 1..])
                .copied()
                .collect();
            one(tt(data.dtype(), s)?)
        }
        OpKind::ScatterAdd { axis: a } => {
            let (data, idx, upd) = (args[0], args[1], args[2]);
            if !matches!(idx.dtype(), DType::I32 | DType::I64) {
                return Err(format!("indices must be i32 or i64, found {}", idx.dtype()));
            }
            need_numeric(data, "data")?;
            same_dtype(data, upd, "data and updates")?;
            let i = axis(*a, data.rank())?;
            let d = data.dims();
            let want: Vec<u64> = d[..i]
                .iter()
                .chain(idx.dims())
                .chain(&d[i + 1..])
                .copied()
                .collect();
            if upd.dims() != want.as_slice() {
                return Err(format!(
                    "updates must have shape {} (data[..axis] ++ indices ++ data[axis+1..]), found {}",
                    crate::types::Shape(want),
                    upd.shape()
                ));
            }
            one(data.clone())
        }
        OpKind::Conv2dGradInput { conv, shape } => {
            let (dy, w) = (args[0], args[1]);
            let x = tt(dy.dtype(), shape.clone())?;
            grad_of(&OpKind::Conv2d(conv.clone()), &[&x, w], dy, "the input")?;
            one(x)
        }
        OpKind::Conv2dGradFilter { conv, shape } => {
            let (x, dy) = (args[0], args[1]);
            let w = tt(dy.dtype(), shape.clone())?;
            grad_of(&OpKind::Conv2d(conv.clone()), &[x, &w], dy, "the filter")?;
            one(w)
        }
        OpKind::MaxPool2dGrad(p) => {
            let (x, dy) = (args[0], args[1]);
            need_rank(x, 4, "the input (NCHW)")?;
            need_float(x, "the input")?;
            grad_of(&OpKind::MaxPool2d(p.clone()), &[x], dy, "the input")?;
            one(x.clone())
        }
        OpKind::AvgPool2dGrad {
            pool,
            count_include_pad,
            shape,
        } => {
            let dy = args[0];
            let x = tt(dy.dtype(), shape.clone())?;
            need_rank(&x, 4, "the input (NCHW)")?;
            let fwd = OpKind::AvgPool2d {
                pool: pool.clone(),
                count_include_pad: *count_include_pad,
            };
            grad_of(&fwd, &[&x], dy, "the input")?;
            one(x)
        }
        OpKind::SliceGrad {
            shape,
            starts,
            ends,
            steps,
        } => {
            let dy = args[0];
            need_float(dy, "the gradient")?;
            let x = tt(dy.dtype(), shape.clone())?;
            let fwd = OpKind::Slice {
                starts: starts.clone(),
                ends: ends.clone(),
                steps: steps.clone(),
            };
            grad_of(&fwd, &[&x], dy, "the input")?;
            one(x)
        }
    }
}

/// Checks a gradient op against its forward op: `fwd(args)` must type-check and produce `dy`'s
/// type. `what` names the operand whose gradient is computed.
fn grad_of(fwd: &OpKind, args: &[&TensorType], dy: &TensorType, what: &str) -> R<()> {
    let out = infer(fwd, args).map_err(|e| format!("forward `{}`: {e}", fwd.mnemonic()))?;
    if &out[0] != dy {
        return Err(format!(
            "the gradient has type {dy}, but forward `{}` of {what} produces {}",
            fwd.mnemonic(),
            out[0]
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::Conv2d;

    fn t(d: DType, s: &[u64]) -> TensorType {
        TensorType::new(d, s.to_vec()).unwrap()
    }

    #[test]
    fn broadcasting() {
        assert_eq!(
            broadcast_shapes(&[3, 1, 5], &[4, 5]).unwrap(),
            vec![3, 4, 5]
        );
        assert_eq!(broadcast_shapes(&[], &[2]).unwrap(), vec![2]);
        assert!(broadcast_shapes(&[3], &[4]).is_err());
        assert!(broadcasts_to(&[1, 5], &[3, 5]));
        assert!(!broadcasts_to(&[3, 5], &[5]));
    }

    #[test]
    fn python_slices() {
        // Compare with Python's len(range(*slice(s, e, k).indices(n))).
        assert_eq!(slice_range(10, 0, 10, 1), (0, 10));
        assert_eq!(slice_range(10, -3, 100, 1), (7, 3));
        assert_eq!(slice_range(10, 1, 8, 3), (1, 3));
        assert_eq!(slice_range(10, 9, -11, -1), (9, 10));
        assert_eq!(slice_range(10, -1, -100, -2), (9, 5));
        assert_eq!(slice_range(10, 5, 2, 1).1, 0);
        assert_eq!(slice_range(0, 0, 5, 1).1, 0);
        assert_eq!(slice_range(10, i64::MIN, i64::MAX, 1), (0, 10));
    }

    #[test]
    fn conv_output_shapes() {
        let x = t(DType::F32, &[1, 64, 56, 56]);
        let w = t(DType::F32, &[64, 64, 3, 3]);
        let c = Conv2d {
            pads: [1; 4],
            ..Conv2d::default()
        };
        let r = infer(&OpKind::Conv2d(c), &[&x, &w]).unwrap();
        assert_eq!(r[0].dims(), &[1, 64, 56, 56]);
        let dw = t(DType::F32, &[64, 1, 3, 3]);
        let c = Conv2d {
            strides: [2, 2],
            pads: [1; 4],
            groups: 64,
            ..Conv2d::default()
        };
        assert_eq!(
            infer(&OpKind::Conv2d(c), &[&x, &dw]).unwrap()[0].dims(),
            &[1, 64, 28, 28]
        );
        let c = Conv2d {
            groups: 3,
            ..Conv2d::default()
        };
        assert!(infer(&OpKind::Conv2d(c), &[&x, &w]).is_err());
    }

    #[test]
    fn matmul_batches_broadcast() {
        let a = t(DType::F32, &[2, 1, 3, 4]);
        let b = t(DType::F32, &[5, 4, 6]);
        assert_eq!(
            infer(&OpKind::MatMul, &[&a, &b]).unwrap()[0].dims(),
            &[2, 5, 3, 6]
        );
        let c = t(DType::F32, &[5, 3, 6]);
        let e = infer(&OpKind::MatMul, &[&a, &c]).unwrap_err();
        assert!(e.contains("inner dims 4 != 3"), "{e}");
    }

    #[test]
    fn gather_and_scatter_shapes_agree() {
        let data = t(DType::F32, &[10, 4]);
        let idx = t(DType::I64, &[2, 3]);
        let g = infer(&OpKind::Gather { axis: 0 }, &[&data, &idx]).unwrap();
        assert_eq!(g[0].dims(), &[2, 3, 4]);
        let s = infer(&OpKind::ScatterAdd { axis: 0 }, &[&data, &idx, &g[0]]).unwrap();
        assert_eq!(s[0], data);
    }
}

//! Elementwise ops that are compositions: Pow across types, Clip, the activation functions,
//! Gelu, Dropout.

use crate::ctx::{Ctx, Node, binary, cast, compare, const_input, unary};
use crate::{Error, Result};
use tcc_ir::{BinaryOp, CmpOp, DType, OpKind, Scalar, TensorType, UnaryOp, Value};

/// `Pow`: the exponent may have another type; integer bases compute in `f64`.
pub(super) fn pow(cx: &mut Ctx, x: Value, y: Value) -> Result<Value> {
    let dt = cx.dtype(x);
    if dt.is_float() {
        let y = cast(cx, y, dt)?;
        return binary(cx, BinaryOp::Pow, x, y);
    }
    let (xf, yf) = (cast(cx, x, DType::F64)?, cast(cx, y, DType::F64)?);
    let p = binary(cx, BinaryOp::Pow, xf, yf)?;
    cast(cx, p, dt)
}

pub(super) fn clip(cx: &mut Ctx, n: &Node) -> Result<Value> {
    let x = n.input(0, "the input")?;
    let dt = cx.dtype(x);
    let (lo, hi) = if n.opset < 11 {
        let lo = n.attr("min").map(|_| n.float("min", 0.0)).transpose()?;
        let hi = n.attr("max").map(|_| n.float("max", 0.0)).transpose()?;
        (
            lo.map(|v| cx.scalar(dt, v as f64)).transpose()?,
            hi.map(|v| cx.scalar(dt, v as f64)).transpose()?,
        )
    } else {
        (n.opt(1), n.opt(2))
    };
    let mut y = x;
    if let Some(lo) = lo {
        y = binary(cx, BinaryOp::Max, y, lo)?;
    }
    if let Some(hi) = hi {
        y = binary(cx, BinaryOp::Min, y, hi)?;
    }
    Ok(y)
}

pub(super) fn leaky_relu(cx: &mut Ctx, x: Value, alpha: f64) -> Result<Value> {
    let dt = cx.dtype(x);
    let a = cx.scalar(dt, alpha)?;
    let ax = binary(cx, BinaryOp::Mul, x, a)?;
    let zero = cx.scalar(dt, 0.0)?;
    let lt = compare(cx, CmpOp::Lt, x, zero)?;
    cx.op1(OpKind::Select, &[lt, ax, x])
}

/// `x` for `x >= 0`, `alpha * (exp(x) - 1)` below.
pub(super) fn elu(cx: &mut Ctx, x: Value, alpha: f64) -> Result<Value> {
    let dt = cx.dtype(x);
    let e = unary(cx, UnaryOp::Exp, x)?;
    let one = cx.scalar(dt, 1.0)?;
    let em1 = binary(cx, BinaryOp::Sub, e, one)?;
    let a = cx.scalar(dt, alpha)?;
    let neg = binary(cx, BinaryOp::Mul, em1, a)?;
    let zero = cx.scalar(dt, 0.0)?;
    let lt = compare(cx, CmpOp::Lt, x, zero)?;
    cx.op1(OpKind::Select, &[lt, neg, x])
}

/// `log(1 + exp(x))`, computed as `max(x, 0) + log(1 + exp(-|x|))` so it neither overflows nor
/// loses small values.
pub(super) fn softplus(cx: &mut Ctx, x: Value) -> Result<Value> {
    let dt = cx.dtype(x);
    let a = unary(cx, UnaryOp::Abs, x)?;
    let na = unary(cx, UnaryOp::Neg, a)?;
    let e = unary(cx, UnaryOp::Exp, na)?;
    let one = cx.scalar(dt, 1.0)?;
    let e1 = binary(cx, BinaryOp::Add, e, one)?;
    let l = unary(cx, UnaryOp::Log, e1)?;
    let r = unary(cx, UnaryOp::Relu, x)?;
    binary(cx, BinaryOp::Add, r, l)
}

/// `max(0, min(1, alpha * x + beta))`.
pub(super) fn hard_sigmoid(cx: &mut Ctx, x: Value, alpha: f64, beta: f64) -> Result<Value> {
    let dt = cx.dtype(x);
    let a = cx.scalar(dt, alpha)?;
    let b = cx.scalar(dt, beta)?;
    let ax = binary(cx, BinaryOp::Mul, x, a)?;
    let y = binary(cx, BinaryOp::Add, ax, b)?;
    let one = cx.scalar(dt, 1.0)?;
    let zero = cx.scalar(dt, 0.0)?;
    let y = binary(cx, BinaryOp::Min, y, one)?;
    binary(cx, BinaryOp::Max, y, zero)
}

pub(super) fn gelu(cx: &mut Ctx, n: &Node, x: Value) -> Result<Value> {
    match n.string("approximate", "none")?.as_str() {
        "none" => unary(cx, UnaryOp::Gelu, x),
        "tanh" => {
            // x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))
            let dt = cx.dtype(x);
            let x2 = binary(cx, BinaryOp::Mul, x, x)?;
            let x3 = binary(cx, BinaryOp::Mul, x2, x)?;
            let c = cx.scalar(dt, 0.044715)?;
            let cx3 = binary(cx, BinaryOp::Mul, x3, c)?;
            let inner = binary(cx, BinaryOp::Add, x, cx3)?;
            let k = cx.scalar(dt, (2.0 / std::f64::consts::PI).sqrt())?;
            let arg = binary(cx, BinaryOp::Mul, inner, k)?;
            let t = unary(cx, UnaryOp::Tanh, arg)?;
            let one = cx.scalar(dt, 1.0)?;
            let t1 = binary(cx, BinaryOp::Add, t, one)?;
            let half = cx.scalar(dt, 0.5)?;
            let hx = binary(cx, BinaryOp::Mul, x, half)?;
            binary(cx, BinaryOp::Mul, hx, t1)
        }
        other => n.unsupported(format_args!("approximate=\"{other}\"")),
    }
}

pub(super) fn dropout(cx: &mut Ctx, n: &Node) -> Result<Vec<Option<Value>>> {
    let x = n.input(0, "the input")?;
    // Opset 12 moved `ratio` and `training_mode` to inputs; before it, Dropout in an inference
    // graph is the identity (before opset 7, when `is_test` says so).
    if n.opset < 7 && n.int("is_test", 0)? == 0 && n.float("ratio", 0.5)? != 0.0 {
        return n.unsupported("is_test=0 (random masks)");
    }
    if n.opset >= 12 && n.opt(2).is_some() {
        let training = const_input(cx, n, 2, "training_mode")?;
        let training =
            (0..training.ty().numel() as usize).any(|i| training.data().get(i).to_f64() != 0.0);
        let ratio = match n.opt(1) {
            Some(_) => const_input(cx, n, 1, "ratio")?.data().get(0).to_f64(),
            None => 0.5,
        };
        if training && ratio != 0.0 {
            return n.unsupported("training_mode=true (random masks)");
        }
    }
    let mask = if n.p.output.len() > 1 && !n.p.output[1].is_empty() {
        let ty =
            TensorType::new(DType::Bool, cx.dims(x)).map_err(|e| Error::invalid(e.to_string()))?;
        Some(cx.splat(ty, Scalar::Bool(true))?)
    } else {
        None
    };
    Ok(vec![Some(x), mask])
}

/// `Mod` on integers: `a - trunc(a / b) * b`, the sign of the dividend (`fmod=1`), or moved to
/// the sign of the divisor when they differ (`fmod=0`, Python's `%`). On floats (which ONNX
/// allows with `fmod=1` only) it is C's `fmod`, computed as `a - trunc(a / b) * b` in f64: for
/// f32 operands that is exact while the quotient is below 2^29, and for f64 operands it is
/// exact while the quotient is below 2^24 or so (the division rounds).
pub(super) fn modulo(cx: &mut Ctx, n: &Node) -> Result<Value> {
    let (a, b) = (n.input(0, "A")?, n.input(1, "B")?);
    let dt = cx.dtype(a);
    if dt.is_float() {
        if n.int("fmod", 0)? == 0 {
            return Err(Error::invalid(
                "fmod must be 1 for floating-point operands (ONNX defines Mod on floats as C's fmod)",
            ));
        }
        let (a64, b64) = (cast(cx, a, DType::F64)?, cast(cx, b, DType::F64)?);
        let q = binary(cx, BinaryOp::Div, a64, b64)?;
        let zero = cx.scalar(DType::F64, 0.0)?;
        let neg = compare(cx, CmpOp::Lt, q, zero)?;
        let up = unary(cx, UnaryOp::Ceil, q)?;
        let down = unary(cx, UnaryOp::Floor, q)?;
        let t = cx.op1(OpKind::Select, &[neg, up, down])?;
        let tb = binary(cx, BinaryOp::Mul, t, b64)?;
        let r = binary(cx, BinaryOp::Sub, a64, tb)?;
        // fmod(a, ±inf) is a (for finite a), where the formula would give 0 * inf.
        let inf = cx.scalar(DType::F64, f64::INFINITY)?;
        let babs = unary(cx, UnaryOp::Abs, b64)?;
        let b_inf = compare(cx, CmpOp::Eq, babs, inf)?;
        let r = cx.op1(OpKind::Select, &[b_inf, a64, r])?;
        return cast(cx, r, dt);
    }
    if !dt.is_int() {
        return n.unsupported(format_args!("{dt} operands"));
    }
    let q = binary(cx, BinaryOp::Div, a, b)?;
    let qb = binary(cx, BinaryOp::Mul, q, b)?;
    let r = binary(cx, BinaryOp::Sub, a, qb)?;
    if n.int("fmod", 0)? != 0 {
        return Ok(r);
    }
    let zero = cx.scalar(dt, 0.0)?;
    let nonzero = compare(cx, CmpOp::Ne, r, zero)?;
    let r_neg = compare(cx, CmpOp::Lt, r, zero)?;
    let b_neg = compare(cx, CmpOp::Lt, b, zero)?;
    let differ = compare(cx, CmpOp::Ne, r_neg, b_neg)?;
    let f = cx.scalar(DType::Bool, 0.0)?;
    let fix = cx.op1(OpKind::Select, &[nonzero, differ, f])?;
    let rb = binary(cx, BinaryOp::Add, r, b)?;
    cx.op1(OpKind::Select, &[fix, rb, r])
}

//! Quantized ops: QuantizeLinear and DequantizeLinear, DynamicQuantizeLinear, the integer
//! products MatMulInteger and ConvInteger, and QLinearMatMul and QLinearConv as those products
//! requantized the way ONNX's reference computes them.

use super::conv::{Planar, add_bias, conv_geometry};
use crate::ctx::{Ctx, Node, axis, binary, cast, reshape, unary};
use crate::{Error, Result};
use tcc_ir::{BinaryOp, DType, OpKind, UnaryOp, Value};

/// QuantizeLinear (`quantize`) or DequantizeLinear: per tensor (a scalar or one-element scale)
/// or per axis (a 1-D scale along `axis`, default 1, reshaped as `[C, 1, ...]` so that it
/// broadcasts), with the zero point 0 of the quantized type where it is omitted (`u8`, or
/// QuantizeLinear's `output_dtype`). Blocked scales (`block_size`) and the 2-, 4- and 16-bit
/// and float8 types are not supported.
pub(super) fn quantize_linear(cx: &mut Ctx, n: &Node, quantize: bool) -> Result<Value> {
    let x = n.input(0, "the input")?;
    let scale = n.input(1, "the scale")?;
    if n.int("block_size", 0)? != 0 {
        return n.unsupported("blocked scales (`block_size`)");
    }
    let zero = match n.opt(2) {
        Some(z) => z,
        None => {
            let dt = if !quantize {
                cx.dtype(x)
            } else {
                match n.int("output_dtype", 0)? {
                    0 => DType::U8,
                    t => crate::tensor::dtype(t as i32, "`output_dtype`")?,
                }
            };
            let zero = cx.scalar(dt, 0.0)?;
            let sd = cx.dims(scale);
            if sd.is_empty() {
                zero
            } else {
                cx.op1(OpKind::BroadcastTo { shape: sd }, &[zero])?
            }
        }
    };
    if quantize && !cx.dtype(x).is_float() {
        return n.unsupported(format!("{} input", cx.dtype(x)));
    }
    let zt = cx.dtype(zero);
    // i32 only for DequantizeLinear (a bias).
    let byte = matches!(zt, DType::U8 | DType::I8);
    if !byte && (quantize || zt != DType::I32) {
        return n.unsupported(format!("{zt} quantized values"));
    }
    let (sd, zd) = (cx.dims(scale), cx.dims(zero));
    if sd != zd {
        return Err(Error::invalid(format!(
            "{}: the scale's shape {sd:?} and the zero point's {zd:?} differ",
            n.op_type()
        )));
    }
    let dims = cx.dims(x);
    let count: u64 = sd.iter().product();
    let shape = match sd.len() {
        _ if count == 1 => vec![],
        1 => {
            let a = axis(n.int("axis", 1)?, dims.len())?;
            if sd[0] != dims[a] {
                return Err(Error::invalid(format!(
                    "{}: {} scales for axis {a} of {} elements",
                    n.op_type(),
                    sd[0],
                    dims[a]
                )));
            }
            let mut s = vec![sd[0]];
            s.resize(dims.len() - a, 1);
            s
        }
        _ => return n.unsupported(format!("a scale of shape {sd:?} (blocked)")),
    };
    let scale = reshape(cx, scale, &shape)?;
    let zero = reshape(cx, zero, &shape)?;
    let kind = if quantize {
        OpKind::QuantizeLinear
    } else {
        OpKind::DequantizeLinear
    };
    cx.op1(kind, &[x, scale, zero])
}

/// DynamicQuantizeLinear of f32 `x`: the range `[min(0, min x), max(0, max x)]` over 255
/// levels of `u8`, as the spec computes it (`scale = (hi - lo) / 255`, the zero point
/// `round(-lo / scale)` saturated), then `quantize_linear`; the quantized tensor, the scale
/// and the zero point. A tensor of zeros has scale 0, which `quantize_linear` refuses when it
/// runs.
pub(super) fn dynamic_quantize_linear(cx: &mut Ctx, x: Value) -> Result<(Value, Value, Value)> {
    if cx.dtype(x) != DType::F32 {
        return Err(Error::unsupported(format!(
            "DynamicQuantizeLinear of {} (it takes f32)",
            cx.dtype(x)
        )));
    }
    let all: Vec<i64> = (0..cx.dims(x).len() as i64).collect();
    let reduce = |cx: &mut Ctx, v: Value| -> Result<Value> {
        let k = OpKind::Reduce {
            op: tcc_ir::ReduceOp::Max,
            axes: all.clone(),
            keepdims: false,
        };
        cx.op1(k, &[v])
    };
    let zero = cx.scalar(DType::F32, 0.0)?;
    let hi = reduce(cx, x)?;
    let hi = binary(cx, BinaryOp::Max, hi, zero)?;
    let neg = unary(cx, UnaryOp::Neg, x)?;
    let lo = reduce(cx, neg)?;
    let lo = unary(cx, UnaryOp::Neg, lo)?;
    let lo = binary(cx, BinaryOp::Min, lo, zero)?;
    let span = binary(cx, BinaryOp::Sub, hi, lo)?;
    let levels = cx.scalar(DType::F32, 255.0)?;
    let scale = binary(cx, BinaryOp::Div, span, levels)?;
    let ratio = binary(cx, BinaryOp::Div, lo, scale)?;
    let from = binary(cx, BinaryOp::Sub, zero, ratio)?;
    let point = unary(cx, UnaryOp::Round, from)?;
    let point = binary(cx, BinaryOp::Max, point, zero)?;
    let point = binary(cx, BinaryOp::Min, point, levels)?;
    let point = cast(cx, point, DType::U8)?;
    let y = cx.op1(OpKind::QuantizeLinear, &[x, scale, point])?;
    Ok((y, scale, point))
}

/// MatMulInteger: `matmul_integer` of 2-D or batched u8/i8 operands (inputs `a`, `b` and the
/// zero points `za`, `zb` at the positions `at`), the zero points 0 where omitted; `a`'s 1-D
/// zero point (one per row) as `[M, 1]`.
pub(super) fn matmul_integer(cx: &mut Ctx, n: &Node, at: [usize; 4]) -> Result<Value> {
    let a = n.input(at[0], "A")?;
    let b = n.input(at[1], "B")?;
    for v in [a, b] {
        if cx.dims(v).len() < 2 {
            return n.unsupported("a 1-D operand");
        }
    }
    let zero = |cx: &mut Ctx, i: usize, of: Value, per_row: bool| -> Result<Value> {
        let Some(z) = n.opt(i) else {
            return cx.scalar(cx.dtype(of), 0.0);
        };
        let zd = cx.dims(z);
        if per_row && zd.len() == 1 && zd[0] != 1 {
            let mut shape = zd.clone();
            shape.push(1);
            return reshape(cx, z, &shape);
        }
        Ok(z)
    };
    let za = zero(cx, at[2], a, true)?;
    let zb = zero(cx, at[3], b, false)?;
    cx.op1(OpKind::MatMulInteger, &[a, b, za, zb])
}

/// QLinearMatMul as ONNX's reference computes it: the integer product (`matmul_integer`)
/// requantized ([`requantize`]). Per-row `a_scale` and per-column `b_scale` broadcast as
/// `[M, 1]` and `[N]`.
pub(super) fn qlinear_matmul(cx: &mut Ctx, n: &Node) -> Result<Value> {
    let p = matmul_integer(cx, n, [0, 3, 2, 5])?;
    let sa = n.input(1, "a_scale")?;
    let sd = cx.dims(sa);
    let sa = if sd.len() == 1 && sd[0] != 1 {
        reshape(cx, sa, &[sd[0], 1])?
    } else {
        sa
    };
    let sb = n.input(4, "b_scale")?;
    requantize(cx, n, p, [sa, sb], [6, 7])
}

/// ConvInteger: `conv_integer` of u8/i8 operands (inputs `x`, `w` and the zero points at the
/// positions `at`), the zero points 0 where omitted; `x`'s must be one value, `w`'s one or
/// one per output channel (`[M]`, as `[M, 1, 1, 1]`). The i32 sums, 2-D (1-D convolutions run
/// as 2-D ones).
fn integer_conv(cx: &mut Ctx, n: &Node, at: [usize; 4], op: &str) -> Result<(Value, Planar)> {
    let (x, w) = (n.input(at[0], "x")?, n.input(at[1], "w")?);
    let (x4, w4, attrs, planar) = conv_geometry(cx, n, [x, w], op)?;
    let o = cx.dims(w)[0];
    let zero = |cx: &mut Ctx, i: usize, of: Value, name: &str| -> Result<Value> {
        let Some(z) = n.opt(i) else {
            return cx.scalar(cx.dtype(of), 0.0);
        };
        match cx.ty(z).numel() {
            1 => reshape(cx, z, &[]),
            c if c == o && of == w && cx.dims(z).len() == 1 => reshape(cx, z, &[o, 1, 1, 1]),
            _ => n.unsupported(format!("{name} of shape {}", cx.ty(z))),
        }
    };
    let xz = zero(cx, at[2], x, "x_zero_point")?;
    let wz = zero(cx, at[3], w, "w_zero_point")?;
    Ok((
        cx.op1(OpKind::ConvInteger(attrs), &[x4, w4, xz, wz])?,
        planar,
    ))
}

pub(super) fn conv_integer(cx: &mut Ctx, n: &Node) -> Result<Value> {
    let (y, planar) = integer_conv(cx, n, [0, 1, 2, 3], "ConvInteger")?;
    planar.back(cx, y)
}

/// QLinearConv as ONNX's reference computes it: the integer convolution, plus the i32 bias,
/// requantized ([`requantize`]); a per-channel `w_scale` (`[M]`) broadcasts as `[M, 1, 1]`.
pub(super) fn qlinear_conv(cx: &mut Ctx, n: &Node) -> Result<Value> {
    let (acc, planar) = integer_conv(cx, n, [0, 3, 2, 5], "QLinearConv")?;
    let channels = cx.dims(acc)[1];
    let acc = add_bias(cx, n, 8, acc, channels)?;
    let sx = n.input(1, "x_scale")?;
    let sw = n.input(4, "w_scale")?;
    let sw = match cx.dims(sw)[..] {
        [c] if c == channels && c != 1 => reshape(cx, sw, &[c, 1, 1])?,
        _ => sw,
    };
    let y = requantize(cx, n, acc, [sx, sw], [6, 7])?;
    planar.back(cx, y)
}

/// The i32 sums `acc` of a QLinear node as levels of its output: times
/// `scale_a * scale_b / y_scale` (that factor in f32, the product in f64, as numpy promotes an
/// int32 array times a float32; `y_scale` and `y_zero_point` are the inputs at `at`), then
/// `quantize_linear` with scale 1 and the output's zero point (rounding half to even and
/// saturating, as the reference's clip and round do).
fn requantize(
    cx: &mut Ctx,
    n: &Node,
    acc: Value,
    [sa, sb]: [Value; 2],
    at: [usize; 2],
) -> Result<Value> {
    let sy = n.input(at[0], "y_scale")?;
    let zy = n.input(at[1], "y_zero_point")?;
    for s in [sa, sb, sy] {
        if cx.dtype(s) != DType::F32 {
            return n.unsupported(format!("{} scales", cx.dtype(s)));
        }
    }
    let ab = binary(cx, BinaryOp::Mul, sa, sb)?;
    let factor = binary(cx, BinaryOp::Div, ab, sy)?;
    let factor = cast(cx, factor, DType::F64)?;
    let wide = cast(cx, acc, DType::F64)?;
    let y = binary(cx, BinaryOp::Mul, wide, factor)?;
    if cx.ty(zy).numel() != 1 {
        return n.unsupported(format!("a y_zero_point of shape {}", cx.ty(zy)));
    }
    let zy = reshape(cx, zy, &[])?;
    let one = cx.scalar(DType::F64, 1.0)?;
    cx.op1(OpKind::QuantizeLinear, &[y, one, zy])
}

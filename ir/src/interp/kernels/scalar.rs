//! The interpreter's element-by-element semantics: unary and binary arithmetic on floats and
//! integers, comparisons, casts, literals and quantization's rounding.

use super::R;
use crate::interp::{Buf, Val, wrap};
use crate::literal::{Literal, Scalar};
use crate::ops::{BinaryOp, CmpOp, UnaryOp};
use crate::types::{DType, TensorType};

pub(super) fn unary_f(op: UnaryOp, x: f64) -> f64 {
    match op {
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Rsqrt => 1.0 / x.sqrt(),
        UnaryOp::Reciprocal => 1.0 / x,
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        UnaryOp::Relu => {
            if x > 0.0 || x.is_nan() {
                x
            } else {
                0.0
            }
        }
        UnaryOp::Erf => libm::erf(x),
        UnaryOp::Gelu => 0.5 * x * (1.0 + libm::erf(x * std::f64::consts::FRAC_1_SQRT_2)),
        UnaryOp::Floor => x.floor(),
        UnaryOp::Ceil => x.ceil(),
        UnaryOp::Round => x.round_ties_even(),
    }
}

pub(super) fn unary_i(op: UnaryOp, x: i64) -> i64 {
    match op {
        UnaryOp::Neg => x.wrapping_neg(),
        UnaryOp::Abs => x.wrapping_abs(),
        UnaryOp::Relu => x.max(0),
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
        | UnaryOp::Round => unreachable!("type rules allow only neg, abs and relu on integers"),
    }
}

pub(super) fn binary_f(op: BinaryOp, a: f64, b: f64) -> f64 {
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        BinaryOp::Pow => a.powf(b),
        BinaryOp::Max | BinaryOp::Min if a.is_nan() || b.is_nan() => f64::NAN,
        BinaryOp::Max => {
            if a >= b {
                a
            } else {
                b
            }
        }
        BinaryOp::Min => {
            if a <= b {
                a
            } else {
                b
            }
        }
    }
}

/// Integer arithmetic in `i64`, wrapped to `dtype` by the caller. Division truncates; by zero it
/// is an error; overflow wraps.
pub(super) fn binary_i(op: BinaryOp, dtype: DType, a: i64, b: i64) -> R<i64> {
    Ok(match op {
        BinaryOp::Add => a.wrapping_add(b),
        BinaryOp::Sub => a.wrapping_sub(b),
        BinaryOp::Mul => a.wrapping_mul(b),
        BinaryOp::Div if b == 0 => return Err("integer division by zero".into()),
        // In the operands' own width: i8 -128 / -1 wraps to -128, as i64 division then wrapping.
        BinaryOp::Div => wrap(dtype, a).wrapping_div(wrap(dtype, b)),
        BinaryOp::Max => a.max(b),
        BinaryOp::Min => a.min(b),
        BinaryOp::Pow => unreachable!("type rules allow pow only on floats"),
    })
}

pub(super) fn compare<T: PartialOrd>(op: CmpOp, a: T, b: T) -> bool {
    match op {
        CmpOp::Eq => a == b,
        CmpOp::Ne => a != b,
        CmpOp::Lt => a < b,
        CmpOp::Le => a <= b,
        CmpOp::Gt => a > b,
        CmpOp::Ge => a >= b,
    }
}

pub(super) fn cast(v: &Val, to: DType) -> Buf {
    fn f_to_i(x: f64, to: DType) -> i64 {
        // Rust's `as`: truncate toward zero, saturate, NaN to 0.
        match to {
            DType::I8 => x as i8 as i64,
            DType::U8 => x as u8 as i64,
            DType::I32 => x as i32 as i64,
            _ => x as i64,
        }
    }
    match (&v.buf, to) {
        (Buf::F(x), DType::Bool) => Buf::B(x.iter().map(|&a| a != 0.0).collect()),
        (Buf::F(x), DType::F32 | DType::F64) => Buf::F(x.clone()),
        (Buf::F(x), _) => Buf::I(x.iter().map(|&a| f_to_i(a, to)).collect()),
        (Buf::I(x), DType::Bool) => Buf::B(x.iter().map(|&a| a != 0).collect()),
        // Directly to f32, not through f64: one rounding.
        (Buf::I(x), DType::F32) => Buf::F(x.iter().map(|&a| a as f32 as f64).collect()),
        (Buf::I(x), DType::F64) => Buf::F(x.iter().map(|&a| a as f64).collect()),
        (Buf::I(x), _) => Buf::I(x.clone()),
        (Buf::B(x), DType::Bool) => Buf::B(x.clone()),
        (Buf::B(x), DType::F32 | DType::F64) => Buf::F(x.iter().map(|&a| a as u8 as f64).collect()),
        (Buf::B(x), _) => Buf::I(x.iter().map(|&a| a as i64).collect()),
    }
}

pub(super) fn literal(ty: &TensorType, value: &Literal) -> Buf {
    let n = ty.numel() as usize;
    let int = |s: Scalar| match s {
        Scalar::I8(x) => x as i64,
        Scalar::U8(x) => x as i64,
        Scalar::I32(x) => x as i64,
        Scalar::I64(x) => x,
        _ => unreachable!("verified constant: an integer literal"),
    };
    match ty.dtype() {
        DType::F32 | DType::F64 => Buf::F((0..n).map(|i| value.get(i).to_f64()).collect()),
        DType::Bool => Buf::B((0..n).map(|i| value.get(i) == Scalar::Bool(true)).collect()),
        _ => Buf::I((0..n).map(|i| int(value.get(i))).collect()),
    }
}

/// `x / scale` (divided in f32 when `f32`) rounded half to even, plus `zero`, saturated to
/// `lo..=hi`; NaN gives `zero`.
pub(super) fn quantize(x: f64, scale: f64, zero: i64, f32: bool, (lo, hi): (i64, i64)) -> i64 {
    let q = if f32 {
        (x as f32 / scale as f32) as f64
    } else {
        x / scale
    };
    if q.is_nan() {
        return zero;
    }
    // Saturating in floats first: the level may be far outside any integer type.
    let level = q.round_ties_even() + zero as f64;
    level.clamp(lo as f64, hi as f64) as i64
}

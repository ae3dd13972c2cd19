//! Constant folding: evaluating elementwise and data-movement ops on constant operands.
//!
//! Semantics match what the IR reference documents: floats compute in their own precision,
//! integers wrap, `max`/`min` propagate NaN, casts follow Rust's `as` (float to int truncates
//! toward zero and saturates, NaN becomes 0) except that a cast to `bool` is `x != 0`. Anything
//! that would fail at run time (integer division by zero or overflow) is not folded.

use tcc_ir::typing::broadcasts_to;
use tcc_ir::{BinaryOp, CmpOp, DType, Data, Literal, OpKind, Scalar, TensorType, UnaryOp};

fn unary(op: UnaryOp, x: Scalar) -> Option<Scalar> {
    macro_rules! float {
        ($v:expr, $c:path, $t:ty) => {{
            let v: $t = $v;
            let one: $t = 1.0;
            $c(match op {
                UnaryOp::Neg => -v,
                UnaryOp::Abs => v.abs(),
                UnaryOp::Exp => v.exp(),
                UnaryOp::Log => v.ln(),
                UnaryOp::Sqrt => v.sqrt(),
                UnaryOp::Rsqrt => one / v.sqrt(),
                UnaryOp::Reciprocal => one / v,
                UnaryOp::Tanh => v.tanh(),
                UnaryOp::Sigmoid => one / (one + (-v).exp()),
                UnaryOp::Relu => {
                    if v > 0.0 {
                        v
                    } else if v.is_nan() {
                        v
                    } else {
                        0.0
                    }
                }
                // No erf in std; leave these for the runtime.
                UnaryOp::Erf | UnaryOp::Gelu => return None,
            })
        }};
    }
    macro_rules! int {
        ($v:expr, $c:path) => {{
            let v = $v;
            $c(match op {
                UnaryOp::Neg => v.wrapping_neg(),
                UnaryOp::Abs => v.wrapping_abs(),
                UnaryOp::Relu => v.max(0),
                _ => return None,
            })
        }};
    }
    Some(match x {
        Scalar::F32(v) => float!(v, Scalar::F32, f32),
        Scalar::F64(v) => float!(v, Scalar::F64, f64),
        Scalar::I8(v) => int!(v, Scalar::I8),
        Scalar::I32(v) => int!(v, Scalar::I32),
        Scalar::I64(v) => int!(v, Scalar::I64),
        Scalar::U8(v) => match op {
            UnaryOp::Abs | UnaryOp::Relu => Scalar::U8(v),
            _ => return None,
        },
        Scalar::Bool(_) => return None,
    })
}

fn binary(op: BinaryOp, a: Scalar, b: Scalar) -> Option<Scalar> {
    macro_rules! float {
        ($a:expr, $b:expr, $c:path) => {{
            let (a, b) = ($a, $b);
            $c(match op {
                BinaryOp::Add => a + b,
                BinaryOp::Sub => a - b,
                BinaryOp::Mul => a * b,
                BinaryOp::Div => a / b,
                BinaryOp::Pow => a.powf(b),
                BinaryOp::Max if a.is_nan() || b.is_nan() => a + b,
                BinaryOp::Min if a.is_nan() || b.is_nan() => a + b,
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
            })
        }};
    }
    macro_rules! int {
        ($a:expr, $b:expr, $c:path) => {{
            let (a, b) = ($a, $b);
            $c(match op {
                BinaryOp::Add => a.wrapping_add(b),
                BinaryOp::Sub => a.wrapping_sub(b),
                BinaryOp::Mul => a.wrapping_mul(b),
                BinaryOp::Div => a.checked_div(b)?,
                BinaryOp::Max => a.max(b),
                BinaryOp::Min => a.min(b),
                BinaryOp::Pow => return None,
            })
        }};
    }
    Some(match (a, b) {
        (Scalar::F32(a), Scalar::F32(b)) => float!(a, b, Scalar::F32),
        (Scalar::F64(a), Scalar::F64(b)) => float!(a, b, Scalar::F64),
        (Scalar::I8(a), Scalar::I8(b)) => int!(a, b, Scalar::I8),
        (Scalar::U8(a), Scalar::U8(b)) => int!(a, b, Scalar::U8),
        (Scalar::I32(a), Scalar::I32(b)) => int!(a, b, Scalar::I32),
        (Scalar::I64(a), Scalar::I64(b)) => int!(a, b, Scalar::I64),
        _ => return None,
    })
}

fn compare(op: CmpOp, a: Scalar, b: Scalar) -> Option<Scalar> {
    fn cmp<T: PartialOrd>(op: CmpOp, a: T, b: T) -> bool {
        match op {
            CmpOp::Eq => a == b,
            CmpOp::Ne => a != b,
            CmpOp::Lt => a < b,
            CmpOp::Le => a <= b,
            CmpOp::Gt => a > b,
            CmpOp::Ge => a >= b,
        }
    }
    Some(Scalar::Bool(match (a, b) {
        (Scalar::F32(a), Scalar::F32(b)) => cmp(op, a, b),
        (Scalar::F64(a), Scalar::F64(b)) => cmp(op, a, b),
        (Scalar::I8(a), Scalar::I8(b)) => cmp(op, a, b),
        (Scalar::U8(a), Scalar::U8(b)) => cmp(op, a, b),
        (Scalar::I32(a), Scalar::I32(b)) => cmp(op, a, b),
        (Scalar::I64(a), Scalar::I64(b)) => cmp(op, a, b),
        (Scalar::Bool(a), Scalar::Bool(b)) => cmp(op, a, b),
        _ => return None,
    }))
}

/// Converts a scalar to another dtype with the IR's cast semantics.
pub fn cast(x: Scalar, to: DType) -> Scalar {
    if to == DType::Bool {
        return Scalar::Bool(match x {
            Scalar::Bool(b) => b,
            // NaN != 0, so NaN casts to true.
            s => s.to_f64() != 0.0,
        });
    }
    macro_rules! to {
        ($v:expr) => {
            match to {
                DType::F32 => Scalar::F32($v as f32),
                DType::F64 => Scalar::F64($v as f64),
                DType::I8 => Scalar::I8($v as i8),
                DType::U8 => Scalar::U8($v as u8),
                DType::I32 => Scalar::I32($v as i32),
                DType::I64 => Scalar::I64($v as i64),
                DType::Bool => unreachable!(),
            }
        };
    }
    match x {
        Scalar::F32(v) => to!(v),
        Scalar::F64(v) => to!(v),
        Scalar::I8(v) => to!(v),
        Scalar::U8(v) => to!(v),
        Scalar::I32(v) => to!(v),
        Scalar::I64(v) => to!(v),
        Scalar::Bool(v) => to!(v as u8),
    }
}

/// Row-major strides of `dims`, with 0 for axes that broadcast into `out` (aligned right).
fn broadcast_strides(dims: &[u64], out: &[u64]) -> Vec<u64> {
    let mut strides = vec![0; out.len()];
    let mut s = 1;
    for (i, &d) in dims.iter().enumerate().rev() {
        let o = out.len() - dims.len() + i;
        strides[o] = if d == 1 { 0 } else { s };
        s *= d;
    }
    strides
}

/// For each output element, the index of the input element it reads under broadcasting.
fn broadcast_index(dims: &[u64], out: &[u64]) -> impl Iterator<Item = usize> {
    let strides = broadcast_strides(dims, out);
    let out = out.to_vec();
    let n: u64 = out.iter().product();
    (0..n).map(move |mut i| {
        let mut idx = 0;
        for (k, &d) in out.iter().enumerate().rev() {
            idx += (i % d) * strides[k];
            i /= d;
        }
        idx as usize
    })
}

/// A constant operand.
pub struct ConstArg<'a> {
    /// Its type.
    pub ty: &'a TensorType,
    /// Its value.
    pub value: &'a Literal,
}

/// Evaluates `kind` on constant operands to produce `out`. Returns `None` when the op is not
/// foldable here, or the result would be dense with more than `limit` elements.
pub fn fold(kind: &OpKind, args: &[ConstArg<'_>], out: &TensorType, limit: u64) -> Option<Literal> {
    let all_splat: Option<Vec<Scalar>> = args.iter().map(|a| a.value.as_splat()).collect();
    let elementwise = |f: &dyn Fn(&[Scalar]) -> Option<Scalar>| -> Option<Literal> {
        if let Some(s) = &all_splat {
            return Some(Literal::Splat(f(s)?));
        }
        if out.numel() > limit {
            return None;
        }
        let idx: Vec<Vec<usize>> = args
            .iter()
            .map(|a| broadcast_index(a.ty.dims(), out.dims()).collect())
            .collect();
        let mut data = Data::with_capacity(out.dtype(), out.numel() as usize);
        let mut xs = Vec::with_capacity(args.len());
        for i in 0..out.numel() as usize {
            xs.clear();
            xs.extend(args.iter().zip(&idx).map(|(a, ix)| a.value.get(ix[i])));
            data.push(f(&xs)?)?;
        }
        Some(Literal::Dense(data))
    };
    match kind {
        OpKind::Unary(u) => elementwise(&|x| unary(*u, x[0])),
        OpKind::Binary(b) => elementwise(&|x| binary(*b, x[0], x[1])),
        OpKind::Compare(c) => elementwise(&|x| compare(*c, x[0], x[1])),
        OpKind::Select => elementwise(&|x| {
            Some(if x[0] == Scalar::Bool(true) {
                x[1]
            } else {
                x[2]
            })
        }),
        OpKind::Cast { to } => elementwise(&|x| Some(cast(x[0], *to))),
        OpKind::Identity | OpKind::Reshape { .. } => Some(args[0].value.clone()),
        OpKind::BroadcastTo { .. } => {
            debug_assert!(broadcasts_to(args[0].ty.dims(), out.dims()));
            elementwise(&|x| Some(x[0]))
        }
        OpKind::Transpose { perm } => {
            if let Some(s) = &all_splat {
                return Some(Literal::Splat(s[0]));
            }
            if out.numel() > limit {
                return None;
            }
            let in_dims = args[0].ty.dims();
            let mut in_strides = vec![1u64; in_dims.len()];
            for i in (0..in_dims.len().saturating_sub(1)).rev() {
                in_strides[i] = in_strides[i + 1] * in_dims[i + 1];
            }
            let mut data = Data::with_capacity(out.dtype(), out.numel() as usize);
            for mut i in 0..out.numel() {
                let mut src = 0;
                for (k, &d) in out.dims().iter().enumerate().rev() {
                    src += (i % d) * in_strides[perm[k] as usize];
                    i /= d;
                }
                data.push(args[0].value.get(src as usize))?;
            }
            Some(Literal::Dense(data))
        }
        _ => None,
    }
}

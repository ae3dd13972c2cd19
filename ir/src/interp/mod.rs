//! The reference interpreter: runs every op directly and simply. It is the oracle that the JIT
//! and every pass that must not change results are tested against.
//!
//! Values are held in a wide form: floats as `f64`, integers as `i64`, booleans as `bool`. Each op
//! computes in that form (so sums, dot products, convolutions and softmax accumulate in `f64`) and
//! rounds its result to the declared dtype: `f32` results are rounded once, integer results wrap
//! to their width. Floats of dtype `f64` therefore compute in plain `f64`.
//!
//! Run-time errors (integer division by zero, an index out of range, a reduction of `max` over an
//! empty axis) name the op. Inputs are checked against the parameters before anything runs.
//! Control dependencies do not affect results (ops are pure) and are ignored.

mod kernels;

use crate::function::{Function, Op, Value, ValueDef};
use crate::literal::Data;
use crate::printer::write_name;
use crate::tensor::Tensor;
use crate::types::{DType, TensorType};
use cranelift_entity::SecondaryMap;
use std::fmt;

/// The `[min, max]` of `fake_quant` nudged so that zero is exactly one of the levels, and the
/// step between levels: `(nudged_min, nudged_max, scale)`, as TensorFlow's `Nudge` computes
/// them. `f32` says to round every operation to `f32` (TensorFlow's arithmetic for `f32`
/// tensors); the zero point rounds half away from zero (`std::round`). `None` unless
/// `min < max`.
pub fn fake_quant_range(
    min: f64,
    max: f64,
    bits: u64,
    narrow: bool,
    f32: bool,
) -> Option<(f64, f64, f64)> {
    let r = |v: f64| if f32 { v as f32 as f64 } else { v };
    if min.is_nan() || max.is_nan() || min >= max {
        return None;
    }
    let qmin = if narrow { 1.0 } else { 0.0 };
    let qmax = ((1u64 << bits) - 1) as f64;
    let scale = r(r(max - min) / (qmax - qmin));
    let zero_from_min = r(qmin - r(min / scale));
    let zero = if zero_from_min < qmin {
        qmin
    } else if zero_from_min > qmax {
        qmax
    } else {
        let t = zero_from_min.floor();
        if zero_from_min - t >= 0.5 { t + 1.0 } else { t }
    };
    Some((r((qmin - zero) * scale), r((qmax - zero) * scale), scale))
}

/// `fake_quant` of one element (see [`fake_quant_range`]): clamped to the nudged range, then
/// `floor((x - nudged_min) / scale + 0.5) * scale + nudged_min`, with the reciprocal of the
/// scale computed once as TensorFlow does. NaN when `min < max` does not hold.
pub fn fake_quant(x: f64, min: f64, max: f64, bits: u64, narrow: bool, f32: bool) -> f64 {
    let r = |v: f64| if f32 { v as f32 as f64 } else { v };
    let Some((lo, hi, scale)) = fake_quant_range(min, max, bits, narrow, f32) else {
        return f64::NAN;
    };
    if x.is_nan() {
        return x;
    }
    let inv = r(1.0 / scale);
    let clamped = x.max(lo).min(hi);
    let shifted = r(clamped - lo);
    let level = r(r(shifted * inv) + 0.5).floor();
    r(r(level * scale) + lo)
}

/// A failure while interpreting: bad inputs, or a run-time error in an op.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InterpError(pub String);

impl fmt::Display for InterpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for InterpError {}

/// Elements in wide form.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Buf {
    F(Vec<f64>),
    I(Vec<i64>),
    B(Vec<bool>),
}

/// A value during interpretation.
#[derive(Clone, Debug)]
pub(crate) struct Val {
    pub ty: TensorType,
    pub buf: Buf,
}

impl Val {
    pub fn f(&self) -> &[f64] {
        match &self.buf {
            Buf::F(v) => v,
            _ => unreachable!("verified IR: a float operand"),
        }
    }
    pub fn i(&self) -> &[i64] {
        match &self.buf {
            Buf::I(v) => v,
            _ => unreachable!("verified IR: an integer operand"),
        }
    }
    pub fn b(&self) -> &[bool] {
        match &self.buf {
            Buf::B(v) => v,
            _ => unreachable!("verified IR: a bool operand"),
        }
    }
    pub fn dims(&self) -> &[u64] {
        self.ty.dims()
    }
}

/// Wraps an integer to the width of `dtype`.
pub(crate) fn wrap(dtype: DType, v: i64) -> i64 {
    match dtype {
        DType::I8 => v as i8 as i64,
        DType::U8 => v as u8 as i64,
        DType::I32 => v as i32 as i64,
        _ => v,
    }
}

/// Rounds a wide buffer to `dtype`'s precision or width.
pub(crate) fn round(dtype: DType, buf: Buf) -> Buf {
    match (dtype, buf) {
        (DType::F32, Buf::F(mut v)) => {
            v.iter_mut().for_each(|x| *x = *x as f32 as f64);
            Buf::F(v)
        }
        (DType::I8 | DType::U8 | DType::I32, Buf::I(mut v)) => {
            v.iter_mut().for_each(|x| *x = wrap(dtype, *x));
            Buf::I(v)
        }
        (_, buf) => buf,
    }
}

fn widen(t: &Tensor) -> Val {
    let buf = match t.data() {
        Data::F32(v) => Buf::F(v.iter().map(|&x| x as f64).collect()),
        Data::F64(v) => Buf::F(v.clone()),
        Data::I8(v) => Buf::I(v.iter().map(|&x| x as i64).collect()),
        Data::U8(v) => Buf::I(v.iter().map(|&x| x as i64).collect()),
        Data::I32(v) => Buf::I(v.iter().map(|&x| x as i64).collect()),
        Data::I64(v) => Buf::I(v.clone()),
        Data::Bool(v) => Buf::B(v.clone()),
    };
    Val {
        ty: t.ty().clone(),
        buf,
    }
}

fn narrow(v: Val) -> Tensor {
    let data = match (v.ty.dtype(), v.buf) {
        (DType::F32, Buf::F(x)) => Data::F32(x.into_iter().map(|a| a as f32).collect()),
        (DType::F64, Buf::F(x)) => Data::F64(x),
        (DType::I8, Buf::I(x)) => Data::I8(x.into_iter().map(|a| a as i8).collect()),
        (DType::U8, Buf::I(x)) => Data::U8(x.into_iter().map(|a| a as u8).collect()),
        (DType::I32, Buf::I(x)) => Data::I32(x.into_iter().map(|a| a as i32).collect()),
        (DType::I64, Buf::I(x)) => Data::I64(x),
        (DType::Bool, Buf::B(x)) => Data::Bool(x),
        (d, _) => unreachable!("a {d} value with the wrong buffer kind"),
    };
    Tensor::new(v.ty, data).expect("the interpreter keeps types and element counts")
}

fn vname(f: &Function, v: Value) -> String {
    let mut s = String::new();
    let _ = write_name(&mut s, '%', f.name(v));
    crate::diag::clip(&s)
}

/// Checks `inputs` against the parameters of `f`: count, dtype and shape.
pub fn check_inputs(f: &Function, inputs: &[Tensor]) -> Result<(), InterpError> {
    let types: Vec<&TensorType> = inputs.iter().map(Tensor::ty).collect();
    check_input_types(f, &types)
}

/// [`check_inputs`] on the inputs' types.
pub fn check_input_types(f: &Function, inputs: &[&TensorType]) -> Result<(), InterpError> {
    if inputs.len() != f.params().len() {
        return Err(InterpError(format!(
            "`@{}` takes {} input(s), got {}",
            f.name,
            f.params().len(),
            inputs.len()
        )));
    }
    for (&p, &ty) in f.params().iter().zip(inputs) {
        if ty != f.ty(p) {
            return Err(InterpError(format!(
                "input for parameter {} of `@{}`: expected {}, got {ty}",
                vname(f, p),
                f.name,
                f.ty(p),
            )));
        }
    }
    Ok(())
}

/// The most elements one value may have in the interpreter (2^30: 8 GiB in wide form).
pub const MAX_ELEMENTS: u64 = 1 << 30;

/// Checks that every parameter and op result of `f` is small enough to interpret, so that an
/// absurd shape is an error before anything is allocated.
pub fn check_sizes(f: &Function) -> Result<(), InterpError> {
    let values = f
        .params()
        .iter()
        .chain(f.schedule().iter().flat_map(|&op| f.op(op).results.iter()));
    for &v in values {
        if f.ty(v).numel() > MAX_ELEMENTS {
            return Err(InterpError(format!(
                "{} has type {} ({} elements); the interpreter holds at most 2^30 elements per value",
                vname(f, v),
                f.ty(v),
                f.ty(v).numel()
            )));
        }
    }
    Ok(())
}

/// Runs `f` on `inputs` and returns its results. The function must verify.
pub fn run(f: &Function, inputs: &[Tensor]) -> Result<Vec<Tensor>, InterpError> {
    check_sizes(f)?;
    check_inputs(f, inputs)?;
    let sched = f.schedule();
    // Free each value after its last use; results live to the end.
    let mut last_use: SecondaryMap<Value, usize> =
        SecondaryMap::with_capacity(f.num_values_created());
    for (i, &op) in sched.iter().enumerate() {
        for &a in &f.op(op).args {
            last_use[a] = i;
        }
    }
    for &r in f.results() {
        last_use[r] = usize::MAX;
    }
    let mut vals: SecondaryMap<Value, Option<Val>> =
        SecondaryMap::with_capacity(f.num_values_created());
    for (&p, t) in f.params().iter().zip(inputs) {
        vals[p] = Some(widen(t));
    }
    for (i, &op) in sched.iter().enumerate() {
        let d = f.op(op);
        let outs = {
            let args: Vec<&Val> = d
                .args
                .iter()
                .map(|&a| {
                    vals[a]
                        .as_ref()
                        .expect("verified IR: operands are defined before use")
                })
                .collect();
            let tys: Vec<TensorType> = d.results.iter().map(|&r| f.ty(r).clone()).collect();
            kernels::eval(&d.kind, &args, &tys).map_err(|e| op_error(f, op, e))?
        };
        for (&r, v) in d.results.iter().zip(outs) {
            debug_assert_eq!(&v.ty, f.ty(r));
            vals[r] = Some(v);
        }
        for &a in &d.args {
            if last_use[a] == i && !matches!(f.value(a).def, ValueDef::Param(_)) {
                vals[a] = None;
            }
        }
    }
    Ok(f.results()
        .iter()
        .map(|&r| {
            let v = vals[r].clone().expect("verified IR: results are defined");
            narrow(v)
        })
        .collect())
}

fn op_error(f: &Function, op: Op, msg: String) -> InterpError {
    InterpError(format!(
        "in `@{}`, {}: {msg}",
        f.name,
        crate::diag::clip(&f.describe_op(op))
    ))
}

/// A constant operand, for [`fold`].
pub struct ConstArg<'a> {
    /// Its type.
    pub ty: &'a TensorType,
    /// Its value.
    pub value: &'a crate::literal::Literal,
}

/// Evaluates `kind` on constant operands, giving each result (of the types `out`) as a literal:
/// exactly what running the op would produce. When every operand is a splat and the op is
/// elementwise or only moves data (`broadcast_to`, `reshape`, `transpose`), the result is a
/// splat of any size and nothing is materialised. Otherwise the reference kernels run, if no
/// operand or result has more than `limit` elements; `None` when one does. `Some(Err)` is the
/// op's run-time error.
pub fn fold(
    kind: &crate::ops::OpKind,
    args: &[ConstArg<'_>],
    out: &[TensorType],
    limit: u64,
) -> Option<Result<Vec<crate::literal::Literal>, String>> {
    use crate::literal::Literal;
    use crate::ops::OpKind;
    let moves_data = matches!(
        kind,
        OpKind::BroadcastTo { .. } | OpKind::Reshape { .. } | OpKind::Transpose { .. }
    );
    let splats: Option<Vec<crate::literal::Scalar>> =
        args.iter().map(|a| a.value.as_splat()).collect();
    if let (Some(s), true, [o]) = (splats, moves_data || kind.is_elementwise(), out) {
        if moves_data {
            return Some(Ok(vec![Literal::Splat(s[0])]));
        }
        // Elementwise on splats: compute one element.
        let scalars: Vec<Tensor> = s
            .iter()
            .map(|&x| Tensor::splat(TensorType::scalar(x.dtype()), x).expect("a scalar"))
            .collect();
        let refs: Vec<&Tensor> = scalars.iter().collect();
        return Some(
            eval_op(kind, &refs, &[TensorType::scalar(o.dtype())])
                .map(|r| vec![Literal::Splat(r[0].data().get(0))]),
        );
    }
    if out
        .iter()
        .chain(args.iter().map(|a| a.ty))
        .any(|t| t.numel() > limit)
    {
        return None;
    }
    let tensors: Vec<Tensor> = args
        .iter()
        .map(|a| Tensor::from_literal(a.ty, a.value).expect("verified constants"))
        .collect();
    let refs: Vec<&Tensor> = tensors.iter().collect();
    Some(eval_op(kind, &refs, out).map(|r| {
        r.into_iter()
            .map(|t| Literal::dense(t.into_data()))
            .collect()
    }))
}

/// Evaluates one op on operands given as tensors (for constant folding, and for runtimes that
/// fall back to the reference kernels). The error is the run-time error, without the op's name.
pub fn eval_op(
    kind: &crate::ops::OpKind,
    args: &[&Tensor],
    out: &[TensorType],
) -> Result<Vec<Tensor>, String> {
    let wide: Vec<Val> = args.iter().map(|t| widen(t)).collect();
    let refs: Vec<&Val> = wide.iter().collect();
    kernels::eval(kind, &refs, out).map(|vs| vs.into_iter().map(narrow).collect())
}

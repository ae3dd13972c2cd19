//! `qdq`: convolutions and matrix products of dequantized operands run on integers.
//!
//! ONNX's QDQ form (what onnxruntime's `quantize_static` writes by default, and what PyTorch and
//! TensorFlow Lite converters export) keeps float ops and marks their quantized operands with
//! `DequantizeLinear`: `conv2d(dequantize_linear(xq, sx, zx), dequantize_linear(wq, sw, zw))`.
//! Since `dequantize_linear(q, s, z) = (q - z) * s`, that convolution is
//! `conv_integer(xq, wq, zx, zw) * (sx * sw)`: the sums exact in i32, then one multiply per
//! output (per output channel for per-channel weights). The same holds for `matmul` and
//! `matmul_integer`, per column of the right operand. What follows (the bias, the
//! `quantize_linear` of the next layer's input) stays as it is.
//!
//! The result differs from the float form only by rounding: the float convolution rounds each
//! partial sum to f32, the integer one is exact until the final `cast`. Operands whose zero
//! points or scales have other shapes (per input channel, per row of the left operand) are left
//! in float, as are operands that reach the op through a reshape or transpose.
//!
//! A `transpose` or `reshape` of a per-tensor dequantization (a `Gemm` with `transB` leaves
//! its weights so) is moved above it first. The dequantizations the rewrite leaves whose
//! operands are constants are folded afterwards (with the moves of constants), as the ONNX
//! importer folds other constant subgraphs, so that they do not run on every call.
//!
//! It runs first in the inference pipeline: `canonicalize` would fold the dequantization of
//! small constant weights into float constants, and then the quantized weights are gone.

use super::Emit;
use crate::canonicalize::fold::{const_args, fold};
use crate::manager::Pass;
use std::collections::HashSet;
use tcc_ir::{BinaryOp, DType, Function, Op, OpKind, Scalar, Value};

/// The most elements a constant the pass folds may have (as the ONNX importer's limit).
const FOLD_LIMIT: u64 = 1 << 20;

/// The pass object.
pub struct Qdq;

impl Pass for Qdq {
    fn name(&self) -> &'static str {
        "qdq"
    }

    fn run_on_function(&self, f: &mut Function) -> Result<(), String> {
        qdq(f);
        Ok(())
    }
}

/// Rewrites every convolution and matrix product of two dequantized operands (see the module
/// docs), and max poolings between a dequantization and a quantization with the same scale
/// and zero point onto the levels, as those between a bounded float and a quantization;
/// returns how many products.
pub fn qdq(f: &mut Function) -> usize {
    move_above_dequantize(f);
    let pooled = pool_on_levels(f);
    let poolings = pooled.len();
    let schedule: Vec<Op> = f.schedule().to_vec();
    let mut names: Vec<(Value, String)> = pooled;
    let mut created: HashSet<Op> = HashSet::new();
    for op in schedule {
        let Some((ops, y)) = integer_form(f, op) else {
            continue;
        };
        for &n in &ops {
            f.insert_before(n, op);
        }
        created.extend(ops);
        let old = f.op(op).results[0];
        f.replace_all_uses(old, y);
        names.push((y, f.name(old).to_string()));
    }
    let products = names.len() - poolings;
    crate::dce(f);
    fold_constants(f, &created);
    let requantized = quantize_before_pool(f);
    if !requantized.is_empty() {
        crate::dce(f);
    }
    names.extend(requantized);
    // Each product keeps the name of the float op it replaces, free once that op is gone.
    for (y, name) in &names {
        if f.lookup(name).is_none() {
            f.rename(*y, name);
        }
    }
    products
}

/// `(q, scale, zero_point)` when `v` is `dequantize_linear` of u8 or i8 levels.
fn dequantized(f: &Function, v: Value) -> Option<(Value, Value, Value)> {
    let d = f.op(f.def_op(v)?);
    if !matches!(d.kind, OpKind::DequantizeLinear) || !d.deps.is_empty() {
        return None;
    }
    let q = d.args[0];
    matches!(f.ty(q).dtype(), DType::U8 | DType::I8).then_some((q, d.args[1], d.args[2]))
}

/// The new ops for `op` in integer form and the value that replaces its result, if `op` is a
/// convolution or matrix product of dequantized operands whose scales and zero points the
/// integer ops take.
fn integer_form(f: &mut Function, op: Op) -> Option<(Vec<Op>, Value)> {
    let d = f.op(op);
    if !d.deps.is_empty() {
        return None;
    }
    let int_kind = match &d.kind {
        OpKind::Conv2d(c) => OpKind::ConvInteger(c.clone()),
        OpKind::MatMul => OpKind::MatMulInteger,
        _ => return None,
    };
    let (kind, out) = (d.kind.clone(), d.results[0]);
    let (a, b) = (d.args[0], d.args[1]);
    let (aq, sa, za) = dequantized(f, a)?;
    let (bq, sb, zb) = dequantized(f, b)?;
    let dt = f.ty(out).dtype();
    let numel = |v: Value| f.ty(v).numel();
    let dims = |v: Value| f.ty(v).dims().to_vec();
    // The right operand's scale along its output axis: a filter's `[O, 1, 1, 1]` as `[O, 1, 1]`
    // (the output's channels), a matrix's `[N]` as it is (its columns).
    let per = match &kind {
        OpKind::Conv2d(_) => {
            let o = dims(bq)[0];
            (dims(zb) == [o, 1, 1, 1]).then_some(vec![o, 1, 1])
        }
        _ => {
            let n = *dims(bq).last()?;
            (dims(zb) == [n]).then_some(vec![n])
        }
    };
    if numel(za) != 1 || numel(sa) != 1 || (numel(zb) != 1 && per.is_none()) {
        return None;
    }
    let mut e = Emit { f, ops: Vec::new() };
    let built = (|| -> Result<Value, String> {
        let scalar = |e: &mut Emit, v: Value| e.op(OpKind::Reshape { shape: vec![] }, &[v], "qdq");
        let za = scalar(&mut e, za)?;
        let sa = scalar(&mut e, sa)?;
        let (zb, sb) = match &per {
            None => (scalar(&mut e, zb)?, scalar(&mut e, sb)?),
            Some(shape) => {
                let shape = shape.clone();
                (zb, e.op(OpKind::Reshape { shape }, &[sb], "qdq")?)
            }
        };
        let acc = e.op(int_kind, &[aq, bq, za, zb], "qdq")?;
        let acc = e.op(OpKind::Cast { to: dt }, &[acc], "qdq")?;
        let scale = e.bin(BinaryOp::Mul, sa, sb, "qdq")?;
        e.bin(BinaryOp::Mul, acc, scale, "qdq")
    })();
    let ops = e.ops;
    // Nothing is scheduled on failure; the unscheduled ops go with the dead ones.
    let y = built.ok()?;
    (f.ty(y) == f.ty(out)).then_some((ops, y))
}

/// Rewrites `transpose` or `reshape` of `dequantize_linear(q, s, z)` with one scale and zero
/// point as `dequantize_linear` of the moved levels.
fn move_above_dequantize(f: &mut Function) {
    for op in f.schedule().to_vec() {
        let d = f.op(op);
        if !matches!(d.kind, OpKind::Transpose { .. } | OpKind::Reshape { .. })
            || !d.deps.is_empty()
        {
            continue;
        }
        let (kind, out) = (d.kind.clone(), d.results[0]);
        let Some((q, s, z)) = dequantized(f, d.args[0]) else {
            continue;
        };
        if f.ty(s).numel() != 1 || f.ty(z).numel() != 1 {
            continue;
        }
        let mut e = Emit { f, ops: Vec::new() };
        let built = (|| -> Result<Value, String> {
            let moved = e.op(kind, &[q], "qdq")?;
            e.op(OpKind::DequantizeLinear, &[moved, s, z], "qdq")
        })();
        let ops = e.ops;
        let Ok(y) = built else { continue };
        for n in ops {
            f.insert_before(n, op);
        }
        f.replace_all_uses(out, y);
    }
}

/// The value of `v` if it is a constant of one element.
fn scalar_constant(f: &Function, v: Value) -> Option<Scalar> {
    match &f.op(f.def_op(v)?).kind {
        OpKind::Const { ty, value } if ty.numel() == 1 => Some(value.get(0)),
        _ => None,
    }
}

/// Rewrites `quantize_linear(max_pool2d(dequantize_linear(q, s, z)), s, z)`, the same constant
/// scale and zero point at both ends (what onnxruntime's QDQ models put around a max pooling),
/// as `max_pool2d(q)`: exactly the same levels. Dequantizing is non-decreasing for `s > 0`, so
/// the maximum of the dequantized window is the dequantized maximum; and quantizing
/// `fl((q - z) * s)` again gives `q`, the relative error of the two roundings (3e-5 at most
/// for `|q - z| <= 255`) being far from a half, as long as `s` is at least 2^-100 (no
/// subnormal products). The float pooling is left to any other readers. Returns each new
/// pooling's result with the name of the quantization it replaces.
fn pool_on_levels(f: &mut Function) -> Vec<(Value, String)> {
    let mut names = Vec::new();
    for op in f.schedule().to_vec() {
        let d = f.op(op);
        if d.kind != OpKind::QuantizeLinear || !d.deps.is_empty() {
            continue;
        }
        let (pooled, out) = (d.args[0], d.results[0]);
        let at_end = (scalar_constant(f, d.args[1]), scalar_constant(f, d.args[2]));
        let Some(pool) = f.def_op(pooled) else {
            continue;
        };
        let OpKind::MaxPool2d(window) = &f.op(pool).kind else {
            continue;
        };
        let window = window.clone();
        let Some((q, s, z)) = dequantized(f, f.op(pool).args[0]) else {
            continue;
        };
        let at_start = (scalar_constant(f, s), scalar_constant(f, z));
        let scale_ok =
            matches!(at_start.0, Some(Scalar::F32(s)) if s.is_finite() && s >= 2f32.powi(-100));
        if !scale_ok
            || at_start != at_end
            || f.ty(q).dtype() != f.ty(out).dtype()
            || f.ty(q).rank() != 4
            || !f.op(pool).deps.is_empty()
        {
            continue;
        }
        let ty = f.ty(out).clone();
        let name = format!("{}/levels", f.name(out));
        let new = f.create_op(OpKind::MaxPool2d(window), vec![q], vec![ty], &[&name]);
        f.insert_before(new, op);
        let y = f.op(new).results[0];
        f.replace_all_uses(out, y);
        names.push((y, f.name(out).to_string()));
    }
    names
}

/// Rewrites `quantize_linear(max_pool2d(y), s, z)`, where the pooling has no other reader,
/// `s` is one positive finite constant and `y` is bounded ([`bound`]: an integer product's
/// requantizing chain, as `tcc quantize` leaves a stem's pooling), as
/// `max_pool2d(quantize_linear(y, s, z))`: the same levels, as quantizing is non-decreasing
/// (a quotient by `s > 0`, rounding, saturation) and so commutes with a maximum, where no
/// element is NaN. Then the chain stores levels and the pooling reads bytes. Returns each new
/// pooling's result with the name of the quantization it replaces (the old ops left dead).
fn quantize_before_pool(f: &mut Function) -> Vec<(Value, String)> {
    // One view of the uses for every candidate: a rewrite adds readers only of its own chain's
    // value and takes them only from its own pooling.
    let users = tcc_ir::edit::Users::new(f);
    let mut names = Vec::new();
    for op in f.schedule().to_vec() {
        let d = f.op(op);
        if d.kind != OpKind::QuantizeLinear || !d.deps.is_empty() {
            continue;
        }
        let (pooled, scale, zero, out) = (d.args[0], d.args[1], d.args[2], d.results[0]);
        let Some(pool) = f.def_op(pooled) else {
            continue;
        };
        let OpKind::MaxPool2d(window) = &f.op(pool).kind else {
            continue;
        };
        let (window, y) = (window.clone(), f.op(pool).args[0]);
        let positive = |s: Scalar| s.to_f64().is_finite() && s.to_f64() > 0.0;
        if !matches!(scalar_constant(f, scale), Some(s) if positive(s))
            || !f.op(pool).deps.is_empty()
            || users.uses(pooled).len() != 1
            || users.is_returned(pooled)
            || f.ty(y).dtype() != DType::F32
            || bound(f, y).is_none()
        {
            continue;
        }
        let name = format!("{}/levels", f.name(y));
        let levels = tcc_ir::TensorType::new(f.ty(out).dtype(), f.ty(y).dims().to_vec())
            .expect("the dims of a typed value");
        let q = f.create_op(
            OpKind::QuantizeLinear,
            vec![y, scale, zero],
            vec![levels],
            &[&name],
        );
        f.insert_before(q, op);
        let q = f.op(q).results[0];
        let ty = f.ty(out).clone();
        let new = f.create_op(OpKind::MaxPool2d(window), vec![q], vec![ty], &["pooled"]);
        f.insert_before(new, op);
        let new = f.op(new).results[0];
        f.replace_all_uses(out, new);
        names.push((new, f.name(out).to_string()));
    }
    names
}

/// Bounds [`bound`] keeps below: far from f32's largest finite value (3.4e38) so that no step
/// rounds to infinity.
const LARGE: f64 = 1e37;

/// A bound below [`LARGE`] on the magnitude of every element of `v` at every step that makes
/// it (none: NaN, unbounded or too large as far as this knows), so that it holds no infinity
/// and no NaN: an integer cast to float, then products and sums with constants, `relu`, and
/// maxima and minima with constants.
fn bound(f: &Function, v: Value) -> Option<f64> {
    let d = f.op(f.def_op(v)?);
    if !d.deps.is_empty() {
        return None;
    }
    let constant = |v: Value| -> Option<f64> {
        let OpKind::Const { value, .. } = &f.op(f.def_op(v)?).kind else {
            return None;
        };
        let most = match value {
            tcc_ir::Literal::Splat(s) => s.to_f64().abs(),
            tcc_ir::Literal::Dense(d) => (d.to_f64s().iter()).fold(0f64, |m, x| m.max(x.abs())),
        };
        (most < LARGE).then_some(most)
    };
    // The operand that is not a constant, with the constant's bound.
    let with_constant = || match (constant(d.args[0]), constant(d.args[1])) {
        (None, Some(c)) => Some((d.args[0], c)),
        (Some(c), None) => Some((d.args[1], c)),
        _ => None,
    };
    match &d.kind {
        OpKind::Cast { .. } => match f.ty(d.args[0]).dtype() {
            DType::I8 | DType::U8 => Some(256.0),
            DType::I32 => Some(2f64.powi(31)),
            _ => None,
        },
        OpKind::Unary(tcc_ir::UnaryOp::Relu) => bound(f, d.args[0]),
        OpKind::Binary(op) => {
            let (x, c) = with_constant()?;
            let b = bound(f, x)?;
            let r = match op {
                BinaryOp::Mul => b * c,
                BinaryOp::Add | BinaryOp::Sub => b + c,
                BinaryOp::Max | BinaryOp::Min => b.max(c),
                _ => return None,
            };
            (r < LARGE).then_some(r)
        }
        _ => None,
    }
}

/// Folds every dequantization, transpose and reshape of constants, and every op of `created`
/// (the products of the scales) on constants, into a constant (up to [`FOLD_LIMIT`] elements),
/// in schedule order so that chains fold. A per-channel scale must be a constant for the CPU
/// backend to fuse the requantization into the integer op's store; `canonicalize` folds only
/// small ones.
fn fold_constants(f: &mut Function, created: &HashSet<Op>) {
    for op in f.schedule().to_vec() {
        let d = f.op(op);
        let foldable = created.contains(&op)
            || matches!(
                d.kind,
                OpKind::DequantizeLinear | OpKind::Transpose { .. } | OpKind::Reshape { .. }
            );
        if !foldable || !d.deps.is_empty() {
            continue;
        }
        let out = f.ty(d.results[0]).clone();
        let Some(value) = const_args(f, &d.args).and_then(|c| fold(&d.kind, &c, &out, FOLD_LIMIT))
        else {
            continue;
        };
        let d = f.op_mut(op);
        d.kind = OpKind::Const { ty: out, value };
        d.args.clear();
    }
    crate::dce(f);
}

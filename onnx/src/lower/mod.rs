//! Lowering: each ONNX op as tcc IR ops. [`lower`] is the table; an op type missing from it is
//! an "unsupported" error naming the op, the node and the opset.

use crate::ctx::{
    Ctx, Node, axes_of, axis, binary, cast, compare, const_input, const_ints, matrix_view,
    non_negative, reshape, tensor_i64, unary,
};
use crate::{Error, Result, tensor};
use conv::{conv, conv_transpose, gemm, global, matmul, max_pool_with_indices, pool};
use elementwise::{clip, dropout, elu, gelu, hard_sigmoid, leaky_relu, modulo, pow, softplus};
use quant::{
    conv_integer, dynamic_quantize_linear, matmul_integer, qlinear_conv, qlinear_matmul,
    quantize_linear,
};
use reduce::{batch_norm_training, layer_norm, lrn, reduce, reduce_composite, softmax};
use shape::{constant, pad, reshape_dims, slice, split, trilu};
use tcc_ir::ops::F64;
use tcc_ir::typing::broadcast_shapes;
use tcc_ir::{
    BinaryOp, CmpOp, DType, Data, OpKind, ReduceOp, Scalar, Tensor, TensorType, UnaryOp, Value,
};

mod conv;
mod einsum;
mod elementwise;
mod loss;
mod quant;
mod reduce;
mod resize;
mod rnn;
mod shape;

/// Lowers `n`; the result has one entry per output the lowering provides.
pub(crate) fn lower(cx: &mut Ctx, n: &Node) -> Result<Vec<Option<Value>>> {
    use BinaryOp as B;
    use UnaryOp as U;
    let one = |v: Value| Ok(vec![Some(v)]);
    let x = || n.input(0, "the input");
    match n.op_type() {
        "Neg" => one(unary(cx, U::Neg, x()?)?),
        "Abs" => one(unary(cx, U::Abs, x()?)?),
        "Exp" => one(unary(cx, U::Exp, x()?)?),
        "Log" => one(unary(cx, U::Log, x()?)?),
        "Sqrt" => one(unary(cx, U::Sqrt, x()?)?),
        "Reciprocal" => one(unary(cx, U::Reciprocal, x()?)?),
        "Tanh" => one(unary(cx, U::Tanh, x()?)?),
        "Sigmoid" => one(unary(cx, U::Sigmoid, x()?)?),
        "Relu" => one(unary(cx, U::Relu, x()?)?),
        "Erf" => one(unary(cx, U::Erf, x()?)?),
        "Einsum" => one(einsum::einsum(cx, n)?),
        "TopK" => reduce::top_k(cx, n),
        "ArgMax" => one(reduce::arg_extreme(cx, n, true)?),
        "ArgMin" => one(reduce::arg_extreme(cx, n, false)?),
        "Floor" => one(unary(cx, U::Floor, x()?)?),
        "Ceil" => one(unary(cx, U::Ceil, x()?)?),
        "Round" => one(unary(cx, U::Round, x()?)?),
        "Add" => one(binop(cx, n, B::Add)?),
        "Sub" => one(binop(cx, n, B::Sub)?),
        "Mul" => one(binop(cx, n, B::Mul)?),
        "Div" => one(binop(cx, n, B::Div)?),
        "Pow" => {
            let b = legacy_b(cx, n)?;
            one(pow(cx, x()?, b)?)
        }
        "Max" => one(variadic(cx, n, B::Max)?),
        "Min" => one(variadic(cx, n, B::Min)?),
        "Sum" => one(variadic(cx, n, B::Add)?),
        "Mean" => {
            let s = variadic(cx, n, B::Add)?;
            let k = cx.scalar(cx.dtype(s), n.ins.len() as f64)?;
            one(binary(cx, B::Div, s, k)?)
        }
        "Equal" => one(cmpop(cx, n, CmpOp::Eq)?),
        "Less" => one(cmpop(cx, n, CmpOp::Lt)?),
        "LessOrEqual" => one(cmpop(cx, n, CmpOp::Le)?),
        "Greater" => one(cmpop(cx, n, CmpOp::Gt)?),
        "GreaterOrEqual" => one(cmpop(cx, n, CmpOp::Ge)?),
        "Where" => {
            let (c, a, b) = (x()?, n.input(1, "X")?, n.input(2, "Y")?);
            one(cx.op1(OpKind::Select, &[c, a, b])?)
        }
        "Not" => {
            let x = x()?;
            let f = cx.scalar(DType::Bool, 0.0)?;
            one(compare(cx, CmpOp::Eq, x, f)?)
        }
        "And" | "Or" | "Xor" => {
            let a = x()?;
            let b = legacy_b(cx, n)?;
            one(match n.op_type() {
                "And" => {
                    let f = cx.scalar(DType::Bool, 0.0)?;
                    cx.op1(OpKind::Select, &[a, b, f])?
                }
                "Or" => {
                    let t = cx.scalar(DType::Bool, 1.0)?;
                    cx.op1(OpKind::Select, &[a, t, b])?
                }
                _ => compare(cx, CmpOp::Ne, a, b)?,
            })
        }
        "Mod" => one(modulo(cx, n)?),
        "RNN" | "GRU" | "LSTM" => rnn::recurrent(cx, n),
        "Resize" | "Upsample" => one(resize::resize(cx, n)?),
        "SoftmaxCrossEntropyLoss" => loss::softmax_cross_entropy(cx, n),
        "NegativeLogLikelihoodLoss" => one(loss::negative_log_likelihood(cx, n)?),
        "Softplus" => one(softplus(cx, x()?)?),
        "Swish" => {
            // x * sigmoid(alpha * x)
            let x = x()?;
            let a = cx.scalar(cx.dtype(x), n.float("alpha", 1.0)? as f64)?;
            let ax = binary(cx, B::Mul, x, a)?;
            let s = unary(cx, U::Sigmoid, ax)?;
            one(binary(cx, B::Mul, x, s)?)
        }
        "Softsign" => {
            let x = x()?;
            let a = unary(cx, U::Abs, x)?;
            let one_ = cx.scalar(cx.dtype(x), 1.0)?;
            let d = binary(cx, B::Add, a, one_)?;
            one(binary(cx, B::Div, x, d)?)
        }
        "Mish" => {
            let x = x()?;
            let sp = softplus(cx, x)?;
            let t = unary(cx, U::Tanh, sp)?;
            one(binary(cx, B::Mul, x, t)?)
        }
        "HardSigmoid" => {
            let (alpha, beta) = (n.float("alpha", 0.2)? as f64, n.float("beta", 0.5)? as f64);
            one(hard_sigmoid(cx, x()?, alpha, beta)?)
        }
        "HardSwish" => {
            let x = x()?;
            let h = hard_sigmoid(cx, x, 1.0 / 6.0, 0.5)?;
            one(binary(cx, B::Mul, x, h)?)
        }
        "Selu" => {
            let alpha = n.float("alpha", 1.673_263_2)? as f64;
            let gamma = n.float("gamma", 1.050_701)? as f64;
            let x = x()?;
            let dt = cx.dtype(x);
            let e = elu(cx, x, alpha)?;
            let g = cx.scalar(dt, gamma)?;
            one(binary(cx, B::Mul, e, g)?)
        }
        "Celu" => {
            // max(0, x) + min(0, alpha * (exp(x / alpha) - 1))
            let alpha = n.float("alpha", 1.0)? as f64;
            let x = x()?;
            let dt = cx.dtype(x);
            let a = cx.scalar(dt, alpha)?;
            let xa = binary(cx, B::Div, x, a)?;
            let e = elu(cx, xa, 1.0)?;
            let ae = binary(cx, B::Mul, e, a)?;
            let zero = cx.scalar(dt, 0.0)?;
            let neg = binary(cx, B::Min, ae, zero)?;
            let pos = unary(cx, U::Relu, x)?;
            one(binary(cx, B::Add, pos, neg)?)
        }
        "ThresholdedRelu" => {
            let alpha = n.float("alpha", 1.0)? as f64;
            let x = x()?;
            let dt = cx.dtype(x);
            let a = cx.scalar(dt, alpha)?;
            let gt = compare(cx, CmpOp::Gt, x, a)?;
            let zero = cx.scalar(dt, 0.0)?;
            one(cx.op1(OpKind::Select, &[gt, x, zero])?)
        }
        "PRelu" => {
            let x = x()?;
            let mut slope = n.input(1, "slope")?;
            let (xd, sd) = (cx.dims(x), cx.dims(slope));
            if n.opset < 7 && xd.len() > 2 && sd.len() == 1 && sd[0] == xd[1] && sd[0] != 1 {
                // Before opset 7 a 1-D slope is per channel (axis 1).
                let mut d = vec![1; xd.len() - 1];
                d[0] = sd[0];
                slope = reshape(cx, slope, &d)?;
            }
            let ax = binary(cx, B::Mul, x, slope)?;
            let zero = cx.scalar(cx.dtype(x), 0.0)?;
            let lt = compare(cx, CmpOp::Lt, x, zero)?;
            one(cx.op1(OpKind::Select, &[lt, ax, x])?)
        }
        "Sign" => {
            let x = x()?;
            let dt = cx.dtype(x);
            let (zero, p1, m1) = (
                cx.scalar(dt, 0.0)?,
                cx.scalar(dt, 1.0)?,
                cx.scalar(dt, -1.0)?,
            );
            let gt = compare(cx, CmpOp::Gt, x, zero)?;
            let lt = compare(cx, CmpOp::Lt, x, zero)?;
            let neg = cx.op1(OpKind::Select, &[lt, m1, zero])?;
            one(cx.op1(OpKind::Select, &[gt, p1, neg])?)
        }
        "ReduceMin" | "ReduceL1" | "ReduceL2" | "ReduceSumSquare" | "ReduceLogSum"
        | "ReduceLogSumExp" => one(reduce_composite(cx, n)?),
        "Split" => split(cx, n),
        "Pad" => one(pad(cx, n)?),
        "Tile" => {
            let x = x()?;
            let reps = const_ints(cx, n, 1, "repeats")?;
            let r = cx.ty(x).rank();
            if reps.len() != r || reps.iter().any(|&k| k < 0) {
                return Err(Error::invalid(format!(
                    "repeats {reps:?} must be {r} non-negative numbers"
                )));
            }
            let mut y = x;
            for (a, &k) in reps.iter().enumerate() {
                if k != 1 {
                    if k == 0 || k > 1 << 16 {
                        return n.unsupported(format_args!("repeats {k}"));
                    }
                    let parts = vec![y; k as usize];
                    y = cx.op1(OpKind::Concat { axis: a as i64 }, &parts)?;
                }
            }
            one(y)
        }
        "Trilu" => one(trilu(cx, n)?),
        "Range" => {
            let dt = cx.dtype(x()?);
            let get = |i: usize, what: &str| -> Result<f64> {
                let t = const_input(cx, n, i, what)?;
                if t.ty().numel() != 1 {
                    return Err(Error::invalid(format!(
                        "{what} must be a scalar, found {}",
                        t.ty()
                    )));
                }
                Ok(t.data().get(0).to_f64())
            };
            let (start, limit, delta) = (get(0, "start")?, get(1, "limit")?, get(2, "delta")?);
            if delta == 0.0 {
                return Err(Error::invalid("delta is 0"));
            }
            let count = ((limit - start) / delta).ceil().max(0.0);
            if count > (1u64 << 24) as f64 {
                return n.unsupported(format_args!("{count} elements"));
            }
            let vals = (0..count as u64).map(|i| Scalar::from_f64(dt, start + i as f64 * delta));
            let data = Data::from_scalars(dt, vals).ok_or_else(|| Error::invalid("Range"))?;
            let t = Tensor::from_data(&[count as u64], data).map_err(|e| Error::invalid(e.0))?;
            one(cx.constant(t)?)
        }
        "ConvTranspose" => one(conv_transpose(cx, n)?),
        "Identity" => one(x()?),
        "Dropout" => dropout(cx, n),
        "Cast" => {
            let to = n.int("to", 0)?;
            let to = tensor::dtype(to as i32, "the target type `to`")?;
            one(cast(cx, x()?, to)?)
        }
        "CastLike" => {
            let to = cx.dtype(n.input(1, "target_type")?);
            one(cast(cx, x()?, to)?)
        }
        "Clip" => one(clip(cx, n)?),
        "QuantizeLinear" => one(quantize_linear(cx, n, true)?),
        "DequantizeLinear" => one(quantize_linear(cx, n, false)?),
        "MatMulInteger" => one(matmul_integer(cx, n, [0, 1, 2, 3])?),
        "QLinearMatMul" => one(qlinear_matmul(cx, n)?),
        "ConvInteger" => one(conv_integer(cx, n)?),
        "QLinearConv" => one(qlinear_conv(cx, n)?),
        "DynamicQuantizeLinear" => {
            let (y, scale, zero) = dynamic_quantize_linear(cx, x()?)?;
            Ok(vec![Some(y), Some(scale), Some(zero)])
        }
        "LeakyRelu" => {
            let alpha = n.float("alpha", 0.01)?;
            one(leaky_relu(cx, x()?, alpha as f64)?)
        }
        "Elu" => {
            let alpha = n.float("alpha", 1.0)? as f64;
            one(elu(cx, x()?, alpha)?)
        }
        "Gelu" => one(gelu(cx, n, x()?)?),
        "MatMul" => one(matmul(cx, x()?, n.input(1, "B")?)?),
        "Gemm" => one(gemm(cx, n)?),
        "Conv" => one(conv(cx, n)?),
        "BatchNormalization" => {
            if n.int("training_mode", 0)? != 0 {
                return batch_norm_training(cx, n);
            }
            if n.opset < 7 && n.int("is_test", 0)? == 0 {
                return n.unsupported("is_test=0 (training, before opset 7)");
            }
            if n.opset < 9 && n.int("spatial", 1)? == 0 {
                return n.unsupported("spatial=0");
            }
            let eps = n.float("epsilon", 1e-5)? as f64;
            let args = [
                x()?,
                n.input(1, "scale")?,
                n.input(2, "B")?,
                n.input(3, "mean")?,
                n.input(4, "var")?,
            ];
            one(cx.op1(OpKind::BatchNorm { eps: F64(eps) }, &args)?)
        }
        "MaxPool" => {
            if n.p.output.len() > 1 && !n.p.output[1].is_empty() {
                return max_pool_with_indices(cx, n);
            }
            one(pool(cx, n, true)?)
        }
        "AveragePool" => one(pool(cx, n, false)?),
        "GlobalAveragePool" => {
            let x = x()?;
            if cx.ty(x).rank() == 4 {
                one(cx.op1(OpKind::GlobalAvgPool, &[x])?)
            } else {
                one(global(cx, x, ReduceOp::Mean)?)
            }
        }
        "GlobalMaxPool" => one(global(cx, x()?, ReduceOp::Max)?),
        "ReduceSum" => one(reduce(cx, n, ReduceOp::Sum, 13)?),
        "ReduceMean" => one(reduce(cx, n, ReduceOp::Mean, 18)?),
        "ReduceMax" => one(reduce(cx, n, ReduceOp::Max, 18)?),
        "Softmax" | "LogSoftmax" => one(softmax(cx, n)?),
        "LRN" => one(lrn(cx, n)?),
        "LayerNormalization" => layer_norm(cx, n),
        "Reshape" => {
            let x = x()?;
            let shape = const_ints(cx, n, 1, "shape")?;
            let dims = reshape_dims(&cx.dims(x), &shape, n.int("allowzero", 0)? != 0)?;
            one(reshape(cx, x, &dims)?)
        }
        "Flatten" => {
            let x = x()?;
            let view = matrix_view(&cx.dims(x), n.int("axis", 1)?)?;
            one(reshape(cx, x, &view)?)
        }
        "Transpose" => {
            let x = x()?;
            let r = cx.ty(x).rank() as i64;
            let perm = n.ints("perm")?.unwrap_or_else(|| (0..r).rev().collect());
            let perm = non_negative(&perm, "perm")?;
            one(cx.op1(OpKind::Transpose { perm }, &[x])?)
        }
        "Concat" => {
            let axis = n
                .attr("axis")
                .map(|_| n.int("axis", 0))
                .transpose()?
                .ok_or_else(|| Error::invalid("Concat needs the attribute `axis`"))?;
            let ins: Vec<Value> = n.ins.iter().flatten().copied().collect();
            one(cx.op1(OpKind::Concat { axis }, &ins)?)
        }
        "Slice" => one(slice(cx, n)?),
        "Gather" => {
            let axis = n.int("axis", 0)?;
            one(cx.op1(OpKind::Gather { axis }, &[x()?, n.input(1, "indices")?])?)
        }
        "Unsqueeze" => {
            let x = x()?;
            let axes = axes_of(cx, n, 13)?.ok_or_else(|| Error::invalid("Unsqueeze needs axes"))?;
            let mut dims = cx.dims(x);
            let r = dims.len() + axes.len();
            let mut axes: Vec<usize> = axes.iter().map(|&a| axis(a, r)).collect::<Result<_>>()?;
            axes.sort_unstable();
            if axes.windows(2).any(|w| w[0] == w[1]) {
                return Err(Error::invalid(format!("axes {axes:?} repeat an axis")));
            }
            for a in axes {
                dims.insert(a, 1);
            }
            one(reshape(cx, x, &dims)?)
        }
        "Squeeze" => {
            let x = x()?;
            let dims = cx.dims(x);
            let r = dims.len();
            let squeeze: Vec<usize> = match axes_of(cx, n, 13)? {
                Some(axes) => axes.iter().map(|&a| axis(a, r)).collect::<Result<_>>()?,
                None => (0..r).filter(|&i| dims[i] == 1).collect(),
            };
            if let Some(&a) = squeeze.iter().find(|&&a| dims[a] != 1) {
                return Err(Error::invalid(format!(
                    "cannot squeeze axis {a} of size {} (shape {dims:?})",
                    dims[a]
                )));
            }
            let kept: Vec<u64> = (0..r)
                .filter(|i| !squeeze.contains(i))
                .map(|i| dims[i])
                .collect();
            one(reshape(cx, x, &kept)?)
        }
        "Expand" => {
            let x = x()?;
            let shape = const_ints(cx, n, 1, "shape")?;
            let shape = non_negative(&shape, "shape")?;
            let out = broadcast_shapes(&cx.dims(x), &shape).map_err(Error::invalid)?;
            if out == cx.dims(x) {
                return one(x);
            }
            one(cx.op1(OpKind::BroadcastTo { shape: out }, &[x])?)
        }
        "Shape" => {
            let dims = cx.dims(x()?);
            let r = dims.len() as i64;
            let clampi = |i: i64| (if i < 0 { i + r } else { i }).clamp(0, r) as usize;
            let start = clampi(n.int("start", 0)?);
            let end = clampi(n.int("end", r)?);
            let v: Vec<i64> = dims[start..end.max(start)]
                .iter()
                .map(|&d| d as i64)
                .collect();
            let len = v.len() as u64;
            one(cx.constant(tensor_i64(&[len], v)?)?)
        }
        "Size" => {
            let numel = cx.ty(x()?).numel() as i64;
            one(cx.constant(tensor_i64(&[], vec![numel])?)?)
        }
        "Constant" => one(constant(cx, n)?),
        "ConstantOfShape" => {
            let shape = const_ints(cx, n, 0, "shape")?;
            let dims = non_negative(&shape, "shape")?;
            let s = match n.tensor("value")? {
                Some(t) => {
                    let t = tensor::from_proto(t, n.dir, "attribute `value`")?;
                    if t.ty().numel() != 1 {
                        return Err(Error::invalid(format!(
                            "attribute `value` must hold one element, found {}",
                            t.ty()
                        )));
                    }
                    t.data().get(0)
                }
                None => Scalar::F32(0.0),
            };
            let ty = TensorType::new(s.dtype(), dims).map_err(|e| Error::invalid(e.to_string()))?;
            one(cx.splat(ty, s)?)
        }
        "" => Err(Error::invalid("the node has no op_type")),
        other => Err(Error::unsupported(format!("unsupported ONNX op `{other}`"))),
    }
}

/// The second operand of a broadcasting binary op. Before opset 7, broadcasting was explicit:
/// with `broadcast=1`, `B`'s axes line up with `A`'s from `axis` (default: the trailing axes), so
/// `B` is reshaped with trailing ones for numpy broadcasting to do the same.
fn legacy_b(cx: &mut Ctx, n: &Node) -> Result<Value> {
    let b = n.input(1, "B")?;
    if n.opset >= 7 || n.int("broadcast", 0)? == 0 || n.attr("axis").is_none() {
        return Ok(b);
    }
    let (ra, db) = (cx.ty(n.input(0, "A")?).rank(), cx.dims(b));
    let a = n.int("axis", 0)?;
    let a = if a < 0 { a + ra as i64 } else { a };
    if a < 0 || a as usize + db.len() > ra {
        return Err(Error::invalid(format!(
            "axis {a} does not fit B {} into A of rank {ra}",
            cx.ty(b)
        )));
    }
    let mut dims = db;
    dims.resize(ra - a as usize, 1);
    reshape(cx, b, &dims)
}

/// A broadcasting binary op node.
fn binop(cx: &mut Ctx, n: &Node, op: BinaryOp) -> Result<Value> {
    let b = legacy_b(cx, n)?;
    binary(cx, op, n.input(0, "A")?, b)
}

/// A comparison node.
fn cmpop(cx: &mut Ctx, n: &Node, op: CmpOp) -> Result<Value> {
    let b = legacy_b(cx, n)?;
    compare(cx, op, n.input(0, "A")?, b)
}

/// Folds `op` over every input (`Max`, `Min`, `Sum`).
fn variadic(cx: &mut Ctx, n: &Node, op: BinaryOp) -> Result<Value> {
    let ins: Vec<Value> = n.ins.iter().flatten().copied().collect();
    let (&first, rest) = ins
        .split_first()
        .ok_or_else(|| Error::invalid(format!("{} needs at least one input", n.op_type())))?;
    rest.iter()
        .try_fold(first, |acc, &v| binary(cx, op, acc, v))
}

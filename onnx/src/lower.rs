//! Lowering: each ONNX op as tcc IR ops. [`lower`] is the table; an op type missing from it is
//! an "unsupported" error naming the op, the node and the opset.

use crate::graph::Ctx;
use crate::proto::attribute_proto::AttributeType;
use crate::proto::{AttributeProto, NodeProto, TensorProto};
use crate::{Error, Result, tensor};
use std::path::Path;
use tcc_ir::ops::{F64, normalize_axis};
use tcc_ir::typing::broadcast_shapes;
use tcc_ir::{
    BinaryOp, CmpOp, Conv2d, DType, Data, OpKind, Pool2d, ReduceOp, Scalar, Tensor, TensorType,
    UnaryOp, Value,
};

/// A node with its inputs resolved (`None` for an omitted optional input).
pub(crate) struct Node<'a> {
    pub p: &'a NodeProto,
    pub ins: Vec<Option<Value>>,
    pub opset: i64,
    pub dir: Option<&'a Path>,
}

impl Node<'_> {
    fn op_type(&self) -> &str {
        self.p.op_type.as_deref().unwrap_or("")
    }

    /// Input `i` if given.
    fn opt(&self, i: usize) -> Option<Value> {
        self.ins.get(i).copied().flatten()
    }

    /// Input `i`, which the op requires.
    fn input(&self, i: usize, what: &str) -> Result<Value> {
        self.opt(i).ok_or_else(|| {
            Error::invalid(format!(
                "{} needs input {i} ({what}), which is missing",
                self.op_type()
            ))
        })
    }

    fn attr(&self, name: &str) -> Option<&AttributeProto> {
        self.p
            .attribute
            .iter()
            .find(|a| a.name.as_deref() == Some(name))
    }

    /// The attribute `name`, checked to be of type `want`.
    fn typed(&self, name: &str, want: AttributeType) -> Result<Option<&AttributeProto>> {
        let Some(a) = self.attr(name) else {
            return Ok(None);
        };
        if a.ref_attr_name.is_some() {
            return Err(Error::unsupported(format!(
                "attribute `{name}` refers to a function attribute, which is not supported"
            )));
        }
        match a.r#type.map(AttributeType::try_from) {
            Some(Ok(t)) if t == want => Ok(Some(a)),
            None | Some(Ok(AttributeType::Undefined)) => Ok(Some(a)),
            Some(Ok(t)) => Err(Error::invalid(format!(
                "attribute `{name}` must be {}, found {}",
                want.as_str_name(),
                t.as_str_name()
            ))),
            Some(Err(_)) => Err(Error::invalid(format!(
                "attribute `{name}` has an unknown type {}",
                a.r#type.unwrap_or(0)
            ))),
        }
    }

    fn int(&self, name: &str, default: i64) -> Result<i64> {
        Ok(self
            .typed(name, AttributeType::Int)?
            .and_then(|a| a.i)
            .unwrap_or(default))
    }

    fn float(&self, name: &str, default: f32) -> Result<f32> {
        Ok(self
            .typed(name, AttributeType::Float)?
            .and_then(|a| a.f)
            .unwrap_or(default))
    }

    fn ints(&self, name: &str) -> Result<Option<Vec<i64>>> {
        Ok(self
            .typed(name, AttributeType::Ints)?
            .map(|a| a.ints.clone()))
    }

    fn floats(&self, name: &str) -> Result<Option<Vec<f32>>> {
        Ok(self
            .typed(name, AttributeType::Floats)?
            .map(|a| a.floats.clone()))
    }

    fn string(&self, name: &str, default: &str) -> Result<String> {
        Ok(
            match self
                .typed(name, AttributeType::String)?
                .and_then(|a| a.s.as_ref())
            {
                Some(s) => String::from_utf8_lossy(s).into_owned(),
                None => default.to_string(),
            },
        )
    }

    fn tensor(&self, name: &str) -> Result<Option<&TensorProto>> {
        Ok(self
            .typed(name, AttributeType::Tensor)?
            .and_then(|a| a.t.as_ref()))
    }

    /// An error for an attribute value tcc does not support.
    fn unsupported<T>(&self, what: impl std::fmt::Display) -> Result<T> {
        Err(Error::unsupported(format!(
            "{} with {what} is not supported",
            self.op_type()
        )))
    }
}

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
        "Softplus" => one(softplus(cx, x()?)?),
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
                return n.unsupported("the Indices output");
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
            let dims = cx.dims(x);
            let r = dims.len() as i64;
            let axis = n.int("axis", 1)?;
            let a = if axis < 0 { axis + r } else { axis };
            if !(0..=r).contains(&a) {
                return Err(Error::invalid(format!(
                    "axis {axis} is out of range for rank {r}"
                )));
            }
            let a = a as usize;
            let outer = dims[..a].iter().product();
            let inner = dims[a..].iter().product();
            one(reshape(cx, x, &[outer, inner])?)
        }
        "Transpose" => {
            let x = x()?;
            let r = cx.ty(x).rank() as i64;
            let perm = n.ints("perm")?.unwrap_or_else(|| (0..r).rev().collect());
            let perm: Vec<u64> = perm
                .iter()
                .map(|&p| {
                    u64::try_from(p)
                        .map_err(|_| Error::invalid(format!("perm has a negative entry {p}")))
                })
                .collect::<Result<_>>()?;
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
            let shape: Vec<u64> = shape
                .iter()
                .map(|&d| {
                    u64::try_from(d)
                        .map_err(|_| Error::invalid(format!("shape has a negative entry {d}")))
                })
                .collect::<Result<_>>()?;
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
            let dims: Vec<u64> = shape
                .iter()
                .map(|&d| {
                    u64::try_from(d)
                        .map_err(|_| Error::invalid(format!("shape has a negative entry {d}")))
                })
                .collect::<Result<_>>()?;
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

// --- Small builders ---

fn unary(cx: &mut Ctx, op: UnaryOp, x: Value) -> Result<Value> {
    cx.op1(OpKind::Unary(op), &[x])
}

fn binary(cx: &mut Ctx, op: BinaryOp, a: Value, b: Value) -> Result<Value> {
    cx.op1(OpKind::Binary(op), &[a, b])
}

fn compare(cx: &mut Ctx, op: CmpOp, a: Value, b: Value) -> Result<Value> {
    cx.op1(OpKind::Compare(op), &[a, b])
}

fn cast(cx: &mut Ctx, x: Value, to: DType) -> Result<Value> {
    if cx.dtype(x) == to {
        return Ok(x);
    }
    cx.op1(OpKind::Cast { to }, &[x])
}

fn reshape(cx: &mut Ctx, x: Value, dims: &[u64]) -> Result<Value> {
    if cx.dims(x) == dims {
        return Ok(x);
    }
    cx.op1(
        OpKind::Reshape {
            shape: dims.to_vec(),
        },
        &[x],
    )
}

fn tensor_i64(dims: &[u64], v: Vec<i64>) -> Result<Tensor> {
    Tensor::from_data(dims, Data::I64(v)).map_err(|e| Error::invalid(e.to_string()))
}

/// An axis in `-r..r` as an index.
fn axis(a: i64, r: usize) -> Result<usize> {
    normalize_axis(a, r)
        .ok_or_else(|| Error::invalid(format!("axis {a} is out of range for rank {r}")))
}

/// The value of input `i`, which must be known at import time.
fn const_input(cx: &Ctx, n: &Node, i: usize, what: &str) -> Result<Tensor> {
    let v = n.input(i, what)?;
    if let Some(t) = cx.constant_of(v) {
        return Ok(t);
    }
    let name = cx.function().name(v);
    if cx.function().params().contains(&v) {
        return Err(Error::needs_constant(
            format!(
                "input {i} ({what}) must be known at import time (tcc's shapes are static), but it is graph input `{name}`; fix its value with --const {name}=FILE.npy"
            ),
            name,
        ));
    }
    Err(Error::unsupported(format!(
        "input {i} ({what}) must be known at import time (tcc's shapes are static), but `{name}` is computed from the graph's inputs"
    )))
}

/// The integer elements of constant input `i`.
fn const_ints(cx: &Ctx, n: &Node, i: usize, what: &str) -> Result<Vec<i64>> {
    let t = const_input(cx, n, i, what)?;
    match t.data() {
        Data::I64(v) => Ok(v.clone()),
        Data::I32(v) => Ok(v.iter().map(|&x| x as i64).collect()),
        _ => Err(Error::invalid(format!(
            "input {i} ({what}) must be int64 or int32, found {}",
            t.ty()
        ))),
    }
}

/// The axes of a reduction-like op: an attribute before `input_since`, else the optional
/// input 1. `None` when absent.
fn axes_of(cx: &Ctx, n: &Node, input_since: i64) -> Result<Option<Vec<i64>>> {
    if n.opset < input_since {
        n.ints("axes")
    } else if n.opt(1).is_some() {
        const_ints(cx, n, 1, "axes").map(Some)
    } else {
        Ok(None)
    }
}

// --- Elementwise ---

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

/// `Pow`: the exponent may have another type; integer bases compute in `f64`.
fn pow(cx: &mut Ctx, x: Value, y: Value) -> Result<Value> {
    let dt = cx.dtype(x);
    if dt.is_float() {
        let y = cast(cx, y, dt)?;
        return binary(cx, BinaryOp::Pow, x, y);
    }
    let (xf, yf) = (cast(cx, x, DType::F64)?, cast(cx, y, DType::F64)?);
    let p = binary(cx, BinaryOp::Pow, xf, yf)?;
    cast(cx, p, dt)
}

fn clip(cx: &mut Ctx, n: &Node) -> Result<Value> {
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

fn leaky_relu(cx: &mut Ctx, x: Value, alpha: f64) -> Result<Value> {
    let dt = cx.dtype(x);
    let a = cx.scalar(dt, alpha)?;
    let ax = binary(cx, BinaryOp::Mul, x, a)?;
    let zero = cx.scalar(dt, 0.0)?;
    let lt = compare(cx, CmpOp::Lt, x, zero)?;
    cx.op1(OpKind::Select, &[lt, ax, x])
}

/// `x` for `x >= 0`, `alpha * (exp(x) - 1)` below.
fn elu(cx: &mut Ctx, x: Value, alpha: f64) -> Result<Value> {
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
fn softplus(cx: &mut Ctx, x: Value) -> Result<Value> {
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
fn hard_sigmoid(cx: &mut Ctx, x: Value, alpha: f64, beta: f64) -> Result<Value> {
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

fn gelu(cx: &mut Ctx, n: &Node, x: Value) -> Result<Value> {
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

fn dropout(cx: &mut Ctx, n: &Node) -> Result<Vec<Option<Value>>> {
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

// --- Linear algebra ---

/// `MatMul` with numpy semantics: a 1-D operand is a row (left) or column (right) vector whose
/// axis is dropped from the result.
fn matmul(cx: &mut Ctx, a: Value, b: Value) -> Result<Value> {
    let (ad, bd) = (cx.dims(a), cx.dims(b));
    if ad.is_empty() || bd.is_empty() {
        return Err(Error::invalid("MatMul operands must have rank 1 or more"));
    }
    let a2 = if ad.len() == 1 {
        reshape(cx, a, &[1, ad[0]])?
    } else {
        a
    };
    let b2 = if bd.len() == 1 {
        reshape(cx, b, &[bd[0], 1])?
    } else {
        b
    };
    let y = cx.op1(OpKind::MatMul, &[a2, b2])?;
    if ad.len() > 1 && bd.len() > 1 {
        return Ok(y);
    }
    let mut dims = cx.dims(y);
    let r = dims.len();
    if bd.len() == 1 {
        dims.remove(r - 1);
    }
    if ad.len() == 1 {
        dims.remove(r - 2);
    }
    reshape(cx, y, &dims)
}

fn gemm(cx: &mut Ctx, n: &Node) -> Result<Value> {
    let (mut a, mut b) = (n.input(0, "A")?, n.input(1, "B")?);
    for v in [a, b] {
        if cx.ty(v).rank() != 2 {
            return Err(Error::invalid(format!(
                "Gemm needs matrices, found {}",
                cx.ty(v)
            )));
        }
    }
    if n.int("transA", 0)? != 0 {
        a = cx.op1(OpKind::Transpose { perm: vec![1, 0] }, &[a])?;
    }
    if n.int("transB", 0)? != 0 {
        b = cx.op1(OpKind::Transpose { perm: vec![1, 0] }, &[b])?;
    }
    let dt = cx.dtype(a);
    let mut y = cx.op1(OpKind::MatMul, &[a, b])?;
    let alpha = n.float("alpha", 1.0)?;
    if alpha != 1.0 {
        let k = cx.scalar(dt, alpha as f64)?;
        y = binary(cx, BinaryOp::Mul, y, k)?;
    }
    if let Some(mut c) = n.opt(2) {
        let beta = n.float("beta", 1.0)?;
        if beta != 1.0 {
            let k = cx.scalar(dt, beta as f64)?;
            c = binary(cx, BinaryOp::Mul, c, k)?;
        }
        y = binary(cx, BinaryOp::Add, y, c)?;
    }
    Ok(y)
}

// --- Convolution and pooling ---

/// Window geometry along each spatial axis.
struct Window {
    strides: Vec<u64>,
    dilations: Vec<u64>,
    /// Padding before and after each axis.
    pads: Vec<(u64, u64)>,
    /// How much of the padding after each axis `ceil_mode` added (averages never count it).
    ceil_extra: Vec<u64>,
}

fn positive(v: Vec<i64>, what: &str) -> Result<Vec<u64>> {
    v.iter()
        .map(|&x| {
            u64::try_from(x)
                .ok()
                .filter(|&x| x > 0)
                .ok_or_else(|| Error::invalid(format!("{what} must be positive, found {v:?}")))
        })
        .collect()
}

/// Strides, dilations and pads (explicit or from `auto_pad`) for a window of `kernel` over
/// `input` (the spatial dims); with `ceil`, the end padding grows so that the last partial
/// window is kept, as `ceil_mode` asks.
fn window(n: &Node, input: &[u64], kernel: &[u64], ceil: bool) -> Result<Window> {
    let k = kernel.len();
    let get = |name: &str, default: i64| -> Result<Vec<u64>> {
        let v = n.ints(name)?.unwrap_or_else(|| vec![default; k]);
        if v.len() != k {
            return Err(Error::invalid(format!(
                "`{name}` has {} entries for {k} spatial axes",
                v.len()
            )));
        }
        positive(v, &format!("`{name}`"))
    };
    let strides = get("strides", 1)?;
    let dilations = get("dilations", 1)?;
    let eff: Vec<u64> = (0..k)
        .map(|i| {
            (kernel[i] - 1)
                .checked_mul(dilations[i])
                .and_then(|e| e.checked_add(1))
                .filter(|&e| e <= 1 << 40)
                .ok_or_else(|| {
                    Error::invalid(format!(
                        "the window ({} with dilation {}) is absurdly large",
                        kernel[i], dilations[i]
                    ))
                })
        })
        .collect::<Result<_>>()?;
    let auto_pad = n.string("auto_pad", "NOTSET")?;
    let mut pads: Vec<(u64, u64)> = match auto_pad.as_str() {
        "NOTSET" => {
            let p = n.ints("pads")?.unwrap_or_else(|| vec![0; 2 * k]);
            if p.len() != 2 * k || p.iter().any(|&x| !(0..1 << 40).contains(&x)) {
                return Err(Error::invalid(format!(
                    "`pads` must be {} non-negative numbers below 2^40, found {p:?}",
                    2 * k
                )));
            }
            (0..k).map(|i| (p[i] as u64, p[k + i] as u64)).collect()
        }
        "VALID" => vec![(0, 0); k],
        "SAME_UPPER" | "SAME_LOWER" => (0..k)
            .map(|i| {
                let out = input[i].div_ceil(strides[i]).min(1 << 40);
                let total = ((out.max(1) - 1) * strides[i] + eff[i]).saturating_sub(input[i]);
                let small = total / 2;
                if auto_pad == "SAME_UPPER" {
                    (small, total - small)
                } else {
                    (total - small, small)
                }
            })
            .collect(),
        other => {
            return Err(Error::invalid(format!(
                "auto_pad must be NOTSET, VALID, SAME_UPPER or SAME_LOWER, found `{other}`"
            )));
        }
    };
    let mut ceil_extra = vec![0; k];
    for i in 0..k {
        let padded = input[i] + pads[i].0 + pads[i].1;
        if padded < eff[i] {
            return Err(Error::invalid(format!(
                "the window ({} with dilation {}) is larger than spatial axis {i} ({} padded)",
                kernel[i], dilations[i], padded
            )));
        }
        if ceil {
            let mut out = (padded - eff[i]).div_ceil(strides[i]) + 1;
            if (out - 1) * strides[i] >= input[i] + pads[i].0 {
                out -= 1;
            }
            let need = (out - 1) * strides[i] + eff[i];
            ceil_extra[i] = need.saturating_sub(padded);
            pads[i].1 += ceil_extra[i];
        }
    }
    Ok(Window {
        strides,
        dilations,
        pads,
        ceil_extra,
    })
}

/// Reshapes 3-D `[N, C, W]` to 4-D `[N, C, 1, W]` (1-D convolution and pooling run as 2-D);
/// other ranks must be 4.
fn to_2d(cx: &mut Ctx, x: Value, what: &str, op: &str) -> Result<(Value, bool)> {
    let d = cx.dims(x);
    match d.len() {
        4 => Ok((x, false)),
        3 => Ok((reshape(cx, x, &[d[0], d[1], 1, d[2]])?, true)),
        r => Err(Error::unsupported(format!(
            "{op} over {} spatial axes is not supported ({what} is {}); tcc has 1-D and 2-D",
            r.saturating_sub(2),
            cx.ty(x)
        ))),
    }
}

fn conv(cx: &mut Ctx, n: &Node) -> Result<Value> {
    let (x, w) = (n.input(0, "X")?, n.input(1, "W")?);
    let (x4, one_d) = to_2d(cx, x, "the input", "Conv")?;
    let (w4, _) = to_2d(cx, w, "the filter", "Conv")?;
    if cx.ty(x).rank() != cx.ty(w).rank() {
        return Err(Error::invalid(format!(
            "input {} and filter {} differ in rank",
            cx.ty(x),
            cx.ty(w)
        )));
    }
    let wd = cx.dims(w);
    let kernel: Vec<u64> = wd[2..].to_vec();
    if let Some(ks) = n.ints("kernel_shape")?
        && positive(ks.clone(), "`kernel_shape`")? != kernel
    {
        return Err(Error::invalid(format!(
            "kernel_shape {ks:?} does not match the filter {}",
            cx.ty(w)
        )));
    }
    let win = window(n, &cx.dims(x)[2..], &kernel, false)?;
    let lift =
        |v: &[u64], fill: u64| -> [u64; 2] { if one_d { [fill, v[0]] } else { [v[0], v[1]] } };
    let pb: Vec<u64> = win.pads.iter().map(|p| p.0).collect();
    let pe: Vec<u64> = win.pads.iter().map(|p| p.1).collect();
    let (b2, e2) = (lift(&pb, 0), lift(&pe, 0));
    let attrs = Conv2d {
        strides: lift(&win.strides, 1),
        pads: [b2[0], b2[1], e2[0], e2[1]],
        dilations: lift(&win.dilations, 1),
        groups: u64::try_from(n.int("group", 1)?)
            .ok()
            .filter(|&g| g > 0)
            .ok_or_else(|| Error::invalid("group must be positive"))?,
    };
    let mut y = cx.op1(OpKind::Conv2d(attrs), &[x4, w4])?;
    if let Some(b) = n.opt(2) {
        let o = wd[0];
        if cx.dims(b) != [o] {
            return Err(Error::invalid(format!(
                "the bias must be [{o}], found {}",
                cx.ty(b)
            )));
        }
        let b4 = reshape(cx, b, &[1, o, 1, 1])?;
        y = binary(cx, BinaryOp::Add, y, b4)?;
    }
    if one_d {
        let d = cx.dims(y);
        y = reshape(cx, y, &[d[0], d[1], d[3]])?;
    }
    Ok(y)
}

fn pool(cx: &mut Ctx, n: &Node, max: bool) -> Result<Value> {
    let op = if max { "MaxPool" } else { "AveragePool" };
    let x = n.input(0, "X")?;
    if cx.ty(x).rank() < 3 {
        return Err(Error::invalid(format!(
            "{op} needs [N, C, spatial...], found {}",
            cx.ty(x)
        )));
    }
    let k = cx.ty(x).rank() - 2;
    let kernel = positive(
        n.ints("kernel_shape")?
            .ok_or_else(|| Error::invalid(format!("{op} needs `kernel_shape`")))?,
        "`kernel_shape`",
    )?;
    if kernel.len() != k {
        return Err(Error::invalid(format!(
            "kernel_shape {kernel:?} does not match {k} spatial axes"
        )));
    }
    let ceil = n.int("ceil_mode", 0)? != 0;
    let win = window(n, &cx.dims(x)[2..], &kernel, ceil)?;
    let count_include_pad = n.int("count_include_pad", 0)? != 0;
    // `avg_pool2d` with count_include_pad counts every padded position, ONNX not those that
    // ceil_mode adds.
    let extra_counted = !max && count_include_pad && win.ceil_extra.iter().any(|&e| e > 0);
    if k > 2 || win.dilations.iter().any(|&d| d != 1) || extra_counted {
        return pool_sliced(cx, x, &kernel, &win, max, count_include_pad);
    }
    let (x4, one_d) = to_2d(cx, x, "the input", op)?;
    let lift =
        |v: &[u64], fill: u64| -> [u64; 2] { if one_d { [fill, v[0]] } else { [v[0], v[1]] } };
    let pb: Vec<u64> = win.pads.iter().map(|p| p.0).collect();
    let pe: Vec<u64> = win.pads.iter().map(|p| p.1).collect();
    let (b2, e2) = (lift(&pb, 0), lift(&pe, 0));
    let attrs = Pool2d {
        kernel: lift(&kernel, 1),
        strides: lift(&win.strides, 1),
        pads: [b2[0], b2[1], e2[0], e2[1]],
    };
    let kind = if max {
        OpKind::MaxPool2d(attrs)
    } else {
        OpKind::AvgPool2d {
            pool: attrs,
            count_include_pad,
        }
    };
    let mut y = cx.op1(kind, &[x4])?;
    if one_d {
        let d = cx.dims(y);
        y = reshape(cx, y, &[d[0], d[1], d[3]])?;
    }
    Ok(y)
}

/// Pooling that `max_pool2d` and `avg_pool2d` cannot express (3-D windows, dilations), built
/// from slices. Both poolings are separable over the spatial axes (a max of maxes; a sum of
/// sums whose divisor, the window's count of positions, is a product of per-axis counts), so
/// each axis in turn is padded and combined from its `k` strided slices.
fn pool_sliced(
    cx: &mut Ctx,
    x: Value,
    kernel: &[u64],
    win: &Window,
    max: bool,
    count_include_pad: bool,
) -> Result<Value> {
    let slices: u64 = kernel.iter().sum();
    if slices > 4096 {
        return Err(Error::unsupported(format!(
            "pooling windows {kernel:?} with dilations or over 3 or more axes are built from one slice per window position, and {slices} are too many"
        )));
    }
    let dt = cx.dtype(x);
    let mut y = x;
    for (i, &k) in kernel.iter().enumerate() {
        let a = 2 + i;
        let dims = cx.dims(y);
        let len = dims[a];
        let (pb, pe) = win.pads[i];
        let counted_end = (len + pe - win.ceil_extra[i]) as i64;
        let (s, d) = (win.strides[i], win.dilations[i]);
        let out = (len + pb + pe - ((k - 1) * d + 1)) / s + 1;
        let fill = if max { f64::NEG_INFINITY } else { 0.0 };
        let padded = pad_axis(cx, y, a, pb, pe, fill)?;
        let r = dims.len();
        let mut acc: Option<Value> = None;
        for j in 0..k {
            let (mut starts, mut ends, mut steps) = (vec![0; r], vec![i64::MAX; r], vec![1; r]);
            starts[a] = (j * d) as i64;
            ends[a] = (j * d + (out - 1) * s + 1) as i64;
            steps[a] = s as i64;
            let sl = cx.op1(
                OpKind::Slice {
                    starts,
                    ends,
                    steps,
                },
                &[padded],
            )?;
            let op = if max { BinaryOp::Max } else { BinaryOp::Add };
            acc = Some(match acc {
                None => sl,
                Some(p) => binary(cx, op, p, sl)?,
            });
        }
        let mut pooled = acc.ok_or_else(|| Error::invalid("an empty pooling window"))?;
        if !max {
            // Positions of each window along this axis that the divisor counts.
            let counts: Vec<f64> = (0..out)
                .map(|o| {
                    (0..k)
                        .filter(|&j| {
                            let p = (o * s + j * d) as i64 - pb as i64;
                            if count_include_pad {
                                (-(pb as i64)..counted_end).contains(&p)
                            } else {
                                (0..len as i64).contains(&p)
                            }
                        })
                        .count() as f64
                })
                .collect();
            let mut shape = vec![1; r];
            shape[a] = out;
            let data = Data::from_scalars(dt, counts.iter().map(|&c| Scalar::from_f64(dt, c)))
                .ok_or_else(|| Error::invalid("counts of the pooling windows"))?;
            let c =
                cx.constant(Tensor::from_data(&shape, data).map_err(|e| Error::invalid(e.0))?)?;
            pooled = binary(cx, BinaryOp::Div, pooled, c)?;
        }
        y = pooled;
    }
    Ok(y)
}

/// `x` with `before` and `after` elements of `fill` added along `axis`.
fn pad_axis(
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

/// Global pooling as a reduction over the spatial axes, keeping them as size 1.
fn global(cx: &mut Ctx, x: Value, op: ReduceOp) -> Result<Value> {
    let r = cx.ty(x).rank() as i64;
    if r < 3 {
        return Err(Error::invalid(format!(
            "global pooling needs [N, C, spatial...], found {}",
            cx.ty(x)
        )));
    }
    cx.op1(
        OpKind::Reduce {
            op,
            axes: (2..r).collect(),
            keepdims: true,
        },
        &[x],
    )
}

// --- Reductions and normalisation ---

/// `ReduceSum/Mean/Max`: axes from the attribute (before `input_since`) or input 1; no axes
/// reduce everything unless `noop_with_empty_axes`.
fn reduce(cx: &mut Ctx, n: &Node, op: ReduceOp, input_since: i64) -> Result<Value> {
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
fn reduce_with(cx: &mut Ctx, n: &Node, op: ReduceOp, input_since: i64, x: Value) -> Result<Value> {
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
fn reduce_composite(cx: &mut Ctx, n: &Node) -> Result<Value> {
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
fn reduce_keepdims(cx: &mut Ctx, n: &Node, x: Value) -> Result<Value> {
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

/// `Split`: slices along `axis`, sized by the `split` input (opset 13+), the `split` attribute,
/// or evenly (`num_outputs` from opset 18, else the output count; the last part smaller).
fn split(cx: &mut Ctx, n: &Node) -> Result<Vec<Option<Value>>> {
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
        Some(s) => s
            .iter()
            .map(|&v| {
                u64::try_from(v)
                    .map_err(|_| Error::invalid(format!("split {s:?} has a negative size")))
            })
            .collect::<Result<_>>()?,
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
fn pad(cx: &mut Ctx, n: &Node) -> Result<Value> {
    let x = n.input(0, "data")?;
    let mode = n.string("mode", "constant")?;
    if mode != "constant" {
        return n.unsupported(format_args!("mode=\"{mode}\""));
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
        y = pad_axis(cx, y, a, b, e, value)?;
    }
    Ok(y)
}

/// `Trilu`: the lower (`upper=0`) or upper triangle of the last two axes, shifted by `k`, as a
/// select with a constant mask.
fn trilu(cx: &mut Ctx, n: &Node) -> Result<Value> {
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

/// `ConvTranspose` as the gradient of a convolution with respect to its input: the filter
/// `[C_in, C_out/group, kH, kW]` is that convolution's filter, the output its input.
fn conv_transpose(cx: &mut Ctx, n: &Node) -> Result<Value> {
    let (x, w) = (n.input(0, "X")?, n.input(1, "W")?);
    let (x4, one_d) = to_2d(cx, x, "the input", "ConvTranspose")?;
    let (w4, _) = to_2d(cx, w, "the filter", "ConvTranspose")?;
    let (xd, wd) = (cx.dims(x), cx.dims(w));
    if xd.len() != wd.len() {
        return Err(Error::invalid(format!(
            "input {} and filter {} differ in rank",
            cx.ty(x),
            cx.ty(w)
        )));
    }
    let k = xd.len() - 2;
    let g = u64::try_from(n.int("group", 1)?)
        .ok()
        .filter(|&g| g > 0)
        .ok_or_else(|| Error::invalid("group must be positive"))?;
    let kernel: Vec<u64> = wd[2..].to_vec();
    let get = |name: &str, default: i64| -> Result<Vec<u64>> {
        let v = n.ints(name)?.unwrap_or_else(|| vec![default; k]);
        if v.len() != k || v.iter().any(|&e| !(0..1 << 40).contains(&e)) {
            return Err(Error::invalid(format!(
                "`{name}` must be {k} non-negative numbers, found {v:?}"
            )));
        }
        Ok(v.iter().map(|&e| e as u64).collect())
    };
    let strides = get("strides", 1)?;
    let dil = get("dilations", 1)?;
    let out_pad = get("output_padding", 0)?;
    if strides.iter().chain(&dil).any(|&v| v == 0) {
        return Err(Error::invalid("strides and dilations must be positive"));
    }
    let eff: Vec<u64> = (0..k)
        .map(|i| (kernel[i].max(1) - 1) * dil[i] + 1)
        .collect();
    // The full output before padding is removed, per axis.
    let full: Vec<u64> = (0..k)
        .map(|i| strides[i] * (xd[2 + i].max(1) - 1) + out_pad[i] + eff[i])
        .collect();
    let auto_pad = n.string("auto_pad", "NOTSET")?;
    let mut full = full;
    let (begin, end): (Vec<u64>, Vec<u64>) = if let Some(os) = n.ints("output_shape")? {
        let os = os
            .iter()
            .rev()
            .take(k)
            .rev()
            .map(|&v| v.max(0) as u64)
            .collect::<Vec<_>>();
        if os.len() != k {
            return Err(Error::invalid(format!(
                "output_shape {os:?} must give {k} spatial sizes"
            )));
        }
        (0..k)
            .map(|i| {
                // A larger output than the windows reach is extra output padding at the end.
                full[i] = full[i].max(os[i]);
                let total = full[i] - os[i];
                if auto_pad == "SAME_UPPER" {
                    (total / 2, total - total / 2)
                } else {
                    (total - total / 2, total / 2)
                }
            })
            .unzip()
    } else {
        match auto_pad.as_str() {
            "NOTSET" => {
                let p = n.ints("pads")?.unwrap_or_else(|| vec![0; 2 * k]);
                if p.len() != 2 * k || p.iter().any(|&v| !(0..1 << 40).contains(&v)) {
                    return Err(Error::invalid(format!(
                        "`pads` must be {} non-negative numbers, found {p:?}",
                        2 * k
                    )));
                }
                (
                    (0..k).map(|i| p[i] as u64).collect(),
                    (0..k).map(|i| p[k + i] as u64).collect(),
                )
            }
            "VALID" => (vec![0; k], vec![0; k]),
            "SAME_UPPER" | "SAME_LOWER" => (0..k)
                .map(|i| {
                    let total = full[i].saturating_sub(xd[2 + i] * strides[i]);
                    if auto_pad == "SAME_UPPER" {
                        (total / 2, total - total / 2)
                    } else {
                        (total - total / 2, total / 2)
                    }
                })
                .unzip(),
            other => return Err(Error::invalid(format!("unknown auto_pad `{other}`"))),
        }
    };
    let out: Vec<u64> = (0..k)
        .map(|i| {
            full[i]
                .checked_sub(begin[i] + end[i])
                .filter(|&o| o > 0)
                .ok_or_else(|| {
                    Error::invalid(format!(
                        "the padding {begin:?}/{end:?} removes the whole output {full:?}"
                    ))
                })
        })
        .collect::<Result<_>>()?;
    // The convolution whose input gradient this is; the output padding is extra end padding
    // its windows never reach.
    let lift =
        |v: &[u64], fill: u64| -> [u64; 2] { if one_d { [fill, v[0]] } else { [v[0], v[1]] } };
    let (b2, e2) = (lift(&begin, 0), lift(&end, 0));
    let conv = Conv2d {
        strides: lift(&strides, 1),
        pads: [b2[0], b2[1], e2[0], e2[1]],
        dilations: lift(&dil, 1),
        groups: g,
    };
    let o2 = lift(&out, 1);
    let shape = vec![xd[0], wd[1] * g, o2[0], o2[1]];
    let mut y = cx.op1(OpKind::Conv2dGradInput { conv, shape }, &[x4, w4])?;
    if let Some(b) = n.opt(2) {
        let c = wd[1] * g;
        let b4 = reshape(cx, b, &[1, c, 1, 1])?;
        y = binary(cx, BinaryOp::Add, y, b4)?;
    }
    if one_d {
        let d = cx.dims(y);
        y = reshape(cx, y, &[d[0], d[1], d[3]])?;
    }
    Ok(y)
}

/// `Softmax`/`LogSoftmax`. Before opset 13 the input is viewed as 2-D `[prod(dims[..axis]),
/// prod(dims[axis..])]` and normalised along the second axis (default axis 1).
fn softmax(cx: &mut Ctx, n: &Node) -> Result<Value> {
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
    let a = n.int("axis", 1)?;
    let r = dims.len() as i64;
    let a = if a < 0 { a + r } else { a };
    if !(0..=r).contains(&a) {
        return Err(Error::invalid(format!(
            "axis {a} is out of range for rank {r}"
        )));
    }
    let a = a as usize;
    let (outer, inner): (u64, u64) = (dims[..a].iter().product(), dims[a..].iter().product());
    let x2 = reshape(cx, x, &[outer, inner])?;
    let y = cx.op1(make(1), &[x2])?;
    reshape(cx, y, &dims)
}

/// `LRN` across channels: `x / (bias + alpha/size * sum of x^2 over the channel window)^beta`.
/// The window sum is an average pool (padded positions counted) over a `[N, 1, C, H*W]` view.
fn lrn(cx: &mut Ctx, n: &Node) -> Result<Value> {
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
fn batch_norm_training(cx: &mut Ctx, n: &Node) -> Result<Vec<Option<Value>>> {
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
fn layer_norm(cx: &mut Ctx, n: &Node) -> Result<Vec<Option<Value>>> {
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

// --- Data movement ---

/// `Reshape`'s target: `0` copies the input dim (unless `allowzero`), one `-1` is inferred.
fn reshape_dims(input: &[u64], shape: &[i64], allowzero: bool) -> Result<Vec<u64>> {
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

fn slice(cx: &mut Ctx, n: &Node) -> Result<Value> {
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
fn constant(cx: &mut Ctx, n: &Node) -> Result<Value> {
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

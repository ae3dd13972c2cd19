//! The state lowering builds with, shared by the graph walk (`graph.rs`) and the per-op
//! lowerings (`lower/`): [`Ctx`] (the function being built and the ONNX names bound so far),
//! [`Node`] (one node with its inputs resolved, and typed attribute access), and the small
//! builder helpers every lowering uses. It imports neither of its users.

use crate::proto::attribute_proto::AttributeType;
use crate::proto::{AttributeProto, NodeProto, TensorProto};
use crate::{Error, Result};
use std::collections::{HashMap, HashSet};
use std::path::Path;
use tcc_ir::interp::{ConstArg, fold};
use tcc_ir::ops::normalize_axis;
use tcc_ir::typing::infer;
use tcc_ir::{
    BinaryOp, CmpOp, DType, Data, Function, FunctionBuilder, Literal, OpKind, Tensor, TensorType,
    UnaryOp, Value,
};

/// Ops whose operands are all constants are evaluated at import time when no operand or result
/// holds more than this many elements (splats fold at any size, see `tcc_ir::interp::fold`).
const FOLD_LIMIT: u64 = 1 << 20;

/// The state of one import: the function being built and the ONNX names bound so far.
pub(crate) struct Ctx {
    /// The function being built.
    pub b: FunctionBuilder,
    /// ONNX value name to IR value.
    pub vals: HashMap<String, Value>,
    /// The parameters made from initializers (`Options::params`).
    pub weights: HashSet<Value>,
}

impl Ctx {
    /// The type of `v`.
    pub fn ty(&self, v: Value) -> &TensorType {
        self.b.function().ty(v)
    }

    /// The dims of `v`.
    pub fn dims(&self, v: Value) -> Vec<u64> {
        self.ty(v).dims().to_vec()
    }

    /// The dtype of `v`.
    pub fn dtype(&self, v: Value) -> DType {
        self.ty(v).dtype()
    }

    /// The function so far.
    pub fn function(&self) -> &Function {
        self.b.function()
    }

    /// The value of `v` if a constant defines it.
    pub fn constant_of(&self, v: Value) -> Option<Tensor> {
        let f = self.b.function();
        match &f.op(f.def_op(v)?).kind {
            OpKind::Const { ty, value } if ty.numel() <= FOLD_LIMIT => {
                Tensor::from_literal(ty, value).ok()
            }
            _ => None,
        }
    }

    /// Adds an op, folding it into constants when every operand is one (see `FOLD_LIMIT`).
    pub fn op(&mut self, kind: OpKind, args: &[Value]) -> Result<Vec<Value>> {
        let f = self.b.function();
        let tys: Vec<&TensorType> = args.iter().map(|&a| f.ty(a)).collect();
        let out = infer(&kind, &tys)
            .map_err(|e| Error::invalid(format!("`{}`: {e}", kind.mnemonic())))?;
        let consts: Option<Vec<ConstArg<'_>>> = args
            .iter()
            .map(|&a| match &f.op(f.def_op(a)?).kind {
                OpKind::Const { ty, value } => Some(ConstArg { ty, value }),
                _ => None,
            })
            .collect();
        // Dequantization stays an op, so that the `qdq` pass finds quantized weights (it folds
        // those it leaves).
        let folded = match consts {
            Some(consts) if !args.is_empty() && !matches!(kind, OpKind::DequantizeLinear) => {
                fold(&kind, &consts, &out, FOLD_LIMIT)
            }
            _ => None,
        };
        match folded {
            Some(Ok(values)) => out
                .into_iter()
                .zip(values)
                .map(|(ty, value)| self.b.constant(ty, value).map_err(|e| Error::invalid(e.0)))
                .collect(),
            Some(Err(e)) => Err(Error::invalid(format!(
                "`{}` on constants: {e}",
                kind.mnemonic()
            ))),
            None => self.b.op(kind, args, None).map_err(|e| Error::invalid(e.0)),
        }
    }

    /// Adds a single-result op.
    pub fn op1(&mut self, kind: OpKind, args: &[Value]) -> Result<Value> {
        Ok(self.op(kind, args)?[0])
    }

    /// A constant holding `t`.
    pub fn constant(&mut self, t: Tensor) -> Result<Value> {
        let ty = t.ty().clone();
        self.b
            .constant(ty, Literal::dense(t.into_data()))
            .map_err(|e| Error::invalid(e.0))
    }

    /// A constant of type `ty` with every element `s`.
    pub fn splat(&mut self, ty: TensorType, s: tcc_ir::Scalar) -> Result<Value> {
        self.b
            .constant(ty, Literal::Splat(s))
            .map_err(|e| Error::invalid(e.0))
    }

    /// A scalar constant of `dtype` holding `x`.
    pub fn scalar(&mut self, dtype: DType, x: f64) -> Result<Value> {
        self.b.splat(dtype, &[], x).map_err(|e| Error::invalid(e.0))
    }
}

/// A node with its inputs resolved (`None` for an omitted optional input).
pub(crate) struct Node<'a> {
    pub p: &'a NodeProto,
    pub ins: Vec<Option<Value>>,
    pub opset: i64,
    pub dir: Option<&'a Path>,
}

impl Node<'_> {
    pub(crate) fn op_type(&self) -> &str {
        self.p.op_type.as_deref().unwrap_or("")
    }

    /// Input `i` if given.
    pub(crate) fn opt(&self, i: usize) -> Option<Value> {
        self.ins.get(i).copied().flatten()
    }

    /// Input `i`, which the op requires.
    pub(crate) fn input(&self, i: usize, what: &str) -> Result<Value> {
        self.opt(i).ok_or_else(|| {
            Error::invalid(format!(
                "{} needs input {i} ({what}), which is missing",
                self.op_type()
            ))
        })
    }

    pub(crate) fn attr(&self, name: &str) -> Option<&AttributeProto> {
        self.p
            .attribute
            .iter()
            .find(|a| a.name.as_deref() == Some(name))
    }

    /// The attribute `name`, checked to be of type `want`.
    pub(crate) fn typed(&self, name: &str, want: AttributeType) -> Result<Option<&AttributeProto>> {
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

    pub(crate) fn int(&self, name: &str, default: i64) -> Result<i64> {
        Ok(self
            .typed(name, AttributeType::Int)?
            .and_then(|a| a.i)
            .unwrap_or(default))
    }

    pub(crate) fn float(&self, name: &str, default: f32) -> Result<f32> {
        Ok(self
            .typed(name, AttributeType::Float)?
            .and_then(|a| a.f)
            .unwrap_or(default))
    }

    pub(crate) fn ints(&self, name: &str) -> Result<Option<Vec<i64>>> {
        Ok(self
            .typed(name, AttributeType::Ints)?
            .map(|a| a.ints.clone()))
    }

    pub(crate) fn floats(&self, name: &str) -> Result<Option<Vec<f32>>> {
        Ok(self
            .typed(name, AttributeType::Floats)?
            .map(|a| a.floats.clone()))
    }

    pub(crate) fn string(&self, name: &str, default: &str) -> Result<String> {
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

    pub(crate) fn strings(&self, name: &str) -> Result<Option<Vec<String>>> {
        Ok(self.typed(name, AttributeType::Strings)?.map(|a| {
            a.strings
                .iter()
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect()
        }))
    }

    pub(crate) fn tensor(&self, name: &str) -> Result<Option<&TensorProto>> {
        Ok(self
            .typed(name, AttributeType::Tensor)?
            .and_then(|a| a.t.as_ref()))
    }

    /// An error for an attribute value tcc does not support.
    pub(crate) fn unsupported<T>(&self, what: impl std::fmt::Display) -> Result<T> {
        Err(Error::unsupported(format!(
            "{} with {what} is not supported",
            self.op_type()
        )))
    }
}

pub(crate) fn unary(cx: &mut Ctx, op: UnaryOp, x: Value) -> Result<Value> {
    cx.op1(OpKind::Unary(op), &[x])
}

pub(crate) fn binary(cx: &mut Ctx, op: BinaryOp, a: Value, b: Value) -> Result<Value> {
    cx.op1(OpKind::Binary(op), &[a, b])
}

pub(crate) fn compare(cx: &mut Ctx, op: CmpOp, a: Value, b: Value) -> Result<Value> {
    cx.op1(OpKind::Compare(op), &[a, b])
}

pub(crate) fn cast(cx: &mut Ctx, x: Value, to: DType) -> Result<Value> {
    if cx.dtype(x) == to {
        return Ok(x);
    }
    cx.op1(OpKind::Cast { to }, &[x])
}

pub(crate) fn reshape(cx: &mut Ctx, x: Value, dims: &[u64]) -> Result<Value> {
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

pub(crate) fn tensor_i64(dims: &[u64], v: Vec<i64>) -> Result<Tensor> {
    Tensor::from_data(dims, Data::I64(v)).map_err(|e| Error::invalid(e.to_string()))
}

/// `v` as sizes or indices, none negative.
pub(crate) fn non_negative(v: &[i64], what: &str) -> Result<Vec<u64>> {
    v.iter()
        .map(|&d| {
            u64::try_from(d).map_err(|_| Error::invalid(format!("{what} has a negative entry {d}")))
        })
        .collect()
}

/// The 2-D view `[prod(dims[..axis]), prod(dims[axis..])]` of a tensor, for an `axis` in
/// `-r..=r` (Flatten, and Softmax before opset 13).
pub(crate) fn matrix_view(dims: &[u64], axis: i64) -> Result<[u64; 2]> {
    let r = dims.len() as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if !(0..=r).contains(&a) {
        return Err(Error::invalid(format!(
            "axis {axis} is out of range for rank {r}"
        )));
    }
    let (outer, inner) = dims.split_at(a as usize);
    Ok([outer.iter().product(), inner.iter().product()])
}

/// An axis in `-r..r` as an index.
pub(crate) fn axis(a: i64, r: usize) -> Result<usize> {
    normalize_axis(a, r)
        .ok_or_else(|| Error::invalid(format!("axis {a} is out of range for rank {r}")))
}

/// The value of input `i`, which must be known at import time.
pub(crate) fn const_input(cx: &Ctx, n: &Node, i: usize, what: &str) -> Result<Tensor> {
    let v = n.input(i, what)?;
    if let Some(t) = cx.constant_of(v) {
        return Ok(t);
    }
    let name = cx.function().name(v);
    if cx.weights.contains(&v) {
        return Err(Error::needs_constant(
            format!(
                "input {i} ({what}) must be known at import time (tcc's shapes are static), but initializer `{name}` was made a parameter; leave it out of --params"
            ),
            name,
        ));
    }
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
pub(crate) fn const_ints(cx: &Ctx, n: &Node, i: usize, what: &str) -> Result<Vec<i64>> {
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
pub(crate) fn axes_of(cx: &Ctx, n: &Node, input_since: i64) -> Result<Option<Vec<i64>>> {
    if n.opset < input_since {
        n.ints("axes")
    } else if n.opt(1).is_some() {
        const_ints(cx, n, 1, "axes").map(Some)
    } else {
        Ok(None)
    }
}

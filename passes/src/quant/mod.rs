//! Batch-norm folding and quantization: the passes that replace TensorFlow's
//! `contrib.quantize` graph rewrites.
//!
//! - [`fold_bn`](mod@fold_bn): inference batch norm and per-channel scales folded into the convolution or
//!   dense layer before them; [`fold_bn_training`]: training batch norm, with TensorFlow's
//!   corrections and freeze delay.
//! - [`Quantize`]: fake quantization of weights and activations for quantization-aware training.
//! - [`qdq`](mod@qdq): convolutions and matrix products of dequantized operands (ONNX's QDQ
//!   form) on the integer ops.
//! - [`ptq`]: post-training quantization (`tcc quantize`): layers put in QDQ form with the
//!   scales a calibration chose, then through `qdq`.
//!
//! Both keep their state explicit: parameters (`quant/...`, `<bn>/moving_mean`, ...) and
//! results `new/<name>` a train loop feeds back; [`initial_value`] says where each starts.

pub mod fold_bn;
pub mod fold_bn_training;
pub mod ptq;
pub mod qdq;
pub mod quantize;

pub use fold_bn::{FoldStats, fold_bn};
pub use quantize::{Quantize, QuantizeStats};

use tcc_ir::typing::infer;
use tcc_ir::{
    BinaryOp, DType, Data, Function, Literal, Op, OpKind, ReduceOp, Scalar, TensorType, UnaryOp,
    Value,
};

/// The value a state parameter these passes add starts at, TensorFlow's: `quant/<v>/min` and
/// `quant/<v>/max` at [`quantize::INITIAL_RANGE`], `quant/step` at 0, `<bn>/moving_var` at 1
/// (and `<bn>/moving_mean` at 0). `None` for other names.
pub fn initial_value(name: &str) -> Option<f64> {
    if name.ends_with("/moving_var") {
        return Some(1.0);
    }
    if name.ends_with("/moving_mean") {
        return Some(0.0);
    }
    let rest = name.strip_prefix("quant/")?;
    if rest == "step" {
        Some(0.0)
    } else if rest.ends_with("/min") {
        Some(quantize::INITIAL_RANGE.0)
    } else if rest.ends_with("/max") {
        Some(quantize::INITIAL_RANGE.1)
    } else {
        None
    }
}

/// The training step counter `quant/step` (an f32, exact to 2^24 steps, so every op on it
/// compiles), shared by the passes: the existing parameter, or a new one with the ops that
/// compute `new/quant/step = step + 1` and that result to return.
pub(crate) fn step_counter(f: &mut Function) -> Result<(Value, Vec<Op>, Option<Value>), String> {
    if let Some(&s) = f.params().iter().find(|&&p| f.name(p) == "quant/step") {
        return Ok((s, Vec::new(), None));
    }
    let s = f.add_param("quant/step", TensorType::scalar(DType::F32));
    let mut e = Emit { f, ops: Vec::new() };
    let one = e.scalar(DType::F32, 1.0, "quant/one")?;
    let next = e.bin(BinaryOp::Add, s, one, "new/quant/step")?;
    Ok((s, e.ops, Some(next)))
}

/// Builds new ops, unscheduled, for a pass to place in the schedule.
pub(crate) struct Emit<'f> {
    pub f: &'f mut Function,
    pub ops: Vec<Op>,
}

impl Emit<'_> {
    pub fn op(&mut self, kind: OpKind, args: &[Value], name: &str) -> Result<Value, String> {
        let tys: Vec<&TensorType> = args.iter().map(|&a| self.f.ty(a)).collect();
        let out = infer(&kind, &tys).map_err(|e| format!("internal error: {e}"))?;
        let name = self.f.unique_name(name);
        let op = self.f.create_op(kind, args.to_vec(), out, &[&name]);
        self.ops.push(op);
        Ok(self.f.op(op).results[0])
    }

    pub fn scalar(&mut self, dtype: DType, x: f64, name: &str) -> Result<Value, String> {
        self.constant(dtype, &[], vec![x], name)
    }

    /// A constant of `dtype` and `dims` holding `v` (rounded once to `dtype`, a float type).
    pub fn constant(
        &mut self,
        dtype: DType,
        dims: &[u64],
        v: Vec<f64>,
        name: &str,
    ) -> Result<Value, String> {
        let value = match (dtype, dims) {
            (_, []) => Literal::Splat(Scalar::from_f64(dtype, v[0])),
            (DType::F64, _) => Literal::dense(Data::F64(v)),
            _ => Literal::dense(Data::F32(v.into_iter().map(|x| x as f32).collect())),
        };
        let ty =
            TensorType::new(dtype, dims.to_vec()).map_err(|e| format!("internal error: {e}"))?;
        self.op(OpKind::Const { ty, value }, &[], name)
    }

    /// A constant of type `ty` holding `data` (of its dtype).
    pub fn constant_of(&mut self, ty: TensorType, data: Data, name: &str) -> Result<Value, String> {
        let value = Literal::dense(data);
        self.op(OpKind::Const { ty, value }, &[], name)
    }

    pub fn bin(&mut self, op: BinaryOp, a: Value, b: Value, name: &str) -> Result<Value, String> {
        self.op(OpKind::Binary(op), &[a, b], name)
    }

    /// `min(x)` and `max(x)` widened to include zero, over `axes` (kept as 1). The range carries
    /// no gradient back to `x`: TensorFlow assigns it to a variable before the fake quantization
    /// reads it (`LastValueQuantize`, `MovingAvgQuantize`), and an assignment has none.
    pub fn range(&mut self, x: Value, axes: &[i64], name: &str) -> Result<(Value, Value), String> {
        let dt = self.f.ty(x).dtype();
        let x = self.op(OpKind::StopGradient, &[x], name)?;
        let reduce = |e: &mut Self, v: Value, n: &str| {
            e.op(
                OpKind::Reduce {
                    op: ReduceOp::Max,
                    axes: axes.to_vec(),
                    keepdims: true,
                },
                &[v],
                n,
            )
        };
        let neg = self.op(OpKind::Unary(UnaryOp::Neg), &[x], name)?;
        let nmin = reduce(self, neg, name)?;
        let min = self.op(OpKind::Unary(UnaryOp::Neg), &[nmin], name)?;
        let max = reduce(self, x, name)?;
        let zero = self.scalar(dt, 0.0, name)?;
        let min = self.bin(BinaryOp::Min, min, zero, name)?;
        let max = self.bin(BinaryOp::Max, max, zero, name)?;
        Ok((min, max))
    }
}

//! The loss ops: `SoftmaxCrossEntropyLoss` and `NegativeLogLikelihoodLoss`.
//!
//! The common case (scores `[N, C]`, mean reduction, no class weights, no `ignore_index`, no
//! `log_prob` output) is tcc's fused `softmax_cross_entropy`, whose gradient is one stable
//! kernel. Everything else is composed: the class each label picks is a one-hot mask (labels
//! compared with `0..C` along axis 1), the picked log-probability is a masked sum over that
//! axis, and the reduction divides by the picked weights' sum as ONNX defines it. Selects, not
//! products, apply the mask, so a `-inf` log-probability of a class no label picks stays out.

use crate::ctx::{Ctx, Node, binary, cast, compare, reshape, tensor_i64};
use crate::{Error, Result};
use tcc_ir::{BinaryOp, CmpOp, DType, Data, OpKind, ReduceOp, Tensor, Value};

/// `SoftmaxCrossEntropyLoss`: `(scores, labels, weights?) -> (loss, log_prob?)`.
pub(super) fn softmax_cross_entropy(cx: &mut Ctx, n: &Node) -> Result<Vec<Option<Value>>> {
    let scores = n.input(0, "scores")?;
    let labels = n.input(1, "labels")?;
    let l = Loss::of(cx, n, scores, labels)?;
    let wants_log_prob = n.p.output.get(1).is_some_and(|o| !o.is_empty());
    if l.plain && !wants_log_prob && cx.dims(scores).len() == 2 {
        let loss = cx.op1(OpKind::SoftmaxCrossEntropy, &[scores, labels])?;
        return Ok(vec![Some(loss)]);
    }
    let log_prob = cx.op1(OpKind::LogSoftmax { axis: 1 }, &[scores])?;
    let loss = l.negative_log_likelihood(cx, log_prob)?;
    Ok(vec![Some(loss), Some(log_prob)])
}

/// `NegativeLogLikelihoodLoss`: `(log_prob, labels, weights?) -> loss`.
pub(super) fn negative_log_likelihood(cx: &mut Ctx, n: &Node) -> Result<Value> {
    let input = n.input(0, "input")?;
    let labels = n.input(1, "target")?;
    Loss::of(cx, n, input, labels)?.negative_log_likelihood(cx, input)
}

/// What both loss ops share: the labels, the optional class weights and the options.
struct Loss {
    labels: Value,
    weights: Option<Value>,
    reduction: Reduction,
    ignore: Option<i64>,
    /// No weights, no ignored index, mean reduction: what `softmax_cross_entropy` computes.
    plain: bool,
}

#[derive(Clone, Copy, PartialEq)]
enum Reduction {
    None,
    Sum,
    Mean,
}

impl Loss {
    /// Reads and checks the options and the shapes: `x` is `[N, C, d1..]` (float), `labels`
    /// `[N, d1..]` (i32 or i64), weights `[C]` like `x`.
    fn of(cx: &Ctx, n: &Node, x: Value, labels: Value) -> Result<Loss> {
        let reduction = match n.string("reduction", "mean")?.as_str() {
            "none" => Reduction::None,
            "sum" => Reduction::Sum,
            "mean" => Reduction::Mean,
            other => {
                return Err(Error::invalid(format!(
                    "reduction must be none, sum or mean, found `{other}`"
                )));
            }
        };
        let ignore = n
            .attr("ignore_index")
            .map(|_| n.int("ignore_index", 0))
            .transpose()?;
        let (xd, ld) = (cx.dims(x), cx.dims(labels));
        if !cx.dtype(x).is_float() {
            return Err(Error::invalid(format!(
                "the scores must be floating-point, found {}",
                cx.ty(x)
            )));
        }
        if !matches!(cx.dtype(labels), DType::I32 | DType::I64) {
            return Err(Error::invalid(format!(
                "the labels must be int32 or int64, found {}",
                cx.ty(labels)
            )));
        }
        if xd.len() < 2 || ld.len() + 1 != xd.len() || ld[0] != xd[0] || ld[1..] != xd[2..] {
            return Err(Error::invalid(format!(
                "the scores must be [N, C, d1, ...] and the labels [N, d1, ...], found {} and {}",
                cx.ty(x),
                cx.ty(labels)
            )));
        }
        let weights = n.opt(2);
        if let Some(w) = weights
            && (cx.dims(w) != [xd[1]] || cx.dtype(w) != cx.dtype(x))
        {
            return Err(Error::invalid(format!(
                "the weights must be {}[{}], one per class, found {}",
                cx.dtype(x),
                xd[1],
                cx.ty(w)
            )));
        }
        Ok(Loss {
            labels,
            weights,
            reduction,
            ignore,
            plain: weights.is_none() && ignore.is_none() && reduction == Reduction::Mean,
        })
    }

    /// The loss from log-probabilities `log_prob [N, C, d1..]`.
    fn negative_log_likelihood(&self, cx: &mut Ctx, log_prob: Value) -> Result<Value> {
        let d = cx.dims(log_prob);
        let dt = cx.dtype(log_prob);
        let (c, rank) = (d[1], d.len());
        // One-hot of the labels along axis 1: labels [N, 1, d1..] == classes [1, C, 1..].
        let mut label_dims = d.clone();
        label_dims[1] = 1;
        let labels = reshape(cx, self.labels, &label_dims)?;
        let mut class_dims = vec![1; rank];
        class_dims[1] = c;
        let classes = match cx.dtype(self.labels) {
            DType::I32 => Tensor::from_data(&class_dims, Data::I32((0..c as i32).collect()))
                .map_err(|e| Error::invalid(e.to_string()))?,
            _ => tensor_i64(&class_dims, (0..c as i64).collect())?,
        };
        let classes = cx.constant(classes)?;
        let onehot = compare(cx, CmpOp::Eq, labels, classes)?;
        let zero = cx.scalar(dt, 0.0)?;
        let picked = cx.op1(OpKind::Select, &[onehot, log_prob, zero])?;
        let sum1 = |cx: &mut Ctx, v: Value| {
            cx.op1(
                OpKind::Reduce {
                    op: ReduceOp::Sum,
                    axes: vec![1],
                    keepdims: false,
                },
                &[v],
            )
        };
        let picked = sum1(cx, picked)?;
        let mut loss = cx.op1(OpKind::Unary(tcc_ir::UnaryOp::Neg), &[picked])?;
        // The weight of each element: its class's weight, zero where the label is ignored.
        let mut weight = None;
        if let Some(w) = self.weights {
            let mut wd = vec![1; rank];
            wd[1] = c;
            let w = reshape(cx, w, &wd)?;
            let wl = cx.op1(OpKind::Select, &[onehot, w, zero])?;
            weight = Some(sum1(cx, wl)?);
        }
        if let Some(ignore) = self.ignore {
            let ldt = cx.dtype(self.labels);
            let i = cx.scalar(ldt, ignore as f64)?;
            let keep = compare(cx, CmpOp::Ne, self.labels, i)?;
            let keep = cast(cx, keep, dt)?;
            weight = Some(match weight {
                Some(w) => binary(cx, BinaryOp::Mul, w, keep)?,
                None => keep,
            });
        }
        if let Some(w) = weight {
            loss = binary(cx, BinaryOp::Mul, loss, w)?;
        }
        let all = |cx: &mut Ctx, v: Value, op| {
            let axes = (0..cx.dims(v).len() as i64).collect();
            cx.op1(
                OpKind::Reduce {
                    op,
                    axes,
                    keepdims: false,
                },
                &[v],
            )
        };
        match (self.reduction, weight) {
            (Reduction::None, _) => Ok(loss),
            (Reduction::Sum, _) => all(cx, loss, ReduceOp::Sum),
            (Reduction::Mean, None) => all(cx, loss, ReduceOp::Mean),
            (Reduction::Mean, Some(w)) => {
                let num = all(cx, loss, ReduceOp::Sum)?;
                let den = all(cx, w, ReduceOp::Sum)?;
                binary(cx, BinaryOp::Div, num, den)
            }
        }
    }
}

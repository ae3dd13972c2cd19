//! One gradient rule per op: given the op's operands, results and the cotangents of its results,
//! build the cotangent contribution to each operand that needs one.
//!
//! Rules build ordinary IR through [`FunctionBuilder`], so every op they emit is type-checked as
//! it is created. Choices at non-differentiable points are documented in docs/passes.md: `relu`,
//! `abs` and the comparison masks give the gradient of a tie to one side (`max(a, b)` to `a`, the
//! `relu` kink to 0), `reduce_max` shares a tie equally, `max_pool2d` gives it to the first
//! maximum of the window.

use tcc_ir::builder::BuildError;
use tcc_ir::{BinaryOp, CmpOp, DType, FunctionBuilder, OpKind, ReduceOp, UnaryOp, Value};

type R<T> = Result<T, BuildError>;

/// Why a rule produced no gradient.
enum RuleError {
    /// A rule built an ill-typed op: a bug.
    Build(BuildError),
    /// The op has no gradient rule (for this operand).
    Unsupported(&'static str),
}

impl From<BuildError> for RuleError {
    fn from(e: BuildError) -> RuleError {
        RuleError::Build(e)
    }
}

/// Builds gradient ops into a function.
pub(crate) struct Rules<'b> {
    pub b: &'b mut FunctionBuilder,
}

/// What a rule sees of one op.
pub(crate) struct OpGrad<'k> {
    pub kind: &'k OpKind,
    pub args: &'k [Value],
    pub results: &'k [Value],
    /// The cotangent of each result (`None`: zero).
    pub dys: &'k [Option<Value>],
    /// Whether each operand needs a gradient.
    pub needs: &'k [bool],
}

impl Rules<'_> {
    fn dims(&self, v: Value) -> Vec<u64> {
        self.b.function().ty(v).dims().to_vec()
    }

    fn dtype(&self, v: Value) -> DType {
        self.b.function().ty(v).dtype()
    }

    /// A scalar constant of `like`'s dtype (broadcasts against anything).
    fn scalar(&mut self, like: Value, x: f64) -> R<Value> {
        let dt = self.dtype(like);
        self.b.splat(dt, &[], x)
    }

    /// Zeros of `v`'s type.
    pub fn zeros_like(&mut self, v: Value) -> R<Value> {
        let (dt, d) = (self.dtype(v), self.dims(v));
        self.b.splat(dt, &d, 0.0)
    }

    fn un(&mut self, op: UnaryOp, x: Value) -> R<Value> {
        self.b.unary(op, x)
    }

    fn mul_c(&mut self, x: Value, c: f64) -> R<Value> {
        let k = self.scalar(x, c)?;
        self.b.mul(x, k)
    }

    fn cmp(&mut self, op: CmpOp, a: Value, b: Value) -> R<Value> {
        self.b.compare(op, a, b)
    }

    fn select(&mut self, c: Value, a: Value, b: Value) -> R<Value> {
        self.b.op1(OpKind::Select, &[c, a, b])
    }

    /// `dy` where `mask`, else 0.
    fn mask(&mut self, mask: Value, dy: Value, keep_where_true: bool) -> R<Value> {
        let z = self.scalar(dy, 0.0)?;
        if keep_where_true {
            self.select(mask, dy, z)
        } else {
            self.select(mask, z, dy)
        }
    }

    /// Sums `g` down to `shape` (the inverse of numpy broadcasting from `shape`).
    pub fn unbroadcast(&mut self, g: Value, shape: &[u64]) -> R<Value> {
        let gd = self.dims(g);
        if gd == shape {
            return Ok(g);
        }
        let lead = gd.len() - shape.len();
        let axes: Vec<i64> = (0..gd.len())
            .filter(|&i| i < lead || (shape[i - lead] == 1 && gd[i] != 1))
            .map(|i| i as i64)
            .collect();
        let s = if axes.is_empty() {
            g
        } else {
            self.b.reduce(ReduceOp::Sum, g, &axes, false)?
        };
        self.reshape(s, shape)
    }

    /// Reshapes unless `x` already has `dims`.
    fn reshape(&mut self, x: Value, dims: &[u64]) -> R<Value> {
        if self.dims(x) == dims {
            Ok(x)
        } else {
            self.b.reshape(x, dims)
        }
    }

    fn broadcast(&mut self, g: Value, shape: &[u64]) -> R<Value> {
        if self.dims(g) == shape {
            return Ok(g);
        }
        self.b.op1(
            OpKind::BroadcastTo {
                shape: shape.to_vec(),
            },
            &[g],
        )
    }

    /// `g` (reduced over `axes` of a value with dims `full`) reshaped with those axes kept as 1,
    /// then broadcast back to `full`.
    fn unreduce(&mut self, g: Value, full: &[u64], axes: &[usize]) -> R<Value> {
        let kept: Vec<u64> = (0..full.len())
            .map(|i| if axes.contains(&i) { 1 } else { full[i] })
            .collect();
        let g = self.reshape(g, &kept)?;
        self.broadcast(g, full)
    }

    /// Swaps the last two axes.
    fn transpose_last2(&mut self, x: Value) -> R<Value> {
        let r = self.dims(x).len() as u64;
        let mut perm: Vec<u64> = (0..r).collect();
        perm.swap(r as usize - 2, r as usize - 1);
        self.b.transpose(x, &perm)
    }

    /// Reshapes a per-channel `[C]` vector to broadcast against a rank-`rank` NC... tensor.
    fn per_channel(&mut self, v: Value, rank: usize) -> R<Value> {
        let c = self.dims(v)[0];
        let mut s = vec![1u64; rank];
        s[1] = c;
        self.reshape(v, &s)
    }

    /// The contribution to each operand of `op`. `Err` only on a bug (an ill-typed rule) or for an
    /// op with no gradient rule.
    pub fn rule(&mut self, g: &OpGrad<'_>) -> Result<Vec<Option<Value>>, String> {
        self.rule_inner(g).map_err(|e| match e {
            RuleError::Build(e) => format!(
                "internal error in the gradient rule of `{}`: {e}",
                g.kind.mnemonic()
            ),
            RuleError::Unsupported(msg) => msg.to_string(),
        })
    }

    fn rule_inner(&mut self, g: &OpGrad<'_>) -> Result<Vec<Option<Value>>, RuleError> {
        let a = g.args;
        let y = g.results[0];
        let n = a.len();
        let mut out: Vec<Option<Value>> = vec![None; n];
        // Multi-result ops (batch norm training) handle missing cotangents themselves.
        let dy = match (g.kind, g.dys[0]) {
            (OpKind::BatchNormTrain { .. }, _) => None,
            (_, Some(d)) => Some(d),
            (_, None) => return Ok(out),
        };
        let dyv = || dy.expect("single-result op with a cotangent");
        match g.kind {
            // No gradient flows through these (`fake_quant` is quantization's differentiable
            // form; the integer ops are not `DIFFERENTIABLE`, so no path reaches them).
            OpKind::Const { .. }
            | OpKind::StopGradient
            | OpKind::Compare(_)
            | OpKind::QuantizeLinear
            | OpKind::DequantizeLinear
            | OpKind::MatMulInteger
            | OpKind::ConvInteger(_) => {}
            // Copies: the gradient passes by them unchanged, in device memory (a cotangent is
            // never a host value, so no backward op reads one).
            OpKind::SwapOut | OpKind::SwapIn | OpKind::Identity => out[0] = dy,
            OpKind::Unary(u) => out[0] = Some(self.unary(*u, a[0], y, dyv())?),
            OpKind::Binary(op) => {
                let (da, db) = self.binary(*op, a[0], a[1], y, dyv(), g.needs)?;
                let (sa, sb) = (self.dims(a[0]), self.dims(a[1]));
                if let Some(d) = da {
                    out[0] = Some(self.unbroadcast(d, &sa)?);
                }
                if let Some(d) = db {
                    out[1] = Some(self.unbroadcast(d, &sb)?);
                }
            }
            OpKind::Select => {
                let dy = dyv();
                for (i, keep) in [(1, true), (2, false)] {
                    if g.needs[i] {
                        let m = self.mask(a[0], dy, keep)?;
                        let s = self.dims(a[i]);
                        out[i] = Some(self.unbroadcast(m, &s)?);
                    }
                }
            }
            OpKind::BroadcastTo { .. } => {
                let s = self.dims(a[0]);
                out[0] = Some(self.unbroadcast(dyv(), &s)?);
            }
            OpKind::Cast { .. } => {
                let to = self.dtype(a[0]);
                out[0] = Some(self.b.op1(OpKind::Cast { to }, &[dyv()])?);
            }
            OpKind::MatMul => {
                let dy = dyv();
                if g.needs[0] {
                    let bt = self.transpose_last2(a[1])?;
                    let d = self.b.matmul(dy, bt)?;
                    let s = self.dims(a[0]);
                    out[0] = Some(self.unbroadcast(d, &s)?);
                }
                if g.needs[1] {
                    let at = self.transpose_last2(a[0])?;
                    let d = self.b.matmul(at, dy)?;
                    let s = self.dims(a[1]);
                    out[1] = Some(self.unbroadcast(d, &s)?);
                }
            }
            OpKind::Conv2d(c) => {
                let dy = dyv();
                if g.needs[0] {
                    let shape = self.dims(a[0]);
                    let k = OpKind::Conv2dGradInput {
                        conv: c.clone(),
                        shape,
                    };
                    out[0] = Some(self.b.op1(k, &[dy, a[1]])?);
                }
                if g.needs[1] {
                    let shape = self.dims(a[1]);
                    let k = OpKind::Conv2dGradFilter {
                        conv: c.clone(),
                        shape,
                    };
                    out[1] = Some(self.b.op1(k, &[a[0], dy])?);
                }
            }
            OpKind::Conv2dNchwc { conv, block } => {
                // y = to_nchwc(conv2d(x, w)) with x plain or from_nchwc'd: the conv2d rule
                // between the layout changes.
                let channels = self.dims(a[1])[0];
                let dy = self.b.op1(OpKind::FromNchwc { channels }, &[dyv()])?;
                let blocked = self.dims(a[0]).len() == 5;
                let x = if blocked {
                    let channels = self.dims(a[1])[1] * conv.groups;
                    self.b.op1(OpKind::FromNchwc { channels }, &[a[0]])?
                } else {
                    a[0]
                };
                if g.needs[0] {
                    let shape = self.dims(x);
                    let k = OpKind::Conv2dGradInput {
                        conv: conv.clone(),
                        shape,
                    };
                    let dx = self.b.op1(k, &[dy, a[1]])?;
                    out[0] = Some(if blocked {
                        self.b.op1(OpKind::ToNchwc { block: *block }, &[dx])?
                    } else {
                        dx
                    });
                }
                if g.needs[1] {
                    let shape = self.dims(a[1]);
                    let k = OpKind::Conv2dGradFilter {
                        conv: conv.clone(),
                        shape,
                    };
                    out[1] = Some(self.b.op1(k, &[x, dy])?);
                }
            }
            OpKind::ToNchwc { .. } => {
                let channels = self.dims(a[0])[1];
                out[0] = Some(self.b.op1(OpKind::FromNchwc { channels }, &[dyv()])?);
            }
            OpKind::FromNchwc { .. } => {
                let block = *self.dims(a[0]).last().expect("rank 3 or more");
                out[0] = Some(self.b.op1(OpKind::ToNchwc { block }, &[dyv()])?);
            }
            OpKind::Conv2dGradInput { conv, .. } => {
                // dx = conv2d_grad_input(dy, w): linear in both operands.
                let ddx = dyv();
                if g.needs[0] {
                    out[0] = Some(self.b.conv2d(ddx, a[1], conv.clone())?);
                }
                if g.needs[1] {
                    let shape = self.dims(a[1]);
                    let k = OpKind::Conv2dGradFilter {
                        conv: conv.clone(),
                        shape,
                    };
                    out[1] = Some(self.b.op1(k, &[ddx, a[0]])?);
                }
            }
            OpKind::Conv2dGradFilter { conv, .. } => {
                // dw = conv2d_grad_filter(x, dy): linear in both operands.
                let ddw = dyv();
                if g.needs[0] {
                    let shape = self.dims(a[0]);
                    let k = OpKind::Conv2dGradInput {
                        conv: conv.clone(),
                        shape,
                    };
                    out[0] = Some(self.b.op1(k, &[a[1], ddw])?);
                }
                if g.needs[1] {
                    out[1] = Some(self.b.conv2d(a[0], ddw, conv.clone())?);
                }
            }
            OpKind::MaxPool2d(_) | OpKind::AvgPool2d { .. } if self.dims(a[0]).len() == 5 => {
                // Channel blocks: the plain op's gradient with every lane a channel.
                let d = self.dims(a[0]);
                let (channels, block) = (d[1] * d[4], d[4]);
                let x = self.b.op1(OpKind::FromNchwc { channels }, &[a[0]])?;
                let y = self.b.op1(g.kind.clone(), &[x])?;
                let dy = self.b.op1(OpKind::FromNchwc { channels }, &[dyv()])?;
                let grads = self.rule_inner(&OpGrad {
                    kind: g.kind,
                    args: &[x],
                    results: &[y],
                    dys: &[Some(dy)],
                    needs: &[true],
                })?;
                let dx = grads[0].expect("pooling has a gradient");
                out[0] = Some(self.b.op1(OpKind::ToNchwc { block }, &[dx])?);
            }
            OpKind::MaxPool2d(p) => {
                out[0] = Some(
                    self.b
                        .op1(OpKind::MaxPool2dGrad(p.clone()), &[a[0], dyv()])?,
                );
            }
            OpKind::AvgPool2d {
                pool,
                count_include_pad,
            } => {
                let k = OpKind::AvgPool2dGrad {
                    pool: pool.clone(),
                    count_include_pad: *count_include_pad,
                    shape: self.dims(a[0]),
                };
                out[0] = Some(self.b.op1(k, &[dyv()])?);
            }
            OpKind::AvgPool2dGrad {
                pool,
                count_include_pad,
                ..
            } => {
                let k = OpKind::AvgPool2d {
                    pool: pool.clone(),
                    count_include_pad: *count_include_pad,
                };
                out[0] = Some(self.b.op1(k, &[dyv()])?);
            }
            OpKind::GlobalAvgPool => {
                let d = self.dims(a[0]);
                let s = self.mul_c(dyv(), 1.0 / (d[2] * d[3]) as f64)?;
                out[0] = Some(self.broadcast(s, &d)?);
            }
            OpKind::Reduce { op, axes, .. } => {
                let d = self.dims(a[0]);
                let axes: Vec<usize> = axes
                    .iter()
                    .map(|&x| tcc_ir::ops::normalize_axis(x, d.len()).expect("verified"))
                    .collect();
                let count: u64 = axes.iter().map(|&i| d[i]).product();
                out[0] = Some(match op {
                    ReduceOp::Sum => self.unreduce(dyv(), &d, &axes)?,
                    ReduceOp::Mean => {
                        let s = self.mul_c(dyv(), 1.0 / count as f64)?;
                        self.unreduce(s, &d, &axes)?
                    }
                    ReduceOp::Max => {
                        // Ties share the gradient equally.
                        let yb = self.unreduce(y, &d, &axes)?;
                        let mask = self.cmp(CmpOp::Eq, a[0], yb)?;
                        let dt = self.dtype(a[0]);
                        let ones = self.b.op1(OpKind::Cast { to: dt }, &[mask])?;
                        let ax: Vec<i64> = axes.iter().map(|&i| i as i64).collect();
                        let k = self.b.reduce(ReduceOp::Sum, ones, &ax, true)?;
                        let kd = self.dims(k);
                        let dyk = self.reshape(dyv(), &kd)?;
                        let share = self.b.div(dyk, k)?;
                        let sb = self.broadcast(share, &d)?;
                        self.mask(mask, sb, true)?
                    }
                });
            }
            OpKind::Softmax { axis } => {
                // dx = y * (dy - sum(dy * y)).
                let dy = dyv();
                let p = self.b.mul(dy, y)?;
                let s = self.b.reduce(ReduceOp::Sum, p, &[*axis], true)?;
                let t = self.b.sub(dy, s)?;
                out[0] = Some(self.b.mul(y, t)?);
            }
            OpKind::LogSoftmax { axis } => {
                // dx = dy - softmax(x) * sum(dy).
                let dy = dyv();
                let s = self.b.reduce(ReduceOp::Sum, dy, &[*axis], true)?;
                let p = self.un(UnaryOp::Exp, y)?;
                let t = self.b.mul(p, s)?;
                out[0] = Some(self.b.sub(dy, t)?);
            }
            OpKind::SoftmaxCrossEntropy => {
                // The fused, stable form: (softmax(logits) - onehot(labels)) * dy / N.
                let k = OpKind::SoftmaxCrossEntropyGrad;
                out[0] = Some(self.b.op1(k, &[a[0], a[1], dyv()])?);
            }
            OpKind::SoftmaxCrossEntropyGrad if g.needs[0] || g.needs[2] => {
                return Err(RuleError::Unsupported(
                    "`softmax_cross_entropy_grad` has no gradient rule (second derivatives through softmax cross-entropy are not supported)",
                ));
            }
            OpKind::SoftmaxCrossEntropyGrad => {}
            OpKind::BatchNorm { eps } => {
                self.batch_norm_inference(a, eps.0, dyv(), g.needs, &mut out)?;
            }
            OpKind::BatchNormTrain { eps } => {
                self.batch_norm_train(a, g.results, g.dys, eps.0, g.needs, &mut out)?;
            }
            OpKind::Reshape { .. } => {
                let s = self.dims(a[0]);
                out[0] = Some(self.reshape(dyv(), &s)?);
            }
            OpKind::Transpose { perm } => {
                let mut inv = vec![0u64; perm.len()];
                for (i, &p) in perm.iter().enumerate() {
                    inv[p as usize] = i as u64;
                }
                out[0] = Some(self.b.transpose(dyv(), &inv)?);
            }
            OpKind::Concat { axis } => {
                let r = self.dims(y).len();
                let ax = tcc_ir::ops::normalize_axis(*axis, r).expect("verified");
                let mut at = 0i64;
                for i in 0..n {
                    let len = self.dims(a[i])[ax] as i64;
                    if g.needs[i] {
                        let yd = self.dims(y);
                        let mut starts = vec![0i64; r];
                        let mut ends: Vec<i64> = yd.iter().map(|&d| d as i64).collect();
                        starts[ax] = at;
                        ends[ax] = at + len;
                        let k = OpKind::Slice {
                            starts,
                            ends,
                            steps: vec![1; r],
                        };
                        out[i] = Some(self.b.op1(k, &[dyv()])?);
                    }
                    at += len;
                }
            }
            OpKind::Slice {
                starts,
                ends,
                steps,
            } => {
                let k = OpKind::SliceGrad {
                    shape: self.dims(a[0]),
                    starts: starts.clone(),
                    ends: ends.clone(),
                    steps: steps.clone(),
                };
                out[0] = Some(self.b.op1(k, &[dyv()])?);
            }
            OpKind::SliceGrad {
                starts,
                ends,
                steps,
                ..
            } => {
                let k = OpKind::Slice {
                    starts: starts.clone(),
                    ends: ends.clone(),
                    steps: steps.clone(),
                };
                out[0] = Some(self.b.op1(k, &[dyv()])?);
            }
            OpKind::FakeQuant { bits, narrow } => {
                let (dx, dmin, dmax) = self.fake_quant(a, *bits, *narrow, dyv())?;
                out[0] = Some(dx);
                out[1] = Some(self.unbroadcast(dmin, &self.dims(a[1]))?);
                out[2] = Some(self.unbroadcast(dmax, &self.dims(a[2]))?);
            }
            OpKind::TopK { axis, .. } => {
                out[0] = Some(self.top_k(a[0], g.results[1], *axis, dyv())?);
            }
            OpKind::Gather { axis } => {
                // Sparse: scatter the rows that were read into zeros.
                let z = self.zeros_like(a[0])?;
                let k = OpKind::ScatterAdd { axis: *axis };
                out[0] = Some(self.b.op1(k, &[z, a[1], dyv()])?);
            }
            OpKind::ScatterAdd { axis } => {
                out[0] = dy;
                if g.needs[2] {
                    out[2] = Some(self.b.op1(OpKind::Gather { axis: *axis }, &[dyv(), a[1]])?);
                }
            }
            // Piecewise constant in x (zero gradient); linear in dy, but that rule (routing each
            // window's cotangent from its argmax) has no op yet.
            OpKind::MaxPool2dGrad(_) if g.needs[1] => {
                return Err(RuleError::Unsupported(
                    "`max_pool2d_grad` has no gradient rule with respect to its cotangent (second derivatives through max pooling are not supported)",
                ));
            }
            OpKind::MaxPool2dGrad(_) => {}
        }
        Ok(out)
    }

    /// The gradient of `fake_quant`, as TensorFlow defines it: straight through inside the
    /// nudged range (`dy` where `nudged_min <= x <= nudged_max`), and `dy` summed below it into
    /// `min` and above it into `max` (returned unreduced). The nudged range is rebuilt here
    /// from `min` and `max` with the forward op's formulas.
    fn fake_quant(
        &mut self,
        a: &[Value],
        bits: u64,
        narrow: bool,
        dy: Value,
    ) -> R<(Value, Value, Value)> {
        let (x, lo, hi) = (a[0], a[1], a[2]);
        let qmin = if narrow { 1.0 } else { 0.0 };
        let qmax = ((1u64 << bits) - 1) as f64;
        let span = self.b.sub(hi, lo)?;
        let levels = self.scalar(x, qmax - qmin)?;
        let scale = self.b.div(span, levels)?;
        let ratio = self.b.div(lo, scale)?;
        let qmin_v = self.scalar(x, qmin)?;
        let from_min = self.b.sub(qmin_v, ratio)?;
        // The zero point rounded half away from zero, then clamped to the levels.
        let t = self.un(UnaryOp::Floor, from_min)?;
        let frac = self.b.sub(from_min, t)?;
        let half = self.scalar(x, 0.5)?;
        let up = self.cmp(CmpOp::Ge, frac, half)?;
        let one = self.scalar(x, 1.0)?;
        let t1 = self.b.add(t, one)?;
        let zero = self.select(up, t1, t)?;
        let qmax_v = self.scalar(x, qmax)?;
        let zero = self.b.binary(BinaryOp::Max, zero, qmin_v)?;
        let zero = self.b.binary(BinaryOp::Min, zero, qmax_v)?;
        let low = self.b.sub(qmin_v, zero)?;
        let high = self.b.sub(qmax_v, zero)?;
        let nmin = self.b.mul(low, scale)?;
        let nmax = self.b.mul(high, scale)?;
        let below = self.cmp(CmpOp::Lt, x, nmin)?;
        let above = self.cmp(CmpOp::Gt, x, nmax)?;
        let zero_v = self.scalar(x, 0.0)?;
        let dmin = self.select(below, dy, zero_v)?;
        let dmax = self.select(above, dy, zero_v)?;
        let inside = self.select(above, zero_v, dy)?;
        let dx = self.select(below, zero_v, inside)?;
        Ok((dx, dmin, dmax))
    }

    /// The gradient of `top_k`: each value's cotangent goes back to the position its index
    /// names. The axis is moved last and the lines flattened, so that one `scatter_add` into
    /// zeros does it with flat indices `line * len + index`.
    fn top_k(&mut self, x: Value, indices: Value, axis: i64, dy: Value) -> R<Value> {
        let xd = self.dims(x);
        let r = xd.len();
        let a = tcc_ir::ops::normalize_axis(axis, r).expect("verified axis");
        let mut perm: Vec<u64> = (0..r as u64).filter(|&i| i != a as u64).collect();
        perm.push(a as u64);
        let last = |s: &mut Self, v: Value| -> R<Value> {
            if a + 1 == r {
                Ok(v)
            } else {
                s.b.transpose(v, &perm)
            }
        };
        let (len, k) = (xd[a], self.dims(indices)[a]);
        let lines: u64 = xd.iter().product::<u64>() / len.max(1);
        let (dyt, it) = (last(self, dy)?, last(self, indices)?);
        let it = self.reshape(it, &[lines, k])?;
        let offsets = tcc_ir::TensorType::new(tcc_ir::DType::I64, vec![lines, 1])
            .map_err(|e| BuildError(e.to_string()))?;
        let offsets = self.b.constant(
            offsets,
            tcc_ir::Literal::dense(tcc_ir::Data::I64(
                (0..lines as i64).map(|l| l * len as i64).collect(),
            )),
        )?;
        let flat = self.b.add(it, offsets)?;
        let flat = self.reshape(flat, &[lines * k])?;
        let dyf = self.reshape(dyt, &[lines * k])?;
        let z = self.b.splat(self.dtype(x), &[lines * len], 0.0)?;
        let dx = self
            .b
            .op1(OpKind::ScatterAdd { axis: 0 }, &[z, flat, dyf])?;
        let mut td: Vec<u64> = perm.iter().map(|&p| xd[p as usize]).collect();
        td[r - 1] = len;
        let dx = self.reshape(dx, &td)?;
        if a + 1 == r {
            return Ok(dx);
        }
        let mut inv = vec![0u64; r];
        for (i, &p) in perm.iter().enumerate() {
            inv[p as usize] = i as u64;
        }
        self.b.transpose(dx, &inv)
    }

    fn unary(&mut self, u: UnaryOp, x: Value, y: Value, dy: Value) -> R<Value> {
        use UnaryOp::*;
        Ok(match u {
            // Not differentiable (zero almost everywhere): the forward sweep never reaches
            // through them, so no rule is asked for.
            Floor | Ceil | Round => unreachable!("`{}` is not differentiable", u.mnemonic()),
            Neg => self.un(Neg, dy)?,
            Abs => {
                // d|x| = sign(x); 0 at 0.
                let z = self.scalar(x, 0.0)?;
                let pos = self.cmp(CmpOp::Gt, x, z)?;
                let neg = self.cmp(CmpOp::Lt, x, z)?;
                let nd = self.un(Neg, dy)?;
                let t = self.select(neg, nd, z)?;
                self.select(pos, dy, t)?
            }
            Exp => self.b.mul(dy, y)?,
            Log => self.b.div(dy, x)?,
            Sqrt => {
                let h = self.mul_c(dy, 0.5)?;
                self.b.div(h, y)?
            }
            Rsqrt => {
                // d x^-1/2 = -y / (2x).
                let h = self.mul_c(y, -0.5)?;
                let t = self.b.mul(dy, h)?;
                self.b.div(t, x)?
            }
            Reciprocal => {
                let yy = self.b.mul(y, y)?;
                let t = self.b.mul(dy, yy)?;
                self.un(Neg, t)?
            }
            Tanh => {
                let yy = self.b.mul(y, y)?;
                let one = self.scalar(y, 1.0)?;
                let t = self.b.sub(one, yy)?;
                self.b.mul(dy, t)?
            }
            Sigmoid => {
                let one = self.scalar(y, 1.0)?;
                let t = self.b.sub(one, y)?;
                let s = self.b.mul(y, t)?;
                self.b.mul(dy, s)?
            }
            Relu => {
                let z = self.scalar(x, 0.0)?;
                let pos = self.cmp(CmpOp::Gt, x, z)?;
                self.mask(pos, dy, true)?
            }
            Erf => {
                // 2/sqrt(pi) * exp(-x^2).
                let xx = self.b.mul(x, x)?;
                let e = self.mul_c(xx, -1.0)?;
                let e = self.un(Exp, e)?;
                let s = self.mul_c(e, std::f64::consts::FRAC_2_SQRT_PI)?;
                self.b.mul(dy, s)?
            }
            Gelu => {
                // Phi(x) + x * phi(x).
                let xs = self.mul_c(x, std::f64::consts::FRAC_1_SQRT_2)?;
                let erf = self.un(Erf, xs)?;
                let one = self.scalar(x, 1.0)?;
                let cdf = self.b.add(erf, one)?;
                let cdf = self.mul_c(cdf, 0.5)?;
                let xx = self.b.mul(x, x)?;
                let e = self.mul_c(xx, -0.5)?;
                let e = self.un(Exp, e)?;
                let pdf = self.mul_c(e, 1.0 / (2.0 * std::f64::consts::PI).sqrt())?;
                let xp = self.b.mul(x, pdf)?;
                let d = self.b.add(cdf, xp)?;
                self.b.mul(dy, d)?
            }
        })
    }

    /// The (unreduced) contributions to `a` and `b` of `op(a, b) = y`.
    fn binary(
        &mut self,
        op: BinaryOp,
        a: Value,
        b: Value,
        y: Value,
        dy: Value,
        needs: &[bool],
    ) -> R<(Option<Value>, Option<Value>)> {
        use BinaryOp::*;
        let (na, nb) = (needs[0], needs[1]);
        let when =
            |n: bool, v: R<Value>| -> R<Option<Value>> { if n { v.map(Some) } else { Ok(None) } };
        Ok(match op {
            Add => (na.then_some(dy), nb.then_some(dy)),
            Sub => (na.then_some(dy), when(nb, self.un(UnaryOp::Neg, dy))?),
            Mul => {
                let da = when(na, self.b.mul(dy, b))?;
                (da, when(nb, self.b.mul(dy, a))?)
            }
            Div => {
                let da = when(na, self.b.div(dy, b))?;
                let db = if nb {
                    // -dy * y / b
                    let t = self.b.mul(dy, y)?;
                    let t = self.b.div(t, b)?;
                    Some(self.un(UnaryOp::Neg, t)?)
                } else {
                    None
                };
                (da, db)
            }
            Pow => {
                let da = if na {
                    // dy * b * a^(b-1)
                    let one = self.scalar(b, 1.0)?;
                    let bm1 = self.b.sub(b, one)?;
                    let p = self.b.binary(Pow, a, bm1)?;
                    let t = self.b.mul(p, b)?;
                    Some(self.b.mul(dy, t)?)
                } else {
                    None
                };
                let db = if nb {
                    // dy * y * log(a), taking log(a) as 0 where a <= 0.
                    let z = self.scalar(a, 0.0)?;
                    let pos = self.cmp(CmpOp::Gt, a, z)?;
                    let l = self.un(UnaryOp::Log, a)?;
                    let l = self.select(pos, l, z)?;
                    let t = self.b.mul(y, l)?;
                    Some(self.b.mul(dy, t)?)
                } else {
                    None
                };
                (da, db)
            }
            Max | Min => {
                // Ties go to `a`.
                let c = if op == Max { CmpOp::Ge } else { CmpOp::Le };
                let m = self.cmp(c, a, b)?;
                let da = if na {
                    Some(self.mask(m, dy, true)?)
                } else {
                    None
                };
                let db = if nb {
                    Some(self.mask(m, dy, false)?)
                } else {
                    None
                };
                (da, db)
            }
        })
    }

    fn batch_norm_inference(
        &mut self,
        a: &[Value],
        eps: f64,
        dy: Value,
        needs: &[bool],
        out: &mut [Option<Value>],
    ) -> R<()> {
        let (x, gamma, mean, var) = (a[0], a[1], a[3], a[4]);
        let r = self.dims(x).len();
        let axes: Vec<i64> = (0..r as i64).filter(|&i| i != 1).collect();
        let e = self.scalar(var, eps)?;
        let ve = self.b.add(var, e)?;
        let rs = self.un(UnaryOp::Rsqrt, ve)?;
        let g = self.b.mul(gamma, rs)?;
        if needs[0] {
            let gb = self.per_channel(g, r)?;
            out[0] = Some(self.b.mul(dy, gb)?);
        }
        let dbeta = self.b.reduce(ReduceOp::Sum, dy, &axes, false)?;
        if needs[2] {
            out[2] = Some(dbeta);
        }
        if needs[1] || needs[4] {
            let mb = self.per_channel(mean, r)?;
            let xc = self.b.sub(x, mb)?;
            let p = self.b.mul(dy, xc)?;
            let s = self.b.reduce(ReduceOp::Sum, p, &axes, false)?;
            if needs[1] {
                out[1] = Some(self.b.mul(s, rs)?);
            }
            if needs[4] {
                // d/dvar of gamma * (x - mean) * (var + eps)^-1/2.
                let rs3 = self.b.mul(rs, rs)?;
                let rs3 = self.b.mul(rs3, rs)?;
                let t = self.b.mul(s, gamma)?;
                let t = self.b.mul(t, rs3)?;
                out[4] = Some(self.mul_c(t, -0.5)?);
            }
        }
        if needs[3] {
            let t = self.b.mul(dbeta, g)?;
            out[3] = Some(self.un(UnaryOp::Neg, t)?);
        }
        Ok(())
    }

    fn batch_norm_train(
        &mut self,
        a: &[Value],
        results: &[Value],
        dys: &[Option<Value>],
        eps: f64,
        needs: &[bool],
        out: &mut [Option<Value>],
    ) -> R<()> {
        let (x, gamma) = (a[0], a[1]);
        let (mean, var) = (results[1], results[2]);
        let d = self.dims(x);
        let r = d.len();
        // Elements per channel (by product, not a division: a tensor may have no channels).
        let m = (d.iter().enumerate())
            .filter(|&(i, _)| i != 1)
            .map(|(_, &n)| n)
            .product::<u64>() as f64;
        let axes: Vec<i64> = (0..r as i64).filter(|&i| i != 1).collect();
        let mb = self.per_channel(mean, r)?;
        let xc = self.b.sub(x, mb)?;
        let mut dx: Option<Value> = None;
        if let Some(dy) = dys[0] {
            let e = self.scalar(var, eps)?;
            let ve = self.b.add(var, e)?;
            let rs = self.un(UnaryOp::Rsqrt, ve)?;
            let rsb = self.per_channel(rs, r)?;
            let xhat = self.b.mul(xc, rsb)?;
            let dbeta = self.b.reduce(ReduceOp::Sum, dy, &axes, false)?;
            let p = self.b.mul(dy, xhat)?;
            let dgamma = self.b.reduce(ReduceOp::Sum, p, &axes, false)?;
            if needs[2] {
                out[2] = Some(dbeta);
            }
            if needs[1] {
                out[1] = Some(dgamma);
            }
            if needs[0] {
                // dx = gamma * rs * (dy - mean(dy) - xhat * mean(dy * xhat)).
                let mdb = self.mul_c(dbeta, 1.0 / m)?;
                let mdb = self.per_channel(mdb, r)?;
                let mdg = self.mul_c(dgamma, 1.0 / m)?;
                let mdg = self.per_channel(mdg, r)?;
                let t = self.b.sub(dy, mdb)?;
                let u = self.b.mul(xhat, mdg)?;
                let t = self.b.sub(t, u)?;
                let gr = self.b.mul(gamma, rs)?;
                let gr = self.per_channel(gr, r)?;
                dx = Some(self.b.mul(t, gr)?);
            }
        }
        if needs[0] {
            // The batch statistics' own cotangents: mean = sum(x)/M, var = sum((x-mean)^2)/M.
            if let Some(dm) = dys[1] {
                let s = self.mul_c(dm, 1.0 / m)?;
                let s = self.per_channel(s, r)?;
                let s = self.broadcast(s, &d)?;
                dx = Some(match dx {
                    Some(v) => self.b.add(v, s)?,
                    None => s,
                });
            }
            if let Some(dv) = dys[2] {
                let s = self.mul_c(dv, 2.0 / m)?;
                let s = self.per_channel(s, r)?;
                let s = self.b.mul(xc, s)?;
                dx = Some(match dx {
                    Some(v) => self.b.add(v, s)?,
                    None => s,
                });
            }
            out[0] = dx;
        }
        Ok(())
    }
}

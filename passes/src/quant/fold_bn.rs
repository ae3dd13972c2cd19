//! `fold-bn`: inference batch norm folded into the convolution or dense layer before it.
//!
//! `batch_norm(y, gamma, beta, mean, var)` is `y * s + t` per channel (axis 1), with
//! `s = gamma / sqrt(var + eps)` and `t = beta - mean * s`. When `y` is `conv2d(x, w)` or
//! `matmul(x, w)` (2-D, channels = columns), possibly plus a per-channel bias `c`, the batch norm
//! is the same layer with weights `w * s` (per output channel) and bias `c * s + t`: one kernel
//! instead of two passes. The unfused form exporters and TensorFlow's unfused batch norm leave,
//! a per-channel `mul` by `s` (then an `add`, which is a bias already), folds the same way.
//!
//! When the weights, bias and statistics are constants, the new weights and bias are computed
//! here in f64 and rounded once. When any is a parameter (a model being trained, statistics
//! given as inputs), the same formulas are built as ops: the per-channel scale is computed in the
//! graph, and the convolution still reads one weight tensor.
//!
//! Folding changes the layer's own output, so it applies only when nothing else reads it: the
//! convolution (and the bias add) must have the batch norm (or scale) as their only reader and
//! not be results of the function; duplicating the layer would cost a second convolution.
//! A batch norm no layer takes (after a concatenation or a shared layer, as in DenseNet's
//! BN-ReLU-conv blocks) becomes `(y - mean) * s + beta` with constant per-channel operands when
//! its statistics are constants, elementwise ops that fuse with the activation after them;
//! otherwise it is left as it is and runs as its own kernel. Ops with control dependencies are
//! left alone too.

use super::Emit;
use crate::manager::{OptionInfo, Options, Pass};
use std::collections::HashMap;
use tcc_ir::edit::Users;
use tcc_ir::interp::{ConstArg, fold};
use tcc_ir::{BinaryOp, Function, Literal, Op, OpKind, Tensor, UnaryOp, Value};

/// The options `fold-bn` accepts.
pub const OPTIONS: &[OptionInfo] = &[
    OptionInfo {
        name: "training",
        help: "true: fold training batch norm (batch_norm_train) with TensorFlow's corrections (default false)",
    },
    OptionInfo {
        name: "freeze-delay",
        help: "training: from this step on, use and freeze the moving statistics (default never)",
    },
    OptionInfo {
        name: "decay",
        help: "training: decay of the moving mean and variance (default 0.999)",
    },
];

/// How to fold training batch norm.
#[derive(Clone, Debug, PartialEq)]
pub struct Training {
    /// The step from which the moving statistics are used and frozen (never when `None`).
    pub freeze_delay: Option<u64>,
    /// Decay of the moving averages.
    pub decay: f64,
}

/// What one run of [`fold_bn`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FoldStats {
    /// Batch norms folded into the layer before them.
    pub batch_norms: usize,
    /// Per-channel scales (the unfused form) folded.
    pub scales: usize,
    /// Per-input-channel scales (a squeeze-and-excitation gate) folded into the convolution
    /// after them.
    pub input_scales: usize,
    /// Batch norms with constant statistics that no layer takes, rewritten as the per-channel
    /// `(y - mean) * s + beta`.
    pub affine: usize,
    /// Batch norms left, each with the reason.
    pub left: Vec<String>,
}

/// The pass object: inference folding, or training folding when `training` is set.
pub struct FoldBn {
    /// Training folding's options.
    pub training: Option<Training>,
}

impl Pass for FoldBn {
    fn name(&self) -> &'static str {
        "fold-bn"
    }

    fn run_on_function(&self, f: &mut Function) -> Result<(), String> {
        match &self.training {
            None => {
                fold_bn(f);
            }
            Some(t) => {
                super::fold_bn_training::fold_bn_training(f, t)?;
            }
        }
        Ok(())
    }
}

/// Builds the pass from its options.
pub fn create(o: &Options) -> Result<Box<dyn Pass>, String> {
    let training = match o.get("training") {
        Some(v) => crate::grad::parse_bool("training", v)?,
        None => false,
    };
    if !training && (o.get("freeze-delay").is_some() || o.get("decay").is_some()) {
        return Err("`freeze-delay` and `decay` apply with `training=true`".into());
    }
    let t = training
        .then(|| -> Result<Training, String> {
            let decay = match o.get("decay") {
                None => 0.999,
                Some(v) => v
                    .parse::<f64>()
                    .ok()
                    .filter(|d| (0.0..1.0).contains(d))
                    .ok_or_else(|| format!("option `decay` must be in [0, 1), found `{v}`"))?,
            };
            let freeze_delay = match o.get("freeze-delay") {
                None => None,
                Some(_) => Some(o.usize_or("freeze-delay", 0)? as u64),
            };
            Ok(Training {
                freeze_delay,
                decay,
            })
        })
        .transpose()?;
    Ok(Box::new(FoldBn { training: t }))
}

/// The layer a batch norm or scale folds into.
pub(crate) struct Layer {
    /// `conv2d` or `matmul`.
    pub op: Op,
    /// The input and the weights.
    pub x: Value,
    pub w: Value,
    /// The bias add between the layer and the batch norm, and the bias.
    pub bias: Option<(Op, Value)>,
    /// The dims of a reshape between them (after the bias) that keeps the batch and channel
    /// axes, as TensorFlow reshapes a dense layer's output to 4-D for its fused batch norm: the
    /// folded layer is reshaped the same way.
    pub reshape: Option<Vec<u64>>,
}

/// What is folded: `y * scale + shift` per channel.
enum Affine {
    /// `batch_norm(y, gamma, beta, mean, var)`.
    Norm {
        gamma: Value,
        beta: Value,
        mean: Value,
        var: Value,
        eps: f64,
    },
    /// `mul(y, s)` with `s` constant along every axis but the channels.
    Scale(Value),
}

/// Folds every foldable batch norm and per-channel scale of `f` (see the module docs).
pub fn fold_bn(f: &mut Function) -> FoldStats {
    let mut stats = FoldStats::default();
    fold_outputs(f, &mut stats);
    stats.input_scales = fold_input_scales(f);
    stats
}

/// Folds the batch norms and scales after a layer.
fn fold_outputs(f: &mut Function, stats: &mut FoldStats) {
    let users = Users::new(f);
    // New ops to schedule before each anchor, and the values that replace old ones.
    let mut before: HashMap<Op, Vec<Op>> = HashMap::new();
    let mut replace: Vec<(Value, Value)> = Vec::new();
    // Each new layer and the name of the one it replaces, given back once that one is gone.
    let mut layer_names: Vec<(Value, String)> = Vec::new();
    let schedule: Vec<Op> = f.schedule().to_vec();
    for &op in &schedule {
        let d = f.op(op);
        let (affine, y) = match &d.kind {
            OpKind::BatchNorm { eps } => (
                Affine::Norm {
                    gamma: d.args[1],
                    beta: d.args[2],
                    mean: d.args[3],
                    var: d.args[4],
                    eps: eps.0,
                },
                d.args[0],
            ),
            // A per-channel scale folds only straight after a layer; others are ordinary muls.
            OpKind::Binary(BinaryOp::Mul) => match per_channel_operands(f, d.args[0], d.args[1]) {
                Some((y, s)) if layer(f, &users, y).is_some() => (Affine::Scale(s), y),
                _ => continue,
            },
            _ => continue,
        };
        let out = d.results[0];
        if !d.deps.is_empty() {
            stats
                .left
                .push(format!("%{}: it has control dependencies", f.name(out)));
            continue;
        }
        let Some(l) = layer(f, &users, y) else {
            if let Affine::Norm { .. } = affine {
                let mut e = Emit { f, ops: Vec::new() };
                match standalone(&mut e, y, &affine) {
                    Some(Ok(v)) => {
                        before.entry(op).or_default().extend(e.ops);
                        replace.push((out, v));
                        stats.affine += 1;
                    }
                    // Nothing was scheduled: the unscheduled ops go with the dead ones.
                    _ => stats.left.push(format!(
                        "%{}: its input is not a convolution or dense layer that only it \
                         reads, and its statistics are not constants",
                        f.name(out)
                    )),
                }
            }
            continue;
        };
        let mut e = Emit { f, ops: Vec::new() };
        let folded = build(&mut e, &l, &affine);
        let new_ops = e.ops;
        match folded {
            Ok(v) => {
                let old = f.op(l.op).results[0];
                let new_layer = new_ops
                    .iter()
                    .map(|&o| f.op(o))
                    .find(|o| o.kind == f.op(l.op).kind);
                if let Some(n) = new_layer {
                    layer_names.push((n.results[0], f.name(old).to_string()));
                }
                before.entry(op).or_default().extend(new_ops);
                replace.push((out, v));
                match affine {
                    Affine::Norm { .. } => stats.batch_norms += 1,
                    Affine::Scale(_) => stats.scales += 1,
                }
            }
            Err(_) => {
                // Nothing was scheduled; the unscheduled ops are dropped with the dead ones.
                stats.left.push(format!(
                    "%{}: its operands' types do not allow folding",
                    f.name(out)
                ));
            }
        }
    }
    if replace.is_empty() {
        return;
    }
    let order: Vec<Op> = schedule
        .iter()
        .flat_map(|op| {
            before
                .remove(op)
                .unwrap_or_default()
                .into_iter()
                .chain([*op])
        })
        .collect();
    f.set_schedule(order);
    for &(old, new) in &replace {
        f.replace_all_uses(old, new);
    }
    let names: Vec<(Value, String)> = (replace.iter())
        .map(|&(old, new)| (new, f.name(old).to_string()))
        .collect();
    crate::dce(f);
    // The new layer takes the old layer's name, then the folded value the batch norm's (which
    // wins when they are one value): both are free now that the old ops are gone.
    for (v, name) in layer_names.into_iter().chain(names) {
        if v != f.lookup(&name).unwrap_or(v) {
            continue;
        }
        f.rename(v, &name);
    }
}

/// Folds per-input-channel scales into the convolution after them: `conv2d(x * s, w)` with
/// `s` of dims `[1, C, 1, 1]` (one factor per input channel, the same for every image: a
/// squeeze-and-excitation gate at batch 1) is `conv2d(x, w * s)` with `s` along the filter's
/// input axis. Only where it saves work: the product is read by that convolution alone (one
/// group) and the filter has at most a quarter as many elements per input channel as the
/// activation has per channel (`4 * O * kh * kw <= N * H * W`): a scaled filter is no longer a
/// constant, so besides the multiply a backend repacks it on every run (measured on
/// EfficientNet-B0 with the CPU backend: folding its 56x56 and 28x28 gates saves their
/// multiplies, folding its 14x14 ones costs more in repacking than it saves). Returns how many
/// were folded.
fn fold_input_scales(f: &mut Function) -> usize {
    let users = Users::new(f);
    let mut folds: Vec<(Op, Value, Value, Value)> = Vec::new();
    for &op in f.schedule() {
        let d = f.op(op);
        let OpKind::Conv2d(attrs) = &d.kind else {
            continue;
        };
        let (m, w) = (d.args[0], d.args[1]);
        let Some(mop) = f.def_op(m) else { continue };
        let md = f.op(mop);
        let [xd, wd] = [f.ty(m).dims(), f.ty(w).dims()];
        let cheaper = 4 * wd[0] * wd[2] * wd[3] <= xd[0] * xd[2] * xd[3];
        if attrs.groups != 1
            || !d.deps.is_empty()
            || !md.deps.is_empty()
            || md.kind != OpKind::Binary(BinaryOp::Mul)
            || users.uses(m).len() != 1
            || users.is_returned(m)
            || !cheaper
        {
            continue;
        }
        let Some((x, s)) = per_channel_operands(f, md.args[0], md.args[1]) else {
            continue;
        };
        if f.ty(x).dims() == xd && f.ty(s).dtype() == f.ty(w).dtype() {
            folds.push((op, x, s, w));
        }
    }
    let mut count = 0;
    for (op, x, s, w) in folds {
        let c = f.ty(s).dims().iter().product::<u64>();
        let mut e = Emit { f, ops: Vec::new() };
        let built = (|| -> Result<Value, String> {
            let s = e.op(
                OpKind::Reshape {
                    shape: vec![1, c, 1, 1],
                },
                &[s],
                "scale",
            )?;
            e.op(OpKind::Binary(BinaryOp::Mul), &[w, s], "scaled_filter")
        })();
        let new_ops = e.ops;
        // Nothing is scheduled on failure; unscheduled ops are dropped with the dead ones.
        let Ok(w2) = built else { continue };
        count += 1;
        for new in new_ops {
            f.insert_before(new, op);
        }
        f.op_mut(op).args = vec![x, w2];
    }
    if count > 0 {
        crate::dce(f);
    }
    count
}

/// `(y, s)` when `a * b` multiplies a value by a per-channel (or scalar) `s`.
pub(crate) fn per_channel_operands(f: &Function, a: Value, b: Value) -> Option<(Value, Value)> {
    let per_channel = |y: Value, s: Value| {
        let (yd, sd) = (f.ty(y).dims(), f.ty(s).dims());
        if yd.len() < 2 || sd.len() > yd.len() || !f.ty(y).dtype().is_float() {
            return false;
        }
        let pad = yd.len() - sd.len();
        sd.iter()
            .enumerate()
            .all(|(i, &d)| d == 1 || (i + pad == 1 && d == yd[1]))
    };
    if per_channel(a, b) && f.def_op(a).is_some() {
        Some((a, b))
    } else if per_channel(b, a) && f.def_op(b).is_some() {
        Some((b, a))
    } else {
        None
    }
}

/// The layer `y` comes from, if a fold may rewrite it: `conv2d` or 2-D `matmul`, optionally
/// plus a per-channel bias, optionally reshaped keeping the batch and channel axes (the first
/// two), each read only by the next step.
pub(crate) fn layer(f: &Function, users: &Users, y: Value) -> Option<Layer> {
    let only_reader = |v: Value| users.uses(v).len() == 1 && !users.is_returned(v);
    if !only_reader(y) {
        return None;
    }
    let d = f.op(f.def_op(y)?);
    if !d.deps.is_empty() {
        return None;
    }
    let (y, reshape) = match d.kind {
        OpKind::Reshape { .. } => {
            if !keeps_channels(f.ty(d.args[0]).dims(), f.ty(y).dims()) || !only_reader(d.args[0]) {
                return None;
            }
            (d.args[0], Some(f.ty(y).dims().to_vec()))
        }
        _ => (y, None),
    };
    let d = f.op(f.def_op(y)?);
    if !d.deps.is_empty() {
        return None;
    }
    let (z, bias) = match d.kind {
        OpKind::Binary(BinaryOp::Add) => {
            let (z, c) = per_channel_operands(f, d.args[0], d.args[1])?;
            if !only_reader(z) {
                return None;
            }
            (z, Some((f.def_op(y)?, c)))
        }
        _ => (y, None),
    };
    let op = f.def_op(z)?;
    let l = f.op(op);
    if !l.deps.is_empty() || !f.ty(z).dtype().is_float() {
        return None;
    }
    match l.kind {
        OpKind::Conv2d(_) => {}
        OpKind::MatMul if f.ty(z).rank() == 2 && f.ty(l.args[1]).rank() == 2 => {}
        _ => return None,
    }
    Some(Layer {
        op,
        x: l.args[0],
        w: l.args[1],
        bias,
        reshape,
    })
}

/// Whether a reshape from `from` to `to` keeps the batch and channel axes (the first two) where
/// they are, so that a per-channel scale or bias applies the same before and after it.
pub(crate) fn keeps_channels(from: &[u64], to: &[u64]) -> bool {
    from.len() >= 2 && to.len() >= 2 && from[..2] == to[..2]
}

/// The reshape of `v` that keeps the batch and channel axes, when it is `v`'s only reader;
/// otherwise `v`.
pub(crate) fn through_reshape(f: &Function, users: &Users, v: Value) -> Value {
    if users.uses(v).len() != 1 || users.is_returned(v) {
        return v;
    }
    let d = f.op(users.uses(v)[0].0);
    match d.kind {
        OpKind::Reshape { .. } if keeps_channels(f.ty(v).dims(), f.ty(d.results[0]).dims()) => {
            d.results[0]
        }
        _ => v,
    }
}

/// `v`'s value if constants alone define it (a constant, or a transpose or reshape of one, as
/// a `Gemm` with `transB` leaves its weights).
fn const_value(f: &Function, v: Value) -> Option<Tensor> {
    let d = f.op(f.def_op(v)?);
    match &d.kind {
        OpKind::Const { ty, value } => Tensor::from_literal(ty, value).ok(),
        OpKind::Transpose { .. } | OpKind::Reshape { .. } => {
            let x = const_value(f, d.args[0])?;
            let lit = Literal::dense(x.data().clone());
            let args = [ConstArg {
                ty: x.ty(),
                value: &lit,
            }];
            let out = [f.ty(v).clone()];
            let mut r = fold(&d.kind, &args, &out, u64::MAX)?.ok()?;
            Tensor::from_literal(&out[0], &r.remove(0)).ok()
        }
        _ => None,
    }
}

/// `v`'s elements as f64 if constants alone define it ([`const_value`]), reading a constant's
/// literal in place.
fn known(f: &Function, v: Value) -> Option<Vec<f64>> {
    match &f.op(f.def_op(v)?).kind {
        OpKind::Const {
            value: Literal::Dense(d),
            ..
        } => Some(d.to_f64s()),
        _ => const_value(f, v).map(|t| t.data().to_f64s()),
    }
}

/// `v` reshaped to `dims` (a one-element `v` as it is: it broadcasts; one of those dims as it
/// is), scheduled later.
fn shaped(e: &mut Emit, v: Value, dims: &[u64], name: &str) -> Result<Value, String> {
    if e.f.ty(v).numel() == 1 || e.f.ty(v).dims() == dims {
        return Ok(v);
    }
    let reshape = OpKind::Reshape {
        shape: dims.to_vec(),
    };
    e.op(reshape, &[v], name)
}

/// A batch norm's per-channel scale `gamma / sqrt(var + eps)`, in f64, for `channels`.
fn scales(gamma: &[f64], var: &[f64], eps: f64, channels: usize) -> Vec<f64> {
    (0..channels)
        .map(|c| gamma[c] / (var[c] + eps).sqrt())
        .collect()
}

/// A batch norm that no layer takes, as `(y - mean) * s + beta` with `s = gamma / sqrt(var +
/// eps)`: per-channel constants (`s` computed in f64 and rounded once) and three elementwise ops
/// the backends fuse with what follows (a relu, as in DenseNet's BN-ReLU-conv order) and that
/// the CPU backend computes on channel-blocked tensors. Subtracting the mean first keeps the
/// result exact where `y` is close to it and `s` is large (a tiny variance), which `y * s + t`
/// would not. `None` when the statistics are not all constants.
fn standalone(e: &mut Emit, y: Value, a: &Affine) -> Option<Result<Value, String>> {
    let Affine::Norm {
        gamma,
        beta,
        mean,
        var,
        eps,
    } = *a
    else {
        return None;
    };
    let f = &*e.f;
    let (g, b, m, v) = (
        known(f, gamma)?,
        known(f, beta)?,
        known(f, mean)?,
        known(f, var)?,
    );
    let (dtype, yd) = (f.ty(y).dtype(), f.ty(y).dims().to_vec());
    let channels = *yd.get(1)? as usize;
    if [&g, &b, &m, &v].iter().any(|x| x.len() != channels) {
        return None;
    }
    let s = scales(&g, &v, eps, channels);
    let mut dims = vec![1u64; yd.len() - 1];
    dims[0] = channels as u64;
    let base = f.name(y).to_string();
    Some((|| {
        let m = e.constant(dtype, &dims, m, &format!("{base}/mean"))?;
        let s = e.constant(dtype, &dims, s, &format!("{base}/scale"))?;
        let b = e.constant(dtype, &dims, b, &format!("{base}/beta"))?;
        let centred = e.bin(BinaryOp::Sub, y, m, &format!("{base}/centred"))?;
        let scaled = e.bin(BinaryOp::Mul, centred, s, &format!("{base}/scaled"))?;
        e.bin(BinaryOp::Add, scaled, b, &format!("{base}/normalized"))
    })())
}

/// Builds the folded layer: its new ops go to `e.ops` (in order); the value replacing the
/// batch norm or scale is returned, or an error if the operands' types do not fit.
fn build(e: &mut Emit, l: &Layer, a: &Affine) -> Result<Value, String> {
    let y = build_layer(e, l, a)?;
    match &l.reshape {
        None => Ok(y),
        Some(dims) => {
            let name = format!("{}/reshape", e.f.name(y));
            e.op(
                OpKind::Reshape {
                    shape: dims.clone(),
                },
                &[y],
                &name,
            )
        }
    }
}

/// [`build`] up to the reshape, in the layer's own layout.
fn build_layer(e: &mut Emit, l: &Layer, a: &Affine) -> Result<Value, String> {
    let f = &*e.f;
    let z = f.op(l.op).results[0];
    let dtype = f.ty(z).dtype();
    let zd = f.ty(z).dims().to_vec();
    let channels = zd[1];
    let kind = f.op(l.op).kind.clone();
    let conv = matches!(kind, OpKind::Conv2d(_));
    let base = f.name(z).to_string();
    // The weights' per-channel axis: a filter's first, a dense layer's columns.
    let wd = f.ty(l.w).dims().to_vec();
    let mut s_dims = vec![1u64; wd.len()];
    s_dims[if conv { 0 } else { 1 }] = channels;
    let mut b_dims = vec![1u64; zd.len() - 1];
    b_dims[0] = channels;

    // The constant case: everything known, computed in f64 and rounded once.
    let bias_c = l.bias.map(|(_, c)| c);
    let stats: Option<(Vec<f64>, Vec<f64>)> = match *a {
        Affine::Norm {
            gamma,
            beta,
            mean,
            var,
            eps,
        } => match (
            known(f, gamma),
            known(f, beta),
            known(f, mean),
            known(f, var),
        ) {
            (Some(g), Some(b), Some(m), Some(v)) => {
                let s = scales(&g, &v, eps, channels as usize);
                let t = (0..channels as usize).map(|c| b[c] - m[c] * s[c]).collect();
                Some((s, t))
            }
            _ => None,
        },
        Affine::Scale(s) => known(f, s).map(|s| {
            let s: Vec<f64> = (0..channels as usize)
                .map(|c| s[if s.len() == 1 { 0 } else { c }])
                .collect();
            (s, vec![0.0; channels as usize])
        }),
    };
    let w_known = known(f, l.w);
    let c_known = match bias_c {
        Some(c) => known(f, c).map(Some),
        None => Some(None),
    };
    if let (Some((s, t)), Some(w), Some(c)) = (&stats, &w_known, &c_known) {
        // w' = w * s per output channel; bias' = c * s + t.
        let per = |i: usize| {
            if conv {
                i / (w.len() / channels as usize)
            } else {
                i % channels as usize
            }
        };
        let w2: Vec<f64> = w.iter().enumerate().map(|(i, &x)| x * s[per(i)]).collect();
        let b2: Vec<f64> = (0..channels as usize)
            .map(|k| {
                let c = c
                    .as_ref()
                    .map_or(0.0, |c| c[if c.len() == 1 { 0 } else { k }]);
                c * s[k] + t[k]
            })
            .collect();
        let w2 = e.constant(dtype, &wd, w2, &format!("{base}/weights"))?;
        let y = e.op(kind, &[l.x, w2], &base)?;
        let needs_bias = b2.iter().any(|&v| v != 0.0) || l.bias.is_some();
        if !needs_bias {
            return Ok(y);
        }
        let b2 = e.constant(dtype, &b_dims, b2, &format!("{base}/bias"))?;
        return e.bin(BinaryOp::Add, y, b2, &format!("{base}/bias"));
    }

    // The symbolic case: the same formulas as ops.
    let scope = format!("{base}/fold-bn");
    let (s, t) = match *a {
        Affine::Norm {
            gamma,
            beta,
            mean,
            var,
            eps,
        } => {
            let eps = e.scalar(dtype, eps, &format!("{scope}/eps"))?;
            let ve = e.bin(BinaryOp::Add, var, eps, &scope)?;
            let r = e.op(OpKind::Unary(UnaryOp::Sqrt), &[ve], &scope)?;
            let s = e.bin(BinaryOp::Div, gamma, r, &scope)?;
            let ms = e.bin(BinaryOp::Mul, mean, s, &scope)?;
            (s, Some(e.bin(BinaryOp::Sub, beta, ms, &scope)?))
        }
        Affine::Scale(s) => (shaped(e, s, &[channels], &scope)?, None),
    };
    // s per output channel of the weights (a scalar scale broadcasts as it is).
    let sw = shaped(e, s, &s_dims, &scope)?;
    let w2 = e.bin(BinaryOp::Mul, l.w, sw, &scope)?;
    let y = e.op(kind, &[l.x, w2], &base)?;
    let shift = match (bias_c, t) {
        (None, None) => return Ok(y),
        (None, Some(t)) => t,
        (Some(c), t) => {
            let c = shaped(e, c, &[channels], &scope)?;
            let cs = e.bin(BinaryOp::Mul, c, s, &scope)?;
            match t {
                Some(t) => e.bin(BinaryOp::Add, cs, t, &scope)?,
                None => cs,
            }
        }
    };
    let shift = shaped(e, shift, &b_dims, &scope)?;
    e.bin(BinaryOp::Add, y, shift, &format!("{base}/bias"))
}

//! `quantize`: fake quantization for quantization-aware training, as TensorFlow's
//! `contrib.quantize` inserts it (run after `fold-bn`, before `grad`).
//!
//! - **Weights**: the weights operand of every `conv2d` and `matmul` becomes
//!   `fake_quant(w, min(w), max(w))` with `bits` and a narrow range (`narrow-weights`), the range
//!   being the weights' own, widened to include zero (TensorFlow's last-value quantization),
//!   per tensor or, with `per-channel=true`, per output channel.
//! - **Activations**: the output of each such layer, after its per-channel bias (and the
//!   correction scale of a folded training batch norm, or a training batch norm not folded) and
//!   its activation (`relu`, or `relu6` as a clamp to [0, 6]) when
//!   they follow, and the output of
//!   each residual `add` of two such outputs, becomes `fake_quant` with `act-bits` over a range
//!   kept as an exponential moving average of the batch's own (widened to include zero):
//!   `new = decay * old + (1 - decay) * batch`. The averages are explicit state: parameters
//!   `quant/<value>/min` and `quant/<value>/max` (TensorFlow starts them at -6 and 6) and
//!   results `new/quant/<value>/min|max`, so a train loop carries them like optimizer state.
//! - **Delay**: with `delay=N`, a step counter (parameter `quant/step`, result
//!   `new/quant/step = step + 1`, an f32) keeps the activations unquantized for the first N steps while
//!   their ranges are collected.
//! - **Scopes**: `scopes=[block1/,fc]` quantizes only layers whose result name is in one of
//!   them (a name or a `/` prefix); a scope that matches no layer is an error listing the
//!   layers' scopes.

use super::Emit;
use super::fold_bn::through_reshape;
use crate::manager::{OptionInfo, Options, Pass};
use tcc_ir::edit::Users;
use tcc_ir::{BinaryOp, DType, Function, Op, OpKind, TensorType, UnaryOp, Value};

/// The options `quantize` accepts.
pub const OPTIONS: &[OptionInfo] = &[
    OptionInfo {
        name: "bits",
        help: "bits of the weights, 2 to 16 (default 8)",
    },
    OptionInfo {
        name: "act-bits",
        help: "bits of the activations, 2 to 16 (default 8)",
    },
    OptionInfo {
        name: "narrow-weights",
        help: "true: weights use levels 1..2^bits-1 (default true)",
    },
    OptionInfo {
        name: "ema-decay",
        help: "decay of the activations' moving min and max (default 0.999)",
    },
    OptionInfo {
        name: "delay",
        help: "steps before activations are quantized (default 0)",
    },
    OptionInfo {
        name: "scopes",
        help: "only layers in these scopes, as in [block1/,fc] (default all)",
    },
    OptionInfo {
        name: "per-channel",
        help: "true: one weight range per output channel (default false)",
    },
];

/// How to quantize.
#[derive(Clone, Debug, PartialEq)]
pub struct Quantize {
    /// Bits of the weights.
    pub bits: u64,
    /// Bits of the activations.
    pub act_bits: u64,
    /// Narrow range for the weights.
    pub narrow_weights: bool,
    /// Decay of the moving averages.
    pub ema_decay: f64,
    /// Steps before activations are quantized.
    pub delay: u64,
    /// Scopes to quantize (all when empty).
    pub scopes: Vec<String>,
    /// One weight range per output channel.
    pub per_channel: bool,
}

impl Default for Quantize {
    fn default() -> Quantize {
        Quantize {
            bits: 8,
            act_bits: 8,
            narrow_weights: true,
            ema_decay: 0.999,
            delay: 0,
            scopes: Vec::new(),
            per_channel: false,
        }
    }
}

/// The initial moving minimum and maximum of an activation, as TensorFlow initialises them.
pub const INITIAL_RANGE: (f64, f64) = (-6.0, 6.0);

/// Builds the pass from its options.
pub fn create(o: &Options) -> Result<Box<dyn Pass>, String> {
    Ok(Box::new(options(o)?))
}

/// Reads [`Quantize`] from pipeline options.
pub fn options(o: &Options) -> Result<Quantize, String> {
    let mut q = Quantize::default();
    let bits = |key: &str, d: u64| -> Result<u64, String> {
        let b = o.usize_or(key, d as usize)? as u64;
        if !(2..=16).contains(&b) {
            return Err(format!("option `{key}` must be 2 to 16, found {b}"));
        }
        Ok(b)
    };
    q.bits = bits("bits", 8)?;
    q.act_bits = bits("act-bits", 8)?;
    if let Some(v) = o.get("narrow-weights") {
        q.narrow_weights = crate::grad::parse_bool("narrow-weights", v)?;
    }
    if let Some(v) = o.get("per-channel") {
        q.per_channel = crate::grad::parse_bool("per-channel", v)?;
    }
    if let Some(v) = o.get("ema-decay") {
        q.ema_decay = v
            .parse::<f64>()
            .ok()
            .filter(|d| (0.0..1.0).contains(d))
            .ok_or_else(|| format!("option `ema-decay` must be in [0, 1), found `{v}`"))?;
    }
    q.delay = o.usize_or("delay", 0)? as u64;
    if let Some(v) = o.get("scopes") {
        q.scopes = crate::grad::list(v);
    }
    Ok(q)
}

impl Pass for Quantize {
    fn name(&self) -> &'static str {
        "quantize"
    }

    fn run_on_function(&self, f: &mut Function) -> Result<(), String> {
        self.run(f).map(|_| ())
    }
}

/// What a run inserted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QuantizeStats {
    /// Weights fake-quantized.
    pub weights: usize,
    /// Activations fake-quantized.
    pub activations: usize,
}

impl Quantize {
    /// Inserts the fake quantization (see the module docs).
    pub fn run(&self, f: &mut Function) -> Result<QuantizeStats, String> {
        let users = Users::new(f);
        let schedule: Vec<Op> = f.schedule().to_vec();
        // A layer whose output only feeds batch statistics (what `fold-bn{training=true}` keeps
        // of the unfolded layer) is not quantized: the statistics are the float layer's.
        let stats_only = |op: Op| {
            let y = through_reshape(f, &users, f.op(op).results[0]);
            !users.is_returned(y)
                && users.uses(y).iter().all(|&(u, _)| {
                    let d = f.op(u);
                    matches!(d.kind, OpKind::BatchNormTrain { .. })
                        && users.uses(d.results[0]).is_empty()
                        && !users.is_returned(d.results[0])
                })
        };
        let layers: Vec<Op> = (schedule.iter().copied())
            .filter(|&op| {
                let d = f.op(op);
                matches!(d.kind, OpKind::Conv2d(_) | OpKind::MatMul)
                    && f.ty(d.args[1]).dtype().is_float()
                    && d.deps.is_empty()
                    && !stats_only(op)
            })
            .collect();
        let in_scope = |name: &str| {
            self.scopes.is_empty()
                || self.scopes.iter().any(|s| {
                    name == s.trim_end_matches('/')
                        || name.starts_with(&format!("{}/", s.trim_end_matches('/')))
                })
        };
        for s in &self.scopes {
            if !layers.iter().any(|&op| {
                let n = f.name(f.op(op).results[0]);
                n == s.trim_end_matches('/')
                    || n.starts_with(&format!("{}/", s.trim_end_matches('/')))
            }) {
                let mut have: Vec<String> = (layers.iter())
                    .map(|&op| {
                        let n = f.name(f.op(op).results[0]);
                        n.rsplit_once('/').map_or(n, |(s, _)| s).to_string() + "/"
                    })
                    .collect();
                have.dedup();
                return Err(format!(
                    "scope `{s}` matches no convolution or dense layer; the layers are in {}",
                    if have.is_empty() {
                        "no scope (there are none)".to_string()
                    } else {
                        have.join(", ")
                    }
                ));
            }
        }
        let chosen: Vec<Op> = (layers.iter().copied())
            .filter(|&op| in_scope(f.name(f.op(op).results[0])))
            .collect();
        let mut stats = QuantizeStats::default();
        // New ops go just before or after an op of the schedule.
        let mut before: std::collections::HashMap<Op, Vec<Op>> = Default::default();
        let mut after: std::collections::HashMap<Op, Vec<Op>> = Default::default();
        let mut weight_uses: Vec<(Op, Value)> = Vec::new();
        // Each quantized activation, its replacement, and its readers before this pass.
        let mut redirect: Vec<Redirect> = Vec::new();
        let mut new_results: Vec<Value> = Vec::new();
        // Whether quantization is on, as a 0/1 float that each activation's select compares.
        let mut step_ops = Vec::new();
        let mut active = None;
        if self.delay > 0 && !chosen.is_empty() {
            let (step, ops, next) = super::step_counter(f)?;
            let mut e = Emit { f, ops };
            let delay = e.scalar(DType::F32, self.delay as f64, "quant/delay")?;
            let on = e.op(
                OpKind::Compare(tcc_ir::CmpOp::Ge),
                &[step, delay],
                "quant/on",
            )?;
            active = Some(e.op(OpKind::Cast { to: DType::F32 }, &[on], "quant/active")?);
            new_results.extend(next);
            step_ops = e.ops;
        }
        let mut quantized_outputs: Vec<Value> = Vec::new();
        for &op in &chosen {
            let d = f.op(op).clone();
            let name = f.name(d.results[0]).to_string();
            // Weights: fake_quant(w, min(w), max(w)), per tensor or per output channel.
            let w = d.args[1];
            let wd = f.ty(w).dims().to_vec();
            let axes: Vec<i64> = if self.per_channel {
                let keep = if matches!(d.kind, OpKind::Conv2d(_)) {
                    0
                } else {
                    wd.len() - 1
                };
                (0..wd.len() as i64)
                    .filter(|&a| a as usize != keep)
                    .collect()
            } else {
                (0..wd.len() as i64).collect()
            };
            let scope = format!("{name}/weights_quant");
            let mut e = Emit { f, ops: Vec::new() };
            let wq = if axes.is_empty() {
                w
            } else {
                let (lo, hi) = e.range(w, &axes, &scope)?;
                e.op(
                    OpKind::FakeQuant {
                        bits: self.bits,
                        narrow: self.narrow_weights,
                    },
                    &[w, lo, hi],
                    &scope,
                )?
            };
            let ops = e.ops;
            // The weights' quantization runs just before the layer.
            before.entry(op).or_default().extend(ops);
            weight_uses.push((op, wq));
            stats.weights += 1;
            // Activations: after the bias and the activation that follow.
            let end = layer_end(f, &users, d.results[0]);
            quantized_outputs.push(end);
        }
        // Residual adds of two quantized outputs are quantized too.
        for &op in &schedule {
            let d = f.op(op);
            if let OpKind::Binary(BinaryOp::Add) = d.kind
                && d.args.iter().all(|a| quantized_outputs.contains(a))
                && f.ty(d.args[0]) == f.ty(d.args[1])
            {
                quantized_outputs.push(d.results[0]);
            }
        }
        let mut seen = std::collections::HashSet::new();
        quantized_outputs.retain(|v| seen.insert(*v));
        for &y in &quantized_outputs {
            let yname = f.name(y).to_string();
            let ty = f.ty(y).clone();
            if !ty.dtype().is_float() || ty.rank() == 0 {
                continue;
            }
            let dt = ty.dtype();
            let scalar_ty = TensorType::scalar(dt);
            let min_p = f.add_param(&format!("quant/{yname}/min"), scalar_ty.clone());
            let max_p = f.add_param(&format!("quant/{yname}/max"), scalar_ty);
            let scope = format!("{yname}/act_quant");
            let mut e = Emit { f, ops: Vec::new() };
            let axes: Vec<i64> = (0..ty.rank() as i64).collect();
            let (bmin, bmax) = e.range(y, &axes, &scope)?;
            let bmin = e.op(OpKind::Reshape { shape: vec![] }, &[bmin], &scope)?;
            let bmax = e.op(OpKind::Reshape { shape: vec![] }, &[bmax], &scope)?;
            let decay = e.scalar(dt, self.ema_decay, &scope)?;
            let keep = e.scalar(dt, 1.0 - self.ema_decay, &scope)?;
            let ema = |e: &mut Emit, old: Value, batch: Value, n: &str| -> Result<Value, String> {
                let a = e.bin(BinaryOp::Mul, old, decay, &scope)?;
                let b = e.bin(BinaryOp::Mul, batch, keep, &scope)?;
                e.bin(BinaryOp::Add, a, b, n)
            };
            let new_min = ema(&mut e, min_p, bmin, &format!("new/quant/{yname}/min"))?;
            let new_max = ema(&mut e, max_p, bmax, &format!("new/quant/{yname}/max"))?;
            let q = e.op(
                OpKind::FakeQuant {
                    bits: self.act_bits,
                    narrow: false,
                },
                &[y, new_min, new_max],
                &scope,
            )?;
            let out = match active {
                Some(a) => {
                    let a = if dt == DType::F32 {
                        a
                    } else {
                        e.op(OpKind::Cast { to: dt }, &[a], &scope)?
                    };
                    // Broadcast, so the comparison fuses into the select's kernel.
                    let a = e.op(
                        OpKind::BroadcastTo {
                            shape: ty.dims().to_vec(),
                        },
                        &[a],
                        &scope,
                    )?;
                    let half = e.scalar(dt, 0.5, &scope)?;
                    let on = e.op(OpKind::Compare(tcc_ir::CmpOp::Gt), &[a, half], &scope)?;
                    e.op(OpKind::Select, &[on, q, y], &format!("{yname}/quantized"))?
                }
                None => q,
            };
            let ops = e.ops;
            let def = f
                .def_op(y)
                .ok_or("internal error: a layer output without an op")?;
            after.entry(def).or_default().extend(ops);
            redirect.push(Redirect {
                from: y,
                to: out,
                uses: users.uses(y).to_vec(),
            });
            new_results.extend([new_min, new_max]);
            stats.activations += 1;
        }
        // Redirect: each layer reads its quantized weights; the readers of each quantized
        // activation (as they were before this pass) read the quantized value.
        for (op, wq) in weight_uses {
            f.op_mut(op).args[1] = wq;
        }
        for r in &redirect {
            for &(op, i) in &r.uses {
                let a = &mut f.op_mut(op).args[i as usize];
                if *a == r.from {
                    *a = r.to;
                }
            }
            let mut results = f.results().to_vec();
            results
                .iter_mut()
                .filter(|v| **v == r.from)
                .for_each(|v| *v = r.to);
            f.set_results(results);
        }
        let mut order: Vec<Op> = step_ops;
        for &op in &schedule {
            if let Some(pre) = before.remove(&op) {
                order.extend(pre);
            }
            order.push(op);
            if let Some(post) = after.remove(&op) {
                order.extend(post);
            }
        }
        f.set_schedule(order);
        let mut results = f.results().to_vec();
        results.extend(new_results);
        f.set_results(results);
        Ok(stats)
    }
}

/// A quantized activation: its readers (as they were before the pass) read `to` instead.
struct Redirect {
    from: Value,
    to: Value,
    uses: Vec<(Op, u32)>,
}

/// The end of a layer's output chain: its per-channel scale (a folded batch norm's
/// correction) and bias add, or an unfolded training batch norm, then its `relu` (or a clamp
/// to [0, 6]) when they follow and are the only readers.
fn layer_end(f: &Function, users: &Users, y: Value) -> Value {
    let mut v = y;
    let single = |v: Value| users.uses(v).len() == 1 && !users.is_returned(v);
    // A per-channel scale (`fold-bn`'s correction), then a bias add: the other operand varies
    // along the channels only. A reshape keeping the channels (a dense layer's output made 4-D
    // for its batch norm) may come before either.
    for op_kind in [BinaryOp::Mul, BinaryOp::Add] {
        v = through_reshape(f, users, v);
        if single(v) {
            let (op, _) = users.uses(v)[0];
            let d = f.op(op);
            if d.kind == OpKind::Binary(op_kind)
                && super::fold_bn::per_channel_operands(f, d.args[0], d.args[1])
                    .is_some_and(|(x, _)| x == v)
            {
                v = d.results[0];
            }
        }
    }
    // An unfolded training batch norm: its normalized output.
    v = through_reshape(f, users, v);
    if single(v) {
        let (op, i) = users.uses(v)[0];
        let d = f.op(op);
        if matches!(d.kind, OpKind::BatchNormTrain { .. }) && i == 0 {
            v = d.results[0];
        }
    }
    // The activation: relu, or relu6 as max(x, 0) then min(_, 6).
    if single(v) {
        let (op, _) = users.uses(v)[0];
        let d = f.op(op);
        match d.kind {
            OpKind::Unary(UnaryOp::Relu) => v = d.results[0],
            OpKind::Binary(BinaryOp::Max) if single(d.results[0]) => {
                let (op2, _) = users.uses(d.results[0])[0];
                if matches!(f.op(op2).kind, OpKind::Binary(BinaryOp::Min)) {
                    v = f.op(op2).results[0];
                } else {
                    v = d.results[0];
                }
            }
            _ => {}
        }
    }
    v
}

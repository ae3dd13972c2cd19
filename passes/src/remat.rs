//! `remat`: gradient checkpointing on a joint forward + backward function.
//!
//! The function is what `grad` produces: the forward ops first, then the backward ops, whose
//! results are named `grad/...`. A set of forward values is kept (the checkpoints; parameters
//! and constants are always available); every other forward value that a backward op reads is
//! recomputed from the nearest checkpoints, just before the first backward op that needs it,
//! and backward ops read the copy. The originals then die at their last forward use, so the
//! activations held across the forward/backward boundary are the checkpoints only.
//!
//! Strategies (what the old `memory_saving_gradients` called them):
//! - `collection`: values the IR marks as checkpoints (a name component `checkpoint`, as in
//!   `%block1/checkpoint` or `%checkpoint/h1`; docs/ir.md);
//! - `names=[frag,...]`: values whose names contain one of the fragments;
//! - `speed`: the outputs of `matmul` and `conv2d` (what is expensive to recompute).
//!
//! Recomputed ops are copies of the originals (same kinds, same operands up to copies), so
//! results and gradients are bit-identical. The first copies of each recomputation carry a
//! control dependency on the backward op before them: it pins their place and keeps `cse` from
//! merging them back into the originals. O(ops + operands) plus the copies.
//!
//! Not done here yet: the `memory` (bottleneck) and `budget` strategies of issue 5.

use crate::manager::{OptionInfo, Options, Pass};
use cranelift_entity::SecondaryMap;
use std::collections::HashMap;
use tcc_ir::edit::{Placement, copy_ops};
use tcc_ir::{Function, Op, OpKind, Value, ValueDef};

/// How checkpoints are chosen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// Values with a name component `checkpoint`.
    Collection,
    /// Values whose names contain one of these fragments.
    Names(Vec<String>),
    /// Outputs of matmul and conv2d.
    Speed,
}

/// What `remat` did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RematStats {
    /// Forward values kept.
    pub checkpoints: usize,
    /// Forward ops copied for recomputation.
    pub recomputed_ops: usize,
}

/// Whether a name marks a checkpoint for the `collection` strategy.
pub fn marked(name: &str) -> bool {
    name.split('/').any(|c| c == "checkpoint")
}

/// The schedule position where the backward ops start: the first op with a result named
/// `grad/...`.
fn boundary(f: &Function) -> Option<usize> {
    f.schedule().iter().position(|&op| {
        f.op(op)
            .results
            .iter()
            .any(|&r| f.name(r).starts_with("grad/"))
    })
}

/// The checkpoints a strategy picks among the forward values.
pub fn choose(f: &Function, strategy: &Strategy) -> Result<Vec<Value>, String> {
    let b = boundary(f).ok_or_else(|| {
        "the function has no backward ops (values named grad/...); run `grad` first, as in --passes='grad,remat{strategy=speed}'".to_string()
    })?;
    let forward = &f.schedule()[..b];
    let values = forward
        .iter()
        .flat_map(|&op| f.op(op).results.iter().copied());
    let picked: Vec<Value> = match strategy {
        Strategy::Collection => values.filter(|&v| marked(f.name(v))).collect(),
        Strategy::Names(frags) => values
            .filter(|&v| frags.iter().any(|fr| f.name(v).contains(fr.as_str())))
            .collect(),
        Strategy::Speed => forward
            .iter()
            .filter(|&&op| matches!(f.op(op).kind, OpKind::MatMul | OpKind::Conv2d(_)))
            .map(|&op| f.op(op).results[0])
            .collect(),
    };
    Ok(picked)
}

/// Rewrites `f` so that the backward ops read only `checkpoints`, parameters, constants and
/// backward values from the forward pass; everything else is recomputed (see the module docs).
pub fn remat(f: &mut Function, checkpoints: &[Value]) -> Result<RematStats, String> {
    let b = boundary(f).ok_or("the function has no backward ops; run `grad` first")?;
    let sched = f.schedule().to_vec();
    let nv = f.num_values_created();
    // Forward values that must be recomputed when the backward pass reads them.
    let mut recompute: SecondaryMap<Value, bool> = SecondaryMap::with_capacity(nv);
    for &op in &sched[..b] {
        if matches!(f.op(op).kind, OpKind::Const { .. }) {
            continue;
        }
        for &r in &f.op(op).results {
            recompute[r] = true;
        }
    }
    for &c in checkpoints {
        recompute[c] = false;
    }
    let mut copies: HashMap<Value, Value> = HashMap::new();
    let mut insert: HashMap<Op, Vec<Op>> = HashMap::new();
    let mut stats = RematStats {
        checkpoints: checkpoints.len(),
        ..RematStats::default()
    };
    for i in b..sched.len() {
        let op = sched[i];
        let needed: Vec<Value> = f
            .op(op)
            .args
            .iter()
            .copied()
            .filter(|&a| recompute[a] && !copies.contains_key(&a))
            .collect();
        if !needed.is_empty() {
            // The forward ops between the checkpoints (or earlier copies) and what is needed.
            let mut todo = needed;
            let mut chosen: Vec<Op> = Vec::new();
            let mut seen: SecondaryMap<Op, bool> = SecondaryMap::new();
            while let Some(v) = todo.pop() {
                let ValueDef::Result(p, _) = f.value(v).def else {
                    continue;
                };
                if seen[p] {
                    continue;
                }
                seen[p] = true;
                chosen.push(p);
                for &a in &f.op(p).args {
                    if recompute[a] && !copies.contains_key(&a) {
                        todo.push(a);
                    }
                }
            }
            let map = copy_ops(f, &chosen, &copies, Placement::Unscheduled);
            // Pin the copies that read no other copy after the previous op, so that neither a
            // scheduler nor `cse` moves them back into the forward pass.
            let prev = sched[i - 1];
            let copied: Vec<Op> = {
                let pos = f.positions();
                let mut v: Vec<Op> = chosen.clone();
                v.sort_by_key(|&o| pos[o]);
                v.iter().map(|o| map.ops[o]).collect()
            };
            let fresh: std::collections::HashSet<Value> = map.values.values().copied().collect();
            for &c in &copied {
                let reads_copy = f.op(c).args.iter().any(|a| fresh.contains(a));
                if !reads_copy {
                    f.op_mut(c).deps.push(prev);
                }
            }
            stats.recomputed_ops += copied.len();
            copies.extend(map.values);
            insert.insert(op, copied);
        }
        let d = f.op_mut(op);
        for a in &mut d.args {
            if let Some(&c) = copies.get(a) {
                *a = c;
            }
        }
    }
    let mut order = Vec::with_capacity(sched.len() + stats.recomputed_ops);
    for &op in &sched {
        if let Some(c) = insert.remove(&op) {
            order.extend(c);
        }
        order.push(op);
    }
    f.set_schedule(order);
    Ok(stats)
}

fn options(o: &Options) -> Result<Strategy, String> {
    match (o.get("strategy"), o.get("names")) {
        (Some(_), Some(_)) => Err("give either strategy= or names=, not both".into()),
        (None, Some(v)) => {
            let frags = crate::grad::list(v);
            if frags.is_empty() {
                return Err("names=[...] needs at least one fragment".into());
            }
            Ok(Strategy::Names(frags))
        }
        (Some("collection"), None) => Ok(Strategy::Collection),
        (Some("speed"), None) => Ok(Strategy::Speed),
        (Some(s @ ("memory" | "budget")), None) => Err(format!(
            "strategy `{s}` is not implemented yet; use collection, speed or names=[...]"
        )),
        (Some(s), None) => Err(format!(
            "unknown strategy `{s}`; valid strategies are collection, speed (or names=[...])"
        )),
        (None, None) => {
            Err("say how to choose checkpoints: strategy=collection|speed or names=[...]".into())
        }
    }
}

/// The options `remat` accepts.
pub(crate) const OPTIONS: &[OptionInfo] = &[
    OptionInfo {
        name: "strategy",
        help: "collection (values named .../checkpoint/...) or speed (matmul and conv outputs)",
    },
    OptionInfo {
        name: "names",
        help: "[frag,...]: keep values whose names contain a fragment",
    },
];

struct Remat(Strategy);

impl Pass for Remat {
    fn name(&self) -> &'static str {
        "remat"
    }
    fn run_on_function(&self, f: &mut Function) -> Result<(), String> {
        let c = choose(f, &self.0)?;
        remat(f, &c).map(|_| ())
    }
}

pub(crate) fn create(o: &Options) -> Result<Box<dyn Pass>, String> {
    Ok(Box::new(Remat(options(o)?)))
}

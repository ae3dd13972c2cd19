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
//! - `speed`: the outputs of `matmul` and `conv2d` (what is expensive to recompute);
//! - `memory`: bottlenecks (values every forward path passes through, found in one sweep) of
//!   at least `min-bytes`, about sqrt(N) of them evenly spaced (N forward ops); an error when
//!   there are none (U-Net-like graphs), suggesting `names`.
//!
//! Recomputed ops are copies of the originals (same kinds, same operands up to copies), so
//! results and gradients are bit-identical. The first copies of each recomputation carry a
//! control dependency on the backward op before them: it pins their place and keeps `cse` from
//! merging them back into the originals. O(ops + operands) plus the copies.
//!
//! Not done here yet: the `budget` strategy of issue 5.

use crate::manager::{OptionInfo, Options, Pass};
use cranelift_entity::SecondaryMap;
use std::collections::HashMap;

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
    /// About sqrt(N) bottlenecks (values every forward path passes through) of at least
    /// `min_bytes`, evenly spaced in the schedule.
    Memory {
        /// Smaller values are not considered.
        min_bytes: u64,
    },
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
        Strategy::Memory { min_bytes } => {
            let big: Vec<Value> = bottlenecks(f, b)
                .into_iter()
                .filter(|&v| f.ty(v).size_bytes() >= *min_bytes)
                .collect();
            if big.is_empty() {
                return Err(format!(
                    "no bottleneck tensor of at least {min_bytes} bytes between the inputs and the loss (in U-Net-like graphs, skip paths go around every value); pass names=[...] to choose checkpoints{}",
                    if *min_bytes > 0 {
                        ", or a smaller min-bytes"
                    } else {
                        ""
                    }
                ));
            }
            let keep = (b as f64).sqrt().ceil() as usize;
            if big.len() <= keep {
                big
            } else {
                // `keep` of them, evenly spaced through the list (which is in schedule order).
                (0..keep)
                    .map(|i| big[(2 * i + 1) * big.len() / (2 * keep)])
                    .collect()
            }
        }
    };
    Ok(picked)
}

/// The forward values (among the first `b` scheduled ops) that every forward path from earlier
/// values to later ones passes through: no other value defined before one is read by a forward
/// op after it. Parameters and constants do not count as paths (weights enter every layer). One
/// sweep over the schedule.
pub fn bottlenecks(f: &Function, b: usize) -> Vec<Value> {
    let sched = &f.schedule()[..b];
    let mut last: SecondaryMap<Value, usize> = SecondaryMap::with_capacity(f.num_values_created());
    for (i, &op) in sched.iter().enumerate() {
        for &a in &f.op(op).args {
            last[a] = i;
        }
    }
    let mut found = Vec::new();
    // The last forward use of any activation defined so far.
    let mut reach = 0usize;
    for (i, &op) in sched.iter().enumerate() {
        let d = f.op(op);
        if matches!(d.kind, OpKind::Const { .. }) {
            continue;
        }
        // Nothing defined earlier is read after this op, and it has one result read later.
        if reach <= i && d.results.len() == 1 && last[d.results[0]] > i {
            found.push(d.results[0]);
        }
        for &r in &d.results {
            reach = reach.max(last[r]);
        }
    }
    found
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
    let pos = f.positions();
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
            // Copies made for this backward op (a copy reading one of them is not pinned).
            let mut batch: std::collections::HashSet<Value> = std::collections::HashSet::new(); // The forward ops between the checkpoints (or earlier copies) and what is needed.
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
            // Copy them in schedule order. A copy reads earlier copies where there are any; the
            // copies that read no copy of this batch are pinned after the previous op, so that
            // neither a scheduler nor `cse` moves them back into the forward pass.
            chosen.sort_by_key(|&o| pos[o]);
            let prev = sched[i - 1];
            let mut copied = Vec::with_capacity(chosen.len());
            for &o in &chosen {
                let d = f.op(o).clone();
                let mut reads_copy = false;
                let args: Vec<Value> = d
                    .args
                    .iter()
                    .map(|a| match copies.get(a) {
                        Some(&c) => {
                            reads_copy |= batch.contains(&c);
                            c
                        }
                        None => *a,
                    })
                    .collect();
                let tys = d.results.iter().map(|&r| f.ty(r).clone()).collect();
                let names: Vec<String> = d.results.iter().map(|&r| f.name(r).to_string()).collect();
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                let c = f.create_op(d.kind, args, tys, &names);
                if !reads_copy {
                    f.op_mut(c).deps.push(prev);
                }
                for (&r, &cr) in d.results.iter().zip(&f.op(c).results.clone()) {
                    copies.insert(r, cr);
                    batch.insert(cr);
                }
                copied.push(c);
            }
            stats.recomputed_ops += copied.len();
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
        (Some("memory"), None) => Ok(Strategy::Memory {
            min_bytes: o.usize_or("min-bytes", 0)? as u64,
        }),
        (Some(s @ "budget"), None) => Err(format!(
            "strategy `{s}` is not implemented yet; use collection, memory, speed or names=[...]"
        )),
        (Some(s), None) => Err(format!(
            "unknown strategy `{s}`; valid strategies are collection, memory, speed (or names=[...])"
        )),
        (None, None) => Err(
            "say how to choose checkpoints: strategy=collection|memory|speed or names=[...]".into(),
        ),
    }
}

/// The options `remat` accepts.
pub(crate) const OPTIONS: &[OptionInfo] = &[
    OptionInfo {
        name: "strategy",
        help: "collection (values named .../checkpoint/...), memory (about sqrt(N) bottlenecks) or speed (matmul and conv outputs)",
    },
    OptionInfo {
        name: "names",
        help: "[frag,...]: keep values whose names contain a fragment",
    },
    OptionInfo {
        name: "min-bytes",
        help: "with strategy=memory: ignore bottlenecks smaller than this (default 0)",
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

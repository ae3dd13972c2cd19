//! `remat`: gradient checkpointing on a joint forward + backward function.
//!
//! The function is what `grad` produces: the forward ops first, then the backward part, which
//! starts where the function records it ([`tcc_ir::Function::backward_start`]). A set of forward values is kept (the checkpoints; parameters
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
//!   at least `min-bytes` with values the backward pass reads on both sides, about sqrt(N) of
//!   them evenly spaced (N the number of forward values the backward pass reads: about the
//!   layers of a chain); an error when there are none (U-Net-like graphs), suggesting `names`
//!   or `budget`;
//! - `budget=BYTES|FRACTION`: the least recomputation (FLOPs, `analysis::cost`) the search
//!   finds whose simulated peak of activations and temporaries is within the budget.
//!
//! The budget search never rewrites the function to evaluate a candidate: `Joint` holds the
//! function as flat arrays, `plan` lists the copies a set of kept values implies (the same walk
//! the rewrite does), and `simulate` replays the new schedule to get its peak and extra FLOPs,
//! O(ops + operands + copies) each. The candidates:
//! - the `memory`, `speed` and (where values are marked) `collection` strategies' choices, so
//!   the budget mode is never worse than they are at the peak they reach;
//! - a two-parameter family over the forward values backward ops read, in schedule order: a
//!   value is kept if recomputing it costs more than λ FLOPs per byte it frees (ops back to
//!   other such values, at most 64), or if dropping it would make the run of dropped bytes since
//!   the last value kept for that reason exceed `t` (less what the run before fell short of `t`,
//!   so that runs mix two lengths and the fraction dropped varies smoothly with `t`); otherwise
//!   it is dropped. For each of eight quantiles of λ, `t` doubles from the smallest value until
//!   the peak fits and is bisected back (recomputation grows with `t`): about 30 simulations per
//!   λ at most;
//! - where at most 256 values are read by the backward pass, the optimum of checkpointing's
//!   classic model (runs of dropped values between kept ones, each recomputed while everything
//!   kept up to its end is held) by dynamic programming, for model limits bisected against the
//!   simulated peak (`budget::Segments`);
//! - where at most 64 values are read by the backward pass (and 64² simulations stay cheap), a
//!   greedy descent: from keeping all of them, drop one at a time the value that leaves the
//!   lowest peak; then a local search from the best plan (toggle one value, or move a
//!   checkpoint to a neighbour);
//! - on functions of at most 320 forward ops, the branch and bound of [`exact`] from the best
//!   plan so far, with a node limit: the optimum among remat's plans when it finishes.
//!
//! The cheapest candidate that fits wins; when none does, the error gives the lowest peak seen
//! (and says when the branch and bound has shown that no plan fits).
//!
//! Recomputed ops are copies of the originals (same kinds, same operands up to copies), so
//! results and gradients are bit-identical. The first copies of each recomputation carry a
//! control dependency on the backward op before them: it pins their place and keeps `cse` from
//! merging them back into the originals. O(ops + operands) plus the copies.

use crate::analysis::cost::flops;
use crate::manager::{OptionInfo, Options, Pass, PipelineError};
use cranelift_entity::{EntityRef, SecondaryMap};
use std::collections::{HashMap, HashSet};
use tcc_ir::edit::{Placement, copy_ops};

pub(crate) mod budget;
mod exact;

pub use budget::{Budget, Fit, fit};
pub use exact::{Goal, Space};

use tcc_ir::{Function, Op, OpKind, Value};

/// How checkpoints are chosen.
#[derive(Clone, Debug, PartialEq)]
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
    /// The least recomputation [`fit`] finds with the peak within the budget.
    Budget(Budget),
}

/// What `remat` did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RematStats {
    /// Forward values kept.
    pub checkpoints: usize,
    /// Forward ops copied for recomputation.
    pub recomputed_ops: usize,
    /// Their FLOPs (the cost model of `analysis::cost`).
    pub extra_flops: u64,
}

/// Whether a name marks a checkpoint for the `collection` strategy.
pub fn marked(name: &str) -> bool {
    name.split('/').any(|c| c == "checkpoint")
}

/// Remat plans a function without swaps: a recomputed `swap_in` or a moved `swap_out` would
/// undo the swap's placement.
fn no_swaps(f: &Function) -> Result<(), String> {
    match f.schedule().iter().find(|&&op| f.op(op).kind.is_swap()) {
        Some(&op) => Err(format!(
            "`remat` runs before swapping, and this function swaps already ({}): run `remat` \
             first",
            f.describe_op(op)
        )),
        None => Ok(()),
    }
}

fn no_backward() -> String {
    "the function has no backward part (a `backward:` line, which `grad` writes); run `grad` first, as in --passes='grad,remat{strategy=speed}'".to_string()
}

/// The checkpoints a strategy picks among the forward values.
pub fn choose(f: &Function, strategy: &Strategy) -> Result<Vec<Value>, String> {
    let b = f.backward_position().ok_or_else(no_backward)?;
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
            // A bottleneck helps only with values the backward pass reads on both sides of it
            // (U-Net-like graphs have bottlenecks only at their two ends).
            let read = read_by_backward(f, b);
            let pos = f.positions();
            let at = |v: Value| f.def_op(v).and_then(|op| pos[op]).unwrap_or(0) as usize;
            let (lo, hi) = match (read.first(), read.last()) {
                (Some(&x), Some(&y)) => (at(x), at(y)),
                _ => (0, 0),
            };
            let big: Vec<Value> = bottlenecks(f, b)
                .into_iter()
                .filter(|&v| f.ty(v).size_bytes() >= *min_bytes && lo < at(v) && at(v) < hi)
                .collect();
            // The most values the backward pass reads between two bottlenecks (or an end and
            // one): when that is most of them, the bottlenecks split off only the ends.
            let (mut largest, mut run, mut next) = (0, 0, 0);
            for &v in &read {
                while next < big.len() && at(big[next]) < at(v) {
                    (largest, run, next) = (largest.max(run), 0, next + 1);
                }
                run += 1;
            }
            largest = largest.max(run);
            if big.is_empty() || 2 * largest > read.len() {
                return Err(format!(
                    "no bottleneck tensor of at least {min_bytes} bytes splits the values the backward pass reads ({largest} of the {} are in one part; in U-Net-like graphs skip paths go around every value but those near the ends); pass names=[...] to choose checkpoints, or budget=BYTES|FRACTION to let remat search{}",
                    read.len(),
                    if *min_bytes > 0 {
                        ", or a smaller min-bytes"
                    } else {
                        ""
                    }
                ));
            }
            let keep = (read.len() as f64).sqrt().ceil() as usize;
            if big.len() <= keep {
                big
            } else {
                // `keep` of them, evenly spaced through the list (which is in schedule order).
                (0..keep)
                    .map(|i| big[(2 * i + 1) * big.len() / (2 * keep)])
                    .collect()
            }
        }
        Strategy::Budget(budget) => return fit(f, *budget).map(|fit| fit.checkpoints),
    };
    Ok(picked)
}

/// The forward values (results of the first `b` scheduled ops other than constants) that
/// backward ops read, in schedule order.
fn read_by_backward(f: &Function, b: usize) -> Vec<Value> {
    let sched = f.schedule();
    let mut forward: SecondaryMap<Value, bool> =
        SecondaryMap::with_capacity(f.num_values_created());
    for &op in &sched[..b] {
        if !matches!(f.op(op).kind, OpKind::Const { .. }) {
            for &r in &f.op(op).results {
                forward[r] = true;
            }
        }
    }
    let mut read = Vec::new();
    for &op in &sched[b..] {
        for &a in &f.op(op).args {
            if forward[a] {
                forward[a] = false;
                read.push(a);
            }
        }
    }
    let pos = f.positions();
    read.sort_by_key(|&v| f.def_op(v).and_then(|op| pos[op]));
    read
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

const NONE: u32 = u32::MAX;

/// The joint function as flat arrays, to plan a rematerialization and simulate its peak without
/// rewriting the function. Positions index the schedule; values are `Value::index()`.
struct Joint {
    /// Where the backward ops start.
    b: usize,
    args_at: Vec<u32>,
    args: Vec<u32>,
    res_at: Vec<u32>,
    res: Vec<u32>,
    kind: Vec<Kind>,
    flops: Vec<u64>,
    /// Per value: the position of its defining op (`NONE` for parameters), which of that op's
    /// results it is, its bytes, whether it may be recomputed (a result of a forward op other
    /// than a constant), and whether the function returns it.
    def: Vec<u32>,
    slot: Vec<u32>,
    bytes: Vec<u64>,
    forward: Vec<bool>,
    returned: Vec<u32>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Const,
    Reshape,
    Other,
}

/// Which forward ops (positions, in schedule order) are copied just before which backward op.
#[derive(Default)]
struct Plan {
    batches: Vec<(u32, std::ops::Range<usize>)>,
    ops: Vec<u32>,
}

impl Joint {
    fn new(f: &Function, b: usize) -> Joint {
        let sched = f.schedule();
        let nv = f.num_values_created();
        let mut j = Joint {
            b,
            args_at: Vec::with_capacity(sched.len() + 1),
            args: Vec::new(),
            res_at: Vec::with_capacity(sched.len() + 1),
            res: Vec::new(),
            kind: Vec::with_capacity(sched.len()),
            flops: Vec::with_capacity(sched.len()),
            def: vec![NONE; nv],
            slot: vec![0; nv],
            bytes: vec![0; nv],
            forward: vec![false; nv],
            returned: f.results().iter().map(|r| r.index() as u32).collect(),
        };
        for (i, &op) in sched.iter().enumerate() {
            let d = f.op(op);
            j.args_at.push(j.args.len() as u32);
            j.res_at.push(j.res.len() as u32);
            j.args.extend(d.args.iter().map(|a| a.index() as u32));
            let kind = match d.kind {
                OpKind::Const { .. } => Kind::Const,
                OpKind::Reshape { .. } => Kind::Reshape,
                _ => Kind::Other,
            };
            j.kind.push(kind);
            j.flops.push(flops(f, op));
            for (s, &r) in d.results.iter().enumerate() {
                let v = r.index();
                j.res.push(v as u32);
                j.def[v] = i as u32;
                j.slot[v] = s as u32;
                j.bytes[v] = f.ty(r).size_bytes();
                j.forward[v] = i < b && kind != Kind::Const;
            }
        }
        j.args_at.push(j.args.len() as u32);
        j.res_at.push(j.res.len() as u32);
        j
    }

    fn len(&self) -> usize {
        self.kind.len()
    }

    fn args(&self, p: usize) -> &[u32] {
        &self.args[self.args_at[p] as usize..self.args_at[p + 1] as usize]
    }

    fn results(&self, p: usize) -> &[u32] {
        &self.res[self.res_at[p] as usize..self.res_at[p + 1] as usize]
    }

    /// The forward ops to copy when only the values `keep` marks (and parameters, constants and
    /// backward values) may be read by backward ops: each backward op, in order, gets copies of
    /// the forward ops between what it needs and the kept values or earlier copies.
    fn plan(&self, keep: &[bool]) -> Plan {
        let mut copied = vec![false; self.b];
        let mut stamp = vec![NONE; self.b];
        let mut plan = Plan::default();
        let mut stack = Vec::new();
        for i in self.b..self.len() {
            let start = plan.ops.len();
            let mut visit = |a: u32, stack: &mut Vec<u32>, copied: &[bool]| {
                let a = a as usize;
                if self.forward[a] && !keep[a] {
                    let p = self.def[a];
                    if !copied[p as usize] && stamp[p as usize] != i as u32 {
                        stamp[p as usize] = i as u32;
                        stack.push(p);
                    }
                }
            };
            for &a in self.args(i) {
                visit(a, &mut stack, &copied);
            }
            while let Some(p) = stack.pop() {
                plan.ops.push(p);
                for &a in self.args(p as usize) {
                    visit(a, &mut stack, &copied);
                }
            }
            if plan.ops.len() > start {
                plan.ops[start..].sort_unstable();
                for &p in &plan.ops[start..] {
                    copied[p as usize] = true;
                }
                plan.batches.push((i as u32, start..plan.ops.len()));
            }
        }
        plan
    }

    /// The peak bytes of activations and temporaries (as `analysis::memory` counts them:
    /// `temps_peak`) of the function `plan` would produce, and the FLOPs of its copies.
    fn simulate(&self, plan: &Plan) -> (u64, u64) {
        let nv = self.bytes.len();
        let copies: usize = plan
            .ops
            .iter()
            .map(|&p| self.results(p as usize).len())
            .sum();
        let total = nv + copies;
        let m = self.len() + plan.ops.len();
        let mut owner = vec![NONE; total];
        let mut first = vec![0u32; total];
        let mut last = vec![0u32; total];
        let mut bytes = self.bytes.clone();
        bytes.resize(total, 0);
        // The first value id of each copied forward op's results.
        let mut copy = vec![NONE; self.b];
        let mut next = nv as u32;
        let mut pos = 0u32;
        let map = |a: u32, copy: &[u32]| -> u32 {
            let d = self.def[a as usize];
            if d != NONE && (d as usize) < self.b && copy[d as usize] != NONE {
                copy[d as usize] + self.slot[a as usize]
            } else {
                a
            }
        };
        // One op at the next position, defining the values `ids`.
        let mut step = |p: usize, ids: &[u32], copy: &[u32], owner: &mut [u32]| {
            for &a in self.args(p) {
                let o = owner[map(a, copy) as usize];
                if o != NONE {
                    last[o as usize] = pos;
                }
            }
            match self.kind[p] {
                Kind::Const => {}
                Kind::Reshape => {
                    owner[ids[0] as usize] = owner[map(self.args(p)[0], copy) as usize];
                }
                Kind::Other => {
                    for &r in ids {
                        owner[r as usize] = r;
                        first[r as usize] = pos;
                        last[r as usize] = pos;
                    }
                }
            }
            pos += 1;
        };
        for p in 0..self.b {
            step(p, self.results(p), &copy, &mut owner);
        }
        let mut ids = Vec::new();
        let mut batches = plan.batches.iter().peekable();
        let mut extra = 0;
        for i in self.b..self.len() {
            if let Some((_, range)) = batches.next_if(|(at, _)| *at as usize == i) {
                for &p in &plan.ops[range.clone()] {
                    let p = p as usize;
                    ids.clear();
                    for &r in self.results(p) {
                        bytes[next as usize + ids.len()] = self.bytes[r as usize];
                        ids.push(next + ids.len() as u32);
                    }
                    step(p, &ids, &copy, &mut owner);
                    copy[p] = next;
                    next += self.results(p).len() as u32;
                    extra += self.flops[p];
                }
            }
            step(i, self.results(i), &copy, &mut owner);
        }
        // Buffers the function returns are not temporaries.
        for &r in &self.returned {
            let o = owner[r as usize];
            if o != NONE {
                last[o as usize] = m as u32;
            }
        }
        let mut delta = vec![0i64; m + 2];
        for v in 0..total {
            if owner[v] != v as u32 || last[v] as usize == m {
                continue;
            }
            delta[first[v] as usize] += bytes[v] as i64;
            delta[last[v] as usize + 1] -= bytes[v] as i64;
        }
        let (mut cur, mut peak) = (0i64, 0i64);
        for d in &delta[..m] {
            cur += d;
            peak = peak.max(cur);
        }
        (peak as u64, extra)
    }
}

/// Rewrites `f` as `plan` says (see the module docs): copies in schedule order reading earlier
/// copies where there are any, the copies that read no copy of their own batch pinned after the
/// op before them, and backward ops reading the copies.
fn apply(f: &mut Function, b: usize, plan: &Plan) -> RematStats {
    let sched = f.schedule().to_vec();
    let nv = f.num_values_created();
    // The latest copy of each forward value.
    let mut copies: SecondaryMap<Value, Option<Value>> = SecondaryMap::with_capacity(nv);
    let mut insert: HashMap<usize, Vec<Op>> = HashMap::new();
    let mut batches = plan.batches.iter().peekable();
    let mut stats = RematStats::default();
    for (i, &op) in sched.iter().enumerate().skip(b) {
        if let Some((_, range)) = batches.next_if(|(at, _)| *at as usize == i) {
            let prev = sched[i - 1];
            let originals: Vec<Op> = plan.ops[range.clone()]
                .iter()
                .map(|&p| sched[p as usize])
                .collect();
            // In schedule order; an operand reads this batch's copy, else the latest earlier one.
            let batch = copy_ops(f, &originals, &copies, Placement::Unscheduled);
            let made: HashSet<Op> = batch.ops.values().copied().collect();
            let mut copied = Vec::with_capacity(originals.len());
            for o in &originals {
                let c = batch.ops[o];
                // A copy that reads no other copy of its batch is pinned after the op before the
                // batch, which keeps `cse` from merging it back into its original.
                let reads_copy = f
                    .op(c)
                    .args
                    .iter()
                    .any(|&a| f.def_op(a).is_some_and(|p| made.contains(&p)));
                f.op_mut(c).deps = if reads_copy { Vec::new() } else { vec![prev] };
                stats.extra_flops += flops(f, c);
                copied.push(c);
            }
            for (&r, &cr) in &batch.values {
                copies[r] = Some(cr);
            }
            stats.recomputed_ops += copied.len();
            insert.insert(i, copied);
        }
        let d = f.op_mut(op);
        for a in &mut d.args {
            if let Some(c) = copies[*a] {
                *a = c;
            }
        }
    }
    let mut order = Vec::with_capacity(sched.len() + stats.recomputed_ops);
    for (i, &op) in sched.iter().enumerate() {
        if let Some(c) = insert.remove(&i) {
            order.extend(c);
        }
        order.push(op);
    }
    // Copies go at or after position `b`, so the backward part (recomputation included) now
    // starts with whatever is there.
    f.set_backward_start(order.get(b).copied());
    f.set_schedule(order);
    stats
}

/// Rewrites `f` so that the backward ops read only `checkpoints`, parameters, constants and
/// backward values from the forward pass; everything else is recomputed (see the module docs).
pub fn remat(f: &mut Function, checkpoints: &[Value]) -> Result<RematStats, String> {
    no_swaps(f)?;
    let b = f.backward_position().ok_or_else(no_backward)?;
    let j = Joint::new(f, b);
    let mut keep = vec![false; f.num_values_created()];
    for &c in checkpoints {
        keep[c.index()] = true;
    }
    let plan = j.plan(&keep);
    let mut stats = apply(f, b, &plan);
    stats.checkpoints = checkpoints.len();
    Ok(stats)
}

/// What [`exact`] found.
#[derive(Clone, Debug)]
pub struct Exact {
    /// The values to keep; `None` when no plan meets the goal's limit.
    pub checkpoints: Option<Vec<Value>>,
    /// Peak bytes of activations and temporaries without remat.
    pub peak_before: u64,
    /// The plan's peak and recomputed FLOPs (zero without a plan).
    pub peak: u64,
    /// See `peak`.
    pub extra_flops: u64,
    /// The search finished, so the plan is optimal among remat's plans (or, without one, none
    /// exists); false when it stopped at the node limit.
    pub proven: bool,
    /// Nodes the search visited.
    pub nodes: u64,
}

/// The optimum among remat's plans (a set of forward values of `space` kept, the rest
/// recomputed once before their first backward reader) for `goal`, by branch and bound:
/// exponential in the worst case, meant for functions of up to a few hundred ops (an error past
/// 4096 forward ops), and stopped after `max_nodes` nodes. `hint` (checkpoints, say [`fit`]'s)
/// is tried first.
pub fn exact(
    f: &Function,
    goal: Goal,
    space: Space,
    hint: Option<&[Value]>,
    max_nodes: u64,
) -> Result<Exact, String> {
    no_swaps(f)?;
    let b = f.backward_position().ok_or_else(no_backward)?;
    // The search recurses once per forward op.
    const MAX_FORWARD_OPS: usize = 4096;
    if b > MAX_FORWARD_OPS {
        return Err(format!(
            "the exact search is for functions of at most {MAX_FORWARD_OPS} forward ops, and this one has {b}"
        ));
    }
    let j = Joint::new(f, b);
    let nv = f.num_values_created();
    let (peak_before, _) = j.simulate(&j.plan(&vec![true; nv]));
    let hint = hint.map(|c| {
        let mut keep = vec![false; nv];
        for v in c {
            keep[v.index()] = true;
        }
        keep
    });
    let found = exact::search(&j, goal, space, hint.as_deref(), max_nodes);
    Ok(Exact {
        checkpoints: found.keep.map(|keep| {
            (0..nv)
                .filter(|&v| keep[v] && j.forward[v])
                .map(Value::new)
                .collect()
        }),
        peak_before,
        peak: found.peak,
        extra_flops: found.extra,
        proven: found.proven,
        nodes: found.nodes,
    })
}

/// A lower bound on the peak of activations and temporaries (`temps_peak`) that any plan can
/// reach which keeps, recomputes or swaps the values the backward pass reads: every value on
/// the device at least while the ops that must read it run (forward values from their
/// definition through their forward readers, backward values through their readers, saved
/// values at each backward reader). A budget below it is out of reach of `remat`, `offload`
/// and `swap` alike, except `swap`'s branch swapping, which also takes a value off the device
/// between two forward readers.
pub fn floor(f: &Function) -> Result<u64, String> {
    let b = f.backward_position().ok_or_else(no_backward)?;
    Ok(exact::floor(&Joint::new(f, b)))
}

fn options(o: &Options) -> Result<Strategy, String> {
    if o.get("min-bytes").is_some() && o.get("strategy") != Some("memory") {
        return Err("min-bytes applies to strategy=memory only".into());
    }
    match (o.get("strategy"), o.get("names"), o.get("budget")) {
        (None, None, Some(b)) => Ok(Strategy::Budget(Budget::parse(b)?)),
        (_, _, Some(_)) | (Some(_), Some(_), _) => {
            Err("give one of strategy=, names= or budget=".into())
        }
        (None, Some(v), None) => {let frags = crate::grad::list(v);
            if frags.is_empty() {
                return Err("names=[...] needs at least one fragment".into());
            }
            Ok(Strategy::Names(frags))
        }
                (Some("collection"), None, None) => Ok(Strategy::Collection),
        (Some("speed"), None, None) => Ok(Strategy::Speed),
        (Some("memory"), None, None) => Ok(Strategy::Memory {
            min_bytes: o.usize_or("min-bytes", 0)? as u64,
        }),
        (Some("budget"), None, None) => Err(
            "a budget is given as budget=BYTES or budget=FRACTION (remat{budget=0.5}), not as a strategy".into(),
        ),
        (Some(s), None, None) => Err(format!(
            "unknown strategy `{s}`; valid strategies are collection, memory, speed (or names=[...] or budget=...)"
        )),
        (None, None, None) => Err(
            "say how to choose checkpoints: strategy=collection|memory|speed, names=[...] or budget=BYTES|FRACTION".into(),
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
        name: "budget",
        help: "bytes (64MiB) or a fraction of the peak without remat (0.5, 50%): the least recomputation that fits",
    },
    OptionInfo {
        name: "min-bytes",
        help: "with strategy=memory: ignore bottlenecks smaller than this (default 0)",
    },
];

/// The `remat` pass with its way of choosing checkpoints: the typed form of `remat{...}` in a
/// pipeline, for code that builds passes directly (`Remat::budget(0.5).run(&mut f)`).
#[derive(Clone, Debug, PartialEq)]
pub struct Remat(pub Strategy);

impl Remat {
    /// The least recomputation within a budget: a fraction of the peak without remat (`0.5`)
    /// or a number of bytes (`64u64 << 20`).
    pub fn budget(budget: impl Into<Budget>) -> Remat {
        Remat(Strategy::Budget(budget.into()))
    }

    /// Options written as in a pipeline (`budget=0.5`, `strategy=memory`), checked as a
    /// pipeline checks them.
    pub fn parse(options: &str) -> Result<Remat, PipelineError> {
        let o = Options::parse_for("remat", options)?;
        Ok(Remat(self::options(&o).map_err(|message| {
            PipelineError {
                text: options.to_string(),
                pos: 0,
                message,
            }
        })?))
    }

    /// Chooses the checkpoints and rewrites `f`.
    pub fn run(&self, f: &mut Function) -> Result<RematStats, String> {
        no_swaps(f)?;
        let c = choose(f, &self.0)?;
        remat(f, &c)
    }
}

impl Pass for Remat {
    fn name(&self) -> &'static str {
        "remat"
    }
    fn run_on_function(&self, f: &mut Function) -> Result<(), String> {
        self.run(f).map(|_| ())
    }
}

pub(crate) fn create(o: &Options) -> Result<Box<dyn Pass>, String> {
    Ok(Box::new(RematPass {
        remat: Remat(options(o)?),
        notes: std::sync::Mutex::new(Vec::new()),
    }))
}

/// `remat` in a pipeline: [`Remat`], noting for each function what it kept and recomputed
/// and, with a budget, the peaks and which candidate of the search won.
struct RematPass {
    remat: Remat,
    notes: std::sync::Mutex<Vec<String>>,
}

impl Pass for RematPass {
    fn name(&self) -> &'static str {
        "remat"
    }

    fn run_on_function(&self, f: &mut Function) -> Result<(), String> {
        no_swaps(f)?;
        let b = f.backward_position().ok_or_else(no_backward)?;
        let forward: u64 = f.schedule()[..b].iter().map(|&op| flops(f, op)).sum();
        let (checkpoints, how) = match &self.remat.0 {
            Strategy::Budget(budget) => {
                let fit = fit(f, *budget)?;
                let how = format!(
                    "peak {} -> {}, chosen by {}",
                    crate::analysis::memory::human(fit.peak_before),
                    crate::analysis::memory::human(fit.peak_after),
                    fit.chosen_by
                );
                (fit.checkpoints, how)
            }
            s => {
                let how = match s {
                    Strategy::Collection => "strategy=collection".to_string(),
                    Strategy::Names(frags) => format!("names=[{}]", frags.join(",")),
                    Strategy::Speed => "strategy=speed".to_string(),
                    Strategy::Memory { min_bytes: 0 } => "strategy=memory".to_string(),
                    Strategy::Memory { min_bytes } => {
                        format!("strategy=memory, min-bytes={min_bytes}")
                    }
                    Strategy::Budget(_) => unreachable!("handled above"),
                };
                (choose(f, s)?, how)
            }
        };
        let stats = remat(f, &checkpoints)?;
        let note = format!(
            "@{}: {} values kept, {} ops recomputed ({:.3} forward passes); {how}",
            f.name,
            stats.checkpoints,
            stats.recomputed_ops,
            stats.extra_flops as f64 / forward.max(1) as f64,
        );
        self.notes.lock().expect("not poisoned").push(note);
        Ok(())
    }

    fn notes(&self) -> Vec<String> {
        std::mem::take(&mut *self.notes.lock().expect("not poisoned"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::memory::analyze;
    use crate::manager::{PassManager, Pipeline};
    use tcc_ir::random::{Rng, random_function};
    use tcc_ir::{Module, parse_function, verify_function};

    /// `f` with the gradients of all its results (seeds as parameters), cleaned up; `None`
    /// where `grad` refuses (second derivatives of a few ops).
    fn joint(mut f: Function) -> Option<Function> {
        let opts = crate::GradOptions {
            ys: f.results().iter().map(|&r| f.name(r).to_string()).collect(),
            grad_ys: true,
            ..Default::default()
        };
        crate::grad(&mut f, &opts).ok()?;
        let mut m = Module::new();
        m.functions.push(f);
        let pipeline = Pipeline::parse("canonicalize,cse,dce").unwrap();
        PassManager::new(pipeline)
            .run(&mut m, &mut std::io::sink())
            .unwrap();
        Some(m.functions.remove(0))
    }

    /// The simulated peak and extra FLOPs of random checkpoint sets equal what the memory
    /// analysis and the rewrite report on the rewritten function: chains with reshapes and
    /// multi-result batch norm, and random functions of the property tests.
    #[test]
    fn simulation_matches_the_rewrite() {
        let chain = parse_function(
            "func @f(%x: f32[4,3,2,2], %g: f32[3], %b: f32[3], %w: f32[12,5]) -> (f32[]) {
  %y, %m, %v = batch_norm_train %x, %g, %b : f32[4,3,2,2], f32[3], f32[3]
  %r = relu %y : f32[4,3,2,2]
  %t = tanh %r : f32[4,3,2,2]
  %s = reshape %t {shape=[4,12]} : f32[4,12]
  %h = matmul %s, %w : f32[4,5]
  %e = exp %h : f32[4,5]
  %u = mul %e, %h : f32[4,5]
  %l = reduce_sum %u {axes=[0,1]} : f32[]
  return %l
}",
        )
        .unwrap();
        let mut functions = vec![joint(chain).unwrap()];
        functions.extend((0..100).filter_map(|seed| {
            let f = random_function(seed, 12);
            let floats = f.params().iter().any(|&p| f.ty(p).dtype().is_float())
                && f.results().iter().all(|&r| f.ty(r).dtype().is_float());
            // `remat` refuses functions that swap (the generator's swap pairs).
            let swaps = f.schedule().iter().any(|&op| f.op(op).kind.is_swap());
            (floats && !swaps).then(|| joint(f)).flatten()
        }));
        assert!(functions.len() > 25, "{} functions", functions.len());
        let mut rng = Rng::new(11);
        let (mut checked, mut with_copies) = (0, 0);
        for f in &functions {
            let Some(b) = f.backward_position() else {
                continue;
            };
            let j = Joint::new(f, b);
            for trial in 0..12 {
                let p = trial as f64 / 11.0;
                let keep: Vec<bool> = (0..f.num_values_created()).map(|_| rng.chance(p)).collect();
                let (peak, extra) = j.simulate(&j.plan(&keep));
                let kept: Vec<Value> = (0..keep.len())
                    .filter(|&v| keep[v])
                    .map(Value::new)
                    .collect();
                let mut g = f.clone();
                let stats = remat(&mut g, &kept).unwrap();
                verify_function(&g).unwrap_or_else(|e| panic!("{e}\n{g}"));
                assert_eq!(peak, analyze(&g).temps_peak.0, "{g}");
                assert_eq!(extra, stats.extra_flops);
                checked += 1;
                with_copies += usize::from(stats.recomputed_ops > 0);
            }
        }
        // The test's power: about a quarter of the trials recompute something (287 of 1200 with
        // the generator of 2026-11-23); below a fifth, the check above would be too weak.
        assert!(with_copies > checked / 5, "{with_copies} of {checked}");
    }

    /// The branch and bound finds what trying every set of kept values finds (all forward
    /// values, and the values backward ops read), on small chains and residual blocks and the
    /// random functions of the property tests with at most 16 forward values, for the lowest
    /// peak and for budgets from it to the peak without remat. Its bound is checked against
    /// the simulated peak at every leaf (a debug assertion).
    #[test]
    fn exact_matches_enumeration() {
        // Chains and residual blocks, where recomputation pays, then random functions.
        let chain = |n: usize| {
            let mut s = String::from("func @chain(%x: f32[8]");
            for i in 0..n {
                s += &format!(", %w{i}: f32[8]");
            }
            s += ") -> (f32[]) {\n";
            let mut prev = "%x".to_string();
            for i in 0..n {
                s += &format!(
                    "  %m{i} = mul {prev}, %w{i} : f32[8]\n  %t{i} = tanh %m{i} : f32[8]\n"
                );
                prev = format!("%t{i}");
            }
            s + &format!("  %l = reduce_sum {prev} {{axes=[0]}} : f32[]\n  return %l\n}}")
        };
        let residual = |n: usize| {
            let mut s = String::from("func @res(%x: f32[4,8]");
            for i in 0..n {
                s += &format!(", %w{i}: f32[8,8]");
            }
            s += ") -> (f32[]) {\n";
            let mut prev = "%x".to_string();
            for i in 0..n {
                s += &format!(
                    "  %m{i} = matmul {prev}, %w{i} : f32[4,8]\n  %r{i} = relu %m{i} : f32[4,8]\n  %o{i} = add {prev}, %r{i} : f32[4,8]\n"
                );
                prev = format!("%o{i}");
            }
            s + &format!("  %l = reduce_sum {prev} {{axes=[0,1]}} : f32[]\n  return %l\n}}")
        };
        let structured =
            [chain(4), chain(7), residual(3), residual(4)].map(|src| parse_function(&src).unwrap());
        let random = (0..300).map(|seed| random_function(seed, 16));
        let mut checked = 0;
        let mut recomputing = 0;
        for f in structured.into_iter().chain(random) {
            let floats = f.params().iter().any(|&p| f.ty(p).dtype().is_float())
                && f.results().iter().all(|&r| f.ty(r).dtype().is_float());
            let swaps = f.schedule().iter().any(|&op| f.op(op).kind.is_swap());
            let Some(f) = (floats && !swaps).then(|| joint(f)).flatten() else {
                continue;
            };
            let Some(b) = f.backward_position() else {
                continue;
            };
            let j = Joint::new(&f, b);
            let vars: Vec<usize> = (0..f.num_values_created())
                .filter(|&v| j.forward[v])
                .collect();
            if vars.is_empty() || vars.len() > 16 {
                continue;
            }
            // Every plan: (peak, extra).
            let plans: Vec<(u64, u64)> = (0u32..1 << vars.len())
                .map(|mask| {
                    let mut keep = vec![false; f.num_values_created()];
                    for (i, &v) in vars.iter().enumerate() {
                        keep[v] = mask >> i & 1 == 1;
                    }
                    j.simulate(&j.plan(&keep))
                })
                .collect();
            let lowest = plans.iter().map(|p| p.0).min().unwrap();
            assert!(floor(&f).unwrap() <= lowest, "{f}");
            let e = exact(&f, Goal::LowestPeak, Space::Forward, None, u64::MAX).unwrap();
            assert!(e.proven);
            assert_eq!(e.peak, lowest, "{f}");
            let base = plans.last().unwrap().0;
            for limit in (0..5).map(|q| lowest + q * (base - lowest) / 4) {
                let best = plans
                    .iter()
                    .filter(|p| p.0 <= limit)
                    .map(|&(p, x)| (x, p))
                    .min()
                    .unwrap();
                let e = exact(&f, Goal::Cheapest(limit), Space::Forward, None, u64::MAX).unwrap();
                assert!(e.proven && e.checkpoints.is_some());
                assert_eq!((e.extra_flops, e.peak), best, "limit {limit}\n{f}");
                // The plan is what it says.
                let mut g = f.clone();
                let stats = remat(&mut g, e.checkpoints.as_ref().unwrap()).unwrap();
                assert_eq!(analyze(&g).temps_peak.0, e.peak);
                assert_eq!(stats.extra_flops, e.extra_flops);
                recomputing += usize::from(best.0 > 0);
                checked += 1;
            }
            if lowest > 0 {
                let e = exact(
                    &f,
                    Goal::Cheapest(lowest - 1),
                    Space::Forward,
                    None,
                    u64::MAX,
                )
                .unwrap();
                assert!(e.proven && e.checkpoints.is_none());
            }
            // The same over the values backward ops read (the others dropped).
            let read = read_by_backward(&f, b);
            let plans: Vec<(u64, u64)> = (0u32..1 << read.len())
                .map(|mask| {
                    let mut keep = vec![false; f.num_values_created()];
                    for (i, &v) in read.iter().enumerate() {
                        keep[v.index()] = mask >> i & 1 == 1;
                    }
                    j.simulate(&j.plan(&keep))
                })
                .collect();
            let lowest_read = plans.iter().map(|p| p.0).min().unwrap();
            let e = exact(&f, Goal::LowestPeak, Space::Read, None, u64::MAX).unwrap();
            assert_eq!(e.peak, lowest_read, "{f}");
            for limit in (0..5).map(|q| lowest_read + q * (base - lowest_read) / 4) {
                let best = plans
                    .iter()
                    .filter(|p| p.0 <= limit)
                    .map(|&(p, x)| (x, p))
                    .min()
                    .unwrap();
                let e = exact(&f, Goal::Cheapest(limit), Space::Read, None, u64::MAX).unwrap();
                assert_eq!((e.extra_flops, e.peak), best, "limit {limit}\n{f}");
            }
        }
        // The test's power: the optimum recomputes something in 152 of 1115 cases (2026-11-26).
        assert!(
            checked > 800 && recomputing > 100,
            "{recomputing} of {checked}"
        );
    }

    /// On larger random functions (too many values to enumerate), the exact search's bound
    /// stays under the simulated peak at every leaf (its debug assertion) and neither it nor
    /// the budget search fails, in both spaces, for the lowest peak and at budgets.
    #[test]
    fn exact_search_bounds_hold_on_larger_functions() {
        let mut searched = 0;
        for seed in 1000..1150 {
            for size in [24, 40] {
                let f = random_function(seed, size);
                let floats = f.params().iter().any(|&p| f.ty(p).dtype().is_float())
                    && f.results().iter().all(|&r| f.ty(r).dtype().is_float());
                let swaps = f.schedule().iter().any(|&op| f.op(op).kind.is_swap());
                let Some(f) = (floats && !swaps).then(|| joint(f)).flatten() else {
                    continue;
                };
                if f.backward_position().is_none() {
                    continue;
                }
                for space in [Space::Read, Space::Forward] {
                    let e = exact(&f, Goal::LowestPeak, space, None, 5_000).unwrap();
                    assert!(e.checkpoints.is_some());
                    let _ = fit(&f, Budget::Bytes(e.peak.max(1)));
                    searched += 1;
                }
            }
        }
        assert!(searched > 200, "{searched}");
    }

    #[test]
    fn budgets_parse() {
        assert_eq!(Budget::parse("4096"), Ok(Budget::Bytes(4096)));
        assert_eq!(Budget::parse("64KiB"), Ok(Budget::Bytes(65536)));
        assert_eq!(Budget::parse("2MiB"), Ok(Budget::Bytes(2 << 20)));
        assert_eq!(Budget::parse("0.25"), Ok(Budget::Fraction(0.25)));
        assert_eq!(Budget::parse("50%"), Ok(Budget::Fraction(0.5)));
        for bad in ["0", "1.5", "0%", "64MB", "-3", "lots", "99999999999GiB"] {
            assert!(Budget::parse(bad).is_err(), "{bad}");
        }
    }
}

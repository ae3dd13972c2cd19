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
use cranelift_entity::{EntityRef, SecondaryMap};
use std::collections::{HashMap, HashSet};
use tcc_ir::edit::{Placement, copy_ops};
use tcc_ir::{Function, Op, Value};

pub(crate) mod budget;
mod choose;
mod exact;
mod joint;
mod pass;

pub use budget::{Budget, Fit, fit};
pub use choose::{bottlenecks, choose, marked};
pub use exact::{Exact, Goal, Space, exact, floor};
pub use pass::Remat;
pub(crate) use pass::{OPTIONS, create};

use choose::read_by_backward;
use joint::{Joint, Plan};

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

#[cfg(test)]
mod tests;

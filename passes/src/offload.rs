//! `offload`: for each activation a training step saves for its backward part, keep it,
//! recompute it or swap it to host memory (fetched back ahead of its reader, or just in time),
//! so that the device peak meets a budget for the least predicted step time (issue 17's joint
//! planner).
//!
//! The candidates are `swap`'s: op results of the forward part that a backward op reads (not
//! constants, views or returned values). A plan gives each one a decision and is judged by
//! building it: `remat` with every candidate not recomputed as a checkpoint, then `swap` of the
//! swapped ones (with this pass's `lb`, `ub` and `order`), then the device peak of activations
//! and temporaries (`analysis::memory`, results aside, as `remat{budget}` measures) and the
//! predicted step (`analysis::timeline`: compute, recomputation included, on one stream, copies
//! over the `link` on another, stalls where a reader waits for its swap-in).
//!
//! The search starts from keeping everything, in up to three phases, each only if the one
//! before left the peak over budget:
//!
//! 1. Every change (a kept value swapped, or recomputed) *estimated* without building it: a
//!    swap's stalls from the compute time between each of its triggers and its reader against
//!    the copy's time, a recomputation's time its producer's. Each value's best change, ranked
//!    by the bytes it takes off the device per second it adds (hidden swaps first, the larger
//!    first); the shortest prefix of the ranking that meets the budget, by bisection (more of
//!    the prefix never holds more device memory): O(log n) builds. If the whole ranking misses
//!    the budget, the same with every swap fetched just in time ("swap late": a swap fetched
//!    ahead holds device memory while the ops before its reader run), then each late swap
//!    fetched ahead again where the budget allows.
//! 2. Each change built alone and ranked by its built times, then taken in that order, keeping
//!    one that adds no time if it does not raise the peak and another only if it lowers it.
//! 3. One change at a time (a kept value changed, or a swap fetched ahead made late), each
//!    time building every change and making the one that saves the most peak bytes per second
//!    added (quadratic).
//!
//! It stops at the budget, or when no change lowers the peak: then it tries `remat{budget}`'s
//! plan with swaps in place of recomputations where they keep the budget and save time
//! (changes that help only together, as two recomputations in a row), and fails, saying the
//! lowest peak it reached, if that misses too. A plan that costs over 0.5% of the step is
//! compared with that remat-seeded plan, and on functions with at most 16 candidates (and 1,000 ops) polished
//! by steepest descent (one decision changed, or moved to a kept activation). Deterministic.
//!
//! [`Offload::exhaustive`] is the exact optimum of the same space for small functions, to
//! measure the search against.
//!
//! The pass notes each function's outcome: peaks and predicted steps before and after, and
//! every candidate's decision (`tcc opt`, `tcc mem --passes` print them).

use crate::analysis::cost::Machine;
use crate::analysis::memory::{analyze, human};
use crate::analysis::timeline::{compute_time, timeline};
use crate::manager::{Notes, OptionInfo, Options, Pass};
use crate::remat::{Budget, remat};
use crate::swap::{Order, Swap};
use tcc_ir::edit::Users;
use tcc_ir::{Function, OpKind, Value};

/// The largest function (ops) the build-based phases of the search run on.
const EXHAUSTIVE_OPS: usize = 20_000;

/// The most candidates on which the fast search tries fetching each late swap ahead instead.
const LATE_REVERTS: usize = 256;

/// The options `offload` accepts.
pub const OPTIONS: &[OptionInfo] = &[
    OptionInfo {
        name: "budget",
        help: "bytes (64MiB) or a fraction of the peak without offloading (0.5, 50%): the device peak to meet",
    },
    OptionInfo {
        name: "link",
        help: "the bandwidth of the link to host memory, as 16GB/s (default 16GB/s)",
    },
    OptionInfo {
        name: "lb",
        help: "as swap's: levels between a swap-in's trigger and its reader, at least (default 2)",
    },
    OptionInfo {
        name: "ub",
        help: "and at most (default 10000)",
    },
    OptionInfo {
        name: "order",
        help: "as swap's: chain (default) or direct",
    },
    OptionInfo {
        name: "only",
        help: "swap or recompute: offload by that means alone (swap: early and late; default both)",
    },
];

/// What becomes of a saved activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Stays in device memory until the backward part reads it.
    Keep,
    /// Copied to host memory and back, the copy back started ahead of the reader (`lb`,
    /// `ub`, `order`) so that it can be hidden.
    Swap,
    /// Copied to host memory and back just in time: each backward reader waits for its own
    /// copy, started by the op before it, and the value takes no device memory ahead of it.
    SwapLate,
    /// Recomputed from the kept and swapped values before the backward part reads it.
    Recompute,
}

impl Decision {
    /// Whether the value goes to host memory (early or late).
    pub fn swaps(self) -> bool {
        matches!(self, Decision::Swap | Decision::SwapLate)
    }
}

impl std::fmt::Display for Decision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(match self {
            Decision::Keep => "keep",
            Decision::Swap => "swap",
            Decision::SwapLate => "swap late",
            Decision::Recompute => "recompute",
        })
    }
}

/// The `offload` pass and its options.
#[derive(Clone, Debug, PartialEq)]
pub struct Offload {
    /// The device peak to meet.
    pub budget: Budget,
    /// Bytes per second of the link to host memory.
    pub link: f64,
    /// The swaps' placement.
    pub lb: u32,
    /// See `lb`.
    pub ub: u32,
    /// See `lb`.
    pub order: Order,
    /// The time model's machine.
    pub machine: Machine,
    /// The changes the search may make (both by default; one alone to compare).
    pub moves: Vec<Decision>,
}

/// What one run of [`Offload`] chose.
#[derive(Clone, Debug, PartialEq)]
pub struct OffloadPlan {
    /// Each candidate's decision, in forward order.
    pub decisions: Vec<(Value, Decision)>,
    /// Device peak of activations and temporaries before and after, bytes.
    pub peak: (u64, u64),
    /// The budget in bytes.
    pub budget: u64,
    /// Predicted step before and after, seconds.
    pub time: (f64, f64),
    /// Predicted stalls waiting for swap-ins after, seconds.
    pub stalls: f64,
}

/// A built plan: the rewritten function, its peak and predicted time, and the values it swaps
/// (a value planned for swapping whose reader has no trigger once the recomputation is in
/// place stays in device memory).
struct Built {
    f: Function,
    peak: u64,
    time: f64,
    stalls: f64,
    swapped: Vec<Value>,
}

/// Where `f`'s backward part starts, or the error for a function without one.
fn backward(f: &Function) -> Result<usize, String> {
    f.backward_position().ok_or_else(|| {
        "`offload` plans a training function, and this one has no backward part: run `grad` first"
            .to_string()
    })
}

impl Offload {
    /// The budget in bytes, for a peak of `peak` without offloading.
    fn limit(&self, peak: u64) -> u64 {
        match self.budget {
            Budget::Bytes(n) => n,
            Budget::Fraction(x) => (peak as f64 * x) as u64,
        }
    }

    /// Plans and rewrites `f`; see the module docs.
    pub fn run(&self, f: &mut Function) -> Result<OffloadPlan, String> {
        let b = backward(f)?;
        let candidates = candidates(f, b);
        let mut state = vec![Decision::Keep; candidates.len()];
        let start = self.build(f, &candidates, &state)?;
        let budget = self.limit(start.peak);
        let mut best = Built {
            f: start.f.clone(),
            ..start
        };
        let before = (start.peak, start.time);
        // The fast way first: every change estimated without building, then the shortest
        // prefix of the ranking that meets the budget, found by bisection.
        // The lowest peak any plan built so far reached, for the error.
        let mut lowest = best.peak;
        if best.peak > budget {
            match self.fast(f, &candidates, budget) {
                Ok((fast_state, built)) => {
                    state = fast_state;
                    best = built;
                }
                Err(peak) => lowest = lowest.min(peak),
            }
        }
        // The slower phases rebuild the whole function for every candidate: past this size that
        // is hours, so the pass says so instead.
        if best.peak > budget && f.schedule().len() > EXHAUSTIVE_OPS {
            return Err(format!(
                "`offload`'s fast search found no plan within the budget of {} for this function \
                 of {} ops, and its exhaustive search is for functions of at most {EXHAUSTIVE_OPS}: \
                 give a larger budget (the peak without offloading is {})",
                human(budget),
                f.schedule().len(),
                human(before.0)
            ));
        }
        // Else each change built alone, ranked by the bytes it takes off the device per second it
        // adds (hidden ones first, the larger first), then taken in that order while over
        // budget: one that adds no time if it does not raise the peak, another only if it
        // lowers it. Linear in the candidates, builds included.
        if best.peak > budget {
            let mut ranked: Vec<(f64, u64, usize, Decision)> = Vec::new();
            for i in 0..candidates.len() {
                for &d in &self.moves {
                    state[i] = d;
                    let built = self.build(f, &candidates, &state);
                    state[i] = Decision::Keep;
                    let Ok(built) = built else { continue };
                    let bytes = f.ty(candidates[i]).size_bytes();
                    let added = built.time - start.time;
                    let score = if added <= 0.0 {
                        f64::INFINITY
                    } else {
                        bytes as f64 / added
                    };
                    ranked.push((score, bytes, i, d));
                }
            }
            ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)));
            for (_, _, i, d) in ranked {
                if best.peak <= budget {
                    break;
                }
                if state[i] != Decision::Keep {
                    continue;
                }
                state[i] = d;
                match self.build(f, &candidates, &state) {
                    Ok(b) if b.peak < best.peak || (b.peak == best.peak && b.time <= best.time) => {
                        best = b
                    }
                    _ => state[i] = Decision::Keep,
                }
            }
        }
        // Then, while still over budget, the best single change from where that left off,
        // every change built at each step (quadratic; rarely needed).
        while best.peak > budget {
            let mut choice: Option<(f64, usize, Decision, Built)> = None;
            for i in 0..candidates.len() {
                let was = state[i];
                for &d in &self.moves {
                    // From keeping, any change; from swapping ahead, swapping just in time.
                    if !(was == Decision::Keep
                        || (was == Decision::Swap && d == Decision::SwapLate))
                    {
                        continue;
                    }
                    state[i] = d;
                    let built = self.build(f, &candidates, &state);
                    state[i] = was;
                    let Ok(built) = built else { continue };
                    if built.peak >= best.peak {
                        continue;
                    }
                    // Bytes saved per second added; a change that adds no time ranks by the
                    // bytes alone, above every change that adds some.
                    let saved = (best.peak - built.peak) as f64;
                    let added = built.time - best.time;
                    let score = if added <= 0.0 {
                        f64::INFINITY
                    } else {
                        saved / added
                    };
                    let better = choice.as_ref().is_none_or(|(s, _, _, c)| {
                        score > *s || (score == *s && built.peak < c.peak)
                    });
                    if better {
                        choice = Some((score, i, d, built));
                    }
                }
            }
            let Some((_, i, d, built)) = choice else {
                // Changes that help only together (two recomputations in a row): remat's plan.
                if let Some((s, built)) = self.remat_seeded(f, &candidates, budget) {
                    state = s;
                    best = built;
                    break;
                }
                return Err(format!(
                    "`offload` cannot meet the budget of {}: the lowest device peak it reached is {} \
                     (from {} with nothing offloaded)",
                    human(budget),
                    human(lowest.min(best.peak)),
                    human(before.0)
                ));
            };
            state[i] = d;
            best = built;
        }
        // A plan that costs time (over 0.5% of the step: less is not worth a second search):
        // remat's, with swaps for its recomputations, may cost less.
        let costly = |b: &Built| b.time > before.1 * 1.005;
        if costly(&best)
            && f.schedule().len() <= EXHAUSTIVE_OPS
            && let Some((s, built)) = self.remat_seeded(f, &candidates, budget)
            && (built.time, built.peak) < (best.time, best.peak)
        {
            state = s;
            best = built;
        }
        // On small functions, moves of one decision from an activation to another (at most
        // 16² + 32 builds a step, 8 steps).
        if costly(&best) && candidates.len() <= 16 && f.schedule().len() <= 1_000 {
            (state, best) = self.polish(f, &candidates, budget, state, best);
        }
        // A value planned for swapping that the built plan could not swap is kept.
        let swapped: std::collections::HashSet<Value> = best.swapped.iter().copied().collect();
        for (d, v) in state.iter_mut().zip(&candidates) {
            if d.swaps() && !swapped.contains(v) {
                *d = Decision::Keep;
            }
        }
        *f = best.f;
        Ok(OffloadPlan {
            decisions: candidates.iter().copied().zip(state).collect(),
            peak: (before.0, best.peak),
            budget,
            time: (before.1, best.time),
            stalls: best.stalls,
        })
    }

    /// `remat{budget}`'s plan for `budget`, then each recomputed activation swapped instead
    /// (the most expensive to recompute first) where that keeps the budget and shortens the
    /// predicted step. `None` where remat cannot meet the budget. O(n) builds.
    fn remat_seeded(
        &self,
        f: &Function,
        candidates: &[Value],
        budget: u64,
    ) -> Option<(Vec<Decision>, Built)> {
        if !self.moves.contains(&Decision::Recompute) {
            return None;
        }
        let fit = crate::remat::fit(f, Budget::Bytes(budget)).ok()?;
        let kept: std::collections::HashSet<Value> = fit.checkpoints.into_iter().collect();
        let mut state: Vec<Decision> = (candidates.iter())
            .map(|v| {
                if kept.contains(v) {
                    Decision::Keep
                } else {
                    Decision::Recompute
                }
            })
            .collect();
        let mut best = self.build(f, candidates, &state).ok()?;
        if best.peak > budget {
            return None;
        }
        if self.moves.contains(&Decision::Swap) {
            let mut order: Vec<(f64, usize)> = (0..candidates.len())
                .filter(|&i| state[i] == Decision::Recompute)
                .map(|i| {
                    let p = f.def_op(candidates[i]).expect("an op result");
                    (compute_time(f, p, &self.machine), i)
                })
                .collect();
            order.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            for (_, i) in order {
                for d in [Decision::Swap, Decision::SwapLate] {
                    state[i] = d;
                    match self.build(f, candidates, &state) {
                        Ok(b) if b.peak <= budget && b.time < best.time => {
                            best = b;
                            break;
                        }
                        _ => state[i] = Decision::Recompute,
                    }
                }
            }
        }
        Some((state, best))
    }

    /// Steepest descent on a plan that meets `budget`: while some move shortens the predicted
    /// step within the budget, take the best, a move being one activation's decision changed,
    /// or one activation's decision moved to a kept one (which is then kept no more). O(n²)
    /// builds a step, at most 8 steps.
    fn polish(
        &self,
        f: &Function,
        candidates: &[Value],
        budget: u64,
        mut state: Vec<Decision>,
        mut best: Built,
    ) -> (Vec<Decision>, Built) {
        let n = candidates.len();
        for _ in 0..8 {
            let mut moves: Vec<Vec<(usize, Decision)>> = Vec::new();
            for i in 0..n {
                for &d in std::iter::once(&Decision::Keep).chain(&self.moves) {
                    if d != state[i] {
                        moves.push(vec![(i, d)]);
                    }
                }
                if state[i] != Decision::Keep {
                    for j in (0..n).filter(|&j| state[j] == Decision::Keep) {
                        moves.push(vec![(i, Decision::Keep), (j, state[i])]);
                    }
                }
            }
            let mut choice: Option<(Vec<(usize, Decision)>, Built)> = None;
            for m in moves {
                let mut s = state.clone();
                for &(i, d) in &m {
                    s[i] = d;
                }
                let Ok(b) = self.build(f, candidates, &s) else {
                    continue;
                };
                let target = choice.as_ref().map_or(&best, |(_, c)| c);
                if b.peak <= budget && (b.time, b.peak) < (target.time, target.peak) {
                    choice = Some((m, b));
                }
            }
            let Some((m, b)) = choice else { break };
            for (i, d) in m {
                state[i] = d;
            }
            best = b;
        }
        (state, best)
    }

    /// The exact optimum of the joint space on small functions, to measure [`Offload::run`]
    /// against: every assignment of keep, recompute, swap or swap late (those of `moves`) to
    /// the saved activations, each built as `run` builds its plans, the fastest predicted step
    /// whose device peak meets the budget (then the lowest peak). Branch and bound over the
    /// activations in forward order: a partial assignment whose recomputed producers and late
    /// swaps' copies alone would make the step no faster than the best plan so far is cut
    /// (every recomputed value's op runs at least once more; a late swap's first reader waits
    /// for its copy; swaps fetched ahead add no compute). `None` when no assignment meets the
    /// budget. An error for more than 12 activations (4^12 assignments).
    pub fn exhaustive(&self, f: &Function) -> Result<Option<OffloadPlan>, String> {
        let b = backward(f)?;
        let candidates = candidates(f, b);
        if candidates.len() > 12 {
            return Err(format!(
                "the exhaustive search is for at most 12 saved activations, and this function has {}",
                candidates.len()
            ));
        }
        let start = self.build(f, &candidates, &vec![Decision::Keep; candidates.len()])?;
        let budget = self.limit(start.peak);
        // What each decision adds to the step at least: a recomputation its producer's time
        // (it runs once more); a late swap its copy (its first reader waits for it, and
        // readers' waits and copies over the one link do not overlap).
        let own: Vec<(f64, f64)> = (candidates.iter())
            .map(|&v| {
                let p = f.def_op(v).expect("an op result");
                let copy = f.ty(v).size_bytes() as f64 / self.link;
                (compute_time(f, p, &self.machine), copy)
            })
            .collect();
        struct Search<'a> {
            o: &'a Offload,
            f: &'a Function,
            candidates: &'a [Value],
            own: &'a [(f64, f64)],
            budget: u64,
            state: Vec<Decision>,
            best: Option<(Vec<Decision>, Built)>,
        }
        impl Search<'_> {
            fn go(&mut self, i: usize, lower: f64) {
                if let Some((_, b)) = &self.best
                    && lower >= b.time
                {
                    return;
                }
                if i == self.candidates.len() {
                    let Ok(built) = self.o.build(self.f, self.candidates, &self.state) else {
                        return;
                    };
                    let better = built.peak <= self.budget
                        && self
                            .best
                            .as_ref()
                            .is_none_or(|(_, b)| (built.time, built.peak) < (b.time, b.peak));
                    if better {
                        self.best = Some((self.state.clone(), built));
                    }
                    return;
                }
                for d in [
                    Decision::Keep,
                    Decision::Swap,
                    Decision::SwapLate,
                    Decision::Recompute,
                ] {
                    if d != Decision::Keep && !self.o.moves.contains(&d) {
                        continue;
                    }
                    self.state[i] = d;
                    let added = match d {
                        Decision::Recompute => self.own[i].0,
                        Decision::SwapLate => self.own[i].1,
                        _ => 0.0,
                    };
                    self.go(i + 1, lower + added);
                }
                self.state[i] = Decision::Keep;
            }
        }
        let mut s = Search {
            o: self,
            f,
            candidates: &candidates,
            own: &own,
            budget,
            state: vec![Decision::Keep; candidates.len()],
            best: None,
        };
        s.go(0, start.time);
        Ok(s.best.map(|(mut state, built)| {
            // As in `run`: a swap the plan could not place is a kept value.
            for (d, v) in state.iter_mut().zip(&candidates) {
                if d.swaps() && !built.swapped.contains(v) {
                    *d = Decision::Keep;
                }
            }
            OffloadPlan {
                decisions: candidates.iter().copied().zip(state).collect(),
                peak: (start.peak, built.peak),
                budget,
                time: (start.time, built.time),
                stalls: built.stalls,
            }
        }))
    }

    /// Each candidate's best change estimated without building it (a swap's stalls from the
    /// compute time between each trigger and its reader against the copy's time, a
    /// recomputation's time its producer's, its operands all kept), ranked by bytes per second
    /// added (hidden swaps first, larger first); then the shortest prefix of that ranking whose
    /// plan meets `budget`, by bisection (a plan with more of the prefix holds no more device
    /// memory), building O(log n) plans. If the whole ranking does not meet it, the lowest
    /// peak it reached (`u64::MAX` if none was built).
    fn fast(
        &self,
        f: &Function,
        candidates: &[Value],
        budget: u64,
    ) -> Result<(Vec<Decision>, Built), u64> {
        let pos = f.positions();
        let at = |op| pos[op].expect("scheduled") as usize;
        // When each scheduled op ends on the compute stream, and its own time.
        let mut end = Vec::with_capacity(f.schedule().len());
        let mut own = Vec::with_capacity(f.schedule().len());
        let mut now = 0.0;
        for &op in f.schedule() {
            let secs = compute_time(f, op, &self.machine);
            now += secs;
            end.push(now);
            own.push(secs);
        }
        let start = |op| end[at(op)] - own[at(op)];
        let index: std::collections::HashMap<Value, usize> = candidates
            .iter()
            .enumerate()
            .map(|(i, &v)| (v, i))
            .collect();
        let mut ranked: Vec<(f64, u64, usize, Decision)> = Vec::new();
        let score = |bytes: u64, added: f64| {
            if added <= 0.0 {
                f64::INFINITY
            } else {
                bytes as f64 / added
            }
        };
        if self.moves.contains(&Decision::Swap) {
            let swap = Swap {
                lb: self.lb,
                ub: self.ub,
                order: self.order,
                only: Some(candidates.to_vec()),
                ..Swap::default()
            };
            for p in swap.plan(f).map_err(|_| u64::MAX)?.plans {
                let bytes = f.ty(p.value).size_bytes();
                let copy = bytes as f64 / self.link;
                let stalls: f64 = (p.groups.iter())
                    .map(|(t, readers)| {
                        let first = readers
                            .iter()
                            .map(|&r| start(r))
                            .fold(f64::INFINITY, f64::min);
                        (copy - (first - end[at(*t)])).max(0.0)
                    })
                    .sum();
                ranked.push((score(bytes, stalls), bytes, index[&p.value], Decision::Swap));
            }
        }
        if self.moves.contains(&Decision::Recompute) {
            for (i, &v) in candidates.iter().enumerate() {
                let p = f.def_op(v).expect("an op result");
                let bytes = f.ty(v).size_bytes();
                ranked.push((score(bytes, own[at(p)]), bytes, i, Decision::Recompute));
            }
        }
        // Each value's best change, the best values first.
        ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)));
        let mut seen = vec![false; candidates.len()];
        ranked.retain(|r| !std::mem::replace(&mut seen[r.2], true));
        // The first `k` of the ranking, swaps ahead of their readers or (`late`) just in time.
        let state_of = |k: usize, late: bool| {
            let mut state = vec![Decision::Keep; candidates.len()];
            for &(_, _, i, d) in &ranked[..k] {
                state[i] = if late && d == Decision::Swap {
                    Decision::SwapLate
                } else {
                    d
                };
            }
            state
        };
        // The plan, if it meets the budget; else its peak.
        let fits = |k: usize, late: bool| {
            let state = state_of(k, late);
            let built = self.build(f, candidates, &state).map_err(|_| u64::MAX)?;
            if built.peak <= budget {
                Ok((state, built))
            } else {
                Err(built.peak)
            }
        };
        // Swaps fetched just in time hold less device memory, and make their readers wait: only
        // if the whole ranking misses the budget with every swap ahead.
        let (late, mut hi) = match fits(ranked.len(), false) {
            Ok(found) => (false, found),
            Err(ahead) if self.moves.contains(&Decision::SwapLate) => {
                (true, fits(ranked.len(), true).map_err(|p| p.min(ahead))?)
            }
            Err(ahead) => return Err(ahead),
        };
        let (mut lo, mut hi_k) = (0, ranked.len());
        // Invariant: the first `lo` do not fit (or `lo` is 0), the first `hi_k` do.
        while hi_k - lo > 1 {
            let mid = lo + (hi_k - lo) / 2;
            match fits(mid, late) {
                Ok(found) => {
                    hi = found;
                    hi_k = mid;
                }
                Err(_) => lo = mid,
            }
        }
        // Then each late swap, in forward order, fetched ahead instead where the budget allows
        // (one build each, on functions of at most `LATE_REVERTS` candidates).
        if late && candidates.len() <= LATE_REVERTS {
            let (state, best) = &mut hi;
            for i in 0..candidates.len() {
                if state[i] != Decision::SwapLate {
                    continue;
                }
                state[i] = Decision::Swap;
                match self.build(f, candidates, state) {
                    Ok(b) if b.peak <= budget && b.time <= best.time => *best = b,
                    _ => state[i] = Decision::SwapLate,
                }
            }
        }
        Ok(hi)
    }

    /// `f` with `state`'s decisions for `candidates`, built and measured.
    fn build(
        &self,
        f: &Function,
        candidates: &[Value],
        state: &[Decision],
    ) -> Result<Built, String> {
        let mut g = f.clone();
        let kept: Vec<Value> = (candidates.iter().zip(state))
            .filter(|(_, d)| **d != Decision::Recompute)
            .map(|(&v, _)| v)
            .collect();
        if kept.len() < candidates.len() {
            remat(&mut g, &kept)?;
        }
        let with = |want: &dyn Fn(Decision) -> bool| -> Vec<Value> {
            (candidates.iter().zip(state))
                .filter(|(_, d)| want(**d))
                .map(|(&v, _)| v)
                .collect()
        };
        let swapped = with(&|d| d.swaps());
        let mut done = Vec::new();
        if !swapped.is_empty() {
            let swap = Swap {
                lb: self.lb,
                ub: self.ub,
                order: self.order,
                only: Some(swapped),
                late: with(&|d| d == Decision::SwapLate),
                ..Swap::default()
            };
            done = swap.run(&mut g)?.swapped;
        }
        let t = timeline(&g, &self.machine, self.link / 1e9);
        Ok(Built {
            peak: analyze(&g).temps_peak.0,
            time: t.total,
            stalls: t.stalls,
            f: g,
            swapped: done,
        })
    }
}

/// The saved activations: op results of the forward part (positions `..b`) a backward op reads,
/// not constants, views or returned values, in forward order.
fn candidates(f: &Function, b: usize) -> Vec<Value> {
    let users = Users::new(f);
    let pos = f.positions();
    let sched = f.schedule();
    let mut out = Vec::new();
    for &p in &sched[..b] {
        if matches!(f.op(p).kind, OpKind::Const { .. } | OpKind::Reshape { .. }) {
            continue;
        }
        for &v in &f.op(p).results {
            let read_back =
                (users.consumers(v).iter()).any(|&r| pos[r].is_some_and(|i| i as usize >= b));
            if read_back && !users.is_returned(v) {
                out.push(v);
            }
        }
    }
    out
}

/// Reads [`Offload`] from pipeline options.
pub fn options(o: &Options) -> Result<Offload, String> {
    let budget = Budget::parse(o.get("budget").ok_or(
        "say the device peak to meet: budget=BYTES (64MiB) or budget=FRACTION (0.5, 50%)",
    )?)?;
    let link = match o.get("link") {
        None => 16e9,
        Some(v) => parse_rate(v).ok_or_else(|| {
            format!(
                "option `link` must be a positive bandwidth such as 16GB/s or 500MB/s, found `{v}`"
            )
        })?,
    };
    let mut swap_opts = Options::default();
    for key in ["lb", "ub", "order"] {
        if let Some(v) = o.get(key) {
            swap_opts.0.push((key.to_string(), v.to_string()));
        }
    }
    if o.get("lb").is_none() {
        swap_opts.0.push(("lb".into(), "2".into()));
    }
    let s = crate::swap::options(&swap_opts)?;
    let moves = match o.get("only") {
        None => vec![Decision::Swap, Decision::SwapLate, Decision::Recompute],
        Some("swap") => vec![Decision::Swap, Decision::SwapLate],
        Some("recompute") => vec![Decision::Recompute],
        Some(v) => return Err(format!("option `only` is swap or recompute, found `{v}`")),
    };
    Ok(Offload {
        budget,
        link,
        lb: s.lb,
        ub: s.ub,
        order: s.order,
        machine: Machine::DEFAULT,
        moves,
    })
}

/// A bandwidth: bytes per second, or with `kB/s`, `MB/s`, `GB/s` (decimal) or `KiB/s`, `MiB/s`,
/// `GiB/s`; `None` unless positive and finite.
pub fn parse_rate(s: &str) -> Option<f64> {
    let units: [(&str, f64); 8] = [
        ("GiB/s", (1u64 << 30) as f64),
        ("MiB/s", (1u64 << 20) as f64),
        ("KiB/s", 1024.0),
        ("GB/s", 1e9),
        ("MB/s", 1e6),
        ("kB/s", 1e3),
        ("KB/s", 1e3),
        ("B/s", 1.0),
    ];
    let (num, scale) = units
        .iter()
        .find_map(|&(u, k)| s.strip_suffix(u).map(|n| (n.trim(), k)))
        .unwrap_or((s.trim(), 1.0));
    let x = num.parse::<f64>().ok()? * scale;
    (x.is_finite() && x > 0.0).then_some(x)
}

pub(crate) fn create(o: &Options) -> Result<Box<dyn Pass>, String> {
    Ok(Box::new(OffloadPass {
        offload: options(o)?,
        notes: Notes::default(),
    }))
}

struct OffloadPass {
    offload: Offload,
    notes: Notes,
}

impl Pass for OffloadPass {
    fn name(&self) -> &'static str {
        "offload"
    }

    fn run_on_function(&self, f: &mut Function) -> Result<(), String> {
        let plan = self.offload.run(f)?;
        let count = |d: Decision| plan.decisions.iter().filter(|(_, x)| *x == d).count();
        let mut note = format!(
            "@{}: device peak {} -> {} (budget {}), predicted step {:.3} -> {:.3} ms ({:.3} ms stalled); keep {}, swap {}{}, recompute {}",
            f.name,
            human(plan.peak.0),
            human(plan.peak.1),
            human(plan.budget),
            plan.time.0 * 1e3,
            plan.time.1 * 1e3,
            plan.stalls * 1e3,
            count(Decision::Keep),
            count(Decision::Swap),
            match count(Decision::SwapLate) {
                0 => String::new(),
                n => format!(", swap late {n}"),
            },
            count(Decision::Recompute),
        );
        for (v, d) in &plan.decisions {
            let mut name = String::new();
            let _ = tcc_ir::printer::write_name(&mut name, '%', f.name(*v));
            note += &format!("\n  {d:<9} {name}  {}", f.ty(*v));
        }
        self.notes.push(note);
        Ok(())
    }

    fn notes(&self) -> Vec<String> {
        self.notes.take()
    }
}

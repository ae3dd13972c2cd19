//! The exact optimum of remat's plans on small functions: branch and bound over which forward
//! values are kept.
//!
//! The space is the one `remat` rewrites to (`joint::Joint::plan`): any set of
//! forward values is kept; every other one a backward op needs is recomputed once, just before
//! the first backward op that needs it, and its copy lives until its last reader. The search
//! decides the forward ops in reverse schedule order, so that when an op is decided all its
//! forward readers are, and with them whether it is copied, where its copy is made and how long
//! each of its values lives. That gives two bounds on every completion of a partial choice:
//! - a profile over the original schedule's positions (`tree`): the values every plan holds
//!   (each forward value from its definition to its last forward reader, each value the
//!   backward pass reads from its first to its last backward reader, the backward values),
//!   plus what the decided ops add (a kept value held through the gap, a copy from where it is
//!   made), plus, for an undecided value the backward pass reads that a decided copy reads,
//!   the span from that copy to its first backward reader (held as original or copy either
//!   way). Its maximum is at most the peak of any completion: copies made and freed between
//!   two original ops, and buffers shared through reshapes, are left out, which only lowers
//!   it;
//! - the recomputed FLOPs so far (deciding earlier ops only adds copies), plus, under a limit,
//!   a fractional knapsack: where keeping every undecided value the backward pass reads would
//!   pass the limit (`pot`), enough of them must be dropped, each recomputing at least its own
//!   op.
//!
//! Leaves are judged by `joint::Joint`'s simulator (the same peak `analysis::memory` reports),
//! never by the bound. The search stops after a number of nodes; the result then says it is
//! not proven.

use super::joint::{Joint, Kind, NONE};
use super::{no_backward, no_swaps};
use cranelift_entity::EntityRef;
use tcc_ir::{Function, Value};

/// What the search is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Goal {
    /// The least recomputed FLOPs (then the lowest peak) with a peak of at most this many
    /// bytes.
    Cheapest(u64),
    /// The lowest peak (then the least recomputation).
    LowestPeak,
}

/// Which values the search may keep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Space {
    /// Any forward value (everything `remat` can express).
    Forward,
    /// The forward values backward ops read (what the budget search chooses among); others
    /// are recomputed where needed. Much faster to search.
    Read,
}

/// The best plan the search found.
#[derive(Clone, Debug)]
pub(super) struct Found {
    /// Per value (`Value::index()`): kept. `None` when no plan meets the goal's limit.
    pub keep: Option<Vec<bool>>,
    /// The plan's simulated peak and recomputed FLOPs (zero when there is no plan).
    pub peak: u64,
    /// See `peak`.
    pub extra: u64,
    /// The search finished: the plan is optimal, or (without a plan) none exists.
    pub proven: bool,
    /// Nodes visited.
    pub nodes: u64,
}

/// A lower bound on the peak (as `analysis::memory`'s `temps_peak`) of every plan that keeps,
/// recomputes or swaps (for the backward pass) forward values: each forward value on the
/// device from its definition to its last forward reader, each backward value from its
/// definition to its last reader, and each forward value the backward pass reads (as original,
/// copy or swapped-in copy) at every backward op that reads it. Buffers shared through reshapes
/// and returned buffers are left out.
fn profile_floor(j: &Joint) -> u64 {
    let facts = Facts::new(j);
    let mut delta = vec![0i64; j.len() + 1];
    let mut add = |lo: u32, hi: u32, bytes: i64| {
        delta[lo as usize] += bytes;
        delta[hi as usize + 1] -= bytes;
    };
    for v in 0..j.bytes.len() {
        if !facts.counted[v] {
            continue;
        }
        let d = j.def[v];
        if (d as usize) < j.b {
            add(d, facts.last_fwd[v], j.bytes[v] as i64);
        } else {
            add(d, facts.last_bwd[v].max(d), j.bytes[v] as i64);
        }
    }
    for p in j.b..j.len() {
        let args = j.args(p);
        for (i, &a) in args.iter().enumerate() {
            let a = a as usize;
            let forward = (j.def[a] as usize) < j.b && j.def[a] != NONE;
            if forward && facts.counted[a] && !args[..i].contains(&(a as u32)) {
                add(p as u32, p as u32, j.bytes[a] as i64);
            }
        }
    }
    let (mut cur, mut peak) = (0i64, 0i64);
    for d in &delta[..j.len()] {
        cur += d;
        peak = peak.max(cur);
    }
    peak as u64
}

/// Range add and global maximum over positions (a segment tree without pushdown: a node's
/// maximum includes its own addend).
struct MaxTree {
    size: usize,
    add: Vec<i64>,
    max: Vec<i64>,
}

impl MaxTree {
    fn new(n: usize) -> MaxTree {
        let size = n.max(1).next_power_of_two();
        MaxTree {
            size,
            add: vec![0; 2 * size],
            max: vec![0; 2 * size],
        }
    }

    /// Adds `v` at the positions `lo..=hi`.
    fn range(&mut self, lo: u32, hi: u32, v: i64) {
        if lo <= hi && v != 0 {
            self.update(1, 0, self.size - 1, lo as usize, hi as usize, v);
        }
    }

    fn update(&mut self, node: usize, l: usize, r: usize, lo: usize, hi: usize, v: i64) {
        if hi < l || r < lo {
            return;
        }
        if lo <= l && r <= hi {
            self.add[node] += v;
            self.max[node] += v;
            return;
        }
        let m = (l + r) / 2;
        self.update(2 * node, l, m, lo, hi, v);
        self.update(2 * node + 1, m + 1, r, lo, hi, v);
        self.max[node] = self.add[node] + self.max[2 * node].max(self.max[2 * node + 1]);
    }

    fn top(&self) -> u64 {
        self.max[1].max(0) as u64
    }

    /// A position where the maximum is.
    fn argmax(&self) -> u32 {
        let mut node = 1;
        while node < self.size {
            let want = self.max[node] - self.add[node];
            node = if self.max[2 * node] == want {
                2 * node
            } else {
                2 * node + 1
            };
        }
        (node - self.size) as u32
    }
}

/// Per-value facts the bounds need, in original schedule positions.
struct Facts {
    /// Counted in the bound: defined by an op other than a reshape or constant, its buffer not
    /// returned.
    counted: Vec<bool>,
    /// Last forward reader (its definition when there is none).
    last_fwd: Vec<u32>,
    /// First and last backward reader (`NONE` when there is none).
    first_bwd: Vec<u32>,
    last_bwd: Vec<u32>,
    /// The forward ops that read each value (CSR).
    readers_at: Vec<u32>,
    readers: Vec<u32>,
}

impl Facts {
    fn new(j: &Joint) -> Facts {
        let nv = j.bytes.len();
        let mut f = Facts {
            counted: vec![false; nv],
            last_fwd: vec![NONE; nv],
            first_bwd: vec![NONE; nv],
            last_bwd: vec![NONE; nv],
            readers_at: vec![0; nv + 1],
            readers: Vec::new(),
        };
        // Buffers: a reshape shares its operand's.
        let mut root: Vec<u32> = (0..nv as u32).collect();
        for p in 0..j.len() {
            if j.kind[p] == Kind::Reshape {
                let r = j.results(p)[0] as usize;
                root[r] = root[j.args(p)[0] as usize];
            }
        }
        let mut returned = vec![false; nv];
        for &r in &j.returned {
            returned[root[r as usize] as usize] = true;
        }
        for v in 0..nv {
            let d = j.def[v];
            f.counted[v] =
                d != NONE && j.kind[d as usize] == Kind::Other && !returned[root[v] as usize];
            if d != NONE {
                f.last_fwd[v] = d;
            }
        }
        for p in 0..j.len() {
            for &a in j.args(p) {
                let a = a as usize;
                if p < j.b {
                    f.last_fwd[a] = f.last_fwd[a].max(p as u32);
                    f.readers_at[a + 1] += 1;
                } else if j.def[a] != NONE {
                    if f.first_bwd[a] == NONE {
                        f.first_bwd[a] = p as u32;
                    }
                    f.last_bwd[a] = p as u32;
                }
            }
        }
        for v in 0..nv {
            f.readers_at[v + 1] += f.readers_at[v];
        }
        f.readers = vec![0; f.readers_at[nv] as usize];
        let mut fill = f.readers_at.clone();
        for p in 0..j.b {
            for &a in j.args(p) {
                f.readers[fill[a as usize] as usize] = p as u32;
                fill[a as usize] += 1;
            }
        }
        f
    }

    /// For a forward value the backward pass reads, defined by an op with one result and
    /// counted: the positions between its last forward and first backward reader.
    fn kept_span(&self, j: &Joint, v: usize) -> Option<(u32, u32)> {
        let d = j.def[v];
        (self.counted[v]
            && (d as usize) < j.b
            && j.results(d as usize).len() == 1
            && self.first_bwd[v] != NONE)
            .then(|| (self.last_fwd[v] + 1, self.first_bwd[v] - 1))
    }

    fn readers(&self, v: usize) -> &[u32] {
        &self.readers[self.readers_at[v] as usize..self.readers_at[v + 1] as usize]
    }
}

/// Which bound an interval change goes to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum To {
    Both,
    Tree,
    Pot,
}

struct Search<'a> {
    j: &'a Joint,
    facts: Facts,
    goal: Goal,
    space: Space,
    hint: Option<&'a [bool]>,
    tree: MaxTree,
    /// `tree` plus, for each undecided value the backward pass reads, its bytes from after its
    /// last forward reader to before its first backward one: where it is held if kept.
    pot: MaxTree,
    /// Those values, cheapest to recompute per byte first.
    by_ratio: Vec<u32>,
    keep: Vec<bool>,
    /// The interval changes and earlier pending starts of the decisions on the current path,
    /// to undo them; the needed results of the ops on it (`go`'s working lists).
    log: Vec<(u32, u32, i64, To)>,
    pending_log: Vec<(usize, u32)>,
    needed: Vec<(usize, u32)>,
    /// Per forward position: where its copy is made (`NONE`: not copied).
    birth: Vec<u32>,
    /// Per undecided value the backward pass reads: the earliest batch of a decided copy that
    /// reads it (`NONE`: none), from where to its first backward reader it is counted.
    pending: Vec<u32>,
    extra: u64,
    best: Option<(u64, u64, Vec<bool>)>,
    nodes: u64,
    max_nodes: u64,
    stopped: bool,
}

/// Searches remat's plans of `j` for `goal`, visiting at most `max_nodes` nodes. `hint` (a keep
/// vector, say the heuristic's choice) is tried first and, where it meets the goal, starts as
/// the best plan.
pub(super) fn search(
    j: &Joint,
    goal: Goal,
    space: Space,
    hint: Option<&[bool]>,
    max_nodes: u64,
) -> Found {
    let facts = Facts::new(j);
    // `tree`: what every plan holds. `pot`: that plus, for each value the backward pass reads,
    // its span between forward and backward readers (where it is held if kept).
    let mut tree = MaxTree::new(j.len());
    let mut pot = MaxTree::new(j.len());
    for v in 0..j.bytes.len() {
        if !facts.counted[v] {
            continue;
        }
        let bytes = j.bytes[v] as i64;
        let d = j.def[v];
        let mut both = |lo, hi| {
            tree.range(lo, hi, bytes);
            pot.range(lo, hi, bytes);
        };
        if (d as usize) < j.b {
            both(d, facts.last_fwd[v]);
            if facts.first_bwd[v] != NONE && j.results(d as usize).len() == 1 {
                both(facts.first_bwd[v], facts.last_bwd[v]);
            }
        } else {
            both(d, facts.last_bwd[v].max(d));
        }
        if let Some((lo, hi)) = facts.kept_span(j, v) {
            pot.range(lo, hi, bytes);
        }
    }
    let mut by_ratio: Vec<u32> = (0..j.bytes.len() as u32)
        .filter(|&v| facts.kept_span(j, v as usize).is_some())
        .collect();
    by_ratio.sort_by(|&a, &b| {
        let ratio =
            |v: u32| j.flops[j.def[v as usize] as usize] as f64 / j.bytes[v as usize] as f64;
        ratio(a).total_cmp(&ratio(b))
    });
    let mut s = Search {
        j,
        facts,
        goal,
        space,
        hint,
        tree,
        pot,
        by_ratio,
        keep: vec![false; j.bytes.len()],
        log: Vec::new(),
        pending_log: Vec::new(),
        needed: Vec::new(),
        birth: vec![NONE; j.b],
        pending: vec![NONE; j.bytes.len()],
        extra: 0,
        best: None,
        nodes: 0,
        max_nodes,
        stopped: false,
    };
    if let Some(h) = hint {
        let (peak, extra) = j.simulate(&j.plan(h));
        if s.meets(peak) {
            s.best = Some((extra, peak, h.to_vec()));
        }
    }
    s.go(j.b);
    match s.best {
        Some((extra, peak, keep)) => Found {
            keep: Some(keep),
            peak,
            extra,
            proven: !s.stopped,
            nodes: s.nodes,
        },
        None => Found {
            keep: None,
            peak: 0,
            extra: 0,
            proven: !s.stopped,
            nodes: s.nodes,
        },
    }
}

impl Search<'_> {
    fn meets(&self, peak: u64) -> bool {
        match self.goal {
            Goal::Cheapest(limit) => peak <= limit,
            Goal::LowestPeak => true,
        }
    }

    /// Whether a node with these bounds can still beat the best plan, the ops before `p`
    /// undecided.
    fn promising(&self, p: usize, mut extra: u64, peak: u64) -> bool {
        if !self.meets(peak) {
            return false;
        }
        // Where keeping every undecided value the backward pass reads would be over the
        // limit, enough of them to make up the excess must be dropped, each recomputing at
        // least its own op: a fractional knapsack, cheapest per byte first.
        if let Goal::Cheapest(limit) = self.goal {
            let over = self.pot.top().saturating_sub(limit);
            if over > 0 {
                let at = self.pot.argmax();
                let mut freed = 0u64;
                for &v in &self.by_ratio {
                    let v = v as usize;
                    let d = self.j.def[v];
                    let (lo, hi) = self.facts.kept_span(self.j, v).unwrap();
                    if d as usize >= p || at < lo || at > hi {
                        continue;
                    }
                    let (bytes, cost) = (self.j.bytes[v], self.j.flops[d as usize]);
                    if freed + bytes >= over {
                        extra += (cost as u128 * (over - freed) as u128 / bytes as u128) as u64;
                        freed = over;
                        break;
                    }
                    freed += bytes;
                    extra += cost;
                }
                if freed < over {
                    return false;
                }
            }
        }
        match (&self.best, self.goal) {
            (None, _) => true,
            (Some((e, p, _)), Goal::Cheapest(_)) => (extra, peak) < (*e, *p),
            (Some((_, p, _)), Goal::LowestPeak) => peak < *p,
        }
    }

    /// Decides the forward ops before position `p`, last first.
    fn go(&mut self, p: usize) {
        if self.stopped {
            return;
        }
        let Some(p) = p.checked_sub(1) else {
            return self.leaf();
        };
        let j = self.j;
        if j.kind[p] == Kind::Const {
            return self.go(p);
        }
        // The results some backward op or some copy reads, and when each is first needed.
        let base = self.needed.len();
        for &r in j.results(p) {
            let r = r as usize;
            let mut at = self.facts.first_bwd[r];
            for &q in self.facts.readers(r) {
                at = at.min(self.birth[q as usize]);
            }
            if at != NONE {
                self.needed.push((r, at));
            }
        }
        if self.needed.len() == base {
            return self.go(p);
        }
        self.branch(p, base);
        self.needed.truncate(base);
    }

    /// Tries each choice for op `p`, whose needed results are `self.needed[base..]`.
    fn branch(&mut self, p: usize, base: usize) {
        let needed = &self.needed[base..];
        // Each subset of the needed results to keep; the hint's first. Ops with more than
        // eight needed results (none in practice) keep all or none.
        let k = needed.len();
        let mut all: u32 = if k <= 8 { (1 << k) - 1 } else { 1 };
        if self.space == Space::Read && needed.iter().all(|&(r, _)| self.facts.first_bwd[r] == NONE)
        {
            // Values only copies read are dropped.
            all = 0;
        }
        let first = match self.hint {
            Some(h) if k <= 8 => (0..k).fold(0, |m, i| m | (u32::from(h[needed[i].0]) << i)),
            Some(h) => u32::from(needed.iter().all(|&(r, _)| h[r])),
            None => 0,
        }
        .min(all);
        for mask in std::iter::once(first).chain((0..=all).filter(|&m| m != first)) {
            let kept = |i: usize| {
                if k <= 8 {
                    mask >> i & 1 == 1
                } else {
                    mask == 1
                }
            };
            let needed = &self.needed[base..];
            let birth = (0..k)
                .filter(|&i| !kept(i))
                .map(|i| needed[i].1)
                .min()
                .unwrap_or(NONE);
            for i in 0..k {
                let r = self.needed[base + i].0;
                self.keep[r] = kept(i);
            }
            let marks = (self.log.len(), self.pending_log.len());
            self.apply(p, birth);
            self.nodes += 1;
            if self.nodes > self.max_nodes {
                self.stopped = true;
            }
            if self.promising(p, self.extra, self.tree.top()) {
                self.go(p);
            }
            self.undo(p, base, marks);
            if self.stopped {
                return;
            }
        }
    }

    /// Records the decision for op `p` (copied at `birth`, or not when `NONE`; its results'
    /// `keep` already set) in the bounds, logging what it changed.
    fn apply(&mut self, p: usize, birth: u32) {
        let j = self.j;
        let single = j.results(p).len() == 1;
        let start = self.log.len();
        // The decision replaces what was pending for the op's result, and its span in `pot`.
        if single {
            let r = j.results(p)[0] as usize;
            let bytes = j.bytes[r] as i64;
            if self.pending[r] != NONE {
                let fb = self.facts.first_bwd[r];
                self.log.push((self.pending[r], fb - 1, -bytes, To::Tree));
                self.pending_log.push((r, self.pending[r]));
                self.pending[r] = NONE;
            }
            if let Some((lo, hi)) = self.facts.kept_span(j, r) {
                self.log.push((lo, hi, -bytes, To::Pot));
            }
        }
        // A copy reads its operands at `birth`, and an operand the backward pass reads later is
        // held (as original or copy) from there to that read, whatever is decided for it.
        if birth != NONE {
            for &a in j.args(p) {
                let a = a as usize;
                let d = j.def[a];
                if d == NONE
                    || !self.facts.counted[a]
                    || j.results(d as usize).len() != 1
                    || self.facts.first_bwd[a] == NONE
                    || birth >= self.facts.first_bwd[a]
                    || self.pending[a] <= birth
                {
                    continue;
                }
                let (fb, bytes) = (self.facts.first_bwd[a], j.bytes[a] as i64);
                if self.pending[a] != NONE {
                    self.log.push((self.pending[a], fb - 1, -bytes, To::Tree));
                }
                self.log.push((birth, fb - 1, bytes, To::Tree));
                self.pending_log.push((a, self.pending[a]));
                self.pending[a] = birth;
            }
        }
        self.birth[p] = birth;
        if birth != NONE {
            self.extra += j.flops[p];
        }
        for &r in j.results(p) {
            let r = r as usize;
            if !self.facts.counted[r] {
                continue;
            }
            let bytes = j.bytes[r] as i64;
            // The last position the value (original or copy) is read at: by a backward op, or
            // just before the batch of a copy that reads it.
            let mut end = self.facts.last_bwd[r];
            for &q in self.facts.readers(r) {
                let b = self.birth[q as usize];
                if b != NONE {
                    end = if end == NONE { b - 1 } else { end.max(b - 1) };
                }
            }
            if end == NONE {
                continue;
            }
            let (fb, lb) = (self.facts.first_bwd[r], self.facts.last_bwd[r]);
            let from = if birth != NONE {
                // The copy, from its batch to its last reader.
                birth
            } else if self.keep[r] {
                // The original, held past its last forward reader.
                self.facts.last_fwd[r] + 1
            } else {
                continue;
            };
            self.log.push((from, end, bytes, To::Both));
            if single && fb != NONE {
                self.log.push((fb, lb, -bytes, To::Both));
            }
        }
        for i in start..self.log.len() {
            let (lo, hi, v, to) = self.log[i];
            if to != To::Pot {
                self.tree.range(lo, hi, v);
            }
            if to != To::Tree {
                self.pot.range(lo, hi, v);
            }
        }
    }

    /// Undoes op `p`'s decision: the logs back to `marks`, the keeps of `needed[base..]`.
    fn undo(&mut self, p: usize, base: usize, marks: (usize, usize)) {
        while self.log.len() > marks.0 {
            let (lo, hi, v, to) = self.log.pop().unwrap();
            if to != To::Pot {
                self.tree.range(lo, hi, -v);
            }
            if to != To::Tree {
                self.pot.range(lo, hi, -v);
            }
        }
        while self.pending_log.len() > marks.1 {
            let (v, old) = self.pending_log.pop().unwrap();
            self.pending[v] = old;
        }
        if self.birth[p] != NONE {
            self.extra -= self.j.flops[p];
        }
        self.birth[p] = NONE;
        for i in base..self.needed.len() {
            let r = self.needed[i].0;
            self.keep[r] = false;
        }
    }

    fn leaf(&mut self) {
        let (peak, extra) = self.j.simulate(&self.j.plan(&self.keep));
        debug_assert_eq!(extra, self.extra);
        debug_assert!(
            self.tree.top() <= peak,
            "bound {} over peak {peak}",
            self.tree.top()
        );
        if self.promising(0, extra, peak) {
            self.best = Some((extra, peak, self.keep.clone()));
        }
    }
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
    let found = search(&j, goal, space, hint.as_deref(), max_nodes);
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
    Ok(profile_floor(&Joint::new(f, b)))
}

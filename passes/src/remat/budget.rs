//! `remat{budget=...}`: the [`Budget`] type and [`fit`], the search for the least recomputation
//! whose simulated peak fits (the candidates are listed in the parent module's docs). Every
//! candidate is judged by `joint::Joint`'s simulator; nothing is rewritten here.

use super::exact::{self, Goal, Space};
use super::joint::{Joint, NONE};
use super::{Strategy, choose, no_backward, read_by_backward};
use crate::analysis::memory::human;
use cranelift_entity::EntityRef;
use tcc_ir::{Function, Value};

/// A memory budget for `remat{budget=...}`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Budget {
    /// At most this many bytes of activations and temporaries.
    Bytes(u64),
    /// At most this fraction (in (0, 1]) of the peak without remat.
    Fraction(f64),
}

impl Budget {
    /// Parses `1048576`, `64MiB` (also `KiB`, `GiB`), `0.5` or `50%`.
    pub fn parse(s: &str) -> Result<Budget, String> {
        let bad = || {
            format!(
                "budget `{s}` is neither bytes (1048576, 64KiB, 64MiB, 2GiB) nor a fraction of the peak without remat (0.5, 50%)"
            )
        };
        let fraction = |x: f64| {
            if x > 0.0 && x <= 1.0 {
                Ok(Budget::Fraction(x))
            } else {
                Err(format!(
                    "budget `{s}` must be a fraction in (0, 1] of the peak without remat"
                ))
            }
        };
        if let Some(p) = s.strip_suffix('%') {
            return fraction(p.trim().parse::<f64>().map_err(|_| bad())? / 100.0);
        }
        if s.contains('.') {
            return fraction(s.parse::<f64>().map_err(|_| bad())?);
        }
        parse_bytes(s)
            .filter(|&n| n > 0)
            .map(Budget::Bytes)
            .ok_or_else(bad)
    }
}

/// Bytes written as `1048576`, `4096B`, `64KiB`, `64MiB` or `2GiB`; `None` for anything else
/// or a count that overflows.
pub(crate) fn parse_bytes(s: &str) -> Option<u64> {
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => (&s[..i], s[i..].trim()),
        None => (s, ""),
    };
    let shift = match unit {
        "" | "B" => 0,
        "KiB" => 10,
        "MiB" => 20,
        "GiB" => 30,
        _ => return None,
    };
    num.parse::<u64>().ok()?.checked_mul(1 << shift)
}

/// What [`fit`] chose.
#[derive(Clone, Debug)]
pub struct Fit {
    /// The values to keep.
    pub checkpoints: Vec<Value>,
    /// Peak bytes of activations and temporaries without remat, and with these checkpoints.
    pub peak_before: u64,
    /// See `peak_before`.
    pub peak_after: u64,
    /// FLOPs of the recomputation (the cost model of `analysis::cost`).
    pub extra_flops: u64,
    /// Which candidate of the search it is (as the error names the lowest peak's).
    pub chosen_by: String,
}

/// Chooses checkpoints that bring the peak of activations and temporaries (`temps_peak` of
/// `analysis::memory`) within `budget` for the least recomputation the search finds, simulating
/// each candidate (see the module docs). An error states the smallest peak found when the
/// budget cannot be met.
pub fn fit(f: &Function, budget: Budget) -> Result<Fit, String> {
    let b = f.backward_position().ok_or_else(no_backward)?;
    let j = Joint::new(f, b);
    let nv = f.num_values_created();
    let all = vec![true; nv];
    let eval = |keep: &[bool]| j.simulate(&j.plan(keep));
    let (base, _) = eval(&all);
    let limit = match budget {
        Budget::Bytes(n) => n,
        Budget::Fraction(x) => (base as f64 * x).floor() as u64,
    };
    let values_of = |keep: &[bool]| -> Vec<Value> {
        (0..nv)
            .filter(|&v| keep[v] && j.forward[v])
            .map(Value::new)
            .collect()
    };
    if base <= limit {
        return Ok(Fit {
            checkpoints: values_of(&all),
            peak_before: base,
            peak_after: base,
            extra_flops: 0,
            chosen_by: "no remat: the peak is within the budget".to_string(),
        });
    }
    let mut seen = Seen {
        limit,
        best: None,
        lowest: (base, "no remat".to_string(), all.clone()),
    };
    let consider = |seen: &mut Seen, keep: Vec<bool>, how: &dyn Fn() -> String| -> bool {
        let r = eval(&keep);
        seen.add(keep, r, how)
    };
    // The fixed strategies are candidates too, so the budget mode is never worse than them.
    for (s, name) in [
        (Strategy::Memory { min_bytes: 0 }, "strategy=memory"),
        (Strategy::Speed, "strategy=speed"),
        (Strategy::Collection, "strategy=collection"),
    ] {
        if let Ok(c) = choose(f, &s)
            .map_err(drop)
            .and_then(|c| if c.is_empty() { Err(()) } else { Ok(c) })
        {
            let mut keep = vec![false; nv];
            for v in c {
                keep[v.index()] = true;
            }
            consider(&mut seen, keep, &|| name.to_string());
        }
    }
    // The family: the forward values backward ops read, in schedule order, each with the
    // FLOPs of recomputing it from the others per byte it frees.
    let stash: Vec<u32> = read_by_backward(f, b)
        .iter()
        .map(|v| v.index() as u32)
        .collect();
    let mut is_stash = vec![false; nv];
    for &v in &stash {
        is_stash[v as usize] = true;
    }
    let ratio: Vec<f64> = {
        let mut stamp = vec![NONE; j.len()];
        let mut stack = Vec::new();
        stash
            .iter()
            .map(|&v| {
                let p = j.def[v as usize];
                let mut cost = 0;
                stack.push(p);
                stamp[p as usize] = v;
                let mut visits = 0;
                while let Some(p) = stack.pop() {
                    cost += j.flops[p as usize];
                    visits += 1;
                    if visits > 64 {
                        break;
                    }
                    for &a in j.args(p as usize) {
                        let d = j.def[a as usize];
                        if j.forward[a as usize] && !is_stash[a as usize] && stamp[d as usize] != v
                        {
                            stamp[d as usize] = v;
                            stack.push(d);
                        }
                    }
                }
                stack.clear();
                cost as f64 / j.bytes[v as usize].max(1) as f64
            })
            .collect()
    };
    let family = |lambda: f64, t: u64| -> Vec<bool> {
        let mut keep = vec![false; nv];
        let mut acc = 0i64;
        for (k, &v) in stash.iter().enumerate() {
            let bytes = j.bytes[v as usize];
            if ratio[k] > lambda {
                keep[v as usize] = true;
            } else if acc + bytes as i64 > t as i64 {
                // Carry the unused part of `t` (negative) to the next run, so that a `t`
                // between multiples of the value sizes mixes runs of both lengths.
                keep[v as usize] = true;
                acc -= t as i64;
            } else {
                acc += bytes as i64;
            }
        }
        keep
    };
    let mut sorted = ratio.clone();
    sorted.sort_unstable_by(f64::total_cmp);
    let mut lambdas: Vec<f64> = (1..=8)
        .filter_map(|k| sorted.get((k * sorted.len()).div_ceil(8).saturating_sub(1)))
        .copied()
        .collect();
    lambdas.dedup();
    let t0 = stash
        .iter()
        .map(|&v| j.bytes[v as usize])
        .min()
        .unwrap_or(1)
        .max(1);
    let total: u64 = stash.iter().map(|&v| j.bytes[v as usize]).sum();
    for &lambda in &lambdas {
        let how = |t: u64| {
            move || {
                format!(
                    "values costing at most {lambda:.3} FLOPs/byte dropped, {t} bytes between kept ones"
                )
            }
        };
        // Double the segment until the peak fits, then bisect back: the recomputation grows
        // with the segment, so the smallest segment that fits is the cheapest in the family.
        let (mut lo, mut t) = (0, t0);
        loop {
            if consider(&mut seen, family(lambda, t), &how(t)) {
                let mut hi = t;
                for _ in 0..6 {
                    let mid = lo + (hi - lo) / 2;
                    if mid <= lo {
                        break;
                    }
                    if consider(&mut seen, family(lambda, mid), &how(mid)) {
                        hi = mid;
                    } else {
                        lo = mid;
                    }
                }
                break;
            }
            if t >= total {
                break;
            }
            lo = t;
            t = (t * 2).min(total);
        }
    }
    // The segment model's optimum for a range of model limits: bisect for the largest limit
    // whose plan fits (recomputation falls as the model's limit grows).
    if stash.len() <= SEGMENT_DP_VALUES {
        let segments = Segments::new(&j, &stash);
        // Too small a model limit has no split; too large a one a plan over the budget.
        let (mut lo, mut hi) = (0u64, total);
        for _ in 0..16 {
            if lo >= hi {
                break;
            }
            let mid = lo + (hi - lo).div_ceil(2);
            match segments.cheapest(mid) {
                None => lo = mid,
                Some(kept) => {
                    let mut keep = vec![false; nv];
                    for k in kept {
                        keep[stash[k] as usize] = true;
                    }
                    let how = || {
                        format!(
                            "checkpoints spaced for {mid} bytes of checkpoints and one recomputed run"
                        )
                    };
                    if consider(&mut seen, keep, &how) {
                        lo = mid;
                    } else {
                        hi = mid - 1;
                    }
                }
            }
        }
    }
    // Few candidates (small or U-Net-like graphs, where the family's runs in schedule order fit
    // badly): greedy descent from keeping them all, each step dropping the value that leaves
    // the lowest peak (then the least recomputation), while the peak does not rise.
    if stash.len() <= 64 && stash.len().pow(2) * j.len() <= 1 << 24 {
        let mut keep = vec![false; nv];
        for &v in &stash {
            keep[v as usize] = true;
        }
        let mut cur = eval(&keep);
        while cur.0 > limit {
            let mut step: Option<(u64, u64, u32)> = None;
            for &v in &stash {
                if keep[v as usize] {
                    keep[v as usize] = false;
                    let (peak, extra) = eval(&keep);
                    keep[v as usize] = true;
                    if peak <= cur.0 && step.is_none_or(|(p, e, _)| (peak, extra) < (p, e)) {
                        step = Some((peak, extra, v));
                    }
                }
            }
            let Some((peak, extra, v)) = step else { break };
            keep[v as usize] = false;
            cur = (peak, extra);
        }
        consider(&mut seen, keep, &|| "greedy descent".to_string());
    }
    // Small graphs: steepest descent from the best plan (or, with none, the lowest peak), each
    // step keeping or dropping one value or moving a checkpoint to the next value either side.
    if stash.len() <= 64 && stash.len().pow(2) * j.len() <= 1 << 24 {
        let start = match &seen.best {
            Some((_, _, keep, _)) => keep.clone(),
            None => seen.lowest.2.clone(),
        };
        let (found, how) = descend(start, &stash, limit, &eval);
        consider(&mut seen, found, &|| how.clone());
    }
    // Small graphs: branch and bound from the best plan so far; within its node limit it
    // proves that plan optimal, finds a better one, or proves that none fits.
    // First over the values backward ops read (fast), then over all forward values from its
    // result.
    let mut none_exists = false;
    if j.b <= EXACT_OPS {
        for space in [Space::Read, Space::Forward] {
            // Without a plan that fits, the lowest peak seen leads the way.
            let hint = match &seen.best {
                Some((_, _, keep, _)) => keep.clone(),
                None => seen.lowest.2.clone(),
            };
            let found = exact::search(&j, Goal::Cheapest(limit), space, Some(&hint), EXACT_NODES);
            none_exists |= space == Space::Forward && found.proven && found.keep.is_none();
            if let Some(keep) = found.keep {
                let how = format!(
                    "branch and bound over {} values{}",
                    if space == Space::Read {
                        "read"
                    } else {
                        "all forward"
                    },
                    if found.proven {
                        ", optimal"
                    } else {
                        ", stopped"
                    }
                );
                consider(&mut seen, keep, &|| how.clone());
            }
        }
    }
    let lowest = seen.lowest;
    match seen.best {
        Some((extra, peak, keep, how)) => Ok(Fit {
            checkpoints: values_of(&keep),
            peak_before: base,
            peak_after: peak,
            extra_flops: extra,
            chosen_by: how,
        }),
        None => Err(format!(
            "budget {} ({limit} bytes) is below the smallest peak remat found, {} ({} bytes, {}){}; the peak without remat is {}: give a budget of at least {} bytes",
            human(limit),
            human(lowest.0),
            lowest.0,
            lowest.1,
            if none_exists {
                ", and an exhaustive search shows that no choice of checkpoints fits it"
            } else {
                ""
            },
            human(base),
            lowest.0
        )),
    }
}

/// The candidates [`fit`] has judged: the best within the limit (extra FLOPs, peak, keep) and
/// the lowest peak (with how it was chosen).
struct Seen {
    limit: u64,
    best: Option<(u64, u64, Vec<bool>, String)>,
    lowest: (u64, String, Vec<bool>),
}

impl Seen {
    /// Records a candidate with its simulated peak and extra FLOPs; whether it fits.
    fn add(
        &mut self,
        keep: Vec<bool>,
        (peak, extra): (u64, u64),
        how: &dyn Fn() -> String,
    ) -> bool {
        if peak < self.lowest.0 {
            self.lowest = (peak, how(), keep.clone());
        }
        let ok = peak <= self.limit;
        if ok
            && self
                .best
                .as_ref()
                .is_none_or(|(e, p, _, _)| (extra, peak) < (*e, *p))
        {
            self.best = Some((extra, peak, keep, how()));
        }
        ok
    }
}

/// A plan's rank in the local search, lowest best: over the limit or not, then extra FLOPs and
/// peak (within it) or peak and extra FLOPs (over it).
type Score = (bool, u64, u64);

/// Local search from `keep` over the values `stash`: while some move improves the plan (a
/// plan within `limit` by less recomputation, then a lower peak; one over it by a lower peak,
/// then less recomputation), take the best move: keep or drop one value, or move a checkpoint
/// to the value before or after it. At most 2n steps of 3n simulations.
fn descend(
    mut keep: Vec<bool>,
    stash: &[u32],
    limit: u64,
    eval: &dyn Fn(&[bool]) -> (u64, u64),
) -> (Vec<bool>, String) {
    let score = |(peak, extra): (u64, u64)| -> Score {
        if peak <= limit {
            (false, extra, peak)
        } else {
            (true, peak, extra)
        }
    };
    let mut cur = score(eval(&keep));
    let mut steps = 0;
    for _ in 0..2 * stash.len() {
        // The best move: its score, the value toggled, and the neighbour kept instead.
        let mut step: Option<(Score, usize, Option<usize>)> = None;
        for k in 0..stash.len() {
            let v = stash[k] as usize;
            // Toggle `k`, or move `k`'s checkpoint to a dropped neighbour.
            let neighbours = [k.checked_sub(1), (k + 1 < stash.len()).then_some(k + 1)];
            let moves: Vec<Option<usize>> = std::iter::once(None)
                .chain(
                    neighbours
                        .into_iter()
                        .flatten()
                        .filter(|&n| keep[v] && !keep[stash[n] as usize])
                        .map(Some),
                )
                .collect();
            for other in moves {
                keep[v] = !keep[v];
                if let Some(n) = other {
                    keep[stash[n] as usize] = true;
                }
                let s = score(eval(&keep));
                if s < cur && step.as_ref().is_none_or(|(b, _, _)| s < *b) {
                    step = Some((s, k, other));
                }
                keep[v] = !keep[v];
                if let Some(n) = other {
                    keep[stash[n] as usize] = false;
                }
            }
        }
        let Some((s, k, other)) = step else { break };
        let v = stash[k] as usize;
        keep[v] = !keep[v];
        if let Some(n) = other {
            keep[stash[n] as usize] = true;
        }
        cur = s;
        steps += 1;
    }
    (keep, format!("local search, {steps} steps"))
}

/// Functions with at most this many forward ops get the branch and bound, each of its two runs
/// stopped after `EXACT_NODES` nodes (about 0.1 s together on the benchmark's graphs).
const EXACT_OPS: usize = 320;
const EXACT_NODES: u64 = 100_000;

/// The most values the backward pass reads for which [`Segments`] runs (its time is quadratic
/// in them).
const SEGMENT_DP_VALUES: usize = 256;

/// Gradient checkpointing's classic model, solved exactly by dynamic programming: the values
/// the backward pass reads, in schedule order, split into runs by the kept ones; the backward
/// pass recomputes a run while every kept value up to the run's end is held, so each run needs
/// the bytes kept so far plus its own within the model's limit, and costs the FLOPs of the
/// forward ops from its first value to its last. The model leaves out the backward pass's own
/// working set and the graph's branches: `fit` bisects the model's limit and simulates each
/// plan.
struct Segments {
    bytes: Vec<u64>,
    /// FLOPs of the forward ops up to and including each value's op.
    through: Vec<u64>,
}

impl Segments {
    fn new(j: &Joint, stash: &[u32]) -> Segments {
        let mut prefix = Vec::with_capacity(j.b + 1);
        prefix.push(0u64);
        for p in 0..j.b {
            prefix.push(prefix[p] + j.flops[p]);
        }
        let def = |v: u32| j.def[v as usize] as usize;
        Segments {
            bytes: stash.iter().map(|&v| j.bytes[v as usize]).collect(),
            through: stash.iter().map(|&v| prefix[def(v) + 1]).collect(),
        }
    }

    /// The indices to keep for the least recomputation under `limit`, or `None` when no
    /// split fits. Kept bytes are counted in units of `limit / 128` (rounded up, so a plan the
    /// units accept fits the limit): O(n · r · 128) for runs of at most r values.
    fn cheapest(&self, limit: u64) -> Option<Vec<usize>> {
        const UNITS: usize = 128;
        let n = self.bytes.len();
        let unit = (limit / UNITS as u64).max(1);
        let units = |b: u64| b.div_ceil(unit) as usize;
        // Bytes of the values strictly between `i` (`None`: the start) and `j`.
        let mut run = vec![0u64; n + 1];
        for k in 0..n {
            run[k + 1] = run[k] + self.bytes[k];
        }
        let between = |i: Option<usize>, j: usize| run[j] - run[i.map_or(0, |i| i + 1)];
        let cost = |i: Option<usize>, j: usize| {
            // Recomputing the values between: the forward ops after `i`'s up to the last of them.
            let from = i.map_or(0, |i| self.through[i]);
            if j == i.map_or(0, |i| i + 1) {
                0
            } else {
                self.through[j - 1] - from
            }
        };
        let width = UNITS + 1;
        // best[j][k]: least cost with `j` kept and `k` units kept up to it; `from` its parent.
        let mut best = vec![u64::MAX; n * width];
        let mut from = vec![(0usize, 0usize); n * width];
        let mut finish: Option<(u64, usize, usize)> = None;
        const START: usize = usize::MAX;
        for j in 0..=n {
            // Each way to end a run at `j` (a kept value, or the end when j == n): from the
            // start, or from a kept `i` with `k` units kept.
            let bj = if j < n { units(self.bytes[j]) } else { 0 };
            // Runs longer than the limit cannot end here, nor can any that start earlier.
            let first = (0..j)
                .rev()
                .find(|&i| between(Some(i), j) > limit)
                .map_or(0, |i| i + 1);
            let from_start = (between(None, j) <= limit).then_some((START, 0, 0u64));
            let starts = from_start.into_iter().chain((first..j).flat_map(|i| {
                let best = &best;
                (0..=UNITS).filter_map(move |k| {
                    let c = best[i * width + k];
                    (c != u64::MAX).then_some((i, k, c))
                })
            }));
            let mut updates = Vec::new();
            for (i, k, c) in starts {
                let i = (i != START).then_some(i);
                let k2 = k + bj;
                if k2 > UNITS || (k2 as u64) * unit + between(i, j) > limit {
                    continue;
                }
                let total = c.saturating_add(cost(i, j));
                let i = i.unwrap_or(START);
                if j == n {
                    if finish.is_none_or(|(b, _, _)| total < b) {
                        finish = Some((total, i, k));
                    }
                } else {
                    updates.push((k2, total, i, k));
                }
            }
            for (k2, total, i, k) in updates {
                if total < best[j * width + k2] {
                    best[j * width + k2] = total;
                    from[j * width + k2] = (i, k);
                }
            }
        }
        let (_, mut i, mut k) = finish?;
        let mut kept = Vec::new();
        while i != START {
            kept.push(i);
            (i, k) = from[i * width + k];
        }
        kept.reverse();
        Some(kept)
    }
}

impl From<f64> for Budget {
    /// A fraction of the peak without remat.
    fn from(x: f64) -> Budget {
        Budget::Fraction(x)
    }
}

impl From<u64> for Budget {
    /// Bytes.
    fn from(n: u64) -> Budget {
        Budget::Bytes(n)
    }
}

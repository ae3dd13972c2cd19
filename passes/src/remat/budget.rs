//! `remat{budget=...}`: the [`Budget`] type and [`fit`], the search for the least recomputation
//! whose simulated peak fits (the candidates are listed in the parent module's docs). Every
//! candidate is judged by the parent's `Joint` simulator; nothing is rewritten here.

use super::{Joint, NONE, Strategy, choose, no_backward, read_by_backward};
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
        });
    }
    // The best feasible candidate (extra FLOPs, peak, keep), and the lowest peak seen.
    let mut best: Option<(u64, u64, Vec<bool>)> = None;
    let mut lowest = (base, "no remat".to_string());
    let mut consider = |keep: Vec<bool>, how: &dyn Fn() -> String| -> bool {
        let (peak, extra) = eval(&keep);
        if peak < lowest.0 {
            lowest = (peak, how());
        }
        let ok = peak <= limit;
        if ok
            && best
                .as_ref()
                .is_none_or(|(e, p, _)| (extra, peak) < (*e, *p))
        {
            best = Some((extra, peak, keep));
        }
        ok
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
            consider(keep, &|| name.to_string());
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
            if consider(family(lambda, t), &how(t)) {
                let mut hi = t;
                for _ in 0..6 {
                    let mid = lo + (hi - lo) / 2;
                    if mid <= lo {
                        break;
                    }
                    if consider(family(lambda, mid), &how(mid)) {
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
        consider(keep, &|| "greedy descent".to_string());
    }
    match best {
        Some((extra, peak, keep)) => Ok(Fit {
            checkpoints: values_of(&keep),
            peak_before: base,
            peak_after: peak,
            extra_flops: extra,
        }),
        None => Err(format!(
            "budget {} ({limit} bytes) is below the smallest peak remat found, {} ({} bytes, {}); the peak without remat is {}: give a budget of at least {} bytes",
            human(limit),
            human(lowest.0),
            lowest.0,
            lowest.1,
            human(base),
            lowest.0
        )),
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

//! The fixed strategies' choices of checkpoints (`collection`, `names`, `speed`, `memory`),
//! and the facts they and the budget search read off the joint function: which forward values
//! the backward pass reads, and which values every forward path passes through.

use super::{Strategy, fit, no_backward};
use cranelift_entity::SecondaryMap;
use tcc_ir::{Function, OpKind, Value};

/// Whether a name marks a checkpoint for the `collection` strategy.
pub fn marked(name: &str) -> bool {
    name.split('/').any(|c| c == "checkpoint")
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
pub(super) fn read_by_backward(f: &Function, b: usize) -> Vec<Value> {
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

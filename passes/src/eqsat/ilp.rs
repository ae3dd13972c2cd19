//! Exact DAG extraction as an integer linear program (microlp: pure Rust, branch and bound),
//! for e-graphs small enough to solve.
//!
//! A binary `x_n` per e-node of the classes reachable from the roots, a level `t_c` per class:
//!
//! - each root class chooses a node: `Σ_{n ∈ r} x_n ≥ 1`;
//! - a chosen node's children are computed: `Σ_{m ∈ d} x_m ≥ x_n` for each child class `d`;
//! - no cycles: a chosen node's class sits above its children's,
//!   `t_c ≥ t_d + 1 - (C + 1)(1 - x_n)` (`C` classes; nodes that read their own class are out);
//! - minimise `Σ cost_n x_n`, each value counted once however many nodes read it: this is what
//!   makes a merged matrix product (cheaper only when both of its readers share it) winnable.
//!
//! The search starts from the best heuristic choice (a warm start) and stops at a node limit,
//! so it is deterministic and never worse than that choice; the caller still compares the
//! result with the other candidates under the whole-program model.

use super::extract::{Selection, close, node_cost};
use super::lang::{Node, TensorAnalysis};
use crate::analysis::cost::Machine;
use egg::{EGraph, Id, Language};
use microlp::{ComparisonOp, OptimizationDirection, Problem, SolveOptions, Variable};
use std::collections::HashMap;

type G = EGraph<Node, TensorAnalysis>;

/// The classes reachable from `roots` through any node, in discovery order.
fn reachable(eg: &G, roots: &[Id]) -> Vec<Id> {
    let mut seen: HashMap<Id, ()> = HashMap::new();
    let mut order = Vec::new();
    let mut stack: Vec<Id> = roots.iter().map(|&r| eg.find(r)).collect();
    while let Some(c) = stack.pop() {
        if seen.insert(c, ()).is_some() {
            continue;
        }
        order.push(c);
        for n in &eg[c].nodes {
            stack.extend(n.children().iter().map(|&ch| eg.find(ch)));
        }
    }
    order
}

/// The optimal DAG choice for `roots`, if the e-graph has at most `max_nodes` reachable
/// e-nodes and the solver finds one within `node_limit` branch-and-bound nodes. `start` (a
/// valid choice) seeds the search.
pub fn extract(
    eg: &G,
    roots: &[Id],
    m: &Machine,
    start: &Selection,
    max_nodes: usize,
    node_limit: u64,
) -> Option<Selection> {
    let classes = reachable(eg, roots);
    let total: usize = classes.iter().map(|&c| eg[c].nodes.len()).sum();
    if total > max_nodes {
        return None;
    }
    let mut p = Problem::new(OptimizationDirection::Minimize);
    let big = (classes.len() + 1) as f64;
    let level: HashMap<Id, Variable> = classes
        .iter()
        .map(|&c| (c, p.add_var(0.0, (0.0, big))))
        .collect();
    // Costs in microseconds, ops at least a nanosecond (keeps the coefficients in range).
    let mut x: HashMap<(Id, usize), Variable> = HashMap::new();
    for &c in &classes {
        for (i, n) in eg[c].nodes.iter().enumerate() {
            if n.children().iter().any(|&ch| eg.find(ch) == c) {
                continue;
            }
            let cost = match n {
                Node::Op(..) => (node_cost(eg, c, n, m) * 1e6).max(1e-3),
                _ => 0.0,
            };
            x.insert((c, i), p.add_binary_var(cost));
        }
    }
    let vars_of = |c: Id| -> Vec<(Variable, f64)> {
        (0..eg[c].nodes.len())
            .filter_map(|i| x.get(&(c, i)).map(|&v| (v, 1.0)))
            .collect()
    };
    for &r in roots {
        p.add_constraint(vars_of(eg.find(r)), ComparisonOp::Ge, 1.0);
    }
    for &c in &classes {
        for (i, n) in eg[c].nodes.iter().enumerate() {
            let Some(&xn) = x.get(&(c, i)) else { continue };
            let mut children: Vec<Id> = n.children().iter().map(|&ch| eg.find(ch)).collect();
            children.sort_unstable();
            children.dedup();
            for d in children {
                let mut e = vars_of(d);
                e.push((xn, -1.0));
                p.add_constraint(e, ComparisonOp::Ge, 0.0);
                p.add_constraint(
                    [(level[&c], 1.0), (level[&d], -1.0), (xn, -big)],
                    ComparisonOp::Ge,
                    1.0 - big,
                );
            }
        }
    }
    // The warm start: the start's nodes, and its classes' depths as levels.
    let mut depth: HashMap<Id, f64> = HashMap::new();
    for (&c, n) in &start.choice {
        let d = (n.children().iter())
            .map(|ch| depth.get(&eg.find(*ch)).copied().unwrap_or(0.0) + 1.0)
            .fold(0.0, f64::max);
        depth.insert(c, d);
    }
    let mut hint = Vec::new();
    for &c in &classes {
        hint.push((level[&c], depth.get(&c).copied().unwrap_or(0.0)));
        let chosen = start.choice.get(&c);
        for (i, n) in eg[c].nodes.iter().enumerate() {
            if let Some(&v) = x.get(&(c, i)) {
                let on = chosen.is_some_and(|s| s == &n.clone().map_children(|ch| eg.find(ch)));
                hint.push((v, if on { 1.0 } else { 0.0 }));
            }
        }
    }
    let mut options = SolveOptions::default();
    options.node_limit = Some(node_limit);
    options.warm_start = Some(hint);
    let solution = p.solve_with(options).ok()?.into_solution().ok()?;
    // Each class's chosen node (the cheapest chosen, should several be).
    let mut pick: HashMap<Id, Node> = HashMap::new();
    for &c in &classes {
        let chosen = (0..eg[c].nodes.len())
            .filter(|i| {
                x.get(&(c, *i))
                    .is_some_and(|&v| solution.var_value(v) > 0.5)
            })
            .min_by(|&a, &b| {
                let (na, nb) = (&eg[c].nodes[a], &eg[c].nodes[b]);
                node_cost(eg, c, na, m).total_cmp(&node_cost(eg, c, nb, m))
            });
        if let Some(i) = chosen {
            pick.insert(c, eg[c].nodes[i].clone());
        }
    }
    close(eg, roots, &pick)
}

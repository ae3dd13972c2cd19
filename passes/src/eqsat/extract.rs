//! Choosing one e-node per needed e-class: the program the pass writes back.
//!
//! Costs are the roofline times of `analysis::cost`, and the cost of a choice is counted on the
//! DAG it makes: an e-class computed once costs once however many readers it has (egg's
//! `Extractor` counts it once per use, which is wrong for tensor programs). Candidates:
//!
//! - the *original* choice: each e-class computed as the earliest value of the input that lies
//!   in it (acyclic, because every such node reads earlier values only);
//! - the *greedy* choice: each e-class's cheapest node by tree cost, computed bottom-up to a
//!   fixed point (acyclic: every op node costs more than its children).
//!
//! The pass keeps the candidate whose whole-program estimate ([`Dag::time`], which also counts
//! fused elementwise chains as one memory pass) is lowest, preferring the original on a tie, so
//! it never returns a program it estimates to be slower than its input.

use super::lang::{Node, Tag, TensorAnalysis, kind_of, operands};
use crate::analysis::cost::{self, Dag, DagOp, Machine, Operand};
use egg::{EGraph, Id, Language};
use indexmap::IndexMap;
use std::collections::HashMap;
use tcc_ir::TensorType;

type G = EGraph<Node, TensorAnalysis>;

/// One node per e-class reachable from the roots, children canonical; iteration order is a
/// topological order (children first).
#[derive(Clone, Debug, Default)]
pub struct Selection {
    /// The chosen node of each e-class.
    pub choice: IndexMap<Id, Node>,
}

/// The closure of `roots` under `pick`, children first; `None` if the picks form a cycle.
pub fn close(eg: &G, roots: &[Id], pick: &HashMap<Id, Node>) -> Option<Selection> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    let mut mark: HashMap<Id, Mark> = HashMap::new();
    let mut choice = IndexMap::new();
    for &root in roots {
        let root = eg.find(root);
        if mark.contains_key(&root) {
            continue;
        }
        // Iterative depth-first search: (class, next child to visit).
        let mut stack = vec![(root, 0usize)];
        mark.insert(root, Mark::Open);
        while let Some(&mut (c, ref mut next)) = stack.last_mut() {
            let node = pick.get(&c)?;
            if let Some(&child) = node.children().get(*next) {
                *next += 1;
                let child = eg.find(child);
                match mark.get(&child) {
                    Some(Mark::Open) => return None,
                    Some(Mark::Done) => {}
                    None => {
                        mark.insert(child, Mark::Open);
                        stack.push((child, 0));
                    }
                }
            } else {
                stack.pop();
                mark.insert(c, Mark::Done);
                choice.insert(c, node.clone().map_children(|ch| eg.find(ch)));
            }
        }
    }
    Some(Selection { choice })
}

/// The cost of one node when choosing: its kernel's time, an elementwise op counted as part of
/// a fused chain (its arithmetic and one pass over its result), plus a picosecond per op so that
/// every op costs more than its operands.
pub fn node_cost(eg: &G, class: Id, node: &Node, m: &Machine) -> f64 {
    const EPSILON: f64 = 1e-12;
    let Node::Op(tag, children) = node else {
        return 0.0;
    };
    let Tag::Op(id) = tag else {
        return EPSILON;
    };
    let kind = kind_of(eg, *id, children);
    let Some(ty) = eg[class].data.ty.as_ref() else {
        return EPSILON;
    };
    let args: Vec<&TensorType> = operands(node)
        .iter()
        .filter_map(|&a| eg[a].data.ty.as_ref())
        .collect();
    if cost::is_free(&kind) || operands(node).iter().all(|&a| eg[a].data.konst.is_some()) {
        return EPSILON;
    }
    let flops = cost::op_flops(&kind, &args, &[ty]);
    EPSILON
        + if kind.is_elementwise() {
            m.body_time(flops, ty.size_bytes())
        } else {
            let bytes: u64 = args.iter().map(|t| t.size_bytes()).sum::<u64>() + ty.size_bytes();
            m.kernel_time(flops, bytes)
        }
}

/// Each class's cheapest node by tree cost.
pub fn greedy(eg: &G, m: &Machine) -> HashMap<Id, Node> {
    let mut best: HashMap<Id, (f64, Node)> = HashMap::new();
    loop {
        let mut changed = false;
        for class in eg.classes() {
            for node in &class.nodes {
                let mut sum = node_cost(eg, class.id, node, m);
                let mut ready = true;
                for &c in node.children() {
                    match best.get(&eg.find(c)) {
                        Some((x, _)) => sum += x,
                        None => ready = false,
                    }
                }
                let sum = sum.min(f64::MAX);
                if ready && best.get(&class.id).is_none_or(|(b, _)| sum < *b) {
                    best.insert(class.id, (sum, node.clone()));
                    changed = true;
                }
            }
        }
        if !changed {
            break;
        }
    }
    best.into_iter().map(|(c, (_, n))| (c, n)).collect()
}

/// The program a selection describes, for the time model.
pub fn dag(eg: &G, sel: &Selection, roots: &[Id]) -> Dag {
    let mut index: HashMap<Id, Operand> = HashMap::new();
    let mut d = Dag::default();
    for (&class, node) in &sel.choice {
        let ty = || eg[class].data.ty.clone();
        let operand = match node {
            Node::Attr(_) => continue,
            Node::Param(_) => Operand::Input(ty().expect("a tensor")),
            Node::Const(_) => Operand::Const(ty().expect("a tensor")),
            Node::Op(tag, children) => {
                let kind = match tag {
                    Tag::Op(id) => kind_of(eg, *id, children),
                    // An op left alone: counted as an identity of its first result (what it costs
                    // is the same in every candidate).
                    Tag::Opaque(_) => tcc_ir::OpKind::Identity,
                };
                let args = operands(node).iter().map(|c| index[c].clone()).collect();
                d.ops.push(DagOp {
                    kind,
                    args,
                    ty: ty().expect("a tensor"),
                    returned: false,
                });
                Operand::Op(d.ops.len() - 1)
            }
        };
        index.insert(class, operand);
    }
    for r in roots {
        if let Some(Operand::Op(i)) = index.get(&eg.find(*r)) {
            d.ops[*i].returned = true;
        }
    }
    d
}

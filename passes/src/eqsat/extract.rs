//! Choosing one e-node per needed e-class: the program the pass writes back.
//!
//! Costs are the roofline times of `analysis::cost`, and the cost of a choice is counted on the
//! DAG it makes: an e-class computed once costs once however many readers it has (egg's
//! `Extractor` counts it once per use, which is wrong for tensor programs). Candidates:
//!
//! - the *original* choice: each e-class computed as the earliest value of the input that lies
//!   in it (acyclic, because every such node reads earlier values only): the input with equal
//!   values merged;
//! - the *greedy* choice: each e-class's cheapest node by tree cost, computed bottom-up to a
//!   fixed point (acyclic: every op node costs more than its children), ties going to the
//!   input's node;
//! - the best of those *improved* ([`improve`]): classes switch one at a time where the switch
//!   lowers the cost with shared values counted once and the classes it leaves unread saved;
//! - the best so far with *shared* values introduced ([`share`]): a class switches to a node
//!   whose new inputs other classes could read too, those readers then switch, and the move is
//!   kept if the whole program's estimate drops (merged products that pay only once several
//!   gates read them);
//! - the exact choice of the integer program (`ilp`), seeded with the best so far, on e-graphs
//!   small enough.
//!
//! The pass writes back the candidate whose whole-program estimate ([`Dag::time`], which also
//! counts fused elementwise chains as one memory pass) is lowest, and only if it is lower than
//! the input's by the pass's `min-gain`: it never returns a program it estimates to be slower.

use super::encode::{Encoded, values};
use super::lang::{Node, Tag, TensorAnalysis, kind_of, operands};
use crate::analysis::cost::{self, Dag, DagOp, Machine, Operand, Traffic};
use egg::{EGraph, Id, Language};
use indexmap::IndexMap;
use std::collections::HashMap;
use tcc_ir::TensorType;

type G = EGraph<Node, TensorAnalysis>;

/// A picosecond: what every op costs at least.
const EPSILON: f64 = 1e-12;

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
    if cost::is_free(&kind) || operands(node).iter().all(|&a| eg[a].data.constant) {
        return EPSILON;
    }
    let flops = cost::time_flops(&kind, &args, &[ty]);
    EPSILON
        + if kind.is_elementwise() {
            m.body_time(&kind, flops, Traffic::memory(ty.size_bytes()))
        } else {
            // Seen one node at a time, a constant is cached if it fits by itself.
            let mut bytes = Traffic::memory(ty.size_bytes());
            for &a in operands(node) {
                let size = eg[a].data.ty.as_ref().map_or(0, |t| t.size_bytes());
                if eg[a].data.constant && m.fits_in_cache(size) {
                    bytes.cached += size;
                } else {
                    bytes.memory += size;
                }
            }
            m.kernel_time(&kind, flops, bytes)
        }
}

/// The input's own choice: each e-class computed as the earliest input value it holds (and
/// attribute classes as their leaf).
pub fn input_choice(f: &tcc_ir::Function, enc: &Encoded) -> HashMap<Id, Node> {
    let mut pick = HashMap::new();
    for v in values(f) {
        if let Some(n) = enc.node_of(v) {
            pick.entry(enc.class_of(v)).or_insert(n);
        }
    }
    for class in enc.egraph.classes() {
        if let Some(n @ Node::Attr(_)) = class.nodes.first() {
            pick.entry(class.id).or_insert_with(|| n.clone());
        }
    }
    pick
}

/// Each class's cheapest node by tree cost; on a tie, the node `prefer` picks for the class
/// (the input's), so that equal-cost rewrites do not churn the program. A worklist: a class is
/// looked at again only when one of its children got cheaper.
pub fn greedy(eg: &G, m: &Machine, prefer: &HashMap<Id, Node>) -> HashMap<Id, Node> {
    // Each node's own cost, computed once.
    let own: HashMap<Id, Vec<f64>> = eg
        .classes()
        .map(|class| {
            let preferred = prefer.get(&class.id);
            let costs = (class.nodes.iter())
                .map(|n| {
                    node_cost(eg, class.id, n, m)
                        - if preferred == Some(n) {
                            EPSILON / 2.0
                        } else {
                            0.0
                        }
                })
                .collect();
            (class.id, costs)
        })
        .collect();
    let mut best: HashMap<Id, (f64, usize)> = HashMap::new();
    let mut queue: std::collections::VecDeque<Id> = eg.classes().map(|c| c.id).collect();
    let mut queued: std::collections::HashSet<Id> = queue.iter().copied().collect();
    while let Some(c) = queue.pop_front() {
        queued.remove(&c);
        let class = &eg[c];
        let mut improved = false;
        for (i, node) in class.nodes.iter().enumerate() {
            let mut sum = own[&c][i];
            let ready = node
                .children()
                .iter()
                .all(|&ch| match best.get(&eg.find(ch)) {
                    Some((x, _)) => {
                        sum += x;
                        true
                    }
                    None => false,
                });
            let sum = sum.min(f64::MAX);
            if ready && best.get(&c).is_none_or(|(b, _)| sum < *b) {
                best.insert(c, (sum, i));
                improved = true;
            }
        }
        if improved {
            for p in class.parents() {
                let p = eg.find(p);
                if queued.insert(p) {
                    queue.push_back(p);
                }
            }
        }
    }
    best.into_iter()
        .map(|(c, (_, i))| (c, eg[c].nodes[i].clone()))
        .collect()
}

/// The program a selection describes, for the time model; `results` are the classes the
/// program returns.
pub fn dag(eg: &G, sel: &Selection, results: &[Id]) -> Dag {
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
                    // An op left alone costs once, with its first result.
                    Tag::Opaque(i) => {
                        let o = &eg.analysis.tables.opaque[*i as usize];
                        match o.result {
                            0 => o.kind.clone(),
                            _ => tcc_ir::OpKind::Identity,
                        }
                    }
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
    for r in results {
        if let Some(Operand::Op(i)) = index.get(&eg.find(*r)) {
            d.ops[*i].returned = true;
        }
    }
    d
}

/// Classes with the nodes chosen for them.
type Picks = Vec<(Id, Node)>;

/// Improves a choice one e-class at a time, counting shared values once: a class switches to
/// another of its nodes when that node's cost, plus the classes it needs that the choice does
/// not compute yet (taken as `fallback` picks them), is below the current node's cost. Classes
/// the choice computes already are free to read, provided they come before the class in the
/// choice's order (so no cycle can form). This catches what tree costs miss: `x^0.75` as
/// `sqrt(a) * sqrt(sqrt(a))` reads `a` twice, which a tree cost counts twice (with everything
/// above `a`) and a DAG once. A switch also saves the classes it leaves unread. `sweep` says
/// how many rounds and which classes may switch.
pub fn improve(
    eg: &G,
    roots: &[Id],
    start: &Selection,
    fallback: &HashMap<Id, Node>,
    m: &Machine,
    sweep: &Sweep,
) -> Selection {
    let mut sel = start.clone();
    let mut counts = reads(eg, roots, &sel);
    for _ in 0..sweep.rounds {
        let mut changed = false;
        let classes: Vec<Id> = sel
            .choice
            .keys()
            .copied()
            .filter(|c| sweep.may_switch(*c))
            .collect();
        for c in classes {
            let Some(pos) = sel.choice.get_index_of(&c) else {
                continue;
            };
            let current = node_cost(eg, c, &sel.choice[&c], m);
            let mut best: Option<(f64, Node, Picks)> = None;
            for n in &eg[c].nodes {
                let n = n.clone().map_children(|ch| eg.find(ch));
                if n == sel.choice[&c] {
                    continue;
                }
                let Some((extra, added)) = needs(eg, &sel, fallback, c, pos, &n, m) else {
                    continue;
                };
                let freed = freed(eg, &sel, &counts, &sel.choice[&c], &n, m);
                let delta = node_cost(eg, c, &n, m) + extra - current - freed;
                if delta < -EPSILON && best.as_ref().is_none_or(|(d, _, _)| delta < *d) {
                    best = Some((delta, n, added));
                }
            }
            if let Some((_, n, added)) = best {
                let mut pick: HashMap<Id, Node> = sel.choice.clone().into_iter().collect();
                pick.insert(c, n);
                pick.extend(added);
                if let Some(next) = close(eg, roots, &pick) {
                    sel = next;
                    counts = reads(eg, roots, &sel);
                    changed = true;
                }
            }
        }
        if !changed {
            break;
        }
    }
    sel
}

/// Which classes [`improve`] may switch, and for how many rounds.
pub struct Sweep {
    /// How many sweeps at most (fewer once one changes nothing).
    pub rounds: usize,
    /// Only these classes (all when `None`).
    pub only: Option<std::collections::HashSet<Id>>,
    /// This class keeps its node.
    pub pinned: Option<Id>,
}

impl Sweep {
    /// Every class, for `rounds` rounds.
    pub fn all(rounds: usize) -> Sweep {
        Sweep {
            rounds,
            only: None,
            pinned: None,
        }
    }

    fn may_switch(&self, c: Id) -> bool {
        self.pinned != Some(c) && self.only.as_ref().is_none_or(|o| o.contains(&c))
    }
}

/// How many chosen nodes read each class of `sel` (each reader once), the roots counting as
/// one more each.
fn reads(eg: &G, roots: &[Id], sel: &Selection) -> HashMap<Id, usize> {
    let mut counts: HashMap<Id, usize> = HashMap::new();
    for &r in roots {
        *counts.entry(eg.find(r)).or_default() += 1;
    }
    for node in sel.choice.values() {
        for c in kids(eg, node) {
            *counts.entry(c).or_default() += 1;
        }
    }
    counts
}

/// The distinct classes among `ids`, canonical.
fn distinct(eg: &G, ids: impl Iterator<Item = Id>) -> Vec<Id> {
    let mut v: Vec<Id> = ids.map(|c| eg.find(c)).collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// The classes node `n` reads, each once.
fn kids(eg: &G, n: &Node) -> Vec<Id> {
    distinct(eg, n.children().iter().copied())
}

/// The e-classes with a node reading class `d`.
fn reading_classes(eg: &G, d: Id) -> Vec<Id> {
    distinct(eg, eg[d].parents())
}

/// The cost of the classes that replacing `old` by `new` leaves unread: read only by `old`
/// (not by `new`), then those read only by them, and so on.
fn freed(
    eg: &G,
    sel: &Selection,
    counts: &HashMap<Id, usize>,
    old: &Node,
    new: &Node,
    m: &Machine,
) -> f64 {
    let mut left: HashMap<Id, usize> = HashMap::new();
    let keep: Vec<Id> = kids(eg, new);
    let mut stack = kids(eg, old);
    let mut cost = 0.0;
    while let Some(d) = stack.pop() {
        if keep.contains(&d) {
            continue;
        }
        let n = left
            .entry(d)
            .or_insert_with(|| counts.get(&d).copied().unwrap_or(0));
        *n = n.saturating_sub(1);
        if *n == 0
            && let Some(node) = sel.choice.get(&d)
        {
            cost += node_cost(eg, d, node, m);
            stack.extend(kids(eg, node));
        }
    }
    cost
}

/// What choosing `n` for class `c` (at `pos` in `sel`'s order) adds: the cost of the classes
/// it needs that `sel` lacks, with their picks; `None` if it would read `c` or a class `sel`
/// orders after `c`.
fn needs(
    eg: &G,
    sel: &Selection,
    fallback: &HashMap<Id, Node>,
    c: Id,
    pos: usize,
    n: &Node,
    m: &Machine,
) -> Option<(f64, Picks)> {
    let mut added: Picks = Vec::new();
    let mut seen: std::collections::HashSet<Id> = std::collections::HashSet::new();
    let mut cost = 0.0;
    let mut stack: Vec<Id> = n.children().iter().map(|&ch| eg.find(ch)).collect();
    while let Some(d) = stack.pop() {
        if d == c {
            return None;
        }
        if let Some(p) = sel.choice.get_index_of(&d) {
            // A class ordered later might read `c`, unless it is a leaf (a weight).
            if p > pos && !sel.choice[p].is_leaf() {
                return None;
            }
            continue;
        }
        if !seen.insert(d) {
            continue;
        }
        let pick = fallback.get(&d)?.clone().map_children(|ch| eg.find(ch));
        cost += node_cost(eg, d, &pick, m);
        stack.extend(pick.children().iter().copied());
        added.push((d, pick));
    }
    Some((cost, added))
}

/// Improves a choice by the moves [`improve`] cannot see, where one value pays only once
/// several readers share it (the merged product that the slices of eight gates read: one gate
/// switching to it alone costs the whole product). A move switches one class to a node that
/// needs new classes, at least one of which other e-classes could read too, then lets
/// [`improve`] switch those readers; it is kept when the whole program's estimate
/// ([`Dag::time`]) drops. Each distinct set of new classes is tried once, up to `limit` moves,
/// classes in the choice's order (the earliest reader of a shared value must make the move, as
/// a class reads only classes ordered before it).
pub fn share(
    eg: &G,
    roots: &[Id],
    results: &[Id],
    start: &Selection,
    fallback: &HashMap<Id, Node>,
    m: &Machine,
    limit: usize,
) -> Selection {
    let time = |s: &Selection| dag(eg, s, results).time(m);
    let mut best = (time(start), start.clone());
    let mut tried: std::collections::HashSet<Vec<Id>> = std::collections::HashSet::new();
    let classes: Vec<Id> = start.choice.keys().copied().collect();
    for c in classes {
        let sel = &best.1;
        let Some(pos) = sel.choice.get_index_of(&c) else {
            continue;
        };
        let mut moves = Vec::new();
        for n in &eg[c].nodes {
            let n = n.clone().map_children(|ch| eg.find(ch));
            if n == sel.choice[&c] {
                continue;
            }
            let Some((_, added)) = needs(eg, sel, fallback, c, pos, &n, m) else {
                continue;
            };
            let mut key: Vec<Id> = added.iter().map(|&(d, _)| d).collect();
            key.sort_unstable();
            if key.iter().any(|&d| reading_classes(eg, d).len() > 1) && tried.insert(key.clone()) {
                moves.push((n, added, key));
            }
        }
        for (n, added, key) in moves {
            if tried.len() > limit {
                return best.1;
            }
            let mut pick: HashMap<Id, Node> = best.1.choice.clone().into_iter().collect();
            pick.insert(c, n);
            pick.extend(added);
            let Some(next) = close(eg, roots, &pick) else {
                continue;
            };
            // The readers of the new classes switch while `c` holds the shared value; then
            // `c` may switch back. Only they can gain, so only they are swept (a sweep over the
            // whole program per move costs seconds on graphs with thousands of classes).
            let mut only: std::collections::HashSet<Id> = std::collections::HashSet::new();
            only.insert(c);
            for &d in &key {
                only.extend(reading_classes(eg, d));
            }
            let sweep = Sweep {
                rounds: 2,
                only: Some(only),
                pinned: Some(c),
            };
            let next = improve(eg, roots, &next, fallback, m, &sweep);
            let sweep = Sweep {
                rounds: 1,
                pinned: None,
                ..sweep
            };
            let next = improve(eg, roots, &next, fallback, m, &sweep);
            let t = time(&next);
            if t < best.0 {
                best = (t, next);
            }
        }
    }
    best.1
}

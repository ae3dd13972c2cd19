//! A function into an e-graph: one e-node per scheduled op, in schedule order.
//!
//! Opaque (left exactly as they are, each result an `opaque{i}` node over its operands): ops
//! with more than one result, ops with side effects, swaps between memory spaces (placed where
//! they are on purpose), `stop_gradient` (a boundary autodiff reads), and every op that has control dependencies or is one. Everything else is an ordinary
//! node; two ops computing the same thing from the same operands share one e-class, so the pass
//! subsumes `cse`.

use super::lang::{Node, OpaqueEntry, ParamRef, Tables, Tag, TensorAnalysis, has_attrs};
use cranelift_entity::SecondaryMap;
use egg::{EGraph, Id};
use tcc_ir::{Function, Op, OpKind, Value};

/// A function's e-graph and how its values map into it.
pub struct Encoded {
    /// The e-graph.
    pub egraph: EGraph<Node, TensorAnalysis>,
    /// The e-class of each parameter and scheduled op result.
    pub class: SecondaryMap<Value, Option<Id>>,
    /// The e-node each parameter and scheduled op result was encoded as (children as then).
    pub node: SecondaryMap<Value, Option<Node>>,
    /// Whether an op is opaque.
    pub opaque: SecondaryMap<Op, bool>,
    /// The function's results, then the operands of opaque ops: what extraction must compute.
    pub roots: Vec<Id>,
}

/// Whether `op` must stay as it is: see the module docs.
fn is_opaque(f: &Function, op: Op, dep_target: &SecondaryMap<Op, bool>) -> bool {
    let d = f.op(op);
    d.results.len() != 1
        || !d.deps.is_empty()
        || dep_target[op]
        || d.kind.has_side_effects()
        || d.kind.is_swap()
        || matches!(d.kind, OpKind::StopGradient)
}

/// Encodes `f`. Constants up to `fold_limit` elements (and splats) are interned by content.
pub fn encode(f: &Function, fold_limit: u64) -> Encoded {
    let mut dep_target = SecondaryMap::with_capacity(f.num_ops_created());
    for &op in f.schedule() {
        for &d in &f.op(op).deps {
            dep_target[d] = true;
        }
    }
    let tables = Tables::new(f.params().iter().map(|&p| f.ty(p).clone()).collect());
    let mut enc = Encoded {
        egraph: EGraph::new(TensorAnalysis {
            tables,
            fold_limit,
            rule: None,
            error: None,
        }),
        class: SecondaryMap::with_capacity(f.num_values_created()),
        node: SecondaryMap::with_capacity(f.num_values_created()),
        opaque: SecondaryMap::with_capacity(f.num_ops_created()),
        roots: Vec::new(),
    };
    for (i, &p) in f.params().iter().enumerate() {
        enc.add(p, Node::Param(ParamRef(i as u32)));
    }
    let mut opaque_roots: Vec<Id> = Vec::new();
    for &op in f.schedule() {
        let d = f.op(op);
        let args: Vec<Id> = d.args.iter().map(|&a| enc.class_of(a)).collect();
        if is_opaque(f, op, &dep_target) {
            enc.opaque[op] = true;
            opaque_roots.extend(&args);
            for (r, &v) in d.results.iter().enumerate() {
                let t = &mut enc.egraph.analysis.tables;
                let i = t.opaque.len() as u32;
                t.opaque.push(OpaqueEntry {
                    op,
                    result: r,
                    kind: d.kind.clone(),
                    ty: f.ty(v).clone(),
                });
                enc.add(v, Node::Op(Tag::Opaque(i), args.clone()));
            }
            continue;
        }
        let n = match &d.kind {
            OpKind::Const { ty, value } => {
                let small = value.as_splat().is_some() || ty.numel() <= fold_limit;
                let t = &mut enc.egraph.analysis.tables;
                Node::Const(t.intern_const(ty, small.then(|| value.clone()), Some(d.results[0])))
            }
            kind => {
                let id = kind.id();
                let mut children = args;
                if has_attrs(id) {
                    let a = enc.egraph.analysis.tables.intern_kind(kind.clone());
                    children.push(enc.egraph.add(Node::Attr(a)));
                }
                Node::Op(Tag::Op(id), children)
            }
        };
        enc.add(d.results[0], n);
    }
    enc.roots = f.results().iter().map(|&r| enc.class_of(r)).collect();
    enc.roots.extend(opaque_roots);
    enc
}

impl Encoded {
    /// Adds `n` as the e-node of `v`.
    fn add(&mut self, v: Value, n: Node) {
        self.class[v] = Some(self.egraph.add(n.clone()));
        self.node[v] = Some(n);
    }

    /// The e-class of an encoded value (canonical now).
    pub fn class_of(&self, v: Value) -> Id {
        self.egraph
            .find(self.class[v].expect("values are encoded before use"))
    }

    /// The e-node an encoded value was encoded as, its children canonical now.
    pub fn node_of(&self, v: Value) -> Option<Node> {
        let n = self.node[v].clone()?;
        Some(egg::Language::map_children(n, |c| self.egraph.find(c)))
    }
}

/// The values of `f` an encoding holds, in order: the parameters, then each scheduled op's
/// results.
pub fn values(f: &Function) -> impl Iterator<Item = Value> + '_ {
    let results = f.schedule().iter().flat_map(|&op| f.op(op).results.iter());
    f.params().iter().chain(results).copied()
}

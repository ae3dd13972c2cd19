//! A function into an e-graph: one e-node per scheduled op, in schedule order.
//!
//! Opaque (left exactly as they are, each result an `opaque{i}` node over its operands): ops
//! with more than one result, ops with side effects, `stop_gradient` (a boundary autodiff
//! reads), and every op that has control dependencies or is one. Everything else is an ordinary
//! node; two ops computing the same thing from the same operands share one e-class, so the pass
//! subsumes `cse`.

use super::lang::{Node, ParamRef, Tables, Tag, TensorAnalysis, has_attrs};
use cranelift_entity::SecondaryMap;
use egg::{EGraph, Id};
use tcc_ir::{Function, Op, OpKind, Value};

/// A function's e-graph and how its values map into it.
pub struct Encoded {
    /// The e-graph.
    pub egraph: EGraph<Node, TensorAnalysis>,
    /// The e-class of each parameter and scheduled op result.
    pub class: SecondaryMap<Value, Option<Id>>,
    /// The e-node each scheduled non-opaque op was encoded as (its children as then).
    pub node: SecondaryMap<Op, Option<Node>>,
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
    let mut egraph = EGraph::new(TensorAnalysis {
        tables,
        fold_limit,
        rule: None,
        error: None,
    });
    let mut class = SecondaryMap::with_capacity(f.num_values_created());
    let mut node = SecondaryMap::with_capacity(f.num_ops_created());
    let mut opaque = SecondaryMap::with_capacity(f.num_ops_created());
    let mut roots = Vec::new();
    for (i, &p) in f.params().iter().enumerate() {
        class[p] = Some(egraph.add(Node::Param(ParamRef(i as u32))));
    }
    let cls = |class: &SecondaryMap<Value, Option<Id>>, v: Value| {
        class[v].expect("operands are defined before use")
    };
    for &op in f.schedule() {
        let d = f.op(op);
        let args: Vec<Id> = d.args.iter().map(|&a| cls(&class, a)).collect();
        if is_opaque(f, op, &dep_target) {
            opaque[op] = true;
            roots.extend(&args);
            for (r, &v) in d.results.iter().enumerate() {
                let t = &mut egraph.analysis.tables;
                let i = t.opaque.len() as u32;
                t.opaque.push(super::lang::OpaqueEntry {
                    op,
                    result: r,
                    kind: d.kind.clone(),
                    ty: f.ty(v).clone(),
                });
                class[v] = Some(egraph.add(Node::Op(Tag::Opaque(i), args.clone())));
            }
            continue;
        }
        let n = match &d.kind {
            OpKind::Const { ty, value } => {
                let small = value.as_splat().is_some() || ty.numel() <= fold_limit;
                let t = &mut egraph.analysis.tables;
                Node::Const(t.intern_const(ty, small.then(|| value.clone()), Some(d.results[0])))
            }
            kind => {
                let id = kind.id();
                let mut children = args;
                if has_attrs(id) {
                    let a = egraph.analysis.tables.intern_kind(kind.clone());
                    children.push(egraph.add(Node::Attr(a)));
                }
                Node::Op(Tag::Op(id), children)
            }
        };
        class[d.results[0]] = Some(egraph.add(n.clone()));
        node[op] = Some(n);
    }
    roots.splice(0..0, f.results().iter().map(|&r| cls(&class, r)));
    Encoded {
        egraph,
        class,
        node,
        opaque,
        roots,
    }
}

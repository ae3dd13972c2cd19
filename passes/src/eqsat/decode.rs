//! A selection back into the function, in place.
//!
//! An op of the input whose node was chosen for its e-class stays, with its operands re-pointed;
//! every other chosen node becomes a new op. A new op takes the name of a value of the input
//! that its e-class holds (so a value that survives keeps its name even when it is now computed
//! differently); an e-class the input never had is named in the scope of the value that first
//! reads it (`block1/attn/q` reads a new `matmul`: `block1/attn/q/matmul`). Ops the e-graph treated as
//! opaque stay, in their original order relative to each other, with their control
//! dependencies. The schedule follows the input's: each value is placed when the input placed
//! it (or, if new, just before its first reader). The backward part, if the function has one,
//! starts at the first op placed at or after the point where the input's started.

use super::encode::{Encoded, values};
use super::extract::Selection;
use super::lang::{Node, Tag, kind_of, operands};
use cranelift_entity::SecondaryMap;
use egg::Id;
use std::collections::HashMap;
use tcc_ir::{Function, Op, OpKind, Value};

/// How an e-class gets its value.
#[derive(Clone, Copy)]
enum Source {
    /// A parameter.
    Param(Value),
    /// An op of the input, kept.
    Kept(Op),
    /// A new op, to be created.
    New,
}

/// Writes `sel` into `f` (which `enc` encodes).
pub fn decode(f: &mut Function, enc: &Encoded, sel: &Selection) {
    let eg = &enc.egraph;
    // The input's values, earliest first, by e-class.
    let mut holders: HashMap<Id, Vec<Value>> = HashMap::new();
    for v in values(f) {
        holders.entry(enc.class_of(v)).or_default().push(v);
    }
    // Which input op or parameter, if any, provides each chosen class.
    let mut source: HashMap<Id, Source> = HashMap::new();
    for (&c, node) in &sel.choice {
        let s = match node {
            Node::Attr(_) => continue,
            Node::Param(p) => Source::Param(f.params()[p.0 as usize]),
            Node::Op(Tag::Opaque(i), _) => Source::Kept(eg.analysis.tables.opaque[*i as usize].op),
            _ => (holders.get(&c).into_iter().flatten())
                .find(|&&v| enc.node_of(v).as_ref() == Some(node))
                .and_then(|&v| f.def_op(v))
                .map_or(Source::New, Source::Kept),
        };
        source.insert(c, s);
    }
    let kept: SecondaryMap<Op, bool> = {
        let mut k = SecondaryMap::with_capacity(f.num_ops_created());
        for s in source.values() {
            if let Source::Kept(op) = s {
                k[*op] = true;
            }
        }
        for &op in f.schedule() {
            k[op] |= enc.opaque[op];
        }
        k
    };

    // The order: walk the input's schedule, placing each op's e-class (and, first, whatever it
    // reads); opaque ops after their operands and the ops they depend on.
    enum Item {
        Class(Id),
        Opaque(Op),
    }
    let mut order: Vec<Item> = Vec::new();
    let mut placed_class: HashMap<Id, ()> = HashMap::new();
    let mut placed_op = SecondaryMap::<Op, bool>::with_capacity(f.num_ops_created());
    let mut backward_at = None;
    let schedule = f.schedule().to_vec();
    // The operand classes of each opaque op, read before any op changes.
    let opaque_args: HashMap<Op, Vec<Id>> = (schedule.iter())
        .filter(|&&op| enc.opaque[op])
        .map(|&op| {
            let args = f.op(op).args.iter();
            (op, args.map(|&a| enc.class_of(a)).collect())
        })
        .collect();
    for &op in &schedule {
        if Some(op) == f.backward_start() {
            backward_at = Some(order.len());
        }
        let mut todo: Vec<(Item, bool)> = if enc.opaque[op] {
            vec![(Item::Opaque(op), false)]
        } else {
            let c = enc.class_of(f.op(op).results[0]);
            if !sel.choice.contains_key(&c) {
                continue;
            }
            vec![(Item::Class(c), false)]
        };
        // Depth-first, children before parents (the selection is acyclic).
        while let Some((item, expanded)) = todo.pop() {
            match item {
                Item::Class(c) => {
                    if placed_class.contains_key(&c) {
                        continue;
                    }
                    if expanded {
                        placed_class.insert(c, ());
                        match source.get(&c) {
                            Some(Source::Kept(o)) if enc.opaque[*o] => {
                                todo.push((Item::Opaque(*o), false))
                            }
                            Some(Source::Param(_)) | None => {}
                            _ => order.push(Item::Class(c)),
                        }
                        continue;
                    }
                    todo.push((Item::Class(c), true));
                    for &ch in operands(&sel.choice[&c]).iter().rev() {
                        todo.push((Item::Class(eg.find(ch)), false));
                    }
                }
                Item::Opaque(o) => {
                    if placed_op[o] {
                        continue;
                    }
                    if expanded {
                        placed_op[o] = true;
                        order.push(Item::Opaque(o));
                        continue;
                    }
                    todo.push((Item::Opaque(o), true));
                    for &d in f.op(o).deps.iter().rev() {
                        todo.push((Item::Opaque(d), false));
                    }
                    for &c in opaque_args[&o].iter().rev() {
                        todo.push((Item::Class(c), false));
                    }
                }
            }
        }
    }

    // Names, readers before what they read: a new op takes the name of an input value of its
    // e-class whose op goes, else a name in the scope of its first reader.
    let mut name: HashMap<Id, (String, Option<tcc_ir::SrcLoc>)> = HashMap::new();
    let mut first_reader: HashMap<Id, String> = HashMap::new();
    for item in order.iter().rev() {
        let Item::Class(c) = *item else { continue };
        let own = match source[&c] {
            Source::Kept(o) => f.name(f.op(o).results[0]).to_string(),
            Source::Param(p) => f.name(p).to_string(),
            Source::New => {
                let donor = (holders.get(&c).into_iter().flatten())
                    .find(|&&v| f.def_op(v).is_some_and(|o| !kept[o]));
                let entry = match donor {
                    Some(&v) => (f.name(v).to_string(), f.def_op(v).and_then(|o| f.loc(o))),
                    None => {
                        let scope = (first_reader.get(&c))
                            .map(|n| format!("{n}/"))
                            .unwrap_or_default();
                        (
                            format!("{scope}{}", new_kind(f, enc, &sel.choice[&c]).mnemonic()),
                            None,
                        )
                    }
                };
                name.insert(c, entry.clone());
                entry.0
            }
        };
        for &ch in operands(&sel.choice[&c]) {
            first_reader
                .entry(eg.find(ch))
                .or_insert_with(|| own.clone());
        }
    }

    // Free the names of the ops that go, then create the new ones.
    f.remove_ops(|op| !kept[op]);
    let mut value: HashMap<Id, Value> = HashMap::new();
    for (&c, s) in &source {
        match *s {
            Source::Param(p) => {
                value.insert(c, p);
            }
            Source::Kept(op) => {
                let v = match &sel.choice[&c] {
                    Node::Op(Tag::Opaque(i), _) => {
                        f.op(op).results[eg.analysis.tables.opaque[*i as usize].result]
                    }
                    _ => f.op(op).results[0],
                };
                value.insert(c, v);
            }
            Source::New => {}
        }
    }
    let mut new_order = Vec::with_capacity(order.len());
    let mut backward = None;
    for (i, item) in order.iter().enumerate() {
        let op = match *item {
            Item::Opaque(o) => {
                let args: Vec<Value> = opaque_args[&o].iter().map(|c| value[c]).collect();
                f.op_mut(o).args = args;
                o
            }
            Item::Class(c) => {
                let node = &sel.choice[&c];
                let args: Vec<Value> = (operands(node).iter())
                    .map(|ch| value[&eg.find(*ch)])
                    .collect();
                match source[&c] {
                    Source::Kept(o) => {
                        f.op_mut(o).args = args;
                        o
                    }
                    Source::Param(_) => unreachable!("parameters are not placed"),
                    Source::New => {
                        let ty = eg[c].data.ty.clone().expect("a tensor");
                        let (kind, args) = fold_constant(f, new_kind(f, enc, node), args, &ty);
                        let (n, loc) = &name[&c];
                        let o = f.create_op(kind, args, vec![ty], &[n]);
                        if let Some(l) = loc {
                            f.set_loc(o, *l);
                        }
                        value.insert(c, f.op(o).results[0]);
                        o
                    }
                }
            }
        };
        if backward.is_none() && backward_at.is_some_and(|b| i >= b) {
            backward = Some(op);
        }
        new_order.push(op);
    }
    f.set_schedule(new_order);
    f.set_backward_start(backward);
    let results = enc.roots[..f.results().len()]
        .iter()
        .map(|r| value[&eg.find(*r)])
        .collect();
    f.set_results(results);
}

/// Largest constant a new op on constants is folded into when written back (the merged
/// weights of the `graph` rules): 2^26 elements.
const FOLD_NEW_LIMIT: u64 = 1 << 26;

/// A new op whose operands are all constants, as the constant it computes (the time model
/// counts such ops as free, so they must not run); other ops as they are.
fn fold_constant(
    f: &Function,
    kind: OpKind,
    args: Vec<Value>,
    ty: &tcc_ir::TensorType,
) -> (OpKind, Vec<Value>) {
    if args.is_empty() {
        return (kind, args);
    }
    let folded = crate::canonicalize::fold::const_args(f, &args).and_then(|cargs| {
        tcc_ir::interp::fold(&kind, &cargs, std::slice::from_ref(ty), FOLD_NEW_LIMIT)?.ok()
    });
    match folded.and_then(|mut v| v.pop()) {
        Some(value) => (
            OpKind::Const {
                ty: ty.clone(),
                value,
            },
            Vec::new(),
        ),
        None => (kind, args),
    }
}

/// The op a new node computes.
fn new_kind(f: &Function, enc: &Encoded, node: &Node) -> OpKind {
    let eg = &enc.egraph;
    match node {
        Node::Const(k) => {
            let e = &eg.analysis.tables.consts[k.0 as usize];
            let value = e.literal(f).expect("constants keep or find their value");
            OpKind::Const {
                ty: e.ty.clone(),
                value: value.clone(),
            }
        }
        Node::Op(Tag::Op(id), children) => kind_of(eg, *id, children),
        _ => unreachable!("leaves and opaque ops are not created"),
    }
}

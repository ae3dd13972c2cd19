//! Checking an e-graph against the interpreter: every e-node of every e-class must compute its
//! class's value. The soundness test of the rules runs this after each rule on random instances
//! of its witness; a wrong rule puts an e-node in a class whose value it does not compute.
//!
//! Each class gets a reference value from one of its nodes (the smallest acyclic term, egg's
//! `AstSize` extraction), evaluated with the reference kernels (`tcc_ir::interp::eval_op`);
//! then each node is evaluated on its children's reference values and compared with its
//! class's.

use super::encode::Encoded;
use super::lang::{Node, Tag, kind_of, operands};
use egg::{AstSize, Extractor, Id};
use std::collections::HashMap;
use tcc_ir::{Function, Tensor};

/// Checks every node of `enc`'s e-graph (built from `f`) on `inputs`, values compared in f64
/// with relative tolerance `tol`. The error names the first node that disagrees.
pub fn check_classes(
    f: &Function,
    enc: &Encoded,
    inputs: &[Tensor],
    tol: f64,
) -> Result<(), String> {
    let eg = &enc.egraph;
    let ex = Extractor::new(eg, AstSize);
    let mut value: HashMap<Id, Tensor> = HashMap::new();
    // Reference values, children first (iterative: graphs can be deep).
    for class in eg.classes() {
        let mut stack = vec![(class.id, false)];
        while let Some((c, expanded)) = stack.pop() {
            let c = eg.find(c);
            if value.contains_key(&c) || eg[c].data.ty.is_none() {
                continue;
            }
            let node = ex.find_best_node(c);
            if !expanded {
                stack.push((c, true));
                for &ch in operands(node) {
                    stack.push((ch, false));
                }
                continue;
            }
            let v = eval(f, enc, inputs, c, node, &value)?;
            value.insert(c, v);
        }
    }
    for class in eg.classes() {
        let Some(want) = value.get(&class.id) else {
            continue;
        };
        for node in &class.nodes {
            let got = eval(f, enc, inputs, class.id, node, &value)?;
            if let Some(i) = differs(&got, want, tol) {
                let reference = ex.find_best_node(class.id);
                return Err(format!(
                    "`{}` and `{}` are in one e-class (type {}) but differ at element {i}: {} vs {}",
                    describe(eg, node),
                    describe(eg, reference),
                    want.ty(),
                    got.data().get(i),
                    want.data().get(i)
                ));
            }
        }
    }
    Ok(())
}

fn describe(eg: &egg::EGraph<Node, super::lang::TensorAnalysis>, node: &Node) -> String {
    match node {
        Node::Op(Tag::Op(id), ch) => {
            let k = kind_of(eg, *id, ch);
            let attrs: Vec<String> = k
                .attr_texts()
                .iter()
                .map(|(n, v)| format!("{n}={v}"))
                .collect();
            let args: Vec<String> = operands(node).iter().map(|c| format!("e{c}")).collect();
            let attrs = if attrs.is_empty() {
                String::new()
            } else {
                format!(" {{{}}}", attrs.join(", "))
            };
            format!("{} {}{attrs}", k.mnemonic(), args.join(", "))
        }
        n => n.to_string(),
    }
}

/// The first element where `a` and `b` differ beyond `tol`, relatively.
fn differs(a: &Tensor, b: &Tensor, tol: f64) -> Option<usize> {
    if a.ty() != b.ty() {
        return Some(0);
    }
    (0..a.data().len()).find(|&i| {
        let (x, y) = (a.data().get(i).to_f64(), b.data().get(i).to_f64());
        !(x == y
            || (x.is_nan() && y.is_nan())
            || (x - y).abs() <= tol * x.abs().max(y.abs()).max(1.0))
    })
}

fn eval(
    f: &Function,
    enc: &Encoded,
    inputs: &[Tensor],
    class: Id,
    node: &Node,
    value: &HashMap<Id, Tensor>,
) -> Result<Tensor, String> {
    let eg = &enc.egraph;
    let t = &eg.analysis.tables;
    let ty = eg[class]
        .data
        .ty
        .clone()
        .ok_or("an attribute has no value")?;
    let args: Vec<&Tensor> = operands(node)
        .iter()
        .map(|c| {
            value
                .get(&eg.find(*c))
                .ok_or_else(|| format!("operand e{c} has no value"))
        })
        .collect::<Result<_, _>>()?;
    match node {
        Node::Attr(_) => Err("an attribute has no value".into()),
        Node::Param(p) => {
            (inputs.get(p.0 as usize).cloned()).ok_or_else(|| format!("no input for parameter {p}"))
        }
        Node::Const(k) => {
            let e = &t.consts[k.0 as usize];
            let lit = e.literal(f).ok_or("a constant without a value")?;
            Tensor::from_literal(&e.ty, lit).map_err(|e| e.to_string())
        }
        Node::Op(Tag::Opaque(i), _) => {
            let o = &t.opaque[*i as usize];
            let d = f.op(o.op);
            let outs: Vec<_> = d.results.iter().map(|&r| f.ty(r).clone()).collect();
            let mut r = tcc_ir::interp::eval_op(&d.kind, &args, &outs)?;
            Ok(r.swap_remove(o.result))
        }
        Node::Op(Tag::Op(id), ch) => {
            let kind = kind_of(eg, *id, ch);
            let mut r = tcc_ir::interp::eval_op(&kind, &args, &[ty])?;
            Ok(r.remove(0))
        }
    }
}

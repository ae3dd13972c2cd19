//! `graph`: TASO/TENSAT-style substitutions between whole operators, all exact.
//!
//! - The matrix products reading one input, with 2-D right operands (weights) of as many rows,
//!   are one product with the weights concatenated, then sliced (the attention Q/K/V merge); the
//!   convolutions with the same attributes and filter geometry reading one input, with
//!   `groups=1`, are one with the filters concatenated, then sliced along the channels
//!   (Inception's branches). Each group is merged whole, once: merging pairs and then pairs of
//!   merges builds every subset of the group (2^8 products for a cell with eight gates).
//!   Merged weights are constants when the weights are: the pass folds them when it writes the
//!   program back, and the time model counts ops on constants as free.
//! - Matrix chains reassociate, `(AB)C <-> A(BC)` (2-D operands).
//! - `relu` commutes with max pooling (relu is monotone; padding never wins a max).
//!
//! Whether a merge pays depends on what the slices cost against the launches and the input
//! reads it saves; extraction decides with the time model, counting the merged product once.

use super::super::lang::{Node, Tag};
use super::{G, Rule, add_op, attrs, rw_if, rw_multi, ty, var};
use egg::{Id, Subst};
use tcc_ir::OpKind;
use tcc_ir::ops::OpId;

const SET: &str = "graph";

/// Slices of `y` (rank `r`) taking `[lo, hi)` along `axis` and everything elsewhere.
fn slice_along(eg: &mut G, y: Id, dims: &[u64], axis: usize, lo: u64, hi: u64) -> Id {
    let starts = (0..dims.len())
        .map(|i| if i == axis { lo as i64 } else { 0 })
        .collect();
    let ends = (0..dims.len())
        .map(|i| if i == axis { hi as i64 } else { dims[i] as i64 })
        .collect();
    let kind = OpKind::Slice {
        starts,
        ends,
        steps: vec![1; dims.len()],
    };
    add_op(eg, kind, vec![y])
}

/// The weights a (possibly already merged) operand concatenates along `axis`, in order.
fn parts(eg: &G, w: Id, axis: i64) -> Vec<Id> {
    let w = eg.find(w);
    for n in super::nodes_of(eg, w, tcc_ir::ops::OpId::Concat) {
        let ch = egg::Language::children(&n);
        let (ops, attr) = ch.split_at(ch.len() - 1);
        if super::super::lang::attrs_of(eg, attr[0]) == Some(&OpKind::Concat { axis }) {
            return ops.iter().flat_map(|&o| parts(eg, o, axis)).collect();
        }
    }
    vec![w]
}

/// The ops reading `x` as their first operand that `merge` would join: each op class with its
/// second operand's class (a weight, never itself a merge of weights along `axis`), in one
/// canonical order (by weight class), one per weight.
fn readers(eg: &G, x: Id, op: OpId, axis: i64, joins: impl Fn(&[Id]) -> bool) -> Vec<(Id, Id)> {
    let x = eg.find(x);
    let mut out: Vec<(Id, Id)> = (eg[x].parents())
        .filter_map(|p| match eg.id_to_node(p) {
            Node::Op(Tag::Op(o), ch) if *o == op && eg.find(ch[0]) == x && joins(ch) => {
                let w = eg.find(ch[1]);
                (parts(eg, w, axis).len() == 1).then(|| (w, eg.find(p)))
            }
            _ => None,
        })
        .collect();
    out.sort();
    out.dedup_by_key(|&mut (w, _)| w);
    out.into_iter().map(|(w, m)| (m, w)).collect()
}

/// Whether `(m1, m2)` are the first two of `group`: a group is merged once, from its first pair.
fn first_pair(eg: &G, group: &[(Id, Id)], m1: Id, m2: Id) -> bool {
    group.len() >= 2 && eg.find(group[0].0) == m1 && eg.find(group[1].0) == m2
}

/// `?m1 = x·w1, ?m2 = x·w2`: every product of `x` with a 2-D weight of as many rows, `x·[w1
/// w2 ..]`, sliced. (Merging the whole group at once, not pairs, keeps the e-graph linear in
/// the group: pairs would build every subset.)
fn merge_matmuls(eg: &mut G, s: &Subst) -> Vec<(Id, Id)> {
    let (m1, m2) = (eg.find(var(s, "?m1")), eg.find(var(s, "?m2")));
    let (Some(t1), Some(out)) = (ty(eg, var(s, "?w1")), ty(eg, m1)) else {
        return vec![];
    };
    if t1.rank() != 2 {
        return vec![];
    }
    let k = t1.dims()[0];
    let group = readers(eg, var(s, "?x"), OpId::MatMul, 1, |ch| {
        ty(eg, ch[1]).is_some_and(|t| t.rank() == 2 && t.dims()[0] == k)
    });
    if !first_pair(eg, &group, m1, m2) {
        return vec![];
    }
    let last = out.rank() - 1;
    let x = var(s, "?x");
    merge(eg, &group, OpKind::MatMul, x, 1, out.dims().to_vec(), last)
}

/// The ops of `group` (each `kind` of `x` and its weight) as one op of `x` and the weights
/// concatenated along `w_axis`, whose result (`dims` but for `axis`, the sum of the weights'
/// `w_axis` sizes) is sliced back along `axis`: each op paired with its slice, in order.
fn merge(
    eg: &mut G,
    group: &[(Id, Id)],
    kind: OpKind,
    x: Id,
    w_axis: usize,
    mut dims: Vec<u64>,
    axis: usize,
) -> Vec<(Id, Id)> {
    let widths: Vec<u64> = (group.iter())
        .map(|&(_, w)| ty(eg, w).expect("a tensor").dims()[w_axis])
        .collect();
    dims[axis] = widths.iter().sum();
    let ws = group.iter().map(|&(_, w)| w).collect();
    let w = add_op(
        eg,
        OpKind::Concat {
            axis: w_axis as i64,
        },
        ws,
    );
    let y = add_op(eg, kind, vec![x, w]);
    let mut lo = 0;
    let mut out = Vec::new();
    for (&(m, _), &n) in group.iter().zip(&widths) {
        out.push((m, slice_along(eg, y, &dims, axis, lo, lo + n)));
        lo += n;
    }
    out
}

/// `?c1 = conv(x, w1), ?c2 = conv(x, w2)` alike: every convolution of `x` with these
/// attributes and filters of this geometry, `conv(x, [w1; w2; ..])`, sliced along channels.
fn merge_convs(eg: &mut G, s: &Subst) -> Vec<(Id, Id)> {
    let (c1, c2) = (eg.find(var(s, "?c1")), eg.find(var(s, "?c2")));
    let Some(OpKind::Conv2d(conv)) = attrs(eg, s, "?a") else {
        return vec![];
    };
    let conv = conv.clone();
    let (Some(t1), Some(out)) = (ty(eg, var(s, "?w1")), ty(eg, c1)) else {
        return vec![];
    };
    if conv.groups != 1 {
        return vec![];
    }
    let (geometry, a) = (t1.dims()[1..].to_vec(), eg.find(var(s, "?a")));
    let group = readers(eg, var(s, "?x"), OpId::Conv2d, 0, |ch| {
        eg.find(ch[2]) == a && ty(eg, ch[1]).is_some_and(|t| t.dims()[1..] == geometry)
    });
    if !first_pair(eg, &group, c1, c2) {
        return vec![];
    }
    let x = var(s, "?x");
    merge(
        eg,
        &group,
        OpKind::Conv2d(conv),
        x,
        0,
        out.dims().to_vec(),
        1,
    )
}

fn all_2d(eg: &G, s: &Subst, vars: &[&str]) -> bool {
    vars.iter()
        .all(|v| ty(eg, var(s, v)).is_some_and(|t| t.rank() == 2))
}

pub(super) fn rules() -> Vec<Rule> {
    vec![
        rw_multi(
            "merge-matmuls",
            SET,
            "?m1 = (matmul ?x ?w1), ?m2 = (matmul ?x ?w2)",
            merge_matmuls,
            "func @f(%x: f64[$a,$b,$c], %w: f64[$c,$d], %v: f64[$c,$b], %u: f64[$c,$a]) -> (f64[$a,$b,$d], f64[$a,$b,$b], f64[$a,$b,$a]) {\n  %q = matmul %x, %w : f64[$a,$b,$d]\n  %k = matmul %x, %v : f64[$a,$b,$b]\n  %z = matmul %x, %u : f64[$a,$b,$a]\n  return %q, %k, %z\n}\n",
        ),
        rw_multi(
            "merge-convs",
            SET,
            "?c1 = (conv2d ?x ?w1 ?a), ?c2 = (conv2d ?x ?w2 ?a)",
            merge_convs,
            "func @f(%x: f64[1,$c,5,5], %w: f64[$a,$c,3,3], %v: f64[$b,$c,3,3], %u: f64[$d,$c,3,3]) -> (f64[1,$a,5,5], f64[1,$b,5,5], f64[1,$d,5,5]) {\n  %p = conv2d %x, %w {pads=[1,1,1,1]} : f64[1,$a,5,5]\n  %q = conv2d %x, %v {pads=[1,1,1,1]} : f64[1,$b,5,5]\n  %r = conv2d %x, %u {pads=[1,1,1,1]} : f64[1,$d,5,5]\n  return %p, %q, %r\n}\n",
        ),
        rw_if(
            "matmul-assoc-right",
            SET,
            "(matmul (matmul ?a ?b) ?c)",
            "(matmul ?a (matmul ?b ?c))",
            |eg, _, s| all_2d(eg, s, &["?a", "?b", "?c"]),
            "func @f(%x: f64[$a,$b], %y: f64[$b,$c], %z: f64[$c,$d]) -> (f64[$a,$d]) {\n  %p = matmul %x, %y : f64[$a,$c]\n  %r = matmul %p, %z : f64[$a,$d]\n  return %r\n}\n",
        ),
        rw_if(
            "matmul-assoc-left",
            SET,
            "(matmul ?a (matmul ?b ?c))",
            "(matmul (matmul ?a ?b) ?c)",
            |eg, _, s| all_2d(eg, s, &["?a", "?b", "?c"]),
            "func @f(%x: f64[$a,$b], %y: f64[$b,$c], %z: f64[$c,$d]) -> (f64[$a,$d]) {\n  %p = matmul %y, %z : f64[$b,$d]\n  %r = matmul %x, %p : f64[$a,$d]\n  return %r\n}\n",
        ),
        rw_if(
            "max-pool-relu",
            SET,
            "(max_pool2d (relu ?x) ?p)",
            "(relu (max_pool2d ?x ?p))",
            |_, _, _| true,
            "func @f(%x: f64[1,$a,6,6]) -> (f64[1,$a,3,3]) {\n  %r = relu %x : f64[1,$a,6,6]\n  %p = max_pool2d %r {kernel=[3,3], strides=[2,2], pads=[1,1,0,0]} : f64[1,$a,3,3]\n  return %p\n}\n",
        ),
        rw_if(
            "relu-max-pool",
            SET,
            "(relu (max_pool2d ?x ?p))",
            "(max_pool2d (relu ?x) ?p)",
            |_, _, _| true,
            "func @f(%x: f64[1,$a,6,6]) -> (f64[1,$a,3,3]) {\n  %p = max_pool2d %x {kernel=[3,3], strides=[2,2], pads=[1,1,0,0]} : f64[1,$a,3,3]\n  %r = relu %p : f64[1,$a,3,3]\n  return %r\n}\n",
        ),
    ]
}

//! `graph`: TASO/TENSAT-style substitutions between whole operators, all exact.
//!
//! - Two matrix products reading one input, with 2-D right operands (weights), are one product
//!   with the weights concatenated, then sliced (the attention Q/K/V merge); two convolutions
//!   with the same attributes and filter geometry reading one input, with `groups=1`, are one
//!   with the filters concatenated, then sliced along the channels (Inception's branches).
//!   Merged weights are constants when the weights are: the pass folds them when it writes the
//!   program back, and the time model counts ops on constants as free. Merges compose: a third
//!   product joins the merged one, and a slice of a slice is one slice.
//! - Matrix chains reassociate, `(AB)C <-> A(BC)` (2-D operands).
//! - `relu` commutes with max pooling (relu is monotone; padding never wins a max).
//!
//! Whether a merge pays depends on what the slices cost against the launches and the input
//! reads it saves; extraction decides with the time model, counting the merged product once.

use super::{G, Rule, add_op, attrs, rw_if, rw_multi, ty, var};
use egg::{Id, Subst};
use tcc_ir::OpKind;

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

/// Whether merging `w1` then `w2` along `axis` joins new weights in one canonical order: every
/// part of `w1` before every part of `w2` by e-class id. Each set of weights is then merged in
/// one order only, and never with itself.
fn canonical_merge(eg: &G, w1: Id, w2: Id, axis: i64) -> bool {
    let (a, b) = (parts(eg, w1, axis), parts(eg, w2, axis));
    a.iter().max() < b.iter().min()
}

/// `?m1 = x·w1, ?m2 = x·w2` with 2-D `w1`, `w2`: `x·[w1 w2]`, sliced.
fn merge_matmuls(eg: &mut G, s: &Subst) -> Vec<(Id, Id)> {
    let (m1, m2) = (eg.find(var(s, "?m1")), eg.find(var(s, "?m2")));
    let (w1, w2) = (var(s, "?w1"), var(s, "?w2"));
    let (Some(t1), Some(t2), Some(out)) = (ty(eg, w1), ty(eg, w2), ty(eg, m1)) else {
        return vec![];
    };
    if m1 == m2 || t1.rank() != 2 || t2.rank() != 2 || t1.dims()[0] != t2.dims()[0] {
        return vec![];
    }
    if !canonical_merge(eg, w1, w2, 1) {
        return vec![];
    }
    let (n1, n2) = (t1.dims()[1], t2.dims()[1]);
    let mut dims = out.dims().to_vec();
    let last = dims.len() - 1;
    let w = add_op(eg, OpKind::Concat { axis: 1 }, vec![w1, w2]);
    let x = var(s, "?x");
    let m = add_op(eg, OpKind::MatMul, vec![x, w]);
    dims[last] = n1 + n2;
    let s1 = slice_along(eg, m, &dims, last, 0, n1);
    let s2 = slice_along(eg, m, &dims, last, n1, n1 + n2);
    vec![(m1, s1), (m2, s2)]
}

/// `?c1 = conv(x, w1), ?c2 = conv(x, w2)` alike: `conv(x, [w1; w2])`, sliced along channels.
fn merge_convs(eg: &mut G, s: &Subst) -> Vec<(Id, Id)> {
    let (c1, c2) = (eg.find(var(s, "?c1")), eg.find(var(s, "?c2")));
    let (w1, w2) = (var(s, "?w1"), var(s, "?w2"));
    let Some(OpKind::Conv2d(conv)) = attrs(eg, s, "?a") else {
        return vec![];
    };
    let conv = conv.clone();
    let (Some(t1), Some(t2), Some(out)) = (ty(eg, w1), ty(eg, w2), ty(eg, c1)) else {
        return vec![];
    };
    if c1 == c2 || conv.groups != 1 || t1.dims()[1..] != t2.dims()[1..] {
        return vec![];
    }
    if !canonical_merge(eg, w1, w2, 0) {
        return vec![];
    }
    let (o1, o2) = (t1.dims()[0], t2.dims()[0]);
    let mut dims = out.dims().to_vec();
    let w = add_op(eg, OpKind::Concat { axis: 0 }, vec![w1, w2]);
    let y = add_op(eg, OpKind::Conv2d(conv), vec![var(s, "?x"), w]);
    dims[1] = o1 + o2;
    let s1 = slice_along(eg, y, &dims, 1, 0, o1);
    let s2 = slice_along(eg, y, &dims, 1, o1, o1 + o2);
    vec![(c1, s1), (c2, s2)]
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
            "func @f(%x: f64[$a,$b,$c], %w: f64[$c,$d], %v: f64[$c,$b]) -> (f64[$a,$b,$d], f64[$a,$b,$b]) {\n  %q = matmul %x, %w : f64[$a,$b,$d]\n  %k = matmul %x, %v : f64[$a,$b,$b]\n  return %q, %k\n}\n",
        ),
        rw_multi(
            "merge-convs",
            SET,
            "?c1 = (conv2d ?x ?w1 ?a), ?c2 = (conv2d ?x ?w2 ?a)",
            merge_convs,
            "func @f(%x: f64[1,$c,5,5], %w: f64[$a,$c,3,3], %v: f64[$b,$c,3,3]) -> (f64[1,$a,5,5], f64[1,$b,5,5]) {\n  %p = conv2d %x, %w {pads=[1,1,1,1]} : f64[1,$a,5,5]\n  %q = conv2d %x, %v {pads=[1,1,1,1]} : f64[1,$b,5,5]\n  return %p, %q\n}\n",
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

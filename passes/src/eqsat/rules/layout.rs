//! `layout`: rules that move data around without changing it. Transposes and reshapes compose
//! and cancel, transposes move through elementwise ops (so that two of them can meet) and into
//! matrix products (`(AB)ᵀ = BᵀAᵀ`), explicit broadcasts that an elementwise op would do
//! anyway go, a slice of a concatenation reads the operand it lies in, a concatenation of
//! adjacent slices of one value is one slice (or the value), and a binary op on like slices of
//! two values of one type is a slice of the op. All exact.

use super::{G, Rule, add_op, attrs, nodes_of, rw, rw_if, rw_with, same_type, ty, var};
use egg::{Id, Subst};
use tcc_ir::ops::{OpId, normalize_axis};
use tcc_ir::typing::broadcast_shapes;
use tcc_ir::{BinaryOp, OpKind, UnaryOp};

const SET: &str = "layout";

/// A function of one `[$a,$b,$c]` input and one `[$c,$b,$a]` input.
macro_rules! witness {
    ($ret:literal, $body:literal) => {
        concat!(
            "func @f(%x: f64[$a,$b,$c], %y: f64[$c,$b,$a]) -> (",
            $ret,
            ") {\n",
            $body,
            "}\n"
        )
    };
}

fn perm(eg: &G, s: &Subst, v: &str) -> Option<Vec<u64>> {
    match attrs(eg, s, v)? {
        OpKind::Transpose { perm } => Some(perm.clone()),
        _ => None,
    }
}

fn is_identity(p: &[u64]) -> bool {
    p.iter().enumerate().all(|(i, &a)| a == i as u64)
}

/// Whether `p` swaps the last two axes and keeps the others.
fn swaps_last_two(p: &[u64]) -> bool {
    let r = p.len();
    r >= 2 && p[r - 1] == (r - 2) as u64 && p[r - 2] == (r - 1) as u64 && is_identity(&p[..r - 2])
}

fn rank(eg: &G, id: Id) -> Option<usize> {
    ty(eg, id).map(|t| t.rank())
}

/// The unary ops the elementwise rules move through transposes and concatenations (named
/// `transpose-{op}`, `{op}-transpose`, `concat-{op}`).
const UNARY: &[UnaryOp] = &[
    UnaryOp::Neg,
    UnaryOp::Abs,
    UnaryOp::Exp,
    UnaryOp::Tanh,
    UnaryOp::Sigmoid,
    UnaryOp::Relu,
    UnaryOp::Erf,
    UnaryOp::Gelu,
    UnaryOp::Reciprocal,
];

/// The binary ops they move through (also `{op}-broadcast-lhs`, `{op}-broadcast-rhs`).
const BINARY: &[BinaryOp] = &[
    BinaryOp::Add,
    BinaryOp::Sub,
    BinaryOp::Mul,
    BinaryOp::Div,
    BinaryOp::Max,
    BinaryOp::Min,
];

pub(super) fn rules() -> Vec<Rule> {
    let mut out = vec![
        rw_with(
            "transpose-transpose",
            SET,
            "(transpose (transpose ?x ?p) ?q)",
            |eg, _, s| {
                let (p, q) = (perm(eg, s, "?p")?, perm(eg, s, "?q")?);
                let composed: Vec<u64> = q.iter().map(|&i| p[i as usize]).collect();
                let x = var(s, "?x");
                if is_identity(&composed) {
                    return Some(x);
                }
                Some(add_op(eg, OpKind::Transpose { perm: composed }, vec![x]))
            },
            witness!(
                "f64[$a,$b,$c]",
                "  %t = transpose %x {perm=[2,0,1]} : f64[$c,$a,$b]\n  %r = transpose %t {perm=[1,2,0]} : f64[$a,$b,$c]\n  return %r\n"
            ),
        ),
        rw_if(
            "transpose-identity",
            SET,
            "(transpose ?x ?p)",
            "?x",
            |eg, _, s| perm(eg, s, "?p").is_some_and(|p| is_identity(&p)),
            witness!(
                "f64[$a,$b,$c]",
                "  %r = transpose %x {perm=[0,1,2]} : f64[$a,$b,$c]\n  return %r\n"
            ),
        ),
        rw(
            "reshape-reshape",
            SET,
            "(reshape (reshape ?x ?a) ?b)",
            "(reshape ?x ?b)",
            witness!(
                "f64[$b,$a,$c]",
                "  %t = reshape %x {shape=[$a,$b,$c,1]} : f64[$a,$b,$c,1]\n  %r = reshape %t {shape=[$b,$a,$c]} : f64[$b,$a,$c]\n  return %r\n"
            ),
        ),
        rw_if(
            "reshape-identity",
            SET,
            "(reshape ?x ?s)",
            "?x",
            |eg, m, s| same_type(eg, m, s, "?x"),
            witness!(
                "f64[$a,$b,$c]",
                "  %r = reshape %x {shape=[$a,$b,$c]} : f64[$a,$b,$c]\n  return %r\n"
            ),
        ),
        rw_if(
            "broadcast-identity",
            SET,
            "(broadcast_to ?x ?s)",
            "?x",
            |eg, m, s| same_type(eg, m, s, "?x"),
            witness!(
                "f64[$a,$b,$c]",
                "  %r = broadcast_to %x {shape=[$a,$b,$c]} : f64[$a,$b,$c]\n  return %r\n"
            ),
        ),
        rw(
            "broadcast-broadcast",
            SET,
            "(broadcast_to (broadcast_to ?x ?a) ?b)",
            "(broadcast_to ?x ?b)",
            witness!(
                "f64[2,$a,$b,$c]",
                "  %t = broadcast_to %x {shape=[1,$a,$b,$c]} : f64[1,$a,$b,$c]\n  %r = broadcast_to %t {shape=[2,$a,$b,$c]} : f64[2,$a,$b,$c]\n  return %r\n"
            ),
        ),
        rw_if(
            "transpose-matmul",
            SET,
            "(transpose (matmul ?a ?b) ?p)",
            "(matmul (transpose ?b ?p) (transpose ?a ?p))",
            |eg, m, s| {
                let r = rank(eg, m);
                perm(eg, s, "?p").is_some_and(|p| swaps_last_two(&p))
                    && rank(eg, var(s, "?a")) == r
                    && rank(eg, var(s, "?b")) == r
            },
            "func @f(%x: f64[$a,$b,$c], %y: f64[$a,$c,$d]) -> (f64[$a,$d,$b]) {\n  %m = matmul %x, %y : f64[$a,$b,$d]\n  %r = transpose %m {perm=[0,2,1]} : f64[$a,$d,$b]\n  return %r\n}\n",
        ),
        rw_if(
            "matmul-transposes",
            SET,
            "(matmul (transpose ?b ?p) (transpose ?a ?p))",
            "(transpose (matmul ?a ?b) ?p)",
            |eg, _, s| perm(eg, s, "?p").is_some_and(|p| swaps_last_two(&p)),
            "func @f(%x: f64[$a,$b,$c], %y: f64[$a,$d,$b]) -> (f64[$a,$c,$d]) {\n  %p = transpose %x {perm=[0,2,1]} : f64[$a,$c,$b]\n  %q = transpose %y {perm=[0,2,1]} : f64[$a,$b,$d]\n  %r = matmul %p, %q : f64[$a,$c,$d]\n  return %r\n}\n",
        ),
        rw_with(
            "slice-of-concat",
            SET,
            "(slice ?c ?s)",
            slice_of_concat,
            witness!(
                "f64[$a,$b,$c]",
                "  %j = concat %x, %x {axis=1} : f64[$a,$2b,$c]\n  %r = slice %j {starts=[0,$b,0], ends=[$a,$2b,$c]} : f64[$a,$b,$c]\n  return %r\n"
            ),
        ),
        rw_with(
            "slice-slice",
            SET,
            "(slice (slice ?x ?s) ?t)",
            slice_slice,
            witness!(
                "f64[$a,1,$c]",
                "  %p = slice %x {starts=[0,1,0], ends=[$a,$b,$c]} : f64[$a,$b-1,$c]\n  %r = slice %p {starts=[0,0,0], ends=[$a,1,$c]} : f64[$a,1,$c]\n  return %r\n"
            ),
        ),
        rw_with(
            "concat-of-slices",
            SET,
            "(concat (slice ?x ?s) (slice ?x ?t) ?ax)",
            concat_of_slices,
            witness!(
                "f64[$a,$b,$c]",
                "  %p = slice %x {starts=[0,0,0], ends=[$a,1,$c]} : f64[$a,1,$c]\n  %q = slice %x {starts=[0,1,0], ends=[$a,$b,$c]} : f64[$a,$b-1,$c]\n  %r = concat %p, %q {axis=1} : f64[$a,$b,$c]\n  return %r\n"
            ),
        ),
    ];
    for &op in UNARY {
        let mn = OpKind::Unary(op).mnemonic();
        let (push_in, pull_out) = (format!("transpose-{mn}"), format!("{mn}-transpose"));
        out.push(rw(&push_in, SET, &format!("({mn} (transpose ?x ?p))"),
            &format!("(transpose ({mn} ?x) ?p)"),
            &format!("func @f(%x: f64[$a,$b,$c]) -> (f64[$c,$a,$b]) {{\n  %t = transpose %x {{perm=[2,0,1]}} : f64[$c,$a,$b]\n  %r = {mn} %t : f64[$c,$a,$b]\n  return %r\n}}\n")));
        out.push(rw(&pull_out, SET, &format!("(transpose ({mn} ?x) ?p)"),
            &format!("({mn} (transpose ?x ?p))"),
            &format!("func @f(%x: f64[$a,$b,$c]) -> (f64[$c,$a,$b]) {{\n  %t = {mn} %x : f64[$a,$b,$c]\n  %r = transpose %t {{perm=[2,0,1]}} : f64[$c,$a,$b]\n  return %r\n}}\n")));
    }
    // A unary op on both operands of a concatenation is one op on the concatenation (so that
    // the two halves of a merged convolution meet again: concat(relu(slice), relu(slice))).
    for &op in UNARY {
        let mn = OpKind::Unary(op).mnemonic();
        out.push(rw(&format!("concat-{mn}"), SET, &format!("(concat ({mn} ?a) ({mn} ?b) ?ax)"),
            &format!("({mn} (concat ?a ?b ?ax))"),
            &format!("func @f(%x: f64[$a,$b,$c], %y: f64[$a,1,$c]) -> (f64[$a,$b+1,$c]) {{\n  %p = {mn} %x : f64[$a,$b,$c]\n  %q = {mn} %y : f64[$a,1,$c]\n  %r = concat %p, %q {{axis=1}} : f64[$a,$b+1,$c]\n  return %r\n}}\n")));
    }
    // A binary op on both operands of a concatenation, the first operands full-sized and the
    // second ones broadcast only off the axis (a per-channel bias): one op on two
    // concatenations.
    for &op in BINARY {
        let mn = OpKind::Binary(op).mnemonic();
        out.push(rw_if(&format!("concat-{mn}"), SET, &format!("(concat ({mn} ?a ?c) ({mn} ?b ?d) ?ax)"),
            &format!("({mn} (concat ?a ?b ?ax) (concat ?c ?d ?ax))"), concat_binary,
            &format!("func @f(%x: f64[1,$b,$c,$a], %y: f64[1,$d,$c,$a], %p: f64[1,$b,1,1], %q: f64[1,$d,1,1]) -> (f64[1,$b+$d,$c,$a]) {{\n  %u = {mn} %x, %p : f64[1,$b,$c,$a]\n  %v = {mn} %y, %q : f64[1,$d,$c,$a]\n  %r = concat %u, %v {{axis=1}} : f64[1,$b+$d,$c,$a]\n  return %r\n}}\n")));
    }
    // A binary op on two like slices of operands of one type is the slice of the op (so that
    // the pieces of two merged products meet again: add(slice(xW), slice(hU)) of a recurrent
    // cell's gates is one add, sliced).
    for &op in BINARY {
        let mn = OpKind::Binary(op).mnemonic();
        out.push(rw_if(&format!("slice-{mn}"), SET, &format!("({mn} (slice ?a ?s) (slice ?b ?s))"),
            &format!("(slice ({mn} ?a ?b) ?s)"), |eg, _, s| ty(eg, var(s, "?a")) == ty(eg, var(s, "?b")),
            &format!("func @f(%x: f64[$a,$b,$c], %y: f64[$a,$b,$c]) -> (f64[$a,1,$c]) {{\n  %p = slice %x {{starts=[0,1,0], ends=[$a,2,$c]}} : f64[$a,1,$c]\n  %q = slice %y {{starts=[0,1,0], ends=[$a,2,$c]}} : f64[$a,1,$c]\n  %r = {mn} %p, %q : f64[$a,1,$c]\n  return %r\n}}\n")));
    }
    // Concatenations along one axis nest and flatten, so that the two-operand rules see the
    // operands of a wider concatenation (an Inception module joins four branches).
    for (n, ops, nested) in [
        (3, "?a ?b ?c", "(concat (concat ?a ?b ?ax) ?c ?ax)"),
        (4, "?a ?b ?c ?d", "(concat (concat ?a ?b ?c ?ax) ?d ?ax)"),
        (
            5,
            "?a ?b ?c ?d ?e",
            "(concat (concat ?a ?b ?c ?d ?ax) ?e ?ax)",
        ),
    ] {
        let flat = format!("(concat {ops} ?ax)");
        let args = ["%x", "%x", "%y", "%x", "%y"][..n].join(", ");
        let width: u64 = n as u64;
        let witness = format!(
            "func @f(%x: f64[$a,$b,$c], %y: f64[$a,$b,$c]) -> (f64[$a,$b,{w}$c]) {{\n  %r = concat {args} {{axis=2}} : f64[$a,$b,{w}$c]\n  return %r\n}}\n",
            w = format!("{width}*")
        );
        out.push(rw(
            &format!("concat-nest-{n}"),
            SET,
            &flat,
            nested,
            &witness,
        ));
        let nested_witness = match n {
            3 => {
                "func @f(%x: f64[$a,$b,$c], %y: f64[$a,$b,$c]) -> (f64[$a,$b,3*$c]) {\n  %p = concat %x, %x {axis=2} : f64[$a,$b,2*$c]\n  %r = concat %p, %y {axis=2} : f64[$a,$b,3*$c]\n  return %r\n}\n"
            }
            4 => {
                "func @f(%x: f64[$a,$b,$c], %y: f64[$a,$b,$c]) -> (f64[$a,$b,4*$c]) {\n  %p = concat %x, %x, %y {axis=2} : f64[$a,$b,3*$c]\n  %r = concat %p, %x {axis=2} : f64[$a,$b,4*$c]\n  return %r\n}\n"
            }
            _ => {
                "func @f(%x: f64[$a,$b,$c], %y: f64[$a,$b,$c]) -> (f64[$a,$b,5*$c]) {\n  %p = concat %x, %x, %y, %x {axis=2} : f64[$a,$b,4*$c]\n  %r = concat %p, %y {axis=2} : f64[$a,$b,5*$c]\n  return %r\n}\n"
            }
        };
        out.push(rw(
            &format!("concat-flatten-{n}"),
            SET,
            nested,
            &flat,
            nested_witness,
        ));
    }
    for &op in BINARY {
        let mn = OpKind::Binary(op).mnemonic();
        let (push_in, pull_out) = (format!("transpose-{mn}"), format!("{mn}-transpose"));
        // Transposes of both operands with one permutation: ranks are equal, so broadcasting
        // commutes with the permutation.
        out.push(rw(&push_in, SET, &format!("({mn} (transpose ?a ?p) (transpose ?b ?p))"),
            &format!("(transpose ({mn} ?a ?b) ?p)"),
            &format!("func @f(%x: f64[$a,$b,$c], %y: f64[$a,1,$c]) -> (f64[$c,$a,$b]) {{\n  %t = transpose %x {{perm=[2,0,1]}} : f64[$c,$a,$b]\n  %u = transpose %y {{perm=[2,0,1]}} : f64[$c,$a,1]\n  %r = {mn} %t, %u : f64[$c,$a,$b]\n  return %r\n}}\n")));
        out.push(rw_if(&pull_out, SET, &format!("(transpose ({mn} ?a ?b) ?p)"),
            &format!("({mn} (transpose ?a ?p) (transpose ?b ?p))"), |eg, m, s| {
                let r = rank(eg, m);
                rank(eg, var(s, "?a")) == r && rank(eg, var(s, "?b")) == r
            },
            &format!("func @f(%x: f64[$a,$b,$c], %y: f64[1,$b,$c]) -> (f64[$c,$a,$b]) {{\n  %t = {mn} %x, %y : f64[$a,$b,$c]\n  %r = transpose %t {{perm=[2,0,1]}} : f64[$c,$a,$b]\n  return %r\n}}\n")));
    }
    for &op in BINARY {
        let mn = OpKind::Binary(op).mnemonic();
        let (lhs_name, rhs_name) = (format!("{mn}-broadcast-lhs"), format!("{mn}-broadcast-rhs"));
        let keeps = |eg: &G, m: Id, s: &Subst| -> bool {
            let (a, b) = (ty(eg, var(s, "?a")), ty(eg, var(s, "?b")));
            match (a, b, ty(eg, m)) {
                (Some(a), Some(b), Some(t)) => {
                    broadcast_shapes(a.dims(), b.dims()).is_ok_and(|d| d == t.dims())
                }
                _ => false,
            }
        };
        out.push(rw_if(&lhs_name, SET, &format!("({mn} (broadcast_to ?a ?s) ?b)"),
            &format!("({mn} ?a ?b)"), keeps,
            &format!("func @f(%x: f64[$a,1,$c], %y: f64[$a,$b,$c]) -> (f64[$a,$b,$c]) {{\n  %t = broadcast_to %x {{shape=[$a,$b,$c]}} : f64[$a,$b,$c]\n  %r = {mn} %t, %y : f64[$a,$b,$c]\n  return %r\n}}\n")));
        out.push(rw_if(&rhs_name, SET, &format!("({mn} ?a (broadcast_to ?b ?s))"),
            &format!("({mn} ?a ?b)"), keeps,
            &format!("func @f(%x: f64[$a,1,$c], %y: f64[$a,$b,$c]) -> (f64[$a,$b,$c]) {{\n  %t = broadcast_to %x {{shape=[$a,$b,$c]}} : f64[$a,$b,$c]\n  %r = {mn} %y, %t : f64[$a,$b,$c]\n  return %r\n}}\n")));
    }
    out
}

/// `concat(a op c, b op d)` where `a op c` has `a`'s shape, `b op d` has `b`'s, and `c`, `d`
/// match `a`, `b` along the axis and each other elsewhere.
fn concat_binary(eg: &G, _: Id, s: &Subst) -> bool {
    let dims = |v: &str| ty(eg, var(s, v)).map(|t| t.dims().to_vec());
    let (Some(a), Some(b), Some(c), Some(d)) = (dims("?a"), dims("?b"), dims("?c"), dims("?d"))
    else {
        return false;
    };
    let Some(OpKind::Concat { axis }) = attrs(eg, s, "?ax") else {
        return false;
    };
    let r = a.len();
    let Some(ax) = normalize_axis(*axis, r) else {
        return false;
    };
    [&b, &c, &d].iter().all(|x| x.len() == r)
        && broadcast_shapes(&a, &c).is_ok_and(|x| x == a)
        && broadcast_shapes(&b, &d).is_ok_and(|x| x == b)
        && c[ax] == a[ax]
        && d[ax] == b[ax]
        && (0..r).all(|i| i == ax || c[i] == d[i])
}

/// The range `[start, end)` a unit-step slice takes of each axis, if every step is 1.
fn unit_ranges(kind: &OpKind, dims: &[u64]) -> Option<Vec<(u64, u64)>> {
    let OpKind::Slice {
        starts,
        ends,
        steps,
    } = kind
    else {
        return None;
    };
    (0..dims.len())
        .map(|i| {
            if steps.get(i).copied().unwrap_or(1) != 1 {
                return None;
            }
            let (s, n) = tcc_ir::typing::slice_range(dims[i], starts[i], ends[i], 1);
            Some((s as u64, s as u64 + n))
        })
        .collect()
}

fn slice_kind(ranges: &[(u64, u64)]) -> OpKind {
    OpKind::Slice {
        starts: ranges.iter().map(|r| r.0 as i64).collect(),
        ends: ranges.iter().map(|r| r.1 as i64).collect(),
        steps: vec![1; ranges.len()],
    }
}

/// `slice(concat(a, b, ...))` whose range along the axis lies within one operand: that operand,
/// sliced (or whole, when the slice takes all of it).
fn slice_of_concat(eg: &mut G, _: Id, s: &Subst) -> Option<Id> {
    let (c, sl) = (var(s, "?c"), attrs(eg, s, "?s")?.clone());
    let dims = ty(eg, c)?.dims().to_vec();
    let ranges = unit_ranges(&sl, &dims)?;
    for node in nodes_of(eg, c, OpId::Concat) {
        let ch = node_children(&node);
        let (ops, attr) = ch.split_at(ch.len() - 1);
        let Some(OpKind::Concat { axis }) = super::super::lang::attrs_of(eg, attr[0]).cloned()
        else {
            continue;
        };
        let ax = normalize_axis(axis, dims.len())?;
        let mut at = 0;
        for &o in ops {
            let od = ty(eg, o)?.dims().to_vec();
            let (lo, hi) = (at, at + od[ax]);
            at = hi;
            let (s0, s1) = ranges[ax];
            if s0 >= lo && s1 <= hi && s1 > s0 {
                let mut inner = ranges.clone();
                inner[ax] = (s0 - lo, s1 - lo);
                let whole = inner.iter().zip(&od).all(|(r, &d)| *r == (0, d));
                return Some(if whole {
                    o
                } else {
                    add_op(eg, slice_kind(&inner), vec![o])
                });
            }
        }
    }
    None
}

fn node_children(n: &super::Node) -> Vec<Id> {
    use egg::Language;
    n.children().to_vec()
}

/// A unit-step slice of a unit-step slice: one slice.
fn slice_slice(eg: &mut G, _: Id, s: &Subst) -> Option<Id> {
    let x = var(s, "?x");
    let dims = ty(eg, x)?.dims().to_vec();
    let outer = unit_ranges(attrs(eg, s, "?s")?, &dims)?;
    let mid: Vec<u64> = outer.iter().map(|r| r.1 - r.0).collect();
    let inner = unit_ranges(attrs(eg, s, "?t")?, &mid)?;
    let joined: Vec<(u64, u64)> = (outer.iter().zip(&inner))
        .map(|(o, i)| (o.0 + i.0, o.0 + i.1))
        .collect();
    let whole = joined.iter().zip(&dims).all(|(r, &d)| *r == (0, d));
    Some(if whole {
        x
    } else {
        add_op(eg, slice_kind(&joined), vec![x])
    })
}

/// `concat(slice(x, r1), slice(x, r2))` with `r2` continuing `r1` along the concat axis and
/// equal elsewhere: one slice of `x` (or `x`).
fn concat_of_slices(eg: &mut G, _: Id, s: &Subst) -> Option<Id> {
    let x = var(s, "?x");
    let dims = ty(eg, x)?.dims().to_vec();
    let a = unit_ranges(attrs(eg, s, "?s")?, &dims)?;
    let b = unit_ranges(attrs(eg, s, "?t")?, &dims)?;
    let Some(OpKind::Concat { axis }) = attrs(eg, s, "?ax") else {
        return None;
    };
    let ax = normalize_axis(*axis, dims.len())?;
    let others_equal = (0..dims.len()).all(|i| i == ax || a[i] == b[i]);
    if !others_equal || a[ax].1 != b[ax].0 {
        return None;
    }
    let mut joined = a.clone();
    joined[ax] = (a[ax].0, b[ax].1);
    let whole = joined.iter().zip(&dims).all(|(r, &d)| *r == (0, d));
    Some(if whole {
        x
    } else {
        add_op(eg, slice_kind(&joined), vec![x])
    })
}

//! `algebra`: identities of floating-point arithmetic, exact over the reals.
//!
//! Reassociation and factoring change rounding (as `-ffast-math`'s `reassoc` does). The rules
//! that assume finite values (`x * 0 -> 0`, `x - x -> 0`, `exp(a) * exp(b) <-> exp(a + b)`,
//! `a / b -> a * (1 / b)`) form the set `finite`, outside the default. Every rule is checked
//! against the interpreter in f64 on random finite inputs. Integer arithmetic is left alone (every rule
//! requires a float result).
//!
//! Associativity is only used to bring constants together, which then fold through the
//! analysis: `(x * 2) * 3` gains `x * 6`, and `(x + 1) + y` gains `(x + y) + 1` so that the
//! constant can meet the next one. Full associativity with commutativity makes every bracketing
//! of a sum of n terms equal (exponentially many e-nodes) and finds nothing more for the cost
//! model; it is not in the set. Commutativity alone at most doubles the e-nodes.

use super::{
    G, Rule, add_op, add_splat, float, rw, rw_if, rw_with, same_type, splat, splat_is, ty, var,
};
use egg::{Id, Subst};
use tcc_ir::OpKind;

const SET: &str = "algebra";

/// Rules that hold only for finite values that do not overflow: `x * 0 -> 0` and `x - x -> 0`
/// (NaN and infinity give NaN), `exp(a) * exp(b) <-> exp(a + b)` and `a / b -> a * (1 / b)`
/// (one side can overflow where the other does not). A set of their own, `finite`, that a
/// pipeline asks for, as `-ffast-math` is asked for.
const FINITE: &str = "finite";

/// Instantiates `body` as a function of three same-shaped inputs.
macro_rules! witness {
    ($body:literal) => {
        concat!(
            "func @f(%x: f64[$a,$b], %y: f64[$a,$b], %z: f64[$a,$b]) -> (f64[$a,$b]) {\n",
            $body,
            "}\n"
        )
    };
}

fn float_only(eg: &G, m: Id, _: &Subst) -> bool {
    float(eg, m)
}

fn is_const(eg: &G, id: Id) -> bool {
    eg[id].data.konst.is_some()
}

/// Whether `id` is a constant other than the identity of `+` (0) and `*` (1). Identities go
/// through `add-zero` and `mul-one`; an e-class equal to itself plus 0 would otherwise let the
/// constant rules build `x + x + ... + x` without end.
fn moving_const(eg: &G, id: Id) -> bool {
    is_const(eg, id) && !splat_is(eg, id, 0.0) && !splat_is(eg, id, 1.0)
}

/// `?a` and `?b` are constants (which then fold).
fn both_const(eg: &G, m: Id, s: &Subst) -> bool {
    float(eg, m) && moving_const(eg, var(s, "?a")) && moving_const(eg, var(s, "?b"))
}

/// `?a` is a constant and `?y` is not: the constant moves outward to meet others.
fn const_not_y(eg: &G, m: Id, s: &Subst) -> bool {
    float(eg, m) && moving_const(eg, var(s, "?a")) && !is_const(eg, var(s, "?y"))
}

/// The matched class is `?x` unchanged when `?c` is the splat `k` and the op keeps `?x`'s type.
fn identity_when(k: f64) -> impl Fn(&G, Id, &Subst) -> bool {
    move |eg, m, s| float(eg, m) && splat_is(eg, var(s, "?c"), k) && same_type(eg, m, s, "?x")
}

/// `x^e` for `e` a multiple of 1/4 with `|e| <= 4` (other than the exponents `pow-one`,
/// `pow-two`, `pow-half` and `pow-minus-one` take) as products of `x`, `sqrt x` and
/// `sqrt(sqrt x)`, and a reciprocal for negative `e`: the CPU backend computes these in its
/// generated kernels, where a general `pow` runs on the reference kernels. Local response
/// normalisation (`x^0.75`) is the common case. Exact over the reals; NaN for negative `x` as
/// `pow` gives.
fn pow_quarters(eg: &mut G, m: Id, s: &Subst) -> Option<Id> {
    use tcc_ir::{BinaryOp, UnaryOp};
    let e = splat(eg, var(s, "?c"))?;
    let q = e.abs() * 4.0;
    if !float(eg, m) || !same_type(eg, m, s, "?x") || q.fract() != 0.0 || q > 16.0 {
        return None;
    }
    if [0.0, 1.0, 2.0, -1.0, 0.5].contains(&e) {
        return None;
    }
    let q = q as u32;
    let x = var(s, "?x");
    let mut factors = vec![x; (q / 4) as usize];
    if q % 4 >= 2 {
        factors.push(add_op(eg, OpKind::Unary(UnaryOp::Sqrt), vec![x]));
    }
    if q % 2 == 1 {
        let r = add_op(eg, OpKind::Unary(UnaryOp::Sqrt), vec![x]);
        factors.push(add_op(eg, OpKind::Unary(UnaryOp::Sqrt), vec![r]));
    }
    let mut acc = factors[0];
    for &f in &factors[1..] {
        acc = add_op(eg, OpKind::Binary(BinaryOp::Mul), vec![acc, f]);
    }
    Some(if e < 0.0 {
        add_op(eg, OpKind::Unary(UnaryOp::Reciprocal), vec![acc])
    } else {
        acc
    })
}

pub(super) fn rules() -> Vec<Rule> {
    vec![
        rw_if(
            "add-comm",
            SET,
            "(add ?a ?b)",
            "(add ?b ?a)",
            float_only,
            witness!("  %r = add %x, %y : f64[$a,$b]\n  return %r\n"),
        ),
        rw_if(
            "mul-comm",
            SET,
            "(mul ?a ?b)",
            "(mul ?b ?a)",
            float_only,
            witness!("  %r = mul %x, %y : f64[$a,$b]\n  return %r\n"),
        ),
        rw_if(
            "add-constants",
            SET,
            "(add (add ?x ?a) ?b)",
            "(add ?x (add ?a ?b))",
            both_const,
            witness!(
                "  %c = const {value=1.5} : f64[]\n  %d = const {value=-2} : f64[$b]\n  %s = add %x, %c : f64[$a,$b]\n  %r = add %s, %d : f64[$a,$b]\n  return %r\n"
            ),
        ),
        rw_if(
            "mul-constants",
            SET,
            "(mul (mul ?x ?a) ?b)",
            "(mul ?x (mul ?a ?b))",
            both_const,
            witness!(
                "  %c = const {value=1.5} : f64[]\n  %d = const {value=-2} : f64[$b]\n  %s = mul %x, %c : f64[$a,$b]\n  %r = mul %s, %d : f64[$a,$b]\n  return %r\n"
            ),
        ),
        rw_if(
            "add-constant-out",
            SET,
            "(add (add ?x ?a) ?y)",
            "(add (add ?x ?y) ?a)",
            const_not_y,
            witness!(
                "  %c = const {value=1.5} : f64[]\n  %s = add %x, %c : f64[$a,$b]\n  %r = add %s, %y : f64[$a,$b]\n  return %r\n"
            ),
        ),
        rw_if(
            "mul-constant-out",
            SET,
            "(mul (mul ?x ?a) ?y)",
            "(mul (mul ?x ?y) ?a)",
            const_not_y,
            witness!(
                "  %c = const {value=1.5} : f64[]\n  %s = mul %x, %c : f64[$a,$b]\n  %r = mul %s, %y : f64[$a,$b]\n  return %r\n"
            ),
        ),
        rw_if(
            "add-zero",
            SET,
            "(add ?x ?c)",
            "?x",
            |eg, m, s| identity_when(0.0)(eg, m, s),
            witness!(
                "  %c = const {value=0} : f64[]\n  %r = add %x, %c : f64[$a,$b]\n  return %r\n"
            ),
        ),
        rw_if(
            "mul-one",
            SET,
            "(mul ?x ?c)",
            "?x",
            |eg, m, s| identity_when(1.0)(eg, m, s),
            witness!(
                "  %c = const {value=1} : f64[$a,$b]\n  %r = mul %x, %c : f64[$a,$b]\n  return %r\n"
            ),
        ),
        rw_if(
            "div-one",
            SET,
            "(div ?x ?c)",
            "?x",
            |eg, m, s| identity_when(1.0)(eg, m, s),
            witness!(
                "  %c = const {value=1} : f64[]\n  %r = div %x, %c : f64[$a,$b]\n  return %r\n"
            ),
        ),
        rw_if(
            "pow-one",
            SET,
            "(pow ?x ?c)",
            "?x",
            |eg, m, s| identity_when(1.0)(eg, m, s),
            witness!(
                "  %c = const {value=1} : f64[]\n  %r = pow %x, %c : f64[$a,$b]\n  return %r\n"
            ),
        ),
        rw_with(
            "mul-zero",
            FINITE,
            "(mul ?x ?c)",
            |eg, m, s| {
                if !(float(eg, m) && splat_is(eg, var(s, "?c"), 0.0)) {
                    return None;
                }
                let t = ty(eg, m)?.clone();
                Some(add_splat(eg, &t, 0.0))
            },
            witness!(
                "  %c = const {value=0} : f64[]\n  %r = mul %x, %c : f64[$a,$b]\n  return %r\n"
            ),
        ),
        rw_with(
            "sub-self",
            FINITE,
            "(sub ?x ?x)",
            |eg, m, _| {
                let t = ty(eg, m).filter(|t| t.dtype().is_float())?.clone();
                Some(add_splat(eg, &t, 0.0))
            },
            witness!("  %r = sub %x, %x : f64[$a,$b]\n  return %r\n"),
        ),
        rw_with(
            "add-self",
            SET,
            "(add ?x ?x)",
            |eg, m, s| {
                let t = ty(eg, m).filter(|t| t.dtype().is_float())?.dtype();
                let two = add_splat(eg, &tcc_ir::TensorType::scalar(t), 2.0);
                Some(add_op(
                    eg,
                    OpKind::Binary(tcc_ir::BinaryOp::Mul),
                    vec![var(s, "?x"), two],
                ))
            },
            witness!("  %r = add %x, %x : f64[$a,$b]\n  return %r\n"),
        ),
        rw_if(
            "sub-to-add-neg",
            SET,
            "(sub ?a ?b)",
            "(add ?a (neg ?b))",
            float_only,
            witness!("  %r = sub %x, %y : f64[$a,$b]\n  return %r\n"),
        ),
        rw_if(
            "add-neg-to-sub",
            SET,
            "(add ?a (neg ?b))",
            "(sub ?a ?b)",
            float_only,
            witness!("  %n = neg %y : f64[$a,$b]\n  %r = add %x, %n : f64[$a,$b]\n  return %r\n"),
        ),
        rw_if(
            "neg-neg",
            SET,
            "(neg (neg ?x))",
            "?x",
            float_only,
            witness!("  %n = neg %x : f64[$a,$b]\n  %r = neg %n : f64[$a,$b]\n  return %r\n"),
        ),
        rw_if(
            "neg-sub",
            SET,
            "(neg (sub ?a ?b))",
            "(sub ?b ?a)",
            float_only,
            witness!("  %s = sub %x, %y : f64[$a,$b]\n  %r = neg %s : f64[$a,$b]\n  return %r\n"),
        ),
        rw_if(
            "mul-neg",
            SET,
            "(mul (neg ?a) ?b)",
            "(neg (mul ?a ?b))",
            float_only,
            witness!("  %n = neg %x : f64[$a,$b]\n  %r = mul %n, %y : f64[$a,$b]\n  return %r\n"),
        ),
        rw_if(
            "neg-mul",
            SET,
            "(neg (mul ?a ?b))",
            "(mul (neg ?a) ?b)",
            float_only,
            witness!("  %m = mul %x, %y : f64[$a,$b]\n  %r = neg %m : f64[$a,$b]\n  return %r\n"),
        ),
        rw_if(
            "mul-minus-one",
            SET,
            "(mul ?x ?c)",
            "(neg ?x)",
            |eg, m, s| identity_when(-1.0)(eg, m, s),
            witness!(
                "  %c = const {value=-1} : f64[]\n  %r = mul %x, %c : f64[$a,$b]\n  return %r\n"
            ),
        ),
        rw_with(
            "neg-to-mul",
            SET,
            "(neg ?x)",
            |eg, m, s| {
                let t = ty(eg, m).filter(|t| t.dtype().is_float())?.dtype();
                let c = add_splat(eg, &tcc_ir::TensorType::scalar(t), -1.0);
                Some(add_op(
                    eg,
                    OpKind::Binary(tcc_ir::BinaryOp::Mul),
                    vec![var(s, "?x"), c],
                ))
            },
            witness!("  %r = neg %x : f64[$a,$b]\n  return %r\n"),
        ),
        rw_if(
            "factor",
            SET,
            "(add (mul ?x ?a) (mul ?x ?b))",
            "(mul ?x (add ?a ?b))",
            float_only,
            witness!(
                "  %p = mul %x, %y : f64[$a,$b]\n  %q = mul %x, %z : f64[$a,$b]\n  %r = add %p, %q : f64[$a,$b]\n  return %r\n"
            ),
        ),
        rw_if(
            "div-to-mul-reciprocal",
            FINITE,
            "(div ?a ?b)",
            "(mul ?a (reciprocal ?b))",
            float_only,
            witness!("  %r = div %x, %y : f64[$a,$b]\n  return %r\n"),
        ),
        rw_if(
            "mul-reciprocal-to-div",
            SET,
            "(mul ?a (reciprocal ?b))",
            "(div ?a ?b)",
            float_only,
            witness!(
                "  %v = reciprocal %y : f64[$a,$b]\n  %r = mul %x, %v : f64[$a,$b]\n  return %r\n"
            ),
        ),
        rw_if(
            "reciprocal-reciprocal",
            SET,
            "(reciprocal (reciprocal ?x))",
            "?x",
            float_only,
            witness!(
                "  %v = reciprocal %x : f64[$a,$b]\n  %r = reciprocal %v : f64[$a,$b]\n  return %r\n"
            ),
        ),
        rw_if(
            "exp-mul",
            FINITE,
            "(mul (exp ?a) (exp ?b))",
            "(exp (add ?a ?b))",
            float_only,
            witness!(
                "  %p = exp %x : f64[$a,$b]\n  %q = exp %y : f64[$a,$b]\n  %r = mul %p, %q : f64[$a,$b]\n  return %r\n"
            ),
        ),
        rw_if(
            "exp-add",
            FINITE,
            "(exp (add ?a ?b))",
            "(mul (exp ?a) (exp ?b))",
            float_only,
            witness!("  %s = add %x, %y : f64[$a,$b]\n  %r = exp %s : f64[$a,$b]\n  return %r\n"),
        ),
        rw_with(
            "pow-quarters",
            SET,
            "(pow ?x ?c)",
            pow_quarters,
            witness!(
                "  %e = exp %x : f64[$a,$b]\n  %c = const {value=-2.75} : f64[]\n  %r = pow %e, %c : f64[$a,$b]\n  return %r\n"
            ),
        ),
        rw_if(
            "pow-two",
            SET,
            "(pow ?x ?c)",
            "(mul ?x ?x)",
            |eg, m, s| identity_when(2.0)(eg, m, s),
            witness!(
                "  %c = const {value=2} : f64[]\n  %r = pow %x, %c : f64[$a,$b]\n  return %r\n"
            ),
        ),
        rw_if(
            "pow-half",
            SET,
            "(pow ?x ?c)",
            "(sqrt ?x)",
            |eg, m, s| identity_when(0.5)(eg, m, s),
            witness!(
                "  %e = exp %x : f64[$a,$b]\n  %c = const {value=0.5} : f64[]\n  %r = pow %e, %c : f64[$a,$b]\n  return %r\n"
            ),
        ),
        rw_if(
            "pow-minus-one",
            SET,
            "(pow ?x ?c)",
            "(reciprocal ?x)",
            |eg, m, s| identity_when(-1.0)(eg, m, s),
            witness!(
                "  %c = const {value=-1} : f64[]\n  %r = pow %x, %c : f64[$a,$b]\n  return %r\n"
            ),
        ),
        rw_if(
            "pow-minus-half",
            SET,
            "(pow ?x ?c)",
            "(rsqrt ?x)",
            |eg, m, s| identity_when(-0.5)(eg, m, s),
            witness!(
                "  %e = exp %x : f64[$a,$b]\n  %c = const {value=-0.5} : f64[]\n  %r = pow %e, %c : f64[$a,$b]\n  return %r\n"
            ),
        ),
        rw_if(
            "sqrt-to-pow",
            SET,
            "(mul (sqrt ?x) (sqrt ?x))",
            "?x",
            |eg, m, s| float(eg, m) && same_type(eg, m, s, "?x"),
            witness!(
                "  %e = exp %x : f64[$a,$b]\n  %q = sqrt %e : f64[$a,$b]\n  %r = mul %q, %q : f64[$a,$b]\n  return %r\n"
            ),
        ),
        rw_if(
            "rsqrt-to-reciprocal-sqrt",
            SET,
            "(rsqrt ?x)",
            "(reciprocal (sqrt ?x))",
            float_only,
            witness!("  %e = exp %x : f64[$a,$b]\n  %r = rsqrt %e : f64[$a,$b]\n  return %r\n"),
        ),
        rw(
            "relu-relu",
            SET,
            "(relu (relu ?x))",
            "(relu ?x)",
            witness!("  %p = relu %x : f64[$a,$b]\n  %r = relu %p : f64[$a,$b]\n  return %r\n"),
        ),
        rw_if(
            "reciprocal-sqrt-to-rsqrt",
            SET,
            "(reciprocal (sqrt ?x))",
            "(rsqrt ?x)",
            float_only,
            witness!(
                "  %e = exp %x : f64[$a,$b]\n  %q = sqrt %e : f64[$a,$b]\n  %r = reciprocal %q : f64[$a,$b]\n  return %r\n"
            ),
        ),
    ]
}

//! The rewrite rules, as data: named, grouped in sets a pipeline selects
//! (`eqsat{rules=[algebra,layout]}`), each with the condition it needs and a witness, a small
//! function the rule applies to, from which the soundness test builds random instances.
//!
//! A rule is a pattern rewrite (`(neg (neg ?x)) => ?x`), a pattern rewrite with a condition
//! (`(mul ?x ?one) => ?x` if `?one` is a splat of 1 and the product has `?x`'s type), or a
//! pattern with a function that builds the right-hand side (`transpose-transpose` composes the
//! permutations). Every rule runs wrapped so that the analysis knows which rule is applying:
//! a rule that equates values of different types is reported by name.

mod algebra;
mod graph;
mod layout;

use super::lang::{ConstRef, Node, Tag, TensorAnalysis, attrs_of};
use egg::{Applier, Condition, EGraph, Id, Pattern, PatternAst, Rewrite, Subst, Symbol, Var};
use tcc_ir::ops::OpId;
use tcc_ir::{Literal, OpKind, Scalar, TensorType};

/// The e-graph the rules run on.
pub type G = EGraph<Node, TensorAnalysis>;

/// A named rule of a set.
pub struct Rule {
    /// Its name, kebab-case, unique across sets.
    pub name: String,
    /// The set it belongs to.
    pub set: &'static str,
    /// The rewrite.
    pub rewrite: Rewrite<Node, TensorAnalysis>,
    /// A function the rule applies to: IR text in which `$a`, `$b`, `$c` and `$d` stand for
    /// dimensions the soundness test draws at random (`$b` at least 2), `$2b` for twice `$b`
    /// and `$b-1`, `$b+1`, `$b+$d`, `2*$c` ... `5*$c` for those sums and products.
    pub witness: String,
}

/// The rule sets.
pub const SETS: &[&str] = &["algebra", "finite", "layout", "graph"];

/// The sets `eqsat` runs unless told otherwise.
pub const DEFAULT_SETS: &[&str] = &["algebra", "layout", "graph"];

/// Every rule of the named sets; an unknown set is an error listing the valid ones.
pub fn rules(sets: &[String]) -> Result<Vec<Rule>, String> {
    let mut out = Vec::new();
    for s in sets {
        match s.as_str() {
            "algebra" | "finite" => out.extend(algebra::rules().into_iter().filter(|r| r.set == s)),
            "layout" => out.extend(layout::rules()),
            "graph" => out.extend(graph::rules()),
            _ => {
                return Err(format!(
                    "unknown rule set `{s}`; valid sets: {}",
                    SETS.join(", ")
                ));
            }
        }
    }
    Ok(out)
}

/// Every rule of every set.
pub fn all_rules() -> Vec<Rule> {
    let sets: Vec<String> = SETS.iter().map(|s| s.to_string()).collect();
    rules(&sets).expect("the sets exist")
}

fn pat(s: &str) -> Pattern<Node> {
    s.parse()
        .unwrap_or_else(|e| panic!("rule pattern `{s}` does not parse: {e}"))
}

/// `lhs => rhs`.
fn rw(name: &str, set: &'static str, lhs: &str, rhs: &str, witness: &str) -> Rule {
    make(name, set, pat(lhs), Tracked(pat(rhs)), witness)
}

/// `lhs => rhs` where `cond` holds.
fn rw_if(
    name: &str,
    set: &'static str,
    lhs: &str,
    rhs: &str,
    cond: fn(&G, Id, &Subst) -> bool,
    witness: &str,
) -> Rule {
    let applier = egg::ConditionalApplier {
        condition: FnCondition(cond),
        applier: pat(rhs),
    };
    make(name, set, pat(lhs), Tracked(applier), witness)
}

/// `lhs => build(...)`: `build` adds the right-hand side and returns its e-class, or `None`
/// when this match does not qualify.
fn rw_with(
    name: &str,
    set: &'static str,
    lhs: &str,
    build: fn(&mut G, Id, &Subst) -> Option<Id>,
    witness: &str,
) -> Rule {
    make(name, set, pat(lhs), Tracked(FnApplier(build)), witness)
}

/// A multi-pattern (`?a = (...), ?b = (...)`) whose matches `build` turns into pairs of
/// e-classes to union.
fn rw_multi(
    name: &str,
    set: &'static str,
    searcher: &str,
    build: fn(&mut G, &Subst) -> Vec<(Id, Id)>,
    witness: &str,
) -> Rule {
    let searcher: egg::MultiPattern<Node> = searcher
        .parse()
        .unwrap_or_else(|e| panic!("rule `{name}`: multi-pattern does not parse: {e}"));
    make(name, set, searcher, Tracked(MultiApplier(build)), witness)
}

struct MultiApplier(fn(&mut G, &Subst) -> Vec<(Id, Id)>);

impl Applier<Node, TensorAnalysis> for MultiApplier {
    fn apply_one(
        &self,
        egraph: &mut G,
        _: Id,
        subst: &Subst,
        _: Option<&PatternAst<Node>>,
        _: Symbol,
    ) -> Vec<Id> {
        let mut changed = Vec::new();
        for (a, b) in (self.0)(egraph, subst) {
            if egraph.union(a, b) {
                changed.push(a);
            }
        }
        changed
    }
}

/// The rule `searcher => applier` (every applier goes in [`Tracked`]).
fn make(
    name: &str,
    set: &'static str,
    searcher: impl egg::Searcher<Node, TensorAnalysis> + Send + Sync + 'static,
    applier: Tracked<impl Applier<Node, TensorAnalysis> + Send + Sync + 'static>,
    witness: &str,
) -> Rule {
    let rewrite =
        Rewrite::new(name, searcher, applier).unwrap_or_else(|e| panic!("rule `{name}`: {e}"));
    Rule {
        name: name.to_string(),
        set,
        rewrite,
        witness: witness.to_string(),
    }
}

/// Tells the analysis which rule is applying, then applies it.
struct Tracked<A>(A);

impl<A: Applier<Node, TensorAnalysis>> Applier<Node, TensorAnalysis> for Tracked<A> {
    fn apply_matches(
        &self,
        egraph: &mut G,
        matches: &[egg::SearchMatches<Node>],
        rule_name: Symbol,
    ) -> Vec<Id> {
        egraph.analysis.rule = Some(rule_name);
        let r = self.0.apply_matches(egraph, matches, rule_name);
        egraph.analysis.rule = None;
        r
    }

    fn apply_one(
        &self,
        egraph: &mut G,
        eclass: Id,
        subst: &Subst,
        ast: Option<&PatternAst<Node>>,
        rule_name: Symbol,
    ) -> Vec<Id> {
        self.0.apply_one(egraph, eclass, subst, ast, rule_name)
    }

    fn vars(&self) -> Vec<Var> {
        self.0.vars()
    }
}

struct FnCondition(fn(&G, Id, &Subst) -> bool);

impl Condition<Node, TensorAnalysis> for FnCondition {
    fn check(&self, egraph: &mut G, eclass: Id, subst: &Subst) -> bool {
        (self.0)(egraph, eclass, subst)
    }
}

struct FnApplier(fn(&mut G, Id, &Subst) -> Option<Id>);

impl Applier<Node, TensorAnalysis> for FnApplier {
    fn apply_one(
        &self,
        egraph: &mut G,
        eclass: Id,
        subst: &Subst,
        _: Option<&PatternAst<Node>>,
        _: Symbol,
    ) -> Vec<Id> {
        match (self.0)(egraph, eclass, subst) {
            Some(new) if egraph.union(eclass, new) => vec![eclass],
            _ => vec![],
        }
    }
}

// --- Helpers the rules share ---

/// The e-class a pattern variable is bound to.
fn var(subst: &Subst, name: &str) -> Id {
    subst[name.parse::<Var>().expect("a variable")]
}

/// The type of an e-class (`None` for an attribute leaf).
fn ty(eg: &G, id: Id) -> Option<&TensorType> {
    eg[id].data.ty.as_ref()
}

/// Whether the matched class has the type of the class bound to `v`.
fn same_type(eg: &G, matched: Id, subst: &Subst, v: &str) -> bool {
    ty(eg, matched) == ty(eg, var(subst, v))
}

/// Whether the matched class holds floats.
fn float(eg: &G, matched: Id) -> bool {
    ty(eg, matched).is_some_and(|t| t.dtype().is_float())
}

/// The value of a class known to be a splat constant.
fn splat(eg: &G, id: Id) -> Option<f64> {
    let k = eg[id].data.konst?;
    let lit = eg.analysis.tables.consts[k.0 as usize].value.as_ref()?;
    lit.as_splat().map(Scalar::to_f64)
}

/// Whether a class is a splat equal to `x`.
fn splat_is(eg: &G, id: Id, x: f64) -> bool {
    splat(eg, id) == Some(x)
}

/// Adds a constant splat of `x` with type `ty`.
fn add_splat(eg: &mut G, ty: &TensorType, x: f64) -> Id {
    let lit = Literal::Splat(Scalar::from_f64(ty.dtype(), x));
    let ConstRef(k) = eg.analysis.tables.intern_const(ty, Some(lit), None);
    eg.add(Node::Const(ConstRef(k)))
}

/// Adds `kind` applied to `args` (an attribute child is added for ops with attributes).
fn add_op(eg: &mut G, kind: OpKind, mut args: Vec<Id>) -> Id {
    let id = kind.id();
    if super::lang::has_attrs(id) {
        let a = eg.analysis.tables.intern_kind(kind);
        args.push(eg.add(Node::Attr(a)));
    }
    eg.add(Node::Op(Tag::Op(id), args))
}

/// The attributes bound to a pattern variable.
fn attrs<'g>(eg: &'g G, subst: &Subst, v: &str) -> Option<&'g OpKind> {
    attrs_of(eg, var(subst, v))
}

/// The nodes of class `id` that apply op `op`.
fn nodes_of(eg: &G, id: Id, op: OpId) -> Vec<Node> {
    eg[id]
        .nodes
        .iter()
        .filter(|n| matches!(n, Node::Op(Tag::Op(o), _) if *o == op))
        .cloned()
        .collect()
}

/// A pattern rule outside the sets, `lhs => rhs` (for tests and experiments: the soundness
/// test checks that it catches a wrong one). Panics if a pattern does not parse.
pub fn custom(name: &str, lhs: &str, rhs: &str, witness: &str) -> Rule {
    rw(name, "custom", lhs, rhs, witness)
}

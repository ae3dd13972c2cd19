//! The graph editor on small graphs: each capability of TensorFlow's old graph editor.

use std::collections::{HashMap, HashSet};
use tcc_ir::edit::*;
use tcc_ir::{Function, Op, Value, parse_function, verify_function};

const G: &str = "
func @g(%x: f32[4], %y: f32[4]) -> (f32[4]) {
  %a = exp %x : f32[4]
  %b = tanh %y : f32[4]
  %c = add %a, %b : f32[4]
  %d = neg %c : f32[4]
  %e = relu %c after %a : f32[4]
  %f = mul %d, %e : f32[4]
  return %f
}
";

fn g() -> Function {
    parse_function(G).unwrap()
}

fn v(f: &Function, name: &str) -> Value {
    f.lookup(name).unwrap_or_else(|| panic!("no value {name}"))
}

fn op(f: &Function, name: &str) -> Op {
    f.def_op(v(f, name)).unwrap()
}

fn names(f: &Function, ops: &[Op]) -> Vec<String> {
    ops.iter()
        .map(|&o| f.name(f.op(o).results[0]).to_string())
        .collect()
}

#[test]
fn consumers_and_producers() {
    let f = g();
    let u = Users::new(&f);
    assert_eq!(names(&f, &u.consumers(v(&f, "c"))), ["d", "e"]);
    assert_eq!(names(&f, &producers(&f, op(&f, "f"))), ["d", "e"]);
    assert_eq!(names(&f, u.control_dependents(op(&f, "a"))), ["e"]);
    assert_eq!(names(&f, &u.op_consumers(&f, op(&f, "a"))), ["c"]);
    assert!(
        producers(&f, op(&f, "a")).is_empty(),
        "parameters have no producer op"
    );
}

#[test]
fn forward_walks() {
    let f = g();
    let u = Users::new(&f);
    let a = Seed::Op(op(&f, "a"));
    let all = WalkOptions {
        inclusive: true,
        ..Default::default()
    };
    assert_eq!(
        names(&f, &walk_forward(&f, &u, &[a], all)),
        ["a", "c", "d", "e", "f"]
    );
    let excl = WalkOptions::default();
    assert_eq!(
        names(&f, &walk_forward(&f, &u, &[a], excl)),
        ["c", "d", "e", "f"]
    );

    // Stopping at %c: its consumers are not visited, though %c's op itself is reached.
    let stop: HashSet<Value> = [v(&f, "c")].into();
    let o = WalkOptions {
        inclusive: true,
        stop_at: Some(&stop),
        ..Default::default()
    };
    assert_eq!(names(&f, &walk_forward(&f, &u, &[a], o)), ["a", "c"]);
    // With control edges, %a reaches %e directly.
    let o = WalkOptions { control: true, ..o };
    assert_eq!(
        names(&f, &walk_forward(&f, &u, &[a], o)),
        ["a", "c", "e", "f"]
    );

    let within: HashSet<Op> = [op(&f, "a"), op(&f, "c"), op(&f, "e")].into();
    let o = WalkOptions {
        inclusive: true,
        within: Some(&within),
        ..Default::default()
    };
    assert_eq!(names(&f, &walk_forward(&f, &u, &[a], o)), ["a", "c", "e"]);

    // A value seed starts at its consumers.
    let o = WalkOptions {
        inclusive: true,
        ..Default::default()
    };
    assert_eq!(
        names(&f, &walk_forward(&f, &u, &[Seed::Value(v(&f, "y"))], o)),
        ["b", "c", "d", "e", "f"]
    );
}

#[test]
fn backward_walks() {
    let f = g();
    let fo = Seed::Op(op(&f, "f"));
    let all = WalkOptions {
        inclusive: true,
        ..Default::default()
    };
    assert_eq!(
        names(&f, &walk_backward(&f, &[fo], all)),
        ["a", "b", "c", "d", "e", "f"]
    );
    let stop: HashSet<Value> = [v(&f, "c")].into();
    let o = WalkOptions {
        inclusive: true,
        stop_at: Some(&stop),
        ..Default::default()
    };
    assert_eq!(names(&f, &walk_backward(&f, &[fo], o)), ["d", "e", "f"]);
    let o = WalkOptions { control: true, ..o };
    assert_eq!(
        names(&f, &walk_backward(&f, &[fo], o)),
        ["a", "d", "e", "f"]
    );
    // A value seed starts at its defining op; parameters have none.
    assert_eq!(
        names(&f, &walk_backward(&f, &[Seed::Value(v(&f, "c"))], all)),
        ["a", "b", "c"]
    );
    assert!(walk_backward(&f, &[Seed::Value(v(&f, "x"))], all).is_empty());
}

#[test]
fn reroute_restricted_to_consumers() {
    let mut f = g();
    let only_d: HashSet<Op> = [op(&f, "d")].into();
    let (p, q) = (v(&f, "c"), v(&f, "a"));
    let n = reroute(&mut f, &[p], &[q], CanModify::Ops(&only_d)).unwrap();
    assert_eq!(n, 1);
    assert_eq!(f.op(op(&f, "d")).args, [v(&f, "a")]);
    assert_eq!(
        f.op(op(&f, "e")).args,
        [v(&f, "c")],
        "ops outside can_modify are untouched"
    );
    verify_function(&f).unwrap();

    // Unrestricted, results move too.
    let (p, q) = (v(&f, "f"), v(&f, "x"));
    let n = reroute(&mut f, &[p], &[q], CanModify::All).unwrap();
    assert_eq!(n, 1);
    assert_eq!(f.results(), [v(&f, "x")]);
}

#[test]
fn reroute_checks_types() {
    let mut f = parse_function(
        "func @h(%x: f32[4], %y: f32[2]) -> (f32[4]) {\n  %a = exp %x : f32[4]\n  return %a\n}\n",
    )
    .unwrap();
    let (p, q) = (v(&f, "x"), v(&f, "y"));
    let e = reroute(&mut f, &[p], &[q], CanModify::All).unwrap_err();
    assert!(e.0.contains("types differ"), "{e}");
    let p = v(&f, "x");
    let e = reroute(&mut f, &[p], &[], CanModify::All).unwrap_err();
    assert!(e.0.contains("as many sources as targets"), "{e}");
}

#[test]
fn swap_exchanges_uses() {
    let mut f = g();
    let only_c: HashSet<Op> = [op(&f, "c")].into();
    let (p, q) = (v(&f, "a"), v(&f, "b"));
    let n = swap(&mut f, &[p], &[q], CanModify::Ops(&only_c)).unwrap();
    assert_eq!(n, 2);
    assert_eq!(f.op(op(&f, "c")).args, [v(&f, "b"), v(&f, "a")]);
    verify_function(&f).unwrap();
}

#[test]
fn copy_with_input_replacements() {
    let mut f = g();
    let (c, d) = (op(&f, "c"), op(&f, "d"));
    let repl: HashMap<Value, Value> = [(v(&f, "a"), v(&f, "b"))].into();
    let anchor = op(&f, "f");
    let map = copy_ops(&mut f, &[d, c], &repl, Placement::Before(anchor));
    assert_eq!(map.ops.len(), 2);
    let (c2, d2) = (map.ops[&c], map.ops[&d]);
    assert_eq!(f.name(f.op(c2).results[0]), "c.1");
    assert_eq!(f.name(f.op(d2).results[0]), "d.1");
    // The copy of %c reads the replacement; the copy of %d reads the copy of %c.
    assert_eq!(f.op(c2).args, [v(&f, "b"), v(&f, "b")]);
    assert_eq!(f.op(d2).args, [map.values[&v(&f, "c")]]);
    assert_eq!(
        names(&f, f.schedule()),
        ["a", "b", "c", "d", "e", "c.1", "d.1", "f"]
    );
    verify_function(&f).unwrap();
    // The originals are unchanged.
    assert_eq!(f.op(c).args, [v(&f, "a"), v(&f, "b")]);
}

#[test]
fn copies_follow_control_edges_to_copies() {
    let mut f = g();
    let (a, e) = (op(&f, "a"), op(&f, "e"));
    let map = copy_ops(&mut f, &[a, e], &HashMap::new(), Placement::End);
    assert_eq!(f.op(map.ops[&e]).deps, [map.ops[&a]]);
    let unscheduled = copy_ops(&mut f, &[a], &HashMap::new(), Placement::Unscheduled);
    assert!(!f.schedule().contains(&unscheduled.ops[&a]));
}

#[test]
fn level_toposort_groups_independent_ops() {
    let f = g();
    let levels: Vec<Vec<String>> = level_toposort(&f).iter().map(|l| names(&f, l)).collect();
    assert_eq!(
        levels,
        [vec!["a", "b"], vec!["c"], vec!["d", "e"], vec!["f"]]
    );
}

#[test]
fn select_by_regex_and_scope() {
    let f = parse_function(
        "func @s(%blk1/w: f32[2]) -> (f32[2]) {
  %blk1/conv = neg %blk1/w : f32[2]
  %blk1/relu = relu %blk1/conv : f32[2]
  %blk10/conv = exp %blk1/relu : f32[2]
  %head = tanh %blk10/conv : f32[2]
  return %head
}",
    )
    .unwrap();
    let names_of = |vs: Vec<Value>| {
        vs.iter()
            .map(|&x| f.name(x).to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        names_of(scope_values(&f, "blk1")),
        ["blk1/w", "blk1/conv", "blk1/relu"]
    );
    assert_eq!(
        names_of(scope_values(&f, "blk1/")),
        ["blk1/w", "blk1/conv", "blk1/relu"]
    );
    assert_eq!(
        names_of(select_values(&f, "conv$").unwrap()),
        ["blk1/conv", "blk10/conv"]
    );
    assert_eq!(
        names(&f, &select_ops(&f, "^blk1[0-9]*/").unwrap()),
        ["blk1/conv", "blk1/relu", "blk10/conv"]
    );
    let e = select_values(&f, "(").unwrap_err();
    assert!(e.0.contains("bad name pattern"), "{e}");
}

#[test]
fn dependents_sweep_with_edge_conditions() {
    let f = g();
    let marked = |dep: &cranelift_entity::SecondaryMap<Value, bool>| {
        let mut m: Vec<&str> = f
            .schedule()
            .iter()
            .flat_map(|&o| f.op(o).results.clone())
            .filter(|&r| dep[r])
            .map(|r| f.name(r))
            .collect();
        m.sort();
        m
    };
    // Everything downstream of %x: a, c, d, e, f (b reads only %y; the control edge a -> e
    // carries no data).
    let all = dependents(&f, &[v(&f, "x")], |_, _, _| true);
    assert!(all[v(&f, "x")] && !all[v(&f, "y")]);
    assert_eq!(marked(&all), ["a", "c", "d", "e", "f"]);
    // Blocking the edge from %c into neg: d no longer depends, f still does through e.
    let (c, d) = (v(&f, "c"), v(&f, "d"));
    let some = dependents(&f, &[v(&f, "x")], |_, a, r| !(a == c && r == d));
    assert_eq!(marked(&some), ["a", "c", "e", "f"]);
}

/// A parameter that nothing reads can be removed: the later ones move up and the function
/// verifies and prints without it; one still read (or returned) cannot.
#[test]
fn unused_parameters_are_removed() {
    let mut f = parse_function(
        "func @f(%x: f32[4], %w: f32[4], %y: f32[4]) -> (f32[4], f32[4]) {
  %c = const {value=2.0} : f32[4]
  %a = mul %x, %c : f32[4]
  return %a, %y
}",
    )
    .unwrap();
    let w = v(&f, "w");
    let y = v(&f, "y");
    f.remove_param(w).unwrap();
    verify_function(&f).unwrap();
    assert_eq!(f.params(), &[v(&f, "x"), y]);
    assert!(f.lookup("w").is_none());
    assert!(
        f.to_string().starts_with("func @f(%x: f32[4], %y: f32[4])"),
        "{f}"
    );
    let e = f.remove_param(y).unwrap_err();
    assert!(e.contains("parameter %y is still used"), "{e}");
    let x = v(&f, "x");
    assert!(f.remove_param(x).is_err());
    assert!(
        f.remove_param(v(&f, "a"))
            .unwrap_err()
            .contains("not a parameter")
    );
}

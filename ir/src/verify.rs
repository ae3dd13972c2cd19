//! The verifier: checks that a function is well formed and reports every problem it finds.
//!
//! Checked: each scheduled op appears once; every operand is defined earlier in the schedule
//! (or is a parameter); operand and result counts; the type rule of every op against its declared
//! result types; control dependencies name scheduled ops that run earlier (a violation is traced
//! to the cycle it closes, if any); results are defined; host values (`swap_out`'s results) are
//! read only by `swap_in`, which reads nothing else, and are not results. Each diagnostic names the function and
//! the op (`op7 (%h = matmul %x, %w)`) and carries the op's source location when it has one.

use crate::diag::{Diagnostic, Diagnostics, clip};
use crate::function::{Function, Module, Op, Value, ValueDef};
use crate::printer::write_name;
use crate::typing::infer;
use cranelift_entity::SecondaryMap;
use std::collections::HashSet;

fn vname(f: &Function, v: Value) -> String {
    let mut s = String::new();
    let _ = write_name(&mut s, '%', f.name(v));
    clip(&s)
}

struct Checker<'f> {
    f: &'f Function,
    errors: Vec<Diagnostic>,
}

impl Checker<'_> {
    fn at(&mut self, op: Op, msg: String) {
        let text = format!(
            "in `@{}`, {}: {msg}",
            clip(&self.f.name),
            clip(&self.f.describe_op(op))
        );
        self.errors.push(match self.f.loc(op) {
            Some(l) => Diagnostic::at(l, text),
            None => Diagnostic::new(text),
        });
    }

    fn func(&mut self, msg: String) {
        self.errors
            .push(Diagnostic::new(format!("in `@{}`: {msg}", self.f.name)));
    }
}

/// Verifies one function.
pub fn verify_function(f: &Function) -> Result<(), Diagnostics> {
    let mut c = Checker {
        f,
        errors: Vec::new(),
    };
    let pos = {
        let mut pos: SecondaryMap<Op, Option<u32>> =
            SecondaryMap::with_capacity(f.num_ops_created());
        for (i, &op) in f.schedule().iter().enumerate() {
            if pos[op].is_some() {
                c.at(op, "appears twice in the schedule".into());
            } else {
                pos[op] = Some(i as u32);
            }
        }
        pos
    };
    for (i, &p) in f.params().iter().enumerate() {
        if f.value(p).def != ValueDef::Param(i) {
            c.func(format!(
                "parameter {i} ({}) is not recorded as parameter {i}",
                vname(f, p)
            ));
        }
    }
    if let Some(b) = f.backward_start()
        && pos.get(b).copied().flatten().is_none()
    {
        c.func(format!(
            "the backward part starts at {b}, which is not scheduled"
        ));
    }
    let mut forward_dep = false;
    for (i, &op) in f.schedule().iter().enumerate() {
        let i = i as u32;
        if pos[op] != Some(i) {
            continue; // a duplicate, already reported
        }
        let d = f.op(op);
        let mut args_ok = true;
        for &a in &d.args {
            match f.value(a).def {
                ValueDef::Param(_) => {}
                ValueDef::Result(def, _) => match pos[def] {
                    Some(p) if p < i => {}
                    Some(_) => {
                        args_ok = false;
                        c.at(op, format!("uses {} before its definition", vname(f, a)));
                    }
                    None => {
                        args_ok = false;
                        c.at(
                            op,
                            format!(
                                "uses {}, whose defining op is not in the schedule",
                                vname(f, a)
                            ),
                        );
                    }
                },
            }
        }
        // Memory spaces: host values (`swap_out`'s results) are read by `swap_in` alone, and
        // `swap_in` reads nothing else.
        let swap_in = matches!(d.kind, crate::OpKind::SwapIn);
        for &a in &d.args {
            if f.is_host(a) && !swap_in {
                c.at(
                    op,
                    format!(
                        "reads {}, a host value (a `swap_out`'s result): only `swap_in` reads \
                         host values, so swap it in first",
                        vname(f, a)
                    ),
                );
            } else if swap_in && !f.is_host(a) {
                c.at(
                    op,
                    format!(
                        "`swap_in` reads {}, which is in device memory already: its operand \
                         must be a `swap_out`'s result",
                        vname(f, a)
                    ),
                );
            }
        }
        for (k, &r) in d.results.iter().enumerate() {
            if f.value(r).def != ValueDef::Result(op, k) {
                c.at(
                    op,
                    format!(
                        "result {k} ({}) is not recorded as defined here",
                        vname(f, r)
                    ),
                );
            }
            if f.name(r).is_empty() {
                c.at(op, format!("result {k} has an empty name"));
            }
        }
        let arity = d.kind.arity();
        let n_res = d.kind.num_results();
        if !arity.accepts(d.args.len()) {
            c.at(
                op,
                format!(
                    "`{}` takes {arity}, found {}",
                    d.kind.mnemonic(),
                    d.args.len()
                ),
            );
        } else if d.results.len() != n_res {
            c.at(
                op,
                format!(
                    "`{}` produces {n_res} result{}, found {}",
                    d.kind.mnemonic(),
                    if n_res == 1 { "" } else { "s" },
                    d.results.len()
                ),
            );
        } else if args_ok {
            let arg_types: Vec<_> = d.args.iter().map(|&a| f.ty(a)).collect();
            match infer(&d.kind, &arg_types) {
                Err(e) => c.at(op, e),
                Ok(tys) => {
                    for (k, (t, &r)) in tys.iter().zip(&d.results).enumerate() {
                        if t != f.ty(r) {
                            let which = if n_res == 1 {
                                String::new()
                            } else {
                                format!(" {k}")
                            };
                            c.at(
                                op,
                                format!(
                                    "result{which} is declared {} but the type rule gives {t}",
                                    f.ty(r)
                                ),
                            );
                        }
                    }
                }
            }
        }
        for &dep in &d.deps {
            let name = f
                .op(dep)
                .results
                .first()
                .map_or(dep.to_string(), |&r| vname(f, r));
            match pos[dep] {
                Some(p) if p < i => {}
                Some(p) if p == i => c.at(op, "has a control dependency on itself".into()),
                Some(_) => {
                    forward_dep = true;
                    c.at(
                        op,
                        format!("control dependency on {name}, which is scheduled after it"),
                    );
                }
                None => c.at(
                    op,
                    format!("control dependency on {name}, which is not in the schedule"),
                ),
            }
        }
    }
    if forward_dep && let Some(cycle) = find_cycle(f, &pos) {
        let names: Vec<String> = cycle
            .iter()
            .map(|&op| {
                f.op(op)
                    .results
                    .first()
                    .map_or(op.to_string(), |&r| vname(f, r))
            })
            .collect();
        c.at(
            cycle[0],
            format!("cycle through control edges: {}", names.join(" -> ")),
        );
    }
    for (k, &r) in f.results().iter().enumerate() {
        if f.is_host(r)
            && let Some(def) = f.def_op(r)
        {
            c.at(
                def,
                format!(
                    "{} is returned (result {k}), but it is a host value: results are in \
                     device memory, so return its `swap_in`",
                    vname(f, r)
                ),
            );
        }
        if let ValueDef::Result(def, _) = f.value(r).def
            && pos[def].is_none()
        {
            c.func(format!(
                "result {k} ({}) is defined by an op that is not in the schedule",
                vname(f, r)
            ));
        }
    }
    if c.errors.is_empty() {
        Ok(())
    } else {
        Err(Diagnostics(c.errors))
    }
}

/// A cycle among scheduled ops through data and control edges, as a path that returns to its
/// first op; `None` if the graph is acyclic.
pub fn find_cycle(f: &Function, pos: &SecondaryMap<Op, Option<u32>>) -> Option<Vec<Op>> {
    // Edges point from an op to the ops it depends on. Iterative DFS with colours.
    let preds = |op: Op| -> Vec<Op> {
        let d = f.op(op);
        d.args
            .iter()
            .filter_map(|&a| f.def_op(a))
            .chain(d.deps.iter().copied())
            .filter(|&p| pos[p].is_some())
            .collect()
    };
    #[derive(Clone, Copy, Default, PartialEq)]
    enum Colour {
        #[default]
        White,
        Grey,
        Black,
    }
    let mut colour: SecondaryMap<Op, Colour> = SecondaryMap::with_capacity(f.num_ops_created());
    for &root in f.schedule() {
        if colour[root] != Colour::White {
            continue;
        }
        let mut stack: Vec<(Op, Vec<Op>, usize)> = vec![(root, preds(root), 0)];
        colour[root] = Colour::Grey;
        while let Some((op, ps, k)) = stack.last_mut() {
            if *k < ps.len() {
                let p = ps[*k];
                *k += 1;
                match colour[p] {
                    Colour::White => {
                        colour[p] = Colour::Grey;
                        let pp = preds(p);
                        stack.push((p, pp, 0));
                    }
                    Colour::Grey => {
                        let start = stack
                            .iter()
                            .position(|e| e.0 == p)
                            .expect("grey ops are on the stack");
                        let mut cycle: Vec<Op> = stack[start..].iter().map(|e| e.0).collect();
                        cycle.reverse();
                        cycle.rotate_right(1);
                        cycle.push(cycle[0]);
                        return Some(cycle);
                    }
                    Colour::Black => {}
                }
            } else {
                colour[*op] = Colour::Black;
                stack.pop();
            }
        }
    }
    None
}

/// Verifies every function of a module, and that function names are distinct.
pub fn verify_module(m: &Module) -> Result<(), Diagnostics> {
    let mut errors = Vec::new();
    let mut seen = HashSet::new();
    for f in &m.functions {
        if !seen.insert(f.name.as_str()) {
            errors.push(Diagnostic::new(format!(
                "function `@{}` is defined twice",
                f.name
            )));
        }
        if let Err(d) = verify_function(f) {
            errors.extend(d.0);
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(Diagnostics(errors))
    }
}

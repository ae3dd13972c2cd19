//! `cse`: common-subexpression elimination.
//!
//! Two scheduled ops with the same kind and attributes, the same operands and the same control
//! dependencies compute the same values (ops are pure unless the op table flags side effects;
//! those are never merged), so the later one is removed and its uses read the earlier one's
//! results. The survivor keeps its name. Constants are compared by
//! value (floats bitwise). One forward sweep with a substitution table: O(ops).

use crate::manager::Pass;
use cranelift_entity::SecondaryMap;
use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use tcc_ir::{Function, Op, Value};

/// Merges duplicate ops; returns how many were removed.
pub fn cse(f: &mut Function) -> usize {
    let mut subst: SecondaryMap<Value, Option<Value>> =
        SecondaryMap::with_capacity(f.num_values_created());
    let mut op_subst: SecondaryMap<Op, Option<Op>> =
        SecondaryMap::with_capacity(f.num_ops_created());
    let mut table: HashMap<u64, Vec<Op>> = HashMap::new();
    let mut removed = 0;
    for op in f.schedule().to_vec() {
        let d = f.op_mut(op);
        for a in &mut d.args {
            if let Some(s) = subst[*a] {
                *a = s;
            }
        }
        for dep in &mut d.deps {
            if let Some(s) = op_subst[*dep] {
                *dep = s;
            }
        }
        let d = f.op(op);
        if d.kind.has_side_effects() || d.kind.is_swap() {
            continue;
        }
        let mut h = DefaultHasher::new();
        (&d.kind, &d.args, &d.deps).hash(&mut h);
        let bucket = table.entry(h.finish()).or_default();
        let same = bucket.iter().copied().find(|&e| {
            let e = f.op(e);
            e.kind == d.kind && e.args == d.args && e.deps == d.deps
        });
        match same {
            Some(e) => {
                for (&r, &er) in d.results.iter().zip(&f.op(e).results) {
                    subst[r] = Some(er);
                }
                op_subst[op] = Some(e);
                removed += 1;
            }
            None => bucket.push(op),
        }
    }
    if removed > 0 {
        let results: Vec<Value> = f.results().iter().map(|&r| subst[r].unwrap_or(r)).collect();
        f.set_results(results);
        f.remove_ops(|op| op_subst[op].is_some());
    }
    removed
}

pub(crate) struct Cse;

impl Pass for Cse {
    fn name(&self) -> &'static str {
        "cse"
    }
    fn run_on_function(&self, f: &mut Function) -> Result<(), String> {
        cse(f);
        Ok(())
    }
}

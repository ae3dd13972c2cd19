//! `dce`: dead-code elimination.
//!
//! Removes every scheduled op none of whose results reaches a function result, through data or
//! control edges. An op that a live op names in `after` stays: control edges exist to order ops
//! that matter (swapping, recomputation), so they keep their targets alive, and an op the op table
//! flags as having side effects stays with everything it reads. One backward sweep
//! over the schedule; names of the survivors are unchanged.

use crate::manager::Pass;
use cranelift_entity::SecondaryMap;
use tcc_ir::{Function, Op, Value};

/// Removes dead ops; returns how many were removed.
pub fn dce(f: &mut Function) -> usize {
    let mut live_val: SecondaryMap<Value, bool> =
        SecondaryMap::with_capacity(f.num_values_created());
    let mut live_op: SecondaryMap<Op, bool> = SecondaryMap::with_capacity(f.num_ops_created());
    for &r in f.results() {
        live_val[r] = true;
    }
    for &op in f.schedule().iter().rev() {
        let d = f.op(op);
        if live_op[op] || d.kind.has_side_effects() || d.results.iter().any(|&r| live_val[r]) {
            live_op[op] = true;
            for &a in &d.args {
                live_val[a] = true;
            }
            for &dep in &d.deps {
                live_op[dep] = true;
            }
        }
    }
    f.remove_ops(|op| !live_op[op])
}

pub(crate) struct Dce;

impl Pass for Dce {
    fn name(&self) -> &'static str {
        "dce"
    }
    fn run_on_function(&self, f: &mut Function) -> Result<(), String> {
        dce(f);
        Ok(())
    }
}

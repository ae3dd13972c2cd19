//! Row-pass kernels ([`crate::kernel::rows`]) as Cranelift loops. For each row of the kernel's
//! share: the row's scalars that are kernel inputs are loaded, then each stage's narrow ops run
//! once on scalars, and its pass runs along the row: a reduction's pass folds as the reduction
//! kernels fold ([`super::fold_row`]: two `f32x4` accumulators, then a scalar tail), the last
//! pass stores the wide outputs (four lanes, then a scalar tail). Wide values a pass needs are
//! recomputed from the row (in the cache by then), never stored between passes.

use super::{FoldVars, Target, define_kernel, emit_for, fold_row, load_operands};
use crate::cpu::render::{num_const, render};
use crate::kernel::expr::{Bin, Body, Lane};
use crate::kernel::lower::{body as body_of, small_body};
use crate::kernel::rows::{RowAccess, RowPasses};
use crate::plan::KernelData;
use cranelift_codegen::ir::{
    InstBuilder, MemFlags, StackSlot, StackSlotData, StackSlotKind, Type, Value as CValue, types,
};
use cranelift_frontend::FunctionBuilder;
use cranelift_jit::JITModule;
use cranelift_module::FuncId;
use std::collections::HashMap;
use tcc_ir::{DType, Function, ReduceOp, Value};

/// Compiles row-pass kernel `k` of layout `rp` into `module` under `name`; its iteration
/// space is its rows.
pub(super) fn compile_row_passes(
    module: &mut JITModule,
    tg: Target,
    f: &Function,
    k: &KernelData,
    rp: &RowPasses,
    name: &str,
) -> Result<FuncId, String> {
    let len = rp.len;
    // Each stage's bodies: its narrow ops on scalars, its pass's value at an element, and the
    // step that folds that value into an accumulator.
    let bodies: Vec<(Body, Body, Option<Body>)> = (rp.stages.iter())
        .map(|s| {
            let narrow_out: Vec<Value> = (s.narrow.iter()).map(|&o| f.op(o).results[0]).collect();
            let narrow = body_of(
                Lane::F32,
                f,
                &s.narrow_args,
                0,
                &s.narrow,
                |_, _, _| {},
                &narrow_out,
            );
            let pass = body_of(Lane::F32, f, &s.args, 0, &s.wide, |_, _, _| {}, &s.results);
            let step = s.reduce.map(|(_, op)| {
                small_body(2, |b, a| match op {
                    ReduceOp::Max => b.bin(Bin::Max, a[0], a[1]),
                    ReduceOp::Sum | ReduceOp::Mean => b.add(a[0], a[1]),
                })
            });
            (narrow, pass, step)
        })
        .collect();
    let input = |v: &Value| k.inputs.iter().position(|x| x == v);
    let output = |v: &Value| k.outputs.iter().position(|x| x == v).expect("an output");
    define_kernel(module, name, |b, ptr, table, start, end| {
        let flags = MemFlags::trusted();
        let n_in = k.inputs.len();
        let bases: Vec<CValue> = (0..n_in + k.outputs.len())
            .map(|j| b.ins().load(ptr, flags, table, (j * 8) as i32))
            .collect();
        // Inputs read as one value for the whole kernel.
        let mut consts: HashMap<Value, CValue> = HashMap::new();
        for (j, read) in rp.reads.iter().enumerate() {
            if let RowAccess::Scalar(c) = *read {
                let x = match c {
                    Some(x) => num_const(b, types::F32, x),
                    None => b.ins().load(types::F32, flags, bases[j], 0),
                };
                consts.insert(k.inputs[j], x);
            }
        }
        let slot =
            b.create_sized_stack_slot(StackSlotData::new(StackSlotKind::ExplicitSlot, 16, 4));
        let (r, j) = (b.declare_var(types::I64), b.declare_var(types::I64));
        let (acc, acc_a, acc_b) = (
            b.declare_var(types::F32),
            b.declare_var(types::F32X4),
            b.declare_var(types::F32X4),
        );
        let zero = b.ins().iconst(types::I64, 0);
        let len_v = b.ins().iconst(types::I64, len as i64);
        let len4 = b.ins().iconst(types::I64, (len & !3) as i64);
        emit_for(b, r, start, end, 1, |b, rv| {
            let row = b.ins().imul_imm(rv, len as i64);
            // Where the row starts in each operand of the row shape, and in each output.
            let starts: Vec<CValue> = (0..n_in + k.outputs.len())
                .map(|i| {
                    let off = b.ins().imul_imm(rv, 4 * len as i64);
                    let p = b.ins().iadd(bases[i], off);
                    settle(b, slot, p)
                })
                .collect();
            // The row's scalars: kernel inputs constant along it, then narrow values and
            // reductions as the stages compute them.
            let mut sc = consts.clone();
            for (jn, read) in rp.reads.iter().enumerate() {
                if let RowAccess::PerRow(a) = *read {
                    let x = load_operands(
                        b,
                        types::F32,
                        row,
                        &[DType::F32],
                        &[a],
                        &[bases[jn]],
                        &[None],
                    );
                    sc.insert(k.inputs[jn], x[0]);
                }
            }
            for (s, (narrow, pass, step)) in rp.stages.iter().zip(&bodies) {
                let args: Vec<CValue> = s.narrow_args.iter().map(|v| sc[v]).collect();
                let outs = render(b, tg, types::F32, narrow, &args);
                for (&op, x) in s.narrow.iter().zip(outs) {
                    sc.insert(f.op(op).results[0], settle(b, slot, x));
                }
                // The pass's arguments at element `e` of the row (`e` the row's start plus
                // the element's index `at`), four lanes or one.
                let mut splats: HashMap<Value, CValue> = HashMap::new();
                for v in &s.args {
                    if let Some(&x) = sc.get(v) {
                        let x4 = b.ins().splat(types::F32X4, x);
                        splats.insert(*v, settle(b, slot, x4));
                    }
                }
                let value_at = |b: &mut FunctionBuilder, lane: Type, at: CValue| {
                    let args: Vec<CValue> = (s.args.iter())
                        .map(|v| match input(v).map(|i| (i, rp.reads[i])) {
                            Some((i, read @ (RowAccess::Row | RowAccess::Along))) => {
                                let from = match read {
                                    RowAccess::Row => starts[i],
                                    _ => bases[i],
                                };
                                let off = b.ins().ishl_imm(at, 2);
                                let addr = b.ins().iadd(from, off);
                                b.ins().load(lane, flags, addr, 0)
                            }
                            _ if lane.is_vector() => splats[v],
                            _ => sc[v],
                        })
                        .collect();
                    render(b, tg, lane, pass, &args)
                };
                let Some(((op, rop), step)) = s.reduce.zip(step.as_ref()) else {
                    // The last pass: the wide outputs.
                    if s.results.is_empty() {
                        continue;
                    }
                    for (lane, from, to, by) in
                        [(types::F32X4, zero, len4, 4), (types::F32, len4, len_v, 1)]
                    {
                        emit_for(b, j, from, to, by, |b, jv| {
                            let outs = value_at(b, lane, jv);
                            let off = b.ins().ishl_imm(jv, 2);
                            for (v, x) in s.results.iter().zip(outs) {
                                let addr = b.ins().iadd(starts[n_in + output(v)], off);
                                b.ins().store(flags, x, addr, 0);
                            }
                        });
                    }
                    continue;
                };
                let init = match rop {
                    ReduceOp::Max => f64::NEG_INFINITY,
                    ReduceOp::Sum | ReduceOp::Mean => 0.0,
                };
                let vars = FoldVars {
                    j,
                    acc,
                    pair: [acc_a, acc_b],
                };
                let mut total = fold_row(b, tg, step, init, len, vars, |b, lane, jv| {
                    value_at(b, lane, jv)[0]
                });
                if rop == ReduceOp::Mean {
                    // As the reduction kernels scale the sum.
                    let inv = b.ins().f32const(1.0 / len as f32);
                    total = b.ins().fmul(total, inv);
                }
                sc.insert(f.op(op).results[0], settle(b, slot, total));
            }
            for v in &rp.narrow_outputs {
                let off = b.ins().ishl_imm(rv, 2);
                let addr = b.ins().iadd(bases[n_in + output(v)], off);
                b.ins().store(flags, sc[v], addr, 0);
            }
        });
    })
}

/// `x` stored to the stack slot `slot` and loaded back. Cranelift places a pure computation
/// where it is used and hoists it out of a loop only when none of its arguments is placed in
/// the loop; a constant is rematerialised at each use, inside the loop, so a row scalar
/// computed with one (`var + eps`, a mean's scale) would be recomputed in every iteration of
/// the passes that read it, square root and division included. A load from the stack is not
/// pure, so it stays where the row's scalars are computed.
fn settle(b: &mut FunctionBuilder, slot: StackSlot, x: CValue) -> CValue {
    let ty = b.func.dfg.value_type(x);
    b.ins().stack_store(x, slot, 0);
    b.ins().stack_load(ty, slot, 0)
}

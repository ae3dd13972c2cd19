//! Row passes: reductions over the last axes of one shape and the elementwise ops around them,
//! run as one kernel that reads each row once from memory.
//!
//! Layer norm, RMS norm, and a softmax written out as ops plan as a run of kernels, each a
//! trip through memory: a mean, the centred values and their squares, a second mean, the
//! normalised row. Where the rows are short enough to stay in the cache between passes,
//! [`group`] merges such a run into one [`KernelKind::RowPasses`] kernel. Its ops have three
//! roles: *wide* ops produce values of the row shape `[.., len]`, reductions reduce
//! the trailing axes to a row scalar (`keepdims`), and *narrow* ops compute on row scalars
//! (`var + eps`, `rsqrt`). For each row the kernel makes one pass per reduction, computing the
//! wide values that reduction reads (recomputed in each pass, never stored), then one pass that
//! computes and stores the wide values needed outside the kernel; narrow values are computed
//! once per row, as soon as the reductions they read are done ([`RowPasses::stages`]).
//!
//! Backends opt in from [`crate::Backend::fuse`]; the CPU's JIT renders the stages as loops.

use super::{Access, access, f32_with_masks, splat_number, supported_op};
use crate::plan::{Kernel, KernelData, KernelKind, Plan};
use std::collections::HashSet;
use tcc_ir::{Function, Op, OpKind, ReduceOp, Value};

/// Rows shorter than this stay separate kernels: the per-row work would dominate.
const MIN_LEN: u64 = 8;
/// Rows longer than this (64 KiB of `f32`) would leave the cache between passes.
const MAX_LEN: u64 = 1 << 14;

/// How a row-pass kernel reads one of its inputs for element `j` of row `r`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RowAccess {
    /// Element `r * len + j`: a value of the row shape.
    Row,
    /// Element `j`: the same for every row (a layer norm's scale and bias).
    Along,
    /// One value per row: the element the [`Access`] (relative to the row shape) gives for
    /// element `r * len`.
    PerRow(Access),
    /// One value for the whole kernel (an immediate if `Some`).
    Scalar(Option<f64>),
}

/// What one stage of a row-pass kernel does for each row.
#[derive(Clone, Debug)]
pub struct Stage {
    /// Narrow ops computed first, once per row, in order.
    pub narrow: Vec<Op>,
    /// The values they read: row scalars, and kernel inputs constant along a row.
    pub narrow_args: Vec<Value>,
    /// The reduction this stage's pass feeds, or `None` for the last stage, whose pass stores
    /// the wide outputs.
    pub reduce: Option<(Op, ReduceOp)>,
    /// The wide ops the pass computes at each element, in order.
    pub wide: Vec<Op>,
    /// The values the pass reads: kernel inputs and row scalars (narrow values, reduction
    /// results), in order of first use.
    pub args: Vec<Value>,
    /// What the pass computes at each element: the reduction's operand, or the wide outputs.
    pub results: Vec<Value>,
}

/// The layout of a row-pass kernel.
#[derive(Clone, Debug)]
pub struct RowPasses {
    /// Rows (the product of the leading axes of the row shape).
    pub rows: u64,
    /// Elements per row (the product of the reduced trailing axes).
    pub len: u64,
    /// How each kernel input is read, in input order.
    pub reads: Vec<RowAccess>,
    /// The stages, in order: one per reduction, then the one storing the wide outputs (its
    /// pass is empty when there are none).
    pub stages: Vec<Stage>,
    /// Narrow outputs: stored once per row, at element `r`.
    pub narrow_outputs: Vec<Value>,
}

/// The row shape and its first reduced axis, if `op` is a reduction this kernel handles: over
/// trailing axes, keeping them, of an `f32` value.
fn row_axes(f: &Function, op: Op) -> Option<(Vec<u64>, usize)> {
    let d = f.op(op);
    let OpKind::Reduce {
        axes,
        keepdims: true,
        ..
    } = &d.kind
    else {
        return None;
    };
    let dims = f.ty(d.args[0]).dims();
    let rank = dims.len();
    let mut ax: Vec<usize> = (axes.iter())
        .map(|&a| tcc_ir::ops::normalize_axis(a, rank))
        .collect::<Option<_>>()?;
    ax.sort_unstable();
    ax.dedup();
    let a0 = *ax.first()?;
    let trailing = ax.len() == rank - a0;
    let len: u64 = dims[a0..].iter().product();
    let fits = trailing && (MIN_LEN..=MAX_LEN).contains(&len);
    fits.then(|| (dims.to_vec(), a0))
}

/// How value `v` is read for the row shape `dims` whose rows start at axis `a0`.
fn row_access(f: &Function, v: Value, dims: &[u64], a0: usize) -> Option<RowAccess> {
    let vd = f.ty(v).dims();
    let acc = access(vd, dims)?;
    match acc {
        Access::Same => return Some(RowAccess::Row),
        Access::Scalar(_) => return Some(RowAccess::Scalar(splat_number(f, v))),
        _ => {}
    }
    let off = dims.len() - vd.len();
    // Axis `k` of `v` is output axis `k + off`.
    if (vd.iter().enumerate()).all(|(k, &d)| k + off < a0 || d == 1) {
        return Some(RowAccess::PerRow(acc));
    }
    let leading_ones = (vd.iter().enumerate()).all(|(k, &d)| k + off >= a0 || d == 1);
    let whole_row = (a0..dims.len()).all(|o| o >= off && vd[o - off] == dims[o]);
    (leading_ones && whole_row).then_some(RowAccess::Along)
}

/// The role of each op of a row-pass kernel.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Role {
    Wide,
    Narrow,
    Reduce(ReduceOp),
}

/// The roles of `ops` for the row shape `dims` (rows from axis `a0`), if each is a supported
/// elementwise op producing the row shape or the row scalars' shape, or a reduction of the row
/// shape over its rows.
fn roles(f: &Function, ops: &[Op], dims: &[u64], a0: usize) -> Option<Vec<Role>> {
    let scalar_dims: Vec<u64> = (0..dims.len())
        .map(|k| if k < a0 { dims[k] } else { 1 })
        .collect();
    ops.iter()
        .map(|&op| {
            let d = f.op(op);
            let out = f.ty(d.results[0]).dims();
            match &d.kind {
                OpKind::Reduce { op: r, .. } => {
                    (row_axes(f, op) == Some((dims.to_vec(), a0))).then_some(Role::Reduce(*r))
                }
                _ if !supported_op(f, op) || d.results.len() != 1 => None,
                _ if out == dims => Some(Role::Wide),
                _ if out == scalar_dims => Some(Role::Narrow),
                _ => None,
            }
        })
        .collect()
}

/// Whether every input of `ops` from outside them is one a row-pass kernel can read for the row
/// shape `dims` (rows from axis `a0`): narrow ops read only what is constant along a row.
fn readable(f: &Function, ops: &[Op], roles: &[Role], dims: &[u64], a0: usize) -> bool {
    let inside: HashSet<Value> = ops.iter().flat_map(|&o| f.op(o).results.clone()).collect();
    ops.iter().zip(roles).all(|(&op, role)| {
        (f.op(op).args.iter())
            .filter(|a| !inside.contains(a))
            .all(|&a| match row_access(f, a, dims, a0) {
                None => false,
                Some(RowAccess::Row | RowAccess::Along) => *role != Role::Narrow,
                Some(_) => true,
            })
    })
}

/// The layout of row-pass kernel `k`, if it is one a backend can run: `f32` values, and every
/// op and input of a role this form has for the row shape of its first reduction.
pub fn row_passes(f: &Function, k: &KernelData) -> Option<RowPasses> {
    if k.kind != KernelKind::RowPasses || !f32_with_masks(f, k) {
        return None;
    }
    let first = *(k.ops.iter()).find(|&&o| matches!(f.op(o).kind, OpKind::Reduce { .. }))?;
    let (dims, a0) = row_axes(f, first)?;
    let roles = roles(f, &k.ops, &dims, a0)?;
    if !readable(f, &k.ops, &roles, &dims, a0) {
        return None;
    }
    let reads = (k.inputs.iter())
        .map(|&v| row_access(f, v, &dims, a0))
        .collect::<Option<Vec<_>>>()?;
    let wide: Vec<Op> = (k.ops.iter().zip(&roles))
        .filter(|(_, r)| **r == Role::Wide)
        .map(|(&o, _)| o)
        .collect();
    let mut done: HashSet<Op> = HashSet::new();
    let mut stages = Vec::new();
    let mut stage = |upto: usize, reduce: Option<(Op, ReduceOp)>, results: Vec<Value>| {
        let narrow: Vec<Op> = (k.ops[..upto].iter().zip(&roles))
            .filter(|&(o, r)| *r == Role::Narrow && !done.contains(o))
            .map(|(&o, _)| o)
            .collect();
        done.extend(narrow.iter().copied());
        let narrow_args = free_values(f, &narrow, &[]);
        let wide = needed(f, &wide, &results);
        let args = free_values(f, &wide, &results);
        stages.push(Stage {
            narrow,
            narrow_args,
            reduce,
            wide,
            args,
            results,
        });
    };
    for (i, (&op, role)) in k.ops.iter().zip(&roles).enumerate() {
        if let Role::Reduce(r) = role {
            stage(i, Some((op, *r)), vec![f.op(op).args[0]]);
        }
    }
    let is_wide = |v: &Value| f.ty(*v).dims() == &dims[..];
    let wide_out: Vec<Value> = k.outputs.iter().copied().filter(is_wide).collect();
    let narrow_outputs = k.outputs.iter().copied().filter(|v| !is_wide(v)).collect();
    stage(k.ops.len(), None, wide_out);
    Some(RowPasses {
        rows: dims[..a0].iter().product(),
        len: dims[a0..].iter().product(),
        reads,
        stages,
        narrow_outputs,
    })
}

/// The ops of `ops` (in order) that `results` depend on.
fn needed(f: &Function, ops: &[Op], results: &[Value]) -> Vec<Op> {
    let mut want: HashSet<Value> = results.iter().copied().collect();
    let mut keep = vec![false; ops.len()];
    for (i, &op) in ops.iter().enumerate().rev() {
        let d = f.op(op);
        if d.results.iter().any(|r| want.contains(r)) {
            keep[i] = true;
            want.extend(d.args.iter().copied());
        }
    }
    (ops.iter().zip(keep))
        .filter(|(_, k)| *k)
        .map(|(&o, _)| o)
        .collect()
}

/// The values `ops` read and `results` name that `ops` do not produce, in order of first use.
fn free_values(f: &Function, ops: &[Op], results: &[Value]) -> Vec<Value> {
    let inside: HashSet<Value> = ops.iter().flat_map(|&o| f.op(o).results.clone()).collect();
    let mut out: Vec<Value> = Vec::new();
    let reads = ops.iter().flat_map(|&o| f.op(o).args.iter().copied());
    for v in reads.chain(results.iter().copied()) {
        if !inside.contains(&v) && !out.contains(&v) {
            out.push(v);
        }
    }
    out
}

/// `plan` with each run of kernels that forms row passes merged into one
/// [`KernelKind::RowPasses`] kernel: a reduction kernel over the trailing axes of a row shape,
/// then the kernels after it, each elementwise over the row shape or the row scalars' shape, or
/// a reduction over the same rows, and each reading what the run computed before it.
pub fn group(f: &Function, plan: Plan) -> Plan {
    let ks: Vec<(Kernel, &KernelData)> = plan.kernels.iter().collect();
    let mut absorbed: Vec<Kernel> = Vec::new();
    let mut firsts: Vec<Op> = Vec::new();
    let mut i = 0;
    while i < ks.len() {
        let n = run_from(f, &ks[i..]);
        if n >= 2 {
            absorbed.extend(ks[i + 1..i + n].iter().map(|&(k, _)| k));
            firsts.push(ks[i].1.ops[0]);
            i += n;
        } else {
            i += 1;
        }
    }
    if firsts.is_empty() {
        return plan;
    }
    let mut plan = plan.merged(f, &absorbed);
    for op in firsts {
        let k = plan.kernel_of[op].expect("a planned op");
        plan.kernels[k].kind = KernelKind::RowPasses;
    }
    plan
}

/// How many kernels from the start of `ks` form row passes (0 or 1: none). The run starts at a
/// reduction kernel, or at an elementwise kernel of the row shape the reduction after it reads
/// (a residual sum before a layer norm, a softmax's scaled logits).
fn run_from(f: &Function, ks: &[(Kernel, &KernelData)]) -> usize {
    let lead = match ks.first() {
        Some((_, kd)) if kd.kind == KernelKind::Elementwise => 1,
        _ => 0,
    };
    let Some(&(_, reduction)) = ks.get(lead) else {
        return 0;
    };
    let KernelKind::Reduction { root } = reduction.kind else {
        return 0;
    };
    let Some((dims, a0)) = row_axes(f, root) else {
        return 0;
    };
    let fits = |kd: &KernelData| {
        let r = roles(f, &kd.ops, &dims, a0);
        r.is_some_and(|r| readable(f, &kd.ops, &r, &dims, a0))
            && (kd.inputs.iter()).all(|&v| f.ty(v).dtype() == tcc_ir::DType::F32)
            && f32_with_masks(f, kd)
    };
    let mut produced: HashSet<Value> = HashSet::new();
    let mut n = 0;
    for (i, &(_, kd)) in ks.iter().enumerate() {
        let kind_fits = matches!(
            kd.kind,
            KernelKind::Elementwise | KernelKind::Reduction { .. }
        );
        let reads_run = i == 0 || kd.inputs.iter().any(|v| produced.contains(v));
        if !(kind_fits && reads_run && fits(kd)) {
            break;
        }
        produced.extend(kd.outputs.iter().copied());
        n += 1;
    }
    // The run must hold the reduction, and something after its first kernel.
    if n <= lead { 0 } else { n }
}

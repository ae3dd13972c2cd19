//! Kernel planning: cutting a function into kernels, decided once for every backend.
//!
//! A kernel is a region of ops that a backend compiles into one loop nest (or one library call
//! plus a fused epilogue). Planning walks the schedule once and grows the most recent kernel
//! while the next op fits it:
//!
//! - **elementwise**: elementwise ops (and `broadcast_to`) producing one shape; operands may
//!   broadcast into it. Values used only inside the kernel are never stored.
//! - **reduction**: an elementwise prologue over the input shape, one reduction
//!   (`reduce_*`, `softmax_cross_entropy`), and an elementwise epilogue over the output shape.
//! - **row**: `softmax` or `log_softmax` with an elementwise prologue and epilogue of the same
//!   shape: a pass over each row for its max and sum, then the row itself.
//! - **library**: `matmul`, `conv2d` (or `conv2d_nchwc`) or a convolution gradient (a tuned
//!   GEMM call) with a fused elementwise epilogue over the output shape, such as a bias add and
//!   an activation.
//! - **view**: `reshape`, which moves no data, and a transpose of the last two axes that only
//!   matmuls read (they read its source with swapped strides; see [`folded_transpose`]).
//! - **generic**: any other op, alone (transpose, slice, concat, gather, pooling, batch norm...).
//!
//! A backend may then merge kernels it runs as one step ([`Plan::merged`]; the CPU's depthwise
//! convolution and the 1x1 convolution after it, and runs of reductions over rows with the ops
//! between them, [`crate::kernel::rows::group`]), before memory is planned.
//!
//! Constants belong to no kernel: small splats are inlined by backends and the rest are data.
//! Only the most recent kernel grows, so kernels run in order without reordering the schedule;
//! fusion across independent interleaved chains is not attempted.

use cranelift_entity::{EntityRef, PrimaryMap, SecondaryMap, entity_impl};
use std::fmt::{self, Write};
use tcc_ir::edit::Users;
use tcc_ir::printer::write_name;
use tcc_ir::{Function, Op, OpKind, TensorType, Value};

/// A kernel in a plan.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Kernel(u32);
entity_impl!(Kernel, "k");

/// What kind of loop nest a kernel is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelKind {
    /// Elementwise ops over one shape.
    Elementwise,
    /// Prologue, one reduction, epilogue. `root` is the reduction.
    Reduction {
        /// The reduction op.
        root: Op,
    },
    /// Softmax-like: prologue, a row-wise normalisation, epilogue.
    Row {
        /// The softmax or log_softmax op.
        root: Op,
    },
    /// Reductions over the rows of one shape and the elementwise ops around them, one pass
    /// over each row per reduction (formed by backends that run them:
    /// [`crate::kernel::rows::group`]).
    RowPasses,
    /// A matmul or conv2d, then an epilogue.
    Library {
        /// The matmul or conv2d op.
        root: Op,
    },
    /// A reshape: no data moves.
    View,
    /// One op of any other kind.
    Generic,
}

/// A kernel's ops and its interface.
#[derive(Clone, Debug)]
pub struct KernelData {
    /// What kind of kernel.
    pub kind: KernelKind,
    /// Member ops in schedule order.
    pub ops: Vec<Op>,
    /// Values read from outside the kernel (parameters, constants, other kernels' outputs), in
    /// order of first use.
    pub inputs: Vec<Value>,
    /// Values the kernel stores: used by a later kernel or returned.
    pub outputs: Vec<Value>,
}

/// How a function is cut into kernels.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The kernels, in execution order.
    pub kernels: PrimaryMap<Kernel, KernelData>,
    /// The kernel of each scheduled non-constant op.
    pub kernel_of: SecondaryMap<Op, Option<Kernel>>,
    /// Constant ops, in schedule order.
    pub constants: Vec<Op>,
}

/// Where a kernel being grown accepts more elementwise ops.
struct Open {
    kernel: Kernel,
    /// The shape (and so iteration space) a new elementwise member must produce.
    shape: TensorType,
    /// Whether the kernel still accepts a root (a reduction or row op) after its prologue.
    prologue: bool,
}

/// Whether the planner fuses `kind` into elementwise kernels. Quantizing and dequantizing
/// cross between dtype families (floats and bytes), which no kernel body holds: each is a
/// kernel of its own, so the float ops around it still compile.
fn is_elementwise(kind: &OpKind) -> bool {
    (kind.is_elementwise() && !matches!(kind, OpKind::QuantizeLinear | OpKind::DequantizeLinear))
        || matches!(kind, OpKind::BroadcastTo { .. })
}

/// Whether elementwise `op` can join an open kernel producing values of type `open`: the same
/// dims, and the same dtype, except that a comparison whose results only feed `select`s and
/// casts may produce a `bool` mask inside an `f32` kernel (and those consumers join it).
fn joins(f: &Function, uses: &Users, op: Op, open: &TensorType) -> bool {
    let d = f.op(op);
    let out = f.ty(d.results[0]);
    if out.dims() != open.dims() {
        return false;
    }
    if out.dtype() == open.dtype() {
        return true;
    }
    match d.kind {
        OpKind::Compare(_) => {
            let r = d.results[0];
            !uses.uses(r).is_empty()
                && !uses.is_returned(r)
                && uses.uses(r).iter().all(|&(u, i)| {
                    matches!(f.op(u).kind, OpKind::Select if i == 0)
                        || matches!(f.op(u).kind, OpKind::Cast { .. })
                })
        }
        OpKind::Select | OpKind::Cast { .. } => open.dtype() == tcc_ir::DType::Bool,
        _ => false,
    }
}

/// Whether a transpose is only read, as the operand of a floating-point `matmul`, with its last
/// two axes swapped: the GEMM then reads its source with swapped strides, and the transpose is a
/// view that moves no data. Backends must read such a view through [`folded_transpose`].
fn folds_into_matmul(f: &Function, uses: &Users, op: Op) -> bool {
    let d = f.op(op);
    let r = d.results[0];
    let OpKind::Transpose { perm } = &d.kind else {
        return false;
    };
    let n = perm.len();
    let swaps_last_two = n >= 2
        && perm[n - 2] == (n - 1) as u64
        && perm[n - 1] == (n - 2) as u64
        && perm[..n - 2]
            .iter()
            .enumerate()
            .all(|(i, &p)| p == i as u64);
    swaps_last_two
        && f.ty(r).dtype().is_float()
        && !uses.is_returned(r)
        && !uses.uses(r).is_empty()
        && uses
            .uses(r)
            .iter()
            .all(|&(u, _)| matches!(f.op(u).kind, OpKind::MatMul))
}

/// If `v` is a transpose planned as a view (read by matmuls with swapped strides), its source.
pub fn folded_transpose(f: &Function, plan: &Plan, v: Value) -> Option<Value> {
    let op = f.def_op(v)?;
    let k = plan.kernel_of[op]?;
    (plan.kernels[k].kind == KernelKind::View && matches!(f.op(op).kind, OpKind::Transpose { .. }))
        .then(|| f.op(op).args[0])
}

/// Whether reduction or row op `op` can take an elementwise prologue: reductions only over
/// contiguous axes (the layout every backend's reduction loop handles).
fn fusible_root(f: &Function, op: Op) -> bool {
    let d = f.op(op);
    match &d.kind {
        OpKind::Reduce { axes, .. } => {
            let rank = f.ty(d.args[0]).rank();
            let mut ax: Vec<usize> = axes
                .iter()
                .filter_map(|&a| tcc_ir::ops::normalize_axis(a, rank))
                .collect();
            ax.sort_unstable();
            ax.windows(2).all(|w| w[1] == w[0] + 1)
        }
        _ => true,
    }
}

/// Whether every value kernel `k` computes is used only inside it or by `root`: a prologue whose
/// values are also needed elsewhere stays its own kernel, so that the reduction does not have to
/// store them.
fn private_to(
    f: &Function,
    uses: &Users,
    kernel_of: &SecondaryMap<Op, Option<Kernel>>,
    kd: &KernelData,
    k: Kernel,
    root: Op,
) -> bool {
    kd.ops.iter().all(|&o| {
        f.op(o).results.iter().all(|&v| {
            !uses.is_returned(v)
                && uses
                    .uses(v)
                    .iter()
                    .all(|&(user, _)| user == root || kernel_of[user] == Some(k))
        })
    })
}

/// Plans `f`, which must verify.
pub fn plan(f: &Function) -> Plan {
    let mut kernels: PrimaryMap<Kernel, KernelData> = PrimaryMap::new();
    let mut kernel_of: SecondaryMap<Op, Option<Kernel>> =
        SecondaryMap::with_capacity(f.num_ops_created());
    let mut constants = Vec::new();
    let mut open: Option<Open> = None;
    let uses = Users::new(f);
    let new = |kernels: &mut PrimaryMap<Kernel, KernelData>, kind: KernelKind, op: Op| {
        kernels.push(KernelData {
            kind,
            ops: vec![op],
            inputs: Vec::new(),
            outputs: Vec::new(),
        })
    };
    for &op in f.schedule() {
        let d = f.op(op);
        let out_ty = f.ty(d.results[0]).clone();
        // Whether `op` reads a value computed by the open kernel.
        let reads_open = |open: &Open, kernel_of: &SecondaryMap<Op, Option<Kernel>>| {
            d.args.iter().any(|&a| {
                f.def_op(a)
                    .is_some_and(|p| kernel_of[p] == Some(open.kernel))
            })
        };
        let k = match &d.kind {
            OpKind::Const { .. } => {
                constants.push(op);
                continue;
            }
            kind if is_elementwise(kind) => match &open {
                Some(o) if joins(f, &uses, op, &o.shape) => {
                    kernels[o.kernel].ops.push(op);
                    o.kernel
                }
                _ => {
                    let k = new(&mut kernels, KernelKind::Elementwise, op);
                    open = Some(Open {
                        kernel: k,
                        shape: out_ty,
                        prologue: true,
                    });
                    k
                }
            },
            OpKind::Reduce { .. }
            | OpKind::SoftmaxCrossEntropy
            | OpKind::Softmax { .. }
            | OpKind::LogSoftmax { .. } => {
                let row = matches!(d.kind, OpKind::Softmax { .. } | OpKind::LogSoftmax { .. });
                let kind = if row {
                    KernelKind::Row { root: op }
                } else {
                    KernelKind::Reduction { root: op }
                };
                let in_ty = f.ty(d.args[0]);
                match &open {
                    Some(o)
                        if o.prologue
                            && &o.shape == in_ty
                            && kernels[o.kernel].kind == KernelKind::Elementwise
                            && reads_open(o, &kernel_of)
                            && fusible_root(f, op)
                            && private_to(
                                f,
                                &uses,
                                &kernel_of,
                                &kernels[o.kernel],
                                o.kernel,
                                op,
                            ) =>
                    {
                        let k = o.kernel;
                        kernels[k].kind = kind;
                        kernels[k].ops.push(op);
                        open = Some(Open {
                            kernel: k,
                            shape: out_ty,
                            prologue: false,
                        });
                        k
                    }
                    _ => {
                        let k = new(&mut kernels, kind, op);
                        // A reduction no backend loop handles fused stays alone.
                        open = fusible_root(f, op).then_some(Open {
                            kernel: k,
                            shape: out_ty,
                            prologue: false,
                        });
                        k
                    }
                }
            }
            OpKind::MatMul
            | OpKind::Conv2d(_)
            | OpKind::Conv2dNchwc { .. }
            | OpKind::Conv2dGradInput { .. }
            | OpKind::Conv2dGradFilter { .. } => {
                let k = new(&mut kernels, KernelKind::Library { root: op }, op);
                open = Some(Open {
                    kernel: k,
                    shape: out_ty,
                    prologue: false,
                });
                k
            }
            OpKind::Reshape { .. } => {
                open = None;
                new(&mut kernels, KernelKind::View, op)
            }
            OpKind::Transpose { .. } if folds_into_matmul(f, &uses, op) => {
                open = None;
                new(&mut kernels, KernelKind::View, op)
            }
            _ => {
                open = None;
                new(&mut kernels, KernelKind::Generic, op)
            }
        };
        kernel_of[op] = Some(k);
    }
    with_interfaces(f, kernels, kernel_of, constants)
}

/// The plan of `kernels` (whose interfaces are empty), each op in kernel `kernel_of[op]`, with
/// every kernel's inputs and outputs found.
fn with_interfaces(
    f: &Function,
    mut kernels: PrimaryMap<Kernel, KernelData>,
    kernel_of: SecondaryMap<Op, Option<Kernel>>,
    constants: Vec<Op>,
) -> Plan {
    // Interfaces: inputs come from outside the kernel; outputs are needed outside it.
    let mut needed_outside: SecondaryMap<Value, bool> =
        SecondaryMap::with_capacity(f.num_values_created());
    for &r in f.results() {
        needed_outside[r] = true;
    }
    for &op in f.schedule() {
        for &a in &f.op(op).args {
            let from = f.def_op(a).and_then(|p| kernel_of[p]);
            if from.is_some() && from != kernel_of[op] {
                needed_outside[a] = true;
            }
        }
    }
    for (_, kd) in kernels.iter_mut() {
        let members: Vec<Op> = kd.ops.clone();
        for &op in &members {
            for &a in &f.op(op).args {
                let inside = f.def_op(a).is_some_and(|p| members.contains(&p));
                if !inside && !kd.inputs.contains(&a) {
                    kd.inputs.push(a);
                }
            }
            kd.outputs.extend(
                f.op(op)
                    .results
                    .iter()
                    .copied()
                    .filter(|&r| needed_outside[r]),
            );
        }
    }
    Plan {
        kernels,
        kernel_of,
        constants,
    }
}

impl Plan {
    /// This plan with each kernel of `absorbed` (in plan order) merged into the kernel just
    /// before it: its ops appended to that kernel's, whose kind is kept. A backend merges kernels it runs as one
    /// step (the CPU's depthwise convolution and the 1x1 convolution reading its output, band
    /// by band), so that values passed between them are never stored.
    pub fn merged(self, f: &Function, absorbed: &[Kernel]) -> Plan {
        let mut kernels: PrimaryMap<Kernel, KernelData> = PrimaryMap::new();
        let mut kernel_of: SecondaryMap<Op, Option<Kernel>> =
            SecondaryMap::with_capacity(f.num_ops_created());
        for (k, kd) in self.kernels {
            let into = match kernels.last() {
                Some(_) if absorbed.binary_search(&k).is_ok() => {
                    let last = Kernel::new(kernels.len() - 1);
                    kernels[last].ops.extend(kd.ops.iter().copied());
                    last
                }
                _ => kernels.push(KernelData {
                    kind: kd.kind,
                    ops: kd.ops.clone(),
                    inputs: Vec::new(),
                    outputs: Vec::new(),
                }),
            };
            for &op in &kd.ops {
                kernel_of[op] = Some(into);
            }
        }
        with_interfaces(f, kernels, kernel_of, self.constants)
    }
}

impl Plan {
    /// This plan with the ops of each kernel `from` of `moves` appended to kernel `into`,
    /// which comes before it (a backend that runs a chain of kernels as one step pulls the
    /// later ones up to the first: the caller checks that what they read is there by then).
    /// A kernel may take several; the order of `moves` is the order their ops are appended in.
    pub fn moved(self, f: &Function, moves: &[(Kernel, Kernel)]) -> Plan {
        let mut ops: Vec<Vec<Op>> = self.kernels.values().map(|kd| kd.ops.clone()).collect();
        let mut gone = vec![false; ops.len()];
        for &(from, into) in moves {
            let taken = std::mem::take(&mut ops[from.index()]);
            ops[into.index()].extend(taken);
            gone[from.index()] = true;
        }
        let mut kernels: PrimaryMap<Kernel, KernelData> = PrimaryMap::new();
        let mut kernel_of: SecondaryMap<Op, Option<Kernel>> =
            SecondaryMap::with_capacity(f.num_ops_created());
        for ((_, kd), (ops, gone)) in self.kernels.into_iter().zip(ops.into_iter().zip(gone)) {
            if gone {
                continue;
            }
            let k = kernels.push(KernelData {
                kind: kd.kind,
                ops,
                inputs: Vec::new(),
                outputs: Vec::new(),
            });
            for &op in &kernels[k].ops {
                kernel_of[op] = Some(k);
            }
        }
        with_interfaces(f, kernels, kernel_of, self.constants)
    }

    /// This plan with each kernel of `split` cut into kernels of one op each, in order: the
    /// kernel's root (a reduction's or row's) keeps the kernel's kind, every other op is an
    /// elementwise kernel. A backend that cannot run a fused kernel as one loop (the PTX
    /// backend, where the kernel layer has no form of it) runs its ops one at a time, the
    /// values between them stored.
    pub fn split(self, f: &Function, split: &[Kernel]) -> Plan {
        let mut kernels: PrimaryMap<Kernel, KernelData> = PrimaryMap::new();
        let mut kernel_of: SecondaryMap<Op, Option<Kernel>> =
            SecondaryMap::with_capacity(f.num_ops_created());
        for (k, kd) in self.kernels {
            let root = match kd.kind {
                KernelKind::Reduction { root } | KernelKind::Row { root } => Some(root),
                _ => None,
            };
            let pieces: Vec<(KernelKind, Vec<Op>)> = if split.binary_search(&k).is_ok() {
                (kd.ops.iter())
                    .map(|&op| {
                        let kind = if Some(op) == root {
                            kd.kind.clone()
                        } else if kd.kind == KernelKind::Elementwise || root.is_some() {
                            KernelKind::Elementwise
                        } else {
                            KernelKind::Generic
                        };
                        (kind, vec![op])
                    })
                    .collect()
            } else {
                vec![(kd.kind, kd.ops)]
            };
            for (kind, ops) in pieces {
                let into = kernels.push(KernelData {
                    kind,
                    ops: ops.clone(),
                    inputs: Vec::new(),
                    outputs: Vec::new(),
                });
                for op in ops {
                    kernel_of[op] = Some(into);
                }
            }
        }
        with_interfaces(f, kernels, kernel_of, self.constants)
    }
}

impl KernelKind {
    fn label(&self, f: &Function) -> String {
        match self {
            KernelKind::Elementwise => "elementwise".into(),
            KernelKind::Reduction { root } => {
                format!("reduction ({})", f.op(*root).kind.mnemonic())
            }
            KernelKind::Row { root } => format!("row ({})", f.op(*root).kind.mnemonic()),
            KernelKind::RowPasses => "row passes".into(),
            KernelKind::Library { root } => format!("library ({})", f.op(*root).kind.mnemonic()),
            KernelKind::View => "view".into(),
            KernelKind::Generic => "generic".into(),
        }
    }
}

fn names(f: &Function, vs: &[Value]) -> String {
    let mut s = String::new();
    for (i, &v) in vs.iter().enumerate() {
        if i > 0 {
            s.push_str(", ");
        }
        let _ = write_name(&mut s, '%', f.name(v));
    }
    s
}

/// Writes a plan as text: one block per kernel with its ops, inputs and outputs.
pub fn write_plan(w: &mut impl Write, f: &Function, p: &Plan) -> fmt::Result {
    let mut head = String::new();
    write_name(&mut head, '@', &f.name)?;
    writeln!(
        w,
        "plan {head}: {} kernels, {} constants",
        p.kernels.len(),
        p.constants.len()
    )?;
    for (k, kd) in p.kernels.iter() {
        writeln!(w, "  {k}: {}", kd.kind.label(f))?;
        for &op in &kd.ops {
            let mut line = String::new();
            f.write_op(&mut line, op, false)?;
            writeln!(w, "      {line} : {}", f.ty(f.op(op).results[0]))?;
        }
        writeln!(w, "    in:  {}", names(f, &kd.inputs))?;
        writeln!(w, "    out: {}", names(f, &kd.outputs))?;
    }
    Ok(())
}

/// What kernel `kd` of `f` computes, for profiles: its first op (the library call, the
/// reduction or softmax root of its kind, or the first elementwise op) with its attributes,
/// result type and result name (`conv2d{strides=[2,2]} : f32[1,64,56,56] %y`); a step that
/// fused a second library call (a depthwise convolution and the 1x1 after it) names it too,
/// and its result last.
pub fn describe(f: &Function, kd: &KernelData) -> String {
    let first = match kd.kind {
        KernelKind::Reduction { root } | KernelKind::Row { root } => root,
        _ => kd.ops[0],
    };
    let d = f.op(first);
    let mut name = d.kind.mnemonic().to_string();
    let _ = tcc_ir::printer::write_attrs(&mut name, &d.kind);
    let fused: Vec<Op> = (kd.ops[1..].iter().copied())
        .filter(|&op| matches!(f.op(op).kind, OpKind::Conv2dNchwc { .. }))
        .collect();
    for &op in &fused {
        let _ = write!(name, " + {}", f.op(op).kind.mnemonic());
    }
    let r = d.results[0];
    let _ = write!(name, " : {} %{}", f.ty(r), f.name(r));
    for &op in &fused {
        let _ = write!(name, " + %{}", f.name(f.op(op).results[0]));
    }
    name
}

//! Constant folding through the reference interpreter, so that a folded constant is exactly what
//! running the op would produce (`tcc_ir::interp::fold` defines the semantics).

use tcc_ir::interp::ConstArg;
use tcc_ir::{Function, Literal, OpKind, TensorType, Value};

/// The operands `args` as constants, if constants define them all.
pub fn const_args<'f>(f: &'f Function, args: &[Value]) -> Option<Vec<ConstArg<'f>>> {
    (args.iter())
        .map(|&a| match &f.op(f.def_op(a)?).kind {
            OpKind::Const { ty, value } => Some(ConstArg { ty, value }),
            _ => None,
        })
        .collect()
}

/// Evaluates `kind` on constant operands to produce a value of type `out`. Only elementwise ops,
/// `broadcast_to`, `reshape` and `transpose` fold. Returns `None` when the op does not fold,
/// when it would fail at run time (that error is left for run time), or when the result would be
/// dense with more than `limit` elements. All-splat operands give a splat of any size.
pub fn fold(kind: &OpKind, args: &[ConstArg<'_>], out: &TensorType, limit: u64) -> Option<Literal> {
    let moves_data = matches!(
        kind,
        OpKind::BroadcastTo { .. } | OpKind::Reshape { .. } | OpKind::Transpose { .. }
    );
    if !kind.is_elementwise() && !moves_data {
        return None;
    }
    tcc_ir::interp::fold(kind, args, std::slice::from_ref(out), limit)?
        .ok()?
        .pop()
}

//! Constant folding through the reference interpreter, so that a folded constant is exactly what
//! running the op would produce (`tcc_ir::interp` defines the semantics).

use tcc_ir::interp::eval_op;
use tcc_ir::{Literal, OpKind, Scalar, Tensor, TensorType};

/// A constant operand.
pub struct ConstArg<'a> {
    /// Its type.
    pub ty: &'a TensorType,
    /// Its value.
    pub value: &'a Literal,
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
    let splats: Option<Vec<Scalar>> = args.iter().map(|a| a.value.as_splat()).collect();
    if let Some(s) = splats {
        if moves_data {
            return Some(Literal::Splat(s[0]));
        }
        // Elementwise on splats: compute one element.
        let scalars: Vec<Tensor> = s
            .iter()
            .map(|&x| Tensor::splat(TensorType::scalar(x.dtype()), x).expect("a scalar"))
            .collect();
        let refs: Vec<&Tensor> = scalars.iter().collect();
        let r = eval_op(kind, &refs, &[TensorType::scalar(out.dtype())]).ok()?;
        return Some(Literal::Splat(r[0].data().get(0)));
    }
    if out.numel() > limit || args.iter().any(|a| a.ty.numel() > limit) {
        return None;
    }
    let tensors: Vec<Tensor> = args
        .iter()
        .map(|a| Tensor::from_literal(a.ty, a.value).expect("verified constants"))
        .collect();
    let refs: Vec<&Tensor> = tensors.iter().collect();
    let mut r = eval_op(kind, &refs, std::slice::from_ref(out)).ok()?;
    Some(Literal::Dense(r.remove(0).into_data()))
}

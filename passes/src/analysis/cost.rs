//! A FLOP cost model: roughly how much arithmetic an op does, for passes that trade compute
//! for memory (`remat`) and for reports.
//!
//! Multiply-add heavy ops count two FLOPs per multiply-add: `matmul` is `2·M·N·K` per batch,
//! `conv2d` and its two gradients `2 · output elements · C/groups · kH · kW` (the same
//! contraction seen from each side). Pooling counts one per window element. Ops that only
//! relabel or alias a buffer (`reshape`, `identity`, `stop_gradient`, `const`) cost nothing.
//! Everything else costs one per element of its largest operand or result (elementwise ops,
//! reductions, softmax, data movement). The model ranks ops; it does not predict time.

use tcc_ir::{Function, Op, OpKind};

/// The FLOPs of `op` in `f` under the model above.
pub fn flops(f: &Function, op: Op) -> u64 {
    let d = f.op(op);
    let numel = |i: usize| f.ty(d.args[i]).numel();
    let out = || f.ty(d.results[0]).numel();
    let window = |k: [u64; 2]| k[0].saturating_mul(k[1]);
    match &d.kind {
        OpKind::Const { .. } | OpKind::Reshape { .. } | OpKind::Identity | OpKind::StopGradient => {
            0
        }
        OpKind::MatMul => {
            let k = f.ty(d.args[0]).dims().last().copied().unwrap_or(1);
            out().saturating_mul(k).saturating_mul(2)
        }
        // The filter is operand 1 of conv2d and conv2d_grad_input; its shape is an attribute
        // of conv2d_grad_filter.
        OpKind::Conv2d(_) | OpKind::Conv2dNchwc { .. } | OpKind::Conv2dGradInput { .. } => {
            let w = f.ty(d.args[1]).dims();
            let taps = w[1..].iter().product::<u64>();
            let y = match d.kind {
                OpKind::Conv2d(_) => out(),
                // The padding lanes of the output's last block are not computed.
                OpKind::Conv2dNchwc { .. } => {
                    let yd = f.ty(d.results[0]).dims();
                    yd[0] * w[0] * yd[2] * yd[3]
                }
                _ => numel(0),
            };
            y.saturating_mul(taps).saturating_mul(2)
        }
        OpKind::Conv2dGradFilter { shape, .. } => {
            let taps = shape[1..].iter().product::<u64>();
            numel(1).saturating_mul(taps).saturating_mul(2)
        }
        OpKind::MaxPool2d(p) | OpKind::AvgPool2d { pool: p, .. } => {
            out().saturating_mul(window(p.kernel))
        }
        OpKind::MaxPool2dGrad(p) | OpKind::AvgPool2dGrad { pool: p, .. } => {
            let dy = if matches!(d.kind, OpKind::MaxPool2dGrad(_)) {
                numel(1)
            } else {
                numel(0)
            };
            dy.saturating_mul(window(p.kernel))
        }
        OpKind::TopK { axis, .. } => {
            // A sort of each line: n log n comparisons.
            let x = f.ty(d.args[0]).dims();
            let len = tcc_ir::ops::normalize_axis(*axis, x.len()).map_or(1, |a| x[a]);
            numel(0).saturating_mul(64 - len.max(1).leading_zeros() as u64)
        }
        // The nudge and the rounding: about twenty operations per element.
        OpKind::FakeQuant { .. } => out().saturating_mul(20),
        OpKind::Unary(_)
        | OpKind::Binary(_)
        | OpKind::Compare(_)
        | OpKind::Select
        | OpKind::BroadcastTo { .. }
        | OpKind::Cast { .. }
        | OpKind::GlobalAvgPool
        | OpKind::Reduce { .. }
        | OpKind::Softmax { .. }
        | OpKind::LogSoftmax { .. }
        | OpKind::SoftmaxCrossEntropy
        | OpKind::SoftmaxCrossEntropyGrad
        | OpKind::BatchNorm { .. }
        | OpKind::BatchNormTrain { .. }
        | OpKind::Transpose { .. }
        | OpKind::Concat { .. }
        | OpKind::Slice { .. }
        | OpKind::SliceGrad { .. }
        | OpKind::ToNchwc { .. }
        | OpKind::FromNchwc { .. }
        | OpKind::Gather { .. }
        | OpKind::ScatterAdd { .. } => d
            .args
            .iter()
            .chain(&d.results)
            .map(|&v| f.ty(v).numel())
            .max()
            .unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::flops;
    use tcc_ir::parse_function;

    #[test]
    fn matmul_conv_and_elementwise() {
        let f = parse_function(
            "func @f(%a: f32[2,3,4], %b: f32[4,5], %x: f32[1,3,8,8], %w: f32[6,3,3,3]) -> (f32[2,3,5], f32[1,6,6,6]) {
  %m = matmul %a, %b : f32[2,3,5]
  %t = tanh %m : f32[2,3,5]
  %r = reshape %t {shape=[30]} : f32[30]
  %c = conv2d %x, %w : f32[1,6,6,6]
  %p = max_pool2d %c {kernel=[2,2]} : f32[1,6,5,5]
  return %t, %c
}",
        )
        .unwrap();
        let costs: Vec<u64> = f.schedule().iter().map(|&op| flops(&f, op)).collect();
        // 2*3*5 outputs x K=4 x 2; 30 elements; a reshape is free; 216 outputs x 27 taps x 2;
        // 150 outputs x 4 window elements.
        assert_eq!(costs, vec![240, 30, 0, 216 * 27 * 2, 150 * 4]);
    }
}

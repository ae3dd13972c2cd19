//! `fold-bn{training=true}`: training batch norm folded into the layer before it with
//! TensorFlow's corrections and freeze delay (see [`fold_bn_training`]).

use super::Emit;
use super::fold_bn::{FoldStats, Layer, Training, layer};
use std::collections::HashMap;
use tcc_ir::edit::Users;
use tcc_ir::{BinaryOp, DType, Function, Op, OpKind, TensorType, UnaryOp, Value};

/// Folds every training batch norm (`batch_norm_train`) that reads a convolution or dense
/// layer only it reads, as TensorFlow's `fold_batch_norms(is_training=True)`: the layer runs
/// with weights scaled by `gamma / sigma_moving` (what fake quantization then sees, stable from
/// batch to batch), and corrections make the output exactly batch norm:
///
/// - before the freeze, with the batch statistics (`mean_b`, `sigma_b` from the original
///   layer's output): `layer(x, w * gamma / sigma_mv) * (sigma_mv / sigma_b) + beta - mean_b *
///   gamma / sigma_b`;
/// - from step `freeze_delay` on (`quant/step`), with the moving statistics, which stop moving:
///   `layer(x, w * gamma / sigma_mv) + beta - mean_mv * gamma / sigma_mv`.
///
/// The moving mean and variance are explicit state: parameters `<bn>/moving_mean` and
/// `<bn>/moving_var` (starting at 0 and 1) and results `new/<bn>/moving_mean|var`, updated as
/// `decay * old + (1 - decay) * batch`, the batch variance with Bessel's correction
/// (`n / (n - 1)`) as TensorFlow's fused batch norm reports it.
pub fn fold_bn_training(f: &mut Function, t: &Training) -> Result<FoldStats, String> {
    let users = Users::new(f);
    let mut stats = FoldStats::default();
    let schedule: Vec<Op> = f.schedule().to_vec();
    let mut after: HashMap<Op, Vec<Op>> = HashMap::new();
    let mut replace: Vec<(Value, Value)> = Vec::new();
    let mut new_results: Vec<Value> = Vec::new();
    let mut first_ops: Vec<Op> = Vec::new();
    // The batch norms that fold, each with its layer; the rest are reported.
    let mut chosen: Vec<(Op, Layer)> = Vec::new();
    for &op in &schedule {
        let d = f.op(op);
        if !matches!(d.kind, OpKind::BatchNormTrain { .. }) {
            continue;
        }
        match layer(f, &users, d.args[0]) {
            Some(l) if l.bias.is_none() && d.deps.is_empty() => chosen.push((op, l)),
            _ => stats.left.push(format!(
                "%{}: its input is not a convolution or dense layer without a bias that only it reads",
                f.name(d.results[0])
            )),
        }
    }
    if chosen.is_empty() {
        return Ok(stats);
    }
    // Whether the statistics are frozen, as a bool scalar (only when a freeze is asked for).
    let frozen = match t.freeze_delay {
        None => None,
        Some(n) => {
            let (step, ops, next) = super::step_counter(f)?;
            let mut e = Emit { f, ops };
            let delay = e.scalar(DType::F32, n as f64, "fold-bn/freeze_delay")?;
            let fr = e.op(
                OpKind::Compare(tcc_ir::CmpOp::Ge),
                &[step, delay],
                "fold-bn/frozen",
            )?;
            first_ops = e.ops;
            new_results.extend(next);
            Some(fr)
        }
    };
    for (op, l) in chosen {
        let d = f.op(op).clone();
        let OpKind::BatchNormTrain { eps } = d.kind else {
            continue;
        };
        let (y, gamma, beta) = (d.args[0], d.args[1], d.args[2]);
        let (out, mean, var) = (d.results[0], d.results[1], d.results[2]);
        let dt = f.ty(y).dtype();
        let yd = f.ty(y).dims().to_vec();
        let c = yd[1];
        let n = yd.iter().product::<u64>() / c.max(1);
        let kind = f.op(l.op).kind.clone();
        let conv = matches!(kind, OpKind::Conv2d(_));
        let wd = f.ty(l.w).dims().to_vec();
        let mut w_dims = vec![1u64; wd.len()];
        w_dims[if conv { 0 } else { 1 }] = c;
        let mut c_dims = vec![1u64; yd.len() - 1];
        c_dims[0] = c;
        let name = f.name(out).to_string();
        let stat_ty = TensorType::new(dt, vec![c]).map_err(|e| e.to_string())?;
        let mm = f.add_param(&format!("{name}/moving_mean"), stat_ty.clone());
        let mv = f.add_param(&format!("{name}/moving_var"), stat_ty);
        let scope = format!("{name}/fold");
        let mut e = Emit { f, ops: Vec::new() };
        let bin = |e: &mut Emit, o: BinaryOp, a: Value, b: Value| e.bin(o, a, b, &scope);
        let epsv = e.scalar(dt, eps.0, &scope)?;
        let vb = bin(&mut e, BinaryOp::Add, var, epsv)?;
        let sigma_b = e.op(OpKind::Unary(UnaryOp::Sqrt), &[vb], &scope)?;
        let vm = bin(&mut e, BinaryOp::Add, mv, epsv)?;
        let sigma_mv = e.op(OpKind::Unary(UnaryOp::Sqrt), &[vm], &scope)?;
        // The layer with weights scaled by gamma / sigma_mv.
        let s_mv = bin(&mut e, BinaryOp::Div, gamma, sigma_mv)?;
        let s_w = e.op(OpKind::Reshape { shape: w_dims }, &[s_mv], &scope)?;
        let w2 = bin(&mut e, BinaryOp::Mul, l.w, s_w)?;
        let z = e.op(kind, &[l.x, w2], &format!("{name}/layer"))?;
        let z = match &l.reshape {
            Some(dims) => e.op(
                OpKind::Reshape {
                    shape: dims.clone(),
                },
                &[z],
                &scope,
            )?,
            None => z,
        };
        // Before the freeze: * sigma_mv / sigma_b, + beta - mean_b * gamma / sigma_b.
        let recip = bin(&mut e, BinaryOp::Div, sigma_mv, sigma_b)?;
        let s_b = bin(&mut e, BinaryOp::Div, gamma, sigma_b)?;
        let mb = bin(&mut e, BinaryOp::Mul, mean, s_b)?;
        let shift_b = bin(&mut e, BinaryOp::Sub, beta, mb)?;
        // After it: * 1, + beta - mean_mv * gamma / sigma_mv; the moving statistics stay put.
        let (recip, shift) = match frozen {
            None => (recip, shift_b),
            Some(fr) => {
                let mm_s = bin(&mut e, BinaryOp::Mul, mm, s_mv)?;
                let shift_mv = bin(&mut e, BinaryOp::Sub, beta, mm_s)?;
                let one = e.scalar(dt, 1.0, &scope)?;
                let ones = e.op(OpKind::BroadcastTo { shape: vec![c] }, &[one], &scope)?;
                (
                    e.op(OpKind::Select, &[fr, ones, recip], &scope)?,
                    e.op(OpKind::Select, &[fr, shift_mv, shift_b], &scope)?,
                )
            }
        };
        let recip = e.op(
            OpKind::Reshape {
                shape: c_dims.clone(),
            },
            &[recip],
            &scope,
        )?;
        let shift = e.op(OpKind::Reshape { shape: c_dims }, &[shift], &scope)?;
        let scaled = bin(&mut e, BinaryOp::Mul, z, recip)?;
        let y2 = bin(&mut e, BinaryOp::Add, scaled, shift)?;
        // The moving statistics, the variance unbiased.
        let decay = e.scalar(dt, t.decay, &scope)?;
        let keep = e.scalar(dt, 1.0 - t.decay, &scope)?;
        let bessel = e.scalar(
            dt,
            if n > 1 {
                n as f64 / (n - 1) as f64
            } else {
                1.0
            },
            &scope,
        )?;
        let var_u = bin(&mut e, BinaryOp::Mul, var, bessel)?;
        let ema = |e: &mut Emit, old: Value, batch: Value, result: &str| -> Result<Value, String> {
            let a = e.bin(BinaryOp::Mul, old, decay, &scope)?;
            let b = e.bin(BinaryOp::Mul, batch, keep, &scope)?;
            match frozen {
                None => e.bin(BinaryOp::Add, a, b, result),
                Some(fr) => {
                    let moved = e.bin(BinaryOp::Add, a, b, &scope)?;
                    e.op(OpKind::Select, &[fr, old, moved], result)
                }
            }
        };
        let new_mm = ema(&mut e, mm, mean, &format!("new/{name}/moving_mean"))?;
        let new_mv = ema(&mut e, mv, var_u, &format!("new/{name}/moving_var"))?;
        let ops = e.ops;
        after.entry(op).or_default().extend(ops);
        replace.push((out, y2));
        new_results.extend([new_mm, new_mv]);
        stats.batch_norms += 1;
    }
    let mut order = first_ops;
    for &op in &schedule {
        order.push(op);
        if let Some(a) = after.remove(&op) {
            order.extend(a);
        }
    }
    f.set_schedule(order);
    for &(old, new) in &replace {
        f.replace_all_uses(old, new);
    }
    let mut results = f.results().to_vec();
    results.extend(new_results);
    f.set_results(results);
    Ok(stats)
}

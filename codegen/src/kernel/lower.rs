//! Kernel ops to body nodes: the one translation of elementwise IR ops into the expression form.

use super::expr::{Bin, Body, Cmp, E, Lane, Un};
use super::math::{erf, exp, gelu, log, sigmoid, tanh};
use std::collections::HashMap;
use tcc_ir::{BinaryOp, CmpOp, DType, Function, Op, OpKind, UnaryOp, Value};

/// Appends to `b` the nodes of elementwise `ops` (in order), reading their operands from `vals`
/// and recording their results there. Every op must satisfy [`super::supported_op`], and the
/// kernel's lane ([`super::kernel_lane`]) must be the body's. In an integer body, the result
/// of an arithmetic op or cast whose dtype is `i8` or `u8` is wrapped to it, as the
/// interpreter rounds every result to its dtype.
pub fn lower_ops(b: &mut Body, f: &Function, ops: &[Op], vals: &mut HashMap<Value, E>) {
    for &op in ops {
        let d = f.op(op);
        let a: Vec<E> = d.args.iter().map(|v| vals[v]).collect();
        let r = match &d.kind {
            OpKind::Unary(u) => unary(b, *u, a[0]),
            OpKind::Binary(BinaryOp::Pow) => {
                match super::pow_exponent(f, d.args[1]).expect("a supported op") {
                    0.0 => b.c(1.0),
                    1.0 => a[0],
                    2.0 => b.mul(a[0], a[0]),
                    _ => {
                        let one = b.c(1.0);
                        b.div(one, a[0])
                    }
                }
            }
            OpKind::Binary(op) => {
                let op = match op {
                    BinaryOp::Add => Bin::Add,
                    BinaryOp::Sub => Bin::Sub,
                    BinaryOp::Mul => Bin::Mul,
                    BinaryOp::Div => Bin::Div,
                    BinaryOp::Max => Bin::Max,
                    BinaryOp::Min => Bin::Min,
                    BinaryOp::Pow => unreachable!("handled above"),
                };
                b.bin(op, a[0], a[1])
            }
            OpKind::Identity | OpKind::StopGradient | OpKind::BroadcastTo { .. } => a[0],
            OpKind::FakeQuant { bits, narrow } => fake_quant(b, [a[0], a[1], a[2]], *bits, *narrow),
            OpKind::Compare(c) if super::int_bits(f, d.args[0], b.lane) => {
                let c = cmp_of(*c);
                let (x, y) = (b.bits(a[0]), b.bits(a[1]));
                b.icmp(c, x, y)
            }
            OpKind::Compare(c) => b.cmp(cmp_of(*c), a[0], a[1]),
            OpKind::Select => b.select(a[0], a[1], a[2]),
            OpKind::Cast { .. } if f.ty(d.args[0]).dtype() == DType::Bool => {
                let (one, zero) = (b.c(1.0), b.c(0.0));
                b.select(a[0], one, zero)
            }
            OpKind::Cast { .. } if super::int_bits(f, d.args[0], b.lane) => {
                let x = b.bits(a[0]);
                b.to_num(x)
            }
            OpKind::Cast { .. } => a[0],
            // `supported_op`, an exhaustive match, decides which ops reach here.
            _ => unreachable!("not a supported op"),
        };
        let arithmetic = matches!(
            d.kind,
            OpKind::Unary(_) | OpKind::Binary(_) | OpKind::Cast { .. }
        );
        let r = match f.ty(d.results[0]).dtype() {
            DType::I8 if arithmetic && b.lane == Lane::I32 => b.wrap(r, Lane::I8),
            DType::U8 if arithmetic && b.lane == Lane::I32 => b.wrap(r, Lane::U8),
            _ => r,
        };
        vals.insert(d.results[0], r);
    }
}

/// `fake_quant` of `x` with range `[lo, hi]`, operation for operation as the reference
/// ([`tcc_ir::interp::fake_quant`]) computes it in the body's float type: the nudged range,
/// the clamp, then `floor((x - nudged_min) * (1 / scale) + 0.5) * scale + nudged_min`, each
/// product and sum rounded on its own (no fused multiply-add). NaN where `lo < hi` fails.
fn fake_quant(b: &mut Body, [x, lo, hi]: [E; 3], bits: u64, narrow: bool) -> E {
    let qmin = if narrow { 1.0 } else { 0.0 };
    let qmax = ((1u64 << bits) - 1) as f64;
    let span = b.sub(hi, lo);
    let levels = b.c(qmax - qmin);
    let scale = b.div(span, levels);
    let ratio = b.div(lo, scale);
    let (qmin_c, qmax_c) = (b.c(qmin), b.c(qmax));
    let from_min = b.sub(qmin_c, ratio);
    // The zero point rounded half away from zero, then clamped to the levels.
    let t = b.un(Un::Floor, from_min);
    let frac = b.sub(from_min, t);
    let half = b.c(0.5);
    let one = b.c(1.0);
    let t1 = b.add(t, one);
    let zero = b.select_if(Cmp::Ge, frac, half, t1, t);
    let zero = b.bin(Bin::Max, zero, qmin_c);
    let zero = b.bin(Bin::Min, zero, qmax_c);
    let low = b.sub(qmin_c, zero);
    let high = b.sub(qmax_c, zero);
    let nmin = b.mul(low, scale);
    let nmax = b.mul(high, scale);
    let inv = b.div(one, scale);
    let clamped = b.bin(Bin::Max, x, nmin);
    let clamped = b.bin(Bin::Min, clamped, nmax);
    let shifted = b.sub(clamped, nmin);
    let scaled = b.mul(shifted, inv);
    let level = b.add(scaled, half);
    let level = b.un(Un::Floor, level);
    let y = b.mul(level, scale);
    let y = b.add(y, nmin);
    let nan = b.c(f64::NAN);
    b.select_if(Cmp::Lt, lo, hi, y, nan)
}

/// The expression form's comparison for `c`.
fn cmp_of(c: CmpOp) -> Cmp {
    match c {
        CmpOp::Eq => Cmp::Eq,
        CmpOp::Ne => Cmp::Ne,
        CmpOp::Lt => Cmp::Lt,
        CmpOp::Le => Cmp::Le,
        CmpOp::Gt => Cmp::Gt,
        CmpOp::Ge => Cmp::Ge,
    }
}

/// A body of `lane` numbers over the kernel values `inputs` (arguments `0..inputs.len()`), then
/// `extra` more arguments: `ops` lowered, then `then` (given the body, the values so far and the
/// extra arguments) adds nodes, and the results are the values of `results`.
pub fn body(
    lane: Lane,
    f: &Function,
    inputs: &[Value],
    extra: usize,
    ops: &[Op],
    then: impl FnOnce(&mut Body, &mut HashMap<Value, E>, &[E]),
    results: &[Value],
) -> Body {
    let mut b = Body::new(lane);
    let mut vals: HashMap<Value, E> = inputs
        .iter()
        .map(|&v| {
            let e = if f.ty(v).dtype() == DType::Bool {
                b.mask_arg()
            } else {
                b.arg()
            };
            (v, e)
        })
        .collect();
    let extra: Vec<E> = (0..extra).map(|_| b.arg()).collect();
    lower_ops(&mut b, f, ops, &mut vals);
    then(&mut b, &mut vals, &extra);
    b.results = results.iter().map(|v| vals[v]).collect();
    b
}

/// An `f32` body of `n` arguments whose one result `node` computes (a fold step, a combine).
pub fn small_body(n: usize, node: impl FnOnce(&mut Body, &[E]) -> E) -> Body {
    let mut b = Body::new(Lane::F32);
    let args: Vec<E> = (0..n).map(|_| b.arg()).collect();
    let r = node(&mut b, &args);
    b.results = vec![r];
    b
}

fn unary(b: &mut Body, u: UnaryOp, x: E) -> E {
    match u {
        UnaryOp::Neg => b.un(Un::Neg, x),
        UnaryOp::Abs => b.un(Un::Abs, x),
        UnaryOp::Sqrt => b.un(Un::Sqrt, x),
        UnaryOp::Rsqrt => {
            let s = b.un(Un::Sqrt, x);
            let one = b.c(1.0);
            b.div(one, s)
        }
        UnaryOp::Reciprocal => {
            let one = b.c(1.0);
            b.div(one, x)
        }
        UnaryOp::Relu => {
            // x < 0 ? 0 : x, so NaN stays NaN.
            let zero = b.c(0.0);
            b.select_if(Cmp::Lt, x, zero, zero, x)
        }
        UnaryOp::Exp => exp(b, x),
        UnaryOp::Log => log(b, x),
        UnaryOp::Erf => erf(b, x),
        UnaryOp::Gelu => gelu(b, x),
        UnaryOp::Tanh => tanh(b, x),
        UnaryOp::Floor => b.un(Un::Floor, x),
        UnaryOp::Ceil => b.un(Un::Ceil, x),
        UnaryOp::Round => b.un(Un::Nearest, x),
        UnaryOp::Sigmoid => sigmoid(b, x),
    }
}

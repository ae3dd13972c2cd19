//! Renders kernel bodies ([`crate::kernel::expr::Body`]) as Cranelift instructions, at the
//! width the loop chooses: `F32` for scalar tails, `F32X4` for vector loops (`F64`/`F64X2` for
//! `f64` bodies). Masks are `fcmp` results: an `i8` for scalars, the lanes reinterpreted as the
//! float vector type for vectors, so `bitselect` can use them.

use super::jit::Target;
use crate::kernel::expr::{Bin, Body, Cmp, IBin, Lane, Node, Un};
use cranelift_codegen::ir::condcodes::FloatCC;
use cranelift_codegen::ir::{InstBuilder, MemFlags, Type, Value as CValue, types};
use cranelift_frontend::FunctionBuilder;

/// The integer type with the lanes of float type `ty`.
fn int_type(ty: Type) -> Type {
    if ty.is_vector() {
        types::I32
            .by(ty.lane_count())
            .expect("a vector of 32-bit lanes")
    } else {
        types::I32
    }
}

/// A float constant of type `ty` (a scalar or a splat).
pub(super) fn fconst(b: &mut FunctionBuilder, ty: Type, x: f64) -> CValue {
    let c = if ty.lane_type() == types::F64 {
        b.ins().f64const(x)
    } else {
        b.ins().f32const(x as f32)
    };
    if ty.is_vector() {
        b.ins().splat(ty, c)
    } else {
        c
    }
}

/// Emits `body` at float type `ty` on `args` (one per body argument, of type `ty`) and returns
/// its results.
pub(super) fn render(
    b: &mut FunctionBuilder,
    tg: Target,
    ty: Type,
    body: &Body,
    args: &[CValue],
) -> Vec<CValue> {
    debug_assert_eq!(args.len(), body.num_args());
    debug_assert_eq!(
        ty.lane_type(),
        if body.lane == Lane::F64 {
            types::F64
        } else {
            types::F32
        }
    );
    let ity = int_type(ty);
    let vector = ty.is_vector();
    let mut v: Vec<CValue> = Vec::with_capacity(body.nodes().len());
    for &(node, _) in body.nodes() {
        let at = |e| v[Body::index(e)];
        let r = match node {
            Node::Arg(j) => args[j as usize],
            Node::Num(x) => fconst(b, ty, x),
            Node::Int(x) => {
                let c = b.ins().iconst(types::I32, x as i64);
                if vector { b.ins().splat(ity, c) } else { c }
            }
            Node::Un(op, a) => {
                let a = at(a);
                match op {
                    Un::Neg => b.ins().fneg(a),
                    Un::Abs => b.ins().fabs(a),
                    Un::Sqrt => b.ins().sqrt(a),
                    Un::Nearest => b.ins().nearest(a),
                }
            }
            Node::Bin(op, x, y) => {
                let (x, y) = (at(x), at(y));
                match op {
                    Bin::Add => b.ins().fadd(x, y),
                    Bin::Sub => b.ins().fsub(x, y),
                    Bin::Mul => b.ins().fmul(x, y),
                    Bin::Div => b.ins().fdiv(x, y),
                    Bin::Min => b.ins().fmin(x, y),
                    Bin::Max => b.ins().fmax(x, y),
                }
            }
            Node::MulAdd(x, y, c) => {
                let (x, y, c) = (at(x), at(y), at(c));
                if tg.fma {
                    b.ins().fma(x, y, c)
                } else {
                    let m = b.ins().fmul(x, y);
                    b.ins().fadd(m, c)
                }
            }
            Node::Cmp(op, x, y) => {
                let cc = match op {
                    Cmp::Eq => FloatCC::Equal,
                    Cmp::Ne => FloatCC::NotEqual,
                    Cmp::Lt => FloatCC::LessThan,
                    Cmp::Le => FloatCC::LessThanOrEqual,
                    Cmp::Gt => FloatCC::GreaterThan,
                    Cmp::Ge => FloatCC::GreaterThanOrEqual,
                    Cmp::Unordered => FloatCC::Unordered,
                };
                let m = b.ins().fcmp(cc, at(x), at(y));
                if vector {
                    b.ins().bitcast(ty, MemFlags::new(), m)
                } else {
                    m
                }
            }
            Node::Select(m, t, e) => {
                let (m, t, e) = (at(m), at(t), at(e));
                if vector {
                    b.ins().bitselect(m, t, e)
                } else {
                    b.ins().select(m, t, e)
                }
            }
            Node::Bits(a) => b.ins().bitcast(ity, MemFlags::new(), at(a)),
            Node::FromBits(a) => b.ins().bitcast(ty, MemFlags::new(), at(a)),
            Node::ToInt(a) => {
                if vector {
                    b.ins().x86_cvtt2dq(ity, at(a))
                } else {
                    b.ins().fcvt_to_sint_sat(ity, at(a))
                }
            }
            Node::ToNum(a) => b.ins().fcvt_from_sint(ty, at(a)),
            Node::IBin(op, x, y) => {
                let (x, y) = (at(x), at(y));
                match op {
                    IBin::Add => b.ins().iadd(x, y),
                    IBin::Sub => b.ins().isub(x, y),
                    IBin::And => b.ins().band(x, y),
                    IBin::Or => b.ins().bor(x, y),
                }
            }
            Node::Shl(a, k) => b.ins().ishl_imm(at(a), k as i64),
            Node::Sshr(a, k) => b.ins().sshr_imm(at(a), k as i64),
            Node::Ushr(a, k) => b.ins().ushr_imm(at(a), k as i64),
        };
        v.push(r);
    }
    body.results.iter().map(|&e| v[Body::index(e)]).collect()
}

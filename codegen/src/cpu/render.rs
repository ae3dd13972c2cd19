//! Renders kernel bodies ([`crate::kernel::expr::Body`]) as Cranelift instructions, at the
//! width the loop chooses: `F32` for scalar tails, `F32X4` for vector loops (`F64`/`F64X2` for
//! `f64` bodies, `I32`/`I32X4` for integer ones). Masks are comparison results: an `i8` for
//! scalars, and for vectors lanes of the body's vector type (a float compare's lanes
//! reinterpreted as floats), so `bitselect` can use them.

use super::jit::Target;
use crate::kernel::expr::{Bin, Body, Cmp, IBin, Lane, Node, Un};
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
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

/// A number constant of type `ty` (a scalar or a splat; float, or an integer `x` holds exactly).
pub(super) fn num_const(b: &mut FunctionBuilder, ty: Type, x: f64) -> CValue {
    let lane = ty.lane_type();
    let c = if lane == types::F64 {
        b.ins().f64const(x)
    } else if lane == types::F32 {
        b.ins().f32const(x as f32)
    } else {
        b.ins().iconst(lane, x as i64)
    };
    if ty.is_vector() {
        b.ins().splat(ty, c)
    } else {
        c
    }
}

/// Emits `body` at type `ty` (its lane's scalar or vector type) on `args` (one per body
/// argument, of type `ty`) and returns its results.
pub(super) fn render(
    b: &mut FunctionBuilder,
    tg: Target,
    ty: Type,
    body: &Body,
    args: &[CValue],
) -> Vec<CValue> {
    debug_assert_eq!(args.len(), body.num_args());
    let lane = match body.lane {
        Lane::F32 => types::F32,
        Lane::F64 => types::F64,
        Lane::I32 | Lane::I8 | Lane::U8 => types::I32,
    };
    debug_assert_eq!(ty.lane_type(), lane, "a body renders at its lane's types");
    let int = lane == types::I32;
    let ity = int_type(ty);
    let vector = ty.is_vector();
    let mut v: Vec<CValue> = Vec::with_capacity(body.nodes().len());
    for &(node, _) in body.nodes() {
        let at = |e| v[Body::index(e)];
        let r = match node {
            Node::Arg(j) => args[j as usize],
            // Loaded as a 32-bit 0 or 1 (bool inputs keep a kernel in the scalar loop).
            Node::MaskArg(j) => b.ins().icmp_imm(IntCC::NotEqual, args[j as usize], 0),
            Node::Num(x) => num_const(b, ty, x),
            Node::Int(x) => {
                let c = b.ins().iconst(types::I32, x as i64);
                if vector { b.ins().splat(ity, c) } else { c }
            }
            Node::Un(op, a) => {
                let a = at(a);
                match (op, int) {
                    (Un::Neg, false) => b.ins().fneg(a),
                    (Un::Abs, false) => b.ins().fabs(a),
                    (Un::Sqrt, false) => b.ins().sqrt(a),
                    (Un::Nearest, false) => b.ins().nearest(a),
                    (Un::Floor, false) => b.ins().floor(a),
                    (Un::Ceil, false) => b.ins().ceil(a),
                    (Un::Neg, true) => b.ins().ineg(a),
                    (Un::Abs, true) => b.ins().iabs(a),
                    (Un::Sqrt | Un::Nearest | Un::Floor | Un::Ceil, true) => {
                        unreachable!("float-only node {op:?}")
                    }
                }
            }
            Node::Bin(op, bx, by) => {
                let (x, y) = (at(bx), at(by));
                match (op, int) {
                    (Bin::Add, false) => b.ins().fadd(x, y),
                    (Bin::Sub, false) => b.ins().fsub(x, y),
                    (Bin::Mul, false) => b.ins().fmul(x, y),
                    (Bin::Div, false) => b.ins().fdiv(x, y),
                    (Bin::Min | Bin::Max, false) if vector => {
                        let c = |e| match body.nodes()[Body::index(e)].0 {
                            Node::Num(c) => !c.is_nan(),
                            _ => false,
                        };
                        let (cx, cy) = (c(bx), c(by));
                        vector_min_max(b, op == Bin::Max, x, y, cx, cy)
                    }
                    (Bin::Min, false) => b.ins().fmin(x, y),
                    (Bin::Max, false) => b.ins().fmax(x, y),
                    (Bin::Add, true) => b.ins().iadd(x, y),
                    (Bin::Sub, true) => b.ins().isub(x, y),
                    (Bin::Mul, true) => b.ins().imul(x, y),
                    (Bin::Min, true) => b.ins().smin(x, y),
                    (Bin::Max, true) => b.ins().smax(x, y),
                    (Bin::Div, true) => unreachable!("kernel_lane keeps integer division out"),
                }
            }
            Node::MulAdd(x, y, c) => {
                let (x, y, c) = (at(x), at(y), at(c));
                if int {
                    let m = b.ins().imul(x, y);
                    b.ins().iadd(m, c)
                } else if tg.fma {
                    b.ins().fma(x, y, c)
                } else {
                    let m = b.ins().fmul(x, y);
                    b.ins().fadd(m, c)
                }
            }
            Node::ICmp(op, x, y) => {
                let cc = int_cc(op);
                let m = b.ins().icmp(cc, at(x), at(y));
                if vector && !int {
                    b.ins().bitcast(ty, MemFlags::new(), m)
                } else {
                    m
                }
            }
            Node::Cmp(op, x, y) if int => {
                let cc = int_cc(op);
                // Vector lanes are all ones or zeros of the body's own type already.
                b.ins().icmp(cc, at(x), at(y))
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
            Node::Wrap(a, to) => {
                let a = at(a);
                if to == Lane::I8 {
                    let s = b.ins().ishl_imm(a, 24);
                    b.ins().sshr_imm(s, 24)
                } else {
                    let m = num_const(b, ty, 255.0);
                    b.ins().band(a, m)
                }
            }
        };
        v.push(r);
    }
    body.results.iter().map(|&e| v[Body::index(e)]).collect()
}

/// `min(x, y)` or `max(x, y)` of float vectors, NaN where either lane is NaN, in the shapes
/// Cranelift's x86 backend turns into one `minps`/`maxps` (`a < b ? a : b` and `b < a ? a : b`
/// with a bitselect; those return `b` when either is NaN). Its own `fmin`/`fmax` take about ten
/// instructions each, to order signed zeros as well, which costs relu and clip epilogues up to
/// half their time. With a constant (`cx`/`cy`: that operand is a number, not NaN) on one side,
/// one instruction with the other operand in the NaN-returning place is exact; otherwise the
/// lanes where either is NaN are or-ed with all ones (a NaN). Equal zeros of opposite sign may
/// give either zero, as in the reference interpreter, which returns the first.
fn vector_min_max(
    b: &mut FunctionBuilder,
    max: bool,
    x: CValue,
    y: CValue,
    cx: bool,
    cy: bool,
) -> CValue {
    let ty = b.func.dfg.value_type(x);
    // `pick(a, b)`: `a` where it wins over `b`, else `b` (and `b` where either is NaN).
    let pick = |b: &mut FunctionBuilder, a: CValue, other: CValue| {
        let m = if max {
            b.ins().fcmp(FloatCC::LessThan, other, a)
        } else {
            b.ins().fcmp(FloatCC::LessThan, a, other)
        };
        let m = b.ins().bitcast(ty, MemFlags::new(), m);
        b.ins().bitselect(m, a, other)
    };
    if cy {
        pick(b, y, x)
    } else if cx {
        pick(b, x, y)
    } else {
        let r = pick(b, y, x);
        let nan = b.ins().fcmp(FloatCC::Unordered, x, y);
        let nan = b.ins().bitcast(ty, MemFlags::new(), nan);
        b.ins().bor(r, nan)
    }
}

/// The signed integer condition of a comparison.
fn int_cc(op: Cmp) -> IntCC {
    match op {
        Cmp::Eq => IntCC::Equal,
        Cmp::Ne => IntCC::NotEqual,
        Cmp::Lt => IntCC::SignedLessThan,
        Cmp::Le => IntCC::SignedLessThanOrEqual,
        Cmp::Gt => IntCC::SignedGreaterThan,
        Cmp::Ge => IntCC::SignedGreaterThanOrEqual,
        Cmp::Unordered => unreachable!("no unordered integers"),
    }
}

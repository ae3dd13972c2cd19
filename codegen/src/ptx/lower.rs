//! Kernels of the plan in the GPU kernel form ([`super::prog`]).
//!
//! An elementwise kernel is a grid-stride loop: thread `t` of block `b` handles elements
//! `b * block + t`, then that plus the grid's size, and so on, each loading its operands as
//! their access patterns say ([`crate::kernel::Access`]), computing the kernel layer's body and
//! storing the results. Index arithmetic is 32-bit where every index fits (elements below
//! 2^31), else 64-bit.

use super::prog::{
    Builder, Cmp, CmpTy, Cvt, FOp, FUn, IOp, IUn, Inst, Kernel, Mem, Reg, RegTy, Space, Sreg,
};
use crate::kernel::expr::{self, Body, Class, Lane, Node};
use crate::kernel::lower::body as body_of;
use crate::kernel::{Access, access, int_bits, splat_number};
use crate::plan::KernelData;
use std::collections::HashMap;
use tcc_ir::{DType, Function};

/// Threads per block of elementwise kernels.
pub const BLOCK: u32 = 256;

/// Most blocks an elementwise kernel is launched with; each thread then loops over its
/// elements.
pub const MAX_BLOCKS: u64 = 65_535;

/// A lowered kernel and the grid it is launched on.
pub struct Lowered {
    /// The kernel.
    pub kernel: Kernel,
    /// Blocks in the grid.
    pub grid: u32,
}

/// The register type numbers of `lane` are computed in.
fn lane_reg(lane: Lane) -> RegTy {
    match lane {
        Lane::F32 => RegTy::F32,
        Lane::F64 => RegTy::F64,
        Lane::I32 | Lane::I8 | Lane::U8 => RegTy::I32,
    }
}

/// How a `d` element is loaded in a kernel computing in `lane` (memory type, register type),
/// or why it cannot be.
fn load_kind(d: DType, lane: Lane, bits: bool) -> Result<(Mem, RegTy), String> {
    Ok(match (d, lane) {
        (DType::F32, Lane::F32) => (Mem::B32, RegTy::F32),
        (DType::F64, Lane::F64) => (Mem::B64, RegTy::F64),
        // An integer a float kernel compares, read as its bits.
        (DType::I32, Lane::F32) if bits => (Mem::B32, RegTy::F32),
        (DType::I32, Lane::I32 | Lane::I8 | Lane::U8) => (Mem::B32, RegTy::I32),
        (DType::I8, _) => (Mem::S8, RegTy::I32),
        (DType::U8 | DType::Bool, _) => (Mem::U8, RegTy::I32),
        (d, lane) => return Err(format!("no GPU load of {d} values in a {lane:?} kernel")),
    })
}

/// The bits of number `x` in a register of `ty`.
fn num_bits(x: f64, ty: RegTy) -> u64 {
    match ty {
        RegTy::F32 => (x as f32).to_bits() as u64,
        RegTy::F64 => x.to_bits(),
        _ => x as i32 as u32 as u64,
    }
}

/// Kernel `kd` of `f`, elementwise in `lane`, as a grid-stride loop named `name`: its
/// parameters are the addresses of its inputs, then of its outputs.
pub fn elementwise(
    f: &Function,
    kd: &KernelData,
    lane: Lane,
    name: String,
) -> Result<Lowered, String> {
    let out_dims = f.ty(f.op(kd.ops[0]).results[0]).dims().to_vec();
    let n: u64 = out_dims.iter().product();
    let accesses: Vec<Access> = (kd.inputs.iter())
        .map(|&v| match access(f.ty(v).dims(), &out_dims) {
            Some(Access::Scalar(_)) if int_bits(f, v, lane) => Ok(Access::Scalar(None)),
            Some(Access::Scalar(_)) => Ok(Access::Scalar(splat_number(f, v))),
            Some(a) => Ok(a),
            None => Err(format!("operand %{} cannot be indexed", f.name(v))),
        })
        .collect::<Result<_, _>>()?;
    let body = body_of(lane, f, &kd.inputs, 0, &kd.ops, |_, _, _| {}, &kd.outputs);
    let n_in = kd.inputs.len();
    let params = (n_in + kd.outputs.len()) as u32;
    let mut b = Builder::new(name, params, BLOCK);
    let mut imms: HashMap<(u64, RegTy), Reg> = HashMap::new();
    let mut imm = |b: &mut Builder, ty: RegTy, bits: u64| {
        *imms.entry((bits, ty)).or_insert_with(|| b.imm(ty, bits))
    };
    // 32-bit indices where every one fits.
    let it = if n <= i32::MAX as u64 {
        RegTy::I32
    } else {
        RegTy::I64
    };
    let bases: Vec<Reg> = (0..params)
        .map(|j| {
            let p = b.reg(RegTy::I64);
            b.push(Inst::Param(p, j));
            b.cvt(Cvt::ToGlobal, RegTy::I64, p)
        })
        .collect();
    // Where this thread starts, and the grid's stride.
    let sregs: Vec<Reg> = [Sreg::Tid, Sreg::Ntid, Sreg::Ctaid, Sreg::Nctaid]
        .iter()
        .map(|&s| {
            let r = b.reg(RegTy::I32);
            b.push(Inst::Sreg(r, s));
            r
        })
        .collect();
    let (tid, ntid, ctaid, nctaid) = (sregs[0], sregs[1], sregs[2], sregs[3]);
    let first = b.reg(RegTy::I32);
    b.push(Inst::IMad(first, ctaid, ntid, tid));
    let stride = b.ibin(IOp::Mul, nctaid, ntid);
    let (i, stride) = if it == RegTy::I64 {
        (
            b.cvt(Cvt::U32ToU64, RegTy::I64, first),
            b.cvt(Cvt::U32ToU64, RegTy::I64, stride),
        )
    } else {
        (first, stride)
    };
    let count = imm(&mut b, it, n);
    // The address of element `idx` (of `it`) of a `mem` buffer at `base`.
    let address = |b: &mut Builder,
                   imm: &mut dyn FnMut(&mut Builder, RegTy, u64) -> Reg,
                   base: Reg,
                   idx: Reg,
                   mem: Mem| {
        let wide = if it == RegTy::I32 {
            b.cvt(Cvt::U32ToU64, RegTy::I64, idx)
        } else {
            idx
        };
        let off = match mem.bytes() {
            1 => wide,
            k => {
                let sh = imm(b, RegTy::I32, k.trailing_zeros() as u64);
                b.ibin(IOp::Shl, wide, sh)
            }
        };
        b.ibin(IOp::Add, base, off)
    };
    // Operands read as scalars, loaded (or set) once.
    let mut scalars: Vec<Option<Reg>> = Vec::with_capacity(n_in);
    let mut kinds = Vec::with_capacity(n_in);
    for (j, (&v, a)) in kd.inputs.iter().zip(&accesses).enumerate() {
        let kind = load_kind(f.ty(v).dtype(), lane, int_bits(f, v, lane))?;
        kinds.push(kind);
        scalars.push(match *a {
            Access::Scalar(Some(x)) => Some(imm(&mut b, kind.1, num_bits(x, kind.1))),
            Access::Scalar(None) => Some(b.ld(Space::Global, kind.0, kind.1, bases[j])),
            _ => None,
        });
    }
    let top = b.label();
    let end = b.label();
    b.place(top);
    let done = b.setp(CmpTy::Unsigned, Cmp::Ge, i, count);
    b.push(Inst::Bra(end, Some((done, true))));
    let mut args = Vec::with_capacity(n_in);
    for j in 0..n_in {
        if let Some(s) = scalars[j] {
            args.push(s);
            continue;
        }
        let idx = match accesses[j] {
            Access::Same => i,
            Access::Block { inner, n } | Access::Gapped { inner, n, .. } => {
                let q = if inner == 1 {
                    i
                } else {
                    let c = imm(&mut b, it, inner);
                    b.ibin(IOp::DivU, i, c)
                };
                let cn = imm(&mut b, it, n);
                let mut idx = b.ibin(IOp::RemU, q, cn);
                if let Access::Gapped {
                    outer_inner,
                    outer_n,
                    ..
                } = accesses[j]
                {
                    let c = imm(&mut b, it, outer_inner);
                    let q = b.ibin(IOp::DivU, i, c);
                    let c = imm(&mut b, it, outer_n);
                    let hi = b.ibin(IOp::RemU, q, c);
                    let sum = b.reg(it);
                    b.push(Inst::IMad(sum, hi, cn, idx));
                    idx = sum;
                }
                idx
            }
            Access::Scalar(_) => unreachable!("loaded before the loop"),
        };
        let (mem, ty) = kinds[j];
        let addr = address(&mut b, &mut imm, bases[j], idx, mem);
        args.push(b.ld(Space::Global, mem, ty, addr));
    }
    let outs = render(&mut b, &mut imm, &body, &args)?;
    for (o, (&r, &v)) in outs.iter().zip(&kd.outputs).enumerate() {
        let d = f.ty(v).dtype();
        let (mem, val) = match (d, body.class(body.results[o])) {
            (DType::Bool, Class::Mask) => {
                let (one, zero) = (imm(&mut b, RegTy::I32, 1), imm(&mut b, RegTy::I32, 0));
                (Mem::U8, b.selp(one, zero, r))
            }
            (DType::F32 | DType::I32, Class::Num) => (Mem::B32, r),
            (DType::F64, Class::Num) => (Mem::B64, r),
            (DType::I8 | DType::U8, Class::Num) => (Mem::U8, r),
            (d, c) => return Err(format!("no GPU store of a {c:?} as {d}")),
        };
        let addr = address(&mut b, &mut imm, bases[n_in + o], i, mem);
        b.push(Inst::St(Space::Global, mem, addr, val));
    }
    b.push(Inst::IBin(IOp::Add, i, i, stride));
    b.push(Inst::Bra(top, None));
    b.place(end);
    b.push(Inst::Ret);
    let grid = n.div_ceil(BLOCK as u64).clamp(1, MAX_BLOCKS) as u32;
    Ok(Lowered { kernel: b.k, grid })
}

/// The instructions of `body` over argument registers `args`; its result registers.
fn render(
    b: &mut Builder,
    imm: &mut dyn FnMut(&mut Builder, RegTy, u64) -> Reg,
    body: &Body,
    args: &[Reg],
) -> Result<Vec<Reg>, String> {
    let num = lane_reg(body.lane);
    let int = num == RegTy::I32;
    let mut v: Vec<Reg> = Vec::with_capacity(body.nodes().len());
    for &(node, _) in body.nodes() {
        let at = |e: expr::E| v[Body::index(e)];
        let unsupported = || format!("no GPU form of {node:?} in a {:?} kernel", body.lane);
        let r = match node {
            Node::Arg(j) => args[j as usize],
            Node::MaskArg(j) => {
                let zero = imm(b, RegTy::I32, 0);
                b.setp(CmpTy::Unsigned, Cmp::Ne, args[j as usize], zero)
            }
            Node::Num(x) => imm(b, num, num_bits(x, num)),
            Node::Int(x) => imm(b, RegTy::I32, x as u32 as u64),
            Node::Un(op, a) => {
                let a = at(a);
                if int {
                    let op = match op {
                        expr::Un::Neg => IUn::Neg,
                        expr::Un::Abs => IUn::Abs,
                        _ => return Err(unsupported()),
                    };
                    let d = b.reg(RegTy::I32);
                    b.push(Inst::IUn(op, d, a));
                    d
                } else {
                    let op = match op {
                        expr::Un::Neg => FUn::Neg,
                        expr::Un::Abs => FUn::Abs,
                        expr::Un::Sqrt => FUn::Sqrt,
                        expr::Un::Nearest => FUn::Rni,
                        expr::Un::Floor => FUn::Rmi,
                        expr::Un::Ceil => FUn::Rpi,
                    };
                    b.fun(op, a)
                }
            }
            Node::Bin(op, x, y) => {
                let (x, y) = (at(x), at(y));
                if int {
                    let op = match op {
                        expr::Bin::Add => IOp::Add,
                        expr::Bin::Sub => IOp::Sub,
                        expr::Bin::Mul => IOp::Mul,
                        expr::Bin::Min => IOp::MinS,
                        expr::Bin::Max => IOp::MaxS,
                        expr::Bin::Div => return Err(unsupported()),
                    };
                    b.ibin(op, x, y)
                } else {
                    match op {
                        expr::Bin::Add => b.fbin(FOp::Add, x, y),
                        expr::Bin::Sub => b.fbin(FOp::Sub, x, y),
                        expr::Bin::Mul => b.fbin(FOp::Mul, x, y),
                        expr::Bin::Div => b.fbin(FOp::Div, x, y),
                        // The kernel layer's min and max are NaN if either operand is; PTX's
                        // take the other operand. Where either is NaN, their sum (a NaN).
                        expr::Bin::Min | expr::Bin::Max => {
                            let m = if op == expr::Bin::Min {
                                b.fbin(FOp::Min, x, y)
                            } else {
                                b.fbin(FOp::Max, x, y)
                            };
                            let nan = b.setp(CmpTy::Float, Cmp::Nan, x, y);
                            let s = b.fbin(FOp::Add, x, y);
                            b.selp(s, m, nan)
                        }
                    }
                }
            }
            Node::MulAdd(x, y, c) => {
                let d = b.reg(num);
                let (x, y, c) = (at(x), at(y), at(c));
                b.push(if int {
                    Inst::IMad(d, x, y, c)
                } else {
                    Inst::Fma(d, x, y, c)
                });
                d
            }
            Node::Cmp(op, x, y) => {
                let ty = if int { CmpTy::Signed } else { CmpTy::Float };
                let op = match op {
                    expr::Cmp::Eq => Cmp::Eq,
                    expr::Cmp::Ne if int => Cmp::Ne,
                    expr::Cmp::Ne => Cmp::Neu,
                    expr::Cmp::Lt => Cmp::Lt,
                    expr::Cmp::Le => Cmp::Le,
                    expr::Cmp::Gt => Cmp::Gt,
                    expr::Cmp::Ge => Cmp::Ge,
                    expr::Cmp::Unordered if !int => Cmp::Nan,
                    expr::Cmp::Unordered => return Err(unsupported()),
                };
                b.setp(ty, op, at(x), at(y))
            }
            Node::ICmp(op, x, y) => {
                let op = match op {
                    expr::Cmp::Eq => Cmp::Eq,
                    expr::Cmp::Ne => Cmp::Ne,
                    expr::Cmp::Lt => Cmp::Lt,
                    expr::Cmp::Le => Cmp::Le,
                    expr::Cmp::Gt => Cmp::Gt,
                    expr::Cmp::Ge => Cmp::Ge,
                    expr::Cmp::Unordered => return Err(unsupported()),
                };
                // Integers a float kernel compares are still in float registers: their bits.
                let as_int = |b: &mut Builder, r: Reg| {
                    if b.ty(r) == RegTy::F32 {
                        let d = b.reg(RegTy::I32);
                        b.push(Inst::Mov(d, r));
                        d
                    } else {
                        r
                    }
                };
                let (x, y) = (as_int(b, at(x)), as_int(b, at(y)));
                b.setp(CmpTy::Signed, op, x, y)
            }
            Node::Select(m, t, e) => b.selp(at(t), at(e), at(m)),
            Node::Bits(a) if num == RegTy::F32 => {
                let d = b.reg(RegTy::I32);
                b.push(Inst::Mov(d, at(a)));
                d
            }
            Node::FromBits(a) if num == RegTy::F32 => {
                let d = b.reg(RegTy::F32);
                b.push(Inst::Mov(d, at(a)));
                d
            }
            Node::ToInt(a) if !int => b.cvt(Cvt::FloatToS32, RegTy::I32, at(a)),
            Node::ToNum(a) if !int => b.cvt(Cvt::S32ToFloat, num, at(a)),
            Node::IBin(op, x, y) => {
                let op = match op {
                    expr::IBin::Add => IOp::Add,
                    expr::IBin::Sub => IOp::Sub,
                    expr::IBin::And => IOp::And,
                    expr::IBin::Or => IOp::Or,
                };
                b.ibin(op, at(x), at(y))
            }
            Node::Shl(a, k) | Node::Sshr(a, k) | Node::Ushr(a, k) => {
                let op = match node {
                    Node::Shl(..) => IOp::Shl,
                    Node::Sshr(..) => IOp::ShrS,
                    _ => IOp::ShrU,
                };
                let k = imm(b, RegTy::I32, k as u64);
                b.ibin(op, at(a), k)
            }
            Node::Wrap(a, to) => {
                let c = if to == Lane::I8 { Cvt::S8 } else { Cvt::U8 };
                b.cvt(c, RegTy::I32, at(a))
            }
            Node::Bits(_) | Node::FromBits(_) | Node::ToInt(_) | Node::ToNum(_) => {
                return Err(unsupported());
            }
        };
        v.push(r);
    }
    Ok(body.results.iter().map(|&e| v[Body::index(e)]).collect())
}

//! The lowering context every kernel of the GPU kernel form ([`super::prog`]) is built with
//! ([`Ctx`]): the index width (32-bit where every index fits, elements below 2^31, else 64-bit),
//! the parameters' addresses, operands loaded by their access patterns
//! ([`crate::kernel::Access`]), stores, counted and grid-stride loops, a block's combine in
//! shared memory, and the rendering of the kernel layer's bodies ([`render`]). The kernels
//! themselves are in [`super::elementwise`], [`super::reduce`], [`super::rows`],
//! [`super::gemm`] and [`super::movement`].

use super::prog::{
    Builder, Cmp, CmpTy, Cvt, FOp, FUn, IOp, IUn, Inst, Kernel, Mem, Reg, RegTy, Space, Sreg,
};
use crate::kernel::expr::{self, Body, Class, Lane, Node};
use crate::kernel::{Access, access, int_bits, splat_number};
use tcc_ir::{DType, Function, Value};

/// Threads per block of elementwise kernels.
pub const BLOCK: u32 = 256;

/// Warps in a block of [`BLOCK`] threads.
const WARPS: u32 = BLOCK / 32;

/// Most blocks an elementwise kernel is launched with; each thread then loops over its
/// elements.
pub const MAX_BLOCKS: u64 = 65_535;

/// A lowered kernel and the grid it is launched on.
pub struct Lowered {
    /// The kernel.
    pub kernel: Kernel,
    /// Blocks in the grid.
    pub grid: u32,
    /// A kernel launched right after this one over the same parameters (the second half of a
    /// product whose `k` is split).
    pub then: Option<Box<Lowered>>,
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

/// An operand of a kernel as a loop reads it: its address, how it is indexed, how it is
/// loaded, and its register if it is read once before the loop.
pub(super) struct Operand {
    base: Reg,
    access: Access,
    mem: Mem,
    ty: RegTy,
    scalar: Option<Reg>,
}

/// A kernel being lowered: the builder, the index width, and the parameters' addresses.
pub(super) struct Ctx {
    pub(super) b: Builder,
    /// The type of element indices: 32-bit where every index fits.
    pub(super) it: RegTy,
    /// Each parameter's global address.
    pub(super) bases: Vec<Reg>,
}

/// A block working on one row: its thread's index and its shared memory.
pub(super) struct Team {
    pub(super) tid: Reg,
    smem: Reg,
}

impl Ctx {
    /// A kernel of `params` address parameters, its indices below `n`, `block` threads.
    pub(super) fn new(name: String, params: u32, block: u32, n: u64) -> Ctx {
        let mut b = Builder::new(name, params, block);
        let it = if n <= i32::MAX as u64 {
            RegTy::I32
        } else {
            RegTy::I64
        };
        let bases = (0..params)
            .map(|j| {
                let p = b.reg(RegTy::I64);
                b.push(Inst::Param(p, j));
                b.cvt(Cvt::ToGlobal, RegTy::I64, p)
            })
            .collect();
        Ctx { b, it, bases }
    }

    /// A special register.
    pub(super) fn sreg(&mut self, s: Sreg) -> Reg {
        let r = self.b.reg(RegTy::I32);
        self.b.push(Inst::Sreg(r, s));
        r
    }

    /// A copy of 32-bit register `r` in the index type (a new register, so that a loop may
    /// count in it without changing `r`).
    pub(super) fn index_of(&mut self, r: Reg) -> Reg {
        if self.it == RegTy::I64 {
            self.b.cvt(Cvt::U32ToU64, RegTy::I64, r)
        } else {
            let d = self.b.reg(RegTy::I32);
            self.b.push(Inst::Mov(d, r));
            d
        }
    }

    /// The index constant `n`.
    pub(super) fn n(&mut self, n: u64) -> Reg {
        self.b.imm(self.it, n)
    }

    /// `a op n` on indices.
    pub(super) fn op_n(&mut self, op: IOp, a: Reg, n: u64) -> Reg {
        let c = self.n(n);
        self.b.ibin(op, a, c)
    }

    /// `a * n + b` on indices.
    pub(super) fn mad_n(&mut self, a: Reg, n: u64, b: Reg) -> Reg {
        let nn = self.n(n);
        let s = self.b.reg(self.it);
        self.b.push(Inst::IMad(s, a, nn, b));
        s
    }

    /// For each `(v, n)` of indices, the predicate `v >= n` (unsigned: indices that wrapped
    /// below zero count as past the end).
    pub(super) fn outside(&mut self, bounds: &[(Reg, u64)]) -> Vec<Reg> {
        (bounds.iter())
            .map(|&(v, n)| {
                let n = self.n(n);
                self.b.setp(CmpTy::Unsigned, Cmp::Ge, v, n)
            })
            .collect()
    }

    /// The address of element `idx` of a `mem` buffer at `base`.
    pub(super) fn address(&mut self, base: Reg, idx: Reg, mem: Mem) -> Reg {
        let wide = if self.it == RegTy::I32 {
            self.b.cvt(Cvt::U32ToU64, RegTy::I64, idx)
        } else {
            idx
        };
        let off = match mem.bytes() {
            1 => wide,
            k => {
                let sh = self.b.imm(RegTy::I32, k.trailing_zeros() as u64);
                self.b.ibin(IOp::Shl, wide, sh)
            }
        };
        self.b.ibin(IOp::Add, base, off)
    }

    /// Kernel values `vals` (parameters `params`) read over the iteration space `dims` by a
    /// body computing in `lane`: scalars loaded or set here, once.
    pub(super) fn operands(
        &mut self,
        f: &Function,
        lane: Lane,
        vals: &[Value],
        params: &[usize],
        dims: &[u64],
    ) -> Result<Vec<Operand>, String> {
        let mut out = Vec::with_capacity(vals.len());
        for (&v, &j) in vals.iter().zip(params) {
            let access = match access(f.ty(v).dims(), dims) {
                Some(Access::Scalar(_)) if int_bits(f, v, lane) => Access::Scalar(None),
                Some(Access::Scalar(_)) => Access::Scalar(splat_number(f, v)),
                Some(a) => a,
                None => return Err(format!("operand %{} cannot be indexed", f.name(v))),
            };
            let (mem, ty) = load_kind(f.ty(v).dtype(), lane, int_bits(f, v, lane))?;
            let base = self.bases[j];
            let scalar = match access {
                Access::Scalar(Some(x)) => Some(self.b.imm(ty, num_bits(x, ty))),
                Access::Scalar(None) => Some(self.b.ld(Space::Global, mem, ty, base)),
                _ => None,
            };
            out.push(Operand {
                base,
                access,
                mem,
                ty,
                scalar,
            });
        }
        Ok(out)
    }

    /// Every operand's value at element `i` of the iteration space.
    pub(super) fn load(&mut self, ops: &[Operand], i: Reg) -> Vec<Reg> {
        ops.iter().map(|op| self.load_one(op, i)).collect()
    }

    /// Every operand's values at elements `i..i + 4` (`i` a multiple of 4), one register per
    /// element: 16 bytes at once where the operand is read at the same element and is 32-bit
    /// (its buffer 16-byte aligned, as the memory plan and the runtime place every buffer),
    /// one load for all four where they read one element, else four loads.
    pub(super) fn load4(&mut self, ops: &[Operand], i: Reg) -> Vec<[Reg; 4]> {
        let mut args = Vec::with_capacity(ops.len());
        for op in ops {
            let same_in_4 = match op.access {
                Access::Scalar(_) => true,
                Access::Block { inner, .. } => inner % 4 == 0,
                Access::Gapped {
                    inner, outer_inner, ..
                } => inner % 4 == 0 && outer_inner % 4 == 0,
                Access::Same => false,
            };
            args.push(if same_in_4 {
                [self.load_one(op, i); 4]
            } else if op.access == Access::Same && op.mem == Mem::B32 {
                let addr = self.address(op.base, i, Mem::B32);
                let d = [(); 4].map(|_| self.b.reg(op.ty));
                self.b.push(Inst::Ld4(Space::Global, d, addr));
                d
            } else {
                [0, 1, 2, 3].map(|e| {
                    let ie = if e == 0 { i } else { self.op_n(IOp::Add, i, e) };
                    self.load_one(op, ie)
                })
            });
        }
        args
    }

    /// Operand `op`'s value at element `i`.
    fn load_one(&mut self, op: &Operand, i: Reg) -> Reg {
        if let Some(s) = op.scalar {
            return s;
        }
        let idx = match op.access {
            Access::Same => i,
            Access::Block { inner, n } | Access::Gapped { inner, n, .. } => {
                let q = if inner == 1 {
                    i
                } else {
                    self.op_n(IOp::DivU, i, inner)
                };
                let mut idx = self.op_n(IOp::RemU, q, n);
                if let Access::Gapped {
                    outer_inner,
                    outer_n,
                    ..
                } = op.access
                {
                    let q = self.op_n(IOp::DivU, i, outer_inner);
                    let hi = self.op_n(IOp::RemU, q, outer_n);
                    idx = self.mad_n(hi, n, idx);
                }
                idx
            }
            Access::Scalar(_) => unreachable!("loaded before the loop"),
        };
        let addr = self.address(op.base, idx, op.mem);
        self.b.ld(Space::Global, op.mem, op.ty, addr)
    }

    /// Stores the results `outs` of `body` to the kernel's outputs `vals` (parameters from
    /// `first` on) at element `i`.
    pub(super) fn store(
        &mut self,
        f: &Function,
        body: &Body,
        outs: &[Reg],
        vals: &[Value],
        first: usize,
        i: Reg,
    ) -> Result<(), String> {
        for (o, (&r, &v)) in outs.iter().zip(vals).enumerate() {
            let d = f.ty(v).dtype();
            let (mem, val) = match (d, body.class(body.results[o])) {
                (DType::Bool, Class::Mask) => {
                    let one = self.b.imm(RegTy::I32, 1);
                    let zero = self.b.imm(RegTy::I32, 0);
                    (Mem::U8, self.b.selp(one, zero, r))
                }
                (DType::F32 | DType::I32, Class::Num) => (Mem::B32, r),
                (DType::F64, Class::Num) => (Mem::B64, r),
                (DType::I8 | DType::U8, Class::Num) => (Mem::U8, r),
                (d, c) => return Err(format!("no GPU store of a {c:?} as {d}")),
            };
            let addr = self.address(self.bases[first + o], i, mem);
            self.b.push(Inst::St(Space::Global, mem, addr, val));
        }
        Ok(())
    }

    /// Stores four elements' results (`outs[e]` for element `i + e`, `i` a multiple of 4)
    /// to the kernel's outputs `vals` (parameters from `first` on), 16 bytes at once; every
    /// output is a 32-bit number.
    pub(super) fn store4(&mut self, outs: &[Vec<Reg>; 4], n_out: usize, first: usize, i: Reg) {
        for o in 0..n_out {
            let addr = self.address(self.bases[first + o], i, Mem::B32);
            self.b.push(Inst::St4(
                Space::Global,
                addr,
                outs.each_ref().map(|r| r[o]),
            ));
        }
    }

    /// `for i = start; i < n; i += step { body(i) }` on register `i` (modified in place).
    pub(super) fn for_loop(
        &mut self,
        i: Reg,
        n: Reg,
        step: Reg,
        body: impl FnOnce(&mut Ctx) -> Result<(), String>,
    ) -> Result<(), String> {
        let (top, end) = (self.b.label(), self.b.label());
        self.b.place(top);
        let done = self.b.setp(CmpTy::Unsigned, Cmp::Ge, i, n);
        self.b.push(Inst::Bra(end, Some((done, true))));
        body(self)?;
        self.b.push(Inst::IBin(IOp::Add, i, i, step));
        self.b.push(Inst::Bra(top, None));
        self.b.place(end);
        Ok(())
    }

    /// The grid-stride loop over `n` elements: `body` for each element this thread takes.
    pub(super) fn grid_stride(
        &mut self,
        n: u64,
        body: impl FnOnce(&mut Ctx, Reg) -> Result<(), String>,
    ) -> Result<(), String> {
        self.grid_stride_from(0, n, body)
    }

    /// The grid-stride loop over elements `start..n`.
    pub(super) fn grid_stride_from(
        &mut self,
        start: u64,
        n: u64,
        body: impl FnOnce(&mut Ctx, Reg) -> Result<(), String>,
    ) -> Result<(), String> {
        let tid = self.sreg(Sreg::Tid);
        let ntid = self.sreg(Sreg::Ntid);
        let ctaid = self.sreg(Sreg::Ctaid);
        let nctaid = self.sreg(Sreg::Nctaid);
        let first = self.b.reg(RegTy::I32);
        self.b.push(Inst::IMad(first, ctaid, ntid, tid));
        let stride = self.b.ibin(IOp::Mul, nctaid, ntid);
        let (mut i, stride) = (self.index_of(first), self.index_of(stride));
        if start > 0 {
            i = self.op_n(IOp::Add, i, start);
        }
        let count = self.n(n);
        self.for_loop(i, count, stride, |c| body(c, i))
    }

    /// The f32 at index `idx` of `base` where none of `outside` holds, else 0 (the index
    /// replaced by 0 there, so the load never leaves the buffer).
    pub(super) fn load_where(&mut self, base: Reg, idx: Reg, outside: &[Reg]) -> Reg {
        let zero_i = self.n(0);
        let mut safe = idx;
        for &p in outside {
            safe = self.b.selp(zero_i, safe, p);
        }
        let addr = self.address(base, safe, Mem::B32);
        let mut v = self.b.ld(Space::Global, Mem::B32, RegTy::F32, addr);
        let zero = self.b.imm(RegTy::F32, 0);
        for &p in outside {
            v = self.b.selp(zero, v, p);
        }
        v
    }

    /// The block's threads and a shared slot per warp, for [`Ctx::combine`].
    pub(super) fn team(&mut self) -> Team {
        self.b.k.shared = self.b.k.shared.max(WARPS * 4);
        let tid = self.sreg(Sreg::Tid);
        let smem = self.b.reg(RegTy::I64);
        self.b.push(Inst::SharedBase(smem));
        Team { tid, smem }
    }

    /// Every thread's f32 `v` combined by `step` (two arguments, commutative and
    /// associative): within each warp by shuffles down (lane 0 gets the warp's total), then
    /// the warps' totals through shared memory, which every thread combines in the same order,
    /// so all get the same total. Ends with a barrier, so the slots can be used again. Every
    /// thread of the block must call it together.
    pub(super) fn combine(&mut self, team: &Team, v: Reg, step: &Body) -> Result<Reg, String> {
        let mut x = v;
        let mut delta = 16;
        while delta > 0 {
            let y = self.b.reg(RegTy::F32);
            self.b.push(Inst::ShflDown(y, x, delta));
            x = render(&mut self.b, step, &[x, y])?[0];
            delta /= 2;
        }
        let skip = self.b.label();
        let lanes = self.b.imm(RegTy::I32, 31);
        let lane = self.b.ibin(IOp::And, team.tid, lanes);
        let zero = self.b.imm(RegTy::I32, 0);
        let not_first = self.b.setp(CmpTy::Unsigned, Cmp::Ne, lane, zero);
        self.b.push(Inst::Bra(skip, Some((not_first, true))));
        let five = self.b.imm(RegTy::I32, 5);
        let warp = self.b.ibin(IOp::ShrU, team.tid, five);
        let w64 = self.b.cvt(Cvt::U32ToU64, RegTy::I64, warp);
        let two = self.b.imm(RegTy::I32, 2);
        let off = self.b.ibin(IOp::Shl, w64, two);
        let mine = self.b.ibin(IOp::Add, team.smem, off);
        self.b.push(Inst::St(Space::Shared, Mem::B32, mine, x));
        self.b.place(skip);
        self.b.push(Inst::Bar);
        let mut total = self.b.ld(Space::Shared, Mem::B32, RegTy::F32, team.smem);
        for w in 1..WARPS as u64 {
            let off = self.b.imm(RegTy::I64, 4 * w);
            let at = self.b.ibin(IOp::Add, team.smem, off);
            let y = self.b.ld(Space::Shared, Mem::B32, RegTy::F32, at);
            total = render(&mut self.b, step, &[total, y])?[0];
        }
        self.b.push(Inst::Bar);
        Ok(total)
    }

    pub(super) fn finish(mut self, grid: u64) -> Lowered {
        self.b.push(Inst::Ret);
        Lowered {
            kernel: self.b.finish(),
            grid: grid.clamp(1, MAX_BLOCKS) as u32,
            then: None,
        }
    }
}

/// Reductions whose reduced extent is below this run a thread per output; longer ones a
/// block per output.
pub(super) const THREAD_PER_OUTPUT_BELOW: u64 = 64;

/// The instructions of `body` over argument registers `args`; its result registers.
pub(super) fn render(b: &mut Builder, body: &Body, args: &[Reg]) -> Result<Vec<Reg>, String> {
    let num = lane_reg(body.lane);
    let int = num == RegTy::I32;
    let mut v: Vec<Reg> = Vec::with_capacity(body.nodes().len());
    for &(node, _) in body.nodes() {
        let at = |e: expr::E| v[Body::index(e)];
        let unsupported = || format!("no GPU form of {node:?} in a {:?} kernel", body.lane);
        let r = match node {
            Node::Arg(j) => args[j as usize],
            Node::MaskArg(j) => {
                let zero = b.imm(RegTy::I32, 0);
                b.setp(CmpTy::Unsigned, Cmp::Ne, args[j as usize], zero)
            }
            Node::Num(x) => b.imm(num, num_bits(x, num)),
            Node::Int(x) => b.imm(RegTy::I32, x as u32 as u64),
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
                let k = b.imm(RegTy::I32, k as u64);
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

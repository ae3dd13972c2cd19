//! Kernels of the plan in the GPU kernel form ([`super::prog`]).
//!
//! An elementwise kernel is a grid-stride loop: thread `t` of block `b` handles elements
//! `b * block + t`, then that plus the grid's size, and so on, each loading its operands as
//! their access patterns say ([`crate::kernel::Access`]), computing the kernel layer's body and
//! storing the results. A reduction is a thread or a block per output ([`reduction`]). Index
//! arithmetic is 32-bit where every index fits (elements below 2^31), else 64-bit.

use super::prog::{
    Builder, Cmp, CmpTy, Cvt, FOp, FUn, IOp, IUn, Inst, Kernel, Mem, Reg, RegTy, Space, Sreg,
};
use crate::kernel::expr::{self, Body, Class, Lane, Node};
use crate::kernel::lower::{body as body_of, lower_ops, small_body};
use crate::kernel::math::log;
use crate::kernel::{Access, ReduceShape, RowShape, access, int_bits, reduce_inputs, splat_number};
use crate::plan::KernelData;
use tcc_ir::{DType, Function, OpKind, ReduceOp, Value};

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

/// A block working on one row: its thread's index, its shared memory and its own slot there.
pub(super) struct Team {
    tid: Reg,
    smem: Reg,
    mine: Reg,
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
        let mut args = Vec::with_capacity(ops.len());
        for op in ops {
            if let Some(s) = op.scalar {
                args.push(s);
                continue;
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
                        let cn = self.n(n);
                        let sum = self.b.reg(self.it);
                        self.b.push(Inst::IMad(sum, hi, cn, idx));
                        idx = sum;
                    }
                    idx
                }
                Access::Scalar(_) => unreachable!("loaded before the loop"),
            };
            let addr = self.address(op.base, idx, op.mem);
            args.push(self.b.ld(Space::Global, op.mem, op.ty, addr));
        }
        args
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
        let tid = self.sreg(Sreg::Tid);
        let ntid = self.sreg(Sreg::Ntid);
        let ctaid = self.sreg(Sreg::Ctaid);
        let nctaid = self.sreg(Sreg::Nctaid);
        let first = self.b.reg(RegTy::I32);
        self.b.push(Inst::IMad(first, ctaid, ntid, tid));
        let stride = self.b.ibin(IOp::Mul, nctaid, ntid);
        let (i, stride) = (self.index_of(first), self.index_of(stride));
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

    /// The block's threads and a shared slot per thread, for [`Ctx::combine`].
    pub(super) fn team(&mut self) -> Team {
        self.b.k.shared = self.b.k.shared.max(BLOCK * 4);
        let tid = self.sreg(Sreg::Tid);
        let smem = self.b.reg(RegTy::I64);
        self.b.push(Inst::SharedBase(smem));
        let mut t = Team {
            tid,
            smem,
            mine: smem,
        };
        t.mine = self.slot(&t, tid);
        t
    }

    /// The shared slot of thread `t`.
    pub(super) fn slot(&mut self, team: &Team, t: Reg) -> Reg {
        let t = self.b.cvt(Cvt::U32ToU64, RegTy::I64, t);
        let two = self.b.imm(RegTy::I32, 2);
        let off = self.b.ibin(IOp::Shl, t, two);
        self.b.ibin(IOp::Add, team.smem, off)
    }

    /// Every thread's `v` combined by `step` (two arguments) in a tree over the shared slots,
    /// half the threads combining at each level between barriers; every thread gets the
    /// total. Ends with a barrier, so the slots can be used again.
    pub(super) fn combine(&mut self, team: &Team, v: Reg, step: &Body) -> Result<Reg, String> {
        self.b.push(Inst::St(Space::Shared, Mem::B32, team.mine, v));
        self.b.push(Inst::Bar);
        let mut half = BLOCK / 2;
        while half > 0 {
            let skip = self.b.label();
            let h = self.b.imm(RegTy::I32, half as u64);
            let out = self.b.setp(CmpTy::Unsigned, Cmp::Ge, team.tid, h);
            self.b.push(Inst::Bra(skip, Some((out, true))));
            let other = self.b.ibin(IOp::Add, team.tid, h);
            let theirs = self.slot(team, other);
            let x = self.b.ld(Space::Shared, Mem::B32, RegTy::F32, team.mine);
            let y = self.b.ld(Space::Shared, Mem::B32, RegTy::F32, theirs);
            let z = render(&mut self.b, step, &[x, y])?[0];
            self.b.push(Inst::St(Space::Shared, Mem::B32, team.mine, z));
            self.b.place(skip);
            self.b.push(Inst::Bar);
            half /= 2;
        }
        let total = self.b.ld(Space::Shared, Mem::B32, RegTy::F32, team.smem);
        self.b.push(Inst::Bar);
        Ok(total)
    }

    pub(super) fn finish(mut self, grid: u64) -> Lowered {
        self.b.push(Inst::Ret);
        Lowered {
            kernel: self.b.finish(),
            grid: grid.clamp(1, MAX_BLOCKS) as u32,
        }
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
    let body = body_of(lane, f, &kd.inputs, 0, &kd.ops, |_, _, _| {}, &kd.outputs);
    elementwise_body(f, kd, lane, &body, name)
}

/// A `pow` alone (f32, an exponent the kernel layer does not compute exactly, so the CPU runs
/// it on its reference kernels), as an elementwise loop over [`crate::kernel::math::pow`].
pub fn pow(f: &Function, kd: &KernelData, name: String) -> Result<Lowered, String> {
    let d = f.op(kd.ops[0]);
    let (x, y) = (d.args[0], d.args[1]);
    if (d.args.iter().chain(&d.results)).any(|&v| f.ty(v).dtype() != DType::F32) {
        return Err("only f32 pow has a GPU kernel".into());
    }
    let mut b = Body::new(Lane::F32);
    let args: Vec<expr::E> = kd.inputs.iter().map(|_| b.arg()).collect();
    let at = |v: Value| args[kd.inputs.iter().position(|&i| i == v).expect("an input")];
    let r = crate::kernel::math::pow(&mut b, at(x), at(y));
    b.results = vec![r];
    elementwise_body(f, kd, Lane::F32, &b, name)
}

/// Kernel `kd`'s loop over its output's elements computing `body` (arguments: the kernel's
/// inputs, results: its outputs).
fn elementwise_body(
    f: &Function,
    kd: &KernelData,
    lane: Lane,
    body: &Body,
    name: String,
) -> Result<Lowered, String> {
    let out_dims = f.ty(f.op(kd.ops[0]).results[0]).dims().to_vec();
    let n: u64 = out_dims.iter().product();
    let n_in = kd.inputs.len();
    let mut c = Ctx::new(name, (n_in + kd.outputs.len()) as u32, BLOCK, n);
    let params: Vec<usize> = (0..n_in).collect();
    let ops = c.operands(f, lane, &kd.inputs, &params, &out_dims)?;
    c.grid_stride(n, |c, i| {
        let args = c.load(&ops, i);
        let outs = render(&mut c.b, body, &args)?;
        c.store(f, body, &outs, &kd.outputs, n_in, i)
    })?;
    Ok(c.finish(n.div_ceil(BLOCK as u64)))
}

/// Reductions whose reduced extent is below this run a thread per output; longer ones a
/// block per output.
const THREAD_PER_OUTPUT_BELOW: u64 = 64;

/// Reduction kernel `kd` of `f` (shape `red`: the input as `[a, l, b]`, `l` reduced), in
/// `f32`, named `name`. Outputs `o = ai * b + bi` reduce elements `(ai * l + j) * b + bi`:
/// the prologue's value of each, combined from the reduction's identity by its step, then the
/// mean's scale and the epilogue. Short reductions: a thread per output, in order along `l`.
/// Long ones: a block per output (grid-stride over outputs), each thread combining every
/// `BLOCK`-th element, then a tree over the block's partials in shared memory, halving the
/// threads that combine at each level, a barrier between levels; thread 0 finishes.
pub fn reduction(
    f: &Function,
    kd: &KernelData,
    red: &ReduceShape,
    name: String,
) -> Result<Lowered, String> {
    let ReduceShape {
        root,
        op,
        a,
        l,
        b: bext,
    } = *red;
    let in_dims = f.ty(f.op(root).args[0]).dims().to_vec();
    let out_dims = f.ty(f.op(root).results[0]).dims().to_vec();
    let pos = (kd.ops.iter().position(|&o| o == root)).ok_or("the root is not a member")?;
    let (pro, epi) = (&kd.ops[..pos], &kd.ops[pos + 1..]);
    let (x_in, y_out) = (f.op(root).args[0], f.op(root).results[0]);
    let (pro_in, epi_in) = reduce_inputs(f, kd, pos);
    let param = |v: &Value| kd.inputs.iter().position(|x| x == v).expect("an input");
    let init = match op {
        ReduceOp::Max => f32::NEG_INFINITY,
        ReduceOp::Sum | ReduceOp::Mean => 0.0,
    };
    let input = body_of(Lane::F32, f, &pro_in, 0, pro, |_, _, _| {}, &[x_in]);
    let step = small_body(2, |b, x| match op {
        ReduceOp::Max => b.bin(expr::Bin::Max, x[0], x[1]),
        ReduceOp::Sum | ReduceOp::Mean => b.add(x[0], x[1]),
    });
    let output = body_of(
        Lane::F32,
        f,
        &epi_in,
        1,
        &[],
        |b, vals, acc| {
            let r = if op == ReduceOp::Mean {
                let inv = b.c((1.0 / l as f32) as f64);
                b.mul(acc[0], inv)
            } else {
                acc[0]
            };
            vals.insert(y_out, r);
            lower_ops(b, f, epi, vals);
        },
        &kd.outputs,
    );
    let outputs = a * bext;
    let n_in = kd.inputs.len();
    let per_thread = l < THREAD_PER_OUTPUT_BELOW;
    let mut c = Ctx::new(
        name,
        (n_in + kd.outputs.len()) as u32,
        BLOCK,
        in_dims.iter().product::<u64>().max(outputs),
    );
    let pro_params: Vec<usize> = pro_in.iter().map(param).collect();
    let epi_params: Vec<usize> = epi_in.iter().map(param).collect();
    let pro_ops = c.operands(f, Lane::F32, &pro_in, &pro_params, &in_dims)?;
    let epi_ops = c.operands(f, Lane::F32, &epi_in, &epi_params, &out_dims)?;
    let identity = c.b.imm(RegTy::F32, init.to_bits() as u64);
    // The first element of output `o`'s row: (o / b) * l * b + o % b.
    let row_start = |c: &mut Ctx, o: Reg| {
        if bext == 1 {
            return c.op_n(IOp::Mul, o, l);
        }
        let ai = c.op_n(IOp::DivU, o, bext);
        let bi = c.op_n(IOp::RemU, o, bext);
        let lb = c.n(l * bext);
        let s = c.b.reg(c.it);
        c.b.push(Inst::IMad(s, ai, lb, bi));
        s
    };
    // acc = step(acc, value at element `start + j * b`) for j = `j`, `j + jstep`, ... below l.
    let fold = |c: &mut Ctx, acc: Reg, start: Reg, j: Reg, jstep: Reg| -> Result<(), String> {
        let ln = c.n(l);
        c.for_loop(j, ln, jstep, |c| {
            let e = if bext == 1 {
                c.b.ibin(IOp::Add, start, j)
            } else {
                let s = c.b.reg(c.it);
                let bn = c.n(bext);
                c.b.push(Inst::IMad(s, j, bn, start));
                s
            };
            let args = c.load(&pro_ops, e);
            let x = render(&mut c.b, &input, &args)?[0];
            let n = render(&mut c.b, &step, &[acc, x])?[0];
            c.b.push(Inst::Mov(acc, n));
            Ok(())
        })
    };
    let finish = |c: &mut Ctx, o: Reg, acc: Reg| -> Result<(), String> {
        let mut args = c.load(&epi_ops, o);
        args.push(acc);
        let outs = render(&mut c.b, &output, &args)?;
        c.store(f, &output, &outs, &kd.outputs, n_in, o)
    };
    if per_thread {
        c.grid_stride(outputs, |c, o| {
            let acc = c.b.reg(RegTy::F32);
            c.b.push(Inst::Mov(acc, identity));
            let start = row_start(c, o);
            let j = c.b.reg(c.it);
            let (zero, one) = (c.n(0), c.n(1));
            c.b.push(Inst::Mov(j, zero));
            fold(c, acc, start, j, one)?;
            finish(c, o, acc)
        })?;
        return Ok(c.finish(outputs.div_ceil(BLOCK as u64)));
    }
    // A block per output.
    let team = c.team();
    let ctaid = c.sreg(Sreg::Ctaid);
    let nctaid = c.sreg(Sreg::Nctaid);
    let ntid = c.sreg(Sreg::Ntid);
    let (o, ostep) = (c.index_of(ctaid), c.index_of(nctaid));
    let (tid_i, ntid_i) = (c.index_of(team.tid), c.index_of(ntid));
    let count = c.n(outputs);
    c.for_loop(o, count, ostep, |c| {
        let acc = c.b.reg(RegTy::F32);
        c.b.push(Inst::Mov(acc, identity));
        let start = row_start(c, o);
        let j = c.b.reg(c.it);
        c.b.push(Inst::Mov(j, tid_i));
        fold(c, acc, start, j, ntid_i)?;
        let total = c.combine(&team, acc, &step)?;
        let skip = c.b.label();
        let zero = c.b.imm(RegTy::I32, 0);
        let not_first = c.b.setp(CmpTy::Unsigned, Cmp::Ne, team.tid, zero);
        c.b.push(Inst::Bra(skip, Some((not_first, true))));
        finish(c, o, total)?;
        c.b.place(skip);
        Ok(())
    })?;
    Ok(c.finish(outputs))
}

/// A row's maximum and its sum of `e^(x - max)` by the softmax steps, over the row's elements
/// `x = value(c, j)` for `j = j0, j0 + step, ...` below `len` (a thread's share; with `team`,
/// the block's shares combined in shared memory, every thread getting the totals).
fn max_and_sum(
    c: &mut Ctx,
    len: u64,
    (j0, step): (Reg, Reg),
    value: &dyn Fn(&mut Ctx, Reg) -> Result<Reg, String>,
    team: Option<&Team>,
) -> Result<(Reg, Reg), String> {
    let [max_step, sum_step, add] = crate::kernel::softmax_steps();
    let fold = |c: &mut Ctx, acc: Reg, body: &Body, extra: &[Reg]| -> Result<(), String> {
        let j = c.b.reg(c.it);
        c.b.push(Inst::Mov(j, j0));
        let ln = c.n(len);
        c.for_loop(j, ln, step, |c| {
            let x = value(c, j)?;
            let mut a = vec![acc, x];
            a.extend_from_slice(extra);
            let n = render(&mut c.b, body, &a)?[0];
            c.b.push(Inst::Mov(acc, n));
            Ok(())
        })
    };
    let mx = c.b.reg(RegTy::F32);
    let neg_inf = c.b.imm(RegTy::F32, f32::NEG_INFINITY.to_bits() as u64);
    c.b.push(Inst::Mov(mx, neg_inf));
    fold(c, mx, &max_step, &[])?;
    let mx = match team {
        Some(t) => c.combine(t, mx, &max_step)?,
        None => mx,
    };
    let sum = c.b.reg(RegTy::F32);
    let zero = c.b.imm(RegTy::F32, 0);
    c.b.push(Inst::Mov(sum, zero));
    fold(c, sum, &sum_step, &[mx])?;
    let sum = match team {
        Some(t) => c.combine(t, sum, &add)?,
        None => sum,
    };
    Ok((mx, sum))
}

/// Softmax (or log-softmax) row kernel `kd` of `f` (shape `row`: the last axis, `len` long,
/// with the prologue and epilogue the plan fused), in `f32`, named `name`, in the CPU's three
/// passes over each row: its maximum, the sum of `exp(x - max)`, then each element normalised
/// (`exp(x - max) / sum`, or `x - max - log(sum)`) and the epilogue. Rows shorter than 64: a
/// thread per row. Longer ones: a block per row, each thread taking every 256th element, the
/// threads' maxima and sums combined in shared memory ([`Ctx::combine`]).
pub fn row(f: &Function, kd: &KernelData, row: &RowShape, name: String) -> Result<Lowered, String> {
    let RowShape { root, len } = *row;
    let dims = f.ty(f.op(root).args[0]).dims().to_vec();
    let rows = dims.iter().product::<u64>() / len;
    let crate::kernel::RowBodies {
        input,
        row_consts,
        output,
        ..
    } = crate::kernel::row_bodies(f, kd, row);
    let n_in = kd.inputs.len();
    let mut c = Ctx::new(
        name,
        (n_in + kd.outputs.len()) as u32,
        BLOCK,
        dims.iter().product(),
    );
    let params: Vec<usize> = (0..n_in).collect();
    let ops = c.operands(f, Lane::F32, &kd.inputs, &params, &dims)?;
    // The three passes over the row starting at `start`, `j` running over `js`.
    let passes = |c: &mut Ctx, start: Reg, js: (Reg, Reg), team: Option<&Team>| {
        let value = |c: &mut Ctx, j: Reg| -> Result<Reg, String> {
            let e = c.b.ibin(IOp::Add, start, j);
            let args = c.load(&ops, e);
            Ok(render(&mut c.b, &input, &args)?[0])
        };
        let (mx, sum) = max_and_sum(c, len, js, &value, team)?;
        let k = render(&mut c.b, &row_consts, &[mx, sum])?;
        // Each element normalised, the epilogue, the stores.
        let j = c.b.reg(c.it);
        c.b.push(Inst::Mov(j, js.0));
        let ln = c.n(len);
        c.for_loop(j, ln, js.1, |c| {
            let e = c.b.ibin(IOp::Add, start, j);
            let mut args = c.load(&ops, e);
            args.extend([mx, k[0], k[1]]);
            let outs = render(&mut c.b, &output, &args)?;
            c.store(f, &output, &outs, &kd.outputs, n_in, e)
        })
    };
    if len < THREAD_PER_OUTPUT_BELOW {
        c.grid_stride(rows, |c, r| {
            let start = c.op_n(IOp::Mul, r, len);
            let whole = (c.n(0), c.n(1));
            passes(c, start, whole, None)
        })?;
        return Ok(c.finish(rows.div_ceil(BLOCK as u64)));
    }
    let team = c.team();
    let ctaid = c.sreg(Sreg::Ctaid);
    let nctaid = c.sreg(Sreg::Nctaid);
    let ntid = c.sreg(Sreg::Ntid);
    let (r, rstep) = (c.index_of(ctaid), c.index_of(nctaid));
    let strided = (c.index_of(team.tid), c.index_of(ntid));
    let count = c.n(rows);
    c.for_loop(r, count, rstep, |c| {
        let start = c.op_n(IOp::Mul, r, len);
        passes(c, start, strided, Some(&team))
    })?;
    Ok(c.finish(rows))
}

/// Softmax cross-entropy kernel `kd` of `f` (`softmax_cross_entropy(logits [N, C], labels [N]
/// of i32 or i64)` with any prologue computing the logits and epilogue on the loss the plan fused),
/// in `f32`, named `name`: one block, each thread taking every 256th row (its maximum, the sum
/// of `exp(x - max)` and `max + log(sum) - x[label]`, with the row kernel's bodies), the
/// threads' sums combined in shared memory, thread 0 dividing by `N` and running the
/// epilogue. A label outside `0..C` makes the loss NaN (the interpreter and the CPU runtime
/// report it as an error; a kernel has no way to).
pub fn cross_entropy(f: &Function, kd: &KernelData, name: String) -> Result<Lowered, String> {
    let pos = (kd.ops.iter())
        .position(|&o| matches!(f.op(o).kind, OpKind::SoftmaxCrossEntropy))
        .ok_or("no softmax_cross_entropy in the kernel")?;
    let root = kd.ops[pos];
    let (pro, epi) = (&kd.ops[..pos], &kd.ops[pos + 1..]);
    let d = f.op(root);
    let (x_in, labels, y_out) = (d.args[0], d.args[1], d.results[0]);
    let wide_labels = match f.ty(labels).dtype() {
        DType::I32 => false,
        DType::I64 => true,
        d => return Err(format!("labels of {d} have no GPU kernel")),
    };
    let xd = f.ty(x_in).dims().to_vec();
    let (rows, classes) = (xd[0], xd[1]);
    let (pro_in, epi_in) = reduce_inputs(f, kd, pos);
    let pro_in: Vec<Value> = pro_in.into_iter().filter(|&v| v != labels).collect();
    let param = |v: &Value| kd.inputs.iter().position(|x| x == v).expect("an input");
    let input = body_of(Lane::F32, f, &pro_in, 0, pro, |_, _, _| {}, &[x_in]);
    let [_, _, add] = crate::kernel::softmax_steps();
    let lse = small_body(2, |b, a| {
        let l = log(b, a[1]);
        b.add(a[0], l)
    });
    let output = body_of(
        Lane::F32,
        f,
        &epi_in,
        1,
        &[],
        |b, vals, loss| {
            vals.insert(y_out, loss[0]);
            lower_ops(b, f, epi, vals);
        },
        &kd.outputs,
    );
    let n_in = kd.inputs.len();
    let mut c = Ctx::new(
        name,
        (n_in + kd.outputs.len()) as u32,
        BLOCK,
        rows * classes,
    );
    let pro_params: Vec<usize> = pro_in.iter().map(param).collect();
    let epi_params: Vec<usize> = epi_in.iter().map(param).collect();
    let pro_ops = c.operands(f, Lane::F32, &pro_in, &pro_params, &xd)?;
    let epi_ops = c.operands(f, Lane::F32, &epi_in, &epi_params, &[])?;
    let label_base = c.bases[param(&labels)];
    let team = c.team();
    let ntid = c.sreg(Sreg::Ntid);
    let (r, rstep) = (c.index_of(team.tid), c.index_of(ntid));
    let f32c = |c: &mut Ctx, x: f32| c.b.imm(RegTy::F32, x.to_bits() as u64);
    let acc = c.b.reg(RegTy::F32);
    let zero_f = f32c(&mut c, 0.0);
    c.b.push(Inst::Mov(acc, zero_f));
    let value_at = |c: &mut Ctx, e: Reg| -> Result<Reg, String> {
        let args = c.load(&pro_ops, e);
        Ok(render(&mut c.b, &input, &args)?[0])
    };
    let count = c.n(rows);
    c.for_loop(r, count, rstep, |c| {
        let start = c.op_n(IOp::Mul, r, classes);
        let value = |c: &mut Ctx, j: Reg| -> Result<Reg, String> {
            let e = c.b.ibin(IOp::Add, start, j);
            value_at(c, e)
        };
        let whole = (c.n(0), c.n(1));
        let (mx, sum) = max_and_sum(c, classes, whole, &value, None)?;
        let l = render(&mut c.b, &lse, &[mx, sum])?[0];
        let (label, bad) = label_at(c, label_base, wide_labels, r, classes);
        let zero = c.n(0);
        let safe = c.b.selp(zero, label, bad);
        let e = c.b.ibin(IOp::Add, start, safe);
        let xl = value_at(c, e)?;
        let loss = c.b.fbin(FOp::Sub, l, xl);
        let nan = f32c(c, f32::NAN);
        let loss = c.b.selp(nan, loss, bad);
        let next = c.b.fbin(FOp::Add, acc, loss);
        c.b.push(Inst::Mov(acc, next));
        Ok(())
    })?;
    let total = c.combine(&team, acc, &add)?;
    let skip = c.b.label();
    let zero = c.b.imm(RegTy::I32, 0);
    let not_first = c.b.setp(CmpTy::Unsigned, Cmp::Ne, team.tid, zero);
    c.b.push(Inst::Bra(skip, Some((not_first, true))));
    let nr = f32c(&mut c, rows as f32);
    let mean = c.b.fbin(FOp::Div, total, nr);
    let o = c.n(0);
    let mut args = c.load(&epi_ops, o);
    args.push(mean);
    let outs = render(&mut c.b, &output, &args)?;
    c.store(f, &output, &outs, &kd.outputs, n_in, o)?;
    c.b.place(skip);
    Ok(c.finish(1))
}

/// Training batch norm kernel `kd` of `f` (`batch_norm_train(x, gamma, beta) -> (y, mean,
/// var)`, f32, channels on axis 1), named `name`: a block per channel (grid-stride), the
/// channel's mean and then its biased variance combined from the threads' partial sums in
/// shared memory, then every element of the channel normalised; thread 0 stores the mean and
/// variance where the kernel stores them.
pub fn batch_norm_train(f: &Function, kd: &KernelData, name: String) -> Result<Lowered, String> {
    let op = kd.ops[0];
    let d = f.op(op);
    let OpKind::BatchNormTrain { eps } = d.kind else {
        return Err("not a batch_norm_train".into());
    };
    if (d.args.iter().chain(&d.results)).any(|&v| f.ty(v).dtype() != DType::F32) {
        return Err("only f32 batch norm has a GPU kernel".into());
    }
    let xd = f.ty(d.args[0]).dims().to_vec();
    let (n, ch) = (xd[0], xd[1]);
    let inner: u64 = xd[2..].iter().product();
    let count = n * inner;
    let n_in = kd.inputs.len();
    let param = |v: &Value| kd.inputs.iter().position(|x| x == v).expect("an input");
    let out_param = |v: &Value| kd.outputs.iter().position(|x| x == v).map(|i| n_in + i);
    let mut c = Ctx::new(
        name,
        (n_in + kd.outputs.len()) as u32,
        BLOCK,
        xd.iter().product::<u64>().max(ch),
    );
    let (x, g, b) = (
        c.bases[param(&d.args[0])],
        c.bases[param(&d.args[1])],
        c.bases[param(&d.args[2])],
    );
    let outs: Vec<Option<Reg>> = (d.results.iter())
        .map(|r| out_param(r).map(|j| c.bases[j]))
        .collect();
    let add = small_body(2, |b, a| b.add(a[0], a[1]));
    let team = c.team();
    let ctaid = c.sreg(Sreg::Ctaid);
    let nctaid = c.sreg(Sreg::Nctaid);
    let ntid = c.sreg(Sreg::Ntid);
    let (k, kstep) = (c.index_of(ctaid), c.index_of(nctaid));
    let (tid_i, ntid_i) = (c.index_of(team.tid), c.index_of(ntid));
    let zero_f = c.b.imm(RegTy::F32, 0);
    let count_f = c.b.imm(RegTy::F32, (count as f32).to_bits() as u64);
    let channels = c.n(ch);
    // Element `j` (0..count) of channel `k`: ((j / inner) * C + k) * inner + j % inner.
    let element = |c: &mut Ctx, k: Reg, j: Reg| {
        let img = c.op_n(IOp::DivU, j, inner);
        let i = c.op_n(IOp::RemU, j, inner);
        let cn = c.n(ch);
        let plane = c.b.reg(c.it);
        c.b.push(Inst::IMad(plane, img, cn, k));
        let inn = c.n(inner);
        let e = c.b.reg(c.it);
        c.b.push(Inst::IMad(e, plane, inn, i));
        e
    };
    // For j = tid, tid + ntid, ... below count: `each(c, element index)`.
    let over = |c: &mut Ctx, k: Reg, each: &mut dyn FnMut(&mut Ctx, Reg) -> Result<(), String>| {
        let j = c.b.reg(c.it);
        c.b.push(Inst::Mov(j, tid_i));
        let cn = c.n(count);
        c.for_loop(j, cn, ntid_i, |c| {
            let e = element(c, k, j);
            each(c, e)
        })
    };
    let load = |c: &mut Ctx, base: Reg, e: Reg| {
        let a = c.address(base, e, Mem::B32);
        c.b.ld(Space::Global, Mem::B32, RegTy::F32, a)
    };
    c.for_loop(k, channels, kstep, |c| {
        let s = c.b.reg(RegTy::F32);
        c.b.push(Inst::Mov(s, zero_f));
        over(c, k, &mut |c, e| {
            let v = load(c, x, e);
            let n = c.b.fbin(FOp::Add, s, v);
            c.b.push(Inst::Mov(s, n));
            Ok(())
        })?;
        let total = c.combine(&team, s, &add)?;
        let mean = c.b.fbin(FOp::Div, total, count_f);
        let q = c.b.reg(RegTy::F32);
        c.b.push(Inst::Mov(q, zero_f));
        over(c, k, &mut |c, e| {
            let v = load(c, x, e);
            let dv = c.b.fbin(FOp::Sub, v, mean);
            let n = c.b.reg(RegTy::F32);
            c.b.push(Inst::Fma(n, dv, dv, q));
            c.b.push(Inst::Mov(q, n));
            Ok(())
        })?;
        let sq = c.combine(&team, q, &add)?;
        let var = c.b.fbin(FOp::Div, sq, count_f);
        let e = c.b.imm(RegTy::F32, (eps.0 as f32).to_bits() as u64);
        let ve = c.b.fbin(FOp::Add, var, e);
        let sd = c.b.fun(FUn::Sqrt, ve);
        let gk = load(c, g, k);
        let bk = load(c, b, k);
        if let Some(y) = outs[0] {
            over(c, k, &mut |c, e| {
                let v = load(c, x, e);
                let dv = c.b.fbin(FOp::Sub, v, mean);
                let nv = c.b.fbin(FOp::Div, dv, sd);
                let r = c.b.reg(RegTy::F32);
                c.b.push(Inst::Fma(r, nv, gk, bk));
                let a = c.address(y, e, Mem::B32);
                c.b.push(Inst::St(Space::Global, Mem::B32, a, r));
                Ok(())
            })?;
        }
        let skip = c.b.label();
        let zero = c.b.imm(RegTy::I32, 0);
        let not_first = c.b.setp(CmpTy::Unsigned, Cmp::Ne, team.tid, zero);
        c.b.push(Inst::Bra(skip, Some((not_first, true))));
        for (out, v) in [(outs[1], mean), (outs[2], var)] {
            if let Some(base) = out {
                let a = c.address(base, k, Mem::B32);
                c.b.push(Inst::St(Space::Global, Mem::B32, a, v));
            }
        }
        c.b.place(skip);
        Ok(())
    })?;
    Ok(c.finish(ch))
}

/// A softmax (or log-softmax) alone over an axis that is not the last (f32), named `name`: a
/// thread per row, the row's elements `inner` apart (the input as `[outer, len, inner]`), in
/// the row kernel's three passes with its bodies.
pub fn row_strided(f: &Function, kd: &KernelData, name: String) -> Result<Lowered, String> {
    let op = kd.ops[0];
    let d = f.op(op);
    let (OpKind::Softmax { axis } | OpKind::LogSoftmax { axis }) = d.kind else {
        return Err("not a softmax".into());
    };
    if f.ty(d.args[0]).dtype() != DType::F32 || kd.inputs != [d.args[0]] {
        return Err("only an f32 softmax alone has a strided GPU kernel".into());
    }
    let dims = f.ty(d.args[0]).dims().to_vec();
    let a = tcc_ir::ops::normalize_axis(axis, dims.len()).ok_or("a bad axis")?;
    let len = dims[a];
    let inner: u64 = dims[a + 1..].iter().product();
    let rows = dims.iter().product::<u64>() / len.max(1);
    let crate::kernel::RowBodies {
        input,
        row_consts,
        output,
        ..
    } = crate::kernel::row_bodies(f, kd, &RowShape { root: op, len });
    let n_in = kd.inputs.len();
    let mut c = Ctx::new(
        name,
        (n_in + kd.outputs.len()) as u32,
        BLOCK,
        dims.iter().product(),
    );
    let ops = c.operands(f, Lane::F32, &kd.inputs, &[0], &dims)?;
    c.grid_stride(rows, |c, r| {
        // Row r = (o, i): its first element (o * len) * inner + i, then every inner-th.
        let o = c.op_n(IOp::DivU, r, inner);
        let i = c.op_n(IOp::RemU, r, inner);
        let start = {
            let s = c.b.reg(c.it);
            let ln = c.n(len * inner);
            c.b.push(Inst::IMad(s, o, ln, i));
            s
        };
        let (zero, one, ln) = (c.n(0), c.n(1), c.n(len));
        let at = |c: &mut Ctx, j: Reg| {
            let inn = c.n(inner);
            let e = c.b.reg(c.it);
            c.b.push(Inst::IMad(e, j, inn, start));
            e
        };
        let value = |c: &mut Ctx, j: Reg| -> Result<Reg, String> {
            let e = at(c, j);
            let args = c.load(&ops, e);
            Ok(render(&mut c.b, &input, &args)?[0])
        };
        let (mx, sum) = max_and_sum(c, len, (zero, one), &value, None)?;
        let k = render(&mut c.b, &row_consts, &[mx, sum])?;
        let j = c.b.reg(c.it);
        c.b.push(Inst::Mov(j, zero));
        c.for_loop(j, ln, one, |c| {
            let e = at(c, j);
            let mut args = c.load(&ops, e);
            args.extend([mx, k[0], k[1]]);
            let outs = render(&mut c.b, &output, &args)?;
            c.store(f, &output, &outs, &kd.outputs, n_in, e)
        })
    })?;
    Ok(c.finish(rows.div_ceil(BLOCK as u64)))
}

/// `top_k` (f32 values; `i64` indices), named `name`: a thread per line along the axis
/// (grid-stride over the `[outer, inner]` lines), which finds the `k` elements in order in `k`
/// scans, each taking the first element (by index, among ties) that comes after the one
/// before in the op's order: by value, larger first (or smaller), NaN above every number,
/// ties by index.
pub fn top_k(f: &Function, kd: &KernelData, name: String) -> Result<Lowered, String> {
    let d = f.op(kd.ops[0]);
    let OpKind::TopK { k, axis, largest } = d.kind else {
        return Err("not a top_k".into());
    };
    let x = d.args[0];
    if f.ty(x).dtype() != DType::F32 {
        return Err("only f32 top_k has a GPU kernel".into());
    }
    let dims = f.ty(x).dims().to_vec();
    let a = tcc_ir::ops::normalize_axis(axis, dims.len()).ok_or("a bad axis")?;
    let len = dims[a];
    let inner: u64 = dims[a + 1..].iter().product();
    let outer: u64 = dims[..a].iter().product();
    let n_in = kd.inputs.len();
    let out = |v: Value| kd.outputs.iter().position(|&o| o == v).map(|i| n_in + i);
    let (vals_at, idx_at) = (out(d.results[0]), out(d.results[1]));
    let mut c = Ctx::new(
        name,
        (n_in + kd.outputs.len()) as u32,
        BLOCK,
        dims.iter().product::<u64>().max(outer * k * inner),
    );
    let xb = c.bases[kd.inputs.iter().position(|&v| v == x).expect("an input")];
    let (vb, ib) = (vals_at.map(|j| c.bases[j]), idx_at.map(|j| c.bases[j]));
    let (i0, i1) = (c.b.imm(RegTy::I32, 0), c.b.imm(RegTy::I32, 1));
    // Flags as 0 or 1 in 32-bit registers, to combine predicates.
    let flag = |c: &mut Ctx, p: Reg| c.b.selp(i1, i0, p);
    let truth = |c: &mut Ctx, f: Reg| c.b.setp(CmpTy::Unsigned, Cmp::Ne, f, i0);
    // Whether `u` comes strictly before `v` by value.
    let before = |c: &mut Ctx, u: Reg, v: Reg| -> Reg {
        let order = if largest { Cmp::Gt } else { Cmp::Lt };
        let plain = c.b.setp(CmpTy::Float, order, u, v);
        let u_nan = c.b.setp(CmpTy::Float, Cmp::Nan, u, u);
        let v_nan = c.b.setp(CmpTy::Float, Cmp::Nan, v, v);
        let (fu, fv, fp) = (flag(c, u_nan), flag(c, v_nan), flag(c, plain));
        // Largest: u NaN and v not; smallest: v NaN and u not.
        let (nan_side, num_side) = if largest { (fu, fv) } else { (fv, fu) };
        let not_other = c.b.ibin(IOp::Sub, i1, num_side);
        let by_nan = c.b.ibin(IOp::And, nan_side, not_other);
        let r = c.b.ibin(IOp::Or, by_nan, fp);
        truth(c, r)
    };
    let tie = |c: &mut Ctx, u: Reg, v: Reg| -> Reg {
        let eq = c.b.setp(CmpTy::Float, Cmp::Eq, u, v);
        let u_nan = c.b.setp(CmpTy::Float, Cmp::Nan, u, u);
        let v_nan = c.b.setp(CmpTy::Float, Cmp::Nan, v, v);
        let (fe, fu, fv) = (flag(c, eq), flag(c, u_nan), flag(c, v_nan));
        let both = c.b.ibin(IOp::And, fu, fv);
        let r = c.b.ibin(IOp::Or, fe, both);
        truth(c, r)
    };
    c.grid_stride(outer * inner, |c, line| {
        let o = c.op_n(IOp::DivU, line, inner);
        let i = c.op_n(IOp::RemU, line, inner);
        let (zero, one) = (c.n(0), c.n(1));
        let (kn, ln) = (c.n(k), c.n(len));
        let (prev_v, prev_j) = (c.b.reg(RegTy::F32), c.b.reg(c.it));
        let r = c.b.reg(c.it);
        c.b.push(Inst::Mov(r, zero));
        c.for_loop(r, kn, one, |c| {
            let (cur_v, cur_j) = (c.b.reg(RegTy::F32), c.b.reg(c.it));
            let none = c.n(u32::MAX as u64);
            c.b.push(Inst::Mov(cur_j, none));
            c.b.push(Inst::Mov(cur_v, prev_v));
            let j = c.b.reg(c.it);
            c.b.push(Inst::Mov(j, zero));
            c.for_loop(j, ln, one, |c| {
                let e = {
                    let ol = c.op_n(IOp::Mul, o, len);
                    let row = c.b.ibin(IOp::Add, ol, j);
                    let inn = c.n(inner);
                    let s = c.b.reg(c.it);
                    c.b.push(Inst::IMad(s, row, inn, i));
                    s
                };
                let addr = c.address(xb, e, Mem::B32);
                let v = c.b.ld(Space::Global, Mem::B32, RegTy::F32, addr);
                // A candidate: the first scan takes any element; later ones those after the
                // previous pick.
                let first_scan = c.b.setp(CmpTy::Unsigned, Cmp::Eq, r, zero);
                let after_v = before(c, prev_v, v);
                let same = tie(c, prev_v, v);
                let later = c.b.setp(CmpTy::Unsigned, Cmp::Gt, j, prev_j);
                let (fa, fs, fl, ff) = (
                    flag(c, after_v),
                    flag(c, same),
                    flag(c, later),
                    flag(c, first_scan),
                );
                let tie_after = c.b.ibin(IOp::And, fs, fl);
                let cand = c.b.ibin(IOp::Or, fa, tie_after);
                let cand = c.b.ibin(IOp::Or, cand, ff);
                // Better than the current pick (none yet, or strictly before it by value).
                let unset = c.b.setp(CmpTy::Unsigned, Cmp::Eq, cur_j, none);
                let ahead = before(c, v, cur_v);
                let (fu, fh) = (flag(c, unset), flag(c, ahead));
                let better = c.b.ibin(IOp::Or, fu, fh);
                let take = c.b.ibin(IOp::And, cand, better);
                let take = truth(c, take);
                let nv = c.b.selp(v, cur_v, take);
                c.b.push(Inst::Mov(cur_v, nv));
                let nj = c.b.selp(j, cur_j, take);
                c.b.push(Inst::Mov(cur_j, nj));
                Ok(())
            })?;
            // Output (o, r, i).
            let e = {
                let ok = c.op_n(IOp::Mul, o, k);
                let row = c.b.ibin(IOp::Add, ok, r);
                let inn = c.n(inner);
                let s = c.b.reg(c.it);
                c.b.push(Inst::IMad(s, row, inn, i));
                s
            };
            if let Some(vb) = vb {
                let a = c.address(vb, e, Mem::B32);
                c.b.push(Inst::St(Space::Global, Mem::B32, a, cur_v));
            }
            if let Some(ib) = ib {
                let wide = if c.it == RegTy::I32 {
                    c.b.cvt(Cvt::U32ToU64, RegTy::I64, cur_j)
                } else {
                    cur_j
                };
                let a = c.address(ib, e, Mem::B64);
                c.b.push(Inst::St(Space::Global, Mem::B64, a, wide));
            }
            c.b.push(Inst::Mov(prev_v, cur_v));
            c.b.push(Inst::Mov(prev_j, cur_j));
            Ok(())
        })
    })?;
    Ok(c.finish((outer * inner).div_ceil(BLOCK as u64)))
}

/// Label `r` of the `i32` (or, `wide`, `i64`) labels at `base`, as an index, and a predicate
/// set where it is outside `0..classes` (an `i64` label is read as its low word, valid only if
/// its high word is 0).
fn label_at(c: &mut Ctx, base: Reg, wide: bool, r: Reg, classes: u64) -> (Reg, Reg) {
    let mem = if wide { Mem::B64 } else { Mem::B32 };
    let la = c.address(base, r, mem);
    let low = c.b.ld(Space::Global, Mem::B32, RegTy::I32, la);
    let label = c.index_of(low);
    let cn = c.n(classes);
    let mut bad = c.b.setp(CmpTy::Unsigned, Cmp::Ge, label, cn);
    if wide {
        let four = c.b.imm(RegTy::I64, 4);
        let ha = c.b.ibin(IOp::Add, la, four);
        let high = c.b.ld(Space::Global, Mem::B32, RegTy::I32, ha);
        let zero = c.b.imm(RegTy::I32, 0);
        let neg = c.b.setp(CmpTy::Unsigned, Cmp::Ne, high, zero);
        // bad or neg, as a select of predicates' values.
        let one = c.b.imm(RegTy::I32, 1);
        let b1 = c.b.selp(one, zero, bad);
        let b2 = c.b.selp(one, b1, neg);
        bad = c.b.setp(CmpTy::Unsigned, Cmp::Ne, b2, zero);
    }
    (label, bad)
}

/// `softmax_cross_entropy_grad(logits [N, C], labels [N], dy [])` (f32 logits; i32 or i64
/// labels), named `name`: a thread per row (grid-stride), its maximum and sum of
/// `e^(x - max)` as the softmax kernels compute them, then each element `(softmax - onehot) *
/// dy / N`; a row whose label is out of range is NaN (the CPU reports an error).
pub fn cross_entropy_grad(f: &Function, kd: &KernelData, name: String) -> Result<Lowered, String> {
    let d = f.op(kd.ops[0]);
    let (x, labels, dy) = (d.args[0], d.args[1], d.args[2]);
    let wide = match f.ty(labels).dtype() {
        DType::I32 => false,
        DType::I64 => true,
        t => return Err(format!("labels of {t} have no GPU kernel")),
    };
    if [x, dy, d.results[0]]
        .iter()
        .any(|&v| f.ty(v).dtype() != DType::F32)
    {
        return Err("only f32 cross-entropy gradients have a GPU kernel".into());
    }
    let xd = f.ty(x).dims();
    let (rows, classes) = (xd[0], xd[1]);
    let param = |v: &Value| kd.inputs.iter().position(|q| q == v).expect("an input");
    let n_in = kd.inputs.len();
    let out = kd
        .outputs
        .iter()
        .position(|&v| v == d.results[0])
        .ok_or("the gradient is not stored")?;
    let mut c = Ctx::new(
        name,
        (n_in + kd.outputs.len()) as u32,
        BLOCK,
        rows * classes,
    );
    let (xb, lb, db, ob) = (
        c.bases[param(&x)],
        c.bases[param(&labels)],
        c.bases[param(&dy)],
        c.bases[n_in + out],
    );
    let exp_body = small_body(2, |b, a| {
        let dd = b.sub(a[0], a[1]);
        crate::kernel::math::exp(b, dd)
    });
    let one_f = c.b.imm(RegTy::F32, 1.0f32.to_bits() as u64);
    let nan = c.b.imm(RegTy::F32, f32::NAN.to_bits() as u64);
    let n_f = c.b.imm(RegTy::F32, (rows as f32).to_bits() as u64);
    let dyv = c.b.ld(Space::Global, Mem::B32, RegTy::F32, db);
    let scale = c.b.fbin(FOp::Div, dyv, n_f);
    let at = |c: &mut Ctx, start: Reg, j: Reg| {
        let e = c.b.ibin(IOp::Add, start, j);
        let a = c.address(xb, e, Mem::B32);
        (e, c.b.ld(Space::Global, Mem::B32, RegTy::F32, a))
    };
    c.grid_stride(rows, |c, r| {
        let start = c.op_n(IOp::Mul, r, classes);
        let (zero, one, cn) = (c.n(0), c.n(1), c.n(classes));
        let value = |c: &mut Ctx, j: Reg| -> Result<Reg, String> { Ok(at(c, start, j).1) };
        let (mx, sum) = max_and_sum(c, classes, (zero, one), &value, None)?;
        let inv = c.b.fbin(FOp::Div, one_f, sum);
        let (label, bad) = label_at(c, lb, wide, r, classes);
        let j = c.b.reg(c.it);
        c.b.push(Inst::Mov(j, zero));
        c.for_loop(j, cn, one, |c| {
            let (e, v) = at(c, start, j);
            let t = render(&mut c.b, &exp_body, &[v, mx])?[0];
            let p = c.b.fbin(FOp::Mul, t, inv);
            let hot = c.b.setp(CmpTy::Unsigned, Cmp::Eq, j, label);
            let pm = c.b.fbin(FOp::Sub, p, one_f);
            let g = c.b.selp(pm, p, hot);
            let y = c.b.fbin(FOp::Mul, g, scale);
            let y = c.b.selp(nan, y, bad);
            let a = c.address(ob, e, Mem::B32);
            c.b.push(Inst::St(Space::Global, Mem::B32, a, y));
            Ok(())
        })
    })?;
    Ok(c.finish(rows.div_ceil(BLOCK as u64)))
}

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

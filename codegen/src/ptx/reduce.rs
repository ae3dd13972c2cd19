//! Reductions over contiguous axes (a thread or a block per output) and training batch norm
//! (a block per channel).

use super::lower::{BLOCK, Ctx, Lowered, THREAD_PER_OUTPUT_BELOW, render};
use super::prog::{Cmp, CmpTy, FOp, FUn, IOp, Inst, Mem, Reg, RegTy, Space, Sreg};
use crate::kernel::expr::Lane;
use crate::kernel::lower::small_body;
use crate::kernel::{ReduceBodies, ReduceShape, reduce_bodies};
use crate::plan::KernelData;
use tcc_ir::{DType, Function, OpKind, Value};

/// Reduction kernel `kd` of `f` (shape `red`: the input as `[a, l, b]`, `l` reduced), in
/// `f32`, named `name`. Outputs `o = ai * b + bi` reduce elements `(ai * l + j) * b + bi`:
/// the prologue's value of each, combined from the reduction's identity by its step, then the
/// mean's scale and the epilogue. Short reductions: a thread per output, in order along `l`.
/// Long ones: a block per output (grid-stride over outputs), each thread combining every
/// `BLOCK`-th element, then the block's partials combined by warp shuffles and the warps'
/// totals through shared memory ([`Ctx::combine`]); thread 0 finishes.
pub fn reduction(
    f: &Function,
    kd: &KernelData,
    red: &ReduceShape,
    name: String,
) -> Result<Lowered, String> {
    let ReduceShape {
        root,
        a,
        l,
        b: bext,
        ..
    } = *red;
    let in_dims = f.ty(f.op(root).args[0]).dims().to_vec();
    let out_dims = f.ty(f.op(root).results[0]).dims().to_vec();
    let param = |v: &Value| kd.inputs.iter().position(|x| x == v).expect("an input");
    let ReduceBodies {
        pro_in,
        epi_in,
        init,
        input,
        step,
        output,
    } = reduce_bodies(f, kd, red);
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

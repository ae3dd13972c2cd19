//! Kernels over lines of elements: softmax rows (contiguous or strided), softmax
//! cross-entropy and its gradient, and `top_k`.

use super::lower::{BLOCK, Ctx, Lowered, THREAD_PER_OUTPUT_BELOW, Team, render};
use super::prog::{Cmp, CmpTy, Cvt, FOp, IOp, Inst, Mem, Reg, RegTy, Space, Sreg};
use crate::kernel::expr::{Body, Lane};
use crate::kernel::lower::{body as body_of, lower_ops, small_body};
use crate::kernel::math::log;
use crate::kernel::{RowShape, reduce_inputs};
use crate::plan::KernelData;
use tcc_ir::{DType, Function, OpKind, Value};

/// A row's maximum and its sum of `e^(x - max)` by the softmax steps, over the row's elements
/// `x = value(c, j)` for `j = j0, j0 + step, ...` below `len` (a thread's share; with `team`,
/// the block's shares combined by shuffles and shared memory, every thread getting the
/// totals).
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
/// threads' maxima and sums combined by warp shuffles and shared memory ([`Ctx::combine`]).
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
        let at = |c: &mut Ctx, j: Reg| c.mad_n(j, inner, start);
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

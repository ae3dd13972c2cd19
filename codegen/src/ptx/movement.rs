//! Kernels of one op that move or convert data, or pool windows: a thread per output element
//! (grid-stride), which computes where its value comes from. Transposes, slices and
//! concatenations copy elements of any dtype bit for bit; casts convert as the interpreter
//! does; pooling reads its window from the input.

use super::lower::{BLOCK, Ctx, Lowered, render};
use super::prog::{Cmp, CmpTy, Cvt, FOp, IOp, Inst, Mem, Reg, RegTy, Space};
use crate::kernel::expr;
use crate::kernel::lower::small_body;
use crate::plan::KernelData;
use tcc_ir::{DType, Function, OpKind, Pool2d, Value};

/// How an element of `d` is moved: its memory type and the register holding its bits.
fn bits_of(d: DType) -> (Mem, RegTy) {
    match d.size_bytes() {
        1 => (Mem::U8, RegTy::I32),
        8 => (Mem::B64, RegTy::I64),
        _ => (Mem::B32, RegTy::I32),
    }
}

/// Row-major strides of `dims`, in elements.
fn strides(dims: &[u64]) -> Vec<u64> {
    let mut st = vec![1u64; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        st[i] = st[i + 1] * dims[i + 1];
    }
    st
}

/// The coordinates of flat index `o` in `dims`, outermost first.
fn coords(c: &mut Ctx, o: Reg, dims: &[u64]) -> Vec<Reg> {
    let st = strides(dims);
    (0..dims.len())
        .map(|a| {
            let q = if st[a] == 1 {
                o
            } else {
                c.op_n(IOp::DivU, o, st[a])
            };
            if a == 0 {
                q
            } else {
                c.op_n(IOp::RemU, q, dims[a])
            }
        })
        .collect()
}

/// `Σ coord[a] * weight[a] + base`, wrapping (negative weights as their two's complement).
fn dot(c: &mut Ctx, coord: &[Reg], weight: &[i64], base: i64) -> Reg {
    let mut acc = c.n(base as u64);
    for (&x, &w) in coord.iter().zip(weight) {
        if w == 0 {
            continue;
        }
        let wn = c.n(w as u64);
        let s = c.b.reg(c.it);
        c.b.push(Inst::IMad(s, x, wn, acc));
        acc = s;
    }
    acc
}

/// Whether kernel `kd` of `f` is one op this module lowers.
pub fn handles(f: &Function, kd: &KernelData) -> bool {
    let [op] = kd.ops[..] else { return false };
    let d = f.op(op);
    let float = |v: Value| f.ty(v).dtype() == DType::F32;
    match &d.kind {
        OpKind::Transpose { .. } | OpKind::Slice { .. } | OpKind::Concat { .. } => true,
        OpKind::Cast { to } => {
            let from = f.ty(d.args[0]).dtype();
            from != DType::I64 && *to != DType::I64
        }
        OpKind::MaxPool2d(_) | OpKind::AvgPool2d { .. } | OpKind::GlobalAvgPool => {
            f.ty(d.args[0]).rank() == 4 && float(d.args[0])
        }
        OpKind::Gather { .. } => {
            matches!(f.ty(d.args[1]).dtype(), DType::I32 | DType::I64)
        }
        OpKind::BatchNorm { .. } => d.args.iter().all(|&v| float(v)),
        OpKind::SliceGrad { .. } => float(d.args[0]),
        // Reductions over any axes (the kernel layer's take contiguous ones).
        OpKind::Reduce { .. } => float(d.args[0]),
        OpKind::MaxPool2dGrad(_) | OpKind::AvgPool2dGrad { .. } => {
            d.args.iter().all(|&v| float(v)) && f.ty(d.results[0]).rank() == 4
        }
        OpKind::ScatterAdd { .. } => {
            float(d.args[0])
                && float(d.args[2])
                && matches!(f.ty(d.args[1]).dtype(), DType::I32 | DType::I64)
        }
        _ => false,
    }
}

/// Kernel `kd` of `f` (one op [`handles`] accepts), named `name`: a thread per output element.
pub fn lower(f: &Function, kd: &KernelData, name: String) -> Result<Lowered, String> {
    let op = kd.ops[0];
    let d = f.op(op);
    let y = d.results[0];
    let od = f.ty(y).dims().to_vec();
    let n: u64 = od.iter().product();
    let largest = (d.args.iter()).map(|&v| f.ty(v).numel()).max().unwrap_or(0);
    let n_in = kd.inputs.len();
    let mut c = Ctx::new(
        name,
        (n_in + kd.outputs.len()) as u32,
        BLOCK,
        n.max(largest),
    );
    let base_of =
        |c: &Ctx, v: Value| c.bases[kd.inputs.iter().position(|&x| x == v).expect("an input")];
    let out = c.bases[n_in
        + kd.outputs
            .iter()
            .position(|&x| x == y)
            .ok_or("the result is not stored")?];
    let kind = d.kind.clone();
    let args = d.args.clone();
    c.grid_stride(n, |c, o| {
        let (value, mem) = match &kind {
            OpKind::Transpose { perm } => {
                let x = args[0];
                let ist = strides(f.ty(x).dims());
                let at = coords(c, o, &od);
                let w: Vec<i64> = perm.iter().map(|&p| ist[p as usize] as i64).collect();
                let src = dot(c, &at, &w, 0);
                let (mem, ty) = bits_of(f.ty(x).dtype());
                let addr = c.address(base_of(c, x), src, mem);
                (c.b.ld(Space::Global, mem, ty, addr), mem)
            }
            OpKind::Slice {
                starts,
                ends,
                steps,
            } => {
                let x = args[0];
                let xd = f.ty(x).dims();
                let ist = strides(xd);
                let mut base = 0i64;
                let mut w = Vec::with_capacity(xd.len());
                for a in 0..xd.len() {
                    let (s, _) = tcc_ir::typing::slice_range(xd[a], starts[a], ends[a], steps[a]);
                    base += s * ist[a] as i64;
                    w.push(steps[a] * ist[a] as i64);
                }
                let at = coords(c, o, &od);
                let src = dot(c, &at, &w, base);
                let (mem, ty) = bits_of(f.ty(x).dtype());
                let addr = c.address(base_of(c, x), src, mem);
                (c.b.ld(Space::Global, mem, ty, addr), mem)
            }
            OpKind::Concat { axis } => {
                let rank = od.len();
                let ax = tcc_ir::ops::normalize_axis(*axis, rank).ok_or("a bad axis")?;
                let (mem, ty) = bits_of(f.ty(y).dtype());
                let at = coords(c, o, &od);
                let v = c.b.reg(ty);
                let done = c.b.label();
                let mut from = 0u64;
                for (j, &x) in args.iter().enumerate() {
                    let xd = f.ty(x).dims();
                    let upto = from + xd[ax];
                    let next = c.b.label();
                    if j + 1 < args.len() {
                        let limit = c.n(upto);
                        let past = c.b.setp(CmpTy::Unsigned, Cmp::Ge, at[ax], limit);
                        c.b.push(Inst::Bra(next, Some((past, true))));
                    }
                    let ist = strides(xd);
                    let w: Vec<i64> = ist.iter().map(|&s| s as i64).collect();
                    // The coordinate along the axis, less where this operand starts.
                    let src = dot(c, &at, &w, -((from * ist[ax]) as i64));
                    let addr = c.address(base_of(c, x), src, mem);
                    c.b.push(Inst::Ld(Space::Global, mem, v, addr));
                    c.b.push(Inst::Bra(done, None));
                    c.b.place(next);
                    from = upto;
                }
                c.b.place(done);
                (v, mem)
            }
            OpKind::Cast { to } => cast(c, base_of(c, args[0]), f.ty(args[0]).dtype(), *to, o)?,
            OpKind::MaxPool2d(p) => pool(c, f, base_of(c, args[0]), args[0], &od, p, None, o)?,
            OpKind::AvgPool2d {
                pool: p,
                count_include_pad,
            } => pool(
                c,
                f,
                base_of(c, args[0]),
                args[0],
                &od,
                p,
                Some(*count_include_pad),
                o,
            )?,
            OpKind::GlobalAvgPool => {
                // A window over the whole plane.
                let xd = f.ty(args[0]).dims();
                let p = Pool2d {
                    kernel: [xd[2], xd[3]],
                    strides: [1, 1],
                    pads: [0; 4],
                };
                pool(c, f, base_of(c, args[0]), args[0], &od, &p, Some(false), o)?
            }
            OpKind::Gather { axis } => {
                let (data, ids) = (args[0], args[1]);
                let dd = f.ty(data).dims();
                let a = tcc_ir::ops::normalize_axis(*axis, dd.len()).ok_or("a bad axis")?;
                let len = dd[a];
                let inner: u64 = dd[a + 1..].iter().product();
                let nids = f.ty(ids).numel();
                // o = (outer * nids + k) * inner + i.
                let i = c.op_n(IOp::RemU, o, inner);
                let q = c.op_n(IOp::DivU, o, inner);
                let k = c.op_n(IOp::RemU, q, nids);
                let outer = c.op_n(IOp::DivU, q, nids);
                let (j, bad) = index(c, base_of(c, ids), f.ty(ids).dtype(), k, len);
                let zero = c.n(0);
                let j = c.b.selp(zero, j, bad);
                let row = c.mad_n(outer, len, j);
                let src = c.mad_n(row, inner, i);
                let (mem, ty) = bits_of(f.ty(data).dtype());
                let addr = c.address(base_of(c, data), src, mem);
                let v = c.b.ld(Space::Global, mem, ty, addr);
                // Out of range: NaN for floats, 0 for integers.
                let poison = match f.ty(data).dtype() {
                    DType::F32 => c.b.imm(ty, f32::NAN.to_bits() as u64),
                    DType::F64 => c.b.imm(ty, f64::NAN.to_bits()),
                    _ => c.b.imm(ty, 0),
                };
                (c.b.selp(poison, v, bad), mem)
            }
            OpKind::BatchNorm { eps } => {
                // (x - mean) / sqrt(var + eps) * gamma + beta, per channel (axis 1).
                let xd = f.ty(args[0]).dims();
                let (ch, inner) = (xd[1], xd[2..].iter().product::<u64>());
                let q = c.op_n(IOp::DivU, o, inner);
                let k = c.op_n(IOp::RemU, q, ch);
                let ld = |c: &mut Ctx, v: Value, at: Reg| {
                    let addr = c.address(base_of(c, v), at, Mem::B32);
                    c.b.ld(Space::Global, Mem::B32, RegTy::F32, addr)
                };
                let x = ld(c, args[0], o);
                let [g, b, m, v] = [1, 2, 3, 4].map(|i| ld(c, args[i], k));
                let e = c.b.imm(RegTy::F32, (eps.0 as f32).to_bits() as u64);
                let ve = c.b.fbin(FOp::Add, v, e);
                let sd = c.b.fun(super::prog::FUn::Sqrt, ve);
                let xm = c.b.fbin(FOp::Sub, x, m);
                let n = c.b.fbin(FOp::Div, xm, sd);
                let y = c.b.reg(RegTy::F32);
                c.b.push(Inst::Fma(y, n, g, b));
                (y, Mem::B32)
            }
            OpKind::SliceGrad {
                shape,
                starts,
                ends,
                steps,
            } => {
                // dx[x] = dy[q] where every coordinate is start + q * step of the slice, else 0.
                let dyd = f.ty(args[0]).dims();
                let dst = strides(dyd);
                let at = coords(c, o, &od);
                let mut outside = Vec::new();
                let mut idx = c.n(0);
                for a in 0..shape.len() {
                    let (s0, len) =
                        tcc_ir::typing::slice_range(shape[a], starts[a], ends[a], steps[a]);
                    let k = steps[a].unsigned_abs();
                    // The distance from the slice's start along its direction, wrapping below
                    // zero to values past the slice.
                    let t = if steps[a] > 0 {
                        c.op_n(IOp::Sub, at[a], s0 as u64)
                    } else {
                        let s = c.n(s0 as u64);
                        c.b.ibin(IOp::Sub, s, at[a])
                    };
                    let limit = c.n(len * k);
                    outside.push(c.b.setp(CmpTy::Unsigned, Cmp::Ge, t, limit));
                    if k > 1 {
                        let r = c.op_n(IOp::RemU, t, k);
                        let zero = c.n(0);
                        outside.push(c.b.setp(CmpTy::Unsigned, Cmp::Ne, r, zero));
                    }
                    let q = if k > 1 { c.op_n(IOp::DivU, t, k) } else { t };
                    let dn = c.n(dst[a]);
                    let s = c.b.reg(c.it);
                    c.b.push(Inst::IMad(s, q, dn, idx));
                    idx = s;
                }
                (c.load_where(base_of(c, args[0]), idx, &outside), Mem::B32)
            }
            OpKind::Reduce { op, axes, .. } => {
                // The output's coordinates are the kept axes'; the thread walks the reduced
                // ones as one counter, in row-major order.
                let x = args[0];
                let xd = f.ty(x).dims();
                let rank = xd.len();
                let mut reduced = vec![false; rank];
                for &a in axes {
                    reduced[tcc_ir::ops::normalize_axis(a, rank).ok_or("a bad axis")?] = true;
                }
                let st = strides(xd);
                let kept: Vec<u64> = (0..rank).filter(|&a| !reduced[a]).map(|a| xd[a]).collect();
                let red: Vec<u64> = (0..rank).filter(|&a| reduced[a]).map(|a| xd[a]).collect();
                let kw: Vec<i64> = (0..rank)
                    .filter(|&a| !reduced[a])
                    .map(|a| st[a] as i64)
                    .collect();
                let rw: Vec<i64> = (0..rank)
                    .filter(|&a| reduced[a])
                    .map(|a| st[a] as i64)
                    .collect();
                let at = coords(c, o, &kept);
                let base = dot(c, &at, &kw, 0);
                let l: u64 = red.iter().product();
                let (init, step) = crate::kernel::reduce_step(*op);
                let acc = c.b.reg(RegTy::F32);
                let i0 = c.b.imm(RegTy::F32, init.to_bits() as u64);
                c.b.push(Inst::Mov(acc, i0));
                let j = c.b.reg(c.it);
                let (zero, one, ln) = (c.n(0), c.n(1), c.n(l));
                c.b.push(Inst::Mov(j, zero));
                let xb = base_of(c, x);
                c.for_loop(j, ln, one, |c| {
                    let rc = coords(c, j, &red);
                    let off = dot(c, &rc, &rw, 0);
                    let e = c.b.ibin(IOp::Add, base, off);
                    let addr = c.address(xb, e, Mem::B32);
                    let v = c.b.ld(Space::Global, Mem::B32, RegTy::F32, addr);
                    let n = render(&mut c.b, &step, &[acc, v])?[0];
                    c.b.push(Inst::Mov(acc, n));
                    Ok(())
                })?;
                let r = if *op == tcc_ir::ReduceOp::Mean {
                    let lf = c.b.imm(RegTy::F32, (l as f32).to_bits() as u64);
                    c.b.fbin(FOp::Div, acc, lf)
                } else {
                    acc
                };
                (r, Mem::B32)
            }
            OpKind::MaxPool2dGrad(p) => {
                let (x, dy) = (args[0], args[1]);
                let g = pool_grad(
                    c,
                    (base_of(c, dy), f.ty(dy).dims()),
                    Some(base_of(c, x)),
                    &od,
                    p,
                    false,
                    o,
                )?;
                (g, Mem::B32)
            }
            OpKind::AvgPool2dGrad {
                pool: p,
                count_include_pad,
                ..
            } => {
                let dy = args[0];
                let g = pool_grad(
                    c,
                    (base_of(c, dy), f.ty(dy).dims()),
                    None,
                    &od,
                    p,
                    *count_include_pad,
                    o,
                )?;
                (g, Mem::B32)
            }
            OpKind::ScatterAdd { axis } => {
                // out[(outer, j, i)] = data[...] + the updates[(outer, k, i)] whose index k is j,
                // in k's order (indices out of range add nothing).
                let (data, ids, upd) = (args[0], args[1], args[2]);
                let dd = f.ty(data).dims();
                let a = tcc_ir::ops::normalize_axis(*axis, dd.len()).ok_or("a bad axis")?;
                let len = dd[a];
                let inner: u64 = dd[a + 1..].iter().product();
                let nids = f.ty(ids).numel();
                let i = c.op_n(IOp::RemU, o, inner);
                let q = c.op_n(IOp::DivU, o, inner);
                let j = c.op_n(IOp::RemU, q, len);
                let outer = c.op_n(IOp::DivU, q, len);
                let addr = c.address(base_of(c, data), o, Mem::B32);
                let acc = c.b.reg(RegTy::F32);
                c.b.push(Inst::Ld(Space::Global, Mem::B32, acc, addr));
                let k = c.b.reg(c.it);
                let (zero, one, kn) = (c.n(0), c.n(1), c.n(nids));
                c.b.push(Inst::Mov(k, zero));
                let ids_base = base_of(c, ids);
                let upd_base = base_of(c, upd);
                let dtype = f.ty(ids).dtype();
                c.for_loop(k, kn, one, |c| {
                    let (jk, bad) = index(c, ids_base, dtype, k, len);
                    let skip = c.b.label();
                    c.b.push(Inst::Bra(skip, Some((bad, true))));
                    let other = c.b.setp(CmpTy::Unsigned, Cmp::Ne, jk, j);
                    c.b.push(Inst::Bra(skip, Some((other, true))));
                    let row = c.mad_n(outer, nids, k);
                    let e = c.mad_n(row, inner, i);
                    let ua = c.address(upd_base, e, Mem::B32);
                    let u = c.b.ld(Space::Global, Mem::B32, RegTy::F32, ua);
                    let sum = c.b.fbin(FOp::Add, acc, u);
                    c.b.push(Inst::Mov(acc, sum));
                    c.b.place(skip);
                    Ok(())
                })?;
                (acc, Mem::B32)
            }
            other => return Err(format!("no GPU kernel for {}", other.mnemonic())),
        };
        let addr = c.address(out, o, mem);
        c.b.push(Inst::St(Space::Global, mem, addr, value));
        Ok(())
    })?;
    Ok(c.finish(n.div_ceil(BLOCK as u64)))
}

/// Element `o` of `cast(x)` from `from` to `to`, as the interpreter converts: floats to
/// integers truncated toward zero and saturated to the target's range (NaN to 0), integers to
/// integers wrapped, anything to `bool` as "not zero" (NaN is true), `bool` as 0 or 1.
fn cast(c: &mut Ctx, x: Reg, from: DType, to: DType, o: Reg) -> Result<(Reg, Mem), String> {
    let load = match from {
        DType::F32 => (Mem::B32, RegTy::F32),
        DType::F64 => (Mem::B64, RegTy::F64),
        DType::I32 => (Mem::B32, RegTy::I32),
        DType::I8 => (Mem::S8, RegTy::I32),
        DType::U8 | DType::Bool => (Mem::U8, RegTy::I32),
        DType::I64 => return Err("no GPU cast from i64 yet".into()),
    };
    let addr = c.address(x, o, load.0);
    let v = c.b.ld(Space::Global, load.0, load.1, addr);
    let float_to = |c: &mut Ctx, t: RegTy| -> Reg {
        if load.1 == t {
            v
        } else if load.1 == RegTy::I32 {
            c.b.cvt(Cvt::S32ToFloat, t, v)
        } else {
            c.b.cvt(Cvt::FloatToFloat, t, v)
        }
    };
    Ok(match to {
        DType::F32 => (float_to(c, RegTy::F32), Mem::B32),
        DType::F64 => (float_to(c, RegTy::F64), Mem::B64),
        DType::Bool => {
            let zero = if load.1 == RegTy::I32 {
                c.b.imm(RegTy::I32, 0)
            } else {
                c.b.imm(load.1, 0)
            };
            let ct = if load.1 == RegTy::I32 {
                CmpTy::Unsigned
            } else {
                CmpTy::Float
            };
            let cmp = if ct == CmpTy::Float {
                Cmp::Neu
            } else {
                Cmp::Ne
            };
            let p = c.b.setp(ct, cmp, v, zero);
            let (one, zero) = (c.b.imm(RegTy::I32, 1), c.b.imm(RegTy::I32, 0));
            (c.b.selp(one, zero, p), Mem::U8)
        }
        DType::I32 | DType::I8 | DType::U8 => {
            let int = if load.1 == RegTy::I32 {
                v
            } else {
                c.b.cvt(Cvt::FloatToS32, RegTy::I32, v)
            };
            let is_float = load.1 != RegTy::I32;
            let r = match to {
                DType::I32 => int,
                // From a float: saturate to the 8-bit range; from an integer: wrap.
                DType::I8 if is_float => clamp(c, int, -128, 127),
                DType::U8 if is_float => clamp(c, int, 0, 255),
                DType::I8 => c.b.cvt(Cvt::S8, RegTy::I32, int),
                _ => c.b.cvt(Cvt::U8, RegTy::I32, int),
            };
            let mem = if to == DType::I32 { Mem::B32 } else { Mem::U8 };
            (r, mem)
        }
        DType::I64 => return Err("no GPU cast to i64 yet".into()),
    })
}

/// Index `k` of the `i32` or `i64` indices at `base`, negative ones counting from `len`: the
/// index, and a predicate set where it is out of range.
fn index(c: &mut Ctx, base: Reg, d: DType, k: Reg, len: u64) -> (Reg, Reg) {
    let mem = if d == DType::I64 { Mem::B64 } else { Mem::B32 };
    let addr = c.address(base, k, mem);
    let low = c.b.ld(Space::Global, Mem::B32, RegTy::I32, addr);
    let zero = c.b.imm(RegTy::I32, 0);
    let neg = c.b.setp(CmpTy::Signed, Cmp::Lt, low, zero);
    let lenr = c.b.imm(RegTy::I32, len);
    let wrapped = c.b.ibin(IOp::Add, low, lenr);
    let j = c.b.selp(wrapped, low, neg);
    let mut bad = c.b.setp(CmpTy::Unsigned, Cmp::Ge, j, lenr);
    if d == DType::I64 {
        // A valid i64 index fits in 32 bits: its high word is the low word's sign.
        let four = c.b.imm(RegTy::I64, 4);
        let ha = c.b.ibin(IOp::Add, addr, four);
        let high = c.b.ld(Space::Global, Mem::B32, RegTy::I32, ha);
        let thirty_one = c.b.imm(RegTy::I32, 31);
        let sign = c.b.ibin(IOp::ShrS, low, thirty_one);
        let odd = c.b.setp(CmpTy::Unsigned, Cmp::Ne, high, sign);
        let one = c.b.imm(RegTy::I32, 1);
        let b1 = c.b.selp(one, zero, bad);
        let b2 = c.b.selp(one, b1, odd);
        bad = c.b.setp(CmpTy::Unsigned, Cmp::Ne, b2, zero);
    }
    let j = c.index_of(j);
    (j, bad)
}

/// Element `o` (of the forward input's dims `xd`) of a pooling gradient: the sum, over the
/// windows holding it in the forward op's order, of each window's `dy` (at `dy`, of dims
/// `yd`): for max pooling (`x` given) where it is the window's first maximum (NaN counting
/// as the largest), for average pooling divided by the window's divisor (its size with
/// `include_pad`, else its positions inside the input).
#[allow(clippy::too_many_arguments)]
fn pool_grad(
    c: &mut Ctx,
    (dy, yd): (Reg, &[u64]),
    x: Option<Reg>,
    xd: &[u64],
    p: &Pool2d,
    include_pad: bool,
    o: Reg,
) -> Result<Reg, String> {
    let (ch, h, w) = (xd[1], xd[2], xd[3]);
    let (oh, ow) = (yd[2], yd[3]);
    let (kh, kw) = (p.kernel[0], p.kernel[1]);
    let (sh, sw) = (p.strides[0], p.strides[1]);
    let (pt, pl) = (p.pads[0], p.pads[1]);
    let at = coords(c, o, xd);
    let (img, chan, iy, ix) = (at[0], at[1], at[2], at[3]);
    let plane = c.mad_n(img, ch, chan);
    let acc = c.b.reg(RegTy::F32);
    let zero_f = c.b.imm(RegTy::F32, 0);
    c.b.push(Inst::Mov(acc, zero_f));
    let (zero, one) = (c.n(0), c.n(1));
    // The output position of tap `k` (counted from the window's end, so that positions come
    // in increasing order) along an axis, and whether there is one.
    let back = |c: &mut Ctx, i: Reg, pad: u64, k: u64, a: Reg, s: u64, n: u64| {
        let last = c.n(k - 1);
        let tap = c.b.ibin(IOp::Sub, last, a);
        let t = c.op_n(IOp::Add, i, pad);
        let t = c.b.ibin(IOp::Sub, t, tap);
        let q = c.op_n(IOp::DivU, t, s);
        let r = c.op_n(IOp::RemU, t, s);
        let lim = c.n(n * s);
        let out = c.b.setp(CmpTy::Unsigned, Cmp::Ge, t, lim);
        let z = c.n(0);
        let off = c.b.setp(CmpTy::Unsigned, Cmp::Ne, r, z);
        (q, out, off)
    };
    let (a, b) = (c.b.reg(c.it), c.b.reg(c.it));
    let (khn, kwn) = (c.n(kh), c.n(kw));
    c.b.push(Inst::Mov(a, zero));
    c.for_loop(a, khn, one, |c| {
        c.b.push(Inst::Mov(b, zero));
        c.for_loop(b, kwn, one, |c| {
            let (oy, out_y, off_y) = back(c, iy, pt, kh, a, sh, oh);
            let (ox, out_x, off_x) = back(c, ix, pl, kw, b, sw, ow);
            let skip = c.b.label();
            for q in [out_y, off_y, out_x, off_x] {
                c.b.push(Inst::Bra(skip, Some((q, true))));
            }
            let g = {
                let ohn = c.n(oh);
                let r = c.b.reg(c.it);
                c.b.push(Inst::IMad(r, plane, ohn, oy));
                let own = c.n(ow);
                let e = c.b.reg(c.it);
                c.b.push(Inst::IMad(e, r, own, ox));
                let addr = c.address(dy, e, Mem::B32);
                c.b.ld(Space::Global, Mem::B32, RegTy::F32, addr)
            };
            // The window's corner, wrapping below zero to values past the extent.
            let y0 = {
                let m = c.op_n(IOp::Mul, oy, sh);
                c.op_n(IOp::Sub, m, pt)
            };
            let x0 = {
                let m = c.op_n(IOp::Mul, ox, sw);
                c.op_n(IOp::Sub, m, pl)
            };
            // A scan of the window's positions inside the input: their count, and (max) the
            // first holding the maximum.
            let count = c.b.reg(RegTy::F32);
            c.b.push(Inst::Mov(count, zero_f));
            let best_v = c.b.reg(RegTy::F32);
            c.b.push(Inst::Mov(best_v, zero_f));
            let best_i = c.b.reg(c.it);
            let none = c.n(u32::MAX as u64);
            c.b.push(Inst::Mov(best_i, none));
            window(c, (y0, x0), (kh, kw), (h, w), plane, &mut |c, e| {
                let onef = c.b.imm(RegTy::F32, 1.0f32.to_bits() as u64);
                let n1 = c.b.fbin(FOp::Add, count, onef);
                c.b.push(Inst::Mov(count, n1));
                if let Some(xb) = x {
                    let addr = c.address(xb, e, Mem::B32);
                    let v = c.b.ld(Space::Global, Mem::B32, RegTy::F32, addr);
                    // Take it if it is the first, larger, or NaN over a number.
                    let first = c.b.setp(CmpTy::Unsigned, Cmp::Eq, best_i, none);
                    let larger = c.b.setp(CmpTy::Float, Cmp::Gt, v, best_v);
                    let v_nan = c.b.setp(CmpTy::Float, Cmp::Nan, v, v);
                    let b_num = c.b.setp(CmpTy::Float, Cmp::Eq, best_v, best_v);
                    let i1 = c.b.imm(RegTy::I32, 1);
                    let i0 = c.b.imm(RegTy::I32, 0);
                    let nan_wins = {
                        let t = c.b.selp(i1, i0, v_nan);
                        let t = c.b.selp(t, i0, b_num);
                        c.b.setp(CmpTy::Unsigned, Cmp::Ne, t, i0)
                    };
                    let take = {
                        let t = c.b.selp(i1, i0, first);
                        let t = c.b.selp(i1, t, larger);
                        let t = c.b.selp(i1, t, nan_wins);
                        c.b.setp(CmpTy::Unsigned, Cmp::Ne, t, i0)
                    };
                    let nv = c.b.selp(v, best_v, take);
                    c.b.push(Inst::Mov(best_v, nv));
                    let ni = c.b.selp(e, best_i, take);
                    c.b.push(Inst::Mov(best_i, ni));
                }
                Ok(())
            })?;
            let add = match x {
                Some(_) => {
                    let mine = c.b.setp(CmpTy::Unsigned, Cmp::Eq, best_i, o);
                    c.b.selp(g, zero_f, mine)
                }
                None if include_pad => {
                    let k = c.b.imm(RegTy::F32, ((kh * kw) as f32).to_bits() as u64);
                    c.b.fbin(FOp::Div, g, k)
                }
                None => c.b.fbin(FOp::Div, g, count),
            };
            let n = c.b.fbin(FOp::Add, acc, add);
            c.b.push(Inst::Mov(acc, n));
            c.b.place(skip);
            Ok(())
        })
    })?;
    Ok(acc)
}

/// `each(c, index)` for every position of the `kh x kw` window with corner `(y0, x0)` (wrapping
/// below zero to values past the extent) inside the `h x w` plane `plane` of an NCHW tensor,
/// row-major.
fn window(
    c: &mut Ctx,
    (y0, x0): (Reg, Reg),
    (kh, kw): (u64, u64),
    (h, w): (u64, u64),
    plane: Reg,
    each: &mut dyn FnMut(&mut Ctx, Reg) -> Result<(), String>,
) -> Result<(), String> {
    let (wy, wx) = (c.b.reg(c.it), c.b.reg(c.it));
    let (zero, one) = (c.n(0), c.n(1));
    let (khn, kwn, hn, wn) = (c.n(kh), c.n(kw), c.n(h), c.n(w));
    c.b.push(Inst::Mov(wy, zero));
    c.for_loop(wy, khn, one, |c| {
        c.b.push(Inst::Mov(wx, zero));
        c.for_loop(wx, kwn, one, |c| {
            let yy = c.b.ibin(IOp::Add, y0, wy);
            let xx = c.b.ibin(IOp::Add, x0, wx);
            let skip = c.b.label();
            let out_y = c.b.setp(CmpTy::Unsigned, Cmp::Ge, yy, hn);
            c.b.push(Inst::Bra(skip, Some((out_y, true))));
            let out_x = c.b.setp(CmpTy::Unsigned, Cmp::Ge, xx, wn);
            c.b.push(Inst::Bra(skip, Some((out_x, true))));
            let row = c.mad_n(plane, h, yy);
            let idx = c.mad_n(row, w, xx);
            each(c, idx)?;
            c.b.place(skip);
            Ok(())
        })
    })
}

/// `v` clamped to `[lo, hi]` (signed 32-bit).
fn clamp(c: &mut Ctx, v: Reg, lo: i32, hi: i32) -> Reg {
    let (l, h) = (
        c.b.imm(RegTy::I32, lo as u32 as u64),
        c.b.imm(RegTy::I32, hi as u32 as u64),
    );
    let a = c.b.ibin(IOp::MaxS, v, l);
    c.b.ibin(IOp::MinS, a, h)
}

/// Output element `o` (of dims `od`) of pooling `x` (NCHW, f32) over windows `p`: the maximum
/// (`avg` is `None`; padding never wins, NaN wins) or the mean (`Some(count_include_pad)`)
/// of the window's elements inside the input, which a thread reads in two loops.
#[allow(clippy::too_many_arguments)]
fn pool(
    c: &mut Ctx,
    f: &Function,
    base: Reg,
    x: Value,
    od: &[u64],
    p: &Pool2d,
    avg: Option<bool>,
    o: Reg,
) -> Result<(Reg, Mem), String> {
    let xd = f.ty(x).dims();
    let (ch, h, w) = (xd[1], xd[2], xd[3]);
    let at = coords(c, o, od);
    let (img, chan, oy, ox) = (at[0], at[1], at[2], at[3]);
    let plane = c.mad_n(img, ch, chan);
    // The window's corner, wrapping below zero to values past the extent.
    let corner = |c: &mut Ctx, v: Reg, s: u64, pad: u64| {
        let m = c.op_n(IOp::Mul, v, s);
        c.op_n(IOp::Sub, m, pad)
    };
    let y0 = corner(c, oy, p.strides[0], p.pads[0]);
    let x0 = corner(c, ox, p.strides[1], p.pads[1]);
    let init = if avg.is_some() {
        0.0f32
    } else {
        f32::NEG_INFINITY
    };
    let acc = c.b.reg(RegTy::F32);
    let start = c.b.imm(RegTy::F32, init.to_bits() as u64);
    c.b.push(Inst::Mov(acc, start));
    let count = c.b.reg(RegTy::F32);
    let zero_f = c.b.imm(RegTy::F32, 0);
    c.b.push(Inst::Mov(count, zero_f));
    let max = small_body(2, |b, a| b.bin(expr::Bin::Max, a[0], a[1]));
    window(
        c,
        (y0, x0),
        (p.kernel[0], p.kernel[1]),
        (h, w),
        plane,
        &mut |c, idx| {
            let addr = c.address(base, idx, Mem::B32);
            let v = c.b.ld(Space::Global, Mem::B32, RegTy::F32, addr);
            let next = if avg.is_some() {
                c.b.fbin(FOp::Add, acc, v)
            } else {
                render(&mut c.b, &max, &[acc, v])?[0]
            };
            c.b.push(Inst::Mov(acc, next));
            let onef = c.b.imm(RegTy::F32, 1.0f32.to_bits() as u64);
            let n1 = c.b.fbin(FOp::Add, count, onef);
            c.b.push(Inst::Mov(count, n1));
            Ok(())
        },
    )?;
    let r = match avg {
        None => acc,
        Some(true) => {
            let full = (p.kernel[0] * p.kernel[1]) as f32;
            let k = c.b.imm(RegTy::F32, full.to_bits() as u64);
            c.b.fbin(FOp::Div, acc, k)
        }
        Some(false) => c.b.fbin(FOp::Div, acc, count),
    };
    Ok((r, Mem::B32))
}

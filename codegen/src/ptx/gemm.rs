//! Matmuls and convolutions on one tiled GEMM kernel ([`gemm`]): a matmul reads its operands
//! as matrices (transposes the plan folded with swapped strides), a convolution its filters
//! as a matrix and its input's windows as the other (an implicit GEMM).

use super::lower::{BLOCK, Ctx, Lowered, render};
use super::prog::{Cmp, CmpTy, Cvt, IOp, Inst, Mem, Reg, RegTy, Space, Sreg};
use crate::kernel::expr::Lane;
use crate::kernel::lower::{body as body_of, lower_ops};
use crate::plan::KernelData;
use tcc_ir::{DType, Function, OpKind, Value};

/// Rows and columns of the output tile a block of a GEMM computes.
pub const TILE: u64 = 64;

/// The depth of the slices of A and B a GEMM block stages in shared memory.
const DEPTH: u64 = 8;

/// Rows and columns of the output each thread of a GEMM computes (its registers).
const MICRO: u64 = 4;

/// Loads an operand's element of a GEMM: given the batch's offset register (from
/// [`Gemm::offsets`]), the row and the column, the value (0 past `k`), never loading outside
/// the operand's buffer.
type Load<'a> = &'a dyn Fn(&mut Ctx, Reg, Reg, Reg) -> Reg;

/// What the tiled kernel ([`gemm`]) multiplies: per batch, an `m x k` A by a `k x n` B, each
/// element loaded by its operand's own rule (a matrix, a transposed one, a convolution's
/// input window), and where output `(batch, row, col)` lives.
struct Gemm<'a> {
    m: u64,
    n: u64,
    k: u64,
    batches: u64,
    /// The batch's offsets for A's and B's loads.
    offsets: &'a dyn Fn(&mut Ctx, Reg) -> (Reg, Reg),
    load_a: Load<'a>,
    load_b: Load<'a>,
    /// The flat index of output `(batch, row, col)` in the result.
    out_index: &'a dyn Fn(&mut Ctx, Reg, Reg, Reg) -> Reg,
}

/// The tiled kernel of `g`: each block computes a 64x64 tile of one batch's output
/// (grid-stride over the tiles), its 256 threads a 4x4 block of it each, in registers. For
/// each slice of depth 8 along `k`, the threads copy the 64x8 slice of A (transposed, so that
/// the inner loop reads rows of it) and the 8x64 slice of B into shared memory, two elements
/// each; a barrier; 8 x 16 fused multiply-adds; a barrier. Then `finish(c, out, acc)` for
/// each of the thread's outputs inside the matrix. Returns the number of tiles.
fn gemm(
    c: &mut Ctx,
    g: &Gemm,
    finish: &dyn Fn(&mut Ctx, Reg, Reg) -> Result<(), String>,
) -> Result<u64, String> {
    let (m, n, k) = (g.m, g.n, g.k);
    let (tm, tn) = (m.div_ceil(TILE), n.div_ceil(TILE));
    let tiles = g.batches * tm * tn;
    c.b.k.shared = (2 * TILE * DEPTH * 4) as u32;
    let zero_f = c.b.imm(RegTy::F32, 0);
    let tid = c.sreg(Sreg::Tid);
    let ctaid = c.sreg(Sreg::Ctaid);
    let nctaid = c.sreg(Sreg::Nctaid);
    let (t, tstep) = (c.index_of(ctaid), c.index_of(nctaid));
    let tid_i = c.index_of(tid);
    // This thread's 4x4 block: rows ty*4.., columns tx*4.. of the tile.
    let side = TILE / MICRO;
    let ty = c.op_n(IOp::DivU, tid_i, side);
    let tx = c.op_n(IOp::RemU, tid_i, side);
    let ty4 = c.op_n(IOp::Mul, ty, MICRO);
    let tx4 = c.op_n(IOp::Mul, tx, MICRO);
    let smem = c.b.reg(RegTy::I64);
    c.b.push(Inst::SharedBase(smem));
    // Shared element `e` (an index) of slice `s` (0: A, 1: B), as an address.
    let shared_at = |c: &mut Ctx, s: u64, e: Reg| {
        let e = if c.it == RegTy::I32 {
            c.b.cvt(Cvt::U32ToU64, RegTy::I64, e)
        } else {
            e
        };
        let two = c.b.imm(RegTy::I32, 2);
        let off = c.b.ibin(IOp::Shl, e, two);
        let base = if s == 0 {
            smem
        } else {
            let o = c.b.imm(RegTy::I64, TILE * DEPTH * 4);
            c.b.ibin(IOp::Add, smem, o)
        };
        c.b.ibin(IOp::Add, base, off)
    };
    let count = c.n(tiles);
    c.for_loop(t, count, tstep, |c| {
        // Which batch and tile.
        let per = tm * tn;
        let bi = c.op_n(IOp::DivU, t, per);
        let rest = c.op_n(IOp::RemU, t, per);
        let m0 = {
            let q = c.op_n(IOp::DivU, rest, tn);
            c.op_n(IOp::Mul, q, TILE)
        };
        let n0 = {
            let q = c.op_n(IOp::RemU, rest, tn);
            c.op_n(IOp::Mul, q, TILE)
        };
        let (a_off, b_off) = (g.offsets)(c, bi);
        let accs: Vec<Reg> = (0..MICRO * MICRO)
            .map(|_| {
                let r = c.b.reg(RegTy::F32);
                c.b.push(Inst::Mov(r, zero_f));
                r
            })
            .collect();
        let k0 = c.b.reg(c.it);
        let zero_i = c.n(0);
        c.b.push(Inst::Mov(k0, zero_i));
        let kn = c.n(k);
        let kstep = c.n(DEPTH);
        c.for_loop(k0, kn, kstep, |c| {
            // Two elements of each slice per thread.
            for half in 0..2u64 {
                let e = c.op_n(IOp::Add, tid_i, half * BLOCK as u64);
                // A's slice: element (row, col) = (e / 8, e % 8) of the 64x8 slice, stored
                // at [col][row].
                let (row, col) = (c.op_n(IOp::DivU, e, DEPTH), c.op_n(IOp::RemU, e, DEPTH));
                let gr = c.b.ibin(IOp::Add, m0, row);
                let gc = c.b.ibin(IOp::Add, k0, col);
                let v = (g.load_a)(c, a_off, gr, gc);
                let at = {
                    let s = c.b.reg(c.it);
                    let t64 = c.n(TILE);
                    c.b.push(Inst::IMad(s, col, t64, row));
                    s
                };
                let addr = shared_at(c, 0, at);
                c.b.push(Inst::St(Space::Shared, Mem::B32, addr, v));
                // B's slice: element (row, col) = (e / 64, e % 64) of the 8x64 slice.
                let (row, col) = (c.op_n(IOp::DivU, e, TILE), c.op_n(IOp::RemU, e, TILE));
                let gr = c.b.ibin(IOp::Add, k0, row);
                let gc = c.b.ibin(IOp::Add, n0, col);
                let v = (g.load_b)(c, b_off, gr, gc);
                let addr = shared_at(c, 1, e);
                c.b.push(Inst::St(Space::Shared, Mem::B32, addr, v));
            }
            c.b.push(Inst::Bar);
            for kk in 0..DEPTH {
                let mut av = Vec::new();
                let mut bv = Vec::new();
                for i in 0..MICRO {
                    let e = c.op_n(IOp::Add, ty4, kk * TILE + i);
                    let addr = shared_at(c, 0, e);
                    av.push(c.b.ld(Space::Shared, Mem::B32, RegTy::F32, addr));
                    let e = c.op_n(IOp::Add, tx4, kk * TILE + i);
                    let addr = shared_at(c, 1, e);
                    bv.push(c.b.ld(Space::Shared, Mem::B32, RegTy::F32, addr));
                }
                for i in 0..MICRO as usize {
                    for j in 0..MICRO as usize {
                        let acc = accs[i * MICRO as usize + j];
                        c.b.push(Inst::Fma(acc, av[i], bv[j], acc));
                    }
                }
            }
            c.b.push(Inst::Bar);
            Ok(())
        })?;
        // The outputs inside the matrix.
        let (mn, nn) = (c.n(m), c.n(n));
        for i in 0..MICRO {
            let row = {
                let r0 = c.b.ibin(IOp::Add, m0, ty4);
                c.op_n(IOp::Add, r0, i)
            };
            for j in 0..MICRO {
                let col = {
                    let c0 = c.b.ibin(IOp::Add, n0, tx4);
                    c.op_n(IOp::Add, c0, j)
                };
                let skip = c.b.label();
                let out_r = c.b.setp(CmpTy::Unsigned, Cmp::Ge, row, mn);
                c.b.push(Inst::Bra(skip, Some((out_r, true))));
                let out_c = c.b.setp(CmpTy::Unsigned, Cmp::Ge, col, nn);
                c.b.push(Inst::Bra(skip, Some((out_c, true))));
                let o = (g.out_index)(c, bi, row, col);
                finish(c, o, accs[(i * MICRO + j) as usize])?;
                c.b.place(skip);
            }
        }
        Ok(())
    })?;
    Ok(tiles)
}

/// The epilogue of library kernel `kd` (its ops after the root, whose result `r` is the
/// GEMM's accumulator) over output shape `out`: its operands, loaded here once where scalar,
/// and a `finish(c, out_index, acc)` that runs it and stores the kernel's outputs.
fn epilogue<'a>(
    c: &mut Ctx,
    f: &'a Function,
    kd: &'a KernelData,
    r: Value,
    out: &[u64],
) -> Result<impl Fn(&mut Ctx, Reg, Reg) -> Result<(), String> + use<'a>, String> {
    let epi = &kd.ops[1..];
    let epi_in: Vec<Value> = (kd.inputs.iter())
        .copied()
        .filter(|v| epi.iter().any(|&o| f.op(o).args.contains(v)))
        .collect();
    let output = body_of(
        Lane::F32,
        f,
        &epi_in,
        1,
        &[],
        |b, vals, acc| {
            vals.insert(r, acc[0]);
            lower_ops(b, f, epi, vals);
        },
        &kd.outputs,
    );
    let params: Vec<usize> = (epi_in.iter())
        .map(|v| kd.inputs.iter().position(|x| x == v).expect("an input"))
        .collect();
    let ops = c.operands(f, Lane::F32, &epi_in, &params, out)?;
    let n_in = kd.inputs.len();
    Ok(move |c: &mut Ctx, o: Reg, acc: Reg| {
        let mut args = c.load(&ops, o);
        args.push(acc);
        let outs = render(&mut c.b, &output, &args)?;
        c.store(f, &output, &outs, &kd.outputs, n_in, o)
    })
}

/// Matmul kernel `kd` of `f` (`[B..., m, k] @ [B..., k, n]`, batch dims broadcasting, f32),
/// with the elementwise epilogue the plan fused into it, named `name`, on the tiled kernel
/// ([`gemm`]). `ta` (`tb`): the left (right) operand is a transpose the plan folded, read from
/// its source with swapped strides.
pub fn matmul(
    f: &Function,
    kd: &KernelData,
    (ta, tb): (bool, bool),
    name: String,
) -> Result<Lowered, String> {
    let d = f.op(kd.ops[0]);
    let (a, b, r) = (d.args[0], d.args[1], d.results[0]);
    if [a, b, r].iter().any(|&v| f.ty(v).dtype() != DType::F32) {
        return Err("only f32 matmuls have a GPU kernel so far".into());
    }
    let (ad, bd, od) = (f.ty(a).dims(), f.ty(b).dims(), f.ty(r).dims().to_vec());
    let (m, k, n) = (ad[ad.len() - 2], ad[ad.len() - 1], bd[bd.len() - 1]);
    let batch = od[..od.len() - 2].to_vec();
    // Each operand's stride per output batch dimension (0 where it broadcasts).
    let strides = |dims: &[u64]| -> Vec<u64> {
        let own = &dims[..dims.len() - 2];
        let mut st = vec![0u64; batch.len()];
        let mut s = 1;
        for (i, &dd) in own.iter().enumerate().rev() {
            let o = batch.len() - own.len() + i;
            st[o] = if dd == 1 { 0 } else { s };
            s *= dd;
        }
        st
    };
    let (sa, sb) = (strides(ad), strides(bd));
    let numel = |v: Value| f.ty(v).numel();
    let param = |v: &Value| kd.inputs.iter().position(|x| x == v).expect("an input");
    let mut c = Ctx::new(
        name,
        (kd.inputs.len() + kd.outputs.len()) as u32,
        BLOCK,
        numel(a)
            .max(numel(b))
            .max(numel(r))
            .max(numel(r) / m.max(1)),
    );
    let finish = epilogue(&mut c, f, kd, r, &od)?;
    let (a_base, b_base) = (c.bases[param(&a)], c.bases[param(&b)]);
    // The batch's offsets into A and B (broadcast dimensions stride 0).
    let offset = |c: &mut Ctx, bi: Reg, st: &[u64], size: u64| {
        let mut acc = c.n(0);
        let mut inner = 1u64;
        for (&extent, &stride) in batch.iter().zip(st).rev() {
            if stride != 0 {
                let q = c.op_n(IOp::DivU, bi, inner);
                let coord = c.op_n(IOp::RemU, q, extent);
                let s = c.n(stride * size);
                let sum = c.b.reg(c.it);
                c.b.push(Inst::IMad(sum, coord, s, acc));
                acc = sum;
            }
            inner *= extent;
        }
        acc
    };
    let offsets = |c: &mut Ctx, bi: Reg| (offset(c, bi, &sa, m * k), offset(c, bi, &sb, k * n));
    let load_a = |c: &mut Ctx, off: Reg, row: Reg, col: Reg| {
        load_clamped(c, a_base, off, (row, col), (m, k), ta, true)
    };
    let load_b = |c: &mut Ctx, off: Reg, row: Reg, col: Reg| {
        load_clamped(c, b_base, off, (row, col), (k, n), tb, false)
    };
    let out_index = |c: &mut Ctx, bi: Reg, row: Reg, col: Reg| {
        let base = c.op_n(IOp::Mul, bi, m * n);
        let nn = c.n(n);
        let s = c.b.reg(c.it);
        c.b.push(Inst::IMad(s, row, nn, base));
        c.b.ibin(IOp::Add, s, col)
    };
    let g = Gemm {
        m,
        n,
        k,
        batches: batch.iter().product(),
        offsets: &offsets,
        load_a: &load_a,
        load_b: &load_b,
        out_index: &out_index,
    };
    let tiles = gemm(&mut c, &g, &finish)?;
    Ok(c.finish(tiles))
}

/// Convolution kernel `kd` of `f` (`conv2d` over NCHW in f32, any stride, padding, dilation
/// and groups, with its fused epilogue), named `name`, as an implicit GEMM on the tiled kernel
/// ([`gemm`]): per group, A is the group's filters as `OC/g x (C/g)·KH·KW` and B the input
/// windows as `(C/g)·KH·KW x N·OH·OW`, each element of B read from the input where the window
/// lies inside it and 0 in the padding; no columns are materialised.
pub fn conv2d(f: &Function, kd: &KernelData, name: String) -> Result<Lowered, String> {
    let d = f.op(kd.ops[0]);
    let OpKind::Conv2d(cv) = &d.kind else {
        return Err("not a conv2d".into());
    };
    let (x, w, y) = (d.args[0], d.args[1], d.results[0]);
    if [x, w, y].iter().any(|&v| f.ty(v).dtype() != DType::F32) {
        return Err("only f32 convolutions have a GPU kernel so far".into());
    }
    let (xd, wd, yd) = (f.ty(x).dims(), f.ty(w).dims(), f.ty(y).dims().to_vec());
    let (nb, ch, h, wi) = (xd[0], xd[1], xd[2], xd[3]);
    let (oc, kh, kw) = (wd[0], wd[2], wd[3]);
    let (oh, ow) = (yd[2], yd[3]);
    let groups = cv.groups.max(1);
    let (cg, og) = (ch / groups, oc / groups);
    let k = cg * kh * kw;
    let cols = nb * oh * ow;
    let param = |v: &Value| kd.inputs.iter().position(|q| q == v).expect("an input");
    let numel = |v: Value| f.ty(v).numel();
    let mut c = Ctx::new(
        name,
        (kd.inputs.len() + kd.outputs.len()) as u32,
        BLOCK,
        numel(x).max(numel(w)).max(numel(y)).max(k * cols),
    );
    let finish = epilogue(&mut c, f, kd, y, &yd)?;
    let (x_base, w_base) = (c.bases[param(&x)], c.bases[param(&w)]);
    // The group's filters start at g * og * k; its input channels at g * cg.
    let offsets = |c: &mut Ctx, g: Reg| (c.op_n(IOp::Mul, g, og * k), c.op_n(IOp::Mul, g, cg));
    let load_a = |c: &mut Ctx, off: Reg, row: Reg, col: Reg| {
        load_clamped(c, w_base, off, (row, col), (og, k), false, true)
    };
    let (sh, sw) = (cv.strides[0], cv.strides[1]);
    let (dh, dw) = (cv.dilations[0], cv.dilations[1]);
    let (pt, pl) = (cv.pads[0], cv.pads[1]);
    // B(kk, col): kk = (ic, i, j) of the window, col = (image, oy, ox) of the output;
    // x[image][g*cg + ic][oy*sh - pt + i*dh][ox*sw - pl + j*dw], 0 in the padding and past k.
    let load_b = |c: &mut Ctx, coff: Reg, kk: Reg, col: Reg| {
        let ic = c.op_n(IOp::DivU, kk, kh * kw);
        let r = c.op_n(IOp::RemU, kk, kh * kw);
        let i = c.op_n(IOp::DivU, r, kw);
        let j = c.op_n(IOp::RemU, r, kw);
        let img = c.op_n(IOp::DivU, col, oh * ow);
        let p = c.op_n(IOp::RemU, col, oh * ow);
        let oy = c.op_n(IOp::DivU, p, ow);
        let ox = c.op_n(IOp::RemU, p, ow);
        // Input row and column, wrapping below 0 to values past the extent (unsigned).
        let at = |c: &mut Ctx, o: Reg, s: u64, t: Reg, dil: u64, pad: u64| {
            let a = c.op_n(IOp::Mul, o, s);
            let b = c.op_n(IOp::Mul, t, dil);
            let sum = c.b.ibin(IOp::Add, a, b);
            c.op_n(IOp::Sub, sum, pad)
        };
        let iy = at(c, oy, sh, i, dh, pt);
        let ix = at(c, ox, sw, j, dw, pl);
        let (hn, wn, kn, cn) = (c.n(h), c.n(wi), c.n(k), c.n(cols));
        let outside = [(iy, hn), (ix, wn), (kk, kn), (col, cn)]
            .into_iter()
            .map(|(v, n)| c.b.setp(CmpTy::Unsigned, Cmp::Ge, v, n))
            .collect::<Vec<_>>();
        // Flat input index ((img * C + g*cg + ic) * H + iy) * W + ix, 0 where outside.
        let chan = c.b.ibin(IOp::Add, coff, ic);
        let plane = c.mad_n(img, ch, chan);
        let rowi = {
            let s = c.b.reg(c.it);
            c.b.push(Inst::IMad(s, plane, hn, iy));
            s
        };
        let idx = {
            let s = c.b.reg(c.it);
            c.b.push(Inst::IMad(s, rowi, wn, ix));
            s
        };
        c.load_where(x_base, idx, &outside)
    };
    // Output (g, row, col) is y[image][g*og + row][oy][ox].
    let out_index = |c: &mut Ctx, g: Reg, row: Reg, col: Reg| {
        let img = c.op_n(IOp::DivU, col, oh * ow);
        let p = c.op_n(IOp::RemU, col, oh * ow);
        let ch = c.mad_n(g, og, row);
        let plane = c.mad_n(img, oc, ch);
        let hw = c.n(oh * ow);
        let s = c.b.reg(c.it);
        c.b.push(Inst::IMad(s, plane, hw, p));
        s
    };
    let g = Gemm {
        m: og,
        n: cols,
        k,
        batches: groups,
        offsets: &offsets,
        load_a: &load_a,
        load_b: &load_b,
        out_index: &out_index,
    };
    let tiles = gemm(&mut c, &g, &finish)?;
    Ok(c.finish(tiles))
}

/// The two convolution gradients, each an implicit GEMM per group on the tiled kernel, with
/// the epilogue the plan fused: `conv2d_grad_filter(x, dy)` as `dy (OC/g x N·OH·OW)` times the
/// input's windows (`N·OH·OW x (C/g)·KH·KW`), and `conv2d_grad_input(dy, w)` as the filters
/// transposed (`C/g x (OC/g)·KH·KW`) times `dy` gathered back through the windows
/// (`(OC/g)·KH·KW x N·H·W`: the output position each input position and tap came from, 0
/// where the stride skips it or it falls outside).
pub fn conv2d_grad(f: &Function, kd: &KernelData, name: String) -> Result<Lowered, String> {
    let d = f.op(kd.ops[0]);
    let (cv, filter) = match &d.kind {
        OpKind::Conv2dGradFilter { conv, .. } => (conv, true),
        OpKind::Conv2dGradInput { conv, .. } => (conv, false),
        _ => return Err("not a convolution gradient".into()),
    };
    let r = d.results[0];
    if (d.args.iter().chain(&d.results)).any(|&v| f.ty(v).dtype() != DType::F32) {
        return Err("only f32 convolution gradients have a GPU kernel".into());
    }
    // The forward op's input, filter and output dims.
    let (xd, wd, yd) = if filter {
        (
            f.ty(d.args[0]).dims(),
            f.ty(r).dims(),
            f.ty(d.args[1]).dims(),
        )
    } else {
        (
            f.ty(r).dims(),
            f.ty(d.args[1]).dims(),
            f.ty(d.args[0]).dims(),
        )
    };
    let (nb, ch, h, wi) = (xd[0], xd[1], xd[2], xd[3]);
    let (oc, kh, kw) = (wd[0], wd[2], wd[3]);
    let (oh, ow) = (yd[2], yd[3]);
    let groups = cv.groups.max(1);
    let (cg, og) = (ch / groups, oc / groups);
    let (sh, sw) = (cv.strides[0], cv.strides[1]);
    let (dh, dw) = (cv.dilations[0], cv.dilations[1]);
    let (pt, pl) = (cv.pads[0], cv.pads[1]);
    let taps = kh * kw;
    let param = |v: &Value| kd.inputs.iter().position(|q| q == v).expect("an input");
    let numel = |v: Value| f.ty(v).numel();
    let biggest = (d.args.iter().chain(&d.results))
        .map(|&v| numel(v))
        .max()
        .unwrap_or(0)
        .max(nb * oh * ow * cg * taps)
        .max(og * taps * nb * h * wi);
    let mut c = Ctx::new(
        name,
        (kd.inputs.len() + kd.outputs.len()) as u32,
        BLOCK,
        biggest,
    );
    let out_dims = f.ty(r).dims().to_vec();
    let finish = epilogue(&mut c, f, kd, r, &out_dims)?;
    let (b0, b1) = (c.bases[param(&d.args[0])], c.bases[param(&d.args[1])]);
    let g = if filter {
        // A(row, kk) = dy[img][g*og + row][oy][ox], kk = (img, oy, ox).
        let dy = b1;
        let x = b0;
        let k = nb * oh * ow;
        let load_a = move |c: &mut Ctx, goff: Reg, row: Reg, kk: Reg| {
            let img = c.op_n(IOp::DivU, kk, oh * ow);
            let p = c.op_n(IOp::RemU, kk, oh * ow);
            let ch_ = c.b.ibin(IOp::Add, goff, row);
            let plane = c.mad_n(img, oc, ch_);
            let idx = c.mad_n(plane, oh * ow, p);
            let kn = c.n(k);
            let mn = c.n(og);
            let past_k = c.b.setp(CmpTy::Unsigned, Cmp::Ge, kk, kn);
            let past_m = c.b.setp(CmpTy::Unsigned, Cmp::Ge, row, mn);
            c.load_where(dy, idx, &[past_k, past_m])
        };
        // B(kk, col) = x[img][g*cg + ic][oy*sh - pt + ky*dh][ox*sw - pl + kx*dw], col = (ic,
        // ky, kx).
        let load_b = move |c: &mut Ctx, coff: Reg, kk: Reg, col: Reg| {
            let img = c.op_n(IOp::DivU, kk, oh * ow);
            let p = c.op_n(IOp::RemU, kk, oh * ow);
            let oy = c.op_n(IOp::DivU, p, ow);
            let ox = c.op_n(IOp::RemU, p, ow);
            let ic = c.op_n(IOp::DivU, col, taps);
            let t = c.op_n(IOp::RemU, col, taps);
            let ky = c.op_n(IOp::DivU, t, kw);
            let kx = c.op_n(IOp::RemU, t, kw);
            let at = |c: &mut Ctx, o: Reg, s: u64, k: Reg, dil: u64, pad: u64| {
                let a = c.op_n(IOp::Mul, o, s);
                let sum = c.mad_n(k, dil, a);
                c.op_n(IOp::Sub, sum, pad)
            };
            let iy = at(c, oy, sh, ky, dh, pt);
            let ix = at(c, ox, sw, kx, dw, pl);
            let chan = c.b.ibin(IOp::Add, coff, ic);
            let plane = c.mad_n(img, ch, chan);
            let rowi = c.mad_n(plane, h, iy);
            let idx = c.mad_n(rowi, wi, ix);
            let outside = [(iy, h), (ix, wi), (kk, k), (col, cg * taps)]
                .into_iter()
                .map(|(v, n)| {
                    let nn = c.n(n);
                    c.b.setp(CmpTy::Unsigned, Cmp::Ge, v, nn)
                })
                .collect::<Vec<_>>();
            c.load_where(x, idx, &outside)
        };
        (
            k,
            Box::new(load_a) as Box<dyn Fn(&mut Ctx, Reg, Reg, Reg) -> Reg>,
            Box::new(load_b) as Box<dyn Fn(&mut Ctx, Reg, Reg, Reg) -> Reg>,
        )
    } else {
        let (dy, w) = (b0, b1);
        let k = og * taps;
        // A(row, kk) = w[g*og + o][row][ky][kx], kk = (o, ky, kx).
        let load_a = move |c: &mut Ctx, goff: Reg, row: Reg, kk: Reg| {
            let o = c.op_n(IOp::DivU, kk, taps);
            let t = c.op_n(IOp::RemU, kk, taps);
            let filt = c.b.ibin(IOp::Add, goff, o);
            let plane = c.mad_n(filt, cg, row);
            let idx = c.mad_n(plane, taps, t);
            let kn = c.n(k);
            let mn = c.n(cg);
            let past_k = c.b.setp(CmpTy::Unsigned, Cmp::Ge, kk, kn);
            let past_m = c.b.setp(CmpTy::Unsigned, Cmp::Ge, row, mn);
            c.load_where(w, idx, &[past_k, past_m])
        };
        // B(kk, col) = dy[img][g*og + o][oy][ox] where oy*sh = iy + pt - ky*dh (and the same
        // across), col = (img, iy, ix); 0 where that is not a whole output position.
        let load_b = move |c: &mut Ctx, goff: Reg, kk: Reg, col: Reg| {
            let o = c.op_n(IOp::DivU, kk, taps);
            let t = c.op_n(IOp::RemU, kk, taps);
            let ky = c.op_n(IOp::DivU, t, kw);
            let kx = c.op_n(IOp::RemU, t, kw);
            let img = c.op_n(IOp::DivU, col, h * wi);
            let p = c.op_n(IOp::RemU, col, h * wi);
            let iy = c.op_n(IOp::DivU, p, wi);
            let ix = c.op_n(IOp::RemU, p, wi);
            // iy + pad - k*dil, wrapping below zero to values past the range.
            let back = |c: &mut Ctx, i: Reg, pad: u64, k: Reg, dil: u64| {
                let a = c.op_n(IOp::Add, i, pad);
                let kd_ = c.op_n(IOp::Mul, k, dil);
                c.b.ibin(IOp::Sub, a, kd_)
            };
            let ty = back(c, iy, pt, ky, dh);
            let tx = back(c, ix, pl, kx, dw);
            let oy = c.op_n(IOp::DivU, ty, sh);
            let ox = c.op_n(IOp::DivU, tx, sw);
            let ry = c.op_n(IOp::RemU, ty, sh);
            let rx = c.op_n(IOp::RemU, tx, sw);
            let chan = c.b.ibin(IOp::Add, goff, o);
            let plane = c.mad_n(img, oc, chan);
            let rowi = c.mad_n(plane, oh, oy);
            let idx = c.mad_n(rowi, ow, ox);
            let zero = c.n(0);
            let mut outside = [(ty, oh * sh), (tx, ow * sw), (kk, k), (col, nb * h * wi)]
                .into_iter()
                .map(|(v, n)| {
                    let nn = c.n(n);
                    c.b.setp(CmpTy::Unsigned, Cmp::Ge, v, nn)
                })
                .collect::<Vec<_>>();
            for rem in [ry, rx] {
                outside.push(c.b.setp(CmpTy::Unsigned, Cmp::Ne, rem, zero));
            }
            c.load_where(dy, idx, &outside)
        };
        (
            k,
            Box::new(load_a) as Box<dyn Fn(&mut Ctx, Reg, Reg, Reg) -> Reg>,
            Box::new(load_b) as Box<dyn Fn(&mut Ctx, Reg, Reg, Reg) -> Reg>,
        )
    };
    let (k, load_a, load_b) = g;
    // Per group: A's channel offset (dy's or the filters'), B's (x's or dy's).
    let offsets = move |c: &mut Ctx, gi: Reg| {
        if filter {
            (c.op_n(IOp::Mul, gi, og), c.op_n(IOp::Mul, gi, cg))
        } else {
            let a = c.op_n(IOp::Mul, gi, og);
            (a, a)
        }
    };
    let (m, n) = if filter {
        (og, cg * taps)
    } else {
        (cg, nb * h * wi)
    };
    // Output (g, row, col): dw[g*og + row][col] or dx[img][g*cg + row][iy][ix].
    let out_index = move |c: &mut Ctx, gi: Reg, row: Reg, col: Reg| {
        if filter {
            let o = c.mad_n(gi, og, row);
            c.mad_n(o, cg * taps, col)
        } else {
            let img = c.op_n(IOp::DivU, col, h * wi);
            let p = c.op_n(IOp::RemU, col, h * wi);
            let chan = c.mad_n(gi, cg, row);
            let plane = c.mad_n(img, ch, chan);
            c.mad_n(plane, h * wi, p)
        }
    };
    let gemm_spec = Gemm {
        m,
        n,
        k,
        batches: groups,
        offsets: &offsets,
        load_a: &*load_a,
        load_b: &*load_b,
        out_index: &out_index,
    };
    let tiles = gemm(&mut c, &gemm_spec, &finish)?;
    Ok(c.finish(tiles))
}

/// Element `(r, c)` of an `rows x cols` matrix at `base + off` (row-major, or with `t` its
/// transpose's source, read with swapped strides). The indices are clamped into range, so the
/// load never leaves the buffer; where the index along `k` (`c` for A, `r` for B: `k_is_col`)
/// is outside, the value is 0, so that the slice's tail adds nothing (not even an infinity
/// times 0). Rows of A past `m` and columns of B past `n` only feed outputs never stored.
fn load_clamped(
    c: &mut Ctx,
    base: Reg,
    off: Reg,
    (r, col): (Reg, Reg),
    (rows, cols): (u64, u64),
    t: bool,
    k_is_col: bool,
) -> Reg {
    let (rmax, cmax) = (c.n(rows.saturating_sub(1)), c.n(cols.saturating_sub(1)));
    let rc = c.b.ibin(IOp::MinS, r, rmax);
    let cc = c.b.ibin(IOp::MinS, col, cmax);
    let s = c.b.reg(c.it);
    if t {
        // The source is cols x rows.
        let nr = c.n(rows);
        c.b.push(Inst::IMad(s, cc, nr, rc));
    } else {
        let nc = c.n(cols);
        c.b.push(Inst::IMad(s, rc, nc, cc));
    }
    let idx = c.b.ibin(IOp::Add, s, off);
    let addr = c.address(base, idx, Mem::B32);
    let v = c.b.ld(Space::Global, Mem::B32, RegTy::F32, addr);
    let (along, extent) = if k_is_col { (col, cols) } else { (r, rows) };
    let kn = c.n(extent);
    let past = c.b.setp(CmpTy::Unsigned, Cmp::Ge, along, kn);
    let zero = c.b.imm(RegTy::F32, 0);
    c.b.selp(zero, v, past)
}

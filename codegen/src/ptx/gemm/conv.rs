//! Convolutions and both convolution gradients as implicit GEMMs on the tiled kernel: the
//! filters as one matrix, the input's windows (or the output gradient gathered back through
//! them) as the other, never materialised.

use super::{
    Gemm, GemmTiles, Side, Src, Store, Tiling, byte_mem, epilogue, gemm, load_level, lower_product,
    matrix,
};
use crate::plan::KernelData;
use crate::ptx::lower::{BLOCK, Ctx, Lowered};
use crate::ptx::prog::{Cmp, CmpTy, IOp, Inst, Mem, Reg, RegTy, Space};
use tcc_ir::{DType, Function, OpKind, Value};

/// Convolution kernel `kd` of `f` (`conv2d` over NCHW in f32, any stride, padding, dilation
/// and groups, with its fused epilogue), named `name`, as an implicit GEMM on the tiled kernel
/// ([`gemm`]): per group, A is the group's filters as `OC/g x (C/g)·KH·KW` and B the input
/// windows as `(C/g)·KH·KW x N·OH·OW`, each element of B read from the input where the window
/// lies inside it and 0 in the padding; no columns are materialised.
pub fn conv2d(
    f: &Function,
    kd: &KernelData,
    tiles: GemmTiles,
    name: String,
) -> Result<Lowered, String> {
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
    let index = numel(x).max(numel(w)).max(numel(y)).max(k * cols);
    let (xp, wp) = (param(&x), param(&w));
    // The group's filters start at g * og * k; its input channels at g * cg.
    let offsets = |c: &mut Ctx, g: Reg| (c.op_n(IOp::Mul, g, og * k), c.op_n(IOp::Mul, g, cg));
    let load_a = |c: &mut Ctx, off: Reg, row: Reg, col: Reg| {
        let w_base = c.bases[wp];
        matrix(c, w_base, off, (row, col), (og, k), false)
    };
    let (sh, sw) = (cv.strides[0], cv.strides[1]);
    let (dh, dw) = (cv.dilations[0], cv.dilations[1]);
    let (pt, pl) = (cv.pads[0], cv.pads[1]);
    // B(kk, col): kk = (ic, i, j) of the window, col = (image, oy, ox) of the output;
    // x[image][g*cg + ic][oy*sh - pt + i*dh][ox*sw - pl + j*dw], 0 in the padding and past k.
    let load_b = |c: &mut Ctx, coff: Reg, kk: Reg, col: Reg| {
        let x_base = c.bases[xp];
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
        let outside = c.outside(&[(iy, h), (ix, wi), (kk, k), (col, cols)]);
        let (hn, wn) = (c.n(h), c.n(wi));
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
        Src {
            base: x_base,
            idx,
            zero_if: outside,
        }
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
        a: Side {
            at: &load_a,
            k_fast: true,
            vec: false,
        },
        // Consecutive output positions read (mostly) consecutive input columns.
        b: Side {
            at: &load_b,
            k_fast: false,
            vec: false,
        },
        out_index: &out_index,
    };
    lower_product(name, f, kd, (y, &yd), index, tiles, &g)
}

/// The two convolution gradients, each an implicit GEMM per group on the tiled kernel, with
/// the epilogue the plan fused: `conv2d_grad_filter(x, dy)` as `dy (OC/g x N·OH·OW)` times the
/// input's windows (`N·OH·OW x (C/g)·KH·KW`), and `conv2d_grad_input(dy, w)` as the filters
/// transposed (`C/g x (OC/g)·KH·KW`) times `dy` gathered back through the windows
/// (`(OC/g)·KH·KW x N·H·W`: the output position each input position and tap came from, 0
/// where the stride skips it or it falls outside).
pub fn conv2d_grad(
    f: &Function,
    kd: &KernelData,
    tiles: GemmTiles,
    name: String,
) -> Result<Lowered, String> {
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
            Src {
                base: dy,
                idx,
                zero_if: c.outside(&[(kk, k), (row, og)]),
            }
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
            let outside = c.outside(&[(iy, h), (ix, wi), (kk, k), (col, cg * taps)]);
            Src {
                base: x,
                idx,
                zero_if: outside,
            }
        };
        (
            k,
            Box::new(load_a) as Box<dyn Fn(&mut Ctx, Reg, Reg, Reg) -> Src>,
            Box::new(load_b) as Box<dyn Fn(&mut Ctx, Reg, Reg, Reg) -> Src>,
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
            Src {
                base: w,
                idx,
                zero_if: c.outside(&[(kk, k), (row, cg)]),
            }
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
            let mut outside =
                c.outside(&[(ty, oh * sh), (tx, ow * sw), (kk, k), (col, nb * h * wi)]);
            for rem in [ry, rx] {
                outside.push(c.b.setp(CmpTy::Unsigned, Cmp::Ne, rem, zero));
            }
            Src {
                base: dy,
                idx,
                zero_if: outside,
            }
        };
        (
            k,
            Box::new(load_a) as Box<dyn Fn(&mut Ctx, Reg, Reg, Reg) -> Src>,
            Box::new(load_b) as Box<dyn Fn(&mut Ctx, Reg, Reg, Reg) -> Src>,
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
        // Along `k` both walk output positions (the filter's gradient) or filter taps (the
        // input's), the nearest elements; the input's gradient's B walks input positions.
        a: Side {
            at: &*load_a,
            k_fast: true,
            vec: false,
        },
        b: Side {
            at: &*load_b,
            k_fast: filter,
            vec: false,
        },
        out_index: &out_index,
    };
    let t = Tiling::choose(tiles, (m, n, k, groups), false);
    let tiles = gemm(&mut c, &gemm_spec, t, &Store::Epilogue(&finish))?;
    Ok(c.finish(tiles))
}

/// `conv_integer` kernel `kd` of `f`: a thread per output, summing `(x - x_zero)(w - w_zero)`
/// over its taps in i32 (wrapping), the channel loop at run time and the window unrolled; taps
/// in the padding add nothing (they stand for the zero point). Not yet on the tiled kernel
/// (nor `dp4a`).
pub fn conv_integer(f: &Function, kd: &KernelData, name: String) -> Result<Lowered, String> {
    let d = f.op(kd.ops[0]);
    let (OpKind::ConvInteger(cv), &[x, w, xz, wz]) = (&d.kind, &d.args[..]) else {
        return Err("not a conv_integer".into());
    };
    let r = d.results[0];
    let d4 = |v: Value| -> [u64; 4] { std::array::from_fn(|i| f.ty(v).dims()[i]) };
    let ([_, ch, h, wd], [o, cg, kh, kw], [_, _, oh, ow]) = (d4(x), d4(w), d4(r));
    let outputs = f.ty(r).numel();
    let og = o / cv.groups;
    let mut c = Ctx::new(
        name,
        (kd.inputs.len() + kd.outputs.len()) as u32,
        BLOCK,
        outputs.max(f.ty(x).numel()).max(f.ty(w).numel()),
    );
    let base = |c: &Ctx, v: Value| c.bases[kd.inputs.iter().position(|&i| i == v).expect("input")];
    let out = c.bases[kd.inputs.len()
        + (kd.outputs.iter().position(|&v| v == r)).ok_or("the result is not stored")?];
    let mem = |v: Value| byte_mem(f, v);
    let (xb, wb, xzb, wzb) = (base(&c, x), base(&c, w), base(&c, xz), base(&c, wz));
    let per_channel = f.ty(wz).numel() > 1;
    c.grid_stride(outputs, |c, i| {
        let ox = c.op_n(IOp::RemU, i, ow);
        let t = c.op_n(IOp::DivU, i, ow);
        let oy = c.op_n(IOp::RemU, t, oh);
        let t = c.op_n(IOp::DivU, t, oh);
        let oc = c.op_n(IOp::RemU, t, o);
        let b = c.op_n(IOp::DivU, t, o);
        let zero_idx = c.n(0);
        let x_zero = load_level(c, xzb, zero_idx, mem(xz));
        let w_zero = load_level(c, wzb, if per_channel { oc } else { zero_idx }, mem(wz));
        // The group's first input plane, and the window's top-left corner (wrapping below
        // zero, where the unsigned bounds test counts it as outside).
        let g = c.op_n(IOp::DivU, oc, og);
        let first = c.mad_n(b, ch / cg, g);
        let plane0 = c.op_n(IOp::Mul, first, cg);
        let y0 = c.op_n(IOp::Mul, oy, cv.strides[0]);
        let pt = c.n(cv.pads[0]);
        let y0 = c.b.ibin(IOp::Sub, y0, pt);
        let x0 = c.op_n(IOp::Mul, ox, cv.strides[1]);
        let pl = c.n(cv.pads[1]);
        let x0 = c.b.ibin(IOp::Sub, x0, pl);
        let acc = c.b.reg(RegTy::I32);
        let zero = c.b.imm(RegTy::I32, 0);
        c.b.push(Inst::Mov(acc, zero));
        let ci = c.b.reg(c.it);
        c.b.push(Inst::Mov(ci, zero_idx));
        let (count, one) = (c.n(cg), c.n(1));
        c.for_loop(ci, count, one, |c| {
            let plane = c.b.ibin(IOp::Add, plane0, ci);
            let filter = c.mad_n(oc, cg, ci);
            for ky in 0..kh {
                let iy = c.op_n(IOp::Add, y0, ky * cv.dilations[0]);
                for kx in 0..kw {
                    let ix = c.op_n(IOp::Add, x0, kx * cv.dilations[1]);
                    let outside = c.outside(&[(iy, h), (ix, wd)]);
                    let row = c.mad_n(plane, h, iy);
                    let mut at = c.mad_n(row, wd, ix);
                    for &p in &outside {
                        at = c.b.selp(zero_idx, at, p);
                    }
                    let xv = load_level(c, xb, at, mem(x));
                    let mut dx = c.b.ibin(IOp::Sub, xv, x_zero);
                    for &p in &outside {
                        dx = c.b.selp(zero, dx, p);
                    }
                    let (ky_, kx_) = (c.n(ky), c.n(kx));
                    let tap = c.mad_n(filter, kh, ky_);
                    let wi = c.mad_n(tap, kw, kx_);
                    let wv = load_level(c, wb, wi, mem(w));
                    let dw = c.b.ibin(IOp::Sub, wv, w_zero);
                    c.b.push(Inst::IMad(acc, dx, dw, acc));
                }
            }
            Ok(())
        })?;
        let addr = c.address(out, i, Mem::B32);
        c.b.push(Inst::St(Space::Global, Mem::B32, addr, acc));
        Ok(())
    })?;
    Ok(c.finish(outputs.div_ceil(BLOCK as u64)))
}

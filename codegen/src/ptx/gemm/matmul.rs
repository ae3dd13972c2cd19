//! Matmuls on the tiled kernel (operands as matrices, folded transposes read with swapped
//! strides, batches broadcast), and the integer product `matmul_integer`.

use super::{Gemm, GemmTiles, Side, byte_mem, load_level, lower_product, matrix};
use crate::plan::KernelData;
use crate::ptx::lower::{BLOCK, Ctx, Lowered};
use crate::ptx::prog::{IOp, Inst, Mem, Reg, RegTy, Space};
use tcc_ir::{DType, Function, Value};

/// Matmul kernel `kd` of `f` (`[B..., m, k] @ [B..., k, n]`, batch dims broadcasting, f32),
/// with the elementwise epilogue the plan fused into it, named `name`, on the tiled kernel
/// ([`gemm`]). `ta` (`tb`): the left (right) operand is a transpose the plan folded, read from
/// its source with swapped strides.
pub fn matmul(
    f: &Function,
    kd: &KernelData,
    (ta, tb): (bool, bool),
    tiles: GemmTiles,
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
    // Each operand's stride per output batch dimension, in matrices (0 where it broadcasts).
    let strides = |dims: &[u64]| broadcast_strides(&dims[..dims.len() - 2], batch.len());
    let (sa, sb) = (strides(ad), strides(bd));
    let numel = |v: Value| f.ty(v).numel();
    let param = |v: &Value| kd.inputs.iter().position(|x| x == v).expect("an input");
    let index = (numel(a).max(numel(b)).max(numel(r))).max(numel(r) / m.max(1));
    let (ap, bp) = (param(&a), param(&b));
    // The batch's offsets into A and B (broadcast dimensions stride 0).
    let offsets = |c: &mut Ctx, bi: Reg| {
        (
            batch_offset(c, &batch, bi, &sa, m * k),
            batch_offset(c, &batch, bi, &sb, k * n),
        )
    };
    let load_a = |c: &mut Ctx, off: Reg, row: Reg, col: Reg| {
        let a_base = c.bases[ap];
        matrix(c, a_base, off, (row, col), (m, k), ta)
    };
    let load_b = |c: &mut Ctx, off: Reg, row: Reg, col: Reg| {
        let b_base = c.bases[bp];
        matrix(c, b_base, off, (row, col), (k, n), tb)
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
        // A transposed source is `k x m`: runs along `m` are contiguous, as in B along `n`.
        a: Side {
            at: &load_a,
            k_fast: !ta,
            vec: ta && m % 4 == 0,
        },
        b: Side {
            at: &load_b,
            k_fast: tb,
            vec: !tb && n % 4 == 0,
        },
        out_index: &out_index,
    };
    lower_product(name, f, kd, (r, &od), index, tiles, &g)
}

/// `matmul_integer` kernel `kd` of `f` (u8/i8 operands with zero points broadcast to them,
/// batch dims broadcasting, an i32 result), named `name`: a thread per output, which
/// accumulates `(a - a_zero) * (b - b_zero)` along `k` in order, in i32 (wrapping), as the
/// interpreter does. Not tiled: the 8-bit GEMM (`dp4a`) is still to come.
pub fn matmul_integer(f: &Function, kd: &KernelData, name: String) -> Result<Lowered, String> {
    let d = f.op(kd.ops[0]);
    let [a, b, za, zb] = d.args[..] else {
        return Err("not a matmul_integer".into());
    };
    let r = d.results[0];
    let (ad, bd, od) = (f.ty(a).dims(), f.ty(b).dims(), f.ty(r).dims().to_vec());
    let (m, k, n) = (ad[ad.len() - 2], ad[ad.len() - 1], bd[bd.len() - 1]);
    let batch = &od[..od.len() - 2];
    let outputs: u64 = od.iter().product();
    let numel = |v: Value| f.ty(v).numel();
    let mut c = Ctx::new(
        name,
        (kd.inputs.len() + kd.outputs.len()) as u32,
        BLOCK,
        outputs.max(numel(a)).max(numel(b)),
    );
    let base =
        |c: &Ctx, v: Value| c.bases[kd.inputs.iter().position(|&x| x == v).expect("an input")];
    let out = c.bases[kd.inputs.len()
        + kd.outputs
            .iter()
            .position(|&x| x == r)
            .ok_or("the result is not stored")?];
    let mem = |v: Value| byte_mem(f, v);
    // Each operand's (and zero point's) strides over the output's batch axes, its row and its
    // column: the operand's over its own axes, a zero point's over its operand's.
    let layout = |v: Value, z: Value| {
        let own = f.ty(v).dims();
        let of_v = broadcast_strides(own, own.len());
        let of_z = broadcast_strides(f.ty(z).dims(), own.len());
        let lift = |st: &[u64]| {
            let mut out = vec![0u64; batch.len()];
            for (i, &s) in st[..own.len() - 2].iter().enumerate() {
                out[batch.len() - (own.len() - 2) + i] = s;
            }
            (out, st[own.len() - 2], st[own.len() - 1])
        };
        (lift(&of_v), lift(&of_z))
    };
    let (la, lza) = layout(a, za);
    let (lb, lzb) = layout(b, zb);
    let (a_base, b_base, za_base, zb_base) = (base(&c, a), base(&c, b), base(&c, za), base(&c, zb));
    c.grid_stride(outputs, |c, o| {
        let bi = c.op_n(IOp::DivU, o, m * n);
        let rest = c.op_n(IOp::RemU, o, m * n);
        let i = c.op_n(IOp::DivU, rest, n);
        let j = c.op_n(IOp::RemU, rest, n);
        // Where row/column `x` (stride `sx`) and depth `p` (stride `sp`) of a layout start.
        let start = |c: &mut Ctx, l: &(Vec<u64>, u64, u64), x: Reg, row: bool| {
            let off = batch_offset(c, batch, bi, &l.0, 1);
            let sx = if row { l.1 } else { l.2 };
            c.mad_n(x, sx, off)
        };
        let (a0, za0) = (start(c, &la, i, true), start(c, &lza, i, true));
        let (b0, zb0) = (start(c, &lb, j, false), start(c, &lzb, j, false));
        let acc = c.b.reg(RegTy::I32);
        let zero = c.b.imm(RegTy::I32, 0);
        c.b.push(Inst::Mov(acc, zero));
        let p = c.b.reg(c.it);
        let (zero_i, one) = (c.n(0), c.n(1));
        c.b.push(Inst::Mov(p, zero_i));
        let kn = c.n(k);
        // Strides along k: A's column, B's row.
        let (sa, sza, sb, szb) = (la.2, lza.2, lb.1, lzb.1);
        c.for_loop(p, kn, one, |c| {
            let elem = |c: &mut Ctx, buf: Reg, at: Reg, stride: u64, mem: Mem| {
                let idx = c.mad_n(p, stride, at);
                load_level(c, buf, idx, mem)
            };
            let x = elem(c, a_base, a0, sa, mem(a));
            let xz = elem(c, za_base, za0, sza, mem(za));
            let y = elem(c, b_base, b0, sb, mem(b));
            let yz = elem(c, zb_base, zb0, szb, mem(zb));
            let dx = c.b.ibin(IOp::Sub, x, xz);
            let dy = c.b.ibin(IOp::Sub, y, yz);
            c.b.push(Inst::IMad(acc, dx, dy, acc));
            Ok(())
        })?;
        let addr = c.address(out, o, Mem::B32);
        c.b.push(Inst::St(Space::Global, Mem::B32, addr, acc));
        Ok(())
    })?;
    Ok(c.finish(outputs.div_ceil(BLOCK as u64)))
}

/// Row-major strides of `dims`, aligned to the last of `rank` axes, 0 where `dims` has 1 or
/// lacks the axis (a broadcast).
fn broadcast_strides(dims: &[u64], rank: usize) -> Vec<u64> {
    let mut st = vec![0u64; rank];
    let mut s = 1;
    for (i, &dd) in dims.iter().enumerate().rev() {
        st[rank - dims.len() + i] = if dd == 1 { 0 } else { s };
        s *= dd;
    }
    st
}

/// The offset of batch `bi` (an index over the output's `batch` axes) in an operand with
/// `strides` over those axes, in elements of `unit` each.
fn batch_offset(c: &mut Ctx, batch: &[u64], bi: Reg, strides: &[u64], unit: u64) -> Reg {
    let mut acc = c.n(0);
    let mut inner = 1u64;
    for (&extent, &stride) in batch.iter().zip(strides).rev() {
        if stride != 0 {
            let q = c.op_n(IOp::DivU, bi, inner);
            let coord = c.op_n(IOp::RemU, q, extent);
            acc = c.mad_n(coord, stride * unit, acc);
        }
        inner *= extent;
    }
    acc
}

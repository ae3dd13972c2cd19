//! Matmuls and convolutions on one tiled GEMM kernel ([`gemm`]): a matmul reads its operands
//! as matrices (transposes the plan folded with swapped strides), a convolution its filters
//! as a matrix and its input's windows as the other (an implicit GEMM).

use super::lower::{BLOCK, Ctx, Lowered, render};
use super::prog::{Cmp, CmpTy, Cvt, IOp, Inst, Mem, Reg, RegTy, Space, Sreg};
use crate::kernel::expr::Lane;
use crate::kernel::lower::{body as body_of, lower_ops};
use crate::plan::KernelData;
use tcc_ir::{DType, Function, OpKind, Value};

/// The depth of the slices of A and B a GEMM block stages in shared memory.
const DEPTH: u64 = 8;

/// Which output tiles GEMM kernels (matmuls, convolutions and their gradients) use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GemmTiles {
    /// By the problem: [`GemmTiles::Large`] where it still gives a block to each SM of an
    /// A100 (108 blocks), else [`GemmTiles::Small`].
    #[default]
    Auto,
    /// 64x64 tiles, a 4x4 block of outputs per thread.
    Small,
    /// 128x128 tiles, an 8x8 block of outputs per thread.
    Large,
}

/// How a GEMM block divides its work: a `bm x bn` output tile per block of 256 threads, a
/// `tm x tn` block of it per thread, in registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Tiling {
    bm: u64,
    bn: u64,
    tm: u64,
    tn: u64,
}

impl Tiling {
    const SMALL: Tiling = Tiling {
        bm: 64,
        bn: 64,
        tm: 4,
        tn: 4,
    };
    const LARGE: Tiling = Tiling {
        bm: 128,
        bn: 128,
        tm: 8,
        tn: 8,
    };

    /// The tiling `tiles` asks for, for `batches` products of `m x n`.
    fn choose(tiles: GemmTiles, m: u64, n: u64, batches: u64) -> Tiling {
        let l = Tiling::LARGE;
        match tiles {
            GemmTiles::Small => Tiling::SMALL,
            GemmTiles::Large => l,
            GemmTiles::Auto => {
                let blocks = batches * m.div_ceil(l.bm) * n.div_ceil(l.bn);
                if m >= l.bm && n >= l.bn && blocks >= 108 {
                    l
                } else {
                    Tiling::SMALL
                }
            }
        }
    }

    /// Bytes of one stage: the `DEPTH x bm` slice of A, then the `DEPTH x bn` slice of B.
    fn stage_bytes(self) -> u64 {
        (self.bm + self.bn) * DEPTH * 4
    }

    /// Where a thread's `i`-th row (of `per` it has, in runs of 4) lies in an `extent`-wide
    /// tile, past the thread's own offset `4 * t`: the runs are `extent * 4 / per` apart, so
    /// that consecutive threads read consecutive 16-byte words of shared memory.
    fn spread(extent: u64, per: u64, i: u64) -> u64 {
        (i / 4) * (extent * 4 / per) + i % 4
    }
}

/// Where a GEMM operand's element is: element `idx` of the buffer at `base`, or 0 where any of
/// `zero_if` holds (outside the matrix: past `k`, which must add nothing, not even an infinity
/// times 0; in a convolution's padding; past `m` or `n`, which feed no output).
pub(super) struct Src {
    base: Reg,
    idx: Reg,
    zero_if: Vec<Reg>,
}

/// An operand's element of a GEMM: given the batch's offset register (from
/// [`Gemm::offsets`]), the row and the column, where it is.
type Load<'a> = &'a dyn Fn(&mut Ctx, Reg, Reg, Reg) -> Src;

/// One operand of a GEMM: where its elements are and how its slices copy best.
struct Side<'a> {
    at: Load<'a>,
    /// Elements consecutive along `k` are the nearest in memory, so the threads copying a
    /// slice walk `k` first (else the other axis: `m` for A, `n` for B).
    k_fast: bool,
    /// Four elements consecutive along the other axis from a multiple of 4 are 16 contiguous
    /// bytes, aligned, all inside the matrix or all outside: a slice copies 16 bytes at a time.
    vec: bool,
}

/// What the tiled kernel ([`gemm`]) multiplies: per batch, an `m x k` A by a `k x n` B, and
/// where output `(batch, row, col)` lives.
struct Gemm<'a> {
    m: u64,
    n: u64,
    k: u64,
    batches: u64,
    /// The batch's offsets for A's and B's elements.
    offsets: &'a dyn Fn(&mut Ctx, Reg) -> (Reg, Reg),
    a: Side<'a>,
    b: Side<'a>,
    /// The flat index of output `(batch, row, col)` in the result.
    out_index: &'a dyn Fn(&mut Ctx, Reg, Reg, Reg) -> Reg,
}

/// Starts the asynchronous copy of `bytes` (4 or 16) from `src` to shared address `dst`,
/// zeros where `src` says (reading from the buffer's start instead, so no address leaves it).
fn copy(c: &mut Ctx, src: &Src, dst: Reg, bytes: u32) {
    let zero_i = c.n(0);
    let zero = c.b.imm(RegTy::I32, 0);
    let mut idx = src.idx;
    let mut fill = c.b.imm(RegTy::I32, bytes as u64);
    for &p in &src.zero_if {
        idx = c.b.selp(zero_i, idx, p);
        fill = c.b.selp(zero, fill, p);
    }
    let addr = c.address(src.base, idx, Mem::B32);
    c.b.push(Inst::CpAsync {
        dst,
        src: addr,
        bytes,
        fill,
    });
}

/// The copies one thread makes of one operand's slice in each step: the first at offsets
/// `kk0` along `k` and `o0` along the other axis within the slice, at byte `at0` of the stage;
/// each at constant offsets from those (so that few registers stay live across the loop); and
/// the predicate that the thread makes none (where the slice has fewer copies than threads).
struct Copies {
    kk0: Reg,
    o0: Reg,
    at0: Reg,
    /// Each copy's offsets along `k` and the other axis from the first's, and in bytes.
    each: Vec<(u64, u64, u64)>,
    idle: Option<Reg>,
    bytes: u32,
}

/// The copies of the `DEPTH x extent` slice of side `s` (at byte `at` of a stage, stored
/// `k`-major: element `(kk, o)` at `kk * extent + o`) that thread `tid` (an index) makes:
/// copy `j` takes element (or 4-element run) `tid + 256 j` of the slice, walking `k` first
/// where that is the operand's nearest axis.
fn copies(c: &mut Ctx, s: &Side, extent: u64, at: u64, tid: Reg) -> Copies {
    let per = if s.vec { 4 } else { 1 };
    let total = DEPTH * extent / per;
    let threads = BLOCK as u64;
    // Runs of `run` elements (or 4-runs) along the walked axis; 256 threads cover whole runs.
    let k_first = s.k_fast && !s.vec;
    let run = if k_first { DEPTH } else { extent / per };
    debug_assert!(threads.is_multiple_of(run), "a block covers whole runs");
    let (kk0, o0) = if k_first {
        (c.op_n(IOp::RemU, tid, DEPTH), c.op_n(IOp::DivU, tid, DEPTH))
    } else {
        let o = c.op_n(IOp::RemU, tid, run);
        (c.op_n(IOp::DivU, tid, run), c.op_n(IOp::Mul, o, per))
    };
    let el = c.mad_n(kk0, extent, o0);
    let el = if c.it == RegTy::I32 {
        c.b.cvt(Cvt::U32ToU64, RegTy::I64, el)
    } else {
        el
    };
    let four = c.b.imm(RegTy::I64, 4);
    let base = c.b.imm(RegTy::I64, at);
    let at0 = c.b.reg(RegTy::I64);
    c.b.push(Inst::IMad(at0, el, four, base));
    let each = (0..total.div_ceil(threads))
        .map(|j| {
            let (dk, d_o) = if k_first {
                (0, j * threads / DEPTH)
            } else {
                (j * threads / run, 0)
            };
            (dk, d_o, 4 * (dk * extent + d_o))
        })
        .collect();
    let idle = (!total.is_multiple_of(threads)).then(|| {
        let t = c.n(total);
        c.b.setp(CmpTy::Unsigned, Cmp::Ge, tid, t)
    });
    Copies {
        kk0,
        o0,
        at0,
        each,
        idle,
        bytes: 4 * per as u32,
    }
}

/// The tiled kernel of `g` with tiling `t`: each block computes a `bm x bn` tile of one
/// batch's output (grid-stride over the tiles), each of its 256 threads a `tm x tn` block of
/// it in registers. The slices of depth 8 along `k` of A (`k`-major, so that the inner loop
/// reads a thread's rows as 16-byte words) and of B pass through shared memory in two stages:
/// while the block multiplies one stage, `cp.async` copies the next slice into the other
/// (zero-filled outside the matrices), so loading overlaps the arithmetic; one
/// `cp.async.wait_group` and a barrier before each stage is read, a barrier after. Per slice
/// and thread: 8 x (`tm + tn`) / 4 16-byte shared loads and 8 x `tm` x `tn` fused
/// multiply-adds. Then `finish(c, out, acc)` for each of the thread's outputs inside the
/// matrix. Returns the number of tiles.
fn gemm(
    c: &mut Ctx,
    g: &Gemm,
    t: Tiling,
    finish: &dyn Fn(&mut Ctx, Reg, Reg) -> Result<(), String>,
) -> Result<u64, String> {
    let (m, n, k) = (g.m, g.n, g.k);
    let (tiles_m, tiles_n) = (m.div_ceil(t.bm), n.div_ceil(t.bn));
    let tiles = g.batches * tiles_m * tiles_n;
    let stage = t.stage_bytes();
    c.b.k.shared = (2 * stage) as u32;
    // One block a multiprocessor is enough: without the hint `ptxas` holds some of these
    // kernels to 64 registers and spills; with it, it takes what it needs (up to 142 here:
    // the convolution gradients' window arithmetic, hoisted out of the `k` loop), no spills.
    c.b.k.min_blocks = 1;
    let zero_f = c.b.imm(RegTy::F32, 0);
    let tid = c.sreg(Sreg::Tid);
    let ctaid = c.sreg(Sreg::Ctaid);
    let nctaid = c.sreg(Sreg::Nctaid);
    let (tile, tile_step) = (c.index_of(ctaid), c.index_of(nctaid));
    let tid_i = c.index_of(tid);
    // This thread's rows start at 4 * ty, its columns at 4 * tx (and every spread after).
    let across = t.bn / t.tn;
    let ty = c.op_n(IOp::DivU, tid_i, across);
    let tx = c.op_n(IOp::RemU, tid_i, across);
    let ty4 = c.op_n(IOp::Mul, ty, 4);
    let tx4 = c.op_n(IOp::Mul, tx, 4);
    let smem = c.b.reg(RegTy::I64);
    c.b.push(Inst::SharedBase(smem));
    // The thread's first A and B words in stage 0.
    let word = |c: &mut Ctx, i: Reg, at: u64| {
        let i = if c.it == RegTy::I32 {
            c.b.cvt(Cvt::U32ToU64, RegTy::I64, i)
        } else {
            i
        };
        let four = c.b.imm(RegTy::I64, 4);
        let base = c.b.imm(RegTy::I64, at);
        let off = c.b.reg(RegTy::I64);
        c.b.push(Inst::IMad(off, i, four, base));
        c.b.ibin(IOp::Add, smem, off)
    };
    let a_word = word(c, ty4, 0);
    let b_word = word(c, tx4, t.bm * DEPTH * 4);
    let a_copies = copies(c, &g.a, t.bm, 0, tid_i);
    let b_copies = copies(c, &g.b, t.bn, t.bm * DEPTH * 4, tid_i);
    let count = c.n(tiles);
    c.for_loop(tile, count, tile_step, |c| {
        // Which batch and tile.
        let per = tiles_m * tiles_n;
        let bi = c.op_n(IOp::DivU, tile, per);
        let rest = c.op_n(IOp::RemU, tile, per);
        let m0 = {
            let q = c.op_n(IOp::DivU, rest, tiles_n);
            c.op_n(IOp::Mul, q, t.bm)
        };
        let n0 = {
            let q = c.op_n(IOp::RemU, rest, tiles_n);
            c.op_n(IOp::Mul, q, t.bn)
        };
        let (a_off, b_off) = (g.offsets)(c, bi);
        // The first copy's row of A and column of B in this tile.
        let a_row = c.b.ibin(IOp::Add, m0, a_copies.o0);
        let b_col = c.b.ibin(IOp::Add, n0, b_copies.o0);
        // Copies the slices at depth `k0` into the stage at byte `stage_at`.
        let issue = |c: &mut Ctx, k0: Reg, stage_at: Reg| {
            for (side, cp, is_a) in [(&g.a, &a_copies, true), (&g.b, &b_copies, false)] {
                let skip = c.b.label();
                if let Some(idle) = cp.idle {
                    c.b.push(Inst::Bra(skip, Some((idle, true))));
                }
                let kr0 = c.b.ibin(IOp::Add, k0, cp.kk0);
                let at = c.b.ibin(IOp::Add, smem, stage_at);
                let at = c.b.ibin(IOp::Add, at, cp.at0);
                for &(dk, d_o, bytes) in &cp.each {
                    let kr = if dk == 0 {
                        kr0
                    } else {
                        c.op_n(IOp::Add, kr0, dk)
                    };
                    let (first, off) = if is_a { (a_row, a_off) } else { (b_col, b_off) };
                    let o = if d_o == 0 {
                        first
                    } else {
                        c.op_n(IOp::Add, first, d_o)
                    };
                    let src = if is_a {
                        (side.at)(c, off, o, kr)
                    } else {
                        (side.at)(c, off, kr, o)
                    };
                    let off = c.b.imm(RegTy::I64, bytes);
                    let dst = c.b.ibin(IOp::Add, at, off);
                    copy(c, &src, dst, cp.bytes);
                }
                c.b.place(skip);
            }
        };
        let accs: Vec<Reg> = (0..t.tm * t.tn)
            .map(|_| {
                let r = c.b.reg(RegTy::F32);
                c.b.push(Inst::Mov(r, zero_f));
                r
            })
            .collect();
        let k0 = c.b.reg(c.it);
        let zero_i = c.n(0);
        c.b.push(Inst::Mov(k0, zero_i));
        // The stage being read and the one being filled, as byte offsets.
        let (cur, next) = (c.b.reg(RegTy::I64), c.b.reg(RegTy::I64));
        let (s0, s1) = (c.b.imm(RegTy::I64, 0), c.b.imm(RegTy::I64, stage));
        c.b.push(Inst::Mov(cur, s0));
        c.b.push(Inst::Mov(next, s1));
        issue(c, k0, cur);
        c.b.push(Inst::CpAsyncCommit);
        let kn = c.n(k);
        let kstep = c.n(DEPTH);
        c.for_loop(k0, kn, kstep, |c| {
            let k1 = c.b.ibin(IOp::Add, k0, kstep);
            let last = c.b.setp(CmpTy::Unsigned, Cmp::Ge, k1, kn);
            let no_next = c.b.label();
            c.b.push(Inst::Bra(no_next, Some((last, true))));
            issue(c, k1, next);
            c.b.place(no_next);
            // A group every step, empty after the last slice, so one wait serves every step.
            c.b.push(Inst::CpAsyncCommit);
            c.b.push(Inst::CpAsyncWait(1));
            c.b.push(Inst::Bar);
            let a_at = c.b.ibin(IOp::Add, a_word, cur);
            let b_at = c.b.ibin(IOp::Add, b_word, cur);
            for kk in 0..DEPTH {
                let words = |c: &mut Ctx, at: Reg, extent: u64, per: u64| -> Vec<Reg> {
                    let mut v = Vec::new();
                    for q in 0..per / 4 {
                        let off = 4 * (kk * extent + Tiling::spread(extent, per, 4 * q));
                        let o = c.b.imm(RegTy::I64, off);
                        let addr = c.b.ibin(IOp::Add, at, o);
                        let d = [(); 4].map(|_| c.b.reg(RegTy::F32));
                        c.b.push(Inst::Ld4(Space::Shared, d, addr));
                        v.extend(d);
                    }
                    v
                };
                let av = words(c, a_at, t.bm, t.tm);
                let bv = words(c, b_at, t.bn, t.tn);
                for (i, &a) in av.iter().enumerate() {
                    for (j, &b) in bv.iter().enumerate() {
                        let acc = accs[i * t.tn as usize + j];
                        c.b.push(Inst::Fma(acc, a, b, acc));
                    }
                }
            }
            c.b.push(Inst::Bar);
            let tmp = c.b.reg(RegTy::I64);
            c.b.push(Inst::Mov(tmp, cur));
            c.b.push(Inst::Mov(cur, next));
            c.b.push(Inst::Mov(next, tmp));
            Ok(())
        })?;
        // The outputs inside the matrix.
        let (mn, nn) = (c.n(m), c.n(n));
        let row0 = c.b.ibin(IOp::Add, m0, ty4);
        let col0 = c.b.ibin(IOp::Add, n0, tx4);
        for i in 0..t.tm {
            let row = c.op_n(IOp::Add, row0, Tiling::spread(t.bm, t.tm, i));
            for j in 0..t.tn {
                let col = c.op_n(IOp::Add, col0, Tiling::spread(t.bn, t.tn, j));
                let skip = c.b.label();
                let out_r = c.b.setp(CmpTy::Unsigned, Cmp::Ge, row, mn);
                c.b.push(Inst::Bra(skip, Some((out_r, true))));
                let out_c = c.b.setp(CmpTy::Unsigned, Cmp::Ge, col, nn);
                c.b.push(Inst::Bra(skip, Some((out_c, true))));
                let o = (g.out_index)(c, bi, row, col);
                finish(c, o, accs[(i * t.tn + j) as usize])?;
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
    let load_a =
        |c: &mut Ctx, off: Reg, row: Reg, col: Reg| matrix(c, a_base, off, (row, col), (m, k), ta);
    let load_b =
        |c: &mut Ctx, off: Reg, row: Reg, col: Reg| matrix(c, b_base, off, (row, col), (k, n), tb);
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
    let t = Tiling::choose(tiles, m, n, g.batches);
    let tiles = gemm(&mut c, &g, t, &finish)?;
    Ok(c.finish(tiles))
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
    let mem = |v: Value| {
        if f.ty(v).dtype() == DType::I8 {
            Mem::S8
        } else {
            Mem::U8
        }
    };
    // Row-major strides of `dims`, aligned to the last `rank` axes, 0 where `dims` has 1 or
    // lacks the axis (a broadcast).
    let bstrides = |dims: &[u64], rank: usize| -> Vec<u64> {
        let mut st = vec![0u64; rank];
        let mut s = 1;
        for (i, &dd) in dims.iter().enumerate().rev() {
            st[rank - dims.len() + i] = if dd == 1 { 0 } else { s };
            s *= dd;
        }
        st
    };
    // Each operand's (and zero point's) strides over the output's batch axes, its row and its
    // column: the operand's over its own axes, a zero point's over its operand's.
    let layout = |v: Value, z: Value| {
        let own = f.ty(v).dims();
        let of_v = bstrides(own, own.len());
        let of_z = bstrides(f.ty(z).dims(), own.len());
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
        // The offset of batch `bi` with strides `st`.
        let batch_off = |c: &mut Ctx, st: &[u64]| {
            let mut acc = c.n(0);
            let mut inner = 1u64;
            for (&extent, &stride) in batch.iter().zip(st).rev() {
                if stride != 0 {
                    let q = c.op_n(IOp::DivU, bi, inner);
                    let coord = c.op_n(IOp::RemU, q, extent);
                    acc = c.mad_n(coord, stride, acc);
                }
                inner *= extent;
            }
            acc
        };
        // Where row/column `x` (stride `sx`) and depth `p` (stride `sp`) of a layout start.
        let start = |c: &mut Ctx, l: &(Vec<u64>, u64, u64), x: Reg, row: bool| {
            let off = batch_off(c, &l.0);
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
                let addr = c.address(buf, idx, mem);
                c.b.ld(Space::Global, mem, RegTy::I32, addr)
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
        matrix(c, w_base, off, (row, col), (og, k), false)
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
    let t = Tiling::choose(tiles, og, cols, groups);
    let tiles = gemm(&mut c, &g, t, &finish)?;
    Ok(c.finish(tiles))
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
    let t = Tiling::choose(tiles, m, n, groups);
    let tiles = gemm(&mut c, &gemm_spec, t, &finish)?;
    Ok(c.finish(tiles))
}

/// Element `(r, col)` of an `rows x cols` matrix at `base + off` (row-major, or with `t` its
/// transpose's source, read with swapped strides), 0 outside the matrix.
fn matrix(
    c: &mut Ctx,
    base: Reg,
    off: Reg,
    (r, col): (Reg, Reg),
    (rows, cols): (u64, u64),
    t: bool,
) -> Src {
    let at = if t {
        c.mad_n(col, rows, r)
    } else {
        c.mad_n(r, cols, col)
    };
    let idx = c.b.ibin(IOp::Add, at, off);
    let zero_if = c.outside(&[(r, rows), (col, cols)]);
    Src { base, idx, zero_if }
}

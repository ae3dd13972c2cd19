//! Matmuls and convolutions on one tiled GEMM kernel ([`gemm`], here with its tilings, operand
//! copies and epilogue): a matmul reads its operands as matrices (transposes the plan folded
//! with swapped strides; `matmul.rs`), a convolution its filters as a matrix and its input's
//! windows as the other (an implicit GEMM; `conv.rs`).

mod conv;
mod matmul;

pub use conv::{conv_integer, conv2d, conv2d_grad};
pub use matmul::{matmul, matmul_integer};

use super::lower::{BLOCK, Ctx, render};
use super::prog::{Cmp, CmpTy, Cvt, IOp, Inst, Mem, Reg, RegTy, Space, Sreg};
use crate::kernel::expr::Lane;
use crate::kernel::lower::{body as body_of, lower_ops};
use crate::plan::KernelData;
use tcc_ir::{Function, Value};

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
    let at0 = word_offset(c, el, at);
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

/// The byte offset `at + 4 i` in shared memory of 4-byte word `i` (an index), as a 64-bit
/// register.
fn word_offset(c: &mut Ctx, i: Reg, at: u64) -> Reg {
    let i = if c.it == RegTy::I32 {
        c.b.cvt(Cvt::U32ToU64, RegTy::I64, i)
    } else {
        i
    };
    let four = c.b.imm(RegTy::I64, 4);
    let base = c.b.imm(RegTy::I64, at);
    let off = c.b.reg(RegTy::I64);
    c.b.push(Inst::IMad(off, i, four, base));
    off
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
        let off = word_offset(c, i, at);
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

/// How the integer products' kernels read a u8 or i8 operand `v`: as bytes widened to 32 bits,
/// sign-extended for `i8`.
fn byte_mem(f: &Function, v: Value) -> Mem {
    if f.ty(v).dtype() == tcc_ir::DType::I8 {
        Mem::S8
    } else {
        Mem::U8
    }
}

/// Level `idx` of the byte buffer at `buf` (read as `mem`), as an i32.
fn load_level(c: &mut Ctx, buf: Reg, idx: Reg, mem: Mem) -> Reg {
    let addr = c.address(buf, idx, mem);
    c.b.ld(Space::Global, mem, RegTy::I32, addr)
}

//! Matmuls and convolutions on one tiled GEMM kernel ([`gemm`], here with its tilings, operand
//! copies and epilogue): a matmul reads its operands as matrices (transposes the plan folded
//! with swapped strides; `matmul.rs`), a convolution its filters as a matrix and its input's
//! windows as the other (an implicit GEMM; `conv.rs`).

mod conv;
mod matmul;

pub use conv::{conv_integer, conv2d, conv2d_grad};
pub use matmul::{matmul, matmul_integer};

use super::lower::{BLOCK, Ctx, Lowered, render};
use super::prog::{Cmp, CmpTy, Cvt, FOp, IOp, Inst, Mem, Reg, RegTy, Space, Sreg};
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
    /// A100 (108 blocks, counting the pieces of a split `k`), else [`GemmTiles::Small`].
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

    /// The tiling `tiles` asks for, for `batches` products of `m x k` by `k x n`: by the
    /// problem, [`Tiling::LARGE`] where its blocks (counting the pieces of a split `k` where
    /// the product `splits`) still give one to each multiprocessor of an A100 (108). Measured
    /// on an H200 (resnet18's convolutions at batch 1 and 32): the large tiles take 0.45-0.65x
    /// the small ones' time wherever both dimensions fill them, once splitting keeps the
    /// device busy; with fewer blocks, the small tiles win.
    fn choose(tiles: GemmTiles, (m, n, k, batches): (u64, u64, u64, u64), splits: bool) -> Tiling {
        let l = Tiling::LARGE;
        match tiles {
            GemmTiles::Small => Tiling::SMALL,
            GemmTiles::Large => l,
            GemmTiles::Auto => {
                let pieces = if splits {
                    Split::of(l, (m, n, k, batches)).pieces
                } else {
                    1
                };
                let blocks = batches * m.div_ceil(l.bm) * n.div_ceil(l.bn) * pieces;
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

/// Blocks a GEMM should have to keep the device busy: two for each multiprocessor of an A100
/// (108), about one and a half on an H100 or H200 (132). A product with fewer output tiles
/// splits `k` ([`Split`]).
const BUSY_BLOCKS: u64 = 216;

/// The least depth along `k` a piece of a split product takes (8 slices of [`DEPTH`]).
const MIN_PIECE: u64 = 64;

/// How a GEMM's `k` is cut. With one piece, not at all: each block runs the whole `k` loop
/// and the epilogue. With more (where the output has too few tiles to fill the device, as in
/// the late layers of a CNN at batch 1), piece `p` of each tile multiplies `k` from
/// `p * depth` to the next piece's start into its own partial matrix in the kernel's scratch,
/// and a second kernel ([`sum_pieces`]) adds the pieces in order and runs the epilogue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Split {
    pieces: u64,
    depth: u64,
}

/// The tiling and split a product that may split `k` (an f32 matmul or convolution) of
/// `batches` products of `m x k` by `k x n` takes under `tiles`: what its lowering and its
/// scratch both follow.
fn layout(tiles: GemmTiles, dims: (u64, u64, u64, u64)) -> (Tiling, Split) {
    let t = Tiling::choose(tiles, dims, true);
    (t, Split::of(t, dims))
}

impl Split {
    /// The split for `batches` products of `m x k` by `k x n` under tiling `t`.
    fn of(t: Tiling, (m, n, k, batches): (u64, u64, u64, u64)) -> Split {
        let tiles = batches * m.div_ceil(t.bm) * n.div_ceil(t.bn);
        let want = BUSY_BLOCKS.div_ceil(tiles.max(1)).min(k / MIN_PIECE);
        if want <= 1 {
            return Split {
                pieces: 1,
                depth: k,
            };
        }
        let depth = k.div_ceil(want).next_multiple_of(DEPTH);
        Split {
            pieces: k.div_ceil(depth),
            depth,
        }
    }

    /// Bytes of the partial matrices, for `batches` products of `m x n`.
    fn scratch_bytes(self, (m, n, batches): (u64, u64, u64)) -> u64 {
        if self.pieces == 1 {
            0
        } else {
            4 * self.pieces * batches * m * n
        }
    }
}

/// The product kernel `kd` of `f` is, where it is one that may split `k` (an f32 matmul or
/// convolution): its `(m, n, k, batches)`.
fn problem(f: &Function, kd: &KernelData) -> Option<(u64, u64, u64, u64)> {
    let d = f.op(kd.ops[0]);
    if (d.args.iter().take(2).chain(&d.results)).any(|&v| f.ty(v).dtype() != DType::F32) {
        return None;
    }
    match &d.kind {
        OpKind::MatMul => {
            let (ad, od) = (f.ty(d.args[0]).dims(), f.ty(d.results[0]).dims());
            let (m, k, n) = (ad[ad.len() - 2], ad[ad.len() - 1], od[od.len() - 1]);
            Some((m, n, k, od[..od.len() - 2].iter().product()))
        }
        OpKind::Conv2d(cv) => {
            let (xd, wd, yd) = (
                f.ty(d.args[0]).dims(),
                f.ty(d.args[1]).dims(),
                f.ty(d.results[0]).dims(),
            );
            let groups = cv.groups.max(1);
            let k = xd[1] / groups * wd[2] * wd[3];
            Some((wd[0] / groups, yd[0] * yd[2] * yd[3], k, groups))
        }
        _ => None,
    }
}

/// Bytes of scratch the product kernel `kd` of `f` needs under `tiles`: its pieces' partial
/// matrices where it splits `k`, else 0.
pub fn scratch_bytes(f: &Function, kd: &KernelData, tiles: GemmTiles) -> u64 {
    problem(f, kd).map_or(0, |(m, n, k, batches)| {
        layout(tiles, (m, n, k, batches))
            .1
            .scratch_bytes((m, n, batches))
    })
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
/// multiply-adds. Then, for each of the thread's outputs inside the matrix, `store` it.
/// Returns the number of tiles (times the pieces where `k` is split).
fn gemm(c: &mut Ctx, g: &Gemm, t: Tiling, store: &Store) -> Result<u64, String> {
    let (m, n, k) = (g.m, g.n, g.k);
    let (tiles_m, tiles_n) = (m.div_ceil(t.bm), n.div_ceil(t.bn));
    let split = match store {
        Store::Epilogue(_) => None,
        Store::Pieces { split, .. } => Some(*split),
    };
    let per_piece = g.batches * tiles_m * tiles_n;
    let tiles = per_piece * split.map_or(1, |s| s.pieces);
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
        // Which piece of `k` (split products), batch and tile.
        let (piece, tile) = match split {
            None => (None, tile),
            Some(_) => (
                Some(c.op_n(IOp::DivU, tile, per_piece)),
                c.op_n(IOp::RemU, tile, per_piece),
            ),
        };
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
        let (start, kn) = match (piece, split) {
            (Some(p), Some(s)) => {
                let start = c.op_n(IOp::Mul, p, s.depth);
                let end = c.op_n(IOp::Add, start, s.depth);
                let kn = c.n(k);
                (start, c.b.ibin(IOp::MinS, end, kn))
            }
            _ => (c.n(0), c.n(k)),
        };
        c.b.push(Inst::Mov(k0, start));
        // The stage being read and the one being filled, as byte offsets.
        let (cur, next) = (c.b.reg(RegTy::I64), c.b.reg(RegTy::I64));
        let (s0, s1) = (c.b.imm(RegTy::I64, 0), c.b.imm(RegTy::I64, stage));
        c.b.push(Inst::Mov(cur, s0));
        c.b.push(Inst::Mov(next, s1));
        issue(c, k0, cur);
        c.b.push(Inst::CpAsyncCommit);
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
                let acc = accs[(i * t.tn + j) as usize];
                match (store, piece) {
                    (Store::Pieces { scratch, .. }, Some(p)) => {
                        // Element ((p * batches + bi) * m + row) * n + col of the pieces.
                        let pb = c.mad_n(p, g.batches, bi);
                        let pr = c.mad_n(pb, m, row);
                        let idx = c.mad_n(pr, n, col);
                        let addr = c.address(*scratch, idx, Mem::B32);
                        c.b.push(Inst::St(Space::Global, Mem::B32, addr, acc));
                    }
                    (Store::Epilogue(finish), _) => {
                        let o = (g.out_index)(c, bi, row, col);
                        finish(c, o, acc)?;
                    }
                    (Store::Pieces { .. }, None) => unreachable!("a split has pieces"),
                }
                c.b.place(skip);
            }
        }
        Ok(())
    })?;
    Ok(tiles)
}

/// What the tiled kernel does with each output's accumulator.
enum Store<'a> {
    /// `finish(c, out_index, acc)`: the epilogue, storing the kernel's outputs.
    Epilogue(&'a dyn Fn(&mut Ctx, Reg, Reg) -> Result<(), String>),
    /// Into its piece's partial matrix in the scratch at `scratch` (`k` split by `split`).
    Pieces { split: Split, scratch: Reg },
}

/// The kernel(s) of product `g` (whose loads read their buffers from the context's
/// parameters, so that it serves both kernels) for library kernel `kd` of `f`, whose GEMM
/// computes `r` of shape `out`, tiled and split as [`layout`] says for `tiles` (the same
/// [`scratch_bytes`] sized the scratch by): one kernel ([`gemm`] with the epilogue)
/// where the output's tiles fill the device; else `k` split into pieces ([`Split`]), the tiled
/// kernel writing the pieces' partial matrices to the kernel's scratch (one more parameter,
/// after the inputs and outputs) and a second kernel, launched after it ([`sum_pieces`]),
/// finishing them. The kernels are `name`d, the second with `_sum` after it; `index` is the
/// largest element index their operands need.
fn lower_product(
    name: String,
    f: &Function,
    kd: &KernelData,
    (r, out): (Value, &[u64]),
    index: u64,
    tiles: GemmTiles,
    g: &Gemm,
) -> Result<Lowered, String> {
    let params = (kd.inputs.len() + kd.outputs.len()) as u32;
    let (t, split) = layout(tiles, (g.m, g.n, g.k, g.batches));
    if split.pieces == 1 {
        let mut c = Ctx::new(name, params, BLOCK, index);
        let finish = epilogue(&mut c, f, kd, r, out)?;
        let tiles = gemm(&mut c, g, t, &Store::Epilogue(&finish))?;
        return Ok(c.finish(tiles));
    }
    let index = index.max(split.pieces * g.batches * g.m * g.n);
    let mut c = Ctx::new(name.clone(), params + 1, BLOCK, index);
    let scratch = c.bases[params as usize];
    let tiles = gemm(&mut c, g, t, &Store::Pieces { split, scratch })?;
    let mut sum = Ctx::new(format!("{name}_sum"), params + 1, BLOCK, index);
    let finish = epilogue(&mut sum, f, kd, r, out)?;
    let grid = sum_pieces(&mut sum, g, split, &finish)?;
    let mut first = c.finish(tiles);
    first.then = Some(Box::new(sum.finish(grid)));
    Ok(first)
}

/// The second kernel of a product split into pieces: a thread per output `(batch, row, col)`
/// adds the pieces' partials at it in piece order (from the scratch, the last parameter) and
/// runs `finish` on the sum. Returns the grid.
fn sum_pieces(
    c: &mut Ctx,
    g: &Gemm,
    split: Split,
    finish: &dyn Fn(&mut Ctx, Reg, Reg) -> Result<(), String>,
) -> Result<u64, String> {
    let (m, n) = (g.m, g.n);
    let total = g.batches * m * n;
    let scratch = *c.bases.last().expect("the scratch parameter");
    c.grid_stride(total, |c, i| {
        let at = c.address(scratch, i, Mem::B32);
        let mut sum = c.b.ld(Space::Global, Mem::B32, RegTy::F32, at);
        for p in 1..split.pieces {
            let idx = c.op_n(IOp::Add, i, p * total);
            let at = c.address(scratch, idx, Mem::B32);
            let v = c.b.ld(Space::Global, Mem::B32, RegTy::F32, at);
            sum = c.b.fbin(FOp::Add, sum, v);
        }
        let bi = c.op_n(IOp::DivU, i, m * n);
        let rest = c.op_n(IOp::RemU, i, m * n);
        let row = c.op_n(IOp::DivU, rest, n);
        let col = c.op_n(IOp::RemU, rest, n);
        let o = (g.out_index)(c, bi, row, col);
        finish(c, o, sum)
    })?;
    Ok(total.div_ceil(BLOCK as u64))
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

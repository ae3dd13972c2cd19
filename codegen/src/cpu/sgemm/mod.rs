//! Single-precision matrix product with our own microkernels (BLIS-style): one for AVX-512F
//! (`avx512.rs`, 12×32 tiles in 24 `zmm` accumulators) and one for AVX2+FMA (`avx2.rs`, 6×16
//! tiles in 12 `ymm` accumulators), chosen at compile time from the target's features and the
//! CPU ([`Isa`]).
//!
//! `C (+)= A · B` for `A [m, k]` and `B [k, n]` with any row and column strides (so transposed
//! operands cost nothing extra) and a row-major `C [m, n]` with a leading dimension. B is
//! packed into panels of `NR` columns and A into panels of `MR` rows, for blocks of `KC` along
//! k; the microkernel reads each packed element once per block. Threads take disjoint column
//! ranges of C and pack their own panels. The `gemm` crate serves CPUs with neither instruction
//! set (and f64).
//!
//! Two operand forms serve convolutions: A packed once ahead of time ([`PackedA`], a constant
//! filter), and B read as the im2col matrix of images without building it ([`Im2col`]): each
//! panel is gathered straight from the images, so the columns never go through memory. With
//! a packed A and few columns (a late convolution layer: 49 output positions), threads take
//! row ranges instead.
//!
//! This file holds the blocking loops the instruction sets share, `pack.rs` the packing of
//! operands (and the walk of an im2col panel), each kernel file its microkernel and the vector
//! assembly of im2col rows. They share one panel layout (`MR`, `NR`, `KC`) and are only
//! correct together.

use super::bytes::{Line, line_floats, lines};
use super::send_ptr::SendPtr;

mod avx2;
mod avx512;
mod pack;

use pack::{Segment, im2col_rows, pack_a_panel, pack_b_block};

/// A strided `f32` operand.
pub(crate) type Mat = super::matmul::Mat<f32>;

/// The widest panel of B any kernel uses.
const MAX_NR: usize = 32;

/// The tallest panel of A any kernel uses.
const MAX_MR: usize = 12;

/// Columns of B packed at a time when A has one block of rows (a multiple of every `NR`):
/// `KC × GROUP` floats, 256 KiB, stay in L2 until the tiles read them.
const GROUP: usize = 256;

/// One instruction set's microkernel, with the blocking it is tuned for.
trait Kernel {
    /// Rows of an A panel (and of a C tile).
    const MR: usize;
    /// Columns of a B panel (and of a C tile); at most [`MAX_NR`].
    const NR: usize;
    /// Most depth of a block along k: an A and a B panel of this depth stay in L1 (see
    /// [`depth_block`]).
    const KC: usize;
    /// Rows of A packed per block: `MC × KC` floats stay in L2.
    const MC: usize;
    /// Columns of B packed per block.
    const NC: usize;

    /// One MR×NR tile: `C (+)= A · Bp` over `kc`, writing only the `h × w` valid part, and
    /// asking for the `kc × NR` floats at `fetch` (unless null: a hint, never read) to be
    /// brought into L2 as the steps go.
    ///
    /// # Safety
    /// The CPU has the kernel's instruction set; `a` holds `kc` depths of the tile's rows (a
    /// packed panel's MR, or the `h` rows read in place) and `bp` `kc` panel rows of NR
    /// floats, 64-byte aligned; `c` addresses `h × w` floats with leading dimension `ldc` that
    /// no other thread touches.
    #[allow(clippy::too_many_arguments)]
    unsafe fn micro(
        kc: usize,
        a: APanel,
        bp: *const f32,
        fetch: *const f32,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
        h: usize,
        w: usize,
    );

    /// Packs rows `pc..pc+kc` and columns `j0..j0+w` of the im2col matrix `v` into one panel
    /// of NR columns, zero-padded (see [`im2col_rows`]).
    ///
    /// # Safety
    /// The CPU has the kernel's instruction set; `v` addresses its images; a row's in-image
    /// offsets (`ox * stride`) fit an `i32`.
    unsafe fn pack_im2col(v: &Im2col, pc: usize, kc: usize, j0: usize, w: usize, panel: &mut [f32]);
}

/// The rows of A a tile reads: element `(i, p)` (row `i` of the tile, depth `p` of the block)
/// at `ptr + i * rs + p * ds`. A packed panel has `rs = 1, ds = MR`; a row-major A read in
/// place has `rs` its row stride and `ds = 1` (see [`block_in`]).
#[derive(Clone, Copy)]
pub(crate) struct APanel {
    pub ptr: *const f32,
    pub rs: usize,
    pub ds: usize,
}

impl APanel {
    /// Whether this is A read in place, not a packed panel.
    fn in_place(&self) -> bool {
        self.ds == 1
    }
}

/// The first element of each of a tile's `MR` rows of A, and the distance between depths: a
/// packed panel's (its rows side by side, `MR` apart), or A's own rows read in place (rows
/// from `h` on, past the matrix, repeat row `h - 1`; their sums are never stored).
#[inline(always)]
fn a_rows<const MR: usize, const PACKED: bool>(a: APanel, h: usize) -> ([*const f32; MR], usize) {
    if PACKED {
        (std::array::from_fn(|i| a.ptr.wrapping_add(i)), MR)
    } else {
        (
            std::array::from_fn(|i| a.ptr.wrapping_add(i.min(h - 1) * a.rs)),
            1,
        )
    }
}

/// Which of our kernels runs the f32 products of a compiled function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    Avx512,
    Avx2,
}

impl Isa {
    /// The kernel for a target with `features`, if one of ours fits it and this CPU (the
    /// features a target spec leaves on are the host's, so the check only guards other hosts):
    /// AVX-512's where the library kernels are 512 bits wide ([`super::Features::wide`]: not
    /// on Zen 4, which halves 512-bit operations), else AVX2's.
    pub(crate) fn for_target(features: &super::Features) -> Option<Isa> {
        #[cfg(target_arch = "x86_64")]
        {
            use std::is_x86_feature_detected as has;
            if features.wide && has!("avx512f") {
                return Some(Isa::Avx512);
            }
            if features.avx2 && features.fma && has!("avx2") && has!("fma") {
                return Some(Isa::Avx2);
            }
        }
        let _ = features;
        None
    }
}

/// Column panels of B up to which a row-major A is read in place rather than packed.
const IN_PLACE_PANELS: usize = 8;

/// Whether a thread's part of a product with `n` columns reads row-major `a` in place: where
/// each tile's rows of A serve few column panels, so that packing them costs more than the
/// tiles' reads of A's rows (six or twelve short streams instead of one) save. On Zen 4 a
/// dense layer `[3136, 384] x [384, 96]` (six panels) ran 11% faster in place, ConvNeXt's
/// layers with 384 to 3072 columns 2-10% slower.
fn reads_a_in_place<K: Kernel>(a: Mat, n: usize) -> bool {
    a.cs == 1 && n.div_ceil(K::NR) <= IN_PLACE_PANELS
}

/// The depth of the blocks a product of depth `k` is cut into on kernel `K`: as even as the
/// blocks can be within `K::KC`, so no block is left with a few steps of depth (each block
/// loads and stores its tiles of C once).
fn depth_block<K: Kernel>(k: usize) -> usize {
    k.div_ceil(k.div_ceil(K::KC).max(1)).max(1)
}

/// A, packed once into one kernel's panels: for each block of [`depth_block`] along k, the panels of `MR`
/// rows in order (zero-padded), so the panel of rows `r..` in block `pc` starts at
/// `pc * mpad + r * kc`.
pub(crate) struct PackedA {
    data: Vec<Line>,
    isa: Isa,
    m: usize,
    k: usize,
    mpad: usize,
}

impl PackedA {
    /// Packs the `m×k` matrix `a` for `isa`'s kernel.
    ///
    /// # Safety
    /// `a` addresses an `m×k` matrix with its strides.
    pub(crate) unsafe fn new(isa: Isa, m: usize, k: usize, a: Mat) -> PackedA {
        // SAFETY: the caller's contract.
        unsafe {
            match isa {
                Isa::Avx512 => PackedA::with::<avx512::Avx512>(isa, m, k, a),
                Isa::Avx2 => PackedA::with::<avx2::Avx2>(isa, m, k, a),
            }
        }
    }

    /// # Safety
    /// As for `new`; `K` is `isa`'s kernel.
    unsafe fn with<K: Kernel>(isa: Isa, m: usize, k: usize, a: Mat) -> PackedA {
        let mpad = m.div_ceil(K::MR) * K::MR;
        let mut data = aligned(mpad * k);
        let buf = &mut line_floats(&mut data)[..mpad * k];
        let kb = depth_block::<K>(k);
        for pc in (0..k).step_by(kb) {
            let kc = kb.min(k - pc);
            for r in (0..m).step_by(K::MR) {
                let off = pc * mpad + r * kc;
                let panel = &mut buf[off..off + kc * K::MR];
                // SAFETY: the caller's contract.
                unsafe { pack_a_panel::<K>(a, r, pc, K::MR.min(m - r), kc, panel) };
            }
        }
        PackedA {
            data,
            isa,
            m,
            k,
            mpad,
        }
    }

    fn ptr(&self) -> *const f32 {
        self.data.as_ptr() as *const f32
    }
}

/// B, packed once into one kernel's panels: for each block of [`depth_block`] along k, the
/// panels of `NR` columns in order (zero-padded), so the panel of columns `j..` in block `pc`
/// starts at `pc * npad + j * kc`. A constant weight matrix is packed this way at compile time,
/// so runs neither pack it nor split their threads around packing it.
pub(crate) struct PackedB {
    data: Vec<Line>,
    isa: Isa,
    k: usize,
    n: usize,
    npad: usize,
}

impl PackedB {
    /// Packs the `k×n` matrix `b` for `isa`'s kernel.
    ///
    /// # Safety
    /// `b` addresses a `k×n` matrix with its strides.
    pub(crate) unsafe fn new(isa: Isa, k: usize, n: usize, b: Mat) -> PackedB {
        // SAFETY: the caller's contract.
        unsafe {
            match isa {
                Isa::Avx512 => PackedB::with::<avx512::Avx512>(isa, k, n, b),
                Isa::Avx2 => PackedB::with::<avx2::Avx2>(isa, k, n, b),
            }
        }
    }

    /// # Safety
    /// As for `new`; `K` is `isa`'s kernel.
    unsafe fn with<K: Kernel>(isa: Isa, k: usize, n: usize, b: Mat) -> PackedB {
        let npad = n.div_ceil(K::NR) * K::NR;
        let mut data = aligned(npad * k);
        let buf = &mut line_floats(&mut data)[..npad * k];
        let kb = depth_block::<K>(k);
        for pc in (0..k).step_by(kb) {
            let kc = kb.min(k - pc);
            let block = &mut buf[pc * npad..pc * npad + kc * npad];
            // SAFETY: the caller's contract.
            unsafe { pack_b_block::<K>(b, pc, kc, 0, n, block) };
        }
        PackedB {
            data,
            isa,
            k,
            n,
            npad,
        }
    }

    /// The panel after the one of `floats` floats at `panel` in memory (the next columns of
    /// its depth block, or the next block's first), or null after the last.
    fn after(&self, panel: *const f32, floats: usize) -> *const f32 {
        let end = (self.data.as_ptr() as *const f32).wrapping_add(self.npad * self.k);
        let next = panel.wrapping_add(floats);
        if next < end { next } else { std::ptr::null() }
    }

    /// The packed panels of columns `j..` (a multiple of NR) in the depth block at `pc`, `kc`
    /// deep.
    fn panels(&self, pc: usize, kc: usize, j: usize) -> *const f32 {
        // SAFETY (a pointer computation): block pc starts at pc * npad and its panels hold
        // kc floats per column.
        (self.data.as_ptr() as *const f32).wrapping_add(pc * self.npad + j * kc)
    }
}

/// The left operand: a matrix to pack as it is used, or one packed ahead of time.
#[derive(Clone, Copy)]
pub(crate) enum A<'a> {
    Mat(Mat),
    Packed(&'a PackedA),
}

/// The im2col matrix of `images` consecutive images for a convolution, never built: row `p` is
/// filter tap `(ci, ky, kx)` (row-major over `[channels, kh, kw]`), column `j` is output
/// position `(image, oy, ox)` (row-major over `[images, oh, ow]`); an element is the image value
/// the tap reads there, or 0 in the padding.
#[derive(Clone, Copy)]
pub(crate) struct Im2col {
    /// The first image's first channel (of this group).
    pub x: *const f32,
    /// Elements from one image to the next.
    pub image_stride: usize,
    pub h: usize,
    pub w: usize,
    pub kh: usize,
    pub kw: usize,
    pub oh: usize,
    pub ow: usize,
    pub stride: [usize; 2],
    pub dilation: [usize; 2],
    /// Padding before rows and before columns.
    pub pad: [usize; 2],
}

/// Told when part of C is final: `done(i, cols)` after row `i`'s columns `cols` hold their
/// last value, on the thread that wrote them, while they are still in cache (a fused epilogue
/// runs there). Every element of C is reported exactly once.
pub(crate) type Done<'a> = Option<&'a (dyn Fn(usize, std::ops::Range<usize>) + Sync)>;

/// The right operand: a matrix, one packed ahead of time, or the columns of a convolution.
#[derive(Clone, Copy)]
pub(crate) enum B<'a> {
    Mat(Mat),
    Packed(&'a PackedB),
    Im2col(Im2col),
}

/// `C = A · B`, or `C += A · B` with `accumulate`, for plain matrices on `isa`'s kernel,
/// telling `done` as rows of C become final.
///
/// # Safety
/// The CPU has `isa`; `a` and `b` must address `m×k` and `k×n` matrices with their strides, `c`
/// an `m×n` row-major matrix with leading dimension `ldc` that overlaps neither.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn sgemm(
    isa: Isa,
    m: usize,
    n: usize,
    k: usize,
    a: Mat,
    b: Mat,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    threads: usize,
    done: Done,
) {
    let (a, b) = (A::Mat(a), B::Mat(b));
    // SAFETY: the caller's contract.
    unsafe { product(isa, m, n, k, a, b, c, ldc, accumulate, threads, done) }
}

/// `C (+)= A · B` with either form of each operand, on `isa`'s kernel, telling `done` as rows
/// of C become final.
///
/// # Safety
/// As for [`sgemm`]; a packed A is `m×k` and packed for `isa`; an [`Im2col`] B has
/// `k = channels·kh·kw` rows and `n = images·oh·ow` columns and addresses its images.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn product(
    isa: Isa,
    m: usize,
    n: usize,
    k: usize,
    a: A,
    b: B,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    threads: usize,
    done: Done,
) {
    if let A::Packed(p) = a {
        assert!(
            p.m == m && p.k == k && p.isa == isa,
            "a packed A of the product's shape, for its kernel"
        );
    }
    if let B::Packed(p) = b {
        assert!(
            p.k == k && p.n == n && p.isa == isa,
            "a packed B of the product's shape, for its kernel"
        );
    }
    // SAFETY: the caller's contract.
    unsafe {
        match isa {
            Isa::Avx512 => {
                product_with::<avx512::Avx512>(m, n, k, a, b, c, ldc, accumulate, threads, done)
            }
            Isa::Avx2 => {
                product_with::<avx2::Avx2>(m, n, k, a, b, c, ldc, accumulate, threads, done)
            }
        }
    }
}

/// [`product`] on kernel `K`.
///
/// # Safety
/// As for [`product`], with `K` the kernel of its `isa`.
#[allow(clippy::too_many_arguments)]
unsafe fn product_with<K: Kernel>(
    m: usize,
    n: usize,
    k: usize,
    a: A,
    b: B,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    threads: usize,
    done: Done,
) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        for i in 0..m {
            if !accumulate {
                // SAFETY: row i of C holds n floats at c + i * ldc (the caller's contract).
                unsafe { std::ptr::write_bytes(c.add(i * ldc), 0, n) };
            }
            if let Some(done) = done {
                done(i, 0..n);
            }
        }
        return;
    }
    let threads = if m * n * k >= 1 << 18 {
        threads.max(1)
    } else {
        1
    };
    // Threads take rows when B is packed (each packs only its own rows of A) and the rows
    // make enough tiles to share evenly, when A is packed and there are too few column panels
    // to go round, or when there are fewer column panels than threads (a classifier's few
    // outputs: each thread packs the small B itself); otherwise columns, in multiples of NR
    // (each packs its own columns of B, or reads its columns of a packed B). ConvNeXt's last
    // stage has 49 rows: nine tiles of six, split 5 + 4 with the last nearly empty; its
    // dense layers with GELU ran 1.33 ms on two threads that way, 1.19 split by columns.
    let panels = n.div_ceil(K::NR);
    let rows_even = m.div_ceil(K::MR) >= 8 * threads || panels < 2 * threads;
    let by_rows = m >= K::MR * threads
        && (matches!(b, B::Packed(_)) && rows_even
            || matches!(a, A::Packed(_)) && panels < 2 * threads
            || panels < threads);
    let (parts, chunk) = if by_rows {
        let parts = threads.min(m.div_ceil(K::MR));
        (parts, m.div_ceil(parts).div_ceil(K::MR) * K::MR)
    } else {
        let parts = threads.clamp(1, n.div_ceil(K::NR));
        (parts, n.div_ceil(parts).div_ceil(K::NR) * K::NR)
    };
    // SAFETY: the threads only read A and B, and each writes its own rows or columns of C.
    let (a, b, cp) = unsafe { (SendPtr::new(a), SendPtr::new(b), SendPtr::new(c)) };
    let run = move |start: usize| {
        let (rows, cols) = if by_rows {
            (start..(start + chunk).min(m), 0..n)
        } else {
            (0..m, start..(start + chunk).min(n))
        };
        // SAFETY: as for `product`; this call writes rows × cols of C only.
        unsafe {
            block::<K>(
                rows,
                cols,
                k,
                a.get(),
                b.get(),
                Out {
                    c: cp.get(),
                    ldc,
                    accumulate,
                    done,
                },
            )
        };
    };
    if parts == 1 {
        run(0);
    } else {
        let total = if by_rows { m } else { n };
        super::pool::for_each(total.div_ceil(chunk), &|i| run(i * chunk));
    }
}

/// A zeroed, 64-byte-aligned buffer of at least `n` floats: packed panels are built of these
/// so that every vector load of a panel is aligned (an unaligned one can split a cache line).
fn aligned(n: usize) -> Vec<Line> {
    lines(n as u64 * 4)
}

/// Where one thread's part of a product goes: C with its leading dimension, whether to add to
/// it, and whom to tell as rows are finished.
#[derive(Clone, Copy)]
struct Out<'a> {
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    done: Done<'a>,
}

/// The blocked product of rows `rows` and columns `cols` of C on one thread (`rows` starts at a
/// multiple of MR).
///
/// # Safety
/// As for [`product`]; no other thread writes these rows and columns of C meanwhile.
unsafe fn block<K: Kernel>(
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    k: usize,
    a: A,
    b: B,
    out: Out,
) {
    let (m, n) = (rows.len(), cols.len());
    if m == 0 || n == 0 {
        return;
    }
    let kc_max = depth_block::<K>(k);
    let (nb, na) = (
        match b {
            B::Packed(_) => 0,
            _ if m <= K::MC => kc_max * GROUP,
            _ => kc_max * K::NC.min(n.div_ceil(K::NR) * K::NR),
        },
        match a {
            A::Mat(a) if reads_a_in_place::<K>(a, n) => 0,
            A::Mat(_) => kc_max * K::MC.min(m.div_ceil(K::MR) * K::MR),
            A::Packed(_) => 0,
        },
    );
    // The packing buffers live on per thread and grow as needed: a small GEMM (one image of a
    // convolution) must not pay for allocating and zeroing them on every call.
    PANELS.with(|cell| {
        let mut bufs = cell.borrow_mut();
        let (bp_buf, ap_buf) = &mut *bufs;
        for (buf, len) in [(&mut *bp_buf, nb), (&mut *ap_buf, na)] {
            super::bytes::at_least(buf, len * 4);
        }
        let bp = &mut line_floats(bp_buf)[..nb];
        let ap = &mut line_floats(ap_buf)[..na];
        // SAFETY: the caller's contract.
        unsafe { block_in::<K>(rows, cols, k, a, b, out, bp, ap) }
    })
}

thread_local! {
    /// Each thread's packed panels of B and A.
    static PANELS: std::cell::RefCell<(Vec<Line>, Vec<Line>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// `block` with its packing buffers.
///
/// # Safety
/// As for `block`; `bp` and `ap` hold the packed panels' `KC`-deep blocks (see `block`).
#[allow(clippy::too_many_arguments)]
unsafe fn block_in<K: Kernel>(
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    k: usize,
    a: A,
    b: B,
    out: Out,
    bp: &mut [f32],
    ap: &mut [f32],
) {
    let Out {
        c,
        ldc,
        accumulate,
        done,
    } = out;
    let (mr, nr) = (K::MR, K::NR);
    let (r0, m) = (rows.start, rows.len());
    let (c0, n) = (cols.start, cols.len());
    let kb = depth_block::<K>(k);
    let in_place = matches!(a, A::Mat(a) if reads_a_in_place::<K>(a, n));
    for jc in (0..n).step_by(K::NC) {
        let nc = K::NC.min(n - jc);
        for pc in (0..k).step_by(kb) {
            let kc = kb.min(k - pc);
            // Packs columns `j0..j0 + w` of the block into `bp` (panel by panel), or finds
            // them packed; returns where their panels are.
            let pack_b = |j0: usize, w: usize, bp: &mut [f32]| -> *const f32 {
                // SAFETY: the caller's contract.
                unsafe {
                    match &b {
                        B::Mat(b) => pack_b_block::<K>(*b, pc, kc, c0 + jc + j0, w, bp),
                        B::Packed(p) => return p.panels(pc, kc, c0 + jc + j0),
                        B::Im2col(v) => {
                            for (jp, jj) in (0..w).step_by(nr).enumerate() {
                                let panel = &mut bp[jp * kc * nr..(jp + 1) * kc * nr];
                                K::pack_im2col(v, pc, kc, c0 + jc + j0 + jj, nr.min(w - jj), panel)
                            }
                        }
                    }
                }
                bp.as_ptr()
            };
            // Packs rows `ic..ic + mc` into `ap` (or finds them packed, or reads a row-major A
            // in place) and returns the block: its first tile's rows, and how far apart its
            // tiles start. A row-major A is read where it is, as onnxruntime's kernels read
            // it: a tile's broadcasts walk MR rows along k, streams the prefetchers follow,
            // and packing it was a fifth of a transformer's dense layer (`[3136, 384] x
            // [384, 96]`, one thread, Zen 4).
            let mut pack_a = |ic: usize, mc: usize| -> (APanel, usize) {
                match a {
                    A::Mat(a) if in_place => {
                        // SAFETY: row r0 + ic and depth pc lie in A (the caller's contract).
                        let ptr = unsafe { a.ptr.add((r0 + ic) * a.rs + pc) };
                        (
                            APanel {
                                ptr,
                                rs: a.rs,
                                ds: 1,
                            },
                            mr * a.rs,
                        )
                    }
                    A::Mat(a) => {
                        for (ip, i0) in (0..mc).step_by(mr).enumerate() {
                            let panel = &mut ap[ip * kc * mr..(ip + 1) * kc * mr];
                            let h = mr.min(mc - i0);
                            // SAFETY: the caller's contract.
                            unsafe { pack_a_panel::<K>(a, r0 + ic + i0, pc, h, kc, panel) };
                        }
                        let ptr = ap.as_ptr();
                        (APanel { ptr, rs: 1, ds: mr }, kc * mr)
                    }
                    // SAFETY: block pc's panels start at pc * mpad and rows r0 + ic < m are
                    // inside it.
                    A::Packed(p) => {
                        let ptr = unsafe { p.ptr().add(pc * p.mpad + (r0 + ic) * kc) };
                        (APanel { ptr, rs: 1, ds: mr }, kc * mr)
                    }
                }
            };
            // The tiles of rows `ic..ic + mc` and columns `j0..j0 + w` of the block, from the
            // packed rows and columns, GROUP columns at a time; in the last block of depth,
            // each group's rows are reported done while they are in cache.
            let last = pc + kc == k;
            // The rows of B to fetch into cache while the tiles run, spread over their panels
            // (`fetch(i, of)` before panel i of `of`): none by default.
            let no_fetch = |_: usize, _: usize| {};
            let tiles = |(a_block, a_step): (APanel, usize),
                         (ic, mc): (usize, usize),
                         w: usize,
                         j0,
                         bp: *const f32,
                         fetch: &dyn Fn(usize, usize)| {
                let panels = w.div_ceil(nr);
                for g0 in (0..w).step_by(GROUP) {
                    let g1 = (g0 + GROUP).min(w);
                    for jj in (g0..g1).step_by(nr) {
                        fetch(jj / nr, panels);
                        // A packed B is read in the order it lies in memory, panel after panel
                        // (into the next block of depth): the panel's first tile asks for the
                        // next panel to be brought into L2, so that a model's weights, which
                        // come from memory at batch 1 (ViT-B/16's are 330 MB), are there when
                        // its tiles start (ViT's dense layers 2.84 -> 2.53 ms on a Xeon).
                        let next = match &b {
                            B::Packed(p) => p.after(bp.wrapping_add(jj / nr * kc * nr), kc * nr),
                            _ => std::ptr::null(),
                        };
                        for (ip, i0) in (0..mc).step_by(mr).enumerate() {
                            // SAFETY: the tile's first element is inside this thread's rows and
                            // columns of C, and the packed panels hold kc * MR and kc * NR
                            // floats; micro writes only the h x w valid part.
                            unsafe {
                                let cp = c.add((r0 + ic + i0) * ldc + c0 + jc + j0 + jj);
                                let a_tile = APanel {
                                    ptr: a_block.ptr.add(ip * a_step),
                                    ..a_block
                                };
                                K::micro(
                                    kc,
                                    a_tile,
                                    bp.add(jj / nr * kc * nr),
                                    if ip == 0 { next } else { std::ptr::null() },
                                    cp,
                                    ldc,
                                    accumulate || pc > 0,
                                    mr.min(mc - i0),
                                    nr.min(w - jj),
                                )
                            };
                        }
                    }
                    if let (true, Some(done)) = (last, done) {
                        let cols = c0 + jc + j0;
                        for i in r0 + ic..r0 + ic + mc {
                            done(i, cols + g0..cols + g1);
                        }
                    }
                }
            };
            if m <= K::MC {
                // One block of rows: each column of B serves it once, so B is packed a group of
                // panels at a time and read back from L2 while still there.
                let a_block = pack_a(0, m);
                for j0 in (0..nc).step_by(GROUP) {
                    let w = GROUP.min(nc - j0);
                    let panels = pack_b(j0, w, bp);
                    // B read in place streams from memory, a row segment at a time: the next
                    // group's columns (or, after the last, the next block of depth's first
                    // group) are fetched while these tiles compute, so that packing them
                    // finds them in cache (a skinny product's B is read once, and waiting for
                    // it took a third of the time).
                    let next = if j0 + w < nc {
                        Some((pc..pc + kc, j0 + w..(j0 + w + GROUP).min(nc)))
                    } else if pc + kc < k {
                        Some((pc + kc..(pc + kc + kb).min(k), 0..GROUP.min(nc)))
                    } else {
                        None
                    };
                    match (&b, next) {
                        (B::Mat(bm), Some((rows, cols))) if bm.cs == 1 => {
                            let cols = c0 + jc + cols.start..c0 + jc + cols.end;
                            // SAFETY: those rows and columns lie in B (the caller's contract).
                            let fetch = |i: usize, of: usize| unsafe {
                                let (r0, r1) = (rows.len() * i / of, rows.len() * (i + 1) / of);
                                prefetch_rows(*bm, rows.start + r0..rows.start + r1, &cols)
                            };
                            tiles(a_block, (0, m), w, j0, panels, &fetch);
                        }
                        _ => tiles(a_block, (0, m), w, j0, panels, &no_fetch),
                    }
                }
            } else {
                let panels = pack_b(0, nc, bp);
                for ic in (0..m).step_by(K::MC) {
                    let mc = K::MC.min(m - ic);
                    let a_block = pack_a(ic, mc);
                    tiles(a_block, (ic, mc), nc, 0, panels, &no_fetch);
                }
            }
        }
    }
}

/// Asks for rows `rows`, columns `cols` of row-major `b` to be brought into cache (L2), a
/// cache line at a time.
///
/// # Safety
/// `b` addresses those elements, with a column stride of one.
unsafe fn prefetch_rows(b: Mat, rows: std::ops::Range<usize>, cols: &std::ops::Range<usize>) {
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (b, rows, cols);
    #[cfg(target_arch = "x86_64")]
    for r in rows {
        for j in (cols.start..cols.end).step_by(16) {
            // SAFETY: the element is in B (the caller's contract); a prefetch never faults.
            unsafe {
                let p = b.ptr.add(r * b.rs + j);
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(
                    p as *const i8,
                );
            }
        }
    }
}

#[cfg(test)]
mod tests;

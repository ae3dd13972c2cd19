//! Single-precision matrix product with our own microkernels (BLIS-style): one for AVX-512F
//! (`avx512.rs`, 12×32 tiles in 24 `zmm` accumulators) and one for AVX2+FMA (`avx2.rs`, 6×16
//! tiles in 12 `ymm` accumulators), chosen at compile time from the target's features ([`Isa`]).
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
//! This file holds what the instruction sets share: the blocking loops, the packing of plain
//! operands and the walk of an im2col panel; each kernel file holds its microkernel and the
//! vector assembly of im2col rows. They share one panel layout (`MR`, `NR`, `KC`) and are only
//! correct together.

use super::bytes::{Line, line_floats, lines};
use super::send_ptr::SendPtr;

mod avx2;
mod avx512;

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

    /// One MR×NR tile: `C (+)= Ap · Bp` over `kc`, writing only the `h × w` valid part.
    ///
    /// # Safety
    /// The CPU has the kernel's instruction set; `ap` and `bp` hold `kc` panel rows of MR and
    /// NR floats, `bp` 64-byte aligned; `c` addresses `h × w` floats with leading dimension
    /// `ldc` that no other thread touches.
    #[allow(clippy::too_many_arguments)]
    unsafe fn micro(
        kc: usize,
        ap: *const f32,
        bp: *const f32,
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

/// Which of our kernels runs the f32 products of a compiled function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    Avx512,
    Avx2,
}

impl Isa {
    /// The kernel for a target with `features`, if one of ours fits it and this CPU (the
    /// features a target spec leaves on are the host's, so the check only guards other hosts).
    pub(crate) fn for_target(features: &super::Features) -> Option<Isa> {
        #[cfg(target_arch = "x86_64")]
        {
            use std::is_x86_feature_detected as has;
            if features.avx512f && has!("avx512f") {
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

/// The right operand: a matrix, or the columns of a convolution.
#[derive(Clone, Copy)]
pub(crate) enum B {
    Mat(Mat),
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
    // Threads take rows when A is packed (nothing to pack twice) and there are too few column
    // panels to go round; otherwise columns, in multiples of NR.
    let by_rows =
        matches!(a, A::Packed(_)) && n.div_ceil(K::NR) < 2 * threads && m >= K::MR * threads;
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
                cp.get(),
                ldc,
                accumulate,
                done,
            )
        };
    };
    if parts == 1 {
        run(0);
    } else {
        let total = if by_rows { m } else { n };
        rayon::scope(|s| {
            for start in (0..total).step_by(chunk) {
                s.spawn(move |_| run(start));
            }
        });
    }
}

/// A zeroed, 64-byte-aligned buffer of at least `n` floats: packed panels are built of these
/// so that every vector load of a panel is aligned (an unaligned one can split a cache line).
fn aligned(n: usize) -> Vec<Line> {
    lines(n as u64 * 4)
}

/// The blocked product of rows `rows` and columns `cols` of C on one thread (`rows` starts at a
/// multiple of MR).
///
/// # Safety
/// As for [`product`]; no other thread writes these rows and columns of C meanwhile.
#[allow(clippy::too_many_arguments)]
unsafe fn block<K: Kernel>(
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    k: usize,
    a: A,
    b: B,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    done: Done,
) {
    let (m, n) = (rows.len(), cols.len());
    if m == 0 || n == 0 {
        return;
    }
    let kc_max = depth_block::<K>(k);
    let (nb, na) = (
        if m <= K::MC {
            kc_max * GROUP
        } else {
            kc_max * K::NC.min(n.div_ceil(K::NR) * K::NR)
        },
        match a {
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
            if buf.len() * 16 < len {
                *buf = aligned(len);
            }
        }
        let bp = &mut line_floats(bp_buf)[..nb];
        let ap = &mut line_floats(ap_buf)[..na];
        // SAFETY: the caller's contract.
        unsafe { block_in::<K>(rows, cols, k, a, b, c, ldc, accumulate, done, bp, ap) }
    })
}

/// Packs rows `r..r+h` and depths `pc..pc+kc` of `a` into one panel of `K::MR` rows,
/// zero-padded. Generic over the kernel so that the panel's row count is a constant and the
/// copies unroll.
///
/// # Safety
/// `a` addresses those elements.
unsafe fn pack_a_panel<K: Kernel>(
    a: Mat,
    r: usize,
    pc: usize,
    h: usize,
    kc: usize,
    panel: &mut [f32],
) {
    let panel = &mut panel[..kc * K::MR];
    if a.cs == 1 && h == K::MR {
        // A full panel of a row-major A: the MR rows walked together along k, so each depth's
        // MR floats are stored together.
        // SAFETY (this block): rows r..r+h and depths pc..pc+kc of A are in bounds (the
        // caller's contract).
        let rows: [*const f32; MAX_MR] =
            std::array::from_fn(|ii| a.ptr.wrapping_add((r + ii.min(h - 1)) * a.rs + pc));
        for (p, dst) in panel.chunks_exact_mut(K::MR).enumerate() {
            for (d, row) in dst.iter_mut().zip(&rows) {
                *d = unsafe { *row.add(p) };
            }
        }
    } else if a.cs == 1 {
        panel.fill(0.0);
        for ii in 0..h {
            // SAFETY (this loop): as above.
            let row = unsafe { a.ptr.add((r + ii) * a.rs + pc) };
            for p in 0..kc {
                panel[p * K::MR + ii] = unsafe { *row.add(p) };
            }
        }
    } else {
        for p in 0..kc {
            for ii in 0..K::MR {
                panel[p * K::MR + ii] = if ii < h {
                    // SAFETY: as above; ii < h.
                    unsafe { *a.ptr.add((r + ii) * a.rs + (pc + p) * a.cs) }
                } else {
                    0.0
                };
            }
        }
    }
}

/// Packs rows `pc..pc+kc` and columns `j0..j0+w` of a matrix B into consecutive panels of
/// `K::NR` columns, the last zero-padded. A row-major B is read row by row across all the
/// panels, so memory is read in order (panel by panel, each row would be a separate short
/// read, and on a wide matrix each in a different page).
///
/// # Safety
/// `b` addresses those elements; `buf` holds `w.div_ceil(K::NR)` panels of `kc × K::NR` floats.
unsafe fn pack_b_block<K: Kernel>(
    b: Mat,
    pc: usize,
    kc: usize,
    j0: usize,
    w: usize,
    buf: &mut [f32],
) {
    let nr = K::NR;
    if b.cs != 1 {
        for (jp, jj) in (0..w).step_by(nr).enumerate() {
            let panel = &mut buf[jp * kc * nr..(jp + 1) * kc * nr];
            // SAFETY: the caller's contract.
            unsafe { pack_b_panel(b, nr, pc, kc, j0 + jj, nr.min(w - jj), panel) };
        }
        return;
    }
    let full = w / nr * nr;
    for p in 0..kc {
        // SAFETY: row pc + p, columns j0..j0 + w of B are in bounds (the caller's contract).
        let row = unsafe { std::slice::from_raw_parts(b.ptr.add((pc + p) * b.rs + j0), w) };
        for (jp, src) in row[..full].chunks_exact(nr).enumerate() {
            // A constant length (NR), so the copy is a few vector moves, not a call.
            buf[jp * kc * nr + p * nr..][..nr].copy_from_slice(src);
        }
        if full < w {
            let dst = &mut buf[full / nr * kc * nr + p * nr..][..nr];
            dst[..w - full].copy_from_slice(&row[full..]);
            dst[w - full..].fill(0.0);
        }
    }
}

/// Packs rows `pc..pc+kc` and columns `j0..j0+w` of a matrix B into one panel of `nr` columns,
/// zero-padded.
///
/// # Safety
/// `b` addresses those elements.
unsafe fn pack_b_panel(
    b: Mat,
    nr: usize,
    pc: usize,
    kc: usize,
    j0: usize,
    w: usize,
    panel: &mut [f32],
) {
    if b.cs != 1 && b.rs == 1 {
        // A transposed B: walk each column down, reading memory in order.
        panel.fill(0.0);
        for j in 0..w {
            // SAFETY (this loop): depths pc..pc+kc and columns j0..j0+w of B are in bounds (the
            // contract).
            let col = unsafe { b.ptr.add(pc + (j0 + j) * b.cs) };
            for p in 0..kc {
                panel[p * nr + j] = unsafe { *col.add(p) };
            }
        }
    } else {
        for p in 0..kc {
            // SAFETY (this loop): as above.
            let start = unsafe { b.ptr.add((pc + p) * b.rs + j0 * b.cs) };
            let dst = &mut panel[p * nr..p * nr + w];
            if b.cs == 1 {
                dst.copy_from_slice(unsafe { std::slice::from_raw_parts(start, w) });
            } else {
                for (j, d) in dst.iter_mut().enumerate() {
                    *d = unsafe { *start.add(j * b.cs) };
                }
            }
            panel[p * nr + w..(p + 1) * nr].fill(0.0);
        }
    }
}

/// A stretch of one im2col panel row read from one image row: lanes `lane..lane + len` take
/// the image elements `first`, `first + stride`, ... (stride: the convolution's column stride).
#[derive(Clone, Copy)]
struct Segment {
    lane: usize,
    len: usize,
    first: *const f32,
}

/// Walks rows `pc..pc+kc` and columns `j0..j0+w` of the im2col matrix `v`, calling
/// `row(panel row, segments)` for each: the kernel assembles the row in registers from the
/// segments (zeros elsewhere, the padding and lanes past `w` included) and stores it once.
///
/// The panel's columns are cut once into runs along output rows; then for each tap a run is one
/// contiguous (stride 1) or strided read of one image row, or nothing where the tap falls in
/// the padding. Inlined into each kernel's `pack_im2col`, so `row` is compiled with its
/// instruction set.
///
/// # Safety
/// `v` addresses its images; `w <= MAX_NR`; `panel` holds `kc` rows of `nr >= w` floats.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn im2col_rows(
    v: &Im2col,
    nr: usize,
    pc: usize,
    kc: usize,
    j0: usize,
    w: usize,
    panel: &mut [f32],
    mut row: impl FnMut(&mut [f32], &[Segment]),
) {
    // (first panel column, length, offset of the image, oy, first ox) of each run.
    let mut runs = [(0usize, 0usize, 0usize, 0usize, 0usize); MAX_NR];
    let mut count = 0;
    let per_image = v.oh * v.ow;
    let mut j = 0;
    let (mut img, mut pos) = (j0 / per_image, j0 % per_image);
    let (mut oy, mut ox) = (pos / v.ow, pos % v.ow);
    while j < w {
        let run = (v.ow - ox).min(w - j);
        runs[count] = (j, run, img * v.image_stride, oy, ox);
        count += 1;
        j += run;
        pos += run;
        ox = 0;
        oy += 1;
        if pos == per_image {
            (img, pos, oy) = (img + 1, 0, 0);
        }
    }
    let runs = &runs[..count];
    let (sy, sx) = (v.stride[0] as isize, v.stride[1] as isize);
    let taps = v.kh * v.kw;
    let (mut ci, mut ky, mut kx) = (pc / taps, pc % taps / v.kw, pc % v.kw);
    let mut segments = [Segment {
        lane: 0,
        len: 0,
        first: std::ptr::null(),
    }; MAX_NR];
    for p in 0..kc {
        let dy = (ky * v.dilation[0]) as isize - v.pad[0] as isize;
        let dx = (kx * v.dilation[1]) as isize - v.pad[1] as isize;
        // Output columns ox with 0 <= ox * sx + dx < w read inside the image row.
        let (lo, hi) = super::conv::in_bounds(dx, sx, v.w as isize, v.ow);
        let channel = ci * v.h;
        let mut count = 0;
        for &(j, run, image, oy, ox) in runs {
            let iy = oy as isize * sy + dy;
            let (a, b) = (lo.clamp(ox, ox + run), hi.clamp(ox, ox + run));
            if iy < 0 || iy >= v.h as isize || b <= a {
                continue;
            }
            // SAFETY: 0 <= iy < h, so this is the start of a row of the channel in the image.
            let start = unsafe { v.x.add(image + (channel + iy as usize) * v.w) };
            segments[count] = Segment {
                lane: j + a - ox,
                len: b - a,
                first: start.wrapping_offset(a as isize * sx + dx),
            };
            count += 1;
        }
        row(&mut panel[p * nr..(p + 1) * nr], &segments[..count]);
        advance(&mut ci, &mut ky, &mut kx, v);
    }
}

/// The next filter tap `(ci, ky, kx)` in row-major order.
fn advance(ci: &mut usize, ky: &mut usize, kx: &mut usize, v: &Im2col) {
    *kx += 1;
    if *kx == v.kw {
        *kx = 0;
        *ky += 1;
        if *ky == v.kh {
            *ky = 0;
            *ci += 1;
        }
    }
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
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    done: Done,
    bp: &mut [f32],
    ap: &mut [f32],
) {
    let (mr, nr) = (K::MR, K::NR);
    let (r0, m) = (rows.start, rows.len());
    let (c0, n) = (cols.start, cols.len());
    let kb = depth_block::<K>(k);
    for jc in (0..n).step_by(K::NC) {
        let nc = K::NC.min(n - jc);
        for pc in (0..k).step_by(kb) {
            let kc = kb.min(k - pc);
            // Packs columns `j0..j0 + w` of the block into `bp` (panel by panel).
            let pack_b = |j0: usize, w: usize, bp: &mut [f32]| {
                // SAFETY: the caller's contract.
                unsafe {
                    match &b {
                        B::Mat(b) => pack_b_block::<K>(*b, pc, kc, c0 + jc + j0, w, bp),
                        B::Im2col(v) => {
                            for (jp, jj) in (0..w).step_by(nr).enumerate() {
                                let panel = &mut bp[jp * kc * nr..(jp + 1) * kc * nr];
                                K::pack_im2col(v, pc, kc, c0 + jc + j0 + jj, nr.min(w - jj), panel)
                            }
                        }
                    }
                }
            };
            // Packs rows `ic..ic + mc` into `ap` (or finds them packed) and returns the block.
            let mut pack_a = |ic: usize, mc: usize| match a {
                A::Mat(a) => {
                    for (ip, i0) in (0..mc).step_by(mr).enumerate() {
                        let panel = &mut ap[ip * kc * mr..(ip + 1) * kc * mr];
                        let h = mr.min(mc - i0);
                        // SAFETY: the caller's contract.
                        unsafe { pack_a_panel::<K>(a, r0 + ic + i0, pc, h, kc, panel) };
                    }
                    ap.as_ptr()
                }
                // SAFETY: block pc's panels start at pc * mpad and rows r0 + ic < m are inside it.
                A::Packed(p) => unsafe { p.ptr().add(pc * p.mpad + (r0 + ic) * kc) },
            };
            // The tiles of rows `ic..ic + mc` and columns `j0..j0 + w` of the block, from the
            // packed rows and columns, GROUP columns at a time; in the last block of depth,
            // each group's rows are reported done while they are in cache.
            let last = pc + kc == k;
            let tiles =
                |a_block: *const f32, (ic, mc): (usize, usize), w: usize, j0, bp: &[f32]| {
                    for g0 in (0..w).step_by(GROUP) {
                        let g1 = (g0 + GROUP).min(w);
                        for jj in (g0..g1).step_by(nr) {
                            for (ip, i0) in (0..mc).step_by(mr).enumerate() {
                                // SAFETY: the tile's first element is inside this thread's rows and
                                // columns of C, and the packed panels hold kc * MR and kc * NR
                                // floats; micro writes only the h x w valid part.
                                unsafe {
                                    let cp = c.add((r0 + ic + i0) * ldc + c0 + jc + j0 + jj);
                                    K::micro(
                                        kc,
                                        a_block.add(ip * kc * mr),
                                        bp.as_ptr().add(jj / nr * kc * nr),
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
                    pack_b(j0, w, bp);
                    tiles(a_block, (0, m), w, j0, bp);
                }
            } else {
                pack_b(0, nc, bp);
                for ic in (0..m).step_by(K::MC) {
                    let mc = K::MC.min(m - ic);
                    let a_block = pack_a(ic, mc);
                    tiles(a_block, (ic, mc), nc, 0, bp);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kernel this CPU runs.
    fn kernels() -> Vec<Isa> {
        let host = crate::cpu::Features::of(None).expect("the host target");
        let without_512 = crate::cpu::Features {
            avx512f: false,
            ..host
        };
        let mut isas: Vec<Isa> = [host, without_512]
            .iter()
            .filter_map(Isa::for_target)
            .collect();
        isas.dedup();
        isas
    }

    /// A packed A, and B as the im2col view of two images (strided, padded, dilated, with more
    /// columns than a panel and more taps than a depth block), against explicit im2col.
    #[test]
    fn packed_a_and_implicit_im2col() {
        // (channels, h, w, kh, kw, stride, dilation, pad, output channels)
        let cases = [
            (3, 9, 8, 3, 3, [2, 1], [1, 2], [1, 2], 13),
            (30, 7, 7, 3, 3, [1, 1], [1, 1], [1, 1], 25),
            // Few columns and enough rows: with a packed A, threads split the rows.
            (20, 12, 11, 5, 4, [3, 2], [1, 1], [2, 0], 40),
        ];
        for (isa, (ch, h, w, kh, kw, st, dil, pad, o)) in kernels()
            .into_iter()
            .flat_map(|isa| cases.map(|case| (isa, case)))
        {
            let oh = (h + 2 * pad[0] - dil[0] * (kh - 1) - 1) / st[0] + 1;
            let ow = (w + 2 * pad[1] - dil[1] * (kw - 1) - 1) / st[1] + 1;
            let images = 2;
            let x: Vec<f32> = (0..images * ch * h * w)
                .map(|i| ((i * 7 % 19) as f32 - 9.0) / 4.0)
                .collect();
            let k = ch * kh * kw;
            let n = images * oh * ow;
            let filt: Vec<f32> = (0..o * k)
                .map(|i| ((i * 5 % 11) as f32 - 5.0) / 8.0)
                .collect();
            // Explicit im2col: row (c, ky, kx), column (image, oy, ox).
            let mut cols = vec![0.0f32; k * n];
            for c in 0..ch {
                for ky in 0..kh {
                    for kx in 0..kw {
                        let r = (c * kh + ky) * kw + kx;
                        for im in 0..images {
                            for oy in 0..oh {
                                for ox in 0..ow {
                                    let iy = (oy * st[0] + ky * dil[0]) as isize - pad[0] as isize;
                                    let ix = (ox * st[1] + kx * dil[1]) as isize - pad[1] as isize;
                                    if (0..h as isize).contains(&iy)
                                        && (0..w as isize).contains(&ix)
                                    {
                                        cols[r * n + (im * oh + oy) * ow + ox] =
                                            x[((im * ch + c) * h + iy as usize) * w + ix as usize];
                                    }
                                }
                            }
                        }
                    }
                }
            }
            let fa = Mat {
                ptr: filt.as_ptr(),
                rs: k,
                cs: 1,
            };
            let mut want = vec![0.0f32; o * n];
            // SAFETY: the operands are vectors of o x k, k x n and o x n floats.
            unsafe {
                sgemm(
                    isa,
                    o,
                    n,
                    k,
                    fa,
                    Mat {
                        ptr: cols.as_ptr(),
                        rs: n,
                        cs: 1,
                    },
                    want.as_mut_ptr(),
                    n,
                    false,
                    1,
                    None,
                )
            };
            let view = Im2col {
                x: x.as_ptr(),
                image_stride: ch * h * w,
                h,
                w,
                kh,
                kw,
                oh,
                ow,
                stride: st,
                dilation: dil,
                pad,
            };
            // SAFETY: `filt` holds o x k floats.
            let packed = unsafe { PackedA::new(isa, o, k, fa) };
            for threads in [1, 2] {
                for a in [A::Mat(fa), A::Packed(&packed)] {
                    let mut got = vec![f32::NAN; o * n];
                    // SAFETY: as for the sgemm above; `view` reads the two images in `x`.
                    unsafe {
                        product(
                            isa,
                            o,
                            n,
                            k,
                            a,
                            B::Im2col(view),
                            got.as_mut_ptr(),
                            n,
                            false,
                            threads,
                            None,
                        )
                    };
                    assert_eq!(
                        got, want,
                        "{isa:?}, case {ch}x{h}x{w} k{kh}x{kw}, {threads} threads"
                    );
                }
            }
        }
    }

    /// `done` hears of every element of C exactly once, after it holds its final value: for
    /// one block of rows and several, one thread and two, a packed A and a plain one.
    #[test]
    fn reports_each_row_piece_once_when_final() {
        use std::sync::Mutex;
        for (isa, (m, n, k)) in kernels()
            .into_iter()
            .flat_map(|isa| [(20, 700, 300), (300, 90, 40), (7, 5, 0)].map(|s| (isa, s)))
        {
            let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 - 3.0).collect();
            let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 - 2.0).collect();
            let want: Vec<f32> = (0..m * n)
                .map(|ij| (0..k).map(|p| a[ij / n * k + p] * b[p * n + ij % n]).sum())
                .collect();
            let fa = Mat::rows(a.as_ptr(), k);
            // SAFETY: `a` holds m x k floats.
            let packed = unsafe { PackedA::new(isa, m, k, fa) };
            for threads in [1, 2] {
                for a_op in [A::Mat(fa), A::Packed(&packed)] {
                    let mut c = vec![f32::NAN; m * n];
                    let seen = Mutex::new(vec![0u8; m * n]);
                    // SAFETY: `done` only reads elements the GEMM has finished writing.
                    let cp = unsafe { SendPtr::new(c.as_mut_ptr()) };
                    let done = |i: usize, cols: std::ops::Range<usize>| {
                        let mut seen = seen.lock().unwrap();
                        for j in cols {
                            seen[i * n + j] += 1;
                            // SAFETY: (i, j) is inside C; its writer has finished it.
                            let got = unsafe { *cp.get().add(i * n + j) };
                            assert_eq!(got, want[i * n + j], "{isa:?} {m}x{n}x{k} ({i},{j})");
                        }
                    };
                    // SAFETY: the operands address m x k, k x n and m x n floats.
                    unsafe {
                        product(
                            isa,
                            m,
                            n,
                            k,
                            a_op,
                            B::Mat(Mat::rows(b.as_ptr(), n)),
                            c.as_mut_ptr(),
                            n,
                            false,
                            threads,
                            Some(&done),
                        )
                    };
                    let seen = seen.into_inner().unwrap();
                    assert!(seen.iter().all(|&s| s == 1), "{isa:?} {m}x{n}x{k}");
                }
            }
        }
    }

    #[test]
    fn matches_a_plain_product() {
        let shapes = [
            (1, 1, 1),
            (12, 32, 5),
            (13, 33, 385),
            (70, 100, 30),
            (5, 3, 800),
            (130, 65, 400),
            // More rows than either kernel's MC block, depth across two KC blocks.
            (200, 40, 300),
        ];
        for (isa, (m, n, k)) in kernels()
            .into_iter()
            .flat_map(|isa| shapes.map(|shape| (isa, shape)))
        {
            let a: Vec<f32> = (0..m * k)
                .map(|i| ((i * 7 % 13) as f32 - 6.0) / 8.0)
                .collect();
            let b: Vec<f32> = (0..k * n)
                .map(|i| ((i * 5 % 11) as f32 - 5.0) / 4.0)
                .collect();
            // Plain, then with A read transposed from its transpose and B likewise, then
            // accumulating onto the first product.
            let at: Vec<f32> = (0..k * m).map(|i| a[(i % m) * k + i / m]).collect();
            let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
            let plain = (
                Mat {
                    ptr: a.as_ptr(),
                    rs: k,
                    cs: 1,
                },
                Mat {
                    ptr: b.as_ptr(),
                    rs: n,
                    cs: 1,
                },
            );
            let strided = (
                Mat {
                    ptr: at.as_ptr(),
                    rs: 1,
                    cs: m,
                },
                Mat {
                    ptr: bt.as_ptr(),
                    rs: 1,
                    cs: k,
                },
            );
            let mut c = vec![f32::NAN; m * n];
            for (pass, (ma, mb), acc) in [
                (1.0, plain, false),
                (1.0, strided, false),
                (2.0, strided, true),
            ] {
                // SAFETY: ma, mb and c address m x k, k x n and m x n floats of live vectors.
                unsafe { sgemm(isa, m, n, k, ma, mb, c.as_mut_ptr(), n, acc, 2, None) };
                for i in 0..m {
                    for j in 0..n {
                        let want: f64 = pass
                            * (0..k)
                                .map(|p| a[i * k + p] as f64 * b[p * n + j] as f64)
                                .sum::<f64>();
                        let got = c[i * n + j] as f64;
                        assert!(
                            (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                            "{isa:?} {m}x{n}x{k} at ({i},{j}), pass {pass}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}

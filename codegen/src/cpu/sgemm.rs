//! Single-precision matrix product with an AVX-512 microkernel (BLIS-style).
//!
//! `C (+)= A · B` for `A [m, k]` and `B [k, n]` with any row and column strides (so transposed
//! operands cost nothing extra) and a row-major `C [m, n]` with a leading dimension. B is
//! packed into panels of `NR = 32` columns and A into panels of `MR = 12` rows, for blocks of
//! `KC` along k; a 12×32 microkernel keeps 24 `zmm` accumulators and reads each packed element
//! once per block. Threads take disjoint column ranges of C and pack their own panels. The
//! `gemm` crate is used instead where AVX-512F is missing (its own AVX-512 kernels need a
//! nightly compiler).
//!
//! Two operand forms serve convolutions: A packed once ahead of time ([`PackedA`], a constant
//! filter), and B read as the im2col matrix of images without building it ([`Im2col`]): each
//! panel is gathered straight from the images, so the columns never go through memory. With
//! a packed A and few columns (a late convolution layer: 49 output positions), threads take
//! row ranges instead.
//!
//! Longer than most files on purpose: the packing routines, the blocking loops and the
//! microkernel share one panel layout (`MR`, `NR`, `KC`) and are only correct together.

use super::bytes::{Line, line_floats, lines};
use super::send_ptr::SendPtr;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// A strided `f32` operand.
pub(crate) type Mat = super::matmul::Mat<f32>;

const MR: usize = 12;
const NR: usize = 32;
const KC: usize = 256;
const MC: usize = 144;
const NC: usize = 3072;

/// Whether this CPU runs the AVX-512 kernel.
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// A, packed once into the microkernel's panels: for each block of `KC` along k, the panels of
/// `MR` rows in order (zero-padded), so the panel of rows `r..` in block `pc` starts at
/// `pc * mpad + r * kc`.
pub(crate) struct PackedA {
    data: Vec<Line>,
    m: usize,
    k: usize,
    mpad: usize,
}

impl PackedA {
    /// Packs the `m×k` matrix `a`.
    ///
    /// # Safety
    /// `a` addresses an `m×k` matrix with its strides.
    pub(crate) unsafe fn new(m: usize, k: usize, a: Mat) -> PackedA {
        let mpad = m.div_ceil(MR) * MR;
        let mut data = aligned(mpad * k);
        let buf = &mut line_floats(&mut data)[..mpad * k];
        for pc in (0..k).step_by(KC) {
            let kc = KC.min(k - pc);
            for r in (0..m).step_by(MR) {
                let off = pc * mpad + r * kc;
                // SAFETY: the caller's contract.
                unsafe { pack_a_panel(a, r, pc, MR.min(m - r), kc, &mut buf[off..off + kc * MR]) };
            }
        }
        PackedA { data, m, k, mpad }
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

/// The right operand: a matrix, or the columns of a convolution.
#[derive(Clone, Copy)]
pub(crate) enum B {
    Mat(Mat),
    Im2col(Im2col),
}

/// `C = A · B`, or `C += A · B` with `accumulate`, for plain matrices.
///
/// # Safety
/// `available()` must be true; `a` and `b` must address `m×k` and `k×n` matrices with their
/// strides, `c` an `m×n` row-major matrix with leading dimension `ldc` that overlaps neither.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn sgemm(
    m: usize,
    n: usize,
    k: usize,
    a: Mat,
    b: Mat,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    threads: usize,
) {
    // SAFETY: the caller's contract.
    unsafe { product(m, n, k, A::Mat(a), B::Mat(b), c, ldc, accumulate, threads) }
}

/// `C (+)= A · B` with either form of each operand.
///
/// # Safety
/// As for [`sgemm`]; a packed A is `m×k`; an [`Im2col`] B has `k = channels·kh·kw` rows and
/// `n = images·oh·ow` columns and addresses its images.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn product(
    m: usize,
    n: usize,
    k: usize,
    a: A,
    b: B,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    threads: usize,
) {
    if let A::Packed(p) = a {
        assert!(p.m == m && p.k == k, "a packed A of the product's shape");
    }
    if m == 0 || n == 0 || (k == 0 && accumulate) {
        return;
    }
    if k == 0 {
        for i in 0..m {
            // SAFETY: row i of C holds n floats at c + i * ldc (the caller's contract).
            unsafe { std::ptr::write_bytes(c.add(i * ldc), 0, n) };
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
    let by_rows = matches!(a, A::Packed(_)) && n.div_ceil(NR) < 2 * threads && m >= MR * threads;
    let (parts, chunk) = if by_rows {
        let parts = threads.min(m.div_ceil(MR));
        (parts, m.div_ceil(parts).div_ceil(MR) * MR)
    } else {
        let parts = threads.clamp(1, n.div_ceil(NR));
        (parts, n.div_ceil(parts).div_ceil(NR) * NR)
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
        unsafe { block(rows, cols, k, a.get(), b.get(), cp.get(), ldc, accumulate) };
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
/// so that every `zmm` load of a panel is aligned (an unaligned one splits a cache line).
fn aligned(n: usize) -> Vec<Line> {
    lines(n as u64 * 4)
}

/// The blocked product of rows `rows` and columns `cols` of C on one thread (`rows` starts at a
/// multiple of MR).
///
/// # Safety
/// As for [`product`]; no other thread writes these rows and columns of C meanwhile.
#[allow(clippy::too_many_arguments)]
unsafe fn block(
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    k: usize,
    a: A,
    b: B,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    let (m, n) = (rows.len(), cols.len());
    if m == 0 || n == 0 {
        return;
    }
    let kc_max = KC.min(k);
    let (nb, na) = (
        kc_max * NC.min(n.div_ceil(NR) * NR),
        match a {
            A::Mat(_) => kc_max * MC.min(m.div_ceil(MR) * MR),
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
        unsafe { block_in(rows, cols, k, a, b, c, ldc, accumulate, bp, ap) }
    })
}

/// Packs rows `r..r+h` and depths `pc..pc+kc` of `a` into one panel of MR rows, zero-padded.
///
/// # Safety
/// `a` addresses those elements.
unsafe fn pack_a_panel(a: Mat, r: usize, pc: usize, h: usize, kc: usize, panel: &mut [f32]) {
    if a.cs == 1 {
        // A row-major A: walk each row along k, reading memory in order.
        if h < MR {
            panel.fill(0.0);
        }
        for ii in 0..h {
            // SAFETY (this loop): rows r..r+h and depths pc..pc+kc of A are in bounds (the contract).
            let row = unsafe { a.ptr.add((r + ii) * a.rs + pc) };
            for p in 0..kc {
                panel[p * MR + ii] = unsafe { *row.add(p) };
            }
        }
    } else {
        for p in 0..kc {
            for ii in 0..MR {
                panel[p * MR + ii] = if ii < h {
                    // SAFETY: as above; ii < h.
                    unsafe { *a.ptr.add((r + ii) * a.rs + (pc + p) * a.cs) }
                } else {
                    0.0
                };
            }
        }
    }
}

/// Packs rows `pc..pc+kc` and columns `j0..j0+w` of a matrix B into one panel of NR columns,
/// zero-padded.
///
/// # Safety
/// `b` addresses those elements.
unsafe fn pack_b_panel(b: Mat, pc: usize, kc: usize, j0: usize, w: usize, panel: &mut [f32]) {
    if b.cs != 1 && b.rs == 1 {
        // A transposed B: walk each column down, reading memory in order.
        panel.fill(0.0);
        for j in 0..w {
            // SAFETY (this loop): depths pc..pc+kc and columns j0..j0+w of B are in bounds (the
            // contract).
            let col = unsafe { b.ptr.add(pc + (j0 + j) * b.cs) };
            for p in 0..kc {
                panel[p * NR + j] = unsafe { *col.add(p) };
            }
        }
    } else {
        for p in 0..kc {
            // SAFETY (this loop): as above.
            let start = unsafe { b.ptr.add((pc + p) * b.rs + j0 * b.cs) };
            let dst = &mut panel[p * NR..p * NR + w];
            if b.cs == 1 {
                dst.copy_from_slice(unsafe { std::slice::from_raw_parts(start, w) });
            } else {
                for (j, d) in dst.iter_mut().enumerate() {
                    *d = unsafe { *start.add(j * b.cs) };
                }
            }
            panel[p * NR + w..(p + 1) * NR].fill(0.0);
        }
    }
}

/// Packs rows `pc..pc+kc` and columns `j0..j0+w` of the im2col matrix `v` into one panel,
/// gathering from the images. The panel's columns are cut once into runs along output rows;
/// then for each tap every run is a contiguous (stride 1) or strided read of one image row, with
/// zeros where the tap falls in the padding.
///
/// Each panel row is assembled in two registers by masked loads (stride 1) or masked gathers
/// (the lanes of a run from its image row, zeros elsewhere, lanes past `w` too) and stored once:
/// no per-run copy or fill calls.
///
/// # Safety
/// `v` addresses its images; the CPU has AVX-512F (`available()`); a row's in-image offsets
/// (`ox * stride`) fit an `i32` (the gather's index).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn pack_im2col_panel(
    v: &Im2col,
    pc: usize,
    kc: usize,
    j0: usize,
    w: usize,
    panel: &mut [f32],
) {
    // (first panel column, length, offset of the image, oy, first ox) of each run.
    let mut runs = [(0usize, 0usize, 0usize, 0usize, 0usize); NR];
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
    for p in 0..kc {
        let dst = &mut panel[p * NR..(p + 1) * NR];
        let dy = (ky * v.dilation[0]) as isize - v.pad[0] as isize;
        let dx = (kx * v.dilation[1]) as isize - v.pad[1] as isize;
        // Output columns ox with 0 <= ox * sx + dx < w read inside the image row.
        let (lo, hi) = super::conv::in_bounds(dx, sx, v.w as isize, v.ow);
        let channel = ci * v.h;
        {
            let (mut v0, mut v1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
            for &(j, run, image, oy, ox) in runs {
                let iy = oy as isize * sy + dy;
                let (a, b) = (lo.clamp(ox, ox + run), hi.clamp(ox, ox + run));
                if iy < 0 || iy >= v.h as isize || b <= a {
                    continue;
                }
                // Panel lanes pj..pj + (b - a) take image columns (a + t) * sx + dx; only the
                // masked lanes are read.
                let pj = j + a - ox;
                // SAFETY: 0 <= iy < h, so this is the start of a row of the channel in the image.
                let row = unsafe { v.x.add(image + (channel + iy as usize) * v.w) };
                let first = row.wrapping_offset(a as isize * sx + dx);
                let mask = ((1u64 << (b - a)) - 1) << pj;
                let (m0, m1) = (mask as u16, (mask >> 16) as u16);
                if sx == 1 {
                    // Lane i reads base[i].
                    let base = first.wrapping_sub(pj);
                    if m0 != 0 {
                        // SAFETY: masked lanes are not read; the unmasked ones are columns lo..hi of the row.
                        v0 = unsafe { _mm512_mask_loadu_ps(v0, m0, base) };
                    }
                    if m1 != 0 {
                        // SAFETY: as above.
                        v1 = unsafe { _mm512_mask_loadu_ps(v1, m1, base.wrapping_add(16)) };
                    }
                } else {
                    // Lane i reads first[(i - pj) * sx].
                    let lane =
                        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
                    let at = |half: i32| {
                        let i = _mm512_add_epi32(lane, _mm512_set1_epi32(16 * half - pj as i32));
                        _mm512_mullo_epi32(i, _mm512_set1_epi32(sx as i32))
                    };
                    if m0 != 0 {
                        // SAFETY: only unmasked lanes are gathered, each a column inside the row.
                        v0 = unsafe { _mm512_mask_i32gather_ps::<4>(v0, m0, at(0), first) };
                    }
                    if m1 != 0 {
                        // SAFETY: as above.
                        v1 = unsafe { _mm512_mask_i32gather_ps::<4>(v1, m1, at(1), first) };
                    }
                }
            }
            // SAFETY: `dst` is one panel row of NR = 32 floats.
            unsafe {
                _mm512_storeu_ps(dst.as_mut_ptr(), v0);
                _mm512_storeu_ps(dst.as_mut_ptr().add(16), v1);
            }
        }
        advance(&mut ci, &mut ky, &mut kx, v);
    }
}

/// # Safety
/// Never called: `available()` is false off x86-64.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn pack_im2col_panel(_: &Im2col, _: usize, _: usize, _: usize, _: usize, _: &mut [f32]) {
    unreachable!("only called when available()")
}

/// The next filter tap `(ci, ky, kx)` in row-major order.
#[cfg(target_arch = "x86_64")]
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
unsafe fn block_in(
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    k: usize,
    a: A,
    b: B,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    bp: &mut [f32],
    ap: &mut [f32],
) {
    let (r0, m) = (rows.start, rows.len());
    let (c0, n) = (cols.start, cols.len());
    for jc in (0..n).step_by(NC) {
        let nc = NC.min(n - jc);
        for pc in (0..k).step_by(KC) {
            let kc = KC.min(k - pc);
            for (jp, j0) in (0..nc).step_by(NR).enumerate() {
                let w = NR.min(nc - j0);
                let panel = &mut bp[jp * kc * NR..(jp + 1) * kc * NR];
                let col = c0 + jc + j0;
                // SAFETY: the caller's contract.
                unsafe {
                    match &b {
                        B::Mat(b) => pack_b_panel(*b, pc, kc, col, w, panel),
                        B::Im2col(v) => pack_im2col_panel(v, pc, kc, col, w, panel),
                    }
                }
            }
            for ic in (0..m).step_by(MC) {
                let mc = MC.min(m - ic);
                let a_block = match a {
                    A::Mat(a) => {
                        for (ip, i0) in (0..mc).step_by(MR).enumerate() {
                            let panel = &mut ap[ip * kc * MR..(ip + 1) * kc * MR];
                            // SAFETY: the caller's contract.
                            unsafe {
                                pack_a_panel(a, r0 + ic + i0, pc, MR.min(mc - i0), kc, panel)
                            };
                        }
                        ap.as_ptr()
                    }
                    // SAFETY: block pc's panels start at pc * mpad and rows r0 + ic < m are inside it.
                    A::Packed(p) => unsafe { p.ptr().add(pc * p.mpad + (r0 + ic) * kc) },
                };
                for (jp, j0) in (0..nc).step_by(NR).enumerate() {
                    for (ip, i0) in (0..mc).step_by(MR).enumerate() {
                        // SAFETY: the tile's first element is inside this thread's rows and
                        // columns of C, and the packed panels hold kc * MR and kc * NR floats;
                        // micro writes only the h x w valid part.
                        let cp = unsafe { c.add((r0 + ic + i0) * ldc + c0 + jc + j0) };
                        // SAFETY: see `cp`.
                        unsafe {
                            micro(
                                kc,
                                a_block.add(ip * kc * MR),
                                bp.as_ptr().add(jp * kc * NR),
                                cp,
                                ldc,
                                accumulate || pc > 0,
                                MR.min(mc - i0),
                                NR.min(nc - j0),
                            )
                        };
                    }
                }
            }
        }
    }
}

/// One MR×NR tile: `C (+)= Ap · Bp` over `kc`, writing only the `h × w` valid part.
///
/// # Safety
/// The CPU has AVX-512F; `ap` and `bp` hold `kc` rows of MR and NR floats; `c` addresses `h × w`
/// floats with leading dimension `ldc` that no other thread touches.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
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
) {
    let mut acc = [[_mm512_setzero_ps(); 2]; MR];
    for p in 0..kc {
        // SAFETY (this function): Bp and Ap hold kc panels rows of NR and MR floats, and C has
        // h x w valid elements at c with leading dimension ldc (the caller's contract).
        let (b0, b1) = unsafe {
            (
                _mm512_loadu_ps(bp.add(p * NR)),
                _mm512_loadu_ps(bp.add(p * NR + 16)),
            )
        };
        for (i, row) in acc.iter_mut().enumerate() {
            // SAFETY: element i of depth p of the A panel.
            let av = _mm512_set1_ps(unsafe { *ap.add(p * MR + i) });
            row[0] = _mm512_fmadd_ps(av, b0, row[0]);
            row[1] = _mm512_fmadd_ps(av, b1, row[1]);
        }
    }
    if h == MR && w == NR {
        for (i, row) in acc.iter().enumerate() {
            for (half, v) in row.iter().enumerate() {
                // SAFETY: a full tile: rows 0..MR and columns 0..NR of C are valid.
                let dst = unsafe { c.add(i * ldc + half * 16) };
                let v = if accumulate {
                    // SAFETY: `dst` is inside the full tile (above).
                    _mm512_add_ps(*v, unsafe { _mm512_loadu_ps(dst) })
                } else {
                    *v
                };
                // SAFETY: as above.
                unsafe { _mm512_storeu_ps(dst, v) };
            }
        }
        return;
    }
    let mut tile = [0.0f32; MR * NR];
    for (i, row) in acc.iter().enumerate() {
        for (half, v) in row.iter().enumerate() {
            // SAFETY: `tile` holds MR x NR floats.
            unsafe { _mm512_storeu_ps(tile.as_mut_ptr().add(i * NR + half * 16), *v) };
        }
    }
    for i in 0..h {
        for j in 0..w {
            // SAFETY: i < h and j < w, inside the valid part of the tile.
            let dst = unsafe { c.add(i * ldc + j) };
            // SAFETY: as above.
            unsafe {
                *dst = if accumulate {
                    *dst + tile[i * NR + j]
                } else {
                    tile[i * NR + j]
                }
            };
        }
    }
}

/// # Safety
/// Never called: `available()` is false off x86-64.
#[cfg(not(target_arch = "x86_64"))]
#[allow(clippy::too_many_arguments)]
unsafe fn micro(
    _: usize,
    _: *const f32,
    _: *const f32,
    _: *mut f32,
    _: usize,
    _: bool,
    _: usize,
    _: usize,
) {
    unreachable!("only called when available()")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A packed A, and B as the im2col view of two images (strided, padded, dilated, with more
    /// columns than a panel and more taps than a depth block), against explicit im2col.
    #[test]
    fn packed_a_and_implicit_im2col() {
        if !available() {
            return;
        }
        // (channels, h, w, kh, kw, stride, dilation, pad, output channels)
        let cases = [
            (3, 9, 8, 3, 3, [2, 1], [1, 2], [1, 2], 13),
            (30, 7, 7, 3, 3, [1, 1], [1, 1], [1, 1], 25),
            // Few columns and enough rows: with a packed A, threads split the rows.
            (20, 12, 11, 5, 4, [3, 2], [1, 1], [2, 0], 40),
        ];
        for (ch, h, w, kh, kw, st, dil, pad, o) in cases {
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
            let packed = unsafe { PackedA::new(o, k, fa) };
            for threads in [1, 2] {
                for a in [A::Mat(fa), A::Packed(&packed)] {
                    let mut got = vec![f32::NAN; o * n];
                    // SAFETY: as for the sgemm above; `view` reads the two images in `x`.
                    unsafe {
                        product(
                            o,
                            n,
                            k,
                            a,
                            B::Im2col(view),
                            got.as_mut_ptr(),
                            n,
                            false,
                            threads,
                        )
                    };
                    assert_eq!(got, want, "case {ch}x{h}x{w} k{kh}x{kw}, {threads} threads");
                }
            }
        }
    }

    #[test]
    fn matches_a_plain_product() {
        if !available() {
            return;
        }
        for &(m, n, k) in &[
            (1, 1, 1),
            (12, 32, 5),
            (13, 33, 385),
            (70, 100, 30),
            (5, 3, 800),
            (130, 65, 400),
        ] {
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
                unsafe { sgemm(m, n, k, ma, mb, c.as_mut_ptr(), n, acc, 2) };
                for i in 0..m {
                    for j in 0..n {
                        let want: f64 = pass
                            * (0..k)
                                .map(|p| a[i * k + p] as f64 * b[p * n + j] as f64)
                                .sum::<f64>();
                        let got = c[i * n + j] as f64;
                        assert!(
                            (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                            "{m}x{n}x{k} at ({i},{j}), pass {pass}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}

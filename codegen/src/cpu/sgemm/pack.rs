//! Packing operands into the kernels' panels: rows of A, columns of B from a strided matrix,
//! and columns of an implicit im2col matrix gathered from the images (the walk shared by the
//! kernels; each assembles the rows in its own registers).

use super::{Im2col, Kernel, MAX_MR, MAX_NR, Mat};

/// Packs rows `r..r+h` and depths `pc..pc+kc` of `a` into one panel of `K::MR` rows,
/// zero-padded. Generic over the kernel so that the panel's row count is a constant and the
/// copies unroll.
///
/// # Safety
/// `a` addresses those elements.
pub(super) unsafe fn pack_a_panel<K: Kernel>(
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
pub(super) unsafe fn pack_b_block<K: Kernel>(
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
pub(super) struct Segment {
    pub lane: usize,
    pub len: usize,
    pub first: *const f32,
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
pub(super) unsafe fn im2col_rows(
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
        let (lo, hi) = crate::cpu::conv::in_bounds(dx, sx, v.w as isize, v.ow);
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

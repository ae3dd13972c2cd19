//! Depthwise `conv_integer` (one input and one output channel per group, as MobileNet's 3x3
//! layers): each channel on its own, directly, instead of the product kernels, whose tiles
//! would hold one channel.
//!
//! Per channel, the input less its zero point is copied once into a padded i32 plane (the
//! padding 0, which is what a tap on the input's zero point adds), and each output row adds,
//! for each tap, the plane's row times the tap less the filter's zero point: along the row the
//! adds are independent, so they run as vectors (AVX-512 or AVX2 where the host has it, the
//! same code compiled for each). Exact: the products and sums wrap in i32 as the interpreter's.
//! Channels (of every image) are split across the thread pool.

use super::quant::levels;
use crate::cpu::send_ptr::SendPtr;

thread_local! {
    /// The padded plane, kept between calls.
    static PLANE: std::cell::RefCell<Vec<i32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The shape of a depthwise convolution: `[N, C, H, W]` in, `[N, C, oH, oW]` out, a `kh x kw`
/// filter per channel, with its strides, dilations and padding (top, left, bottom, right).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Depthwise {
    pub xd: [usize; 4],
    pub yd: [usize; 4],
    pub kernel: [usize; 2],
    pub strides: [usize; 2],
    pub dilations: [usize; 2],
    pub pads: [usize; 4],
}

/// Which instructions the loops are compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Isa {
    Avx512,
    Avx2,
    Portable,
}

impl Depthwise {
    /// `out` (`[N, C, oH, oW]` i32) = the convolution of bytes `x` and `w` (`i8` where `signed`
    /// says, else `u8`) less zero points `xz` (one) and `wz` (one, or one per channel).
    pub(super) fn run(
        &self,
        [x, w, xz, wz]: [&[u8]; 4],
        [sx, sw]: [bool; 2],
        isa: Isa,
        out: &mut [i32],
    ) {
        let [n, c, h, wi] = self.xd;
        let [_, _, oh, ow] = self.yd;
        let [kh, kw] = self.kernel;
        let zx = levels(&xz[..1], sx)[0];
        let wz = levels(wz, sw);
        // Each channel's taps less its zero point.
        let taps: Vec<i32> = (levels(w, sw).iter().enumerate())
            .map(|(i, &t)| t.wrapping_sub(wz[if wz.len() == 1 { 0 } else { i / (kh * kw) }]))
            .collect();
        // SAFETY: each item writes its own channel's block of `out` only.
        let dst = unsafe { SendPtr::new(out.as_mut_ptr()) };
        let item = |i: usize| {
            let ch = i % c;
            let plane = &x[i * h * wi..][..h * wi];
            // SAFETY: item `i` writes its own channel's `oh * ow` outputs alone.
            let y = unsafe { std::slice::from_raw_parts_mut(dst.get().add(i * oh * ow), oh * ow) };
            let taps = &taps[ch * kh * kw..][..kh * kw];
            PLANE.with(|p| {
                let mut p = p.borrow_mut();
                // SAFETY (each): the ISA was checked by the caller.
                match isa {
                    #[cfg(target_arch = "x86_64")]
                    Isa::Avx512 => unsafe { self.channel_avx512(plane, sx, zx, taps, &mut p, y) },
                    #[cfg(target_arch = "x86_64")]
                    Isa::Avx2 => unsafe { self.channel_avx2(plane, sx, zx, taps, &mut p, y) },
                    _ => self.channel(plane, sx, zx, taps, &mut p, y),
                }
            });
        };
        let work = n * c * oh * ow * kh * kw;
        if work >= 1 << 16 {
            crate::cpu::pool::for_each(n * c, &item);
        } else {
            (0..n * c).for_each(item);
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn channel_avx512(
        &self,
        x: &[u8],
        sx: bool,
        zx: i32,
        taps: &[i32],
        plane: &mut Vec<i32>,
        y: &mut [i32],
    ) {
        self.channel(x, sx, zx, taps, plane, y)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn channel_avx2(
        &self,
        x: &[u8],
        sx: bool,
        zx: i32,
        taps: &[i32],
        plane: &mut Vec<i32>,
        y: &mut [i32],
    ) {
        self.channel(x, sx, zx, taps, plane, y)
    }

    /// One channel: `x` (`H x W` bytes) less `zx` into the padded `plane`, then `y` (`oH x
    /// oW`) row by row. With a column stride `s` above 1 the plane is kept as `s` phases
    /// (columns `r, r + s, r + 2s, ...` together), so that every tap reads a contiguous run
    /// for a row of outputs.
    #[inline(always)]
    fn channel(
        &self,
        x: &[u8],
        sx: bool,
        zx: i32,
        taps: &[i32],
        plane: &mut Vec<i32>,
        y: &mut [i32],
    ) {
        let [_, _, h, w] = self.xd;
        let ow = self.yd[3];
        let [kh, kw] = self.kernel;
        let [sh, s] = self.strides;
        let [dh, dw] = self.dilations;
        let [pt, pl, pb, pr] = self.pads;
        let hp = h + pt + pb;
        let wq = (w + pl + pr).div_ceil(s);
        // Padded column `pc` of padded row `row` is at `(pc % s * hp + row) * wq + pc / s`.
        plane.clear();
        plane.resize(s * hp * wq, 0);
        for (iy, row) in x.chunks_exact(w).enumerate() {
            for r in 0..s {
                // Phase `r`'s columns `j` that fall inside the row: `j * s + r - pl` in `0..w`.
                let first = pl.saturating_sub(r).div_ceil(s);
                let end = (w + pl).saturating_sub(r).div_ceil(s).max(first);
                let dst = &mut plane[(r * hp + iy + pt) * wq..][first..end];
                let from = (first * s + r - pl..).step_by(s);
                for (d, ix) in dst.iter_mut().zip(from) {
                    let b = row[ix];
                    let v = if sx { b as i8 as i32 } else { b as i32 };
                    *d = v.wrapping_sub(zx);
                }
            }
        }
        for (oy, out) in y.chunks_exact_mut(ow).enumerate() {
            out.fill(0);
            for ky in 0..kh {
                let row = oy * sh + ky * dh;
                for kx in 0..kw {
                    let t = taps[ky * kw + kx];
                    let off = kx * dw;
                    let src = &plane[(off % s * hp + row) * wq + off / s..][..ow];
                    for (o, &v) in out.iter_mut().zip(src) {
                        *o = o.wrapping_add(v.wrapping_mul(t));
                    }
                }
            }
        }
    }
}

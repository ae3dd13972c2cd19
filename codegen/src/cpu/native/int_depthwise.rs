//! Depthwise `conv_integer` (one input and one output channel per group, as MobileNet's 3x3
//! layers): each channel on its own, directly, instead of the product kernels, whose tiles
//! would hold one channel.
//!
//! Per channel, the input less its zero point is copied once into a padded plane (the padding
//! 0, which is what a tap on the input's zero point adds), and each output adds, for each tap,
//! the plane's element times the tap less the filter's zero point. On AVX2 and AVX-512 the plane
//! and sums are f32, exact for filters of up to 258 taps, in register tiles
//! ([`super::exact_depthwise`]); elsewhere i32, each tap a pass over the rows (vectors the
//! compiler makes, for AVX-512 or AVX2 where the host has it). Exact: the products and sums
//! wrap in i32 as the interpreter's. Channels (of every image) are split across the thread
//! pool.

use super::quant::levels;
use super::requant::Bound;
use crate::cpu::send_ptr::SendPtr;

thread_local! {
    /// The padded plane and a channel's sums (where a chain follows), kept between calls.
    static PLANE: std::cell::RefCell<(Vec<i32>, Vec<i32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
    /// The f32 kernel's padded plane and a channel's sums.
    #[cfg(target_arch = "x86_64")]
    static F32_PLANE: std::cell::RefCell<super::exact_depthwise::Scratch> =
        std::cell::RefCell::new(Default::default());
}

/// The requantizing chain `post` on channel `o`'s sums `y`, into `out`: sixteen at a time on
/// AVX-512 ([`Bound::store16`]), else row by row.
///
/// # Safety
/// `out` has room for `y.len()` elements of the chain's output type; `isa` is the host's.
unsafe fn finish(post: &Bound, y: &[i32], o: usize, out: *mut u8, isa: Isa) {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 {
        // SAFETY: as this function's contract.
        unsafe { finish16(post, y, o, out) };
        return;
    }
    let _ = isa;
    let mut real = Vec::with_capacity(y.len());
    // SAFETY: as this function's contract; `Avx2` only where the CPU has it.
    unsafe { post.row(y, o, out, &mut real, isa == Isa::Avx2) };
}

/// [`finish`] on AVX-512.
///
/// # Safety
/// AVX-512F, BW and VL; as [`finish`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq")]
unsafe fn finish16(post: &Bound, y: &[i32], o: usize, out: *mut u8) {
    use std::arch::x86_64::*;
    let size = if post.quantize.is_some() { 1 } else { 4 };
    // SAFETY: AVX-512F, as this function's contract.
    let plain = unsafe { post.plain16() };
    for (j, chunk) in y.chunks(16).enumerate() {
        let mask = ((1u32 << chunk.len()) - 1) as u16;
        // SAFETY: the lanes of `mask` lie in `y`; the outputs in `out`, as the contract says.
        unsafe {
            let acc = _mm512_maskz_loadu_epi32(mask, chunk.as_ptr());
            let at = out.add(size * 16 * j);
            match plain {
                Some(plain) => plain.store(_mm512_cvtepi32_ps(acc), o, mask, at),
                None => post.store16(acc, o, mask, at),
            }
        }
    }
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

/// One channel's input: its bytes (`i8` where `sx`), their zero point, and the taps less the
/// filter's zero point.
#[derive(Clone, Copy)]
struct Channel<'a> {
    x: &'a [u8],
    sx: bool,
    zx: i32,
    taps: &'a [i32],
}

/// A filter's taps less its zero points (one, or one per channel), `[C, kh * kw]`: as i32 for
/// the integer kernels and as f32 for the exact ones. Made at compile time for a constant
/// filter (converting every tap on each run cost as much as a 7x7 layer's products).
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Taps {
    ints: Vec<i32>,
    floats: Vec<f32>,
}

// The floats are the ints converted, never NaN: equality is reflexive.
impl Eq for Taps {}

impl Taps {
    /// The taps of filter bytes `w` (i8 where `signed`) with zero points `wz`, `taps` a
    /// channel.
    pub(super) fn new(w: &[u8], wz: &[u8], signed: bool, taps: usize) -> Taps {
        let wz = levels(wz, signed);
        let ints: Vec<i32> = (levels(w, signed).iter().enumerate())
            .map(|(i, &t)| t.wrapping_sub(wz[if wz.len() == 1 { 0 } else { i / taps }]))
            .collect();
        let floats = ints.iter().map(|&t| t as f32).collect();
        Taps { ints, floats }
    }
}

/// Which instructions the loops are compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Isa {
    Avx512,
    Avx2,
    Portable,
}

impl Depthwise {
    /// The convolution of bytes `x` and `w` (`i8` where `signed` says, else `u8`) less zero
    /// points `xz` (one) and `wz` (one, or one per channel), `[N, C, oH, oW]`, into `out`: its
    /// i32 sums, or what the requantizing chain `post` makes of them (applied to each channel
    /// as it is finished, by the same thread). `prepared`: the filter's [`Taps`], where they
    /// were made at compile time.
    ///
    /// # Safety
    /// `out` has room for the output's elements of the stored type; `isa` is the host's, and
    /// `fma` whether it has FMA; `prepared` are the taps of `w` and `wz`.
    pub(super) unsafe fn run(
        &self,
        ([x, w, xz, wz], prepared): ([&[u8]; 4], Option<&Taps>),
        [sx, sw]: [bool; 2],
        (isa, fma): (Isa, bool),
        post: Option<&Bound>,
        out: *mut u8,
    ) {
        let [_, c, h, wi] = self.xd;
        let [_, _, oh, ow] = self.yd;
        let [kh, kw] = self.kernel;
        let zx = levels(&xz[..1], sx)[0];
        // On AVX2 and AVX-512 the sums run in f32 where that is exact (the taps few enough);
        // the others in i32, each channel's taps less its zero point.
        let exact = cfg!(target_arch = "x86_64") && isa != Isa::Portable && self.exact_in_f32();
        let made;
        let all = match prepared {
            Some(taps) => taps,
            None => {
                made = Taps::new(w, wz, sw, kh * kw);
                &made
            }
        };
        let taps = &all.ints;
        // Bytes per stored element: sums and f32 results 4, levels 1.
        let size = match post {
            Some(p) if p.quantize.is_some() => 1,
            _ => 4,
        };
        // SAFETY: each item writes its own channel's block of `out` only.
        let dst = unsafe { SendPtr::new(out) };
        #[cfg(target_arch = "x86_64")]
        if exact {
            let taps = &all.floats;
            let wq = (wi + self.pads[1] + self.pads[3]).div_ceil(self.strides[1]);
            let offsets: Vec<usize> = (0..kh * kw)
                .map(|t| self.tap_offset(wq, t / kw, t % kw))
                .collect();
            // SAFETY (both): AVX-512F or AVX2 where the ISA says so.
            let plain = post
                .filter(|_| isa == Isa::Avx512)
                .and_then(|p| unsafe { p.plain16() });
            let plain8 = post
                .filter(|_| isa == Isa::Avx2)
                .and_then(|p| unsafe { p.plain8() });
            // A run of channels an item, with one borrow of the thread's plane.
            let item = |run: std::ops::Range<usize>| {
                F32_PLANE.with(|p| {
                    let scratch = &mut *p.borrow_mut();
                    scratch.prepare(self);
                    for i in run {
                        let ch = i % c;
                        let at = dst.get().wrapping_add(size * i * oh * ow);
                        let x = &x[i * h * wi..][..h * wi];
                        // SAFETY: the ISA is the host's.
                        let wq = unsafe {
                            match isa {
                                Isa::Avx512 => self.fill_f32x16(x, sx, zx, &mut scratch.plane),
                                _ => self.fill_f32x8(x, sx, zx, &mut scratch.plane),
                            }
                        };
                        let sums = &mut scratch.sums;
                        let p = super::exact_depthwise::Plane {
                            plane: &scratch.plane,
                            wq,
                            taps: &taps[ch * kh * kw..][..kh * kw],
                            offsets: &offsets,
                        };
                        if isa == Isa::Avx512 {
                            // SAFETY: the ISA is the host's; this channel's outputs are `at`'s.
                            unsafe { self.channel_f32x16(p, ch, (post, plain.as_ref()), at) };
                            continue;
                        }
                        let y: &mut [i32] = match post {
                            // SAFETY: without a chain, this channel's `oh * ow` i32 sums are
                            // `out`'s.
                            None => unsafe {
                                std::slice::from_raw_parts_mut(at as *mut i32, oh * ow)
                            },
                            Some(_) => {
                                sums.resize(oh * ow, 0);
                                &mut sums[..]
                            }
                        };
                        // SAFETY: the ISA (AVX2) is the host's; with `plain8`, this channel's
                        // levels are `at`'s.
                        unsafe {
                            if fma {
                                self.channel_f32x8_fma(p, ch, (plain8.as_ref(), at), y)
                            } else {
                                self.channel_f32x8(p, ch, (plain8.as_ref(), at), y)
                            }
                        };
                        if plain8.is_some() {
                            continue;
                        }
                        if let Some(post) = post {
                            // SAFETY: this channel's outputs of the stored type are `at`'s.
                            unsafe { finish(post, y, ch, at, isa) };
                        }
                    }
                });
            };
            self.each_channel(&item);
            return;
        }
        let item = |run: std::ops::Range<usize>| {
            run.for_each(|i| {
                let ch = i % c;
                let plane = &x[i * h * wi..][..h * wi];
                let at = dst.get().wrapping_add(size * i * oh * ow);
                PLANE.with(|p| {
                    let (plane_buf, sums) = &mut *p.borrow_mut();
                    let y: &mut [i32] = match post {
                        // SAFETY: without a chain, this channel's `oh * ow` i32 sums are `out`'s.
                        None => unsafe { std::slice::from_raw_parts_mut(at as *mut i32, oh * ow) },
                        Some(_) => {
                            sums.resize(oh * ow, 0);
                            &mut sums[..]
                        }
                    };
                    let input = Channel {
                        x: plane,
                        sx,
                        zx,
                        taps: &taps[ch * kh * kw..][..kh * kw],
                    };
                    // SAFETY (each): the ISA is the host's, as this function's contract.
                    match isa {
                        #[cfg(target_arch = "x86_64")]
                        Isa::Avx512 => unsafe { self.channel_avx512(input, plane_buf, y) },
                        #[cfg(target_arch = "x86_64")]
                        Isa::Avx2 => unsafe { self.channel_avx2(input, plane_buf, y) },
                        _ => self.channel(input, plane_buf, y),
                    }
                    if let Some(post) = post {
                        // SAFETY: this channel's outputs of the stored type are `at`'s.
                        unsafe { finish(post, y, ch, at, isa) };
                    }
                });
            })
        };
        self.each_channel(&item);
    }

    /// `item(run)` for runs of channels (of every image) covering them all: across the thread
    /// pool in runs of some thousands of outputs (so that small planes do not pay a job each)
    /// where the convolution has 2^16 multiply-adds or more, else here as one run.
    fn each_channel(&self, item: &(dyn Fn(std::ops::Range<usize>) + Sync)) {
        let [n, c, _, _] = self.xd;
        let [_, _, oh, ow] = self.yd;
        let work = n * c * oh * ow * self.kernel[0] * self.kernel[1];
        if work >= 1 << 16 {
            let run = (4096 / (oh * ow).max(1)).clamp(1, n * c);
            crate::cpu::pool::for_each((n * c).div_ceil(run), &|j| {
                item(j * run..((j + 1) * run).min(n * c))
            });
        } else {
            item(0..n * c);
        }
    }

    /// [`Depthwise::channel`] compiled for AVX-512.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn channel_avx512(&self, input: Channel, plane: &mut Vec<i32>, y: &mut [i32]) {
        self.channel(input, plane, y)
    }

    /// [`Depthwise::channel`] compiled for AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn channel_avx2(&self, input: Channel, plane: &mut Vec<i32>, y: &mut [i32]) {
        self.channel(input, plane, y)
    }

    /// One channel: `x` (`H x W` bytes) less `zx` into the padded `plane`
    /// ([`Depthwise::fill_plane`]), then `y` (`oH x oW`). With a row stride of 1, each tap is
    /// one pass over all the rows at once (the plane's width, the columns past `oW` dropped at
    /// the end), long enough for full vectors where rows are short.
    #[inline(always)]
    fn channel(&self, input: Channel, plane: &mut Vec<i32>, y: &mut [i32]) {
        let Channel { x, sx, zx, taps } = input;
        let [_, _, oh, ow] = self.yd;
        let [kh, kw] = self.kernel;
        let sh = self.strides[0];
        let level = |b: u8| {
            let v = if sx { b as i8 as i32 } else { b as i32 };
            v.wrapping_sub(zx)
        };
        let wq = self.fill_plane(x, level, plane);
        let tap = |ky: usize, kx: usize| (taps[ky * kw + kx], self.tap_offset(wq, ky, kx));
        if sh == 1 {
            // Output (oy, ox) at `oy * wq + ox` of one wide pass per tap.
            let mut wide = vec![0i32; oh * wq];
            for ky in 0..kh {
                for kx in 0..kw {
                    let (t, at) = tap(ky, kx);
                    for (o, &v) in wide.iter_mut().zip(&plane[at..at + oh * wq]) {
                        *o = o.wrapping_add(v.wrapping_mul(t));
                    }
                }
            }
            for (out, row) in y.chunks_exact_mut(ow).zip(wide.chunks_exact(wq)) {
                out.copy_from_slice(&row[..ow]);
            }
            return;
        }
        for (oy, out) in y.chunks_exact_mut(ow).enumerate() {
            out.fill(0);
            for ky in 0..kh {
                for kx in 0..kw {
                    let (t, at) = tap(ky, kx);
                    let src = &plane[at + oy * sh * wq..][..ow];
                    for (o, &v) in out.iter_mut().zip(src) {
                        *o = o.wrapping_add(v.wrapping_mul(t));
                    }
                }
            }
        }
    }

    /// Channel `x` (`H x W` bytes) as `level` makes each byte, into the padded `plane` (the
    /// padding `T::default()`); returns the plane's row length. With a column stride `s` above
    /// 1 the plane is kept as `s` phases (columns `r, r + s, r + 2s, ...` together), so that
    /// every tap reads a contiguous run for a row of outputs: padded column `pc` of padded row
    /// `row` is at `(pc % s * hp + row) * wq + pc / s`, with a row's worth past the end so that
    /// a pass over all the rows may read past the last.
    #[inline(always)]
    pub(super) fn fill_plane<T: Copy + Default>(
        &self,
        x: &[u8],
        level: impl Fn(u8) -> T,
        plane: &mut Vec<T>,
    ) -> usize {
        let (len, wq) = self.plane_size();
        plane.clear();
        plane.resize(len, T::default());
        self.fill_interior(x, level, plane);
        wq
    }

    /// The length of [`Depthwise::fill_plane`]'s plane and of its rows.
    pub(super) fn plane_size(&self) -> (usize, usize) {
        let [_, _, h, w] = self.xd;
        let s = self.strides[1];
        let [pt, pl, pb, pr] = self.pads;
        let wq = (w + pl + pr).div_ceil(s);
        ((s * (h + pt + pb) + 1) * wq, wq)
    }

    /// [`Depthwise::fill_plane`]'s writes of the input, the padding left as it is: the same
    /// elements whatever the input.
    #[inline(always)]
    pub(super) fn fill_interior<T: Copy>(
        &self,
        x: &[u8],
        level: impl Fn(u8) -> T,
        plane: &mut [T],
    ) {
        let [_, _, h, w] = self.xd;
        let s = self.strides[1];
        let [pt, pl, pb, _] = self.pads;
        let hp = h + pt + pb;
        let wq = self.plane_size().1;
        // Each phase's columns `j` inside the row: `j * s + r - pl` in `0..w`.
        let spans: Vec<(usize, usize)> = (0..s)
            .map(|r| {
                let first = pl.saturating_sub(r).div_ceil(s);
                (first, (w + pl).saturating_sub(r).div_ceil(s).max(first))
            })
            .collect();
        for (iy, row) in x.chunks_exact(w).enumerate() {
            if s == 1 {
                let dst = &mut plane[(iy + pt) * wq + pl..][..w];
                for (d, &b) in dst.iter_mut().zip(row) {
                    *d = level(b);
                }
                continue;
            }
            for (r, &(first, end)) in spans.iter().enumerate() {
                let dst = &mut plane[(r * hp + iy + pt) * wq..][first..end];
                let from = (first * s + r - pl..).step_by(s);
                for (d, ix) in dst.iter_mut().zip(from) {
                    *d = level(row[ix]);
                }
            }
        }
    }

    /// Where tap `(ky, kx)` of output `(0, 0)` reads in a plane [`Depthwise::fill_plane`] made
    /// with rows of `wq`.
    pub(super) fn tap_offset(&self, wq: usize, ky: usize, kx: usize) -> usize {
        let hp = self.xd[2] + self.pads[0] + self.pads[2];
        let s = self.strides[1];
        let [dh, dw] = self.dilations;
        let off = kx * dw;
        (off % s * hp + ky * dh) * wq + off / s
    }
}

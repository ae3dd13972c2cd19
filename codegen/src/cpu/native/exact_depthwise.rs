//! Depthwise `conv_integer` in f32 arithmetic, bit-exact. The inputs less their zero point and
//! the taps less theirs are integers of at most 255 in size, so each product is an integer
//! below 2^16 and each partial sum of up to [`MAX_TAPS`] of them one below 2^24: f32 holds every
//! one exactly, no addition rounds, and the sum converted back is the interpreter's i32 (which
//! cannot wrap at that size). What that buys is the vector unit's widest multiply-add: each tap
//! is one multiply-add per vector of outputs (a multiply and an add on AVX2) from the padded
//! plane ([`Depthwise::fill_plane`], in f32), the sums held in registers across the taps, in
//! tiles of 8 output rows x 16 columns on AVX-512 and 4 rows x 16 columns (two vectors) on
//! AVX2; where the chain has its NaN-free path the levels go from the registers into its store
//! ([`Plain16`], [`Plain8`]). Integer multiplies of bytes cannot do that: 16-bit products of a
//! u8 and an i8 need widening and shuffles to pair taps (a VNNI kernel that did so, which this
//! one replaced, spent more on those than on its `vpdpbusd`), and i32 multiplies are slow.

use super::int_depthwise::Depthwise;
#[cfg(target_arch = "x86_64")]
use super::plain::{Flags, Plain8, Plain16};
use super::requant::Bound;

/// The most taps whose sums f32 holds exactly: `MAX_TAPS * 255 * 255 < 2^24`.
const MAX_TAPS: usize = (1 << 24) / (255 * 255);

/// Output rows per register tile: as many independent chains of multiply-adds as keep the
/// vector unit busy (two multiply-adds a cycle, four cycles each).
const ROWS: usize = 8;

/// Floats a plane holds past [`Depthwise::fill_plane`]'s, so that a tile's full-width loads
/// stay inside it.
pub(super) const SLACK: usize = 16;

/// A thread's padded plane, kept between channels and calls, and a channel's sums (on AVX2,
/// where a chain follows). The fill writes the same elements of the plane whatever the input,
/// so the padding stays zero and is cleared only when the shape changes (clearing all of it
/// for every channel cost as much as the fill).
#[derive(Default)]
pub(super) struct Scratch {
    pub plane: Vec<f32>,
    pub sums: Vec<i32>,
    shape: Option<Depthwise>,
}

impl Depthwise {
    /// [`Depthwise::fill_interior`] with the levels of `x` (i8 where `sx`) less `zx` in f32,
    /// an element at a time (the vector fills' case for column strides above 2); inlined into
    /// them, so compiled for their features.
    #[inline(always)]
    fn fill_levels(&self, x: &[u8], sx: bool, zx: i32, plane: &mut [f32]) {
        let level = |b: u8| (if sx { b as i8 as i32 } else { b as i32 } - zx) as f32;
        self.fill_interior(x, level, plane);
    }
}

impl Scratch {
    /// The plane sized and zeroed for `dw` unless it was for its shape already: once per run
    /// of channels, before the fills.
    pub(super) fn prepare(&mut self, dw: &Depthwise) -> &mut [f32] {
        if self.shape.as_ref() != Some(dw) {
            self.plane.clear();
            self.plane.resize(dw.plane_size().0 + SLACK, 0.0);
            self.shape = Some(*dw);
        }
        &mut self.plane
    }
}

/// One channel: its padded plane of inputs less their zero point, the plane's row length, the
/// channel's taps less the filter's zero point, and where each tap reads for output `(0, 0)`.
pub(super) struct Plane<'a> {
    pub plane: &'a [f32],
    pub wq: usize,
    pub taps: &'a [f32],
    pub offsets: &'a [usize],
}

impl Depthwise {
    /// Whether the sums of a channel's taps are exact in f32 ([`MAX_TAPS`] taps at most).
    pub(super) fn exact_in_f32(&self) -> bool {
        self.kernel[0] * self.kernel[1] <= MAX_TAPS
    }

    /// Channel `o` on AVX-512 into `out`: the chain `post` applied to its sums (`plain`: its
    /// [`Bound::plain16`]), or the sums. Output rows in tiles of [`ROWS`].
    ///
    /// # Safety
    /// AVX-512F, BW and VL; the plane as [`Depthwise::fill_plane`] made it for this
    /// convolution, with [`SLACK`] more; `out` has room for `oH x oW` elements of the stored
    /// type.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq")]
    pub(super) unsafe fn channel_f32x16(
        &self,
        p: Plane,
        o: usize,
        (post, plain): (Option<&Bound>, Option<&Plain16>),
        out: *mut u8,
    ) {
        // Tiles of 7 rows where that divides the rows and 8 does not (MobileNet's 7, 14 and 28:
        // 8-row tiles compute an eighth more there).
        let oh = self.yd[2];
        let seven = !oh.is_multiple_of(8) && oh.is_multiple_of(7);
        // Three rows of taps (3x3 and 3x1 filters) at row stride and dilation 1 load each input
        // row once for the three output rows it feeds; others a row per tap. (At row stride 2,
        // loading each row once for the two it feeds measured no faster.)
        let shared = self.kernel[0] == 3 && self.strides[0] == 1 && self.dilations[0] == 1;
        // The plain path's flags matched here, each combination a copy of the tiles with them
        // constant, so that no vector's store tests them.
        macro_rules! tiles {
            ($flags:expr) => {
                // SAFETY: as this function's contract (inlined here, with its features).
                unsafe {
                    match (seven, shared) {
                        (true, true) => self.tiles16::<7, true>(p, o, (post, plain), out, $flags),
                        (true, false) => self.tiles16::<7, false>(p, o, (post, plain), out, $flags),
                        (false, true) => {
                            self.tiles16::<ROWS, true>(p, o, (post, plain), out, $flags)
                        }
                        (false, false) => {
                            self.tiles16::<ROWS, false>(p, o, (post, plain), out, $flags)
                        }
                    }
                }
            };
        }
        let flags = plain.map_or(Flags::default(), |p| p.flags);
        super::plain::with_constant_flags!(flags, f => tiles!(f))
    }

    /// [`Depthwise::channel_f32x16`] in tiles of `R` rows, `flags` the plain path's.
    /// `SHARED`: a filter of three rows at row stride and dilation 1, each input row loaded
    /// once for the three output rows it feeds; else a row of the plane per tap.
    ///
    /// # Safety
    /// As [`Depthwise::channel_f32x16`]; inlined into it, which has the features; `SHARED`
    /// only for such a filter.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn tiles16<const R: usize, const SHARED: bool>(
        &self,
        p: Plane,
        o: usize,
        (post, plain): (Option<&Bound>, Option<&Plain16>),
        out: *mut u8,
        flags: Flags,
    ) {
        use std::arch::x86_64::*;
        let [_, _, oh, ow] = self.yd;
        let step = self.strides[0] * p.wq;
        let size = if post.is_some_and(|b| b.quantize.is_some()) {
            1
        } else {
            4
        };
        let base = p.plane.as_ptr();
        // With `SHARED`, R + 2 loads a column of taps instead of 3R (the loads, many across two
        // cache lines, bounded the loop). A phase's padded rows: the last an input row may be.
        let last = self.xd[2] + self.pads[0] + self.pads[2] - 1;
        let kw = self.kernel[1];
        // SAFETY: the caller's contract: the features, the plane and `out`.
        unsafe {
            for oy in (0..oh).step_by(R) {
                // Rows past the last repeat it, unstored.
                let row = |r: usize| (oy + r).min(oh - 1) * step;
                for x0 in (0..ow).step_by(16) {
                    let mask = (u32::MAX >> (32 - (ow - x0).min(16))) as u16;
                    let mut acc = [_mm512_setzero_ps(); R];
                    if SHARED {
                        // Tap (ky, kx) of output row `oy + r` reads input row `oy + r + ky` at
                        // tap (0, kx)'s offset (its phase and column): input row `oy + j`
                        // feeds row `j - ky`. Input rows past the plane's last feed only rows
                        // past the last output, unstored.
                        for kx in 0..kw {
                            let at = p.offsets[kx];
                            let t: [__m512; 3] =
                                std::array::from_fn(|ky| _mm512_set1_ps(p.taps[ky * kw + kx]));
                            for j in 0..R + 2 {
                                let v =
                                    _mm512_loadu_ps(base.add((oy + j).min(last) * p.wq + at + x0));
                                for (ky, &t) in t.iter().enumerate() {
                                    if let Some(r) = j.checked_sub(ky).filter(|&r| r < R) {
                                        acc[r] = _mm512_fmadd_ps(v, t, acc[r]);
                                    }
                                }
                            }
                        }
                    } else {
                        for (&t, &at) in p.taps.iter().zip(p.offsets) {
                            let t = _mm512_set1_ps(t);
                            for (r, acc) in acc.iter_mut().enumerate() {
                                // The sixteen floats from a tap of an output row lie in the
                                // plane or its slack (past a row's outputs, read but not
                                // stored).
                                let v = _mm512_loadu_ps(base.add(row(r) + at + x0));
                                *acc = _mm512_fmadd_ps(v, t, *acc);
                            }
                        }
                    }
                    for (r, &acc) in acc.iter().enumerate().take(oh - oy) {
                        let at = out.wrapping_add(size * ((oy + r) * ow + x0));
                        // Exact integers below 2^24: `acc` is the sums' f32, its conversion the
                        // sums.
                        let sums = _mm512_cvtps_epi32(acc);
                        // The mask's lanes of row `oy + r` of `out`.
                        match (plain, post) {
                            (Some(p), _) => p.store_with(acc, o, mask, at, flags),
                            (_, Some(post)) => post.store16(sums, o, mask, at),
                            (_, None) => _mm512_mask_storeu_epi32(at as *mut i32, mask, sums),
                        }
                    }
                }
            }
        }
    }

    /// [`Depthwise::fill_plane`] of channel `x` (i8 where `sx`) less `zx` in f32, on AVX-512:
    /// sixteen bytes widened at a time, and for a column stride of 2 thirty-two split into
    /// their two phases.
    ///
    /// # Safety
    /// AVX-512F, BW and VL; `x` holds the channel's `H x W` bytes; `plane` is a
    /// [`Scratch::prepare`]d plane of this convolution.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub(super) unsafe fn fill_f32x16(
        &self,
        x: &[u8],
        sx: bool,
        zx: i32,
        plane: &mut [f32],
    ) -> usize {
        use std::arch::x86_64::*;
        let s = self.strides[1];
        let wq = self.plane_size().1;
        if s > 2 {
            self.fill_levels(x, sx, zx, plane);
            return wq;
        }
        let [_, _, h, w] = self.xd;
        let [pt, pl, pb, _] = self.pads;
        let hp = h + pt + pb;
        let z = _mm512_set1_epi32(zx);
        let real = |v: __m512i| _mm512_cvtepi32_ps(_mm512_sub_epi32(v, z));
        let dst = plane.as_mut_ptr();
        for (iy, row) in x.chunks_exact(w).enumerate() {
            let src = row.as_ptr();
            if s == 1 {
                let dst = dst.wrapping_add((iy + pt) * wq + pl);
                for j in (0..w).step_by(16) {
                    let m = (u32::MAX >> (32 - (w - j).min(16))) as u16;
                    // SAFETY: the mask's bytes lie in the row, its floats in the padded row.
                    unsafe {
                        let b = _mm_maskz_loadu_epi8(m, src.add(j) as *const i8);
                        let v = if sx {
                            _mm512_cvtepi8_epi32(b)
                        } else {
                            _mm512_cvtepu8_epi32(b)
                        };
                        _mm512_mask_storeu_ps(dst.add(j), m, real(v));
                    }
                }
                continue;
            }
            for j in (0..w).step_by(32) {
                let n = (w - j).min(32);
                // SAFETY: the mask's bytes lie in the row.
                let pairs = unsafe {
                    let m = u32::MAX >> (32 - n);
                    _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi8(m, src.add(j) as *const i8))
                };
                // Lane `k` holds columns `j + 2k` (low byte) and `j + 2k + 1`.
                let (even, odd) = if sx {
                    (
                        _mm512_srai_epi32::<24>(_mm512_slli_epi32::<24>(pairs)),
                        _mm512_srai_epi32::<24>(_mm512_slli_epi32::<16>(pairs)),
                    )
                } else {
                    (
                        _mm512_and_si512(pairs, _mm512_set1_epi32(0xff)),
                        _mm512_srli_epi32::<8>(pairs),
                    )
                };
                for (e, v) in [(0, even), (1, odd)] {
                    if n <= e {
                        continue;
                    }
                    // Column `j + e + 2k` is padded column `pc = j + e + pl + 2k`: phase
                    // `pc % 2`, at `pc / 2` of its row.
                    let pc = j + e + pl;
                    let at = ((pc % 2) * hp + iy + pt) * wq + pc / 2;
                    let m = (u32::MAX >> (32 - (n - e).div_ceil(2))) as u16;
                    // SAFETY: the mask's floats lie in the phase's padded row.
                    unsafe { _mm512_mask_storeu_ps(dst.add(at), m, real(v)) };
                }
            }
        }
        wq
    }

    /// [`Depthwise::fill_plane`] of channel `x` (i8 where `sx`) less `zx` in f32, on AVX2:
    /// eight bytes widened at a time, and for a column stride of 2 sixteen split into their two
    /// phases by a byte shuffle.
    ///
    /// # Safety
    /// AVX2; `x` holds the channel's `H x W` bytes; `plane` is a [`Scratch::prepare`]d plane
    /// of this convolution.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn fill_f32x8(
        &self,
        x: &[u8],
        sx: bool,
        zx: i32,
        plane: &mut [f32],
    ) -> usize {
        use std::arch::x86_64::*;
        let s = self.strides[1];
        let wq = self.plane_size().1;
        if s > 2 {
            self.fill_levels(x, sx, zx, plane);
            return wq;
        }
        let [_, _, h, w] = self.xd;
        let [pt, pl, pb, _] = self.pads;
        let hp = h + pt + pb;
        let z = _mm256_set1_epi32(zx);
        let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        // Eight bytes (the low half of `b`) less the zero point, as floats; the first `count`
        // stored at `dst`.
        let put = |b: __m128i, count: usize, dst: *mut f32| {
            let v = if sx {
                _mm256_cvtepi8_epi32(b)
            } else {
                _mm256_cvtepu8_epi32(b)
            };
            let real = _mm256_cvtepi32_ps(_mm256_sub_epi32(v, z));
            let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(count as i32), lanes);
            // SAFETY: the mask's floats lie in the padded row `dst` starts in.
            unsafe { _mm256_maskstore_ps(dst, mask, real) };
        };
        // Bytes `j..j + 16` of row `iy` (those below `w` are used): read in place, past the
        // row's end into the next where the channel goes on, else through a copy (a copy for
        // every piece was two thirds of the kernel's time).
        let load = |iy: usize, j: usize| {
            let at = iy * w + j;
            if at + 16 <= x.len() {
                // SAFETY: sixteen bytes of the channel.
                return unsafe { _mm_loadu_si128(x[at..at + 16].as_ptr() as *const __m128i) };
            }
            let mut b = [0u8; 16];
            b[..x.len() - at].copy_from_slice(&x[at..]);
            // SAFETY: sixteen bytes of `b`.
            unsafe { _mm_loadu_si128(b.as_ptr() as *const __m128i) }
        };
        let dst = plane.as_mut_ptr();
        let split = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
        for iy in 0..h {
            if s == 1 {
                let at = dst.wrapping_add((iy + pt) * wq + pl);
                for j in (0..w).step_by(16) {
                    let b = load(iy, j);
                    let n = (w - j).min(16);
                    put(b, n.min(8), at.wrapping_add(j));
                    if n > 8 {
                        put(_mm_srli_si128::<8>(b), n - 8, at.wrapping_add(j + 8));
                    }
                }
                continue;
            }
            for j in (0..w).step_by(16) {
                let n = (w - j).min(16);
                // Even columns in the low eight bytes, odd in the high.
                let b = _mm_shuffle_epi8(load(iy, j), split);
                for (e, v) in [(0, b), (1, _mm_srli_si128::<8>(b))] {
                    if n <= e {
                        continue;
                    }
                    // As in `fill_f32x16`.
                    let pc = j + e + pl;
                    let at = ((pc % 2) * hp + iy + pt) * wq + pc / 2;
                    put(v, (n - e).div_ceil(2), dst.wrapping_add(at));
                }
            }
        }
        wq
    }

    /// Channel `o` on AVX2: with `plain` (the chain's [`Bound::plain8`]) its levels into
    /// `out`, else its sums into `y`; tiles of 4 output rows by 16 columns (two vectors), a
    /// multiply and an add per tap.
    ///
    /// # Safety
    /// AVX2; the plane as [`Depthwise::fill_plane`] made it for this convolution, with
    /// [`SLACK`] more; with `plain`, `out` has room for `oH x oW` levels.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn channel_f32x8(
        &self,
        p: Plane,
        o: usize,
        (plain, out): (Option<&Plain8>, *mut u8),
        y: &mut [i32],
    ) {
        // SAFETY: as this function's contract.
        unsafe { self.tiles8::<false>(p, o, (plain, out), y) }
    }

    /// [`Depthwise::channel_f32x8`] with one `vfmadd` per tap (the same sums: all exact).
    ///
    /// # Safety
    /// As [`Depthwise::channel_f32x8`], and FMA.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn channel_f32x8_fma(
        &self,
        p: Plane,
        o: usize,
        (plain, out): (Option<&Plain8>, *mut u8),
        y: &mut [i32],
    ) {
        // SAFETY: as this function's contract.
        unsafe { self.tiles8::<true>(p, o, (plain, out), y) }
    }

    /// The body of both AVX2 forms; inlined into them, which have the features.
    ///
    /// # Safety
    /// As [`Depthwise::channel_f32x8`], and FMA where `FMA`.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn tiles8<const FMA: bool>(
        &self,
        p: Plane,
        o: usize,
        (plain, out): (Option<&Plain8>, *mut u8),
        y: &mut [i32],
    ) {
        // SAFETY: as this function's contract.
        unsafe {
            use std::arch::x86_64::*;
            const R: usize = 4;
            let [_, _, oh, ow] = self.yd;
            let step = self.strides[0] * p.wq;
            let base = p.plane.as_ptr();
            let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            for oy in (0..oh).step_by(R) {
                let row = |r: usize| (oy + r).min(oh - 1) * step;
                for x0 in (0..ow).step_by(16) {
                    let count = (ow - x0).min(16);
                    let mut acc = [[_mm256_setzero_ps(); 2]; R];
                    for (&t, &at) in p.taps.iter().zip(p.offsets) {
                        let t = _mm256_set1_ps(t);
                        for (r, acc) in acc.iter_mut().enumerate() {
                            for (h, acc) in acc.iter_mut().enumerate() {
                                // As in `channel_f32x16`: inside the plane or its slack.
                                let v = _mm256_loadu_ps(base.add(row(r) + at + x0 + 8 * h));
                                *acc = if FMA {
                                    _mm256_fmadd_ps(v, t, *acc)
                                } else {
                                    _mm256_add_ps(*acc, _mm256_mul_ps(v, t))
                                };
                            }
                        }
                    }
                    for (r, acc) in acc.iter().enumerate().take(oh - oy) {
                        let at = (oy + r) * ow + x0;
                        if let Some(plain) = plain {
                            // `count` levels of row `oy + r` of `out`.
                            plain.store(*acc, o, count, out.add(at));
                            continue;
                        }
                        for (h, &acc) in acc.iter().enumerate() {
                            if count <= 8 * h {
                                break;
                            }
                            let n = (count - 8 * h).min(8) as i32;
                            let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lanes);
                            let dst = y[at + 8 * h..].as_mut_ptr();
                            // The mask's lanes of row `oy + r` of `y`.
                            _mm256_maskstore_epi32(dst, mask, _mm256_cvtps_epi32(acc));
                        }
                    }
                }
            }
        }
    }
}

//! The direct kernel of one group (or groups of whole blocks): a band's pixels in tiles of
//! five or six by one or two output blocks, twelve `ymm` accumulators at most, or with
//! AVX-512F by two or four blocks in `zmm` registers (see the module docs of [`super`]).

use super::{B, Geom, Group, NchwcConv, Out, P};
#[cfg(target_arch = "x86_64")]
use crate::cpu::simd::{first, high};
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// The bytes of weights a chunk of a tile's reduction reads at most (see [`Span::chunks`]):
/// a third of the smallest L1 data cache the kernels run on (32 KiB), leaving room for the
/// input the tiles read.
const CHUNK_BYTES: usize = 16 << 10;

impl NchwcConv {
    /// The direct kernel over output rows `rows` for the blocks of `groups`.
    ///
    /// # Safety
    /// `yimg` holds the image's blocked output.
    pub(super) unsafe fn direct(
        &self,
        groups: &[Group],
        data: &[f32],
        ximg: &[f32],
        out: Out,
        rows: std::ops::Range<usize>,
        buf: &mut Vec<f32>,
    ) {
        let Geom { c, h, w, sh, .. } = self.g;
        let lanes = self.lanes();
        let padded = self.g.padded || (self.blocked && c % B != 0);
        // The input blocks (or channels) these groups read: all of them with one convolution
        // group, their groups' with several.
        let last = groups[groups.len() - 1];
        let planes = groups[0].input..last.input + self.g.cg.div_ceil(lanes);
        let input = if padded {
            self.copy_band(ximg, rows.clone(), planes, buf)
        } else {
            let at = rows.start * sh * w * lanes;
            Band {
                src: &ximg[at..],
                plane: h * w * lanes,
                row: w * lanes,
                first: 0,
            }
        };
        // SAFETY: the caller's contract.
        unsafe { self.direct_band(groups, data, input, out, rows) }
    }

    /// The direct kernel over output rows `rows` for the blocks of `groups`, reading `input`.
    ///
    /// # Safety
    /// `out` holds the image's blocked output; `input` holds every tap of the rows' pixels.
    pub(super) unsafe fn direct_band(
        &self,
        groups: &[Group],
        data: &[f32],
        input: Band,
        out: Out,
        rows: std::ops::Range<usize>,
    ) {
        let Geom {
            o,
            kh,
            kw,
            oh,
            ow,
            sh,
            sw,
            dh,
            dw,
            ..
        } = self.g;
        let lanes = self.lanes();
        let Band {
            src,
            plane,
            row,
            first,
        } = input;
        // The offsets and partial sums go into this thread's buffers, reused from band to band
        // (allocating two vectors a band was 6% of a chain of small 1x1 layers), and back at
        // the end.
        let (mut taps, mut pixels, mut sums) = SCRATCH.take();
        taps.clear();
        taps.extend((0..self.taps()).map(|t| {
            let (blk, tap) = (t / (kh * kw), t % (kh * kw));
            blk * plane + (tap / kw) * dh * row + (tap % kw) * dw * lanes
        }));
        let start = rows.start * ow;
        let end = rows.end * ow;
        // Where each output pixel of the band reads its first tap, computed once for all the
        // groups (no division per tile).
        pixels.clear();
        pixels.resize(rows.len() * ow, 0);
        for (oy, line) in pixels.chunks_exact_mut(ow).enumerate() {
            for (ox, p) in line.iter_mut().enumerate() {
                *p = oy * sh * row + ox * sw * lanes;
            }
        }
        let steps = self.taps() * lanes;
        let pairs = tile_pixels(end - start);
        let quads = tile_pixels512(end - start);
        // Partial sums between chunks of the reduction (see `Span::chunks`): 32 floats (four
        // blocks) per pixel of the band's tiles (of up to seven pixels) at most, each written
        // before it is read (so the buffer only grows, and is never cleared).
        let need = (end - start + 8) * 4 * B;
        if sums.len() < need {
            sums.resize(need, 0.0);
        }
        let mut gi = 0;
        while gi < groups.len() {
            let g = groups[gi];
            // With AVX-512, two pairs of blocks of one convolution group side by side (their
            // filters packed one after the other).
            let quad = self.zmm
                && g.nb == 2
                && groups
                    .get(gi + 1)
                    .is_some_and(|h| h.nb == 2 && h.input == g.input && h.start == g.start + 2);
            let nb = if quad { 4 } else { g.nb };
            // Where the second pair's filter starts, relative to the first's.
            let second = if quad { groups[gi + 1].at - g.at } else { 0 };
            gi += if quad { 2 } else { 1 };
            // Valid lanes of the group's last block: the padding lanes of the output are zero.
            let valid = o - (g.start + nb - 1) * B;
            let wg = &data[g.at..g.at + second + steps * g.nb * B];
            let pp = if g.nb == 2 { pairs } else { P };
            // SAFETY (a pointer computation): the group's input blocks lie in `src`.
            let base = unsafe { src.as_ptr().add((g.input - first) * plane) };
            // SAFETY: every pixel's taps lie in `src` (the band covers the rows and columns
            // the outputs read); the image's output holds blocks g.start.. .
            unsafe {
                let at = (g.start * oh * ow + start) * B;
                let span = Span {
                    base,
                    pixels: &pixels,
                    taps: &taps,
                    sums: sums.as_mut_ptr(),
                    out: Out {
                        y: out.y.add(at),
                        at: out.at + at,
                        post: out.post,
                    },
                    stride: oh * ow * B,
                    block: g.start,
                    last: valid,
                };
                let w = wg.as_ptr();
                let w2 = w.add(second);
                match (nb, lanes, pp) {
                    (4, B, _) if quads == 7 => tiles512::<2, B, 7>(span, [w, w2]),
                    (4, B, P) => tiles512::<2, B, P>(span, [w, w2]),
                    (4, B, _) => tiles512::<2, B, 5>(span, [w, w2]),
                    (4, _, P) => tiles512::<2, 1, P>(span, [w, w2]),
                    (4, _, _) => tiles512::<2, 1, 5>(span, [w, w2]),
                    (2, B, P) if self.zmm => tiles512::<1, B, P>(span, [w]),
                    (2, B, _) if self.zmm => tiles512::<1, B, 5>(span, [w]),
                    (2, _, P) if self.zmm => tiles512::<1, 1, P>(span, [w]),
                    (2, _, _) if self.zmm => tiles512::<1, 1, 5>(span, [w]),
                    (2, B, P) => tiles::<2, B, P>(span, w),
                    (2, B, _) => tiles::<2, B, 5>(span, w),
                    (1, B, _) => tiles::<1, B, P>(span, w),
                    (2, _, P) => tiles::<2, 1, P>(span, w),
                    (2, _, _) => tiles::<2, 1, 5>(span, w),
                    _ => tiles::<1, 1, P>(span, w),
                }
            }
        }
        SCRATCH.set((taps, pixels, sums));
    }
}

thread_local! {
    /// Each thread's tap and pixel offsets of the band it computes and its partial sums
    /// (see `direct_band`).
    static SCRATCH: std::cell::RefCell<(Vec<usize>, Vec<usize>, Vec<f32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new(), Vec::new())) };
}

/// The input the direct kernel reads: `src` with `plane` floats between blocks (or plain
/// channels) and `row` floats between rows, its row 0 being the (padded) input row of the
/// first output row computed and its plane 0 input block (or channel) `first`.
#[derive(Clone, Copy)]
pub(super) struct Band<'a> {
    pub src: &'a [f32],
    pub plane: usize,
    pub row: usize,
    pub first: usize,
}

/// What the tiles of one group over a band share: the group's first input block at `base`,
/// where each output pixel of the band reads its first tap (`pixels`, from `base`) and the
/// offsets of the taps from there (`taps`); the output of the band's first pixel in the
/// group's first block (`out`), the floats between blocks (`stride`), the first block within
/// the image (`block`) and the valid lanes of the group's last block (`last`).
#[derive(Clone, Copy)]
struct Span<'a> {
    base: *const f32,
    pixels: &'a [usize],
    taps: &'a [usize],
    sums: *mut f32,
    out: Out<'a>,
    stride: usize,
    block: usize,
    last: usize,
}

impl<'a> Span<'a> {
    /// How the reduction over [`Self::taps`] is cut for `tiles` tiles whose weights take
    /// `floats` floats a tap: taps per chunk, and chunks. Each chunk's weights (at most
    /// [`CHUNK_BYTES`]) stay in L1 while every tile of the band runs them, its sums kept in
    /// `sums` between chunks; one chunk (the whole reduction per tile, no partial sums) where
    /// there is one tile or the weights fit anyway. The same products in the same order.
    fn chunks(&self, tiles: usize, floats: usize) -> (usize, usize) {
        let all = self.taps.len();
        let parts = if tiles < 2 {
            1
        } else {
            (all * floats * 4).div_ceil(CHUNK_BYTES).max(1)
        };
        let chunk = all.div_ceil(parts).max(1);
        (chunk, all.div_ceil(chunk).max(1))
    }

    /// Tile `k` of `PX` pixels: its pixels' first taps (past `n`, the valid pixels, the last
    /// repeated), where it stores, and its shape.
    ///
    /// # Safety
    /// The span's contract (see `direct_band`).
    #[inline(always)]
    unsafe fn tile<const PX: usize>(&self, k: usize) -> ([*const f32; PX], Out<'a>, Tile) {
        let q0 = k * PX;
        let n = PX.min(self.pixels.len() - q0);
        // SAFETY (pointer computations): the pixels' taps and outputs lie in the band.
        unsafe {
            let px = std::array::from_fn(|p| self.base.add(self.pixels[q0 + p.min(n - 1)]));
            let out = Out {
                y: self.out.y.add(q0 * B),
                at: self.out.at + q0 * B,
                post: self.out.post,
            };
            let t = Tile {
                stride: self.stride,
                block: self.block,
                n,
                last: self.last,
            };
            (px, out, t)
        }
    }
}

/// A tile's shape: `n` valid pixels, the first of its blocks (`block`, within the image) and
/// the floats between blocks (`stride`), and the valid lanes of its last block (`last`).
#[derive(Clone, Copy)]
struct Tile {
    stride: usize,
    block: usize,
    n: usize,
    last: usize,
}

/// The pixels per tile of two blocks for a band of `n` output pixels: five where that computes
/// at least 4% fewer than six (the last tile computes a whole tile's pixels, however few it
/// stores), else six. A 7x7 plane's 49 pixels take ten tiles of five (50) instead of nine of
/// six (54): 6% faster. Fewer pixels per tile read the weights more often per pixel: the
/// weights of a step come from L2 (a pair of blocks' filter is 36 KiB at 64 input channels), and
/// four pixels per tile were 10-15% slower per pixel than six.
pub(super) fn tile_pixels(n: usize) -> usize {
    let computed = |pp: usize| n.div_ceil(pp) * pp;
    if computed(5) * 25 <= computed(P) * 24 {
        5
    } else {
        P
    }
}

/// The pixels per tile of the 512-bit kernel's two pairs of blocks (four blocks of a blocked
/// input) for a band of `n` output pixels: seven, fourteen sums in the thirty-two `zmm`
/// registers, where that computes no more pixels than [`tile_pixels`] (the planes of ResNet,
/// MobileNet and EfficientNet are multiples of seven wide: no tile is partial); else as there.
/// Seven pixels read each step's weights for more sums: eight 960 -> 320 1x1 layers at 7x7,
/// two threads on a Xeon, 1.08 -> 1.00 ms; four 3x3 512-channel layers 3.56 -> 3.26.
fn tile_pixels512(n: usize) -> usize {
    let other = tile_pixels(n);
    if n.div_ceil(7) * 7 <= n.div_ceil(other) * other {
        7
    } else {
        other
    }
}

/// Stores a tile's sums `$acc` (`[[__m256; NB]; PX]`, pixel by block) through the epilogue,
/// the padding lanes of the last block zeroed; `$out` and `$t` as for [`tile`]. A macro, not a
/// function: the kernels' sums must stay in registers, and a call LLVM declines to inline
/// keeps them in memory through the whole reduction (measured 7% slower).
///
/// Safety: as for [`tile`]; used inside an `unsafe` block of a function with AVX2 and FMA.
macro_rules! store_sums {
    ($acc:expr, $out:expr, $t:expr) => {{
        let (mut acc, out, t): (_, Out, Tile) = ($acc, $out, $t);
        let nb = acc[0].len();
        if t.last < B {
            let keep = _mm256_castsi256_ps(first(t.last));
            for a in acc.iter_mut() {
                a[nb - 1] = _mm256_and_ps(a[nb - 1], keep);
            }
        }
        match (out.post).simple(t.block * B) {
            // A whole tile with a bias and a clamp at most: stored here, inlined, the sums
            // still in registers (the call to the tile store takes them through memory: 7%
            // of a 1x1 layer with sixteen input channels). The 512-bit tiles' store inlined
            // so measured 5% slower on Zen 4 and is left a call.
            Some(s) if t.n == acc.len() => {
                for b in 0..nb {
                    let e = s.block(b * B);
                    for (p, a) in acc.iter().enumerate() {
                        _mm256_storeu_ps(out.y.add(b * t.stride + p * B), e.apply(a[b]));
                    }
                }
            }
            _ => (out.post).store_tile(&acc, t.n, t.block * B, t.stride, out.y, out.at),
        }
    }};
}

/// The tiles of the direct kernel over a band for one group: pixels in tiles of `PX` (the last
/// may have fewer, the rest repeat its last) by `NB` output blocks, in one function so that a
/// tile costs no call (with sixteen input channels a tile is only 96 cycles of multiply-adds).
/// Step `s` of a pixel's reduction reads lane `s % L` at offset `taps[s / L]` from its first
/// tap and the `8 * NB` weights at `w + 8 * NB * s`; the sums go to output block `b` at
/// `b * stride` from the pixel's output, with lanes from `last` on of the last block zero
/// (past the output's channels), through the epilogue.
///
/// # Safety
/// The CPU has AVX2 and FMA; every read lies inside its buffer; the span's output holds its
/// pixels of each of the `NB` blocks.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tiles<const NB: usize, const L: usize, const PX: usize>(span: Span, w: *const f32) {
    debug_assert!(PX <= P && PX * NB <= 12);
    for k in 0..span.pixels.len().div_ceil(PX) {
        // SAFETY: the caller's contract.
        let (px, out, t) = unsafe { span.tile::<PX>(k) };
        let mut acc = [[_mm256_setzero_ps(); NB]; PX];
        // The reduction; with `$fetch`, each step also asks for the weights one filter further
        // on (the next group's) to be brought into L2, as `tiles512` does a chunk ahead.
        macro_rules! reduce {
            ($fetch:expr) => {{
                let mut wp = w;
                let ahead = span.taps.len() * L * NB * B;
                for &off in span.taps {
                    for l in 0..L {
                        // SAFETY (block): the caller's contract (a prefetch is a hint).
                        unsafe {
                            if $fetch {
                                let p = wp.wrapping_add(ahead) as *const i8;
                                _mm_prefetch::<_MM_HINT_T1>(p);
                            }
                            let wv: [__m256; NB] =
                                std::array::from_fn(|b| _mm256_loadu_ps(wp.add(b * B)));
                            for (p, a) in acc.iter_mut().enumerate() {
                                let xv = _mm256_broadcast_ss(&*px[p].add(off + l));
                                for b in 0..NB {
                                    a[b] = _mm256_fmadd_ps(xv, wv[b], a[b]);
                                }
                            }
                            wp = wp.add(NB * B);
                        }
                    }
                }
            }};
        }
        if k == 0 && L > 1 {
            // Each tile streams the group's whole filter from L2; at batch 1 the first tile's
            // comes from memory (or L3). Fetched during the group before, four 3x3 512-channel
            // layers at 7x7 on the AVX2 path of a Xeon: one thread 12.73 -> 11.45 ms, two 6.34
            // -> 5.34. Not for plain inputs (one lane a step), as in `tiles512`.
            reduce!(true)
        } else {
            reduce!(false)
        }
        // SAFETY: pixel p < n of each block; the epilogue's operands cover the output.
        unsafe { store_sums!(acc, out, t) }
    }
}

/// [`tiles`] with AVX-512F, for `NP` pairs of blocks (one or two), the filter of pair `j` at
/// `w[j]`, `L` lanes of the input a step as there: each pixel's sixteen sums of a pair in one
/// `zmm` register, each step one load of a pair's sixteen weights and one broadcast per pixel;
/// the same sums in the same order as [`tiles`].
///
/// # Safety
/// As for [`tiles`] with `2 * NP` blocks, and the CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn tiles512<const NP: usize, const L: usize, const PX: usize>(
    span: Span,
    w: [*const f32; NP],
) {
    let tiles = span.pixels.len().div_ceil(PX);
    let (chunk, chunks) = span.chunks(tiles, L * NP * 2 * B);
    for c in 0..chunks {
        let (first, last) = (c == 0, c + 1 == chunks);
        let taps = &span.taps[c * chunk..((c + 1) * chunk).min(span.taps.len())];
        for k in 0..tiles {
            // SAFETY: the caller's contract.
            let (px, out, t) = unsafe { span.tile::<PX>(k) };
            // This tile's partial sums between chunks, pixel by pair.
            // SAFETY (a pointer computation): `sums` holds the band's tiles (`Span::chunks`).
            let sums = unsafe { span.sums.add(k * PX * NP * 2 * B) };
            let mut acc = [[_mm512_setzero_ps(); NP]; PX];
            if !first {
                for (p, a) in acc.iter_mut().enumerate() {
                    for (j, a) in a.iter_mut().enumerate() {
                        // SAFETY: written by this tile's previous chunk.
                        *a = unsafe { _mm512_loadu_ps(sums.add((p * NP + j) * 2 * B)) };
                    }
                }
            }
            // The reduction over this chunk's taps; with `$fetch`, each step also asks for the
            // weights a chunk further on to be brought into L2.
            macro_rules! reduce {
                ($fetch:expr) => {{
                    let mut at = c * chunk * L * 2 * B;
                    let ahead = chunk * L * 2 * B;
                    for &off in taps {
                        for l in 0..L {
                            // SAFETY (block): the caller's contract (a prefetch is a hint).
                            unsafe {
                                if $fetch {
                                    for wj in w {
                                        let p = wj.wrapping_add(at + ahead) as *const i8;
                                        _mm_prefetch::<_MM_HINT_T1>(p);
                                    }
                                }
                                let wv: [__m512; NP] =
                                    std::array::from_fn(|j| _mm512_loadu_ps(w[j].add(at)));
                                for (p, a) in acc.iter_mut().enumerate() {
                                    let xv = _mm512_set1_ps(*px[p].add(off + l));
                                    for j in 0..NP {
                                        a[j] = _mm512_fmadd_ps(xv, wv[j], a[j]);
                                    }
                                }
                            }
                            at += 2 * B;
                        }
                    }
                }};
            }
            if k == 0 && L > 1 {
                // The band's first tile fetches the chunk after this one (after the last, what
                // follows the filter: the next group's weights), a line a step, so that they
                // come from memory (or L3) while this chunk's tiles run: at batch 1 a model's
                // weights are not in L2 (four 3x3 512-channel layers at 7x7, one thread on a
                // Xeon, 8.21 -> 6.93 ms; two threads 3.63 -> 3.57). Not for a plain input (one
                // lane a step, its broadcasts from scattered lines): ViT's 16x16 patch layer
                // ran 1.10 -> 1.19 ms with it.
                reduce!(true)
            } else {
                reduce!(false)
            }
            if last {
                // SAFETY: pixel p < n of each block; the epilogue's operands cover the output.
                unsafe { store512(acc, out, t) }
            } else {
                for (p, a) in acc.iter().enumerate() {
                    for (j, &a) in a.iter().enumerate() {
                        // SAFETY: this tile's sums (see above).
                        unsafe { _mm512_storeu_ps(sums.add((p * NP + j) * 2 * B), a) };
                    }
                }
            }
        }
    }
}

/// Stores the sums of a [`tiles512`] tile: whole blocks through the 512-bit tile store where
/// the epilogue has a form there, else each pair as a tile of two `ymm` blocks (the last
/// block's padding lanes zeroed there).
///
/// # Safety
/// As for [`tiles512`], for this tile.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
unsafe fn store512<const NP: usize, const PX: usize>(acc: [[__m512; NP]; PX], out: Out, t: Tile) {
    // By value, and the store reads this copy by reference: were it the kernel's `acc`
    // itself, LLVM would keep `acc` in memory through the whole reduction wherever it does not
    // inline the store (1.5x slower).
    let sums = acc;
    // SAFETY: pixel p < n of each block; the epilogue's operands cover the output.
    if t.last >= B
        && unsafe { (out.post).store_tile512(&sums, t.n, t.block * B, t.stride, out.y, out.at) }
    {
        return;
    }
    for j in 0..NP {
        let halves: [[__m256; 2]; PX] =
            std::array::from_fn(|p| [_mm512_castps512_ps256(acc[p][j]), high(acc[p][j])]);
        let skip = 2 * j * t.stride;
        let t = Tile {
            block: t.block + 2 * j,
            last: if j + 1 == NP { t.last } else { B },
            ..t
        };
        // SAFETY: pixel p < n of each block; the epilogue's operands cover the output.
        unsafe {
            let out = Out {
                y: out.y.add(skip),
                at: out.at + skip,
                post: out.post,
            };
            store_sums!(halves, out, t)
        }
    }
}

/// Never called: `NchwcConv::new` declines off x86-64.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn tiles<const NB: usize, const L: usize, const PX: usize>(_: Span, _: *const f32) {
    unreachable!("no AVX2 off x86-64")
}

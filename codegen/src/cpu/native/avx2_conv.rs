//! `conv_integer` on AVX2: with AVX-VNNI (`vpdpbusd` on 256-bit vectors), or on `vpmaddubsw`
//! for filters whose taps fit in 7 bits (`tcc quantize --reduce-range` makes them so;
//! onnxruntime's `reduce_range` likewise), or for the others on `vpmaddwd` with both operands
//! less their zero points widened to i16 ([`tile16`]: pair sums of at most 130,050, exact).
//!
//! With AVX-VNNI each 4-tap step is one `vpdpbusd` a register of eight i32 sums, exact for
//! every byte. Without it:
//! `vpmaddubsw` multiplies 32 unsigned bytes by 32 signed ones and adds adjacent pairs into
//! sixteen i16 lanes, saturating: with the image as the unsigned operand (`0..=255`) and the
//! filter as the signed one within `-64..=63`, a pair sum lies in `-32640..=32130` and never
//! saturates, so the sums are exact. `vpmaddwd` by ones then adds pairs of those into i32
//! lanes: four taps a lane, as `vpdpbusd` does, at three instructions instead of one (and
//! twice the multiply-adds per instruction of an f32 `vfmadd`). The operands, their shifts and
//! the zero-point terms are [`super::vnni_conv`]'s, with the filter prepared the same way
//! ([`Filter`], its `narrow` saying whether the taps fit); the columns are im2col's rows (the
//! image itself for a pointwise convolution), packed per block of 16 pixels into 4-tap steps
//! of 16 pixels x 4 bytes. The register tile is 4 output channels by 16 pixels (8
//! accumulators); the requantizing chain stores each channel's 16 outputs from the registers
//! ([`Plain8`]), or runs on them as a row where it can make NaN.

use std::arch::x86_64::*;

use super::plain::Plain8;
use super::requant::Bound;
use super::vnni_conv::Filter;

/// Pixels per block: two 8-lane vectors.
const PX: usize = 16;
/// Output channels per register tile.
const CH: usize = 4;

/// What one group's convolution reads and writes.
#[derive(Clone, Copy)]
pub(super) struct Columns<'a> {
    /// The group's receptive fields: `k` rows of `n` bytes.
    pub cols: *const u8,
    pub n: usize,
    /// The filter's rows for this group.
    pub first: usize,
    pub m: usize,
    /// The input's zero point (a level of the input's type) and whether the input is i8.
    pub zx: i32,
    pub signed: bool,
    /// `m x n` results, row-major: the sums (i32), or with `post` what its chain stores.
    pub out: *mut u8,
    pub post: Option<&'a Bound<'a>>,
    /// Whether the CPU has AVX-VNNI (else the filter is narrow or has its `pairs`).
    pub vnni: bool,
}

impl Columns<'_> {
    /// Bytes `p0..p0 + count` (`count <= 16`) of tap `t`'s row, the rest zero: a short block's
    /// through a copy, so that nothing past the columns is read.
    ///
    /// # Safety
    /// Row `t` of the columns holds those bytes.
    #[inline(always)]
    unsafe fn bytes(&self, t: usize, p0: usize, count: usize) -> __m128i {
        let src = self.cols.wrapping_add(t * self.n + p0);
        // SAFETY: as this function's contract.
        unsafe {
            if count == PX {
                _mm_loadu_si128(src as *const __m128i)
            } else {
                let mut b = [0u8; PX];
                std::ptr::copy_nonoverlapping(src, b.as_mut_ptr(), count);
                _mm_loadu_si128(b.as_ptr() as *const __m128i)
            }
        }
    }

    /// Whether the product runs on i16 pairs ([`tile16`]): no AVX-VNNI, and the filter not
    /// narrow (it has its [`Filter::pairs`]).
    fn on_pairs(&self, filter: &Filter) -> bool {
        !self.vnni && filter.pairs.is_some()
    }
}

thread_local! {
    /// A thread's packed block and the chain's row of reals.
    static SCRATCH: std::cell::RefCell<(Vec<u8>, Vec<f32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// One group of a convolution: `out = filter rows first..first + m` times the columns, less
/// the zero points, wrapping in i32 (then the chain, if any).
///
/// # Safety
/// The CPU has AVX2, and AVX-VNNI where `c.vnni` (else the filter is narrow or has its
/// `pairs`); `c.cols` holds `filter.k` rows of `c.n` bytes, and `c.out` holds `m x n` results
/// that nothing else accesses during the call.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn convolve(filter: &Filter, c: Columns) {
    let n = c.n;
    let blocks = n.div_ceil(PX);
    let tiles = c.m.div_ceil(CH);
    // Each split packs its block itself.
    let splits = super::vnni_conv::splits(blocks, tiles);
    let work = c.m * n * filter.k;
    let consts = filter.constants(c.first..c.first + c.m, c.zx, c.signed);
    let wide = c.on_pairs(filter);
    // SAFETY: AVX2, as this function's contract.
    let plain = c.post.and_then(|p| unsafe { p.plain8() });
    // SAFETY: items write disjoint (block, channel range) pieces of `out`; the columns and
    // the filter are only read.
    let c = unsafe { crate::cpu::send_ptr::SendPtr::new(c) };
    let item = |i: usize| {
        let (block, split) = (i / splits, i % splits);
        let t0 = split * tiles / splits;
        let t1 = (split + 1) * tiles / splits;
        SCRATCH.with(|s| {
            let (packed, real) = &mut *s.borrow_mut();
            // i16 pairs take twice the bytes.
            packed.resize(filter.kp * PX * 2, 0);
            // SAFETY: the CPU features and buffers as this function's contract.
            unsafe {
                let colsum = if wide {
                    pack16(&c.get(), filter, block * PX, packed.as_mut_ptr());
                    [_mm256_setzero_si256(); 2]
                } else {
                    pack(&c.get(), filter, block * PX, packed.as_mut_ptr())
                };
                let at = (block * PX, colsum);
                run_block(
                    filter,
                    c.get(),
                    &consts,
                    at,
                    t0 * CH..t1 * CH,
                    packed,
                    (plain, real),
                );
            }
        });
    };
    super::vnni_conv::parallel(blocks * splits, work, &item);
}

/// Packs pixels `p0..p0 + 16` (those below `n`) of the columns into `out` as 4-tap steps of
/// 16 pixels x 4 bytes, each byte shifted to u8 where the input is i8, taps past `k` and
/// pixels past `n` zero; returns each pixel's sum of its bytes where the filter needs it (not
/// [`Filter::centered`]), else zeros.
///
/// # Safety
/// AVX2; `c.cols` holds `filter.k` rows of `c.n` bytes; `out` holds `filter.kp * 16` bytes.
#[target_feature(enable = "avx2")]
unsafe fn pack(c: &Columns, filter: &Filter, p0: usize, out: *mut u8) -> [__m256i; 2] {
    let (k, count) = (filter.k, (c.n - p0).min(PX));
    let bit = _mm_set1_epi8(if c.signed { -128 } else { 0 });
    let (ones8, ones16) = (_mm256_set1_epi8(1), _mm256_set1_epi16(1));
    let mut sums = [_mm256_setzero_si256(); 2];
    for s in 0..k.div_ceil(4) {
        let mut four = [_mm_setzero_si128(); 4];
        for (i, row) in four.iter_mut().enumerate().take(k - 4 * s) {
            // SAFETY: tap `4s + i < k` of the columns, as this function's contract.
            let v = unsafe { c.bytes(4 * s + i, p0, count) };
            *row = _mm_xor_si128(v, bit);
        }
        let [a0, a1, a2, a3] = four;
        let (t0, t1) = (_mm_unpacklo_epi8(a0, a1), _mm_unpackhi_epi8(a0, a1));
        let (t2, t3) = (_mm_unpacklo_epi8(a2, a3), _mm_unpackhi_epi8(a2, a3));
        // Pixels 0-3, 4-7, 8-11, 12-15, four taps each.
        let pixels = [
            _mm_unpacklo_epi16(t0, t2),
            _mm_unpackhi_epi16(t0, t2),
            _mm_unpacklo_epi16(t1, t3),
            _mm_unpackhi_epi16(t1, t3),
        ];
        let step = out.wrapping_add(s * 4 * PX) as *mut __m128i;
        for (i, p) in pixels.into_iter().enumerate() {
            // SAFETY: `out` holds step `s`'s 64 bytes.
            unsafe { _mm_storeu_si128(step.add(i), p) };
        }
        if !filter.centered {
            for (h, sum) in sums.iter_mut().enumerate() {
                let v = _mm256_set_m128i(pixels[2 * h + 1], pixels[2 * h]);
                let pairs = _mm256_maddubs_epi16(v, ones8);
                *sum = _mm256_add_epi32(*sum, _mm256_madd_epi16(pairs, ones16));
            }
        }
    }
    sums
}

/// The raw products `w'x'` of filter rows `rows..` (`live` of them, `kp` bytes apart; the
/// tile's other rows repeat the last) with a packed block of 16 pixels: `vpmaddubsw` and
/// `vpmaddwd` by ones, or with `VNNI` one `vpdpbusd`.
///
/// # Safety
/// AVX2, and AVX-VNNI with `VNNI` (else the filter is narrow; inlined into [`tile`] and
/// [`tile_vnni`], which have those features); `rows` reaches `live` rows of `kp` bytes,
/// `panel` `kp * 16` bytes.
#[inline(always)]
unsafe fn tile_with<const VNNI: bool>(
    rows: *const i8,
    kp: usize,
    live: usize,
    panel: *const u8,
) -> [[__m256i; 2]; CH] {
    // SAFETY: as this function's contract.
    unsafe {
        let mut acc = [[_mm256_setzero_si256(); 2]; CH];
        let ptr: [*const i8; CH] = std::array::from_fn(|r| rows.wrapping_add(r.min(live - 1) * kp));
        let ones = _mm256_set1_epi16(1);
        for g in 0..kp / 4 {
            // Step `g` of the panel and of each row, unaligned loads.
            let b0 = _mm256_loadu_si256(panel.add(g * 64) as *const _);
            let b1 = _mm256_loadu_si256(panel.add(g * 64 + 32) as *const _);
            for (a, p) in acc.iter_mut().zip(ptr) {
                let x = _mm256_set1_epi32((p.add(g * 4) as *const i32).read_unaligned());
                if VNNI {
                    a[0] = _mm256_dpbusd_avx_epi32(a[0], b0, x);
                    a[1] = _mm256_dpbusd_avx_epi32(a[1], b1, x);
                } else {
                    let (p0, p1) = (_mm256_maddubs_epi16(b0, x), _mm256_maddubs_epi16(b1, x));
                    a[0] = _mm256_add_epi32(a[0], _mm256_madd_epi16(p0, ones));
                    a[1] = _mm256_add_epi32(a[1], _mm256_madd_epi16(p1, ones));
                }
            }
        }
        acc
    }
}

/// Packs pixels `p0..p0 + 16` of the columns for [`tile16`]: 2-tap steps of 16 pixels x 2
/// i16, each the byte's level less the input's zero point, taps past `k` zero.
///
/// # Safety
/// AVX2; `c.cols` holds `filter.k` rows of `c.n` bytes; `out` holds `filter.kp * 32` bytes.
#[target_feature(enable = "avx2")]
unsafe fn pack16(c: &Columns, filter: &Filter, p0: usize, out: *mut u8) {
    let (k, count) = (filter.k, (c.n - p0).min(PX));
    let zx = _mm256_set1_epi16(c.zx as i16);
    // Tap `t`'s 16 levels less the zero point (a short block's through a copy).
    let row = |t: usize| {
        if t >= k {
            return _mm256_setzero_si256();
        }
        // SAFETY: tap `t < k` of the columns, as this function's contract.
        let bytes = unsafe { c.bytes(t, p0, count) };
        let wide = if c.signed {
            _mm256_cvtepi8_epi16(bytes)
        } else {
            _mm256_cvtepu8_epi16(bytes)
        };
        _mm256_sub_epi16(wide, zx)
    };
    for s in 0..filter.kp / 2 {
        let (r0, r1) = (row(2 * s), row(2 * s + 1));
        // Pixels 0-3 | 8-11 and 4-7 | 12-15, put in order.
        let (lo, hi) = (_mm256_unpacklo_epi16(r0, r1), _mm256_unpackhi_epi16(r0, r1));
        let step = out.wrapping_add(s * 64) as *mut __m256i;
        // SAFETY: `out` holds step `s`'s 64 bytes.
        unsafe {
            _mm256_storeu_si256(step, _mm256_permute2x128_si256::<0x20>(lo, hi));
            _mm256_storeu_si256(step.add(1), _mm256_permute2x128_si256::<0x31>(lo, hi));
        }
    }
}

/// The sums of filter rows `rows..` of [`Filter::pairs`] (`live` of them, `kp` apart) with a
/// block [`pack16`] made: per 2-tap step one `vpmaddwd` a register of eight i32 sums (and an
/// add), exact for every byte, and already less the zero points.
///
/// # Safety
/// AVX2; `rows` reaches `live` rows of `kp` i16, `panel` `kp * 32` bytes.
#[target_feature(enable = "avx2")]
unsafe fn tile16(rows: *const i16, kp: usize, live: usize, panel: *const u8) -> [[__m256i; 2]; CH] {
    let mut acc = [[_mm256_setzero_si256(); 2]; CH];
    let ptr: [*const i16; CH] = std::array::from_fn(|r| rows.wrapping_add(r.min(live - 1) * kp));
    for g in 0..kp / 2 {
        // SAFETY: step `g` of the panel and of each row, unaligned loads.
        unsafe {
            let b0 = _mm256_loadu_si256(panel.add(g * 64) as *const _);
            let b1 = _mm256_loadu_si256(panel.add(g * 64 + 32) as *const _);
            for (a, p) in acc.iter_mut().zip(ptr) {
                let x = _mm256_set1_epi32((p.add(g * 2) as *const i32).read_unaligned());
                a[0] = _mm256_add_epi32(a[0], _mm256_madd_epi16(b0, x));
                a[1] = _mm256_add_epi32(a[1], _mm256_madd_epi16(b1, x));
            }
        }
    }
    acc
}

/// [`tile_with`] on `vpmaddubsw`.
///
/// # Safety
/// As [`tile_with`], without VNNI.
#[target_feature(enable = "avx2")]
unsafe fn tile(rows: *const i8, kp: usize, live: usize, panel: *const u8) -> [[__m256i; 2]; CH] {
    // SAFETY: as this function's contract.
    unsafe { tile_with::<false>(rows, kp, live, panel) }
}

/// [`tile_with`] on AVX-VNNI.
///
/// # Safety
/// As [`tile_with`], with VNNI.
#[target_feature(enable = "avx2,avxvnni")]
unsafe fn tile_vnni(
    rows: *const i8,
    kp: usize,
    live: usize,
    panel: *const u8,
) -> [[__m256i; 2]; CH] {
    // SAFETY: as this function's contract.
    unsafe { tile_with::<true>(rows, kp, live, panel) }
}

/// Pixels `p0..p0 + 16` (those below `n`; `colsum` their byte sums) of channels `chans` (of
/// the group, clipped to `m`), from the packed block `panel`.
///
/// # Safety
/// As [`convolve`]; `panel` is the block [`pack`] made.
#[target_feature(enable = "avx2")]
unsafe fn run_block(
    filter: &Filter,
    c: Columns,
    consts: &[i32],
    (p0, colsum): (usize, [__m256i; 2]),
    chans: std::ops::Range<usize>,
    panel: &[u8],
    (plain, real): (Option<Plain8>, &mut Vec<f32>),
) {
    let (n, kp) = (c.n, filter.kp);
    let count = (n - p0).min(PX);
    for c0 in chans.step_by(CH) {
        let live = (c.m - c0).min(CH);
        if live == 0 {
            break;
        }
        let first = c.first + c0;
        let rows = filter.rows.as_ptr().wrapping_add(first * kp);
        // SAFETY: rows `first..first + live` of the filter and `kp * 16` packed bytes; AVX-VNNI
        // where `c.vnni` says.
        let acc = unsafe {
            match (&filter.pairs, c.vnni) {
                (_, true) => tile_vnni(rows, kp, live, panel.as_ptr()),
                (Some(pairs), false) => {
                    tile16(pairs.as_ptr().add(first * kp), kp, live, panel.as_ptr())
                }
                (None, false) => tile(rows, kp, live, panel.as_ptr()),
            }
        };
        // The i16 sums are less the zero points already.
        let exact = c.on_pairs(filter);
        for (r, acc) in acc.iter().enumerate().take(live) {
            let o = first + r;
            let zw = _mm256_set1_epi32(filter.zeros[o]);
            let k = _mm256_set1_epi32(consts[c0 + r]);
            let sums: [__m256i; 2] = std::array::from_fn(|h| {
                if exact {
                    acc[h]
                } else if filter.centered {
                    _mm256_add_epi32(acc[h], k)
                } else {
                    let zc = _mm256_mullo_epi32(zw, colsum[h]);
                    _mm256_add_epi32(_mm256_sub_epi32(acc[h], zc), k)
                }
            });
            // Row `c0 + r` of the group's output, pixels `p0..p0 + count`.
            let at = (c0 + r) * n + p0;
            // SAFETY: as above; the chain's operands cover channel `o`.
            unsafe {
                match (plain, c.post) {
                    (Some(p), _) => {
                        let y = sums.map(|v| _mm256_cvtepi32_ps(v));
                        p.store(y, o, count, c.out.add(at));
                    }
                    (_, post) => {
                        let mut row = [0i32; PX];
                        _mm256_storeu_si256(row.as_mut_ptr() as *mut __m256i, sums[0]);
                        _mm256_storeu_si256(row.as_mut_ptr().add(8) as *mut __m256i, sums[1]);
                        match post {
                            Some(post) => {
                                let size = if post.quantize.is_some() { 1 } else { 4 };
                                post.row(&row[..count], o, c.out.add(size * at), real, true);
                            }
                            None => {
                                let dst = c.out.add(4 * at) as *mut i32;
                                std::ptr::copy_nonoverlapping(row.as_ptr(), dst, count);
                            }
                        }
                    }
                }
            }
        }
    }
}

//! Depthwise `conv_integer` on AVX-512 VNNI, for i8 filters: each channel's taps in groups of
//! four, one `vpdpbusd` per group and sixteen outputs.
//!
//! Per channel, the input bytes go once into a padded plane of bytes (padding = the input's
//! zero point; i8 input shifted to u8 by flipping its sign bit, the zero point alike), kept as
//! two column phases when the column stride is 2 so that each tap reads sixteen consecutive
//! bytes for sixteen outputs. For a group of four taps, the four runs of sixteen bytes are
//! interleaved (two rounds of unpacks) into sixteen 4-byte groups, which `vpdpbusd` multiplies
//! by the group's four weights and adds to sixteen i32 sums in one instruction. The zero points
//! come back as `sum (x - zx)(w - zw) = sum x w - zw sum x - zx sum w + taps zx zw`: `sum x` is a
//! second `vpdpbusd` by ones where the channel's filter zero point is not 0, the rest one
//! constant per channel. Exact in wrapping i32, as the interpreter.

use super::int_depthwise::Depthwise;

/// The most taps a filter may have here (groups of four kept in registers' worth of arrays).
const MAX_TAPS: usize = 64;

/// One channel's operands: its bytes, whether they are i8 (their sign bits flipped here), the
/// zero point's level in u8 terms, the filter's taps (i8) and their zero point.
pub(super) struct Channel<'a> {
    pub x: &'a [u8],
    pub flip: bool,
    pub zx: i32,
    pub w: &'a [i8],
    pub zw: i32,
}

impl Depthwise {
    /// Whether the VNNI kernel takes this convolution: a column stride of 1 or 2, at most
    /// [`MAX_TAPS`] taps.
    pub(super) fn vnni_fits(&self) -> bool {
        self.strides[1] <= 2 && self.kernel[0] * self.kernel[1] <= MAX_TAPS
    }

    /// The channel `c` into its `oH x oW` sums `y`, `plane` being scratch.
    ///
    /// # Safety
    /// AVX-512F, BW, VL and VNNI; `c.x` holds `H x W` bytes and `c.w` `kH x kW` taps;
    /// [`Depthwise::vnni_fits`].
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn channel_vnni(
        &self,
        c: Channel,
        (plane, padded): &mut (Vec<u8>, Vec<u8>),
        y: &mut [i32],
    ) {
        use std::arch::x86_64::*;
        let [_, _, h, w] = self.xd;
        let [_, _, oh, ow] = self.yd;
        let [kh, kw] = self.kernel;
        let [sh, s] = self.strides;
        let [dh, dw] = self.dilations;
        let [pt, pl, pb, pr] = self.pads;
        let (hp, wp) = (h + pt + pb, w + pl + pr);
        let wq = wp.div_ceil(s);
        let zx = c.zx as u8;
        // Phase `r` holds padded columns `r, r + s, ...`: padded (row, column) at
        // `(column % s * hp + row) * wq + column / s`, with room for a block's reads past the end.
        plane.clear();
        plane.resize(s * hp * wq + 64, zx);
        let flip = if c.flip { 0x80 } else { 0 };
        padded.clear();
        padded.resize(wp + 64, zx);
        for (iy, row) in c.x.chunks_exact(w).enumerate() {
            let row_at = |r: usize| (r * hp + iy + pt) * wq;
            if s == 1 {
                let dst = &mut plane[row_at(0) + pl..][..w];
                for (d, &b) in dst.iter_mut().zip(row) {
                    *d = b ^ flip;
                }
                continue;
            }
            for (d, &b) in padded[pl..pl + w].iter_mut().zip(row) {
                *d = b ^ flip;
            }
            // SAFETY: `padded` has 64 bytes past the row; the phases `wq` each per row.
            unsafe { split_pairs(&padded[..wp], plane, row_at(0), row_at(1)) };
        }
        // Each group of four taps: where its runs start (for output (0, 0)), its weights, and
        // a 1 for each tap it has (for `sum x`). A short last group's missing places read its
        // first tap's run (any run would do), weighed 0 and counted 0.
        let n = kh * kw;
        let zero = _mm512_setzero_si512();
        let mut groups = [([0usize; 4], zero, zero); MAX_TAPS / 4];
        for (g, group) in groups.iter_mut().enumerate().take(n.div_ceil(4)) {
            let (mut wt, mut ones) = ([0i8; 4], [0i8; 4]);
            for j in 0..4 {
                let t = if 4 * g + j < n { 4 * g + j } else { 4 * g };
                let (ky, kx) = (t / kw, t % kw);
                let col = kx * dw;
                group.0[j] = (col % s * hp + ky * dh) * wq + col / s;
                if 4 * g + j < n {
                    (wt[j], ones[j]) = (c.w[t], 1);
                }
            }
            let packed = |b: [i8; 4]| _mm512_set1_epi32(i32::from_le_bytes(b.map(|b| b as u8)));
            (group.1, group.2) = (packed(wt), packed(ones));
        }
        let groups = &groups[..n.div_ceil(4)];
        let sum_w: i32 = c.w.iter().map(|&t| i32::from(t)).sum();
        let n_taps = n as i32;
        let constant = _mm512_set1_epi32(
            (c.zx.wrapping_mul(n_taps).wrapping_mul(c.zw)).wrapping_sub(c.zx.wrapping_mul(sum_w)),
        );
        let zw = _mm512_set1_epi32(c.zw);
        let base = plane.as_ptr();
        for oy in 0..oh {
            let row = oy * sh * wq;
            for x0 in (0..ow).step_by(16) {
                let (mut acc, mut sum_x) = (_mm512_setzero_si512(), _mm512_setzero_si512());
                for (at, wg, ones) in groups {
                    // SAFETY: every run starts inside the plane and its 16 bytes end within the
                    // 64 spare bytes past it.
                    let z = unsafe {
                        let load = |a: usize| _mm_loadu_si128(base.add(a + row + x0).cast());
                        interleave4([load(at[0]), load(at[1]), load(at[2]), load(at[3])])
                    };
                    acc = _mm512_dpbusd_epi32(acc, z, *wg);
                    if c.zw != 0 {
                        sum_x = _mm512_dpbusd_epi32(sum_x, z, *ones);
                    }
                }
                let v = _mm512_add_epi32(
                    _mm512_sub_epi32(acc, _mm512_mullo_epi32(zw, sum_x)),
                    constant,
                );
                let lanes = 16.min(ow - x0);
                let mask = ((1u32 << lanes) - 1) as u16;
                // SAFETY: the `lanes` lanes are outputs `x0..x0 + lanes` of row `oy`.
                unsafe {
                    _mm512_mask_storeu_epi32(y.as_mut_ptr().add(oy * ow + x0).cast(), mask, v)
                };
            }
        }
    }
}

/// Sixteen outputs' four taps, `runs[j]` holding tap `j` of each, as sixteen groups of four
/// bytes (output `i`'s at bytes `4i..4i+4`).
///
/// # Safety
/// AVX-512F.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn interleave4(runs: [std::arch::x86_64::__m128i; 4]) -> std::arch::x86_64::__m512i {
    use std::arch::x86_64::*;
    let [b0, b1, b2, b3] = runs;
    let (lo01, hi01) = (_mm_unpacklo_epi8(b0, b1), _mm_unpackhi_epi8(b0, b1));
    let (lo23, hi23) = (_mm_unpacklo_epi8(b2, b3), _mm_unpackhi_epi8(b2, b3));
    let q = [
        _mm_unpacklo_epi16(lo01, lo23),
        _mm_unpackhi_epi16(lo01, lo23),
        _mm_unpacklo_epi16(hi01, hi23),
        _mm_unpackhi_epi16(hi01, hi23),
    ];
    let lo = _mm256_inserti128_si256(_mm256_castsi128_si256(q[0]), q[1], 1);
    let hi = _mm256_inserti128_si256(_mm256_castsi128_si256(q[2]), q[3], 1);
    _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)
}

/// The even bytes of `row` to `plane[even..]`, the odd ones to `plane[odd..]`, 64 at a time
/// (shuffled within 128-bit lanes, then the lanes' halves gathered; the last block's stores
/// masked to the row).
///
/// # Safety
/// AVX-512F, BW and VL; `row` may be read up to 63 bytes past its end (the caller's slack);
/// the plane has `row.len().div_ceil(2)` bytes at `even` and `row.len() / 2` at `odd`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn split_pairs(row: &[u8], plane: &mut [u8], even: usize, odd: usize) {
    use std::arch::x86_64::*;
    let lane = _mm512_broadcast_i32x4(_mm_setr_epi8(
        0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
    ));
    let (evens, odds) = (
        _mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7),
        _mm512_setr_epi64(1, 3, 5, 7, 0, 2, 4, 6),
    );
    let (n_even, n_odd) = (row.len().div_ceil(2), row.len() / 2);
    let mask = |left: usize| -> u32 {
        match left {
            0 => 0,
            1..32 => (1u32 << left) - 1,
            _ => u32::MAX,
        }
    };
    for b in 0..row.len().div_ceil(64) {
        // SAFETY: the block's 64 bytes lie in `row` and its slack; the stores are masked to
        // the phases' bytes.
        unsafe {
            let v = _mm512_shuffle_epi8(_mm512_loadu_si512(row.as_ptr().add(64 * b).cast()), lane);
            let e = _mm512_castsi512_si256(_mm512_permutexvar_epi64(evens, v));
            let o = _mm512_castsi512_si256(_mm512_permutexvar_epi64(odds, v));
            let p = plane.as_mut_ptr();
            _mm256_mask_storeu_epi8(p.add(even + 32 * b).cast(), mask(n_even - 32 * b), e);
            _mm256_mask_storeu_epi8(
                p.add(odd + 32 * b).cast(),
                mask(n_odd.saturating_sub(32 * b)),
                o,
            );
        }
    }
}

//! Small AVX2 pieces several kernels share: an 8x8 transpose of floats in registers and a
//! mask of the first lanes of a vector.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

/// Transposes eight vectors of eight floats in registers: lane `j` of `v[i]` becomes lane `i`
/// of `v[j]`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
pub(crate) fn transpose(v: &mut [__m256; 8]) {
    let lo = |a, b| _mm256_unpacklo_ps(a, b);
    let hi = |a, b| _mm256_unpackhi_ps(a, b);
    // Pairs interleaved: t[0] = a0 b0 a1 b1 | a4 b4 a5 b5, t[1] = a2 b2 a3 b3 | a6 b6 a7 b7...
    let t = [
        lo(v[0], v[1]),
        hi(v[0], v[1]),
        lo(v[2], v[3]),
        hi(v[2], v[3]),
        lo(v[4], v[5]),
        hi(v[4], v[5]),
        lo(v[6], v[7]),
        hi(v[6], v[7]),
    ];
    // Quads: q[0] = a0 b0 c0 d0 | a4 b4 c4 d4, q[1] = a1 b1 c1 d1 | a5 ..., and the same of
    // e..h in q[4..8].
    let q = [
        _mm256_shuffle_ps::<0x44>(t[0], t[2]),
        _mm256_shuffle_ps::<0xEE>(t[0], t[2]),
        _mm256_shuffle_ps::<0x44>(t[1], t[3]),
        _mm256_shuffle_ps::<0xEE>(t[1], t[3]),
        _mm256_shuffle_ps::<0x44>(t[4], t[6]),
        _mm256_shuffle_ps::<0xEE>(t[4], t[6]),
        _mm256_shuffle_ps::<0x44>(t[5], t[7]),
        _mm256_shuffle_ps::<0xEE>(t[5], t[7]),
    ];
    for j in 0..4 {
        v[j] = _mm256_permute2f128_ps::<0x20>(q[j], q[j + 4]);
        v[j + 4] = _mm256_permute2f128_ps::<0x31>(q[j], q[j + 4]);
    }
}

/// A mask of the first `n` of eight lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(crate) fn first(n: usize) -> __m256i {
    let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), lane)
}

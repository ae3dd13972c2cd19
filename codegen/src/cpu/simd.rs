//! Small AVX2 pieces several kernels share: an 8x8 transpose of floats in registers, a mask
//! of the first lanes of a vector, `exp`, `sigmoid`, `erf` and `gelu` for epilogues applied in
//! registers, dot products and `axpy` for row vectors, and the maximum that pooling takes.

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

/// Two eight-lane vectors as one of sixteen lanes, `lo` in lanes 0..8 (a pair of channel
/// blocks, or two vectors an epilogue runs at once).
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn join(lo: __m256, hi: __m256) -> __m512 {
    let lo = _mm512_castpd256_pd512(_mm256_castps_pd(lo));
    _mm512_castpd_ps(_mm512_insertf64x4::<1>(lo, _mm256_castps_pd(hi)))
}

/// Lanes 8..16 of `v` (lanes 0..8 are `_mm512_castps512_ps256(v)`): [`join`] undone.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn high(v: __m512) -> __m256 {
    _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)))
}

/// A mask of the first `n` of eight lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(crate) fn first(n: usize) -> __m256i {
    let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), lane)
}

/// `1 / (1 + e^-x)` on eight lanes, as [`crate::kernel::math::sigmoid`] computes it, step
/// for step.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) fn sigmoid(x: __m256) -> __m256 {
    use crate::kernel::math::{EXP_LN2, EXP_POLY, ROUND_MAGIC, SIGMOID_CLAMP};
    let set = _mm256_set1_ps;
    // The clamp: `maxps(lo, x)` is `lo > x ? lo : x`, the kernel layer's `x < lo ? lo : x`
    // (NaN passes through), and `minps(hi, x)` likewise.
    let x = _mm256_min_ps(set(SIGMOID_CLAMP.1), _mm256_max_ps(set(SIGMOID_CLAMP.0), x));
    let nm = _mm256_fmadd_ps(x, set(-std::f32::consts::LOG2_E), set(ROUND_MAGIC));
    let n = _mm256_sub_ps(nm, set(ROUND_MAGIC));
    // -(n ln2) - x: the kernel layer's `n (-ln2) + (-x)`, the same bits.
    let r = _mm256_fnmsub_ps(n, set(EXP_LN2.0), x);
    let r = _mm256_fmadd_ps(n, set(-EXP_LN2.1), r);
    let p = horner(r, &EXP_POLY);
    let y = _mm256_fmadd_ps(_mm256_mul_ps(r, r), p, r);
    let e = _mm256_add_epi32(_mm256_castps_si256(nm), _mm256_set1_epi32(127));
    let s = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(e));
    let one = set(1.0);
    _mm256_div_ps(one, _mm256_add_ps(one, _mm256_fmadd_ps(y, s, s)))
}

/// [`sigmoid`] on sixteen lanes, step for step (so the same bits in every lane), for the
/// 512-bit kernels' epilogues.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn sigmoid512(x: __m512) -> __m512 {
    use crate::kernel::math::{EXP_LN2, EXP_POLY, ROUND_MAGIC, SIGMOID_CLAMP};
    let set = _mm512_set1_ps;
    let x = _mm512_min_ps(set(SIGMOID_CLAMP.1), _mm512_max_ps(set(SIGMOID_CLAMP.0), x));
    let nm = _mm512_fmadd_ps(x, set(-std::f32::consts::LOG2_E), set(ROUND_MAGIC));
    let n = _mm512_sub_ps(nm, set(ROUND_MAGIC));
    let r = _mm512_fnmsub_ps(n, set(EXP_LN2.0), x);
    let r = _mm512_fmadd_ps(n, set(-EXP_LN2.1), r);
    let mut p = set(EXP_POLY[0]);
    for &k in &EXP_POLY[1..] {
        p = _mm512_fmadd_ps(p, r, set(k));
    }
    let y = _mm512_fmadd_ps(_mm512_mul_ps(r, r), p, r);
    let e = _mm512_add_epi32(_mm512_castps_si512(nm), _mm512_set1_epi32(127));
    let s = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(e));
    let one = set(1.0);
    _mm512_div_ps(one, _mm512_add_ps(one, _mm512_fmadd_ps(y, s, s)))
}

/// `erf(x)` on eight lanes, as [`crate::kernel::math::erf`] computes it: `x p(x²) / q(x²)` on
/// `x` clamped to ±4.
#[target_feature(enable = "avx2,fma")]
pub(crate) fn erf(x: __m256) -> __m256 {
    use crate::kernel::math::{ERF_LIM, ERF_P, ERF_Q};
    let x = _mm256_max_ps(_mm256_set1_ps(-ERF_LIM), x);
    let x = _mm256_min_ps(_mm256_set1_ps(ERF_LIM), x);
    let x2 = _mm256_mul_ps(x, x);
    let p = _mm256_mul_ps(x, horner(x2, &ERF_P));
    _mm256_div_ps(p, horner(x2, &ERF_Q))
}

/// `erf(x)` on sixteen lanes, step for step as [`erf`] (so the same bits in every lane).
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn erf512(x: __m512) -> __m512 {
    use crate::kernel::math::{ERF_LIM, ERF_P, ERF_Q};
    let horner = |x: __m512, c: &[f32]| {
        let mut p = _mm512_set1_ps(c[0]);
        for &k in &c[1..] {
            p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(k));
        }
        p
    };
    let x = _mm512_max_ps(_mm512_set1_ps(-ERF_LIM), x);
    let x = _mm512_min_ps(_mm512_set1_ps(ERF_LIM), x);
    let x2 = _mm512_mul_ps(x, x);
    let p = _mm512_mul_ps(x, horner(x2, &ERF_P));
    _mm512_div_ps(p, horner(x2, &ERF_Q))
}

/// Inputs of GELU beyond which `x / √2` lies past [`erf`]'s clamp (`8 / √2 > 4`): clamping
/// `x` to this first changes no result of GELU, and keeps [`gelu_arg`]'s multiply-adds finite.
const GELU_ARG_CLAMP: f32 = 8.0;

/// `1 / √2` rounded, for [`gelu_arg`].
const RECIP_SQRT_2: f32 = 1.0 / std::f32::consts::SQRT_2;

/// GELU's `erf` argument `x / div` on eight lanes, as the compiled loop's division rounds it
/// wherever that can change GELU: where `div` is `√2` (the constant PyTorch exports) by a
/// product and two multiply-adds, `q = x / √2` rounded to nearest for every `|x| < 8` whose
/// quotient is normal (`x·r`, then the exact residual `x - q√2`, then `q + residual·r`; a
/// test checks every significand), `x` clamped to ±8 first (past erf's clamp either way), and a
/// quotient below the normals is too small to change `1 + erf`. A division's throughput is the
/// bound of GELU's vectors, two of them each; any other divisor divides.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) fn gelu_arg(x: __m256, div: f32) -> __m256 {
    if div != std::f32::consts::SQRT_2 {
        return _mm256_div_ps(x, _mm256_set1_ps(div));
    }
    let x = _mm256_max_ps(_mm256_set1_ps(-GELU_ARG_CLAMP), x);
    let x = _mm256_min_ps(_mm256_set1_ps(GELU_ARG_CLAMP), x);
    let q = _mm256_mul_ps(x, _mm256_set1_ps(RECIP_SQRT_2));
    let e = _mm256_fnmadd_ps(q, _mm256_set1_ps(std::f32::consts::SQRT_2), x);
    _mm256_fmadd_ps(e, _mm256_set1_ps(RECIP_SQRT_2), q)
}

/// [`gelu_arg`] on sixteen lanes, step for step.
#[target_feature(enable = "avx512f")]
#[inline]
fn gelu_arg512(x: __m512, div: f32) -> __m512 {
    if div != std::f32::consts::SQRT_2 {
        return _mm512_div_ps(x, _mm512_set1_ps(div));
    }
    let x = _mm512_max_ps(_mm512_set1_ps(-GELU_ARG_CLAMP), x);
    let x = _mm512_min_ps(_mm512_set1_ps(GELU_ARG_CLAMP), x);
    let q = _mm512_mul_ps(x, _mm512_set1_ps(RECIP_SQRT_2));
    let e = _mm512_fnmadd_ps(q, _mm512_set1_ps(std::f32::consts::SQRT_2), x);
    _mm512_fmadd_ps(e, _mm512_set1_ps(RECIP_SQRT_2), q)
}

/// GELU as PyTorch exports it, `(x (erf(x / div) + one)) half`, on eight lanes: the compiled
/// loop's steps and bits ([`gelu_arg`]).
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) fn gelu_erf(x: __m256, div: f32, one: f32, half: f32) -> __m256 {
    let e = erf(gelu_arg(x, div));
    let m = _mm256_mul_ps(x, _mm256_add_ps(e, _mm256_set1_ps(one)));
    _mm256_mul_ps(m, _mm256_set1_ps(half))
}

/// [`gelu_erf`] on sixteen lanes, step for step.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn gelu_erf512(x: __m512, div: f32, one: f32, half: f32) -> __m512 {
    let e = erf512(gelu_arg512(x, div));
    let m = _mm512_mul_ps(x, _mm512_add_ps(e, _mm512_set1_ps(one)));
    _mm512_mul_ps(m, _mm512_set1_ps(half))
}

/// `gelu(x) = x Φ(x)` on eight lanes, as [`crate::kernel::math::gelu`] computes it.
#[target_feature(enable = "avx2,fma")]
pub(crate) fn gelu(x: __m256) -> __m256 {
    use crate::kernel::math::{EXP_CLAMP, GELU_P};
    let one = _mm256_set1_ps(1.0);
    let half = _mm256_set1_ps(0.5);
    let a = _mm256_andnot_ps(_mm256_set1_ps(-0.0), x);
    let z = _mm256_mul_ps(a, _mm256_set1_ps(std::f32::consts::FRAC_1_SQRT_2));
    let t = _mm256_div_ps(one, _mm256_fmadd_ps(z, half, one));
    let arg = _mm256_sub_ps(horner(t, &GELU_P), _mm256_mul_ps(z, z));
    let e = exp_clamped(arg, EXP_CLAMP);
    let small = _mm256_mul_ps(_mm256_mul_ps(t, half), e);
    let large = _mm256_sub_ps(one, small);
    let negative = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_setzero_ps());
    _mm256_mul_ps(x, _mm256_blendv_ps(large, small, negative))
}

/// `e^x` on eight lanes, as [`crate::kernel::math::exp`] computes it.
#[target_feature(enable = "avx2,fma")]
pub(crate) fn exp(x: __m256) -> __m256 {
    exp_clamped(x, crate::kernel::math::EXP_CLAMP)
}

/// The polynomial with coefficients `c` (highest degree first) at `x` by Horner's rule, a
/// multiply-add per step, as the kernel layer's `horner`.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn horner(x: __m256, c: &[f32]) -> __m256 {
    let mut p = _mm256_set1_ps(c[0]);
    for &k in &c[1..] {
        p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(k));
    }
    p
}

/// The kernel layer's `exp_clamped` on eight lanes, step for step (the same clamp, constants,
/// rounding and multiply-adds), so that an epilogue applied in a kernel's registers gives the
/// compiled elementwise kernels' bits (checked by a test below): `e^x` for `x` clamped to
/// `clamp`, scaled by `2^n` in two factors.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn exp_clamped(x: __m256, clamp: (f32, f32)) -> __m256 {
    use crate::kernel::math::{EXP_LN2, EXP_POLY};
    // The clamp: `maxps(lo, x)` is `lo > x ? lo : x`, the kernel layer's `x < lo ? lo : x`
    // (NaN passes through), and `minps(hi, x)` likewise.
    let x = _mm256_max_ps(_mm256_set1_ps(clamp.0), x);
    let x = _mm256_min_ps(_mm256_set1_ps(clamp.1), x);
    let t = _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E));
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(t);
    let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-EXP_LN2.0), x);
    let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-EXP_LN2.1), r);
    let p = horner(r, &EXP_POLY);
    let y = _mm256_fmadd_ps(_mm256_mul_ps(r, r), p, r);
    let y = _mm256_add_ps(y, _mm256_set1_ps(1.0));
    let ni = _mm256_cvttps_epi32(n);
    let bias = _mm256_set1_epi32(127);
    let scale =
        |e: __m256i| _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(e, bias)));
    // 2^n as 2^(n>>1) * 2^(n - (n>>1)).
    let n1 = _mm256_srai_epi32::<1>(ni);
    let n2 = _mm256_sub_epi32(ni, n1);
    _mm256_mul_ps(_mm256_mul_ps(y, scale(n1)), scale(n2))
}

/// The dot product of `x` and `y` (the same length) in four vectors of partial sums.
#[target_feature(enable = "avx2,fma")]
pub(crate) fn dot(x: &[f32], y: &[f32]) -> f32 {
    debug_assert_eq!(x.len(), y.len());
    let n = x.len().min(y.len());
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    // SAFETY (loads): every index is below n, the length of both slices.
    while i + 32 <= n {
        for (j, a) in acc.iter_mut().enumerate() {
            let (u, v) = unsafe {
                (
                    _mm256_loadu_ps(x.as_ptr().add(i + 8 * j)),
                    _mm256_loadu_ps(y.as_ptr().add(i + 8 * j)),
                )
            };
            *a = _mm256_fmadd_ps(u, v, *a);
        }
        i += 32;
    }
    while i + 8 <= n {
        let (u, v) = unsafe {
            (
                _mm256_loadu_ps(x.as_ptr().add(i)),
                _mm256_loadu_ps(y.as_ptr().add(i)),
            )
        };
        acc[0] = _mm256_fmadd_ps(u, v, acc[0]);
        i += 8;
    }
    let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let mut lanes = [0f32; 8];
    // SAFETY: `lanes` holds eight floats.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), s) };
    lanes.iter().sum::<f32>()
        + x[i..n]
            .iter()
            .zip(&y[i..n])
            .map(|(a, b)| a * b)
            .sum::<f32>()
}

/// `y += a * x` (the same length).
#[target_feature(enable = "avx2,fma")]
pub(crate) fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    let n = x.len().min(y.len());
    let av = _mm256_set1_ps(a);
    let mut i = 0;
    // SAFETY (loads and stores): every index is below n, the length of both slices.
    while i + 8 <= n {
        unsafe {
            let v = _mm256_fmadd_ps(
                av,
                _mm256_loadu_ps(x.as_ptr().add(i)),
                _mm256_loadu_ps(y.as_ptr().add(i)),
            );
            _mm256_storeu_ps(y.as_mut_ptr().add(i), v);
        }
        i += 8;
    }
    for (y, &x) in y[i..n].iter_mut().zip(&x[i..n]) {
        *y = a.mul_add(x, *y);
    }
}

/// `y += a[0] * r[0] + .. + a[3] * r[3]` (rows of `y`'s length): one pass over `y` for four
/// rows of a matrix-vector product, so the product streams the matrix instead of waiting on
/// `y`'s loads and stores.
#[target_feature(enable = "avx2,fma")]
pub(crate) fn axpy4(a: [f32; 4], r: [&[f32]; 4], y: &mut [f32]) {
    let n = y.len();
    assert!(r.iter().all(|r| r.len() == n), "axpy4: rows of y's length");
    let av = a.map(|a| _mm256_set1_ps(a));
    let mut i = 0;
    // SAFETY (loads and stores): every index is below n, the length of every slice.
    while i + 8 <= n {
        unsafe {
            let mut v = _mm256_loadu_ps(y.as_ptr().add(i));
            for (av, r) in av.iter().zip(&r) {
                v = _mm256_fmadd_ps(*av, _mm256_loadu_ps(r.as_ptr().add(i)), v);
            }
            _mm256_storeu_ps(y.as_mut_ptr().add(i), v);
        }
        i += 8;
    }
    for j in i..n {
        y[j] = a[3].mul_add(
            r[3][j],
            a[2].mul_add(r[2][j], a[1].mul_add(r[1][j], a[0].mul_add(r[0][j], y[j]))),
        );
    }
}

/// The maximum of `m` and `v` per lane, NaN winning (as `max_pool2d` takes it).
#[target_feature(enable = "avx2")]
pub(crate) fn max_nan(m: __m256, v: __m256) -> __m256 {
    let take = _mm256_or_ps(
        _mm256_cmp_ps::<_CMP_GT_OQ>(v, m),
        _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v),
    );
    _mm256_blendv_ps(m, v, take)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `x / √2` as [`gelu_arg`] computes it (a product and two multiply-adds) is the rounded
    /// quotient for every significand of `x` (both binades of the quotient), so for every
    /// normal `x` whose quotient is normal.
    #[test]
    fn gelu_arg_divides_by_sqrt_2_exactly() {
        let c = std::f32::consts::SQRT_2;
        for bits in (127u32 << 23)..(129 << 23) {
            let x = f32::from_bits(bits);
            let q = x * RECIP_SQRT_2;
            let e = (-q).mul_add(c, x);
            let got = e.mul_add(RECIP_SQRT_2, q);
            assert_eq!(got.to_bits(), (x / c).to_bits(), "{x} / √2");
        }
    }

    /// The compiled elementwise kernels and these give the same bits, over the whole range
    /// and at the edges (overflow, underflow through the subnormals, NaN, infinities).
    #[test]
    fn transcendentals_match_the_compiled_kernels_bit_for_bit() {
        let host = crate::cpu::Features::of(None).unwrap();
        assert!(
            host.avx2 && host.fma,
            "these kernels need AVX2 and FMA, which every machine this project runs on has"
        );
        let mut xs: Vec<f32> = (0..200_000).map(|i| -120.0 + i as f32 * 0.0012).collect();
        xs.extend([
            0.0,
            -0.0,
            88.7,
            88.8,
            -103.9,
            -104.5,
            87.9,
            88.1,
            -87.9,
            -88.1,
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
        ]);
        xs.resize(xs.len().next_multiple_of(16), 1.0);
        let n = xs.len();
        if host.avx512f {
            for chunk in xs.chunks_exact(16) {
                let (mut narrow, mut wide) = ([0f32; 16], [0f32; 16]);
                // SAFETY: the host has AVX-512F, AVX2 and FMA; each array holds 16 floats.
                unsafe {
                    for h in 0..2 {
                        let v = sigmoid(_mm256_loadu_ps(chunk[8 * h..].as_ptr()));
                        _mm256_storeu_ps(narrow[8 * h..].as_mut_ptr(), v);
                    }
                    _mm512_storeu_ps(
                        wide.as_mut_ptr(),
                        sigmoid512(_mm512_loadu_ps(chunk.as_ptr())),
                    );
                }
                for ((a, b), x) in narrow.iter().zip(&wide).zip(chunk) {
                    assert!(
                        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                        "sigmoid({x}): {a} on 8 lanes, {b} on 16"
                    );
                }
            }
        }
        // GELU as PyTorch exports it (`div` by √2, which takes the multiply-adds, and by 1.5),
        // on eight and sixteen lanes against the compiled chain.
        for div in [std::f32::consts::SQRT_2, 1.5] {
            let src = format!(
                "func @f(%x: f32[{n}]) -> (f32[{n}]) {{
  %c = const {{value=[{div:?}]}} : f32[]
  %d = div %x, %c : f32[{n}]
  %e = erf %d : f32[{n}]
  %one = const {{value=[1.0]}} : f32[]
  %a = add %e, %one : f32[{n}]
  %m = mul %x, %a : f32[{n}]
  %half = const {{value=[0.5]}} : f32[]
  %y = mul %m, %half : f32[{n}]
  return %y
}}"
            );
            let func = tcc_ir::parse_function(&src).unwrap();
            let exe = crate::cpu::Executable::compile(&func).unwrap();
            let x = tcc_ir::Tensor::from_f32(&[n as u64], xs.clone()).unwrap();
            let want = exe.run(&[x]).unwrap().remove(0);
            let want = want.as_f32().unwrap();
            for (i, chunk) in xs.chunks_exact(16).enumerate() {
                let (mut narrow, mut wide) = ([0f32; 16], [0f32; 16]);
                // SAFETY: the host has AVX2 and FMA (and AVX-512F for the wide half); each
                // array holds 16 floats.
                unsafe {
                    for h in 0..2 {
                        let v = gelu_erf(_mm256_loadu_ps(chunk[8 * h..].as_ptr()), div, 1.0, 0.5);
                        _mm256_storeu_ps(narrow[8 * h..].as_mut_ptr(), v);
                    }
                    if host.avx512f {
                        let v = gelu_erf512(_mm512_loadu_ps(chunk.as_ptr()), div, 1.0, 0.5);
                        _mm512_storeu_ps(wide.as_mut_ptr(), v);
                    }
                }
                for j in 0..16 {
                    let (w, x) = (want[i * 16 + j], chunk[j]);
                    let lanes = if host.avx512f {
                        &[narrow, wide][..]
                    } else {
                        &[narrow][..]
                    };
                    for g in lanes.iter().map(|l| l[j]) {
                        assert!(
                            g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                            "gelu (erf, x / {div}) of {x}: {g} vs compiled {w}"
                        );
                    }
                }
            }
        }
        for (op, f) in [
            ("exp", exp as unsafe fn(__m256) -> __m256),
            ("sigmoid", sigmoid),
            ("erf", erf),
            ("gelu", gelu),
        ] {
            let src = format!(
                "func @f(%x: f32[{n}]) -> (f32[{n}]) {{\n  %y = {op} %x : f32[{n}]\n  return %y\n}}"
            );
            let func = tcc_ir::parse_function(&src).unwrap();
            let exe = crate::cpu::Executable::compile(&func).unwrap();
            let x = tcc_ir::Tensor::from_f32(&[n as u64], xs.clone()).unwrap();
            let want = exe.run(&[x]).unwrap().remove(0);
            let want = want.as_f32().unwrap();
            for (i, chunk) in xs.chunks_exact(8).enumerate() {
                let mut got = [0f32; 8];
                // SAFETY: the host has AVX2 and FMA; `chunk` and `got` hold eight floats.
                unsafe {
                    let v = f(_mm256_loadu_ps(chunk.as_ptr()));
                    _mm256_storeu_ps(got.as_mut_ptr(), v);
                }
                for (j, g) in got.iter().enumerate() {
                    let w = want[i * 8 + j];
                    assert!(
                        g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                        "{op}({}): {g} vs compiled {w}",
                        chunk[j]
                    );
                }
            }
        }
    }
}

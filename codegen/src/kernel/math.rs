//! The transcendental functions as kernel-body nodes, written once for every backend:
//! polynomial and rational approximations with range reduction, in `f32`.
//! `cpu/accuracy.rs` and the accuracy tests measure their error (docs/perf.md).
//!
//! Coefficients are `f32` values widened exactly to the body's `f64` constants, so a backend
//! that rounds them back to `f32` gets the very bits written here.

use super::expr::{Body, Cmp, E, IBin, Lane, Un};

fn coeffs(b: &mut Body, x: E, c: &[f32]) -> E {
    let c: Vec<f64> = c.iter().map(|&k| k as f64).collect();
    b.horner(x, &c)
}

fn c32(b: &mut Body, x: f32) -> E {
    b.c(x as f64)
}

/// `exp`'s constants: the input's clamp, `ln 2` in two parts (high, low), and the
/// polynomial's coefficients, highest degree first. Hand-written kernels that apply `exp` in
/// their registers (`cpu/simd.rs`) use the same ones, step for step.
pub const EXP_CLAMP: (f32, f32) = (-104.0, 89.0);
/// The clamp of `x` (and so of `-x`) inside `sigmoid`: the rounded `n` stays within [-127, 127], so one
/// factor of `2^n` scales it (at -127 that factor's bits are 0 rather than the subnormal
/// `2^-127`, which changes only an `e^-x` too small to change `1 + e^-x`). `sigmoid` is 1 in
/// f32 above 17, and below -88 it would be subnormal.
pub const SIGMOID_CLAMP: (f32, f32) = (-88.0, 88.0);
/// See [`EXP_CLAMP`].
pub const EXP_LN2: (f32, f32) = (0.693_359_4, -2.121_944_4e-4);
/// See [`EXP_CLAMP`].
pub const EXP_POLY: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    0.5,
];

/// `e^x` (Cephes' `expf`): range reduction by `ln 2` (a two-part constant, each part a
/// multiply-add), a degree-6 polynomial, and scaling by `2^n` split in two factors so that
/// results overflow to `inf` and underflow through the subnormals as they should.
pub fn exp(b: &mut Body, x: E) -> E {
    exp_clamped(b, x, EXP_CLAMP)
}

/// Added to a float within ±2^22 (in one multiply-add with the product that makes it), rounds
/// it to the nearest integer (ties to even): the sum's ulp is 1. The sum's low bits are then
/// that integer, offset by the constant's own.
pub const ROUND_MAGIC: f32 = 12_582_912.0;

/// `1 / (1 + e^-x)`, `x` clamped to [`SIGMOID_CLAMP`]: `e^-x` by [`exp`]'s range reduction and
/// polynomial in fewer steps. `n = round(-x log2 e)` comes from one multiply-add with
/// [`ROUND_MAGIC`] (rounding the exact product), whose bits also give `2^n`'s exponent without
/// a conversion; the polynomial's `y` (`e^r - 1`) is scaled as `y 2^n + 2^n` in one more
/// (one rounding instead of two). Kernels that apply it in registers (`cpu/simd.rs`) take the
/// same steps.
pub fn sigmoid(b: &mut Body, x: E) -> E {
    debug_assert_eq!(b.lane, Lane::F32);
    let x = b.clamp(x, SIGMOID_CLAMP.0 as f64, SIGMOID_CLAMP.1 as f64);
    let nx = b.un(Un::Neg, x);
    let k = c32(b, -std::f32::consts::LOG2_E);
    let magic = c32(b, ROUND_MAGIC);
    let nm = b.mul_add(x, k, magic);
    let n = b.sub(nm, magic);
    let y = expm1_reduced(b, nx, n);
    // n + 127 in the exponent's place: the magic constant's own bits shift out (its low nine
    // are zero), and n within [-127, 127] gives a biased exponent in [0, 254] (0 at -127: a
    // zero factor, see SIGMOID_CLAMP).
    let bits = b.bits(nm);
    let bias = b.ic(127);
    let e = b.ibin(IBin::Add, bits, bias);
    let e = b.shl(e, 23);
    let s = b.from_bits(e);
    let e = b.mul_add(y, s, s);
    let one = b.c(1.0);
    let d = b.add(one, e);
    b.div(one, d)
}

/// `e^r - 1` for `r = x - n ln 2` (`n` the rounded `x log2 e`): the reduction by the two-part
/// `ln 2`, a multiply-add each, and [`EXP_POLY`] as `r + r² p(r)`; [`exp`] and [`sigmoid`]
/// share it.
fn expm1_reduced(b: &mut Body, x: E, n: E) -> E {
    let c1 = c32(b, -EXP_LN2.0);
    let c2 = c32(b, -EXP_LN2.1);
    let r = b.mul_add(n, c1, x);
    let r = b.mul_add(n, c2, r);
    let p = coeffs(b, r, &EXP_POLY);
    let rr = b.mul(r, r);
    b.mul_add(rr, p, r)
}

/// `e^x` for `x` clamped to `clamp`, scaled by `2^n` in two factors.
fn exp_clamped(b: &mut Body, x: E, clamp: (f32, f32)) -> E {
    debug_assert_eq!(b.lane, Lane::F32);
    let x = b.clamp(x, clamp.0 as f64, clamp.1 as f64);
    let log2e = c32(b, std::f32::consts::LOG2_E);
    let t = b.mul(x, log2e);
    let n = b.un(Un::Nearest, t);
    let y = expm1_reduced(b, x, n);
    let one = b.c(1.0);
    let y = b.add(y, one);
    // n is integral and within [-150, 129], so truncation is exact (for NaN the scales are
    // garbage, but y is NaN and so is the product).
    let ni = b.to_int(n);
    let bias = b.ic(127);
    let scale = |b: &mut Body, e: E| {
        let e = b.ibin(IBin::Add, e, bias);
        let e = b.shl(e, 23);
        b.from_bits(e)
    };
    // 2^n as 2^(n>>1) * 2^(n - (n>>1)): each factor's exponent stays in the normal range.
    let n1 = b.sshr(ni, 1);
    let n2 = b.ibin(IBin::Sub, ni, n1);
    let mut out = y;
    for e in [n1, n2] {
        let s = scale(b, e);
        out = b.mul(out, s);
    }
    out
}

/// Natural logarithm (Cephes' `logf`): x = m 2^e with m in [sqrt(1/2), sqrt(2)), a degree-8
/// polynomial in m - 1, and the two-part ln 2. Subnormals are scaled first; 0 gives -inf,
/// negatives and NaN give NaN, inf gives inf.
pub fn log(b: &mut Body, x0: E) -> E {
    debug_assert_eq!(b.lane, Lane::F32);
    let tiny = c32(b, f32::MIN_POSITIVE);
    let scale = b.c(8_388_608.0);
    let scaled = b.mul(x0, scale);
    let x = b.select_if(Cmp::Lt, x0, tiny, scaled, x0);
    let zero = b.c(0.0);
    let m23 = b.c(-23.0);
    let e_adj = b.select_if(Cmp::Lt, x0, tiny, m23, zero);
    let bits = b.bits(x);
    let e_bits = b.ushr(bits, 23);
    let c127 = b.ic(127);
    let e_i = b.ibin(IBin::Sub, e_bits, c127);
    let e = b.to_num(e_i);
    let e = b.add(e, e_adj);
    let mant_mask = b.ic(0x007f_ffff);
    let one_bits = b.ic(0x3f80_0000);
    let m_bits = b.ibin(IBin::And, bits, mant_mask);
    let m_bits = b.ibin(IBin::Or, m_bits, one_bits);
    let m1 = b.from_bits(m_bits); // in [1, 2)
    // Into [sqrt(1/2), sqrt(2)): above sqrt 2, halve m and add one to e.
    let sqrt2 = c32(b, std::f32::consts::SQRT_2);
    let half = b.c(0.5);
    let one = b.c(1.0);
    let m_half = b.mul(m1, half);
    let e_plus = b.add(e, one);
    let m = b.select_if(Cmp::Lt, sqrt2, m1, m_half, m1);
    let e = b.select_if(Cmp::Lt, sqrt2, m1, e_plus, e);
    let f = b.sub(m, one);
    let z = b.mul(f, f);
    let p = coeffs(
        b,
        f,
        &[
            7.037_683_6e-2,
            -1.151_461e-1,
            1.167_699_9e-1,
            -1.242_014_1e-1,
            1.424_932_3e-1,
            -1.666_805_8e-1,
            2.000_071_4e-1,
            -2.499_999_4e-1,
            3.333_333e-1,
        ],
    );
    let fz = b.mul(f, z);
    let y = b.mul(fz, p);
    let c2 = c32(b, -2.121_944_4e-4);
    let y = b.mul_add(e, c2, y);
    let mhalf = b.c(-0.5);
    let y = b.mul_add(z, mhalf, y);
    let r = b.add(f, y);
    let c1 = c32(b, 0.693_359_4);
    let r = b.mul_add(e, c1, r);
    let ninf = b.c(f64::NEG_INFINITY);
    let nan = b.c(f64::NAN);
    let inf = b.c(f64::INFINITY);
    let r = b.select_if(Cmp::Eq, x0, zero, ninf, r);
    let r = b.select_if(Cmp::Lt, x0, zero, nan, r);
    let r = b.select_if(Cmp::Eq, x0, inf, inf, r);
    b.select_if(Cmp::Unordered, x0, x0, x0, r)
}

/// `x p(x²) / q(x²)` on `x` clamped to `±lim`: an odd rational function, as erf and tanh are
/// approximated (one division, no branches).
fn odd_rational(b: &mut Body, x: E, lim: f32, p: &[f32], q: &[f32]) -> E {
    debug_assert_eq!(b.lane, Lane::F32);
    let x = b.clamp(x, -lim as f64, lim as f64);
    let x2 = b.mul(x, x);
    let p = coeffs(b, x2, p);
    let p = b.mul(x, p);
    let q = coeffs(b, x2, q);
    b.div(p, q)
}

/// `erf`'s constants: the input's clamp and the numerator's and denominator's coefficients
/// (polynomials in `x²`, highest degree first). `cpu/simd.rs` applies `erf` in registers with
/// the same ones, step for step.
pub const ERF_LIM: f32 = 4.0;
/// See [`ERF_LIM`].
pub const ERF_P: [f32; 7] = [
    -2.726_142_3e-10,
    2.770_681_4e-8,
    -2.101_024e-6,
    -5.692_506_4e-5,
    -7.349_906_3e-4,
    -2.954_6e-3,
    -1.609_603_3e-2,
];
/// See [`ERF_LIM`].
pub const ERF_Q: [f32; 5] = [
    -1.456_607_2e-5,
    -2.133_740_6e-4,
    -1.682_827e-3,
    -7.373_329e-3,
    -1.426_474e-2,
];

/// `x^y` as `e^(y·ln|x|)` from [`exp`] and [`log`], with the signs and special cases of C's
/// `powf`: a negative base takes the sign of an odd integer exponent and gives NaN for one
/// that is not an integer (`-0` and `-inf` keep their sign for odd integers only), `x^0 = 1`
/// and `1^y = 1` even for NaN, and `(-1)^±inf = 1`. Its error grows with `|y·ln x|` (the
/// rounding of the product is magnified by `e^`): a few ulp where that is below 10. The GPU
/// backend's `pow` for exponents the CPU leaves to its reference kernels.
pub fn pow(b: &mut Body, x: E, y: E) -> E {
    debug_assert_eq!(b.lane, Lane::F32);
    let ax = b.un(Un::Abs, x);
    let l = log(b, ax);
    let t = b.mul(y, l);
    let r = exp(b, t);
    let nr = b.un(Un::Neg, r);
    // Integer and odd exponents.
    let yi = b.un(Un::Nearest, y);
    let is_int = b.cmp(Cmp::Eq, yi, y);
    let half = b.c(0.5);
    let h = b.mul(y, half);
    let hi = b.un(Un::Nearest, h);
    let even = b.cmp(Cmp::Eq, hi, h);
    let odd_r = b.select(even, r, nr);
    let int_r = b.select(is_int, odd_r, r);
    let nan = b.c(f64::NAN);
    let neg_r = b.select(is_int, odd_r, nan);
    // A finite x < 0: the sign of an odd integer exponent, NaN for other exponents; -0 and
    // -inf: the sign of an odd integer exponent only.
    let zero = b.c(0.0);
    let inf = b.c(f64::INFINITY);
    let xb = b.bits(x);
    let izero = b.ic(0);
    let signed = b.icmp(Cmp::Lt, xb, izero);
    let signed_r = b.select(signed, int_r, r);
    let finite = b.cmp(Cmp::Lt, ax, inf);
    let negative = b.select(finite, neg_r, signed_r);
    let r = b.select_if(Cmp::Lt, x, zero, negative, signed_r);
    // 1 where y is 0, x is 1, or |x| is 1 and y infinite.
    let one = b.c(1.0);
    let r = b.select_if(Cmp::Eq, y, zero, one, r);
    let r = b.select_if(Cmp::Eq, x, one, one, r);
    let ay = b.un(Un::Abs, y);
    let y_inf = b.cmp(Cmp::Eq, ay, inf);
    let r1 = b.select_if(Cmp::Eq, ax, one, one, r);
    b.select(y_inf, r1, r)
}

/// The error function: a rational function, odd degree 13 over even degree 8, on the input
/// clamped to +-4 (beyond which erf rounds to +-1 in f32).
pub fn erf(b: &mut Body, x: E) -> E {
    odd_rational(b, x, ERF_LIM, &ERF_P, &ERF_Q)
}

/// The coefficients of `gelu`'s `erfc` fit (a polynomial in `t`, highest degree first), shared
/// with `cpu/simd.rs` as [`ERF_P`] is.
pub const GELU_P: [f32; 10] = [
    0.170_872_77,
    -0.822_152_23,
    1.488_515_9,
    -1.135_204,
    0.278_868_07,
    -0.186_288_06,
    0.096_784_18,
    0.374_091_96,
    1.000_023_7,
    -1.265_512_2,
];

/// `gelu(x) = x Φ(x)` with `Φ(x) = erfc(-x/√2) / 2` and erfc from a Chebyshev fit (the one
/// Numerical Recipes calls `erfcc`: `t e^(-z² + p(t))`, `t = 1 / (1 + z/2)`, fractional error
/// below 1.2e-7 for every `z >= 0`). Through `1 + erf(x/√2)` the negative tail cancels: at
/// x = -6 that gave -3.6e-7 for -5.9e-9.
pub fn gelu(b: &mut Body, x: E) -> E {
    let k = c32(b, std::f32::consts::FRAC_1_SQRT_2);
    let a = b.un(Un::Abs, x);
    let z = b.mul(a, k);
    let half = b.c(0.5);
    let one = b.c(1.0);
    let d = b.mul_add(z, half, one);
    let t = b.div(one, d);
    let p = coeffs(b, t, &GELU_P);
    let zz = b.mul(z, z);
    let arg = b.sub(p, zz);
    let e = exp(b, arg);
    let ht = b.mul(t, half);
    // Φ(-|x|): the smaller side.
    let small = b.mul(ht, e);
    let large = b.sub(one, small);
    let zero = b.c(0.0);
    let phi = b.select_if(Cmp::Lt, x, zero, small, large);
    b.mul(x, phi)
}

/// `tanh`: a rational function, odd degree 13 over even degree 6, on x clamped to +-7.905
/// (beyond which tanh rounds to +-1 in f32): one division, no exp, no branches.
pub fn tanh(b: &mut Body, x: E) -> E {
    const P: [f32; 7] = [
        -2.760_768_5e-16,
        2.000_188e-13,
        -8.604_672e-11,
        5.122_297e-8,
        1.485_722_4e-5,
        6.372_619_3e-4,
        4.893_524_6e-3,
    ];
    const Q: [f32; 4] = [1.198_258_4e-6, 1.185_347_1e-4, 2.268_434_6e-3, 4.893_525e-3];
    odd_rational(b, x, 7.905_311, &P, &Q)
}

/// Whether unary op `u` is computed by one of the approximations here (tuned for `f32`) rather
/// than exactly rounded instructions.
pub fn approximated(u: tcc_ir::UnaryOp) -> bool {
    use tcc_ir::UnaryOp::*;
    match u {
        Exp | Log | Erf | Gelu | Tanh | Sigmoid => true,
        Neg | Abs | Sqrt | Rsqrt | Reciprocal | Relu | Floor | Ceil | Round => false,
    }
}

//! The scalar and four-lane `f32` math the elementwise, row and reduction kernels share, as
//! Cranelift instructions: constants, masked selects, and the exp, log, erf and tanh
//! approximations (polynomials and range reduction; `accuracy.rs` measures their error).

use super::jit::Target;
use cranelift_codegen::ir::condcodes::FloatCC;
use cranelift_codegen::ir::{InstBuilder, MemFlags, Type, Value as CValue, types};
use cranelift_frontend::FunctionBuilder;

/// Emits a constant of lane type `ty` (`F32` or `F32X4`).
pub(super) fn fconst(b: &mut FunctionBuilder, ty: Type, x: f32) -> CValue {
    let c = b.ins().f32const(x);
    if ty == types::F32 {
        c
    } else {
        b.ins().splat(ty, c)
    }
}

pub(super) fn iconst32(b: &mut FunctionBuilder, ity: Type, x: i64) -> CValue {
    let c = b.ins().iconst(types::I32, x);
    if ity == types::I32 {
        c
    } else {
        b.ins().splat(ity, c)
    }
}

/// `if a < b { t } else { e }`, lane-wise.
pub(super) fn select_lt(
    b: &mut FunctionBuilder,
    ty: Type,
    a: CValue,
    bb: CValue,
    t: CValue,
    e: CValue,
) -> CValue {
    let m = b.ins().fcmp(FloatCC::LessThan, a, bb);
    if ty == types::F32 {
        b.ins().select(m, t, e)
    } else {
        let m = b.ins().bitcast(ty, MemFlags::new(), m);
        b.ins().bitselect(m, t, e)
    }
}

/// `if m { t } else { e }` for a mask made by a compare in `emit_ops`.
pub(super) fn pick(b: &mut FunctionBuilder, ty: Type, m: CValue, t: CValue, e: CValue) -> CValue {
    if ty == types::F32 {
        b.ins().select(m, t, e)
    } else {
        b.ins().bitselect(m, t, e)
    }
}

/// `a*x + c` evaluated as Horner steps over `coeffs` (highest degree first).
pub(super) fn horner(
    b: &mut FunctionBuilder,
    tg: Target,
    ty: Type,
    x: CValue,
    coeffs: &[f32],
) -> CValue {
    let mut acc = fconst(b, ty, coeffs[0]);
    for &c in &coeffs[1..] {
        let k = fconst(b, ty, c);
        acc = mul_add(b, tg, acc, x, k);
    }
    acc
}

/// `a * x + c`, fused when the target has FMA.
pub(super) fn mul_add(
    b: &mut FunctionBuilder,
    tg: Target,
    a: CValue,
    x: CValue,
    c: CValue,
) -> CValue {
    if tg.fma {
        b.ins().fma(a, x, c)
    } else {
        let m = b.ins().fmul(a, x);
        b.ins().fadd(m, c)
    }
}

/// `x` clamped to `[lo, hi]` by comparisons (NaN stays NaN): cheaper than `fmax`/`fmin`, whose
/// exact NaN and signed-zero rules take several instructions each on x86.
pub(super) fn clamp(b: &mut FunctionBuilder, ty: Type, x: CValue, lo: f32, hi: f32) -> CValue {
    let lo = fconst(b, ty, lo);
    let hi = fconst(b, ty, hi);
    let x = select_lt(b, ty, x, lo, lo, x);
    select_lt(b, ty, hi, x, hi, x)
}

pub(super) fn exp(b: &mut FunctionBuilder, tg: Target, ty: Type, x: CValue) -> CValue {
    let ity = if ty == types::F32 {
        types::I32
    } else {
        types::I32X4
    };
    let x = clamp(b, ty, x, -104.0, 89.0);
    let log2e = fconst(b, ty, std::f32::consts::LOG2_E);
    let t = b.ins().fmul(x, log2e);
    let n = b.ins().nearest(t);
    let c1 = fconst(b, ty, 0.693_359_4);
    let c2 = fconst(b, ty, -2.121_944_4e-4);
    let r = b.ins().fmul(n, c1);
    let r = b.ins().fsub(x, r);
    let r2 = b.ins().fmul(n, c2);
    let r = b.ins().fsub(r, r2);
    let p = horner(
        b,
        tg,
        ty,
        r,
        &[
            1.987_569_1e-4,
            1.398_199_9e-3,
            8.333_452e-3,
            4.166_579_6e-2,
            1.666_666_5e-1,
            0.5,
        ],
    );
    let rr = b.ins().fmul(r, r);
    let y = b.ins().fmul(rr, p);
    let y = b.ins().fadd(y, r);
    let one = fconst(b, ty, 1.0);
    let y = b.ins().fadd(y, one);
    // 2^n as 2^(n>>1) * 2^(n - (n>>1)): each factor's exponent stays in the normal range.
    // n is integral and within [-150, 129], so plain truncation is exact (for NaN the scales are
    // garbage, but y is NaN and so is the product).
    let ni = if ty == types::F32 {
        b.ins().fcvt_to_sint_sat(ity, n)
    } else {
        b.ins().x86_cvtt2dq(ity, n)
    };
    let n1 = b.ins().sshr_imm(ni, 1);
    let n2 = b.ins().isub(ni, n1);
    let bias = iconst32(b, ity, 127);
    let mut out = y;
    for e in [n1, n2] {
        let e = b.ins().iadd(e, bias);
        let e = b.ins().ishl_imm(e, 23);
        let s = b.ins().bitcast(ty, MemFlags::new(), e);
        out = b.ins().fmul(out, s);
    }
    out
}

/// `t` where `x cc y`, else `e`, lane-wise.
#[allow(clippy::too_many_arguments)]
pub(super) fn select_cmp(
    b: &mut FunctionBuilder,
    ty: Type,
    cc: FloatCC,
    x: CValue,
    y: CValue,
    t: CValue,
    e: CValue,
) -> CValue {
    let m = b.ins().fcmp(cc, x, y);
    if ty == types::F32 {
        b.ins().select(m, t, e)
    } else {
        let m = b.ins().bitcast(ty, MemFlags::new(), m);
        b.ins().bitselect(m, t, e)
    }
}

/// Natural logarithm (Cephes' `logf`): x = m 2^e with m in [sqrt(1/2), sqrt(2)), a degree-8
/// polynomial in m - 1, and the two-part ln 2. Subnormals are scaled first; 0 gives -inf,
/// negatives and NaN give NaN, inf gives inf.
pub(super) fn log(b: &mut FunctionBuilder, tg: Target, ty: Type, x0: CValue) -> CValue {
    let ity = if ty == types::F32 {
        types::I32
    } else {
        types::I32X4
    };
    let tiny = fconst(b, ty, f32::MIN_POSITIVE);
    let scale = fconst(b, ty, 8_388_608.0);
    let scaled = b.ins().fmul(x0, scale);
    let x = select_lt(b, ty, x0, tiny, scaled, x0);
    let zero = fconst(b, ty, 0.0);
    let m23 = fconst(b, ty, -23.0);
    let e_adj = select_lt(b, ty, x0, tiny, m23, zero);
    let bits = b.ins().bitcast(ity, MemFlags::new(), x);
    let e_bits = b.ins().ushr_imm(bits, 23);
    let c127 = iconst32(b, ity, 127);
    let e_i = b.ins().isub(e_bits, c127);
    let e = b.ins().fcvt_from_sint(ty, e_i);
    let e = b.ins().fadd(e, e_adj);
    let mant_mask = iconst32(b, ity, 0x007f_ffff);
    let one_bits = iconst32(b, ity, 0x3f80_0000);
    let m_bits = b.ins().band(bits, mant_mask);
    let m_bits = b.ins().bor(m_bits, one_bits);
    let m1 = b.ins().bitcast(ty, MemFlags::new(), m_bits); // in [1, 2)
    // Into [sqrt(1/2), sqrt(2)): above sqrt 2, halve m and add one to e.
    let sqrt2 = fconst(b, ty, std::f32::consts::SQRT_2);
    let half = fconst(b, ty, 0.5);
    let one = fconst(b, ty, 1.0);
    let m_half = b.ins().fmul(m1, half);
    let e_plus = b.ins().fadd(e, one);
    let m = select_lt(b, ty, sqrt2, m1, m_half, m1);
    let e = select_lt(b, ty, sqrt2, m1, e_plus, e);
    let f = b.ins().fsub(m, one);
    let z = b.ins().fmul(f, f);
    let p = horner(
        b,
        tg,
        ty,
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
    let fz = b.ins().fmul(f, z);
    let y = b.ins().fmul(fz, p);
    let c2 = fconst(b, ty, -2.121_944_4e-4);
    let y = mul_add(b, tg, e, c2, y);
    let mhalf = fconst(b, ty, -0.5);
    let y = mul_add(b, tg, z, mhalf, y);
    let r = b.ins().fadd(f, y);
    let c1 = fconst(b, ty, 0.693_359_4);
    let r = mul_add(b, tg, e, c1, r);
    let ninf = fconst(b, ty, f32::NEG_INFINITY);
    let nan = fconst(b, ty, f32::NAN);
    let inf = fconst(b, ty, f32::INFINITY);
    let r = select_cmp(b, ty, FloatCC::Equal, x0, zero, ninf, r);
    let r = select_cmp(b, ty, FloatCC::LessThan, x0, zero, nan, r);
    let r = select_cmp(b, ty, FloatCC::Equal, x0, inf, inf, r);
    select_cmp(b, ty, FloatCC::Unordered, x0, x0, x0, r)
}

/// The error function: a rational function, odd degree 13 over even degree 8, on the input
/// clamped to +-4 (beyond which erf rounds to +-1 in f32).
pub(super) fn erf(b: &mut FunctionBuilder, tg: Target, ty: Type, x: CValue) -> CValue {
    let x = clamp(b, ty, x, -4.0, 4.0);
    let x2 = b.ins().fmul(x, x);
    let p = horner(
        b,
        tg,
        ty,
        x2,
        &[
            -2.726_142_3e-10,
            2.770_681_4e-8,
            -2.101_024e-6,
            -5.692_506_4e-5,
            -7.349_906_3e-4,
            -2.954_6e-3,
            -1.609_603_3e-2,
        ],
    );
    let p = b.ins().fmul(x, p);
    let q = horner(
        b,
        tg,
        ty,
        x2,
        &[
            -1.456_607_2e-5,
            -2.133_740_6e-4,
            -1.682_827e-3,
            -7.373_329e-3,
            -1.426_474e-2,
        ],
    );
    b.ins().fdiv(p, q)
}

pub(super) fn tanh(b: &mut FunctionBuilder, tg: Target, ty: Type, x: CValue) -> CValue {
    // A rational approximation, odd degree 13 over even degree 6, on x clamped to +-7.905
    // (beyond which tanh rounds to +-1 in f32): one division, no exp, no branches.
    let x = clamp(b, ty, x, -7.905_311, 7.905_311);
    let x2 = b.ins().fmul(x, x);
    let p = horner(
        b,
        tg,
        ty,
        x2,
        &[
            -2.760_768_5e-16,
            2.000_188e-13,
            -8.604_672e-11,
            5.122_297e-8,
            1.485_722_4e-5,
            6.372_619_3e-4,
            4.893_524_6e-3,
        ],
    );
    let p = b.ins().fmul(x, p);
    let q = horner(
        b,
        tg,
        ty,
        x2,
        &[1.198_258_4e-6, 1.185_347_1e-4, 2.268_434_6e-3, 4.893_525e-3],
    );
    b.ins().fdiv(p, q)
}

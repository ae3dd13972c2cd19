//! Quantization's kernels: `quantize_linear` and `dequantize_linear` with f32 scales (one per
//! tensor, or one per block of a layout: a channel of NCHW), and `matmul_integer`'s product of
//! u8/i8 matrices in i32. Each computes what the interpreter does, bit for bit: the quotient in
//! f32, rounded half to even, the zero point added and the level saturated (NaN: the zero
//! point); `(q - zero)` as f32 times the scale; the product's sums wrapping in i32.
//!
//! The integer product runs on AVX-512 VNNI where the target has it, else on AVX2 (both in
//! `int8.rs`), else on the portable loop here (rows of `a` against `b` less its zero points,
//! prepared once).

use super::int_depthwise::Isa;
use tcc_ir::{DType, Function, Value};

/// Which scale and zero point element `i` of the operand uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Per {
    /// One for the tensor.
    Tensor,
    /// Element `(i / inner) % n`: one per channel of a layout.
    Block { inner: usize, n: usize },
}

impl Per {
    /// How `params` (the scale's dims) broadcast to `dims`, if one of the two forms.
    pub(super) fn of(params: &[u64], dims: &[u64]) -> Option<Per> {
        match crate::kernel::access(params, dims)? {
            crate::kernel::Access::Scalar(_) => Some(Per::Tensor),
            crate::kernel::Access::Same => Some(Per::Block {
                inner: 1,
                n: dims.iter().product::<u64>() as usize,
            }),
            crate::kernel::Access::Block { inner, n } => Some(Per::Block {
                inner: inner as usize,
                n: n as usize,
            }),
            crate::kernel::Access::Gapped { .. } => None,
        }
    }

    /// Calls `run(start, end, p)` for each run of elements `start..end` within `from..to` of
    /// an operand that uses parameter `p`.
    fn runs(self, from: usize, to: usize, mut run: impl FnMut(usize, usize, usize)) {
        match self {
            Per::Tensor => run(from, to, 0),
            Per::Block { inner, n } => {
                let inner = inner.max(1);
                let mut start = from;
                while start < to {
                    let r = start / inner;
                    let end = ((r + 1) * inner).min(to);
                    run(start, end, r % n);
                    start = end;
                }
            }
        }
    }
}

/// The scales, checked as the interpreter checks them.
pub(super) fn checked(scale: &[f32]) -> Result<(), String> {
    match scale.iter().find(|s| !(s.is_finite() && **s > 0.0)) {
        Some(s) => Err(format!(
            "a scale is {s}: scales must be positive and finite"
        )),
        None => Ok(()),
    }
}

/// Bytes of a `u8` or `i8` tensor as integers.
pub(super) fn levels(bytes: &[u8], signed: bool) -> Vec<i32> {
    if signed {
        bytes.iter().map(|&b| b as i8 as i32).collect()
    } else {
        bytes.iter().map(|&b| b as i32).collect()
    }
}

/// `quantize_linear` of `x` into `out` (the levels' bytes; `signed`: i8) on `isa`'s vectors
/// ([`quantize_avx512`] and [`quantize_avx2`]: the same steps sixteen or eight lanes at a
/// time). Large tensors split across the thread pool.
pub(super) fn quantize(
    x: &[f32],
    scale: &[f32],
    zero: &[i32],
    per: Per,
    signed: bool,
    isa: Isa,
    out: &mut [u8],
) -> Result<(), String> {
    checked(scale)?;
    in_chunks(out, |start, out| {
        per.runs(start, start + out.len(), |a, b, p| {
            let (x, out) = (&x[a..b], &mut out[a - start..b - start]);
            // SAFETY (both): `isa` is what the CPU has.
            match isa {
                #[cfg(target_arch = "x86_64")]
                Isa::Avx512 => unsafe { quantize_avx512(x, scale[p], zero[p], signed, out) },
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2 => unsafe { quantize_avx2(x, scale[p], zero[p], signed, out) },
                _ => quantize_run(x, scale[p], zero[p], signed, out),
            }
        });
    });
    Ok(())
}

/// [`quantize_run`] sixteen lanes at a time: the quotient by the reciprocal with the exact
/// fallback near ties ([`quotient16`]), the same clamp and rounding, NaN lanes the zero point,
/// the levels saturated and stored by a narrowing masked store.
///
/// # Safety
/// The CPU has AVX-512F and DQ.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq")]
pub(super) unsafe fn quantize_avx512(x: &[f32], s: f32, z: i32, signed: bool, out: &mut [u8]) {
    use std::arch::x86_64::*;
    let (lo, hi) = if signed { (-128, 127) } else { (0, 255) };
    let (inv, vz) = (1.0 / s, _mm512_set1_epi32(z));
    let (vlo, vhi) = (_mm512_set1_epi32(lo), _mm512_set1_epi32(hi));
    let bound = _mm512_set1_ps(1024.0);
    for i in (0..x.len()).step_by(16) {
        let mask = (u32::MAX >> (32 - (x.len() - i).min(16))) as u16;
        // SAFETY: the mask's lanes of both slices.
        unsafe {
            let q = quotient16(_mm512_maskz_loadu_ps(mask, x.as_ptr().add(i)), s, inv);
            let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(q, q);
            let c = _mm512_min_ps(
                _mm512_max_ps(q, _mm512_sub_ps(_mm512_setzero_ps(), bound)),
                bound,
            );
            let r =
                _mm512_cvt_roundps_epi32::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(c);
            let level = _mm512_mask_blend_epi32(nan, _mm512_add_epi32(r, vz), vz);
            let level = _mm512_min_epi32(_mm512_max_epi32(level, vlo), vhi);
            _mm512_mask_cvtepi32_storeu_epi8(out.as_mut_ptr().add(i) as *mut i8, mask, level);
        }
    }
}

/// Adding and subtracting 1.5 * 2^23 rounds an f32 below 2^22 in magnitude to an integer, half
/// to even (the adder's rounding); clamping the quotient to +-1024 first keeps it there and
/// changes no saturated level (every level is within 383 of the zero point).
pub(super) const ROUND: f32 = 12_582_912.0;

/// Quotients `y / s` where only their rounding to integers matters (as a quantization's
/// level): `y` times `1 / s`. Three roundings of at most 2^-24 each (the reciprocal, the
/// product, and the f32 quotient it stands in for) put the product within `3 * 2^-24 |y / s|`
/// of the quotient, under 4.6e-5 wherever `|y / s| <= 257`, so it rounds as the quotient does
/// unless it lies within 1e-4 of a half-integer; those lanes (about one in five thousand)
/// divide. Beyond 257 the level saturates either way (levels lie within 255 of the zero
/// point). Dividing every lane was most of a small convolution's time.
pub(super) const NEAR_TIE: f32 = 0.4999;

/// [`NEAR_TIE`]'s quotient on sixteen lanes.
///
/// # Safety
/// AVX-512F and DQ.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512dq")]
pub(super) unsafe fn quotient16(
    y: std::arch::x86_64::__m512,
    s: f32,
    inv: f32,
) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let q = _mm512_mul_ps(y, _mm512_set1_ps(inv));
    // SAFETY: AVX-512F, as this function's contract.
    let near = unsafe { near_tie16(q) };
    if near == 0 {
        q
    } else {
        _mm512_mask_div_ps(q, near, y, _mm512_set1_ps(s))
    }
}

/// The lanes of `q` (products by a reciprocal) that lie within [`NEAR_TIE`]'s margin of a
/// half-integer, which the quotient must decide.
///
/// # Safety
/// AVX-512F and DQ.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512dq")]
unsafe fn near_tie16(q: std::arch::x86_64::__m512) -> u16 {
    use std::arch::x86_64::*;
    // `q` less its nearest integer in one instruction (`vreduceps`; a rounding and a
    // subtraction took 7% longer on a 1x1 layer whose time is its stores).
    let off = _mm512_reduce_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(q);
    let off = _mm512_abs_ps(off);
    _mm512_cmp_ps_mask::<_CMP_GT_OQ>(off, _mm512_set1_ps(NEAR_TIE))
}

/// [`NEAR_TIE`]'s quotient on eight lanes.
///
/// # Safety
/// AVX2.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn quotient8(
    y: std::arch::x86_64::__m256,
    s: f32,
    inv: f32,
) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let q = _mm256_mul_ps(y, _mm256_set1_ps(inv));
    let nearest = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(q);
    let off = _mm256_andnot_ps(_mm256_set1_ps(-0.0), _mm256_sub_ps(q, nearest));
    let near = _mm256_cmp_ps::<_CMP_GT_OQ>(off, _mm256_set1_ps(NEAR_TIE));
    if _mm256_movemask_ps(near) == 0 {
        q
    } else {
        _mm256_blendv_ps(q, _mm256_div_ps(y, _mm256_set1_ps(s)), near)
    }
}

/// The levels of `x` with scale `s` and zero point `z`: the quotient in f32, rounded half to
/// even, the zero point added and the level saturated (NaN: the zero point).
pub(super) fn quantize_run(x: &[f32], s: f32, z: i32, signed: bool, out: &mut [u8]) {
    let (lo, hi) = if signed {
        (-128.0, 127.0)
    } else {
        (0.0, 255.0)
    };
    let z = z as f32;
    for (o, &v) in out.iter_mut().zip(x) {
        let q = v / s;
        let r = (q.clamp(-1024.0, 1024.0) + ROUND) - ROUND;
        let level = if q.is_nan() { z } else { (r + z).clamp(lo, hi) };
        *o = level as i32 as u8;
    }
}

/// [`quantize_run`] eight lanes at a time, the same steps in the same order.
///
/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn quantize_avx2(x: &[f32], s: f32, z: i32, signed: bool, out: &mut [u8]) {
    use std::arch::x86_64::*;
    let (lo, hi) = if signed {
        (-128.0, 127.0)
    } else {
        (0.0, 255.0)
    };
    let n = x.len() / 8 * 8;
    let (inv, vz) = (1.0 / s, _mm256_set1_ps(z as f32));
    let (vlo, vhi) = (_mm256_set1_ps(lo), _mm256_set1_ps(hi));
    let (bound, round) = (_mm256_set1_ps(1024.0), _mm256_set1_ps(ROUND));
    for i in (0..n).step_by(8) {
        // SAFETY: lanes `i..i + 8` of both slices.
        unsafe {
            let q = quotient8(_mm256_loadu_ps(x.as_ptr().add(i)), s, inv);
            let c = _mm256_min_ps(
                _mm256_max_ps(q, _mm256_sub_ps(_mm256_setzero_ps(), bound)),
                bound,
            );
            let r = _mm256_sub_ps(_mm256_add_ps(c, round), round);
            let level = _mm256_min_ps(_mm256_max_ps(_mm256_add_ps(r, vz), vlo), vhi);
            let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(q, q);
            let level = _mm256_cvtps_epi32(_mm256_blendv_ps(level, vz, nan));
            // Levels in range: packing keeps them (signed packs for i8, unsigned for u8).
            let words = _mm_packs_epi32(
                _mm256_castsi256_si128(level),
                _mm256_extracti128_si256::<1>(level),
            );
            let bytes = if signed {
                _mm_packs_epi16(words, words)
            } else {
                _mm_packus_epi16(words, words)
            };
            _mm_storel_epi64(out.as_mut_ptr().add(i) as *mut __m128i, bytes);
        }
    }
    quantize_run(&x[n..], s, z, signed, &mut out[n..]);
}

/// `dequantize_linear` of the levels `q` (bytes; `signed`: i8) into `out`. Large tensors
/// split across the thread pool.
pub(super) fn dequantize(
    q: &[u8],
    signed: bool,
    scale: &[f32],
    zero: &[i32],
    per: Per,
    out: &mut [f32],
) -> Result<(), String> {
    checked(scale)?;
    in_chunks(out, |start, out| {
        per.runs(start, start + out.len(), |a, b, p| {
            let (s, z) = (scale[p], zero[p]);
            let out = &mut out[a - start..b - start];
            if signed {
                for (o, &v) in out.iter_mut().zip(&q[a..b]) {
                    *o = (v as i8 as i32 - z) as f32 * s;
                }
            } else {
                for (o, &v) in out.iter_mut().zip(&q[a..b]) {
                    *o = (v as i32 - z) as f32 * s;
                }
            }
        });
    });
    Ok(())
}

/// `work(start, chunk)` for each chunk of 2^14 elements of `out` (`start`: its first
/// element's index), across the thread pool when there are several.
fn in_chunks<T: Send>(out: &mut [T], work: impl Fn(usize, &mut [T]) + Sync) {
    const CHUNK: usize = 1 << 14;
    let len = out.len();
    // SAFETY: each item writes its own chunk of `out`.
    let dst = unsafe { crate::cpu::send_ptr::SendPtr::new(out.as_mut_ptr()) };
    let item = |c: usize| {
        let (start, end) = (c * CHUNK, ((c + 1) * CHUNK).min(len));
        // SAFETY: chunk `c` of `out`, this item's alone.
        let chunk = unsafe { std::slice::from_raw_parts_mut(dst.get().add(start), end - start) };
        work(start, chunk);
    };
    let chunks = len.div_ceil(CHUNK);
    if chunks > 1 {
        crate::cpu::pool::for_each(chunks, &item);
    } else {
        (0..chunks).for_each(item);
    }
}

/// A `matmul_integer` as the kernel runs it: each batch's element offsets into `a` and `b`,
/// the matrix sizes, and whether each zero point is one per row (of `a`) or per column (of
/// `b`) rather than one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct IntegerProduct {
    pub batches: Vec<(usize, usize)>,
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub rows: bool,
    pub columns: bool,
    /// Whether it runs on AVX-512 VNNI ([`super::int8::product`]).
    pub vnni: bool,
    /// Whether it runs on AVX2 ([`super::int8::product_avx2`]), where VNNI is not used.
    pub avx2: bool,
    /// On AVX2, whether the CPU has AVX-VNNI (and the target keeps it): then the product
    /// runs as on AVX-512 VNNI, on 256-bit `vpdpbusd` (except A of at most 4 rows against a
    /// B that is not packed at compile time, which [`super::int8::product_avx2`] does without
    /// packing B).
    pub avx_vnni: bool,
    /// On VNNI, B packed at compile time (a constant shared by every batch).
    #[cfg(target_arch = "x86_64")]
    pub packed_b: Option<std::sync::Arc<super::int8::PackedB>>,
}

impl IntegerProduct {
    /// The product `matmul_integer(a, b, za, zb)` of `f`, if its zero points are one per
    /// tensor, per row of `a` or per column of `b` (the ONNX forms).
    pub(super) fn of(
        f: &Function,
        [a, b, za, zb]: [Value; 4],
        r: Value,
        (vnni, avx2): (bool, bool),
        avx_vnni: bool,
    ) -> Option<IntegerProduct> {
        let (ad, bd, od) = (f.ty(a).dims(), f.ty(b).dims(), f.ty(r).dims());
        let (m, k, n) = (ad[ad.len() - 2], ad[ad.len() - 1], bd[bd.len() - 1]);
        // The zero point's only non-1 axis, counted from the end, if any.
        let along = |z: Value| {
            let zd = f.ty(z).dims();
            let big: Vec<usize> = (0..zd.len()).filter(|&i| zd[i] != 1).collect();
            match big[..] {
                [] => Some(None),
                [i] => Some(Some(zd.len() - i)),
                _ => None,
            }
        };
        let rows = match along(za)? {
            None => false,
            Some(2) if m > 1 => true,
            _ => return None,
        };
        let columns = match along(zb)? {
            None => false,
            Some(1) if n > 1 => true,
            _ => return None,
        };
        // Each batch's offsets, broadcasting as the interpreter does.
        let batch = &od[..od.len() - 2];
        let offsets = |dims: &[u64], size: u64| -> Vec<usize> {
            let own = &dims[..dims.len() - 2];
            let mut strides = vec![0u64; batch.len()];
            let mut s = size;
            for (i, &d) in own.iter().enumerate().rev() {
                strides[batch.len() - own.len() + i] = if d == 1 { 0 } else { s };
                s *= d;
            }
            let count: u64 = batch.iter().product();
            (0..count)
                .map(|mut bi| {
                    let mut off = 0;
                    for (&d, &st) in batch.iter().zip(&strides).rev() {
                        off += (bi % d) * st;
                        bi /= d;
                    }
                    off as usize
                })
                .collect()
        };
        let (oa, ob) = (offsets(ad, m * k), offsets(bd, k * n));
        Some(IntegerProduct {
            batches: oa.into_iter().zip(ob).collect(),
            m: m as usize,
            k: k as usize,
            n: n as usize,
            rows,
            columns,
            vnni,
            avx2,
            avx_vnni: avx2 && avx_vnni,
            #[cfg(target_arch = "x86_64")]
            packed_b: None,
        })
    }

    /// Packs constant B (bytes `b`, `i8` where `signed`) at compile time, where the product
    /// runs on VNNI and every batch reads the same B.
    #[cfg(target_arch = "x86_64")]
    pub(super) fn pack_constant_b(&mut self, b: &[u8], signed: bool) {
        let shared = self.batches.iter().all(|&(_, ob)| ob == 0) && b.len() == self.k * self.n;
        if (self.vnni || self.avx_vnni) && shared {
            let flip = if signed { 0 } else { 0x80 };
            let packed = super::int8::PackedB::new(b, flip, (self.k, self.n));
            self.packed_b = Some(std::sync::Arc::new(packed));
        }
    }

    /// The product of byte tensors `a` and `b` (`i8` where `signed` says, else `u8`) less zero
    /// points `za` and `zb` (bytes of the same types), into `out`.
    pub(super) fn run_bytes(
        &self,
        [a, b, za, zb]: [&[u8]; 4],
        [sa, sb]: [bool; 2],
        out: &mut [i32],
    ) {
        let dims = (self.m, self.k, self.n);
        // On AVX-VNNI, short products against a B not packed at compile time go to the AVX2
        // path, which does not pack B.
        #[cfg(target_arch = "x86_64")]
        let avx_vnni = self.avx_vnni && (self.packed_b.is_some() || self.m > 4);
        #[cfg(target_arch = "x86_64")]
        if self.vnni || avx_vnni {
            // u8 x i8: an i8 A plus 128 (its top bit flipped) is u8, a u8 B minus 128 is i8,
            // and their zero points move with them; the kernel flips the bytes as it packs
            // them.
            let flips = [if sa { 0x80 } else { 0 }, if sb { 0 } else { 0x80 }];
            let za: Vec<i32> = (levels(za, sa).into_iter())
                .map(|z| if sa { z + 128 } else { z })
                .collect();
            let zb: Vec<i32> = (levels(zb, sb).into_iter())
                .map(|z| if sb { z } else { z - 128 })
                .collect();
            let wide = self.vnni;
            match &self.packed_b {
                // SAFETY (both): `vnni` is set only where the target has AVX-512F and VNNI,
                // `avx_vnni` where it has AVX2 and the CPU AVX-VNNI; `packed_b` was packed for
                // this `k` and `n`.
                Some(pb) => self.each_batch(a, b, out, |a, _, o| unsafe {
                    super::int8::product_packed(a, flips[0], pb, dims, &za, &zb, o, wide)
                }),
                None => self.each_batch(a, b, out, |a, b, o| unsafe {
                    super::int8::product(a, b, flips, dims, &za, &zb, o, wide)
                }),
            }
            return;
        }
        let (za, zb) = (levels(za, sa), levels(zb, sb));
        #[cfg(target_arch = "x86_64")]
        if self.avx2 {
            // SAFETY: `avx2` is set only where the target has AVX2.
            self.each_batch(a, b, out, |a, b, o| unsafe {
                super::int8::product_avx2((a, sa), (b, sb), dims, &za, &zb, o)
            });
            return;
        }
        let (a, b) = (levels(a, sa), levels(b, sb));
        self.each_batch(&a, &b, out, |a, b, o| self.portable(a, b, &za, &zb, o));
    }

    /// `product(a, b, out)` for each batch: its matrices of `a` and `b` and its block of `out`.
    fn each_batch<A, B>(
        &self,
        a: &[A],
        b: &[B],
        out: &mut [i32],
        mut product: impl FnMut(&[A], &[B], &mut [i32]),
    ) {
        let IntegerProduct { m, k, n, .. } = *self;
        for (&(oa, ob), o) in self.batches.iter().zip(out.chunks_mut((m * n).max(1))) {
            product(&a[oa..oa + m * k], &b[ob..ob + k * n], o);
        }
    }

    /// One batch's product of `a` and `b` (levels) less zero points `za` and `zb`, as a
    /// portable loop: each row of `a` against `b` less its zero points (prepared once).
    fn portable(&self, a: &[i32], b: &[i32], za: &[i32], zb: &[i32], out: &mut [i32]) {
        let IntegerProduct { m, k, n, .. } = *self;
        let mut shifted = vec![0i32; k * n];
        for p in 0..k {
            for j in 0..n {
                let z = zb[if self.columns { j } else { 0 }];
                shifted[p * n + j] = b[p * n + j].wrapping_sub(z);
            }
        }
        for i in 0..m {
            let z = za[if self.rows { i } else { 0 }];
            let row = &mut out[i * n..][..n];
            row.fill(0);
            for p in 0..k {
                let x = a[i * k + p].wrapping_sub(z);
                if x == 0 {
                    continue;
                }
                for (o, &y) in row.iter_mut().zip(&shifted[p * n..][..n]) {
                    *o = o.wrapping_add(x.wrapping_mul(y));
                }
            }
        }
    }
}

/// Whether `v` is `i8` (else `u8`).
pub(super) fn signed(f: &Function, v: Value) -> bool {
    f.ty(v).dtype() == DType::I8
}

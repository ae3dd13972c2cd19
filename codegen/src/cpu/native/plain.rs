//! The requantizing chain's NaN-free path ([`Bound::plain_reciprocal`]) for kernels that store
//! many vectors: [`Plain16`] on AVX-512 and [`Plain8`] on AVX2, their constants made once per
//! kernel call and their stores inlined into the kernels (a call per vector reloaded them
//! all). One multiply by the channel's scale and one add of its bias (1 and 0 where the chain
//! has none, which change no level: the plain path quantizes, and the sign of a zero is lost
//! there), the clamps folded into one `max` and one `min` (`relu` and the lower bound are both
//! maxima, and without NaN the order of maxima does not matter), then the quotient by the
//! reciprocal ([`super::quant::NEAR_TIE`]), rounding half to even, the zero point and the
//! saturating narrowing: the interpreter's levels bit for bit.

use super::requant::Bound;
use std::arch::x86_64::*;

/// What both forms take from the chain: the folded clamps, whether they keep every quotient
/// within +-2^30 (then its conversion to i32 and the zero point's add cannot overflow, and
/// the saturating narrowing alone gives the level: no clamp to +-1024 needed, as with relu6),
/// and whether they keep it non-negative (no `max` with 0 before a u8 narrowing).
struct Bounds {
    lo: f32,
    hi: f32,
    bounded: bool,
    nonnegative: bool,
}

impl Bound<'_> {
    /// The plain path's [`Bounds`], where the chain has it.
    fn bounds(&self) -> Option<Bounds> {
        let (s, _, _) = self.quantize?;
        self.plain?;
        let mut lo = f32::NEG_INFINITY;
        if self.relu {
            lo = 0.0;
        }
        if let Some((c, _)) = self.lower {
            lo = lo.max(c);
        }
        let hi = self.upper.map_or(f32::INFINITY, |(c, _)| c);
        // `|q| <= |y| / s (1 + 2^-22)` for the product by the reciprocal: 2^30 leaves room
        // below 2^31 for that and the zero point.
        Some(Bounds {
            lo,
            hi,
            bounded: lo.abs().max(hi.abs()) / s <= (1u32 << 30) as f32,
            nonnegative: lo >= 0.0,
        })
    }
}

/// The plain path on AVX-512, sixteen lanes a vector.
#[derive(Clone, Copy)]
pub(crate) struct Plain16<'a> {
    /// Per-channel scales and biases, or one value repeated (the slice's length 1).
    scale: &'a [f32],
    bias: &'a [f32],
    lo: __m512,
    hi: __m512,
    s: f32,
    inv: f32,
    z: __m512i,
    pub(crate) flags: Flags,
}

/// Evaluates `$body` with `$f` bound to the [`Flags`] `$flags` as a constant: one copy of
/// `$body` for each of their eight values, so that the stores inlined into it test none.
macro_rules! with_constant_flags {
    ($flags:expr, $f:ident => $body:expr) => {
        $crate::cpu::native::plain::with_constant_flags!(@arms $flags, $f, $body;
            [false false false] [false false true] [false true false] [false true true]
            [true false false] [true false true] [true true false] [true true true])
    };
    (@arms $flags:expr, $f:ident, $body:expr; $([$s:literal $b:literal $n:literal])*) => {{
        use $crate::cpu::native::plain::Flags;
        match $flags {
            $(Flags { signed: $s, bounded: $b, nonnegative: $n } => {
                let $f = Flags { signed: $s, bounded: $b, nonnegative: $n };
                $body
            })*
        }
    }};
}
pub(crate) use with_constant_flags;

/// What a [`Plain16`]'s store may leave out. Kernels that store many vectors with one chain
/// match on these once and pass them to [`Plain16::store_with`] as constants, so that the
/// compiler leaves the tests out of the loop.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Flags {
    /// Whether the levels are i8.
    pub signed: bool,
    /// Whether the clamps keep every quotient within +-2^30 (no clamp to +-1024 needed, as
    /// with relu6), and whether they keep it non-negative (no `max` with 0 before a u8 store).
    pub bounded: bool,
    pub nonnegative: bool,
}

impl<'a> Bound<'a> {
    /// The chain as a [`Plain16`], where it has the plain path.
    ///
    /// # Safety
    /// AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn plain16(&self) -> Option<Plain16<'a>> {
        let (inv, (s, z, signed)) = (self.plain?, self.quantize?);
        let b = self.bounds()?;
        Some(Plain16 {
            flags: Flags {
                signed,
                bounded: b.bounded,
                nonnegative: b.nonnegative,
            },
            scale: self.scale.unwrap_or(&[1.0]),
            bias: self.bias.unwrap_or(&[0.0]),
            lo: _mm512_set1_ps(b.lo),
            hi: _mm512_set1_ps(b.hi),
            s,
            inv,
            z: _mm512_set1_epi32(z),
        })
    }
}

impl Plain16<'_> {
    /// The levels of output channel `o` for sixteen sums `y` (converted to f32 already), the
    /// lanes of `mask`, stored at `out`.
    ///
    /// # Safety
    /// AVX-512F, BW and VL; `out` has room for the lanes of `mask`; `o` is a channel of the
    /// chain's operands.
    #[inline(always)]
    pub(crate) unsafe fn store(&self, y: __m512, o: usize, mask: u16, out: *mut u8) {
        // SAFETY: as this function's contract.
        unsafe { self.store_with(y, o, mask, out, self.flags) }
    }

    /// [`Plain16::store`] with the chain's flags `flags` (constants where the caller matched
    /// on them).
    ///
    /// # Safety
    /// As [`Plain16::store`]; `flags` are the chain's.
    #[inline(always)]
    pub(crate) unsafe fn store_with(
        &self,
        y: __m512,
        o: usize,
        mask: u16,
        out: *mut u8,
        flags: Flags,
    ) {
        // Inlined into the kernels (compiled for AVX-512), which is what makes it fast: a call
        // would reload every constant.
        // SAFETY: as this function's contract.
        unsafe { self.store_scaled(self.scaled(y, o), mask, out, flags) }
    }

    /// Sixteen sums `y` of channel `o` (in f32) times its scale plus its bias.
    ///
    /// # Safety
    /// AVX-512F; `o` is a channel of the chain's operands.
    #[inline(always)]
    pub(crate) unsafe fn scaled(&self, y: __m512, o: usize) -> __m512 {
        // SAFETY: AVX-512F, as this function's contract.
        unsafe {
            let scale = _mm512_set1_ps(self.scale[if self.scale.len() == 1 { 0 } else { o }]);
            let bias = _mm512_set1_ps(self.bias[if self.bias.len() == 1 { 0 } else { o }]);
            _mm512_add_ps(_mm512_mul_ps(y, scale), bias)
        }
    }

    /// [`Plain16::store_with`] from the value after the bias (and a residual: finite lanes
    /// only, the plain path's assumption).
    ///
    /// # Safety
    /// As [`Plain16::store_with`]; the lanes of `mask` in `y` are finite.
    #[inline(always)]
    pub(crate) unsafe fn store_scaled(&self, y: __m512, mask: u16, out: *mut u8, flags: Flags) {
        // SAFETY: AVX-512F, BW and VL and `out`, as this function's contract.
        unsafe {
            let y = _mm512_min_ps(_mm512_max_ps(y, self.lo), self.hi);
            let mut q = super::quant::quotient16(y, self.s, self.inv);
            if !flags.bounded {
                let bound = _mm512_set1_ps(1024.0);
                let low = _mm512_sub_ps(_mm512_setzero_ps(), bound);
                q = _mm512_min_ps(_mm512_max_ps(q, low), bound);
            }
            let r =
                _mm512_cvt_roundps_epi32::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(q);
            let mut level = _mm512_add_epi32(r, self.z);
            // Narrowed in a register, then a masked byte store: faster than a narrowing store.
            let bytes = if flags.signed {
                _mm512_cvtsepi32_epi8(level)
            } else {
                if !flags.nonnegative {
                    level = _mm512_max_epi32(level, _mm512_setzero_si512());
                }
                _mm512_cvtusepi32_epi8(level)
            };
            _mm_mask_storeu_epi8(out as *mut i8, mask, bytes);
        }
    }
}

/// The plain path on AVX2, eight lanes a vector, sixteen outputs stored together.
#[derive(Clone, Copy)]
pub(crate) struct Plain8<'a> {
    scale: &'a [f32],
    bias: &'a [f32],
    lo: __m256,
    hi: __m256,
    s: f32,
    inv: f32,
    z: __m256i,
    signed: bool,
    bounded: bool,
}

impl<'a> Bound<'a> {
    /// The chain as a [`Plain8`], where it has the plain path.
    ///
    /// # Safety
    /// AVX2.
    #[target_feature(enable = "avx2")]
    pub(crate) unsafe fn plain8(&self) -> Option<Plain8<'a>> {
        let (inv, (s, z, signed)) = (self.plain?, self.quantize?);
        let b = self.bounds()?;
        Some(Plain8 {
            scale: self.scale.unwrap_or(&[1.0]),
            bias: self.bias.unwrap_or(&[0.0]),
            lo: _mm256_set1_ps(b.lo),
            hi: _mm256_set1_ps(b.hi),
            s,
            inv,
            z: _mm256_set1_epi32(z),
            signed,
            bounded: b.bounded,
        })
    }
}

impl Plain8<'_> {
    /// The levels of output channel `o` for sixteen sums `y` (two vectors of eight, converted
    /// to f32 already), the first `count` stored at `out`.
    ///
    /// # Safety
    /// AVX2; `out` has room for `count <= 16` bytes; `o` is a channel of the chain's operands.
    #[inline(always)]
    pub(crate) unsafe fn store(&self, y: [__m256; 2], o: usize, count: usize, out: *mut u8) {
        // SAFETY: AVX2 and `out`, as this function's contract.
        unsafe {
            // Saturating packs to 16 bits, the lanes put back in order, then to 8 bits.
            let words = _mm256_packs_epi32(self.level(y[0], o), self.level(y[1], o));
            let words = _mm256_permute4x64_epi64::<0xD8>(words);
            let (lo, hi) = (
                _mm256_castsi256_si128(words),
                _mm256_extracti128_si256::<1>(words),
            );
            let bytes = if self.signed {
                _mm_packs_epi16(lo, hi)
            } else {
                _mm_packus_epi16(lo, hi)
            };
            if count == 16 {
                _mm_storeu_si128(out as *mut __m128i, bytes);
            } else {
                // Pieces of 8, 4, 2 and 1 bytes (a copy through memory here, a library call,
                // was a quarter of the depthwise kernel's time on 14-wide rows).
                let (mut v, mut at, mut n) = (bytes, out, count);
                if n >= 8 {
                    _mm_storel_epi64(at as *mut __m128i, v);
                    (v, at, n) = (_mm_srli_si128::<8>(v), at.add(8), n - 8);
                }
                if n >= 4 {
                    _mm_storeu_si32(at, v);
                    (v, at, n) = (_mm_srli_si128::<4>(v), at.add(4), n - 4);
                }
                if n >= 2 {
                    _mm_storeu_si16(at, v);
                    (v, at, n) = (_mm_srli_si128::<2>(v), at.add(2), n - 2);
                }
                if n == 1 {
                    *at = _mm_cvtsi128_si32(v) as u8;
                }
            }
        }
    }

    /// The levels of eight sums `y` of channel `o`, unsaturated (within +-1024 of the zero
    /// point, or +-2^30 where the clamps bound them). A method, not a closure: a closure in a
    /// function without the target's features is compiled without them, and its intrinsics
    /// become calls.
    ///
    /// # Safety
    /// AVX2.
    #[inline(always)]
    unsafe fn level(&self, y: __m256, o: usize) -> __m256i {
        // SAFETY: AVX2, as this function's contract.
        unsafe {
            let scale = _mm256_set1_ps(self.scale[if self.scale.len() == 1 { 0 } else { o }]);
            let bias = _mm256_set1_ps(self.bias[if self.bias.len() == 1 { 0 } else { o }]);
            let y = _mm256_add_ps(_mm256_mul_ps(y, scale), bias);
            let y = _mm256_min_ps(_mm256_max_ps(y, self.lo), self.hi);
            let mut q = super::quant::quotient8(y, self.s, self.inv);
            if !self.bounded {
                let bound = _mm256_set1_ps(1024.0);
                let low = _mm256_sub_ps(_mm256_setzero_ps(), bound);
                q = _mm256_min_ps(_mm256_max_ps(q, low), bound);
            }
            // The conversion rounds half to even (MXCSR's default).
            _mm256_add_epi32(_mm256_cvtps_epi32(q), self.z)
        }
    }
}

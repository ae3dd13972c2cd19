//! The store loops of [`Bound`]: a kernel's vectors (or register tiles, or a row-major
//! product's rows) through the epilogue into memory, the common forms ([`Fast`]) each in a
//! loop of its own and any other chain step by step ([`Bound::apply`]), on eight lanes or
//! sixteen with the same steps, so the same bits on every path.

use super::{B, Bound, Fast, P_MAX, PostOp};
#[cfg(target_arch = "x86_64")]
use crate::cpu::simd::{first, gelu, gelu_erf, gelu_erf512, high, join, sigmoid, sigmoid512};
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

impl Bound<'_> {
    /// Applies the epilogue to `vs` and stores vector `i` (of channels `chan(i)..` of a
    /// per-channel operand, element `base + at(i)` of the output) at `y + at(i)`. A [`Fast`]
    /// form goes through its own loop (the same steps as [`Bound::apply`], so the same bits);
    /// any other chain through `apply`, then the stores.
    ///
    /// # Safety
    /// As for [`Bound::apply`]; `y + at(i)` holds a vector for each `i`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub(crate) unsafe fn store(
        &self,
        vs: &mut [__m256],
        chan: impl Fn(usize) -> usize + Copy,
        at: impl Fn(usize) -> usize + Copy,
        y: *mut f32,
        base: usize,
    ) {
        // SAFETY (every store): the caller's contract.
        let store = |i: usize, v: __m256| unsafe { _mm256_storeu_ps(y.add(at(i)), v) };
        let Some(fast) = self.fast else {
            // SAFETY: the caller's contract.
            unsafe {
                self.apply(vs, chan, |i| base + at(i), |p| _mm256_loadu_ps(p));
            }
            for (i, &v) in vs.iter().enumerate() {
                store(i, v);
            }
            return;
        };
        // SAFETY (every load): the caller's contract: a per-channel operand holds the
        // vector's channels, a residual the output's elements.
        let channel =
            |o: usize, i: usize| unsafe { _mm256_loadu_ps((*self.ptrs.get().add(o)).add(chan(i))) };
        let tensor = |o: usize, i: usize| unsafe {
            _mm256_loadu_ps((*self.ptrs.get().add(o)).add(base + at(i)))
        };
        match fast {
            Fast::Plain => {
                for (i, &v) in vs.iter().enumerate() {
                    store(i, v);
                }
            }
            Fast::Bias(o) => {
                for (i, &v) in vs.iter().enumerate() {
                    store(i, _mm256_add_ps(v, channel(o, i)));
                }
            }
            Fast::BiasRelu(o) => {
                let z = _mm256_setzero_ps();
                for (i, &v) in vs.iter().enumerate() {
                    store(i, _mm256_max_ps(z, _mm256_add_ps(v, channel(o, i))));
                }
            }
            Fast::BiasClamp(o, lo, hi) => {
                let (lo, hi) = (_mm256_set1_ps(lo), _mm256_set1_ps(hi));
                for (i, &v) in vs.iter().enumerate() {
                    let v = _mm256_max_ps(lo, _mm256_add_ps(v, channel(o, i)));
                    store(i, _mm256_min_ps(hi, v));
                }
            }
            Fast::BiasSilu(o) => {
                let mut done = 0;
                if self.avx512 {
                    // Pairs of vectors on sixteen lanes: the sigmoid's instructions halve.
                    done = vs.len() / 2 * 2;
                    // SAFETY: the CPU has AVX-512F (`Post::avx512`); the caller's contract.
                    unsafe { bias_silu_pairs(&vs[..done], |i| channel(o, i), store) };
                }
                for (i, &v) in vs.iter().enumerate().skip(done) {
                    let v = _mm256_add_ps(v, channel(o, i));
                    store(i, _mm256_mul_ps(v, sigmoid(v)));
                }
            }
            Fast::BiasResidual(o, r, relu) => {
                let z = _mm256_setzero_ps();
                for (i, &v) in vs.iter().enumerate() {
                    let v = _mm256_add_ps(_mm256_add_ps(v, channel(o, i)), tensor(r, i));
                    store(i, if relu { _mm256_max_ps(z, v) } else { v });
                }
            }
            Fast::GeluErf(o, div, one, half) => {
                let v = |i: usize| match o {
                    Some(o) => _mm256_add_ps(vs[i], channel(o, i)),
                    None => vs[i],
                };
                let pairs = vs.len() / 2 * 2;
                if self.avx512 {
                    // SAFETY: the CPU has AVX-512F (`Post::avx512`).
                    unsafe { gelu_pairs(pairs, v, (div, one, half), store) };
                } else {
                    // Two vectors at a time: each is one long dependent chain (a division, two
                    // polynomials), and side by side they run 1.25x faster than one after the
                    // other.
                    for i in (0..pairs).step_by(2) {
                        let (a, b) = (
                            gelu_erf(v(i), div, one, half),
                            gelu_erf(v(i + 1), div, one, half),
                        );
                        store(i, a);
                        store(i + 1, b);
                    }
                }
                if pairs < vs.len() {
                    store(pairs, gelu_erf(v(pairs), div, one, half));
                }
            }
        }
    }

    /// [`Bound::store`] for a register tile of a channel-blocked output: `acc[p][b]` holds
    /// channels `chan + 8b..` of pixel `p`, stored at `y + b * stride + 8p` (element `base +`
    /// the same offset); pixels `..n` are stored. The common forms load each per-channel
    /// operand once per block, not once per vector, and a whole tile (`n == PX`) is a loop of
    /// constant length that unrolls (no index arithmetic per vector); the rest go through
    /// [`Bound::store`]. LLVM does not inline this into the kernels: the callers pass a copy
    /// of their sums, so that the sums they accumulate stay in registers.
    ///
    /// # Safety
    /// As for [`Bound::store`], for every vector stored.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn store_tile<const NB: usize, const PX: usize>(
        &self,
        acc: &[[__m256; NB]; PX],
        n: usize,
        chan: usize,
        stride: usize,
        y: *mut f32,
        base: usize,
    ) {
        // Every pixel's blocks through `f`, a whole tile's in a loop of constant length.
        #[inline(always)]
        fn tile<const NB: usize, const PX: usize>(
            acc: &[[__m256; NB]; PX],
            n: usize,
            f: impl Fn(usize, usize, __m256),
        ) {
            if n == PX {
                for (p, a) in acc.iter().enumerate() {
                    (0..NB).for_each(|b| f(p, b, a[b]));
                }
            } else {
                for (p, a) in acc.iter().enumerate().take(n) {
                    (0..NB).for_each(|b| f(p, b, a[b]));
                }
            }
        }
        let at = |p: usize, b: usize| b * stride + p * B;
        // SAFETY (every load and store): the caller's contract.
        let store = |p: usize, b: usize, v: __m256| unsafe { _mm256_storeu_ps(y.add(at(p, b)), v) };
        let channel = |o: usize| -> [__m256; NB] {
            std::array::from_fn(|b| unsafe {
                _mm256_loadu_ps((*self.ptrs.get().add(o)).add(chan + b * B))
            })
        };
        let tensor = |o: usize, p: usize, b: usize| unsafe {
            _mm256_loadu_ps((*self.ptrs.get().add(o)).add(base + at(p, b)))
        };
        let z = _mm256_setzero_ps();
        match self.fast {
            Some(Fast::Plain) => tile(acc, n, store),
            Some(Fast::Bias(o)) => {
                let c = channel(o);
                tile(acc, n, |p, b, v| store(p, b, _mm256_add_ps(v, c[b])));
            }
            Some(Fast::BiasRelu(o)) => {
                let c = channel(o);
                tile(acc, n, |p, b, v| {
                    store(p, b, _mm256_max_ps(z, _mm256_add_ps(v, c[b])))
                });
            }
            Some(Fast::BiasClamp(o, lo, hi)) => {
                let (c, lo, hi) = (channel(o), _mm256_set1_ps(lo), _mm256_set1_ps(hi));
                tile(acc, n, |p, b, v| {
                    let v = _mm256_max_ps(lo, _mm256_add_ps(v, c[b]));
                    store(p, b, _mm256_min_ps(hi, v))
                });
            }
            Some(Fast::BiasSilu(o)) => {
                let c = channel(o);
                tile(acc, n, |p, b, v| {
                    let v = _mm256_add_ps(v, c[b]);
                    store(p, b, _mm256_mul_ps(v, sigmoid(v)))
                });
            }
            Some(Fast::BiasResidual(o, r, relu)) => {
                let c = channel(o);
                tile(acc, n, |p, b, v| {
                    let v = _mm256_add_ps(_mm256_add_ps(v, c[b]), tensor(r, p, b));
                    store(p, b, if relu { _mm256_max_ps(z, v) } else { v })
                });
            }
            _ => {
                let mut vs = [z; 2 * P_MAX];
                for (i, v) in vs.iter_mut().enumerate().take(n * NB) {
                    *v = acc[i / NB][i % NB];
                }
                let chan = |i: usize| chan + (i % NB) * B;
                let at = |i: usize| at(i / NB, i % NB);
                // SAFETY: the caller's contract.
                unsafe { self.store(&mut vs[..n * NB], chan, at, y, base) }
            }
        }
    }

    /// [`Bound::store_tile`] for the 512-bit tiles: `acc[p][j]` holds pair `j` of pixel `p`,
    /// channels `chan + 16j..` (two blocks), stored at `y + 2j * stride + 8p` and `y + (2j +
    /// 1) * stride + 8p`; pixels `..n`. The common forms but GELU run on sixteen lanes at
    /// once, with the same steps and so the same bits as on eight; for the others this stores
    /// nothing and returns `false`, and the caller stores the halves through
    /// [`Bound::store_tile`].
    ///
    /// # Safety
    /// As for [`Bound::store`], for every vector stored; the CPU has AVX-512F.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn store_tile512<const NP: usize, const PX: usize>(
        &self,
        acc: &[[__m512; NP]; PX],
        n: usize,
        chan: usize,
        stride: usize,
        y: *mut f32,
        base: usize,
    ) -> bool {
        // Every pixel's pairs through `f`, a whole tile's in a loop of constant length.
        #[inline(always)]
        fn tile<const NP: usize, const PX: usize>(
            acc: &[[__m512; NP]; PX],
            n: usize,
            f: impl Fn(usize, usize, __m512),
        ) {
            if n == PX {
                for (p, a) in acc.iter().enumerate() {
                    (0..NP).for_each(|j| f(p, j, a[j]));
                }
            } else {
                for (p, a) in acc.iter().enumerate().take(n) {
                    (0..NP).for_each(|j| f(p, j, a[j]));
                }
            }
        }
        let at = |p: usize, j: usize, h: usize| (2 * j + h) * stride + p * B;
        // SAFETY (every load and store): the caller's contract.
        let store = |p: usize, j: usize, v: __m512| unsafe {
            _mm256_storeu_ps(y.add(at(p, j, 0)), _mm512_castps512_ps256(v));
            _mm256_storeu_ps(y.add(at(p, j, 1)), high(v));
        };
        let channel = |o: usize| -> [__m512; NP] {
            std::array::from_fn(|j| unsafe {
                _mm512_loadu_ps((*self.ptrs.get().add(o)).add(chan + j * 2 * B))
            })
        };
        let tensor = |o: usize, p: usize, j: usize| unsafe {
            let t = (*self.ptrs.get().add(o)).add(base);
            join(
                _mm256_loadu_ps(t.add(at(p, j, 0))),
                _mm256_loadu_ps(t.add(at(p, j, 1))),
            )
        };
        let z = _mm512_setzero_ps();
        match self.fast {
            Some(Fast::Plain) => tile(acc, n, store),
            Some(Fast::Bias(o)) => {
                let c = channel(o);
                tile(acc, n, |p, j, v| store(p, j, _mm512_add_ps(v, c[j])));
            }
            Some(Fast::BiasRelu(o)) => {
                let c = channel(o);
                tile(acc, n, |p, j, v| {
                    store(p, j, _mm512_max_ps(z, _mm512_add_ps(v, c[j])))
                });
            }
            Some(Fast::BiasClamp(o, lo, hi)) => {
                let (c, lo, hi) = (channel(o), _mm512_set1_ps(lo), _mm512_set1_ps(hi));
                tile(acc, n, |p, j, v| {
                    let v = _mm512_max_ps(lo, _mm512_add_ps(v, c[j]));
                    store(p, j, _mm512_min_ps(hi, v))
                });
            }
            Some(Fast::BiasSilu(o)) => {
                let c = channel(o);
                tile(acc, n, |p, j, v| {
                    let v = _mm512_add_ps(v, c[j]);
                    store(p, j, _mm512_mul_ps(v, sigmoid512(v)))
                });
            }
            Some(Fast::BiasResidual(o, r, relu)) => {
                let c = channel(o);
                tile(acc, n, |p, j, v| {
                    let v = _mm512_add_ps(_mm512_add_ps(v, c[j]), tensor(r, p, j));
                    store(p, j, if relu { _mm512_max_ps(z, v) } else { v })
                });
            }
            _ => return false,
        }
        true
    }

    /// Applies the epilogue to vectors `vs`: vector `i` is of channels `chan(i)..` (the offset
    /// into a per-channel operand) at element offset `at(i)` of the output; `load` reads an
    /// operand's vector. One step at a time over all of them, so the dispatch on the step is
    /// paid once per step, not once per vector.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; the operands hold what [`Post::of`] checked; `load` may read
    /// a per-channel operand's vector at `chan(i)` and a tensor operand's at `at(i)`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub(crate) unsafe fn apply(
        &self,
        vs: &mut [__m256],
        chan: impl Fn(usize) -> usize,
        at: impl Fn(usize) -> usize,
        load: impl Fn(*const f32) -> __m256,
    ) {
        for &op in self.ops {
            // SAFETY (every arm): the caller's contract.
            match op {
                PostOp::Channel { mul, operand } => {
                    let base = unsafe { *self.ptrs.get().add(operand) };
                    for (i, v) in vs.iter_mut().enumerate() {
                        let c = load(unsafe { base.add(chan(i)) });
                        *v = if mul {
                            _mm256_mul_ps(*v, c)
                        } else {
                            _mm256_add_ps(*v, c)
                        };
                    }
                }
                PostOp::Tensor { operand } => {
                    let base = unsafe { *self.ptrs.get().add(operand) };
                    for (i, v) in vs.iter_mut().enumerate() {
                        *v = _mm256_add_ps(*v, load(unsafe { base.add(at(i)) }));
                    }
                }
                // `maxps`/`minps` give their second operand when either is NaN.
                PostOp::Max(c) => {
                    let c = _mm256_set1_ps(c);
                    vs.iter_mut().for_each(|v| *v = _mm256_max_ps(c, *v));
                }
                PostOp::Min(c) => {
                    let c = _mm256_set1_ps(c);
                    vs.iter_mut().for_each(|v| *v = _mm256_min_ps(c, *v));
                }
                PostOp::Relu => {
                    let z = _mm256_setzero_ps();
                    vs.iter_mut().for_each(|v| *v = _mm256_max_ps(z, *v));
                }
                PostOp::Sigmoid => vs.iter_mut().for_each(|v| *v = sigmoid(*v)),
                PostOp::Silu => vs
                    .iter_mut()
                    .for_each(|v| *v = _mm256_mul_ps(*v, sigmoid(*v))),
                PostOp::Gelu => vs.iter_mut().for_each(|v| *v = gelu(*v)),
                PostOp::GeluErf { div, one, half } => vs
                    .iter_mut()
                    .for_each(|v| *v = gelu_erf(*v, div, one, half)),
            }
        }
    }

    /// Applies the epilogue in place to elements `range` of a row-major output at `y` whose
    /// rows (of channels) are `n` long ([`Layout::Rows`]): up to eight vectors at a time
    /// within a row, the last few elements of a row through masked loads and stores.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; `y` holds the output, `range` lies in it, and the operands
    /// hold what [`Post::of`] checked.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn rows(&self, y: *mut f32, range: std::ops::Range<usize>, n: usize) {
        const V: usize = 8;
        let mut s = range.start;
        while s < range.end {
            let end = (s - s % n + n).min(range.end);
            let mut at = s;
            while at + B <= end {
                let k = ((end - at) / B).min(V);
                let mut vs = [_mm256_setzero_ps(); V];
                // SAFETY (loads and the store): elements at.. at + 8k lie in this row of the
                // output (the caller's contract); per-channel operands hold n channels.
                unsafe {
                    for (j, v) in vs.iter_mut().enumerate().take(k) {
                        *v = _mm256_loadu_ps(y.add(at + j * B));
                    }
                    let c0 = at % n;
                    self.store(&mut vs[..k], |j| c0 + j * B, |j| j * B, y.add(at), at);
                }
                at += k * B;
            }
            if at < end {
                // The row's last elements: every load and the store masked to them.
                let m = first(end - at);
                let c0 = at % n;
                // SAFETY: as above; the masked lanes are neither read nor written.
                unsafe {
                    let mut v = [_mm256_maskload_ps(y.add(at), m)];
                    self.apply(&mut v, |_| c0, |_| at, |p| _mm256_maskload_ps(p, m));
                    _mm256_maskstore_ps(y.add(at), m, v[0]);
                }
            }
            s = end;
        }
    }
}

/// A bias and SiLU on vectors `vs` (an even number), two at a time on sixteen lanes with the
/// steps of eight (so the same bits): vector `i` plus `channel(i)`, handed to `store(i, ..)`.
/// Two such pairs at once: each sigmoid is one long dependent chain ending in a division, and
/// side by side they overlap (eight 5x5 depthwise layers with SiLU, 240 channels at 28x28, one
/// thread on a Xeon: 2.63 -> 2.53 ms; two threads 1.40 -> 1.29).
///
/// # Safety
/// The CPU has AVX-512F, AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn bias_silu_pairs(
    vs: &[__m256],
    channel: impl Fn(usize) -> __m256,
    store: impl Fn(usize, __m256),
) {
    // Vectors i and i + 1 plus their channels' biases, on sixteen lanes.
    let biased = |i: usize| {
        join(
            _mm256_add_ps(vs[i], channel(i)),
            _mm256_add_ps(vs[i + 1], channel(i + 1)),
        )
    };
    let put = |i: usize, r: __m512| {
        store(i, _mm512_castps512_ps256(r));
        store(i + 1, high(r));
    };
    let quads = vs.len() / 4 * 4;
    for i in (0..quads).step_by(4) {
        let (u, v) = (biased(i), biased(i + 2));
        let (su, sv) = (sigmoid512(u), sigmoid512(v));
        put(i, _mm512_mul_ps(u, su));
        put(i + 2, _mm512_mul_ps(v, sv));
    }
    if quads + 2 <= vs.len() {
        let u = biased(quads);
        put(quads, _mm512_mul_ps(u, sigmoid512(u)));
    }
}

/// GELU as PyTorch exports it ([`gelu_erf512`]) on vectors `0..n` (an even number, vector `i`
/// given by `v(i)`), two at a time on sixteen lanes with the steps of eight (so the same bits),
/// each result handed to `store(i, ..)`.
///
/// # Safety
/// The CPU has AVX-512F, AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn gelu_pairs(
    n: usize,
    v: impl Fn(usize) -> __m256,
    (div, one, half): (f32, f32, f32),
    store: impl Fn(usize, __m256),
) {
    for i in (0..n).step_by(2) {
        let g = gelu_erf512(join(v(i), v(i + 1)), div, one, half);
        store(i, _mm512_castps512_ps256(g));
        store(i + 1, high(g));
    }
}

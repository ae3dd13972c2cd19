//! Winograd's F(2x2, 3x3) for blocked 3x3 convolutions at stride 1 (ResNet's, GoogLeNet's,
//! DenseNet's and most of Inception's and VGG's multiply-adds), in f32 with AVX2 and FMA.
//!
//! Each 2x2 tile of outputs of a channel pair is `Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A`, `d` the 4x4 input
//! patch under the tile and `g` the 3x3 filter: 16 products per tile and channel pair instead
//! of 36, 2.25 times fewer multiply-adds than the direct kernel. Summed over input channels,
//! the 16 elementwise products become 16 independent matrix products: for tile position `ξ`,
//! `M[ξ] (tiles x O) = V[ξ] (tiles x C) · U[ξ] (C x O)`, which our GEMM runs at its full rate.
//!
//! 1. The filter transform `U = G g Gᵀ` is computed at compile time (f64, rounded once) and
//!    each `U[ξ]` packed for the GEMM.
//! 2. The input transform `V = Bᵀ d B` reads each 4x4 patch of eight channels (zeros outside
//!    the image: the convolution's padding) and writes its 16 vectors to the rows of the 16
//!    matrices `V[ξ]`.
//! 3. The 16 products, split among the threads.
//! 4. The output transform `Aᵀ m A` gives the tile's four pixels, stored through the step's
//!    epilogue (bias, residual, activation) like the direct kernel's tiles.
//!
//! The transforms only add and subtract (`B` and `A` hold 0 and ±1; `G`'s halves are in the
//! constant filter), so the results differ from the direct sum by rounding only: measured
//! within a few units of the last place of the largest term, like a GEMM's summation order.
//! Layers whose transformed filters fit in L2 go through in bands of tile rows, one thread a
//! band; the others in passes of tile rows across the batch, each a few MiB of `V` and `M`
//! (so late layers' few tiles still make GEMMs worth running, and a large image does not
//! need hundreds of MiB), their products split among the threads. The matrices live in a
//! buffer each thread keeps.

use super::{Finish, SendPtr};
use crate::cpu::post::Bound;
use crate::cpu::sgemm::{self, Isa, Mat, PackedB};
#[cfg(target_arch = "x86_64")]
use crate::cpu::simd::first as lanes;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;
use std::cell::RefCell;

/// Channels per block.
const B: usize = 8;

/// Positions of a 4x4 input tile, one matrix product each.
const XI: usize = 16;

/// Bytes of `V` and `M` a pass of tile rows may take, at most (but at least one tile row).
const PASS_BYTES: usize = 8 << 20;

/// The L2 cache per core the bands are sized for (Zen 3 and most Intel client cores have
/// 512 KiB to 2 MiB).
const L2: usize = 512 << 10;

/// The sizes [`Winograd`] needs: images, input channels and plane, output channels and plane,
/// top and left padding.
#[derive(Clone, Copy)]
pub(super) struct Shape {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub o: usize,
    pub oh: usize,
    pub ow: usize,
    pub pt: usize,
    pub pl: usize,
}

impl Shape {
    /// The input and output channels rounded up to whole blocks: the widths of `V` and `M`.
    fn padded(&self) -> (usize, usize) {
        (self.c.next_multiple_of(B), self.o.next_multiple_of(B))
    }
}

/// A 3x3 convolution at stride 1 with its filter transformed and packed.
pub(super) struct Winograd {
    s: Shape,
    isa: Isa,
    /// `U[ξ]`, `[C rounded up to blocks, O rounded up to blocks]`, packed for the GEMM.
    u: Vec<PackedB>,
    /// Tile rows and columns of an image.
    th: usize,
    tw: usize,
    /// Tile rows per pass (when run in passes).
    pass: usize,
    /// Tile rows per band, when run in bands.
    band: Option<usize>,
}

impl Winograd {
    /// Whether F(2x2, 3x3) is worth running for a convolution of `s` rather than the direct
    /// kernel, by a count of the work in multiply-adds: its products (16 per tile and channel
    /// pair, against 36 per 2x2 outputs directly) plus its transforms, each float of `V` and `M`
    /// counted as 25 (they go through memory: written, packed by the GEMM, read back). The
    /// weight is what ResNet-18's layers measured on a Zen 3 (the transforms took 0.37 of the
    /// direct kernel's time at 64 channels, 0.16 at 128); Winograd must come out 20% ahead,
    /// which keeps DenseNet's 3x3 layers of 128 to 32 channels direct (Winograd was 1.2-1.35x
    /// slower there: few output channels leave the input transform unamortised).
    ///
    /// Each also reads its filter once a run, from L3 or memory where a model's filters do not
    /// stay in cache between runs: `U` is 16/9 of the filter's size, and a small plane (few
    /// tiles) reuses each weight too little to hide that. Each byte of filter counts three
    /// multiply-adds (about what a core computes while it streams a byte from L3). ResNet-18's
    /// last stage (512 channels at 7x7, 16 tiles) then runs direct: on an Intel Xeon (AVX-512)
    /// its three 3x3 layers took 1.36-1.44 ms each as Winograd, 0.93-1.04 direct.
    pub(super) fn pays(s: &Shape) -> bool {
        if s.c < 16 || s.o < 16 {
            return false;
        }
        let (cp, op) = s.padded();
        let tiles = s.n * s.oh.div_ceil(2) * s.ow.div_ceil(2);
        let direct = 9 * s.c * s.o * (s.n * s.oh * s.ow + 3 * 4);
        let winograd = XI * tiles * (cp * op + 25 * (cp + op)) + XI * cp * op * 3 * 4;
        5 * winograd < 4 * direct
    }

    /// Transforms and packs filter `w` (`[O, C, 3, 3]`) for `isa`'s GEMM.
    pub(super) fn new(s: Shape, isa: Isa, w: &[f32]) -> Winograd {
        let (cp, op) = s.padded();
        // U[ξ][ci][oc] = (G g Gᵀ)[ξ] with G = [[1, 0, 0], [½, ½, ½], [½, -½, ½], [0, 0, 1]].
        let mut u = vec![0f32; XI * cp * op];
        for oc in 0..s.o {
            for ci in 0..s.c {
                let g = &w[(oc * s.c + ci) * 9..][..9];
                let g = |r: usize, c: usize| g[r * 3 + c] as f64;
                // G g: 4x3.
                let gg: [[f64; 3]; 4] = std::array::from_fn(|r| {
                    std::array::from_fn(|c| match r {
                        0 => g(0, c),
                        1 => 0.5 * (g(0, c) + g(1, c) + g(2, c)),
                        2 => 0.5 * (g(0, c) - g(1, c) + g(2, c)),
                        _ => g(2, c),
                    })
                });
                for (r, row) in gg.iter().enumerate() {
                    let t = [
                        row[0],
                        0.5 * (row[0] + row[1] + row[2]),
                        0.5 * (row[0] - row[1] + row[2]),
                        row[2],
                    ];
                    for (c, &v) in t.iter().enumerate() {
                        u[((r * 4 + c) * cp + ci) * op + oc] = v as f32;
                    }
                }
            }
        }
        let packed = (0..XI)
            .map(|xi| {
                let m = Mat {
                    ptr: u[xi * cp * op..].as_ptr(),
                    rs: op,
                    cs: 1,
                };
                // SAFETY: u[xi] holds a cp x op row-major matrix.
                unsafe { PackedB::new(isa, cp, op, m) }
            })
            .collect();
        let (th, tw) = (s.oh.div_ceil(2), s.ow.div_ceil(2));
        let pass = (PASS_BYTES / (XI * (cp + op) * 4 * tw.max(1))).clamp(1, (s.n * th).max(1));
        // Bands when the 16 U[ξ] fit in half an L2 (64 channels each side: 256 KiB) and a
        // band's V and M in a quarter, with enough bands for four pieces of work a thread.
        let fits = XI * cp * op * 4 <= L2 / 2;
        let rows = (L2 / 4 / (XI * (cp + op) * 4 * tw.max(1))).max(1);
        let band =
            (fits && s.n * th.div_ceil(rows) >= 4 * crate::cpu::pool::threads()).then_some(rows);
        Winograd {
            s,
            isa,
            u: packed,
            th,
            tw,
            pass,
            band,
        }
    }

    /// Computes the convolution of blocked input `x` into blocked output `y` through `post`,
    /// telling `finish` of each piece of the output once it is final.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; `x` and `y` hold the step's blocked input and output.
    pub(super) unsafe fn run(&self, x: *const f32, y: *mut f32, post: Bound, finish: Finish) {
        // SAFETY: x is only read, and each piece of work writes its own outputs.
        let (x, y) = unsafe { (SendPtr::new(x as *mut f32), SendPtr::new(y)) };
        // SAFETY: the caller's contract.
        unsafe {
            match self.band {
                Some(band) => self.run_bands(band, x, y, post, finish),
                None => self.run_passes(x, y, post, finish),
            }
        }
    }

    /// [`Winograd::run`] in bands of `band` tile rows of an image, each transformed,
    /// multiplied and transformed back by one thread in its own buffer, which stays in its L2
    /// cache (as do the 16 `U[ξ]`, which every band reads).
    ///
    /// # Safety
    /// As for [`Winograd::run`].
    unsafe fn run_bands(
        &self,
        band: usize,
        x: SendPtr<*mut f32>,
        y: SendPtr<*mut f32>,
        post: Bound,
        finish: Finish,
    ) {
        let ((cp, op), blocks) = (self.s.padded(), self.s.o.div_ceil(B));
        let bands = self.th.div_ceil(band);
        crate::cpu::pool::for_each(self.s.n * bands, &|i| {
            let (img, rows) = (
                i / bands,
                (i % bands) * band..((i % bands + 1) * band).min(self.th),
            );
            let tiles = rows.len() * self.tw;
            with_scratch(XI * tiles * (cp + op), |v| {
                // SAFETY: V takes XI * tiles * cp floats of this thread's buffer, M the next
                // XI * tiles * op; the rows of x and y are image img's.
                unsafe {
                    let m = v.add(XI * tiles * cp);
                    for (k, ty) in rows.clone().enumerate() {
                        self.input_row(x.get(), img, ty, k * self.tw, tiles, v);
                    }
                    for xi in 0..XI {
                        self.multiply(xi, tiles, v, m);
                    }
                    for b in 0..blocks {
                        for (k, ty) in rows.clone().enumerate() {
                            self.output_row(m, img, ty, b, k * self.tw, tiles, y.get(), post);
                        }
                    }
                }
            });
            if let Some(finish) = finish {
                let Shape { oh, ow, .. } = self.s;
                let out = 2 * rows.start..(2 * rows.end).min(oh);
                for b in 0..blocks {
                    let plane = ((img * blocks + b) * oh) * ow * B;
                    finish(plane + out.start * ow * B..plane + out.end * ow * B);
                }
            }
        });
    }

    /// [`Winograd::run`] in passes of tile rows across the batch: the input transform of a
    /// pass's rows, then its 16 products split among the threads, then the output transform.
    /// For layers whose `U[ξ]` are too large to read once per band.
    ///
    /// # Safety
    /// As for [`Winograd::run`].
    unsafe fn run_passes(
        &self,
        x: SendPtr<*mut f32>,
        y: SendPtr<*mut f32>,
        post: Bound,
        finish: Finish,
    ) {
        let ((cp, op), blocks) = (self.s.padded(), self.s.o.div_ceil(B));
        let all = self.s.n * self.th;
        with_scratch(XI * self.pass.min(all) * self.tw * (cp + op), |v| {
            // SAFETY: the buffer outlives the calls below; each phase's items write disjoint
            // parts of it.
            let v = unsafe { SendPtr::new(v) };
            for first in (0..all).step_by(self.pass) {
                // Tile rows first.. of the batch (row r is image r / th's row r % th).
                let rows = self.pass.min(all - first);
                let tiles = rows * self.tw;
                // SAFETY: V takes XI * tiles * cp floats, M the next XI * tiles * op.
                let m = unsafe { SendPtr::new(v.get().add(XI * tiles * cp)) };
                let at = |k: usize| {
                    let r = first + k;
                    (r / self.th, r % self.th, k * self.tw)
                };
                crate::cpu::pool::for_each(rows, &|k| {
                    let (img, ty, base) = at(k);
                    // SAFETY: the pass's tile row k, whose V rows only it writes.
                    unsafe { self.input_row(x.get(), img, ty, base, tiles, v.get()) }
                });
                crate::cpu::pool::for_each(XI, &|xi| {
                    // SAFETY: V[xi] and M[xi] of the pass, M[xi] written by this item only.
                    unsafe { self.multiply(xi, tiles, v.get(), m.get()) }
                });
                crate::cpu::pool::for_each(rows * blocks, &|i| {
                    let (k, b) = (i / blocks, i % blocks);
                    let (img, ty, base) = at(k);
                    // SAFETY: tile row k's outputs of block b, which only it writes.
                    unsafe { self.output_row(m.get(), img, ty, b, base, tiles, y.get(), post) };
                    if let Some(finish) = finish {
                        let Shape { oh, ow, .. } = self.s;
                        let plane = ((img * blocks + b) * oh) * ow * B;
                        let rows = 2 * ty..(2 * ty + 2).min(oh);
                        finish(plane + rows.start * ow * B..plane + rows.end * ow * B);
                    }
                });
            }
        });
    }

    /// `M[ξ] = V[ξ] · U[ξ]` for `tiles` rows, on this thread.
    ///
    /// # Safety
    /// `v` holds `XI` matrices `tiles x cp` and `m` `XI` matrices `tiles x op`, row-major.
    unsafe fn multiply(&self, xi: usize, tiles: usize, v: *const f32, m: *mut f32) {
        let (cp, op) = self.s.padded();
        let a = Mat {
            // SAFETY (a pointer computation): the caller's contract.
            ptr: v.wrapping_add(xi * tiles * cp),
            rs: cp,
            cs: 1,
        };
        // SAFETY: the caller's contract; U[xi] is cp x op, packed for self.isa.
        unsafe {
            sgemm::product(
                self.isa,
                tiles,
                op,
                cp,
                sgemm::A::Mat(a),
                sgemm::B::Packed(&self.u[xi]),
                m.add(xi * tiles * op),
                op,
                false,
                1,
                None,
            )
        }
    }

    /// The input transform of tile row `ty` of image `img`: for each tile `tx` and input
    /// block, `Bᵀ d B` into row `base + tx` of the 16 matrices `V[ξ]` (`tiles x cp`, at `v`).
    ///
    /// # Safety
    /// As for [`Winograd::run`]; `v` holds the pass's or band's `V`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn input_row(
        &self,
        x: *const f32,
        img: usize,
        ty: usize,
        base: usize,
        tiles: usize,
        v: *mut f32,
    ) {
        let Shape {
            c, h, w, pt, pl, ..
        } = self.s;
        let (cb, (cp, _)) = (c.div_ceil(B), self.s.padded());
        // Lanes of the last block past the channels may hold anything (NaN from an
        // elementwise op): zero them, or NaN * 0 would reach every output.
        let tail = _mm256_castsi256_ps(lanes(c - (cb - 1) * B));
        let zero = _mm256_setzero_ps();
        // Input rows and columns under the tile, as offsets, if inside the image.
        let iy: [Option<usize>; 4] =
            std::array::from_fn(|r| (2 * ty + r).checked_sub(pt).filter(|&i| i < h));
        for tx in 0..self.tw {
            let ix: [Option<usize>; 4] =
                std::array::from_fn(|k| (2 * tx + k).checked_sub(pl).filter(|&i| i < w));
            let t = base + tx;
            for b in 0..cb {
                let plane = ((img * cb + b) * h) * w;
                let mut d = [[zero; 4]; 4];
                for (r, yr) in iy.iter().enumerate() {
                    let Some(yr) = yr else { continue };
                    for (k, xk) in ix.iter().enumerate() {
                        if let Some(xk) = xk {
                            // SAFETY: pixel (yr, xk) of block b of image img lies in x.
                            d[r][k] = unsafe { _mm256_loadu_ps(x.add((plane + yr * w + xk) * B)) };
                        }
                    }
                }
                if b + 1 == cb {
                    for e in d.iter_mut().flatten() {
                        *e = _mm256_and_ps(*e, tail);
                    }
                }
                // Bᵀ d: rows d0 - d2, d1 + d2, d2 - d1, d1 - d3; then the same on columns.
                let rows = [
                    sub4(&d[0], &d[2]),
                    add4(&d[1], &d[2]),
                    sub4(&d[2], &d[1]),
                    sub4(&d[1], &d[3]),
                ];
                for (r, q) in rows.iter().enumerate() {
                    let cols = [
                        _mm256_sub_ps(q[0], q[2]),
                        _mm256_add_ps(q[1], q[2]),
                        _mm256_sub_ps(q[2], q[1]),
                        _mm256_sub_ps(q[1], q[3]),
                    ];
                    for (k, &e) in cols.iter().enumerate() {
                        let xi = r * 4 + k;
                        // SAFETY: row t, block b of V[xi] lies in the pass's V.
                        unsafe { _mm256_storeu_ps(v.add((xi * tiles + t) * cp + b * B), e) };
                    }
                }
            }
        }
    }

    /// The output transform of tile row `ty` of image `img`, output block `b`: `Aᵀ m A` of
    /// each tile's 16 products (rows `base + tx` of `M[ξ]`, `tiles x op` at `m`) into its (up
    /// to) four pixels, through the epilogue.
    ///
    /// # Safety
    /// As for [`Winograd::run`]; `m` holds the pass's or band's `M`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn output_row(
        &self,
        m: *const f32,
        img: usize,
        ty: usize,
        b: usize,
        base: usize,
        tiles: usize,
        y: *mut f32,
        post: Bound,
    ) {
        let Shape { o, oh, ow, .. } = self.s;
        let (ob, (_, op)) = (o.div_ceil(B), self.s.padded());
        let keep = _mm256_castsi256_ps(lanes(o - b * B));
        let plane = ((img * ob + b) * oh) * ow * B;
        let rows = (oh - 2 * ty).min(2);
        for tx in 0..self.tw {
            let t = base + tx;
            // SAFETY: row t, block b of M[xi] lies in the pass's M.
            let q: [__m256; XI] = std::array::from_fn(|xi| unsafe {
                _mm256_loadu_ps(m.add((xi * tiles + t) * op + b * B))
            });
            // Aᵀ m: rows m0 + m1 + m2 and m1 - m2 - m3 (each a row of four); then columns.
            let s0: [__m256; 4] =
                std::array::from_fn(|k| _mm256_add_ps(_mm256_add_ps(q[k], q[4 + k]), q[8 + k]));
            let s1: [__m256; 4] = std::array::from_fn(|k| {
                _mm256_sub_ps(_mm256_sub_ps(q[4 + k], q[8 + k]), q[12 + k])
            });
            let cols = (ow - 2 * tx).min(2);
            let mut vs = [_mm256_setzero_ps(); 4];
            let mut at = [0usize; 4];
            let mut count = 0;
            for (r, s) in [s0, s1].iter().enumerate().take(rows) {
                let pair = [
                    _mm256_add_ps(_mm256_add_ps(s[0], s[1]), s[2]),
                    _mm256_sub_ps(_mm256_sub_ps(s[1], s[2]), s[3]),
                ];
                for (k, &e) in pair.iter().enumerate().take(cols) {
                    vs[count] = _mm256_and_ps(e, keep);
                    at[count] = plane + ((2 * ty + r) * ow + 2 * tx + k) * B;
                    count += 1;
                }
            }
            // SAFETY: each `at` is a pixel of block b in the output; the epilogue's operands
            // cover the output.
            unsafe { post.store(&mut vs[..count], |_| b * B, |i| at[i], y, 0) };
        }
    }

    /// Never called: `NchwcConv::new` declines off x86-64.
    #[cfg(not(target_arch = "x86_64"))]
    #[allow(clippy::too_many_arguments)]
    unsafe fn input_row(&self, _: *const f32, _: usize, _: usize, _: usize, _: usize, _: *mut f32) {
        unreachable!("no AVX2 off x86-64")
    }

    /// Never called: `NchwcConv::new` declines off x86-64.
    #[cfg(not(target_arch = "x86_64"))]
    #[allow(clippy::too_many_arguments)]
    unsafe fn output_row(
        &self,
        _: *const f32,
        _: usize,
        _: usize,
        _: usize,
        _: usize,
        _: usize,
        _: *mut f32,
        _: Bound,
    ) {
        unreachable!("no AVX2 off x86-64")
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn add4(a: &[__m256; 4], b: &[__m256; 4]) -> [__m256; 4] {
    std::array::from_fn(|k| _mm256_add_ps(a[k], b[k]))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn sub4(a: &[__m256; 4], b: &[__m256; 4]) -> [__m256; 4] {
    std::array::from_fn(|k| _mm256_sub_ps(a[k], b[k]))
}

thread_local! {
    /// Each thread's `V` and `M` matrices of one pass or band.
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on this thread's scratch, grown to at least `len` floats.
fn with_scratch<R>(len: usize, f: impl FnOnce(*mut f32) -> R) -> R {
    SCRATCH.with(|buf| {
        let mut buf = buf.borrow_mut();
        if buf.len() < len {
            buf.resize(len, 0.0);
        }
        f(buf.as_mut_ptr())
    })
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use crate::cpu::post::Post;

    /// The convolution in f64 loops: `x` `[n, c, h, w]`, `w` `[o, c, 3, 3]`, padding `pads`
    /// (top, left, bottom, right); the output `[n, o, oh, ow]`.
    fn direct(s: &Shape, x: &[f32], w: &[f32]) -> Vec<f64> {
        let mut y = vec![0f64; s.n * s.o * s.oh * s.ow];
        for img in 0..s.n {
            for oc in 0..s.o {
                for oy in 0..s.oh {
                    for ox in 0..s.ow {
                        let mut acc = 0f64;
                        for ci in 0..s.c {
                            for t in 0..9 {
                                let (iy, ix) = (
                                    (oy + t / 3).wrapping_sub(s.pt),
                                    (ox + t % 3).wrapping_sub(s.pl),
                                );
                                if iy < s.h && ix < s.w {
                                    let xv = x[((img * s.c + ci) * s.h + iy) * s.w + ix] as f64;
                                    acc += xv * w[(oc * s.c + ci) * 9 + t] as f64;
                                }
                            }
                        }
                        y[((img * s.o + oc) * s.oh + oy) * s.ow + ox] = acc;
                    }
                }
            }
        }
        y
    }

    /// The cost model on ResNet's 3x3 layers: Winograd through the third stage, the direct
    /// kernel for the last stage's 16 tiles at batch 1 (its transformed filter, 16.8 MB, read
    /// each run for few products), Winograd there again at batch 8; too few channels never.
    #[test]
    fn pays_where_the_filter_is_reused() {
        let shape = |n, c, hw| Shape {
            n,
            c,
            h: hw,
            w: hw,
            o: c,
            oh: hw,
            ow: hw,
            pt: 1,
            pl: 1,
        };
        for (c, hw) in [(64, 56), (128, 28), (256, 14)] {
            assert!(
                Winograd::pays(&shape(1, c, hw)),
                "{c} channels at {hw}x{hw}"
            );
        }
        assert!(!Winograd::pays(&shape(1, 512, 7)));
        assert!(Winograd::pays(&shape(8, 512, 7)));
        assert!(!Winograd::pays(&shape(1, 8, 56)));
    }

    /// Runs F(2x2, 3x3) on the shapes its paths differ on, whether or not the cost model
    /// would pick it, against the direct sum: partial input and output blocks (the input's
    /// padding lanes hold -inf, which must not reach an output), odd planes (partial tiles),
    /// uneven padding, none, 65 images of four tiles; each in one pass over the batch, in
    /// passes of three tile rows (which split images), and in bands of one and of four tile
    /// rows. Output padding lanes must be zero.
    #[test]
    fn matches_the_direct_sum() {
        assert!(
            is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"),
            "the Winograd kernel needs AVX2 and FMA"
        );
        // (n, c, h, w, o, [top, left, bottom, right] padding)
        let cases = [
            (1, 20, 9, 7, 12, [1, 2, 0, 1]),
            (2, 16, 5, 6, 24, [0, 0, 0, 0]),
            (65, 8, 4, 4, 8, [1, 1, 1, 1]),
            (2, 16, 30, 30, 16, [1, 1, 1, 1]),
            (65, 72, 4, 4, 72, [1, 1, 1, 1]),
        ];
        // (tile rows per band, or per pass when not in bands)
        let modes = [(None, usize::MAX), (None, 3), (Some(1), 0), (Some(4), 0)];
        for ((n, c, h, w, o, pads), (band, pass)) in
            cases.into_iter().flat_map(|k| modes.map(|m| (k, m)))
        {
            let s = Shape {
                n,
                c,
                h,
                w,
                o,
                oh: h + pads[0] + pads[2] - 2,
                ow: w + pads[1] + pads[3] - 2,
                pt: pads[0],
                pl: pads[1],
            };
            let mut rng = tcc_ir::random::Rng::new(3);
            let x: Vec<f32> = (0..n * c * h * w)
                .map(|_| rng.uniform(-1.0, 1.0) as f32)
                .collect();
            let f: Vec<f32> = (0..o * c * 9)
                .map(|_| rng.uniform(-1.0, 1.0) as f32)
                .collect();
            let (cb, ob) = (c.div_ceil(B), o.div_ceil(B));
            let mut xb = vec![f32::NEG_INFINITY; n * cb * h * w * B];
            for (i, &v) in x.iter().enumerate() {
                let (img, ch, p) = (i / (c * h * w), (i / (h * w)) % c, i % (h * w));
                xb[((img * cb + ch / B) * h * w + p) * B + ch % B] = v;
            }
            let mut yb = vec![f32::NAN; n * ob * s.oh * s.ow * B];
            // The AVX2 GEMM, as on an AVX2-only CPU (the kernel works with either).
            let features = crate::cpu::Features::of(Some("host,-avx512f")).expect("the host");
            let isa = Isa::for_target(&features).expect("an AVX2 sgemm");
            // Whichever way the cost model would run it: in passes of every tile row or of
            // three, in bands of one tile row or of four (the last band of a 30x30 image is
            // three).
            let mut wg = Winograd::new(s, isa, &f);
            wg.band = band;
            wg.pass = pass.clamp(1, n * wg.th);
            let post = Post::default();
            let mut ptrs = Vec::new();
            let bound = post.bind(&|_| unreachable!("no operands"), &mut ptrs);
            // SAFETY: xb and yb hold the blocked input and output; the CPU has AVX2 and FMA.
            unsafe { wg.run(xb.as_ptr(), yb.as_mut_ptr(), bound, None) };
            let want = direct(&s, &x, &f);
            for (i, &got) in yb.iter().enumerate() {
                let (lane, p) = (i % B, (i / B) % (s.oh * s.ow));
                let (blk, img) = ((i / B / (s.oh * s.ow)) % ob, i / B / (s.oh * s.ow) / ob);
                let oc = blk * B + lane;
                let expect = if oc < o {
                    want[(img * o + oc) * s.oh * s.ow + p]
                } else {
                    0.0
                };
                assert!(
                    (got as f64 - expect).abs() <= 1e-5 * (1.0 + expect.abs()),
                    "n={n} c={c} {h}x{w} o={o} pads {pads:?} bands {band:?} passes {pass}: output {i} is {got}, not {expect}"
                );
            }
        }
    }
}

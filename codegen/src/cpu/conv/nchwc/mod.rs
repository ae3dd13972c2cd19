//! `conv2d_nchwc`: convolutions that read and write channel-blocked tensors, in f32 with AVX2
//! and FMA, blocks of eight channels (one `ymm` vector). No im2col: each output pixel's taps are
//! read where they lie.
//!
//! **One group** (`direct`): a tile is six output pixels by sixteen output channels (two
//! blocks) in twelve accumulators; each step of the reduction broadcasts one input channel of
//! each of the six pixels and multiplies it into two vectors of filter weights, as the 6x16
//! GEMM microkernel does with a packed panel of A. With 512-bit library kernels
//! ([`crate::cpu::Features::wide`]) a tile is six pixels by two such pairs, each pixel's 32
//! sums in two `zmm` registers (each pair's sixteen weights of a step are one 512-bit load):
//! twice the channels per broadcast and half the instructions, the same sums in the same
//! order; there a tile is seven pixels wherever that computes no more of them (planes seven
//! wide and their multiples), and the reduction runs in chunks whose weights stay in L1 while
//! every tile of the band uses them. The six pixels are any six consecutive
//! pixels of the output plane, each with its own input pointer, so small planes and row ends
//! waste nothing but the plane's last tile (five pixels a tile where that wastes less, as on
//! 7x7 planes). The reduction runs over the input's blocks, the filter's taps and the eight
//! channels of a block (or, for a plain NCHW input such as an image's three channels, over
//! channels and taps). The filter is packed once, at compile time for a constant,
//! in that order: for each pair of output blocks, sixteen weights per step.
//!
//! **Groups of whole blocks** (RegNet's and ResNeXt's grouped layers, whose groups have 8, 16,
//! 24... input and output channels) run the same kernel: a pair of output blocks never spans
//! two groups, and its pixels' pointers start at its group's first input block. Groups of a
//! half, quarter or eighth of a block with as many outputs as inputs (ResNeXt-50's first
//! stage) run as groups of one block, the filter expanded with zeros between the small groups:
//! twice the multiply-adds at four channels a group, 2.6x faster than im2col per group.
//!
//! Padding is never tested in the inner loop: a convolution with padding first copies the input
//! rows a band of output rows reads into a zero-bordered buffer (per thread, reused), so every
//! tap of every pixel is a plain load. Without padding the kernel reads the input in place.
//!
//! **Depthwise** (`depthwise`): eight channels at once, one vector per pixel, eight outputs of a
//! row accumulated in registers over all taps, as `conv/depthwise.rs` does for NCHW, here without
//! the transposes: the padded buffer is a copy of the blocked rows (or, from a plain input, the
//! rows transposed into pixels), and the outputs are stored as they are. With 512-bit library
//! kernels, pairs of whole blocks run sixteen channels a `zmm` register, each input pixel two
//! 256-bit loads joined (`depthwise512.rs`): half the multiply-adds, and the epilogue (SiLU's
//! sigmoid above all) on sixteen lanes without joining vectors first.
//!
//! Work is split into bands of output rows (and, when there are few bands, ranges of output
//! blocks) across threads; each piece of the output is reported to the step's epilogue as soon
//! as it is final.
//!
//! This file holds the step (geometry, filter packing, the split into work and the padded
//! bands), `direct.rs` the direct kernel and its register tiles, `depthwise.rs` the depthwise
//! kernel and its row kernels, `depthwise512.rs` those on pairs of blocks; 3x3 layers that
//! pay for it run as Winograd's F(2x2, 3x3) (`conv/winograd.rs`).

mod depthwise;
mod depthwise512;
mod direct;
mod fused;

pub(in crate::cpu) use fused::fusible;

use direct::{Band, tile_pixels};

use super::winograd::{Shape, Winograd};
use super::{Finish, SendPtr};
use crate::cpu::post::{Bound, Post};
use std::cell::RefCell;
use tcc_ir::{Conv2d, DType, Function, Value};

/// Channels per block, the f32 lanes of a `ymm` register.
const B: usize = 8;

/// Output pixels per tile of the direct kernel's `ymm` tiles, at most: two blocks of six pixels
/// fill twelve of the sixteen `ymm` registers with sums. Some bands take five per tile
/// ([`tile_pixels`]); the 512-bit tiles take seven where that fits the band.
const P: usize = 6;

/// Input rows of a band are sized so its padded copy stays within this many bytes (L2).
const BAND_BYTES: usize = 192 << 10;

/// A compiled `conv2d_nchwc` step.
pub(in crate::cpu) struct NchwcConv {
    x: Value,
    w: Value,
    /// The output.
    pub y: Value,
    g: Geom,
    /// Whether the input is blocked (else plain NCHW).
    blocked: bool,
    depthwise: bool,
    /// Whether the direct kernel's pairs of blocks run in `zmm` registers
    /// ([`crate::cpu::Features::wide`]).
    zmm: bool,
    /// Whether depthwise blocks run in pairs in `zmm` registers where the filter allows
    /// (512-bit library kernels; `depthwise512.rs`).
    pairs: bool,
    /// The filter packed for the kernel, when it is a constant.
    packed: Option<Filter>,
    /// The convolution as Winograd's F(2x2, 3x3), where that pays (a constant 3x3 filter at
    /// stride 1 over a blocked input with enough channels).
    winograd: Option<Box<Winograd>>,
    /// The epilogue applied as the output is stored (bias, residual, clamps).
    pub post: Post,
    /// The 1x1 convolution that reads this depthwise step's output band by band, fused with
    /// it (see `fused.rs`); its output is the step's.
    pub then: Option<Box<NchwcConv>>,
}

/// A convolution's sizes: the plain dims of the input `[n, c, h, w]`, of the filter
/// `[o, cg, kh, kw]` (`groups` groups) and of the output `[n, o, oh, ow]`, the strides, the dilations, the top and
/// left padding, and whether there is any padding.
#[derive(Clone, Copy)]
struct Geom {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    o: usize,
    cg: usize,
    /// The filter's input channels per group: `cg`, or fewer when small groups run as whole
    /// blocks (see [`NchwcConv::new`]).
    filter_cg: usize,
    groups: usize,
    kh: usize,
    kw: usize,
    oh: usize,
    ow: usize,
    sh: usize,
    sw: usize,
    dh: usize,
    dw: usize,
    pt: usize,
    pl: usize,
    padded: bool,
}

impl Geom {
    /// Tells `finish` that output rows `rows` of `blocks` of image `img` are final.
    fn report(
        &self,
        finish: &(dyn Fn(std::ops::Range<usize>) + Sync),
        img: usize,
        blocks: std::ops::Range<usize>,
        rows: &std::ops::Range<usize>,
    ) {
        let (ob, plane) = (self.o.div_ceil(B), self.oh * self.ow * B);
        for b in blocks {
            let at = (img * ob + b) * plane;
            finish(at + rows.start * self.ow * B..at + rows.end * self.ow * B);
        }
    }
}

/// Pieces of work to cut a step into for `threads` threads: about four per thread, so that
/// threads that finish early take more; one piece for one thread.
fn pieces_wanted(threads: usize) -> usize {
    if threads > 1 { 4 * threads } else { 1 }
}

/// Output rows per band of a depthwise step of `units` units of work (blocks, or pairs, over
/// the batch) and `oh` rows, bands at most `cache` rows: at least as many bands as make
/// [`pieces_wanted`] pieces, and of those counts (up to twice as many) the one whose busiest
/// thread computes the fewest rows, every piece taking the same time per row. Nine pairs of
/// blocks in one band each were five pieces on one thread and four on the other (MobileNetV2's
/// 144-channel layer at stride 2 scaled 1.3x on two threads; now 1.8x).
fn depthwise_rows(units: usize, oh: usize, cache: usize, threads: usize) -> usize {
    let oh = oh.max(1);
    let least = (pieces_wanted(threads).div_ceil(units.max(1)))
        .max(oh.div_ceil(cache.max(1)))
        .min(oh);
    let busiest = |bands: usize| {
        let rows = oh.div_ceil(bands);
        (units * oh.div_ceil(rows)).div_ceil(threads.max(1)) * rows
    };
    let bands = (least..=(2 * least).min(oh))
        .min_by_key(|&b| (busiest(b), b))
        .unwrap_or(least);
    oh.div_ceil(bands)
}

/// A filter laid out for the kernels.
enum Filter {
    /// One group: per group of output blocks (pairs, the last maybe single), the steps of the
    /// reduction in order, `8 * nb` weights each.
    Direct { groups: Vec<Group>, data: Vec<f32> },
    /// Depthwise: per output block and tap, the block's eight weights.
    Depthwise(Vec<[f32; B]>),
}

/// Output blocks `start..start + nb` of a direct convolution, where their weights start, and
/// the first input block (or plain channel) their convolution group reads.
#[derive(Clone, Copy)]
struct Group {
    start: usize,
    nb: usize,
    at: usize,
    input: usize,
}

impl NchwcConv {
    /// The step for `conv2d_nchwc` op with operands `x`, `w` and result `y`, if this backend has
    /// a kernel for it: f32, blocks of 8, AVX2 with FMA, and one group, depthwise, or groups of
    /// whole blocks of input and output channels (RegNet's and ResNeXt's grouped layers).
    pub(in crate::cpu) fn new(
        f: &Function,
        attrs: &Conv2d,
        block: u64,
        [x, w, y]: [Value; 3],
        features: &crate::cpu::Features,
    ) -> Option<NchwcConv> {
        let usable = cfg!(target_arch = "x86_64") && features.avx2 && features.fma;
        if !usable || block != B as u64 || f.ty(y).dtype() != DType::F32 {
            return None;
        }
        let dims =
            |v: Value| -> Vec<usize> { f.ty(v).dims().iter().map(|&d| d as usize).collect() };
        let (xv, wd, yv) = (dims(x), dims(w), dims(y));
        let [o, cg, kh, kw]: [usize; 4] = wd.try_into().ok()?;
        let c = cg * attrs.groups as usize;
        let depthwise = attrs.groups as usize == c && o == c && cg == 1;
        // Groups of whole blocks run as they are; groups of a half, quarter or eighth of a block
        // with as many outputs as inputs (ResNeXt-50's first stage: 4 channels a group) as
        // groups of one block each, whose filter has zeros between the small groups.
        let filter_cg = cg;
        let (groups, cg) = match attrs.groups as usize {
            1 => (1, cg),
            g if depthwise => (g, cg),
            g if cg.is_multiple_of(B) && (o / g).is_multiple_of(B) => (g, cg),
            g if o / g == cg && B.is_multiple_of(cg) && c.is_multiple_of(B) => (c / B, B),
            _ => return None,
        };
        let [sh, sw] = attrs.strides.map(|v| v as usize);
        let [dh, dw] = attrs.dilations.map(|v| v as usize);
        let g = Geom {
            n: xv[0],
            c,
            h: xv[2],
            w: xv[3],
            o,
            cg,
            filter_cg,
            groups,
            kh,
            kw,
            oh: yv[2],
            ow: yv[3],
            sh,
            sw,
            dh,
            dw,
            pt: attrs.pads[0] as usize,
            pl: attrs.pads[1] as usize,
            padded: attrs.pads != [0; 4],
        };
        let mut cv = NchwcConv {
            x,
            w,
            y,
            g,
            blocked: xv.len() == 5,
            depthwise,
            zmm: features.wide,
            pairs: depthwise && features.wide,
            packed: None,
            winograd: None,
            post: Post::default(),
            then: None,
        };
        if let Some(t) = crate::cpu::lower::f32_constant(f, w) {
            let w = t.as_f32().expect("an f32 constant");
            cv.winograd = cv.winograd_shape().and_then(|s| {
                let isa = crate::cpu::sgemm::Isa::for_target(features)?;
                Winograd::pays(&s).then(|| Box::new(Winograd::new(s, isa, w)))
            });
            if cv.winograd.is_none() {
                cv.packed = Some(cv.pack(w));
            }
        }
        Some(cv)
    }

    /// The sizes for Winograd's F(2x2, 3x3), if it applies: one group, a 3x3 filter at stride
    /// and dilation 1, a blocked input.
    fn winograd_shape(&self) -> Option<Shape> {
        let g = &self.g;
        let fits = g.groups == 1
            && !self.depthwise
            && self.blocked
            && [g.kh, g.kw, g.sh, g.sw, g.dh, g.dw] == [3, 3, 1, 1, 1, 1];
        fits.then_some(Shape {
            n: g.n,
            c: g.c,
            h: g.h,
            w: g.w,
            o: g.o,
            oh: g.oh,
            ow: g.ow,
            pt: g.pt,
            pl: g.pl,
        })
    }

    /// The constant filters this step (and a fused 1x1 convolution) packed or transformed at
    /// compile time and no longer read.
    pub(in crate::cpu) fn packed(&self) -> Vec<Value> {
        let mut v: Vec<Value> = (self.then.iter()).flat_map(|t| t.packed()).collect();
        if self.packed.is_some() || self.winograd.is_some() {
            v.push(self.w);
        }
        v
    }

    /// The value the step writes: its output, or its fused 1x1 convolution's.
    pub(in crate::cpu) fn dst(&self) -> Value {
        self.then.as_ref().map_or(self.y, |t| t.y)
    }

    /// Lanes of the input per step of the direct kernel: a blocked input's eight channels of a
    /// pixel, or a plain input's one.
    fn lanes(&self) -> usize {
        if self.blocked { B } else { 1 }
    }

    /// Steps of the reduction, each `lanes()` channels at one tap: a group's input blocks (or
    /// channels) by taps.
    fn taps(&self) -> usize {
        let Geom { cg, kh, kw, .. } = self.g;
        cg.div_ceil(self.lanes()) * kh * kw
    }

    /// Packs filter `w` (`[O, C/g, kH, kW]`) for the kernels.
    fn pack(&self, w: &[f32]) -> Filter {
        let Geom {
            o,
            cg,
            filter_cg,
            kh,
            kw,
            ..
        } = self.g;
        let expanded;
        let w = if filter_cg == cg {
            w
        } else {
            // Output channel oc reads channels (oc / filter_cg) * filter_cg.. of the input, the
            // lanes (oc * filter_cg) % 8.. of its block: zeros elsewhere in the block.
            let taps = kh * kw;
            let mut e = vec![0f32; o * cg * taps];
            for oc in 0..o {
                let lane = (oc / filter_cg * filter_cg) % B;
                for i in 0..filter_cg {
                    let from = &w[(oc * filter_cg + i) * taps..][..taps];
                    e[(oc * cg + lane + i) * taps..][..taps].copy_from_slice(from);
                }
            }
            expanded = e;
            &expanded[..]
        };
        let ob = o.div_ceil(B);
        if self.depthwise {
            let taps = kh * kw;
            let mut grouped = vec![[0f32; B]; ob * taps];
            for (ch, f) in w.chunks_exact(taps).enumerate() {
                for (k, &v) in f.iter().enumerate() {
                    grouped[(ch / B) * taps + k][ch % B] = v;
                }
            }
            return Filter::Depthwise(grouped);
        }
        let (lanes, steps) = (self.lanes(), self.taps() * self.lanes());
        // Pairs of output blocks within each convolution group (`new` checked that a group's
        // channels fill whole blocks when there are several).
        let per = ob / self.g.groups;
        let mut groups = Vec::new();
        let mut data = Vec::new();
        let mut start = 0;
        while start < ob {
            let end = (start / per + 1) * per;
            let nb = (end - start).min(2);
            groups.push(Group {
                start,
                nb,
                at: data.len(),
                input: start / per * cg / lanes,
            });
            let base = data.len();
            data.resize(base + steps * nb * B, 0.0);
            for s in 0..steps {
                // Step s: lane `s % lanes` of input block (or channel) `t / (kh kw)` at tap
                // `t % (kh kw)`, where t = s / lanes.
                let (t, lane) = (s / lanes, s % lanes);
                let (ic, tap) = ((t / (kh * kw)) * lanes + lane, t % (kh * kw));
                if ic >= cg {
                    continue;
                }
                for j in 0..nb * B {
                    let oc = start * B + j;
                    if oc < o {
                        data[base + s * nb * B + j] = w[(oc * cg + ic) * kh * kw + tap];
                    }
                }
            }
            start += nb;
        }
        Filter::Direct { groups, data }
    }

    /// Sets the epilogue. One with SiLU takes the 512-bit tiles wherever the CPU has AVX-512F,
    /// whatever the library kernels' width: its sigmoid then runs on sixteen lanes an
    /// instruction, which pays even where 512-bit operations run in halves (Zen 4:
    /// efficientnet_b0 7.46 -> 6.87 ms with every layer at 512 bits).
    pub(in crate::cpu) fn set_post(&mut self, post: Post, features: &crate::cpu::Features) {
        self.zmm |= features.avx512f && post.ops.contains(&crate::cpu::post::PostOp::Silu);
        self.post = post;
    }

    /// Runs the step, telling `finish` of each piece of the output once it is final.
    pub(in crate::cpu) fn run(&self, addr: &dyn Fn(Value) -> *mut u8, finish: Finish) {
        if let Some(pw) = &self.then {
            return self.run_fused(pw, addr, finish);
        }
        if let Some(wg) = &self.winograd {
            let mut ptrs = Vec::new();
            let post = self.post.bind(addr, &mut ptrs);
            let (x, y) = (addr(self.x) as *const f32, addr(self.y) as *mut f32);
            // SAFETY: x and y hold the step's blocked input and output; `new` checked AVX2
            // and FMA.
            unsafe { wg.run(x, y, post, finish) };
            return;
        }
        let packed;
        let filter = match &self.packed {
            Some(p) => p,
            None => {
                let Geom {
                    o,
                    filter_cg,
                    kh,
                    kw,
                    ..
                } = self.g;
                // SAFETY: the filter holds o * filter_cg * kh * kw f32.
                let w = unsafe {
                    std::slice::from_raw_parts(addr(self.w) as *const f32, o * filter_cg * kh * kw)
                };
                packed = self.pack(w);
                &packed
            }
        };
        let mut ptrs = Vec::new();
        let post = self.post.bind(addr, &mut ptrs);
        // SAFETY: x is only read and y written in disjoint pieces (one per work item).
        let (x, y) = unsafe {
            (
                SendPtr::new(addr(self.x) as *const f32),
                SendPtr::new(addr(self.y) as *mut f32),
            )
        };
        let Geom { n, o, oh, ow, .. } = self.g;
        if n * o * oh * ow == 0 {
            return;
        }
        let ob = o.div_ceil(B);
        // A unit of work is a group of output blocks (two, with AVX-512: the kernel computes
        // two pairs of blocks a tile), or one depthwise block (two where they run in pairs).
        let (all, per) = match filter {
            Filter::Direct { groups, .. } => (groups.len(), if self.zmm { 2 } else { 1 }),
            Filter::Depthwise(_) => (ob, if self.pair_at(0) { 2 } else { 1 }),
        };
        let units = all.div_ceil(per);
        let (band, splits) = self.split(crate::cpu::pool::threads(), units);
        let bands = oh.div_ceil(band);
        let one = |i: usize| {
            let (img, rest) = (i / (bands * splits), i % (bands * splits));
            let (bi, si) = (rest / splits, rest % splits);
            let rows = bi * band..((bi + 1) * band).min(oh);
            let units = si * units / splits * per..((si + 1) * units / splits * per).min(all);
            BUFFER.with(|buf| {
                let mut buf = buf.borrow_mut();
                // SAFETY: image img of x and y; this item writes only its rows of its units'
                // output blocks.
                unsafe {
                    self.item(
                        filter,
                        post,
                        x.get(),
                        y.get(),
                        img,
                        rows.clone(),
                        units.clone(),
                        &mut buf,
                    )
                };
            });
            if let Some(finish) = finish {
                let blocks = match filter {
                    Filter::Direct { groups, .. } => {
                        let g = &groups[units.start..units.end];
                        g[0].start..g[g.len() - 1].start + g[g.len() - 1].nb
                    }
                    Filter::Depthwise(_) => units,
                };
                self.g.report(finish, img, blocks, &rows);
            }
        };
        crate::cpu::pool::for_each(n * bands * splits, &one);
    }

    /// How the work is cut for `threads` threads: output rows per band, and how many ranges
    /// of its `units` (groups of output blocks; each block, for depthwise) each band is split
    /// into. Every band of every range is one piece of work; there should be about four per
    /// thread, so that threads that finish early take more.
    ///
    /// A small cost model chooses between more bands and more ranges: each piece reads its
    /// range's filter and its band's input, so `b` bands and `s` ranges read the filter `b`
    /// times and the input `s` times; and a band's pixels go in tiles of five or six, so short
    /// bands of small planes waste part of their last tile. Bytes count three FLOPs (about
    /// what one core computes per byte it streams from L2 or L3). Bands are no taller than
    /// [`Self::band_rows`] (the cache) allows.
    fn split(&self, threads: usize, units: usize) -> (usize, usize) {
        let Geom {
            n,
            c,
            h,
            w,
            o,
            cg,
            kh,
            kw,
            oh,
            ow,
            ..
        } = self.g;
        let want = pieces_wanted(threads);
        let cache = self.band_rows();
        if self.depthwise {
            // The filter is tiny: bands only.
            return (depthwise_rows(n * units, oh, cache, threads), units);
        }
        let filter = (o.next_multiple_of(B) * cg * kh * kw * 4) as f64;
        let input = (c.next_multiple_of(self.lanes()) * h * w * 4) as f64;
        let flops = (2 * o * cg * kh * kw * oh * ow) as f64;
        let mut best = (f64::INFINITY, oh, 1);
        for bands in 1..=oh.min(want) {
            let rows = oh.div_ceil(bands);
            if rows > cache && bands < oh.min(want) {
                continue;
            }
            let bands = oh.div_ceil(rows);
            let pixels = rows * ow;
            let used = pixels as f64 / pixels.next_multiple_of(tile_pixels(pixels)) as f64;
            for splits in 1..=units.min(want) {
                if n * bands * splits < want && splits < units.min(want) {
                    continue;
                }
                // With several convolution groups, each range reads its groups' input only.
                let reads = if self.g.groups > 1 { 1 } else { splits };
                let bytes = bands as f64 * filter + reads as f64 * input;
                let cost = 3.0 * bytes + flops / used;
                if cost < best.0 {
                    best = (cost, rows, splits);
                }
            }
        }
        (best.1, best.2)
    }

    /// Output rows per band: as many as keep the band's padded input within [`BAND_BYTES`].
    fn band_rows(&self) -> usize {
        let Geom {
            c,
            kh,
            oh,
            ow,
            sh,
            dh,
            ..
        } = self.g;
        let channels = if self.depthwise {
            B
        } else {
            c.next_multiple_of(B)
        };
        let row_bytes = (self.cols(ow) * channels * 4).max(1);
        let fit = (BAND_BYTES / row_bytes).max((kh - 1) * dh + 1);
        ((fit - (kh - 1) * dh - 1) / sh + 1).clamp(1, oh.max(1))
    }

    /// Padded input rows that output rows `rows` read.
    fn band_input_rows(&self, rows: &std::ops::Range<usize>) -> usize {
        let Geom { kh, sh, dh, .. } = self.g;
        (rows.end - rows.start - 1) * sh + (kh - 1) * dh + 1
    }

    /// The image row behind padded input row `r`, if it lies in the image (and `wn`, the
    /// columns that land in the buffer, is not zero).
    fn input_row(&self, r: usize, wn: usize) -> Option<usize> {
        // Padded rows above the image wrap around to large numbers: outside too.
        let ir = r.wrapping_sub(self.g.pt);
        (ir < self.g.h && wn > 0).then_some(ir)
    }

    /// Padded input columns the outputs of a row read (rounded up to eight outputs for the
    /// depthwise kernel, whose loads of a partial last vector must stay in the buffer).
    fn cols(&self, ow: usize) -> usize {
        let Geom { kw, sw, dw, .. } = self.g;
        let ow = if self.depthwise {
            ow.next_multiple_of(B)
        } else {
            ow
        };
        (ow.max(1) - 1) * sw + (kw - 1) * dw + 1
    }

    /// Computes output rows `rows` of output units `units` (groups of blocks, or depthwise
    /// blocks) of image `img`.
    ///
    /// # Safety
    /// `x` and `y` hold the step's input and output.
    #[allow(clippy::too_many_arguments)]
    unsafe fn item(
        &self,
        filter: &Filter,
        post: Bound,
        x: *const f32,
        y: *mut f32,
        img: usize,
        rows: std::ops::Range<usize>,
        units: std::ops::Range<usize>,
        buf: &mut Vec<f32>,
    ) {
        let Geom {
            c, h, w, o, oh, ow, ..
        } = self.g;
        let cb = c.div_ceil(B);
        let ximg_len = if self.blocked { cb * B } else { c } * h * w;
        // SAFETY: the caller's contract: image img of the input and output.
        unsafe {
            let ximg = std::slice::from_raw_parts(x.add(img * ximg_len), ximg_len);
            let yoff = img * o.div_ceil(B) * oh * ow * B;
            let out = Out {
                y: y.add(yoff),
                at: yoff,
                post,
            };
            match filter {
                Filter::Direct { groups, data } => {
                    self.direct(&groups[units], data, ximg, out, rows, buf)
                }
                Filter::Depthwise(f) => {
                    let r0 = rows.start;
                    let out = |b: usize| {
                        let at = (b * oh + r0) * ow * B;
                        Out {
                            y: out.y.add(at),
                            at: out.at + at,
                            post: out.post,
                        }
                    };
                    self.depthwise_blocks(f, units, ximg, out, oh * ow * B, rows, buf)
                }
            }
        }
    }

    /// Copies the input rows that output rows `rows` read, zero-padded, into `buf`: per input
    /// block (or plain channel) of `planes` the band's rows of `cols` columns, each column
    /// `lanes()` floats; lanes past the last channel are zero. Returns the band the direct kernel
    /// reads.
    fn copy_band<'b>(
        &self,
        ximg: &[f32],
        rows: std::ops::Range<usize>,
        planes: std::ops::Range<usize>,
        buf: &'b mut Vec<f32>,
    ) -> Band<'b> {
        let Geom {
            c,
            h,
            w,
            ow,
            sh,
            pl,
            ..
        } = self.g;
        let lanes = self.lanes();
        let cols = self.cols(ow);
        let n_rows = self.band_input_rows(&rows);
        let count = planes.len();
        let (row, plane) = (cols * lanes, n_rows * cols * lanes);
        // Every float of the band is written below (copied or zeroed), so what the buffer
        // held before need not be cleared.
        if buf.len() < count * plane {
            buf.resize(count * plane, 0.0);
        }
        // Input columns that land in the buffer, at column `pl` on.
        let wn = w.min(cols.saturating_sub(pl));
        for (i, p) in planes.clone().enumerate() {
            for r in 0..n_rows {
                let dst = &mut buf[i * plane + r * row..][..row];
                let src = self
                    .input_row(rows.start * sh + r, wn)
                    .map(|ir| &ximg[(p * h + ir) * w * lanes..][..wn * lanes]);
                padded_row(dst, src, pl * lanes);
            }
        }
        if lanes == B && c % B != 0 && planes.end == c.div_ceil(B) {
            // Whatever the padding lanes of the last block hold (an elementwise op may have
            // left NaN there), the filter's zeros must not meet it.
            for px in buf[(count - 1) * plane..count * plane].chunks_exact_mut(B) {
                px[c % B..].fill(0.0);
            }
        }
        Band {
            src: &buf[..],
            plane,
            row,
            first: planes.start,
        }
    }
}

/// One row of a padded band: `src` (the image row's pixels that land in the buffer) at float
/// `at` of `dst`, zeros before and after it; all zeros for a row outside the image (`None`).
fn padded_row(dst: &mut [f32], src: Option<&[f32]>, at: usize) {
    let Some(src) = src else {
        dst.fill(0.0);
        return;
    };
    dst[..at].fill(0.0);
    dst[at + src.len()..].fill(0.0);
    dst[at..at + src.len()].copy_from_slice(src);
}

thread_local! {
    /// Each thread's padded input band.
    static BUFFER: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Where a kernel stores: `y` at element offset `at` of the whole output, and the epilogue it
/// applies on the way.
#[derive(Clone, Copy)]
struct Out<'a> {
    y: *mut f32,
    at: usize,
    post: Bound<'a>,
}

#[cfg(test)]
mod tests {
    use super::depthwise_rows;

    /// Depthwise bands: enough pieces for the threads, shared evenly where a few more bands
    /// allow it, within the cache's rows, one band on one thread.
    #[test]
    fn depthwise_bands_balance_the_threads() {
        // Nine pairs of blocks, 28 rows, two threads: two bands of 14 (nine pieces each).
        assert_eq!(depthwise_rows(9, 28, 28, 2), 14);
        // Eighteen units already make enough even pieces: one band.
        assert_eq!(depthwise_rows(18, 28, 28, 2), 28);
        // Fifteen units: two bands (thirty pieces, fifteen each).
        assert_eq!(depthwise_rows(15, 14, 14, 2), 7);
        // The cache's limit holds.
        assert!(depthwise_rows(64, 112, 10, 2) <= 10);
        // One thread: one band as tall as the cache allows.
        assert_eq!(depthwise_rows(9, 28, 28, 1), 28);
        // Three units of seven rows: bands of two rows (twelve pieces, six each), not of three
        // (nine pieces, five on one thread).
        assert_eq!(depthwise_rows(3, 7, 100, 2), 2);
    }
}

//! `conv_integer` on AVX-512 VNNI, as `[O, K]` filter rows times `[K, P]` receptive-field
//! columns (im2col's rows, or the image itself for a pointwise convolution).
//!
//! `vpdpbusd` multiplies unsigned bytes by signed ones. The image is the unsigned operand and
//! the filter the signed one, as quantized models have them (u8 activations, i8 weights); the
//! other types are shifted once into that form, an i8 image to `x' = x + 128` and a u8 filter
//! to `w' = w - 128`, their zero points moving with them (`zx'`, `zw'`). Then
//! `sum (w - zw)(x - zx) = sum w'x' - zw' colsum(x') - zx' rowsum(w') + K zw' zx'`, wrapping in
//! i32 like the interpreter's sum; where every `zw'` is 0 (symmetric i8 weights) the per-pixel
//! term goes, and what is left is one constant per channel. The filter is the broadcast
//! operand: its rows, shifted and padded to a multiple of 4 taps, with their sums, are prepared
//! once ([`Filter`]; at compile time when the filter is a constant). The columns are the panel
//! operand: each block of 32 pixels is packed just before use into 4-tap steps of 32 pixels x 4
//! bytes (128 bytes, two registers), shifted on the way, and its per-pixel sums taken by
//! `vpdpbusd` with ones.
//!
//! The register tile is 8 output channels by 32 pixels: per 4-tap step, two panel loads, eight
//! 4-byte broadcasts and sixteen `vpdpbusd` into sixteen accumulators. Where the CPU has
//! AMX-INT8 the tile is 32 channels by 32 pixels on AMX's tiles instead ([`super::amx`]), the
//! packed block read as it is. A block stays in cache while every channel of the group runs
//! over it; blocks are split across the thread pool, and where they are few, an item is one
//! channel tile over one block, each thread packing the blocks its items need once (see
//! [`convolve`]).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Pixels per block: two 16-lane panels.
const PX: usize = 32;
/// Output channels per register tile.
const CH: usize = 8;

/// A filter prepared for [`convolve`]: each output channel's taps shifted to i8, padded with
/// zeros to `kp` (a multiple of 4), with their sums and its shifted zero point.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Filter {
    pub(super) rows: Vec<i8>,
    pub(super) k: usize,
    pub(super) kp: usize,
    pub(super) sums: Vec<i32>,
    pub(super) zeros: Vec<i32>,
    /// Whether every shifted zero point is 0 (no per-pixel term).
    pub(super) centered: bool,
    /// Whether every shifted tap lies in `-64..=63` (7 bits), which AVX2's `vpmaddubsw` needs
    /// to add two products without saturating ([`super::avx2_conv`]).
    pub(super) narrow: bool,
    /// Where it is not narrow: each row's taps less its zero point as i16, padded to `kp` with
    /// zeros (AVX2 without VNNI multiplies them with `vpmaddwd`).
    pub(super) pairs: Option<Vec<i16>>,
    /// For AMX: the rows padded for its tiles ([`convolve`] multiplies on tiles where a
    /// filter has them).
    pub(super) tiles: Option<super::amx::TileRows>,
}

/// The kernel a [`Filter`] is prepared for, which may need more than the rows every kernel
/// reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kernel {
    /// AVX-512 VNNI, or AVX2 with AVX-VNNI: the rows.
    Vnni,
    /// AMX: [`Filter::tiles`] too.
    Amx,
    /// AVX2 without VNNI: [`Filter::pairs`] too where the filter is not narrow (twice its
    /// bytes, which other kernels do not need).
    Avx2,
}

impl Filter {
    /// The filter `w` (`o` rows of `k` levels; `signed`: i8) with zero points `zw` (one, or one
    /// per row), prepared for `kernel`.
    pub(super) fn new(
        w: &[u8],
        zw: &[u8],
        signed: bool,
        (o, k): (usize, usize),
        kernel: Kernel,
    ) -> Filter {
        let kp = k.div_ceil(4) * 4;
        let flip = if signed { 0 } else { 0x80 };
        let mut rows = vec![0i8; o * kp];
        let mut sums = vec![0i32; o];
        for ((row, src), sum) in (rows.chunks_mut(kp).zip(w.chunks(k))).zip(&mut sums) {
            for (d, &s) in row.iter_mut().zip(src) {
                *d = (s ^ flip) as i8;
                *sum = sum.wrapping_add(*d as i32);
            }
        }
        let zeros: Vec<i32> = (0..o)
            .map(|i| (zw[if zw.len() == 1 { 0 } else { i }] ^ flip) as i8 as i32)
            .collect();
        let narrow = rows.iter().all(|&t| (-64..=63).contains(&t));
        Filter {
            narrow,
            tiles: (kernel == Kernel::Amx).then(|| super::amx::TileRows::new(&rows, kp)),
            pairs: (kernel == Kernel::Avx2 && !narrow).then(|| {
                let mut pairs = vec![0i16; o * kp];
                for (i, (d, s)) in pairs.chunks_mut(kp).zip(rows.chunks(kp)).enumerate() {
                    for (d, &t) in d.iter_mut().zip(&s[..k]) {
                        *d = t as i16 - zeros[i] as i16;
                    }
                }
                pairs
            }),
            rows,
            k,
            kp,
            sums,
            centered: zeros.iter().all(|&z| z == 0),
            zeros,
        }
    }
}

impl Filter {
    /// Each channel of `rows`' constant term, `K zw' zx' - zx' rowsum(w')`, for an input zero
    /// point `zx` (a level of the input's type, i8 where `signed`), shifted as the input is.
    pub(super) fn constants(
        &self,
        rows: std::ops::Range<usize>,
        zx: i32,
        signed: bool,
    ) -> Vec<i32> {
        let zx = if signed { zx + 128 } else { zx };
        rows.map(|o| {
            (self.k as i32)
                .wrapping_mul(self.zeros[o])
                .wrapping_mul(zx)
                .wrapping_sub(zx.wrapping_mul(self.sums[o]))
        })
        .collect()
    }
}

/// Where a convolution's taps fall: the input planes of a group and the output's size, the
/// filter's, the strides, dilations and the top and left padding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Geometry {
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub oh: usize,
    pub ow: usize,
    pub kh: usize,
    pub kw: usize,
    pub stride: [usize; 2],
    pub dilation: [usize; 2],
    pub pad: [usize; 2],
}

/// What one group's convolution reads and writes.
#[derive(Clone, Copy)]
pub(super) struct Group<'a> {
    /// The group's input planes (`c x h x w` bytes) and where its taps fall.
    pub x: *const u8,
    pub at: Geometry,
    /// The filter's rows for this group.
    pub first: usize,
    pub m: usize,
    /// The input's zero point (a level of the input's type) and whether the input is i8.
    pub zx: i32,
    pub signed: bool,
    /// `m x n` results, row-major: the sums (i32), or with `post` what its chain stores.
    pub out: *mut u8,
    pub post: Option<&'a super::requant::Bound<'a>>,
    /// The chain's residual for these `m x n` results, where it has one.
    pub residual: Option<*const f32>,
}

/// One group of a convolution: `out = filter rows first..first + m` times the columns, less
/// the zero points, wrapping in i32.
///
/// # Safety
/// The CPU has AVX-512F, BW, VL and VNNI; `g.x` holds the group's `c x h x w` bytes, the
/// geometry's taps make `filter.k` rows, and `g.out` holds `m x oh x ow` results that nothing
/// else accesses during the call.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn convolve(filter: &Filter, g: Group) {
    let n = g.at.oh * g.at.ow;
    let blocks = n.div_ceil(PX);
    let ch = channels(filter);
    let tiles = g.m.div_ceil(ch);
    // Too few blocks to balance the pool on their own (they would split the channels).
    let few = splits(blocks, tiles) > 1;
    let work = g.m * n * filter.k;
    let consts = filter.constants(g.first..g.first + g.m, g.zx, g.signed);
    // SAFETY: items write disjoint (block, channel range) pieces of `out`; the columns and
    // the filter are only read.
    let g = unsafe { crate::cpu::send_ptr::SendPtr::new(g) };
    let kp = panel_taps(filter);
    // SAFETY (of each `run_block`): the CPU features and buffers as this function's contract.
    if !few {
        // On AMX a few blocks an item where there are many, so that configuring the tiles
        // (with releasing them, 45 ns) is paid once for them.
        let per = match filter.tiles {
            Some(_) => (blocks / (16 * crate::cpu::pool::threads())).clamp(1, 8),
            None => 1,
        };
        let item = |i: usize| {
            SCRATCH.with(|s| {
                let s = &mut s.borrow_mut();
                // SAFETY: a filter has tiles only where AMX is available.
                let amx = (filter.tiles.as_ref()).map(|_| unsafe { super::amx::Tiles::load() });
                for block in i * per..((i + 1) * per).min(blocks) {
                    let (chans, amx) = (0..tiles * ch, amx.as_ref());
                    unsafe { run_block(filter, g.get(), &consts, (block, chans), None, amx, s) }
                }
            });
        };
        parallel(blocks.div_ceil(per), work, &item);
        return;
    }
    // Few blocks: an item per channel tile and block, tile by tile, so that the pool's
    // contiguous shares give each thread whole tiles (their filter rows read from memory
    // once, from cache for the other blocks) and balance where the tiles are few (96 channels
    // are 3 tiles of 32). Each thread packs a block the first time one of its items needs it,
    // into its own cache, and keeps it for the call's other items (one parallel step of
    // packing shared by all took a second step and moved the blocks between cores: two
    // threads were slower than one on a 576 -> 96 1x1 at 14x14).
    // An item takes `span` consecutive blocks of its tile, as many as leave 8 items a thread
    // (on AMX, configuring the tiles costs as much as a block's products at 14x14).
    let span = (tiles * blocks / (8 * crate::cpu::pool::threads())).clamp(1, blocks);
    let per_tile = blocks.div_ceil(span);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let item = |i: usize| {
        let (t, first) = (i / per_tile, i % per_tile * span);
        SCRATCH.with(|s| {
            let s = &mut s.borrow_mut();
            if s.blocks_of != Some(call) {
                crate::cpu::bytes::at_least(&mut s.blocks, blocks * kp * PX);
                s.sums.clear();
                s.sums.resize(blocks, None);
                s.blocks_of = Some(call);
            }
            // SAFETY: a filter has tiles only where AMX is available.
            let amx = (filter.tiles.as_ref()).map(|_| unsafe { super::amx::Tiles::load() });
            for block in first..(first + span).min(blocks) {
                let at = (s.blocks.as_mut_ptr() as *mut u8).wrapping_add(block * kp * PX);
                let colsum = match s.sums[block] {
                    Some(colsum) => colsum,
                    None => {
                        // SAFETY: block `block` of the thread's blocks; as this function's
                        // contract.
                        let colsum = unsafe { pack_any(&g.get(), block * PX, &mut s.taps, at) };
                        s.sums[block] = Some(colsum);
                        colsum
                    }
                };
                let (packed, chans) = (Some((at as *const u8, colsum)), t * ch..(t + 1) * ch);
                let (at, amx) = ((block, chans), amx.as_ref());
                unsafe { run_block(filter, g.get(), &consts, at, packed, amx, s) }
            }
        });
    };
    parallel(tiles * per_tile, work, &item);
}

/// Output channels per tile: 32 on AMX, else [`CH`].
fn channels(filter: &Filter) -> usize {
    if filter.tiles.is_some() { 32 } else { CH }
}

/// Taps per pixel of a packed block: the filter's padded rows (on AMX, whose tiles take 64
/// taps at a time, past them too: what the block holds there is multiplied by zero taps).
fn panel_taps(filter: &Filter) -> usize {
    filter.tiles.as_ref().map_or(filter.kp, |t| t.stride)
}

/// How many ranges of a convolution's `tiles` channel tiles each of its `blocks` pixel blocks
/// is split into: enough items for the pool to balance where the blocks are few.
pub(super) fn splits(blocks: usize, tiles: usize) -> usize {
    (4 * crate::cpu::pool::threads())
        .div_ceil(blocks)
        .clamp(1, tiles)
}

/// `item(i)` for `i` in `0..n`: across the thread pool when the convolution has `work`
/// multiply-adds, 2^20 or more (enough to pay for it), else here.
pub(super) fn parallel(n: usize, work: usize, item: &(dyn Fn(usize) + Sync)) {
    if work >= 1 << 20 {
        crate::cpu::pool::for_each(n, item);
    } else {
        (0..n).for_each(item);
    }
}

/// A thread's working space: its packed block, and where the block's taps read.
#[derive(Default)]
struct Scratch {
    packed: Vec<crate::cpu::bytes::Line>,
    /// The blocks of a convolution with few, their pixels' sums where this thread packed them,
    /// and which call of [`convolve`] they belong to.
    blocks: Vec<crate::cpu::bytes::Line>,
    sums: Vec<Option<[__m512i; 2]>>,
    blocks_of: Option<u64>,
    taps: Taps,
}

/// Where a block's taps read, found once per block by [`pack`]: for each filter position
/// (`ky kw + kx`), its pieces `segments[starts[p]..starts[p + 1]]`, one per run of the block's
/// pixels along an output row that reads inside the image there: the lanes it fills, their
/// bytes (stride 2) and where lane 0 would read in a plane.
#[derive(Default)]
struct Taps {
    segments: Vec<(u32, u64, isize)>,
    starts: Vec<usize>,
}

/// Calls of [`convolve`] so far: which one a thread's packed blocks belong to.
static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
}

/// Block `block` (pixels `32 block..` below `n`) of channels `chans` (of the group, clipped
/// to `m`), on AMX's tiles where the filter has them and `amx` holds them configured.
///
/// # Safety
/// As [`convolve`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")]
unsafe fn run_block(
    filter: &Filter,
    g: Group,
    consts: &[i32],
    (block, chans): (usize, std::ops::Range<usize>),
    packed: Option<(*const u8, [__m512i; 2])>,
    amx: Option<&super::amx::Tiles>,
    scratch: &mut Scratch,
) {
    let p0 = block * PX;
    let kp = filter.kp;
    let n = g.at.oh * g.at.ow;
    let count = (n - p0).min(PX);
    let (panel, colsum) = match packed {
        Some(p) => p,
        None => {
            let out = crate::cpu::bytes::at_least(&mut scratch.packed, panel_taps(filter) * PX);
            // SAFETY: as this function's contract; `packed` holds `kp * 32` bytes.
            let colsum = unsafe { pack_any(&g, p0, &mut scratch.taps, out) };
            (out as *const u8, colsum)
        }
    };
    let mask = if count == 16 * 2 {
        u32::MAX
    } else {
        (1u32 << count) - 1
    };
    let (lo, hi) = (mask as u16, (mask >> 16) as u16);
    // SAFETY: AVX-512F, as this function's contract.
    let plain = g.post.and_then(|p| unsafe { p.plain16() });
    let finish = Finish {
        filter,
        g: &g,
        consts,
        n,
        p0,
        masks: [lo, hi],
        colsum,
        plain,
    };
    if let (Some(rows), Some(tiles)) = (&filter.tiles, amx) {
        let mut sums = super::amx::Sums([[0; 32]; 32]);
        for c0 in chans.step_by(32) {
            if c0 >= g.m {
                break;
            }
            // SAFETY: 32 rows from `first + c0` are in range (`TileRows` adds 32 zero rows),
            // each `stride` taps; the panel holds as many.
            unsafe {
                let a = rows.ptr().add((g.first + c0) * rows.stride);
                tiles.product(a, rows.stride, panel, rows.stride / 64, &mut sums);
            }
            let live = (g.m - c0).min(32);
            // SAFETY: 32 sums a row; the rest as this function's contract.
            unsafe {
                finish.rows(c0, live, |r| {
                    let p = sums.0[r].as_ptr() as *const __m512i;
                    [_mm512_loadu_si512(p), _mm512_loadu_si512(p.add(1))]
                })
            };
        }
        return;
    }
    for c0 in chans.step_by(CH) {
        let live = (g.m - c0).min(CH);
        if live == 0 {
            break;
        }
        let first = g.first + c0;
        // SAFETY: rows `first..first + live` of the filter and `kp * 32` packed bytes.
        let acc = unsafe { tile(filter.rows.as_ptr().add(first * kp), kp, live, panel) };
        // SAFETY: as this function's contract.
        unsafe { finish.rows(c0, live, |r| acc[r]) };
    }
}

/// What [`run_block`] stores its sums with.
struct Finish<'a> {
    filter: &'a Filter,
    g: &'a Group<'a>,
    consts: &'a [i32],
    n: usize,
    p0: usize,
    /// The block's pixels below `n`, in each half.
    masks: [u16; 2],
    colsum: [__m512i; 2],
    plain: Option<super::plain::Plain16<'a>>,
}

impl Finish<'_> {
    /// Rows `0..live` of the channels from `c0` (`acc(r)` their sums) stored as the chain
    /// says; on the plain path with the chain's flags and whether the filter is centered
    /// matched once, not tested for every vector.
    ///
    /// # Safety
    /// As [`Finish::row`], for every row.
    #[inline(always)]
    unsafe fn rows(&self, c0: usize, live: usize, acc: impl Fn(usize) -> [__m512i; 2]) {
        let Some(p) = &self.plain else {
            for r in 0..live {
                // SAFETY: as this function's contract.
                unsafe { self.row(c0, r, acc(r)) };
            }
            return;
        };
        // SAFETY: as this function's contract.
        super::plain::with_constant_flags!(p.flags, f => unsafe {
            if self.filter.centered {
                self.plain_rows(p, f, true, c0, live, &acc)
            } else {
                self.plain_rows(p, f, false, c0, live, &acc)
            }
        })
    }

    /// [`Finish::rows`] on the plain path `p` with `flags` and `centered` (constants).
    ///
    /// # Safety
    /// As [`Finish::row`], for every row.
    #[inline(always)]
    unsafe fn plain_rows(
        &self,
        p: &super::plain::Plain16,
        flags: super::plain::Flags,
        centered: bool,
        c0: usize,
        live: usize,
        acc: &impl Fn(usize) -> [__m512i; 2],
    ) {
        for r in 0..live {
            let o = self.g.first + c0 + r;
            // SAFETY: the features and the row, as this function's contract; the chain's
            // operands cover channel `o`.
            unsafe {
                for (h, &a) in acc(r).iter().enumerate() {
                    let v = self.corrected(c0 + r, h, a, centered);
                    let (at, m) = ((c0 + r) * self.n + self.p0 + 16 * h, self.masks[h]);
                    let y = p.scaled(_mm512_cvtepi32_ps(v), o);
                    let Some(res) = self.g.residual else {
                        p.store_scaled(y, m, self.g.out.add(at), flags);
                        continue;
                    };
                    // The residual's elements for these outputs; where one of the results is
                    // not finite (a NaN or infinity in the residual, or an overflow), the
                    // vector takes the exact path, which keeps what the interpreter does.
                    let r = _mm512_maskz_loadu_ps(m, res.add(at));
                    let y = _mm512_add_ps(y, r);
                    // Classes: quiet and signalling NaN, +inf, -inf.
                    if _mm512_mask_fpclass_ps_mask::<0x99>(m, y) == 0 {
                        p.store_scaled(y, m, self.g.out.add(at), flags);
                    } else if let Some(post) = self.g.post {
                        post.store16_with(v, o, m, self.g.out.add(at), Some(r));
                    }
                }
            }
        }
    }

    /// Half `h` of the sums `a` of row `row` of the group's channels, less the zero points'
    /// terms: the channel's constant, and with a filter not `centered` the pixels' sums times
    /// its zero point.
    ///
    /// # Safety
    /// AVX-512F (inlined into the kernel compiled for it); `row` is one of the group's.
    #[inline(always)]
    unsafe fn corrected(&self, row: usize, h: usize, a: __m512i, centered: bool) -> __m512i {
        // SAFETY: AVX-512F, as this function's contract.
        unsafe {
            let c = _mm512_set1_epi32(self.consts[row]);
            if centered {
                return _mm512_add_epi32(a, c);
            }
            let zw = _mm512_set1_epi32(self.filter.zeros[self.g.first + row]);
            let term = _mm512_mullo_epi32(zw, self.colsum[h]);
            _mm512_add_epi32(_mm512_sub_epi32(a, term), c)
        }
    }

    /// Row `r` of the channels from `c0` off the plain path: its two vectors of sums stored as
    /// the chain says, or as they are.
    ///
    /// # Safety
    /// AVX-512F, BW and VL (inlined into the kernel compiled for them); the row is one of the
    /// group's.
    #[inline(always)]
    unsafe fn row(&self, c0: usize, r: usize, acc: [__m512i; 2]) {
        let g = self.g;
        let o = g.first + c0 + r;
        // SAFETY: the features and the row, as this function's contract; the chain's operands
        // cover channel `o`.
        unsafe {
            // The masks indexed, not zipped: a zip with an array built on the stack for every
            // row reloaded it wider than it was stored (a store-forwarding stall that took a
            // third of a small 1x1 layer's time).
            for (h, &a) in acc.iter().enumerate() {
                let m = self.masks[h];
                let v = self.corrected(c0 + r, h, a, self.filter.centered);
                // Row `c0 + r` of the group's output, pixels below `n` (the mask).
                let at = (c0 + r) * self.n + self.p0 + 16 * h;
                match g.post {
                    None => _mm512_mask_storeu_epi32(g.out.add(4 * at) as *mut _, m, v),
                    Some(post) => {
                        let size = if post.quantize.is_some() { 1 } else { 4 };
                        // The residual's elements for these outputs, where the chain has one.
                        let res = g.residual.map(|r| _mm512_maskz_loadu_ps(m, r.add(at)));
                        post.store16_with(v, o, m, g.out.add(size * at), res);
                    }
                }
            }
        }
    }
}

/// [`pack_pointwise`] where the geometry is pointwise, else [`pack`].
///
/// # Safety
/// As [`pack`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,bmi2")]
unsafe fn pack_any(g: &Group, p0: usize, taps: &mut Taps, out: *mut u8) -> [__m512i; 2] {
    let at = &g.at;
    let pointwise = (at.kh, at.kw, at.stride, at.pad) == (1, 1, [1, 1], [0, 0])
        && (at.oh, at.ow) == (at.h, at.w);
    // SAFETY: as this function's contract.
    unsafe {
        match at.stride[1] {
            _ if pointwise => pack_pointwise(g, p0, out),
            1 => pack::<1>(g, p0, taps, out),
            2 => pack::<2>(g, p0, taps, out),
            _ => pack::<0>(g, p0, taps, out),
        }
    }
}

/// Packs the receptive fields of output pixels `p0..p0 + 32` (those below `oh * ow`) of group
/// `g`'s image into `out` as 4-tap steps of 32 pixels x 4 bytes, taps in the padding the input's
/// zero point, each byte shifted to u8 where the input is i8, taps past `k` zero; returns each
/// pixel's sum of its packed bytes (two vectors of sixteen). Im2col without the columns: the
/// block's pixels fall in runs along output rows, and each tap's 32 bytes are one masked load
/// per run (strides of 1 and 2; a byte at a time for larger ones), the pieces of each filter
/// position ([`Taps`]) found once per block. `SW` is the horizontal stride where it is 1 or 2,
/// else 0.
///
/// # Safety
/// AVX-512F, BW, VL, VNNI, BMI2; `g.x` holds `c x h x w` bytes; `out` holds
/// `k.div_ceil(4) * 128` bytes for `k = c kh kw`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,bmi2")]
unsafe fn pack<const SW: usize>(
    g: &Group,
    p0: usize,
    taps: &mut Taps,
    out: *mut u8,
) -> [__m512i; 2] {
    let (x, at) = (g.x, &g.at);
    let count = (at.oh * at.ow - p0).min(PX);
    let (zero, flip) = (g.zx as u8, g.signed);
    let [sh, sw] = at.stride;
    let (kh, kw) = (at.kh, at.kw);
    taps.segments.clear();
    taps.starts.clear();
    for ky in 0..kh {
        for kx in 0..kw {
            taps.starts.push(taps.segments.len());
            let mut lane = 0;
            while lane < count {
                let (oy, ox) = ((p0 + lane) / at.ow, (p0 + lane) % at.ow);
                let len = (at.ow - ox).min(count - lane);
                let iy = (oy * sh + ky * at.dilation[0]).wrapping_sub(at.pad[0]);
                // Column `t` of the run reads input column `ix0 + t sw`, inside the row for
                // `t` in `lo..hi`.
                let ix0 = (ox * sw + kx * at.dilation[1]) as isize - at.pad[1] as isize;
                let lo = if ix0 < 0 {
                    ((-ix0) as usize).div_ceil(sw)
                } else {
                    0
                };
                let hi = ((at.w as isize - ix0).max(0) as usize)
                    .div_ceil(sw)
                    .min(len);
                if iy < at.h && lo < hi {
                    let lanes = ((u64::MAX >> (64 - (hi - lo))) << (lane + lo)) as u32;
                    let bytes = _pdep_u64(lanes as u64, 0x5555_5555_5555_5555);
                    let off = (iy * at.w) as isize + ix0 - (lane * sw) as isize;
                    taps.segments.push((lanes, bytes, off));
                }
                lane += len;
            }
        }
    }
    taps.starts.push(taps.segments.len());
    let (segments, starts) = (&taps.segments[..], &taps.starts[..]);
    let bit = _mm256_set1_epi8(if flip { -128 } else { 0 });
    let padding = _mm256_set1_epi8(zero as i8);
    // The 32 bytes of filter position `p` in `plane`.
    let tap = |plane: *const u8, p: usize| {
        let mut v = padding;
        // SAFETY: `p` is a filter position: `starts` has `p + 1`, its range inside `segments`.
        let pieces = unsafe {
            segments.get_unchecked(*starts.get_unchecked(p)..*starts.get_unchecked(p + 1))
        };
        for &(lanes, bytes, off) in pieces {
            // Where lane 0 would read: masked-off lanes are never read.
            let base = plane.wrapping_offset(off) as *const i8;
            // SAFETY: the mask's lanes read bytes inside a row of the plane.
            unsafe {
                v = match SW {
                    1 => _mm256_mask_blend_epi8(lanes, v, _mm256_maskz_loadu_epi8(lanes, base)),
                    2 => {
                        let pairs = _mm512_maskz_loadu_epi8(bytes, base);
                        _mm256_mask_blend_epi8(lanes, v, _mm512_cvtepi16_epi8(pairs))
                    }
                    _ => {
                        let mut b = [0u8; 32];
                        _mm256_storeu_si256(b.as_mut_ptr() as *mut _, v);
                        for (l, b) in b.iter_mut().enumerate() {
                            if lanes >> l & 1 == 1 {
                                *b = *base.wrapping_add(l * sw) as u8;
                            }
                        }
                        _mm256_loadu_si256(b.as_ptr() as *const _)
                    }
                };
            }
        }
        _mm256_xor_si256(v, bit)
    };
    let mut sums = [_mm256_setzero_si256(); 4];
    let mut four = [_mm256_setzero_si256(); 4];
    let (mut filled, mut step) = (0, 0);
    for ci in 0..at.c {
        let plane = x.wrapping_add(ci * at.h * at.w);
        for p in 0..kh * kw {
            four[filled] = tap(plane, p);
            filled += 1;
            if filled == 4 {
                // SAFETY: `out` holds step `step`'s 128 bytes.
                unsafe { interleave(four, &mut sums, out.add(step * 128)) };
                (filled, step) = (0, step + 1);
            }
        }
    }
    if filled > 0 {
        four[filled..].fill(_mm256_setzero_si256());
        // SAFETY: as above, the last step.
        unsafe { interleave(four, &mut sums, out.add(step * 128)) };
    }
    // SAFETY: AVX-512F, as this function's contract.
    unsafe { join(sums) }
}

/// [`pack`] for a pointwise convolution (1x1, stride 1, no padding), whose columns are the
/// image's rows: each tap's 32 bytes one masked load.
///
/// # Safety
/// As [`pack`]; the geometry is pointwise.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn pack_pointwise(g: &Group, p0: usize, out: *mut u8) -> [__m512i; 2] {
    let n = g.at.h * g.at.w;
    let k = g.at.c;
    let mask = u32::MAX >> (32 - (n - p0).min(PX));
    let bit = _mm256_set1_epi8(if g.signed { -128 } else { 0 });
    let mut sums = [_mm256_setzero_si256(); 4];
    for s in 0..k.div_ceil(4) {
        let mut four = [_mm256_setzero_si256(); 4];
        for (i, row) in four.iter_mut().enumerate().take(k - 4 * s) {
            // SAFETY: the mask's bytes of pixels `p0..` of channel `4s + i < k`.
            let v = unsafe {
                _mm256_maskz_loadu_epi8(mask, g.x.add((4 * s + i) * n + p0) as *const i8)
            };
            *row = _mm256_xor_si256(v, bit);
        }
        // SAFETY: `out` holds step `s`'s 128 bytes.
        unsafe { interleave(four, &mut sums, out.add(s * 128)) };
    }
    // SAFETY: AVX-512F, as this function's contract.
    unsafe { join(sums) }
}

/// Four taps' 32 bytes (one register each) as one 4-tap step of 32 pixels x 4 bytes, stored at
/// `out` (128 bytes), each pixel's byte sum added to `sums` (pixels 0-7, 8-15, 16-23, 24-31,
/// from the registers stored: a load of what was just stored would wait for the stores).
///
/// # Safety
/// AVX-512VL and VNNI; `out` holds 128 bytes.
#[inline(always)]
unsafe fn interleave(four: [__m256i; 4], sums: &mut [__m256i; 4], out: *mut u8) {
    // SAFETY: the caller's contract.
    unsafe {
        let [a0, a1, a2, a3] = four;
        let t0 = _mm256_unpacklo_epi8(a0, a1);
        let t1 = _mm256_unpackhi_epi8(a0, a1);
        let t2 = _mm256_unpacklo_epi8(a2, a3);
        let t3 = _mm256_unpackhi_epi8(a2, a3);
        // Pixels 0-3 | 16-19, 4-7 | 20-23, 8-11 | 24-27, 12-15 | 28-31.
        let u0 = _mm256_unpacklo_epi16(t0, t2);
        let u1 = _mm256_unpackhi_epi16(t0, t2);
        let u2 = _mm256_unpacklo_epi16(t1, t3);
        let u3 = _mm256_unpackhi_epi16(t1, t3);
        let pixels = [
            _mm256_permute2x128_si256(u0, u1, 0x20),
            _mm256_permute2x128_si256(u2, u3, 0x20),
            _mm256_permute2x128_si256(u0, u1, 0x31),
            _mm256_permute2x128_si256(u2, u3, 0x31),
        ];
        let ones = _mm256_set1_epi8(1);
        for (i, (p, sum)) in pixels.into_iter().zip(sums.iter_mut()).enumerate() {
            *sum = _mm256_dpbusd_epi32(*sum, p, ones);
            _mm256_storeu_si256((out as *mut __m256i).add(i), p);
        }
    }
}

/// [`interleave`]'s four sums as two vectors of sixteen pixels.
///
/// # Safety
/// AVX-512F.
#[inline(always)]
unsafe fn join([s0, s1, s2, s3]: [__m256i; 4]) -> [__m512i; 2] {
    // SAFETY: the caller's contract.
    unsafe {
        [
            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(s0), s1),
            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(s2), s3),
        ]
    }
}

/// The raw products `w'x'` of filter rows `rows..` (`live` of them, `kp` bytes apart; the
/// tile's other rows repeat the last) with a packed block of 32 pixels.
///
/// # Safety
/// AVX-512F and VNNI; `rows` reaches `live` rows of `kp` bytes, `panel` `kp * 32` bytes.
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn tile(rows: *const i8, kp: usize, live: usize, panel: *const u8) -> [[__m512i; 2]; CH] {
    let mut acc = [[_mm512_setzero_si512(); 2]; CH];
    let ptr: [*const i8; CH] = std::array::from_fn(|r| unsafe { rows.add(r.min(live - 1) * kp) });
    for g in 0..kp / 4 {
        // SAFETY: step `g` of the panel and of each row, unaligned loads.
        unsafe {
            let b0 = _mm512_loadu_si512(panel.add(g * 128) as *const _);
            let b1 = _mm512_loadu_si512(panel.add(g * 128 + 64) as *const _);
            for (a, p) in acc.iter_mut().zip(ptr) {
                let x = _mm512_set1_epi32((p.add(g * 4) as *const i32).read_unaligned());
                a[0] = _mm512_dpbusd_epi32(a[0], b0, x);
                a[1] = _mm512_dpbusd_epi32(a[1], b1, x);
            }
        }
    }
    acc
}

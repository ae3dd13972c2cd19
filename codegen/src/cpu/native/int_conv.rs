//! `conv_integer` on the integer product kernels: for each image and group, the receptive
//! fields laid out as byte columns (`[C/groups * kH * kW, oH * oW]`, padding filled with the
//! input's zero point so that it adds nothing), multiplied by the group's filter rows
//! (`[O/groups, C/groups * kH * kW]`, contiguous in the filter) with the filter's zero points
//! per row and the input's for every column. A 1x1 convolution with stride 1 and no padding
//! reads the image itself as its columns. With AVX-512 VNNI the convolution runs on its own
//! kernel instead (`vnni_conv.rs`), which packs the pixels straight from the image.

use tcc_ir::{Conv2d, Function, Value};

use super::int_depthwise::{Depthwise, Isa, Taps};
use super::quant::{IntegerProduct, signed};
use super::requant::Bound;

thread_local! {
    /// A thread's receptive-field columns, kept between calls (every byte is written before it
    /// is read).
    static COLUMNS: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A `conv_integer` as the kernel runs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct IntegerConv {
    conv: Conv2d,
    xd: [usize; 4],
    wd: [usize; 4],
    yd: [usize; 4],
    /// One group's product: its filter rows times its columns.
    product: IntegerProduct,
    /// On AVX-512 VNNI (`product.vnni`) and AVX2, not depthwise: the filter, prepared at
    /// compile time when it and its zero points are constants (else on each run).
    #[cfg(target_arch = "x86_64")]
    prepared: Option<super::vnni_conv::Filter>,
    /// On AVX2 (`product.avx2`): whether the CPU has AVX-VNNI (and the target keeps it), which
    /// takes any filter on the AVX2 convolution, not only 7-bit ones.
    avx_vnni: bool,
    /// On AVX-512 VNNI (`product.vnni`): whether the CPU has AMX-INT8 (and the target keeps
    /// it), which the convolution's products then run on, for groups of more than 16 output
    /// channels.
    amx: bool,
    /// Whether the target has FMA (the AVX2 depthwise kernel's multiply-adds).
    fma: bool,
    /// A depthwise convolution's taps, made at compile time when the filter and its zero
    /// points are constants.
    taps: Option<Taps>,
}

impl IntegerConv {
    /// The convolution `conv_integer(x, w, x_zero, w_zero)` of `f` with result `r`, on the
    /// product kernel `isa` chooses (`(vnni, avx2)`, as for `matmul_integer`).
    pub(super) fn of(
        f: &Function,
        conv: &Conv2d,
        [x, filter, _, wz]: [Value; 4],
        r: Value,
        isa: (bool, bool),
        (avx_vnni, amx, fma): (bool, bool, bool),
    ) -> IntegerConv {
        let d4 = |v: Value| std::array::from_fn(|i| f.ty(v).dims()[i] as usize);
        let (xd, wd, yd): ([usize; 4], [usize; 4], [usize; 4]) = (d4(x), d4(filter), d4(r));
        let groups = conv.groups as usize;
        // AMX's tiles are 32 channels: with 16 or fewer a group wastes half of each (mobilenet
        // v2's 32 -> 16 1x1 at 112x112: 0.13 ms on AMX, 0.11 on VNNI).
        let amx = amx && wd[0] / groups > 16;
        let rows = f.ty(wz).numel() > 1;
        let k = wd[1] * wd[2] * wd[3];
        let product = IntegerProduct {
            batches: vec![(0, 0)],
            m: wd[0] / groups,
            k,
            n: yd[2] * yd[3],
            rows,
            columns: false,
            vnni: isa.0,
            avx2: isa.1,
            avx_vnni: false,
            #[cfg(target_arch = "x86_64")]
            packed_b: None,
        };
        let mut c = IntegerConv {
            conv: conv.clone(),
            xd,
            wd,
            yd,
            product,
            #[cfg(target_arch = "x86_64")]
            prepared: None,
            avx_vnni: avx_vnni && isa.1,
            amx: amx && isa.0,
            fma,
            taps: None,
        };
        // A constant filter prepared now for the kernel that runs it: the depthwise kernel's
        // taps, or the VNNI and AVX2 kernels' rows.
        let Some((w, z)) = const_bytes(f, filter).zip(const_bytes(f, wz)) else {
            return c;
        };
        let sw = signed(f, filter);
        if c.depthwise().is_some() {
            c.taps = Some(Taps::new(&w, &z, sw, wd[2] * wd[3]));
        } else {
            #[cfg(target_arch = "x86_64")]
            if isa.0 || isa.1 {
                let prepared_for = kernel(isa, avx_vnni, amx);
                let filter = super::vnni_conv::Filter::new(&w, &z, sw, (wd[0], k), prepared_for);
                c.prepared = Some(filter);
            }
        }
        c
    }

    /// Where a group's taps fall, for the VNNI kernel; a pointwise convolution as one row.
    #[cfg(target_arch = "x86_64")]
    fn geometry(&self) -> super::vnni_conv::Geometry {
        let [_, c, h, w] = self.xd;
        let [_, _, kh, kw] = self.wd;
        let [_, _, oh, ow] = self.yd;
        let conv = &self.conv;
        if self.pointwise() {
            return super::vnni_conv::Geometry {
                c: c / conv.groups as usize,
                h: 1,
                w: h * w,
                oh: 1,
                ow: oh * ow,
                kh: 1,
                kw: 1,
                stride: [1, 1],
                dilation: [1, 1],
                pad: [0, 0],
            };
        }
        super::vnni_conv::Geometry {
            c: c / conv.groups as usize,
            h,
            w,
            oh,
            ow,
            kh,
            kw,
            stride: conv.strides.map(|s| s as usize),
            dilation: conv.dilations.map(|d| d as usize),
            pad: [conv.pads[0] as usize, conv.pads[1] as usize],
        }
    }

    /// The convolution as its own kernel takes it where it is depthwise (one channel per
    /// group, in and out).
    fn depthwise(&self) -> Option<Depthwise> {
        let (c, groups) = (&self.conv, self.conv.groups as usize);
        let [_, ch, _, _] = self.xd;
        let [o, per, kh, kw] = self.wd;
        (per == 1 && groups == ch && o == groups).then(|| Depthwise {
            xd: self.xd,
            yd: self.yd,
            kernel: [kh, kw],
            strides: c.strides.map(|s| s as usize),
            dilations: c.dilations.map(|d| d as usize),
            pads: c.pads.map(|p| p as usize),
        })
    }

    /// Whether the convolution runs on [`super::vnni_conv`] (the only kernel that takes a
    /// residual in its chain).
    pub(super) fn on_vnni(&self) -> bool {
        cfg!(target_arch = "x86_64") && self.product.vnni && self.depthwise().is_none()
    }

    /// Whether the image is its own columns (1x1, stride 1, no padding).
    fn pointwise(&self) -> bool {
        let c = &self.conv;
        self.wd[2] == 1 && self.wd[3] == 1 && c.strides == [1, 1] && c.pads == [0; 4]
    }

    /// The convolution of byte tensors `x` and `w` (`i8` where `signed` says, else `u8`) less
    /// the zero points `xz` (one byte) and `wz` (one, or one per output channel), into `out`:
    /// its i32 sums, or what the requantizing chain `post` makes of them.
    ///
    /// # Safety
    /// `out` has room for the output's elements of the stored type.
    pub(super) unsafe fn run_bytes(
        &self,
        [x, w, xz, wz]: [&[u8]; 4],
        [sx, sw]: [bool; 2],
        post: Option<&Bound>,
        out: *mut u8,
    ) {
        let IntegerProduct { m, k, n, .. } = self.product;
        let o = self.yd[1];
        // Bytes per stored element: sums and f32 results 4, levels 1.
        let size = match post {
            Some(p) if p.quantize.is_some() => 1,
            _ => 4,
        };
        if let Some(dw) = self.depthwise() {
            let isa = match (self.product.vnni, self.product.avx2) {
                (true, _) => Isa::Avx512,
                (_, true) => Isa::Avx2,
                _ => Isa::Portable,
            };
            // SAFETY: the flags say what the host has; `out` as this function's contract.
            let taps = self.taps.as_ref();
            unsafe { dw.run(([x, w, xz, wz], taps), [sx, sw], (isa, self.fma), post, out) };
            return;
        }
        // The filter as the VNNI and AVX2 kernels take it: prepared at compile time, or now.
        #[cfg(target_arch = "x86_64")]
        let filter = (self.product.vnni || self.product.avx2).then(|| match &self.prepared {
            Some(filter) => std::borrow::Cow::Borrowed(filter),
            None => std::borrow::Cow::Owned(super::vnni_conv::Filter::new(
                w,
                wz,
                sw,
                (o, k),
                kernel(
                    (self.product.vnni, self.product.avx2),
                    self.avx_vnni,
                    self.amx,
                ),
            )),
        });
        #[cfg(target_arch = "x86_64")]
        if let (true, Some(filter)) = (self.product.vnni, &filter) {
            let groups = self.conv.groups as usize;
            let at = self.geometry();
            let plane = at.c * at.h * at.w;
            for b in 0..self.yd[0] {
                for g in 0..groups {
                    let group = super::vnni_conv::Group {
                        x: x[(b * groups + g) * plane..][..plane].as_ptr(),
                        at,
                        first: g * m,
                        m,
                        zx: if sx { xz[0] as i8 as i32 } else { xz[0] as i32 },
                        signed: sx,
                        out: out.wrapping_add(size * (b * o + g * m) * n),
                        post,
                        residual: post
                            .and_then(|p| p.residual)
                            .map(|r| r[(b * o + g * m) * n..].as_ptr()),
                    };
                    // SAFETY: `vnni` is set only where the CPU has AVX-512F, BW, VL and VNNI;
                    // the group's planes and `m * n` results are in range, as the geometry
                    // says.
                    unsafe { super::vnni_conv::convolve(filter, group) };
                }
            }
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if let (true, Some(filter)) = (self.product.avx2, &filter)
            && (self.avx_vnni || filter.narrow || filter.pairs.is_some())
        {
            // SAFETY: `avx2` is set only where the target has AVX2, `avx_vnni` where the CPU
            // has AVX-VNNI; `out` as this function's contract.
            unsafe { self.convolve_avx2(filter, (x, xz[0], sx), post, size, out) };
            return;
        }
        let mut sums = Vec::new();
        let y: &mut [i32] = match post {
            // SAFETY: the caller's contract: without a chain, `out` holds the i32 sums.
            None => unsafe { std::slice::from_raw_parts_mut(out as *mut i32, self.yd[0] * o * n) },
            Some(_) => {
                sums.resize(self.yd[0] * o * n, 0);
                &mut sums
            }
        };
        self.each_group(x, xz[0], y, |g, cols, y| {
            let wz = if self.product.rows {
                &wz[g * m..][..m]
            } else {
                wz
            };
            let w = &w[g * m * k..][..m * k];
            self.product.run_bytes([w, cols, wz, xz], [sw, sx], y);
        });
        if let Some(post) = post {
            // A channel's row of sums an item of the pool (each writes its own row of `out`).
            // SAFETY: the caller's contract: `out` holds the chain's results.
            let dst = unsafe { crate::cpu::send_ptr::SendPtr::new(out) };
            // Where the product runs on AVX2, so does the chain (on VNNI neither comes here).
            let avx2 = self.product.avx2;
            let item = |i: usize| {
                let mut real = Vec::with_capacity(n);
                let at = dst.get().wrapping_add(size * i * n);
                // SAFETY: row `i` of the results, this item's alone.
                unsafe { post.row(&sums[i * n..(i + 1) * n], i % o, at, &mut real, avx2) };
            };
            let rows = sums.len() / n.max(1);
            if sums.len() >= 1 << 15 {
                crate::cpu::pool::for_each(rows, &item);
            } else {
                (0..rows).for_each(item);
            }
        }
    }

    /// [`IntegerConv::run_bytes`] on [`super::avx2_conv`]: each image's and group's columns
    /// (im2col's, or the image itself for a pointwise convolution) times the filter's rows.
    ///
    /// # Safety
    /// AVX2; the CPU has AVX-VNNI (`avx_vnni`), or `filter` is narrow or has its `pairs`;
    /// `out` as [`IntegerConv::run_bytes`]'s, with elements of `size` bytes.
    #[cfg(target_arch = "x86_64")]
    unsafe fn convolve_avx2(
        &self,
        filter: &super::vnni_conv::Filter,
        (x, zero, sx): (&[u8], u8, bool),
        post: Option<&Bound>,
        size: usize,
        out: *mut u8,
    ) {
        let groups = self.conv.groups as usize;
        let IntegerProduct { m, k, n, .. } = self.product;
        let [_, c, h, w] = self.xd;
        let plane = c / groups * h * w;
        let o = self.yd[1];
        COLUMNS.with(|columns| {
            let mut columns = columns.borrow_mut();
            if !self.pointwise() && columns.len() < k * n {
                columns.resize(k * n, 0);
            }
            for b in 0..self.yd[0] {
                for g in 0..groups {
                    let x = &x[(b * groups + g) * plane..][..plane];
                    let cols = if self.pointwise() {
                        x.as_ptr()
                    } else {
                        self.im2col(x, zero, &mut columns[..k * n]);
                        columns.as_ptr()
                    };
                    let group = super::avx2_conv::Columns {
                        cols,
                        n,
                        first: g * m,
                        m,
                        zx: if sx { zero as i8 as i32 } else { zero as i32 },
                        signed: sx,
                        out: out.wrapping_add(size * (b * o + g * m) * n),
                        post,
                        vnni: self.avx_vnni,
                    };
                    // SAFETY: as this function's contract; the group's `k` rows of `n` column
                    // bytes and `m * n` results are in range.
                    unsafe { super::avx2_conv::convolve(filter, group) };
                }
            }
        });
    }

    /// `group(g, columns, out)` for each image and group `g`: its receptive fields as columns
    /// (`[K, oH * oW]`, the padding `zero`) and its block of `out`.
    fn each_group(
        &self,
        x: &[u8],
        zero: u8,
        out: &mut [i32],
        mut group: impl FnMut(usize, &[u8], &mut [i32]),
    ) {
        let groups = self.conv.groups as usize;
        let IntegerProduct { m, k, n, .. } = self.product;
        let [_, c, h, w] = self.xd;
        let plane = c / groups * h * w;
        COLUMNS.with(|columns| {
            let mut columns = columns.borrow_mut();
            if !self.pointwise() && columns.len() < k * n {
                columns.resize(k * n, 0);
            }
            for (b, y) in out.chunks_mut(self.yd[1] * n).enumerate() {
                for (g, y) in y.chunks_mut(m * n).enumerate() {
                    let x = &x[(b * groups + g) * plane..][..plane];
                    if self.pointwise() {
                        group(g, x, y);
                    } else {
                        self.im2col(x, zero, &mut columns[..k * n]);
                        group(g, &columns[..k * n], y);
                    }
                }
            }
        });
    }

    /// One group's receptive fields of `x` (`[C/groups, H, W]`) as the columns `cols`
    /// (`[C/groups * kH * kW, oH * oW]`), `zero` where a tap falls in the padding; the rows of
    /// each input channel and filter row are an item for the thread pool.
    fn im2col(&self, x: &[u8], zero: u8, cols: &mut [u8]) {
        let [_, cg, kh, kw] = self.wd;
        let [_, _, oh, ow] = self.yd;
        let len = kw * oh * ow;
        // SAFETY: item `i` writes rows `i * kw..(i + 1) * kw` of `cols` alone.
        let dst = unsafe { crate::cpu::send_ptr::SendPtr::new(cols.as_mut_ptr()) };
        let item = |i: usize| {
            // SAFETY: as above; `cols` holds `cg * kh` items of `len` bytes.
            let rows = unsafe { std::slice::from_raw_parts_mut(dst.get().add(i * len), len) };
            self.im2col_rows(x, zero, i / kh, i % kh, rows);
        };
        if cols.len() >= 1 << 16 {
            crate::cpu::pool::for_each(cg * kh, &item);
        } else {
            (0..cg * kh).for_each(item);
        }
    }

    /// The `kW` rows of input channel `ci` and filter row `ky` of [`IntegerConv::im2col`].
    fn im2col_rows(&self, x: &[u8], zero: u8, ci: usize, ky: usize, rows: &mut [u8]) {
        let [_, _, h, w] = self.xd;
        let [_, _, oh, ow] = self.yd;
        let c = &self.conv;
        let [sh, sw] = c.strides.map(|s| s as usize);
        let [dh, dw] = c.dilations.map(|d| d as usize);
        let (pt, pl) = (c.pads[0] as usize, c.pads[1] as usize);
        let plane = &x[ci * h * w..][..h * w];
        for (kx, row) in rows.chunks_mut(oh * ow).enumerate() {
            // Output columns whose tap lands inside the row: `ox * sw + kx * dw - pl` in
            // `0..w`.
            let off = kx * dw;
            let lo = pl.saturating_sub(off).div_ceil(sw).min(ow);
            let hi = (w + pl).saturating_sub(off).div_ceil(sw).clamp(lo, ow);
            for (oy, dst) in row.chunks_mut(ow).enumerate() {
                let iy = (oy * sh + ky * dh).wrapping_sub(pt);
                if iy >= h {
                    dst.fill(zero);
                    continue;
                }
                let src = &plane[iy * w..][..w];
                dst[..lo].fill(zero);
                dst[hi..].fill(zero);
                let first = lo * sw + off - pl;
                if sw == 1 {
                    dst[lo..hi].copy_from_slice(&src[first..first + hi - lo]);
                } else {
                    for (t, d) in dst[lo..hi].iter_mut().enumerate() {
                        *d = src[first + t * sw];
                    }
                }
            }
        }
    }
}

/// The bytes of `v` if it is a constant of a byte type.
#[cfg(target_arch = "x86_64")]
pub(super) fn const_bytes(f: &Function, v: Value) -> Option<Vec<u8>> {
    let tcc_ir::OpKind::Const { ty, value } = &f.op(f.def_op(v)?).kind else {
        return None;
    };
    let t = tcc_ir::Tensor::from_literal(ty, value).ok()?;
    (t.dtype().size_bytes() == 1).then(|| t.to_le_bytes())
}

/// The kernel the convolution's filter is prepared for, on the product kernel `isa` chooses
/// (`(vnni, avx2)`).
#[cfg(target_arch = "x86_64")]
fn kernel(isa: (bool, bool), avx_vnni: bool, amx: bool) -> super::vnni_conv::Kernel {
    use super::vnni_conv::Kernel;
    match isa {
        (true, _) if amx => Kernel::Amx,
        (false, true) if !avx_vnni => Kernel::Avx2,
        _ => Kernel::Vnni,
    }
}

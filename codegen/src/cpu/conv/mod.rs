//! Convolutions and their gradients on the CPU: im2col (or, with AVX-512, an implicit im2col
//! inside the GEMM's packing) and one GEMM per group of images, col2im for the input gradient,
//! and a direct kernel for depthwise convolutions. Also the scratch rule the memory plan asks
//! this backend for.
//!
//! This file is long because the paths share their tap geometry (`Taps`, `in_bounds`,
//! `phase_spans`), which `depthwise.rs`, `sgemm/` and `native/` (pooling) also use.

mod depthwise;
mod nchwc;
mod winograd;

pub(super) use nchwc::{NchwcConv, fusible};

use super::lower::Finish;
use super::matmul::{Mat, gemm};
use super::send_ptr::SendPtr;
use super::sgemm;
use crate::plan::{KernelData, KernelKind};
use tcc_ir::{DType, Function, OpKind, Value};

/// Which product a convolution step computes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum ConvMode {
    /// `y = conv2d(x, w)`: im2col, then `W · cols`.
    Forward,
    /// `x = conv2d_grad_input(y, w)`: `W^T · dy`, then col2im.
    GradInput,
    /// `w = conv2d_grad_filter(x, y)`: im2col, then `dW += dy · cols^T` over the batch.
    GradFilter,
}

/// A convolution or one of its gradients as im2col/col2im through scratch space (skipped for a
/// plain 1x1) and one `gemm` per image and group. `x`, `w` and `y` are the forward input, filter
/// and output (or their gradients); the one the mode computes is written.
pub(super) struct Conv {
    mode: ConvMode,
    x: Value,
    w: Value,
    pub y: Value,
    dtype: DType,
    attrs: tcc_ir::Conv2d,
    /// `[N, C, H, W]`, `[O, C/groups, kH, kW]` and `[N, O, oH, oW]`.
    xd: [usize; 4],
    wd: [usize; 4],
    yd: [usize; 4],
    /// Arena offset of the scratch (`scratch_bytes`); none for a plain 1x1 done image by
    /// image.
    scratch: Option<u64>,
    /// Images side by side in one GEMM (`conv_group`).
    group: usize,
    /// A constant filter packed for our f32 GEMM, one per group (forward only).
    packed: Vec<sgemm::PackedA>,
    /// Our kernel for f32 GEMMs, if the target has one ([`super::matmul::own_gemm`]).
    own: Option<sgemm::Isa>,
    /// Whether the target has AVX2 and FMA (the depthwise kernel's wide version).
    fma: bool,
}

impl Conv {
    /// The step for `mode` with forward input `x`, filter `w` and output `y` (one of which the
    /// mode computes), using the scratch slot at arena offset `scratch`.
    pub(super) fn new(
        f: &Function,
        mode: ConvMode,
        attrs: &tcc_ir::Conv2d,
        [x, w, y]: [Value; 3],
        scratch: Option<u64>,
        features: &super::Features,
    ) -> Conv {
        let own = super::matmul::own_gemm(features);
        let dims4 =
            |v: Value| -> [usize; 4] { std::array::from_fn(|i| f.ty(v).dims()[i] as usize) };
        Conv {
            mode,
            x,
            w,
            y,
            dtype: f.ty(y).dtype(),
            attrs: attrs.clone(),
            xd: dims4(x),
            wd: dims4(w),
            yd: dims4(y),
            scratch,
            group: conv_group(f.ty(x).dims()[0], f.ty(y).dims()[2] * f.ty(y).dims()[3]) as usize,
            packed: match own {
                Some(isa) if mode == ConvMode::Forward => {
                    pack_filter(f, w, attrs.groups as usize, isa)
                }
                _ => Vec::new(),
            },
            own,
            fma: features.avx2 && features.fma,
        }
    }

    /// The value this step writes.
    pub(super) fn dst(&mut self) -> &mut Value {
        match self.mode {
            ConvMode::Forward => &mut self.y,
            ConvMode::GradInput => &mut self.x,
            ConvMode::GradFilter => &mut self.w,
        }
    }
}

/// Images a convolution over `images` images of `m` output pixels each puts side by side in one
/// GEMM: enough for about 256 columns, so that small images do not make tiny GEMMs.
pub(super) fn conv_group(images: u64, m: u64) -> u64 {
    256u64.div_ceil(m.max(1)).clamp(1, images.max(1))
}

/// Bytes of scratch space a kernel needs while it runs: for a convolution or its gradients, the
/// im2col columns of one image (none for a plain 1x1), or, when several images share a GEMM
/// ([`conv_group`]), their columns `[C/g*kH*kW, G*oH*oW]` and output-side rows
/// `[O/g, G*oH*oW]`. Backends use the same rule to find the space the plan set aside.
pub(super) fn scratch_bytes(f: &Function, kd: &KernelData) -> u64 {
    let KernelKind::Library { root } = kd.kind else {
        return 0;
    };
    let d = f.op(root);
    // The forward input, filter and output types, whichever of them the op computes.
    let (a0, a1, r) = (d.args[0], d.args[1], d.results[0]);
    let (c, x, w, y) = match &d.kind {
        OpKind::Conv2d(c) => (c, f.ty(a0), f.ty(a1), f.ty(r)),
        OpKind::Conv2dGradInput { conv, .. } => (conv, f.ty(r), f.ty(a1), f.ty(a0)),
        OpKind::Conv2dGradFilter { conv, .. } => (conv, f.ty(a0), f.ty(r), f.ty(a1)),
        _ => return 0,
    };
    conv_scratch_elements(c, x.dims(), w.dims(), y.dims()) * x.dtype().size_bytes()
}

/// Elements of scratch one thread of a convolution needs (see [`scratch_bytes`]), given the
/// forward input, filter and output dims.
pub(super) fn conv_scratch_elements(c: &tcc_ir::Conv2d, x: &[u64], w: &[u64], y: &[u64]) -> u64 {
    let (kh, kw) = (w[2], w[3]);
    let m = y[2] * y[3];
    let kk = w[1] * kh * kw;
    let group = conv_group(x[0], m);
    if group > 1 {
        return group * (kk + w[0] / c.groups) * m;
    }
    let direct = kh == 1 && kw == 1 && c.strides == [1, 1] && c.pads == [0; 4];
    if direct { 0 } else { kk * m }
}

/// A constant f32 filter `[O, C/g, kH, kW]` packed for our GEMM on `isa`, one `[O/g, C/g·kH·kW]`
/// matrix per group; empty when the filter is not an f32 constant.
fn pack_filter(f: &Function, w: Value, groups: usize, isa: sgemm::Isa) -> Vec<sgemm::PackedA> {
    let Some(t) = super::lower::f32_constant(f, w) else {
        return Vec::new();
    };
    let data = t.as_f32().expect("an f32 constant");
    let d = f.ty(w).dims();
    let (og, kk) = (d[0] as usize / groups, (d[1] * d[2] * d[3]) as usize);
    (0..groups)
        .map(|g| {
            let a = Mat {
                ptr: data[g * og * kk..].as_ptr(),
                rs: kk,
                cs: 1,
            };
            // SAFETY: group g's rows of the filter are og x kk elements of `data`.
            unsafe { sgemm::PackedA::new(isa, og, kk, a) }
        })
        .collect()
}

/// Runs the convolution step, telling `finish` of its output's elements as they become final.
pub(super) fn run_conv(cv: &Conv, addr: &dyn Fn(Value) -> *mut u8, base: *mut u8, finish: Finish) {
    let (x, w, y) = (addr(cv.x), addr(cv.w), addr(cv.y));
    let scratch = cv.scratch.map(|off| base.wrapping_add(off as usize));
    // SAFETY: x, w and y hold tensors of the dims recorded at compile time, and the scratch
    // slot holds C/groups * kH * kW * oH * oW elements (scratch_bytes).
    unsafe {
        match cv.dtype {
            DType::F32 => conv_gemm::<f32>(
                cv,
                x as _,
                w as _,
                y as _,
                scratch.map(|p| p as _),
                1.0,
                finish,
            ),
            DType::F64 => conv_gemm::<f64>(
                cv,
                x as _,
                w as _,
                y as _,
                scratch.map(|p| p as _),
                1.0,
                finish,
            ),
            _ => unreachable!("library convolutions are f32 or f64"),
        }
    }
}

/// The outputs `lo..hi` (of `n_out`) whose tap reads inside an axis of length `len`, when output
/// `o` reads position `o * stride + off`; `(0, 0)` when there are none.
pub(crate) fn in_bounds(off: isize, stride: isize, len: isize, n_out: usize) -> (usize, usize) {
    let (lo, hi) = if stride == 1 {
        ((-off).max(0), (len - off).min(n_out as isize))
    } else {
        let lo = if off >= 0 {
            0
        } else {
            (-off + stride - 1) / stride
        };
        let hi = if len - 1 - off < 0 {
            0
        } else {
            ((len - 1 - off) / stride + 1).min(n_out as isize)
        };
        (lo, hi)
    };
    if hi <= lo {
        (0, 0)
    } else {
        (lo as usize, hi as usize)
    }
}

/// An `h x w` plane with its columns split by phase for a column stride `s`: phase `q` holds
/// columns `q, q + s, ...` of every row, `w.div_ceil(s)` per row, so strided reads along a row
/// become contiguous ones.
pub(crate) fn phase_split<T: Copy + Default>(x: &[T], h: usize, w: usize, s: usize) -> Vec<T> {
    let pw = w.div_ceil(s);
    let mut v = vec![T::default(); s * h * pw];
    for q in 0..s.min(w) {
        for r in 0..h {
            let dst = &mut v[(q * h + r) * pw..(q * h + r + 1) * pw];
            for (d, &e) in dst
                .iter_mut()
                .zip(x[r * w + q..(r + 1) * w].iter().step_by(s))
            {
                *d = e;
            }
        }
    }
    v
}

/// For each of `kw` window columns (dilation `d`, padding `p` before, column stride `s`): the
/// outputs `lo..hi` (of `ow`) whose tap is inside a row of `w`, and where their inputs start in
/// the [`phase_split`] plane of `h` rows (row 0; add `row * w.div_ceil(s)`).
pub(crate) fn phase_spans(
    kw: usize,
    d: isize,
    p: isize,
    s: usize,
    (h, w, ow): (usize, usize, usize),
) -> Vec<(usize, usize, usize)> {
    let pw = w.div_ceil(s);
    (0..kw)
        .map(|kx| {
            let off = kx as isize * d - p;
            let (lo, hi) = in_bounds(off, s as isize, w as isize, ow);
            if hi == lo {
                return (0, 0, 0);
            }
            let first = (lo as isize * s as isize + off) as usize;
            (lo, hi, (first % s) * h * pw + first / s)
        })
        .collect()
}

/// The position in the padded input that tap `(ky, kx)` of output `(oy, ox)` reads, if it is
/// inside the image: one function for im2col and col2im.
struct Taps {
    h: isize,
    w: isize,
    s: [isize; 2],
    d: [isize; 2],
    p: [isize; 2],
}

impl Taps {
    fn new(cv: &Conv) -> Taps {
        Taps {
            h: cv.xd[2] as isize,
            w: cv.xd[3] as isize,
            s: cv.attrs.strides.map(|v| v as isize),
            d: cv.attrs.dilations.map(|v| v as isize),
            p: [cv.attrs.pads[0] as isize, cv.attrs.pads[1] as isize],
        }
    }

    /// Calls `f(column row, first column, first image index, length)` for every run of in-image
    /// taps along one output row: columns `j..j+len` of the row read image positions `i`,
    /// `i + stride`, ... (one channel group).
    fn runs(&self, cv: &Conv, mut f: impl FnMut(usize, usize, usize, usize)) {
        let [_, cg, kh, kw] = cv.wd;
        let [_, _, oh, ow] = cv.yd;
        let (h, w, s) = (self.h, self.w, self.s[1]);
        for ci in 0..cg {
            for ky in 0..kh {
                for kx in 0..kw {
                    let row = (ci * kh + ky) * kw + kx;
                    // ix = ox * s + off must lie in 0..w.
                    let off = kx as isize * self.d[1] - self.p[1];
                    let (lo, hi) = in_bounds(off, s, w, ow);
                    if hi == lo {
                        continue;
                    }
                    let len = hi - lo;
                    for oy in 0..oh {
                        let iy = oy as isize * self.s[0] + ky as isize * self.d[0] - self.p[0];
                        if iy < 0 || iy >= h {
                            continue;
                        }
                        let ix = lo as isize * s + off;
                        let i = (ci * h as usize + iy as usize) * w as usize + ix as usize;
                        f(row, oy * ow + lo, i, len);
                    }
                }
            }
        }
    }

    /// im2col of one image (group): `m` columns of `cols [kk, ld]` from `image`, zeros where
    /// padding is read.
    ///
    /// # Safety
    /// `image` holds the group's channels, `cols` `kk * m` elements.
    unsafe fn im2col<T: Copy + Default>(
        &self,
        cv: &Conv,
        image: *const T,
        cols: *mut T,
        m: usize,
        ld: usize,
    ) {
        let [_, cg, kh, kw] = cv.wd;
        let s = self.s[1] as usize;
        // SAFETY: the caller's contract; runs stay inside their row and the image.
        unsafe {
            for row in 0..cg * kh * kw {
                std::slice::from_raw_parts_mut(cols.add(row * ld), m).fill(T::default());
            }
            self.runs(cv, |row, j, i, len| {
                let dst = std::slice::from_raw_parts_mut(cols.add(row * ld + j), len);
                if s == 1 {
                    dst.copy_from_slice(std::slice::from_raw_parts(image.add(i), len));
                } else {
                    for (t, d) in dst.iter_mut().enumerate() {
                        *d = *image.add(i + t * s);
                    }
                }
            });
        }
    }

    /// col2im of one image (group): adds each column element into the image position it read.
    ///
    /// # Safety
    /// As for `im2col`.
    unsafe fn col2im<T: Copy + std::ops::AddAssign>(
        &self,
        cv: &Conv,
        cols: *const T,
        image: *mut T,
        ld: usize,
    ) {
        let s = self.s[1] as usize;
        // SAFETY: as for `im2col`.
        unsafe {
            self.runs(cv, |row, j, i, len| {
                let src = std::slice::from_raw_parts(cols.add(row * ld + j), len);
                for (t, &v) in src.iter().enumerate() {
                    *image.add(i + t * s) += v;
                }
            });
        }
    }
}

/// A convolution or one of its gradients by im2col/col2im and `gemm`. Images are split among
/// threads, each with its own columns buffer (the planned scratch slot for the first) and, for
/// the filter gradient, its own partial sum, added up at the end. A forward convolution tells
/// `finish` of its output piece by piece as it is written; a gradient, all of it at the end.
///
/// # Safety
/// As for `run_conv`; `scratch` is `None` only for a plain 1x1 convolution.
unsafe fn conv_gemm<
    T: Copy + Default + Send + Sync + std::ops::AddAssign + std::ops::Mul<Output = T> + 'static,
>(
    cv: &Conv,
    x: *mut T,
    w: *mut T,
    y: *mut T,
    scratch: Option<*mut T>,
    one: T,
    finish: Finish,
) {
    let nb = cv.xd[0];
    let [o, cg, kh, kw] = cv.wd;
    let dims = |d: [usize; 4]| d.map(|v| v as u64);
    let cols_len =
        conv_scratch_elements(&cv.attrs, &dims(cv.xd), &dims(cv.wd), &dims(cv.yd)) as usize;
    if cv.mode == ConvMode::Forward && cg == 1 && o == cv.xd[1] && cv.attrs.groups as usize == o {
        // SAFETY: the caller's contract.
        unsafe { depthwise::depthwise(cv, x, w, y, finish) };
        return;
    }
    let parts = super::pool::threads().min(nb).max(1);
    let per = nb.div_ceil(parts);
    if cv.mode == ConvMode::GradInput {
        // SAFETY: dx holds nb * C * H * W elements.
        unsafe { std::ptr::write_bytes(x, 0, nb * cv.xd[1] * cv.xd[2] * cv.xd[3]) };
    }
    let wlen = o * cg * kh * kw;
    // The output of a gradient is final once every image is done.
    let finish_gradient = || {
        let len = match cv.mode {
            ConvMode::Forward => return,
            ConvMode::GradInput => cv.xd.iter().product(),
            ConvMode::GradFilter => wlen,
        };
        if let Some(finish) = finish {
            finish(0..len);
        }
    };
    if parts == 1 {
        // SAFETY: the caller's contract, all images on this thread.
        unsafe { conv_images(cv, 0..nb, x, w, y, scratch, one, true, finish) };
        finish_gradient();
        return;
    }
    // Thread t > 0 gets its own columns and, for the filter gradient, its own partial sum.
    let mut spare: Vec<(Vec<T>, Vec<T>)> = (1..parts)
        .map(|_| {
            let cols = vec![T::default(); cols_len];
            let dw = if cv.mode == ConvMode::GradFilter {
                vec![T::default(); wlen]
            } else {
                Vec::new()
            };
            (cols, dw)
        })
        .collect();
    // SAFETY (for every `SendPtr` below): threads work on disjoint image ranges of x and y,
    // their own columns, and (for the filter gradient) their own partial sums; the filter of a
    // forward or input-gradient step is only read.
    let share = |p: *mut T| unsafe { SendPtr::new(p) };
    let (px, pw, py) = (share(x), share(w), share(y));
    // Each job: its thread, its columns buffer, and the filter (gradient) it uses.
    type Job<T> = (usize, Option<SendPtr<*mut T>>, SendPtr<*mut T>);
    let jobs: Vec<Job<T>> = std::iter::once((0, scratch.map(share), pw))
        .chain(spare.iter_mut().enumerate().map(|(t, (cols, dw))| {
            let cols = scratch.map(|_| share(cols.as_mut_ptr()));
            let w = if cv.mode == ConvMode::GradFilter {
                share(dw.as_mut_ptr())
            } else {
                pw
            };
            (t + 1, cols, w)
        }))
        .collect();
    super::pool::for_each(jobs.len(), &|j| {
        let (t, cols, wt) = jobs[j];
        let images = t * per..((t + 1) * per).min(nb);
        let (x, w, y) = (px.get(), wt.get(), py.get());
        // SAFETY: as for the `SendPtr`s: disjoint images, own columns and partial sums.
        unsafe {
            conv_images(
                cv,
                images,
                x,
                w,
                y,
                cols.map(|c| c.get()),
                one,
                false,
                finish,
            )
        };
    });
    if cv.mode == ConvMode::GradFilter {
        // SAFETY: dw holds wlen elements; the partial sums are separate buffers.
        let dw = unsafe { std::slice::from_raw_parts_mut(w, wlen) };
        for (_, part) in &spare {
            for (d, &p) in dw.iter_mut().zip(part) {
                *d += p;
            }
        }
    }
    finish_gradient();
}

/// The convolution of `images` on one thread (see `conv_gemm`), `cv.group` images side by side
/// per GEMM, with `parallel` GEMMs when the thread has all the images. For a chunk of `B`
/// images the scratch holds the columns `cols [kk, B*m]` (image `i` in columns `i*m..`) and the
/// output-side rows `rows [og, B*m]`:
///
/// - forward: im2col, `rows = W_g · cols`, rows copied to `y`;
/// - filter gradient: im2col, `dy` gathered into `rows`, `dW_g += rows · cols^T`;
/// - input gradient: `dy` gathered, `cols = W_g^T · rows`, col2im.
///
/// With one image the rows are that image's own output (nothing to copy), and a plain 1x1 with
/// no scratch reads (or writes) the image itself as its columns. A forward convolution tells
/// `finish` of each image's output channels of a group once written (by rows as the GEMM
/// finishes them, where it writes the output directly).
///
/// # Safety
/// As for `conv_gemm`; `w` is the filter (or this thread's partial filter gradient); the scratch
/// holds what `scratch_bytes` says.
#[allow(clippy::too_many_arguments)]
unsafe fn conv_images<T: Copy + Default + std::ops::AddAssign + 'static>(
    cv: &Conv,
    images: std::ops::Range<usize>,
    x: *mut T,
    w: *mut T,
    y: *mut T,
    scratch: Option<*mut T>,
    one: T,
    parallel: bool,
    finish: Finish,
) {
    let [_, c, h, wd] = cv.xd;
    let [o, cg, kh, kw] = cv.wd;
    let [_, _, oh, ow] = cv.yd;
    let g = cv.attrs.groups as usize;
    let og = o / g;
    let (kk, m) = (cg * kh * kw, oh * ow);
    let taps = Taps::new(cv);
    let (first, end) = (images.start, images.end);
    for n0 in images.step_by(cv.group.max(1)) {
        let b = cv.group.max(1).min(end - n0);
        let ld = b * m;
        // SAFETY (block): every pointer stays inside its tensor or the scratch; the GEMM's
        // destination overlaps neither operand.
        unsafe {
            for gi in 0..g {
                let image = |i: usize| x.add(((n0 + i) * c + gi * cg) * h * wd);
                let out = |i: usize| y.add(((n0 + i) * o + gi * og) * m);
                let filt = w.add(gi * og * kk);
                let cols = scratch.unwrap_or_else(|| image(0));
                let rows = match scratch {
                    Some(s) if b > 1 => s.add(kk * cv.group * m),
                    _ => out(0),
                };
                // The gathered panels index image rows with 32-bit offsets.
                let narrow = wd < 1 << 30 && cv.attrs.strides[1] < 1 << 20;
                let own = cv.own.filter(|_| {
                    cv.mode == ConvMode::Forward
                        && std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>()
                        && narrow
                        && (scratch.is_some() || !cv.packed.is_empty())
                });
                let implicit = own.is_some();
                if let Some(isa) = own {
                    // The f32 GEMM gathers its columns from the images itself (a plain 1x1
                    // reads its one image as they are).
                    let view = sgemm::Im2col {
                        x: image(0) as *const f32,
                        image_stride: c * h * wd,
                        h,
                        w: wd,
                        kh,
                        kw,
                        oh,
                        ow,
                        stride: cv.attrs.strides.map(|v| v as usize),
                        dilation: cv.attrs.dilations.map(|v| v as usize),
                        pad: [cv.attrs.pads[0] as usize, cv.attrs.pads[1] as usize],
                    };
                    let a = match cv.packed.get(gi) {
                        Some(p) => sgemm::A::Packed(p),
                        None => sgemm::A::Mat(Mat {
                            ptr: filt as *const f32,
                            rs: kk,
                            cs: 1,
                        }),
                    };
                    let threads = if parallel { super::pool::threads() } else { 1 };
                    let b_op = match scratch {
                        Some(_) => sgemm::B::Im2col(view),
                        None => sgemm::B::Mat(Mat {
                            ptr: cols as *const f32,
                            rs: m,
                            cs: 1,
                        }),
                    };
                    // With one image the GEMM writes the output: its rows are reported as the
                    // GEMM finishes them; otherwise after the copy below.
                    let at = ((n0 * o) + gi * og) * m;
                    let by_row = move |r: usize, cols: std::ops::Range<usize>| {
                        if let Some(finish) = finish {
                            finish(at + r * m + cols.start..at + r * m + cols.end)
                        }
                    };
                    let done: sgemm::Done = (b == 1 && finish.is_some()).then_some(&by_row);
                    sgemm::product(
                        isa,
                        og,
                        ld,
                        kk,
                        a,
                        b_op,
                        rows as *mut f32,
                        ld,
                        false,
                        threads,
                        done,
                    );
                } else if cv.mode != ConvMode::GradInput && scratch.is_some() {
                    for i in 0..b {
                        taps.im2col(cv, image(i), cols.add(i * m), m, ld);
                    }
                }
                if cv.mode != ConvMode::Forward && b > 1 {
                    for i in 0..b {
                        for r in 0..og {
                            std::ptr::copy_nonoverlapping(
                                out(i).add(r * m),
                                rows.add(r * ld + i * m),
                                m,
                            );
                        }
                    }
                }
                match cv.mode {
                    ConvMode::Forward if implicit => {}
                    ConvMode::Forward => gemm(
                        og,
                        ld,
                        kk,
                        Mat::rows(filt, kk),
                        Mat::rows(cols, ld),
                        rows,
                        ld,
                        false,
                        one,
                        parallel,
                        cv.own,
                        None,
                    ),
                    ConvMode::GradFilter => gemm(
                        og,
                        kk,
                        ld,
                        Mat::rows(rows, ld),
                        Mat::transposed(cols, ld),
                        filt,
                        kk,
                        n0 > first,
                        one,
                        parallel,
                        cv.own,
                        None,
                    ),
                    ConvMode::GradInput => gemm(
                        kk,
                        ld,
                        og,
                        Mat::transposed(filt, kk),
                        Mat::rows(rows, ld),
                        cols,
                        ld,
                        false,
                        one,
                        parallel,
                        cv.own,
                        None,
                    ),
                }
                if cv.mode == ConvMode::Forward && b > 1 {
                    for i in 0..b {
                        for r in 0..og {
                            std::ptr::copy_nonoverlapping(
                                rows.add(r * ld + i * m),
                                out(i).add(r * m),
                                m,
                            );
                        }
                    }
                }
                if cv.mode == ConvMode::GradInput && scratch.is_some() {
                    for i in 0..b {
                        taps.col2im(cv, cols.add(i * m), image(i), ld);
                    }
                }
                if let (ConvMode::Forward, Some(finish)) = (cv.mode, finish)
                    && !(implicit && b == 1)
                {
                    for i in 0..b {
                        let at = ((n0 + i) * o + gi * og) * m;
                        finish(at..at + og * m);
                    }
                }
            }
        }
    }
}

//! `conv_integer` on the integer product kernels: for each image and group, the receptive
//! fields laid out as byte columns (`[C/groups * kH * kW, oH * oW]`, padding filled with the
//! input's zero point so that it adds nothing), multiplied by the group's filter rows
//! (`[O/groups, C/groups * kH * kW]`, contiguous in the filter) with the filter's zero points
//! per row and the input's for every column. A 1x1 convolution with stride 1 and no padding
//! reads the image itself as its columns.

use tcc_ir::{Conv2d, Function, Value};

use super::quant::IntegerProduct;

/// A `conv_integer` as the kernel runs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct IntegerConv {
    conv: Conv2d,
    xd: [usize; 4],
    wd: [usize; 4],
    yd: [usize; 4],
    /// One group's product: its filter rows times its columns.
    product: IntegerProduct,
}

impl IntegerConv {
    /// The convolution `conv_integer(x, w, x_zero, w_zero)` of `f` with result `r`, on the
    /// product kernel `isa` chooses (`(vnni, avx2)`, as for `matmul_integer`).
    pub(super) fn of(
        f: &Function,
        conv: &Conv2d,
        [x, w, _, wz]: [Value; 4],
        r: Value,
        isa: (bool, bool),
    ) -> IntegerConv {
        let d4 = |v: Value| std::array::from_fn(|i| f.ty(v).dims()[i] as usize);
        let (xd, wd, yd): ([usize; 4], [usize; 4], [usize; 4]) = (d4(x), d4(w), d4(r));
        let groups = conv.groups as usize;
        let rows = f.ty(wz).numel() > 1;
        let product = IntegerProduct {
            batches: vec![(0, 0)],
            m: wd[0] / groups,
            k: wd[1] * wd[2] * wd[3],
            n: yd[2] * yd[3],
            rows,
            columns: false,
            vnni: isa.0,
            avx2: isa.1,
        };
        IntegerConv {
            conv: conv.clone(),
            xd,
            wd,
            yd,
            product,
        }
    }

    /// Whether the image is its own columns (1x1, stride 1, no padding).
    fn pointwise(&self) -> bool {
        let c = &self.conv;
        self.wd[2] == 1 && self.wd[3] == 1 && c.strides == [1, 1] && c.pads == [0; 4]
    }

    /// The convolution of byte tensors `x` and `w` (`i8` where `signed` says, else `u8`) less
    /// the zero points `xz` (one byte) and `wz` (one, or one per output channel), into `out`.
    pub(super) fn run_bytes(
        &self,
        [x, w, xz, wz]: [&[u8]; 4],
        [sx, sw]: [bool; 2],
        out: &mut [i32],
    ) {
        let groups = self.conv.groups as usize;
        let IntegerProduct { m, k, n, .. } = self.product;
        let [_, c, h, wide] = self.xd;
        let cg = c / groups;
        let image = c * h * wide;
        let mut columns = vec![0u8; if self.pointwise() { 0 } else { k * n }];
        for (b, y) in out.chunks_mut(self.yd[1] * n).enumerate() {
            for (g, y) in y.chunks_mut(m * n).enumerate() {
                let x = &x[b * image + g * cg * h * wide..][..cg * h * wide];
                let cols = if self.pointwise() {
                    x
                } else {
                    self.im2col(x, xz[0], &mut columns);
                    &columns[..]
                };
                let wz = if self.product.rows {
                    &wz[g * m..][..m]
                } else {
                    wz
                };
                let w = &w[g * m * k..][..m * k];
                self.product.run_bytes([w, cols, wz, xz], [sw, sx], y);
            }
        }
    }

    /// One group's receptive fields of `x` (`[C/groups, H, W]`) as the columns `cols`
    /// (`[C/groups * kH * kW, oH * oW]`), `zero` where a tap falls in the padding.
    fn im2col(&self, x: &[u8], zero: u8, cols: &mut [u8]) {
        let [_, cg, kh, kw] = self.wd;
        let [_, _, h, w] = self.xd;
        let [_, _, oh, ow] = self.yd;
        let c = &self.conv;
        let [sh, sw] = c.strides.map(|s| s as usize);
        let [dh, dw] = c.dilations.map(|d| d as usize);
        let (pt, pl) = (c.pads[0] as usize, c.pads[1] as usize);
        let mut rows = cols.chunks_mut(oh * ow);
        for ci in 0..cg {
            let plane = &x[ci * h * w..][..h * w];
            for ky in 0..kh {
                for kx in 0..kw {
                    let row = rows.next().expect("k rows");
                    // Output columns whose tap lands inside the row: `ox * sw + kx * dw - pl`
                    // in `0..w`.
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
    }
}

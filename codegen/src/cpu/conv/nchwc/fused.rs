//! A depthwise convolution and the 1x1 convolution that alone reads its output, run as one step
//! band by band: the depthwise output of a band of rows, every block of it, goes to a buffer
//! that stays in L2, and the 1x1 convolution reads it from there. The depthwise output (an
//! inverted residual block's widest tensor, six times its input's channels) is never stored.
//!
//! At batch 8, MobileNetV2's depthwise outputs at 112x112 and 56x56 are 10-15 MiB a layer:
//! written by one step and read back by the next they go through memory twice, and those layers
//! were bound by it. Fused, each band is read from L2 while it is still there. Smaller outputs
//! stay in cache between steps anyway, and a band's 1x1 convolution reads all its filter, so
//! only layers whose depthwise output per image passes [`FUSE_BYTES`] are fused.

use super::direct::Band;
use super::{B, BUFFER, Filter, NchwcConv, Out, pieces_wanted};
use crate::cpu::conv::{Finish, SendPtr};
use crate::cpu::post::{Layout, Post, PostOp};
use crate::plan::KernelData;
use std::cell::RefCell;
use tcc_ir::edit::Users;
use tcc_ir::{Function, OpKind, Value};

/// Bytes of depthwise output per image from which the pair runs fused.
const FUSE_BYTES: u64 = 1 << 20;

/// Bytes of depthwise output a band holds: with the depthwise kernel's own padded rows, within
/// L2 (512 KiB on the machines measured).
const BAND_BYTES: usize = 160 << 10;

thread_local! {
    /// Each thread's band of depthwise output.
    static BAND: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Whether library kernels `dw` and `pw`, in that order, run as one fused step: `dw` a blocked
/// depthwise `conv2d_nchwc` (whole blocks of channels, a constant filter) whose epilogue reads
/// no tensor but per-channel operands, producing a value that only `pw` reads; `pw` a blocked
/// 1x1 convolution of it at stride 1, one group, a constant filter, with an epilogue the
/// kernel applies as it stores; and the depthwise output at least [`FUSE_BYTES`] per image.
pub(in crate::cpu) fn fusible(
    f: &Function,
    users: &Users,
    dw: &KernelData,
    pw: &KernelData,
) -> bool {
    let (Some(&d0), Some(&p0)) = (dw.ops.first(), pw.ops.first()) else {
        return false;
    };
    let (dd, pd) = (f.op(d0), f.op(p0));
    let (OpKind::Conv2dNchwc { conv: dc, block: 8 }, OpKind::Conv2dNchwc { conv: pc, block: 8 }) =
        (&dd.kind, &pd.kind)
    else {
        return false;
    };
    let constant = |v: Value| {
        f.def_op(v)
            .is_some_and(|op| matches!(f.op(op).kind, OpKind::Const { .. }))
    };
    let (x, mid) = (f.ty(dd.args[0]), f.ty(pd.args[0]));
    let [o, cg, ..] = f.ty(dd.args[1]).dims()[..] else {
        return false;
    };
    let [_, _, kh, kw] = f.ty(pd.args[1]).dims()[..] else {
        return false;
    };
    let depthwise = x.rank() == 5
        && x.dtype() == tcc_ir::DType::F32
        && cg == 1
        && dc.groups == o
        && o % B as u64 == 0
        && constant(dd.args[1]);
    let pointwise = mid.rank() == 5
        && pc.groups == 1
        && [kh, kw] == [1, 1]
        && pc.strides == [1, 1]
        && pc.pads == [0; 4]
        && constant(pd.args[1]);
    let d = mid.dims();
    let big = d[1] * d[2] * d[3] * d[4] * 4 >= FUSE_BYTES;
    if !(depthwise && pointwise && big) {
        return false;
    }
    let only_pw = dw.outputs == [pd.args[0]]
        && !users.is_returned(pd.args[0])
        && users.uses(pd.args[0]).iter().all(|&(u, _)| u == p0);
    let dw_post = Post::of(f, Layout::Blocked, &dw.ops[1..], dd.results[0], &dw.outputs)
        .is_some_and(|(p, _)| !p.ops.iter().any(|s| matches!(s, PostOp::Tensor { .. })));
    let pw_post = Post::of(f, Layout::Blocked, &pw.ops[1..], pd.results[0], &pw.outputs).is_some();
    only_pw && dw_post && pw_post
}

impl NchwcConv {
    /// Runs this depthwise step and then `pw`, its fused 1x1 convolution, band by band (see
    /// the module docs), telling `finish` of each band of `pw`'s output once it is final.
    pub(super) fn run_fused(
        &self,
        pw: &NchwcConv,
        addr: &dyn Fn(Value) -> *mut u8,
        finish: Finish,
    ) {
        let (Some(Filter::Depthwise(fd)), Some(Filter::Direct { groups, data })) =
            (&self.packed, &pw.packed)
        else {
            unreachable!("a fused pair's filters are constants, packed at compile time")
        };
        let (mut p1, mut p2) = (Vec::new(), Vec::new());
        let (dpost, ppost) = (self.post.bind(addr, &mut p1), pw.post.bind(addr, &mut p2));
        // SAFETY: x is only read and y written in disjoint pieces (one per work item).
        let (x, y) = unsafe {
            (
                SendPtr::new(addr(self.x) as *const f32),
                SendPtr::new(addr(pw.y) as *mut f32),
            )
        };
        let (n, c, h, w, oh, ow) = (self.g.n, self.g.c, self.g.h, self.g.w, self.g.oh, self.g.ow);
        if n * oh * ow == 0 {
            return;
        }
        let (cb, ob) = (c / B, pw.g.o.div_ceil(B));
        // Bands as tall as L2 allows, and short enough for four pieces of work per thread.
        let want = pieces_wanted(crate::cpu::pool::threads());
        let cache = (BAND_BYTES / (cb * ow * B * 4)).max(1);
        let band = oh.div_ceil(want.div_ceil(n)).min(cache);
        let bands = oh.div_ceil(band);
        let one = |i: usize| {
            let (img, bi) = (i / bands, i % bands);
            let rows = bi * band..((bi + 1) * band).min(oh);
            let plane = rows.len() * ow * B;
            BUFFER.with(|buf| {
                BAND.with(|mid| {
                    let (mut buf, mut mid) = (buf.borrow_mut(), mid.borrow_mut());
                    if mid.len() < cb * plane {
                        mid.resize(cb * plane, 0.0);
                    }
                    // SAFETY: image img of x (blocked, c a multiple of 8) and of y; this item
                    // writes only its rows of the output, and its own thread's band.
                    unsafe {
                        let ximg =
                            std::slice::from_raw_parts(x.get().add(img * c * h * w), c * h * w);
                        let base = mid.as_mut_ptr();
                        let out = |b: usize| Out {
                            y: base.add(b * plane),
                            at: b * plane,
                            post: dpost,
                        };
                        let r = rows.clone();
                        self.depthwise_blocks(fd, 0..cb, ximg, out, plane, r, &mut buf);
                        let at = img * ob * oh * ow * B;
                        let out = Out {
                            y: y.get().add(at),
                            at,
                            post: ppost,
                        };
                        let input = Band {
                            src: &mid[..cb * plane],
                            plane,
                            row: ow * B,
                            first: 0,
                        };
                        pw.direct_band(groups, data, input, out, rows.clone());
                    }
                })
            });
            if let Some(finish) = finish {
                pw.g.report(finish, img, 0..ob, &rows);
            }
        };
        crate::cpu::pool::for_each(n * bands, &one);
    }
}

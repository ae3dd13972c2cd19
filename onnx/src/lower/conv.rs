//! Matrix products, convolutions (and their transposes) and pooling, with the window geometry
//! (strides, dilations, explicit or automatic padding, `ceil_mode`) they share.

use super::shape::pad_axis;
use crate::ctx::{Ctx, Node, binary, compare, reshape, tensor_i64};
use crate::{Error, Result};
use tcc_ir::{BinaryOp, CmpOp, Conv2d, Data, OpKind, Pool2d, ReduceOp, Scalar, Tensor, Value};

/// `MatMul` with numpy semantics: a 1-D operand is a row (left) or column (right) vector whose
/// axis is dropped from the result.
pub(super) fn matmul(cx: &mut Ctx, a: Value, b: Value) -> Result<Value> {
    let (ad, bd) = (cx.dims(a), cx.dims(b));
    if ad.is_empty() || bd.is_empty() {
        return Err(Error::invalid("MatMul operands must have rank 1 or more"));
    }
    let a2 = if ad.len() == 1 {
        reshape(cx, a, &[1, ad[0]])?
    } else {
        a
    };
    let b2 = if bd.len() == 1 {
        reshape(cx, b, &[bd[0], 1])?
    } else {
        b
    };
    let y = cx.op1(OpKind::MatMul, &[a2, b2])?;
    if ad.len() > 1 && bd.len() > 1 {
        return Ok(y);
    }
    let mut dims = cx.dims(y);
    let r = dims.len();
    if bd.len() == 1 {
        dims.remove(r - 1);
    }
    if ad.len() == 1 {
        dims.remove(r - 2);
    }
    reshape(cx, y, &dims)
}

pub(super) fn gemm(cx: &mut Ctx, n: &Node) -> Result<Value> {
    let (mut a, mut b) = (n.input(0, "A")?, n.input(1, "B")?);
    for v in [a, b] {
        if cx.ty(v).rank() != 2 {
            return Err(Error::invalid(format!(
                "Gemm needs matrices, found {}",
                cx.ty(v)
            )));
        }
    }
    if n.int("transA", 0)? != 0 {
        a = cx.op1(OpKind::Transpose { perm: vec![1, 0] }, &[a])?;
    }
    if n.int("transB", 0)? != 0 {
        b = cx.op1(OpKind::Transpose { perm: vec![1, 0] }, &[b])?;
    }
    let dt = cx.dtype(a);
    let mut y = cx.op1(OpKind::MatMul, &[a, b])?;
    let alpha = n.float("alpha", 1.0)?;
    if alpha != 1.0 {
        let k = cx.scalar(dt, alpha as f64)?;
        y = binary(cx, BinaryOp::Mul, y, k)?;
    }
    if let Some(mut c) = n.opt(2) {
        let beta = n.float("beta", 1.0)?;
        if beta != 1.0 {
            let k = cx.scalar(dt, beta as f64)?;
            c = binary(cx, BinaryOp::Mul, c, k)?;
        }
        y = binary(cx, BinaryOp::Add, y, c)?;
    }
    Ok(y)
}

/// Window geometry along each spatial axis.
pub(super) struct Window {
    pub(super) strides: Vec<u64>,
    pub(super) dilations: Vec<u64>,
    /// Padding before and after each axis.
    pub(super) pads: Vec<(u64, u64)>,
    /// How much of the padding after each axis `ceil_mode` added (averages never count it).
    pub(super) ceil_extra: Vec<u64>,
}

pub(super) fn positive(v: Vec<i64>, what: &str) -> Result<Vec<u64>> {
    v.iter()
        .map(|&x| {
            u64::try_from(x)
                .ok()
                .filter(|&x| x > 0)
                .ok_or_else(|| Error::invalid(format!("{what} must be positive, found {v:?}")))
        })
        .collect()
}

/// A convolution node's `group` attribute (default 1), which must be positive.
fn group(n: &Node) -> Result<u64> {
    u64::try_from(n.int("group", 1)?)
        .ok()
        .filter(|&g| g > 0)
        .ok_or_else(|| Error::invalid("group must be positive"))
}

/// Strides, dilations and pads (explicit or from `auto_pad`) for a window of `kernel` over
/// `input` (the spatial dims); with `ceil`, the end padding grows so that the last partial
/// window is kept, as `ceil_mode` asks.
pub(super) fn window(n: &Node, input: &[u64], kernel: &[u64], ceil: bool) -> Result<Window> {
    let k = kernel.len();
    let get = |name: &str, default: i64| -> Result<Vec<u64>> {
        let v = n.ints(name)?.unwrap_or_else(|| vec![default; k]);
        if v.len() != k {
            return Err(Error::invalid(format!(
                "`{name}` has {} entries for {k} spatial axes",
                v.len()
            )));
        }
        positive(v, &format!("`{name}`"))
    };
    let strides = get("strides", 1)?;
    let dilations = get("dilations", 1)?;
    let eff: Vec<u64> = (0..k)
        .map(|i| {
            (kernel[i] - 1)
                .checked_mul(dilations[i])
                .and_then(|e| e.checked_add(1))
                .filter(|&e| e <= 1 << 40)
                .ok_or_else(|| {
                    Error::invalid(format!(
                        "the window ({} with dilation {}) is absurdly large",
                        kernel[i], dilations[i]
                    ))
                })
        })
        .collect::<Result<_>>()?;
    let auto_pad = n.string("auto_pad", "NOTSET")?;
    let mut pads: Vec<(u64, u64)> = match auto_pad.as_str() {
        "NOTSET" => {
            let p = n.ints("pads")?.unwrap_or_else(|| vec![0; 2 * k]);
            if p.len() != 2 * k || p.iter().any(|&x| !(0..1 << 40).contains(&x)) {
                return Err(Error::invalid(format!(
                    "`pads` must be {} non-negative numbers below 2^40, found {p:?}",
                    2 * k
                )));
            }
            (0..k).map(|i| (p[i] as u64, p[k + i] as u64)).collect()
        }
        "VALID" => vec![(0, 0); k],
        "SAME_UPPER" | "SAME_LOWER" => (0..k)
            .map(|i| {
                let out = input[i].div_ceil(strides[i]).min(1 << 40);
                let total = ((out.max(1) - 1) * strides[i] + eff[i]).saturating_sub(input[i]);
                let small = total / 2;
                if auto_pad == "SAME_UPPER" {
                    (small, total - small)
                } else {
                    (total - small, small)
                }
            })
            .collect(),
        other => {
            return Err(Error::invalid(format!(
                "auto_pad must be NOTSET, VALID, SAME_UPPER or SAME_LOWER, found `{other}`"
            )));
        }
    };
    let mut ceil_extra = vec![0; k];
    for i in 0..k {
        let padded = input[i] + pads[i].0 + pads[i].1;
        if padded < eff[i] {
            return Err(Error::invalid(format!(
                "the window ({} with dilation {}) is larger than spatial axis {i} ({} padded)",
                kernel[i], dilations[i], padded
            )));
        }
        if ceil {
            let mut out = (padded - eff[i]).div_ceil(strides[i]) + 1;
            if (out - 1) * strides[i] >= input[i] + pads[i].0 {
                out -= 1;
            }
            let need = (out - 1) * strides[i] + eff[i];
            ceil_extra[i] = need.saturating_sub(padded);
            pads[i].1 += ceil_extra[i];
        }
    }
    Ok(Window {
        strides,
        dilations,
        pads,
        ceil_extra,
    })
}

/// Whether a 1-D convolution or pooling runs as a 2-D one over `[N, C, 1, W]`: per-axis
/// attributes gain a leading height entry, and the result loses its height axis.
#[derive(Clone, Copy)]
pub(super) struct Planar {
    one_d: bool,
}

impl Planar {
    /// A per-axis attribute for the two axes, `fill` for the added height.
    fn pair(self, v: &[u64], fill: u64) -> [u64; 2] {
        if self.one_d {
            [fill, v[0]]
        } else {
            [v[0], v[1]]
        }
    }

    /// `[top, left, bottom, right]` from padding before and after each axis.
    fn pads(self, pads: &[(u64, u64)]) -> [u64; 4] {
        let before: Vec<u64> = pads.iter().map(|p| p.0).collect();
        let after: Vec<u64> = pads.iter().map(|p| p.1).collect();
        let (b, e) = (self.pair(&before, 0), self.pair(&after, 0));
        [b[0], b[1], e[0], e[1]]
    }

    /// The result in the node's rank.
    pub(super) fn back(self, cx: &mut Ctx, y: Value) -> Result<Value> {
        if !self.one_d {
            return Ok(y);
        }
        let d = cx.dims(y);
        reshape(cx, y, &[d[0], d[1], d[3]])
    }
}

/// Reshapes 3-D `[N, C, W]` to 4-D `[N, C, 1, W]` (1-D convolution and pooling run as 2-D);
/// other ranks must be 4.
pub(super) fn to_2d(cx: &mut Ctx, x: Value, what: &str, op: &str) -> Result<(Value, Planar)> {
    let d = cx.dims(x);
    match d.len() {
        4 => Ok((x, Planar { one_d: false })),
        3 => Ok((
            reshape(cx, x, &[d[0], d[1], 1, d[2]])?,
            Planar { one_d: true },
        )),
        r => Err(Error::unsupported(format!(
            "{op} over {} spatial axes is not supported ({what} is {}); tcc has 1-D and 2-D",
            r.saturating_sub(2),
            cx.ty(x)
        ))),
    }
}

/// A convolution node's operands as 2-D ones and its attributes: the input `x` and filter `w`
/// (1-D convolutions as 2-D over `[N, C, 1, W]`, which [`Planar::back`] undoes), checked
/// against `kernel_shape`; `op` names the node's type in errors.
pub(super) fn conv_geometry(
    cx: &mut Ctx,
    n: &Node,
    [x, w]: [Value; 2],
    op: &str,
) -> Result<(Value, Value, Conv2d, Planar)> {
    let (x4, planar) = to_2d(cx, x, "the input", op)?;
    let (w4, _) = to_2d(cx, w, "the filter", op)?;
    if cx.ty(x).rank() != cx.ty(w).rank() {
        return Err(Error::invalid(format!(
            "input {} and filter {} differ in rank",
            cx.ty(x),
            cx.ty(w)
        )));
    }
    let kernel: Vec<u64> = cx.dims(w)[2..].to_vec();
    if let Some(ks) = n.ints("kernel_shape")?
        && positive(ks.clone(), "`kernel_shape`")? != kernel
    {
        return Err(Error::invalid(format!(
            "kernel_shape {ks:?} does not match the filter {}",
            cx.ty(w)
        )));
    }
    let win = window(n, &cx.dims(x)[2..], &kernel, false)?;
    let attrs = Conv2d {
        strides: planar.pair(&win.strides, 1),
        pads: planar.pads(&win.pads),
        dilations: planar.pair(&win.dilations, 1),
        groups: group(n)?,
    };
    Ok((x4, w4, attrs, planar))
}

pub(super) fn conv(cx: &mut Ctx, n: &Node) -> Result<Value> {
    let (x, w) = (n.input(0, "X")?, n.input(1, "W")?);
    let (x4, w4, attrs, planar) = conv_geometry(cx, n, [x, w], "Conv")?;
    let y = cx.op1(OpKind::Conv2d(attrs), &[x4, w4])?;
    let y = add_bias(cx, n, 2, y, cx.dims(w)[0])?;
    planar.back(cx, y)
}

/// Adds the optional per-channel bias (input `at`, `[channels]`) of a convolution node to `y`
/// (`[N, channels, H, W]`).
pub(super) fn add_bias(
    cx: &mut Ctx,
    n: &Node,
    at: usize,
    y: Value,
    channels: u64,
) -> Result<Value> {
    let Some(b) = n.opt(at) else {
        return Ok(y);
    };
    if cx.dims(b) != [channels] {
        return Err(Error::invalid(format!(
            "the bias must be [{channels}], found {}",
            cx.ty(b)
        )));
    }
    let b4 = reshape(cx, b, &[1, channels, 1, 1])?;
    binary(cx, BinaryOp::Add, y, b4)
}

/// A pooling node's input, window size and window geometry.
fn pool_geometry(cx: &Ctx, n: &Node, op: &str) -> Result<(Value, Vec<u64>, Window)> {
    let x = n.input(0, "X")?;
    if cx.ty(x).rank() < 3 {
        return Err(Error::invalid(format!(
            "{op} needs [N, C, spatial...], found {}",
            cx.ty(x)
        )));
    }
    let k = cx.ty(x).rank() - 2;
    let kernel = positive(
        n.ints("kernel_shape")?
            .ok_or_else(|| Error::invalid(format!("{op} needs `kernel_shape`")))?,
        "`kernel_shape`",
    )?;
    if kernel.len() != k {
        return Err(Error::invalid(format!(
            "kernel_shape {kernel:?} does not match {k} spatial axes"
        )));
    }
    let ceil = n.int("ceil_mode", 0)? != 0;
    let win = window(n, &cx.dims(x)[2..], &kernel, ceil)?;
    Ok((x, kernel, win))
}

/// `MaxPool` with its `Indices` output: the flat index into the input of each window's first
/// maximum (row-major; column-major within the plane with `storage_order=1`). Built from one
/// strided slice of the padded input per window position: a running maximum, and a `select` of
/// that position's constant indices where it is strictly larger.
pub(super) fn max_pool_with_indices(cx: &mut Ctx, n: &Node) -> Result<Vec<Option<Value>>> {
    let (x, kernel, win) = pool_geometry(cx, n, "MaxPool")?;
    let column_major = n.int("storage_order", 0)? != 0;
    let dims = cx.dims(x);
    let k = kernel.len();
    if column_major && k != 2 {
        return n.unsupported(format_args!("storage_order=1 over {k} spatial axes"));
    }
    let taps: u64 = kernel.iter().product();
    let out: Vec<u64> = (0..k)
        .map(|i| {
            let (b, e) = win.pads[i];
            (dims[2 + i] + b + e - ((kernel[i] - 1) * win.dilations[i] + 1)) / win.strides[i] + 1
        })
        .collect();
    let plane: u64 = out.iter().product();
    if taps > 4096 || taps.saturating_mul(plane) > 1 << 24 {
        return n.unsupported(format_args!(
            "the Indices output for {taps} window positions"
        ));
    }
    let mut padded = x;
    for (i, &(b, e)) in win.pads.iter().enumerate() {
        padded = pad_axis(cx, padded, 2 + i, b, e, f64::NEG_INFINITY)?;
    }
    let r = dims.len();
    let (mut best, mut index): (Option<Value>, Option<Value>) = (None, None);
    for t in 0..taps {
        // This window position's offset along each spatial axis.
        let mut rest = t;
        let mut tap = vec![0u64; k];
        for i in (0..k).rev() {
            tap[i] = rest % kernel[i];
            rest /= kernel[i];
        }
        let (mut starts, mut ends, mut steps) = (vec![0i64; r], vec![i64::MAX; r], vec![1i64; r]);
        for i in 0..k {
            let first = tap[i] * win.dilations[i];
            starts[2 + i] = first as i64;
            ends[2 + i] = (first + (out[i] - 1) * win.strides[i] + 1) as i64;
            steps[2 + i] = win.strides[i] as i64;
        }
        let v = cx.op1(
            OpKind::Slice {
                starts,
                ends,
                steps,
            },
            &[padded],
        )?;
        // The input position each output reads at this tap, within its plane.
        let mut at = Vec::with_capacity(plane as usize);
        for o in 0..plane {
            let (mut rest, mut pos, mut flat) = (o, vec![0i64; k], 0i64);
            for i in (0..k).rev() {
                let oi = rest % out[i];
                rest /= out[i];
                pos[i] =
                    (oi * win.strides[i] + tap[i] * win.dilations[i]) as i64 - win.pads[i].0 as i64;
            }
            if column_major {
                flat = pos[1] * dims[2] as i64 + pos[0];
            } else {
                for i in 0..k {
                    flat = flat * dims[2 + i] as i64 + pos[i];
                }
            }
            at.push(flat);
        }
        let mut shape = vec![1u64, 1];
        shape.extend(&out);
        let idx = cx.constant(tensor_i64(&shape, at)?)?;
        (best, index) = match (best, index) {
            (Some(b), Some(ix)) => {
                let gt = compare(cx, CmpOp::Gt, v, b)?;
                (
                    Some(cx.op1(OpKind::Select, &[gt, v, b])?),
                    Some(cx.op1(OpKind::Select, &[gt, idx, ix])?),
                )
            }
            _ => {
                let mut full = dims[..2].to_vec();
                full.extend(&out);
                (
                    Some(v),
                    Some(cx.op1(OpKind::BroadcastTo { shape: full }, &[idx])?),
                )
            }
        };
    }
    let (best, index) = (best.expect("a window"), index.expect("a window"));
    // Plane offsets: (n * C + c) * (spatial size).
    let spatial: u64 = dims[2..].iter().product();
    let planes = dims[0] * dims[1];
    let base: Vec<i64> = (0..planes).map(|p| (p * spatial) as i64).collect();
    let mut base_shape = dims[..2].to_vec();
    base_shape.extend(std::iter::repeat_n(1, k));
    let base = cx.constant(tensor_i64(&base_shape, base)?)?;
    let index = binary(cx, BinaryOp::Add, index, base)?;
    Ok(vec![Some(best), Some(index)])
}

pub(super) fn pool(cx: &mut Ctx, n: &Node, max: bool) -> Result<Value> {
    let op = if max { "MaxPool" } else { "AveragePool" };
    let (x, kernel, win) = pool_geometry(cx, n, op)?;
    let k = kernel.len();
    let count_include_pad = n.int("count_include_pad", 0)? != 0;
    // `avg_pool2d` with count_include_pad counts every padded position, ONNX not those that
    // ceil_mode adds.
    let extra_counted = !max && count_include_pad && win.ceil_extra.iter().any(|&e| e > 0);
    if k > 2 || win.dilations.iter().any(|&d| d != 1) || extra_counted {
        return pool_sliced(cx, x, &kernel, &win, max, count_include_pad);
    }
    let (x4, planar) = to_2d(cx, x, "the input", op)?;
    let attrs = Pool2d {
        kernel: planar.pair(&kernel, 1),
        strides: planar.pair(&win.strides, 1),
        pads: planar.pads(&win.pads),
    };
    let kind = if max {
        OpKind::MaxPool2d(attrs)
    } else {
        OpKind::AvgPool2d {
            pool: attrs,
            count_include_pad,
        }
    };
    let y = cx.op1(kind, &[x4])?;
    planar.back(cx, y)
}

/// Pooling that `max_pool2d` and `avg_pool2d` cannot express (3-D windows, dilations), built
/// from slices. Both poolings are separable over the spatial axes (a max of maxes; a sum of
/// sums whose divisor, the window's count of positions, is a product of per-axis counts), so
/// each axis in turn is padded and combined from its `k` strided slices.
pub(super) fn pool_sliced(
    cx: &mut Ctx,
    x: Value,
    kernel: &[u64],
    win: &Window,
    max: bool,
    count_include_pad: bool,
) -> Result<Value> {
    let slices: u64 = kernel.iter().sum();
    if slices > 4096 {
        return Err(Error::unsupported(format!(
            "pooling windows {kernel:?} with dilations or over 3 or more axes are built from one slice per window position, and {slices} are too many"
        )));
    }
    let dt = cx.dtype(x);
    let mut y = x;
    for (i, &k) in kernel.iter().enumerate() {
        let a = 2 + i;
        let dims = cx.dims(y);
        let len = dims[a];
        let (pb, pe) = win.pads[i];
        let counted_end = (len + pe - win.ceil_extra[i]) as i64;
        let (s, d) = (win.strides[i], win.dilations[i]);
        let out = (len + pb + pe - ((k - 1) * d + 1)) / s + 1;
        let fill = if max { f64::NEG_INFINITY } else { 0.0 };
        let padded = pad_axis(cx, y, a, pb, pe, fill)?;
        let r = dims.len();
        let mut acc: Option<Value> = None;
        for j in 0..k {
            let (mut starts, mut ends, mut steps) = (vec![0; r], vec![i64::MAX; r], vec![1; r]);
            starts[a] = (j * d) as i64;
            ends[a] = (j * d + (out - 1) * s + 1) as i64;
            steps[a] = s as i64;
            let sl = cx.op1(
                OpKind::Slice {
                    starts,
                    ends,
                    steps,
                },
                &[padded],
            )?;
            let op = if max { BinaryOp::Max } else { BinaryOp::Add };
            acc = Some(match acc {
                None => sl,
                Some(p) => binary(cx, op, p, sl)?,
            });
        }
        let mut pooled = acc.ok_or_else(|| Error::invalid("an empty pooling window"))?;
        if !max {
            // Positions of each window along this axis that the divisor counts.
            let counts: Vec<f64> = (0..out)
                .map(|o| {
                    (0..k)
                        .filter(|&j| {
                            let p = (o * s + j * d) as i64 - pb as i64;
                            if count_include_pad {
                                (-(pb as i64)..counted_end).contains(&p)
                            } else {
                                (0..len as i64).contains(&p)
                            }
                        })
                        .count() as f64
                })
                .collect();
            let mut shape = vec![1; r];
            shape[a] = out;
            let data = Data::from_scalars(dt, counts.iter().map(|&c| Scalar::from_f64(dt, c)))
                .ok_or_else(|| Error::invalid("counts of the pooling windows"))?;
            let c =
                cx.constant(Tensor::from_data(&shape, data).map_err(|e| Error::invalid(e.0))?)?;
            pooled = binary(cx, BinaryOp::Div, pooled, c)?;
        }
        y = pooled;
    }
    Ok(y)
}

/// Global pooling as a reduction over the spatial axes, keeping them as size 1.
pub(super) fn global(cx: &mut Ctx, x: Value, op: ReduceOp) -> Result<Value> {
    let r = cx.ty(x).rank() as i64;
    if r < 3 {
        return Err(Error::invalid(format!(
            "global pooling needs [N, C, spatial...], found {}",
            cx.ty(x)
        )));
    }
    cx.op1(
        OpKind::Reduce {
            op,
            axes: (2..r).collect(),
            keepdims: true,
        },
        &[x],
    )
}

/// `ConvTranspose` as the gradient of a convolution with respect to its input: the filter
/// `[C_in, C_out/group, kH, kW]` is that convolution's filter, the output its input.
pub(super) fn conv_transpose(cx: &mut Ctx, n: &Node) -> Result<Value> {
    let (x, w) = (n.input(0, "X")?, n.input(1, "W")?);
    let (x4, planar) = to_2d(cx, x, "the input", "ConvTranspose")?;
    let (w4, _) = to_2d(cx, w, "the filter", "ConvTranspose")?;
    let (xd, wd) = (cx.dims(x), cx.dims(w));
    if xd.len() != wd.len() {
        return Err(Error::invalid(format!(
            "input {} and filter {} differ in rank",
            cx.ty(x),
            cx.ty(w)
        )));
    }
    let k = xd.len() - 2;
    let g = group(n)?;
    let kernel: Vec<u64> = wd[2..].to_vec();
    let get = |name: &str, default: i64| -> Result<Vec<u64>> {
        let v = n.ints(name)?.unwrap_or_else(|| vec![default; k]);
        if v.len() != k || v.iter().any(|&e| !(0..1 << 40).contains(&e)) {
            return Err(Error::invalid(format!(
                "`{name}` must be {k} non-negative numbers, found {v:?}"
            )));
        }
        Ok(v.iter().map(|&e| e as u64).collect())
    };
    let strides = get("strides", 1)?;
    let dil = get("dilations", 1)?;
    let out_pad = get("output_padding", 0)?;
    if strides.iter().chain(&dil).any(|&v| v == 0) {
        return Err(Error::invalid("strides and dilations must be positive"));
    }
    let eff: Vec<u64> = (0..k)
        .map(|i| (kernel[i].max(1) - 1) * dil[i] + 1)
        .collect();
    // The full output before padding is removed, per axis.
    let full: Vec<u64> = (0..k)
        .map(|i| strides[i] * (xd[2 + i].max(1) - 1) + out_pad[i] + eff[i])
        .collect();
    let auto_pad = n.string("auto_pad", "NOTSET")?;
    let mut full = full;
    let (begin, end): (Vec<u64>, Vec<u64>) = if let Some(os) = n.ints("output_shape")? {
        let os = os
            .iter()
            .rev()
            .take(k)
            .rev()
            .map(|&v| v.max(0) as u64)
            .collect::<Vec<_>>();
        if os.len() != k {
            return Err(Error::invalid(format!(
                "output_shape {os:?} must give {k} spatial sizes"
            )));
        }
        (0..k)
            .map(|i| {
                // A larger output than the windows reach is extra output padding at the end.
                full[i] = full[i].max(os[i]);
                let total = full[i] - os[i];
                if auto_pad == "SAME_UPPER" {
                    (total / 2, total - total / 2)
                } else {
                    (total - total / 2, total / 2)
                }
            })
            .unzip()
    } else {
        match auto_pad.as_str() {
            "NOTSET" => {
                let p = n.ints("pads")?.unwrap_or_else(|| vec![0; 2 * k]);
                if p.len() != 2 * k || p.iter().any(|&v| !(0..1 << 40).contains(&v)) {
                    return Err(Error::invalid(format!(
                        "`pads` must be {} non-negative numbers, found {p:?}",
                        2 * k
                    )));
                }
                (
                    (0..k).map(|i| p[i] as u64).collect(),
                    (0..k).map(|i| p[k + i] as u64).collect(),
                )
            }
            "VALID" => (vec![0; k], vec![0; k]),
            "SAME_UPPER" | "SAME_LOWER" => (0..k)
                .map(|i| {
                    let total = full[i].saturating_sub(xd[2 + i] * strides[i]);
                    if auto_pad == "SAME_UPPER" {
                        (total / 2, total - total / 2)
                    } else {
                        (total - total / 2, total / 2)
                    }
                })
                .unzip(),
            other => return Err(Error::invalid(format!("unknown auto_pad `{other}`"))),
        }
    };
    let out: Vec<u64> = (0..k)
        .map(|i| {
            full[i]
                .checked_sub(begin[i] + end[i])
                .filter(|&o| o > 0)
                .ok_or_else(|| {
                    Error::invalid(format!(
                        "the padding {begin:?}/{end:?} removes the whole output {full:?}"
                    ))
                })
        })
        .collect::<Result<_>>()?;
    // The convolution whose input gradient this is; the output padding is extra end padding
    // its windows never reach.
    let pads: Vec<(u64, u64)> = begin.into_iter().zip(end).collect();
    let conv = Conv2d {
        strides: planar.pair(&strides, 1),
        pads: planar.pads(&pads),
        dilations: planar.pair(&dil, 1),
        groups: g,
    };
    let o2 = planar.pair(&out, 1);
    let shape = vec![xd[0], wd[1] * g, o2[0], o2[1]];
    let y = cx.op1(OpKind::Conv2dGradInput { conv, shape }, &[x4, w4])?;
    let y = add_bias(cx, n, 2, y, wd[1] * g)?;
    planar.back(cx, y)
}

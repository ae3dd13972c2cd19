//! Post-training quantization (`tcc quantize`): which layers can run on integers, the scales
//! chosen from the ranges a calibration observed, and the rewrite.
//!
//! A layer is a `conv2d` or `matmul` of an f32 activation by constant f32 weights (a
//! convolution's filter, a matrix `[K, N]`). The rewrite puts it in ONNX's QDQ form, as
//! onnxruntime's `quantize_static` does, and then [`qdq`](super::qdq::qdq) turns it into the
//! integer op: the activation becomes `dequantize_linear(quantize_linear(x, s, z), s, z)` with
//! u8 levels, the weights `dequantize_linear` of i8 levels (constants) with zero points 0.
//! What follows the layer (its bias, relu, the next layer's quantization) stays, so the CPU
//! backend fuses it into the integer convolution's store.
//!
//! - **Activations**: u8. Asymmetric (default): the observed range widened to include 0,
//!   `scale = (max - min) / 255`, `zero = round(-min / scale)`, so 0 is exact. Symmetric:
//!   `scale = 2 max(|min|, |max|) / 255`, zero point 128.
//! - **Weights**: i8, symmetric over the narrow range [-127, 127], `scale = max|w| / 127`, per
//!   tensor or per output channel (a filter's first axis, a matrix's columns).
//! - **After quantization-aware training** ([`Activation::learned`], [`WeightLevels::Nudged`]):
//!   the levels the training's `fake_quant` used, so the integer model computes what the
//!   trained one did up to rounding: activations over their learned ranges, weights over their
//!   own, both nudged as TensorFlow nudges.
//!
//! A range of zero width (an activation that was always 0) takes scale 1; a range that is not
//! finite is an error naming the layer.

use super::Emit;
use super::qdq::qdq;
use std::collections::{HashMap, HashSet};
use tcc_ir::interp::fake_quant_range;
use tcc_ir::{DType, Data, Function, Op, OpKind, Tensor, TensorType, Value};

/// A layer [`quantize`] can convert.
#[derive(Clone, Debug)]
pub struct Layer {
    /// The `conv2d` or `matmul`.
    pub op: Op,
    /// Its activation operand, which becomes u8.
    pub input: Value,
    /// Its result; the layer is named after it.
    pub output: Value,
}

/// The layers of `f` that can run on integers, in schedule order.
pub fn layers(f: &Function) -> Vec<Layer> {
    let is_f32 = |v: Value| f.ty(v).dtype() == DType::F32;
    (f.schedule().iter().copied())
        .filter_map(|op| {
            let d = f.op(op);
            let (x, w) = (*d.args.first()?, *d.args.get(1)?);
            let shape_ok = match &d.kind {
                OpKind::Conv2d(_) => true,
                OpKind::MatMul => f.ty(w).rank() == 2,
                _ => false,
            };
            let weights = f.def_op(w).and_then(|o| match &f.op(o).kind {
                OpKind::Const { .. } => Some(()),
                _ => None,
            });
            let activation = f
                .def_op(x)
                .is_none_or(|o| !matches!(f.op(o).kind, OpKind::Const { .. }));
            (shape_ok && weights.is_some() && activation && is_f32(x) && is_f32(w)).then(|| Layer {
                op,
                input: x,
                output: d.results[0],
            })
        })
        .collect()
}

/// The range an activation took over the calibration inputs (after any clipping).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Range {
    /// The smallest value.
    pub min: f32,
    /// The largest value.
    pub max: f32,
}

/// How [`quantize`] quantizes the weights.
#[derive(Clone, Copy, Debug, Default)]
pub struct Scheme {
    /// One weight scale per output channel instead of one per tensor.
    pub per_channel: bool,
    /// How the weights become levels.
    pub weights: WeightLevels,
}

/// How weights become i8 levels.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum WeightLevels {
    /// Symmetric over `[-top, top]` with zero points 0, `scale = max|w| / top`, `top = 2^(bits
    /// - 1) - 1` (post-training): 127 for 8 bits; 63 for 7 (`tcc quantize --reduce-range`),
    /// which CPUs with AVX2 but not VNNI multiply exactly with `vpmaddubsw`.
    Symmetric {
        /// Bits of the levels, 2 to 8.
        bits: u32,
    },
    /// The levels quantization-aware training's `fake_quant` gave them (`tcc quantize
    /// --from-qat`): `2^bits` levels (less the lowest when `narrow`) over the weights' own range
    /// widened to include 0, nudged so that 0 is a level, as TensorFlow nudges
    /// ([`fake_quant_range`]); level `l` is stored as the i8 `l - 128`, the zero point alike.
    /// At most 8 bits.
    Nudged {
        /// Bits of the levels.
        bits: u64,
        /// Whether the lowest level is left out.
        narrow: bool,
    },
}

impl Default for WeightLevels {
    fn default() -> Self {
        WeightLevels::Symmetric { bits: 8 }
    }
}

/// The u8 quantization of one activation: the range it was chosen from, its scale and zero
/// point.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Activation {
    /// The range.
    pub range: Range,
    /// The step between levels.
    pub scale: f32,
    /// The level of 0.
    pub zero: u8,
}

impl Activation {
    /// Fitted to a calibrated range ([`activation_params`]).
    pub fn fitted(range: Range, symmetric: bool) -> Result<Activation, String> {
        let (scale, zero) = activation_params(range, symmetric)?;
        Ok(Activation { range, scale, zero })
    }

    /// The 8-bit levels `fake_quant` used over a range learned in quantization-aware training
    /// (TensorFlow's nudging, [`fake_quant_range`]); scale 1 and zero point 0 where the range
    /// is empty (`fake_quant` itself is NaN there).
    pub fn learned(range: Range) -> Result<Activation, String> {
        let (lo, hi) = (f64::from(range.min), f64::from(range.max));
        if !lo.is_finite() || !hi.is_finite() {
            return Err(format!("the learned range [{lo}, {hi}] is not finite"));
        }
        let Some((nudged_min, _, scale)) = fake_quant_range(lo, hi, 8, false, true) else {
            return Ok(Activation {
                range,
                scale: 1.0,
                zero: 0,
            });
        };
        let zero = (-nudged_min / scale).round().clamp(0.0, 255.0) as u8;
        Ok(Activation {
            range,
            scale: scale as f32,
            zero,
        })
    }
}

/// The u8 scale and zero point for an activation observed over `r` (see the module docs).
pub fn activation_params(r: Range, symmetric: bool) -> Result<(f32, u8), String> {
    if !r.min.is_finite() || !r.max.is_finite() {
        return Err(format!("the range [{}, {}] is not finite", r.min, r.max));
    }
    let (lo, hi) = (r.min.min(0.0), r.max.max(0.0));
    if symmetric {
        let a = lo.abs().max(hi);
        let s = if a > 0.0 { 2.0 * a / 255.0 } else { 1.0 };
        return Ok((s, 128));
    }
    let s = (hi - lo) / 255.0;
    if s == 0.0 {
        return Ok((1.0, 0));
    }
    let z = (-lo / s).round_ties_even().clamp(0.0, 255.0);
    Ok((s, z as u8))
}

/// The clipping threshold for an activation whose absolute values have histogram `hist` (equal
/// bins over `[0, amax]`), quantized to `levels` levels over `[0, t]`: TensorRT's entropy
/// calibration. For each candidate `t` (a bin edge from `levels` bins up), the reference is the
/// histogram up to `t` with everything beyond added to its last bin, the candidate that same
/// range merged into `levels` groups and spread back over each group's non-empty bins; the `t`
/// whose candidate is closest to its reference (least Kullback-Leibler divergence) wins. An
/// empty histogram gives `amax`.
pub fn entropy_threshold(hist: &[u64], amax: f32, levels: usize) -> f32 {
    let n = hist.len();
    let total: u64 = hist.iter().sum();
    if total == 0 || n <= levels || levels == 0 {
        return amax;
    }
    let mut best = (f64::INFINITY, n);
    let mut beyond: u64 = hist[levels..].iter().sum();
    for i in levels..=n {
        let mut p: Vec<f64> = hist[..i].iter().map(|&c| c as f64).collect();
        p[i - 1] += beyond as f64;
        if i < n {
            beyond -= hist[i];
        }
        let mut q = vec![0.0f64; i];
        for g in 0..levels {
            let (a, b) = (g * i / levels, (g + 1) * i / levels);
            let group = &hist[a..b];
            let sum: u64 = group.iter().sum();
            let filled = group.iter().filter(|&&c| c > 0).count();
            if filled > 0 {
                for (k, &c) in group.iter().enumerate() {
                    if c > 0 {
                        q[a + k] = sum as f64 / filled as f64;
                    }
                }
            }
        }
        let (ps, qs): (f64, f64) = (p.iter().sum(), q.iter().sum());
        if qs == 0.0 {
            continue;
        }
        // A bin the candidate left empty where the reference is not (the outliers' bin) costs
        // as if the candidate held a tiny share there.
        let kl: f64 = (p.iter().zip(&q))
            .filter(|(pk, _)| **pk > 0.0)
            .map(|(pk, qk)| {
                let (pk, qk) = (pk / ps, (qk / qs).max(1e-10));
                pk * (pk / qk).ln()
            })
            .sum();
        if kl < best.0 {
            best = (kl, i);
        }
    }
    amax * best.1 as f32 / n as f32
}

/// Weights as i8: the levels, and per scale the scale and zero point.
struct Levels(Vec<i8>, Vec<f32>, Vec<i8>);

/// Weights `w` as i8 levels with `scales` scales and zero points, as `how` says: element `i`
/// takes scale `channel(i)`, chosen over the elements that take it.
fn weight_levels(
    w: &[f32],
    scales: usize,
    channel: impl Fn(usize) -> usize,
    how: WeightLevels,
) -> Result<Levels, String> {
    let (mut lo, mut hi) = (vec![0.0f32; scales], vec![0.0f32; scales]);
    for (i, &x) in w.iter().enumerate() {
        if !x.is_finite() {
            return Err(format!("weight {i} is {x}"));
        }
        let c = channel(i);
        (lo[c], hi[c]) = (lo[c].min(x), hi[c].max(x));
    }
    match how {
        WeightLevels::Symmetric { bits } => {
            let top = ((1u32 << (bits.clamp(2, 8) - 1)) - 1) as f32;
            let s: Vec<f32> = (lo.iter().zip(&hi))
                .map(|(&l, &h)| {
                    let a = h.max(-l);
                    if a > 0.0 { a / top } else { 1.0 }
                })
                .collect();
            let q = (w.iter().enumerate())
                .map(|(i, &x)| (x / s[channel(i)]).round_ties_even().clamp(-top, top) as i8)
                .collect();
            Ok(Levels(q, s, vec![0; scales]))
        }
        WeightLevels::Nudged { bits, narrow } => {
            if !(2..=8).contains(&bits) {
                return Err(format!(
                    "weights of {bits} bits do not fit the integer kernels' i8 (2 to 8 bits)"
                ));
            }
            let qmin = if narrow { 1.0 } else { 0.0 };
            // Per channel: the nudged range, the scale and the zero point's level.
            let nudged: Vec<(f64, f64, f64, f64)> = (lo.iter().zip(&hi))
                .map(|(&l, &h)| {
                    match fake_quant_range(f64::from(l), f64::from(h), bits, narrow, true) {
                        Some((nl, nh, s)) => (nl, nh, s, (qmin - nl / s).round()),
                        // All zeros: any scale; every weight is the zero point.
                        None => (0.0, 0.0, 1.0, qmin),
                    }
                })
                .collect();
            // `fake_quant`'s level, in its own f32 arithmetic, shifted to i8.
            let r = |v: f64| v as f32 as f64;
            let q = (w.iter().enumerate())
                .map(|(i, &x)| {
                    let (nl, nh, s, _) = nudged[channel(i)];
                    let inv = r(1.0 / s);
                    let l = r(r(r(f64::from(x).clamp(nl, nh) - nl) * inv) + 0.5).floor();
                    (l + qmin - 128.0) as i8
                })
                .collect();
            let s = nudged.iter().map(|n| n.2 as f32).collect();
            let z = nudged.iter().map(|n| (n.3 - 128.0) as i8).collect();
            Ok(Levels(q, s, z))
        }
    }
}

/// What [`quantize`] did to one layer, for `tcc quantize`'s table.
#[derive(Clone, Debug)]
pub struct Quantized {
    /// The layer's name (its result's).
    pub name: String,
    /// The activation's range.
    pub range: Range,
    /// The activation's scale.
    pub scale: f32,
    /// The activation's zero point.
    pub zero: u8,
    /// The smallest and largest weight scale.
    pub weight_scales: (f32, f32),
    /// Whether it runs on the integer op (else it stayed in float: `qdq` did not take it).
    pub integer: bool,
}

/// Quantizes `layers` of `f` with the activations' quantization in `activations` (by the
/// layer's input) as the module docs say, then turns the QDQ form into integer ops ([`qdq`]).
/// Layers whose input has none are left alone.
pub fn quantize(
    f: &mut Function,
    layers: &[Layer],
    activations: &HashMap<Value, Activation>,
    scheme: Scheme,
) -> Result<Vec<Quantized>, String> {
    let mut dequantized: HashMap<Value, Value> = HashMap::new();
    // Each quantized layer's report and op (to tell afterwards whether `qdq` took it).
    let mut report: Vec<(Quantized, Op)> = Vec::new();
    for layer in layers {
        let Some(&Activation { range, scale, zero }) = activations.get(&layer.input) else {
            continue;
        };
        let name = f.name(layer.output).to_string();
        let at = |e: String| format!("layer `{name}`: {e}");
        let x = layer.input;
        let mut e = Emit { f, ops: Vec::new() };
        let xd = match dequantized.get(&x) {
            Some(&known) => known,
            None => {
                let sv = e.scalar(DType::F32, f64::from(scale), "quant/scale")?;
                let zv = e.scalar(DType::U8, f64::from(zero), "quant/zero")?;
                let q = e.op(OpKind::QuantizeLinear, &[x, sv, zv], "quant/q")?;
                let d = e.op(OpKind::DequantizeLinear, &[q, sv, zv], "quant/dq")?;
                dequantized.insert(x, d);
                d
            }
        };
        let w = e.f.op(layer.op).args[1];
        let (wd, weight_scales) = dequantized_weights(&mut e, w, layer.op, scheme).map_err(at)?;
        let ops = std::mem::take(&mut e.ops);
        for n in ops {
            f.insert_before(n, layer.op);
        }
        f.op_mut(layer.op).args[0] = xd;
        f.op_mut(layer.op).args[1] = wd;
        report.push((
            Quantized {
                name,
                range,
                scale,
                zero,
                weight_scales,
                integer: false,
            },
            layer.op,
        ));
    }
    qdq(f);
    let live: HashSet<Op> = f.schedule().iter().copied().collect();
    Ok((report.into_iter())
        .map(|(r, op)| Quantized {
            integer: !live.contains(&op),
            ..r
        })
        .collect())
}

/// `dequantize_linear` of constant i8 levels for the constant weights `w` of layer `op`, and
/// the smallest and largest scale.
fn dequantized_weights(
    e: &mut Emit,
    w: Value,
    op: Op,
    scheme: Scheme,
) -> Result<(Value, (f32, f32)), String> {
    let f = &*e.f;
    let def = f.def_op(w).ok_or("the weights are not a constant")?;
    let OpKind::Const { ty, value } = &f.op(def).kind else {
        return Err("the weights are not a constant".into());
    };
    let t = Tensor::from_literal(ty, value).map_err(|e| e.to_string())?;
    let Data::F32(data) = t.data() else {
        return Err("the weights are not f32".into());
    };
    let dims = ty.dims().to_vec();
    let conv = matches!(f.op(op).kind, OpKind::Conv2d(_));
    // Per channel: a filter's output channels (its first axis, the scale shaped
    // `[O, 1, 1, 1]`), a matrix's columns (`[N]`).
    let (scales, scale_dims): (usize, Vec<u64>) = match (scheme.per_channel, conv) {
        (false, _) => (1, vec![]),
        (true, true) => (dims[0] as usize, vec![dims[0], 1, 1, 1]),
        (true, false) => (dims[1] as usize, vec![dims[1]]),
    };
    let per_row = if conv {
        dims[1..].iter().product::<u64>() as usize
    } else {
        1
    };
    let cols = dims.last().copied().unwrap_or(1) as usize;
    let channel = |i: usize| match (scales, conv) {
        (1, _) => 0,
        (_, true) => i / per_row,
        (_, false) => i % cols,
    };
    let Levels(levels, s, z) = weight_levels(data, scales, channel, scheme.weights)?;
    let lo = s.iter().copied().fold(f32::INFINITY, f32::min);
    let hi = s.iter().copied().fold(0.0f32, f32::max);
    let q = e.constant_of(
        TensorType::new(DType::I8, dims.clone()).map_err(|e| e.to_string())?,
        Data::I8(levels),
        "quant/w",
    )?;
    let sv = e.constant_of(
        TensorType::new(DType::F32, scale_dims.clone()).map_err(|e| e.to_string())?,
        Data::F32(s),
        "quant/w_scale",
    )?;
    let zv = e.constant_of(
        TensorType::new(DType::I8, scale_dims).map_err(|e| e.to_string())?,
        Data::I8(z),
        "quant/w_zero",
    )?;
    let d = e.op(OpKind::DequantizeLinear, &[q, sv, zv], "quant/w_dq")?;
    Ok((d, (lo, hi)))
}

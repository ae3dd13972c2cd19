//! Post-training quantization (`tcc quantize`'s rewrite): activation scales that keep 0 and the
//! observed range on the levels, weights on [-127, 127] with each channel's largest at ±127,
//! layers on the integer ops with results within the quantization's error, and what is left
//! in float.

use std::collections::HashMap;
use tcc_ir::random::{Rng, random_tensor};
use tcc_ir::{Data, Function, OpKind, Tensor, Value, interp, parse_function, verify_function};
use tcc_passes::quant::ptq::{
    Activation, Range, Scheme, WeightLevels, activation_params, entropy_threshold, layers, quantize,
};

fn f64s(t: &Tensor) -> Vec<f64> {
    t.data().to_f64s()
}

/// Asymmetric scales put the observed range inside [0, 255] after rounding and 0 on a level;
/// ranges that exclude 0 are widened to it; a range of zero width takes scale 1; symmetric
/// ones are centred on 128; ranges that are not finite are refused.
#[test]
fn activation_scales_keep_zero_and_the_range_on_the_levels() {
    for (min, max) in [
        (-1.3f32, 2.7f32),
        (0.0, 5.0),
        (-3.0, -1.0),
        (2.0, 9.0),
        (-1e-3, 1e3),
    ] {
        let (s, z) = activation_params(Range { min, max }, false).unwrap();
        let level = |x: f32| (x / s).round_ties_even() + f32::from(z);
        assert!(
            level(min.min(0.0)) >= 0.0 && level(max.max(0.0)) <= 255.0,
            "[{min}, {max}]"
        );
        assert_eq!(level(0.0), f32::from(z), "0 is level {z}");
        // The levels are not wasted: the widened range spans (almost) all 256.
        let span = (max.max(0.0) - min.min(0.0)) / s;
        assert!((span - 255.0).abs() < 1e-3, "[{min}, {max}]: {span} levels");
    }
    assert_eq!(
        activation_params(
            Range {
                min: -3.0,
                max: -1.0
            },
            false
        )
        .unwrap()
        .1,
        255
    );
    assert_eq!(
        activation_params(Range { min: 0.0, max: 0.0 }, false).unwrap(),
        (1.0, 0)
    );
    let (s, z) = activation_params(
        Range {
            min: -2.0,
            max: 0.5,
        },
        true,
    )
    .unwrap();
    assert_eq!((s, z), (4.0 / 255.0, 128));
    for bad in [f32::NAN, f32::INFINITY] {
        let e = activation_params(Range { min: 0.0, max: bad }, false).unwrap_err();
        assert!(e.contains("not finite"), "{e}");
    }
}

/// A convolution (bias, relu) and a dense layer, with random constant weights.
fn model(rng: &mut Rng) -> Function {
    let src = "func @f(%x: f32[2,3,8,8]) -> (f32[2,5]) {
  %w = const {value=0.0} : f32[4,3,3,3]
  %b = const {value=0.1} : f32[4,1,1]
  %c = conv2d %x, %w {pads=[1,1,1,1]} : f32[2,4,8,8]
  %a = add %c, %b : f32[2,4,8,8]
  %r = relu %a : f32[2,4,8,8]
  %flat = reshape %r {shape=[2,256]} : f32[2,256]
  %v = const {value=0.0} : f32[256,5]
  %y = matmul %flat, %v : f32[2,5]
  return %y
}";
    let mut f = parse_function(src).unwrap();
    // Random weights, the conv's channels at different magnitudes so per-channel scales differ.
    for name in ["w", "v"] {
        let op = f.def_op(f.lookup(name).unwrap()).unwrap();
        let OpKind::Const { ty, .. } = &f.op(op).kind else {
            unreachable!()
        };
        let ty = ty.clone();
        let mut t = f64s(&random_tensor(&ty, rng));
        let per = t.len() / ty.dims()[0] as usize;
        for (i, x) in t.iter_mut().enumerate() {
            *x *= 1.0 + (i / per) as f64;
        }
        let data = Data::F32(t.iter().map(|&x| x as f32).collect());
        f.op_mut(op).kind = OpKind::Const {
            ty,
            value: tcc_ir::Literal::dense(data),
        };
    }
    f
}

/// The observed range of each layer's input over `inputs`, as a calibration would find it.
fn ranges(f: &Function, inputs: &[Tensor]) -> HashMap<Value, Range> {
    let mut g = f.clone();
    let ins: Vec<Value> = layers(f).iter().map(|l| l.input).collect();
    g.set_results(ins.clone());
    let out = interp::run(&g, inputs).unwrap();
    (ins.iter().zip(&out))
        .map(|(&v, t)| {
            let x = f64s(t);
            let min = x.iter().copied().fold(f64::INFINITY, f64::min) as f32;
            let max = x.iter().copied().fold(f64::NEG_INFINITY, f64::max) as f32;
            (v, Range { min, max })
        })
        .collect()
}

/// Both layers run on the integer ops, per tensor and per channel; each weight level is its
/// value over its scale rounded, each scale's channel reaches ±127; the output is within a
/// few quantization steps of the float model's.
#[test]
fn layers_run_on_integers_within_the_quantization_error() {
    let mut rng = Rng::new(5);
    let f = model(&mut rng);
    let x = random_tensor(f.ty(f.params()[0]), &mut rng);
    let inputs = vec![x];
    assert_eq!(layers(&f).len(), 2);
    let want = f64s(&interp::run(&f, &inputs).unwrap()[0]);
    for per_channel in [false, true] {
        let mut q = f.clone();
        let scheme = Scheme {
            per_channel,
            weights: WeightLevels::Symmetric { bits: 8 },
        };
        let acts: HashMap<Value, Activation> = (ranges(&f, &inputs).into_iter())
            .map(|(v, r)| (v, Activation::fitted(r, false).unwrap()))
            .collect();
        let report = quantize(&mut q, &layers(&f), &acts, scheme).unwrap();
        verify_function(&q).unwrap_or_else(|d| panic!("{d}\n{q}"));
        assert!(report.iter().all(|r| r.integer), "{report:?}");
        let kinds: Vec<&OpKind> = q.schedule().iter().map(|&o| &q.op(o).kind).collect();
        assert!(
            !kinds
                .iter()
                .any(|k| matches!(k, OpKind::Conv2d(_) | OpKind::MatMul))
        );
        assert_eq!(
            kinds
                .iter()
                .filter(|k| matches!(k, OpKind::ConvInteger(_) | OpKind::MatMulInteger))
                .count(),
            2,
            "{q}"
        );
        // The filter's levels and scales against the float weights.
        let conv = (q.schedule().iter())
            .find(|&&o| matches!(q.op(o).kind, OpKind::ConvInteger(_)))
            .copied()
            .unwrap();
        let constant = |v: Value| {
            let OpKind::Const { ty, value } = &q.op(q.def_op(v).unwrap()).kind else {
                panic!("not a constant:\n{q}")
            };
            Tensor::from_literal(ty, value).unwrap()
        };
        let levels = constant(q.op(conv).args[1]);
        let Data::I8(levels) = levels.data() else {
            panic!("the filter is not i8")
        };
        let w = f64s(&constant_of(&f, "w"));
        let scales = w_scales(&q, conv);
        let per = w.len() / 4;
        for (i, (&l, &x)) in levels.iter().zip(&w).enumerate() {
            let s = scales[if per_channel { i / per } else { 0 }];
            assert!((-127..=127).contains(&l));
            assert!(
                (f64::from(l) * s - x).abs() <= s / 2.0 * (1.0 + 1e-6),
                "weight {i}: level {l} x {s} for {x}"
            );
        }
        for c in 0..scales.len() {
            let group = if per_channel {
                &levels[c * per..(c + 1) * per]
            } else {
                &levels[..]
            };
            assert_eq!(group.iter().map(|l| l.unsigned_abs()).max(), Some(127));
        }
        let got = f64s(&interp::run(&q, &inputs).unwrap()[0]);
        let (num, den) = (got.iter().zip(&want)).fold((0.0, 0.0), |(n, d), (a, b)| {
            (n + (a - b) * (a - b), d + b * b)
        });
        let rel = (num / den).sqrt();
        assert!(
            rel < 0.03,
            "per channel {per_channel}: relative error {rel}"
        );
    }
}

fn constant_of(f: &Function, name: &str) -> Tensor {
    let OpKind::Const { ty, value } = &f.op(f.def_op(f.lookup(name).unwrap()).unwrap()).kind else {
        panic!("`{name}` is not a constant")
    };
    Tensor::from_literal(ty, value).unwrap()
}

/// The weight scales of integer convolution `conv` of `q`: the constant the `qdq` rewrite
/// multiplies the accumulator by, divided by the activation's scale.
fn w_scales(q: &Function, conv: tcc_ir::Op) -> Vec<f64> {
    // conv_integer -> cast -> mul by (activation scale * weight scales).
    let users = |v: Value| -> Vec<tcc_ir::Op> {
        (q.schedule().iter().copied())
            .filter(|&o| q.op(o).args.contains(&v))
            .collect()
    };
    let cast = users(q.op(conv).results[0])[0];
    let mul = users(q.op(cast).results[0])[0];
    let scale = q.op(mul).args[1];
    let combined = f64s(
        &interp::run(
            &{
                let mut g = q.clone();
                g.set_results(vec![scale]);
                g
            },
            &[Tensor::zeros(q.ty(q.params()[0]).clone()).unwrap()],
        )
        .unwrap()[0],
    );
    // The activation's scale: the first quantize_linear's (a constant).
    let quant = (q.schedule().iter())
        .find(|&&o| matches!(q.op(o).kind, OpKind::QuantizeLinear))
        .copied()
        .unwrap();
    let OpKind::Const { ty, value } = &q.op(q.def_op(q.op(quant).args[1]).unwrap()).kind else {
        panic!("the activation scale is not a constant")
    };
    let sx = f64s(&Tensor::from_literal(ty, value).unwrap())[0];
    combined.iter().map(|c| c / sx).collect()
}

/// A list literal of `x`.
fn list(x: &[f64]) -> String {
    let items: Vec<String> = x.iter().map(|v| format!("{:?}", *v as f32)).collect();
    format!("[{}]", items.join(", "))
}

/// `tcc quantize --from-qat`: with the levels quantization-aware training used (activations
/// over learned ranges, one of which clips; weights over their own ranges, nudged, narrow or
/// not, 8 and 5 bits, per tensor and per channel), the integer model computes what the trained
/// model's fake quantization did, up to the float sums' rounding.
#[test]
fn learned_levels_compute_what_fake_quantization_did() {
    let mut rng = Rng::new(11);
    let f = model(&mut rng);
    let x = random_tensor(f.ty(f.params()[0]), &mut rng);
    let weights = |name: &str| f64s(&constant_of(&f, name));
    let (w, v) = (weights("w"), weights("v"));
    // Learned ranges of the two layers' inputs: the conv's clips x (standard normal).
    let learned = [
        Range {
            min: -0.7,
            max: 1.9,
        },
        Range {
            min: -0.3,
            max: 4.5,
        },
    ];
    for per_channel in [false, true] {
        for (bits, narrow) in [(8, true), (8, false), (5, true)] {
            // Each channel's range widened to include 0, as the `quantize` pass takes it.
            let bounds = |x: &[f64], channels: usize, channel: &dyn Fn(usize) -> usize| {
                let (mut lo, mut hi) = (vec![0.0f64; channels], vec![0.0f64; channels]);
                for (i, &e) in x.iter().enumerate() {
                    let c = channel(i);
                    (lo[c], hi[c]) = (lo[c].min(e), hi[c].max(e));
                }
                (lo, hi)
            };
            let (wb, vb, wt, vt) = if per_channel {
                let wb = bounds(&w, 4, &|i| i / 27);
                let vb = bounds(&v, 5, &|i| i % 5);
                (wb, vb, "f32[4,1,1,1]", "f32[1,5]")
            } else {
                (
                    bounds(&w, 1, &|_| 0),
                    bounds(&v, 1, &|_| 0),
                    "f32[]",
                    "f32[]",
                )
            };
            let fq = |v: &str, lo: &str, hi: &str, ty: &str, bits: u64, narrow: bool| {
                format!(
                    "  %{v}q = fake_quant %{v}, %{lo}, %{hi} {{bits={bits}, narrow={narrow}}} : {ty}\n"
                )
            };
            let value = |x: &[f64]| {
                if x.len() == 1 {
                    format!("{:?}", x[0] as f32)
                } else {
                    list(x)
                }
            };
            let trained = format!(
                "func @g(%x: f32[2,3,8,8]) -> (f32[2,5]) {{
  %w = const {{value={}}} : f32[4,3,3,3]
  %wlo = const {{value={}}} : {wt}
  %whi = const {{value={}}} : {wt}
{}  %xlo = const {{value={:?}}} : f32[]
  %xhi = const {{value={:?}}} : f32[]
{}  %b = const {{value=0.1}} : f32[4,1,1]
  %c = conv2d %xq, %wq {{pads=[1,1,1,1]}} : f32[2,4,8,8]
  %a = add %c, %b : f32[2,4,8,8]
  %r = relu %a : f32[2,4,8,8]
  %flat = reshape %r {{shape=[2,256]}} : f32[2,256]
  %flatlo = const {{value={:?}}} : f32[]
  %flathi = const {{value={:?}}} : f32[]
{}  %v = const {{value={}}} : f32[256,5]
  %vlo = const {{value={}}} : {vt}
  %vhi = const {{value={}}} : {vt}
{}  %y = matmul %flatq, %vq : f32[2,5]
  return %y
}}",
                list(&w),
                value(&wb.0),
                value(&wb.1),
                fq("w", "wlo", "whi", "f32[4,3,3,3]", bits, narrow),
                learned[0].min,
                learned[0].max,
                fq("x", "xlo", "xhi", "f32[2,3,8,8]", 8, false),
                learned[1].min,
                learned[1].max,
                fq("flat", "flatlo", "flathi", "f32[2,256]", 8, false),
                list(&v),
                value(&vb.0),
                value(&vb.1),
                fq("v", "vlo", "vhi", "f32[256,5]", bits, narrow),
            );
            let g = parse_function(&trained).unwrap_or_else(|e| panic!("{e:?}\n{trained}"));
            let want = f64s(&interp::run(&g, std::slice::from_ref(&x)).unwrap()[0]);
            let found = layers(&f);
            let acts: HashMap<Value, Activation> = (found.iter().zip(learned))
                .map(|(l, r)| (l.input, Activation::learned(r).unwrap()))
                .collect();
            let mut q = f.clone();
            let scheme = Scheme {
                per_channel,
                weights: WeightLevels::Nudged { bits, narrow },
            };
            let report = quantize(&mut q, &found, &acts, scheme).unwrap();
            verify_function(&q).unwrap_or_else(|d| panic!("{d}\n{q}"));
            assert!(report.iter().all(|r| r.integer), "{report:?}");
            let got = f64s(&interp::run(&q, std::slice::from_ref(&x)).unwrap()[0]);
            let top = want.iter().fold(0.0f64, |m, y| m.max(y.abs()));
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-5 * top,
                    "{bits} bits, narrow {narrow}, per channel {per_channel}: output {i} is {a}, the trained model's {b}"
                );
            }
        }
    }
}

/// Products whose weights are not constants, or whose activation is one, are not layers; a
/// layer whose input has no range is left in float.
#[test]
fn what_stays_in_float() {
    let f = parse_function(
        "func @f(%x: f32[2,8], %w: f32[8,3]) -> (f32[2,3], f32[2,3]) {
  %c = const {value=0.5} : f32[8,3]
  %k = const {value=1.0} : f32[2,8]
  %y = matmul %x, %w : f32[2,3]
  %z = matmul %k, %c : f32[2,3]
  %u = matmul %x, %c : f32[2,3]
  %s = add %z, %u : f32[2,3]
  return %y, %s
}",
    )
    .unwrap();
    let found = layers(&f);
    assert_eq!(found.len(), 1);
    assert_eq!(f.name(found[0].output), "u");
    let mut q = f.clone();
    let report = quantize(&mut q, &found, &HashMap::new(), Scheme::default()).unwrap();
    assert!(report.is_empty());
    assert!(
        (q.schedule().iter()).all(|&o| !matches!(q.op(o).kind, OpKind::MatMulInteger)),
        "{q}"
    );
}

/// The entropy calibration clips a sparse tail of outliers, keeps the bulk of the values, and
/// keeps (almost) the whole range of a histogram with no tail; an empty histogram keeps it all.
#[test]
fn entropy_clips_outliers_and_keeps_the_bulk() {
    let amax = 100.0f32;
    let mut hist = vec![0u64; 2048];
    for (i, h) in hist.iter_mut().take(200).enumerate() {
        *h = 1000 - 4 * i as u64;
    }
    hist[2040] = 3;
    hist[1500] = 2;
    let t = entropy_threshold(&hist, amax, 128);
    assert!(
        t >= amax * 200.0 / 2048.0 && t < amax * 0.5,
        "threshold {t} for a bulk below {} and outliers at {}",
        amax * 200.0 / 2048.0,
        amax * 1500.0 / 2048.0
    );
    let flat = vec![10u64; 2048];
    let t = entropy_threshold(&flat, amax, 128);
    assert!(t >= 0.9 * amax, "threshold {t} for a flat histogram");
    assert_eq!(entropy_threshold(&[0; 2048], amax, 128), amax);
}

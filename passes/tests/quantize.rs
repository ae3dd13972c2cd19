//! `quantize`: what it inserts, checked by running the rewritten function in the interpreter
//! against the same arithmetic written out: weights fake-quantized over their own range, the
//! activation over its moving range (updated as an exponential moving average), passed through
//! while the step is below the delay; and the errors a user can cause.

use tcc_ir::interp::{fake_quant, run};
use tcc_ir::{Data, Function, Tensor, parse_function};
use tcc_passes::manager::Options;
use tcc_passes::quant::quantize::{self, Quantize};

const SRC: &str = "func @f(%x: f32[1,2,4,4], %w: f32[3,2,3,3], %b: f32[3,1,1]) -> (f32[1,3,2,2]) {
  %conv = conv2d %x, %w : f32[1,3,2,2]
  %add = add %conv, %b : f32[1,3,2,2]
  %relu = relu %add : f32[1,3,2,2]
  return %relu
}";

fn floats(t: &Tensor) -> Vec<f64> {
    match t.data() {
        Data::F32(v) => v.iter().map(|&x| x as f64).collect(),
        d => panic!("{:?}", d.dtype()),
    }
}

fn t(dims: &[u64], v: Vec<f32>) -> Tensor {
    Tensor::from_f32(dims, v).unwrap()
}

/// The rewritten function on fixed inputs, at `step`, with moving range (-1, 3).
fn quantized_outputs(f: &Function, step: f32) -> Vec<Tensor> {
    let x = t(
        &[1, 2, 4, 4],
        (0..32).map(|i| ((i * 7 % 11) as f32 - 5.0) * 0.3).collect(),
    );
    let w = t(
        &[3, 2, 3, 3],
        (0..54)
            .map(|i| ((i * 5 % 13) as f32 - 6.0) * 0.11)
            .collect(),
    );
    let b = t(&[3, 1, 1], vec![0.2, -0.1, 0.05]);
    run(
        f,
        &[
            x,
            w,
            b,
            t(&[], vec![step]),
            t(&[], vec![-1.0]),
            t(&[], vec![3.0]),
        ],
    )
    .unwrap()
}

#[test]
fn weights_and_activations_as_tensorflow_quantizes_them() {
    let mut f = parse_function(SRC).unwrap();
    let q = Quantize {
        delay: 10,
        ..Quantize::default()
    };
    let stats = q.run(&mut f).unwrap();
    assert_eq!((stats.weights, stats.activations), (1, 1));
    tcc_ir::verify_function(&f).unwrap();
    let names: Vec<&str> = f.params().iter().map(|&p| f.name(p)).collect();
    assert_eq!(
        names,
        [
            "x",
            "w",
            "b",
            "quant/step",
            "quant/relu/min",
            "quant/relu/max"
        ]
    );

    // The same arithmetic written out: weights over their own range widened to zero, narrow.
    let plain = parse_function(SRC).unwrap();
    let before = quantized_outputs(&f, 0.0);
    let w: Vec<f64> = (0..54)
        .map(|i| (((i * 5 % 13) as f32 - 6.0) * 0.11) as f64)
        .collect();
    let (lo, hi) = (
        w.iter().fold(0f64, |a, &b| a.min(b)),
        w.iter().fold(0f64, |a, &b| a.max(b)),
    );
    let wq: Vec<f32> = w
        .iter()
        .map(|&v| fake_quant(v, lo, hi, 8, true, true) as f32)
        .collect();
    let x = t(
        &[1, 2, 4, 4],
        (0..32).map(|i| ((i * 7 % 11) as f32 - 5.0) * 0.3).collect(),
    );
    let b = t(&[3, 1, 1], vec![0.2, -0.1, 0.05]);
    let relu = run(&plain, &[x, t(&[3, 2, 3, 3], wq), b])
        .unwrap()
        .remove(0);
    // Step 0 < delay 10: the activation passes through; the step and the ranges move on.
    assert_eq!(before[0], relu);
    assert_eq!(floats(&before[1]), [1.0]);
    let r = floats(&relu);
    let (bmin, bmax) = (
        r.iter().fold(0f64, |a, &b| a.min(b)),
        r.iter().fold(0f64, |a, &b| a.max(b)),
    );
    let ema = |old: f64, batch: f64| (old as f32 * 0.999f32 + batch as f32 * 0.001f32) as f64;
    let (new_min, new_max) = (floats(&before[2])[0], floats(&before[3])[0]);
    assert!((new_min - ema(-1.0, bmin)).abs() < 1e-6, "{new_min}");
    assert!((new_max - ema(3.0, bmax)).abs() < 1e-6, "{new_max}");
    // Step 10: the activation is quantized over the updated range, 8 bits, wide.
    let after = quantized_outputs(&f, 10.0);
    let want: Vec<f64> = r
        .iter()
        .map(|&v| fake_quant(v, new_min, new_max, 8, false, true))
        .collect();
    assert_eq!(floats(&after[0]), want);
    assert_ne!(floats(&after[0]), r, "quantization changes something");
}

#[test]
fn scopes_select_layers_and_errors_name_what_is_wrong() {
    let src = "func @f(%x: f32[2,4], %w: f32[4,3], %v: f32[3,3]) -> (f32[2,3]) {
  %fc1/matmul = matmul %x, %w : f32[2,3]
  %fc2/matmul = matmul %fc1/matmul, %v : f32[2,3]
  return %fc2/matmul
}";
    let mut f = parse_function(src).unwrap();
    let q = Quantize {
        scopes: vec!["fc2/".into()],
        ..Quantize::default()
    };
    assert_eq!(q.run(&mut f).unwrap().weights, 1);
    let mut f = parse_function(src).unwrap();
    let q = Quantize {
        scopes: vec!["block9/".into()],
        ..Quantize::default()
    };
    assert_eq!(
        q.run(&mut f).unwrap_err(),
        "scope `block9/` matches no convolution or dense layer; the layers are in fc1/, fc2/"
    );
    let opts = |text: &str| {
        Options::parse_for("quantize", text)
            .map_err(|e| e.message)
            .and_then(|o| quantize::options(&o))
    };
    assert!(
        opts("bits=1")
            .unwrap_err()
            .contains("option `bits` must be 2 to 16, found 1")
    );
    assert!(
        opts("act-bits=17")
            .unwrap_err()
            .contains("option `act-bits` must be 2 to 16, found 17")
    );
    assert!(
        opts("ema-decay=1.5")
            .unwrap_err()
            .contains("must be in [0, 1)")
    );
    assert!(
        opts("delay=-3")
            .unwrap_err()
            .contains("non-negative integer")
    );
    assert!(
        opts("frequency=2")
            .unwrap_err()
            .contains("valid options are")
    );
    assert_eq!(opts("bits=4,per-channel=true").unwrap().bits, 4);
}

/// `per-channel=true`: each output channel of a filter (and each column of a dense layer) has
/// its own range.
#[test]
fn per_channel_weight_ranges() {
    let mut f = parse_function(SRC).unwrap();
    let q = Quantize {
        per_channel: true,
        ..Quantize::default()
    };
    q.run(&mut f).unwrap();
    let fq: Vec<_> = (f.schedule().iter())
        .filter(|&&op| matches!(f.op(op).kind, tcc_ir::OpKind::FakeQuant { .. }))
        .map(|&op| f.op(op).args.clone())
        .collect();
    // The weights' range is one per output channel: [3, 1, 1, 1].
    assert_eq!(f.ty(fq[0][1]).dims(), [3, 1, 1, 1]);
    assert_eq!(f.ty(fq[0][2]).dims(), [3, 1, 1, 1]);
    // Numerically: each channel quantized over its own range (no delay: the activation is
    // quantized too, over its updated moving range).
    let x = t(
        &[1, 2, 4, 4],
        (0..32).map(|i| ((i * 7 % 11) as f32 - 5.0) * 0.3).collect(),
    );
    let wv: Vec<f32> = (0..54)
        .map(|i| ((i * 5 % 13) as f32 - 6.0) * 0.11)
        .collect();
    let b = t(&[3, 1, 1], vec![0.2, -0.1, 0.05]);
    let ins = [
        x.clone(),
        t(&[3, 2, 3, 3], wv.clone()),
        b.clone(),
        t(&[], vec![-1.0]),
        t(&[], vec![3.0]),
    ];
    let out = run(&f, &ins).unwrap();
    let w: Vec<f64> = wv.iter().map(|&v| v as f64).collect();
    let wq: Vec<f32> = (0..54)
        .map(|i| {
            let ch = &w[(i / 18) * 18..(i / 18 + 1) * 18];
            let lo = ch.iter().fold(0f64, |a, &b| a.min(b));
            let hi = ch.iter().fold(0f64, |a, &b| a.max(b));
            fake_quant(w[i], lo, hi, 8, true, true) as f32
        })
        .collect();
    let plain = parse_function(SRC).unwrap();
    let relu = run(&plain, &[x, t(&[3, 2, 3, 3], wq), b])
        .unwrap()
        .remove(0);
    let (lo, hi) = (floats(&out[1])[0], floats(&out[2])[0]);
    let expect: Vec<f64> = floats(&relu)
        .iter()
        .map(|&v| fake_quant(v, lo, hi, 8, false, true))
        .collect();
    assert_eq!(floats(&out[0]), expect);
}

/// After `fold-bn{training=true}` of a dense layer reshaped to 4-D for its batch norm, the
/// layer kept for the batch statistics is left float, the folded layer's weights are quantized,
/// and its activation is quantized after the reshape, the corrections and the relu.
#[test]
fn through_a_reshape_after_training_folding() {
    let mut f = parse_function(
        "func @f(%x: f32[6,5], %w: f32[5,3], %g: f32[3], %b: f32[3]) -> (f32[6,3,1,1]) {
  %z = matmul %x, %w : f32[6,3]
  %y = reshape %z {shape=[6,3,1,1]} : f32[6,3,1,1]
  %n, %mean, %var = batch_norm_train %y, %g, %b : f32[6,3,1,1], f32[3], f32[3]
  %r = relu %n : f32[6,3,1,1]
  return %r
}",
    )
    .unwrap();
    let t = tcc_passes::quant::fold_bn::Training {
        freeze_delay: None,
        decay: 0.9,
    };
    tcc_passes::quant::fold_bn_training::fold_bn_training(&mut f, &t).unwrap();
    let s = Quantize::default().run(&mut f).unwrap();
    assert_eq!((s.weights, s.activations), (1, 1), "{f}");
    let quantized: Vec<String> = (f.schedule().iter())
        .map(|&op| f.op(op))
        .filter(|d| matches!(d.kind, tcc_ir::OpKind::FakeQuant { .. }))
        .map(|d| f.name(d.args[0]).to_string())
        .collect();
    assert_eq!(quantized.len(), 2, "{f}");
    assert!(quantized.contains(&"r".to_string()), "{quantized:?}\n{f}");
    // The statistics layer reads the float weights.
    let z = f.def_op(f.lookup("z").unwrap()).unwrap();
    assert_eq!(f.name(f.op(z).args[1]), "w", "{f}");
}

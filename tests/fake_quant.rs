//! `fake_quant` against TensorFlow's `fake_quant_with_min_max_vars`: values and integer codes
//! against an independent numpy implementation (`tests/data/fake_quant/make.py`), TensorFlow's
//! own documented ranges, the compiled kernel bit for bit against the interpreter, and the
//! gradients against TensorFlow's definition.

mod common;

use std::path::Path;
use tcc::ir::interp::{self, fake_quant_range};
use tcc::ir::{Data, Tensor, parse_function};
use tcc::passes::grad::{GradOptions, Wrt, grad};

fn read(name: &str) -> Vec<f64> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/fake_quant")
        .join(name);
    let t = tcc_tools::npy::read(&std::fs::read(&p).unwrap()).unwrap();
    match t.data() {
        Data::F32(v) => v.iter().map(|&x| x as f64).collect(),
        Data::I64(v) => v.iter().map(|&x| x as f64).collect(),
        d => panic!("{name}: {:?}", d.dtype()),
    }
}

fn function(n: usize, bits: u64, narrow: bool) -> String {
    format!(
        "func @f(%x: f32[{n}], %lo: f32[], %hi: f32[]) -> (f32[{n}]) {{\n  %y = fake_quant %x, %lo, %hi {{bits={bits}, narrow={narrow}}} : f32[{n}]\n  return %y\n}}"
    )
}

fn scalar(x: f64) -> Tensor {
    Tensor::from_f32(&[], vec![x as f32]).unwrap()
}

/// TensorFlow's examples: the nudged ranges its documentation and tests give.
#[test]
fn tensorflow_ranges() {
    let cases = [
        (-0.1, 127.4, 8, false, (0.0, 127.5, 0.5)),
        (0.1, 127.1, 8, true, (0.0, 127.0, 0.5)),
        (-128.0, -0.5, 8, false, (-127.5, 0.0, 0.5)),
    ];
    for (lo, hi, bits, narrow, want) in cases {
        let (a, b, s) =
            fake_quant_range(lo as f32 as f64, hi as f32 as f64, bits, narrow, true).unwrap();
        assert_eq!((a, b, s), want, "{lo}..{hi}, {bits} bits, narrow {narrow}");
    }
    // No range when min < max fails: the op gives NaN.
    assert_eq!(fake_quant_range(1.0, 1.0, 8, false, true), None);
    assert!(interp::fake_quant(0.5, 2.0, 1.0, 8, false, true).is_nan());
}

/// Values and codes against numpy, interpreted and compiled.
#[test]
fn values_and_codes_match_an_independent_implementation() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/fake_quant");
    let cases = std::fs::read_to_string(dir.join("cases.txt")).unwrap();
    let mut n = 0;
    for line in cases.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        let (i, lo, hi, bits, narrow): (usize, f64, f64, u64, bool) = (
            w[0].parse().unwrap(),
            w[1].parse().unwrap(),
            w[2].parse().unwrap(),
            w[3].parse().unwrap(),
            w[4] == "1",
        );
        let x = read(&format!("case_{i}_x.npy"));
        let want = read(&format!("case_{i}_y.npy"));
        let codes = read(&format!("case_{i}_codes.npy"));
        let f = parse_function(&function(x.len(), bits, narrow)).unwrap();
        let xs = Tensor::from_f32(
            &[x.len() as u64],
            x.iter().map(|&v| v as f32).collect::<Vec<f32>>(),
        )
        .unwrap();
        let inputs = [xs, scalar(lo), scalar(hi)];
        let interpreted = interp::run(&f, &inputs).unwrap().remove(0);
        let compiled = tcc::Program::from_function(&f)
            .unwrap()
            .run(&inputs)
            .unwrap()
            .remove(0);
        assert_eq!(
            compiled, interpreted,
            "case {i}: the kernel differs from the interpreter"
        );
        let Data::F32(got) = interpreted.data() else {
            unreachable!()
        };
        let (nmin, _, scale) = fake_quant_range(lo, hi, bits, narrow, true).unwrap();
        let qmin = if narrow { 1.0 } else { 0.0 };
        for (k, (&g, (&w, &c))) in got.iter().zip(want.iter().zip(&codes)).enumerate() {
            assert_eq!(g as f64, w, "case {i}, element {k} (x = {})", x[k]);
            let code = ((g as f64 - nmin) / scale).round() + qmin;
            assert_eq!(code, c, "case {i}, element {k}: code");
            n += 1;
        }
    }
    assert!(n > 2000, "{n} elements");
}

/// Per-channel ranges (`[C, 1]` broadcast over rows), compiled bit for bit as interpreted.
#[test]
fn per_channel_ranges() {
    let src = "func @f(%w: f32[3,5], %lo: f32[3,1], %hi: f32[3,1]) -> (f32[3,5]) {
  %y = fake_quant %w, %lo, %hi {bits=4, narrow=true} : f32[3,5]
  return %y
}";
    let f = parse_function(src).unwrap();
    let w = Tensor::from_f32(
        &[3, 5],
        (0..15)
            .map(|i| (i as f32 - 7.0) * 0.37)
            .collect::<Vec<f32>>(),
    )
    .unwrap();
    let lo = Tensor::from_f32(&[3, 1], vec![-1.0, -3.0, -0.5]).unwrap();
    let hi = Tensor::from_f32(&[3, 1], vec![1.0, 2.0, 6.0]).unwrap();
    let inputs = [w.clone(), lo, hi];
    let want = interp::run(&f, &inputs).unwrap();
    let got = tcc::Program::from_function(&f)
        .unwrap()
        .run(&inputs)
        .unwrap();
    assert_eq!(got, want);
    let Data::F32(y) = want[0].data() else {
        unreachable!()
    };
    let Data::F32(x) = w.data() else {
        unreachable!()
    };
    for r in 0..3 {
        let (lo, hi) = ([-1.0, -3.0, -0.5][r], [1.0, 2.0, 6.0][r]);
        for c in 0..5 {
            let k = r * 5 + c;
            assert_eq!(
                y[k] as f64,
                interp::fake_quant(x[k] as f64, lo, hi, 4, true, true)
            );
        }
    }
}

/// The gradients are TensorFlow's: `dy` straight through inside the nudged range, and the
/// cotangents below and above it summed into `min` and `max`.
#[test]
fn gradients_are_tensorflows() {
    let n = 64;
    let src = function(n, 8, false);
    let mut f = parse_function(&src).unwrap();
    let opts = GradOptions {
        ys: vec!["y".into()],
        wrt: Wrt::Params,
        grad_ys: true,
        ..GradOptions::default()
    };
    grad(&mut f, &opts).unwrap();
    let (lo, hi) = (-0.7, 1.9);
    let x: Vec<f32> = (0..n).map(|i| -1.5 + 4.0 * i as f32 / n as f32).collect();
    let dy: Vec<f32> = (0..n).map(|i| 1.0 + (i % 7) as f32 * 0.25).collect();
    let inputs = [
        Tensor::from_f32(&[n as u64], x.clone()).unwrap(),
        scalar(lo),
        scalar(hi),
        Tensor::from_f32(&[n as u64], dy.clone()).unwrap(),
    ];
    let out = interp::run(&f, &inputs).unwrap();
    let (nmin, nmax, _) =
        fake_quant_range(lo as f32 as f64, hi as f32 as f64, 8, false, true).unwrap();
    let (mut want_dx, mut want_min, mut want_max) = (Vec::new(), 0.0f64, 0.0f64);
    for (&xv, &g) in x.iter().zip(&dy) {
        let xv = xv as f64;
        if xv < nmin {
            want_min += g as f64;
            want_dx.push(0.0);
        } else if xv > nmax {
            want_max += g as f64;
            want_dx.push(0.0);
        } else {
            want_dx.push(g as f64);
        }
    }
    assert!(
        want_min > 0.0 && want_max > 0.0,
        "the inputs reach both sides"
    );
    assert_eq!(common::f64s(&out[1]), want_dx);
    assert!((common::f64s(&out[2])[0] - want_min).abs() < 1e-4);
    assert!((common::f64s(&out[3])[0] - want_max).abs() < 1e-4);
    // And compiled, the same.
    let compiled = tcc::Program::from_function(&f)
        .unwrap()
        .run(&inputs)
        .unwrap();
    assert_eq!(compiled[1], out[1]);
}

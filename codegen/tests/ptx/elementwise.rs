//! Elementwise kernels: every op on special values bit for bit against the CPU backend,
//! random elementwise functions, and `pow`.

use super::*;

#[test]
fn every_case_matches_the_cpu_bit_for_bit() {
    for (name, f, inputs) in cases() {
        let got = emulate(&f, &inputs);
        let jit = tcc_codegen::Executable::compile(&f)
            .unwrap()
            .run(&inputs)
            .unwrap();
        same_bits(&got, &jit).unwrap_or_else(|e| panic!("{name}: {e}\n{f}"));
        // And the interpreter, within the CPU backend's tolerances (docs/perf.md: the
        // polynomial exp and its users are within a few ulp; erf and gelu within 1e-6
        // absolute; NaN and infinities must match exactly).
        let atol = if ["erf", "gelu"].contains(&name.as_str()) {
            1e-6
        } else {
            1e-30
        };
        let want = tcc_ir::interp::run(&f, &inputs).unwrap();
        check(&got, &want, 1e-6, atol).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[test]
fn random_elementwise_functions_match() {
    for seed in 0..60 {
        let f = random_elementwise(seed);
        let inputs = randoms(&f, seed ^ 5);
        agree(&f, &inputs, 1e-4, 1e-5);
    }
}

/// `pow` with exponents the kernel layer leaves to the CPU's reference kernels, on special
/// bases and exponents: C's `powf` signs and special cases exactly, values within 1e-5.
#[test]
fn pow_matches() {
    let xs = special();
    let ys = [
        0.75f32,
        -0.75,
        2.5,
        3.0,
        -3.0,
        2.0,
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        7.0,
        -2.0,
    ];
    let n = xs.len() * ys.len();
    let (mut bx, mut by) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for &x in &xs {
        for &y in &ys {
            bx.push(x);
            by.push(y);
        }
    }
    // Also -1 with infinite exponents, and 1 with NaN.
    bx.extend([-1.0, -1.0, 1.0]);
    by.extend([f32::INFINITY, f32::NEG_INFINITY, f32::NAN]);
    let n = bx.len();
    let f = parse_function(&format!(
        "func @f(%x: f32[{n}], %y: f32[{n}]) -> (f32[{n}]) {{\n  %z = pow %x, %y : f32[{n}]\n  return %z\n}}"
    ))
    .unwrap();
    let inputs = vec![
        Tensor::from_f32(&[n as u64], bx.clone()).unwrap(),
        Tensor::from_f32(&[n as u64], by.clone()).unwrap(),
    ];
    let got = emulate(&f, &inputs);
    let want = tcc_ir::interp::run(&f, &inputs).unwrap();
    let (g, w) = (got[0].as_f32().unwrap(), want[0].as_f32().unwrap());
    for i in 0..n {
        let (a, b) = (g[i], w[i]);
        let same_class = (a.is_nan() && b.is_nan())
            || (a == b && a.is_sign_negative() == b.is_sign_negative())
            || ((a - b).abs() <= 1e-5 * b.abs() && a.is_finite() && b.is_finite() && b != 0.0);
        assert!(same_class, "pow({}, {}): got {a}, want {b}", bx[i], by[i]);
    }
    // A constant exponent (local response normalisation's 0.75), inlined.
    let f = parse_function(
        "func @f(%x: f32[2,8]) -> (f32[2,8]) {
  %e = const {value=0.75} : f32[]
  %z = pow %x, %e : f32[2,8]
  return %z
}",
    )
    .unwrap();
    let inputs = randoms(&f, 3);
    against_interpreter(&f, &inputs, 1e-5, 1e-30).unwrap();
}

//! Kernels over rows: reductions, softmax (any axis), cross-entropy and its gradient, top-k.

use super::*;

/// Reductions with a thread per output (short rows) and a block per output (a tree in shared
/// memory), over leading, middle and trailing axes, with prologues and epilogues: against the
/// interpreter (sums in another order than the CPU's, so within rounding) and, for maxima,
/// the CPU bit for bit.
#[test]
fn reductions_match() {
    let cases = [
        // (input, reduce op and attributes, output): thread per output, rows.
        ("f32[9,7]", "reduce_sum %p {axes=[1]}", "f32[9]"),
        // A block per output: a row of 1000, b = 1.
        ("f32[3,1000]", "reduce_mean %p {axes=[1]}", "f32[3]"),
        ("f32[2,700,5]", "reduce_max %p {axes=[1]}", "f32[2,5]"),
        (
            "f32[2,3,4,5]",
            "reduce_max %p {axes=[1,2], keepdims=true}",
            "f32[2,1,1,5]",
        ),
        ("f32[300,2]", "reduce_sum %p {axes=[0]}", "f32[2]"),
        ("f32[257,3]", "reduce_mean %p {axes=[0,1]}", "f32[]"),
        ("f32[5000]", "reduce_sum %p {axes=[0]}", "f32[]"),
    ];
    for (i, (input, red, out)) in cases.iter().enumerate() {
        // A prologue (square, a bias), then an epilogue (sqrt of the result plus one).
        let src = format!(
            "func @f(%x: {input}, %c: f32[]) -> ({out}) {{
  %q = mul %x, %x : {input}
  %p = add %q, %c : {input}
  %r = {red} : {out}
  %s = add %r, %c : {out}
  %y = sqrt %s : {out}
  return %y
}}"
        );
        let f = parse_function(&src).unwrap();
        let inputs = randoms(&f, i as u64);
        one_kernel_agrees(&Ptx::default(), &f, &inputs, 2e-6, 1e-7)
            .unwrap_or_else(|e| panic!("{red}: {e}"));
        if red.starts_with("reduce_max") {
            let jit = tcc_codegen::Executable::compile(&f)
                .unwrap()
                .run(&inputs)
                .unwrap();
            same_bits(&emulate(&f, &inputs), &jit).unwrap_or_else(|e| panic!("{red}: {e}"));
        }
    }
    // Axes that are not contiguous (a bias's gradient: every axis but the channels): a
    // thread per output walking the reduced positions.
    for red in [
        "reduce_sum %x {axes=[0,2,3]} : f32[3]",
        "reduce_mean %x {axes=[0,2], keepdims=true} : f32[1,3,1,5]",
        "reduce_max %x {axes=[3,1]} : f32[2,4]",
    ] {
        let src = format!(
            "func @f(%x: f32[2,3,4,5]) -> ({}) {{\n  %r = {red}\n  return %r\n}}",
            red.rsplit(" : ").next().unwrap()
        );
        let f = parse_function(&src).unwrap();
        let inputs = randoms(&f, 8);
        against_interpreter(&f, &inputs, 1e-6, 1e-7).unwrap_or_else(|e| panic!("{red}: {e}"));
    }
    // NaN and infinities in a maximum and a sum.
    let f = parse_function(
        "func @f(%x: f32[4,100]) -> (f32[4], f32[4]) {
  %m = reduce_max %x {axes=[1]} : f32[4]
  %s = reduce_sum %x {axes=[1]} : f32[4]
  return %m, %s
}",
    )
    .unwrap();
    let mut xs = vec![1.0f32; 400];
    xs[5] = f32::NAN;
    xs[150] = f32::INFINITY;
    xs[250] = f32::NEG_INFINITY;
    xs[399] = -3.0;
    let x = Tensor::from_f32(&[4, 100], xs).unwrap();
    let got = emulate(&f, std::slice::from_ref(&x));
    let want = tcc_ir::interp::run(&f, &[x]).unwrap();
    check(&got, &want, 1e-6, 0.0).unwrap();
}

/// Softmax and log-softmax rows, a thread per row (short rows) and a block per row (long
/// ones), with a prologue and an epilogue, against the interpreter within the CPU's
/// tolerance; huge, infinite and NaN inputs (a NaN row is all NaN, as is a row of -inf).
#[test]
fn softmax_rows_match() {
    for (i, ty) in [
        "f32[9,10]",
        "f32[3,1000]",
        "f32[2,3,70]",
        "f32[1,64]",
        "f32[1,1]",
    ]
    .iter()
    .enumerate()
    {
        for op in ["softmax", "log_softmax"] {
            let src = format!(
                "func @f(%x: {ty}, %t: f32[]) -> ({ty}) {{
  %s = div %x, %t : {ty}
  %p = {op} %s {{axis=-1}} : {ty}
  %y = mul %p, %t : {ty}
  return %y
}}"
            );
            let f = parse_function(&src).unwrap();
            let inputs = randoms(&f, 41 + i as u64);
            one_kernel_agrees(&Ptx::default(), &f, &inputs, 2e-6, 1e-9)
                .unwrap_or_else(|e| panic!("{op} {ty}: {e}"));
        }
    }
    // Over an axis that is not the last: a thread per row, its elements apart.
    for (op, axis) in [("softmax", 0), ("log_softmax", 1), ("softmax", -2)] {
        let src = format!(
            "func @f(%x: f32[3,5,4]) -> (f32[3,5,4]) {{\n  %p = {op} %x {{axis={axis}}} : f32[3,5,4]\n  return %p\n}}"
        );
        let f = parse_function(&src).unwrap();
        let inputs = randoms(&f, 9);
        against_interpreter(&f, &inputs, 2e-6, 1e-9)
            .unwrap_or_else(|e| panic!("{op} axis {axis}: {e}"));
    }
    for len in [11, 100] {
        let src = format!(
            "func @f(%x: f32[3,{len}]) -> (f32[3,{len}]) {{\n  %p = softmax %x {{axis=1}} : f32[3,{len}]\n  return %p\n}}"
        );
        let f = parse_function(&src).unwrap();
        let mut x: Vec<f32> = (0..3 * len).map(|i| (i % 7) as f32 - 3.0).collect();
        x[9] = f32::NAN;
        x[len..2 * len].fill(f32::NEG_INFINITY);
        x[2 * len + 3] = 1e30;
        let x = Tensor::from_f32(&[3, len as u64], x).unwrap();
        let got = emulate(&f, std::slice::from_ref(&x));
        let want = tcc_ir::interp::run(&f, &[x]).unwrap();
        check(&got, &want, 2e-6, 1e-9).unwrap_or_else(|e| panic!("{len}: {e}"));
        let g = got[0].as_f32().unwrap();
        assert!(g[..2 * len].iter().all(|v| v.is_nan()) && g[2 * len + 3] == 1.0);
    }
}

/// Softmax cross-entropy: rows spread over one block's threads (more rows than threads too),
/// against the interpreter; a label out of range gives NaN.
#[test]
fn cross_entropy_matches() {
    for (rows, classes) in [(7u64, 3u64), (600, 10)] {
        let src = format!(
            "func @f(%x: f32[{rows},{classes}], %l: i32[{rows}], %s: f32[]) -> (f32[]) {{
  %y = softmax_cross_entropy %x, %l : f32[]
  %z = mul %y, %s : f32[]
  return %z
}}"
        );
        let f = parse_function(&src).unwrap();
        let mut inputs = randoms(&f, rows);
        let labels: Vec<i32> = (0..rows as i32)
            .map(|i| (i * 7 + 3) % classes as i32)
            .collect();
        inputs[1] = Tensor::from_data(&[rows], Data::I32(labels.clone())).unwrap();
        against_interpreter(&f, &inputs, 1e-5, 1e-6)
            .unwrap_or_else(|e| panic!("{rows}x{classes}: {e}"));
        let mut bad = labels;
        bad[2] = classes as i32;
        inputs[1] = Tensor::from_data(&[rows], Data::I32(bad)).unwrap();
        let got = emulate(&f, &inputs);
        assert!(got[0].as_f32().unwrap()[0].is_nan());
    }
    // i64 labels; negative and huge ones are out of range.
    let f = parse_function(
        "func @f(%x: f32[5,4], %l: i64[5]) -> (f32[]) {
  %y = softmax_cross_entropy %x, %l : f32[]
  return %y
}",
    )
    .unwrap();
    let x = randoms(&f, 8).remove(0);
    let labels = Tensor::from_data(&[5], Data::I64(vec![0, 3, 2, 1, 3])).unwrap();
    let inputs = vec![x.clone(), labels];
    against_interpreter(&f, &inputs, 1e-5, 1e-6).unwrap();
    for bad in [-1i64, 1 << 32] {
        let labels = Tensor::from_data(&[5], Data::I64(vec![0, 3, bad, 1, 3])).unwrap();
        let got = emulate(&f, &[x.clone(), labels]);
        assert!(got[0].as_f32().unwrap()[0].is_nan(), "label {bad}");
    }
}

/// The cross-entropy gradient, a thread per row, against the interpreter (i32 and i64
/// labels); a label out of range makes its row NaN.
#[test]
fn cross_entropy_gradient_matches() {
    for (rows, classes, lt) in [(7u64, 3u64, "i32"), (600, 10, "i64")] {
        let src = format!(
            "func @f(%x: f32[{rows},{classes}], %l: {lt}[{rows}], %dy: f32[]) -> (f32[{rows},{classes}]) {{
  %g = softmax_cross_entropy_grad %x, %l, %dy : f32[{rows},{classes}]
  return %g
}}"
        );
        let f = parse_function(&src).unwrap();
        let mut inputs = randoms(&f, rows);
        let labels: Vec<i64> = (0..rows as i64)
            .map(|i| (i * 7 + 3) % classes as i64)
            .collect();
        let make = |l: &[i64]| {
            if lt == "i32" {
                Tensor::from_data(&[rows], Data::I32(l.iter().map(|&v| v as i32).collect()))
            } else {
                Tensor::from_data(&[rows], Data::I64(l.to_vec()))
            }
            .unwrap()
        };
        inputs[1] = make(&labels);
        against_interpreter(&f, &inputs, 1e-5, 1e-8)
            .unwrap_or_else(|e| panic!("{rows}x{classes}: {e}"));
        let mut bad = labels;
        bad[2] = -1;
        inputs[1] = make(&bad);
        let g = emulate(&f, &inputs).remove(0);
        let g = g.as_f32().unwrap();
        let row = |r: usize| &g[r * classes as usize..(r + 1) * classes as usize];
        assert!(row(2).iter().all(|v| v.is_nan()) && !row(1).iter().any(|v| v.is_nan()));
    }
}

/// `top_k` (largest and smallest, along either axis) with ties and NaN: values bit for bit
/// and indices exactly as the interpreter orders them.
#[test]
fn top_k_matches() {
    for (axis, largest, k) in [(1, true, 3), (1, false, 6), (0, true, 2), (0, false, 4)] {
        let (kd0, kd1) = if axis == 1 { (4, k) } else { (k, 6) };
        let src = format!(
            "func @f(%x: f32[4,6]) -> (f32[{kd0},{kd1}], i64[{kd0},{kd1}]) {{
  %v, %i = top_k %x {{k={k}, axis={axis}, largest={largest}}} : f32[{kd0},{kd1}], i64[{kd0},{kd1}]
  return %v, %i
}}"
        );
        let f = parse_function(&src).unwrap_or_else(|e| panic!("{src}\n{e:?}"));
        let xs: Vec<f32> = (0..24)
            .map(|i| match i {
                3 | 16 => f32::NAN,
                _ => ((i * 7) % 5) as f32 - 2.0,
            })
            .collect();
        let x = Tensor::from_f32(&[4, 6], xs).unwrap();
        let got = emulate(&f, std::slice::from_ref(&x));
        let want = tcc_ir::interp::run(&f, std::slice::from_ref(&x)).unwrap();
        same_bits(&got, &want).unwrap_or_else(|e| panic!("axis {axis}, largest {largest}: {e}"));
    }
}

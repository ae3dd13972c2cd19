//! One-op kernels: data movement, casts, pooling and its gradients, gather, batch norm,
//! slice_grad and scatter_add.

use super::*;

/// Transposes, slices (negative starts and steps) and concatenations move every dtype bit
/// for bit; casts convert exactly as the interpreter does (saturating float-to-integer casts,
/// wrapping integer ones, NaN to 0 and to true).
#[test]
fn data_movement_and_casts_match() {
    let srcs = [
        "func @f(%x: f32[2,3,4]) -> (f32[4,2,3]) {\n  %y = transpose %x {perm=[2,0,1]} : f32[4,2,3]\n  return %y\n}",
        "func @f(%x: i32[2,3,4,5]) -> (i32[5,3,2,4]) {\n  %y = transpose %x {perm=[3,1,0,2]} : i32[5,3,2,4]\n  return %y\n}",
        "func @f(%x: u8[7,9]) -> (u8[9,7]) {\n  %y = transpose %x {perm=[1,0]} : u8[9,7]\n  return %y\n}",
        "func @f(%x: f32[10,8]) -> (f32[3,4]) {\n  %y = slice %x {starts=[1,-1], ends=[8,0], steps=[3,-2]} : f32[3,4]\n  return %y\n}",
        "func @f(%x: i64[6]) -> (i64[3]) {\n  %y = slice %x {starts=[0], ends=[6], steps=[2]} : i64[3]\n  return %y\n}",
        "func @f(%a: f32[2,3,4], %b: f32[2,1,4], %c: f32[2,2,4]) -> (f32[2,6,4]) {\n  %y = concat %a, %b, %c {axis=1} : f32[2,6,4]\n  return %y\n}",
        "func @f(%a: i32[3,2], %b: i32[3,5]) -> (i32[3,9]) {\n  %y = concat %a, %b, %a {axis=-1} : i32[3,9]\n  return %y\n}",
    ];
    for src in srcs {
        let f = parse_function(src).unwrap();
        let inputs = randoms(&f, 9);
        let got = emulate(&f, &inputs);
        let want = tcc_ir::interp::run(&f, &inputs).unwrap();
        same_bits(&got, &want).unwrap_or_else(|e| panic!("{src}\n{e}"));
    }
    let xs = special();
    let n = xs.len();
    let x = Tensor::from_f32(&[n as u64], xs).unwrap();
    for to in ["i32", "i8", "u8", "bool", "f64"] {
        let src = format!(
            "func @f(%x: f32[{n}]) -> ({to}[{n}]) {{\n  %y = cast %x {{to={to}}} : {to}[{n}]\n  return %y\n}}"
        );
        let f = parse_function(&src).unwrap();
        let got = emulate(&f, std::slice::from_ref(&x));
        let want = tcc_ir::interp::run(&f, std::slice::from_ref(&x)).unwrap();
        same_bits(&got, &want).unwrap_or_else(|e| panic!("f32 -> {to}: {e}"));
    }
    let ints = Tensor::from_data(&[6], Data::I32(vec![0, -1, 300, -129, 255, i32::MAX])).unwrap();
    for to in ["f32", "i8", "u8", "bool", "f64"] {
        let src = format!(
            "func @f(%x: i32[6]) -> ({to}[6]) {{\n  %y = cast %x {{to={to}}} : {to}[6]\n  return %y\n}}"
        );
        let f = parse_function(&src).unwrap();
        let got = emulate(&f, std::slice::from_ref(&ints));
        let want = tcc_ir::interp::run(&f, std::slice::from_ref(&ints)).unwrap();
        same_bits(&got, &want).unwrap_or_else(|e| panic!("i32 -> {to}: {e}"));
    }
    for (from, data) in [
        ("u8", Data::U8(vec![0, 1, 200, 255])),
        ("i8", Data::I8(vec![0, -1, -128, 127])),
        ("bool", Data::Bool(vec![true, false, false, true])),
    ] {
        let t = Tensor::from_data(&[4], data).unwrap();
        for to in ["f32", "i32"] {
            let src = format!(
                "func @f(%x: {from}[4]) -> ({to}[4]) {{\n  %y = cast %x {{to={to}}} : {to}[4]\n  return %y\n}}"
            );
            let f = parse_function(&src).unwrap();
            let got = emulate(&f, std::slice::from_ref(&t));
            let want = tcc_ir::interp::run(&f, std::slice::from_ref(&t)).unwrap();
            same_bits(&got, &want).unwrap_or_else(|e| panic!("{from} -> {to}: {e}"));
        }
    }
}

/// Max and average pooling (padding, strides, both divisors) and global average pooling.
#[test]
fn pooling_matches() {
    let srcs = [
        "func @f(%x: f32[2,3,9,9]) -> (f32[2,3,5,5]) {\n  %y = max_pool2d %x {kernel=[3,3], strides=[2,2], pads=[1,1,1,1]} : f32[2,3,5,5]\n  return %y\n}",
        "func @f(%x: f32[1,2,8,7]) -> (f32[1,2,4,3]) {\n  %y = avg_pool2d %x {kernel=[2,3], strides=[2,2], pads=[0,0,0,0]} : f32[1,2,4,3]\n  return %y\n}",
        "func @f(%x: f32[1,2,5,5]) -> (f32[1,2,3,3]) {\n  %y = avg_pool2d %x {kernel=[3,3], strides=[2,2], pads=[1,1,1,1]} : f32[1,2,3,3]\n  return %y\n}",
        "func @f(%x: f32[1,2,5,5]) -> (f32[1,2,3,3]) {\n  %y = avg_pool2d %x {kernel=[3,3], strides=[2,2], pads=[1,1,1,1], count_include_pad=true} : f32[1,2,3,3]\n  return %y\n}",
        "func @f(%x: f32[2,5,7,7]) -> (f32[2,5,1,1]) {\n  %y = global_avg_pool %x : f32[2,5,1,1]\n  return %y\n}",
    ];
    for src in srcs {
        let f = parse_function(src).unwrap_or_else(|e| panic!("{src}\n{e:?}"));
        let mut inputs = randoms(&f, 12);
        // A NaN wins a maximum; padding never does (all-negative windows at the edges).
        let mut v = inputs[0].as_f32().unwrap().to_vec();
        v.iter_mut().for_each(|x| *x -= 2.0);
        v[4] = f32::NAN;
        inputs[0] = Tensor::from_f32(inputs[0].dims(), v).unwrap();
        against_interpreter(&f, &inputs, 1e-6, 1e-7).unwrap_or_else(|e| panic!("{src}\n{e}"));
    }
}

/// Gathers (axes 0 and 1, i32 and i64 indices, negative ones counting from the end) copy bit
/// for bit, and an index out of range gives NaN; inference batch norm within rounding.
#[test]
fn gather_and_batch_norm_match() {
    let f = parse_function(
        "func @f(%x: f32[5,3,4], %i: i32[2,3], %j: i64[4]) -> (f32[2,3,3,4], f32[5,4,4]) {
  %a = gather %x, %i {axis=0} : f32[2,3,3,4]
  %b = gather %x, %j {axis=1} : f32[5,4,4]
  return %a, %b
}",
    )
    .unwrap();
    let x = randoms(&f, 2).remove(0);
    let i = Tensor::from_data(&[2, 3], Data::I32(vec![0, 4, -1, 2, -5, 3])).unwrap();
    let j = Tensor::from_data(&[4], Data::I64(vec![2, -3, 0, -1])).unwrap();
    let inputs = vec![x.clone(), i, j];
    let got = emulate(&f, &inputs);
    let want = tcc_ir::interp::run(&f, &inputs).unwrap();
    same_bits(&got, &want).unwrap();
    let bad = Tensor::from_data(&[4], Data::I64(vec![2, 3, 1 << 33, -4])).unwrap();
    let got = emulate(&f, &[inputs[0].clone(), inputs[1].clone(), bad]);
    let b = got[1].as_f32().unwrap();
    // Rows 1 (3), 2 (2^33) and 3 (-4) of every block of 4 are out of range.
    assert!(b[4..16].iter().all(|v| v.is_nan()) && !b[0..4].iter().any(|v| v.is_nan()));
    let f = parse_function(
        "func @f(%x: f32[2,3,4,5], %g: f32[3], %b: f32[3], %m: f32[3], %v: f32[3]) -> (f32[2,3,4,5]) {
  %y = batch_norm %x, %g, %b, %m, %v : f32[2,3,4,5]
  return %y
}",
    )
    .unwrap();
    let mut inputs = randoms(&f, 3);
    let v: Vec<f32> = inputs[4]
        .as_f32()
        .unwrap()
        .iter()
        .map(|x| x.abs() + 0.1)
        .collect();
    inputs[4] = Tensor::from_f32(&[3], v).unwrap();
    against_interpreter(&f, &inputs, 1e-5, 1e-6).unwrap();
    // Training batch norm: the normalised values, the batch mean and the biased variance,
    // a block per channel (a channel of 2 x 300 elements: more than a block's threads).
    for dims in ["2,3,4,5", "2,2,300"] {
        let c = dims.split(',').nth(1).unwrap();
        let src = format!(
            "func @f(%x: f32[{dims}], %g: f32[{c}], %b: f32[{c}]) -> (f32[{dims}], f32[{c}], f32[{c}]) {{
  %y, %m, %v = batch_norm_train %x, %g, %b : f32[{dims}], f32[{c}], f32[{c}]
  return %y, %m, %v
}}"
        );
        let f = parse_function(&src).unwrap();
        let inputs = randoms(&f, 4);
        against_interpreter(&f, &inputs, 1e-5, 1e-6).unwrap_or_else(|e| panic!("{dims}: {e}"));
    }
}

/// `slice_grad` (positive and negative steps) places `dy` bit for bit among zeros;
/// `scatter_add` (repeated and negative indices) adds in index order.
#[test]
fn slice_grad_and_scatter_add_match() {
    let f = parse_function(
        "func @f(%dy: f32[3,4]) -> (f32[10,8]) {
  %dx = slice_grad %dy {shape=[10,8], starts=[1,-1], ends=[8,0], steps=[3,-2]} : f32[10,8]
  return %dx
}",
    )
    .unwrap();
    let inputs = randoms(&f, 5);
    same_bits(
        &emulate(&f, &inputs),
        &tcc_ir::interp::run(&f, &inputs).unwrap(),
    )
    .unwrap();
    let f = parse_function(
        "func @f(%d: f32[5,3], %i: i64[4], %u: f32[4,3]) -> (f32[5,3]) {
  %y = scatter_add %d, %i, %u {axis=0} : f32[5,3]
  return %y
}",
    )
    .unwrap();
    let mut inputs = randoms(&f, 6);
    inputs[1] = Tensor::from_data(&[4], Data::I64(vec![1, -1, 1, 0])).unwrap();
    against_interpreter(&f, &inputs, 1e-6, 1e-7).unwrap();
}

/// Pooling gradients against the interpreter: max (overlapping windows, padding, ties broken
/// by the first position, a NaN) and average (both divisors).
#[test]
fn pooling_gradients_match() {
    let srcs = [
        "func @f(%x: f32[2,3,9,9], %dy: f32[2,3,5,5]) -> (f32[2,3,9,9]) {\n  %g = max_pool2d_grad %x, %dy {kernel=[3,3], strides=[2,2], pads=[1,1,1,1]} : f32[2,3,9,9]\n  return %g\n}",
        "func @f(%x: f32[1,2,8,7], %dy: f32[1,2,4,3]) -> (f32[1,2,8,7]) {\n  %g = max_pool2d_grad %x, %dy {kernel=[2,3], strides=[2,2]} : f32[1,2,8,7]\n  return %g\n}",
        "func @f(%dy: f32[1,2,3,3]) -> (f32[1,2,5,5]) {\n  %g = avg_pool2d_grad %dy {kernel=[3,3], strides=[2,2], pads=[1,1,1,1], shape=[1,2,5,5]} : f32[1,2,5,5]\n  return %g\n}",
        "func @f(%dy: f32[1,2,3,3]) -> (f32[1,2,5,5]) {\n  %g = avg_pool2d_grad %dy {kernel=[3,3], strides=[2,2], pads=[1,1,1,1], count_include_pad=true, shape=[1,2,5,5]} : f32[1,2,5,5]\n  return %g\n}",
    ];
    for src in srcs {
        let f = parse_function(src).unwrap_or_else(|e| panic!("{src}\n{e:?}"));
        let mut inputs = randoms(&f, 13);
        if f.params().len() == 2 {
            // Ties (rounded values) and a NaN in the forward input.
            let mut v: Vec<f32> = inputs[0]
                .as_f32()
                .unwrap()
                .iter()
                .map(|x| (x * 2.0).round())
                .collect();
            v[7] = f32::NAN;
            inputs[0] = Tensor::from_f32(inputs[0].dims(), v).unwrap();
        }
        against_interpreter(&f, &inputs, 1e-6, 1e-7).unwrap_or_else(|e| panic!("{src}\n{e}"));
    }
}

//! The reference interpreter on small cases whose results are known by hand.

use tcc_ir::interp::run;
use tcc_ir::{Data, Tensor, parse_function, verify_function};

/// Runs the one function in `src` on `inputs`.
fn eval(src: &str, inputs: Vec<Tensor>) -> Result<Vec<Tensor>, String> {
    let f = parse_function(src).map_err(|d| d.to_string())?;
    verify_function(&f).map_err(|d| d.to_string())?;
    run(&f, &inputs).map_err(|e| e.to_string())
}

fn f32s(dims: &[u64], v: &[f32]) -> Tensor {
    Tensor::from_f32(dims, v.to_vec()).unwrap()
}

fn floats(t: &Tensor) -> Vec<f64> {
    match t.data() {
        Data::F32(v) => v.iter().map(|&x| x as f64).collect(),
        Data::F64(v) => v.clone(),
        d => panic!("not floats: {d:?}"),
    }
}

fn assert_close(got: &Tensor, want: &[f64]) {
    let g = floats(got);
    assert_eq!(g.len(), want.len(), "{g:?} vs {want:?}");
    for (i, (&a, &b)) in g.iter().zip(want).enumerate() {
        assert!(
            (a - b).abs() <= 1e-6 * (1.0 + b.abs()),
            "element {i}: got {a}, want {b}\n{g:?}"
        );
    }
}

/// A one-op function of one f32 parameter `%x` of type `ty`.
fn unary(op: &str, ty: &str, out: &str) -> String {
    format!("func @f(%x: {ty}) -> ({out}) {{\n  %y = {op} : {out}\n  return %y\n}}")
}

#[test]
fn elementwise_with_broadcasting() {
    let src = "func @f(%a: f32[2,3], %b: f32[3]) -> (f32[2,3], f32[2,3], bool[2,3]) {
  %s = add %a, %b : f32[2,3]
  %m = max %a, %b : f32[2,3]
  %c = gt %a, %b : bool[2,3]
  return %s, %m, %c
}";
    let r = eval(
        src,
        vec![
            f32s(&[2, 3], &[1., 2., 3., 4., 5., 6.]),
            f32s(&[3], &[3., 2., 5.]),
        ],
    )
    .unwrap();
    assert_close(&r[0], &[4., 4., 8., 7., 7., 11.]);
    assert_close(&r[1], &[3., 2., 5., 4., 5., 6.]);
    assert_eq!(
        r[2].data(),
        &Data::Bool(vec![false, false, false, true, true, true])
    );
}

#[test]
fn unary_functions() {
    let x = || f32s(&[4], &[-1.0, 0.0, 0.5, 2.0]);
    let cases: [(&str, [f64; 4]); 6] = [
        ("relu %x", [0.0, 0.0, 0.5, 2.0]),
        (
            "sigmoid %x",
            [
                0.2689414213699951,
                0.5,
                0.6224593312018546,
                0.8807970779778823,
            ],
        ),
        (
            "tanh %x",
            [
                -0.7615941559557649,
                0.0,
                0.46211715726000974,
                0.9640275800758169,
            ],
        ),
        (
            "erf %x",
            [
                -0.8427007929497149,
                0.0,
                0.5204998778130465,
                0.9953222650189527,
            ],
        ),
        (
            "gelu %x",
            [
                -0.15865525393145707,
                0.0,
                0.34573123063700655,
                1.9544997361036416,
            ],
        ),
        (
            "exp %x",
            [
                0.36787944117144233,
                1.0,
                1.6487212707001282,
                7.38905609893065,
            ],
        ),
    ];
    for (op, want) in cases {
        let r = eval(&unary(op, "f32[4]", "f32[4]"), vec![x()]).unwrap();
        assert_close(&r[0], &want);
    }
    let r = eval(
        &unary("rsqrt %x", "f32[4]", "f32[4]"),
        vec![f32s(&[4], &[4.0, 0.25, 1.0, 16.0])],
    )
    .unwrap();
    assert_close(&r[0], &[0.5, 2.0, 1.0, 0.25]);
}

#[test]
fn integers_wrap_and_division_by_zero_names_the_op() {
    let src = "func @f() -> (i8[2], i32[]) {
  %a = const {value=[127, -128]} : i8[2]
  %one = const {value=1} : i8[]
  %s = add %a, %one : i8[2]
  %x = const {value=-7} : i32[]
  %two = const {value=2} : i32[]
  %q = div %x, %two : i32[]
  return %s, %q
}";
    let r = eval(src, vec![]).unwrap();
    assert_eq!(r[0].data(), &Data::I8(vec![-128, -127]));
    assert_eq!(
        r[1].data(),
        &Data::I32(vec![-3]),
        "integer division truncates toward zero"
    );
    let src = "func @f(%x: i32[2]) -> (i32[2]) {
  %z = const {value=0} : i32[]
  %q = div %x, %z : i32[2]
  return %q
}";
    let e = eval(
        src,
        vec![Tensor::from_data(&[2], Data::I32(vec![1, 2])).unwrap()],
    )
    .unwrap_err();
    assert_eq!(
        e,
        "in `@f`, op1 (%q = div %x, %z): integer division by zero"
    );
}

#[test]
fn casts() {
    let src = "func @f(%x: f32[5]) -> (i32[5], u8[5], bool[5]) {
  %i = cast %x {to=i32} : i32[5]
  %u = cast %x {to=u8} : u8[5]
  %b = cast %x {to=bool} : bool[5]
  return %i, %u, %b
}";
    let r = eval(src, vec![f32s(&[5], &[-1.7, 2.9, f32::NAN, 3e10, 300.0])]).unwrap();
    assert_eq!(r[0].data(), &Data::I32(vec![-1, 2, 0, i32::MAX, 300]));
    assert_eq!(r[1].data(), &Data::U8(vec![0, 2, 0, 255, 255]));
    assert_eq!(r[2].data(), &Data::Bool(vec![true, true, true, true, true]));
}

#[test]
fn matmul_batches_broadcast() {
    let src = "func @f(%a: f32[2,2,3], %b: f32[3,2]) -> (f32[2,2,2]) {
  %c = matmul %a, %b : f32[2,2,2]
  return %c
}";
    let a = f32s(
        &[2, 2, 3],
        &[1., 2., 3., 4., 5., 6., 1., 0., 0., 0., 1., 0.],
    );
    let b = f32s(&[3, 2], &[1., 2., 3., 4., 5., 6.]);
    let r = eval(src, vec![a, b]).unwrap();
    assert_close(&r[0], &[22., 28., 49., 64., 1., 2., 3., 4.]);
}

#[test]
fn convolution() {
    let x: Vec<f32> = (1..=9).map(|v| v as f32).collect();
    // A 2x2 box filter over 1..9 in a 3x3 image.
    let src = "func @f(%x: f32[1,1,3,3], %w: f32[1,1,2,2]) -> (f32[1,1,2,2]) {
  %y = conv2d %x, %w : f32[1,1,2,2]
  return %y
}";
    let r = eval(
        src,
        vec![f32s(&[1, 1, 3, 3], &x), f32s(&[1, 1, 2, 2], &[1.; 4])],
    )
    .unwrap();
    assert_close(&r[0], &[12., 16., 24., 28.]);
    // Padding 1 and stride 2: the corners see one, two or four pixels.
    let src = "func @f(%x: f32[1,1,3,3], %w: f32[1,1,2,2]) -> (f32[1,1,2,2]) {
  %y = conv2d %x, %w {strides=[2,2], pads=[1,1,1,1]} : f32[1,1,2,2]
  return %y
}";
    let r = eval(
        src,
        vec![f32s(&[1, 1, 3, 3], &x), f32s(&[1, 1, 2, 2], &[1.; 4])],
    )
    .unwrap();
    assert_close(&r[0], &[1., 5., 11., 28.]);
    // Depthwise with dilation 2: each channel its own 2x2 filter on the image's corners.
    let src = "func @f(%x: f32[1,2,3,3], %w: f32[2,1,2,2]) -> (f32[1,2,1,1]) {
  %y = conv2d %x, %w {dilations=[2,2], groups=2} : f32[1,2,1,1]
  return %y
}";
    let mut two = x.clone();
    two.extend(x.iter().map(|v| v * 10.0));
    let r = eval(
        src,
        vec![
            f32s(&[1, 2, 3, 3], &two),
            f32s(&[2, 1, 2, 2], &[1., 0., 0., 0., 0., 0., 0., 1.]),
        ],
    )
    .unwrap();
    assert_close(&r[0], &[1., 90.]);
}

#[test]
fn pooling() {
    let x: Vec<f32> = (1..=16).map(|v| v as f32).collect();
    let src = "func @f(%x: f32[1,1,4,4]) -> (f32[1,1,2,2], f32[1,1,1,1]) {
  %m = max_pool2d %x {kernel=[2,2], strides=[2,2]} : f32[1,1,2,2]
  %g = global_avg_pool %x : f32[1,1,1,1]
  return %m, %g
}";
    let r = eval(src, vec![f32s(&[1, 1, 4, 4], &x)]).unwrap();
    assert_close(&r[0], &[6., 8., 14., 16.]);
    assert_close(&r[1], &[8.5]);
    // Ones with padding: excluding the pad keeps the mean at 1, including it gives 4/9 at corners.
    let src = "func @f(%x: f32[1,1,3,3]) -> (f32[1,1,3,3], f32[1,1,3,3]) {
  %a = avg_pool2d %x {kernel=[3,3], pads=[1,1,1,1]} : f32[1,1,3,3]
  %b = avg_pool2d %x {kernel=[3,3], pads=[1,1,1,1], count_include_pad=true} : f32[1,1,3,3]
  return %a, %b
}";
    let r = eval(src, vec![f32s(&[1, 1, 3, 3], &[1.; 9])]).unwrap();
    assert_close(&r[0], &[1.; 9]);
    let (c, e, m) = (4. / 9., 6. / 9., 1.);
    assert_close(&r[1], &[c, e, c, e, m, e, c, e, c]);
}

#[test]
fn reductions_and_softmax() {
    let src = "func @f(%x: f32[2,3]) -> (f32[2], f32[1,3], f32[], f32[2,3], f32[2,3]) {
  %s = reduce_sum %x {axes=[1]} : f32[2]
  %m = reduce_mean %x {axes=[0], keepdims=true} : f32[1,3]
  %x2 = reduce_max %x {axes=[0,-1]} : f32[]
  %p = softmax %x : f32[2,3]
  %l = log_softmax %x {axis=0} : f32[2,3]
  return %s, %m, %x2, %p, %l
}";
    let r = eval(src, vec![f32s(&[2, 3], &[1., 2., 3., 1., 1., 1.])]).unwrap();
    assert_close(&r[0], &[6., 3.]);
    assert_close(&r[1], &[1., 1.5, 2.]);
    assert_close(&r[2], &[3.]);
    assert_close(
        &r[3],
        &[
            0.09003057317038046,
            0.24472847105479764,
            0.6652409557748219,
            1. / 3.,
            1. / 3.,
            1. / 3.,
        ],
    );
    let l = |a: f64, b: f64| a - (a.exp() + b.exp()).ln();
    assert_close(
        &r[4],
        &[
            l(1., 1.),
            l(2., 1.),
            l(3., 1.),
            l(1., 1.),
            l(1., 2.),
            l(1., 3.),
        ],
    );
}

#[test]
fn cross_entropy_and_its_label_check() {
    let src = "func @f(%x: f32[2,2], %y: i64[2]) -> (f32[]) {
  %l = softmax_cross_entropy %x, %y : f32[]
  return %l
}";
    let labels = |v: Vec<i64>| Tensor::from_data(&[2], Data::I64(v)).unwrap();
    let r = eval(src, vec![f32s(&[2, 2], &[0.; 4]), labels(vec![0, 1])]).unwrap();
    assert_close(&r[0], &[std::f64::consts::LN_2]);
    let e = eval(src, vec![f32s(&[2, 2], &[0.; 4]), labels(vec![0, 2])]).unwrap_err();
    assert!(
        e.ends_with("label 2 in row 1 is out of range for 2 classes"),
        "{e}"
    );
}

#[test]
fn batch_norm_both_forms() {
    // Channel 0 holds 1,3,5,7 (mean 4, biased variance 5); channel 1 holds 2,2,2,2.
    let src = "func @f(%x: f32[2,2,1,2], %g: f32[2], %b: f32[2]) -> (f32[2,2,1,2], f32[2], f32[2], f32[2,2,1,2]) {
  %y, %mean, %var = batch_norm_train %x, %g, %b {eps=0.0} : f32[2,2,1,2], f32[2], f32[2]
  %z = batch_norm %x, %g, %b, %mean, %var {eps=1.0} : f32[2,2,1,2]
  return %y, %mean, %var, %z
}";
    let x = f32s(&[2, 2, 1, 2], &[1., 3., 2., 2., 5., 7., 2., 2.]);
    let r = eval(src, vec![x, f32s(&[2], &[2., 1.]), f32s(&[2], &[0., 10.])]).unwrap();
    let s5 = 5f64.sqrt();
    let n = |v: f64| 2. * (v - 4.) / s5;
    // Channel 1 has zero variance and eps 0: 0/0 is NaN, as the formula says.
    let y = floats(&r[0]);
    assert_close(
        &f32s(&[4], &[y[0] as f32, y[1] as f32, y[4] as f32, y[5] as f32]),
        &[n(1.), n(3.), n(5.), n(7.)],
    );
    assert!(y[2].is_nan() && y[3].is_nan());
    assert_close(&r[1], &[4., 2.]);
    assert_close(&r[2], &[5., 0.]);
    let z = |v: f64| 2. * (v - 4.) / 6f64.sqrt();
    assert_close(&r[3], &[z(1.), z(3.), 10., 10., z(5.), z(7.), 10., 10.]);
}

#[test]
fn data_movement() {
    let src = "func @f(%x: f32[2,3]) -> (f32[3,2], f32[2,5], f32[2,2], f32[6]) {
  %t = transpose %x {perm=[1,0]} : f32[3,2]
  %s = slice %x {starts=[0,-1], ends=[2,-4], steps=[1,-2]} : f32[2,2]
  %h = slice %x {starts=[0,0], ends=[2,2]} : f32[2,2]
  %c = concat %x, %h {axis=1} : f32[2,5]
  %r = reshape %x {shape=[6]} : f32[6]
  return %t, %c, %s, %r
}";
    let r = eval(src, vec![f32s(&[2, 3], &[1., 2., 3., 4., 5., 6.])]).unwrap();
    assert_close(&r[0], &[1., 4., 2., 5., 3., 6.]);
    assert_close(&r[1], &[1., 2., 3., 1., 2., 4., 5., 6., 4., 5.]);
    assert_close(&r[2], &[3., 1., 6., 4.]);
    assert_close(&r[3], &[1., 2., 3., 4., 5., 6.]);
}

#[test]
fn gather_and_scatter_add() {
    let src = "func @f(%t: f32[3,2], %i: i64[4]) -> (f32[4,2], f32[3,2]) {
  %g = gather %t, %i {axis=0} : f32[4,2]
  %s = scatter_add %t, %i, %g {axis=0} : f32[3,2]
  return %g, %s
}";
    let t = f32s(&[3, 2], &[1., 2., 3., 4., 5., 6.]);
    let i = Tensor::from_data(&[4], Data::I64(vec![2, 0, -1, 2])).unwrap();
    let r = eval(src, vec![t.clone(), i]).unwrap();
    assert_close(&r[0], &[5., 6., 1., 2., 5., 6., 5., 6.]);
    // Row 2 is indexed three times (2, -1, 2): it accumulates three copies of itself.
    assert_close(&r[1], &[2., 4., 3., 4., 20., 24.]);
    let bad = Tensor::from_data(&[4], Data::I64(vec![0, 3, 0, 0])).unwrap();
    let e = eval(src, vec![t, bad]).unwrap_err();
    assert!(
        e.ends_with("index 3 is out of range for an axis of size 3"),
        "{e}"
    );
}

#[test]
fn select_and_constants() {
    let src = "func @f(%x: f32[4]) -> (f32[4]) {
  %z = const {value=0.0} : f32[]
  %alt = const {value=[10.0, 20.0, 30.0, 40.0]} : f32[4]
  %pos = gt %x, %z : bool[4]
  %y = select %pos, %x, %alt : f32[4]
  return %y
}";
    let r = eval(src, vec![f32s(&[4], &[1., -1., 2., -2.])]).unwrap();
    assert_close(&r[0], &[1., 20., 2., 40.]);
}

#[test]
fn inputs_are_checked_before_running() {
    let src = unary("neg %x", "f32[2,3]", "f32[2,3]");
    let e = eval(&src, vec![f32s(&[3, 2], &[0.; 6])]).unwrap_err();
    assert_eq!(
        e,
        "input for parameter %x of `@f`: expected f32[2,3], got f32[3,2]"
    );
    let e = eval(&src, vec![]).unwrap_err();
    assert_eq!(e, "`@f` takes 1 input(s), got 0");
}

#[test]
fn empty_tensors() {
    let src = "func @f(%x: f32[0,3]) -> (f32[0,3], f32[3], f32[0]) {
  %c = const {value=[]} : f32[0,3]
  %s = add %x, %c : f32[0,3]
  %r = reduce_sum %x {axes=[0]} : f32[3]
  %m = reduce_mean %x {axes=[1]} : f32[0]
  return %s, %r, %m
}";
    let r = eval(src, vec![f32s(&[0, 3], &[])]).unwrap();
    assert!(floats(&r[0]).is_empty());
    assert_close(&r[1], &[0., 0., 0.]);
    assert!(floats(&r[2]).is_empty());
}

/// A product over an empty inner dimension is +0.0, as a GEMM's accumulators start (and numpy
/// and PyTorch give), not the -0.0 that Rust's float `Sum` starts from: through `rsqrt` the
/// sign is the difference between +inf and -inf (found by the compiled-vs-interpreter
/// property).
#[test]
fn empty_products_are_positive_zero() {
    let src = "func @f(%a: f32[2,0], %b: f32[0,3]) -> (f32[2,3]) {
  %c = matmul %a, %b : f32[2,3]
  return %c
}";
    let out = eval(src, vec![f32s(&[2, 0], &[]), f32s(&[0, 3], &[])]).unwrap();
    let Data::F32(v) = out[0].data() else {
        panic!("f32 result")
    };
    assert!(v.iter().all(|x| x.to_bits() == 0), "{v:?}");
}

/// `quantize_linear` divides in f32, rounds half to even, adds the zero point and saturates
/// (NaN to the zero point); `dequantize_linear` inverts it on the levels; per-channel scales
/// broadcast; a scale that is not positive and finite is an error naming the op.
#[test]
fn quantize_and_dequantize_linear() {
    let src = "func @f(%x: f32[2,4]) -> (u8[2,4], i8[2,4], f32[2,4]) {
  %s = const {value=0.5} : f32[]
  %z = const {value=10} : u8[]
  %q = quantize_linear %x, %s, %z : u8[2,4]
  %cs = const {value=[1.0, 0.25]} : f32[2,1]
  %cz = const {value=[0, -3]} : i8[2,1]
  %qi = quantize_linear %x, %cs, %cz : i8[2,4]
  %d = dequantize_linear %qi, %cs, %cz : f32[2,4]
  return %q, %qi, %d
}";
    let x = [
        0.25,
        0.75,
        -1.25,
        200.0,
        f32::NAN,
        -3.0,
        2.6,
        f32::NEG_INFINITY,
    ];
    let r = eval(src, vec![f32s(&[2, 4], &x)]).unwrap();
    // x / 0.5 = 0.5, 1.5, -2.5, 400, NaN, -6, 5.2, -inf; halves to even: 0, 2, -2, ...
    assert_eq!(r[0].data(), &Data::U8(vec![10, 12, 8, 255, 10, 4, 15, 0]));
    // Row 0 / 1: 0.25 -> 0, 0.75 -> 1, -1.25 -> -1, 200 -> 127 (saturated); row 1 / 0.25 - 3:
    // NaN -> -3, -12 - 3 = -15, 10.4 -> 10 - 3 = 7, -inf -> -128.
    assert_eq!(
        r[1].data(),
        &Data::I8(vec![0, 1, -1, 127, -3, -15, 7, -128])
    );
    assert_close(&r[2], &[0.0, 1.0, -1.0, 127.0, 0.0, -3.0, 2.5, -31.25]);
    let bad = "func @f(%x: f32[2]) -> (u8[2]) {
  %s = const {value=[0.5, 0.0]} : f32[2]
  %z = const {value=[0, 0]} : u8[2]
  %q = quantize_linear %x, %s, %z : u8[2]
  return %q
}";
    let e = eval(bad, vec![f32s(&[2], &[1.0, 2.0])]).unwrap_err();
    assert!(
        e.contains("quantize_linear") && e.contains("positive"),
        "{e}"
    );
}

/// `matmul_integer` subtracts the zero points (per row of `a`, per column of `b`) before an
/// integer product, which may leave the 8-bit ranges; the result is i32.
#[test]
fn matmul_integer_subtracts_zero_points() {
    let src = "func @f(%a: u8[2,3], %b: i8[3,2]) -> (i32[2,2]) {
  %za = const {value=[1, 255]} : u8[2,1]
  %zb = const {value=[0, -128]} : i8[2]
  %y = matmul_integer %a, %b, %za, %zb : i32[2,2]
  return %y
}";
    let a = Tensor::new(
        tcc_ir::TensorType::new(tcc_ir::DType::U8, vec![2, 3]).unwrap(),
        Data::U8(vec![1, 2, 3, 0, 255, 10]),
    )
    .unwrap();
    let b = Tensor::new(
        tcc_ir::TensorType::new(tcc_ir::DType::I8, vec![3, 2]).unwrap(),
        Data::I8(vec![1, -128, 2, 127, -3, 0]),
    )
    .unwrap();
    let r = eval(src, vec![a, b]).unwrap();
    // a - za = [[0, 1, 2], [-255, 0, -245]]; b - zb = [[1, 0], [2, 255], [-3, 128]].
    // Row 0: [0 + 2 - 6, 0 + 255 + 256] = [-4, 511]; row 1: [-255 + 0 + 735, 0 + 0 - 31360].
    assert_eq!(r[0].data(), &Data::I32(vec![-4, 511, 480, -31360]));
}

/// `conv_integer` subtracts the zero points (the filter's per output channel) and pads with
/// the input's zero point, so that padding adds nothing.
#[test]
fn conv_integer_pads_with_the_zero_point() {
    let src = "func @f(%x: u8[1,1,2,2], %w: i8[2,1,2,2]) -> (i32[1,2,2,2]) {
  %xz = const {value=1} : u8[]
  %wz = const {value=[0, 2]} : i8[2,1,1,1]
  %y = conv_integer %x, %w, %xz, %wz {pads=[1,1,0,0]} : i32[1,2,2,2]
  return %y
}";
    let x = Tensor::new(
        tcc_ir::TensorType::new(tcc_ir::DType::U8, vec![1, 1, 2, 2]).unwrap(),
        Data::U8(vec![1, 2, 3, 4]),
    )
    .unwrap();
    let w = Tensor::new(
        tcc_ir::TensorType::new(tcc_ir::DType::I8, vec![2, 1, 2, 2]).unwrap(),
        Data::I8(vec![1, 0, 0, -1, 2, 2, 2, 2]),
    )
    .unwrap();
    let r = eval(src, vec![x, w]).unwrap();
    // x - xz = [[0, 1], [2, 3]] below and right of a padding row and column of zeros; filter 0
    // takes the top-left tap less the bottom-right one; filter 1 less its zero point is 0.
    assert_eq!(r[0].data(), &Data::I32(vec![0, -1, -2, -3, 0, 0, 0, 0]));
}

//! `qdq`: convolutions and products of dequantized operands on the integer ops, with results
//! equal (to rounding: the interpreter computes float ops in f64) to the float form on random
//! levels; and the forms it must leave in float.

use tcc_ir::random::{Rng, random_tensor};
use tcc_ir::{Data, Function, OpKind, Tensor, interp, parse_function, verify_function};
use tcc_passes::quant::qdq::qdq;

fn f64s(t: &Tensor) -> Vec<f64> {
    match t.data() {
        Data::F32(v) => v.iter().map(|&x| x as f64).collect(),
        Data::F64(v) => v.clone(),
        d => panic!("not floats: {:?}", d.dtype()),
    }
}

/// Rewrites `src`, checks the results against the original's on random inputs, and returns
/// how many ops were rewritten and the new function.
fn check(src: &str) -> (usize, Function) {
    let f = parse_function(src).unwrap_or_else(|d| panic!("{src}\n{d}"));
    let mut g = f.clone();
    let n = qdq(&mut g);
    verify_function(&g).unwrap_or_else(|d| panic!("{d}\n{g}"));
    let mut rng = Rng::new(11);
    for _ in 0..3 {
        let inputs: Vec<Tensor> = (f.params().iter())
            .map(|&p| random_tensor(f.ty(p), &mut rng))
            .collect();
        let want = interp::run(&f, &inputs).unwrap();
        let got = interp::run(&g, &inputs).unwrap();
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert_eq!(a.ty(), b.ty());
            let (a, b) = (f64s(a), f64s(b));
            let scale = b.iter().fold(0f64, |m, x| m.max(x.abs())).max(1e-30);
            let err = (a.iter().zip(&b))
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f64::max);
            assert!(
                err <= 1e-6 * scale,
                "result {i} differs by {err:e}\n{src}\n{g}"
            );
        }
    }
    (n, g)
}

fn count(f: &Function, is: impl Fn(&OpKind) -> bool) -> usize {
    f.schedule()
        .iter()
        .filter(|&&op| is(&f.op(op).kind))
        .count()
}

#[test]
fn grouped_strided_convolution_with_per_channel_filters() {
    let (n, g) = check(
        "func @f(%xq: u8[2,4,7,6], %wq: i8[6,2,3,3], %zw: i8[6,1,1,1]) -> (f32[2,6,3,2]) {
  %sx = const {value=0.03} : f32[]
  %zx = const {value=131} : u8[]
  %x = dequantize_linear %xq, %sx, %zx : f32[2,4,7,6]
  %sw = const {value=[0.5, 0.25, 0.125, 0.1, 0.2, 0.3]} : f32[6,1,1,1]
  %w = dequantize_linear %wq, %sw, %zw : f32[6,2,3,3]
  %y = conv2d %x, %w {strides=[2,2], pads=[1,0,0,0], groups=2} : f32[2,6,3,2]
  return %y
}",
    );
    assert_eq!(n, 1);
    assert_eq!(count(&g, |k| matches!(k, OpKind::ConvInteger(_))), 1);
    assert_eq!(count(&g, |k| matches!(k, OpKind::Conv2d(_))), 0);
}

#[test]
fn batched_products_per_column_and_gemm_transposes() {
    let (n, g) = check(
        "func @f(%aq: i8[3,4,5], %bq: u8[5,6], %zb: u8[6], %cq: u8[2,5]) -> (f32[3,4,6], f32[3,4,2]) {
  %sa = const {value=0.02} : f32[]
  %za = const {value=-3} : i8[]
  %a = dequantize_linear %aq, %sa, %za : f32[3,4,5]
  %sb = const {value=[1.0, 0.5, 0.25, 2.0, 4.0, 0.125]} : f32[6]
  %b = dequantize_linear %bq, %sb, %zb : f32[5,6]
  %p = matmul %a, %b : f32[3,4,6]
  %sc = const {value=0.5} : f32[]
  %zc = const {value=7} : u8[]
  %c = dequantize_linear %cq, %sc, %zc : f32[2,5]
  %ct = transpose %c {perm=[1,0]} : f32[5,2]
  %q = matmul %a, %ct : f32[3,4,2]
  return %p, %q
}",
    );
    assert_eq!(n, 2);
    assert_eq!(count(&g, |k| matches!(k, OpKind::MatMulInteger)), 2);
    assert_eq!(count(&g, |k| matches!(k, OpKind::MatMul)), 0);
}

/// Per-channel input zero points, per-row left scales and float operands stay in float (and
/// the results are unchanged).
#[test]
fn other_forms_stay_in_float() {
    let (n, g) = check(
        "func @f(%xq: u8[1,2,3,3], %x: f32[4,3], %mq: u8[4,3], %zr: u8[4,1], %wq: i8[2,2,2,2]) -> (f32[1,2,2,2], f32[4,2], f32[4,2]) {
  %sx = const {value=[0.5, 0.25]} : f32[2,1,1]
  %zx = const {value=[128, 120]} : u8[2,1,1]
  %xd = dequantize_linear %xq, %sx, %zx : f32[1,2,3,3]
  %sw = const {value=0.25} : f32[]
  %zw = const {value=0} : i8[]
  %w = dequantize_linear %wq, %sw, %zw : f32[2,2,2,2]
  %y = conv2d %xd, %w : f32[1,2,2,2]
  %gq = const {value=[1, 2, 3, 4, 5, 6]} : i8[3,2]
  %g = dequantize_linear %gq, %sw, %zw : f32[3,2]
  %p = matmul %x, %g : f32[4,2]
  %sr = const {value=[0.5, 0.25, 1.0, 2.0]} : f32[4,1]
  %m = dequantize_linear %mq, %sr, %zr : f32[4,3]
  %r = matmul %m, %g : f32[4,2]
  return %y, %p, %r
}",
    );
    assert_eq!(n, 0);
    assert_eq!(count(&g, |k| matches!(k, OpKind::Conv2d(_))), 1);
    assert_eq!(count(&g, |k| matches!(k, OpKind::MatMul)), 2);
}

/// A max pooling between a dequantization and a quantization with the same scale and zero
/// point (onnxruntime's QDQ form around a pool) runs on the levels, with exactly the levels the
/// float form gives, for scales of every magnitude down to 2^-100 and both level types; a
/// different scale at the two ends, or one below 2^-100, leaves it in float.
#[test]
fn max_pooling_between_equal_quantizations_runs_on_levels() {
    let pool = |s_in: &str, s_out: &str, dt: &str, z: &str| {
        format!(
            "func @f(%q: {dt}[2,3,9,9]) -> ({dt}[2,3,5,5]) {{
  %s = const {{value={s_in}}} : f32[]
  %t = const {{value={s_out}}} : f32[]
  %z = const {{value={z}}} : {dt}[]
  %x = dequantize_linear %q, %s, %z : f32[2,3,9,9]
  %m = max_pool2d %x {{kernel=[3,3], strides=[2,2], pads=[1,1,1,1]}} : f32[2,3,5,5]
  %y = quantize_linear %m, %t, %z : {dt}[2,3,5,5]
  return %y
}}"
        )
    };
    let pools = |g: &Function, dt: tcc_ir::DType| {
        (g.schedule().iter())
            .filter(|&&o| {
                matches!(g.op(o).kind, OpKind::MaxPool2d(_))
                    && g.ty(g.op(o).results[0]).dtype() == dt
            })
            .count()
    };
    for (dt, z, ty) in [
        ("u8", "3", tcc_ir::DType::U8),
        ("i8", "-7", tcc_ir::DType::I8),
    ] {
        for s in ["0.0375", "3.1e-5", "417.3", "7.888609e-31"] {
            let src = pool(s, s, dt, z);
            let f = parse_function(&src).unwrap();
            let mut g = f.clone();
            qdq(&mut g);
            verify_function(&g).unwrap_or_else(|d| panic!("{d}\n{g}"));
            assert_eq!(pools(&g, ty), 1, "{g}");
            assert_eq!(pools(&g, tcc_ir::DType::F32), 0, "{g}");
            assert_eq!(g.name(g.results()[0]), "y", "{g}");
            let mut rng = Rng::new(5);
            for _ in 0..4 {
                let q = random_tensor(f.ty(f.params()[0]), &mut rng);
                let inputs = [q];
                assert_eq!(
                    interp::run(&g, &inputs).unwrap(),
                    interp::run(&f, &inputs).unwrap(),
                    "scale {s}, {dt}"
                );
            }
        }
        // 2^-110: products of levels and the scale would be subnormal.
        for (s_in, s_out) in [("0.0375", "0.05"), ("7.7e-34", "7.7e-34")] {
            let mut g = parse_function(&pool(s_in, s_out, dt, z)).unwrap();
            qdq(&mut g);
            assert_eq!(pools(&g, tcc_ir::DType::F32), 1, "{g}");
        }
    }
}

/// A quantization of a max pooling of an integer product's requantizing chain (as `tcc
/// quantize` leaves a stem's pooling) moves before the pooling, which then runs on the levels
/// with exactly the levels the float form gives (quantizing is non-decreasing and the chain
/// holds no NaN); it stays in float where the pooling has another reader, where the pooled
/// value is not bounded (a parameter), or where the chain could overflow to infinity.
#[test]
fn max_pooling_of_a_requantizing_chain_runs_on_levels() {
    let pool = |scale: &str, extra: &str| {
        format!(
            "func @f(%x: u8[2,2,7,7], %v: f32[2,3,7,7]) -> (u8[2,3,4,4]{extra_ty}) {{
  %w = const {{value=[{w}]}} : i8[3,2,3,3]
  %xz = const {{value=3}} : u8[]
  %wz = const {{value=0}} : i8[]
  %y = conv_integer %x, %w, %xz, %wz {{pads=[1,1,1,1]}} : i32[2,3,7,7]
  %c = cast %y {{to=f32}} : f32[2,3,7,7]
  %s = const {{value=[{scale}, 0.02, 0.0375]}} : f32[3,1,1]
  %m = mul %c, %s : f32[2,3,7,7]
  %b = const {{value=[0.5, -0.25, 0.1]}} : f32[3,1,1]
  %a = add %m, %b : f32[2,3,7,7]
  %r = relu %a : f32[2,3,7,7]
  %p = max_pool2d %r {{kernel=[3,3], strides=[2,2], pads=[1,1,1,1]}} : f32[2,3,4,4]
  %qs = const {{value=0.0625}} : f32[]
  %qz = const {{value=9}} : u8[]
  %q = quantize_linear %p, %qs, %qz : u8[2,3,4,4]
  return %q{extra}
}}",
            w = (0..54)
                .map(|i| ((i * 37) % 255 - 127).to_string())
                .collect::<Vec<_>>()
                .join(", "),
            extra_ty = if extra.is_empty() {
                ""
            } else {
                ", f32[2,3,4,4]"
            },
        )
    };
    let levels = |g: &Function| {
        (g.schedule().iter())
            .filter(|&&o| {
                matches!(g.op(o).kind, OpKind::MaxPool2d(_))
                    && g.ty(g.op(o).results[0]).dtype() == tcc_ir::DType::U8
            })
            .count()
    };
    let f = parse_function(&pool("0.01", "")).unwrap();
    let mut g = f.clone();
    qdq(&mut g);
    verify_function(&g).unwrap_or_else(|d| panic!("{d}\n{g}"));
    assert_eq!(levels(&g), 1, "{g}");
    assert_eq!(g.name(g.results()[0]), "q", "{g}");
    let mut rng = Rng::new(9);
    for _ in 0..8 {
        let inputs: Vec<_> = (f.params().iter())
            .map(|&p| random_tensor(f.ty(p), &mut rng))
            .collect();
        assert_eq!(
            interp::run(&g, &inputs).unwrap(),
            interp::run(&f, &inputs).unwrap()
        );
    }
    // Another reader of the pooling; a pooled parameter; a scale that could overflow.
    for src in [
        pool("0.01", ", %p"),
        pool("0.01", "").replace("max_pool2d %r ", "max_pool2d %v "),
        pool("1e30", ""),
    ] {
        let mut g = parse_function(&src).unwrap();
        qdq(&mut g);
        assert_eq!(levels(&g), 0, "{g}");
    }
}

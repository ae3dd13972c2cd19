//! The requantizing chain's plain path (`plain.rs`) where the clamps bound every quotient but
//! at far more levels than the type holds (relu6 quantized with a small scale): no clamp to
//! +-1024 runs there, so the saturating narrowing alone must give the ends of the range;
//! exact against the interpreter on every integer target, u8 and i8 levels, the convolution
//! and the depthwise kernels.

use super::*;

#[test]
fn clamped_chains_saturate_at_many_levels() {
    for (yt, z) in [("u8", "3"), ("i8", "-3")] {
        for (c, groups) in [(5u64, 1u64), (7, 7)] {
            let cg = c / groups;
            let src = format!(
                "func @f(%x: u8[2,{c},6,37], %w: i8[7,{cg},3,3], %s: f32[1,7,1,1], %b: f32[1,7,1,1]) -> ({yt}[2,7,6,37]) {{
  %xz = const {{value=3}} : u8[]
  %wz = const {{value=0}} : i8[]
  %lo = const {{value=-6.0}} : f32[]
  %hi = const {{value=6.0}} : f32[]
  %qs = const {{value=0.001}} : f32[]
  %qz = const {{value={z}}} : {yt}[]
  %acc = conv_integer %x, %w, %xz, %wz {{pads=[1,1,1,1], groups={groups}}} : i32[2,7,6,37]
  %f = cast %acc {{to=f32}} : f32[2,7,6,37]
  %m = mul %f, %s : f32[2,7,6,37]
  %a = add %m, %b : f32[2,7,6,37]
  %l = max %a, %lo : f32[2,7,6,37]
  %h = min %l, %hi : f32[2,7,6,37]
  %q = quantize_linear %h, %qs, %qz : {yt}[2,7,6,37]
  return %q
}}"
            );
            let f = parse_function(&src).unwrap_or_else(|d| panic!("{src}\n{d}"));
            // Scales that take the sums (up to ~1e6) well past the clamps, and small biases.
            let scales: Vec<f32> = (0..7).map(|i| 2e-6 * (1 + i) as f32).collect();
            let biases: Vec<f32> = (0..7).map(|i| 0.3 * i as f32 - 1.0).collect();
            let inputs = vec![
                common::bytes(tcc_ir::DType::U8, &[2, c, 6, 37], None, 11),
                common::bytes(tcc_ir::DType::I8, &[7, cg, 3, 3], None, 12),
                Tensor::from_f32(&[1, 7, 1, 1], scales).unwrap(),
                Tensor::from_f32(&[1, 7, 1, 1], biases).unwrap(),
            ];
            let want = tcc_ir::interp::run(&f, &inputs).unwrap();
            // The case is one: both ends of the range are reached.
            let levels: Vec<i64> = (want[0].data().to_f64s().iter())
                .map(|&v| v as i64)
                .collect();
            let (low, top) = if yt == "u8" { (0, 255) } else { (-128, 127) };
            assert!(levels.contains(&low) && levels.contains(&top), "{src}");
            quantize::agrees_on_every_target(&f, &inputs, &src, quantize::no_reference_ops);
        }
    }
}

/// A residual add after the bias (a full f32 tensor: a parameter, or an earlier op's result;
/// two images, each reading its own part)
/// runs in the convolution's step on AVX-512 VNNI and AMX, the exact path storing with it
/// (it may hold NaN, infinities and negative zeros, which the chain keeps as the interpreter
/// does); one made after the convolution is not taken. Exact against the interpreter on
/// every integer target.
#[test]
fn residual_adds_in_the_chain() {
    // (the residual's definition, where it goes, the steps after the add, result type)
    let cases = [
        (
            "",
            "%res",
            "  %y = relu %r : f32[2,7,9,9]\n  %q = quantize_linear %y, %qs, %qz : u8[2,7,9,9]",
            "u8",
        ),
        ("", "%res", "  %q = relu %r : f32[2,7,9,9]", "f32"),
        (
            "  %res2 = mul %res, %k : f32[2,7,9,9]\n",
            "%res2",
            "  %q = quantize_linear %r, %qs, %qz : u8[2,7,9,9]",
            "u8",
        ),
    ];
    for (i, (before, res, after, yt)) in cases.into_iter().enumerate() {
        for late in [false, true] {
            if late && before.is_empty() {
                continue;
            }
            let (early, late_def) = if late { ("", before) } else { (before, "") };
            let src = format!(
                "func @f(%x: u8[2,5,9,9], %w: i8[7,5,3,3], %s: f32[1,7,1,1], %b: f32[1,7,1,1], %res: f32[2,7,9,9], %k: f32[]) -> ({yt}[2,7,9,9]) {{
  %xz = const {{value=3}} : u8[]
  %wz = const {{value=0}} : i8[]
  %qs = const {{value=0.05}} : f32[]
  %qz = const {{value=9}} : u8[]
{early}  %acc = conv_integer %x, %w, %xz, %wz {{pads=[1,1,1,1]}} : i32[2,7,9,9]
  %c = cast %acc {{to=f32}} : f32[2,7,9,9]
  %m = mul %c, %s : f32[2,7,9,9]
  %a = add %m, %b : f32[2,7,9,9]
{late_def}  %r = add {res}, %a : f32[2,7,9,9]
{after}
  return %q
}}"
            );
            let f = parse_function(&src).unwrap_or_else(|d| panic!("{src}\n{d}"));
            let mut residual: Vec<f32> = (0..2 * 7 * 81)
                .map(|j| (j % 23) as f32 * 0.37 - 4.0)
                .collect();
            residual[..6].copy_from_slice(&[
                f32::NAN,
                f32::INFINITY,
                f32::NEG_INFINITY,
                -0.0,
                1e30,
                -1e30,
            ]);
            let inputs = vec![
                common::bytes(tcc_ir::DType::U8, &[2, 5, 9, 9], None, 21 + i as u64),
                common::bytes(tcc_ir::DType::I8, &[7, 5, 3, 3], None, 22),
                Tensor::from_f32(
                    &[1, 7, 1, 1],
                    (0..7).map(|j| 1e-4 * (1 + j) as f32).collect::<Vec<f32>>(),
                )
                .unwrap(),
                Tensor::from_f32(
                    &[1, 7, 1, 1],
                    (0..7).map(|j| 0.25 * j as f32 - 1.0).collect::<Vec<f32>>(),
                )
                .unwrap(),
                Tensor::from_f32(&[2, 7, 9, 9], residual).unwrap(),
                Tensor::from_f32(&[], vec![-1.5]).unwrap(),
            ];
            quantize::agrees_on_every_target(&f, &inputs, &src, quantize::no_reference_ops);
            // On VNNI the chain and its residual are the convolution's step, unless the
            // residual comes after it.
            let vnni = tcc_codegen::Features::of(None).unwrap();
            if vnni.avx512f && vnni.vnni && std::is_x86_feature_detected!("avx512vnni") {
                let exe = common::compile(&f, common::TARGETS[0], true);
                let steps = exe.stats();
                let earlier = usize::from(!before.is_empty() && !late);
                // Not taken: the convolution, the chain with the residual's op (compiled), the
                // quantization.
                let want = if late { 3 } else { 1 + earlier };
                assert_eq!(steps.compiled + steps.native, want, "{src}\n{steps:?}");
            }
        }
    }
}

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

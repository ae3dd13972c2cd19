//! Integer kernels with forms of their own on AVX2 without VNNI (`host,-avx512f` in
//! `integer_targets`), exact against the interpreter on every target:
//! - `conv_integer` with filters whose taps fit in 7 bits (`-64..=63` as i8, `64..=191` as u8,
//!   what `tcc quantize --reduce-range` makes), on `vpmaddubsw`, with the taps at both ends of
//!   the range against the largest image bytes, where a pair of products comes closest to
//!   saturating 16 bits;
//! - `matmul_integer` with A of at most 4 rows (a dense layer at batch 1), B not packed.

use super::*;
use tcc_ir::DType::{I8, U8};

/// A filter of `dt` whose taps shifted to i8 (u8 less 128) lie in `-64..=63`: random, or all
/// `fill` (a shifted tap).
fn narrow(dt: tcc_ir::DType, dims: &[u64], fill: Option<i64>, seed: u64) -> Tensor {
    let mut rng = Rng::new(seed);
    let n: u64 = dims.iter().product();
    let mut tap = || fill.unwrap_or_else(|| rng.below(128) as i64 - 64);
    let data = if dt == I8 {
        Data::I8((0..n).map(|_| tap() as i8).collect())
    } else {
        Data::U8((0..n).map(|_| (tap() + 128) as u8).collect())
    };
    Tensor::new(tcc_ir::TensorType::new(dt, dims.to_vec()).unwrap(), data).unwrap()
}

#[test]
fn integer_convolutions_with_narrow_filters() {
    // (input dims, filter dims, attributes, output dims, per-channel filter zero points):
    // padded 3x3 with blocks across rows and a short last block, a pointwise layer read as its
    // image (17 taps: a short last step), strides and groups, a stem.
    let shapes = [
        (
            [2, 5, 7, 7],
            [9, 5, 3, 3],
            "pads=[1,1,1,1]",
            [2, 9, 7, 7],
            true,
        ),
        ([1, 17, 6, 11], [6, 17, 1, 1], "", [1, 6, 6, 11], false),
        (
            [1, 4, 9, 8],
            [6, 2, 3, 2],
            "strides=[2,1], pads=[1,0,2,1], dilations=[2,2], groups=2",
            [1, 6, 4, 7],
            true,
        ),
        (
            [1, 3, 9, 70],
            [6, 3, 7, 7],
            "strides=[2,2], pads=[3,3,3,3]",
            [1, 6, 5, 35],
            false,
        ),
    ];
    for (ta, tb) in [(U8, I8), (I8, U8), (U8, U8), (I8, I8)] {
        for &(xd, wd, attrs, yd, per_channel) in &shapes {
            let (f, src, wz) =
                quantize::conv_integer_of((ta, tb), (xd, wd, yd), attrs, per_channel);
            let top = if ta == U8 { 255 } else { 127 };
            // The filter's zero point 0 once shifted (no per-pixel term), else random.
            let centered = Some(if tb == U8 { 128 } else { 0 });
            // Random taps; then the image at its top against every tap at -64, and at 63.
            let cases = [
                (None, None, None),
                (None, None, centered),
                (Some(top), Some(-64), None),
                (Some(top), Some(63), centered),
            ];
            for (i, (x, w, z)) in cases.into_iter().enumerate() {
                let seed = 10 * i as u64;
                let inputs = vec![
                    common::bytes(ta, &xd, x, 50 + seed),
                    narrow(tb, &wd, w, 60 + seed),
                    common::bytes(ta, &[], None, 70 + seed),
                    common::bytes(tb, &wz, z, 80 + seed),
                ];
                let what = format!("{src}\nimage {x:?}, taps {w:?}, filter zero {z:?}");
                quantize::agrees_on_every_target(&f, &inputs, &what, quantize::no_reference_ops);
            }
        }
    }
}

/// The same through the requantizing chain (relu6-like clamps, u8 levels; and a chain whose
/// bias makes NaN, which takes the row path): every lane of a block stored, short blocks too.
#[test]
fn narrow_filters_with_their_requantization() {
    for (bias, per_channel) in [("0.25", true), ("-inf", false)] {
        let (s, sd): (&str, Vec<u64>) = if per_channel {
            ("[1,6,1,1]", vec![1, 6, 1, 1])
        } else {
            ("[]", vec![])
        };
        let src = format!(
            "func @f(%x: u8[2,5,6,19], %w: i8[6,5,3,3], %s: f32{s}) -> (u8[2,6,6,19]) {{
  %xz = const {{value=7}} : u8[]
  %wz = const {{value=0}} : i8[]
  %acc = conv_integer %x, %w, %xz, %wz {{pads=[1,1,1,1]}} : i32[2,6,6,19]
  %c = cast %acc {{to=f32}} : f32[2,6,6,19]
  %m = mul %c, %s : f32[2,6,6,19]
  %b = const {{value={bias}}} : f32[]
  %a = add %m, %b : f32[2,6,6,19]
  %lo = const {{value=0.0}} : f32[]
  %hi = const {{value=6.0}} : f32[]
  %r = max %a, %lo : f32[2,6,6,19]
  %r6 = min %r, %hi : f32[2,6,6,19]
  %qs = const {{value=0.0235}} : f32[]
  %qz = const {{value=0}} : u8[]
  %q = quantize_linear %r6, %qs, %qz : u8[2,6,6,19]
  return %q
}}"
        );
        let f = parse_function(&src).unwrap_or_else(|d| panic!("{src}\n{d}"));
        let mut rng = Rng::new(3);
        let n: u64 = sd.iter().product();
        let scales: Vec<f32> = (0..n.max(1))
            .map(|_| 1e-3 + rng.below(1000) as f32 * 1e-5)
            .collect();
        let inputs = vec![
            common::bytes(U8, &[2, 5, 6, 19], None, 1),
            narrow(I8, &[6, 5, 3, 3], None, 2),
            Tensor::from_f32(&sd, scales).unwrap(),
        ];
        quantize::agrees_on_every_target(&f, &inputs, &src, |_| {});
    }
}

/// Products of A with at most 4 rows: odd `k` (a last pair half padding), whole 16-column
/// chunks and a tail, zero points per row and column, random and extreme bytes, and one big
/// enough (1 x 1280 x 1000, mobilenet_v2's classifier) to split its chunks across the pool.
#[test]
fn short_integer_products() {
    let name = |dt| if dt == U8 { "u8" } else { "i8" };
    for (ta, tb) in [(U8, I8), (I8, U8), (U8, U8), (I8, I8)] {
        for (m, k, n) in [(1u64, 7u64, 37u64), (3, 300, 48), (4, 33, 21)] {
            let src = format!(
                "func @f(%a: {a}[{m},{k}], %b: {b}[{k},{n}], %za: {a}[{m},1], %zb: {b}[{n}]) -> (i32[{m},{n}]) {{
  %y = matmul_integer %a, %b, %za, %zb : i32[{m},{n}]
  return %y
}}",
                a = name(ta),
                b = name(tb)
            );
            let f = parse_function(&src).unwrap();
            let (top_a, low_b) = (
                if ta == U8 { 255 } else { 127 },
                if tb == U8 { 0 } else { -128 },
            );
            let (low_a, top_b) = (
                if ta == U8 { 0 } else { -128 },
                if tb == U8 { 255 } else { 127 },
            );
            for (i, extreme) in [false, true].into_iter().enumerate() {
                let pick = |v: i64| extreme.then_some(v);
                let seed = 10 * i as u64;
                let inputs = vec![
                    common::bytes(ta, &[m, k], pick(top_a), 1 + seed),
                    common::bytes(tb, &[k, n], pick(low_b), 2 + seed),
                    common::bytes(ta, &[m, 1], pick(low_a), 3 + seed),
                    common::bytes(tb, &[n], pick(top_b), 4 + seed),
                ];
                let what = format!("{src}\nextremes {extreme}");
                quantize::agrees_on_every_target(&f, &inputs, &what, quantize::no_reference_ops);
            }
        }
    }
    let src = "func @f(%a: u8[1,1280], %b: i8[1280,1000], %za: u8[], %zb: i8[]) -> (i32[1,1000]) {
  %y = matmul_integer %a, %b, %za, %zb : i32[1,1000]
  return %y
}";
    let f = parse_function(src).unwrap();
    let inputs: Vec<Tensor> = (f.params().iter().enumerate())
        .map(|(i, &p)| common::bytes(f.ty(p).dtype(), f.ty(p).dims(), None, 7 + i as u64))
        .collect();
    quantize::agrees_on_every_target(&f, &inputs, src, quantize::no_reference_ops);
}

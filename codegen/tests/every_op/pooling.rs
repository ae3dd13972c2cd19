//! Pooling and normalisation, and max pooling's NaN and tie rules on every path.

use super::case;
use tcc_codegen::Executable;
use tcc_ir::{Data, Tensor, parse_function};

#[test]
fn pooling_and_normalisation() {
    case(
        "%x: f32[2,3,7,6]",
        "  %out = max_pool2d %x {kernel=[3,2], strides=[2,2], pads=[1,0,1,1]} : f32[2,3,4,3]",
        "f32[2,3,4,3]",
        18,
    );
    case(
        "%x: f32[2,3,7,6]",
        "  %out = avg_pool2d %x {kernel=[3,3], pads=[1,1,1,1]} : f32[2,3,7,6]",
        "f32[2,3,7,6]",
        19,
    );
    case(
        "%x: f32[2,3,7,6]",
        "  %out = avg_pool2d %x {kernel=[2,2], strides=[2,2], pads=[1,1,1,1], count_include_pad=true} : f32[2,3,4,4]",
        "f32[2,3,4,4]",
        20,
    );
    case(
        "%x: f32[2,3,5,5]",
        "  %out = global_avg_pool %x : f32[2,3,1,1]",
        "f32[2,3,1,1]",
        21,
    );
    case(
        "%x: f32[4,3,5], %g: f32[3], %b: f32[3], %m: f32[3], %v: f32[3]",
        "  %va = abs %v : f32[3]\n  %out = batch_norm %x, %g, %b, %m, %va {eps=0.01} : f32[4,3,5]",
        "f32[4,3,5]",
        22,
    );
    case(
        "%x: f32[4,3,5], %g: f32[3], %b: f32[3]",
        "  %out, %mean, %var = batch_norm_train %x, %g, %b : f32[4,3,5], f32[3], f32[3]",
        "f32[4,3,5]",
        23,
    );
}

/// Max pooling over channel blocks: NaN wins its window in every lane it is in, on the AVX2
/// kernel (f32 blocks of eight) and the lane-by-lane one (blocks of four).
#[test]
fn blocked_max_pooling_with_nan() {
    for b in [8usize, 4] {
        let src = format!(
            "func @f(%x: f32[1,1,3,3,{b}]) -> (f32[1,1,2,2,{b}]) {{\n  %y = max_pool2d %x {{kernel=[2,2], strides=[1,1]}} : f32[1,1,2,2,{b}]\n  return %y\n}}"
        );
        let f = parse_function(&src).unwrap();
        let mut v: Vec<f32> = (0..9 * b).map(|i| ((i * 5) % 7) as f32 - 3.0).collect();
        // Lane 1 of pixel (1,1) (in every window) and lane 0 of pixel (0,0) (in the first).
        v[4 * b + 1] = f32::NAN;
        v[0] = f32::NAN;
        let x = Tensor::from_f32(&[1, 1, 3, 3, b as u64], v).unwrap();
        let want = tcc_ir::interp::run(&f, std::slice::from_ref(&x)).unwrap();
        let got = Executable::compile(&f).unwrap().run(&[x]).unwrap();
        let (Data::F32(g), Data::F32(w)) = (got[0].data(), want[0].data()) else {
            unreachable!()
        };
        assert!(
            g.iter()
                .zip(w)
                .all(|(a, b)| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())),
            "block {b}: {g:?} vs {w:?}"
        );
        assert!(g[0].is_nan() && !g[b].is_nan() && (0..4).all(|p| g[p * b + 1].is_nan()));
    }
}

#[test]
fn max_pooling_with_nan_and_ties() {
    // One plane holds a NaN (it wins its window, and its gradient goes there); another has ties
    // (the first maximum gets the gradient). The tiled fast paths take the exact route.
    let src = "func @f(%x: f32[1,2,2,4], %dy: f32[1,2,1,2]) -> (f32[1,2,1,2], f32[1,2,2,4]) {\n  %p = max_pool2d %x {kernel=[2,2], strides=[2,2]} : f32[1,2,1,2]\n  %g = max_pool2d_grad %x, %dy {kernel=[2,2], strides=[2,2]} : f32[1,2,2,4]\n  return %p, %g\n}";
    let f = parse_function(src).unwrap();
    let x = Tensor::from_f32(
        &[1, 2, 2, 4],
        vec![
            1.0,
            f32::NAN,
            3.0,
            3.0,
            2.0,
            5.0,
            3.0,
            1.0, // plane 0: NaN wins window 0
            4.0,
            4.0,
            0.0,
            -1.0,
            4.0,
            2.0,
            -1.0,
            -1.0, // plane 1: ties
        ],
    )
    .unwrap();
    let dy = Tensor::from_f32(&[1, 2, 1, 2], vec![10.0, 20.0, 30.0, 40.0]).unwrap();
    let want = tcc_ir::interp::run(&f, &[x.clone(), dy.clone()]).unwrap();
    let got = Executable::compile(&f).unwrap().run(&[x, dy]).unwrap();
    for (g, w) in got.iter().zip(&want) {
        let (Data::F32(g), Data::F32(w)) = (g.data(), w.data()) else {
            unreachable!()
        };
        assert!(
            g.iter()
                .zip(w)
                .all(|(a, b)| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())),
            "{g:?} vs {w:?}"
        );
    }
    let Data::F32(g) = got[1].data() else {
        unreachable!()
    };
    assert_eq!(g[1], 10.0, "the NaN takes window 0's gradient");
    assert_eq!(
        g[8], 30.0,
        "the first of the tied 4.0s takes window 0's gradient"
    );
}

#[test]
fn overlapping_max_pooling_with_nan() {
    // Padded, strided, overlapping windows (the row-wise path): a plane with a NaN takes the
    // exact window-by-window path, where NaN wins; the plane without one is row by row.
    let src = "func @f(%x: f32[1,2,5,6]) -> (f32[1,2,3,3]) {\n  %p = max_pool2d %x {kernel=[3,3], strides=[2,2], pads=[1,1,1,0]} : f32[1,2,3,3]\n  return %p\n}";
    let f = parse_function(src).unwrap();
    let mut v: Vec<f32> = (0..60)
        .map(|i| ((i * 7 % 23) as f32 - 11.0) / 4.0)
        .collect();
    v[8] = f32::NAN;
    let x = Tensor::from_f32(&[1, 2, 5, 6], v).unwrap();
    let want = tcc_ir::interp::run(&f, std::slice::from_ref(&x)).unwrap();
    let got = Executable::compile(&f).unwrap().run(&[x]).unwrap();
    let (Data::F32(g), Data::F32(w)) = (got[0].data(), want[0].data()) else {
        unreachable!()
    };
    assert!(
        g[..9].iter().any(|a| a.is_nan()),
        "the NaN wins its windows: {g:?}"
    );
    assert!(
        g.iter()
            .zip(w)
            .all(|(a, b)| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())),
        "{g:?} vs {w:?}"
    );
}

//! The tiled GEMM: matmuls, convolutions and the convolution gradients.

use super::*;
use tcc_codegen::ptx::GemmTiles;

/// The backend with each GEMM tiling forced, so that both run on small problems.
fn tilings() -> [Ptx; 2] {
    [GemmTiles::Small, GemmTiles::Large].map(|tiles| Ptx {
        tiles,
        ..Ptx::default()
    })
}

/// Matmuls of every edge case against the interpreter, with either tiling: tiles cut by the
/// matrix's edges, several tiles, batches, broadcast batches, B copied 16 bytes at a time
/// (`n` a multiple of 4) or element by element, transposes the plan folds (read with swapped
/// strides; a transposed A with `m` a multiple of 4 copies 16 bytes at a time), and the fused
/// epilogue (a bias, relu, a residual).
#[test]
fn matmuls_match() {
    for ptx in tilings() {
        matmuls_match_on(&ptx);
    }
}

fn matmuls_match_on(ptx: &Ptx) {
    let tiles = ptx.tiles;
    let cases = [
        ("f32[7,13]", "f32[13,9]", "f32[7,9]"),
        ("f32[64,64]", "f32[64,64]", "f32[64,64]"),
        ("f32[130,70]", "f32[70,65]", "f32[130,65]"),
        ("f32[131,17]", "f32[17,132]", "f32[131,132]"),
        ("f32[1,300]", "f32[300,3]", "f32[1,3]"),
        ("f32[2,3,5,8]", "f32[8,6]", "f32[2,3,5,6]"),
        ("f32[3,1,5,8]", "f32[4,8,6]", "f32[3,4,5,6]"),
        ("f32[2,9,12]", "f32[12,20]", "f32[2,9,20]"),
    ];
    for (i, (x, w, y)) in cases.iter().enumerate() {
        let n = y.trim_end_matches(']').rsplit(',').next().unwrap();
        let src = format!(
            "func @f(%x: {x}, %w: {w}, %b: f32[{n}], %res: {y}) -> ({y}) {{
  %m = matmul %x, %w : {y}
  %a = add %m, %b : {y}
  %r = relu %a : {y}
  %o = add %r, %res : {y}
  return %o
}}"
        );
        let f = parse_function(&src).unwrap();
        let inputs = randoms(&f, 40 + i as u64);
        one_kernel_agrees(ptx, &f, &inputs, 1e-5, 1e-5)
            .unwrap_or_else(|e| panic!("{tiles:?}: {x} @ {w}: {e}"));
    }
    // Transposes only matmuls read: folded, read from their sources with swapped strides (A's
    // 16 bytes at a time where m is a multiple of 4).
    for m in [70, 68] {
        let f = parse_function(&format!(
            "func @f(%xt: f32[13,{m}], %w: f32[65,13]) -> (f32[{m},65]) {{
  %x = transpose %xt {{perm=[1,0]}} : f32[{m},13]
  %wt = transpose %w {{perm=[1,0]}} : f32[13,65]
  %y = matmul %x, %wt : f32[{m},65]
  return %y
}}"
        ))
        .unwrap();
        let inputs = randoms(&f, 3);
        one_kernel_agrees(ptx, &f, &inputs, 1e-5, 1e-5)
            .unwrap_or_else(|e| panic!("{tiles:?}: both transposes folded, m {m}: {e}"));
    }
    // Infinities in the last column of A and the last row of B (k = 13, a slice of 8 runs
    // past it): the slice's tail must add zeros, not an infinity times 0.
    let f = parse_function(
        "func @f(%x: f32[9,13], %w: f32[13,10]) -> (f32[9,10]) {
  %y = matmul %x, %w : f32[9,10]
  return %y
}",
    )
    .unwrap();
    let mut inputs = randoms(&f, 5);
    for (t, stride, len) in [(0, 13, 9), (1, 1, 10)] {
        let mut v = inputs[t].as_f32().unwrap().to_vec();
        for e in 0..len {
            // A's column 12, B's row 12.
            let at = if t == 0 { e * stride + 12 } else { 12 * 10 + e };
            v[at] = f32::INFINITY;
        }
        inputs[t] = Tensor::from_f32(inputs[t].dims(), v).unwrap();
    }
    against_interpreter_on(ptx, &f, &inputs, 1e-5, 1e-5)
        .unwrap_or_else(|e| panic!("{tiles:?}: {e}"));
    // An epilogue with a comparison, whose mask selects.
    let f = parse_function(
        "func @f(%x: f32[9,13], %w: f32[13,10]) -> (f32[9,10]) {
  %y = matmul %x, %w : f32[9,10]
  %c = const {value=0.5} : f32[]
  %m = lt %y, %c : bool[9,10]
  %s = select %m, %y, %c : f32[9,10]
  return %s
}",
    )
    .unwrap();
    let inputs = randoms(&f, 6);
    one_kernel_agrees(ptx, &f, &inputs, 1e-5, 1e-6)
        .unwrap_or_else(|e| panic!("{tiles:?}: a masked epilogue: {e}"));
    // A product stored as well as its epilogue's result.
    let f = parse_function(
        "func @f(%x: f32[5,4], %w: f32[4,3]) -> (f32[5,3], f32[5,3]) {
  %y = matmul %x, %w : f32[5,3]
  %t = tanh %y : f32[5,3]
  return %y, %t
}",
    )
    .unwrap();
    let inputs = randoms(&f, 4);
    against_interpreter_on(ptx, &f, &inputs, 1e-5, 1e-6)
        .unwrap_or_else(|e| panic!("{tiles:?}: {e}"));
}

/// Convolutions as implicit GEMMs against the interpreter, with either tiling: padding (asymmetric too), strides,
/// dilation, groups, depthwise, 1x1, a batch, and the fused epilogue (a per-channel bias and
/// relu).
#[test]
fn convolutions_match() {
    let cases = [
        (
            "f32[1,3,8,8]",
            "f32[4,3,3,3]",
            "{pads=[1,1,1,1]}",
            "f32[1,4,8,8]",
        ),
        (
            "f32[2,4,9,9]",
            "f32[6,2,3,3]",
            "{strides=[2,2], pads=[1,1,1,1], groups=2}",
            "f32[2,6,5,5]",
        ),
        (
            "f32[1,5,10,10]",
            "f32[5,1,3,3]",
            "{pads=[1,1,1,1], groups=5}",
            "f32[1,5,10,10]",
        ),
        (
            "f32[1,3,11,9]",
            "f32[2,3,3,3]",
            "{dilations=[2,2], pads=[2,1,0,3]}",
            "f32[1,2,9,9]",
        ),
        ("f32[2,70,5,5]", "f32[65,70,1,1]", "", "f32[2,65,5,5]"),
        (
            "f32[1,2,7,7]",
            "f32[3,2,5,5]",
            "{strides=[3,2]}",
            "f32[1,3,1,2]",
        ),
    ];
    for (i, (x, w, attrs, y)) in cases.iter().enumerate() {
        let oc = w.trim_start_matches("f32[").split(',').next().unwrap();
        let src = format!(
            "func @f(%x: {x}, %w: {w}, %b: f32[{oc},1,1]) -> ({y}) {{
  %c = conv2d %x, %w {attrs} : {y}
  %a = add %c, %b : {y}
  %r = relu %a : {y}
  return %r
}}"
        );
        let f = parse_function(&src).unwrap_or_else(|e| panic!("{src}\n{e:?}"));
        let inputs = randoms(&f, 60 + i as u64);
        for ptx in tilings() {
            one_kernel_agrees(&ptx, &f, &inputs, 1e-5, 1e-5)
                .unwrap_or_else(|e| panic!("{:?}: {x} * {w} {attrs}: {e}", ptx.tiles));
        }
    }
}

/// Products with too few output tiles to fill the device split `k` into pieces: two launches
/// (the pieces' partial matrices into the kernel's scratch, then `_sum` adding them in order
/// and running the epilogue), agreeing with the interpreter under either tiling: a matmul
/// whose last piece is shorter (k 300 in pieces of 80), batched, a convolution with its bias,
/// relu and a residual, a grouped one. A product with tiles enough (256 of 128x128) stays one
/// launch.
#[test]
fn small_products_split_k() {
    let cases = [
        (
            "func @f(%x: f32[2,4,300], %w: f32[300,5], %b: f32[5]) -> (f32[2,4,5]) {
  %m = matmul %x, %w : f32[2,4,5]
  %a = add %m, %b : f32[2,4,5]
  return %a
}",
            4 * 2 * 4 * 5,
        ),
        (
            "func @f(%x: f32[1,64,7,7], %w: f32[128,64,3,3], %b: f32[128,1,1], %res: f32[1,128,7,7]) -> (f32[1,128,7,7]) {
  %c = conv2d %x, %w {pads=[1,1,1,1]} : f32[1,128,7,7]
  %a = add %c, %b : f32[1,128,7,7]
  %r = relu %a : f32[1,128,7,7]
  %o = add %r, %res : f32[1,128,7,7]
  return %o
}",
            9 * 128 * 49,
        ),
        (
            "func @f(%x: f32[1,128,4,4], %w: f32[64,64,3,3]) -> (f32[1,64,2,2]) {
  %c = conv2d %x, %w {strides=[2,2], pads=[1,1,1,1], groups=2} : f32[1,64,2,2]
  return %c
}",
            9 * 2 * 32 * 4,
        ),
    ];
    for (i, (src, partials)) in cases.iter().enumerate() {
        let f = parse_function(src).unwrap();
        let inputs = randoms(&f, 80 + i as u64);
        for ptx in tilings() {
            let m = compiled(&ptx, &f);
            let text = m.manifest();
            assert_eq!(m.launches.len(), 2, "{text}");
            assert!(m.kernels[1].name.ends_with("_sum"), "{text}");
            assert!(m.launches.iter().all(|l| l.scratch.is_some()), "{text}");
            let scratch = (m.memory().slots.iter())
                .find(|s| s.scratch_for.is_some())
                .map(|s| s.size);
            assert_eq!(scratch, Some(4 * partials), "{:?}: {text}", ptx.tiles);
            one_kernel_agrees(&ptx, &f, &inputs, 1e-5, 1e-5)
                .unwrap_or_else(|e| panic!("{:?}: {src}: {e}", ptx.tiles));
        }
    }
    let f = parse_function(
        "func @f(%a: f32[2048,256], %b: f32[256,2048]) -> (f32[2048,2048]) {
  %c = matmul %a, %b : f32[2048,2048]
  return %c
}",
    )
    .unwrap();
    let m = compiled(&Ptx::default(), &f);
    assert_eq!(m.launches.len(), 1, "{}", m.manifest());
}

/// The convolution gradients as implicit GEMMs against the interpreter, with either tiling:
/// with respect to the
/// filter and to the input, over padding, strides (positions the stride skips get nothing),
/// dilation, groups and depthwise filters.
#[test]
fn convolution_gradients_match() {
    let cases = [
        (
            "f32[1,3,8,8]",
            "f32[4,3,3,3]",
            "pads=[1,1,1,1]",
            "f32[1,4,8,8]",
        ),
        (
            "f32[2,4,9,9]",
            "f32[6,2,3,3]",
            "strides=[2,2], pads=[1,1,1,1], groups=2",
            "f32[2,6,5,5]",
        ),
        (
            "f32[1,5,10,10]",
            "f32[5,1,3,3]",
            "pads=[1,1,1,1], groups=5",
            "f32[1,5,10,10]",
        ),
        (
            "f32[1,3,11,9]",
            "f32[2,3,3,3]",
            "dilations=[2,2], pads=[2,1,0,3]",
            "f32[1,2,9,9]",
        ),
        (
            "f32[1,2,7,7]",
            "f32[3,2,5,5]",
            "strides=[3,2]",
            "f32[1,3,1,2]",
        ),
    ];
    for (i, (x, w, attrs, y)) in cases.iter().enumerate() {
        let dims = |t: &str| {
            t.trim_start_matches("f32[")
                .trim_end_matches(']')
                .to_string()
        };
        let src = format!(
            "func @f(%x: {x}, %w: {w}, %dy: {y}) -> ({x}, {w}) {{
  %dx = conv2d_grad_input %dy, %w {{{attrs}, shape=[{}]}} : {x}
  %dw = conv2d_grad_filter %x, %dy {{{attrs}, shape=[{}]}} : {w}
  return %dx, %dw
}}",
            dims(x),
            dims(w)
        );
        let f = parse_function(&src).unwrap_or_else(|e| panic!("{src}\n{e:?}"));
        let inputs = randoms(&f, 70 + i as u64);
        for ptx in tilings() {
            against_interpreter_on(&ptx, &f, &inputs, 1e-5, 1e-5)
                .unwrap_or_else(|e| panic!("{:?}: {x} * {w} {attrs}: {e}", ptx.tiles));
        }
    }
}

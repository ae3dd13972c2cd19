//! `fold-bn` on every pattern it folds and the ones it must leave: results within 1e-5
//! (relative to each result's largest element) of the unfolded function in the reference
//! interpreter, on random inputs, and no batch norm left where a foldable layer feeds it.

use tcc_ir::random::{Rng, random_tensor};
use tcc_ir::{Data, Function, OpKind, Tensor, interp, parse_function, verify_function};
use tcc_passes::quant::{FoldStats, fold_bn};

fn f64s(t: &Tensor) -> Vec<f64> {
    match t.data() {
        Data::F32(v) => v.iter().map(|&x| x as f64).collect(),
        Data::F64(v) => v.clone(),
        d => panic!("not floats: {:?}", d.dtype()),
    }
}

/// Folds `src`, checks the results against the original's, and returns what was folded and
/// how many batch norms remain.
fn check(src: &str) -> (FoldStats, usize, Function) {
    let f = parse_function(src).unwrap_or_else(|d| panic!("{src}\n{d}"));
    let mut g = f.clone();
    let stats = fold_bn(&mut g);
    verify_function(&g).unwrap_or_else(|d| panic!("{d}\n{g}"));
    let mut rng = Rng::new(5);
    let inputs: Vec<Tensor> = (f.params().iter())
        .map(|&p| {
            let t = random_tensor(f.ty(p), &mut rng);
            // Variances must be positive: parameters named `v` get |x| + 0.5.
            if f.name(p).starts_with('v') {
                let d = match t.data() {
                    Data::F32(v) => Data::F32(v.iter().map(|x| x.abs() + 0.5).collect()),
                    Data::F64(v) => Data::F64(v.iter().map(|x| x.abs() + 0.5).collect()),
                    d => d.clone(),
                };
                Tensor::new(t.ty().clone(), d).unwrap()
            } else {
                t
            }
        })
        .collect();
    let want = interp::run(&f, &inputs).unwrap();
    let got = interp::run(&g, &inputs).unwrap();
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        assert_eq!(a.ty(), b.ty());
        let (a, b) = (f64s(a), f64s(b));
        let scale = b.iter().fold(0f64, |m, x| m.max(x.abs())).max(1e-30);
        let err = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f64::max);
        assert!(
            err <= 1e-5 * scale,
            "result {i} differs by {err:e} (largest {scale:e})\n{src}\n{g}"
        );
    }
    let left = (g.schedule().iter())
        .filter(|&&op| matches!(g.op(op).kind, OpKind::BatchNorm { .. }))
        .count();
    (stats, left, g)
}

const STATS: &str = "  %g = const {value=[0.5, 1.5, -2.0, 0.75]} : f32[4]
  %b = const {value=[0.1, -0.2, 0.3, 0.0]} : f32[4]
  %m = const {value=[0.05, -0.5, 1.0, 0.2]} : f32[4]
  %v = const {value=[1.0, 0.25, 4.0, 0.01]} : f32[4]";

#[test]
fn convolutions_with_and_without_bias() {
    for (conv, filter, out) in [
        (
            "conv2d %x, %w {pads=[1,1,1,1]}",
            "f32[4,3,3,3]",
            "[2,4,5,5]",
        ),
        ("conv2d %x, %w {strides=[2,2]}", "f32[4,3,1,1]", "[2,4,3,3]"),
    ] {
        for bias in [false, true] {
            let (z, add) = if bias {
                (
                    "%z",
                    format!(
                        "  %c = const {{value=[1.0, 2.0, 3.0, 4.0]}} : f32[4,1,1]\n  %y = add %z, %c : f32{out}\n"
                    ),
                )
            } else {
                ("%y", String::new())
            };
            let src = format!(
                "func @f(%x: f32[2,3,5,5]) -> (f32{out}) {{\n  %w = const {{value=0.25}} : {filter}\n{STATS}\n  {z} = {conv} : f32{out}\n{add}  %n = batch_norm %y, %g, %b, %m, %v {{eps=0.001}} : f32{out}\n  return %n\n}}"
            );
            let (stats, left, g) = check(&src);
            assert_eq!((stats.batch_norms, left), (1, 0), "{g}");
            // The folded value keeps the batch norm's name.
            assert_eq!(g.name(g.results()[0]), "n", "{g}");
        }
    }
}

#[test]
fn grouped_and_depthwise_convolutions_and_dense_layers() {
    let depthwise = format!(
        "func @f(%x: f32[1,4,6,6], %w: f32[4,1,3,3]) -> (f32[1,4,4,4]) {{\n{STATS}\n  %y = conv2d %x, %w {{groups=4}} : f32[1,4,4,4]\n  %n = batch_norm %y, %g, %b, %m, %v : f32[1,4,4,4]\n  return %n\n}}"
    );
    let grouped = format!(
        "func @f(%x: f32[1,4,6,6], %w: f32[4,2,3,3]) -> (f32[1,4,4,4]) {{\n{STATS}\n  %y = conv2d %x, %w {{groups=2}} : f32[1,4,4,4]\n  %n = batch_norm %y, %g, %b, %m, %v : f32[1,4,4,4]\n  return %n\n}}"
    );
    let dense = format!(
        "func @f(%x: f32[3,5]) -> (f32[3,4]) {{\n  %w = const {{value=[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8, 1.9, 2.0]}} : f32[5,4]\n{STATS}\n  %c = const {{value=[1.0, 2.0, 3.0, 4.0]}} : f32[4]\n  %z = matmul %x, %w : f32[3,4]\n  %y = add %c, %z : f32[3,4]\n  %n = batch_norm %y, %g, %b, %m, %v : f32[3,4]\n  return %n\n}}"
    );
    for src in [depthwise, grouped, dense] {
        let (stats, left, g) = check(&src);
        assert_eq!((stats.batch_norms, left), (1, 0), "{g}");
    }
}

/// A reshape between the layer and the batch norm that keeps the batch and channel axes, as
/// TensorFlow feeds a dense layer to its fused (4-D) batch norm, or a convolution's spatial
/// axes flattened for a 3-D batch norm: the folded layer is reshaped the same way. With
/// constant and with parameter weights, with and without a bias.
#[test]
fn through_a_reshape_that_keeps_the_channels() {
    let dense = |w: &str, bias: &str| {
        let (z, add) = if bias.is_empty() {
            ("%z", String::new())
        } else {
            (
                "%zb",
                format!("  %c = const {{value={bias}}} : f32[4]\n  %zb = add %z, %c : f32[3,4]\n"),
            )
        };
        format!(
            "func @f(%x: f32[3,5]{w}) -> (f32[3,4,1,1]) {{\n{STATS}\n{}  %z = matmul %x, %w : f32[3,4]\n{add}  %r = reshape {z} {{shape=[3,4,1,1]}} : f32[3,4,1,1]\n  %n = batch_norm %r, %g, %b, %m, %v : f32[3,4,1,1]\n  return %n\n}}",
            if w.is_empty() {
                "  %w0 = const {value=[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8, 1.9, 2.0]} : f32[20]\n  %w = reshape %w0 {shape=[5,4]} : f32[5,4]\n"
            } else {
                ""
            }
        )
    };
    let flat = format!(
        "func @f(%x: f32[2,3,5,5], %w: f32[4,3,3,3]) -> (f32[2,4,9]) {{\n{STATS}\n  %y = conv2d %x, %w : f32[2,4,3,3]\n  %r = reshape %y {{shape=[2,4,9]}} : f32[2,4,9]\n  %n = batch_norm %r, %g, %b, %m, %v : f32[2,4,9]\n  return %n\n}}"
    );
    for src in [
        dense("", ""),
        dense(", %w: f32[5,4]", ""),
        dense("", "[1.0, -1.0, 0.5, 2.0]"),
        dense(", %w: f32[5,4]", "[1.0, -1.0, 0.5, 2.0]"),
        flat,
    ] {
        let (stats, left, g) = check(&src);
        assert_eq!((stats.batch_norms, left), (1, 0), "{g}");
        let layers = (g.schedule().iter())
            .filter(|&&op| matches!(g.op(op).kind, OpKind::MatMul | OpKind::Conv2d(_)))
            .count();
        assert_eq!(layers, 1, "{g}");
    }
    // A reshape that moves the channels ([3,4] as [3,2,2]: axis 1 is no longer the columns)
    // is not looked through.
    let moved = "func @f(%x: f32[3,5], %w: f32[5,4]) -> (f32[3,2,2]) {\n  %g = const {value=[0.5, 1.5]} : f32[2]\n  %b = const {value=[0.1, -0.2]} : f32[2]\n  %m = const {value=[0.05, -0.5]} : f32[2]\n  %v = const {value=[1.0, 0.25]} : f32[2]\n  %z = matmul %x, %w : f32[3,4]\n  %r = reshape %z {shape=[3,2,2]} : f32[3,2,2]\n  %n = batch_norm %r, %g, %b, %m, %v : f32[3,2,2]\n  return %n\n}";
    let (stats, left, g) = check(moved);
    assert_eq!((stats.batch_norms, left, stats.affine), (0, 0, 1), "{g}");
    let layer = (g.schedule().iter())
        .find(|&&op| matches!(g.op(op).kind, OpKind::MatMul))
        .map(|&op| g.name(g.op(op).args[1]).to_string());
    assert_eq!(
        layer.as_deref(),
        Some("w"),
        "the weights are not scaled\n{g}"
    );
}

/// Weights or statistics that are parameters fold as ops: the scale stays in the graph and the
/// convolution reads one weight tensor.
#[test]
fn parameters_fold_symbolically() {
    let src = "func @f(%x: f32[2,3,5,5], %w: f32[4,3,3,3], %g: f32[4], %b: f32[4], %m: f32[4], %v: f32[4]) -> (f32[2,4,3,3]) {
  %y = conv2d %x, %w : f32[2,4,3,3]
  %n = batch_norm %y, %g, %b, %m, %v : f32[2,4,3,3]
  return %n
}";
    let (stats, left, g) = check(src);
    assert_eq!((stats.batch_norms, left), (1, 0), "{g}");
    let convs: Vec<_> = (g.schedule().iter())
        .filter(|&&op| matches!(g.op(op).kind, OpKind::Conv2d(_)))
        .collect();
    assert_eq!(convs.len(), 1);
}

/// The unfused form: a per-channel scale (then a shift) after a convolution with a bias.
#[test]
fn per_channel_scales_fold() {
    let src = "func @f(%x: f32[2,3,5,5], %w: f32[4,3,3,3]) -> (f32[2,4,3,3]) {
  %c = const {value=[1.0, 2.0, 3.0, 4.0]} : f32[4,1,1]
  %s = const {value=[0.5, -1.0, 2.0, 3.0]} : f32[1,4,1,1]
  %t = const {value=[0.1, 0.2, 0.3, 0.4]} : f32[4,1,1]
  %z = conv2d %x, %w : f32[2,4,3,3]
  %y = add %z, %c : f32[2,4,3,3]
  %p = mul %y, %s : f32[2,4,3,3]
  %q = add %p, %t : f32[2,4,3,3]
  return %q
}";
    let (stats, _, g) = check(src);
    assert_eq!(stats.scales, 1, "{g}");
    // No multiplication over the activations is left: the scale went into the weights.
    let over_activations = g.schedule().iter().any(|&op| {
        let d = g.op(op);
        matches!(d.kind, OpKind::Binary(tcc_ir::BinaryOp::Mul))
            && g.ty(d.results[0]).dims() == [2, 4, 3, 3]
    });
    assert!(!over_activations, "the scale is in the weights\n{g}");
}

/// A layer something else also reads is not folded (its own output would change), nor is a
/// batch norm after something that is not a layer: with constant statistics each becomes the
/// per-channel `(y - mean) * s + beta` and the layer keeps its weights; with statistics given
/// as parameters it is left. Results stay the same.
#[test]
fn what_must_not_fold_is_left() {
    let shared = format!(
        "func @f(%x: f32[1,3,5,5], %w: f32[4,3,3,3]) -> (f32[1,4,3,3], f32[1,4,3,3]) {{\n{STATS}\n  %y = conv2d %x, %w : f32[1,4,3,3]\n  %n = batch_norm %y, %g, %b, %m, %v : f32[1,4,3,3]\n  %r = relu %y : f32[1,4,3,3]\n  return %n, %r\n}}"
    );
    let returned = format!(
        "func @f(%x: f32[1,3,5,5], %w: f32[4,3,3,3]) -> (f32[1,4,3,3], f32[1,4,3,3]) {{\n{STATS}\n  %y = conv2d %x, %w : f32[1,4,3,3]\n  %n = batch_norm %y, %g, %b, %m, %v : f32[1,4,3,3]\n  return %n, %y\n}}"
    );
    let not_a_layer = format!(
        "func @f(%x: f32[1,4,3,3]) -> (f32[1,4,3,3]) {{\n{STATS}\n  %y = relu %x : f32[1,4,3,3]\n  %n = batch_norm %y, %g, %b, %m, %v : f32[1,4,3,3]\n  return %n\n}}"
    );
    for src in [shared, returned, not_a_layer] {
        let (stats, left, g) = check(&src);
        assert_eq!(
            (stats.batch_norms, left, stats.left.len(), stats.affine),
            (0, 0, 0, 1),
            "{g}"
        );
        // The three ops, their operands constants shaped to broadcast along the channels.
        let kinds: Vec<String> = (g.schedule().iter())
            .map(|&op| g.op(op))
            .filter_map(|d| match d.kind {
                OpKind::Binary(b) => Some(format!("{} {:?}", b.mnemonic(), g.ty(d.args[1]).dims())),
                _ => None,
            })
            .collect();
        assert_eq!(
            kinds,
            ["sub [4, 1, 1]", "mul [4, 1, 1]", "add [4, 1, 1]"],
            "{g}"
        );
        if src.contains("conv2d") {
            let w = (g.schedule().iter())
                .find(|&&op| matches!(g.op(op).kind, OpKind::Conv2d(_)))
                .map(|&op| g.name(g.op(op).args[1]).to_string());
            assert_eq!(w.as_deref(), Some("w"), "the layer is not folded\n{g}");
        }
    }
    let given = "func @f(%x: f32[1,4,3,3], %g: f32[4], %b: f32[4], %m: f32[4], %v: f32[4]) -> (f32[1,4,3,3]) {
  %y = relu %x : f32[1,4,3,3]
  %n = batch_norm %y, %g, %b, %m, %v : f32[1,4,3,3]
  return %n
}";
    let (stats, left, g) = check(given);
    assert_eq!((stats.affine, left, stats.left.len()), (0, 1, 1), "{g}");
}

/// Where the variance is tiny and the input close to the mean, subtracting the mean first keeps
/// the standalone form exact: `y * s + (beta - mean * s)` would lose the difference.
#[test]
fn standalone_batch_norm_subtracts_the_mean_first() {
    let src = "func @f(%x: f32[1,2,3,1]) -> (f32[1,2,3,1]) {
  %g = const {value=[1.0, 2.0]} : f32[2]
  %b = const {value=[0.0, 0.5]} : f32[2]
  %m = const {value=[1000.0, -3000.0]} : f32[2]
  %v = const {value=[1e-10, 4e-10]} : f32[2]
  %y = relu %x : f32[1,2,3,1]
  %n = batch_norm %y, %g, %b, %m, %v {eps=0} : f32[1,2,3,1]
  return %n
}";
    let f = parse_function(src).unwrap();
    let mut g = f.clone();
    assert_eq!(fold_bn(&mut g).affine, 1);
    let x = Tensor::from_f32(&[1, 2, 3, 1], [1000.0, 1000.0625, 999.9375, 0.0, 0.0, 0.0]).unwrap();
    let want = interp::run(&f, std::slice::from_ref(&x)).unwrap();
    let got = interp::run(&g, &[x]).unwrap();
    assert_eq!(got, want, "{g}");
}

/// Options that make no sense are errors naming them.
#[test]
fn bad_options_are_named() {
    let err = |text: &str| tcc_passes::Pipeline::parse(text).unwrap_err().message;
    assert!(
        err("fold-bn{freeze-delay=5}")
            .contains("`freeze-delay` and `decay` apply with `training=true`")
    );
    assert!(err("fold-bn{training=true,freeze-delay=-1}").contains("non-negative integer"));
    assert!(err("fold-bn{training=true,decay=1.5}").contains("must be in [0, 1)"));
    assert!(err("fold-bn{training=maybe}").contains("must be true or false"));
    assert!(err("fold-bn{budget=3}").contains("valid options are: training, freeze-delay, decay"));
    assert!(
        tcc_passes::Pipeline::parse("fold-bn{training=true,freeze-delay=200,decay=0.99}").is_ok()
    );
}

/// A squeeze-and-excitation gate: the per-channel scale of a convolution's input (one factor
/// per channel, the same for every image) goes into the filter when the filter is small
/// against the activation, in either operand order; it stays where the activation is small, the
/// product has another reader, or the scale differs per image.
#[test]
fn input_scales_fold_into_the_next_convolution() {
    let gate = |x: &str, s: &str, w: &str, y: &str, mul: &str, also_returned: bool| {
        let (types, values) = if also_returned {
            (format!("f32{y}, f32{x}"), "%y, %m")
        } else {
            (format!("f32{y}"), "%y")
        };
        format!(
            "func @f(%a: f32{x}, %g: f32{s}, %w: f32{w}) -> ({types}) {{
  %x = relu %a : f32{x}
  %s = sigmoid %g : f32{s}
  %m = {mul} : f32{x}
  %y = conv2d %m, %w {{pads=[1,0,1,0]}} : f32{y}
  return {values}
}}"
        )
    };
    // (input, scale, filter, output, the multiply, another reader?, folds?)
    let cases = [
        (
            "[1,6,12,10]",
            "[1,6,1,1]",
            "[5,6,3,1]",
            "[1,5,12,10]",
            "mul %x, %s",
            false,
            true,
        ),
        (
            "[1,6,12,10]",
            "[6,1,1]",
            "[5,6,3,1]",
            "[1,5,12,10]",
            "mul %s, %x",
            false,
            true,
        ),
        // The same factors for both images.
        (
            "[2,6,8,8]",
            "[1,6,1,1]",
            "[5,6,3,1]",
            "[2,5,8,8]",
            "mul %x, %s",
            false,
            true,
        ),
        // A filter larger than a quarter of the activation per channel (4 * 5 * 3 > 4 * 4).
        (
            "[1,6,4,4]",
            "[1,6,1,1]",
            "[5,6,3,1]",
            "[1,5,4,4]",
            "mul %x, %s",
            false,
            false,
        ),
        // Per-image factors.
        (
            "[2,6,8,8]",
            "[2,6,1,1]",
            "[5,6,3,1]",
            "[2,5,8,8]",
            "mul %x, %s",
            false,
            false,
        ),
        // The product is also a result.
        (
            "[1,6,12,10]",
            "[1,6,1,1]",
            "[5,6,3,1]",
            "[1,5,12,10]",
            "mul %x, %s",
            true,
            false,
        ),
    ];
    for (x, s, w, y, mul, returned, folds) in cases {
        let src = gate(x, s, w, y, mul, returned);
        let (stats, _, g) = check(&src);
        assert_eq!(stats.input_scales, usize::from(folds), "{src}\n{g}");
        let activation_muls = (g.schedule().iter())
            .filter(|&&op| {
                let d = g.op(op);
                matches!(d.kind, OpKind::Binary(tcc_ir::BinaryOp::Mul))
                    && g.ty(d.results[0]).dims() == g.ty(g.params()[0]).dims()
            })
            .count();
        assert_eq!(activation_muls, usize::from(!folds), "{src}\n{g}");
    }
}

use super::{Fast, Layout, Post, PostOp};
use tcc_ir::{Function, Value, parse_function};

/// `Post::of` in `layout` on the ops after `src`'s first `library` op (constants aside:
/// the planner keeps them out of kernels), with the function's results as what the kernel
/// stores.
fn post_after(src: &str, library: &str, layout: Layout) -> Option<(Post, Value)> {
    let f: Function = parse_function(src).unwrap();
    let ops = f.schedule();
    let start = ops
        .iter()
        .position(|&op| f.op(op).kind.mnemonic() == library)
        .unwrap();
    let r = f.op(ops[start]).results[0];
    let epilogue: Vec<_> = (ops[start + 1..].iter().copied())
        .filter(|&op| f.op(op).kind.mnemonic() != "const")
        .collect();
    Post::of(&f, layout, &epilogue, r, f.results())
}

/// [`post_after`] a blocked convolution.
fn post(src: &str) -> Option<(Post, Value)> {
    post_after(src, "conv2d_nchwc", Layout::Blocked)
}

/// The forms with a loop of their own, and chains that keep the general one.
#[test]
fn common_epilogues_have_fast_forms() {
    let bias = PostOp::Channel {
        mul: false,
        operand: 0,
    };
    let residual = PostOp::Tensor { operand: 1 };
    let scale = PostOp::Channel {
        mul: true,
        operand: 0,
    };
    let cases = [
        (vec![], Some(Fast::Plain)),
        (vec![bias], Some(Fast::Bias(0))),
        (vec![bias, PostOp::Relu], Some(Fast::BiasRelu(0))),
        (
            vec![bias, PostOp::Max(0.0), PostOp::Min(6.0)],
            Some(Fast::BiasClamp(0, 0.0, 6.0)),
        ),
        (vec![bias, PostOp::Silu], Some(Fast::BiasSilu(0))),
        (
            vec![PostOp::GeluErf {
                div: 2.0,
                one: 1.0,
                half: 0.5,
            }],
            Some(Fast::GeluErf(None, 2.0, 1.0, 0.5)),
        ),
        (vec![bias, residual], Some(Fast::BiasResidual(0, 1, false))),
        (
            vec![bias, residual, PostOp::Relu],
            Some(Fast::BiasResidual(0, 1, true)),
        ),
        // The clamps the other way round, a scale, an activation first: general.
        (vec![bias, PostOp::Min(6.0), PostOp::Max(0.0)], None),
        (vec![scale, bias, PostOp::Relu], None),
        (vec![PostOp::Relu, bias], None),
        (vec![bias, PostOp::Sigmoid], None),
    ];
    for (ops, want) in cases {
        assert_eq!(Fast::of(&ops), want, "{ops:?}");
    }
}

#[test]
fn bias_scale_residual_and_clamps_are_post_ops() {
    let (p, _) = post(
        "func @f(%x: f32[1,2,4,4,8], %w: f32[16,16,1,1], %b: f32[1,2,1,1,8], %s: f32[2,1,1,8], %r: f32[1,2,4,4,8]) -> (f32[1,2,4,4,8]) {
  %c = conv2d_nchwc %x, %w {block=8} : f32[1,2,4,4,8]
  %m = mul %s, %c : f32[1,2,4,4,8]
  %z = add %m, %b : f32[1,2,4,4,8]
  %t = add %r, %z : f32[1,2,4,4,8]
  %lo = const {value=0.0} : f32[]
  %hi = const {value=6.0} : f32[]
  %a = max %t, %lo : f32[1,2,4,4,8]
  %y = min %hi, %a : f32[1,2,4,4,8]
  %q = relu %y : f32[1,2,4,4,8]
  %sg = sigmoid %q : f32[1,2,4,4,8]
  %u = mul %q, %sg : f32[1,2,4,4,8]
  %g = sigmoid %u : f32[1,2,4,4,8]
  return %g
}",
    )
    .expect("every op is a post-op");
    assert_eq!(
        p.ops,
        vec![
            PostOp::Channel {
                mul: true,
                operand: 0
            },
            PostOp::Channel {
                mul: false,
                operand: 1
            },
            PostOp::Tensor { operand: 2 },
            PostOp::Max(0.0),
            PostOp::Min(6.0),
            PostOp::Relu,
            PostOp::Silu,
            PostOp::Sigmoid,
        ]
    );
}

/// A matmul's epilogue over rows of channels: a bias of one row (or a vector), and GELU as
/// PyTorch exports it, its constants kept; the erf form read from something other than the
/// GELU's input is not one.
#[test]
fn gelu_after_a_matmul_is_a_post_op() {
    let src = |mul_by: &str| {
        format!(
            "func @f(%x: f32[4,16], %w: f32[16,24], %b: f32[1,24], %o: f32[4,24]) -> (f32[4,24]) {{
  %h = matmul %x, %w : f32[4,24]
  %z = add %h, %b : f32[4,24]
  %c = const {{value=[1.4142135]}} : f32[]
  %d = div %z, %c : f32[4,24]
  %e = erf %d : f32[4,24]
  %one = const {{value=[1.0]}} : f32[]
  %a = add %one, %e : f32[4,24]
  %m = mul %a, {mul_by} : f32[4,24]
  %half = const {{value=[0.5]}} : f32[]
  %y = mul %m, %half : f32[4,24]
  return %y
}}"
        )
    };
    let of = |src: &str, layout: Layout| post_after(src, "matmul", layout);
    let (p, _) = of(&src("%z"), Layout::Rows).expect("a bias and GELU");
    assert_eq!(
        p.ops,
        vec![
            PostOp::Channel {
                mul: false,
                operand: 0
            },
            PostOp::GeluErf {
                div: std::f32::consts::SQRT_2,
                one: 1.0,
                half: 0.5
            },
        ]
    );
    assert_eq!(
        Fast::of(&p.ops),
        Some(Fast::GeluErf(Some(0), std::f32::consts::SQRT_2, 1.0, 0.5))
    );
    assert!(of(&src("%o"), Layout::Rows).is_none());
    // Blocked outputs end in a block of eight channels: not this one.
    assert!(of(&src("%z"), Layout::Blocked).is_none());
}

#[test]
fn other_epilogues_are_not() {
    // A tanh; the chain's own value as a later operand (not stored, so not readable);
    // a value of the chain read elsewhere; a per-pixel operand.
    for src in [
        "func @f(%x: f32[1,2,4,4,8], %w: f32[16,16,1,1]) -> (f32[1,2,4,4,8]) {
  %c = conv2d_nchwc %x, %w {block=8} : f32[1,2,4,4,8]
  %y = tanh %c : f32[1,2,4,4,8]
  return %y
}",
        "func @f(%x: f32[1,2,4,4,8], %w: f32[16,16,1,1], %b: f32[1,2,1,1,8]) -> (f32[1,2,4,4,8]) {
  %c = conv2d_nchwc %x, %w {block=8} : f32[1,2,4,4,8]
  %z = add %c, %b : f32[1,2,4,4,8]
  %y = add %z, %c : f32[1,2,4,4,8]
  return %y
}",
        "func @f(%x: f32[1,2,4,4,8], %w: f32[16,16,1,1], %b: f32[1,2,1,1,8]) -> (f32[1,2,4,4,8], f32[1,2,4,4,8]) {
  %c = conv2d_nchwc %x, %w {block=8} : f32[1,2,4,4,8]
  %z = add %c, %b : f32[1,2,4,4,8]
  %y = relu %z : f32[1,2,4,4,8]
  return %z, %y
}",
        "func @f(%x: f32[1,2,4,4,8], %w: f32[16,16,1,1], %g: f32[1,1,4,4,1]) -> (f32[1,2,4,4,8]) {
  %c = conv2d_nchwc %x, %w {block=8} : f32[1,2,4,4,8]
  %y = mul %c, %g : f32[1,2,4,4,8]
  return %y
}",
    ] {
        assert!(post(src).is_none(), "{src}");
    }
}

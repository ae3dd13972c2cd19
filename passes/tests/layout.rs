//! `nchwc` on CNN-shaped functions: the reference interpreter gives bit-identical results
//! before and after (the blocked ops compute the same sums, and padding lanes never reach a
//! plain value), at blocks of 8 and of 3 (partial last blocks everywhere); every convolution
//! with one group, depthwise or with groups of whole blocks is rewritten, and a blocked value
//! never goes back and forth (no `to_nchwc` of a `from_nchwc`).

use tcc_ir::random::{Rng, random_tensor};
use tcc_ir::{Function, OpKind, Tensor, interp, parse_function, verify_function};
use tcc_passes::layout::nchwc;

/// Rewrites `src` with `block`, checks it verifies, gives the same bits, converts every
/// convertible convolution and never converts a value back and forth; returns the stats'
/// count of blocked convolutions.
fn check(src: &str, block: u64) -> usize {
    let f = parse_function(src).unwrap_or_else(|d| panic!("{src}\n{d}"));
    let mut g = f.clone();
    let stats = nchwc(&mut g, block).unwrap();
    verify_function(&g).unwrap_or_else(|d| panic!("{d}\n{g}"));
    let mut rng = Rng::new(11);
    let inputs: Vec<Tensor> = (f.params().iter())
        .map(|&p| random_tensor(f.ty(p), &mut rng))
        .collect();
    let want = interp::run(&f, &inputs).unwrap();
    let got = interp::run(&g, &inputs).unwrap();
    assert_eq!(got, want, "block {block}\n{g}");
    let left = |g: &Function| {
        (g.schedule().iter())
            .filter(|&&op| matches!(g.op(op).kind, OpKind::Conv2d(_)))
            .count()
    };
    // Grouped convolutions stay unless every group's input and output channels fill blocks, or
    // are the same fraction of a block.
    let split_blocks = (f.schedule().iter())
        .filter(|&&op| {
            let d = f.op(op);
            let OpKind::Conv2d(c) = &d.kind else {
                return false;
            };
            let (cg, o) = (f.ty(d.args[1]).dims()[1], f.ty(d.args[1]).dims()[0]);
            let depthwise = cg == 1 && o == c.groups && f.ty(d.args[0]).dims()[1] == c.groups;
            let og = o / c.groups;
            let whole = cg.is_multiple_of(block) && og.is_multiple_of(block);
            let fraction = og == cg
                && block.is_multiple_of(cg)
                && f.ty(d.args[0]).dims()[1].is_multiple_of(block);
            c.groups > 1 && !depthwise && !whole && !fraction
        })
        .count();
    assert_eq!(
        left(&g),
        split_blocks,
        "only grouped convolutions stay\n{g}"
    );
    for &op in g.schedule() {
        let d = g.op(op);
        if let OpKind::ToNchwc { .. } = d.kind {
            let src = g.def_op(d.args[0]).map(|p| &g.op(p).kind);
            assert!(
                !matches!(src, Some(OpKind::FromNchwc { .. })),
                "a value converted back and forth\n{g}"
            );
        }
    }
    stats.convs
}

#[test]
fn cnn_blocks_give_the_same_bits() {
    let cases = [
        // A ResNet block: stem, pooling, two 3x3 convolutions with a residual and relus.
        "func @f(%x: f32[2,3,16,16], %w0: f32[12,3,3,3], %w1: f32[12,12,3,3], %w2: f32[12,12,3,3], %b: f32[12,1,1]) -> (f32[2,12]) {
  %c0 = conv2d %x, %w0 {strides=[2,2], pads=[1,1,1,1]} : f32[2,12,8,8]
  %a0 = add %c0, %b : f32[2,12,8,8]
  %r0 = relu %a0 : f32[2,12,8,8]
  %p = max_pool2d %r0 {kernel=[3,3], strides=[1,1], pads=[1,1,1,1]} : f32[2,12,8,8]
  %c1 = conv2d %p, %w1 {pads=[1,1,1,1]} : f32[2,12,8,8]
  %r1 = relu %c1 : f32[2,12,8,8]
  %c2 = conv2d %r1, %w2 {pads=[1,1,1,1]} : f32[2,12,8,8]
  %s = add %c2, %p : f32[2,12,8,8]
  %r2 = relu %s : f32[2,12,8,8]
  %g = global_avg_pool %r2 : f32[2,12,1,1]
  %y = reshape %g {shape=[2,12]} : f32[2,12]
  return %y
}",
        // An inverted residual with squeeze-and-excitation and SiLU, as in EfficientNet.
        "func @f(%x: f32[1,10,9,9], %we: f32[20,10,1,1], %wd: f32[20,1,3,3], %ws1: f32[5,20,1,1], %ws2: f32[20,5,1,1], %wp: f32[10,20,1,1]) -> (f32[1,10,9,9]) {
  %e = conv2d %x, %we : f32[1,20,9,9]
  %es = sigmoid %e : f32[1,20,9,9]
  %ea = mul %e, %es : f32[1,20,9,9]
  %d = conv2d %ea, %wd {pads=[1,1,1,1], groups=20} : f32[1,20,9,9]
  %m = reduce_mean %d {axes=[2,3], keepdims=true} : f32[1,20,1,1]
  %s1 = conv2d %m, %ws1 : f32[1,5,1,1]
  %s1r = relu %s1 : f32[1,5,1,1]
  %s2 = conv2d %s1r, %ws2 : f32[1,20,1,1]
  %gate = sigmoid %s2 : f32[1,20,1,1]
  %scaled = mul %d, %gate : f32[1,20,9,9]
  %p = conv2d %scaled, %wp : f32[1,10,9,9]
  %y = add %p, %x : f32[1,10,9,9]
  return %y
}",
        // A grouped convolution (kept plain) between blocked ones, and an average pool.
        "func @f(%x: f32[1,4,8,8], %w1: f32[4,4,3,3], %wg: f32[4,2,3,3], %w2: f32[6,4,1,1]) -> (f32[1,6,3,3]) {
  %c1 = conv2d %x, %w1 {pads=[1,1,1,1]} : f32[1,4,8,8]
  %g = conv2d %c1, %wg {pads=[1,1,1,1], groups=2} : f32[1,4,8,8]
  %c2 = conv2d %g, %w2 : f32[1,6,8,8]
  %a = avg_pool2d %c2 {kernel=[3,3], strides=[2,2]} : f32[1,6,3,3]
  return %a
}",
        // A RegNet block: a grouped convolution of eight channels a group (blocked at blocks of
        // 8, plain at blocks of 3) between 1x1 ones, and the residual add.
        "func @f(%x: f32[1,16,6,6], %wa: f32[24,16,1,1], %wb: f32[24,8,3,3], %wc: f32[16,24,1,1]) -> (f32[1,16,3,3]) {
  %a = conv2d %x, %wa : f32[1,24,6,6]
  %ar = relu %a : f32[1,24,6,6]
  %b = conv2d %ar, %wb {strides=[2,2], pads=[1,1,1,1], groups=3} : f32[1,24,3,3]
  %br = relu %b : f32[1,24,3,3]
  %c = conv2d %br, %wc : f32[1,16,3,3]
  %s = avg_pool2d %x {kernel=[2,2], strides=[2,2]} : f32[1,16,3,3]
  %y = add %c, %s : f32[1,16,3,3]
  return %y
}",
        // A ResNeXt-50 first-stage block: 16 channels in groups of four (a half block each,
        // blocked at blocks of 8, plain at 3).
        "func @f(%x: f32[1,16,6,6], %wg: f32[16,4,3,3], %wc: f32[8,16,1,1]) -> (f32[1,8,6,6]) {
  %g = conv2d %x, %wg {pads=[1,1,1,1], groups=4} : f32[1,16,6,6]
  %r = relu %g : f32[1,16,6,6]
  %y = conv2d %r, %wc : f32[1,8,6,6]
  return %y
}",
        // A text detector's head: a 3x3 convolution, then 2x2 stride-2 transposed
        // convolutions (24 channels: whole blocks of 8 and of 3, upsampled as a 1x1
        // convolution whose blocks move into place; then 1 channel: left as it is), a
        // per-channel scale between them.
        "func @f(%x: f32[1,8,5,4], %w: f32[24,8,3,3], %u: f32[24,24,2,2], %g: f32[24,1,1], %v: f32[24,1,2,2]) -> (f32[1,1,20,16]) {
  %c = conv2d %x, %w {pads=[1,1,1,1]} : f32[1,24,5,4]
  %r = relu %c : f32[1,24,5,4]
  %t = conv2d_grad_input %r, %u {strides=[2,2], shape=[1,24,10,8]} : f32[1,24,10,8]
  %s = mul %t, %g : f32[1,24,10,8]
  %q = relu %s : f32[1,24,10,8]
  %y = conv2d_grad_input %q, %v {strides=[2,2], shape=[1,1,20,16]} : f32[1,1,20,16]
  return %y
}",
        // A ConvNeXt block: channels-last for a dense layer and back, then the scale and the
        // residual add. 24 channels are whole blocks of 8 and of 3: the transposes move whole
        // blocks (checked below).
        "func @f(%x: f32[1,24,5,6], %wd: f32[24,1,3,3], %w1: f32[24,24], %gamma: f32[24,1,1], %wd2: f32[24,1,3,3]) -> (f32[1,24,5,6]) {
  %d = conv2d %x, %wd {pads=[1,1,1,1], groups=24} : f32[1,24,5,6]
  %t = transpose %d {perm=[0,2,3,1]} : f32[1,5,6,24]
  %h = matmul %t, %w1 : f32[1,5,6,24]
  %b = transpose %h {perm=[0,3,1,2]} : f32[1,24,5,6]
  %s = mul %gamma, %b : f32[1,24,5,6]
  %r = add %s, %x : f32[1,24,5,6]
  %y = conv2d %r, %wd2 {pads=[1,1,1,1], groups=24} : f32[1,24,5,6]
  return %y
}",
        // Inception and Fire modules: branches joined along the channels, blocked operands and a
        // plain one (the pooled input's branch is a parameter here), the last one partial at
        // blocks of 8; then a pool and a convolution of the joined tensor.
        "func @f(%x: f32[1,8,6,6], %w1: f32[8,8,1,1], %w3: f32[16,8,3,3], %w5: f32[4,8,1,1], %q: f32[1,8,6,6], %wo: f32[6,36,1,1]) -> (f32[1,6,3,3], f32[1,36,6,6]) {
  %b1 = conv2d %x, %w1 : f32[1,8,6,6]
  %b3 = conv2d %x, %w3 {pads=[1,1,1,1]} : f32[1,16,6,6]
  %r3 = relu %b3 : f32[1,16,6,6]
  %b5 = conv2d %x, %w5 : f32[1,4,6,6]
  %j = concat %b1, %r3, %q, %b5 {axis=1} : f32[1,36,6,6]
  %p = max_pool2d %j {kernel=[2,2], strides=[2,2]} : f32[1,36,3,3]
  %y = conv2d %p, %wo : f32[1,6,3,3]
  return %y, %j
}",
    ];
    for src in cases {
        for block in [8, 3] {
            assert!(check(src, block) > 0);
        }
    }
    // In the ConvNeXt block, no value goes through the plain layout: the transposes read and
    // give blocked forms, and the only `from_nchwc` is of the result.
    let mut g = parse_function(cases[6]).unwrap();
    nchwc(&mut g, 8).unwrap();
    let froms = (g.schedule().iter())
        .filter(|&&op| matches!(g.op(op).kind, OpKind::FromNchwc { .. }))
        .count();
    assert_eq!(froms, 1, "{g}");
}

/// Transposes of every rank beside a convolution: the channels-last and channels-first
/// rewrites look only at rank 3 and up (a scalar's transpose once underflowed its rank).
#[test]
fn transposes_of_low_rank_are_left_alone() {
    let src = "func @f(%x: f32[1,8,4,4], %w: f32[8,8,3,3], %s: f32[], %v: f32[8], %m: f32[8,4]) -> (f32[1,8,4,4], f32[], f32[8], f32[4,8]) {
  %c = conv2d %x, %w {pads=[1,1,1,1]} : f32[1,8,4,4]
  %t = transpose %s {perm=[]} : f32[]
  %u = transpose %v {perm=[0]} : f32[8]
  %n = transpose %m {perm=[1,0]} : f32[4,8]
  return %c, %t, %u, %n
}";
    check(src, 8);
}

/// A convolution whose only control dependent is dead is blocked in the first run, so a second
/// run changes nothing (found by the fixed-point property: the dead op kept it plain once, and
/// was gone the second time).
#[test]
fn dead_control_dependents_do_not_keep_a_convolution_plain() {
    let src = "func @f(%x: f32[1,2,4,3], %w: f32[2,2,2,2], %a: f32[3]) -> (f32[1,2,3,3]) {
  %c = conv2d %x, %w {pads=[0,0,0,1]} : f32[1,2,3,3]
  %dead = neg %a after %c : f32[3]
  return %c
}";
    assert_eq!(check(src, 8), 1);
    let mut g = parse_function(src).unwrap();
    nchwc(&mut g, 8).unwrap();
    let once = g.to_string();
    nchwc(&mut g, 8).unwrap();
    assert_eq!(g.to_string(), once, "not a fixed point");
}

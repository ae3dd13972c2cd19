//! Running a compiled function many times must not grow the process: arenas are reused,
//! packed filters and thread-local buffers reach their size once, and outputs are freed by
//! their owner. Alone in its test binary, so no other test allocates meanwhile. Linux only
//! (it reads /proc/self/statm).

use tcc_codegen::Executable;
use tcc_ir::random::{Rng, random_tensor};
use tcc_ir::{Tensor, parse_function};

/// Resident memory of this process, in bytes.
fn resident() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("Linux has /proc/self/statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("statm's second field is the resident page count");
    pages * 4096
}

#[test]
fn repeated_runs_do_not_grow_memory() {
    // A small CNN on every kind of step: blocked convolutions with fused epilogues, a blocked
    // max pool, layout changes, a reduction, a matmul with a constant weight and a softmax.
    let w: Vec<String> = (0..64 * 10)
        .map(|i| format!("{}", ((i * 7 % 13) as f32 - 6.0) / 8.0))
        .collect();
    let src = format!(
        "func @f(%x: f32[2,3,32,32], %w1: f32[32,3,3,3], %w2: f32[64,32,3,3], %b: f32[64,1,1]) -> (f32[2,10]) {{
  %c1 = conv2d %x, %w1 {{pads=[1,1,1,1]}} : f32[2,32,32,32]
  %r1 = relu %c1 : f32[2,32,32,32]
  %p = max_pool2d %r1 {{kernel=[2,2], strides=[2,2]}} : f32[2,32,16,16]
  %c2 = conv2d %p, %w2 {{pads=[1,1,1,1]}} : f32[2,64,16,16]
  %z = add %c2, %b : f32[2,64,16,16]
  %r2 = relu %z : f32[2,64,16,16]
  %g = global_avg_pool %r2 : f32[2,64,1,1]
  %flat = reshape %g {{shape=[2,64]}} : f32[2,64]
  %fc = const {{value=[{}]}} : f32[64,10]
  %logits = matmul %flat, %fc : f32[2,10]
  %y = softmax %logits : f32[2,10]
  return %y
}}",
        w.join(", ")
    );
    let f = parse_function(&src).unwrap();
    let exe = Executable::compile(&f).unwrap();
    let mut rng = Rng::new(5);
    let inputs: Vec<Tensor> = f
        .params()
        .iter()
        .map(|&p| random_tensor(f.ty(p), &mut rng))
        .collect();
    let first = exe.run(&inputs).unwrap();
    // Warm up: the arena, the workers, the thread-local buffers.
    for _ in 0..50 {
        exe.run(&inputs).unwrap();
    }
    let before = resident();
    for _ in 0..2000 {
        let out = exe.run(&inputs).unwrap();
        assert_eq!(out, first, "a run gives the same results as the first");
    }
    let grown = resident().saturating_sub(before);
    // One run moves about 0.8 MB through its arena; a leak of any per-run buffer would add
    // at least 2000 times its size.
    assert!(
        grown < 4 << 20,
        "2000 runs grew the process by {} KiB",
        grown >> 10
    );
}

//! The models of the train-step benchmarks (benches/train.rs, benches/remat.rs), batch 64, both
//! with a mean softmax cross-entropy loss:
//! - mlp: 784 -> 256 -> 128 -> 10 with relu;
//! - cnn: 28x28x1 -> conv 3x3 16 (+bias, relu, 2x2 max pool) -> conv 3x3 32 (same) -> dense
//!   1568 -> 128 (relu) -> dense 10.
#![allow(dead_code)]

pub const MLP: &str = "func @mlp(%x: f32[64,784], %labels: i32[64], %fc1/w: f32[784,256], %fc1/b: f32[256], %fc2/w: f32[256,128], %fc2/b: f32[128], %fc3/w: f32[128,10], %fc3/b: f32[10]) -> (f32[]) {
  %fc1/mm = matmul %x, %fc1/w : f32[64,256]
  %fc1/add = add %fc1/mm, %fc1/b : f32[64,256]
  %fc1/relu = relu %fc1/add : f32[64,256]
  %fc2/mm = matmul %fc1/relu, %fc2/w : f32[64,128]
  %fc2/add = add %fc2/mm, %fc2/b : f32[64,128]
  %fc2/relu = relu %fc2/add : f32[64,128]
  %fc3/mm = matmul %fc2/relu, %fc3/w : f32[64,10]
  %logits = add %fc3/mm, %fc3/b : f32[64,10]
  %loss = softmax_cross_entropy %logits, %labels : f32[]
  return %loss
}";

pub const CNN: &str = "func @cnn(%x: f32[64,1,28,28], %labels: i32[64], %c1/w: f32[16,1,3,3], %c1/b: f32[16], %c2/w: f32[32,16,3,3], %c2/b: f32[32], %fc1/w: f32[1568,128], %fc1/b: f32[128], %fc2/w: f32[128,10], %fc2/b: f32[10]) -> (f32[]) {
  %c1/conv = conv2d %x, %c1/w {pads=[1,1,1,1]} : f32[64,16,28,28]
  %c1/bias = reshape %c1/b {shape=[1,16,1,1]} : f32[1,16,1,1]
  %c1/add = add %c1/conv, %c1/bias : f32[64,16,28,28]
  %c1/relu = relu %c1/add : f32[64,16,28,28]
  %c1/pool = max_pool2d %c1/relu {kernel=[2,2], strides=[2,2]} : f32[64,16,14,14]
  %c2/conv = conv2d %c1/pool, %c2/w {pads=[1,1,1,1]} : f32[64,32,14,14]
  %c2/bias = reshape %c2/b {shape=[1,32,1,1]} : f32[1,32,1,1]
  %c2/add = add %c2/conv, %c2/bias : f32[64,32,14,14]
  %c2/relu = relu %c2/add : f32[64,32,14,14]
  %c2/pool = max_pool2d %c2/relu {kernel=[2,2], strides=[2,2]} : f32[64,32,7,7]
  %flat = reshape %c2/pool {shape=[64,1568]} : f32[64,1568]
  %fc1/mm = matmul %flat, %fc1/w : f32[64,128]
  %fc1/add = add %fc1/mm, %fc1/b : f32[64,128]
  %fc1/relu = relu %fc1/add : f32[64,128]
  %fc2/mm = matmul %fc1/relu, %fc2/w : f32[64,10]
  %logits = add %fc2/mm, %fc2/b : f32[64,10]
  %loss = softmax_cross_entropy %logits, %labels : f32[]
  return %loss
}";

//! One training step against PyTorch on the CPU, in the same run.
//!
//! `benches/run.sh train` (or `cargo bench --bench train` with torch importable by the
//! interpreter named in `TCC_TORCH_PYTHON`, default `target/torch-venv/bin/python`) builds the
//! SGD train step of each model with `grad` and `sgd`, compiles it, and times one step (best of
//! N after a warm-up); then runs `benches/torch_train.py` twice with the same thread count for the
//! same models; then times tcc again. The better time of each side counts (this VM's speed
//! drifts). Prints milliseconds per step and the ratio tcc / PyTorch (below 1 is faster).
//! Figures go in docs/perf.md.
//!
//! The models, batch 64, both with a mean softmax cross-entropy loss:
//! - mlp: 784 -> 256 -> 128 -> 10 with relu;
//! - cnn: 28x28x1 -> conv 3x3 16 (+bias, relu, 2x2 max pool) -> conv 3x3 32 (same) -> dense
//!   1568 -> 128 (relu) -> dense 10.

#[path = "common/peer.rs"]
mod peer;

use std::collections::HashMap;
use std::time::{Duration, Instant};
use tcc::codegen::Executable;
use tcc::ir::random::{Rng, random_tensor};
use tcc::ir::{Data, Tensor, parse_function};
use tcc::passes::optim::Optimizer;

const MLP: &str = "func @mlp(%x: f32[64,784], %labels: i32[64], %fc1/w: f32[784,256], %fc1/b: f32[256], %fc2/w: f32[256,128], %fc2/b: f32[128], %fc3/w: f32[128,10], %fc3/b: f32[10]) -> (f32[]) {
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

const CNN: &str = "func @cnn(%x: f32[64,1,28,28], %labels: i32[64], %c1/w: f32[16,1,3,3], %c1/b: f32[16], %c2/w: f32[32,16,3,3], %c2/b: f32[32], %fc1/w: f32[1568,128], %fc1/b: f32[128], %fc2/w: f32[128,10], %fc2/b: f32[10]) -> (f32[]) {
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

/// One compiled train step, ready to run.
type Step = Box<dyn FnMut()>;

fn best(mut f: impl FnMut(), runs: usize) -> Duration {
    for _ in 0..3 {
        f();
    }
    (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .min()
        .unwrap()
}

/// Compiles the SGD train step of `src` and returns a closure that runs one step, with the op
/// counts of the forward function, its gradient function and the train step.
fn tcc_step(src: &str) -> (Step, [usize; 3]) {
    let f = parse_function(src).unwrap();
    let mut g = f.clone();
    let wrt = f
        .params()
        .iter()
        .map(|&p| f.name(p).to_string())
        .filter(|n| n != "x" && n != "labels")
        .collect();
    let opts = tcc::passes::GradOptions {
        wrt: tcc::passes::grad::Wrt::Select(wrt),
        ..Default::default()
    };
    tcc::passes::grad(&mut g, &opts).unwrap();
    let (step, _) = tcc_tools::train::train_step(
        &f,
        &["x".to_string(), "labels".to_string()],
        Optimizer::Sgd { lr: 0.01 },
    )
    .unwrap();
    let exe = Executable::compile(&step).unwrap();
    let mut rng = Rng::new(1);
    let inputs: Vec<Tensor> = step
        .params()
        .iter()
        .map(|&p| {
            let t = random_tensor(step.ty(p), &mut rng);
            match t.data() {
                // Labels in 0..10.
                Data::I32(v) => Tensor::from_data(
                    t.dims(),
                    Data::I32(v.iter().map(|&l| l.rem_euclid(10)).collect()),
                )
                .unwrap(),
                _ => t,
            }
        })
        .collect();
    let ops = [
        f.schedule().len(),
        g.schedule().len(),
        step.schedule().len(),
    ];
    (
        Box::new(move || {
            exe.run(&inputs).unwrap();
        }),
        ops,
    )
}

fn torch_times(threads: usize) -> Option<HashMap<String, f64>> {
    let python = std::env::var("TCC_TORCH_PYTHON")
        .unwrap_or_else(|_| "target/torch-venv/bin/python".to_string());
    peer::run(&python, "benches/torch_train.py", &[threads.to_string()])
        .map_err(|e| eprintln!("PyTorch side failed: {e}"))
        .ok()
}

fn main() {
    let threads = rayon::current_num_threads();
    println!(
        "one SGD train step, batch 64, {threads} threads (tcc: rayon pool; PyTorch: set_num_threads)"
    );
    let mut steps: Vec<(&str, Step, usize)> = Vec::new();
    let mut first = HashMap::new();
    for (name, src, runs) in [("mlp", MLP, 200), ("cnn", CNN, 50)] {
        let (mut step, [fwd, grad, total]) = tcc_step(src);
        println!(
            "{name}: {fwd} forward ops; with gradients {grad} ({:.2}x); SGD train step {total}",
            grad as f64 / fwd as f64
        );
        first.insert(name, best(&mut step, runs));
        steps.push((name, step, runs));
    }
    // PyTorch twice too, around tcc's second timing; the better of each side counts.
    let torch = match (torch_times(threads), torch_times(threads)) {
        (Some(a), Some(b)) => Some(
            a.into_iter()
                .map(|(k, v)| {
                    let w = b.get(&k).copied().unwrap_or(v).min(v);
                    (k, w)
                })
                .collect::<HashMap<_, _>>(),
        ),
        (a, b) => a.or(b),
    };
    if torch.is_none() {
        println!(
            "(PyTorch not available: run benches/run.sh train, which installs it into target/torch-venv)"
        );
    }
    println!(
        "{:<6} {:>12} {:>14} {:>14}",
        "model", "tcc ms", "PyTorch ms", "tcc/PyTorch"
    );
    for (name, mut step, runs) in steps {
        let t = first[name].min(best(&mut step, runs)).as_secs_f64();
        match torch.as_ref().and_then(|m| m.get(name)) {
            Some(&p) => println!(
                "{name:<6} {:>12.3} {:>14.3} {:>14.2}",
                t * 1e3,
                p * 1e3,
                t / p
            ),
            None => println!("{name:<6} {:>12.3}", t * 1e3),
        }
    }
}

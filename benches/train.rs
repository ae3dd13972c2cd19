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

#[path = "common/models.rs"]
mod models;
#[path = "common/peer.rs"]
mod peer;
#[path = "common/timing.rs"]
mod timing;

use models::{CNN, MLP};

use std::collections::HashMap;
use tcc::codegen::Executable;
use tcc::ir::random::{Rng, random_tensor};
use tcc::ir::{Data, Tensor, parse_function};
use tcc::passes::optim::Optimizer;
use timing::best;

/// One compiled train step, ready to run.
type Step = Box<dyn FnMut()>;

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
        None,
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
        first.insert(name, best(&mut step, 3, runs));
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
        let t = first[name].min(best(&mut step, 3, runs)).as_secs_f64();
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

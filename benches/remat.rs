//! Gradient checkpointing (`remat`) on generated training graphs: peak activation bytes and
//! extra FLOPs for each strategy and budget, and the pass's own time as graphs grow.
//!
//! `cargo bench --bench remat` (about a minute). Each graph is differentiated with
//! `grad{wrt=params}`; then, for no remat, `strategy=speed`, `strategy=memory` and budgets of
//! 50%, 25% and the sqrt level (the peak `strategy=memory` reaches; 2/sqrt(L) of the peak for
//! L layers where it finds no bottleneck), it prints the peak of activations and temporaries
//! (`analysis::memory`, `temps_peak`), that peak in layer activations, the recomputation in
//! forward passes (FLOPs of the copies over the forward FLOPs, `analysis::cost`), and the
//! time of the pass. A peer would be PyTorch's min-cut partitioner, which has no memory budget
//! to compare at; the figures stand on their own. Figures go in docs/perf.md.
//!
//! The graphs:
//! - chain N: N layers of matmul + bias + tanh, batch 64, width 256 (64 KiB activations);
//! - residual: 32 blocks `x + W2 relu(W1 x + b)`, batch 64, width 256;
//! - transformer: 8 blocks of single-head attention and a 4x MLP with gelu, each behind a
//!   layer norm, with residual adds; batch 4, 128 tokens, width 128;
//! - unet: a dense U-Net, 3 layers a level, widths 256 -> 16 and back over 5 levels, batch
//!   4096, each decoder level adding the encoder output of its width (the skips go around
//!   every value in the middle).
//!
//! Then the pass time alone (grad excluded) on chains of elementwise layers with 10^3, 10^4
//! and 10^5 forward ops.
//!
//! `cargo bench --bench remat -- --exact` (a few minutes) measures the budget search against
//! the exact optimum of remat's plans (`remat::exact`) on smaller versions of the graphs.

#[path = "common/graphs.rs"]
mod graphs;
#[path = "common/models.rs"]
mod models;

use graphs::{chain, residual, transformer, unet};

use std::fmt::Write;
use std::time::Instant;
use tcc::ir::{Function, Module, parse_function};
use tcc::passes::analysis::cost::flops;
use tcc::passes::analysis::memory::{analyze, human};
use tcc::passes::remat::{Budget, Goal, Space, Strategy, choose, exact, fit, remat};
use tcc::passes::{PassManager, Pipeline};

/// A chain of `n` elementwise layers (mul by a weight, tanh): 2n forward ops.
fn long_chain(n: usize) -> String {
    let mut s = String::from("func @long(%x: f32[16]");
    for i in 0..n {
        write!(s, ", %w{i}: f32[16]").unwrap();
    }
    s += ") -> (f32[]) {\n";
    let mut prev = "%x".to_string();
    for i in 0..n {
        writeln!(s, "  %m{i} = mul {prev}, %w{i} : f32[16]").unwrap();
        writeln!(s, "  %t{i} = tanh %m{i} : f32[16]").unwrap();
        prev = format!("%t{i}");
    }
    writeln!(s, "  %loss = reduce_sum {prev} {{axes=[0]}} : f32[]").unwrap();
    s + "  return %loss\n}\n"
}

fn joint(src: &str) -> (Function, Function) {
    let f = parse_function(src).unwrap();
    let mut m = Module::new();
    m.functions.push(f.clone());
    PassManager::new(Pipeline::parse("grad{wrt=params}").unwrap())
        .run(&mut m, &mut std::io::sink())
        .unwrap();
    (f, m.functions.remove(0))
}

/// Peak, extra FLOPs and seconds of one strategy, or its error.
fn run(joint: &Function, s: &Strategy) -> Result<(u64, u64, f64), String> {
    let mut g = joint.clone();
    let t = Instant::now();
    let c = choose(&g, s)?;
    let stats = remat(&mut g, &c)?;
    let secs = t.elapsed().as_secs_f64();
    Ok((analyze(&g).temps_peak.0, stats.extra_flops, secs))
}

/// One graph's table; `act` is the bytes of one layer's activation, `layers` its depth.
fn table(name: &str, src: &str, act: u64, layers: usize) {
    let (f, joint) = joint(src);
    let fwd: u64 = f.schedule().iter().map(|&op| flops(&f, op)).sum();
    let base = analyze(&joint).temps_peak.0;
    println!(
        "\n{name}: {} forward ops, {} with gradients; forward {:.3} GFLOP",
        f.schedule().len(),
        joint.schedule().len(),
        fwd as f64 / 1e9
    );
    println!(
        "  {:<22} {:>11} {:>7} {:>8} {:>10} {:>9}",
        "checkpoints", "peak", "% peak", "layers", "extra fwd", "pass ms"
    );
    let row = |label: &str, r: Result<(u64, u64, f64), String>| match r {
        Ok((peak, extra, secs)) => println!(
            "  {label:<22} {:>11} {:>6.1}% {:>8.1} {:>10.3} {:>9.2}",
            human(peak),
            100.0 * peak as f64 / base as f64,
            peak as f64 / act as f64,
            extra as f64 / fwd as f64,
            secs * 1e3
        ),
        Err(e) => println!("  {label:<22} error: {}", e.lines().next().unwrap_or("")),
    };
    row("none", Ok((base, 0, 0.0)));
    row("strategy=speed", run(&joint, &Strategy::Speed));
    let memory = run(&joint, &Strategy::Memory { min_bytes: 0 });
    let sqrt_level = match &memory {
        Ok((peak, _, _)) => Budget::Bytes(*peak),
        Err(_) => Budget::Fraction((2.0 / (layers as f64).sqrt()).min(1.0)),
    };
    row("strategy=memory", memory);
    for (label, b) in [
        ("budget=50%", Budget::Fraction(0.5)),
        ("budget=25%", Budget::Fraction(0.25)),
        ("budget=sqrt level", sqrt_level),
    ] {
        row(label, run(&joint, &Strategy::Budget(b)));
    }
}

fn main() {
    if std::env::args().any(|a| a == "--jit") {
        return jit();
    }
    if std::env::args().any(|a| a == "--exact") {
        return gaps();
    }
    println!(
        "peak: activations and temporaries (analysis::memory temps_peak); layers: peak over one layer's activation; extra fwd: recomputed FLOPs over forward FLOPs"
    );
    for n in [16, 64, 256, 1024] {
        table(&format!("chain {n}"), &chain(n), 64 * 256 * 4, n);
    }
    table("residual 32", &residual(32), 64 * 256 * 4, 32);
    table("transformer 8", &transformer(8), 4 * 128 * 128 * 4, 8);
    table("unet 5x3", &unet(5), 4096 * 256 * 4, 27);
    println!("\npass time alone (ms, best of 3), chains of mul + tanh layers:");
    println!(
        "  {:>12} {:>14} {:>10} {:>10} {:>10}",
        "forward ops", "joint ops", "memory", "budget=50%", "budget=10%"
    );
    for n in [500, 5_000, 50_000] {
        let (f, joint) = joint(&long_chain(n));
        let time = |s: &Strategy| {
            (0..3)
                .map(|_| run(&joint, s).map(|r| r.2 * 1e3).unwrap_or(f64::NAN))
                .fold(f64::INFINITY, f64::min)
        };
        println!(
            "  {:>12} {:>14} {:>10.1} {:>10.1} {:>10.1}",
            f.schedule().len(),
            joint.schedule().len(),
            time(&Strategy::Memory { min_bytes: 0 }),
            time(&Strategy::Budget(Budget::Fraction(0.5))),
            time(&Strategy::Budget(Budget::Fraction(0.1))),
        );
    }
}

/// A VGG-like CNN: batch 32, 3x32x32 input, two 3x3 convolutions (+bias, relu) at each of 32,
/// 64 and 128 channels with 2x2 max pooling between, then a dense layer to 10 classes.
fn vgg() -> String {
    let mut s = String::from("func @vgg(%x: f32[32,3,32,32], %labels: i32[32]");
    let mut body = String::new();
    let (mut c, mut hw) = (3, 32);
    let mut prev = "%x".to_string();
    for (stage, oc) in [32, 64, 128].into_iter().enumerate() {
        for k in 0..2 {
            let p = format!("s{stage}c{k}");
            write!(s, ", %{p}/w: f32[{oc},{c},3,3], %{p}/b: f32[{oc}]").unwrap();
            let t = format!("f32[32,{oc},{hw},{hw}]");
            writeln!(
                body,
                "  %{p}/conv = conv2d {prev}, %{p}/w {{pads=[1,1,1,1]}} : {t}"
            )
            .unwrap();
            writeln!(
                body,
                "  %{p}/bias = reshape %{p}/b {{shape=[1,{oc},1,1]}} : f32[1,{oc},1,1]"
            )
            .unwrap();
            writeln!(body, "  %{p}/add = add %{p}/conv, %{p}/bias : {t}").unwrap();
            writeln!(body, "  %{p}/relu = relu %{p}/add : {t}").unwrap();
            prev = format!("%{p}/relu");
            c = oc;
        }
        hw /= 2;
        writeln!(body, "  %s{stage}/pool = max_pool2d {prev} {{kernel=[2,2], strides=[2,2]}} : f32[32,{c},{hw},{hw}]").unwrap();
        prev = format!("%s{stage}/pool");
    }
    let flat = c * hw * hw;
    write!(s, ", %fc/w: f32[{flat},10], %fc/b: f32[10]").unwrap();
    writeln!(
        body,
        "  %flat = reshape {prev} {{shape=[32,{flat}]}} : f32[32,{flat}]"
    )
    .unwrap();
    writeln!(body, "  %fc/mm = matmul %flat, %fc/w : f32[32,10]").unwrap();
    writeln!(body, "  %logits = add %fc/mm, %fc/b : f32[32,10]").unwrap();
    writeln!(
        body,
        "  %loss = softmax_cross_entropy %logits, %labels : f32[]"
    )
    .unwrap();
    s + ") -> (f32[]) {\n" + &body + "  return %loss\n}\n"
}

/// Trains `src` through the JIT for some SGD steps without and with `remat{spec}` from the same
/// start: the analysis peak and the compiled arena of each step function, whether the losses
/// are bit-identical, and the step times (best of interleaved runs).
fn jit_training(name: &str, src: &str, spec: &str) {
    use tcc::codegen::Executable;
    use tcc::ir::random::{Rng, random_tensor};
    use tcc::ir::{Data, Tensor};
    use tcc::passes::optim::Optimizer;
    let f = parse_function(src).unwrap();
    let data = ["x".to_string(), "labels".to_string()];
    let build = |remat: Option<&str>| {
        let remat = remat
            .map(tcc::passes::remat::Remat::parse)
            .transpose()
            .map_err(|e| e.message)?;
        let (step, _) =
            tcc_tools::train::train_step(&f, &data, Optimizer::Sgd { lr: 0.01 }, remat.as_ref())?;
        let exe = Executable::compile(&step).unwrap();
        Ok::<_, String>((step, exe))
    };
    let (base, base_exe) = build(None).unwrap();
    let (r, r_exe) = match build(Some(spec)) {
        Ok(x) => x,
        Err(e) => return println!("  {name:<5} {spec:<14} {e}"),
    };
    let mut rng = Rng::new(5);
    let start: Vec<Tensor> = base
        .params()
        .iter()
        .enumerate()
        .map(|(i, &p)| {
            let (name, ty) = (base.name(p), base.ty(p));
            match name {
                "labels" => Tensor::from_data(
                    ty.dims(),
                    Data::I32((0..ty.numel()).map(|_| rng.below(10) as i32).collect()),
                )
                .unwrap(),
                "x" => random_tensor(ty, &mut rng),
                _ => tcc_tools::train::init_value(name, ty, 7 + i as u64),
            }
        })
        .collect();
    // Both step functions take the same parameters in the same order.
    let train = |step: &Function, exe: &Executable| -> Vec<u32> {
        let mut inputs = start.clone();
        let next = tcc_tools::train::carried(step);
        (0..20)
            .map(|_| {
                let out = exe.run(&inputs).unwrap();
                let loss = out[0].as_f32().unwrap()[0].to_bits();
                for (input, n) in inputs.iter_mut().zip(&next) {
                    if let Some(n) = n {
                        *input = out[*n].clone();
                    }
                }
                loss
            })
            .collect()
    };
    let (la, lb) = (train(&base, &base_exe), train(&r, &r_exe));
    let time = |exe: &Executable| {
        let t = Instant::now();
        exe.run(&start).unwrap();
        t.elapsed().as_secs_f64()
    };
    let (mut ta, mut tb) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..15 {
        ta = ta.min(time(&base_exe));
        tb = tb.min(time(&r_exe));
    }
    let (pa, pb) = (analyze(&base).temps_peak.0, analyze(&r).temps_peak.0);
    let (aa, ab) = (base_exe.stats().arena_bytes, r_exe.stats().arena_bytes);
    println!(
        "  {name:<5} {spec:<14} {:>10} -> {:>10} ({:>5.1}%) {:>10} -> {:>10} ({:>5.1}%)  {:<9} {:>7.2} -> {:>7.2} ({:+.1}%)",
        human(pa),
        human(pb),
        100.0 * pb as f64 / pa as f64,
        human(aa),
        human(ab),
        100.0 * ab as f64 / aa as f64,
        if la == lb { "identical" } else { "DIFFER" },
        ta * 1e3,
        tb * 1e3,
        100.0 * (tb / ta - 1.0)
    );
}

fn jit() {
    println!(
        "JIT training, 20 SGD steps from the same start; peak: analysis temps_peak of the step function; arena: the compiled step's; step: best of 15, interleaved"
    );
    println!(
        "  {:<5} {:<14} {:>27} {:>27}  {:<9} {:>27}",
        "model", "remat", "analysis peak", "arena", "losses", "step ms"
    );
    for spec in ["budget=0.9", "budget=0.8", "strategy=memory"] {
        jit_training("cnn", models::CNN, spec);
    }
    let vgg = vgg();
    for spec in ["budget=0.75", "budget=0.6", "strategy=memory"] {
        jit_training("vgg", &vgg, spec);
    }
}

/// `--exact`: the budget search against the exact optimum of remat's plans (branch and bound,
/// `remat::exact`) on small graphs, at 50% and 25% of the peak without remat and at the lowest
/// peak the exact search finds. Recomputation in forward passes. Two exact spaces: the values
/// backward ops read (what the search chooses among) and all forward values; "stopped" where
/// the search hit its node limit (the plan is then the best it found, not proven optimal). The
/// gap is the budget search's recomputation over the best proven optimum (all forward values
/// where that search finished).
fn gaps() {
    const NODES: u64 = 20_000_000;
    println!(
        "{:<14} {:>4} {:>7} {:>8} {:>22} {:>22} {:>7} {:>8}",
        "graph", "ops", "budget", "search", "exact, values read", "exact, all forward", "gap", "ms"
    );
    for (name, src) in [
        ("chain 16", chain(16)),
        ("chain 24", chain(24)),
        ("residual 8", residual(8)),
        ("residual 16", residual(16)),
        ("transformer 1", transformer(1)),
        ("transformer 2", transformer(2)),
        ("unet 3x3", unet(3)),
        ("unet 4x3", unet(4)),
    ] {
        let (f, joint) = joint(&src);
        let fwd: u64 = f.schedule().iter().map(|&op| flops(&f, op)).sum();
        let passes = |x: u64| x as f64 / fwd as f64;
        let lowest = [Space::Read, Space::Forward]
            .map(|space| exact(&joint, Goal::LowestPeak, space, None, NODES).unwrap());
        let base = lowest[0].peak_before;
        let tight = lowest[0].peak.min(lowest[1].peak);
        let mut budgets: Vec<(String, u64)> = [0.5, 0.25]
            .iter()
            .map(|&x| {
                (
                    format!("{:.0}%", x * 100.0),
                    (base as f64 * x).floor() as u64,
                )
            })
            .collect();
        let proven = if lowest[1].proven { "" } else { "~" };
        budgets.push((
            format!("{proven}{:.1}%", 100.0 * tight as f64 / base as f64),
            tight,
        ));
        for (label, limit) in budgets {
            let t = Instant::now();
            let search = fit(&joint, Budget::Bytes(limit));
            let ms = t.elapsed().as_secs_f64() * 1e3;
            let hint = search.as_ref().ok().map(|s| s.checkpoints.clone());
            let e = [Space::Read, Space::Forward].map(|space| {
                exact(&joint, Goal::Cheapest(limit), space, hint.as_deref(), NODES).unwrap()
            });
            let cell = |e: &tcc::passes::remat::Exact| {
                let stopped = if e.proven { "" } else { " stopped" };
                match &e.checkpoints {
                    Some(_) => format!("{:.3}{stopped}", passes(e.extra_flops)),
                    None => format!("none{stopped}"),
                }
            };
            let reference = if e[1].proven { &e[1] } else { &e[0] };
            let gap = match (&search, &reference.checkpoints, reference.proven) {
                (Ok(s), Some(_), true) => {
                    let g = passes(s.extra_flops) - passes(reference.extra_flops);
                    let mark = if e[1].proven { "" } else { "r" };
                    format!("{g:+.3}{mark}")
                }
                (Err(_), Some(_), _) => "missed".into(),
                _ => "-".into(),
            };
            let se = match &search {
                Ok(s) => format!("{:.3}", passes(s.extra_flops)),
                Err(_) => "none".into(),
            };
            println!(
                "{name:<14} {:>4} {label:>7} {se:>8} {:>22} {:>22} {gap:>7} {ms:>8.1}",
                f.schedule().len(),
                cell(&e[0]),
                cell(&e[1]),
            );
        }
    }
}

//! Keep, recompute or swap (`offload`) against recomputation alone (`remat{budget}`) and
//! swapping alone (`offload{only=swap}`), on the remat benchmark's training graphs, at device
//! budgets of 50%, 25% and 10% of the peak without either and at the floor no plan goes below
//! (`remat::floor`), and links of 16 and 32 GB/s.
//!
//! `cargo bench --bench offload` (a few minutes). For each plan: the device peak reached
//! (activations and temporaries, `analysis::memory`), the predicted overhead over the step
//! without offloading (`analysis::timeline`: compute at the time model's rates, copies over the
//! link, stalls where a reader waits for its swap-in), and the pass's time; per graph, the floor
//! no plan of keeping, recomputing and swapping goes below (`remat::floor`), and since no plan
//! is faster than the step without offloading, a plan's predicted overhead bounds its gap to
//! the optimum. Then, for the
//! joint plans of the smaller graphs, the measured step time of the CPU runtime over the
//! simulated link (`Cpu::link_bandwidth`) against the step without offloading, with the copies
//! on the copy thread and inline (`Cpu::copies`; medians of 25 runs each, interleaved). Last, the pass's time alone on chains of 10^3
//! and 10^4 forward ops against `remat{budget}`'s (`-- --scale 33333`: 10^5, once).
//! `-- --exact`: instead, the remat-only plans against the exact search over remat's plans. The peer is the remat pass; PyTorch has
//! no planner with a budget to run here. Figures go in docs/perf.md.

#[path = "common/graphs.rs"]
mod graphs;

use graphs::{chain, residual, transformer, unet};
use std::time::Instant;
use tcc::codegen::Executable;
use tcc::ir::random::{Rng, random_tensor};
use tcc::ir::{Function, Module, Tensor, parse_function};
use tcc::passes::analysis::cost::Machine;
use tcc::passes::analysis::memory::{analyze, human};
use tcc::passes::analysis::timeline::timeline;
use tcc::passes::{Options, PassManager, Pipeline};

fn joint(src: &str) -> Function {
    let mut m = Module::new();
    m.functions.push(parse_function(src).unwrap());
    PassManager::new(Pipeline::parse("grad{wrt=params}").unwrap())
        .run(&mut m, &mut std::io::sink())
        .unwrap();
    m.functions.remove(0)
}

/// The plan of `pass{options}` on `joint`: the function, its peak, predicted time at `link`
/// GB/s, and the pass's seconds; or the error's first line.
fn plan(
    joint: &Function,
    pass: &str,
    options: &str,
    link: f64,
) -> Result<(Function, u64, f64, f64), String> {
    let mut g = joint.clone();
    let t0 = Instant::now();
    match pass {
        "remat" => {
            let r = tcc::passes::remat::Remat::parse(options).map_err(|e| e.message)?;
            r.run(&mut g)?;
        }
        _ => {
            let o = Options::parse_for("offload", options).map_err(|e| e.message)?;
            tcc::passes::offload::options(&o)?.run(&mut g)?;
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let t = timeline(&g, &Machine::DEFAULT, link).total;
    Ok((analyze(&g).temps_peak.0, t, secs)).map(|(p, t, s)| (g, p, t, s))
}

fn inputs(f: &Function) -> Vec<Tensor> {
    let mut rng = Rng::new(1);
    f.params()
        .iter()
        .map(|&p| random_tensor(f.ty(p), &mut rng))
        .collect()
}

/// The median of `rounds` runs of each, interleaved: the step without offloading, and with, on
/// the CPU runtime over a simulated `link` GB/s, the copies on the copy thread and inline
/// (`Copying`).
fn measure(base: &Function, planned: &Function, link: f64, rounds: usize) -> [f64; 3] {
    let x = inputs(base);
    let a = Executable::compile(base).unwrap();
    let with = |copies| {
        let cpu = tcc::codegen::Cpu {
            link_bandwidth: Some(link * 1e9),
            copies,
            ..Default::default()
        };
        tcc::codegen::compile(&cpu, planned).unwrap()
    };
    let exes = [
        a,
        with(tcc::codegen::Copying::Thread),
        with(tcc::codegen::Copying::Inline),
    ];
    // One run of each in turn, `rounds` times (the VM's slow phases then hit all three alike);
    // the medians.
    let mut times = [const { Vec::new() }; 3];
    for _ in 0..rounds {
        for (t, e) in times.iter_mut().zip(&exes) {
            let start = Instant::now();
            e.run(&x).unwrap();
            t.push(start.elapsed().as_secs_f64());
        }
    }
    times.map(|mut t| {
        t.sort_by(f64::total_cmp);
        t[t.len() / 2]
    })
}

fn main() {
    // `-- --scale N`: only the pass times on a chain of N layers, once.
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--scale") {
        let layers: usize = args
            .get(i + 1)
            .and_then(|n| n.parse().ok())
            .unwrap_or(33_333);
        return scale(&[layers], 1);
    }
    println!(
        "peak: device activations and temporaries; overhead: predicted step over the step without offloading (time model, copies over the link)"
    );
    let graphs = [
        ("chain 64", chain(64), true),
        ("residual 32", residual(32), true),
        ("transformer 8", transformer(8), true),
        ("unet 5x3", unet(5), false),
    ];
    for (name, src, measured) in &graphs {
        let j = joint(src);
        if args.iter().any(|a| a == "--exact") {
            println!("\n{name}:");
            remat_gaps(&j);
            continue;
        }
        let base_peak = analyze(&j).temps_peak.0;
        let base_time = timeline(&j, &Machine::DEFAULT, 16.0).total;
        let floor = tcc::passes::remat::floor(&j).unwrap();
        println!(
            "\n{name}: {} ops with gradients; peak {}; floor {} ({:.1}%); predicted step {:.3} ms",
            j.schedule().len(),
            human(base_peak),
            human(floor),
            100.0 * floor as f64 / base_peak as f64,
            base_time * 1e3
        );
        println!(
            "  {:<8} {:>6}  {:>22} {:>22} {:>22}  {:>24}",
            "budget", "link", "remat only", "swap only", "joint", "ms: none -> thread / inline"
        );
        // The three fractions, then the floor itself (in bytes).
        let floor_budget = floor.to_string();
        for budget in ["50%", "25%", "10%", &floor_budget] {
            for link in [16.0, 32.0] {
                let cell = |r: &Result<(Function, u64, f64, f64), String>| match r {
                    Ok((_, p, t, s)) => format!(
                        "{:>9} {:>+6.1}% {:>4.0}ms",
                        human(*p),
                        100.0 * (t / base_time - 1.0),
                        s * 1e3
                    ),
                    // The offload pass says the lowest peak it reached.
                    Err(e) if e.contains("reached is ") => {
                        let low = e.split("reached is ").nth(1).unwrap_or("");
                        format!("none; lowest {}", low.split(" (").next().unwrap_or(""))
                    }
                    Err(e) if e.contains("lowest") || e.contains("below the smallest") => {
                        "infeasible".to_string()
                    }
                    Err(e) => format!("error: {}", &e[..e.len().min(14)]),
                };
                let remat = plan(&j, "remat", &format!("budget={budget}"), link);
                let swap = plan(
                    &j,
                    "offload",
                    &format!("budget={budget},link={link}GB/s,only=swap"),
                    link,
                );
                let both = plan(
                    &j,
                    "offload",
                    &format!("budget={budget},link={link}GB/s"),
                    link,
                );
                let meas = match (&both, measured) {
                    (Ok((g, ..)), true) => {
                        let [a, t, i] = measure(&j, g, link, 25);
                        format!("{:.2} -> {:.2} / {:.2}", a * 1e3, t * 1e3, i * 1e3)
                    }
                    _ => String::new(),
                };
                let label = if budget == floor_budget {
                    "floor"
                } else {
                    budget
                };
                println!(
                    "  {label:<8} {:>4}GB  {:>22} {:>22} {:>22}  {meas:>24}",
                    link,
                    cell(&remat),
                    cell(&swap),
                    cell(&both)
                );
            }
        }
    }
    if !args.iter().any(|a| a == "--exact") {
        scale(&[333, 3_333], 3);
    }
}

/// `remat{budget}`'s plans against the exact search over remat's plans (`remat::exact`, two
/// million nodes per space) at each budget: extra forward passes of recomputation, "proven"
/// where the exact search finished.
fn remat_gaps(j: &Function) {
    use tcc::passes::remat::{Budget, Exact, Goal, Space, exact, fit};
    let b = j.backward_position().unwrap();
    let fwd: u64 = (j.schedule()[..b].iter())
        .map(|&op| tcc::passes::analysis::cost::flops(j, op))
        .sum();
    let base = analyze(j).temps_peak.0;
    let cell = |e: &Exact| {
        let how = if e.proven { "proven" } else { "stopped" };
        match e.checkpoints {
            Some(_) => format!("{:.3} {how}", e.extra_flops as f64 / fwd as f64),
            None => format!("none {how}"),
        }
    };
    for x in [0.5, 0.25, 0.1] {
        let limit = (base as f64 * x).floor() as u64;
        let search = fit(j, Budget::Bytes(limit));
        let hint = search.as_ref().ok().map(|s| s.checkpoints.clone());
        let e = [Space::Read, Space::Forward].map(|space| {
            exact(j, Goal::Cheapest(limit), space, hint.as_deref(), 2_000_000).unwrap()
        });
        println!(
            "  remat only at {:.0}%, extra forward passes: search {}, exact over values read {}, over all forward values {}",
            x * 100.0,
            search.map_or("none".to_string(), |s| format!(
                "{:.3}",
                s.extra_flops as f64 / fwd as f64
            )),
            cell(&e[0]),
            cell(&e[1])
        );
    }
}

/// The pass times alone on chains of `layers` layers (matmul + add + tanh: three forward ops
/// each), budget 50%, 16 GB/s: the best of `rounds`.
fn scale(layers: &[usize], rounds: usize) {
    println!(
        "\npass time alone (ms, best of {rounds}) on chains of matmul + add + tanh layers, budget 50%, 16 GB/s:"
    );
    println!(
        "  {:>12} {:>12} {:>10} {:>10}",
        "forward ops", "joint ops", "offload", "remat"
    );
    for &n in layers {
        let src = chain(n);
        let f = parse_function(&src).unwrap();
        let j = joint(&src);
        let time = |pass: &str, options: &str| {
            (0..rounds)
                .map(|_| {
                    plan(&j, pass, options, 16.0)
                        .map(|r| r.3 * 1e3)
                        .unwrap_or(f64::NAN)
                })
                .fold(f64::INFINITY, f64::min)
        };
        println!(
            "  {:>12} {:>12} {:>10.1} {:>10.1}",
            f.schedule().len(),
            j.schedule().len(),
            time("offload", "budget=50%,link=16GB/s"),
            time("remat", "budget=50%")
        );
    }
}

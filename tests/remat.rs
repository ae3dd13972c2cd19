//! `remat`: the rematerialized function gives bit-identical results and gradients (interpreter
//! and compiled code), verifies, and holds fewer activation bytes across the backward pass.

mod common;

use tcc::codegen::Executable;
use tcc::ir::random::{Rng, random_tensor};
use tcc::ir::{Function, Tensor, parse_function};
use tcc::passes::analysis::memory::analyze;
use tcc::passes::{PassManager, Pipeline};

/// A chain of `n` dense + tanh layers, every fourth activation in a `checkpoint` scope.
fn chain(n: usize) -> String {
    let mut s = String::from("func @chain(%x: f32[16,32]");
    for i in 0..n {
        s += &format!(", %w{i}: f32[32,32]");
    }
    s += ") -> (f32[]) {\n";
    let mut prev = "%x".to_string();
    for i in 0..n {
        let act = if i % 4 == 3 {
            format!("%l{i}/checkpoint")
        } else {
            format!("%l{i}/act")
        };
        s += &format!("  %l{i}/mm = matmul {prev}, %w{i} : f32[16,32]\n");
        s += &format!("  {act} = tanh %l{i}/mm : f32[16,32]\n");
        prev = act;
    }
    s += &format!("  %loss = reduce_mean {prev} {{axes=[0,1]}} : f32[]\n  return %loss\n}}\n");
    s
}

fn run_pipeline(f: &Function, pipeline: &str) -> Function {
    let mut m = tcc::ir::Module::new();
    m.functions.push(f.clone());
    let mut pm = PassManager::new(Pipeline::parse(pipeline).unwrap());
    pm.verify_each = true;
    pm.run(&mut m, &mut std::io::sink()).unwrap();
    m.functions.remove(0)
}

fn bits(ts: &[Tensor]) -> Vec<Vec<u32>> {
    ts.iter()
        .map(|t| t.as_f32().unwrap().iter().map(|x| x.to_bits()).collect())
        .collect()
}

fn check(src: &str, strategy: &str, expect_smaller: bool) {
    let f = parse_function(src).unwrap();
    let joint = run_pipeline(&f, "grad{wrt=params}");
    let r = run_pipeline(&joint, strategy);
    tcc::ir::verify_function(&r).unwrap();
    let mut rng = Rng::new(3);
    let inputs: Vec<Tensor> = f
        .params()
        .iter()
        .map(|&p| random_tensor(f.ty(p), &mut rng))
        .collect();
    let a = tcc::ir::interp::run(&joint, &inputs).unwrap();
    let b = tcc::ir::interp::run(&r, &inputs).unwrap();
    assert_eq!(bits(&a), bits(&b), "{strategy}: interpreter results differ");
    let ja = Executable::compile(&joint).unwrap().run(&inputs).unwrap();
    let jb = Executable::compile(&r).unwrap().run(&inputs).unwrap();
    assert_eq!(bits(&ja), bits(&jb), "{strategy}: compiled results differ");
    let (before, after) = (analyze(&joint).temps_peak.0, analyze(&r).temps_peak.0);
    if expect_smaller {
        assert!(after < before, "{strategy}: peak {before} -> {after}");
    } else {
        assert!(after <= before, "{strategy}: peak {before} -> {after}");
    }
}

#[test]
fn every_strategy_keeps_results_bit_identical() {
    let src = chain(16);
    check(&src, "remat{strategy=collection}", true);
    check(&src, "remat{names=[l5/act,l10/act]}", true);
    check(&src, "remat{strategy=memory}", true);
    check(&src, "remat{strategy=memory,min-bytes=1024}", true);
    // On a dense+tanh chain keeping the matmul outputs saves nothing (tanh's gradient needs its
    // output, recomputed from them), but it must still be exact.
    check(&src, "remat{strategy=speed}", false);
    // Clean-up after remat does not undo it: cse keeps the pinned copies apart.
    check(&src, "remat{strategy=collection},cse,dce", true);
    check(&src, "remat{budget=0.5}", true);
    check(&src, "remat{budget=60%}", true);
}

/// The budget mode meets its budget, costs no more than the `memory` strategy at the peak that
/// strategy reaches, and when a budget cannot be met names a peak it can reach.
#[test]
fn budgets_are_met_for_the_least_recomputation() {
    use tcc::passes::remat::{Budget, Strategy, choose, fit, remat};
    let f = parse_function(&chain(32)).unwrap();
    let joint = run_pipeline(&f, "grad{wrt=params}");
    let base = analyze(&joint).temps_peak.0;
    let mut last_extra = 0;
    for frac in [0.75, 0.5, 0.4] {
        let fit = fit(&joint, Budget::Fraction(frac)).unwrap();
        let mut g = joint.clone();
        let stats = remat(&mut g, &fit.checkpoints).unwrap();
        let peak = analyze(&g).temps_peak.0;
        assert_eq!((fit.peak_before, fit.peak_after), (base, peak));
        assert!(
            peak as f64 <= frac * base as f64,
            "{frac}: {base} -> {peak}"
        );
        assert_eq!(stats.extra_flops, fit.extra_flops);
        // Tighter budgets cost more recomputation.
        assert!(fit.extra_flops > last_extra, "{frac}: {}", fit.extra_flops);
        last_extra = fit.extra_flops;
    }
    let mut g = joint.clone();
    let memory = remat(
        &mut g,
        &choose(&joint, &Strategy::Memory { min_bytes: 0 }).unwrap(),
    )
    .unwrap();
    let memory_peak = analyze(&g).temps_peak.0;
    let fit = fit(&joint, Budget::Bytes(memory_peak)).unwrap();
    assert!(fit.peak_after <= memory_peak);
    assert!(
        fit.extra_flops <= memory.extra_flops,
        "{} > {}",
        fit.extra_flops,
        memory.extra_flops
    );
    // One byte cannot be met; the error names the smallest peak found, which can be met.
    let e = tcc::passes::remat::fit(&joint, Budget::Bytes(1)).unwrap_err();
    assert!(e.contains("below the smallest peak remat found"), "{e}");
    let reachable: u64 = e
        .split(" bytes")
        .nth(1)
        .and_then(|s| s.rsplit('(').next())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("no peak in: {e}"));
    assert!(reachable <= memory_peak, "{e}");
    let fit = tcc::passes::remat::fit(&joint, Budget::Bytes(reachable)).unwrap();
    assert!(fit.peak_after <= reachable);
}

/// A residual block stack `x + W2 relu(W1 x)`, batch 8, width 16.
fn residual(n: usize) -> String {
    common::residual_stack(n, 8, 16)
}

/// The budget search against the exact optimum (branch and bound over every set of kept forward
/// values) on small chains and residual stacks, from the lowest peak any plan reaches to 75% of
/// the peak without remat: where a plan exists the search finds one, within 5% of a forward
/// pass of the optimum's recomputation; where none exists, its error says so.
#[test]
fn the_budget_search_is_near_the_exact_optimum() {
    use tcc::passes::analysis::cost::flops;
    use tcc::passes::remat::{Budget, Goal, Space, exact, fit};
    let mut compared = 0;
    for src in [chain(12), residual(6)] {
        let f = parse_function(&src).unwrap();
        let fwd: u64 = f.schedule().iter().map(|&op| flops(&f, op)).sum();
        let joint = run_pipeline(&f, "grad{wrt=params}");
        let lowest = exact(&joint, Goal::LowestPeak, Space::Forward, None, u64::MAX).unwrap();
        assert!(lowest.proven);
        let base = lowest.peak_before;
        assert!(lowest.peak < base * 3 / 4, "{} of {base}", lowest.peak);
        let e = fit(&joint, Budget::Bytes(lowest.peak - 1)).unwrap_err();
        assert!(e.contains("no choice of checkpoints fits"), "{e}");
        for q in 0..6 {
            let limit = lowest.peak + q * (base * 3 / 4 - lowest.peak) / 5;
            let best = exact(
                &joint,
                Goal::Cheapest(limit),
                Space::Forward,
                None,
                u64::MAX,
            )
            .unwrap();
            assert!(best.proven);
            let found =
                fit(&joint, Budget::Bytes(limit)).unwrap_or_else(|e| panic!("{limit}: {e}"));
            assert!(found.peak_after <= limit);
            let gap = (found.extra_flops as f64 - best.extra_flops as f64) / fwd as f64;
            assert!((0.0..=0.05).contains(&gap), "{limit}: gap {gap}");
            compared += 1;
        }
    }
    assert_eq!(compared, 12);
    // Past its size limit the exact search says so.
    let mut long = String::from("func @long(%x: f32[4], %w: f32[4]) -> (f32[]) {\n");
    let mut prev = "%x".to_string();
    for i in 0..2100 {
        long += &format!("  %m{i} = mul {prev}, %w : f32[4]\n  %t{i} = tanh %m{i} : f32[4]\n");
        prev = format!("%t{i}");
    }
    long += &format!("  %l = reduce_sum {prev} {{axes=[0]}} : f32[]\n  return %l\n}}\n");
    let joint = run_pipeline(&parse_function(&long).unwrap(), "grad{wrt=params}");
    let e = exact(&joint, Goal::LowestPeak, Space::Read, None, 10).unwrap_err();
    assert!(e.contains("at most 4096 forward ops"), "{e}");
}

#[test]
fn the_peak_falls_to_about_the_checkpoints() {
    let f = parse_function(&chain(16)).unwrap();
    let joint = run_pipeline(&f, "grad{wrt=params}");
    let r = run_pipeline(&f, "grad{wrt=params},remat{strategy=collection}");
    let (before, after) = (analyze(&joint).temps_peak.0, analyze(&r).temps_peak.0);
    // Each activation is 2 KiB. Without remat the 16 tanh outputs are held into the backward
    // pass (tanh's gradient reads its output, and each weight gradient the layer's input; the
    // matmul outputs die in the forward pass): 19 tensors at the peak with the backward
    // temporaries. With 4 checkpoints, the 4 of them, one recomputed segment (at most 3 more
    // activations) and the temporaries: 9 at the time of writing.
    assert!(before >= 16 * 2048, "{before}");
    assert!(after <= 10 * 2048, "{before} -> {after}");
}

#[test]
fn errors_say_what_to_do() {
    let f = parse_function(&chain(2)).unwrap();
    let mut m = tcc::ir::Module::new();
    m.functions.push(f);
    let e = PassManager::new(Pipeline::parse("remat{strategy=speed}").unwrap())
        .run(&mut m, &mut std::io::sink())
        .unwrap_err()
        .to_string();
    assert!(e.contains("run `grad` first"), "{e}");
    let e = Pipeline::parse("remat{strategy=fastest}")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("valid strategies are collection, memory, speed"),
        "{e}"
    );
    let e = Pipeline::parse("remat").unwrap_err().to_string();
    assert!(
        e.contains("strategy=collection|memory|speed, names=[...] or budget="),
        "{e}"
    );
    let e = Pipeline::parse("remat{strategy=budget}")
        .unwrap_err()
        .to_string();
    assert!(e.contains("as budget=BYTES or budget=FRACTION"), "{e}");
    for (bad, says) in [
        ("remat{budget=0.5,strategy=speed}", "give one of"),
        ("remat{budget=64MB}", "is neither bytes"),
        ("remat{budget=1.5}", "fraction in (0, 1]"),
        ("remat{names=[a],min-bytes=4}", "strategy=memory only"),
    ] {
        let e = Pipeline::parse(bad).unwrap_err().to_string();
        assert!(e.contains(says), "{bad}: {e}");
    }
}

#[test]
fn bottlenecks_are_found_in_one_sweep() {
    // A residual block: inside it the skip path goes around every value, so only the block's
    // input and output separate the graph.
    let src = "func @f(%x: f32[4,8], %w: f32[8,8]) -> (f32[]) {
  %in = tanh %x : f32[4,8]
  %a = matmul %in, %w : f32[4,8]
  %b = tanh %a : f32[4,8]
  %out = add %in, %b : f32[4,8]
  %loss = reduce_sum %out {axes=[0,1]} : f32[]
  return %loss
}";
    let f = parse_function(src).unwrap();
    let n = f.schedule().len();
    let names: Vec<&str> = tcc::passes::remat::bottlenecks(&f, n)
        .into_iter()
        .map(|v| f.name(v))
        .collect();
    assert_eq!(names, ["in", "out"]);
    // U-Net-like: the first activation is read again just before the loss, so nothing in
    // between separates the inputs from the loss; only the two ends do.
    let unet = "func @u(%x: f32[8], %w: f32[8]) -> (f32[]) {
  %e = mul %x, %w : f32[8]
  %a = tanh %e : f32[8]
  %b = exp %a : f32[8]
  %c = tanh %b : f32[8]
  %d = add %c, %e : f32[8]
  %loss = reduce_sum %d {axes=[0]} : f32[]
  return %loss
}";
    let f = parse_function(unet).unwrap();
    let n = f.schedule().len();
    let names: Vec<&str> = tcc::passes::remat::bottlenecks(&f, n)
        .into_iter()
        .map(|v| f.name(v))
        .collect();
    assert_eq!(names, ["e", "d"]);
    // With every candidate under the size threshold there is none to keep: the error says so
    // and what to do instead.
    let mut m = tcc::ir::Module::new();
    m.functions.push(f);
    let p = Pipeline::parse("grad{wrt=[w]},remat{strategy=memory,min-bytes=33}").unwrap();
    let e = PassManager::new(p)
        .run(&mut m, &mut std::io::sink())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("no bottleneck tensor") && e.contains("names=[...]") && e.contains("budget="),
        "{e}"
    );
}

/// Training through the JIT with `remat{budget=...}` on the step (what `tcc train --remat`
/// does): the same losses bit for bit, and a smaller arena.
#[test]
fn training_with_a_budget_keeps_the_losses_and_shrinks_the_arena() {
    use tcc::ir::Data;
    use tcc::passes::optim::Optimizer;
    let src = std::fs::read_to_string("examples/digits_cnn.tir").unwrap();
    let f = parse_function(&src).unwrap();
    let data = ["x".to_string(), "labels".to_string()];
    let build = |remat| {
        let (step, _) =
            tcc_tools::train::train_step(&f, &data, Optimizer::Sgd { lr: 0.01 }, remat).unwrap();
        let exe = Executable::compile(&step).unwrap();
        (step, exe)
    };
    let (base, base_exe) = build(None);
    // The typed constructor, as an embedder writes it; `tcc train --remat budget=0.8` parses to
    // the same pass.
    let typed = tcc::passes::remat::Remat::budget(0.8);
    assert_eq!(
        tcc::passes::remat::Remat::parse("budget=0.8").unwrap(),
        typed
    );
    let (r, r_exe) = build(Some(&typed));
    assert!(analyze(&r).temps_peak.0 as f64 <= 0.8 * analyze(&base).temps_peak.0 as f64);
    let (a, b) = (base_exe.stats().arena_bytes, r_exe.stats().arena_bytes);
    assert!(b < a, "arena {a} -> {b}");
    let mut rng = Rng::new(9);
    let start: Vec<Tensor> = base
        .params()
        .iter()
        .map(|&p| match base.name(p) {
            "labels" => {
                Tensor::from_data(&[64], Data::I32((0..64).map(|i| i % 10).collect())).unwrap()
            }
            name => {
                let t = random_tensor(base.ty(p), &mut rng);
                if name == "x" {
                    t
                } else {
                    tcc_tools::train::init_value(name, base.ty(p), 3)
                }
            }
        })
        .collect();
    let losses = |step: &Function, exe: &Executable| -> Vec<u32> {
        let mut inputs = start.clone();
        let next = tcc_tools::train::carried(step);
        (0..4)
            .map(|_| {
                let out = exe.run(&inputs).unwrap();
                for (input, k) in inputs.iter_mut().zip(&next) {
                    if let Some(k) = k {
                        *input = out[*k].clone();
                    }
                }
                out[0].as_f32().unwrap()[0].to_bits()
            })
            .collect()
    };
    let (la, lb) = (losses(&base, &base_exe), losses(&r, &r_exe));
    assert_eq!(la, lb);
    // The loss moves: the steps really train.
    assert_ne!(la[0], la[3]);
}

/// In a pipeline, `remat` notes what it kept and recomputed and, with a budget, the peaks and
/// which candidate of the search won (`tcc mem --passes` and `tcc opt --time-passes` print it).
#[test]
fn the_pass_notes_its_plan() {
    let f = parse_function(&chain(8)).unwrap();
    for (pipeline, says) in [
        ("grad{wrt=params},remat{budget=0.6}", "chosen by"),
        ("grad{wrt=params},remat{strategy=memory}", "strategy=memory"),
        ("grad{wrt=params},remat{names=[l1/]}", "names=[l1/]"),
    ] {
        let mut m = tcc::ir::Module::new();
        m.functions.push(f.clone());
        let runs = PassManager::new(Pipeline::parse(pipeline).unwrap())
            .run(&mut m, &mut std::io::sink())
            .unwrap();
        let notes = &runs.last().unwrap().notes;
        assert_eq!(notes.len(), 1, "{pipeline}");
        let n = &notes[0];
        assert!(
            n.starts_with("@chain: ") && n.contains("ops recomputed") && n.contains(says),
            "{n}"
        );
    }
}

//! `swap`: the swapped function gives bit-identical results and gradients (interpreter and
//! compiled code), verifies, places each swap where the pass says (a swap-out right after the
//! value's last forward reader, each swap-in right after its trigger and before its reader),
//! and holds fewer device bytes across the backward pass; bad options say what is wrong.

mod common;

use tcc::codegen::Executable;
use tcc::ir::random::random_function;
use tcc::ir::{Function, Module, OpKind, Tensor, parse_function};
use tcc::passes::analysis::memory::analyze;
use tcc::passes::{PassManager, Pipeline};

/// A chain of `n` dense + tanh layers.
fn chain(n: usize) -> String {
    let mut s = String::from("func @chain(%x: f32[16,32]");
    for i in 0..n {
        s += &format!(", %w{i}: f32[32,32]");
    }
    s += ") -> (f32[]) {\n";
    let mut prev = "%x".to_string();
    for i in 0..n {
        s += &format!("  %l{i}/mm = matmul {prev}, %w{i} : f32[16,32]\n");
        s += &format!("  %l{i}/act = tanh %l{i}/mm : f32[16,32]\n");
        prev = format!("%l{i}/act");
    }
    s += &format!("  %loss = reduce_mean {prev} {{axes=[0,1]}} : f32[]\n  return %loss\n}}\n");
    s
}

fn run_pipeline(f: &Function, pipeline: &str) -> Result<Function, String> {
    let mut m = Module::new();
    m.functions.push(f.clone());
    let mut pm = PassManager::new(Pipeline::parse(pipeline).map_err(|e| e.to_string())?);
    pm.verify_each = true;
    pm.run(&mut m, &mut std::io::sink())
        .map_err(|e| e.to_string())?;
    Ok(m.functions.remove(0))
}

fn bits(ts: &[Tensor]) -> Vec<Vec<u32>> {
    ts.iter()
        .map(|t| t.as_f32().unwrap().iter().map(|x| x.to_bits()).collect())
        .collect()
}

fn inputs(f: &Function, seed: u64) -> Vec<Tensor> {
    common::random_inputs(f, seed)
}

/// Every swap where the pass puts it: a swap-out right after the op it depends on (the value's
/// last near forward reader) or its producer, every swap-in right after its trigger, which is
/// after the swap-out, and before each of its readers, and no backward op reading a swapped
/// value itself.
fn check_placement(f: &Function) {
    let pos = f.positions();
    let at = |op| pos[op].unwrap() as usize;
    let b = f.backward_position().unwrap();
    let sched = f.schedule();
    for (i, &op) in sched.iter().enumerate() {
        let d = f.op(op);
        match d.kind {
            OpKind::SwapOut => {
                let anchor = d
                    .deps
                    .first()
                    .copied()
                    .unwrap_or_else(|| f.def_op(d.args[0]).unwrap());
                assert!(
                    i < b,
                    "{}: a swap-out in the backward part",
                    f.describe_op(op)
                );
                // Right after its anchor, other swap-outs anchored there aside.
                assert!(
                    sched[at(anchor) + 1..i]
                        .iter()
                        .all(|&o| f.op(o).kind == OpKind::SwapOut),
                    "{} is not right after {}",
                    f.describe_op(op),
                    f.describe_op(anchor)
                );
                let v = d.args[0];
                for &o in &sched[b..] {
                    assert!(
                        !f.op(o).args.contains(&v) || f.op(o).kind == OpKind::SwapOut,
                        "{} reads the swapped value itself",
                        f.describe_op(o)
                    );
                }
            }
            OpKind::SwapIn => {
                // After its host value's swap-out (in the backward part, or in the forward part
                // for a far forward reader), and before it.
                let trigger = d.deps[0];
                let out = f.def_op(d.args[0]).unwrap();
                assert!(at(trigger) > at(out) && at(trigger) < i);
                assert!(
                    sched[at(trigger) + 1..i]
                        .iter()
                        .all(|&o| f.op(o).kind == OpKind::SwapIn),
                    "{} is not right after its trigger",
                    f.describe_op(op)
                );
                let r = d.results[0];
                assert!(
                    sched.iter().any(|&o| f.op(o).args.contains(&r)),
                    "an unread swap-in"
                );
            }
            _ => {}
        }
    }
}

#[test]
fn swapping_keeps_results_bit_identical_and_frees_device_memory() {
    let f = parse_function(&chain(12)).unwrap();
    let joint = run_pipeline(&f, "grad{wrt=params}").unwrap();
    let x = inputs(&f, 3);
    let want = tcc::ir::interp::run(&joint, &x).unwrap();
    let jwant = Executable::compile(&joint).unwrap().run(&x).unwrap();
    let base = Executable::compile(&joint).unwrap().stats();
    let peak = analyze(&joint).temps_peak.0;
    for options in [
        "swap",
        "swap{order=direct}",
        "swap{fuse-swapins=true}",
        "swap{lb=2,ub=3}",
        "swap{n-tensors=4}",
        "swap{min-bytes=2KiB,exclude=[l0,l1]}",
        "swap{include=[l5/,l6/]}",
    ] {
        let s = run_pipeline(&joint, options).unwrap();
        check_placement(&s);
        let outs = s
            .schedule()
            .iter()
            .filter(|&&op| f_kind(&s, op) == OpKind::SwapOut)
            .count();
        assert!(outs > 0, "{options}: nothing swapped");
        let got = tcc::ir::interp::run(&s, &x).unwrap();
        assert_eq!(
            bits(&want),
            bits(&got),
            "{options}: interpreter results differ"
        );
        let exe = Executable::compile(&s).unwrap();
        assert_eq!(
            bits(&jwant),
            bits(&exe.run(&x).unwrap()),
            "{options}: compiled results differ"
        );
        let m = analyze(&s);
        assert!(
            m.temps_peak.0 < peak,
            "{options}: device peak {peak} -> {}",
            m.temps_peak.0
        );
        assert!(m.host_peak.0 > 0, "{options}: nothing in host memory");
        let st = exe.stats();
        assert!(
            st.arena_bytes < base.arena_bytes,
            "{options}: arena {} -> {}",
            base.arena_bytes,
            st.arena_bytes
        );
        assert!(st.host_bytes > 0);
    }
}

fn f_kind(f: &Function, op: tcc::ir::Op) -> OpKind {
    f.op(op).kind.clone()
}

#[test]
fn options_select_what_they_say() {
    let f = parse_function(&chain(12)).unwrap();
    let joint = run_pipeline(&f, "grad{wrt=params}").unwrap();
    let swapped = |options: &str| -> Vec<String> {
        let s = run_pipeline(&joint, options).unwrap();
        s.schedule()
            .iter()
            .filter(|&&op| f_kind(&s, op) == OpKind::SwapOut)
            .map(|&op| s.name(s.op(op).args[0]).to_string())
            .collect()
    };
    let all = swapped("swap");
    // Forward order, each value once; n-tensors takes the first.
    assert_eq!(swapped("swap{n-tensors=3}"), all[..3]);
    assert!(
        swapped("swap{include=[l5]}")
            .iter()
            .all(|n| n.starts_with("l5/"))
    );
    assert!(
        swapped("swap{exclude=[l5]}")
            .iter()
            .all(|n| !n.starts_with("l5/"))
    );
    // Every value here is 2 KiB.
    assert_eq!(swapped("swap{min-bytes=2KiB}"), all);
    // Fusing: each value has one swap-in per group of readers, never more than without.
    let count_ins = |options: &str| {
        let s = run_pipeline(&joint, options).unwrap();
        s.schedule()
            .iter()
            .filter(|&&op| f_kind(&s, op) == OpKind::SwapIn)
            .count()
    };
    assert!(count_ins("swap{fuse-swapins=true}") < count_ins("swap"));
}

#[test]
fn bad_options_and_inputs_say_what_to_do() {
    let f = parse_function(&chain(4)).unwrap();
    let joint = run_pipeline(&f, "grad{wrt=params}").unwrap();
    let err = |g: &Function, options: &str| run_pipeline(g, options).unwrap_err();
    for (options, says) in [
        ("swap{lb=5,ub=2}", "must not exceed `ub`"),
        ("swap{n-tensors=0}", "at least 1"),
        ("swap{order=sideways}", "the orders are chain and direct"),
        ("swap{min-bytes=lots}", "must be bytes"),
        ("swap{include=[nothing/here]}", "selected nothing"),
        ("swap{min-bytes=1GiB}", "under min-bytes"),
        ("swap{lb=10000}", "no trigger"),
        ("swap{nope=1}", "nope"),
    ] {
        let e = err(&joint, options);
        assert!(e.contains(says), "{options}: {e}");
    }
    assert!(err(&f, "swap").contains("run `grad` first"));
    let once = run_pipeline(&joint, "swap").unwrap();
    assert!(err(&once, "swap").contains("swaps already"));
    assert!(err(&once, "remat{strategy=speed}").contains("run `remat` first"));
}

#[test]
fn training_steps_swap_without_changing_a_bit() {
    let src = std::fs::read_to_string("examples/digits_cnn.tir").unwrap();
    let f = parse_function(&src).unwrap();
    let joint = run_pipeline(&f, "grad{wrt=params,ys=[loss]}").unwrap();
    let s = run_pipeline(&joint, "swap{min-bytes=64KiB}").unwrap();
    check_placement(&s);
    let x = inputs(&joint, 5);
    let (a, b) = (
        Executable::compile(&joint).unwrap(),
        Executable::compile(&s).unwrap(),
    );
    assert_eq!(bits_any(&a.run(&x).unwrap()), bits_any(&b.run(&x).unwrap()));
    assert!(b.stats().arena_bytes < a.stats().arena_bytes);
}

/// Bits of f32 results; other dtypes as their debug text.
fn bits_any(ts: &[Tensor]) -> Vec<String> {
    ts.iter()
        .map(|t| match t.as_f32() {
            Some(v) => format!("{:?}", v.iter().map(|x| x.to_bits()).collect::<Vec<_>>()),
            None => format!("{:?}", t.data()),
        })
        .collect()
}

/// Random functions made training functions: `swap` either selects nothing (an error that says
/// so) or keeps them valid and their interpreter results bit for bit.
#[test]
fn random_training_functions_swap_exactly() {
    let mut swapped = 0;
    for seed in 0..150 {
        let mut f = random_function(seed, 40);
        if f.schedule().iter().any(|&op| f.op(op).kind.is_swap()) {
            continue; // the generator's own swaps: `swap` runs on functions without them
        }
        // A scalar loss: the sum of every float result's elements.
        let mut loss = None;
        for r in f.results().to_vec() {
            let ty = f.ty(r).clone();
            if !ty.dtype().is_float() {
                continue;
            }
            let axes: Vec<i64> = (0..ty.rank() as i64).collect();
            let s = tcc::ir::TensorType::new(ty.dtype(), vec![]).unwrap();
            let kind = OpKind::Reduce {
                op: tcc::ir::ReduceOp::Sum,
                axes,
                keepdims: false,
            };
            let op = f.add_op(kind, vec![r], vec![s.clone()], &["loss/part"]);
            let part = f.op(op).results[0];
            loss = Some(match loss {
                None => part,
                Some(l) => {
                    let add = OpKind::Binary(tcc::ir::BinaryOp::Add);
                    let op = f.add_op(add, vec![l, part], vec![s], &["loss"]);
                    f.op(op).results[0]
                }
            });
        }
        let Some(loss) = loss else { continue };
        f.set_results(vec![loss]);
        let Ok(joint) = run_pipeline(&f, "grad{wrt=params}") else {
            continue;
        };
        let s = match run_pipeline(&joint, "swap{lb=1}") {
            Ok(s) => s,
            Err(e) => {
                assert!(e.contains("selected nothing"), "seed {seed}: {e}");
                continue;
            }
        };
        swapped += 1;
        check_placement(&s);
        // No plan goes below remat's floor, swaps included.
        let floor = tcc::passes::remat::floor(&joint).unwrap();
        assert!(
            analyze(&s).temps_peak.0 >= floor,
            "seed {seed}: below the floor {floor}"
        );
        let x = inputs(&joint, seed);
        let (Ok(a), Ok(b)) = (
            tcc::ir::interp::run(&joint, &x),
            tcc::ir::interp::run(&s, &x),
        ) else {
            continue;
        };
        assert_eq!(bits_any(&a), bits_any(&b), "seed {seed}:\n{joint}\n{s}");
    }
    assert!(
        swapped >= 20,
        "only {swapped} random functions swapped anything"
    );
}

/// A U-Net's long skip connection: the encoder's first activation is read again by the
/// decoder's last layer. With branch swapping it is swapped out after its near reader and
/// swapped in for the far one, so it holds no device memory in between.
#[test]
fn branch_swapping_frees_skip_connections() {
    let src = "func @unet(%x: f32[16,256], %w0: f32[256,256], %w1: f32[256,256], %w2: f32[256,256], %w3: f32[256,256], %w4: f32[256,256]) -> (f32[]) {
  %e1/mm = matmul %x, %w0 : f32[16,256]
  %e1 = tanh %e1/mm : f32[16,256]
  %e2/mm = matmul %e1, %w1 : f32[16,256]
  %e2 = tanh %e2/mm : f32[16,256]
  %e3/mm = matmul %e2, %w2 : f32[16,256]
  %e3 = tanh %e3/mm : f32[16,256]
  %d/mm = matmul %e3, %w3 : f32[16,256]
  %d = tanh %d/mm : f32[16,256]
  %skip = add %d, %e1 : f32[16,256]
  %out/mm = matmul %skip, %w4 : f32[16,256]
  %out = tanh %out/mm : f32[16,256]
  %loss = reduce_sum %out {axes=[0,1]} : f32[]
  return %loss
}";
    let f = parse_function(src).unwrap();
    let joint = run_pipeline(&f, "grad{wrt=params}").unwrap();
    let s = run_pipeline(&joint, "swap{include=[e1],branch-threshold=3}").unwrap();
    check_placement(&s);
    let b = s.backward_position().unwrap();
    let pos = s.positions();
    // %e1's forward swap-in: read by %skip in the forward part.
    let skip = s
        .schedule()
        .iter()
        .copied()
        .find(|&op| s.name(s.op(op).results[0]) == "skip")
        .unwrap();
    let reads = s.op(skip).args[1];
    let def = s.def_op(reads).unwrap();
    assert_eq!(
        s.op(def).kind,
        OpKind::SwapIn,
        "%skip reads {}",
        s.name(reads)
    );
    assert!((pos[def].unwrap() as usize) < b);
    // Without branch swapping %e1 stays in device memory until %skip.
    let plain = run_pipeline(&joint, "swap{include=[e1]}").unwrap();
    let at_skip = |g: &Function| {
        let m = analyze(g);
        let op = g
            .schedule()
            .iter()
            .position(|&op| g.name(g.op(op).results[0]) == "skip")
            .unwrap();
        m.live[op - 1]
    };
    assert!(
        at_skip(&s) < at_skip(&plain),
        "{} vs {}",
        at_skip(&s),
        at_skip(&plain)
    );
    let x = inputs(&f, 7);
    assert_eq!(
        bits(&tcc::ir::interp::run(&joint, &x).unwrap()),
        bits(&tcc::ir::interp::run(&s, &x).unwrap())
    );
    let (a, c) = (
        Executable::compile(&joint).unwrap(),
        Executable::compile(&s).unwrap(),
    );
    assert_eq!(bits(&a.run(&x).unwrap()), bits(&c.run(&x).unwrap()));
}

/// `offload`: the device peak meets the budget, results stay bit-identical, every saved
/// activation gets a decision, and the plan's predicted step is compared with `remat`'s at the
/// same budget (printed; the joint plan must not be slower).
#[test]
fn offload_meets_budgets_exactly() {
    use tcc::passes::analysis::cost::Machine;
    use tcc::passes::analysis::timeline::timeline;
    use tcc::passes::offload::{Decision, Offload, options};
    let f = parse_function(&chain(12)).unwrap();
    let joint = run_pipeline(&f, "grad{wrt=params}").unwrap();
    let peak = analyze(&joint).temps_peak.0;
    let x = inputs(&f, 3);
    let want = bits(&tcc::ir::interp::run(&joint, &x).unwrap());
    // The last with swaps whose triggers must lie one level before their readers.
    for (budget, extra) in [
        ("0.8", ""),
        ("0.6", ""),
        ("0.45", ""),
        ("0.6", ",lb=1,ub=1"),
    ] {
        let text = format!("budget={budget}{extra}");
        let o: Offload =
            options(&tcc::passes::Options::parse_for("offload", &text).unwrap()).unwrap();
        let mut g = joint.clone();
        let plan = o.run(&mut g).unwrap();
        tcc::ir::verify_function(&g).unwrap();
        let after = analyze(&g).temps_peak.0;
        assert!(after >= tcc::passes::remat::floor(&joint).unwrap());
        assert!(
            after <= plan.budget
                && plan.budget as f64 <= peak as f64 * budget.parse::<f64>().unwrap()
        );
        assert_eq!(plan.peak, (peak, after));
        assert!(plan.decisions.iter().any(|(_, d)| *d != Decision::Keep));
        assert_eq!(
            bits(&tcc::ir::interp::run(&g, &x).unwrap()),
            want,
            "budget {budget}"
        );
        // The compiled step's arena (device memory) meets the budget too.
        let exe = Executable::compile(&g).unwrap();
        assert!(
            exe.stats().arena_bytes <= plan.budget,
            "budget {budget}: arena {} over {}",
            exe.stats().arena_bytes,
            plan.budget
        );
        let jit = exe.run(&x).unwrap();
        assert_eq!(
            bits(&jit),
            bits(&Executable::compile(&joint).unwrap().run(&x).unwrap()),
            "budget {budget}"
        );
        // remat alone at the same budget, under the same time model (where remat reaches it:
        // at 45% only swapping does).
        let r = match run_pipeline(&joint, &format!("remat{{budget={}}}", plan.budget)) {
            Ok(r) => r,
            Err(e) => {
                assert!(e.contains("below the smallest peak remat found"), "{e}");
                eprintln!(
                    "budget {budget}: offload {:.4} ms, remat cannot",
                    plan.time.1 * 1e3
                );
                continue;
            }
        };
        let rt = timeline(&r, &Machine::DEFAULT, 16.0).total;
        eprintln!(
            "budget {budget}: offload {:.4} ms, remat {:.4} ms",
            plan.time.1 * 1e3,
            rt * 1e3
        );
        assert!(
            plan.time.1 <= rt * (1.0 + 1e-9),
            "budget {budget}: offload {} s, remat {} s",
            plan.time.1,
            rt
        );
    }
}

/// Swaps fetched just in time (`swap late`): where swaps fetched ahead of their readers cannot
/// meet a budget (each copy back holds device memory while the ops before its reader run, and
/// on a chain those are the weight gradient's transposes), the pass fetches them just before
/// each reader instead and meets it, here at the floor of every plan, with the same bits in
/// the interpreter and the JIT and an arena within the budget.
#[test]
fn late_swaps_meet_budgets_ahead_swaps_cannot() {
    use tcc::passes::offload::{Decision, options};
    let f = parse_function(&chain(12)).unwrap();
    let joint = run_pipeline(&f, "grad{wrt=params}").unwrap();
    let floor = tcc::passes::remat::floor(&joint).unwrap();
    let o =
        options(&tcc::passes::Options::parse_for("offload", &format!("budget={floor}")).unwrap())
            .unwrap();
    let mut ahead = o.clone();
    ahead.moves = vec![Decision::Swap, Decision::Recompute];
    let e = ahead.run(&mut joint.clone()).unwrap_err();
    assert!(e.contains("cannot meet the budget"), "{e}");
    let mut g = joint.clone();
    let plan = o.run(&mut g).unwrap();
    tcc::ir::verify_function(&g).unwrap();
    assert_eq!(plan.peak.1, floor);
    assert_eq!(analyze(&g).temps_peak.0, floor);
    let late = (plan.decisions.iter())
        .filter(|(_, d)| *d == Decision::SwapLate)
        .count();
    assert!(late > 0, "{:?}", plan.decisions);
    check_placement(&g);
    // Every late swap-in is read by the first op after it that is not a swap-in.
    let sched = g.schedule();
    let just_in_time = (0..sched.len())
        .filter(|&i| g.op(sched[i]).kind == OpKind::SwapIn)
        .filter(|&i| {
            let r = g.op(sched[i]).results[0];
            sched[i + 1..]
                .iter()
                .find(|&&o| g.op(o).kind != OpKind::SwapIn)
                .is_some_and(|&o| g.op(o).args.contains(&r))
        })
        .count();
    assert!(just_in_time >= late, "{just_in_time} < {late}");
    let x = inputs(&f, 5);
    assert_eq!(
        bits(&tcc::ir::interp::run(&g, &x).unwrap()),
        bits(&tcc::ir::interp::run(&joint, &x).unwrap())
    );
    let exe = Executable::compile(&g).unwrap();
    assert!(exe.stats().arena_bytes <= floor);
    assert_eq!(
        bits(&exe.run(&x).unwrap()),
        bits(&Executable::compile(&joint).unwrap().run(&x).unwrap())
    );
}

#[test]
fn offload_errors_say_what_to_do() {
    let f = parse_function(&chain(4)).unwrap();
    let joint = run_pipeline(&f, "grad{wrt=params}").unwrap();
    for (options, says) in [
        ("offload", "budget=BYTES"),
        ("offload{budget=0.5,link=0}", "positive bandwidth"),
        ("offload{budget=0.01}", "lowest device peak it reached"),
        ("offload{budget=lots}", "neither bytes"),
    ] {
        let e = run_pipeline(&joint, options).unwrap_err();
        assert!(e.contains(says), "{options}: {e}");
    }
    assert!(
        run_pipeline(&f, "offload{budget=0.5}")
            .unwrap_err()
            .contains("run `grad` first")
    );
}

/// `offload` against the exhaustive search of its space (`Offload::exhaustive`) on small
/// chains and residual stacks, at budgets from 96% of the peak down to where no plan fits:
/// `offload` finds a plan exactly where one exists, and its predicted step is within 0.5% of
/// the optimum's (equal on every case of 2026-11-26).
#[test]
fn offload_is_near_the_exhaustive_optimum() {
    use tcc::passes::offload::options;
    let residual = |n| common::residual_stack(n, 16, 32);
    let (mut costly, mut none) = (0, 0);
    for src in [chain(4), chain(6), residual(2), residual(3)] {
        let f = parse_function(&src).unwrap();
        let joint = run_pipeline(&f, "grad{wrt=params}").unwrap();
        for k in 1..20 {
            let budget = format!("budget={:.2}", 1.0 - 0.04 * k as f64);
            let o = options(&tcc::passes::Options::parse_for("offload", &budget).unwrap()).unwrap();
            let exact = o.exhaustive(&joint).unwrap();
            let found = o.run(&mut joint.clone());
            match (exact, found) {
                (None, Err(e)) => {
                    assert!(e.contains("cannot meet the budget"), "{e}");
                    none += 1;
                    break;
                }
                (Some(x), Ok(p)) => {
                    assert!(p.peak.1 <= p.budget && x.peak.1 <= x.budget);
                    assert!(
                        x.time.1 <= p.time.1 * (1.0 + 1e-9) && p.time.1 <= x.time.1 * 1.005,
                        "{budget}: offload {:?} {}, optimum {:?} {}",
                        p.decisions,
                        p.time.1,
                        x.decisions,
                        x.time.1
                    );
                    costly += usize::from(x.time.1 > x.time.0);
                }
                (x, p) => panic!("{budget}: exhaustive {x:?}, offload {p:?}"),
            }
        }
    }
    // Each graph down to where nothing fits; plans that cost time on three of them.
    assert_eq!(none, 4);
    assert!(costly >= 8, "{costly}");
}

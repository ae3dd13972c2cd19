use super::*;
use crate::analysis::memory::analyze;
use crate::manager::{PassManager, Pipeline};
use tcc_ir::random::{Rng, random_function};
use tcc_ir::{Module, parse_function, verify_function};

/// `f` with the gradients of all its results (seeds as parameters), cleaned up; `None`
/// where `grad` refuses (second derivatives of a few ops).
fn joint(mut f: Function) -> Option<Function> {
    let opts = crate::GradOptions {
        ys: f.results().iter().map(|&r| f.name(r).to_string()).collect(),
        grad_ys: true,
        ..Default::default()
    };
    crate::grad(&mut f, &opts).ok()?;
    let mut m = Module::new();
    m.functions.push(f);
    let pipeline = Pipeline::parse("canonicalize,cse,dce").unwrap();
    PassManager::new(pipeline)
        .run(&mut m, &mut std::io::sink())
        .unwrap();
    Some(m.functions.remove(0))
}

/// The simulated peak and extra FLOPs of random checkpoint sets equal what the memory
/// analysis and the rewrite report on the rewritten function: chains with reshapes and
/// multi-result batch norm, and random functions of the property tests.
#[test]
fn simulation_matches_the_rewrite() {
    let chain = parse_function(
        "func @f(%x: f32[4,3,2,2], %g: f32[3], %b: f32[3], %w: f32[12,5]) -> (f32[]) {
  %y, %m, %v = batch_norm_train %x, %g, %b : f32[4,3,2,2], f32[3], f32[3]
  %r = relu %y : f32[4,3,2,2]
  %t = tanh %r : f32[4,3,2,2]
  %s = reshape %t {shape=[4,12]} : f32[4,12]
  %h = matmul %s, %w : f32[4,5]
  %e = exp %h : f32[4,5]
  %u = mul %e, %h : f32[4,5]
  %l = reduce_sum %u {axes=[0,1]} : f32[]
  return %l
}",
    )
    .unwrap();
    let mut functions = vec![joint(chain).unwrap()];
    functions.extend((0..100).filter_map(|seed| {
        let f = random_function(seed, 12);
        let floats = f.params().iter().any(|&p| f.ty(p).dtype().is_float())
            && f.results().iter().all(|&r| f.ty(r).dtype().is_float());
        // `remat` refuses functions that swap (the generator's swap pairs).
        let swaps = f.schedule().iter().any(|&op| f.op(op).kind.is_swap());
        (floats && !swaps).then(|| joint(f)).flatten()
    }));
    assert!(functions.len() > 25, "{} functions", functions.len());
    let mut rng = Rng::new(11);
    let (mut checked, mut with_copies) = (0, 0);
    for f in &functions {
        let Some(b) = f.backward_position() else {
            continue;
        };
        let j = Joint::new(f, b);
        for trial in 0..12 {
            let p = trial as f64 / 11.0;
            let keep: Vec<bool> = (0..f.num_values_created()).map(|_| rng.chance(p)).collect();
            let (peak, extra) = j.simulate(&j.plan(&keep));
            let kept: Vec<Value> = (0..keep.len())
                .filter(|&v| keep[v])
                .map(Value::new)
                .collect();
            let mut g = f.clone();
            let stats = remat(&mut g, &kept).unwrap();
            verify_function(&g).unwrap_or_else(|e| panic!("{e}\n{g}"));
            assert_eq!(peak, analyze(&g).temps_peak.0, "{g}");
            assert_eq!(extra, stats.extra_flops);
            checked += 1;
            with_copies += usize::from(stats.recomputed_ops > 0);
        }
    }
    // The test's power: about a quarter of the trials recompute something (287 of 1200 with
    // the generator of 2026-11-23); below a fifth, the check above would be too weak.
    assert!(with_copies > checked / 5, "{with_copies} of {checked}");
}

/// The branch and bound finds what trying every set of kept values finds (all forward
/// values, and the values backward ops read), on small chains and residual blocks and the
/// random functions of the property tests with at most 16 forward values, for the lowest
/// peak and for budgets from it to the peak without remat. Its bound is checked against
/// the simulated peak at every leaf (a debug assertion).
#[test]
fn exact_matches_enumeration() {
    // Chains and residual blocks, where recomputation pays, then random functions.
    let chain = |n: usize| {
        let mut s = String::from("func @chain(%x: f32[8]");
        for i in 0..n {
            s += &format!(", %w{i}: f32[8]");
        }
        s += ") -> (f32[]) {\n";
        let mut prev = "%x".to_string();
        for i in 0..n {
            s += &format!("  %m{i} = mul {prev}, %w{i} : f32[8]\n  %t{i} = tanh %m{i} : f32[8]\n");
            prev = format!("%t{i}");
        }
        s + &format!("  %l = reduce_sum {prev} {{axes=[0]}} : f32[]\n  return %l\n}}")
    };
    let residual = |n: usize| {
        let mut s = String::from("func @res(%x: f32[4,8]");
        for i in 0..n {
            s += &format!(", %w{i}: f32[8,8]");
        }
        s += ") -> (f32[]) {\n";
        let mut prev = "%x".to_string();
        for i in 0..n {
            s += &format!(
                "  %m{i} = matmul {prev}, %w{i} : f32[4,8]\n  %r{i} = relu %m{i} : f32[4,8]\n  %o{i} = add {prev}, %r{i} : f32[4,8]\n"
            );
            prev = format!("%o{i}");
        }
        s + &format!("  %l = reduce_sum {prev} {{axes=[0,1]}} : f32[]\n  return %l\n}}")
    };
    let structured =
        [chain(4), chain(7), residual(3), residual(4)].map(|src| parse_function(&src).unwrap());
    let random = (0..300).map(|seed| random_function(seed, 16));
    let mut checked = 0;
    let mut recomputing = 0;
    for f in structured.into_iter().chain(random) {
        let floats = f.params().iter().any(|&p| f.ty(p).dtype().is_float())
            && f.results().iter().all(|&r| f.ty(r).dtype().is_float());
        let swaps = f.schedule().iter().any(|&op| f.op(op).kind.is_swap());
        let Some(f) = (floats && !swaps).then(|| joint(f)).flatten() else {
            continue;
        };
        let Some(b) = f.backward_position() else {
            continue;
        };
        let j = Joint::new(&f, b);
        let vars: Vec<usize> = (0..f.num_values_created())
            .filter(|&v| j.forward[v])
            .collect();
        if vars.is_empty() || vars.len() > 16 {
            continue;
        }
        // Every plan: (peak, extra).
        let plans: Vec<(u64, u64)> = (0u32..1 << vars.len())
            .map(|mask| {
                let mut keep = vec![false; f.num_values_created()];
                for (i, &v) in vars.iter().enumerate() {
                    keep[v] = mask >> i & 1 == 1;
                }
                j.simulate(&j.plan(&keep))
            })
            .collect();
        let lowest = plans.iter().map(|p| p.0).min().unwrap();
        assert!(floor(&f).unwrap() <= lowest, "{f}");
        let e = exact(&f, Goal::LowestPeak, Space::Forward, None, u64::MAX).unwrap();
        assert!(e.proven);
        assert_eq!(e.peak, lowest, "{f}");
        let base = plans.last().unwrap().0;
        for limit in (0..5).map(|q| lowest + q * (base - lowest) / 4) {
            let best = plans
                .iter()
                .filter(|p| p.0 <= limit)
                .map(|&(p, x)| (x, p))
                .min()
                .unwrap();
            let e = exact(&f, Goal::Cheapest(limit), Space::Forward, None, u64::MAX).unwrap();
            assert!(e.proven && e.checkpoints.is_some());
            assert_eq!((e.extra_flops, e.peak), best, "limit {limit}\n{f}");
            // The plan is what it says.
            let mut g = f.clone();
            let stats = remat(&mut g, e.checkpoints.as_ref().unwrap()).unwrap();
            assert_eq!(analyze(&g).temps_peak.0, e.peak);
            assert_eq!(stats.extra_flops, e.extra_flops);
            recomputing += usize::from(best.0 > 0);
            checked += 1;
        }
        if lowest > 0 {
            let e = exact(
                &f,
                Goal::Cheapest(lowest - 1),
                Space::Forward,
                None,
                u64::MAX,
            )
            .unwrap();
            assert!(e.proven && e.checkpoints.is_none());
        }
        // The same over the values backward ops read (the others dropped).
        let read = read_by_backward(&f, b);
        let plans: Vec<(u64, u64)> = (0u32..1 << read.len())
            .map(|mask| {
                let mut keep = vec![false; f.num_values_created()];
                for (i, &v) in read.iter().enumerate() {
                    keep[v.index()] = mask >> i & 1 == 1;
                }
                j.simulate(&j.plan(&keep))
            })
            .collect();
        let lowest_read = plans.iter().map(|p| p.0).min().unwrap();
        let e = exact(&f, Goal::LowestPeak, Space::Read, None, u64::MAX).unwrap();
        assert_eq!(e.peak, lowest_read, "{f}");
        for limit in (0..5).map(|q| lowest_read + q * (base - lowest_read) / 4) {
            let best = plans
                .iter()
                .filter(|p| p.0 <= limit)
                .map(|&(p, x)| (x, p))
                .min()
                .unwrap();
            let e = exact(&f, Goal::Cheapest(limit), Space::Read, None, u64::MAX).unwrap();
            assert_eq!((e.extra_flops, e.peak), best, "limit {limit}\n{f}");
        }
    }
    // The test's power: the optimum recomputes something in 152 of 1115 cases (2026-11-26).
    assert!(
        checked > 800 && recomputing > 100,
        "{recomputing} of {checked}"
    );
}

/// On larger random functions (too many values to enumerate), the exact search's bound
/// stays under the simulated peak at every leaf (its debug assertion) and neither it nor
/// the budget search fails, in both spaces, for the lowest peak and at budgets.
#[test]
fn exact_search_bounds_hold_on_larger_functions() {
    let mut searched = 0;
    for seed in 1000..1150 {
        for size in [24, 40] {
            let f = random_function(seed, size);
            let floats = f.params().iter().any(|&p| f.ty(p).dtype().is_float())
                && f.results().iter().all(|&r| f.ty(r).dtype().is_float());
            let swaps = f.schedule().iter().any(|&op| f.op(op).kind.is_swap());
            let Some(f) = (floats && !swaps).then(|| joint(f)).flatten() else {
                continue;
            };
            if f.backward_position().is_none() {
                continue;
            }
            for space in [Space::Read, Space::Forward] {
                let e = exact(&f, Goal::LowestPeak, space, None, 5_000).unwrap();
                assert!(e.checkpoints.is_some());
                let _ = fit(&f, Budget::Bytes(e.peak.max(1)));
                searched += 1;
            }
        }
    }
    assert!(searched > 200, "{searched}");
}

#[test]
fn budgets_parse() {
    assert_eq!(Budget::parse("4096"), Ok(Budget::Bytes(4096)));
    assert_eq!(Budget::parse("64KiB"), Ok(Budget::Bytes(65536)));
    assert_eq!(Budget::parse("2MiB"), Ok(Budget::Bytes(2 << 20)));
    assert_eq!(Budget::parse("0.25"), Ok(Budget::Fraction(0.25)));
    assert_eq!(Budget::parse("50%"), Ok(Budget::Fraction(0.5)));
    for bad in ["0", "1.5", "0%", "64MB", "-3", "lots", "99999999999GiB"] {
        assert!(Budget::parse(bad).is_err(), "{bad}");
    }
}

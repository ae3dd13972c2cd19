//! Parse and verify arbitrary bytes. Beyond "no panic": a diagnostic must render; valid input
//! must print, parse back to the same text, and survive the standard pipeline verified; and for
//! small functions the reference interpreter must give the same results before and after it,
//! and the compiled code (CPU backend) the same results as the interpreter, within f32 rounding.
//! `grad` of every floating-point result with respect to every floating-point parameter must
//! either fail with a message or produce a function that verifies and returns the original
//! results first.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tcc_ir::random::{Rng, random_tensor};
use tcc_ir::{Data, Function, Tensor};
use tcc_passes::{PassManager, Pipeline};

/// Total elements over every value: a bound on the interpreter's work and memory.
fn total_elements(f: &Function) -> u64 {
    let vals = f.params().iter().chain(f.schedule().iter().flat_map(|&op| f.op(op).results.iter()));
    vals.fold(0u64, |acc, &v| acc.saturating_add(f.ty(v).numel()))
}

fn same(a: &[Tensor], b: &[Tensor]) -> bool {
    agree(a, b, 0.0)
}

/// Equal within `rtol` relative (plus the same absolute) tolerance; NaN equals NaN.
fn agree(a: &[Tensor], b: &[Tensor], rtol: f64) -> bool {
    let close = |x: f64, y: f64| x == y || (x.is_nan() && y.is_nan()) || (x - y).abs() <= rtol * (1.0 + y.abs());
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            x.ty() == y.ty()
                && match (x.data(), y.data()) {
                    (Data::F32(p), Data::F32(q)) => p.iter().zip(q).all(|(&u, &v)| close(u as f64, v as f64)),
                    (Data::F64(p), Data::F64(q)) => p.iter().zip(q).all(|(&u, &v)| close(u, v)),
                    (p, q) => p == q,
                }
        })
}

fuzz_target!(|data: &[u8]| {
    let src = String::from_utf8_lossy(data);
    let m = match tcc_ir::parse_bytes(data) {
        Ok(m) => m,
        Err(d) => {
            let _ = d.render("fuzz.tir", &src);
            return;
        }
    };
    if let Err(d) = tcc_ir::verify_module(&m) {
        let _ = d.render("fuzz.tir", &src);
        return;
    }
    let text = m.to_string();
    let back = tcc_ir::parse_module(&text).expect("printed IR parses");
    tcc_ir::verify_module(&back).expect("printed IR verifies");
    assert_eq!(back.to_string(), text, "print(parse(print(m))) == print(m)");
    let mut opt = back.clone();
    let mut pm = PassManager::new(Pipeline::parse("canonicalize,cse,dce").unwrap());
    pm.verify_each = true;
    pm.run(&mut opt, &mut std::io::sink()).expect("passes keep valid IR valid");
        for f in &back.functions {
        if f.schedule().len() > 2000 {
            continue;
        }
        let ys: Vec<String> = f
            .results()
            .iter()
            .filter(|&&r| f.ty(r).dtype().is_float())
            .map(|&r| f.name(r).to_string())
            .collect();
        if ys.is_empty() {
            continue;
        }
        let mut g = f.clone();
        let opts = tcc_passes::GradOptions { ys, grad_ys: true, ..Default::default() };
        if tcc_passes::grad(&mut g, &opts).is_ok() {
            tcc_ir::verify_function(&g).unwrap_or_else(|d| panic!("grad broke the IR:\n{f}\n{d}"));
                        // Clean-up may merge a result with an equal value, so compare types, not values.
            let kept = g.results().iter().zip(f.results()).all(|(&a, &b)| g.ty(a) == f.ty(b));
            assert!(kept && g.results().len() > f.results().len(), "grad keeps the results first");
        }
    }
    for (f, g) in back.functions.iter().zip(&opt.functions) {
        if total_elements(f) > 1 << 14 {
            continue;
        }
        let mut rng = Rng::new(7);
        let inputs: Vec<Tensor> = f.params().iter().map(|&p| random_tensor(f.ty(p), &mut rng)).collect();
        if let Ok(before) = tcc_ir::interp::run(f, &inputs) {
            let after = tcc_ir::interp::run(g, &inputs).expect("a pass made a working function fail");
            assert!(same(&before, &after), "a pass changed results:\n{f}\n{g}");
            // The compiled code. Polynomial functions and f32 accumulation differ from the f64
            // interpreter by rounding; with inputs in [-1, 1) and small graphs 1e-3 covers it.
            let exe = tcc_codegen::Executable::compile(f).expect("a verified function compiles");
            if let Ok(got) = exe.run(&inputs) {
                assert!(agree(&got, &before, 1e-3), "compiled results differ:\n{f}\n{got:?}\n{before:?}");
            }
        }
    }
});

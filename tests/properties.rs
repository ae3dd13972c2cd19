//! Properties over randomly generated well-typed functions (`tcc_ir::random`):
//! - print, parse and print again gives the same text, and the parsed function verifies;
//! - every pass, and pipelines of them, leave the IR valid (verified after each pass);
//! - `cse`, `dce` and `canonicalize` reach a fixed point: running one again changes nothing;
//! - `dce` and `cse` never add ops.

use proptest::prelude::*;
use tcc::ir::random::random_function;
use tcc::ir::{Module, parse_module, verify_module};
use tcc::passes::{PassManager, Pipeline};

fn module(seed: u64, n: usize) -> Module {
    Module {
        functions: vec![random_function(seed, n)],
    }
}

fn run(m: &mut Module, pipeline: &str) {
    let mut pm = PassManager::new(Pipeline::parse(pipeline).unwrap());
    pm.verify_each = true;
    pm.run(m, &mut std::io::sink())
        .unwrap_or_else(|e| panic!("{pipeline}: {e}\n{m}"));
}

fn round_trips(m: &Module) {
    let text = m.to_string();
    let back =
        parse_module(&text).unwrap_or_else(|d| panic!("{}\n{text}", d.render("<printed>", &text)));
    verify_module(&back).unwrap_or_else(|d| panic!("{d}\n{text}"));
    assert_eq!(back.to_string(), text);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    #[test]
    fn print_parse_print_is_a_fixed_point(seed in any::<u64>(), n in 1usize..60) {
        let m = module(seed, n);
        verify_module(&m).unwrap();
        round_trips(&m);
    }

    #[test]
    fn passes_keep_the_ir_valid(seed in any::<u64>(), n in 1usize..60, order in 0usize..6) {
        let pipelines = [
            "canonicalize,cse,dce",
            "cse,canonicalize,dce",
            "dce,cse",
            "canonicalize{fold-limit=0}",
            "canonicalize{fold-limit=100000},dce",
            "cse,dce,canonicalize,cse",
        ];
        let mut m = module(seed, n);
        let before = m.num_ops();
        run(&mut m, pipelines[order]);
        round_trips(&m);
        if pipelines[order] == "dce,cse" {
            prop_assert!(m.num_ops() <= before);
        }
    }

    #[test]
    fn passes_reach_a_fixed_point(seed in any::<u64>(), n in 1usize..60) {
        for pass in ["cse", "dce", "canonicalize"] {
            let mut m = module(seed, n);
            run(&mut m, pass);
            let once = m.to_string();
            run(&mut m, pass);
            prop_assert_eq!(m.to_string(), once, "{} is not idempotent", pass);
        }
    }
}

#[test]
fn generator_is_deterministic_and_covers_the_op_set() {
    assert_eq!(
        random_function(7, 50).to_string(),
        random_function(7, 50).to_string()
    );
    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..200 {
        let f = random_function(seed, 60);
        for &op in f.schedule() {
            seen.insert(f.op(op).kind.mnemonic());
        }
    }
    let missing: Vec<&str> = tcc::ir::ops::all_mnemonics()
        .into_iter()
        .filter(|m| !seen.contains(m))
        .collect();
    assert!(missing.is_empty(), "the generator never emits {missing:?}");
}

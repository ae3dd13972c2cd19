//! Import arbitrary bytes as an ONNX model. Beyond "no panic": an error must have a message; an
//! imported module must verify, print and parse back to the same text; and a small function
//! must run in the reference interpreter (or fail with a run-time error, never a panic), with
//! the stored values of initializers made parameters as their inputs.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tcc_ir::random::{Rng, random_tensor};

fuzz_target!(|data: &[u8]| {
    // Odd-length inputs import with every float initializer a parameter (trainable imports),
    // so both paths see every model the fuzzer makes.
    let opts = tcc_onnx::Options {
        params: if data.len() % 2 == 1 {
            tcc_onnx::Params::All
        } else {
            tcc_onnx::Params::None
        },
        ..Default::default()
    };
    let m = match tcc_onnx::import(data, &opts) {
        Ok(m) => m,
        Err(e) => {
            assert!(!e.message().is_empty(), "an import error has a message");
            return;
        }
    };
    tcc_ir::verify_module(&m).expect("imported IR verifies");
    let text = m.to_string();
    let back = tcc_ir::parse_module(&text).expect("printed IR parses");
    assert_eq!(back.to_string(), text, "print(parse(print(m))) == print(m)");
    for f in &m.functions {
        let total = f
            .params()
            .iter()
            .chain(f.schedule().iter().flat_map(|&op| f.op(op).results.iter()))
            .fold(0u64, |acc, &v| acc.saturating_add(f.ty(v).numel()));
        if total > 1 << 14 {
            continue;
        }
        let mut rng = Rng::new(7);
        let inputs: Vec<_> = f
            .params()
            .iter()
            .map(|&p| match m.weights.values.get(f.name(p)) {
                Some(t) => tcc_ir::Tensor::clone(t),
                None => random_tensor(f.ty(p), &mut rng),
            })
            .collect();
        let _ = tcc_ir::interp::run(f, &inputs);
    }
});

//! Parse and verify arbitrary bytes. Beyond "no panic": a diagnostic must render, and valid
//! input must print, parse back to the same text, and survive the standard pipeline verified.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tcc_passes::{PassManager, Pipeline};

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
    let mut m = back;
    let mut pm = PassManager::new(Pipeline::parse("canonicalize,cse,dce").unwrap());
    pm.verify_each = true;
    pm.run(&mut m, &mut std::io::sink()).expect("passes keep valid IR valid");
});

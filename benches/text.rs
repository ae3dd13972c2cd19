//! Text-format throughput: parse, verify and print random functions of 10k to 100k ops.
//!
//! Run with `cargo bench --bench text`. Prints the best of nine runs of each phase and the time
//! per op, which should stay flat as the function grows (linear scaling). It also writes the
//! 100k-op function to `target/text-100k.tir` for timing `tcc cat` end to end. No peer runs here:
//! no other tool reads this format; the target (parse + verify + print of 100k ops under 0.5 s)
//! comes from the foundation issue.

use std::time::{Duration, Instant};
use tcc::ir::random::random_function;
use tcc::ir::{Module, parse_module, verify_module};

fn best<T>(mut f: impl FnMut() -> T) -> (Duration, T) {
    let mut best = Duration::MAX;
    let mut out = None;
    for _ in 0..9 {
        let t = Instant::now();
        let r = f();
        best = best.min(t.elapsed());
        out = Some(r);
    }
    (best, out.unwrap())
}

fn main() {
    println!(
        "{:>8} {:>9} {:>10} {:>10} {:>10} {:>10} {:>12}",
        "ops", "MB", "parse ms", "verify ms", "print ms", "total ms", "total ns/op"
    );
    for n in [10_000, 20_000, 50_000, 100_000] {
        let m = Module {
            functions: vec![random_function(42, n)],
            ..Module::default()
        };
        let text = m.to_string();
        let ops = m.num_ops();
        let (tp, parsed) = best(|| parse_module(&text).expect("generated text parses"));
        let (tv, ()) = best(|| verify_module(&parsed).expect("generated IR verifies"));
        let (tw, printed) = best(|| parsed.to_string());
        assert_eq!(printed, text);
        if n == 100_000 {
            // For timing the driver end to end: `tcc cat target/text-100k.tir`.
            let path = concat!(env!("CARGO_MANIFEST_DIR"), "/target/text-100k.tir");
            std::fs::write(path, &text).expect("write target/text-100k.tir");
        }
        let total = tp + tv + tw;
        println!(
            "{ops:>8} {:>9.1} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>12.0}",
            text.len() as f64 / 1e6,
            tp.as_secs_f64() * 1e3,
            tv.as_secs_f64() * 1e3,
            tw.as_secs_f64() * 1e3,
            total.as_secs_f64() * 1e3,
            total.as_secs_f64() * 1e9 / ops as f64
        );
    }
}

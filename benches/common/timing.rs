//! The benchmarks' timer.

use std::time::{Duration, Instant};

/// The fastest of `runs` calls of `f`, after `warmup` untimed calls.
pub fn best(mut f: impl FnMut(), warmup: usize, runs: usize) -> Duration {
    for _ in 0..warmup {
        f();
    }
    (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .min()
        .expect("at least one run")
}

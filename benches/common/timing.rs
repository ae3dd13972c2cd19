//! The benchmarks' timer.

use std::time::{Duration, Instant};

/// The time [`best_within`] may fill with runs (numpy_peer.py's `best` uses the same rule).
pub const BUDGET: Duration = Duration::from_millis(250);

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

/// The fastest of at least `runs` calls of `f`, more where they fit in [`BUDGET`] (at most
/// 1000), after one untimed call that sizes them. Short cases get many runs: on a shared
/// machine a few runs can all land in a slow spell.
#[allow(dead_code)] // Not every benchmark that includes this module uses it.
pub fn best_within(mut f: impl FnMut(), runs: usize) -> Duration {
    let t = Instant::now();
    f();
    let once = t.elapsed().max(Duration::from_micros(1));
    let runs = runs.max((BUDGET.as_secs_f64() / once.as_secs_f64()).min(1000.0) as usize);
    best(f, 0, runs)
}

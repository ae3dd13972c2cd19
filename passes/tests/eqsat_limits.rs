//! The limits of an `eqsat` run stop it, the time limit included: egg reads it from a clock
//! the pass sets from the OS clock between iterations (egg's own clock calibrates for up to
//! 200 ms on first use; see `tcc_passes::eqsat::eqsat`).

use std::time::Duration;
use tcc_passes::eqsat::{EqsatOptions, Report, eqsat};

const SRC: &str = "func @f(%x: f32[4], %y: f32[4], %z: f32[4]) -> (f32[4]) {
  %a = mul %x, %y : f32[4]
  %b = add %a, %z : f32[4]
  %n = neg %b : f32[4]
  %c = mul %n, %x : f32[4]
  %d = sub %c, %y : f32[4]
  return %d
}";

fn run(o: &EqsatOptions) -> Report {
    let mut f = tcc_ir::parse_function(SRC).unwrap();
    eqsat(&mut f, o).unwrap()
}

#[test]
fn the_time_limit_stops_a_run() {
    let free = run(&EqsatOptions::default());
    assert_eq!(free.stop, "saturated");
    assert!(free.iterations >= 2, "{} iterations", free.iterations);
    let limited = run(&EqsatOptions {
        time_limit: Duration::ZERO,
        ..EqsatOptions::default()
    });
    assert!(limited.stop.starts_with("time limit"), "{}", limited.stop);
    assert!(limited.iterations < free.iterations);
}

#[test]
fn the_iteration_limit_stops_a_run() {
    let report = run(&EqsatOptions {
        iter_limit: Some(1),
        ..EqsatOptions::default()
    });
    assert_eq!(report.stop, "iteration limit 1");
    assert_eq!(report.iterations, 1);
}

//! `tcc calibrate`: measure the constants of the time model (`analysis::cost::Machine`) on this
//! machine with the JIT, and print them as `eqsat` options. `eqsat` itself keeps fixed defaults
//! so that its output does not depend on the machine; pass these to it to tune for this one.

use crate::Error;
use crate::io::Io;
use std::time::{Duration, Instant};
use tcc_ir::random::{Rng, random_tensor};

// The arguments of `tcc calibrate`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// What to compile for, as in `tcc run` (`host,-avx512f` measures the AVX2 kernels).
    #[arg(long)]
    pub target: Option<String>,
}

/// The best time of `runs` runs of `src` (one function) on random inputs, after two warm-ups.
fn best(src: &str, target: Option<&str>, runs: usize) -> Result<Duration, Error> {
    let f =
        tcc_ir::parse_function(src).map_err(|e| Error::input(format!("error: probe: {e:?}")))?;
    let exe = tcc_codegen::Executable::compile_for(&f, target)
        .map_err(|e| Error::usage(format!("error: {e}")))?;
    let mut rng = Rng::new(1);
    let inputs: Vec<_> = f
        .params()
        .iter()
        .map(|&p| random_tensor(f.ty(p), &mut rng))
        .collect();
    let mut best = Duration::MAX;
    for i in 0..runs + 2 {
        let t = Instant::now();
        exe.run(&inputs)
            .map_err(|e| Error::input(format!("error: probe: {e}")))?;
        if i >= 2 {
            best = best.min(t.elapsed());
        }
    }
    Ok(best)
}

pub(crate) fn run(a: Args, io: &mut Io) -> Result<(), Error> {
    let target = a.target.as_deref();
    // Matrix kernels: a 512^3 sgemm.
    let n = 512u64;
    let gemm = best(
        &format!(
            "func @p(%a: f32[{n},{n}], %b: f32[{n},{n}]) -> (f32[{n},{n}]) {{\n  %c = matmul %a, %b : f32[{n},{n}]\n  return %c\n}}\n"
        ),
        target,
        20,
    )?;
    let gflops = 2.0 * (n * n * n) as f64 / gemm.as_secs_f64() / 1e9;
    // Generated kernels: 64 multiply-adds an element, fused into one kernel on 256 Ki elements.
    let len = 1u64 << 18;
    let mut body = String::new();
    let mut prev = "%x".to_string();
    for i in 0..32 {
        body += &format!(
            "  %m{i} = mul {prev}, %k : f32[{len}]\n  %a{i} = add %m{i}, %c : f32[{len}]\n"
        );
        prev = format!("%a{i}");
    }
    let vector = best(
        &format!(
            "func @p(%x: f32[{len}]) -> (f32[{len}]) {{\n  %k = const {{value=0.999}} : f32[]\n  %c = const {{value=0.001}} : f32[]\n{body}  return {prev}\n}}\n"
        ),
        target,
        20,
    )?;
    let vector_gflops = (64 * len) as f64 / vector.as_secs_f64() / 1e9;
    // Memory: an add of two 64 MiB vectors (three streams).
    let big = 1u64 << 24;
    let stream = best(
        &format!(
            "func @p(%x: f32[{big}], %y: f32[{big}]) -> (f32[{big}]) {{\n  %z = add %x, %y : f32[{big}]\n  return %z\n}}\n"
        ),
        target,
        10,
    )?;
    let gbps = (3 * 4 * big) as f64 / stream.as_secs_f64() / 1e9;
    // Launches: 32 dependent tiny transposes (one kernel each).
    let mut body = String::new();
    let mut prev = "%x".to_string();
    for i in 0..32 {
        body += &format!("  %t{i} = transpose {prev} {{perm=[1,0]}} : f32[2,2]\n");
        prev = format!("%t{i}");
    }
    let launches = best(
        &format!("func @p(%x: f32[2,2]) -> (f32[2,2]) {{\n{body}  return {prev}\n}}\n"),
        target,
        200,
    )?;
    let launch_us = launches.as_secs_f64() / 32.0 * 1e6;
    let _ = writeln!(
        io.stdout,
        "sgemm 512^3:                 {:>8.1} GFLOP/s  (gflops)\n\
         generated multiply-adds:     {:>8.1} GFLOP/s  (vector-gflops)\n\
         streaming add, 3 x 64 MiB:   {:>8.1} GB/s     (gbps)\n\
         one small kernel:            {:>8.2} us       (launch-us)\n\
         eqsat{{gflops={:.0},vector-gflops={:.0},gbps={:.0},launch-us={:.2}}}",
        gflops, vector_gflops, gbps, launch_us, gflops, vector_gflops, gbps, launch_us
    );
    Ok(())
}

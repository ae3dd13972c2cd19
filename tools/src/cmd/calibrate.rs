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

/// A probe function `@p` of `n` dependent steps from `%x: ty` to a result of `ty`: `params`
/// are its other parameters (`, %w: ...`), `prelude` its first lines, and `step(i, prev)`
/// gives the lines of step `i`, which define `%{last}{i}` from `prev`.
fn chain(
    ty: &str,
    params: &str,
    prelude: &str,
    n: usize,
    last: &str,
    step: impl Fn(usize, &str) -> String,
) -> String {
    let mut body = String::new();
    let mut prev = "%x".to_string();
    for i in 0..n {
        body += &step(i, &prev);
        prev = format!("%{last}{i}");
    }
    format!("func @p(%x: {ty}{params}) -> ({ty}) {{\n{prelude}{body}  return {prev}\n}}\n")
}

/// GB/s of an add of two `len`-element f32 vectors (three streams: two read, one written).
fn add_gbps(len: u64, target: Option<&str>, runs: usize) -> Result<f64, Error> {
    let t = best(
        &format!(
            "func @p(%x: f32[{len}], %y: f32[{len}]) -> (f32[{len}]) {{\n  %z = add %x, %y : f32[{len}]\n  return %z\n}}\n"
        ),
        target,
        runs,
    )?;
    Ok((3 * 4 * len) as f64 / t.as_secs_f64() / 1e9)
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
    let ty = format!("f32[{len}]");
    let consts = "  %k = const {value=0.999} : f32[]\n  %c = const {value=0.001} : f32[]\n";
    let probe = chain(&ty, "", consts, 32, "a", |i, prev| {
        format!("  %m{i} = mul {prev}, %k : {ty}\n  %a{i} = add %m{i}, %c : {ty}\n")
    });
    let vector = best(&probe, target, 20)?;
    let vector_gflops = (64 * len) as f64 / vector.as_secs_f64() / 1e9;
    // Memory: an add of two 64 MiB vectors (three streams).
    let gbps = add_gbps(1 << 24, target, 10)?;
    // Launches: 32 dependent tiny transposes (one kernel each).
    let probe = chain("f32[2,2]", "", "", 32, "t", |i, prev| {
        format!("  %t{i} = transpose {prev} {{perm=[1,0]}} : f32[2,2]\n")
    });
    let launches = best(&probe, target, 200)?;
    let launch_us = launches.as_secs_f64() / 32.0 * 1e6;
    // Cache: the same add on 4 MiB vectors, which stay in the last-level cache between runs.
    let cache_gbps = add_gbps(1 << 20, target, 50)?;
    let cache_mib =
        last_level_cache_mib().unwrap_or(tcc_passes::analysis::cost::Machine::DEFAULT.cache_mib);
    // Splits: 16 dependent matrix-vector products big enough to be split across threads,
    // each with its own 256 x 256 weights (4 MiB in all: in the last-level cache, not in L2),
    // less a launch and the reading of the weights each.
    let params: String = (0..16).map(|i| format!(", %w{i}: f32[256,256]")).collect();
    let probe = chain("f32[1,256]", &params, "", 16, "v", |i, prev| {
        format!("  %v{i} = matmul {prev}, %w{i} : f32[1,256]\n")
    });
    let gemvs = best(&probe, target, 200)?;
    let read_us = (256.0 * 256.0 * 4.0) / (cache_gbps * 1e9) * 1e6;
    let sync_us = (gemvs.as_secs_f64() / 16.0 * 1e6 - launch_us - read_us).max(0.01);
    let _ = writeln!(
        io.stdout,
        "sgemm 512^3:                 {:>8.1} GFLOP/s  (gflops)\n\
         generated multiply-adds:     {:>8.1} GFLOP/s  (vector-gflops)\n\
         streaming add, 3 x 64 MiB:   {:>8.1} GB/s     (gbps)\n\
         one small kernel:            {:>8.2} us       (launch-us)\n\
         cached add, 3 x 4 MiB:       {:>8.1} GB/s     (cache-gbps)\n\
         last-level cache:            {:>8.1} MiB      (cache-mib)\n\
         split matrix-vector product: {:>8.2} us       (sync-us)\n\
         eqsat{{gflops={:.0},vector-gflops={:.0},gbps={:.0},launch-us={:.2},cache-gbps={:.0},cache-mib={:.0},sync-us={:.2}}}",
        gflops,
        vector_gflops,
        gbps,
        launch_us,
        cache_gbps,
        cache_mib,
        sync_us,
        gflops,
        vector_gflops,
        gbps,
        launch_us,
        cache_gbps,
        cache_mib,
        sync_us
    );
    Ok(())
}

/// The size of the first CPU's last-level cache in MiB, as Linux reports it (`None` elsewhere).
fn last_level_cache_mib() -> Option<f64> {
    let dir = std::path::Path::new("/sys/devices/system/cpu/cpu0/cache");
    let mut best: Option<(u32, f64)> = None;
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let read = |name: &str| std::fs::read_to_string(e.path().join(name)).ok();
        let (Some(level), Some(size)) = (read("level"), read("size")) else {
            continue;
        };
        let Ok(level) = level.trim().parse::<u32>() else {
            continue;
        };
        let size = size.trim();
        let (digits, unit) = size.split_at(
            size.find(|c: char| !c.is_ascii_digit())
                .unwrap_or(size.len()),
        );
        let Ok(n) = digits.parse::<f64>() else {
            continue;
        };
        let mib = match unit {
            "K" => n / 1024.0,
            "M" => n,
            "G" => n * 1024.0,
            _ => n / (1024.0 * 1024.0),
        };
        if best.is_none_or(|(l, _)| level > l) {
            best = Some((level, mib));
        }
    }
    best.map(|(_, mib)| mib)
}

//! `tcc bench`: compile a model once, run it many times and print its latency, so that runtimes
//! can be compared on the same machine.

use super::run::{Model, prepare};
use crate::Error;
use crate::io::Io;
use std::time::{Duration, Instant};

// The arguments of `tcc bench`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    #[command(flatten)]
    pub model: Model,
    /// Worker threads (default: one per core, as `tcc run` uses).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Timed runs.
    #[arg(long, default_value_t = 50)]
    pub runs: usize,
    /// Untimed runs first (caches, page faults, the thread pool's start).
    #[arg(long, default_value_t = 5)]
    pub warmup: usize,
    /// Also time each compiled step, and print to stderr where the time went: every step's
    /// time per run, largest first (the timing itself costs a little).
    #[arg(long)]
    pub profile: bool,
}

pub(crate) fn run(a: Args, io: &mut Io) -> Result<(), Error> {
    if a.runs == 0 {
        return Err(Error::usage("error: --runs must be at least 1"));
    }
    let threads = match a.threads {
        Some(0) => return Err(Error::usage("error: --threads must be at least 1")),
        Some(n) => n,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| Error::input(format!("error: cannot start {threads} threads: {e}")))?;
    let features = (a.model.cpu(false).features())
        .map_err(|e| Error::usage(format!("error: --target: {e}")))?;
    let p = prepare(&a.model, io)?;
    let f = p.function();
    let cpu = a.model.cpu(a.profile);
    let t0 = Instant::now();
    let exe = tcc_codegen::compile(&cpu, f).map_err(|e| Error::usage(format!("error: {e}")))?;
    let compile_time = t0.elapsed();
    let once = || -> Result<Duration, Error> {
        let t = Instant::now();
        exe.run(&p.inputs)
            .map_err(|e| Error::input(format!("error: {e}")))?;
        Ok(t.elapsed())
    };
    let mut times = pool.install(|| -> Result<Vec<Duration>, Error> {
        for _ in 0..a.warmup {
            once()?;
        }
        (0..a.runs).map(|_| once()).collect()
    })?;
    let s = exe.stats();
    let out = &mut io.stdout;
    let _ = writeln!(
        out,
        "{} (@{}): {} ops, {} kernels ({} compiled, {} native, {} on reference kernels)",
        p.name,
        f.name,
        f.schedule().len(),
        s.compiled + s.native + s.reference,
        s.compiled,
        s.native,
        s.reference
    );
    let _ = writeln!(
        out,
        "cpu: {}; features used: {} (library kernels {}-bit){}; {threads} thread{}",
        cpu_name(),
        features.names().join(" "),
        if features.wide { 512 } else { 256 },
        if features.vnni && !features.avx512f && !(features.avx2 && features.avx_vnni) {
            " (the CPU also has VNNI, which this target does not use)"
        } else {
            ""
        },
        if threads == 1 { "" } else { "s" }
    );
    let _ = writeln!(
        out,
        "compile: {} (load {}, passes {}, codegen {})",
        ms(p.load_time + p.pass_time + compile_time),
        ms(p.load_time),
        ms(p.pass_time),
        ms(compile_time)
    );
    let total: Duration = times.iter().sum();
    times.sort();
    // Nearest-rank percentiles.
    let pct = |q: f64| times[((q * times.len() as f64).ceil() as usize).clamp(1, times.len()) - 1];
    let _ = writeln!(
        out,
        "latency over {} runs (after {} warm-up): min {}  median {}  p90 {}  mean {}",
        a.runs,
        a.warmup,
        ms(times[0]),
        ms(pct(0.5)),
        ms(pct(0.9)),
        ms(total / a.runs as u32)
    );
    let per_s = a.runs as f64 / total.as_secs_f64();
    let batch = f
        .params()
        .first()
        .and_then(|&x| f.ty(x).dims().first().copied())
        .filter(|_| f.params().len() == 1);
    let _ = match batch {
        Some(b) if b > 1 => writeln!(
            out,
            "throughput: {per_s:.1} runs/s, {:.1} items/s (batch {b}, the input's first dimension)",
            per_s * b as f64
        ),
        _ => writeln!(out, "throughput: {per_s:.1} runs/s"),
    };
    if let Some(p) = exe.profile() {
        let _ = write!(io.stderr, "{p:#}");
    }
    Ok(())
}

/// A duration in milliseconds, to three significant digits or more.
fn ms(d: Duration) -> String {
    let v = d.as_secs_f64() * 1e3;
    if v >= 100.0 {
        format!("{v:.1} ms")
    } else if v >= 1.0 {
        format!("{v:.2} ms")
    } else {
        // Three significant digits down to a nanosecond: a one-op program runs in about a
        // microsecond.
        let decimals = (2.0 - v.max(1e-6).log10().floor()).clamp(3.0, 6.0) as usize;
        format!("{v:.decimals$} ms")
    }
}

/// The CPU's model name (Linux), or the architecture.
fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

//! `tcc opt`: run a pass pipeline over an IR file and print the result.

use crate::Error;
use crate::io::Io;
use std::time::Duration;
use tcc_passes::{PassManager, Pipeline};

// The arguments of `tcc opt`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// The pipeline: `name{key=value,...},name2,...`.
    #[arg(long)]
    pub passes: String,
    /// The IR file (`-` for stdin).
    pub file: String,
    /// Write the result here instead of stdout.
    #[arg(short = 'o', long = "output")]
    pub output: Option<String>,
    /// Print the IR to stderr after every pass.
    #[arg(long)]
    pub print_after_all: bool,
    /// Print each pass's wall time to stderr.
    #[arg(long)]
    pub time_passes: bool,
    /// Verify after every pass (always on in debug builds).
    #[arg(long)]
    pub verify_each: bool,
}

pub(crate) fn run(a: Args, io: &mut Io) -> Result<(), Error> {
    let pipeline = Pipeline::parse(&a.passes).map_err(|e| Error::usage(format!("error: {e}")))?;
    let (input, mut m) = io.load(&a.file)?;
    let mut pm = PassManager::new(pipeline);
    pm.verify_each |= a.verify_each;
    pm.print_after_all = a.print_after_all;
    let runs = pm
        .run(&mut m, io.stderr)
        .map_err(|e| Error::input(format!("{}: error: {e}", input.name)))?;
    if a.time_passes {
        for r in runs.iter().filter(|r| !r.notes.is_empty()) {
            for n in &r.notes {
                let _ = writeln!(io.stderr, "{}: {n}", r.label);
            }
        }
        let times: Vec<(String, Duration)> = runs.into_iter().map(|r| (r.label, r.time)).collect();
        let _ = write!(io.stderr, "{}", time_table(&times));
    }
    io.write_module(m, a.output.as_deref())
}

/// Each pass's wall time and share, and the total.
fn time_table(times: &[(String, Duration)]) -> String {
    let total: Duration = times.iter().map(|t| t.1).sum();
    let width = times.iter().map(|t| t.0.len()).max().unwrap_or(4).max(5);
    let mut s = format!("{:<width$}  {:>12}  {:>6}\n", "pass", "time (ms)", "%");
    for (name, t) in times {
        let pct = if total.is_zero() {
            0.0
        } else {
            100.0 * t.as_secs_f64() / total.as_secs_f64()
        };
        s += &format!(
            "{name:<width$}  {:>12.3}  {pct:>5.1}%\n",
            t.as_secs_f64() * 1e3
        );
    }
    s += &format!(
        "{:<width$}  {:>12.3}  {:>5.1}%\n",
        "total",
        total.as_secs_f64() * 1e3,
        100.0
    );
    s
}

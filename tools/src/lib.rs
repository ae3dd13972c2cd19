//! The `tcc` driver, as a library so that tests run exactly the code the binary runs.
//!
//! [`run`] takes the arguments and the three standard streams and returns the exit code:
//! 0 on success, 1 when the input has an error (diagnostics on stderr), 2 on bad usage.

#![deny(missing_docs)]

use clap::{Parser, Subcommand};
use std::io::{Read, Write};
use std::time::Duration;
use tcc_ir::{Module, parse_bytes, verify_module};
use tcc_passes::{PassManager, Pipeline};

/// Exit code for success.
pub const EXIT_OK: i32 = 0;
/// Exit code for an error in the input.
pub const EXIT_INPUT: i32 = 1;
/// Exit code for bad usage.
pub const EXIT_USAGE: i32 = 2;

#[derive(Parser, Debug)]
#[command(
    name = "tcc",
    version,
    about = "tcc, a tensor compiler: read, check, transform and run tensor IR",
    after_help = "Examples:\n  tcc cat examples/mlp.tir\n  tcc opt --passes='canonicalize,cse,dce' examples/mlp.tir\n\nFILE may be `-` for standard input. Exit status: 0 ok, 1 error in the input, 2 bad usage."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Parse and verify an IR file, then print it in canonical form.
    #[command(after_help = "Example:\n  tcc cat examples/mlp.tir")]
    Cat {
        /// The IR file (`-` for stdin).
        file: String,
    },
    /// Parse and verify an IR file; print a one-line summary.
    #[command(after_help = "Example:\n  tcc verify examples/mlp.tir")]
    Verify {
        /// The IR file (`-` for stdin).
        file: String,
    },
    /// Run a pass pipeline over an IR file and print the result.
    #[command(
        after_help = "Example:\n  tcc opt --passes='canonicalize{fold-limit=64},cse,dce' examples/mlp.tir -o out.tir\n\nRun `tcc passes` for the list of passes and their options."
    )]
    Opt {
        /// The pipeline: `name{key=value,...},name2,...`.
        #[arg(long)]
        passes: String,
        /// The IR file (`-` for stdin).
        file: String,
        /// Write the result here instead of stdout.
        #[arg(short = 'o', long = "output")]
        output: Option<String>,
        /// Print the IR to stderr after every pass.
        #[arg(long)]
        print_after_all: bool,
        /// Print each pass's wall time to stderr.
        #[arg(long)]
        time_passes: bool,
        /// Verify after every pass (always on in debug builds).
        #[arg(long)]
        verify_each: bool,
    },
    /// List the registered passes and their options.
    Passes,
}

/// Where an input came from and its bytes.
struct Input {
    name: String,
    bytes: Vec<u8>,
}

fn read_input(file: &str, stdin: &mut dyn Read) -> Result<Input, String> {
    let mut bytes = Vec::new();
    if file == "-" {
        stdin
            .read_to_end(&mut bytes)
            .map_err(|e| format!("error: cannot read standard input: {e}"))?;
        Ok(Input {
            name: "<stdin>".into(),
            bytes,
        })
    } else {
        let bytes = std::fs::read(file).map_err(|e| format!("error: cannot read `{file}`: {e}"))?;
        Ok(Input {
            name: file.to_string(),
            bytes,
        })
    }
}

/// Parses and verifies; on failure returns the rendered diagnostics.
fn load(input: &Input) -> Result<Module, String> {
    let src = String::from_utf8_lossy(&input.bytes);
    let m = parse_bytes(&input.bytes).map_err(|d| d.render(&input.name, &src))?;
    verify_module(&m).map_err(|d| d.render(&input.name, &src))?;
    Ok(m)
}

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

/// Runs the driver with `args` (including the program name) and returns the exit code.
pub fn run(
    args: &[String],
    stdin: &mut dyn Read,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> i32 {
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            let text = e.render().to_string();
            return if e.use_stderr() {
                let _ = write!(stderr, "{text}");
                EXIT_USAGE
            } else {
                let _ = write!(stdout, "{text}");
                EXIT_OK
            };
        }
    };
    let result = match cli.cmd {
        Cmd::Cat { file } => read_input(&file, stdin)
            .map_err(|e| (EXIT_INPUT, e))
            .and_then(|i| load(&i).map_err(|e| (EXIT_INPUT, e)))
            .map(|m| {
                let _ = write!(stdout, "{m}");
            }),
        Cmd::Verify { file } => read_input(&file, stdin)
            .map_err(|e| (EXIT_INPUT, e))
            .and_then(|i| load(&i).map(|m| (i, m)).map_err(|e| (EXIT_INPUT, e)))
            .map(|(i, m)| {
                let _ = writeln!(
                    stdout,
                    "{}: ok ({} function{}, {} ops)",
                    i.name,
                    m.functions.len(),
                    if m.functions.len() == 1 { "" } else { "s" },
                    m.num_ops()
                );
            }),
        Cmd::Opt {
            passes,
            file,
            output,
            print_after_all,
            time_passes,
            verify_each,
        } => opt(
            &passes,
            &file,
            output.as_deref(),
            print_after_all,
            time_passes,
            verify_each,
            stdin,
            stdout,
            stderr,
        ),
        Cmd::Passes => {
            for p in tcc_passes::registry() {
                let _ = writeln!(stdout, "{:<14} {}", p.name, p.summary);
                for o in p.options {
                    let _ = writeln!(stdout, "  {:<12} {}", o.name, o.help);
                }
            }
            Ok(())
        }
    };
    match result {
        Ok(()) => EXIT_OK,
        Err((code, msg)) => {
            let _ = write!(stderr, "{msg}");
            if !msg.ends_with('\n') {
                let _ = writeln!(stderr);
            }
            code
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn opt(
    passes: &str,
    file: &str,
    output: Option<&str>,
    print_after_all: bool,
    time_passes: bool,
    verify_each: bool,
    stdin: &mut dyn Read,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> Result<(), (i32, String)> {
    let pipeline = Pipeline::parse(passes).map_err(|e| (EXIT_USAGE, format!("error: {e}")))?;
    let input = read_input(file, stdin).map_err(|e| (EXIT_INPUT, e))?;
    let mut m = load(&input).map_err(|e| (EXIT_INPUT, e))?;
    let mut pm = PassManager::new(pipeline);
    pm.verify_each |= verify_each;
    pm.print_after_all = print_after_all;
    let times = pm
        .run(&mut m, stderr)
        .map_err(|e| (EXIT_INPUT, format!("{}: error: {e}", input.name)))?;
    if time_passes {
        let _ = write!(stderr, "{}", time_table(&times));
    }
    let text = m.to_string();
    match output {
        Some(path) if path != "-" => std::fs::write(path, text)
            .map_err(|e| (EXIT_INPUT, format!("error: cannot write `{path}`: {e}")))?,
        _ => {
            let _ = write!(stdout, "{text}");
        }
    }
    Ok(())
}

//! The `tcc` driver, as a library so that tests run exactly the code the binary runs.
//!
//! [`run`] takes the arguments and the three standard streams and returns the exit code:
//! 0 on success, 1 when the input has an error (diagnostics on stderr), 2 on bad usage.

#![deny(missing_docs)]

pub mod npy;
pub mod train;

use clap::{Parser, Subcommand};
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::time::Duration;
use tcc_ir::random::{Rng, random_tensor};
use tcc_ir::{Data, Function, Tensor};
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
    after_help = "Examples:\n  tcc cat examples/mlp.tir\n  tcc opt --passes='canonicalize,cse,dce' examples/mlp.tir\n  tcc train examples/spirals_mlp.tir --data examples/data/spirals --steps 300\n\nFILE may be `-` for standard input. Exit status: 0 ok, 1 error in the input, 2 bad usage."
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
    /// Import an ONNX model and print it as IR.
    #[command(
        after_help = "Examples:\n  tcc import model.onnx -o model.tir\n  tcc import model.onnx --shape input=1,3,224,224\n\nWeights become constants; value names are the model's. See docs/onnx.md."
    )]
    Import {
        /// The ONNX model (`-` for stdin).
        file: String,
        /// Bind a graph input's shape, for inputs with dynamic dimensions (repeatable).
        #[arg(long = "shape", value_name = "NAME=D0,D1,...")]
        shapes: Vec<String>,
        /// Fix a graph input to the value in a .npy file, making it a constant (repeatable);
        /// needed for inputs that decide shapes, such as a Reshape target.
        #[arg(long = "const", value_name = "NAME=PATH.npy")]
        consts: Vec<String>,
        /// Write the IR here instead of stdout.
        #[arg(short = 'o', long = "output")]
        output: Option<String>,
    },
    /// Run a function on inputs and print a line per result.
    #[command(
        after_help = "Examples:\n  tcc run examples/mlp.tir\n  tcc run model.onnx --shape input=1,3,224,224\n  tcc run examples/mlp.tir --input x=x.npy --input labels=zeros --output out/ --stats\n\nAn input is PATH.npy, random[:SEED] (floats in [-1,1), integers in [0,8)) or zeros; inputs not\ngiven are random with a fixed seed. With --output, each result is written as DIR/<name>.npy."
    )]
    Run {
        /// The IR file or ONNX model (`-` for stdin).
        file: String,
        /// For ONNX models: bind a graph input's shape (repeatable).
        #[arg(long = "shape", value_name = "NAME=D0,D1,...")]
        shapes: Vec<String>,
        /// For ONNX models: fix a graph input to the value in a .npy file (repeatable).
        #[arg(long = "const", value_name = "NAME=PATH.npy")]
        consts: Vec<String>,
        /// The function to run (needed when the file defines several).
        #[arg(long)]
        func: Option<String>,
        /// An input: NAME=PATH.npy, NAME=random[:SEED] or NAME=zeros (repeatable).
        #[arg(long = "input", value_name = "NAME=SPEC")]
        inputs: Vec<String>,
        /// Write each result to DIR/<result name>.npy.
        #[arg(long)]
        output: Option<String>,
        /// Run with the reference interpreter instead of the compiled code.
        #[arg(long)]
        interp: bool,
        /// Print to stderr how the kernels ran (compiled or reference) and the arena size.
        #[arg(long)]
        stats: bool,
        /// What to compile for: `host` (the default) or the host's target triple, optionally
        /// followed by CPU features to turn off, as in `host,-fma,-avx2`.
        #[arg(long, value_name = "SPEC")]
        target: Option<String>,
        /// Time each compiled step and print to stderr where the time went, largest first.
        #[arg(long)]
        profile: bool,
    },
    /// Print how each function is cut into kernels and where its values live in the arena.
    #[command(after_help = "Example:\n  tcc plan examples/mlp.tir")]
    Plan {
        /// The IR file (`-` for stdin).
        file: String,
    },
    /// Differentiate: print each function with d(loss)/d(x) appended to its results.
    #[command(
        after_help = "Examples:\n  tcc grad examples/spirals_mlp.tir\n  tcc grad examples/spirals_mlp.tir --wrt fc1/w,fc2/ --stop %h\n\nThe same as `tcc opt --passes='grad{...}'`; the op counts before and after go to stderr."
    )]
    Grad {
        /// The IR file (`-` for stdin).
        file: String,
        /// Differentiate only this function (default: every function).
        #[arg(long)]
        func: Option<String>,
        /// What to differentiate with respect to: value names or `scope/` (default: every
        /// floating-point parameter).
        #[arg(long, value_delimiter = ',')]
        wrt: Vec<String>,
        /// The values to differentiate (default: the single floating-point scalar result).
        #[arg(long, value_delimiter = ',')]
        ys: Vec<String>,
        /// Values to treat as constants.
        #[arg(long, value_delimiter = ',')]
        stop: Vec<String>,
        /// Take the seed cotangents as new parameters `grad/<y>` instead of ones.
        #[arg(long)]
        grad_ys: bool,
        /// Fail if some x does not affect the ys (default: its gradient is zeros).
        #[arg(long)]
        strict: bool,
        /// Write the result here instead of stdout.
        #[arg(short = 'o', long = "output")]
        output: Option<String>,
    },
    /// Train: loop a train step (grad + optimizer) through the JIT and save the parameters.
    #[command(
        after_help = "Example:\n  tcc train examples/spirals_mlp.tir --data examples/data/spirals --steps 500 --lr 0.01 --save out/\n\nThe function's first result is the loss; other scalar results are printed beside it.\nParameters with a file DATA/<name>.npy are data (a file with a multiple of the parameter's rows\nis fed as consecutive mini-batches); the other floating-point parameters are trained, starting\nfrom INIT/<name>.npy or a fixed-seed initialisation. See docs/passes.md."
    )]
    Train {
        /// The IR file (`-` for stdin).
        file: String,
        /// The loss function (needed when the file defines several).
        #[arg(long)]
        func: Option<String>,
        /// Number of train steps.
        #[arg(long)]
        steps: usize,
        /// Directory of data arrays, `<parameter name>.npy` (`/` in names becomes `_`).
        #[arg(long)]
        data: Option<String>,
        /// Directory of initial parameter values.
        #[arg(long)]
        init: Option<String>,
        /// sgd, momentum or adam.
        #[arg(long, default_value = "adam")]
        optimizer: String,
        /// Learning rate.
        #[arg(long, default_value_t = 0.01)]
        lr: f64,
        /// Print the loss every N steps (default: ten times in all).
        #[arg(long, default_value_t = 0)]
        every: usize,
        /// Save the trained parameters as DIR/<name>.npy.
        #[arg(long)]
        save: Option<String>,
        /// Gradient checkpointing: the options of a `remat` pass run after `grad`, as in
        /// `--remat budget=0.5` or `--remat strategy=memory`.
        #[arg(long, value_name = "OPTIONS")]
        remat: Option<String>,
    },
    /// Memory analysis: the peak of live activation bytes over the schedule, the largest
    /// tensors live at the peak, and (with --svg) a chart of live bytes per op.
    #[command(
        after_help = "Examples:\n  tcc mem examples/digits_cnn.tir\n  tcc mem f.tir --passes='grad' --svg mem.svg\n\nWith --passes, the function is shown before and after the pipeline. See docs/passes.md."
    )]
    Mem {
        /// The IR file (`-` for stdin).
        file: String,
        /// Only this function (default: every function).
        #[arg(long)]
        func: Option<String>,
        /// A pipeline to run first; both versions are reported.
        #[arg(long)]
        passes: Option<String>,
        /// Write a chart of live bytes over the schedule to this SVG file.
        #[arg(long)]
        svg: Option<String>,
        /// How many of the largest live tensors to list.
        #[arg(long, default_value_t = 8)]
        top: usize,
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

/// ONNX import options from `--shape` and `--const` flags.
fn onnx_options(shapes: &[String], consts: &[String]) -> Result<tcc_onnx::Options, (i32, String)> {
    let mut opts = tcc_onnx::Options::default();
    for s in shapes {
        opts.add_shape(s)
            .map_err(|e| (EXIT_USAGE, format!("error: {e}")))?;
    }
    for c in consts {
        let (name, path) = c.split_once('=').ok_or_else(|| {
            (
                EXIT_USAGE,
                format!("error: --const `{c}`: expected NAME=PATH.npy"),
            )
        })?;
        let bytes = std::fs::read(path).map_err(|e| {
            (
                EXIT_INPUT,
                format!("error: --const {name}: cannot read `{path}`: {e}"),
            )
        })?;
        let t = npy::read(&bytes)
            .map_err(|e| (EXIT_INPUT, format!("error: --const {name}: `{path}`: {e}")))?;
        opts.constants.push((name.to_string(), t));
    }
    Ok(opts)
}

/// Imports an ONNX model, looking up external data beside the model file.
fn import_onnx(input: &Input, opts: &tcc_onnx::Options) -> Result<Module, String> {
    let mut opts = opts.clone();
    if opts.dir.is_none() && input.name != "<stdin>" {
        let dir = std::path::Path::new(&input.name).parent();
        opts.dir = Some(dir.unwrap_or(std::path::Path::new(".")).to_path_buf());
    }
    tcc_onnx::import(&input.bytes, &opts).map_err(|e| format!("error: {}: {e}", input.name))
}

/// Whether an input is an ONNX model: a `.onnx` file, or bytes that start as a serialized
/// `ModelProto` does (field 1, `ir_version`, a varint: byte 0x08), which IR text never does.
fn is_onnx(input: &Input) -> bool {
    input.name.ends_with(".onnx") || input.bytes.first() == Some(&0x08)
}

/// Parses and verifies IR, or imports an ONNX model; on failure returns the rendered
/// diagnostics.
fn load(input: &Input) -> Result<Module, String> {
    load_with(input, &tcc_onnx::Options::default())
}

/// [`load`] with options for ONNX models (`--shape` bindings).
fn load_with(input: &Input, onnx: &tcc_onnx::Options) -> Result<Module, String> {
    if is_onnx(input) {
        return import_onnx(input, onnx);
    }
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
        Cmd::Import {
            file,
            shapes,
            consts,
            output,
        } => onnx_options(&shapes, &consts).and_then(|opts| {
            let input = read_input(&file, stdin).map_err(|e| (EXIT_INPUT, e))?;
            let m = import_onnx(&input, &opts).map_err(|e| (EXIT_INPUT, e))?;
            write_module(&m, output.as_deref(), stdout)
        }),
        Cmd::Run {
            file,
            shapes,
            consts,
            func,
            inputs,
            output,
            interp,
            stats,
            target,
            profile,
        } => onnx_options(&shapes, &consts).and_then(|onnx| {
            run_cmd(
                &file,
                &onnx,
                func.as_deref(),
                &inputs,
                output.as_deref(),
                (interp, stats, profile, target.as_deref()),
                stdin,
                stdout,
                stderr,
            )
        }),
        Cmd::Plan { file } => read_input(&file, stdin)
            .map_err(|e| (EXIT_INPUT, e))
            .and_then(|i| load(&i).map_err(|e| (EXIT_INPUT, e)))
            .map(|m| {
                for (i, f) in m.functions.iter().enumerate() {
                    let p = tcc_codegen::plan(f);
                    let mem = tcc_codegen::plan_memory(f, &p, &tcc_codegen::Cpu::default());
                    let mut text = String::new();
                    if i > 0 {
                        text.push('\n');
                    }
                    let _ = tcc_codegen::write_plan(&mut text, f, &p);
                    let _ = tcc_codegen::write_memory(&mut text, f, &mem);
                    let _ = write!(stdout, "{text}");
                }
            }),
        Cmd::Grad {
            file,
            func,
            wrt,
            ys,
            stop,
            grad_ys,
            strict,
            output,
        } => {
            let opts = tcc_passes::GradOptions {
                ys,
                wrt: if wrt.is_empty() {
                    tcc_passes::grad::Wrt::Params
                } else {
                    tcc_passes::grad::Wrt::Select(wrt)
                },
                stop,
                grad_ys,
                unconnected: if strict {
                    tcc_passes::grad::Unconnected::Error
                } else {
                    tcc_passes::grad::Unconnected::Zero
                },
            };
            grad_cmd(
                &file,
                func.as_deref(),
                &opts,
                output.as_deref(),
                stdin,
                stdout,
                stderr,
            )
        }
        Cmd::Train {
            file,
            func,
            steps,
            data,
            init,
            optimizer,
            lr,
            every,
            save,
            remat,
        } => (|| {
            let mut o = tcc_passes::Options::default();
            o.0.push(("lr".into(), lr.to_string()));
            let optimizer = match optimizer.as_str() {
                "sgd" | "momentum" | "adam" => tcc_passes::optim::options(&optimizer, &o)
                    .map_err(|e| (EXIT_USAGE, format!("error: {e}")))?,
                other => {
                    return Err((
                        EXIT_USAGE,
                        format!("error: unknown optimizer `{other}`; choose sgd, momentum or adam"),
                    ));
                }
            };
            let remat = remat
                .map(|spec| {
                    tcc_passes::remat::Remat::parse(&spec)
                        .map_err(|e| (EXIT_INPUT, format!("error: --remat {spec}: {}", e.message)))
                })
                .transpose()?;
            let input = read_input(&file, stdin).map_err(|e| (EXIT_INPUT, e))?;
            let m = load(&input).map_err(|e| (EXIT_INPUT, e))?;
            let f = pick_function(&m, func.as_deref(), &input.name).map_err(|e| (EXIT_INPUT, e))?;
            let args = train::TrainArgs {
                steps,
                data: data.as_deref(),
                init: init.as_deref(),
                optimizer,
                save: save.as_deref(),
                every,
                remat: remat.as_ref(),
            };
            train::train(f, &args, stdout, stderr).map_err(|e| (EXIT_INPUT, e))
        })(),
        Cmd::Mem {
            file,
            func,
            passes,
            svg,
            top,
        } => mem_cmd(
            &file,
            func.as_deref(),
            passes.as_deref(),
            svg.as_deref(),
            top,
            stdin,
            stdout,
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
    write_module(&m, output, stdout)
}

fn grad_cmd(
    file: &str,
    func: Option<&str>,
    opts: &tcc_passes::GradOptions,
    output: Option<&str>,
    stdin: &mut dyn Read,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> Result<(), (i32, String)> {
    let input = read_input(file, stdin).map_err(|e| (EXIT_INPUT, e))?;
    let mut m = load(&input).map_err(|e| (EXIT_INPUT, e))?;
    if let Some(name) = func {
        pick_function(&m, Some(name), &input.name).map_err(|e| (EXIT_INPUT, e))?;
    }
    let wanted = func.map(|n| n.trim_start_matches('@').to_string());
    for f in &mut m.functions {
        if wanted.as_ref().is_some_and(|w| *w != f.name) {
            continue;
        }
        let s = tcc_passes::grad(f, opts).map_err(|e| {
            (
                EXIT_INPUT,
                format!("{}: error: in `@{}`: {e}", input.name, f.name),
            )
        })?;
        tcc_ir::verify_function(f).map_err(|d| {
            (
                EXIT_INPUT,
                format!("internal compiler error: the gradient of `@{}` does not verify (a bug in tcc)\n{d}", f.name),
            )
        })?;
        let _ = writeln!(
            stderr,
            "grad @{}: {} forward ops -> {} ops with the gradients of {} values ({:.2}x)",
            f.name,
            s.forward_ops,
            s.total_ops,
            s.xs,
            s.total_ops as f64 / s.forward_ops.max(1) as f64
        );
    }
    write_module(&m, output, stdout)
}

/// One function's memory report.
fn mem_report(f: &Function, label: &str, top: usize) -> (String, Vec<u64>) {
    use tcc_passes::analysis::memory::{analyze, human};
    let p = analyze(f);
    let mut s = String::new();
    let mut head = String::new();
    let _ = tcc_ir::printer::write_name(&mut head, '@', &f.name);
    let _ = writeln!(
        s,
        "{head}{label}: {} ops; peak {} of activations at schedule position {}; parameters {}, constants {}",
        f.schedule().len(),
        human(p.peak),
        p.peak_at,
        human(p.param_bytes),
        human(p.const_bytes)
    );
    if let Some(&op) = f.schedule().get(p.peak_at) {
        let _ = writeln!(
            s,
            "  running then: {}",
            tcc_ir::diag::clip(&f.describe_op(op))
        );
    }
    let _ = writeln!(
        s,
        "  without the {} of results it returns: peak {} at schedule position {}",
        human(p.result_bytes),
        human(p.temps_peak.0),
        p.temps_peak.1
    );
    let live = p.live_at(p.peak_at);
    let _ = writeln!(s, "  largest of the {} tensors live there:", live.len());
    for b in live.iter().take(top) {
        let mut name = String::new();
        let _ = tcc_ir::printer::write_name(&mut name, '%', f.name(b.value));
        let last = if b.last >= f.schedule().len() {
            "the end (a result)".to_string()
        } else {
            format!("position {}", b.last)
        };
        let _ = writeln!(
            s,
            "    {:>11}  {name}  {}  (position {} to {last})",
            human(b.bytes),
            f.ty(b.value),
            b.first
        );
    }
    let plan = tcc_codegen::plan(f);
    let m = tcc_codegen::plan_memory(f, &plan, &tcc_codegen::Cpu::default());
    let _ = writeln!(
        s,
        "  CPU backend: arena {} (live peak {}) plus {} of results, after fusion and in-place reuse",
        human(m.arena_bytes),
        human(m.live_peak_bytes),
        human(m.output_bytes)
    );
    (s, p.live)
}

#[allow(clippy::too_many_arguments)]
fn mem_cmd(
    file: &str,
    func: Option<&str>,
    passes: Option<&str>,
    svg: Option<&str>,
    top: usize,
    stdin: &mut dyn Read,
    stdout: &mut dyn Write,
) -> Result<(), (i32, String)> {
    let pipeline = passes
        .map(Pipeline::parse)
        .transpose()
        .map_err(|e| (EXIT_USAGE, format!("error: {e}")))?;
    let input = read_input(file, stdin).map_err(|e| (EXIT_INPUT, e))?;
    let m = load(&input).map_err(|e| (EXIT_INPUT, e))?;
    if let Some(name) = func {
        pick_function(&m, Some(name), &input.name).map_err(|e| (EXIT_INPUT, e))?;
    }
    let after = match &pipeline {
        Some(p) => {
            let mut m2 = m.clone();
            PassManager::new(p.clone())
                .run(&mut m2, &mut std::io::sink())
                .map_err(|e| (EXIT_INPUT, format!("{}: error: {e}", input.name)))?;
            Some(m2)
        }
        None => None,
    };
    let wanted = func.map(|n| n.trim_start_matches('@'));
    let mut charts: Vec<(String, Vec<u64>)> = Vec::new();
    for (i, f) in m.functions.iter().enumerate() {
        if wanted.is_some_and(|w| w != f.name) {
            continue;
        }
        let before_label = if pipeline.is_some() { " (before)" } else { "" };
        let (text, live) = mem_report(f, before_label, top);
        let _ = write!(stdout, "{text}");
        charts.push((format!("@{}{before_label}", f.name), live));
        if let (Some(m2), Some(p)) = (&after, &pipeline) {
            let g = &m2.functions[i];
            let (text, live) = mem_report(g, &format!(" (after {p})"), top);
            let _ = write!(stdout, "{text}");
            charts.push((format!("@{} (after {p})", g.name), live));
        }
    }
    if let Some(path) = svg {
        let series: Vec<(&str, &[u64])> = charts
            .iter()
            .map(|(l, v)| (l.as_str(), v.as_slice()))
            .collect();
        let text = tcc_passes::analysis::memory::svg(
            &format!("live activation bytes: {}", input.name),
            &series,
        );
        std::fs::write(path, text)
            .map_err(|e| (EXIT_INPUT, format!("error: cannot write `{path}`: {e}")))?;
    }
    Ok(())
}

/// Prints a module to `output` (a file, or stdout when absent or `-`).
fn write_module(
    m: &Module,
    output: Option<&str>,
    stdout: &mut dyn Write,
) -> Result<(), (i32, String)> {
    let text = m.to_string();
    match output {
        Some(path) if path != "-" => std::fs::write(path, text)
            .map_err(|e| (EXIT_INPUT, format!("error: cannot write `{path}`: {e}"))),
        _ => {
            let _ = write!(stdout, "{text}");
            Ok(())
        }
    }
}

/// The function `run` should execute.
fn pick_function<'m>(
    m: &'m Module,
    func: Option<&str>,
    file: &str,
) -> Result<&'m Function, String> {
    let names = || {
        m.functions
            .iter()
            .map(|f| format!("@{}", f.name))
            .collect::<Vec<_>>()
            .join(", ")
    };
    match func {
        Some(name) => {
            let name = name.trim_start_matches('@');
            m.function(name).ok_or_else(|| {
                format!(
                    "error: `{file}` has no function `@{name}`; it defines {}",
                    names()
                )
            })
        }
        None if m.functions.len() == 1 => Ok(&m.functions[0]),
        None => Err(format!(
            "error: `{file}` defines {} functions ({}); choose one with --func",
            m.functions.len(),
            names()
        )),
    }
}

/// Builds the input for parameter `i` from its spec (default `random` with a per-parameter seed).
fn make_input(f: &Function, i: usize, spec: Option<&str>) -> Result<Tensor, String> {
    let p = f.params()[i];
    let ty = f.ty(p);
    let name = f.name(p);
    let spec = spec.unwrap_or("random");
    if spec == "zeros" {
        return Tensor::zeros(ty.clone()).map_err(|e| format!("error: input `{name}`: {e}"));
    }
    if let Some(rest) = spec.strip_prefix("random") {
        let seed = match rest.strip_prefix(':') {
            Some(s) => s.parse::<u64>().map_err(|_| {
                format!(
                    "error: input `{name}`: bad seed `{s}` in `{spec}`; expected random:<integer>"
                )
            })?,
            None if rest.is_empty() => 0x7cc0_0000 + i as u64,
            None => {
                return Err(format!(
                    "error: input `{name}`: bad spec `{spec}`; expected PATH.npy, random[:SEED] or zeros"
                ));
            }
        };
        return Ok(random_tensor(ty, &mut Rng::new(seed)));
    }
    let bytes = std::fs::read(spec)
        .map_err(|e| format!("error: input `{name}`: cannot read `{spec}`: {e}"))?;
    let t = npy::read(&bytes).map_err(|e| format!("error: input `{name}`: `{spec}`: {e}"))?;
    if t.ty() != ty {
        return Err(format!(
            "error: input `{name}`: `{spec}` holds {}, but the parameter is {ty}",
            t.ty()
        ));
    }
    Ok(t)
}

/// One line describing a result: its type and the range and mean of its elements.
fn summary(t: &Tensor) -> String {
    let vals: Vec<f64> = match t.data() {
        Data::F32(v) => v.iter().map(|&x| x as f64).collect(),
        Data::F64(v) => v.clone(),
        Data::I8(v) => v.iter().map(|&x| x as f64).collect(),
        Data::U8(v) => v.iter().map(|&x| x as f64).collect(),
        Data::I32(v) => v.iter().map(|&x| x as f64).collect(),
        Data::I64(v) => v.iter().map(|&x| x as f64).collect(),
        Data::Bool(v) => v.iter().map(|&x| x as u8 as f64).collect(),
    };
    if vals.is_empty() {
        return format!("{} (empty)", t.ty());
    }
    let nans = vals.iter().filter(|x| x.is_nan()).count();
    let finite = vals.iter().copied().filter(|x| !x.is_nan());
    let min = finite.clone().fold(f64::INFINITY, f64::min);
    let max = finite.fold(f64::NEG_INFINITY, f64::max);
    let mean = vals.iter().sum::<f64>() / vals.len() as f64;
    let mut s = format!("{}  min {min:.6}  max {max:.6}  mean {mean:.6}", t.ty());
    if nans > 0 {
        s += &format!("  ({nans} NaN)");
    }
    s
}

#[allow(clippy::too_many_arguments)]
fn run_cmd(
    file: &str,
    onnx: &tcc_onnx::Options,
    func: Option<&str>,
    specs: &[String],
    output: Option<&str>,
    (interp, stats, profile, target): (bool, bool, bool, Option<&str>),
    stdin: &mut dyn Read,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> Result<(), (i32, String)> {
    let input = read_input(file, stdin).map_err(|e| (EXIT_INPUT, e))?;
    let m = load_with(&input, onnx).map_err(|e| (EXIT_INPUT, e))?;
    let f = pick_function(&m, func, &input.name).map_err(|e| (EXIT_INPUT, e))?;
    tcc_ir::interp::check_sizes(f).map_err(|e| (EXIT_INPUT, format!("error: {e}")))?;
    let mut given: Vec<Option<&str>> = vec![None; f.params().len()];
    for s in specs {
        let (name, spec) = s.split_once('=').ok_or_else(|| {
            (
                EXIT_USAGE,
                format!("error: --input `{s}`: expected NAME=SPEC"),
            )
        })?;
        let name = name.trim_start_matches('%');
        let i = f.params().iter().position(|&p| f.name(p) == name).ok_or_else(|| {
            let params: Vec<&str> = f.params().iter().map(|&p| f.name(p)).collect();
            (EXIT_USAGE, format!("error: --input `{s}`: `@{}` has no parameter `{name}`; its parameters are {}", f.name, params.join(", ")))
        })?;
        given[i] = Some(spec);
    }
    let inputs: Vec<Tensor> = (0..f.params().len())
        .map(|i| make_input(f, i, given[i]))
        .collect::<Result<_, _>>()
        .map_err(|e| (EXIT_INPUT, e))?;
    let results = if interp {
        tcc_ir::interp::run(f, &inputs).map_err(|e| (EXIT_INPUT, format!("error: {e}")))?
    } else {
        let cpu = tcc_codegen::Cpu {
            target: target.map(str::to_string),
            profile,
        };
        let exe = tcc_codegen::compile(&cpu, f).map_err(|e| (EXIT_USAGE, format!("error: {e}")))?;
        if stats {
            let s = exe.stats();
            let _ = writeln!(
                stderr,
                "kernels: {} compiled, {} native, {} on reference kernels, {} views, {} dead; arena {} bytes, outputs {} bytes",
                s.compiled, s.native, s.reference, s.views, s.dead, s.arena_bytes, s.output_bytes
            );
            let slow = exe.reference_ops();
            if !slow.is_empty() {
                let _ = writeln!(stderr, "on reference kernels: {}", slow.join(" "));
            }
        }
        let results = exe
            .run(&inputs)
            .map_err(|e| (EXIT_INPUT, format!("error: {e}")))?;
        if let Some(p) = exe.profile() {
            let _ = write!(stderr, "{p}");
        }
        results
    };
    if let Some(dir) = output {
        std::fs::create_dir_all(dir)
            .map_err(|e| (EXIT_INPUT, format!("error: cannot create `{dir}`: {e}")))?;
    }
    let mut used = std::collections::HashSet::new();
    for (i, (&r, t)) in f.results().iter().zip(&results).enumerate() {
        let mut line = String::new();
        let _ = tcc_ir::printer::write_name(&mut line, '%', f.name(r));
        let _ = writeln!(stdout, "{line}: {}", summary(t));
        if let Some(dir) = output {
            let mut stem = train::file_stem(f.name(r));
            if !used.insert(stem.clone()) {
                stem = i.to_string();
                used.insert(stem.clone());
            }
            let path = std::path::Path::new(dir).join(format!("{stem}.npy"));
            std::fs::write(&path, npy::write(t)).map_err(|e| {
                (
                    EXIT_INPUT,
                    format!("error: cannot write `{}`: {e}", path.display()),
                )
            })?;
        }
    }
    Ok(())
}

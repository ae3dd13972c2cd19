//! The `tcc` driver, as a library so that tests run exactly the code the binary runs.
//!
//! [`run`] takes the arguments and the three standard streams and returns the exit code:
//! 0 on success, 1 when the input has an error (diagnostics on stderr), 2 on bad usage.
//!
//! Each subcommand is one file under `cmd/` with its arguments (`Args`) and a `run` that gets
//! the shared I/O context (`io.rs`: the streams, reading and loading inputs, writing modules)
//! and fails with the one [`Error`] type.

#![deny(missing_docs)]

mod cmd;
pub mod embed;
mod io;
pub mod npy;
pub mod train;
mod weights;

use clap::{Parser, Subcommand};
use std::io::{Read, Write};

/// Exit code for success.
pub const EXIT_OK: i32 = 0;
/// Exit code for an error in the input.
pub const EXIT_INPUT: i32 = 1;
/// Exit code for bad usage.
pub const EXIT_USAGE: i32 = 2;

/// A subcommand's failure: the exit code and the message for stderr.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    /// [`EXIT_INPUT`] or [`EXIT_USAGE`].
    pub code: i32,
    /// What went wrong, rendered (diagnostics with their source lines).
    pub message: String,
    /// Which kind of input error, for embedders that report them apart (the Python package's
    /// exception classes).
    pub kind: ErrorKind,
}

/// What an [`Error`] is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The IR text or the ONNX model could not be read.
    Parse,
    /// The IR parsed but does not verify.
    Verify,
    /// Anything else in the input: an input tensor, a pass that failed on the model, a run.
    Input,
    /// A flag or option that does not make sense.
    Usage,
}

impl Error {
    /// An error in the input: the file, the model, an input tensor.
    pub fn input(message: impl Into<String>) -> Error {
        Error {
            code: EXIT_INPUT,
            message: message.into(),
            kind: ErrorKind::Input,
        }
    }

    /// Bad usage: a flag's value does not make sense.
    pub fn usage(message: impl Into<String>) -> Error {
        Error {
            code: EXIT_USAGE,
            message: message.into(),
            kind: ErrorKind::Usage,
        }
    }

    /// The IR text or ONNX model does not parse.
    pub fn parse(message: impl Into<String>) -> Error {
        Error {
            kind: ErrorKind::Parse,
            ..Error::input(message)
        }
    }

    /// The IR does not verify.
    pub fn verify(message: impl Into<String>) -> Error {
        Error {
            kind: ErrorKind::Verify,
            ..Error::input(message)
        }
    }
}

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
    Cat(cmd::cat::Args),
    /// Parse and verify an IR file; print a one-line summary.
    #[command(after_help = "Example:\n  tcc verify examples/mlp.tir")]
    Verify(cmd::verify::Args),
    /// Run a pass pipeline over an IR file and print the result.
    #[command(
        after_help = "Example:\n  tcc opt --passes='canonicalize{fold-limit=64},cse,dce' examples/mlp.tir -o out.tir\n\nRun `tcc passes` for the list of passes and their options."
    )]
    Opt(cmd::opt::Args),
    /// Import an ONNX model and print it as IR.
    #[command(
        after_help = "Examples:\n  tcc import model.onnx -o model.tir\n  tcc import model.onnx --shape input=1,3,224,224\n\nWeights become constants; value names are the model's. See docs/onnx.md."
    )]
    Import(cmd::import::Args),
    /// Run a function on inputs and print a line per result.
    #[command(
        after_help = "Examples:\n  tcc run examples/mlp.tir\n  tcc run model.onnx --shape input=1,3,224,224\n  tcc run examples/mlp.tir --input x=x.npy --input labels=zeros --output out/ --stats\n\nAn input is PATH.npy, random[:SEED] (floats in [-1,1), integers in [0,8)) or zeros; inputs not\ngiven take their stored values (a `weights \"DIR\"` line) or are random with a fixed seed. With --output, each result is written as DIR/<name>.npy."
    )]
    Run(cmd::run::Args),
    /// Compile once, run many times, and print the latency (min, median, p90) and throughput.
    #[command(
        after_help = "Examples:\n  tcc bench model.onnx --shape input=1,3,224,224 --threads 2\n  tcc bench examples/mlp.tir --runs 200 --target host,-avx512f\n\nInputs, passes and target as in `tcc run` (the inference pipeline unless --passes or -O0).\nCompile time is split into load (parse or ONNX import), passes and code generation."
    )]
    Bench(cmd::bench::Args),
    /// Measure the time model's constants on this machine and print them as eqsat options.
    #[command(
        after_help = "Example:\n  tcc calibrate\n  tcc opt --passes='eqsat{gflops=150,vector-gflops=30,gbps=18,launch-us=0.5,sync-us=2}' model.tir\n\neqsat keeps fixed defaults so that its output is the same on every machine; pass these to\ntune it for this one."
    )]
    Calibrate(cmd::calibrate::Args),
    /// Write a function as an ONNX model (integer layers in QDQ form)
    #[command(
        after_help = "Examples:\n  tcc quantize model.onnx --calib random:32 -o q.tir && tcc export q.tir -o q.onnx\n\nConstants and stored parameters become initializers, the other parameters graph inputs.\nA `conv_integer`/`matmul_integer` scaled to float (what `tcc quantize` writes) goes out as\nDequantizeLinear -> Conv/MatMul, the form onnxruntime's quantize_static writes."
    )]
    Export(cmd::export::Args),
    /// Quantize a float model's convolutions and matrix products to int8 after calibrating
    /// their activations, and report each layer's error.
    #[command(
        after_help = "Examples:\n  tcc quantize model.onnx --calib random:32 --per-channel -o model_int8.tir\n  tcc quantize model.onnx --calib calib/ --method percentile=99.99 --exclude fc -o q.tir\n\nThe table goes to stderr: per layer the activation range, its u8 scale and zero point, the\ni8 weight scales and the relative RMS error of the layer's result against the float model,\nthen the outputs' errors over the calibration runs. Run the result with `tcc run`."
    )]
    Quantize(cmd::quantize::Args),
    /// Print how each function is cut into kernels and where its values live in the arena.
    #[command(after_help = "Example:\n  tcc plan examples/mlp.tir")]
    Plan(cmd::plan::Args),
    /// Compile for NVIDIA GPUs: print the PTX module and its launch manifest.
    #[command(
        after_help = "Examples:\n  tcc ptx examples/elementwise.tir\n  tcc ptx f.tir --sm 90 -o f.ptx\n\nThe manifest (comment lines first) gives each kernel's grid, block, shared memory and the\nstorage of each parameter. Most ops have a GPU form; any other is an error naming it. See docs/codegen.md."
    )]
    Ptx(cmd::ptx::Args),
    /// Differentiate: print each function with d(loss)/d(x) appended to its results.
    #[command(
        after_help = "Examples:\n  tcc grad examples/spirals_mlp.tir\n  tcc grad examples/spirals_mlp.tir --wrt fc1/w,fc2/ --stop %h\n\nThe same as `tcc opt --passes='grad{...}'`; the op counts before and after go to stderr."
    )]
    Grad(cmd::grad::Args),
    /// Train: loop a train step (grad + optimizer) through the JIT and save the parameters.
    #[command(
        after_help = "Example:\n  tcc train examples/spirals_mlp.tir --data examples/data/spirals --steps 500 --lr 0.01 --save out/\n\nThe function's first result is the loss; other scalar results are printed beside it.\nParameters with a file DATA/<name>.npy are data (a file with a multiple of the parameter's rows\nis fed as consecutive mini-batches); the other floating-point parameters are trained, starting\nfrom INIT/<name>.npy or a fixed-seed initialisation. See docs/passes.md."
    )]
    Train(cmd::train::Args),
    /// Memory analysis: the peak of live activation bytes over the schedule, the largest
    /// tensors live at the peak, and (with --svg) a chart of live bytes per op.
    #[command(
        after_help = "Examples:\n  tcc mem examples/digits_cnn.tir\n  tcc mem f.tir --passes='grad' --svg mem.svg\n\nWith --passes, the function is shown before and after the pipeline. See docs/passes.md."
    )]
    Mem(cmd::mem::Args),
    /// List the registered passes and their options.
    Passes,
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
    let mut io = io::Io {
        stdin,
        stdout,
        stderr,
    };
    let io = &mut io;
    let result = match cli.cmd {
        Cmd::Cat(a) => cmd::cat::run(a, io),
        Cmd::Verify(a) => cmd::verify::run(a, io),
        Cmd::Opt(a) => cmd::opt::run(a, io),
        Cmd::Import(a) => cmd::import::run(a, io),
        Cmd::Run(a) => cmd::run::run(a, io),
        Cmd::Bench(a) => cmd::bench::run(a, io),
        Cmd::Calibrate(a) => cmd::calibrate::run(a, io),
        Cmd::Export(a) => cmd::export::run(a, io),
        Cmd::Quantize(a) => cmd::quantize::run(a, io),
        Cmd::Plan(a) => cmd::plan::run(a, io),
        Cmd::Ptx(a) => cmd::ptx::run(a, io),
        Cmd::Grad(a) => cmd::grad::run(a, io),
        Cmd::Train(a) => cmd::train::run(a, io),
        Cmd::Mem(a) => cmd::mem::run(a, io),
        Cmd::Passes => cmd::passes::run(io),
    };
    match result {
        Ok(()) => EXIT_OK,
        Err(Error { code, message, .. }) => {
            let _ = write!(io.stderr, "{message}");
            if !message.ends_with('\n') {
                let _ = writeln!(io.stderr);
            }
            code
        }
    }
}

//! `tcc grad`: each function with d(loss)/d(x) appended to its results.

use crate::Error;
use crate::io::{Io, Load, OnnxArgs, pick_function};
use tcc_passes::grad::{Unconnected, Wrt};

// The arguments of `tcc grad`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// The IR file or ONNX model (`-` for stdin).
    pub file: String,
    #[command(flatten)]
    pub onnx: OnnxArgs,
    /// Differentiate only this function (default: every function).
    #[arg(long)]
    pub func: Option<String>,
    /// What to differentiate with respect to: value names or `scope/` (default: every
    /// floating-point parameter). An ONNX model's initializers named here (or all of them, by
    /// default) become parameters that keep their values.
    #[arg(long, value_delimiter = ',')]
    pub wrt: Vec<String>,
    /// The values to differentiate (default: the single floating-point scalar result).
    #[arg(long, value_delimiter = ',')]
    pub ys: Vec<String>,
    /// Values to treat as constants.
    #[arg(long, value_delimiter = ',')]
    pub stop: Vec<String>,
    /// Take the seed cotangents as new parameters `grad/<y>` instead of ones.
    #[arg(long)]
    pub grad_ys: bool,
    /// Fail if some x does not affect the ys (default: its gradient is zeros).
    #[arg(long)]
    pub strict: bool,
    /// Write the result here instead of stdout.
    #[arg(short = 'o', long = "output")]
    pub output: Option<String>,
}

pub(crate) fn run(a: Args, io: &mut Io) -> Result<(), Error> {
    let onnx = a.onnx.options()?;
    let how = Load {
        onnx,
        wrt: Some(&a.wrt),
        ..Load::default()
    };
    let (input, mut m) = io.load_with(&a.file, &how)?;
    let opts = tcc_passes::GradOptions {
        ys: a.ys,
        wrt: if a.wrt.is_empty() {
            Wrt::Params
        } else {
            Wrt::Select(a.wrt)
        },
        stop: a.stop,
        grad_ys: a.grad_ys,
        unconnected: if a.strict {
            Unconnected::Error
        } else {
            Unconnected::Zero
        },
    };
    let func = a.func.as_deref();
    if let Some(name) = func {
        pick_function(&m, Some(name), &input.name)?;
    }
    let wanted = func.map(|n| n.trim_start_matches('@').to_string());
    for f in &mut m.functions {
        if wanted.as_ref().is_some_and(|w| *w != f.name) {
            continue;
        }
        let s = tcc_passes::grad(f, &opts)
            .map_err(|e| Error::input(format!("{}: error: in `@{}`: {e}", input.name, f.name)))?;
        tcc_ir::verify_function(f).map_err(|d| {
            Error::input(format!(
                "internal compiler error: the gradient of `@{}` does not verify (a bug in tcc)\n{d}",
                f.name
            ))
        })?;
        let _ = writeln!(
            io.stderr,
            "grad @{}: {} forward ops -> {} ops with the gradients of {} values ({:.2}x)",
            f.name,
            s.forward_ops,
            s.total_ops,
            s.xs,
            s.total_ops as f64 / s.forward_ops.max(1) as f64
        );
    }
    io.write_module(m, a.output.as_deref())
}

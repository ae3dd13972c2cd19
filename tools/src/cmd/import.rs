//! `tcc import`: an ONNX model as IR.

use crate::Error;
use crate::io::{Io, OnnxArgs, import_onnx};

// The arguments of `tcc import`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// The ONNX model (`-` for stdin).
    pub file: String,
    #[command(flatten)]
    pub onnx: OnnxArgs,
    /// Write the IR here instead of stdout.
    #[arg(short = 'o', long = "output")]
    pub output: Option<String>,
}

pub(crate) fn run(a: Args, io: &mut Io) -> Result<(), Error> {
    let opts = a.onnx.options()?;
    let input = io.read(&a.file)?;
    let model = tcc_onnx::read_model(&input.bytes)
        .map_err(|e| Error::input(format!("error: {}: {e}", input.name)))?;
    let m = import_onnx(&input, &model, &opts)?;
    io.write_module(m, a.output.as_deref())
}

//! `tcc import`: an ONNX model as IR.

use crate::Error;
use crate::io::{Io, import_onnx, onnx_options};

// The arguments of `tcc import`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// The ONNX model (`-` for stdin).
    pub file: String,
    /// Bind a graph input's shape, for inputs with dynamic dimensions (repeatable).
    #[arg(long = "shape", value_name = "NAME=D0,D1,...")]
    pub shapes: Vec<String>,
    /// Fix a graph input to the value in a .npy file, making it a constant (repeatable);
    /// needed for inputs that decide shapes, such as a Reshape target.
    #[arg(long = "const", value_name = "NAME=PATH.npy")]
    pub consts: Vec<String>,
    /// Write the IR here instead of stdout.
    #[arg(short = 'o', long = "output")]
    pub output: Option<String>,
}

pub(crate) fn run(a: Args, io: &mut Io) -> Result<(), Error> {
    let opts = onnx_options(&a.shapes, &a.consts)?;
    let input = io.read(&a.file)?;
    let m = import_onnx(&input, &opts)?;
    io.write_module(&m, a.output.as_deref())
}

//! `tcc export`: a function written as an ONNX model (`tcc_onnx::export`), for onnxruntime and
//! the other runtimes that read ONNX: a model `tcc quantize` put on integer ops goes out in QDQ
//! form.

use crate::Error;
use crate::io::{Io, pick_function};
use tcc_passes::{PassManager, Pipeline};

// The arguments of `tcc export`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// The IR file (`-` for stdin) or ONNX model.
    pub file: String,
    /// The function to export (needed when the file defines several).
    #[arg(long)]
    pub func: Option<String>,
    /// A pass pipeline to run first (default: none, the IR as written).
    #[arg(long)]
    pub passes: Option<String>,
    /// The ONNX file to write.
    #[arg(short = 'o', long = "output", value_name = "OUT.onnx")]
    pub output: String,
}

pub(crate) fn run(a: Args, io: &mut Io) -> Result<(), Error> {
    let pipeline = (a.passes.as_deref())
        .map(|p| Pipeline::parse(p).map_err(|e| Error::usage(format!("error: --passes: {e}"))))
        .transpose()?;
    let (input, mut m) = io.load(&a.file)?;
    if let Some(p) = pipeline {
        PassManager::new(p)
            .run(&mut m, io.stderr)
            .map_err(|e| Error::input(format!("{}: error: {e}", input.name)))?;
    }
    let f = pick_function(&m, a.func.as_deref(), &input.name)?;
    let model = tcc_onnx::export(f, &m.weights.values)
        .map_err(|e| Error::input(format!("{}: @{}: error: {e}", input.name, f.name)))?;
    let bytes = tcc_onnx::write_model(&model);
    std::fs::write(&a.output, &bytes)
        .map_err(|e| Error::input(format!("error: cannot write `{}`: {e}", a.output)))?;
    let nodes = model.graph.as_ref().map_or(0, |g| g.node.len());
    let _ = writeln!(
        io.stderr,
        "wrote `{}`: @{} as {nodes} ONNX nodes (opset {}), {} bytes",
        a.output,
        f.name,
        tcc_onnx::OPSET,
        bytes.len()
    );
    Ok(())
}

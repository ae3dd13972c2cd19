//! `tcc ptx`: every function compiled by the PTX backend, printed as one PTX module with its
//! launch manifest (as comments) before it.

use crate::Error;
use crate::io::Io;
use tcc_codegen::ptx::{ARCHS, Ptx, print};
use tcc_passes::{PassManager, Pipeline};

// The arguments of `tcc ptx`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// The IR file (`-` for stdin).
    pub file: String,
    /// The GPU architecture: 80 (A100), 86, 87, 89 or 90 (H100).
    #[arg(long, default_value_t = 80)]
    pub sm: u32,
    /// Write the module here instead of stdout.
    #[arg(short = 'o', long = "output")]
    pub output: Option<String>,
    /// A pass pipeline to run first (default: none, the IR as written).
    #[arg(long)]
    pub passes: Option<String>,
}

pub(crate) fn run(a: Args, io: &mut Io) -> Result<(), Error> {
    if !ARCHS.contains(&a.sm) {
        let list: Vec<String> = ARCHS.iter().map(u32::to_string).collect();
        return Err(Error::usage(format!(
            "error: --sm {}: the targets are {}",
            a.sm,
            list.join(", ")
        )));
    }
    let pipeline = match &a.passes {
        Some(p) => {
            Some(Pipeline::parse(p).map_err(|e| Error::usage(format!("error: --passes: {e}")))?)
        }
        None => None,
    };
    let (input, mut m) = io.load(&a.file)?;
    if let Some(p) = pipeline {
        PassManager::new(p)
            .run(&mut m, io.stderr)
            .map_err(|e| Error::input(format!("{}: error: {e}", input.name)))?;
    }
    let backend = Ptx::new(a.sm);
    let mut kernels = Vec::new();
    let mut manifest = String::new();
    for f in &m.functions {
        let module = tcc_codegen::compile(&backend, f)
            .map_err(|e| Error::input(format!("{}: @{}: error: {e}", input.name, f.name)))?;
        manifest += &module.manifest();
        kernels.extend(module.kernels);
    }
    let text = format!("{manifest}{}", print::module(&kernels, a.sm));
    match a.output.as_deref().filter(|&p| p != "-") {
        Some(path) => std::fs::write(path, text)
            .map_err(|e| Error::input(format!("error: cannot write `{path}`: {e}"))),
        None => {
            let _ = write!(io.stdout, "{text}");
            Ok(())
        }
    }
}

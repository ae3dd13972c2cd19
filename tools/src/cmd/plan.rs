//! `tcc plan`: how each function is cut into kernels, and its arena layout.

use crate::Error;
use crate::io::Io;

// The arguments of `tcc plan`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// The IR file (`-` for stdin).
    pub file: String,
}

pub(crate) fn run(a: Args, io: &mut Io) -> Result<(), Error> {
    let (_, m) = io.load(&a.file)?;
    for (i, f) in m.functions.iter().enumerate() {
        // As the CPU backend plans it, with the kernels it runs as one step merged.
        let cpu = tcc_codegen::Cpu::default();
        let p = tcc_codegen::Backend::fuse(&cpu, f, tcc_codegen::plan(f));
        let mem = tcc_codegen::plan_memory(f, &p, &cpu);
        let mut text = String::new();
        if i > 0 {
            text.push('\n');
        }
        let _ = tcc_codegen::write_plan(&mut text, f, &p);
        let _ = tcc_codegen::write_memory(&mut text, f, &mem);
        let _ = write!(io.stdout, "{text}");
    }
    Ok(())
}

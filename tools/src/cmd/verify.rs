//! `tcc verify`: parse and verify; one line of summary.

use crate::Error;
use crate::io::Io;

// The arguments of `tcc verify`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// The IR file (`-` for stdin).
    pub file: String,
}

pub(crate) fn run(a: Args, io: &mut Io) -> Result<(), Error> {
    let (input, m) = io.load(&a.file)?;
    let _ = writeln!(
        io.stdout,
        "{}: ok ({} function{}, {} ops)",
        input.name,
        m.functions.len(),
        if m.functions.len() == 1 { "" } else { "s" },
        m.num_ops()
    );
    Ok(())
}

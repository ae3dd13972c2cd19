//! `tcc cat`: parse, verify and print in canonical form.

use crate::Error;
use crate::io::Io;

// The arguments of `tcc cat`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// The IR file (`-` for stdin).
    pub file: String,
}

pub(crate) fn run(a: Args, io: &mut Io) -> Result<(), Error> {
    let (_, m) = io.load(&a.file)?;
    let _ = write!(io.stdout, "{m}");
    Ok(())
}

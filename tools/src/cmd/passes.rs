//! `tcc passes`: the registered passes and their options.

use crate::Error;
use crate::io::Io;

pub(crate) fn run(io: &mut Io) -> Result<(), Error> {
    for p in tcc_passes::registry() {
        let _ = writeln!(io.stdout, "{:<14} {}", p.name, p.summary);
        for o in p.options {
            let _ = writeln!(io.stdout, "  {:<12} {}", o.name, o.help);
        }
    }
    Ok(())
}

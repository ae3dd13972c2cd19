//! One file per subcommand: its arguments and what it does.

pub(crate) mod bench;
pub(crate) mod calibrate;
pub(crate) mod cat;
pub(crate) mod export;
pub(crate) mod grad;
pub(crate) mod import;
pub(crate) mod mem;
pub(crate) mod opt;
pub(crate) mod passes;
pub(crate) mod plan;
pub(crate) mod ptx;
pub(crate) mod quantize;
pub(crate) mod run;
pub(crate) mod train;
pub(crate) mod verify;

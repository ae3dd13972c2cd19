//! `tcc train`: loop a train step (grad + optimizer) through the JIT; see [`crate::train`].

use crate::Error;
use crate::io::{Io, pick_function};
use crate::train::{TrainArgs, train};

// The arguments of `tcc train`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// The IR file (`-` for stdin).
    pub file: String,
    /// The loss function (needed when the file defines several).
    #[arg(long)]
    pub func: Option<String>,
    /// Number of train steps.
    #[arg(long)]
    pub steps: usize,
    /// Directory of data arrays, `<parameter name>.npy` (`/` in names becomes `_`).
    #[arg(long)]
    pub data: Option<String>,
    /// Directory of initial parameter values.
    #[arg(long)]
    pub init: Option<String>,
    /// sgd, momentum or adam.
    #[arg(long, default_value = "adam")]
    pub optimizer: String,
    /// Learning rate.
    #[arg(long, default_value_t = 0.01)]
    pub lr: f64,
    /// Print the loss every N steps (default: ten times in all).
    #[arg(long, default_value_t = 0)]
    pub every: usize,
    /// Save the trained parameters as DIR/<name>.npy.
    #[arg(long)]
    pub save: Option<String>,
    /// Gradient checkpointing: the options of a `remat` pass run after `grad`, as in
    /// `--remat budget=0.5` or `--remat strategy=memory`.
    #[arg(long, value_name = "OPTIONS")]
    pub remat: Option<String>,
}

pub(crate) fn run(a: Args, io: &mut Io) -> Result<(), Error> {
    let mut o = tcc_passes::Options::default();
    o.0.push(("lr".into(), a.lr.to_string()));
    let optimizer = match a.optimizer.as_str() {
        "sgd" | "momentum" | "adam" => tcc_passes::optim::options(&a.optimizer, &o)
            .map_err(|e| Error::usage(format!("error: {e}")))?,
        other => {
            return Err(Error::usage(format!(
                "error: unknown optimizer `{other}`; choose sgd, momentum or adam"
            )));
        }
    };
    let remat = a
        .remat
        .map(|spec| {
            tcc_passes::remat::Remat::parse(&spec)
                .map_err(|e| Error::input(format!("error: --remat {spec}: {}", e.message)))
        })
        .transpose()?;
    let (input, m) = io.load(&a.file)?;
    let f = pick_function(&m, a.func.as_deref(), &input.name)?;
    let args = TrainArgs {
        steps: a.steps,
        data: a.data.as_deref(),
        init: a.init.as_deref(),
        optimizer,
        save: a.save.as_deref(),
        every: a.every,
        remat: remat.as_ref(),
    };
    train(f, &args, io.stdout, io.stderr).map_err(Error::input)
}

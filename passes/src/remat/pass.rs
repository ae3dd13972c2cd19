//! `remat` as a pass: its options, the typed [`Remat`], and the pipeline's form, which notes
//! what each function's plan kept and recomputed.

use super::{Budget, RematStats, Strategy, choose, fit, no_backward, no_swaps, remat};
use crate::analysis::cost::flops;
use crate::manager::{Notes, OptionInfo, Options, Pass, PipelineError};
use tcc_ir::Function;

fn options(o: &Options) -> Result<Strategy, String> {
    if o.get("min-bytes").is_some() && o.get("strategy") != Some("memory") {
        return Err("min-bytes applies to strategy=memory only".into());
    }
    match (o.get("strategy"), o.get("names"), o.get("budget")) {
        (None, None, Some(b)) => Ok(Strategy::Budget(Budget::parse(b)?)),
        (_, _, Some(_)) | (Some(_), Some(_), _) => {
            Err("give one of strategy=, names= or budget=".into())
        }
        (None, Some(v), None) => {let frags = crate::grad::list(v);
            if frags.is_empty() {
                return Err("names=[...] needs at least one fragment".into());
            }
            Ok(Strategy::Names(frags))
        }
                (Some("collection"), None, None) => Ok(Strategy::Collection),
        (Some("speed"), None, None) => Ok(Strategy::Speed),
        (Some("memory"), None, None) => Ok(Strategy::Memory {
            min_bytes: o.usize_or("min-bytes", 0)? as u64,
        }),
        (Some("budget"), None, None) => Err(
            "a budget is given as budget=BYTES or budget=FRACTION (remat{budget=0.5}), not as a strategy".into(),
        ),
        (Some(s), None, None) => Err(format!(
            "unknown strategy `{s}`; valid strategies are collection, memory, speed (or names=[...] or budget=...)"
        )),
        (None, None, None) => Err(
            "say how to choose checkpoints: strategy=collection|memory|speed, names=[...] or budget=BYTES|FRACTION".into(),
        ),
    }
}

/// The options `remat` accepts.
pub(crate) const OPTIONS: &[OptionInfo] = &[
    OptionInfo {
        name: "strategy",
        help: "collection (values named .../checkpoint/...), memory (about sqrt(N) bottlenecks) or speed (matmul and conv outputs)",
    },
    OptionInfo {
        name: "names",
        help: "[frag,...]: keep values whose names contain a fragment",
    },
    OptionInfo {
        name: "budget",
        help: "bytes (64MiB) or a fraction of the peak without remat (0.5, 50%): the least recomputation that fits",
    },
    OptionInfo {
        name: "min-bytes",
        help: "with strategy=memory: ignore bottlenecks smaller than this (default 0)",
    },
];

/// The `remat` pass with its way of choosing checkpoints: the typed form of `remat{...}` in a
/// pipeline, for code that builds passes directly (`Remat::budget(0.5).run(&mut f)`).
#[derive(Clone, Debug, PartialEq)]
pub struct Remat(pub Strategy);

impl Remat {
    /// The least recomputation within a budget: a fraction of the peak without remat (`0.5`)
    /// or a number of bytes (`64u64 << 20`).
    pub fn budget(budget: impl Into<Budget>) -> Remat {
        Remat(Strategy::Budget(budget.into()))
    }

    /// Options written as in a pipeline (`budget=0.5`, `strategy=memory`), checked as a
    /// pipeline checks them.
    pub fn parse(options: &str) -> Result<Remat, PipelineError> {
        let o = Options::parse_for("remat", options)?;
        Ok(Remat(self::options(&o).map_err(|message| {
            PipelineError {
                text: options.to_string(),
                pos: 0,
                message,
            }
        })?))
    }

    /// Chooses the checkpoints and rewrites `f`.
    pub fn run(&self, f: &mut Function) -> Result<RematStats, String> {
        no_swaps(f)?;
        let c = choose(f, &self.0)?;
        remat(f, &c)
    }
}

impl Pass for Remat {
    fn name(&self) -> &'static str {
        "remat"
    }
    fn run_on_function(&self, f: &mut Function) -> Result<(), String> {
        self.run(f).map(|_| ())
    }
}

pub(crate) fn create(o: &Options) -> Result<Box<dyn Pass>, String> {
    Ok(Box::new(RematPass {
        remat: Remat(options(o)?),
        notes: Notes::default(),
    }))
}

/// `remat` in a pipeline: [`Remat`], noting for each function what it kept and recomputed
/// and, with a budget, the peaks and which candidate of the search won.
struct RematPass {
    remat: Remat,
    notes: Notes,
}

impl Pass for RematPass {
    fn name(&self) -> &'static str {
        "remat"
    }

    fn run_on_function(&self, f: &mut Function) -> Result<(), String> {
        no_swaps(f)?;
        let b = f.backward_position().ok_or_else(no_backward)?;
        let forward: u64 = f.schedule()[..b].iter().map(|&op| flops(f, op)).sum();
        let (checkpoints, how) = match &self.remat.0 {
            Strategy::Budget(budget) => {
                let fit = fit(f, *budget)?;
                let how = format!(
                    "peak {} -> {}, chosen by {}",
                    crate::analysis::memory::human(fit.peak_before),
                    crate::analysis::memory::human(fit.peak_after),
                    fit.chosen_by
                );
                (fit.checkpoints, how)
            }
            s => {
                let how = match s {
                    Strategy::Collection => "strategy=collection".to_string(),
                    Strategy::Names(frags) => format!("names=[{}]", frags.join(",")),
                    Strategy::Speed => "strategy=speed".to_string(),
                    Strategy::Memory { min_bytes: 0 } => "strategy=memory".to_string(),
                    Strategy::Memory { min_bytes } => {
                        format!("strategy=memory, min-bytes={min_bytes}")
                    }
                    Strategy::Budget(_) => unreachable!("handled above"),
                };
                (choose(f, s)?, how)
            }
        };
        let stats = remat(f, &checkpoints)?;
        let note = format!(
            "@{}: {} values kept, {} ops recomputed ({:.3} forward passes); {how}",
            f.name,
            stats.checkpoints,
            stats.recomputed_ops,
            stats.extra_flops as f64 / forward.max(1) as f64,
        );
        self.notes.push(note);
        Ok(())
    }

    fn notes(&self) -> Vec<String> {
        self.notes.take()
    }
}

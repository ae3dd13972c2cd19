//! `eqsat`: equality saturation with egg. The function goes into an e-graph, named rule sets
//! rewrite it until nothing new appears or a limit is hit, and the cheapest equivalent program
//! under the roofline time model (`analysis::cost`) comes back out, counted as a DAG.
//!
//! Guarantees: results stay within rounding of the input's (every rule is checked against the
//! interpreter; see each set's docs for the identities that assume finite values); the output
//! verifies; the same input gives the same output on every run and machine (egg's deterministic
//! mode, node and iteration limits rather than time deciding where it stops, fixed default
//! machine constants); the output is estimated faster than the input by at least `min-gain`
//! (1% by default: less is within the time model's error), else the input is kept, and the
//! check is made again on the function written back. Values that survive keep their names. Ops
//! it does not model (control dependencies, `stop_gradient`, multi-result and side-effecting
//! ops) stay exactly as they are ([`encode`]). It does not delete results or parameters, and it
//! subsumes `cse` (equal computations share one e-class).
//!
//! Options: `rules=[...]` (the sets, [`rules::SETS`]; default [`rules::DEFAULT_SETS`]: the
//! set `finite`, whose identities assume finite values, only when asked for), `iter-limit=`
//! and `node-limit=` (defaults scale with the function: [`default_iterations`]),
//! `time-limit=` (seconds, a backstop), `fold-limit=` (largest dense constant folding may
//! create), `ilp-limit=` and `ilp-nodes=` (the exact extraction's reach), `min-gain=`, and the
//! machine constants `gflops=`, `vector-gflops=`, `gbps=`, `launch-us=`, `sync-us=`,
//! `cache-mib=`, `cache-gbps=` (defaults [`Machine::DEFAULT`]). The report (`tcc opt
//! --time-passes`, `tcc run --stats`) gives iterations, e-nodes and e-classes, the stop reason,
//! the estimated time before and after, the extraction written back, the time spent, and each
//! rule's applications.

pub mod check;
pub mod decode;
pub mod encode;
pub mod extract;
pub mod ilp;
pub mod lang;
pub mod rules;

use crate::analysis::cost::{Machine, estimate};
use crate::manager::{Notes, OptionInfo, Options, Pass};
use egg::{BackoffScheduler, Runner, StopReason};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tcc_ir::Function;

/// How `eqsat` runs.
#[derive(Clone, Debug)]
pub struct EqsatOptions {
    /// The rule sets.
    pub rules: Vec<String>,
    /// Most rewrite iterations; `None`: [`default_iterations`] of the function's size.
    pub iter_limit: Option<usize>,
    /// Most e-nodes; `None`: 50,000 or four times the input's, whichever is more.
    pub node_limit: Option<usize>,
    /// Most time rewriting (a backstop: the node and iteration limits should stop it first).
    pub time_limit: Duration,
    /// Largest dense constant folding may create, in elements.
    pub fold_limit: u64,
    /// The machine the time model describes.
    pub machine: Machine,
    /// Most e-nodes for which extraction also solves the exact integer program.
    pub ilp_limit: usize,
    /// Most branch-and-bound nodes the integer program may search.
    pub ilp_nodes: u64,
    /// The least fraction of the estimate a rewrite must save to be kept: below it the
    /// difference is within the time model's error, and the input is the safer program.
    pub min_gain: f64,
}

impl Default for EqsatOptions {
    fn default() -> EqsatOptions {
        EqsatOptions {
            rules: rules::DEFAULT_SETS.iter().map(|s| s.to_string()).collect(),
            iter_limit: None,
            node_limit: None,
            time_limit: Duration::from_secs(5),
            fold_limit: crate::canonicalize::DEFAULT_FOLD_LIMIT,
            machine: Machine::DEFAULT,
            ilp_limit: 500,
            ilp_nodes: 50,
            min_gain: 0.01,
        }
    }
}

/// Most moves [`extract::share`] tries (each an improvement sweep and an estimate).
const SHARE_MOVES: usize = 64;

/// Rewrite iterations by default for a function of `ops` ops: each iteration matches every rule
/// against the whole e-graph, so large functions get fewer to stay near a second (a 10,000-op
/// chain: about 0.8 s at 6).
pub fn default_iterations(ops: usize) -> usize {
    match ops {
        0..4000 => 8,
        4000..16000 => 6,
        16000..64000 => 4,
        _ => 2,
    }
}

/// What one run did.
#[derive(Clone, Debug)]
pub struct Report {
    /// Rewrite iterations.
    pub iterations: usize,
    /// Why rewriting stopped.
    pub stop: String,
    /// E-nodes and e-classes at the end.
    pub nodes: usize,
    /// E-classes at the end.
    pub classes: usize,
    /// Applications of each rule that fired.
    pub applied: BTreeMap<String, usize>,
    /// Estimated seconds before and after.
    pub cost: (f64, f64),
    /// The extraction that was written back (`input` merged, `greedy`, `ilp`), if any was.
    pub changed: Option<&'static str>,
    /// Time spent in all.
    pub time: Duration,
    /// Of which extracting (the integer program included).
    pub extract_time: Duration,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} iterations, stopped: {}; {} e-nodes, {} e-classes; estimated {:.2} -> {:.2} us{}; {:.1} ms ({:.1} extracting)",
            self.iterations,
            self.stop,
            self.nodes,
            self.classes,
            self.cost.0 * 1e6,
            self.cost.1 * 1e6,
            match self.changed {
                Some(e) => format!(" ({e} extraction)"),
                None => " (input kept)".to_string(),
            },
            self.time.as_secs_f64() * 1e3,
            self.extract_time.as_secs_f64() * 1e3
        )?;
        if !self.applied.is_empty() {
            f.write_str("; rules:")?;
            for (r, n) in &self.applied {
                write!(f, " {r} {n}")?;
            }
        }
        Ok(())
    }
}

/// Runs equality saturation on `f`. On an internal error (a rule that broke typing) `f` is
/// left as it was and the error names the rule.
pub fn eqsat(f: &mut Function, o: &EqsatOptions) -> Result<Report, String> {
    let start = Instant::now();
    let rules = rules::rules(&o.rules)?;
    let mut enc = encode::encode(f, o.fold_limit);
    if let Some(e) = &enc.egraph.analysis.error {
        return Err(e.clone());
    }
    let before = estimate(f, &o.machine);
    let rewrites: Vec<_> = rules.iter().map(|r| &r.rewrite).collect();
    let default_nodes = (4 * enc.egraph.total_number_of_nodes()).max(50_000);
    // egg times its runs with `quanta`, whose first clock calibrates the CPU's counter against
    // the OS clock for up to 200 ms, and all of them on a VM whose counter is noisy: 200 of a
    // small model's 207 ms of compile time. The run reads a mock clock instead, set from the OS
    // clock at each iteration's hook, so the time limit holds between iterations as before.
    let (clock, mock) = quanta::Clock::mock();
    let real = Instant::now();
    let runner = Runner::default()
        .with_egraph(std::mem::take(&mut enc.egraph))
        .with_iter_limit(
            o.iter_limit
                .unwrap_or_else(|| default_iterations(f.schedule().len())),
        )
        .with_node_limit(o.node_limit.unwrap_or(default_nodes))
        .with_time_limit(o.time_limit)
        .with_scheduler(BackoffScheduler::default())
        .with_hook(move |r| {
            let now = real.elapsed().as_nanos() as u64;
            mock.increment(now.saturating_sub(mock.value()));
            match &r.egraph.analysis.error {
                Some(e) => Err(e.clone()),
                None => Ok(()),
            }
        });
    let runner = quanta::with_clock(&clock, || runner.run(rewrites));
    if let Some(e) = &runner.egraph.analysis.error {
        return Err(e.clone());
    }
    let stop = match &runner.stop_reason {
        Some(StopReason::Saturated) => "saturated".to_string(),
        Some(StopReason::IterationLimit(n)) => format!("iteration limit {n}"),
        Some(StopReason::NodeLimit(n)) => format!("node limit ({n} e-nodes)"),
        Some(StopReason::TimeLimit(t)) => format!("time limit {t} s"),
        Some(StopReason::Other(s)) => s.clone(),
        None => "not run".to_string(),
    };
    let mut applied = BTreeMap::new();
    for it in &runner.iterations {
        for (r, n) in &it.applied {
            *applied.entry(r.to_string()).or_insert(0) += n;
        }
    }
    let iterations = runner.iterations.len();
    enc.egraph = runner.egraph;
    let eg = &enc.egraph;
    let extract_start = Instant::now();
    let input = extract::input_choice(f, &enc);
    let greedy = extract::greedy(eg, &o.machine, &input);
    let results = &enc.roots[..f.results().len()];
    let time = |sel: &extract::Selection| extract::dag(eg, sel, results).time(&o.machine);
    // Candidates with their estimates, cheapest first (ties keep the earlier).
    let mut candidates: Vec<(f64, &'static str, extract::Selection)> = Vec::new();
    let add = |candidates: &mut Vec<_>, name, sel: Option<extract::Selection>| {
        if let Some(sel) = sel {
            candidates.push((time(&sel), name, sel));
            candidates.sort_by(|a: &(f64, _, _), b| a.0.total_cmp(&b.0));
        }
    };
    add(
        &mut candidates,
        "input",
        extract::close(eg, &enc.roots, &input),
    );
    add(
        &mut candidates,
        "greedy",
        extract::close(eg, &enc.roots, &greedy),
    );
    // The best so far improved class by class with shared values counted once; then with
    // values shared by several readers introduced; then the exact program for small e-graphs,
    // each seeded with the best so far.
    let improved = (candidates.first()).map(|(_, _, seed)| {
        extract::improve(
            eg,
            &enc.roots,
            seed,
            &greedy,
            &o.machine,
            &extract::Sweep::all(2),
        )
    });
    add(&mut candidates, "improved", improved);
    let shared = (candidates.first()).map(|(_, _, seed)| {
        extract::share(
            eg,
            &enc.roots,
            results,
            seed,
            &greedy,
            &o.machine,
            SHARE_MOVES,
        )
    });
    add(&mut candidates, "shared", shared);
    let exact = candidates.first().and_then(|(_, _, seed)| {
        ilp::extract(eg, &enc.roots, &o.machine, seed, o.ilp_limit, o.ilp_nodes)
    });
    add(&mut candidates, "ilp", exact);
    let enough = before * (1.0 - o.min_gain);
    let best = candidates.first().filter(|(t, _, _)| *t < enough);
    // Written back, the program must still be estimated faster by the margin (the estimate of
    // the function is the one reported; folding new ops on constants only lowers it).
    let mut changed = None;
    if let Some((_, name, sel)) = best {
        let mut g = f.clone();
        decode::decode(&mut g, &enc, sel);
        // Constants only the folded new ones read (the weights a merge concatenated).
        crate::dce(&mut g);
        if estimate(&g, &o.machine) < enough {
            *f = g;
            changed = Some(*name);
        }
    }
    let after = estimate(f, &o.machine);
    Ok(Report {
        iterations,
        stop,
        nodes: eg.total_number_of_nodes(),
        classes: eg.number_of_classes(),
        applied,
        cost: (before, after),
        changed,
        time: start.elapsed(),
        extract_time: extract_start.elapsed(),
    })
}

pub(crate) const OPTIONS: &[OptionInfo] = &[
    OptionInfo {
        name: "rules",
        help: "rule sets among algebra, finite, layout, graph; default `[algebra,layout,graph]`",
    },
    OptionInfo {
        name: "iter-limit",
        help: "most rewrite iterations; default 8, fewer on large functions (6 from 4000 ops, 4 from 16000, 2 from 64000)",
    },
    OptionInfo {
        name: "node-limit",
        help: "most e-nodes; default 50000 or four times the input's e-nodes, whichever is more",
    },
    OptionInfo {
        name: "time-limit",
        help: "most seconds rewriting (a backstop); default 5",
    },
    OptionInfo {
        name: "fold-limit",
        help: "largest dense constant folding may create, in elements; default 256",
    },
    OptionInfo {
        name: "ilp-limit",
        help: "most e-nodes for which extraction solves the exact integer program; default 500",
    },
    OptionInfo {
        name: "ilp-nodes",
        help: "most branch-and-bound nodes the integer program searches; default 50",
    },
    OptionInfo {
        name: "min-gain",
        help: "least fraction of the estimated time a rewrite must save to be kept; default 0.01",
    },
    OptionInfo {
        name: "gflops",
        help: "the time model's matmul and convolution rate, GFLOP/s; default 140",
    },
    OptionInfo {
        name: "vector-gflops",
        help: "the time model's rate of generated (elementwise) kernels, GFLOP/s; default 24",
    },
    OptionInfo {
        name: "gbps",
        help: "the time model's memory bandwidth, GB/s; default 20",
    },
    OptionInfo {
        name: "launch-us",
        help: "the time model's cost of running a small kernel, microseconds; default 0.5",
    },
    OptionInfo {
        name: "sync-us",
        help: "the time model's further cost of splitting a matmul or convolution among the threads, microseconds; default 2.5",
    },
    OptionInfo {
        name: "cache-mib",
        help: "the time model's last-level cache, MiB (constants that fit in it together are read from it); default 32",
    },
    OptionInfo {
        name: "cache-gbps",
        help: "the time model's bandwidth of reads from that cache, GB/s; default 100",
    },
];

fn positive(o: &Options, key: &str, default: f64) -> Result<f64, String> {
    match o.get(key) {
        None => Ok(default),
        Some(v) => match v.parse::<f64>() {
            Ok(x) if x > 0.0 && x.is_finite() => Ok(x),
            _ => Err(format!(
                "option `{key}` must be a positive number, found `{v}`"
            )),
        },
    }
}

/// Reads [`EqsatOptions`] from pipeline options.
pub fn options(o: &Options) -> Result<EqsatOptions, String> {
    let d = EqsatOptions::default();
    let rules = match o.get("rules") {
        Some(v) => crate::grad::list(v),
        None => d.rules,
    };
    rules::rules(&rules)?;
    let m = Machine::DEFAULT;
    Ok(EqsatOptions {
        rules,
        iter_limit: match o.get("iter-limit") {
            Some(_) => Some(o.usize_or("iter-limit", 0)?),
            None => None,
        },
        node_limit: match o.get("node-limit") {
            Some(_) => Some(o.usize_or("node-limit", 0)?),
            None => d.node_limit,
        },
        time_limit: Duration::from_secs_f64(positive(o, "time-limit", d.time_limit.as_secs_f64())?),
        fold_limit: o.usize_or("fold-limit", d.fold_limit as usize)? as u64,
        ilp_limit: o.usize_or("ilp-limit", d.ilp_limit)?,
        ilp_nodes: o.usize_or("ilp-nodes", d.ilp_nodes as usize)? as u64,
        min_gain: match o.get("min-gain") {
            None => d.min_gain,
            Some(v) => match v.parse::<f64>() {
                Ok(x) if (0.0..1.0).contains(&x) => x,
                _ => {
                    return Err(format!(
                        "option `min-gain` must be a number in [0, 1), found `{v}`"
                    ));
                }
            },
        },
        machine: Machine {
            gflops: positive(o, "gflops", m.gflops)?,
            vector_gflops: positive(o, "vector-gflops", m.vector_gflops)?,
            gbps: positive(o, "gbps", m.gbps)?,
            launch_us: positive(o, "launch-us", m.launch_us)?,
            sync_us: positive(o, "sync-us", m.sync_us)?,
            cache_mib: positive(o, "cache-mib", m.cache_mib)?,
            cache_gbps: positive(o, "cache-gbps", m.cache_gbps)?,
        },
    })
}

pub(crate) fn create(o: &Options) -> Result<Box<dyn Pass>, String> {
    Ok(Box::new(Eqsat {
        options: options(o)?,
        notes: Notes::default(),
    }))
}

struct Eqsat {
    options: EqsatOptions,
    notes: Notes,
}

impl Pass for Eqsat {
    fn name(&self) -> &'static str {
        "eqsat"
    }

    fn run_on_function(&self, f: &mut Function) -> Result<(), String> {
        let report = eqsat(f, &self.options)?;
        let note = format!("@{}: {report}", f.name);
        self.notes.push(note);
        Ok(())
    }

    fn notes(&self) -> Vec<String> {
        self.notes.take()
    }
}

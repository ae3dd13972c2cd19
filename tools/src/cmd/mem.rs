//! `tcc mem`: peak live memory over the schedule, and the largest tensors at the peak.

use crate::Error;
use crate::io::{Io, pick_function};
use std::fmt::Write as _;
use tcc_ir::Function;
use tcc_passes::{PassManager, Pipeline};

// The arguments of `tcc mem`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// The IR file (`-` for stdin).
    pub file: String,
    /// Only this function (default: every function).
    #[arg(long)]
    pub func: Option<String>,
    /// A pipeline to run first; both versions are reported.
    #[arg(long)]
    pub passes: Option<String>,
    /// Write a chart of live bytes over the schedule to this SVG file.
    #[arg(long)]
    pub svg: Option<String>,
    /// How many of the largest live tensors to list.
    #[arg(long, default_value_t = 8)]
    pub top: usize,
    /// For a function that swaps: the link the predicted timeline copies over (`16GB/s`, the
    /// default, a PCIe 4.0 x16 link's order).
    #[arg(long, value_name = "RATE", value_parser = super::run::parse_bandwidth)]
    pub link_bandwidth: Option<f64>,
}

pub(crate) fn run(a: Args, io: &mut Io) -> Result<(), Error> {
    let (func, top) = (a.func.as_deref(), a.top);
    let link = a.link_bandwidth.unwrap_or(16e9);
    let pipeline = a
        .passes
        .as_deref()
        .map(Pipeline::parse)
        .transpose()
        .map_err(|e| Error::usage(format!("error: {e}")))?;
    let (input, m) = io.load(&a.file)?;
    if let Some(name) = func {
        pick_function(&m, Some(name), &input.name)?;
    }
    let after = match &pipeline {
        Some(p) => {
            let mut m2 = m.clone();
            let runs = PassManager::new(p.clone())
                .run(&mut m2, &mut std::io::sink())
                .map_err(|e| Error::input(format!("{}: error: {e}", input.name)))?;
            // What the planners chose (`offload` lists each saved activation's decision).
            let planners = ["offload", "remat"];
            for r in runs
                .iter()
                .filter(|r| planners.iter().any(|p| r.label.starts_with(p)))
            {
                for n in &r.notes {
                    let _ = writeln!(io.stdout, "{}: {n}", r.label);
                }
            }
            Some(m2)
        }
        None => None,
    };
    let wanted = func.map(|n| n.trim_start_matches('@'));
    let mut charts: Vec<(String, Vec<u64>)> = Vec::new();
    for (i, f) in m.functions.iter().enumerate() {
        if wanted.is_some_and(|w| w != f.name) {
            continue;
        }
        let before_label = if pipeline.is_some() { " (before)" } else { "" };
        let (text, live, host) = mem_report(f, before_label, top, link);
        let _ = write!(io.stdout, "{text}");
        charts.push((format!("@{}{before_label}", f.name), live));
        if let Some(host) = host {
            charts.push((format!("@{}{before_label}, host", f.name), host));
        }
        if let (Some(m2), Some(p)) = (&after, &pipeline) {
            let g = &m2.functions[i];
            let (text, live, host) = mem_report(g, &format!(" (after {p})"), top, link);
            let _ = write!(io.stdout, "{text}");
            charts.push((format!("@{} (after {p})", g.name), live));
            if let Some(host) = host {
                charts.push((format!("@{} (after {p}), host", g.name), host));
            }
        }
    }
    if let Some(path) = &a.svg {
        let series: Vec<(&str, &[u64])> = charts
            .iter()
            .map(|(l, v)| (l.as_str(), v.as_slice()))
            .collect();
        let text = tcc_passes::analysis::memory::svg(
            &format!(
                "live activation bytes (device, and host where swapped): {}",
                input.name
            ),
            &series,
        );
        std::fs::write(path, text)
            .map_err(|e| Error::input(format!("error: cannot write `{path}`: {e}")))?;
    }
    Ok(())
}

/// One function's memory report, its device bytes live over the schedule and, if it swaps, its
/// host bytes.
fn mem_report(
    f: &Function,
    label: &str,
    top: usize,
    link: f64,
) -> (String, Vec<u64>, Option<Vec<u64>>) {
    use tcc_passes::analysis::memory::{analyze, human};
    let p = analyze(f);
    let mut s = String::new();
    let mut head = String::new();
    let _ = tcc_ir::printer::write_name(&mut head, '@', &f.name);
    let _ = writeln!(
        s,
        "{head}{label}: {} ops; peak {} of activations at schedule position {}; parameters {}, constants {}",
        f.schedule().len(),
        human(p.peak),
        p.peak_at,
        human(p.param_bytes),
        human(p.const_bytes)
    );
    if let Some(&op) = f.schedule().get(p.peak_at) {
        let _ = writeln!(
            s,
            "  running then: {}",
            tcc_ir::diag::clip(&f.describe_op(op))
        );
    }
    let _ = writeln!(
        s,
        "  without the {} of results it returns: peak {} at schedule position {}",
        human(p.result_bytes),
        human(p.temps_peak.0),
        p.temps_peak.1
    );
    let swapped = p.buffers.iter().filter(|b| b.host).count();
    if swapped > 0 {
        let _ = writeln!(
            s,
            "  host memory: peak {} at schedule position {} ({swapped} value{} swapped out)",
            human(p.host_peak.0),
            p.host_peak.1,
            if swapped == 1 { "" } else { "s" }
        );
        let m = tcc_passes::analysis::cost::Machine::DEFAULT;
        let t = tcc_passes::analysis::timeline::timeline(f, &m, link / 1e9);
        let secs = |x: f64| {
            if x >= 1e-3 {
                format!("{:.3} ms", x * 1e3)
            } else {
                format!("{:.2} µs", x * 1e6)
            }
        };
        let _ = writeln!(
            s,
            "  predicted at {:.1} GB/s: compute {}, copies {} ({:.0}% hidden), stalls {}, step {}",
            link / 1e9,
            secs(t.compute),
            secs(t.copies),
            t.hidden() * 100.0,
            secs(t.stalls),
            secs(t.total)
        );
    }
    let live = p.live_at(p.peak_at);
    let _ = writeln!(s, "  largest of the {} tensors live there:", live.len());
    for b in live.iter().take(top) {
        let mut name = String::new();
        let _ = tcc_ir::printer::write_name(&mut name, '%', f.name(b.value));
        let last = if b.last >= f.schedule().len() {
            "the end (a result)".to_string()
        } else {
            format!("position {}", b.last)
        };
        let _ = writeln!(
            s,
            "    {:>11}  {name}  {}  (position {} to {last})",
            human(b.bytes),
            f.ty(b.value),
            b.first
        );
    }
    let cpu = tcc_codegen::Cpu::default();
    let plan = tcc_codegen::Backend::fuse(&cpu, f, tcc_codegen::plan(f));
    let m = tcc_codegen::plan_memory(f, &plan, &cpu);
    let _ = writeln!(
        s,
        "  CPU backend: arena {} (live peak {}) plus {} of results{}, after fusion and in-place reuse",
        human(m.arena_bytes),
        human(m.live_peak_bytes),
        human(m.output_bytes),
        if m.host_bytes > 0 {
            format!(", host pool {}", human(m.host_bytes))
        } else {
            String::new()
        }
    );
    let host = (swapped > 0).then_some(p.host);
    (s, p.live, host)
}

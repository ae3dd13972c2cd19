//! The report of `tcc quantize`: the quantized function against the float one over the
//! calibration runs, per layer and per output, as the table it prints.

use super::calibrate::with_results;
use crate::Error;
use std::collections::HashSet;
use std::fmt::Write as _;
use tcc_ir::{Function, Tensor, Value};
use tcc_passes::quant::ptq::{self, Layer};

/// Errors of the quantized function against the float one over the calibration runs: per
/// layer and for the outputs.
pub(super) struct Errors {
    /// Per layer (as `layers`), the relative RMS error of its result: `|q - f| / |f|` over
    /// every element of every run.
    layers: Vec<f64>,
    /// Per result of the function.
    outputs: Vec<OutputError>,
    /// Rows (samples) of the first result whose argmax over its last axis agrees, and the
    /// rows compared, where it has more than one column.
    top1: Option<(usize, usize)>,
}

/// One result's error: relative RMS and largest absolute difference, and for a scalar (a loss,
/// an accuracy) its mean over the runs in the float and int8 models.
struct OutputError {
    name: String,
    rel: f64,
    max: f64,
    mean: Option<(f64, f64)>,
}

pub(super) fn compare(
    f: &Function,
    q: &Function,
    cpu: &tcc_codegen::Cpu,
    runs: &[Vec<Tensor>],
    layers: &[Layer],
) -> Result<Errors, Error> {
    let float_values: Vec<Value> = layers.iter().map(|l| l.output).collect();
    // The quantized layers kept their results' names.
    let quant_values: Vec<Value> = (layers.iter())
        .map(|l| {
            q.lookup(f.name(l.output)).ok_or_else(|| {
                Error::input(format!(
                    "error: internal: layer `{}` lost its name",
                    f.name(l.output)
                ))
            })
        })
        .collect::<Result<_, _>>()?;
    let fe = with_results(f, &float_values, cpu)?;
    let qe = with_results(q, &quant_values, cpu)?;
    let n_out = f.results().len();
    let mut sums = vec![(0.0f64, 0.0f64, 0.0f64); n_out + layers.len()];
    let mut scalars = vec![(0.0f64, 0.0f64); n_out];
    let mut top1 = (f.results().first())
        .filter(|&&r| f.ty(r).dims().last().copied().unwrap_or(1) > 1)
        .map(|_| (0usize, 0usize));
    for inputs in runs {
        let run = |e: &tcc_codegen::Executable| {
            e.run(inputs)
                .map_err(|e| Error::input(format!("error: comparison run: {e}")))
        };
        let (a, b) = (run(&fe)?, run(&qe)?);
        for (k, (x, y)) in a.iter().zip(&b).enumerate() {
            let (x, y) = (x.data().to_f64s(), y.data().to_f64s());
            if k < n_out && x.len() == 1 {
                scalars[k].0 += x[0];
                scalars[k].1 += y[0];
            }
            let s = &mut sums[k];
            for (u, v) in x.iter().zip(&y) {
                s.0 += (u - v) * (u - v);
                s.1 += u * u;
                s.2 = s.2.max((u - v).abs());
            }
        }
        if let Some(agree) = top1.as_mut() {
            let cols = a[0].ty().dims().last().copied().unwrap_or(1) as usize;
            let argmax = |t: &Tensor| -> Vec<usize> {
                (t.data().to_f64s().chunks(cols))
                    .map(|row| {
                        (0..row.len())
                            .max_by(|&i, &j| row[i].total_cmp(&row[j]))
                            .unwrap_or(0)
                    })
                    .collect()
            };
            let (x, y) = (argmax(&a[0]), argmax(&b[0]));
            agree.0 += x.iter().zip(&y).filter(|(i, j)| i == j).count();
            agree.1 += x.len();
        }
    }
    let rel = |(d, n, _): (f64, f64, f64)| if n > 0.0 { (d / n).sqrt() } else { d.sqrt() };
    Ok(Errors {
        outputs: (f.results().iter().enumerate())
            .map(|(k, &r)| {
                let runs = runs.len().max(1) as f64;
                let mean =
                    (f.ty(r).numel() == 1).then(|| (scalars[k].0 / runs, scalars[k].1 / runs));
                OutputError {
                    name: f.name(r).to_string(),
                    rel: rel(sums[k]),
                    max: sums[k].2,
                    mean,
                }
            })
            .collect(),
        layers: sums[n_out..].iter().map(|&s| rel(s)).collect(),
        top1,
    })
}

/// The per-layer table and the outputs' errors; `learned` names the layers whose activation
/// range came from quantization-aware training rather than the calibration.
pub(super) fn table(
    report: &[ptq::Quantized],
    errors: &Errors,
    runs: usize,
    learned: &HashSet<String>,
) -> String {
    let mut s = String::new();
    let width = report
        .iter()
        .map(|r| r.name.len())
        .max()
        .unwrap_or(5)
        .max(5);
    let _ = writeln!(
        s,
        "{:<width$}  {:>23}  {:>10}  {:>4}  {:>21}  {:>9}",
        "layer", "activation range", "scale", "zero", "weight scales", "rel error"
    );
    for (r, e) in report.iter().zip(&errors.layers) {
        let _ = writeln!(
            s,
            "{:<width$}  [{:>10.4}, {:>10.4}]  {:>10.3e}  {:>4}  {:>9.3e}..{:>9.3e}  {:>9.2e}{}",
            r.name,
            r.range.min,
            r.range.max,
            r.scale,
            r.zero,
            r.weight_scales.0,
            r.weight_scales.1,
            e,
            match (r.integer, learned.contains(&r.name)) {
                (false, _) => "  (stayed float)",
                (true, true) => "  (learned range)",
                (true, false) => "",
            }
        );
    }
    let integer = report.iter().filter(|r| r.integer).count();
    let _ = writeln!(
        s,
        "{integer} of {} layers on integer ops; over {runs} calibration run{}:",
        report.len(),
        if runs == 1 { "" } else { "s" }
    );
    for OutputError {
        name,
        rel,
        max,
        mean,
    } in &errors.outputs
    {
        let _ = write!(
            s,
            "  output %{name}: relative RMS error {rel:.3e}, largest difference {max:.3e}"
        );
        let _ = match mean {
            Some((float, int8)) => writeln!(s, "; mean {float:.6} in float, {int8:.6} in int8"),
            None => writeln!(s),
        };
    }
    if let Some((agree, rows)) = errors.top1 {
        let _ = writeln!(
            s,
            "  top-1 of the first output agrees with the float model's on {agree} of {rows} rows ({:.1}%)",
            100.0 * agree as f64 / rows.max(1) as f64
        );
    }
    s
}

//! `tcc quantize`: post-training int8 quantization. Observes the activations of a float model's
//! convolutions and matrix products over calibration inputs (on the JIT), chooses their scales,
//! rewrites those layers onto the integer ops (`tcc_passes::quant::ptq`), and reports each
//! layer's error against the float model on the same inputs.

use super::run::{Model, prepare};
use crate::io::{Io, abbreviate};
use crate::{Error, npy};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::IsTerminal;
use tcc_ir::random::{Rng, random_tensor};
use tcc_ir::{Function, Literal, Module, OpKind, Tensor, Value};
use tcc_passes::quant::ptq::{self, Layer, Range, Scheme};
use tcc_passes::{PassManager, Pipeline};

/// The passes run before quantizing unless `--passes` says otherwise: batch norm folded into
/// the layers, so that it is quantized with their weights.
const PIPELINE: &str = "canonicalize,fold-bn,cse,dce";

/// The passes run on the quantized function before it is written (and after stored weights
/// become constants).
const TIDY: &str = "canonicalize,cse,dce";

/// Bins of the histograms `--method percentile` cuts.
const BINS: usize = 4096;

/// Bins of the histograms of |x| `--method entropy` searches (TensorRT's 2048).
const ENTROPY_BINS: usize = 2048;

// The arguments of `tcc quantize`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    #[command(flatten)]
    pub model: Model,
    /// The calibration inputs: a directory in `tcc train --data`'s format (`<name>.npy` for
    /// every parameter to feed, a run per mini-batch), or of .npy files, one run each, for a
    /// function with one parameter to feed; or `random:N` (N runs on uniform values in
    /// [-1, 1]).
    #[arg(long, value_name = "DIR|random:N")]
    pub calib: String,
    /// How an activation's range is chosen from what it took: `minmax` (the whole range),
    /// `percentile=P` (the P-th and (100-P)-th percentiles of its values, P in (50, 100]) or
    /// `entropy` (clipped where the quantized histogram of |x| loses least information, as
    /// TensorRT calibrates).
    #[arg(long, default_value = "minmax")]
    pub method: String,
    /// One weight scale per output channel instead of one per layer.
    #[arg(long)]
    pub per_channel: bool,
    /// Activations symmetric about 0 (u8 with zero point 128) instead of fitted to their range.
    #[arg(long)]
    pub symmetric_activations: bool,
    /// Layers to keep in float: names of layers (their results) or `/`-ended prefixes,
    /// comma-separated.
    #[arg(long, value_delimiter = ',', value_name = "SCOPES")]
    pub exclude: Vec<String>,
    /// Write the quantized IR here instead of stdout.
    #[arg(short = 'o', long = "output")]
    pub output: Option<String>,
}

/// How ranges are chosen.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Method {
    MinMax,
    Percentile(f64),
    Entropy,
}

impl Method {
    fn parse(s: &str) -> Result<Method, Error> {
        if s == "minmax" {
            return Ok(Method::MinMax);
        }
        if s == "entropy" {
            return Ok(Method::Entropy);
        }
        match s.strip_prefix("percentile=").map(str::parse::<f64>) {
            Some(Ok(p)) if p > 50.0 && p <= 100.0 => Ok(Method::Percentile(p)),
            _ => Err(Error::usage(format!(
                "error: --method `{s}`: expected minmax, percentile=P with P in (50, 100], or entropy"
            ))),
        }
    }
}

pub(crate) fn run(mut a: Args, io: &mut Io) -> Result<(), Error> {
    let method = Method::parse(&a.method)?;
    if a.model.passes.is_none() && a.model.opt_level.is_none() {
        a.model.passes = Some(PIPELINE.to_string());
    }
    let mut p = prepare(&a.model, io)?;
    let frozen = freeze_stored(&mut p.module, p.func)?;
    if !frozen.is_empty() {
        p.inputs = (p.inputs.into_iter().enumerate())
            .filter(|(i, _)| !frozen.contains(i))
            .map(|(_, t)| t)
            .collect();
        // What the passes left as arithmetic on the weights (a scale moved onto a filter)
        // folds now that they are constants.
        tidy(&mut p.module)?;
    }
    let f = p.function().clone();
    let layers = chosen_layers(&f, &a.exclude)?;
    if layers.is_empty() {
        return Err(Error::input(format!(
            "error: `@{}` has no convolution or matrix product with constant f32 weights to quantize",
            f.name
        )));
    }
    let runs = calibration_inputs(&f, &p.inputs, &p.module, &a.calib)?;
    let cpu = a.model.cpu(false);
    let observed: Vec<Value> = {
        let mut v: Vec<Value> = layers.iter().map(|l| l.input).collect();
        v.sort();
        v.dedup();
        v
    };
    let ranges = observe(&f, &cpu, &runs, &observed, method, io)?;
    let scheme = Scheme {
        per_channel: a.per_channel,
        symmetric_activations: a.symmetric_activations,
    };
    let mut q = f.clone();
    let report = ptq::quantize(&mut q, &layers, &ranges, scheme)
        .map_err(|e| Error::input(format!("error: {e}")))?;
    // Tidied as the output is written: the scales' products folded, repeated constants merged.
    p.module.functions[p.func] = q;
    tidy(&mut p.module)?;
    let errors = compare(&f, &p.module.functions[p.func], &cpu, &runs, &layers)?;
    let _ = write!(io.stderr, "{}", table(&report, &errors, runs.len()));
    io.write_module(p.module, a.output.as_deref())
}

/// Runs [`TIDY`] on `m`.
fn tidy(m: &mut Module) -> Result<(), Error> {
    let pipeline = Pipeline::parse(TIDY).expect("a valid pipeline");
    PassManager::new(pipeline)
        .run(m, &mut std::io::sink())
        .map(|_| ())
        .map_err(|e| Error::input(format!("error: {e}")))
}

/// Makes the parameters of function `func` that have stored values (a trained model's weights
/// directory) constants, as an inference model's weights are, so that their layers can be
/// quantized; the values leave the module's stored weights unless another function takes
/// them. Returns the removed parameters' former indices.
fn freeze_stored(m: &mut Module, func: usize) -> Result<Vec<usize>, Error> {
    let f = &m.functions[func];
    let stored: Vec<(usize, String)> = (f.params().iter().enumerate())
        .filter(|&(_, &p)| m.weights.values.contains_key(f.name(p)))
        .map(|(i, &p)| (i, f.name(p).to_string()))
        .collect();
    for (_, name) in &stored {
        let t = std::sync::Arc::clone(&m.weights.values[name]);
        let f = &mut m.functions[func];
        let p = f.lookup(name).expect("a parameter");
        let kind = OpKind::Const {
            ty: t.ty().clone(),
            value: Literal::dense(t.data().clone()),
        };
        let op = f.create_op(
            kind,
            vec![],
            vec![t.ty().clone()],
            &[&format!("{name}/frozen")],
        );
        match f.schedule().first() {
            Some(&first) => f.insert_before(op, first),
            None => f.append(op),
        }
        let c = f.op(op).results[0];
        f.replace_all_uses(p, c);
        f.remove_param(p)
            .map_err(|e| Error::input(format!("error: internal: {e}")))?;
        f.rename(c, name);
        let elsewhere = (m.functions.iter().enumerate())
            .any(|(g, h)| g != func && h.params().iter().any(|&q| h.name(q) == name));
        if !elsewhere {
            m.weights.values.remove(name);
        }
    }
    Ok(stored.into_iter().map(|(i, _)| i).collect())
}

/// The layers of `f` to quantize: all but those `exclude` names (a scope that matches none is
/// an error listing them).
fn chosen_layers(f: &Function, exclude: &[String]) -> Result<Vec<Layer>, Error> {
    let all = ptq::layers(f);
    let name = |l: &Layer| f.name(l.output).to_string();
    let matches = |scope: &str, n: &str| {
        if scope.ends_with('/') {
            n.starts_with(scope)
        } else {
            n == scope
        }
    };
    for s in exclude {
        if !all.iter().any(|l| matches(s, &name(l))) {
            let names: Vec<String> = all.iter().map(name).collect();
            return Err(Error::usage(format!(
                "error: --exclude `{s}` matches no layer; the layers are {}",
                abbreviate(names.iter().map(String::as_str))
            )));
        }
    }
    Ok(all
        .into_iter()
        .filter(|l| !exclude.iter().any(|s| matches(s, &name(l))))
        .collect())
}

/// One run's inputs per calibration sample: the parameters with stored values take them, the
/// one left takes each `.npy` file of the directory (sorted by name) or random values.
fn calibration_inputs(
    f: &Function,
    prepared: &[Tensor],
    m: &tcc_ir::Module,
    calib: &str,
) -> Result<Vec<Vec<Tensor>>, Error> {
    if let Some(n) = calib.strip_prefix("random:") {
        let n: usize = n.parse().ok().filter(|&n| n > 0).ok_or_else(|| {
            Error::usage(format!(
                "error: --calib `{calib}`: expected random:N with N >= 1"
            ))
        })?;
        return Ok((0..n)
            .map(|k| {
                (f.params().iter().enumerate())
                    .map(|(i, &p)| match m.weights.values.get(f.name(p)) {
                        Some(t) => Tensor::clone(t),
                        None => {
                            let seed = 0x9a7e_0000 + (k * 1000 + i) as u64;
                            random_tensor(f.ty(p), &mut Rng::new(seed))
                        }
                    })
                    .collect()
            })
            .collect());
    }
    let fed: Vec<usize> = (0..f.params().len())
        .filter(|&i| !m.weights.values.contains_key(f.name(f.params()[i])))
        .collect();
    // `tcc train --data`'s format: `<name>.npy` for every parameter to feed, each holding one
    // or more mini-batches of it; a run per mini-batch.
    let data = |i: usize| {
        let name = f.name(f.params()[i]);
        std::path::Path::new(calib).join(format!("{}.npy", crate::train::file_stem(name)))
    };
    if !fed.is_empty() && fed.iter().all(|&i| data(i).is_file()) {
        let feeds = (fed.iter())
            .map(|&i| {
                let p = f.params()[i];
                crate::train::Feed::new(f.name(p), &data(i), f.ty(p))
                    .map(|feed| (i, feed))
                    .map_err(Error::input)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let batches = feeds[0].1.batches;
        if let Some((i, feed)) = feeds.iter().find(|(_, feed)| feed.batches != batches) {
            return Err(Error::input(format!(
                "error: --calib {calib}: `{}` holds {} mini-batches but `{}` holds {batches}; give every array the same number of rows",
                f.name(f.params()[*i]),
                feed.batches,
                f.name(f.params()[feeds[0].0])
            )));
        }
        return Ok((0..batches)
            .map(|b| {
                let mut run = prepared.to_vec();
                for (i, feed) in &feeds {
                    run[*i] = feed.get(b);
                }
                run
            })
            .collect());
    }
    let [fed] = fed[..] else {
        return Err(Error::usage(format!(
            "error: --calib {calib}: `@{}` has {} parameters to feed: give a directory with `<name>.npy` for each (as `tcc train --data` reads), or one of .npy files for a function with one",
            f.name,
            fed.len()
        )));
    };
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(calib)
        .map_err(|e| Error::input(format!("error: --calib `{calib}`: {e}")))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "npy"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(Error::input(format!(
            "error: --calib `{calib}`: no .npy files in it"
        )));
    }
    let p = f.params()[fed];
    files
        .iter()
        .map(|path| {
            let shown = path.display();
            let bytes = std::fs::read(path)
                .map_err(|e| Error::input(format!("error: cannot read `{shown}`: {e}")))?;
            let t =
                npy::read(&bytes).map_err(|e| Error::input(format!("error: `{shown}`: {e}")))?;
            if t.ty() != f.ty(p) {
                return Err(Error::input(format!(
                    "error: calibration input `{shown}` holds {}, but the parameter `{}` is {}",
                    t.ty(),
                    f.name(p),
                    f.ty(p)
                )));
            }
            let mut run = prepared.to_vec();
            run[fed] = t;
            Ok(run)
        })
        .collect()
}

/// `f` compiled with `extra` values as more results, after its own.
fn with_results(
    f: &Function,
    extra: &[Value],
    cpu: &tcc_codegen::Cpu,
) -> Result<tcc_codegen::Executable, Error> {
    let mut g = f.clone();
    let mut results = g.results().to_vec();
    results.extend_from_slice(extra);
    g.set_results(results);
    tcc_codegen::compile(cpu, &g).map_err(|e| Error::input(format!("error: {e}")))
}

/// Each of `values`' range over the calibration `runs`, chosen by `method`.
fn observe(
    f: &Function,
    cpu: &tcc_codegen::Cpu,
    runs: &[Vec<Tensor>],
    values: &[Value],
    method: Method,
    io: &mut Io,
) -> Result<HashMap<Value, Range>, Error> {
    let exe = with_results(f, values, cpu)?;
    let skip = f.results().len();
    let mut run_all = |what: &str, each: &mut dyn FnMut(usize, &[f32])| -> Result<(), Error> {
        // A progress line where a person watches; where the output goes to a file, just the
        // count at the end.
        let live = std::io::stderr().is_terminal();
        for (k, inputs) in runs.iter().enumerate() {
            if live {
                let _ = write!(io.stderr, "\r{what}: {}/{}", k + 1, runs.len());
                let _ = io.stderr.flush();
            }
            let out = exe
                .run(inputs)
                .map_err(|e| Error::input(format!("error: calibration run {}: {e}", k + 1)))?;
            for (i, t) in out[skip..].iter().enumerate() {
                if let tcc_ir::Data::F32(v) = t.data() {
                    each(i, v);
                }
            }
        }
        if live {
            let _ = writeln!(io.stderr);
        } else {
            let _ = writeln!(io.stderr, "{what}: {} runs", runs.len());
        }
        Ok(())
    };
    let mut lo = vec![f32::INFINITY; values.len()];
    let mut hi = vec![f32::NEG_INFINITY; values.len()];
    run_all("calibrating", &mut |i, v| {
        for &x in v {
            // NaN compares false both ways; an infinity makes the range fail later.
            lo[i] = lo[i].min(x);
            hi[i] = hi[i].max(x);
        }
    })?;
    if let Method::Percentile(pct) = method {
        let mut hist = vec![vec![0u64; BINS]; values.len()];
        let bin = |i: usize, x: f32| {
            let w = (hi[i] - lo[i]).max(f32::MIN_POSITIVE);
            (((x - lo[i]) / w * BINS as f32) as usize).min(BINS - 1)
        };
        run_all("histograms", &mut |i, v| {
            if !(lo[i].is_finite() && hi[i].is_finite()) {
                return;
            }
            for &x in v.iter().filter(|x| !x.is_nan()) {
                hist[i][bin(i, x)] += 1;
            }
        })?;
        for i in 0..values.len() {
            if !(lo[i].is_finite() && hi[i].is_finite()) {
                continue;
            }
            let total: u64 = hist[i].iter().sum();
            let cut = ((1.0 - pct / 100.0) * total as f64) as u64;
            let w = (hi[i] - lo[i]) / BINS as f32;
            let (mut below, mut a) = (0u64, 0usize);
            while a < BINS - 1 && below + hist[i][a] <= cut {
                below += hist[i][a];
                a += 1;
            }
            let (mut above, mut b) = (0u64, BINS - 1);
            while b > a && above + hist[i][b] <= cut {
                above += hist[i][b];
                b -= 1;
            }
            let (l, h) = (lo[i] + a as f32 * w, lo[i] + (b + 1) as f32 * w);
            lo[i] = l.max(lo[i]);
            hi[i] = h.min(hi[i]);
        }
    }
    if method == Method::Entropy {
        // Histograms of |x| over [0, max |x|]; each range clipped at the threshold the
        // entropy calibration picks (128 levels a side where the range has both signs, else
        // all 256 on the one).
        let amax: Vec<f32> = (0..values.len())
            .map(|i| lo[i].abs().max(hi[i].abs()))
            .collect();
        let ok = |i: usize| amax[i].is_finite() && amax[i] > 0.0;
        let mut hist = vec![vec![0u64; ENTROPY_BINS]; values.len()];
        run_all("histograms", &mut |i, v| {
            if !ok(i) {
                return;
            }
            let scale = ENTROPY_BINS as f32 / amax[i];
            // Exact zeros (half a relu's outputs) are on a level whatever the threshold, and
            // a spike in the first bin would draw the search to thresholds that clip the rest.
            for &x in v.iter().filter(|x| !x.is_nan() && **x != 0.0) {
                hist[i][((x.abs() * scale) as usize).min(ENTROPY_BINS - 1)] += 1;
            }
        })?;
        for i in (0..values.len()).filter(|&i| ok(i)) {
            let levels = if lo[i] < 0.0 && hi[i] > 0.0 { 128 } else { 256 };
            let t = ptq::entropy_threshold(&hist[i], amax[i], levels);
            lo[i] = lo[i].max(-t);
            hi[i] = hi[i].min(t);
        }
    }
    Ok((values.iter().enumerate())
        .map(|(i, &v)| {
            (
                v,
                Range {
                    min: lo[i],
                    max: hi[i],
                },
            )
        })
        .collect())
}

/// Errors of the quantized function against the float one over the calibration runs: per
/// layer and for the outputs.
struct Errors {
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

fn compare(
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

/// The per-layer table and the outputs' errors.
fn table(report: &[ptq::Quantized], errors: &Errors, runs: usize) -> String {
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
            if r.integer { "" } else { "  (stayed float)" }
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

//! `tcc quantize`: post-training int8 quantization. Observes the activations of a float model's
//! convolutions and matrix products over calibration inputs (on the JIT), chooses their scales,
//! rewrites those layers onto the integer ops (`tcc_passes::quant::ptq`), and reports each
//! layer's error against the float model on the same inputs.

mod calibrate;
mod report;

use super::run::{Model, prepare};
use crate::Error;
use crate::io::{Io, abbreviate};
use calibrate::{calibration_inputs, observe};
use report::{compare, table};
use tcc_ir::{Function, Literal, Module, OpKind, Value};
use tcc_passes::quant::ptq::{self, Layer, Scheme};
use tcc_passes::{PassManager, Pipeline};

/// The passes run before quantizing unless `--passes` says otherwise: batch norm folded into
/// the layers, so that it is quantized with their weights.
const PIPELINE: &str = "canonicalize,fold-bn,cse,dce";

/// The passes run on the quantized function before it is written (and after stored weights
/// become constants).
const TIDY: &str = "canonicalize,cse,dce";

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
pub(super) enum Method {
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

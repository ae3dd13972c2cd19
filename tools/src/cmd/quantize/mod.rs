//! `tcc quantize`: post-training int8 quantization. Observes the activations of a float model's
//! convolutions and matrix products over calibration inputs (on the JIT), chooses their scales,
//! rewrites those layers onto the integer ops (`tcc_passes::quant::ptq`), and reports each
//! layer's error against the float model on the same inputs. A model trained with fake
//! quantization converts with the ranges it learned instead (`--from-qat`, qat.rs).

mod calibrate;
pub(crate) mod qat;
mod report;

use super::run::{Model, prepare};
use crate::Error;
use crate::io::{Io, abbreviate};
use calibrate::{calibration_inputs, observe};
use report::{compare, table};
use std::collections::{HashMap, HashSet};
use tcc_ir::{Function, Literal, Module, Op, OpKind, Tensor, Value};
use tcc_passes::quant::ptq::{self, Activation, Layer, Scheme, WeightLevels};
use tcc_passes::{PassManager, Pipeline};

/// The passes run before quantizing unless `--passes` says otherwise: batch norm folded into
/// the layers, so that it is quantized with their weights, and constants folded up to 2^24
/// elements (not the default 256), so that weights reaching a layer through a transpose or
/// reshape (a Gemm with `transB`) are constants and the layer is quantized.
const PIPELINE: &str = "canonicalize{fold-limit=16777216},fold-bn,cse,dce";

/// The passes run on the quantized function before it is written (and after stored weights
/// become constants).
const TIDY: &str = "canonicalize,cse,dce";

/// [`TIDY`] with `--from-qat`, whose batch norms on moving statistics fold first.
const AFTER_QAT: &str = "fold-bn,canonicalize,cse,dce";

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
    #[arg(long, conflicts_with = "from_qat")]
    pub per_channel: bool,
    /// Activations symmetric about 0 (u8 with zero point 128) instead of fitted to their range.
    #[arg(long)]
    pub symmetric_activations: bool,
    /// Weights on 7-bit levels (-63 to 63) instead of 8: what CPUs with AVX2 but without VNNI
    /// multiply exactly on `vpmaddubsw`, about twice as fast as 8-bit weights there (as
    /// onnxruntime's `reduce_range`); a little less accurate.
    #[arg(long, conflicts_with = "from_qat")]
    pub reduce_range: bool,
    /// Convert a model trained with fake quantization: DIR is what `tcc train --quantize SPEC
    /// --save DIR` wrote. Its parameters are the weights, quantized as the training quantized
    /// them; activations take the ranges it learned (calibrated only where it learned none, as
    /// for the model's input); layers outside its scopes stay float.
    #[arg(long, value_name = "DIR")]
    pub from_qat: Option<String>,
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
    let qat = (a.from_qat.as_deref())
        .map(|dir| qat::load(dir, &mut p.module, p.func))
        .transpose()?;
    let frozen = freeze_stored(&mut p.module, p.func)?;
    if !frozen.is_empty() {
        p.inputs = (p.inputs.into_iter().enumerate())
            .filter(|(i, _)| !frozen.contains(i))
            .map(|(_, t)| t)
            .collect();
    }
    if !frozen.is_empty() || qat.is_some() {
        // What the passes left as arithmetic on the weights (a scale moved onto a filter)
        // folds now that they are constants, and the batch norms `--from-qat` put on their
        // moving statistics fold into their layers.
        tidy(&mut p.module, if qat.is_some() { AFTER_QAT } else { TIDY })?;
    }
    let f = p.function().clone();
    let mut layers = chosen_layers(&f, &a.exclude)?;
    if let Some(q) = &qat {
        layers.retain(|l| q.trained(&f, l));
    }
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
    // Each layer input's quantization: learned in training, else fitted to its calibrated range.
    let mut activations: HashMap<Value, Activation> = HashMap::new();
    let mut learned: HashSet<String> = HashSet::new();
    for l in &layers {
        let at = |e: String| Error::input(format!("error: layer `{}`: {e}", f.name(l.output)));
        let act = match qat.as_ref().and_then(|q| q.range_of(&f, l.input)) {
            Some(r) => {
                learned.insert(f.name(l.output).to_string());
                Activation::learned(r).map_err(at)?
            }
            None => match ranges.get(&l.input) {
                Some(&r) => Activation::fitted(r, a.symmetric_activations).map_err(at)?,
                None => continue,
            },
        };
        activations.insert(l.input, act);
    }
    let scheme = match &qat {
        None => Scheme {
            per_channel: a.per_channel,
            weights: WeightLevels::Symmetric {
                bits: if a.reduce_range { 7 } else { 8 },
            },
        },
        Some(q) => Scheme {
            per_channel: q.options.per_channel,
            weights: WeightLevels::Nudged {
                bits: q.options.bits,
                narrow: q.options.narrow_weights,
            },
        },
    };
    let mut q = f.clone();
    let report = ptq::quantize(&mut q, &layers, &activations, scheme)
        .map_err(|e| Error::input(format!("error: {e}")))?;
    // Tidied as the output is written: the scales' products folded, repeated constants merged.
    p.module.functions[p.func] = q;
    tidy(&mut p.module, TIDY)?;
    let errors = compare(&f, &p.module.functions[p.func], &cpu, &runs, &layers)?;
    let _ = write!(
        io.stderr,
        "{}",
        table(&report, &errors, runs.len(), &learned)
    );
    io.write_module(p.module, a.output.as_deref())
}

/// Runs `passes` on `m`.
fn tidy(m: &mut Module, passes: &str) -> Result<(), Error> {
    let pipeline = Pipeline::parse(passes).expect("a valid pipeline");
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
        let first = f.schedule().first().copied();
        let c = insert_constant(f, &t, &format!("{name}/frozen"), first);
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

/// A constant holding `t`, named `name`, scheduled before `before` (or last).
pub(super) fn insert_constant(
    f: &mut Function,
    t: &Tensor,
    name: &str,
    before: Option<Op>,
) -> Value {
    let kind = OpKind::Const {
        ty: t.ty().clone(),
        value: Literal::dense(t.data().clone()),
    };
    let op = f.create_op(kind, vec![], vec![t.ty().clone()], &[name]);
    match before {
        Some(b) => f.insert_before(op, b),
        None => f.append(op),
    }
    f.op(op).results[0]
}

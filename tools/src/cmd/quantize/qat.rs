//! `tcc quantize --from-qat DIR`: convert a model trained with fake quantization (`tcc train
//! --quantize SPEC --save DIR`) using what the training learned instead of calibrated ranges.
//!
//! `DIR` holds the trained parameters (`<name>.npy`), the moving ranges of the quantized
//! activations (`quant/<value>/min|max`), the step counter when there was a delay, and
//! `quantize.txt`, the `quantize` pass's options the model was trained with (`tcc train` writes
//! it). The parameters become the model's stored weights; the options say how the weights were
//! quantized (bits, narrow range, per channel) and which layers (scopes); the ranges give the
//! activations' scales.

use super::insert_constant;
use crate::train::file_stem;
use crate::{Error, npy};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use tcc_ir::edit::Users;
use tcc_ir::{Function, Module, OpKind, Tensor, TensorType, Value};
use tcc_passes::manager::Options;
use tcc_passes::quant::ptq::{Layer, Range};
use tcc_passes::quant::quantize::{self, Quantize};

/// The file in a trained model's directory that holds its `quantize` options.
pub(crate) const OPTIONS_FILE: &str = "quantize.txt";

/// What quantization-aware training left.
pub(super) struct Qat {
    /// The `quantize` pass's options the model was trained with.
    pub options: Quantize,
    /// The learned range of each quantized activation, by the value's name.
    pub ranges: HashMap<String, Range>,
}

impl Qat {
    /// The learned range `v` of `f` has: its own, or that of the value it comes from through
    /// ops that keep values on their levels (max pooling, reshapes, transposes).
    pub fn range_of(&self, f: &Function, mut v: Value) -> Option<Range> {
        loop {
            if let Some(&r) = self.ranges.get(f.name(v)) {
                return Some(r);
            }
            let d = f.op(f.def_op(v)?);
            match d.kind {
                OpKind::MaxPool2d(_) | OpKind::Reshape { .. } | OpKind::Transpose { .. } => {
                    v = d.args[0]
                }
                _ => return None,
            }
        }
    }

    /// Whether the training quantized `layer` (its scopes).
    pub fn trained(&self, f: &Function, layer: &Layer) -> bool {
        let name = f.name(layer.output);
        self.options.scopes.is_empty()
            || self.options.scopes.iter().any(|s| {
                let s = s.trim_end_matches('/');
                name == s || name.strip_prefix(s).is_some_and(|t| t.starts_with('/'))
            })
    }
}

/// What a file of the directory holds besides parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// An activation's learned minimum or maximum.
    Min,
    Max,
    /// A training batch norm's moving mean or variance.
    Mean,
    Var,
}

/// Turns the training batch norm whose output is named `name` into an inference one over its
/// moving statistics (what the folded layer ran with once they froze), so that `fold-bn` folds
/// it into the layer's weights before they are quantized. Its batch statistics must be unused.
fn infer_batch_norm(f: &mut Function, name: &str, mean: Tensor, var: Tensor) -> Result<(), String> {
    let v = f
        .lookup(name)
        .ok_or("internal: a batch norm lost its name")?;
    let op = f.def_op(v).ok_or("internal: a batch norm without an op")?;
    let d = f.op(op).clone();
    let OpKind::BatchNormTrain { eps } = d.kind else {
        return Err(format!("`{name}` is not a training batch norm"));
    };
    let channels = f.ty(d.args[1]).clone();
    for t in [&mean, &var] {
        if t.ty() != &channels {
            return Err(format!(
                "the moving statistics of `{name}` are {}, its channels {channels}",
                t.ty()
            ));
        }
    }
    let uses = Users::new(f);
    if d.results[1..]
        .iter()
        .any(|&r| !uses.uses(r).is_empty() || uses.is_returned(r))
    {
        return Err(format!(
            "batch norm `{name}`: its batch statistics are read, so it cannot run on the moving ones"
        ));
    }
    let mean = insert_constant(f, &mean, &format!("{name}/moving_mean"), Some(op));
    let var = insert_constant(f, &var, &format!("{name}/moving_var"), Some(op));
    let ty = f.ty(v).clone();
    let args = vec![d.args[0], d.args[1], d.args[2], mean, var];
    let bn = f.create_op(
        OpKind::BatchNorm { eps },
        args,
        vec![ty],
        &[&format!("{name}/inference")],
    );
    f.insert_before(bn, op);
    let y = f.op(bn).results[0];
    f.replace_all_uses(v, y);
    f.remove_ops(|o| o == op);
    f.rename(y, name);
    Ok(())
}

/// Reads `dir` for function `func` of `m`: its parameters' values go into `m`'s stored weights
/// (replacing any there), the ranges and options are returned. A file that is neither a
/// parameter of the function nor a learned range of one of its values is an error.
pub(super) fn load(dir: &str, m: &mut Module, func: usize) -> Result<Qat, Error> {
    let at = |e: String| Error::input(format!("error: --from-qat {dir}: {e}"));
    let spec_path = Path::new(dir).join(OPTIONS_FILE);
    let spec = std::fs::read_to_string(&spec_path).map_err(|e| {
        at(format!(
            "cannot read `{}`: {e}\nnote: `tcc train --quantize SPEC --save {dir}` writes it beside the trained parameters",
            spec_path.display()
        ))
    })?;
    let options = Options::parse_for("quantize", spec.trim())
        .map_err(|e| at(format!("{}: {}", spec_path.display(), e.message)))
        .and_then(|o| {
            quantize::options(&o).map_err(|e| at(format!("{}: {e}", spec_path.display())))
        })?;
    if options.bits > 8 {
        return Err(at(format!(
            "the model was trained with {}-bit weights; the integer kernels take at most 8",
            options.bits
        )));
    }
    if options.act_bits != 8 {
        return Err(at(format!(
            "the model was trained with {}-bit activations; the integer kernels take 8",
            options.act_bits
        )));
    }
    let f = &m.functions[func];
    let params: HashMap<String, (String, TensorType)> = (f.params().iter())
        .map(|&p| {
            (
                file_stem(f.name(p)),
                (f.name(p).to_string(), f.ty(p).clone()),
            )
        })
        .collect();
    // The other files it may hold, by stem: every named value's learned range, and the moving
    // statistics of every training batch norm (`fold-bn{training=true}`'s state).
    let mut state: HashMap<String, (String, State)> = HashMap::new();
    for &op in f.schedule() {
        let d = f.op(op);
        for &v in &d.results {
            let name = f.name(v);
            if !name.is_empty() {
                for (end, s) in [("min", State::Min), ("max", State::Max)] {
                    let stem = file_stem(&format!("quant/{name}/{end}"));
                    state.insert(stem, (name.to_string(), s));
                }
            }
        }
        if matches!(d.kind, OpKind::BatchNormTrain { .. }) {
            let name = f.name(d.results[0]);
            for (end, s) in [("moving_mean", State::Mean), ("moving_var", State::Var)] {
                state.insert(file_stem(&format!("{name}/{end}")), (name.to_string(), s));
            }
        }
    }
    let entries = std::fs::read_dir(dir).map_err(|e| at(format!("cannot read it: {e}")))?;
    let mut paths: Vec<_> = (entries.flatten().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "npy"))
        .collect();
    paths.sort();
    let mut ends: HashMap<String, (Option<f32>, Option<f32>)> = HashMap::new();
    let mut moving: HashMap<String, (Option<Tensor>, Option<Tensor>)> = HashMap::new();
    for path in paths {
        let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
        let shown = path.display();
        let read = || {
            let bytes =
                std::fs::read(&path).map_err(|e| at(format!("cannot read `{shown}`: {e}")))?;
            npy::read(&bytes).map_err(|e| at(format!("`{shown}`: {e}")))
        };
        if let Some((name, ty)) = params.get(stem) {
            let t = read()?;
            if t.ty() != ty {
                return Err(at(format!(
                    "`{shown}` holds {}, but parameter `{name}` is {ty}",
                    t.ty()
                )));
            }
            m.weights.values.insert(name.clone(), Arc::new(t));
            continue;
        }
        let Some((name, what)) = state.get(stem) else {
            if stem == file_stem("quant/step") {
                continue;
            }
            return Err(at(format!(
                "`{shown}` is neither a parameter of `@{}` nor the learned state of one of its values; is the directory from another model?",
                f.name
            )));
        };
        let t = read()?;
        match what {
            State::Min | State::Max => {
                let value = match t.data() {
                    tcc_ir::Data::F32(x) if x.len() == 1 => x[0],
                    _ => {
                        return Err(at(format!(
                            "`{shown}` holds {}; a learned range is an f32 scalar",
                            t.ty()
                        )));
                    }
                };
                let e = ends.entry(name.clone()).or_default();
                *(if *what == State::Max {
                    &mut e.1
                } else {
                    &mut e.0
                }) = Some(value);
            }
            State::Mean | State::Var => {
                let e = moving.entry(name.clone()).or_default();
                *(if *what == State::Var {
                    &mut e.1
                } else {
                    &mut e.0
                }) = Some(t);
            }
        }
    }
    for (name, stats) in moving {
        let (Some(mean), Some(var)) = stats else {
            return Err(at(format!(
                "batch norm `{name}` has only one of its moving statistics"
            )));
        };
        infer_batch_norm(&mut m.functions[func], &name, mean, var).map_err(at)?;
    }
    let mut ranges = HashMap::new();
    for (name, e) in ends {
        let (Some(min), Some(max)) = e else {
            return Err(at(format!(
                "the learned range of `{name}` has only its {}",
                if e.0.is_some() { "minimum" } else { "maximum" }
            )));
        };
        ranges.insert(name, Range { min, max });
    }
    Ok(Qat { options, ranges })
}

//! `tcc train`: build a train step from a loss function and loop it through the JIT.
//!
//! The function's first result is the loss. Each parameter with a file `DATA/<name>.npy` is data;
//! every other floating-point parameter is trained. A data file whose first dimension is a
//! multiple of the parameter's (same trailing dimensions) is cut into consecutive mini-batches,
//! used in turn. Trained parameters start from `INIT/<name>.npy` when given, else from the
//! module's stored value (an imported model's weights), otherwise from a fixed-seed
//! initialisation: rank ≥ 2 uniform in ±sqrt(6 / fan_in) (fan_in is the first
//! dimension of a matrix, the product of the trailing dimensions of a conv filter), rank ≤ 1
//! zeros, except names ending in `gamma` or `scale`, which start at one. Optimizer state starts
//! at zero. After each step every result `new/<name>` replaces the parameter `<name>`.

use crate::npy;
use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;
use tcc_ir::random::Rng;
use tcc_ir::{DType, Data, Function, Tensor, TensorType};
use tcc_passes::grad::{GradOptions, Wrt, grad};
use tcc_passes::optim::{Optimizer, apply_optimizer};
use tcc_passes::remat::Remat;
use tcc_passes::swap::Swap;

/// What `tcc train` was asked to do.
pub struct TrainArgs<'a> {
    /// Number of steps.
    pub steps: usize,
    /// Directory of data arrays.
    pub data: Option<&'a str>,
    /// Data arrays given in memory, by parameter name (beside or instead of `data`; an array
    /// here wins over a file of the same name).
    pub arrays: Option<&'a BTreeMap<String, Tensor>>,
    /// Directory of initial parameter values.
    pub init: Option<&'a str>,
    /// The optimizer.
    pub optimizer: Optimizer,
    /// Initial values of trained parameters (a model's own weights), used where `init` has
    /// no file.
    pub weights: &'a BTreeMap<String, Arc<Tensor>>,
    /// Print the loss every this many steps (0: ten times in all).
    pub every: usize,
    /// A `remat` pass run on the step after `grad` and the optimizer, if any.
    pub remat: Option<&'a Remat>,
    /// A `swap` pass run on the step after `remat`, if any.
    pub swap: Option<&'a Swap>,
    /// The simulated link of the swaps, bytes per second (`Cpu::link_bandwidth`).
    pub link_bandwidth: Option<f64>,
    /// Directory of held-out data (the same names as `data`), evaluated after training.
    pub eval: Option<&'a str>,
}

/// The optimizer `name` (`sgd`, `momentum` or `adam`) with learning rate `lr`, as `tcc train
/// --optimizer` takes it; the error is a usage message.
pub fn optimizer(name: &str, lr: f64) -> Result<Optimizer, String> {
    if !matches!(name, "sgd" | "momentum" | "adam") {
        return Err(format!(
            "error: unknown optimizer `{name}`; choose sgd, momentum or adam"
        ));
    }
    let mut o = tcc_passes::Options::default();
    o.0.push(("lr".into(), lr.to_string()));
    tcc_passes::optim::options(name, &o).map_err(|e| format!("error: {e}"))
}

/// A file name for a value: characters outside `[A-Za-z0-9_.-]` become `_`.
pub fn file_stem(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn read_npy(path: &Path) -> Result<Tensor, String> {
    let bytes =
        std::fs::read(path).map_err(|e| format!("error: cannot read `{}`: {e}", path.display()))?;
    npy::read(&bytes).map_err(|e| format!("error: `{}`: {e}", path.display()))
}

/// Rows `[start, start + rows)` along axis 0.
fn rows(t: &Tensor, start: usize, rows: usize) -> Tensor {
    let d = t.dims();
    let per: usize = d[1..].iter().product::<u64>() as usize;
    let r = start * per..(start + rows) * per;
    let data = match t.data() {
        Data::F32(v) => Data::F32(v[r].to_vec()),
        Data::F64(v) => Data::F64(v[r].to_vec()),
        Data::I8(v) => Data::I8(v[r].to_vec()),
        Data::U8(v) => Data::U8(v[r].to_vec()),
        Data::I32(v) => Data::I32(v[r].to_vec()),
        Data::I64(v) => Data::I64(v[r].to_vec()),
        Data::Bool(v) => Data::Bool(v[r].to_vec()),
    };
    let mut dims = d.to_vec();
    dims[0] = rows as u64;
    Tensor::from_data(&dims, data).expect("sliced to fit")
}

/// A data parameter: the whole array and how many batches it holds.
pub(crate) struct Feed {
    all: Tensor,
    batch: usize,
    pub(crate) batches: usize,
}

impl Feed {
    /// Parameter `name` of type `ty` fed from the array in `path`: exactly that type, or more
    /// rows of it (a multiple of its first dimension), cut into consecutive mini-batches.
    pub(crate) fn new(name: &str, path: &Path, ty: &TensorType) -> Result<Feed, String> {
        let all = read_npy(path)?;
        Feed::of(name, all, &format!("`{}`", path.display()), ty)
    }

    /// [`Feed::new`] on the array `all`, described in errors as `what`.
    fn of(name: &str, all: Tensor, what: &str, ty: &TensorType) -> Result<Feed, String> {
        let bad = || {
            format!(
                "error: data {what} holds {}, but parameter `{name}` is {ty}; give exactly that, or more rows of it (a multiple of {})",
                all.ty(),
                ty.dims().first().copied().unwrap_or(1)
            )
        };
        if all.ty() == ty {
            return Ok(Feed {
                batch: 0,
                batches: 1,
                all,
            });
        }
        let (d, want) = (all.dims(), ty.dims());
        if all.dtype() != ty.dtype()
            || want.is_empty()
            || d.len() != want.len()
            || d[1..] != want[1..]
            || want[0] == 0
            || d[0] % want[0] != 0
        {
            return Err(bad());
        }
        Ok(Feed {
            batch: want[0] as usize,
            batches: (d[0] / want[0]) as usize,
            all,
        })
    }

    /// Mini-batch `step` (cycling).
    pub(crate) fn get(&self, step: usize) -> Tensor {
        if self.batch == 0 {
            self.all.clone()
        } else {
            rows(&self.all, (step % self.batches) * self.batch, self.batch)
        }
    }
}

/// The default initial value of a trained parameter (see the module docs).
pub fn init_value(name: &str, ty: &TensorType, seed: u64) -> Tensor {
    let d = ty.dims();
    let n = ty.numel() as usize;
    let vals: Vec<f64> = if d.len() >= 2 {
        let fan_in = if d.len() == 2 {
            d[0]
        } else {
            d[1..].iter().product()
        };
        let a = (6.0 / fan_in.max(1) as f64).sqrt();
        let mut rng = Rng::new(seed);
        (0..n).map(|_| rng.uniform(-1.0, 1.0) * a).collect()
    } else if name.ends_with("gamma") || name.ends_with("scale") {
        vec![1.0; n]
    } else {
        vec![0.0; n]
    };
    let data = match ty.dtype() {
        DType::F64 => Data::F64(vals),
        _ => Data::F32(vals.into_iter().map(|x| x as f32).collect()),
    };
    Tensor::new(ty.clone(), data).expect("sized to fit")
}

/// Where each step-function parameter gets its value.
enum Source {
    Data(Feed),
    /// Carried from step to step: the index of the result that replaces it.
    State(usize),
}

/// Builds the train-step function from the loss function `f`: its data parameter names and the
/// step function. `remat` is run on the step last (after `grad` and the optimizer), so that a
/// budget refers to the function that is compiled.
pub fn train_step(
    f: &Function,
    data_names: &[String],
    opt: Optimizer,
    remat: Option<&Remat>,
) -> Result<(Function, Vec<String>), String> {
    train_step_with(f, data_names, opt, remat, None)
}

/// [`train_step`], then `swap` on the step (after `remat`, if any).
pub fn train_step_with(
    f: &Function,
    data_names: &[String],
    opt: Optimizer,
    remat: Option<&Remat>,
    swap: Option<&Swap>,
) -> Result<(Function, Vec<String>), String> {
    let Some(&loss) = f.results().first() else {
        return Err(format!(
            "error: `@{}` has no results; its first result must be the loss",
            f.name
        ));
    };
    if !f.ty(loss).dtype().is_float() || f.ty(loss).rank() != 0 {
        return Err(format!(
            "error: the first result of `@{}`, `%{}`, is {}; `tcc train` needs a floating-point scalar loss there",
            f.name,
            f.name(loss),
            f.ty(loss)
        ));
    }
    // State the function updates itself (a result `new/<p>`, as `quantize`'s moving ranges)
    // is carried, not trained.
    let updated = |p: &str| {
        f.results()
            .iter()
            .any(|&r| f.name(r).strip_prefix("new/") == Some(p))
    };
    let trained: Vec<String> = f
        .params()
        .iter()
        .filter(|&&p| {
            f.ty(p).dtype().is_float()
                && !data_names.iter().any(|n| n == f.name(p))
                && !updated(f.name(p))
        })
        .map(|&p| f.name(p).to_string())
        .collect();
    if trained.is_empty() {
        return Err(format!(
            "error: every floating-point parameter of `@{}` has a data file, so there is nothing to train",
            f.name
        ));
    }
    let mut step = f.clone();
    let opts = GradOptions {
        ys: vec![f.name(loss).to_string()],
        wrt: Wrt::Select(trained.clone()),
        ..GradOptions::default()
    };
    grad(&mut step, &opts).map_err(|e| format!("error: grad: {e}"))?;
    apply_optimizer(&mut step, opt).map_err(|e| format!("error: optimizer: {e}"))?;
    if let Some(r) = remat {
        r.run(&mut step).map_err(|e| format!("error: remat: {e}"))?;
    }
    if let Some(s) = swap {
        s.run(&mut step).map_err(|e| format!("error: swap: {e}"))?;
    }
    tcc_ir::verify_function(&step)
        .map_err(|d| format!("internal compiler error: the train step does not verify:\n{d}"))?;
    Ok((step, trained))
}

/// For each parameter of a train step, the index of the result `new/<name>` that replaces it
/// for the next step (`None` for data).
pub fn carried(step: &Function) -> Vec<Option<usize>> {
    let new: std::collections::HashMap<&str, usize> = step
        .results()
        .iter()
        .enumerate()
        .filter_map(|(i, &r)| step.name(r).strip_prefix("new/").map(|n| (n, i)))
        .collect();
    step.params()
        .iter()
        .map(|&p| new.get(step.name(p)).copied())
        .collect()
}

/// What training produced.
pub struct Trained {
    /// The final values of the trained parameters and of the state the loss function updates
    /// itself, by name.
    pub values: Vec<(String, Tensor)>,
    /// The loss (the function's first result) at each step.
    pub losses: Vec<f64>,
}

/// Runs `tcc train` on `f`, writing the log to `out` and the progress bar to `err`.
pub fn train(
    f: &Function,
    args: &TrainArgs<'_>,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<Trained, String> {
    let data_dir = args.data.map(Path::new);
    let in_memory = |n: &str| args.arrays.is_some_and(|a| a.contains_key(n));
    let data_names: Vec<String> = f
        .params()
        .iter()
        .map(|&p| f.name(p).to_string())
        .filter(|n| {
            in_memory(n)
                || data_dir.is_some_and(|d| d.join(format!("{}.npy", file_stem(n))).exists())
        })
        .collect();
    if let Some(arrays) = args.arrays
        && let Some(name) = arrays
            .keys()
            .find(|n| !f.params().iter().any(|&p| f.name(p) == *n))
    {
        let params: Vec<&str> = f.params().iter().map(|&p| f.name(p)).collect();
        return Err(format!(
            "error: data `{name}`: `@{}` has no parameter `{name}`; its parameters are {}",
            f.name,
            params.join(", ")
        ));
    }
    let (step_fn, trained) =
        train_step_with(f, &data_names, args.optimizer, args.remat, args.swap)?;
    let is_trained: std::collections::HashSet<&str> = trained.iter().map(String::as_str).collect();
    let cpu = tcc_codegen::Cpu {
        link_bandwidth: args.link_bandwidth,
        ..Default::default()
    };
    let exe = tcc_codegen::compile(&cpu, &step_fn).map_err(|e| format!("error: {e}"))?;
    let next = carried(&step_fn);

    // Each parameter's source, and the step's inputs: state values move in from the results (no
    // copies); data changes only when it comes in several mini-batches.
    let mut sources = Vec::with_capacity(step_fn.params().len());
    let mut inputs: Vec<Tensor> = Vec::with_capacity(step_fn.params().len());
    for (i, &p) in step_fn.params().iter().enumerate() {
        let name = step_fn.name(p);
        let ty = step_fn.ty(p);
        let src = if data_names.iter().any(|n| n == name) {
            let feed = match args.arrays.and_then(|a| a.get(name)) {
                Some(t) => Feed::of(name, t.clone(), &format!("`{name}`"), ty)?,
                None => {
                    let dir = data_dir.expect("data names come from the arrays or the directory");
                    Feed::new(name, &dir.join(format!("{}.npy", file_stem(name))), ty)?
                }
            };
            inputs.push(feed.get(0));
            Source::Data(feed)
        } else if let Some(r) = next[i] {
            let init = args
                .init
                .map(|d| Path::new(d).join(format!("{}.npy", file_stem(name))))
                .filter(|p| p.exists());
            let value = match init {
                Some(path) => {
                    let t = read_npy(&path)?;
                    if t.ty() != ty {
                        return Err(format!(
                            "error: `{}` holds {}, but parameter `{name}` is {ty}",
                            path.display(),
                            t.ty()
                        ));
                    }
                    t
                }
                None => match args.weights.get(name) {
                    Some(t) if t.ty() == ty => Tensor::clone(t),
                    Some(t) => {
                        return Err(format!(
                            "error: the stored value of `{name}` is {}, but the parameter is {ty}",
                            t.ty()
                        ));
                    }
                    None if is_trained.contains(name) => {
                        init_value(name, ty, 0x7cc0_0000 + i as u64)
                    }
                    None => match tcc_passes::quant::initial_value(name) {
                        Some(x) => {
                            Tensor::splat(ty.clone(), tcc_ir::Scalar::from_f64(ty.dtype(), x))
                                .map_err(|e| format!("error: {e}"))?
                        }
                        None => Tensor::zeros(ty.clone()).map_err(|e| format!("error: {e}"))?,
                    },
                },
            };
            inputs.push(value);
            Source::State(r)
        } else {
            return Err(format!(
                "error: parameter `{name}` of `@{}` is neither trained nor in the data directory{}; add {}/{}.npy",
                f.name,
                if data_dir.is_none() {
                    " (no --data given)"
                } else {
                    ""
                },
                args.data.unwrap_or("DATA"),
                file_stem(name)
            ));
        };
        sources.push(src);
    }
    // Scalar results other than the new values are reported with the loss.
    let reported: Vec<(usize, String)> = step_fn
        .results()
        .iter()
        .enumerate()
        .filter(|&(_, &r)| step_fn.ty(r).rank() == 0 && !step_fn.name(r).starts_with("new/"))
        .map(|(i, &r)| (i, step_fn.name(r).to_string()))
        .collect();
    let _ = writeln!(
        out,
        "training `@{}`: {} parameters ({} values), {} data inputs, {} steps; train step has {} ops, arena {}",
        f.name,
        trained.len(),
        sources
            .iter()
            .zip(step_fn.params())
            .filter(|(_, p)| is_trained.contains(step_fn.name(**p)))
            .map(|(_, &p)| step_fn.ty(p).numel())
            .sum::<u64>(),
        data_names.len(),
        args.steps,
        step_fn.schedule().len(),
        tcc_passes::analysis::memory::human(exe.stats().arena_bytes)
    );
    if exe.stats().host_bytes > 0 {
        let swapped = (step_fn.schedule().iter())
            .filter(|&&op| matches!(step_fn.op(op).kind, tcc_ir::OpKind::SwapOut))
            .count();
        let _ = writeln!(
            out,
            "swapping {swapped} values to host memory: host pool {}",
            tcc_passes::analysis::memory::human(exe.stats().host_bytes)
        );
    }
    let every = if args.every > 0 {
        args.every
    } else {
        (args.steps / 10).max(1)
    };
    let bar = std::io::stderr().is_terminal();
    let t0 = Instant::now();
    let mut last = String::new();
    let mut losses = Vec::with_capacity(args.steps);

    for s in 0..args.steps {
        for (src, input) in sources.iter().zip(&mut inputs) {
            if let Source::Data(feed) = src
                && feed.batches > 1
            {
                *input = feed.get(s);
            }
        }
        let results = exe
            .run(&inputs)
            .map_err(|e| format!("error: step {}: {e}", s + 1))?;
        losses.push(results[0].data().get(0).to_f64());
        let report = (s + 1) % every == 0 || s == 0 || s + 1 == args.steps;
        let line = || {
            reported
                .iter()
                .map(|(i, name)| format!("{name} {}", scalar_text(&results[*i])))
                .collect::<Vec<_>>()
                .join("  ")
        };
        if report {
            let line = line();
            if bar {
                let _ = write!(err, "\r{:60}\r", "");
            }
            let ms = t0.elapsed().as_secs_f64() * 1e3 / (s + 1) as f64;
            let _ = writeln!(
                out,
                "step {:>6}/{}  {line}  ({ms:.2} ms/step)",
                s + 1,
                args.steps
            );
        } else if bar && s % 8 == 0 {
            let w = 30 * (s + 1) / args.steps;
            let _ = write!(
                err,
                "\r[{}{}] {}/{}",
                "=".repeat(w),
                " ".repeat(30 - w),
                s + 1,
                args.steps
            );
            let _ = err.flush();
        }
        if s + 1 == args.steps {
            last = line();
        }
        let mut results: Vec<Option<Tensor>> = results.into_iter().map(Some).collect();
        for (src, input) in sources.iter().zip(&mut inputs) {
            if let Source::State(r) = src {
                *input = results[*r].take().expect("each result feeds one parameter");
            }
        }
    }
    if bar {
        let _ = write!(err, "\r{:60}\r", "");
    }
    let _ = write!(
        out,
        "done: {} steps in {:.2} s",
        args.steps,
        t0.elapsed().as_secs_f64()
    );
    if !last.is_empty() {
        let _ = write!(out, "; final {last}");
    }
    let _ = writeln!(out);
    // The trained parameters, and the state the loss function updates itself (the moving
    // ranges of `quantize`), which a later run needs as much.
    let own_state =
        |name: &str| (f.results().iter()).any(|&r| f.name(r).strip_prefix("new/") == Some(name));
    let trained_values: Vec<(String, Tensor)> = sources
        .iter()
        .zip(inputs)
        .zip(step_fn.params())
        .filter(|((src, _), p)| {
            let name = step_fn.name(**p);
            matches!(src, Source::State(_)) && (is_trained.contains(name) || own_state(name))
        })
        .map(|((_, t), &p)| (step_fn.name(p).to_string(), t))
        .collect();
    if let Some(dir) = args.eval {
        evaluate(f, &data_names, &trained_values, Path::new(dir), out)?;
    }
    Ok(Trained {
        values: trained_values,
        losses,
    })
}

/// Runs the loss function `f` on every mini-batch of the held-out data in `dir` with the trained
/// parameters and state (`values`), and prints the mean of each scalar result over the batches.
/// The state is read, not updated: a folded batch norm past its freeze normalises with the moving
/// statistics, quantization uses the learned ranges.
fn evaluate(
    f: &Function,
    data_names: &[String],
    values: &[(String, Tensor)],
    dir: &Path,
    out: &mut dyn Write,
) -> Result<(), String> {
    let exe = tcc_codegen::Executable::compile(f).map_err(|e| format!("error: --eval: {e}"))?;
    let mut feeds: Vec<(usize, Feed)> = Vec::new();
    let mut inputs: Vec<Tensor> = Vec::with_capacity(f.params().len());
    for (i, &p) in f.params().iter().enumerate() {
        let name = f.name(p);
        if data_names.iter().any(|n| n == name) {
            let path = dir.join(format!("{}.npy", file_stem(name)));
            if !path.exists() {
                return Err(format!(
                    "error: --eval {}: no `{}.npy` for the data parameter `{name}`; the held-out directory needs every array the training data has",
                    dir.display(),
                    file_stem(name)
                ));
            }
            let feed = Feed::new(name, &path, f.ty(p))?;
            inputs.push(feed.get(0));
            feeds.push((i, feed));
        } else {
            let (_, t) = values
                .iter()
                .find(|(n, _)| n == name)
                .expect("every other parameter is trained or carried state");
            inputs.push(t.clone());
        }
    }
    let batches = feeds
        .iter()
        .map(|(_, feed)| feed.batches)
        .max()
        .unwrap_or(1);
    if let Some((i, feed)) = feeds.iter().find(|(_, feed)| feed.batches != batches) {
        return Err(format!(
            "error: --eval {}: `{}` holds {} mini-batches but other arrays hold {batches}; give every array the same number of rows",
            dir.display(),
            f.name(f.params()[*i]),
            feed.batches
        ));
    }
    let reported: Vec<(usize, &str)> = (f.results().iter().enumerate())
        .filter(|&(_, &r)| f.ty(r).rank() == 0 && !f.name(r).starts_with("new/"))
        .map(|(i, &r)| (i, f.name(r)))
        .collect();
    let mut sums = vec![0.0; reported.len()];
    for b in 0..batches {
        for (i, feed) in &feeds {
            inputs[*i] = feed.get(b);
        }
        let results = exe
            .run(&inputs)
            .map_err(|e| format!("error: --eval, batch {}: {e}", b + 1))?;
        for (sum, (i, _)) in sums.iter_mut().zip(&reported) {
            *sum += results[*i].data().get(0).to_f64();
        }
    }
    let line = (reported.iter().zip(&sums))
        .map(|((_, name), sum)| format!("{name} {:.6}", sum / batches as f64))
        .collect::<Vec<_>>()
        .join("  ");
    let _ = writeln!(
        out,
        "eval: {batches} held-out batches from {}: mean {line}",
        dir.display()
    );
    Ok(())
}

fn scalar_text(t: &Tensor) -> String {
    match t.data() {
        Data::F32(v) => format!("{:.6}", v[0]),
        Data::F64(v) => format!("{:.6}", v[0]),
        d => format!("{}", d.get(0)),
    }
}

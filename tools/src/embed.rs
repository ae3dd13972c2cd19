//! The driver's work for programs that embed tcc, such as the Python package: load a model as
//! `tcc run` does, optimize, differentiate, compile and train, returning values and typed
//! errors ([`Error`]'s `kind`) instead of writing to the standard streams.
//!
//! Each entry point does what the command of the same name does with the same options, through
//! the same code: a program compiled here runs the same kernels as `tcc run` on the same file,
//! and gives the same results bit for bit.

use crate::Error;
use crate::io::{Input, Load, is_onnx, load_input, pick_function, read_file};
use crate::train::{TrainArgs, Trained};
use std::collections::BTreeMap;
use std::sync::Arc;
use tcc_ir::{Function, Module, Tensor};
use tcc_passes::grad::{Unconnected, Wrt};
use tcc_passes::{PassManager, Pipeline};

/// Where a model comes from.
#[derive(Clone, Copy, Debug)]
pub enum Source<'a> {
    /// An IR file or an ONNX model (by its `.onnx` name or its first byte); a weights
    /// directory the IR names is found beside it.
    Path(&'a str),
    /// IR text; a weights directory it names is found from the current directory.
    Text(&'a str),
    /// A file's contents in memory: an ONNX model (by its first byte, as a serialized
    /// `ModelProto` starts) or IR text; external data and weights directories are found from
    /// the current directory.
    Bytes(&'a [u8]),
}

/// How to load and compile.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// For ONNX models: the shapes of inputs with dynamic dimensions.
    pub shapes: Vec<(String, Vec<u64>)>,
    /// The pass pipeline run before compiling; `None` is `tcc run`'s inference pipeline,
    /// `Some("")` runs none.
    pub passes: Option<String>,
    /// The target spec (`host`, `host,-avx512f`); `None` is the host with every feature.
    pub target: Option<String>,
    /// The function to compile, where the module has several.
    pub func: Option<String>,
}

/// A compiled function, with what running it needs besides the caller's inputs.
pub struct Compiled {
    /// The function as compiled (after the passes).
    pub function: Function,
    /// Its code.
    pub exe: tcc_codegen::Executable,
    /// For each parameter, the value the module stores for it (an imported model's weights
    /// made parameters, a `weights` directory's values), which a run uses when given none.
    pub stored: Vec<Option<Arc<Tensor>>>,
}

/// Reads `source` into a module; `wrt` makes an ONNX model's initializers parameters as
/// `tcc grad --wrt` does (`Some(&[])`: every floating-point one).
pub fn load(source: Source<'_>, opts: &Options, wrt: Option<&[String]>) -> Result<Module, Error> {
    let input = match source {
        Source::Path(path) => read_file(path)?,
        Source::Text(text) => Input {
            name: name_of(source),
            bytes: text.as_bytes().to_vec(),
        },
        Source::Bytes(bytes) => Input {
            name: name_of(source),
            bytes: bytes.to_vec(),
        },
    };
    if !opts.shapes.is_empty() && !is_onnx(&input) {
        return Err(Error::usage(format!(
            "error: shapes were given for {}, which is IR: its functions' shapes are fixed (shapes bind an ONNX model's dynamic inputs)",
            input.name
        )));
    }
    let mut onnx = tcc_onnx::Options::default();
    onnx.shapes.clone_from(&opts.shapes);
    let how = Load {
        onnx,
        wrt,
        ..Load::default()
    };
    load_input(&input, &how)
}

/// `tcc run`'s first half and the compile: load, run the passes, compile the chosen function.
pub fn compile(source: Source<'_>, opts: &Options) -> Result<Compiled, Error> {
    let m = load(source, opts, None)?;
    compile_module(m, opts, &name_of(source))
}

/// `tcc grad`, then [`compile`] the gradient function: its results are the function's,
/// then d(ys)/d(x) for each x in `wrt` (every floating-point parameter when empty).
pub fn grad(source: Source<'_>, opts: &Options, g: &GradArgs) -> Result<Compiled, Error> {
    let mut m = load(source, opts, Some(&g.wrt))?;
    let at = name_of(source);
    let i = function_index(&m, opts.func.as_deref(), &at)?;
    let grad_opts = tcc_passes::GradOptions {
        ys: g.ys.clone(),
        wrt: if g.wrt.is_empty() {
            Wrt::Params
        } else {
            Wrt::Select(g.wrt.clone())
        },
        stop: g.stop.clone(),
        grad_ys: false,
        unconnected: Unconnected::Zero,
    };
    let f = &mut m.functions[i];
    tcc_passes::grad(f, &grad_opts)
        .map_err(|e| Error::input(format!("{at}: error: in `@{}`: {e}", f.name)))?;
    tcc_ir::verify_function(f).map_err(|d| {
        Error::input(format!(
            "internal compiler error: the gradient of `@{}` does not verify (a bug in tcc)\n{d}",
            f.name
        ))
    })?;
    let opts = Options {
        func: Some(f.name.clone()),
        ..opts.clone()
    };
    compile_module(m, &opts, &at)
}

/// What [`grad`] differentiates.
#[derive(Clone, Debug, Default)]
pub struct GradArgs {
    /// With respect to these values (names or `scope/`); empty: every floating-point
    /// parameter (an ONNX model's initializers included).
    pub wrt: Vec<String>,
    /// The values to differentiate; empty: the single floating-point scalar result.
    pub ys: Vec<String>,
    /// Values treated as constants.
    pub stop: Vec<String>,
}

/// `tcc opt`: the module after the pipeline `passes`, as IR text.
pub fn opt(source: Source<'_>, passes: &str) -> Result<String, Error> {
    let mut m = load(source, &Options::default(), None)?;
    run_passes(&mut m, passes, &name_of(source))?;
    // Stored values are not text; the IR keeps naming where they were read from.
    m.weights.location = None;
    Ok(m.to_string())
}

/// What [`train`] trains, beside the loss function.
#[derive(Clone, Debug)]
pub struct TrainOptions<'a> {
    /// Number of steps.
    pub steps: usize,
    /// Data by parameter name: exactly the parameter's type, or more rows of it, cut into
    /// mini-batches used in turn.
    pub data: &'a BTreeMap<String, Tensor>,
    /// Initial values of trained parameters, by name (others start from the module's stored
    /// values or `tcc train`'s initialisation).
    pub init: &'a BTreeMap<String, Tensor>,
    /// `sgd`, `momentum` or `adam`.
    pub optimizer: &'a str,
    /// The learning rate.
    pub lr: f64,
    /// The options of a `remat` pass run on the train step, as `tcc train --remat`.
    pub remat: Option<&'a str>,
    /// Print `tcc train`'s log to stdout every this many steps (0: no log).
    pub every: usize,
}

/// `tcc train` on the loss function of `source` (its first result is the loss).
pub fn train(source: Source<'_>, opts: &Options, t: &TrainOptions<'_>) -> Result<Trained, Error> {
    let optimizer = crate::train::optimizer(t.optimizer, t.lr).map_err(Error::usage)?;
    let remat = (t.remat)
        .map(|spec| {
            tcc_passes::remat::Remat::parse(spec)
                .map_err(|e| Error::usage(format!("error: remat `{spec}`: {}", e.message)))
        })
        .transpose()?;
    let m = load(source, opts, Some(&[]))?;
    let at = name_of(source);
    let f = pick_function(&m, opts.func.as_deref(), &at)?;
    let mut weights = m.weights.values.clone();
    for (name, value) in t.init {
        if !f.params().iter().any(|&p| f.name(p) == name) {
            return Err(Error::input(format!(
                "error: init `{name}`: `@{}` has no parameter `{name}`",
                f.name
            )));
        }
        weights.insert(name.clone(), Arc::new(value.clone()));
    }
    let args = TrainArgs {
        steps: t.steps,
        data: None,
        arrays: Some(t.data),
        init: None,
        optimizer,
        weights: &weights,
        every: t.every.max(1),
        remat: remat.as_ref(),
        swap: None,
        link_bandwidth: None,
        eval: None,
    };
    let (mut stdout, mut sink) = (std::io::stdout(), std::io::sink());
    let out: &mut dyn std::io::Write = if t.every > 0 { &mut stdout } else { &mut sink };
    crate::train::train(f, &args, out, &mut std::io::sink()).map_err(Error::input)
}

/// The passes of `opts` on `m`, then the chosen function compiled for its target.
fn compile_module(mut m: Module, opts: &Options, at: &str) -> Result<Compiled, Error> {
    let pipeline = (opts.passes.as_deref()).unwrap_or(tcc_passes::INFERENCE_PIPELINE);
    run_passes(&mut m, pipeline, at)?;
    let i = function_index(&m, opts.func.as_deref(), at)?;
    let f = m.functions.swap_remove(i);
    tcc_ir::interp::check_sizes(&f).map_err(|e| Error::input(format!("error: {e}")))?;
    let cpu = tcc_codegen::Cpu {
        target: opts.target.clone(),
        ..tcc_codegen::Cpu::default()
    };
    let exe = tcc_codegen::compile(&cpu, &f)
        .map_err(|e| Error::input(format!("error: compiling `@{}`: {e}", f.name)))?;
    let stored = (f.params().iter())
        .map(|&p| m.weights.values.get(f.name(p)).cloned())
        .collect();
    Ok(Compiled {
        function: f,
        exe,
        stored,
    })
}

/// Runs the pipeline `text` on `m` (`at` names the model in errors).
fn run_passes(m: &mut Module, text: &str, at: &str) -> Result<(), Error> {
    let pipeline =
        Pipeline::parse(text).map_err(|e| Error::usage(format!("error: passes: {e}")))?;
    PassManager::new(pipeline)
        .run(m, &mut std::io::sink())
        .map_err(|e| Error::input(format!("{at}: error: {e}")))?;
    Ok(())
}

/// The index of the function `func`, or of the only one.
fn function_index(m: &Module, func: Option<&str>, at: &str) -> Result<usize, Error> {
    let f = pick_function(m, func, at)?;
    Ok((m.functions.iter())
        .position(|g| std::ptr::eq(g, f))
        .expect("picked from the module"))
}

fn name_of(source: Source<'_>) -> String {
    match source {
        Source::Path(p) => p.to_string(),
        Source::Text(_) => "<text>".into(),
        Source::Bytes(_) => "<bytes>".into(),
    }
}

//! `tcc train`: loop a train step (grad + optimizer) through the JIT; see [`crate::train`].

use crate::io::{Io, Load, OnnxArgs, is_onnx, pick_function};
use crate::train::{TrainArgs, file_stem, train};
use crate::{Error, npy};
use std::path::Path;

// The arguments of `tcc train`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// The IR file or ONNX model (`-` for stdin). An ONNX model trains from its own weights
    /// (every floating-point initializer becomes a trained parameter unless --params says).
    pub file: String,
    #[command(flatten)]
    pub onnx: OnnxArgs,
    /// The loss function (needed when the file defines several).
    #[arg(long)]
    pub func: Option<String>,
    /// Number of train steps.
    #[arg(long)]
    pub steps: usize,
    /// Directory of data arrays, `<parameter name>.npy` (`/` in names becomes `_`).
    #[arg(long)]
    pub data: Option<String>,
    /// Directory of initial parameter values.
    #[arg(long)]
    pub init: Option<String>,
    /// sgd, momentum or adam.
    #[arg(long, default_value = "adam")]
    pub optimizer: String,
    /// Learning rate.
    #[arg(long, default_value_t = 0.01)]
    pub lr: f64,
    /// Print the loss every N steps (default: ten times in all).
    #[arg(long, default_value_t = 0)]
    pub every: usize,
    /// Save the trained parameters as DIR/<name>.npy, or, given a path ending in `.onnx` when
    /// training an ONNX model, as a copy of the model with the new weights.
    #[arg(long, value_name = "DIR|FILE.onnx")]
    pub save: Option<String>,
    /// Gradient checkpointing: the options of a `remat` pass run after `grad`, as in
    /// `--remat budget=0.5` or `--remat strategy=memory`.
    #[arg(long, value_name = "OPTIONS")]
    pub remat: Option<String>,
    /// Host-memory swapping: the options of a `swap` pass run after `grad` (and `--remat`), as
    /// in `--swap ''` (TFLMS's defaults) or `--swap 'min-bytes=1MiB,order=direct'`.
    #[arg(long, value_name = "OPTIONS")]
    pub swap: Option<String>,
    /// With --swap: the bandwidth of the simulated link to host memory (`16GB/s`); see `tcc
    /// run --link-bandwidth`.
    #[arg(long, value_name = "RATE", value_parser = super::run::parse_bandwidth)]
    pub link_bandwidth: Option<f64>,
    /// Fold training batch norm into the layer before it with TensorFlow's corrections: the
    /// options of `fold-bn{training=true,...}`, as in `--fold-bn 'freeze-delay=200'` (or `''`).
    #[arg(long, value_name = "OPTIONS")]
    pub fold_bn: Option<String>,
    /// A directory of held-out data, named as in --data: after training, the loss function runs
    /// on each of its mini-batches with the trained parameters and state, and the mean of each
    /// scalar result (loss, accuracy) is printed.
    #[arg(long, value_name = "DIR")]
    pub eval: Option<String>,
    /// Quantization-aware training: the options of a `quantize` pass run on the loss function
    /// (after `--fold-bn`) before `grad`, as in `--quantize 'bits=8,delay=100'`.
    #[arg(long, value_name = "OPTIONS")]
    pub quantize: Option<String>,
}

pub(crate) fn run(a: Args, io: &mut Io) -> Result<(), Error> {
    let optimizer = crate::train::optimizer(&a.optimizer, a.lr).map_err(Error::usage)?;
    if a.eval.is_some() && a.data.is_none() {
        return Err(Error::usage(
            "error: --eval DIR holds held-out data named as in --data; give --data too",
        ));
    }
    let remat = a
        .remat
        .map(|spec| {
            tcc_passes::remat::Remat::parse(&spec)
                .map_err(|e| Error::input(format!("error: --remat {spec}: {}", e.message)))
        })
        .transpose()?;
    let swap = a
        .swap
        .map(|spec| {
            tcc_passes::swap::Swap::parse(&spec)
                .map_err(|e| Error::input(format!("error: --swap {spec}: {}", e.message)))
        })
        .transpose()?;
    let onnx = a.onnx.options()?;
    let how = Load {
        onnx,
        wrt: Some(&[]),
        ..Load::default()
    };
    let (input, m) = io.load_with(&a.file, &how)?;
    let f = pick_function(&m, a.func.as_deref(), &input.name)?;
    // The forward rewrites, in TensorFlow's order: fold batch norm, then fake-quantize.
    let mut passes: Vec<(String, String)> = Vec::new();
    if let Some(spec) = &a.fold_bn {
        let sep = if spec.trim().is_empty() { "" } else { "," };
        passes.push(("fold-bn".into(), format!("training=true{sep}{spec}")));
    }
    if let Some(spec) = &a.quantize {
        passes.push(("quantize".into(), spec.clone()));
    }
    let rewritten;
    let f = if passes.is_empty() {
        f
    } else {
        let mut m = tcc_ir::Module::new();
        m.functions.push(f.clone());
        for (pass, spec) in &passes {
            let flag = format!("--{pass}");
            let text = format!("{pass}{{{spec}}}");
            let pipeline = tcc_passes::Pipeline::parse(&text)
                .map_err(|e| Error::usage(format!("error: {flag} {spec}: {}", e.message)))?;
            let runs = tcc_passes::PassManager::new(pipeline)
                .run(&mut m, &mut std::io::sink())
                .map_err(|e| Error::input(format!("error: {flag}: {e}")))?;
            for r in runs {
                let _ = writeln!(io.stdout, "{r}");
            }
        }
        rewritten = m.functions.remove(0);
        &rewritten
    };
    let args = TrainArgs {
        steps: a.steps,
        data: a.data.as_deref(),
        arrays: None,
        init: a.init.as_deref(),
        optimizer,
        weights: &m.weights.values,
        every: a.every,
        remat: remat.as_ref(),
        swap: swap.as_ref(),
        link_bandwidth: a.link_bandwidth,
        eval: a.eval.as_deref(),
    };
    let trained = train(f, &args, io.stdout, io.stderr)
        .map_err(Error::input)?
        .values;
    let Some(save) = a.save.as_deref() else {
        return Ok(());
    };
    if save.ends_with(".onnx") {
        if !is_onnx(&input) {
            return Err(Error::usage(format!(
                "error: --save {save}: only an ONNX model's weights can be saved as .onnx, and `{}` is IR; give a directory",
                input.name
            )));
        }
        let mut model = tcc_onnx::read_model(&input.bytes)
            .map_err(|e| Error::input(format!("error: {}: {e}", input.name)))?;
        tcc_onnx::set_initializers(&mut model, &trained)
            .map_err(|e| Error::input(format!("error: --save {save}: {e}")))?;
        std::fs::write(save, tcc_onnx::write_model(&model))
            .map_err(|e| Error::input(format!("error: cannot write `{save}`: {e}")))?;
    } else {
        std::fs::create_dir_all(save)
            .map_err(|e| Error::input(format!("error: cannot create `{save}`: {e}")))?;
        for (name, t) in &trained {
            let path = Path::new(save).join(format!("{}.npy", file_stem(name)));
            std::fs::write(&path, npy::write(t)).map_err(|e| {
                Error::input(format!("error: cannot write `{}`: {e}", path.display()))
            })?;
        }
        // How the model was fake-quantized, for `tcc quantize --from-qat`.
        if let Some(spec) = &a.quantize {
            let path = Path::new(save).join(super::quantize::qat::OPTIONS_FILE);
            std::fs::write(&path, format!("{}\n", spec.trim())).map_err(|e| {
                Error::input(format!("error: cannot write `{}`: {e}", path.display()))
            })?;
        }
    }
    let _ = writeln!(io.stdout, "saved {} parameters to {save}", trained.len());
    Ok(())
}

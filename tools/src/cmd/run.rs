//! `tcc run`: compile and run a function on inputs; one line per result, .npy files out.

use crate::io::{Io, Load, OnnxArgs, pick_function};
use crate::{Error, npy};
use tcc_ir::random::{Rng, random_tensor};
use tcc_ir::{Function, Tensor};
use tcc_passes::{PassManager, Pipeline};

/// What `tcc run` and `tcc bench` share: the model, its inputs, the passes and the target.
#[derive(clap::Args, Debug)]
pub(crate) struct Model {
    /// The IR file or ONNX model (`-` for stdin).
    pub file: String,
    #[command(flatten)]
    pub onnx: OnnxArgs,
    /// The function to run (needed when the file defines several).
    #[arg(long)]
    pub func: Option<String>,
    /// An input: NAME=PATH.npy, NAME=random[:SEED] or NAME=zeros (repeatable).
    #[arg(long = "input", value_name = "NAME=SPEC")]
    pub inputs: Vec<String>,
    /// What to compile for: `host` (the default) or the host's target triple, optionally
    /// followed by CPU features to turn off, as in `host,-fma,-avx2`.
    #[arg(long, value_name = "SPEC")]
    pub target: Option<String>,
    /// The passes run before compiling (default: the inference pipeline,
    /// `qdq,canonicalize,fold-bn,cse,dce,eqsat`).
    #[arg(long, value_name = "PIPELINE")]
    pub passes: Option<String>,
    /// Run no passes before compiling (the same as --passes='').
    #[arg(short = 'O', value_name = "LEVEL", value_parser = ["0"])]
    pub opt_level: Option<String>,
    /// The layout the CPU backend keeps convolutions' tensors in: `auto` (the backend's
    /// choice: today channel-blocked wherever the target has AVX2 and FMA), `blocked`
    /// (wherever the target has those kernels) or `plain` (as the function has them;
    /// convolutions as im2col and GEMM).
    #[arg(long, value_name = "LAYOUT", default_value = "auto", value_parser = ["auto", "blocked", "plain"])]
    pub layout: String,
    /// The vector width of the CPU backend's library kernels (GEMM, convolution tiles), as
    /// compilers' `-mprefer-vector-width`: `auto` (512 where the CPU has AVX-512F and runs it
    /// at full width, not on AMD Zen 4, else 256), `256` or `512` (where the target has
    /// AVX-512F).
    #[arg(long, value_name = "BITS", default_value = "auto", value_parser = ["auto", "256", "512"])]
    pub vector_width: String,
    /// For functions that swap to host memory: the bandwidth of the simulated link between
    /// the arena and the host pool (`16GB/s`, `500MB/s`, or bytes per second); each copy takes
    /// at least its bytes over it, on the copy thread, beside the compute.
    #[arg(long, value_name = "RATE", value_parser = parse_bandwidth)]
    pub link_bandwidth: Option<f64>,
}

/// A bandwidth for `--link-bandwidth`: bytes per second, optionally with a unit, as
/// [`tcc_passes::offload::parse_rate`] reads it.
pub(crate) fn parse_bandwidth(s: &str) -> Result<f64, String> {
    tcc_passes::offload::parse_rate(s).ok_or_else(|| {
        format!(
            "`{s}` is not a positive bandwidth: write bytes per second or 16GB/s, 500MB/s, 2GiB/s"
        )
    })
}

impl Model {
    /// The CPU backend these options ask for.
    pub fn cpu(&self, profile: bool) -> tcc_codegen::Cpu {
        tcc_codegen::Cpu {
            target: self.target.clone(),
            profile,
            layout: self.layout.parse().unwrap_or_default(),
            vector_width: self.vector_width.parse().unwrap_or_default(),
            link_bandwidth: self.link_bandwidth,
            copies: tcc_codegen::Copying::Auto,
        }
    }
}

// The arguments of `tcc run`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    #[command(flatten)]
    pub model: Model,
    /// Write each result to DIR/<result name>.npy.
    #[arg(long)]
    pub output: Option<String>,
    /// Run with the reference interpreter instead of the compiled code.
    #[arg(long)]
    pub interp: bool,
    /// Where to run: cpu (default), cuda or cuda:N (an NVIDIA GPU through the PTX backend;
    /// needs a build with `--features cuda`), or gpu-emulator (the PTX backend's kernels run
    /// by its emulator on the CPU: slow, for checking).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Print to stderr how the kernels ran (compiled or reference) and the arena size.
    #[arg(long)]
    pub stats: bool,
    /// Time each compiled step and print to stderr where the time went, largest first (with
    /// `--device cuda`, each kernel launch over ten more runs, by CUDA events).
    #[arg(long)]
    pub profile: bool,
}

/// A model loaded, optimized and given its inputs, ready to compile.
pub(crate) struct Prepared {
    /// The file's name as the user gave it.
    pub name: String,
    pub module: tcc_ir::Module,
    /// The index of the chosen function in `module`.
    pub func: usize,
    pub inputs: Vec<Tensor>,
    /// What each pass did.
    pub runs: Vec<tcc_passes::PassRun>,
    /// Time to read (or import) the file, and to run the passes.
    pub load_time: std::time::Duration,
    pub pass_time: std::time::Duration,
}

impl Prepared {
    pub fn function(&self) -> &Function {
        &self.module.functions[self.func]
    }
}

/// Loads the model, runs the pipeline and builds the inputs (`tcc run`'s and `tcc bench`'s
/// first half).
pub(crate) fn prepare(a: &Model, io: &mut Io) -> Result<Prepared, Error> {
    let t0 = std::time::Instant::now();
    let onnx = a.onnx.options()?;
    // `--input NAME=SPEC`, with the .npy files read up front: their shapes bind an ONNX
    // model's dynamic dimensions.
    let mut specs: Vec<(&str, Spec)> = Vec::with_capacity(a.inputs.len());
    for s in &a.inputs {
        let (name, spec) = s
            .split_once('=')
            .ok_or_else(|| Error::usage(format!("error: --input `{s}`: expected NAME=SPEC")))?;
        let name = name.trim_start_matches('%');
        specs.push((name, Spec::parse(name, spec).map_err(Error::input)?));
    }
    let files: Vec<(&str, &Tensor)> = (specs.iter())
        .filter_map(|(n, s)| match s {
            Spec::File(_, t) => Some((*n, t)),
            _ => None,
        })
        .collect();
    let how = Load {
        onnx,
        given: &files,
        ..Load::default()
    };
    let (input, mut m) = io.load_with(&a.file, &how)?;
    let load_time = t0.elapsed();
    let text = match (&a.passes, &a.opt_level) {
        (Some(_), Some(_)) => {
            return Err(Error::usage("error: give --passes or -O0, not both"));
        }
        (Some(p), None) => p.as_str(),
        (None, Some(_)) => "",
        (None, None) => tcc_passes::INFERENCE_PIPELINE,
    };
    let pipeline =
        Pipeline::parse(text).map_err(|e| Error::usage(format!("error: --passes: {e}")))?;
    let t1 = std::time::Instant::now();
    let runs = PassManager::new(pipeline)
        .run(&mut m, &mut std::io::sink())
        .map_err(|e| Error::input(format!("{}: error: {e}", input.name)))?;
    let pass_time = t1.elapsed();
    let f = pick_function(&m, a.func.as_deref(), &input.name)?;
    tcc_ir::interp::check_sizes(f).map_err(|e| Error::input(format!("error: {e}")))?;
    let mut given: Vec<Option<&Spec>> = vec![None; f.params().len()];
    for (name, spec) in &specs {
        let i = f
            .params()
            .iter()
            .position(|&p| f.name(p) == *name)
            .ok_or_else(|| {
                let params: Vec<&str> = f.params().iter().map(|&p| f.name(p)).collect();
                Error::usage(format!(
                    "error: --input `{name}`: `@{}` has no parameter `{name}`; its parameters are {}",
                    f.name,
                    params.join(", ")
                ))
            })?;
        given[i] = Some(spec);
    }
    let stored = &m.weights.values;
    let inputs: Vec<Tensor> = (0..f.params().len())
        .map(|i| match (given[i], stored.get(f.name(f.params()[i]))) {
            (None, Some(t)) => Ok(Tensor::clone(t)),
            (spec, _) => make_input(f, i, spec.unwrap_or(&Spec::Random(None))),
        })
        .collect::<Result<_, _>>()
        .map_err(Error::input)?;
    let func = (m.functions.iter())
        .position(|g| std::ptr::eq(g, f))
        .expect("picked from the module");
    Ok(Prepared {
        name: input.name.clone(),
        module: m,
        func,
        inputs,
        runs,
        load_time,
        pass_time,
    })
}

pub(crate) fn run(a: Args, io: &mut Io) -> Result<(), Error> {
    let p = prepare(&a.model, io)?;
    if a.stats {
        for r in &p.runs {
            let _ = writeln!(io.stderr, "pass {r}");
        }
    }
    let (f, inputs) = (p.function(), &p.inputs);
    let gpu = match a.device.as_str() {
        "cpu" => None,
        "gpu-emulator" => Some(None),
        "cuda" => Some(Some(0)),
        d => match d.strip_prefix("cuda:").map(str::parse::<usize>) {
            Some(Ok(n)) => Some(Some(n)),
            _ => {
                return Err(Error::usage(format!(
                    "error: --device {d}: the devices are cpu, cuda, cuda:N and gpu-emulator"
                )));
            }
        },
    };
    let results = if a.interp {
        tcc_ir::interp::run(f, inputs).map_err(|e| Error::input(format!("error: {e}")))?
    } else if let Some(gpu) = gpu {
        match gpu {
            Some(n) => {
                let (results, profile) = tcc_codegen::ptx::run_on_gpu(f, inputs, n, a.profile)
                    .map_err(|e| Error::input(format!("error: {e}")))?;
                if let Some(p) = profile {
                    let _ = write!(io.stderr, "{p}");
                }
                results
            }
            None if a.profile => {
                return Err(Error::usage(
                    "error: --profile: the GPU emulator has no timings (profile on a GPU with \
                     --device cuda, or the CPU's steps without --device)"
                        .to_string(),
                ));
            }
            None => {
                let ptx = tcc_codegen::ptx::Ptx::default();
                tcc_codegen::compile(&ptx, f)
                    .map_err(|e| e.0)
                    .and_then(|m| tcc_codegen::Backend::run(&ptx, &m, inputs).map_err(|e| e.0))
                    .map_err(|e| Error::input(format!("error: {e}")))?
            }
        }
    } else {
        let cpu = a.model.cpu(a.profile);
        let exe = tcc_codegen::compile(&cpu, f).map_err(|e| Error::usage(format!("error: {e}")))?;
        if a.stats {
            let s = exe.stats();
            let _ = writeln!(
                io.stderr,
                "kernels: {} compiled, {} native, {} on reference kernels, {} views, {} dead; arena {} bytes, outputs {} bytes{}",
                s.compiled,
                s.native,
                s.reference,
                s.views,
                s.dead,
                s.arena_bytes,
                s.output_bytes,
                if s.host_bytes > 0 {
                    format!(", host {} bytes", s.host_bytes)
                } else {
                    String::new()
                }
            );
            let slow = exe.reference_ops();
            if !slow.is_empty() {
                let _ = writeln!(io.stderr, "on reference kernels: {}", slow.join(" "));
            }
        }
        let results = exe
            .run(inputs)
            .map_err(|e| Error::input(format!("error: {e}")))?;
        if let Some(p) = exe.profile() {
            let _ = write!(io.stderr, "{p}");
        }
        results
    };
    let output = a.output.as_deref();
    if let Some(dir) = output {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::input(format!("error: cannot create `{dir}`: {e}")))?;
    }
    let mut used = std::collections::HashSet::new();
    for (i, (&r, t)) in f.results().iter().zip(&results).enumerate() {
        let mut line = String::new();
        let _ = tcc_ir::printer::write_name(&mut line, '%', f.name(r));
        let _ = writeln!(io.stdout, "{line}: {}", summary(t));
        if let Some(dir) = output {
            let mut stem = crate::train::file_stem(f.name(r));
            if !used.insert(stem.clone()) {
                stem = i.to_string();
                used.insert(stem.clone());
            }
            let path = std::path::Path::new(dir).join(format!("{stem}.npy"));
            std::fs::write(&path, npy::write(t)).map_err(|e| {
                Error::input(format!("error: cannot write `{}`: {e}", path.display()))
            })?;
        }
    }
    Ok(())
}

/// What `--input NAME=SPEC` asks for.
enum Spec {
    Zeros,
    /// Random, with this seed (default: one per parameter).
    Random(Option<u64>),
    /// A `.npy` file: its path and contents.
    File(String, Tensor),
}

impl Spec {
    fn parse(name: &str, spec: &str) -> Result<Spec, String> {
        if spec == "zeros" {
            return Ok(Spec::Zeros);
        }
        if let Some(rest) = spec.strip_prefix("random") {
            return match rest.strip_prefix(':') {
                Some(s) => s.parse::<u64>().map(|s| Spec::Random(Some(s))).map_err(|_| {
                    format!(
                        "error: input `{name}`: bad seed `{s}` in `{spec}`; expected random:<integer>"
                    )
                }),
                None if rest.is_empty() => Ok(Spec::Random(None)),
                None => Err(format!(
                    "error: input `{name}`: bad spec `{spec}`; expected PATH.npy, random[:SEED] or zeros"
                )),
            };
        }
        let bytes = std::fs::read(spec)
            .map_err(|e| format!("error: input `{name}`: cannot read `{spec}`: {e}"))?;
        let t = npy::read(&bytes).map_err(|e| format!("error: input `{name}`: `{spec}`: {e}"))?;
        Ok(Spec::File(spec.to_string(), t))
    }
}

/// Builds the input for parameter `i` from its spec.
fn make_input(f: &Function, i: usize, spec: &Spec) -> Result<Tensor, String> {
    let p = f.params()[i];
    let ty = f.ty(p);
    let name = f.name(p);
    match spec {
        Spec::Zeros => Tensor::zeros(ty.clone()).map_err(|e| format!("error: input `{name}`: {e}")),
        Spec::Random(seed) => {
            let seed = seed.unwrap_or(0x7cc0_0000 + i as u64);
            Ok(random_tensor(ty, &mut Rng::new(seed)))
        }
        Spec::File(path, t) if t.ty() != ty => Err(format!(
            "error: input `{name}`: `{path}` holds {}, but the parameter is {ty}",
            t.ty()
        )),
        Spec::File(_, t) => Ok(t.clone()),
    }
}

/// One line describing a result: its type and the range and mean of its elements.
fn summary(t: &Tensor) -> String {
    let vals = t.data().to_f64s();
    if vals.is_empty() {
        return format!("{} (empty)", t.ty());
    }
    let nans = vals.iter().filter(|x| x.is_nan()).count();
    let finite = vals.iter().copied().filter(|x| !x.is_nan());
    let min = finite.clone().fold(f64::INFINITY, f64::min);
    let max = finite.fold(f64::NEG_INFINITY, f64::max);
    let mean = vals.iter().sum::<f64>() / vals.len() as f64;
    let mut s = format!("{}  min {min:.6}  max {max:.6}  mean {mean:.6}", t.ty());
    if nans > 0 {
        s += &format!("  ({nans} NaN)");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::parse_bandwidth;

    #[test]
    fn bandwidths_parse_with_their_units() {
        assert_eq!(parse_bandwidth("16GB/s"), Ok(16e9));
        assert_eq!(parse_bandwidth("500MB/s"), Ok(5e8));
        assert_eq!(parse_bandwidth("2GiB/s"), Ok(2.0 * (1u64 << 30) as f64));
        assert_eq!(parse_bandwidth("1e6"), Ok(1e6));
        for bad in ["0", "-1GB/s", "inf", "fast", "GB/s", "1e400"] {
            assert!(parse_bandwidth(bad).is_err(), "{bad}");
        }
    }
}

//! ONNX models through tcc against onnxruntime, in the same run: torchvision resnet18,
//! mobilenet_v2, efficientnet_b0, shufflenet_v2, convnext_tiny and ViT-B/16 with random
//! weights, the CNNs with batch norm folded by the exporter and kept (`_bn`, which tcc's
//! inference pipeline then folds), and a 2-layer BERT-like encoder, exported by
//! `benches/onnx_peer.py` into `target/onnx-bench/` (once), at batch 1 and some at batch 8
//! (`_b8`). tcc's result must match onnxruntime's before it is timed; the function after the
//! pipeline must match the one without it (within 1e-5 of the largest output), and the same
//! function compiled in the other layout (NCHWc or plain) too; no batch norm may be left. A
//! model that fails to import, compile or match is reported as FAILED with the reason, and
//! the others still run. The compile time (import, pipeline, code generation) is printed.
//! onnxruntime gets as many intra-op threads as tcc's thread pool has. This VM's speed drifts
//! over seconds, so the two are timed in alternating rounds (onnxruntime, then tcc, three
//! times, or `TCC_ROUNDS`) and each keeps its best.
//!
//! ```text
//! cargo bench --bench onnx            # needs torch, torchvision, onnx and onnxruntime:
//! TCC_TARGET=host,-avx512f cargo bench --bench onnx   # tcc as on a CPU without AVX-512
//! TCC_LAYOUT=plain cargo bench --bench onnx  # convolutions as im2col + GEMM on NCHW
//! TCC_LAYOUT=blocked cargo bench --bench onnx  # NCHWc also where AVX-512 is on
//! TCC_MODELS=resnet18,bert2 cargo bench --bench onnx  # only these
//! TCC_ROUNDS=6 cargo bench --bench onnx  # more rounds, for a VM whose speed drifts more
//! benches/run.sh onnx                 # installs them into target/torch-venv first
//! ```

#[path = "common/peer.rs"]
mod peer;
#[path = "common/timing.rs"]
mod timing;

use std::path::Path;
use tcc::ir::{Data, Tensor};

const RUNS: usize = 30;
/// Alternating rounds per model, unless `TCC_ROUNDS` says otherwise.
const ROUNDS: usize = 3;

fn load_npy(path: &Path) -> Tensor {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    tcc_tools::npy::read(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn f32s(t: &Tensor) -> &[f32] {
    match t.data() {
        Data::F32(v) => v,
        _ => panic!("an f32 tensor"),
    }
}

/// The models, as `benches/onnx_peer.py` names them.
const MODELS: [&str; 14] = [
    "resnet18",
    "mobilenet_v2",
    "efficientnet_b0",
    "resnet18_bn",
    "mobilenet_v2_bn",
    "efficientnet_b0_bn",
    "shufflenet_v2_x1_0_bn",
    "convnext_tiny",
    "vit_b_16",
    "bert2",
    "resnet18_b8",
    "mobilenet_v2_b8",
    "vit_b_16_b8",
    "bert2_b8",
];

/// The largest difference between `got` and `want`, over `want`'s largest magnitude; NaN if
/// either holds a NaN or `want` is all zeros (nothing would be compared).
fn rel_err(got: &Tensor, want: &Tensor) -> f32 {
    let scale = f32s(want).iter().fold(0f32, |a, &b| a.max(b.abs()));
    let diff = (f32s(got).iter().zip(f32s(want)))
        .map(|(&g, &w)| (g - w).abs())
        .fold(0f32, |a, d| if d.is_nan() || d > a { d } else { a });
    if scale > 0.0 { diff / scale } else { f32::NAN }
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = root.join("target/onnx-bench");
    let python = std::env::var("TCC_TORCH_PYTHON").unwrap_or_else(|_| {
        root.join("target/torch-venv/bin/python")
            .display()
            .to_string()
    });
    let threads = rayon::current_num_threads();
    let script = root.join("benches/onnx_peer.py").display().to_string();
    let args = [
        dir.display().to_string(),
        threads.to_string(),
        RUNS.to_string(),
    ];
    // The peer times every model once (exporting them the first time), then the model at hand
    // in each later round.
    let peer_round = |only: &[&str]| {
        let args: Vec<String> = (args.iter().cloned())
            .chain(only.iter().map(|s| s.to_string()))
            .collect();
        match peer::run(&python, &script, &args) {
            Ok(p) => p,
            Err(e) => {
                eprintln!(
                    "{e}\n(the peer needs torch, torchvision, onnx and onnxruntime: run benches/run.sh onnx)"
                );
                std::process::exit(1);
            }
        }
    };
    // TCC_MODELS=resnet18,bert2 runs only those.
    let only = std::env::var("TCC_MODELS").ok();
    let models: Vec<&str> = MODELS
        .into_iter()
        .filter(|m| {
            only.as_deref()
                .is_none_or(|o| o.split(',').any(|x| x == *m))
        })
        .collect();
    let rounds = match std::env::var("TCC_ROUNDS") {
        Ok(r) => r
            .parse::<usize>()
            .ok()
            .filter(|&r| r > 0)
            .unwrap_or_else(|| panic!("TCC_ROUNDS must be a positive number, found `{r}`")),
        Err(_) => ROUNDS,
    };
    let first = peer_round(&models);
    let target = std::env::var("TCC_TARGET").ok();
    let features = tcc::codegen::Features::of(target.as_deref()).unwrap_or_else(|e| panic!("{e}"));
    println!(
        "ONNX models at batch 1 (`_b8`: 8), {threads} threads, tcc using {}; best of {rounds} alternating rounds of up to {RUNS} runs",
        features.names().join(" ")
    );
    println!(
        "{:<22} {:>10} {:>10} {:>9} {:>11} {:>12} {:>12} {:>12}",
        "model",
        "tcc ms",
        "ort ms",
        "tcc/ort",
        "compile ms",
        "err vs ort",
        "err vs -O0",
        "vs plain"
    );
    for name in models {
        let runs_for = |once: std::time::Duration| {
            // As the peer: up to RUNS runs, fewer where a run is longer than 1/RUNS of half a
            // second, at least 3.
            (0.5 / once.as_secs_f64()).clamp(3.0, RUNS as f64) as usize
        };
        let model = match Model::new(&dir, name) {
            Ok(m) => m,
            Err(e) => {
                println!("{name:<22} FAILED: {e}");
                continue;
            }
        };
        let mut t = std::time::Duration::MAX;
        let mut ort = f64::INFINITY;
        for round in 0..rounds {
            ort = ort.min(if round == 0 {
                first[name]
            } else {
                peer_round(&[name])[name]
            });
            let run = || {
                model.exe.run(std::slice::from_ref(&model.x)).unwrap();
            };
            let once = {
                let t0 = std::time::Instant::now();
                run();
                t0.elapsed()
            };
            t = t.min(timing::best(run, 2, runs_for(once)));
        }
        println!(
            "{name:<22} {:>10.2} {:>10.2} {:>9.2} {:>11.0} {:>12.1e} {:>12.1e} {:>12.1e}",
            t.as_secs_f64() * 1e3,
            ort * 1e3,
            t.as_secs_f64() / ort,
            model.compile.as_secs_f64() * 1e3,
            model.err,
            model.fold_err,
            model.layout_err
        );
        if let Some(p) = model.exe.profile() {
            eprint!("{p}");
        }
    }
}

/// A model compiled with the inference pipeline and checked: against onnxruntime's output
/// (`err`, relative to its largest magnitude, below 1e-4), against itself without the
/// pipeline (`fold_err`, below 1e-5) and compiled with every tensor in its own layout
/// (`layout_err`: the convolutions as im2col and GEMM rather than on channel blocks, below
/// 1e-5), with no batch norm left. `compile` is the time from reading the file to a compiled
/// executable (import, pipeline, code generation), as `tcc bench` reports it.
struct Model {
    exe: tcc::codegen::Executable,
    x: Tensor,
    compile: std::time::Duration,
    err: f32,
    fold_err: f32,
    layout_err: f32,
}

impl Model {
    fn new(dir: &Path, name: &str) -> Result<Model, String> {
        let t0 = std::time::Instant::now();
        let mut m = tcc::onnx::import_file(&dir.join(format!("{name}.onnx")), &Default::default())
            .map_err(|e| e.to_string())?;
        let unoptimized = m.clone();
        // The inference pipeline, as `tcc run` and `Program::from_onnx` run it: batch norm folds.
        let pipeline = tcc::passes::Pipeline::parse(tcc::passes::INFERENCE_PIPELINE).unwrap();
        tcc::passes::PassManager::new(pipeline)
            .run(&mut m, &mut std::io::sink())
            .map_err(|e| e.to_string())?;
        let f = &m.functions[0];
        let left = (f.schedule().iter())
            .filter(|&&op| matches!(f.op(op).kind, tcc::ir::OpKind::BatchNorm { .. }))
            .count();
        if left > 0 {
            return Err(format!("{left} batch norms left after fold-bn"));
        }
        // TCC_PROFILE=1 prints where tcc's time went, step by step, after the timing.
        // TCC_TARGET=host,-avx512f compiles as for a CPU without AVX-512 (its GEMM included).
        // TCC_LAYOUT=plain keeps the model's NCHW tensors (convolutions as im2col and GEMM),
        // TCC_LAYOUT=blocked blocks them wherever the target has the kernels.
        // TCC_VECTOR_WIDTH=256 or 512 sets the library kernels' width (`--vector-width`).
        let layout = match std::env::var("TCC_LAYOUT") {
            Ok(l) => l.parse().map_err(|e: String| e)?,
            Err(_) => tcc::codegen::Layout::Auto,
        };
        let vector_width = match std::env::var("TCC_VECTOR_WIDTH") {
            Ok(w) => w.parse().map_err(|e: String| e)?,
            Err(_) => tcc::codegen::VectorWidth::Auto,
        };
        let cpu = tcc::codegen::Cpu {
            profile: std::env::var_os("TCC_PROFILE").is_some(),
            target: std::env::var("TCC_TARGET").ok(),
            layout,
            vector_width,
            ..Default::default()
        };
        let exe = tcc::codegen::compile(&cpu, &m.functions[0]).map_err(|e| e.to_string())?;
        let compile = t0.elapsed();
        let x = load_npy(&dir.join(format!("{name}_input.npy")));
        let want = load_npy(&dir.join(format!("{name}_output.npy")));
        let got = exe
            .run(std::slice::from_ref(&x))
            .map_err(|e| e.to_string())?;
        let err = rel_err(&got[0], &want);
        if err.is_nan() || err >= 1e-4 {
            return Err(format!(
                "tcc and onnxruntime differ ({err:e} of the largest output)"
            ));
        }
        // Folding must not change results: the same model without the pipeline.
        let unfolded = tcc::codegen::compile(&cpu, &unoptimized.functions[0])
            .map_err(|e| e.to_string())?
            .run(std::slice::from_ref(&x))
            .map_err(|e| e.to_string())?;
        let fold_err = rel_err(&got[0], &unfolded[0]);
        if fold_err.is_nan() || fold_err >= 1e-5 {
            return Err(format!(
                "the pipeline changed the output by {fold_err:e} of the largest"
            ));
        }
        // Nor must the layout: the same function with its convolutions on its own tensors.
        let plain = tcc::codegen::Cpu {
            layout: match layout {
                tcc::codegen::Layout::Plain => tcc::codegen::Layout::Blocked,
                _ => tcc::codegen::Layout::Plain,
            },
            profile: false,
            ..cpu
        };
        let other = tcc::codegen::compile(&plain, &m.functions[0])
            .map_err(|e| e.to_string())?
            .run(std::slice::from_ref(&x))
            .map_err(|e| e.to_string())?;
        let layout_err = rel_err(&got[0], &other[0]);
        if layout_err.is_nan() || layout_err >= 1e-5 {
            return Err(format!(
                "the layouts differ by {layout_err:e} of the largest output"
            ));
        }
        Ok(Model {
            exe,
            x,
            compile,
            err,
            fold_err,
            layout_err,
        })
    }
}

//! The PTX backend on an NVIDIA GPU against its peers, in the same run (`cargo bench --bench gpu
//! --features cuda`; needs a GPU, and says so without one): our tiled SGEMM at 4096³ against
//! cuBLAS, and resnet18 at batch 1 and 32 (exported by PyTorch, optimized by the inference
//! passes) against PyTorch on CUDA where the PyTorch beside the benchmark has CUDA
//! (`benches/gpu_peer.py`, from the venv `target/torch-venv` or `TCC_TORCH_PYTHON`). Device
//! times only: CUDA events around repeated launches, inputs uploaded once. Figures go in
//! docs/perf.md with the GPU's name.

#[path = "common/peer.rs"]
mod peer;

use tcc::codegen::ptx::cuda::{Gpu, cublas_sgemm_seconds};
use tcc::codegen::ptx::{GemmTiles, Ptx};
use tcc::ir::random::{Rng, random_tensor};
use tcc::ir::{Function, Tensor, parse_function};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn inputs(f: &Function) -> Vec<Tensor> {
    let mut rng = Rng::new(1);
    (f.params().iter())
        .map(|&p| random_tensor(f.ty(p), &mut rng))
        .collect()
}

/// Seconds our kernels take for one run of `f` on `gpu`.
fn ours(gpu: &Gpu, f: &Function, runs: usize) -> Result<f64, String> {
    let backend = gpu.backend().map_err(|e| e.0)?;
    let m = tcc::codegen::compile(&backend, f).map_err(|e| e.0)?;
    let loaded = gpu.load(m).map_err(|e| e.0)?;
    loaded.time(&inputs(f), runs).map_err(|e| e.0)
}

fn main() {
    let gpu = match Gpu::new(0) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("{e}: this benchmark needs an NVIDIA GPU");
            std::process::exit(1);
        }
    };
    println!("{} (sm_{})", gpu.name(), gpu.sm().unwrap_or(0));
    let n = 4096usize;
    let src = format!(
        "func @sgemm(%a: f32[{n},{n}], %b: f32[{n},{n}]) -> (f32[{n},{n}]) {{\n  %c = matmul %a, %b : f32[{n},{n}]\n  return %c\n}}"
    );
    let f = parse_function(&src).unwrap();
    let flops = 2.0 * (n as f64).powi(3);
    let t = ours(&gpu, &f, 10).unwrap();
    let c = cublas_sgemm_seconds(&gpu, n, n, n, 10).unwrap();
    println!(
        "sgemm {n}: tcc {:.2} ms ({:.0} GFLOP/s), cuBLAS {:.2} ms ({:.0} GFLOP/s): {:.0}% of cuBLAS",
        t * 1e3,
        flops / t / 1e9,
        c * 1e3,
        flops / c / 1e9,
        100.0 * c / t
    );
    let dir = format!("{ROOT}/target/gpu-models");
    let python = std::env::var("TCC_TORCH_PYTHON")
        .unwrap_or_else(|_| format!("{ROOT}/target/torch-venv/bin/python"));
    let torch = peer::run(
        &python,
        &format!("{ROOT}/benches/gpu_peer.py"),
        &[dir.clone(), "50".into()],
    );
    let torch = match torch {
        Ok(t) => t,
        Err(e) => {
            println!("resnet18: no models to time (the PyTorch peer did not run: {e})");
            return;
        }
    };
    for batch in [1, 32] {
        let key = format!("resnet18_b{batch}");
        let mut m = tcc::onnx::import_file(
            std::path::Path::new(&format!("{dir}/{key}.onnx")),
            &Default::default(),
        )
        .unwrap();
        let pipeline = tcc::passes::Pipeline::parse(tcc::passes::INFERENCE_PIPELINE).unwrap();
        tcc::passes::PassManager::new(pipeline)
            .run(&mut m, &mut std::io::sink())
            .unwrap();
        let line = match ours(&gpu, &m.functions[0], 20) {
            Ok(t) => match (torch.get(&key), torch.get(&format!("{key}_tf32"))) {
                (Some(&p), Some(&q)) if p > 0.0 => format!(
                    "tcc {:.3} ms, PyTorch CUDA {:.3} ms in f32 ({:.3} ms with TF32 convolutions): \
                     {:.2}x PyTorch's f32 time ({:.2}x its TF32 time)",
                    t * 1e3,
                    p * 1e3,
                    q * 1e3,
                    t / p,
                    t / q
                ),
                _ => format!("tcc {:.3} ms (PyTorch here has no CUDA)", t * 1e3),
            },
            Err(e) => format!("does not compile for the GPU: {e}"),
        };
        println!("{key}: {line}");
        if std::env::var_os("TCC_GPU_PROFILE").is_some() {
            profile(&gpu, &m.functions[0]);
        }
    }
}

/// Prints, for the tiling the backend chooses and each forced, where the device time goes
/// (the 25 launches taking most; `TCC_GPU_PROFILE=1`).
fn profile(gpu: &Gpu, f: &Function) {
    for tiles in [GemmTiles::Auto, GemmTiles::Small, GemmTiles::Large] {
        let run = || -> Result<tcc::codegen::Profile, String> {
            let backend = Ptx {
                tiles,
                ..gpu.backend().map_err(|e| e.0)?
            };
            let m = tcc::codegen::compile(&backend, f).map_err(|e| e.0)?;
            let loaded = gpu.load(m).map_err(|e| e.0)?;
            loaded.profile(&inputs(f), 20).map_err(|e| e.0)
        };
        match run() {
            Ok(p) => print!("  GEMM tiles {tiles:?}: {p}"),
            Err(e) => println!("  GEMM tiles {tiles:?}: no profile: {e}"),
        }
    }
}

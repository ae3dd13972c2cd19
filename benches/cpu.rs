//! CPU backend benchmarks against numpy, in the same run.
//!
//! `benches/run.sh` (or `cargo bench --bench cpu` with numpy importable by `python3`, or by the
//! interpreter named in `TCC_PYTHON`) times each case with tcc's compiled executable, then runs
//! `benches/numpy_peer.py` for the same case, then times tcc again (keeping the better time), and
//! prints times, GFLOP/s and the ratio.
//! Timings are the best of several runs after a warm-up. Figures go in docs/perf.md.
//! `TCC_TARGET=host,-avx512f` compiles tcc's side as for a CPU without AVX-512 (the AVX2+FMA
//! GEMM), to stand in for one on a machine that has it.

#[path = "common/peer.rs"]
mod peer;
#[path = "common/timing.rs"]
mod timing;

use std::collections::HashMap;
use tcc::codegen::Executable;
use tcc::codegen::cpu::max_ulp_error;
use tcc::ir::UnaryOp;
use tcc::ir::random::{Rng, random_tensor};
use tcc::ir::{Tensor, parse_function};
use timing::{best, best_within};

struct Case {
    name: &'static str,
    ir: String,
    flops: f64,
    runs: usize,
}

fn matmul(m: u64, k: u64, n: u64) -> String {
    format!(
        "func @mm(%a: f32[{m},{k}], %b: f32[{k},{n}]) -> (f32[{m},{n}]) {{\n  %c = matmul %a, %b : f32[{m},{n}]\n  return %c\n}}"
    )
}

fn cases() -> Vec<Case> {
    let mut v: Vec<Case> = [256u64, 512, 1024, 2048]
        .into_iter()
        .map(|n| Case {
            name: Box::leak(format!("sgemm {n}").into_boxed_str()),
            ir: matmul(n, n, n),
            flops: 2.0 * (n * n * n) as f64,
            runs: if n == 2048 { 3 } else { 10 },
        })
        .collect();
    v.push(Case {
        name: "sgemm 64x4096x4096",
        ir: matmul(64, 4096, 4096),
        flops: 2.0 * 64.0 * 4096.0 * 4096.0,
        runs: 10,
    });
    let n = 1u64 << 24;
    v.push(Case {
        name: "chain tanh(x*a+b)*x 16M",
        ir: format!(
            "func @chain(%x: f32[{n}], %b: f32[{n}]) -> (f32[{n}]) {{
  %a = const {{value=0.75}} : f32[]
  %m = mul %x, %a : f32[{n}]
  %s = add %m, %b : f32[{n}]
  %t = tanh %s : f32[{n}]
  %y = mul %t, %x : f32[{n}]
  return %y
}}"
        ),
        flops: 0.0,
        runs: 5,
    });
    v.push(Case {
        name: "softmax 4096x4096",
        ir: "func @sm(%x: f32[4096,4096]) -> (f32[4096,4096]) {\n  %p = softmax %x : f32[4096,4096]\n  return %p\n}".into(),
        flops: 0.0,
        runs: 3,
    });
    v.push(Case {
        name: "conv2d 3x3 64->64 56x56",
        ir: "func @conv(%x: f32[1,64,56,56], %w: f32[64,64,3,3]) -> (f32[1,64,56,56]) {
  %y = conv2d %x, %w {pads=[1,1,1,1]} : f32[1,64,56,56]
  return %y
}"
        .into(),
        flops: 2.0 * 64.0 * 64.0 * 9.0 * 56.0 * 56.0,
        runs: 2,
    });
    v.push(Case {
        name: "mlp 784-512-10 batch 64",
        ir: "func @mlp(%x: f32[64,784], %w1: f32[784,512], %b1: f32[512], %w2: f32[512,10], %b2: f32[10]) -> (f32[64,10]) {
  %h = matmul %x, %w1 : f32[64,512]
  %z = add %h, %b1 : f32[64,512]
  %r = relu %z : f32[64,512]
  %o = matmul %r, %w2 : f32[64,10]
  %l = add %o, %b2 : f32[64,10]
  %p = softmax %l : f32[64,10]
  return %p
}"
        .into(),
        flops: 2.0 * 64.0 * (784.0 * 512.0 + 512.0 * 10.0),
        runs: 20,
    });
    v
}

/// Runs the numpy script for the named cases (all when empty).
fn numpy(cases: &[&str]) -> Result<HashMap<String, f64>, String> {
    let python = std::env::var("TCC_PYTHON").unwrap_or_else(|_| {
        let venv = concat!(env!("CARGO_MANIFEST_DIR"), "/target/bench-venv/bin/python");
        if std::path::Path::new(venv).exists() {
            venv.into()
        } else {
            "python3".into()
        }
    });
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/numpy_peer.py");
    let args: Vec<String> = cases.iter().map(|c| c.to_string()).collect();
    peer::run(&python, script, &args)
}

/// The exact GELU in f64.
fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))
}

fn main() {
    let sigmoid = |x: f64| 1.0 / (1.0 + (-x).exp());
    for (op, lo, hi, reference) in [
        (UnaryOp::Exp, -87.0f32, 88.0f32, f64::exp as fn(f64) -> f64),
        (UnaryOp::Tanh, -9.0, 9.0, f64::tanh),
        (UnaryOp::Sigmoid, -80.0, 30.0, sigmoid),
        (UnaryOp::Log, 1e-30, 1e30, f64::ln),
        (UnaryOp::Log, 0.5, 2.0, f64::ln),
        (UnaryOp::Erf, -5.0, 5.0, libm::erf),
        (UnaryOp::Gelu, -3.0, 10.0, gelu),
        (UnaryOp::Gelu, -1.0, 10.0, gelu),
    ] {
        println!(
            "accuracy: compiled {} on [{lo}, {hi}], 2^22 points: max error {:.2} ulp",
            op.mnemonic(),
            max_ulp_error(op, lo, hi, 1 << 22, reference).expect("compiles")
        );
    }
    // Memory bandwidth for reference: copy 64 MiB.
    let src = vec![1.0f32; 1 << 24];
    let mut dst = vec![0.0f32; 1 << 24];
    let t = best(
        || {
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&mut dst);
        },
        1,
        10,
    );
    let copy_gbs = 2.0 * 4.0 * (1u64 << 24) as f64 / t.as_secs_f64() / 1e9;
    println!("memory copy: {copy_gbs:.1} GB/s (read + write of 64 MiB)");

    // numpy runs per case, between two timings of tcc, so that both are measured at the same
    // moment: this machine's speed drifts over minutes.
    if let Err(e) = numpy(&["sgemm 256"]) {
        println!("numpy peer unavailable ({e}); run benches/run.sh");
    }
    let target = std::env::var("TCC_TARGET").ok();
    let features = tcc::codegen::Features::of(target.as_deref()).unwrap_or_else(|e| panic!("{e}"));
    println!("tcc using {}", features.names().join(" "));
    println!(
        "{:<26} {:>10} {:>10} {:>9} {:>12} {:>9}  kernels",
        "case", "tcc ms", "numpy ms", "GFLOP/s", "numpy GF/s", "speedup"
    );
    for c in cases() {
        let f = parse_function(&c.ir).expect("benchmark IR parses");
        let exe = Executable::compile_for(&f, target.as_deref()).expect("compiles");
        let mut rng = Rng::new(1);
        let inputs: Vec<Tensor> = f
            .params()
            .iter()
            .map(|&p| random_tensor(f.ty(p), &mut rng))
            .collect();
        let t1 = best_within(|| drop(exe.run(&inputs).expect("runs")), c.runs);
        let np = numpy(&[c.name]).ok().and_then(|p| p.get(c.name).copied());
        let t2 = best_within(|| drop(exe.run(&inputs).expect("runs")), c.runs);
        let t = t1.min(t2).as_secs_f64();
        let gf = |s: f64| {
            if c.flops > 0.0 {
                format!("{:.1}", c.flops / s / 1e9)
            } else {
                "-".into()
            }
        };
        let s = exe.stats();
        println!(
            "{:<26} {:>10.3} {:>10} {:>9} {:>12} {:>9}  {} compiled, {} native, {} reference",
            c.name,
            t * 1e3,
            np.map_or("-".into(), |x| format!("{:.3}", x * 1e3)),
            gf(t),
            np.map_or("-".into(), gf),
            np.map_or("-".into(), |x| format!("{:.2}x", x / t)),
            s.compiled,
            s.native,
            s.reference
        );
        if c.name.starts_with("chain") {
            let traffic = 3.0 * 4.0 * (1u64 << 24) as f64;
            println!(
                "{:<26} {:.1} GB/s = {:.0}% of memory copy",
                "",
                traffic / t / 1e9,
                100.0 * traffic / t / 1e9 / copy_gbs
            );
        }
    }
}

//! `remat`: the rematerialized function gives bit-identical results and gradients (interpreter
//! and compiled code), verifies, and holds fewer activation bytes across the backward pass.

use tcc::codegen::Executable;
use tcc::ir::random::{Rng, random_tensor};
use tcc::ir::{Function, Tensor, parse_function};
use tcc::passes::analysis::memory::analyze;
use tcc::passes::{PassManager, Pipeline};

/// A chain of `n` dense + tanh layers, every fourth activation in a `checkpoint` scope.
fn chain(n: usize) -> String {
    let mut s = String::from("func @chain(%x: f32[16,32]");
    for i in 0..n {
        s += &format!(", %w{i}: f32[32,32]");
    }
    s += ") -> (f32[]) {\n";
    let mut prev = "%x".to_string();
    for i in 0..n {
        let act = if i % 4 == 3 {
            format!("%l{i}/checkpoint")
        } else {
            format!("%l{i}/act")
        };
        s += &format!("  %l{i}/mm = matmul {prev}, %w{i} : f32[16,32]\n");
        s += &format!("  {act} = tanh %l{i}/mm : f32[16,32]\n");
        prev = act;
    }
    s += &format!("  %loss = reduce_mean {prev} {{axes=[0,1]}} : f32[]\n  return %loss\n}}\n");
    s
}

fn run_pipeline(f: &Function, pipeline: &str) -> Function {
    let mut m = tcc::ir::Module::new();
    m.functions.push(f.clone());
    let mut pm = PassManager::new(Pipeline::parse(pipeline).unwrap());
    pm.verify_each = true;
    pm.run(&mut m, &mut std::io::sink()).unwrap();
    m.functions.remove(0)
}

fn bits(ts: &[Tensor]) -> Vec<Vec<u32>> {
    ts.iter()
        .map(|t| t.as_f32().unwrap().iter().map(|x| x.to_bits()).collect())
        .collect()
}

fn check(src: &str, strategy: &str, expect_smaller: bool) {
    let f = parse_function(src).unwrap();
    let joint = run_pipeline(&f, "grad{wrt=params}");
    let r = run_pipeline(&joint, strategy);
    tcc::ir::verify_function(&r).unwrap();
    let mut rng = Rng::new(3);
    let inputs: Vec<Tensor> = f
        .params()
        .iter()
        .map(|&p| random_tensor(f.ty(p), &mut rng))
        .collect();
    let a = tcc::ir::interp::run(&joint, &inputs).unwrap();
    let b = tcc::ir::interp::run(&r, &inputs).unwrap();
    assert_eq!(bits(&a), bits(&b), "{strategy}: interpreter results differ");
    let ja = Executable::compile(&joint).unwrap().run(&inputs).unwrap();
    let jb = Executable::compile(&r).unwrap().run(&inputs).unwrap();
    assert_eq!(bits(&ja), bits(&jb), "{strategy}: compiled results differ");
    let (before, after) = (analyze(&joint).temps_peak.0, analyze(&r).temps_peak.0);
    if expect_smaller {
        assert!(after < before, "{strategy}: peak {before} -> {after}");
    } else {
        assert!(after <= before, "{strategy}: peak {before} -> {after}");
    }
}

#[test]
fn every_strategy_keeps_results_bit_identical() {
    let src = chain(16);
    check(&src, "remat{strategy=collection}", true);
    check(&src, "remat{names=[l5/act,l10/act]}", true);
    check(&src, "remat{strategy=memory}", true);
    check(&src, "remat{strategy=memory,min-bytes=1024}", true);
    // On a dense+tanh chain keeping the matmul outputs saves nothing (tanh's gradient needs its
    // output, recomputed from them), but it must still be exact.
    check(&src, "remat{strategy=speed}", false);
    // Clean-up after remat does not undo it: cse keeps the pinned copies apart.
    check(&src, "remat{strategy=collection},cse,dce", true);
}

#[test]
fn the_peak_falls_to_about_the_checkpoints() {
    let f = parse_function(&chain(16)).unwrap();
    let joint = run_pipeline(&f, "grad{wrt=params}");
    let r = run_pipeline(&f, "grad{wrt=params},remat{strategy=collection}");
    let (before, after) = (analyze(&joint).temps_peak.0, analyze(&r).temps_peak.0);
    // Each activation is 2 KiB. Without remat the 16 tanh outputs are held into the backward
    // pass (tanh's gradient reads its output, and each weight gradient the layer's input; the
    // matmul outputs die in the forward pass): 19 tensors at the peak with the backward
    // temporaries. With 4 checkpoints, the 4 of them, one recomputed segment (at most 3 more
    // activations) and the temporaries: 9 at the time of writing.
    assert!(before >= 16 * 2048, "{before}");
    assert!(after <= 10 * 2048, "{before} -> {after}");
}

#[test]
fn errors_say_what_to_do() {
    let f = parse_function(&chain(2)).unwrap();
    let mut m = tcc::ir::Module::new();
    m.functions.push(f);
    let e = PassManager::new(Pipeline::parse("remat{strategy=speed}").unwrap())
        .run(&mut m, &mut std::io::sink())
        .unwrap_err()
        .to_string();
    assert!(e.contains("run `grad` first"), "{e}");
    let e = Pipeline::parse("remat{strategy=fastest}")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("valid strategies are collection, memory, speed"),
        "{e}"
    );
    let e = Pipeline::parse("remat").unwrap_err().to_string();
    assert!(
        e.contains("strategy=collection|memory|speed or names=[...]"),
        "{e}"
    );
    let e = Pipeline::parse("remat{strategy=budget}")
        .unwrap_err()
        .to_string();
    assert!(e.contains("not implemented yet"), "{e}");
}

#[test]
fn bottlenecks_are_found_in_one_sweep() {
    // A residual block: inside it the skip path goes around every value, so only the block's
    // input and output separate the graph.
    let src = "func @f(%x: f32[4,8], %w: f32[8,8]) -> (f32[]) {
  %in = tanh %x : f32[4,8]
  %a = matmul %in, %w : f32[4,8]
  %b = tanh %a : f32[4,8]
  %out = add %in, %b : f32[4,8]
  %loss = reduce_sum %out {axes=[0,1]} : f32[]
  return %loss
}";
    let f = parse_function(src).unwrap();
    let n = f.schedule().len();
    let names: Vec<&str> = tcc::passes::remat::bottlenecks(&f, n)
        .into_iter()
        .map(|v| f.name(v))
        .collect();
    assert_eq!(names, ["in", "out"]);
    // U-Net-like: the first activation is read again just before the loss, so nothing in
    // between separates the inputs from the loss; only the two ends do.
    let unet = "func @u(%x: f32[8], %w: f32[8]) -> (f32[]) {
  %e = mul %x, %w : f32[8]
  %a = tanh %e : f32[8]
  %b = exp %a : f32[8]
  %c = tanh %b : f32[8]
  %d = add %c, %e : f32[8]
  %loss = reduce_sum %d {axes=[0]} : f32[]
  return %loss
}";
    let f = parse_function(unet).unwrap();
    let n = f.schedule().len();
    let names: Vec<&str> = tcc::passes::remat::bottlenecks(&f, n)
        .into_iter()
        .map(|v| f.name(v))
        .collect();
    assert_eq!(names, ["e", "d"]);
    // With every candidate under the size threshold there is none to keep: the error says so
    // and what to do instead.
    let mut m = tcc::ir::Module::new();
    m.functions.push(f);
    let p = Pipeline::parse("grad{wrt=[w]},remat{strategy=memory,min-bytes=33}").unwrap();
    let e = PassManager::new(p)
        .run(&mut m, &mut std::io::sink())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("no bottleneck tensor") && e.contains("names=[...]"),
        "{e}"
    );
}

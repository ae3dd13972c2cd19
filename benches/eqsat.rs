//! Equality saturation (`eqsat`) on whole graphs: what it changes, what the time model predicts
//! and what the JIT measures, before and after, in the same run.
//!
//! `cargo bench --bench eqsat` (a few minutes). For each graph: ops before and after, the
//! estimated time before and after (`analysis::cost`) and the predicted speedup, the measured
//! time of the compiled function before and after (best of alternating rounds, as this VM's
//! speed drifts) and the measured speedup, the pass's own time, why rewriting stopped and which
//! extraction won (when the input is kept the program is the same and is timed once). Before
//! and after must agree (within 1e-3 of each result's largest element)
//! or the row says MISMATCH. The peer is the input itself: the same compiler without the pass.
//!
//! The graphs (weights are constant splats: the values do not change the time, and constants
//! are what merged weights fold from):
//! - bert: a BERT-base encoder layer, 128 tokens, width 768, 12 heads, FFN 3072, two layer
//!   norms;
//! - inception: an Inception-v3 module (35x35x288: 1x1; 1x1-5x5; 1x1-3x3-3x3; pool-1x1);
//! - resnext: a ResNeXt block (56x56x256, 1x1 128, 3x3 in 32 groups, 1x1 256, residual);
//! - nasrnn: a NASNet-style RNN cell, batch 1, width 512: eight gates, each `x W + h U`, joined
//!   by products, sums and activations;
//! - the nine ONNX `light` zoo models after the
//!   inference pipeline's passes before `eqsat` (if the onnx wheel's test data is in
//!   target/onnx-venv);
//! - the training examples after `grad{wrt=params},canonicalize,cse,dce`.
//!
//! The rule sets: `algebra,layout,graph` for inference graphs, `algebra,layout` for autodiff
//! output. `TCC_ROUNDS` sets the alternating rounds (default 3).

#[path = "common/timing.rs"]
mod timing;

use std::fmt::Write;
use std::path::Path;
use std::time::Instant;
use tcc::ir::random::{Rng, random_tensor};
use tcc::ir::{Function, Module, Tensor, parse_module};
use tcc::passes::analysis::cost::{Machine, estimate};
use tcc::passes::eqsat::{EqsatOptions, eqsat};
use tcc::passes::{PassManager, Pipeline};

/// A weight value no other weight has, so that `cse` cannot merge two layers.
fn weight() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(1);
    format!(
        "{:.6}",
        0.01 + 1e-5 * NEXT.fetch_add(1, Ordering::Relaxed) as f64
    )
}

fn layer_norm(s: &mut String, p: &str, x: &str, shape: &str) {
    writeln!(
        s,
        "  %{p}/mean = reduce_mean {x} {{axes=[1], keepdims=true}} : f32[128,1]"
    )
    .unwrap();
    writeln!(s, "  %{p}/c = sub {x}, %{p}/mean : {shape}").unwrap();
    writeln!(s, "  %{p}/sq = mul %{p}/c, %{p}/c : {shape}").unwrap();
    writeln!(
        s,
        "  %{p}/var = reduce_mean %{p}/sq {{axes=[1], keepdims=true}} : f32[128,1]"
    )
    .unwrap();
    writeln!(s, "  %{p}/eps = const {{value=1e-5}} : f32[]").unwrap();
    writeln!(s, "  %{p}/ve = add %{p}/var, %{p}/eps : f32[128,1]").unwrap();
    writeln!(s, "  %{p}/rs = rsqrt %{p}/ve : f32[128,1]").unwrap();
    writeln!(s, "  %{p}/n = mul %{p}/c, %{p}/rs : {shape}").unwrap();
    writeln!(s, "  %{p}/gamma = const {{value=1.0}} : f32[768]").unwrap();
    writeln!(s, "  %{p}/beta = const {{value=0.0}} : f32[768]").unwrap();
    writeln!(s, "  %{p}/g = mul %{p}/n, %{p}/gamma : {shape}").unwrap();
    writeln!(s, "  %{p} = add %{p}/g, %{p}/beta : {shape}").unwrap();
}

fn bert() -> String {
    let t = "f32[128,768]";
    let mut s = format!("func @bert(%x: {t}) -> ({t}) {{\n");
    for (w, n) in [("q", 768), ("k", 768), ("v", 768), ("o", 768)] {
        writeln!(s, "  %w{w} = const {{value={}}} : f32[768,{n}]", weight()).unwrap();
        writeln!(s, "  %b{w} = const {{value={}}} : f32[{n}]", weight()).unwrap();
    }
    for w in ["q", "k", "v"] {
        writeln!(s, "  %{w}/mm = matmul %x, %w{w} : {t}").unwrap();
        writeln!(s, "  %{w} = add %{w}/mm, %b{w} : {t}").unwrap();
        writeln!(
            s,
            "  %{w}/heads = reshape %{w} {{shape=[128,12,64]}} : f32[128,12,64]"
        )
        .unwrap();
    }
    s += "  %qt = transpose %q/heads {perm=[1,0,2]} : f32[12,128,64]\n";
    s += "  %kt = transpose %k/heads {perm=[1,2,0]} : f32[12,64,128]\n";
    s += "  %vt = transpose %v/heads {perm=[1,0,2]} : f32[12,128,64]\n";
    s += "  %scores = matmul %qt, %kt : f32[12,128,128]\n";
    s += "  %scale = const {value=0.125} : f32[]\n";
    s += "  %scaled = mul %scores, %scale : f32[12,128,128]\n";
    s += "  %probs = softmax %scaled : f32[12,128,128]\n";
    s += "  %ctx = matmul %probs, %vt : f32[12,128,64]\n";
    s += "  %ctx/t = transpose %ctx {perm=[1,0,2]} : f32[128,12,64]\n";
    s += "  %ctx/r = reshape %ctx/t {shape=[128,768]} : f32[128,768]\n";
    writeln!(s, "  %o/mm = matmul %ctx/r, %wo : {t}").unwrap();
    writeln!(s, "  %o = add %o/mm, %bo : {t}").unwrap();
    writeln!(s, "  %res1 = add %o, %x : {t}").unwrap();
    layer_norm(&mut s, "ln1", "%res1", t);
    s += "  %w1 = const {value=0.01} : f32[768,3072]\n  %b1 = const {value=0.01} : f32[3072]\n";
    s += "  %w2 = const {value=0.01} : f32[3072,768]\n  %b2 = const {value=0.01} : f32[768]\n";
    s += "  %ff1/mm = matmul %ln1, %w1 : f32[128,3072]\n";
    s += "  %ff1 = add %ff1/mm, %b1 : f32[128,3072]\n";
    s += "  %ff1/act = gelu %ff1 : f32[128,3072]\n";
    writeln!(s, "  %ff2/mm = matmul %ff1/act, %w2 : {t}").unwrap();
    writeln!(s, "  %ff2 = add %ff2/mm, %b2 : {t}").unwrap();
    writeln!(s, "  %res2 = add %ff2, %ln1 : {t}").unwrap();
    layer_norm(&mut s, "ln2", "%res2", t);
    s + "  return %ln2\n}\n"
}

/// `conv + bias + relu` named `p`, reading `x` (`c` channels) into `o` channels.
#[allow(clippy::too_many_arguments)]
fn conv(s: &mut String, p: &str, x: &str, c: u64, o: u64, k: u64, hw: u64, groups: u64) {
    let pad = k / 2;
    writeln!(
        s,
        "  %{p}/w = const {{value={}}} : f32[{o},{},{k},{k}]",
        weight(),
        c / groups
    )
    .unwrap();
    writeln!(
        s,
        "  %{p}/b = const {{value={}}} : f32[1,{o},1,1]",
        weight()
    )
    .unwrap();
    writeln!(
        s,
        "  %{p}/conv = conv2d {x}, %{p}/w {{pads=[{pad},{pad},{pad},{pad}], groups={groups}}} : f32[1,{o},{hw},{hw}]"
    )
    .unwrap();
    writeln!(
        s,
        "  %{p}/add = add %{p}/conv, %{p}/b : f32[1,{o},{hw},{hw}]"
    )
    .unwrap();
    writeln!(s, "  %{p} = relu %{p}/add : f32[1,{o},{hw},{hw}]").unwrap();
}

fn inception() -> String {
    let mut s = String::from("func @inception(%x: f32[1,288,35,35]) -> (f32[1,288,35,35]) {\n");
    conv(&mut s, "b1", "%x", 288, 64, 1, 35, 1);
    conv(&mut s, "b2a", "%x", 288, 48, 1, 35, 1);
    conv(&mut s, "b2", "%b2a", 48, 64, 5, 35, 1);
    conv(&mut s, "b3a", "%x", 288, 64, 1, 35, 1);
    conv(&mut s, "b3b", "%b3a", 64, 96, 3, 35, 1);
    conv(&mut s, "b3", "%b3b", 96, 96, 3, 35, 1);
    s += "  %pool = avg_pool2d %x {kernel=[3,3], pads=[1,1,1,1]} : f32[1,288,35,35]\n";
    conv(&mut s, "b4", "%pool", 288, 64, 1, 35, 1);
    s += "  %y = concat %b1, %b2, %b3, %b4 {axis=1} : f32[1,288,35,35]\n  return %y\n}\n";
    s
}

fn resnext() -> String {
    let mut s = String::from("func @resnext(%x: f32[1,256,56,56]) -> (f32[1,256,56,56]) {\n");
    conv(&mut s, "c1", "%x", 256, 128, 1, 56, 1);
    conv(&mut s, "c2", "%c1", 128, 128, 3, 56, 32);
    s += "  %c3/w = const {value=0.01} : f32[256,128,1,1]\n";
    s += "  %c3 = conv2d %c2, %c3/w : f32[1,256,56,56]\n";
    s += "  %sum = add %c3, %x : f32[1,256,56,56]\n  %y = relu %sum : f32[1,256,56,56]\n";
    s + "  return %y\n}\n"
}

fn nasrnn() -> String {
    let t = "f32[1,512]";
    let mut s = format!("func @nasrnn(%x: {t}, %h: {t}) -> ({t}) {{\n");
    let acts = [
        "sigmoid", "relu", "sigmoid", "relu", "tanh", "sigmoid", "tanh", "sigmoid",
    ];
    for (i, act) in acts.iter().enumerate() {
        writeln!(s, "  %W{i} = const {{value={}}} : f32[512,512]", weight()).unwrap();
        writeln!(s, "  %U{i} = const {{value={}}} : f32[512,512]", weight()).unwrap();
        writeln!(s, "  %xw{i} = matmul %x, %W{i} : {t}").unwrap();
        writeln!(s, "  %hu{i} = matmul %h, %U{i} : {t}").unwrap();
        writeln!(s, "  %pre{i} = add %xw{i}, %hu{i} : {t}").unwrap();
        writeln!(s, "  %g{i} = {act} %pre{i} : {t}").unwrap();
    }
    for (o, (a, op, b)) in [
        ("a", ("g0", "mul", "g1")),
        ("b", ("g2", "add", "g3")),
        ("c", ("g4", "mul", "g5")),
        ("d", ("g6", "add", "g7")),
        ("e", ("a", "mul", "b")),
        ("f", ("c", "add", "d")),
    ] {
        writeln!(s, "  %{o} = {op} %{a}, %{b} : {t}").unwrap();
    }
    writeln!(
        s,
        "  %ft = tanh %f : {t}\n  %out = add %e, %ft : {t}\n  return %out\n}}"
    )
    .unwrap();
    s
}

/// The inference pipeline up to `eqsat`: the input both sides start from.
const BEFORE: &str = "canonicalize,fold-bn,cse,dce";

fn run_pipeline(m: &mut Module, pipeline: &str) {
    PassManager::new(Pipeline::parse(pipeline).expect("a valid pipeline"))
        .run(m, &mut std::io::sink())
        .unwrap_or_else(|e| panic!("{pipeline}: {e}"));
}

fn inputs(f: &Function) -> Vec<Tensor> {
    let mut rng = Rng::new(7);
    (f.params().iter())
        .map(|&p| {
            let ty = f.ty(p);
            if ty.dtype().is_float() {
                random_tensor(ty, &mut rng)
            } else {
                Tensor::zeros(ty.clone()).expect("small")
            }
        })
        .collect()
}

/// Whether `a` and `b` agree within 1e-3 of each result's largest element.
fn agree(a: &[Tensor], b: &[Tensor]) -> bool {
    a.iter().zip(b).all(|(x, y)| {
        let (p, q) = (x.data().to_f64s(), y.data().to_f64s());
        let scale = p
            .iter()
            .filter(|v| v.is_finite())
            .fold(0f64, |m, v| m.max(v.abs()));
        p.iter()
            .zip(&q)
            .all(|(u, v)| u == v || (u - v).abs() <= 1e-3 * scale.max(1e-6))
    })
}

fn row(name: &str, f0: &Function, rules: &[&str], rounds: usize) {
    let m = Machine::DEFAULT;
    let mut f1 = f0.clone();
    let opts = EqsatOptions {
        rules: rules.iter().map(|s| s.to_string()).collect(),
        ..EqsatOptions::default()
    };
    let t = Instant::now();
    let report = match eqsat(&mut f1, &opts) {
        Ok(r) => r,
        Err(e) => {
            println!("{name:<14} FAILED: {e}");
            return;
        }
    };
    let opt_ms = t.elapsed().as_secs_f64() * 1e3;
    let (e0, e1) = (estimate(f0, &m), estimate(&f1, &m));
    let (p0, p1) = match (
        tcc::Program::from_function(f0),
        tcc::Program::from_function(&f1),
    ) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => {
            println!("{name:<14} FAILED to compile: {e}");
            return;
        }
    };
    let xs = inputs(f0);
    let (r0, r1) = (p0.run(&xs), p1.run(&xs));
    let ok = matches!((&r0, &r1), (Ok(a), Ok(b)) if agree(a, b));
    // The input kept is the same program: timing it twice would only measure the VM's drift.
    let same = report.changed.is_none();
    let (mut t0, mut t1) = (f64::MAX, f64::MAX);
    for _ in 0..rounds {
        t0 = t0.min(timing::best_within(|| drop(p0.run(&xs)), 10).as_secs_f64());
        if !same {
            t1 = t1.min(timing::best_within(|| drop(p1.run(&xs)), 10).as_secs_f64());
        }
    }
    if same {
        t1 = t0;
    }
    let ops = |f: &Function| f.schedule().len();
    println!(
        "{name:<14} {:>5} {:>5}  {:>10.1} {:>10.1} {:>6.3}x  {:>9.3} {:>9.3} {:>6.3}x  {:>8.1}  {:<22} {}{}",
        ops(f0),
        ops(&f1),
        e0 * 1e6,
        e1 * 1e6,
        e0 / e1,
        t0 * 1e3,
        t1 * 1e3,
        t0 / t1,
        opt_ms,
        report.stop,
        report.changed.unwrap_or("input kept"),
        if ok { "" } else { "  MISMATCH" }
    );
}

fn main() {
    let rounds = std::env::var("TCC_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(3);
    println!(
        "{:<14} {:>5} {:>5}  {:>10} {:>10} {:>7}  {:>9} {:>9} {:>7}  {:>8}  {:<22} extraction",
        "graph", "ops", "after", "est us", "after", "pred", "ms", "after", "meas", "opt ms", "stop"
    );
    let inference = ["algebra", "layout", "graph"];
    for (name, text) in [
        ("bert", bert()),
        ("inception", inception()),
        ("resnext", resnext()),
        ("nasrnn", nasrnn()),
    ] {
        let mut m = parse_module(&text).unwrap_or_else(|e| panic!("{name}: {e:?}"));
        run_pipeline(&mut m, BEFORE);
        row(name, &m.functions[0], &inference, rounds);
    }
    let light = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target/onnx-venv/lib/python3.11/site-packages/onnx/backend/test/data/light");
    for name in [
        "inception_v1",
        "inception_v2",
        "squeezenet",
        "resnet50",
        "bvlc_alexnet",
        "zfnet512",
        "densenet121",
        "shufflenet",
        "vgg19",
    ] {
        let path = light.join(format!("light_{name}.onnx"));
        let Ok(mut m) = tcc::onnx::import_file(&path, &Default::default()) else {
            println!(
                "{name:<14} skipped: {} not found (run the ONNX tests once)",
                path.display()
            );
            continue;
        };
        run_pipeline(&mut m, BEFORE);
        row(name, &m.functions[0], &inference, rounds);
    }
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    for name in ["mlp", "spirals_mlp", "digits_cnn"] {
        let text = std::fs::read_to_string(examples.join(format!("{name}.tir"))).expect("example");
        let mut m = parse_module(&text).expect("example parses");
        run_pipeline(&mut m, "grad{wrt=params,ys=[loss]},canonicalize,cse,dce");
        row(
            &format!("{name}/grad"),
            &m.functions[0],
            &["algebra", "layout"],
            rounds,
        );
    }
}

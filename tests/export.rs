//! `tcc export` / `tcc_onnx::export`: every op the exporter writes, read back by tcc's own
//! importer, computes what it did; integer layers go out in QDQ form, which imports back onto
//! the integer ops; a model `tcc quantize` wrote runs in onnxruntime with tcc's results (when
//! onnxruntime is installed: `target/onnx-venv`, installed on first use like the ONNX suite's
//! `onnx`); ops with no ONNX form are errors naming them.

mod common;

use std::path::{Path, PathBuf};
use tcc::ir::{Function, OpKind, Tensor, interp, parse_function};

/// Exported, encoded, decoded and imported again.
fn round_trip(f: &Function) -> Function {
    let model = tcc::onnx::export(f, &Default::default()).unwrap_or_else(|e| panic!("{e}\n{f}"));
    let bytes = tcc::onnx::write_model(&model);
    let mut m = tcc::onnx::import(&bytes, &tcc::onnx::Options::default())
        .unwrap_or_else(|e| panic!("{e}\n{f}"));
    m.functions.remove(0)
}

/// Every element of every result as f64 (bools and integers too).
fn values(t: &Tensor) -> Vec<f64> {
    t.data().to_f64s()
}

/// `src` and its round trip agree on random inputs: each result within `tol[i]` (absolute, or
/// relative to the result's largest magnitude when `relative`), NaN where NaN.
fn agrees(src: &str, tol: &[f64], relative: bool) -> Function {
    let f = parse_function(src).unwrap_or_else(|e| panic!("{e:?}"));
    let g = round_trip(&f);
    assert_eq!(f.results().len(), g.results().len());
    let inputs = common::random_inputs(&f, 7);
    let (want, got) = (
        interp::run(&f, &inputs).unwrap(),
        interp::run(&g, &inputs).unwrap_or_else(|e| panic!("{e}\n{g}")),
    );
    for (k, (a, b)) in want.iter().zip(&got).enumerate() {
        let name = f.name(f.results()[k]);
        assert_eq!(a.ty(), b.ty(), "result %{name}");
        let (a, b) = (values(a), values(b));
        let scale = if relative {
            a.iter().fold(1e-30f64, |m, x| m.max(x.abs()))
        } else {
            1.0
        };
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            let same = (x.is_nan() && y.is_nan()) || (x - y).abs() <= tol[k] * scale;
            assert!(
                same,
                "result %{name}[{i}]: {y} after the round trip, {x} before\n{g}"
            );
        }
    }
    g
}

/// Elementwise ops, comparisons, selects, broadcasts and casts.
#[test]
fn elementwise_ops_round_trip() {
    let src = "func @f(%a: f32[2,3], %b: f32[2,3]) -> (f32[2,3], f32[2,3], f32[2,3], f32[2,3], f32[2,3], f32[2,3], f32[2,3], f32[2,3], f32[2,3], f32[2,3], f32[2,3], f32[2,3], f32[2,3], f32[2,3], f32[2,3], f32[2,3], f32[2,3], f32[2,3], f32[2,3], f32[2,3], f32[2,3], f32[2,3], bool[2,3], bool[2,3], bool[2,3], bool[2,3], bool[2,3], bool[2,3], f32[2,3], f32[2,3], i32[2,3], f32[2,3], f32[2,3]) {
  %one = const {value=1.0} : f32[]
  %pa = abs %a : f32[2,3]
  %p = add %pa, %one : f32[2,3]
  %neg = neg %a : f32[2,3]
  %exp = exp %a : f32[2,3]
  %log = log %p : f32[2,3]
  %sqrt = sqrt %p : f32[2,3]
  %rsqrt = rsqrt %p : f32[2,3]
  %rec = reciprocal %p : f32[2,3]
  %tanh = tanh %a : f32[2,3]
  %sig = sigmoid %a : f32[2,3]
  %relu = relu %a : f32[2,3]
  %erf = erf %a : f32[2,3]
  %gelu = gelu %a : f32[2,3]
  %floor = floor %a : f32[2,3]
  %ceil = ceil %a : f32[2,3]
  %round = round %a : f32[2,3]
  %sum = add %a, %b : f32[2,3]
  %diff = sub %a, %b : f32[2,3]
  %prod = mul %a, %b : f32[2,3]
  %quot = div %a, %p : f32[2,3]
  %pow = pow %p, %b : f32[2,3]
  %max = max %a, %b : f32[2,3]
  %min = min %a, %b : f32[2,3]
  %eq = eq %a, %a : bool[2,3]
  %ne = ne %a, %b : bool[2,3]
  %lt = lt %a, %b : bool[2,3]
  %le = le %a, %b : bool[2,3]
  %gt = gt %a, %b : bool[2,3]
  %ge = ge %a, %b : bool[2,3]
  %sel = select %lt, %a, %b : f32[2,3]
  %row = const {value=[1.5, -2.0, 0.25]} : f32[1,3]
  %bc = broadcast_to %row {shape=[2,3]} : f32[2,3]
  %scaled = mul %a, %row : f32[2,3]
  %cast = cast %scaled {to=i32} : i32[2,3]
  %id = identity %a : f32[2,3]
  %sg = stop_gradient %b : f32[2,3]
  return %neg, %exp, %log, %sqrt, %rsqrt, %rec, %tanh, %sig, %relu, %erf, %gelu, %floor, %ceil, %round, %sum, %diff, %prod, %quot, %pow, %max, %min, %pa, %eq, %ne, %lt, %le, %gt, %ge, %sel, %bc, %cast, %id, %sg
}";
    let mut tol = vec![0.0; 33];
    // rsqrt goes out as sqrt then reciprocal, gelu as its erf formula: a rounding apart.
    tol[4] = 1e-6;
    tol[10] = 1e-6;
    agrees(src, &tol, true);
}

/// Convolutions (strided, padded, dilated, grouped), pooling, reductions, softmaxes, top-k,
/// batch norm, data movement, products and the cross-entropy loss.
#[test]
fn network_ops_round_trip() {
    let src = "func @g(%x: f32[2,4,8,8], %w: f32[6,2,3,3], %v: f32[256,5]) -> (f32[2,6,4,6], f32[2,4,4,4], f32[2,4,4,4], f32[2,4,4,4], f32[2,4,1,1], f32[2,1,8,1], f32[2,8], f32[], f32[2,256], f32[2,256], f32[2,3], i64[2,3], f32[1,256], i64[1,256], f32[2,4,8,8], f32[2,8,8,4], f32[2,8,8,8], f32[2,2,3,3], f32[2,3,8,8], f32[2,5], f32[]) {
  %c = conv2d %x, %w {strides=[2,1], pads=[1,2,1,0], dilations=[1,2], groups=2} : f32[2,6,4,6]
  %mp = max_pool2d %x {kernel=[3,3], strides=[2,2], pads=[1,1,1,1]} : f32[2,4,4,4]
  %ap = avg_pool2d %x {kernel=[3,3], strides=[2,2], pads=[1,1,1,1]} : f32[2,4,4,4]
  %api = avg_pool2d %x {kernel=[3,3], strides=[2,2], pads=[1,1,1,1], count_include_pad=true} : f32[2,4,4,4]
  %gap = global_avg_pool %x : f32[2,4,1,1]
  %rs = reduce_sum %x {axes=[1,3], keepdims=true} : f32[2,1,8,1]
  %rm = reduce_mean %x {axes=[1,3]} : f32[2,8]
  %rx = reduce_max %x {axes=[0,1,2,3]} : f32[]
  %flat = reshape %x {shape=[2,256]} : f32[2,256]
  %sm = softmax %flat : f32[2,256]
  %lsm = log_softmax %flat {axis=0} : f32[2,256]
  %tv, %ti = top_k %flat {k=3} : f32[2,3], i64[2,3]
  %bv, %bi = top_k %flat {k=1, axis=0, largest=false} : f32[1,256], i64[1,256]
  %gamma = const {value=[1.0, 0.5, -2.0, 1.5]} : f32[4]
  %beta = const {value=[0.0, 0.1, 0.2, -0.3]} : f32[4]
  %mean = const {value=[0.1, -0.1, 0.0, 0.3]} : f32[4]
  %var = const {value=[1.0, 2.0, 0.5, 0.25]} : f32[4]
  %bn = batch_norm %x, %gamma, %beta, %mean, %var {eps=0.001} : f32[2,4,8,8]
  %tr = transpose %x {perm=[0,2,3,1]} : f32[2,8,8,4]
  %cat = concat %x, %x {axis=1} : f32[2,8,8,8]
  %sl = slice %x {starts=[0,1,0,2], ends=[2,4,8,7], steps=[1,2,3,2]} : f32[2,2,3,3]
  %idx = const {value=[3, 0, 1]} : i64[3]
  %ga = gather %x, %idx {axis=1} : f32[2,3,8,8]
  %mm = matmul %flat, %v : f32[2,5]
  %labels = const {value=[1, 4]} : i32[2]
  %ce = softmax_cross_entropy %mm, %labels : f32[]
  return %c, %mp, %ap, %api, %gap, %rs, %rm, %rx, %sm, %lsm, %tv, %ti, %bv, %bi, %bn, %tr, %cat, %sl, %ga, %mm, %ce
}";
    agrees(src, &[1e-6; 21], true);
}

/// A list literal of `n` small integers (weights' levels).
fn levels(n: usize, seed: usize) -> String {
    let v: Vec<String> = (0..n)
        .map(|i| (((i * 37 + seed * 11) % 41) as i64 - 20).to_string())
        .collect();
    format!("[{}]", v.join(", "))
}

/// Integer layers: a convolution with per-channel weights, its bias and the next layer's
/// per-channel quantization, and a product, as `qdq` writes them, go out as DequantizeLinear ->
/// Conv/MatMul (the bias on the sums' scale) and compute what they did within the float sums'
/// rounding and one step of the next quantization; imported, the inference pipeline puts them
/// back on the integer ops. A convolution whose sums are used as they are goes out as
/// ConvInteger.
#[test]
fn integer_layers_go_out_in_qdq_form() {
    let src = format!(
        "func @q(%x: f32[1,3,6,6], %a: f32[4,8]) -> (f32[1,4,6,6], i32[1,4,3,3], f32[4,5]) {{
  %sx = const {{value=0.02}} : f32[]
  %zx = const {{value=128}} : u8[]
  %xq = quantize_linear %x, %sx, %zx : u8[1,3,6,6]
  %wq = const {{value={}}} : i8[4,3,3,3]
  %zw = const {{value=[1, -2, 0, 3]}} : i8[4,1,1,1]
  %acc = conv_integer %xq, %wq, %zx, %zw {{pads=[1,1,1,1]}} : i32[1,4,6,6]
  %accf = cast %acc {{to=f32}} : f32[1,4,6,6]
  %c = const {{value=[0.0002, 0.0004, 0.0001, 0.0003]}} : f32[4,1,1]
  %y = mul %accf, %c : f32[1,4,6,6]
  %b = const {{value=[0.05, -0.02, 0.0, 0.11]}} : f32[4,1,1]
  %yb = add %y, %b : f32[1,4,6,6]
  %s4 = const {{value=[0.01, 0.02, 0.01, 0.03]}} : f32[4,1,1]
  %z4 = const {{value=[128, 120, 130, 128]}} : u8[4,1,1]
  %yq = quantize_linear %yb, %s4, %z4 : u8[1,4,6,6]
  %yd = dequantize_linear %yq, %s4, %z4 : f32[1,4,6,6]
  %sums = conv_integer %xq, %wq, %zx, %zw {{strides=[2,2], pads=[1,1,1,1]}} : i32[1,4,3,3]
  %sa = const {{value=0.03}} : f32[]
  %za = const {{value=100}} : u8[]
  %aq = quantize_linear %a, %sa, %za : u8[4,8]
  %bq = const {{value={}}} : i8[8,5]
  %zb = const {{value=[0, 1, -1, 2, 0]}} : i8[5]
  %m = matmul_integer %aq, %bq, %za, %zb : i32[4,5]
  %mf = cast %m {{to=f32}} : f32[4,5]
  %cm = const {{value=[0.0003, 0.0006, 0.0003, 0.0009, 0.0003]}} : f32[5]
  %my = mul %mf, %cm : f32[4,5]
  return %yd, %sums, %my
}}",
        levels(108, 1),
        levels(40, 2)
    );
    // One step of the per-channel quantization; the sums exactly; the product within rounding.
    let g = agrees(&src, &[0.03 * 1.0001, 0.0, 1e-5], false);
    let f = parse_function(&src).unwrap();
    let model = tcc::onnx::export(&f, &Default::default()).unwrap();
    let ops: Vec<&str> = (model.graph.as_ref().unwrap().node.iter())
        .map(|n| n.op_type.as_deref().unwrap())
        .collect();
    let count = |op: &str| ops.iter().filter(|&&o| o == op).count();
    assert_eq!(count("Conv"), 1, "{ops:?}");
    assert_eq!(count("ConvInteger"), 1, "{ops:?}");
    assert_eq!(count("MatMul"), 1, "{ops:?}");
    assert_eq!(count("MatMulInteger"), 0, "{ops:?}");
    // x, the weights, the bias and y's dequantization; a's and the matrix's.
    assert_eq!(count("DequantizeLinear"), 6, "{ops:?}");
    assert_eq!(count("Add") + count("Mul") + count("Cast"), 0, "{ops:?}");
    // Read back, the inference pipeline puts both layers on integer ops again.
    let mut m = tcc::ir::Module::new();
    m.functions.push(g);
    let pipeline = tcc::passes::Pipeline::parse(tcc::passes::INFERENCE_PIPELINE).unwrap();
    tcc::passes::PassManager::new(pipeline)
        .run(&mut m, &mut std::io::sink())
        .unwrap();
    let h = &m.functions[0];
    let integer = (h.schedule().iter())
        .filter(|&&o| matches!(h.op(o).kind, OpKind::ConvInteger(_) | OpKind::MatMulInteger))
        .count();
    assert_eq!(integer, 3, "{h}");
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tcc-export-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Ops with no ONNX meaning are errors that name the op and say what to do.
#[test]
fn ops_without_an_onnx_form_are_named() {
    let d = scratch("errors");
    let model = d.join("fq.tir");
    std::fs::write(
        &model,
        "func @f(%x: f32[4]) -> (f32[4]) {
  %lo = const {value=-1.0} : f32[]
  %hi = const {value=1.0} : f32[]
  %y = fake_quant %x, %lo, %hi : f32[4]
  return %y
}
",
    )
    .unwrap();
    let out = d.join("fq.onnx");
    let (code, _, err) = common::tcc(&[
        "export",
        model.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("@f: error: `%y = fake_quant`: `fake_quant` has no ONNX form")
            && err.contains("tcc quantize --from-qat"),
        "{err}"
    );
    assert!(!out.exists());
}

/// A Python with onnxruntime and onnx (for its checker): `target/onnx-venv`'s, installed there
/// on first use.
fn onnxruntime_python() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let venv = root.join("target/onnx-venv");
    let python = venv.join("bin/python");
    let has = |p: &Path| {
        std::process::Command::new(p)
            .args(["-c", "import onnxruntime, numpy, onnx"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !has(&python) {
        if !python.exists() {
            let st = std::process::Command::new("python3")
                .args(["-m", "venv"])
                .arg(&venv)
                .status()
                .expect("python3 runs");
            assert!(st.success(), "python3 -m venv failed");
        }
        let st = std::process::Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "onnxruntime==1.32.0",
                "numpy",
                // The version tests/onnx.rs installs for its conformance data.
                "onnx==1.22.0",
            ])
            .status()
            .expect("pip runs");
        assert!(st.success(), "installing onnxruntime failed");
    }
    python
}

/// A small CNN quantized by `tcc quantize`, exported, runs in onnxruntime (which checks the
/// model) with tcc's int8 results.
#[test]
fn quantized_model_runs_in_onnxruntime() {
    let d = scratch("ort");
    let src = "func @net(%x: f32[2,3,8,8]) -> (f32[2,10]) {
  %w1 = const {value=0.0} : f32[8,3,3,3]
  %b1 = const {value=[0.05, -0.1, 0.0, 0.2, 0.1, -0.05, 0.0, 0.3]} : f32[8,1,1]
  %c1 = conv2d %x, %w1 {pads=[1,1,1,1]} : f32[2,8,8,8]
  %a1 = add %c1, %b1 : f32[2,8,8,8]
  %r1 = relu %a1 : f32[2,8,8,8]
  %p1 = max_pool2d %r1 {kernel=[2,2], strides=[2,2]} : f32[2,8,4,4]
  %w2 = const {value=0.0} : f32[8,1,3,3]
  %c2 = conv2d %p1, %w2 {pads=[1,1,1,1], groups=8} : f32[2,8,4,4]
  %r2 = relu %c2 : f32[2,8,4,4]
  %flat = reshape %r2 {shape=[2,128]} : f32[2,128]
  %v = const {value=0.0} : f32[128,10]
  %b3 = const {value=0.01} : f32[10]
  %mm = matmul %flat, %v : f32[2,10]
  %logits = add %mm, %b3 : f32[2,10]
  return %logits
}";
    // Random weights for the constants.
    let mut f = parse_function(src).unwrap();
    let mut rng = tcc::ir::random::Rng::new(3);
    for name in ["w1", "w2", "v"] {
        let op = f.def_op(f.lookup(name).unwrap()).unwrap();
        let OpKind::Const { ty, .. } = &f.op(op).kind else {
            unreachable!()
        };
        let t = tcc::ir::random::random_tensor(ty, &mut rng);
        f.op_mut(op).kind = OpKind::Const {
            ty: ty.clone(),
            value: tcc::ir::Literal::dense(t.data().clone()),
        };
    }
    let path = |p: &str| d.join(p).to_string_lossy().into_owned();
    std::fs::write(path("net.tir"), format!("{f}")).unwrap();
    let (code, _, err) = common::tcc(&[
        "quantize",
        &path("net.tir"),
        "--calib",
        "random:4",
        "--per-channel",
        "-o",
        &path("q.tir"),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("3 of 3 layers on integer ops"), "{err}");
    let (code, _, err) = common::tcc(&["export", &path("q.tir"), "-o", &path("q.onnx")]);
    assert_eq!(code, 0, "{err}");
    let x = tcc::ir::random::random_tensor(f.ty(f.params()[0]), &mut rng);
    std::fs::write(path("x.npy"), tcc_tools::npy::write(&x)).unwrap();
    let (code, _, err) = common::tcc(&[
        "run",
        &path("q.tir"),
        "--input",
        &format!("x={}", path("x.npy")),
        "--output",
        &path("tcc"),
    ]);
    assert_eq!(code, 0, "{err}");
    let script = "import sys, numpy as np, onnx, onnxruntime as ort
onnx.checker.check_model(onnx.load(sys.argv[1]), full_check=True)
s = ort.InferenceSession(sys.argv[1], providers=['CPUExecutionProvider'])
np.save(sys.argv[3], s.run(None, {'x': np.load(sys.argv[2])})[0])
";
    let python = onnxruntime_python();
    let out = std::process::Command::new(&python)
        .args([
            "-c",
            script,
            &path("q.onnx"),
            &path("x.npy"),
            &path("ort.npy"),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let read = |p: &str| tcc_tools::npy::read(&std::fs::read(p).unwrap()).unwrap();
    let (ours, theirs) = (
        common::f64s(&read(&path("tcc/logits.npy"))),
        common::f64s(&read(&path("ort.npy"))),
    );
    let top = ours.iter().fold(0.0f64, |m, y| m.max(y.abs()));
    let worst = (ours.iter().zip(&theirs)).fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
    eprintln!(
        "onnxruntime on the exported model: largest difference {worst:e} (logits up to {top})"
    );
    assert!(worst <= 2e-3 * top, "{ours:?}\n{theirs:?}");
}

/// Results that no node makes: a parameter, a constant, and a value returned twice, each go out
/// through an Identity of its own; a parameter with a stored value is an initializer, not an
/// input.
#[test]
fn results_that_are_not_node_outputs() {
    let src =
        "func @f(%x: f32[2,3], %w: f32[3]) -> (f32[2,3], f32[3], f32[2,3], f32[2,3], f32[2]) {
  %y = mul %x, %w : f32[2,3]
  %k = const {value=[1.0, 2.0]} : f32[2]
  return %x, %w, %y, %y, %k
}";
    let f = parse_function(src).unwrap();
    let mut stored = std::collections::BTreeMap::new();
    let w = Tensor::from_f32(&[3], vec![0.5, -1.0, 2.0]).unwrap();
    stored.insert("w".to_string(), std::sync::Arc::new(w.clone()));
    let model = tcc::onnx::export(&f, &stored).unwrap();
    let g = model.graph.as_ref().unwrap();
    let inputs: Vec<&str> = g.input.iter().map(|i| i.name.as_deref().unwrap()).collect();
    assert_eq!(inputs, ["x"]);
    let outputs: Vec<&str> = g
        .output
        .iter()
        .map(|o| o.name.as_deref().unwrap())
        .collect();
    assert_eq!(outputs.len(), 5);
    let unique: std::collections::HashSet<&&str> = outputs.iter().collect();
    assert_eq!(unique.len(), 5, "{outputs:?}");
    let identities = g
        .node
        .iter()
        .filter(|n| n.op_type.as_deref() == Some("Identity"));
    assert_eq!(identities.count(), 4, "{:?}", g.node);
    // Read back: the stored weight is a constant, and the results are what they were.
    let bytes = tcc::onnx::write_model(&model);
    let m = tcc::onnx::import(&bytes, &tcc::onnx::Options::default()).unwrap();
    let h = &m.functions[0];
    assert_eq!(h.params().len(), 1);
    let x = Tensor::from_f32(&[2, 3], vec![1.0, 2.0, 3.0, -1.0, 0.0, 4.0]).unwrap();
    let want = interp::run(&f, &[x.clone(), w]).unwrap();
    let got = interp::run(h, &[x]).unwrap();
    assert_eq!(got, want);
}

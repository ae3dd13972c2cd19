//! `tcc quantize`: a float model calibrated, written on the integer ops, and runnable; the
//! table it prints; `--exclude`, `--method percentile=P|entropy` and calibration
//! directories; and the errors a user can cause.

mod common;

use std::path::{Path, PathBuf};
use tcc::ir::{OpKind, Tensor, parse_module};
use tcc_tools::npy;

fn tcc(args: &[&str]) -> (i32, String, String) {
    common::tcc_with(args, b"")
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tcc-quantize-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A small CNN (conv, bias, relu, conv, relu, dense) with weights that are not all alike.
const MODEL: &str = "func @net(%x: f32[1,3,8,8]) -> (f32[1,10]) {
  %w1 = const {value=[0.3, -0.2, 0.1, 0.05, 0.4, -0.3, 0.2, 0.1, -0.1, -0.25, 0.15, 0.3, 0.1, -0.05, 0.2, 0.35, -0.4, 0.1, 0.1, 0.2, -0.3, 0.4, -0.1, 0.05, -0.2, 0.3, 0.15, -0.1, 0.3, 0.2, 0.25, -0.35, 0.1, 0.05, 0.15, -0.2, 0.3, 0.1, -0.15, -0.2, 0.4, 0.05, 0.1, -0.3, 0.25, 0.2, -0.1, 0.35, 0.05, 0.1, -0.25, 0.3, 0.2, -0.05]} : f32[2,3,3,3]
  %b1 = const {value=[0.05, -0.1]} : f32[2,1,1]
  %c1 = conv2d %x, %w1 {pads=[1,1,1,1]} : f32[1,2,8,8]
  %a1 = add %c1, %b1 : f32[1,2,8,8]
  %conv1 = relu %a1 : f32[1,2,8,8]
  %w2 = const {value=0.125} : f32[4,2,3,3]
  %c2 = conv2d %conv1, %w2 {strides=[2,2], pads=[1,1,1,1]} : f32[1,4,4,4]
  %conv2 = relu %c2 : f32[1,4,4,4]
  %flat = reshape %conv2 {shape=[1,64]} : f32[1,64]
  %v = const {value=0.05} : f32[64,10]
  %logits = matmul %flat, %v : f32[1,10]
  return %logits
}";

fn write_model(dir: &Path) -> String {
    let p = dir.join("net.tir");
    std::fs::write(&p, MODEL).unwrap();
    p.to_string_lossy().into_owned()
}

fn count(text: &str, is: impl Fn(&OpKind) -> bool) -> usize {
    let m = parse_module(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let f = &m.functions[0];
    f.schedule().iter().filter(|&&o| is(&f.op(o).kind)).count()
}

/// Every layer goes on the integer ops; the table names each with its range and error and
/// reports the output's; the written IR runs, close to the float model.
#[test]
fn quantizes_every_layer_and_writes_ir_that_runs() {
    let d = scratch("all");
    let model = write_model(&d);
    let out = d.join("q.tir").to_string_lossy().into_owned();
    let (code, _, err) = tcc(&[
        "quantize",
        &model,
        "--calib",
        "random:4",
        "--per-channel",
        "-o",
        &out,
    ]);
    assert_eq!(code, 0, "{err}");
    for name in ["c1", "c2", "logits"] {
        assert!(
            err.lines().any(|l| l.starts_with(name)),
            "no row for {name}:\n{err}"
        );
    }
    assert!(
        err.contains("3 of 3 layers on integer ops; over 4 calibration runs:"),
        "{err}"
    );
    assert!(err.contains("output %logits: relative RMS error"), "{err}");
    assert!(
        err.contains("top-1 of the first output agrees with the float model's on "),
        "{err}"
    );
    assert!(err.contains(" of 4 rows ("), "{err}");
    let text = std::fs::read_to_string(&out).unwrap();
    assert_eq!(count(&text, |k| matches!(k, OpKind::ConvInteger(_))), 2);
    assert_eq!(count(&text, |k| matches!(k, OpKind::MatMulInteger)), 1);
    assert_eq!(
        count(&text, |k| matches!(k, OpKind::Conv2d(_) | OpKind::MatMul)),
        0
    );
    // The quantized model runs and stays near the float one on the same input.
    let results = |file: &str, dir: &Path| {
        let (code, _, err) = tcc(&[
            "run",
            file,
            "--input",
            "x=random:7",
            "--output",
            &dir.to_string_lossy(),
        ]);
        assert_eq!(code, 0, "{err}");
        let t = npy::read(&std::fs::read(dir.join("logits.npy")).unwrap()).unwrap();
        t.data().to_f64s()
    };
    let want = results(&model, &d.join("float"));
    let got = results(&out, &d.join("int8"));
    let (num, den) = (got.iter().zip(&want)).fold((0.0, 0.0), |(n, s), (a, b)| {
        (n + (a - b) * (a - b), s + b * b)
    });
    assert!((num / den).sqrt() < 0.05, "{got:?} against {want:?}");
}

/// The first data row's activation range, `[min, max]`, for the layer named `layer`.
fn range_of(table: &str, layer: &str) -> (f64, f64) {
    let line = (table.lines())
        .find(|l| l.starts_with(layer))
        .unwrap_or_else(|| panic!("no row for {layer}:\n{table}"));
    let inside = &line[line.find('[').unwrap() + 1..line.find(']').unwrap()];
    let (a, b) = inside.split_once(',').unwrap();
    (a.trim().parse().unwrap(), b.trim().parse().unwrap())
}

/// `--exclude` keeps a layer in float; percentiles narrow a range that min-max takes whole,
/// entropy never widens it; a directory of .npy files calibrates.
#[test]
fn exclude_percentile_and_calibration_files() {
    let d = scratch("options");
    let model = write_model(&d);
    let out = d.join("q.tir").to_string_lossy().into_owned();
    let (code, _, err) = tcc(&[
        "quantize",
        &model,
        "--calib",
        "random:3",
        "--exclude",
        "c2",
        "-o",
        &out,
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("2 of 2 layers on integer ops"), "{err}");
    let text = std::fs::read_to_string(&out).unwrap();
    assert_eq!(count(&text, |k| matches!(k, OpKind::Conv2d(_))), 1);
    assert_eq!(count(&text, |k| matches!(k, OpKind::ConvInteger(_))), 1);

    let calib = d.join("calib");
    std::fs::create_dir_all(&calib).unwrap();
    let mut rng = tcc::ir::random::Rng::new(3);
    let ty = tcc::ir::TensorType::new(tcc::ir::DType::F32, vec![1, 3, 8, 8]).unwrap();
    for i in 0..6 {
        let t: Tensor = tcc::ir::random::random_tensor(&ty, &mut rng);
        std::fs::write(calib.join(format!("s{i}.npy")), npy::write(&t)).unwrap();
    }
    let calib = calib.to_string_lossy().into_owned();
    let run = |method: &str| {
        let (code, _, err) = tcc(&[
            "quantize", &model, "--calib", &calib, "--method", method, "-o", &out,
        ]);
        assert_eq!(code, 0, "{method}: {err}");
        assert!(err.contains("over 6 calibration runs"), "{err}");
        err
    };
    let whole = run("minmax");
    let cut = run("percentile=90");
    let (lo, hi) = range_of(&whole, "c1");
    let (plo, phi) = range_of(&cut, "c1");
    assert!(plo > lo && phi < hi, "[{plo}, {phi}] within [{lo}, {hi}]");
    // Entropy clips no wider than the whole range.
    let kl = run("entropy");
    for layer in ["c1", "c2", "logits"] {
        let (a, b) = range_of(&whole, layer);
        let (c, d) = range_of(&kl, layer);
        assert!(c >= a && d <= b, "{layer}: [{c}, {d}] within [{a}, {b}]");
    }
}

/// What the user can get wrong, each a clear error.
#[test]
fn user_errors_are_reported() {
    let d = scratch("errors");
    let model = write_model(&d);
    let quantize = |extra: &[&str]| {
        let mut args = vec!["quantize", model.as_str()];
        args.extend_from_slice(extra);
        tcc(&args)
    };
    let (code, _, err) = quantize(&["--calib", "random:2", "--method", "kl"]);
    assert_eq!(code, 2);
    assert!(
        err.contains(
            "--method `kl`: expected minmax, percentile=P with P in (50, 100], or entropy"
        ),
        "{err}"
    );
    let (code, _, err) = quantize(&["--calib", "random:2", "--method", "percentile=30"]);
    assert_eq!(code, 2);
    assert!(err.contains("percentile=P with P in (50, 100]"), "{err}");
    let (code, _, err) = quantize(&["--calib", "random:0"]);
    assert_eq!(code, 2);
    assert!(err.contains("expected random:N with N >= 1"), "{err}");
    let (code, _, err) = quantize(&["--calib", "random:2", "--exclude", "nope"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("--exclude `nope` matches no layer; the layers are `c1`, `c2`, `logits`"),
        "{err}"
    );
    let calib = d.join("calib");
    std::fs::create_dir_all(&calib).unwrap();
    let (code, _, err) = quantize(&["--calib", &calib.to_string_lossy()]);
    assert_eq!(code, 1);
    assert!(err.contains("no .npy files in it"), "{err}");
    let wrong =
        Tensor::zeros(tcc::ir::TensorType::new(tcc::ir::DType::F32, vec![1, 3, 4, 4]).unwrap())
            .unwrap();
    std::fs::write(calib.join("a.npy"), npy::write(&wrong)).unwrap();
    let (code, _, err) = quantize(&["--calib", &calib.to_string_lossy()]);
    assert_eq!(code, 1);
    assert!(
        err.contains("a.npy` holds f32[1,3,4,4], but the parameter `x` is f32[1,3,8,8]"),
        "{err}"
    );
    let plain = d.join("plain.tir");
    std::fs::write(
        &plain,
        "func @f(%x: f32[4]) -> (f32[4]) {\n  %y = relu %x : f32[4]\n  return %y\n}\n",
    )
    .unwrap();
    let (code, _, err) = tcc(&["quantize", &plain.to_string_lossy(), "--calib", "random:1"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("no convolution or matrix product with constant f32 weights"),
        "{err}"
    );
}

/// A model whose weights are stored parameters (a `weights "DIR"` line, as `tcc train --save`
/// and `tcc import --params` write them) has them taken as constants: its layers are found and
/// quantized, the parameters and their files are gone from what is written, and the result
/// runs with only the input.
#[test]
fn stored_weights_are_quantized_as_constants() {
    let d = scratch("stored");
    std::fs::create_dir_all(d.join("net.weights")).unwrap();
    let text = "weights \"net.weights\"
func @net(%x: f32[1,3,8,8], %w1: f32[2,3,3,3], %v: f32[128,10]) -> (f32[1,10]) {
  %c1 = conv2d %x, %w1 {pads=[1,1,1,1]} : f32[1,2,8,8]
  %r = relu %c1 : f32[1,2,8,8]
  %flat = reshape %r {shape=[1,128]} : f32[1,128]
  %logits = matmul %flat, %v : f32[1,10]
  return %logits
}
";
    std::fs::write(d.join("net.tir"), text).unwrap();
    let mut rng = tcc::ir::random::Rng::new(9);
    for (name, dims) in [("w1", vec![2, 3, 3, 3]), ("v", vec![128, 10])] {
        let ty = tcc::ir::TensorType::new(tcc::ir::DType::F32, dims).unwrap();
        let t = tcc::ir::random::random_tensor(&ty, &mut rng);
        std::fs::write(
            d.join("net.weights").join(format!("{name}.npy")),
            npy::write(&t),
        )
        .unwrap();
    }
    let model = d.join("net.tir").to_string_lossy().into_owned();
    let out = d.join("q.tir").to_string_lossy().into_owned();
    let (code, _, err) = tcc(&["quantize", &model, "--calib", "random:2", "-o", &out]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("2 of 2 layers on integer ops"), "{err}");
    let written = std::fs::read_to_string(&out).unwrap();
    assert!(
        written.contains("func @net(%x: f32[1,3,8,8]) -> (f32[1,10])"),
        "{written}"
    );
    assert!(!written.contains("weights \""), "{written}");
    let (code, _, err) = tcc(&["run", &out]);
    assert_eq!(code, 0, "{err}");
}

/// A calibration directory in `tcc train --data`'s format feeds a function with several
/// parameters a run per mini-batch, and a scalar result (a loss) is reported as its mean in
/// float and in int8; arrays with different numbers of mini-batches are an error.
#[test]
fn training_data_directories_calibrate_and_scalars_are_averaged() {
    let d = scratch("data");
    let src = "func @net(%x: f32[2,8], %y: f32[2,3]) -> (f32[2,3], f32[]) {
  %w = const {value=0.25} : f32[8,3]
  %p = matmul %x, %w : f32[2,3]
  %e = sub %p, %y : f32[2,3]
  %sq = mul %e, %e : f32[2,3]
  %loss = reduce_sum %sq {axes=[0,1]} : f32[]
  return %p, %loss
}
";
    std::fs::write(d.join("net.tir"), src).unwrap();
    let data = d.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let mut rng = tcc::ir::random::Rng::new(4);
    let array = |dims: Vec<u64>, rng: &mut tcc::ir::random::Rng| {
        let ty = tcc::ir::TensorType::new(tcc::ir::DType::F32, dims).unwrap();
        npy::write(&tcc::ir::random::random_tensor(&ty, rng))
    };
    std::fs::write(data.join("x.npy"), array(vec![6, 8], &mut rng)).unwrap();
    std::fs::write(data.join("y.npy"), array(vec![6, 3], &mut rng)).unwrap();
    let model = d.join("net.tir").to_string_lossy().into_owned();
    let out = d.join("q.tir").to_string_lossy().into_owned();
    let calib = data.to_string_lossy().into_owned();
    let (code, _, err) = tcc(&["quantize", &model, "--calib", &calib, "-o", &out]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("1 of 1 layers on integer ops; over 3 calibration runs:"),
        "{err}"
    );
    let line = (err.lines())
        .find(|l| l.contains("output %loss:"))
        .unwrap_or_else(|| panic!("{err}"));
    assert!(
        line.contains(" in float, ") && line.ends_with(" in int8"),
        "{line}"
    );
    std::fs::write(data.join("y.npy"), array(vec![4, 3], &mut rng)).unwrap();
    let (code, _, err) = tcc(&["quantize", &model, "--calib", &calib, "-o", &out]);
    assert_eq!(code, 1);
    assert!(
        err.contains("`y` holds 2 mini-batches but `x` holds 3"),
        "{err}"
    );
}

/// The number after `key` on the line of `text` that contains `line`.
fn number_after(text: &str, line: &str, key: &str) -> f64 {
    let l = (text.lines())
        .find(|l| l.contains(line))
        .unwrap_or_else(|| panic!("no `{line}` in:\n{text}"));
    let rest = &l[l.find(key).unwrap_or_else(|| panic!("no `{key}` in {l}")) + key.len()..];
    let word = rest.split_whitespace().next().unwrap();
    word.trim_end_matches([',', ';']).parse().unwrap()
}

/// `--from-qat`: the digits CNN trained with fake quantization (batch norm folded and frozen)
/// converts with what it learned: its batch norm on the moving statistics, its weights at the
/// levels the training used, the activations the training quantized at their learned ranges
/// (the model's input, which it did not quantize, calibrated), and the int8 model classifies the
/// held-out digits as the trained model did, within half a point. The directory must be one
/// `tcc train --quantize --save` wrote for this model.
#[test]
fn from_qat_converts_with_the_learned_ranges() {
    let d = scratch("qat");
    let read = |p: &str| npy::read(&std::fs::read(p).unwrap()).unwrap();
    let x = read("examples/data/digits/x.npy");
    let labels = read("examples/data/digits/labels.npy");
    let (train, held) = (d.join("train"), d.join("held"));
    for (dir, keep) in [(&train, false), (&held, true)] {
        std::fs::create_dir_all(dir).unwrap();
        for (name, t) in [("x", &x), ("labels", &labels)] {
            let part = common::split_rows(t, 0, 256, keep);
            std::fs::write(dir.join(format!("{name}.npy")), npy::write(&part)).unwrap();
        }
    }
    let path = |p: &Path| p.to_string_lossy().into_owned();
    let (trained, out) = (path(&d.join("w")), path(&d.join("q.tir")));
    let (code, stdout, err) = tcc(&[
        "train",
        "examples/digits_cnn.tir",
        "--data",
        &path(&train),
        "--eval",
        &path(&held),
        "--steps",
        "960",
        "--lr",
        "0.003",
        "--fold-bn",
        "freeze-delay=600,decay=0.99",
        "--quantize",
        "bits=8,delay=300,ema-decay=0.99",
        "--save",
        &trained,
    ]);
    assert_eq!(code, 0, "{err}");
    let qat = number_after(&stdout, "eval: ", " accuracy ");
    let model = "examples/digits_cnn.tir";
    let (code, _, err) = tcc(&[
        "quantize",
        model,
        "--from-qat",
        &trained,
        "--calib",
        &path(&held),
        "-o",
        &out,
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("4 of 4 layers on integer ops"), "{err}");
    assert_eq!(err.matches("(learned range)").count(), 3, "{err}");
    let int8 = number_after(&err, "output %accuracy", " in float, ");
    eprintln!("held-out accuracy: trained with fake quantization {qat}, converted to int8 {int8}");
    assert!(
        (int8 - qat).abs() <= 0.005,
        "int8 {int8} against {qat} for the trained model:\n{err}"
    );
    // The batch norm folded into the weights: the IR has none left.
    let text = std::fs::read_to_string(&out).unwrap();
    assert_eq!(
        count(&text, |k| matches!(
            k,
            OpKind::BatchNorm { .. } | OpKind::BatchNormTrain { .. }
        )),
        0
    );
    // Errors: a directory without the options file, a foreign file, options the integer
    // kernels cannot take, --per-channel (the training decides).
    let bad = |args: &[&str], want: &str| {
        let mut all = vec!["quantize", model, "--calib", "random:1"];
        all.extend_from_slice(args);
        let (code, _, err) = tcc(&all);
        assert_ne!(code, 0);
        assert!(err.contains(want), "{args:?}: {err}");
    };
    bad(&["--from-qat", &path(&held)], "quantize.txt");
    std::fs::copy(held.join("x.npy"), d.join("w").join("pixels.npy")).unwrap();
    bad(
        &["--from-qat", &trained],
        "pixels.npy` is neither a parameter of `@digits` nor the learned state",
    );
    std::fs::remove_file(d.join("w").join("pixels.npy")).unwrap();
    std::fs::write(d.join("w").join("quantize.txt"), "act-bits=4\n").unwrap();
    bad(&["--from-qat", &trained], "4-bit activations");
    bad(&["--from-qat", &trained, "--per-channel"], "--per-channel");
}

/// Weights that reach a layer through a transpose (a Gemm with `transB`) count as constant
/// weights whatever their size: the command folds such moves of constants first (the default
/// `canonicalize` folds at most 256 elements, and mobilenet_v2's 1280x1000 classifier had been
/// left in float without a word).
#[test]
fn transposed_weights_are_quantized() {
    let d = scratch("transposed");
    let values: Vec<String> = (0..1200)
        .map(|i| format!("{:?}", ((i * 37 % 101) as f32 - 50.0) / 100.0))
        .collect();
    let src = format!(
        "func @net(%x: f32[2,40]) -> (f32[2,30]) {{
  %w = const {{value=[{}]}} : f32[30,40]
  %wt = transpose %w {{perm=[1,0]}} : f32[40,30]
  %y = matmul %x, %wt : f32[2,30]
  return %y
}}
",
        values.join(", ")
    );
    std::fs::write(d.join("net.tir"), src).unwrap();
    let (model, out) = (
        d.join("net.tir").to_string_lossy().into_owned(),
        d.join("q.tir").to_string_lossy().into_owned(),
    );
    let (code, _, err) = tcc(&["quantize", &model, "--calib", "random:2", "-o", &out]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("1 of 1 layers on integer ops"), "{err}");
    let text = std::fs::read_to_string(&out).unwrap();
    assert_eq!(
        count(&text, |k| matches!(k, OpKind::MatMulInteger)),
        1,
        "{text}"
    );
    assert_eq!(count(&text, |k| matches!(k, OpKind::MatMul)), 0, "{text}");
}

/// The i8 constants of `text` (weights and their zero points).
fn i8_constants(text: &str) -> Vec<i64> {
    let m = parse_module(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let f = &m.functions[0];
    let mut values = Vec::new();
    for &o in f.schedule() {
        if let OpKind::Const { ty, value } = &f.op(o).kind
            && ty.dtype() == tcc::ir::DType::I8
        {
            let t = Tensor::from_literal(ty, value).unwrap();
            values.extend(t.data().to_f64s().iter().map(|&v| v as i64));
        }
    }
    values
}

/// `--reduce-range` puts the weights on 7-bit levels (each channel's largest at +-63, none
/// past), which AVX2 without VNNI multiplies exactly; without it they reach +-127.
#[test]
fn reduce_range_keeps_weights_within_seven_bits() {
    let d = scratch("reduce");
    let model = write_model(&d);
    for (flag, top) in [(Some("--reduce-range"), 63), (None, 127)] {
        let out = d.join("q.tir").to_string_lossy().into_owned();
        let mut args = vec![
            "quantize",
            &model,
            "--calib",
            "random:2",
            "--per-channel",
            "-o",
        ];
        args.push(&out);
        args.extend(flag);
        let (code, _, err) = tcc(&args);
        assert_eq!(code, 0, "{err}");
        let levels = i8_constants(&std::fs::read_to_string(&out).unwrap());
        let largest = levels.iter().map(|v| v.abs()).max().unwrap();
        assert_eq!(largest, top, "{flag:?}: {levels:?}");
    }
    let (code, _, err) = tcc(&[
        "quantize",
        &model,
        "--calib",
        "random:2",
        "--reduce-range",
        "--from-qat",
        "x",
    ]);
    assert_ne!(code, 0);
    assert!(err.contains("--reduce-range"), "{err}");
}

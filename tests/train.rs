//! `tcc grad` and `tcc train` end to end: the shipped examples train to a real result, the
//! trained parameters are saved, and a user's mistakes get clear errors.

mod common;
use common::tcc;

use std::path::PathBuf;
use tcc_tools::npy;

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tcc-train-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// `(step, loss, accuracy)` of each progress line `step N/M  loss L  accuracy A  (...)`.
fn progress(out: &str) -> Vec<(usize, f64, f64)> {
    out.lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            if w.first() != Some(&"step") {
                return None;
            }
            let step = w[1].split('/').next()?.parse().ok()?;
            Some((step, w[3].parse().ok()?, w[5].parse().ok()?))
        })
        .collect()
}

#[test]
fn spirals_mlp_reaches_95_percent_training_accuracy() {
    let save = scratch("spirals");
    let (code, out, err) = tcc(&[
        "train",
        "examples/spirals_mlp.tir",
        "--data",
        "examples/data/spirals",
        "--steps",
        "120",
        "--every",
        "20",
        "--save",
        save.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let p = progress(&out);
    assert_eq!(p.len(), 7, "{out}");
    let (_, loss, acc) = *p.last().unwrap();
    assert!(acc >= 0.95, "final accuracy {acc}:\n{out}");
    assert!(loss < 0.25 * p[0].1, "loss did not fall:\n{out}");
    // The six trained parameters are saved with their shapes; the data is not.
    let w = npy::read(&std::fs::read(save.join("fc2_w.npy")).unwrap()).unwrap();
    assert_eq!(w.ty().to_string(), "f32[64,64]");
    let saved = std::fs::read_dir(&save).unwrap().count();
    assert_eq!(saved, 6, "{out}");
    // Training again from the saved parameters starts where the first run ended.
    let (code, out2, err) = tcc(&[
        "train",
        "examples/spirals_mlp.tir",
        "--data",
        "examples/data/spirals",
        "--init",
        save.to_str().unwrap(),
        "--steps",
        "1",
    ]);
    assert_eq!(code, 0, "{err}");
    let (_, first, _) = progress(&out2)[0];
    assert!(first < 2.0 * loss, "{first} vs {loss}\n{out2}");
    let _ = std::fs::remove_dir_all(&save);
}

#[test]
fn digits_cnn_loss_falls_steadily() {
    // 56 steps of the digits CNN, the loss printed every 14, with `extra` arguments.
    let train = |extra: &[&str]| {
        let mut args = vec![
            "train",
            "examples/digits_cnn.tir",
            "--data",
            "examples/data/digits",
            "--steps",
            "56",
            "--every",
            "14",
        ];
        args.extend(extra);
        let (code, out, err) = tcc(&args);
        assert_eq!(code, 0, "{err}");
        out
    };
    let out = train(&[]);
    let losses: Vec<f64> = progress(&out).iter().map(|p| p.1).collect();
    assert_eq!(losses.len(), 5, "{out}");
    // Mini-batches differ, so single steps are noisy; every printed loss is below the first and
    // the last is less than a fifth of it.
    assert!(losses[1..].iter().all(|&l| l < losses[0]), "{out}");
    assert!(losses[4] < 0.2 * losses[0], "{out}");
    // With gradient checkpointing the printed losses are the same and the arena is smaller.
    let arena = |out: &str| -> String {
        let line = out.lines().next().unwrap_or("");
        line.split("arena ").nth(1).unwrap_or("").to_string()
    };
    let out_r = train(&["--remat", "budget=0.8"]);
    let losses_r: Vec<f64> = progress(&out_r).iter().map(|p| p.1).collect();
    assert_eq!(losses, losses_r);
    assert!(out.starts_with("training") && out_r.starts_with("training"));
    assert_ne!(arena(&out), arena(&out_r), "{out}\n{out_r}");
}

#[test]
fn every_optimizer_trains() {
    for (opt, lr) in [("sgd", "0.5"), ("momentum", "0.1"), ("adam", "0.01")] {
        let (code, out, err) = tcc(&[
            "train",
            "examples/spirals_mlp.tir",
            "--data",
            "examples/data/spirals",
            "--steps",
            "30",
            "--optimizer",
            opt,
            "--lr",
            lr,
        ]);
        assert_eq!(code, 0, "{opt}: {err}");
        let p = progress(&out);
        let (first, last) = (p[0].1, p.last().unwrap().1);
        assert!(last < 0.8 * first, "{opt}: loss {first} -> {last}\n{out}");
    }
}

#[test]
fn grad_prints_the_gradient_function_and_its_size() {
    let (code, out, err) = tcc(&["grad", "examples/spirals_mlp.tir", "--ys", "loss"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("%grad/fc1/w"), "{out}");
    assert!(
        err.starts_with("grad @spirals: 20 forward ops -> "),
        "{err}"
    );
    let m = tcc::ir::parse_module(&out).unwrap();
    tcc::ir::verify_module(&m).unwrap();
}

#[test]
fn user_errors_are_reported() {
    let cases: &[(&[&str], i32, &str)] = &[
        (
            &[
                "grad",
                "examples/spirals_mlp.tir",
                "--ys",
                "loss",
                "--wrt",
                "fc9/w",
            ],
            1,
            "error: in `@spirals`: x `%fc9/w` is not a value of the function",
        ),
        (
            &["grad", "examples/spirals_mlp.tir"],
            1,
            "in `@spirals`: the function has 2 floating-point scalar results (%loss, %accuracy); say which to differentiate with ys=[...]",
        ),
        (
            &[
                "grad",
                "examples/spirals_mlp.tir",
                "--ys",
                "loss",
                "--wrt",
                "labels",
            ],
            1,
            "cannot differentiate with respect to `%labels` of type i32[400]",
        ),
        (
            &[
                "train",
                "examples/digits_cnn.tir",
                "--data",
                "examples/data/digits",
                "--steps",
                "1",
                "--remat",
                "budget=0.01",
            ],
            1,
            "is below the smallest peak remat found",
        ),
        (
            &[
                "train",
                "examples/digits_cnn.tir",
                "--data",
                "examples/data/digits",
                "--steps",
                "1",
                "--remat",
                "budget=lots",
            ],
            1,
            "error: --remat budget=lots: pass `remat`: budget `lots` is neither bytes",
        ),
        (
            &["train", "examples/spirals_mlp.tir", "--steps", "1"],
            1,
            "parameter `labels` of `@spirals` is neither trained nor in the data directory (no --data given)",
        ),
        (
            &[
                "train",
                "examples/spirals_mlp.tir",
                "--steps",
                "1",
                "--data",
                "examples/data/digits",
            ],
            1,
            "holds u8[1792,1,8,8], but parameter `x` is f32[400,2]",
        ),
        (
            &[
                "train",
                "examples/spirals_mlp.tir",
                "--steps",
                "1",
                "--optimizer",
                "lbfgs",
            ],
            2,
            "unknown optimizer `lbfgs`; choose sgd, momentum or adam",
        ),
        (&["train", "examples/spirals_mlp.tir"], 2, "--steps"),
        (
            &["opt", "--passes=sgd", "examples/spirals_mlp.tir"],
            2,
            "`sgd` needs `lr`, as in sgd{lr=0.01}",
        ),
        (
            &["opt", "--passes=sgd{lr=0.1}", "examples/spirals_mlp.tir"],
            1,
            "returns no gradients (results named grad/<parameter>); run `grad` first",
        ),
    ];
    for (args, want_code, want) in cases {
        let (code, _, err) = tcc(args);
        assert_eq!(code, *want_code, "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: expected `{want}` in:\n{err}");
    }
    // A loss that is not a scalar.
    let dir = scratch("bad-loss");
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("f.tir");
    std::fs::write(
        &f,
        "func @f(%w: f32[3]) -> (f32[3]) {\n  %y = mul %w, %w : f32[3]\n  return %y\n}\n",
    )
    .unwrap();
    let (code, _, err) = tcc(&["train", f.to_str().unwrap(), "--steps", "1"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("is f32[3]; `tcc train` needs a floating-point scalar loss there"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Quantization-aware training of the digits CNN, as TensorFlow's contrib.quantize trains: batch
/// norm folded with corrections (frozen after 30 steps), weights and activations fake-quantized
/// to 8 bits after a delay; the moving statistics and ranges carried as state (not trained) and
/// saved with the weights; the loss still falls.
#[test]
fn digits_cnn_trains_quantized() {
    let dir = scratch("quantized");
    let (code, out, err) = tcc(&[
        "train",
        "examples/digits_cnn.tir",
        "--data",
        "examples/data/digits",
        "--steps",
        "56",
        "--every",
        "14",
        "--fold-bn",
        "freeze-delay=30",
        "--quantize",
        "bits=8,delay=20",
        "--save",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let mut lines = out.lines();
    let fold = lines.next().unwrap();
    assert!(
        fold.starts_with("fold-bn{training=true,freeze-delay=30}: ")
            && fold.contains("conv2d 2 -> 3"),
        "{out}"
    );
    let quant = lines.next().unwrap();
    assert!(
        quant.starts_with("quantize{bits=8,delay=20}: ") && quant.contains("fake_quant 0 -> 8"),
        "{out}"
    );
    // The ranges are not trained: the count of trained parameters is the float model's.
    assert!(out.contains("training `@digits`: 9 parameters"), "{out}");
    let losses: Vec<f64> = progress(&out).iter().map(|p| p.1).collect();
    assert_eq!(losses.len(), 5, "{out}");
    assert!(losses[4] < 0.3 * losses[0], "{out}");
    // The moving ranges and the step are saved beside the weights.
    let read = |n: &str| npy::read(&std::fs::read(dir.join(n)).unwrap()).unwrap();
    let step = read("quant_step.npy");
    assert_eq!(step.data(), &tcc::ir::Data::F32(vec![56.0]));
    let lo = read("quant_conv2_relu_min.npy");
    let tcc::ir::Data::F32(lo) = lo.data() else {
        panic!()
    };
    assert!(
        lo[0] < 0.0 && lo[0] > -6.0,
        "the range moved from -6 towards the batch's: {lo:?}"
    );
    assert!(dir.join("conv1_w.npy").exists());
    let var = read("conv1_bn_moving_var.npy");
    let tcc::ir::Data::F32(var) = var.data() else {
        panic!()
    };
    assert!(
        var.iter().all(|&v| v > 0.0 && v != 1.0),
        "the moving variance moved: {var:?}"
    );
    let (code, _, err) = tcc(&[
        "train",
        "examples/digits_cnn.tir",
        "--steps",
        "1",
        "--quantize",
        "bits=1",
    ]);
    assert_eq!(code, 2);
    assert!(
        err.contains("--quantize bits=1") && err.contains("must be 2 to 16"),
        "{err}"
    );
}

/// The end-to-end bar for quantization-aware training: the digits CNN trained with batch
/// norm folded and 8-bit fake quantization classifies held-out digits within one percentage
/// point of the same network trained in float. One held-out split of 256 digits is too noisy
/// for a point (one digit is 0.4 points, and runs differ by about 2), so this is 7-fold
/// cross-validation: each fold holds out 256 of the 1792 digits and trains on the other 1536,
/// and the accuracies are averaged over all 1792 held-out predictions. Each QAT run uses
/// TensorFlow's recipe: float training first (quantization from step 300), batch norm frozen
/// late (step 600) with moving statistics that have had time to settle (decay 0.99).
#[test]
fn digits_cnn_quantized_stays_within_a_point_of_float_on_held_out_digits() {
    let root = scratch("heldout");
    let read = |p: &str| npy::read(&std::fs::read(p).unwrap()).unwrap();
    let x = read("examples/data/digits/x.npy");
    let labels = read("examples/data/digits/labels.npy");
    assert_eq!(x.dims()[0], 1792);
    let mean_eval_accuracy = |out: &str| -> f64 {
        let line = out.lines().find(|l| l.starts_with("eval: ")).unwrap();
        assert!(line.contains("4 held-out batches"), "{line}");
        line.split_whitespace().last().unwrap().parse().unwrap()
    };
    let (mut float, mut qat) = (Vec::new(), Vec::new());
    for k in 0..7 {
        let (lo, hi) = (256 * k, 256 * (k + 1));
        let (train, held) = (
            root.join(format!("{k}/train")),
            root.join(format!("{k}/held")),
        );
        for (dir, keep) in [(&train, false), (&held, true)] {
            std::fs::create_dir_all(dir).unwrap();
            for (name, t) in [("x", &x), ("labels", &labels)] {
                let part = common::split_rows(t, lo, hi, keep);
                std::fs::write(dir.join(format!("{name}.npy")), npy::write(&part)).unwrap();
            }
        }
        let run = |extra: &[&str]| -> f64 {
            let mut args = vec![
                "train",
                "examples/digits_cnn.tir",
                "--data",
                train.to_str().unwrap(),
                "--eval",
                held.to_str().unwrap(),
                "--steps",
                "960",
                "--lr",
                "0.003",
            ];
            args.extend_from_slice(extra);
            let (code, out, err) = tcc(&args);
            assert_eq!(code, 0, "{err}");
            mean_eval_accuracy(&out)
        };
        float.push(run(&[]));
        qat.push(run(&[
            "--fold-bn",
            "freeze-delay=600,decay=0.99",
            "--quantize",
            "bits=8,delay=300",
        ]));
        eprintln!("fold {k}: float {:.4}, 8-bit QAT {:.4}", float[k], qat[k]);
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let (float, qat) = (mean(&float), mean(&qat));
    eprintln!("held-out accuracy over 1792 digits: float {float:.4}, 8-bit QAT {qat:.4}");
    assert!(float > 0.95, "the float network itself learns: {float}");
    assert!(
        qat >= float - 0.01,
        "8-bit QAT {qat:.4} is more than a point below float {float:.4}"
    );
    let _ = std::fs::remove_dir_all(&root);
}

/// `--eval DIR`: the mean of each scalar result over the held-out mini-batches, and clear errors
/// for a held-out directory that does not fit the training data.
#[test]
fn eval_reports_held_out_means_and_refuses_data_that_does_not_fit() {
    let dir = scratch("eval");
    let read = |p: &str| npy::read(&std::fs::read(p).unwrap()).unwrap();
    let x = read("examples/data/digits/x.npy");
    let labels = read("examples/data/digits/labels.npy");
    let train = |eval: &std::path::Path| {
        tcc(&[
            "train",
            "examples/digits_cnn.tir",
            "--data",
            "examples/data/digits",
            "--eval",
            eval.to_str().unwrap(),
            "--steps",
            "2",
        ])
    };
    // Four batches of x, two of labels.
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("x.npy"),
        npy::write(&common::split_rows(&x, 0, 256, true)),
    )
    .unwrap();
    let (code, _, err) = train(&dir);
    assert_eq!(code, 1);
    assert!(
        err.contains("no `labels.npy` for the data parameter `labels`"),
        "{err}"
    );
    let two = common::split_rows(&labels, 0, 128, true);
    std::fs::write(dir.join("labels.npy"), npy::write(&two)).unwrap();
    let (code, _, err) = train(&dir);
    assert_eq!(code, 1);
    assert!(
        err.contains("holds 2 mini-batches but other arrays hold 4"),
        "{err}"
    );
    // Four of each: one line with the means.
    let four = common::split_rows(&labels, 0, 256, true);
    std::fs::write(dir.join("labels.npy"), npy::write(&four)).unwrap();
    let (code, out, err) = train(&dir);
    assert_eq!(code, 0, "{err}");
    let line = out.lines().find(|l| l.starts_with("eval: ")).unwrap();
    let w: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(w[1..4], ["4", "held-out", "batches"], "{line}");
    let (loss, acc): (f64, f64) = (
        w[w.len() - 3].parse().unwrap(),
        w[w.len() - 1].parse().unwrap(),
    );
    assert_eq!(
        (w[w.len() - 4], w[w.len() - 2]),
        ("loss", "accuracy"),
        "{line}"
    );
    // After two steps the network is barely trained: a loss near ln(10), accuracy a multiple
    // of 1/256 (to the 6 decimals printed).
    assert!(loss > 1.0 && loss < 4.0, "{line}");
    assert!(
        ((acc * 256.0) - (acc * 256.0).round()).abs() < 1e-3,
        "{line}"
    );
    let (code, _, err) = tcc(&[
        "train",
        "examples/digits_cnn.tir",
        "--eval",
        dir.to_str().unwrap(),
        "--steps",
        "1",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("give --data too"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

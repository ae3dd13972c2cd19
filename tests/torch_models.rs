//! PyTorch loss models exported as PyTorch users export them (weights as initializers,
//! BatchNorm in training mode, `F.cross_entropy`), differentiated and trained by `tcc` straight
//! from the `.onnx` file, against torch autograd and torch's SGD. The fixtures and the script
//! that made them are in `tests/data/torch/` (`make.py`).

mod common;
use common::tcc;

use std::path::{Path, PathBuf};
use tcc::ir::{Data, Tensor};

const MODELS: [&str; 3] = ["cnn_bn", "mlp_ln", "mha_block"];

fn fixture(model: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/torch")
        .join(model)
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tcc-torch-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn read(path: &Path) -> Tensor {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    tcc_tools::npy::read(&bytes).unwrap()
}

fn floats(t: &Tensor) -> Vec<f64> {
    match t.data() {
        Data::F32(v) => v.iter().map(|&x| x as f64).collect(),
        Data::F64(v) => v.clone(),
        d => panic!("expected floats, found {:?}", d.dtype()),
    }
}

/// The `--input NAME=PATH` flags for a fixture's inputs.
fn inputs(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir.join("inputs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| {
            let name = p.file_stem().unwrap().to_str().unwrap().to_string();
            format!("{name}={}", p.display())
        })
        .collect();
    v.sort();
    v
}

/// `tcc grad model.onnx --wrt <every weight> -o g.tir`, then `tcc run g.tir`: the gradient of
/// every weight matches torch autograd's within 1e-3 of the model's largest gradient.
#[test]
fn gradients_of_exported_loss_models_match_torch() {
    for model in MODELS {
        let dir = fixture(model);
        let out = scratch(model);
        let g = out.join("g.tir");
        let onnx = dir.join("model.onnx");
        let mut weights: Vec<String> = std::fs::read_dir(dir.join("grads"))
            .unwrap()
            .map(|e| {
                e.unwrap()
                    .path()
                    .file_stem()
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .to_string()
            })
            .collect();
        weights.sort();
        let wrt = weights.join(",");
        let (code, _, err) = tcc(&[
            "grad",
            onnx.to_str().unwrap(),
            "--wrt",
            &wrt,
            "-o",
            g.to_str().unwrap(),
        ]);
        assert_eq!(code, 0, "{model}: {err}");
        // The weights travel beside the IR, and the IR names them.
        let text = std::fs::read_to_string(&g).unwrap();
        assert!(
            text.starts_with("weights \"g.weights\"\n"),
            "{model}: {text}"
        );
        let mut args = vec!["run".to_string(), g.display().to_string()];
        for i in inputs(&dir) {
            args.extend(["--input".to_string(), i]);
        }
        let results = out.join("results");
        args.extend(["--output".into(), results.display().to_string()]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, stdout, err) = tcc(&args);
        assert_eq!(code, 0, "{model}: {err}");

        let expected: Vec<(String, Vec<f64>)> = std::fs::read_dir(dir.join("grads"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .map(|p| {
                let name = p.file_stem().unwrap().to_str().unwrap().to_string();
                (name, floats(&read(&p)))
            })
            .collect();
        assert!(expected.len() >= 8, "{model}: {} gradients", expected.len());
        let largest = expected
            .iter()
            .flat_map(|(_, g)| g.iter().map(|x| x.abs()))
            .fold(0.0, f64::max);
        for (name, want) in &expected {
            let got = floats(&read(&results.join(format!("grad_{name}.npy"))));
            assert_eq!(got.len(), want.len(), "{model}: {name}");
            let err = got
                .iter()
                .zip(want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f64::max);
            assert!(
                err <= 1e-3 * largest,
                "{model}: d loss / d {name} differs from torch by {err:e} (largest gradient {largest:e})\n{stdout}"
            );
        }
    }
}

/// `tcc train model.onnx --optimizer sgd` from the exported weights lowers the loss as torch's
/// SGD does from the same weights on the same batch (20 steps), and `--save FILE.onnx` writes
/// a model that runs at the trained weights.
#[test]
fn sgd_on_exported_loss_models_follows_torch() {
    for model in MODELS {
        let dir = fixture(model);
        let out = scratch(&format!("train-{model}"));
        let saved = out.join("trained.onnx");
        let onnx = dir.join("model.onnx");
        let data = dir.join("inputs");
        let (code, stdout, err) = tcc(&[
            "train",
            onnx.to_str().unwrap(),
            "--data",
            data.to_str().unwrap(),
            "--steps",
            "20",
            "--optimizer",
            "sgd",
            "--lr",
            "0.05",
            "--every",
            "1",
            "--save",
            saved.to_str().unwrap(),
        ]);
        assert_eq!(code, 0, "{model}: {err}");
        let losses: Vec<f64> = stdout
            .lines()
            .filter_map(|l| l.strip_prefix("step"))
            .map(|l| {
                let v = l.split_whitespace().skip_while(|w| *w != "loss").nth(1);
                v.unwrap().parse().unwrap()
            })
            .collect();
        let want = floats(&read(&dir.join("sgd_losses.npy")));
        assert_eq!(losses.len() + 1, want.len(), "{model}: {stdout}");
        for (i, (a, b)) in losses.iter().zip(&want).enumerate() {
            assert!(
                (a - b).abs() <= 1e-4 * b.abs().max(1.0),
                "{model}: step {} loss {a} but torch's is {b}\n{stdout}",
                i + 1
            );
        }
        assert!(
            want[19] < want[0],
            "{model}: the fixture's loss does not go down"
        );
        // The saved model carries the trained weights: its loss is torch's after 20 updates.
        let mut args = vec!["run".to_string(), saved.display().to_string()];
        for i in inputs(&dir) {
            args.extend(["--input".to_string(), i]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, stdout, err) = tcc(&args);
        assert_eq!(code, 0, "{model}: {err}");
        assert!(stdout.starts_with("%loss: f32[]  min "), "{stdout}");
        let after: f64 = stdout.split_whitespace().nth(3).unwrap().parse().unwrap();
        assert!(
            (after - want[20]).abs() <= 1e-4 * want[20].abs().max(1.0),
            "{model}: the saved model's loss is {after}, torch's after 20 steps {}",
            want[20]
        );
    }
}

//! The recurrent ops (`LSTM`, `GRU`, `RNN`): PyTorch's exports (two layers, bidirectional,
//! batch-first or not, initial states) against onnxruntime's outputs, and the gradients of the
//! unrolled cells against central finite differences in f64 (every option that changes the
//! equations: peepholes, biases, initial states, sequence lengths, clip, linear-before-reset,
//! activations with parameters, both directions).

mod common;
use common::onnx::{model, node, value_info};

use std::path::{Path, PathBuf};
use tcc::ir::random::Rng;
use tcc::ir::{Data, Function, Tensor, interp};
use tcc::onnx::proto::{
    AttributeProto, GraphProto, TensorProto, attribute_proto::AttributeType, tensor_proto::DataType,
};
use tcc::onnx::{Options, Params, import, write_model};
use tcc::passes::grad::{GradOptions, Wrt, grad};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/torch/recurrent")
        .join(name)
}

fn read(path: &Path) -> Tensor {
    tcc_tools::npy::read(&std::fs::read(path).unwrap()).unwrap()
}

fn f64s(t: &Tensor) -> Vec<f64> {
    match t.data() {
        Data::F32(v) => v.iter().map(|&x| x as f64).collect(),
        Data::F64(v) => v.clone(),
        d => panic!("expected floats, found {:?}", d.dtype()),
    }
}

/// PyTorch's nn.LSTM, nn.GRU and nn.RNN exports, compiled, match onnxruntime.
#[test]
fn exported_pytorch_recurrent_layers_match_onnxruntime() {
    for (name, inputs, outputs) in [("lstm", 3, 3), ("gru", 2, 2), ("rnn", 2, 2)] {
        let dir = fixture(name);
        let m = tcc::onnx::import_file(&dir.join("model.onnx"), &Options::default()).unwrap();
        let f = &m.functions[0];
        let xs: Vec<Tensor> = (0..inputs)
            .map(|i| read(&dir.join(format!("input_{i}.npy"))))
            .collect();
        let got = tcc::Program::from_function(f).unwrap().run(&xs).unwrap();
        assert_eq!(got.len(), outputs);
        for (i, g) in got.iter().enumerate() {
            let want = read(&dir.join(format!("output_{i}.npy")));
            assert_eq!(g.ty(), want.ty(), "{name} output {i}");
            let err = f64s(g)
                .iter()
                .zip(f64s(&want))
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f64::max);
            assert!(
                err <= 1e-5,
                "{name} output {i} differs from onnxruntime by {err:e}"
            );
        }
    }
}

fn f64_init(name: &str, dims: &[i64], rng: &mut Rng) -> TensorProto {
    let n: i64 = dims.iter().product();
    TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(DataType::Double as i32),
        double_data: (0..n).map(|_| rng.uniform(-0.6, 0.6)).collect(),
        ..Default::default()
    }
}

fn attr_i(name: &str, i: i64) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Int as i32),
        i: Some(i),
        ..Default::default()
    }
}

fn attr_s(name: &str, s: &str) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::String as i32),
        s: Some(s.as_bytes().to_vec()),
        ..Default::default()
    }
}

fn attr_f(name: &str, f: f32) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Float as i32),
        f: Some(f),
        ..Default::default()
    }
}

/// One recurrent node over f64 `x [T=4, B=2, I=3]` with hidden size 3, its weights (and
/// optional inputs) as initializers, imported with every initializer a parameter.
fn recurrent_model(
    op: &str,
    gates: i64,
    dirs: i64,
    extra: &[&str],
    attrs: Vec<AttributeProto>,
) -> Function {
    let (t, b, i, h) = (4, 2, 3, 3);
    let mut rng = Rng::new(7 + gates as u64 + dirs as u64 + extra.len() as u64);
    let mut inits = vec![
        f64_init("W", &[dirs, gates * h, i], &mut rng),
        f64_init("R", &[dirs, gates * h, h], &mut rng),
    ];
    let mut ins = vec!["x", "W", "R", "", "", "", "", ""];
    for &e in extra {
        match e {
            "B" => {
                inits.push(f64_init("B", &[dirs, 2 * gates * h], &mut rng));
                ins[3] = "B";
            }
            "lens" => {
                inits.push(TensorProto {
                    name: Some("lens".into()),
                    dims: vec![b],
                    data_type: Some(DataType::Int32 as i32),
                    int32_data: vec![4, 2],
                    ..Default::default()
                });
                ins[4] = "lens";
            }
            "h0" => {
                inits.push(f64_init("h0", &[dirs, b, h], &mut rng));
                ins[5] = "h0";
            }
            "c0" => {
                inits.push(f64_init("c0", &[dirs, b, h], &mut rng));
                ins[6] = "c0";
            }
            "P" => {
                inits.push(f64_init("P", &[dirs, 3 * h], &mut rng));
                ins[7] = "P";
            }
            _ => unreachable!(),
        }
    }
    while ins.last() == Some(&"") {
        ins.pop();
    }
    let outs: &[&str] = if op == "LSTM" {
        &["y", "yh", "yc"]
    } else {
        &["y", "yh"]
    };
    let mut attrs = attrs;
    attrs.push(attr_i("hidden_size", h));
    let g = GraphProto {
        node: vec![node(op, "cell", &ins, outs, attrs)],
        initializer: inits,
        input: vec![value_info(
            "x",
            DataType::Double,
            &[Some(t), Some(b), Some(i)],
        )],
        output: outs
            .iter()
            .map(|o| value_info(o, DataType::Double, &[]))
            .map(|mut v| {
                v.r#type = None;
                v
            })
            .collect(),
        ..Default::default()
    };
    let opts = Options {
        params: Params::All,
        ..Default::default()
    };
    let m = import(&write_model(&model(g, 14)), &opts).unwrap_or_else(|e| panic!("{op}: {e}"));
    m.functions.into_iter().next().unwrap()
}

/// d/dp sum(results * seeds) from `grad` against central differences, for every element of
/// every parameter.
fn gradcheck(what: &str, f: &Function) {
    let mut g = f.clone();
    let opts = GradOptions {
        ys: f.results().iter().map(|&r| f.name(r).to_string()).collect(),
        wrt: Wrt::Params,
        grad_ys: true,
        ..GradOptions::default()
    };
    grad(&mut g, &opts).unwrap_or_else(|e| panic!("{what}: {e}"));
    let mut rng = Rng::new(11);
    let mut xs: Vec<Tensor> = f
        .params()
        .iter()
        .map(|&p| {
            let ty = f.ty(p).clone();
            let n = ty.numel() as usize;
            Tensor::new(
                ty,
                Data::F64((0..n).map(|_| rng.uniform(-0.6, 0.6)).collect()),
            )
            .unwrap()
        })
        .collect();
    let seeds: Vec<Tensor> = f
        .results()
        .iter()
        .map(|&r| {
            let ty = f.ty(r).clone();
            let n = ty.numel() as usize;
            Tensor::new(
                ty,
                Data::F64((0..n).map(|_| rng.uniform(-1.0, 1.0)).collect()),
            )
            .unwrap()
        })
        .collect();
    let loss = |xs: &[Tensor]| -> f64 {
        let ys = interp::run(f, xs).unwrap();
        ys.iter()
            .zip(&seeds)
            .map(|(y, s)| f64s(y).iter().zip(f64s(s)).map(|(a, b)| a * b).sum::<f64>())
            .sum()
    };
    let mut inputs = xs.clone();
    inputs.extend(seeds.iter().cloned());
    let out = interp::run(&g, &inputs).unwrap();
    let nres = f.results().len();
    let mut checked = 0;
    for pi in 0..xs.len() {
        let got = f64s(&out[nres + pi]);
        for (i, &gi) in got.iter().enumerate() {
            let h = 1e-6;
            let at = |xs: &mut Vec<Tensor>, d: f64| {
                let mut v = f64s(&xs[pi]);
                v[i] += d;
                xs[pi] = Tensor::new(xs[pi].ty().clone(), Data::F64(v)).unwrap();
            };
            at(&mut xs, h);
            let up = loss(&xs);
            at(&mut xs, -2.0 * h);
            let down = loss(&xs);
            at(&mut xs, h);
            let want = (up - down) / (2.0 * h);
            assert!(
                (gi - want).abs() <= 1e-6 * (1.0 + want.abs()),
                "{what}: d/d{}[{i}] is {gi}, finite differences give {want}",
                f.name(f.params()[pi])
            );
            checked += 1;
        }
    }
    assert!(checked > 50, "{what}: only {checked} elements checked");
}

#[test]
fn lstm_gradients_match_finite_differences() {
    let f = recurrent_model("LSTM", 4, 1, &["B", "h0", "c0", "P"], vec![]);
    gradcheck("LSTM forward, bias, states, peepholes", &f);
    let f = recurrent_model(
        "LSTM",
        4,
        2,
        &["B", "lens"],
        vec![attr_s("direction", "bidirectional"), attr_f("clip", 0.5)],
    );
    gradcheck("LSTM bidirectional, sequence lengths, clip", &f);
}

#[test]
fn gru_gradients_match_finite_differences() {
    for lbr in [0, 1] {
        let f = recurrent_model(
            "GRU",
            3,
            2,
            &["B", "h0"],
            vec![
                attr_s("direction", "bidirectional"),
                attr_i("linear_before_reset", lbr),
            ],
        );
        gradcheck(&format!("GRU bidirectional, linear_before_reset={lbr}"), &f);
    }
    let f = recurrent_model("GRU", 3, 1, &["lens"], vec![attr_s("direction", "reverse")]);
    gradcheck("GRU reverse, sequence lengths", &f);
}

#[test]
fn rnn_gradients_match_finite_differences() {
    let acts = AttributeProto {
        name: Some("activations".into()),
        r#type: Some(AttributeType::Strings as i32),
        strings: vec![b"ScaledTanh".to_vec()],
        ..Default::default()
    };
    let alpha = AttributeProto {
        name: Some("activation_alpha".into()),
        r#type: Some(AttributeType::Floats as i32),
        floats: vec![1.5],
        ..Default::default()
    };
    let f = recurrent_model("RNN", 1, 1, &["B", "h0"], vec![acts, alpha]);
    gradcheck("RNN ScaledTanh", &f);
}

/// What tcc does not do is an error naming it.
#[test]
fn unsupported_recurrent_options_are_named() {
    let g = GraphProto {
        node: vec![node(
            "LSTM",
            "cell",
            &["x", "W", "R"],
            &["y"],
            vec![attr_i("hidden_size", 3), attr_i("input_forget", 1)],
        )],
        initializer: vec![
            f64_init("W", &[1, 12, 3], &mut Rng::new(1)),
            f64_init("R", &[1, 12, 3], &mut Rng::new(2)),
        ],
        input: vec![value_info(
            "x",
            DataType::Double,
            &[Some(2), Some(1), Some(3)],
        )],
        output: vec![value_info(
            "y",
            DataType::Double,
            &[Some(2), Some(1), Some(1), Some(3)],
        )],
        ..Default::default()
    };
    let e = import(&write_model(&model(g, 14)), &Options::default()).unwrap_err();
    assert!(e.is_unsupported());
    assert_eq!(
        e.to_string(),
        "node `cell` (LSTM, opset 14): LSTM with input_forget=1 is not supported"
    );
}

//! The recurrent ops (`LSTM`, `GRU`, `RNN`): PyTorch's exports (two layers, bidirectional,
//! batch-first or not, initial states) against onnxruntime's outputs, and the gradients of the
//! unrolled cells against central finite differences in f64 (every option that changes the
//! equations: peepholes, biases, initial states, sequence lengths, clip, linear-before-reset,
//! activations with parameters, both directions).

mod common;
use common::onnx::{attr_f, attr_i, attr_s, f64_init, model, node, value_info};
use common::{f64s, gradcheck};

use std::path::{Path, PathBuf};
use tcc::ir::random::Rng;
use tcc::ir::{Function, Tensor};
use tcc::onnx::proto::{
    AttributeProto, GraphProto, TensorProto, attribute_proto::AttributeType, tensor_proto::DataType,
};
use tcc::onnx::{Options, Params, import, write_model};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/torch/recurrent")
        .join(name)
}

fn read(path: &Path) -> Tensor {
    tcc_tools::npy::read(&std::fs::read(path).unwrap()).unwrap()
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

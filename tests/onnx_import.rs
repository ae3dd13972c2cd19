//! The ONNX importer on models built here: names kept, dynamic dimensions bound with `--shape`,
//! inputs fixed with `--const`, external data, the driver's `import` and `run`, and every kind
//! of bad file giving an error that names the place, never a panic.

mod common;
use common::tcc;

use common::onnx::{f32_init, ints_attr, model, node, value_info};
use std::path::PathBuf;
use tcc::ir::{Data, Tensor};
use tcc::onnx::proto::{
    AttributeProto, GraphProto, ModelProto, StringStringEntryProto, TensorProto,
    attribute_proto::AttributeType, tensor_proto::DataType,
};
use tcc::onnx::{Options, import, write_model};

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tcc-onnx-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `y = relu(x @ w + b)` with a dynamic batch dimension `N`, then `Reshape` to `[-1]`.
fn mlp() -> ModelProto {
    model(
        GraphProto {
            name: Some("mlp".into()),
            node: vec![
                node("MatMul", "fc/matmul", &["x", "fc/w"], &["fc/xw"], vec![]),
                node("Add", "fc/add", &["fc/xw", "fc/b"], &["fc/out"], vec![]),
                node("Relu", "act", &["fc/out"], &["h"], vec![]),
                node("Reshape", "flat", &["h", "shape"], &["y"], vec![]),
            ],
            initializer: vec![
                f32_init("fc/w", &[3, 2], &[1.0, -1.0, 0.5, 0.5, -2.0, 1.0]),
                f32_init("fc/b", &[2], &[0.25, -0.25]),
                TensorProto {
                    name: Some("shape".into()),
                    dims: vec![1],
                    data_type: Some(DataType::Int64 as i32),
                    int64_data: vec![-1],
                    ..Default::default()
                },
            ],
            input: vec![value_info("x", DataType::Float, &[None, Some(3)])],
            output: vec![value_info("y", DataType::Float, &[None])],
            ..Default::default()
        },
        13,
    )
}

fn bound(name: &str, dims: &[u64]) -> Options {
    Options {
        shapes: vec![(name.into(), dims.to_vec())],
        ..Default::default()
    }
}

#[test]
fn imports_with_names_and_runs() {
    let m = import(&write_model(&mlp()), &bound("x", &[2, 3])).unwrap();
    insta::assert_snapshot!(m.to_string());
    let x = Tensor::from_f32(&[2, 3], vec![1.0, 2.0, 3.0, -1.0, 0.0, 1.0]).unwrap();
    let got = tcc::Program::from_function(&m.functions[0])
        .unwrap()
        .run(&[x])
        .unwrap();
    // Row 1: [1+1-6, -1+1+3] + b = [-3.75, 2.75]; row 2: [-1+0-2, 1+0+1] + b = [-2.75, 1.75].
    assert_eq!(got[0].data(), &Data::F32(vec![0.0, 2.75, 0.0, 1.75]));
}

#[test]
fn a_dynamic_dimension_must_be_bound() {
    let e = import(&write_model(&mlp()), &Options::default()).unwrap_err();
    assert_eq!(
        e.message(),
        "graph input `x` has dynamic dimension `N` (axis 0 of [N,3]); bind it, as in --shape x=1,3"
    );
    assert!(!e.is_unsupported());
    let e = import(&write_model(&mlp()), &bound("x", &[2, 4])).unwrap_err();
    assert_eq!(
        e.message(),
        "the shape given for `x` has 4 at dimension 1, but the model fixes it at 3"
    );
    let e = import(&write_model(&mlp()), &bound("z", &[2, 3])).unwrap_err();
    assert_eq!(
        e.message(),
        "--shape names `z`, which is not a graph input; the inputs are `x`"
    );
}

#[test]
fn driver_imports_and_runs_models() {
    let d = scratch("driver");
    let path = d.join("mlp.onnx");
    std::fs::write(&path, write_model(&mlp())).unwrap();
    let p = path.to_str().unwrap();
    let out = d.join("mlp.tir");
    let (code, _, err) = tcc(&["import", p, "--shape", "x=4,3", "-o", out.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(
        text.starts_with("func @main(%x: f32[4,3]) -> (f32[8]) {"),
        "{text}"
    );
    // The IR file runs the same as the model.
    let (code, from_ir, err) = tcc(&["run", out.to_str().unwrap(), "--input", "x=random:3"]);
    assert_eq!(code, 0, "{err}");
    let (code, from_onnx, err) = tcc(&["run", p, "--shape", "x=4,3", "--input", "x=random:3"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(from_ir, from_onnx);
    assert!(from_onnx.starts_with("%y: f32[8]  min "), "{from_onnx}");
    // From standard input (recognised by its first byte, as IR text never starts so).
    let (code, out, err) =
        common::tcc_with(&["import", "-", "--shape", "x=4,3"], &write_model(&mlp()));
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, text);
    // Without the binding, the error names the input and says what to do.
    let (code, _, err) = tcc(&["run", p]);
    assert_eq!(code, 1);
    assert!(
        err.contains("graph input `x` has dynamic dimension `N`"),
        "{err}"
    );
    assert!(err.contains("--shape x=1,3"), "{err}");
    let (code, _, err) = tcc(&["import", p, "--shape", "x=two,3"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("dimensions must be non-negative integers"),
        "{err}"
    );
}

/// A `Reshape` whose target is a graph input needs the input fixed with `--const`.
#[test]
fn shape_inputs_are_fixed_with_const() {
    let mut m = mlp();
    let g = m.graph.as_mut().unwrap();
    g.initializer.pop();
    g.input
        .push(value_info("shape", DataType::Int64, &[Some(2)]));
    let bytes = write_model(&m);
    let e = import(&bytes, &bound("x", &[2, 3])).unwrap_err();
    assert_eq!(e.constant_needed(), Some("shape"));
    assert!(
        e.message().contains(
            "node `flat` (Reshape, opset 13): input 1 (shape) must be known at import time"
        ),
        "{e}"
    );
    assert!(e.message().contains("--const shape=FILE.npy"), "{e}");

    let d = scratch("const");
    let path = d.join("m.onnx");
    std::fs::write(&path, &bytes).unwrap();
    let npy = d.join("shape.npy");
    let t = Tensor::from_data(&[2], Data::I64(vec![4, -1])).unwrap();
    std::fs::write(&npy, tcc_tools::npy::write(&t)).unwrap();
    let (code, out, err) = tcc(&[
        "import",
        path.to_str().unwrap(),
        "--shape",
        "x=2,3",
        "--const",
        &format!("shape={}", npy.display()),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("-> (f32[4,1])"), "{out}");
}

/// Initializers stored in a file beside the model.
#[test]
fn external_data() {
    let d = scratch("external");
    let w: Vec<u8> = [1.0f32, -1.0, 0.5, 0.5, -2.0, 1.0]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let mut file = vec![0u8; 16];
    file.extend(&w);
    std::fs::write(d.join("weights.bin"), &file).unwrap();
    let kv = |k: &str, v: &str| StringStringEntryProto {
        key: Some(k.into()),
        value: Some(v.into()),
    };
    let external = |location: &str| TensorProto {
        name: Some("fc/w".into()),
        dims: vec![3, 2],
        data_type: Some(DataType::Float as i32),
        data_location: Some(tcc::onnx::proto::tensor_proto::DataLocation::External as i32),
        external_data: vec![
            kv("location", location),
            kv("offset", "16"),
            kv("length", "24"),
        ],
        ..Default::default()
    };
    let with = |location: &str| {
        let mut m = mlp();
        m.graph.as_mut().unwrap().initializer[0] = external(location);
        let path = d.join("m.onnx");
        std::fs::write(&path, write_model(&m)).unwrap();
        tcc::onnx::import_file(&path, &bound("x", &[2, 3]))
    };
    let m = with("weights.bin").unwrap();
    let inline = import(&write_model(&mlp()), &bound("x", &[2, 3])).unwrap();
    assert_eq!(m.to_string(), inline.to_string());

    let e = with("missing.bin").unwrap_err();
    assert!(
        e.message().contains("initializer `fc/w`: cannot open"),
        "{e}"
    );
    let e = with("../weights.bin").unwrap_err();
    assert!(
        e.message()
            .contains("must be a relative path inside the model's folder"),
        "{e}"
    );
    // From bytes, with no folder to look in.
    let mut mm = mlp();
    mm.graph.as_mut().unwrap().initializer[0] = external("weights.bin");
    let e = import(&write_model(&mm), &bound("x", &[2, 3])).unwrap_err();
    assert!(
        e.message().contains("the model was not read from a file"),
        "{e}"
    );
}

fn err(m: &ModelProto) -> String {
    import(&write_model(m), &bound("x", &[2, 3]))
        .unwrap_err()
        .message()
        .to_string()
}

#[test]
fn bad_graphs_are_errors_that_name_the_place() {
    // Missing input.
    let mut m = mlp();
    m.graph.as_mut().unwrap().node[1].input[1] = "fc/bias".into();
    assert_eq!(
        err(&m),
        "node `fc/add` (Add, opset 13): input 1 `fc/bias` is not produced by any node and is not a graph input or initializer"
    );
    // A cycle: matmul reads the relu's output.
    let mut m = mlp();
    m.graph.as_mut().unwrap().node[0].input[0] = "h".into();
    assert_eq!(
        err(&m),
        "the graph has a cycle: node `fc/matmul` (MatMul, opset 13) depends, through its inputs, on its own outputs"
    );
    // A value produced twice.
    let mut m = mlp();
    m.graph.as_mut().unwrap().node[2].output[0] = "fc/out".into();
    assert_eq!(
        err(&m),
        "value `fc/out` is produced twice: by node `fc/add` (Add, opset 13) and by node `act` (Relu, opset 13)"
    );
    // Out of order but acyclic graphs are sorted.
    let mut m = mlp();
    m.graph.as_mut().unwrap().node.reverse();
    assert!(import(&write_model(&m), &bound("x", &[2, 3])).is_ok());
    // Unsupported op.
    let mut m = mlp();
    m.graph.as_mut().unwrap().node[2].op_type = Some("NonZero".into());
    assert_eq!(
        err(&m),
        "node `act` (NonZero, opset 13): unsupported ONNX op `NonZero`"
    );
    assert!(
        import(&write_model(&m), &bound("x", &[2, 3]))
            .unwrap_err()
            .is_unsupported()
    );
    // An attribute of the wrong type.
    let mut m = mlp();
    let g = m.graph.as_mut().unwrap();
    g.node.push(node(
        "Transpose",
        "t",
        &["y"],
        &["z"],
        vec![AttributeProto {
            name: Some("perm".into()),
            r#type: Some(AttributeType::Float as i32),
            f: Some(1.0),
            ..Default::default()
        }],
    ));
    g.output[0] = value_info("z", DataType::Float, &[None]);
    assert_eq!(
        err(&m),
        "node `t` (Transpose, opset 13): attribute `perm` must be INTS, found FLOAT"
    );
    // Shapes that do not fit.
    let mut m = mlp();
    m.graph.as_mut().unwrap().initializer[0] = f32_init("fc/w", &[2, 2], &[0.0; 4]);
    let e = err(&m);
    assert!(
        e.starts_with("node `fc/matmul` (MatMul, opset 13): `matmul`: inner dims 3 != 2"),
        "{e}"
    );
    // A declared output shape that disagrees.
    let mut m = mlp();
    m.graph.as_mut().unwrap().output[0] = value_info("y", DataType::Float, &[Some(5)]);
    assert_eq!(
        err(&m),
        "graph output `y` is declared with shape [5], but tcc computes f32[4]"
    );
    // Opsets.
    let mut m = mlp();
    m.opset_import[0].version = Some(5);
    assert!(err(&m).contains("the model uses ONNX opset 5; tcc reads opset 6 and newer"));
    let mut m = mlp();
    m.opset_import.clear();
    assert!(err(&m).contains("imports no version of the default ONNX opset"));
}

/// QuantizeLinear with a per-axis scale whose length is not the axis's, or a zero point of
/// another shape than the scale's: errors naming the node.
#[test]
fn quantize_linear_parameters_that_do_not_fit_are_errors() {
    let quantize = |scale: &[i64], zero: Option<&[i64]>| {
        let mut inputs = vec![value_info("x", DataType::Float, &[Some(2), Some(3)])];
        let mut args = vec!["x", "s"];
        if let Some(z) = zero {
            let dims: Vec<Option<i64>> = z.iter().map(|&d| Some(d)).collect();
            inputs.push(value_info("z", DataType::Uint8, &dims));
            args.push("z");
        }
        let count = scale.iter().product::<i64>() as usize;
        model(
            GraphProto {
                name: Some("q".into()),
                node: vec![node("QuantizeLinear", "quant", &args, &["y"], vec![])],
                initializer: vec![f32_init("s", scale, &vec![0.5; count])],
                input: inputs,
                output: vec![value_info("y", DataType::Uint8, &[Some(2), Some(3)])],
                ..Default::default()
            },
            13,
        )
    };
    // Axis 1 has 3 elements.
    assert_eq!(
        err(&quantize(&[2], None)),
        "node `quant` (QuantizeLinear, opset 13): QuantizeLinear: 2 scales for axis 1 of 3 elements"
    );
    assert_eq!(
        err(&quantize(&[3], Some(&[2]))),
        "node `quant` (QuantizeLinear, opset 13): QuantizeLinear: the scale's shape [3] and the zero point's [2] differ"
    );
    assert!(
        import(
            &write_model(&quantize(&[3], Some(&[3]))),
            &Options::default()
        )
        .is_ok()
    );
}

#[test]
fn absurd_sizes_are_errors() {
    // Dims whose product overflows.
    let mut m = mlp();
    m.graph.as_mut().unwrap().initializer[1] = f32_init("fc/b", &[1 << 40, 1 << 40], &[]);
    let e = err(&m);
    assert!(e.contains("initializer `fc/b`"), "{e}");
    // Fits the type but not the data given.
    let mut m = mlp();
    m.graph.as_mut().unwrap().initializer[1] = f32_init("fc/b", &[1 << 30, 4], &[1.0]);
    assert_eq!(
        err(&m),
        "initializer `fc/b`: float_data holds 1 elements, but its shape [1073741824, 4] has 4294967296"
    );
    let mut m = mlp();
    m.graph.as_mut().unwrap().initializer[1] = f32_init("fc/b", &[-2], &[]);
    assert_eq!(err(&m), "initializer `fc/b` has a negative dimension -2");
    // A graph input of absurd size.
    let e = import(&write_model(&mlp()), &bound("x", &[u64::MAX, 3])).unwrap_err();
    assert!(e.message().contains("graph input `x`"), "{e}");
    // A pooling window larger than any input.
    let mut m = mlp();
    let g = m.graph.as_mut().unwrap();
    g.input[0] = value_info(
        "x",
        DataType::Float,
        &[Some(1), Some(1), Some(4), Some(4), Some(4)],
    );
    g.node = vec![node(
        "MaxPool",
        "pool",
        &["x"],
        &["y"],
        vec![ints_attr("kernel_shape", &[1 << 62, 1, 1])],
    )];
    g.initializer.clear();
    g.output[0] = value_info("y", DataType::Float, &[]);
    let e = import(&write_model(&m), &Options::default()).unwrap_err();
    assert!(
        e.message()
            .starts_with("node `pool` (MaxPool, opset 13): the window"),
        "{e}"
    );
}

/// Every prefix of a valid model, and many corrupted copies, import or fail cleanly.
#[test]
fn truncated_and_corrupted_files_never_panic() {
    let bytes = write_model(&mlp());
    let opts = bound("x", &[2, 3]);
    let mut errors = 0;
    for n in 0..bytes.len() {
        if import(&bytes[..n], &opts).is_err() {
            errors += 1;
        }
    }
    assert!(
        errors > bytes.len() / 2,
        "most prefixes are not models ({errors})"
    );
    let e = import(&bytes[..bytes.len() / 2], &opts).unwrap_err();
    assert!(
        e.message().starts_with("not a valid ONNX model (protobuf)"),
        "{e}"
    );
    // A field with the wrong wire type: ir_version (field 1, varint) as a length-delimited field.
    let e = import(&[0x0a, 0x01, 0x00], &opts).unwrap_err();
    assert!(e.message().contains("invalid wire type"), "{e}");
    let mut rng = tcc::ir::random::Rng::new(11);
    for _ in 0..2000 {
        let mut b = bytes.clone();
        for _ in 0..1 + rng.below(4) {
            let i = rng.below(b.len() as u64) as usize;
            b[i] = rng.below(256) as u8;
        }
        let _ = std::panic::catch_unwind(|| import(&b, &opts))
            .unwrap_or_else(|_| panic!("import panicked on {b:?}"));
    }
}

/// `--params` makes initializers parameters whose values travel in a weights directory beside
/// the IR; `tcc run` on that IR computes what the model computes. The shape initializer stays a
/// constant with `all` (it is not floating-point).
#[test]
fn initializers_become_parameters_with_stored_values() {
    use tcc::onnx::Params;
    let opts = |params| Options {
        params,
        ..bound("x", &[2, 3])
    };
    let m = import(&write_model(&mlp()), &opts(Params::All)).unwrap();
    let f = &m.functions[0];
    let names: Vec<&str> = f.params().iter().map(|&p| f.name(p)).collect();
    assert_eq!(names, ["x", "fc/w", "fc/b"]);
    let stored: Vec<&str> = m.weights.values.keys().map(String::as_str).collect();
    assert_eq!(stored, ["fc/b", "fc/w"]);
    let m = import(
        &write_model(&mlp()),
        &opts(Params::Names(vec!["fc/b".into()])),
    )
    .unwrap();
    let f = &m.functions[0];
    assert_eq!(f.params().len(), 2);
    // A name that is not an initializer is an error that lists them.
    let e = import(
        &write_model(&mlp()),
        &opts(Params::Names(vec!["fc/bias".into()])),
    )
    .unwrap_err()
    .to_string();
    assert_eq!(
        e,
        "--params names `fc/bias`, which is not an initializer of the model; its initializers are `fc/w`, `fc/b`, `shape`"
    );
    // An initializer that fixes a shape cannot be one.
    let e = import(
        &write_model(&mlp()),
        &opts(Params::Names(vec!["shape".into()])),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("initializer `shape` was made a parameter; leave it out of --params"),
        "{e}"
    );

    // Through the driver: import, run from the IR and its weights, and the errors.
    let d = scratch("params");
    let path = d.join("mlp.onnx");
    std::fs::write(&path, write_model(&mlp())).unwrap();
    let p = path.to_str().unwrap();
    let ir = d.join("mlp.tir");
    let ir = ir.to_str().unwrap();
    let (code, _, err) = tcc(&["import", p, "--shape", "x=4,3", "--params", "all", "-o", ir]);
    assert_eq!(code, 0, "{err}");
    let text = std::fs::read_to_string(ir).unwrap();
    assert!(
        text.starts_with(
            "weights \"mlp.weights\"\n\nfunc @main(%x: f32[4,3], %fc/w: f32[3,2], %fc/b: f32[2])"
        ),
        "{text}"
    );
    assert!(d.join("mlp.weights/fc_w.npy").exists());
    let (code, from_ir, err) = tcc(&["run", ir, "--input", "x=random:3"]);
    assert_eq!(code, 0, "{err}");
    let (code, from_onnx, err) = tcc(&["run", p, "--shape", "x=4,3", "--input", "x=random:3"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(from_ir, from_onnx);
    // Printed to stdout, the values cannot go anywhere: a note says so.
    let (code, out, err) = tcc(&["import", p, "--shape", "x=4,3", "--params", "fc/w"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with("func @main(%x: f32[4,3], %fc/w: f32[3,2])"),
        "{out}"
    );
    assert!(
        err.contains("the values of 1 parameters (`fc/w`) are not printed"),
        "{err}"
    );
    // A weights file of another model, and a missing directory.
    std::fs::write(
        d.join("mlp.weights/other.npy"),
        tcc_tools::npy::write(&Tensor::from_f32(&[1], vec![1.0]).unwrap()),
    )
    .unwrap();
    let (code, _, err) = tcc(&["run", ir]);
    assert_eq!(code, 1);
    assert!(
        err.contains("other.npy` is not the value of any parameter of this module"),
        "{err}"
    );
    std::fs::remove_dir_all(d.join("mlp.weights")).unwrap();
    let (code, _, err) = tcc(&["run", ir]);
    assert_eq!(code, 1);
    assert!(
        err.contains("weights \"mlp.weights\": cannot read the weights directory")
            && err.contains("copy it with the .tir file"),
        "{err}"
    );
    let (code, _, err) = tcc(&["import", p, "--shape", "x=4,3", "--params", "nope"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("--params names `nope`, which is not an initializer"),
        "{err}"
    );
}

/// Paddle writes an unknown dimension as -1: it is dynamic, and `--shape` binds it.
#[test]
fn a_dimension_of_minus_one_is_dynamic() {
    let mut m = mlp();
    let g = m.graph.as_mut().unwrap();
    g.input = vec![value_info("x", DataType::Float, &[Some(-1), Some(3)])];
    let bytes = write_model(&m);
    let f = import(&bytes, &bound("x", &[5, 3])).unwrap();
    assert_eq!(f.functions[0].ty(f.functions[0].params()[0]).dims(), [5, 3]);
    let e = import(&bytes, &Options::default()).unwrap_err().to_string();
    assert!(
        e.contains("graph input `x` has dynamic dimension `-1` (axis 0 of [-1,3])"),
        "{e}"
    );
}

/// Results carry the graph output names, whatever produced them: an `Identity`, a graph input
/// returned as is, one value returned twice.
#[test]
fn results_are_named_as_the_graph_outputs() {
    let m = model(
        GraphProto {
            node: vec![
                node("Relu", "act", &["x"], &["h"], vec![]),
                node("Identity", "out", &["h"], &["logits"], vec![]),
                node("Identity", "same", &["x"], &["x_again"], vec![]),
            ],
            input: vec![value_info("x", DataType::Float, &[Some(2)])],
            output: vec![
                value_info("logits", DataType::Float, &[Some(2)]),
                value_info("x_again", DataType::Float, &[Some(2)]),
                value_info("x", DataType::Float, &[Some(2)]),
                value_info("h", DataType::Float, &[Some(2)]),
            ],
            ..Default::default()
        },
        13,
    );
    let m = import(&write_model(&m), &Options::default()).unwrap();
    let f = &m.functions[0];
    let names: Vec<&str> = f.results().iter().map(|&r| f.name(r)).collect();
    assert_eq!(names, ["logits", "x_again", "x", "h"]);
    let x = Tensor::from_f32(&[2], vec![-1.0, 2.0]).unwrap();
    let got = tcc::Program::from_function(f)
        .unwrap()
        .run(std::slice::from_ref(&x))
        .unwrap();
    assert_eq!(got[0].data(), &Data::F32(vec![0.0, 2.0]));
    assert_eq!(got[1], x);
    assert_eq!(got[2], x);
    assert_eq!(got[3].data(), &Data::F32(vec![0.0, 2.0]));
}

/// `--input x=file.npy` binds a dynamic dimension without `--shape`; a file that does not fit a
/// fixed dimension is still an error.
#[test]
fn input_files_bind_dynamic_dimensions() {
    let d = scratch("input-shapes");
    let path = d.join("mlp.onnx");
    std::fs::write(&path, write_model(&mlp())).unwrap();
    let x = d.join("x.npy");
    let t = Tensor::from_f32(&[2, 3], vec![1.0, 2.0, 3.0, -1.0, 0.0, 1.0]).unwrap();
    std::fs::write(&x, tcc_tools::npy::write(&t)).unwrap();
    let spec = format!("x={}", x.display());
    let (code, out, err) = tcc(&["run", path.to_str().unwrap(), "--input", &spec]);
    assert_eq!(code, 0, "{err}");
    // The values of `imports_with_names_and_runs`: relu([-3.75, 2.75, -2.75, 1.75]).
    assert_eq!(
        out,
        "%y: f32[4]  min 0.000000  max 2.750000  mean 1.125000\n"
    );
    let bad = Tensor::from_f32(&[2, 2], vec![0.0; 4]).unwrap();
    std::fs::write(&x, tcc_tools::npy::write(&bad)).unwrap();
    let (code, _, err) = tcc(&["run", path.to_str().unwrap(), "--input", &spec]);
    assert_eq!(code, 1);
    assert!(
        err.contains("has 2 at dimension 1, but the model fixes it at 3"),
        "{err}"
    );
}

/// A small CNN as exporters write it with batch norm kept (Conv, BatchNormalization, Relu,
/// channel Slice and Concat as ShuffleNet does, a Pow/Sub normalisation, GlobalAveragePool,
/// Flatten, Gemm): `tcc run --stats` shows no op on the reference kernels.
#[test]
fn a_cnn_with_batch_norm_kept_runs_no_reference_kernel() {
    let vals = |n: usize, k: f32| {
        (0..n)
            .map(|i| ((i as f32 * 0.37 + k).sin()) * 0.5)
            .collect::<Vec<f32>>()
    };
    let pos = |n: usize| (0..n).map(|i| 0.5 + i as f32 * 0.1).collect::<Vec<f32>>();
    let i64_init = |name: &str, v: &[i64]| TensorProto {
        name: Some(name.into()),
        dims: vec![v.len() as i64],
        data_type: Some(DataType::Int64 as i32),
        int64_data: v.to_vec(),
        ..Default::default()
    };
    let m = model(
        GraphProto {
            node: vec![
                node(
                    "Conv",
                    "conv",
                    &["x", "w", "cb"],
                    &["c"],
                    vec![ints_attr("pads", &[1, 1, 1, 1])],
                ),
                node(
                    "BatchNormalization",
                    "bn",
                    &["c", "g", "b", "m", "v"],
                    &["n"],
                    vec![],
                ),
                node("Relu", "relu", &["n"], &["r"], vec![]),
                node("Slice", "left", &["r", "s0", "s2", "ax"], &["lo"], vec![]),
                node("Slice", "right", &["r", "s2", "s4", "ax"], &["hi"], vec![]),
                node(
                    "Concat",
                    "shuffle",
                    &["hi", "lo"],
                    &["cat"],
                    vec![AttributeProto {
                        name: Some("axis".into()),
                        r#type: Some(AttributeType::Int as i32),
                        i: Some(1),
                        ..Default::default()
                    }],
                ),
                node("ReduceMean", "mean", &["cat", "ax"], &["mu"], vec![]),
                node("Sub", "center", &["cat", "mu"], &["d"], vec![]),
                node("Pow", "square", &["d", "two"], &["sq"], vec![]),
                node("GlobalAveragePool", "gap", &["sq"], &["p"], vec![]),
                node("Flatten", "flat", &["p"], &["f"], vec![]),
                node(
                    "Gemm",
                    "fc",
                    &["f", "fw", "fb"],
                    &["y"],
                    vec![AttributeProto {
                        name: Some("transB".into()),
                        r#type: Some(AttributeType::Int as i32),
                        i: Some(1),
                        ..Default::default()
                    }],
                ),
            ],
            initializer: vec![
                f32_init("w", &[4, 3, 3, 3], &vals(108, 0.0)),
                f32_init("cb", &[4], &vals(4, 1.0)),
                f32_init("g", &[4], &pos(4)),
                f32_init("b", &[4], &vals(4, 2.0)),
                f32_init("m", &[4], &vals(4, 3.0)),
                f32_init("v", &[4], &pos(4)),
                i64_init("s0", &[0]),
                i64_init("s2", &[2]),
                i64_init("s4", &[4]),
                i64_init("ax", &[1]),
                f32_init("two", &[], &[2.0]),
                f32_init("fw", &[5, 4], &vals(20, 4.0)),
                f32_init("fb", &[5], &vals(5, 5.0)),
            ],
            input: vec![value_info(
                "x",
                DataType::Float,
                &[Some(2), Some(3), Some(8), Some(8)],
            )],
            output: vec![value_info("y", DataType::Float, &[Some(2), Some(5)])],
            ..Default::default()
        },
        18,
    );
    let d = scratch("bn-kept");
    let path = d.join("cnn.onnx");
    std::fs::write(&path, write_model(&m)).unwrap();
    let p = path.to_str().unwrap();
    let (code, compiled, err) = tcc(&["run", p, "--stats"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains(", 0 on reference kernels,"), "{err}");
    assert!(!err.contains("on reference kernels:"), "{err}");
    // And it computes what the interpreter computes.
    let (code, interpreted, err) = tcc(&["run", p, "--interp"]);
    assert_eq!(code, 0, "{err}");
    let num = |s: &str, key: &str| -> f64 {
        let w: Vec<&str> = s.split_whitespace().collect();
        let i = w.iter().position(|x| *x == key).unwrap();
        w[i + 1].parse().unwrap()
    };
    for key in ["min", "max", "mean"] {
        let (a, b) = (num(&compiled, key), num(&interpreted, key));
        assert!(
            (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
            "{key}: {compiled} vs {interpreted}"
        );
    }
}

/// With `--params all`, a floating-point initializer the import must know (a Resize scale) stays
/// a constant, and the weights around it become parameters.
#[test]
fn params_all_keeps_shape_deciding_initializers_constant() {
    let f = |name: &str, dims: &[i64], v: &[f32]| f32_init(name, dims, v);
    let m = model(
        GraphProto {
            node: vec![
                node("Mul", "scale", &["x", "w"], &["xw"], vec![]),
                node("Resize", "up", &["xw", "", "scales"], &["y"], vec![]),
            ],
            initializer: vec![
                f("w", &[1, 1, 2, 2], &[1.0, 2.0, 3.0, 4.0]),
                f("scales", &[4], &[1.0, 1.0, 2.0, 2.0]),
            ],
            input: vec![value_info(
                "x",
                DataType::Float,
                &[Some(1), Some(1), Some(2), Some(2)],
            )],
            output: vec![value_info(
                "y",
                DataType::Float,
                &[Some(1), Some(1), Some(4), Some(4)],
            )],
            ..Default::default()
        },
        13,
    );
    let opts = Options {
        params: tcc::onnx::Params::All,
        ..Default::default()
    };
    let m = import(&write_model(&m), &opts).unwrap();
    let f = &m.functions[0];
    let names: Vec<&str> = f.params().iter().map(|&p| f.name(p)).collect();
    assert_eq!(names, ["x", "w"]);
    let stored: Vec<&str> = m.weights.values.keys().map(String::as_str).collect();
    assert_eq!(stored, ["w"]);
}

//! ONNX ops whose node conformance cases cover few patterns, checked on more: `Einsum`
//! equations as models write them (attention, bilinear forms, three operands, implicit
//! outputs, `...`) against a direct evaluation of the sum.

mod common;
use common::onnx::{model, node, value_info};

use std::collections::HashMap;
use tcc::ir::random::{Rng, random_tensor};
use tcc::ir::{Data, Tensor, TensorType};
use tcc::onnx::proto::{
    AttributeProto, GraphProto, attribute_proto::AttributeType, tensor_proto::DataType,
};
use tcc::onnx::{Options, import, write_model};

/// `equation`'s value by its definition: every assignment of the letters, the product of the
/// operands' elements summed into the output's element. `...` is not handled here.
fn direct(equation: &str, xs: &[Tensor], out_dims: &[u64]) -> Vec<f64> {
    let (lhs, rhs) = equation.split_once("->").unwrap();
    let specs: Vec<Vec<char>> = lhs.split(',').map(|s| s.chars().collect()).collect();
    let out: Vec<char> = rhs.chars().collect();
    let mut size: HashMap<char, u64> = HashMap::new();
    for (s, x) in specs.iter().zip(xs) {
        for (&c, &d) in s.iter().zip(x.dims()) {
            size.insert(c, d);
        }
    }
    let mut letters: Vec<char> = size.keys().copied().collect();
    letters.sort_unstable();
    let total: u64 = letters.iter().map(|c| size[c]).product();
    let mut y = vec![0.0; out_dims.iter().product::<u64>() as usize];
    let flat = |s: &[char], at: &HashMap<char, u64>, dims: &[u64]| -> usize {
        s.iter()
            .zip(dims)
            .fold(0u64, |acc, (c, &d)| acc * d + at[c]) as usize
    };
    for mut k in 0..total {
        let mut at = HashMap::new();
        for &c in letters.iter().rev() {
            at.insert(c, k % size[&c]);
            k /= size[&c];
        }
        let mut p = 1.0;
        for (s, x) in specs.iter().zip(xs) {
            let Data::F32(v) = x.data() else {
                unreachable!()
            };
            p *= v[flat(s, &at, x.dims())] as f64;
        }
        y[flat(&out, &at, out_dims)] += p;
    }
    y
}

fn run_einsum(equation: &str, shapes: &[&[u64]], out_dims: &[u64]) -> (Vec<f64>, Vec<Tensor>) {
    let names: Vec<String> = (0..shapes.len()).map(|i| format!("x{i}")).collect();
    let ins: Vec<&str> = names.iter().map(String::as_str).collect();
    let attr = AttributeProto {
        name: Some("equation".into()),
        r#type: Some(AttributeType::String as i32),
        s: Some(equation.as_bytes().to_vec()),
        ..Default::default()
    };
    let g = GraphProto {
        node: vec![node("Einsum", "e", &ins, &["y"], vec![attr])],
        input: (names.iter().zip(shapes))
            .map(|(n, s)| {
                let dims: Vec<Option<i64>> = s.iter().map(|&d| Some(d as i64)).collect();
                value_info(n, DataType::Float, &dims)
            })
            .collect(),
        output: vec![value_info("y", DataType::Float, &[])],
        ..Default::default()
    };
    let mut g = g;
    g.output[0].r#type = None;
    let m = import(&write_model(&model(g, 12)), &Options::default())
        .unwrap_or_else(|e| panic!("{equation}: {e}"));
    let f = &m.functions[0];
    assert_eq!(f.ty(f.results()[0]).dims(), out_dims, "{equation}");
    let mut rng = Rng::new(3);
    let xs: Vec<Tensor> = shapes
        .iter()
        .map(|s| {
            random_tensor(
                &TensorType::new(tcc::ir::DType::F32, s.to_vec()).unwrap(),
                &mut rng,
            )
        })
        .collect();
    let got = tcc::Program::from_function(f).unwrap().run(&xs).unwrap();
    let Data::F32(v) = got[0].data() else {
        unreachable!()
    };
    (v.iter().map(|&x| x as f64).collect(), xs)
}

#[test]
fn einsum_equations_match_their_definition() {
    // Equation, operand shapes, output shape.
    type Case<'a> = (&'a str, &'a [&'a [u64]], &'a [u64]);
    let cases: [Case; 9] = [
        (
            "bhqd,bhkd->bhqk",
            &[&[2, 3, 4, 5], &[2, 3, 6, 5]],
            &[2, 3, 4, 6],
        ),
        (
            "bhqk,bhkd->bqhd",
            &[&[2, 3, 4, 6], &[2, 3, 6, 5]],
            &[2, 4, 3, 5],
        ),
        ("ij,jk,kl->il", &[&[3, 4], &[4, 5], &[5, 2]], &[3, 2]),
        ("bi,ij,bj->b", &[&[4, 3], &[3, 5], &[4, 5]], &[4]),
        ("ij->ji", &[&[3, 5]], &[5, 3]),
        ("ijk->j", &[&[2, 3, 4]], &[3]),
        ("i,j->ij", &[&[3], &[4]], &[3, 4]),
        ("nchw,oc->nohw", &[&[2, 3, 2, 2], &[5, 3]], &[2, 5, 2, 2]),
        ("abc,cd->abd", &[&[2, 1, 3], &[3, 4]], &[2, 1, 4]),
    ];
    for (eq, shapes, out) in cases {
        let (got, xs) = run_einsum(eq, shapes, out);
        let want = direct(eq, &xs, out);
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                "{eq}: element {i} is {a}, want {b}"
            );
        }
    }
    // Implicit output (letters occurring once, sorted) and `...`, against the explicit forms.
    let (a, _) = run_einsum("ij,jk", &[&[3, 4], &[4, 5]], &[3, 5]);
    let (b, _) = run_einsum("ij,jk->ik", &[&[3, 4], &[4, 5]], &[3, 5]);
    assert_eq!(a, b);
    let (a, _) = run_einsum("...ij,...jk->...ik", &[&[2, 3, 4], &[2, 4, 5]], &[2, 3, 5]);
    let (b, _) = run_einsum("bij,bjk->bik", &[&[2, 3, 4], &[2, 4, 5]], &[2, 3, 5]);
    assert_eq!(a, b);
}

/// A one-node f64 model over graph inputs `ins` (shapes), with constant initializers `consts`,
/// imported: what `gradcheck` differentiates.
fn one_node(
    op: &str,
    ins: &[(&str, &[i64])],
    consts: Vec<tcc::onnx::proto::TensorProto>,
    inputs: &[&str],
    outs: &[&str],
    attrs: Vec<AttributeProto>,
    opset: i64,
) -> tcc::ir::Function {
    let g = GraphProto {
        node: vec![node(op, "n", inputs, outs, attrs)],
        initializer: consts,
        input: (ins.iter())
            .map(|(n, d)| {
                let d: Vec<Option<i64>> = d.iter().map(|&x| Some(x)).collect();
                value_info(n, DataType::Double, &d)
            })
            .collect(),
        output: outs
            .iter()
            .map(|o| {
                let mut v = value_info(o, DataType::Double, &[]);
                v.r#type = None;
                v
            })
            .collect(),
        ..Default::default()
    };
    import(&write_model(&model(g, opset)), &Options::default())
        .unwrap_or_else(|e| panic!("{op}: {e}"))
        .functions
        .remove(0)
}

fn f64_const(name: &str, dims: &[i64], v: &[f64]) -> tcc::onnx::proto::TensorProto {
    tcc::onnx::proto::TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(DataType::Double as i32),
        double_data: v.to_vec(),
        ..Default::default()
    }
}

fn i64_const(name: &str, dims: &[i64], v: &[i64]) -> tcc::onnx::proto::TensorProto {
    tcc::onnx::proto::TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(DataType::Int64 as i32),
        int64_data: v.to_vec(),
        ..Default::default()
    }
}

/// The gradients of the composed lowerings (Resize, the loss ops, Pad's reflect mode, Einsum)
/// against central finite differences in f64.
#[test]
fn composed_lowerings_have_exact_gradients() {
    use common::onnx::{attr_i, attr_s};
    for (mode, ctm) in [
        ("linear", "half_pixel"),
        ("cubic", "align_corners"),
        ("nearest", "asymmetric"),
    ] {
        let f = one_node(
            "Resize",
            &[("x", &[1, 2, 3, 4])],
            vec![f64_const("scales", &[4], &[1.0, 1.0, 1.7, 0.6])],
            &["x", "", "scales"],
            &["y"],
            vec![
                attr_s("mode", mode),
                attr_s("coordinate_transformation_mode", ctm),
            ],
            13,
        );
        common::gradcheck(&format!("Resize {mode} {ctm}"), &f);
    }
    let sce = |reduction: &str, extra: Vec<AttributeProto>, weights: bool| {
        let mut consts = vec![i64_const("labels", &[3, 2], &[0, 3, 2, 1, 3, 0])];
        let mut ins = vec!["scores", "labels"];
        if weights {
            consts.push(f64_const("w", &[4], &[0.5, 1.0, 2.0, 1.5]));
            ins.push("w");
        }
        let mut attrs = vec![attr_s("reduction", reduction)];
        attrs.extend(extra);
        one_node(
            "SoftmaxCrossEntropyLoss",
            &[("scores", &[3, 4, 2])],
            consts,
            &ins,
            &["loss", "log_prob"],
            attrs,
            13,
        )
    };
    common::gradcheck(
        "SCE mean, weights, ignore_index",
        &sce("mean", vec![attr_i("ignore_index", 3)], true),
    );
    common::gradcheck("SCE none", &sce("none", vec![], false));
    common::gradcheck("SCE sum, weights", &sce("sum", vec![], true));
    let f = one_node(
        "Pad",
        &[("x", &[2, 3, 4])],
        vec![i64_const("pads", &[6], &[0, 2, 1, 0, 1, 3])],
        &["x", "pads"],
        &["y"],
        vec![attr_s("mode", "reflect")],
        13,
    );
    common::gradcheck("Pad reflect", &f);
    let eq = AttributeProto {
        name: Some("equation".into()),
        r#type: Some(AttributeType::String as i32),
        s: Some(b"bqd,bkd->bqk".to_vec()),
        ..Default::default()
    };
    let f = one_node(
        "Einsum",
        &[("q", &[2, 3, 4]), ("k", &[2, 5, 4])],
        vec![],
        &["q", "k"],
        &["y"],
        vec![eq],
        12,
    );
    common::gradcheck("Einsum bqd,bkd->bqk", &f);
}

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

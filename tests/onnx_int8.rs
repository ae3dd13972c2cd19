//! Quantized ONNX models written by onnxruntime's `quantize_static` (tests/data/int8/make.py: a
//! small CNN with plain, strided, depthwise and 1x1 convolutions and a matmul): its QDQ form
//! and its QOperator form, imported, optimized with the inference pipeline and compiled, against
//! onnxruntime's int8 outputs within one step of the last quantization, and run on integer
//! kernels.

mod common;

use std::path::{Path, PathBuf};
use tcc::ir::{Function, OpKind, Tensor};
use tcc::onnx::Options;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/int8")
        .join(name)
}

fn read(name: &str) -> Tensor {
    tcc_tools::npy::read(&std::fs::read(fixture(name)).unwrap()).unwrap()
}

/// The model `name`.onnx as `Program::from_onnx` prepares it.
fn optimized(name: &str) -> Function {
    let mut m = tcc::onnx::import_file(&fixture(&format!("{name}.onnx")), &Options::default())
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let pipeline = tcc::passes::Pipeline::parse(tcc::passes::INFERENCE_PIPELINE).unwrap();
    tcc::passes::PassManager::new(pipeline)
        .run(&mut m, &mut std::io::sink())
        .unwrap();
    m.functions.remove(0)
}

/// How many ops of `f` satisfy `is`.
fn count(f: &Function, is: impl Fn(&OpKind) -> bool) -> usize {
    f.schedule()
        .iter()
        .filter(|&&op| is(&f.op(op).kind))
        .count()
}

/// Runs `name` on the fixture's input and compares with onnxruntime's output.
fn matches_onnxruntime(name: &str) {
    let f = optimized(name);
    let x = read("input.npy");
    let got = tcc::Program::from_function(&f).unwrap().run(&[x]).unwrap();
    let want = read(&format!("{name}_out.npy"));
    let step = common::f64s(&read(&format!("{name}_step.npy")))[0];
    assert_eq!(got[0].ty(), want.ty(), "{name}");
    let worst = (common::f64s(&got[0]).iter())
        .zip(common::f64s(&want))
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    assert!(
        worst <= step * 1.0001,
        "{name}: differs from onnxruntime by {worst:e}, more than one step ({step:e})"
    );
}

#[test]
fn qoperator_model_matches_onnxruntime_on_integer_kernels() {
    matches_onnxruntime("qoperator");
    let f = optimized("qoperator");
    assert_eq!(count(&f, |k| matches!(k, OpKind::ConvInteger(_))), 4);
    assert_eq!(count(&f, |k| matches!(k, OpKind::MatMulInteger)), 1);
    assert_eq!(
        count(&f, |k| matches!(k, OpKind::Conv2d(_) | OpKind::MatMul)),
        0
    );
}

/// The QDQ form's convolutions and matmul run on the integer ops after the `qdq` pass (the
/// inference pipeline's first), and no float convolution or product is left.
#[test]
fn qdq_model_matches_onnxruntime_on_integer_kernels() {
    matches_onnxruntime("qdq");
    let f = optimized("qdq");
    assert_eq!(count(&f, |k| matches!(k, OpKind::ConvInteger(_))), 4);
    assert_eq!(count(&f, |k| matches!(k, OpKind::MatMulInteger)), 1);
    assert_eq!(
        count(&f, |k| matches!(k, OpKind::Conv2d(_) | OpKind::MatMul)),
        0
    );
}

//! tcc's passes and the pass manager.
//!
//! Each pass is a free function over a [`tcc_ir::Function`] (`dce`, `cse`, `canonicalize`,
//! `grad`, the optimizers)
//! wrapped by a thin [`Pass`] implementation and listed once in the registry, so that pipelines
//! written as text (`canonicalize{fold-limit=64},cse,dce`) can name it.

#![deny(missing_docs)]

pub mod analysis;
pub mod canonicalize;
pub mod cse;
pub mod dce;
pub mod eqsat;
pub mod grad;
pub mod layout;

pub mod manager;
pub mod offload;
pub mod optim;
pub mod quant;
pub mod remat;
pub mod swap;

pub use canonicalize::canonicalize;
pub use cse::cse;
pub use dce::dce;
pub use grad::{GradOptions, grad};
pub use manager::{
    Notes, Options, Pass, PassError, PassInfo, PassManager, PassRun, Pipeline, PipelineError,
    registry,
};

/// The pipeline `tcc run` and `tcc::Program::from_onnx` run before compiling, as onnxruntime
/// optimizes a graph before running it: quantized (QDQ) convolutions and products onto the
/// integer ops (before constant folding would turn quantized weights into floats), constant
/// folding and identities, batch-norm folding,
/// common subexpressions, dead code, then equality saturation with its default rule sets
/// (exact but for rounding; never estimated slower than its input). Each keeps results within
/// rounding of the original.
pub const INFERENCE_PIPELINE: &str = "qdq,canonicalize,fold-bn,cse,dce,eqsat";

use manager::OptionInfo;

/// The registry, sorted by name.
pub(crate) static REGISTRY: &[PassInfo] = &[
    PassInfo {
        name: "adam",
        summary: "turn a gradient function into an Adam train step (parameters and state in, new ones out)",
        options: optim::ADAM_OPTIONS,
        create: optim::create_adam,
    },
    PassInfo {
        name: "canonicalize",
        summary: "fold small constants and simplify identities (x*1, x+0, transpose of transpose, ...)",
        options: canonicalize::OPTIONS,
        create: canonicalize::create,
    },
    PassInfo {
        name: "cse",
        summary: "merge ops that compute the same thing from the same operands",
        options: &[] as &[OptionInfo],
        create: |_| Ok(Box::new(cse::Cse)),
    },
    PassInfo {
        name: "dce",
        summary: "remove ops whose results are never used",
        options: &[],
        create: |_| Ok(Box::new(dce::Dce)),
    },
    PassInfo {
        name: "eqsat",
        summary: "equality saturation: rewrite with named rule sets to a fixed point, keep the cheapest equivalent program",
        options: eqsat::OPTIONS,
        create: eqsat::create,
    },
    PassInfo {
        name: "fold-bn",
        summary: "fold inference batch norm and per-channel scales into the convolution or dense layer before them",
        options: quant::fold_bn::OPTIONS,
        create: quant::fold_bn::create,
    },
    PassInfo {
        name: "grad",
        summary: "reverse-mode autodiff: append d(sum of ys)/d(x) for each x to the results",
        options: grad::OPTIONS,
        create: grad::create,
    },
    PassInfo {
        name: "momentum",
        summary: "turn a gradient function into a momentum-SGD train step",
        options: optim::MOMENTUM_OPTIONS,
        create: optim::create_momentum,
    },
    PassInfo {
        name: "nchwc",
        summary: "convolutions and the elementwise ops around them on channel-blocked tensors (NCHWc), the layout CPU convolution kernels read",
        options: layout::OPTIONS,
        create: layout::create,
    },
    PassInfo {
        name: "offload",
        summary: "keep, recompute or swap each activation the backward part reads, for the least predicted step under a device-memory budget",
        options: offload::OPTIONS,
        create: offload::create,
    },
    PassInfo {
        name: "qdq",
        summary: "run convolutions and matmuls of dequantized u8/i8 operands (ONNX's QDQ form) as conv_integer/matmul_integer times one scale",
        options: &[],
        create: |_| Ok(Box::new(quant::qdq::Qdq)),
    },
    PassInfo {
        name: "quantize",
        summary: "quantization-aware training: fake-quantize conv/matmul weights and their activations (moving ranges as state)",
        options: quant::quantize::OPTIONS,
        create: quant::quantize::create,
    },
    PassInfo {
        name: "remat",
        summary: "gradient checkpointing: recompute forward values the backward pass reads from kept checkpoints",
        options: remat::OPTIONS,
        create: remat::create,
    },
    PassInfo {
        name: "sgd",
        summary: "turn a gradient function into a plain SGD train step",
        options: optim::SGD_OPTIONS,
        create: optim::create_sgd,
    },
    PassInfo {
        name: "swap",
        summary: "host-memory swapping (TFLMS): activations the backward part reads go to host memory after their last forward use and come back when a trigger op runs",
        options: swap::OPTIONS,
        create: swap::create,
    },
];

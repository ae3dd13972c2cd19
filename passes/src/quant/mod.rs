//! Batch-norm folding and quantization: the passes that replace TensorFlow's
//! `contrib.quantize` graph rewrites.
//!
//! - [`fold_bn`]: inference batch norm (and per-channel scales) folded into the convolution or
//!   dense layer before it.
//! - [`Quantize`]: fake quantization of weights and activations for quantization-aware training.

pub mod fold_bn;
pub mod quantize;

pub use fold_bn::{FoldStats, fold_bn};
pub use quantize::{Quantize, QuantizeStats};

//! Batch-norm folding and quantization: the passes that replace TensorFlow's
//! `contrib.quantize` graph rewrites.
//!
//! - [`fold_bn`]: inference batch norm (and per-channel scales) folded into the convolution or
//!   dense layer before it.

pub mod fold_bn;

pub use fold_bn::{FoldStats, fold_bn};

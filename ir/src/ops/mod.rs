//! The closed set of operations.
//!
//! [`OpKind`] is one enum, grouped by category, with each op's attributes as typed fields. What
//! is *data* about an op is written once: [`schema`] holds its mnemonic, operand and result
//! counts, category and flags; [`attrs`] declares its attribute names, types and defaults. The
//! parser, printer, mnemonic lists and the docs index derive from those. What an op *means* (type
//! rule, interpreter, gradient, kernels, cost) is an exhaustive `match` on [`OpKind`] in the
//! module that needs it, so adding an op makes the compiler point at every place that must handle
//! it. docs/adding-an-op.md is the checklist.

pub mod attrs;
pub mod schema;

pub use attrs::{AttrDefault, AttrError, AttrSpec, AttrText, AttrValue, ReadAttrs, WriteAttrs};
pub use schema::{Category, Flags, OpId, OpSchema};

use crate::literal::Literal;
use crate::types::{DType, TensorType};
use std::hash::{Hash, Hasher};

/// Elementwise unary operations (floating point unless noted).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    /// `-x` (signed integers and floats).
    Neg,
    /// `|x|` (numeric).
    Abs,
    /// `e^x`.
    Exp,
    /// Natural logarithm.
    Log,
    /// Square root.
    Sqrt,
    /// `1/sqrt(x)`.
    Rsqrt,
    /// `1/x`.
    Reciprocal,
    /// Hyperbolic tangent.
    Tanh,
    /// `1/(1+e^-x)`.
    Sigmoid,
    /// `max(x, 0)` (numeric).
    Relu,
    /// The error function.
    Erf,
    /// Exact GELU, `x * (1 + erf(x/sqrt 2)) / 2`.
    Gelu,
    /// The largest integer not above `x` (floats; gradient zero).
    Floor,
    /// The smallest integer not below `x` (floats; gradient zero).
    Ceil,
    /// The nearest integer, ties to even (floats; gradient zero).
    Round,
}

/// Elementwise binary operations with numpy broadcasting; both operands have the same dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
    /// `a / b` (integers: truncating; division by zero is an error at run time).
    Div,
    /// `a ^ b` (floats only).
    Pow,
    /// Elementwise maximum.
    Max,
    /// Elementwise minimum.
    Min,
}

/// Elementwise comparisons with numpy broadcasting, producing `bool`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CmpOp {
    /// `a == b`.
    Eq,
    /// `a != b`.
    Ne,
    /// `a < b`.
    Lt,
    /// `a <= b`.
    Le,
    /// `a > b`.
    Gt,
    /// `a >= b`.
    Ge,
}

/// Reductions over a set of axes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Arithmetic mean (floats only).
    Mean,
    /// Maximum.
    Max,
}

/// An `f64` attribute compared and hashed by bit pattern.
#[derive(Clone, Copy, Debug)]
pub struct F64(pub f64);

impl PartialEq for F64 {
    fn eq(&self, o: &F64) -> bool {
        self.0.to_bits() == o.0.to_bits()
    }
}
impl Eq for F64 {}
impl Hash for F64 {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.to_bits().hash(state)
    }
}

/// Attributes of `conv2d`. Input is NCHW, filter is `[O, C/groups, kH, kW]`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Conv2d {
    /// Stride along H and W. Default `[1,1]`.
    pub strides: [u64; 2],
    /// Zero padding `[top, left, bottom, right]`. Default `[0,0,0,0]`.
    pub pads: [u64; 4],
    /// Dilation along H and W. Default `[1,1]`.
    pub dilations: [u64; 2],
    /// Number of groups; `groups == C == O` is depthwise. Default 1.
    pub groups: u64,
}

impl Default for Conv2d {
    fn default() -> Conv2d {
        Conv2d {
            strides: [1, 1],
            pads: [0; 4],
            dilations: [1, 1],
            groups: 1,
        }
    }
}

/// Window attributes of `max_pool2d` and `avg_pool2d` over NCHW input.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Pool2d {
    /// Window size along H and W (required).
    pub kernel: [u64; 2],
    /// Stride along H and W. Default `[1,1]`.
    pub strides: [u64; 2],
    /// Padding `[top, left, bottom, right]`. Default `[0,0,0,0]`.
    pub pads: [u64; 4],
}

/// The operation an op performs, with its attributes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    // --- Sources ---
    /// A constant of the given type. No operands.
    Const {
        /// The result type.
        ty: TensorType,
        /// The elements.
        value: Literal,
    },

    // --- Elementwise ---
    /// `op(x)`.
    Unary(UnaryOp),
    /// `op(a, b)` with broadcasting.
    Binary(BinaryOp),
    /// `a cmp b` with broadcasting, producing `bool`.
    Compare(CmpOp),
    /// `select(cond, a, b)`: `a` where `cond` else `b`, all three broadcast together.
    Select,
    /// Broadcasts the operand to `shape` by numpy rules.
    BroadcastTo {
        /// The target shape.
        shape: Vec<u64>,
    },
    /// Converts the element type (floats to ints truncate toward zero, saturating).
    Cast {
        /// The target element type.
        to: DType,
    },
    /// The operand unchanged; autodiff treats it as a constant.
    StopGradient,
    /// The operand unchanged.
    Identity,
    /// `(x, min, max) -> y`: `x` rounded to the `2^bits` (or, narrow, `2^bits - 1`) levels of
    /// `[min, max]` nudged so that zero is one of them, as TensorFlow's
    /// `fake_quant_with_min_max_vars`; `min` and `max` broadcast to `x` (scalars per tensor,
    /// `[C, 1, 1]` per channel).
    FakeQuant {
        /// Bits, 2 to 16.
        bits: u64,
        /// Levels `1..2^bits - 1` instead of `0..2^bits - 1` (symmetric weights).
        narrow: bool,
    },
    /// ONNX's `QuantizeLinear`: `(x, scale, zero_point)`, `x / scale` rounded half to even,
    /// plus the zero point, saturated to the zero point's dtype (`u8` or `i8`); NaN gives the
    /// zero point. `scale` (positive, finite) and `zero_point` have one shape, which
    /// broadcasts to `x`'s: one pair for the tensor, or one per channel (`[C, 1, 1]` for axis 1
    /// of NCHW activations, `[O, 1, 1, 1]` for a filter's output channels).
    QuantizeLinear,
    /// ONNX's `DequantizeLinear`: `(q, scale, zero_point)`, `(q - zero_point) * scale`, in the
    /// scale's float dtype; shapes as for `quantize_linear`.
    DequantizeLinear,

    // --- Linear algebra and convolution ---
    /// Batched matrix product: `[..., m, k] x [..., k, n] -> [..., m, n]`, batch dims broadcast.
    MatMul,
    /// ONNX's `MatMulInteger`: `(a, b, a_zero, b_zero)`, `(a - a_zero) x (b - b_zero)` of `u8`
    /// or `i8` operands, accumulated in `i32` (wrapping). `a_zero` broadcasts to `a` (a scalar,
    /// or `[m, 1]` per row), `b_zero` to `b` (a scalar, or `[n]` per column).
    MatMulInteger,
    /// 2-D convolution (really cross-correlation), NCHW.
    Conv2d(Conv2d),
    /// ONNX's `ConvInteger`: `(x, w, x_zero, w_zero)`, `conv2d` of `u8` or `i8` operands less
    /// their zero points, accumulated in `i32` (wrapping). `x_zero` is a scalar; `w_zero` a
    /// scalar or one per output channel (`[O, 1, 1, 1]`). Padding stands for `x_zero`, so it
    /// adds nothing.
    ConvInteger(Conv2d),
    /// `conv2d` on channel-blocked tensors (NCHWc): `(x, w) -> y` where `x` is
    /// `[N, ceil(C/block), H, W, block]` (or plain `[N, C, H, W]`), `w` the plain filter
    /// `[O, C/groups, kH, kW]` and `y` is `to_nchwc(conv2d(x, w))`, `[N, ceil(O/block), oH, oW,
    /// block]`. Padding lanes of `x` are never read; those of `y` are zero.
    Conv2dNchwc {
        /// The convolution.
        conv: Conv2d,
        /// Channels per block.
        block: u64,
    },

    // --- Pooling ---
    /// Max over windows; padding never wins.
    MaxPool2d(Pool2d),
    /// Mean over windows.
    AvgPool2d {
        /// The window.
        pool: Pool2d,
        /// Whether padded positions count in the divisor. Default `false`.
        count_include_pad: bool,
    },
    /// Mean over H and W: `[N,C,H,W] -> [N,C,1,1]`.
    GlobalAvgPool,

    // --- Reductions and normalisation ---
    /// Reduces `axes` (negative counts from the end).
    Reduce {
        /// Which reduction.
        op: ReduceOp,
        /// Axes to reduce, non-empty and distinct.
        axes: Vec<i64>,
        /// Whether reduced axes stay as size 1. Default `false`.
        keepdims: bool,
    },
    /// Softmax along `axis` (default -1).
    Softmax {
        /// The axis.
        axis: i64,
    },
    /// Log of softmax along `axis` (default -1), computed stably.
    LogSoftmax {
        /// The axis.
        axis: i64,
    },
    /// Mean cross-entropy of `logits [N, C]` against integer `labels [N]`: a scalar.
    SoftmaxCrossEntropy,
    /// The `k` largest (or smallest) elements along `axis`, sorted, and their indices (`i64`):
    /// `x -> (values, indices)`. Equal values keep their order (lower index first); NaN counts
    /// as larger than every number.
    TopK {
        /// How many.
        k: u64,
        /// The axis (default -1).
        axis: i64,
        /// Largest (default) or smallest first.
        largest: bool,
    },
    /// Inference batch norm: `(x, gamma, beta, mean, var) -> y`, channels on axis 1.
    BatchNorm {
        /// Added to the variance. Default `1e-5`.
        eps: F64,
    },
    /// Training batch norm: `(x, gamma, beta) -> (y, batch_mean, batch_var)`; the variance is the
    /// biased one used for normalisation.
    BatchNormTrain {
        /// Added to the variance. Default `1e-5`.
        eps: F64,
    },

    // --- Data movement ---
    /// Same elements, new shape.
    Reshape {
        /// The new shape; same element count.
        shape: Vec<u64>,
    },
    /// Permutes axes: output axis `i` is input axis `perm[i]`.
    Transpose {
        /// A permutation of `0..rank`.
        perm: Vec<u64>,
    },
    /// Joins one or more operands along `axis`.
    Concat {
        /// The axis.
        axis: i64,
    },
    /// Channels in blocks: `[N, C, d...] -> [N, ceil(C/block), d..., block]`, the block
    /// innermost (the NCHWc layout of convolution kernels), the last block zero-padded.
    ToNchwc {
        /// Channels per block.
        block: u64,
    },
    /// The inverse of `to_nchwc`: `[N, Cb, d..., b] -> [N, channels, d...]`; the padding
    /// lanes of the last block are dropped.
    FromNchwc {
        /// The channels, `ceil(channels / b) == Cb`.
        channels: u64,
    },
    /// Python-style strided slice of every axis (negative indices count from the end; out of
    /// range bounds are clamped).
    Slice {
        /// Start per axis.
        starts: Vec<i64>,
        /// End (exclusive) per axis.
        ends: Vec<i64>,
        /// Step per axis, non-zero. Default all 1.
        steps: Vec<i64>,
    },
    /// `take(data, indices, axis)`: output shape is
    /// `data[..axis] ++ indices ++ data[axis+1..]`. Out of range indices are a run-time error.
    Gather {
        /// The axis of `data` indexed.
        axis: i64,
    },
    /// The operand copied out to host memory: its result lives in the host space, outside the
    /// device's memory, and only `swap_in` reads it (the verifier checks).
    SwapOut,
    /// A host value (a `swap_out`'s result) copied back into device memory.
    SwapIn,
    /// `(data, indices, updates)`: a copy of `data` where `updates` (shaped like the result of
    /// `gather(data, indices, axis)`) is added at the indexed positions; repeats accumulate.
    ScatterAdd {
        /// The axis of `data` indexed.
        axis: i64,
    },

    // --- Gradients (what `grad` emits where no composition of the ops above is good enough) ---
    /// Gradient of `conv2d` with respect to its input: `(dy, filter) -> dx`, where `dx` has
    /// `shape` and `conv2d(dx, filter)` would have `dy`'s shape (a transposed convolution).
    Conv2dGradInput {
        /// The forward convolution.
        conv: Conv2d,
        /// The forward input's shape `[N, C, H, W]`.
        shape: Vec<u64>,
    },
    /// Gradient of `conv2d` with respect to its filter: `(x, dy) -> dw`, where `dw` has `shape`.
    Conv2dGradFilter {
        /// The forward convolution.
        conv: Conv2d,
        /// The filter's shape `[O, C/groups, kH, kW]`.
        shape: Vec<u64>,
    },
    /// Gradient of `softmax_cross_entropy` with respect to the logits, fused and stable:
    /// `(logits [N, C], labels [N], dy []) -> (softmax(logits) - onehot(labels)) * dy / N`.
    SoftmaxCrossEntropyGrad,
    /// Gradient of `max_pool2d`: `(x, dy) -> dx`; each window's gradient goes to the first
    /// (row-major) position holding its maximum.
    MaxPool2dGrad(Pool2d),
    /// Gradient of `avg_pool2d`: `(dy) -> dx`, each window's gradient spread evenly over the
    /// positions its divisor counts.
    AvgPool2dGrad {
        /// The window.
        pool: Pool2d,
        /// As in the forward op.
        count_include_pad: bool,
        /// The forward input's shape.
        shape: Vec<u64>,
    },
    /// Gradient of `slice`: `(dy) -> dx`, zeros of `shape` with `dy` at the positions `slice`
    /// reads.
    SliceGrad {
        /// The forward input's shape.
        shape: Vec<u64>,
        /// As in the forward op.
        starts: Vec<i64>,
        /// As in the forward op.
        ends: Vec<i64>,
        /// As in the forward op.
        steps: Vec<i64>,
    },
}

/// How many operands an op takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arity {
    /// Exactly this many.
    Exactly(usize),
    /// This many or more.
    AtLeast(usize),
}

impl Arity {
    /// Whether `n` operands are acceptable.
    pub fn accepts(self, n: usize) -> bool {
        match self {
            Arity::Exactly(k) => n == k,
            Arity::AtLeast(k) => n >= k,
        }
    }
}

impl std::fmt::Display for Arity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Arity::Exactly(1) => write!(f, "1 operand"),
            Arity::Exactly(k) => write!(f, "{k} operands"),
            Arity::AtLeast(k) => write!(f, "at least {k} operand{}", if k == 1 { "" } else { "s" }),
        }
    }
}

impl UnaryOp {
    /// Every unary op.
    pub const ALL: [UnaryOp; 15] = [
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Sqrt,
        UnaryOp::Rsqrt,
        UnaryOp::Reciprocal,
        UnaryOp::Tanh,
        UnaryOp::Sigmoid,
        UnaryOp::Relu,
        UnaryOp::Erf,
        UnaryOp::Gelu,
        UnaryOp::Floor,
        UnaryOp::Ceil,
        UnaryOp::Round,
    ];

    /// Text mnemonic.
    pub fn mnemonic(self) -> &'static str {
        self.id().mnemonic()
    }
}

impl BinaryOp {
    /// Every binary op.
    pub const ALL: [BinaryOp; 7] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Pow,
        BinaryOp::Max,
        BinaryOp::Min,
    ];

    /// Text mnemonic.
    pub fn mnemonic(self) -> &'static str {
        self.id().mnemonic()
    }
}

impl CmpOp {
    /// Every comparison.
    pub const ALL: [CmpOp; 6] = [
        CmpOp::Eq,
        CmpOp::Ne,
        CmpOp::Lt,
        CmpOp::Le,
        CmpOp::Gt,
        CmpOp::Ge,
    ];

    /// Text mnemonic.
    pub fn mnemonic(self) -> &'static str {
        self.id().mnemonic()
    }
}

impl ReduceOp {
    /// Every reduction.
    pub const ALL: [ReduceOp; 3] = [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max];

    /// Text mnemonic.
    pub fn mnemonic(self) -> &'static str {
        self.id().mnemonic()
    }
}

/// Every mnemonic in the IR, in table order.
pub fn all_mnemonics() -> Vec<&'static str> {
    OpId::ALL.iter().map(|id| id.mnemonic()).collect()
}

impl OpKind {
    /// The scalar value if this is a constant whose elements are all equal.
    pub fn splat_value(&self) -> Option<crate::literal::Scalar> {
        match self {
            OpKind::Const { value, .. } => value.as_splat(),
            _ => None,
        }
    }
}

/// Resolves a possibly negative `axis` against `rank`; `None` if out of range.
pub fn normalize_axis(axis: i64, rank: usize) -> Option<usize> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    (0..r).contains(&a).then_some(a as usize)
}

//! The op table: every op's mnemonic, operand and result counts, category and flags, written
//! once.
//!
//! `define_ops!` turns one line per op into [`OpId`] (a flat, `Copy` name for each op, the
//! families such as [`UnaryOp`] spread out) and its [`OpSchema`]. The parser looks mnemonics up
//! here, the printer and diagnostics spell them from here, and docs/ir.md's op index is generated
//! from here (with the attributes [`super::attrs`] declares). What an op *means* (type rule,
//! interpreter, gradient, kernels, cost) is not in the table: those are exhaustive `match`es on
//! [`OpKind`], so adding a line here makes the compiler list every place still to write.
//! docs/adding-an-op.md walks through it.

use super::{Arity, BinaryOp, CmpOp, Conv2d, F64, OpKind, Pool2d, ReduceOp, UnaryOp};
use crate::literal::{Literal, Scalar};
use crate::types::{DType, TensorType};

/// Properties of an op that passes and backends ask about without matching on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Flags(u8);

impl Flags {
    /// No flag.
    pub const NONE: Flags = Flags(0);
    /// Each output element depends only on the same-index elements of the broadcast operands.
    pub const ELEMENTWISE: Flags = Flags(1);
    /// `grad` propagates a gradient through the op to at least one floating-point operand.
    pub const DIFFERENTIABLE: Flags = Flags(2);
    /// Running the op does something besides computing its results (a copy between memory
    /// spaces, say): `dce` and `cse` keep it and never merge two of them.
    pub const SIDE_EFFECTS: Flags = Flags(4);

    /// Both sets of flags.
    pub const fn union(self, o: Flags) -> Flags {
        Flags(self.0 | o.0)
    }

    /// Whether every flag of `o` is set.
    pub const fn contains(self, o: Flags) -> bool {
        self.0 & o.0 == o.0
    }

    /// The flags' names, for the docs index.
    pub fn names(self) -> Vec<&'static str> {
        [
            (Flags::ELEMENTWISE, "elementwise"),
            (Flags::DIFFERENTIABLE, "differentiable"),
            (Flags::SIDE_EFFECTS, "side effects"),
        ]
        .into_iter()
        .filter(|&(f, _)| self.contains(f))
        .map(|(_, n)| n)
        .collect()
    }
}

/// The section of docs/ir.md an op belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Category {
    /// Ops with no operands.
    Source,
    /// Elementwise ops, broadcasts and casts.
    Elementwise,
    /// Matrix products and convolution.
    LinearAlgebra,
    /// Pooling windows.
    Pooling,
    /// Reductions, softmax, losses and normalisation.
    Reduction,
    /// Reshapes, permutations, slices, gathers.
    DataMovement,
    /// The ops `grad` emits.
    Gradient,
}

impl Category {
    /// The heading used in the docs index.
    pub fn title(self) -> &'static str {
        match self {
            Category::Source => "Sources",
            Category::Elementwise => "Elementwise",
            Category::LinearAlgebra => "Linear algebra and convolution",
            Category::Pooling => "Pooling",
            Category::Reduction => "Reductions and normalisation",
            Category::DataMovement => "Data movement",
            Category::Gradient => "Gradients",
        }
    }
}

/// One line of the op table.
#[derive(Clone, Copy, Debug)]
pub struct OpSchema {
    /// The op.
    pub id: OpId,
    /// Its text mnemonic.
    pub mnemonic: &'static str,
    /// How many operands it takes.
    pub arity: Arity,
    /// How many results it produces.
    pub results: usize,
    /// Where docs/ir.md lists it.
    pub category: Category,
    /// What passes may assume about it.
    pub flags: Flags,
    /// One line for the docs index.
    pub summary: &'static str,
}

/// Defines [`OpId`], its table and the mnemonic lookup from one line per op:
/// `Name "mnemonic" arity results Category [FLAG FLAG] "summary";`.
macro_rules! define_ops {
    ($( $id:ident $mn:literal $arity:expr, $results:literal, $cat:ident [$($flag:ident)*] $summary:literal; )*) => {
        /// Every op of the IR by name: the families of [`OpKind`] ([`UnaryOp`] and the others)
        /// spread out, one variant per mnemonic. [`OpKind::id`] maps an op to it.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum OpId {
            $(
                #[doc = $summary]
                $id,
            )*
        }

        impl OpId {
            /// Every op, in table order.
            pub const ALL: &'static [OpId] = &[$(OpId::$id),*];

            /// The op spelled `mnemonic`, if there is one.
            pub fn from_mnemonic(mnemonic: &str) -> Option<OpId> {
                match mnemonic {
                    $($mn => Some(OpId::$id),)*
                    _ => None,
                }
            }
        }

        static SCHEMAS: &[OpSchema] = &[$(
            OpSchema {
                id: OpId::$id,
                mnemonic: $mn,
                arity: { use Arity::*; $arity },
                results: $results,
                category: Category::$cat,
                flags: Flags::NONE $(.union(Flags::$flag))*,
                summary: $summary,
            },
        )*];
    };
}

define_ops! {
    Const "const" Exactly(0), 1, Source [] "a constant; `value` is a splat or one element per position";

    Neg "neg" Exactly(1), 1, Elementwise [ELEMENTWISE DIFFERENTIABLE] "`-x` (signed integers and floats)";
    Abs "abs" Exactly(1), 1, Elementwise [ELEMENTWISE DIFFERENTIABLE] "absolute value";
    Exp "exp" Exactly(1), 1, Elementwise [ELEMENTWISE DIFFERENTIABLE] "`e^x`";
    Log "log" Exactly(1), 1, Elementwise [ELEMENTWISE DIFFERENTIABLE] "natural logarithm";
    Sqrt "sqrt" Exactly(1), 1, Elementwise [ELEMENTWISE DIFFERENTIABLE] "square root";
    Rsqrt "rsqrt" Exactly(1), 1, Elementwise [ELEMENTWISE DIFFERENTIABLE] "`1/sqrt(x)`";
    Reciprocal "reciprocal" Exactly(1), 1, Elementwise [ELEMENTWISE DIFFERENTIABLE] "`1/x`";
    Tanh "tanh" Exactly(1), 1, Elementwise [ELEMENTWISE DIFFERENTIABLE] "hyperbolic tangent";
    Sigmoid "sigmoid" Exactly(1), 1, Elementwise [ELEMENTWISE DIFFERENTIABLE] "`1/(1+e^-x)`";
    Relu "relu" Exactly(1), 1, Elementwise [ELEMENTWISE DIFFERENTIABLE] "`max(x, 0)`";
    Erf "erf" Exactly(1), 1, Elementwise [ELEMENTWISE DIFFERENTIABLE] "the error function";
    Gelu "gelu" Exactly(1), 1, Elementwise [ELEMENTWISE DIFFERENTIABLE] "exact GELU, `x * (1 + erf(x/sqrt 2)) / 2`";
    Floor "floor" Exactly(1), 1, Elementwise [ELEMENTWISE] "round down to an integer (floats)";
    Ceil "ceil" Exactly(1), 1, Elementwise [ELEMENTWISE] "round up to an integer (floats)";
    Round "round" Exactly(1), 1, Elementwise [ELEMENTWISE] "round to the nearest integer, ties to even (floats)";
    Add "add" Exactly(2), 1, Elementwise [ELEMENTWISE DIFFERENTIABLE] "`a + b`, broadcasting";
    Sub "sub" Exactly(2), 1, Elementwise [ELEMENTWISE DIFFERENTIABLE] "`a - b`, broadcasting";
    Mul "mul" Exactly(2), 1, Elementwise [ELEMENTWISE DIFFERENTIABLE] "`a * b`, broadcasting";
    Div "div" Exactly(2), 1, Elementwise [ELEMENTWISE DIFFERENTIABLE] "`a / b`, broadcasting (integers truncate)";
    Pow "pow" Exactly(2), 1, Elementwise [ELEMENTWISE DIFFERENTIABLE] "`a ^ b`, broadcasting (floats)";
    Max "max" Exactly(2), 1, Elementwise [ELEMENTWISE DIFFERENTIABLE] "elementwise maximum, broadcasting";
    Min "min" Exactly(2), 1, Elementwise [ELEMENTWISE DIFFERENTIABLE] "elementwise minimum, broadcasting";
    Eq "eq" Exactly(2), 1, Elementwise [ELEMENTWISE] "`a == b` as `bool`, broadcasting";
    Ne "ne" Exactly(2), 1, Elementwise [ELEMENTWISE] "`a != b` as `bool`, broadcasting";
    Lt "lt" Exactly(2), 1, Elementwise [ELEMENTWISE] "`a < b` as `bool`, broadcasting";
    Le "le" Exactly(2), 1, Elementwise [ELEMENTWISE] "`a <= b` as `bool`, broadcasting";
    Gt "gt" Exactly(2), 1, Elementwise [ELEMENTWISE] "`a > b` as `bool`, broadcasting";
    Ge "ge" Exactly(2), 1, Elementwise [ELEMENTWISE] "`a >= b` as `bool`, broadcasting";
    Select "select" Exactly(3), 1, Elementwise [ELEMENTWISE DIFFERENTIABLE] "`a` where `cond` else `b`, broadcasting";
    BroadcastTo "broadcast_to" Exactly(1), 1, Elementwise [DIFFERENTIABLE] "broadcasts to `shape` by numpy rules";
    Cast "cast" Exactly(1), 1, Elementwise [ELEMENTWISE DIFFERENTIABLE] "converts the element type";
    StopGradient "stop_gradient" Exactly(1), 1, Elementwise [ELEMENTWISE] "the operand; `grad` treats it as a constant";
    Identity "identity" Exactly(1), 1, Elementwise [ELEMENTWISE DIFFERENTIABLE] "the operand unchanged";
    FakeQuant "fake_quant" Exactly(3), 1, Elementwise [ELEMENTWISE DIFFERENTIABLE] "`(x, min, max)`: `x` rounded to the levels of a nudged `[min, max]`, TensorFlow's fake quantization";
    QuantizeLinear "quantize_linear" Exactly(3), 1, Elementwise [ELEMENTWISE] "`(x, scale, zero_point)`: `x / scale` rounded half to even, plus the zero point, saturated to `u8` or `i8` (ONNX's QuantizeLinear)";
    DequantizeLinear "dequantize_linear" Exactly(3), 1, Elementwise [ELEMENTWISE] "`(q, scale, zero_point)`: `(q - zero_point) * scale` (ONNX's DequantizeLinear)";

    MatMul "matmul" Exactly(2), 1, LinearAlgebra [DIFFERENTIABLE] "batched matrix product, batch dims broadcast";
    MatMulInteger "matmul_integer" Exactly(4), 1, LinearAlgebra [] "`(a, b, a_zero, b_zero)`: `(a - a_zero) x (b - b_zero)` of u8/i8 matrices in i32 (ONNX's MatMulInteger)";
    Conv2d "conv2d" Exactly(2), 1, LinearAlgebra [DIFFERENTIABLE] "2-D cross-correlation, NCHW, filter `[O, C/groups, kH, kW]`";
    ConvInteger "conv_integer" Exactly(4), 1, LinearAlgebra [] "`(x, w, x_zero, w_zero)`: `conv2d` of u8/i8 tensors less their zero points in i32 (ONNX's ConvInteger)";
    Conv2dNchwc "conv2d_nchwc" Exactly(2), 1, LinearAlgebra [DIFFERENTIABLE] "`conv2d` from and to channel-blocked tensors `[N, C/b, H, W, b]`";

    MaxPool2d "max_pool2d" Exactly(1), 1, Pooling [DIFFERENTIABLE] "maximum over windows; padding never wins";
    AvgPool2d "avg_pool2d" Exactly(1), 1, Pooling [DIFFERENTIABLE] "mean over windows";
    GlobalAvgPool "global_avg_pool" Exactly(1), 1, Pooling [DIFFERENTIABLE] "mean over H and W: `[N,C,H,W] -> [N,C,1,1]`";

    ReduceSum "reduce_sum" Exactly(1), 1, Reduction [DIFFERENTIABLE] "sum over `axes`";
    ReduceMean "reduce_mean" Exactly(1), 1, Reduction [DIFFERENTIABLE] "mean over `axes` (floats)";
    ReduceMax "reduce_max" Exactly(1), 1, Reduction [DIFFERENTIABLE] "maximum over `axes`";
    Softmax "softmax" Exactly(1), 1, Reduction [DIFFERENTIABLE] "softmax along `axis`";
    LogSoftmax "log_softmax" Exactly(1), 1, Reduction [DIFFERENTIABLE] "log of softmax along `axis`, computed stably";
    SoftmaxCrossEntropy "softmax_cross_entropy" Exactly(2), 1, Reduction [DIFFERENTIABLE] "mean cross-entropy of `logits [N,C]` against `labels [N]`";
    TopK "top_k" Exactly(1), 2, Reduction [DIFFERENTIABLE] "the `k` largest (or smallest) along `axis`, sorted, and their `i64` indices";
    BatchNorm "batch_norm" Exactly(5), 1, Reduction [DIFFERENTIABLE] "inference batch norm `(x, gamma, beta, mean, var) -> y`";
    BatchNormTrain "batch_norm_train" Exactly(3), 3, Reduction [DIFFERENTIABLE] "training batch norm `(x, gamma, beta) -> (y, mean, var)`";

    Reshape "reshape" Exactly(1), 1, DataMovement [DIFFERENTIABLE] "same elements, new shape";
    Transpose "transpose" Exactly(1), 1, DataMovement [DIFFERENTIABLE] "permutes axes: output axis `i` is input axis `perm[i]`";
    Concat "concat" AtLeast(1), 1, DataMovement [DIFFERENTIABLE] "joins operands along `axis`";
    ToNchwc "to_nchwc" Exactly(1), 1, DataMovement [DIFFERENTIABLE] "channels in blocks: `[N, C, d...] -> [N, ceil(C/b), d..., b]`";
    FromNchwc "from_nchwc" Exactly(1), 1, DataMovement [DIFFERENTIABLE] "channels out of blocks: `[N, Cb, d..., b] -> [N, channels, d...]`";
    Slice "slice" Exactly(1), 1, DataMovement [DIFFERENTIABLE] "Python-style strided slice of every axis";
    Gather "gather" Exactly(2), 1, DataMovement [DIFFERENTIABLE] "`take(data, indices, axis)`";
    ScatterAdd "scatter_add" Exactly(3), 1, DataMovement [DIFFERENTIABLE] "a copy of `data` with `updates` added at `indices` along `axis`";
    SwapOut "swap_out" Exactly(1), 1, DataMovement [DIFFERENTIABLE] "the operand copied to host memory; only `swap_in` reads the result";
    SwapIn "swap_in" Exactly(1), 1, DataMovement [DIFFERENTIABLE] "a `swap_out`'s host value copied back to device memory";

    Conv2dGradInput "conv2d_grad_input" Exactly(2), 1, Gradient [DIFFERENTIABLE] "`(dy, filter) -> dx` of `conv2d` (a transposed convolution)";
    Conv2dGradFilter "conv2d_grad_filter" Exactly(2), 1, Gradient [DIFFERENTIABLE] "`(x, dy) -> dw` of `conv2d`";
    SoftmaxCrossEntropyGrad "softmax_cross_entropy_grad" Exactly(3), 1, Gradient [DIFFERENTIABLE] "`(logits, labels, dy) -> dlogits`, fused and stable";
    MaxPool2dGrad "max_pool2d_grad" Exactly(2), 1, Gradient [DIFFERENTIABLE] "`(x, dy) -> dx` of `max_pool2d`";
    AvgPool2dGrad "avg_pool2d_grad" Exactly(1), 1, Gradient [DIFFERENTIABLE] "`(dy) -> dx` of `avg_pool2d`";
    SliceGrad "slice_grad" Exactly(1), 1, Gradient [DIFFERENTIABLE] "`(dy) -> dx` of `slice`: zeros with `dy` where `slice` reads";
}

impl OpId {
    /// The op's line of the table.
    pub fn schema(self) -> &'static OpSchema {
        &SCHEMAS[self as usize]
    }

    /// The text mnemonic.
    pub fn mnemonic(self) -> &'static str {
        self.schema().mnemonic
    }

    /// The op with every attribute at a placeholder (required attributes empty, the others at
    /// whatever value): what the parser fills in with [`OpKind::read_attrs`]. A `const` takes
    /// its type from `ty`.
    pub fn blank(self, ty: &TensorType) -> OpKind {
        use OpKind as K;
        let pool = || Pool2d {
            kernel: [0; 2],
            strides: [1; 2],
            pads: [0; 4],
        };
        let eps = F64(0.0);
        match self {
            OpId::Const => K::Const {
                ty: ty.clone(),
                value: Literal::Splat(Scalar::from_f64(ty.dtype(), 0.0)),
            },
            OpId::Neg => K::Unary(UnaryOp::Neg),
            OpId::Abs => K::Unary(UnaryOp::Abs),
            OpId::Exp => K::Unary(UnaryOp::Exp),
            OpId::Log => K::Unary(UnaryOp::Log),
            OpId::Sqrt => K::Unary(UnaryOp::Sqrt),
            OpId::Rsqrt => K::Unary(UnaryOp::Rsqrt),
            OpId::Reciprocal => K::Unary(UnaryOp::Reciprocal),
            OpId::Tanh => K::Unary(UnaryOp::Tanh),
            OpId::Sigmoid => K::Unary(UnaryOp::Sigmoid),
            OpId::Relu => K::Unary(UnaryOp::Relu),
            OpId::Erf => K::Unary(UnaryOp::Erf),
            OpId::Gelu => K::Unary(UnaryOp::Gelu),
            OpId::Floor => K::Unary(UnaryOp::Floor),
            OpId::Ceil => K::Unary(UnaryOp::Ceil),
            OpId::Round => K::Unary(UnaryOp::Round),
            OpId::Add => K::Binary(BinaryOp::Add),
            OpId::Sub => K::Binary(BinaryOp::Sub),
            OpId::Mul => K::Binary(BinaryOp::Mul),
            OpId::Div => K::Binary(BinaryOp::Div),
            OpId::Pow => K::Binary(BinaryOp::Pow),
            OpId::Max => K::Binary(BinaryOp::Max),
            OpId::Min => K::Binary(BinaryOp::Min),
            OpId::Eq => K::Compare(CmpOp::Eq),
            OpId::Ne => K::Compare(CmpOp::Ne),
            OpId::Lt => K::Compare(CmpOp::Lt),
            OpId::Le => K::Compare(CmpOp::Le),
            OpId::Gt => K::Compare(CmpOp::Gt),
            OpId::Ge => K::Compare(CmpOp::Ge),
            OpId::Select => K::Select,
            OpId::BroadcastTo => K::BroadcastTo { shape: Vec::new() },
            OpId::Cast => K::Cast { to: DType::F32 },
            OpId::StopGradient => K::StopGradient,
            OpId::Identity => K::Identity,
            OpId::MatMul => K::MatMul,
            OpId::MatMulInteger => K::MatMulInteger,
            OpId::Conv2d => K::Conv2d(Conv2d::default()),
            OpId::ConvInteger => K::ConvInteger(Conv2d::default()),
            OpId::Conv2dNchwc => K::Conv2dNchwc {
                conv: Conv2d::default(),
                block: 0,
            },
            OpId::MaxPool2d => K::MaxPool2d(pool()),
            OpId::AvgPool2d => K::AvgPool2d {
                pool: pool(),
                count_include_pad: false,
            },
            OpId::GlobalAvgPool => K::GlobalAvgPool,
            OpId::ReduceSum | OpId::ReduceMean | OpId::ReduceMax => K::Reduce {
                op: match self {
                    OpId::ReduceSum => ReduceOp::Sum,
                    OpId::ReduceMean => ReduceOp::Mean,
                    _ => ReduceOp::Max,
                },
                axes: Vec::new(),
                keepdims: false,
            },
            OpId::Softmax => K::Softmax { axis: 0 },
            OpId::LogSoftmax => K::LogSoftmax { axis: 0 },
            OpId::SoftmaxCrossEntropy => K::SoftmaxCrossEntropy,
            OpId::FakeQuant => K::FakeQuant {
                bits: 8,
                narrow: false,
            },
            OpId::QuantizeLinear => K::QuantizeLinear,
            OpId::DequantizeLinear => K::DequantizeLinear,
            OpId::TopK => K::TopK {
                k: 0,
                axis: -1,
                largest: true,
            },
            OpId::BatchNorm => K::BatchNorm { eps },
            OpId::BatchNormTrain => K::BatchNormTrain { eps },
            OpId::Reshape => K::Reshape { shape: Vec::new() },
            OpId::Transpose => K::Transpose { perm: Vec::new() },
            OpId::Concat => K::Concat { axis: 0 },
            OpId::ToNchwc => K::ToNchwc { block: 0 },
            OpId::FromNchwc => K::FromNchwc { channels: 0 },
            OpId::Slice => K::Slice {
                starts: Vec::new(),
                ends: Vec::new(),
                steps: Vec::new(),
            },
            OpId::Gather => K::Gather { axis: 0 },
            OpId::ScatterAdd => K::ScatterAdd { axis: 0 },
            OpId::SwapOut => K::SwapOut,
            OpId::SwapIn => K::SwapIn,
            OpId::Conv2dGradInput => K::Conv2dGradInput {
                conv: Conv2d::default(),
                shape: Vec::new(),
            },
            OpId::Conv2dGradFilter => K::Conv2dGradFilter {
                conv: Conv2d::default(),
                shape: Vec::new(),
            },
            OpId::SoftmaxCrossEntropyGrad => K::SoftmaxCrossEntropyGrad,
            OpId::MaxPool2dGrad => K::MaxPool2dGrad(pool()),
            OpId::AvgPool2dGrad => K::AvgPool2dGrad {
                pool: pool(),
                count_include_pad: false,
                shape: Vec::new(),
            },
            OpId::SliceGrad => K::SliceGrad {
                shape: Vec::new(),
                starts: Vec::new(),
                ends: Vec::new(),
                steps: Vec::new(),
            },
        }
    }
}

impl UnaryOp {
    /// The op's name in the table.
    pub fn id(self) -> OpId {
        match self {
            UnaryOp::Neg => OpId::Neg,
            UnaryOp::Abs => OpId::Abs,
            UnaryOp::Exp => OpId::Exp,
            UnaryOp::Log => OpId::Log,
            UnaryOp::Sqrt => OpId::Sqrt,
            UnaryOp::Rsqrt => OpId::Rsqrt,
            UnaryOp::Reciprocal => OpId::Reciprocal,
            UnaryOp::Tanh => OpId::Tanh,
            UnaryOp::Sigmoid => OpId::Sigmoid,
            UnaryOp::Relu => OpId::Relu,
            UnaryOp::Erf => OpId::Erf,
            UnaryOp::Gelu => OpId::Gelu,
            UnaryOp::Floor => OpId::Floor,
            UnaryOp::Ceil => OpId::Ceil,
            UnaryOp::Round => OpId::Round,
        }
    }
}

impl BinaryOp {
    /// The op's name in the table.
    pub fn id(self) -> OpId {
        match self {
            BinaryOp::Add => OpId::Add,
            BinaryOp::Sub => OpId::Sub,
            BinaryOp::Mul => OpId::Mul,
            BinaryOp::Div => OpId::Div,
            BinaryOp::Pow => OpId::Pow,
            BinaryOp::Max => OpId::Max,
            BinaryOp::Min => OpId::Min,
        }
    }
}

impl CmpOp {
    /// The op's name in the table.
    pub fn id(self) -> OpId {
        match self {
            CmpOp::Eq => OpId::Eq,
            CmpOp::Ne => OpId::Ne,
            CmpOp::Lt => OpId::Lt,
            CmpOp::Le => OpId::Le,
            CmpOp::Gt => OpId::Gt,
            CmpOp::Ge => OpId::Ge,
        }
    }
}

impl ReduceOp {
    /// The op's name in the table.
    pub fn id(self) -> OpId {
        match self {
            ReduceOp::Sum => OpId::ReduceSum,
            ReduceOp::Mean => OpId::ReduceMean,
            ReduceOp::Max => OpId::ReduceMax,
        }
    }
}

impl OpKind {
    /// The op's name in the table.
    pub fn id(&self) -> OpId {
        match self {
            OpKind::Const { .. } => OpId::Const,
            OpKind::Unary(u) => u.id(),
            OpKind::Binary(b) => b.id(),
            OpKind::Compare(c) => c.id(),
            OpKind::Select => OpId::Select,
            OpKind::BroadcastTo { .. } => OpId::BroadcastTo,
            OpKind::Cast { .. } => OpId::Cast,
            OpKind::StopGradient => OpId::StopGradient,
            OpKind::Identity => OpId::Identity,
            OpKind::MatMul => OpId::MatMul,
            OpKind::MatMulInteger => OpId::MatMulInteger,
            OpKind::Conv2d(_) => OpId::Conv2d,
            OpKind::ConvInteger(_) => OpId::ConvInteger,
            OpKind::Conv2dNchwc { .. } => OpId::Conv2dNchwc,
            OpKind::MaxPool2d(_) => OpId::MaxPool2d,
            OpKind::AvgPool2d { .. } => OpId::AvgPool2d,
            OpKind::GlobalAvgPool => OpId::GlobalAvgPool,
            OpKind::Reduce { op, .. } => op.id(),
            OpKind::Softmax { .. } => OpId::Softmax,
            OpKind::LogSoftmax { .. } => OpId::LogSoftmax,
            OpKind::SoftmaxCrossEntropy => OpId::SoftmaxCrossEntropy,
            OpKind::FakeQuant { .. } => OpId::FakeQuant,
            OpKind::QuantizeLinear => OpId::QuantizeLinear,
            OpKind::DequantizeLinear => OpId::DequantizeLinear,
            OpKind::TopK { .. } => OpId::TopK,
            OpKind::BatchNorm { .. } => OpId::BatchNorm,
            OpKind::BatchNormTrain { .. } => OpId::BatchNormTrain,
            OpKind::Reshape { .. } => OpId::Reshape,
            OpKind::Transpose { .. } => OpId::Transpose,
            OpKind::Concat { .. } => OpId::Concat,
            OpKind::ToNchwc { .. } => OpId::ToNchwc,
            OpKind::FromNchwc { .. } => OpId::FromNchwc,
            OpKind::Slice { .. } => OpId::Slice,
            OpKind::Gather { .. } => OpId::Gather,
            OpKind::ScatterAdd { .. } => OpId::ScatterAdd,
            OpKind::SwapOut => OpId::SwapOut,
            OpKind::SwapIn => OpId::SwapIn,
            OpKind::Conv2dGradInput { .. } => OpId::Conv2dGradInput,
            OpKind::Conv2dGradFilter { .. } => OpId::Conv2dGradFilter,
            OpKind::SoftmaxCrossEntropyGrad => OpId::SoftmaxCrossEntropyGrad,
            OpKind::MaxPool2dGrad(_) => OpId::MaxPool2dGrad,
            OpKind::AvgPool2dGrad { .. } => OpId::AvgPool2dGrad,
            OpKind::SliceGrad { .. } => OpId::SliceGrad,
        }
    }

    /// The op's line of the table.
    pub fn schema(&self) -> &'static OpSchema {
        self.id().schema()
    }

    /// The text mnemonic.
    pub fn mnemonic(&self) -> &'static str {
        self.schema().mnemonic
    }

    /// How many operands the op takes.
    pub fn arity(&self) -> Arity {
        self.schema().arity
    }

    /// How many results the op produces.
    pub fn num_results(&self) -> usize {
        self.schema().results
    }

    /// Whether the op is elementwise (each output element depends only on the same-index
    /// elements of the broadcast operands).
    pub fn is_elementwise(&self) -> bool {
        self.schema().flags.contains(Flags::ELEMENTWISE)
    }

    /// Whether `grad` propagates gradients through the op (`const`, `stop_gradient` and the
    /// comparisons block them).
    pub fn is_differentiable(&self) -> bool {
        self.schema().flags.contains(Flags::DIFFERENTIABLE)
    }

    /// Whether the op does something besides computing its results, so that it must not be
    /// removed or merged with another.
    pub fn has_side_effects(&self) -> bool {
        self.schema().flags.contains(Flags::SIDE_EFFECTS)
    }

    /// Whether the op copies between memory spaces (`swap_out`, `swap_in`): where it sits in
    /// the schedule is the point of it, so passes neither merge it with another nor move or
    /// recompute it (it may still be removed when nothing reads it).
    pub fn is_swap(&self) -> bool {
        matches!(self, OpKind::SwapOut | OpKind::SwapIn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_indexed_by_id_and_mnemonics_are_unique() {
        for (i, s) in SCHEMAS.iter().enumerate() {
            assert_eq!(s.id as usize, i, "{} is out of place", s.mnemonic);
            assert_eq!(OpId::from_mnemonic(s.mnemonic), Some(s.id));
        }
    }

    #[test]
    fn family_lists_hold_every_member() {
        // The random generator and the gradient checks draw from these lists.
        let ty = TensorType::new(DType::F32, vec![2]).unwrap();
        for &id in OpId::ALL {
            let listed = match id.blank(&ty) {
                OpKind::Unary(u) => UnaryOp::ALL.contains(&u),
                OpKind::Binary(b) => BinaryOp::ALL.contains(&b),
                OpKind::Compare(c) => CmpOp::ALL.contains(&c),
                OpKind::Reduce { op, .. } => ReduceOp::ALL.contains(&op),
                _ => true,
            };
            assert!(
                listed,
                "`{}` is missing from its family's ALL list",
                id.mnemonic()
            );
        }
    }

    #[test]
    fn blank_ops_map_back_to_their_id() {
        let ty = TensorType::new(DType::F32, vec![2]).unwrap();
        for &id in OpId::ALL {
            let k = id.blank(&ty);
            assert_eq!(k.id(), id);
        }
    }
}

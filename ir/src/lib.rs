//! tcc's SSA tensor IR.
//!
//! A [`Module`] holds [`Function`]s; a function owns [`Op`]s and [`Value`]s in arenas, with a
//! schedule (the order ops run in), typed parameters and results. Every value has a
//! [`TensorType`] and a human name with `/` scopes. The text format is the source of truth:
//! [`parse_module`] reads exactly what `Display` writes. [`verify_function`] checks the
//! invariants; [`edit`] is the graph-editing toolkit and [`builder`] the Rust construction API.
//!
//! ```
//! let src = "func @f(%x: f32[2,3]) -> (f32[2,3]) {\n  %y = relu %x : f32[2,3]\n  return %y\n}\n";
//! let m = tcc_ir::parse_module(src).unwrap();
//! tcc_ir::verify_module(&m).unwrap();
//! assert_eq!(m.to_string(), src);
//! ```

#![deny(missing_docs)]

pub mod builder;
pub mod diag;
pub mod edit;
pub mod function;
pub mod interp;
pub mod literal;
pub mod ops;
pub mod parser;
pub mod printer;
pub mod random;
pub mod tensor;
pub mod types;
pub mod typing;
pub mod verify;

pub use builder::FunctionBuilder;
pub use diag::{Diagnostic, Diagnostics};
pub use function::{Function, Module, Op, OpData, SrcLoc, Value, ValueData, ValueDef, Weights};
pub use literal::{Data, Literal, Scalar};
pub use ops::{BinaryOp, CmpOp, Conv2d, OpKind, Pool2d, ReduceOp, UnaryOp};
pub use parser::{parse_bytes, parse_function, parse_module};
pub use tensor::{Tensor, TensorRef};
pub use types::{DType, Shape, TensorType};
pub use verify::{verify_function, verify_module};

//! tcc, a tensor compiler.
//!
//! This facade re-exports the IR ([`ir`]), the passes ([`passes`]) and kernel and memory
//! planning ([`codegen`]). A function can be
//! written as text or built in Rust, verified, and transformed by a textual pipeline:
//!
//! ```
//! use tcc::ir::{parse_module, verify_module};
//! use tcc::passes::{PassManager, Pipeline};
//!
//! let mut m = parse_module(
//!     "func @f(%x: f32[4]) -> (f32[4]) {
//!        %one = const {value=1.0} : f32[]
//!        %y = mul %x, %one : f32[4]
//!        %z = relu %y : f32[4]
//!        return %z
//!      }",
//! )
//! .unwrap();
//! verify_module(&m).unwrap();
//! let pm = PassManager::new(Pipeline::parse("canonicalize,cse,dce").unwrap());
//! pm.run(&mut m, &mut std::io::sink()).unwrap();
//! assert_eq!(m.num_ops(), 1); // only the relu is left
//! ```

#![deny(missing_docs)]

pub use tcc_codegen as codegen;
pub use tcc_ir as ir;
pub use tcc_passes as passes;

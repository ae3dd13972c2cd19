//! tcc's code generation layer: kernel planning and memory planning, shared by both backends.
//!
//! [`plan::plan`] cuts a function into kernels (fused elementwise regions, reductions and
//! softmax-like rows with their prologues and epilogues, library calls with epilogues);
//! [`memory::plan_memory`] places every stored value in one arena. The Cranelift JIT and the PTX
//! emitter consume both.

#![deny(missing_docs)]

pub mod cpu;
pub mod memory;
pub mod plan;

pub use cpu::{CompileError, Executable, RunError, Stats};
pub use memory::{MemoryPlan, Storage, plan_memory, write_memory};
pub use plan::{Kernel, KernelData, KernelKind, Plan, plan, write_plan};

//! tcc's code generation layer: kernel planning and memory planning, shared by both backends.
//!
//! [`plan::plan`] cuts a function into kernels (fused elementwise regions, reductions and
//! softmax-like rows with their prologues and epilogues, library calls with epilogues);
//! [`memory::plan_memory`] places every stored value in one arena, asking the [`Backend`] how much
//! scratch each kernel needs; the backend then compiles the planned function ([`compile`]). The
//! CPU backend ([`cpu::Cpu`]) renders loops with Cranelift.

#![deny(missing_docs)]

pub mod backend;
pub mod cpu;
pub mod kernel;
pub mod memory;
pub mod plan;
pub mod ptx;

pub use backend::{Backend, CompileError, Profile, RunError, compile};
pub use cpu::{Copying, Cpu, Executable, Features, Layout, Stats, VectorWidth, with_threads};
pub use memory::{MemoryPlan, Storage, plan_memory, write_memory};
pub use plan::{Kernel, KernelData, KernelKind, Plan, plan, write_plan};

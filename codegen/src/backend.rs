//! What a backend is to the rest of code generation.
//!
//! Planning is target-independent: [`crate::plan()`] cuts a function into kernels and
//! [`crate::memory`] places values in one arena. The one thing planning asks a backend is how
//! much scratch space a kernel needs while it runs (the CPU's im2col columns, say). A backend
//! then compiles the planned function and runs what it compiled. [`compile`] strings the steps
//! together; [`crate::cpu::Cpu`] is the first backend.

use crate::memory::{MemoryPlan, plan_memory};
use crate::plan::{KernelData, Plan, plan};
use std::borrow::Cow;
use std::fmt;
use tcc_ir::{Function, Tensor};

/// A function could not be compiled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompileError(pub String);

impl fmt::Display for CompileError {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CompileError {}

/// A compiled function could not be run on the given inputs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunError(pub String);

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RunError {}

/// A code generator for one kind of machine.
pub trait Backend {
    /// A compiled function, ready to run many times.
    type Compiled;

    /// Rewrites `f` (which verifies) into the form this backend's kernels prefer before it is
    /// planned, such as the CPU's channel-blocked convolutions; by default `f` as it is. The
    /// result must compute the same values and verify.
    fn prepare<'f>(&self, f: &'f Function) -> Result<Cow<'f, Function>, CompileError> {
        Ok(Cow::Borrowed(f))
    }

    /// `plan` with the kernels this backend runs as one step merged ([`Plan::merged`]), so
    /// that values passed between them are never stored, or split where it can only run
    /// their ops one at a time ([`Plan::split`]), before memory is planned; by default the
    /// plan as it is.
    fn fuse(&self, _f: &Function, plan: Plan) -> Plan {
        plan
    }

    /// Bytes of scratch space kernel `kd` of `f` needs while it runs. The memory plan sets them
    /// aside in the arena (a slot with `scratch_for` set), live during that kernel only.
    fn scratch_bytes(&self, f: &Function, kd: &KernelData) -> u64;

    /// Compiles `f` (which verifies), cut into kernels by `plan`, with storage from `mem`, which
    /// was planned with this backend's [`scratch_bytes`](Backend::scratch_bytes).
    fn compile(
        &self,
        f: &Function,
        plan: Plan,
        mem: MemoryPlan,
    ) -> Result<Self::Compiled, CompileError>;

    /// Runs `exe` on `inputs` (one per parameter, of its type) and returns the results.
    fn run(&self, exe: &Self::Compiled, inputs: &[Tensor]) -> Result<Vec<Tensor>, RunError>;
}

/// Verifies `f`, prepares it for `backend` ([`Backend::prepare`]), plans its kernels and memory
/// there, and compiles it.
pub fn compile<B: Backend>(backend: &B, f: &Function) -> Result<B::Compiled, CompileError> {
    tcc_ir::verify_function(f)
        .map_err(|d| CompileError(format!("the function does not verify:\n{d}")))?;
    let f = backend.prepare(f)?;
    if cfg!(debug_assertions) {
        tcc_ir::verify_function(&f).map_err(|d| {
            CompileError(format!(
                "internal error: the backend's rewrite broke the function:\n{d}"
            ))
        })?;
    }
    let f = f.as_ref();
    let plan = backend.fuse(f, plan(f));
    let mem = plan_memory(f, &plan, backend);
    backend.compile(f, plan, mem)
}

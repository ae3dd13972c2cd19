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
use std::time::Duration;
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

/// Where a compiled function's time went: each step's total over all runs so far, largest
/// first. The CPU's [`Executable::profile`](crate::Executable::profile) makes one when
/// profiling was asked for at compile time, a GPU module's `Loaded::profile` (`--features
/// cuda`) by timing each launch; its `Display` is the table `tcc run --profile` prints.
#[derive(Clone, Debug)]
pub struct Profile {
    /// The function's name.
    pub function: String,
    /// The runs timed.
    pub runs: u32,
    /// Each step's time over all runs and its description (`jit`, `library`, ... or the GPU
    /// kernel's name, the plan kernel, then its first op: `matmul : f32[4,16] %y`), largest
    /// first.
    pub steps: Vec<(Duration, String)>,
}

impl fmt::Display for Profile {
    /// The time per run, then the 25 largest steps (all with `{:#}`), each with its time per run
    /// and share.
    fn fmt(&self, out: &mut fmt::Formatter) -> fmt::Result {
        let runs = f64::from(self.runs.max(1));
        let total: f64 = self.steps.iter().map(|(t, _)| t.as_secs_f64()).sum();
        writeln!(
            out,
            "profile of @{} over {} run{}: {:.3} ms per run in {} steps",
            self.function,
            self.runs,
            if self.runs == 1 { "" } else { "s" },
            total * 1e3 / runs,
            self.steps.len()
        )?;
        let shown = if out.alternate() {
            self.steps.len()
        } else {
            25
        };
        for (t, what) in self.steps.iter().take(shown) {
            let t = t.as_secs_f64();
            writeln!(
                out,
                "  {:>9.3} ms {:>5.1}%  {what}",
                t * 1e3 / runs,
                100.0 * t / total.max(1e-12)
            )?;
        }
        Ok(())
    }
}

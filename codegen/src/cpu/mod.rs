//! The CPU backend: compile a function once, run it many times.
//!
//! [`Executable::compile`] plans kernels and memory, JIT-compiles every kernel the Cranelift
//! code generator supports (fused elementwise `f32` kernels, softmax rows and reductions, see
//! `jit/`), calls tuned library code for matmuls and convolutions, and materialises constants.
//! Kernels it does not compile yet run through the reference interpreter's kernels on the same
//! arena, so every function runs; [`Executable::stats`] says how many of each there are.
//!
//! Each [`Executable::run`] checks its inputs against the parameters, takes an arena of the
//! planned size (reused from an earlier run when one is free, so concurrent runs never share one),
//! runs the steps in order and copies the results out. Executables are
//! `Send + Sync`: compiled code and constants are immutable, and runs share nothing else.
//!
//! The rooms, each with one job:
//! - `lower.rs`: the step each kernel runs as (JIT loop, library call, native kernel, reference);
//! - `jit/`, `render.rs`, `target.rs`: Cranelift loops around kernel bodies (from
//!   [`crate::kernel`]), the bodies' instructions, and the ISA they target;
//! - `matmul.rs` and `sgemm/`, `conv/`, `native/`: library and hand-written kernels; `post/`:
//!   epilogues a kernel applies in registers as it stores;
//! - `runtime.rs`: running the steps on a pooled arena, and the profile; `pool.rs`: the threads
//!   parallel steps run on, which spin between steps;
//! - `bytes.rs`: aligned buffers and tensors as bytes; `send_ptr.rs`: pointers across threads;
//!   `simd.rs`: AVX2 pieces several kernels share.

mod accuracy;
mod bytes;
mod conv;
mod copies;
mod jit;
mod lower;
mod matmul;
mod native;
mod pool;
mod post;
mod render;
mod runtime;
mod send_ptr;
mod sgemm;
mod simd;
mod target;

pub use accuracy::max_ulp_error;
pub use pool::with_threads;
pub use target::{Features, VectorWidth};

use crate::backend::{Backend, CompileError, RunError, compile};
use crate::memory::MemoryPlan;
use crate::plan::{Kernel, KernelData, KernelKind, Plan};
use bytes::Line;
use lower::Step;
use std::borrow::Cow;
use std::collections::HashMap;
use tcc_ir::{Function, Tensor, Value};

/// The CPU backend and its options.
#[derive(Clone, Debug, Default)]
pub struct Cpu {
    /// A target spec: `host` or the host's triple, optionally followed by CPU features to turn
    /// off, as in `host,-fma,-avx2` (see `tcc run --target`); `None` is the host with every
    /// feature it has.
    pub target: Option<String>,
    /// Whether runs time each step, for [`Executable::profile`].
    pub profile: bool,
    /// The layout convolutions' tensors are kept in (see [`Backend::prepare`] for this
    /// backend).
    pub layout: Layout,
    /// The vector width of the library kernels.
    pub vector_width: VectorWidth,
    /// With swaps: the bandwidth of the simulated link between the arena ("device" memory)
    /// and the host pool, in bytes per second (a step that needs a copy waits until the copy
    /// would have crossed the link, the copies crossing one after another); `None` copies as
    /// fast as memory does.
    pub link_bandwidth: Option<f64>,
    /// Which thread makes the swaps' copies.
    pub copies: Copying,
}

/// Which thread makes the swaps' copies (a step that needs one waits for it either way, and
/// for the simulated link's time with [`Cpu::link_bandwidth`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Copying {
    /// The copy thread where a core is left for it beside the compute threads, else inline:
    /// on two cores with two compute threads a third thread preempts a compute thread, and
    /// every parallel step waits for the one descheduled (a step of the benchmark's chain
    /// took 23 ms swapping against 17 ms not; with one compute thread, 24.6 against 25.0).
    #[default]
    Auto,
    /// The copy thread, beside the steps, as a GPU's copy engine beside its compute stream.
    Thread,
    /// The step that issues the copy makes it before the next step runs.
    Inline,
}

impl Cpu {
    /// The features compiled code may use: the target's, with the library kernels' width.
    pub fn features(&self) -> Result<Features, String> {
        Ok(Features::of(self.target.as_deref())?.with_width(self.vector_width))
    }
}

/// The layout the CPU backend keeps convolutions' tensors in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Layout {
    /// The backend's choice: today channel-blocked (NCHWc) wherever the target has AVX2 and
    /// FMA, AVX-512 included. The blocked kernels have eight lanes against the AVX-512 im2col
    /// GEMM's sixteen, but gather no panels: on a Zen 4 EPYC with AVX-512 they run resnet18
    /// in 15 ms against 25 ms, mobilenet_v2 in 4.8 against 7.0 (docs/perf.md).
    #[default]
    Auto,
    /// Channel-blocked wherever the target has the blocked kernels (AVX2 and FMA).
    Blocked,
    /// The function's own tensors: convolutions as im2col and GEMM.
    Plain,
}

impl std::str::FromStr for Layout {
    type Err = String;

    fn from_str(s: &str) -> Result<Layout, String> {
        match s {
            "auto" => Ok(Layout::Auto),
            "blocked" => Ok(Layout::Blocked),
            "plain" => Ok(Layout::Plain),
            _ => Err(format!(
                "unknown layout `{s}`; the layouts are auto, blocked and plain"
            )),
        }
    }
}

impl Backend for Cpu {
    type Compiled = Executable;

    /// Inference functions with `f32` convolutions are rewritten to channel-blocked tensors
    /// (`tcc_passes::layout`, blocks of eight channels) as [`Cpu::layout`] asks: by default
    /// when the target has AVX2 and FMA. Training functions (with a backward part) are left as
    /// they are.
    fn prepare<'f>(&self, f: &'f Function) -> Result<Cow<'f, Function>, CompileError> {
        let features = self.features().map_err(CompileError)?;
        let has_conv = (f.schedule().iter()).any(|&op| {
            let d = f.op(op);
            matches!(d.kind, tcc_ir::OpKind::Conv2d(_))
                && f.ty(d.results[0]).dtype() == tcc_ir::DType::F32
        });
        let kernels = features.avx2 && features.fma;
        let blocked = match self.layout {
            Layout::Auto | Layout::Blocked => kernels,
            Layout::Plain => false,
        };
        if !blocked || !has_conv {
            return Ok(Cow::Borrowed(f));
        }
        let mut g = f.clone();
        tcc_passes::layout::nchwc(&mut g, 8).map_err(CompileError)?;
        Ok(Cow::Owned(g))
    }

    fn scratch_bytes(&self, f: &Function, kd: &KernelData) -> u64 {
        conv::scratch_bytes(f, kd)
    }

    /// Merges runs of reductions over rows and the ops between them into row passes
    /// ([`crate::kernel::rows::group`]), and each depthwise convolution with the 1x1
    /// convolution that alone reads its output, where the pair runs fused (`conv::fusible`).
    fn fuse(&self, f: &Function, plan: Plan) -> Plan {
        let plan = crate::kernel::rows::group(f, plan);
        let users = tcc_ir::edit::Users::new(f);
        // Integer convolutions take the requantizing ops after them (on every target).
        let vnni = self.features().is_ok_and(|t| native::vnni(&t));
        let moves = native::requant_moves(f, &users, &plan, vnni);
        let plan = if moves.is_empty() {
            plan
        } else {
            plan.moved(f, &moves)
        };
        let usable = self.features().is_ok_and(|t| t.avx2 && t.fma);
        if !usable {
            return plan;
        }
        let ks: Vec<(Kernel, &KernelData)> = plan.kernels.iter().collect();
        let absorbed: Vec<Kernel> = (ks.windows(2))
            .filter(|p| conv::fusible(f, &users, p[0].1, p[1].1))
            .map(|p| p[1].0)
            .collect();
        if absorbed.is_empty() {
            return plan;
        }
        plan.merged(f, &absorbed)
    }

    fn compile(
        &self,
        f: &Function,
        plan: Plan,
        mem: MemoryPlan,
    ) -> Result<Executable, CompileError> {
        lower::compile(self, f, plan, mem)
    }

    fn run(&self, exe: &Executable, inputs: &[Tensor]) -> Result<Vec<Tensor>, RunError> {
        exe.run(inputs)
    }
}

/// A compiled function.
pub struct Executable {
    func: Function,
    plan: Plan,
    mem: MemoryPlan,
    /// The kernels that do work, in order, and how each runs.
    steps: Vec<(Kernel, Step)>,
    /// The value whose storage each value uses (itself, or a view's source).
    origin: HashMap<Value, Value>,
    consts: HashMap<Value, Vec<Line>>,
    /// For each step, the swap steps whose copies it waits for (see `lower::copy_waits`).
    waits: Vec<Vec<usize>>,
    /// As [`Cpu::link_bandwidth`].
    link_bandwidth: Option<f64>,
    /// As [`Cpu::copies`].
    copying: Copying,
    /// Arenas (and host pools) of finished runs, reused by later ones (one per concurrent run
    /// at most).
    arenas: std::sync::Mutex<Vec<(Vec<Line>, Vec<Line>)>>,
    /// With [`Cpu::profile`]: the runs so far and the time spent in each step over them.
    profile: Option<std::sync::Mutex<(u32, Vec<std::time::Duration>)>>,
    _code: jit::Code,
}

/// How a compiled function's kernels run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stats {
    /// Kernels compiled to machine code.
    pub compiled: usize,
    /// Single ops run by hand-written kernels.
    pub native: usize,
    /// Kernels run by the reference kernels.
    pub reference: usize,
    /// View kernels (no work).
    pub views: usize,
    /// Kernels none of whose results are used (skipped).
    pub dead: usize,
    /// Arena bytes per run.
    pub arena_bytes: u64,
    /// Bytes of results written straight into the returned tensors, per run.
    pub output_bytes: u64,
    /// Host pool bytes per run (swapped-out values; 0 without swaps).
    pub host_bytes: u64,
}

impl Executable {
    /// Compiles `f`, which must verify, for the host CPU with every feature it has.
    pub fn compile(f: &Function) -> Result<Executable, CompileError> {
        compile(&Cpu::default(), f)
    }

    /// Compiles `f` for a target spec (see [`Cpu::target`]).
    pub fn compile_for(f: &Function, target: Option<&str>) -> Result<Executable, CompileError> {
        let cpu = Cpu {
            target: target.map(str::to_string),
            ..Cpu::default()
        };
        compile(&cpu, f)
    }

    /// How the kernels run, and the arena size.
    pub fn stats(&self) -> Stats {
        let count = |pred: fn(&Step) -> bool| self.steps.iter().filter(|(_, s)| pred(s)).count();
        Stats {
            compiled: count(|s| matches!(s, Step::Jit(_) | Step::Library { .. })),
            native: count(|s| matches!(s, Step::Native(_) | Step::Swap { .. })),
            reference: count(|s| matches!(s, Step::Reference)),
            dead: self
                .plan
                .kernels
                .values()
                .filter(|k| k.outputs.is_empty())
                .count(),
            views: self
                .plan
                .kernels
                .values()
                .filter(|k| k.kind == KernelKind::View)
                .count(),
            arena_bytes: self.mem.arena_bytes,
            output_bytes: self.mem.output_bytes,
            host_bytes: self.mem.host_bytes,
        }
    }

    /// The mnemonics of the ops in kernels that run on the reference kernels, in order.
    pub fn reference_ops(&self) -> Vec<&'static str> {
        self.steps
            .iter()
            .filter_map(|(k, s)| match s {
                Step::Reference => Some(&self.plan.kernels[*k].ops),
                _ => None,
            })
            .flatten()
            .map(|&op| self.func.op(op).kind.mnemonic())
            .collect()
    }

    /// The compiled function.
    pub fn function(&self) -> &Function {
        &self.func
    }
}

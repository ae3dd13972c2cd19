//! The CPU backend: compile a function once, run it many times.
//!
//! [`Executable::compile`] plans kernels and memory, JIT-compiles every kernel the Cranelift
//! code generator supports (today: fused elementwise `f32` kernels, see [`jit`]) and materialises
//! constants. Kernels it does not compile yet run through the reference interpreter's kernels on
//! the same arena, so every function runs; [`Executable::stats`] says how many of each there are.
//!
//! Each [`Executable::run`] checks its inputs against the parameters, allocates its own arena of
//! the planned size, runs the steps in order and copies the results out. Executables are
//! `Send + Sync`: compiled code and constants are immutable, and runs share nothing else.

mod jit;

use crate::memory::{MemoryPlan, Storage, plan_memory};
use crate::plan::{Kernel, KernelKind, Plan, plan};
use cranelift_jit::{JITBuilder, JITModule};
use std::collections::HashMap;
use std::fmt;
use tcc_ir::interp::{check_inputs, eval_op};
use tcc_ir::{DType, Data, Function, OpKind, Tensor, TensorType, Value, ValueDef};

/// A function that could not be compiled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompileError(pub String);

impl fmt::Display for CompileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CompileError {}

/// A run that failed: bad inputs, or a run-time error in an op.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunError(pub String);

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RunError {}

/// 64 bytes, 64-byte aligned: the unit of every buffer the runtime allocates.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// Zeroed, 64-byte-aligned storage of at least `bytes` bytes.
fn lines(bytes: u64) -> Vec<Line> {
    vec![Line([0; 64]); bytes.div_ceil(64) as usize]
}

/// Owns the JIT's code memory.
struct Code(Option<JITModule>);

// SAFETY: after `finalize_definitions` the module is never used again except to free its memory
// on drop; the code it owns is immutable and safe to call from any thread.
unsafe impl Send for Code {}
unsafe impl Sync for Code {}

impl Drop for Code {
    fn drop(&mut self) {
        if let Some(m) = self.0.take() {
            // SAFETY: the function pointers into this memory live in the same `Executable` and
            // are dropped with it.
            unsafe { m.free_memory() }
        }
    }
}

enum Step {
    /// A compiled kernel: its entry point, the values whose addresses it takes (inputs, then
    /// outputs) and its element count.
    Jit {
        code: jit::KernelFn,
        args: Vec<Value>,
        n: u64,
    },
    /// A kernel run by the reference kernels.
    Reference(Kernel),
}

/// A compiled function.
pub struct Executable {
    func: Function,
    plan: Plan,
    mem: MemoryPlan,
    steps: Vec<Step>,
    /// The value whose storage each value uses (itself, or a view's source).
    origin: HashMap<Value, Value>,
    consts: HashMap<Value, Vec<Line>>,
    _code: Code,
}

/// How a compiled function's kernels run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stats {
    /// Kernels compiled to machine code.
    pub compiled: usize,
    /// Kernels run by the reference kernels.
    pub reference: usize,
    /// View kernels (no work).
    pub views: usize,
    /// Arena bytes per run.
    pub arena_bytes: u64,
}

/// The largest constant the runtime materialises (1 GiB).
const MAX_CONST_BYTES: u64 = 1 << 30;

fn write_data(dst: *mut u8, t: &Tensor) {
    // SAFETY (callers): `dst` points at storage of `t`'s type, which holds `size_bytes` bytes.
    let (src, len) = match t.data() {
        Data::F32(v) => (v.as_ptr() as *const u8, v.len() * 4),
        Data::F64(v) => (v.as_ptr() as *const u8, v.len() * 8),
        Data::I8(v) => (v.as_ptr() as *const u8, v.len()),
        Data::U8(v) => (v.as_ptr(), v.len()),
        Data::I32(v) => (v.as_ptr() as *const u8, v.len() * 4),
        Data::I64(v) => (v.as_ptr() as *const u8, v.len() * 8),
        Data::Bool(v) => (v.as_ptr() as *const u8, v.len()),
    };
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
}

/// Copies a tensor of type `ty` out of memory at `src`.
///
/// # Safety
/// `src` must point at `ty.size_bytes()` readable bytes holding valid elements of `ty`, aligned
/// for its dtype.
unsafe fn read_data(src: *const u8, ty: &TensorType) -> Tensor {
    let n = ty.numel() as usize;
    unsafe {
        let data = match ty.dtype() {
            DType::F32 => Data::F32(std::slice::from_raw_parts(src as *const f32, n).to_vec()),
            DType::F64 => Data::F64(std::slice::from_raw_parts(src as *const f64, n).to_vec()),
            DType::I8 => Data::I8(std::slice::from_raw_parts(src as *const i8, n).to_vec()),
            DType::U8 => Data::U8(std::slice::from_raw_parts(src, n).to_vec()),
            DType::I32 => Data::I32(std::slice::from_raw_parts(src as *const i32, n).to_vec()),
            DType::I64 => Data::I64(std::slice::from_raw_parts(src as *const i64, n).to_vec()),
            DType::Bool => Data::Bool(
                std::slice::from_raw_parts(src, n)
                    .iter()
                    .map(|&b| b != 0)
                    .collect(),
            ),
        };
        Tensor::new(ty.clone(), data).expect("sized from the type")
    }
}

fn data_ptr(t: &Tensor) -> *const u8 {
    match t.data() {
        Data::F32(v) => v.as_ptr() as *const u8,
        Data::F64(v) => v.as_ptr() as *const u8,
        Data::I8(v) => v.as_ptr() as *const u8,
        Data::U8(v) => v.as_ptr(),
        Data::I32(v) => v.as_ptr() as *const u8,
        Data::I64(v) => v.as_ptr() as *const u8,
        Data::Bool(v) => v.as_ptr() as *const u8,
    }
}

impl Executable {
    /// Compiles `f`, which must verify, for the host CPU.
    pub fn compile(f: &Function) -> Result<Executable, CompileError> {
        tcc_ir::verify_function(f)
            .map_err(|d| CompileError(format!("the function does not verify:\n{d}")))?;
        let plan = plan(f);
        let mem = plan_memory(f, &plan);
        let builder = JITBuilder::new(cranelift_module::default_libcall_names())
            .map_err(|e| CompileError(format!("cannot set up the JIT for this CPU: {e}")))?;
        let mut module = JITModule::new(builder);
        let mut ids = Vec::new();
        for (k, kd) in plan.kernels.iter() {
            if jit::can_compile(f, kd) {
                let id = jit::compile(&mut module, f, kd, &format!("{}_{k}", f.name))
                    .map_err(|e| CompileError(format!("compiling kernel {k}: {e}")))?;
                ids.push((k, id));
            }
        }
        module
            .finalize_definitions()
            .map_err(|e| CompileError(format!("linking compiled kernels: {e}")))?;
        let compiled: HashMap<Kernel, jit::KernelFn> = ids
            .into_iter()
            .map(|(k, id)| {
                let ptr = module.get_finalized_function(id);
                // SAFETY: `jit::compile` defined this function with the `KernelFn` signature.
                (k, unsafe {
                    std::mem::transmute::<*const u8, jit::KernelFn>(ptr)
                })
            })
            .collect();
        let mut steps = Vec::new();
        let mut origin = HashMap::new();
        for (k, kd) in plan.kernels.iter() {
            if kd.kind == KernelKind::View {
                let op = kd.ops[0];
                let (src, out) = (f.op(op).args[0], f.op(op).results[0]);
                let root = origin.get(&src).copied().unwrap_or(src);
                origin.insert(out, root);
                continue;
            }
            steps.push(match compiled.get(&k) {
                Some(&code) => Step::Jit {
                    code,
                    args: kd.inputs.iter().chain(&kd.outputs).copied().collect(),
                    n: f.ty(f.op(kd.ops[0]).results[0]).numel(),
                },
                None => Step::Reference(k),
            });
        }
        let mut consts = HashMap::new();
        for &op in &plan.constants {
            let OpKind::Const { ty, value } = &f.op(op).kind else {
                unreachable!("planned as a constant")
            };
            if ty.size_bytes() > MAX_CONST_BYTES {
                return Err(CompileError(format!(
                    "constant %{} of type {ty} is larger than the 1 GiB the runtime materialises",
                    f.name(f.op(op).results[0])
                )));
            }
            let t = Tensor::from_literal(ty, value).map_err(|e| CompileError(e.to_string()))?;
            let mut buf = lines(ty.size_bytes());
            write_data(buf.as_mut_ptr() as *mut u8, &t);
            consts.insert(f.op(op).results[0], buf);
        }
        Ok(Executable {
            func: f.clone(),
            plan,
            mem,
            steps,
            origin,
            consts,
            _code: Code(Some(module)),
        })
    }

    /// How the kernels run, and the arena size.
    pub fn stats(&self) -> Stats {
        let compiled = self
            .steps
            .iter()
            .filter(|s| matches!(s, Step::Jit { .. }))
            .count();
        Stats {
            compiled,
            reference: self.steps.len() - compiled,
            views: self.plan.kernels.len() - self.steps.len(),
            arena_bytes: self.mem.arena_bytes,
        }
    }

    /// The compiled function.
    pub fn function(&self) -> &Function {
        &self.func
    }

    /// Runs on `inputs` (one per parameter, of its type) and returns the results.
    pub fn run(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>, RunError> {
        let f = &self.func;
        check_inputs(f, inputs).map_err(|e| RunError(e.0))?;
        let mut arena = lines(self.mem.arena_bytes);
        let base = arena.as_mut_ptr() as *mut u8;
        let addr = |v: Value| -> *mut u8 {
            let v = self.origin.get(&v).copied().unwrap_or(v);
            match self.mem.storage[v] {
                Storage::Arena(off) => base.wrapping_add(off as usize),
                Storage::Param => match f.value(v).def {
                    ValueDef::Param(i) => data_ptr(&inputs[i]) as *mut u8,
                    ValueDef::Result(..) => unreachable!("parameter storage for an op result"),
                },
                Storage::Const => self.consts[&v].as_ptr() as *mut u8,
                Storage::None => unreachable!("a value read outside its kernel is stored"),
            }
        };
        for step in &self.steps {
            match step {
                Step::Jit { code, args, n } => {
                    let ptrs: Vec<*mut u8> = args.iter().map(|&v| addr(v)).collect();
                    // SAFETY: each pointer addresses storage of its value's type (inputs are
                    // checked, the arena is sized by the memory plan), and the kernel touches
                    // elements 0..n of its iteration space only.
                    unsafe { code(ptrs.as_ptr(), 0, *n) };
                }
                Step::Reference(k) => self.run_reference(*k, &addr)?,
            }
        }
        // SAFETY: every result is stored (a parameter, a constant or an arena slot) and holds
        // a value of its type after the last step.
        Ok(f.results()
            .iter()
            .map(|&r| unsafe { read_data(addr(r), f.ty(r)) })
            .collect())
    }

    /// Runs one kernel with the reference kernels. All inputs are read before any output is
    /// written, so outputs planned in place over inputs are safe.
    fn run_reference(&self, k: Kernel, addr: &dyn Fn(Value) -> *mut u8) -> Result<(), RunError> {
        let f = &self.func;
        let kd = &self.plan.kernels[k];
        let mut vals: HashMap<Value, Tensor> = HashMap::new();
        for &v in &kd.inputs {
            // SAFETY: kernel inputs are stored values of their type.
            vals.insert(v, unsafe { read_data(addr(v), f.ty(v)) });
        }
        for &op in &kd.ops {
            let d = f.op(op);
            let args: Vec<&Tensor> = d.args.iter().map(|a| &vals[a]).collect();
            let tys: Vec<TensorType> = d.results.iter().map(|&r| f.ty(r).clone()).collect();
            let outs = eval_op(&d.kind, &args, &tys).map_err(|msg| {
                RunError(format!("in `@{}`, {}: {msg}", f.name, f.describe_op(op)))
            })?;
            for (&r, t) in d.results.iter().zip(outs) {
                vals.insert(r, t);
            }
        }
        for &o in &kd.outputs {
            write_data(addr(o), &vals[&o]);
        }
        Ok(())
    }
}

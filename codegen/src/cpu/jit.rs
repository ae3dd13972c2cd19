//! Cranelift code for fused elementwise kernels over `f32`.
//!
//! A compiled kernel has the C signature `fn(ptrs: *const *mut u8, start: u64, end: u64)`:
//! `ptrs` holds the base address of each input (in kernel input order) and then of each output;
//! the kernel computes elements `start..end` of its iteration space (so work can be split).
//! It runs an `f32x4` loop while every operand allows it, then a scalar loop for the tail.
//!
//! Operands are read by one of three patterns: the same index as the output, one scalar (a
//! splat constant is an immediate), or a broadcast block, element `(i / inner) % n`, which covers
//! a bias `[C]` over `[N, C]` (`inner = 1`) and a per-channel `[C,1,1]` over `[N,C,H,W]`.
//!
//! Setting `TCC_DUMP_JIT=1` prints each kernel's machine code to stderr.
//!
//! `exp` is Cephes' `expf`: range reduction by `ln 2` (two-part constant), a degree-6 polynomial,
//! and scaling by `2^n` split in two factors so that the results overflow to `inf` and underflow
//! through the subnormals as they should. `tanh` is a rational function (odd degree 13 over even
//! degree 6) on the input clamped to ±7.905, one division and no `exp`; `sigmoid` is
//! `1/(1+e^{-x})`. Their measured errors are in docs/perf.md.

use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{AbiParam, InstBuilder, MemFlags, Type, Value as CValue, types};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{FuncId, Linkage, Module};
use std::collections::HashMap;
use tcc_ir::{BinaryOp, CmpOp, DType, Function, OpKind, UnaryOp, Value};

use super::math::{erf, exp, fconst, log, pick, select_lt, tanh};
use crate::plan::{Kernel, KernelData, KernelKind};

/// The entry point of a compiled kernel.
pub(crate) type KernelFn = unsafe extern "C" fn(ptrs: *const *mut u8, start: u64, end: u64);

/// How an operand is indexed for output element `i`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Access {
    /// Element `i`.
    Same,
    /// One value for every element (an immediate if `Some`).
    Scalar(Option<f32>),
    /// Element `(i / inner) % n`.
    Block { inner: u64, n: u64 },
}

/// The access pattern for an operand of `dims` broadcast to `out`, if it is one of the three.
fn access(dims: &[u64], out: &[u64]) -> Option<Access> {
    let numel: u64 = dims.iter().product();
    let out_numel: u64 = out.iter().product();
    if dims.len() > out.len() {
        return None;
    }
    if dims == out {
        return Some(Access::Same);
    }
    if numel == 1 {
        return Some(Access::Scalar(None));
    }
    // The operand's non-1 axes must be one contiguous run of output axes, matching them.
    let offset = out.len() - dims.len();
    let non1: Vec<usize> = (0..dims.len())
        .filter(|&k| dims[k] != 1)
        .map(|k| k + offset)
        .collect();
    let (a, b) = (non1[0], non1[non1.len() - 1] + 1);
    if non1.len() != b - a || (a..b).any(|o| out[o] != dims[o - offset]) {
        return None;
    }
    let n: u64 = out[a..b].iter().product();
    let inner: u64 = out[b..].iter().product();
    if n * inner == out_numel && inner == 1 && a == 0 {
        return Some(Access::Same);
    }
    Some(Access::Block { inner, n })
}

fn supported_op(kind: &OpKind) -> bool {
    match kind {
        OpKind::Unary(_) => true,
        OpKind::Binary(b) => !matches!(b, BinaryOp::Pow),
        OpKind::Identity | OpKind::StopGradient | OpKind::BroadcastTo { .. } => true,
        // Masks: comparisons of f32 values, used by `select` and casts in the same kernel.
        OpKind::Compare(_) | OpKind::Select => true,
        OpKind::Cast { to } => *to == DType::F32,
        // Not elementwise: rows, reductions and library kernels handle these.
        OpKind::Const { .. }
        | OpKind::MatMul
        | OpKind::Conv2d(_)
        | OpKind::MaxPool2d(_)
        | OpKind::AvgPool2d { .. }
        | OpKind::GlobalAvgPool
        | OpKind::Reduce { .. }
        | OpKind::Softmax { .. }
        | OpKind::LogSoftmax { .. }
        | OpKind::SoftmaxCrossEntropy
        | OpKind::BatchNorm { .. }
        | OpKind::BatchNormTrain { .. }
        | OpKind::Reshape { .. }
        | OpKind::Transpose { .. }
        | OpKind::Concat { .. }
        | OpKind::Slice { .. }
        | OpKind::Gather { .. }
        | OpKind::ScatterAdd { .. }
        | OpKind::Conv2dGradInput { .. }
        | OpKind::Conv2dGradFilter { .. }
        | OpKind::SoftmaxCrossEntropyGrad
        | OpKind::MaxPool2dGrad(_)
        | OpKind::AvgPool2dGrad { .. }
        | OpKind::SliceGrad { .. } => false,
    }
}

/// Whether every value of elementwise kernel `k` is `f32`, except `bool` masks that comparisons
/// inside the kernel produce and only `select` conditions and casts to `f32` inside it consume.
fn f32_with_masks(f: &Function, k: &KernelData) -> bool {
    // The masks the kernel computes itself (sets: kernels can hold thousands of ops).
    let masks: std::collections::HashSet<Value> = k
        .ops
        .iter()
        .filter(|&&p| matches!(f.op(p).kind, OpKind::Compare(_)))
        .map(|&p| f.op(p).results[0])
        .collect();
    let stored: std::collections::HashSet<Value> = k.outputs.iter().copied().collect();
    let inside = |v: Value| masks.contains(&v);
    let f32 = |v: &Value| f.ty(*v).dtype() == DType::F32;
    k.ops.iter().all(|&op| {
        let d = f.op(op);
        match d.kind {
            OpKind::Compare(_) => d.args.iter().all(f32) && !stored.contains(&d.results[0]),
            OpKind::Select => inside(d.args[0]) && d.args[1..].iter().chain(&d.results).all(f32),
            OpKind::Cast { .. } => {
                (inside(d.args[0]) || f32(&d.args[0])) && d.results.iter().all(f32)
            }
            _ => d.args.iter().chain(&d.results).all(f32),
        }
    })
}

/// The splat value of `v` if it is defined by a splat `f32` constant.
fn splat_f32(f: &Function, v: Value) -> Option<f32> {
    match f.def_op(v).map(|op| &f.op(op).kind) {
        Some(OpKind::Const { value, .. }) => match value.as_splat()? {
            tcc_ir::Scalar::F32(x) => Some(x),
            _ => None,
        },
        _ => None,
    }
}

/// Whether this JIT compiles `k`: an elementwise kernel over `f32` made of supported ops whose
/// operands it can index.
pub(crate) fn can_compile(f: &Function, k: &KernelData) -> bool {
    if k.kind != KernelKind::Elementwise {
        return false;
    }
    let out = f.ty(f.op(k.ops[0]).results[0]).dims();
    f32_with_masks(f, k)
        && k.ops.iter().all(|&op| supported_op(&f.op(op).kind))
        && k.inputs
            .iter()
            .all(|&v| access(f.ty(v).dims(), out).is_some())
}

/// Code generation settings that depend on the target.
#[derive(Clone, Copy)]
pub(crate) struct Target {
    /// Whether fused multiply-add instructions are available.
    pub fma: bool,
}

/// Emits the kernel body for one element (or four) given operand values.
fn emit_ops(
    b: &mut FunctionBuilder,
    tg: Target,
    ty: Type,
    f: &Function,
    ops: &[tcc_ir::Op],
    vals: &mut HashMap<Value, CValue>,
) {
    for &op in ops {
        let d = f.op(op);
        let a: Vec<CValue> = d.args.iter().map(|v| vals[v]).collect();
        let r = match &d.kind {
            OpKind::Unary(u) => match u {
                UnaryOp::Neg => b.ins().fneg(a[0]),
                UnaryOp::Abs => b.ins().fabs(a[0]),
                UnaryOp::Sqrt => b.ins().sqrt(a[0]),
                UnaryOp::Rsqrt => {
                    let s = b.ins().sqrt(a[0]);
                    let one = fconst(b, ty, 1.0);
                    b.ins().fdiv(one, s)
                }
                UnaryOp::Reciprocal => {
                    let one = fconst(b, ty, 1.0);
                    b.ins().fdiv(one, a[0])
                }
                UnaryOp::Relu => {
                    // x < 0 ? 0 : x, so NaN stays NaN.
                    let zero = fconst(b, ty, 0.0);
                    select_lt(b, ty, a[0], zero, zero, a[0])
                }
                UnaryOp::Exp => exp(b, tg, ty, a[0]),
                UnaryOp::Log => log(b, tg, ty, a[0]),
                UnaryOp::Erf => erf(b, tg, ty, a[0]),
                UnaryOp::Gelu => {
                    // x * (1 + erf(x / sqrt 2)) / 2
                    let k = fconst(b, ty, std::f32::consts::FRAC_1_SQRT_2);
                    let s = b.ins().fmul(a[0], k);
                    let e = erf(b, tg, ty, s);
                    let one = fconst(b, ty, 1.0);
                    let e1 = b.ins().fadd(e, one);
                    let half = fconst(b, ty, 0.5);
                    let hx = b.ins().fmul(a[0], half);
                    b.ins().fmul(hx, e1)
                }
                UnaryOp::Tanh => tanh(b, tg, ty, a[0]),
                UnaryOp::Sigmoid => {
                    let nx = b.ins().fneg(a[0]);
                    let e = exp(b, tg, ty, nx);
                    let one = fconst(b, ty, 1.0);
                    let d = b.ins().fadd(one, e);
                    b.ins().fdiv(one, d)
                }
            },
            OpKind::Binary(op) => match op {
                BinaryOp::Add => b.ins().fadd(a[0], a[1]),
                BinaryOp::Sub => b.ins().fsub(a[0], a[1]),
                BinaryOp::Mul => b.ins().fmul(a[0], a[1]),
                BinaryOp::Div => b.ins().fdiv(a[0], a[1]),
                BinaryOp::Max => b.ins().fmax(a[0], a[1]),
                BinaryOp::Min => b.ins().fmin(a[0], a[1]),
                BinaryOp::Pow => unreachable!("checked by can_compile"),
            },
            OpKind::Identity | OpKind::StopGradient | OpKind::BroadcastTo { .. } => a[0],
            // A mask: `fcmp`'s i8 for scalars, its lanes reinterpreted as f32 bits for vectors.
            OpKind::Compare(c) => {
                let cc = match c {
                    CmpOp::Eq => FloatCC::Equal,
                    CmpOp::Ne => FloatCC::NotEqual,
                    CmpOp::Lt => FloatCC::LessThan,
                    CmpOp::Le => FloatCC::LessThanOrEqual,
                    CmpOp::Gt => FloatCC::GreaterThan,
                    CmpOp::Ge => FloatCC::GreaterThanOrEqual,
                };
                let m = b.ins().fcmp(cc, a[0], a[1]);
                if ty == types::F32 {
                    m
                } else {
                    b.ins().bitcast(ty, MemFlags::new(), m)
                }
            }
            OpKind::Select => pick(b, ty, a[0], a[1], a[2]),
            OpKind::Cast { .. } if f.ty(d.args[0]).dtype() == DType::Bool => {
                let (one, zero) = (fconst(b, ty, 1.0), fconst(b, ty, 0.0));
                pick(b, ty, a[0], one, zero)
            }
            OpKind::Cast { .. } => a[0],
            // `supported_op`, an exhaustive match, decides which ops reach here.
            _ => unreachable!("checked by can_compile"),
        };
        vals.insert(d.results[0], r);
    }
}

/// The iteration space of a compiled kernel: indices `0..n` (split among threads), each
/// covering `unit` elements (1 for elementwise loops, a row or a reduced extent otherwise).
#[derive(Clone, Copy)]
pub(crate) struct Space {
    pub n: u64,
    pub unit: u64,
}

/// A Cranelift module for one function: its kernels are compiled into it one by one, then
/// linked together by [`Jit::finish`].
pub(crate) struct Jit {
    module: JITModule,
    tg: Target,
    ids: Vec<(Kernel, FuncId)>,
}

impl Jit {
    /// A module for a target spec (`None`: the host with all its features; see `target.rs`).
    pub(crate) fn new(target: Option<&str>) -> Result<Jit, String> {
        let isa = super::target::isa(target)?;
        let builder = JITBuilder::with_isa(isa, cranelift_module::default_libcall_names());
        let module = JITModule::new(builder);
        let fma = module
            .isa()
            .isa_flags()
            .iter()
            .any(|f| f.name == "has_fma" && f.as_bool() == Some(true));
        Ok(Jit {
            module,
            tg: Target { fma },
            ids: Vec::new(),
        })
    }

    /// Compiles `kd` as the code of kernel `k` if this JIT compiles kernels of its shape
    /// (elementwise, softmax rows, reductions), and returns its iteration space; `None` if not.
    pub(crate) fn compile(
        &mut self,
        f: &Function,
        k: Kernel,
        kd: &KernelData,
        name: &str,
    ) -> Result<Option<Space>, String> {
        let (m, tg) = (&mut self.module, self.tg);
        let elements = f.ty(f.op(kd.ops[0]).results[0]).numel();
        let (id, space) = if can_compile(f, kd) {
            let space = Space {
                n: elements,
                unit: 1,
            };
            (compile(m, tg, f, kd, name)?, space)
        } else if can_compile_row(f, kd) {
            let rows = row_count(f, kd);
            let space = Space {
                n: rows,
                unit: elements / rows.max(1),
            };
            (compile_row(m, tg, f, kd, name)?, space)
        } else if let Some(shape) = reduce_shape(f, kd) {
            let space = Space {
                n: shape.a,
                unit: shape.l * shape.b,
            };
            (compile_reduce(m, tg, f, kd, name)?, space)
        } else {
            return Ok(None);
        };
        self.ids.push((k, id));
        Ok(Some(space))
    }

    /// Links the compiled kernels: the code memory and each kernel's entry point.
    pub(crate) fn finish(mut self) -> Result<(Code, HashMap<Kernel, KernelFn>), String> {
        self.module
            .finalize_definitions()
            .map_err(|e| format!("linking compiled kernels: {e}"))?;
        let entries = self
            .ids
            .iter()
            .map(|&(k, id)| {
                let ptr = self.module.get_finalized_function(id);
                // SAFETY: `define_kernel` defined this function with the `KernelFn` signature.
                (k, unsafe {
                    std::mem::transmute::<*const u8, KernelFn>(ptr)
                })
            })
            .collect();
        Ok((Code(Some(self.module)), entries))
    }
}

/// Owns the JIT's code memory.
pub(crate) struct Code(Option<JITModule>);

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

/// Compiles `k` (for which [`can_compile`] holds) into `module` under `name`.
fn compile(
    module: &mut JITModule,
    tg: Target,
    f: &Function,
    k: &KernelData,
    name: &str,
) -> Result<FuncId, String> {
    let out_dims = f.ty(f.op(k.ops[0]).results[0]).dims().to_vec();
    let accesses: Vec<Access> = k
        .inputs
        .iter()
        .map(
            |&v| match access(f.ty(v).dims(), &out_dims).expect("checked by can_compile") {
                Access::Scalar(_) => Access::Scalar(splat_f32(f, v)),
                a => a,
            },
        )
        .collect();
    let vectorizable = accesses.iter().all(|a| match *a {
        Access::Same | Access::Scalar(_) => true,
        Access::Block { inner, n } => (inner == 1 && n % 4 == 0) || inner % 4 == 0,
    });
    define_kernel(module, name, |b, ptr, table, start, end| {
        let flags = MemFlags::trusted();
        let n_in = k.inputs.len();
        let bases: Vec<CValue> = (0..n_in + k.outputs.len())
            .map(|j| b.ins().load(ptr, flags, table, (j * 8) as i32))
            .collect();
        // Scalars are loaded (or materialised) once.
        let scalars = preload_scalars(b, &accesses, &bases);
        let i = b.declare_var(types::I64);
        b.def_var(i, start);
        let vec_end = if vectorizable {
            let len = b.ins().isub(end, start);
            let len4 = b.ins().band_imm(len, !3i64);
            b.ins().iadd(start, len4)
        } else {
            start
        };
        for (lane, limit) in [(types::F32X4, vec_end), (types::F32, end)] {
            let head = b.create_block();
            let body = b.create_block();
            let next = b.create_block();
            b.ins().jump(head, &[]);
            b.switch_to_block(head);
            let iv = b.use_var(i);
            let c = b.ins().icmp(IntCC::UnsignedLessThan, iv, limit);
            b.ins().brif(c, body, &[], next, &[]);
            b.switch_to_block(body);
            let iv = b.use_var(i);
            let mut vals = load_operands(b, lane, iv, &k.inputs, &accesses, &bases, &scalars);
            emit_ops(b, tg, lane, f, &k.ops, &mut vals);
            for (j, o) in k.outputs.iter().enumerate() {
                let off = b.ins().ishl_imm(iv, 2);
                let addr = b.ins().iadd(bases[n_in + j], off);
                b.ins().store(flags, vals[o], addr, 0);
            }
            let step = if lane == types::F32 { 1 } else { 4 };
            let iv2 = b.ins().iadd_imm(iv, step);
            b.def_var(i, iv2);
            b.ins().jump(head, &[]);
            b.switch_to_block(next);
        }
    })
}

/// Declares and defines a kernel with the [`KernelFn`] signature. `body` emits the code after
/// the entry block, given the builder, the pointer type and the three parameters (pointer table,
/// start, end); the return is added here. `TCC_DUMP_JIT=1` prints the machine code.
fn define_kernel(
    module: &mut JITModule,
    name: &str,
    body: impl FnOnce(&mut FunctionBuilder, Type, CValue, CValue, CValue),
) -> Result<FuncId, String> {
    let ptr = module.target_config().pointer_type();
    let mut sig = module.make_signature();
    sig.params.extend([
        AbiParam::new(ptr),
        AbiParam::new(types::I64),
        AbiParam::new(types::I64),
    ]);
    let id = module
        .declare_function(name, Linkage::Local, &sig)
        .map_err(|e| e.to_string())?;
    let mut ctx = module.make_context();
    ctx.func.signature = sig;
    let mut fctx = FunctionBuilderContext::new();
    {
        let mut b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
        let entry = b.create_block();
        b.append_block_params_for_function_params(entry);
        b.switch_to_block(entry);
        let p = b.block_params(entry).to_vec();
        body(&mut b, ptr, p[0], p[1], p[2]);
        b.ins().return_(&[]);
        b.seal_all_blocks();
        b.finalize();
    }
    let dump = std::env::var_os("TCC_DUMP_JIT").is_some();
    ctx.set_disasm(dump);
    module
        .define_function(id, &mut ctx)
        .map_err(|e| format!("{e:?}"))?;
    if dump && let Some(code) = ctx.compiled_code().and_then(|c| c.vcode.as_ref()) {
        eprintln!("; kernel {name}\n{code}");
    }
    module.clear_context(&mut ctx);
    Ok(id)
}

/// Loads (or materialises) once the operands read as scalars; `None` for the others.
fn preload_scalars(
    b: &mut FunctionBuilder,
    accesses: &[Access],
    bases: &[CValue],
) -> Vec<Option<CValue>> {
    accesses
        .iter()
        .zip(bases)
        .map(|(a, &p)| match a {
            Access::Scalar(Some(x)) => Some(b.ins().f32const(*x)),
            Access::Scalar(None) => Some(b.ins().load(types::F32, MemFlags::trusted(), p, 0)),
            _ => None,
        })
        .collect()
}

/// Loads every operand of a kernel for element `e` (the first of four for `F32X4`).
fn load_operands(
    b: &mut FunctionBuilder,
    lane: Type,
    e: CValue,
    inputs: &[Value],
    accesses: &[Access],
    bases: &[CValue],
    scalars: &[Option<CValue>],
) -> HashMap<Value, CValue> {
    let flags = MemFlags::trusted();
    let mut vals = HashMap::new();
    for (j, (&v, a)) in inputs.iter().zip(accesses).enumerate() {
        let x = match *a {
            Access::Scalar(_) => {
                let s = scalars[j].expect("preloaded");
                if lane == types::F32 {
                    s
                } else {
                    b.ins().splat(lane, s)
                }
            }
            Access::Same => {
                let off = b.ins().ishl_imm(e, 2);
                let addr = b.ins().iadd(bases[j], off);
                b.ins().load(lane, flags, addr, 0)
            }
            Access::Block { inner, n } => {
                let q = if inner == 1 {
                    e
                } else {
                    b.ins().udiv_imm(e, inner as i64)
                };
                let idx = b.ins().urem_imm(q, n as i64);
                let off = b.ins().ishl_imm(idx, 2);
                let addr = b.ins().iadd(bases[j], off);
                if lane == types::F32 || inner == 1 {
                    b.ins().load(lane, flags, addr, 0)
                } else {
                    let s = b.ins().load(types::F32, flags, addr, 0);
                    b.ins().splat(lane, s)
                }
            }
        };
        vals.insert(v, x);
    }
    vals
}

/// Emits `for v in from..to step step { body(v) }` over the `I64` variable `var`.
fn emit_for(
    b: &mut FunctionBuilder,
    var: cranelift_frontend::Variable,
    from: CValue,
    to: CValue,
    step: i64,
    mut body: impl FnMut(&mut FunctionBuilder, CValue),
) {
    b.def_var(var, from);
    let head = b.create_block();
    let block = b.create_block();
    let next = b.create_block();
    b.ins().jump(head, &[]);
    b.switch_to_block(head);
    let v = b.use_var(var);
    let c = b.ins().icmp(IntCC::SignedLessThan, v, to);
    b.ins().brif(c, block, &[], next, &[]);
    b.switch_to_block(block);
    let v = b.use_var(var);
    body(b, v);
    let v2 = b.ins().iadd_imm(v, step);
    b.def_var(var, v2);
    b.ins().jump(head, &[]);
    b.switch_to_block(next);
}

/// The softmax op, its row length, and whether every operand can be read in fours within a row,
/// if this JIT compiles row kernel `k`: a softmax over a contiguous last axis, in `f32`, whose
/// prologue and epilogue it supports.
fn row_shape(f: &Function, k: &KernelData) -> Option<(tcc_ir::Op, u64, bool)> {
    let KernelKind::Row { root } = k.kind else {
        return None;
    };
    let (OpKind::Softmax { axis } | OpKind::LogSoftmax { axis }) = f.op(root).kind else {
        return None;
    };
    let dims = f.ty(f.op(root).args[0]).dims();
    let a = tcc_ir::ops::normalize_axis(axis, dims.len())?;
    let len = dims[a];
    if a + 1 != dims.len() || len == 0 {
        return None;
    }
    let all_f32 = f32_with_masks(f, k);
    let others = k
        .ops
        .iter()
        .filter(|&&op| op != root)
        .all(|&op| supported_op(&f.op(op).kind));
    let accesses: Option<Vec<Access>> = k
        .inputs
        .iter()
        .map(|&v| access(f.ty(v).dims(), dims))
        .collect();
    let accesses = accesses?;
    let vec = len >= 4
        && accesses.iter().all(|a| match *a {
            Access::Same | Access::Scalar(_) => true,
            Access::Block { inner, n } => {
                len.is_multiple_of(4)
                    && ((inner == 1 && n.is_multiple_of(4)) || inner.is_multiple_of(4))
            }
        });
    (all_f32 && others).then_some((root, len, vec))
}

/// Whether this JIT compiles row kernel `k`.
fn can_compile_row(f: &Function, k: &KernelData) -> bool {
    row_shape(f, k).is_some()
}

/// The number of rows of a row kernel (its iteration space for `start..end`).
fn row_count(f: &Function, k: &KernelData) -> u64 {
    let (root, len, _) = row_shape(f, k).expect("a compilable row kernel");
    f.ty(f.op(root).args[0]).numel() / len
}

/// The largest of the four lanes of `v`.
fn hmax(b: &mut FunctionBuilder, v: CValue) -> CValue {
    let mut m = b.ins().extractlane(v, 0);
    for l in 1..4 {
        let x = b.ins().extractlane(v, l);
        m = select_lt(b, types::F32, m, x, x, m);
    }
    m
}

/// The sum of the four lanes of `v`.
fn hsum(b: &mut FunctionBuilder, v: CValue) -> CValue {
    let mut s = b.ins().extractlane(v, 0);
    for l in 1..4 {
        let x = b.ins().extractlane(v, l);
        s = b.ins().fadd(s, x);
    }
    s
}

/// Compiles row kernel `k` (for which [`can_compile_row`] holds): for each row in
/// `start..end`, one pass for the maximum, one for the sum of `exp(x - max)`, and one that writes
/// `exp(x - max) / sum` and runs the epilogue. The prologue is recomputed in each pass rather than
/// stored. NaN in a row makes the whole row NaN, as in the interpreter.
fn compile_row(
    module: &mut JITModule,
    tg: Target,
    f: &Function,
    k: &KernelData,
    name: &str,
) -> Result<FuncId, String> {
    let (root, len, vectorizable) = row_shape(f, k).expect("checked by can_compile_row");
    let log_softmax = matches!(f.op(root).kind, OpKind::LogSoftmax { .. });
    let dims = f.ty(f.op(root).args[0]).dims().to_vec();
    let pos = k
        .ops
        .iter()
        .position(|&o| o == root)
        .expect("the root is a member");
    let (pro, epi) = (&k.ops[..pos], &k.ops[pos + 1..]);
    let (x_in, y_out) = (f.op(root).args[0], f.op(root).results[0]);
    let accesses: Vec<Access> = k
        .inputs
        .iter()
        .map(|&v| match access(f.ty(v).dims(), &dims).expect("checked") {
            Access::Scalar(_) => Access::Scalar(splat_f32(f, v)),
            a => a,
        })
        .collect();
    define_kernel(module, name, |b, ptr, table, start, end| {
        let flags = MemFlags::trusted();
        let n_in = k.inputs.len();
        let bases: Vec<CValue> = (0..n_in + k.outputs.len())
            .map(|j| b.ins().load(ptr, flags, table, (j * 8) as i32))
            .collect();
        let scalars = preload_scalars(b, &accesses, &bases);
        let (r, j) = (b.declare_var(types::I64), b.declare_var(types::I64));
        let (acc, vacc) = (b.declare_var(types::F32), b.declare_var(types::F32X4));
        let len_v = b.ins().iconst(types::I64, len as i64);
        let len4_v = b
            .ins()
            .iconst(types::I64, if vectorizable { (len & !3) as i64 } else { 0 });
        let zero = b.ins().iconst(types::I64, 0);
        // The prologue's value of the softmax input at element `e`, with the operands loaded.
        let input_at = |b: &mut FunctionBuilder, lane: Type, e: CValue| {
            let mut vals = load_operands(b, lane, e, &k.inputs, &accesses, &bases, &scalars);
            emit_ops(b, tg, lane, f, pro, &mut vals);
            let x = vals[&x_in];
            (x, vals)
        };
        // Folds `step` over the prologue's values of one row, four lanes at a time and then the
        // scalar tail; `lanes` combines the four lanes of the vector accumulator.
        type Step<'s> = &'s dyn Fn(&mut FunctionBuilder, Type, CValue, CValue) -> CValue;
        let fold_row = |b: &mut FunctionBuilder,
                        row: CValue,
                        init: f32,
                        step: Step<'_>,
                        lanes: fn(&mut FunctionBuilder, CValue) -> CValue| {
            let i4 = fconst(b, types::F32X4, init);
            b.def_var(vacc, i4);
            emit_for(b, j, zero, len4_v, 4, |b, jv| {
                let e = b.ins().iadd(row, jv);
                let (x, _) = input_at(b, types::F32X4, e);
                let cur = b.use_var(vacc);
                let n = step(b, types::F32X4, cur, x);
                b.def_var(vacc, n);
            });
            let v = b.use_var(vacc);
            let a0 = lanes(b, v);
            b.def_var(acc, a0);
            emit_for(b, j, len4_v, len_v, 1, |b, jv| {
                let e = b.ins().iadd(row, jv);
                let (x, _) = input_at(b, types::F32, e);
                let cur = b.use_var(acc);
                let n = step(b, types::F32, cur, x);
                b.def_var(acc, n);
            });
            b.use_var(acc)
        };
        emit_for(b, r, start, end, 1, |b, rv| {
            let row = b.ins().imul_imm(rv, len as i64);
            // Pass 1: the row's maximum.
            let mx = fold_row(
                b,
                row,
                f32::NEG_INFINITY,
                &|b, lane, a, x| select_lt(b, lane, a, x, x, a),
                hmax,
            );
            // Pass 2: the sum of exp(x - max).
            let mxv = b.ins().splat(types::F32X4, mx);
            let sum = fold_row(
                b,
                row,
                0.0,
                &|b, lane, a, x| {
                    let d = b.ins().fsub(x, if lane == types::F32 { mx } else { mxv });
                    let t = exp(b, tg, lane, d);
                    b.ins().fadd(a, t)
                },
                hsum,
            );
            // Pass 3: normalise, run the epilogue, store.
            let one = b.ins().f32const(1.0);
            let inv = b.ins().fdiv(one, sum);
            let invv = b.ins().splat(types::F32X4, inv);
            // For log_softmax: max + log(sum), subtracted from x.
            let lse = log(b, tg, types::F32, sum);
            let shift = b.ins().fadd(mx, lse);
            let shiftv = b.ins().splat(types::F32X4, shift);
            for (lane, from, to, step, mxl, invl, shiftl) in [
                (types::F32X4, zero, len4_v, 4, mxv, invv, shiftv),
                (types::F32, len4_v, len_v, 1, mx, inv, shift),
            ] {
                emit_for(b, j, from, to, step, |b, jv| {
                    let e = b.ins().iadd(row, jv);
                    let (x, mut vals) = input_at(b, lane, e);
                    let y = if log_softmax {
                        b.ins().fsub(x, shiftl)
                    } else {
                        let d = b.ins().fsub(x, mxl);
                        let t = exp(b, tg, lane, d);
                        b.ins().fmul(t, invl)
                    };
                    vals.insert(y_out, y);
                    emit_ops(b, tg, lane, f, epi, &mut vals);
                    for (o, &v) in k.outputs.iter().enumerate() {
                        let off = b.ins().ishl_imm(e, 2);
                        let addr = b.ins().iadd(bases[n_in + o], off);
                        b.ins().store(flags, vals[&v], addr, 0);
                    }
                });
            }
        });
    })
}

/// The layout of a compilable reduction kernel: the reduce op, its kind, and the input viewed as
/// `[a, l, b]` with the reduced axes (contiguous) in the middle.
struct ReduceShape {
    root: tcc_ir::Op,
    op: tcc_ir::ReduceOp,
    a: u64,
    l: u64,
    b: u64,
}

/// The layout of reduction kernel `k` if this JIT compiles it: a `reduce_*` in `f32` over
/// contiguous axes of a non-empty extent, with supported prologue and epilogue ops and no
/// prologue value stored.
fn reduce_shape(f: &Function, k: &KernelData) -> Option<ReduceShape> {
    let KernelKind::Reduction { root } = k.kind else {
        return None;
    };
    let OpKind::Reduce { op, axes, .. } = &f.op(root).kind else {
        return None;
    };
    let dims = f.ty(f.op(root).args[0]).dims();
    let mut ax: Vec<usize> = axes
        .iter()
        .map(|&a| tcc_ir::ops::normalize_axis(a, dims.len()))
        .collect::<Option<_>>()?;
    ax.sort_unstable();
    let (i0, i1) = (ax[0], ax[ax.len() - 1]);
    if i1 - i0 + 1 != ax.len() {
        return None;
    }
    let (a, l, b) = (
        dims[..i0].iter().product(),
        dims[i0..=i1].iter().product::<u64>(),
        dims[i1 + 1..].iter().product(),
    );
    let all_f32 = f32_with_masks(f, k);
    let pos = k.ops.iter().position(|&o| o == root)?;
    let supported = k
        .ops
        .iter()
        .filter(|&&o| o != root)
        .all(|&o| supported_op(&f.op(o).kind));
    // Outputs may only be the reduction or epilogue values.
    let late: Vec<Value> = k.ops[pos..]
        .iter()
        .flat_map(|&o| f.op(o).results.clone())
        .collect();
    let outputs_late = k.outputs.iter().all(|o| late.contains(o));
    let (pro_in, epi_in) = reduce_inputs(f, k, pos);
    let out_dims = f.ty(f.op(root).results[0]).dims();
    let readable = pro_in
        .iter()
        .all(|&v| access(f.ty(v).dims(), dims).is_some())
        && epi_in
            .iter()
            .all(|&v| access(f.ty(v).dims(), out_dims).is_some());
    (l > 0 && all_f32 && supported && outputs_late && readable).then_some(ReduceShape {
        root,
        op: *op,
        a,
        l,
        b,
    })
}

/// Kernel inputs read before and at the reduction, and those read after it.
fn reduce_inputs(f: &Function, k: &KernelData, pos: usize) -> (Vec<Value>, Vec<Value>) {
    let reads = |ops: &[tcc_ir::Op]| -> Vec<Value> {
        k.inputs
            .iter()
            .copied()
            .filter(|v| ops.iter().any(|&o| f.op(o).args.contains(v)))
            .collect()
    };
    (reads(&k.ops[..=pos]), reads(&k.ops[pos + 1..]))
}

/// Combines an accumulator with a new value.
fn combine(b: &mut FunctionBuilder, op: tcc_ir::ReduceOp, acc: CValue, x: CValue) -> CValue {
    match op {
        tcc_ir::ReduceOp::Max => b.ins().fmax(acc, x),
        tcc_ir::ReduceOp::Sum | tcc_ir::ReduceOp::Mean => b.ins().fadd(acc, x),
    }
}

/// Compiles reduction kernel `k` (for which [`reduce_shape`] is `Some`). For each `a` in
/// `start..end` and each output `b`, accumulates the prologue's values over `l` in `f32`; rows
/// (`b == 1`) use two `f32x4` accumulators along `l`, other layouts compute four neighbouring
/// outputs at once. Then the mean's division and the epilogue, and the stores.
fn compile_reduce(
    module: &mut JITModule,
    tg: Target,
    f: &Function,
    k: &KernelData,
    name: &str,
) -> Result<FuncId, String> {
    let ReduceShape {
        root,
        op,
        l,
        b: bext,
        ..
    } = reduce_shape(f, k).expect("checked by reduce_shape");
    let in_dims = f.ty(f.op(root).args[0]).dims().to_vec();
    let out_dims = f.ty(f.op(root).results[0]).dims().to_vec();
    let pos = k
        .ops
        .iter()
        .position(|&o| o == root)
        .expect("the root is a member");
    let (pro, epi) = (&k.ops[..pos], &k.ops[pos + 1..]);
    let (x_in, y_out) = (f.op(root).args[0], f.op(root).results[0]);
    let (pro_in, epi_in) = reduce_inputs(f, k, pos);
    let acc_of = |v: Value, dims: &[u64]| match access(f.ty(v).dims(), dims).expect("checked") {
        Access::Scalar(_) => Access::Scalar(splat_f32(f, v)),
        a => a,
    };
    let pro_acc: Vec<Access> = pro_in.iter().map(|&v| acc_of(v, &in_dims)).collect();
    let epi_acc: Vec<Access> = epi_in.iter().map(|&v| acc_of(v, &out_dims)).collect();
    let simple = |acc: &[Access]| {
        acc.iter()
            .all(|a| matches!(a, Access::Same | Access::Scalar(_)))
    };
    let rows = bext == 1 && l >= 8 && simple(&pro_acc);
    let cols = bext >= 4 && simple(&pro_acc) && simple(&epi_acc);
    let init = match op {
        tcc_ir::ReduceOp::Max => f32::NEG_INFINITY,
        _ => 0.0,
    };
    define_kernel(module, name, |b, ptr, table, start, end| {
        let flags = MemFlags::trusted();
        let base =
            |b: &mut FunctionBuilder, j: usize| b.ins().load(ptr, flags, table, (j * 8) as i32);
        let index = |v: &Value| k.inputs.iter().position(|x| x == v).expect("an input");
        let pro_bases: Vec<CValue> = pro_in.iter().map(|v| base(b, index(v))).collect();
        let epi_bases: Vec<CValue> = epi_in.iter().map(|v| base(b, index(v))).collect();
        let out_bases: Vec<CValue> = (0..k.outputs.len())
            .map(|j| base(b, k.inputs.len() + j))
            .collect();
        let pro_sc = preload_scalars(b, &pro_acc, &pro_bases);
        let epi_sc = preload_scalars(b, &epi_acc, &epi_bases);
        let value_at = |b: &mut FunctionBuilder, lane: Type, e: CValue| {
            let mut vals = load_operands(b, lane, e, &pro_in, &pro_acc, &pro_bases, &pro_sc);
            emit_ops(b, tg, lane, f, pro, &mut vals);
            vals[&x_in]
        };
        // The mean's division, the epilogue and the stores for output element `o`.
        let finish = |b: &mut FunctionBuilder, lane: Type, o: CValue, acc: CValue| {
            let r = if op == tcc_ir::ReduceOp::Mean {
                let inv = fconst(b, lane, 1.0 / l as f32);
                b.ins().fmul(acc, inv)
            } else {
                acc
            };
            let mut vals = load_operands(b, lane, o, &epi_in, &epi_acc, &epi_bases, &epi_sc);
            vals.insert(y_out, r);
            emit_ops(b, tg, lane, f, epi, &mut vals);
            for (j, v) in k.outputs.iter().enumerate() {
                let off = b.ins().ishl_imm(o, 2);
                let addr = b.ins().iadd(out_bases[j], off);
                b.ins().store(flags, vals[v], addr, 0);
            }
        };
        let (av, bv, lv) = (
            b.declare_var(types::I64),
            b.declare_var(types::I64),
            b.declare_var(types::I64),
        );
        let (acc, acc4a, acc4b) = (
            b.declare_var(types::F32),
            b.declare_var(types::F32X4),
            b.declare_var(types::F32X4),
        );
        let zero = b.ins().iconst(types::I64, 0);
        let l_v = b.ins().iconst(types::I64, l as i64);
        emit_for(b, av, start, end, 1, |b, a| {
            if rows {
                // One output per row: two f32x4 accumulators along the row, then the tail.
                let row = b.ins().imul_imm(a, l as i64);
                let i4 = fconst(b, types::F32X4, init);
                b.def_var(acc4a, i4);
                b.def_var(acc4b, i4);
                let l8 = b.ins().iconst(types::I64, (l & !7) as i64);
                emit_for(b, lv, zero, l8, 8, |b, j| {
                    let e = b.ins().iadd(row, j);
                    let x0 = value_at(b, types::F32X4, e);
                    let e4 = b.ins().iadd_imm(e, 4);
                    let x1 = value_at(b, types::F32X4, e4);
                    let (p, q) = (b.use_var(acc4a), b.use_var(acc4b));
                    let p = combine(b, op, p, x0);
                    let q = combine(b, op, q, x1);
                    b.def_var(acc4a, p);
                    b.def_var(acc4b, q);
                });
                let (p, q) = (b.use_var(acc4a), b.use_var(acc4b));
                let v = combine(b, op, p, q);
                let mut s = b.ins().extractlane(v, 0);
                for lane in 1..4 {
                    let x = b.ins().extractlane(v, lane);
                    s = combine(b, op, s, x);
                }
                b.def_var(acc, s);
                emit_for(b, lv, l8, l_v, 1, |b, j| {
                    let e = b.ins().iadd(row, j);
                    let x = value_at(b, types::F32, e);
                    let cur = b.use_var(acc);
                    let n = combine(b, op, cur, x);
                    b.def_var(acc, n);
                });
                let total = b.use_var(acc);
                finish(b, types::F32, a, total);
                return;
            }
            // Outputs b of this a: four at a time where allowed, then one at a time.
            let b4 = b
                .ins()
                .iconst(types::I64, if cols { (bext & !3) as i64 } else { 0 });
            let b_v = b.ins().iconst(types::I64, bext as i64);
            for (lane, from, to, step, var) in [
                (types::F32X4, zero, b4, 4, acc4a),
                (types::F32, b4, b_v, 1, acc),
            ] {
                emit_for(b, bv, from, to, step, |b, o_b| {
                    let i = fconst(b, lane, init);
                    b.def_var(var, i);
                    emit_for(b, lv, zero, l_v, 1, |b, j| {
                        // e = (a * l + j) * b + o_b
                        let al = b.ins().imul_imm(a, l as i64);
                        let alj = b.ins().iadd(al, j);
                        let row = b.ins().imul_imm(alj, bext as i64);
                        let e = b.ins().iadd(row, o_b);
                        let x = value_at(b, lane, e);
                        let cur = b.use_var(var);
                        let n = combine(b, op, cur, x);
                        b.def_var(var, n);
                    });
                    let ab = b.ins().imul_imm(a, bext as i64);
                    let o = b.ins().iadd(ab, o_b);
                    let total = b.use_var(var);
                    finish(b, lane, o, total);
                });
            }
        });
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_patterns() {
        assert_eq!(access(&[4, 8], &[4, 8]), Some(Access::Same));
        assert_eq!(access(&[], &[4, 8]), Some(Access::Scalar(None)));
        assert_eq!(access(&[1, 1], &[4, 8]), Some(Access::Scalar(None)));
        assert_eq!(
            access(&[8], &[4, 8]),
            Some(Access::Block { inner: 1, n: 8 })
        );
        assert_eq!(
            access(&[16, 1, 1], &[2, 16, 5, 5]),
            Some(Access::Block { inner: 25, n: 16 })
        );
        assert_eq!(
            access(&[4, 1], &[4, 8]),
            Some(Access::Block { inner: 8, n: 4 })
        );
        assert_eq!(
            access(&[1, 8], &[4, 8]),
            Some(Access::Block { inner: 1, n: 8 })
        );
        assert_eq!(access(&[3, 1, 5], &[3, 4, 5]), None);
    }
}

//! Cranelift loops around kernel bodies: elementwise kernels (`f32`, `f64`, or integers in
//! 32-bit lanes), softmax rows and reductions (`f32`), and row passes (`rows.rs`). The bodies come from [`crate::kernel`];
//! `render.rs` emits them.
//!
//! A compiled kernel has the C signature `fn(ptrs: *const *mut u8, start: u64, end: u64)`:
//! `ptrs` holds the base address of each input (in kernel input order) and then of each output;
//! the kernel computes elements `start..end` of its iteration space (so work can be split).
//! An elementwise kernel runs a 128-bit vector loop (`f32x4`, `f64x2`, `i32x4`) while every
//! operand allows it (and none is 8-bit), then a scalar loop for the tail.
//!
//! Operands are read by one of three patterns ([`Access`]): the same index as the output, one
//! scalar (a splat constant is an immediate), or a broadcast block, element `(i / inner) % n`,
//! which covers a bias `[C]` over `[N, C]` (`inner = 1`) and a per-channel `[C,1,1]` over
//! `[N,C,H,W]`.
//!
//! Setting `TCC_DUMP_JIT=1` prints each kernel's machine code to stderr.

use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{AbiParam, InstBuilder, MemFlags, Type, Value as CValue, types};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{FuncId, Linkage, Module};
use std::collections::HashMap;
use tcc_ir::{DType, Function, Value};

mod rows;

use super::render::{num_const, render};
use crate::kernel::expr::{Body, Lane};
use crate::kernel::lower::body as body_of;
use crate::kernel::{Access, ReduceShape, RowShape, Shape, access, int_bits, shape, splat_number};
use crate::plan::{Kernel, KernelData};

/// The entry point of a compiled kernel.
pub(crate) type KernelFn = unsafe extern "C" fn(ptrs: *const *mut u8, start: u64, end: u64);

/// Code generation settings that depend on the target.
#[derive(Clone, Copy)]
pub(crate) struct Target {
    /// Whether fused multiply-add instructions are available.
    pub fma: bool,
}

/// Each compiled kernel's entry point and iteration space.
pub(crate) type Entries = HashMap<Kernel, (KernelFn, Space)>;

/// The iteration space of a compiled kernel: indices `0..n` (split among threads), each
/// covering `unit` elements (1 for elementwise loops, a row or a reduced extent otherwise, a
/// row times its passes for row passes).
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
    ids: Vec<(Kernel, FuncId, Space)>,
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
    /// (elementwise, softmax rows, reductions, row passes), and returns its iteration space; `None` if not.
    pub(crate) fn compile(
        &mut self,
        f: &Function,
        k: Kernel,
        kd: &KernelData,
        name: &str,
    ) -> Result<Option<Space>, String> {
        let (m, tg) = (&mut self.module, self.tg);
        let (id, space) = match shape(f, kd) {
            Some(Shape::Elementwise(lane)) => {
                let n = f.ty(f.op(kd.ops[0]).results[0]).numel();
                let space = Space { n, unit: 1 };
                (compile(m, tg, f, kd, lane, name)?, space)
            }
            Some(Shape::Row(row)) => {
                let n = f.ty(f.op(row.root).args[0]).numel() / row.len;
                let space = Space { n, unit: row.len };
                (compile_row(m, tg, f, kd, &row, name)?, space)
            }
            Some(Shape::RowPasses(rp)) => {
                // Each row is read once per stage.
                let space = Space {
                    n: rp.rows,
                    unit: rp.len * rp.stages.len() as u64,
                };
                (rows::compile_row_passes(m, tg, f, kd, &rp, name)?, space)
            }
            Some(Shape::Reduction(red)) => {
                let space = Space {
                    n: red.a,
                    unit: red.l * red.b,
                };
                (compile_reduce(m, tg, f, kd, &red, name)?, space)
            }
            None => return Ok(None),
        };
        self.ids.push((k, id, space));
        Ok(Some(space))
    }

    /// Links the compiled kernels: the code memory, and each kernel's entry point and iteration
    /// space.
    pub(crate) fn finish(mut self) -> Result<(Code, Entries), String> {
        self.module
            .finalize_definitions()
            .map_err(|e| format!("linking compiled kernels: {e}"))?;
        let entries = self
            .ids
            .iter()
            .map(|&(k, id, space)| {
                let ptr = self.module.get_finalized_function(id);
                // SAFETY: `define_kernel` defined this function with the `KernelFn` signature.
                let code = unsafe { std::mem::transmute::<*const u8, KernelFn>(ptr) };
                (k, (code, space))
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

/// Compiles elementwise kernel `k`, computing in `lane`, into `module` under `name`.
fn compile(
    module: &mut JITModule,
    tg: Target,
    f: &Function,
    k: &KernelData,
    lane: Lane,
    name: &str,
) -> Result<FuncId, String> {
    // A 128-bit vector loop, then a scalar tail.
    let (scalar, vector) = match lane {
        Lane::F64 => (types::F64, types::F64X2),
        Lane::I32 | Lane::I8 | Lane::U8 => (types::I32, types::I32X4),
        Lane::F32 => (types::F32, types::F32X4),
    };
    let lanes = vector.lane_count() as u64;
    // Each operand's and result's dtype in memory (8-bit integers are widened to 32-bit lanes
    // when loaded and narrowed when stored, one at a time).
    let mems: Vec<DType> = k.inputs.iter().map(|&v| f.ty(v).dtype()).collect();
    let out_mems: Vec<DType> = k.outputs.iter().map(|&v| f.ty(v).dtype()).collect();
    let full_width = mems
        .iter()
        .chain(&out_mems)
        .all(|d| d.size_bytes() == scalar.bytes() as u64);
    let out_dims = f.ty(f.op(k.ops[0]).results[0]).dims().to_vec();
    let accesses: Vec<Access> = k
        .inputs
        .iter()
        .map(
            |&v| match access(f.ty(v).dims(), &out_dims).expect("checked by can_compile") {
                // Integers a float kernel compares are read as their bits, from memory.
                Access::Scalar(_) if int_bits(f, v, lane) => Access::Scalar(None),
                Access::Scalar(_) => Access::Scalar(splat_number(f, v)),
                a => a,
            },
        )
        .collect();
    let vectorizable = full_width
        && accesses.iter().all(|a| match *a {
            Access::Same | Access::Scalar(_) => true,
            Access::Block { inner, n } | Access::Gapped { inner, n, .. } => {
                (inner == 1 && n.is_multiple_of(lanes)) || inner.is_multiple_of(lanes)
            }
        });
    let kernel = body_of(lane, f, &k.inputs, 0, &k.ops, |_, _, _| {}, &k.outputs);
    define_kernel(module, name, |b, ptr, table, start, end| {
        let flags = MemFlags::trusted();
        let n_in = k.inputs.len();
        let bases: Vec<CValue> = (0..n_in + k.outputs.len())
            .map(|j| b.ins().load(ptr, flags, table, (j * 8) as i32))
            .collect();
        // Scalars are loaded (or materialised) once.
        let scalars = preload_scalars(b, scalar, &mems, &accesses, &bases);
        let i = b.declare_var(types::I64);
        // The vector loop (where every operand allows it), then the scalar one from where it
        // stopped.
        let split = if vectorizable {
            let len = b.ins().isub(end, start);
            let whole = b.ins().band_imm(len, !(lanes as i64 - 1));
            b.ins().iadd(start, whole)
        } else {
            start
        };
        for (lane, from, to) in [(vector, start, split), (scalar, split, end)] {
            if lane == vector && !vectorizable {
                continue;
            }
            let step = lane.lane_count() as i64;
            emit_for(b, i, from, to, step, |b, iv| {
                let args = load_operands(b, lane, iv, &mems, &accesses, &bases, &scalars);
                let outs = render(b, tg, lane, &kernel, &args);
                for (j, (&o, &d)) in outs.iter().zip(&out_mems).enumerate() {
                    let off = b.ins().ishl_imm(iv, shift_of(d));
                    let addr = b.ins().iadd(bases[n_in + j], off);
                    if matches!(d, DType::I8 | DType::U8) {
                        b.ins().istore8(flags, o, addr, 0);
                    } else {
                        b.ins().store(flags, o, addr, 0);
                    }
                }
            });
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

/// Bytes of a `d` element as a shift.
fn shift_of(d: DType) -> i64 {
    d.size_bytes().trailing_zeros() as i64
}

/// Loads the `d` element at `addr` as a scalar of lane type `ty` (8-bit integers widened).
fn load_scalar(b: &mut FunctionBuilder, d: DType, ty: Type, addr: CValue) -> CValue {
    let flags = MemFlags::trusted();
    match d {
        DType::I8 => b.ins().sload8(ty, flags, addr, 0),
        // A mask's byte, as a 32-bit integer whatever the lane (see `Node::MaskArg`).
        DType::Bool => b.ins().uload8(types::I32, flags, addr, 0),
        DType::U8 => b.ins().uload8(ty, flags, addr, 0),
        _ => b.ins().load(ty, flags, addr, 0),
    }
}

/// Loads (or materialises) once the operands read as scalars, as scalars of lane type `ty`
/// (operand `j` is a `mems[j]` in memory); `None` for the others.
fn preload_scalars(
    b: &mut FunctionBuilder,
    ty: Type,
    mems: &[DType],
    accesses: &[Access],
    bases: &[CValue],
) -> Vec<Option<CValue>> {
    accesses
        .iter()
        .zip(bases)
        .zip(mems)
        .map(|((a, &p), &d)| match a {
            Access::Scalar(Some(x)) => Some(num_const(b, ty, *x)),
            Access::Scalar(None) => Some(load_scalar(b, d, ty, p)),
            _ => None,
        })
        .collect()
}

/// Loads every operand of a kernel as `lane` values for element `e` (the first of the vector's
/// for a vector type), in order; operand `j` is a `mems[j]` in memory (for a vector type, one
/// of the lane's width).
fn load_operands(
    b: &mut FunctionBuilder,
    lane: Type,
    e: CValue,
    mems: &[DType],
    accesses: &[Access],
    bases: &[CValue],
    scalars: &[Option<CValue>],
) -> Vec<CValue> {
    let flags = MemFlags::trusted();
    let mut vals = Vec::with_capacity(accesses.len());
    for (j, a) in accesses.iter().enumerate() {
        let shift = shift_of(mems[j]);
        let x = match *a {
            Access::Scalar(_) => {
                let s = scalars[j].expect("preloaded");
                if lane.is_vector() {
                    b.ins().splat(lane, s)
                } else {
                    s
                }
            }
            Access::Same => {
                let off = b.ins().ishl_imm(e, shift);
                let addr = b.ins().iadd(bases[j], off);
                if lane.is_vector() {
                    b.ins().load(lane, flags, addr, 0)
                } else {
                    load_scalar(b, mems[j], lane, addr)
                }
            }
            Access::Block { inner, n } | Access::Gapped { inner, n, .. } => {
                let q = if inner == 1 {
                    e
                } else {
                    b.ins().udiv_imm(e, inner as i64)
                };
                let mut idx = b.ins().urem_imm(q, n as i64);
                if let Access::Gapped {
                    outer_inner,
                    outer_n,
                    ..
                } = *a
                {
                    let q = b.ins().udiv_imm(e, outer_inner as i64);
                    let hi = b.ins().urem_imm(q, outer_n as i64);
                    let hi = b.ins().imul_imm(hi, n as i64);
                    idx = b.ins().iadd(hi, idx);
                }
                let off = b.ins().ishl_imm(idx, shift);
                let addr = b.ins().iadd(bases[j], off);
                if !lane.is_vector() {
                    load_scalar(b, mems[j], lane, addr)
                } else if inner == 1 {
                    b.ins().load(lane, flags, addr, 0)
                } else {
                    let s = load_scalar(b, mems[j], lane.lane_type(), addr);
                    b.ins().splat(lane, s)
                }
            }
        };
        vals.push(x);
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

/// The variables [`fold_row`] loops with: the element index, the scalar accumulator and the
/// two vector ones.
#[derive(Clone, Copy)]
struct FoldVars {
    j: cranelift_frontend::Variable,
    acc: cranelift_frontend::Variable,
    pair: [cranelift_frontend::Variable; 2],
}

/// Folds the `len` values of a row with `step` (accumulator, value) from `init`: eight at a
/// time in two `f32x4` accumulators, which are then combined and their lanes folded in order,
/// then the scalar tail. `value_at(b, lane, j)` is the value at element `j` of the row, four
/// lanes or one.
fn fold_row(
    b: &mut FunctionBuilder,
    tg: Target,
    step: &Body,
    init: f64,
    len: u64,
    FoldVars { j, acc, pair }: FoldVars,
    value_at: impl Fn(&mut FunctionBuilder, Type, CValue) -> CValue,
) -> CValue {
    let combine = |b: &mut FunctionBuilder, lane: Type, a: CValue, x: CValue| {
        render(b, tg, lane, step, &[a, x])[0]
    };
    let i4 = num_const(b, types::F32X4, init);
    b.def_var(pair[0], i4);
    b.def_var(pair[1], i4);
    let zero = b.ins().iconst(types::I64, 0);
    let len8 = b.ins().iconst(types::I64, (len & !7) as i64);
    let len_v = b.ins().iconst(types::I64, len as i64);
    emit_for(b, j, zero, len8, 8, |b, jv| {
        let x0 = value_at(b, types::F32X4, jv);
        let j4 = b.ins().iadd_imm(jv, 4);
        let x1 = value_at(b, types::F32X4, j4);
        let (p, q) = (b.use_var(pair[0]), b.use_var(pair[1]));
        let p = combine(b, types::F32X4, p, x0);
        let q = combine(b, types::F32X4, q, x1);
        b.def_var(pair[0], p);
        b.def_var(pair[1], q);
    });
    let (p, q) = (b.use_var(pair[0]), b.use_var(pair[1]));
    let v = combine(b, types::F32X4, p, q);
    let mut s = b.ins().extractlane(v, 0);
    for lane in 1..4 {
        let x = b.ins().extractlane(v, lane);
        s = combine(b, types::F32, s, x);
    }
    b.def_var(acc, s);
    emit_for(b, j, len8, len_v, 1, |b, jv| {
        let x = value_at(b, types::F32, jv);
        let cur = b.use_var(acc);
        let n = combine(b, types::F32, cur, x);
        b.def_var(acc, n);
    });
    b.use_var(acc)
}

/// Combines the four lanes of `v` with the two-argument `step` body, lane 0 first.
fn across(b: &mut FunctionBuilder, tg: Target, step: &Body, v: CValue) -> CValue {
    let mut m = b.ins().extractlane(v, 0);
    for l in 1..4 {
        let x = b.ins().extractlane(v, l);
        m = render(b, tg, types::F32, step, &[m, x])[0];
    }
    m
}

/// Compiles row kernel `k` of layout `row`: for each row in
/// `start..end`, one pass for the maximum, one for the sum of `exp(x - max)`, and one that writes
/// `exp(x - max) / sum` and runs the epilogue. The prologue is recomputed in each pass rather than
/// stored. NaN in a row makes the whole row NaN, as in the interpreter.
fn compile_row(
    module: &mut JITModule,
    tg: Target,
    f: &Function,
    k: &KernelData,
    row: &RowShape,
    name: &str,
) -> Result<FuncId, String> {
    let &RowShape { root, len } = row;
    let dims = f.ty(f.op(root).args[0]).dims().to_vec();
    let accesses: Vec<Access> = k
        .inputs
        .iter()
        .map(|&v| match access(f.ty(v).dims(), &dims).expect("checked") {
            Access::Scalar(_) => Access::Scalar(splat_number(f, v)),
            a => a,
        })
        .collect();
    // Four lanes at a time within each row when every operand can be read so.
    let vectorizable = len >= 4
        && accesses.iter().all(|a| match *a {
            Access::Same | Access::Scalar(_) => true,
            Access::Block { inner, n } | Access::Gapped { inner, n, .. } => {
                len.is_multiple_of(4)
                    && ((inner == 1 && n.is_multiple_of(4)) || inner.is_multiple_of(4))
            }
        });
    let crate::kernel::RowBodies {
        input,
        max_step,
        sum_step,
        add,
        row_consts,
        output,
    } = crate::kernel::row_bodies(f, k, row);
    // Every operand is an f32 in memory (`row_shape` checked).
    let f32s = vec![DType::F32; accesses.len()];
    define_kernel(module, name, |b, ptr, table, start, end| {
        let flags = MemFlags::trusted();
        let n_in = k.inputs.len();
        let bases: Vec<CValue> = (0..n_in + k.outputs.len())
            .map(|j| b.ins().load(ptr, flags, table, (j * 8) as i32))
            .collect();
        let scalars = preload_scalars(b, types::F32, &f32s, &accesses, &bases);
        let (r, j) = (b.declare_var(types::I64), b.declare_var(types::I64));
        let (acc, vacc) = (b.declare_var(types::F32), b.declare_var(types::F32X4));
        let len_v = b.ins().iconst(types::I64, len as i64);
        let len4_v = b
            .ins()
            .iconst(types::I64, if vectorizable { (len & !3) as i64 } else { 0 });
        let zero = b.ins().iconst(types::I64, 0);
        // The prologue's value of the softmax input at element `e`.
        let input_at = |b: &mut FunctionBuilder, lane: Type, e: CValue| {
            let args = load_operands(b, lane, e, &f32s, &accesses, &bases, &scalars);
            render(b, tg, lane, &input, &args)[0]
        };
        // Folds `step` (accumulator, value, then `extra`) over the prologue's values of one
        // row, four lanes at a time and then the scalar tail; `lanes` combines the four lanes
        // of the vector accumulator.
        let fold_row = |b: &mut FunctionBuilder,
                        row: CValue,
                        init: f32,
                        step: &Body,
                        extra: [CValue; 2],
                        lanes: &Body| {
            let i4 = num_const(b, types::F32X4, init as f64);
            b.def_var(vacc, i4);
            let [extra4, extra1] = extra;
            for (lane, var, from, to, step_by, extra) in [
                (types::F32X4, vacc, zero, len4_v, 4, extra4),
                (types::F32, acc, len4_v, len_v, 1, extra1),
            ] {
                if lane == types::F32 {
                    // The vector accumulator's lanes start the scalar tail.
                    let v = b.use_var(vacc);
                    let a0 = across(b, tg, lanes, v);
                    b.def_var(acc, a0);
                }
                emit_for(b, j, from, to, step_by, |b, jv| {
                    let e = b.ins().iadd(row, jv);
                    let x = input_at(b, lane, e);
                    let cur = b.use_var(var);
                    let n = render(b, tg, lane, step, &[cur, x, extra][..step.num_args()]);
                    b.def_var(var, n[0]);
                });
            }
            b.use_var(acc)
        };
        emit_for(b, r, start, end, 1, |b, rv| {
            let row = b.ins().imul_imm(rv, len as i64);
            // Pass 1: the row's maximum.
            let mx = fold_row(b, row, f32::NEG_INFINITY, &max_step, [zero; 2], &max_step);
            // Pass 2: the sum of exp(x - max).
            let mxv = b.ins().splat(types::F32X4, mx);
            let sum = fold_row(b, row, 0.0, &sum_step, [mxv, mx], &add);
            // Pass 3: normalise, run the epilogue, store.
            let c = render(b, tg, types::F32, &row_consts, &[mx, sum]);
            let (inv, shift) = (c[0], c[1]);
            let invv = b.ins().splat(types::F32X4, inv);
            let shiftv = b.ins().splat(types::F32X4, shift);
            for (lane, from, to, step, row_args) in [
                (types::F32X4, zero, len4_v, 4, [mxv, invv, shiftv]),
                (types::F32, len4_v, len_v, 1, [mx, inv, shift]),
            ] {
                emit_for(b, j, from, to, step, |b, jv| {
                    let e = b.ins().iadd(row, jv);
                    let mut args = load_operands(b, lane, e, &f32s, &accesses, &bases, &scalars);
                    args.extend(row_args);
                    let outs = render(b, tg, lane, &output, &args);
                    for (o, &v) in outs.iter().enumerate() {
                        let off = b.ins().ishl_imm(e, 2);
                        let addr = b.ins().iadd(bases[n_in + o], off);
                        b.ins().store(flags, v, addr, 0);
                    }
                });
            }
        });
    })
}

/// Compiles reduction kernel `k` of layout `red`. For each `a` in
/// `start..end` and each output `b`, accumulates the prologue's values over `l` in `f32`; rows
/// (`b == 1`) use two `f32x4` accumulators along `l`, other layouts compute four neighbouring
/// outputs at once, in four accumulators that take turns along `l`. Then the mean's division
/// and the epilogue, and the stores.
fn compile_reduce(
    module: &mut JITModule,
    tg: Target,
    f: &Function,
    k: &KernelData,
    red: &ReduceShape,
    name: &str,
) -> Result<FuncId, String> {
    let ReduceShape {
        root, l, b: bext, ..
    } = *red;
    let in_dims = f.ty(f.op(root).args[0]).dims().to_vec();
    let out_dims = f.ty(f.op(root).results[0]).dims().to_vec();
    let crate::kernel::ReduceBodies {
        pro_in,
        epi_in,
        init,
        input,
        step,
        output,
    } = crate::kernel::reduce_bodies(f, k, red);
    let acc_of = |v: Value, dims: &[u64]| match access(f.ty(v).dims(), dims).expect("checked") {
        Access::Scalar(_) => Access::Scalar(splat_number(f, v)),
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
    let combine = |b: &mut FunctionBuilder, lane: Type, acc: CValue, x: CValue| {
        render(b, tg, lane, &step, &[acc, x])[0]
    };
    // Every operand is an f32 in memory (`reduce_shape` checked).
    let (pro_f32, epi_f32) = (
        vec![DType::F32; pro_acc.len()],
        vec![DType::F32; epi_acc.len()],
    );
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
        let pro_sc = preload_scalars(b, types::F32, &pro_f32, &pro_acc, &pro_bases);
        let epi_sc = preload_scalars(b, types::F32, &epi_f32, &epi_acc, &epi_bases);
        let value_at = |b: &mut FunctionBuilder, lane: Type, e: CValue| {
            let args = load_operands(b, lane, e, &pro_f32, &pro_acc, &pro_bases, &pro_sc);
            render(b, tg, lane, &input, &args)[0]
        };
        // The finish and the stores for output element `o`.
        let finish = |b: &mut FunctionBuilder, lane: Type, o: CValue, acc: CValue| {
            let mut args = load_operands(b, lane, o, &epi_f32, &epi_acc, &epi_bases, &epi_sc);
            args.push(acc);
            let outs = render(b, tg, lane, &output, &args);
            for (j, &v) in outs.iter().enumerate() {
                let off = b.ins().ishl_imm(o, 2);
                let addr = b.ins().iadd(out_bases[j], off);
                b.ins().store(flags, v, addr, 0);
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
        let accs4 = [
            acc4a,
            acc4b,
            b.declare_var(types::F32X4),
            b.declare_var(types::F32X4),
        ];
        let accs1 = [
            acc,
            b.declare_var(types::F32),
            b.declare_var(types::F32),
            b.declare_var(types::F32),
        ];
        let zero = b.ins().iconst(types::I64, 0);
        let l_v = b.ins().iconst(types::I64, l as i64);
        emit_for(b, av, start, end, 1, |b, a| {
            if rows {
                // One output per row.
                let row = b.ins().imul_imm(a, l as i64);
                let vars = FoldVars {
                    j: lv,
                    acc,
                    pair: [acc4a, acc4b],
                };
                let total = fold_row(b, tg, &step, init as f64, l, vars, |b, lane, j| {
                    let e = b.ins().iadd(row, j);
                    value_at(b, lane, e)
                });
                finish(b, types::F32, a, total);
                return;
            }
            // Outputs b of this a: four at a time where allowed, then one at a time.
            let b4 = b
                .ins()
                .iconst(types::I64, if cols { (bext & !3) as i64 } else { 0 });
            let b_v = b.ins().iconst(types::I64, bext as i64);
            // Along l, four accumulators take turns (then the tail goes to the first), so that
            // the combining steps of neighbouring elements do not wait for each other.
            let l4 = b.ins().iconst(types::I64, (l & !3) as i64);
            for (lane, from, to, step, vars) in [
                (types::F32X4, zero, b4, 4, &accs4),
                (types::F32, b4, b_v, 1, &accs1),
            ] {
                emit_for(b, bv, from, to, step, |b, o_b| {
                    let i = num_const(b, lane, init as f64);
                    for &var in vars {
                        b.def_var(var, i);
                    }
                    // Element j of this output: (a * l + j) * b + o_b.
                    let at = |b: &mut FunctionBuilder, j: CValue| {
                        let al = b.ins().imul_imm(a, l as i64);
                        let alj = b.ins().iadd(al, j);
                        let row = b.ins().imul_imm(alj, bext as i64);
                        b.ins().iadd(row, o_b)
                    };
                    emit_for(b, lv, zero, l4, 4, |b, j| {
                        let e = at(b, j);
                        for (u, &var) in vars.iter().enumerate() {
                            let e = b.ins().iadd_imm(e, (u as u64 * bext) as i64);
                            let x = value_at(b, lane, e);
                            let cur = b.use_var(var);
                            let n = combine(b, lane, cur, x);
                            b.def_var(var, n);
                        }
                    });
                    emit_for(b, lv, l4, l_v, 1, |b, j| {
                        let e = at(b, j);
                        let x = value_at(b, lane, e);
                        let cur = b.use_var(vars[0]);
                        let n = combine(b, lane, cur, x);
                        b.def_var(vars[0], n);
                    });
                    let v: Vec<CValue> = vars.iter().map(|&var| b.use_var(var)).collect();
                    let p = combine(b, lane, v[0], v[1]);
                    let q = combine(b, lane, v[2], v[3]);
                    let total = combine(b, lane, p, q);
                    let ab = b.ins().imul_imm(a, bext as i64);
                    let o = b.ins().iadd(ab, o_b);
                    finish(b, lane, o, total);
                });
            }
        });
    })
}

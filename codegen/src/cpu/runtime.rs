//! Running a compiled function: an arena per run (pooled, so concurrent runs never share one),
//! the steps in order, and the results copied out. Also the per-step profile that
//! [`Cpu::profile`](super::Cpu) turns on.

use super::bytes::{advise_huge_pages, capacity_ptr, lines, read_data, set_len, write_data};
use super::conv::run_conv;
use super::copies::Copies;
use super::lower::{Finish, LibOp, Loop, Step};
use super::matmul::run_matmul;
use super::pool;
use super::send_ptr::SendPtr;
use super::{Copying, Executable};
use crate::backend::Profile;
use crate::backend::RunError;
use crate::memory::Storage;
use crate::plan::Kernel;
use std::collections::HashMap;
use std::time::Duration;
use tcc_ir::interp::{check_input_types, eval_op};
use tcc_ir::{Data, Tensor, TensorRef, TensorType, Value, ValueDef};

/// The cores this process may run on, found once: asking reads the cgroup's files, several
/// microseconds, as long as a small model's whole run.
fn cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Loops of at least this many elements are split across threads.
const PARALLEL_ELEMENTS: u64 = 1 << 16;

/// Runs a compiled loop over its iteration space, in pieces on several threads when it is large.
fn run_loop(l: &Loop, addr: &dyn Fn(Value) -> *mut u8) {
    let (n, unit) = (l.space.n, l.space.unit);
    let ptrs: Vec<*mut u8> = l.args.iter().map(|&v| addr(v)).collect();
    let threads = pool::threads() as u64;
    if n * unit < PARALLEL_ELEMENTS || threads < 2 || n < 2 {
        // SAFETY: each pointer addresses storage of its value's type (inputs are checked, the
        // arena is sized by the memory plan), and the kernel touches elements 0..n only.
        unsafe { (l.code)(ptrs.as_ptr(), 0, n) };
        return;
    }
    // Elementwise pieces start at multiples of 64 elements so every piece but the last
    // vectorises fully; row kernels split by rows.
    let round = if unit == 1 { 64 } else { 1 };
    let piece = n.div_ceil(threads).div_ceil(round) * round;
    // SAFETY: the pieces of one loop write disjoint element ranges of its outputs and only read
    // its inputs; `ptrs` outlives the scope.
    let table = unsafe { SendPtr::new(ptrs.as_ptr()) };
    pool::for_each(n.div_ceil(piece) as usize, &|i| {
        let start = i as u64 * piece;
        let end = (start + piece).min(n);
        // SAFETY: as above; pieces cover disjoint ranges of an elementwise loop.
        unsafe { (l.code)(table.get(), start, end) }
    });
}

/// Runs elements `range` of an elementwise loop on this thread. The loop's vector body reads
/// broadcast operands a vector at a time, which is only right from a start at a multiple of its
/// lanes (as [`run_loop`]'s pieces are), so a misaligned head runs first on its own, short
/// enough to take the scalar tail.
///
/// # Safety
/// `table` holds the loop's operand pointers; `range` lies in its iteration space, and no
/// other thread runs an overlapping range meanwhile.
unsafe fn run_piece(l: &Loop, table: *const *mut u8, range: std::ops::Range<usize>) {
    debug_assert_eq!(l.space.unit, 1, "an elementwise epilogue");
    // The widest vector body has four lanes (f32x4, i32x4; f64x2 divides it).
    let (start, end) = (range.start as u64, range.end as u64);
    let aligned = start.next_multiple_of(4).min(end);
    // SAFETY: the caller's contract.
    unsafe {
        if start < aligned {
            (l.code)(table, start, aligned);
        }
        if aligned < end {
            (l.code)(table, aligned, end);
        }
    }
}

impl Executable {
    /// Runs on `inputs` (one per parameter, of its type) and returns the results.
    ///
    /// The steps run on the calling thread, their parallel parts also on the workers of
    /// `cpu::pool` (as many threads in all as the caller's rayon pool has: one per core outside
    /// any), which spin between steps while the run lasts.
    pub fn run(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>, RunError> {
        let views: Vec<TensorRef> = inputs.iter().map(Tensor::view).collect();
        self.run_refs(&views)
    }

    /// [`Executable::run`] on inputs borrowed from memory the caller owns (numpy arrays, for
    /// the Python package): the kernels read them in place.
    pub fn run_refs(&self, inputs: &[TensorRef<'_>]) -> Result<Vec<Tensor>, RunError> {
        let _run = pool::Run::start();
        self.run_here(inputs)
    }

    /// [`Executable::run_refs`] on this thread.
    fn run_here(&self, inputs: &[TensorRef<'_>]) -> Result<Vec<Tensor>, RunError> {
        let f = &self.func;
        let types: Vec<&TensorType> = inputs.iter().map(|t| t.ty()).collect();
        check_input_types(f, &types).map_err(|e| RunError(e.0))?;
        let pooled = self.arenas.lock().map(|mut p| p.pop()).unwrap_or(None);
        // The arena is the device's memory; the host pool holds swapped-out values.
        let (mut arena, mut host) = pooled.unwrap_or_else(|| {
            let mut a = lines(self.mem.arena_bytes);
            advise_huge_pages(a.as_mut_ptr() as *mut u8, a.len() * 64);
            (a, lines(self.mem.host_bytes))
        });
        let base = arena.as_mut_ptr() as *mut u8;
        let host_base = host.as_mut_ptr() as *mut u8;
        // Output buffers: allocated with capacity only, written by the kernels, returned.
        let mut outs: Vec<Data> = self
            .mem
            .outputs
            .iter()
            .map(|&v| Data::with_capacity(f.ty(v).dtype(), f.ty(v).numel() as usize))
            .collect();
        let out_ptrs: Vec<*mut u8> = outs.iter_mut().map(capacity_ptr).collect();
        for (&p, &v) in out_ptrs.iter().zip(&self.mem.outputs) {
            advise_huge_pages(p, f.ty(v).size_bytes() as usize);
        }
        let addr = |v: Value| -> *mut u8 {
            let v = self.origin.get(&v).copied().unwrap_or(v);
            match self.mem.storage[v] {
                Storage::Arena(off) => base.wrapping_add(off as usize),
                Storage::Host(off) => host_base.wrapping_add(off as usize),
                Storage::Output(i) => out_ptrs[i],
                Storage::Param => match f.value(v).def {
                    // Only read: kernels write in place over arena buffers alone.
                    ValueDef::Param(i) => inputs[i].bytes().as_ptr() as *mut u8,
                    ValueDef::Result(..) => unreachable!("parameter storage for an op result"),
                },
                Storage::Const => self.consts[&v].as_ptr() as *mut u8,
                Storage::None => unreachable!("a value read outside its kernel is stored"),
            }
        };
        let profile = self.profile.is_some();
        // Swaps run on the copy thread (or inline, `Copying`); a step waits for the copies it
        // needs first.
        let swaps = self
            .steps
            .iter()
            .any(|(_, s)| matches!(s, Step::Swap { .. }));
        let inline = || match self.copying {
            Copying::Thread => false,
            Copying::Inline => true,
            Copying::Auto => pool::threads() >= cores(),
        };
        let mut copies =
            swaps.then(|| Copies::new(self.steps.len(), self.link_bandwidth, inline()));
        for (si, (k, step)) in self.steps.iter().enumerate() {
            let t0 = profile.then(std::time::Instant::now);
            if let Some(c) = &copies {
                for &s in &self.waits[si] {
                    c.wait(s);
                }
            }
            match step {
                Step::Jit(l) => run_loop(l, &addr),
                Step::Library { op, epilogue } => {
                    // The epilogue runs piece by piece as the call finishes its output, on the
                    // thread that wrote each piece.
                    let ptrs: Vec<*mut u8> = (epilogue.iter().flat_map(|l| &l.args))
                        .map(|&v| addr(v))
                        .collect();
                    // SAFETY: the pieces are disjoint ranges of the epilogue's iteration space
                    // (each element is reported once), and `ptrs` outlives the call.
                    let table = unsafe { SendPtr::new(ptrs.as_ptr()) };
                    let piece = |r: std::ops::Range<usize>| {
                        let l = epilogue.as_ref().expect("a finish only with an epilogue");
                        // SAFETY: as for `table`; the range lies in the output, the loop's
                        // iteration space (elementwise, one element per iteration).
                        unsafe { run_piece(l, table.get(), r) }
                    };
                    let finish: Finish = epilogue.is_some().then_some(&piece);
                    match op {
                        LibOp::MatMul(mm) => run_matmul(mm, &addr, finish),
                        LibOp::Conv(cv) => run_conv(cv, &addr, base, finish),
                        LibOp::Nchwc(cv) => cv.run(&addr, finish),
                    }
                }
                // SAFETY: the memory plan gives every value storage of its type, and only
                // elementwise results share storage with their operands.
                Step::Native(n) => unsafe { n.run(f, &addr) }.map_err(|msg| {
                    RunError(format!(
                        "in `@{}`, {}: {msg}",
                        f.name,
                        f.describe_op(n.op())
                    ))
                })?,
                Step::Reference => self.run_reference(*k, &addr)?,
                &Step::Swap { src, dst, bytes } => {
                    let c = copies.as_mut().expect("a run with swaps has its copies");
                    // SAFETY: the memory plan gives both values `bytes` of storage in different
                    // places (the arena and the host pool, or the reverse); the steps that
                    // would write either (or read the destination) wait for this copy first
                    // (`lower::copy_waits`), and the run waits for all copies before it returns
                    // or frees the arena (`Copies::finish`, and its `Drop` on an error).
                    unsafe { c.issue(si, addr(src), addr(dst), bytes) }
                }
            }
            if let (Some(t0), Some(p)) = (t0, &self.profile)
                && let Ok(mut p) = p.lock()
            {
                p.1[si] += t0.elapsed();
            }
        }
        // Results and the pooled arena are read and reused only once every copy is done.
        if let Some(c) = copies.take() {
            c.finish();
        }
        if let Some(p) = &self.profile
            && let Ok(mut p) = p.lock()
        {
            p.0 += 1;
        }
        // Every step ran, so every output buffer is fully written.
        for (d, &v) in outs.iter_mut().zip(&self.mem.outputs) {
            // SAFETY: the kernels wrote all `numel` elements of the buffer, each a valid value
            // of the buffer's dtype (bools as 0 or 1).
            unsafe { set_len(d, f.ty(v).numel() as usize) };
        }
        let mut outs: Vec<Option<Data>> = outs.into_iter().map(Some).collect();
        let mut given: HashMap<usize, usize> = HashMap::new();
        let mut results: Vec<Tensor> = Vec::with_capacity(f.results().len());
        for &r in f.results() {
            let root = self.origin.get(&r).copied().unwrap_or(r);
            let t = match self.mem.storage[root] {
                Storage::Output(i) => {
                    let data = match outs[i].take() {
                        Some(d) => d,
                        None => results[given[&i]].data().clone(),
                    };
                    given.entry(i).or_insert(results.len());
                    Tensor::new(f.ty(r).clone(), data)
                        .expect("an output buffer of the result's size")
                }
                // SAFETY: parameters and constants hold values of their type.
                _ => unsafe { read_data(addr(r), f.ty(r)) },
            };
            results.push(t);
        }
        if let Ok(mut pool) = self.arenas.lock() {
            pool.push((arena, host));
        }
        Ok(results)
    }

    /// Runs one kernel with the reference kernels. All inputs are read before any output is
    /// written, so outputs planned in place over inputs are safe.
    fn run_reference(&self, k: Kernel, addr: &dyn Fn(Value) -> *mut u8) -> Result<(), RunError> {
        let f = &self.func;
        let kd = &self.plan.kernels[k];
        let mut vals: HashMap<Value, Tensor> = HashMap::new();
        for &v in &kd.inputs {
            let t = match crate::plan::folded_transpose(f, &self.plan, v) {
                // A transpose planned as a view for the GEMM: materialise it here.
                Some(src) => {
                    // SAFETY: the source is a stored value of its type.
                    let s = unsafe { read_data(addr(src), f.ty(src)) };
                    let op = f.def_op(v).expect("a transpose result");
                    eval_op(&f.op(op).kind, &[&s], &[f.ty(v).clone()])
                        .map_err(RunError)?
                        .remove(0)
                }
                // SAFETY: kernel inputs are stored values of their type.
                None => unsafe { read_data(addr(v), f.ty(v)) },
            };
            vals.insert(v, t);
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
            // SAFETY: the memory plan gives each output storage of its type; all inputs were
            // read above, so storage shared with an input is no longer needed.
            unsafe { write_data(addr(o), &vals[&o]) };
        }
        Ok(())
    }
}

impl Executable {
    /// The time spent in each step over all runs so far; `None` unless compiled with
    /// [`Cpu::profile`](super::Cpu) set.
    pub fn profile(&self) -> Option<Profile> {
        let guard = self.profile.as_ref()?.lock().ok()?;
        let (runs, times) = &*guard;
        let f = &self.func;
        let mut steps: Vec<(Duration, String)> = self
            .steps
            .iter()
            .zip(times.iter())
            .map(|((k, s), &t)| {
                let what = match s {
                    Step::Jit(_) => "jit",
                    Step::Library { .. } => "library",
                    Step::Native(_) => "native",
                    Step::Reference => "reference",
                    Step::Swap { .. } => "copy",
                };
                let name = crate::plan::describe(f, &self.plan.kernels[*k]);
                (t, format!("{what:<9} {:<5} {name}", k.to_string()))
            })
            .collect();
        steps.sort_by_key(|&(t, _)| std::cmp::Reverse(t));
        Some(Profile {
            function: f.name.clone(),
            runs: *runs,
            steps,
        })
    }
}

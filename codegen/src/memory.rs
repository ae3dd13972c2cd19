//! Memory planning: one arena for every value a kernel stores, with offsets chosen so that values
//! alive at the same time never overlap.
//!
//! - Parameters and constants live outside the arena (the caller's inputs, the constant pool).
//! - A `reshape` (a view kernel) stores nothing: its result shares its operand's storage.
//! - Lifetimes are kernel indices: a buffer is live from the kernel that writes it through the
//!   last kernel that reads it (through views too); results are live to the end.
//! - In place: an elementwise kernel may write an output over an input buffer of the same size
//!   whose last reader it is (each element is read before it is written at the same index). Such
//!   chains share one slot.
//! - Slots are placed greedily by size, largest first, each at the lowest offset that overlaps no
//!   placed slot with an intersecting lifetime (TFLite's "greedy by size"). Offsets are 64-byte
//!   aligned. `arena_bytes` is the resulting peak; `live_peak_bytes` is the lower bound any
//!   placement must reach (the most bytes live at one kernel).
//! - Concatenations in place: an operand that a batch-1 concatenation reads last is written by
//!   its kernel straight into its place in the concatenation's slot ([`in_place_concats`]).
//! - Scratch: a kernel that needs working space while it runs (the backend says how much,
//!   [`Backend::scratch_bytes`]) gets a slot live during that kernel only.
//! - Host values (`swap_out`'s results) live in a second pool, host memory, placed the same
//!   way (`host_bytes`): a swapped-out value's device slot is free from its `swap_out` to its
//!   `swap_in`, and the arena is that much smaller.

use crate::backend::Backend;
use crate::plan::{KernelKind, Plan};
use cranelift_entity::SecondaryMap;
use tcc_ir::{Function, OpKind, Value};

/// Byte alignment of every arena offset.
pub const ALIGN: u64 = 64;

fn align(n: u64) -> u64 {
    n.div_ceil(ALIGN) * ALIGN
}

/// Where a value is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Storage {
    /// Not stored (internal to a kernel, or not computed).
    #[default]
    None,
    /// A function parameter (the caller's buffer).
    Param,
    /// A constant (the constant pool).
    Const,
    /// In the arena at this byte offset.
    Arena(u64),
    /// In output buffer `i` of the run, which becomes a returned result (its own allocation,
    /// so results are not copied out of the arena).
    Output(usize),
    /// In the host pool at this byte offset (a `swap_out`'s result).
    Host(u64),
}

/// One arena slot: values that share storage (an in-place chain), with their combined lifetime.
#[derive(Clone, Debug)]
pub struct Slot {
    /// The values stored in it, in order of definition.
    pub values: Vec<Value>,
    /// Size in bytes, aligned.
    pub size: u64,
    /// First kernel index at which it is written.
    pub first: usize,
    /// Last kernel index at which it is read (the kernel count for results).
    pub last: usize,
    /// Byte offset in the arena.
    pub offset: u64,
    /// For a scratch slot (no values), the kernel that uses it.
    pub scratch_for: Option<crate::plan::Kernel>,
    /// For a slot holding a result, the output buffer it is (then it is not in the arena).
    pub output: Option<usize>,
    /// Whether it is in the host pool (then `offset` is there).
    pub host: bool,
}

/// The memory plan of one function.
#[derive(Clone, Debug)]
pub struct MemoryPlan {
    /// Where each value lives.
    pub storage: SecondaryMap<Value, Storage>,
    /// The arena slots, and the output buffers (slots with `output` set).
    pub slots: Vec<Slot>,
    /// For each output buffer, the result value whose type it has.
    pub outputs: Vec<Value>,
    /// Bytes of output buffers (results computed by kernels), allocated per run outside the
    /// arena and returned.
    pub output_bytes: u64,
    /// Arena size: the highest end offset of any slot.
    pub arena_bytes: u64,
    /// Host pool size: the highest end offset of any host slot (0 without swaps).
    pub host_bytes: u64,
    /// The most bytes live at any one kernel: a lower bound on `arena_bytes`.
    pub live_peak_bytes: u64,
    /// Bytes of parameters.
    pub param_bytes: u64,
    /// Bytes of non-splat constants.
    pub const_bytes: u64,
}

/// Plans storage for `f` cut into kernels by `plan`, with the scratch space `backend` needs.
pub fn plan_memory<B: Backend + ?Sized>(f: &Function, plan: &Plan, backend: &B) -> MemoryPlan {
    let n_kernels = plan.kernels.len();
    let mut storage: SecondaryMap<Value, Storage> =
        SecondaryMap::with_capacity(f.num_values_created());
    // The value whose storage each value uses (itself, or a view's source).
    let mut root: SecondaryMap<Value, Option<Value>> =
        SecondaryMap::with_capacity(f.num_values_created());
    let mut param_bytes = 0;
    for &p in f.params() {
        storage[p] = Storage::Param;
        root[p] = Some(p);
        param_bytes += f.ty(p).size_bytes();
    }
    let mut const_bytes = 0;
    for &op in &plan.constants {
        let r = f.op(op).results[0];
        storage[r] = Storage::Const;
        root[r] = Some(r);
        if let OpKind::Const {
            value: tcc_ir::Literal::Dense(_),
            ty,
        } = &f.op(op).kind
        {
            const_bytes += ty.size_bytes();
        }
    }
    // Pass 1: the storage root of every value (views share their source's) and the last kernel
    // that reads each root; results are read at the end.
    let mut last_use: SecondaryMap<Value, usize> =
        SecondaryMap::with_capacity(f.num_values_created());
    for (ki, (_, kd)) in plan.kernels.iter().enumerate() {
        for &a in &kd.inputs {
            if let Some(r) = root[a] {
                last_use[r] = last_use[r].max(ki);
            }
        }
        if kd.kind == KernelKind::View {
            let op = kd.ops[0];
            let (src, out) = (f.op(op).args[0], f.op(op).results[0]);
            root[out] = root[src];
            storage[out] = root[src].map_or(Storage::None, |r| storage[r]);
        } else {
            for &o in &kd.outputs {
                root[o] = Some(o);
                last_use[o] = ki;
            }
        }
    }
    for &r in f.results() {
        if let Some(x) = root[r] {
            last_use[x] = n_kernels;
        }
    }
    let within = in_place_concats(f, plan, &root, &last_use, &storage);
    // Pass 2: slots. An elementwise kernel writes an output over an input slot when it is the
    // last reader of the value there and the two have the same size and element size. A value
    // written in place into a concatenation has no slot of its own: the concatenation's slot
    // is created when the first such operand is, and no kernel writes over it in place.
    let mut slot_of: SecondaryMap<Value, Option<usize>> =
        SecondaryMap::with_capacity(f.num_values_created());
    let mut slots: Vec<Slot> = Vec::new();
    let mut hosting: Vec<bool> = Vec::new();
    for (ki, (_, kd)) in plan.kernels.iter().enumerate() {
        if kd.kind == KernelKind::View {
            continue;
        }
        for &o in &kd.outputs {
            let ty = f.ty(o);
            if let Some((mut cat, _)) = within[o] {
                // The outermost concatenation: one placed in another lies in its slot too.
                while let Some((up, _)) = within[cat] {
                    cat = up;
                }
                if slot_of[cat].is_none() {
                    slots.push(Slot {
                        values: Vec::new(),
                        size: align(f.ty(cat).size_bytes()),
                        first: ki,
                        last: last_use[cat],
                        offset: 0,
                        scratch_for: None,
                        output: None,
                        host: false,
                    });
                    hosting.push(true);
                    slot_of[cat] = Some(slots.len() - 1);
                }
                continue;
            }
            if let Some(s) = slot_of[o] {
                // A concatenation whose operands were placed in its slot first.
                slots[s].values.push(o);
                continue;
            }
            if f.is_host(o) {
                slots.push(Slot {
                    values: vec![o],
                    size: align(ty.size_bytes()),
                    first: ki,
                    last: last_use[o],
                    offset: 0,
                    scratch_for: None,
                    output: None,
                    host: true,
                });
                hosting.push(false);
                slot_of[o] = Some(slots.len() - 1);
                continue;
            }
            let reuse = if kd.kind == KernelKind::Elementwise {
                kd.inputs.iter().find_map(|&a| {
                    let r = root[a]?;
                    let s = slot_of[r]?;
                    let ta = f.ty(r);
                    let fits = ta.size_bytes() == ty.size_bytes()
                        && ta.dtype().size_bytes() == ty.dtype().size_bytes();
                    let holds_r = slots[s].values.last() == Some(&r);
                    (last_use[r] == ki && fits && holds_r && !hosting[s]).then_some(s)
                })
            } else {
                None
            };
            let s = match reuse {
                Some(s) => {
                    slots[s].values.push(o);
                    slots[s].last = slots[s].last.max(last_use[o]);
                    s
                }
                None => {
                    let size = align(ty.size_bytes());
                    slots.push(Slot {
                        values: vec![o],
                        size,
                        first: ki,
                        last: last_use[o],
                        offset: 0,
                        scratch_for: None,
                        output: None,
                        host: false,
                    });
                    hosting.push(false);
                    slots.len() - 1
                }
            };
            slot_of[o] = Some(s);
        }
    }
    // Slots holding results are output buffers, in order of first appearance among the results.
    let mut outputs: Vec<Value> = Vec::new();
    for &r in f.results() {
        if let Some(s) = root[r].and_then(|x| slot_of[x])
            && slots[s].output.is_none()
        {
            slots[s].output = Some(outputs.len());
            outputs.push(root[r].expect("stored"));
        }
    }
    // Greedy by size: largest first, lowest offset that fits among time-overlapping slots.
    for (ki, (k, kd)) in plan.kernels.iter().enumerate() {
        let bytes = backend.scratch_bytes(f, kd);
        if bytes > 0 {
            slots.push(Slot {
                values: Vec::new(),
                size: align(bytes),
                first: ki,
                last: ki,
                offset: 0,
                scratch_for: Some(k),
                output: None,
                host: false,
            });
        }
    }
    // The arena's slots, then the host pool's, each placed on its own.
    let mut arena_bytes = 0;
    let mut host_bytes = 0;
    for host in [false, true] {
        let mut order: Vec<usize> = (0..slots.len())
            .filter(|&i| slots[i].output.is_none() && slots[i].host == host)
            .collect();
        order.sort_by_key(|&i| (std::cmp::Reverse(slots[i].size), slots[i].first));
        let mut placed: Vec<usize> = Vec::new(); // kept sorted by offset
        let mut end = 0;
        for i in order {
            let (first, last, size) = (slots[i].first, slots[i].last, slots[i].size);
            let mut offset = 0;
            for &j in &placed {
                let sj = &slots[j];
                if sj.first > last || first > sj.last {
                    continue;
                }
                if offset + size <= sj.offset {
                    break;
                }
                offset = offset.max(sj.offset + sj.size);
            }
            slots[i].offset = offset;
            end = u64::max(end, offset + size);
            let at = placed.partition_point(|&j| slots[j].offset <= offset);
            placed.insert(at, i);
        }
        *(if host {
            &mut host_bytes
        } else {
            &mut arena_bytes
        }) = end;
    }
    for s in &slots {
        for &v in &s.values {
            storage[v] = match s.output {
                Some(i) => Storage::Output(i),
                None if s.host => Storage::Host(s.offset),
                None => Storage::Arena(s.offset),
            };
        }
    }
    // Operands written in place into a concatenation lie at their offset in its slot.
    // (A concatenation placed in another lies at its own offset there.)
    for v in within.keys() {
        let (mut cat, mut at) = (v, 0);
        while let Some((up, off)) = within[cat] {
            (cat, at) = (up, at + off);
        }
        if cat != v
            && let Storage::Arena(base) = storage[cat]
        {
            storage[v] = Storage::Arena(base + at);
        }
    }
    // Views of arena values share their source's offset.
    for (_, kd) in plan.kernels.iter() {
        if kd.kind == KernelKind::View {
            let out = f.op(kd.ops[0]).results[0];
            if let Some(r) = root[out] {
                storage[out] = storage[r];
            }
        }
    }
    let mut live = vec![0u64; n_kernels + 1];
    for s in slots.iter().filter(|s| s.output.is_none() && !s.host) {
        for l in &mut live[s.first..=s.last] {
            *l += s.size;
        }
    }
    let output_bytes = slots
        .iter()
        .filter(|s| s.output.is_some())
        .map(|s| s.size)
        .sum();
    MemoryPlan {
        storage,
        outputs,
        output_bytes,
        live_peak_bytes: live.into_iter().max().unwrap_or(0),
        slots,
        arena_bytes,
        host_bytes,
        param_bytes,
        const_bytes,
    }
}

/// The operands that kernels write in place into a concatenation's storage, each with the
/// concatenation and its byte offset there: the concatenation is a kernel of its own whose
/// result is not returned and is one contiguous run per operand (every axis before the
/// concatenated one of size 1, as a batch-1 concatenation along the channels); the operand is
/// stored by a kernel of its own (not a parameter, constant or view), appears once, is read
/// last by the concatenation, and starts at an offset the arena's alignment divides. Its
/// writer then stores it in place and the concatenation copies nothing for it (Inception's and
/// SqueezeNet's branches, ShuffleNet's halves). An operand may itself be a concatenation with
/// operands placed in it: a DenseNet block's chain of concatenations, each extending the one
/// before (as `canonicalize` writes them), is then one slot in which every feature map is
/// written once.
fn in_place_concats(
    f: &Function,
    plan: &Plan,
    root: &SecondaryMap<Value, Option<Value>>,
    last_use: &SecondaryMap<Value, usize>,
    storage: &SecondaryMap<Value, Storage>,
) -> SecondaryMap<Value, Option<(Value, u64)>> {
    let mut within: SecondaryMap<Value, Option<(Value, u64)>> =
        SecondaryMap::with_capacity(f.num_values_created());
    for (ki, (_, kd)) in plan.kernels.iter().enumerate() {
        let [op] = kd.ops[..] else { continue };
        let d = f.op(op);
        let OpKind::Concat { axis } = d.kind else {
            continue;
        };
        let r = d.results[0];
        let dims = f.ty(r).dims();
        let Some(a) = tcc_ir::ops::normalize_axis(axis, dims.len()) else {
            continue;
        };
        if kd.kind != KernelKind::Generic
            || !kd.outputs.contains(&r)
            || last_use[r] >= plan.kernels.len()
            || dims[..a].iter().product::<u64>() != 1
        {
            continue;
        }
        let mut at = 0;
        for &v in &d.args {
            let bytes = f.ty(v).size_bytes();
            let own = root[v] == Some(v) && matches!(storage[v], Storage::None);
            let once = d.args.iter().filter(|&&x| x == v).count() == 1;
            if own && once && bytes > 0 && last_use[v] == ki && at % ALIGN == 0 {
                within[v] = Some((r, at));
            }
            at += bytes;
        }
    }
    within
}

/// Writes a memory plan as text: the totals, then one line per slot.
pub fn write_memory(
    w: &mut impl std::fmt::Write,
    f: &Function,
    m: &MemoryPlan,
) -> std::fmt::Result {
    writeln!(
        w,
        "memory: arena {} bytes (live peak {}), {} slots; outputs {} bytes; parameters {} bytes, constants {} bytes",
        m.arena_bytes,
        m.live_peak_bytes,
        m.slots.len(),
        m.output_bytes,
        m.param_bytes,
        m.const_bytes
    )?;
    for (i, s) in m.slots.iter().enumerate() {
        let mut names = s
            .scratch_for
            .map_or(String::new(), |k| format!("scratch for {k}"));
        for (j, &v) in s.values.iter().enumerate() {
            if j > 0 {
                names.push_str(", ");
            }
            tcc_ir::printer::write_name(&mut names, '%', f.name(v))?;
        }
        let place = match s.output {
            Some(o) => format!("output {o}, {} bytes", s.size),
            None => format!("[{}, {})", s.offset, s.offset + s.size),
        };
        writeln!(
            w,
            "  slot {i}: {place} kernels {}..={}: {names}",
            s.first, s.last
        )?;
    }
    Ok(())
}

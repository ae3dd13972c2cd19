//! Kernel and memory plans of random functions: every op is planned once and after what it
//! needs; host values (`swap_out`'s) are in the host pool and nothing else is; no two slots of
//! one pool, and no two values, that are live at the same time overlap (but
//! for a value written in place over one its kernel reads last); every value a kernel reads is
//! stored somewhere.

use proptest::prelude::*;
use std::collections::HashMap;
use tcc_codegen::{KernelKind, Storage, plan, plan_memory};
use tcc_ir::random::random_function;
use tcc_ir::{OpKind, ValueDef};

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn plans_are_complete_ordered_and_never_overlap(seed in any::<u64>(), n in 1usize..80) {
        let f = random_function(seed, n);
        let p = plan(&f);
        let m = plan_memory(&f, &p, &tcc_codegen::Cpu::default());

        // Every scheduled op is a constant or in exactly one kernel, in schedule order.
        let pos: HashMap<_, _> = f.schedule().iter().enumerate().map(|(i, &o)| (o, i)).collect();
        let mut seen = 0;
        for (k, kd) in p.kernels.iter() {
            prop_assert!(!kd.ops.is_empty());
            prop_assert!(kd.ops.windows(2).all(|w| pos[&w[0]] < pos[&w[1]]));
            for &op in &kd.ops {
                prop_assert_eq!(p.kernel_of[op], Some(k));
                seen += 1;
            }
        }
        prop_assert_eq!(seen + p.constants.len(), f.schedule().len());

        // Kernels run after every kernel whose outputs they read.
        let kernel_index: HashMap<_, _> = p.kernels.keys().enumerate().map(|(i, k)| (k, i)).collect();
        for (i, (_, kd)) in p.kernels.iter().enumerate() {
            for &v in &kd.inputs {
                match f.value(v).def {
                    ValueDef::Param(_) => prop_assert_eq!(m.storage[v], Storage::Param),
                    ValueDef::Result(op, _) => {
                        if matches!(f.op(op).kind, OpKind::Const { .. }) {
                            prop_assert_eq!(m.storage[v], Storage::Const);
                        } else {
                            let producer = p.kernel_of[op].expect("planned");
                            prop_assert!(kernel_index[&producer] < i, "input from a later kernel");
                            let out = &p.kernels[producer].outputs;
                            prop_assert!(out.contains(&v), "an input that its kernel does not store");
                            prop_assert!(m.storage[v] != Storage::None, "an input with no storage");
                        }
                    }
                }
            }
            for &o in &kd.outputs {
                                // Host values (`swap_out`'s) in the host pool, and only they.
                                if f.is_host(o) {
                                    prop_assert!(matches!(m.storage[o], Storage::Host(_)));
                                } else {
                                    prop_assert!(matches!(m.storage[o], Storage::Arena(_) | Storage::Output(_) | Storage::Param | Storage::Const));
                                }
            }
        }

        // The last kernel reading each stored value (through views), or the end for results.
        let mut origin: HashMap<tcc_ir::Value, tcc_ir::Value> = HashMap::new();
        let mut last_read: HashMap<tcc_ir::Value, usize> = HashMap::new();
        for (i, (_, kd)) in p.kernels.iter().enumerate() {
            for &v in &kd.inputs {
                let r = origin.get(&v).copied().unwrap_or(v);
                let e = last_read.entry(r).or_insert(i);
                *e = (*e).max(i);
            }
            if kd.kind == KernelKind::View {
                let op = kd.ops[0];
                let src = f.op(op).args[0];
                origin.insert(f.op(op).results[0], origin.get(&src).copied().unwrap_or(src));
            }
            for &o in &kd.outputs {
                last_read.entry(o).or_insert(i);
            }
        }
        for &r in f.results() {
            last_read.insert(origin.get(&r).copied().unwrap_or(r), p.kernels.len());
        }

        // Results computed by kernels live in output buffers, one per distinct result value.
        for &r in f.results() {
            let root = origin.get(&r).copied().unwrap_or(r);
            if let Storage::Output(i) = m.storage[root] {
                prop_assert_eq!(m.outputs[i], root);
            }
        }

        // Slots of one pool (the arena, the host pool) live at the same time do not overlap in
        // memory.
        for (host, bytes) in [(false, m.arena_bytes), (true, m.host_bytes)] {
            let pool: Vec<_> = m.slots.iter().filter(|s| s.output.is_none() && s.host == host).collect();
            for (a, sa) in pool.iter().enumerate() {
                prop_assert!(sa.offset % 64 == 0 && sa.size % 64 == 0);
                prop_assert!(sa.offset + sa.size <= bytes);
                for sb in &pool[a + 1..] {
                    let live_together = sa.first <= sb.last && sb.first <= sa.last;
                    let disjoint = sa.offset + sa.size <= sb.offset || sb.offset + sb.size <= sa.offset;
                    prop_assert!(!live_together || disjoint, "slots {sa:?} and {sb:?} overlap while both live");
                }
            }
        }

        // In-place chains, in the arena or in an output buffer: each later value is written by
        // an elementwise kernel that is the last reader of the value before it (lifetimes
        // computed here, independently).
        for sa in &m.slots {
            for w in sa.values.windows(2) {
                let k = p.kernel_of[f.def_op(w[1]).unwrap()].unwrap();
                prop_assert_eq!(&p.kernels[k].kind, &KernelKind::Elementwise);
                let def_next = kernel_index[&k];
                prop_assert!(
                    last_read[&w[0]] <= def_next,
                    "{:?} is overwritten by {:?} at kernel {} but read until {}",
                    w[0], w[1], def_next, last_read[&w[0]]
                );
            }
        }

        // Value by value: two arena values whose bytes overlap are never live at once, except
        // at the one kernel that writes the later over the earlier (in place: an elementwise
        // chain, or an operand a concatenation finds at its place in its result).
        let defined = |v: tcc_ir::Value| kernel_index[&p.kernel_of[f.def_op(v).unwrap()].unwrap()];
        let stored: Vec<_> = (p.kernels.values())
            .filter(|kd| kd.kind != KernelKind::View)
            .flat_map(|kd| kd.outputs.iter().copied())
            .filter_map(|v| match m.storage[v] {
                Storage::Arena(at) if f.ty(v).size_bytes() > 0 => {
                    Some((v, false, at, at + f.ty(v).size_bytes(), defined(v), last_read[&v]))
                }
                Storage::Host(at) if f.ty(v).size_bytes() > 0 => {
                    Some((v, true, at, at + f.ty(v).size_bytes(), defined(v), last_read[&v]))
                }
                _ => None,
            })
            .collect();
        for (i, &(a, ha, a0, a1, da, la)) in stored.iter().enumerate() {
            for &(b, hb, b0, b1, db, lb) in &stored[i + 1..] {
                if ha == hb && a0 < b1 && b0 < a1 {
                    prop_assert!(
                        la <= db || lb <= da,
                        "{:?} and {:?} share bytes while both live ({}..={} and {}..={})",
                        a, b, da, la, db, lb
                    );
                }
            }
        }
        prop_assert!(m.arena_bytes >= m.live_peak_bytes);
    }
}

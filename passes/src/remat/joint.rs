//! `Joint`: the joint forward + backward function as flat arrays, on which a set of kept values
//! is turned into the copies it implies (`plan`) and their peak and FLOPs are replayed
//! (`simulate`) without rewriting the function. Every search of this module judges its
//! candidates here.

use crate::analysis::cost::flops;
use cranelift_entity::EntityRef;
use tcc_ir::{Function, OpKind};

pub(super) const NONE: u32 = u32::MAX;

/// The joint function as flat arrays, to plan a rematerialization and simulate its peak without
/// rewriting the function. Positions index the schedule; values are `Value::index()`.
pub(super) struct Joint {
    /// Where the backward ops start.
    pub(super) b: usize,
    pub(super) args_at: Vec<u32>,
    pub(super) args: Vec<u32>,
    pub(super) res_at: Vec<u32>,
    pub(super) res: Vec<u32>,
    pub(super) kind: Vec<Kind>,
    pub(super) flops: Vec<u64>,
    /// Per value: the position of its defining op (`NONE` for parameters), which of that op's
    /// results it is, its bytes, whether it may be recomputed (a result of a forward op other
    /// than a constant), and whether the function returns it.
    pub(super) def: Vec<u32>,
    pub(super) slot: Vec<u32>,
    pub(super) bytes: Vec<u64>,
    pub(super) forward: Vec<bool>,
    pub(super) returned: Vec<u32>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Const,
    Reshape,
    Other,
}

/// Which forward ops (positions, in schedule order) are copied just before which backward op.
#[derive(Default)]
pub(super) struct Plan {
    pub(super) batches: Vec<(u32, std::ops::Range<usize>)>,
    pub(super) ops: Vec<u32>,
}

impl Joint {
    pub(super) fn new(f: &Function, b: usize) -> Joint {
        let sched = f.schedule();
        let nv = f.num_values_created();
        let mut j = Joint {
            b,
            args_at: Vec::with_capacity(sched.len() + 1),
            args: Vec::new(),
            res_at: Vec::with_capacity(sched.len() + 1),
            res: Vec::new(),
            kind: Vec::with_capacity(sched.len()),
            flops: Vec::with_capacity(sched.len()),
            def: vec![NONE; nv],
            slot: vec![0; nv],
            bytes: vec![0; nv],
            forward: vec![false; nv],
            returned: f.results().iter().map(|r| r.index() as u32).collect(),
        };
        for (i, &op) in sched.iter().enumerate() {
            let d = f.op(op);
            j.args_at.push(j.args.len() as u32);
            j.res_at.push(j.res.len() as u32);
            j.args.extend(d.args.iter().map(|a| a.index() as u32));
            let kind = match d.kind {
                OpKind::Const { .. } => Kind::Const,
                OpKind::Reshape { .. } => Kind::Reshape,
                _ => Kind::Other,
            };
            j.kind.push(kind);
            j.flops.push(flops(f, op));
            for (s, &r) in d.results.iter().enumerate() {
                let v = r.index();
                j.res.push(v as u32);
                j.def[v] = i as u32;
                j.slot[v] = s as u32;
                j.bytes[v] = f.ty(r).size_bytes();
                j.forward[v] = i < b && kind != Kind::Const;
            }
        }
        j.args_at.push(j.args.len() as u32);
        j.res_at.push(j.res.len() as u32);
        j
    }

    pub(super) fn len(&self) -> usize {
        self.kind.len()
    }

    pub(super) fn args(&self, p: usize) -> &[u32] {
        &self.args[self.args_at[p] as usize..self.args_at[p + 1] as usize]
    }

    pub(super) fn results(&self, p: usize) -> &[u32] {
        &self.res[self.res_at[p] as usize..self.res_at[p + 1] as usize]
    }

    /// The forward ops to copy when only the values `keep` marks (and parameters, constants and
    /// backward values) may be read by backward ops: each backward op, in order, gets copies of
    /// the forward ops between what it needs and the kept values or earlier copies.
    pub(super) fn plan(&self, keep: &[bool]) -> Plan {
        let mut copied = vec![false; self.b];
        let mut stamp = vec![NONE; self.b];
        let mut plan = Plan::default();
        let mut stack = Vec::new();
        for i in self.b..self.len() {
            let start = plan.ops.len();
            let mut visit = |a: u32, stack: &mut Vec<u32>, copied: &[bool]| {
                let a = a as usize;
                if self.forward[a] && !keep[a] {
                    let p = self.def[a];
                    if !copied[p as usize] && stamp[p as usize] != i as u32 {
                        stamp[p as usize] = i as u32;
                        stack.push(p);
                    }
                }
            };
            for &a in self.args(i) {
                visit(a, &mut stack, &copied);
            }
            while let Some(p) = stack.pop() {
                plan.ops.push(p);
                for &a in self.args(p as usize) {
                    visit(a, &mut stack, &copied);
                }
            }
            if plan.ops.len() > start {
                plan.ops[start..].sort_unstable();
                for &p in &plan.ops[start..] {
                    copied[p as usize] = true;
                }
                plan.batches.push((i as u32, start..plan.ops.len()));
            }
        }
        plan
    }

    /// The peak bytes of activations and temporaries (as `analysis::memory` counts them:
    /// `temps_peak`) of the function `plan` would produce, and the FLOPs of its copies.
    pub(super) fn simulate(&self, plan: &Plan) -> (u64, u64) {
        let nv = self.bytes.len();
        let copies: usize = plan
            .ops
            .iter()
            .map(|&p| self.results(p as usize).len())
            .sum();
        let total = nv + copies;
        let m = self.len() + plan.ops.len();
        let mut owner = vec![NONE; total];
        let mut first = vec![0u32; total];
        let mut last = vec![0u32; total];
        let mut bytes = self.bytes.clone();
        bytes.resize(total, 0);
        // The first value id of each copied forward op's results.
        let mut copy = vec![NONE; self.b];
        let mut next = nv as u32;
        let mut pos = 0u32;
        let map = |a: u32, copy: &[u32]| -> u32 {
            let d = self.def[a as usize];
            if d != NONE && (d as usize) < self.b && copy[d as usize] != NONE {
                copy[d as usize] + self.slot[a as usize]
            } else {
                a
            }
        };
        // One op at the next position, defining the values `ids`.
        let mut step = |p: usize, ids: &[u32], copy: &[u32], owner: &mut [u32]| {
            for &a in self.args(p) {
                let o = owner[map(a, copy) as usize];
                if o != NONE {
                    last[o as usize] = pos;
                }
            }
            match self.kind[p] {
                Kind::Const => {}
                Kind::Reshape => {
                    owner[ids[0] as usize] = owner[map(self.args(p)[0], copy) as usize];
                }
                Kind::Other => {
                    for &r in ids {
                        owner[r as usize] = r;
                        first[r as usize] = pos;
                        last[r as usize] = pos;
                    }
                }
            }
            pos += 1;
        };
        for p in 0..self.b {
            step(p, self.results(p), &copy, &mut owner);
        }
        let mut ids = Vec::new();
        let mut batches = plan.batches.iter().peekable();
        let mut extra = 0;
        for i in self.b..self.len() {
            if let Some((_, range)) = batches.next_if(|(at, _)| *at as usize == i) {
                for &p in &plan.ops[range.clone()] {
                    let p = p as usize;
                    ids.clear();
                    for &r in self.results(p) {
                        bytes[next as usize + ids.len()] = self.bytes[r as usize];
                        ids.push(next + ids.len() as u32);
                    }
                    step(p, &ids, &copy, &mut owner);
                    copy[p] = next;
                    next += self.results(p).len() as u32;
                    extra += self.flops[p];
                }
            }
            step(i, self.results(i), &copy, &mut owner);
        }
        // Buffers the function returns are not temporaries.
        for &r in &self.returned {
            let o = owner[r as usize];
            if o != NONE {
                last[o as usize] = m as u32;
            }
        }
        let mut delta = vec![0i64; m + 2];
        for v in 0..total {
            if owner[v] != v as u32 || last[v] as usize == m {
                continue;
            }
            delta[first[v] as usize] += bytes[v] as i64;
            delta[last[v] as usize + 1] -= bytes[v] as i64;
        }
        let (mut cur, mut peak) = (0i64, 0i64);
        for d in &delta[..m] {
            cur += d;
            peak = peak.max(cur);
        }
        (peak as u64, extra)
    }
}

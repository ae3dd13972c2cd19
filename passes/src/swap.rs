//! `swap`: host-memory swapping of the activations a training step's backward part reads, as
//! TensorFlow Large Model Support (TFLMS) rewrites a graph, placed with control dependencies so
//! that later passes keep it.
//!
//! For each forward value that a backward op reads (in forward order, up to `n-tensors`, at
//! least `min-bytes`, within the `include` scopes and outside the `exclude` ones; never a
//! parameter, constant, view or returned value):
//!
//! - a `swap_out` copies it to host memory right after its last forward reader (scheduled
//!   there, with a control dependency on that reader), so its device memory is free from then
//!   until the backward part needs it;
//! - each backward reader reads a `swap_in` of it instead, scheduled right after a *trigger*
//!   op of the backward part, on which it has a control dependency, so the copy back starts
//!   that early: with `order=chain` (TFLMS's default) the trigger is a backward op reading a
//!   forward op `lb..=ub` levels downstream of the value's producer (the gradient of a later
//!   layer, which runs before this one's), the nearest such level first and the latest such
//!   op scheduled before the reader; with `order=direct`, or where the chain finds none or the
//!   reader lies within `lb` levels of the backward part's start, the latest backward op
//!   before the reader whose level is `lb..=ub` below the reader's. Levels are topological:
//!   one more than the highest level among an op's producers and control dependencies
//!   (`edit::level_toposort`).
//! - with `fuse-swapins=true`, backward readers within `lb` levels of an earlier reader of the
//!   same value share that reader's `swap_in` (one copy serving several readers).
//! - with `branch-threshold=N` (TFLMS's branch swapping, for the long skip connections of a
//!   U-Net), forward readers more than `N` levels after the value's producer read a `swap_in`
//!   too, and the `swap_out` follows the last of the *near* forward readers; their triggers are
//!   found in direct order among the ops between the `swap_out` and the reader. A value with
//!   such far forward readers is a candidate even if no backward op reads it.
//! - values a planner marks *late* (`Swap::late`, `offload`'s "swap late") are fetched just in
//!   time: a `swap_in` per backward reader, triggered by the op scheduled just before it. The
//!   value takes no device memory ahead of its readers, and each reader waits for its copy.
//!
//! A value is swapped for all of its backward readers or not at all (a reader left on the
//! original would keep its device memory live); where a reader has no trigger the value is
//! skipped, and the report says why. Swapping selects nothing is an error that says what the
//! options left out. Results are unchanged bit for bit: the copies carry the same values.

use crate::manager::{OptionInfo, Options, Pass, PipelineError};
use cranelift_entity::SecondaryMap;
use std::collections::{HashMap, HashSet};
use tcc_ir::edit::{Users, level_toposort};
use tcc_ir::{Function, Op, OpKind, Value};

/// The options `swap` accepts.
pub const OPTIONS: &[OptionInfo] = &[
    OptionInfo {
        name: "n-tensors",
        help: "most values to swap, in forward order (default all)",
    },
    OptionInfo {
        name: "min-bytes",
        help: "only values at least this large: bytes, or 64KiB, 16MiB (default 0)",
    },
    OptionInfo {
        name: "include",
        help: "only values in these scopes, as in [block1/,fc] (default all)",
    },
    OptionInfo {
        name: "exclude",
        help: "never values in these scopes (default none)",
    },
    OptionInfo {
        name: "lb",
        help: "the trigger of a swap-in is at least this many levels before its reader (default 1)",
    },
    OptionInfo {
        name: "ub",
        help: "and at most this many (default 10000)",
    },
    OptionInfo {
        name: "order",
        help: "chain (a backward op of a layer lb..ub levels downstream, TFLMS's default) or direct (lb..ub levels before the reader)",
    },
    OptionInfo {
        name: "fuse-swapins",
        help: "true: readers within lb levels of an earlier reader share its swap-in (default false)",
    },
    OptionInfo {
        name: "branch-threshold",
        help: "N: forward readers more than N levels after a value's producer read a swap-in too (TFLMS's branch swapping; default off)",
    },
];

/// How a swap-in's trigger is found (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// Through the forward layers downstream of the value's producer.
    Chain,
    /// By levels before the reader.
    Direct,
}

/// The `swap` pass and its options: the typed form of `swap{...}`.
#[derive(Clone, Debug, PartialEq)]
pub struct Swap {
    /// Most values to swap (all when `None`).
    pub n_tensors: Option<usize>,
    /// Smallest value swapped, in bytes.
    pub min_bytes: u64,
    /// Scopes to swap from (all when empty).
    pub include: Vec<String>,
    /// Scopes never swapped from.
    pub exclude: Vec<String>,
    /// Fewest levels between a swap-in's trigger and its reader.
    pub lb: u32,
    /// Most levels between them.
    pub ub: u32,
    /// How triggers are found.
    pub order: Order,
    /// One swap-in for readers close together.
    pub fuse_swapins: bool,
    /// Branch swapping: forward readers more than this many levels after the producer read
    /// a swap-in too (`None`: off).
    pub branch_threshold: Option<u32>,
    /// Only these values, if set (a planner's choice; no text option).
    pub only: Option<Vec<Value>>,
    /// Values fetched just in time: each backward reader gets its own swap-in, triggered by
    /// the op scheduled just before it, so the value holds no device memory ahead of its
    /// reader (which waits for the copy). A planner's choice; no text option.
    pub late: Vec<Value>,
}

impl Default for Swap {
    /// TFLMS's defaults: every candidate, `lb=1`, `ub=10000`, the chain rule, no fusing.
    fn default() -> Swap {
        Swap {
            n_tensors: None,
            min_bytes: 0,
            include: Vec::new(),
            exclude: Vec::new(),
            lb: 1,
            ub: 10_000,
            order: Order::Chain,
            fuse_swapins: false,
            branch_threshold: None,
            only: None,
            late: Vec::new(),
        }
    }
}

/// What one run of [`Swap`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SwapStats {
    /// The values swapped out, in forward order.
    pub swapped: Vec<Value>,
    /// `swap_in`s added (more than `swapped` where a value has several backward readers).
    pub swap_ins: usize,
    /// Bytes swapped out (each value once).
    pub bytes: u64,
    /// Candidates passed over, each with the reason.
    pub skipped: Vec<(Value, String)>,
}

/// Builds the pass from its options.
pub(crate) fn create(o: &Options) -> Result<Box<dyn Pass>, String> {
    Ok(Box::new(options(o)?))
}

/// Reads [`Swap`] from pipeline options.
pub fn options(o: &Options) -> Result<Swap, String> {
    let mut s = Swap::default();
    if let Some(v) = o.get("n-tensors") {
        let n = o.usize_or("n-tensors", 0)?;
        if n == 0 {
            return Err(format!(
                "option `n-tensors` must be at least 1, found `{v}` (leave it out to swap every candidate)"
            ));
        }
        s.n_tensors = Some(n);
    }
    if let Some(v) = o.get("min-bytes") {
        s.min_bytes = crate::remat::budget::parse_bytes(v).ok_or_else(|| {
            format!("option `min-bytes` must be bytes (4096, 64KiB, 16MiB), found `{v}`")
        })?;
    }
    if let Some(v) = o.get("include") {
        s.include = crate::grad::list(v);
    }
    if let Some(v) = o.get("exclude") {
        s.exclude = crate::grad::list(v);
    }
    let levels = |key: &str, d: u32| -> Result<u32, String> {
        let n = o.usize_or(key, d as usize)?;
        u32::try_from(n).map_err(|_| format!("option `{key}` is too large: {n}"))
    };
    s.lb = levels("lb", 1)?;
    s.ub = levels("ub", 10_000)?;
    if s.lb > s.ub {
        return Err(format!(
            "option `lb` ({}) must not exceed `ub` ({})",
            s.lb, s.ub
        ));
    }
    s.order = match o.get("order") {
        None | Some("chain") => Order::Chain,
        Some("direct") => Order::Direct,
        Some(v) => {
            return Err(format!(
                "unknown order `{v}`; the orders are chain and direct"
            ));
        }
    };
    if let Some(v) = o.get("fuse-swapins") {
        s.fuse_swapins = crate::grad::parse_bool("fuse-swapins", v)?;
    }
    if o.get("branch-threshold").is_some() {
        s.branch_threshold = Some(levels("branch-threshold", 0)?);
    }
    Ok(s)
}

impl Pass for Swap {
    fn name(&self) -> &'static str {
        "swap"
    }
    fn run_on_function(&self, f: &mut Function) -> Result<(), String> {
        self.run(f).map(|_| ())
    }
}

/// Whether `name` is in `scope` (the scope itself, or under it).
fn in_scope(name: &str, scope: &str) -> bool {
    let s = scope.trim_end_matches('/');
    name == s
        || name
            .strip_prefix(s)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// One value to swap: its readers in the backward part grouped by swap-in, each group with its
/// trigger.
pub(crate) struct Planned {
    pub value: Value,
    /// The last (near) forward op reading it, if any (else its producer).
    pub after: Op,
    /// Each swap-in's trigger and the readers it serves.
    pub groups: Vec<(Op, Vec<Op>)>,
}

/// The values [`Swap::plan`] chose, what it passed over, and its candidates: those the backward
/// part reads, those outside the scopes, those under `min-bytes`.
pub(crate) struct Plan {
    pub plans: Vec<Planned>,
    pub stats: SwapStats,
    pub counts: (usize, usize, usize),
}

impl Swap {
    /// Parses the options of `swap{...}` without the braces, as `tcc train --swap` takes them:
    /// `min-bytes=1MiB,order=direct`.
    pub fn parse(options: &str) -> Result<Swap, PipelineError> {
        if options.trim().is_empty() {
            return Ok(Swap::default());
        }
        let o = Options::parse_for("swap", options)?;
        self::options(&o).map_err(|message| PipelineError {
            text: options.to_string(),
            pos: 0,
            message,
        })
    }

    /// Swaps `f`'s activations as the options say; see the module docs.
    pub fn run(&self, f: &mut Function) -> Result<SwapStats, String> {
        let Plan {
            plans,
            mut stats,
            counts: (in_backward, by_scope, by_size),
        } = self.plan(f)?;
        let sched = f.schedule().to_vec();
        if plans.is_empty() {
            return Err(format!(
                "`swap` selected nothing: of {in_backward} forward values the backward part (or a far \
                 forward reader) reads, {by_scope} are outside the scopes, {by_size} are under min-bytes ({}), and {} have \
                 a backward reader with no trigger {}..={} levels before it",
                self.min_bytes,
                stats.skipped.len(),
                self.lb,
                self.ub
            ));
        }
        // The rewrite: new ops scheduled after their anchors, readers moved to the swap-ins.
        let mut after: HashMap<Op, Vec<Op>> = HashMap::new();
        for plan in &plans {
            let v = plan.value;
            let (ty, name) = (f.ty(v).clone(), f.name(v).to_string());
            let out = f.create_op(
                OpKind::SwapOut,
                vec![v],
                vec![ty.clone()],
                &[&format!("{name}/host")],
            );
            if plan.after != f.def_op(v).expect("an op result") {
                f.op_mut(out).deps.push(plan.after);
            }
            after.entry(plan.after).or_default().push(out);
            let host = f.op(out).results[0];
            for (trigger, readers) in &plan.groups {
                let inp = f.create_op(
                    OpKind::SwapIn,
                    vec![host],
                    vec![ty.clone()],
                    &[&format!("{name}/device")],
                );
                f.op_mut(inp).deps.push(*trigger);
                after.entry(*trigger).or_default().push(inp);
                let back = f.op(inp).results[0];
                for &r in readers {
                    for a in &mut f.op_mut(r).args {
                        if *a == v {
                            *a = back;
                        }
                    }
                }
                stats.swap_ins += 1;
            }
            stats.bytes += ty.size_bytes();
            stats.swapped.push(v);
        }
        let mut order =
            Vec::with_capacity(sched.len() + after.values().map(Vec::len).sum::<usize>());
        for &op in &sched {
            order.push(op);
            if let Some(new) = after.get(&op) {
                order.extend(new);
            }
        }
        f.set_schedule(order);
        Ok(stats)
    }

    /// What [`Swap::run`] would do to `f`, without doing it: each value to swap with its
    /// swap-out's anchor and its swap-ins' triggers and readers.
    pub(crate) fn plan(&self, f: &Function) -> Result<Plan, String> {
        let b = f.backward_position().ok_or_else(|| {
            "`swap` rewrites a training function, and this one has no backward part: run `grad` first"
                .to_string()
        })?;
        if let Some(&op) = f.schedule().iter().find(|&&op| f.op(op).kind.is_swap()) {
            return Err(format!(
                "this function swaps already ({}): `swap` runs once, on a function without swaps",
                f.describe_op(op)
            ));
        }
        let sched = f.schedule().to_vec();
        let pos = f.positions();
        let at = |op: Op| pos[op].expect("scheduled") as usize;
        let mut level: SecondaryMap<Op, u32> = SecondaryMap::with_capacity(f.num_ops_created());
        for (l, ops) in level_toposort(f).iter().enumerate() {
            for &op in ops {
                level[op] = l as u32;
            }
        }
        let bw_start = sched[b..].iter().map(|&op| level[op]).min().unwrap_or(0);
        let users = Users::new(f);
        let only: Option<HashSet<Value>> = self.only.as_ref().map(|o| o.iter().copied().collect());
        let late: HashSet<Value> = self.late.iter().copied().collect();
        let mut stats = SwapStats::default();
        let mut plans: Vec<Planned> = Vec::new();
        let (mut in_backward, mut by_scope, mut by_size) = (0, 0, 0);
        'values: for &p in &sched[..b] {
            let d = f.op(p);
            if matches!(d.kind, OpKind::Const { .. } | OpKind::Reshape { .. }) {
                continue;
            }
            for &v in &d.results {
                let readers = users.consumers(v);
                let (fw, bw): (Vec<Op>, Vec<Op>) = readers.iter().partition(|&&r| at(r) < b);
                // Forward readers far from the producer, with branch swapping.
                let far = |r: Op| {
                    self.branch_threshold
                        .is_some_and(|n| level[r] > level[p] + n)
                };
                let (far_fw, near_fw): (Vec<Op>, Vec<Op>) = fw.iter().partition(|&&r| far(r));
                if (bw.is_empty() && far_fw.is_empty()) || users.is_returned(v) {
                    continue;
                }
                in_backward += 1;
                if only.as_ref().is_some_and(|only| !only.contains(&v)) {
                    by_scope += 1;
                    continue;
                }
                let name = f.name(v);
                if (!self.include.is_empty() && !self.include.iter().any(|s| in_scope(name, s)))
                    || self.exclude.iter().any(|s| in_scope(name, s))
                {
                    by_scope += 1;
                    continue;
                }
                if f.ty(v).size_bytes() < self.min_bytes {
                    by_size += 1;
                    continue;
                }
                // Readers grouped by swap-in (each its own, or with fusing those within `lb`
                // levels of the group's first), each group with its first reader's trigger: far
                // forward readers first (in schedule order), then the backward ones.
                let after = near_fw.iter().copied().max_by_key(|&r| at(r)).unwrap_or(p);
                let mut groups: Vec<(Op, Vec<Op>)> = Vec::new();
                let mut first_level = 0;
                for &r in far_fw.iter().chain(&bw) {
                    if at(r) >= b && late.contains(&v) {
                        // Just in time: the op before the reader (at or after the swap-out's
                        // anchor, which is a forward op).
                        groups.push((sched[at(r) - 1], vec![r]));
                        continue;
                    }
                    if self.fuse_swapins
                        && let Some(g) = groups.last_mut()
                        && level[r] <= first_level + self.lb
                    {
                        g.1.push(r);
                        continue;
                    }
                    let t = if at(r) < b {
                        self.direct(f, &level, &pos, at(after) + 1, r)
                    } else {
                        self.trigger(f, &users, &level, &pos, b, bw_start, p, r)
                    };
                    let Some(t) = t else {
                        stats.skipped.push((
                            v,
                            format!(
                                "no trigger for its reader {}: nothing {}..={} levels before it after the swap-out",
                                f.describe_op(r),
                                self.lb,
                                self.ub
                            ),
                        ));
                        continue 'values;
                    };
                    first_level = level[r];
                    groups.push((t, vec![r]));
                }
                plans.push(Planned {
                    value: v,
                    after,
                    groups,
                });
                if self.n_tensors.is_some_and(|n| plans.len() >= n) {
                    break 'values;
                }
            }
        }
        Ok(Plan {
            plans,
            stats,
            counts: (in_backward, by_scope, by_size),
        })
    }

    /// The op whose completion starts the swap-in for backward reader `r` of a value produced
    /// by `p` (see the module docs), if there is one.
    #[allow(clippy::too_many_arguments)]
    fn trigger(
        &self,
        f: &Function,
        users: &Users,
        level: &SecondaryMap<Op, u32>,
        pos: &SecondaryMap<Op, Option<u32>>,
        b: usize,
        bw_start: u32,
        p: Op,
        r: Op,
    ) -> Option<Op> {
        let at = |op: Op| pos[op].expect("scheduled") as usize;
        let (lo, hi) = (at(p), at(r));
        // The latest of `ops` scheduled in the backward part before `r`.
        let latest = |ops: &mut dyn Iterator<Item = Op>| {
            ops.filter(|&o| at(o) >= b && at(o) > lo && at(o) < hi)
                .max_by_key(|&o| at(o))
        };
        let near_start = level[r] < bw_start + self.lb;
        if self.order == Order::Chain && !near_start {
            // Forward ops level by level downstream of `p`: at distance `lb..=ub`, the backward
            // ops reading their results.
            let mut frontier = vec![p];
            let mut seen: HashMap<Op, ()> = HashMap::from([(p, ())]);
            for depth in 0..=self.ub {
                if frontier.is_empty() {
                    break;
                }
                if depth >= self.lb {
                    let mut readers = frontier
                        .iter()
                        .flat_map(|&o| f.op(o).results.iter().flat_map(|&v| users.consumers(v)));
                    if let Some(t) = latest(&mut readers) {
                        return Some(t);
                    }
                }
                let mut next = Vec::new();
                for &o in &frontier {
                    for &v in &f.op(o).results {
                        for c in users.consumers(v) {
                            if at(c) < b && seen.insert(c, ()).is_none() {
                                next.push(c);
                            }
                        }
                    }
                }
                frontier = next;
            }
        }
        // Direct order, in the backward part.
        self.direct(f, level, pos, b, r)
    }

    /// The latest op scheduled from position `from` up to reader `r` (exclusive) whose level is
    /// `lb..=ub` below `r`'s: the trigger in direct order.
    fn direct(
        &self,
        f: &Function,
        level: &SecondaryMap<Op, u32>,
        pos: &SecondaryMap<Op, Option<u32>>,
        from: usize,
        r: Op,
    ) -> Option<Op> {
        let hi = pos[r].expect("scheduled") as usize;
        let (top, bottom) = (
            level[r].checked_sub(self.lb)?,
            level[r].saturating_sub(self.ub),
        );
        (f.schedule().get(from..hi)?.iter().rev())
            .copied()
            .find(|&o| (bottom..=top).contains(&level[o]))
    }
}

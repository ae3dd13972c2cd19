//! Graph editing: the capabilities of TensorFlow's old graph editor over tcc functions.
//!
//! - [`Users`]: consumers of values and control-dependents of ops (computed once, read many).
//! - [`walk_forward`] / [`walk_backward`]: ops reachable from seed ops or values, with
//!   `inclusive`, a `within` set, `stop_at` values, and control edges on or off.
//! - [`reroute`] / [`swap`]: move uses of values onto other values, restricted to a set of
//!   consumer ops; they return how many uses changed.
//! - [`copy_ops`]: copy a set of ops with input replacements, returning the old→new maps.
//! - [`level_toposort`]: groups of ops that can run together.
//! - [`select_values`], [`select_ops`], [`scope_values`]: pick by name regex or scope.
//!
//! Functions that change the graph never iterate over what they modify: they collect first, then
//! apply. They keep names unique but do not re-verify; callers run the verifier.

use crate::function::{Function, Op, Value};
use cranelift_entity::{EntityRef, SecondaryMap, packed_option::ReservedValue};
use std::collections::{HashMap, HashSet};
use std::fmt;

/// An error from an editing operation, such as a type mismatch in a reroute.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EditError(pub String);

impl fmt::Display for EditError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for EditError {}

/// Who uses what, over the scheduled ops of a function: the one reader map every pass and the
/// kernel planner share. Stored flat (one array of uses, with each value's range in it), so
/// building it for a 100k-op function is two passes and three allocations.
pub struct Users {
    /// `uses[use_start[v]..use_start[v + 1]]` are the uses of value `v`.
    use_start: Vec<u32>,
    uses: Vec<(Op, u32)>,
    /// `control[control_start[op]..control_start[op + 1]]` depend on `op`.
    control_start: Vec<u32>,
    control: Vec<Op>,
    returned: SecondaryMap<Value, bool>,
}

/// Offsets of each key's run in a flat array, from per-key counts: `starts[k]..starts[k + 1]`.
fn starts(counts: Vec<u32>) -> Vec<u32> {
    let mut starts = Vec::with_capacity(counts.len() + 1);
    let mut at = 0u32;
    starts.push(0);
    for c in counts {
        at += c;
        starts.push(at);
    }
    starts
}

/// The run of key `k` (an entity index) in a flat array laid out by [`starts`]; empty for keys
/// created after it was built.
fn run<'a, T>(starts: &[u32], flat: &'a [T], k: usize) -> &'a [T] {
    match (starts.get(k), starts.get(k + 1)) {
        (Some(&a), Some(&b)) => &flat[a as usize..b as usize],
        _ => &[],
    }
}

impl Users {
    /// Computes the uses of every value, the control-dependents of every op and which values
    /// the function returns. Two passes over the schedule (count, then fill).
    pub fn new(f: &Function) -> Users {
        let (nv, no) = (f.num_values_created(), f.num_ops_created());
        let (mut n_uses, mut n_control) = (vec![0u32; nv], vec![0u32; no]);
        for &op in f.schedule() {
            let d = f.op(op);
            for &a in &d.args {
                n_uses[a.index()] += 1;
            }
            for &dep in &d.deps {
                n_control[dep.index()] += 1;
            }
        }
        let (use_start, control_start) = (starts(n_uses), starts(n_control));
        let mut next_use: Vec<u32> = use_start[..nv].to_vec();
        let mut next_control: Vec<u32> = control_start[..no].to_vec();
        let mut uses = vec![(Op::reserved_value(), 0); use_start[nv] as usize];
        let mut control = vec![Op::reserved_value(); control_start[no] as usize];
        for &op in f.schedule() {
            let d = f.op(op);
            for (i, &a) in d.args.iter().enumerate() {
                let at = &mut next_use[a.index()];
                uses[*at as usize] = (op, i as u32);
                *at += 1;
            }
            for &dep in &d.deps {
                let at = &mut next_control[dep.index()];
                control[*at as usize] = op;
                *at += 1;
            }
        }
        let mut returned = SecondaryMap::with_capacity(nv);
        for &r in f.results() {
            returned[r] = true;
        }
        Users {
            use_start,
            uses,
            control_start,
            control,
            returned,
        }
    }

    /// Whether the function returns `v`.
    pub fn is_returned(&self, v: Value) -> bool {
        self.returned[v]
    }

    /// `(op, operand index)` for every use of `v`, in schedule order.
    pub fn uses(&self, v: Value) -> &[(Op, u32)] {
        run(&self.use_start, &self.uses, v.index())
    }

    /// The distinct ops that read `v`, in schedule order.
    pub fn consumers(&self, v: Value) -> Vec<Op> {
        let mut out: Vec<Op> = self.uses(v).iter().map(|u| u.0).collect();
        out.dedup();
        out
    }

    /// Ops that have a control dependency on `op`.
    pub fn control_dependents(&self, op: Op) -> &[Op] {
        run(&self.control_start, &self.control, op.index())
    }

    /// The distinct ops that read any result of `op`, in schedule order of first use.
    pub fn op_consumers(&self, f: &Function, op: Op) -> Vec<Op> {
        let mut seen = HashSet::new();
        f.op(op)
            .results
            .iter()
            .flat_map(|&r| self.uses(r).iter().map(|u| u.0))
            .filter(|o| seen.insert(*o))
            .collect()
    }
}

/// The distinct ops defining `op`'s operands, in operand order (parameters have none).
pub fn producers(f: &Function, op: Op) -> Vec<Op> {
    let mut seen = HashSet::new();
    f.op(op)
        .args
        .iter()
        .filter_map(|&a| f.def_op(a))
        .filter(|o| seen.insert(*o))
        .collect()
}

/// Where a walk starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seed {
    /// Start at this op.
    Op(Op),
    /// Forward: start at the consumers of this value. Backward: at its defining op.
    Value(Value),
}

/// Options of a walk.
#[derive(Clone, Copy, Default)]
pub struct WalkOptions<'a> {
    /// Whether the starting ops are part of the result.
    pub inclusive: bool,
    /// Only ops in this set are visited (and returned).
    pub within: Option<&'a HashSet<Op>>,
    /// The walk does not cross these values: forward it does not visit their consumers,
    /// backward it does not visit their producers.
    pub stop_at: Option<&'a HashSet<Value>>,
    /// Whether control edges are followed as well as data edges.
    pub control: bool,
}

fn walk(
    f: &Function,
    seeds: &[Seed],
    opts: WalkOptions<'_>,
    mut next: impl FnMut(Op, &mut Vec<Op>),
    start_of_value: impl Fn(Value) -> Vec<Op>,
) -> Vec<Op> {
    let pos = f.positions();
    let allowed = |op: Op| pos[op].is_some() && opts.within.is_none_or(|w| w.contains(&op));
    let mut starts = Vec::new();
    for s in seeds {
        match *s {
            Seed::Op(op) => starts.push(op),
            Seed::Value(v) => starts.extend(start_of_value(v)),
        }
    }
    let mut seen: HashSet<Op> = HashSet::new();
    let mut out: HashSet<Op> = HashSet::new();
    let mut stack: Vec<Op> = Vec::new();
    for &s in &starts {
        if allowed(s) && seen.insert(s) {
            if opts.inclusive {
                out.insert(s);
            }
            stack.push(s);
        }
    }
    let mut buf = Vec::new();
    while let Some(op) = stack.pop() {
        buf.clear();
        next(op, &mut buf);
        for &n in &buf {
            if allowed(n) && seen.insert(n) {
                out.insert(n);
                stack.push(n);
            }
        }
    }
    let mut v: Vec<Op> = out.into_iter().collect();
    v.sort_by_key(|&op| pos[op]);
    v
}

/// Ops reachable from the seeds by following results to their consumers (and, with `control`,
/// ops to their control-dependents). Returned in schedule order.
pub fn walk_forward(f: &Function, users: &Users, seeds: &[Seed], opts: WalkOptions<'_>) -> Vec<Op> {
    let stopped = |v: &Value| opts.stop_at.is_some_and(|s| s.contains(v));
    walk(
        f,
        seeds,
        opts,
        |op, out| {
            for r in f.op(op).results.iter().filter(|r| !stopped(r)) {
                out.extend(users.uses(*r).iter().map(|u| u.0));
            }
            if opts.control {
                out.extend_from_slice(users.control_dependents(op));
            }
        },
        |v| {
            if stopped(&v) {
                Vec::new()
            } else {
                users.consumers(v)
            }
        },
    )
}

/// The values that depend on `seeds` (which count as depending on themselves), as one sweep in
/// schedule order: result `r` of op `op` depends on the seeds when some operand `a` does and
/// `edge(op, a, r)` lets the dependence through (gradients: `op` is differentiable, `a` is not
/// a stop value and `r` is a float). Linear in the function's size; where the whole reachable
/// set is wanted with per-edge conditions this is cheaper than [`walk_forward`].
pub fn dependents(
    f: &Function,
    seeds: &[Value],
    edge: impl Fn(Op, Value, Value) -> bool,
) -> SecondaryMap<Value, bool> {
    let mut dep: SecondaryMap<Value, bool> = SecondaryMap::with_capacity(f.num_values_created());
    for &s in seeds {
        dep[s] = true;
    }
    for &op in f.schedule() {
        let d = f.op(op);
        for &r in &d.results {
            if d.args.iter().any(|&a| dep[a] && edge(op, a, r)) {
                dep[r] = true;
            }
        }
    }
    dep
}

/// Ops reachable from the seeds by following operands to their defining ops (and, with
/// `control`, ops to their control dependencies). Returned in schedule order.
pub fn walk_backward(f: &Function, seeds: &[Seed], opts: WalkOptions<'_>) -> Vec<Op> {
    let stopped = |v: &Value| opts.stop_at.is_some_and(|s| s.contains(v));
    walk(
        f,
        seeds,
        opts,
        |op, out| {
            let d = f.op(op);
            out.extend(
                d.args
                    .iter()
                    .filter(|a| !stopped(a))
                    .filter_map(|&a| f.def_op(a)),
            );
            if opts.control {
                out.extend_from_slice(&d.deps);
            }
        },
        |v| {
            if stopped(&v) {
                Vec::new()
            } else {
                f.def_op(v).into_iter().collect()
            }
        },
    )
}

/// Which uses a reroute may change.
#[derive(Clone, Copy)]
pub enum CanModify<'a> {
    /// Operands of every scheduled op, and the function's results.
    All,
    /// Operands of these ops only.
    Ops(&'a HashSet<Op>),
}

fn check_pairs(f: &Function, a: &[Value], b: &[Value]) -> Result<(), EditError> {
    if a.len() != b.len() {
        return Err(EditError(format!(
            "reroute needs as many sources as targets, found {} and {}",
            a.len(),
            b.len()
        )));
    }
    for (&x, &y) in a.iter().zip(b) {
        if f.ty(x) != f.ty(y) {
            return Err(EditError(format!(
                "cannot reroute %{} ({}) to %{} ({}): types differ",
                f.name(x),
                f.ty(x),
                f.name(y),
                f.ty(y)
            )));
        }
    }
    Ok(())
}

fn remap(f: &mut Function, map: &HashMap<Value, Value>, can_modify: CanModify<'_>) -> usize {
    let ops: Vec<Op> = match can_modify {
        CanModify::All => f.schedule().to_vec(),
        CanModify::Ops(set) => f
            .schedule()
            .iter()
            .copied()
            .filter(|o| set.contains(o))
            .collect(),
    };
    let mut n = 0;
    for op in ops {
        for a in &mut f.op_mut(op).args {
            if let Some(&to) = map.get(a) {
                *a = to;
                n += 1;
            }
        }
    }
    if matches!(can_modify, CanModify::All) {
        let mut results = f.results().to_vec();
        for r in &mut results {
            if let Some(&to) = map.get(r) {
                *r = to;
                n += 1;
            }
        }
        f.set_results(results);
    }
    n
}

/// Makes the uses of `from[i]` (among those `can_modify` allows) use `to[i]` instead. Returns
/// how many uses changed. Types must match pairwise.
pub fn reroute(
    f: &mut Function,
    from: &[Value],
    to: &[Value],
    can_modify: CanModify<'_>,
) -> Result<usize, EditError> {
    check_pairs(f, from, to)?;
    let map: HashMap<Value, Value> = from
        .iter()
        .copied()
        .zip(to.iter().copied())
        .filter(|(a, b)| a != b)
        .collect();
    Ok(remap(f, &map, can_modify))
}

/// Exchanges the uses of `a[i]` and `b[i]` (among those `can_modify` allows). Returns how many
/// uses changed.
pub fn swap(
    f: &mut Function,
    a: &[Value],
    b: &[Value],
    can_modify: CanModify<'_>,
) -> Result<usize, EditError> {
    check_pairs(f, a, b)?;
    let mut map = HashMap::new();
    for (&x, &y) in a.iter().zip(b) {
        if x != y {
            map.insert(x, y);
            map.insert(y, x);
        }
    }
    Ok(remap(f, &map, can_modify))
}

/// Where copied ops go in the schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Appended at the end.
    End,
    /// Just before this scheduled op.
    Before(Op),
    /// Not scheduled; the caller places them.
    Unscheduled,
}

/// The correspondence between originals and copies.
#[derive(Clone, Debug, Default)]
pub struct CopyMap {
    /// Original op → its copy.
    pub ops: HashMap<Op, Op>,
    /// Original result value → the copy's result.
    pub values: HashMap<Value, Value>,
}

/// Where [`copy_ops`] finds what a copy reads instead of a value from outside the copied ops.
pub trait Replacements {
    /// The value to read instead of `v`, if any.
    fn replacement(&self, v: Value) -> Option<Value>;
}

impl Replacements for HashMap<Value, Value> {
    fn replacement(&self, v: Value) -> Option<Value> {
        self.get(&v).copied()
    }
}

impl Replacements for SecondaryMap<Value, Option<Value>> {
    fn replacement(&self, v: Value) -> Option<Value> {
        self.get(v).copied().flatten()
    }
}

/// Whether every op of `ops` comes after the ops of `ops` it reads or depends on.
fn is_topological(f: &Function, ops: &[Op]) -> bool {
    let set: HashSet<Op> = ops.iter().copied().collect();
    let mut seen = HashSet::with_capacity(ops.len());
    for &op in ops {
        let d = f.op(op);
        let before = d
            .args
            .iter()
            .filter_map(|&a| f.def_op(a))
            .chain(d.deps.iter().copied());
        for p in before {
            if set.contains(&p) && !seen.contains(&p) {
                return false;
            }
        }
        seen.insert(op);
    }
    true
}

/// Copies `ops`, in the order given if that is topological, else in schedule order (so copies
/// stay topological either way). An operand of a copy is: the copy of its producer if that was
/// copied, else its replacement from `replace` if it has one, else the original. Control
/// dependencies on copied ops point at the copies. Copies keep their originals' names, made
/// unique (`x` → `x.1`), and their source locations.
pub fn copy_ops(
    f: &mut Function,
    ops: &[Op],
    replace: &impl Replacements,
    place: Placement,
) -> CopyMap {
    let mut order: Vec<Op> = ops.to_vec();
    if !is_topological(f, &order) {
        let pos = f.positions();
        order.sort_by_key(|&o| (pos[o].is_none(), pos[o]));
    }
    let mut seen = HashSet::with_capacity(order.len());
    order.retain(|&o| seen.insert(o));
    let mut map = CopyMap::default();
    for &op in &order {
        let d = f.op(op).clone();
        let args = d
            .args
            .iter()
            .map(|&a| {
                map.values
                    .get(&a)
                    .copied()
                    .or_else(|| replace.replacement(a))
                    .unwrap_or(a)
            })
            .collect();
        let tys = d.results.iter().map(|&r| f.ty(r).clone()).collect();
        let names: Vec<String> = d.results.iter().map(|&r| f.name(r).to_string()).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let new = f.create_op(d.kind, args, tys, &names);
        f.op_mut(new).deps = d
            .deps
            .iter()
            .map(|dep| map.ops.get(dep).copied().unwrap_or(*dep))
            .collect();
        if let Some(loc) = f.loc(op) {
            f.set_loc(new, loc);
        }
        for (&o, &n) in d.results.iter().zip(&f.op(new).results.clone()) {
            map.values.insert(o, n);
        }
        map.ops.insert(op, new);
    }
    let copies: Vec<Op> = order.iter().map(|o| map.ops[o]).collect();
    match place {
        Placement::End => copies.iter().for_each(|&c| f.append(c)),
        Placement::Before(anchor) => {
            let mut sched = Vec::with_capacity(f.schedule().len() + copies.len());
            for &o in f.schedule() {
                if o == anchor {
                    sched.extend_from_slice(&copies);
                }
                sched.push(o);
            }
            f.set_schedule(sched);
        }
        Placement::Unscheduled => {}
    }
    map
}

/// Groups the scheduled ops by level: an op's level is one more than the highest level among the
/// ops it depends on (data and control), 0 for ops that depend on none. Ops in one group are
/// independent of each other and could run together. Each group is in schedule order.
pub fn level_toposort(f: &Function) -> Vec<Vec<Op>> {
    let mut level: SecondaryMap<Op, u32> = SecondaryMap::with_capacity(f.num_ops_created());
    let pos = f.positions();
    let mut groups: Vec<Vec<Op>> = Vec::new();
    for &op in f.schedule() {
        let d = f.op(op);
        let l = d
            .args
            .iter()
            .filter_map(|&a| f.def_op(a))
            .chain(d.deps.iter().copied())
            .filter(|&p| pos[p].is_some_and(|pp| Some(pp) < pos[op]))
            .map(|p| level[p] + 1)
            .max()
            .unwrap_or(0);
        level[op] = l;
        if groups.len() <= l as usize {
            groups.resize_with(l as usize + 1, Vec::new);
        }
        groups[l as usize].push(op);
    }
    groups
}

/// Values (parameters and results of scheduled ops) whose name matches the regex, in definition
/// order.
pub fn select_values(f: &Function, pattern: &str) -> Result<Vec<Value>, EditError> {
    let re = regex_lite::Regex::new(pattern)
        .map_err(|e| EditError(format!("bad name pattern `{pattern}`: {e}")))?;
    Ok(defined_values(f)
        .filter(|&v| re.is_match(f.name(v)))
        .collect())
}

/// Scheduled ops with at least one result whose name matches the regex.
pub fn select_ops(f: &Function, pattern: &str) -> Result<Vec<Op>, EditError> {
    let re = regex_lite::Regex::new(pattern)
        .map_err(|e| EditError(format!("bad name pattern `{pattern}`: {e}")))?;
    Ok(f.schedule()
        .iter()
        .copied()
        .filter(|&op| f.op(op).results.iter().any(|&r| re.is_match(f.name(r))))
        .collect())
}

/// Values inside `scope`: named `scope/...` (a trailing `/` on `scope` is optional).
pub fn scope_values(f: &Function, scope: &str) -> Vec<Value> {
    let prefix = format!("{}/", scope.trim_end_matches('/'));
    defined_values(f)
        .filter(|&v| f.name(v).starts_with(&prefix))
        .collect()
}

fn defined_values(f: &Function) -> impl Iterator<Item = Value> + '_ {
    f.params().iter().copied().chain(
        f.schedule()
            .iter()
            .flat_map(move |&op| f.op(op).results.iter().copied()),
    )
}

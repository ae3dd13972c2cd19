//! Functions and modules: the owners of ops and values.
//!
//! A [`Function`] owns its ops and values in primary maps keyed by the dense entities [`Op`] and
//! [`Value`]. The schedule (the order ops run in) is a separate list: an op may exist without
//! being scheduled (passes create ops, then place them). Every value has a human name, unique in
//! its function; the text format uses the name as the SSA identifier (`%block3/conv1`).

use crate::ops::OpKind;
use crate::tensor::Tensor;
use crate::types::TensorType;
use cranelift_entity::{PrimaryMap, SecondaryMap, entity_impl};
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;
use std::sync::Arc;

/// An SSA value: a function parameter or an op result.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Value(u32);
entity_impl!(Value, "v");

/// An operation in a function.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Op(u32);
entity_impl!(Op, "op");

/// Where a value comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueDef {
    /// The `i`th function parameter.
    Param(usize),
    /// The `i`th result of an op.
    Result(Op, usize),
}

/// A value's payload.
#[derive(Clone, Debug)]
pub struct ValueData {
    /// Its type.
    pub ty: TensorType,
    /// Its name, unique in the function; `/` separates scopes.
    pub name: String,
    /// Its definition.
    pub def: ValueDef,
}

/// An op's payload.
#[derive(Clone, Debug)]
pub struct OpData {
    /// What it computes.
    pub kind: OpKind,
    /// Operands.
    pub args: Vec<Value>,
    /// Results, in order.
    pub results: Vec<Value>,
    /// Control dependencies: ops that must run before this one, with no data flowing.
    pub deps: Vec<Op>,
}

/// A position in source text, 1-based.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SrcLoc {
    /// Line, from 1.
    pub line: u32,
    /// Column in characters, from 1.
    pub col: u32,
}

/// A function: parameters, a scheduled SSA body, and results.
#[derive(Clone, Debug)]
pub struct Function {
    /// The function's name (without the `@`).
    pub name: String,
    values: PrimaryMap<Value, ValueData>,
    ops: PrimaryMap<Op, OpData>,
    params: Vec<Value>,
    results: Vec<Value>,
    order: Vec<Op>,
    names: FxHashMap<String, Value>,
    next_suffix: FxHashMap<String, u32>,
    locs: SecondaryMap<Op, Option<SrcLoc>>,
    /// The first op of the backward part, if the function has one (see
    /// [`Function::backward_start`]).
    backward: Option<Op>,
}

impl Function {
    /// An empty function.
    pub fn new(name: impl Into<String>) -> Function {
        Function {
            name: name.into(),
            values: PrimaryMap::new(),
            ops: PrimaryMap::new(),
            params: Vec::new(),
            results: Vec::new(),
            order: Vec::new(),
            names: FxHashMap::default(),
            next_suffix: FxHashMap::default(),
            locs: SecondaryMap::new(),
            backward: None,
        }
    }

    /// Reserves room for `n` more values (and their names).
    pub fn reserve_values(&mut self, n: usize) {
        self.values.reserve(n);
        self.names.reserve(n);
    }

    /// `base` if no value has that name, else `base.N` for the smallest free `N` tried so far.
    pub fn unique_name(&mut self, base: &str) -> String {
        if !self.names.contains_key(base) {
            return base.to_string();
        }
        let n = self.next_suffix.entry(base.to_string()).or_insert(1);
        loop {
            let cand = format!("{base}.{n}");
            *n += 1;
            if !self.names.contains_key(&cand) {
                return cand;
            }
        }
    }

    fn new_value(&mut self, ty: TensorType, name: &str, def: ValueDef) -> Value {
        let name = self.unique_name(name);
        let v = self.values.push(ValueData {
            ty,
            name: name.clone(),
            def,
        });
        self.names.insert(name, v);
        v
    }

    /// Appends a parameter. The name is made unique if it is taken.
    pub fn add_param(&mut self, name: &str, ty: TensorType) -> Value {
        let i = self.params.len();
        let v = self.new_value(ty, name, ValueDef::Param(i));
        self.params.push(v);
        v
    }

    /// Removes parameter `v`, which no scheduled op reads and no result returns; the later
    /// parameters move up one place, and its name is free again.
    pub fn remove_param(&mut self, v: Value) -> Result<(), String> {
        let i = (self.params.iter().position(|&p| p == v))
            .ok_or_else(|| format!("%{} is not a parameter", self.values[v].name))?;
        let used = self.results.contains(&v)
            || (self.schedule().iter()).any(|&op| self.ops[op].args.contains(&v));
        if used {
            return Err(format!("parameter %{} is still used", self.values[v].name));
        }
        self.params.remove(i);
        for (j, &p) in self.params.iter().enumerate().skip(i) {
            self.values[p].def = ValueDef::Param(j);
        }
        let name = std::mem::take(&mut self.values[v].name);
        self.names.remove(&name);
        Ok(())
    }

    /// Creates an op and its result values without scheduling it. `names` gives each result's
    /// name (made unique if taken); there must be one per result type.
    pub fn create_op(
        &mut self,
        kind: OpKind,
        args: Vec<Value>,
        result_types: Vec<TensorType>,
        names: &[&str],
    ) -> Op {
        assert_eq!(names.len(), result_types.len(), "one name per result");
        let op = self.ops.push(OpData {
            kind,
            args,
            results: Vec::new(),
            deps: Vec::new(),
        });
        let results = result_types
            .into_iter()
            .zip(names)
            .enumerate()
            .map(|(i, (ty, name))| self.new_value(ty, name, ValueDef::Result(op, i)))
            .collect();
        self.ops[op].results = results;
        op
    }

    /// Creates an op and appends it to the schedule.
    pub fn add_op(
        &mut self,
        kind: OpKind,
        args: Vec<Value>,
        result_types: Vec<TensorType>,
        names: &[&str],
    ) -> Op {
        let op = self.create_op(kind, args, result_types, names);
        self.order.push(op);
        op
    }

    /// Appends an unscheduled op to the schedule.
    pub fn append(&mut self, op: Op) {
        self.order.push(op);
    }

    /// Schedules `op` just before `before` (which must be scheduled). O(schedule length); for
    /// many insertions build a new order and call [`Function::set_schedule`].
    pub fn insert_before(&mut self, op: Op, before: Op) {
        let i = self
            .order
            .iter()
            .position(|&o| o == before)
            .expect("insert_before: anchor op is not scheduled");
        self.order.insert(i, op);
    }

    /// Replaces the schedule. The caller keeps it topological; the verifier checks. The backward
    /// part still starts at the same op (the verifier checks it is scheduled).
    pub fn set_schedule(&mut self, order: Vec<Op>) {
        self.order = order;
    }

    /// The first op of the backward part, if the function has one.
    ///
    /// `grad` appends the backward part after the forward ops and records where it starts
    /// ([`Function::set_backward_start`]); everything scheduled from that op on (gradients, and
    /// whatever later passes add there, such as optimizer updates and recomputation) is
    /// backward. Passes that need the split (`remat`, swapping) ask this or
    /// [`Function::backward_position`] rather than recognising ops by their names. The text
    /// form marks the start with a `backward:` line.
    pub fn backward_start(&self) -> Option<Op> {
        self.backward
    }

    /// Records that the backward part starts at `op` (which must be scheduled), or that there is
    /// none.
    pub fn set_backward_start(&mut self, op: Option<Op>) {
        self.backward = op;
    }

    /// The schedule position where the backward part starts, if there is one.
    pub fn backward_position(&self) -> Option<usize> {
        let b = self.backward?;
        self.order.iter().position(|&o| o == b)
    }

    /// Ops in schedule order.
    pub fn schedule(&self) -> &[Op] {
        &self.order
    }

    /// The parameters, in order.
    pub fn params(&self) -> &[Value] {
        &self.params
    }

    /// The results, in order.
    pub fn results(&self) -> &[Value] {
        &self.results
    }

    /// Sets the results.
    pub fn set_results(&mut self, results: Vec<Value>) {
        self.results = results;
    }

    /// An op's payload.
    pub fn op(&self, op: Op) -> &OpData {
        &self.ops[op]
    }

    /// An op's payload, mutably. Changing `kind` or `args` may break typing: verify afterwards.
    pub fn op_mut(&mut self, op: Op) -> &mut OpData {
        &mut self.ops[op]
    }

    /// A value's payload.
    pub fn value(&self, v: Value) -> &ValueData {
        &self.values[v]
    }

    /// Whether `v` lives in host memory: a `swap_out`'s result, which only `swap_in` reads.
    /// Every other value lives in the device's memory.
    pub fn is_host(&self, v: Value) -> bool {
        match self.value(v).def {
            ValueDef::Result(op, _) => matches!(self.op(op).kind, crate::OpKind::SwapOut),
            ValueDef::Param(_) => false,
        }
    }

    /// A value's type.
    pub fn ty(&self, v: Value) -> &TensorType {
        &self.values[v].ty
    }

    /// A value's name.
    pub fn name(&self, v: Value) -> &str {
        &self.values[v].name
    }

    /// The op defining `v`, if it is an op result.
    pub fn def_op(&self, v: Value) -> Option<Op> {
        match self.values[v].def {
            ValueDef::Result(op, _) => Some(op),
            ValueDef::Param(_) => None,
        }
    }

    /// The value named `name`.
    pub fn lookup(&self, name: &str) -> Option<Value> {
        self.names.get(name).copied()
    }

    /// Renames a value (made unique if taken); returns the name it got.
    pub fn rename(&mut self, v: Value, name: &str) -> String {
        if self.values[v].name == name {
            return name.to_string();
        }
        let old = std::mem::take(&mut self.values[v].name);
        self.names.remove(&old);
        let new = self.unique_name(name);
        self.names.insert(new.clone(), v);
        self.values[v].name = new.clone();
        new
    }

    /// Every op ever created, scheduled or not.
    pub fn all_ops(&self) -> impl Iterator<Item = Op> + '_ {
        self.ops.keys()
    }

    /// Number of ops ever created (the bound for secondary maps).
    pub fn num_ops_created(&self) -> usize {
        self.ops.len()
    }

    /// Number of values ever created.
    pub fn num_values_created(&self) -> usize {
        self.values.len()
    }

    /// Every value ever created.
    pub fn all_values(&self) -> impl Iterator<Item = Value> + '_ {
        self.values.keys()
    }

    /// Position of each scheduled op in the schedule; `None` for unscheduled ops.
    pub fn positions(&self) -> SecondaryMap<Op, Option<u32>> {
        let mut pos = SecondaryMap::with_capacity(self.ops.len());
        for (i, &op) in self.order.iter().enumerate() {
            pos[op] = Some(i as u32);
        }
        pos
    }

    /// Replaces every use of `from` (operands of scheduled ops and function results) by `to`;
    /// returns how many uses changed. Types are not checked.
    pub fn replace_all_uses(&mut self, from: Value, to: Value) -> usize {
        let mut n = 0;
        for &op in &self.order {
            for a in &mut self.ops[op].args {
                if *a == from {
                    *a = to;
                    n += 1;
                }
            }
        }
        for r in &mut self.results {
            if *r == from {
                *r = to;
                n += 1;
            }
        }
        n
    }

    /// Removes from the schedule every op for which `dead` is true and frees its results' names.
    /// Returns how many were removed. Control dependencies on removed ops are dropped; if the op
    /// that started the backward part goes, the part starts at the next op that stays.
    pub fn remove_ops(&mut self, mut dead: impl FnMut(Op) -> bool) -> usize {
        let mut gone = SecondaryMap::<Op, bool>::with_capacity(self.ops.len());
        let before = self.order.len();
        let mut order = std::mem::take(&mut self.order);
        let mut in_backward = false;
        let mut backward = None;
        order.retain(|&op| {
            let d = dead(op);
            gone[op] = d;
            // The backward part starts at its first surviving op.
            in_backward |= Some(op) == self.backward;
            if in_backward && !d && backward.is_none() {
                backward = Some(op);
            }
            !d
        });
        self.backward = backward;
        for (op, is_gone) in gone.iter() {
            if *is_gone {
                for &v in &self.ops[op].results {
                    let name = std::mem::take(&mut self.values[v].name);
                    self.names.remove(&name);
                }
            }
        }
        for &op in &order {
            if self.ops[op].deps.iter().any(|&d| gone[d]) {
                self.ops[op].deps.retain(|&d| !gone[d]);
            }
        }
        self.order = order;
        before - self.order.len()
    }

    /// The source location an op was parsed from, if any.
    pub fn loc(&self, op: Op) -> Option<SrcLoc> {
        self.locs.get(op).copied().flatten()
    }

    /// Records where an op was parsed from.
    pub fn set_loc(&mut self, op: Op, loc: SrcLoc) {
        self.locs[op] = Some(loc);
    }
}

/// A module: a list of functions with distinct names, and the stored values of parameters.
#[derive(Clone, Debug, Default)]
pub struct Module {
    /// The functions, in text order.
    pub functions: Vec<Function>,
    /// Parameter values that travel with the module (an imported model's weights).
    pub weights: Weights,
}

/// Values for parameters, kept beside the text rather than in it: a model's weights are too
/// large for IR text, and they are inputs to the function (trainable), not constants.
///
/// A parameter named `n` of any function in the module takes `values[n]` when its caller
/// does not give a value. The text records only where the values are stored, as the first
/// line `weights "DIR"` (a directory of `.npy` files, relative to the IR file); reading and
/// writing that directory is the driver's job (`tcc-tools`), so this crate does no file I/O.
#[derive(Clone, Debug, Default)]
pub struct Weights {
    /// Where the text says the values are stored (`weights "DIR"`), relative to the IR file.
    pub location: Option<String>,
    /// The values, by parameter name.
    pub values: BTreeMap<String, Arc<Tensor>>,
}

impl Module {
    /// An empty module.
    pub fn new() -> Module {
        Module::default()
    }

    /// The function named `name`.
    pub fn function(&self, name: &str) -> Option<&Function> {
        self.functions.iter().find(|f| f.name == name)
    }

    /// Total number of scheduled ops.
    pub fn num_ops(&self) -> usize {
        self.functions.iter().map(|f| f.schedule().len()).sum()
    }
}

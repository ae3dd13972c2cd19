//! `grad`: reverse-mode automatic differentiation.
//!
//! Given a function, the values to differentiate (`ys`), the values to differentiate with respect
//! to (`xs`), optional seed cotangents and values to treat as constants, [`grad`] appends the
//! backward computation to the function and returns its original results followed by
//! d(sum of ys)/d(x) for each x, in order. The semantics are those users of `tf.gradients` rely
//! on:
//!
//! - one backward sweep over the schedule; the contributions a value receives from its consumers
//!   (fan-out) are summed once, when its producer is reached;
//! - only floating-point values are differentiated, and only those on a path from some x to some
//!   y; integer and bool values never get gradients;
//! - `stop_gradient` ops and the values named in `stop` block propagation (a stopped value that is
//!   itself an x still receives its gradient);
//! - an x the ys do not depend on gets zeros, or an error with `unconnected=error`;
//! - the gradient of `gather` is a `scatter_add` into zeros, never a dense one-hot product.
//!
//! The gradient of x is named `grad/<x>`; the ops of the rule for an op with first result `r`
//! live in the scope `grad/<r>/`. `canonicalize`, `cse` and `dce` clean the result up.
//! The rules themselves are in [`rules`]; docs/passes.md lists the choices they make at
//! non-differentiable points.

mod rules;

use crate::manager::{Options, Pass};
use cranelift_entity::{EntityRef, SecondaryMap};
use rules::{OpGrad, Rules};
use tcc_ir::{Function, FunctionBuilder, OpKind, Value, ValueDef};

/// What to differentiate with respect to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Wrt {
    /// Every floating-point parameter (the default; also written `wrt=params`).
    Params,
    /// These selectors, in order: a value's exact name, or a scope written `scope/`, meaning every
    /// floating-point parameter whose name starts with it.
    Select(Vec<String>),
}

/// What an x that the ys do not depend on gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unconnected {
    /// Zeros of its type.
    Zero,
    /// An error naming it.
    Error,
}

/// Options of [`grad`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GradOptions {
    /// Names of the values to differentiate; empty means the function's single floating-point
    /// scalar result.
    pub ys: Vec<String>,
    /// What to differentiate with respect to.
    pub wrt: Wrt,
    /// Values treated as constants.
    pub stop: Vec<String>,
    /// Take the seed cotangent of each y as a new parameter `grad/<y>` instead of ones.
    pub grad_ys: bool,
    /// What an unconnected x gets.
    pub unconnected: Unconnected,
}

impl Default for GradOptions {
    fn default() -> GradOptions {
        GradOptions {
            ys: Vec::new(),
            wrt: Wrt::Params,
            stop: Vec::new(),
            grad_ys: false,
            unconnected: Unconnected::Zero,
        }
    }
}

/// Sizes before and after, for reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GradStats {
    /// Scheduled ops before.
    pub forward_ops: usize,
    /// Scheduled ops after (forward and backward, cleaned up).
    pub total_ops: usize,
    /// How many xs.
    pub xs: usize,
}

fn is_float(f: &Function, v: Value) -> bool {
    f.ty(v).dtype().is_float()
}

fn lookup(f: &Function, name: &str, what: &str) -> Result<Value, String> {
    f.lookup(name).ok_or_else(|| {
        let mut msg = format!("{what} `%{name}` is not a value of the function");
        let close: Vec<&str> = f
            .all_values()
            .map(|v| f.name(v))
            .filter(|n| n.contains(name) || (n.len() >= 3 && name.contains(*n)))
            .take(5)
            .collect();
        if !close.is_empty() {
            msg += &format!("; similar names: {}", close.join(", "));
        }
        msg
    })
}

fn resolve_ys(f: &Function, opts: &GradOptions) -> Result<Vec<Value>, String> {
    if !opts.ys.is_empty() {
        return opts
            .ys
            .iter()
            .map(|n| {
                let v = lookup(f, n, "y")?;
                if !is_float(f, v) {
                    return Err(format!(
                        "y `%{n}` has type {}; only floating-point values can be differentiated",
                        f.ty(v)
                    ));
                }
                Ok(v)
            })
            .collect();
    }
    let scalars: Vec<Value> = f
        .results()
        .iter()
        .copied()
        .filter(|&r| is_float(f, r) && f.ty(r).rank() == 0)
        .collect();
    match scalars.as_slice() {
        [y] => Ok(vec![*y]),
        [] => Err(
            "the function has no floating-point scalar result to differentiate; name the values with ys=[...]"
                .to_string(),
        ),
        _ => Err(format!(
            "the function has {} floating-point scalar results ({}); say which to differentiate with ys=[...]",
            scalars.len(),
            scalars
                .iter()
                .map(|&v| format!("%{}", f.name(v)))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

fn resolve_xs(f: &Function, wrt: &Wrt) -> Result<Vec<Value>, String> {
    let float_params = || f.params().iter().copied().filter(|&p| is_float(f, p));
    let xs: Vec<Value> = match wrt {
        Wrt::Params => float_params().collect(),
        Wrt::Select(sel) => {
            let mut xs = Vec::new();
            for s in sel {
                if s.ends_with('/') {
                    let found: Vec<Value> = float_params()
                        .filter(|&p| f.name(p).starts_with(s.as_str()))
                        .collect();
                    if found.is_empty() {
                        return Err(format!("no floating-point parameter is in scope `{s}`"));
                    }
                    xs.extend(found);
                } else {
                    let v = lookup(f, s, "x")?;
                    if !is_float(f, v) {
                        return Err(format!(
                            "cannot differentiate with respect to `%{s}` of type {}: only floating-point values have gradients",
                            f.ty(v)
                        ));
                    }
                    xs.push(v);
                }
            }
            xs
        }
    };
    let mut seen = std::collections::HashSet::new();
    let xs: Vec<Value> = xs.into_iter().filter(|v| seen.insert(*v)).collect();
    if xs.is_empty() {
        return Err(
            "the function has no floating-point parameters to differentiate with respect to; pass wrt=[...]"
                .to_string(),
        );
    }
    Ok(xs)
}

/// Differentiates `f` in place (see the module docs). Returns sizes for reports.
pub fn grad(f: &mut Function, opts: &GradOptions) -> Result<GradStats, String> {
    let forward_ops = f.schedule().len();
    let ys = resolve_ys(f, opts)?;
    let xs = resolve_xs(f, &opts.wrt)?;
    let stop: Vec<Value> = opts
        .stop
        .iter()
        .map(|n| lookup(f, n, "stop value"))
        .collect::<Result<_, _>>()?;

    // Forward: which values depend on an x through differentiable floating-point paths.
    let nv = f.num_values_created();
    let mut stopped: SecondaryMap<Value, bool> = SecondaryMap::with_capacity(nv);
    for &s in &stop {
        stopped[s] = true;
    }
    // The xs themselves count (an x may be an intermediate value).
    let dep = tcc_ir::edit::dependents(f, &xs, |op, a, r| {
        f.op(op).kind.is_differentiable() && !stopped[a] && is_float(f, r)
    });

    // Backward sweep.
    let old_results = f.results().to_vec();
    let schedule = f.schedule().to_vec();
    let mut b = FunctionBuilder::from_function(std::mem::replace(f, Function::new("")));
    let mut pending: SecondaryMap<Value, Vec<Value>> = SecondaryMap::with_capacity(nv);
    let mut adj: SecondaryMap<Value, Option<Value>> = SecondaryMap::with_capacity(nv);
    // Values created by this pass that no adjoint has claimed as its name yet.
    let mut fresh: SecondaryMap<Value, bool> = SecondaryMap::new();
    let first_new = b.function().num_values_created();
    let first_new_op = b.function().num_ops_created();
    let mut marked_upto = first_new;
    let swept = (|| -> Result<Vec<Value>, String> {
        // Marks the op results created since the last call as fresh.
        let mut mark_fresh = |b: &FunctionBuilder, fresh: &mut SecondaryMap<Value, bool>| {
            let f = b.function();
            for v in f.all_values().skip(marked_upto) {
                if let ValueDef::Result(..) = f.value(v).def {
                    fresh[v] = true;
                }
            }
            marked_upto = f.num_values_created();
        };
        for &y in &ys {
            let ty = b.function().ty(y).clone();
            let seed = if opts.grad_ys {
                let name = format!("grad/{}", b.function().name(y));
                b.param(&name, ty.dtype(), ty.dims())
            } else {
                b.splat(ty.dtype(), ty.dims(), 1.0)
            }
            .map_err(|e| e.to_string())?;
            if dep[y] {
                pending[y].push(seed);
            }
        }
        mark_fresh(&b, &mut fresh);
        // Sums a value's contributions once; a sum this pass created is named `grad/<v>`.
        let settle = |b: &mut FunctionBuilder,
                      fresh: &mut SecondaryMap<Value, bool>,
                      pending: &mut SecondaryMap<Value, Vec<Value>>,
                      v: Value|
         -> Result<Option<Value>, String> {
            let parts = std::mem::take(&mut pending[v]);
            let Some((&first, rest)) = parts.split_first() else {
                return Ok(None);
            };
            let mut total = first;
            for &p in rest {
                total = b.add(total, p).map_err(|e| e.to_string())?;
                fresh[total] = true;
            }
            if fresh[total] {
                let name = format!("grad/{}", b.function().name(v));
                b.rename(total, &name);
                fresh[total] = false;
            }
            Ok(Some(total))
        };
        for &op in schedule.iter().rev() {
            let live = b
                .function()
                .op(op)
                .results
                .iter()
                .any(|&r| !pending[r].is_empty());
            if !live {
                continue;
            }
            let d = b.function().op(op).clone();
            let mut dys = Vec::with_capacity(d.results.len());
            for &r in &d.results {
                let t = settle(&mut b, &mut fresh, &mut pending, r)?;
                adj[r] = t;
                dys.push(if stopped[r] { None } else { t });
            }
            let needs: Vec<bool> = d
                .args
                .iter()
                .map(|&a| dep[a] && is_float(b.function(), a))
                .collect();
            if dys.iter().all(Option::is_none) || !needs.iter().any(|&n| n) {
                continue;
            }
            let scope = format!("grad/{}", b.function().name(d.results[0]));
            b.push_scope(&scope);
            let contribs = Rules { b: &mut b }.rule(&OpGrad {
                kind: &d.kind,
                args: &d.args,
                results: &d.results,
                dys: &dys,
                needs: &needs,
            });
            b.pop_scope();
            mark_fresh(&b, &mut fresh);
            for (i, c) in contribs?.into_iter().enumerate() {
                if let (Some(c), true) = (c, needs[i]) {
                    pending[d.args[i]].push(c);
                }
            }
        }
        // Parameters settle last.
        let mut grads = Vec::with_capacity(xs.len());
        for &x in &xs {
            let g = match adj[x] {
                Some(g) => Some(g),
                None => settle(&mut b, &mut fresh, &mut pending, x)?,
            };
            grads.push(match g {
                Some(g) => g,
                None if opts.unconnected == Unconnected::Error => {
                    return Err(format!(
                        "`%{}` does not affect {}; drop it from wrt or pass unconnected=zero",
                        b.function().name(x),
                        ys.iter()
                            .map(|&y| format!("`%{}`", b.function().name(y)))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ));
                }
                None => {
                    let z = Rules { b: &mut b }
                        .zeros_like(x)
                        .map_err(|e| e.to_string())?;
                    let name = format!("grad/{}", b.function().name(x));
                    b.rename(z, &name);
                    z
                }
            });
        }
        Ok(grads)
    })();
    *f = b.into_function();
    match swept {
        Ok(grads) => {
            let mut results = old_results;
            results.extend(grads);
            f.set_results(results);
            // The sweep appended the backward part; a function that had one keeps its start.
            if f.backward_start().is_none() {
                let first = f.schedule().iter().find(|op| op.index() >= first_new_op);
                f.set_backward_start(first.copied());
            }
        }
        Err(e) => {
            // Leave `f` computing what it did: drop everything the sweep added.
            f.set_results(old_results);
            crate::dce(f);
            return Err(e);
        }
    }
    clean_up(f);
    name_gradients(f, &xs, first_new);
    Ok(GradStats {
        forward_ops,
        total_ops: f.schedule().len(),
        xs: xs.len(),
    })
}

/// Makes the gradient result of each x carry the name `grad/<x>` after clean-up (see
/// [`name_results`]).
fn name_gradients(f: &mut Function, xs: &[Value], first_new: usize) {
    let n = f.results().len() - xs.len();
    let names: Vec<(usize, String)> = (xs.iter().enumerate())
        .map(|(i, &x)| (n + i, format!("grad/{}", f.name(x))))
        .collect();
    name_results(f, &names, first_new);
}

/// Gives result `i` the name `name` for each `(i, name)`, after clean-up may have replaced a
/// named value by an equal one: a value created since `first_new` that no other result uses is
/// renamed; anything else (a parameter, a forward value, a value two results share) gets an
/// `identity` op with the name.
pub(crate) fn name_results(f: &mut Function, names: &[(usize, String)], first_new: usize) {
    let mut results = f.results().to_vec();
    let mut times: std::collections::HashMap<Value, usize> = std::collections::HashMap::new();
    for &r in &results {
        *times.entry(r).or_default() += 1;
    }
    for (i, want) in names {
        let r = results[*i];
        if f.name(r) == want {
            continue;
        }
        let ours = r.index() >= first_new
            && matches!(f.value(r).def, ValueDef::Result(..))
            && times[&r] == 1;
        if ours {
            f.rename(r, want);
        } else {
            let ty = f.ty(r).clone();
            let op = f.add_op(OpKind::Identity, vec![r], vec![ty], &[want]);
            results[*i] = f.op(op).results[0];
        }
    }
    f.set_results(results);
}

/// What runs after autodiff and the optimizers: fold the scalar arithmetic the rules leave
/// (seed times 1/N), merge duplicates, drop the dead.
pub(crate) fn clean_up(f: &mut Function) {
    crate::canonicalize(f, crate::canonicalize::DEFAULT_FOLD_LIMIT);
    crate::cse(f);
    crate::dce(f);
}

/// Parses a list option: `[a,b]` or a single word.
pub(crate) fn list(v: &str) -> Vec<String> {
    let v = v.trim();
    let inner = v
        .strip_prefix('[')
        .and_then(|s| s.strip_suffix(']'))
        .unwrap_or(v);
    inner
        .split(',')
        .map(|s| s.trim().trim_start_matches('%').to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

pub(crate) fn parse_bool(key: &str, v: &str) -> Result<bool, String> {
    match v {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(format!("option `{key}` must be true or false, found `{v}`")),
    }
}

/// Reads [`GradOptions`] from pipeline options.
pub fn options(o: &Options) -> Result<GradOptions, String> {
    let mut g = GradOptions::default();
    if let Some(v) = o.get("ys") {
        g.ys = list(v);
    }
    if let Some(v) = o.get("wrt") {
        g.wrt = if v == "params" {
            Wrt::Params
        } else {
            Wrt::Select(list(v))
        };
    }
    if let Some(v) = o.get("stop") {
        g.stop = list(v);
    }
    if let Some(v) = o.get("grad-ys") {
        g.grad_ys = parse_bool("grad-ys", v)?;
    }
    if let Some(v) = o.get("unconnected") {
        g.unconnected = match v {
            "zero" => Unconnected::Zero,
            "error" => Unconnected::Error,
            _ => {
                return Err(format!(
                    "option `unconnected` must be zero or error, found `{v}`"
                ));
            }
        };
    }
    Ok(g)
}

/// The options `grad` accepts.
pub(crate) const OPTIONS: &[crate::manager::OptionInfo] = &[
    crate::manager::OptionInfo {
        name: "ys",
        help: "values to differentiate, [a,b] (default: the single floating-point scalar result)",
    },
    crate::manager::OptionInfo {
        name: "wrt",
        help: "params (default), or [name,scope/,...]: exact value names or parameter scopes",
    },
    crate::manager::OptionInfo {
        name: "stop",
        help: "[names] of values treated as constants",
    },
    crate::manager::OptionInfo {
        name: "grad-ys",
        help: "true: seed cotangents become parameters grad/<y> (default false: ones)",
    },
    crate::manager::OptionInfo {
        name: "unconnected",
        help: "zero (default) or error: what an x the ys do not depend on gets",
    },
];

pub(crate) struct Grad(pub GradOptions);

impl Pass for Grad {
    fn name(&self) -> &'static str {
        "grad"
    }
    fn run_on_function(&self, f: &mut Function) -> Result<(), String> {
        grad(f, &self.0).map(|_| ())
    }
}

pub(crate) fn create(o: &Options) -> Result<Box<dyn Pass>, String> {
    Ok(Box::new(Grad(options(o)?)))
}

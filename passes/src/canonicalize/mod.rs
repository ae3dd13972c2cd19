//! `canonicalize`: constant folding and algebraic identities.
//!
//! One forward sweep over the schedule (repeated until nothing changes, at most 8 times):
//! - ops whose operands are all constants are evaluated ([`fold`]) and become constants in place,
//!   keeping their names; splat results are always folded, dense ones only up to `fold-limit`
//!   elements (default 256);
//! - `x*1`, `1*x`, `x/1`, `x+0`, `0+x`, `x-0` become `x` when that does not change the result
//!   type (zeros' signs are not significant: `-0.0 + 0.0` folds to `-0.0`);
//! - `neg(neg x)`, `identity x`, and `reshape`, `transpose`, `broadcast_to` and `cast` that change
//!   nothing become `x`; a `transpose` that moves only axes of size 1 becomes a `reshape`;
//! - `transpose(transpose x)` becomes one transpose, `reshape(reshape x)` one reshape;
//! - a concatenation whose leading operands an earlier one joins already concatenates that one
//!   and the rest (a DenseNet block's concatenations become a chain).
//!
//! Replaced ops and anything left dead are removed (the pass ends with [`crate::dce`]).
//! It does not reorder ops or fold reductions, matmuls or convolutions.

pub mod fold;

use crate::manager::{OptionInfo, Options, Pass};
use cranelift_entity::SecondaryMap;
use tcc_ir::{BinaryOp, Function, Literal, Op, OpKind, UnaryOp, Value};

/// Default largest dense constant produced by folding.
pub const DEFAULT_FOLD_LIMIT: u64 = 256;

/// What happened to one op.
enum Rewrite {
    /// Its result is this existing value.
    Replace(Value),
    /// It became this op, in place.
    Become(OpKind, Vec<Value>),
    /// Nothing applies.
    Keep,
}

fn is_const(f: &Function, v: Value, x: f64) -> bool {
    let Some(op) = f.def_op(v) else { return false };
    match &f.op(op).kind {
        OpKind::Const {
            value: Literal::Splat(s),
            ..
        } => s.is(x),
        OpKind::Const {
            value: Literal::Dense(d),
            ..
        } => d.iter().all(|s| s.is(x)),
        _ => false,
    }
}

fn producer(f: &Function, v: Value) -> Option<(&OpKind, &[Value])> {
    f.def_op(v)
        .map(|op| (&f.op(op).kind, f.op(op).args.as_slice()))
}

fn rewrite(f: &Function, op: Op, limit: u64) -> Rewrite {
    let d = f.op(op);
    if !d.deps.is_empty() || d.results.len() != 1 {
        return Rewrite::Keep;
    }
    let out = f.ty(d.results[0]);
    let same_type = |v: Value| f.ty(v) == out;
    let args = &d.args;

    // Constant folding.
    if !args.is_empty()
        && !matches!(d.kind, OpKind::Const { .. })
        && let Some(consts) = fold::const_args(f, args)
        && let Some(value) = fold::fold(&d.kind, &consts, out, limit)
    {
        return Rewrite::Become(
            OpKind::Const {
                ty: out.clone(),
                value,
            },
            Vec::new(),
        );
    }

    match &d.kind {
        OpKind::Binary(b) => {
            let (x, y) = (args[0], args[1]);
            let r = match b {
                BinaryOp::Mul if is_const(f, y, 1.0) => Some(x),
                BinaryOp::Mul if is_const(f, x, 1.0) => Some(y),
                BinaryOp::Div if is_const(f, y, 1.0) => Some(x),
                BinaryOp::Add if is_const(f, y, 0.0) => Some(x),
                BinaryOp::Add if is_const(f, x, 0.0) => Some(y),
                BinaryOp::Sub if is_const(f, y, 0.0) => Some(x),
                _ => None,
            };
            match r {
                Some(v) if same_type(v) => Rewrite::Replace(v),
                _ => Rewrite::Keep,
            }
        }
        OpKind::Unary(UnaryOp::Neg) => match producer(f, args[0]) {
            Some((OpKind::Unary(UnaryOp::Neg), inner)) => Rewrite::Replace(inner[0]),
            _ => Rewrite::Keep,
        },
        OpKind::Identity => Rewrite::Replace(args[0]),
        OpKind::Reshape { .. } | OpKind::BroadcastTo { .. } | OpKind::Cast { .. }
            if same_type(args[0]) =>
        {
            Rewrite::Replace(args[0])
        }
        OpKind::Reshape { shape } => match producer(f, args[0]) {
            Some((OpKind::Reshape { .. }, inner)) => Rewrite::Become(
                OpKind::Reshape {
                    shape: shape.clone(),
                },
                vec![inner[0]],
            ),
            _ => Rewrite::Keep,
        },
        OpKind::Transpose { perm } => {
            if perm.iter().enumerate().all(|(i, &p)| p as usize == i) {
                return Rewrite::Replace(args[0]);
            }
            // Moving only axes of size 1 reorders no element: a reshape, which moves no data.
            let dims = f.ty(args[0]).dims();
            let moved: Vec<u64> = (perm.iter().copied())
                .filter(|&p| dims[p as usize] != 1)
                .collect();
            if moved.windows(2).all(|w| w[0] < w[1]) {
                let shape = out.dims().to_vec();
                return Rewrite::Become(OpKind::Reshape { shape }, vec![args[0]]);
            }
            match producer(f, args[0]) {
                Some((OpKind::Transpose { perm: inner_perm }, inner)) => {
                    // out[i] = mid[perm[i]] = in[inner_perm[perm[i]]]
                    let composed: Vec<u64> = perm.iter().map(|&p| inner_perm[p as usize]).collect();
                    if composed.iter().enumerate().all(|(i, &p)| p as usize == i) {
                        Rewrite::Replace(inner[0])
                    } else {
                        Rewrite::Become(OpKind::Transpose { perm: composed }, vec![inner[0]])
                    }
                }
                _ => Rewrite::Keep,
            }
        }
        _ => Rewrite::Keep,
    }
}

/// Rewrites each concatenation whose leading operands another, earlier concatenation along the
/// same axis joins already into a concatenation of that one and the rest:
/// `concat(a, b, c)` after `ab = concat(a, b)` becomes `concat(ab, c)`, choosing the longest
/// such prefix (operands that are themselves concatenations along the axis count as their
/// operands). Exact (it moves the same elements). A DenseNet block concatenates every earlier
/// feature map again in each layer; as a chain, each concatenation extends the one before,
/// and the backend can place each in the next (see `tcc_codegen`'s memory plan). Returns how
/// many concatenations were rewritten.
fn share_concat_prefixes(f: &mut Function) -> usize {
    use std::collections::HashMap;
    // The concatenations seen, by axis and first operand, and each one's operands with those
    // that are concatenations along the same axis replaced by theirs.
    let mut seen: HashMap<(usize, Value), Vec<Value>> = HashMap::new();
    let mut flat_of: HashMap<(Value, usize), Vec<Value>> = HashMap::new();
    let mut changed = 0;
    for op in f.schedule().to_vec() {
        let d = f.op(op);
        let OpKind::Concat { axis } = d.kind else {
            continue;
        };
        if !d.deps.is_empty() {
            continue;
        }
        let Some(axis) = tcc_ir::ops::normalize_axis(axis, f.ty(d.results[0]).rank()) else {
            continue;
        };
        let r = d.results[0];
        let flat: Vec<Value> = (d.args.iter())
            .flat_map(|&a| flat_of.get(&(a, axis)).cloned().unwrap_or_else(|| vec![a]))
            .collect();
        let prefix = |c: &Value| &flat_of[&(*c, axis)];
        // The most recent candidates only (a DenseNet layer's concatenation extends the one
        // just before), so that thousands sharing a first operand stay linear.
        let best = seen.get(&(axis, flat[0])).and_then(|cs| {
            (cs.iter().rev().take(64))
                .filter(|c| {
                    let p = prefix(c);
                    p.len() >= 2 && p.len() < flat.len() && flat.starts_with(p)
                })
                .max_by_key(|c| prefix(c).len())
        });
        if let Some(&a) = best {
            let n = prefix(&a).len();
            let args: Vec<Value> = std::iter::once(a)
                .chain(flat[n..].iter().copied())
                .collect();
            if args != d.args {
                f.op_mut(op).args = args;
                changed += 1;
            }
        }
        seen.entry((axis, flat[0])).or_default().push(r);
        flat_of.insert((r, axis), flat);
    }
    changed
}

/// Canonicalizes `f`; returns how many rewrites were applied.
pub fn canonicalize(f: &mut Function, fold_limit: u64) -> usize {
    // Sharing concatenations' prefixes and the rewrites feed each other (a rewrite can leave a
    // concatenation whose operands an earlier one now joins), so both run until neither changes
    // anything, a few times at most: the pass is idempotent.
    let mut total = 0;
    for _ in 0..4 {
        let changed = share_concat_prefixes(f) + rewrite_rounds(f, fold_limit);
        total += changed;
        if changed == 0 {
            break;
        }
    }
    total
}

/// The rewrites, round after round until a round changes nothing (eight at most).
fn rewrite_rounds(f: &mut Function, fold_limit: u64) -> usize {
    let mut total = 0;
    for _round in 0..8 {
        let mut subst: SecondaryMap<Value, Option<Value>> =
            SecondaryMap::with_capacity(f.num_values_created());
        let mut changed = 0;
        for op in f.schedule().to_vec() {
            for a in &mut f.op_mut(op).args {
                if let Some(s) = subst[*a] {
                    *a = s;
                }
            }
            match rewrite(f, op, fold_limit) {
                Rewrite::Keep => {}
                Rewrite::Replace(v) => {
                    subst[f.op(op).results[0]] = Some(v);
                    changed += 1;
                }
                Rewrite::Become(kind, args) => {
                    let d = f.op_mut(op);
                    d.kind = kind;
                    d.args = args;
                    changed += 1;
                }
            }
        }
        let results: Vec<Value> = f.results().iter().map(|&r| subst[r].unwrap_or(r)).collect();
        f.set_results(results);
        crate::dce::dce(f);
        total += changed;
        if changed == 0 {
            break;
        }
    }
    total
}

pub(crate) struct Canonicalize {
    pub(crate) fold_limit: u64,
}

pub(crate) const OPTIONS: &[OptionInfo] = &[OptionInfo {
    name: "fold-limit",
    help: "largest dense constant (in elements) that folding may create; default 256",
}];

pub(crate) fn create(o: &Options) -> Result<Box<dyn Pass>, String> {
    Ok(Box::new(Canonicalize {
        fold_limit: o.usize_or("fold-limit", DEFAULT_FOLD_LIMIT as usize)? as u64,
    }))
}

impl Pass for Canonicalize {
    fn name(&self) -> &'static str {
        "canonicalize"
    }
    fn run_on_function(&self, f: &mut Function) -> Result<(), String> {
        canonicalize(f, self.fold_limit);
        Ok(())
    }
}

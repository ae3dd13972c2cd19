//! `sgd`, `momentum`, `adam`: turn a gradient function into a pure train-step function.
//!
//! The input is what `grad` produces: the original results followed by `grad/<p>` for each
//! parameter `p` being trained. The output takes the same parameters plus the optimizer state,
//! and returns the original (non-gradient) results, then `new/<p>` for each trained parameter in
//! order, then `new/<s>` for each state parameter `s`. Feeding every `new/<name>` result back into
//! the parameter `<name>` runs the next step; that is all a training loop does (`tcc train`).
//!
//! - `sgd{lr}`: `p' = p - lr * g`.
//! - `momentum{lr, mu}`: state `momentum/<p>` (zeros at the start); `v' = mu * v + g`,
//!   `p' = p - lr * v'` (PyTorch's convention).
//! - `adam{lr, beta1, beta2, eps}`: state `adam/m/<p>`, `adam/v/<p>` (zeros) and the step count
//!   `adam/t` (a scalar, 0 at the start); `m' = b1 m + (1 - b1) g`, `v' = b2 v + (1 - b2) g^2`,
//!   `p' = p - lr * (m' / (1 - b1^t')) / (sqrt(v' / (1 - b2^t')) + eps)` with `t' = t + 1`.
//!
//! Gradients are consumed: they are not results of the train step (`dce` removes what only they
//! needed).

use crate::manager::{OptionInfo, Options, Pass};
use tcc_ir::builder::BuildError;
use tcc_ir::{BinaryOp, Function, FunctionBuilder, UnaryOp, Value};

/// An optimizer and its hyper-parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Optimizer {
    /// Plain gradient descent.
    Sgd {
        /// Learning rate.
        lr: f64,
    },
    /// Gradient descent with momentum.
    Momentum {
        /// Learning rate.
        lr: f64,
        /// Momentum coefficient.
        mu: f64,
    },
    /// Adam.
    Adam {
        /// Learning rate.
        lr: f64,
        /// Decay of the first moment.
        beta1: f64,
        /// Decay of the second moment.
        beta2: f64,
        /// Added to the denominator.
        eps: f64,
    },
}

impl Optimizer {
    fn name(&self) -> &'static str {
        match self {
            Optimizer::Sgd { .. } => "sgd",
            Optimizer::Momentum { .. } => "momentum",
            Optimizer::Adam { .. } => "adam",
        }
    }
}

/// The parameters with a `grad/<p>` result, and the other results.
fn split_results(f: &Function) -> (Vec<(Value, Value)>, Vec<Value>) {
    let mut pairs = Vec::new();
    let mut rest = Vec::new();
    for &r in f.results() {
        let p = f
            .name(r)
            .strip_prefix("grad/")
            .and_then(|n| f.lookup(n))
            .filter(|&p| f.params().contains(&p) && f.ty(p) == f.ty(r));
        match p {
            Some(p) if !pairs.iter().any(|&(q, _)| q == p) => pairs.push((p, r)),
            _ => rest.push(r),
        }
    }
    (pairs, rest)
}

/// Rewrites the gradient function `f` into a train step with `opt` (see the module docs).
pub fn apply_optimizer(f: &mut Function, opt: Optimizer) -> Result<(), String> {
    let (pairs, rest) = split_results(f);
    if pairs.is_empty() {
        return Err(format!(
            "the function returns no gradients (results named grad/<parameter>); run `grad` first, as in --passes='grad,{}{{lr=0.1}}'",
            opt.name()
        ));
    }
    let first_new = f.num_values_created();
    let mut b = FunctionBuilder::from_function(std::mem::replace(f, Function::new("")));
    let built = build_updates(&mut b, &pairs, opt);
    *f = b.into_function();
    let (new_params, new_state) = built.map_err(|e| format!("internal error: {e}"))?;
    let mut results = rest;
    results.extend(new_params);
    results.extend(new_state);
    // Clean-up may fold an update away (a parameter whose gradient is zero keeps its value):
    // the results keep their `new/<name>` names all the same.
    let names: Vec<(usize, String)> = (results.iter().enumerate())
        .filter(|&(_, &r)| f.name(r).starts_with("new/"))
        .map(|(i, &r)| (i, f.name(r).to_string()))
        .collect();
    f.set_results(results);
    crate::grad::clean_up(f);
    crate::grad::name_results(f, &names, first_new);
    Ok(())
}

fn build_updates(
    b: &mut FunctionBuilder,
    pairs: &[(Value, Value)],
    opt: Optimizer,
) -> Result<(Vec<Value>, Vec<Value>), BuildError> {
    let mut new_params = Vec::new();
    let mut new_state = Vec::new();
    let name = |b: &FunctionBuilder, v: Value| b.function().name(v).to_string();
    let ty = |b: &FunctionBuilder, v: Value| b.function().ty(v).clone();
    let scalar = |b: &mut FunctionBuilder, like: Value, x: f64| {
        let dt = b.function().ty(like).dtype();
        b.splat(dt, &[], x)
    };
    // Adam's step count and bias corrections are shared by every parameter.
    let mut adam_t = None;
    if let Optimizer::Adam { beta1, beta2, .. } = opt {
        let dt = ty(b, pairs[0].0).dtype();
        let t = b.param("adam/t", dt, &[])?;
        let one = b.splat(dt, &[], 1.0)?;
        let t1 = b.add(t, one)?;
        let b1 = b.splat(dt, &[], beta1)?;
        let b2 = b.splat(dt, &[], beta2)?;
        let p1 = b.binary(BinaryOp::Pow, b1, t1)?;
        let p2 = b.binary(BinaryOp::Pow, b2, t1)?;
        let c1 = b.sub(one, p1)?;
        let c2 = b.sub(one, p2)?;
        adam_t = Some((t1, c1, c2));
    }
    for &(p, g) in pairs {
        let pn = name(b, p);
        let pt = ty(b, p);
        // State parameters first, outside the scope of the update's ops.
        let state: Vec<Value> = match opt {
            Optimizer::Sgd { .. } => vec![],
            Optimizer::Momentum { .. } => {
                vec![b.param(&format!("momentum/{pn}"), pt.dtype(), pt.dims())?]
            }
            Optimizer::Adam { .. } => vec![
                b.param(&format!("adam/m/{pn}"), pt.dtype(), pt.dims())?,
                b.param(&format!("adam/v/{pn}"), pt.dtype(), pt.dims())?,
            ],
        };
        b.push_scope(&format!("{}/{pn}", opt.name()));
        let new = match opt {
            Optimizer::Sgd { lr } => {
                let k = scalar(b, p, lr)?;
                let step = b.mul(g, k)?;
                b.sub(p, step)?
            }
            Optimizer::Momentum { lr, mu } => {
                let v = state[0];
                let m = scalar(b, p, mu)?;
                let mv = b.mul(v, m)?;
                let v2 = b.add(mv, g)?;
                let k = scalar(b, p, lr)?;
                let step = b.mul(v2, k)?;
                b.rename(v2, &format!("new/momentum/{pn}"));
                new_state.push(v2);
                b.sub(p, step)?
            }
            Optimizer::Adam {
                lr,
                beta1,
                beta2,
                eps,
            } => {
                let (_, c1, c2) = adam_t.expect("created above");
                let (m, v) = (state[0], state[1]);
                let k1 = scalar(b, p, beta1)?;
                let k1c = scalar(b, p, 1.0 - beta1)?;
                let a = b.mul(m, k1)?;
                let c = b.mul(g, k1c)?;
                let m2 = b.add(a, c)?;
                let k2 = scalar(b, p, beta2)?;
                let k2c = scalar(b, p, 1.0 - beta2)?;
                let gg = b.mul(g, g)?;
                let a = b.mul(v, k2)?;
                let c = b.mul(gg, k2c)?;
                let v2 = b.add(a, c)?;
                let (c1, c2) = cast_like(b, p, c1, c2)?;
                let mhat = b.div(m2, c1)?;
                let vhat = b.div(v2, c2)?;
                let s = b.unary(UnaryOp::Sqrt, vhat)?;
                let e = scalar(b, p, eps)?;
                let den = b.add(s, e)?;
                let q = b.div(mhat, den)?;
                let k = scalar(b, p, lr)?;
                let step = b.mul(q, k)?;
                b.rename(m2, &format!("new/adam/m/{pn}"));
                b.rename(v2, &format!("new/adam/v/{pn}"));
                new_state.push(m2);
                new_state.push(v2);
                b.sub(p, step)?
            }
        };
        b.pop_scope();
        b.rename(new, &format!("new/{pn}"));
        new_params.push(new);
    }
    if let Some((t1, ..)) = adam_t {
        b.rename(t1, "new/adam/t");
        new_state.push(t1);
    }
    Ok((new_params, new_state))
}

/// Casts Adam's shared bias corrections to `p`'s dtype when it differs.
fn cast_like(
    b: &mut FunctionBuilder,
    p: Value,
    c1: Value,
    c2: Value,
) -> Result<(Value, Value), BuildError> {
    let dt = b.function().ty(p).dtype();
    if b.function().ty(c1).dtype() == dt {
        return Ok((c1, c2));
    }
    let k = tcc_ir::OpKind::Cast { to: dt };
    Ok((b.op1(k.clone(), &[c1])?, b.op1(k, &[c2])?))
}

fn float(o: &Options, key: &str, default: Option<f64>, name: &str) -> Result<f64, String> {
    match o.get(key) {
        None => {
            default.ok_or_else(|| format!("`{name}` needs `{key}`, as in {name}{{{key}=0.01}}"))
        }
        Some(v) => match v.parse::<f64>() {
            Ok(x) if x.is_finite() => Ok(x),
            _ => Err(format!(
                "option `{key}` must be a finite number, found `{v}`"
            )),
        },
    }
}

/// Reads an optimizer from pipeline options.
pub fn options(name: &str, o: &Options) -> Result<Optimizer, String> {
    let lr = float(o, "lr", None, name)?;
    Ok(match name {
        "sgd" => Optimizer::Sgd { lr },
        "momentum" => Optimizer::Momentum {
            lr,
            mu: float(o, "mu", Some(0.9), name)?,
        },
        _ => Optimizer::Adam {
            lr,
            beta1: float(o, "beta1", Some(0.9), name)?,
            beta2: float(o, "beta2", Some(0.999), name)?,
            eps: float(o, "eps", Some(1e-8), name)?,
        },
    })
}

pub(crate) const SGD_OPTIONS: &[OptionInfo] = &[OptionInfo {
    name: "lr",
    help: "learning rate (required)",
}];

pub(crate) const MOMENTUM_OPTIONS: &[OptionInfo] = &[
    OptionInfo {
        name: "lr",
        help: "learning rate (required)",
    },
    OptionInfo {
        name: "mu",
        help: "momentum (default 0.9)",
    },
];

pub(crate) const ADAM_OPTIONS: &[OptionInfo] = &[
    OptionInfo {
        name: "lr",
        help: "learning rate (required)",
    },
    OptionInfo {
        name: "beta1",
        help: "first-moment decay (default 0.9)",
    },
    OptionInfo {
        name: "beta2",
        help: "second-moment decay (default 0.999)",
    },
    OptionInfo {
        name: "eps",
        help: "denominator term (default 1e-8)",
    },
];

struct OptimizerPass(Optimizer);

impl Pass for OptimizerPass {
    fn name(&self) -> &'static str {
        self.0.name()
    }
    fn run_on_function(&self, f: &mut Function) -> Result<(), String> {
        apply_optimizer(f, self.0)
    }
}

pub(crate) fn create_sgd(o: &Options) -> Result<Box<dyn Pass>, String> {
    Ok(Box::new(OptimizerPass(options("sgd", o)?)))
}

pub(crate) fn create_momentum(o: &Options) -> Result<Box<dyn Pass>, String> {
    Ok(Box::new(OptimizerPass(options("momentum", o)?)))
}

pub(crate) fn create_adam(o: &Options) -> Result<Box<dyn Pass>, String> {
    Ok(Box::new(OptimizerPass(options("adam", o)?)))
}

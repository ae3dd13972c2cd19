//! The recurrent ops `RNN`, `GRU` and `LSTM`, unrolled over the static sequence length.
//!
//! Why unrolled rather than a new op: tcc's shapes are static, so the number of steps is known
//! at import time, and each step is a handful of ops tcc already compiles and differentiates
//! (matmul, add, the activations, slices). The gradient is then exact by construction (the
//! rules of those ops, checked against finite differences), remat and the memory planner see
//! every step's state, and no new kernel is needed. The cost is graph size: about 15 to 25 ops
//! per step, direction and layer, which a 100k-op budget covers for sequences of thousands.
//!
//! The input projections of all steps are one matmul (`X W^T + Wb` for the whole sequence);
//! each step adds `H R^T + Rb`, cuts the gates apart and applies the cell. Gate orders are
//! ONNX's (LSTM `iofc`, GRU `zrh`). `sequence_lens`, which must be known at import time,
//! masks the steps past each batch element's length: its state is held and its output is zero,
//! and the reverse direction starts at its last valid step, as ONNX defines.

use super::elementwise::{elu, hard_sigmoid, leaky_relu, softplus};
use crate::ctx::{Ctx, Node, binary, compare, const_ints, reshape, unary};
use crate::{Error, Result};
use tcc_ir::{BinaryOp, CmpOp, Data, OpKind, Tensor, UnaryOp, Value};

#[derive(Clone, Copy, PartialEq)]
enum Cell {
    Rnn,
    Gru { linear_before_reset: bool },
    Lstm,
}

impl Cell {
    fn gates(self) -> u64 {
        match self {
            Cell::Rnn => 1,
            Cell::Gru { .. } => 3,
            Cell::Lstm => 4,
        }
    }

    fn activations(self) -> usize {
        match self {
            Cell::Rnn => 1,
            Cell::Gru { .. } => 2,
            Cell::Lstm => 3,
        }
    }

    fn default_activations(self) -> &'static [&'static str] {
        match self {
            Cell::Rnn => &["Tanh"],
            Cell::Gru { .. } => &["Sigmoid", "Tanh"],
            Cell::Lstm => &["Sigmoid", "Tanh", "Tanh"],
        }
    }
}

/// An activation function with its alpha and beta.
#[derive(Clone, Debug)]
struct Act {
    name: String,
    alpha: f64,
    beta: f64,
}

impl Act {
    fn apply(&self, cx: &mut Ctx, x: Value) -> Result<Value> {
        let dt = cx.dtype(x);
        let (a, b) = (self.alpha, self.beta);
        match self.name.to_ascii_lowercase().as_str() {
            "sigmoid" => unary(cx, UnaryOp::Sigmoid, x),
            "tanh" => unary(cx, UnaryOp::Tanh, x),
            "relu" => unary(cx, UnaryOp::Relu, x),
            "leakyrelu" => leaky_relu(cx, x, a),
            "elu" => elu(cx, x, a),
            "softplus" => softplus(cx, x),
            "hardsigmoid" => hard_sigmoid(cx, x, a, b),
            "affine" => {
                let (ka, kb) = (cx.scalar(dt, a)?, cx.scalar(dt, b)?);
                let ax = binary(cx, BinaryOp::Mul, x, ka)?;
                binary(cx, BinaryOp::Add, ax, kb)
            }
            "scaledtanh" => {
                let (ka, kb) = (cx.scalar(dt, a)?, cx.scalar(dt, b)?);
                let bx = binary(cx, BinaryOp::Mul, x, kb)?;
                let t = unary(cx, UnaryOp::Tanh, bx)?;
                binary(cx, BinaryOp::Mul, t, ka)
            }
            "thresholdedrelu" => {
                let ka = cx.scalar(dt, a)?;
                let zero = cx.scalar(dt, 0.0)?;
                let gt = compare(cx, CmpOp::Gt, x, ka)?;
                cx.op1(OpKind::Select, &[gt, x, zero])
            }
            "softsign" => {
                let ab = unary(cx, UnaryOp::Abs, x)?;
                let one = cx.scalar(dt, 1.0)?;
                let d = binary(cx, BinaryOp::Add, ab, one)?;
                binary(cx, BinaryOp::Div, x, d)
            }
            other => Err(Error::unsupported(format!(
                "activation `{other}` is not supported (tcc has Sigmoid, Tanh, Relu, LeakyRelu, Elu, Softplus, HardSigmoid, Affine, ScaledTanh, ThresholdedRelu, Softsign)"
            ))),
        }
    }
}

/// The activations of each direction, with the alphas and betas taken in order by those that
/// use them (defaults where the lists run out).
fn activations(n: &Node, cell: Cell, dirs: usize) -> Result<Vec<Vec<Act>>> {
    let per = cell.activations();
    let names: Vec<String> = match n.strings("activations")? {
        Some(v) if v.len() == per * dirs => v,
        Some(v) if v.len() == per => (0..dirs).flat_map(|_| v.iter().cloned()).collect(),
        Some(v) => {
            return Err(Error::invalid(format!(
                "activations has {} entries; {} needs {per} per direction ({} in all)",
                v.len(),
                n.op_type(),
                per * dirs
            )));
        }
        None => (0..dirs)
            .flat_map(|_| cell.default_activations().iter().map(|s| s.to_string()))
            .collect(),
    };
    let alphas = n.floats("activation_alpha")?.unwrap_or_default();
    let betas = n.floats("activation_beta")?.unwrap_or_default();
    let (mut ai, mut bi) = (0, 0);
    let mut acts = Vec::with_capacity(names.len());
    for name in names {
        let lower = name.to_ascii_lowercase();
        let (da, db, uses_a, uses_b) = match lower.as_str() {
            "leakyrelu" => (0.01, 0.0, true, false),
            "thresholdedrelu" | "elu" => (1.0, 0.0, true, false),
            "hardsigmoid" => (0.2, 0.5, true, true),
            "affine" | "scaledtanh" => (1.0, if lower == "affine" { 0.0 } else { 1.0 }, true, true),
            _ => (0.0, 0.0, false, false),
        };
        let take = |v: &[f32], i: &mut usize, d: f64, used: bool| {
            if !used {
                return d;
            }
            let x = v.get(*i).map_or(d, |&x| x as f64);
            *i += 1;
            x
        };
        let alpha = take(&alphas, &mut ai, da, uses_a);
        let beta = take(&betas, &mut bi, db, uses_b);
        acts.push(Act { name, alpha, beta });
    }
    Ok(acts.chunks(per).map(|c| c.to_vec()).collect())
}

/// `RNN`, `GRU`, `LSTM`: `(X, W, R, B?, sequence_lens?, initial_h?[, initial_c?, P?]) ->
/// (Y, Y_h[, Y_c])`.
pub(super) fn recurrent(cx: &mut Ctx, n: &Node) -> Result<Vec<Option<Value>>> {
    let cell = match n.op_type() {
        "RNN" => Cell::Rnn,
        "GRU" => Cell::Gru {
            linear_before_reset: n.int("linear_before_reset", 0)? != 0,
        },
        _ => Cell::Lstm,
    };
    if cell == Cell::Lstm && n.int("input_forget", 0)? != 0 {
        return n.unsupported("input_forget=1");
    }
    let (x, w, r) = (n.input(0, "X")?, n.input(1, "W")?, n.input(2, "R")?);
    let dt = cx.dtype(x);
    if !dt.is_float() {
        return Err(Error::invalid(format!(
            "X must be floating-point, found {}",
            cx.ty(x)
        )));
    }
    let layout = n.int("layout", 0)?;
    let x = match layout {
        0 => x,
        1 => cx.op1(
            OpKind::Transpose {
                perm: vec![1, 0, 2],
            },
            &[x],
        )?,
        l => return Err(Error::invalid(format!("layout must be 0 or 1, found {l}"))),
    };
    let xd = cx.dims(x);
    if xd.len() != 3 {
        return Err(Error::invalid(format!(
            "X must have rank 3, found {}",
            cx.ty(x)
        )));
    }
    let (steps, batch, input) = (xd[0], xd[1], xd[2]);
    let dirs: Vec<bool> = match n.string("direction", "forward")?.as_str() {
        "forward" => vec![false],
        "reverse" => vec![true],
        "bidirectional" => vec![false, true],
        other => return Err(Error::invalid(format!("unknown direction `{other}`"))),
    };
    let nd = dirs.len() as u64;
    let g = cell.gates();
    let rd = cx.dims(r);
    let hidden = match n.int("hidden_size", 0)? {
        0 if rd.len() == 3 => rd[2],
        h if h > 0 => h as u64,
        h => {
            return Err(Error::invalid(format!(
                "hidden_size must be positive, found {h}"
            )));
        }
    };
    let check = |cx: &Ctx, v: Value, want: &[u64], what: &str| -> Result<()> {
        if cx.dims(v) != want || cx.dtype(v) != dt {
            return Err(Error::invalid(format!(
                "{what} must be {dt}{want:?}, found {}",
                cx.ty(v)
            )));
        }
        Ok(())
    };
    check(cx, w, &[nd, g * hidden, input], "W")?;
    check(cx, r, &[nd, g * hidden, hidden], "R")?;
    let bias = n.opt(3);
    if let Some(b) = bias {
        check(cx, b, &[nd, 2 * g * hidden], "B")?;
    }
    let init = |cx: &mut Ctx, i: usize, what: &str| -> Result<Option<Value>> {
        let Some(v) = n.opt(i) else { return Ok(None) };
        let v = if layout == 1 {
            cx.op1(
                OpKind::Transpose {
                    perm: vec![1, 0, 2],
                },
                &[v],
            )?
        } else {
            v
        };
        check(cx, v, &[nd, batch, hidden], what)?;
        Ok(Some(v))
    };
    let h0 = init(cx, 5, "initial_h")?;
    let c0 = if cell == Cell::Lstm {
        init(cx, 6, "initial_c")?
    } else {
        None
    };
    let peep = match (cell, n.opt(7)) {
        (Cell::Lstm, Some(p)) => {
            check(cx, p, &[nd, 3 * hidden], "P")?;
            Some(p)
        }
        _ => None,
    };
    let lens = match n.opt(4) {
        None => None,
        Some(_) => {
            let l = const_ints(cx, n, 4, "sequence_lens")?;
            if l.len() as u64 != batch || l.iter().any(|&v| v < 0 || v as u64 > steps) {
                return Err(Error::invalid(format!(
                    "sequence_lens must hold {batch} lengths in 0..={steps}, found {l:?}"
                )));
            }
            (l.iter().any(|&v| v as u64 != steps)).then_some(l)
        }
    };
    let clip = n.attr("clip").map(|_| n.float("clip", 0.0)).transpose()?;
    let acts = activations(n, cell, dirs.len())?;

    let slice = |cx: &mut Ctx, v: Value, axis: usize, from: u64, to: u64| -> Result<Value> {
        let d = cx.dims(v);
        let mut starts = vec![0; d.len()];
        let mut ends: Vec<i64> = d.iter().map(|&x| x as i64).collect();
        starts[axis] = from as i64;
        ends[axis] = to as i64;
        cx.op1(
            OpKind::Slice {
                starts,
                ends,
                steps: vec![1; d.len()],
            },
            &[v],
        )
    };
    let x2 = reshape(cx, x, &[steps * batch, input])?;
    let mut ys = Vec::with_capacity(dirs.len());
    let mut hs = Vec::with_capacity(dirs.len());
    let mut cs = Vec::with_capacity(dirs.len());
    for (d, &reverse) in dirs.iter().enumerate() {
        let d64 = d as u64;
        let part = |cx: &mut Ctx, v: Value, rows: u64, cols: u64| -> Result<Value> {
            let s = slice(cx, v, 0, d64, d64 + 1)?;
            reshape(cx, s, &[rows, cols])
        };
        let wd = part(cx, w, g * hidden, input)?;
        let rd = part(cx, r, g * hidden, hidden)?;
        let wt = cx.op1(OpKind::Transpose { perm: vec![1, 0] }, &[wd])?;
        let rt = cx.op1(OpKind::Transpose { perm: vec![1, 0] }, &[rd])?;
        let (wb, rb) = match bias {
            Some(b) => {
                let bd = part(cx, b, 1, 2 * g * hidden)?;
                let bd = reshape(cx, bd, &[2 * g * hidden])?;
                (
                    Some(slice(cx, bd, 0, 0, g * hidden)?),
                    Some(slice(cx, bd, 0, g * hidden, 2 * g * hidden)?),
                )
            }
            None => (None, None),
        };
        // The input projection of every step at once: [steps, batch, g * hidden].
        let mut xw = cx.op1(OpKind::MatMul, &[x2, wt])?;
        if let Some(wb) = wb {
            xw = binary(cx, BinaryOp::Add, xw, wb)?;
        }
        let xw = reshape(cx, xw, &[steps, batch, g * hidden])?;
        let state = |cx: &mut Ctx, s: Option<Value>| -> Result<Value> {
            match s {
                Some(s) => part(cx, s, batch, hidden),
                None => cx.splat(
                    tcc_ir::TensorType::new(dt, vec![batch, hidden])
                        .map_err(|e| Error::invalid(e.to_string()))?,
                    tcc_ir::Scalar::from_f64(dt, 0.0),
                ),
            }
        };
        let mut h = state(cx, h0)?;
        let mut c = state(cx, c0)?;
        let peeps = match peep {
            Some(p) => {
                let pd = part(cx, p, 1, 3 * hidden)?;
                let pd = reshape(cx, pd, &[3 * hidden])?;
                let mut v = [pd; 3];
                for (k, slot) in v.iter_mut().enumerate() {
                    let k = k as u64;
                    *slot = slice(cx, pd, 0, k * hidden, (k + 1) * hidden)?;
                }
                Some(v)
            }
            None => None,
        };
        // GRU without linear-before-reset multiplies R_h by the reset state: the step's
        // recurrent product covers the z and r gates only, and R_h and Rb_h stay apart.
        let split_h = matches!(
            cell,
            Cell::Gru {
                linear_before_reset: false
            }
        );
        let (rt_main, rb_main, rt_h, rb_h) = if split_h {
            (
                slice(cx, rt, 1, 0, 2 * hidden)?,
                rb.map(|rb| slice(cx, rb, 0, 0, 2 * hidden)).transpose()?,
                Some(slice(cx, rt, 1, 2 * hidden, 3 * hidden)?),
                rb.map(|rb| slice(cx, rb, 0, 2 * hidden, 3 * hidden))
                    .transpose()?,
            )
        } else {
            (rt, rb, None, None)
        };
        let act = &acts[d];
        let mut outs: Vec<Option<Value>> = vec![None; steps as usize];
        let order: Vec<u64> = if reverse {
            (0..steps).rev().collect()
        } else {
            (0..steps).collect()
        };
        for t in order {
            cx.b.push_scope(&format!("{}{t}", if reverse { "rev" } else { "t" }));
            let xt = slice(cx, xw, 0, t, t + 1)?;
            let xt = reshape(cx, xt, &[batch, g * hidden])?;
            let mut hr = cx.op1(OpKind::MatMul, &[h, rt_main])?;
            if let Some(rb) = rb_main {
                hr = binary(cx, BinaryOp::Add, hr, rb)?;
            }
            let gate =
                |cx: &mut Ctx, v: Value, k: u64| slice(cx, v, 1, k * hidden, (k + 1) * hidden);
            let clipped = |cx: &mut Ctx, v: Value| -> Result<Value> {
                match clip {
                    Some(k) => {
                        let hi = cx.scalar(dt, k as f64)?;
                        let lo = cx.scalar(dt, -k as f64)?;
                        let v = binary(cx, BinaryOp::Max, v, lo)?;
                        binary(cx, BinaryOp::Min, v, hi)
                    }
                    None => Ok(v),
                }
            };
            let (hn, cn) = match cell {
                Cell::Rnn => {
                    let s = binary(cx, BinaryOp::Add, xt, hr)?;
                    let s = clipped(cx, s)?;
                    (act[0].apply(cx, s)?, None)
                }
                Cell::Gru {
                    linear_before_reset,
                } => {
                    let pre = |cx: &mut Ctx, k: u64| -> Result<Value> {
                        let a = gate(cx, xt, k)?;
                        let b = gate(cx, hr, k)?;
                        let s = binary(cx, BinaryOp::Add, a, b)?;
                        clipped(cx, s)
                    };
                    let z = pre(cx, 0)?;
                    let z = act[0].apply(cx, z)?;
                    let rg = pre(cx, 1)?;
                    let rg = act[0].apply(cx, rg)?;
                    let xh = gate(cx, xt, 2)?;
                    let inner = if linear_before_reset {
                        // r * (H R_h^T + Rb_h)
                        let hh = gate(cx, hr, 2)?;
                        binary(cx, BinaryOp::Mul, rg, hh)?
                    } else {
                        // (r * H) R_h^T + Rb_h
                        let rh = binary(cx, BinaryOp::Mul, rg, h)?;
                        let rt_h = rt_h.expect("split for this cell");
                        let p = cx.op1(OpKind::MatMul, &[rh, rt_h])?;
                        match rb_h {
                            Some(rbh) => binary(cx, BinaryOp::Add, p, rbh)?,
                            None => p,
                        }
                    };
                    let s = binary(cx, BinaryOp::Add, xh, inner)?;
                    let s = clipped(cx, s)?;
                    let hc = act[1].apply(cx, s)?;
                    // (1 - z) * hc + z * H = hc + z * (H - hc)
                    let diff = binary(cx, BinaryOp::Sub, h, hc)?;
                    let zd = binary(cx, BinaryOp::Mul, z, diff)?;
                    (binary(cx, BinaryOp::Add, hc, zd)?, None)
                }
                Cell::Lstm => {
                    let pre = |cx: &mut Ctx, k: u64| -> Result<Value> {
                        let a = gate(cx, xt, k)?;
                        let b = gate(cx, hr, k)?;
                        binary(cx, BinaryOp::Add, a, b)
                    };
                    let peep_add = |cx: &mut Ctx, v: Value, k: usize, state: Value| match peeps {
                        Some(p) => {
                            let pc = binary(cx, BinaryOp::Mul, p[k], state)?;
                            binary(cx, BinaryOp::Add, v, pc)
                        }
                        None => Ok(v),
                    };
                    // Gates i, o, f, c; peepholes i, o, f.
                    let i = pre(cx, 0)?;
                    let i = peep_add(cx, i, 0, c)?;
                    let i = clipped(cx, i)?;
                    let i = act[0].apply(cx, i)?;
                    let f = pre(cx, 2)?;
                    let f = peep_add(cx, f, 2, c)?;
                    let f = clipped(cx, f)?;
                    let f = act[0].apply(cx, f)?;
                    let cc = pre(cx, 3)?;
                    let cc = clipped(cx, cc)?;
                    let cc = act[1].apply(cx, cc)?;
                    let fc = binary(cx, BinaryOp::Mul, f, c)?;
                    let ic = binary(cx, BinaryOp::Mul, i, cc)?;
                    let cn = binary(cx, BinaryOp::Add, fc, ic)?;
                    let o = pre(cx, 1)?;
                    let o = peep_add(cx, o, 1, cn)?;
                    let o = clipped(cx, o)?;
                    let o = act[0].apply(cx, o)?;
                    let hc = act[2].apply(cx, cn)?;
                    (binary(cx, BinaryOp::Mul, o, hc)?, Some(cn))
                }
            };
            let (y, hn, cn) = match &lens {
                None => (hn, hn, cn),
                Some(l) => {
                    // Elements whose sequence ended hold their state and output zeros.
                    let valid: Vec<bool> = l.iter().map(|&v| (t as i64) < v).collect();
                    let m = Tensor::from_data(&[batch, 1], Data::Bool(valid))
                        .map_err(|e| Error::invalid(e.to_string()))?;
                    let m = cx.constant(m)?;
                    let zero = cx.scalar(dt, 0.0)?;
                    let y = cx.op1(OpKind::Select, &[m, hn, zero])?;
                    let hk = cx.op1(OpKind::Select, &[m, hn, h])?;
                    let ck = match cn {
                        Some(cn) => Some(cx.op1(OpKind::Select, &[m, cn, c])?),
                        None => None,
                    };
                    (y, hk, ck)
                }
            };
            h = hn;
            if let Some(cn) = cn {
                c = cn;
            }
            outs[t as usize] = Some(reshape(cx, y, &[1, 1, batch, hidden])?);
            cx.b.pop_scope();
        }
        let outs: Vec<Value> = outs.into_iter().flatten().collect();
        let y = if outs.len() == 1 {
            outs[0]
        } else if outs.is_empty() {
            cx.splat(
                tcc_ir::TensorType::new(dt, vec![0, 1, batch, hidden])
                    .map_err(|e| Error::invalid(e.to_string()))?,
                tcc_ir::Scalar::from_f64(dt, 0.0),
            )?
        } else {
            cx.op1(OpKind::Concat { axis: 0 }, &outs)?
        };
        ys.push(y);
        hs.push(reshape(cx, h, &[1, batch, hidden])?);
        cs.push(reshape(cx, c, &[1, batch, hidden])?);
    }
    let join = |cx: &mut Ctx, v: Vec<Value>, axis: i64| -> Result<Value> {
        if v.len() == 1 {
            Ok(v[0])
        } else {
            cx.op1(OpKind::Concat { axis }, &v)
        }
    };
    let mut y = join(cx, ys, 1)?;
    let mut yh = join(cx, hs, 0)?;
    let mut yc = join(cx, cs, 0)?;
    if layout == 1 {
        y = cx.op1(
            OpKind::Transpose {
                perm: vec![2, 0, 1, 3],
            },
            &[y],
        )?;
        yh = cx.op1(
            OpKind::Transpose {
                perm: vec![1, 0, 2],
            },
            &[yh],
        )?;
        yc = cx.op1(
            OpKind::Transpose {
                perm: vec![1, 0, 2],
            },
            &[yc],
        )?;
    }
    Ok(match cell {
        Cell::Lstm => vec![Some(y), Some(yh), Some(yc)],
        _ => vec![Some(y), Some(yh)],
    })
}

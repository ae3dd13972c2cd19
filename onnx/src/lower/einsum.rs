//! `Einsum`, lowered to `reduce_sum`, `transpose`, `reshape` and batched `matmul`.
//!
//! Operands are combined left to right. Before each product, letters that occur in one operand
//! only and are needed neither by the output nor by a later operand are summed away. The pair
//! is then one batched matrix product: the letters both share and keep are the batch, the
//! letters both share and drop are contracted, and the rest are the rows of the left and the
//! columns of the right. The last step sums what the output drops and transposes to its order.
//! `...` stands for the same leading dimensions in every operand that has it. A letter repeated
//! within one operand (a diagonal) is not supported.

use crate::ctx::{Ctx, Node, reshape};
use crate::{Error, Result};
use tcc_ir::{OpKind, ReduceOp, Value};

/// An operand: its value and one letter per axis.
struct Term {
    v: Value,
    letters: Vec<char>,
}

pub(super) fn einsum(cx: &mut Ctx, n: &Node) -> Result<Value> {
    if n.attr("equation").is_none() {
        return Err(Error::invalid("Einsum needs the `equation` attribute"));
    }
    let eq: String = n
        .string("equation", "")?
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    if n.ins.is_empty() {
        return Err(Error::invalid("Einsum needs at least one input"));
    }
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l, Some(r)),
        None => (eq.as_str(), None),
    };
    let specs: Vec<&str> = lhs.split(',').collect();
    if specs.len() != n.ins.len() {
        return Err(Error::invalid(format!(
            "equation `{eq}` names {} operands, but the node has {}",
            specs.len(),
            n.ins.len()
        )));
    }
    // `...` becomes fresh letters for the leading broadcast dimensions, the same in each term.
    let mut ellipsis: Option<Vec<char>> = None;
    let mut terms = Vec::with_capacity(specs.len());
    for (i, spec) in specs.iter().enumerate() {
        let v = n.input(i, "an operand")?;
        let rank = cx.dims(v).len();
        let letters = expand(spec, rank, &mut ellipsis, &eq)?;
        if letters.len() != rank {
            return Err(Error::invalid(format!(
                "operand {i} has rank {rank}, but `{spec}` names {} axes",
                letters.len()
            )));
        }
        let mut seen = Vec::new();
        for &c in &letters {
            if seen.contains(&c) {
                return Err(Error::unsupported(format!(
                    "Einsum with a letter repeated in one operand (`{spec}`, a diagonal) is not supported"
                )));
            }
            seen.push(c);
        }
        terms.push(Term { v, letters });
    }
    let output: Vec<char> = match rhs {
        Some(r) => {
            let e = ellipsis.clone().unwrap_or_default();
            let rank = r.replace("...", "").chars().count() + e.len();
            expand(r, rank, &mut ellipsis, &eq)?
        }
        None => {
            // Implicit: the ellipsis, then the letters that occur once, in alphabetical order.
            let mut once: Vec<char> = Vec::new();
            let all: Vec<char> = terms.iter().flat_map(|t| t.letters.clone()).collect();
            for &c in &all {
                if c.is_ascii_alphabetic() && all.iter().filter(|&&d| d == c).count() == 1 {
                    once.push(c);
                }
            }
            once.sort_unstable();
            ellipsis
                .clone()
                .unwrap_or_default()
                .into_iter()
                .chain(once)
                .collect()
        }
    };
    // Each letter's size, checked to agree.
    let mut size: Vec<(char, u64)> = Vec::new();
    for t in &terms {
        for (&c, &d) in t.letters.iter().zip(&cx.dims(t.v)) {
            match size.iter().find(|s| s.0 == c) {
                Some(&(_, e)) if e != d => {
                    return Err(Error::invalid(format!(
                        "`{c}` has size {e} in one operand and {d} in another"
                    )));
                }
                Some(_) => {}
                None => size.push((c, d)),
            }
        }
    }
    for c in &output {
        if !size.iter().any(|s| s.0 == *c) {
            return Err(Error::invalid(format!(
                "output letter `{c}` occurs in no operand"
            )));
        }
    }
    let size_of = |c: char| size.iter().find(|s| s.0 == c).map_or(1, |s| s.1);

    let mut terms = terms.into_iter();
    let mut acc = terms.next().expect("at least one operand");
    let rest: Vec<Term> = terms.collect();
    // Letters still needed after each product: the output's and later operands'.
    let needed: Vec<Vec<char>> = (0..rest.len())
        .map(|i| {
            let mut v = output.clone();
            v.extend(rest[i + 1..].iter().flat_map(|t| t.letters.iter().copied()));
            v
        })
        .collect();
    for (next, later) in rest.into_iter().zip(&needed) {
        acc = product(cx, acc, next, later, &size_of)?;
    }
    // Sum what the output drops, then put the axes in the output's order.
    let drop: Vec<char> = acc
        .letters
        .iter()
        .copied()
        .filter(|c| !output.contains(c))
        .collect();
    let acc = sum_away(cx, acc, &drop)?;
    let perm: Vec<u64> = output
        .iter()
        .map(|c| acc.letters.iter().position(|d| d == c).expect("kept") as u64)
        .collect();
    if perm.iter().enumerate().all(|(i, &p)| i as u64 == p) {
        return Ok(acc.v);
    }
    cx.op1(OpKind::Transpose { perm }, &[acc.v])
}

/// The letters of `spec`, with `...` replaced by the shared ellipsis letters (their count fixed
/// by the first operand that has one).
fn expand(
    spec: &str,
    rank: usize,
    ellipsis: &mut Option<Vec<char>>,
    eq: &str,
) -> Result<Vec<char>> {
    let Some((before, after)) = spec.split_once("...") else {
        let letters: Vec<char> = spec.chars().collect();
        if let Some(c) = letters.iter().find(|c| !c.is_ascii_alphabetic()) {
            return Err(Error::invalid(format!(
                "equation `{eq}` has `{c}`, which is not a letter"
            )));
        }
        return Ok(letters);
    };
    let named = before.chars().count() + after.chars().count();
    let k = rank.checked_sub(named).ok_or_else(|| {
        Error::invalid(format!(
            "`{spec}` names more axes than the operand's rank {rank}"
        ))
    })?;
    let e = ellipsis.get_or_insert_with(|| {
        (0..k)
            .map(|i| char::from_u32(0x3b1 + i as u32).unwrap_or('?'))
            .collect()
    });
    if e.len() != k {
        return Err(Error::unsupported(format!(
            "Einsum with `...` standing for {k} dimensions here and {} elsewhere (broadcasting) is not supported",
            e.len()
        )));
    }
    Ok(before
        .chars()
        .chain(e.iter().copied())
        .chain(after.chars())
        .collect())
}

/// Sums `t` over `letters`.
fn sum_away(cx: &mut Ctx, t: Term, letters: &[char]) -> Result<Term> {
    if letters.is_empty() {
        return Ok(t);
    }
    let axes: Vec<i64> = (t.letters.iter().enumerate())
        .filter(|(_, c)| letters.contains(c))
        .map(|(i, _)| i as i64)
        .collect();
    let v = cx.op1(
        OpKind::Reduce {
            op: ReduceOp::Sum,
            axes,
            keepdims: false,
        },
        &[t.v],
    )?;
    Ok(Term {
        v,
        letters: t
            .letters
            .into_iter()
            .filter(|c| !letters.contains(c))
            .collect(),
    })
}

/// Permutes `t` to the order `to`.
fn arrange(cx: &mut Ctx, t: &Term, to: &[char]) -> Result<Value> {
    let perm: Vec<u64> = to
        .iter()
        .map(|c| {
            t.letters
                .iter()
                .position(|d| d == c)
                .expect("a letter of t") as u64
        })
        .collect();
    if perm.iter().enumerate().all(|(i, &p)| i as u64 == p) {
        return Ok(t.v);
    }
    cx.op1(OpKind::Transpose { perm }, &[t.v])
}

/// The product of `a` and `b`, keeping the letters of either that `keep` needs.
fn product(
    cx: &mut Ctx,
    a: Term,
    b: Term,
    keep: &[char],
    size_of: &dyn Fn(char) -> u64,
) -> Result<Term> {
    let only = |x: &Term, y: &Term| -> Vec<char> {
        (x.letters.iter().copied())
            .filter(|c| !y.letters.contains(c) && !keep.contains(c))
            .collect()
    };
    let (a_drop, b_drop) = (only(&a, &b), only(&b, &a));
    let a = sum_away(cx, a, &a_drop)?;
    let b = sum_away(cx, b, &b_drop)?;
    let shared: Vec<char> = a
        .letters
        .iter()
        .copied()
        .filter(|c| b.letters.contains(c))
        .collect();
    let batch: Vec<char> = shared
        .iter()
        .copied()
        .filter(|c| keep.contains(c))
        .collect();
    let contract: Vec<char> = shared
        .iter()
        .copied()
        .filter(|c| !keep.contains(c))
        .collect();
    let rows: Vec<char> = a
        .letters
        .iter()
        .copied()
        .filter(|c| !shared.contains(c))
        .collect();
    let cols: Vec<char> = b
        .letters
        .iter()
        .copied()
        .filter(|c| !shared.contains(c))
        .collect();
    let prod = |cs: &[char]| cs.iter().map(|&c| size_of(c)).product::<u64>();
    let (nb, m, k, nn) = (prod(&batch), prod(&rows), prod(&contract), prod(&cols));
    let av = arrange(
        cx,
        &a,
        &[batch.clone(), rows.clone(), contract.clone()].concat(),
    )?;
    let bv = arrange(
        cx,
        &b,
        &[batch.clone(), contract.clone(), cols.clone()].concat(),
    )?;
    let av = reshape(cx, av, &[nb, m, k])?;
    let bv = reshape(cx, bv, &[nb, k, nn])?;
    let p = cx.op1(OpKind::MatMul, &[av, bv])?;
    let letters: Vec<char> = [batch, rows, cols].concat();
    let dims: Vec<u64> = letters.iter().map(|&c| size_of(c)).collect();
    let v = reshape(cx, p, &dims)?;
    Ok(Term { v, letters })
}

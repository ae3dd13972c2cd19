//! Helpers shared by the integration tests that drive the `tcc` binary's code.

#![allow(dead_code)]

pub mod onnx;

use tcc::ir::random::{Rng, random_tensor};
use tcc::ir::{Data, Function, Tensor, interp};
use tcc::passes::grad::{GradOptions, Wrt, grad};

/// The elements of a float tensor as f64.
pub fn f64s(t: &Tensor) -> Vec<f64> {
    match t.data() {
        Data::F32(v) => v.iter().map(|&x| x as f64).collect(),
        Data::F64(v) => v.clone(),
        d => panic!("expected floats, found {:?}", d.dtype()),
    }
}

/// Runs the driver with `args` (without the program name) and `stdin`; returns the exit code,
/// stdout and stderr.
pub fn tcc_with(args: &[&str], stdin: &[u8]) -> (i32, String, String) {
    let args: Vec<String> = std::iter::once("tcc")
        .chain(args.iter().copied())
        .map(String::from)
        .collect();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = tcc_tools::run(&args, &mut &stdin[..], &mut out, &mut err);
    (
        code,
        String::from_utf8(out).unwrap(),
        String::from_utf8(err).unwrap(),
    )
}

/// [`tcc_with`] on an empty stdin.
pub fn tcc(args: &[&str]) -> (i32, String, String) {
    tcc_with(args, b"")
}

/// d/dp sum(results * seeds) from `grad` against central differences, for every element of
/// every parameter.
pub fn gradcheck(what: &str, f: &Function) {
    let mut g = f.clone();
    let opts = GradOptions {
        ys: f.results().iter().map(|&r| f.name(r).to_string()).collect(),
        wrt: Wrt::Params,
        grad_ys: true,
        ..GradOptions::default()
    };
    grad(&mut g, &opts).unwrap_or_else(|e| panic!("{what}: {e}"));
    let mut rng = Rng::new(11);
    let mut xs: Vec<Tensor> = f
        .params()
        .iter()
        .map(|&p| {
            let ty = f.ty(p).clone();
            let n = ty.numel() as usize;
            Tensor::new(
                ty,
                Data::F64((0..n).map(|_| rng.uniform(-0.6, 0.6)).collect()),
            )
            .unwrap()
        })
        .collect();
    let seeds: Vec<Tensor> = f
        .results()
        .iter()
        .map(|&r| {
            let ty = f.ty(r).clone();
            let n = ty.numel() as usize;
            Tensor::new(
                ty,
                Data::F64((0..n).map(|_| rng.uniform(-1.0, 1.0)).collect()),
            )
            .unwrap()
        })
        .collect();
    let loss = |xs: &[Tensor]| -> f64 {
        let ys = interp::run(f, xs).unwrap();
        ys.iter()
            .zip(&seeds)
            .map(|(y, s)| f64s(y).iter().zip(f64s(s)).map(|(a, b)| a * b).sum::<f64>())
            .sum()
    };
    let mut inputs = xs.clone();
    inputs.extend(seeds.iter().cloned());
    let out = interp::run(&g, &inputs).unwrap();
    let nres = f.results().len();
    let mut checked = 0;
    for pi in 0..xs.len() {
        let got = f64s(&out[nres + pi]);
        for (i, &gi) in got.iter().enumerate() {
            let h = 1e-6;
            let at = |xs: &mut Vec<Tensor>, d: f64| {
                let mut v = f64s(&xs[pi]);
                v[i] += d;
                xs[pi] = Tensor::new(xs[pi].ty().clone(), Data::F64(v)).unwrap();
            };
            at(&mut xs, h);
            let up = loss(&xs);
            at(&mut xs, -2.0 * h);
            let down = loss(&xs);
            at(&mut xs, h);
            let want = (up - down) / (2.0 * h);
            assert!(
                (gi - want).abs() <= 1e-6 * (1.0 + want.abs()),
                "{what}: d/d{}[{i}] is {gi}, finite differences give {want}",
                f.name(f.params()[pi])
            );
            checked += 1;
        }
    }
    assert!(checked > 0, "{what}: no parameter to check");
}

/// A random tensor for each parameter of `f`, from `seed`.
pub fn random_inputs(f: &Function, seed: u64) -> Vec<Tensor> {
    let mut rng = Rng::new(seed);
    f.params()
        .iter()
        .map(|&p| random_tensor(f.ty(p), &mut rng))
        .collect()
}

/// `n` residual blocks `x + relu(x W) V` on a `[batch, width]` input, named `%b{i}/...`, with
/// a mean as the loss.
pub fn residual_stack(n: usize, batch: u64, width: u64) -> String {
    let t = format!("f32[{batch},{width}]");
    let mut s = format!("func @res(%x: {t}");
    for i in 0..n {
        s += &format!(", %w{i}: f32[{width},{width}], %v{i}: f32[{width},{width}]");
    }
    s += ") -> (f32[]) {\n";
    let mut prev = "%x".to_string();
    for i in 0..n {
        s += &format!("  %b{i}/mm1 = matmul {prev}, %w{i} : {t}\n");
        s += &format!("  %b{i}/relu = relu %b{i}/mm1 : {t}\n");
        s += &format!("  %b{i}/mm2 = matmul %b{i}/relu, %v{i} : {t}\n");
        s += &format!("  %b{i}/out = add {prev}, %b{i}/mm2 : {t}\n");
        prev = format!("%b{i}/out");
    }
    s + &format!("  %loss = reduce_mean {prev} {{axes=[0,1]}} : f32[]\n  return %loss\n}}\n")
}

/// Rows `[lo, hi)` of `t` along axis 0, or with `keep = false`, every other row.
pub fn split_rows(t: &tcc::ir::Tensor, lo: usize, hi: usize, keep: bool) -> tcc::ir::Tensor {
    use tcc::ir::Data;
    let d = t.dims();
    let per: usize = d[1..].iter().product::<u64>() as usize;
    let pick = |n: usize| -> Vec<usize> {
        (0..n)
            .filter(|r| (lo..hi).contains(r) == keep)
            .flat_map(|r| r * per..(r + 1) * per)
            .collect()
    };
    let rows = pick(d[0] as usize);
    let data = match t.data() {
        Data::U8(v) => Data::U8(rows.iter().map(|&i| v[i]).collect()),
        Data::I32(v) => Data::I32(rows.iter().map(|&i| v[i]).collect()),
        other => panic!("the digits are u8 and i32, not {:?}", other.dtype()),
    };
    let mut dims = d.to_vec();
    dims[0] = (rows.len() / per) as u64;
    tcc::ir::Tensor::from_data(&dims, data).unwrap()
}

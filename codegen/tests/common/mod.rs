//! What the CPU runtime's tests share: comparing results with tolerances, compiling in
//! either layout, random inputs.

#![allow(dead_code)]

use tcc_codegen::Executable;
use tcc_ir::random::{Rng, random_tensor};
use tcc_ir::{Data, Function, Tensor};

/// A `u8` or `i8` tensor of `dims`: every element `fill` where given, else uniform over the
/// whole range of the type (the generator's random bytes stay small).
pub fn bytes(dt: tcc_ir::DType, dims: &[u64], fill: Option<i64>, seed: u64) -> Tensor {
    let mut rng = Rng::new(seed);
    let n: u64 = dims.iter().product();
    let signed = dt == tcc_ir::DType::I8;
    let mut value = || fill.unwrap_or_else(|| rng.below(256) as i64 - if signed { 128 } else { 0 });
    let data = if signed {
        Data::I8((0..n).map(|_| value() as i8).collect())
    } else {
        Data::U8((0..n).map(|_| value() as u8).collect())
    };
    Tensor::new(tcc_ir::TensorType::new(dt, dims.to_vec()).unwrap(), data).unwrap()
}

/// `|a - b| <= atol + rtol |b|`, NaN equal to NaN, infinities equal to themselves.
pub fn close(a: f64, b: f64, rtol: f64, atol: f64) -> bool {
    (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= atol + rtol * b.abs()
}

pub fn check(got: &[Tensor], want: &[Tensor], rtol: f64, atol: f64) -> Result<(), String> {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        if g.ty() != w.ty() {
            return Err(format!("result {i}: type {} vs {}", g.ty(), w.ty()));
        }
        let ok = match (g.data(), w.data()) {
            (Data::F32(p), Data::F32(q)) => p
                .iter()
                .zip(q)
                .position(|(&x, &y)| !close(x as f64, y as f64, rtol, atol)),
            (Data::F64(p), Data::F64(q)) => p
                .iter()
                .zip(q)
                .position(|(&x, &y)| !close(x, y, rtol, atol)),
            (p, q) => (p != q).then_some(0),
        };
        if let Some(at) = ok {
            return Err(format!(
                "result {i} differs at element {at}: got {:?}, want {:?}",
                g.data().get(at),
                w.data().get(at)
            ));
        }
    }
    Ok(())
}

/// `inputs` with every float element moved by a relative `2^-20` at most (seeded), integers
/// unchanged: a reference run on them measures how much each result amplifies small changes
/// (see [`check_conditioned`]).
pub fn perturbed(inputs: &[Tensor], seed: u64) -> Vec<Tensor> {
    let mut rng = Rng::new(seed);
    let mut nudge = |x: f64| x * (1.0 + rng.uniform(-1.0, 1.0) / (1u64 << 20) as f64);
    inputs
        .iter()
        .map(|t| {
            let data = match t.data() {
                Data::F32(v) => Data::F32(v.iter().map(|&x| nudge(x as f64) as f32).collect()),
                Data::F64(v) => Data::F64(v.iter().map(|&x| nudge(x)).collect()),
                d => d.clone(),
            };
            Tensor::new(t.ty().clone(), data).expect("the same type and length")
        })
        .collect()
}

/// [`check`] with each element's tolerance widened by `k` times how far the reference moved
/// when the inputs moved by a relative `2^-20` (`nudged`, the reference on [`perturbed`]
/// inputs): an f32 computation is only as close to the f64 reference as the result's
/// condition allows (a sum of products of 1e6 that cancels to 56 keeps four digits), and
/// inputs moved by 16 f32 ulps estimate that. Elements whose reference turns NaN or infinite
/// under the nudge are not compared.
pub fn check_conditioned(
    got: &[Tensor],
    want: &[Tensor],
    nudged: &[Tensor],
    (rtol, atol, k): (f64, f64, f64),
) -> Result<(), String> {
    for (i, ((g, w), n)) in got.iter().zip(want).zip(nudged).enumerate() {
        if g.ty() != w.ty() {
            return Err(format!("result {i}: type {} vs {}", g.ty(), w.ty()));
        }
        let floats = |t: &Tensor| -> Option<Vec<f64>> {
            match t.data() {
                Data::F32(v) => Some(v.iter().map(|&x| x as f64).collect()),
                Data::F64(v) => Some(v.clone()),
                _ => None,
            }
        };
        let (Some(p), Some(q), Some(r)) = (floats(g), floats(w), floats(n)) else {
            check(std::slice::from_ref(g), std::slice::from_ref(w), rtol, atol)
                .map_err(|e| format!("result {i}: {e}"))?;
            continue;
        };
        let bad = (p.iter().zip(&q).zip(&r)).position(|((&x, &y), &z)| {
            let unstable = z.is_finite() != y.is_finite() || z.is_nan() != y.is_nan();
            let spread = if y.is_finite() { (z - y).abs() } else { 0.0 };
            !unstable && !close(x, y, rtol, atol + k * spread)
        });
        if let Some(at) = bad {
            return Err(format!(
                "result {i} differs at element {at}: got {}, want {} (nudged {})",
                p[at], q[at], r[at]
            ));
        }
    }
    Ok(())
}

pub fn both(f: &Function, inputs: &[Tensor]) -> (Vec<Tensor>, Vec<Tensor>, Executable) {
    let exe = Executable::compile(f).unwrap();
    let got = exe.run(inputs).unwrap();
    let want = tcc_ir::interp::run(f, inputs).unwrap();
    (got, want, exe)
}

/// A target spec and the library kernels' width.
pub type Target = (Option<&'static str>, tcc_codegen::VectorWidth);

/// The host as the backend compiles for it by default.
pub const HOST: Target = (None, tcc_codegen::VectorWidth::Auto);

/// The targets every kernel path is tested on: the host with 512-bit library kernels where
/// it has AVX-512F and with 256-bit ones (whichever it would choose itself), without AVX-512
/// (the AVX2 paths an AVX2-only CPU runs), and without FMA.
pub const TARGETS: [Target; 4] = [
    (None, tcc_codegen::VectorWidth::W512),
    (None, tcc_codegen::VectorWidth::W256),
    (Some("host,-avx512f"), tcc_codegen::VectorWidth::Auto),
    (Some("host,-avx512f,-fma"), tcc_codegen::VectorWidth::Auto),
];

/// Compiles `f` for `target`, in the function's own layout (`plain`) or with convolutions on
/// channel-blocked tensors wherever the target has the kernels for them.
pub fn compile(f: &Function, (target, width): Target, plain: bool) -> Executable {
    let cpu = tcc_codegen::Cpu {
        target: target.map(str::to_string),
        profile: false,
        layout: if plain {
            tcc_codegen::Layout::Plain
        } else {
            tcc_codegen::Layout::Blocked
        },
        vector_width: width,
        link_bandwidth: None,
        copies: tcc_codegen::Copying::Auto,
    };
    tcc_codegen::compile(&cpu, f).unwrap_or_else(|e| panic!("{f}\n{e}"))
}

/// The layouts convolutions run in: im2col and GEMM on the function's own NCHW tensors, and the
/// direct kernels on channel-blocked ones (`conv2d_nchwc`).
pub const LAYOUTS: [bool; 2] = [true, false];

pub fn randoms(f: &Function, seed: u64) -> Vec<Tensor> {
    let mut rng = Rng::new(seed);
    f.params()
        .iter()
        .map(|&p| random_tensor(f.ty(p), &mut rng))
        .collect()
}

/// Whether `v` depends on a cast from a float type to an integer type.
pub fn after_truncation(f: &Function, v: tcc_ir::Value) -> bool {
    let mut tainted = std::collections::HashSet::new();
    for &op in f.schedule() {
        let d = f.op(op);
        let truncates = matches!(d.kind, tcc_ir::OpKind::Cast { to } if !to.is_float() && to != tcc_ir::DType::Bool)
            && f.ty(d.args[0]).dtype().is_float();
        if truncates || d.args.iter().any(|a| tainted.contains(a)) {
            tainted.extend(d.results.iter().copied());
        }
    }
    tainted.contains(&v)
}

//! What the CPU runtime's tests share: comparing results with tolerances, compiling in
//! either layout, random inputs.

#![allow(dead_code)]

use tcc_codegen::Executable;
use tcc_ir::random::{Rng, random_tensor};
use tcc_ir::{Data, Function, Tensor};

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

pub fn both(f: &Function, inputs: &[Tensor]) -> (Vec<Tensor>, Vec<Tensor>, Executable) {
    let exe = Executable::compile(f).unwrap();
    let got = exe.run(inputs).unwrap();
    let want = tcc_ir::interp::run(f, inputs).unwrap();
    (got, want, exe)
}

/// Compiles `f` for `target`, in the function's own layout (`plain`) or with convolutions on
/// channel-blocked tensors wherever the target has the kernels for them.
pub fn compile(f: &Function, target: Option<&str>, plain: bool) -> Executable {
    let cpu = tcc_codegen::Cpu {
        target: target.map(str::to_string),
        profile: false,
        layout: if plain {
            tcc_codegen::Layout::Plain
        } else {
            tcc_codegen::Layout::Blocked
        },
        ..Default::default()
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

//! Measuring the compiled elementwise functions against an f64 reference.

use super::{CompileError, Executable};
use tcc_ir::{Tensor, UnaryOp};

/// The largest error of the compiled unary `op` over `n >= 2` evenly spaced f32 inputs in
/// `[lo, hi]`, in units in the last place of the correctly rounded f32 result of `reference`.
/// This is how docs/perf.md's accuracy figures are measured (`cargo bench --bench cpu`).
pub fn max_ulp_error(
    op: UnaryOp,
    lo: f32,
    hi: f32,
    n: usize,
    reference: fn(f64) -> f64,
) -> Result<f64, CompileError> {
    let n = n.max(2);
    let xs: Vec<f32> = (0..n)
        .map(|i| lo + (hi - lo) * i as f32 / (n - 1) as f32)
        .collect();
    let src = format!(
        "func @f(%x: f32[{n}]) -> (f32[{n}]) {{\n  %y = {} %x : f32[{n}]\n  return %y\n}}",
        op.mnemonic()
    );
    let f = tcc_ir::parse_function(&src).map_err(|d| CompileError(d.to_string()))?;
    let exe = Executable::compile(&f)?;
    let input =
        Tensor::from_f32(&[n as u64], xs.clone()).map_err(|e| CompileError(e.to_string()))?;
    let out = exe.run(&[input]).map_err(|e| CompileError(e.0))?;
    let got = out[0].as_f32().expect("an f32 result");
    Ok(xs
        .iter()
        .zip(got)
        .map(|(&x, &y)| {
            let r = reference(x as f64);
            let r32 = (r as f32).abs();
            let ulp = (f32::from_bits(r32.to_bits() + 1) - r32) as f64;
            ((y as f64) - r).abs() / ulp
        })
        .fold(0.0, f64::max))
}

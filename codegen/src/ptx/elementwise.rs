//! Elementwise kernels: grid-stride loops, thread `t` of block `b` handling elements
//! `b * block + t`, then that plus the grid's size, and so on, each loading its operands as
//! their access patterns say, computing the kernel layer's body and storing the results; and
//! `pow` alone, over the shared `kernel::math::pow`.

use super::lower::{BLOCK, Ctx, Lowered, render};
use crate::kernel::expr::{self, Body, Lane};
use crate::kernel::lower::body as body_of;
use crate::plan::KernelData;
use tcc_ir::{DType, Function, Value};

/// Kernel `kd` of `f`, elementwise in `lane`, as a grid-stride loop named `name`: its
/// parameters are the addresses of its inputs, then of its outputs.
pub fn elementwise(
    f: &Function,
    kd: &KernelData,
    lane: Lane,
    name: String,
) -> Result<Lowered, String> {
    let body = body_of(lane, f, &kd.inputs, 0, &kd.ops, |_, _, _| {}, &kd.outputs);
    elementwise_body(f, kd, lane, &body, name)
}

/// A `pow` alone (f32, an exponent the kernel layer does not compute exactly, so the CPU runs
/// it on its reference kernels), as an elementwise loop over [`crate::kernel::math::pow`].
pub fn pow(f: &Function, kd: &KernelData, name: String) -> Result<Lowered, String> {
    let d = f.op(kd.ops[0]);
    let (x, y) = (d.args[0], d.args[1]);
    if (d.args.iter().chain(&d.results)).any(|&v| f.ty(v).dtype() != DType::F32) {
        return Err("only f32 pow has a GPU kernel".into());
    }
    let mut b = Body::new(Lane::F32);
    let args: Vec<expr::E> = kd.inputs.iter().map(|_| b.arg()).collect();
    let at = |v: Value| args[kd.inputs.iter().position(|&i| i == v).expect("an input")];
    let r = crate::kernel::math::pow(&mut b, at(x), at(y));
    b.results = vec![r];
    elementwise_body(f, kd, Lane::F32, &b, name)
}

/// Kernel `kd`'s loop over its output's elements computing `body` (arguments: the kernel's
/// inputs, results: its outputs).
fn elementwise_body(
    f: &Function,
    kd: &KernelData,
    lane: Lane,
    body: &Body,
    name: String,
) -> Result<Lowered, String> {
    let out_dims = f.ty(f.op(kd.ops[0]).results[0]).dims().to_vec();
    let n: u64 = out_dims.iter().product();
    let n_in = kd.inputs.len();
    let mut c = Ctx::new(name, (n_in + kd.outputs.len()) as u32, BLOCK, n);
    let params: Vec<usize> = (0..n_in).collect();
    let ops = c.operands(f, lane, &kd.inputs, &params, &out_dims)?;
    c.grid_stride(n, |c, i| {
        let args = c.load(&ops, i);
        let outs = render(&mut c.b, body, &args)?;
        c.store(f, body, &outs, &kd.outputs, n_in, i)
    })?;
    Ok(c.finish(n.div_ceil(BLOCK as u64)))
}

//! Elementwise kernels: grid-stride loops, thread `t` of block `b` handling elements
//! `b * block + t`, then that plus the grid's size, and so on, each loading its operands as
//! their access patterns say, computing the kernel layer's body and storing the results (four
//! elements a step, with 16-byte loads and stores, where the outputs are 32-bit); and `pow`
//! alone, over the shared `kernel::math::pow`.

use super::lower::{BLOCK, Ctx, Lowered, render};
use super::prog::{IOp, Reg};
use crate::kernel::expr::{self, Body, Class, Lane};
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
    let words = (kd.outputs.iter()).all(|&v| matches!(f.ty(v).dtype(), DType::F32 | DType::I32))
        && body.results.iter().all(|&r| body.class(r) == Class::Num);
    // Four elements a step where every output is 32-bit numbers, then the rest one at a time.
    let quads = if words { n / 4 } else { 0 };
    if quads > 0 {
        c.grid_stride(quads, |c, q| {
            let i = c.op_n(IOp::Mul, q, 4);
            let args = c.load4(&ops, i);
            let mut outs: [Vec<Reg>; 4] = Default::default();
            for (e, out) in outs.iter_mut().enumerate() {
                let lane_args: Vec<Reg> = args.iter().map(|a| a[e]).collect();
                *out = render(&mut c.b, body, &lane_args)?;
            }
            c.store4(&outs, kd.outputs.len(), n_in, i);
            Ok(())
        })?;
    }
    if quads * 4 < n {
        c.grid_stride_from(quads * 4, n, |c, i| {
            let args = c.load(&ops, i);
            let outs = render(&mut c.b, body, &args)?;
            c.store(f, body, &outs, &kd.outputs, n_in, i)
        })?;
    }
    Ok(c.finish(quads.max(n - quads * 4).div_ceil(BLOCK as u64)))
}

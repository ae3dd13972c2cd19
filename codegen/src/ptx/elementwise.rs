//! Elementwise kernels: grid-stride loops, thread `t` of block `b` handling elements
//! `b * block + t`, then that plus the grid's size, and so on, each loading its operands as
//! their access patterns say, computing the kernel layer's body and storing the results (four
//! elements a step, with 16-byte loads and stores, where the outputs are 32-bit); and `pow`
//! alone, over the shared `kernel::math::pow`.

use super::lower::{BLOCK, Ctx, Lowered, render};
use super::prog::{Cmp, CmpTy, Cvt, FOp, FUn, IOp, Inst, Mem, Reg, RegTy, Space};
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

/// A `quantize_linear` or `dequantize_linear` alone (f32 or f64 scales, u8 or i8 values; the
/// kernel layer keeps one dtype family per kernel, and these cross from floats to bytes), as a
/// grid-stride loop computing what the interpreter does: `x / scale` divided in the scale's
/// type, rounded half to even, plus the zero point, saturated (NaN: the zero point); or
/// `(q - zero)` converted to the scale's type times the scale.
pub fn quantize_linear(f: &Function, kd: &KernelData, name: String) -> Result<Lowered, String> {
    let d = f.op(kd.ops[0]);
    let quantize = matches!(d.kind, tcc_ir::OpKind::QuantizeLinear);
    let (x, y) = (d.args[0], d.results[0]);
    let bytes = |v: Value| matches!(f.ty(v).dtype(), DType::U8 | DType::I8);
    let (lane, fty, fmem) = match f.ty(d.args[1]).dtype() {
        DType::F32 => (Lane::F32, RegTy::F32, Mem::B32),
        DType::F64 => (Lane::F64, RegTy::F64, Mem::B64),
        _ => return Err("a scale that is not a float".into()),
    };
    if !bytes(d.args[2]) || !(bytes(x) || quantize) {
        return Err("only u8 and i8 values have a GPU kernel".into());
    }
    let out_dims = f.ty(y).dims().to_vec();
    let n: u64 = out_dims.iter().product();
    let n_in = kd.inputs.len();
    let mut c = Ctx::new(name, (n_in + kd.outputs.len()) as u32, BLOCK, n);
    let params: Vec<usize> = (d.args.iter())
        .map(|v| kd.inputs.iter().position(|x| x == v).expect("an input"))
        .collect();
    let ops = c.operands(f, lane, &d.args, &params, &out_dims)?;
    let out = n_in
        + kd.outputs
            .iter()
            .position(|&v| v == y)
            .ok_or("not stored")?;
    // The quantized range.
    let (lo, hi) = if f.ty(y).dtype() == DType::U8 {
        (0.0, 255.0)
    } else {
        (-128.0, 127.0)
    };
    let number = |x: f64| {
        if fty == RegTy::F32 {
            (x as f32).to_bits() as u64
        } else {
            x.to_bits()
        }
    };
    c.grid_stride(n, |c, o| {
        let a = c.load(&ops, o);
        let (v, s, z) = (a[0], a[1], a[2]);
        let (value, mem) = if quantize {
            let q = c.b.fbin(FOp::Div, v, s);
            let r = c.b.fun(FUn::Rni, q);
            let zf = c.b.cvt(Cvt::S32ToFloat, fty, z);
            let level = c.b.fbin(FOp::Add, r, zf);
            let (lo, hi) = (c.b.imm(fty, number(lo)), c.b.imm(fty, number(hi)));
            let level = c.b.fbin(FOp::Max, level, lo);
            let level = c.b.fbin(FOp::Min, level, hi);
            let int = c.b.cvt(Cvt::FloatToS32, RegTy::I32, level);
            let nan = c.b.setp(CmpTy::Float, Cmp::Nan, q, q);
            (c.b.selp(z, int, nan), Mem::U8)
        } else {
            let diff = c.b.ibin(IOp::Sub, v, z);
            let df = c.b.cvt(Cvt::S32ToFloat, fty, diff);
            (c.b.fbin(FOp::Mul, df, s), fmem)
        };
        let addr = c.address(c.bases[out], o, mem);
        c.b.push(Inst::St(Space::Global, mem, addr, value));
        Ok(())
    })?;
    Ok(c.finish(n.div_ceil(BLOCK as u64)))
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

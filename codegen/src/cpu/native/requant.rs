//! The requantizing epilogue of `conv_integer`: what a quantized convolution does with its i32
//! sums before the next layer reads them. In the IR it is a chain of ops (the `qdq` pass and
//! ONNX's QLinearConv write it so): `cast` to f32, a multiply by the scales (one, or one per
//! output channel), an add of the bias (the same forms), on the VNNI and AMX convolution an add
//! of a residual tensor of the result's shape computed before the convolution, `relu`, a `max`
//! and then a `min` with scalars (ONNX's Clip: relu6), and `quantize_linear` with one scale and
//! zero point. The CPU
//! backend merges such a chain into the convolution's step ([`Requant::of`] decides, for
//! `Cpu::fuse` and for lowering alike), and the kernel applies it as it stores each vector of
//! sums: one pass, the i32 and f32 tensors between never written.
//!
//! Every step is the interpreter's, in the same order and in f32 (float scales, not a
//! fixed-point multiplier and shift: bit-identical to the unfused ops, which a fixed-point
//! form is not, at no cost that shows next to the products): the sum converted to f32 rounding
//! to nearest, times the scale, plus the bias, `relu` (NaN stays NaN, -0 becomes +0), `max`
//! and `min` (NaN if either operand is, else the first operand where the comparison of the
//! first with the second holds, which decides between zeros of both signs), then the quotient
//! by the output scale rounded half to even, the zero point added, the level saturated (NaN:
//! the zero point).

use crate::plan::{Kernel, KernelKind};
use tcc_ir::edit::Users;
use tcc_ir::{BinaryOp, DType, Function, Op, OpKind, UnaryOp, Value};

/// An f32 operand of the chain: one value for the tensor, or one per output channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Operand {
    pub value: Value,
    pub per_channel: bool,
}

/// A `max` or `min` of the chain's value with a scalar (ONNX's Clip, relu6): the scalar, and
/// whether the chain's value is the op's first operand (which decides between zeros of both
/// signs: `max(a, b)` is `a >= b ? a : b`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Clamp {
    pub value: Value,
    pub chain_first: bool,
}

/// A recognised chain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Requant {
    /// The chain's ops, in order.
    pub ops: Vec<Op>,
    pub scale: Option<Operand>,
    pub bias: Option<Operand>,
    /// An add of a full f32 tensor of the result's shape after the bias (a residual
    /// connection), where the caller allows one.
    pub residual: Option<Value>,
    pub relu: bool,
    /// A `max` with a scalar, then a `min` with one.
    pub lower: Option<Clamp>,
    pub upper: Option<Clamp>,
    /// `quantize_linear`'s scale and zero point (one each), and whether its levels are i8.
    pub quantize: Option<(Value, Value, bool)>,
    /// What the step stores: the levels, or the f32 result of the chain.
    pub out: Value,
}

impl Requant {
    /// The chain `ops` reading `conv_integer`'s result `r` (`[N, O, H, W]`), if it is one: a
    /// `cast` to f32 of `r`, then optionally a multiply, an add, a `relu`, a `max` and a `min`
    /// with scalars, and a `quantize_linear`, in that order, each value but the last used only
    /// by the next op, each other operand a constant or a parameter (so the step may run where
    /// the convolution does). Every op of `ops` must be in the chain. After the bias an add of
    /// a full tensor of the result's shape may follow where `residual` accepts its value (one
    /// computed before the convolution, for a kernel that reads it).
    pub(crate) fn of(
        f: &Function,
        users: &Users,
        r: Value,
        ops: &[Op],
        residual: &dyn Fn(Value) -> bool,
    ) -> Option<Requant> {
        let dims = f.ty(r).dims().to_vec();
        let only_next = |v: Value, next: Op| {
            !users.is_returned(v) && matches!(users.uses(v)[..], [(u, _)] if u == next)
        };
        let fixed = |v: Value| {
            f.def_op(v)
                .is_none_or(|op| matches!(f.op(op).kind, OpKind::Const { .. }))
        };
        let operand = |v: Value| -> Option<Operand> {
            let ty = f.ty(v);
            if ty.dtype() != DType::F32 || !fixed(v) {
                return None;
            }
            if ty.numel() == 1 {
                return Some(Operand {
                    value: v,
                    per_channel: false,
                });
            }
            // `[.., O, 1, 1]` with ones before: one per output channel.
            let vd = ty.dims();
            let per_channel = vd.len() >= 3
                && vd.len() <= 4
                && vd[vd.len() - 3] == dims[1]
                && vd[vd.len() - 2..] == [1, 1]
                && vd[..vd.len() - 3].iter().all(|&d| d == 1);
            per_channel.then_some(Operand {
                value: v,
                per_channel: true,
            })
        };
        let (&first, rest) = ops.split_first()?;
        let d = f.op(first);
        if !matches!(d.kind, OpKind::Cast { to: DType::F32 })
            || d.args[0] != r
            || !only_next(r, first)
        {
            return None;
        }
        let mut chain = Requant {
            ops: vec![first],
            scale: None,
            bias: None,
            residual: None,
            relu: false,
            lower: None,
            upper: None,
            quantize: None,
            out: d.results[0],
        };
        let clamp = |v: Value, chain_first: bool| {
            let ty = f.ty(v);
            (ty.dtype() == DType::F32 && ty.numel() == 1 && fixed(v)).then_some(Clamp {
                value: v,
                chain_first,
            })
        };
        // 0: after the cast; 1: after the scale; 2: after the bias; 3: after relu; 4: after
        // the max; 5: after the min; 6: quantized.
        let mut stage = 0;
        for &op in rest {
            let d = f.op(op);
            let cur = chain.out;
            if !only_next(cur, op) || f.ty(d.results[0]).dims() != &dims[..] {
                return None;
            }
            let other = || -> Option<Value> {
                match d.args[..] {
                    [a, b] if a == cur && b != cur => Some(b),
                    [a, b] if b == cur && a != cur => Some(a),
                    _ => None,
                }
            };
            match d.kind {
                OpKind::Binary(BinaryOp::Mul) if stage < 1 => {
                    chain.scale = Some(operand(other()?)?);
                    stage = 1;
                }
                // The bias (one value, or one per channel), or after it a residual.
                OpKind::Binary(BinaryOp::Add) if stage <= 2 => {
                    let v = other()?;
                    match operand(v) {
                        Some(bias) if stage < 2 => chain.bias = Some(bias),
                        _ => {
                            let full = f.ty(v).dtype() == DType::F32 && f.ty(v).dims() == &dims[..];
                            if !full || chain.residual.is_some() || !residual(v) {
                                return None;
                            }
                            chain.residual = Some(v);
                        }
                    }
                    stage = 2;
                }
                OpKind::Unary(UnaryOp::Relu) if stage < 3 => {
                    chain.relu = true;
                    stage = 3;
                }
                OpKind::Binary(BinaryOp::Max) if stage < 4 => {
                    chain.lower = Some(clamp(other()?, d.args[0] == cur)?);
                    stage = 4;
                }
                OpKind::Binary(BinaryOp::Min) if stage < 5 => {
                    chain.upper = Some(clamp(other()?, d.args[0] == cur)?);
                    stage = 5;
                }
                OpKind::QuantizeLinear if stage < 6 && d.args[0] == cur => {
                    let (s, z) = (d.args[1], d.args[2]);
                    let one = |v: Value| f.ty(v).numel() == 1 && fixed(v);
                    if !(one(s) && one(z) && f.ty(s).dtype() == DType::F32) {
                        return None;
                    }
                    chain.quantize = Some((s, z, f.ty(d.results[0]).dtype() == DType::I8));
                    stage = 6;
                }
                _ => return None,
            }
            chain.ops.push(op);
            chain.out = d.results[0];
        }
        Some(chain)
    }
}

/// A chain's operands for one run.
pub(crate) struct Bound<'a> {
    pub scale: Option<&'a [f32]>,
    pub bias: Option<&'a [f32]>,
    /// The residual tensor, all of it (only the VNNI and AMX convolution reads one: its plain
    /// stores take the vectors whose results are finite, the exact path the others).
    pub residual: Option<&'a [f32]>,
    pub relu: bool,
    /// The `max` and `min` scalars, each with whether the chain's value is the first operand.
    pub lower: Option<(f32, bool)>,
    pub upper: Option<(f32, bool)>,
    /// The output scale and zero point, and whether the levels are i8.
    pub quantize: Option<(f32, i32, bool)>,
    /// [`Bound::plain_reciprocal`], found once per run.
    pub plain: Option<f32>,
}

impl Bound<'_> {
    /// Whether the chain quantizes and its operands (scales, bias, clamps) are all finite: then
    /// it never makes NaN, and the sign of a zero (which `max` and `min` decide by operand
    /// order) is lost in the quantization, so plain vector maxima, minima and integer
    /// saturation give the interpreter's levels ([`Bound::store16`]). Then the reciprocal of
    /// the quantization's scale, which the quotient multiplies by.
    pub(crate) fn plain_reciprocal(&self) -> Option<f32> {
        let finite = |v: Option<&[f32]>| v.is_none_or(|v| v.iter().all(|x| x.is_finite()));
        let clamp = |c: Option<(f32, bool)>| c.is_none_or(|(c, _)| c.is_finite());
        let (s, _, _) = self.quantize?;
        // A residual tensor may hold NaN or infinities: the kernel that adds one checks each
        // vector (`Finish::plain_rows` in vnni_conv.rs), storing those that are not finite
        // through the exact path.
        let plain =
            finite(self.scale) && finite(self.bias) && clamp(self.lower) && clamp(self.upper);
        plain.then_some(1.0 / s)
    }
}

/// The interpreter's `max(a, b)` in f32: NaN if either is, else `a >= b ? a : b`.
fn max(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else if a >= b {
        a
    } else {
        b
    }
}

/// The interpreter's `min(a, b)` in f32: NaN if either is, else `a <= b ? a : b`.
fn min(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else if a <= b {
        a
    } else {
        b
    }
}

impl Bound<'_> {
    /// Applies the chain to the sums `acc` of output channel `o`, writing `out` (levels, or
    /// f32 bytes when the chain does not quantize), element `i` at `out + i * size`; `real`
    /// holds the f32 results before quantizing. With `avx2` (the target has it) the steps run
    /// as AVX2 vectors, each over the whole row in turn: the same operations per element.
    ///
    /// # Safety
    /// `out` has room for `acc.len()` elements of the output's type; `avx2` only where the CPU
    /// has it.
    pub(crate) unsafe fn row(
        &self,
        acc: &[i32],
        o: usize,
        out: *mut u8,
        real: &mut Vec<f32>,
        avx2: bool,
    ) {
        #[cfg(target_arch = "x86_64")]
        if avx2 {
            // SAFETY: the caller's contract.
            unsafe { self.reals_avx2(acc, o, real) };
        } else {
            self.reals(acc, o, real);
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = avx2;
            self.reals(acc, o, real);
        }
        match self.quantize {
            Some((s, z, signed)) => {
                // SAFETY: the caller's contract: `acc.len()` bytes.
                let out = unsafe { std::slice::from_raw_parts_mut(out, acc.len()) };
                #[cfg(target_arch = "x86_64")]
                if avx2 {
                    // SAFETY: the caller's contract.
                    unsafe { super::quant::quantize_avx2(real, s, z, signed, out) };
                    return;
                }
                super::quant::quantize_run(real, s, z, signed, out);
            }
            // SAFETY: the caller's contract: room for `acc.len()` f32s (maybe unaligned).
            None => unsafe {
                std::ptr::copy_nonoverlapping(real.as_ptr() as *const u8, out, 4 * real.len())
            },
        }
    }

    /// [`Bound::reals`] compiled for AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn reals_avx2(&self, acc: &[i32], o: usize, real: &mut Vec<f32>) {
        self.reals(acc, o, real)
    }

    /// The chain's f32 results for the sums `acc` of output channel `o` into `real`, before
    /// quantizing: the interpreter's steps in its order (module docs), each a pass over the
    /// row (loops the compiler turns into vectors).
    #[inline(always)]
    fn reals(&self, acc: &[i32], o: usize, real: &mut Vec<f32>) {
        let at = |v: &[f32]| v[if v.len() == 1 { 0 } else { o }];
        real.clear();
        real.extend(acc.iter().map(|&a| a as f32));
        if let Some(s) = self.scale.map(at) {
            real.iter_mut().for_each(|y| *y *= s);
        }
        if let Some(b) = self.bias.map(at) {
            real.iter_mut().for_each(|y| *y += b);
        }
        if self.relu {
            for y in real.iter_mut() {
                if !(*y > 0.0 || y.is_nan()) {
                    *y = 0.0;
                }
            }
        }
        if let Some((c, first)) = self.lower {
            for y in real.iter_mut() {
                *y = if first { max(*y, c) } else { max(c, *y) };
            }
        }
        if let Some((c, first)) = self.upper {
            for y in real.iter_mut() {
                *y = if first { min(*y, c) } else { min(c, *y) };
            }
        }
    }

    /// [`Bound::row`] for sixteen sums of output channel `o`, the lanes of `mask`, on AVX-512:
    /// the same steps.
    ///
    /// # Safety
    /// AVX-512F, BW and VL; `out` has room for the lanes of `mask`.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq")]
    pub(crate) unsafe fn store16(
        &self,
        acc: std::arch::x86_64::__m512i,
        o: usize,
        mask: u16,
        out: *mut u8,
    ) {
        // SAFETY: as this function's contract.
        unsafe { self.store16_with(acc, o, mask, out, None) }
    }

    /// [`Bound::store16`] with the residual's sixteen elements for these outputs (its lanes
    /// outside `mask` anything), added after the bias.
    ///
    /// # Safety
    /// As [`Bound::store16`]; `residual` is given where the chain has one.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq")]
    pub(crate) unsafe fn store16_with(
        &self,
        acc: std::arch::x86_64::__m512i,
        o: usize,
        mask: u16,
        out: *mut u8,
        residual: Option<std::arch::x86_64::__m512>,
    ) {
        use std::arch::x86_64::*;
        let at = |v: &[f32]| _mm512_set1_ps(v[if v.len() == 1 { 0 } else { o }]);
        let mut y = _mm512_cvtepi32_ps(acc);
        if let Some(s) = self.scale {
            y = _mm512_mul_ps(y, at(s));
        }
        if let Some(b) = self.bias {
            y = _mm512_add_ps(y, at(b));
        }
        if let Some(r) = residual {
            y = _mm512_add_ps(y, r);
        }
        // With a residual, whose elements may be NaN or infinite, the exact steps.
        if let (Some(inv), Some((s, z, signed)), None) = (self.plain, self.quantize, residual) {
            // Without NaN and with the zeros' signs lost: plain clamps, the quotient rounded
            // half to even by the conversion, the zero point added and the level saturated by
            // the narrowing store.
            if self.relu {
                y = _mm512_max_ps(y, _mm512_setzero_ps());
            }
            if let Some((c, _)) = self.lower {
                y = _mm512_max_ps(y, _mm512_set1_ps(c));
            }
            if let Some((c, _)) = self.upper {
                y = _mm512_min_ps(y, _mm512_set1_ps(c));
            }
            // SAFETY: AVX-512F, as this function's contract.
            let q = unsafe { super::quant::quotient16(y, s, inv) };
            let bound = _mm512_set1_ps(1024.0);
            let c = _mm512_min_ps(
                _mm512_max_ps(q, _mm512_sub_ps(_mm512_setzero_ps(), bound)),
                bound,
            );
            let r =
                _mm512_cvt_roundps_epi32::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(c);
            let level = _mm512_add_epi32(r, _mm512_set1_epi32(z));
            // SAFETY: the caller's contract.
            unsafe {
                if signed {
                    _mm512_mask_cvtsepi32_storeu_epi8(out as *mut i8, mask, level);
                } else {
                    let level = _mm512_max_epi32(level, _mm512_setzero_si512());
                    _mm512_mask_cvtusepi32_storeu_epi8(out as *mut i8, mask, level);
                }
            }
            return;
        }
        if self.relu {
            // `maxps` gives its second operand for NaN and for two zeros: NaN lanes put back.
            let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(y, y);
            y = _mm512_mask_blend_ps(nan, _mm512_max_ps(y, _mm512_setzero_ps()), y);
        }
        // `max` and `min` with a scalar as the interpreter's: the chain's value or the scalar
        // by the ordered comparison of the first operand with the second, NaN where either is.
        for (clamp, is_max) in [(self.lower, true), (self.upper, false)] {
            let Some((c, first)) = clamp else { continue };
            let vc = _mm512_set1_ps(c);
            // Where the result is the chain's value: `y >= c` for max(y, c), `c >= y` for
            // max(c, y) is the scalar instead; likewise with `<=` for min.
            let (ge, le) = (
                _mm512_cmp_ps_mask::<_CMP_GE_OQ>(y, vc),
                _mm512_cmp_ps_mask::<_CMP_LE_OQ>(y, vc),
            );
            let picked = match (is_max, first) {
                (true, true) => _mm512_mask_blend_ps(ge, vc, y),
                (true, false) => _mm512_mask_blend_ps(le, y, vc),
                (false, true) => _mm512_mask_blend_ps(le, vc, y),
                (false, false) => _mm512_mask_blend_ps(ge, y, vc),
            };
            let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(y, vc);
            y = _mm512_mask_blend_ps(nan, picked, _mm512_set1_ps(f32::NAN));
        }
        let Some((s, z, signed)) = self.quantize else {
            // SAFETY: the caller's contract.
            unsafe { _mm512_mask_storeu_ps(out as *mut f32, mask, y) };
            return;
        };
        let (lo, hi) = if signed {
            (-128.0, 127.0)
        } else {
            (0.0, 255.0)
        };
        let round = _mm512_set1_ps(super::quant::ROUND);
        let vz = _mm512_set1_ps(z as f32);
        // SAFETY: AVX-512F, as this function's contract.
        let q = unsafe { super::quant::quotient16(y, s, 1.0 / s) };
        let c = _mm512_min_ps(
            _mm512_max_ps(q, _mm512_set1_ps(-1024.0)),
            _mm512_set1_ps(1024.0),
        );
        let r = _mm512_sub_ps(_mm512_add_ps(c, round), round);
        let level = _mm512_min_ps(
            _mm512_max_ps(_mm512_add_ps(r, vz), _mm512_set1_ps(lo)),
            _mm512_set1_ps(hi),
        );
        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(q, q);
        let level = _mm512_cvtps_epi32(_mm512_mask_blend_ps(nan, level, vz));
        // SAFETY: the caller's contract; levels are in range, so truncating keeps them.
        unsafe { _mm512_mask_cvtepi32_storeu_epi8(out as *mut i8, mask, level) };
    }
}

/// For `Cpu::fuse`: each `conv_integer` kernel of `plan` whose result's chain is one
/// [`Requant::of`] accepts, with the kernels that hold the chain (its elementwise kernel, and
/// the `quantize_linear` after it when that joins too), as `(from, into)` moves for
/// [`crate::plan::Plan::moved`].
pub(crate) fn moves(
    f: &Function,
    users: &Users,
    plan: &crate::plan::Plan,
    vnni: bool,
) -> Vec<(Kernel, Kernel)> {
    let mut moves = Vec::new();
    for (k0, kd) in plan.kernels.iter() {
        let &[op] = &kd.ops[..] else { continue };
        if kd.kind != KernelKind::Generic || !matches!(f.op(op).kind, OpKind::ConvInteger(_)) {
            continue;
        }
        let r = f.op(op).results[0];
        let &[(cast, _)] = users.uses(r) else {
            continue;
        };
        let Some(k1) = plan.kernel_of[cast] else {
            continue;
        };
        let chain = &plan.kernels[k1];
        if chain.kind != KernelKind::Elementwise || chain.ops.first() != Some(&cast) {
            continue;
        }
        let last = *chain.ops.last().expect("a kernel has ops");
        let quantized = match users.uses(f.op(last).results[0]) {
            &[(q, 0)] if matches!(f.op(q).kind, OpKind::QuantizeLinear) => plan.kernel_of[q]
                .filter(|&k2| plan.kernels[k2].ops == [q])
                .map(|k2| (q, k2)),
            _ => None,
        };
        // A residual: on the VNNI and AMX convolution (not grouped), computed by an earlier
        // kernel (or given), so that it is there when the merged step runs.
        let grouped = matches!(&f.op(op).kind, OpKind::ConvInteger(c) if c.groups != 1);
        let residual = |v: Value| {
            vnni && !grouped
                && f.def_op(v)
                    .is_none_or(|p| plan.kernel_of[p].is_some_and(|k| k < k0))
        };
        if let Some((q, k2)) = quantized {
            let mut ops = chain.ops.clone();
            ops.push(q);
            if Requant::of(f, users, r, &ops, &residual).is_some() {
                moves.extend([(k1, k0), (k2, k0)]);
                continue;
            }
        }
        if Requant::of(f, users, r, &chain.ops, &residual).is_some() {
            moves.push((k1, k0));
        }
    }
    moves
}

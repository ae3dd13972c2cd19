//! Epilogues a kernel applies in registers as it stores its output, instead of a second pass
//! over it: the bias add, scale, residual add, clamps (relu, relu6), sigmoid, SiLU and GELU that
//! follow a convolution or a fully connected layer. A library kernel's epilogue that is such a
//! chain ([`Post::of`]) runs this way; any other runs as a compiled elementwise loop on the
//! finished pieces.
//!
//! Two layouts: a channel-blocked output (`[N, Cb, ..., 8]`, a convolution's), whose kernel
//! hands its vectors of eight channels, with their channels and element offsets, to
//! [`Bound::store`]; and a row-major one whose last axis is the channel (`[.., N]`, a matmul's),
//! which [`Bound::rows`] transforms in place as the product's rows become final. The commonest
//! chains ([`Fast`]) each have a store loop of their own; any other goes through
//! [`Bound::apply`], step by step over the vectors, before they are stored. A kernel's register
//! tile stores through [`Bound::store_tile`] (eight lanes) or [`Bound::store_tile512`]
//! (sixteen), and with AVX-512F the general store computes SiLU sixteen lanes at a time: the
//! same steps, so the same bits, on every path.
//!
//! This file says what an epilogue is (its ops, the common forms, its operands bound for a
//! run); `store.rs` holds the loops that apply it as vectors are stored.

mod store;
#[cfg(test)]
mod tests;

use super::send_ptr::SendPtr;
use tcc_ir::{BinaryOp, Function, Op, OpKind, UnaryOp, Value};

/// Channels per block: the lanes of one vector.
const B: usize = 8;

/// Pixels of the largest register tile [`Bound::store_tile`] stores, two blocks each (the
/// 512-bit direct kernel's tiles of seven, stored pair by pair).
const P_MAX: usize = 8;

/// One step of an epilogue, applied to each stored vector.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum PostOp {
    /// Plus (or times, with `mul`) operand `operand`, constant over the batch and the spatial
    /// axes: one vector per block, `[1, Cb, 1, .., 8]`.
    Channel {
        mul: bool,
        operand: usize,
    },
    /// Plus operand `operand`, of the output's type (a residual).
    Tensor {
        operand: usize,
    },
    /// `max(x, c)`, `min(x, c)` with NaN winning, as the interpreter's `max` and `min`.
    Max(f32),
    Min(f32),
    /// `relu`: NaN stays NaN.
    Relu,
    /// `sigmoid`, as the compiled kernels compute it ([`crate::cpu::simd::sigmoid`]).
    Sigmoid,
    /// `x * sigmoid(x)` (SiLU).
    Silu,
    /// `gelu`, as the compiled kernels compute it ([`crate::cpu::simd::gelu`]).
    Gelu,
    /// `(x * (erf(x / div) + one)) * half`: GELU as PyTorch exports it (`Div`, `Erf`, `Add`,
    /// `Mul`, `Mul`), each step as the compiled kernels compute it.
    GeluErf {
        div: f32,
        one: f32,
        half: f32,
    },
}

/// How a library kernel lays out the output an epilogue applies to.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Layout {
    /// Channel-blocked, `[N, Cb, .., 8]`: a per-channel operand is `[1, Cb, 1, .., 8]`.
    Blocked,
    /// Row-major with the channel last, `[.., C]`: a per-channel operand is `[.., 1, C]`.
    Rows,
}

/// An epilogue as post-ops, with the values its steps read and the value it produces.
#[derive(Clone, Debug, Default)]
pub(crate) struct Post {
    pub ops: Vec<PostOp>,
    pub operands: Vec<Value>,
    /// Whether the CPU has AVX-512F: [`Bound::store`] then computes SiLU on sixteen lanes.
    pub avx512: bool,
}

impl Post {
    /// The epilogue `ops` of a library kernel whose call produces the f32 `r` in `layout`
    /// (blocked: in blocks of eight channels), as post-ops, if every op is one and `outputs`
    /// (what the kernel stores) is the chain's last value alone; that value is returned with
    /// it.
    pub(crate) fn of(
        f: &Function,
        layout: Layout,
        ops: &[Op],
        r: Value,
        outputs: &[Value],
    ) -> Option<(Post, Value)> {
        let ty = f.ty(r);
        let d = ty.dims();
        if ty.dtype() != tcc_ir::DType::F32 {
            return None;
        }
        let per_channel: &dyn Fn(Value) -> bool = match layout {
            Layout::Blocked => {
                if d.len() < 3 || d[d.len() - 1] != B as u64 {
                    return None;
                }
                &|v: Value| {
                    let vd = f.ty(v).dims();
                    vd.len() <= d.len()
                        && vd.len() >= 2
                        && vd[vd.len() - 1] == B as u64
                        && vd[..vd.len() - 1].iter().rev().enumerate().all(|(i, &n)| {
                            // From the end: spatial axes 1, the block axis Cb, the batch
                            // axis 1.
                            let axis = d.len() - 2 - i;
                            n == if axis == 1 { d[1] } else { 1 }
                        })
                }
            }
            Layout::Rows => {
                let &channels = d.last()?;
                &move |v: Value| {
                    let vd = f.ty(v).dims();
                    vd.len() <= d.len()
                        && vd.last() == Some(&channels)
                        && vd[..vd.len() - 1].iter().all(|&n| n == 1)
                }
            }
        };
        let scalar = |v: Value| -> Option<f32> {
            let op = f.def_op(v)?;
            (f.ty(v).numel() == 1).then_some(())?;
            let c = f.op(op).kind.splat_value()?.to_f64() as f32;
            // A NaN bound would take `maxps`' other operand; the interpreter gives NaN.
            (!c.is_nan()).then_some(c)
        };
        let mut post = Post::default();
        // The values the chain computes: never an operand read from memory (they are not
        // stored).
        let mut chain = vec![r];
        let mut cur = r;
        let mut i = 0;
        while i < ops.len() {
            let od = f.op(ops[i]);
            if f.ty(od.results[0]) != ty || !od.deps.is_empty() {
                return None;
            }
            let other = match *od.args.as_slice() {
                [a] if a == cur => None,
                [a, b] if a == cur && !chain.contains(&b) => Some(b),
                [a, b] if b == cur && !chain.contains(&a) => Some(a),
                _ => return None,
            };
            let mut operand = |v: Value| {
                post.operands.push(v);
                post.operands.len() - 1
            };
            let step = match (&od.kind, other) {
                (OpKind::Unary(UnaryOp::Relu), None) => PostOp::Relu,
                (OpKind::Unary(UnaryOp::Sigmoid), None) => {
                    // x * sigmoid(x) (SiLU, swish) when the next op multiplies the two.
                    let s = od.results[0];
                    let silu = ops.get(i + 1).map(|&n| f.op(n)).filter(|n| {
                        matches!(n.kind, OpKind::Binary(BinaryOp::Mul))
                            && n.deps.is_empty()
                            && (n.args == [cur, s] || n.args == [s, cur])
                    });
                    match silu {
                        Some(n) => {
                            chain.push(s);
                            i += 1;
                            post.ops.push(PostOp::Silu);
                            cur = n.results[0];
                            chain.push(cur);
                            i += 1;
                            continue;
                        }
                        None => PostOp::Sigmoid,
                    }
                }
                (OpKind::Unary(UnaryOp::Gelu), None) => PostOp::Gelu,
                (OpKind::Binary(BinaryOp::Div), Some(c)) if od.args[0] == cur => {
                    let (step, taken) = match_gelu_erf(f, &ops[i..], cur, scalar(c)?, &scalar)?;
                    // The chain's values are computed, not stored.
                    chain.extend(taken);
                    post.ops.push(step);
                    cur = taken[4];
                    i += taken.len();
                    continue;
                }
                (OpKind::Binary(BinaryOp::Max), Some(o)) => PostOp::Max(scalar(o)?),
                (OpKind::Binary(BinaryOp::Min), Some(o)) => PostOp::Min(scalar(o)?),
                (OpKind::Binary(BinaryOp::Add), Some(o)) if f.ty(o) == ty => PostOp::Tensor {
                    operand: operand(o),
                },
                (OpKind::Binary(op @ (BinaryOp::Add | BinaryOp::Mul)), Some(o))
                    if per_channel(o) =>
                {
                    PostOp::Channel {
                        mul: *op == BinaryOp::Mul,
                        operand: operand(o),
                    }
                }
                _ => return None,
            };
            post.ops.push(step);
            cur = od.results[0];
            chain.push(cur);
            i += 1;
        }
        (outputs == [cur]).then_some((post, cur))
    }

    /// The epilogue with its operands' addresses for one run.
    pub(crate) fn bind<'a>(
        &'a self,
        addr: &dyn Fn(Value) -> *mut u8,
        ptrs: &'a mut Vec<*const f32>,
    ) -> Bound<'a> {
        ptrs.clear();
        ptrs.extend(self.operands.iter().map(|&v| addr(v) as *const f32));
        Bound {
            ops: &self.ops,
            fast: Fast::of(&self.ops),
            avx512: self.avx512,
            // SAFETY: the operands are only read while the kernel runs.
            ptrs: unsafe { SendPtr::new(ptrs.as_ptr()) },
        }
    }
}

/// PyTorch's GELU at the start of `ops`, whose first op divides `x` by constant `div`:
/// `erf` of the quotient, plus a constant, times `x`, times a constant, each op reading the one
/// before (and `x`). The step and the values of the five ops, the last the GELU's.
fn match_gelu_erf(
    f: &Function,
    ops: &[Op],
    x: Value,
    div: f32,
    scalar: &dyn Fn(Value) -> Option<f32>,
) -> Option<(PostOp, [Value; 5])> {
    let [q, e, a, m, y] = ops.get(..5)?.try_into().ok()?;
    let (q, e, a, m, y) = (f.op(q), f.op(e), f.op(a), f.op(m), f.op(y));
    if [q, e, a, m, y].iter().any(|o| !o.deps.is_empty()) {
        return None;
    }
    // The other operand of binary op `o` with `v`.
    let other = |o: &tcc_ir::OpData, v: Value| match *o.args.as_slice() {
        [p, w] if p == v => Some(w),
        [w, p] if p == v => Some(w),
        _ => None,
    };
    let [qv, ev, av, mv, yv] = [q, e, a, m, y].map(|o| o.results[0]);
    let ok = matches!(e.kind, OpKind::Unary(UnaryOp::Erf))
        && e.args == [qv]
        && matches!(a.kind, OpKind::Binary(BinaryOp::Add))
        && matches!(m.kind, OpKind::Binary(BinaryOp::Mul))
        && other(m, av) == Some(x)
        && matches!(y.kind, OpKind::Binary(BinaryOp::Mul))
        && [ev, av, mv, yv].iter().all(|&v| f.ty(v) == f.ty(x));
    if !ok {
        return None;
    }
    let one = scalar(other(a, ev)?)?;
    let half = scalar(other(y, mv)?)?;
    Some((PostOp::GeluErf { div, one, half }, [qv, ev, av, mv, yv]))
}

/// The commonest epilogues, each with a loop of its own: per vector one load of the sum, the
/// steps, one store, where [`Bound::apply`] loads and stores every vector once per step and
/// dispatches on the step (that took a quarter of a 1x1 convolution with a short reduction).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Fast {
    /// Nothing: the sums as they are.
    Plain,
    /// A per-channel bias (operand index).
    Bias(usize),
    /// A bias, then relu.
    BiasRelu(usize),
    /// A bias, then `max(lo, x)` and `min(hi, x)` (relu6).
    BiasClamp(usize, f32, f32),
    /// A bias, then SiLU.
    BiasSilu(usize),
    /// A bias, then a residual (operand indices), then relu if `relu`.
    BiasResidual(usize, usize, bool),
    /// GELU in PyTorch's form ([`PostOp::GeluErf`]: its constants), after a bias if there
    /// is one (a transformer's dense layer has one; ConvNeXt's, zero at initialisation, are
    /// folded away).
    GeluErf(Option<usize>, f32, f32, f32),
}

impl Fast {
    /// The form of epilogue `ops`, if it has one.
    fn of(ops: &[PostOp]) -> Option<Fast> {
        let (bias, rest) = match *ops {
            [] => return Some(Fast::Plain),
            [PostOp::GeluErf { div, one, half }] => {
                return Some(Fast::GeluErf(None, div, one, half));
            }
            [
                PostOp::Channel {
                    mul: false,
                    operand,
                },
                ref rest @ ..,
            ] => (operand, rest),
            _ => return None,
        };
        Some(match *rest {
            [] => Fast::Bias(bias),
            [PostOp::Relu] => Fast::BiasRelu(bias),
            [PostOp::Max(lo), PostOp::Min(hi)] => Fast::BiasClamp(bias, lo, hi),
            [PostOp::Silu] => Fast::BiasSilu(bias),
            [PostOp::Tensor { operand }] => Fast::BiasResidual(bias, operand, false),
            [PostOp::Tensor { operand }, PostOp::Relu] => Fast::BiasResidual(bias, operand, true),
            [PostOp::GeluErf { div, one, half }] => Fast::GeluErf(Some(bias), div, one, half),
            _ => return None,
        })
    }
}

/// An epilogue of at most a bias and a clamp ([`Bound::simple`]).
#[derive(Clone, Copy)]
pub(crate) struct Simple {
    /// The bias's first channel.
    pub bias: Option<*const f32>,
    /// `min(hi, max(lo, x))`.
    pub clamp: Option<(f32, f32)>,
}

/// A [`Simple`] epilogue for one block of eight channels, in registers.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(crate) struct SimpleBlock {
    bias: Option<std::arch::x86_64::__m256>,
    clamp: Option<(std::arch::x86_64::__m256, std::arch::x86_64::__m256)>,
}

#[cfg(target_arch = "x86_64")]
impl Simple {
    /// The epilogue for the block of channels `off..off + 8` past [`Simple::bias`]'s first.
    ///
    /// # Safety
    /// The bias covers those channels.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub(crate) unsafe fn block(&self, off: usize) -> SimpleBlock {
        use std::arch::x86_64::*;
        // SAFETY: the caller's contract.
        let bias = self.bias.map(|p| unsafe { _mm256_loadu_ps(p.add(off)) });
        let clamp = self
            .clamp
            .map(|(lo, hi)| (_mm256_set1_ps(lo), _mm256_set1_ps(hi)));
        SimpleBlock { bias, clamp }
    }
}

/// A [`Simple`] epilogue for a pair of blocks (sixteen channels), in registers.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(crate) struct SimplePair {
    bias: Option<std::arch::x86_64::__m512>,
    clamp: Option<(std::arch::x86_64::__m512, std::arch::x86_64::__m512)>,
}

#[cfg(target_arch = "x86_64")]
impl Simple {
    /// The epilogue for the channels `off..off + 16` past [`Simple::bias`]'s first.
    ///
    /// # Safety
    /// The bias covers those channels; the CPU has AVX-512F.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub(crate) unsafe fn pair(&self, off: usize) -> SimplePair {
        use std::arch::x86_64::*;
        // SAFETY: the caller's contract.
        let bias = self.bias.map(|p| unsafe { _mm512_loadu_ps(p.add(off)) });
        let clamp = self
            .clamp
            .map(|(lo, hi)| (_mm512_set1_ps(lo), _mm512_set1_ps(hi)));
        SimplePair { bias, clamp }
    }
}

#[cfg(target_arch = "x86_64")]
impl SimplePair {
    /// [`SimpleBlock::apply`] on sixteen lanes: the same steps, so the same bits.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub(crate) fn apply(&self, v: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        let v = match self.bias {
            Some(c) => _mm512_add_ps(v, c),
            None => v,
        };
        match self.clamp {
            Some((lo, hi)) => _mm512_min_ps(hi, _mm512_max_ps(lo, v)),
            None => v,
        }
    }
}

#[cfg(target_arch = "x86_64")]
impl SimpleBlock {
    /// The epilogue on the sums `v`: the bias, then `min(hi, max(lo, v))`, the steps of
    /// [`Bound::store`] (so its bits).
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub(crate) fn apply(&self, v: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        let v = match self.bias {
            Some(c) => _mm256_add_ps(v, c),
            None => v,
        };
        match self.clamp {
            Some((lo, hi)) => _mm256_min_ps(hi, _mm256_max_ps(lo, v)),
            None => v,
        }
    }
}

/// An epilogue bound to one run's operands: what the kernels' threads share.
#[derive(Clone, Copy)]
pub(crate) struct Bound<'a> {
    ops: &'a [PostOp],
    /// The epilogue as one of the common forms, if it is one.
    fast: Option<Fast>,
    /// As [`Post::avx512`].
    avx512: bool,
    ptrs: SendPtr<*const *const f32>,
}

impl Bound<'_> {
    /// The epilogue as a bias (at channel `chan` on) and a clamp, if it is one of those forms
    /// (nothing, a bias, a bias then relu or relu6): simple enough for a kernel to apply in
    /// its own loop, inlined, with the bits of [`Bound::store`] (relu as a clamp to `[0,
    /// inf]`: the same `max`, and `min` with infinity keeps every value, NaN included).
    pub(crate) fn simple(&self, chan: usize) -> Option<Simple> {
        // SAFETY: operand `o` is a per-channel vector covering the output's channels.
        let bias = |o: usize| Some(unsafe { (*self.ptrs.get().add(o)).add(chan) });
        Some(match self.fast? {
            Fast::Plain => Simple {
                bias: None,
                clamp: None,
            },
            Fast::Bias(o) => Simple {
                bias: bias(o),
                clamp: None,
            },
            Fast::BiasRelu(o) => Simple {
                bias: bias(o),
                clamp: Some((0.0, f32::INFINITY)),
            },
            Fast::BiasClamp(o, lo, hi) => Simple {
                bias: bias(o),
                clamp: Some((lo, hi)),
            },
            _ => return None,
        })
    }

    /// Whether [`Bound::store_tile`] has a loop of its own for this epilogue (the others it
    /// hands to [`Bound::store`] through a copy of the sums).
    pub(crate) fn tile_form(&self) -> bool {
        matches!(
            self.fast,
            Some(
                Fast::Plain
                    | Fast::Bias(_)
                    | Fast::BiasRelu(_)
                    | Fast::BiasClamp(..)
                    | Fast::BiasResidual(..)
            )
        )
    }
}

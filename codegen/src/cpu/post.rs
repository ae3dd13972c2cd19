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

use super::send_ptr::SendPtr;
#[cfg(target_arch = "x86_64")]
use super::simd::{erf, first, gelu, sigmoid, sigmoid512};
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;
use tcc_ir::{BinaryOp, Function, Op, OpKind, UnaryOp, Value};

/// Channels per block: the lanes of one vector.
const B: usize = 8;

/// Pixels of the largest register tile [`Bound::store_tile`] stores, two blocks each.
const P_MAX: usize = 6;

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
    /// Applies the epilogue to `vs` and stores vector `i` (of channels `chan(i)..` of a
    /// per-channel operand, element `base + at(i)` of the output) at `y + at(i)`. A [`Fast`]
    /// form goes through its own loop (the same steps as [`Bound::apply`], so the same bits);
    /// any other chain through `apply`, then the stores.
    ///
    /// # Safety
    /// As for [`Bound::apply`]; `y + at(i)` holds a vector for each `i`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub(crate) unsafe fn store(
        &self,
        vs: &mut [__m256],
        chan: impl Fn(usize) -> usize + Copy,
        at: impl Fn(usize) -> usize + Copy,
        y: *mut f32,
        base: usize,
    ) {
        // SAFETY (every store): the caller's contract.
        let store = |i: usize, v: __m256| unsafe { _mm256_storeu_ps(y.add(at(i)), v) };
        let Some(fast) = self.fast else {
            // SAFETY: the caller's contract.
            unsafe {
                self.apply(vs, chan, |i| base + at(i), |p| _mm256_loadu_ps(p));
            }
            for (i, &v) in vs.iter().enumerate() {
                store(i, v);
            }
            return;
        };
        // SAFETY (every load): the caller's contract: a per-channel operand holds the
        // vector's channels, a residual the output's elements.
        let channel =
            |o: usize, i: usize| unsafe { _mm256_loadu_ps((*self.ptrs.get().add(o)).add(chan(i))) };
        let tensor = |o: usize, i: usize| unsafe {
            _mm256_loadu_ps((*self.ptrs.get().add(o)).add(base + at(i)))
        };
        match fast {
            Fast::Plain => {
                for (i, &v) in vs.iter().enumerate() {
                    store(i, v);
                }
            }
            Fast::Bias(o) => {
                for (i, &v) in vs.iter().enumerate() {
                    store(i, _mm256_add_ps(v, channel(o, i)));
                }
            }
            Fast::BiasRelu(o) => {
                let z = _mm256_setzero_ps();
                for (i, &v) in vs.iter().enumerate() {
                    store(i, _mm256_max_ps(z, _mm256_add_ps(v, channel(o, i))));
                }
            }
            Fast::BiasClamp(o, lo, hi) => {
                let (lo, hi) = (_mm256_set1_ps(lo), _mm256_set1_ps(hi));
                for (i, &v) in vs.iter().enumerate() {
                    let v = _mm256_max_ps(lo, _mm256_add_ps(v, channel(o, i)));
                    store(i, _mm256_min_ps(hi, v));
                }
            }
            Fast::BiasSilu(o) => {
                let mut done = 0;
                if self.avx512 {
                    // Pairs of vectors on sixteen lanes: the sigmoid's instructions halve.
                    done = vs.len() / 2 * 2;
                    // SAFETY: the CPU has AVX-512F (`Post::avx512`); the caller's contract.
                    unsafe { bias_silu_pairs(&vs[..done], |i| channel(o, i), store) };
                }
                for (i, &v) in vs.iter().enumerate().skip(done) {
                    let v = _mm256_add_ps(v, channel(o, i));
                    store(i, _mm256_mul_ps(v, sigmoid(v)));
                }
            }
            Fast::BiasResidual(o, r, relu) => {
                let z = _mm256_setzero_ps();
                for (i, &v) in vs.iter().enumerate() {
                    let v = _mm256_add_ps(_mm256_add_ps(v, channel(o, i)), tensor(r, i));
                    store(i, if relu { _mm256_max_ps(z, v) } else { v });
                }
            }
            Fast::GeluErf(o, div, one, half) => {
                // Two vectors at a time: each is one long dependent chain (two divisions, two
                // polynomials), and side by side they run 1.25x faster than one after the
                // other.
                let g = |i: usize| {
                    let v = match o {
                        Some(o) => _mm256_add_ps(vs[i], channel(o, i)),
                        None => vs[i],
                    };
                    gelu_erf(v, div, one, half)
                };
                let pairs = vs.len() / 2 * 2;
                for i in (0..pairs).step_by(2) {
                    let (a, b) = (g(i), g(i + 1));
                    store(i, a);
                    store(i + 1, b);
                }
                if pairs < vs.len() {
                    store(pairs, g(pairs));
                }
            }
        }
    }

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

    /// [`Bound::store`] for a register tile of a channel-blocked output: `acc[p][b]` holds
    /// channels `chan + 8b..` of pixel `p`, stored at `y + b * stride + 8p` (element `base +`
    /// the same offset); pixels `..n` are stored. The common forms load each per-channel
    /// operand once per block, not once per vector, and a whole tile (`n == PX`) is a loop of
    /// constant length that unrolls (no index arithmetic per vector); the rest go through
    /// [`Bound::store`]. LLVM does not inline this into the kernels: the callers pass a copy
    /// of their sums, so that the sums they accumulate stay in registers.
    ///
    /// # Safety
    /// As for [`Bound::store`], for every vector stored.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn store_tile<const NB: usize, const PX: usize>(
        &self,
        acc: &[[__m256; NB]; PX],
        n: usize,
        chan: usize,
        stride: usize,
        y: *mut f32,
        base: usize,
    ) {
        // Every pixel's blocks through `f`, a whole tile's in a loop of constant length.
        #[inline(always)]
        fn tile<const NB: usize, const PX: usize>(
            acc: &[[__m256; NB]; PX],
            n: usize,
            f: impl Fn(usize, usize, __m256),
        ) {
            if n == PX {
                for (p, a) in acc.iter().enumerate() {
                    (0..NB).for_each(|b| f(p, b, a[b]));
                }
            } else {
                for (p, a) in acc.iter().enumerate().take(n) {
                    (0..NB).for_each(|b| f(p, b, a[b]));
                }
            }
        }
        let at = |p: usize, b: usize| b * stride + p * B;
        // SAFETY (every load and store): the caller's contract.
        let store = |p: usize, b: usize, v: __m256| unsafe { _mm256_storeu_ps(y.add(at(p, b)), v) };
        let channel = |o: usize| -> [__m256; NB] {
            std::array::from_fn(|b| unsafe {
                _mm256_loadu_ps((*self.ptrs.get().add(o)).add(chan + b * B))
            })
        };
        let tensor = |o: usize, p: usize, b: usize| unsafe {
            _mm256_loadu_ps((*self.ptrs.get().add(o)).add(base + at(p, b)))
        };
        let z = _mm256_setzero_ps();
        match self.fast {
            Some(Fast::Plain) => tile(acc, n, store),
            Some(Fast::Bias(o)) => {
                let c = channel(o);
                tile(acc, n, |p, b, v| store(p, b, _mm256_add_ps(v, c[b])));
            }
            Some(Fast::BiasRelu(o)) => {
                let c = channel(o);
                tile(acc, n, |p, b, v| {
                    store(p, b, _mm256_max_ps(z, _mm256_add_ps(v, c[b])))
                });
            }
            Some(Fast::BiasClamp(o, lo, hi)) => {
                let (c, lo, hi) = (channel(o), _mm256_set1_ps(lo), _mm256_set1_ps(hi));
                tile(acc, n, |p, b, v| {
                    let v = _mm256_max_ps(lo, _mm256_add_ps(v, c[b]));
                    store(p, b, _mm256_min_ps(hi, v))
                });
            }
            Some(Fast::BiasResidual(o, r, relu)) => {
                let c = channel(o);
                tile(acc, n, |p, b, v| {
                    let v = _mm256_add_ps(_mm256_add_ps(v, c[b]), tensor(r, p, b));
                    store(p, b, if relu { _mm256_max_ps(z, v) } else { v })
                });
            }
            _ => {
                let mut vs = [z; 2 * P_MAX];
                for (i, v) in vs.iter_mut().enumerate().take(n * NB) {
                    *v = acc[i / NB][i % NB];
                }
                let chan = |i: usize| chan + (i % NB) * B;
                let at = |i: usize| at(i / NB, i % NB);
                // SAFETY: the caller's contract.
                unsafe { self.store(&mut vs[..n * NB], chan, at, y, base) }
            }
        }
    }

    /// [`Bound::store_tile`] for the 512-bit tiles: `acc[p][j]` holds pair `j` of pixel `p`,
    /// channels `chan + 16j..` (two blocks), stored at `y + 2j * stride + 8p` and `y + (2j +
    /// 1) * stride + 8p`; pixels `..n`. The common forms but GELU run on sixteen lanes at
    /// once, with the same steps and so the same bits as on eight; for the others this stores
    /// nothing and returns `false`, and the caller stores the halves through
    /// [`Bound::store_tile`].
    ///
    /// # Safety
    /// As for [`Bound::store`], for every vector stored; the CPU has AVX-512F.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn store_tile512<const NP: usize, const PX: usize>(
        &self,
        acc: &[[__m512; NP]; PX],
        n: usize,
        chan: usize,
        stride: usize,
        y: *mut f32,
        base: usize,
    ) -> bool {
        // Every pixel's pairs through `f`, a whole tile's in a loop of constant length.
        #[inline(always)]
        fn tile<const NP: usize, const PX: usize>(
            acc: &[[__m512; NP]; PX],
            n: usize,
            f: impl Fn(usize, usize, __m512),
        ) {
            if n == PX {
                for (p, a) in acc.iter().enumerate() {
                    (0..NP).for_each(|j| f(p, j, a[j]));
                }
            } else {
                for (p, a) in acc.iter().enumerate().take(n) {
                    (0..NP).for_each(|j| f(p, j, a[j]));
                }
            }
        }
        let at = |p: usize, j: usize, h: usize| (2 * j + h) * stride + p * B;
        let high = |v: __m512| _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
        // SAFETY (every load and store): the caller's contract.
        let store = |p: usize, j: usize, v: __m512| unsafe {
            _mm256_storeu_ps(y.add(at(p, j, 0)), _mm512_castps512_ps256(v));
            _mm256_storeu_ps(y.add(at(p, j, 1)), high(v));
        };
        let channel = |o: usize| -> [__m512; NP] {
            std::array::from_fn(|j| unsafe {
                _mm512_loadu_ps((*self.ptrs.get().add(o)).add(chan + j * 2 * B))
            })
        };
        let tensor = |o: usize, p: usize, j: usize| unsafe {
            let t = (*self.ptrs.get().add(o)).add(base);
            let lo = _mm256_castps_pd(_mm256_loadu_ps(t.add(at(p, j, 0))));
            let hi = _mm256_castps_pd(_mm256_loadu_ps(t.add(at(p, j, 1))));
            _mm512_castpd_ps(_mm512_insertf64x4::<1>(_mm512_castpd256_pd512(lo), hi))
        };
        let z = _mm512_setzero_ps();
        match self.fast {
            Some(Fast::Plain) => tile(acc, n, store),
            Some(Fast::Bias(o)) => {
                let c = channel(o);
                tile(acc, n, |p, j, v| store(p, j, _mm512_add_ps(v, c[j])));
            }
            Some(Fast::BiasRelu(o)) => {
                let c = channel(o);
                tile(acc, n, |p, j, v| {
                    store(p, j, _mm512_max_ps(z, _mm512_add_ps(v, c[j])))
                });
            }
            Some(Fast::BiasClamp(o, lo, hi)) => {
                let (c, lo, hi) = (channel(o), _mm512_set1_ps(lo), _mm512_set1_ps(hi));
                tile(acc, n, |p, j, v| {
                    let v = _mm512_max_ps(lo, _mm512_add_ps(v, c[j]));
                    store(p, j, _mm512_min_ps(hi, v))
                });
            }
            Some(Fast::BiasSilu(o)) => {
                let c = channel(o);
                tile(acc, n, |p, j, v| {
                    let v = _mm512_add_ps(v, c[j]);
                    store(p, j, _mm512_mul_ps(v, sigmoid512(v)))
                });
            }
            Some(Fast::BiasResidual(o, r, relu)) => {
                let c = channel(o);
                tile(acc, n, |p, j, v| {
                    let v = _mm512_add_ps(_mm512_add_ps(v, c[j]), tensor(r, p, j));
                    store(p, j, if relu { _mm512_max_ps(z, v) } else { v })
                });
            }
            _ => return false,
        }
        true
    }

    /// Applies the epilogue to vectors `vs`: vector `i` is of channels `chan(i)..` (the offset
    /// into a per-channel operand) at element offset `at(i)` of the output; `load` reads an
    /// operand's vector. One step at a time over all of them, so the dispatch on the step is
    /// paid once per step, not once per vector.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; the operands hold what [`Post::of`] checked; `load` may read
    /// a per-channel operand's vector at `chan(i)` and a tensor operand's at `at(i)`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub(crate) unsafe fn apply(
        &self,
        vs: &mut [__m256],
        chan: impl Fn(usize) -> usize,
        at: impl Fn(usize) -> usize,
        load: impl Fn(*const f32) -> __m256,
    ) {
        for &op in self.ops {
            // SAFETY (every arm): the caller's contract.
            match op {
                PostOp::Channel { mul, operand } => {
                    let base = unsafe { *self.ptrs.get().add(operand) };
                    for (i, v) in vs.iter_mut().enumerate() {
                        let c = load(unsafe { base.add(chan(i)) });
                        *v = if mul {
                            _mm256_mul_ps(*v, c)
                        } else {
                            _mm256_add_ps(*v, c)
                        };
                    }
                }
                PostOp::Tensor { operand } => {
                    let base = unsafe { *self.ptrs.get().add(operand) };
                    for (i, v) in vs.iter_mut().enumerate() {
                        *v = _mm256_add_ps(*v, load(unsafe { base.add(at(i)) }));
                    }
                }
                // `maxps`/`minps` give their second operand when either is NaN.
                PostOp::Max(c) => {
                    let c = _mm256_set1_ps(c);
                    vs.iter_mut().for_each(|v| *v = _mm256_max_ps(c, *v));
                }
                PostOp::Min(c) => {
                    let c = _mm256_set1_ps(c);
                    vs.iter_mut().for_each(|v| *v = _mm256_min_ps(c, *v));
                }
                PostOp::Relu => {
                    let z = _mm256_setzero_ps();
                    vs.iter_mut().for_each(|v| *v = _mm256_max_ps(z, *v));
                }
                PostOp::Sigmoid => vs.iter_mut().for_each(|v| *v = sigmoid(*v)),
                PostOp::Silu => vs
                    .iter_mut()
                    .for_each(|v| *v = _mm256_mul_ps(*v, sigmoid(*v))),
                PostOp::Gelu => vs.iter_mut().for_each(|v| *v = gelu(*v)),
                PostOp::GeluErf { div, one, half } => vs
                    .iter_mut()
                    .for_each(|v| *v = gelu_erf(*v, div, one, half)),
            }
        }
    }

    /// Applies the epilogue in place to elements `range` of a row-major output at `y` whose
    /// rows (of channels) are `n` long ([`Layout::Rows`]): up to eight vectors at a time
    /// within a row, the last few elements of a row through masked loads and stores.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; `y` holds the output, `range` lies in it, and the operands
    /// hold what [`Post::of`] checked.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn rows(&self, y: *mut f32, range: std::ops::Range<usize>, n: usize) {
        const V: usize = 8;
        let mut s = range.start;
        while s < range.end {
            let end = (s - s % n + n).min(range.end);
            let mut at = s;
            while at + B <= end {
                let k = ((end - at) / B).min(V);
                let mut vs = [_mm256_setzero_ps(); V];
                // SAFETY (loads and the store): elements at.. at + 8k lie in this row of the
                // output (the caller's contract); per-channel operands hold n channels.
                unsafe {
                    for (j, v) in vs.iter_mut().enumerate().take(k) {
                        *v = _mm256_loadu_ps(y.add(at + j * B));
                    }
                    let c0 = at % n;
                    self.store(&mut vs[..k], |j| c0 + j * B, |j| j * B, y.add(at), at);
                }
                at += k * B;
            }
            if at < end {
                // The row's last elements: every load and the store masked to them.
                let m = first(end - at);
                let c0 = at % n;
                // SAFETY: as above; the masked lanes are neither read nor written.
                unsafe {
                    let mut v = [_mm256_maskload_ps(y.add(at), m)];
                    self.apply(&mut v, |_| c0, |_| at, |p| _mm256_maskload_ps(p, m));
                    _mm256_maskstore_ps(y.add(at), m, v[0]);
                }
            }
            s = end;
        }
    }
}

/// A bias and SiLU on vectors `vs`, two at a time on sixteen lanes with the steps of eight
/// (so the same bits): vector `i` plus `channel(i)`, handed to `store(i, ..)`.
///
/// # Safety
/// The CPU has AVX-512F, AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn bias_silu_pairs(
    vs: &[__m256],
    channel: impl Fn(usize) -> __m256,
    store: impl Fn(usize, __m256),
) {
    for (k, pair) in vs.chunks_exact(2).enumerate() {
        let (i, j) = (2 * k, 2 * k + 1);
        let a = _mm256_castps_pd(_mm256_add_ps(pair[0], channel(i)));
        let b = _mm256_castps_pd(_mm256_add_ps(pair[1], channel(j)));
        let v = _mm512_castpd_ps(_mm512_insertf64x4::<1>(_mm512_castpd256_pd512(a), b));
        let r = _mm512_castps_pd(_mm512_mul_ps(v, sigmoid512(v)));
        store(i, _mm256_castpd_ps(_mm512_castpd512_pd256(r)));
        store(j, _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(r)));
    }
}

/// [`PostOp::GeluErf`] on eight lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
fn gelu_erf(x: __m256, div: f32, one: f32, half: f32) -> __m256 {
    let e = erf(_mm256_div_ps(x, _mm256_set1_ps(div)));
    let m = _mm256_mul_ps(x, _mm256_add_ps(e, _mm256_set1_ps(one)));
    _mm256_mul_ps(m, _mm256_set1_ps(half))
}

#[cfg(test)]
mod tests {
    use super::{Fast, Layout, Post, PostOp};
    use tcc_ir::{Function, Value, parse_function};

    /// `Post::of` in `layout` on the ops after `src`'s first `library` op (constants aside:
    /// the planner keeps them out of kernels), with the function's results as what the kernel
    /// stores.
    fn post_after(src: &str, library: &str, layout: Layout) -> Option<(Post, Value)> {
        let f: Function = parse_function(src).unwrap();
        let ops = f.schedule();
        let start = ops
            .iter()
            .position(|&op| f.op(op).kind.mnemonic() == library)
            .unwrap();
        let r = f.op(ops[start]).results[0];
        let epilogue: Vec<_> = (ops[start + 1..].iter().copied())
            .filter(|&op| f.op(op).kind.mnemonic() != "const")
            .collect();
        Post::of(&f, layout, &epilogue, r, f.results())
    }

    /// [`post_after`] a blocked convolution.
    fn post(src: &str) -> Option<(Post, Value)> {
        post_after(src, "conv2d_nchwc", Layout::Blocked)
    }

    /// The forms with a loop of their own, and chains that keep the general one.
    #[test]
    fn common_epilogues_have_fast_forms() {
        let bias = PostOp::Channel {
            mul: false,
            operand: 0,
        };
        let residual = PostOp::Tensor { operand: 1 };
        let scale = PostOp::Channel {
            mul: true,
            operand: 0,
        };
        let cases = [
            (vec![], Some(Fast::Plain)),
            (vec![bias], Some(Fast::Bias(0))),
            (vec![bias, PostOp::Relu], Some(Fast::BiasRelu(0))),
            (
                vec![bias, PostOp::Max(0.0), PostOp::Min(6.0)],
                Some(Fast::BiasClamp(0, 0.0, 6.0)),
            ),
            (vec![bias, PostOp::Silu], Some(Fast::BiasSilu(0))),
            (
                vec![PostOp::GeluErf {
                    div: 2.0,
                    one: 1.0,
                    half: 0.5,
                }],
                Some(Fast::GeluErf(None, 2.0, 1.0, 0.5)),
            ),
            (vec![bias, residual], Some(Fast::BiasResidual(0, 1, false))),
            (
                vec![bias, residual, PostOp::Relu],
                Some(Fast::BiasResidual(0, 1, true)),
            ),
            // The clamps the other way round, a scale, an activation first: general.
            (vec![bias, PostOp::Min(6.0), PostOp::Max(0.0)], None),
            (vec![scale, bias, PostOp::Relu], None),
            (vec![PostOp::Relu, bias], None),
            (vec![bias, PostOp::Sigmoid], None),
        ];
        for (ops, want) in cases {
            assert_eq!(Fast::of(&ops), want, "{ops:?}");
        }
    }

    #[test]
    fn bias_scale_residual_and_clamps_are_post_ops() {
        let (p, _) = post(
            "func @f(%x: f32[1,2,4,4,8], %w: f32[16,16,1,1], %b: f32[1,2,1,1,8], %s: f32[2,1,1,8], %r: f32[1,2,4,4,8]) -> (f32[1,2,4,4,8]) {
  %c = conv2d_nchwc %x, %w {block=8} : f32[1,2,4,4,8]
  %m = mul %s, %c : f32[1,2,4,4,8]
  %z = add %m, %b : f32[1,2,4,4,8]
  %t = add %r, %z : f32[1,2,4,4,8]
  %lo = const {value=0.0} : f32[]
  %hi = const {value=6.0} : f32[]
  %a = max %t, %lo : f32[1,2,4,4,8]
  %y = min %hi, %a : f32[1,2,4,4,8]
  %q = relu %y : f32[1,2,4,4,8]
  %sg = sigmoid %q : f32[1,2,4,4,8]
  %u = mul %q, %sg : f32[1,2,4,4,8]
  %g = sigmoid %u : f32[1,2,4,4,8]
  return %g
}",
        )
        .expect("every op is a post-op");
        assert_eq!(
            p.ops,
            vec![
                PostOp::Channel {
                    mul: true,
                    operand: 0
                },
                PostOp::Channel {
                    mul: false,
                    operand: 1
                },
                PostOp::Tensor { operand: 2 },
                PostOp::Max(0.0),
                PostOp::Min(6.0),
                PostOp::Relu,
                PostOp::Silu,
                PostOp::Sigmoid,
            ]
        );
    }

    /// A matmul's epilogue over rows of channels: a bias of one row (or a vector), and GELU as
    /// PyTorch exports it, its constants kept; the erf form read from something other than the
    /// GELU's input is not one.
    #[test]
    fn gelu_after_a_matmul_is_a_post_op() {
        let src = |mul_by: &str| {
            format!(
                "func @f(%x: f32[4,16], %w: f32[16,24], %b: f32[1,24], %o: f32[4,24]) -> (f32[4,24]) {{
  %h = matmul %x, %w : f32[4,24]
  %z = add %h, %b : f32[4,24]
  %c = const {{value=[1.4142135]}} : f32[]
  %d = div %z, %c : f32[4,24]
  %e = erf %d : f32[4,24]
  %one = const {{value=[1.0]}} : f32[]
  %a = add %one, %e : f32[4,24]
  %m = mul %a, {mul_by} : f32[4,24]
  %half = const {{value=[0.5]}} : f32[]
  %y = mul %m, %half : f32[4,24]
  return %y
}}"
            )
        };
        let of = |src: &str, layout: Layout| post_after(src, "matmul", layout);
        let (p, _) = of(&src("%z"), Layout::Rows).expect("a bias and GELU");
        assert_eq!(
            p.ops,
            vec![
                PostOp::Channel {
                    mul: false,
                    operand: 0
                },
                PostOp::GeluErf {
                    div: std::f32::consts::SQRT_2,
                    one: 1.0,
                    half: 0.5
                },
            ]
        );
        assert_eq!(
            Fast::of(&p.ops),
            Some(Fast::GeluErf(Some(0), std::f32::consts::SQRT_2, 1.0, 0.5))
        );
        assert!(of(&src("%o"), Layout::Rows).is_none());
        // Blocked outputs end in a block of eight channels: not this one.
        assert!(of(&src("%z"), Layout::Blocked).is_none());
    }

    #[test]
    fn other_epilogues_are_not() {
        // A tanh; the chain's own value as a later operand (not stored, so not readable);
        // a value of the chain read elsewhere; a per-pixel operand.
        for src in [
            "func @f(%x: f32[1,2,4,4,8], %w: f32[16,16,1,1]) -> (f32[1,2,4,4,8]) {
  %c = conv2d_nchwc %x, %w {block=8} : f32[1,2,4,4,8]
  %y = tanh %c : f32[1,2,4,4,8]
  return %y
}",
            "func @f(%x: f32[1,2,4,4,8], %w: f32[16,16,1,1], %b: f32[1,2,1,1,8]) -> (f32[1,2,4,4,8]) {
  %c = conv2d_nchwc %x, %w {block=8} : f32[1,2,4,4,8]
  %z = add %c, %b : f32[1,2,4,4,8]
  %y = add %z, %c : f32[1,2,4,4,8]
  return %y
}",
            "func @f(%x: f32[1,2,4,4,8], %w: f32[16,16,1,1], %b: f32[1,2,1,1,8]) -> (f32[1,2,4,4,8], f32[1,2,4,4,8]) {
  %c = conv2d_nchwc %x, %w {block=8} : f32[1,2,4,4,8]
  %z = add %c, %b : f32[1,2,4,4,8]
  %y = relu %z : f32[1,2,4,4,8]
  return %z, %y
}",
            "func @f(%x: f32[1,2,4,4,8], %w: f32[16,16,1,1], %g: f32[1,1,4,4,1]) -> (f32[1,2,4,4,8]) {
  %c = conv2d_nchwc %x, %w {block=8} : f32[1,2,4,4,8]
  %y = mul %c, %g : f32[1,2,4,4,8]
  return %y
}",
        ] {
            assert!(post(src).is_none(), "{src}");
        }
    }
}

//! Epilogues a kernel applies in registers as it stores its output, instead of a second pass
//! over it: the bias add, scale, residual add, clamps (relu, relu6), sigmoid and SiLU that
//! follow a convolution in CNNs. A library kernel's epilogue that is such a chain
//! ([`Post::of`]) runs this way; any other runs as a compiled elementwise loop on the finished
//! pieces.
//!
//! The output is channel-blocked (`[N, Cb, ..., 8]`): a kernel hands its vectors of eight
//! channels, with their blocks and element offsets, to [`Bound::store`]. The commonest chains
//! ([`Fast`]) each have a store loop of their own; any other goes through [`Bound::apply`],
//! step by step over the vectors, before they are stored.

use super::send_ptr::SendPtr;
#[cfg(target_arch = "x86_64")]
use super::simd::sigmoid;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;
use tcc_ir::{BinaryOp, Function, Op, OpKind, UnaryOp, Value};

/// Channels per block: the lanes of one vector.
const B: usize = 8;

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
}

/// An epilogue as post-ops, with the values its steps read and the value it produces.
#[derive(Clone, Debug, Default)]
pub(crate) struct Post {
    pub ops: Vec<PostOp>,
    pub operands: Vec<Value>,
}

impl Post {
    /// The epilogue `ops` of a library kernel whose call produces the f32 blocked `r` (blocks of
    /// eight channels), as post-ops, if every op is one and `outputs` (what the kernel stores)
    /// is the chain's last value alone; that value is returned with it.
    pub(crate) fn of(
        f: &Function,
        ops: &[Op],
        r: Value,
        outputs: &[Value],
    ) -> Option<(Post, Value)> {
        let ty = f.ty(r);
        let d = ty.dims();
        if d.len() < 3 || d[d.len() - 1] != B as u64 || ty.dtype() != tcc_ir::DType::F32 {
            return None;
        }
        let per_channel = |v: Value| {
            let vd = f.ty(v).dims();
            vd.len() <= d.len()
                && vd.len() >= 2
                && vd[vd.len() - 1] == B as u64
                && vd[..vd.len() - 1].iter().rev().enumerate().all(|(i, &n)| {
                    // From the end: spatial axes 1, the block axis Cb, the batch axis 1.
                    let axis = d.len() - 2 - i;
                    n == if axis == 1 { d[1] } else { 1 }
                })
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
            // SAFETY: the operands are only read while the kernel runs.
            ptrs: unsafe { SendPtr::new(ptrs.as_ptr()) },
        }
    }
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
}

impl Fast {
    /// The form of epilogue `ops`, if it has one.
    fn of(ops: &[PostOp]) -> Option<Fast> {
        let (bias, rest) = match *ops {
            [] => return Some(Fast::Plain),
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
            _ => return None,
        })
    }
}

/// An epilogue bound to one run's operands: what the kernels' threads share.
#[derive(Clone, Copy)]
pub(crate) struct Bound<'a> {
    ops: &'a [PostOp],
    /// The epilogue as one of the common forms, if it is one.
    fast: Option<Fast>,
    ptrs: SendPtr<*const *const f32>,
}

impl Bound<'_> {
    /// Applies the epilogue to `vs` and stores vector `i` (of block `block(i)`, element
    /// `base + at(i)` of the output) at `y + at(i)`. A [`Fast`] form goes through its own loop
    /// (the same steps as [`Bound::apply`], so the same bits); any other chain through `apply`,
    /// then the stores.
    ///
    /// # Safety
    /// As for [`Bound::apply`]; `y + at(i)` holds a vector for each `i`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub(crate) unsafe fn store(
        &self,
        vs: &mut [__m256],
        block: impl Fn(usize) -> usize + Copy,
        at: impl Fn(usize) -> usize + Copy,
        y: *mut f32,
        base: usize,
    ) {
        // SAFETY (every store): the caller's contract.
        let store = |i: usize, v: __m256| unsafe { _mm256_storeu_ps(y.add(at(i)), v) };
        let Some(fast) = self.fast else {
            // SAFETY: the caller's contract.
            unsafe { self.apply(vs, block, |i| base + at(i)) };
            for (i, &v) in vs.iter().enumerate() {
                store(i, v);
            }
            return;
        };
        // SAFETY (every load): the caller's contract: a per-channel operand holds a
        // vector per block, a residual the output's elements.
        let channel = |o: usize, i: usize| unsafe {
            _mm256_loadu_ps((*self.ptrs.get().add(o)).add(block(i) * B))
        };
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
                for (i, &v) in vs.iter().enumerate() {
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
        }
    }

    /// Applies the epilogue to vectors `vs`: vector `i` is of block `block(i)` (counted within
    /// its image) at element offset `at(i)` of the output. One step at a time over all of
    /// them, so the dispatch on the step is paid once per step, not once per vector.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; the operands hold what [`Post::of`] checked; `at(i)` is the
    /// offset of a whole vector of the output and `block(i)` its block.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub(crate) unsafe fn apply(
        &self,
        vs: &mut [__m256],
        block: impl Fn(usize) -> usize,
        at: impl Fn(usize) -> usize,
    ) {
        for &op in self.ops {
            // SAFETY (every arm): the caller's contract: a per-channel operand holds a vector
            // per block, a tensor operand the output's elements.
            match op {
                PostOp::Channel { mul, operand } => {
                    let base = unsafe { *self.ptrs.get().add(operand) };
                    for (i, v) in vs.iter_mut().enumerate() {
                        let c = unsafe { _mm256_loadu_ps(base.add(block(i) * B)) };
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
                        *v = _mm256_add_ps(*v, unsafe { _mm256_loadu_ps(base.add(at(i))) });
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
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Fast, Post, PostOp};
    use tcc_ir::{Function, Value, parse_function};

    /// `Post::of` on the ops after the convolution of `src` (constants aside: the planner
    /// keeps them out of kernels), with the function's results as what the kernel stores.
    fn post(src: &str) -> Option<(Post, Value)> {
        let f: Function = parse_function(src).unwrap();
        let ops = f.schedule();
        let start = ops
            .iter()
            .position(|&op| f.op(op).kind.mnemonic() == "conv2d_nchwc")
            .unwrap();
        let r = f.op(ops[start]).results[0];
        let epilogue: Vec<_> = (ops[start + 1..].iter().copied())
            .filter(|&op| f.op(op).kind.mnemonic() != "const")
            .collect();
        Post::of(&f, &epilogue, r, f.results())
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

//! Random well-typed functions, for property tests, fuzzing seeds and benchmarks.
//!
//! [`random_function`] builds a function op by op through the [`FunctionBuilder`], so every op it
//! emits passes its type rule. It covers every op category, broadcasting, multi-result ops,
//! control dependencies, scoped names and names that need quoting. The same seed always gives the
//! same function. Shapes stay small, so the functions are also cheap to execute.

use crate::builder::FunctionBuilder;
use crate::function::{Function, Value};
use crate::literal::{Data, Literal, Scalar};
use crate::ops::{BinaryOp, CmpOp, Conv2d, F64, OpKind, Pool2d, ReduceOp, UnaryOp};
use crate::tensor::Tensor;
use crate::types::{DType, TensorType};

/// SplitMix64: a small, fast, seedable generator.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Uniform in `[lo, hi)`, from 53 random bits.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * (hi - lo)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.uniform(0.0, 1.0) <= p
    }

    /// A uniformly chosen element.
    pub fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len() as u64) as usize]
    }

    /// A float in `[-2, 2)` with two decimals.
    pub fn small_float(&mut self) -> f64 {
        (self.below(400) as f64 - 200.0) / 100.0
    }
}

struct Gen {
    b: FunctionBuilder,
    rng: Rng,
    floats: Vec<Value>,
}

impl Gen {
    fn ty(&self, v: Value) -> TensorType {
        self.b.function().ty(v).clone()
    }

    /// A float value, usually one of the last few defined so that chains form. O(1).
    fn pick_float(&mut self) -> Option<Value> {
        let n = self.floats.len() as u64;
        if n == 0 {
            return None;
        }
        let i = if self.rng.chance(0.7) {
            n - 1 - self.rng.below(n.min(4))
        } else {
            self.rng.below(n)
        };
        Some(self.floats[i as usize])
    }

    fn splat_like(&mut self, dtype: DType, dims: &[u64]) -> Value {
        let x = self.rng.small_float();
        self.b.splat(dtype, dims, x).expect("small splat")
    }

    fn dense_like(&mut self, ty: &TensorType) -> Value {
        let n = ty.numel() as usize;
        let mut d = Data::with_capacity(ty.dtype(), n);
        for _ in 0..n {
            let x = self.rng.small_float();
            let s = match ty.dtype() {
                DType::F32 => Scalar::F32(x as f32),
                _ => Scalar::F64(x),
            };
            d.push(s).expect("float dtype");
        }
        self.b
            .constant(ty.clone(), Literal::dense(d))
            .expect("dense constant")
    }

    /// A value broadcastable against `dims`: a suffix of it with some axes set to 1.
    fn broadcast_partner(&mut self, dtype: DType, dims: &[u64]) -> Value {
        let keep = self.rng.below(dims.len() as u64 + 1) as usize;
        let mut s: Vec<u64> = dims[dims.len() - keep..].to_vec();
        for d in &mut s {
            if self.rng.chance(0.3) {
                *d = 1;
            }
        }
        let ty = TensorType::new(dtype, s).expect("small");
        if ty.numel() <= 16 && self.rng.chance(0.5) {
            self.dense_like(&ty)
        } else {
            self.splat_like(dtype, ty.dims())
        }
    }

    fn new_param(&mut self, dims: &[u64]) -> Value {
        let dtype = if self.rng.chance(0.85) {
            DType::F32
        } else {
            DType::F64
        };
        let k = self.b.function().params().len();
        let v = self
            .b
            .param(&format!("p{k}"), dtype, dims)
            .expect("small param");
        self.floats.push(v);
        v
    }

    fn random_dims(&mut self, max_rank: u64) -> Vec<u64> {
        let rank = self.rng.below(max_rank + 1);
        (0..rank).map(|_| 1 + self.rng.below(4)).collect()
    }

    fn step(&mut self) -> Option<Value> {
        let choice = self.rng.below(20);
        let x = self.pick_float()?;
        let t = self.ty(x);
        let r = t.rank();
        let out = match choice {
            0 | 1 => {
                let u = *self.rng.pick(&UnaryOp::ALL);
                self.b.unary(u, x)
            }
            2..=4 => {
                let y = if self.rng.chance(0.5) {
                    self.floats
                        .iter()
                        .copied()
                        .rev()
                        .take(16)
                        .find(|&y| y != x && self.ty(y) == t)
                } else {
                    None
                };
                let y = y.unwrap_or_else(|| self.broadcast_partner(t.dtype(), t.dims()));
                let op = *self.rng.pick(&BinaryOp::ALL);
                if self.rng.chance(0.5) {
                    self.b.binary(op, x, y)
                } else {
                    self.b.binary(op, y, x)
                }
            }
            5 if self.rng.chance(0.15) => {
                // Quantized to u8 or i8 and back, per tensor or per slice of the first axis.
                let per_axis = r >= 1 && self.rng.chance(0.5);
                let sdims: Vec<u64> = if per_axis {
                    let mut d = vec![1; r];
                    d[0] = t.dims()[0];
                    d
                } else {
                    Vec::new()
                };
                let scale = self.rng.uniform(0.01, 0.5);
                let (zdt, zero) = if self.rng.chance(0.5) {
                    (DType::U8, self.rng.below(256) as f64)
                } else {
                    (DType::I8, self.rng.below(256) as f64 - 128.0)
                };
                let s = self.b.splat(t.dtype(), &sdims, scale).ok()?;
                let z = self.b.splat(zdt, &sdims, zero).ok()?;
                let q = self.b.op1(OpKind::QuantizeLinear, &[x, s, z]).ok()?;
                self.b.op1(OpKind::DequantizeLinear, &[q, s, z])
            }
            5 if self.rng.chance(0.2) => {
                // Fake quantization to a range around zero (or a broken one, min > max: NaN).
                let lo = self.rng.uniform(-2.0, 0.5);
                let hi = lo + self.rng.uniform(-0.5, 3.0);
                let (lo, hi) = (
                    self.b.splat(t.dtype(), &[], lo).ok()?,
                    self.b.splat(t.dtype(), &[], hi).ok()?,
                );
                let bits = *self.rng.pick(&[2u64, 4, 8, 16]);
                let narrow = self.rng.chance(0.5);
                self.b.op1(OpKind::FakeQuant { bits, narrow }, &[x, lo, hi])
            }
            5 => {
                let y = self.broadcast_partner(t.dtype(), t.dims());
                let c = self.b.compare(*self.rng.pick(&CmpOp::ALL), x, y).ok()?;
                self.b.op1(OpKind::Select, &[c, x, y])
            }
            6 if r >= 1 => {
                let mut axes: Vec<i64> = (0..r as i64).filter(|_| self.rng.chance(0.5)).collect();
                if axes.is_empty() {
                    axes.push(
                        self.rng.below(r as u64) as i64
                            - if self.rng.chance(0.5) { r as i64 } else { 0 },
                    );
                }
                let op = *self.rng.pick(&ReduceOp::ALL);
                let keep = self.rng.chance(0.5);
                self.b.reduce(op, x, &axes, keep)
            }
            7 if r >= 2 => {
                let mut perm: Vec<u64> = (0..r as u64).collect();
                for i in (1..perm.len()).rev() {
                    let j = self.rng.below(i as u64 + 1) as usize;
                    perm.swap(i, j);
                }
                self.b.transpose(x, &perm)
            }
            8 => {
                let dims: Vec<u64> = if self.rng.chance(0.5) {
                    vec![t.numel()]
                } else {
                    t.dims().iter().rev().copied().collect()
                };
                self.b.reshape(x, &dims)
            }
            9 if r == 2 && t.numel() > 0 && self.rng.chance(0.3) => {
                let (n, c) = (t.dims()[0], t.dims()[1]);
                let labels: Vec<Scalar> = (0..n)
                    .map(|_| Scalar::I64(self.rng.below(c) as i64))
                    .collect();
                let lty = TensorType::new(DType::I64, vec![n]).expect("small");
                let lv = self
                    .b
                    .constant(lty, Literal::dense(Data::from_scalars(DType::I64, labels)?))
                    .ok()?;
                let loss = self.b.op1(OpKind::SoftmaxCrossEntropy, &[x, lv]).ok()?;
                if self.rng.chance(0.3) {
                    // Its gradient, with the loss as the cotangent.
                    self.b.op1(OpKind::SoftmaxCrossEntropyGrad, &[x, lv, loss])
                } else {
                    Ok(loss)
                }
            }
            9 if r >= 1 && self.rng.chance(0.25) => {
                let axis = self.rng.below(r as u64) as i64;
                let len = t.dims()[axis as usize];
                let k = self.rng.below(len + 1);
                let largest = self.rng.chance(0.5);
                let res = (self.b)
                    .op(OpKind::TopK { k, axis, largest }, &[x], Some("top"))
                    .ok()?;
                Ok(res[0])
            }
            9 if r >= 1 => {
                let axis = self.rng.below(r as u64) as i64;
                let kind = if self.rng.chance(0.5) {
                    OpKind::Softmax { axis }
                } else {
                    OpKind::LogSoftmax { axis }
                };
                self.b.op1(kind, &[x])
            }
            10 if r >= 2 && self.rng.chance(0.2) => {
                // The product of x quantized to u8 and its transpose quantized to i8, with
                // per-row and per-column zero points, back to floats.
                let mut perm: Vec<u64> = (0..r as u64).collect();
                perm.swap(r - 2, r - 1);
                let xt = self.b.transpose(x, &perm).ok()?;
                let (m, dt) = (t.dims()[r - 2], t.dtype());
                let mut rows = vec![1; r];
                rows[r - 2] = m;
                let s = self.b.splat(dt, &[], self.rng.uniform(0.05, 0.5)).ok()?;
                let zu = self.b.splat(DType::U8, &[], 100.0).ok()?;
                let zi = self.b.splat(DType::I8, &[], -3.0).ok()?;
                let a = self.b.op1(OpKind::QuantizeLinear, &[x, s, zu]).ok()?;
                let b = self.b.op1(OpKind::QuantizeLinear, &[xt, s, zi]).ok()?;
                let za = self.b.splat(DType::U8, &rows, 90.0).ok()?;
                let zb = self.b.splat(DType::I8, &[m], 5.0).ok()?;
                let p = self.b.op1(OpKind::MatMulInteger, &[a, b, za, zb]).ok()?;
                self.b.op1(OpKind::Cast { to: dt }, &[p])
            }
            10 if r >= 2 => {
                let mut perm: Vec<u64> = (0..r as u64).collect();
                perm.swap(r - 2, r - 1);
                let xt = self.b.transpose(x, &perm).ok()?;
                self.b.matmul(x, xt)
            }
            11 if r >= 1 => {
                let axis = self.rng.below(r as u64) as i64;
                // Two different operands half the time (a join of two branches), else `x`
                // twice.
                let y = (self.floats.iter().copied().rev().take(16))
                    .find(|&y| y != x && self.ty(y) == t)
                    .filter(|_| self.rng.chance(0.5))
                    .unwrap_or(x);
                self.b.op1(OpKind::Concat { axis }, &[x, y])
            }
            12 if r >= 1 => {
                let mut starts = Vec::new();
                let mut ends = Vec::new();
                let mut steps = Vec::new();
                for &d in t.dims() {
                    let d = d as i64;
                    starts.push(self.rng.below(d as u64 + 2) as i64 - 1);
                    ends.push(self.rng.below(2 * d as u64 + 1) as i64 - d);
                    steps.push(*self.rng.pick(&[1, 1, 2, -1]));
                }
                let y = self.b.op1(
                    OpKind::Slice {
                        starts: starts.clone(),
                        ends: ends.clone(),
                        steps: steps.clone(),
                    },
                    &[x],
                );
                match y {
                    // The gradient op, fed the forward result as its cotangent.
                    Ok(y) if self.rng.chance(0.3) => self.b.op1(
                        OpKind::SliceGrad {
                            shape: t.dims().to_vec(),
                            starts,
                            ends,
                            steps,
                        },
                        &[y],
                    ),
                    y => y,
                }
            }
            13 => {
                let to = if t.dtype() == DType::F32 {
                    DType::F64
                } else {
                    DType::F32
                };
                let c = self.b.op1(OpKind::Cast { to }, &[x]).ok()?;
                if self.rng.chance(0.5) {
                    let i = self.b.op1(OpKind::Cast { to: DType::I32 }, &[c]).ok()?;
                    let i = self.b.unary(UnaryOp::Abs, i).ok()?;
                    self.b.op1(OpKind::Cast { to: t.dtype() }, &[i])
                } else {
                    Ok(c)
                }
            }
            14 if self.rng.chance(0.25) => {
                // Out to host memory and back: the host value is read by the `swap_in` alone.
                let h = self.b.op1(OpKind::SwapOut, &[x]).ok()?;
                self.b.op1(OpKind::SwapIn, &[h])
            }
            14 => {
                let kind = if self.rng.chance(0.5) {
                    OpKind::Identity
                } else {
                    OpKind::StopGradient
                };
                self.b.op1(kind, &[x])
            }
            15 => {
                let mut shape = vec![1 + self.rng.below(3)];
                shape.extend_from_slice(t.dims());
                self.b.op1(OpKind::BroadcastTo { shape }, &[x])
            }
            16 if r >= 1 && t.numel() > 0 => {
                let axis = self.rng.below(r as u64) as usize;
                let n = 1 + self.rng.below(4);
                let idx: Vec<Scalar> = (0..n)
                    .map(|_| Scalar::I64(self.rng.below(t.dims()[axis]) as i64))
                    .collect();
                let ity = TensorType::new(DType::I64, vec![n]).expect("small");
                let iv = self
                    .b
                    .constant(ity, Literal::dense(Data::from_scalars(DType::I64, idx)?))
                    .ok()?;
                let g = self
                    .b
                    .op1(OpKind::Gather { axis: axis as i64 }, &[x, iv])
                    .ok()?;
                if self.rng.chance(0.5) {
                    self.b
                        .op1(OpKind::ScatterAdd { axis: axis as i64 }, &[x, iv, g])
                } else {
                    Ok(g)
                }
            }
            17 if r >= 2 => {
                let c = t.dims()[1];
                let g = self.splat_like(t.dtype(), &[c]);
                let be = self.splat_like(t.dtype(), &[c]);
                let eps = F64(*self.rng.pick(&[1e-5, 1e-3]));
                if self.rng.chance(0.5) {
                    let res = self
                        .b
                        .op(OpKind::BatchNormTrain { eps }, &[x, g, be], Some("bn"))
                        .ok()?;
                    self.floats.extend_from_slice(&res[1..]);
                    Ok(res[0])
                } else {
                    let m = self.splat_like(t.dtype(), &[c]);
                    let var = self.splat_like(t.dtype(), &[c]);
                    self.b.op1(OpKind::BatchNorm { eps }, &[x, g, be, m, var])
                }
            }
            18 => {
                // Image ops on a fresh NCHW parameter.
                let ch = 1 + self.rng.below(3);
                let groups = if self.rng.chance(0.5) { ch } else { 1 };
                let (h, w) = (3 + self.rng.below(4), 3 + self.rng.below(4));
                let n = 1 + self.rng.below(2);
                let img = self.new_param(&[n, ch, h, w]);
                let dt = self.ty(img).dtype();
                let o = groups * (1 + self.rng.below(2));
                let filt = self
                    .b
                    .param(
                        "filter",
                        dt,
                        &[o, ch / groups, 1 + self.rng.below(3), 1 + self.rng.below(3)],
                    )
                    .ok()?;
                let k = [1 + self.rng.below(2), 1 + self.rng.below(2)];
                match self.rng.below(4) {
                    0 => {
                        let p = self.rng.below(2);
                        let c = Conv2d {
                            strides: [1 + self.rng.below(2), 1],
                            pads: [p, 0, p, 1],
                            dilations: [1, 1 + self.rng.below(2)],
                            groups,
                        };
                        let y = self.b.conv2d(img, filt, c.clone()).ok()?;
                        let (xs, ws) =
                            (self.ty(img).dims().to_vec(), self.ty(filt).dims().to_vec());
                        // The gradient ops, fed the forward result as the cotangent, or the
                        // convolution on channel blocks (from a blocked or a plain input).
                        match self.rng.below(5) {
                            0 if self.rng.chance(0.3) => {
                                // The convolution of the image quantized to u8 and the filter
                                // to i8 per output channel, back to floats.
                                let s = self.b.splat(dt, &[], self.rng.uniform(0.05, 0.5)).ok()?;
                                let zu = self.b.splat(DType::U8, &[], 120.0).ok()?;
                                let per = [o, 1, 1, 1];
                                let sw = self.b.splat(dt, &per, 0.1).ok()?;
                                let zi = self.b.splat(DType::I8, &per, -2.0).ok()?;
                                let q = OpKind::QuantizeLinear;
                                let qx = self.b.op1(q.clone(), &[img, s, zu]).ok()?;
                                let qw = self.b.op1(q, &[filt, sw, zi]).ok()?;
                                let k = OpKind::ConvInteger(c);
                                let acc = self.b.op1(k, &[qx, qw, zu, zi]).ok()?;
                                self.b.op1(OpKind::Cast { to: dt }, &[acc])
                            }
                            0 => Ok(y),
                            1 => self
                                .b
                                .op1(OpKind::Conv2dGradInput { conv: c, shape: xs }, &[y, filt]),
                            2 => self
                                .b
                                .op1(OpKind::Conv2dGradFilter { conv: c, shape: ws }, &[img, y]),
                            blocked => {
                                let block = 1 + self.rng.below(4);
                                let x = if blocked == 3 {
                                    self.b.op1(OpKind::ToNchwc { block }, &[img]).ok()?
                                } else {
                                    img
                                };
                                let k = OpKind::Conv2dNchwc { conv: c, block };
                                let yb = self.b.op1(k, &[x, filt]).ok()?;
                                if self.rng.chance(0.5) {
                                    Ok(yb)
                                } else {
                                    self.b.op1(OpKind::FromNchwc { channels: o }, &[yb])
                                }
                            }
                        }
                    }
                    1 => {
                        let p = Pool2d {
                            kernel: k,
                            strides: [1, 2],
                            pads: [0; 4],
                        };
                        let y = self.b.op1(OpKind::MaxPool2d(p.clone()), &[img]).ok()?;
                        if self.rng.chance(0.5) {
                            self.b.op1(OpKind::MaxPool2dGrad(p), &[img, y])
                        } else {
                            Ok(y)
                        }
                    }
                    2 => {
                        let p = Pool2d {
                            kernel: [2, 2],
                            strides: [2, 1],
                            pads: [1, 0, 1, 1],
                        };
                        let cip = self.rng.chance(0.5);
                        let y = self
                            .b
                            .op1(
                                OpKind::AvgPool2d {
                                    pool: p.clone(),
                                    count_include_pad: cip,
                                },
                                &[img],
                            )
                            .ok()?;
                        if self.rng.chance(0.5) {
                            let shape = self.ty(img).dims().to_vec();
                            self.b.op1(
                                OpKind::AvgPool2dGrad {
                                    pool: p,
                                    count_include_pad: cip,
                                    shape,
                                },
                                &[y],
                            )
                        } else {
                            Ok(y)
                        }
                    }
                    _ => self.b.op1(OpKind::GlobalAvgPool, &[img]),
                }
            }
            _ => {
                let dims = self.random_dims(3);
                Ok(self.new_param(&dims))
            }
        };
        let v = out.ok()?;
        if self.b.function().ty(v).dtype().is_float() {
            self.floats.push(v);
        }
        Some(v)
    }
}

/// A random well-typed function of about `n_ops` ops. The same seed gives the same function.
pub fn random_function(seed: u64, n_ops: usize) -> Function {
    let mut g = Gen {
        b: FunctionBuilder::new(&format!("rand{seed}")),
        rng: Rng::new(seed),
        floats: Vec::new(),
    };
    for _ in 0..1 + g.rng.below(3) {
        let dims = g.random_dims(3);
        g.new_param(&dims);
    }
    let mut scope_depth = 0;
    while g.b.function().schedule().len() < n_ops {
        if scope_depth < 3 && g.rng.chance(0.05) {
            g.b.push_scope(&format!("blk{}", g.rng.below(10)));
            scope_depth += 1;
        } else if scope_depth > 0 && g.rng.chance(0.05) {
            g.b.pop_scope();
            scope_depth -= 1;
        }
        let Some(v) = g.step() else { continue };
        if g.rng.chance(0.02) {
            // A name that needs quoting.
            let name = format!("odd name:{} \"é\"", g.rng.below(1000));
            g.b.rename(v, &name);
        }
        let n = g.b.function().schedule().len() as u64;
        if n > 0 && g.rng.chance(0.05) {
            let dep = g.b.function().schedule()[g.rng.below(n) as usize];
            if let Some(op) = g.b.function().def_op(v)
                && op != dep
                && !g.b.function().op(op).deps.contains(&dep)
            {
                g.b.add_control_dep(op, dep);
            }
        }
    }
    let n_res = 1 + g.rng.below(3) as usize;
    let mut results: Vec<Value> = Vec::new();
    for _ in 0..n_res {
        if let Some(v) = g.pick_float() {
            results.push(v);
        }
    }
    g.b.finish(&results)
        .expect("generated functions are well typed")
}

/// A tensor of random values: floats uniform in `[-1, 1)`, integers uniform in `[0, 8)`,
/// booleans fair coin flips.
pub fn random_tensor(ty: &TensorType, rng: &mut Rng) -> Tensor {
    let n = ty.numel() as usize;
    let mut unit = || rng.uniform(-1.0, 1.0);
    let data = match ty.dtype() {
        DType::F32 => Data::F32((0..n).map(|_| unit() as f32).collect()),
        DType::F64 => Data::F64((0..n).map(|_| unit()).collect()),
        DType::I8 => Data::I8((0..n).map(|_| ((unit() + 1.0) * 4.0) as i8).collect()),
        DType::U8 => Data::U8((0..n).map(|_| ((unit() + 1.0) * 4.0) as u8).collect()),
        DType::I32 => Data::I32((0..n).map(|_| ((unit() + 1.0) * 4.0) as i32).collect()),
        DType::I64 => Data::I64((0..n).map(|_| ((unit() + 1.0) * 4.0) as i64).collect()),
        DType::Bool => Data::Bool((0..n).map(|_| unit() >= 0.0).collect()),
    };
    Tensor::new(ty.clone(), data).expect("generated to fit")
}

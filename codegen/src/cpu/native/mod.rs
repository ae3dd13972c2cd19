//! Hand-written kernels for single ops the JIT does not generate: pooling and its gradients,
//! global average pooling, reductions over any axes, softmax over any axis, softmax
//! cross-entropy and batch norm (in `f32`), quantization (`quantize_linear`,
//! `dequantize_linear`, `matmul_integer`), and the data movement of any dtype: transposes,
//! slices, concatenations and gathers.
//!
//! They read and write the arena directly, like compiled kernels, and compute in `f32` (sums in
//! `f64` where a whole axis is accumulated). Anything else, and every other dtype, still runs on
//! the reference kernels.
//!
//! This file chooses the kernel for an op ([`Native::for_op`]) and runs it; the kernels live by
//! job: `pool.rs` (pooling and its gradients), `lines.rs` (work along lines: reductions,
//! softmax, cross-entropy, batch norm, `top_k`), `movement.rs` (byte copies of any dtype),
//! `quant.rs` (quantization).

#[cfg(target_arch = "x86_64")]
pub(crate) mod amx;
#[cfg(target_arch = "x86_64")]
mod avx2_conv;
#[cfg(target_arch = "x86_64")]
mod exact_depthwise;
#[cfg(target_arch = "x86_64")]
mod int8;
mod int_conv;
mod int_depthwise;
mod layout;
mod lines;
mod movement;
#[cfg(target_arch = "x86_64")]
mod plain;
mod pool;
mod quant;
mod requant;
#[cfg(target_arch = "x86_64")]
mod vnni_conv;

use movement::{SliceCopy, transpose};
pub(crate) use requant::moves as requant_moves;
use tcc_ir::ops::normalize_axis;
use tcc_ir::{DType, Function, Op, OpKind, Pool2d, ReduceOp, Value};

/// One op and the dims it runs at.
pub(crate) struct Native {
    op: Op,
    kind: Kind,
    args: Vec<Value>,
    results: Vec<Value>,
    /// Whether each result is stored (unused results of multi-result ops are not).
    stored: Vec<bool>,
}

enum Kind {
    Transpose {
        dims: Vec<usize>,
        perm: Vec<usize>,
    },
    Reduce {
        op: ReduceOp,
        dims: Vec<usize>,
        reduced: Vec<bool>,
    },
    MaxPool {
        p: Pool2d,
        xd: [usize; 4],
        yd: [usize; 4],
        /// The planes' loops compiled for AVX2 (the target has it).
        wide: bool,
    },
    /// `max_pool2d` of u8 or i8 levels (`signed`).
    MaxPoolBytes {
        p: Pool2d,
        xd: [usize; 4],
        yd: [usize; 4],
        signed: bool,
    },
    MaxPoolGrad {
        p: Pool2d,
        xd: [usize; 4],
        yd: [usize; 4],
    },
    AvgPool {
        p: Pool2d,
        include_pad: bool,
        xd: [usize; 4],
        yd: [usize; 4],
    },
    AvgPoolGrad {
        p: Pool2d,
        include_pad: bool,
        xd: [usize; 4],
        yd: [usize; 4],
    },
    CrossEntropy {
        rows: usize,
        classes: usize,
        labels: DType,
    },
    CrossEntropyGrad {
        rows: usize,
        classes: usize,
        labels: DType,
    },
    BatchNormTrain {
        eps: f64,
        n: usize,
        c: usize,
        inner: usize,
    },
    /// Softmax or log-softmax over the middle axis of `[outer, len, inner]` (the row kernels
    /// the JIT compiles take a contiguous last axis; this takes any).
    Softmax {
        log: bool,
        len: usize,
        inner: usize,
        /// Over contiguous f32 rows with AVX2 and FMA: [`lines::softmax_rows`].
        wide: bool,
    },
    /// `top_k` over the middle axis of `[outer, len, inner]`: values and `i64` indices.
    TopK {
        len: usize,
        inner: usize,
        k: usize,
        largest: bool,
    },
    /// Inference batch norm over `[N, c, inner]`.
    BatchNorm {
        eps: f64,
        c: usize,
        inner: usize,
    },
    /// A strided slice, as copies of contiguous runs (any dtype).
    Slice(SliceCopy),
    /// `take` along an axis: for each of `outer` rows and each index, a block of
    /// `block_bytes` (any dtype; indices i32 or i64, negative counting from the end).
    Gather {
        outer: usize,
        len: usize,
        block_bytes: usize,
        indices: DType,
        count: usize,
    },
    /// `to_nchwc` or `from_nchwc`.
    Reorder(layout::Reorder),
    /// Max (`avg` none) or average pooling over channel blocks; `wide`: f32 blocks of eight
    /// and AVX2.
    PoolBlocked {
        p: Pool2d,
        avg: Option<bool>,
        xd: [usize; 5],
        yd: [usize; 5],
        wide: bool,
    },
    /// `quantize_linear` of f32 into `u8` or (`signed`) `i8`; `wide`: with AVX2.
    Quantize {
        per: quant::Per,
        signed: bool,
        isa: int_depthwise::Isa,
    },
    /// `dequantize_linear` of `u8` or (`signed`) `i8` into f32.
    Dequantize {
        per: quant::Per,
        signed: bool,
    },
    /// `matmul_integer`; whether `a` and `b` are `i8`.
    MatMulInteger {
        product: quant::IntegerProduct,
        signed: [bool; 2],
    },
    /// `conv_integer`; whether `x` and `w` are `i8`; the requantizing chain merged into it.
    ConvInteger {
        conv: Box<int_conv::IntegerConv>,
        signed: [bool; 2],
        post: Option<requant::Requant>,
    },
    /// Concatenation: each of `outer` rows of the result is the operands' rows side by side,
    /// operand `i`'s row `row_bytes[i]` long (any dtype).
    Concat {
        outer: usize,
        row_bytes: Vec<usize>,
    },
}

fn dims(f: &Function, v: Value) -> Vec<usize> {
    f.ty(v).dims().iter().map(|&d| d as usize).collect()
}

fn dims4(f: &Function, v: Value) -> [usize; 4] {
    std::array::from_fn(|i| f.ty(v).dims()[i] as usize)
}

impl Native {
    /// The native kernel for `op`, if there is one for its kind and dtypes.
    pub(crate) fn for_op(
        f: &Function,
        op: Op,
        outputs: &[Value],
        features: &crate::cpu::Features,
    ) -> Option<Native> {
        let d = f.op(op);
        let x = d.args[0];
        let any_dtype = matches!(
            d.kind,
            OpKind::Transpose { .. }
                | OpKind::Slice { .. }
                | OpKind::Concat { .. }
                | OpKind::Gather { .. }
                | OpKind::ToNchwc { .. }
                | OpKind::FromNchwc { .. }
                | OpKind::DequantizeLinear
                | OpKind::MatMulInteger
                | OpKind::ConvInteger(_)
        ) || (matches!(d.kind, OpKind::MaxPool2d(_))
            && matches!(f.ty(x).dtype(), DType::U8 | DType::I8)
            && f.ty(x).rank() == 4);
        if f.ty(x).dtype() != DType::F32 && !any_dtype {
            return None;
        }
        let kind = match &d.kind {
            OpKind::BatchNorm { eps } => {
                let dm = dims(f, x);
                Kind::BatchNorm {
                    eps: eps.0,
                    c: dm[1],
                    inner: dm[2..].iter().product(),
                }
            }
            OpKind::Softmax { axis } | OpKind::LogSoftmax { axis } => {
                let dm = dims(f, x);
                let a = normalize_axis(*axis, dm.len())?;
                let log = matches!(d.kind, OpKind::LogSoftmax { .. });
                let inner = dm[a + 1..].iter().product();
                Kind::Softmax {
                    log,
                    len: dm[a],
                    inner,
                    wide: wide_softmax(f, op, features),
                }
            }
            OpKind::TopK { k, axis, largest } => {
                let dm = dims(f, x);
                let a = normalize_axis(*axis, dm.len())?;
                Kind::TopK {
                    len: dm[a],
                    inner: dm[a + 1..].iter().product(),
                    k: *k as usize,
                    largest: *largest,
                }
            }
            OpKind::GlobalAvgPool => {
                let [n, c, h, w] = dims4(f, x);
                Kind::Reduce {
                    op: ReduceOp::Mean,
                    dims: vec![n * c, h * w],
                    reduced: vec![false, true],
                }
            }
            OpKind::Slice {
                starts,
                ends,
                steps,
            } => Kind::Slice(SliceCopy::new(
                &dims(f, x),
                starts,
                ends,
                steps,
                f.ty(x).dtype().size_bytes() as usize,
            )),
            OpKind::Gather { axis } => {
                let dm = dims(f, x);
                let a = normalize_axis(*axis, dm.len())?;
                let size = f.ty(x).dtype().size_bytes() as usize;
                Kind::Gather {
                    outer: dm[..a].iter().product(),
                    len: dm[a],
                    block_bytes: dm[a + 1..].iter().product::<usize>() * size,
                    indices: f.ty(d.args[1]).dtype(),
                    count: f.ty(d.args[1]).numel() as usize,
                }
            }
            OpKind::Concat { axis } => {
                let out = dims(f, d.results[0]);
                let a = normalize_axis(*axis, out.len())?;
                let size = f.ty(x).dtype().size_bytes() as usize;
                Kind::Concat {
                    outer: out[..a].iter().product(),
                    row_bytes: (d.args.iter())
                        .map(|&v| dims(f, v)[a..].iter().product::<usize>() * size)
                        .collect(),
                }
            }
            OpKind::ToNchwc { .. } | OpKind::FromNchwc { .. } => {
                let to_blocked = matches!(d.kind, OpKind::ToNchwc { .. });
                let plain = dims(f, if to_blocked { x } else { d.results[0] });
                let blocked = dims(f, if to_blocked { d.results[0] } else { x });
                let b = blocked[blocked.len() - 1];
                let size = f.ty(x).dtype().size_bytes() as usize;
                Kind::Reorder(layout::Reorder {
                    to_blocked,
                    n: plain[0],
                    c: plain[1],
                    s: plain[2..].iter().product(),
                    b,
                    size,
                    wide: cfg!(target_arch = "x86_64")
                        && f.ty(x).dtype() == DType::F32
                        && b == 8
                        && features.avx2,
                })
            }
            OpKind::Transpose { perm } => Kind::Transpose {
                dims: dims(f, x),
                perm: perm.iter().map(|&p| p as usize).collect(),
            },
            OpKind::Reduce { op, axes, .. } => {
                let dm = dims(f, x);
                let mut flags = vec![false; dm.len()];
                for &a in axes {
                    flags[normalize_axis(a, dm.len())?] = true;
                }
                // Merge neighbouring axes that are both reduced or both kept: same result,
                // longer contiguous rows.
                let (mut dims_m, mut reduced): (Vec<usize>, Vec<bool>) = (Vec::new(), Vec::new());
                for (&d, &r) in dm.iter().zip(&flags) {
                    match (dims_m.last_mut(), reduced.last()) {
                        (Some(last), Some(&lr)) if lr == r => *last *= d,
                        _ => {
                            dims_m.push(d);
                            reduced.push(r);
                        }
                    }
                }
                Kind::Reduce {
                    op: *op,
                    dims: dims_m,
                    reduced,
                }
            }
            OpKind::MaxPool2d(p) | OpKind::AvgPool2d { pool: p, .. } if f.ty(x).rank() == 5 => {
                let dims5 = |v: Value| std::array::from_fn(|i| f.ty(v).dims()[i] as usize);
                Kind::PoolBlocked {
                    p: p.clone(),
                    avg: match d.kind {
                        OpKind::AvgPool2d {
                            count_include_pad, ..
                        } => Some(count_include_pad),
                        _ => None,
                    },
                    xd: dims5(x),
                    yd: dims5(d.results[0]),
                    wide: cfg!(target_arch = "x86_64") && f.ty(x).dims()[4] == 8 && features.avx2,
                }
            }
            OpKind::MaxPool2d(p) if f.ty(x).dtype() != DType::F32 => Kind::MaxPoolBytes {
                p: p.clone(),
                xd: dims4(f, x),
                yd: dims4(f, d.results[0]),
                signed: f.ty(x).dtype() == DType::I8,
            },
            OpKind::MaxPool2d(p) => Kind::MaxPool {
                p: p.clone(),
                xd: dims4(f, x),
                yd: dims4(f, d.results[0]),
                wide: cfg!(target_arch = "x86_64") && features.avx2,
            },
            OpKind::MaxPool2dGrad(p) => Kind::MaxPoolGrad {
                p: p.clone(),
                xd: dims4(f, x),
                yd: dims4(f, d.args[1]),
            },
            OpKind::AvgPool2d {
                pool,
                count_include_pad,
            } => Kind::AvgPool {
                p: pool.clone(),
                include_pad: *count_include_pad,
                xd: dims4(f, x),
                yd: dims4(f, d.results[0]),
            },
            OpKind::AvgPool2dGrad {
                pool,
                count_include_pad,
                ..
            } => Kind::AvgPoolGrad {
                p: pool.clone(),
                include_pad: *count_include_pad,
                xd: dims4(f, d.results[0]),
                yd: dims4(f, x),
            },
            OpKind::SoftmaxCrossEntropy => Kind::CrossEntropy {
                rows: dims(f, x)[0],
                classes: dims(f, x)[1],
                labels: f.ty(d.args[1]).dtype(),
            },
            OpKind::QuantizeLinear => Kind::Quantize {
                per: quant::Per::of(f.ty(d.args[1]).dims(), f.ty(x).dims())?,
                signed: quant::signed(f, d.results[0]),
                isa: match (
                    cfg!(target_arch = "x86_64"),
                    avx512(features),
                    features.avx2,
                ) {
                    (true, true, _) => int_depthwise::Isa::Avx512,
                    (true, _, true) => int_depthwise::Isa::Avx2,
                    _ => int_depthwise::Isa::Portable,
                },
            },
            OpKind::DequantizeLinear
                if f.ty(d.args[1]).dtype() == DType::F32
                    && matches!(f.ty(x).dtype(), DType::U8 | DType::I8) =>
            {
                Kind::Dequantize {
                    per: quant::Per::of(f.ty(d.args[1]).dims(), f.ty(x).dims())?,
                    signed: quant::signed(f, x),
                }
            }
            OpKind::MatMulInteger => {
                let args = [d.args[0], d.args[1], d.args[2], d.args[3]];
                #[allow(unused_mut)]
                let mut product = quant::IntegerProduct::of(
                    f,
                    args,
                    d.results[0],
                    (vnni(features), !vnni(features) && features.avx2),
                    features.avx_vnni,
                )?;
                let signed = [quant::signed(f, args[0]), quant::signed(f, args[1])];
                #[cfg(target_arch = "x86_64")]
                if let Some(b) = int_conv::const_bytes(f, args[1]) {
                    product.pack_constant_b(&b, signed[1]);
                }
                Kind::MatMulInteger { product, signed }
            }
            OpKind::ConvInteger(c) => {
                let args = [d.args[0], d.args[1], d.args[2], d.args[3]];
                Kind::ConvInteger {
                    conv: Box::new(int_conv::IntegerConv::of(
                        f,
                        c,
                        args,
                        d.results[0],
                        (vnni(features), !vnni(features) && features.avx2),
                        (features.avx_vnni, features.amx, features.fma),
                    )),
                    signed: [quant::signed(f, args[0]), quant::signed(f, args[1])],
                    post: None,
                }
            }
            OpKind::SoftmaxCrossEntropyGrad => Kind::CrossEntropyGrad {
                rows: dims(f, x)[0],
                classes: dims(f, x)[1],
                labels: f.ty(d.args[1]).dtype(),
            },
            OpKind::BatchNormTrain { eps } => {
                let dm = dims(f, x);
                Kind::BatchNormTrain {
                    eps: eps.0,
                    n: dm[0],
                    c: dm[1],
                    inner: dm[2..].iter().product(),
                }
            }
            _ => return None,
        };
        Some(Native {
            op,
            kind,
            args: d.args.clone(),
            results: d.results.clone(),
            stored: d.results.iter().map(|r| outputs.contains(r)).collect(),
        })
    }

    /// `conv_integer` `ops[0]` and the requantizing chain after it (`ops[1..]`, which
    /// [`requant::Requant::of`] accepts), as one step storing the chain's result.
    pub(crate) fn conv_chain(
        f: &Function,
        users: &tcc_ir::edit::Users,
        ops: &[Op],
        features: &crate::cpu::Features,
    ) -> Option<Native> {
        let (&op, chain) = ops.split_first()?;
        let mut n = Native::for_op(f, op, &f.op(op).results, features)?;
        // A residual is in the chain only where `Cpu::fuse` allowed it.
        let chain = requant::Requant::of(f, users, f.op(op).results[0], chain, &|_| true)?;
        let Kind::ConvInteger { post, conv, .. } = &mut n.kind else {
            return None;
        };
        if chain.residual.is_some() && !conv.on_vnni() {
            return None;
        }
        n.results = vec![chain.out];
        n.stored = vec![true];
        *post = Some(chain);
        Some(n)
    }

    /// The op it runs.
    pub(crate) fn op(&self) -> Op {
        self.op
    }

    /// Runs the op.
    ///
    /// # Safety
    /// `addr` gives storage of each operand's and result's type; results do not overlap
    /// operands (the memory planner only puts elementwise results in place).
    pub(crate) unsafe fn run(
        &self,
        f: &Function,
        addr: &dyn Fn(Value) -> *mut u8,
    ) -> Result<(), String> {
        let arg = |i: usize| addr(self.args[i]) as *const f32;
        let len = |v: Value| f.ty(v).numel() as usize;
        // Results nobody reads still need somewhere to go.
        let mut spare: Vec<Vec<f32>> = Vec::new();
        let ptrs: Vec<*mut f32> = self
            .results
            .iter()
            .zip(&self.stored)
            .map(|(&r, &stored)| {
                if stored {
                    addr(r) as *mut f32
                } else {
                    spare.push(vec![0.0; len(r)]);
                    spare.last_mut().expect("just pushed").as_mut_ptr()
                }
            })
            .collect();
        let res = |i: usize| ptrs[i];
        // SAFETY (every arm): the caller's contract; slices cover exactly each value's elements.
        unsafe {
            let input = |i: usize| std::slice::from_raw_parts(arg(i), len(self.args[i]));
            // Operand `i`'s bytes (a u8 or i8 tensor).
            let bytes = |i: usize| {
                std::slice::from_raw_parts(addr(self.args[i]) as *const u8, len(self.args[i]))
            };
            let output = |i: usize| std::slice::from_raw_parts_mut(res(i), len(self.results[i]));
            match &self.kind {
                Kind::Transpose { dims, perm } => {
                    let size = f.ty(self.args[0]).dtype().size_bytes() as usize;
                    transpose(addr(self.args[0]), addr(self.results[0]), dims, perm, size);
                }
                Kind::Reduce { op, dims, reduced } => {
                    lines::reduce(*op, input(0), output(0), dims, reduced)
                }
                Kind::MaxPool { p, xd, yd, wide } => {
                    pool::max_pool(p, (*xd, *yd), input(0), output(0), *wide)
                }
                Kind::MaxPoolBytes { p, xd, yd, signed } => {
                    let n = len(self.results[0]);
                    let out = std::slice::from_raw_parts_mut(res(0) as *mut u8, n);
                    if *signed {
                        let x =
                            std::slice::from_raw_parts(bytes(0).as_ptr().cast(), bytes(0).len());
                        let out = std::slice::from_raw_parts_mut(out.as_mut_ptr().cast(), n);
                        pool::max_pool_int::<i8>(p, *xd, *yd, x, out, i8::MIN);
                    } else {
                        pool::max_pool_int::<u8>(p, *xd, *yd, bytes(0), out, 0);
                    }
                }
                Kind::MaxPoolGrad { p, xd, yd } => {
                    pool::max_pool_grad(p, *xd, *yd, input(0), input(1), output(0));
                }
                Kind::AvgPool {
                    p,
                    include_pad,
                    xd,
                    yd,
                } => pool::avg_pool(p, *include_pad, *xd, *yd, input(0), output(0)),
                Kind::AvgPoolGrad {
                    p,
                    include_pad,
                    xd,
                    yd,
                } => pool::avg_pool_grad(p, *include_pad, *xd, *yd, input(0), output(0)),
                Kind::CrossEntropy {
                    rows,
                    classes,
                    labels,
                } => {
                    let ls = lines::read_labels(addr(self.args[1]), *labels, *rows, *classes)?;
                    output(0)[0] = lines::cross_entropy(input(0), &ls, *classes);
                }
                Kind::CrossEntropyGrad {
                    rows,
                    classes,
                    labels,
                } => {
                    let ls = lines::read_labels(addr(self.args[1]), *labels, *rows, *classes)?;
                    lines::cross_entropy_grad(input(0), &ls, *classes, input(2)[0], output(0));
                }
                Kind::Softmax {
                    log,
                    len,
                    inner,
                    wide,
                } => {
                    #[cfg(target_arch = "x86_64")]
                    if *wide {
                        // SAFETY: `wide` means AVX2 and FMA, contiguous rows of `len`.
                        lines::softmax_rows(input(0), output(0), *len, *log);
                    } else {
                        lines::softmax(input(0), output(0), *len, *inner, *log)
                    }
                    #[cfg(not(target_arch = "x86_64"))]
                    {
                        let _ = wide;
                        lines::softmax(input(0), output(0), *len, *inner, *log)
                    }
                }
                Kind::TopK {
                    len,
                    inner,
                    k,
                    largest,
                } => {
                    let index = lines::top_k(input(0), output(0), [*len, *inner, *k], *largest);
                    if self.stored[1] {
                        let dst = addr(self.results[1]) as *mut i64;
                        std::ptr::copy_nonoverlapping(index.as_ptr(), dst, index.len());
                    }
                }
                Kind::BatchNorm { eps, c, inner } => {
                    let stats = [input(1), input(2), input(3), input(4)];
                    lines::batch_norm(input(0), stats, output(0), *eps, *c, *inner);
                }
                Kind::BatchNormTrain { eps, n, c, inner } => {
                    let outs = [output(0), output(1), output(2)];
                    lines::batch_norm_train(
                        input(0),
                        [input(1), input(2)],
                        outs,
                        *eps,
                        [*n, *c, *inner],
                    );
                }
                Kind::Slice(copy) => copy.run(addr(self.args[0]), addr(self.results[0])),
                Kind::Gather {
                    outer,
                    len,
                    block_bytes,
                    indices,
                    count,
                } => movement::gather(
                    addr(self.args[0]),
                    addr(self.args[1]),
                    addr(self.results[0]),
                    *indices,
                    *count,
                    *outer,
                    *len,
                    *block_bytes,
                )?,
                Kind::Reorder(r) => r.run(addr(self.args[0]), addr(self.results[0])),
                Kind::PoolBlocked {
                    p,
                    avg,
                    xd,
                    yd,
                    wide,
                } => pool::pool_blocked(p, *avg, [*xd, *yd], *wide, input(0), output(0)),
                Kind::Concat { outer, row_bytes } => {
                    let srcs: Vec<*const u8> =
                        self.args.iter().map(|&v| addr(v) as *const u8).collect();
                    movement::concat(&srcs, addr(self.results[0]), *outer, row_bytes);
                }
                Kind::Quantize { per, signed, isa } => {
                    let zero = quant::levels(bytes(2), *signed);
                    let out =
                        std::slice::from_raw_parts_mut(res(0) as *mut u8, len(self.results[0]));
                    quant::quantize(input(0), input(1), &zero, *per, *signed, *isa, out)?;
                }
                Kind::Dequantize { per, signed } => {
                    let zero = quant::levels(bytes(2), *signed);
                    quant::dequantize(bytes(0), *signed, input(1), &zero, *per, output(0))?;
                }
                Kind::MatMulInteger { product, signed } => {
                    let out =
                        std::slice::from_raw_parts_mut(res(0) as *mut i32, len(self.results[0]));
                    product.run_bytes([bytes(0), bytes(1), bytes(2), bytes(3)], *signed, out);
                }
                Kind::ConvInteger { conv, signed, post } => {
                    let values = |v: tcc_ir::Value| {
                        std::slice::from_raw_parts(addr(v) as *const f32, len(v))
                    };
                    let mut bound = match post {
                        Some(p) => Some(requant::Bound {
                            scale: p.scale.map(|s| values(s.value)),
                            bias: p.bias.map(|b| values(b.value)),
                            residual: p.residual.map(values),
                            relu: p.relu,
                            lower: p.lower.map(|c| (values(c.value)[0], c.chain_first)),
                            upper: p.upper.map(|c| (values(c.value)[0], c.chain_first)),
                            quantize: match p.quantize {
                                Some((s, z, signed)) => {
                                    let s = values(s)[0];
                                    quant::checked(&[s])?;
                                    let z = *(addr(z) as *const u8);
                                    let z = if signed { z as i8 as i32 } else { z as i32 };
                                    Some((s, z, signed))
                                }
                                None => None,
                            },
                            plain: None,
                        }),
                        None => None,
                    };
                    if let Some(b) = bound.as_mut() {
                        b.plain = b.plain_reciprocal();
                    }
                    let inputs = [bytes(0), bytes(1), bytes(2), bytes(3)];
                    conv.run_bytes(inputs, *signed, bound.as_ref(), res(0) as *mut u8);
                }
            }
        }
        Ok(())
    }
}

/// Whether integer products run on AVX-512 VNNI: [`avx512`], and the CPU has AVX-512 VNNI
/// (with BMI2, which every such CPU has and the convolution's packing uses).
pub(crate) fn vnni(features: &crate::cpu::Features) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        avx512(features)
            && features.vnni
            && std::is_x86_feature_detected!("avx512vnni")
            && std::is_x86_feature_detected!("bmi2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = features;
        false
    }
}

/// Whether the quantization kernels run on AVX-512: the target has AVX-512F (`host,-avx512f`
/// turns it off) and the CPU BW, VL and DQ (every CPU with AVX-512 VNNI has them; the
/// requantizing stores use DQ's `vreduceps`).
fn avx512(features: &crate::cpu::Features) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        features.avx512f
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512vl")
            && std::is_x86_feature_detected!("avx512dq")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = features;
        false
    }
}

/// Whether softmax op `op` runs on [`lines::softmax_rows`]: `softmax` or `log_softmax` of f32
/// over the last axis, on a target with AVX2 and FMA. The compiler prefers that to the JIT's
/// row kernel for a kernel that is this op alone: the JIT's `exp` in 4-lane vectors, computed
/// in two of its three passes, took 4 ns an element.
pub(in crate::cpu) fn wide_softmax(f: &Function, op: Op, features: &crate::cpu::Features) -> bool {
    let d = f.op(op);
    let (OpKind::Softmax { axis } | OpKind::LogSoftmax { axis }) = d.kind else {
        return false;
    };
    let ty = f.ty(d.args[0]);
    let rank = ty.dims().len() as i64;
    cfg!(target_arch = "x86_64")
        && features.avx2
        && features.fma
        && ty.dtype() == DType::F32
        && rank > 0
        && (axis == -1 || axis == rank - 1)
}

/// Calls `work((plane, chunk))` for each `plane`-element chunk of `out`, in parallel when `out`
/// is large enough to pay for it.
pub(super) fn for_planes<T: Send>(
    out: &mut [T],
    plane: usize,
    work: impl Fn((usize, &mut [T])) + Sync + Send,
) {
    let plane = plane.max(1);
    if out.len() >= 1 << 14 {
        let len = out.len();
        // SAFETY: each job takes its own chunk of `out`.
        let base = unsafe { crate::cpu::send_ptr::SendPtr::new(out.as_mut_ptr()) };
        crate::cpu::pool::for_each(len.div_ceil(plane), &|i| {
            let end = ((i + 1) * plane).min(len);
            // SAFETY: chunk i of `out`, touched by this job only.
            let chunk = unsafe {
                std::slice::from_raw_parts_mut(base.get().add(i * plane), end - i * plane)
            };
            work((i, chunk))
        });
    } else {
        out.chunks_mut(plane).enumerate().for_each(work);
    }
}

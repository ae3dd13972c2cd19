//! Hand-written kernels for single ops the JIT does not generate: pooling and its gradients,
//! global average pooling, reductions over any axes, softmax over any axis, softmax
//! cross-entropy and batch norm (in `f32`), and the data movement of any dtype: transposes,
//! slices, concatenations and gathers.
//!
//! They read and write the arena directly, like compiled kernels, and compute in `f32` (sums in
//! `f64` where a whole axis is accumulated). Anything else, and every other dtype, still runs on
//! the reference kernels.

use rayon::prelude::*;
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
    pub(crate) fn for_op(f: &Function, op: Op, outputs: &[Value]) -> Option<Native> {
        let d = f.op(op);
        let x = d.args[0];
        let any_dtype = matches!(
            d.kind,
            OpKind::Transpose { .. }
                | OpKind::Slice { .. }
                | OpKind::Concat { .. }
                | OpKind::Gather { .. }
        );
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
                Kind::Softmax {
                    log: matches!(d.kind, OpKind::LogSoftmax { .. }),
                    len: dm[a],
                    inner: dm[a + 1..].iter().product(),
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
            OpKind::MaxPool2d(p) => Kind::MaxPool {
                p: p.clone(),
                xd: dims4(f, x),
                yd: dims4(f, d.results[0]),
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
            let output = |i: usize| std::slice::from_raw_parts_mut(res(i), len(self.results[i]));
            match &self.kind {
                Kind::Transpose { dims, perm } => {
                    let size = f.ty(self.args[0]).dtype().size_bytes() as usize;
                    transpose(addr(self.args[0]), addr(self.results[0]), dims, perm, size);
                }
                Kind::Reduce { op, dims, reduced } => {
                    reduce(*op, input(0), output(0), dims, reduced)
                }
                Kind::MaxPool { p, xd, yd } if tiles(p) => {
                    max_pool_tiled(p, *xd, *yd, input(0), output(0));
                }
                Kind::MaxPool { p, xd, yd } => max_pool_rows(p, *xd, *yd, input(0), output(0)),
                Kind::MaxPoolGrad { p, xd, yd } if tiles(p) => {
                    max_pool_grad_tiled(p, *xd, *yd, input(0), input(1), output(0));
                }
                Kind::MaxPoolGrad { p, xd, yd } => {
                    let (x, dy) = (input(0), input(1));
                    pool_backward(p, *xd, *yd, dy, output(0), |b, w, g, dx| {
                        // The first position holding the maximum (NaN counts as the maximum).
                        let plane = &x[b..b + dx.len()];
                        let mut best = usize::MAX;
                        let mut m = f32::NEG_INFINITY;
                        w.each(|i| {
                            let v = plane[i];
                            if best == usize::MAX || v > m || (v.is_nan() && !m.is_nan()) {
                                best = i;
                                m = v;
                            }
                        });
                        dx[best] += g;
                    });
                }
                Kind::AvgPool {
                    p,
                    include_pad,
                    xd,
                    yd,
                } => {
                    let full = (p.kernel[0] * p.kernel[1]) as f32;
                    pool_forward(p, *xd, *yd, input(0), output(0), |plane, w| {
                        let mut s = 0.0f32;
                        w.each(|i| s += plane[i]);
                        s / if *include_pad { full } else { w.count() as f32 }
                    });
                }
                Kind::AvgPoolGrad {
                    p,
                    include_pad,
                    xd,
                    yd,
                } => {
                    let full = (p.kernel[0] * p.kernel[1]) as f32;
                    pool_backward(p, *xd, *yd, input(0), output(0), |_, w, g, dx| {
                        let g = g / if *include_pad { full } else { w.count() as f32 };
                        w.each(|i| dx[i] += g);
                    });
                }
                Kind::CrossEntropy {
                    rows,
                    classes,
                    labels,
                } => {
                    let x = input(0);
                    let ls = read_labels(addr(self.args[1]), *labels, *rows, *classes)?;
                    let mut total = 0.0f64;
                    for (r, &l) in ls.iter().enumerate() {
                        let row = &x[r * classes..(r + 1) * classes];
                        let m = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                        let s: f64 = row.iter().map(|&v| ((v - m) as f64).exp()).sum();
                        total -= (row[l] - m) as f64 - s.ln();
                    }
                    output(0)[0] = (total / *rows as f64) as f32;
                }
                Kind::CrossEntropyGrad {
                    rows,
                    classes,
                    labels,
                } => {
                    let (x, dy, dx) = (input(0), input(2)[0], output(0));
                    let ls = read_labels(addr(self.args[1]), *labels, *rows, *classes)?;
                    let k = dy / *rows as f32;
                    for (r, &l) in ls.iter().enumerate() {
                        let row = &x[r * classes..(r + 1) * classes];
                        let out = &mut dx[r * classes..(r + 1) * classes];
                        let m = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                        let mut s = 0.0f32;
                        for (o, &v) in out.iter_mut().zip(row) {
                            *o = (v - m).exp();
                            s += *o;
                        }
                        let scale = k / s;
                        out.iter_mut().for_each(|o| *o *= scale);
                        out[l] -= k;
                    }
                }
                Kind::Softmax { log, len, inner } => {
                    let x = input(0);
                    let (len, inner) = (*len, *inner);
                    for_planes(output(0), len * inner, |(o, y)| {
                        let xs = &x[o * len * inner..(o + 1) * len * inner];
                        for i in 0..inner {
                            // NaN anywhere in the row makes the row NaN, as in the reference.
                            let m = (0..len).map(|j| xs[j * inner + i]).fold(
                                f32::NEG_INFINITY,
                                |m, v| {
                                    if m.is_nan() || !(v.is_nan() || v > m) {
                                        m
                                    } else {
                                        v
                                    }
                                },
                            );
                            let s: f64 = (0..len)
                                .map(|j| ((xs[j * inner + i] - m) as f64).exp())
                                .sum();
                            for j in 0..len {
                                let d = (xs[j * inner + i] - m) as f64;
                                y[j * inner + i] =
                                    if *log { d - s.ln() } else { d.exp() / s } as f32;
                            }
                        }
                    });
                }
                Kind::TopK {
                    len,
                    inner,
                    k,
                    largest,
                } => {
                    let (x, (len, inner, k)) = (input(0), (*len, *inner, *k));
                    let lines = x.len().checked_div(len * inner).unwrap_or(0);
                    let mut index = vec![0i64; lines * k * inner];
                    let values = output(0);
                    let mut line: Vec<usize> = Vec::with_capacity(len);
                    for o in 0..lines {
                        for i in 0..inner {
                            let at = |j: usize| x[(o * len + j) * inner + i];
                            line.clear();
                            line.extend(0..len);
                            // By value (NaN above every number), ties by index, as the
                            // reference orders them.
                            let by = |p: &usize, q: &usize| {
                                let (a, b) = (at(*p), at(*q));
                                let c = match (a.is_nan(), b.is_nan()) {
                                    (true, true) => std::cmp::Ordering::Equal,
                                    (true, false) => std::cmp::Ordering::Greater,
                                    (false, true) => std::cmp::Ordering::Less,
                                    _ => a.partial_cmp(&b).expect("not NaN"),
                                };
                                if *largest { c.reverse() } else { c }.then(p.cmp(q))
                            };
                            if k < len {
                                line.select_nth_unstable_by(k, by);
                                line.truncate(k);
                            }
                            line.sort_by(by);
                            for (r, &j) in line.iter().take(k).enumerate() {
                                values[(o * k + r) * inner + i] = at(j);
                                index[(o * k + r) * inner + i] = j as i64;
                            }
                        }
                    }
                    if self.stored[1] {
                        let dst = addr(self.results[1]) as *mut i64;
                        std::ptr::copy_nonoverlapping(index.as_ptr(), dst, index.len());
                    }
                }
                Kind::BatchNorm { eps, c, inner } => {
                    let (x, g, b, m, v) = (input(0), input(1), input(2), input(3), input(4));
                    // (x - mean) * scale + beta in f64, rounded once, as the reference does.
                    let scale: Vec<f64> = (0..*c)
                        .map(|ch| g[ch] as f64 / (v[ch] as f64 + eps).sqrt())
                        .collect();
                    for_planes(output(0), *inner, |(p, y)| {
                        let ch = p % c;
                        let (s, mu, beta) = (scale[ch], m[ch] as f64, b[ch] as f64);
                        let xs = &x[p * inner..(p + 1) * inner];
                        for (yo, &xv) in y.iter_mut().zip(xs) {
                            *yo = ((xv as f64 - mu) * s + beta) as f32;
                        }
                    });
                }
                Kind::Slice(copy) => copy.run(addr(self.args[0]), addr(self.results[0])),
                Kind::Gather {
                    outer,
                    len,
                    block_bytes,
                    indices,
                    count,
                } => {
                    let ids = addr(self.args[1]);
                    let rows: Vec<usize> = (0..*count)
                        .map(|j| {
                            let i = match indices {
                                DType::I32 => *(ids as *const i32).add(j) as i64,
                                _ => *(ids as *const i64).add(j),
                            };
                            let k = if i < 0 { i + *len as i64 } else { i };
                            usize::try_from(k)
                                .ok()
                                .filter(|&k| k < *len)
                                .ok_or_else(|| {
                                    format!("index {i} is out of range for an axis of size {len}")
                                })
                        })
                        .collect::<Result<_, _>>()?;
                    let (src, dst) = (addr(self.args[0]), addr(self.results[0]));
                    let mut to = 0;
                    for o in 0..*outer {
                        for &k in &rows {
                            let from = (o * len + k) * block_bytes;
                            std::ptr::copy_nonoverlapping(src.add(from), dst.add(to), *block_bytes);
                            to += block_bytes;
                        }
                    }
                }
                Kind::Concat { outer, row_bytes } => {
                    let total: usize = row_bytes.iter().sum();
                    let dst = addr(self.results[0]);
                    let mut at = 0;
                    for (i, &row) in row_bytes.iter().enumerate() {
                        let src = addr(self.args[i]);
                        for o in 0..*outer {
                            std::ptr::copy_nonoverlapping(
                                src.add(o * row),
                                dst.add(o * total + at),
                                row,
                            );
                        }
                        at += row;
                    }
                }
                Kind::BatchNormTrain { eps, n, c, inner } => {
                    let (x, g, b) = (input(0), input(1), input(2));
                    let (y, mean, var) = (output(0), output(1), output(2));
                    let m = (n * inner) as f64;
                    for ch in 0..*c {
                        let plane =
                            |b_: usize| &x[(b_ * c + ch) * inner..(b_ * c + ch + 1) * inner];
                        let s: f64 = (0..*n)
                            .map(|b_| plane(b_).iter().map(|&v| v as f64).sum::<f64>())
                            .sum();
                        let mu = s / m;
                        let ss: f64 = (0..*n)
                            .map(|b_| {
                                plane(b_)
                                    .iter()
                                    .map(|&v| (v as f64 - mu).powi(2))
                                    .sum::<f64>()
                            })
                            .sum();
                        let va = ss / m;
                        mean[ch] = mu as f32;
                        var[ch] = va as f32;
                        // (x - mean) * scale + beta in f64, rounded once: the scale is large when
                        // the variance is tiny, and f32 rounding of x - mean would show.
                        let scale = g[ch] as f64 / (va + eps).sqrt();
                        let shift = b[ch] as f64;
                        for b_ in 0..*n {
                            let o = (b_ * c + ch) * inner;
                            for (yo, &xv) in y[o..o + inner].iter_mut().zip(plane(b_)) {
                                *yo = ((xv as f64 - mu) * scale + shift) as f32;
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// A strided slice as copies of contiguous runs: the trailing axes the slice takes whole merge
/// into one block, so slicing channels of NCHW copies one run per image.
struct SliceCopy {
    /// Per outer axis (those before the innermost sliced one): count and input stride, in bytes.
    outer: Vec<(usize, usize)>,
    /// Input byte offset of the first element.
    start: usize,
    /// Runs per outer index, the input stride between them and each run's bytes.
    runs: usize,
    run_stride: usize,
    run_bytes: usize,
}

impl SliceCopy {
    fn new(dims: &[usize], starts: &[i64], ends: &[i64], steps: &[i64], size: usize) -> SliceCopy {
        let r = dims.len();
        let mut stride = vec![size; r];
        for i in (0..r.saturating_sub(1)).rev() {
            stride[i] = stride[i + 1] * dims[i + 1];
        }
        let axes: Vec<(usize, usize, i64)> = (0..r)
            .map(|i| {
                let step = steps.get(i).copied().unwrap_or(1);
                let (s, n) = tcc_ir::typing::slice_range(dims[i] as u64, starts[i], ends[i], step);
                (s.max(0) as usize, n as usize, step)
            })
            .collect();
        let start: usize = axes.iter().zip(&stride).map(|(a, st)| a.0 * st).sum();
        // The innermost axis not taken whole; everything after it is one block.
        let k = (0..r).rev().find(|&i| axes[i] != (0, dims[i], 1));
        let Some(k) = k else {
            let bytes = dims.iter().product::<usize>() * size;
            return SliceCopy {
                outer: Vec::new(),
                start: 0,
                runs: 1,
                run_stride: 0,
                run_bytes: bytes,
            };
        };
        let block = stride[k];
        let (_, count, step) = axes[k];
        let (runs, run_stride, run_bytes) = if step == 1 {
            (1, 0, count * block)
        } else {
            (count, (step as isize as usize).wrapping_mul(block), block)
        };
        SliceCopy {
            outer: (0..k)
                .map(|i| {
                    (
                        axes[i].1,
                        (axes[i].2 as isize as usize).wrapping_mul(stride[i]),
                    )
                })
                .collect(),
            start,
            runs,
            run_stride,
            run_bytes,
        }
    }

    /// Copies the slice of `src` to `dst`.
    ///
    /// # Safety
    /// `src` holds the sliced tensor and `dst` the result; they do not overlap.
    unsafe fn run(&self, src: *const u8, dst: *mut u8) {
        let total: usize = self.outer.iter().map(|o| o.0).product();
        if total == 0 || self.runs == 0 || self.run_bytes == 0 {
            return;
        }
        let mut idx = vec![0usize; self.outer.len()];
        let mut from = self.start;
        let mut to = 0usize;
        for _ in 0..total {
            let mut at = from;
            for _ in 0..self.runs {
                // SAFETY: the offsets stay inside the tensors: they walk the slice's elements
                // (negative steps wrap `usize` and wrap back, as two's complement does).
                unsafe {
                    std::ptr::copy_nonoverlapping(src.add(at), dst.add(to), self.run_bytes);
                }
                at = at.wrapping_add(self.run_stride);
                to += self.run_bytes;
            }
            for ax in (0..idx.len()).rev() {
                let (n, st) = self.outer[ax];
                idx[ax] += 1;
                from = from.wrapping_add(st);
                if idx[ax] < n {
                    break;
                }
                from = from.wrapping_sub(st.wrapping_mul(n));
                idx[ax] = 0;
            }
        }
    }
}

/// The real (unpadded) part of one pooling window inside its plane.
struct Window {
    y: std::ops::Range<usize>,
    x: std::ops::Range<usize>,
    w: usize,
}

impl Window {
    /// Calls `f` with the in-plane index of each element, row-major.
    #[inline]
    fn each(&self, mut f: impl FnMut(usize)) {
        for iy in self.y.clone() {
            for ix in self.x.clone() {
                f(iy * self.w + ix);
            }
        }
    }

    fn count(&self) -> usize {
        self.y.len() * self.x.len()
    }
}

/// The window of output `(oy, ox)` of a plane of height `h` and width `w`.
#[inline]
fn window(p: &Pool2d, h: usize, w: usize, oy: usize, ox: usize) -> Window {
    let span = |o: usize, i: usize, n: usize| {
        let lo = (o * p.strides[i] as usize) as isize - p.pads[i] as isize;
        let hi = (lo + p.kernel[i] as isize).min(n as isize);
        lo.max(0) as usize..hi.max(0) as usize
    };
    Window {
        y: span(oy, 0, h),
        x: span(ox, 1, w),
        w,
    }
}

/// The class index of each row, checked against the number of classes.
///
/// # Safety
/// `labels` holds `rows` elements of `dtype` (i32 or i64).
unsafe fn read_labels(
    labels: *const u8,
    dtype: DType,
    rows: usize,
    classes: usize,
) -> Result<Vec<usize>, String> {
    (0..rows)
        .map(|r| {
            // SAFETY: r < rows (the caller's contract).
            let l = unsafe {
                match dtype {
                    DType::I32 => *(labels as *const i32).add(r) as i64,
                    _ => *(labels as *const i64).add(r),
                }
            };
            usize::try_from(l)
                .ok()
                .filter(|&l| l < classes)
                .ok_or_else(|| {
                    format!("label {l} in row {r} is out of range for {classes} classes")
                })
        })
        .collect()
}

/// Calls `work((plane, chunk))` for each `plane`-element chunk of `out`, in parallel when `out`
/// is large enough to pay for it.
fn for_planes(out: &mut [f32], plane: usize, work: impl Fn((usize, &mut [f32])) + Sync + Send) {
    if out.len() >= 1 << 14 {
        out.par_chunks_mut(plane.max(1)).enumerate().for_each(work);
    } else {
        out.chunks_mut(plane.max(1)).enumerate().for_each(work);
    }
}

/// Whether pooling windows tile the input: no padding and strides equal to the window, so each
/// input element is in at most one window.
fn tiles(p: &Pool2d) -> bool {
    p.pads == [0; 4] && p.strides == p.kernel
}

/// The sum of `xs` with eight running partial sums, so that it vectorises.
fn sum(xs: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut chunks = xs.chunks_exact(8);
    for c in &mut chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += v;
        }
    }
    let tail: f32 = chunks.remainder().iter().sum();
    acc.iter().sum::<f32>() + tail
}

/// Whether any element is NaN (branch-free, so it vectorises).
fn has_nan(xs: &[f32]) -> bool {
    xs.iter().fold(false, |a, v| a | v.is_nan())
}

/// `max_pool2d` with padding or overlapping windows, planes in parallel. A plane without NaN is
/// done row by row: for each window tap, one vectorisable maximum over the span of the output
/// row whose tap is inside the image (input rows split by column phase when the stride is
/// larger than one, so the span reads contiguous input). A plane holding a NaN takes the exact
/// path, window by window, where NaN wins.
fn max_pool_rows(p: &Pool2d, xd: [usize; 4], yd: [usize; 4], x: &[f32], y: &mut [f32]) {
    let [_, _, h, w] = xd;
    let [_, _, oh, ow] = yd;
    let (kh, kw) = (p.kernel[0] as usize, p.kernel[1] as usize);
    let (sy, s) = (p.strides[0] as usize, p.strides[1] as usize);
    let (py, px) = (p.pads[0] as isize, p.pads[1] as isize);
    let (xs, ys) = (h * w, oh * ow);
    let pw = w.div_ceil(s);
    let spans = super::conv::phase_spans(kw, 1, px, s, (h, w, ow));
    let work = |(plane, out): (usize, &mut [f32])| {
        let xp = &x[plane * xs..(plane + 1) * xs];
        if has_nan(xp) {
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut m = f32::NEG_INFINITY;
                    window(p, h, w, oy, ox).each(|i| {
                        let v = xp[i];
                        if v > m || v.is_nan() {
                            m = v;
                        }
                    });
                    out[oy * ow + ox] = m;
                }
            }
            return;
        }
        let split;
        let src: &[f32] = if s == 1 {
            xp
        } else {
            split = super::conv::phase_split(xp, h, w, s);
            &split
        };
        for oy in 0..oh {
            let orow = &mut out[oy * ow..(oy + 1) * ow];
            orow.fill(f32::NEG_INFINITY);
            for ky in 0..kh {
                let iy = (oy * sy + ky) as isize - py;
                if iy < 0 || iy >= h as isize {
                    continue;
                }
                for &(lo, hi, start) in &spans {
                    if hi > lo {
                        let base = start + iy as usize * pw;
                        for (o, &v) in orow[lo..hi].iter_mut().zip(&src[base..base + (hi - lo)]) {
                            *o = o.max(v);
                        }
                    }
                }
            }
        }
    };
    for_planes(y, ys, work);
}

/// `max_pool2d` for tiling windows: row by row of windows, planes in parallel.
fn max_pool_tiled(p: &Pool2d, xd: [usize; 4], yd: [usize; 4], x: &[f32], y: &mut [f32]) {
    let [_, _, h, w] = xd;
    let [_, _, oh, ow] = yd;
    let (kh, kw) = (p.kernel[0] as usize, p.kernel[1] as usize);
    let (xs, ys) = (h * w, oh * ow);
    let work = |(plane, out): (usize, &mut [f32])| {
        let xp = &x[plane * xs..(plane + 1) * xs];
        // Branch-free maxima (random data defeats branch prediction); a plane holding a NaN
        // takes the exact path, where NaN wins.
        let nan = has_nan(xp);
        if kh == 2 && kw == 2 && !nan {
            // The common 2x2 case as one expression per output, which vectorises.
            for oy in 0..oh {
                let r0 = &xp[2 * oy * w..2 * oy * w + 2 * ow];
                let r1 = &xp[(2 * oy + 1) * w..(2 * oy + 1) * w + 2 * ow];
                let orow = &mut out[oy * ow..(oy + 1) * ow];
                for (ox, o) in orow.iter_mut().enumerate() {
                    let a = r0[2 * ox].max(r0[2 * ox + 1]);
                    let b = r1[2 * ox].max(r1[2 * ox + 1]);
                    *o = a.max(b);
                }
            }
            return;
        }
        for oy in 0..oh {
            let orow = &mut out[oy * ow..(oy + 1) * ow];
            orow.fill(f32::NEG_INFINITY);
            for ky in 0..kh {
                let irow = &xp[(oy * kh + ky) * w..(oy * kh + ky) * w + ow * kw];
                for (o, win) in orow.iter_mut().zip(irow.chunks_exact(kw)) {
                    for &v in win {
                        if nan {
                            if v > *o || v.is_nan() {
                                *o = v;
                            }
                        } else {
                            *o = o.max(v);
                        }
                    }
                }
            }
        }
    };
    for_planes(y, ys, work);
}

/// `max_pool2d_grad` for tiling windows: each window's gradient is written at its first
/// maximum and zeros around it, plane by plane in parallel.
fn max_pool_grad_tiled(
    p: &Pool2d,
    xd: [usize; 4],
    yd: [usize; 4],
    x: &[f32],
    dy: &[f32],
    dx: &mut [f32],
) {
    let [_, _, h, w] = xd;
    let [_, _, oh, ow] = yd;
    let (kh, kw) = (p.kernel[0] as usize, p.kernel[1] as usize);
    let (xs, ys) = (h * w, oh * ow);
    let work = |(plane, out): (usize, &mut [f32])| {
        let xp = &x[plane * xs..(plane + 1) * xs];
        let g = &dy[plane * ys..(plane + 1) * ys];
        // Rows and columns past the last window get nothing.
        if oh * kh < h || ow * kw < w {
            out.fill(0.0);
        }
        let nan = has_nan(xp);
        for oy in 0..oh {
            for ox in 0..ow {
                let base = oy * kh * w + ox * kw;
                let mut best = base;
                let mut m = xp[base];
                for ky in 0..kh {
                    for kx in 0..kw {
                        let i = base + ky * w + kx;
                        let v = xp[i];
                        // The exact rule (NaN wins) only where a NaN exists; otherwise
                        // conditional moves, not branches.
                        let better = if nan {
                            v > m || (v.is_nan() && !m.is_nan())
                        } else {
                            v > m
                        };
                        m = if better { v } else { m };
                        best = if better { i } else { best };
                        out[i] = 0.0;
                    }
                }
                out[best] = g[oy * ow + ox];
            }
        }
    };
    for_planes(dx, xs, work);
}

/// Pooling forward: each output plane from its input plane, planes in parallel.
fn pool_forward(
    p: &Pool2d,
    xd: [usize; 4],
    yd: [usize; 4],
    x: &[f32],
    y: &mut [f32],
    f: impl Fn(&[f32], &Window) -> f32 + Sync,
) {
    let [_, _, h, w] = xd;
    let [_, _, oh, ow] = yd;
    let (xs, ys) = (h * w, oh * ow);
    let work = |(plane, out): (usize, &mut [f32])| {
        let xp = &x[plane * xs..(plane + 1) * xs];
        for oy in 0..oh {
            for ox in 0..ow {
                out[oy * ow + ox] = f(xp, &window(p, h, w, oy, ox));
            }
        }
    };
    for_planes(y, ys, work);
}

/// Pooling backward: each input-gradient plane (zeroed, then `f(plane offset, window, dy,
/// plane)` per output) from its output-gradient plane, planes in parallel.
fn pool_backward(
    p: &Pool2d,
    xd: [usize; 4],
    yd: [usize; 4],
    dy: &[f32],
    dx: &mut [f32],
    f: impl Fn(usize, &Window, f32, &mut [f32]) + Sync,
) {
    let [_, _, h, w] = xd;
    let [_, _, oh, ow] = yd;
    let (xs, ys) = (h * w, oh * ow);
    let work = |(plane, out): (usize, &mut [f32])| {
        out.fill(0.0);
        let g = &dy[plane * ys..(plane + 1) * ys];
        for oy in 0..oh {
            for ox in 0..ow {
                f(plane * xs, &window(p, h, w, oy, ox), g[oy * ow + ox], out);
            }
        }
    };
    for_planes(dx, xs, work);
}

/// Copies a `dims` tensor of `size`-byte elements into its transpose by `perm`.
///
/// # Safety
/// `src` and `dst` hold the tensor and its transpose and do not overlap.
unsafe fn transpose(src: *const u8, dst: *mut u8, dims: &[usize], perm: &[usize], size: usize) {
    let r = dims.len();
    let mut st = vec![1usize; r];
    for i in (0..r.saturating_sub(1)).rev() {
        st[i] = st[i + 1] * dims[i + 1];
    }
    // Output axis i walks input axis perm[i].
    let od: Vec<usize> = perm.iter().map(|&p| dims[p]).collect();
    let os: Vec<usize> = perm.iter().map(|&p| st[p]).collect();
    let total: usize = dims.iter().product();
    if total == 0 {
        return;
    }
    let mut idx = vec![0usize; r];
    let mut src_off = 0usize;
    for o in 0..total {
        // SAFETY: src_off < total and o < total index elements of the two buffers.
        unsafe {
            std::ptr::copy_nonoverlapping(src.add(src_off * size), dst.add(o * size), size);
        }
        for ax in (0..r).rev() {
            idx[ax] += 1;
            src_off += os[ax];
            if idx[ax] < od[ax] {
                break;
            }
            src_off -= os[ax] * od[ax];
            idx[ax] = 0;
        }
    }
}

/// Reduces `x` (dims `dims`) over the axes marked in `reduced` into `y` (kept axes in order).
fn reduce(op: ReduceOp, x: &[f32], y: &mut [f32], dims: &[usize], reduced: &[bool]) {
    let init = if op == ReduceOp::Max {
        f32::NEG_INFINITY
    } else {
        0.0
    };
    y.fill(init);
    // Output stride of each input axis (0 for reduced axes).
    let r = dims.len();
    let mut ost = vec![0usize; r];
    let mut s = 1;
    for i in (0..r).rev() {
        if !reduced[i] {
            ost[i] = s;
            s *= dims[i];
        }
    }
    let inner = if r == 0 { 1 } else { dims[r - 1] };
    let outer = x.len() / inner.max(1);
    let mut idx = vec![0usize; r.saturating_sub(1)];
    let mut obase = 0usize;
    let last_reduced = r > 0 && reduced[r - 1];
    for o in 0..outer {
        let row = &x[o * inner..(o + 1) * inner];
        if last_reduced {
            let v = match op {
                ReduceOp::Max => {
                    row.iter().fold(
                        f32::NEG_INFINITY,
                        |m, &v| if v > m || v.is_nan() { v } else { m },
                    )
                }
                _ => sum(row),
            };
            let t = &mut y[obase];
            *t = if op == ReduceOp::Max {
                if v > *t || v.is_nan() { v } else { *t }
            } else {
                *t + v
            };
        } else {
            let out = &mut y[obase..obase + inner];
            match op {
                ReduceOp::Max => out.iter_mut().zip(row).for_each(|(t, &v)| {
                    if v > *t || v.is_nan() {
                        *t = v
                    }
                }),
                _ => out.iter_mut().zip(row).for_each(|(t, &v)| *t += v),
            }
        }
        // Advance the multi-index over the outer axes.
        for ax in (0..r.saturating_sub(1)).rev() {
            idx[ax] += 1;
            obase += ost[ax];
            if idx[ax] < dims[ax] {
                break;
            }
            obase -= ost[ax] * dims[ax];
            idx[ax] = 0;
        }
    }
    if op == ReduceOp::Mean {
        let count: usize = dims
            .iter()
            .zip(reduced)
            .filter(|(_, r)| **r)
            .map(|(d, _)| d)
            .product();
        let k = 1.0 / count as f32;
        y.iter_mut().for_each(|v| *v *= k);
    }
}

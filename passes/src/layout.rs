//! `nchwc`: convolutions, and the elementwise ops and spatial means around them, on
//! channel-blocked tensors.
//!
//! A CPU convolution kernel wants the channels of a pixel next to each other, a vector's width
//! at a time: `[N, C, H, W]` stored as `[N, C/b, H, W, b]` (NCHWc, `b` = the vector width), so
//! that one load gives `b` channels of one pixel and no im2col matrix is ever built. This pass
//! rewrites a function into that form where it pays, and the backend runs `conv2d_nchwc`
//! directly (onnxruntime's NCHWc transformer and MLAS kernels do the same for the same reason).
//!
//! In one walk over the schedule:
//!
//! - every `f32` `conv2d` with one group, depthwise (`groups == C == O`), or with groups whose
//!   input and output channels fill whole blocks (RegNet, ResNeXt) or are the same fraction of
//!   a block (ResNeXt-50's first stage, 4 and 4) becomes `conv2d_nchwc`,
//!   reading its input blocked: its blocked form if it has one, else a `to_nchwc` of it (shared
//!   by every convolution reading it), unless blocking would pad it by more than a quarter
//!   (the first layer's three channels stay plain);
//! - an elementwise op with an operand in blocked form and the same shape as its result is
//!   computed blocked: its other operands are brought to the blocked layout (per-channel
//!   constants such as biases are folded here; anything else gets a `to_nchwc`, or a
//!   `reshape` when it is constant along the channels);
//! - pooling windows of a blocked value pool it blocked; `global_avg_pool`, and `reduce_*` over
//!   spatial axes with `keepdims`, become the same reduction over the blocked tensor's spatial
//!   axes;
//! - a concatenation along the channels with a blocked operand, every operand but the last
//!   filling whole blocks, concatenates the blocked forms (an Inception module's or a Fire
//!   module's branches, a DenseNet block's features), so the pooling and convolutions after it
//!   stay blocked;
//! - a transposed convolution whose kernel equals its stride, unpadded, with output channels
//!   in whole blocks, becomes a 1x1 convolution whose blocks a transpose moves into place;
//! - a transpose that moves the channels of a blocked value last (`[N, C, H, W]` to
//!   `[N, H, W, C]`) with whole blocks of channels transposes the blocked form, its blocks
//!   kept whole, and reshapes it; its inverse (`[N, H, W, C]` to `[N, C, H, W]`) gives the
//!   blocked form directly, a transpose of whole blocks;
//! - every other reader of a rewritten value reads a `from_nchwc` of it, placed just before its
//!   first such reader. A layout change and its inverse never meet: a blocked value is
//!   recorded and reused, so consecutive convolutions pass blocked tensors to each other.
//!
//! The rewritten ops give bit-identical results: the convolution's arithmetic is unchanged (the
//! backend's kernel may sum in another order, as for `conv2d`), and padding lanes are never
//! read by a later convolution or kept by `from_nchwc`. Plain values keep their names; a blocked
//! value is named after its plain one with `/nchwc`.
//!
//! Not rewritten: functions with a backward part (the training step reads forward values in
//! the plain layout), ops with control dependencies or that other ops depend on, other grouped
//! convolutions, `f64` convolutions, and every other op kind
//! (reshapes, matmuls, concatenations on other axes or of partial blocks), which read a
//! `from_nchwc`.

use crate::manager::{OptionInfo, Options, Pass};
use std::collections::HashMap;
use tcc_ir::edit::Users;
use tcc_ir::interp::fold;
use tcc_ir::typing::infer;
use tcc_ir::{DType, Function, Op, OpKind, TensorType, Value};

/// The options `nchwc` accepts.
pub const OPTIONS: &[OptionInfo] = &[OptionInfo {
    name: "block",
    help: "channels per block, the target's f32 vector width: 8 for AVX2, 16 for AVX-512 (default 8)",
}];

/// Constants up to this many elements are converted here rather than at run time.
const FOLD_LIMIT: u64 = 1 << 20;

/// What one run of [`nchwc`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NchwcStats {
    /// Convolutions rewritten to `conv2d_nchwc`.
    pub convs: usize,
    /// Elementwise ops and reductions computed on blocked tensors.
    pub others: usize,
    /// `from_nchwc` ops left: where a plain reader needs a blocked value.
    pub to_plain: usize,
}

/// The pass object.
pub struct Nchwc {
    /// Channels per block.
    pub block: u64,
}

impl Pass for Nchwc {
    fn name(&self) -> &'static str {
        "nchwc"
    }

    fn run_on_function(&self, f: &mut Function) -> Result<(), String> {
        nchwc(f, self.block).map(|_| ())
    }
}

/// Builds the pass from its options.
pub fn create(o: &Options) -> Result<Box<dyn Pass>, String> {
    let block = o.usize_or("block", 8)? as u64;
    if !(1..=tcc_ir::typing::MAX_BLOCK).contains(&block) {
        return Err(format!(
            "option `block` must be between 1 and {}, found {block}",
            tcc_ir::typing::MAX_BLOCK
        ));
    }
    Ok(Box::new(Nchwc { block }))
}

/// Whether `conv2d` op `d` has a blocked kernel: `f32`, and one group, depthwise, or groups
/// whose input and output channels fill whole blocks.
fn convertible_conv(f: &Function, d: &tcc_ir::OpData, c: &tcc_ir::Conv2d, block: u64) -> bool {
    let (x, w) = (f.ty(d.args[0]), f.ty(d.args[1]));
    let depthwise = c.groups == x.dims()[1] && w.dims()[0] == c.groups && w.dims()[1] == 1;
    let (cg, og) = (w.dims()[1], w.dims()[0] / c.groups);
    let whole = cg.is_multiple_of(block) && og.is_multiple_of(block);
    // Groups of a fraction of a block, as many outputs as inputs (ResNeXt's 4 channels a
    // group): the kernel runs each block as one group with zeros between the small ones.
    let fraction = og == cg && block.is_multiple_of(cg) && x.dims()[1].is_multiple_of(block);
    x.dtype() == DType::F32 && (c.groups == 1 || depthwise || whole || fraction)
}

/// The rewrite in progress: the new schedule, and the blocked form of each value that has one.
struct Rewrite<'f> {
    f: &'f mut Function,
    block: u64,
    order: Vec<Op>,
    /// The blocked form of a (plain) value.
    blocked: HashMap<Value, Value>,
    /// Operands brought to the blocked layout of a result of some rank, by (value, rank).
    brought: HashMap<(Value, usize), Value>,
    /// Old values replaced by the `from_nchwc` of their blocked form.
    subst: HashMap<Value, Value>,
    /// The `from_nchwc` ops created, and the name each gets back once the op it replaces is gone.
    plain: Vec<(Op, String)>,
    /// Ops that bring an operand to the blocked layout, scheduled straight after the operand's
    /// definition (those of parameters first), so that they never split a chain of ops the
    /// backend fuses.
    after: HashMap<Option<Op>, Vec<Op>>,
    /// Ops whose result replaces an old value, and the name each gets back once the old one is
    /// gone (as for `plain`).
    renamed: Vec<(Op, String)>,
    stats: NchwcStats,
}

impl Rewrite<'_> {
    /// Schedules a new op computing `kind` on `args` here, or right after the definition of
    /// `after` (see [`Rewrite::after`]); its one result is named `name` (made unique). A
    /// constant result is folded into a `const`.
    fn emit_at(
        &mut self,
        after: Option<Value>,
        kind: OpKind,
        args: &[Value],
        name: &str,
    ) -> Result<Value, String> {
        let tys: Vec<&TensorType> = args.iter().map(|&a| self.f.ty(a)).collect();
        let out = infer(&kind, &tys).map_err(|e| format!("internal error in nchwc: {e}"))?;
        let folded = match crate::canonicalize::fold::const_args(self.f, args) {
            Some(c) if !args.is_empty() => match fold(&kind, &c, &out, FOLD_LIMIT) {
                Some(Ok(mut lits)) => Some(lits.remove(0)),
                _ => None,
            },
            _ => None,
        };
        let (kind, args) = match folded {
            Some(value) => (
                OpKind::Const {
                    ty: out[0].clone(),
                    value,
                },
                Vec::new(),
            ),
            None => (kind, args.to_vec()),
        };
        let name = self.f.unique_name(name);
        let op = self.f.create_op(kind, args, out, &[&name]);
        match after {
            None => self.order.push(op),
            Some(a) => {
                let def = self.f.def_op(a);
                self.after.entry(def).or_default().push(op);
            }
        }
        Ok(self.f.op(op).results[0])
    }

    /// [`Rewrite::emit_at`] here.
    fn emit(&mut self, kind: OpKind, args: &[Value], name: &str) -> Result<Value, String> {
        self.emit_at(None, kind, args, name)
    }

    /// `a` in the blocked layout of a result of dims `out` (rank 2 or more, `C = out[1]`
    /// channels) that it broadcasts to, if it can be: its blocked form, a `to_nchwc` of it
    /// (reshaped to the result's rank first if it has fewer axes), or a `reshape` with a unit
    /// block axis when it is constant along the channels.
    fn bring(&mut self, a: Value, out: &[u64]) -> Result<Option<Value>, String> {
        let (r, channels) = (out.len(), out[1]);
        let da = self.f.ty(a).dims().to_vec();
        if let Some(&b) = self.blocked.get(&a)
            && da.len() == r
            && da[1] == channels
        {
            return Ok(Some(b));
        }
        if let Some(&b) = self.brought.get(&(a, r)) {
            return Ok(Some(b));
        }
        if da.is_empty() {
            // A scalar broadcasts against anything.
            return Ok(Some(a));
        }
        if da.len() > r {
            return Ok(None);
        }
        let mut full = vec![1; r - da.len()];
        full.extend_from_slice(&da);
        let name = format!("{}/nchwc", self.f.name(a));
        // Constant along the channels (one channel, also where the result has one): a unit block
        // axis that broadcasts, so that the block's padding lanes read real values (a
        // quantization's scale padded with 0 would be an invalid scale there).
        let b = if full[1] == 1 {
            full.push(1);
            self.emit_at(Some(a), OpKind::Reshape { shape: full }, &[a], &name)?
        } else if full[1] == channels {
            let x = if da.len() < r {
                let ranked = format!("{}/{r}d", self.f.name(a));
                self.emit_at(Some(a), OpKind::Reshape { shape: full }, &[a], &ranked)?
            } else {
                a
            };
            self.emit_at(Some(a), OpKind::ToNchwc { block: self.block }, &[x], &name)?
        } else {
            return Ok(None);
        };
        self.brought.insert((a, r), b);
        Ok(Some(b))
    }

    /// The input a `conv2d_nchwc` reads for plain `x`: its blocked form if it has one; else a
    /// `to_nchwc` of it, unless blocking would pad it by more than a quarter (an image's three
    /// channels), where the kernel reads it plain. The kernel reads a plain input a channel
    /// at a time from planes of their own, a cache line per channel and tile: a 1x1 layer
    /// of 464 channels ran 1.6x slower than on the blocked input, which costs one pass to make.
    fn conv_input(&mut self, x: Value) -> Result<Value, String> {
        let rank = self.f.ty(x).rank();
        if let Some(&b) = self.blocked.get(&x).or(self.brought.get(&(x, rank))) {
            return Ok(b);
        }
        let c = self.f.ty(x).dims()[1];
        if c.next_multiple_of(self.block) * 4 > c * 5 {
            return Ok(x);
        }
        let name = format!("{}/nchwc", self.f.name(x));
        let b = self.emit_at(Some(x), OpKind::ToNchwc { block: self.block }, &[x], &name)?;
        // Shared with other readers that bring `x` to the blocked layout, without making `x`
        // a blocked value: the elementwise ops reading it stay plain.
        self.brought.insert((x, rank), b);
        Ok(b)
    }

    /// For `op` a transpose moving the channels of a value with a blocked form to the last
    /// axis (`[N, C, H, W]` to `[N, H, W, C]`, as ConvNeXt's blocks do after their depthwise
    /// convolution) with whole blocks of channels: the same transpose of the blocked form,
    /// whose blocks stay contiguous (`[N, C/b, H, W, b]` to `[N, H, W, C/b, b]`), reshaped to
    /// the result. One pass of contiguous runs instead of a `from_nchwc` and a transpose
    /// element by element.
    fn channels_last(&mut self, op: Op) -> Result<Option<Value>, String> {
        let d = self.f.op(op);
        let OpKind::Transpose { perm } = &d.kind else {
            return Ok(None);
        };
        let (x, r) = (d.args[0], d.results[0]);
        let Some(&xb) = self.blocked.get(&x) else {
            return Ok(None);
        };
        let dims = self.f.ty(x).dims();
        let rank = dims.len();
        let last: Vec<u64> = (0..rank as u64).filter(|&a| a != 1).chain([1]).collect();
        if rank < 3 || *perm != last || !dims[1].is_multiple_of(self.block) {
            return Ok(None);
        }
        let out = self.f.ty(r).dims().to_vec();
        let name = self.f.name(r).to_string();
        let mut perm = perm.clone();
        perm.push(rank as u64);
        let t = self.emit(OpKind::Transpose { perm }, &[xb], &format!("{name}/nchwc"))?;
        self.stats.others += 1;
        self.emit(OpKind::Reshape { shape: out }, &[t], &name)
            .map(Some)
    }

    /// For `op` the inverse transpose (`[N, H, W, C]` to `[N, C, H, W]`, whole blocks of
    /// channels): the blocked form of its result, as a transpose of blocks kept whole
    /// (`[N, H, W, C/b, b]` to `[N, C/b, H, W, b]`), so that what follows (ConvNeXt's scale,
    /// residual add and next depthwise convolution) runs blocked.
    fn channels_first(&mut self, op: Op) -> Result<Option<Value>, String> {
        let d = self.f.op(op);
        let OpKind::Transpose { perm } = &d.kind else {
            return Ok(None);
        };
        let (perm, z, r) = (perm.clone(), d.args[0], d.results[0]);
        let dims = self.f.ty(z).dims().to_vec();
        let rank = dims.len() as u64;
        if rank < 3 {
            return Ok(None);
        }
        let first: Vec<u64> = [0, rank - 1].into_iter().chain(1..rank - 1).collect();
        let c = dims[dims.len() - 1];
        if perm != first || !c.is_multiple_of(self.block) || self.f.ty(z).dtype() != DType::F32 {
            return Ok(None);
        }
        let name = self.f.name(r).to_string();
        let mut split = dims;
        split.pop();
        split.extend([c / self.block, self.block]);
        let zb = self.emit(
            OpKind::Reshape { shape: split },
            &[z],
            &format!("{name}/blocks"),
        )?;
        let mut perm = perm;
        perm.push(rank);
        self.stats.others += 1;
        self.emit(OpKind::Transpose { perm }, &[zb], &format!("{name}/nchwc"))
            .map(Some)
    }

    /// For `op` a transposed convolution whose kernel equals its stride (`conv2d_grad_input`
    /// as ONNX's `ConvTranspose` imports: each input pixel spreads into its own `kh x kw`
    /// patch, as in the 2x2 stride-2 upsampling of U-Net and text-detector heads), no padding,
    /// one group, and output channels in whole blocks: the blocked form of its result, as a
    /// 1x1 convolution to `kh kw C` channels (the filter transposed to `[kh, kw, C, O]`, so
    /// that each block holds eight channels of one patch position) whose blocks are then moved
    /// whole into place: `[N, kh, kw, C/b, H, W, b]` to `[N, C/b, H, kh, W, kw, b]`. Each
    /// output is the same sum over the input channels as before; the GEMM and col2im it
    /// replaces wrote every output twice.
    fn upsampling_conv(&mut self, op: Op) -> Result<Option<Value>, String> {
        let d = self.f.op(op);
        let OpKind::Conv2dGradInput { conv, shape } = &d.kind else {
            return Ok(None);
        };
        let (x, w, r) = (d.args[0], d.args[1], d.results[0]);
        let (xd, wd) = (self.f.ty(x).dims().to_vec(), self.f.ty(w).dims().to_vec());
        let [o, c, kh, kw] = wd[..] else {
            return Ok(None);
        };
        let [n, _, h, wi] = xd[..] else {
            return Ok(None);
        };
        let fits = self.f.ty(x).dtype() == DType::F32
            && conv.groups == 1
            && conv.strides == [kh, kw]
            && conv.pads == [0; 4]
            && conv.dilations == [1, 1]
            && *shape == [n, c, h * kh, wi * kw]
            && c.is_multiple_of(self.block);
        if !fits {
            return Ok(None);
        }
        let name = self.f.name(r).to_string();
        let b = self.block;
        let xb = self.blocked.get(&x).copied().unwrap_or(x);
        let t = self.emit(
            OpKind::Transpose {
                perm: vec![2, 3, 1, 0],
            },
            &[w],
            &format!("{name}/filter"),
        )?;
        let filter = self.emit(
            OpKind::Reshape {
                shape: vec![kh * kw * c, o, 1, 1],
            },
            &[t],
            &format!("{name}/filter1x1"),
        )?;
        let conv = OpKind::Conv2dNchwc {
            conv: tcc_ir::Conv2d {
                strides: [1, 1],
                pads: [0; 4],
                dilations: [1, 1],
                groups: 1,
            },
            block: b,
        };
        let z = self.emit(conv, &[xb, filter], &format!("{name}/patches"))?;
        let z = self.emit(
            OpKind::Reshape {
                shape: vec![n, kh, kw, c / b, h, wi, b],
            },
            &[z],
            &format!("{name}/patches7d"),
        )?;
        let y = self.emit(
            OpKind::Transpose {
                perm: vec![0, 3, 4, 1, 5, 2, 6],
            },
            &[z],
            &format!("{name}/moved"),
        )?;
        self.stats.convs += 1;
        self.emit(
            OpKind::Reshape {
                shape: vec![n, c / b, h * kh, wi * kw, b],
            },
            &[y],
            &format!("{name}/nchwc"),
        )
        .map(Some)
    }

    /// The blocked op (kind and operands) that computes `op`'s result, if `op` is rewritten.
    fn blocked_op(&mut self, op: Op) -> Result<Option<(OpKind, Vec<Value>)>, String> {
        let d = self.f.op(op).clone();
        let out = self.f.ty(d.results[0]).dims().to_vec();
        Ok(match &d.kind {
            OpKind::Conv2d(c) if convertible_conv(self.f, &d, c, self.block) => {
                let x = self.conv_input(d.args[0])?;
                let kind = OpKind::Conv2dNchwc {
                    conv: c.clone(),
                    block: self.block,
                };
                self.stats.convs += 1;
                Some((kind, vec![x, d.args[1]]))
            }
            OpKind::MaxPool2d(_) | OpKind::AvgPool2d { .. } => {
                self.blocked.get(&d.args[0]).map(|&x| {
                    self.stats.others += 1;
                    (d.kind.clone(), vec![x])
                })
            }
            OpKind::GlobalAvgPool => self.blocked.get(&d.args[0]).map(|&x| {
                self.stats.others += 1;
                let kind = OpKind::Reduce {
                    op: tcc_ir::ReduceOp::Mean,
                    axes: vec![2, 3],
                    keepdims: true,
                };
                (kind, vec![x])
            }),
            OpKind::Reduce {
                op: r,
                axes,
                keepdims: true,
            } => {
                let rank = out.len() as i64;
                let spatial = axes
                    .iter()
                    .map(|&a| if a < 0 { a + rank } else { a })
                    .all(|a| a >= 2);
                match self.blocked.get(&d.args[0]) {
                    Some(&x) if spatial => {
                        self.stats.others += 1;
                        let axes = axes.iter().map(|&a| if a < 0 { a + rank } else { a });
                        let kind = OpKind::Reduce {
                            op: *r,
                            axes: axes.collect(),
                            keepdims: true,
                        };
                        Some((kind, vec![x]))
                    }
                    _ => None,
                }
            }
            OpKind::Concat { axis }
                if out.len() >= 3 && (*axis == 1 || *axis == 1 - out.len() as i64) =>
            {
                // Blocks line up only if every operand but the last fills its blocks.
                let whole = |a: &Value| self.f.ty(*a).dims()[1].is_multiple_of(self.block);
                let init = &d.args[..d.args.len().saturating_sub(1)];
                if !init.iter().all(whole)
                    || !d.args.iter().any(|a| self.blocked.contains_key(a))
                    || d.args.iter().any(|a| self.f.ty(*a).dtype() != DType::F32)
                {
                    return Ok(None);
                }
                let mut args = Vec::with_capacity(d.args.len());
                for &a in &d.args {
                    let own = self.f.ty(a).dims().to_vec();
                    match self.bring(a, &own)? {
                        Some(b) => args.push(b),
                        None => return Ok(None),
                    }
                }
                self.stats.others += 1;
                Some((OpKind::Concat { axis: 1 }, args))
            }
            k if k.is_elementwise() && out.len() >= 2 => {
                let full = |a: &Value| self.f.ty(*a).dims() == out.as_slice();
                // A quantization with a scale per channel stays plain: blocking would pad the
                // scales with zeros, which are not scales.
                let per_channel = |a: &Value| {
                    // Its dimension along the result's channels (axis 1), if it has one.
                    let d = self.f.ty(*a).dims();
                    let channels = (d.len() + 1).checked_sub(out.len()).and_then(|i| d.get(i));
                    channels.is_some_and(|&c| c > 1)
                };
                if matches!(k, OpKind::QuantizeLinear | OpKind::DequantizeLinear)
                    && d.args[1..].iter().any(per_channel)
                {
                    return Ok(None);
                }
                if !d
                    .args
                    .iter()
                    .any(|a| full(a) && self.blocked.contains_key(a))
                {
                    return Ok(None);
                }
                let mut args = Vec::with_capacity(d.args.len());
                for &a in &d.args {
                    match self.bring(a, &out)? {
                        Some(b) => args.push(b),
                        None => return Ok(None),
                    }
                }
                self.stats.others += 1;
                Some((k.clone(), args))
            }
            _ => None,
        })
    }
}

/// Rewrites `f` to compute convolutions and what surrounds them on tensors with channels in
/// blocks of `block` (see the module docs).
pub fn nchwc(f: &mut Function, block: u64) -> Result<NchwcStats, String> {
    if f.backward_start().is_some() {
        return Ok(NchwcStats::default());
    }
    // Dead ops go first: a dead op ordered after a convolution must not keep it plain in this
    // run when the clean-up below removes that op (a second run would block it: not a fixed
    // point).
    crate::dce::dce(f);
    let users = Users::new(f);
    let schedule = f.schedule().to_vec();
    let mut rw = Rewrite {
        f,
        block,
        order: Vec::with_capacity(schedule.len() * 2),
        blocked: HashMap::new(),
        brought: HashMap::new(),
        subst: HashMap::new(),
        plain: Vec::new(),
        after: HashMap::new(),
        renamed: Vec::new(),
        stats: NchwcStats::default(),
    };
    for op in schedule {
        // Readers of a rewritten value read its plain form from now on.
        let args = rw.f.op(op).args.clone();
        for (i, a) in args.iter().enumerate() {
            if let Some(&p) = rw.subst.get(a) {
                rw.f.op_mut(op).args[i] = p;
            }
        }
        rw.order.push(op);
        let d = rw.f.op(op);
        if !d.deps.is_empty() || !users.control_dependents(op).is_empty() || d.results.len() != 1 {
            continue;
        }
        if let Some(y) = rw.channels_last(op)? {
            let r = rw.f.op(op).results[0];
            let name = rw.f.name(r).to_string();
            rw.subst.insert(r, y);
            rw.renamed
                .push((rw.f.def_op(y).expect("an op result"), name));
            continue;
        }
        let r = rw.f.op(op).results[0];
        let name = rw.f.name(r).to_string();
        let special = match rw.channels_first(op)? {
            Some(yb) => Some(yb),
            None => rw.upsampling_conv(op)?,
        };
        let yb = match special {
            Some(yb) => yb,
            None => {
                let Some((kind, args)) = rw.blocked_op(op)? else {
                    continue;
                };
                rw.emit(kind, &args, &format!("{name}/nchwc"))?
            }
        };
        let channels = rw.f.ty(r).dims()[1];
        let from = rw.emit(OpKind::FromNchwc { channels }, &[yb], &name)?;
        let from_op = rw.f.def_op(from).expect("an op result");
        rw.plain.push((from_op, name));
        rw.subst.insert(r, from);
        rw.blocked.insert(from, yb);
    }
    let results: Vec<Value> = (rw.f.results().iter())
        .map(|r| rw.subst.get(r).copied().unwrap_or(*r))
        .collect();
    let (mut after, plain, renamed, stats) = (rw.after, rw.plain, rw.renamed, rw.stats);
    let mut order = after.remove(&None).unwrap_or_default();
    for op in rw.order {
        order.push(op);
        order.extend(after.remove(&Some(op)).unwrap_or_default());
    }
    f.set_results(results);
    f.set_schedule(order);
    crate::dce::dce(f);
    let stats = NchwcStats {
        to_plain: sink_to_plain(f, &plain),
        ..stats
    };
    for (op, name) in plain.into_iter().chain(renamed) {
        let v = f.op(op).results[0];
        if !f.name(v).is_empty() {
            f.rename(v, &name);
        }
    }
    Ok(stats)
}

/// Moves each surviving `from_nchwc` of `plain` to just before its first reader (or the end of
/// the schedule, if only returned), so the plain copy lives no longer than it must. Returns how
/// many survive.
fn sink_to_plain(f: &mut Function, plain: &[(Op, String)]) -> usize {
    let pos = f.positions();
    let live: Vec<Op> = plain
        .iter()
        .map(|&(op, _)| op)
        .filter(|&op| pos[op].is_some())
        .collect();
    if live.is_empty() {
        return 0;
    }
    let users = Users::new(f);
    let mut before: HashMap<Op, Vec<Op>> = HashMap::new();
    let mut at_end = Vec::new();
    for &op in &live {
        let v = f.op(op).results[0];
        match users
            .uses(v)
            .iter()
            .map(|&(u, _)| u)
            .min_by_key(|&u| pos[u])
        {
            Some(first) => before.entry(first).or_default().push(op),
            None => at_end.push(op),
        }
    }
    let moved: std::collections::HashSet<Op> = live.iter().copied().collect();
    let mut order = Vec::with_capacity(f.schedule().len());
    for &op in f.schedule() {
        if moved.contains(&op) {
            continue;
        }
        if let Some(ops) = before.get(&op) {
            order.extend_from_slice(ops);
        }
        order.push(op);
    }
    order.extend(at_end);
    f.set_schedule(order);
    live.len()
}

//! Integer convolutions and products written in QDQ form.
//!
//! `qdq` (and so `tcc quantize`) leaves a quantized layer as `mul(cast(conv_integer(xq, wq, zx,
//! zw)), c)`: the exact i32 sums, then one float multiply by `c = sx * sw` (per output channel
//! with per-channel weights). ONNX's QDQ form says the same with float ops on dequantized
//! operands, `Conv(DequantizeLinear(xq, sx, zx), DequantizeLinear(wq, sw, zw))`, which is what
//! onnxruntime's `quantize_static` writes and recognises (it runs such groups on its integer
//! kernels). `sx` is the scale of the `quantize_linear` that made `xq` (1 if something else
//! did), `sw = c / sx`. An integer op without that form goes out as ONNX's ConvInteger or
//! MatMulInteger.

use super::{Writer, conv_attrs};
use crate::{Error, Result};
use tcc_ir::{BinaryOp, DType, Data, Op, OpKind, Tensor, Value};

/// The float scaling of an integer op's sums: `y = cast(acc) * c`.
struct Scaled {
    cast: Op,
    mul: Op,
    /// `c`, one element or one per output channel.
    c: Vec<f32>,
    y: Value,
}

impl Writer<'_> {
    /// Writes `conv_integer` or `matmul_integer` `op` (see the module docs).
    pub(super) fn integer(&mut self, op: Op) -> Result<()> {
        match self.scaled(op) {
            Some(s) => self.qdq(op, s),
            None => self.plain_integer(op),
        }
    }

    /// The scaling of `op`'s sums, if it has the form `qdq` writes: its result read only by a
    /// cast to f32, that read only by a multiply with a constant that is one value or one per
    /// output channel.
    fn scaled(&self, op: Op) -> Option<Scaled> {
        let f = self.f;
        let only_user = |v: Value| -> Option<Op> {
            let uses = self.users.uses(v);
            (uses.len() == 1 && !self.users.is_returned(v)).then(|| uses[0].0)
        };
        let acc = f.op(op).results[0];
        let cast = only_user(acc)?;
        let cv = f.op(cast).results[0];
        if f.op(cast).kind != (OpKind::Cast { to: DType::F32 }) {
            return None;
        }
        let mul = only_user(cv)?;
        let m = f.op(mul);
        if m.kind != OpKind::Binary(BinaryOp::Mul) || f.ty(m.results[0]) != f.ty(cv) {
            return None;
        }
        let other = if m.args[0] == cv {
            m.args[1]
        } else {
            m.args[0]
        };
        let t = self.constant(other)?;
        let Data::F32(c) = t.data() else {
            return None;
        };
        // One per output channel: axis 1 of a convolution's NCHW result, the last of a product's.
        let yd = f.ty(cv).dims();
        let channel = match f.op(op).kind {
            OpKind::ConvInteger(_) => 1,
            _ => yd.len() - 1,
        };
        let cd = t.dims();
        let offset = yd.len().checked_sub(cd.len())?;
        let along_channel = (0..cd.len()).all(|i| cd[i] == 1 || i + offset == channel);
        (along_channel && (c.len() == 1 || c.len() as u64 == yd[channel])).then(|| Scaled {
            cast,
            mul,
            c: c.clone(),
            y: m.results[0],
        })
    }

    /// The QDQ form of `op` scaled by `s`.
    fn qdq(&mut self, op: Op, s: Scaled) -> Result<()> {
        let f = self.f;
        let d = f.op(op);
        let conv = match &d.kind {
            OpKind::ConvInteger(c) => Some(c.clone()),
            _ => None,
        };
        let [xq, wq, zx, zw] = [d.args[0], d.args[1], d.args[2], d.args[3]];
        if f.ty(zx).numel() != 1 {
            // A zero point per row of the left operand has no QDQ form.
            return self.plain_integer(op);
        }
        // The activation's scale: its quantization's, if it has one of its own.
        let sx = (f.def_op(xq))
            .filter(|&q| f.op(q).kind == OpKind::QuantizeLinear)
            .and_then(|q| self.constant(f.op(q).args[1]))
            .and_then(|t| match t.data() {
                Data::F32(v) if v.len() == 1 && v[0] > 0.0 => Some(v[0]),
                _ => None,
            })
            .unwrap_or(1.0);
        // The weights' scales and zero points, one or one per output channel.
        let channels = s.c.len().max(f.ty(zw).numel() as usize);
        let zeros = match self.constant(zw) {
            Some(t) => t.data().clone(),
            None if channels == f.ty(zw).numel() as usize => {
                return self.finish_qdq(op, s, sx, conv, None);
            }
            None => return self.plain_integer(op),
        };
        let spread = |v: &[f32]| -> Vec<f32> {
            (0..channels)
                .map(|i| v[if v.len() == 1 { 0 } else { i }])
                .collect()
        };
        let sw: Vec<f32> = spread(&s.c).iter().map(|c| c / sx).collect();
        let zeros = match zeros {
            Data::I8(z) => Data::I8(
                (0..channels)
                    .map(|i| z[if z.len() == 1 { 0 } else { i }])
                    .collect(),
            ),
            Data::U8(z) => Data::U8(
                (0..channels)
                    .map(|i| z[if z.len() == 1 { 0 } else { i }])
                    .collect(),
            ),
            _ => return self.plain_integer(op),
        };
        let dims: Vec<u64> = if channels == 1 {
            vec![]
        } else {
            vec![channels as u64]
        };
        let wname = self.name(wq);
        let scale = Tensor::from_data(&dims, Data::F32(sw)).expect("one per channel");
        let zero = Tensor::from_data(&dims, zeros).expect("one per channel");
        let scale = self.init(&format!("{wname}/scale"), &scale);
        let zero = self.init(&format!("{wname}/zero_point"), &zero);
        self.finish_qdq(op, s, sx, conv, Some((scale, zero, channels)))
    }

    /// Writes the dequantizations and the float op; `w` is the weights' scale and zero point
    /// (initializers) and channels, or `None` to take the zero point `zw` as it is with scale
    /// `c / sx` computed in the graph.
    fn finish_qdq(
        &mut self,
        op: Op,
        s: Scaled,
        sx: f32,
        conv: Option<tcc_ir::Conv2d>,
        w: Option<(String, String, usize)>,
    ) -> Result<()> {
        let f = self.f;
        let d = f.op(op);
        let [xq, wq, zx, zw] = [d.args[0], d.args[1], d.args[2], d.args[3]];
        let y = self.name(s.y);
        let (sw, zw, channels) = match w {
            Some(w) => w,
            None => {
                let n = f.ty(zw).numel() as usize;
                let dims: Vec<u64> = if n == 1 { vec![] } else { vec![n as u64] };
                let spread: Vec<f32> = (0..n)
                    .map(|i| s.c[if s.c.len() == 1 { 0 } else { i }] / sx)
                    .collect();
                let t = Tensor::from_data(&dims, Data::F32(spread)).expect("one per channel");
                let scale = self.init(&format!("{}/scale", self.name(wq)), &t);
                (scale, self.reshaped(zw, &dims), n)
            }
        };
        // The activation's dequantization, shared by every layer reading it.
        let xdq = format!("{}/dequantized", self.name(xq));
        if !self.taken.contains(&xdq) {
            let xdq = self.fresh(&xdq);
            let scale = Tensor::from_data(&[], Data::F32(vec![sx])).expect("a scalar");
            let scale = self.init(&format!("{}/scale", self.name(xq)), &scale);
            let zero = self.reshaped(zx, &[]);
            self.node(
                "DequantizeLinear",
                vec![self.name(xq), scale, zero],
                vec![xdq],
                vec![],
            );
        }
        let wdq = self.fresh(&format!("{}/dequantized", self.name(wq)));
        // Per channel: a filter's first axis, a matrix's last.
        let axis = match &conv {
            Some(_) => 0,
            None => f.ty(wq).rank() as i64 - 1,
        };
        let attrs = if channels > 1 {
            vec![super::int("axis", axis)]
        } else {
            vec![]
        };
        self.node(
            "DequantizeLinear",
            vec![self.name(wq), sw, zw],
            vec![wdq.clone()],
            attrs,
        );
        self.done.insert(s.cast);
        self.done.insert(s.mul);
        match conv {
            Some(c) => {
                let mut ins = vec![xdq, wdq];
                let mut y = y;
                if let Some((add, bias)) = self.bias(s.y) {
                    let n = bias.len();
                    // The bias on the sums' scale, as onnxruntime quantizes it: i32 levels of
                    // step `c` (the sums' own), dequantized per output channel.
                    let step: Vec<f32> = (0..n)
                        .map(|i| s.c[if s.c.len() == 1 { 0 } else { i }])
                        .collect();
                    let levels: Vec<i32> = (bias.iter().zip(&step))
                        .map(|(b, c)| {
                            (b / c)
                                .round_ties_even()
                                .clamp(i32::MIN as f32, i32::MAX as f32)
                                as i32
                        })
                        .collect();
                    let dims = [n as u64];
                    let base = self.name(f.op(add).results[0]);
                    let q = self.init(
                        &format!("{base}/bias"),
                        &Tensor::from_data(&dims, Data::I32(levels)).expect("one per channel"),
                    );
                    let sc = self.init(
                        &format!("{base}/bias_scale"),
                        &Tensor::from_data(&dims, Data::F32(step)).expect("one per channel"),
                    );
                    let b = self.fresh(&format!("{base}/bias_dequantized"));
                    self.node(
                        "DequantizeLinear",
                        vec![q, sc],
                        vec![b.clone()],
                        vec![super::int("axis", 0)],
                    );
                    ins.push(b);
                    y = base;
                    self.done.insert(add);
                }
                self.node("Conv", ins, vec![y], conv_attrs(&c))
            }
            None => self.node("MatMul", vec![xdq, wdq], vec![y], vec![]),
        }
        Ok(())
    }

    /// The bias added to convolution result `y` when `y`'s only reader adds a constant that is
    /// one value or one per output channel (axis 1): the add and the bias of each channel.
    fn bias(&self, y: Value) -> Option<(Op, Vec<f32>)> {
        let f = self.f;
        let uses = self.users.uses(y);
        if uses.len() != 1 || self.users.is_returned(y) {
            return None;
        }
        let add = uses[0].0;
        let d = f.op(add);
        if d.kind != OpKind::Binary(BinaryOp::Add) || f.ty(d.results[0]) != f.ty(y) {
            return None;
        }
        let other = if d.args[0] == y { d.args[1] } else { d.args[0] };
        let t = self.constant(other)?;
        let Data::F32(b) = t.data() else {
            return None;
        };
        let (bd, rank) = (t.dims(), f.ty(y).rank());
        let offset = rank.checked_sub(bd.len())?;
        let along_channel = (0..bd.len()).all(|i| bd[i] == 1 || i + offset == 1);
        let n = f.ty(y).dims()[1] as usize;
        if !along_channel || (b.len() != 1 && b.len() != n) {
            return None;
        }
        Some((
            add,
            (0..n)
                .map(|i| b[if b.len() == 1 { 0 } else { i }])
                .collect(),
        ))
    }

    /// `op` as ONNX's ConvInteger or MatMulInteger, the zero points shaped as ONNX takes them
    /// (a scalar, or a vector along the rows of the left operand or the filters or columns of
    /// the right).
    fn plain_integer(&mut self, op: Op) -> Result<()> {
        let f = self.f;
        let d = f.op(op);
        let [a, b, za, zb] = [d.args[0], d.args[1], d.args[2], d.args[3]];
        let vector = |v: Value| -> Vec<u64> {
            match f.ty(v).numel() {
                1 => vec![],
                n => vec![n],
            }
        };
        let (za_dims, zb_dims) = (vector(za), vector(zb));
        let ins = vec![
            self.name(a),
            self.name(b),
            self.reshaped(za, &za_dims),
            self.reshaped(zb, &zb_dims),
        ];
        let y = vec![self.name(d.results[0])];
        match &d.kind {
            OpKind::ConvInteger(c) => {
                if !za_dims.is_empty() {
                    return Err(Error::unsupported("ConvInteger takes one input zero point"));
                }
                self.node("ConvInteger", ins, y, conv_attrs(c));
            }
            _ => self.node("MatMulInteger", ins, y, vec![]),
        }
        Ok(())
    }
}

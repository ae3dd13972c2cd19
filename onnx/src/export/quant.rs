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

    /// The QDQ form of `op` scaled by `s`: the activation's dequantization (shared by every
    /// layer reading it), the weights' (per output channel where `c` or the zero points are),
    /// and the float op, with a following per-channel bias joining a convolution.
    fn qdq(&mut self, op: Op, s: Scaled) -> Result<()> {
        let f = self.f;
        let d = f.op(op);
        let [xq, wq, zx, zw] = [d.args[0], d.args[1], d.args[2], d.args[3]];
        // A zero point per row of the left operand has no QDQ form.
        if f.ty(zx).numel() != 1 {
            return self.plain_integer(op);
        }
        // The weights' zero points, one or one per output channel, as ONNX takes them (the
        // shape of their scales): a constant spread to the channels, else `zw` as it is.
        let channels = s.c.len().max(f.ty(zw).numel() as usize);
        let dims: Vec<u64> = if channels == 1 {
            vec![]
        } else {
            vec![channels as u64]
        };
        let zero = match self.constant(zw) {
            Some(t) => {
                let z = t.data();
                let spread = (0..channels).map(|i| z.get(if z.len() == 1 { 0 } else { i }));
                let z = Data::from_scalars(z.dtype(), spread).expect("one dtype");
                let z = Tensor::from_data(&dims, z).expect("one per channel");
                self.init(&format!("{}/zero_point", self.name(wq)), &z)
            }
            None if f.ty(zw).numel() as usize == channels => self.reshaped(zw, &dims),
            None => return self.plain_integer(op),
        };
        // The activation's scale: its quantization's, if it has one of its own; `sw = c / sx`.
        let sx = (f.def_op(xq))
            .filter(|&q| f.op(q).kind == OpKind::QuantizeLinear)
            .and_then(|q| self.constant(f.op(q).args[1]))
            .and_then(|t| match t.data() {
                Data::F32(v) if v.len() == 1 && v[0] > 0.0 => Some(v[0]),
                _ => None,
            })
            .unwrap_or(1.0);
        let sw: Vec<f32> = spread(&s.c, channels).iter().map(|c| c / sx).collect();
        let sw = Tensor::from_data(&dims, Data::F32(sw)).expect("one per channel");
        let sw = self.init(&format!("{}/scale", self.name(wq)), &sw);
        let xdq = match self.dequantized.get(&xq) {
            Some(name) => name.clone(),
            None => {
                let name = self.fresh(&format!("{}/dequantized", self.name(xq)));
                let scale = Tensor::from_data(&[], Data::F32(vec![sx])).expect("a scalar");
                let scale = self.init(&format!("{}/scale", self.name(xq)), &scale);
                let ins = vec![self.name(xq), scale, self.reshaped(zx, &[])];
                self.node("DequantizeLinear", ins, vec![name.clone()], vec![]);
                self.dequantized.insert(xq, name.clone());
                name
            }
        };
        let wdq = self.fresh(&format!("{}/dequantized", self.name(wq)));
        // Per channel: a filter's first axis, a matrix's last.
        let conv = match &d.kind {
            OpKind::ConvInteger(c) => Some(c.clone()),
            _ => None,
        };
        let axis = if conv.is_some() {
            0
        } else {
            f.ty(wq).rank() as i64 - 1
        };
        let attrs = if channels > 1 {
            vec![super::int("axis", axis)]
        } else {
            vec![]
        };
        let ins = vec![self.name(wq), sw, zero];
        self.node("DequantizeLinear", ins, vec![wdq.clone()], attrs);
        self.done.insert(s.cast);
        self.done.insert(s.mul);
        let Some(conv) = conv else {
            self.node("MatMul", vec![xdq, wdq], vec![self.name(s.y)], vec![]);
            return Ok(());
        };
        let mut ins = vec![xdq, wdq];
        let mut y = self.name(s.y);
        if let Some((add, bias)) = self.bias(s.y) {
            // The bias on the sums' scale, as onnxruntime quantizes it: i32 levels of step `c`
            // (the sums' own), dequantized per output channel.
            let step = spread(&s.c, bias.len());
            let levels: Vec<i32> = (bias.iter().zip(&step))
                .map(|(b, c)| {
                    (b / c)
                        .round_ties_even()
                        .clamp(i32::MIN as f32, i32::MAX as f32) as i32
                })
                .collect();
            let dims = [bias.len() as u64];
            y = self.name(f.op(add).results[0]);
            let q = Tensor::from_data(&dims, Data::I32(levels)).expect("one per channel");
            let q = self.init(&format!("{y}/bias"), &q);
            let step = Tensor::from_data(&dims, Data::F32(step)).expect("one per channel");
            let step = self.init(&format!("{y}/bias_scale"), &step);
            let b = self.fresh(&format!("{y}/bias_dequantized"));
            let axis = vec![super::int("axis", 0)];
            self.node("DequantizeLinear", vec![q, step], vec![b.clone()], axis);
            ins.push(b);
            self.done.insert(add);
        }
        self.node("Conv", ins, vec![y], conv_attrs(&conv));
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
        Some((add, spread(b, n)))
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

/// `v` (one element, or `n`) as `n` elements.
fn spread<T: Copy>(v: &[T], n: usize) -> Vec<T> {
    (0..n)
        .map(|i| v[if v.len() == 1 { 0 } else { i }])
        .collect()
}

//! A tcc function written as an ONNX model (`tcc export`): the other direction of the
//! importer, for handing a model tcc rewrote (quantized, folded) to other runtimes.
//!
//! Each op becomes the ONNX node(s) with its meaning at [`OPSET`]; values keep their names;
//! constants and parameters with stored values become initializers, the other parameters graph
//! inputs, the results graph outputs. Integer convolutions and products that carry their scales
//! (what `qdq` and `tcc quantize` write) go out in QDQ form, as onnxruntime's `quantize_static`
//! writes them (quant.rs). Ops with no ONNX meaning (gradients, fake quantization, channel-blocked
//! layouts, host swapping, training batch norm) are errors naming the op.

mod quant;

use crate::proto::attribute_proto::AttributeType;
use crate::proto::{
    AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto,
    TensorShapeProto, TypeProto, ValueInfoProto, tensor_shape_proto, type_proto,
};
use crate::tensor::{elem_type as elem, to_proto};
use crate::{Error, Result};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use tcc_ir::edit::Users;
use tcc_ir::{
    BinaryOp, CmpOp, DType, Data, Function, Op, OpKind, Pool2d, ReduceOp, Scalar, Tensor,
    TensorType, UnaryOp, Value,
};

/// The ONNX opset exported models import.
pub const OPSET: i64 = 17;

/// Writes `f` as an ONNX model; `stored` holds the values of parameters that are weights
/// (a module's `weights` directory), which become initializers.
pub fn export(f: &Function, stored: &BTreeMap<String, Arc<Tensor>>) -> Result<ModelProto> {
    let mut w = Writer {
        f,
        nodes: Vec::new(),
        inits: Vec::new(),
        taken: HashSet::new(),
        done: HashSet::new(),
        users: Users::new(f),
        constants: Vec::new(),
        dequantized: HashMap::new(),
    };
    for v in f.params().iter().chain(f.results()) {
        w.taken.insert(w.name(*v));
    }
    let mut inputs = Vec::new();
    for &p in f.params() {
        let name = w.name(p);
        match stored.get(f.name(p)) {
            Some(t) => w.inits.push(to_proto(&name, t)),
            None => inputs.push(value_info(&name, f.ty(p))),
        }
    }
    for &op in f.schedule() {
        if w.done.contains(&op) {
            continue;
        }
        let d = f.op(op);
        w.op(op).map_err(|e| {
            let at = match d.results.first() {
                Some(&r) => format!("`%{} = {}`", f.name(r), d.kind.id().mnemonic()),
                None => format!("`{}`", d.kind.id().mnemonic()),
            };
            e.context(at)
        })?;
    }
    // Results: a parameter, a constant, or a value returned twice, goes out through an Identity.
    let mut outputs = Vec::new();
    let mut seen = HashSet::new();
    for &r in f.results() {
        let mut name = w.name(r);
        let constant = f.def_op(r).is_none_or(|op| w.constants.contains(&op));
        if constant || !seen.insert(r) {
            let out = w.fresh(&format!("{name}/out"));
            w.node("Identity", vec![name], vec![out.clone()], vec![]);
            name = out;
        }
        outputs.push(value_info(&name, f.ty(r)));
    }
    // The constants some node reads (those a pattern absorbed are left out).
    let read: HashSet<&str> = (w.nodes.iter())
        .flat_map(|n| &n.input)
        .map(String::as_str)
        .collect();
    let mut constants = Vec::new();
    for &op in &w.constants {
        let d = f.op(op);
        let name = w.name(d.results[0]);
        if let (OpKind::Const { ty, value }, true) = (&d.kind, read.contains(name.as_str())) {
            let t = Tensor::from_literal(ty, value)
                .map_err(|e| Error::invalid(format!("constant `%{name}` is malformed: {e}")))?;
            constants.push(to_proto(&name, &t));
        }
    }
    w.inits.extend(constants);
    let graph = GraphProto {
        name: Some(f.name.clone()),
        node: w.nodes,
        initializer: w.inits,
        input: inputs,
        output: outputs,
        ..Default::default()
    };
    Ok(ModelProto {
        ir_version: Some(8),
        producer_name: Some("tcc".into()),
        producer_version: Some(env!("CARGO_PKG_VERSION").into()),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(OPSET),
        }],
        graph: Some(graph),
        ..Default::default()
    })
}

/// The model being written.
struct Writer<'a> {
    f: &'a Function,
    nodes: Vec<NodeProto>,
    inits: Vec<TensorProto>,
    /// Names given to helper tensors (and the parameters' and results'), so new ones are unique.
    taken: HashSet<String>,
    /// Ops already written as part of another's pattern.
    done: HashSet<Op>,
    users: Users,
    /// The constant ops, written as initializers at the end where a node reads them.
    constants: Vec<Op>,
    /// The dequantization written for each integer layer's activation, by its levels.
    dequantized: HashMap<Value, String>,
}

impl Writer<'_> {
    /// The ONNX name of `v`: its own.
    fn name(&self, v: Value) -> String {
        match self.f.name(v) {
            "" => format!("value{}", cranelift_entity::EntityRef::index(v)),
            n => n.to_string(),
        }
    }

    /// A new tensor name starting with `base`, unlike any value's and any given before.
    fn fresh(&mut self, base: &str) -> String {
        let mut name = base.to_string();
        let mut k = 1;
        while self.f.lookup(&name).is_some() || self.taken.contains(&name) {
            name = format!("{base}.{k}");
            k += 1;
        }
        self.taken.insert(name.clone());
        name
    }

    fn node(&mut self, op: &str, ins: Vec<String>, outs: Vec<String>, attrs: Vec<AttributeProto>) {
        let name = outs.first().cloned();
        self.nodes.push(NodeProto {
            op_type: Some(op.to_string()),
            name,
            input: ins,
            output: outs,
            attribute: attrs,
            ..Default::default()
        });
    }

    /// A new initializer holding `t`, named after `base`.
    fn init(&mut self, base: &str, t: &Tensor) -> String {
        let name = self.fresh(base);
        self.inits.push(to_proto(&name, t));
        name
    }

    /// An i64 vector initializer (shapes, axes, indices).
    fn ints(&mut self, base: &str, v: &[i64]) -> String {
        let t = Tensor::from_data(&[v.len() as u64], Data::I64(v.to_vec()))
            .expect("a vector of its own length");
        self.init(base, &t)
    }

    /// The value of `v` if it is a constant, or small elementwise or data-moving arithmetic on
    /// constants (a scale's product left unfolded).
    fn constant(&self, v: Value) -> Option<Tensor> {
        self.constant_within(v, 8)
    }

    fn constant_within(&self, v: Value, depth: usize) -> Option<Tensor> {
        let d = self.f.op(self.f.def_op(v)?);
        match &d.kind {
            OpKind::Const { ty, value } => Tensor::from_literal(ty, value).ok(),
            k if depth > 0
                && (k.is_elementwise()
                    || matches!(k, OpKind::Reshape { .. } | OpKind::BroadcastTo { .. }))
                && self.f.ty(v).numel() <= 1 << 16 =>
            {
                let args: Vec<Tensor> = (d.args.iter())
                    .map(|&a| self.constant_within(a, depth - 1))
                    .collect::<Option<_>>()?;
                let refs: Vec<&Tensor> = args.iter().collect();
                let out: Vec<TensorType> =
                    d.results.iter().map(|&r| self.f.ty(r).clone()).collect();
                tcc_ir::interp::eval_op(k, &refs, &out)
                    .ok()?
                    .into_iter()
                    .next()
            }
            _ => None,
        }
    }

    /// Writes op `op` (see the module docs).
    fn op(&mut self, op: Op) -> Result<()> {
        let f = self.f;
        let d = f.op(op);
        let ins: Vec<String> = d.args.iter().map(|&a| self.name(a)).collect();
        let outs: Vec<String> = d.results.iter().map(|&r| self.name(r)).collect();
        let y = outs[0].clone();
        let simple = |w: &mut Self, name: &str, attrs: Vec<AttributeProto>| {
            w.node(name, ins.clone(), outs.clone(), attrs)
        };
        match &d.kind {
            // Written at the end, if a node reads it.
            OpKind::Const { .. } => self.constants.push(op),
            OpKind::Unary(u) => match u {
                UnaryOp::Rsqrt => {
                    let s = self.fresh(&format!("{y}/sqrt"));
                    self.node("Sqrt", ins, vec![s.clone()], vec![]);
                    self.node("Reciprocal", vec![s], outs, vec![]);
                }
                UnaryOp::Gelu => self.gelu(&ins[0], &y, f.ty(d.args[0]).dtype()),
                _ => simple(self, unary(*u), vec![]),
            },
            OpKind::Binary(b) => simple(self, binary(*b), vec![]),
            OpKind::Compare(CmpOp::Ne) => {
                let e = self.fresh(&format!("{y}/eq"));
                self.node("Equal", ins, vec![e.clone()], vec![]);
                self.node("Not", vec![e], outs, vec![]);
            }
            OpKind::Compare(c) => simple(self, compare(*c), vec![]),
            OpKind::Select => simple(self, "Where", vec![]),
            OpKind::BroadcastTo { shape } => {
                let s = self.ints(&format!("{y}/shape"), &signed(shape));
                self.node("Expand", vec![ins[0].clone(), s], outs, vec![]);
            }
            OpKind::Cast { to } => simple(self, "Cast", vec![int("to", elem(*to) as i64)]),
            OpKind::StopGradient | OpKind::Identity => simple(self, "Identity", vec![]),
            OpKind::QuantizeLinear | OpKind::DequantizeLinear => {
                let name = if matches!(d.kind, OpKind::QuantizeLinear) {
                    "QuantizeLinear"
                } else {
                    "DequantizeLinear"
                };
                let (scale, zero, axis) = self.per_axis(d.args[1], d.args[2], d.args[0])?;
                let attrs = axis.map(|a| int("axis", a)).into_iter().collect();
                self.node(name, vec![ins[0].clone(), scale, zero], outs, attrs);
            }
            OpKind::MatMul => simple(self, "MatMul", vec![]),
            OpKind::Conv2d(c) => simple(self, "Conv", conv_attrs(c)),
            OpKind::ConvInteger(_) | OpKind::MatMulInteger => self.integer(op)?,
            OpKind::MaxPool2d(p) => simple(self, "MaxPool", pool_attrs(p)),
            OpKind::AvgPool2d {
                pool,
                count_include_pad,
            } => {
                let mut attrs = pool_attrs(pool);
                attrs.push(int("count_include_pad", i64::from(*count_include_pad)));
                simple(self, "AveragePool", attrs)
            }
            OpKind::GlobalAvgPool => simple(self, "GlobalAveragePool", vec![]),
            OpKind::Reduce {
                op: r,
                axes,
                keepdims,
            } => {
                let keep = int("keepdims", i64::from(*keepdims));
                match r {
                    ReduceOp::Sum => {
                        let a = self.ints(&format!("{y}/axes"), axes);
                        self.node("ReduceSum", vec![ins[0].clone(), a], outs, vec![keep]);
                    }
                    ReduceOp::Mean | ReduceOp::Max => {
                        let name = if *r == ReduceOp::Mean {
                            "ReduceMean"
                        } else {
                            "ReduceMax"
                        };
                        simple(self, name, vec![keep, ints("axes", axes)])
                    }
                }
            }
            OpKind::Softmax { axis } => simple(self, "Softmax", vec![int("axis", *axis)]),
            OpKind::LogSoftmax { axis } => simple(self, "LogSoftmax", vec![int("axis", *axis)]),
            OpKind::SoftmaxCrossEntropy => simple(
                self,
                "SoftmaxCrossEntropyLoss",
                vec![string("reduction", "mean")],
            ),
            OpKind::TopK { k, axis, largest } => {
                let k = self.ints(&format!("{y}/k"), &[*k as i64]);
                let attrs = vec![
                    int("axis", *axis),
                    int("largest", i64::from(*largest)),
                    int("sorted", 1),
                ];
                self.node("TopK", vec![ins[0].clone(), k], outs, attrs);
            }
            OpKind::BatchNorm { eps } => simple(
                self,
                "BatchNormalization",
                vec![float("epsilon", eps.0 as f32)],
            ),
            OpKind::Reshape { shape } => {
                let s = self.ints(&format!("{y}/shape"), &signed(shape));
                // A 0 in the shape is a 0, not "copy the input's".
                let attrs = if shape.contains(&0) {
                    vec![int("allowzero", 1)]
                } else {
                    vec![]
                };
                self.node("Reshape", vec![ins[0].clone(), s], outs, attrs);
            }
            OpKind::Transpose { perm } => {
                simple(self, "Transpose", vec![ints("perm", &signed(perm))])
            }
            OpKind::Concat { axis } => simple(self, "Concat", vec![int("axis", *axis)]),
            OpKind::Slice {
                starts,
                ends,
                steps,
            } => {
                let axes: Vec<i64> = (0..starts.len() as i64).collect();
                let inputs = vec![
                    ins[0].clone(),
                    self.ints(&format!("{y}/starts"), starts),
                    self.ints(&format!("{y}/ends"), ends),
                    self.ints(&format!("{y}/axes"), &axes),
                    self.ints(&format!("{y}/steps"), steps),
                ];
                self.node("Slice", inputs, outs, vec![]);
            }
            OpKind::Gather { axis } => simple(self, "Gather", vec![int("axis", *axis)]),
            other => {
                return Err(Error::unsupported(format!(
                    "`{}` has no ONNX form{}",
                    other.id().mnemonic(),
                    match other {
                        OpKind::FakeQuant { .. } =>
                            "; convert the model to integers first (`tcc quantize --from-qat`)",
                        OpKind::BatchNormTrain { .. } =>
                            "; export the inference model (batch norm on moving statistics)",
                        _ => " (export the model before training or layout passes rewrite it)",
                    }
                )));
            }
        }
        Ok(())
    }

    /// `gelu(x) = x * (1 + erf(x / sqrt 2)) / 2`, which opset 17 does not have as one node.
    fn gelu(&mut self, x: &str, y: &str, dt: DType) {
        let scalar = |w: &mut Self, base: &str, v: f64| {
            let data = Data::from_scalars(dt, [Scalar::from_f64(dt, v)]).expect("a float");
            let t = Tensor::from_data(&[], data).expect("a scalar");
            w.init(&format!("{y}/{base}"), &t)
        };
        let (r2, one, half) = (
            scalar(self, "sqrt2", std::f64::consts::SQRT_2),
            scalar(self, "one", 1.0),
            scalar(self, "half", 0.5),
        );
        let step = |w: &mut Self, op: &str, a: String, b: Option<String>, out: Option<&str>| {
            let o = out.map_or_else(
                || w.fresh(&format!("{y}/{}", op.to_lowercase())),
                str::to_string,
            );
            w.node(
                op,
                std::iter::once(a).chain(b).collect(),
                vec![o.clone()],
                vec![],
            );
            o
        };
        let t = step(self, "Div", x.to_string(), Some(r2), None);
        let t = step(self, "Erf", t, None, None);
        let t = step(self, "Add", t, Some(one), None);
        let t = step(self, "Mul", x.to_string(), Some(t), None);
        step(self, "Mul", t, Some(half), Some(y));
    }

    /// `v` (of as many elements) with shape `dims`: itself, a new initializer if it is a
    /// constant, else a Reshape.
    fn reshaped(&mut self, v: Value, dims: &[u64]) -> String {
        if self.f.ty(v).dims() == dims {
            return self.name(v);
        }
        match self.constant(v) {
            Some(t) => {
                let t = Tensor::from_data(dims, t.data().clone()).expect("same elements");
                self.init(&format!("{}/flat", self.name(v)), &t)
            }
            None => {
                let s = self.ints(&format!("{}/shape", self.name(v)), &signed(dims));
                let out = self.fresh(&format!("{}/flat", self.name(v)));
                self.node("Reshape", vec![self.name(v), s], vec![out.clone()], vec![]);
                out
            }
        }
    }

    /// A quantization's scale and zero point (broadcasting to `x` in the IR) as ONNX takes them:
    /// scalars, or vectors along one axis of `x`, which is returned.
    fn per_axis(
        &mut self,
        scale: Value,
        zero: Value,
        x: Value,
    ) -> Result<(String, String, Option<i64>)> {
        let f = self.f;
        let (sd, xd) = (f.ty(scale).dims().to_vec(), f.ty(x).dims().to_vec());
        let offset = xd.len() - sd.len();
        let varying: Vec<usize> = (0..sd.len()).filter(|&i| sd[i] > 1).collect();
        let axis = match varying[..] {
            [] => None,
            [i] => Some(i + offset),
            _ => {
                return Err(Error::unsupported(format!(
                    "a scale of shape {} varies along more than one axis; ONNX's are per tensor or per axis",
                    f.ty(scale).shape()
                )));
            }
        };
        let dims: Vec<u64> = axis.map(|a| vec![xd[a]]).unwrap_or_default();
        let (s, z) = (self.reshaped(scale, &dims), self.reshaped(zero, &dims));
        Ok((s, z, axis.map(|a| a as i64)))
    }
}

fn unary(u: UnaryOp) -> &'static str {
    match u {
        UnaryOp::Neg => "Neg",
        UnaryOp::Abs => "Abs",
        UnaryOp::Exp => "Exp",
        UnaryOp::Log => "Log",
        UnaryOp::Sqrt => "Sqrt",
        UnaryOp::Reciprocal => "Reciprocal",
        UnaryOp::Tanh => "Tanh",
        UnaryOp::Sigmoid => "Sigmoid",
        UnaryOp::Relu => "Relu",
        UnaryOp::Erf => "Erf",
        UnaryOp::Floor => "Floor",
        UnaryOp::Ceil => "Ceil",
        UnaryOp::Round => "Round",
        // Written as several nodes by the caller.
        UnaryOp::Rsqrt | UnaryOp::Gelu => unreachable!("expanded"),
    }
}

fn binary(b: BinaryOp) -> &'static str {
    match b {
        BinaryOp::Add => "Add",
        BinaryOp::Sub => "Sub",
        BinaryOp::Mul => "Mul",
        BinaryOp::Div => "Div",
        BinaryOp::Pow => "Pow",
        BinaryOp::Max => "Max",
        BinaryOp::Min => "Min",
    }
}

fn compare(c: CmpOp) -> &'static str {
    match c {
        CmpOp::Eq => "Equal",
        CmpOp::Lt => "Less",
        CmpOp::Le => "LessOrEqual",
        CmpOp::Gt => "Greater",
        CmpOp::Ge => "GreaterOrEqual",
        CmpOp::Ne => unreachable!("Equal then Not"),
    }
}

fn signed(v: &[u64]) -> Vec<i64> {
    v.iter().map(|&x| x as i64).collect()
}

fn conv_attrs(c: &tcc_ir::Conv2d) -> Vec<AttributeProto> {
    vec![
        ints("strides", &signed(&c.strides)),
        ints("pads", &signed(&c.pads)),
        ints("dilations", &signed(&c.dilations)),
        int("group", c.groups as i64),
    ]
}

fn pool_attrs(p: &Pool2d) -> Vec<AttributeProto> {
    vec![
        ints("kernel_shape", &signed(&p.kernel)),
        ints("strides", &signed(&p.strides)),
        ints("pads", &signed(&p.pads)),
    ]
}

fn int(name: &str, i: i64) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Int as i32),
        i: Some(i),
        ..Default::default()
    }
}

fn ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Ints as i32),
        ints: v.to_vec(),
        ..Default::default()
    }
}

fn float(name: &str, x: f32) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Float as i32),
        f: Some(x),
        ..Default::default()
    }
}

fn string(name: &str, s: &str) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::String as i32),
        s: Some(s.as_bytes().to_vec()),
        ..Default::default()
    }
}

/// A graph input's or output's name and type.
fn value_info(name: &str, ty: &TensorType) -> ValueInfoProto {
    let dim = (ty.dims().iter())
        .map(|&d| tensor_shape_proto::Dimension {
            value: Some(tensor_shape_proto::dimension::Value::DimValue(d as i64)),
            ..Default::default()
        })
        .collect();
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(elem(ty.dtype()) as i32),
                shape: Some(TensorShapeProto { dim }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

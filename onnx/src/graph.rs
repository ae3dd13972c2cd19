//! The graph walk: opsets, initializers, inputs with their shapes, nodes in topological order,
//! outputs. Each node goes to [`crate::lower::lower`] with a [`Ctx`] (from `ctx.rs`, which both
//! this module and the lowerings import; neither imports the other's internals).

use crate::ctx::{Ctx, Node};
use crate::proto::tensor_proto::DataType;
use crate::proto::{
    GraphProto, ModelProto, NodeProto, TensorProto, TypeProto, ValueInfoProto, type_proto,
};
use crate::tensor;
use crate::{Error, MIN_OPSET, Options, Params, Result};
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use tcc_ir::{DType, Function, FunctionBuilder, Module, OpKind, Tensor, Value};

/// Where in the model something is, for error messages.
pub(crate) struct NodeRef<'a> {
    pub node: &'a NodeProto,
    pub opset: i64,
}

impl fmt::Display for NodeRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.node;
        let op = n.op_type.as_deref().unwrap_or("?");
        match n.name.as_deref() {
            Some(name) if !name.is_empty() => {
                write!(f, "node `{name}` ({op}, opset {})", self.opset)
            }
            _ => match n.output.first() {
                Some(o) if !o.is_empty() => {
                    write!(f, "node producing `{o}` ({op}, opset {})", self.opset)
                }
                _ => write!(f, "unnamed {op} node (opset {})", self.opset),
            },
        }
    }
}

/// The default-domain opset the model imports.
fn default_opset(m: &ModelProto) -> Result<i64> {
    let found = m
        .opset_import
        .iter()
        .find(|o| matches!(o.domain.as_deref(), None | Some("" | "ai.onnx")))
        .map(|o| o.version.unwrap_or(0));
    match found {
        None => Err(Error::invalid(
            "the model imports no version of the default ONNX opset (opset_import is empty)",
        )),
        Some(v) if v < MIN_OPSET => Err(Error::unsupported(format!(
            "the model uses ONNX opset {v}; tcc reads opset {MIN_OPSET} and newer (convert it with onnx.version_converter)"
        ))),
        Some(v) => Ok(v),
    }
}

pub(crate) fn import_model(m: &ModelProto, opts: &Options) -> Result<Module> {
    let g = m
        .graph
        .as_ref()
        .ok_or_else(|| Error::invalid("the model has no graph"))?;
    let default_domain = |n: &NodeProto| matches!(n.domain.as_deref(), None | Some("" | "ai.onnx"));
    // A model whose nodes are all in other domains need not import the default opset; its
    // nodes are reported as unsupported one by one.
    let opset = match default_opset(m) {
        Err(e) if !e.is_unsupported() && !g.node.iter().any(default_domain) => MIN_OPSET,
        r => r?,
    };
    let selected = select_params(g, &opts.params)?;
    // With `Params::All`, an initializer that turns out to fix a shape stays a constant: the
    // import starts again without it (each retry removes one, so this ends).
    let mut keep_constant: Vec<&str> = Vec::new();
    loop {
        let params: Vec<&str> = (selected.iter().copied())
            .filter(|n| !keep_constant.contains(n))
            .collect();
        match import_graph(g, opset, opts, &params) {
            Err(e) if opts.params == Params::All => match e.constant_needed() {
                Some(name) if params.contains(&name) => {
                    let name = selected.iter().find(|&&n| n == name).copied();
                    keep_constant.extend(name);
                }
                _ => return Err(e),
            },
            r => {
                let (f, weights) = r?;
                let mut module = Module::new();
                module.functions.push(f);
                module.weights.values = weights;
                return Ok(module);
            }
        }
    }
}

/// The initializers `params` asks to make parameters, checked to exist.
fn select_params<'g>(g: &'g GraphProto, params: &Params) -> Result<Vec<&'g str>> {
    let floats = |t: &&TensorProto| {
        matches!(
            t.data_type.and_then(|d| DataType::try_from(d).ok()),
            Some(DataType::Float | DataType::Double)
        )
    };
    let names = |f: &dyn Fn(&&TensorProto) -> bool| -> Vec<&'g str> {
        g.initializer
            .iter()
            .filter(f)
            .filter_map(|t| t.name.as_deref())
            .collect()
    };
    match params {
        Params::None => Ok(Vec::new()),
        Params::All => Ok(names(&floats)),
        Params::Names(wanted) => {
            let all = names(&|_| true);
            let mut out = Vec::with_capacity(wanted.len());
            for w in wanted {
                match all.iter().find(|&&n| n == w) {
                    Some(&n) => out.push(n),
                    None => {
                        let shown: Vec<&str> = all.iter().take(12).copied().collect();
                        let more = if all.len() > shown.len() {
                            format!(" and {} more", all.len() - shown.len())
                        } else {
                            String::new()
                        };
                        return Err(Error::invalid(format!(
                            "--params names `{w}`, which is not an initializer of the model; its initializers are {}{more}",
                            list(&shown)
                        )));
                    }
                }
            }
            Ok(out)
        }
    }
}

/// The function, and the values of the initializers made parameters (`params`).
fn import_graph(
    g: &GraphProto,
    opset: i64,
    opts: &Options,
    params: &[&str],
) -> Result<(Function, BTreeMap<String, Arc<Tensor>>)> {
    let mut cx = Ctx {
        b: FunctionBuilder::new("main"),
        vals: HashMap::new(),
        weights: HashSet::new(),
    };
    if !g.sparse_initializer.is_empty() {
        return Err(Error::unsupported("sparse initializers are not supported"));
    }
    let dir = opts.dir.as_deref();

    // Inputs first, so parameters come before constants in the printed function. An input that
    // also has an initializer is a constant (the initializer is its default, ONNX IR < 4 lists
    // every initializer as an input).
    let initialized: std::collections::HashSet<&str> = g
        .initializer
        .iter()
        .filter_map(|t| t.name.as_deref())
        .collect();
    let inputs: Vec<&str> = g
        .input
        .iter()
        .filter_map(|vi| vi.name.as_deref())
        .filter(|n| !initialized.contains(n))
        .collect();
    let unknown = (opts.shapes.iter().map(|s| ("--shape", &s.0)))
        .chain(opts.constants.iter().map(|s| ("--const", &s.0)))
        .find(|(_, n)| !inputs.contains(&n.as_str()));
    if let Some((flag, name)) = unknown {
        return Err(Error::invalid(format!(
            "{flag} names `{name}`, which is not a graph input; the inputs are {}",
            list(&inputs)
        )));
    }
    for vi in &g.input {
        let name = vi.name.as_deref().unwrap_or("");
        if initialized.contains(name) {
            continue;
        }
        if name.is_empty() {
            return Err(Error::invalid("a graph input has no name"));
        }
        if let Some(i) = opts.constants.iter().position(|(n, _)| n == name) {
            let t = &opts.constants[i].1;
            let (dtype, _) = input_type(vi, Some(t.dims()))?;
            if dtype != t.dtype() {
                return Err(Error::invalid(format!(
                    "--const {name}: the value is {}, but graph input `{name}` is {dtype}",
                    t.ty()
                )));
            }
            let v = cx.constant(t.clone())?;
            cx.b.rename(v, name);
            cx.vals.insert(name.to_string(), v);
            continue;
        }
        let bound = opts.shapes.iter().position(|(n, _)| n == name);
        let (dtype, dims) = input_type(vi, bound.map(|i| opts.shapes[i].1.as_slice()))?;
        if cx.vals.contains_key(name) {
            return Err(Error::invalid(format!(
                "graph input `{name}` is declared twice"
            )));
        }
        let v =
            cx.b.param(name, dtype, &dims)
                .map_err(|e| Error::invalid(format!("graph input `{name}`: {}", e.0)))?;
        cx.vals.insert(name.to_string(), v);
    }
    // Initializers made parameters follow the graph inputs; the rest become constants.
    let params: HashSet<&str> = params.iter().copied().collect();
    let mut weights = BTreeMap::new();
    for pass in [true, false] {
        for t in &g.initializer {
            let name = t.name.as_deref().unwrap_or("");
            if name.is_empty() {
                return Err(Error::invalid("an initializer has no name"));
            }
            if params.contains(&name) != pass {
                continue;
            }
            let value = tensor::from_proto(t, dir, "initializer")?;
            let v = if pass {
                let ty = value.ty();
                let v =
                    cx.b.param(name, ty.dtype(), ty.dims())
                        .map_err(|e| Error::invalid(format!("initializer `{name}`: {}", e.0)))?;
                cx.weights.insert(v);
                weights.insert(name.to_string(), Arc::new(value));
                v
            } else {
                let v = cx.constant(value)?;
                cx.b.rename(v, name);
                v
            };
            if cx.vals.insert(name.to_string(), v).is_some() {
                return Err(Error::invalid(format!(
                    "initializer `{name}` is defined twice"
                )));
            }
        }
    }

    for i in topological_order(g, &cx.vals, opset)? {
        let node = &g.node[i];
        let at = NodeRef { node, opset };
        lower_node(&mut cx, node, opset, dir).map_err(|e| e.context(&at))?;
    }

    let mut results = Vec::with_capacity(g.output.len());
    for vi in &g.output {
        let name = vi.name.as_deref().unwrap_or("");
        let &v = cx.vals.get(name).ok_or_else(|| {
            Error::invalid(format!(
                "graph output `{name}` is not produced by any node, input or initializer"
            ))
        })?;
        check_declared(&cx, vi, v)?;
        results.push(v);
    }
    let mut f = cx.b.into_function();
    name_results(&mut f, g, results);
    remove_dead(&mut f);
    tcc_ir::verify_function(&f).map_err(|d| {
        Error::invalid(format!(
            "internal error: the imported function does not verify:\n{d}"
        ))
    })?;
    Ok((f, weights))
}

/// Sets the results, each named as its graph output. A value that got another name (an output
/// produced by `Identity`, a graph input or initializer returned as is, a value returned twice)
/// is renamed when it is an op result no other output uses, else returned through an
/// `identity` op with the output's name.
fn name_results(f: &mut Function, g: &GraphProto, mut results: Vec<Value>) {
    for (i, vi) in g.output.iter().enumerate() {
        let name = vi.name.as_deref().unwrap_or("");
        let v = results[i];
        if f.name(v) == name {
            continue;
        }
        let shared = results.iter().filter(|&&r| r == v).count() > 1;
        let free = f.lookup(name).is_none_or(|other| other == v);
        if f.def_op(v).is_some() && !shared && free {
            f.rename(v, name);
        } else {
            let ty = f.ty(v).clone();
            let op = f.add_op(OpKind::Identity, vec![v], vec![ty], &[name]);
            results[i] = f.op(op).results[0];
        }
    }
    f.set_results(results);
}

/// Removes ops no result depends on: constants only folding read, shape inputs, unused
/// initializers and outputs the graph does not return.
fn remove_dead(f: &mut Function) {
    let mut live: cranelift_entity::SecondaryMap<Value, bool> = Default::default();
    for &r in f.results() {
        live[r] = true;
    }
    let mut dead = cranelift_entity::SecondaryMap::<tcc_ir::Op, bool>::new();
    for &op in f.schedule().iter().rev() {
        let d = f.op(op);
        if d.results.iter().any(|&r| live[r]) {
            for &a in &d.args {
                live[a] = true;
            }
        } else {
            dead[op] = true;
        }
    }
    f.remove_ops(|op| dead[op]);
}

fn list(names: &[&str]) -> String {
    if names.is_empty() {
        return "none".into();
    }
    names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The tensor type of a value info: element type and dims, or an error.
fn tensor_of<'a>(vi: &'a ValueInfoProto, what: &str) -> Result<&'a type_proto::Tensor> {
    match vi
        .r#type
        .as_ref()
        .and_then(|t: &TypeProto| t.value.as_ref())
    {
        Some(type_proto::Value::TensorType(t)) => Ok(t),
        Some(_) => Err(Error::unsupported(format!(
            "{what} is not a tensor (sequences, maps, optionals and sparse tensors are not supported)"
        ))),
        None => Err(Error::invalid(format!("{what} has no type"))),
    }
}

/// The dtype and dims of a graph input, with dynamic dims bound by `bound` (from `--shape`).
fn input_type(vi: &ValueInfoProto, bound: Option<&[u64]>) -> Result<(DType, Vec<u64>)> {
    let name = vi.name.as_deref().unwrap_or("");
    let what = format!("graph input `{name}`");
    let t = tensor_of(vi, &what)?;
    let dtype = tensor::dtype(t.elem_type.unwrap_or(0), &what)?;
    let example = |dims: &[Option<u64>]| {
        let d: Vec<String> = dims.iter().map(|d| d.unwrap_or(1).to_string()).collect();
        format!("--shape {name}={}", d.join(","))
    };
    let Some(shape) = &t.shape else {
        return bound.map(|b| (dtype, b.to_vec())).ok_or_else(|| {
            Error::invalid(format!(
                "{what} has no declared shape; bind it with --shape {name}=D0,D1,..."
            ))
        });
    };
    use crate::proto::tensor_shape_proto::dimension::Value as Dim;
    let declared: Vec<Option<u64>> = shape
        .dim
        .iter()
        .map(|d| match d.value {
            Some(Dim::DimValue(v)) if v >= 0 => Ok(Some(v as u64)),
            // Some exporters (Paddle) write an unknown dimension as -1.
            Some(Dim::DimValue(-1)) => Ok(None),
            Some(Dim::DimValue(v)) => Err(Error::invalid(format!(
                "{what} has a negative dimension {v}"
            ))),
            _ => Ok(None),
        })
        .collect::<Result<_>>()?;
    let spelled: Vec<String> = shape
        .dim
        .iter()
        .map(|d| match &d.value {
            Some(Dim::DimValue(v)) => v.to_string(),
            Some(Dim::DimParam(p)) if !p.is_empty() => p.clone(),
            _ => "?".into(),
        })
        .collect();
    match bound {
        Some(b) => {
            if b.len() != declared.len() {
                return Err(Error::invalid(format!(
                    "the shape given for `{name}` has {} dimensions, but {what} has rank {} ([{}])",
                    b.len(),
                    declared.len(),
                    spelled.join(",")
                )));
            }
            for (i, (&g, d)) in b.iter().zip(&declared).enumerate() {
                if let Some(d) = *d
                    && d != g
                {
                    return Err(Error::invalid(format!(
                        "the shape given for `{name}` has {g} at dimension {i}, but the model fixes it at {d}"
                    )));
                }
            }
            Ok((dtype, b.to_vec()))
        }
        None => match declared.iter().position(Option::is_none) {
            Some(i) => Err(Error::invalid(format!(
                "{what} has dynamic dimension `{}` (axis {i} of [{}]); bind it, as in {}",
                spelled[i],
                spelled.join(","),
                example(&declared)
            ))),
            None => Ok((dtype, declared.into_iter().flatten().collect())),
        },
    }
}

/// Checks a graph output against its declared element type and static dims.
fn check_declared(cx: &Ctx, vi: &ValueInfoProto, v: Value) -> Result<()> {
    let name = vi.name.as_deref().unwrap_or("");
    let what = format!("graph output `{name}`");
    let Some(type_proto::Value::TensorType(t)) = vi.r#type.as_ref().and_then(|t| t.value.as_ref())
    else {
        return Ok(());
    };
    let ty = cx.ty(v);
    if let Some(e) = t.elem_type.filter(|&e| e != 0) {
        let dtype = tensor::dtype(e, &what)?;
        if dtype != ty.dtype() {
            return Err(Error::invalid(format!(
                "{what} is declared {dtype}, but its value is {ty}"
            )));
        }
    }
    use crate::proto::tensor_shape_proto::dimension::Value as Dim;
    if let Some(shape) = &t.shape {
        let declared: Option<Vec<u64>> = shape
            .dim
            .iter()
            .map(|d| match d.value {
                Some(Dim::DimValue(v)) if v >= 0 => Some(v as u64),
                _ => None,
            })
            .collect();
        if let Some(d) = declared
            && d != ty.dims()
        {
            return Err(Error::invalid(format!(
                "{what} is declared with shape {d:?}, but tcc computes {ty}"
            )));
        }
    }
    Ok(())
}

/// Node indices in an order where every value is produced before it is used: the file's order
/// where it allows, so a sorted graph keeps its order. Unknown inputs are reported by lowering.
fn topological_order(
    g: &GraphProto,
    known: &HashMap<String, Value>,
    opset: i64,
) -> Result<Vec<usize>> {
    let mut producer: HashMap<&str, usize> = HashMap::new();
    for (i, n) in g.node.iter().enumerate() {
        for o in n.output.iter().filter(|o| !o.is_empty()) {
            if known.contains_key(o.as_str()) {
                return Err(Error::invalid(format!(
                    "{}: output `{o}` is also a graph input or initializer",
                    NodeRef { node: n, opset }
                )));
            }
            if let Some(&j) = producer.get(o.as_str()) {
                return Err(Error::invalid(format!(
                    "value `{o}` is produced twice: by {} and by {}",
                    NodeRef {
                        node: &g.node[j],
                        opset
                    },
                    NodeRef { node: n, opset }
                )));
            }
            producer.insert(o, i);
        }
    }
    let mut users: Vec<Vec<usize>> = vec![Vec::new(); g.node.len()];
    let mut pending = vec![0usize; g.node.len()];
    for (i, n) in g.node.iter().enumerate() {
        for inp in &n.input {
            if let Some(&j) = producer.get(inp.as_str()) {
                users[j].push(i);
                pending[i] += 1;
            }
        }
    }
    let mut ready: BinaryHeap<std::cmp::Reverse<usize>> = (0..g.node.len())
        .filter(|&i| pending[i] == 0)
        .map(std::cmp::Reverse)
        .collect();
    let mut order = Vec::with_capacity(g.node.len());
    while let Some(std::cmp::Reverse(i)) = ready.pop() {
        order.push(i);
        for &u in &users[i] {
            pending[u] -= 1;
            if pending[u] == 0 {
                ready.push(std::cmp::Reverse(u));
            }
        }
    }
    if order.len() < g.node.len() {
        let stuck = (0..g.node.len()).find(|&i| pending[i] > 0).unwrap_or(0);
        return Err(Error::invalid(format!(
            "the graph has a cycle: {} depends, through its inputs, on its own outputs",
            NodeRef {
                node: &g.node[stuck],
                opset
            }
        )));
    }
    Ok(order)
}

/// Lowers one node and binds its outputs.
fn lower_node(cx: &mut Ctx, node: &NodeProto, opset: i64, dir: Option<&Path>) -> Result<()> {
    match node.domain.as_deref() {
        None | Some("" | "ai.onnx") => {}
        Some(d) => {
            return Err(Error::unsupported(format!(
                "op `{}` of domain `{d}` is not supported (only the default ONNX domain is)",
                node.op_type.as_deref().unwrap_or("?")
            )));
        }
    }
    let mut ins = Vec::with_capacity(node.input.len());
    for (i, name) in node.input.iter().enumerate() {
        if name.is_empty() {
            ins.push(None);
            continue;
        }
        let &v = cx.vals.get(name.as_str()).ok_or_else(|| {
            Error::invalid(format!(
                "input {i} `{name}` is not produced by any node and is not a graph input or initializer"
            ))
        })?;
        ins.push(Some(v));
    }
    let first_new = cx.function().num_values_created();
    let scope = node
        .output
        .iter()
        .find(|o| !o.is_empty())
        .cloned()
        .unwrap_or_default();
    cx.b.push_scope(&scope);
    let n = Node {
        p: node,
        ins,
        opset,
        dir,
    };
    let outs = crate::lower::lower(cx, &n);
    cx.b.pop_scope();
    let outs = outs?;
    for (i, name) in node.output.iter().enumerate() {
        if name.is_empty() {
            continue;
        }
        let v = outs.get(i).copied().flatten().ok_or_else(|| {
            Error::unsupported(format!(
                "output {i} (`{name}`) is not supported; only the first {} output{} can be used",
                outs.len(),
                if outs.len() == 1 { "" } else { "s" }
            ))
        })?;
        if cranelift_entity::EntityRef::index(v) >= first_new {
            cx.b.rename(v, name);
        }
        cx.vals.insert(name.clone(), v);
    }
    Ok(())
}

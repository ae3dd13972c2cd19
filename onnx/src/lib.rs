//! The ONNX frontend: reads `.onnx` models and lowers them into tcc's IR.
//!
//! [`import_file`] (or [`import`] on bytes) decodes the protobuf, binds dynamic dimensions from
//! [`Options::shapes`], and lowers the graph node by node into one function `@main`: graph inputs
//! become parameters, initializers and `Constant` nodes become constants, and every value keeps
//! its ONNX name (the ops a node expands into are scoped under its first output's name). Shapes
//! are static in tcc, so inputs that fix a shape (`Reshape`'s shape, `Slice`'s starts, ...) must
//! be known at import time; ops whose operands are all constants are folded as they are built,
//! which covers the usual `Shape -> Gather -> Concat -> Reshape` chains.
//!
//! Errors say where: the node (name, op type, opset) or the initializer or input. They come in
//! two kinds ([`Error::is_unsupported`]): the model asks for something tcc does not do (an op,
//! an attribute value, an element type), or the model is malformed. Nothing a file contains makes
//! the importer panic.
//!
//! The Rust code for `onnx.proto` is generated once and committed ([`proto`]; see
//! `onnx/gen-proto`).

#![deny(missing_docs)]

mod ctx;
mod export;
mod graph;
mod lower;
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto;
pub use export::{OPSET, export};
mod tensor;

use prost::Message;
use std::fmt;
use std::path::{Path, PathBuf};
use tcc_ir::{Module, Tensor};

/// The oldest default-domain opset the importer accepts (newer ones than it knows, 27, are read
/// with the newest semantics it knows).
pub const MIN_OPSET: i64 = 6;

/// How to import.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Shapes for graph inputs, by input name; needed for inputs with dynamic dimensions.
    pub shapes: Vec<(String, Vec<u64>)>,
    /// Graph inputs fixed to a value: they become constants instead of parameters. Needed for
    /// inputs that decide shapes (a `Reshape` target, `Slice` bounds, reduction axes).
    pub constants: Vec<(String, Tensor)>,
    /// Where external data files are found (default: the model file's folder).
    pub dir: Option<PathBuf>,
    /// Which initializers become parameters that keep their values (to be trained or
    /// differentiated) instead of constants.
    pub params: Params,
}

/// Which initializers an import turns into parameters. Such a parameter's value goes to the
/// module's [`tcc_ir::Weights`], so the function still runs at the model's own weights, and no
/// constant folding at import reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Params {
    /// Every initializer is a constant (inference).
    #[default]
    None,
    /// Every floating-point initializer, except those the import must know to fix a shape
    /// (a `Resize` scale, a `Pad` value): those stay constants.
    All,
    /// The named initializers. A name that is not an initializer, or an initializer that
    /// fixes a shape, is an error.
    Names(Vec<String>),
}

impl Options {
    /// Parses a `NAME=1,3,224,224` binding and adds it.
    pub fn add_shape(&mut self, spec: &str) -> std::result::Result<(), String> {
        let (name, dims) = spec
            .rsplit_once('=')
            .ok_or_else(|| format!("--shape `{spec}`: expected NAME=D0,D1,..."))?;
        let dims = if dims.trim().is_empty() {
            Vec::new()
        } else {
            dims.split(',')
                .map(|d| d.trim().parse::<u64>())
                .collect::<std::result::Result<Vec<u64>, _>>()
                .map_err(|_| {
                    format!("--shape `{spec}`: dimensions must be non-negative integers, as in x=1,3,224,224")
                })?
        };
        self.shapes.push((name.to_string(), dims));
        Ok(())
    }
}

/// Why a model could not be imported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    unsupported: bool,
    msg: String,
    /// The graph input that would have to be a constant.
    input: Option<String>,
}

impl Error {
    pub(crate) fn invalid(msg: impl Into<String>) -> Error {
        Error {
            unsupported: false,
            msg: msg.into(),
            input: None,
        }
    }

    pub(crate) fn unsupported(msg: impl Into<String>) -> Error {
        Error {
            unsupported: true,
            msg: msg.into(),
            input: None,
        }
    }

    /// Prefixes the message with where it happened.
    pub(crate) fn context(self, at: impl fmt::Display) -> Error {
        Error {
            msg: format!("{at}: {}", self.msg),
            ..self
        }
    }

    /// True when the model is valid but uses something tcc does not support (an op, an attribute
    /// value or an element type); false when the model itself is malformed.
    pub fn is_unsupported(&self) -> bool {
        self.unsupported
    }

    /// An error for graph input `input`, which decides a shape and so must be bound to a value
    /// at import time ([`Options::constants`]).
    pub(crate) fn needs_constant(msg: impl Into<String>, input: &str) -> Error {
        Error {
            unsupported: true,
            msg: msg.into(),
            input: Some(input.to_string()),
        }
    }

    /// The graph input that must be bound with [`Options::constants`] for the import to go on,
    /// when that is the problem.
    pub fn constant_needed(&self) -> Option<&str> {
        self.input.as_deref()
    }

    /// The message, without the `error:` prefix.
    pub fn message(&self) -> &str {
        &self.msg
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)
    }
}

impl std::error::Error for Error {}

pub(crate) type Result<T> = std::result::Result<T, Error>;

/// Imports a model from its bytes. External data is looked up in `opts.dir`.
pub fn import(bytes: &[u8], opts: &Options) -> Result<Module> {
    import_model(&read_model(bytes)?, opts)
}

/// Imports a decoded model (see [`read_model`]).
pub fn import_model(m: &proto::ModelProto, opts: &Options) -> Result<Module> {
    graph::import_model(m, opts)
}

/// Replaces the values of initializers (a fine-tuned model's weights), keeping everything else
/// of the model. Each value must have its initializer's element type and shape; the new data is
/// stored inline (`raw_data`), also where the old was external.
pub fn set_initializers(m: &mut proto::ModelProto, values: &[(String, Tensor)]) -> Result<()> {
    let g = m
        .graph
        .as_mut()
        .ok_or_else(|| Error::invalid("the model has no graph"))?;
    for (name, t) in values {
        let slot = g
            .initializer
            .iter_mut()
            .find(|i| i.name.as_deref() == Some(name.as_str()))
            .ok_or_else(|| Error::invalid(format!("the model has no initializer `{name}`")))?;
        let what = format!("initializer `{name}`");
        let dtype = tensor::dtype(slot.data_type.unwrap_or(0), &what)?;
        let ty = tensor::tensor_type(dtype, &slot.dims, &what)?;
        if &ty != t.ty() {
            return Err(Error::invalid(format!(
                "{what} is {ty}, but its new value is {}",
                t.ty()
            )));
        }
        *slot = tensor::to_proto(name, t);
    }
    Ok(())
}

/// The graph inputs (not initializers) whose shape the model leaves open: a symbolic, unknown
/// or `-1` dimension, or no shape at all. These are the ones [`Options::shapes`] must bind.
pub fn dynamic_inputs(m: &proto::ModelProto) -> Vec<&str> {
    use proto::tensor_shape_proto::dimension::Value as Dim;
    let Some(g) = &m.graph else {
        return Vec::new();
    };
    let init: std::collections::HashSet<&str> = g
        .initializer
        .iter()
        .filter_map(|t| t.name.as_deref())
        .collect();
    let fixed = |vi: &proto::ValueInfoProto| match vi.r#type.as_ref().and_then(|t| t.value.as_ref())
    {
        Some(proto::type_proto::Value::TensorType(t)) => t.shape.as_ref().is_some_and(|s| {
            s.dim
                .iter()
                .all(|d| matches!(d.value, Some(Dim::DimValue(v)) if v >= 0))
        }),
        _ => true,
    };
    g.input
        .iter()
        .filter(|vi| !fixed(vi))
        .filter_map(|vi| vi.name.as_deref())
        .filter(|n| !init.contains(n))
        .collect()
}

/// The names of a model's initializers, in file order.
pub fn initializer_names(m: &proto::ModelProto) -> Vec<&str> {
    m.graph
        .iter()
        .flat_map(|g| &g.initializer)
        .filter_map(|t| t.name.as_deref())
        .collect()
}

/// Imports a model file; external data files are looked up beside it unless `opts.dir` is set.
pub fn import_file(path: &Path, opts: &Options) -> Result<Module> {
    let bytes = std::fs::read(path)
        .map_err(|e| Error::invalid(format!("cannot read `{}`: {e}", path.display())))?;
    let mut opts = opts.clone();
    if opts.dir.is_none() {
        opts.dir = Some(path.parent().unwrap_or(Path::new(".")).to_path_buf());
    }
    import(&bytes, &opts).map_err(|e| e.context(path.display()))
}

/// Decodes a model without importing it.
pub fn read_model(bytes: &[u8]) -> Result<proto::ModelProto> {
    proto::ModelProto::decode(bytes)
        .map_err(|e| Error::invalid(format!("not a valid ONNX model (protobuf): {e}")))
}

/// Encodes a model (for tools and tests that build models in Rust).
pub fn write_model(m: &proto::ModelProto) -> Vec<u8> {
    m.encode_to_vec()
}

/// Decodes a serialized `TensorProto` (the `.pb` files of ONNX test data).
pub fn read_tensor(bytes: &[u8]) -> Result<Tensor> {
    let t = proto::TensorProto::decode(bytes)
        .map_err(|e| Error::invalid(format!("not a valid ONNX tensor (protobuf): {e}")))?;
    tensor::from_proto(&t, None, "tensor")
}

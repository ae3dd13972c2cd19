//! Op attributes: each op's attribute names, types and defaults, declared once.
//!
//! [`OpKind::read_attrs`] and [`OpKind::write_attrs`] are two instantiations of one declaration
//! (the `declare_attrs!` body below): the parser reads with it, the printer writes with it
//! (leaving out attributes at their default, so printing is a fixed point of parsing), and
//! [`OpId::attrs`] lists it for the docs index. A field's Rust type gives the attribute's text
//! form through [`AttrValue`].

use super::schema::{Category, OpId};
use super::{Conv2d, F64, OpKind, Pool2d};
use crate::literal::{Literal, Scalar};
use crate::types::{DType, TensorType};
use std::convert::Infallible;
use std::fmt::Write;

/// An attribute value as written in the text form, before it is given a type.
#[derive(Clone, Debug)]
pub enum AttrText<'a> {
    /// A bare word: `true`, `f32`.
    Word(&'a str),
    /// A number.
    Num(&'a str),
    /// A `[list]` of words or numbers, each with its byte offset in the source.
    List(Vec<(&'a str, usize)>),
}

/// Why an attribute's text did not read as its type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttrError {
    /// The byte offset of the offending list element; `None` for the attribute as a whole.
    pub at: Option<usize>,
    /// What the attribute must be, as in "attribute `axes` of `reduce_sum` must be {expected}".
    pub expected: String,
}

impl AttrError {
    fn whole(expected: impl Into<String>) -> AttrError {
        AttrError {
            at: None,
            expected: expected.into(),
        }
    }
}

/// A Rust type that can hold an attribute: how its text reads and writes.
pub trait AttrValue: Clone + PartialEq {
    /// The type as the docs index shows it: `int`, `[uint]`, `bool`.
    fn type_name() -> String;
    /// Reads the text form.
    fn parse(t: &AttrText<'_>) -> Result<Self, AttrError>;
    /// Writes the text form, which [`AttrValue::parse`] reads back to the same value.
    fn write(&self, out: &mut String);
}

fn number<T: std::str::FromStr>(t: &AttrText<'_>, expected: &str) -> Result<T, AttrError> {
    match t {
        AttrText::Num(s) => s.parse().map_err(|_| AttrError::whole(expected)),
        _ => Err(AttrError::whole(expected)),
    }
}

fn list<T: std::str::FromStr>(
    t: &AttrText<'_>,
    element: &str,
    example: &str,
) -> Result<Vec<T>, AttrError> {
    match t {
        AttrText::List(items) => items
            .iter()
            .map(|&(s, at)| {
                s.parse().map_err(|_| AttrError {
                    at: Some(at),
                    expected: format!("a list of {element}"),
                })
            })
            .collect(),
        _ => Err(AttrError::whole(format!(
            "a list of {element} such as `{example}`"
        ))),
    }
}

fn write_list<T: std::fmt::Display>(v: &[T], out: &mut String) {
    out.push('[');
    for (i, x) in v.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "{x}");
    }
    out.push(']');
}

impl AttrValue for i64 {
    fn type_name() -> String {
        "int".into()
    }
    fn parse(t: &AttrText<'_>) -> Result<i64, AttrError> {
        number(t, "an integer")
    }
    fn write(&self, out: &mut String) {
        let _ = write!(out, "{self}");
    }
}

impl AttrValue for u64 {
    fn type_name() -> String {
        "uint".into()
    }
    fn parse(t: &AttrText<'_>) -> Result<u64, AttrError> {
        number(t, "a non-negative integer")
    }
    fn write(&self, out: &mut String) {
        let _ = write!(out, "{self}");
    }
}

impl AttrValue for bool {
    fn type_name() -> String {
        "bool".into()
    }
    fn parse(t: &AttrText<'_>) -> Result<bool, AttrError> {
        match t {
            AttrText::Word("true") => Ok(true),
            AttrText::Word("false") => Ok(false),
            _ => Err(AttrError::whole("`true` or `false`")),
        }
    }
    fn write(&self, out: &mut String) {
        out.push_str(if *self { "true" } else { "false" });
    }
}

impl AttrValue for F64 {
    fn type_name() -> String {
        "float".into()
    }
    fn parse(t: &AttrText<'_>) -> Result<F64, AttrError> {
        match t {
            AttrText::Num(s) => Scalar::parse(DType::F64, s)
                .map(|x| F64(x.to_f64()))
                .map_err(|_| AttrError::whole("a number")),
            _ => Err(AttrError::whole("a number")),
        }
    }
    fn write(&self, out: &mut String) {
        let _ = write!(out, "{}", Scalar::F64(self.0));
    }
}

impl AttrValue for DType {
    fn type_name() -> String {
        "dtype".into()
    }
    fn parse(t: &AttrText<'_>) -> Result<DType, AttrError> {
        let bad = || AttrError::whole("a dtype (f32, f64, i8, u8, i32, i64, bool)");
        match t {
            AttrText::Word(w) => DType::from_name(w).ok_or_else(bad),
            _ => Err(bad()),
        }
    }
    fn write(&self, out: &mut String) {
        let _ = write!(out, "{self}");
    }
}

impl AttrValue for Vec<i64> {
    fn type_name() -> String {
        "[int]".into()
    }
    fn parse(t: &AttrText<'_>) -> Result<Vec<i64>, AttrError> {
        list(t, "integers", "[0,1]")
    }
    fn write(&self, out: &mut String) {
        write_list(self, out)
    }
}

impl AttrValue for Vec<u64> {
    fn type_name() -> String {
        "[uint]".into()
    }
    fn parse(t: &AttrText<'_>) -> Result<Vec<u64>, AttrError> {
        list(t, "non-negative integers", "[2,3]")
    }
    fn write(&self, out: &mut String) {
        write_list(self, out)
    }
}

impl<const N: usize> AttrValue for [u64; N] {
    fn type_name() -> String {
        format!("[uint; {N}]")
    }
    fn parse(t: &AttrText<'_>) -> Result<[u64; N], AttrError> {
        Vec::<u64>::parse(t)?
            .try_into()
            .map_err(|_| AttrError::whole(format!("a list of {N} non-negative integers")))
    }
    fn write(&self, out: &mut String) {
        write_list(self, out)
    }
}

/// What an attribute is when the text leaves it out.
#[derive(Clone, Debug, PartialEq)]
pub enum AttrDefault<T> {
    /// It must be given.
    Required,
    /// This value (and the printer leaves it out when it has this value).
    Value(T),
    /// One `1` per axis, as many as the op's other list attributes have: this value.
    OnePerAxis(T),
}

impl<T> AttrDefault<T> {
    fn value(self) -> Option<T> {
        match self {
            AttrDefault::Required => None,
            AttrDefault::Value(v) | AttrDefault::OnePerAxis(v) => Some(v),
        }
    }
}

/// Fills an op's attributes from text; [`OpKind::read_attrs`] calls it once per attribute.
pub trait ReadAttrs {
    /// Why an attribute could not be read.
    type Error;
    /// Sets `field` from the attribute `name`, or from `default` when it is absent.
    fn attr<T: AttrValue>(
        &mut self,
        name: &'static str,
        field: &mut T,
        default: AttrDefault<T>,
    ) -> Result<(), Self::Error>;
    /// Sets a constant's elements from the required attribute `name`, read as `dtype`.
    fn literal(
        &mut self,
        name: &'static str,
        field: &mut Literal,
        dtype: DType,
    ) -> Result<(), Self::Error>;
}

/// Receives an op's attributes; [`OpKind::write_attrs`] calls it once per attribute.
pub trait WriteAttrs {
    /// Takes the attribute `name`, its value and its default.
    fn attr<T: AttrValue>(
        &mut self,
        name: &'static str,
        field: &T,
        default: AttrDefault<T>,
    ) -> Result<(), Infallible>;
    /// Takes a constant's elements.
    fn literal(
        &mut self,
        name: &'static str,
        field: &Literal,
        dtype: DType,
    ) -> Result<(), Infallible>;
}

/// The one declaration of every op's attributes, instantiated for reading (`&mut` fields) and
/// for writing (`&` fields). Order is the text order.
macro_rules! declare_attrs {
    ($kind:expr, $v:ident) => {{
        use AttrDefault::{OnePerAxis, Required, Value};
        let conv_default = Conv2d::default();
        macro_rules! conv {
            ($c:ident) => {{
                let Conv2d {
                    strides,
                    pads,
                    dilations,
                    groups,
                } = $c;
                $v.attr("strides", strides, Value(conv_default.strides))?;
                $v.attr("pads", pads, Value(conv_default.pads))?;
                $v.attr("dilations", dilations, Value(conv_default.dilations))?;
                $v.attr("groups", groups, Value(conv_default.groups))?;
            }};
        }
        macro_rules! pool {
            ($p:ident) => {{
                let Pool2d {
                    kernel,
                    strides,
                    pads,
                } = $p;
                $v.attr("kernel", kernel, Required)?;
                $v.attr("strides", strides, Value([1, 1]))?;
                $v.attr("pads", pads, Value([0; 4]))?;
            }};
        }
        macro_rules! slice {
            ($starts:ident, $ends:ident, $steps:ident) => {{
                $v.attr("starts", $starts, Required)?;
                $v.attr("ends", $ends, Required)?;
                let ones = vec![1; $starts.len()];
                $v.attr("steps", $steps, OnePerAxis(ones))?;
            }};
        }
        match $kind {
            OpKind::Const { ty, value } => $v.literal("value", value, ty.dtype())?,
            OpKind::BroadcastTo { shape } | OpKind::Reshape { shape } => {
                $v.attr("shape", shape, Required)?
            }
            OpKind::Cast { to } => $v.attr("to", to, Required)?,
            OpKind::Conv2d(c) | OpKind::ConvInteger(c) => conv!(c),
            OpKind::Conv2dNchwc { conv, block } => {
                conv!(conv);
                $v.attr("block", block, Required)?;
            }
            OpKind::ToNchwc { block } => $v.attr("block", block, Required)?,
            OpKind::FromNchwc { channels } => $v.attr("channels", channels, Required)?,
            OpKind::Conv2dGradInput { conv, shape } | OpKind::Conv2dGradFilter { conv, shape } => {
                conv!(conv);
                $v.attr("shape", shape, Required)?;
            }
            OpKind::MaxPool2d(p) | OpKind::MaxPool2dGrad(p) => pool!(p),
            OpKind::AvgPool2d {
                pool,
                count_include_pad,
            } => {
                pool!(pool);
                $v.attr("count_include_pad", count_include_pad, Value(false))?;
            }
            OpKind::AvgPool2dGrad {
                pool,
                count_include_pad,
                shape,
            } => {
                pool!(pool);
                $v.attr("count_include_pad", count_include_pad, Value(false))?;
                $v.attr("shape", shape, Required)?;
            }
            OpKind::Reduce { axes, keepdims, .. } => {
                $v.attr("axes", axes, Required)?;
                $v.attr("keepdims", keepdims, Value(false))?;
            }
            OpKind::Softmax { axis } | OpKind::LogSoftmax { axis } => {
                $v.attr("axis", axis, Value(-1))?
            }
            OpKind::Concat { axis } | OpKind::Gather { axis } | OpKind::ScatterAdd { axis } => {
                $v.attr("axis", axis, Required)?
            }
            OpKind::FakeQuant { bits, narrow } => {
                $v.attr("bits", bits, Value(8))?;
                $v.attr("narrow", narrow, Value(false))?;
            }
            OpKind::TopK { k, axis, largest } => {
                $v.attr("k", k, Required)?;
                $v.attr("axis", axis, Value(-1))?;
                $v.attr("largest", largest, Value(true))?;
            }
            OpKind::BatchNorm { eps } | OpKind::BatchNormTrain { eps } => {
                $v.attr("eps", eps, Value(F64(1e-5)))?
            }
            OpKind::Transpose { perm } => $v.attr("perm", perm, Required)?,
            OpKind::Slice {
                starts,
                ends,
                steps,
            } => slice!(starts, ends, steps),
            OpKind::SliceGrad {
                shape,
                starts,
                ends,
                steps,
            } => {
                $v.attr("shape", shape, Required)?;
                slice!(starts, ends, steps);
            }
            OpKind::Unary(_)
            | OpKind::Binary(_)
            | OpKind::Compare(_)
            | OpKind::Select
            | OpKind::StopGradient
            | OpKind::Identity
            | OpKind::SwapOut
            | OpKind::SwapIn
            | OpKind::QuantizeLinear
            | OpKind::DequantizeLinear
            | OpKind::MatMul
            | OpKind::MatMulInteger
            | OpKind::GlobalAvgPool
            | OpKind::SoftmaxCrossEntropy
            | OpKind::SoftmaxCrossEntropyGrad => {}
        }
        Ok(())
    }};
}

impl OpKind {
    /// Fills every attribute from `r`, in text order.
    pub fn read_attrs<R: ReadAttrs>(&mut self, r: &mut R) -> Result<(), R::Error> {
        declare_attrs!(self, r)
    }

    /// Hands every attribute to `w`, in text order.
    pub fn write_attrs<W: WriteAttrs>(&self, w: &mut W) {
        let Ok(()) = self.try_write_attrs(w);
    }

    fn try_write_attrs<W: WriteAttrs>(&self, w: &mut W) -> Result<(), Infallible> {
        declare_attrs!(self, w)
    }

    /// The attributes as `(key, text)`, leaving out those equal to their default.
    pub fn attr_texts(&self) -> Vec<(&'static str, String)> {
        struct Texts(Vec<(&'static str, String)>);
        impl WriteAttrs for Texts {
            fn attr<T: AttrValue>(
                &mut self,
                name: &'static str,
                field: &T,
                default: AttrDefault<T>,
            ) -> Result<(), Infallible> {
                if default.value().as_ref() != Some(field) {
                    let mut s = String::new();
                    field.write(&mut s);
                    self.0.push((name, s));
                }
                Ok(())
            }
            fn literal(
                &mut self,
                name: &'static str,
                v: &Literal,
                _: DType,
            ) -> Result<(), Infallible> {
                self.0.push((name, v.to_string()));
                Ok(())
            }
        }
        let mut t = Texts(Vec::new());
        self.write_attrs(&mut t);
        t.0
    }
}

/// One attribute of an op, as the docs index lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttrSpec {
    /// The key.
    pub name: &'static str,
    /// Its type: `int`, `[uint; 2]`, ...
    pub ty: String,
    /// Its default as text; `None` if it is required.
    pub default: Option<String>,
}

impl OpId {
    /// The op's attributes in text order.
    pub fn attrs(self) -> Vec<AttrSpec> {
        struct Specs(Vec<AttrSpec>);
        impl WriteAttrs for Specs {
            fn attr<T: AttrValue>(
                &mut self,
                name: &'static str,
                _: &T,
                default: AttrDefault<T>,
            ) -> Result<(), Infallible> {
                let default = match default {
                    AttrDefault::Required => None,
                    AttrDefault::Value(v) => {
                        let mut s = String::new();
                        v.write(&mut s);
                        Some(s)
                    }
                    AttrDefault::OnePerAxis(_) => Some("1 per axis".into()),
                };
                self.0.push(AttrSpec {
                    name,
                    ty: T::type_name(),
                    default,
                });
                Ok(())
            }
            fn literal(
                &mut self,
                name: &'static str,
                _: &Literal,
                _: DType,
            ) -> Result<(), Infallible> {
                self.0.push(AttrSpec {
                    name,
                    ty: "literal".into(),
                    default: None,
                });
                Ok(())
            }
        }
        let mut s = Specs(Vec::new());
        let ty = TensorType::new(DType::F32, vec![1]).expect("a small type");
        self.blank(&ty).write_attrs(&mut s);
        s.0
    }
}

/// docs/ir.md's op index: a table per category of every op's mnemonic, operands, results,
/// attributes and flags, generated from the op table. A test keeps the file in step.
pub fn op_index_markdown() -> String {
    let mut out = String::new();
    let mut category: Option<Category> = None;
    for &id in OpId::ALL {
        let s = id.schema();
        if category != Some(s.category) {
            category = Some(s.category);
            let _ = write!(
                out,
                "\n**{}**\n\n| op | operands | results | attributes | flags | what it computes |\n|---|---|---|---|---|---|\n",
                s.category.title()
            );
        }
        let attrs: Vec<String> = id
            .attrs()
            .into_iter()
            .map(|a| match a.default {
                Some(d) => format!("`{}: {} = {d}`", a.name, a.ty),
                None => format!("`{}: {}`", a.name, a.ty),
            })
            .collect();
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | {} | {} | {} |",
            s.mnemonic,
            match s.arity {
                super::Arity::Exactly(n) => n.to_string(),
                super::Arity::AtLeast(n) => format!("{n}+"),
            },
            s.results,
            attrs.join(", "),
            s.flags.names().join(", "),
            s.summary,
        );
    }
    out
}

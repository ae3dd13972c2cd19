//! The text format's writer: `Display` for [`Function`] and [`Module`].
//!
//! The parser reads exactly this form; docs/ir.md describes it. Attributes equal to their
//! default are left out, so print(parse(text)) is a fixed point.

use crate::function::{Function, Module, Op};
use crate::ops::{Conv2d, OpKind, Pool2d};
use std::fmt::{self, Display, Formatter, Write};

/// Whether `s` can be written bare after `%` or `@`.
pub fn is_bare_name(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(is_name_byte)
}

/// Bytes allowed in a bare name.
pub fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-' | b'/')
}

/// Writes `sigil` and the name, quoted and escaped if it is not bare.
pub fn write_name(f: &mut impl Write, sigil: char, s: &str) -> fmt::Result {
    f.write_char(sigil)?;
    if is_bare_name(s) {
        return f.write_str(s);
    }
    f.write_char('"')?;
    for c in s.chars() {
        match c {
            '"' => f.write_str("\\\"")?,
            '\\' => f.write_str("\\\\")?,
            '\n' => f.write_str("\\n")?,
            '\t' => f.write_str("\\t")?,
            c if c.is_control() => write!(f, "\\u{{{:x}}}", c as u32)?,
            c => f.write_char(c)?,
        }
    }
    f.write_char('"')
}

fn ints<T: Display>(v: &[T]) -> String {
    let mut s = String::from("[");
    for (i, x) in v.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        let _ = write!(s, "{x}");
    }
    s.push(']');
    s
}

fn conv_attrs(c: &Conv2d, out: &mut Vec<(&'static str, String)>) {
    let d = Conv2d::default();
    if c.strides != d.strides {
        out.push(("strides", ints(&c.strides)));
    }
    if c.pads != d.pads {
        out.push(("pads", ints(&c.pads)));
    }
    if c.dilations != d.dilations {
        out.push(("dilations", ints(&c.dilations)));
    }
    if c.groups != d.groups {
        out.push(("groups", c.groups.to_string()));
    }
}

fn pool_attrs(p: &Pool2d, out: &mut Vec<(&'static str, String)>) {
    out.push(("kernel", ints(&p.kernel)));
    if p.strides != [1, 1] {
        out.push(("strides", ints(&p.strides)));
    }
    if p.pads != [0; 4] {
        out.push(("pads", ints(&p.pads)));
    }
}

/// The attributes of an op as `(key, text)`, leaving out those equal to their default.
pub fn attrs(kind: &OpKind) -> Vec<(&'static str, String)> {
    let mut a = Vec::new();
    match kind {
        OpKind::Const { value, .. } => a.push(("value", value.to_string())),
        OpKind::BroadcastTo { shape } | OpKind::Reshape { shape } => a.push(("shape", ints(shape))),
        OpKind::Cast { to } => a.push(("to", to.to_string())),
        OpKind::Conv2d(c) => conv_attrs(c, &mut a),
        OpKind::MaxPool2d(p) | OpKind::MaxPool2dGrad(p) => pool_attrs(p, &mut a),
        OpKind::Conv2dGradInput { conv, shape } | OpKind::Conv2dGradFilter { conv, shape } => {
            conv_attrs(conv, &mut a);
            a.push(("shape", ints(shape)));
        }
        OpKind::AvgPool2dGrad {
            pool,
            count_include_pad,
            shape,
        } => {
            pool_attrs(pool, &mut a);
            if *count_include_pad {
                a.push(("count_include_pad", "true".into()));
            }
            a.push(("shape", ints(shape)));
        }
        OpKind::SliceGrad {
            shape,
            starts,
            ends,
            steps,
        } => {
            a.push(("shape", ints(shape)));
            a.push(("starts", ints(starts)));
            a.push(("ends", ints(ends)));
            if steps.iter().any(|&s| s != 1) {
                a.push(("steps", ints(steps)));
            }
        }
        OpKind::AvgPool2d {
            pool,
            count_include_pad,
        } => {
            pool_attrs(pool, &mut a);
            if *count_include_pad {
                a.push(("count_include_pad", "true".into()));
            }
        }
        OpKind::Reduce { axes, keepdims, .. } => {
            a.push(("axes", ints(axes)));
            if *keepdims {
                a.push(("keepdims", "true".into()));
            }
        }
        OpKind::Softmax { axis } | OpKind::LogSoftmax { axis } => {
            if *axis != -1 {
                a.push(("axis", axis.to_string()));
            }
        }
        OpKind::Concat { axis } | OpKind::Gather { axis } | OpKind::ScatterAdd { axis } => {
            a.push(("axis", axis.to_string()))
        }
        OpKind::BatchNorm { eps } | OpKind::BatchNormTrain { eps } => {
            if eps.0 != 1e-5 {
                a.push(("eps", crate::literal::Scalar::F64(eps.0).to_string()));
            }
        }
        OpKind::Transpose { perm } => a.push(("perm", ints(perm))),
        OpKind::Slice {
            starts,
            ends,
            steps,
        } => {
            a.push(("starts", ints(starts)));
            a.push(("ends", ints(ends)));
            if steps.iter().any(|&s| s != 1) {
                a.push(("steps", ints(steps)));
            }
        }
        OpKind::Unary(_)
        | OpKind::Binary(_)
        | OpKind::Compare(_)
        | OpKind::Select
        | OpKind::StopGradient
        | OpKind::Identity
        | OpKind::MatMul
        | OpKind::GlobalAvgPool
        | OpKind::SoftmaxCrossEntropy
        | OpKind::SoftmaxCrossEntropyGrad => {}
    }
    a
}

impl Function {
    /// Writes one op as a line of text (without indentation or newline). With `types`, the
    /// result types follow; without, the form is the short one used in diagnostics.
    pub fn write_op(&self, w: &mut impl Write, op: Op, types: bool) -> fmt::Result {
        let d = self.op(op);
        for (i, &r) in d.results.iter().enumerate() {
            if i > 0 {
                w.write_str(", ")?;
            }
            write_name(w, '%', self.name(r))?;
        }
        write!(w, " = {}", d.kind.mnemonic())?;
        for (i, &a) in d.args.iter().enumerate() {
            w.write_str(if i == 0 { " " } else { ", " })?;
            write_name(w, '%', self.name(a))?;
        }
        if !types {
            return Ok(());
        }
        let attrs = attrs(&d.kind);
        if !attrs.is_empty() {
            w.write_str(" {")?;
            for (i, (k, v)) in attrs.iter().enumerate() {
                if i > 0 {
                    w.write_str(", ")?;
                }
                write!(w, "{k}={v}")?;
            }
            w.write_str("}")?;
        }
        for (i, &dep) in d.deps.iter().enumerate() {
            w.write_str(if i == 0 { " after " } else { ", " })?;
            match self.op(dep).results.first() {
                Some(&r) => write_name(w, '%', self.name(r))?,
                None => write!(w, "%<{dep}>")?,
            }
        }
        w.write_str(" :")?;
        for (i, &r) in d.results.iter().enumerate() {
            w.write_str(if i == 0 { " " } else { ", " })?;
            write!(w, "{}", self.ty(r))?;
        }
        Ok(())
    }

    /// The short form of an op for diagnostics: `op7 (%h = matmul %x, %w)`.
    pub fn describe_op(&self, op: Op) -> String {
        let mut s = format!("{op} (");
        let _ = self.write_op(&mut s, op, false);
        s.push(')');
        s
    }
}

impl Display for Function {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        f.write_str("func ")?;
        write_name(f, '@', &self.name)?;
        f.write_str("(")?;
        for (i, &p) in self.params().iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write_name(f, '%', self.name(p))?;
            write!(f, ": {}", self.ty(p))?;
        }
        f.write_str(") -> (")?;
        for (i, &r) in self.results().iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{}", self.ty(r))?;
        }
        f.write_str(") {\n")?;
        let mut line = String::new();
        for &op in self.schedule() {
            line.clear();
            self.write_op(&mut line, op, true)?;
            writeln!(f, "  {line}")?;
        }
        f.write_str("  return")?;
        for (i, &r) in self.results().iter().enumerate() {
            f.write_str(if i == 0 { " " } else { ", " })?;
            write_name(f, '%', self.name(r))?;
        }
        f.write_str("\n}\n")
    }
}

impl Display for Module {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        for (i, func) in self.functions.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{func}")?;
        }
        Ok(())
    }
}

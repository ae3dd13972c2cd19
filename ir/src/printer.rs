//! The text format's writer: `Display` for [`Function`] and [`Module`].
//!
//! The parser reads exactly this form; docs/ir.md describes it. Attributes equal to their
//! default are left out ([`crate::ops::OpKind::attr_texts`]), so print(parse(text)) is a fixed
//! point.

use crate::function::{Function, Module, Op};
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
    write_string(f, s)
}

/// Writes `s` quoted, with the escapes the lexer reads.
pub fn write_string(f: &mut impl Write, s: &str) -> fmt::Result {
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

/// Writes an op's attributes as ` {key=value, ...}` (nothing when all are at their default), as
/// the text format has them.
pub fn write_attrs(w: &mut impl Write, kind: &crate::OpKind) -> fmt::Result {
    let attrs = kind.attr_texts();
    if attrs.is_empty() {
        return Ok(());
    }
    w.write_str(" {")?;
    for (i, (k, v)) in attrs.iter().enumerate() {
        if i > 0 {
            w.write_str(", ")?;
        }
        write!(w, "{k}={v}")?;
    }
    w.write_str("}")
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
        write_attrs(w, &d.kind)?;
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
        let backward = self.backward_start();
        for &op in self.schedule() {
            if Some(op) == backward {
                f.write_str("backward:\n")?;
            }
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
        if let Some(dir) = &self.weights.location {
            f.write_str("weights ")?;
            write_string(f, dir)?;
            f.write_str("\n\n")?;
        }
        for (i, func) in self.functions.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{func}")?;
        }
        Ok(())
    }
}

//! The text format's reader.
//!
//! Parsing runs in two phases per function. The first reads syntax into a list of op records,
//! building each [`OpKind`] from its mnemonic, attributes and declared result types. The second
//! creates values and resolves names, so that an undefined or redefined name, or a control
//! dependency naming a later op, gets a precise diagnostic, and so that use-before-def is left for
//! the verifier to report in schedule order. Every error carries `line:col`.

mod lexer;

use crate::diag::{Diagnostic, Diagnostics, clip};
use crate::function::{Function, Module, Op, SrcLoc, Value, ValueDef};
use crate::literal::{Data, Literal, Scalar};
use crate::ops::{AttrDefault, AttrText, AttrValue, OpId, OpKind, ReadAttrs, all_mnemonics};
use crate::types::{DType, TensorType};
use cranelift_entity::SecondaryMap;
use cranelift_entity::packed_option::ReservedValue;
use lexer::{Lexer, Tok, Token};
use std::borrow::Cow;
use std::collections::HashMap;

/// Parses a module from bytes, reporting invalid UTF-8 at its position.
pub fn parse_bytes(bytes: &[u8]) -> Result<Module, Diagnostics> {
    match std::str::from_utf8(bytes) {
        Ok(s) => parse_module(s),
        Err(e) => {
            let good = &bytes[..e.valid_up_to()];
            let line = good.iter().filter(|&&b| b == b'\n').count() as u32 + 1;
            let line_start = good.iter().rposition(|&b| b == b'\n').map_or(0, |p| p + 1);
            let col = (good.len() - line_start) as u32 + 1;
            Err(Diagnostic::at(
                SrcLoc { line, col },
                format!(
                    "input is not valid UTF-8 (byte 0x{:02x} at offset {})",
                    bytes[e.valid_up_to()],
                    e.valid_up_to()
                ),
            )
            .into())
        }
    }
}

/// Parses a module from text.
pub fn parse_module(src: &str) -> Result<Module, Diagnostics> {
    let mut p = Parser::new(src);
    p.module()
}

/// Parses text holding exactly one function.
pub fn parse_function(src: &str) -> Result<Function, Diagnostics> {
    let mut m = parse_module(src)?;
    if m.functions.len() != 1 {
        return Err(Diagnostic::new(format!(
            "expected exactly one function, found {}",
            m.functions.len()
        ))
        .into());
    }
    Ok(m.functions.remove(0))
}

type PResult<T> = Result<T, Diagnostic>;

/// A name and where it was written.
type Named<'a> = (Cow<'a, str>, usize);

/// An operand or control dependency naming a value not defined yet where it is used. Resolved at
/// the end of the function: a name defined later becomes a use-before-def for the verifier to
/// report in schedule order; a name never defined is an error here.
struct Pending<'a> {
    op: Op,
    index: usize,
    name: Cow<'a, str>,
    pos: usize,
    is_dep: bool,
}

/// A function being parsed.
struct Body<'a> {
    f: Function,
    /// Where each value was defined, for "first defined at line N".
    def_pos: SecondaryMap<Value, usize>,
    pending: Vec<Pending<'a>>,
    errors: Vec<Diagnostic>,
    /// The schedule length when the `backward:` line came, and where the line is.
    backward_at: Option<(usize, usize)>,
}

struct Parser<'a> {
    src: &'a str,
    lex: Lexer<'a>,
    peeked: Option<Token<'a>>,
    /// Where the last consumed token ended, and the one before it.
    prev_end: usize,
    prev_prev_end: usize,
    line_starts: Vec<usize>,
}

impl<'a> Parser<'a> {
    fn new(src: &'a str) -> Parser<'a> {
        let mut line_starts = vec![0];
        line_starts.extend(
            src.bytes()
                .enumerate()
                .filter(|&(_, b)| b == b'\n')
                .map(|(i, _)| i + 1),
        );
        Parser {
            src,
            lex: Lexer::new(src),
            peeked: None,
            prev_end: 0,
            prev_prev_end: 0,
            line_starts,
        }
    }

    fn loc(&self, pos: usize) -> SrcLoc {
        let line = self.line_starts.partition_point(|&s| s <= pos);
        let col = pos - self.line_starts[line - 1] + 1;
        SrcLoc {
            line: line as u32,
            col: col as u32,
        }
    }

    fn err(&self, pos: usize, msg: impl Into<String>) -> Diagnostic {
        Diagnostic::at(self.loc(pos), msg)
    }

    fn peek(&mut self) -> PResult<&Token<'a>> {
        if self.peeked.is_none() {
            let t = self.lex.next_token().map_err(|(pos, m)| self.err(pos, m))?;
            self.peeked = Some(t);
        }
        Ok(self.peeked.as_ref().unwrap())
    }

    fn next(&mut self) -> PResult<Token<'a>> {
        self.peek()?;
        let t = self.peeked.take().unwrap();
        self.prev_prev_end = std::mem::replace(&mut self.prev_end, t.end);
        Ok(t)
    }

    /// "expected X, found Y", at Y, or just after the previous token when Y is on a later line
    /// (a missing `:` at the end of a line is reported on that line, as rustc does).
    fn unexpected(&self, t: &Token<'_>, expected: &str) -> Diagnostic {
        // `t` may already be consumed; then the token before it ended at `prev_prev_end`.
        let prev = if t.end == self.prev_end {
            self.prev_prev_end
        } else {
            self.prev_end
        };
        let prev_line = self.loc(prev.saturating_sub(1)).line;
        let at = if prev > 0 && self.loc(t.pos).line > prev_line {
            prev
        } else {
            t.pos
        };
        self.err(
            at,
            format!("expected {expected}, found {}", t.tok.describe()),
        )
    }

    fn eat_punct(&mut self, c: u8) -> PResult<bool> {
        if self.peek()?.tok == Tok::Punct(c) {
            self.next()?;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    fn expect_punct(&mut self, c: u8) -> PResult<usize> {
        let t = self.next()?;
        if t.tok == Tok::Punct(c) {
            Ok(t.pos)
        } else {
            Err(self.unexpected(&t, &format!("`{}`", c as char)))
        }
    }

    fn expect_value(&mut self, what: &str) -> PResult<Named<'a>> {
        let t = self.next()?;
        match t.tok {
            Tok::Value(n) => Ok((n, t.pos)),
            _ => Err(self.unexpected(&t, what)),
        }
    }

    fn peek_is_ident(&mut self, word: &str) -> PResult<bool> {
        Ok(matches!(self.peek()?.tok, Tok::Ident(w) if w == word))
    }

    fn module(&mut self) -> Result<Module, Diagnostics> {
        let mut m = Module::new();
        let mut seen: HashMap<String, usize> = HashMap::new();
        loop {
            let t = self.next()?;
            match t.tok {
                Tok::Eof if m.functions.is_empty() => {
                    return Err(self
                        .err(
                            t.pos,
                            "expected `func`, found end of file: the input defines no function",
                        )
                        .into());
                }
                Tok::Eof => return Ok(m),
                Tok::Ident("weights") if m.functions.is_empty() && m.weights.location.is_none() => {
                    let d = self.next()?;
                    let Tok::Str(dir) = d.tok else {
                        return Err(self
                            .unexpected(&d, "the quoted directory of the stored weights, as in `weights \"model.weights\"`")
                            .into());
                    };
                    m.weights.location = Some(dir.into_owned());
                }
                Tok::Ident("func") => {
                    let f = self.function()?;
                    if let Some(&first) = seen.get(&f.name) {
                        return Err(self
                            .err(
                                t.pos,
                                format!("function `@{}` is defined twice", clip(&f.name)),
                            )
                            .note(format!("first defined at line {}", self.loc(first).line))
                            .into());
                    }
                    seen.insert(f.name.clone(), t.pos);
                    m.functions.push(f);
                }
                _ => return Err(self.unexpected(&t, "`func`").into()),
            }
        }
    }

    fn dim(&mut self) -> PResult<u64> {
        let t = self.next()?;
        let Tok::Num(s) = t.tok else {
            return Err(self.unexpected(&t, "a dimension (a non-negative integer)"));
        };
        if s.starts_with('-') {
            return Err(self.err(
                t.pos,
                format!("dimension must be non-negative, found `{s}`"),
            ));
        }
        s.parse::<u64>().map_err(|_| {
            let msg = if s.bytes().all(|b| b.is_ascii_digit()) {
                format!("dimension `{s}` does not fit in 64 bits")
            } else {
                format!("dimension must be a non-negative integer, found `{s}`")
            };
            self.err(t.pos, msg)
        })
    }

    fn tensor_type(&mut self) -> PResult<TensorType> {
        let t = self.next()?;
        let dtype = match t.tok {
            Tok::Ident(w) => DType::from_name(w).ok_or_else(|| {
                self.err(
                    t.pos,
                    format!(
                        "unknown dtype `{w}`; expected one of f32, f64, i8, u8, i32, i64, bool"
                    ),
                )
            })?,
            _ => return Err(self.unexpected(&t, "a type such as `f32[2,3]`")),
        };
        self.expect_punct(b'[')?;
        let mut dims = Vec::new();
        if !self.eat_punct(b']')? {
            loop {
                dims.push(self.dim()?);
                if self.eat_punct(b']')? {
                    break;
                }
                self.expect_punct(b',')?;
            }
        }
        TensorType::new(dtype, dims).map_err(|e| self.err(t.pos, e.to_string()))
    }

    fn types_list(&mut self) -> PResult<Vec<TensorType>> {
        let mut v = vec![self.tensor_type()?];
        while self.eat_punct(b',')? {
            v.push(self.tensor_type()?);
        }
        Ok(v)
    }

    fn value_list(&mut self, what: &str) -> PResult<Vec<Named<'a>>> {
        let mut v = vec![self.expect_value(what)?];
        while self.eat_punct(b',')? {
            v.push(self.expect_value(what)?);
        }
        Ok(v)
    }

    fn function(&mut self) -> Result<Function, Diagnostics> {
        let t = self.next()?;
        let name = match t.tok {
            Tok::Func(n) => n,
            _ => {
                return Err(self
                    .unexpected(&t, "a function name such as `@main`")
                    .into());
            }
        };
        let mut body = Body {
            f: Function::new(name),
            def_pos: SecondaryMap::new(),
            pending: Vec::new(),
            errors: Vec::new(),
            backward_at: None,
        };
        self.expect_punct(b'(')?;
        if !self.eat_punct(b')')? {
            loop {
                let (n, pos) = self.expect_value("a parameter such as `%x: f32[4]`")?;
                self.expect_punct(b':')?;
                let ty = self.tensor_type()?;
                if let Some(first) = body.f.lookup(&n) {
                    body.errors
                        .push(self.redefined(&n, pos, body.def_pos[first]));
                } else {
                    let v = body.f.add_param(&n, ty);
                    body.def_pos[v] = pos;
                }
                if self.eat_punct(b')')? {
                    break;
                }
                self.expect_punct(b',')?;
            }
        }
        let t = self.next()?;
        if t.tok != Tok::Arrow {
            return Err(self.unexpected(&t, "`->` and the result types").into());
        }
        self.expect_punct(b'(')?;
        let mut sig_results = Vec::new();
        if !self.eat_punct(b')')? {
            sig_results = self.types_list()?;
            self.expect_punct(b')')?;
        }
        let open = self.expect_punct(b'{')?;
        // About one value per line: reserve for the lines up to the closing brace.
        let rest = &self.src[open..];
        let len = rest.find("\n}").unwrap_or(rest.len());
        body.f.reserve_values(
            rest.as_bytes()[..len]
                .iter()
                .filter(|&&b| b == b'\n')
                .count(),
        );
        let mut names: Vec<Named<'a>> = Vec::new();
        let (rets, ret_pos) = loop {
            let pos = self.peek()?.pos;
            if self.peek_is_ident("return")? {
                self.next()?;
                let rets = if matches!(self.peek()?.tok, Tok::Value(_)) {
                    self.value_list("a result value")?
                } else {
                    Vec::new()
                };
                self.expect_punct(b'}')?;
                break (rets, pos);
            }
            if self.peek_is_ident("backward")? {
                let t = self.next()?;
                self.expect_punct(b':')?;
                if body.backward_at.is_some() {
                    return Err(self
                        .err(
                            t.pos,
                            "a function has one `backward:` line; this is the second",
                        )
                        .into());
                }
                body.backward_at = Some((body.f.schedule().len(), t.pos));
                continue;
            }
            if matches!(self.peek()?.tok, Tok::Value(_)) {
                self.op(&mut body, &mut names)?;
            } else {
                let t = self.next()?;
                return Err(self
                    .unexpected(&t, "an op (`%name = ...`) or `return`")
                    .into());
            }
        };
        self.finish(body, sig_results, rets, ret_pos)
    }

    fn redefined(&self, n: &str, pos: usize, first: usize) -> Diagnostic {
        self.err(pos, format!("value `%{}` is defined twice", clip(n)))
            .note(format!("first defined at line {}", self.loc(first).line))
    }

    /// The op defining the value a control dependency names; a parameter is an error.
    fn dep_op(&self, f: &Function, v: Value, n: &str, pos: usize) -> Result<Op, Diagnostic> {
        match f.value(v).def {
            ValueDef::Result(d, _) => Ok(d),
            ValueDef::Param(_) => Err(self.err(
                pos,
                format!(
                    "`after %{}`: a control dependency must name an op's result, not a parameter",
                    clip(n)
                ),
            )),
        }
    }

    /// Parses one op and adds it to the function. `names` is scratch space for result names.
    fn op(&mut self, body: &mut Body<'a>, names: &mut Vec<Named<'a>>) -> PResult<()> {
        names.clear();
        names.push(self.expect_value("a result name")?);
        while self.eat_punct(b',')? {
            names.push(self.expect_value("a result name")?);
        }
        self.expect_punct(b'=')?;
        let t = self.next()?;
        let (mnemonic, mpos) = match t.tok {
            Tok::Ident(m) => (m, t.pos),
            _ => return Err(self.unexpected(&t, "an op mnemonic such as `add`")),
        };
        // Operands and dependencies not defined yet: (index, name, position, is_dep).
        let mut unresolved: Vec<(usize, Named<'a>, bool)> = Vec::new();
        let mut args = Vec::new();
        if matches!(self.peek()?.tok, Tok::Value(_)) {
            loop {
                let (n, pos) = self.expect_value("an operand")?;
                match body.f.lookup(&n) {
                    Some(v) => args.push(v),
                    None => {
                        unresolved.push((args.len(), (n, pos), false));
                        args.push(Value::reserved_value());
                    }
                }
                if !self.eat_punct(b',')? {
                    break;
                }
            }
        }
        let mut attrs: Vec<(&'a str, usize, AttrText<'a>)> = Vec::new();
        if self.eat_punct(b'{')? {
            loop {
                let t = self.next()?;
                let key = match t.tok {
                    Tok::Ident(k) => k,
                    _ => return Err(self.unexpected(&t, "an attribute name")),
                };
                if attrs.iter().any(|a| a.0 == key) {
                    return Err(self.err(t.pos, format!("attribute `{key}` is given twice")));
                }
                self.expect_punct(b'=')?;
                let val = self.attr_value()?;
                attrs.push((key, t.pos, val));
                if self.eat_punct(b'}')? {
                    break;
                }
                self.expect_punct(b',')?;
            }
        }
        let mut deps = Vec::new();
        let has_deps = self.peek_is_ident("after")?;
        if has_deps {
            self.next()?;
            loop {
                let (n, pos) = self.expect_value("a value whose op must run first")?;
                match body.f.lookup(&n) {
                    Some(v) => match self.dep_op(&body.f, v, &n, pos) {
                        Ok(d) => deps.push(d),
                        Err(e) => body.errors.push(e),
                    },
                    None => {
                        unresolved.push((deps.len(), (n, pos), true));
                        deps.push(Op::reserved_value());
                    }
                }
                if !self.eat_punct(b',')? {
                    break;
                }
            }
        }
        let colon = self.peek()?.clone();
        if colon.tok != Tok::Punct(b':') {
            let what = if attrs.is_empty() && !has_deps {
                "`,`, `{`, `after` or `:` and the result types"
            } else {
                "`:` and the result types"
            };
            return Err(self.unexpected(&colon, what));
        }
        self.next()?;
        let types = self.types_list()?;
        if types.len() != names.len() {
            return Err(self.err(
                colon.pos,
                format!(
                    "{} result name(s) but {} result type(s); give one type per result",
                    names.len(),
                    types.len()
                ),
            ));
        }
        let kind = self.build_kind(mnemonic, mpos, attrs, &types)?;
        for (n, pos) in names.iter() {
            if let Some(first) = body.f.lookup(n) {
                body.errors
                    .push(self.redefined(n, *pos, body.def_pos[first]));
            }
        }
        let op = if let [(n, _)] = names.as_slice() {
            body.f.create_op(kind, args, types, &[n.as_ref()])
        } else {
            let ns: Vec<&str> = names.iter().map(|(n, _)| n.as_ref()).collect();
            body.f.create_op(kind, args, types, &ns)
        };
        body.f.op_mut(op).deps = deps;
        body.f.set_loc(op, self.loc(mpos));
        body.f.append(op);
        for (&v, (_, pos)) in body.f.op(op).results.iter().zip(names.iter()) {
            body.def_pos[v] = *pos;
        }
        for (index, (name, pos), is_dep) in unresolved {
            body.pending.push(Pending {
                op,
                index,
                name,
                pos,
                is_dep,
            });
        }
        Ok(())
    }

    /// Resolves forward references and the results, and checks the signature.
    fn finish(
        &self,
        mut body: Body<'a>,
        sig_results: Vec<TensorType>,
        rets: Vec<Named<'a>>,
        ret_pos: usize,
    ) -> Result<Function, Diagnostics> {
        let f = &mut body.f;
        let errors = &mut body.errors;
        if let Some((i, pos)) = body.backward_at {
            match f.schedule().get(i) {
                Some(&op) => f.set_backward_start(Some(op)),
                None => errors.push(self.err(pos, "`backward:` must be followed by an op")),
            }
        }
        let undefined =
            |n: &str, pos: usize| self.err(pos, format!("undefined value `%{}`", clip(n)));
        for p in std::mem::take(&mut body.pending) {
            match f.lookup(&p.name) {
                None => errors.push(undefined(&p.name, p.pos)),
                Some(v) if p.is_dep => match self.dep_op(f, v, &p.name, p.pos) {
                    Ok(d) => f.op_mut(p.op).deps[p.index] = d,
                    Err(e) => errors.push(e),
                },
                Some(v) => f.op_mut(p.op).args[p.index] = v,
            }
        }
        let mut results = Vec::with_capacity(rets.len());
        for (n, pos) in &rets {
            match f.lookup(n) {
                Some(v) => results.push(v),
                None => errors.push(undefined(n, *pos)),
            }
        }
        if errors.is_empty() {
            if results.len() != sig_results.len() {
                errors.push(self.err(
                    ret_pos,
                    format!(
                        "`return` has {} value(s) but the signature of `@{}` declares {} result(s)",
                        results.len(),
                        clip(&f.name),
                        sig_results.len()
                    ),
                ));
            } else {
                for (i, (&v, want)) in results.iter().zip(&sig_results).enumerate() {
                    if f.ty(v) != want {
                        errors.push(self.err(
                            rets[i].1,
                            format!(
                                "result {i} `%{}` has type {} but the signature declares {want}",
                                clip(&rets[i].0),
                                f.ty(v)
                            ),
                        ));
                    }
                }
            }
        }
        if !errors.is_empty() {
            let mut errors = std::mem::take(errors);
            errors.sort_by_key(|d| d.loc.map(|l| (l.line, l.col)));
            return Err(Diagnostics(errors));
        }
        f.set_results(results);
        Ok(body.f)
    }

    fn attr_value(&mut self) -> PResult<AttrText<'a>> {
        let t = self.next()?;
        Ok(match t.tok {
            Tok::Num(n) => AttrText::Num(n),
            Tok::Ident(w) => AttrText::Word(w),
            Tok::Punct(b'[') => {
                let mut items = Vec::new();
                if !self.eat_punct(b']')? {
                    loop {
                        let t = self.next()?;
                        match t.tok {
                            Tok::Num(n) | Tok::Ident(n) => items.push((n, t.pos)),
                            _ => return Err(self.unexpected(&t, "a number")),
                        }
                        if self.eat_punct(b']')? {
                            break;
                        }
                        self.expect_punct(b',')?;
                    }
                }
                AttrText::List(items)
            }
            _ => {
                return Err(
                    self.unexpected(&t, "an attribute value (a number, a word or a `[list]`)")
                );
            }
        })
    }

    fn build_kind(
        &self,
        mnemonic: &'a str,
        mpos: usize,
        attrs: Vec<(&'a str, usize, AttrText<'a>)>,
        types: &[TensorType],
    ) -> PResult<OpKind> {
        let Some(id) = OpId::from_mnemonic(mnemonic) else {
            let mut msg = format!("unknown op `{mnemonic}`");
            if let Some(s) = closest(mnemonic, &all_mnemonics()) {
                msg += &format!("; did you mean `{s}`?");
            }
            return Err(self.err(mpos, msg).note("docs/ir.md lists every op"));
        };
        let mut a = Attrs {
            p: self,
            mnemonic,
            mpos,
            items: attrs
                .into_iter()
                .map(|(k, pos, v)| (k, pos, Some(v)))
                .collect(),
            asked: Vec::new(),
        };
        // A `const` takes its type from its first declared result (there is at least one: the
        // caller matched the types with the result names).
        let mut kind = id.blank(&types[0]);
        kind.read_attrs(&mut a)?;
        a.finish()?;
        Ok(kind)
    }
}

/// The attributes written on one op, read through [`OpKind::read_attrs`]: each declared
/// attribute takes its key (or its default), and [`Attrs::finish`] rejects keys nobody took.
struct Attrs<'p, 'a> {
    p: &'p Parser<'a>,
    mnemonic: &'a str,
    mpos: usize,
    /// `(key, position, value)`; the value is moved out when an attribute takes it.
    items: Vec<(&'a str, usize, Option<AttrText<'a>>)>,
    /// Every key the op declares, in order.
    asked: Vec<&'static str>,
}

impl<'a> Attrs<'_, 'a> {
    fn take(&mut self, key: &'static str) -> Option<(usize, AttrText<'a>)> {
        self.asked.push(key);
        let it = self.items.iter_mut().find(|i| i.0 == key)?;
        Some((it.1, it.2.take()?))
    }

    fn missing(&self, key: &'static str) -> Diagnostic {
        self.p.err(
            self.mpos,
            format!("`{}` needs the attribute `{key}`", self.mnemonic),
        )
    }

    fn finish(self) -> PResult<()> {
        if let Some(&(key, pos, _)) = self.items.iter().find(|i| i.2.is_some()) {
            let mut msg = format!("`{}` has no attribute `{key}`", self.mnemonic);
            if self.asked.is_empty() {
                msg += " (it takes none)";
            } else {
                msg += &format!(" (it takes {})", self.asked.join(", "));
            }
            return Err(self.p.err(pos, msg));
        }
        Ok(())
    }
}

impl ReadAttrs for Attrs<'_, '_> {
    type Error = Diagnostic;

    fn attr<T: AttrValue>(
        &mut self,
        key: &'static str,
        field: &mut T,
        default: AttrDefault<T>,
    ) -> PResult<()> {
        *field = match (self.take(key), default) {
            (Some((pos, text)), _) => T::parse(&text).map_err(|e| {
                self.p.err(
                    e.at.unwrap_or(pos),
                    format!(
                        "attribute `{key}` of `{}` must be {}",
                        self.mnemonic, e.expected
                    ),
                )
            })?,
            (None, AttrDefault::Value(v) | AttrDefault::OnePerAxis(v)) => v,
            (None, AttrDefault::Required) => return Err(self.missing(key)),
        };
        Ok(())
    }

    fn literal(&mut self, key: &'static str, field: &mut Literal, dtype: DType) -> PResult<()> {
        let p = self.p;
        *field = match self.take(key) {
            Some((pos, AttrText::Num(s) | AttrText::Word(s))) => Scalar::parse(dtype, s)
                .map(Literal::Splat)
                .map_err(|e| p.err(pos, e))?,
            Some((_, AttrText::List(items))) => {
                let mut d = Data::with_capacity(dtype, items.len());
                for (s, pos) in items {
                    let x = Scalar::parse(dtype, s).map_err(|e| p.err(pos, e))?;
                    d.push(x).expect("parsed with the vector's dtype");
                }
                Literal::dense(d)
            }
            None => return Err(self.missing(key)),
        };
        Ok(())
    }
}

/// The candidate within edit distance 2 of `word`, if any.
fn closest<'c>(word: &str, candidates: &[&'c str]) -> Option<&'c str> {
    fn dist(a: &str, b: &str) -> usize {
        let b: Vec<char> = b.chars().collect();
        let mut prev: Vec<usize> = (0..=b.len()).collect();
        for (i, ca) in a.chars().enumerate() {
            let mut cur = vec![i + 1];
            for (j, &cb) in b.iter().enumerate() {
                cur.push(
                    (prev[j] + (ca != cb) as usize)
                        .min(prev[j + 1] + 1)
                        .min(cur[j] + 1),
                );
            }
            prev = cur;
        }
        prev[b.len()]
    }
    if word.len() > 64 {
        return None;
    }
    candidates
        .iter()
        .map(|c| (dist(word, c), *c))
        .filter(|&(d, _)| d <= 2)
        .min()
        .map(|(_, c)| c)
}

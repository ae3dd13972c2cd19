//! Tokens of the text format.

use std::borrow::Cow;

/// A token kind with its text.
#[derive(Clone, Debug, PartialEq)]
pub enum Tok<'a> {
    /// `%name` or `%"quoted name"` (unescaped).
    Value(Cow<'a, str>),
    /// `@name` or `@"quoted name"`.
    Func(Cow<'a, str>),
    /// A bare word: keyword, mnemonic, dtype, attribute key, `true`, `nan`...
    Ident(&'a str),
    /// A number as written (`3`, `-1.5e-3`, `-inf`).
    Num(&'a str),
    /// A quoted string (unescaped), as in `weights "model.weights"`.
    Str(Cow<'a, str>),
    /// One of `( ) [ ] { } , : =`.
    Punct(u8),
    /// `->`.
    Arrow,
    /// End of input.
    Eof,
}

impl Tok<'_> {
    /// How the token is named in "expected X, found Y".
    pub fn describe(&self) -> String {
        fn clip(s: &str) -> String {
            if s.chars().count() > 40 {
                format!("{}...", s.chars().take(40).collect::<String>())
            } else {
                s.to_string()
            }
        }
        match self {
            Tok::Value(n) => format!("value `%{}`", clip(n)),
            Tok::Func(n) => format!("function name `@{}`", clip(n)),
            Tok::Ident(s) => format!("`{}`", clip(s)),
            Tok::Num(s) => format!("number `{}`", clip(s)),
            Tok::Str(s) => format!("string \"{}\"", clip(s)),
            Tok::Punct(c) => format!("`{}`", *c as char),
            Tok::Arrow => "`->`".into(),
            Tok::Eof => "end of file".into(),
        }
    }
}

/// A token and the byte offset where it starts.
#[derive(Clone, Debug)]
pub struct Token<'a> {
    /// The token.
    pub tok: Tok<'a>,
    /// Byte offset in the source.
    pub pos: usize,
    /// Byte offset just past its end.
    pub end: usize,
}

/// A lexing error: byte offset and message.
pub type LexError = (usize, String);

/// Splits source text into tokens, skipping whitespace and `//` comments.
pub struct Lexer<'a> {
    src: &'a str,
    pos: usize,
}

fn is_name_byte(b: u8) -> bool {
    crate::printer::is_name_byte(b)
}

impl<'a> Lexer<'a> {
    /// A lexer at the start of `src`.
    pub fn new(src: &'a str) -> Lexer<'a> {
        Lexer { src, pos: 0 }
    }

    fn bytes(&self) -> &'a [u8] {
        self.src.as_bytes()
    }

    fn skip_trivia(&mut self) {
        let b = self.bytes();
        loop {
            while self.pos < b.len() && b[self.pos].is_ascii_whitespace() {
                self.pos += 1;
            }
            if b[self.pos..].starts_with(b"//") {
                while self.pos < b.len() && b[self.pos] != b'\n' {
                    self.pos += 1;
                }
            } else {
                return;
            }
        }
    }

    fn name(&mut self, sigil: char) -> Result<Cow<'a, str>, LexError> {
        let b = self.bytes();
        let start = self.pos;
        if b.get(self.pos) == Some(&b'"') {
            return self.quoted("name");
        }
        while self.pos < b.len() && is_name_byte(b[self.pos]) {
            self.pos += 1;
        }
        if self.pos == start {
            let what = if sigil == '%' { "value" } else { "function" };
            return Err((
                start - 1,
                format!(
                    "expected a {what} name after `{sigil}` (letters, digits, `_ . - /`, or a quoted string)"
                ),
            ));
        }
        Ok(Cow::Borrowed(&self.src[start..self.pos]))
    }

    /// A `"..."` string with escapes; `what` names it in errors (`name` or `string`).
    fn quoted(&mut self, what: &str) -> Result<Cow<'a, str>, LexError> {
        let open = self.pos;
        self.pos += 1;
        let mut out = String::new();
        let mut chars = self.src[self.pos..].char_indices();
        loop {
            let Some((i, c)) = chars.next() else {
                return Err((
                    open,
                    format!("unterminated quoted {what}: missing closing `\"`"),
                ));
            };
            match c {
                '"' => {
                    self.pos += i + 1;
                    if out.is_empty() {
                        return Err((open, format!("a quoted {what} cannot be empty")));
                    }
                    return Ok(Cow::Owned(out));
                }
                '\n' => {
                    return Err((
                        open,
                        format!("unterminated quoted {what}: it reaches the end of the line"),
                    ));
                }
                '\\' => {
                    let at = self.pos + i;
                    match chars.next().map(|(_, c)| c) {
                        Some('"') => out.push('"'),
                        Some('\\') => out.push('\\'),
                        Some('n') => out.push('\n'),
                        Some('t') => out.push('\t'),
                        Some('u') => {
                            let rest = &self.src[at + 2..];
                            let end = rest.find('}').filter(|_| rest.starts_with('{'));
                            let c = end
                                .and_then(|e| u32::from_str_radix(&rest[1..e], 16).ok())
                                .and_then(char::from_u32);
                            match (c, end) {
                                (Some(c), Some(e)) => {
                                    out.push(c);
                                    for _ in 0..e + 1 {
                                        chars.next();
                                    }
                                }
                                _ => return Err((at, "bad escape: expected `\\u{HEX}`".into())),
                            }
                        }
                        _ => {
                            return Err((
                                at,
                                "unknown escape; valid escapes are \\\" \\\\ \\n \\t \\u{HEX}"
                                    .into(),
                            ));
                        }
                    }
                }
                c => out.push(c),
            }
        }
    }

    fn number(&mut self) -> &'a str {
        let b = self.bytes();
        let start = self.pos;
        if b[self.pos] == b'-' {
            self.pos += 1;
        }
        if self.src[self.pos..].starts_with("inf") || self.src[self.pos..].starts_with("nan") {
            self.pos += 3;
            return &self.src[start..self.pos];
        }
        // Digits, a fraction and an exponent; anything else glued on is kept so that the
        // conversion reports it (`12abc` is one bad number, not `12` then `abc`).
        while self.pos < b.len() {
            let c = b[self.pos];
            let exp_sign = (c == b'-' || c == b'+') && matches!(b[self.pos - 1], b'e' | b'E');
            if c.is_ascii_alphanumeric() || c == b'.' || c == b'_' || exp_sign {
                self.pos += 1;
            } else {
                break;
            }
        }
        &self.src[start..self.pos]
    }

    /// The next token.
    pub fn next_token(&mut self) -> Result<Token<'a>, LexError> {
        self.skip_trivia();
        let b = self.bytes();
        let pos = self.pos;
        let Some(&c) = b.get(pos) else {
            return Ok(Token {
                tok: Tok::Eof,
                pos,
                end: pos,
            });
        };
        let tok = match c {
            b'%' => {
                self.pos += 1;
                Tok::Value(self.name('%')?)
            }
            b'@' => {
                self.pos += 1;
                Tok::Func(self.name('@')?)
            }
            b'"' => Tok::Str(self.quoted("string")?),
            b'(' | b')' | b'[' | b']' | b'{' | b'}' | b',' | b':' | b'=' => {
                self.pos += 1;
                Tok::Punct(c)
            }
            b'-' if b.get(pos + 1) == Some(&b'>') => {
                self.pos += 2;
                Tok::Arrow
            }
            b'-' | b'0'..=b'9' => {
                let n = self.number();
                if n == "-" {
                    return Err((pos, "expected a number after `-`".into()));
                }
                Tok::Num(n)
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                while self.pos < b.len()
                    && (b[self.pos].is_ascii_alphanumeric() || b[self.pos] == b'_')
                {
                    self.pos += 1;
                }
                Tok::Ident(&self.src[pos..self.pos])
            }
            _ => {
                let ch = self.src[pos..].chars().next().unwrap_or('?');
                return Err((pos, format!("unexpected character `{}`", ch.escape_debug())));
            }
        };
        Ok(Token {
            tok,
            pos,
            end: self.pos,
        })
    }
}

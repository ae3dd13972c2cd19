//! Diagnostics: an error message with an optional source location, rendered with the file name,
//! `line:col`, the source line and a caret.

use crate::function::SrcLoc;
use std::fmt;

/// One problem found in the input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    /// Where, if known. `col` counts bytes from the start of the line, from 1.
    pub loc: Option<SrcLoc>,
    /// What is wrong, and what was expected.
    pub message: String,
    /// Further lines (`note: ...`).
    pub notes: Vec<String>,
}

impl Diagnostic {
    /// A diagnostic at a location.
    pub fn at(loc: SrcLoc, message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            loc: Some(loc),
            message: message.into(),
            notes: Vec::new(),
        }
    }

    /// A diagnostic with no location.
    pub fn new(message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            loc: None,
            message: message.into(),
            notes: Vec::new(),
        }
    }

    /// Adds a note.
    pub fn note(mut self, note: impl Into<String>) -> Diagnostic {
        self.notes.push(note.into());
        self
    }

    /// Renders the diagnostic against `src`, the text it refers to, read from `file`.
    pub fn render(&self, file: &str, src: &str) -> String {
        let mut out = String::new();
        match self.loc {
            Some(loc) => {
                let line_text = src
                    .lines()
                    .nth((loc.line as usize).saturating_sub(1))
                    .unwrap_or("");
                let byte_col = (loc.col as usize).saturating_sub(1).min(line_text.len());
                let byte_col = floor_char_boundary(line_text, byte_col);
                let char_col = line_text[..byte_col].chars().count() + 1;
                out += &format!("{file}:{}:{char_col}: error: {}\n", loc.line, self.message);
                let (shown, caret) = window(line_text, byte_col);
                let num = loc.line.to_string();
                let pad = " ".repeat(num.len());
                out += &format!("{pad} |\n{num} | {shown}\n{pad} | {}^\n", " ".repeat(caret));
            }
            None => out += &format!("{file}: error: {}\n", self.message),
        }
        for n in &self.notes {
            out += &format!("  = note: {n}\n");
        }
        out
    }
}

/// A name or snippet for a message: at most 64 characters, with `...` when cut.
pub fn clip(s: &str) -> String {
    match s.char_indices().nth(64) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_string(),
    }
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// `line` if it is short, else at most 100 characters of it around byte `col`, and the caret's character offset in it.
fn window(line: &str, col: usize) -> (String, usize) {
    const SPAN: usize = 100;
    if line.len() <= 160 {
        return (line.replace('\t', " "), line[..col].chars().count());
    }
    let before: Vec<char> = line[..col].chars().rev().take(SPAN / 2 + 1).collect();
    let cut_left = before.len() > SPAN / 2;
    let mut shown: String = before.iter().take(SPAN / 2).rev().collect();
    let caret = shown.chars().count() + if cut_left { 3 } else { 0 };
    if cut_left {
        shown.insert_str(0, "...");
    }
    let mut rest = line[col..].chars();
    shown.extend(rest.by_ref().take(SPAN / 2));
    if rest.next().is_some() {
        shown.push_str("...");
    }
    // Tabs would misalign the caret; show them as spaces.
    (shown.replace('\t', " "), caret)
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(l) = self.loc {
            write!(f, "{}:{}: ", l.line, l.col)?;
        }
        f.write_str(&self.message)?;
        for n in &self.notes {
            write!(f, "\n  = note: {n}")?;
        }
        Ok(())
    }
}

/// Several diagnostics, in the order found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Diagnostics(pub Vec<Diagnostic>);

impl Diagnostics {
    /// Renders all of them against the source.
    pub fn render(&self, file: &str, src: &str) -> String {
        self.0.iter().map(|d| d.render(file, src)).collect()
    }
}

impl From<Diagnostic> for Diagnostics {
    fn from(d: Diagnostic) -> Diagnostics {
        Diagnostics(vec![d])
    }
}

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{d}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Diagnostics {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_caret_under_column() {
        let src = "line one\n  %x = bad\n";
        let d = Diagnostic::at(SrcLoc { line: 2, col: 8 }, "unknown op `bad`");
        let r = d.render("t.tir", src);
        assert_eq!(
            r,
            "t.tir:2:8: error: unknown op `bad`\n  |\n2 |   %x = bad\n  |        ^\n"
        );
    }

    #[test]
    fn long_lines_are_windowed() {
        let line = "x".repeat(1 << 20);
        let d = Diagnostic::at(
            SrcLoc {
                line: 1,
                col: 500_000,
            },
            "here",
        );
        let r = d.render("big.tir", &line);
        assert!(r.len() < 400, "{}", r.len());
        assert!(r.starts_with("big.tir:1:500000: error: here"));
        let lines: Vec<&str> = r.lines().collect();
        let caret = lines[3].find('^').unwrap();
        assert_eq!(&lines[2][caret..caret + 1], "x");
    }
}

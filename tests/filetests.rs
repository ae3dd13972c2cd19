//! Filetests: every `tests/filetests/<area>/*.tir` runs through the `tcc` driver code and its
//! output is an insta snapshot.
//!
//! The first line says what to run: `// tcc: opt --passes='cse,dce'` (the file's path is appended
//! as the last argument). A line carrying `// error: TEXT` must get a diagnostic at that line
//! whose message contains TEXT; a file with such annotations must exit with status 1, and every
//! diagnostic must be on an annotated line. A file with none must exit 0.

use std::path::Path;

/// Splits a command line on whitespace, honouring single and double quotes.
fn split_args(line: &str) -> Vec<String> {
    let mut args = Vec::new();
    let mut cur = String::new();
    let mut quote: Option<char> = None;
    let mut any = false;
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => cur.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                any = true;
            }
            (None, c) if c.is_whitespace() => {
                if any || !cur.is_empty() {
                    args.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            (None, c) => cur.push(c),
        }
    }
    if any || !cur.is_empty() {
        args.push(cur);
    }
    args
}

/// `(line, text)` for each `// error: TEXT` annotation.
fn annotations(src: &str) -> Vec<(usize, String)> {
    src.lines()
        .enumerate()
        .filter_map(|(i, l)| {
            l.find("// error: ")
                .map(|p| (i + 1, l[p + 10..].trim().to_string()))
        })
        .collect()
}

/// `(line, message)` for each diagnostic `PATH:LINE:COL: error: MESSAGE` in `stderr`.
fn diagnostics(stderr: &str, path: &str) -> Vec<(usize, String)> {
    let prefix = format!("{path}:");
    stderr
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(&prefix)?;
            let mut parts = rest.splitn(3, ':');
            let line: usize = parts.next()?.parse().ok()?;
            parts.next()?;
            let msg = parts.next()?.strip_prefix(" error: ")?;
            Some((line, msg.to_string()))
        })
        .collect()
}

fn run_case(path: &Path) -> String {
    let rel = path
        .strip_prefix(env!("CARGO_MANIFEST_DIR"))
        .unwrap_or(path)
        .to_string_lossy()
        .replace('\\', "/");
    let src = std::fs::read_to_string(path).unwrap();
    let first = src.lines().next().unwrap_or("");
    let cmd = first
        .strip_prefix("// tcc: ")
        .unwrap_or_else(|| panic!("{rel}: the first line must be `// tcc: <command>`"));
    let mut args = vec!["tcc".to_string()];
    args.extend(split_args(cmd));
    args.push(rel.clone());

    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = tcc_tools::run(&args, &mut std::io::empty(), &mut out, &mut err);
    let (out, err) = (
        String::from_utf8(out).unwrap(),
        String::from_utf8(err).unwrap(),
    );

    let expected = annotations(&src);
    let found = diagnostics(&err, &rel);
    if expected.is_empty() {
        assert_eq!(code, 0, "{rel}: expected success, got exit {code}:\n{err}");
    } else {
        assert_eq!(
            code, 1,
            "{rel}: expected exit 1 for an input error, got {code}:\n{err}"
        );
        for (line, text) in &expected {
            assert!(
                found
                    .iter()
                    .any(|(l, m)| l == line && m.contains(text.as_str())),
                "{rel}:{line}: expected a diagnostic containing `{text}`, got:\n{err}"
            );
        }
        for (line, msg) in &found {
            assert!(
                expected.iter().any(|(l, _)| l == line),
                "{rel}:{line}: unexpected diagnostic `{msg}`"
            );
        }
    }
    format!("command: {cmd}\nexit: {code}\n--- stdout\n{out}--- stderr\n{err}")
}

#[test]
fn filetests() {
    insta::glob!("filetests/**/*.tir", |path| {
        insta::assert_snapshot!(run_case(path));
    });
}

#[test]
fn argument_splitting() {
    assert_eq!(
        split_args("opt --passes='cse, dce' -o x"),
        ["opt", "--passes=cse, dce", "-o", "x"]
    );
    assert_eq!(split_args("cat \"\""), ["cat", ""]);
}

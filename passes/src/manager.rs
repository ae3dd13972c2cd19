//! The pass manager: the [`Pass`] trait, the registry, textual pipelines and running them.
//!
//! A pipeline is text, `name{key=value,...},name2`; [`Pipeline::parse`] checks every name and
//! option against the registry and `Display` prints it back identically. [`PassManager`] runs a
//! pipeline over a module, verifying after each pass when asked (always in tests and debug
//! builds), and can print the IR after every pass and time each one.

use std::fmt;
use std::io::Write;
use std::time::{Duration, Instant};
use tcc_ir::{Diagnostics, Function, Module};

/// A transformation of functions.
pub trait Pass {
    /// The registered name.
    fn name(&self) -> &'static str;
    /// Transforms one function. An `Err` is a user-facing failure (for example an infeasible
    /// option), not a bug.
    fn run_on_function(&self, f: &mut Function) -> Result<(), String>;
    /// Transforms a module; by default each function in turn.
    fn run_on_module(&self, m: &mut Module) -> Result<(), String> {
        for f in &mut m.functions {
            self.run_on_function(f)
                .map_err(|e| format!("in `@{}`: {e}", f.name))?;
        }
        Ok(())
    }
    /// What the pass has to report about its last run (statistics, limits hit), one line per
    /// function; taken by the pass manager after each run. By default nothing.
    fn notes(&self) -> Vec<String> {
        Vec::new()
    }
}

/// What a pass has noted since the pass manager last took its notes ([`Pass::notes`]); passes
/// run on `&self`, so the notes sit behind a lock.
#[derive(Debug, Default)]
pub struct Notes(std::sync::Mutex<Vec<String>>);

impl Notes {
    /// Adds a note (one function's outcome).
    pub fn push(&self, note: String) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(note);
    }

    /// The notes so far, leaving none.
    pub fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// An option a pass accepts.
pub struct OptionInfo {
    /// Its key.
    pub name: &'static str,
    /// What it does, with its default.
    pub help: &'static str,
}

/// A registry entry.
pub struct PassInfo {
    /// The name used in pipelines.
    pub name: &'static str,
    /// One line saying what it does.
    pub summary: &'static str,
    /// The options it accepts.
    pub options: &'static [OptionInfo],
    /// Builds the pass from checked options.
    pub create: fn(&Options) -> Result<Box<dyn Pass>, String>,
}

/// The options given to one pass in a pipeline, in the order written.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Options(pub Vec<(String, String)>);

impl Options {
    /// The raw text of an option.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// An unsigned integer option, or `default` when absent.
    pub fn usize_or(&self, key: &str, default: usize) -> Result<usize, String> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| format!("option `{key}` must be a non-negative integer, found `{v}`")),
        }
    }
}

/// Every registered pass, sorted by name.
pub fn registry() -> &'static [PassInfo] {
    crate::REGISTRY
}

/// Looks a pass up by name.
pub fn lookup(name: &str) -> Option<&'static PassInfo> {
    registry().iter().find(|p| p.name == name)
}

/// One pass in a pipeline with its options.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PassSpec {
    /// The pass name.
    pub name: String,
    /// Its options.
    pub options: Options,
}

/// A parsed, checked pipeline.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pipeline(pub Vec<PassSpec>);

/// A malformed pipeline: where and what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PipelineError {
    /// The pipeline text.
    pub text: String,
    /// Byte offset of the problem.
    pub pos: usize,
    /// What is wrong and what is valid.
    pub message: String,
}

impl fmt::Display for PipelineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let col = self.text[..self.pos.min(self.text.len())].chars().count();
        write!(
            f,
            "bad pass pipeline: {}\n  {}\n  {}^",
            self.message,
            self.text,
            " ".repeat(col)
        )
    }
}

impl std::error::Error for PipelineError {}

fn names_list() -> String {
    registry()
        .iter()
        .map(|p| p.name)
        .collect::<Vec<_>>()
        .join(", ")
}

impl Options {
    /// The options of the registered pass `pass`, written as inside its braces in a pipeline
    /// (`budget=0.5`), checked exactly as [`Pipeline::parse`] checks them.
    pub fn parse_for(pass: &str, text: &str) -> Result<Options, PipelineError> {
        let mut p = Pipeline::parse(&format!("{pass}{{{text}}}"))?;
        match (p.0.pop(), p.0.is_empty()) {
            (Some(spec), true) => Ok(spec.options),
            _ => Err(PipelineError {
                text: text.to_string(),
                pos: 0,
                message: format!("expected the options of `{pass}` only"),
            }),
        }
    }
}

impl Pipeline {
    /// Parses and checks pipeline text. Whitespace around names, keys and values is ignored.
    pub fn parse(text: &str) -> Result<Pipeline, PipelineError> {
        let err = |pos: usize, message: String| PipelineError {
            text: text.to_string(),
            pos,
            message,
        };
        let b = text.as_bytes();
        let mut i = 0;
        let skip_ws = |i: &mut usize| {
            while *i < b.len() && b[*i].is_ascii_whitespace() {
                *i += 1;
            }
        };
        let word = |i: &mut usize| {
            let s = *i;
            while *i < b.len() && (b[*i].is_ascii_alphanumeric() || b[*i] == b'-' || b[*i] == b'_')
            {
                *i += 1;
            }
            &text[s..*i]
        };
        let mut specs = Vec::new();
        skip_ws(&mut i);
        if i == b.len() {
            return Ok(Pipeline(specs));
        }
        loop {
            skip_ws(&mut i);
            let start = i;
            let name = word(&mut i);
            if name.is_empty() {
                return Err(err(i, "expected a pass name".into()));
            }
            let info = lookup(name).ok_or_else(|| {
                err(
                    start,
                    format!("unknown pass `{name}`; valid passes are: {}", names_list()),
                )
            })?;
            let mut opts = Vec::new();
            skip_ws(&mut i);
            if i < b.len() && b[i] == b'{' {
                i += 1;
                loop {
                    skip_ws(&mut i);
                    let kpos = i;
                    let key = word(&mut i);
                    if key.is_empty() {
                        return Err(err(i, "expected an option name".into()));
                    }
                    if !info.options.iter().any(|o| o.name == key) {
                        let valid: Vec<&str> = info.options.iter().map(|o| o.name).collect();
                        let valid = if valid.is_empty() {
                            "it takes no options".to_string()
                        } else {
                            format!("valid options are: {}", valid.join(", "))
                        };
                        return Err(err(
                            kpos,
                            format!("pass `{name}` has no option `{key}`; {valid}"),
                        ));
                    }
                    if opts.iter().any(|(k, _): &(String, String)| k == key) {
                        return Err(err(kpos, format!("option `{key}` is given twice")));
                    }
                    skip_ws(&mut i);
                    if i >= b.len() || b[i] != b'=' {
                        return Err(err(i, format!("expected `=` after option `{key}`")));
                    }
                    i += 1;
                    skip_ws(&mut i);
                    let vstart = i;
                    let mut depth = 0i32;
                    while i < b.len() {
                        match b[i] {
                            b'[' => depth += 1,
                            b']' => depth -= 1,
                            b',' | b'}' if depth == 0 => break,
                            _ => {}
                        }
                        i += 1;
                    }
                    let value = text[vstart..i].trim_end();
                    if value.is_empty() {
                        return Err(err(vstart, format!("option `{key}` needs a value")));
                    }
                    opts.push((key.to_string(), value.to_string()));
                    if i >= b.len() {
                        return Err(err(
                            i,
                            format!("missing `}}` after the options of `{name}`"),
                        ));
                    }
                    i += 1;
                    if b[i - 1] == b'}' {
                        break;
                    }
                }
            }
            let spec = PassSpec {
                name: name.to_string(),
                options: Options(opts),
            };
            (info.create)(&spec.options).map_err(|m| err(start, format!("pass `{name}`: {m}")))?;
            specs.push(spec);
            skip_ws(&mut i);
            if i == b.len() {
                return Ok(Pipeline(specs));
            }
            if b[i] != b',' {
                return Err(err(i, "expected `,` between passes".into()));
            }
            i += 1;
        }
    }

    /// Builds the passes.
    pub fn build(&self) -> Vec<Box<dyn Pass>> {
        self.0
            .iter()
            .map(|s| {
                (lookup(&s.name).expect("checked at parse").create)(&s.options)
                    .expect("checked at parse")
            })
            .collect()
    }
}

impl fmt::Display for Pipeline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, s) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            f.write_str(&s.name)?;
            if !s.options.0.is_empty() {
                f.write_str("{")?;
                for (j, (k, v)) in s.options.0.iter().enumerate() {
                    if j > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{k}={v}")?;
                }
                f.write_str("}")?;
            }
        }
        Ok(())
    }
}

/// A pass that failed, or left IR that does not verify.
#[derive(Debug)]
pub enum PassError {
    /// The pass reported a problem with its input or options.
    Failed {
        /// The pass.
        pass: String,
        /// Its message.
        message: String,
    },
    /// The IR did not verify after the pass: a bug in tcc.
    BrokeIr {
        /// The pass.
        pass: String,
        /// What the verifier found.
        diags: Diagnostics,
    },
}

impl fmt::Display for PassError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PassError::Failed { pass, message } => write!(f, "pass `{pass}` failed: {message}"),
            PassError::BrokeIr { pass, diags } => write!(
                f,
                "internal compiler error: the IR does not verify after pass `{pass}` (this is a bug in tcc; please report it with the input)\n{diags}"
            ),
        }
    }
}

impl std::error::Error for PassError {}

/// Runs a pipeline.
pub struct PassManager {
    /// Each pass with the label it is reported under (its pipeline text).
    passes: Vec<(String, Box<dyn Pass>)>,
    /// Verify after every pass (default: in debug builds).
    pub verify_each: bool,
    /// Print the module after every pass to the log.
    pub print_after_all: bool,
}

impl PassManager {
    /// A manager for a checked pipeline.
    pub fn new(pipeline: Pipeline) -> PassManager {
        let passes = pipeline
            .0
            .iter()
            .map(|spec| PassSpecDisplay(spec).to_string())
            .zip(pipeline.build())
            .collect();
        PassManager {
            passes,
            verify_each: cfg!(debug_assertions),
            print_after_all: false,
        }
    }

    /// Appends a pass that is not in the registry (an embedder's own), reported as `label`.
    pub fn add(&mut self, label: &str, pass: Box<dyn Pass>) {
        self.passes.push((label.to_string(), pass));
    }

    /// Runs every pass in order and reports what each did. With `print_after_all`, the module
    /// is written to `log` after each pass.
    pub fn run(&self, m: &mut Module, log: &mut dyn Write) -> Result<Vec<PassRun>, PassError> {
        let mut runs = Vec::new();
        for (label, pass) in &self.passes {
            let before = op_counts(m);
            let t = Instant::now();
            pass.run_on_module(m).map_err(|message| PassError::Failed {
                pass: label.clone(),
                message,
            })?;
            let time = t.elapsed();
            let after = op_counts(m);
            let mut changes: Vec<(&'static str, usize, usize)> = before
                .iter()
                .map(|(&k, &n)| (k, n, after.get(k).copied().unwrap_or(0)))
                .chain(
                    (after.iter())
                        .filter(|(k, _)| !before.contains_key(*k))
                        .map(|(&k, &n)| (k, 0, n)),
                )
                .filter(|&(_, a, b)| a != b)
                .collect();
            changes.sort_unstable();
            runs.push(PassRun {
                label: label.clone(),
                time,
                ops: (before.values().sum(), after.values().sum()),
                changes,
                notes: pass.notes(),
            });
            if self.verify_each {
                tcc_ir::verify_module(m).map_err(|diags| PassError::BrokeIr {
                    pass: label.clone(),
                    diags,
                })?;
            }
            if self.print_after_all {
                let _ = write!(log, "// ----- IR after {label} ----- //\n{m}\n");
            }
        }
        Ok(runs)
    }
}

/// What one pass of a [`PassManager::run`] did.
#[derive(Clone, Debug)]
pub struct PassRun {
    /// The pass as the pipeline wrote it.
    pub label: String,
    /// Its wall time.
    pub time: Duration,
    /// Scheduled ops before and after.
    pub ops: (usize, usize),
    /// Ops by mnemonic whose count changed: `(mnemonic, before, after)`, sorted.
    pub changes: Vec<(&'static str, usize, usize)>,
    /// What the pass reported ([`Pass::notes`]).
    pub notes: Vec<String>,
}

impl fmt::Display for PassRun {
    /// `fold-bn: 312 -> 272 ops (batch_norm 20 -> 0, add 8 -> 28, ...)`, then the pass's notes,
    /// one per line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} -> {} ops", self.label, self.ops.0, self.ops.1)?;
        if self.changes.is_empty() {
            f.write_str(", unchanged")?;
        } else {
            f.write_str(" (")?;
            for (i, (k, a, b)) in self.changes.iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                write!(f, "{k} {a} -> {b}")?;
            }
            f.write_str(")")?;
        }
        for n in &self.notes {
            write!(f, "\n  {n}")?;
        }
        Ok(())
    }
}

/// Scheduled ops of each mnemonic in `m`.
fn op_counts(m: &Module) -> std::collections::BTreeMap<&'static str, usize> {
    let mut n = std::collections::BTreeMap::new();
    for f in &m.functions {
        for &op in f.schedule() {
            *n.entry(f.op(op).kind.mnemonic()).or_insert(0) += 1;
        }
    }
    n
}

struct PassSpecDisplay<'a>(&'a PassSpec);

impl fmt::Display for PassSpecDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Pipeline(vec![self.0.clone()]).fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pipelines_print_back_identically() {
        for text in ["cse,dce", "canonicalize{fold-limit=16},cse", "dce", ""] {
            assert_eq!(Pipeline::parse(text).unwrap().to_string(), text);
        }
        assert_eq!(
            Pipeline::parse(" cse , dce ").unwrap().to_string(),
            "cse,dce"
        );
    }

    /// Drops the operands of the first op: the IR no longer verifies.
    struct Breaker;
    impl Pass for Breaker {
        fn name(&self) -> &'static str {
            "breaker"
        }
        fn run_on_function(&self, f: &mut Function) -> Result<(), String> {
            let op = f.schedule()[0];
            f.op_mut(op).args.clear();
            Ok(())
        }
    }

    #[test]
    fn a_pass_that_breaks_the_ir_is_named() {
        let src = "func @f(%x: f32[4]) -> (f32[4]) {\n  %y = relu %x : f32[4]\n  return %y\n}\n";
        let mut m = tcc_ir::parse_module(src).unwrap();
        let mut pm = PassManager::new(Pipeline::parse("cse").unwrap());
        pm.verify_each = true;
        pm.add("breaker", Box::new(Breaker));
        let e = pm
            .run(&mut m, &mut std::io::sink())
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("internal compiler error: the IR does not verify after pass `breaker`"),
            "{e}"
        );
        assert!(
            e.contains("op0 (%y = relu): `relu` takes 1 operand, found 0"),
            "{e}"
        );
    }

    #[test]
    fn unknown_names_list_the_valid_ones() {
        let e = Pipeline::parse("cse,frobnicate").unwrap_err();
        assert_eq!(e.pos, 4);
        assert!(e.message.contains("unknown pass `frobnicate`"), "{e}");
        assert!(e.message.contains("canonicalize, cse, dce"), "{e}");
        let e = Pipeline::parse("canonicalize{limit=3}").unwrap_err();
        assert!(e.message.contains("valid options are: fold-limit"), "{e}");
        let e = Pipeline::parse("dce{x=1}").unwrap_err();
        assert!(e.message.contains("it takes no options"), "{e}");
        let e = Pipeline::parse("canonicalize{fold-limit=lots}").unwrap_err();
        assert!(e.message.contains("non-negative integer"), "{e}");
        assert!(Pipeline::parse("cse,").is_err());
        assert!(Pipeline::parse("canonicalize{fold-limit=3").is_err());
    }
}

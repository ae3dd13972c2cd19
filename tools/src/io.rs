//! What every subcommand shares: the three standard streams, reading an input file (IR text or
//! an ONNX model), choosing a function, and writing a module out.

use crate::{Error, npy, weights};
use std::io::{Read, Write};
use std::path::Path;
use tcc_ir::{Function, Module, parse_bytes, verify_module};

/// The standard streams a subcommand reads and writes (real ones in the binary, buffers in
/// tests).
pub(crate) struct Io<'a> {
    pub stdin: &'a mut dyn Read,
    pub stdout: &'a mut dyn Write,
    pub stderr: &'a mut dyn Write,
}

/// What a command knows that changes how an ONNX model is imported.
#[derive(Default)]
pub(crate) struct Load<'a> {
    /// `--shape`, `--const`, `--params`.
    pub onnx: tcc_onnx::Options,
    /// The values to differentiate or train with respect to (every floating-point parameter
    /// when empty): the model's initializers among them become parameters that keep their
    /// values, unless `--params` already chose.
    pub wrt: Option<&'a [String]>,
    /// Input values the user gave (`--input x=x.npy`): a graph input with dynamic dimensions
    /// and no `--shape` takes its shape from them.
    pub given: &'a [(&'a str, &'a tcc_ir::Tensor)],
}

/// Where an input came from and its bytes.
pub(crate) struct Input {
    pub name: String,
    pub bytes: Vec<u8>,
}

impl Io<'_> {
    /// Reads `file`, or standard input for `-`.
    pub fn read(&mut self, file: &str) -> Result<Input, Error> {
        if file != "-" {
            return read_file(file);
        }
        let mut bytes = Vec::new();
        self.stdin
            .read_to_end(&mut bytes)
            .map_err(|e| Error::input(format!("error: cannot read standard input: {e}")))?;
        Ok(Input {
            name: "<stdin>".into(),
            bytes,
        })
    }

    /// Reads `file` and parses and verifies it, or imports it as an ONNX model.
    pub fn load(&mut self, file: &str) -> Result<(Input, Module), Error> {
        self.load_with(file, &Load::default())
    }

    /// [`Io::load`] with what a command knows that changes an ONNX import (see [`Load`]).
    /// IR text that names a weights directory gets the values stored there.
    pub fn load_with(&mut self, file: &str, how: &Load) -> Result<(Input, Module), Error> {
        let input = self.read(file)?;
        let m = load_input(&input, how)?;
        Ok((input, m))
    }

    /// Prints a module to `output` (a file, or stdout when absent or `-`). Stored parameter
    /// values go to the weights directory beside the file (`out.tir` -> `out.weights/`), which
    /// the text names; on stdout they cannot go anywhere, and a note says so.
    pub fn write_module(&mut self, mut m: Module, output: Option<&str>) -> Result<(), Error> {
        let file = output.filter(|&p| p != "-");
        let stored = &m.weights.values;
        m.weights.location = match file {
            _ if stored.is_empty() => None,
            Some(path) => {
                let dir = weights::dir_beside(Path::new(path));
                weights::write(&dir, stored).map_err(Error::input)?;
                dir.file_name().map(|n| n.to_string_lossy().into_owned())
            }
            None => {
                let _ = writeln!(
                    self.stderr,
                    "note: the values of {} parameters ({}) are not printed; write the IR with -o FILE.tir to store them in FILE.weights/",
                    stored.len(),
                    abbreviate(stored.keys().map(String::as_str))
                );
                None
            }
        };
        let text = m.to_string();
        match file {
            Some(path) => std::fs::write(path, text)
                .map_err(|e| Error::input(format!("error: cannot write `{path}`: {e}"))),
            None => {
                let _ = write!(self.stdout, "{text}");
                Ok(())
            }
        }
    }
}

/// The file `file`, read.
pub(crate) fn read_file(file: &str) -> Result<Input, Error> {
    let bytes = std::fs::read(file)
        .map_err(|e| Error::input(format!("error: cannot read `{file}`: {e}")))?;
    Ok(Input {
        name: file.to_string(),
        bytes,
    })
}

/// An input read into a module: ONNX (by its name or first byte) imported, IR text parsed and
/// verified with its stored weights read (see [`Io::load_with`]).
pub(crate) fn load_input(input: &Input, how: &Load) -> Result<Module, Error> {
    let m = if is_onnx(input) {
        let model = tcc_onnx::read_model(&input.bytes)
            .map_err(|e| Error::parse(format!("error: {}: {e}", input.name)))?;
        let mut opts = how.onnx.clone();
        if let Some(wrt) = how.wrt
            && opts.params == tcc_onnx::Params::None
        {
            opts.params = trainable(&model, wrt);
        }
        let dynamic = tcc_onnx::dynamic_inputs(&model);
        for &(name, t) in how.given {
            if dynamic.contains(&name) && !opts.shapes.iter().any(|(n, _)| n == name) {
                opts.shapes.push((name.to_string(), t.dims().to_vec()));
            }
        }
        import_onnx(input, &model, &opts)?
    } else {
        let src = String::from_utf8_lossy(&input.bytes);
        let mut m =
            parse_bytes(&input.bytes).map_err(|d| Error::parse(d.render(&input.name, &src)))?;
        verify_module(&m).map_err(|d| Error::verify(d.render(&input.name, &src)))?;
        if let Some(dir) = &m.weights.location {
            let at = format!("{}: weights \"{dir}\"", input.name);
            let base = match input.name.as_str() {
                "<stdin>" => Path::new("."),
                name => Path::new(name).parent().unwrap_or(Path::new(".")),
            };
            m.weights.values = weights::read(&base.join(dir), &m, &at).map_err(Error::input)?;
        }
        m
    };
    Ok(m)
}

/// The first few names, then how many more.
pub(crate) fn abbreviate<'a>(names: impl Iterator<Item = &'a str>) -> String {
    let names: Vec<&str> = names.collect();
    let mut s: Vec<String> = names.iter().take(4).map(|n| format!("`{n}`")).collect();
    if names.len() > 4 {
        s.push(format!("{} more", names.len() - 4));
    }
    s.join(", ")
}

/// Imports a decoded ONNX model, looking up external data beside the model file.
pub(crate) fn import_onnx(
    input: &Input,
    model: &tcc_onnx::proto::ModelProto,
    opts: &tcc_onnx::Options,
) -> Result<Module, Error> {
    let mut opts = opts.clone();
    if opts.dir.is_none() && input.name != "<stdin>" {
        let dir = Path::new(&input.name).parent();
        opts.dir = Some(dir.unwrap_or(Path::new(".")).to_path_buf());
    }
    tcc_onnx::import_model(model, &opts)
        .map_err(|e| Error::parse(format!("error: {}: {e}", input.name)))
}

/// The initializers to make parameters for differentiating with respect to `wrt`: those it
/// names, or whose names start with an entry ending in `/` or `.` (a scope: `layer1.`); all of
/// them when `wrt` is empty.
fn trainable(model: &tcc_onnx::proto::ModelProto, wrt: &[String]) -> tcc_onnx::Params {
    if wrt.is_empty() {
        return tcc_onnx::Params::All;
    }
    let wanted = |name: &str| {
        wrt.iter().any(|w| {
            let w = w.trim_start_matches('%');
            w == name || (w.ends_with(['/', '.']) && name.starts_with(w))
        })
    };
    let names = tcc_onnx::initializer_names(model);
    tcc_onnx::Params::Names(
        names
            .into_iter()
            .filter(|n| wanted(n))
            .map(String::from)
            .collect(),
    )
}

/// Whether an input is an ONNX model: a `.onnx` file, or bytes that start as a serialized
/// `ModelProto` does (field 1, `ir_version`, a varint: byte 0x08), which IR text never does.
pub(crate) fn is_onnx(input: &Input) -> bool {
    input.name.ends_with(".onnx") || input.bytes.first() == Some(&0x08)
}

/// The flags that bind an ONNX model's inputs (`tcc import`, `tcc run`).
#[derive(clap::Args, Debug)]
pub(crate) struct OnnxArgs {
    /// For ONNX models: bind a graph input's shape, for inputs with dynamic dimensions
    /// (repeatable).
    #[arg(long = "shape", value_name = "NAME=D0,D1,...")]
    pub shapes: Vec<String>,
    /// For ONNX models: fix a graph input to the value in a .npy file, making it a constant
    /// (repeatable); needed for inputs that decide shapes, such as a Reshape target.
    #[arg(long = "const", value_name = "NAME=PATH.npy")]
    pub consts: Vec<String>,
    /// For ONNX models: make initializers parameters that keep their values (to differentiate
    /// or train them): `all` (every floating-point initializer) or a comma-separated list.
    #[arg(long = "params", value_name = "all|NAMES")]
    pub params: Option<String>,
}

impl OnnxArgs {
    /// The import options these flags give.
    pub fn options(&self) -> Result<tcc_onnx::Options, Error> {
        let (shapes, consts) = (&self.shapes, &self.consts);
        let mut opts = tcc_onnx::Options::default();
        for s in shapes {
            opts.add_shape(s)
                .map_err(|e| Error::usage(format!("error: {e}")))?;
        }
        for c in consts {
            let (name, path) = c.split_once('=').ok_or_else(|| {
                Error::usage(format!("error: --const `{c}`: expected NAME=PATH.npy"))
            })?;
            let bytes = std::fs::read(path).map_err(|e| {
                Error::input(format!("error: --const {name}: cannot read `{path}`: {e}"))
            })?;
            let t = npy::read(&bytes)
                .map_err(|e| Error::input(format!("error: --const {name}: `{path}`: {e}")))?;
            opts.constants.push((name.to_string(), t));
        }
        opts.params = match self.params.as_deref() {
            None => tcc_onnx::Params::None,
            Some("all") => tcc_onnx::Params::All,
            Some(names) => tcc_onnx::Params::Names(
                names
                    .split(',')
                    .map(|n| n.trim().trim_start_matches('%').to_string())
                    .filter(|n| !n.is_empty())
                    .collect(),
            ),
        };
        Ok(opts)
    }
}

/// The function a subcommand works on: `func` if given, else the module's only one.
pub(crate) fn pick_function<'m>(
    m: &'m Module,
    func: Option<&str>,
    file: &str,
) -> Result<&'m Function, Error> {
    let names = || {
        m.functions
            .iter()
            .map(|f| format!("@{}", f.name))
            .collect::<Vec<_>>()
            .join(", ")
    };
    match func {
        Some(name) => {
            let name = name.trim_start_matches('@');
            m.function(name).ok_or_else(|| {
                Error::input(format!(
                    "error: `{file}` has no function `@{name}`; it defines {}",
                    names()
                ))
            })
        }
        None if m.functions.len() == 1 => Ok(&m.functions[0]),
        None => Err(Error::input(format!(
            "error: `{file}` defines {} functions ({}); choose one with --func",
            m.functions.len(),
            names()
        ))),
    }
}

//! `tcc._native`: the Rust half of the Python package `tcc`.
//!
//! The public API is `python/tcc/__init__.py`; this module is its engine and is not meant to be
//! called directly. Arrays cross through numpy's array interface (`__array_struct__`, a C
//! struct with the data's address, dtype, shape and flags, part of the stable ABI's reach):
//! the kernels read C-contiguous, aligned inputs in place, and results are copied once into
//! numpy arrays the Python side allocated. The interpreter lock is released while compiling,
//! running and training, so Python threads run programs in parallel.
//!
//! Errors are raised as the exception classes of `tcc._errors`, chosen by what went wrong
//! ([`tcc_tools::ErrorKind`]).

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyCapsule, PyCapsuleMethods, PyType};
use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, c_void};
use tcc_ir::{DType, Tensor, TensorRef, TensorType};
use tcc_tools::embed::{self, Source};
use tcc_tools::{Error, ErrorKind};

/// The exception `class` of `tcc._errors` with `message`.
fn raise(py: Python<'_>, class: &str, message: &str) -> PyErr {
    let message = message.trim_end().trim_start_matches("error: ").to_string();
    let ty = (py.import("tcc._errors"))
        .and_then(|m| m.getattr(class))
        .and_then(|t| t.cast_into::<PyType>().map_err(PyErr::from));
    match ty {
        Ok(ty) => PyErr::from_type(ty, message),
        Err(e) => e,
    }
}

fn driver_error(py: Python<'_>, e: Error) -> PyErr {
    let class = match e.kind {
        ErrorKind::Parse => "ParseError",
        ErrorKind::Verify => "VerifyError",
        ErrorKind::Input => "InputError",
        ErrorKind::Usage => "UsageError",
    };
    raise(py, class, &e.message)
}

fn input_error(py: Python<'_>, message: &str) -> PyErr {
    raise(py, "InputError", message)
}

/// A model given in memory: IR text, or a file's bytes (a serialized ONNX model).
enum Given {
    Bytes(Vec<u8>),
    Text(String),
}

impl<'py> FromPyObject<'_, 'py> for Given {
    type Error = PyErr;

    fn extract(ob: pyo3::Borrowed<'_, 'py, PyAny>) -> PyResult<Given> {
        // `bytes` copied in one piece (a Vec<u8> from it would take a byte at a time).
        if let Ok(b) = ob.cast::<PyBytes>() {
            return Ok(Given::Bytes(b.as_bytes().to_vec()));
        }
        Ok(Given::Text(ob.extract()?))
    }
}

/// Runs `f` on the source given as exactly one of `path` and `text` (IR text, or bytes).
fn with_source<T>(
    path: Option<String>,
    text: Option<Given>,
    f: impl FnOnce(Source<'_>) -> T,
) -> PyResult<T> {
    match (&path, &text) {
        (Some(p), None) => Ok(f(Source::Path(p))),
        (None, Some(Given::Text(t))) => Ok(f(Source::Text(t))),
        (None, Some(Given::Bytes(b))) => Ok(f(Source::Bytes(b))),
        _ => Err(PyRuntimeError::new_err(
            "internal error: give exactly one of path and text",
        )),
    }
}

/// How to load and compile, as the Python side passes it (`_settings` in `tcc/__init__.py`):
/// the shapes of an ONNX model's dynamic inputs, the passes, the target, the function and the
/// threads a run uses.
type Settings = (
    Vec<(String, Vec<u64>)>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<usize>,
);

/// The driver's options and the thread count of `settings`.
fn options((shapes, passes, target, func, threads): Settings) -> (embed::Options, Option<usize>) {
    let opts = embed::Options {
        shapes,
        passes,
        target,
        func,
    };
    (opts, threads)
}

/// A compiled function (see `tcc.Program`).
#[pyclass(frozen, module = "tcc._native")]
struct Program {
    compiled: embed::Compiled,
    /// The threads its runs use, where the caller chose how many (else one per core).
    threads: Option<usize>,
}

impl Program {
    fn new(py: Python<'_>, compiled: embed::Compiled, threads: Option<usize>) -> PyResult<Program> {
        if threads == Some(0) {
            return Err(raise(py, "UsageError", "threads: at least 1"));
        }
        Ok(Program { compiled, threads })
    }
}

/// A value's description for Python: name, dtype name, dims.
type Spec = (String, &'static str, Vec<u64>);

fn spec(f: &tcc_ir::Function, v: tcc_ir::Value) -> Spec {
    let ty = f.ty(v);
    (f.name(v).to_string(), ty.dtype().name(), ty.dims().to_vec())
}

/// numpy's `PyArrayInterface`, what `__array_struct__`'s capsule points to (numpy's docs, "The
/// array interface protocol").
#[repr(C)]
struct ArrayInterface {
    two: c_int,
    nd: c_int,
    typekind: c_char,
    itemsize: c_int,
    flags: c_int,
    shape: *const isize,
    strides: *const isize,
    data: *mut c_void,
    descr: *mut c_void,
}

// Its flags.
const CONTIGUOUS: c_int = 0x1;
const ALIGNED: c_int = 0x100;
const NOTSWAPPED: c_int = 0x200;
const WRITEABLE: c_int = 0x400;

/// The data of the numpy array `a`, which must be a C-contiguous, aligned, native-endian
/// array of type `ty` (writable if `write`): its address, or what is wrong.
///
/// The address stays valid while `a` is alive and not resized (numpy refuses to resize an
/// array others refer to).
fn data_of(a: &Bound<'_, PyAny>, ty: &TensorType, write: bool) -> Result<*mut u8, String> {
    let capsule = (a.getattr(pyo3::intern!(a.py(), "__array_struct__")))
        .and_then(|c| c.cast_into::<PyCapsule>().map_err(PyErr::from))
        .map_err(|_| "not a numpy array".to_string())?;
    let p = capsule.pointer_checked(None).map_err(|e| e.to_string())?;
    // SAFETY: numpy's capsule points to a `PyArrayInterface` that lives as long as the capsule.
    let i = unsafe { &*(p.as_ptr() as *const ArrayInterface) };
    let want = CONTIGUOUS | ALIGNED | NOTSWAPPED | if write { WRITEABLE } else { 0 };
    if i.two != 2 || i.flags & want != want {
        let what = if write { "writable, " } else { "" };
        return Err(format!(
            "not a {what}C-contiguous, aligned, native-endian array"
        ));
    }
    let kind = match ty.dtype() {
        DType::F32 | DType::F64 => b'f',
        DType::I8 | DType::I32 | DType::I64 => b'i',
        DType::U8 => b'u',
        DType::Bool => b'b',
    };
    let dims = ty.dims();
    // SAFETY: `shape` holds `nd` extents where `nd` > 0.
    let shape = (i.nd > 0).then(|| unsafe { std::slice::from_raw_parts(i.shape, i.nd as usize) });
    let same_dims = (shape.unwrap_or(&[]).iter())
        .map(|&d| d as u64)
        .eq(dims.iter().copied());
    if i.typekind as u8 != kind || i.itemsize as u64 != ty.dtype().size_bytes() || !same_dims {
        return Err(format!("not an array of {ty}"));
    }
    Ok(i.data as *mut u8)
}

/// The numpy array `a` as a tensor of type `ty`, read in place (see [`data_of`]), or what is
/// wrong with it.
fn view_of<'a>(a: &'a Bound<'_, PyAny>, ty: &'a TensorType) -> Result<TensorRef<'a>, String> {
    let data = data_of(a, ty, false)?;
    let len = ty.size_bytes() as usize;
    let bytes = if len == 0 {
        &[]
    } else {
        // SAFETY: `a`, borrowed for `'a`, is a C-contiguous array of `ty`: `len` bytes at
        // `data`, which the caller does not write while it runs.
        unsafe { std::slice::from_raw_parts(data as *const u8, len) }
    };
    TensorRef::new(ty, bytes).map_err(|e| e.to_string())
}

#[pymethods]
impl Program {
    /// The parameters: (name, dtype, shape, has a stored value) each.
    #[getter]
    fn inputs(&self) -> Vec<(String, &'static str, Vec<u64>, bool)> {
        let f = &self.compiled.function;
        (f.params().iter().zip(&self.compiled.stored))
            .map(|(&p, stored)| {
                let (name, dtype, dims) = spec(f, p);
                (name, dtype, dims, stored.is_some())
            })
            .collect()
    }

    /// The results: (name, dtype, shape) each.
    #[getter]
    fn outputs(&self) -> Vec<Spec> {
        let f = &self.compiled.function;
        f.results().iter().map(|&r| spec(f, r)).collect()
    }

    /// The function's name.
    #[getter]
    fn name(&self) -> String {
        self.compiled.function.name.clone()
    }

    /// Runs on `inputs` (one per parameter: a numpy array of its type, or `None` for the
    /// stored value) and copies the results into `outputs` (writable numpy arrays of the
    /// results' types).
    fn run(
        &self,
        py: Python<'_>,
        inputs: Vec<Option<Bound<'_, PyAny>>>,
        outputs: Vec<Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let c = &self.compiled;
        let f = &c.function;
        if inputs.len() != f.params().len() || outputs.len() != f.results().len() {
            return Err(PyRuntimeError::new_err(
                "internal error: inputs or outputs do not match the function",
            ));
        }
        let mut views = Vec::with_capacity(inputs.len());
        for ((&p, given), stored) in f.params().iter().zip(&inputs).zip(&c.stored) {
            let ty = f.ty(p);
            let bad = |e: String| input_error(py, &format!("input `{}`: {e}", f.name(p)));
            let view = match (given, stored) {
                (Some(a), _) => view_of(a, ty).map_err(bad)?,
                (None, Some(t)) => t.view(),
                (None, None) => {
                    return Err(input_error(
                        py,
                        &format!("no value for parameter `{}`", f.name(p)),
                    ));
                }
            };
            views.push(view);
        }
        let mut outs = Vec::with_capacity(outputs.len());
        for (&r, a) in f.results().iter().zip(&outputs) {
            let data = data_of(a, f.ty(r), true).map_err(|e| {
                PyRuntimeError::new_err(format!("internal error: output `{}`: {e}", f.name(r)))
            })?;
            outs.push(SendPtr(data));
        }
        let results = py.detach(|| {
            let run = || c.exe.run_refs(&views);
            let results = match self.threads {
                Some(n) => tcc_codegen::with_threads(n, run),
                None => run(),
            };
            let results = results.map_err(|e| e.0)?;
            for (t, out) in results.iter().zip(&outs) {
                let bytes = t.view().bytes();
                // SAFETY: `out` is a writable array of the result's type (checked above), held
                // by the caller for the call: `bytes.len()` bytes.
                unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.0, bytes.len()) };
            }
            Ok::<(), String>(())
        });
        results.map_err(|m| input_error(py, &m))
    }
}

/// The program `how` (`embed::compile`, or `embed::grad` with its arguments) makes of the
/// source of `path` or `text` with `settings`, the interpreter lock released meanwhile.
fn build(
    py: Python<'_>,
    (path, text): (Option<String>, Option<Given>),
    settings: Settings,
    how: impl FnOnce(Source<'_>, &embed::Options) -> Result<embed::Compiled, Error> + Send,
) -> PyResult<Program> {
    let (opts, threads) = options(settings);
    let compiled = py.detach(|| with_source(path, text, |s| how(s, &opts)))?;
    Program::new(py, compiled.map_err(|e| driver_error(py, e))?, threads)
}

/// Compiles the function of `path` (an IR file or ONNX model) or of IR `text`.
#[pyfunction]
fn compile(
    py: Python<'_>,
    path: Option<String>,
    text: Option<Given>,
    settings: Settings,
) -> PyResult<Program> {
    build(py, (path, text), settings, embed::compile)
}

/// Differentiates `differentiate` (wrt, ys, stop) and compiles (see `tcc.grad`).
#[pyfunction]
fn grad(
    py: Python<'_>,
    path: Option<String>,
    text: Option<Given>,
    differentiate: (Vec<String>, Vec<String>, Vec<String>),
    settings: Settings,
) -> PyResult<Program> {
    let (wrt, ys, stop) = differentiate;
    let g = embed::GradArgs { wrt, ys, stop };
    build(py, (path, text), settings, |s, opts| {
        embed::grad(s, opts, &g)
    })
}

/// The IR text after a pass pipeline (see `tcc.opt`).
#[pyfunction]
fn opt(
    py: Python<'_>,
    path: Option<String>,
    text: Option<Given>,
    passes: String,
) -> PyResult<String> {
    let out = py.detach(|| with_source(path, text, |s| embed::opt(s, &passes)))?;
    out.map_err(|e| driver_error(py, e))
}

/// A named numpy array from the Python side, with its tcc dtype's name and its dims.
type Array<'py> = (String, String, Vec<u64>, Bound<'py, PyAny>);

/// Copies of the arrays, by name.
fn tensors(py: Python<'_>, what: &str, arrays: Vec<Array>) -> PyResult<BTreeMap<String, Tensor>> {
    let mut out = BTreeMap::new();
    for (name, dtype, dims, a) in arrays {
        let bad = |e: String| input_error(py, &format!("{what} `{name}`: {e}"));
        let dtype = DType::from_name(&dtype).ok_or_else(|| bad(format!("no dtype `{dtype}`")))?;
        let ty = TensorType::new(dtype, dims).map_err(|e| bad(e.to_string()))?;
        let tensor = view_of(&a, &ty).map_err(bad)?.to_tensor();
        out.insert(name, tensor);
    }
    Ok(out)
}

/// A pointer moved into the closure that runs without the interpreter lock.
struct SendPtr(*mut u8);
// SAFETY: it addresses an output array only the running thread writes during the call.
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

/// Trains (see `tcc.train`): `arrays` are the data and initial values, `how` (steps, optimizer,
/// learning rate, remat options, log interval); returns the losses, and the trained values as
/// (name, dtype, dims, bytes).
#[pyfunction]
#[allow(clippy::type_complexity)]
fn train<'py>(
    py: Python<'py>,
    path: Option<String>,
    text: Option<Given>,
    arrays: (Vec<Array<'py>>, Vec<Array<'py>>),
    how: (usize, String, f64, Option<String>, usize),
    settings: Settings,
) -> PyResult<(
    Vec<f64>,
    Vec<(String, &'static str, Vec<u64>, Bound<'py, PyBytes>)>,
)> {
    let (data, init) = (
        tensors(py, "data", arrays.0)?,
        tensors(py, "init", arrays.1)?,
    );
    let (steps, optimizer, lr, remat, every) = how;
    let (opts, _) = options(settings);
    let t = embed::TrainOptions {
        steps,
        data: &data,
        init: &init,
        optimizer: &optimizer,
        lr,
        remat: remat.as_deref(),
        every,
    };
    let trained = py.detach(|| with_source(path, text, |s| embed::train(s, &opts, &t)))?;
    let trained = trained.map_err(|e| driver_error(py, e))?;
    let values = (trained.values.iter())
        .map(|(name, t)| {
            let bytes = PyBytes::new(py, t.view().bytes());
            (name.clone(), t.dtype().name(), t.dims().to_vec(), bytes)
        })
        .collect();
    Ok((trained.losses, values))
}

/// The CPU features tcc's kernels use on `target` (the host's, less those the spec turns off).
#[pyfunction]
#[pyo3(signature = (target=None))]
fn cpu_features(py: Python<'_>, target: Option<String>) -> PyResult<Vec<&'static str>> {
    let cpu = tcc_codegen::Cpu {
        target,
        ..tcc_codegen::Cpu::default()
    };
    let features = cpu.features().map_err(|e| raise(py, "UsageError", &e))?;
    Ok(features.names())
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Program>()?;
    m.add_function(wrap_pyfunction!(compile, m)?)?;
    m.add_function(wrap_pyfunction!(grad, m)?)?;
    m.add_function(wrap_pyfunction!(opt, m)?)?;
    m.add_function(wrap_pyfunction!(train, m)?)?;
    m.add_function(wrap_pyfunction!(cpu_features, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

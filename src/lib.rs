//! tcc, a tensor compiler.
//!
//! This facade re-exports the IR ([`ir`]), the ONNX frontend ([`onnx`]), the passes ([`passes`])
//! and code generation ([`codegen`]), and is the embedding API: compile a function once, from IR text or from a
//! function built in Rust, then run it on tensors as often as you like, from any thread.
//!
//! ```
//! use tcc::{Program, Tensor};
//!
//! let program = Program::from_text(
//!     "func @scale(%x: f32[4], %s: f32[]) -> (f32[4]) {
//!        %y = mul %x, %s : f32[4]
//!        %z = relu %y : f32[4]
//!        return %z
//!      }",
//! )
//! .unwrap();
//! let x = Tensor::from_f32(&[4], vec![1.0, -2.0, 3.0, -4.0]).unwrap(); // from a Vec
//! let s = Tensor::from_f32(&[], &[0.5][..]).unwrap(); // or a slice
//! let out = program.run(&[x, s]).unwrap();
//! assert_eq!(out[0].as_f32().unwrap(), &[0.5, 0.0, 1.5, 0.0]);
//! ```
//!
//! Passes run as a textual pipeline before compiling:
//!
//! ```
//! use tcc::ir::{parse_module, verify_module};
//! use tcc::passes::{PassManager, Pipeline};
//!
//! let mut m = parse_module(
//!     "func @f(%x: f32[4]) -> (f32[4]) {
//!        %one = const {value=1.0} : f32[]
//!        %y = mul %x, %one : f32[4]
//!        %z = relu %y : f32[4]
//!        return %z
//!      }",
//! )
//! .unwrap();
//! verify_module(&m).unwrap();
//! let pm = PassManager::new(Pipeline::parse("canonicalize,cse,dce").unwrap());
//! pm.run(&mut m, &mut std::io::sink()).unwrap();
//! assert_eq!(m.num_ops(), 1); // only the relu is left
//! ```

#![deny(missing_docs)]

pub use tcc_codegen as codegen;
pub use tcc_ir as ir;
pub use tcc_onnx as onnx;
pub use tcc_passes as passes;

pub use tcc_ir::{DType, Data, Tensor, TensorType};

use std::fmt;

/// Why a program could not be built or run.
#[derive(Debug)]
pub enum Error {
    /// The IR text has errors (rendered with `line:col`), or the ONNX model could not be
    /// imported.
    Parse(String),
    /// The text holds no function, or more than one and none was chosen.
    NoFunction(String),
    /// The function does not verify, or could not be compiled.
    Compile(String),
    /// The inputs do not fit the parameters, or an op failed at run time.
    Run(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Parse(m) | Error::NoFunction(m) | Error::Compile(m) | Error::Run(m) => {
                f.write_str(m)
            }
        }
    }
}

impl std::error::Error for Error {}

/// Where a [`Program`] runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Device {
    /// The CPU backend.
    #[default]
    Cpu,
    /// NVIDIA GPU `N` through the PTX backend: needs tcc built with the `cuda` feature (the
    /// driver is loaded at run time; without one, compiling is an error saying so).
    Cuda(usize),
}

/// A compiled function, ready to run. `Send + Sync`: share it between threads with an `Arc`.
pub struct Program {
    func: ir::Function,
    exe: Exe,
}

// Programs are shared between threads (the CUDA runtime's too).
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Program>();
};

/// What a program runs as.
enum Exe {
    Cpu(Box<codegen::Executable>),
    #[cfg(feature = "cuda")]
    Cuda(Box<codegen::ptx::cuda::Loaded>),
}

impl Program {
    /// Compiles the only function in `text` (IR text format, see docs/ir.md).
    pub fn from_text(text: &str) -> Result<Program, Error> {
        let m = ir::parse_module(text).map_err(|d| Error::Parse(d.render("<text>", text)))?;
        match m.functions.as_slice() {
            [f] => Program::from_function(f),
            fs => Err(Error::NoFunction(format!(
                "expected one function in the text, found {}; use Program::from_function",
                fs.len()
            ))),
        }
    }

    /// Imports an ONNX model file, optimizes it with the inference pipeline
    /// ([`passes::INFERENCE_PIPELINE`]: constant folding, batch-norm folding, CSE, DCE) and
    /// compiles it (`opts` binds dynamic input dimensions).
    pub fn from_onnx(path: &std::path::Path, opts: &onnx::Options) -> Result<Program, Error> {
        let mut m = onnx::import_file(path, opts).map_err(|e| Error::Parse(e.to_string()))?;
        let pipeline = passes::Pipeline::parse(passes::INFERENCE_PIPELINE)
            .expect("the inference pipeline parses");
        passes::PassManager::new(pipeline)
            .run(&mut m, &mut std::io::sink())
            .map_err(|e| Error::Compile(e.to_string()))?;
        Program::from_function(&m.functions[0])
    }

    /// Compiles a function built in Rust (see [`ir::FunctionBuilder`]) or parsed earlier.
    pub fn from_function(f: &ir::Function) -> Result<Program, Error> {
        Program::from_function_on(f, Device::Cpu)
    }

    /// Compiles a function for `device`.
    pub fn from_function_on(f: &ir::Function, device: Device) -> Result<Program, Error> {
        let exe = match device {
            Device::Cpu => Exe::Cpu(Box::new(
                codegen::Executable::compile(f).map_err(|e| Error::Compile(e.to_string()))?,
            )),
            #[cfg(feature = "cuda")]
            Device::Cuda(n) => {
                let err = |e: codegen::RunError| Error::Compile(e.0);
                let gpu = codegen::ptx::cuda::Gpu::new(n).map_err(err)?;
                let backend = gpu.backend().map_err(err)?;
                let m = codegen::compile(&backend, f).map_err(|e| Error::Compile(e.0))?;
                Exe::Cuda(Box::new(gpu.load(m).map_err(err)?))
            }
            #[cfg(not(feature = "cuda"))]
            Device::Cuda(_) => {
                return Err(Error::Compile(
                    "this build of tcc has no CUDA runtime: build it with `--features cuda`".into(),
                ));
            }
        };
        Ok(Program {
            func: f.clone(),
            exe,
        })
    }

    /// The function's parameter types, in order.
    pub fn inputs(&self) -> Vec<TensorType> {
        let f = &self.func;
        f.params().iter().map(|&p| f.ty(p).clone()).collect()
    }

    /// Runs on `inputs` (one per parameter, of its type) and returns the results.
    pub fn run(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>, Error> {
        match &self.exe {
            Exe::Cpu(e) => e.run(inputs),
            #[cfg(feature = "cuda")]
            Exe::Cuda(l) => l.run(inputs),
        }
        .map_err(|e| Error::Run(e.to_string()))
    }
}

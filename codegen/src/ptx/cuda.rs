//! Running a PTX [`Module`] on an NVIDIA GPU (`--features cuda`): the CUDA driver, loaded at
//! run time through cudarc, so that building needs no CUDA and a machine without a driver gets
//! an error, not a crash. One stream: the inputs uploaded, the arena and output buffers
//! allocated, every launch of the manifest in order, the results downloaded.

use super::{Module, Place, Ptx};
use crate::backend::{Profile, RunError};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PinnedHostSlice,
    PushKernelArg, result,
};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tcc_ir::{Tensor, Value};

/// A GPU and the stream modules run on.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
}

fn driver(e: impl std::fmt::Debug) -> RunError {
    RunError(format!("CUDA driver error: {e:?}"))
}

impl Gpu {
    /// GPU `ordinal`, or why there is none: no driver library (`libcuda.so`), no such device.
    pub fn new(ordinal: usize) -> Result<Gpu, RunError> {
        // SAFETY: only tries to open the driver library.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(RunError(
                "no CUDA driver: libcuda.so was not found (is an NVIDIA driver installed?)".into(),
            ));
        }
        let count = CudaContext::device_count().map_err(driver)?;
        if ordinal as i64 >= count as i64 {
            return Err(RunError(format!(
                "no CUDA device {ordinal}: the driver sees {count}"
            )));
        }
        let ctx = CudaContext::new(ordinal).map_err(driver)?;
        let stream = ctx.default_stream();
        Ok(Gpu { ctx, stream })
    }

    /// The device's architecture, as PTX targets name it (80 for sm_80).
    pub fn sm(&self) -> Result<u32, RunError> {
        let (major, minor) = self.ctx.compute_capability().map_err(driver)?;
        Ok((major * 10 + minor) as u32)
    }

    /// The device's name.
    pub fn name(&self) -> String {
        self.ctx.name().unwrap_or_else(|_| "an NVIDIA GPU".into())
    }

    /// The PTX backend for this device: the newest target it runs.
    pub fn backend(&self) -> Result<Ptx, RunError> {
        let sm = self.sm()?;
        let best = (super::ARCHS.iter().copied())
            .filter(|&a| a <= sm)
            .max()
            .ok_or_else(|| {
                RunError(format!(
                    "{} is sm_{sm}: the PTX backend targets sm_80 and newer",
                    self.name()
                ))
            })?;
        Ok(Ptx::new(best))
    }

    /// `m` loaded: its PTX assembled by the driver, its constants uploaded.
    pub fn load(&self, m: Module) -> Result<Loaded, RunError> {
        let module = self
            .ctx
            .load_module(cudarc::nvrtc::Ptx::from_src(m.text()))
            .map_err(driver)?;
        let functions = (m.kernels.iter())
            .map(|k| module.load_function(&k.name).map_err(driver))
            .collect::<Result<Vec<_>, _>>()?;
        let consts = (m.consts.iter())
            .map(|(&v, t)| Ok((v, self.upload(&t.to_le_bytes())?)))
            .collect::<Result<HashMap<_, _>, RunError>>()?;
        Ok(Loaded {
            stream: self.stream.clone(),
            module: m,
            functions,
            consts,
        })
    }

    /// A device buffer holding `bytes` (at least one byte).
    fn upload(&self, bytes: &[u8]) -> Result<CudaSlice<u8>, RunError> {
        if bytes.is_empty() {
            return self.stream.alloc_zeros::<u8>(1).map_err(driver);
        }
        self.stream.clone_htod(bytes).map_err(driver)
    }
}

/// A module on a GPU, ready to run many times.
pub struct Loaded {
    stream: Arc<CudaStream>,
    module: Module,
    functions: Vec<CudaFunction>,
    consts: HashMap<Value, CudaSlice<u8>>,
}

/// A run's buffers: the arena, the inputs and the output buffers on the device, and the host
/// pool swapped-out values live in (page-locked, so copies to and from it are asynchronous on
/// the stream), with its address.
struct Buffers {
    arena: CudaSlice<u8>,
    params: Vec<CudaSlice<u8>>,
    outputs: Vec<CudaSlice<u8>>,
    host: Option<(PinnedHostSlice<u8>, *mut u8)>,
}

impl Loaded {
    /// Uploads `inputs` (checked against the parameters) and allocates the arena and outputs.
    fn buffers(&self, inputs: &[Tensor]) -> Result<Buffers, RunError> {
        let m = &self.module;
        let f = &m.func;
        tcc_ir::interp::check_inputs(f, inputs).map_err(|e| RunError(e.0))?;
        let s = &self.stream;
        let zeros = |n: u64| s.alloc_zeros::<u8>(n.max(1) as usize).map_err(driver);
        let params = (inputs.iter())
            .map(|t| {
                let b = t.to_le_bytes();
                if b.is_empty() {
                    zeros(1)
                } else {
                    s.clone_htod(&b).map_err(driver)
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        let host = match m.mem.host_bytes {
            0 => None,
            n => {
                let n = usize::try_from(n).map_err(|_| RunError("host pool too large".into()))?;
                // SAFETY: a plain allocation of page-locked bytes, used only through the
                // pointer below while the buffers live.
                let mut h = unsafe { s.context().alloc_pinned::<u8>(n) }.map_err(driver)?;
                let p = h.as_mut_ptr().map_err(driver)?;
                Some((h, p))
            }
        };
        Ok(Buffers {
            host,
            arena: zeros(m.mem.arena_bytes)?,
            params,
            outputs: (m.mem.outputs.iter())
                .map(|&v| zeros(f.ty(v).size_bytes()))
                .collect::<Result<Vec<_>, _>>()?,
        })
    }

    /// Queues every launch of the manifest on the stream, over `b`.
    fn launch(&self, b: &Buffers) -> Result<(), RunError> {
        self.launch_marked(b, &mut |_| Ok(()))
    }

    /// [`Loaded::launch`], calling `mark` with each launch's index before it is queued.
    fn launch_marked(
        &self,
        b: &Buffers,
        mark: &mut dyn FnMut(usize) -> Result<(), RunError>,
    ) -> Result<(), RunError> {
        let (m, s) = (&self.module, &self.stream);
        let ptr = |x: &CudaSlice<u8>| x.device_ptr(s).0;
        let addr = |v: Value| -> Result<u64, RunError> {
            Ok(match m.place(v)? {
                Place::Arena(off) => ptr(&b.arena) + off,
                Place::Output(i) => ptr(&b.outputs[i]),
                Place::Param(i) => ptr(&b.params[i]),
                Place::Const(c) => ptr(&self.consts[&c]),
                Place::Host(_) => return Err(RunError("host memory has no device address".into())),
            })
        };
        for (i, l) in m.launches.iter().enumerate() {
            mark(i)?;
            let Some(kernel) = l.kernel else {
                self.copy(b, l.args[0], l.args[1], &addr)?;
                continue;
            };
            let mut args = (l.args.iter())
                .map(|&v| addr(v))
                .collect::<Result<Vec<u64>, _>>()?;
            args.extend(l.scratch.map(|off| ptr(&b.arena) + off));
            let mut builder = s.launch_builder(&self.functions[kernel]);
            for a in &args {
                builder.arg(a);
            }
            let cfg = LaunchConfig {
                grid_dim: (l.grid, 1, 1),
                block_dim: (l.block, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: each kernel takes exactly these 64-bit addresses, of buffers the memory
            // plan sized for what it reads and writes, alive until the stream synchronises.
            unsafe { builder.launch(cfg) }.map_err(driver)?;
        }
        Ok(())
    }

    /// Queues the copy of `src`'s bytes to `dst`, one of them in the host pool (a swap).
    fn copy(
        &self,
        b: &Buffers,
        src: Value,
        dst: Value,
        addr: &dyn Fn(Value) -> Result<u64, RunError>,
    ) -> Result<(), RunError> {
        let m = &self.module;
        let n = m.func.ty(dst).size_bytes() as usize;
        let host = |off: u64| match &b.host {
            // SAFETY: the memory plan keeps `off + n` inside the host pool.
            Some((_, p)) => Ok(unsafe { p.add(off as usize) }),
            None => Err(RunError("a swap without a host pool".into())),
        };
        let stream = self.stream.cu_stream();
        // SAFETY (both copies): the host pool and the device buffers outlive the stream's work
        // (every run synchronises before its buffers drop), and both ranges hold `n` bytes.
        match (m.place(src)?, m.place(dst)?) {
            (Place::Host(off), _) => {
                let from = unsafe { std::slice::from_raw_parts(host(off)?, n) };
                unsafe { result::memcpy_htod_async(addr(dst)?, from, stream) }.map_err(driver)
            }
            (_, Place::Host(off)) => {
                let to = unsafe { std::slice::from_raw_parts_mut(host(off)?, n) };
                unsafe { result::memcpy_dtoh_async(to, addr(src)?, stream) }.map_err(driver)
            }
            _ => Err(RunError(format!(
                "a copy of %{} to %{} with neither in host memory",
                m.func.name(src),
                m.func.name(dst)
            ))),
        }
    }

    /// Runs the module on `inputs` (one per parameter, of its type) and returns the results.
    pub fn run(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>, RunError> {
        let (m, s) = (&self.module, &self.stream);
        let f = &m.func;
        let b = self.buffers(inputs)?;
        self.launch(&b)?;
        let results = (f.results().iter())
            .map(|&r| {
                let ty = f.ty(r);
                let n = ty.size_bytes() as usize;
                let bytes = match m.place(r)? {
                    // Only the result's bytes of the arena, not the whole arena.
                    Place::Arena(off) => {
                        let at = off as usize;
                        s.clone_dtoh(&b.arena.slice(at..at + n)).map_err(driver)?
                    }
                    Place::Output(i) => s.clone_dtoh(&b.outputs[i]).map_err(driver)?,
                    Place::Param(i) => inputs[i].to_le_bytes(),
                    Place::Const(c) => m.consts[&c].to_le_bytes(),
                    Place::Host(_) => {
                        return Err(RunError(format!("result %{} is in host memory", f.name(r))));
                    }
                };
                Tensor::from_le_bytes(ty, &bytes[..n]).map_err(|e| RunError(e.0))
            })
            .collect::<Result<Vec<_>, _>>()?;
        s.synchronize().map_err(driver)?;
        Ok(results)
    }

    /// Seconds the device takes for one run's launches (the inputs uploaded once and not
    /// counted), the mean of `runs` after one warm-up, timed by CUDA events on the stream.
    pub fn time(&self, inputs: &[Tensor], runs: usize) -> Result<f64, RunError> {
        let s = &self.stream;
        let b = self.buffers(inputs)?;
        self.launch(&b)?;
        let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = s.record_event(timing).map_err(driver)?;
        for _ in 0..runs.max(1) {
            self.launch(&b)?;
        }
        let end = s.record_event(timing).map_err(driver)?;
        end.synchronize().map_err(driver)?;
        let ms = start.elapsed_ms(&end).map_err(driver)?;
        Ok(ms as f64 / 1e3 / runs.max(1) as f64)
    }
}

impl Loaded {
    /// Where a run's device time goes: each launch's time over `runs` runs after a warm-up,
    /// timed by CUDA events recorded between the launches (which add a little time of their
    /// own; [`Loaded::time`] is the figure for the whole run), described by its kernel's name
    /// and what it computes.
    pub fn profile(&self, inputs: &[Tensor], runs: u32) -> Result<Profile, RunError> {
        let (m, s) = (&self.module, &self.stream);
        let b = self.buffers(inputs)?;
        self.launch(&b)?;
        let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let mut total = vec![0.0f64; m.launches.len()];
        for _ in 0..runs.max(1) {
            let mut events = Vec::with_capacity(m.launches.len() + 1);
            self.launch_marked(&b, &mut |_| {
                events.push(s.record_event(timing).map_err(driver)?);
                Ok(())
            })?;
            events.push(s.record_event(timing).map_err(driver)?);
            events
                .last()
                .expect("an event")
                .synchronize()
                .map_err(driver)?;
            for (i, pair) in events.windows(2).enumerate() {
                total[i] += f64::from(pair[0].elapsed_ms(&pair[1]).map_err(driver)?) / 1e3;
            }
        }
        let mut steps: Vec<(Duration, String)> = (m.launches.iter().zip(total))
            .map(|(l, t)| {
                let name = l.kernel.map_or("copy", |k| &m.kernels[k].name);
                (Duration::from_secs_f64(t), format!("{name:<12} {}", l.what))
            })
            .collect();
        steps.sort_by_key(|&(t, _)| std::cmp::Reverse(t));
        Ok(Profile {
            function: m.func.name.clone(),
            runs: runs.max(1),
            steps,
        })
    }
}

/// Seconds cuBLAS takes for an `m x k` by `k x n` f32 product on `gpu` (row-major operands,
/// as `C^T = B^T A^T` in cuBLAS's column-major terms), the mean of `runs` after a warm-up: the
/// peer the tiled kernel is measured against.
pub fn cublas_sgemm_seconds(
    gpu: &Gpu,
    m: usize,
    n: usize,
    k: usize,
    runs: usize,
) -> Result<f64, RunError> {
    use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, sys::cublasOperation_t};
    let s = &gpu.stream;
    let blas = CudaBlas::new(s.clone()).map_err(driver)?;
    let a = s.alloc_zeros::<f32>(m * k).map_err(driver)?;
    let b = s.alloc_zeros::<f32>(k * n).map_err(driver)?;
    let mut c = s.alloc_zeros::<f32>(m * n).map_err(driver)?;
    let cfg = GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_N,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m: n as i32,
        n: m as i32,
        k: k as i32,
        alpha: 1.0f32,
        lda: n as i32,
        ldb: k as i32,
        beta: 0.0f32,
        ldc: n as i32,
    };
    // SAFETY: the buffers hold the operands' sizes for this configuration.
    let gemm = |c: &mut CudaSlice<f32>| unsafe { blas.gemm(cfg, &b, &a, c) }.map_err(driver);
    gemm(&mut c)?;
    let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let start = s.record_event(timing).map_err(driver)?;
    for _ in 0..runs.max(1) {
        gemm(&mut c)?;
    }
    let end = s.record_event(timing).map_err(driver)?;
    end.synchronize().map_err(driver)?;
    let ms = start.elapsed_ms(&end).map_err(driver)?;
    Ok(ms as f64 / 1e3 / runs.max(1) as f64)
}

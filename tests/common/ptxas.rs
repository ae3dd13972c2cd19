//! `ptxas` for the tests that assemble PTX (codegen's and the ONNX models'): the
//! `nvidia-cuda-nvcc-cu12` wheel's, installed into `target/ptx-venv` on first use, or the
//! binary `TCC_PTXAS` names. Included by path, so it uses nothing but std.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The `ptxas` binary, installing the wheel under `root/target` on first use.
pub fn ptxas(root: &Path) -> &'static Path {
    static PTXAS: OnceLock<PathBuf> = OnceLock::new();
    PTXAS.get_or_init(|| {
        if let Ok(p) = std::env::var("TCC_PTXAS") {
            return PathBuf::from(p);
        }
        let venv = root.join("target/ptx-venv");
        let find = || -> Option<PathBuf> {
            std::fs::read_dir(venv.join("lib"))
                .ok()?
                .flatten()
                .find_map(|e| {
                    let p = e.path().join("site-packages/nvidia/cuda_nvcc/bin/ptxas");
                    p.is_file().then_some(p)
                })
        };
        if let Some(p) = find() {
            return p;
        }
        let run = |cmd: &mut std::process::Command| {
            let st = cmd.status().expect("runs");
            assert!(st.success(), "{cmd:?} failed");
        };
        if !venv.join("bin/python").exists() {
            run(std::process::Command::new("python3")
                .args(["-m", "venv"])
                .arg(&venv));
        }
        run(std::process::Command::new(venv.join("bin/python")).args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "nvidia-cuda-nvcc-cu12",
        ]));
        find().expect("the nvidia-cuda-nvcc-cu12 wheel ships ptxas")
    })
}

/// Assembles the module at `path` for `sm_{sm}` with `ptxas -v`: its log, or why it failed
/// (an error, or a kernel that spills registers).
pub fn assemble(root: &Path, path: &Path, sm: u32) -> Result<String, String> {
    let out = std::process::Command::new(ptxas(root))
        .args(["-v", "--gpu-name", &format!("sm_{sm}"), "-o"])
        .arg(path.with_extension("cubin"))
        .arg(path)
        .output()
        .map_err(|e| format!("ptxas does not run: {e}"))?;
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() {
        return Err(format!("ptxas failed:\n{log}"));
    }
    let spills: Vec<&str> = (log.lines())
        .filter(|l| l.contains("spill") && !l.contains("0 bytes spill stores, 0 bytes spill loads"))
        .collect();
    if !spills.is_empty() {
        return Err(format!("spills: {spills:?}"));
    }
    if !log.contains("Used") {
        return Err(format!("ptxas -v reported nothing:\n{log}"));
    }
    Ok(log)
}

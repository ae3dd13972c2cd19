//! A module's stored parameter values on disk: the directory a `weights "DIR"` line names.
//!
//! The directory holds one `.npy` file per stored parameter, named as `tcc train --init/--save`
//! name theirs ([`crate::train::file_stem`]: characters outside `[A-Za-z0-9_.-]` become `_`),
//! so a weights directory is also a valid `--init` directory and numpy reads every file. Two
//! names that map to the same file are refused when writing; every file read must belong to a
//! parameter of the module, so a directory cannot silently feed the wrong model.

use crate::npy;
use crate::train::file_stem;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tcc_ir::{Module, Tensor, TensorType};

/// The weights directory written beside IR file `path`: `model.tir` -> `model.weights`.
pub fn dir_beside(path: &Path) -> PathBuf {
    path.with_extension("weights")
}

/// Writes `values` into `dir` (created if needed; `.npy` files already there are removed first,
/// so the directory holds exactly these values).
pub fn write(dir: &Path, values: &BTreeMap<String, Arc<Tensor>>) -> Result<(), String> {
    let mut files: HashMap<String, &str> = HashMap::new();
    for name in values.keys() {
        if let Some(other) = files.insert(file_stem(name), name) {
            return Err(format!(
                "error: parameters `{other}` and `{name}` would both be stored as `{}.npy`; rename one",
                file_stem(name)
            ));
        }
    }
    let shown = dir.display();
    std::fs::create_dir_all(dir).map_err(|e| format!("error: cannot create `{shown}`: {e}"))?;
    let old = std::fs::read_dir(dir).map_err(|e| format!("error: cannot read `{shown}`: {e}"))?;
    for entry in old.flatten() {
        let p = entry.path();
        if p.extension().is_some_and(|e| e == "npy") {
            std::fs::remove_file(&p)
                .map_err(|e| format!("error: cannot remove `{}`: {e}", p.display()))?;
        }
    }
    for (name, t) in values {
        let path = dir.join(format!("{}.npy", file_stem(name)));
        std::fs::write(&path, npy::write(t))
            .map_err(|e| format!("error: cannot write `{}`: {e}", path.display()))?;
    }
    Ok(())
}

/// Reads the values stored in `dir` for the parameters of `m`, checking each file's type
/// against the parameter's. `line` names the reference in errors (`FILE: weights "DIR"`).
pub fn read(dir: &Path, m: &Module, line: &str) -> Result<BTreeMap<String, Arc<Tensor>>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| {
        format!(
            "error: {line}: cannot read the weights directory `{}`: {e}\nnote: it holds the model's parameter values and is written beside the IR by `tcc import --params` and `tcc grad -o`; copy it with the .tir file",
            dir.display()
        )
    })?;
    // Every parameter by the file it would be stored in, with its type.
    let mut params: HashMap<String, (&str, &TensorType)> = HashMap::new();
    for f in &m.functions {
        for &p in f.params() {
            params.insert(file_stem(f.name(p)), (f.name(p), f.ty(p)));
        }
    }
    let mut values = BTreeMap::new();
    let mut paths: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "npy"))
        .collect();
    paths.sort();
    for path in paths {
        let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
        let Some(&(name, ty)) = params.get(stem) else {
            return Err(format!(
                "error: {line}: `{}` is not the value of any parameter of this module; is the directory from another model?",
                path.display()
            ));
        };
        let bytes = std::fs::read(&path)
            .map_err(|e| format!("error: cannot read `{}`: {e}", path.display()))?;
        let t = npy::read(&bytes).map_err(|e| format!("error: `{}`: {e}", path.display()))?;
        if t.ty() != ty {
            return Err(format!(
                "error: {line}: `{}` holds {}, but parameter `{name}` is {ty}",
                path.display(),
                t.ty()
            ));
        }
        values.insert(name.to_string(), Arc::new(t));
    }
    Ok(values)
}

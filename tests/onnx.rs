//! ONNX conformance: the backend node test cases and the `light` model zoo models of the `onnx`
//! Python package, imported by tcc, compiled by the JIT and compared with their expected outputs.
//!
//! The cases ship inside the `onnx==1.22.0` wheel (`onnx/backend/test/data/`); the first run
//! installs it into `target/onnx-venv` (or set `TCC_ONNX_DATA` to a `data/` folder). Every case is
//! counted: passed, failed (a wrong result, or an error on a valid model) or unsupported (the
//! importer says the model uses an op, attribute value or element type tcc does not have). The
//! test fails on any failure, and on any case whose status differs from
//! `tests/onnx/node_status.txt` (`converted_status.txt` for the older suites); `TCC_BLESS=1`
//! rewrites those files. It also writes the per-op table
//! for docs/onnx.md to `target/onnx-node-table.md`.

#[path = "common/ptxas.rs"]
mod ptxas;

use rayon::prelude::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use tcc::ir::{Data, Tensor};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const ONNX_VERSION: &str = "1.22.0";

/// Default tolerances: |got - want| <= ATOL + RTOL * |want|.
const RTOL: f64 = 1e-3;
const ATOL: f64 = 1e-5;

/// The `onnx/backend/test/data` folder, installing the wheel on first use.
fn data_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        if let Ok(d) = std::env::var("TCC_ONNX_DATA") {
            return PathBuf::from(d);
        }
        let venv = Path::new(ROOT).join("target/onnx-venv");
        let python = venv.join("bin/python");
        let find = || -> Option<PathBuf> {
            let lib = venv.join("lib");
            std::fs::read_dir(&lib).ok()?.flatten().find_map(|e| {
                let d = e.path().join("site-packages/onnx/backend/test/data");
                d.join("node").is_dir().then_some(d)
            })
        };
        if let Some(d) = find() {
            return d;
        }
        let run = |cmd: &mut std::process::Command| {
            let st = cmd.status().expect("runs");
            assert!(st.success(), "{cmd:?} failed");
        };
        if !python.exists() {
            run(std::process::Command::new("python3")
                .args(["-m", "venv"])
                .arg(&venv));
        }
        run(std::process::Command::new(&python).args([
            "-m",
            "pip",
            "install",
            "--quiet",
            &format!("onnx=={ONNX_VERSION}"),
        ]));
        find().expect("the onnx wheel ships backend/test/data")
    })
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Status {
    Passed,
    Failed(String),
    Unsupported(String),
}

impl Status {
    fn word(&self) -> &'static str {
        match self {
            Status::Passed => "pass",
            Status::Failed(_) => "FAIL",
            Status::Unsupported(_) => "unsupported",
        }
    }
}

fn read_pb(path: &Path) -> Result<Tensor, Status> {
    let bytes =
        std::fs::read(path).map_err(|e| Status::Failed(format!("{}: {e}", path.display())))?;
    tcc::onnx::read_tensor(&bytes).map_err(|e| {
        let msg = format!("{}: {e}", path.file_name().unwrap().to_string_lossy());
        if e.is_unsupported() {
            Status::Unsupported(msg)
        } else {
            Status::Failed(msg)
        }
    })
}

/// `input_0.pb`, `input_1.pb`, ... (or `output_*`) in numeric order.
fn numbered(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut v: Vec<(usize, PathBuf)> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let n = name
                        .strip_prefix(prefix)?
                        .strip_suffix(".pb")?
                        .parse()
                        .ok()?;
                    Some((n, e.path()))
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v.into_iter().map(|p| p.1).collect()
}

/// Compares elementwise: shapes and dtypes equal, floats within tolerance (NaN matches NaN),
/// integers and booleans exact.
fn compare(got: &Tensor, want: &Tensor, rtol: f64, atol: f64) -> Result<(), String> {
    if got.ty() != want.ty() {
        return Err(format!("got {}, expected {}", got.ty(), want.ty()));
    }
    let close = |i: usize, g: f64, w: f64| -> Result<(), String> {
        let ok = (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= atol + rtol * w.abs();
        if ok {
            Ok(())
        } else {
            Err(format!("element {i}: got {g}, expected {w}"))
        }
    };
    match (got.data(), want.data()) {
        (Data::F32(g), Data::F32(w)) => g
            .iter()
            .zip(w)
            .enumerate()
            .try_for_each(|(i, (&g, &w))| close(i, g as f64, w as f64)),
        (Data::F64(g), Data::F64(w)) => g
            .iter()
            .zip(w)
            .enumerate()
            .try_for_each(|(i, (&g, &w))| close(i, g, w)),
        (g, w) => match (0..g.len()).find(|&i| g.get(i).to_f64() != w.get(i).to_f64()) {
            None => Ok(()),
            Some(i) => Err(format!(
                "element {i}: got {}, expected {}",
                g.get(i).to_f64(),
                w.get(i).to_f64()
            )),
        },
    }
}

/// Imports `model`, binding graph inputs that decide shapes to their values in `inputs` (as a
/// user would with `--const`); returns the module and the inputs still to feed.
fn import(model: &Path, inputs: &[Tensor]) -> Result<(tcc::ir::Module, Vec<Tensor>), Status> {
    let bytes = std::fs::read(model).map_err(|e| Status::Failed(e.to_string()))?;
    let proto = tcc::onnx::read_model(&bytes).map_err(|e| Status::Failed(e.to_string()))?;
    let g = proto.graph.unwrap_or_default();
    let inits: Vec<&str> = g
        .initializer
        .iter()
        .filter_map(|t| t.name.as_deref())
        .collect();
    let names: Vec<String> = g
        .input
        .iter()
        .filter_map(|vi| vi.name.clone())
        .filter(|n| !inits.contains(&n.as_str()))
        .collect();
    // Every input's shape is bound to its test value's, as a user would with `--shape` (it must
    // agree with the model's static dims; the dynamic ones need it).
    let mut opts = tcc::onnx::Options {
        dir: model.parent().map(Path::to_path_buf),
        shapes: names
            .iter()
            .zip(inputs)
            .map(|(n, t)| (n.clone(), t.dims().to_vec()))
            .collect(),
        ..Default::default()
    };
    loop {
        match tcc::onnx::import(&bytes, &opts) {
            Ok(m) => {
                let rest = names
                    .iter()
                    .zip(inputs)
                    .filter(|(n, _)| !opts.constants.iter().any(|c| &c.0 == *n))
                    .map(|(_, t)| t.clone())
                    .collect();
                return Ok((m, rest));
            }
            Err(e) => {
                let bind = e.constant_needed().and_then(|n| {
                    let i = names.iter().position(|x| x == n)?;
                    Some((n.to_string(), inputs.get(i)?.clone()))
                });
                match bind {
                    Some(b) if !opts.constants.iter().any(|c| c.0 == b.0) => {
                        opts.shapes.retain(|s| s.0 != b.0);
                        opts.constants.push(b)
                    }
                    _ if e.is_unsupported() => return Err(Status::Unsupported(e.message().into())),
                    _ => return Err(Status::Failed(format!("import: {e}"))),
                }
            }
        }
    }
}

/// Imports, compiles and runs `model` on `inputs`, comparing with `outputs`.
fn check(model: &Path, inputs: &[Tensor], outputs: &[Tensor], rtol: f64, atol: f64) -> Status {
    let (m, inputs) = match import(model, inputs) {
        Ok(r) => r,
        Err(s) => return s,
    };
    let f = &m.functions[0];
    if f.params().len() != inputs.len() {
        return Status::Failed(format!(
            "{} parameters for {} inputs",
            f.params().len(),
            inputs.len()
        ));
    }
    let exe = match tcc::codegen::Executable::compile(f) {
        Ok(e) => e,
        Err(e) => return Status::Failed(format!("compile: {e}")),
    };
    let got = match exe.run(&inputs) {
        Ok(r) => r,
        Err(e) => return Status::Failed(format!("run: {e}")),
    };
    if got.len() != outputs.len() {
        return Status::Failed(format!(
            "{} results for {} outputs",
            got.len(),
            outputs.len()
        ));
    }
    for (i, (g, w)) in got.iter().zip(outputs).enumerate() {
        if let Err(e) = compare(g, w, rtol, atol) {
            return Status::Failed(format!("output {i}: {e}"));
        }
    }
    Status::Passed
}

fn run_case(dir: &Path) -> Status {
    let data = dir.join("test_data_set_0");
    let read = |prefix| -> Result<Vec<Tensor>, Status> {
        numbered(&data, prefix).iter().map(|p| read_pb(p)).collect()
    };
    let (inputs, outputs) = match (read("input_"), read("output_")) {
        (Ok(i), Ok(o)) => (i, o),
        (Err(e), _) | (_, Err(e)) => {
            // The model's own error names the unsupported thing best, when there is one.
            let bytes = std::fs::read(dir.join("model.onnx")).unwrap_or_default();
            return match tcc::onnx::import(&bytes, &Default::default()) {
                Err(m) if m.is_unsupported() && m.constant_needed().is_none() => {
                    Status::Unsupported(m.message().to_string())
                }
                _ => e,
            };
        }
    };
    check(&dir.join("model.onnx"), &inputs, &outputs, RTOL, ATOL)
}

/// The op a case tests: its single op type, or the op of the case an `_expanded` case expands.
fn op_of(dir: &Path) -> String {
    let Ok(bytes) = std::fs::read(dir.join("model.onnx")) else {
        return "?".into();
    };
    let Ok(m) = tcc::onnx::read_model(&bytes) else {
        return "?".into();
    };
    let mut ops: Vec<String> = m
        .graph
        .iter()
        .flat_map(|g| &g.node)
        .filter_map(|n| n.op_type.clone())
        .collect();
    ops.dedup();
    if ops.len() == 1 {
        return ops.remove(0);
    }
    let name = dir.file_name().unwrap().to_string_lossy();
    if let Some(i) = name.find("_expanded") {
        return op_of(&dir.with_file_name(&name[..i])) + " (expanded)";
    }
    let mut uniq = ops.clone();
    uniq.sort();
    uniq.dedup();
    uniq.join("+")
}

type Results = Vec<(String, String, Status)>;

/// Runs every case of `data/<suite>` in parallel: (case, op, status).
fn run_suite(suite: &str) -> Results {
    let root = data_dir().join(suite);
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("model.onnx").exists())
        .collect();
    dirs.sort();
    dirs.par_iter()
        .map(|d| {
            let name = d.file_name().unwrap().to_string_lossy().into_owned();
            let status = std::panic::catch_unwind(|| run_case(d))
                .unwrap_or_else(|_| Status::Failed("panicked".into()));
            (name, op_of(d), status)
        })
        .collect()
}

/// Prints the counts and failures, then fails on any failure or any case whose status differs
/// from `tests/onnx/<file>` (rewritten under `TCC_BLESS=1`).
fn check_statuses(what: &str, results: &Results, file: &str) {
    let count = |w: &str| results.iter().filter(|r| r.2.word() == w).count();
    let (passed, failed, unsupported) = (count("pass"), count("FAIL"), count("unsupported"));
    println!("{what}: {passed} passed, {failed} failed, {unsupported} unsupported");
    for (name, _, s) in results {
        if let Status::Failed(why) = s {
            println!("FAIL {name}: {why}");
        }
    }
    let status_file = Path::new(ROOT).join("tests/onnx").join(file);
    let mut actual = format!(
        "# Status of every case of the {what} (onnx 1.22.0); written by `TCC_BLESS=1 cargo test --test onnx`.\n"
    );
    for (name, _, s) in results {
        actual += &match s {
            Status::Unsupported(why) => format!("{name} unsupported: {}\n", why.replace('\n', " ")),
            s => format!("{name} {}\n", s.word()),
        };
    }
    if std::env::var_os("TCC_BLESS").is_some() {
        std::fs::write(&status_file, &actual).unwrap();
    }
    let expected = std::fs::read_to_string(&status_file).unwrap_or_default();
    let status_of = |text: &str| -> BTreeMap<String, String> {
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let mut it = l.split_whitespace();
                Some((
                    it.next()?.to_string(),
                    it.next()?.trim_end_matches(':').to_string(),
                ))
            })
            .collect()
    };
    let (want, got) = (status_of(&expected), status_of(&actual));
    let changed: Vec<String> = got
        .iter()
        .filter(|(k, v)| want.get(*k) != Some(v))
        .map(|(k, v)| {
            format!(
                "{k}: {} -> {v}",
                want.get(k).map_or("(new)", |s| s.as_str())
            )
        })
        .chain(
            want.keys()
                .filter(|k| !got.contains_key(*k))
                .map(|k| format!("{k}: missing")),
        )
        .collect();
    assert_eq!(
        failed, 0,
        "{failed} cases of the {what} fail (listed above)"
    );
    assert!(
        changed.is_empty(),
        "{} cases changed status against tests/onnx/{file} (rerun with TCC_BLESS=1 if intended):\n{}",
        changed.len(),
        changed.join("\n")
    );
}

#[test]
fn node_conformance() {
    let results = run_suite("node");
    assert!(results.len() > 1000, "only {} node cases", results.len());

    // The per-op table for docs/onnx.md.
    let mut by_op: BTreeMap<&str, [usize; 3]> = BTreeMap::new();
    for (_, op, s) in &results {
        let e = by_op.entry(op).or_default();
        e[match s {
            Status::Passed => 0,
            Status::Failed(_) => 1,
            Status::Unsupported(_) => 2,
        }] += 1;
    }
    let mut table = String::from("| op | passed | failed | unsupported |\n|---|---:|---:|---:|\n");
    let mut total = [0; 3];
    for (op, counts) in &by_op {
        table += &format!("| {op} | {} | {} | {} |\n", counts[0], counts[1], counts[2]);
        (0..3).for_each(|i| total[i] += counts[i]);
    }
    table += &format!(
        "| **total** | {} | {} | {} |\n",
        total[0], total[1], total[2]
    );
    let _ = std::fs::write(Path::new(ROOT).join("target/onnx-node-table.md"), &table);

    check_statuses("ONNX node tests", &results, "node_status.txt");
}

/// The older suites the wheel ships: models converted from PyTorch (opsets 6 to 9) and small
/// multi-op models.
#[test]
fn converted_models() {
    let mut results = Results::new();
    for suite in ["pytorch-converted", "pytorch-operator", "simple"] {
        results.extend(
            run_suite(suite)
                .into_iter()
                .map(|(n, op, s)| (format!("{suite}/{n}"), op, s)),
        );
    }
    check_statuses(
        "pytorch-converted, pytorch-operator and simple suites",
        &results,
        "converted_status.txt",
    );
}

/// The `light` models compiled for NVIDIA GPUs (after the passes `tcc run` starts with, batch
/// norm folded) and assembled by `ptxas` for sm_80 and sm_90 with no spills: all nine.
#[test]
fn light_models_assemble_for_the_gpu() {
    let light = data_dir().join("light");
    let dir = Path::new(ROOT).join("target/ptx-test");
    std::fs::create_dir_all(&dir).unwrap();
    for (name, _) in LIGHT {
        let m = light_model(&light, name);
        let compiled = tcc::codegen::compile(&tcc::codegen::ptx::Ptx::new(80), &m.functions[0]);
        let module = compiled.unwrap_or_else(|e| panic!("{name}: {e}"));
        for sm in [80, 90] {
            let text = tcc::codegen::ptx::print::module(&module.kernels, sm);
            let file = dir.join(format!("light_{name}_sm{sm}.ptx"));
            std::fs::write(&file, &text).unwrap();
            ptxas::assemble(Path::new(ROOT), &file, sm)
                .unwrap_or_else(|e| panic!("{name}, sm_{sm}: {e}"));
        }
        println!("{name}: {} kernels assemble", module.kernels.len());
    }
}

/// On an NVIDIA GPU (`cargo test --features cuda --test onnx gpu`; it needs a device and fails
/// saying so without one): every light model, compiled as `light_models_assemble_for_the_gpu`
/// does and run on the device, gives the runner's expected output within the runner's
/// tolerances, as `light_models` checks on the CPU.
#[cfg(feature = "cuda")]
#[test]
fn light_models_on_the_gpu() {
    let gpu = tcc::codegen::ptx::cuda::Gpu::new(0)
        .unwrap_or_else(|e| panic!("{e}: this test needs an NVIDIA GPU"));
    let backend = gpu.backend().unwrap();
    let light = data_dir().join("light");
    let mut failures = Vec::new();
    for (name, rtol) in LIGHT {
        let m = light_model(&light, name);
        let f = &m.functions[0];
        let want = read_pb(&light.join(format!("light_{name}_output_0.pb")))
            .unwrap_or_else(|e| panic!("{name}: {e:?}"));
        let got = tcc::codegen::compile(&backend, f)
            .map_err(|e| e.0)
            .and_then(|module| gpu.load(module).map_err(|e| e.0))
            .and_then(|loaded| loaded.run(&light_inputs(f)).map_err(|e| e.0))
            .and_then(|got| compare(&got[0], &want, rtol, 1e-7));
        println!("{name} on {}: {got:?}", gpu.name());
        if let Err(e) = got {
            failures.push(format!("{name}: {e}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The `light` models and the runner's relative tolerance for each.
const LIGHT: [(&str, f64); 9] = [
    ("bvlc_alexnet", 1e-3),
    ("densenet121", 2e-3),
    ("inception_v1", 1e-3),
    ("inception_v2", 1e-3),
    ("resnet50", 1e-3),
    ("shufflenet", 1e-3),
    ("squeezenet", 1e-3),
    ("vgg19", 1e-3),
    ("zfnet512", 1e-3),
];

/// Light model `name` imported and put through the pipeline the GPU tests compile it with.
fn light_model(light: &Path, name: &str) -> tcc::ir::Module {
    let path = light.join(format!("light_{name}.onnx"));
    let mut m = tcc::onnx::import_file(&path, &Default::default())
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let pipeline = tcc::passes::Pipeline::parse("canonicalize,fold-bn,cse,dce").unwrap();
    tcc::passes::PassManager::new(pipeline)
        .run(&mut m, &mut std::io::sink())
        .unwrap();
    m
}

/// A light model's inputs: `arange(n)/n` in each parameter's shape, as the runner feeds them.
fn light_inputs(f: &tcc::ir::Function) -> Vec<Tensor> {
    (f.params().iter())
        .map(|&p| {
            let ty = f.ty(p).clone();
            let n = ty.numel();
            let data: Vec<f32> = (0..n).map(|i| (i as f64 / n as f64) as f32).collect();
            Tensor::new(ty, Data::F32(data)).unwrap()
        })
        .collect()
}

/// The `light` models: each input is `arange(n)/n` in its shape, as the onnx backend test runner
/// feeds them; tolerances are the runner's (rtol 1e-3, densenet121 2e-3; atol 1e-7).
#[test]
fn light_models() {
    let light = data_dir().join("light");
    let mut failures = Vec::new();
    for (name, rtol) in LIGHT {
        let path = light.join(format!("light_{name}.onnx"));
        let m = tcc::onnx::import_file(&path, &Default::default())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let f = &m.functions[0];
        let inputs = light_inputs(f);
        let want = read_pb(&light.join(format!("light_{name}_output_0.pb")))
            .unwrap_or_else(|e| panic!("{name}: {e:?}"));
        let status = check(&path, &inputs, &[want], rtol, 1e-7);
        println!("{name}: {}", status.word());
        if status != Status::Passed {
            failures.push(format!("{name}: {status:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

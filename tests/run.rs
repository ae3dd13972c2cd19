//! `tcc run`: inputs from `.npy` files, `random` and `zeros`; results printed and written as
//! `.npy`; the reader checked against files numpy 2.4 wrote (tests/data/npy); and the errors a
//! user can cause.

mod common;

use std::path::PathBuf;
use tcc::ir::{DType, Data};
use tcc_tools::npy;

fn tcc(args: &[&str], stdin: &str) -> (i32, String, String) {
    common::tcc_with(args, stdin.as_bytes())
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tcc-run-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn fixture(name: &str) -> tcc::ir::Tensor {
    npy::read(&std::fs::read(format!("tests/data/npy/{name}")).unwrap()).unwrap()
}

#[test]
fn reads_what_numpy_writes() {
    let t = fixture("f32_2x3.npy");
    assert_eq!(t.ty().to_string(), "f32[2,3]");
    assert_eq!(
        t.data(),
        &Data::F32(vec![-0.5, -0.25, 0.0, 0.25, 0.5, 0.75])
    );
    assert_eq!(fixture("f64_scalar.npy").data(), &Data::F64(vec![-2.5]));
    assert_eq!(
        fixture("i8_4.npy").data(),
        &Data::I8(vec![-128, -1, 0, 127])
    );
    assert_eq!(
        fixture("u8_2x2.npy").data(),
        &Data::U8(vec![0, 1, 254, 255])
    );
    assert_eq!(
        fixture("i32_3.npy").data(),
        &Data::I32(vec![i32::MIN, 7, i32::MAX])
    );
    assert_eq!(
        fixture("i64_2.npy").data(),
        &Data::I64(vec![i64::MIN, i64::MAX])
    );
    assert_eq!(
        fixture("bool_3.npy").data(),
        &Data::Bool(vec![true, false, true])
    );
    assert_eq!(
        fixture("f32_big_endian.npy").data(),
        &Data::F32(vec![1.5, -2.0])
    );
    assert_eq!(fixture("f32_empty_0x3.npy").ty().to_string(), "f32[0,3]");
    // What we write for numpy's own arrays is byte-for-byte what numpy wrote.
    for f in [
        "f32_2x3.npy",
        "f64_scalar.npy",
        "i32_3.npy",
        "i64_2.npy",
        "f32_empty_0x3.npy",
    ] {
        let bytes = std::fs::read(format!("tests/data/npy/{f}")).unwrap();
        assert_eq!(npy::write(&npy::read(&bytes).unwrap()), bytes, "{f}");
    }
}

#[test]
fn rejects_what_it_cannot_represent() {
    let err =
        |f: &str| npy::read(&std::fs::read(format!("tests/data/npy/{f}")).unwrap()).unwrap_err();
    assert!(err("f32_fortran.npy").contains("Fortran order"));
    assert!(err("f16_2.npy").contains("unsupported dtype '<f2'"));
}

#[test]
fn runs_on_npy_inputs_and_writes_npy_results() {
    let dir = scratch("npy");
    let src = "func @f(%x: f32[2,3]) -> (f32[2,3], f32[]) {
  %sq = mul %x, %x : f32[2,3]
  %s = reduce_sum %sq {axes=[0,1]} : f32[]
  return %sq, %s
}";
    let out_dir = dir.to_str().unwrap();
    let (code, out, err) = tcc(
        &[
            "run",
            "--interp",
            "-",
            "--input",
            "x=tests/data/npy/f32_2x3.npy",
            "--output",
            out_dir,
        ],
        src,
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        "%sq: f32[2,3]  min 0.000000  max 0.562500  mean 0.197917\n%s: f32[]  min 1.187500  max 1.187500  mean 1.187500\n"
    );
    let sq = npy::read(&std::fs::read(dir.join("sq.npy")).unwrap()).unwrap();
    assert_eq!(
        sq.data(),
        &Data::F32(vec![0.25, 0.0625, 0.0, 0.0625, 0.25, 0.5625])
    );
    let s = npy::read(&std::fs::read(dir.join("s.npy")).unwrap()).unwrap();
    assert_eq!(s.dtype(), DType::F32);
    assert_eq!(s.dims(), &[] as &[u64]);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn random_inputs_are_reproducible_and_zeros_are_zeros() {
    let (c1, a, _) = tcc(&["run", "--interp", "examples/mlp.tir"], "");
    let (c2, b, _) = tcc(&["run", "--interp", "examples/mlp.tir"], "");
    assert_eq!((c1, c2), (0, 0));
    assert_eq!(a, b);
    let (_, c, _) = tcc(
        &[
            "run",
            "--interp",
            "examples/mlp.tir",
            "--input",
            "fc1/w=random:7",
        ],
        "",
    );
    assert_ne!(a, c, "another seed gives other results");
    let src = "func @f(%x: f32[3]) -> (f32[3]) {\n  %y = exp %x : f32[3]\n  return %y\n}";
    let (_, out, _) = tcc(&["run", "--interp", "-", "--input", "%x=zeros"], src);
    assert_eq!(
        out,
        "%y: f32[3]  min 1.000000  max 1.000000  mean 1.000000\n"
    );
}

#[test]
fn file_names_are_sanitized() {
    let dir = scratch("names");
    let src = "func @f(%x: f32[1]) -> (f32[1], f32[1]) {\n  %a/b = neg %x : f32[1]\n  %a_b = abs %x : f32[1]\n  return %a/b, %a_b\n}";
    let (code, _, err) = tcc(
        &["run", "--interp", "-", "--output", dir.to_str().unwrap()],
        src,
    );
    assert_eq!(code, 0, "{err}");
    assert!(dir.join("a_b.npy").exists());
    assert!(
        dir.join("1.npy").exists(),
        "a clash falls back to the result's index"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn user_errors_are_reported() {
    let src = "func @f(%x: f32[2,3]) -> (f32[2,3]) {\n  %y = neg %x : f32[2,3]\n  return %y\n}";
    let (code, _, err) = tcc(
        &[
            "run",
            "--interp",
            "-",
            "--input",
            "x=tests/data/npy/i32_3.npy",
        ],
        src,
    );
    assert_eq!(code, 1);
    assert!(
        err.contains(
            "input `x`: `tests/data/npy/i32_3.npy` holds i32[3], but the parameter is f32[2,3]"
        ),
        "{err}"
    );
    let (code, _, err) = tcc(&["run", "--interp", "-", "--input", "w=zeros"], src);
    assert_eq!(code, 2);
    assert!(
        err.contains("`@f` has no parameter `w`; its parameters are x"),
        "{err}"
    );
    let (code, _, err) = tcc(&["run", "--interp", "-", "--input", "x=ones"], src);
    assert_eq!(code, 1);
    assert!(err.contains("cannot read `ones`"), "{err}");
    let (code, _, err) = tcc(&["run", "--interp", "-", "--input", "x=random:abc"], src);
    assert_eq!(code, 1);
    assert!(err.contains("bad seed `abc`"), "{err}");
    let (code, _, err) = tcc(&["run", "--interp", "-", "--input", "x"], src);
    assert_eq!(code, 2);
    assert!(err.contains("expected NAME=SPEC"), "{err}");
    let two = format!("{src}\nfunc @g() -> () {{\n  return\n}}");
    let (code, _, err) = tcc(&["run", "--interp", "-"], &two);
    assert_eq!(code, 1);
    assert!(
        err.contains("defines 2 functions (@f, @g); choose one with --func"),
        "{err}"
    );
    let (code, _, err) = tcc(&["run", "--interp", "-", "--func", "h"], &two);
    assert_eq!(code, 1);
    assert!(err.contains("has no function `@h`"), "{err}");
    let (code, _, _) = tcc(&["run", "--interp", "-", "--func", "@g"], &two);
    assert_eq!(code, 0);
}

#[test]
fn absurd_sizes_are_refused_before_allocating() {
    let src = "func @f(%x: f32[100000000000]) -> (f32[100000000000]) {\n  %y = neg %x : f32[100000000000]\n  return %y\n}";
    let (code, _, err) = tcc(&["run", "--interp", "-"], src);
    assert_eq!(code, 1);
    assert!(err.contains("%x has type f32[100000000000] (100000000000 elements); the interpreter holds at most 2^30"), "{err}");
}

#[test]
fn run_time_errors_name_the_op() {
    let src = "func @f(%x: i32[2]) -> (i32[2]) {\n  %z = const {value=0} : i32[]\n  %q = div %x, %z : i32[2]\n  return %q\n}";
    let (code, _, err) = tcc(&["run", "--interp", "-"], src);
    assert_eq!(code, 1);
    assert_eq!(
        err,
        "error: in `@f`, op1 (%q = div %x, %z): integer division by zero\n"
    );
}

#[test]
fn compiled_and_interpreted_runs_agree() {
    // gemm accumulates in f32 and the interpreter in f64: equal within a tolerance.
    let (dir_c, dir_i) = (scratch("compiled"), scratch("interpreted"));
    let (c1, _, err) = tcc(
        &[
            "run",
            "examples/mlp.tir",
            "--output",
            dir_c.to_str().unwrap(),
        ],
        "",
    );
    let (c2, _, _) = tcc(
        &[
            "run",
            "--interp",
            "examples/mlp.tir",
            "--output",
            dir_i.to_str().unwrap(),
        ],
        "",
    );
    assert_eq!((c1, c2), (0, 0), "{err}");
    for name in ["loss.npy", "probs.npy"] {
        let a = npy::read(&std::fs::read(dir_c.join(name)).unwrap()).unwrap();
        let b = npy::read(&std::fs::read(dir_i.join(name)).unwrap()).unwrap();
        let (Data::F32(x), Data::F32(y)) = (a.data(), b.data()) else {
            panic!("f32 results")
        };
        for (p, q) in x.iter().zip(y) {
            assert!(
                (p - q).abs() <= 1e-5 * (1.0 + q.abs()),
                "{name}: {p} vs {q}"
            );
        }
    }
    let _ = (
        std::fs::remove_dir_all(dir_c),
        std::fs::remove_dir_all(dir_i),
    );
    let (code, _, err) = tcc(
        &[
            "run",
            "--stats",
            "tests/filetests/plan/elementwise_chain.tir",
        ],
        "",
    );
    assert_eq!(code, 0);
    // The eqsat report's times vary: leave them out.
    let err: Vec<String> = (err.lines())
        .map(|l| {
            (l.split("; "))
                .filter(|part| !part.ends_with("extracting)"))
                .collect::<Vec<_>>()
                .join("; ")
        })
        .collect();
    assert_eq!(
        err.join("\n"),
        "pass qdq: 4 -> 4 ops, unchanged\npass canonicalize: 4 -> 4 ops, unchanged\npass fold-bn: 4 -> 4 ops, unchanged\n\
         pass cse: 4 -> 4 ops, unchanged\npass dce: 4 -> 4 ops, unchanged\n\
         pass eqsat: 4 -> 4 ops, unchanged\n  \
         @f: 2 iterations, stopped: saturated; 10 e-nodes, 7 e-classes; \
         estimated 1.83 -> 1.83 us (input kept); rules: add-comm 1 mul-comm 2\n\
         kernels: 1 compiled, 0 native, 0 on reference kernels, 0 views, 0 dead; arena 0 bytes, outputs 4096 bytes"
    );
}

#[test]
fn profile_names_every_step() {
    // A matmul with a fused bias-and-relu epilogue (one library step) and a softmax (one row
    // step: the JIT's, or with AVX2 and FMA the hand-written one): the profile has a header and
    // one line per step, each naming its kind and op.
    let src = "func @f(%x: f32[4, 8], %w: f32[8, 16], %b: f32[16]) -> (f32[4, 16]) {\n\
               \x20 %y = matmul %x, %w : f32[4, 16]\n\
               \x20 %z = add %y, %b : f32[4, 16]\n\
               \x20 %r = relu %z : f32[4, 16]\n\
               \x20 %s = softmax %r {axis=1} : f32[4, 16]\n\
               \x20 return %s\n}\n";
    let (code, out, err) = tcc(&["run", "--profile", "-"], src);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("%s: f32[4,16]"), "{out}");
    let lines: Vec<&str> = err.lines().collect();
    assert!(
        lines[0].starts_with("profile of @f over 1 run: ") && lines[0].ends_with(" in 2 steps"),
        "{err}"
    );
    assert_eq!(lines.len(), 3, "{err}");
    assert!(
        lines[1..]
            .iter()
            .any(|l| l.ends_with("library   k0    matmul : f32[4,16] %y")),
        "{err}"
    );
    assert!(
        lines[1..].iter().any(|l| ["jit    ", "native "]
            .iter()
            .any(|kind| l.ends_with(&format!("{kind}   k1    softmax {{axis=1}} : f32[4,16] %s")))),
        "{err}"
    );
    // Without the flag, nothing is timed or printed.
    let (code, _, err) = tcc(&["run", "-"], src);
    assert_eq!((code, err.as_str()), (0, ""));
    // The GPU emulator has no timings to give: a usage error, not a silent empty profile.
    let (code, _, err) = tcc(&["run", "--device", "gpu-emulator", "--profile", "-"], src);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("the GPU emulator has no timings"), "{err}");
}

/// `tcc run` optimizes with the inference pipeline first (batch norm folded into the
/// convolution), `--stats` says what each pass changed, `-O0` and `--passes` choose otherwise,
/// and the three agree on the results.
#[test]
fn the_inference_pipeline_runs_first() {
    let src = "func @f(%x: f32[1,2,5,5]) -> (f32[1,3,3,3]) {
  %w = const {value=0.5} : f32[3,2,3,3]
  %g = const {value=[1.0, 2.0, 0.5]} : f32[3]
  %b = const {value=[0.0, 1.0, -1.0]} : f32[3]
  %m = const {value=[0.5, 0.0, 0.25]} : f32[3]
  %v = const {value=[1.0, 4.0, 0.25]} : f32[3]
  %y = conv2d %x, %w : f32[1,3,3,3]
  %n = batch_norm %y, %g, %b, %m, %v : f32[1,3,3,3]
  return %n
}
";
    let (code, folded, err) = tcc(&["run", "-", "--stats"], src);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("pass canonicalize: "), "{err}");
    assert!(
        err.contains("pass fold-bn: 7 -> 4 ops (add 0 -> 1, batch_norm 1 -> 0, const 5 -> 2)"),
        "{err}"
    );
    let (code, plain, err) = tcc(&["run", "-", "-O0", "--stats"], src);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("pass "), "{err}");
    let (code, chosen, err) = tcc(&["run", "-", "--passes=cse,dce", "--stats"], src);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("pass cse: 7 -> 7 ops, unchanged") && !err.contains("fold-bn"),
        "{err}"
    );
    // The same numbers to the printed precision (six decimals).
    assert_eq!(folded, plain);
    assert_eq!(chosen, plain);
    let (code, _, err) = tcc(&["run", "-", "--passes=fold"], src);
    assert_eq!(code, 2);
    assert!(
        err.contains("error: --passes: bad pass pipeline: unknown pass `fold`"),
        "{err}"
    );
    let (code, _, err) = tcc(&["run", "-", "--passes=dce", "-O0"], src);
    assert_eq!(code, 2);
    assert!(err.contains("give --passes or -O0, not both"), "{err}");
}

/// `tcc bench`: compile time split by stage, latency statistics over the timed runs (which are
/// ordered: min <= median <= p90), throughput, the features the target allows; bad counts are
/// usage errors.
#[test]
fn bench_reports_compile_time_latency_and_features() {
    let (code, out, err) = tcc(
        &[
            "bench",
            "examples/mlp.tir",
            "--runs",
            "7",
            "--warmup",
            "1",
            "--threads",
            "1",
            "--target",
            "host,-avx512f",
        ],
        "",
    );
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 5, "{out}");
    assert!(lines[0].starts_with("examples/mlp.tir (@mlp): "), "{out}");
    assert!(
        lines[1].contains("features used: ") && !lines[1].contains("AVX-512F"),
        "-avx512f is not used: {out}"
    );
    assert!(lines[1].ends_with("; 1 thread"), "{out}");
    assert!(
        lines[2].starts_with("compile: ") && lines[2].contains("(load "),
        "{out}"
    );
    let ms = |key: &str| -> f64 {
        let rest = lines[3]
            .split(key)
            .nth(1)
            .unwrap_or_else(|| panic!("{out}"));
        rest.split_whitespace().next().unwrap().parse().unwrap()
    };
    assert!(
        lines[3].starts_with("latency over 7 runs (after 1 warm-up): "),
        "{out}"
    );
    let (min, med, p90) = (ms("min "), ms("median "), ms("p90 "));
    assert!(min > 0.0 && min <= med && med <= p90, "{out}");
    assert!(
        lines[4].starts_with("throughput: ") && lines[4].ends_with(" runs/s"),
        "{out}"
    );
    for (args, want) in [
        (vec!["--runs", "0"], "--runs must be at least 1"),
        (vec!["--threads", "0"], "--threads must be at least 1"),
        (vec!["--target", "host,-warp"], "unknown CPU feature `warp`"),
    ] {
        let mut all = vec!["bench", "examples/mlp.tir"];
        all.extend(args);
        let (code, _, err) = tcc(&all, "");
        assert_eq!(code, 2, "{err}");
        assert!(err.contains(want), "{err}");
    }
}

#[test]
fn calibrate_prints_eqsat_options_that_a_pipeline_takes() {
    // The figures are this machine's (never asserted); what is checked is that each is a
    // positive number and that the last line is a pipeline `tcc opt` accepts.
    let (code, out, err) = tcc(&["calibrate"], "");
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 8, "{out}");
    for l in &lines[..7] {
        let x: f64 = l.split_whitespace().rev().nth(2).unwrap().parse().unwrap();
        assert!(x > 0.0 && x.is_finite(), "{l}");
    }
    let pipeline = format!("--passes={}", lines[7]);
    let (code, out, err) = tcc(&["opt", &pipeline, "examples/mlp.tir"], "");
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("func @mlp"), "{out}");
}

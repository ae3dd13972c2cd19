//! Malformed input never panics: each case gives exit status 1 and a diagnostic naming the
//! problem (and, where the input has one, its `line:col`). Usage errors give status 2.

mod common;
use common::tcc_with as run;

const HEAD: &str = "func @f(%x: f32[4]) -> (f32[4]) {\n";

fn body(ops: &str) -> Vec<u8> {
    format!("{HEAD}{ops}\n  return %x\n}}\n").into_bytes()
}

fn cases() -> Vec<(&'static str, Vec<u8>, &'static str)> {
    let long_line = {
        let mut s = body("").to_vec();
        s.extend(std::iter::repeat_n(b'z', 1 << 20));
        s
    };
    let long_name = body(&format!("  %y = relu %{} : f32[4]", "n".repeat(1 << 20)));
    let deep = body(&format!(
        "  %y = reduce_sum %x {{axes={}}} : f32[]",
        "[".repeat(100_000)
    ));
    let many_args = body(&format!(
        "  %y = concat {} {{axis=0}} : f32[5]",
        vec!["%x"; 100_000].join(", ")
    ));
    vec![
        ("empty file", b"".to_vec(), "<stdin>:1:1: error: expected `func`, found end of file"),
        ("only comments", b"// nothing here\n\n".to_vec(), "the input defines no function"),
        ("truncated op", format!("{HEAD}  %y = relu").into_bytes(), "<stdin>:2:12: error: expected `,`, `{`, `after` or `:` and the result types, found end of file"),
        ("truncated signature", b"func @f(%x: f32[".to_vec(), "expected a dimension"),
        ("unknown op", body("  %y = frobnicate %x : f32[4]"), "unknown op `frobnicate`"),
        ("wrong arity", body("  %y = add %x : f32[4]"), "`add` takes 2 operands, found 1"),
        ("undefined value", body("  %y = add %x, %nope : f32[4]"), "undefined value `%nope`"),
        ("redefined value", body("  %x = relu %x : f32[4]"), "value `%x` is defined twice"),
        ("shape mismatch", body("  %y = add %x, %x : f32[5]"), "result is declared f32[5] but the type rule gives f32[4]"),
        ("bad dtype", b"func @f(%x: f8[4]) -> () {\n  return\n}\n".to_vec(), "unknown dtype `f8`"),
        ("negative dim", b"func @f(%x: f32[-1]) -> () {\n  return\n}\n".to_vec(), "dimension must be non-negative"),
        ("dim beyond u64", b"func @f(%x: f32[99999999999999999999999]) -> () {\n  return\n}\n".to_vec(), "does not fit in 64 bits"),
        ("element count overflows u64", b"func @f(%x: f32[4294967296,4294967296,4294967296]) -> () {\n  return\n}\n".to_vec(), "is too large"),
        ("byte size overflows", b"func @f(%x: f64[2305843009213693952]) -> () {\n  return\n}\n".to_vec(), "is too large"),
        ("1 MB line", long_line, "expected `func`, found `zzzz"),
        ("1 MB name", long_name, "undefined value `%nnnn"),
        ("non-UTF-8 bytes", b"func @f() -> () {\n  \xff\xfe\n}\n".to_vec(), "<stdin>:2:3: error: input is not valid UTF-8 (byte 0xff"),
        ("NUL byte", b"func @f() -> () {\0}".to_vec(), "unexpected character `\\0`"),
        ("cycle through control edges", body("  %a = relu %x after %b : f32[4]\n  %b = neg %a : f32[4]"), "cycle through control edges: %a -> %b -> %a"),
        ("control dep on parameter", body("  %a = relu %x after %x : f32[4]"), "must name an op's result"),
        ("unterminated quoted name", body("  %\"y = relu %x : f32[4]"), "unterminated quoted name"),
        ("bad escape", body("  %\"a\\q\" = relu %x : f32[4]"), "unknown escape"),
        ("stray character", body("  %y = relu $x : f32[4]"), "unexpected character `$`"),
        ("missing arrow", b"func @f(%x: f32[4]) (f32[4]) {\n  return %x\n}\n".to_vec(), "expected `->` and the result types"),
        ("dense literal too short", body("  %c = const {value=[1.0, 2.0]} : f32[4]"), "constant has 2 elements but f32[4] has 4"),
        ("literal out of range", body("  %c = const {value=300} : u8[]"), "`300` is not a valid u8 literal"),
        ("nan integer", body("  %c = const {value=nan} : i32[]"), "`nan` is not a valid i32 literal"),
        ("attribute of the wrong kind", body("  %y = softmax %x {axis=last} : f32[4]"), "must be an integer"),
        ("unknown attribute", body("  %y = relu %x {alpha=0.1} : f32[4]"), "`relu` has no attribute `alpha` (it takes none)"),
        ("integer attribute overflow", body("  %y = softmax %x {axis=99999999999999999999} : f32[4]"), "must be an integer"),
        ("axis out of range", body("  %y = softmax %x {axis=3} : f32[4]"), "axis 3 is out of range for rank 1"),
        ("zero stride", b"func @f(%x: f32[1,1,4,4], %w: f32[1,1,3,3]) -> () {\n  %y = conv2d %x, %w {strides=[0,1]} : f32[1,1,2,2]\n  return\n}\n".to_vec(), "must be positive"),
        ("absurd dilation", b"func @f(%x: f32[1,1,4,4], %w: f32[1,1,3,3]) -> () {\n  %y = conv2d %x, %w {dilations=[9223372036854775807,1]} : f32[1,1,2,2]\n  return\n}\n".to_vec(), "does not fit the padded input"),
        ("zero slice step", body("  %y = slice %x {starts=[0], ends=[4], steps=[0]} : f32[4]"), "step along axis 0 is zero"),
        ("huge reshape target", body("  %y = reshape %x {shape=[4611686018427387904,4]} : f32[4]"), "is too large"),
        ("nested brackets", deep, "expected a number, found `[`"),
        ("100k operands with a wrong type", many_args, "the type rule gives f32[400000]"),
        ("duplicate function", b"func @f() -> () {\n  return\n}\nfunc @f() -> () {\n  return\n}\n".to_vec(), "function `@f` is defined twice"),
        ("return count mismatch", b"func @f(%x: f32[4]) -> (f32[4], f32[4]) {\n  return %x\n}\n".to_vec(), "`return` has 1 value(s)"),
        ("garbage after module", b"func @f() -> () {\n  return\n}\n}\n".to_vec(), "expected `func`, found `}`"),
    ]
}

#[test]
fn malformed_inputs_give_diagnostics_not_panics() {
    let cases = cases();
    assert!(cases.len() >= 25);
    let mut failures = Vec::new();
    for (name, input, want) in &cases {
        let (code, out, err) = run(&["verify", "-"], input);
        if code != 1 || !err.contains(want) || !out.is_empty() {
            let shown: String = err.chars().take(600).collect();
            failures.push(format!(
                "{name}: exit {code}, expected 1 and `{want}` in stderr:\n{shown}"
            ));
        }
        // Diagnostics stay readable however long the input's lines and names are.
        assert!(err.len() < 4000, "{name}: stderr is {} bytes", err.len());
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn usage_errors_exit_2() {
    let (code, _, err) = run(&["frobnicate"], b"");
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = run(&["opt", "-"], b"");
    assert_eq!(code, 2);
    assert!(err.contains("--passes"), "{err}");
    let (code, _, err) = run(&["opt", "--passes=cse,bogus", "-"], b"");
    assert_eq!(code, 2);
    assert!(
        err.contains("unknown pass `bogus`; valid passes are: adam, canonicalize, cse, dce, eqsat, fold-bn, grad, momentum, nchwc, offload, qdq, quantize, remat, sgd, swap"),
        "{err}"
    );
    let (code, _, err) = run(&["opt", "--passes=eqsat{rules=[algebra,bogus]}", "-"], b"");
    assert_eq!(code, 2);
    assert!(
        err.contains("unknown rule set `bogus`; valid sets: algebra, finite, layout, graph"),
        "{err}"
    );
    let (code, _, err) = run(&["opt", "--passes=dce{aggressive=1}", "-"], b"");
    assert_eq!(code, 2);
    assert!(
        err.contains("pass `dce` has no option `aggressive`"),
        "{err}"
    );
}

#[test]
fn missing_file_is_an_input_error() {
    let (code, _, err) = run(&["cat", "/nonexistent/x.tir"], b"");
    assert_eq!(code, 1);
    assert!(err.contains("cannot read `/nonexistent/x.tir`"), "{err}");
}

#[test]
fn help_is_on_stdout_with_an_example() {
    for sub in ["cat", "verify", "opt"] {
        let (code, out, _) = run(&[sub, "--help"], b"");
        assert_eq!(code, 0);
        assert!(out.contains("Example:\n  tcc "), "{sub}: {out}");
    }
}

#[test]
fn stdin_round_trips_through_cat() {
    let src = std::fs::read("examples/mlp.tir").unwrap();
    let (code, first, err) = run(&["cat", "-"], &src);
    assert_eq!(code, 0, "{err}");
    let (code, second, _) = run(&["cat", "-"], first.as_bytes());
    assert_eq!(code, 0);
    assert_eq!(first, second);
}

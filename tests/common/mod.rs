//! Helpers shared by the integration tests that drive the `tcc` binary's code.

#![allow(dead_code)]

pub mod onnx;

/// Runs the driver with `args` (without the program name) and `stdin`; returns the exit code,
/// stdout and stderr.
pub fn tcc_with(args: &[&str], stdin: &[u8]) -> (i32, String, String) {
    let args: Vec<String> = std::iter::once("tcc")
        .chain(args.iter().copied())
        .map(String::from)
        .collect();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = tcc_tools::run(&args, &mut &stdin[..], &mut out, &mut err);
    (
        code,
        String::from_utf8(out).unwrap(),
        String::from_utf8(err).unwrap(),
    )
}

/// [`tcc_with`] on an empty stdin.
pub fn tcc(args: &[&str]) -> (i32, String, String) {
    tcc_with(args, b"")
}

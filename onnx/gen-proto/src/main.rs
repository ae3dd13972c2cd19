//! Regenerates `onnx/src/proto.rs` from the official `onnx.proto` (see onnx/gen-proto/README.md).
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, proto, out] = &args[..] else {
        eprintln!("usage: gen-proto PATH/TO/onnx.proto OUT_DIR");
        std::process::exit(2);
    };
    let dir = std::path::Path::new(proto).parent().expect("a file path");
    let fds = protox::compile([proto], [dir]).expect("onnx.proto compiles");
    prost_build::Config::new()
        .disable_comments(["."])
        .out_dir(out)
        .compile_fds(fds)
        .expect("code generation");
}

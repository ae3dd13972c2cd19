//! Every op of the IR through the CPU runtime against the reference interpreter, at several
//! shapes: broadcasting, size-1 dims, odd sizes and a large size. Compiled kernels and reference
//! kernels both run through the same storage and arena, so this also checks the plumbing. Each
//! case runs for the host (its library kernels 512 and 256 bits wide), for `host,-avx512f` (the
//! AVX2 kernels and GEMM) and without FMA.
//!
//! Tolerances: exact for data movement and integer ops; 2e-5 relative for float arithmetic,
//! which the compiled kernels do in f32 where the interpreter uses f64 (accumulations over up to
//! a few hundred terms); tanh and sigmoid use polynomial approximations (docs/perf.md).

mod amx_int;
mod avx2_int;
mod blocked;
mod elementwise;
mod layers;
mod movement;
mod pooling;
mod quantize;
mod requant_int;

#[path = "../common/mod.rs"]
mod common;

use tcc_codegen::Executable;
use tcc_ir::random::{Rng, random_tensor};
use tcc_ir::{Data, Tensor, parse_function};

/// Compiled against interpreted: 2e-5 relative, and as much absolute near zero.
fn close(a: f64, b: f64) -> bool {
    common::close(a, b, 2e-5, 2e-5)
}

/// Runs `body` (ops over the given parameters, the last defining `%out : ty`) compiled and
/// interpreted, and compares.
fn case(params: &str, body: &str, out_ty: &str, seed: u64) {
    let src = format!("func @f({params}) -> ({out_ty}) {{\n{body}\n  return %out\n}}");
    let f = parse_function(&src).unwrap_or_else(|d| panic!("{src}\n{d}"));
    tcc_ir::verify_function(&f).unwrap_or_else(|d| panic!("{src}\n{d}"));
    let mut rng = Rng::new(seed);
    let inputs: Vec<Tensor> = f
        .params()
        .iter()
        .map(|&p| random_tensor(f.ty(p), &mut rng))
        .collect();
    let want = tcc_ir::interp::run(&f, &inputs).unwrap_or_else(|e| panic!("{src}\n{e}"));
    // Every target of `common::TARGETS` (the host's library kernels at both widths, the AVX2
    // paths, no FMA), each in the function's own layout and in the one the backend chooses
    // (convolutions on channel-blocked tensors).
    for target in common::TARGETS {
        for plain in common::LAYOUTS {
            let exe = common::compile(&f, target, plain);
            let got = exe.run(&inputs).unwrap_or_else(|e| panic!("{src}\n{e}"));
            let ok = match (got[0].data(), want[0].data()) {
                (Data::F32(p), Data::F32(q)) => {
                    p.iter().zip(q).all(|(&x, &y)| close(x as f64, y as f64))
                }
                (Data::F64(p), Data::F64(q)) => p.iter().zip(q).all(|(&x, &y)| close(x, y)),
                (p, q) => p == q,
            };
            assert!(
                ok && got[0].ty() == want[0].ty(),
                "{src}\ntarget {target:?}, plain {plain}: compiled and interpreted results differ"
            );
        }
    }
}

/// [`case`], and the ops run on compiled or native kernels, none on the reference kernels.
fn case_native(params: &str, body: &str, out_ty: &str, seed: u64) {
    case(params, body, out_ty, seed);
    let src = format!("func @f({params}) -> ({out_ty}) {{\n{body}\n  return %out\n}}");
    let f = parse_function(&src).unwrap();
    let exe = Executable::compile(&f).unwrap();
    assert_eq!(exe.reference_ops(), Vec::<String>::new(), "{src}");
}

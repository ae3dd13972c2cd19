//! `canonicalize` rewrites checked against the interpreter.

use tcc_ir::random::{Rng, random_tensor};
use tcc_ir::{OpKind, Tensor, parse_function};

/// The DenseNet-like block of `tests/filetests/canonicalize/concat_chain.tir`: after the pass
/// each of its growing concatenations extends the one before, the others are as they were,
/// and the results are the same bits.
#[test]
fn concatenations_extend_the_one_before() {
    let src = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/filetests/canonicalize/concat_chain.tir"
    ))
    .unwrap();
    let f = parse_function(&src).unwrap();
    let mut g = f.clone();
    assert!(tcc_passes::canonicalize::canonicalize(&mut g, 256) >= 2);
    tcc_ir::verify_function(&g).unwrap();
    let args = |name: &str| -> Vec<String> {
        let op = (g.schedule().iter())
            .find(|&&op| g.name(g.op(op).results[0]) == name)
            .copied()
            .unwrap();
        assert!(matches!(g.op(op).kind, OpKind::Concat { .. }));
        g.op(op)
            .args
            .iter()
            .map(|&a| g.name(a).to_string())
            .collect()
    };
    assert_eq!(args("c1"), ["x0", "x1"]);
    assert_eq!(args("c2"), ["c1", "z2"]);
    assert_eq!(args("c3"), ["c2", "z3"]);
    assert_eq!(args("d2"), ["d", "d"]);
    assert_eq!(args("e"), ["z3", "x0", "x1"]);
    let mut rng = Rng::new(7);
    let inputs: Vec<Tensor> = (f.params().iter())
        .map(|&p| random_tensor(f.ty(p), &mut rng))
        .collect();
    let want = tcc_ir::interp::run(&f, &inputs).unwrap();
    let got = tcc_ir::interp::run(&g, &inputs).unwrap();
    assert_eq!(got, want);
}

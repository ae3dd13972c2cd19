//! `cse` on large constants: their hash reads a sample of the elements, so constants that
//! differ only between the sampled ones must still be told apart, and equal ones merged.

use tcc_ir::{DType, Data, Function, Literal, OpKind, TensorType};

/// A function returning `a + b` for two `[n]` constants.
fn sum_of(a: Vec<f32>, b: Vec<f32>) -> Function {
    let n = a.len() as u64;
    let ty = TensorType::new(DType::F32, vec![n]).unwrap();
    let mut f = Function::new("f");
    let konst = |f: &mut Function, v: Vec<f32>, name: &str| {
        let kind = OpKind::Const {
            ty: ty.clone(),
            value: Literal::dense(Data::F32(v)),
        };
        let op = f.add_op(kind, vec![], vec![ty.clone()], &[name]);
        f.op(op).results[0]
    };
    let (x, y) = (konst(&mut f, a, "a"), konst(&mut f, b, "b"));
    let op = f.add_op(
        OpKind::Binary(tcc_ir::BinaryOp::Add),
        vec![x, y],
        vec![ty.clone()],
        &["s"],
    );
    let s = f.op(op).results[0];
    f.set_results(vec![s]);
    f
}

#[test]
fn large_constants_differing_between_hashed_elements_stay_apart() {
    let n = 100_000;
    let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let mut b = a.clone();
    // Element 1 is not among those hashed (about every 98th): the hashes collide.
    b[1] = -1.0;
    let mut f = sum_of(a.clone(), b);
    assert_eq!(
        tcc_passes::cse::cse(&mut f),
        0,
        "different constants merged"
    );
    let mut g = sum_of(a.clone(), a);
    assert_eq!(
        tcc_passes::cse::cse(&mut g),
        1,
        "equal constants kept apart"
    );
}

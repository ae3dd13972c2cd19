//! The CPU runtime against the reference interpreter: compiled elementwise kernels at sizes that
//! are and are not multiples of the vector width, every broadcast pattern, special values, whole
//! random functions (compiled and reference kernels together), and concurrent runs.

mod common;

use common::{both, check, check_conditioned, randoms};
use proptest::prelude::*;
use tcc_codegen::Executable;
use tcc_codegen::cpu::max_ulp_error;
use tcc_ir::UnaryOp;
use tcc_ir::random::{Rng, random_function};
use tcc_ir::{Data, Tensor, parse_function};

#[test]
fn fused_chain_at_awkward_sizes() {
    for n in [1u64, 3, 4, 5, 7, 8, 17, 1000, 1027] {
        let src = format!(
            "func @f(%x: f32[{n}], %a: f32[], %b: f32[{n}]) -> (f32[{n}]) {{
  %m = mul %x, %a : f32[{n}]
  %s = add %m, %b : f32[{n}]
  %t = tanh %s : f32[{n}]
  %y = mul %t, %x : f32[{n}]
  return %y
}}"
        );
        let f = parse_function(&src).unwrap();
        let (got, want, exe) = both(&f, &randoms(&f, n));
        assert_eq!(exe.stats().compiled, 1, "the chain is one compiled kernel");
        check(&got, &want, 2e-6, 1e-7).unwrap_or_else(|e| panic!("n={n}: {e}"));
    }
}

#[test]
fn every_compiled_op_on_special_values() {
    let xs: Vec<f32> = vec![
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        -0.5,
        1e-8,
        -1e-8,
        0.624,
        0.626,
        -0.63,
        3.0,
        -3.0,
        9.5,
        -9.5,
        20.0,
        -20.0,
        80.0,
        88.5,
        88.8,
        100.0,
        -87.0,
        -90.0,
        -103.0,
        -110.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MIN_POSITIVE,
        1e30,
        -1e30,
        7.25,
    ];
    let n = xs.len();
    for op in [
        "neg",
        "abs",
        "sqrt",
        "rsqrt",
        "reciprocal",
        "relu",
        "exp",
        "tanh",
        "sigmoid",
    ] {
        let src = format!(
            "func @f(%x: f32[{n}]) -> (f32[{n}]) {{\n  %y = {op} %x : f32[{n}]\n  return %y\n}}"
        );
        let f = parse_function(&src).unwrap();
        let input = vec![Tensor::from_f32(&[n as u64], xs.clone()).unwrap()];
        let (got, want, exe) = both(&f, &input);
        assert_eq!(exe.stats().compiled, 1, "{op} compiles");
        // The polynomial exp and its users are within a few ulp; the rest are exact or 1 ulp.
        check(&got, &want, 1e-6, 1e-30).unwrap_or_else(|e| panic!("{op}: {e}"));
    }
    for op in ["add", "sub", "mul", "div", "max", "min"] {
        let src = format!(
            "func @f(%x: f32[{n}], %y: f32[{n}]) -> (f32[{n}]) {{\n  %z = {op} %x, %y : f32[{n}]\n  return %z\n}}"
        );
        let f = parse_function(&src).unwrap();
        let mut ys = xs.clone();
        ys.rotate_left(5);
        let input = vec![
            Tensor::from_f32(&[n as u64], xs.clone()).unwrap(),
            Tensor::from_f32(&[n as u64], ys).unwrap(),
        ];
        let (got, want, _) = both(&f, &input);
        check(&got, &want, 0.0, 0.0).unwrap_or_else(|e| panic!("{op}: {e}"));
    }
}

#[test]
fn broadcast_patterns() {
    let cases = [
        ("f32[6,8]", "f32[8]"),           // bias over rows, vector loads
        ("f32[5,7]", "f32[7]"),           // bias, scalar loop
        ("f32[2,16,5,5]", "f32[16,1,1]"), // per channel, inner 25
        ("f32[2,3,4,4]", "f32[3,1,1]"),   // per channel, inner 16: splatted in the vector loop
        ("f32[4,8]", "f32[4,1]"),         // per row
        ("f32[3,4]", "f32[1,1]"),         // a one-element operand
        ("f32[3,4]", "f32[]"),            // a scalar parameter
        ("f32[2,3,4,4]", "f32[2,1,4,4]"), // a mean over channels kept: two runs, vector loads
        ("f32[3,5,7]", "f32[3,1,7]"),     // two runs, scalar loop
        ("f32[2,3,6,4]", "f32[2,1,6,1]"), // two runs, the inner one splatted
    ];
    for (big, small) in cases {
        let src = format!(
            "func @f(%x: {big}, %b: {small}) -> ({big}) {{\n  %y = add %x, %b : {big}\n  %z = mul %y, %b : {big}\n  return %z\n}}"
        );
        let f = parse_function(&src).unwrap();
        let (got, want, exe) = both(&f, &randoms(&f, 3));
        assert_eq!(exe.stats().compiled, 1, "{big} with {small}");
        check(&got, &want, 2e-7, 0.0).unwrap_or_else(|e| panic!("{big} + {small}: {e}"));
    }
}

#[test]
fn constants_inline_or_from_memory() {
    let src = "func @f(%x: f32[2,4]) -> (f32[2,4]) {
  %h = const {value=0.5} : f32[]
  %d = const {value=[1.0, 2.0, 3.0, 4.0]} : f32[4]
  %a = mul %x, %h : f32[2,4]
  %b = add %a, %d : f32[2,4]
  return %b
}";
    let f = parse_function(src).unwrap();
    let (got, want, _) = both(&f, &randoms(&f, 9));
    check(&got, &want, 0.0, 0.0).unwrap();
}

#[test]
fn reference_kernels_views_and_results_that_are_inputs() {
    let src = "func @f(%x: f32[4,6], %w: f32[6,3]) -> (f32[6,4], f32[4,6], f32[24]) {
  %m = matmul %x, %w : f32[4,3]
  %t = transpose %m {perm=[1,0]} : f32[3,4]
  %z = const {value=0.5} : f32[6,4]
  %i = const {value=[5, 0, 5]} : i64[3]
  %c = scatter_add %z, %i, %t {axis=0} : f32[6,4]
  %e = exp %x : f32[4,6]
  %r = reshape %e {shape=[24]} : f32[24]
  %n = neg %r : f32[24]
  return %c, %x, %n
}";
    let f = parse_function(src).unwrap();
    let (got, want, exe) = both(&f, &randoms(&f, 5));
    let s = exe.stats();
    assert_eq!(
        (s.compiled, s.native, s.reference, s.views),
        (3, 1, 1, 1),
        "matmul, exp and neg compile; transpose is native; scatter_add is on the reference kernels: {s:?}"
    );
    check(&got, &want, 1e-6, 1e-7).unwrap();
}

#[test]
fn inputs_are_checked() {
    let f =
        parse_function("func @f(%x: f32[4]) -> (f32[4]) {\n  %y = exp %x : f32[4]\n  return %y\n}")
            .unwrap();
    let exe = Executable::compile(&f).unwrap();
    let e = exe
        .run(&[Tensor::from_f32(&[5], vec![0.0; 5]).unwrap()])
        .unwrap_err();
    assert_eq!(
        e.0,
        "input for parameter %x of `@f`: expected f32[4], got f32[5]"
    );
    let e = exe.run(&[]).unwrap_err();
    assert_eq!(e.0, "`@f` takes 1 input(s), got 0");
}

#[test]
fn run_time_errors_name_the_op() {
    let f = parse_function(
        "func @f(%t: f32[3,2], %i: i64[2]) -> (f32[2,2]) {\n  %g = gather %t, %i {axis=0} : f32[2,2]\n  return %g\n}",
    )
    .unwrap();
    let exe = Executable::compile(&f).unwrap();
    let inputs = [
        Tensor::from_f32(&[3, 2], vec![0.0; 6]).unwrap(),
        Tensor::from_data(&[2], Data::I64(vec![0, 5])).unwrap(),
    ];
    let e = exe.run(&inputs).unwrap_err();
    assert_eq!(
        e.0,
        "in `@f`, op0 (%g = gather %t, %i): index 5 is out of range for an axis of size 3"
    );
}

#[test]
fn concurrent_runs_share_one_executable() {
    let src = "func @f(%x: f32[4099], %b: f32[4099]) -> (f32[4099]) {
  %s = add %x, %b : f32[4099]
  %t = tanh %s : f32[4099]
  %e = exp %t : f32[4099]
  return %e
}";
    let f = parse_function(src).unwrap();
    let exe = std::sync::Arc::new(Executable::compile(&f).unwrap());
    let inputs = randoms(&f, 11);
    let expected = exe.run(&inputs).unwrap();
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let exe = exe.clone();
            let inputs = inputs.clone();
            std::thread::spawn(move || {
                (0..20)
                    .map(|_| exe.run(&inputs).unwrap())
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for t in threads {
        for r in t.join().unwrap() {
            assert_eq!(r, expected, "every run gives the same bits");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Whole random functions: every kernel kind, views, in-place slots and results.
    #[test]
        fn random_functions_match_the_interpreter(seed in any::<u64>(), n in 1usize..50) {
        let f = random_function(seed, n);
        let inputs = randoms(&f, seed ^ 1);
        let Ok(want) = tcc_ir::interp::run(&f, &inputs) else { return Ok(()) };
        let exe = Executable::compile(&f).map_err(|e| TestCaseError::fail(e.0))?;
        let got = exe.run(&inputs).map_err(|e| TestCaseError::fail(format!("{e}\n{f}")))?;
                // A float-to-integer cast turns a one-ulp difference (tanh is within 6 ulp) into a
        // difference of one, which later ops can amplify without bound: results downstream of
        // one are not compared. Chains such as exp(sum of products) amplify f32 rounding too
                // (exp of a 47.2 accumulated in a different order: 1.1e-5 relative), hence 1e-4 here
        // where the single-op tests use 1e-5; and gelu below -1 is accurate only to ~1e-6
        // absolute (docs/perf.md), which gelu(gelu(x)) doubles, hence atol 1e-5.
        // A product chain can also cancel: the tolerance widens where the reference itself
        // moves when the inputs move by 16 f32 ulps (`check_conditioned`).
        let exact: Vec<usize> = (0..got.len()).filter(|&i| !common::after_truncation(&f, f.results()[i])).collect();
        let pick = |v: &[Tensor]| exact.iter().map(|&i| v[i].clone()).collect::<Vec<_>>();
        let nudged = tcc_ir::interp::run(&f, &common::perturbed(&inputs, seed ^ 2));
        let result = match nudged {
            Ok(nudged) => check_conditioned(&pick(&got), &pick(&want), &pick(&nudged), (1e-4, 1e-5, 4.0)),
            Err(_) => check(&pick(&got), &pick(&want), 1e-4, 1e-5),
        };
        result.map_err(|e| TestCaseError::fail(format!("{e}\n{f}")))?;
    }
}

/// A function (once the generator's for seed 13754341364563285014, written out so that the
/// generator can change) whose last product cancels (terms near 1e7 summing to 56): the f32
/// result keeps four digits, 1.3e-4 from the f64 reference, and the conditioned check accepts
/// it; the same check still fails a result 1% off where nothing cancels.
#[test]
fn conditioned_check_allows_cancellation_only() {
    let seed: u64 = 13754341364563285014;
    let f = parse_function(CANCELLING).unwrap();
    let inputs = randoms(&f, seed ^ 1);
    let want = tcc_ir::interp::run(&f, &inputs).unwrap();
    let got = Executable::compile(&f).unwrap().run(&inputs).unwrap();
    let nudged = tcc_ir::interp::run(&f, &common::perturbed(&inputs, seed ^ 2)).unwrap();
    let tol = (1e-4, 1e-5, 4.0);
    check_conditioned(&got, &want, &nudged, tol).unwrap();
    let Data::F32(v) = got[1].data() else {
        panic!("an f32 result")
    };
    let mut v = v.clone();
    v[3] *= 1.01;
    let mut bad = got.clone();
    bad[1] = Tensor::new(got[1].ty().clone(), Data::F32(v)).unwrap();
    assert!(check_conditioned(&bad, &want, &nudged, tol).is_err());
}

const CANCELLING: &str = "func @rand13754341364563285014(%p0: f64[3,2,3], %p1: f32[2,2], %p2: f32[], %p3: f32[2,3,5,6], %filter: f32[1,3,3,3]) -> (f32[5,5,3,2], f32[2,3,5,5], f32[2,3,5,10]) {
  %log_softmax = log_softmax %p1 {axis=1} : f32[2,2]
  %reduce_max = reduce_max %log_softmax {axes=[1]} : f32[2]
  %global_avg_pool = global_avg_pool %p3 : f32[2,3,1,1]
  %tanh = tanh %global_avg_pool : f32[2,3,1,1]
  %concat = concat %p3, %p3 {axis=2} : f32[2,3,10,6]
  %transpose = transpose %p3 {perm=[0,1,3,2]} : f32[2,3,6,5]
  %matmul = matmul %p3, %transpose after %tanh : f32[2,3,5,5]
  %transpose.1 = transpose %matmul {perm=[0,1,3,2]} : f32[2,3,5,5]
  %matmul.1 = matmul %matmul, %transpose.1 : f32[2,3,5,5]
  %softmax = softmax %concat {axis=2} : f32[2,3,10,6]
  %const = const {value=-1.96} : f32[5,5]
  %mul = mul %matmul, %const : f32[2,3,5,5]
  %const.1 = const {value=-1.12} : f32[3,5,1]
  %pow = pow %const.1, %matmul : f32[2,3,5,5]
  %blk5/concat = concat %matmul.1, %matmul.1 {axis=3} : f32[2,3,5,10]
  %blk5/blk7/transpose = transpose %blk5/concat {perm=[0,3,2,1]} : f32[2,10,5,3]
  %blk5/blk7/transpose.1 = transpose %blk5/concat {perm=[0,1,3,2]} : f32[2,3,10,5]
  %blk5/blk7/matmul = matmul %blk5/concat, %blk5/blk7/transpose.1 : f32[2,3,5,5]
  %blk5/blk7/const = const {value=[1, 1, 0, 0]} : i64[4]
  %blk5/blk7/gather = gather %blk5/blk7/transpose, %blk5/blk7/const {axis=0} : f32[4,10,5,3]
  %blk5/blk7/scatter_add = scatter_add %blk5/blk7/transpose, %blk5/blk7/const, %blk5/blk7/gather {axis=0} after %pow : f32[2,10,5,3]
  %blk5/blk7/const.1 = const {value=1.09} : f32[]
  %blk5/blk7/sub = sub %blk5/blk7/const.1, %blk5/blk7/matmul after %matmul.1 : f32[2,3,5,5]
  %blk5/blk7/tanh = tanh %blk5/blk7/transpose : f32[2,10,5,3]
  %blk5/blk7/reshape = reshape %blk5/blk7/sub {shape=[5,5,3,2]} : f32[5,5,3,2]
  %blk5/blk7/sub.1 = sub %blk5/blk7/matmul, %blk5/blk7/sub : f32[2,3,5,5]
  %blk5/blk7/transpose.2 = transpose %blk5/blk7/sub.1 {perm=[0,1,3,2]} : f32[2,3,5,5]
  %blk5/blk7/matmul.1 = matmul %blk5/blk7/sub.1, %blk5/blk7/transpose.2 : f32[2,3,5,5]
  return %blk5/blk7/reshape, %blk5/blk7/matmul.1, %blk5/concat
}";

#[test]
fn large_loops_split_across_threads() {
    // 300,007 rows of 4: split in pieces, with a broadcast operand and an odd tail.
    let src = "func @f(%x: f32[300007,4], %b: f32[4]) -> (f32[300007,4]) {
  %s = add %x, %b : f32[300007,4]
  %t = sigmoid %s : f32[300007,4]
  return %t
}";
    let f = parse_function(src).unwrap();
    let (got, want, exe) = both(&f, &randoms(&f, 4));
    assert_eq!(exe.stats().compiled, 1);
    check(&got, &want, 1e-6, 1e-7).unwrap();
}

#[test]
fn polynomial_accuracy() {
    let sigmoid = |x: f64| 1.0 / (1.0 + (-x).exp());
    type Case = (UnaryOp, f32, f32, fn(f64) -> f64, f64);
    let gelu = |x: f64| 0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2));
    let cases: [Case; 9] = [
        (UnaryOp::Log, 1e-30, 1e30, f64::ln, 1.0),
        (UnaryOp::Log, 0.5, 2.0, f64::ln, 1.0),
        (UnaryOp::Erf, -5.0, 5.0, libm::erf, 8.0),
        (UnaryOp::Gelu, -1.0, 10.0, gelu, 7.5),
        (UnaryOp::Exp, -87.0, 88.0, f64::exp, 1.5),
        (UnaryOp::Exp, -1.0, 1.0, f64::exp, 1.5),
        (UnaryOp::Tanh, -9.0, 9.0, f64::tanh, 6.0),
        (UnaryOp::Tanh, -0.7, 0.7, f64::tanh, 6.0),
        (UnaryOp::Sigmoid, -80.0, 30.0, sigmoid, 3.0),
    ];
    for (op, lo, hi, reference, bound) in cases {
        let e = max_ulp_error(op, lo, hi, 1 << 20, reference).unwrap();
        assert!(
            e <= bound,
            "{} on [{lo}, {hi}]: max error {e:.2} ulp > {bound}",
            op.mnemonic()
        );
    }
}

#[test]
fn softmax_rows_compile() {
    let cases = [
        // Prologue (scale by a temperature) and epilogue (scale the probabilities).
        "func @f(%x: f32[37,129], %t: f32[]) -> (f32[37,129]) {
  %s = div %x, %t : f32[37,129]
  %p = softmax %s : f32[37,129]
  %y = mul %p, %t : f32[37,129]
  return %y
}",
        // Rows of 8 with a per-column bias: vector loads within each row.
        "func @f(%x: f32[3,5,8], %b: f32[8]) -> (f32[3,5,8], f32[3,5,8]) {
  %s = add %x, %b : f32[3,5,8]
  %p = softmax %s {axis=2} : f32[3,5,8]
  return %p, %s
}",
        // Rows shorter than the vector width, and one row of one element.
        "func @f(%x: f32[6,3]) -> (f32[6,3]) {\n  %p = softmax %x : f32[6,3]\n  return %p\n}",
        "func @f(%x: f32[1,1]) -> (f32[1,1]) {\n  %p = softmax %x : f32[1,1]\n  return %p\n}",
        // Enough work to split across threads.
        "func @f(%x: f32[512,300]) -> (f32[512,300]) {\n  %p = softmax %x : f32[512,300]\n  return %p\n}",
        // A softmax alone runs on the hand-written AVX2 kernel where the target has it: whole
        // vectors and a masked tail (ViT's rows of 197).
        "func @f(%x: f32[2,12,197]) -> (f32[2,12,197]) {\n  %p = softmax %x {axis=-1} : f32[2,12,197]\n  return %p\n}",
    ];
    for src in cases {
        let f = parse_function(src).unwrap();
        let (got, want, exe) = both(&f, &randoms(&f, 41));
        assert_eq!(exe.stats().reference, 0, "{src}");
        check(&got, &want, 2e-6, 1e-9).unwrap_or_else(|e| panic!("{src}\n{e}"));
    }
    // Large and special values: a huge logit, -inf, and NaN (the NaN row is all NaN).
    let src = "func @f(%x: f32[3,5]) -> (f32[3,5]) {\n  %p = softmax %x : f32[3,5]\n  return %p\n}";
    let f = parse_function(src).unwrap();
    let x = vec![
        1e30,
        0.0,
        -1.0,
        5.0,
        1.0,
        f32::NEG_INFINITY,
        0.0,
        1.0,
        2.0,
        3.0,
        0.0,
        f32::NAN,
        1.0,
        2.0,
        3.0,
    ];
    let (got, want, _) = both(&f, &[Tensor::from_f32(&[3, 5], x).unwrap()]);
    check(&got, &want, 2e-6, 1e-9).unwrap();
    // Rows longer than a vector: a NaN in the masked tail, a row of -inf (NaN: -inf - -inf),
    // and a huge logit among ordinary ones.
    let src =
        "func @f(%x: f32[3,11]) -> (f32[3,11]) {\n  %p = softmax %x : f32[3,11]\n  return %p\n}";
    let f = parse_function(src).unwrap();
    let mut x: Vec<f32> = (0..33).map(|i| (i % 7) as f32 - 3.0).collect();
    x[9] = f32::NAN;
    x[11..22].fill(f32::NEG_INFINITY);
    x[25] = 1e30;
    let (got, want, _) = both(&f, &[Tensor::from_f32(&[3, 11], x).unwrap()]);
    check(&got, &want, 2e-6, 1e-9).unwrap();
    let g = got[0].as_f32().unwrap();
    assert!(g[..22].iter().all(|v| v.is_nan()) && g[25] == 1.0, "{g:?}");
}

#[test]
fn targets_with_features_turned_off_agree() {
    let src = "func @f(%x: f32[1030], %b: f32[1030]) -> (f32[1030]) {
  %s = add %x, %b : f32[1030]
  %t = tanh %s : f32[1030]
  %e = sigmoid %t : f32[1030]
  return %e
}";
    let f = parse_function(src).unwrap();
    let inputs = randoms(&f, 51);
    let want = tcc_ir::interp::run(&f, &inputs).unwrap();
    let host = format!("{}", target_lexicon::Triple::host());
    for spec in [
        "host",
        "host,-fma",
        "host,-fma,-avx2,-avx",
        "host,-sse41,-sse42",
        host.as_str(),
    ] {
        let exe = Executable::compile_for(&f, Some(spec)).unwrap_or_else(|e| panic!("{spec}: {e}"));
        check(&exe.run(&inputs).unwrap(), &want, 1e-6, 1e-7)
            .unwrap_or_else(|e| panic!("{spec}: {e}"));
    }
    let err = |spec: &str| Executable::compile_for(&f, Some(spec)).err().unwrap().0;
    assert!(err("aarch64-unknown-linux-gnu").contains("can only target the host"));
    assert!(err("frobnicator-9000").contains("is not a target triple"));
    assert!(err("host,+avx512f").contains("can only be turned off"));
    assert!(err("host,-warp_drive").contains("unknown CPU feature `warp_drive`"));
}

#[test]
fn reductions_compile() {
    let cases = [
        // Rows: sqrt(mean(x*x)), two accumulators and a tail (37 = 4*8 + 5).
        (
            "func @f(%x: f32[9,37]) -> (f32[9]) {
  %sq = mul %x, %x : f32[9,37]
  %m = reduce_mean %sq {axes=[1]} : f32[9]
  %r = sqrt %m : f32[9]
  return %r
}",
            true,
        ),
        // Columns: the sum over the batch of a bias-added activation, four outputs at a time.
        (
            "func @f(%x: f32[33,10], %b: f32[10]) -> (f32[10]) {
  %z = add %x, %b : f32[33,10]
  %s = reduce_sum %z {axes=[0]} : f32[10]
  return %s
}",
            true,
        ),
        // A middle block of axes with keepdims, and an epilogue reading another input.
        (
            "func @f(%x: f32[2,3,4,5], %c: f32[2,1,1,5]) -> (f32[2,1,1,5]) {
  %m = reduce_max %x {axes=[1,2], keepdims=true} : f32[2,1,1,5]
  %y = sub %m, %c : f32[2,1,1,5]
  return %y
}",
            true,
        ),
        // Short rows take the scalar path; everything reduced gives a scalar.
        (
            "func @f(%x: f32[6,3]) -> (f32[6], f32[]) {
  %s = reduce_sum %x {axes=[-1]} : f32[6]
  %t = reduce_max %x {axes=[0,1]} : f32[]
  return %s, %t
}",
            true,
        ),
        // Large enough to split across threads.
        (
            "func @f(%x: f32[700,200]) -> (f32[700]) {\n  %s = reduce_sum %x {axes=[1]} : f32[700]\n  return %s\n}",
            true,
        ),
        // Axes that are not contiguous run on the native kernel.
        (
            "func @f(%x: f32[2,3,4]) -> (f32[3]) {\n  %s = reduce_sum %x {axes=[0,2]} : f32[3]\n  return %s\n}",
            false,
        ),
    ];
    for (src, compiled) in cases {
        let f = parse_function(src).unwrap();
        let (got, want, exe) = both(&f, &randoms(&f, 61));
        let s = exe.stats();
        assert_eq!((s.reference, s.native == 0), (0, compiled), "{src}");
        // f32 accumulation against the interpreter's f64: up to 200 terms of size up to 1.
        check(&got, &want, 1e-5, 2e-5).unwrap_or_else(|e| panic!("{src}\n{e}"));
    }
    // NaN and -inf propagate through max and sum as in the interpreter.
    let src = "func @f(%x: f32[3,9]) -> (f32[3], f32[3]) {
  %m = reduce_max %x {axes=[1]} : f32[3]
  %s = reduce_sum %x {axes=[1]} : f32[3]
  return %m, %s
}";
    let f = parse_function(src).unwrap();
    let mut x = vec![1.0f32; 27];
    x[3] = f32::NAN;
    x[12] = f32::NEG_INFINITY;
    x[26] = 7.0;
    let (got, want, _) = both(&f, &[Tensor::from_f32(&[3, 9], x).unwrap()]);
    check(&got, &want, 0.0, 0.0).unwrap();
}

/// f64 elementwise kernels compile (the same kernel bodies at `f64` lanes, two to a vector) and
/// match the interpreter bit for bit: every op they may contain is exactly rounded. Operands are
/// read at the output index, as a scalar, as a splat constant and as broadcast blocks (one whose
/// inner extent is not a multiple of two, so that loop runs scalar); sizes leave a tail.
#[test]
fn f64_elementwise_kernels_are_exact() {
    for n in [1u64, 2, 7, 64, 1001] {
        let src = format!(
            "func @f(%x: f64[3, {n}], %y: f64[3, {n}], %b: f64[{n}], %c: f64[3, 1], %s: f64[]) -> (f64[3, {n}], f64[3, {n}]) {{\n\
             \x20 %h = const {{value=0.5}} : f64[]\n\
             \x20 %a = add %x, %b : f64[3, {n}]\n\
             \x20 %m = mul %a, %c : f64[3, {n}]\n\
             \x20 %d = div %m, %y : f64[3, {n}]\n\
             \x20 %q = sqrt %d : f64[3, {n}]\n\
             \x20 %r = relu %q : f64[3, {n}]\n\
             \x20 %g = max %r, %s : f64[3, {n}]\n\
             \x20 %k = min %g, %h : f64[3, {n}]\n\
             \x20 %t = lt %x, %y : bool[3, {n}]\n\
             \x20 %u = select %t, %k, %x : f64[3, {n}]\n\
             \x20 %v = rsqrt %y : f64[3, {n}]\n\
             \x20 %w = neg %v : f64[3, {n}]\n\
             \x20 %z = abs %w : f64[3, {n}]\n\
             \x20 %o = reciprocal %z : f64[3, {n}]\n\
             \x20 return %u, %o\n}}\n"
        );
        let f = parse_function(&src).unwrap_or_else(|e| panic!("{e}"));
        for seed in 0..3 {
            let inputs = randoms(&f, seed);
            let (got, want, exe) = both(&f, &inputs);
            let s = exe.stats();
            assert_eq!((s.compiled, s.reference), (1, 0), "n = {n}");
            for (g, w) in got.iter().zip(&want) {
                let (Data::F64(g), Data::F64(w)) = (g.data(), w.data()) else {
                    panic!("f64 results")
                };
                for (i, (a, b)) in g.iter().zip(w).enumerate() {
                    assert!(
                        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                        "n = {n}, seed {seed}, element {i}: {a} vs {b}"
                    );
                }
            }
        }
    }
}

/// An f64 kernel that uses a transcendental function stays on the reference kernels: the
/// approximations are tuned for f32.
#[test]
fn f64_transcendentals_stay_exact() {
    let f = parse_function(
        "func @f(%x: f64[100]) -> (f64[100]) {\n  %e = exp %x : f64[100]\n  %r = add %e, %x : f64[100]\n  return %r\n}\n",
    )
    .unwrap();
    let (got, want, exe) = both(&f, &randoms(&f, 1));
    assert_eq!(exe.stats().compiled, 0);
    assert_eq!(got, want);
}

/// Integer elementwise kernels compile: `i32` in four-lane loops, and kernels that read or
/// write `i8`/`u8` values (and casts between them) in 32-bit lanes (widened when loaded, wrapped after each op as the
/// interpreter rounds every result to its dtype, narrowed when stored). Results must equal the
/// interpreter's exactly, with wrapping overflow (`i32` products, `u8` differences, `i8`
/// negation of -128) and broadcast, scalar and splat-constant operands; sizes leave a tail.
#[test]
fn integer_elementwise_kernels_are_exact() {
    for n in [1u64, 4, 7, 64, 1003] {
        let src = format!(
            "func @f(%a: i32[2, {n}], %b: i32[{n}], %s: i32[], %p: i8[2, {n}], %q: u8[2, {n}], %r: u8[2, 1]) -> (i32[2, {n}], i8[2, {n}], u8[2, {n}], i32[2, {n}]) {{\n\
             \x20 %k = const {{value=100000}} : i32[]\n\
             \x20 %m = mul %a, %k : i32[2, {n}]\n\
             \x20 %t = add %m, %b : i32[2, {n}]\n\
             \x20 %u = sub %t, %s : i32[2, {n}]\n\
             \x20 %v = max %u, %b : i32[2, {n}]\n\
             \x20 %w = neg %v : i32[2, {n}]\n\
             \x20 %x = abs %w : i32[2, {n}]\n\
             \x20 %y = relu %u : i32[2, {n}]\n\
             \x20 %c = lt %x, %y : bool[2, {n}]\n\
             \x20 %z0 = select %c, %x, %y : i32[2, {n}]\n\
             \x20 %cb = cast %c {{to=i32}} : i32[2, {n}]\n\
             \x20 %z = add %z0, %cb : i32[2, {n}]\n\
             \x20 %e = mul %p, %p : i8[2, {n}]\n\
             \x20 %g = neg %e : i8[2, {n}]\n\
             \x20 %h = sub %q, %r : u8[2, {n}]\n\
             \x20 %j = mul %h, %r : u8[2, {n}]\n\
             \x20 %l = cast %j {{to=i8}} : i8[2, {n}]\n\
             \x20 %o = min %g, %l : i8[2, {n}]\n\
             \x20 %d = cast %o {{to=i32}} : i32[2, {n}]\n\
             \x20 %i = add %d, %z : i32[2, {n}]\n\
             \x20 return %z, %o, %h, %i\n}}\n"
        );
        let f = parse_function(&src).unwrap_or_else(|e| panic!("{e}"));
        for seed in 0..3 {
            let mut rng = Rng::new(seed);
            // Integers across the whole range of each dtype, so that every op overflows.
            let inputs: Vec<Tensor> = f
                .params()
                .iter()
                .map(|&p| {
                    let ty = f.ty(p);
                    let n = ty.numel() as usize;
                    let mut next = || rng.next_u64();
                    let data = match ty.dtype() {
                        tcc_ir::DType::I32 => Data::I32((0..n).map(|_| next() as i32).collect()),
                        tcc_ir::DType::I8 => Data::I8((0..n).map(|_| next() as i8).collect()),
                        tcc_ir::DType::U8 => Data::U8((0..n).map(|_| next() as u8).collect()),
                        d => panic!("no inputs of {d}"),
                    };
                    Tensor::new(ty.clone(), data).unwrap()
                })
                .collect();
            let (got, want, exe) = both(&f, &inputs);
            // The planner cuts kernels where the dtype changes: five kernels, all compiled.
            let s = exe.stats();
            assert_eq!((s.compiled, s.reference), (5, 0), "n = {n}");
            assert_eq!(got, want, "n = {n}, seed {seed}");
        }
    }
}

/// Integer division stays on the reference kernels, which report a zero divisor.
#[test]
fn integer_division_stays_on_the_reference_kernels() {
    let f = parse_function(
        "func @f(%a: i32[8], %b: i32[8]) -> (i32[8]) {\n  %q = div %a, %b : i32[8]\n  %r = add %q, %a : i32[8]\n  return %r\n}\n",
    )
    .unwrap();
    let exe = Executable::compile(&f).unwrap();
    assert_eq!(exe.stats().compiled, 0);
    let a = Tensor::new(f.ty(f.params()[0]).clone(), Data::I32(vec![7; 8])).unwrap();
    let zero = Tensor::new(f.ty(f.params()[1]).clone(), Data::I32(vec![0; 8])).unwrap();
    let err = exe.run(&[a, zero]).unwrap_err().0;
    assert!(err.contains("division by zero"), "{err}");
}

/// An `f32` kernel comparing `i32` values (a one-hot of integer labels, as embedding lookups
/// and losses export): compiled, the integers compared as integers, including values whose bits
/// would be a NaN as floats, against a splat constant and a broadcast one.
#[test]
fn integer_comparisons_in_float_kernels() {
    let src = "func @f(%l: i32[9,1], %x: f32[9,6], %m: i32[9,6]) -> (f32[9,6], f32[9,6]) {
  %c = const {value=[0, 1, 2, 2143289345, -5, 5]} : i32[6]
  %k = const {value=2} : i32[]
  %hit = eq %l, %c : bool[9,6]
  %onehot = cast %hit {to=f32} : f32[9,6]
  %big = lt %m, %k : bool[9,6]
  %z = const {value=0.0} : f32[]
  %y = select %big, %x, %z : f32[9,6]
  return %onehot, %y
}";
    let f = parse_function(src).unwrap();
    let labels = Tensor::new(
        tcc_ir::TensorType::new(tcc_ir::DType::I32, vec![9, 1]).unwrap(),
        Data::I32(vec![0, 2, 2143289345, -5, 5, 7, 1, 2143289346, -2143289345]),
    )
    .unwrap();
    let mut r = randoms(&f, 4);
    let (m, x) = (r.pop().unwrap(), r.pop().unwrap());
    let (got, want, exe) = both(&f, &[labels, x, m]);
    assert_eq!(exe.reference_ops(), Vec::<String>::new());
    check(&got, &want, 0.0, 0.0).unwrap();
    let Data::F32(onehot) = got[0].data() else {
        unreachable!()
    };
    assert_eq!(
        onehot.iter().sum::<f32>(),
        6.0,
        "labels 0, 2, 2143289345, -5, 5, 2 hit"
    );
}

/// A comparison stored by one kernel and read as a mask by others (a scalar condition broadcast
/// over a tensor, a mask returned and reused, as the backward of a `select` reads the
/// forward's): compiled, in the scalar loop, equal to the interpreter.
#[test]
fn masks_cross_kernels_as_bytes() {
    let src = "func @f(%x: f32[6,5], %y: f32[6,5], %s: f32[]) -> (f32[6,5], bool[6,5], f32[6,5], bool[]) {
  %half = const {value=0.5} : f32[]
  %on = gt %s, %half : bool[]
  %a = select %on, %x, %y : f32[6,5]
  %m = lt %x, %y : bool[6,5]
  %t = transpose %y {perm=[1,0]} : f32[5,6]
  %u = transpose %t {perm=[1,0]} : f32[6,5]
  %b = select %m, %u, %x : f32[6,5]
  %c = cast %m {to=f32} : f32[6,5]
  %d = add %b, %c : f32[6,5]
  return %a, %m, %d, %on
}";
    let f = parse_function(src).unwrap();
    for s in [0.25f32, 0.75] {
        let mut inputs = randoms(&f, 8);
        inputs[2] = Tensor::from_f32(&[], vec![s]).unwrap();
        let (got, want, exe) = both(&f, &inputs);
        assert_eq!(
            exe.reference_ops(),
            Vec::<String>::new(),
            "{:?}",
            exe.stats()
        );
        check(&got, &want, 0.0, 0.0).unwrap();
    }
}

/// Layer norm, RMS norm and a softmax written out as ops each run as one row-pass kernel (one
/// step instead of four or five), on every target, and match the interpreter: rows whose length
/// leaves an extra vector and a scalar tail, two trailing axes reduced together, a scale and
/// bias along the row, a per-row input and a scalar one, and the row scalars returned too.
#[test]
fn row_passes_compile() {
    let layer_norm = |rows: u64, len: u64| {
        format!(
            "func @f(%x: f32[{rows},{len}], %g: f32[{len}], %b: f32[{len}]) -> (f32[{rows},{len}]) {{
  %m = reduce_mean %x {{axes=[1], keepdims=true}} : f32[{rows},1]
  %d = sub %x, %m : f32[{rows},{len}]
  %d2 = mul %d, %d : f32[{rows},{len}]
  %v = reduce_mean %d2 {{axes=[1], keepdims=true}} : f32[{rows},1]
  %e = const {{value=0.00001}} : f32[]
  %ve = add %v, %e : f32[{rows},1]
  %i = rsqrt %ve : f32[{rows},1]
  %n = mul %d, %i : f32[{rows},{len}]
  %s = mul %n, %g : f32[{rows},{len}]
  %y = add %s, %b : f32[{rows},{len}]
  return %y
}}"
        )
    };
    let mut cases = vec![
        // Lengths: whole double vectors, an extra vector (100), a scalar tail (99), and
        // enough rows to split across threads.
        layer_norm(37, 96),
        layer_norm(5, 100),
        layer_norm(3, 99),
        layer_norm(600, 768),
        // RMS norm over two trailing axes, scaled along the row, as older exports write it:
        // pow, sqrt and a division.
        "func @f(%x: f32[2,5,7,9], %g: f32[7,9]) -> (f32[2,5,7,9]) {
  %two = const {value=2.0} : f32[]
  %sq = pow %x, %two : f32[2,5,7,9]
  %ms = reduce_mean %sq {axes=[2,3], keepdims=true} : f32[2,5,1,1]
  %e = const {value=0.000001} : f32[]
  %me = add %ms, %e : f32[2,5,1,1]
  %r = sqrt %me : f32[2,5,1,1]
  %n = div %x, %r : f32[2,5,7,9]
  %y = mul %n, %g : f32[2,5,7,9]
  return %y
}"
        .to_string(),
        // A softmax written out, with a temperature (a scalar input) and a per-row mask
        // weight; the max and the sum are returned too.
        "func @f(%x: f32[12,197], %t: f32[], %w: f32[12,1]) -> (f32[12,197], f32[12,1], f32[12,1]) {
  %s = div %x, %t : f32[12,197]
  %mx = reduce_max %s {axes=[1], keepdims=true} : f32[12,1]
  %z = sub %s, %mx : f32[12,197]
  %ez = exp %z : f32[12,197]
  %sum = reduce_sum %ez {axes=[-1], keepdims=true} : f32[12,1]
  %sw = mul %sum, %w : f32[12,1]
  %p = div %ez, %sw : f32[12,197]
  return %p, %mx, %sw
}"
        .to_string(),
    ];
    // The centred values are also returned: the last pass stores two results.
    cases.push(
        layer_norm(9, 64)
            .replace("-> (f32[9,64]) {", "-> (f32[9,64], f32[9,64]) {")
            .replace("return %y", "return %y, %d"),
    );
    for src in &cases {
        let f = parse_function(src).unwrap();
        let inputs = randoms(&f, 71);
        let want = tcc_ir::interp::run(&f, &inputs).unwrap();
        for target in common::TARGETS {
            let exe = common::compile(&f, target, true);
            let s = exe.stats();
            assert_eq!(
                (s.compiled, s.native, s.reference),
                (1, 0, 0),
                "{target:?}\n{src}"
            );
            // f32 sums along rows of up to 768 against the interpreter's.
            check(&exe.run(&inputs).unwrap(), &want, 1e-5, 1e-5)
                .unwrap_or_else(|e| panic!("{target:?}\n{src}\n{e}"));
        }
    }
    // NaN and infinity: a NaN makes its row NaN, and an infinite element gives NaN (inf - inf)
    // where the interpreter's does.
    let f = parse_function(&layer_norm(3, 16)).unwrap();
    let mut x: Vec<f32> = (0..48).map(|i| (i % 5) as f32 - 2.0).collect();
    x[3] = f32::NAN;
    x[20] = f32::INFINITY;
    let g = Tensor::from_f32(&[16], vec![1.5; 16]).unwrap();
    let b = Tensor::from_f32(&[16], vec![0.25; 16]).unwrap();
    let inputs = [Tensor::from_f32(&[3, 16], x).unwrap(), g, b];
    let (got, want, _) = both(&f, &inputs);
    check(&got, &want, 1e-6, 1e-6).unwrap();
    let y = got[0].as_f32().unwrap();
    assert!(y[..32].iter().all(|v| v.is_nan()) && y[32..].iter().all(|v| v.is_finite()));
}

/// Reductions that row passes do not take stay kernels of their own and still match: rows too
/// short, a reduction without `keepdims`, and one over leading axes.
#[test]
fn row_passes_leave_other_reductions() {
    let cases = [
        "func @f(%x: f32[40,4]) -> (f32[40,4]) {
  %m = reduce_mean %x {axes=[1], keepdims=true} : f32[40,1]
  %d = sub %x, %m : f32[40,4]
  return %d
}",
        "func @f(%x: f32[6,32]) -> (f32[6,32]) {
  %m = reduce_max %x {axes=[1]} : f32[6]
  %r = reshape %m {shape=[6,1]} : f32[6,1]
  %d = sub %x, %r : f32[6,32]
  return %d
}",
        "func @f(%x: f32[32,6]) -> (f32[32,6]) {
  %m = reduce_sum %x {axes=[0], keepdims=true} : f32[1,6]
  %d = div %x, %m : f32[32,6]
  return %d
}",
    ];
    for src in cases {
        let f = parse_function(src).unwrap();
        let (got, want, exe) = both(&f, &randoms(&f, 72));
        let s = exe.stats();
        assert_eq!((s.compiled, s.reference), (2, 0), "{src}");
        check(&got, &want, 1e-5, 1e-5).unwrap_or_else(|e| panic!("{src}\n{e}"));
    }
}

/// A random function of the form row passes take, as text: reductions over the rows of
/// `[rows, len]` (sum, mean, max, kept as `[rows, 1]`) and elementwise ops on the row shape
/// and on the row scalars, reading a scale along the row, a per-row input and a scalar one.
/// The last wide value and the last row scalar are returned, with one more wide value now and
/// then (stored by the last pass).
fn random_rows(seed: u64, steps: usize) -> String {
    let mut rng = Rng::new(seed);
    let (rows, len) = (1 + rng.below(24), 8 + rng.below(90));
    let (wt, nt) = (format!("f32[{rows},{len}]"), format!("f32[{rows},1]"));
    let mut body = String::new();
    let mut wide = vec!["%x".to_string()];
    let mut narrow = vec!["%r".to_string()];
    for i in 0..steps {
        let w = rng.pick(&wide).clone();
        let line = match rng.below(6) {
            0 | 1 => {
                let op = *rng.pick(&["reduce_sum", "reduce_mean", "reduce_max"]);
                narrow.push(format!("%n{i}"));
                format!("  %n{i} = {op} {w} {{axes=[1], keepdims=true}} : {nt}\n")
            }
            2 | 3 => {
                let other = match rng.below(4) {
                    0 => rng.pick(&wide).clone(),
                    1 => rng.pick(&narrow).clone(),
                    2 => "%g".to_string(),
                    _ => "%s".to_string(),
                };
                let op = *rng.pick(&["add", "sub", "mul", "max", "min"]);
                wide.push(format!("%w{i}"));
                format!("  %w{i} = {op} {w}, {other} : {wt}\n")
            }
            4 => {
                let op = *rng.pick(&["tanh", "sigmoid", "abs", "neg", "exp"]);
                // exp of something bounded, so that sums stay finite.
                let (pre, arg) = if op == "exp" {
                    (format!("  %t{i} = tanh {w} : {wt}\n"), format!("%t{i}"))
                } else {
                    (String::new(), w)
                };
                wide.push(format!("%w{i}"));
                format!("{pre}  %w{i} = {op} {arg} : {wt}\n")
            }
            _ => {
                let n = rng.pick(&narrow).clone();
                narrow.push(format!("%n{i}"));
                match rng.below(3) {
                    0 => format!(
                        "  %a{i} = abs {n} : {nt}\n  %b{i} = add %a{i}, %s1 : {nt}\n  %n{i} = rsqrt %b{i} : {nt}\n"
                    ),
                    1 => format!("  %n{i} = mul {n}, %r : {nt}\n"),
                    _ => format!("  %n{i} = add {n}, %s : {nt}\n"),
                }
            }
        };
        body.push_str(&line);
    }
    let mut results = vec![wide.last().unwrap().clone(), narrow.last().unwrap().clone()];
    let mut types = vec![wt.clone(), nt.clone()];
    if wide.len() > 2 && rng.chance(0.5) {
        results.push(wide[1].clone());
        types.push(wt.clone());
    }
    format!(
        "func @f(%x: {wt}, %g: f32[{len}], %r: {nt}, %s: f32[]) -> ({}) {{\n  %s1 = const {{value=1.0}} : f32[]\n{body}  return {}\n}}",
        types.join(", "),
        results.join(", ")
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 120, ..ProptestConfig::default() })]

    /// Random chains of reductions over rows and elementwise ops, which row passes merge into
    /// one kernel (or several), match the interpreter on every target.
    #[test]
    fn random_row_passes_match_the_interpreter(seed in any::<u64>(), steps in 2usize..14) {
        let src = random_rows(seed, steps);
        let f = parse_function(&src).map_err(|e| TestCaseError::fail(format!("{e:?}\n{src}")))?;
        let inputs = randoms(&f, seed ^ 1);
        let want = tcc_ir::interp::run(&f, &inputs).unwrap();
        let nudged = tcc_ir::interp::run(&f, &common::perturbed(&inputs, seed ^ 2)).unwrap();
        for target in common::TARGETS {
            let exe = common::compile(&f, target, true);
            prop_assert_eq!(exe.stats().reference, 0);
            let got = exe.run(&inputs).map_err(|e| TestCaseError::fail(format!("{e}\n{src}")))?;
            check_conditioned(&got, &want, &nudged, (1e-4, 1e-5, 4.0))
                .map_err(|e| TestCaseError::fail(format!("{target:?}: {e}\n{src}")))?;
        }
    }
}

//! The PTX backend without a GPU: its kernels run by the emulator against the CPU runtime (bit
//! for bit: both render the kernel layer's bodies with the same operations, fused multiply-add
//! included) and the reference interpreter, and every module assembled by `ptxas` for sm_80 and
//! sm_90 with no spills (`ptxas` from tests/common/ptxas.rs).

mod common;
#[path = "../../tests/common/ptxas.rs"]
mod ptxas;

use common::{check, randoms};
use std::path::Path;
use tcc_codegen::Backend;
use tcc_codegen::ptx::{Module, Ptx};
use tcc_ir::random::Rng;
use tcc_ir::{Data, Function, Tensor, parse_function};

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

fn module(f: &Function, sm: u32) -> Module {
    tcc_codegen::compile(&Ptx { sm }, f).unwrap_or_else(|e| panic!("{f}\n{e}"))
}

fn emulate(f: &Function, inputs: &[Tensor]) -> Vec<Tensor> {
    Ptx::default()
        .run(&module(f, 80), inputs)
        .unwrap_or_else(|e| panic!("{f}\n{e}"))
}

/// Every element's bits equal, or both NaN (payloads may differ).
fn same_bits(got: &[Tensor], want: &[Tensor]) -> Result<(), String> {
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        if g.ty() != w.ty() {
            return Err(format!("result {k}: {} against {}", g.ty(), w.ty()));
        }
        let bad = match (g.data(), w.data()) {
            (Data::F32(a), Data::F32(b)) => (a.iter().zip(b))
                .position(|(x, y)| x.to_bits() != y.to_bits() && !(x.is_nan() && y.is_nan())),
            (Data::F64(a), Data::F64(b)) => (a.iter().zip(b))
                .position(|(x, y)| x.to_bits() != y.to_bits() && !(x.is_nan() && y.is_nan())),
            (a, b) => (a != b).then_some(0),
        };
        if let Some(i) = bad {
            return Err(format!(
                "result {k} differs at element {i}: {g:?} against {w:?}"
            ));
        }
    }
    Ok(())
}

/// The emulated kernels against the CPU runtime, bit for bit, and the interpreter within
/// `rtol`/`atol`.
fn agree(f: &Function, inputs: &[Tensor], rtol: f64, atol: f64) {
    let got = emulate(f, inputs);
    let jit = tcc_codegen::Executable::compile(f)
        .unwrap()
        .run(inputs)
        .unwrap();
    same_bits(&got, &jit).unwrap_or_else(|e| panic!("{f}\nagainst the CPU runtime: {e}"));
    let want = tcc_ir::interp::run(f, inputs).unwrap();
    check(&got, &want, rtol, atol).unwrap_or_else(|e| panic!("{f}\nagainst the interpreter: {e}"));
}

/// `f` is one kernel for the GPU, and its results in the emulator agree with the
/// interpreter's within `rtol`/`atol`.
fn one_kernel_agrees(f: &Function, inputs: &[Tensor], rtol: f64, atol: f64) -> Result<(), String> {
    let m = module(f, 80);
    if m.kernels.len() != 1 {
        return Err(format!("not one kernel:\n{}", m.manifest()));
    }
    let got = emulate(f, inputs);
    let want = tcc_ir::interp::run(f, inputs).unwrap();
    check(&got, &want, rtol, atol)
}

/// Values where functions change behaviour: zeros of both signs, infinities, NaN, tiny and
/// huge numbers, the edges of exp's range.
fn special() -> Vec<f32> {
    vec![
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        -0.5,
        1e-8,
        -1e-8,
        0.624,
        -0.63,
        2.5,
        -2.5,
        3.0,
        -9.5,
        20.0,
        88.5,
        88.8,
        -87.0,
        -103.0,
        -110.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MIN_POSITIVE,
        1e-40,
        1e30,
        -1e30,
        7.25,
    ]
}

/// The functions every property below runs, with their inputs: each unary, binary,
/// comparison and cast on special values, broadcasts, integer and f64 kernels. Also what the
/// `ptxas` test assembles.
fn cases() -> Vec<(String, Function, Vec<Tensor>)> {
    let xs = special();
    let n = xs.len();
    let mut ys = xs.clone();
    ys.rotate_left(5);
    let x = Tensor::from_f32(&[n as u64], xs).unwrap();
    let y = Tensor::from_f32(&[n as u64], ys).unwrap();
    let mut out = Vec::new();
    let mut add = |name: String, src: String, inputs: Vec<Tensor>| {
        let f = parse_function(&src).unwrap_or_else(|e| panic!("{src}\n{e:?}"));
        out.push((name, f, inputs));
    };
    // Each unary op times a parameter of ones: a kernel of two ops, which the CPU compiles
    // from the same body (an op alone may run on a hand-written kernel there instead).
    let ones = Tensor::from_f32(&[n as u64], vec![1.0; n]).unwrap();
    for u in tcc_ir::UnaryOp::ALL {
        let op = tcc_ir::OpKind::Unary(u).mnemonic();
        add(
            op.to_string(),
            format!(
                "func @f(%x: f32[{n}], %one: f32[{n}]) -> (f32[{n}]) {{
  %y = {op} %x : f32[{n}]
  %z = mul %y, %one : f32[{n}]
  return %z
}}"
            ),
            vec![x.clone(), ones.clone()],
        );
    }
    for op in ["add", "sub", "mul", "div", "max", "min"] {
        add(
            op.to_string(),
            format!(
                "func @f(%x: f32[{n}], %y: f32[{n}]) -> (f32[{n}]) {{\n  %z = {op} %x, %y : f32[{n}]\n  return %z\n}}"
            ),
            vec![x.clone(), y.clone()],
        );
    }
    for cmp in ["eq", "ne", "lt", "le", "gt", "ge"] {
        add(
            format!("cmp {cmp}"),
            format!(
                "func @f(%x: f32[{n}], %y: f32[{n}]) -> (f32[{n}], bool[{n}]) {{
  %m = {cmp} %x, %y : bool[{n}]
  %z = select %m, %x, %y : f32[{n}]
  return %z, %m
}}"
            ),
            vec![x.clone(), y.clone()],
        );
    }
    // Broadcasts of every access pattern, at sizes that are not multiples of anything.
    let mut rng = Rng::new(7);
    for (big, small) in [
        ("f32[5,7]", "f32[7]"),
        ("f32[2,16,5,5]", "f32[16,1,1]"),
        ("f32[4,9]", "f32[4,1]"),
        ("f32[3,4]", "f32[1,1]"),
        ("f32[3,4,5]", "f32[3,1,5]"),
        ("f32[2,3,6,4]", "f32[2,1,6,1]"),
        ("f32[1027]", "f32[]"),
    ] {
        let src = format!(
            "func @f(%x: {big}, %b: {small}) -> ({big}) {{
  %s = add %x, %b : {big}
  %t = tanh %s : {big}
  %y = mul %t, %b : {big}
  return %y
}}"
        );
        let f = parse_function(&src).unwrap();
        let inputs = randoms(&f, rng.next_u64());
        add(format!("broadcast {big} {small}"), src, inputs);
        drop(f);
    }
    // A constant from memory and an inlined splat.
    add(
        "constants".into(),
        "func @f(%x: f32[4]) -> (f32[4]) {
  %c = const {value=[1.0, -2.0, 3.5, 0.25]} : f32[4]
  %h = const {value=0.5} : f32[]
  %a = mul %x, %c : f32[4]
  %y = add %a, %h : f32[4]
  return %y
}"
        .into(),
        vec![Tensor::from_f32(&[4], vec![1.0, 2.0, -3.0, 8.0]).unwrap()],
    );
    // Integers: wrapping arithmetic on i32, i8 and u8; casts between them and floats.
    for (t, vals) in [
        (
            "i32",
            Data::I32(vec![0, 1, -1, i32::MAX, i32::MIN, 77, -1000, 5]),
        ),
        ("i8", Data::I8(vec![0, 1, -1, 127, -128, 77, -100, 5])),
        ("i8", Data::I8(vec![3, 1, -1, 127, -128, 77, -100, 5])),
    ] {
        let a = Tensor::from_data(&[8], vals).unwrap();
        let mut b = a.clone();
        if let Data::I32(v) = b.data() {
            let mut v = v.clone();
            v.rotate_left(3);
            b = Tensor::from_data(&[8], Data::I32(v)).unwrap();
        }
        add(
            format!("integers {t}"),
            format!(
                "func @f(%a: {t}[8], %b: {t}[8]) -> ({t}[8], {t}[8]) {{
  %s = add %a, %b : {t}[8]
  %p = mul %s, %a : {t}[8]
  %m = max %p, %b : {t}[8]
  %n = neg %m : {t}[8]
  return %n, %p
}}"
            ),
            vec![a, b],
        );
    }
    // A mask cast to a number.
    add(
        "mask cast".into(),
        format!(
            "func @f(%x: f32[{n}], %y: f32[{n}]) -> (f32[{n}]) {{
  %m = lt %x, %y : bool[{n}]
  %c = cast %m {{to=f32}} : f32[{n}]
  %z = add %c, %x : f32[{n}]
  return %z
}}"
        ),
        vec![x.clone(), y.clone()],
    );
    // f64: exact arithmetic, no transcendental functions (those stay on the reference).
    let xd = Tensor::from_data(
        &[6],
        Data::F64(vec![0.0, -0.0, 1.5, -2.25, f64::NAN, 1e300]),
    )
    .unwrap();
    add(
        "f64".into(),
        "func @f(%x: f64[6]) -> (f64[6]) {
  %a = mul %x, %x : f64[6]
  %b = sub %a, %x : f64[6]
  %c = sqrt %a : f64[6]
  %d = div %b, %c : f64[6]
  %y = min %d, %x : f64[6]
  return %y
}"
        .into(),
        vec![xd],
    );
    out
}

#[test]
fn every_case_matches_the_cpu_bit_for_bit() {
    for (name, f, inputs) in cases() {
        let got = emulate(&f, &inputs);
        let jit = tcc_codegen::Executable::compile(&f)
            .unwrap()
            .run(&inputs)
            .unwrap();
        same_bits(&got, &jit).unwrap_or_else(|e| panic!("{name}: {e}\n{f}"));
        // And the interpreter, within the CPU backend's tolerances (docs/perf.md: the
        // polynomial exp and its users are within a few ulp; erf and gelu within 1e-6
        // absolute; NaN and infinities must match exactly).
        let atol = if ["erf", "gelu"].contains(&name.as_str()) {
            1e-6
        } else {
            1e-30
        };
        let want = tcc_ir::interp::run(&f, &inputs).unwrap();
        check(&got, &want, 1e-6, atol).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

/// A random chain of elementwise ops on shapes that broadcast into `[a, b, c]`.
fn random_elementwise(seed: u64) -> Function {
    let mut rng = Rng::new(seed);
    let dims = [1 + rng.below(5), 1 + rng.below(9), 1 + rng.below(40)];
    let full = format!("f32[{},{},{}]", dims[0], dims[1], dims[2]);
    let shapes = [
        full.clone(),
        format!("f32[{}]", dims[2]),
        format!("f32[{},1,1]", dims[0]),
        format!("f32[{},1]", dims[1]),
        "f32[]".to_string(),
    ];
    let mut params = vec![("%p0".to_string(), full.clone())];
    let mut vals = vec!["%p0".to_string()];
    let mut body = String::new();
    let unary = [
        "neg", "abs", "tanh", "sigmoid", "exp", "relu", "floor", "gelu", "erf",
    ];
    let binary = ["add", "sub", "mul", "max", "min", "div"];
    for i in 0..2 + rng.below(10) {
        let a = rng.pick(&vals).clone();
        let v = format!("%v{i}");
        if rng.chance(0.4) {
            let op = rng.pick(&unary);
            body += &format!("  {v} = {op} {a} : {full}\n");
        } else {
            let b = if rng.chance(0.5) {
                rng.pick(&vals).clone()
            } else {
                let p = format!("%p{}", params.len());
                params.push((p.clone(), rng.pick(&shapes).clone()));
                p
            };
            let op = rng.pick(&binary);
            body += &format!("  {v} = {op} {a}, {b} : {full}\n");
        }
        vals.push(v);
    }
    let last = vals.last().unwrap();
    let ps: Vec<String> = params.iter().map(|(p, t)| format!("{p}: {t}")).collect();
    let src = format!(
        "func @r({}) -> ({full}) {{\n{body}  return {last}\n}}\n",
        ps.join(", ")
    );
    parse_function(&src).unwrap_or_else(|e| panic!("{src}\n{e:?}"))
}

#[test]
fn random_elementwise_functions_match() {
    for seed in 0..60 {
        let f = random_elementwise(seed);
        let inputs = randoms(&f, seed ^ 5);
        agree(&f, &inputs, 1e-4, 1e-5);
    }
}

/// Reductions with a thread per output (short rows) and a block per output (a tree in shared
/// memory), over leading, middle and trailing axes, with prologues and epilogues: against the
/// interpreter (sums in another order than the CPU's, so within rounding) and, for maxima,
/// the CPU bit for bit.
#[test]
fn reductions_match() {
    let cases = [
        // (input, reduce op and attributes, output): thread per output, rows.
        ("f32[9,7]", "reduce_sum %p {axes=[1]}", "f32[9]"),
        // A block per output: a row of 1000, b = 1.
        ("f32[3,1000]", "reduce_mean %p {axes=[1]}", "f32[3]"),
        ("f32[2,700,5]", "reduce_max %p {axes=[1]}", "f32[2,5]"),
        (
            "f32[2,3,4,5]",
            "reduce_max %p {axes=[1,2], keepdims=true}",
            "f32[2,1,1,5]",
        ),
        ("f32[300,2]", "reduce_sum %p {axes=[0]}", "f32[2]"),
        ("f32[257,3]", "reduce_mean %p {axes=[0,1]}", "f32[]"),
        ("f32[5000]", "reduce_sum %p {axes=[0]}", "f32[]"),
    ];
    for (i, (input, red, out)) in cases.iter().enumerate() {
        // A prologue (square, a bias), then an epilogue (sqrt of the result plus one).
        let src = format!(
            "func @f(%x: {input}, %c: f32[]) -> ({out}) {{
  %q = mul %x, %x : {input}
  %p = add %q, %c : {input}
  %r = {red} : {out}
  %s = add %r, %c : {out}
  %y = sqrt %s : {out}
  return %y
}}"
        );
        let f = parse_function(&src).unwrap();
        let inputs = randoms(&f, i as u64);
        one_kernel_agrees(&f, &inputs, 2e-6, 1e-7).unwrap_or_else(|e| panic!("{red}: {e}"));
        if red.starts_with("reduce_max") {
            let jit = tcc_codegen::Executable::compile(&f)
                .unwrap()
                .run(&inputs)
                .unwrap();
            same_bits(&emulate(&f, &inputs), &jit).unwrap_or_else(|e| panic!("{red}: {e}"));
        }
    }
    // Axes that are not contiguous (a bias's gradient: every axis but the channels): a
    // thread per output walking the reduced positions.
    for red in [
        "reduce_sum %x {axes=[0,2,3]} : f32[3]",
        "reduce_mean %x {axes=[0,2], keepdims=true} : f32[1,3,1,5]",
        "reduce_max %x {axes=[3,1]} : f32[2,4]",
    ] {
        let src = format!(
            "func @f(%x: f32[2,3,4,5]) -> ({}) {{\n  %r = {red}\n  return %r\n}}",
            red.rsplit(" : ").next().unwrap()
        );
        let f = parse_function(&src).unwrap();
        let inputs = randoms(&f, 8);
        let got = emulate(&f, &inputs);
        let want = tcc_ir::interp::run(&f, &inputs).unwrap();
        check(&got, &want, 1e-6, 1e-7).unwrap_or_else(|e| panic!("{red}: {e}"));
    }
    // NaN and infinities in a maximum and a sum.
    let f = parse_function(
        "func @f(%x: f32[4,100]) -> (f32[4], f32[4]) {
  %m = reduce_max %x {axes=[1]} : f32[4]
  %s = reduce_sum %x {axes=[1]} : f32[4]
  return %m, %s
}",
    )
    .unwrap();
    let mut xs = vec![1.0f32; 400];
    xs[5] = f32::NAN;
    xs[150] = f32::INFINITY;
    xs[250] = f32::NEG_INFINITY;
    xs[399] = -3.0;
    let x = Tensor::from_f32(&[4, 100], xs).unwrap();
    let got = emulate(&f, std::slice::from_ref(&x));
    let want = tcc_ir::interp::run(&f, &[x]).unwrap();
    check(&got, &want, 1e-6, 0.0).unwrap();
}

/// Matmuls of every edge case against the interpreter: tiles cut by the matrix's edges,
/// several tiles, batches, broadcast batches, transposes the plan folds (read with swapped
/// strides), and the fused epilogue (a bias, relu, a residual).
#[test]
fn matmuls_match() {
    let cases = [
        ("f32[7,13]", "f32[13,9]", "f32[7,9]"),
        ("f32[64,64]", "f32[64,64]", "f32[64,64]"),
        ("f32[130,70]", "f32[70,65]", "f32[130,65]"),
        ("f32[1,300]", "f32[300,3]", "f32[1,3]"),
        ("f32[2,3,5,8]", "f32[8,6]", "f32[2,3,5,6]"),
        ("f32[3,1,5,8]", "f32[4,8,6]", "f32[3,4,5,6]"),
    ];
    for (i, (x, w, y)) in cases.iter().enumerate() {
        let n = y.trim_end_matches(']').rsplit(',').next().unwrap();
        let src = format!(
            "func @f(%x: {x}, %w: {w}, %b: f32[{n}], %res: {y}) -> ({y}) {{
  %m = matmul %x, %w : {y}
  %a = add %m, %b : {y}
  %r = relu %a : {y}
  %o = add %r, %res : {y}
  return %o
}}"
        );
        let f = parse_function(&src).unwrap();
        let inputs = randoms(&f, 40 + i as u64);
        one_kernel_agrees(&f, &inputs, 1e-5, 1e-5).unwrap_or_else(|e| panic!("{x} @ {w}: {e}"));
    }
    // Transposes only matmuls read: folded, read from their sources with swapped strides.
    let f = parse_function(
        "func @f(%xt: f32[13,70], %w: f32[65,13]) -> (f32[70,65]) {
  %x = transpose %xt {perm=[1,0]} : f32[70,13]
  %wt = transpose %w {perm=[1,0]} : f32[13,65]
  %y = matmul %x, %wt : f32[70,65]
  return %y
}",
    )
    .unwrap();
    let inputs = randoms(&f, 3);
    let m = module(&f, 80);
    assert_eq!(
        m.kernels.len(),
        1,
        "both transposes folded:\n{}",
        m.manifest()
    );
    let got = emulate(&f, &inputs);
    let want = tcc_ir::interp::run(&f, &inputs).unwrap();
    check(&got, &want, 1e-5, 1e-5).unwrap();
    // Infinities in the last column of A and the last row of B (k = 13, a slice of 8 runs
    // past it): the slice's tail must add zeros, not an infinity times 0.
    let f = parse_function(
        "func @f(%x: f32[9,13], %w: f32[13,10]) -> (f32[9,10]) {
  %y = matmul %x, %w : f32[9,10]
  return %y
}",
    )
    .unwrap();
    let mut inputs = randoms(&f, 5);
    for (t, stride, len) in [(0, 13, 9), (1, 1, 10)] {
        let mut v = inputs[t].as_f32().unwrap().to_vec();
        for e in 0..len {
            // A's column 12, B's row 12.
            let at = if t == 0 { e * stride + 12 } else { 12 * 10 + e };
            v[at] = f32::INFINITY;
        }
        inputs[t] = Tensor::from_f32(inputs[t].dims(), v).unwrap();
    }
    let got = emulate(&f, &inputs);
    let want = tcc_ir::interp::run(&f, &inputs).unwrap();
    check(&got, &want, 1e-5, 1e-5).unwrap();
    // A product stored as well as its epilogue's result.
    let f = parse_function(
        "func @f(%x: f32[5,4], %w: f32[4,3]) -> (f32[5,3], f32[5,3]) {
  %y = matmul %x, %w : f32[5,3]
  %t = tanh %y : f32[5,3]
  return %y, %t
}",
    )
    .unwrap();
    let inputs = randoms(&f, 4);
    let got = emulate(&f, &inputs);
    let want = tcc_ir::interp::run(&f, &inputs).unwrap();
    check(&got, &want, 1e-5, 1e-6).unwrap();
}

/// Softmax and log-softmax rows, a thread per row (short rows) and a block per row (long
/// ones), with a prologue and an epilogue, against the interpreter within the CPU's
/// tolerance; huge, infinite and NaN inputs (a NaN row is all NaN, as is a row of -inf).
#[test]
fn softmax_rows_match() {
    for (i, ty) in [
        "f32[9,10]",
        "f32[3,1000]",
        "f32[2,3,70]",
        "f32[1,64]",
        "f32[1,1]",
    ]
    .iter()
    .enumerate()
    {
        for op in ["softmax", "log_softmax"] {
            let src = format!(
                "func @f(%x: {ty}, %t: f32[]) -> ({ty}) {{
  %s = div %x, %t : {ty}
  %p = {op} %s {{axis=-1}} : {ty}
  %y = mul %p, %t : {ty}
  return %y
}}"
            );
            let f = parse_function(&src).unwrap();
            let inputs = randoms(&f, 41 + i as u64);
            one_kernel_agrees(&f, &inputs, 2e-6, 1e-9).unwrap_or_else(|e| panic!("{op} {ty}: {e}"));
        }
    }
    // Over an axis that is not the last: a thread per row, its elements apart.
    for (op, axis) in [("softmax", 0), ("log_softmax", 1), ("softmax", -2)] {
        let src = format!(
            "func @f(%x: f32[3,5,4]) -> (f32[3,5,4]) {{\n  %p = {op} %x {{axis={axis}}} : f32[3,5,4]\n  return %p\n}}"
        );
        let f = parse_function(&src).unwrap();
        let inputs = randoms(&f, 9);
        let got = emulate(&f, &inputs);
        let want = tcc_ir::interp::run(&f, &inputs).unwrap();
        check(&got, &want, 2e-6, 1e-9).unwrap_or_else(|e| panic!("{op} axis {axis}: {e}"));
    }
    for len in [11, 100] {
        let src = format!(
            "func @f(%x: f32[3,{len}]) -> (f32[3,{len}]) {{\n  %p = softmax %x {{axis=1}} : f32[3,{len}]\n  return %p\n}}"
        );
        let f = parse_function(&src).unwrap();
        let mut x: Vec<f32> = (0..3 * len).map(|i| (i % 7) as f32 - 3.0).collect();
        x[9] = f32::NAN;
        x[len..2 * len].fill(f32::NEG_INFINITY);
        x[2 * len + 3] = 1e30;
        let x = Tensor::from_f32(&[3, len as u64], x).unwrap();
        let got = emulate(&f, std::slice::from_ref(&x));
        let want = tcc_ir::interp::run(&f, &[x]).unwrap();
        check(&got, &want, 2e-6, 1e-9).unwrap_or_else(|e| panic!("{len}: {e}"));
        let g = got[0].as_f32().unwrap();
        assert!(g[..2 * len].iter().all(|v| v.is_nan()) && g[2 * len + 3] == 1.0);
    }
}

/// Convolutions as implicit GEMMs against the interpreter: padding (asymmetric too), strides,
/// dilation, groups, depthwise, 1x1, a batch, and the fused epilogue (a per-channel bias and
/// relu).
#[test]
fn convolutions_match() {
    let cases = [
        (
            "f32[1,3,8,8]",
            "f32[4,3,3,3]",
            "{pads=[1,1,1,1]}",
            "f32[1,4,8,8]",
        ),
        (
            "f32[2,4,9,9]",
            "f32[6,2,3,3]",
            "{strides=[2,2], pads=[1,1,1,1], groups=2}",
            "f32[2,6,5,5]",
        ),
        (
            "f32[1,5,10,10]",
            "f32[5,1,3,3]",
            "{pads=[1,1,1,1], groups=5}",
            "f32[1,5,10,10]",
        ),
        (
            "f32[1,3,11,9]",
            "f32[2,3,3,3]",
            "{dilations=[2,2], pads=[2,1,0,3]}",
            "f32[1,2,9,9]",
        ),
        ("f32[2,70,5,5]", "f32[65,70,1,1]", "", "f32[2,65,5,5]"),
        (
            "f32[1,2,7,7]",
            "f32[3,2,5,5]",
            "{strides=[3,2]}",
            "f32[1,3,1,2]",
        ),
    ];
    for (i, (x, w, attrs, y)) in cases.iter().enumerate() {
        let oc = w.trim_start_matches("f32[").split(',').next().unwrap();
        let src = format!(
            "func @f(%x: {x}, %w: {w}, %b: f32[{oc},1,1]) -> ({y}) {{
  %c = conv2d %x, %w {attrs} : {y}
  %a = add %c, %b : {y}
  %r = relu %a : {y}
  return %r
}}"
        );
        let f = parse_function(&src).unwrap_or_else(|e| panic!("{src}\n{e:?}"));
        let inputs = randoms(&f, 60 + i as u64);
        one_kernel_agrees(&f, &inputs, 1e-5, 1e-5)
            .unwrap_or_else(|e| panic!("{x} * {w} {attrs}: {e}"));
    }
}

/// Transposes, slices (negative starts and steps) and concatenations move every dtype bit
/// for bit; casts convert exactly as the interpreter does (saturating float-to-integer casts,
/// wrapping integer ones, NaN to 0 and to true).
#[test]
fn data_movement_and_casts_match() {
    let srcs = [
        "func @f(%x: f32[2,3,4]) -> (f32[4,2,3]) {\n  %y = transpose %x {perm=[2,0,1]} : f32[4,2,3]\n  return %y\n}",
        "func @f(%x: i32[2,3,4,5]) -> (i32[5,3,2,4]) {\n  %y = transpose %x {perm=[3,1,0,2]} : i32[5,3,2,4]\n  return %y\n}",
        "func @f(%x: u8[7,9]) -> (u8[9,7]) {\n  %y = transpose %x {perm=[1,0]} : u8[9,7]\n  return %y\n}",
        "func @f(%x: f32[10,8]) -> (f32[3,4]) {\n  %y = slice %x {starts=[1,-1], ends=[8,0], steps=[3,-2]} : f32[3,4]\n  return %y\n}",
        "func @f(%x: i64[6]) -> (i64[3]) {\n  %y = slice %x {starts=[0], ends=[6], steps=[2]} : i64[3]\n  return %y\n}",
        "func @f(%a: f32[2,3,4], %b: f32[2,1,4], %c: f32[2,2,4]) -> (f32[2,6,4]) {\n  %y = concat %a, %b, %c {axis=1} : f32[2,6,4]\n  return %y\n}",
        "func @f(%a: i32[3,2], %b: i32[3,5]) -> (i32[3,9]) {\n  %y = concat %a, %b, %a {axis=-1} : i32[3,9]\n  return %y\n}",
    ];
    for src in srcs {
        let f = parse_function(src).unwrap();
        let inputs = randoms(&f, 9);
        let got = emulate(&f, &inputs);
        let want = tcc_ir::interp::run(&f, &inputs).unwrap();
        same_bits(&got, &want).unwrap_or_else(|e| panic!("{src}\n{e}"));
    }
    let xs = special();
    let n = xs.len();
    let x = Tensor::from_f32(&[n as u64], xs).unwrap();
    for to in ["i32", "i8", "u8", "bool", "f64"] {
        let src = format!(
            "func @f(%x: f32[{n}]) -> ({to}[{n}]) {{\n  %y = cast %x {{to={to}}} : {to}[{n}]\n  return %y\n}}"
        );
        let f = parse_function(&src).unwrap();
        let got = emulate(&f, std::slice::from_ref(&x));
        let want = tcc_ir::interp::run(&f, std::slice::from_ref(&x)).unwrap();
        same_bits(&got, &want).unwrap_or_else(|e| panic!("f32 -> {to}: {e}"));
    }
    let ints = Tensor::from_data(&[6], Data::I32(vec![0, -1, 300, -129, 255, i32::MAX])).unwrap();
    for to in ["f32", "i8", "u8", "bool", "f64"] {
        let src = format!(
            "func @f(%x: i32[6]) -> ({to}[6]) {{\n  %y = cast %x {{to={to}}} : {to}[6]\n  return %y\n}}"
        );
        let f = parse_function(&src).unwrap();
        let got = emulate(&f, std::slice::from_ref(&ints));
        let want = tcc_ir::interp::run(&f, std::slice::from_ref(&ints)).unwrap();
        same_bits(&got, &want).unwrap_or_else(|e| panic!("i32 -> {to}: {e}"));
    }
    for (from, data) in [
        ("u8", Data::U8(vec![0, 1, 200, 255])),
        ("i8", Data::I8(vec![0, -1, -128, 127])),
        ("bool", Data::Bool(vec![true, false, false, true])),
    ] {
        let t = Tensor::from_data(&[4], data).unwrap();
        for to in ["f32", "i32"] {
            let src = format!(
                "func @f(%x: {from}[4]) -> ({to}[4]) {{\n  %y = cast %x {{to={to}}} : {to}[4]\n  return %y\n}}"
            );
            let f = parse_function(&src).unwrap();
            let got = emulate(&f, std::slice::from_ref(&t));
            let want = tcc_ir::interp::run(&f, std::slice::from_ref(&t)).unwrap();
            same_bits(&got, &want).unwrap_or_else(|e| panic!("{from} -> {to}: {e}"));
        }
    }
}

/// Max and average pooling (padding, strides, both divisors) and global average pooling.
#[test]
fn pooling_matches() {
    let srcs = [
        "func @f(%x: f32[2,3,9,9]) -> (f32[2,3,5,5]) {\n  %y = max_pool2d %x {kernel=[3,3], strides=[2,2], pads=[1,1,1,1]} : f32[2,3,5,5]\n  return %y\n}",
        "func @f(%x: f32[1,2,8,7]) -> (f32[1,2,4,3]) {\n  %y = avg_pool2d %x {kernel=[2,3], strides=[2,2], pads=[0,0,0,0]} : f32[1,2,4,3]\n  return %y\n}",
        "func @f(%x: f32[1,2,5,5]) -> (f32[1,2,3,3]) {\n  %y = avg_pool2d %x {kernel=[3,3], strides=[2,2], pads=[1,1,1,1]} : f32[1,2,3,3]\n  return %y\n}",
        "func @f(%x: f32[1,2,5,5]) -> (f32[1,2,3,3]) {\n  %y = avg_pool2d %x {kernel=[3,3], strides=[2,2], pads=[1,1,1,1], count_include_pad=true} : f32[1,2,3,3]\n  return %y\n}",
        "func @f(%x: f32[2,5,7,7]) -> (f32[2,5,1,1]) {\n  %y = global_avg_pool %x : f32[2,5,1,1]\n  return %y\n}",
    ];
    for src in srcs {
        let f = parse_function(src).unwrap_or_else(|e| panic!("{src}\n{e:?}"));
        let mut inputs = randoms(&f, 12);
        // A NaN wins a maximum; padding never does (all-negative windows at the edges).
        let mut v = inputs[0].as_f32().unwrap().to_vec();
        v.iter_mut().for_each(|x| *x -= 2.0);
        v[4] = f32::NAN;
        inputs[0] = Tensor::from_f32(inputs[0].dims(), v).unwrap();
        let got = emulate(&f, &inputs);
        let want = tcc_ir::interp::run(&f, &inputs).unwrap();
        check(&got, &want, 1e-6, 1e-7).unwrap_or_else(|e| panic!("{src}\n{e}"));
    }
}

/// Softmax cross-entropy: rows spread over one block's threads (more rows than threads too),
/// against the interpreter; a label out of range gives NaN.
#[test]
fn cross_entropy_matches() {
    for (rows, classes) in [(7u64, 3u64), (600, 10)] {
        let src = format!(
            "func @f(%x: f32[{rows},{classes}], %l: i32[{rows}], %s: f32[]) -> (f32[]) {{
  %y = softmax_cross_entropy %x, %l : f32[]
  %z = mul %y, %s : f32[]
  return %z
}}"
        );
        let f = parse_function(&src).unwrap();
        let mut inputs = randoms(&f, rows);
        let labels: Vec<i32> = (0..rows as i32)
            .map(|i| (i * 7 + 3) % classes as i32)
            .collect();
        inputs[1] = Tensor::from_data(&[rows], Data::I32(labels.clone())).unwrap();
        let got = emulate(&f, &inputs);
        let want = tcc_ir::interp::run(&f, &inputs).unwrap();
        check(&got, &want, 1e-5, 1e-6).unwrap_or_else(|e| panic!("{rows}x{classes}: {e}"));
        let mut bad = labels;
        bad[2] = classes as i32;
        inputs[1] = Tensor::from_data(&[rows], Data::I32(bad)).unwrap();
        let got = emulate(&f, &inputs);
        assert!(got[0].as_f32().unwrap()[0].is_nan());
    }
    // i64 labels; negative and huge ones are out of range.
    let f = parse_function(
        "func @f(%x: f32[5,4], %l: i64[5]) -> (f32[]) {
  %y = softmax_cross_entropy %x, %l : f32[]
  return %y
}",
    )
    .unwrap();
    let x = randoms(&f, 8).remove(0);
    let labels = Tensor::from_data(&[5], Data::I64(vec![0, 3, 2, 1, 3])).unwrap();
    let inputs = vec![x.clone(), labels];
    let got = emulate(&f, &inputs);
    let want = tcc_ir::interp::run(&f, &inputs).unwrap();
    check(&got, &want, 1e-5, 1e-6).unwrap();
    for bad in [-1i64, 1 << 32] {
        let labels = Tensor::from_data(&[5], Data::I64(vec![0, 3, bad, 1, 3])).unwrap();
        let got = emulate(&f, &[x.clone(), labels]);
        assert!(got[0].as_f32().unwrap()[0].is_nan(), "label {bad}");
    }
}

/// Random inputs for an example, its integer inputs (labels) 0 and 1 in turn: within every
/// example's classes.
fn example_inputs(f: &Function) -> Vec<Tensor> {
    let mut inputs = randoms(f, 17);
    for (t, &p) in inputs.iter_mut().zip(f.params()) {
        let n = t.ty().numel();
        let data = match t.data() {
            Data::I32(_) => Data::I32((0..n as i32).map(|i| i % 2).collect()),
            Data::I64(_) => Data::I64((0..n as i64).map(|i| i % 2).collect()),
            _ => continue,
        };
        *t = Tensor::new(f.ty(p).clone(), data).unwrap();
    }
    inputs
}

/// Every example, whole, in the emulator against the interpreter.
#[test]
fn examples_run_in_the_emulator() {
    for name in ["elementwise", "mlp", "spirals_mlp", "digits_cnn"] {
        let path = Path::new(ROOT).join(format!("examples/{name}.tir"));
        let text = std::fs::read_to_string(&path).unwrap();
        let m = tcc_ir::parse_module(&text).unwrap();
        for f in &m.functions {
            let inputs = example_inputs(f);
            let got = emulate(f, &inputs);
            let want = tcc_ir::interp::run(f, &inputs).unwrap();
            // Dot products of 784 terms in f32: the random-function tolerance of the CPU tests.
            check(&got, &want, 1e-4, 1e-5).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }
}

/// Gathers (axes 0 and 1, i32 and i64 indices, negative ones counting from the end) copy bit
/// for bit, and an index out of range gives NaN; inference batch norm within rounding.
#[test]
fn gather_and_batch_norm_match() {
    let f = parse_function(
        "func @f(%x: f32[5,3,4], %i: i32[2,3], %j: i64[4]) -> (f32[2,3,3,4], f32[5,4,4]) {
  %a = gather %x, %i {axis=0} : f32[2,3,3,4]
  %b = gather %x, %j {axis=1} : f32[5,4,4]
  return %a, %b
}",
    )
    .unwrap();
    let x = randoms(&f, 2).remove(0);
    let i = Tensor::from_data(&[2, 3], Data::I32(vec![0, 4, -1, 2, -5, 3])).unwrap();
    let j = Tensor::from_data(&[4], Data::I64(vec![2, -3, 0, -1])).unwrap();
    let inputs = vec![x.clone(), i, j];
    let got = emulate(&f, &inputs);
    let want = tcc_ir::interp::run(&f, &inputs).unwrap();
    same_bits(&got, &want).unwrap();
    let bad = Tensor::from_data(&[4], Data::I64(vec![2, 3, 1 << 33, -4])).unwrap();
    let got = emulate(&f, &[inputs[0].clone(), inputs[1].clone(), bad]);
    let b = got[1].as_f32().unwrap();
    // Rows 1 (3), 2 (2^33) and 3 (-4) of every block of 4 are out of range.
    assert!(b[4..16].iter().all(|v| v.is_nan()) && !b[0..4].iter().any(|v| v.is_nan()));
    let f = parse_function(
        "func @f(%x: f32[2,3,4,5], %g: f32[3], %b: f32[3], %m: f32[3], %v: f32[3]) -> (f32[2,3,4,5]) {
  %y = batch_norm %x, %g, %b, %m, %v : f32[2,3,4,5]
  return %y
}",
    )
    .unwrap();
    let mut inputs = randoms(&f, 3);
    let v: Vec<f32> = inputs[4]
        .as_f32()
        .unwrap()
        .iter()
        .map(|x| x.abs() + 0.1)
        .collect();
    inputs[4] = Tensor::from_f32(&[3], v).unwrap();
    let got = emulate(&f, &inputs);
    let want = tcc_ir::interp::run(&f, &inputs).unwrap();
    check(&got, &want, 1e-5, 1e-6).unwrap();
    // Training batch norm: the normalised values, the batch mean and the biased variance,
    // a block per channel (a channel of 2 x 300 elements: more than a block's threads).
    for dims in ["2,3,4,5", "2,2,300"] {
        let c = dims.split(',').nth(1).unwrap();
        let src = format!(
            "func @f(%x: f32[{dims}], %g: f32[{c}], %b: f32[{c}]) -> (f32[{dims}], f32[{c}], f32[{c}]) {{
  %y, %m, %v = batch_norm_train %x, %g, %b : f32[{dims}], f32[{c}], f32[{c}]
  return %y, %m, %v
}}"
        );
        let f = parse_function(&src).unwrap();
        let inputs = randoms(&f, 4);
        let got = emulate(&f, &inputs);
        let want = tcc_ir::interp::run(&f, &inputs).unwrap();
        check(&got, &want, 1e-5, 1e-6).unwrap_or_else(|e| panic!("{dims}: {e}"));
    }
}

/// `pow` with exponents the kernel layer leaves to the CPU's reference kernels, on special
/// bases and exponents: C's `powf` signs and special cases exactly, values within 1e-5.
#[test]
fn pow_matches() {
    let xs = special();
    let ys = [
        0.75f32,
        -0.75,
        2.5,
        3.0,
        -3.0,
        2.0,
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        7.0,
        -2.0,
    ];
    let n = xs.len() * ys.len();
    let (mut bx, mut by) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for &x in &xs {
        for &y in &ys {
            bx.push(x);
            by.push(y);
        }
    }
    // Also -1 with infinite exponents, and 1 with NaN.
    bx.extend([-1.0, -1.0, 1.0]);
    by.extend([f32::INFINITY, f32::NEG_INFINITY, f32::NAN]);
    let n = bx.len();
    let f = parse_function(&format!(
        "func @f(%x: f32[{n}], %y: f32[{n}]) -> (f32[{n}]) {{\n  %z = pow %x, %y : f32[{n}]\n  return %z\n}}"
    ))
    .unwrap();
    let inputs = vec![
        Tensor::from_f32(&[n as u64], bx.clone()).unwrap(),
        Tensor::from_f32(&[n as u64], by.clone()).unwrap(),
    ];
    let got = emulate(&f, &inputs);
    let want = tcc_ir::interp::run(&f, &inputs).unwrap();
    let (g, w) = (got[0].as_f32().unwrap(), want[0].as_f32().unwrap());
    for i in 0..n {
        let (a, b) = (g[i], w[i]);
        let same_class = (a.is_nan() && b.is_nan())
            || (a == b && a.is_sign_negative() == b.is_sign_negative())
            || ((a - b).abs() <= 1e-5 * b.abs() && a.is_finite() && b.is_finite() && b != 0.0);
        assert!(same_class, "pow({}, {}): got {a}, want {b}", bx[i], by[i]);
    }
    // A constant exponent (local response normalisation's 0.75), inlined.
    let f = parse_function(
        "func @f(%x: f32[2,8]) -> (f32[2,8]) {
  %e = const {value=0.75} : f32[]
  %z = pow %x, %e : f32[2,8]
  return %z
}",
    )
    .unwrap();
    let inputs = randoms(&f, 3);
    let got = emulate(&f, &inputs);
    let want = tcc_ir::interp::run(&f, &inputs).unwrap();
    check(&got, &want, 1e-5, 1e-30).unwrap();
}

/// The convolution gradients as implicit GEMMs against the interpreter: with respect to the
/// filter and to the input, over padding, strides (positions the stride skips get nothing),
/// dilation, groups and depthwise filters.
#[test]
fn convolution_gradients_match() {
    let cases = [
        (
            "f32[1,3,8,8]",
            "f32[4,3,3,3]",
            "pads=[1,1,1,1]",
            "f32[1,4,8,8]",
        ),
        (
            "f32[2,4,9,9]",
            "f32[6,2,3,3]",
            "strides=[2,2], pads=[1,1,1,1], groups=2",
            "f32[2,6,5,5]",
        ),
        (
            "f32[1,5,10,10]",
            "f32[5,1,3,3]",
            "pads=[1,1,1,1], groups=5",
            "f32[1,5,10,10]",
        ),
        (
            "f32[1,3,11,9]",
            "f32[2,3,3,3]",
            "dilations=[2,2], pads=[2,1,0,3]",
            "f32[1,2,9,9]",
        ),
        (
            "f32[1,2,7,7]",
            "f32[3,2,5,5]",
            "strides=[3,2]",
            "f32[1,3,1,2]",
        ),
    ];
    for (i, (x, w, attrs, y)) in cases.iter().enumerate() {
        let dims = |t: &str| {
            t.trim_start_matches("f32[")
                .trim_end_matches(']')
                .to_string()
        };
        let src = format!(
            "func @f(%x: {x}, %w: {w}, %dy: {y}) -> ({x}, {w}) {{
  %dx = conv2d_grad_input %dy, %w {{{attrs}, shape=[{}]}} : {x}
  %dw = conv2d_grad_filter %x, %dy {{{attrs}, shape=[{}]}} : {w}
  return %dx, %dw
}}",
            dims(x),
            dims(w)
        );
        let f = parse_function(&src).unwrap_or_else(|e| panic!("{src}\n{e:?}"));
        let inputs = randoms(&f, 70 + i as u64);
        let got = emulate(&f, &inputs);
        let want = tcc_ir::interp::run(&f, &inputs).unwrap();
        check(&got, &want, 1e-5, 1e-5).unwrap_or_else(|e| panic!("{x} * {w} {attrs}: {e}"));
    }
}

/// `slice_grad` (positive and negative steps) places `dy` bit for bit among zeros;
/// `scatter_add` (repeated and negative indices) adds in index order.
#[test]
fn slice_grad_and_scatter_add_match() {
    let f = parse_function(
        "func @f(%dy: f32[3,4]) -> (f32[10,8]) {
  %dx = slice_grad %dy {shape=[10,8], starts=[1,-1], ends=[8,0], steps=[3,-2]} : f32[10,8]
  return %dx
}",
    )
    .unwrap();
    let inputs = randoms(&f, 5);
    same_bits(
        &emulate(&f, &inputs),
        &tcc_ir::interp::run(&f, &inputs).unwrap(),
    )
    .unwrap();
    let f = parse_function(
        "func @f(%d: f32[5,3], %i: i64[4], %u: f32[4,3]) -> (f32[5,3]) {
  %y = scatter_add %d, %i, %u {axis=0} : f32[5,3]
  return %y
}",
    )
    .unwrap();
    let mut inputs = randoms(&f, 6);
    inputs[1] = Tensor::from_data(&[4], Data::I64(vec![1, -1, 1, 0])).unwrap();
    let got = emulate(&f, &inputs);
    let want = tcc_ir::interp::run(&f, &inputs).unwrap();
    check(&got, &want, 1e-6, 1e-7).unwrap();
}

/// The cross-entropy gradient, a thread per row, against the interpreter (i32 and i64
/// labels); a label out of range makes its row NaN.
#[test]
fn cross_entropy_gradient_matches() {
    for (rows, classes, lt) in [(7u64, 3u64, "i32"), (600, 10, "i64")] {
        let src = format!(
            "func @f(%x: f32[{rows},{classes}], %l: {lt}[{rows}], %dy: f32[]) -> (f32[{rows},{classes}]) {{
  %g = softmax_cross_entropy_grad %x, %l, %dy : f32[{rows},{classes}]
  return %g
}}"
        );
        let f = parse_function(&src).unwrap();
        let mut inputs = randoms(&f, rows);
        let labels: Vec<i64> = (0..rows as i64)
            .map(|i| (i * 7 + 3) % classes as i64)
            .collect();
        let make = |l: &[i64]| {
            if lt == "i32" {
                Tensor::from_data(&[rows], Data::I32(l.iter().map(|&v| v as i32).collect()))
            } else {
                Tensor::from_data(&[rows], Data::I64(l.to_vec()))
            }
            .unwrap()
        };
        inputs[1] = make(&labels);
        let got = emulate(&f, &inputs);
        let want = tcc_ir::interp::run(&f, &inputs).unwrap();
        check(&got, &want, 1e-5, 1e-8).unwrap_or_else(|e| panic!("{rows}x{classes}: {e}"));
        let mut bad = labels;
        bad[2] = -1;
        inputs[1] = make(&bad);
        let g = emulate(&f, &inputs).remove(0);
        let g = g.as_f32().unwrap();
        let row = |r: usize| &g[r * classes as usize..(r + 1) * classes as usize];
        assert!(row(2).iter().all(|v| v.is_nan()) && !row(1).iter().any(|v| v.is_nan()));
    }
}

/// Pooling gradients against the interpreter: max (overlapping windows, padding, ties broken
/// by the first position, a NaN) and average (both divisors).
#[test]
fn pooling_gradients_match() {
    let srcs = [
        "func @f(%x: f32[2,3,9,9], %dy: f32[2,3,5,5]) -> (f32[2,3,9,9]) {\n  %g = max_pool2d_grad %x, %dy {kernel=[3,3], strides=[2,2], pads=[1,1,1,1]} : f32[2,3,9,9]\n  return %g\n}",
        "func @f(%x: f32[1,2,8,7], %dy: f32[1,2,4,3]) -> (f32[1,2,8,7]) {\n  %g = max_pool2d_grad %x, %dy {kernel=[2,3], strides=[2,2]} : f32[1,2,8,7]\n  return %g\n}",
        "func @f(%dy: f32[1,2,3,3]) -> (f32[1,2,5,5]) {\n  %g = avg_pool2d_grad %dy {kernel=[3,3], strides=[2,2], pads=[1,1,1,1], shape=[1,2,5,5]} : f32[1,2,5,5]\n  return %g\n}",
        "func @f(%dy: f32[1,2,3,3]) -> (f32[1,2,5,5]) {\n  %g = avg_pool2d_grad %dy {kernel=[3,3], strides=[2,2], pads=[1,1,1,1], count_include_pad=true, shape=[1,2,5,5]} : f32[1,2,5,5]\n  return %g\n}",
    ];
    for src in srcs {
        let f = parse_function(src).unwrap_or_else(|e| panic!("{src}\n{e:?}"));
        let mut inputs = randoms(&f, 13);
        if f.params().len() == 2 {
            // Ties (rounded values) and a NaN in the forward input.
            let mut v: Vec<f32> = inputs[0]
                .as_f32()
                .unwrap()
                .iter()
                .map(|x| (x * 2.0).round())
                .collect();
            v[7] = f32::NAN;
            inputs[0] = Tensor::from_f32(inputs[0].dims(), v).unwrap();
        }
        let got = emulate(&f, &inputs);
        let want = tcc_ir::interp::run(&f, &inputs).unwrap();
        check(&got, &want, 1e-6, 1e-7).unwrap_or_else(|e| panic!("{src}\n{e}"));
    }
}

/// The digits CNN's training step (its gradient with respect to every parameter: convolution,
/// batch norm, pooling and cross-entropy gradients, bias reductions over several axes) runs
/// whole in the emulator against the interpreter, and its module assembles without spills.
#[test]
fn a_training_step_runs_on_the_gpu_kernels() {
    let text = std::fs::read_to_string(Path::new(ROOT).join("examples/digits_cnn.tir")).unwrap();
    let mut m = tcc_ir::parse_module(&text).unwrap();
    tcc_passes::PassManager::new(
        tcc_passes::Pipeline::parse("grad{wrt=params,ys=[loss]}").unwrap(),
    )
    .run(&mut m, &mut std::io::sink())
    .unwrap();
    let f = &m.functions[0];
    let inputs = example_inputs(f);
    let got = emulate(f, &inputs);
    let want = tcc_ir::interp::run(f, &inputs).unwrap();
    check(&got, &want, 1e-4, 1e-5).unwrap();
    for sm in [80, 90] {
        let dir = Path::new(ROOT).join("target/ptx-test");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("digits_train_sm{sm}.ptx"));
        std::fs::write(&path, module(f, sm).text()).unwrap();
        ptxas::assemble(Path::new(ROOT), &path, sm).unwrap();
    }
}

/// `top_k` (largest and smallest, along either axis) with ties and NaN: values bit for bit
/// and indices exactly as the interpreter orders them.
#[test]
fn top_k_matches() {
    for (axis, largest, k) in [(1, true, 3), (1, false, 6), (0, true, 2), (0, false, 4)] {
        let (kd0, kd1) = if axis == 1 { (4, k) } else { (k, 6) };
        let src = format!(
            "func @f(%x: f32[4,6]) -> (f32[{kd0},{kd1}], i64[{kd0},{kd1}]) {{
  %v, %i = top_k %x {{k={k}, axis={axis}, largest={largest}}} : f32[{kd0},{kd1}], i64[{kd0},{kd1}]
  return %v, %i
}}"
        );
        let f = parse_function(&src).unwrap_or_else(|e| panic!("{src}\n{e:?}"));
        let xs: Vec<f32> = (0..24)
            .map(|i| match i {
                3 | 16 => f32::NAN,
                _ => ((i * 7) % 5) as f32 - 2.0,
            })
            .collect();
        let x = Tensor::from_f32(&[4, 6], xs).unwrap();
        let got = emulate(&f, std::slice::from_ref(&x));
        let want = tcc_ir::interp::run(&f, std::slice::from_ref(&x)).unwrap();
        same_bits(&got, &want).unwrap_or_else(|e| panic!("axis {axis}, largest {largest}: {e}"));
    }
}

#[test]
fn unsupported_kernels_are_errors_naming_the_op() {
    let f = parse_function(
        "func @f(%x: f64[2,3,4]) -> (f64[3]) {
  %y = reduce_sum %x {axes=[0,2]} : f64[3]
  return %y
}",
    )
    .unwrap();
    let e = tcc_codegen::compile(&Ptx::default(), &f).unwrap_err();
    assert!(
        e.0.contains("no kernel for") && e.0.contains("reduce_sum"),
        "{e}"
    );
    let e = tcc_codegen::compile(&Ptx { sm: 75 }, &f).unwrap_err();
    assert!(e.0.contains("no PTX target sm_75"), "{e}");
    // i64 values have no GPU kernels yet: an error naming the kernel's op.
    let f = parse_function(
        "func @f(%x: i64[4]) -> (i64[4]) {\n  %y = add %x, %x : i64[4]\n  return %y\n}",
    )
    .unwrap();
    let e = tcc_codegen::compile(&Ptx::default(), &f).unwrap_err();
    assert!(e.0.contains("add"), "{e}");
}

#[test]
fn manifest_names_every_operand() {
    let f = parse_function(
        "func @f(%x: f32[300], %b: f32[]) -> (f32[3,100]) {
  %s = add %x, %b : f32[300]
  %t = tanh %s : f32[300]
  %r = reshape %t {shape=[3,100]} : f32[3,100]
  %u = exp %r : f32[3,100]
  return %u
}",
    )
    .unwrap();
    let m = module(&f, 80);
    let text = m.manifest();
    assert!(text.contains("grid 2 block 256"), "{text}");
    assert!(text.contains("%x param 0"), "{text}");
    assert!(text.contains("%b param 1"), "{text}");
    assert!(text.contains("output 0"), "{text}");
}

/// Every case's module and the examples that compile for the GPU, for sm_80 and sm_90,
/// assemble with no spill stores or loads.
#[test]
fn ptxas_assembles_every_module_without_spills() {
    let dir = Path::new(ROOT).join("target/ptx-test");
    std::fs::create_dir_all(&dir).unwrap();
    let mut functions: Vec<(String, Function)> =
        cases().into_iter().map(|(n, f, _)| (n, f)).collect();
    functions.extend((0..10).map(|s| (format!("random {s}"), random_elementwise(s))));
    functions.push((
        "matmul".into(),
        parse_function(
            "func @f(%x: f32[2,130,70], %w: f32[70,65], %b: f32[65]) -> (f32[2,130,65]) {
  %m = matmul %x, %w : f32[2,130,65]
  %a = add %m, %b : f32[2,130,65]
  %y = gelu %a : f32[2,130,65]
  return %y
}",
        )
        .unwrap(),
    ));
    functions.push((
        "conv2d".into(),
        parse_function(
            "func @f(%x: f32[2,4,9,9], %w: f32[6,2,3,3], %b: f32[6,1,1]) -> (f32[2,6,5,5]) {
  %c = conv2d %x, %w {strides=[2,2], pads=[1,1,1,1], groups=2} : f32[2,6,5,5]
  %a = add %c, %b : f32[2,6,5,5]
  return %a
}",
        )
        .unwrap(),
    ));
    for src in [
        "func @f(%x: f32[2,3,4]) -> (f32[4,2,3]) {\n  %y = transpose %x {perm=[2,0,1]} : f32[4,2,3]\n  return %y\n}",
        "func @f(%a: u8[2,3], %b: u8[2,1]) -> (u8[2,4]) {\n  %y = concat %a, %b {axis=1} : u8[2,4]\n  return %y\n}",
        "func @f(%x: f32[8]) -> (u8[8]) {\n  %y = cast %x {to=u8} : u8[8]\n  return %y\n}",
        "func @f(%x: f64[8]) -> (f32[8]) {\n  %y = cast %x {to=f32} : f32[8]\n  return %y\n}",
        "func @f(%x: f32[1,2,5,5]) -> (f32[1,2,3,3]) {\n  %y = avg_pool2d %x {kernel=[3,3], strides=[2,2], pads=[1,1,1,1]} : f32[1,2,3,3]\n  return %y\n}",
        "func @f(%x: i64[6]) -> (i64[3]) {\n  %y = slice %x {starts=[0], ends=[6], steps=[2]} : i64[3]\n  return %y\n}",
    ] {
        functions.push((src.to_string(), parse_function(src).unwrap()));
    }
    for name in ["elementwise", "mlp", "spirals_mlp", "digits_cnn"] {
        let text =
            std::fs::read_to_string(Path::new(ROOT).join(format!("examples/{name}.tir"))).unwrap();
        let m = tcc_ir::parse_module(&text).unwrap();
        functions.extend(m.functions.into_iter().map(|f| (name.to_string(), f)));
    }
    functions.push((
        "cross entropy".into(),
        parse_function(
            "func @f(%x: f32[600,10], %l: i32[600]) -> (f32[]) {\n  %y = softmax_cross_entropy %x, %l : f32[]\n  return %y\n}",
        )
        .unwrap(),
    ));
    functions.push((
        "conv2d gradients".into(),
        parse_function(
            "func @f(%x: f32[2,4,9,9], %w: f32[6,2,3,3], %dy: f32[2,6,5,5]) -> (f32[2,4,9,9], f32[6,2,3,3]) {
  %dx = conv2d_grad_input %dy, %w {strides=[2,2], pads=[1,1,1,1], groups=2, shape=[2,4,9,9]} : f32[2,4,9,9]
  %dw = conv2d_grad_filter %x, %dy {strides=[2,2], pads=[1,1,1,1], groups=2, shape=[6,2,3,3]} : f32[6,2,3,3]
  return %dx, %dw
}",
        )
        .unwrap(),
    ));
    for src in [
        "func @f(%x: f32[2,3,9,9], %dy: f32[2,3,5,5]) -> (f32[2,3,9,9]) {\n  %g = max_pool2d_grad %x, %dy {kernel=[3,3], strides=[2,2], pads=[1,1,1,1]} : f32[2,3,9,9]\n  return %g\n}",
        "func @f(%dy: f32[1,2,3,3]) -> (f32[1,2,5,5]) {\n  %g = avg_pool2d_grad %dy {kernel=[3,3], strides=[2,2], pads=[1,1,1,1], shape=[1,2,5,5]} : f32[1,2,5,5]\n  return %g\n}",
        "func @f(%x: f32[7,3], %l: i64[7], %dy: f32[]) -> (f32[7,3]) {\n  %g = softmax_cross_entropy_grad %x, %l, %dy : f32[7,3]\n  return %g\n}",
        "func @f(%x: f32[4,6]) -> (f32[4,3], i64[4,3]) {\n  %v, %i = top_k %x {k=3, axis=1} : f32[4,3], i64[4,3]\n  return %v, %i\n}",
    ] {
        functions.push((src.to_string(), parse_function(src).unwrap()));
    }
    for (rows, len) in [(50, 10), (3, 700)] {
        let src = format!(
            "func @f(%x: f32[{rows},{len}]) -> (f32[{rows},{len}]) {{
  %p = log_softmax %x {{axis=1}} : f32[{rows},{len}]
  return %p
}}"
        );
        functions.push((format!("log_softmax {len}"), parse_function(&src).unwrap()));
    }
    for (i, red) in ["reduce_sum %x {axes=[1]}", "reduce_max %x {axes=[0]}"]
        .iter()
        .enumerate()
    {
        // Rows of 10 (a thread per output) and columns of 300 (a block per output).
        let src = format!(
            "func @f(%x: f32[300,10]) -> (f32[{}]) {{\n  %r = {red} : f32[{}]\n  return %r\n}}",
            [300, 10][i],
            [300, 10][i]
        );
        functions.push((red.to_string(), parse_function(&src).unwrap()));
    }
    for sm in [80, 90] {
        for (i, (name, f)) in functions.iter().enumerate() {
            let text = module(f, sm).text();
            let path = dir.join(format!("m{i}_sm{sm}.ptx"));
            std::fs::write(&path, &text).unwrap();
            ptxas::assemble(Path::new(ROOT), &path, sm)
                .unwrap_or_else(|e| panic!("{name}, sm_{sm}: {e}\n{text}"));
        }
    }
}

/// On an NVIDIA GPU (`cargo test -p tcc-codegen --features cuda --test ptx gpu`; this needs a
/// device, and fails saying so without one): every case above, and a kernel of each other kind,
/// run on the device equal the emulator bit for bit (NaN payloads aside), since each thread
/// computes in the same order with the same correctly rounded operations.
#[cfg(feature = "cuda")]
#[test]
fn gpu_matches_the_emulator() {
    use tcc_codegen::ptx::cuda::Gpu;
    let gpu = Gpu::new(0).unwrap_or_else(|e| panic!("{e}: this test needs an NVIDIA GPU"));
    let backend = gpu.backend().unwrap();
    let mut all = cases();
    for src in [
        "func @f(%x: f32[2,130,70], %w: f32[70,65], %b: f32[65]) -> (f32[2,130,65]) {
  %m = matmul %x, %w : f32[2,130,65]
  %a = add %m, %b : f32[2,130,65]
  %y = gelu %a : f32[2,130,65]
  return %y
}",
        "func @f(%x: f32[2,4,9,9], %w: f32[6,2,3,3], %b: f32[6,1,1]) -> (f32[2,6,5,5]) {
  %c = conv2d %x, %w {strides=[2,2], pads=[1,1,1,1], groups=2} : f32[2,6,5,5]
  %a = add %c, %b : f32[2,6,5,5]
  return %a
}",
        "func @f(%x: f32[3,1000]) -> (f32[3,1000]) {\n  %p = log_softmax %x {axis=1} : f32[3,1000]\n  return %p\n}",
        "func @f(%x: f32[9,10]) -> (f32[9,10]) {\n  %p = softmax %x {axis=1} : f32[9,10]\n  return %p\n}",
        "func @f(%x: f32[3,1000]) -> (f32[3]) {\n  %r = reduce_sum %x {axes=[1]} : f32[3]\n  return %r\n}",
        "func @f(%x: f32[300,10]) -> (f32[300]) {\n  %r = reduce_max %x {axes=[1]} : f32[300]\n  return %r\n}",
        "func @f(%x: f32[2,3,4]) -> (f32[4,2,3]) {\n  %y = transpose %x {perm=[2,0,1]} : f32[4,2,3]\n  return %y\n}",
        "func @f(%x: f32[2,3,9,9]) -> (f32[2,3,5,5]) {\n  %y = max_pool2d %x {kernel=[3,3], strides=[2,2], pads=[1,1,1,1]} : f32[2,3,5,5]\n  return %y\n}",
    ] {
        let f = parse_function(src).unwrap();
        let inputs = randoms(&f, 21);
        all.push((src.to_string(), f, inputs));
    }
    for name in ["mlp", "spirals_mlp", "digits_cnn"] {
        let text =
            std::fs::read_to_string(Path::new(ROOT).join(format!("examples/{name}.tir"))).unwrap();
        let f = tcc_ir::parse_module(&text).unwrap().functions.remove(0);
        let inputs = example_inputs(&f);
        all.push((name.to_string(), f, inputs));
    }
    for (name, f, inputs) in all {
        let m = tcc_codegen::compile(&backend, &f).unwrap_or_else(|e| panic!("{name}: {e}"));
        let got =
            (gpu.load(m).and_then(|l| l.run(&inputs))).unwrap_or_else(|e| panic!("{name}: {e}"));
        let want = emulate(&f, &inputs);
        same_bits(&got, &want).unwrap_or_else(|e| panic!("{name} on {}: {e}", gpu.name()));
    }
}

/// Random functions of the IR's generator (every op kind), compiled for the GPU where every
/// kernel has a GPU form, run in the emulator against the interpreter with the CPU's random
/// function tolerance. How many compile is printed (202 of 299 on 2026-11-26; what stops the
/// others, with `TCC_PTX_WHY=1`: swaps, f64 and integer matmuls, reductions and top-k); the
/// test asserts a floor, so that losing kernels shows.
#[test]
fn random_functions_match_where_they_compile() {
    let (mut compiled, mut total) = (0, 0);
    for seed in 0..300u64 {
        let f = tcc_ir::random::random_function(seed, 1 + (seed % 30) as usize);
        let inputs = randoms(&f, seed ^ 1);
        let Ok(want) = tcc_ir::interp::run(&f, &inputs) else {
            continue;
        };
        total += 1;
        let m = match tcc_codegen::compile(&Ptx::default(), &f) {
            Ok(m) => m,
            Err(e) => {
                if std::env::var_os("TCC_PTX_WHY").is_some() {
                    println!(
                        "WHY {}",
                        e.0.split(" = ")
                            .nth(1)
                            .unwrap_or(&e.0)
                            .split(' ')
                            .next()
                            .unwrap_or("")
                    );
                }
                continue;
            }
        };
        compiled += 1;
        let got = Ptx::default()
            .run(&m, &inputs)
            .unwrap_or_else(|e| panic!("{f}\n{e}"));
        // Float-to-integer casts amplify one-ulp differences without bound downstream: only
        // results with no such cast upstream are compared (as the CPU's property does).
        let exact: Vec<usize> = (0..got.len())
            .filter(|&i| !common::after_truncation(&f, f.results()[i]))
            .collect();
        let pick = |v: &[Tensor]| exact.iter().map(|&i| v[i].clone()).collect::<Vec<_>>();
        let nudged = tcc_ir::interp::run(&f, &common::perturbed(&inputs, seed ^ 2));
        let result = match nudged {
            Ok(n) => {
                common::check_conditioned(&pick(&got), &pick(&want), &pick(&n), (1e-4, 1e-5, 4.0))
            }
            Err(_) => check(&pick(&got), &pick(&want), 1e-4, 1e-5),
        };
        result.unwrap_or_else(|e| panic!("seed {seed}: {e}\n{f}"));
    }
    println!("{compiled} of {total} random functions compile for the GPU");
    assert!(compiled >= 198, "{compiled} of {total}");
}

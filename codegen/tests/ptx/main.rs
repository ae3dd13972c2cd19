//! The PTX backend without a GPU: its kernels run by the emulator against the CPU runtime (bit
//! for bit: both render the kernel layer's bodies with the same operations, fused multiply-add
//! included) and the reference interpreter, and every module assembled by `ptxas` for sm_80 and
//! sm_90 with no spills (`ptxas` from tests/common/ptxas.rs).

mod elementwise;
mod gemm;
mod movement;
mod rows;
mod whole;

#[path = "../common/mod.rs"]
mod common;
#[path = "../../../tests/common/ptxas.rs"]
mod ptxas;

use common::{check, randoms};
use std::path::Path;
use tcc_codegen::Backend;
use tcc_codegen::ptx::{Module, Ptx};
use tcc_ir::random::Rng;
use tcc_ir::{Data, Function, Tensor, parse_function};

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

fn module(f: &Function, sm: u32) -> Module {
    compiled(&Ptx::new(sm), f)
}

fn compiled(ptx: &Ptx, f: &Function) -> Module {
    tcc_codegen::compile(ptx, f).unwrap_or_else(|e| panic!("{f}\n{e}"))
}

fn emulate(f: &Function, inputs: &[Tensor]) -> Vec<Tensor> {
    emulate_on(&Ptx::default(), f, inputs)
}

fn emulate_on(ptx: &Ptx, f: &Function, inputs: &[Tensor]) -> Vec<Tensor> {
    ptx.run(&compiled(ptx, f), inputs)
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

/// The emulator's results for `f` on `inputs` against the interpreter's, within `rtol`/`atol`.
fn against_interpreter(
    f: &Function,
    inputs: &[Tensor],
    rtol: f64,
    atol: f64,
) -> Result<(), String> {
    against_interpreter_on(&Ptx::default(), f, inputs, rtol, atol)
}

/// [`against_interpreter`] with backend `ptx`.
fn against_interpreter_on(
    ptx: &Ptx,
    f: &Function,
    inputs: &[Tensor],
    rtol: f64,
    atol: f64,
) -> Result<(), String> {
    let got = emulate_on(ptx, f, inputs);
    let want = tcc_ir::interp::run(f, inputs).unwrap();
    check(&got, &want, rtol, atol)
}

/// `f` is one kernel for the GPU (with backend `ptx`; a product that splits `k` is its two
/// kernels, the second `_sum`), and its results in the emulator agree with the interpreter's
/// within `rtol`/`atol`.
fn one_kernel_agrees(
    ptx: &Ptx,
    f: &Function,
    inputs: &[Tensor],
    rtol: f64,
    atol: f64,
) -> Result<(), String> {
    let m = compiled(ptx, f);
    let one = match &m.kernels[..] {
        [_] => true,
        [a, b] => b.name == format!("{}_sum", a.name),
        _ => false,
    };
    if !one {
        return Err(format!("not one kernel:\n{}", m.manifest()));
    }
    against_interpreter_on(ptx, f, inputs, rtol, atol)
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
    // Quantizing to each byte type and back, on the special values (halves, NaN, infinities,
    // saturation), per tensor with constants and per channel with parameters.
    for (zt, z) in [("u8", "128"), ("i8", "-5")] {
        add(
            format!("quantize {zt}"),
            format!(
                "func @f(%x: f32[{n}]) -> ({zt}[{n}], f32[{n}]) {{
  %s = const {{value=0.5}} : f32[]
  %z = const {{value={z}}} : {zt}[]
  %q = quantize_linear %x, %s, %z : {zt}[{n}]
  %d = dequantize_linear %q, %s, %z : f32[{n}]
  return %q, %d
}}"
            ),
            vec![x.clone()],
        );
    }
    add(
        "quantize per channel".into(),
        "func @f(%x: f32[4,7], %s: f32[4,1], %z: i8[4,1]) -> (i8[4,7], f32[4,7]) {
  %q = quantize_linear %x, %s, %z : i8[4,7]
  %d = dequantize_linear %q, %s, %z : f32[4,7]
  return %q, %d
}"
        .into(),
        vec![
            Tensor::from_f32(&[4, 7], special()).unwrap(),
            Tensor::from_f32(&[4, 1], vec![0.1, 1.0, 3.0, 1e-3]).unwrap(),
            Tensor::new(
                tcc_ir::TensorType::new(tcc_ir::DType::I8, vec![4, 1]).unwrap(),
                Data::I8(vec![0, -128, 127, 3]),
            )
            .unwrap(),
        ],
    );
    // Integer products over the whole 8-bit ranges: zero points per row of A and per column of
    // B, and scalars; both byte types on either side; a batch broadcast each way.
    let bytes = |dt, dims: &[u64], seed| common::bytes(dt, dims, None, seed);
    use tcc_ir::DType::{I8, U8};
    add(
        "matmul_integer per row and column".into(),
        "func @f(%a: u8[2,5,7], %b: i8[7,3], %za: u8[5,1], %zb: i8[3]) -> (i32[2,5,3]) {
  %y = matmul_integer %a, %b, %za, %zb : i32[2,5,3]
  return %y
}"
        .into(),
        vec![
            bytes(U8, &[2, 5, 7], 1),
            bytes(I8, &[7, 3], 2),
            bytes(U8, &[5, 1], 3),
            bytes(I8, &[3], 4),
        ],
    );
    add(
        "matmul_integer scalars".into(),
        "func @f(%a: i8[4,9], %b: u8[3,9,2], %za: i8[], %zb: u8[]) -> (i32[3,4,2]) {
  %y = matmul_integer %a, %b, %za, %zb : i32[3,4,2]
  return %y
}"
        .into(),
        vec![
            bytes(I8, &[4, 9], 5),
            bytes(U8, &[3, 9, 2], 6),
            bytes(I8, &[], 7),
            bytes(U8, &[], 8),
        ],
    );
    // Integer convolutions: padding (the input's zero point), strides, dilation, groups, zero
    // points per output channel and per tensor.
    add(
        "conv_integer padded, strided, grouped".into(),
        "func @f(%x: u8[2,4,7,6], %w: i8[6,2,3,2], %xz: u8[], %wz: i8[6,1,1,1]) -> (i32[2,6,4,5]) {
  %y = conv_integer %x, %w, %xz, %wz {strides=[2,1], pads=[1,0,2,1], dilations=[1,2], groups=2} : i32[2,6,4,5]
  return %y
}"
        .into(),
        vec![
            bytes(U8, &[2, 4, 7, 6], 9),
            bytes(I8, &[6, 2, 3, 2], 10),
            bytes(U8, &[], 11),
            bytes(I8, &[6, 1, 1, 1], 12),
        ],
    );
    add(
        "conv_integer depthwise i8 x u8".into(),
        "func @f(%x: i8[1,3,5,5], %w: u8[3,1,3,3], %xz: i8[], %wz: u8[]) -> (i32[1,3,5,5]) {
  %y = conv_integer %x, %w, %xz, %wz {pads=[1,1,1,1], groups=3} : i32[1,3,5,5]
  return %y
}"
        .into(),
        vec![
            bytes(I8, &[1, 3, 5, 5], 13),
            bytes(U8, &[3, 1, 3, 3], 14),
            bytes(I8, &[], 15),
            bytes(U8, &[], 16),
        ],
    );
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

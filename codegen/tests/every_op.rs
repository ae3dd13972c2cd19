//! Every op of the IR through the CPU runtime against the reference interpreter, at several
//! shapes: broadcasting, size-1 dims, odd sizes and a large size. Compiled kernels and reference
//! kernels both run through the same storage and arena, so this also checks the plumbing. Each
//! case runs for the host, for `host,-avx512f` (the AVX2 kernels and GEMM) and without FMA.
//!
//! Tolerances: exact for data movement and integer ops; 1e-5 relative for float arithmetic,
//! which the compiled kernels do in f32 where the interpreter uses f64 (accumulations over up to
//! a few hundred terms); tanh and sigmoid use polynomial approximations (docs/perf.md).

use tcc_codegen::Executable;
use tcc_ir::random::{Rng, random_tensor};
use tcc_ir::{Data, Tensor, parse_function};

fn close(a: f64, b: f64) -> bool {
    (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= 2e-5 * (1.0 + b.abs())
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
    // The host with every feature, without AVX-512 (the AVX2 code and GEMM paths an AVX2-only
    // CPU runs; the same as the host where it has no AVX-512), and without fused multiply-adds
    // (the kernels' unfused versions).
    // Each also in the function's own layout and in the one the backend chooses (convolutions
    // on channel-blocked tensors).
    let targets = [None, Some("host,-avx512f"), Some("host,-avx512f,-fma")];
    let layouts = [tcc_codegen::Layout::Blocked, tcc_codegen::Layout::Plain];
    for (target, layout) in targets.into_iter().flat_map(|t| layouts.map(|l| (t, l))) {
        let cpu = tcc_codegen::Cpu {
            target: target.map(str::to_string),
            profile: false,
            layout,
        };
        let exe = tcc_codegen::compile(&cpu, &f).unwrap_or_else(|e| panic!("{src}\n{e}"));
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
            "{src}\ntarget {target:?}, layout {layout:?}: compiled and interpreted results differ"
        );
    }
}

const SHAPES: [&str; 4] = ["[1]", "[3,1,5]", "[2,7,9]", "[1031]"];

#[test]
fn unary() {
    for op in tcc_ir::UnaryOp::ALL.map(|u| u.mnemonic()) {
        for s in SHAPES {
            // log, sqrt, rsqrt and reciprocal get positive inputs: x*x + 0.5.
            let body = format!(
                "  %h = const {{value=0.5}} : f32[]\n  %sq = mul %x, %x : f32{s}\n  %p = add %sq, %h : f32{s}\n  %out = {op} %p : f32{s}"
            );
            case(&format!("%x: f32{s}"), &body, &format!("f32{s}"), 1);
            case(
                &format!("%x: f32{s}"),
                &format!("  %out = {op} %x : f32{s}"),
                &format!("f32{s}"),
                2,
            );
        }
    }
    for op in ["neg", "abs", "relu"] {
        case(
            "%x: i32[5]",
            &format!("  %out = {op} %x : i32[5]"),
            "i32[5]",
            3,
        );
    }
}

#[test]
fn binary_and_comparisons_with_broadcasting() {
    let pairs = [
        ("[4,5]", "[5]", "[4,5]"),
        ("[3,1,5]", "[1,4,1]", "[3,4,5]"),
        ("[1031]", "[]", "[1031]"),
        ("[2,3]", "[2,3]", "[2,3]"),
    ];
    for (a, b, o) in pairs {
        for op in ["add", "sub", "mul", "div", "max", "min", "pow"] {
            let body = if op == "pow" {
                format!(
                    "  %h = const {{value=1.5}} : f32[]\n  %aa = abs %a : f32{a}\n  %ap = add %aa, %h : f32{a}\n  %out = pow %ap, %b : f32{o}"
                )
            } else {
                format!("  %out = {op} %a, %b : f32{o}")
            };
            case(
                &format!("%a: f32{a}, %b: f32{b}"),
                &body,
                &format!("f32{o}"),
                4,
            );
        }
        for op in ["eq", "ne", "lt", "le", "gt", "ge"] {
            case(
                &format!("%a: f32{a}, %b: f32{b}"),
                &format!("  %out = {op} %a, %b : bool{o}"),
                &format!("bool{o}"),
                5,
            );
        }
        case(
            &format!("%a: f32{a}, %b: f32{b}"),
            &format!("  %c = lt %a, %b : bool{o}\n  %out = select %c, %a, %b : f32{o}"),
            &format!("f32{o}"),
            6,
        );
        for op in ["add", "sub", "mul", "max", "min"] {
            case(
                &format!("%a: i64{a}, %b: i64{b}"),
                &format!("  %out = {op} %a, %b : i64{o}"),
                &format!("i64{o}"),
                7,
            );
        }
    }
}

#[test]
fn casts_broadcasts_and_identities() {
    case(
        "%x: f32[3,4]",
        "  %s = mul %x, %x : f32[3,4]\n  %out = cast %s {to=i32} : i32[3,4]",
        "i32[3,4]",
        8,
    );
    case(
        "%x: i64[6]",
        "  %out = cast %x {to=f64} : f64[6]",
        "f64[6]",
        9,
    );
    case(
        "%x: f32[6]",
        "  %out = cast %x {to=bool} : bool[6]",
        "bool[6]",
        10,
    );
    case(
        "%x: f32[1,5]",
        "  %out = broadcast_to %x {shape=[2,3,5]} : f32[2,3,5]",
        "f32[2,3,5]",
        11,
    );
    case(
        "%x: f32[7]",
        "  %a = stop_gradient %x : f32[7]\n  %out = identity %a : f32[7]",
        "f32[7]",
        12,
    );
}

#[test]
fn linear_algebra_and_convolution() {
    case(
        "%a: f32[5,7], %b: f32[7,3]",
        "  %out = matmul %a, %b : f32[5,3]",
        "f32[5,3]",
        13,
    );
    case(
        "%a: f32[2,1,4,6], %b: f32[3,6,5]",
        "  %out = matmul %a, %b : f32[2,3,4,5]",
        "f32[2,3,4,5]",
        14,
    );
    case(
        "%a: i32[3,4], %b: i32[4,2]",
        "  %out = matmul %a, %b : i32[3,2]",
        "i32[3,2]",
        15,
    );
    case(
        "%a: f32[64,130], %b: f32[130,70]",
        "  %out = matmul %a, %b : f32[64,70]",
        "f32[64,70]",
        16,
    );
    case(
        "%x: f32[2,6,9,8], %w: f32[4,3,3,2]",
        "  %out = conv2d %x, %w {strides=[2,1], pads=[1,0,1,1], dilations=[1,2], groups=2} : f32[2,4,5,7]",
        "f32[2,4,5,7]",
        17,
    );
}

#[test]
fn pooling_and_normalisation() {
    case(
        "%x: f32[2,3,7,6]",
        "  %out = max_pool2d %x {kernel=[3,2], strides=[2,2], pads=[1,0,1,1]} : f32[2,3,4,3]",
        "f32[2,3,4,3]",
        18,
    );
    case(
        "%x: f32[2,3,7,6]",
        "  %out = avg_pool2d %x {kernel=[3,3], pads=[1,1,1,1]} : f32[2,3,7,6]",
        "f32[2,3,7,6]",
        19,
    );
    case(
        "%x: f32[2,3,7,6]",
        "  %out = avg_pool2d %x {kernel=[2,2], strides=[2,2], pads=[1,1,1,1], count_include_pad=true} : f32[2,3,4,4]",
        "f32[2,3,4,4]",
        20,
    );
    case(
        "%x: f32[2,3,5,5]",
        "  %out = global_avg_pool %x : f32[2,3,1,1]",
        "f32[2,3,1,1]",
        21,
    );
    case(
        "%x: f32[4,3,5], %g: f32[3], %b: f32[3], %m: f32[3], %v: f32[3]",
        "  %va = abs %v : f32[3]\n  %out = batch_norm %x, %g, %b, %m, %va {eps=0.01} : f32[4,3,5]",
        "f32[4,3,5]",
        22,
    );
    case(
        "%x: f32[4,3,5], %g: f32[3], %b: f32[3]",
        "  %out, %mean, %var = batch_norm_train %x, %g, %b : f32[4,3,5], f32[3], f32[3]",
        "f32[4,3,5]",
        23,
    );
}

#[test]
fn reductions_and_softmax() {
    for (axes, keep, out) in [
        ("[0]", "false", "[7,9]"),
        ("[1,2]", "true", "[5,1,1]"),
        ("[-1]", "false", "[5,7]"),
        ("[0,2]", "false", "[7]"),
    ] {
        for op in ["reduce_sum", "reduce_mean", "reduce_max"] {
            case(
                "%x: f32[5,7,9]",
                &format!("  %out = {op} %x {{axes={axes}, keepdims={keep}}} : f32{out}"),
                &format!("f32{out}"),
                24,
            );
        }
    }
    case(
        "%x: i32[4,6]",
        "  %out = reduce_sum %x {axes=[1]} : i32[4]",
        "i32[4]",
        25,
    );
    for (axis, shape) in [("-1", "[6,37]"), ("0", "[6,37]"), ("1", "[2,5,3]")] {
        case(
            &format!("%x: f32{shape}"),
            &format!("  %out = softmax %x {{axis={axis}}} : f32{shape}"),
            &format!("f32{shape}"),
            26,
        );
        case(
            &format!("%x: f32{shape}"),
            &format!("  %out = log_softmax %x {{axis={axis}}} : f32{shape}"),
            &format!("f32{shape}"),
            27,
        );
    }
    case(
        "%x: f32[6,5]",
        "  %l = const {value=[0, 4, 2, 2, 1, 3]} : i64[6]\n  %out = softmax_cross_entropy %x, %l : f32[]",
        "f32[]",
        28,
    );
}

#[test]
fn data_movement() {
    case(
        "%x: f32[2,3,4]",
        "  %out = reshape %x {shape=[4,6]} : f32[4,6]",
        "f32[4,6]",
        29,
    );
    case(
        "%x: f32[2,3,4]",
        "  %out = transpose %x {perm=[2,0,1]} : f32[4,2,3]",
        "f32[4,2,3]",
        30,
    );
    // Transposes: unit axes dropped and neighbours merged (runs, tiles), every element size,
    // a 2-D one whose outermost output axis is the input's innermost, and one large enough
    // to split across threads.
    for (dt, dims, perm, out) in [
        ("f32", "[3,128,1,1,20]", "[3,1,2,0,4]", "[1,128,1,3,20]"),
        ("f32", "[4,33,17]", "[1,0,2]", "[33,4,17]"),
        ("f32", "[33,40]", "[1,0]", "[40,33]"),
        ("i64", "[2,5,3,7]", "[3,1,0,2]", "[7,5,2,3]"),
        ("u8", "[6,1,35,3]", "[2,1,0,3]", "[35,1,6,3]"),
        ("bool", "[5,19,2]", "[2,0,1]", "[2,5,19]"),
        ("f64", "[3,4,5,6]", "[0,2,1,3]", "[3,5,4,6]"),
        ("f32", "[300,257]", "[1,0]", "[257,300]"),
        ("f32", "[64,3,500]", "[2,0,1]", "[500,64,3]"),
        // Runs of 16, 32 and 64 bytes (copied as fixed-size chunks): a blocked tensor to
        // channels-last, and back, split across threads.
        ("f32", "[2,3,5,4]", "[0,2,1,3]", "[2,5,3,4]"),
        ("f32", "[1,12,9,7,8]", "[0,2,3,1,4]", "[1,9,7,12,8]"),
        ("f64", "[5,7,8]", "[1,0,2]", "[7,5,8]"),
        ("f32", "[1,40,28,28,8]", "[0,2,3,1,4]", "[1,28,28,40,8]"),
        ("f32", "[1,28,28,40,8]", "[0,3,1,2,4]", "[1,40,28,28,8]"),
    ] {
        case_native(
            &format!("%x: {dt}{dims}"),
            &format!("  %out = transpose %x {{perm={perm}}} : {dt}{out}"),
            &format!("{dt}{out}"),
            35,
        );
    }
    case(
        "%x: f32[2,3], %y: f32[2,5]",
        "  %out = concat %x, %y, %x {axis=1} : f32[2,11]",
        "f32[2,11]",
        31,
    );
    case(
        "%x: f32[7,6]",
        "  %out = slice %x {starts=[-1,1], ends=[-8,6], steps=[-2,2]} : f32[4,3]",
        "f32[4,3]",
        32,
    );
    case(
        "%t: f32[10,3]",
        "  %i = const {value=[9, 0, -1, 4]} : i64[4]\n  %out = gather %t, %i {axis=0} : f32[4,3]",
        "f32[4,3]",
        33,
    );
    case(
        "%t: f32[10,3], %u: f32[4,3]",
        "  %i = const {value=[9, 0, 9, 4]} : i32[4]\n  %out = scatter_add %t, %i, %u {axis=0} : f32[10,3]",
        "f32[10,3]",
        34,
    );
}

/// The channel-blocked layout: `to_nchwc` and `from_nchwc` of every dtype (the f32 kernel in
/// blocks of eight, partial last blocks and planes that are not a multiple of eight pixels, and
/// the element-by-element one), and `conv2d_nchwc` on every path of its kernels: blocked and
/// plain inputs, one group (pairs of output blocks and a single last one, partial blocks,
/// padding, strides, dilations, no padding read in place), depthwise and groups of whole
/// blocks, parameter filters
/// (packed per run) and constant ones (packed at compile time). Blocked results are returned
/// as they are, so their zero padding lanes are compared too.
#[test]
fn channel_blocked_layout() {
    for (dt, seed) in [("f32", 70), ("i64", 71), ("bool", 72), ("u8", 73)] {
        for (dims, block, blocked) in [
            ("[2,13,5,3]", 8, "[2,2,5,3,8]"),
            ("[1,16,9]", 8, "[1,2,9,8]"),
            ("[3,5,2,2,2]", 3, "[3,2,2,2,2,3]"),
            ("[2,7]", 4, "[2,2,4]"),
        ] {
            let channels = dims.trim_matches(['[', ']']).split(',').nth(1).unwrap();
            case_native(
                &format!("%x: {dt}{dims}"),
                &format!("  %out = to_nchwc %x {{block={block}}} : {dt}{blocked}"),
                &format!("{dt}{blocked}"),
                seed,
            );
            case_native(
                &format!("%x: {dt}{blocked}"),
                &format!("  %out = from_nchwc %x {{channels={channels}}} : {dt}{dims}"),
                &format!("{dt}{dims}"),
                seed,
            );
        }
    }
    // Pooling windows over blocked tensors (every lane a channel of its own).
    for (op, attrs) in [
        (
            "max_pool2d",
            "{kernel=[3,3], strides=[2,2], pads=[1,1,1,1]}",
        ),
        ("max_pool2d", "{kernel=[2,2], strides=[2,2]}"),
        (
            "avg_pool2d",
            "{kernel=[3,3], strides=[2,1], pads=[1,1,1,0]}",
        ),
        (
            "avg_pool2d",
            "{kernel=[3,3], strides=[2,1], pads=[1,1,1,0], count_include_pad=true}",
        ),
    ] {
        let src_dims = "[2,2,7,9,8]";
        let out = if attrs.contains("strides=[2,1]") {
            "[2,2,4,8,8]"
        } else if attrs.contains("pads") {
            "[2,2,4,5,8]"
        } else {
            "[2,2,3,4,8]"
        };
        case_native(
            &format!("%x: f32{src_dims}"),
            &format!("  %out = {op} %x {attrs} : f32{out}"),
            &format!("f32{out}"),
            75,
        );
    }
    // (input, filter, attributes, blocked output): the input is blocked by a `to_nchwc` in the
    // function when `block` below is set, else read plain.
    let convs = [
        // 12 channels in (a partial block) to 20 out (a pair and a partial single block),
        // padded, strided, dilated.
        (
            "[2,12,9,10]",
            "[20,12,3,3]",
            "{strides=[2,1], pads=[1,2,1,0], dilations=[1,2]}",
            "[2,3,5,8,8]",
        ),
        // The first layer of a CNN: three channels, read plain, 7x7 stride 2.
        (
            "[1,3,23,23]",
            "[16,3,7,7]",
            "{strides=[2,2], pads=[3,3,3,3]}",
            "[1,2,12,12,8]",
        ),
        // No padding and whole blocks: read in place; a 1x1 and a 3x3 over a 7x7 plane.
        ("[1,16,7,7]", "[24,16,1,1]", "", "[1,3,7,7,8]"),
        ("[2,8,7,7]", "[8,8,3,3]", "", "[2,1,5,5,8]"),
        // Depthwise: partial block, stride 2; dilated, 5x5.
        (
            "[1,13,11,9]",
            "[13,1,3,3]",
            "{strides=[2,2], pads=[1,1,1,1], groups=13}",
            "[1,2,6,5,8]",
        ),
        (
            "[2,16,12,12]",
            "[16,1,5,5]",
            "{pads=[4,4,4,4], dilations=[2,2], groups=16}",
            "[2,2,12,12,8]",
        ),
        // Depthwise on wider planes with whole blocks: strided, dilated, unevenly padded.
        (
            "[1,16,20,37]",
            "[16,1,3,3]",
            "{strides=[2,1], pads=[1,0,2,2], dilations=[1,2], groups=16}",
            "[1,2,11,35,8]",
        ),
        (
            "[2,16,19,24]",
            "[16,1,5,5]",
            "{pads=[2,2,2,2], groups=16}",
            "[2,2,19,24,8]",
        ),
        // The 3x3 kernel at column stride 1 (each input pixel loaded once per filter row),
        // with a partial block and a row of thirteen (one full and one partial vector of
        // outputs), taller stride 2.
        (
            "[1,13,10,13]",
            "[13,1,3,3]",
            "{strides=[2,1], pads=[1,1,1,1], groups=13}",
            "[1,2,5,13,8]",
        ),
        // ConvNeXt's 7x7 at stride 1.
        (
            "[1,16,9,12]",
            "[16,1,7,7]",
            "{pads=[3,3,3,3], groups=16}",
            "[1,2,9,12,8]",
        ),
        // The 5x5 kernel at column stride 2 (taps in two phases), eleven outputs a row.
        (
            "[1,16,13,21]",
            "[16,1,5,5]",
            "{strides=[2,2], pads=[2,2,2,2], groups=16}",
            "[1,2,7,11,8]",
        ),
        // Groups of whole blocks: RegNet's eight channels a group, strided and padded (each
        // output block reads one input block); sixteen a group (pairs of blocks within a
        // group); eight in and 24 out a group unpadded (a pair and a single block per group,
        // read in place).
        (
            "[1,24,9,9]",
            "[24,8,3,3]",
            "{strides=[2,2], pads=[1,1,1,1], groups=3}",
            "[1,3,5,5,8]",
        ),
        (
            "[2,32,7,6]",
            "[32,16,3,3]",
            "{pads=[1,1,1,1], groups=2}",
            "[2,4,7,6,8]",
        ),
        ("[1,16,6,6]", "[48,8,1,1]", "{groups=2}", "[1,6,6,6,8]"),
        // Groups of half and a quarter of a block (ResNeXt-50's first stage has four channels a
        // group): each block runs as one group with zeros between the small ones.
        (
            "[1,16,9,9]",
            "[16,4,3,3]",
            "{pads=[1,1,1,1], groups=4}",
            "[1,2,9,9,8]",
        ),
        (
            "[2,24,7,6]",
            "[24,2,3,3]",
            "{strides=[2,2], pads=[1,1,1,1], groups=12}",
            "[2,3,4,3,8]",
        ),
        // 3x3 at stride 1 with enough channels that a constant filter runs as Winograd's
        // F(2x2, 3x3) (conv/winograd.rs tests its paths itself): partial input blocks, an odd
        // plane.
        (
            "[1,124,12,11]",
            "[128,124,3,3]",
            "{pads=[1,1,1,1]}",
            "[1,16,12,11,8]",
        ),
    ];
    for (i, (x, w, attrs, y)) in convs.iter().enumerate() {
        let attrs = if attrs.is_empty() {
            "{block=8}".to_string()
        } else {
            format!("{}, block=8}}", &attrs[..attrs.len() - 1])
        };
        let dims: Vec<usize> = (x.trim_matches(['[', ']']).split(','))
            .map(|d| d.parse().unwrap())
            .collect();
        let xb = format!(
            "[{},{},{},{},8]",
            dims[0],
            dims[1].div_ceil(8),
            dims[2],
            dims[3]
        );
        for blocked_input in [true, false] {
            let (pre, arg) = if blocked_input {
                (
                    format!("  %xb = to_nchwc %x {{block=8}} : f32{xb}\n"),
                    "%xb",
                )
            } else {
                (String::new(), "%x")
            };
            case_native(
                &format!("%x: f32{x}, %w: f32{w}"),
                &format!("{pre}  %out = conv2d_nchwc {arg}, %w {attrs} : f32{y}"),
                &format!("f32{y}"),
                80 + i as u64,
            );
        }
        // The filter a constant, packed (or for 3x3 at stride 1, transformed for Winograd's
        // F(2x2, 3x3)) at compile time.
        let n: usize = (w.trim_matches(['[', ']']).split(','))
            .map(|d| d.parse::<usize>().unwrap())
            .product();
        let values: Vec<String> = (0..n)
            .map(|k| format!("{}", ((k * 7 % 13) as f32 - 6.0) / 8.0))
            .collect();
        for blocked_input in [true, false] {
            let (pre, arg) = if blocked_input {
                (
                    format!("  %xb = to_nchwc %x {{block=8}} : f32{xb}\n"),
                    "%xb",
                )
            } else {
                (String::new(), "%x")
            };
            case_native(
                &format!("%x: f32{x}"),
                &format!(
                    "{pre}  %w = const {{value=[{}]}} : f32{w}\n  %out = conv2d_nchwc {arg}, %w {attrs} : f32{y}",
                    values.join(", ")
                ),
                &format!("f32{y}"),
                90 + i as u64,
            );
        }
    }
    // Padding lanes that hold -inf (the log of a blocked tensor's zero padding) must not
    // reach the outputs through the filter's zero weights: the direct kernel and the Winograd
    // input transform clear them.
    let values: Vec<String> = (0..128 * 124 * 9)
        .map(|k| format!("{}", ((k * 5 % 11) as f32 - 5.0) / 64.0))
        .collect();
    for (attrs, y) in [
        ("{pads=[1,1,1,1], block=8}", "[1,16,12,11,8]"),
        ("{strides=[2,2], block=8}", "[1,16,5,5,8]"),
    ] {
        case_native(
            "%x: f32[1,124,12,11]",
            &format!(
                "  %xb = to_nchwc %x {{block=8}} : f32[1,16,12,11,8]\n  %a = abs %xb : f32[1,16,12,11,8]\n  %l = log %a : f32[1,16,12,11,8]\n  %w = const {{value=[{}]}} : f32[128,124,3,3]\n  %out = conv2d_nchwc %l, %w {attrs} : f32{y}",
                values.join(", ")
            ),
            &format!("f32{y}"),
            99,
        );
    }
}

#[test]
fn gradient_ops() {
    // (x dims, w dims, y dims, attributes): grouped+strided+dilated, depthwise, plain 1x1 (no
    // im2col), a strided 1x1 and an f64 one through the gemm crate.
    let convs = [
        (
            "[2,6,9,8]",
            "[4,3,3,2]",
            "[2,4,5,7]",
            "strides=[2,1], pads=[1,0,1,1], dilations=[1,2], groups=2",
        ),
        (
            "[2,3,6,6]",
            "[3,1,3,3]",
            "[2,3,3,3]",
            "strides=[2,2], pads=[1,1,1,1], groups=3",
        ),
        ("[2,5,4,3]", "[7,5,1,1]", "[2,7,4,3]", ""),
        ("[1,4,5,5]", "[2,4,1,1]", "[1,2,3,3]", "strides=[2,2]"),
    ];
    for (i, (xd, wd, yd, attrs)) in convs.iter().enumerate() {
        let sep = if attrs.is_empty() { "" } else { ", " };
        let x = xd.trim_matches(|c| c == '[' || c == ']');
        let w = wd.trim_matches(|c| c == '[' || c == ']');
        case(
            &format!("%dy: f32{yd}, %w: f32{wd}"),
            &format!("  %out = conv2d_grad_input %dy, %w {{{attrs}{sep}shape=[{x}]}} : f32{xd}"),
            &format!("f32{xd}"),
            40 + i as u64,
        );
        case(
            &format!("%x: f32{xd}, %dy: f32{yd}"),
            &format!("  %out = conv2d_grad_filter %x, %dy {{{attrs}{sep}shape=[{w}]}} : f32{wd}"),
            &format!("f32{wd}"),
            50 + i as u64,
        );
    }
    case(
        "%dy: f64[2,4,5,7], %w: f64[4,3,3,2]",
        "  %out = conv2d_grad_input %dy, %w {strides=[2,1], pads=[1,0,1,1], dilations=[1,2], groups=2, shape=[2,6,9,8]} : f64[2,6,9,8]",
        "f64[2,6,9,8]",
        60,
    );
    case(
        "%x: f32[2,3,7,6], %dy: f32[2,3,4,3]",
        "  %out = max_pool2d_grad %x, %dy {kernel=[3,2], strides=[2,2], pads=[1,0,1,1]} : f32[2,3,7,6]",
        "f32[2,3,7,6]",
        61,
    );
    case(
        "%x: f32[5,7], %dy: f32[]",
        "  %l = const {value=[0, 6, 3, 3, 1]} : i32[5]\n  %out = softmax_cross_entropy_grad %x, %l, %dy : f32[5,7]",
        "f32[5,7]",
        67,
    );
    // Tiling windows (the fast paths, 2x2 and general), with a leftover row and column no
    // window covers.
    case(
        "%x: f32[2,3,7,5]",
        "  %out = max_pool2d %x {kernel=[2,2], strides=[2,2]} : f32[2,3,3,2]",
        "f32[2,3,3,2]",
        68,
    );
    case(
        "%x: f32[64,8,9,9]",
        "  %out = max_pool2d %x {kernel=[3,3], strides=[3,3]} : f32[64,8,3,3]",
        "f32[64,8,3,3]",
        69,
    );
    case(
        "%x: f32[2,3,7,5], %dy: f32[2,3,3,2]",
        "  %out = max_pool2d_grad %x, %dy {kernel=[2,2], strides=[2,2]} : f32[2,3,7,5]",
        "f32[2,3,7,5]",
        65,
    );
    case(
        "%x: f32[64,8,16,16], %dy: f32[64,8,8,8]",
        "  %out = max_pool2d_grad %x, %dy {kernel=[2,2], strides=[2,2]} : f32[64,8,16,16]",
        "f32[64,8,16,16]",
        66,
    );
    case(
        "%dy: f32[2,3,4,4]",
        "  %out = avg_pool2d_grad %dy {kernel=[2,2], strides=[2,2], pads=[1,1,1,1], count_include_pad=true, shape=[2,3,7,6]} : f32[2,3,7,6]",
        "f32[2,3,7,6]",
        62,
    );
    case(
        "%dy: f32[2,3,7,6]",
        "  %out = avg_pool2d_grad %dy {kernel=[3,3], pads=[1,1,1,1], shape=[2,3,7,6]} : f32[2,3,7,6]",
        "f32[2,3,7,6]",
        63,
    );
    case(
        "%dy: f32[3,2]",
        "  %out = slice_grad %dy {shape=[3,5], starts=[-1,1], ends=[-4,5], steps=[-1,2]} : f32[3,5]",
        "f32[3,5]",
        64,
    );
}

#[test]
fn matmul_reading_transposes() {
    // Transposes of the last two axes that only matmuls read are folded into the GEMM's strides.
    case(
        "%a: f32[7,5], %b: f32[3,7]",
        "  %at = transpose %a {perm=[1,0]} : f32[5,7]\n  %bt = transpose %b {perm=[1,0]} : f32[7,3]\n  %out = matmul %at, %bt : f32[5,3]",
        "f32[5,3]",
        70,
    );
    case(
        "%a: f64[2,6,4], %b: f64[6,4]",
        "  %at = transpose %a {perm=[0,2,1]} : f64[2,4,6]\n  %out = matmul %at, %b : f64[2,4,4]",
        "f64[2,4,4]",
        71,
    );
    // Also read elsewhere: materialised.
    case(
        "%a: f32[7,5], %b: f32[7,3]",
        "  %at = transpose %a {perm=[1,0]} : f32[5,7]\n  %m = matmul %at, %b : f32[5,3]\n  %e = exp %at : f32[5,7]\n  %s = reduce_sum %e {axes=[1], keepdims=true} : f32[5,1]\n  %out = add %m, %s : f32[5,3]",
        "f32[5,3]",
        72,
    );
    // An integer matmul runs on the reference kernels, which materialise the folded view.
    case(
        "%a: i32[4,3], %b: i32[4,2]",
        "  %at = transpose %a {perm=[1,0]} : i32[3,4]\n  %out = matmul %at, %b : i32[3,2]",
        "i32[3,2]",
        73,
    );
}

/// Max pooling over channel blocks: NaN wins its window in every lane it is in, on the AVX2
/// kernel (f32 blocks of eight) and the lane-by-lane one (blocks of four).
#[test]
fn blocked_max_pooling_with_nan() {
    for b in [8usize, 4] {
        let src = format!(
            "func @f(%x: f32[1,1,3,3,{b}]) -> (f32[1,1,2,2,{b}]) {{\n  %y = max_pool2d %x {{kernel=[2,2], strides=[1,1]}} : f32[1,1,2,2,{b}]\n  return %y\n}}"
        );
        let f = parse_function(&src).unwrap();
        let mut v: Vec<f32> = (0..9 * b).map(|i| ((i * 5) % 7) as f32 - 3.0).collect();
        // Lane 1 of pixel (1,1) (in every window) and lane 0 of pixel (0,0) (in the first).
        v[4 * b + 1] = f32::NAN;
        v[0] = f32::NAN;
        let x = Tensor::from_f32(&[1, 1, 3, 3, b as u64], v).unwrap();
        let want = tcc_ir::interp::run(&f, std::slice::from_ref(&x)).unwrap();
        let got = Executable::compile(&f).unwrap().run(&[x]).unwrap();
        let (Data::F32(g), Data::F32(w)) = (got[0].data(), want[0].data()) else {
            unreachable!()
        };
        assert!(
            g.iter()
                .zip(w)
                .all(|(a, b)| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())),
            "block {b}: {g:?} vs {w:?}"
        );
        assert!(g[0].is_nan() && !g[b].is_nan() && (0..4).all(|p| g[p * b + 1].is_nan()));
    }
}

#[test]
fn max_pooling_with_nan_and_ties() {
    // One plane holds a NaN (it wins its window, and its gradient goes there); another has ties
    // (the first maximum gets the gradient). The tiled fast paths take the exact route.
    let src = "func @f(%x: f32[1,2,2,4], %dy: f32[1,2,1,2]) -> (f32[1,2,1,2], f32[1,2,2,4]) {\n  %p = max_pool2d %x {kernel=[2,2], strides=[2,2]} : f32[1,2,1,2]\n  %g = max_pool2d_grad %x, %dy {kernel=[2,2], strides=[2,2]} : f32[1,2,2,4]\n  return %p, %g\n}";
    let f = parse_function(src).unwrap();
    let x = Tensor::from_f32(
        &[1, 2, 2, 4],
        vec![
            1.0,
            f32::NAN,
            3.0,
            3.0,
            2.0,
            5.0,
            3.0,
            1.0, // plane 0: NaN wins window 0
            4.0,
            4.0,
            0.0,
            -1.0,
            4.0,
            2.0,
            -1.0,
            -1.0, // plane 1: ties
        ],
    )
    .unwrap();
    let dy = Tensor::from_f32(&[1, 2, 1, 2], vec![10.0, 20.0, 30.0, 40.0]).unwrap();
    let want = tcc_ir::interp::run(&f, &[x.clone(), dy.clone()]).unwrap();
    let got = Executable::compile(&f).unwrap().run(&[x, dy]).unwrap();
    for (g, w) in got.iter().zip(&want) {
        let (Data::F32(g), Data::F32(w)) = (g.data(), w.data()) else {
            unreachable!()
        };
        assert!(
            g.iter()
                .zip(w)
                .all(|(a, b)| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())),
            "{g:?} vs {w:?}"
        );
    }
    let Data::F32(g) = got[1].data() else {
        unreachable!()
    };
    assert_eq!(g[1], 10.0, "the NaN takes window 0's gradient");
    assert_eq!(
        g[8], 30.0,
        "the first of the tied 4.0s takes window 0's gradient"
    );
}

#[test]
fn overlapping_max_pooling_with_nan() {
    // Padded, strided, overlapping windows (the row-wise path): a plane with a NaN takes the
    // exact window-by-window path, where NaN wins; the plane without one is row by row.
    let src = "func @f(%x: f32[1,2,5,6]) -> (f32[1,2,3,3]) {\n  %p = max_pool2d %x {kernel=[3,3], strides=[2,2], pads=[1,1,1,0]} : f32[1,2,3,3]\n  return %p\n}";
    let f = parse_function(src).unwrap();
    let mut v: Vec<f32> = (0..60)
        .map(|i| ((i * 7 % 23) as f32 - 11.0) / 4.0)
        .collect();
    v[8] = f32::NAN;
    let x = Tensor::from_f32(&[1, 2, 5, 6], v).unwrap();
    let want = tcc_ir::interp::run(&f, std::slice::from_ref(&x)).unwrap();
    let got = Executable::compile(&f).unwrap().run(&[x]).unwrap();
    let (Data::F32(g), Data::F32(w)) = (got[0].data(), want[0].data()) else {
        unreachable!()
    };
    assert!(
        g[..9].iter().any(|a| a.is_nan()),
        "the NaN wins its windows: {g:?}"
    );
    assert!(
        g.iter()
            .zip(w)
            .all(|(a, b)| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())),
        "{g:?} vs {w:?}"
    );
}

/// [`case`], and the ops run on compiled or native kernels, none on the reference kernels.
fn case_native(params: &str, body: &str, out_ty: &str, seed: u64) {
    case(params, body, out_ty, seed);
    let src = format!("func @f({params}) -> ({out_ty}) {{\n{body}\n  return %out\n}}");
    let f = parse_function(&src).unwrap();
    let exe = Executable::compile(&f).unwrap();
    assert_eq!(exe.reference_ops(), Vec::<String>::new(), "{src}");
}

/// What real models use: inference batch norm, global average pooling, slices and
/// concatenations of every dtype, powers with a constant exponent.
#[test]
fn model_ops_run_natively() {
    case_native(
        "%x: f32[2,3,5,4], %g: f32[3], %b: f32[3], %m: f32[3], %v: f32[3]",
        "  %va = abs %v : f32[3]\n  %out = batch_norm %x, %g, %b, %m, %va : f32[2,3,5,4]",
        "f32[2,3,5,4]",
        40,
    );
    case_native(
        "%x: f32[5,3], %g: f32[3], %b: f32[3], %m: f32[3], %v: f32[3]",
        "  %va = abs %v : f32[3]\n  %out = batch_norm %x, %g, %b, %m, %va {eps=0.1} : f32[5,3]",
        "f32[5,3]",
        41,
    );
    case_native(
        "%x: f32[1,40,7,9]",
        "  %out = global_avg_pool %x : f32[1,40,1,1]",
        "f32[1,40,1,1]",
        42,
    );
    for (dt, seed) in [
        ("f32", 43),
        ("i64", 44),
        ("u8", 45),
        ("bool", 46),
        ("f64", 47),
    ] {
        for (slice, out) in [
            ("{starts=[0,2,0,0], ends=[2,5,4,3]}", "[2,3,4,3]"),
            ("{starts=[0,0,1,0], ends=[2,6,3,3]}", "[2,6,2,3]"),
            ("{starts=[1,0,0,0], ends=[2,6,4,3]}", "[1,6,4,3]"),
            (
                "{starts=[0,1,0,2], ends=[2,6,4,-4], steps=[1,2,1,-1]}",
                "[2,3,4,3]",
            ),
            (
                "{starts=[0,0,3,0], ends=[2,6,0,3], steps=[1,1,-2,1]}",
                "[2,6,2,3]",
            ),
            ("{starts=[0,0,0,0], ends=[2,6,4,3]}", "[2,6,4,3]"),
            ("{starts=[0,4,0,0], ends=[2,4,4,3]}", "[2,0,4,3]"),
        ] {
            case_native(
                &format!("%x: {dt}[2,6,4,3]"),
                &format!("  %out = slice %x {slice} : {dt}{out}"),
                &format!("{dt}{out}"),
                seed,
            );
        }
        for (axis, out) in [("0", "[7,3,2]"), ("1", "[2,8,2]"), ("2", "[2,3,7]")] {
            let (a, b) = match axis {
                "0" => ("[2,3,2]", "[3,3,2]"),
                "1" => ("[2,3,2]", "[2,2,2]"),
                _ => ("[2,3,2]", "[2,3,3]"),
            };
            case_native(
                &format!("%a: {dt}{a}, %b: {dt}{b}"),
                &format!("  %out = concat %a, %b, %a {{axis={axis}}} : {dt}{out}"),
                &format!("{dt}{out}"),
                seed,
            );
        }
    }
    for (dt, ix) in [("f32", "i64"), ("u8", "i32"), ("i64", "i64")] {
        case_native(
            &format!("%t: {dt}[10,3,2]"),
            &format!(
                "  %i = const {{value=[9, 0, -1, 4, 4]}} : {ix}[5]\n  %out = gather %t, %i {{axis=0}} : {dt}[5,3,2]"
            ),
            &format!("{dt}[5,3,2]"),
            49,
        );
        case_native(
            &format!("%t: {dt}[4,3,2]"),
            &format!(
                "  %i = const {{value=[2, 0, -3, 1]}} : {ix}[2,2]\n  %out = gather %t, %i {{axis=1}} : {dt}[4,2,2,2]"
            ),
            &format!("{dt}[4,2,2,2]"),
            50,
        );
    }
    // Along the last axis (blocks of one element, copied as values) for 1, 4 and 8-byte
    // elements, and a nearest-neighbour upsampling large enough to split among threads.
    for dt in ["u8", "f32", "i64", "f64"] {
        case_native(
            &format!("%t: {dt}[3,5,7]"),
            &format!(
                "  %i = const {{value=[6, 0, 0, -1, 3]}} : i64[5]\n  %out = gather %t, %i {{axis=-1}} : {dt}[3,5,5]"
            ),
            &format!("{dt}[3,5,5]"),
            54,
        );
    }
    let nearest: Vec<String> = (0..64).map(|j| (j / 2).to_string()).collect();
    case_native(
        "%t: f32[2,48,32,32]",
        &format!(
            "  %i = const {{value=[{}]}} : i32[64]\n  %out = gather %t, %i {{axis=3}} : f32[2,48,32,64]",
            nearest.join(", ")
        ),
        "f32[2,48,32,64]",
        55,
    );
    for op in ["softmax", "log_softmax"] {
        for (axis, seed) in [("0", 51), ("1", 52), ("-1", 53)] {
            case_native(
                "%x: f32[3,4,16,5]",
                &format!("  %out = {op} %x {{axis={axis}}} : f32[3,4,16,5]"),
                "f32[3,4,16,5]",
                seed,
            );
        }
    }
    for (dt, x, k, axis, largest) in [
        ("f32", "[4,9]", 3, -1, true),
        ("f32", "[4,9,2]", 9, 1, false),
        ("f32", "[6,3]", 0, 0, true),
        ("i64", "[5,7]", 4, 1, true),
    ] {
        let mut d: Vec<u64> = x
            .trim_matches(|c| c == '[' || c == ']')
            .split(',')
            .map(|s| s.parse().unwrap())
            .collect();
        let a = if axis < 0 { d.len() - 1 } else { axis as usize };
        d[a] = k;
        let out = format!("{d:?}").replace(' ', "");
        // The native kernel is f32; other dtypes run on the reference kernels.
        let run = if dt == "f32" { case_native } else { case };
        run(
            &format!("%x: {dt}{x}"),
            &format!(
                "  %out, %idx = top_k %x {{k={k}, axis={axis}, largest={largest}}} : {dt}{out}, i64{out}"
            ),
            &format!("{dt}{out}"),
            54,
        );
        // The indices too.
        case(
            &format!("%x: {dt}{x}"),
            &format!(
                "  %v, %out = top_k %x {{k={k}, axis={axis}, largest={largest}}} : {dt}{out}, i64{out}"
            ),
            &format!("i64{out}"),
            55,
        );
    }
    for (x, lo, hi, bits) in [
        ("f32[4,9]", "f32[]", "f32[]", 8),
        ("f32[3,4,5]", "f32[4,1]", "f32[4,1]", 4),
        ("f64[7]", "f64[]", "f64[]", 16),
    ] {
        let dt = &x[..3];
        case_native(
            &format!("%x: {x}, %d: {lo}, %e: {hi}"),
            &format!(
                "  %lo = neg %d : {lo}\n  %a = abs %e : {hi}\n  %one = const {{value=0.5}} : {dt}[]\n  %hi = add %a, %one : {hi}\n  %out = fake_quant %x, %lo, %hi {{bits={bits}, narrow=true}} : {x}"
            ),
            x,
            56,
        );
    }
    for e in ["2.0", "1.0", "0.0", "-1.0"] {
        case_native(
            "%x: f32[3,5]",
            &format!("  %e = const {{value={e}}} : f32[]\n  %out = pow %x, %e : f32[3,5]"),
            "f32[3,5]",
            48,
        );
    }
}

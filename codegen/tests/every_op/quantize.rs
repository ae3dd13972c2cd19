//! Quantization on its native kernels: `quantize_linear` and `dequantize_linear` per tensor
//! and per channel, both byte types, and `matmul_integer` with zero points per tensor, per row
//! and per column, batches broadcast; exact against the interpreter.

use super::*;

/// Every target of `common::TARGETS` (AVX-512 VNNI where the host has it, with AMX where it
/// has that; AVX2 for `host,-avx512f`, with AVX-VNNI where the host has that), AVX-512 VNNI
/// without AMX, AVX2 without AVX-VNNI, and one without AVX2 for the integer product's portable
/// loop.
fn integer_targets() -> Vec<common::Target> {
    let mut t = common::TARGETS.to_vec();
    t.push((Some("host,-amx"), tcc_codegen::VectorWidth::Auto));
    t.push((
        Some("host,-avx512f,-avxvnni"),
        tcc_codegen::VectorWidth::Auto,
    ));
    t.push((Some("host,-avx512f,-avx2"), tcc_codegen::VectorWidth::Auto));
    t
}

#[test]
fn quantize_and_dequantize() {
    for (zt, z) in [("u8", "7"), ("i8", "-3")] {
        // Per tensor, a round trip.
        case_native(
            "%x: f32[3,37]",
            &format!(
                "  %s = const {{value=0.05}} : f32[]\n  %z = const {{value={z}}} : {zt}[]\n  %q = quantize_linear %x, %s, %z : {zt}[3,37]\n  %out = dequantize_linear %q, %s, %z : f32[3,37]"
            ),
            "f32[3,37]",
            90,
        );
        // Per channel of NCHW, the levels themselves.
        case_native(
            &format!("%x: f32[2,3,5,5], %s: f32[3,1,1], %z: {zt}[3,1,1]"),
            &format!(
                "  %a = abs %s : f32[3,1,1]\n  %out = quantize_linear %x, %a, %z : {zt}[2,3,5,5]"
            ),
            &format!("{zt}[2,3,5,5]"),
            91,
        );
        // Large enough to split across the pool, channels crossing the chunks' bounds.
        case_native(
            &format!("%x: f32[2,3,100,100], %s: f32[3,1,1], %z: {zt}[3,1,1]"),
            &format!(
                "  %a = abs %s : f32[3,1,1]\n  %q = quantize_linear %x, %a, %z : {zt}[2,3,100,100]\n  %out = dequantize_linear %q, %a, %z : f32[2,3,100,100]"
            ),
            "f32[2,3,100,100]",
            95,
        );
        case_native(
            &format!("%q: {zt}[2,3,5,5], %s: f32[3,1,1], %z: {zt}[3,1,1]"),
            "  %a = abs %s : f32[3,1,1]\n  %out = dequantize_linear %q, %a, %z : f32[2,3,5,5]",
            "f32[2,3,5,5]",
            92,
        );
    }
}

#[test]
fn integer_products() {
    // Per row and per column, u8 x i8, a batch of A over a shared B.
    case_native(
        "%a: u8[2,5,7], %b: i8[7,3], %za: u8[5,1], %zb: i8[3]",
        "  %out = matmul_integer %a, %b, %za, %zb : i32[2,5,3]",
        "i32[2,5,3]",
        93,
    );
    // Scalars, i8 x u8, B batched over a shared A.
    case_native(
        "%a: i8[4,9], %b: u8[3,9,2], %za: i8[], %zb: u8[]",
        "  %out = matmul_integer %a, %b, %za, %zb : i32[3,4,2]",
        "i32[3,4,2]",
        94,
    );
}

/// The integer product on every target (AVX-512 VNNI where the host has it, AVX2, the portable
/// loop) over the whole 8-bit ranges and at the extremes (255 x -128 over `k` =
/// 300, zero points at the ends of their ranges), for each pairing of u8 and i8, with rows and
/// columns that leave partial kernel tiles (9 rows, 37 columns) and `k` not a multiple of 4.
#[test]
fn integer_products_over_full_ranges() {
    use tcc_ir::DType::{I8, U8};
    let bytes = common::bytes;
    let name = |dt| if dt == U8 { "u8" } else { "i8" };
    for (ta, tb) in [(U8, I8), (I8, U8), (U8, U8), (I8, I8)] {
        for k in [300u64, 7] {
            let src = format!(
                "func @f(%a: {a}[2,9,{k}], %b: {b}[{k},37], %za: {a}[9,1], %zb: {b}[37]) -> (i32[2,9,37]) {{
  %y = matmul_integer %a, %b, %za, %zb : i32[2,9,37]
  return %y
}}",
                a = name(ta),
                b = name(tb)
            );
            let f = parse_function(&src).unwrap();
            // Random bytes; then the extremes: A at its top, B at its bottom, zero points at
            // the other ends (the largest products).
            let (top_a, low_b, low_a, top_b) = extremes(ta, tb);
            for (i, extreme) in [false, true].into_iter().enumerate() {
                let pick = |v: i64| extreme.then_some(v);
                let inputs = vec![
                    bytes(ta, &[2, 9, k], pick(top_a), 10 + i as u64),
                    bytes(tb, &[k, 37], pick(low_b), 20 + i as u64),
                    bytes(ta, &[9, 1], pick(low_a), 30 + i as u64),
                    bytes(tb, &[37], pick(top_b), 40 + i as u64),
                ];
                let what = format!("{src}\nextremes {extreme}");
                agrees_on_every_target(&f, &inputs, &what, no_reference_ops);
            }
        }
    }
}

/// A product big enough (64 x 300 x 70) for the integer kernel to split its rows across the
/// thread pool, against the interpreter on every target.
#[test]
fn integer_products_split_across_threads() {
    same_on_every_target(
        "func @f(%a: u8[64,300], %b: i8[300,70], %za: u8[64,1], %zb: i8[70]) -> (i32[64,70]) {
  %y = matmul_integer %a, %b, %za, %zb : i32[64,70]
  return %y
}",
        5,
    );
}

/// Products of constant right operands (a dense layer's weights, packed once at compile time
/// on VNNI), i8 and u8, with zero points per column and per tensor, A batched over the shared
/// B, against the interpreter on every target.
#[test]
fn integer_products_with_constant_weights() {
    for (at, bt) in [("u8", "i8"), ("i8", "u8")] {
        let (k, n) = (19u64, 21u64);
        let level = |i: u64| {
            let v = (i * 53 + 5) % 256;
            if bt == "i8" { v as i64 - 128 } else { v as i64 }
        };
        let list = |count: u64, from: u64| {
            let v: Vec<String> = (0..count).map(|i| level(i + from).to_string()).collect();
            v.join(", ")
        };
        for zb in [format!("[{}]", list(n, 3)), level(9).to_string()] {
            let zt = if zb.starts_with('[') {
                format!("{bt}[{n}]")
            } else {
                format!("{bt}[]")
            };
            let src = format!(
                "func @f(%a: {at}[3,5,{k}], %za: {at}[]) -> (i32[3,5,{n}]) {{
  %b = const {{value=[{b}]}} : {bt}[{k},{n}]
  %zb = const {{value={zb}}} : {zt}
  %y = matmul_integer %a, %b, %za, %zb : i32[3,5,{n}]
  return %y
}}",
                b = list(k * n, 0),
            );
            same_on_every_target(&src, 31);
        }
    }
}

/// `src` compiled for every integer target against the interpreter, on random bytes for each
/// parameter (seeds from `seed`).
fn same_on_every_target(src: &str, seed: u64) {
    let f = parse_function(src).unwrap();
    let inputs: Vec<Tensor> = (f.params().iter().enumerate())
        .map(|(i, &p)| common::bytes(f.ty(p).dtype(), f.ty(p).dims(), None, seed + i as u64))
        .collect();
    agrees_on_every_target(&f, &inputs, src, |_| {});
}

/// `f` compiled for every integer target gives the interpreter's results on `inputs`, bit for
/// bit (`what` says which case), after `check` of each executable.
pub(super) fn agrees_on_every_target(
    f: &tcc_ir::Function,
    inputs: &[Tensor],
    what: &str,
    check: impl Fn(&Executable),
) {
    let want = tcc_ir::interp::run(f, inputs).unwrap();
    for target in integer_targets() {
        let exe = common::compile(f, target, true);
        check(&exe);
        assert_eq!(exe.run(inputs).unwrap(), want, "{what}\ntarget {target:?}");
    }
}

/// Every op of `exe` runs on compiled or native kernels.
pub(super) fn no_reference_ops(exe: &Executable) {
    assert_eq!(exe.reference_ops(), Vec::<String>::new());
}

/// The levels that make the largest products of a `ta` operand with a `tb` one: A at its top
/// and B at its bottom, their zero points at the other ends (`(top_a, low_b, low_a, top_b)`).
pub(super) fn extremes(ta: tcc_ir::DType, tb: tcc_ir::DType) -> (i64, i64, i64, i64) {
    let u8_a = ta == tcc_ir::DType::U8;
    let u8_b = tb == tcc_ir::DType::U8;
    (
        if u8_a { 255 } else { 127 },
        if u8_b { 0 } else { -128 },
        if u8_a { 0 } else { -128 },
        if u8_b { 255 } else { 127 },
    )
}

/// `conv_integer` on every target against the interpreter, exactly: padding (which must add
/// nothing, as the input's zero point), strides, dilations, groups, depthwise, the 1x1 case
/// that reads the image as its columns, zero points per tensor and per output channel, each
/// pairing of u8 and i8, random bytes and the extremes (largest products, padding included).
#[test]
fn integer_convolutions() {
    use tcc_ir::DType::{I8, U8};
    // (input dims, filter dims, attributes, output dims, per-channel filter zero points)
    let shapes = [
        (
            [2, 5, 7, 7],
            [9, 5, 3, 3],
            "pads=[1,1,1,1]",
            [2, 9, 7, 7],
            true,
        ),
        (
            [1, 4, 9, 8],
            [6, 2, 3, 2],
            "strides=[2,1], pads=[1,0,2,1], dilations=[2,2], groups=2",
            [1, 6, 4, 7],
            true,
        ),
        (
            [1, 6, 5, 5],
            [6, 1, 3, 3],
            "pads=[1,1,1,1], groups=6",
            [1, 6, 5, 5],
            true,
        ),
        ([2, 8, 4, 5], [3, 8, 1, 1], "", [2, 3, 4, 5], false),
        (
            [1, 3, 5, 5],
            [4, 3, 1, 1],
            "strides=[2,2]",
            [1, 4, 3, 3],
            true,
        ),
        // Rows wider than a block of pixels: blocks inside a row and across two.
        (
            [1, 3, 6, 41],
            [5, 3, 3, 3],
            "pads=[1,1,1,1]",
            [1, 5, 6, 41],
            true,
        ),
        // Stride 3 (read a byte at a time), padding on two sides only.
        (
            [1, 2, 11, 40],
            [4, 2, 3, 3],
            "strides=[3,3], pads=[1,2,0,1]",
            [1, 4, 4, 14],
            false,
        ),
        // Depthwise (its own kernel): strides, dilation and padding on every side differing,
        // batches; a 5x5 at stride 3; one big enough to split its channels across the pool;
        // and a channel multiplier of 2, which is not depthwise in that sense.
        (
            [2, 8, 11, 13],
            [8, 1, 3, 3],
            "strides=[2,2], pads=[1,0,2,1], dilations=[2,1], groups=8",
            [2, 8, 5, 6],
            false,
        ),
        (
            [1, 4, 10, 17],
            [4, 1, 5, 5],
            "strides=[3,3], pads=[2,2,2,2], groups=4",
            [1, 4, 4, 6],
            true,
        ),
        (
            [2, 16, 20, 20],
            [16, 1, 3, 3],
            "pads=[1,1,1,1], groups=16",
            [2, 16, 20, 20],
            true,
        ),
        (
            [1, 3, 6, 6],
            [6, 1, 3, 3],
            "pads=[1,1,1,1], groups=3",
            [1, 6, 6, 6],
            true,
        ),
        // Three rows of taps at row stride 1, as the f32 kernel loads each input row once for
        // them: with a column stride of 2, a column dilation and uneven padding (12 rows: a
        // tile of 8 and one past the plane's last row), and a 3x1 filter.
        (
            [1, 5, 12, 33],
            [5, 1, 3, 3],
            "strides=[1,2], pads=[0,1,2,1], dilations=[1,2], groups=5",
            [1, 5, 12, 16],
            true,
        ),
        (
            [1, 3, 10, 10],
            [3, 1, 3, 1],
            "pads=[1,0,1,0], groups=3",
            [1, 3, 10, 10],
            false,
        ),
        // 14 rows: the f32 kernel's tiles of 7.
        (
            [1, 4, 14, 9],
            [4, 1, 3, 3],
            "pads=[1,1,1,1], groups=4",
            [1, 4, 14, 9],
            true,
        ),
        // Stride 2 over rows longer than the f32 kernel's 32-byte steps that split a row into
        // its column phases; 256 taps, the most whose sums at the extremes f32 still holds
        // (258), and 272, which takes the i32 kernel.
        (
            [1, 3, 9, 70],
            [3, 1, 3, 3],
            "strides=[2,2], pads=[1,1,1,1], groups=3",
            [1, 3, 5, 35],
            false,
        ),
        (
            [1, 2, 18, 18],
            [2, 1, 16, 16],
            "groups=2",
            [1, 2, 3, 3],
            false,
        ),
        (
            [1, 2, 18, 18],
            [2, 1, 17, 16],
            "groups=2",
            [1, 2, 2, 3],
            true,
        ),
        // A stem: 7x7, stride 2, wide rows.
        (
            [1, 3, 9, 70],
            [6, 3, 7, 7],
            "strides=[2,2], pads=[3,3,3,3]",
            [1, 6, 5, 35],
            true,
        ),
    ];
    for (ta, tb) in [(U8, I8), (I8, U8), (U8, U8), (I8, I8)] {
        for &(xd, wd, attrs, yd, per_channel) in &shapes {
            let (f, src, wz) = conv_integer_of((ta, tb), (xd, wd, yd), attrs, per_channel);
            let (top_a, low_b, low_a, top_b) = extremes(ta, tb);
            for (i, extreme) in [false, true].into_iter().enumerate() {
                let pick = |v: i64| extreme.then_some(v);
                let inputs = vec![
                    common::bytes(ta, &xd, pick(top_a), 50 + i as u64),
                    common::bytes(tb, &wd, pick(low_b), 60 + i as u64),
                    common::bytes(ta, &[], pick(low_a), 70 + i as u64),
                    common::bytes(tb, &wz, pick(top_b), 80 + i as u64),
                ];
                let what = format!("{src}\nextremes {extreme}");
                agrees_on_every_target(&f, &inputs, &what, no_reference_ops);
            }
        }
    }
}

/// A function of one `conv_integer` of `ta` input `xd` and `tb` filter `wd` with `attrs`, its
/// filter's zero points per output channel or one; with its text and the zero points' dims.
pub(super) fn conv_integer_of(
    (ta, tb): (tcc_ir::DType, tcc_ir::DType),
    (xd, wd, yd): ([u64; 4], [u64; 4], [u64; 4]),
    attrs: &str,
    per_channel: bool,
) -> (tcc_ir::Function, String, Vec<u64>) {
    let name = |dt| if dt == tcc_ir::DType::U8 { "u8" } else { "i8" };
    let wz: Vec<u64> = if per_channel {
        vec![wd[0], 1, 1, 1]
    } else {
        vec![]
    };
    let src = format!(
        "func @f(%x: {a}{xd:?}, %w: {b}{wd:?}, %xz: {a}[], %wz: {b}{wz:?}) -> (i32{yd:?}) {{
  %y = conv_integer %x, %w, %xz, %wz {{{attrs}}} : i32{yd:?}
  return %y
}}",
        a = name(ta),
        b = name(tb)
    )
    .replace(" {}", "");
    let f = parse_function(&src).unwrap_or_else(|d| panic!("{src}\n{d}"));
    (f, src, wz)
}

/// `conv_integer` with a constant filter and zero points (prepared once, at compile time, on
/// AVX-512 VNNI) against the interpreter on every target: u8 and i8 images, i8 and u8 filters,
/// the zero points per output channel.
#[test]
fn integer_convolutions_with_constant_filters() {
    for (xt, wt) in [("u8", "i8"), ("i8", "u8")] {
        let (o, c) = (11u64, 6u64);
        let level = |i: u64| {
            let v = (i * 37 + 11) % 256;
            if wt == "i8" { v as i64 - 128 } else { v as i64 }
        };
        let list = |n: u64, from: u64| {
            let v: Vec<String> = (0..n).map(|i| level(i + from).to_string()).collect();
            v.join(", ")
        };
        let src = format!(
            "func @f(%x: {xt}[2,{c},9,13], %xz: {xt}[]) -> (i32[2,{o},9,13]) {{
  %w = const {{value=[{w}]}} : {wt}[{o},{c},3,3]
  %wz = const {{value=[{z}]}} : {wt}[{o},1,1,1]
  %y = conv_integer %x, %w, %xz, %wz {{pads=[1,1,1,1]}} : i32[2,{o},9,13]
  return %y
}}",
            w = list(o * c * 9, 0),
            z = list(o, 7),
        );
        same_on_every_target(&src, 25);
    }
}

/// A convolution big enough (64 x 288 x 256 multiply-adds per image) for the product to split
/// across the thread pool, against the interpreter on every target.
#[test]
fn integer_convolutions_split_across_threads() {
    same_on_every_target(
        "func @f(%x: u8[1,32,16,16], %w: i8[64,32,3,3], %xz: u8[], %wz: i8[64,1,1,1]) -> (i32[1,64,16,16]) {
  %y = conv_integer %x, %w, %xz, %wz {pads=[1,1,1,1]} : i32[1,64,16,16]
  return %y
}",
        15,
    );
}

/// A deep layer: few pixels (two blocks) and many output channels, which the VNNI kernel
/// splits across the pool by channels, each block packed once for all the items that read it.
#[test]
fn integer_convolutions_split_by_channels() {
    same_on_every_target(
        "func @f(%x: u8[1,64,7,7], %w: i8[128,64,3,3], %xz: u8[], %wz: i8[128,1,1,1]) -> (i32[1,128,7,7]) {
  %y = conv_integer %x, %w, %xz, %wz {pads=[1,1,1,1]} : i32[1,128,7,7]
  return %y
}",
        35,
    );
}

/// A depthwise convolution whose filter and per-channel zero points are constants, so that
/// its taps are made at compile time: the same sums as the interpreter's (and as with the
/// filter a parameter, made on each run), i8 and u8 filters, with a requantizing chain too.
#[test]
fn depthwise_taps_made_at_compile_time() {
    for (wt, taps, zeros) in [
        (
            "i8",
            "-128, 127, -1, 0, 5, -77, 99, 3, -6",
            "[-128, 0, 7, 127, -3]",
        ),
        (
            "u8",
            "255, 0, 1, 128, 200, 17, 3, 254, 9",
            "[0, 255, 128, 1, 77]",
        ),
    ] {
        let w: Vec<&str> = (0..5).map(|_| taps).collect();
        let src = format!(
            "func @f(%x: u8[1,5,9,11]) -> (i32[1,5,9,11], u8[1,5,9,11]) {{
  %w = const {{value=[{}]}} : {wt}[5,1,3,3]
  %wz = const {{value={zeros}}} : {wt}[5,1,1,1]
  %xz = const {{value=7}} : u8[]
  %y = conv_integer %x, %w, %xz, %wz {{pads=[1,1,1,1], groups=5}} : i32[1,5,9,11]
  %f = cast %y {{to=f32}} : f32[1,5,9,11]
  %qs = const {{value=3.5}} : f32[]
  %q = quantize_linear %f, %qs, %xz : u8[1,5,9,11]
  return %y, %q
}}",
            w.join(", ")
        );
        same_on_every_target(&src, 37);
    }
}

/// A pointwise layer with few blocks and many channels (mobilenet's 14x14 expansions): items
/// of several blocks of one channel tile, the last of each tile shorter.
#[test]
fn integer_convolutions_take_blocks_by_the_span() {
    same_on_every_target(
        "func @f(%x: u8[1,32,14,14], %w: i8[384,32,1,1], %xz: u8[], %wz: i8[384,1,1,1]) -> (i32[1,384,14,14]) {
  %y = conv_integer %x, %w, %xz, %wz : i32[1,384,14,14]
  return %y
}",
        36,
    );
}

/// `quantize_linear` at the values that decide its rounding and saturation: exact halves
/// (which round to even), the ends of both ranges and half a level past them, huge and
/// infinite quotients, NaN (the zero point), negative zero; u8 and i8, on every target.
#[test]
fn quantize_rounds_half_to_even_and_saturates() {
    let xs: Vec<f32> = vec![
        -2.5,
        -1.5,
        -0.5,
        -0.0,
        0.5,
        1.5,
        2.5,
        3.5,
        126.5,
        127.5,
        128.5,
        253.5,
        254.5,
        255.5,
        -127.5,
        -128.5,
        -129.5,
        1e30,
        -1e30,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        4194303.5,
        -4194304.5,
        1025.0,
        -1025.0,
        0.49999997,
        8388609.0,
    ];
    let n = xs.len();
    for (zt, z) in [("u8", "3"), ("i8", "-3"), ("u8", "255"), ("i8", "127")] {
        let src = format!(
            "func @f(%x: f32[{n}]) -> ({zt}[{n}]) {{
  %s = const {{value=1.0}} : f32[]
  %z = const {{value={z}}} : {zt}[]
  %y = quantize_linear %x, %s, %z : {zt}[{n}]
  return %y
}}"
        );
        let f = parse_function(&src).unwrap();
        let inputs = vec![Tensor::from_f32(&[n as u64], xs.clone()).unwrap()];
        agrees_on_every_target(&f, &inputs, &src, no_reference_ops);
    }
}

/// `max_pool2d` of u8 and i8 levels on its native kernel, against the interpreter on every
/// target: the 3x3 stride-2 and 2x2 windows written out, other shapes (strides 1 and 3,
/// asymmetric padding, windows wider than tall), planes split across the pool, and the
/// extremes of both types (padding must never win, even over the least level).
#[test]
fn integer_max_pooling() {
    use tcc_ir::DType::{I8, U8};
    let shapes = [
        (
            [1, 64, 112, 112],
            "kernel=[3,3], strides=[2,2], pads=[1,1,1,1]",
            [1, 64, 56, 56],
        ),
        ([2, 3, 9, 10], "kernel=[2,2], strides=[2,2]", [2, 3, 4, 5]),
        (
            [1, 4, 7, 9],
            "kernel=[3,2], strides=[1,1], pads=[1,0,1,1]",
            [1, 4, 7, 9],
        ),
        (
            [1, 2, 11, 13],
            "kernel=[2,4], strides=[3,3], pads=[1,2,0,1]",
            [1, 2, 4, 5],
        ),
        (
            [1, 5, 8, 8],
            "kernel=[3,3], strides=[2,2], pads=[1,1,1,1]",
            [1, 5, 4, 4],
        ),
    ];
    for dt in [U8, I8] {
        let name = if dt == U8 { "u8" } else { "i8" };
        for (xd, attrs, yd) in &shapes {
            let src = format!(
                "func @f(%x: {name}{xd:?}) -> ({name}{yd:?}) {{
  %y = max_pool2d %x {{{attrs}}} : {name}{yd:?}
  return %y
}}"
            );
            let f = parse_function(&src).unwrap_or_else(|d| panic!("{src}\n{d}"));
            let least = if dt == U8 { 0 } else { -128 };
            for (i, fill) in [None, Some(least)].into_iter().enumerate() {
                let inputs = vec![common::bytes(dt, xd, fill, 90 + i as u64)];
                agrees_on_every_target(&f, &inputs, &src, no_reference_ops);
            }
        }
    }
}

/// Quantizations after a float convolution in the blocked (NCHWc) layout, whose blocks pad
/// the channels: a scale per channel (5 channels, blocks of 8) keeps the quantization plain,
/// and a scale for a one-channel result broadcasts over the block instead of being padded with
/// zeros (which are not scales; random functions found it). Against the interpreter on every
/// target.
#[test]
fn quantizations_around_blocked_convolutions() {
    for (c, s, z) in [
        (5u64, "[0.05, 0.1, 0.02, 0.2, 0.07]", "[3, 128, 0, 255, 17]"),
        (1, "[0.05]", "[3]"),
    ] {
        let src = format!(
            "func @f(%x: f32[1,3,6,6], %w: f32[{c},3,3,3]) -> (u8[1,{c},6,6], f32[1,{c},6,6]) {{
  %y = conv2d %x, %w {{pads=[1,1,1,1]}} : f32[1,{c},6,6]
  %s = const {{value={s}}} : f32[1,{c},1,1]
  %z = const {{value={z}}} : u8[1,{c},1,1]
  %q = quantize_linear %y, %s, %z : u8[1,{c},6,6]
  %d = dequantize_linear %q, %s, %z : f32[1,{c},6,6]
  return %q, %d
}}"
        );
        let f = parse_function(&src).unwrap_or_else(|d| panic!("{src}\n{d}"));
        let mut rng = tcc_ir::random::Rng::new(c);
        let inputs: Vec<Tensor> = (f.params().iter())
            .map(|&p| tcc_ir::random::random_tensor(f.ty(p), &mut rng))
            .collect();
        let want = tcc_ir::interp::run(&f, &inputs).unwrap();
        for target in integer_targets() {
            for plain in [false, true] {
                let exe = common::compile(&f, target, plain);
                assert_eq!(
                    exe.run(&inputs).unwrap(),
                    want,
                    "{src}\ntarget {target:?}, plain {plain}"
                );
            }
        }
    }
}

/// Quantization by scales whose reciprocal is not exact, at the values that decide its rounding
/// (`(k + 0.5) * s` in f32, and the f32 values on either side): the kernels multiply by the
/// reciprocal and divide only near ties, which must round as the quotient does, on every
/// target; standalone, and fused into an integer convolution's store (sixteen channels, each
/// its own scale, so that the quotients land on and beside halves).
#[test]
fn quantize_by_inexact_reciprocals_rounds_as_the_quotient() {
    for s in [0.1f32, 0.3, 1.0 / 3.0, 0.015_686_275, 7.3e-3, 0.003_921_569] {
        let xs: Vec<f32> = (-300..300)
            .flat_map(|k| {
                let t = (k as f32 + 0.5) * s;
                [t, t.next_down(), t.next_up()]
            })
            .collect();
        let n = xs.len();
        for (zt, z) in [("u8", "128"), ("i8", "0")] {
            let src = format!(
                "func @f(%x: f32[{n}]) -> ({zt}[{n}]) {{
  %s = const {{value={s:?}}} : f32[]
  %z = const {{value={z}}} : {zt}[]
  %y = quantize_linear %x, %s, %z : {zt}[{n}]
  return %y
}}"
            );
            let f = parse_function(&src).unwrap();
            let inputs = vec![Tensor::from_f32(&[n as u64], xs.clone()).unwrap()];
            agrees_on_every_target(&f, &inputs, &src, no_reference_ops);
        }
        // Every byte through a 1x1 convolution by +-1 into sixteen channels, each scaled so
        // that its quotients `x * (s_o / s)` fall on halves and around them, and past both
        // ends of the levels (u8 and i8).
        let scales: Vec<String> = (0..16)
            .map(|o| format!("{:?}", s * (0.5 + 0.125 * o as f32)))
            .collect();
        let signs: Vec<&str> = (0..16)
            .map(|o| if o % 2 == 0 { "1" } else { "-1" })
            .collect();
        for (zt, z) in [("u8", "3"), ("i8", "-5")] {
            let src = format!(
                "func @f(%x: u8[1,1,16,16]) -> ({zt}[1,16,16,16]) {{
  %w = const {{value=[{}]}} : i8[16,1,1,1]
  %xz = const {{value=0}} : u8[]
  %wz = const {{value=0}} : i8[]
  %acc = conv_integer %x, %w, %xz, %wz : i32[1,16,16,16]
  %f = cast %acc {{to=f32}} : f32[1,16,16,16]
  %so = const {{value=[{}]}} : f32[16,1,1]
  %m = mul %f, %so : f32[1,16,16,16]
  %s = const {{value={s:?}}} : f32[]
  %z = const {{value={z}}} : {zt}[]
  %q = quantize_linear %m, %s, %z : {zt}[1,16,16,16]
  return %q
}}",
                signs.join(", "),
                scales.join(", ")
            );
            let f = parse_function(&src).unwrap();
            let bytes: Vec<u8> = (0..=255).collect();
            let inputs = vec![Tensor::from_data(&[1, 1, 16, 16], tcc_ir::Data::U8(bytes)).unwrap()];
            agrees_on_every_target(&f, &inputs, &src, no_reference_ops);
        }
    }
}

/// `conv_integer` (and its depthwise kernel) and the requantizing chain after it (cast, scales,
/// bias, relu, a clip as `max` and `min` with scalars either side, `quantize_linear`), which the
/// CPU backend runs as one step storing the levels (or the f32
/// result when the chain does not quantize): bit for bit the interpreter's on every target,
/// random levels and parameters, including scales that overflow to infinity and biases that
/// make NaN (-inf + inf), which must land on the saturated levels and the zero point.
#[test]
fn integer_convolutions_with_their_requantization() {
    // (result type, filter type, per-channel scale, bias, relu, quantize, clip, depthwise);
    // clip 1 is `min(max(y, 0), 0.05)`, 2 the same with the scalars first (which differ on
    // zeros of both signs).
    let chains = [
        ("u8", "i8", true, true, false, true, 0, false),
        ("i8", "i8", true, true, true, true, 0, false),
        ("u8", "u8", false, false, true, true, 0, false),
        ("f32", "i8", true, true, true, false, 0, false),
        ("f32", "i8", false, true, false, false, 0, false),
        ("u8", "i8", true, true, false, true, 1, false),
        ("f32", "i8", true, true, false, false, 2, false),
        ("f32", "i8", true, true, false, false, 1, true),
        ("i8", "u8", false, true, true, true, 2, true),
        ("u8", "i8", true, true, false, true, 0, true),
    ];
    for (yt, wt, per_channel, bias, relu, quantize, clip, depthwise) in chains {
        let (c, conv_attrs) = if depthwise {
            (7u64, "pads=[1,1,1,1], groups=7")
        } else {
            (5, "pads=[1,1,1,1]")
        };
        let cg = if depthwise { 1 } else { c };
        let s = if per_channel { "[1,7,1,1]" } else { "[]" };
        let mut body = vec![
            format!("  %acc = conv_integer %x, %w, %xz, %wz {{{conv_attrs}}} : i32[2,7,6,37]"),
            "  %c = cast %acc {to=f32} : f32[2,7,6,37]".to_string(),
            "  %m = mul %c, %s : f32[2,7,6,37]".to_string(),
        ];
        let mut cur = "%m";
        if bias {
            body.push(format!("  %b1 = add {cur}, %b : f32[2,7,6,37]"));
            cur = "%b1";
        }
        if relu {
            body.push(format!("  %r = relu {cur} : f32[2,7,6,37]"));
            cur = "%r";
        }
        if clip > 0 {
            let (a, b) = if clip == 1 {
                (cur, "%lo")
            } else {
                ("%lo", cur)
            };
            body.push(format!("  %lo1 = max {a}, {b} : f32[2,7,6,37]"));
            let (a, b) = if clip == 1 {
                ("%lo1", "%hi")
            } else {
                ("%hi", "%lo1")
            };
            body.push(format!("  %hi1 = min {a}, {b} : f32[2,7,6,37]"));
            cur = "%hi1";
        }
        if quantize {
            body.push(format!(
                "  %q = quantize_linear {cur}, %qs, %qz : {yt}[2,7,6,37]"
            ));
            cur = "%q";
        }
        let src = format!(
            "func @f(%x: u8[2,{c},6,37], %w: {wt}[7,{cg},3,3], %xz: u8[], %wz: {wt}[], %s: f32{s}, %b: f32[1,7,1,1]) -> ({yt}[2,7,6,37]) {{
  %qs = const {{value=0.37}} : f32[]
  %lo = const {{value=0.0}} : f32[]
  %hi = const {{value=0.05}} : f32[]
  %qz = const {{value=3}} : {zq}[]
{body}
  return {cur}
}}",
            zq = if yt == "f32" { "u8" } else { yt },
            body = body.join("\n"),
        );
        let f = parse_function(&src).unwrap_or_else(|d| panic!("{src}\n{d}"));
        let floats = |dims: &[u64], seed: u64, special: &[f32]| {
            let mut rng = tcc_ir::random::Rng::new(seed);
            let n: u64 = dims.iter().product();
            let v: Vec<f32> = (0..n as usize)
                .map(|i| match special.get(i) {
                    Some(&x) => x,
                    None => (rng.below(2000) as f32 - 1000.0) / 4000.0,
                })
                .collect();
            Tensor::from_f32(dims, v).unwrap()
        };
        let sd: Vec<u64> = if per_channel {
            vec![1, 7, 1, 1]
        } else {
            vec![]
        };
        // Channel 0's scale overflows every sum to infinity; channel 1's bias is -inf and, with
        // channel 1's scale also huge, some sums make NaN.
        let huge = if per_channel {
            vec![1e38, 1e38]
        } else {
            vec![]
        };
        let inputs = vec![
            common::bytes(tcc_ir::DType::U8, &[2, c, 6, 37], None, 1),
            common::bytes(
                if wt == "i8" {
                    tcc_ir::DType::I8
                } else {
                    tcc_ir::DType::U8
                },
                &[7, cg, 3, 3],
                None,
                2,
            ),
            common::bytes(tcc_ir::DType::U8, &[], None, 3),
            common::bytes(
                if wt == "i8" {
                    tcc_ir::DType::I8
                } else {
                    tcc_ir::DType::U8
                },
                &[],
                None,
                4,
            ),
            floats(&sd, 5, &huge),
            floats(&[1, 7, 1, 1], 6, &[0.0, f32::NEG_INFINITY]),
        ];
        agrees_on_every_target(&f, &inputs, &src, |exe| {
            let stats = exe.stats();
            assert_eq!(
                (stats.native, stats.compiled),
                (1, 0),
                "{src}\none fused step"
            );
        });
    }
}

//! The channel-blocked layout: conversions and every path of the blocked convolution kernels.

use super::case_native;

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
        // With AVX-512, two pairs of blocks a tile: four and a pair with a partial last block
        // in tiles of five pixels (7x7), and four with a partial last block, padded, strided.
        ("[1,16,7,7]", "[44,16,1,1]", "", "[1,6,7,7,8]"),
        (
            "[2,20,9,11]",
            "[30,20,3,3]",
            "{strides=[1,2], pads=[1,1,1,1]}",
            "[2,4,9,6,8]",
        ),
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
        // Rows wide enough that the depthwise kernel reads the image in place (tiles inside
        // it unchecked, those reaching into the padding checked): 5x5 and 7x7 at stride 1,
        // 5x5 at stride 2 unevenly padded, 3x3 dilated along the column at row stride 2, and
        // a 5x3 filter.
        (
            "[1,16,10,40]",
            "[16,1,5,5]",
            "{pads=[2,2,2,2], groups=16}",
            "[1,2,10,40,8]",
        ),
        (
            "[1,16,8,44]",
            "[16,1,7,7]",
            "{pads=[3,3,3,3], groups=16}",
            "[1,2,8,44,8]",
        ),
        (
            "[1,16,9,83]",
            "[16,1,5,5]",
            "{strides=[2,2], pads=[2,1,2,1], groups=16}",
            "[1,2,5,41,8]",
        ),
        (
            "[1,16,15,33]",
            "[16,1,3,3]",
            "{strides=[2,1], pads=[2,1,2,1], dilations=[2,1], groups=16}",
            "[1,2,8,33,8]",
        ),
        (
            "[1,16,6,30]",
            "[16,1,5,3]",
            "{pads=[2,1,2,1], groups=16}",
            "[1,2,6,30,8]",
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
            "[1,124,20,19]",
            "[128,124,3,3]",
            "{pads=[1,1,1,1]}",
            "[1,16,20,19,8]",
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
        // The filter a parameter (packed per run) and a constant (packed, or for 3x3 at stride
        // 1 transformed for Winograd's F(2x2, 3x3), at compile time), each reading the input
        // blocked and plain.
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
                &format!("%x: f32{x}, %w: f32{w}"),
                &format!("{pre}  %out = conv2d_nchwc {arg}, %w {attrs} : f32{y}"),
                &format!("f32{y}"),
                80 + i as u64,
            );
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
    // Infinite inputs make NaN sums in the output's padding lanes too (∞ times a zero weight),
    // which the store clears: a partial last block after one pair, and after two (AVX-512's
    // tiles of two pairs).
    for o in [12usize, 30] {
        let ob = o.div_ceil(8);
        let values: Vec<String> = (0..o * 8).map(|k| format!("{}", k % 5)).collect();
        case_native(
            "%x: f32[1,8,5,4]",
            &format!(
                "  %xb = to_nchwc %x {{block=8}} : f32[1,1,5,4,8]\n  %z = sub %xb, %xb : f32[1,1,5,4,8]\n  %r = reciprocal %z : f32[1,1,5,4,8]\n  %w = const {{value=[{}]}} : f32[{o},8,1,1]\n  %out = conv2d_nchwc %r, %w {{block=8}} : f32[1,{ob},5,4,8]",
                values.join(", ")
            ),
            &format!("f32[1,{ob},5,4,8]"),
            98,
        );
    }
}

/// A depthwise convolution (bias, relu6) whose output only a 1x1 convolution (bias, a
/// residual) reads runs as one fused step, band by band, where that output passes 1 MiB per
/// image: at stride 1 into a pair and a single output block, and at stride 2; the backend's
/// plan merges the two kernels. Below that size, or with a non-constant filter, they stay
/// apart; the results agree with the interpreter either way.
#[test]
fn fused_depthwise_pointwise() {
    let consts = |n: usize, scale: f32| -> String {
        let v: Vec<String> = (0..n)
            .map(|k| format!("{}", ((k * 7 % 13) as f32 - 6.0) * scale))
            .collect();
        v.join(", ")
    };
    // (input, depthwise attributes, depthwise output, 1x1 output channels, fused)
    let cases = [
        (
            "[2,144,48,48]",
            "{pads=[1,1,1,1], groups=144, block=8}",
            [2, 18, 48, 48],
            24,
            true,
        ),
        (
            "[1,32,184,183]",
            "{strides=[2,2], pads=[1,1,1,1], groups=32, block=8}",
            [1, 4, 92, 92],
            16,
            true,
        ),
        (
            "[2,144,24,24]",
            "{pads=[1,1,1,1], groups=144, block=8}",
            [2, 18, 24, 24],
            24,
            false,
        ),
    ];
    for (i, (x, attrs, [n, cb, oh, ow], o, fused)) in cases.into_iter().enumerate() {
        let d: Vec<usize> = (x.trim_matches(['[', ']']).split(','))
            .map(|v| v.parse().unwrap())
            .collect();
        let c = d[1];
        let (xb, mid) = (
            format!("[{},{},{},{},8]", d[0], c / 8, d[2], d[3]),
            format!("[{n},{cb},{oh},{ow},8]"),
        );
        let y = format!("[{n},{},{oh},{ow},8]", o / 8);
        let body = format!(
            "  %xb = to_nchwc %x {{block=8}} : f32{xb}
  %wd = const {{value=[{}]}} : f32[{c},1,3,3]
  %bd = const {{value=[{}]}} : f32[1,{cb},1,1,8]
  %lo = const {{value=0.0}} : f32[]
  %hi = const {{value=6.0}} : f32[]
  %d = conv2d_nchwc %xb, %wd {attrs} : f32{mid}
  %db = add %d, %bd : f32{mid}
  %d0 = max %db, %lo : f32{mid}
  %d6 = min %d0, %hi : f32{mid}
  %wp = const {{value=[{}]}} : f32[{o},{c},1,1]
  %bp = const {{value=[{}]}} : f32[1,{},1,1,8]
  %p = conv2d_nchwc %d6, %wp {{block=8}} : f32{y}
  %pb = add %p, %bp : f32{y}
  %out = add %pb, %r : f32{y}",
            consts(c * 9, 1.0 / 8.0),
            consts(cb * 8, 1.0 / 16.0),
            consts(o * c, 1.0 / 64.0),
            consts(o, 1.0 / 32.0),
            o / 8
        );
        let params = format!("%x: f32{x}, %r: f32{y}");
        case_native(&params, &body, &format!("f32{y}"), 120 + i as u64);
        // Whether the CPU backend merged the two convolutions' kernels.
        let src = format!("func @f({params}) -> (f32{y}) {{\n{body}\n  return %out\n}}");
        let f = tcc_ir::parse_function(&src).unwrap();
        let p = tcc_codegen::Backend::fuse(&tcc_codegen::Cpu::default(), &f, tcc_codegen::plan(&f));
        let convs = |kd: &tcc_codegen::KernelData| {
            (kd.ops.iter())
                .filter(|&&op| matches!(f.op(op).kind, tcc_ir::OpKind::Conv2dNchwc { .. }))
                .count()
        };
        let merged = p.kernels.values().any(|kd| convs(kd) == 2);
        assert_eq!(merged, fused, "{src}");
    }
}

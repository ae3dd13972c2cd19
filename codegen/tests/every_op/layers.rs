//! Layers and their gradients: matmul and convolution, reductions and softmax, the
//! convolution and pooling gradients, matmuls reading transposes.

use super::case;

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

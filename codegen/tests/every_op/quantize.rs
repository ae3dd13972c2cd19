//! Quantization on its native kernels: `quantize_linear` and `dequantize_linear` per tensor
//! and per channel, both byte types, and `matmul_integer` with zero points per tensor, per row
//! and per column, batches broadcast; exact against the interpreter.

use super::*;

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

//! `conv_integer` at the shapes that matter to AMX's tiles (`host` in `integer_targets` where
//! the CPU has AMX-INT8; `host,-amx` is the AVX-512 VNNI kernel), exact against the
//! interpreter on every target: taps past a multiple of 64 (a tile's last chunk partly
//! padding), output channels past a multiple of 32 (a tile's rows partly past the filter, and
//! for the last group of a grouped convolution past its end), pixel blocks cut short, channel
//! ranges split across the pool, each pairing of u8 and i8 at random and at the extremes.

use super::*;
use tcc_ir::DType::{I8, U8};

#[test]
fn integer_convolutions_on_tiles() {
    // (input dims, filter dims, attributes, output dims, per-channel filter zero points)
    let shapes = [
        // 630 taps (ten chunks of 64, the last of 54), 40 channels, 81 pixels.
        (
            [1, 70, 9, 9],
            [40, 70, 3, 3],
            "pads=[1,1,1,1]",
            [1, 40, 9, 9],
            true,
        ),
        // Two groups of 33 channels: the second group's last tile reads rows 65..97.
        ([1, 4, 6, 6], [66, 2, 3, 3], "groups=2", [1, 66, 4, 4], true),
        // Pointwise, 100 taps, 35 pixels.
        ([1, 100, 5, 7], [48, 100, 1, 1], "", [1, 48, 5, 7], false),
        // Seven blocks (the last of 4 pixels) and twelve tiles: items of several blocks of
        // one tile each, the tile's last item shorter (5 + 2 blocks on two threads).
        (
            [1, 32, 14, 14],
            [384, 32, 1, 1],
            "",
            [1, 384, 14, 14],
            false,
        ),
        // One block of 16 pixels and 96 channels, split across the pool by tiles of 32.
        (
            [1, 64, 4, 4],
            [96, 64, 3, 3],
            "pads=[1,1,1,1]",
            [1, 96, 4, 4],
            true,
        ),
    ];
    for (ta, tb) in [(U8, I8), (I8, U8), (U8, U8), (I8, I8)] {
        for &(xd, wd, attrs, yd, per_channel) in &shapes {
            let (f, src, wz) =
                quantize::conv_integer_of((ta, tb), (xd, wd, yd), attrs, per_channel);
            let (top_a, low_b, low_a, top_b) = quantize::extremes(ta, tb);
            for (i, extreme) in [false, true].into_iter().enumerate() {
                let pick = |v: i64| extreme.then_some(v);
                let inputs = vec![
                    common::bytes(ta, &xd, pick(top_a), 150 + i as u64),
                    common::bytes(tb, &wd, pick(low_b), 160 + i as u64),
                    common::bytes(ta, &[], pick(low_a), 170 + i as u64),
                    common::bytes(tb, &wz, pick(top_b), 180 + i as u64),
                ];
                let what = format!("{src}\nextremes {extreme}");
                quantize::agrees_on_every_target(&f, &inputs, &what, quantize::no_reference_ops);
            }
        }
    }
}

/// `-amx` in a target spec turns AMX off (and only it), with any other feature; the host's
/// features name AMX-INT8 exactly where they use it.
#[test]
fn target_specs_turn_amx_off() {
    let host = tcc_codegen::Features::of(None).unwrap();
    let off = tcc_codegen::Features::of(Some("host,-amx")).unwrap();
    assert!(!off.amx);
    assert_eq!(
        tcc_codegen::Features {
            amx: host.amx,
            ..off
        },
        host
    );
    assert!(!off.names().contains(&"AMX-INT8"));
    assert_eq!(
        host.names().contains(&"AMX-INT8"),
        host.amx && host.avx512f && host.vnni
    );
    let both = tcc_codegen::Features::of(Some("host,-avxvnni,-amx")).unwrap();
    assert!(!both.amx && !both.avx_vnni);
}

//! Data movement (reshapes, transposes, slices, concatenations, gathers) and the ops real
//! models use, on native kernels.

use super::{case, case_native};

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

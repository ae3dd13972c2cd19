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
    // A few large blocks (ViT's q, k and v picked out of one tensor), whose bytes the threads
    // share: one block of 300 KB (pieces of whole cache lines and a shorter last one), a
    // scalar index (the axis dropped), and two blocks by a negative index.
    case_native(
        "%t: f32[3,197,390]",
        "  %i = const {value=[1]} : i64[1]\n  %out = gather %t, %i {axis=0} : f32[1,197,390]",
        "f32[1,197,390]",
        56,
    );
    case_native(
        "%t: f32[3,197,390]",
        "  %i = const {value=2} : i32[]\n  %out = gather %t, %i {axis=0} : f32[197,390]",
        "f32[197,390]",
        57,
    );
    case_native(
        "%t: f32[3,197,100]",
        "  %i = const {value=[-1, 0]} : i64[2]\n  %out = gather %t, %i {axis=0} : f32[2,197,100]",
        "f32[2,197,100]",
        58,
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

/// A batch-1 concatenation whose operands it reads last finds them at their places in its
/// result: their kernels (elementwise, a blocked convolution) wrote them there, and the memory
/// plan says so. Operands read again later, parameters, repeated operands, a batch of two and
/// offsets the arena's alignment does not divide are copied as before, and so is a returned
/// result's; the results agree with the interpreter either way.
#[test]
fn concatenation_in_place() {
    // (parameters, body, result type, operands placed in the result)
    let cases = [
        // Two branches into one result, along the channels.
        (
            "%x: f32[1,16,6,6]",
            "  %a = relu %x : f32[1,16,6,6]\n  %b = neg %x : f32[1,16,6,6]\n  %j = concat %a, %b {axis=1} : f32[1,32,6,6]\n  %out = sigmoid %j : f32[1,32,6,6]",
            "f32[1,32,6,6]",
            &["a", "b"][..],
        ),
        // A parameter operand, an operand read after the concatenation, a repeated operand.
        (
            "%x: f32[1,16,4,4]",
            "  %a = exp %x : f32[1,16,4,4]\n  %b = tanh %x : f32[1,16,4,4]\n  %c = concat %x, %a, %b, %b {axis=1} : f32[1,64,4,4]\n  %d = reshape %c {shape=[1,16,16,4]} : f32[1,16,16,4]\n  %e = reshape %a {shape=[1,16,4,4]} : f32[1,16,4,4]\n  %s = reduce_sum %e {axes=[1,2,3], keepdims=true} : f32[1,1,1,1]\n  %out = mul %d, %s : f32[1,16,16,4]",
            "f32[1,16,16,4]",
            &[][..],
        ),
        // A batch of two: each operand is two runs of the result; copied.
        (
            "%x: f32[2,16,4,4]",
            "  %a = relu %x : f32[2,16,4,4]\n  %b = neg %x : f32[2,16,4,4]\n  %j = concat %a, %b {axis=1} : f32[2,32,4,4]\n  %out = sigmoid %j : f32[2,32,4,4]",
            "f32[2,32,4,4]",
            &[][..],
        ),
        // Operands at bytes 0, 3 * 9 * 4 = 108 (not a multiple of 64: copied), 108 + 13 * 36 =
        // 576 and 1044 (copied).
        (
            "%x: f32[1,3,3,3], %y: f32[1,13,3,3]",
            "  %a = relu %x : f32[1,3,3,3]\n  %b = neg %y : f32[1,13,3,3]\n  %c = exp %y : f32[1,13,3,3]\n  %d = tanh %x : f32[1,3,3,3]\n  %j = concat %a, %b, %c, %d {axis=1} : f32[1,32,3,3]\n  %out = sigmoid %j : f32[1,32,3,3]",
            "f32[1,32,3,3]",
            &["a", "c"][..],
        ),
        // A chain, each concatenation extending the one before (as `canonicalize` writes a
        // DenseNet block's): every operand lies in the last one's slot.
        (
            "%x: f32[1,16,4,4]",
            "  %a = relu %x : f32[1,16,4,4]\n  %b = neg %x : f32[1,16,4,4]\n  %c1 = concat %a, %b {axis=1} : f32[1,32,4,4]\n  %m = reduce_mean %c1 {axes=[1], keepdims=true} : f32[1,1,4,4]\n  %d = broadcast_to %m {shape=[1,16,4,4]} : f32[1,16,4,4]\n  %e = exp %d : f32[1,16,4,4]\n  %c2 = concat %c1, %e {axis=1} : f32[1,48,4,4]\n  %out = sigmoid %c2 : f32[1,48,4,4]",
            "f32[1,48,4,4]",
            &["a", "b", "c1", "e"][..],
        ),
        // Blocked: a convolution's output and an elementwise one, each whole blocks.
        (
            "%x: f32[1,8,5,5], %w: f32[16,8,3,3]",
            "  %xb = to_nchwc %x {block=8} : f32[1,1,5,5,8]\n  %c = conv2d_nchwc %xb, %w {pads=[1,1,1,1], block=8} : f32[1,2,5,5,8]\n  %r = relu %xb : f32[1,1,5,5,8]\n  %j = concat %c, %r {axis=1} : f32[1,3,5,5,8]\n  %out = from_nchwc %j {channels=24} : f32[1,24,5,5]",
            "f32[1,24,5,5]",
            &["c", "r"][..],
        ),
    ];
    for (i, (params, body, ty, placed)) in cases.into_iter().enumerate() {
        case_native(params, body, ty, 140 + i as u64);
        let src = format!("func @f({params}) -> ({ty}) {{\n{body}\n  return %out\n}}");
        let f = tcc_ir::parse_function(&src).unwrap();
        let p = tcc_codegen::plan(&f);
        let m = tcc_codegen::plan_memory(&f, &p, &tcc_codegen::Cpu::default());
        let value = |name: &str| {
            (f.schedule().iter())
                .flat_map(|&op| f.op(op).results.iter().copied())
                .find(|&v| f.name(v) == name)
                .unwrap()
        };
        // Each concatenation's operands that lie inside its result's bytes.
        let mut inside = Vec::new();
        for &op in f.schedule() {
            if !matches!(f.op(op).kind, tcc_ir::OpKind::Concat { .. }) {
                continue;
            }
            let r = f.op(op).results[0];
            let tcc_codegen::Storage::Arena(base) = m.storage[r] else {
                continue;
            };
            let mut at = base;
            for &a in &f.op(op).args {
                if m.storage[a] == tcc_codegen::Storage::Arena(at) {
                    inside.push(f.name(a).to_string());
                }
                at += f.ty(a).size_bytes();
            }
        }
        let want: Vec<String> = placed.iter().map(|s| s.to_string()).collect();
        assert_eq!(inside, want, "{src}");
        for name in placed {
            assert!(matches!(
                m.storage[value(name)],
                tcc_codegen::Storage::Arena(_)
            ));
        }
    }
}

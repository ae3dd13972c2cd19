//! Elementwise ops: unary, binary with broadcasting, comparisons, casts, broadcasts and
//! identities.

use super::case;

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

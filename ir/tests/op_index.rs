//! docs/ir.md's op index is generated from the op table: this keeps the two in step.
//! `TCC_BLESS=1 cargo test -p tcc-ir --test op_index` rewrites the section.

use tcc_ir::ops::attrs::op_index_markdown;

const START: &str = "<!-- op-index:start -->\n";
const END: &str = "<!-- op-index:end -->";

#[test]
fn docs_op_index_matches_the_op_table() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/ir.md");
    let doc = std::fs::read_to_string(path).expect("docs/ir.md is readable");
    let a = doc
        .find(START)
        .expect("docs/ir.md has the op-index start marker")
        + START.len();
    let b = doc[a..]
        .find(END)
        .expect("docs/ir.md has the op-index end marker")
        + a;
    let want = op_index_markdown();
    if doc[a..b] == want {
        return;
    }
    if std::env::var_os("TCC_BLESS").is_some() {
        std::fs::write(path, format!("{}{want}{}", &doc[..a], &doc[b..])).expect("write docs");
        return;
    }
    panic!(
        "docs/ir.md's op index is out of date with the op table; run \
         `TCC_BLESS=1 cargo test -p tcc-ir --test op_index` and commit docs/ir.md"
    );
}

#[test]
fn every_op_prints_what_it_parses() {
    // Each op's declared attributes read what the printer writes: an op written with only its
    // required attributes (at sample values) prints back to the same text.
    use tcc_ir::ops::{Arity, OpId};
    for &id in OpId::ALL {
        let s = id.schema();
        let n = match s.arity {
            Arity::Exactly(n) | Arity::AtLeast(n) => n,
        };
        let params: Vec<String> = (0..n).map(|i| format!("%p{i}: f32[1]")).collect();
        let args: Vec<String> = (0..n).map(|i| format!("%p{i}")).collect();
        let results: Vec<String> = (0..s.results).map(|i| format!("%r{i}")).collect();
        let types = vec!["f32[1]"; s.results].join(", ");
        let attrs: Vec<String> = id
            .attrs()
            .iter()
            .filter(|a| a.default.is_none())
            .map(|a| format!("{}={}", a.name, sample(&a.ty)))
            .collect();
        let mut line = format!("{} = {}", results.join(", "), s.mnemonic);
        if n > 0 {
            line += &format!(" {}", args.join(", "));
        }
        if !attrs.is_empty() {
            line += &format!(" {{{}}}", attrs.join(", "));
        }
        let text = format!(
            "func @f({}) -> ({types}) {{\n  {line} : {types}\n  return {}\n}}\n",
            params.join(", "),
            results.join(", ")
        );
        let m = tcc_ir::parse_module(&text).unwrap_or_else(|e| panic!("{text}\n{e}"));
        assert_eq!(m.to_string(), text);
        assert_eq!(
            m.functions[0].op(m.functions[0].schedule()[0]).kind.id(),
            id
        );
    }
}

fn sample(ty: &str) -> &'static str {
    match ty {
        "int" | "uint" => "1",
        "bool" => "true",
        "float" => "0.5",
        "dtype" => "i32",
        "literal" => "2.0",
        "[uint; 2]" => "[2,2]",
        _ => "[1]",
    }
}

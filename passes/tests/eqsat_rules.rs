//! Every `eqsat` rule is sound: on random instances of its witness (random dimensions, random
//! inputs), after the rule alone has run, every e-node of every e-class computes its class's
//! value in the f64 reference interpreter. A rule whose witness it does not match fails too, so
//! that no rule passes unchecked; and a deliberately wrong rule must be caught.

use egg::{BackoffScheduler, Runner};
use tcc_ir::random::{Rng, random_tensor};
use tcc_passes::eqsat::check::check_classes;
use tcc_passes::eqsat::encode::encode;
use tcc_passes::eqsat::rules::{Rule, all_rules, custom};

/// The witness with its dimensions drawn: `$a`, `$c`, `$d` in 1..=4, `$b` in 2..=4.
fn instantiate(witness: &str, rng: &mut Rng) -> String {
    let a = 1 + rng.below(4);
    let b = 2 + rng.below(3);
    let c = 1 + rng.below(4);
    let d = 1 + rng.below(4);
    witness
        .replace("$b+$d", &(b + d).to_string())
        .replace("$2b", &(2 * b).to_string())
        .replace("$b-1", &(b - 1).to_string())
        .replace("$b+1", &(b + 1).to_string())
        .replace("2*$c", &(2 * c).to_string())
        .replace("3*$c", &(3 * c).to_string())
        .replace("4*$c", &(4 * c).to_string())
        .replace("5*$c", &(5 * c).to_string())
        .replace("$a", &a.to_string())
        .replace("$b", &b.to_string())
        .replace("$c", &c.to_string())
        .replace("$d", &d.to_string())
}

/// Runs `rule` alone on random instances of its witness; the first failure, named.
fn check_rule(rule: &Rule, seeds: u64) -> Result<(), String> {
    for seed in 0..seeds {
        let mut rng = Rng::new(seed * 7919 + 1);
        let text = instantiate(&rule.witness, &mut rng);
        let f = tcc_ir::parse_function(&text)
            .map_err(|e| format!("rule `{}`: witness does not parse: {e}\n{text}", rule.name))?;
        tcc_ir::verify_function(&f)
            .map_err(|e| format!("rule `{}`: witness does not verify: {e}\n{text}", rule.name))?;
        let mut enc = encode(&f, 256);
        let runner = Runner::default()
            .with_egraph(std::mem::take(&mut enc.egraph))
            .with_iter_limit(3)
            .with_node_limit(10_000)
            .with_scheduler(BackoffScheduler::default())
            .run([&rule.rewrite]);
        if let Some(e) = &runner.egraph.analysis.error {
            return Err(format!("rule `{}`: {e}\n{text}", rule.name));
        }
        let applied: usize = runner
            .iterations
            .iter()
            .filter_map(|i| i.applied.get(&rule.rewrite.name))
            .sum();
        if applied == 0 {
            return Err(format!(
                "rule `{}` does not apply to its witness\n{text}",
                rule.name
            ));
        }
        enc.egraph = runner.egraph;
        let inputs: Vec<_> = f
            .params()
            .iter()
            .map(|&p| random_tensor(f.ty(p), &mut rng))
            .collect();
        check_classes(&f, &enc, &inputs, 1e-9)
            .map_err(|e| format!("rule `{}` is unsound: {e}\n{text}", rule.name))?;
    }
    Ok(())
}

#[test]
fn every_rule_is_sound() {
    let rules = all_rules();
    assert!(rules.len() > 40, "only {} rules", rules.len());
    let failures: Vec<String> = rules
        .iter()
        .filter_map(|r| check_rule(r, 12).err())
        .collect();
    assert!(
        failures.is_empty(),
        "{} rule(s) failed:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

#[test]
fn rule_names_are_unique_and_kebab_case() {
    let rules = all_rules();
    let mut names: Vec<&str> = rules.iter().map(|r| r.name.as_str()).collect();
    for n in &names {
        assert!(
            n.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
            "{n}"
        );
    }
    names.sort_unstable();
    let n = names.len();
    names.dedup();
    assert_eq!(names.len(), n, "duplicate rule names");
}

#[test]
fn a_wrong_rule_is_caught_by_name() {
    let wrong = custom(
        "sub-comm-wrong",
        "(sub ?a ?b)",
        "(sub ?b ?a)",
        "func @f(%x: f64[$a,$b], %y: f64[$a,$b]) -> (f64[$a,$b]) {\n  %r = sub %x, %y : f64[$a,$b]\n  return %r\n}\n",
    );
    let e = check_rule(&wrong, 4).expect_err("a wrong rule must fail");
    assert!(e.contains("`sub-comm-wrong` is unsound"), "{e}");
}

#[test]
fn a_rule_that_changes_a_type_is_an_internal_error_naming_it() {
    // `x + y -> x` when y broadcasts x to a larger shape: the merge of two types is reported.
    let wrong = custom(
        "add-drop-wrong",
        "(add ?x ?y)",
        "?x",
        "func @f(%x: f64[$a], %y: f64[$b,$a]) -> (f64[$b,$a]) {\n  %r = add %x, %y : f64[$b,$a]\n  return %r\n}\n",
    );
    let e = check_rule(&wrong, 1).expect_err("a type-changing rule must fail");
    assert!(
        e.contains("rule `add-drop-wrong`") && e.contains("equal to one of type"),
        "{e}"
    );
}

//! `fold-bn{training=true}`: TensorFlow's folding of training batch norm with corrections. Before
//! the freeze the folded function computes batch norm with the batch statistics (outputs within
//! 1e-5, gradients within 1e-4 of the unfolded function's); from the freeze on it uses the
//! moving statistics, so a sample's output no longer depends on the rest of its batch, and they
//! stop moving; its gradients pass central finite differences in f64.

mod common;

use tcc::ir::{Data, Function, Tensor, interp, parse_function};
use tcc::passes::grad::{GradOptions, Wrt, grad};
use tcc::passes::quant::fold_bn::Training;
use tcc::passes::quant::fold_bn_training::fold_bn_training;

fn src(dt: &str) -> String {
    format!(
        "func @f(%x: {dt}[4,2,5,5], %w: {dt}[3,2,3,3], %g: {dt}[3], %b: {dt}[3]) -> ({dt}[], {dt}[4,3,3,3]) {{
  %y = conv2d %x, %w : {dt}[4,3,3,3]
  %n, %mean, %var = batch_norm_train %y, %g, %b {{eps=0.001}} : {dt}[4,3,3,3], {dt}[3], {dt}[3]
  %r = relu %n : {dt}[4,3,3,3]
  %sq = mul %r, %r : {dt}[4,3,3,3]
  %loss = reduce_sum %sq {{axes=[0,1,2,3]}} : {dt}[]
  return %loss, %r
}}"
    )
}

fn folded(dt: &str, freeze: Option<u64>) -> (Function, Function) {
    let f = parse_function(&src(dt)).unwrap();
    let mut g = f.clone();
    let t = Training {
        freeze_delay: freeze,
        decay: 0.9,
    };
    let s = fold_bn_training(&mut g, &t).unwrap();
    assert_eq!(s.batch_norms, 1);
    tcc::ir::verify_function(&g).unwrap_or_else(|d| panic!("{d}\n{g}"));
    (f, g)
}

fn floats(t: &Tensor) -> Vec<f64> {
    common::f64s(t)
}

fn inputs(f: &Function, seed: u64) -> Vec<Tensor> {
    common::random_inputs(f, seed)
}

fn state(dt_f64: bool, step: f64) -> Vec<Tensor> {
    let v = |d: Vec<f64>| {
        if dt_f64 {
            Tensor::from_data(&[d.len() as u64], Data::F64(d)).unwrap()
        } else {
            Tensor::from_f32(
                &[d.len() as u64],
                d.iter().map(|&x| x as f32).collect::<Vec<_>>(),
            )
            .unwrap()
        }
    };
    vec![
        Tensor::from_f32(&[], vec![step as f32]).unwrap(),
        v(vec![0.1, -0.2, 0.3]),
        v(vec![1.5, 0.5, 2.0]),
    ]
}

fn close(a: &[f64], b: &[f64], rel: f64, what: &str) {
    let scale = b.iter().fold(0f64, |m, x| m.max(x.abs())).max(1e-30);
    let err = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max);
    assert!(
        err <= rel * scale,
        "{what}: differs by {err:e} (largest {scale:e})"
    );
}

/// A dense layer reshaped to 4-D for its batch norm (TensorFlow's MatMul -> Reshape ->
/// FusedBatchNorm) folds too, and before the freeze still computes batch norm.
#[test]
fn a_dense_layer_through_a_reshape_folds() {
    let f = parse_function(
        "func @f(%x: f32[6,5], %w: f32[5,3], %g: f32[3], %b: f32[3]) -> (f32[6,3,1,1]) {
  %z = matmul %x, %w : f32[6,3]
  %y = reshape %z {shape=[6,3,1,1]} : f32[6,3,1,1]
  %n, %mean, %var = batch_norm_train %y, %g, %b : f32[6,3,1,1], f32[3], f32[3]
  return %n
}",
    )
    .unwrap();
    let mut g = f.clone();
    let t = Training {
        freeze_delay: Some(100),
        decay: 0.9,
    };
    assert_eq!(fold_bn_training(&mut g, &t).unwrap().batch_norms, 1);
    tcc::ir::verify_function(&g).unwrap_or_else(|d| panic!("{d}\n{g}"));
    let x = inputs(&f, 4);
    let mut xg = x.clone();
    xg.extend(state(false, 0.0));
    let want = interp::run(&f, &x).unwrap();
    let got = interp::run(&g, &xg).unwrap();
    close(&floats(&got[0]), &floats(&want[0]), 1e-5, "output");
}

#[test]
fn before_the_freeze_it_is_batch_norm() {
    let (f, g) = folded("f32", Some(100));
    let names: Vec<&str> = g.params().iter().map(|&p| g.name(p)).collect();
    assert_eq!(&names[4..], ["quant/step", "n/moving_mean", "n/moving_var"]);
    let x = inputs(&f, 3);
    let mut xg = x.clone();
    xg.extend(state(false, 0.0));
    let want = interp::run(&f, &x).unwrap();
    let got = interp::run(&g, &xg).unwrap();
    close(&floats(&got[0]), &floats(&want[0]), 1e-5, "loss");
    close(&floats(&got[1]), &floats(&want[1]), 1e-5, "output");
    // The step moves on, and the moving statistics move towards the batch's (the variance
    // unbiased: 108 values per channel).
    assert_eq!(floats(&got[2]), [1.0]);
    let mm = floats(&got[3]);
    assert!(
        (mm[0] - 0.1 * 0.9).abs() > 1e-6,
        "the moving mean moved: {mm:?}"
    );

    // The gradients of the loss with respect to the weights, gamma and beta agree.
    let grads = |h: &Function, ins: &[Tensor]| -> Vec<Vec<f64>> {
        let mut h = h.clone();
        let opts = GradOptions {
            ys: vec!["loss".into()],
            wrt: Wrt::Select(vec!["w".into(), "g".into(), "b".into()]),
            ..GradOptions::default()
        };
        grad(&mut h, &opts).unwrap();
        let out = interp::run(&h, ins).unwrap();
        let k = out.len() - 3;
        out[k..].iter().map(floats).collect()
    };
    let (a, b) = (grads(&g, &xg), grads(&f, &x));
    for (i, (p, q)) in a.iter().zip(&b).enumerate() {
        close(p, q, 1e-4, &format!("gradient {i}"));
    }
}

#[test]
fn after_the_freeze_the_moving_statistics_are_used_and_kept() {
    let (_, g) = folded("f32", Some(100));
    let mut a = inputs(&g, 5);
    a.truncate(4);
    a.extend(state(false, 100.0));
    let out_a = interp::run(&g, &a).unwrap();
    // Another batch sharing the first sample: that sample's output is the same.
    let mut b = a.clone();
    let Data::F32(x) = a[0].data() else {
        unreachable!()
    };
    let mut x2 = x.clone();
    for v in x2[50..].iter_mut() {
        *v = *v * -3.0 + 1.0;
    }
    b[0] = Tensor::from_f32(&[4, 2, 5, 5], x2).unwrap();
    let out_b = interp::run(&g, &b).unwrap();
    let (ra, rb) = (floats(&out_a[1]), floats(&out_b[1]));
    close(&rb[..27], &ra[..27], 1e-6, "the first sample's output");
    assert_ne!(ra[27..], rb[27..]);
    // The moving statistics are returned unchanged.
    assert_eq!(floats(&out_a[3]), floats(&a[5]));
    assert_eq!(floats(&out_a[4]), floats(&a[6]));
}

/// Through the corrections, in f64, before and after the freeze.
#[test]
fn gradients_pass_finite_differences() {
    for freeze in [Some(100), Some(0), None] {
        let (_, mut g) = folded("f64", freeze);
        // The step (5: before a freeze at 100, after one at 0) and a positive moving variance
        // are fixed as constants; every other parameter is checked.
        let fix = |g: &mut Function, name: &str, value: Data| {
            let Some(p) = g.params().iter().copied().find(|&p| g.name(p) == name) else {
                return;
            };
            let ty = g.ty(p).clone();
            let c = g.create_op(
                tcc::ir::OpKind::Const {
                    ty: ty.clone(),
                    value: tcc::ir::Literal::dense(value),
                },
                vec![],
                vec![ty],
                &[&format!("{name}/fixed")],
            );
            let first = g.schedule()[0];
            g.insert_before(c, first);
            let v = g.op(c).results[0];
            g.replace_all_uses(p, v);
        };
        fix(&mut g, "quant/step", Data::F32(vec![5.0]));
        fix(&mut g, "n/moving_var", Data::F64(vec![1.5, 0.5, 2.0]));
        // The loss and the output; the state results have no gradient to check.
        let mut results = g.results().to_vec();
        results.truncate(2);
        g.set_results(results);
        let g = strip_unused_params(g);
        common::gradcheck(&format!("fold-bn training, freeze {freeze:?}"), &g);
    }
}

/// `g` without the parameters nothing reads any more (the fixed ones).
fn strip_unused_params(g: Function) -> Function {
    let text = g.to_string();
    let users = tcc::ir::edit::Users::new(&g);
    let unused: Vec<String> = (g.params().iter())
        .filter(|&&p| users.uses(p).is_empty())
        .map(|&p| {
            let mut s = String::new();
            tcc::ir::printer::write_name(&mut s, '%', g.name(p)).unwrap();
            format!("{s}: {}", g.ty(p))
        })
        .collect();
    let mut text = text;
    for u in unused {
        text = text.replace(&format!(", {u}"), "");
    }
    parse_function(&text).unwrap_or_else(|d| panic!("{d}\n{text}"))
}

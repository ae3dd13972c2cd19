//! The optimizer passes compute the documented updates: checked in f64 through the interpreter
//! against the formulas written out here, over several steps (state fed back as `tcc train`
//! does).

use tcc_ir::{Data, Function, Tensor, interp, parse_function};
use tcc_passes::grad::{GradOptions, grad};
use tcc_passes::optim::{Optimizer, apply_optimizer};

/// loss = sum(w * w * x) / 2 + sum(b): d/dw = w * x, d/db = 1.
const SRC: &str = "func @f(%x: f64[3], %w: f64[3], %b: f64[2]) -> (f64[]) {
  %ww = mul %w, %w : f64[3]
  %wwx = mul %ww, %x : f64[3]
  %s = reduce_sum %wwx {axes=[0]} : f64[]
  %half = const {value=0.5} : f64[]
  %l = mul %s, %half : f64[]
  %sb = reduce_sum %b {axes=[0]} : f64[]
  %loss = add %l, %sb : f64[]
  return %loss
}";

fn f64s(t: &Tensor) -> Vec<f64> {
    match t.data() {
        Data::F64(v) => v.clone(),
        d => panic!("{:?}", d.dtype()),
    }
}

fn step_fn(opt: Optimizer) -> Function {
    let mut f = parse_function(SRC).unwrap();
    let opts = GradOptions {
        wrt: tcc_passes::grad::Wrt::Select(vec!["w".into(), "b".into()]),
        ..GradOptions::default()
    };
    grad(&mut f, &opts).unwrap();
    apply_optimizer(&mut f, opt).unwrap();
    tcc_ir::verify_function(&f).unwrap();
    f
}

/// Runs `steps` train steps, feeding `new/<name>` back into `<name>`; returns the final value of
/// every parameter by name.
fn train(f: &Function, init: &[(&str, Vec<f64>)], steps: usize) -> Vec<(String, Vec<f64>)> {
    let mut vals: Vec<(String, Vec<f64>)> = f
        .params()
        .iter()
        .map(|&p| {
            let name = f.name(p).to_string();
            let v = init
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.clone())
                .unwrap_or_else(|| vec![0.0; f.ty(p).numel() as usize]);
            (name, v)
        })
        .collect();
    for _ in 0..steps {
        let inputs: Vec<Tensor> = f
            .params()
            .iter()
            .zip(&vals)
            .map(|(&p, (_, v))| Tensor::from_data(f.ty(p).dims(), Data::F64(v.clone())).unwrap())
            .collect();
        let out = interp::run(f, &inputs).unwrap();
        for (r, o) in f.results().iter().zip(&out) {
            if let Some(name) = f.name(*r).strip_prefix("new/") {
                let slot = vals.iter_mut().find(|(n, _)| n == name).unwrap();
                slot.1 = f64s(o);
            }
        }
    }
    vals
}

fn get<'a>(vals: &'a [(String, Vec<f64>)], name: &str) -> &'a [f64] {
    &vals.iter().find(|(n, _)| n == name).unwrap().1
}

fn close(a: &[f64], b: &[f64]) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= 1e-12 * (1.0 + y.abs()), "{a:?} vs {b:?}");
    }
}

const X: [f64; 3] = [0.5, -1.0, 2.0];
const W: [f64; 3] = [1.0, 2.0, -0.5];
const B: [f64; 2] = [0.25, -0.75];

fn init() -> Vec<(&'static str, Vec<f64>)> {
    vec![("x", X.to_vec()), ("w", W.to_vec()), ("b", B.to_vec())]
}

#[test]
fn sgd_subtracts_lr_times_the_gradient() {
    let lr = 0.1;
    let got = train(&step_fn(Optimizer::Sgd { lr }), &init(), 3);
    let (mut w, mut b) = (W.to_vec(), B.to_vec());
    for _ in 0..3 {
        for i in 0..3 {
            w[i] -= lr * w[i] * X[i];
        }
        for v in &mut b {
            *v -= lr;
        }
    }
    close(get(&got, "w"), &w);
    close(get(&got, "b"), &b);
}

#[test]
fn momentum_accumulates_velocity() {
    let (lr, mu) = (0.1, 0.9);
    let got = train(&step_fn(Optimizer::Momentum { lr, mu }), &init(), 3);
    let (mut w, mut v) = (W.to_vec(), [0.0; 3]);
    for _ in 0..3 {
        for i in 0..3 {
            v[i] = mu * v[i] + w[i] * X[i];
            w[i] -= lr * v[i];
        }
    }
    close(get(&got, "w"), &w);
    close(get(&got, "momentum/w"), &v);
}

#[test]
fn adam_corrects_its_moments_for_bias() {
    let (lr, b1, b2, eps) = (0.01, 0.9, 0.999, 1e-8);
    let opt = Optimizer::Adam {
        lr,
        beta1: b1,
        beta2: b2,
        eps,
    };
    let got = train(&step_fn(opt), &init(), 4);
    let (mut w, mut m, mut v) = (W.to_vec(), [0.0; 3], [0.0; 3]);
    for t in 1..=4 {
        for i in 0..3 {
            let g = w[i] * X[i];
            m[i] = b1 * m[i] + (1.0 - b1) * g;
            v[i] = b2 * v[i] + (1.0 - b2) * g * g;
            let mh = m[i] / (1.0 - f64::powi(b1, t));
            let vh = v[i] / (1.0 - f64::powi(b2, t));
            w[i] -= lr * mh / (vh.sqrt() + eps);
        }
    }
    close(get(&got, "w"), &w);
    close(get(&got, "adam/m/w"), &m);
    close(get(&got, "adam/v/w"), &v);
    close(get(&got, "adam/t"), &[4.0]);
}

#[test]
fn the_train_step_signature() {
    let f = step_fn(Optimizer::Momentum { lr: 0.1, mu: 0.9 });
    let params: Vec<&str> = f.params().iter().map(|&p| f.name(p)).collect();
    assert_eq!(params, ["x", "w", "b", "momentum/w", "momentum/b"]);
    let results: Vec<&str> = f.results().iter().map(|&r| f.name(r)).collect();
    assert_eq!(
        results,
        ["loss", "new/w", "new/b", "new/momentum/w", "new/momentum/b"]
    );
}

//! Embedding tcc: build a small network in Rust, compile it once, run it from several threads.
//!
//! `cargo run --release --example embed`

use std::sync::Arc;
use tcc::ir::{DType, FunctionBuilder};
use tcc::{Program, Tensor};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // y = softmax(relu(x @ w1 + b1) @ w2 + b2), built with shape inference.
    let mut b = FunctionBuilder::new("mlp");
    let x = b.param("x", DType::F32, &[8, 16])?;
    let w1 = b.param("fc1/w", DType::F32, &[16, 32])?;
    let b1 = b.param("fc1/b", DType::F32, &[32])?;
    let w2 = b.param("fc2/w", DType::F32, &[32, 4])?;
    let b2 = b.param("fc2/b", DType::F32, &[4])?;
    b.push_scope("fc1");
    let h = b.matmul(x, w1)?;
    let h = b.add(h, b1)?;
    let h = b.relu(h)?;
    b.pop_scope();
    b.push_scope("fc2");
    let o = b.matmul(h, w2)?;
    let o = b.add(o, b2)?;
    b.pop_scope();
    let p = b.softmax(o, -1)?;
    let f = b.finish(&[p])?;
    println!("{f}");

    let program = Arc::new(Program::from_function(&f)?);
    let ramp = |n: usize, scale: f32| {
        (0..n)
            .map(|i| ((i % 7) as f32 - 3.0) * scale)
            .collect::<Vec<_>>()
    };
    let weights = [
        Tensor::from_f32(&[16, 32], ramp(16 * 32, 0.05))?,
        Tensor::from_f32(&[32], vec![0.1; 32])?,
        Tensor::from_f32(&[32, 4], ramp(32 * 4, 0.1))?,
        Tensor::from_f32(&[4], vec![0.0; 4])?,
    ];
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let program = program.clone();
            let mut inputs =
                vec![Tensor::from_f32(&[8, 16], ramp(8 * 16, 0.1 * (t + 1) as f32)).unwrap()];
            inputs.extend(weights.iter().cloned());
            std::thread::spawn(move || program.run(&inputs))
        })
        .collect();
    for (t, h) in handles.into_iter().enumerate() {
        let out = h.join().expect("thread")?;
        let probs = out[0].as_f32().expect("f32");
        println!("thread {t}: first row {:?}", &probs[..4]);
    }
    Ok(())
}

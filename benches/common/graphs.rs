//! Training graphs the memory benchmarks share (`remat`, `offload`): a dense chain, residual
//! blocks, a small transformer and a dense U-Net, as IR text with a scalar loss.

use std::fmt::Write;

pub fn chain(n: usize) -> String {
    let mut s = String::from("func @chain(%x: f32[64,256]");
    for i in 0..n {
        write!(s, ", %l{i}/w: f32[256,256], %l{i}/b: f32[256]").unwrap();
    }
    s += ") -> (f32[]) {\n";
    let mut prev = "%x".to_string();
    for i in 0..n {
        writeln!(s, "  %l{i}/mm = matmul {prev}, %l{i}/w : f32[64,256]").unwrap();
        writeln!(s, "  %l{i}/add = add %l{i}/mm, %l{i}/b : f32[64,256]").unwrap();
        writeln!(s, "  %l{i}/act = tanh %l{i}/add : f32[64,256]").unwrap();
        prev = format!("%l{i}/act");
    }
    writeln!(s, "  %loss = reduce_mean {prev} {{axes=[0,1]}} : f32[]").unwrap();
    s + "  return %loss\n}\n"
}

pub fn residual(n: usize) -> String {
    let mut s = String::from("func @residual(%x: f32[64,256]");
    for i in 0..n {
        write!(
            s,
            ", %b{i}/w1: f32[256,256], %b{i}/b1: f32[256], %b{i}/w2: f32[256,256]"
        )
        .unwrap();
    }
    s += ") -> (f32[]) {\n";
    let mut prev = "%x".to_string();
    for i in 0..n {
        let t = "f32[64,256]";
        writeln!(s, "  %b{i}/mm1 = matmul {prev}, %b{i}/w1 : {t}").unwrap();
        writeln!(s, "  %b{i}/add1 = add %b{i}/mm1, %b{i}/b1 : {t}").unwrap();
        writeln!(s, "  %b{i}/relu = relu %b{i}/add1 : {t}").unwrap();
        writeln!(s, "  %b{i}/mm2 = matmul %b{i}/relu, %b{i}/w2 : {t}").unwrap();
        writeln!(s, "  %b{i}/out = add {prev}, %b{i}/mm2 : {t}").unwrap();
        prev = format!("%b{i}/out");
    }
    writeln!(s, "  %loss = reduce_mean {prev} {{axes=[0,1]}} : f32[]").unwrap();
    s + "  return %loss\n}\n"
}

/// Layer norm over the last axis (no affine), written out.
pub fn layer_norm(s: &mut String, x: &str, p: &str, t: &str, r: &str) -> String {
    writeln!(
        s,
        "  %{p}/mu = reduce_mean {x} {{axes=[-1], keepdims=true}} : {r}"
    )
    .unwrap();
    writeln!(s, "  %{p}/xc = sub {x}, %{p}/mu : {t}").unwrap();
    writeln!(s, "  %{p}/sq = mul %{p}/xc, %{p}/xc : {t}").unwrap();
    writeln!(
        s,
        "  %{p}/var = reduce_mean %{p}/sq {{axes=[-1], keepdims=true}} : {r}"
    )
    .unwrap();
    writeln!(s, "  %{p}/eps = const {{value=0.00001}} : f32[]").unwrap();
    writeln!(s, "  %{p}/ve = add %{p}/var, %{p}/eps : {r}").unwrap();
    writeln!(s, "  %{p}/rs = rsqrt %{p}/ve : {r}").unwrap();
    writeln!(s, "  %{p}/y = mul %{p}/xc, %{p}/rs : {t}").unwrap();
    format!("%{p}/y")
}

pub fn transformer(n: usize) -> String {
    let (b, tk, d) = (4, 128, 128);
    let t = format!("f32[{b},{tk},{d}]");
    let r = format!("f32[{b},{tk},1]");
    let tt = format!("f32[{b},{tk},{tk}]");
    let h = format!("f32[{b},{tk},{}]", 4 * d);
    let mut s = format!("func @transformer(%x: {t}");
    for i in 0..n {
        for w in ["wq", "wk", "wv", "wo"] {
            write!(s, ", %b{i}/{w}: f32[{d},{d}]").unwrap();
        }
        write!(
            s,
            ", %b{i}/w1: f32[{d},{}], %b{i}/w2: f32[{},{d}]",
            4 * d,
            4 * d
        )
        .unwrap();
    }
    s += ") -> (f32[]) {\n";
    let mut x = "%x".to_string();
    for i in 0..n {
        let y = layer_norm(&mut s, &x, &format!("b{i}/ln1"), &t, &r);
        for q in ["q", "k", "v"] {
            writeln!(s, "  %b{i}/{q} = matmul {y}, %b{i}/w{q} : {t}").unwrap();
        }
        writeln!(
            s,
            "  %b{i}/kt = transpose %b{i}/k {{perm=[0,2,1]}} : f32[{b},{d},{tk}]"
        )
        .unwrap();
        writeln!(s, "  %b{i}/s = matmul %b{i}/q, %b{i}/kt : {tt}").unwrap();
        writeln!(s, "  %b{i}/scale = const {{value=0.088}} : f32[]").unwrap();
        writeln!(s, "  %b{i}/ss = mul %b{i}/s, %b{i}/scale : {tt}").unwrap();
        writeln!(s, "  %b{i}/p = softmax %b{i}/ss : {tt}").unwrap();
        writeln!(s, "  %b{i}/a = matmul %b{i}/p, %b{i}/v : {t}").unwrap();
        writeln!(s, "  %b{i}/o = matmul %b{i}/a, %b{i}/wo : {t}").unwrap();
        writeln!(s, "  %b{i}/x1 = add {x}, %b{i}/o : {t}").unwrap();
        let y = layer_norm(&mut s, &format!("%b{i}/x1"), &format!("b{i}/ln2"), &t, &r);
        writeln!(s, "  %b{i}/h = matmul {y}, %b{i}/w1 : {h}").unwrap();
        writeln!(s, "  %b{i}/g = gelu %b{i}/h : {h}").unwrap();
        writeln!(s, "  %b{i}/m = matmul %b{i}/g, %b{i}/w2 : {t}").unwrap();
        writeln!(s, "  %b{i}/x2 = add %b{i}/x1, %b{i}/m : {t}").unwrap();
        x = format!("%b{i}/x2");
    }
    writeln!(s, "  %loss = reduce_mean {x} {{axes=[0,1,2]}} : f32[]").unwrap();
    s + "  return %loss\n}\n"
}

pub fn unet(levels: usize) -> String {
    const DEPTH: usize = 3;
    let widths: Vec<usize> = (0..levels).map(|i| 256 >> i).collect();
    let mut s = String::from("func @unet(%x: f32[4096,256]");
    let mut body = String::new();
    // DEPTH dense + tanh layers named `{p}{k}`, the first from `prev` (width `from`).
    let mut level = |p: &str, prev: &str, from: usize, w: usize, skip: Option<&str>| {
        let mut prev = prev.to_string();
        for k in 0..DEPTH {
            let a = if k == 0 { from } else { w };
            write!(s, ", %{p}{k}/w: f32[{a},{w}]").unwrap();
            writeln!(
                body,
                "  %{p}{k}/mm = matmul {prev}, %{p}{k}/w : f32[4096,{w}]"
            )
            .unwrap();
            let mut pre = format!("%{p}{k}/mm");
            if let (0, Some(skip)) = (k, skip) {
                writeln!(body, "  %{p}{k}/skip = add {pre}, {skip} : f32[4096,{w}]").unwrap();
                pre = format!("%{p}{k}/skip");
            }
            writeln!(body, "  %{p}{k}/act = tanh {pre} : f32[4096,{w}]").unwrap();
            prev = format!("%{p}{k}/act");
        }
        prev
    };
    let mut prev = "%x".to_string();
    let mut from = 256;
    let mut skips = Vec::new();
    for (i, &w) in widths.iter().enumerate() {
        prev = level(&format!("e{i}/"), &prev, from, w, None);
        skips.push(prev.clone());
        from = w;
    }
    for i in (0..levels - 1).rev() {
        prev = level(&format!("d{i}/"), &prev, from, widths[i], Some(&skips[i]));
        from = widths[i];
    }
    writeln!(body, "  %loss = reduce_mean {prev} {{axes=[0,1]}} : f32[]").unwrap();
    s + ") -> (f32[]) {\n" + &body + "  return %loss\n}\n"
}

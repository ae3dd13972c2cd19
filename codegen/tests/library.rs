//! Library calls against the reference interpreter: matmuls through our GEMM (packed and
//! plain operands, GEMV, batched rows) and convolutions through im2col and GEMM and through the
//! channel-blocked kernels, with their epilogues run on finished pieces or in registers.

mod common;

use common::{HOST, LAYOUTS, TARGETS, both, check, compile, randoms};
use tcc_ir::parse_function;

#[test]
fn matmuls_through_gemm_with_epilogues() {
    let cases = [
        // A dense layer: the bias and gelu run in the epilogue, in place over the product.
        "func @f(%x: f32[33,70], %w: f32[70,17], %b: f32[17]) -> (f32[33,17]) {
  %h = matmul %x, %w : f32[33,17]
  %z = add %h, %b : f32[33,17]
  %y = relu %z : f32[33,17]
  return %y
}",
        // The product is returned too, so it has its own storage.
        "func @f(%x: f32[8,16], %w: f32[16,12], %b: f32[12]) -> (f32[8,12], f32[8,12]) {
  %h = matmul %x, %w : f32[8,12]
  %z = add %h, %b : f32[8,12]
  %y = tanh %z : f32[8,12]
  return %y, %h
}",
        // Batched, with the right operand broadcast over the batch.
        "func @f(%a: f32[3,2,5,7], %b: f32[2,7,4]) -> (f32[3,2,5,4]) {
  %c = matmul %a, %b : f32[3,2,5,4]
  return %c
}",
        "func @f(%a: f64[64,64], %b: f64[64,64]) -> (f64[64,64]) {
  %c = matmul %a, %b : f64[64,64]
  return %c
}",
        // Row vectors (the GEMV path): a weight as it is, a transposed one (a fully connected
        // layer's [out, in] weight), and batched.
        "func @f(%x: f32[1,300], %w: f32[300,257], %b: f32[257]) -> (f32[1,257]) {
  %h = matmul %x, %w : f32[1,257]
  %y = add %h, %b : f32[1,257]
  return %y
}",
        "func @f(%x: f32[1,300], %wt: f32[257,300]) -> (f32[1,257]) {
  %w = transpose %wt {perm=[1,0]} : f32[300,257]
  %y = matmul %x, %w : f32[1,257]
  return %y
}",
        "func @f(%a: f32[2,1,40], %b: f32[2,40,9]) -> (f32[2,1,9]) {
  %c = matmul %a, %b : f32[2,1,9]
  return %c
}",
        // Large enough for the threads to split the weight's rows (partial vectors added up
        // after), batched, with an epilogue; rows and columns not multiples of four or eight.
        "func @f(%a: f32[2,1,301], %b: f32[2,301,259], %c: f32[259]) -> (f32[2,1,259]) {
  %p = matmul %a, %b : f32[2,1,259]
  %z = add %p, %c : f32[2,1,259]
  %y = relu %z : f32[2,1,259]
  return %y
}",
        // Batched rows times one matrix: one GEMM over all rows (a sequence-first
        // transformer's projection, one row per batch; and several rows per batch), with an
        // epilogue reading a bias.
        "func @f(%a: f32[37,1,50], %b: f32[50,70], %c: f32[70]) -> (f32[37,1,70]) {
  %p = matmul %a, %b : f32[37,1,70]
  %y = add %p, %c : f32[37,1,70]
  return %y
}",
        "func @f(%a: f32[2,3,5,40], %b: f32[40,9]) -> (f32[2,3,5,9]) {
  %c = matmul %a, %b : f32[2,3,5,9]
  return %c
}",
        // Large enough to run on both cores.
        "func @f(%a: f32[96,128], %b: f32[128,80]) -> (f32[96,80]) {
  %c = matmul %a, %b : f32[96,80]
  return %c
}",
    ];
    for src in cases {
        let f = parse_function(src).unwrap();
        let (got, want, exe) = both(&f, &randoms(&f, 21));
        assert_eq!(exe.stats().reference, 0, "{src}");
        check(&got, &want, 1e-5, 1e-5).unwrap_or_else(|e| panic!("{src}\n{e}"));
    }
    // Constant weights, packed at compile time: with an epilogue, batched rows, transposed;
    // one also read by a row vector (the GEMV, which reads it unpacked) and one returned, so
    // both must still be materialised.
    let w = |n: usize| -> String {
        let v: Vec<String> = (0..n)
            .map(|i| format!("{}", ((i * 7 % 13) as f32 - 6.0) / 8.0))
            .collect();
        v.join(", ")
    };
    let cases = [
        format!(
            "func @f(%x: f32[33,70], %b: f32[17]) -> (f32[33,17]) {{
  %w = const {{value=[{}]}} : f32[70,17]
  %h = matmul %x, %w : f32[33,17]
  %z = add %h, %b : f32[33,17]
  %y = gelu %z : f32[33,17]
  return %y
}}",
            w(70 * 17)
        ),
        format!(
            "func @f(%a: f32[37,1,50]) -> (f32[37,1,40]) {{
  %wt = const {{value=[{}]}} : f32[40,50]
  %w = transpose %wt {{perm=[1,0]}} : f32[50,40]
  %c = matmul %a, %w : f32[37,1,40]
  return %c
}}",
            w(40 * 50)
        ),
        format!(
            "func @f(%x: f32[20,30], %v: f32[1,30]) -> (f32[20,25], f32[1,25], f32[30,25]) {{
  %w = const {{value=[{}]}} : f32[30,25]
  %h = matmul %x, %w : f32[20,25]
  %g = matmul %v, %w : f32[1,25]
  return %h, %g, %w
}}",
            w(30 * 25)
        ),
    ];
    for src in &cases {
        let f = parse_function(src).unwrap();
        let (got, want, exe) = both(&f, &randoms(&f, 22));
        assert_eq!(exe.stats().reference, 0, "{src}");
        check(&got, &want, 1e-5, 1e-5).unwrap_or_else(|e| panic!("{src}\n{e}"));
    }
}

#[test]
fn convolutions_through_im2col_and_gemm() {
    let cases = [
        ("f32[2,3,9,9]", "f32[4,3,3,3]", "", "f32[2,4,7,7]"),
        (
            "f32[1,4,8,8]",
            "f32[6,4,3,3]",
            "{strides=[2,2], pads=[1,1,1,1]}",
            "f32[1,6,4,4]",
        ),
        (
            "f32[1,4,9,9]",
            "f32[4,1,3,3]",
            "{pads=[2,2,2,2], dilations=[2,2], groups=4}",
            "f32[1,4,9,9]",
        ),
        (
            "f32[2,6,5,7]",
            "f32[4,3,2,3]",
            "{strides=[1,2], pads=[0,1,1,0], groups=2}",
            "f32[2,4,5,3]",
        ),
        ("f32[2,8,6,6]", "f32[5,8,1,1]", "", "f32[2,5,6,6]"),
        // Depthwise (the direct kernel): rows with and without a partial last vector of eight
        // outputs, unit and column stride 2, a 5x5 dilated filter; strided with uneven pads,
        // and f64 with dilation.
        (
            "f32[2,3,11,37]",
            "f32[3,1,3,3]",
            "{pads=[1,1,1,1], groups=3}",
            "f32[2,3,11,37]",
        ),
        (
            "f32[1,4,12,41]",
            "f32[4,1,3,3]",
            "{strides=[2,2], pads=[1,0,1,1], groups=4}",
            "f32[1,4,6,20]",
        ),
        // A 7x7 plane (a late layer's) with column stride 3: rows shorter than a vector.
        (
            "f32[1,3,7,7]",
            "f32[3,1,3,3]",
            "{strides=[2,3], pads=[1,1,1,1], groups=3}",
            "f32[1,3,4,3]",
        ),
        (
            "f32[1,2,13,30]",
            "f32[2,1,5,5]",
            "{pads=[4,3,4,3], dilations=[2,2], groups=2}",
            "f32[1,2,13,28]",
        ),
        // Several blocks of eight channels, the last partial, and planes taller than one strip
        // of the transposed buffer (96 KiB); strided, dilated and unevenly padded.
        (
            "f32[1,13,37,130]",
            "f32[13,1,3,3]",
            "{pads=[1,1,1,1], groups=13}",
            "f32[1,13,37,130]",
        ),
        (
            "f32[2,17,40,90]",
            "f32[17,1,5,5]",
            "{strides=[2,2], pads=[2,1,2,2], dilations=[1,2], groups=17}",
            "f32[2,17,20,43]",
        ),
        (
            "f64[1,2,6,27]",
            "f64[2,1,3,3]",
            "{strides=[1,2], pads=[1,1,1,1], groups=2}",
            "f64[1,2,6,14]",
        ),
        (
            "f32[2,5,9,8]",
            "f32[5,1,3,3]",
            "{strides=[2,2], pads=[1,0,1,1], groups=5}",
            "f32[2,5,5,4]",
        ),
        (
            "f64[1,3,6,7]",
            "f64[3,1,3,2]",
            "{strides=[1,3], pads=[0,1,2,1], dilations=[2,1], groups=3}",
            "f64[1,3,4,3]",
        ),
        (
            "f64[1,2,5,5]",
            "f64[3,2,3,3]",
            "{pads=[1,1,1,1]}",
            "f64[1,3,5,5]",
        ),
    ];
    for (x, w, attrs, y) in cases {
        let src = format!(
            "func @f(%x: {x}, %w: {w}) -> ({y}) {{\n  %y = conv2d %x, %w {attrs} : {y}\n  return %y\n}}"
        );
        let f = parse_function(&src).unwrap();
        let inputs = randoms(&f, 31);
        let want = tcc_ir::interp::run(&f, &inputs).unwrap();
        for plain in LAYOUTS {
            let exe = compile(&f, HOST, plain);
            assert_eq!(exe.stats().reference, 0, "{src}");
            let got = exe.run(&inputs).unwrap();
            check(&got, &want, 1e-5, 1e-5).unwrap_or_else(|e| panic!("plain {plain}\n{src}\n{e}"));
        }
    }
    // A constant filter, packed once at compile time (two groups, strided, padded).
    let values: Vec<String> = (0..108)
        .map(|i| format!("{}", ((i * 7 % 13) as f32 - 6.0) / 8.0))
        .collect();
    let src = format!(
        "func @f(%x: f32[2,4,9,9]) -> (f32[2,6,5,5]) {{
  %w = const {{value=[{}]}} : f32[6,2,3,3]
  %y = conv2d %x, %w {{strides=[2,2], pads=[1,1,1,1], groups=2}} : f32[2,6,5,5]
  return %y
}}",
        values.join(", ")
    );
    let f = parse_function(&src).unwrap();
    let inputs = randoms(&f, 31);
    let want = tcc_ir::interp::run(&f, &inputs).unwrap();
    let exe = compile(&f, HOST, true);
    assert_eq!(exe.stats().reference, 0);
    check(&exe.run(&inputs).unwrap(), &want, 1e-5, 1e-5).unwrap();
    // A convolution with a per-channel bias and relu in its epilogue.
    let src = "func @f(%x: f32[1,3,12,12], %w: f32[8,3,3,3], %b: f32[8,1,1]) -> (f32[1,8,10,10]) {
  %c = conv2d %x, %w : f32[1,8,10,10]
  %z = add %c, %b : f32[1,8,10,10]
  %y = relu %z : f32[1,8,10,10]
  return %y
}";
    let f = parse_function(src).unwrap();
    let inputs = randoms(&f, 32);
    let want = tcc_ir::interp::run(&f, &inputs).unwrap();
    let exe = compile(&f, HOST, true);
    assert_eq!((exe.stats().compiled, exe.stats().reference), (1, 0));
    check(&exe.run(&inputs).unwrap(), &want, 1e-5, 1e-5).unwrap();
}

/// Library calls run their epilogue piece by piece as they finish parts of the output, on the
/// thread that wrote them: every path of matmul and convolution, with ranges that start
/// inside a vector (odd planes and rows, a GEMV split among threads), an epilogue that reads
/// another input, and more rows than one block of the GEMM. Each for the host, and without
/// AVX-512 (the AVX2 kernels), and without FMA (no kernel of ours: the `gemm` crate).
#[test]
fn library_epilogues_run_on_finished_pieces() {
    let cases = [
        // One image's GEMM split among threads by columns (by rows of C as they finish).
        "func @f(%x: f32[1,16,40,40], %w: f32[24,16,3,3], %b: f32[24,1,1]) -> (f32[1,24,38,38]) {
  %c = conv2d %x, %w : f32[1,24,38,38]
  %z = add %c, %b : f32[1,24,38,38]
  %y = relu %z : f32[1,24,38,38]
  return %y
}",
        // Small planes (15x15): images side by side in one GEMM, copied out, then finished;
        // a residual add reading another input.
        "func @f(%x: f32[3,8,15,15], %w: f32[12,8,1,1], %b: f32[12,1,1], %r: f32[3,12,15,15]) -> (f32[3,12,15,15]) {
  %c = conv2d %x, %w : f32[3,12,15,15]
  %z = add %c, %b : f32[3,12,15,15]
  %y = add %z, %r : f32[3,12,15,15]
  return %y
}",
        // Depthwise: each channel plane finished as it is written.
        "func @f(%x: f32[2,10,21,23], %w: f32[10,1,3,3], %b: f32[10,1,1]) -> (f32[2,10,11,12]) {
  %c = conv2d %x, %w {strides=[2,2], pads=[1,1,1,1], groups=10} : f32[2,10,11,12]
  %z = add %c, %b : f32[2,10,11,12]
  %y = sigmoid %z : f32[2,10,11,12]
  return %y
}",
        // Depthwise and 1x1 as in MobileNet: a per-channel scale and bias and relu6 (clamps
        // to constants), which a blocked convolution applies as it stores.
        "func @f(%x: f32[1,20,13,11], %w: f32[20,1,3,3], %s: f32[1,20,1,1], %b: f32[20,1,1]) -> (f32[1,20,13,11]) {
  %c = conv2d %x, %w {pads=[1,1,1,1], groups=20} : f32[1,20,13,11]
  %m = mul %c, %s : f32[1,20,13,11]
  %z = add %m, %b : f32[1,20,13,11]
  %lo = const {value=0.0} : f32[]
  %hi = const {value=6.0} : f32[]
  %r = max %z, %lo : f32[1,20,13,11]
  %y = min %hi, %r : f32[1,20,13,11]
  return %y
}",
        "func @f(%x: f32[1,20,13,11], %w: f32[12,20,1,1], %b: f32[12,1,1], %r: f32[1,12,13,11]) -> (f32[1,12,13,11]) {
  %c = conv2d %x, %w : f32[1,12,13,11]
  %z = add %b, %c : f32[1,12,13,11]
  %s = add %r, %z : f32[1,12,13,11]
  %y = relu %s : f32[1,12,13,11]
  return %y
}",
        // The epilogues blocked kernels store in one loop each (`post::Fast`): a bias and a
        // clamp whose ceiling random sums cross; a bias and SiLU; a bias alone; each after a
        // direct and a depthwise convolution.
        "func @f(%x: f32[1,16,9,14], %w: f32[24,16,1,1], %b: f32[24,1,1]) -> (f32[1,24,9,14]) {
  %c = conv2d %x, %w : f32[1,24,9,14]
  %z = add %c, %b : f32[1,24,9,14]
  %lo = const {value=0.0} : f32[]
  %hi = const {value=0.5} : f32[]
  %r = max %z, %lo : f32[1,24,9,14]
  %y = min %r, %hi : f32[1,24,9,14]
  return %y
}",
        "func @f(%x: f32[1,16,9,14], %w: f32[16,1,3,3], %b: f32[16,1,1]) -> (f32[1,16,9,14]) {
  %c = conv2d %x, %w {pads=[1,1,1,1], groups=16} : f32[1,16,9,14]
  %z = add %c, %b : f32[1,16,9,14]
  %lo = const {value=0.0} : f32[]
  %hi = const {value=0.5} : f32[]
  %r = max %z, %lo : f32[1,16,9,14]
  %y = min %r, %hi : f32[1,16,9,14]
  return %y
}",
        "func @f(%x: f32[2,8,10,10], %w: f32[20,8,3,3], %b: f32[20,1,1]) -> (f32[2,20,10,10]) {
  %c = conv2d %x, %w {pads=[1,1,1,1]} : f32[2,20,10,10]
  %z = add %c, %b : f32[2,20,10,10]
  %s = sigmoid %z : f32[2,20,10,10]
  %y = mul %z, %s : f32[2,20,10,10]
  return %y
}",
        "func @f(%x: f32[1,12,11,10], %w: f32[12,1,5,5], %b: f32[12,1,1]) -> (f32[1,12,11,10]) {
  %c = conv2d %x, %w {pads=[2,2,2,2], groups=12} : f32[1,12,11,10]
  %z = add %c, %b : f32[1,12,11,10]
  %s = sigmoid %z : f32[1,12,11,10]
  %y = mul %s, %z : f32[1,12,11,10]
  return %y
}",
        "func @f(%x: f32[1,24,7,9], %w: f32[16,24,1,1], %b: f32[16,1,1]) -> (f32[1,16,7,9]) {
  %c = conv2d %x, %w : f32[1,16,7,9]
  %y = add %c, %b : f32[1,16,7,9]
  return %y
}",
        "func @f(%x: f32[1,16,7,9], %w: f32[16,1,3,3], %b: f32[16,1,1]) -> (f32[1,16,4,5]) {
  %c = conv2d %x, %w {strides=[2,2], pads=[1,1,1,1], groups=16} : f32[1,16,4,5]
  %y = add %c, %b : f32[1,16,4,5]
  return %y
}",
        "func @f(%x: f32[1,16,7,9], %w: f32[16,1,3,3], %b: f32[16,1,1], %r: f32[1,16,7,9]) -> (f32[1,16,7,9]) {
  %c = conv2d %x, %w {pads=[1,1,1,1], groups=16} : f32[1,16,7,9]
  %z = add %c, %b : f32[1,16,7,9]
  %s = add %z, %r : f32[1,16,7,9]
  %y = relu %s : f32[1,16,7,9]
  return %y
}",
        // The 512-bit direct kernel's tiles of seven pixels (`tile_pixels512`), whole (7x7)
        // and partial (a row of 13: 7 + 6), with an epilogue that has no form of its own
        // there (a bias and sigmoid) (stored pair by pair through the general store); 40 outputs: two pairs of
        // blocks and a last block alone.
        "func @f(%x: f32[1,16,7,7], %w: f32[40,16,3,3], %b: f32[40,1,1]) -> (f32[1,40,7,7]) {
  %c = conv2d %x, %w {pads=[1,1,1,1]} : f32[1,40,7,7]
  %z = add %c, %b : f32[1,40,7,7]
  %y = sigmoid %z : f32[1,40,7,7]
  return %y
}",
        "func @f(%x: f32[1,16,1,13], %w: f32[40,16,1,3], %b: f32[40,1,1]) -> (f32[1,40,1,13]) {
  %c = conv2d %x, %w {pads=[0,1,0,1]} : f32[1,40,1,13]
  %z = add %c, %b : f32[1,40,1,13]
  %y = sigmoid %z : f32[1,40,1,13]
  return %y
}",
        // More rows than a block of the GEMM, columns in several groups.
        "func @f(%x: f32[203,150], %w: f32[150,601], %b: f32[601]) -> (f32[203,601]) {
  %h = matmul %x, %w : f32[203,601]
  %z = add %h, %b : f32[203,601]
  %y = tanh %z : f32[203,601]
  return %y
}",
        // A GEMV whose outputs are split among threads at an odd column.
        "func @f(%x: f32[1,400], %w: f32[400,301], %b: f32[301]) -> (f32[1,301]) {
  %h = matmul %x, %w : f32[1,301]
  %z = add %h, %b : f32[1,301]
  %y = relu %z : f32[1,301]
  return %y
}",
        // A gradient: finished as a whole once every image is done.
        "func @f(%x: f32[2,3,9,9], %dy: f32[2,4,7,7], %s: f32[4,3,3,3]) -> (f32[4,3,3,3]) {
  %dw = conv2d_grad_filter %x, %dy {shape=[4,3,3,3]} : f32[4,3,3,3]
  %y = mul %dw, %s : f32[4,3,3,3]
  return %y
}",
    ];
    for src in cases {
        let f = parse_function(src).unwrap_or_else(|e| panic!("{src}\n{e}"));
        let inputs = randoms(&f, 53);
        let want = tcc_ir::interp::run(&f, &inputs).unwrap();
        for target in TARGETS {
            for plain in LAYOUTS {
                let exe = compile(&f, target, plain);
                assert_eq!(exe.stats().reference, 0, "{src}");
                assert_eq!(
                    exe.stats().compiled,
                    1,
                    "one kernel, the call and its epilogue (plain {plain}): {src}"
                );
                let got = exe.run(&inputs).unwrap();
                check(&got, &want, 1e-5, 1e-5)
                    .unwrap_or_else(|e| panic!("{target:?}, plain {plain}\n{src}\n{e}"));
            }
        }
    }
}

/// A matmul applies the epilogues it recognises (`cpu/post/`, in the rows layout) to its
/// product's rows in registers as they finish; any other runs as a compiled loop. The two give
/// the same bits: each chain below runs both ways, once alone (in registers) and once with the
/// product returned too (which keeps the chain in the compiled loop), on rows whose length is
/// not a multiple of eight (masked last vectors), a GEMV split among threads at odd columns,
/// batched rows, and for every target (without FMA neither runs: the `gemm` crate and no
/// kernel of ours).
#[test]
fn matmul_epilogues_in_registers_match_the_compiled_loop_bit_for_bit() {
    let chains = [
        // A fully connected layer with GELU as PyTorch exports it.
        "  %z = add %h, %b : T
  %c = const {value=[1.4142135]} : f32[]
  %d = div %z, %c : T
  %e = erf %d : T
  %one = const {value=[1.0]} : f32[]
  %a = add %one, %e : T
  %m = mul %a, %z : T
  %half = const {value=[0.5]} : f32[]
  %y = mul %m, %half : T",
        // ... and without a bias (ConvNeXt's, zero at initialisation, are folded away).
        "  %c = const {value=[1.4142135]} : f32[]
  %d = div %h, %c : T
  %e = erf %d : T
  %one = const {value=[1.0]} : f32[]
  %a = add %e, %one : T
  %m = mul %h, %a : T
  %half = const {value=[0.5]} : f32[]
  %y = mul %m, %half : T",
        "  %z = add %b, %h : T\n  %y = relu %z : T",
        "  %z = add %h, %b : T\n  %y = gelu %z : T",
        "  %z = add %h, %b : T\n  %s = add %z, %r : T\n  %y = relu %s : T",
        "  %z = mul %h, %b : T\n  %s = sigmoid %z : T\n  %y = mul %z, %s : T",
        "  %z = add %h, %r : T\n  %lo = const {value=-0.5} : f32[]\n  %hi = const {value=0.5} : f32[]\n  %c = max %z, %lo : T\n  %y = min %c, %hi : T",
    ];
    // (input, weight, bias, product)
    let shapes = [
        ("[33,70]", "[70,37]", "[37]", "[33,37]"),
        ("[1,400]", "[400,301]", "[1,301]", "[1,301]"),
        ("[2,9,40]", "[40,24]", "[24]", "[2,9,24]"),
        ("[203,150]", "[150,601]", "[601]", "[203,601]"),
    ];
    for chain in chains {
        for (x, w, b, t) in shapes {
            let chain = chain.replace(" T", &format!(" f32{t}"));
            let src = |also: &str, extra: &str| {
                format!(
                    "func @f(%x: f32{x}, %w: f32{w}, %b: f32{b}, %r: f32{t}) -> (f32{t}{extra}) {{
  %h = matmul %x, %w : f32{t}
{chain}
  return %y{also}
}}"
                )
            };
            let alone = parse_function(&src("", "")).unwrap_or_else(|e| panic!("{e}"));
            let with = parse_function(&src(", %h", &format!(", f32{t}"))).unwrap();
            let inputs = randoms(&alone, 61);
            let want = tcc_ir::interp::run(&alone, &inputs).unwrap();
            for target in TARGETS {
                let got = compile(&alone, target, true).run(&inputs).unwrap();
                let looped = compile(&with, target, true).run(&inputs).unwrap();
                let (g, l) = (got[0].as_f32().unwrap(), looped[0].as_f32().unwrap());
                for (i, (g, l)) in g.iter().zip(l).enumerate() {
                    assert!(
                        g.to_bits() == l.to_bits(),
                        "{target:?}, element {i}: {g} in registers, {l} in the loop\n{}",
                        src("", "")
                    );
                }
                check(&got, &want, 1e-5, 1e-5)
                    .unwrap_or_else(|e| panic!("{target:?}\n{}\n{e}", src("", "")));
            }
        }
    }
}

/// A ConvNeXt block: the depthwise convolution's output goes to channels-last for a dense
/// layer with GELU and comes back for the scale and the residual add, which the `nchwc` pass
/// turns into transposes of whole blocks (`layout.rs`); and a block whose channels are not
/// whole blocks (12), which keeps the plain transposes. Every layout and target, against the
/// reference interpreter.
#[test]
fn convnext_blocks_through_channels_last() {
    for c in [16, 12] {
        let src = format!(
            "func @f(%x: f32[1,{c},9,7], %wd: f32[{c},1,7,7], %w1: f32[{c},32], %w2: f32[32,{c}], %gamma: f32[{c},1,1], %wd2: f32[{c},1,7,7]) -> (f32[1,{c},9,7]) {{
  %d = conv2d %x, %wd {{pads=[3,3,3,3], groups={c}}} : f32[1,{c},9,7]
  %t = transpose %d {{perm=[0,2,3,1]}} : f32[1,9,7,{c}]
  %h = matmul %t, %w1 : f32[1,9,7,32]
  %k = const {{value=[1.4142135]}} : f32[]
  %q = div %h, %k : f32[1,9,7,32]
  %e = erf %q : f32[1,9,7,32]
  %one = const {{value=[1.0]}} : f32[]
  %a = add %e, %one : f32[1,9,7,32]
  %m = mul %h, %a : f32[1,9,7,32]
  %half = const {{value=[0.5]}} : f32[]
  %g = mul %m, %half : f32[1,9,7,32]
  %o = matmul %g, %w2 : f32[1,9,7,{c}]
  %b = transpose %o {{perm=[0,3,1,2]}} : f32[1,{c},9,7]
  %s = mul %gamma, %b : f32[1,{c},9,7]
  %r = add %s, %x : f32[1,{c},9,7]
  %y = conv2d %r, %wd2 {{pads=[3,3,3,3], groups={c}}} : f32[1,{c},9,7]
  return %y
}}"
        );
        let f = parse_function(&src).unwrap();
        let inputs = randoms(&f, 71);
        let want = tcc_ir::interp::run(&f, &inputs).unwrap();
        for target in TARGETS {
            for plain in LAYOUTS {
                let exe = compile(&f, target, plain);
                assert_eq!(exe.stats().reference, 0, "{src}");
                let got = exe.run(&inputs).unwrap();
                // Two 49-tap depthwise sums and two products deep: without FMA, `erf`'s
                // polynomials round at every step (4e-5 relative seen).
                check(&got, &want, 1e-4, 1e-4)
                    .unwrap_or_else(|e| panic!("{target:?}, plain {plain}\n{src}\n{e}"));
            }
        }
    }
}

/// MobileNet's expand and depthwise pair: the depthwise reads the 1x1's blocked output, with
/// its scale, bias and relu6 applied as it stores; in both layouts and for every target.
#[test]
fn depthwise_after_a_blocked_convolution() {
    let src = "func @f(%x: f32[1,8,30,33], %w1: f32[24,8,1,1], %w: f32[24,1,3,3], %s: f32[1,24,1,1], %b: f32[24,1,1]) -> (f32[1,24,15,17]) {
  %e = conv2d %x, %w1 : f32[1,24,30,33]
  %c = conv2d %e, %w {strides=[2,2], pads=[1,1,1,1], groups=24} : f32[1,24,15,17]
  %m = mul %c, %s : f32[1,24,15,17]
  %z = add %m, %b : f32[1,24,15,17]
  %lo = const {value=0.0} : f32[]
  %hi = const {value=6.0} : f32[]
  %r = max %z, %lo : f32[1,24,15,17]
  %y = min %hi, %r : f32[1,24,15,17]
  return %y
}";
    let f = parse_function(src).unwrap();
    let inputs = randoms(&f, 54);
    let want = tcc_ir::interp::run(&f, &inputs).unwrap();
    for target in TARGETS {
        for plain in LAYOUTS {
            let exe = compile(&f, target, plain);
            assert_eq!(exe.stats().reference, 0);
            check(&exe.run(&inputs).unwrap(), &want, 1e-5, 1e-5)
                .unwrap_or_else(|e| panic!("{target:?}, plain {plain}: {e}"));
        }
    }
}

/// Depthwise layers on both widths of library kernels: with 512-bit ones, pairs of blocks run
/// sixteen channels a `zmm` register (`nchwc/depthwise512.rs`), with 256-bit ones eight a
/// `ymm`; each output is the same products in the same order, so the two give the same bits.
/// Forty channels (two pairs and a single block) and twenty (a pair and a partial block);
/// rows wide enough to be read in place and rows copied into a padded band; every filter with
/// a kernel of its own and one without; epilogues with a form on sixteen lanes (relu6, SiLU, a
/// residual) and without (sigmoid, stored block by block). On a CPU without AVX-512F both
/// runs take the eight-channel kernel, and the test checks it against the interpreter only.
#[test]
fn depthwise_pairs_match_the_eight_channel_kernel_bit_for_bit() {
    let layers = [
        (40, 28, 3, "{pads=[1,1,1,1], groups=40}", 28),
        (40, 14, 5, "{pads=[2,2,2,2], groups=40}", 14),
        (40, 29, 7, "{pads=[3,3,3,3], groups=40}", 29),
        (20, 28, 3, "{strides=[2,2], pads=[1,1,1,1], groups=20}", 14),
        (40, 27, 5, "{strides=[2,2], pads=[2,2,2,2], groups=40}", 14),
        (24, 13, 3, "{groups=24}", 11),
        (
            16,
            12,
            3,
            "{pads=[1,1,1,1], dilations=[2,2], groups=16}",
            10,
        ),
    ];
    let epilogues = [
        "  %lo = const {value=0.0} : f32[]\n  %hi = const {value=6.0} : f32[]\n  %r = max %z, %lo : T\n  %y = min %r, %hi : T",
        "  %s = sigmoid %z : T\n  %y = mul %z, %s : T",
        "  %y = add %z, %q : T",
        "  %y = sigmoid %z : T",
    ];
    for (c, h, k, attrs, oh) in layers {
        for epilogue in epilogues {
            let t = format!("f32[1,{c},{oh},{oh}]");
            let src = format!(
                "func @f(%x: f32[1,{c},{h},{h}], %w: f32[{c},1,{k},{k}], %b: f32[{c},1,1], %q: {t}) -> ({t}) {{
  %c = conv2d %x, %w {attrs} : {t}
  %z = add %c, %b : {t}
{}
  return %y
}}",
                epilogue.replace(" T", &format!(" {t}"))
            );
            let f = parse_function(&src).unwrap_or_else(|e| panic!("{src}\n{e}"));
            let inputs = randoms(&f, 57);
            let want = tcc_ir::interp::run(&f, &inputs).unwrap();
            let run = |width| {
                let exe = compile(&f, (None, width), false);
                assert_eq!(exe.stats().reference, 0, "{src}");
                exe.run(&inputs).unwrap()
            };
            let wide = run(tcc_codegen::VectorWidth::W512);
            let narrow = run(tcc_codegen::VectorWidth::W256);
            let (a, b) = (wide[0].as_f32().unwrap(), narrow[0].as_f32().unwrap());
            for (i, (a, b)) in a.iter().zip(b).enumerate() {
                assert!(
                    a.to_bits() == b.to_bits(),
                    "element {i}: {a} at 512 bits, {b} at 256\n{src}"
                );
            }
            check(&wide, &want, 1e-5, 1e-5).unwrap_or_else(|e| panic!("{src}\n{e}"));
        }
    }
}

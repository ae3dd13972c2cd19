//! Tests of the GEMM: both operand forms, every kernel the host runs, and `done`.
use super::*;

/// Every kernel this CPU runs (the AVX-512 one also where [`Isa::for_target`] prefers the AVX2
/// one).
fn kernels() -> Vec<Isa> {
    let host = crate::cpu::Features::of(None).expect("the host target");
    let mut isas = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        use std::is_x86_feature_detected as has;
        if host.avx512f && has!("avx512f") {
            isas.push(Isa::Avx512);
        }
        if host.avx2 && host.fma && has!("avx2") && has!("fma") {
            isas.push(Isa::Avx2);
        }
    }
    isas
}

/// A packed A, and B as the im2col view of two images (strided, padded, dilated, with more
/// columns than a panel and more taps than a depth block), against explicit im2col.
#[test]
fn packed_a_and_implicit_im2col() {
    // (channels, h, w, kh, kw, stride, dilation, pad, output channels)
    let cases = [
        (3, 9, 8, 3, 3, [2, 1], [1, 2], [1, 2], 13),
        (30, 7, 7, 3, 3, [1, 1], [1, 1], [1, 1], 25),
        // Few columns and enough rows: with a packed A, threads split the rows.
        (20, 12, 11, 5, 4, [3, 2], [1, 1], [2, 0], 40),
    ];
    for (isa, (ch, h, w, kh, kw, st, dil, pad, o)) in kernels()
        .into_iter()
        .flat_map(|isa| cases.map(|case| (isa, case)))
    {
        let oh = (h + 2 * pad[0] - dil[0] * (kh - 1) - 1) / st[0] + 1;
        let ow = (w + 2 * pad[1] - dil[1] * (kw - 1) - 1) / st[1] + 1;
        let images = 2;
        let x: Vec<f32> = (0..images * ch * h * w)
            .map(|i| ((i * 7 % 19) as f32 - 9.0) / 4.0)
            .collect();
        let k = ch * kh * kw;
        let n = images * oh * ow;
        let filt: Vec<f32> = (0..o * k)
            .map(|i| ((i * 5 % 11) as f32 - 5.0) / 8.0)
            .collect();
        // Explicit im2col: row (c, ky, kx), column (image, oy, ox).
        let mut cols = vec![0.0f32; k * n];
        for c in 0..ch {
            for ky in 0..kh {
                for kx in 0..kw {
                    let r = (c * kh + ky) * kw + kx;
                    for im in 0..images {
                        for oy in 0..oh {
                            for ox in 0..ow {
                                let iy = (oy * st[0] + ky * dil[0]) as isize - pad[0] as isize;
                                let ix = (ox * st[1] + kx * dil[1]) as isize - pad[1] as isize;
                                if (0..h as isize).contains(&iy) && (0..w as isize).contains(&ix) {
                                    cols[r * n + (im * oh + oy) * ow + ox] =
                                        x[((im * ch + c) * h + iy as usize) * w + ix as usize];
                                }
                            }
                        }
                    }
                }
            }
        }
        let fa = Mat {
            ptr: filt.as_ptr(),
            rs: k,
            cs: 1,
        };
        let mut want = vec![0.0f32; o * n];
        // SAFETY: the operands are vectors of o x k, k x n and o x n floats.
        unsafe {
            sgemm(
                isa,
                o,
                n,
                k,
                fa,
                Mat {
                    ptr: cols.as_ptr(),
                    rs: n,
                    cs: 1,
                },
                want.as_mut_ptr(),
                n,
                false,
                1,
                None,
            )
        };
        let view = Im2col {
            x: x.as_ptr(),
            image_stride: ch * h * w,
            h,
            w,
            kh,
            kw,
            oh,
            ow,
            stride: st,
            dilation: dil,
            pad,
        };
        // SAFETY: `filt` holds o x k floats.
        let packed = unsafe { PackedA::new(isa, o, k, fa) };
        for threads in [1, 2] {
            for a in [A::Mat(fa), A::Packed(&packed)] {
                let mut got = vec![f32::NAN; o * n];
                // SAFETY: as for the sgemm above; `view` reads the two images in `x`.
                unsafe {
                    product(
                        isa,
                        o,
                        n,
                        k,
                        a,
                        B::Im2col(view),
                        got.as_mut_ptr(),
                        n,
                        false,
                        threads,
                        None,
                    )
                };
                assert_eq!(
                    got, want,
                    "{isa:?}, case {ch}x{h}x{w} k{kh}x{kw}, {threads} threads"
                );
            }
        }
    }
}

/// `done` hears of every element of C exactly once, after it holds its final value: for
/// one block of rows and several, one thread and two, a packed A and a plain one.
#[test]
fn reports_each_row_piece_once_when_final() {
    use std::sync::Mutex;
    for (isa, (m, n, k)) in kernels()
        .into_iter()
        .flat_map(|isa| [(20, 700, 300), (300, 90, 40), (7, 5, 0)].map(|s| (isa, s)))
    {
        let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 - 3.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 - 2.0).collect();
        let want: Vec<f32> = (0..m * n)
            .map(|ij| (0..k).map(|p| a[ij / n * k + p] * b[p * n + ij % n]).sum())
            .collect();
        let fa = Mat::rows(a.as_ptr(), k);
        // SAFETY: `a` holds m x k floats.
        let packed = unsafe { PackedA::new(isa, m, k, fa) };
        for threads in [1, 2] {
            for a_op in [A::Mat(fa), A::Packed(&packed)] {
                let mut c = vec![f32::NAN; m * n];
                let seen = Mutex::new(vec![0u8; m * n]);
                // SAFETY: `done` only reads elements the GEMM has finished writing.
                let cp = unsafe { SendPtr::new(c.as_mut_ptr()) };
                let done = |i: usize, cols: std::ops::Range<usize>| {
                    let mut seen = seen.lock().unwrap();
                    for j in cols {
                        seen[i * n + j] += 1;
                        // SAFETY: (i, j) is inside C; its writer has finished it.
                        let got = unsafe { *cp.get().add(i * n + j) };
                        assert_eq!(got, want[i * n + j], "{isa:?} {m}x{n}x{k} ({i},{j})");
                    }
                };
                // SAFETY: the operands address m x k, k x n and m x n floats.
                unsafe {
                    product(
                        isa,
                        m,
                        n,
                        k,
                        a_op,
                        B::Mat(Mat::rows(b.as_ptr(), n)),
                        c.as_mut_ptr(),
                        n,
                        false,
                        threads,
                        Some(&done),
                    )
                };
                let seen = seen.into_inner().unwrap();
                assert!(seen.iter().all(|&s| s == 1), "{isa:?} {m}x{n}x{k}");
            }
        }
    }
}

/// The operands of the product tests: A (`m x k`) and B (`k x n`), row-major.
fn operands(m: usize, n: usize, k: usize) -> (Vec<f32>, Vec<f32>) {
    let a = (0..m * k)
        .map(|i| ((i * 7 % 13) as f32 - 6.0) / 8.0)
        .collect();
    let b = (0..k * n)
        .map(|i| ((i * 5 % 11) as f32 - 5.0) / 4.0)
        .collect();
    (a, b)
}

/// Checks `c` (`m x n`, row-major) against `scale` times `a b` summed in f64; `what` names the
/// case in a failure.
fn check_product(
    c: &[f32],
    (a, b): (&[f32], &[f32]),
    [m, n, k]: [usize; 3],
    scale: f64,
    what: &str,
) {
    for i in 0..m {
        for j in 0..n {
            let want: f64 = scale
                * (0..k)
                    .map(|p| a[i * k + p] as f64 * b[p * n + j] as f64)
                    .sum::<f64>();
            let got = c[i * n + j] as f64;
            assert!(
                (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                "{what} at ({i},{j}): {got} vs {want}"
            );
        }
    }
}

#[test]
fn matches_a_plain_product() {
    let shapes = [
        (1, 1, 1),
        (12, 32, 5),
        (13, 33, 385),
        (70, 100, 30),
        (5, 3, 800),
        (130, 65, 400),
        // More rows than either kernel's MC block, depth across two KC blocks.
        (200, 40, 300),
    ];
    for (isa, (m, n, k)) in kernels()
        .into_iter()
        .flat_map(|isa| shapes.map(|shape| (isa, shape)))
    {
        let (a, b) = operands(m, n, k);
        // Plain, then with A read transposed from its transpose and B likewise, then
        // accumulating onto the first product.
        let at: Vec<f32> = (0..k * m).map(|i| a[(i % m) * k + i / m]).collect();
        let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
        let plain = (
            Mat {
                ptr: a.as_ptr(),
                rs: k,
                cs: 1,
            },
            Mat {
                ptr: b.as_ptr(),
                rs: n,
                cs: 1,
            },
        );
        let strided = (
            Mat {
                ptr: at.as_ptr(),
                rs: 1,
                cs: m,
            },
            Mat {
                ptr: bt.as_ptr(),
                rs: 1,
                cs: k,
            },
        );
        let mut c = vec![f32::NAN; m * n];
        for (pass, (ma, mb), acc) in [
            (1.0, plain, false),
            (1.0, strided, false),
            (2.0, strided, true),
        ] {
            // SAFETY: ma, mb and c address m x k, k x n and m x n floats of live vectors.
            unsafe { sgemm(isa, m, n, k, ma, mb, c.as_mut_ptr(), n, acc, 2, None) };
            let what = format!("{isa:?} {m}x{n}x{k}, pass {pass}");
            check_product(&c, (&a, &b), [m, n, k], pass, &what);
        }
    }
}

/// B packed ahead of time (row-major and transposed), with threads taking rows: every shape
/// of `matches_a_plain_product`, plus one with several column groups and depth blocks.
#[test]
fn packed_b_matches_a_plain_product() {
    let shapes = [
        (1, 1, 1),
        (12, 32, 5),
        (13, 33, 385),
        (70, 100, 30),
        (130, 65, 400),
        (200, 40, 300),
        (37, 600, 520),
    ];
    for (isa, (m, n, k)) in kernels()
        .into_iter()
        .flat_map(|isa| shapes.map(|shape| (isa, shape)))
    {
        let (a, b) = operands(m, n, k);
        let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
        let forms = [
            Mat {
                ptr: b.as_ptr(),
                rs: n,
                cs: 1,
            },
            Mat {
                ptr: bt.as_ptr(),
                rs: 1,
                cs: k,
            },
        ];
        for (form, mb) in forms.into_iter().enumerate() {
            // SAFETY: mb addresses the k x n matrix B.
            let pb = unsafe { PackedB::new(isa, k, n, mb) };
            let ma = Mat {
                ptr: a.as_ptr(),
                rs: k,
                cs: 1,
            };
            for threads in [1, 2, 3] {
                let mut c = vec![f32::NAN; m * n];
                // SAFETY: a and c address m x k and m x n floats of live vectors; pb is k x n.
                unsafe {
                    product(
                        isa,
                        m,
                        n,
                        k,
                        A::Mat(ma),
                        B::Packed(&pb),
                        c.as_mut_ptr(),
                        n,
                        false,
                        threads,
                        None,
                    )
                };
                let what = format!("{isa:?} {m}x{n}x{k}, form {form}, {threads} threads");
                check_product(&c, (&a, &b), [m, n, k], 1.0, &what);
            }
        }
    }
}

//! Swapping on the CPU backend: a `swap_out`'s result is stored in the host pool, not the
//! arena, so the arena shrinks by what is swapped out over the peak, and the results are the
//! bits of the same function without the swap (and the interpreter's within rounding).

mod common;

use common::check;
use tcc_codegen::Executable;
use tcc_ir::random::{Rng, random_tensor};
use tcc_ir::{Tensor, parse_function};

/// `%a` is needed again at the end; while `%b` (twice its size) is computed and reduced it is
/// either kept in device memory or swapped out to the host.
fn src(swap: bool) -> String {
    let (out, back) = if swap {
        (
            "  %h = swap_out %a : f32[64,64]\n",
            "  %c = swap_in %h : f32[64,64]\n",
        )
    } else {
        ("", "  %c = identity %a : f32[64,64]\n")
    };
    format!(
        "func @f(%x: f32[64,64]) -> (f32[64,64]) {{
  %a = matmul %x, %x : f32[64,64]
{out}  %b = concat %x, %x {{axis=0}} : f32[128,64]
  %r = reduce_max %b {{axes=[0, 1]}} : f32[]
{back}  %z = mul %c, %r : f32[64,64]
  %y = matmul %z, %x : f32[64,64]
  return %y
}}"
    )
}

#[test]
fn swapped_values_leave_the_arena_and_keep_their_bits() {
    let kept = parse_function(&src(false)).unwrap();
    let swapped = parse_function(&src(true)).unwrap();
    let x: Vec<Tensor> = vec![random_tensor(kept.ty(kept.params()[0]), &mut Rng::new(3))];
    let want = tcc_ir::interp::run(&swapped, &x).unwrap();
    for target in [None, Some("host,-avx512f"), Some("host,-avx2,-fma")] {
        let a = Executable::compile_for(&kept, target).unwrap();
        let b = Executable::compile_for(&swapped, target).unwrap();
        let (sa, sb) = (a.stats(), b.stats());
        assert_eq!(sa.host_bytes, 0);
        assert_eq!(sb.host_bytes, 64 * 64 * 4, "{target:?}");
        assert!(
            sb.arena_bytes + 64 * 64 * 4 <= sa.arena_bytes,
            "{target:?}: arena {} with the swap, {} without",
            sb.arena_bytes,
            sa.arena_bytes
        );
        // Twice each: the second run reuses the first's arena and host pool.
        for _ in 0..2 {
            let (ya, yb) = (a.run(&x).unwrap(), b.run(&x).unwrap());
            assert!(
                ya[0].data() == yb[0].data(),
                "{target:?}: other bits with the swap"
            );
            check(&yb, &want, 1e-5, 1e-5).unwrap_or_else(|e| panic!("{target:?}: {e}"));
        }
    }
}

/// The copies run on the copy thread, which sleeps out a slow link here (2 MB/s: 8 ms a copy)
/// while the steps go on: the step that overwrites the swapped-out value's bytes waits for the
/// swap-out, and the reader of the swap-in waits for it, so the results are the same bits.
/// Without those waits the slow copies read overwritten bytes or deliver too late. The same
/// with the copies made inline (the steps then wait for the simulated link alone).
#[test]
fn slow_copies_still_give_the_same_bits() {
    use tcc_codegen::Copying;
    let kept = parse_function(&src(false)).unwrap();
    let swapped = parse_function(&src(true)).unwrap();
    let x: Vec<Tensor> = vec![random_tensor(kept.ty(kept.params()[0]), &mut Rng::new(4))];
    let want = Executable::compile(&kept).unwrap().run(&x).unwrap();
    for copies in [Copying::Thread, Copying::Inline, Copying::Auto] {
        for bandwidth in [None, Some(2e6)] {
            let cpu = tcc_codegen::Cpu {
                link_bandwidth: bandwidth,
                copies,
                ..Default::default()
            };
            let exe = tcc_codegen::compile(&cpu, &swapped).unwrap();
            for _ in 0..3 {
                let got = exe.run(&x).unwrap();
                let what = format!("{copies:?}, {bandwidth:?}: other bits");
                assert!(got[0].data() == want[0].data(), "{what}");
            }
        }
    }
}

/// Several runs at once share the copy thread; each waits for its own copies.
#[test]
fn concurrent_runs_swap_independently() {
    let swapped = parse_function(&src(true)).unwrap();
    let kept = parse_function(&src(false)).unwrap();
    let cpu = tcc_codegen::Cpu {
        link_bandwidth: Some(20e6),
        copies: tcc_codegen::Copying::Thread,
        ..Default::default()
    };
    let exe = tcc_codegen::compile(&cpu, &swapped).unwrap();
    let base = Executable::compile(&kept).unwrap();
    std::thread::scope(|s| {
        for seed in 0..4 {
            let (exe, base, ty) = (&exe, &base, kept.ty(kept.params()[0]).clone());
            s.spawn(move || {
                let x = vec![random_tensor(&ty, &mut Rng::new(seed))];
                let want = base.run(&x).unwrap();
                for _ in 0..3 {
                    assert!(
                        exe.run(&x).unwrap()[0].data() == want[0].data(),
                        "seed {seed}"
                    );
                }
            });
        }
    });
}

"""The numpy side of `cargo bench --bench cpu`: the same computations, timed the same way
(best of N wall-clock runs after one warm-up). With case names as arguments, runs only those.
Prints one JSON object: case name -> seconds. Inputs are random; values do not matter here."""
import json
import sys
import time

import numpy as np

rng = np.random.default_rng(0)


def f32(*shape):
    return rng.standard_normal(shape, dtype=np.float32)


def best(fn, runs):
    """The fastest of `runs` calls (more where they fit in 0.25 s, as benches/common/timing.rs)."""
    s = time.perf_counter()
    fn()
    once = max(time.perf_counter() - s, 1e-6)
    runs = max(runs, int(min(1000, 0.25 / once)))
    t = float("inf")
    for _ in range(runs):
        s = time.perf_counter()
        fn()
        t = min(t, time.perf_counter() - s)
    return t


def conv3x3(x, w):
    # im2col by strided views, then one matmul: the usual numpy formulation.
    n, c, h, wd = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    cols = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))  # n c h w 3 3
    cols = cols.transpose(0, 2, 3, 1, 4, 5).reshape(n * h * wd, c * 9)
    out = cols @ w.reshape(w.shape[0], -1).T
    return out.reshape(n, h, wd, -1).transpose(0, 3, 1, 2)


def softmax(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def main():
    wanted = set(sys.argv[1:])

    def want(name):
        return not wanted or name in wanted

    out = {}
    for n in (256, 512, 1024, 2048):
        if want(f"sgemm {n}"):
            a, b = f32(n, n), f32(n, n)
            out[f"sgemm {n}"] = best(lambda: a @ b, 3 if n == 2048 else 10)
    if want("sgemm 64x4096x4096"):
        a, b = f32(64, 4096), f32(4096, 4096)
        out["sgemm 64x4096x4096"] = best(lambda: a @ b, 10)
    if want("chain tanh(x*a+b)*x 16M"):
        x, b = f32(1 << 24), f32(1 << 24)
        s = np.float32(0.75)
        out["chain tanh(x*a+b)*x 16M"] = best(lambda: np.tanh(x * s + b) * x, 5)
    if want("softmax 4096x4096"):
        x = f32(4096, 4096)
        out["softmax 4096x4096"] = best(lambda: softmax(x), 5)
    if want("conv2d 3x3 64->64 56x56"):
        x, w = f32(1, 64, 56, 56), f32(64, 64, 3, 3)
        out["conv2d 3x3 64->64 56x56"] = best(lambda: conv3x3(x, w), 5)
    if want("mlp 784-512-10 batch 64"):
        x, w1, b1, w2, b2 = f32(64, 784), f32(784, 512), f32(512), f32(512, 10), f32(10)
        out["mlp 784-512-10 batch 64"] = best(lambda: softmax(np.maximum(x @ w1 + b1, 0) @ w2 + b2), 20)
    json.dump(out, sys.stdout)


main()

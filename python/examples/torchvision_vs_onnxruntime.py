"""Export a torchvision model to ONNX, run it with tcc and with onnxruntime on the same input
and the same number of threads, and print both latencies and the largest difference.

    pip install ./python torch torchvision onnx onnxruntime
    python python/examples/torchvision_vs_onnxruntime.py --model resnet18 --threads 2

Random weights (no download); batch norm is kept in the export and folded by tcc's
pipeline. Also prints tcc's Python overhead per call: a run of a one-op program through
`Program.run` against the same run inside Rust (`tcc bench`, when TCC_BIN names the binary).
"""

import argparse
import os
import subprocess
import tempfile
import time

import numpy as np
import onnxruntime as ort
import torch
import torchvision

import tcc


def median_ms(f, runs, warmup=5):
    for _ in range(warmup):
        f()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return 1e3 * float(np.median(times))


def python_overhead(runs):
    """Median microseconds of `Program.run` on a one-op program, and of the same run inside
    Rust (`tcc bench`), where TCC_BIN is set."""
    text = "func @f(%x: f32[16]) -> (f32[16]) {\n  %y = relu %x : f32[16]\n  return %y\n}\n"
    p = tcc.compile(text, threads=1)
    x = np.linspace(-1, 1, 16, dtype=np.float32)
    py_us = 1e3 * median_ms(lambda: p.run(x), runs, warmup=100)
    rust_us = None
    binary = os.environ.get("TCC_BIN")
    if binary:
        with tempfile.NamedTemporaryFile("w", suffix=".tir", delete=False) as f:
            f.write(text)
        out = subprocess.run(
            [binary, "bench", f.name, "--runs", str(runs), "--warmup", "100", "--threads", "1"],
            capture_output=True, text=True, check=True,
        ).stdout
        os.unlink(f.name)
        line = next(l for l in out.splitlines() if "median" in l)
        value, unit = line.split("median ")[1].split()[:2]
        assert unit == "ms", line
        rust_us = 1e3 * float(value)
    return py_us, rust_us


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet18", help="a torchvision.models constructor")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--runs", type=int, default=50)
    args = ap.parse_args()

    torch.manual_seed(0)
    model = getattr(torchvision.models, args.model)(weights=None).eval()
    x = torch.randn(args.batch, 3, 224, 224)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, f"{args.model}.onnx")
        torch.onnx.export(model, (x,), path, input_names=["input"], output_names=["logits"],
                          opset_version=17, dynamo=False)
        t = time.perf_counter()
        program = tcc.compile(path, threads=args.threads)
        compile_s = time.perf_counter() - t
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = args.threads
        opts.inter_op_num_threads = 1
        session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])

    xs = x.numpy()
    (ours,) = program.run(xs)
    (theirs,) = session.run(None, {"input": xs})
    tcc_ms = median_ms(lambda: program.run(xs), args.runs)
    ort_ms = median_ms(lambda: session.run(None, {"input": xs}), args.runs)
    diff = float(np.abs(ours - theirs).max())
    scale = float(np.abs(theirs).max())

    print(f"{args.model}, batch {args.batch}, {args.threads} threads, medians of {args.runs} runs")
    print(f"  CPU features tcc uses: {' '.join(tcc.cpu_features())}")
    print(f"  tcc compile {compile_s:.2f} s")
    print(f"  tcc          {tcc_ms:8.2f} ms")
    print(f"  onnxruntime  {ort_ms:8.2f} ms   (tcc/onnxruntime {tcc_ms / ort_ms:.2f}x)")
    print(f"  largest difference {diff:.3g} (largest logit {scale:.3g})")
    py_us, rust_us = python_overhead(2000)
    if rust_us is None:
        print(f"  Program.run of a one-op program: {py_us:.1f} µs (set TCC_BIN for the Rust figure)")
    else:
        print(f"  Program.run of a one-op program: {py_us:.1f} µs; in Rust (tcc bench) {rust_us:.1f} µs;"
              f" Python's overhead {py_us - rust_us:.1f} µs per call")


if __name__ == "__main__":
    main()

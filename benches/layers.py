"""Per-layer times of one ONNX model, tcc against onnxruntime, from each one's own profiler.

    target/torch-venv/bin/python benches/layers.py MODEL.onnx [--rounds 3] [--runs 30]
        [--threads 2] [--tcc target/release/tcc] [--top 30] [--target host,-avx512f]

MODEL_input.npy beside the model is the input (benches/onnx.rs writes one per model). Rounds
alternate the two runtimes and keep each layer's smallest time, since the machines these run
on drift by tens of percent over minutes. Layers are matched by the node path both keep
(`/features/features.3/conv/conv.1`): onnxruntime names a fused node by its last op's output,
tcc a step by its first value; a fused node named after a batch norm's or an activation's
output counts for the convolution that starts its chain in the file. A step of tcc's that fused
two layers (`conv2d_nchwc {...} + conv2d_nchwc ... %first + %second`: a depthwise layer and
the 1x1 after it) is one row, `first + second`, against the sum of onnxruntime's two. onnxruntime's time of a node is its median over the runs, tcc's
the mean after its warm-up runs (`tcc bench --profile`). Printed largest difference first; a layer only one side
lists shows 0 on the other (ops that side fused away or names differently).
"""
import argparse, collections, json, os, re, subprocess, tempfile

import numpy as np
import onnxruntime as ort


def key(name):
    m = re.match(r"%?(/[^ ]*?)/(Conv|Clip|Relu|Mul|Sigmoid|Add|Gemm|Flatten|GlobalAveragePool|"
                 r"ReduceMean|MatMul|Softmax|Transpose|Reshape)[^/]*(/.*)?$", name)
    k = m.group(1) if m else name
    # `conv.0.0` (the convolution) and `conv.0.2` (its activation) are one layer, and so are
    # `branch1/conv` and a functional relu after it (`branch1/Relu`), as GoogLeNet's are.
    return re.sub(r"/conv$", "", re.sub(r"(\.\d+)\.\d+$", r"\1", k))


def chain_roots(path):
    """Tensor name -> the output of the convolution (or matmul) whose chain of batch norms and
    activations produced it, so that onnxruntime's fused nodes, named after their last op's
    output (`/stage2/.../branch2.2/Relu_output_0_nchwc` for a Conv, BatchNormalization and Relu
    kept apart in the file), find the layer tcc names after its first value."""
    import onnx
    graph = onnx.load(path, load_external_data=False).graph
    producer = {o: n for n in graph.node for o in n.output}
    chain_ops = {"BatchNormalization", "Relu", "Clip", "LeakyRelu", "HardSigmoid", "HardSwish"}
    roots = {}
    for t, n in producer.items():
        while n.op_type in chain_ops and n.input and n.input[0] in producer:
            n = producer[n.input[0]]
        if n.op_type in ("Conv", "MatMul", "Gemm"):
            roots[t] = n.output[0]
    return roots


def ort_layers(path, x, threads, runs):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(tempfile.gettempdir(), "tcc-layers-ort")
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    feed = {s.get_inputs()[0].name: x}
    for _ in range(runs):
        s.run(None, feed)
    f = s.end_profiling()
    with open(f) as fh:
        events = json.load(fh)
    os.remove(f)
    # Each node once per run: its median over the runs (the first runs warm up).
    runs_of = collections.defaultdict(list)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            runs_of[e["name"][: -len("_kernel_time")]].append(e["dur"] / 1000)
    roots = chain_roots(path)
    per = collections.defaultdict(float)
    for node, ms in runs_of.items():
        tensor = node[: -len("_nchwc")] if node.endswith("_nchwc") else node
        per[key(roots.get(tensor, node))] += float(np.median(ms))
    return per


def tcc_layers(tcc, path, threads, runs, target):
    extra = ["--target", target] if target else []
    out = subprocess.run([tcc, "bench", path, "--threads", str(threads), "--runs", str(runs),
                          "--profile", *extra], capture_output=True, text=True, check=True)
    per, joined = collections.defaultdict(float), {}
    for line in (out.stdout + out.stderr).splitlines():
        m = re.match(r"\s+([\d.]+) ms\s+[\d.]+%\s+\S+\s+\S+\s+.* : \S+ (%\S+(?: \+ %\S+)*)$",
                     line)
        if m:
            layers = [key(n) for n in m.group(2).split(" + ")]
            row = " + ".join(layers)
            per[row] += float(m.group(1))
            if len(layers) > 1:
                joined.update((k, row) for k in layers)
    return per, joined


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tcc", default="target/release/tcc")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--target", help="tcc's instruction set, as `tcc bench --target` takes it")
    a = p.parse_args()
    x = np.load(a.model.replace(".onnx", "_input.npy"))
    best = {"ort": {}, "tcc": {}}
    for _ in range(a.rounds):
        t_per, joined = tcc_layers(a.tcc, a.model, a.threads, a.runs, a.target)
        o_per = collections.defaultdict(float)
        for k, v in ort_layers(a.model, x, a.threads, a.runs).items():
            o_per[joined.get(k, k)] += v
        for side, per in [("ort", o_per), ("tcc", t_per)]:
            for k, v in per.items():
                best[side][k] = min(best[side].get(k, v), v)
    o, t = best["ort"], best["tcc"]
    print(f"sum of per-layer minima: onnxruntime {sum(o.values()):.3f} ms, "
          f"tcc {sum(t.values()):.3f} ms")
    keys = sorted(set(o) | set(t), key=lambda k: -(t.get(k, 0) - o.get(k, 0)))
    for k in keys[: a.top]:
        print(f"{k:60s} ort {o.get(k, 0):7.3f}  tcc {t.get(k, 0):7.3f}  "
              f"diff {t.get(k, 0) - o.get(k, 0):+7.3f}")


if __name__ == "__main__":
    main()

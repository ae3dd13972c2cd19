"""ONNX benchmark peer (benches/onnx.rs runs it): exports torchvision models with random weights
(once, into DIR) and times onnxruntime on them.

    python benches/onnx_peer.py DIR THREADS RUNS [MODEL...]

Writes DIR/<model>.onnx, DIR/<model>_input.npy and DIR/<model>_output.npy (onnxruntime's output)
and prints one JSON object: model -> best latency in seconds over up to RUNS runs (fewer for
models slower than 1/RUNS of half a second), with THREADS intra-op threads; every model, or
those named.
"""
import json, os, sys, time

# `_bn`: the same models exported with batch norm kept (no constant folding, training mode
# preserved), as exporters leave them when asked to keep the graph trainable. `_b8`: batch 8.
# `bert2`: a 2-layer `nn.TransformerEncoder` (d=256, 4 heads, feed-forward 1024, GELU) on a
# sequence of 128.
MODELS = ["resnet18", "mobilenet_v2", "efficientnet_b0", "resnet18_bn", "mobilenet_v2_bn",
          "efficientnet_b0_bn", "shufflenet_v2_x1_0_bn", "convnext_tiny", "vit_b_16",
          "bert2", "resnet18_b8", "mobilenet_v2_b8", "vit_b_16_b8", "bert2_b8"]


def build(name):
    """The model of `name` (random weights, eval mode) and its input."""
    import torch
    import torchvision

    torch.manual_seed(0)
    base = name.removesuffix("_b8").removesuffix("_bn")
    batch = 8 if name.endswith("_b8") else 1
    if base == "bert2":
        layer = torch.nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, activation="gelu",
                                                 batch_first=True)
        model = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
        return model, torch.rand(batch, 128, 256)
    model = getattr(torchvision.models, base)(weights=None).eval()
    if base.startswith("vit"):
        # torchvision starts the classifier at zero: the logits would all be 0 and compare
        # equal whatever the rest computed.
        with torch.no_grad():
            model.heads.head.weight.normal_(0, 0.02)
            model.heads.head.bias.uniform_(-0.1, 0.1)
    # Random running statistics, so that batch norm is not the identity and outputs are
    # not vanishingly small.
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.1, 0.1)
    return model, torch.rand(batch, 3, 224, 224)


def export(d):
    import numpy as np
    import torch

    os.makedirs(d, exist_ok=True)
    for name in MODELS:
        path = os.path.join(d, name + ".onnx")
        if os.path.exists(path):
            continue
        model, x = build(name)
        keep = {"do_constant_folding": False, "training": torch.onnx.TrainingMode.PRESERVE}
        torch.onnx.export(model, (x,), path, input_names=["input"], output_names=["logits"],
                          opset_version=17, dynamo=False, **(keep if name.endswith("_bn") else {}))
        np.save(os.path.join(d, name + "_input.npy"), x.numpy())


def main():
    d, threads, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    names = sys.argv[4:] or MODELS
    export(d)
    import numpy as np
    import onnxruntime as ort

    times = {}
    for name in names:
        o = ort.SessionOptions()
        o.intra_op_num_threads = threads
        o.inter_op_num_threads = 1
        s = ort.InferenceSession(os.path.join(d, name + ".onnx"), o,
                                 providers=["CPUExecutionProvider"])
        x = np.load(os.path.join(d, name + "_input.npy"))
        np.save(os.path.join(d, name + "_output.npy"), s.run(None, {"input": x})[0])
        for _ in range(3):
            s.run(None, {"input": x})
        # Up to RUNS runs, fewer for the large models: about half a second each.
        t = time.perf_counter()
        s.run(None, {"input": x})
        n = max(3, min(runs, int(0.5 / (time.perf_counter() - t))))
        best = float("inf")
        for _ in range(n):
            t = time.perf_counter()
            s.run(None, {"input": x})
            best = min(best, time.perf_counter() - t)
        times[name] = best
    print(json.dumps(times))


if __name__ == "__main__":
    main()

"""ONNX benchmark peer (benches/onnx.rs runs it): exports torchvision models with random weights
(once, into DIR) and times onnxruntime on them.

    python benches/onnx_peer.py DIR THREADS RUNS

Writes DIR/<model>.onnx, DIR/<model>_input.npy and DIR/<model>_output.npy (onnxruntime's output)
and prints one JSON object: model -> best latency in seconds over RUNS runs at batch 1, with
THREADS intra-op threads.
"""
import json, os, sys, time

# `_bn`: the same models exported with batch norm kept (no constant folding, training mode
# preserved), as exporters leave them when asked to keep the graph trainable.
MODELS = ["resnet18", "mobilenet_v2", "efficientnet_b0", "resnet18_bn", "mobilenet_v2_bn",
          "efficientnet_b0_bn"]


def export(d):
    import numpy as np
    import torch
    import torchvision

    os.makedirs(d, exist_ok=True)
    for name in MODELS:
        path = os.path.join(d, name + ".onnx")
        if os.path.exists(path):
            continue
        torch.manual_seed(0)
        arch = name.removesuffix("_bn")
        model = getattr(torchvision.models, arch)(weights=None).eval()
        # Random running statistics, so that batch norm is not the identity and outputs are
        # not vanishingly small.
        with torch.no_grad():
            for m in model.modules():
                if isinstance(m, torch.nn.BatchNorm2d):
                    m.running_mean.uniform_(-0.1, 0.1)
                    m.running_var.uniform_(0.5, 1.5)
                    m.weight.uniform_(0.5, 1.5)
                    m.bias.uniform_(-0.1, 0.1)
        x = torch.rand(1, 3, 224, 224)
        keep = {"do_constant_folding": False, "training": torch.onnx.TrainingMode.PRESERVE}
        torch.onnx.export(model, (x,), path, input_names=["input"], output_names=["logits"],
                          opset_version=17, dynamo=False, **(keep if name.endswith("_bn") else {}))
        np.save(os.path.join(d, name + "_input.npy"), x.numpy())


def main():
    d, threads, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    export(d)
    import numpy as np
    import onnxruntime as ort

    times = {}
    for name in MODELS:
        o = ort.SessionOptions()
        o.intra_op_num_threads = threads
        o.inter_op_num_threads = 1
        s = ort.InferenceSession(os.path.join(d, name + ".onnx"), o,
                                 providers=["CPUExecutionProvider"])
        x = np.load(os.path.join(d, name + "_input.npy"))
        np.save(os.path.join(d, name + "_output.npy"), s.run(None, {"input": x})[0])
        for _ in range(5):
            s.run(None, {"input": x})
        best = float("inf")
        for _ in range(runs):
            t = time.perf_counter()
            s.run(None, {"input": x})
            best = min(best, time.perf_counter() - t)
        times[name] = best
    print(json.dumps(times))


if __name__ == "__main__":
    main()

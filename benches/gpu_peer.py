"""GPU benchmark peer (benches/gpu.rs runs it): exports torchvision's resnet18 (random weights,
eval mode) at batch 1 and 32 to DIR/resnet18_b{1,32}.onnx (once), and times PyTorch on CUDA.

    python benches/gpu_peer.py DIR RUNS

Prints one JSON object: resnet18_b1 / resnet18_b32 -> PyTorch's mean latency on CUDA in seconds
(CUDA events, after warm-up) in strict f32, and the same keys with `_tf32` under cuDNN's
default (convolutions on TF32 tensor cores), or -1 where PyTorch has no CUDA device here.
"""
import json, os, sys


def main():
    import torch
    import torchvision

    out, runs = sys.argv[1], int(sys.argv[2])
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    model = torchvision.models.resnet18().eval()
    # Export both sizes before the model moves to the GPU (export traces it on the CPU).
    for batch in (1, 32):
        path = os.path.join(out, f"resnet18_b{batch}.onnx")
        if not os.path.exists(path):
            x = torch.randn(batch, 3, 224, 224)
            torch.onnx.export(model, x, path, input_names=["input"], dynamo=False)
    times = {}
    for batch in (1, 32):
        if not torch.cuda.is_available():
            times[f"resnet18_b{batch}"] = -1.0
            continue
        x = torch.randn(batch, 3, 224, 224)
        m, xg = model.cuda(), x.cuda()
        # Strict f32 first (the arithmetic tcc's kernels do), then cuDNN's default, which
        # lets convolutions round their inputs to TF32 on the tensor cores.
        for tf32, key in ((False, ""), (True, "_tf32")):
            torch.backends.cudnn.allow_tf32 = tf32
            with torch.no_grad():
                for _ in range(10):
                    m(xg)
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(runs):
                    m(xg)
                end.record()
                torch.cuda.synchronize()
            times[f"resnet18_b{batch}{key}"] = start.elapsed_time(end) / 1e3 / runs
    print(json.dumps(times))


main()

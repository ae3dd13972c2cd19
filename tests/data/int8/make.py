"""Regenerates the int8 fixtures that tests/onnx_int8.rs checks tcc against: a small CNN
(convolutions plain, strided, depthwise and 1x1, ReLU, global pooling, a linear layer) exported
from PyTorch with random weights, quantized by onnxruntime's `quantize_static` from random
calibration inputs, in both of its formats:
  qdq.onnx       QuantizeLinear/DequantizeLinear pairs around float ops (per-channel s8
                 weights, u8 activations), the format onnxruntime recommends
  qoperator.onnx QLinearConv and QLinearMatMul (per-tensor weights)
with input.npy (a batch of 2) and onnxruntime's outputs for it (qdq_out.npy, qoperator_out.npy,
and the float model's, float_out.npy), and each quantized model's last quantization step (the scale
of its last DequantizeLinear: qdq_step.npy, qoperator_step.npy).
Run: target/torch-venv/bin/python tests/data/int8/make.py  (torch, onnx, onnxruntime; the
files are small)
"""
import os
import numpy as np
import onnx
import onnx.numpy_helper
import torch
import torch.nn as nn
import onnxruntime as ort
from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                      quantize_static)

HERE = os.path.dirname(os.path.abspath(__file__))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.pw = nn.Conv2d(16, 12, 1)
        # A matmul and an add rather than nn.Linear's Gemm, which onnxruntime quantizes to its
        # own QGemm (domain com.microsoft).
        self.w = nn.Parameter(torch.randn(12, 5) / 4)
        self.b = nn.Parameter(torch.randn(5) / 4)

    def forward(self, x):
        h = torch.relu(self.c1(x))
        h = torch.relu(self.c2(h))
        h = torch.relu(self.dw(h))
        h = torch.relu(self.pw(h))
        h = h.mean((2, 3))
        return h @ self.w + self.b


class Reader(CalibrationDataReader):
    def __init__(self, rng):
        self.batches = iter([{"x": rng.standard_normal((2, 3, 16, 16)).astype(np.float32)}
                             for _ in range(16)])

    def get_next(self):
        return next(self.batches, None)


def main():
    torch.manual_seed(0)
    net = Net().eval()
    x = np.random.default_rng(1).standard_normal((2, 3, 16, 16)).astype(np.float32)
    fp = os.path.join(HERE, "float.onnx")
    torch.onnx.export(net, torch.from_numpy(x), fp, input_names=["x"], output_names=["y"],
                      opset_version=17, dynamo=False)
    outs = {"float_out": fp}
    # QOperator quantizes Conv and MatMul only: its Add, pooling and Gemm are onnxruntime's
    # own ops (domain com.microsoft), not ONNX's.
    for name, fmt, per_channel, ops in [("qdq", QuantFormat.QDQ, True, None),
                                        ("qoperator", QuantFormat.QOperator, False,
                                         ["Conv", "MatMul"])]:
        path = os.path.join(HERE, f"{name}.onnx")
        quantize_static(fp, path, Reader(np.random.default_rng(2)), quant_format=fmt,
                        per_channel=per_channel, activation_type=QuantType.QUInt8,
                        weight_type=QuantType.QInt8, op_types_to_quantize=ops)
        outs[f"{name}_out"] = path
        m = onnx.load(path)
        last = [n for n in m.graph.node if n.op_type == "DequantizeLinear"][-1]
        init = {t.name: t for t in m.graph.initializer}
        step = onnx.numpy_helper.to_array(init[last.input[1]]).astype(np.float32)
        np.save(os.path.join(HERE, f"{name}_step.npy"), step.reshape(()))
    np.save(os.path.join(HERE, "input.npy"), x)
    for out, path in outs.items():
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        np.save(os.path.join(HERE, f"{out}.npy"), sess.run(None, {"x": x})[0])
    os.remove(fp)


if __name__ == "__main__":
    main()

"""Regenerates the PyTorch loss-model fixtures that tests/torch_models.rs checks tcc against.

Each model is a small PyTorch module that computes its own loss, exported to ONNX as PyTorch
users export for training (weights as initializers, no constant folding, BatchNorm in training
mode), with:
  inputs/<name>.npy   the graph inputs (data and labels)
  grads/<name>.npy    torch autograd's gradient of the loss for every weight (by ONNX name)
  sgd_losses.npy      the first 21 losses of plain SGD (lr below) from the exported weights,
                      feeding the same batch every step (the 21st: after 20 updates)
Also recurrent/<name>.onnx: PyTorch nn.LSTM, nn.GRU and nn.RNN (2 layers, bidirectional,
batch-first or not) with initial states, exported for inference, with their input and
onnxruntime's outputs (recurrent/<name>/input_*.npy, output_*.npy) for tests/onnx_recurrent.rs.
Run: target/torch-venv/bin/python tests/data/torch/make.py  (torch, onnx, onnxruntime; the
outputs are small)
"""
import os, sys
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
SGD_LR = 0.05
STEPS = 20


class Cnn(nn.Module):
    """Conv -> BatchNorm (training mode) -> ReLU -> pool -> linear -> cross-entropy."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.bn = nn.BatchNorm2d(6)
        self.conv2 = nn.Conv2d(6, 8, 3, stride=2, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 3 * 3, 5)

    def forward(self, x, labels):
        h = F.relu(self.bn(self.conv(x)))
        h = F.relu(self.bn2(self.conv2(h)))
        logits = self.fc(h.flatten(1))
        return F.cross_entropy(logits, labels)


class Mlp(nn.Module):
    """Linear -> LayerNorm -> GELU -> Linear -> cross-entropy with label smoothing off."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(12, 24)
        self.norm = nn.LayerNorm(24)
        self.fc2 = nn.Linear(24, 24)
        self.out = nn.Linear(24, 4)

    def forward(self, x, labels):
        h = F.gelu(self.norm(self.fc1(x)))
        h = h + F.gelu(self.fc2(h))
        return F.cross_entropy(self.out(h), labels)


class Block(nn.Module):
    """A pre-norm transformer block with nn.MultiheadAttention, then a mean-squared error."""

    def __init__(self):
        super().__init__()
        self.norm1 = nn.LayerNorm(16)
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)
        self.norm2 = nn.LayerNorm(16)
        self.ff1 = nn.Linear(16, 32)
        self.ff2 = nn.Linear(32, 16)

    def forward(self, x, target):
        h = self.norm1(x)
        a, _ = self.attn(h, h, h, need_weights=False)
        x = x + a
        x = x + self.ff2(F.gelu(self.ff1(self.norm2(x))))
        return F.mse_loss(x, target)


def save(d, name, a):
    os.makedirs(d, exist_ok=True)
    np.save(os.path.join(d, name + ".npy"), np.ascontiguousarray(a))


def make(name, model, inputs, input_names):
    torch.manual_seed(0)
    out = os.path.join(HERE, name)
    path = os.path.join(out, "model.onnx")
    os.makedirs(out, exist_ok=True)
    model.train()
    torch.onnx.export(
        model, tuple(inputs), path, input_names=input_names, output_names=["loss"],
        opset_version=17, training=torch.onnx.TrainingMode.TRAINING,
        do_constant_folding=False, dynamo=False,
    )
    for n, x in zip(input_names, inputs):
        save(os.path.join(out, "inputs"), n, x.numpy())
    # Gradients at the exported weights.
    model.zero_grad()
    loss = model(*inputs)
    loss.backward()
    for n, p in model.named_parameters():
        save(os.path.join(out, "grads"), n, p.grad.numpy())
    # Plain SGD from the same weights, on the same batch.
    opt = torch.optim.SGD(model.parameters(), lr=SGD_LR)
    losses = []
    for _ in range(STEPS + 1):
        opt.zero_grad()
        loss = model(*inputs)
        losses.append(loss.item())
        loss.backward()
        opt.step()
    np.save(os.path.join(out, "sgd_losses.npy"), np.array(losses, dtype=np.float32))
    print(name, os.path.getsize(path), "bytes; loss", losses[0], "->", losses[-1])


def make_recurrent(name, module, inputs, input_names, output_names):
    import onnxruntime as ort

    out = os.path.join(HERE, "recurrent", name)
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "model.onnx")
    module.eval()
    torch.onnx.export(module, tuple(inputs), path, input_names=input_names,
                      output_names=output_names, opset_version=17, dynamo=False)
    feed = {n: x.numpy() for n, x in zip(input_names, inputs)}
    for i, n in enumerate(input_names):
        np.save(os.path.join(out, "input_%d.npy" % i), feed[n])
    s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for i, y in enumerate(s.run(None, feed)):
        np.save(os.path.join(out, "output_%d.npy" % i), y)
    print("recurrent", name, os.path.getsize(path), "bytes")


class WithState(nn.Module):
    """A recurrent module called with its initial state as separate tensors."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x, *state):
        state = tuple(state) if len(state) > 1 else state[0]
        y, last = self.inner(x, state)
        return (y, *last) if isinstance(last, tuple) else (y, last)


def recurrent():
    g = torch.Generator().manual_seed(2)
    torch.manual_seed(3)
    lstm = WithState(nn.LSTM(6, 8, num_layers=2, bidirectional=True))
    x = torch.randn(5, 3, 6, generator=g)
    h0, c0 = torch.randn(4, 3, 8, generator=g), torch.randn(4, 3, 8, generator=g)
    make_recurrent("lstm", lstm, [x, h0, c0], ["x", "h0", "c0"], ["y", "h", "c"])
    torch.manual_seed(4)
    gru = WithState(nn.GRU(6, 8, num_layers=2, bidirectional=True, batch_first=True))
    x = torch.randn(3, 5, 6, generator=g)
    make_recurrent("gru", gru, [x, torch.randn(4, 3, 8, generator=g)], ["x", "h0"], ["y", "h"])
    torch.manual_seed(5)
    rnn = WithState(nn.RNN(6, 8, num_layers=2, nonlinearity="relu"))
    x = torch.randn(5, 3, 6, generator=g)
    make_recurrent("rnn", rnn, [x, torch.randn(2, 3, 8, generator=g)], ["x", "h0"], ["y", "h"])


def main():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    make("cnn_bn", Cnn(), [torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 5, (4,), generator=g)],
         ["x", "labels"])
    torch.manual_seed(0)
    make("mlp_ln", Mlp(), [torch.randn(8, 12, generator=g), torch.randint(0, 4, (8,), generator=g)],
         ["x", "labels"])
    torch.manual_seed(0)
    make("mha_block", Block(), [torch.randn(2, 5, 16, generator=g), torch.randn(2, 5, 16, generator=g)],
         ["x", "target"])
    recurrent()


if __name__ == "__main__":
    main()

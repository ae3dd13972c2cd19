"""The PyTorch side of `cargo bench --bench train`: one SGD training step of the same MLP and
CNN as benches/train.rs (same shapes, layouts and loss), on the CPU with a given thread count.
Prints one JSON object: case name -> seconds per step (best of N after warm-up).

Usage: torch_train.py THREADS [CASE...]"""
import json
import sys
import time

import torch
import torch.nn.functional as F

threads = int(sys.argv[1])
torch.set_num_threads(threads)
torch.manual_seed(0)
B = 64


def param(*shape):
    return (torch.randn(*shape) * 0.05).requires_grad_()


def mlp():
    ps = [param(784, 256), param(256), param(256, 128), param(128), param(128, 10), param(10)]

    def loss(x, y):
        h = F.relu(x @ ps[0] + ps[1])
        h = F.relu(h @ ps[2] + ps[3])
        return F.cross_entropy(h @ ps[4] + ps[5], y)

    return ps, loss, torch.randn(B, 784)


def cnn():
    ps = [param(16, 1, 3, 3), param(16), param(32, 16, 3, 3), param(32),
          param(1568, 128), param(128), param(128, 10), param(10)]

    def loss(x, y):
        h = F.max_pool2d(F.relu(F.conv2d(x, ps[0], ps[1], padding=1)), 2)
        h = F.max_pool2d(F.relu(F.conv2d(h, ps[2], ps[3], padding=1)), 2)
        h = F.relu(h.reshape(B, 1568) @ ps[4] + ps[5])
        return F.cross_entropy(h @ ps[6] + ps[7], y)

    return ps, loss, torch.randn(B, 1, 28, 28)


def bench(make, runs):
    ps, loss, x = make()
    y = torch.randint(0, 10, (B,))
    opt = torch.optim.SGD(ps, lr=0.01)

    def step():
        opt.zero_grad(set_to_none=True)
        loss(x, y).backward()
        opt.step()

    for _ in range(5):
        step()
    best = float("inf")
    for _ in range(runs):
        t = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - t)
    return best


cases = {"mlp": (mlp, 200), "cnn": (cnn, 50)}
wanted = sys.argv[2:] or list(cases)
print(json.dumps({name: bench(*cases[name]) for name in wanted}))

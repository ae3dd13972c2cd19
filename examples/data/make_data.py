"""Writes the small datasets the training examples use (run once; the outputs are committed).

spirals/: two interleaved spirals, 200 points each, with a little noise:
  x.npy f32[400,2], labels.npy i32[400].
digits/: the UCI 8x8 handwritten digits as shipped with scikit-learn (first 1792 of 1797, a
  multiple of the batch size 64), pixel values 0..16:
  x.npy u8[1792,1,8,8], labels.npy i32[1792].
"""
import os
import numpy as np

here = os.path.dirname(os.path.abspath(__file__))

def save(d, name, a):
    os.makedirs(os.path.join(here, d), exist_ok=True)
    np.save(os.path.join(here, d, name), a)

rng = np.random.default_rng(7)
n = 200
t = np.sqrt(rng.uniform(0.0, 1.0, n)) * 3.0 * np.pi  # angle, denser towards the centre
xs, labels = [], []
for k in range(2):
    a = t + k * np.pi
    r = t / (3.0 * np.pi)
    pts = np.stack([r * np.cos(a), r * np.sin(a)], axis=1) + rng.normal(0.0, 0.02, (n, 2))
    xs.append(pts)
    labels.append(np.full(n, k))
x = np.concatenate(xs).astype(np.float32)
y = np.concatenate(labels).astype(np.int32)
perm = rng.permutation(len(x))
save("spirals", "x.npy", x[perm])
save("spirals", "labels.npy", y[perm])

from sklearn.datasets import load_digits
d = load_digits()
save("digits", "x.npy", d.images[:1792].astype(np.uint8).reshape(1792, 1, 8, 8))
save("digits", "labels.npy", d.target[:1792].astype(np.int32))

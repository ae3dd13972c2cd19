"""Regenerates the fixtures of tests/fake_quant.rs: TensorFlow's
fake_quant_with_min_max_vars computed here with numpy in float32, independently of tcc.

For each case i: case_<i>_x.npy (inputs), case_<i>_y.npy (outputs), case_<i>_codes.npy (the
integer code of each output, qmin..qmax), and cases.txt with one line per case: i min max bits narrow.
Run: target/torch-venv/bin/python tests/data/fake_quant/make.py
"""
import os
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
f32 = np.float32


def nudge(lo, hi, bits, narrow):
    qmin = f32(1 if narrow else 0)
    qmax = f32(2 ** bits - 1)
    scale = f32(f32(hi - lo) / (qmax - qmin))
    zero_from_min = f32(qmin - f32(lo / scale))
    if zero_from_min < qmin:
        zero = qmin
    elif zero_from_min > qmax:
        zero = qmax
    else:
        # std::round: half away from zero (zero_from_min >= 0 here).
        t = np.floor(zero_from_min)
        zero = f32(t + 1 if zero_from_min - t >= 0.5 else t)
    return f32((qmin - zero) * scale), f32((qmax - zero) * scale), scale


def fake_quant(x, lo, hi, bits, narrow):
    nmin, nmax, scale = nudge(f32(lo), f32(hi), bits, narrow)
    inv = f32(f32(1) / scale)
    clamped = np.minimum(np.maximum(x, nmin), nmax).astype(f32)
    shifted = (clamped - nmin).astype(f32)
    level = np.floor((shifted * inv).astype(f32) + f32(0.5)).astype(f32)
    y = ((level * scale).astype(f32) + nmin).astype(f32)
    # The integer code: the level counted from the lowest code (1 when narrow).
    return y, level.astype(np.int64) + (1 if narrow else 0)


def main():
    rng = np.random.default_rng(0)
    cases = [
        (-0.1, 127.4, 8, False),   # TF's: [0, 127.5] in steps of 0.5
        (0.1, 127.1, 8, True),     # TF's narrow: [0, 127]
        (-128.0, -0.5, 8, False),  # TF's: [-127.5, 0]
        (-6.0, 6.0, 8, False),
        (-1.0, 1.0, 4, True),
        (-0.3, 2.7, 2, False),
        (-10.0, 3.0, 16, False),
        (0.5, 4.0, 8, False),      # a range above zero is moved down to include it
    ]
    lines = []
    for i, (lo, hi, bits, narrow) in enumerate(cases):
        span = hi - lo
        x = rng.uniform(lo - 0.3 * span, hi + 0.3 * span, size=257).astype(f32)
        y, codes = fake_quant(x, lo, hi, bits, narrow)
        np.save(os.path.join(HERE, "case_%d_x.npy" % i), x)
        np.save(os.path.join(HERE, "case_%d_y.npy" % i), y)
        np.save(os.path.join(HERE, "case_%d_codes.npy" % i), codes)
        lines.append("%d %r %r %d %d" % (i, float(f32(lo)), float(f32(hi)), bits, int(narrow)))
    with open(os.path.join(HERE, "cases.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

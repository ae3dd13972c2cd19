"""int8 benchmark (`benches/run.sh int8`): resnet18 and mobilenet_v2 at batch 1 and 8
(torchvision, random weights, batch norm folded; exported by benches/onnx_peer.py), float
against int8 in tcc and in onnxruntime, with the same threads, in the same run.

    python benches/int8.py TCC DIR THREADS RUNS [avx2|vnni]

With `avx2` tcc runs with `--target host,-avx512f,-avxvnni` (standing in for a CPU with AVX2
but no VNNI) and its own quantization uses `--reduce-range` (7-bit weights, which that path multiplies
on `vpmaddubsw`); with `vnni`, `--target host,-amx` (AVX-512 VNNI without AMX, on a CPU that
has AMX). onnxruntime still runs on every feature the CPU has.

For each model:
- onnxruntime's int8 model: `quantize_static` in QDQ form (per-channel s8 weights, u8
  activations), calibrated on 8 inputs drawn from a standard normal;
- tcc's own: `tcc quantize --per-channel` calibrated on a directory of such inputs (256 at
  batch 1, 16 at batch 8), which also reports each layer's error and how often the int8 model's
  top-1 agrees with the float one's over those inputs;
- latency medians over RUNS runs after 5 warm-ups: tcc float, tcc int8 (its own quantization),
  tcc int8 (onnxruntime's QDQ model), onnxruntime float, onnxruntime int8, and the ratios the
  issue's targets are stated in;
- tcc's output on onnxruntime's QDQ model against onnxruntime's own int8 output on one input.

tcc is timed by `tcc bench` (its median line); onnxruntime in this process.
"""
import logging, os, re, subprocess, sys, time

import numpy as np

# onnxruntime's quantizer advises pre-processing on every call.
logging.getLogger().setLevel(logging.ERROR)


def ort_session(path, threads):
    import onnxruntime as ort

    o = ort.SessionOptions()
    o.intra_op_num_threads = threads
    o.inter_op_num_threads = 1
    return ort.InferenceSession(path, o, providers=["CPUExecutionProvider"])


def ort_median(path, x, threads, runs):
    s = ort_session(path, threads)
    for _ in range(5):
        s.run(None, {"input": x})
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        s.run(None, {"input": x})
        ts.append(time.perf_counter() - t)
    return float(np.median(ts))


# `tcc bench` and `tcc run`'s extra arguments (`--target`, for the avx2 mode).
TARGET = []


def tcc_median(tcc, path, threads, runs):
    out = subprocess.run([tcc, "bench", path, "--threads", str(threads), "--runs", str(runs)]
                         + TARGET, check=True, capture_output=True, text=True).stdout
    m = re.search(r"median ([0-9.]+) ms", out)
    if not m:
        raise SystemExit(f"no median in `tcc bench {path}`:\n{out}")
    return float(m.group(1)) / 1e3


def quantize_ort(src, dst, shape):
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)

    class Reader(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(0)
            self.it = iter([{"input": rng.standard_normal(shape).astype(np.float32)}
                            for _ in range(8)])

        def get_next(self):
            return next(self.it, None)

    quantize_static(src, dst, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)


MODELS = ["resnet18", "mobilenet_v2", "resnet18_b8", "mobilenet_v2_b8"]


def main():
    tcc, d, threads, runs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    avx2 = sys.argv[5:] == ["avx2"]
    if avx2:
        TARGET.extend(["--target", "host,-avx512f,-avxvnni"])
    if sys.argv[5:] == ["vnni"]:
        TARGET.extend(["--target", "host,-amx"])
    # The float models, exported as the ONNX benchmark exports them (those missing only).
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import onnx_peer

    onnx_peer.MODELS = MODELS
    onnx_peer.export(d)
    out = os.path.join(d, "int8")
    os.makedirs(out, exist_ok=True)
    print(f"{'model':<18}{'tcc f32':>9}{'tcc int8':>10}{'tcc QDQ':>9}{'ort f32':>9}"
          f"{'ort int8':>10}  int8 vs f32 (tcc)  tcc int8 / ort int8")
    notes = []
    for name in MODELS:
        src = os.path.join(d, name + ".onnx")
        x = np.load(os.path.join(d, name + "_input.npy"))
        shape = x.shape
        qdq = os.path.join(out, name + "_qdq.onnx")
        if not os.path.exists(qdq):
            quantize_ort(src, qdq, shape)
        calib = os.path.join(out, name + "_calib")
        count = 256 if shape[0] == 1 else 16
        if not os.path.isdir(calib):
            os.makedirs(calib)
            rng = np.random.default_rng(1)
            for i in range(count):
                np.save(os.path.join(calib, f"x{i:03d}.npy"),
                        rng.standard_normal(shape).astype(np.float32))
        own = os.path.join(out, name + ("_tcc_int8_r7.tir" if avx2 else "_tcc_int8.tir"))
        q = subprocess.run([tcc, "quantize", src, "--calib", calib, "--per-channel", "-o", own]
                           + (["--reduce-range"] if avx2 else []),
                           check=True, capture_output=True, text=True).stderr
        summary = [l.strip() for l in q.splitlines()
                   if "layers on integer ops" in l or l.strip().startswith(("output", "top-1"))]
        t = {
            "tcc f32": tcc_median(tcc, src, threads, runs),
            "tcc int8": tcc_median(tcc, own, threads, runs),
            "tcc QDQ": tcc_median(tcc, qdq, threads, runs),
            "ort f32": ort_median(src, x, threads, runs),
            "ort int8": ort_median(qdq, x, threads, runs),
        }
        print(f"{name:<18}" + "".join(f"{1e3 * v:>{len(k) + 2}.2f}" for k, v in t.items())
              + f"  {t['tcc f32'] / t['tcc int8']:>15.2f}x  {t['tcc int8'] / t['ort int8']:>17.2f}x")
        # tcc on onnxruntime's QDQ model against onnxruntime's int8 output.
        res = os.path.join(out, name + "_tcc_on_qdq")
        xin = os.path.join(out, name + "_x.npy")
        np.save(xin, x)
        subprocess.run([tcc, "run", qdq, "--input", f"input={xin}", "--output", res] + TARGET,
                       check=True, capture_output=True)
        got = np.load(os.path.join(res, "logits.npy"))
        want = ort_session(qdq, threads).run(None, {"input": x})[0]
        notes.append(f"{name}: tcc quantize: {'; '.join(summary)}; tcc on onnxruntime's QDQ "
                     f"model: max |tcc - onnxruntime int8| {np.abs(got - want).max():.3g} "
                     f"(logits up to {np.abs(want).max():.3g})")
    print("times in ms, medians; tcc int8 is `tcc quantize`'s model, tcc QDQ onnxruntime's"
          + ("; tcc with --target host,-avx512f,-avxvnni and its own model --reduce-range, onnxruntime "
             "on every feature of the CPU" if avx2 else ""))
    for n in notes:
        print(n)


if __name__ == "__main__":
    main()

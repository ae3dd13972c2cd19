"""The Python package against the driver it wraps: numpy round trips, errors as exceptions,
threads, and results equal to `tcc run`'s, `tcc opt`'s and `tcc train`'s.

Run by python/test.sh (the README's test command), which builds the wheel and the `tcc`
binary (TCC_BIN) first."""

import os
import re
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest

import tcc

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
TORCH = ROOT / "tests" / "data" / "torch"


@pytest.fixture(scope="session")
def tcc_bin() -> str:
    path = os.environ.get("TCC_BIN") or str(ROOT / "target" / "release" / "tcc")
    assert os.access(path, os.X_OK), f"no tcc binary at {path}: build it (python/test.sh does)"
    return path


def cli(tcc_bin, *args) -> str:
    r = subprocess.run([tcc_bin, *map(str, args)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


def bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).tobytes()


# Every dtype, with values at its edges (NaN with a payload, -0.0, infinities, extremes).
EDGES = {
    "f32": np.array([0.0, -0.0, 1.5, -np.inf, np.inf, 3.4e38, 1e-45], np.float32),
    "f64": np.array([0.0, -0.0, -2.5, np.inf, -np.inf, 1.7e308, 5e-324], np.float64),
    "i8": np.array([-128, -1, 0, 1, 127, 5, -7], np.int8),
    "u8": np.array([0, 1, 127, 128, 255, 9, 200], np.uint8),
    "i32": np.array([-(2**31), -1, 0, 1, 2**31 - 1, 12345, -9], np.int32),
    "i64": np.array([-(2**63), -1, 0, 1, 2**63 - 1, 2**40, -3], np.int64),
    "bool": np.array([True, False, True, True, False, False, True]),
}


@pytest.mark.parametrize("dtype", sorted(EDGES))
def test_every_dtype_round_trips(dtype):
    x = EDGES[dtype]
    if dtype in ("f32", "f64"):
        # A NaN with a payload (the quiet bit and one more) survives too.
        nan = np.array([0x7FC00001], np.uint32).view(np.float32)[0] if dtype == "f32" else (
            np.array([0x7FF8000000000001], np.uint64).view(np.float64)[0])
        x = np.append(x, nan)
    n = x.size
    # Returned as given, and through a kernel (a reshape and a transpose, back and forth).
    text = f"""func @id(%x: {dtype}[{n}]) -> ({dtype}[{n}], {dtype}[{n}]) {{
  %m = reshape %x {{shape=[1,{n}]}} : {dtype}[1,{n}]
  %t = transpose %m {{perm=[1,0]}} : {dtype}[{n},1]
  %y = reshape %t {{shape=[{n}]}} : {dtype}[{n}]
  return %x, %y
}}"""
    p = tcc.compile(text, passes="")
    assert [s.dtype for s in p.inputs] == [x.dtype]
    a, b = p.run(x)
    for out in (a, b):
        assert out.dtype == x.dtype and out.shape == x.shape
        assert bits(out) == bits(x), (dtype, out, x)
    # The results are new, writable arrays, not views of the input.
    a[0] = x[1]
    assert bits(x) != bits(a) or x[0] == x[1]


def test_inputs_by_position_name_and_stored(tmp_path):
    text = """func @axpy(%a: f32[], %x: f32[3], %y: f32[3]) -> (f32[3]) {
  %ax = mul %a, %x : f32[3]
  %r = add %ax, %y : f32[3]
  return %r
}"""
    p = tcc.compile(text)
    x, y = np.array([1, 2, 3], np.float32), np.array([10, 20, 30], np.float32)
    want = np.float32(2) * x + y
    (r1,) = p.run(np.float32(2), x, y)
    (r2,) = p.run(y=y, x=x, a=2.0)
    (r3,) = p.run(2.0, x, y=[10.0, 20.0, 30.0])
    for r in (r1, r2, r3):
        assert bits(r) == bits(want)
    assert [s.name for s in p.inputs] == ["a", "x", "y"]
    assert p.outputs == [tcc.TensorSpec("r", np.dtype(np.float32), (3,))]


def test_the_native_module_checks_what_it_is_given():
    # The public API converts first; the extension still refuses what is not an array of the
    # parameter's type, instead of reading it.
    p = tcc.compile("func @f(%x: f32[4]) -> (f32[4]) {\n  %y = neg %x : f32[4]\n  return %y\n}")
    out = np.empty(4, np.float32)
    for bad in ([1.0, 2.0, 3.0, 4.0], np.zeros(4), np.zeros(5, np.float32),
                np.zeros(8, np.float32)[::2], "four"):
        with pytest.raises(tcc.InputError, match="input `x`: not a"):
            p._native.run([bad], [out])
    read_only = np.empty(4, np.float32)
    read_only.flags.writeable = False
    with pytest.raises(RuntimeError, match="not a writable"):
        p._native.run([np.zeros(4, np.float32)], [read_only])


def test_non_contiguous_and_byte_swapped_inputs_are_copied_first():
    text = """func @f(%x: f32[2,3]) -> (f32[2,3]) {
  %y = neg %x : f32[2,3]
  return %y
}"""
    p = tcc.compile(text)
    base = np.arange(12, dtype=np.float32).reshape(4, 3)
    strided = base[::2]  # every other row: not contiguous
    assert not strided.flags.c_contiguous
    (y,) = p.run(strided)
    assert bits(y) == bits(-strided)
    swapped = np.ascontiguousarray(strided).astype(">f4")
    (y2,) = p.run(swapped)
    assert bits(y2) == bits(-strided)


def test_wrong_inputs_raise_input_error():
    text = """func @f(%x: f32[2,3], %n: i32[]) -> (f32[2,3]) {
  %c = cast %n {to=f32} : f32[]
  %y = mul %x, %c : f32[2,3]
  return %y
}"""
    p = tcc.compile(text)
    x = np.zeros((2, 3), np.float32)
    cases = [
        ((np.zeros((3, 2), np.float32), 1), {}, r"input `x`: expected shape \(2, 3\)"),
        ((np.zeros((2, 3), np.float64), 1), {}, r"input `x`: expected float32 .* got float64"),
        ((x, 1.5), {}, r"input `n`: expected int32"),
        ((x,), {}, r"no value for parameter `n`"),
        ((x, 1, 2), {}, r"takes 2 input\(s\), got 3"),
        ((x,), {"m": 1}, r"no parameter `m`; its parameters are x, n"),
        ((x, 1), {"x": x}, r"`x` given twice"),
        ((["a", "b"], 1), {}, r"input `x`: expected float32"),
        ((np.array([object(), None]), 1), {}, r"input `x`: expected float32"),
        ((x, np.int64(2**40)), {}, r"input `n`: a value does not fit int32"),
        ((x, 2**31), {}, r"input `n`: a value does not fit int32"),
    ]
    for args, kwargs, message in cases:
        with pytest.raises(tcc.InputError, match=message):
            p.run(*args, **kwargs)
    # InputError is also a ValueError, and every error a tcc.Error.
    with pytest.raises(ValueError):
        p.run(x)
    assert issubclass(tcc.InputError, tcc.Error)


def test_parse_verify_and_usage_errors_name_the_place():
    with pytest.raises(tcc.ParseError, match=r"<text>:2:8: error: unknown op `relux`"):
        tcc.compile("func @f(%x: f32[4]) -> (f32[4]) {\n  %y = relux %x : f32[4]\n  return %y\n}")
    bad_matmul = """func @f(%a: f32[2,3], %b: f32[4,5]) -> (f32[2,5]) {
  %c = matmul %a, %b : f32[2,5]
  return %c
}"""
    with pytest.raises(tcc.VerifyError, match=r"<text>:2:\d+: .*matmul"):
        tcc.compile(bad_matmul)
    ok = "func @f(%x: f32[4]) -> (f32[4]) {\n  %y = relu %x : f32[4]\n  return %y\n}"
    with pytest.raises(tcc.UsageError, match="no-such-pass"):
        tcc.compile(ok, passes="no-such-pass")
    with pytest.raises(tcc.UsageError):
        tcc.cpu_features("host,-nonsense")
    with pytest.raises(tcc.UsageError, match="IR"):
        tcc.compile(ok, shapes={"x": (4,)})
    with pytest.raises(tcc.InputError, match="cannot read `/no/such/model.onnx`"):
        tcc.compile("/no/such/model.onnx")
    with pytest.raises(tcc.ParseError, match="garbage.onnx"):
        tcc.compile(__file__.replace("test_tcc.py", "") + "garbage.onnx")
    with pytest.raises(TypeError):
        tcc.compile(42)


@pytest.fixture(scope="session", autouse=True)
def garbage_onnx():
    path = Path(__file__).parent / "garbage.onnx"
    path.write_bytes(b"\x08\x07not a protobuf at all\xff\xff")
    yield
    path.unlink()


def digits_inputs(seed):
    """Random inputs for examples/digits_cnn.tir, by parameter name."""
    p = tcc.compile(EXAMPLES / "digits_cnn.tir")
    rng = np.random.default_rng(seed)
    out = {}
    for s in p.inputs:
        if s.dtype == np.uint8:
            out[s.name] = rng.integers(0, 17, s.shape, dtype=np.uint8)
        elif s.dtype == np.int32:
            out[s.name] = rng.integers(0, 10, s.shape, dtype=np.int32)
        else:
            out[s.name] = (rng.standard_normal(s.shape) * 0.3).astype(np.float32)
    return p, out


def test_results_equal_tcc_run_bit_for_bit(tcc_bin, tmp_path):
    for model, make in [
        (EXAMPLES / "digits_cnn.tir", lambda: digits_inputs(7)[1]),
        (TORCH / "cnn_bn" / "model.onnx", lambda: {
            f.stem: np.load(f) for f in (TORCH / "cnn_bn" / "inputs").iterdir()}),
    ]:
        inputs = make()
        flags = []
        for name, a in inputs.items():
            f = tmp_path / (re.sub(r"[^A-Za-z0-9_.-]", "_", name) + ".npy")
            np.save(f, a)
            flags += ["--input", f"{name}={f}"]
        out = tmp_path / (model.stem + "-out")
        cli(tcc_bin, "run", model, *flags, "--output", out)
        p = tcc.compile(model)
        results = p.run(**inputs)
        assert len(results) == len(p.outputs) >= 1
        for spec, r in zip(p.outputs, results):
            want = np.load(out / (re.sub(r"[^A-Za-z0-9_.-]", "_", spec.name) + ".npy"))
            assert want.dtype == r.dtype and want.shape == r.shape
            assert bits(r) == bits(want), (model, spec.name, r, want)


def test_a_model_given_as_bytes():
    # A serialized ONNX model (as `onnx_model.SerializeToString()` gives) and IR text as bytes
    # compile to the same program as their files.
    model = TORCH / "cnn_bn" / "model.onnx"
    inputs = {f.stem: np.load(f) for f in (TORCH / "cnn_bn" / "inputs").iterdir()}
    from_file = tcc.compile(model).run(**inputs)
    from_bytes = tcc.compile(model.read_bytes()).run(**inputs)
    assert [bits(a) for a in from_bytes] == [bits(a) for a in from_file]
    grads = tcc.grad(bytearray(model.read_bytes())).run(**inputs)
    assert len(grads) == len(tcc.grad(model).outputs)
    text = (EXAMPLES / "mlp.tir").read_bytes()
    assert tcc.opt(text, "canonicalize,cse,dce") == tcc.opt(EXAMPLES / "mlp.tir", "canonicalize,cse,dce")
    with pytest.raises(tcc.ParseError, match="<bytes>"):
        tcc.compile(b"\x08\x07not a protobuf\xff\xff")


def test_four_threads_at_once_give_identical_results():
    p, inputs = digits_inputs(3)
    (want_loss, want_acc) = p.run(**inputs)
    barrier = threading.Barrier(4)
    results, errors = [None] * 4, []

    def work(t):
        try:
            barrier.wait()
            results[t] = [p.run(**inputs) for _ in range(20)]
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for runs in results:
        assert len(runs) == 20
        for loss, acc in runs:
            assert bits(loss) == bits(want_loss) and bits(acc) == bits(want_acc)


def test_grad_matches_torch_autograd():
    model = TORCH / "cnn_bn" / "model.onnx"
    inputs = {f.stem: np.load(f) for f in (TORCH / "cnn_bn" / "inputs").iterdir()}
    p = tcc.grad(model)
    names = [s.name for s in p.outputs]
    results = dict(zip(names, p.run(**inputs)))
    grads = sorted((TORCH / "cnn_bn" / "grads").iterdir())
    assert grads
    largest = max(np.abs(np.load(g)).max() for g in grads)
    for g in grads:
        want = np.load(g)
        got = results[f"grad/{g.stem}"]
        assert got.shape == want.shape
        assert np.abs(got - want).max() <= 1e-3 * largest, g.stem


def test_grad_of_a_square():
    text = """func @f(%x: f32[5]) -> (f32[]) {
  %sq = mul %x, %x : f32[5]
  %s = reduce_sum %sq {axes=[0]} : f32[]
  return %s
}"""
    p = tcc.grad(text, wrt="x")
    x = np.array([1.0, -2.0, 0.5, 3.0, 0.0], np.float32)
    s, dx = p.run(x)
    assert s == np.float32((x * x).sum())
    assert bits(dx) == bits(2 * x)
    with pytest.raises(tcc.InputError, match="nope"):
        tcc.grad(text, wrt="nope")


def test_opt_returns_what_tcc_opt_prints(tcc_bin):
    passes = "canonicalize,cse,dce"
    text = tcc.opt(EXAMPLES / "mlp.tir", passes)
    assert text == cli(tcc_bin, "opt", f"--passes={passes}", EXAMPLES / "mlp.tir")
    assert "func @mlp" in text
    # Text in, text out: the optimized text optimizes to itself.
    assert tcc.opt(text, passes) == text


def test_train_returns_the_losses_tcc_train_prints(tcc_bin):
    data = {f.stem: np.load(f) for f in (EXAMPLES / "data" / "spirals").iterdir()}
    trained = tcc.train(EXAMPLES / "spirals_mlp.tir", data, steps=60)
    assert len(trained.losses) == 60
    assert trained.losses[-1] < 0.5 * trained.losses[0]
    assert sorted(trained.params) == ["fc1/b", "fc1/w", "fc2/b", "fc2/w", "fc3/b", "fc3/w"]
    assert trained.params["fc1/w"].shape == (2, 64) and trained.params["fc1/w"].flags.writeable
    log = cli(tcc_bin, "train", EXAMPLES / "spirals_mlp.tir", "--data",
              EXAMPLES / "data" / "spirals", "--steps", 60, "--every", 1)
    printed = [float(x) for x in re.findall(r"step +\d+/60  loss ([-\d.e]+)", log)]
    assert len(printed) == 60
    assert np.allclose(trained.losses, printed, rtol=0, atol=5e-7)
    # The trained values are the model's: they reach the loss of the last step.
    p = tcc.compile(EXAMPLES / "spirals_mlp.tir")
    loss, _ = p.run(**data, **trained.params)
    assert loss < trained.losses[-1]
    with pytest.raises(tcc.UsageError, match="unknown optimizer"):
        tcc.train(EXAMPLES / "spirals_mlp.tir", data, steps=1, optimizer="lion")
    with pytest.raises(tcc.InputError, match="no parameter `z`"):
        tcc.train(EXAMPLES / "spirals_mlp.tir", {**data, "z": np.zeros(2)}, steps=1)
    with pytest.raises(tcc.InputError, match="data `x` holds f32\\[3,2\\]"):
        tcc.train(EXAMPLES / "spirals_mlp.tir", {**data, "x": np.zeros((3, 2), np.float32)}, steps=1)


def test_program_describes_itself():
    p = tcc.compile(EXAMPLES / "mlp.tir")
    assert p.name == "mlp"
    assert "tcc.Program @mlp(" in repr(p)
    assert all(isinstance(s.dtype, np.dtype) for s in p.inputs + p.outputs)
    assert "AVX2" in tcc.cpu_features() or "AVX2" not in tcc.cpu_features("host")
    assert "AVX-512F" not in tcc.cpu_features("host,-avx512f")
    assert isinstance(tcc.__version__, str)


def test_a_thread_count_per_program():
    _, inputs = digits_inputs(5)
    want = tcc.compile(EXAMPLES / "digits_cnn.tir").run(**inputs)
    for n in (1, 2, 3):
        got = tcc.compile(EXAMPLES / "digits_cnn.tir", threads=n).run(**inputs)
        assert [bits(g) for g in got] == [bits(w) for w in want], n
    for bad in (0, -1, 1.5, True):
        with pytest.raises(tcc.UsageError, match="threads"):
            tcc.compile(EXAMPLES / "mlp.tir", threads=bad)

"""tcc, a tensor compiler, from Python.

Compile an IR file, IR text or an ONNX model once, then run it on numpy arrays as often as
you like, from any thread::

    import numpy as np, tcc

    model = tcc.compile("resnet18.onnx")            # or IR text, or a .tir file
    (logits,) = model.run(np.zeros((1, 3, 224, 224), np.float32))

The same compiler as the ``tcc`` command underneath: ``compile`` optimizes with ``tcc run``'s
inference pipeline and gives the same results as ``tcc run`` on the same file, bit for bit.
``grad`` differentiates (``tcc grad``), ``opt`` runs passes and returns the IR text
(``tcc opt``), ``train`` loops a train step (``tcc train``). Errors are exceptions derived
from :class:`tcc.Error`: :class:`ParseError` and :class:`VerifyError` name the place
(``file:line:col``), :class:`InputError` a wrong array or model, :class:`UsageError` a bad
option.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from . import _native
from ._errors import Error, InputError, ParseError, UsageError, VerifyError

__version__: str = _native.__version__

__all__ = [
    "Error",
    "InputError",
    "ParseError",
    "Program",
    "TensorSpec",
    "Trained",
    "UsageError",
    "VerifyError",
    "compile",
    "cpu_features",
    "grad",
    "opt",
    "train",
]

PathOrText = Union[str, "os.PathLike[str]", bytes]

# tcc's dtypes and numpy's.
_DTYPES: Dict[str, np.dtype] = {
    "f32": np.dtype(np.float32),
    "f64": np.dtype(np.float64),
    "i8": np.dtype(np.int8),
    "u8": np.dtype(np.uint8),
    "i32": np.dtype(np.int32),
    "i64": np.dtype(np.int64),
    "bool": np.dtype(np.bool_),
}
_NAMES: Dict[np.dtype, str] = {d: n for n, d in _DTYPES.items()}


class TensorSpec(NamedTuple):
    """A parameter or result of a program: its name, numpy dtype and shape."""

    name: str
    dtype: np.dtype
    shape: Tuple[int, ...]

    def __str__(self) -> str:
        dims = ",".join(str(d) for d in self.shape)
        return f"%{self.name}: {_NAMES[self.dtype]}[{dims}]"


def _source(path_or_text: PathOrText) -> Tuple[Optional[str], Union[None, str, bytes]]:
    """(path, None) or (None, text): a path-like object or a string without newlines and
    braces is a path (an IR file or ONNX model); any other string is IR text; bytes are a
    file's contents (a serialized ONNX model, as `model.SerializeToString()` gives)."""
    if isinstance(path_or_text, os.PathLike):
        return os.fspath(path_or_text), None
    if isinstance(path_or_text, (bytes, bytearray, memoryview)):
        return None, bytes(path_or_text)
    if isinstance(path_or_text, str):
        if "\n" in path_or_text or "{" in path_or_text:
            return None, path_or_text
        return path_or_text, None
    raise TypeError(
        f"expected a path, IR text or a model's bytes, got {type(path_or_text).__name__}"
    )


def _shapes(shapes: Optional[Mapping[str, Sequence[int]]]) -> List[Tuple[str, List[int]]]:
    if shapes is None:
        return []
    out = []
    for name, dims in shapes.items():
        try:
            dims = [int(d) for d in dims]
        except (TypeError, ValueError):
            raise UsageError(f"shapes[{name!r}]: expected a sequence of ints, got {dims!r}") from None
        if any(d < 0 for d in dims):
            raise UsageError(f"shapes[{name!r}]: negative dimension in {dims}")
        out.append((name.lstrip("%"), dims))
    return out


def _target(target: Optional[str]) -> Optional[str]:
    return None if target in (None, "host") else target


def _threads(threads: Optional[int]) -> Optional[int]:
    if threads is None:
        return None
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise UsageError(f"threads: expected a positive int, got {threads!r}")
    return threads


def _settings(
    shapes: Optional[Mapping[str, Sequence[int]]],
    passes: Optional[str],
    target: str,
    func: Optional[str],
    threads: Optional[int],
) -> tuple:
    """How to load and compile, as the native module takes it."""
    return (_shapes(shapes), passes, _target(target), func, _threads(threads))


def _names(x: Union[None, str, Sequence[str]]) -> List[str]:
    if x is None:
        return []
    if isinstance(x, str):
        return [x]
    return list(x)


def _input(spec: TensorSpec, a: Any) -> np.ndarray:
    """`a` as a C-contiguous, aligned, native-endian array of `spec`'s dtype and shape:
    itself where it already is one (no copy)."""
    if isinstance(a, np.ndarray):
        if a.dtype != spec.dtype:
            same = a.dtype.newbyteorder("=") == spec.dtype
            if not same:
                raise InputError(
                    f"input `{spec.name}`: expected {spec.dtype} ({spec}), got {a.dtype}; "
                    f"convert it with .astype(np.{spec.dtype})"
                )
            a = a.astype(spec.dtype)
    else:
        a = np.asarray(a)
        if a.dtype != spec.dtype:
            if not np.can_cast(a.dtype, spec.dtype, casting="same_kind"):
                raise InputError(
                    f"input `{spec.name}`: expected {spec.dtype} ({spec}), got "
                    f"{type(a).__name__} of {a.dtype}"
                )
            converted = a.astype(spec.dtype)
            if spec.dtype.kind in "iu" and not np.array_equal(converted, a):
                raise InputError(
                    f"input `{spec.name}`: a value does not fit {spec.dtype} ({spec})"
                )
            a = converted
    if a.shape != spec.shape:
        raise InputError(f"input `{spec.name}`: expected shape {spec.shape} ({spec}), got {a.shape}")
    if not (a.flags.c_contiguous and a.flags.aligned):
        a = np.require(a, requirements="CA")
    return a


class Program:
    """A compiled function, ready to run on numpy arrays.

    Thread-safe: share one between threads; runs release the interpreter lock, so several
    run at once. Made by :func:`compile` or :func:`grad`.
    """

    __slots__ = ("_native", "inputs", "outputs", "_stored", "_index")

    inputs: List[TensorSpec]
    """The parameters, in order."""
    outputs: List[TensorSpec]
    """The results, in order."""

    def __init__(self, native: Any) -> None:
        self._native = native
        ins = native.inputs
        self.inputs = [TensorSpec(n, _DTYPES[d], tuple(s)) for n, d, s, _ in ins]
        self._stored = [stored for *_, stored in ins]
        self.outputs = [TensorSpec(n, _DTYPES[d], tuple(s)) for n, d, s in native.outputs]
        self._index = {spec.name: i for i, spec in enumerate(self.inputs)}

    @property
    def name(self) -> str:
        """The function's name (without the ``@``)."""
        return self._native.name

    def run(self, *arrays: Any, **named: Any) -> List[np.ndarray]:
        """Runs on one array per parameter, in order or by name, and returns the results as
        new numpy arrays.

        A parameter the model stores a value for (an ONNX model's weights made parameters, an
        IR file's ``weights`` directory) may be left out. Arrays must have the parameter's
        dtype and shape (Python scalars and lists are converted); C-contiguous aligned arrays
        are read in place, others copied first. Raises :class:`InputError` otherwise.
        """
        n = len(self.inputs)
        if len(arrays) > n:
            raise InputError(f"`@{self.name}` takes {n} input(s), got {len(arrays)}")
        given: List[Any] = list(arrays) + [None] * (n - len(arrays))
        for name, a in named.items():
            i = self._index.get(name.lstrip("%"))
            if i is None:
                names = ", ".join(s.name for s in self.inputs)
                raise InputError(f"`@{self.name}` has no parameter `{name}`; its parameters are {names}")
            if i < len(arrays):
                raise InputError(f"input `{name}` given twice, by position and by name")
            given[i] = a
        for i, (spec, a, stored) in enumerate(zip(self.inputs, given, self._stored)):
            if a is None:
                if not stored:
                    raise InputError(f"no value for parameter `{spec.name}` ({spec})")
            elif not (
                type(a) is np.ndarray
                and a.dtype == spec.dtype
                and a.shape == spec.shape
                and a.flags.c_contiguous
                and a.flags.aligned
            ):
                given[i] = _input(spec, a)
        outs = [np.empty(s.shape, s.dtype) for s in self.outputs]
        self._native.run(given, outs)
        return outs

    __call__ = run

    def __repr__(self) -> str:
        ins = ", ".join(str(s) for s in self.inputs)
        outs = ", ".join(str(s) for s in self.outputs)
        return f"<tcc.Program @{self.name}({ins}) -> ({outs})>"


def compile(
    path_or_text: PathOrText,
    *,
    shapes: Optional[Mapping[str, Sequence[int]]] = None,
    passes: Optional[str] = None,
    target: str = "host",
    func: Optional[str] = None,
    threads: Optional[int] = None,
) -> Program:
    """Compiles an IR file, an ONNX model or IR text.

    Args:
        path_or_text: a path (``.tir`` IR, ``.onnx`` model), IR text, or a model's bytes
            (``onnx_model.SerializeToString()``).
        shapes: for an ONNX model, the shapes of its inputs with dynamic dimensions, as
            ``{"input": (1, 3, 224, 224)}``.
        passes: the pass pipeline run first (default: the inference pipeline of ``tcc run``,
            ``qdq,canonicalize,fold-bn,cse,dce,eqsat``; ``""`` runs none).
        target: ``"host"``, or the host less some CPU features, as ``"host,-avx512f"``.
        func: the function to compile, where the file defines several.
        threads: the threads each run uses (default: one per core; onnxruntime's
            ``intra_op_num_threads``).
    """
    path, text = _source(path_or_text)
    return Program(_native.compile(path, text, _settings(shapes, passes, target, func, threads)))


def grad(
    path_or_text: PathOrText,
    wrt: Union[None, str, Sequence[str]] = None,
    *,
    ys: Union[None, str, Sequence[str]] = None,
    stop: Union[None, str, Sequence[str]] = None,
    shapes: Optional[Mapping[str, Sequence[int]]] = None,
    passes: Optional[str] = None,
    target: str = "host",
    func: Optional[str] = None,
    threads: Optional[int] = None,
) -> Program:
    """Differentiates a function and compiles the result: its results are the function's,
    then the gradient of ``ys`` with respect to each value of ``wrt`` (as ``tcc grad``).

    Args:
        wrt: value names or scopes (``"fc/"``); default: every floating-point parameter (for
            an ONNX model, every floating-point initializer, made a parameter that keeps its
            value).
        ys: the values to differentiate (default: the single floating-point scalar result).
        stop: values treated as constants.
        shapes, passes, target, func, threads: as for :func:`compile`.
    """
    path, text = _source(path_or_text)
    settings = _settings(shapes, passes, target, func, threads)
    native = _native.grad(path, text, (_names(wrt), _names(ys), _names(stop)), settings)
    return Program(native)


def opt(path_or_text: PathOrText, passes: str) -> str:
    """Runs the pass pipeline ``passes`` (as ``"canonicalize,cse,dce"``) over an IR file or IR
    text and returns the result as IR text, as ``tcc opt`` prints it."""
    path, text = _source(path_or_text)
    return _native.opt(path, text, passes)


@dataclass
class Trained:
    """What :func:`train` returns."""

    losses: List[float]
    """The loss at each step."""
    params: Dict[str, np.ndarray]
    """The trained parameters (and state the function updates itself), by name."""


def _arrays(what: str, arrays: Optional[Mapping[str, Any]]) -> list:
    """(name, tcc dtype, shape, C-contiguous native array) for each array."""
    out = []
    for name, a in (arrays or {}).items():
        a = np.require(np.asarray(a), requirements="CA")
        native = a.dtype.newbyteorder("=")
        if native not in _NAMES:
            raise InputError(f"{what} `{name}`: tcc has no dtype for {a.dtype}")
        a = np.require(a.astype(native, copy=False), requirements="CA")
        out.append((name.lstrip("%"), _NAMES[native], list(a.shape), a))
    return out


def train(
    path_or_text: PathOrText,
    data: Mapping[str, Any],
    *,
    steps: int,
    optimizer: str = "adam",
    lr: float = 0.01,
    init: Optional[Mapping[str, Any]] = None,
    remat: Optional[str] = None,
    log_every: int = 0,
    shapes: Optional[Mapping[str, Sequence[int]]] = None,
    func: Optional[str] = None,
) -> Trained:
    """Trains the parameters of a loss function (its first result is the loss) with
    ``tcc train``'s loop: a train step built by ``grad`` and the optimizer, compiled once and
    run ``steps`` times.

    Args:
        data: arrays by parameter name; one of exactly the parameter's shape, or of a
            multiple of its rows, cut into mini-batches used in turn. The other
            floating-point parameters are trained.
        optimizer: ``"sgd"``, ``"momentum"`` or ``"adam"``; ``lr`` its learning rate.
        init: initial values of trained parameters by name (default: the model's stored
            values, else ``tcc train``'s initialisation).
        remat: options of a gradient-checkpointing ``remat`` pass on the step, as
            ``"budget=50%"``.
        log_every: print ``tcc train``'s log line every this many steps (0: silent).
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise UsageError(f"steps: expected a positive int, got {steps!r}")
    path, text = _source(path_or_text)
    losses, values = _native.train(
        path,
        text,
        (_arrays("data", data), _arrays("init", init)),
        (steps, optimizer, float(lr), remat, int(log_every)),
        _settings(shapes, None, "host", func, None),
    )
    params = {
        name: np.frombuffer(b, dtype=_DTYPES[d]).reshape(shape).copy()
        for name, d, shape, b in values
    }
    return Trained(losses=list(losses), params=params)


def cpu_features(target: str = "host") -> List[str]:
    """The CPU features tcc's kernels use for ``target`` (as ``["AVX2", "FMA", "AVX-512F"]``)."""
    return list(_native.cpu_features(_target(target)))

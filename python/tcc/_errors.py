"""The exceptions tcc raises. Every one derives from :class:`tcc.Error`."""


class Error(Exception):
    """Base class of tcc's errors."""


class ParseError(Error):
    """The IR text or ONNX model cannot be read. The message names the place
    (``file:line:col`` with the line and a caret, or the ONNX node)."""


class VerifyError(Error):
    """The IR parses but does not verify (a type or shape that does not fit an
    op); the message names the op with ``file:line:col``."""


class InputError(Error, ValueError):
    """An input does not fit: a missing array, a wrong dtype or shape, a value
    the model cannot run on, or a pass that cannot apply to the model."""


class UsageError(Error, ValueError):
    """An option does not make sense: an unknown pass or optimizer, a bad
    target spec, shapes given for IR."""

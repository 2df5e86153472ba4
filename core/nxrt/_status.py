"""ONNX Runtime's exception classes, one per status code, as its Python API names them.

Code written for onnxruntime catches these (``except Fail``, ``except
InvalidArgument``...). Each of nxrt's own errors derives from the classes that
name the status onnxruntime reports for the same failure (see
:mod:`nxrt.errors`), so such code catches what nxrt raises. This module imports
nothing from nxrt: :mod:`nxrt.errors` builds on it.
"""

from __future__ import annotations


class Fail(Exception):
    """Status FAIL: the generic failure (an invalid model, a failed kernel, a missing library)."""


class InvalidArgument(Exception):
    """Status INVALID_ARGUMENT: a feed, name, option or value the call cannot use."""


class NoSuchFile(Exception):
    """Status NO_SUCHFILE: the model file does not exist."""


class NoModel(Exception):
    """Status NO_MODEL: no model was loaded."""


class EngineError(Exception):
    """Status ENGINE_ERROR."""


class RuntimeException(Exception):
    """Status RUNTIME_EXCEPTION: a kernel or an execution provider raised while running."""


class InvalidProtobuf(Exception):
    """Status INVALID_PROTOBUF: the bytes are not an ONNX model."""


class ModelLoaded(Exception):
    """Status MODEL_LOADED."""


class NotImplemented(Exception):
    """Status NOT_IMPLEMENTED: no kernel implements a node."""


class InvalidGraph(Exception):
    """Status INVALID_GRAPH: the graph is malformed."""


class EPFail(Exception):
    """Status EP_FAIL: an execution provider reported its own failure."""


class ModelLoadCanceled(Exception):
    """Status MODEL_LOAD_CANCELED."""


class ModelRequiresCompilation(Exception):
    """Status MODEL_REQUIRES_COMPILATION: only precompiled partitions were allowed."""


class NotFound(Exception):
    """Status NOT_FOUND."""


class DeviceReset(Exception):
    """Status DEVICE_RESET."""


__all__ = [
    "DeviceReset",
    "EPFail",
    "EngineError",
    "Fail",
    "InvalidArgument",
    "InvalidGraph",
    "InvalidProtobuf",
    "ModelLoadCanceled",
    "ModelLoaded",
    "ModelRequiresCompilation",
    "NoModel",
    "NoSuchFile",
    "NotFound",
    "NotImplemented",
    "RuntimeException",
]

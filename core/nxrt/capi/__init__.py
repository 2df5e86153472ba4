"""ONNX Runtime's ``capi`` package: where onnxruntime code imports its low-level names from.

``onnxruntime.capi.onnxruntime_pybind11_state`` (exception classes,
``OrtValue``, ``SessionOptions``...), ``onnxruntime.capi._pybind_state`` and
``onnxruntime.capi.onnxruntime_inference_collection``
have their counterparts here, so code doing ``import nxrt as onnxruntime``
finds them where it looks. The submodules load on first use.
"""

from __future__ import annotations

import importlib
from types import ModuleType

_SUBMODULES = (
    "onnxruntime_pybind11_state",
    "_pybind_state",
    "onnxruntime_inference_collection",
    "status",
)


def __getattr__(name: str) -> ModuleType:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["onnxruntime_pybind11_state"]

"""``onnxruntime.capi._pybind_state``: the same names as :mod:`.onnxruntime_pybind11_state`."""

from __future__ import annotations

from nxrt.capi.onnxruntime_pybind11_state import *  # noqa: F403 - the module's whole API
from nxrt.capi.onnxruntime_pybind11_state import __all__  # noqa: F401

"""``onnxruntime.capi.onnxruntime_inference_collection``: where onnxruntime defines its Python
classes, and where some code imports them from (``OrtValue``, ``IOBinding``...)."""

from __future__ import annotations

from nxrt.iobinding import IOBinding
from nxrt.ortvalue import OrtValue, copy_tensors
from nxrt.session import InferenceSession

#: onnxruntime's base class of ``InferenceSession``; nxrt has the one class.
Session = InferenceSession

__all__ = ["IOBinding", "InferenceSession", "OrtValue", "Session", "copy_tensors"]

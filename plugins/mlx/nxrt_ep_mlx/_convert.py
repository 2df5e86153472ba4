"""Arrays across the numpy/MLX boundary, and ONNX element types as MLX dtypes."""

from __future__ import annotations

from typing import Any

import numpy as np

from nxrt_ep_mlx._backend import mx
from nxrt_ep_mlx.ops._registry import BFLOAT16, BOOL, FLOAT, FLOAT16, INT32, INT64

_MX_NAMES = {
    FLOAT: "float32",
    FLOAT16: "float16",
    BFLOAT16: "bfloat16",
    BOOL: "bool_",
    INT32: "int32",
    INT64: "int64",
}


def mx_dtype(elem_type: int) -> Any:
    """The MLX dtype of an ONNX element type (float, bool and index types only)."""
    return getattr(mx, _MX_NAMES[elem_type])


def to_mx(value: Any) -> Any:
    """An ``mx.array`` holding ``value`` (a numpy array, scalar or ``mx.array``)."""
    if isinstance(value, mx.array):
        return value
    return mx.array(np.asarray(value))


def to_numpy(array: Any) -> np.ndarray:
    """A numpy view of an evaluated ``mx.array``; a copy only where MLX cannot share.

    bfloat16 has no PEP 3118 format, so it travels as uint16 and is viewed as
    ``ml_dtypes.bfloat16`` (numpy's spelling of ONNX bfloat16).
    """
    if array.dtype == mx.bfloat16:
        import ml_dtypes

        return np.array(array.view(mx.uint16), copy=False).view(ml_dtypes.bfloat16)
    return np.array(array, copy=False)

"""Ops that make tensors from attributes: Constant and ConstantOfShape."""

from __future__ import annotations

import math

import numpy as np

from nxrt.errors import KernelFailed
from nxrt.memory import check_elements
from nxrt_ep_cpu.ops._registry import op


@op("ConstantOfShape", since=(9, 20, 21, 23, 24, 25))
def constant_of_shape(shape: np.ndarray, /, *, value: np.ndarray | None = None) -> np.ndarray:
    """A tensor of ``shape`` filled with the one-element ``value`` (float32 0 by default)."""
    dims = tuple(int(d) for d in shape.reshape(-1))
    if any(d < 0 for d in dims):
        raise KernelFailed(f"ConstantOfShape: shape {list(dims)} has a negative dimension")
    check_elements(math.prod(dims), 4 if value is None else np.asarray(value).itemsize)
    if value is None:
        return np.zeros(dims, dtype=np.float32)
    value = np.asarray(value)
    if value.size != 1:
        raise KernelFailed(f"ConstantOfShape: value must hold one element, not {value.size}")
    return np.full(dims, value.reshape(()), dtype=value.dtype)


@op("Constant", since=(1, 9))
def constant_1(*, value: np.ndarray) -> np.ndarray:
    """The ``value`` tensor attribute (copied, so callers may not alter the model)."""
    return _tensor(value)


@op("Constant", since=11)
def constant_11(*, sparse_value=None, value: np.ndarray | None = None) -> np.ndarray:
    """The ``value`` tensor attribute; sparse tensors are refused (opset 11)."""
    return constant(sparse_value=sparse_value, value=value)


@op("Constant", since=(12, 13, 19, 21, 23, 24, 25))
def constant(
    *,
    sparse_value=None,
    value: np.ndarray | None = None,
    value_float: float | None = None,
    value_floats: list[float] | None = None,
    value_int: int | None = None,
    value_ints: list[int] | None = None,
    value_string: str | None = None,
    value_strings: list[str] | None = None,
) -> np.ndarray:
    """The one attribute that is set, as a tensor (opset 12 adds the scalar/list forms).

    Floats become float32, ints int64 and strings object arrays of ``str``,
    as ONNX Runtime returns them.
    """
    if sparse_value is not None:
        raise KernelFailed(
            "Constant: sparse_value is not supported by the cpu EP; store the tensor dense"
        )
    if value is not None:
        return _tensor(value)
    if value_float is not None:
        return np.array(value_float, dtype=np.float32)
    if value_floats is not None:
        return np.array(value_floats, dtype=np.float32)
    if value_int is not None:
        return np.array(value_int, dtype=np.int64)
    if value_ints is not None:
        return np.array(value_ints, dtype=np.int64)
    if value_string is not None:
        return np.array(_text(value_string), dtype=object)
    if value_strings is not None:
        return np.array([_text(s) for s in value_strings], dtype=object).reshape(-1)
    raise KernelFailed("Constant: exactly one value attribute must be set, none is")


def _tensor(value: np.ndarray) -> np.ndarray:
    """A copy of a tensor attribute; string tensors become object arrays of ``str``."""
    value = np.asarray(value)
    if value.dtype.kind in ("S", "U", "O"):
        flat = [_text(s) for s in value.reshape(-1).tolist()]
        return np.array(flat, dtype=object).reshape(value.shape)
    return np.array(value)


def _text(s: str | bytes) -> str:
    return s.decode() if isinstance(s, bytes) else s

"""Element-wise arithmetic and activations, with numpy (multidirectional) broadcasting.

Results keep the input dtype: attribute floats are Python floats, which
numpy casts to the array's dtype instead of promoting to float64.
"""

from __future__ import annotations

import numpy as np

from nxrt_ep_cpu.ops._registry import op

_FLOAT32_MAX = float(np.finfo(np.float32).max)


@op("Add", since=(7, 13, 14))
def add(a: np.ndarray, b: np.ndarray, /) -> np.ndarray:
    return np.asarray(np.add(a, b))


@op("Sub", since=(7, 13, 14))
def sub(a: np.ndarray, b: np.ndarray, /) -> np.ndarray:
    return np.asarray(np.subtract(a, b))


@op("Mul", since=(7, 13, 14))
def mul(a: np.ndarray, b: np.ndarray, /) -> np.ndarray:
    return np.asarray(np.multiply(a, b))


@op("Div", since=(7, 13, 14))
def div(a: np.ndarray, b: np.ndarray, /) -> np.ndarray:
    """True division for floats; integer division truncates toward zero, as in C."""
    if np.issubdtype(a.dtype, np.integer):
        # a - fmod(a, b) is an exact multiple of b, so floor division is exact.
        with np.errstate(divide="ignore"):
            return np.asarray(np.floor_divide(a - np.fmod(a, b), b))
    return np.asarray(np.divide(a, b))


@op("Sum", since=(6, 8, 13))
def sum_(*data: np.ndarray) -> np.ndarray:
    return _fold(np.add, data)


@op("Max", since=(6, 8, 12, 13))
def max_(*data: np.ndarray) -> np.ndarray:
    return _fold(np.maximum, data)


@op("Min", since=(6, 8, 12, 13))
def min_(*data: np.ndarray) -> np.ndarray:
    return _fold(np.minimum, data)


@op("Mean", since=(6, 8, 13))
def mean(*data: np.ndarray) -> np.ndarray:
    total = _fold(np.add, data)
    return np.asarray(np.divide(total, len(data))).astype(total.dtype, copy=False)


def _fold(ufunc: np.ufunc, data: tuple[np.ndarray, ...]) -> np.ndarray:
    """Apply a binary ufunc across all inputs; always a fresh array (one input is copied)."""
    if len(data) == 1:
        return data[0].copy()
    result = np.asarray(ufunc(data[0], data[1]))
    for array in data[2:]:
        if np.broadcast_shapes(result.shape, array.shape) == result.shape:
            ufunc(result, array, out=result)
        else:
            result = np.asarray(ufunc(result, array))
    return result


@op("Relu", since=(6, 13, 14))
def relu(x: np.ndarray, /) -> np.ndarray:
    return np.asarray(np.maximum(x, 0))


@op("LeakyRelu", since=(6, 16))
def leaky_relu(x: np.ndarray, /, *, alpha: float = float(np.float32(0.01))) -> np.ndarray:
    return np.where(x < 0, x * alpha, x).astype(x.dtype, copy=False)


@op("Sigmoid", since=(6, 13))
def sigmoid(x: np.ndarray, /) -> np.ndarray:
    """Logistic function, written so that ``exp`` never overflows."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


@op("Tanh", since=(6, 13))
def tanh(x: np.ndarray, /) -> np.ndarray:
    return np.asarray(np.tanh(x))


@op("Exp", since=(6, 13))
def exp(x: np.ndarray, /) -> np.ndarray:
    return np.asarray(np.exp(x))


@op("Log", since=(6, 13))
def log(x: np.ndarray, /) -> np.ndarray:
    return np.asarray(np.log(x))


@op("Sqrt", since=(6, 13))
def sqrt(x: np.ndarray, /) -> np.ndarray:
    return np.asarray(np.sqrt(x))


@op("Neg", since=(6, 13))
def neg(x: np.ndarray, /) -> np.ndarray:
    return np.asarray(np.negative(x))


@op("Abs", since=(6, 13))
def abs_(x: np.ndarray, /) -> np.ndarray:
    return np.asarray(np.abs(x))


@op("Pow", since=(7, 12, 13, 15))
def pow_(x: np.ndarray, y: np.ndarray, /) -> np.ndarray:
    """``x ** y`` in the dtype of ``x`` (opset 12 lets the exponent's dtype differ).

    Mixed dtypes are computed in the wider type (integers exactly, else in
    float) and rounded back to the dtype of ``x``.
    """
    with np.errstate(all="ignore"):
        if x.dtype == y.dtype:
            return np.asarray(np.power(x, y))
        if x.dtype.kind in "iu" and y.dtype.kind in "iu":
            return np.asarray(np.power(x, y)).astype(x.dtype, copy=False)
        return np.asarray(np.power(_as_float(x), _as_float(y))).astype(x.dtype, copy=False)


def _as_float(x: np.ndarray) -> np.ndarray:
    """Numpy floats as they are; integers as float64; ml_dtypes floats as float32."""
    if x.dtype.kind == "f":
        return x
    return x.astype(np.float64 if x.dtype.kind in "iub" else np.float32)


@op("Clip", since=6)
def clip_6(
    x: np.ndarray, /, *, max: float = _FLOAT32_MAX, min: float = -_FLOAT32_MAX
) -> np.ndarray:
    """Clip with ``min``/``max`` attributes; the defaults (float32 range) clip nothing."""
    lo = None if min <= -_FLOAT32_MAX else x.dtype.type(min)
    hi = None if max >= _FLOAT32_MAX else x.dtype.type(max)
    return _clip(x, lo, hi)


@op("Clip", since=(11, 12, 13))
def clip(
    x: np.ndarray, min: np.ndarray | None = None, max: np.ndarray | None = None, /
) -> np.ndarray:
    """Clip with optional scalar ``min``/``max`` inputs (opset 11 on)."""
    lo = None if min is None else min.reshape(()).astype(x.dtype, copy=False)
    hi = None if max is None else max.reshape(()).astype(x.dtype, copy=False)
    return _clip(x, lo, hi)


def _clip(x: np.ndarray, lo, hi) -> np.ndarray:
    """``min(max(x, lo), hi)``: when ``lo > hi`` every value becomes ``hi``, as in ORT."""
    y = x.copy() if lo is None else np.asarray(np.maximum(x, lo))
    if hi is not None:
        np.minimum(y, hi, out=y)
    return y


@op("Identity", since=(1, 13, 14, 16, 19, 21, 23, 24, 25), view_output=0)
def identity(x, /):
    """A view of the input; a sequence gives a new list of the same arrays, None stays None."""
    if isinstance(x, np.ndarray):
        return x.view()
    return list(x) if isinstance(x, (list, tuple)) else x


@op("Size", since=(1, 13, 19, 21, 23, 24, 25))
def size(x: np.ndarray, /) -> np.ndarray:
    """The number of elements, as an int64 scalar."""
    return np.array(x.size, dtype=np.int64)


@op("Dropout", since=7, view_output=0)
def dropout_7(data: np.ndarray, /, *, ratio: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """Inference Dropout is the identity; the mask (dtype of ``data`` in opset 7) is all ones."""
    return data.view(), np.ones(data.shape, dtype=data.dtype)


@op("Dropout", since=10, view_output=0)
def dropout_10(data: np.ndarray, /, *, ratio: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """Inference Dropout; the mask is boolean from opset 10."""
    return data.view(), np.ones(data.shape, dtype=bool)


@op("Dropout", since=(12, 13, 22), view_output=0)
def dropout(
    data: np.ndarray,
    ratio: np.ndarray | None = None,
    training_mode: np.ndarray | None = None,
    /,
    *,
    seed: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Dropout with ``ratio``/``training_mode`` inputs.

    Inference (the default) is the identity with an all-true mask. Training
    mode zeroes each element with probability ``ratio`` and scales the rest by
    ``1 / (1 - ratio)``; a ``seed`` makes the mask reproducible, drawn the
    way the ONNX reference draws it.
    """
    if training_mode is not None and bool(training_mode):
        rate = 0.5 if ratio is None else float(ratio)
        if rate != 0:
            mask = np.random.RandomState(seed).uniform(0, 1, data.shape) >= rate
            return (mask * data / (1 - rate)).astype(data.dtype), mask
    return data.view(), np.ones(data.shape, dtype=bool)

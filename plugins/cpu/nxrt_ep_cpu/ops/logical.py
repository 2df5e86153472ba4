"""Comparison, logical and bitwise kernels, with numpy (multidirectional) broadcasting."""

from __future__ import annotations

import numpy as np

from nxrt.errors import KernelFailed
from nxrt_ep_cpu.ops._registry import op


def _comparable(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Operands numpy can compare: ml_dtypes floats (bfloat16, float8) go to float32."""
    if a.dtype.kind == "V":
        a = a.astype(np.float32)
    if b.dtype.kind == "V":
        b = b.astype(np.float32)
    return a, b


def _compare(ufunc: np.ufunc, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = _comparable(a, b)
    return np.asarray(ufunc(a, b), dtype=bool)


# -- comparisons ------------------------------------------------------------------------------


@op("Equal", since=(7, 11, 13, 19))
def equal(a: np.ndarray, b: np.ndarray, /) -> np.ndarray:
    """Elementwise equality; strings (object arrays) compare by value."""
    return _compare(np.equal, a, b)


@op("Greater", since=(7, 9, 13))
def greater(a: np.ndarray, b: np.ndarray, /) -> np.ndarray:
    return _compare(np.greater, a, b)


@op("Less", since=(7, 9, 13))
def less(a: np.ndarray, b: np.ndarray, /) -> np.ndarray:
    return _compare(np.less, a, b)


@op("GreaterOrEqual", since=(12, 16))
def greater_or_equal(a: np.ndarray, b: np.ndarray, /) -> np.ndarray:
    return _compare(np.greater_equal, a, b)


@op("LessOrEqual", since=(12, 16))
def less_or_equal(a: np.ndarray, b: np.ndarray, /) -> np.ndarray:
    return _compare(np.less_equal, a, b)


# -- boolean logic ----------------------------------------------------------------------------


@op("And", since=7)
def and_(a: np.ndarray, b: np.ndarray, /) -> np.ndarray:
    return np.asarray(np.logical_and(a, b))


@op("Or", since=7)
def or_(a: np.ndarray, b: np.ndarray, /) -> np.ndarray:
    return np.asarray(np.logical_or(a, b))


@op("Xor", since=7)
def xor(a: np.ndarray, b: np.ndarray, /) -> np.ndarray:
    return np.asarray(np.logical_xor(a, b))


@op("Not", since=1)
def not_(x: np.ndarray, /) -> np.ndarray:
    return np.asarray(np.logical_not(x))


@op("Where", since=(9, 16))
def where(condition: np.ndarray, x: np.ndarray, y: np.ndarray, /) -> np.ndarray:
    """``x`` where ``condition`` holds, else ``y``, in the dtype of ``x``."""
    result = np.where(condition, x, y)
    if x.dtype.kind in "OSU":  # strings: a fixed-width cast could truncate
        return result
    return result.astype(x.dtype, copy=False)


# -- bitwise ----------------------------------------------------------------------------------


@op("BitwiseAnd", since=18)
def bitwise_and(a: np.ndarray, b: np.ndarray, /) -> np.ndarray:
    return np.asarray(np.bitwise_and(a, b))


@op("BitwiseOr", since=18)
def bitwise_or(a: np.ndarray, b: np.ndarray, /) -> np.ndarray:
    return np.asarray(np.bitwise_or(a, b))


@op("BitwiseXor", since=18)
def bitwise_xor(a: np.ndarray, b: np.ndarray, /) -> np.ndarray:
    return np.asarray(np.bitwise_xor(a, b))


@op("BitwiseNot", since=18)
def bitwise_not(x: np.ndarray, /) -> np.ndarray:
    return np.asarray(np.invert(x))


@op("BitShift", since=(11, 28))
def bit_shift(x: np.ndarray, y: np.ndarray, /, *, direction: str = "") -> np.ndarray:
    """Shift ``x`` by ``y`` bits; a right shift of a signed type is arithmetic.

    Shift amounts that are negative or at least the bit width give what the sign
    extension alone produces: -1 for a right shift of a negative ``x``, else 0.
    Left shifts of signed types wrap through the sign bit (done on the unsigned view).
    """
    if direction not in ("LEFT", "RIGHT"):
        raise KernelFailed(f"BitShift: direction must be 'LEFT' or 'RIGHT', got {direction!r}")
    if x.dtype.kind not in "iu" or y.dtype.kind not in "iu":
        raise KernelFailed(f"BitShift needs integer inputs, got {x.dtype} and {y.dtype}")
    bits = x.dtype.itemsize * 8
    x, y = np.broadcast_arrays(x, y)
    in_range = (y >= 0) & (y < bits)
    unsigned = np.dtype(f"u{x.dtype.itemsize}")
    # Shift by a safe amount everywhere, then overwrite the out-of-range positions.
    count = np.where(in_range, y, 0).astype(unsigned)
    if direction == "LEFT":
        result = np.left_shift(x.view(unsigned), count).view(x.dtype)
        return np.where(in_range, result, 0).astype(x.dtype, copy=False)
    result = np.right_shift(x, count.astype(x.dtype))
    fill = np.where(x < 0, -1, 0) if x.dtype.kind == "i" else 0
    return np.where(in_range, result, fill).astype(x.dtype, copy=False)

"""Reductions over constant axes (an attribute, or a constant input in later opsets)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from nxrt_ep_mlx._backend import mx
from nxrt_ep_mlx.ops._registry import op


def _reduce(
    fn: Callable[..., Any],
    x: mx.array,
    axes: Sequence[int] | None,
    keepdims: int,
    noop_with_empty_axes: int,
) -> mx.array:
    """No axes means all of them, or the identity when ``noop_with_empty_axes``.

    Over an empty axis MLX refuses max and min, gives NaN for the mean and now
    and then uninitialised memory for the sum; the spec's answers (the lowest
    value for max, the highest for min, 0 for the sum) and onnxruntime's (0 for
    the mean, which the spec leaves undefined) are filled in.
    """
    if axes is None or len(axes) == 0:
        if noop_with_empty_axes:
            return x
        axes = range(x.ndim)
    axis = tuple(a % x.ndim for a in axes)
    empty = _EMPTY.get(getattr(fn, "__name__", ""))
    if empty is not None and any(x.shape[a] == 0 for a in axis):
        shape = [1 if a in axis else d for a, d in enumerate(x.shape)]
        if not keepdims:
            shape = [d for a, d in enumerate(shape) if a not in axis]
        return mx.full(shape, empty, dtype=x.dtype)
    return fn(x, axis=axis, keepdims=bool(keepdims))


#: What a reduction over nothing gives (the dtypes MLX claims are floats), by the name of
#: the mlx function (names, so that importing this module does not import mlx).
_EMPTY = {"max": -float("inf"), "min": float("inf"), "mean": 0.0, "sum": 0.0}


def _axes(axes: np.ndarray | None) -> list[int] | None:
    return None if axes is None else [int(a) for a in np.asarray(axes).reshape(-1)]


@op("ReduceMean", since=(1, 11, 13))
def reduce_mean_1(x: mx.array, /, *, axes: Sequence[int] | None = None, keepdims: int = 1):
    return _reduce(mx.mean, x, axes, keepdims, 0)


@op("ReduceMean", since=18, const_inputs=(1,))
def reduce_mean(
    x: mx.array,
    axes: np.ndarray | None = None,
    /,
    *,
    keepdims: int = 1,
    noop_with_empty_axes: int = 0,
) -> mx.array:
    return _reduce(mx.mean, x, _axes(axes), keepdims, noop_with_empty_axes)


@op("ReduceSum", since=(1, 11))
def reduce_sum_1(x: mx.array, /, *, axes: Sequence[int] | None = None, keepdims: int = 1):
    return _reduce(mx.sum, x, axes, keepdims, 0)


@op("ReduceSum", since=13, const_inputs=(1,))
def reduce_sum(
    x: mx.array,
    axes: np.ndarray | None = None,
    /,
    *,
    keepdims: int = 1,
    noop_with_empty_axes: int = 0,
) -> mx.array:
    return _reduce(mx.sum, x, _axes(axes), keepdims, noop_with_empty_axes)


@op("ReduceMax", since=(1, 11, 12, 13))
def reduce_max_1(x: mx.array, /, *, axes: Sequence[int] | None = None, keepdims: int = 1):
    return _reduce(mx.max, x, axes, keepdims, 0)


@op("ReduceMax", since=(18, 20), const_inputs=(1,))
def reduce_max(
    x: mx.array,
    axes: np.ndarray | None = None,
    /,
    *,
    keepdims: int = 1,
    noop_with_empty_axes: int = 0,
) -> mx.array:
    return _reduce(mx.max, x, _axes(axes), keepdims, noop_with_empty_axes)


@op("ReduceMin", since=(1, 11, 12, 13))
def reduce_min_1(x: mx.array, /, *, axes: Sequence[int] | None = None, keepdims: int = 1):
    return _reduce(mx.min, x, axes, keepdims, 0)


@op("ReduceMin", since=(18, 20), const_inputs=(1,))
def reduce_min(
    x: mx.array,
    axes: np.ndarray | None = None,
    /,
    *,
    keepdims: int = 1,
    noop_with_empty_axes: int = 0,
) -> mx.array:
    return _reduce(mx.min, x, _axes(axes), keepdims, noop_with_empty_axes)

"""Shape and data-movement ops, and constants.

Everything that decides a shape (Reshape's shape, Slice's bounds, axes lists)
must be a constant: claims are compiled for fixed shapes, and an op whose
output shape depends on run-time data stays on another EP.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from nxrt_ep_mlx._backend import mx
from nxrt_ep_mlx.ops._registry import BOOLS, FLOATS, INDICES, op

if TYPE_CHECKING:
    import onnx_ir as ir


def _ints(values: Any) -> list[int]:
    return [int(v) for v in np.asarray(values).reshape(-1)]


@op("Flatten", since=(1, 9, 11, 13, 21, 23, 24, 25))
def flatten(x: mx.array, /, *, axis: int = 1) -> mx.array:
    """Axes before ``axis`` become the first dim; ``axis`` may be the rank (all of them)."""
    first = axis + x.ndim if axis < 0 else axis
    return x.reshape(math.prod(x.shape[:first]), math.prod(x.shape[first:]))


@op("Reshape", since=(5, 13, 14, 19, 21, 23, 24, 25), const_inputs=(1,))
def reshape(x: mx.array, shape: np.ndarray, /, *, allowzero: int = 0) -> mx.array:
    """A 0 copies the input's dim at that position unless ``allowzero``; -1 is inferred."""
    dims = _ints(shape)
    if not allowzero:
        dims = [x.shape[i] if d == 0 else d for i, d in enumerate(dims)]
    return x.reshape(dims)


@op("Transpose", since=(1, 13, 21, 23, 24, 25))
def transpose(x: mx.array, /, *, perm: Sequence[int] | None = None) -> mx.array:
    return mx.transpose(x, list(perm) if perm is not None else None)


@op("Concat", since=(4, 11, 13))
def concat(*inputs: mx.array, axis: int) -> mx.array:
    return mx.concatenate(list(inputs), axis=axis)


def _slice(
    x: mx.array,
    starts: Sequence[int],
    ends: Sequence[int],
    axes: Sequence[int] | None,
    steps: Sequence[int] | None,
) -> mx.array:
    """ONNX bounds (clamped per the step's sign) as Python slices."""
    axes = list(axes) if axes is not None else list(range(len(starts)))
    steps = list(steps) if steps is not None else [1] * len(starts)
    index = [slice(None)] * x.ndim
    for start, end, axis, step in zip(starts, ends, axes, steps):
        dim = x.shape[axis]
        start = start + dim if start < 0 else start
        end = end + dim if end < 0 else end
        if step > 0:
            start, end = min(max(start, 0), dim), min(max(end, 0), dim)
        else:
            start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
        index[axis] = slice(start, end if end >= 0 else None, step)
    return x[tuple(index)]


@op("Slice", since=1)
def slice_1(
    x: mx.array,
    /,
    *,
    axes: Sequence[int] | None = None,
    ends: Sequence[int],
    starts: Sequence[int],
) -> mx.array:
    return _slice(x, starts, ends, axes, None)


@op("Slice", since=(10, 11, 13), const_inputs=(1, 2, 3, 4))
def slice_(
    x: mx.array,
    starts: np.ndarray,
    ends: np.ndarray,
    axes: np.ndarray | None = None,
    steps: np.ndarray | None = None,
    /,
) -> mx.array:
    return _slice(
        x,
        _ints(starts),
        _ints(ends),
        _ints(axes) if axes is not None else None,
        _ints(steps) if steps is not None else None,
    )


@op("Gather", since=(1, 11, 13), input_types={1: INDICES})
def gather(x: mx.array, indices: mx.array, /, *, axis: int = 0) -> mx.array:
    """Negative indices count from the end (opset 11 made that explicit)."""
    axis = axis % x.ndim
    indices = mx.where(indices < 0, indices + x.shape[axis], indices)
    return mx.take(x, indices, axis=axis)


def _split_sizes(
    dim: int, split: Sequence[int] | None, num_outputs: int | None, outputs: int
) -> list[int]:
    if split is not None:
        return list(split)
    if num_outputs:
        chunk = -(-dim // num_outputs)
        return [chunk] * (num_outputs - 1) + [dim - chunk * (num_outputs - 1)]
    return [dim // outputs] * outputs


def _split(x: mx.array, sizes: Sequence[int], axis: int) -> tuple[mx.array, ...]:
    bounds = np.cumsum(sizes)[:-1].tolist()
    return tuple(mx.split(x, bounds, axis=axis))


@op("Split", since=(2, 11), max_outputs=None)
def split_2(
    x: mx.array, /, *, axis: int = 0, split: Sequence[int] | None = None, _n_outputs: int = 1
) -> tuple[mx.array, ...]:
    sizes = _split_sizes(x.shape[axis], split, None, _n_outputs)
    return _split(x, sizes, axis)


@op("Split", since=(13, 18), const_inputs=(1,), max_outputs=None)
def split(
    x: mx.array,
    split: np.ndarray | None = None,
    /,
    *,
    axis: int = 0,
    num_outputs: int | None = None,
    _n_outputs: int = 1,
) -> tuple[mx.array, ...]:
    """Sizes from ``split``, else ``num_outputs`` chunks (the last smaller), else equal parts."""
    sizes = _split_sizes(
        x.shape[axis], _ints(split) if split is not None else None, num_outputs, _n_outputs
    )
    return _split(x, sizes, axis)


def _squeeze(x: mx.array, axes: Sequence[int] | None) -> mx.array:
    if axes is None or len(axes) == 0:
        axes = [i for i, d in enumerate(x.shape) if d == 1]
    return mx.squeeze(x, axis=tuple(a % x.ndim for a in axes))


@op("Squeeze", since=(1, 11))
def squeeze_1(x: mx.array, /, *, axes: Sequence[int] | None = None) -> mx.array:
    return _squeeze(x, axes)


@op("Squeeze", since=(13, 21, 23, 24, 25), const_inputs=(1,))
def squeeze(x: mx.array, axes: np.ndarray | None = None, /) -> mx.array:
    return _squeeze(x, _ints(axes) if axes is not None else None)


def _unsqueeze(x: mx.array, axes: Sequence[int]) -> mx.array:
    rank = x.ndim + len(axes)
    inserted = sorted(a % rank for a in axes)
    shape = list(x.shape)
    for axis in inserted:
        shape.insert(axis, 1)
    return x.reshape(shape)


@op("Unsqueeze", since=(1, 11))
def unsqueeze_1(x: mx.array, /, *, axes: Sequence[int]) -> mx.array:
    return _unsqueeze(x, axes)


@op("Unsqueeze", since=(13, 21, 23, 24, 25), const_inputs=(1,))
def unsqueeze(x: mx.array, axes: np.ndarray, /) -> mx.array:
    return _unsqueeze(x, _ints(axes))


def _check_constant(node: ir.Node, attrs: Mapping[str, Any]) -> str:
    kinds = set(attrs) - {"value", "value_float", "value_floats", "value_int", "value_ints"}
    return f"attribute {sorted(kinds)[0]}" if kinds else ""


@op("Constant", since=(1, 9, 11, 12, 13, 19, 21, 23, 24, 25), check=_check_constant,
    output_types=FLOATS | INDICES | BOOLS)  # fmt: skip
def constant(
    *,
    value: np.ndarray | None = None,
    value_float: float | None = None,
    value_floats: Sequence[float] | None = None,
    value_int: int | None = None,
    value_ints: Sequence[int] | None = None,
) -> mx.array:
    """Evaluated once, when the claim is compiled (shape inputs read it from the graph)."""
    if value is not None:
        return mx.array(value)
    if value_float is not None or value_floats is not None:
        return mx.array(
            np.asarray(value_float if value_floats is None else value_floats, np.float32)
        )
    return mx.array(np.asarray(value_int if value_ints is None else value_ints, np.int64))


@op("ConstantOfShape", since=(9, 20, 21, 23, 24, 25), const_inputs=(0,))
def constant_of_shape(shape: np.ndarray, /, *, value: np.ndarray | None = None) -> mx.array:
    """Default fill: float32 zero, as the schema says."""
    fill = mx.array(value.reshape(())) if value is not None else mx.array(0.0, dtype=mx.float32)
    return mx.full(_ints(shape), fill)

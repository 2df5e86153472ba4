"""Shape manipulation. Reshape, Squeeze, Unsqueeze return views of their input (no copy)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from nxrt.errors import KernelFailed
from nxrt_ep_cpu.ops._registry import op


@op("Reshape", since=1, view_output=0)
def reshape_1(
    data: np.ndarray, /, *, consumed_inputs: list[int] | None = None, shape: list[int] | None = None
) -> np.ndarray:
    """Reshape to the ``shape`` attribute (opset 1); 0 copies a dimension, -1 is inferred."""
    return data.reshape(_target_shape(data, np.asarray(shape or [], dtype=np.int64), allowzero=0))


@op("Reshape", since=(5, 13), view_output=0)
def reshape_5(data: np.ndarray, shape: np.ndarray, /) -> np.ndarray:
    """Reshape where 0 copies the input's dimension and -1 is inferred."""
    return data.reshape(_target_shape(data, shape, allowzero=0))


@op("Reshape", since=(14, 19, 21, 23, 24, 25), view_output=0)
def reshape(data: np.ndarray, shape: np.ndarray, /, *, allowzero: int = 0) -> np.ndarray:
    """Reshape; with ``allowzero=1`` a 0 in ``shape`` is a real zero-sized dimension."""
    return data.reshape(_target_shape(data, shape, allowzero))


def _target_shape(data: np.ndarray, shape: np.ndarray, allowzero: int) -> tuple[int, ...]:
    dims = [int(d) for d in np.asarray(shape).reshape(-1)]
    if not allowzero:
        for i, d in enumerate(dims):
            if d == 0:
                if i >= data.ndim:
                    raise KernelFailed(
                        f"Reshape: shape {dims} copies dimension {i} (a 0) but the input "
                        f"has rank {data.ndim}"
                    )
                dims[i] = data.shape[i]
    if dims.count(-1) == 1 and 0 in dims and data.size == 0:
        # numpy cannot infer -1 next to a zero dimension; ONNX infers it from the rest
        raise KernelFailed(f"Reshape: cannot infer -1 in {dims} for an empty tensor")
    return tuple(dims)


@op("Transpose", since=(1, 13, 21, 23, 24, 25))
def transpose(data: np.ndarray, /, *, perm: list[int] | None = None) -> np.ndarray:
    """Permute axes (reversed by default) into a new contiguous array."""
    return np.transpose(data, perm).copy()


@op("Concat", since=1)
def concat_1(*inputs: np.ndarray, axis: int = 1) -> np.ndarray:
    """Concatenate along ``axis`` (1 by default in opset 1)."""
    return np.concatenate(inputs, axis=axis)


@op("Concat", since=(4, 11, 13))
def concat(*inputs: np.ndarray, axis: int) -> np.ndarray:
    """Concatenate along ``axis`` (negative counts from the end since opset 11)."""
    if not inputs:
        raise KernelFailed("Concat: needs at least one input")
    return np.concatenate(inputs, axis=axis)


@op("Unsqueeze", since=(1, 11), view_output=0)
def unsqueeze_1(data: np.ndarray, /, *, axes: list[int]) -> np.ndarray:
    """Insert size-1 axes given by the ``axes`` attribute (indices into the output)."""
    return np.expand_dims(data, tuple(axes))


@op("Unsqueeze", since=(13, 21, 23, 24, 25), view_output=0)
def unsqueeze(data: np.ndarray, axes: np.ndarray, /) -> np.ndarray:
    """Insert size-1 axes given by the ``axes`` input (opset 13 on)."""
    return np.expand_dims(data, _axes(axes))


@op("Squeeze", since=(1, 11), view_output=0)
def squeeze_1(data: np.ndarray, /, *, axes: list[int] | None = None) -> np.ndarray:
    """Drop the size-1 axes listed in the ``axes`` attribute, or all of them."""
    return np.squeeze(data, axis=tuple(axes) if axes else None)


@op("Squeeze", since=(13, 21, 23, 24, 25), view_output=0)
def squeeze(data: np.ndarray, axes: np.ndarray | None = None, /) -> np.ndarray:
    """Drop the size-1 axes listed in the optional ``axes`` input, or all of them."""
    return np.squeeze(data, axis=_axes(axes) if axes is not None and axes.size else None)


def _axes(axes: np.ndarray | Sequence[int]) -> tuple[int, ...]:
    return tuple(int(a) for a in np.asarray(axes).reshape(-1))


@op("Shape", since=(1, 13))
def shape_1(data: np.ndarray, /) -> np.ndarray:
    return np.array(data.shape, dtype=np.int64)


@op("Shape", since=(15, 19, 21, 23, 24, 25))
def shape(data: np.ndarray, /, *, end: int | None = None, start: int = 0) -> np.ndarray:
    """The input's shape, sliced to ``[start:end]`` with clamping (opset 15)."""
    return np.array(data.shape[start:end], dtype=np.int64)


@op("Gather", since=(1, 11, 13))
def gather(data: np.ndarray, indices: np.ndarray, /, *, axis: int = 0) -> np.ndarray:
    """Take entries along ``axis``; negative indices count from the end."""
    size = data.shape[axis]
    if indices.size and (indices.min() < -size or indices.max() >= size):
        raise KernelFailed(
            f"Gather: indices must lie in [{-size}, {size - 1}] for axis {axis} of shape "
            f"{data.shape}, got values from {indices.min()} to {indices.max()}"
        )
    return np.take(data, indices, axis=axis)


@op("Slice", since=1)
def slice_1(
    data: np.ndarray,
    /,
    *,
    axes: list[int] | None = None,
    ends: list[int],
    starts: list[int],
) -> np.ndarray:
    """Slice with ``starts``/``ends``/``axes`` attributes and unit steps (opset 1)."""
    return _slice(data, starts, ends, axes, None)


@op("Slice", since=(10, 11, 13))
def slice_(
    data: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    axes: np.ndarray | None = None,
    steps: np.ndarray | None = None,
    /,
) -> np.ndarray:
    """Slice with ``starts``, ``ends`` and optional ``axes``/``steps`` inputs (opset 10 on)."""
    return _slice(data, starts, ends, axes, steps)


def _bounds(start: int, end: int, step: int, size: int) -> slice:
    """One axis's slice after the spec's clamping: [0, size] stepping forward, start in
    [0, size - 1] and end in [-1, size - 1] stepping backward."""
    start, end = start + size if start < 0 else start, end + size if end < 0 else end
    if step > 0:
        return slice(min(max(start, 0), size), min(max(end, 0), size), step)
    if size == 0:
        return slice(0, 0)
    end = min(max(end, -1), size - 1)
    return slice(min(max(start, 0), size - 1), None if end < 0 else end, step)


def _slice(data: np.ndarray, starts, ends, axes, steps) -> np.ndarray:
    """ONNX's clamping, then Python slicing; a copy of the result.

    Python clamps a start before the first element to "nothing" when stepping
    backward, where ONNX clamps it to the first element ([0, dim - 1]), so the
    bounds are clamped here first; an end of -1 (before the first element) is
    then written as ``None``.
    """
    starts, ends = _axes(starts), _axes(ends)
    axes = range(len(starts)) if axes is None else _axes(axes)
    steps = (1,) * len(starts) if steps is None else _axes(steps)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise KernelFailed(
            f"Slice: starts {starts}, ends {ends}, axes {tuple(axes)} and steps {steps} "
            "must have the same length"
        )
    index = [slice(None)] * data.ndim
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        if step == 0:
            raise KernelFailed("Slice: steps must not be 0")
        index[axis] = _bounds(start, end, step, data.shape[axis])
    return data[tuple(index)].copy()

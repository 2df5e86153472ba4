"""Gather/Scatter family, Compress, NonZero, Unique, TopK and other indexing kernels."""

from __future__ import annotations

import numpy as np

from nxrt.errors import KernelFailed
from nxrt.memory import check_elements
from nxrt_ep_cpu.ops._registry import op
from nxrt_ep_cpu.ops._topk_order import ort_top_k

_REDUCTIONS = {
    "add": np.add,
    "mul": np.multiply,
    "max": np.maximum,
    "min": np.minimum,
}


def _checked_indices(indices: np.ndarray, size: int, op_name: str) -> np.ndarray:
    """Indices as int64 with negatives counted from the end; out-of-range ones refused."""
    indices = np.asarray(indices).astype(np.int64, copy=False)
    if indices.size and (indices.min() < -size or indices.max() >= size):
        raise KernelFailed(
            f"{op_name}: indices must lie in [{-size}, {size - 1}], got values from "
            f"{indices.min()} to {indices.max()}"
        )
    return np.where(indices < 0, indices + size, indices)


def _axis(axis: int, rank: int, op_name: str) -> int:
    if not -rank <= axis < max(rank, 1):
        raise KernelFailed(f"{op_name}: axis {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


@op("GatherElements", since=(11, 13))
def gather_elements(data: np.ndarray, indices: np.ndarray, /, *, axis: int = 0) -> np.ndarray:
    """Pick one entry of ``data`` along ``axis`` per entry of ``indices``.

    The output takes the indices' shape; off the axis the indices may be
    smaller than the data (the spec allows it), so the data is cut to them
    first: ``take_along_axis`` would broadcast instead.
    """
    axis = _axis(axis, data.ndim, "GatherElements")
    if indices.ndim != data.ndim or any(
        i > d for a, (i, d) in enumerate(zip(indices.shape, data.shape)) if a != axis
    ):
        raise KernelFailed(
            f"GatherElements: indices of shape {indices.shape} do not fit data of shape "
            f"{data.shape} off axis {axis}"
        )
    index = _checked_indices(indices, data.shape[axis], "GatherElements")
    window = tuple(slice(None) if a == axis else slice(n) for a, n in enumerate(indices.shape))
    return np.take_along_axis(data[window], index, axis=axis)


@op("GatherND", since=11)
def gather_nd_11(data: np.ndarray, indices: np.ndarray, /) -> np.ndarray:
    """Gather slices of ``data`` addressed by the last axis of ``indices``."""
    return _gather_nd(data, indices, 0)


@op("GatherND", since=(12, 13))
def gather_nd(data: np.ndarray, indices: np.ndarray, /, *, batch_dims: int = 0) -> np.ndarray:
    """Gather slices of ``data`` addressed by the last axis of ``indices``, per batch entry."""
    return _gather_nd(data, indices, batch_dims)


def _gather_nd(data: np.ndarray, indices: np.ndarray, batch_dims: int) -> np.ndarray:
    depth = indices.shape[-1]
    if depth > data.ndim - batch_dims:
        raise KernelFailed(
            f"GatherND: indices address {depth} axes but data of shape {data.shape} has only "
            f"{data.ndim - batch_dims} after {batch_dims} batch dims"
        )
    if data.shape[:batch_dims] != indices.shape[:batch_dims]:
        raise KernelFailed(
            f"GatherND: the batch dims of data {data.shape} and indices {indices.shape} differ"
        )
    batch = int(np.prod(data.shape[:batch_dims], dtype=np.int64))
    flat_data = data.reshape((batch, *data.shape[batch_dims:]))
    per_batch = int(np.prod(indices.shape[batch_dims:-1], dtype=np.int64))
    flat_idx = indices.reshape(batch, per_batch, depth).astype(np.int64)  # no -1: size may be 0
    columns = [
        _checked_indices(flat_idx[..., i], flat_data.shape[1 + i], "GatherND") for i in range(depth)
    ]
    out = flat_data[(np.arange(batch)[:, None], *columns)]
    shape = indices.shape[:-1] + data.shape[batch_dims + depth :]
    return out.reshape(shape)


@op("Scatter", since=(9, 11))
def scatter(
    data: np.ndarray, indices: np.ndarray, updates: np.ndarray, /, *, axis: int = 0
) -> np.ndarray:
    """The deprecated name of ScatterElements without reduction."""
    return _scatter_elements(data, indices, updates, axis, "none")


@op("ScatterElements", since=(11, 13))
def scatter_elements_11(
    data: np.ndarray, indices: np.ndarray, updates: np.ndarray, /, *, axis: int = 0
) -> np.ndarray:
    """Write ``updates`` into a copy of ``data`` at ``indices`` along ``axis``."""
    return _scatter_elements(data, indices, updates, axis, "none")


@op("ScatterElements", since=(16, 18))
def scatter_elements(
    data: np.ndarray,
    indices: np.ndarray,
    updates: np.ndarray,
    /,
    *,
    axis: int = 0,
    reduction: str = "none",
) -> np.ndarray:
    """ScatterElements; ``reduction`` combines each update with the entry it lands on."""
    return _scatter_elements(data, indices, updates, axis, reduction)


def _scatter_elements(data, indices, updates, axis: int, reduction: str) -> np.ndarray:
    axis = _axis(axis, data.ndim, "ScatterElements")
    if indices.shape != updates.shape:
        raise KernelFailed(
            f"ScatterElements: indices {indices.shape} and updates {updates.shape} must have "
            "the same shape"
        )
    index = list(np.indices(indices.shape, sparse=True))
    index[axis] = _checked_indices(indices, data.shape[axis], "ScatterElements")
    return _scatter(data, tuple(index), updates, reduction, "ScatterElements")


def _scatter(data, index: tuple, updates, reduction: str, op_name: str) -> np.ndarray:
    out = data.copy()
    if reduction == "none":
        out[index] = updates
        return out
    ufunc = _REDUCTIONS.get(reduction)
    if ufunc is None:
        raise KernelFailed(f"{op_name}: unknown reduction {reduction!r}")
    if out.dtype == np.bool_ and reduction in ("add", "mul"):
        ufunc = np.logical_or if reduction == "add" else np.logical_and
    if reduction in ("max", "min") and out.dtype.kind == "f":
        if np.isnan(out).any() or np.isnan(updates).any():
            return _extreme_at(out, index, updates, reduction == "max")
    ufunc.at(out, index, updates)
    return out


def _extreme_at(out: np.ndarray, index: tuple, updates, largest: bool) -> np.ndarray:
    """``max``/``min`` reductions over NaN as ONNX Runtime does them, one update after the
    other, with C++'s ``std::max(update, current)`` (``a < b ? b : a``: a NaN update
    replaces the value, a NaN value is replaced by the next update; the spec says
    nothing of NaN)."""
    positions = np.arange(out.size).reshape(out.shape)[index]  # where each update lands
    updates = np.broadcast_to(np.asarray(updates, dtype=out.dtype), positions.shape)
    flat_out = out.reshape(-1)
    for position, value in zip(positions.reshape(-1).tolist(), updates.reshape(-1).tolist()):
        a, b = value, flat_out[position]
        flat_out[position] = b if ((a < b) if largest else (b < a)) else a
    return out


@op("ScatterND", since=(11, 13))
def scatter_nd_11(data: np.ndarray, indices: np.ndarray, updates: np.ndarray, /) -> np.ndarray:
    """Write slices of ``updates`` into a copy of ``data`` at the addresses in ``indices``."""
    return _scatter_nd(data, indices, updates, "none")


@op("ScatterND", since=(16, 18))
def scatter_nd(
    data: np.ndarray, indices: np.ndarray, updates: np.ndarray, /, *, reduction: str = "none"
) -> np.ndarray:
    """ScatterND; ``reduction`` combines each update with the slice it lands on."""
    return _scatter_nd(data, indices, updates, reduction)


def _scatter_nd(data, indices, updates, reduction: str) -> np.ndarray:
    depth = indices.shape[-1]
    if depth > data.ndim:
        raise KernelFailed(f"ScatterND: indices address {depth} axes but data has rank {data.ndim}")
    index = tuple(
        _checked_indices(indices[..., i], data.shape[i], "ScatterND") for i in range(depth)
    )
    expected = indices.shape[:-1] + data.shape[depth:]
    if updates.shape != expected:
        raise KernelFailed(f"ScatterND: updates must have shape {expected}, not {updates.shape}")
    return _scatter(data, index, updates, reduction, "ScatterND")


@op("TensorScatter", since=24)
def tensor_scatter(
    past_cache: np.ndarray,
    update: np.ndarray,
    write_indices: np.ndarray | None = None,
    /,
    *,
    axis: int = -2,
    mode: str = "linear",
) -> np.ndarray:
    """Write ``update`` into a copy of the cache along ``axis``, from a per-batch offset."""
    if mode not in ("linear", "circular"):
        raise KernelFailed(f"TensorScatter: mode must be 'linear' or 'circular', not {mode!r}")
    rank = past_cache.ndim
    axis = _axis(axis, rank, "TensorScatter")
    if axis == 0:
        raise KernelFailed("TensorScatter: axis must not be the batch axis 0")
    for i, (a, b) in enumerate(zip(past_cache.shape, update.shape, strict=True)):
        if (i != axis and a != b) or (i == axis and b > a):
            raise KernelFailed(
                f"TensorScatter: update {update.shape} does not fit cache {past_cache.shape}"
            )
    batch, length, capacity = past_cache.shape[0], update.shape[axis], past_cache.shape[axis]
    if write_indices is None:
        write_indices = np.zeros(batch, dtype=np.int64)
    positions = write_indices.astype(np.int64).reshape(batch, 1) + np.arange(length)
    if mode == "circular":
        positions %= capacity
    elif positions.size and (positions.min() < 0 or positions.max() >= capacity):
        raise KernelFailed(
            f"TensorScatter: writes reach past the cache length {capacity} (use mode='circular')"
        )
    present = past_cache.copy()
    target = np.moveaxis(present, axis, 1)  # a view: writes land in ``present``
    target[np.arange(batch)[:, None], positions] = np.moveaxis(update, axis, 1)
    return present


@op("Compress", since=(9, 11, 28))
def compress(data: np.ndarray, condition: np.ndarray, /, *, axis: int | None = None) -> np.ndarray:
    """Keep the slices along ``axis`` (or the flattened elements) where ``condition`` holds."""
    condition = np.asarray(condition).reshape(-1).astype(bool)
    if axis is None:
        return np.compress(condition, data.reshape(-1))
    axis = _axis(axis, data.ndim, "Compress")
    if condition.size > data.shape[axis]:
        raise KernelFailed(
            f"Compress: condition has {condition.size} entries, axis {axis} only {data.shape[axis]}"
        )
    return np.compress(condition, data, axis=axis)


@op("NonZero", since=(9, 13))
def non_zero(x: np.ndarray, /) -> np.ndarray:
    """Indices of the non-zero entries, one row per axis, in row-major order."""
    if x.ndim == 0:
        return np.zeros((0, int(bool(x))), dtype=np.int64)
    return np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1)


@op("Unique", since=(11, 28))
def unique(
    x: np.ndarray, /, *, axis: int | None = None, sorted: int = 1
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Unique values (or slices along ``axis``), first indices, inverse indices and counts.

    With ``sorted=0`` the values come in the order of their first occurrence.
    """
    if axis is None:
        y, first, inverse, counts = np.unique(
            x.reshape(-1), return_index=True, return_inverse=True, return_counts=True
        )
        take_axis = 0
        source = x.reshape(-1)
    else:
        take_axis = _axis(axis, x.ndim, "Unique")
        y, first, inverse, counts = np.unique(
            x, return_index=True, return_inverse=True, return_counts=True, axis=take_axis
        )
        source = x
    inverse = inverse.reshape(-1)
    if not sorted:
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        first, counts, inverse = first[order], counts[order], rank[inverse]
        y = np.take(source, first, axis=take_axis)
    as_int = [np.asarray(a, dtype=np.int64) for a in (first, inverse, counts)]
    return y, as_int[0], as_int[1], as_int[2]


@op("TopK", since=1)
def top_k_1(x: np.ndarray, /, *, axis: int = -1, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` largest entries along ``axis`` (``k`` an attribute, opset 1)."""
    return _top_k(x, k, axis, largest=1)


@op("TopK", since=10)
def top_k_10(x: np.ndarray, k: np.ndarray, /, *, axis: int = -1) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` largest entries along ``axis`` (``k`` an input, opset 10)."""
    return _top_k(x, k, axis, largest=1)


@op("TopK", since=(11, 24))
def top_k(
    x: np.ndarray,
    k: np.ndarray,
    /,
    *,
    axis: int = -1,
    largest: int = 1,
    sorted: int = 1,
) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` largest (or smallest) entries along ``axis`` and their indices.

    Sorted, equal values keep the lower index first (the spec's order; NaN counts as
    the largest value, as in ONNX Runtime). With ``sorted=0`` the spec leaves the order
    open, and nxrt gives ONNX Runtime's, replaying its algorithm.
    """
    return _top_k(x, k, axis, largest, sorted)


def _top_k(
    x: np.ndarray, k, axis: int, largest: int, sort: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    k = int(np.asarray(k).reshape(-1)[0])
    axis = _axis(axis, x.ndim, "TopK")
    size = x.shape[axis]
    if not 0 <= k <= size:
        raise KernelFailed(f"TopK: k={k} must lie in [0, {size}] for axis {axis}")
    if not sort and k and x.size:
        rows = np.moveaxis(x, axis, -1).reshape(-1, size)
        picked = [ort_top_k(row.tolist(), k, bool(largest), bool(sort)) for row in rows]
        order = np.asarray(picked, dtype=np.int64).reshape(*np.moveaxis(x, axis, -1).shape[:-1], k)
        indices = np.moveaxis(order, -1, axis)
        return np.take_along_axis(x, indices, axis=axis), indices
    if largest:
        # a stable ascending sort of the reversed axis, reversed again, is descending
        # with ties in ascending index order
        flipped = np.flip(x, axis=axis)
        order = np.flip(np.argsort(flipped, axis=axis, kind="stable"), axis=axis)
        order = (size - 1) - order
    else:
        order = np.argsort(x, axis=axis, kind="stable")
    indices = np.take(order, np.arange(k), axis=axis).astype(np.int64)
    return np.take_along_axis(x, indices, axis=axis), indices


@op("OneHot", since=(9, 11, 28))
def one_hot(
    indices: np.ndarray, depth: np.ndarray, values: np.ndarray, /, *, axis: int = -1
) -> np.ndarray:
    """``values[1]`` where the new ``axis`` equals the index, ``values[0]`` elsewhere.

    Negative indices count from ``depth``; indices out of range give an all-off row.
    """
    depth = int(np.asarray(depth).reshape(-1)[0])
    values = np.asarray(values).reshape(-1)
    if values.size != 2:
        raise KernelFailed(f"OneHot: values must hold [off, on], got {values.size} entries")
    rank = indices.ndim
    if not -rank - 1 <= axis <= rank:
        raise KernelFailed(f"OneHot: axis {axis} is out of range for output rank {rank + 1}")
    axis = axis % (rank + 1)
    check_elements(indices.size * max(depth, 0), max(values.itemsize, 1) + 1)  # + the mask
    index = np.asarray(indices)
    if not np.issubdtype(index.dtype, np.integer):
        index = np.trunc(index.astype(np.float64))
    index = np.where(index < 0, index + depth, index)
    shape = [1] * (rank + 1)
    shape[axis] = depth
    hot = np.expand_dims(index, axis) == np.arange(depth).reshape(shape)
    return np.where(hot, values[1], values[0]).astype(values.dtype)

"""ONNX Runtime's answer where a NaN meets a max or a min, replayed step by step.

The ONNX spec says nothing of NaN in MaxPool, GlobalMaxPool, ReduceMax,
ReduceMin, ArgMax, ArgMin or Hardmax, so nxrt gives what ONNX Runtime gives (docs/fuzzing.md). ONNX
Runtime has no one rule: each kernel's NaN behaviour follows from the order
in which it compares values and from the comparison it uses, either C++'s
``std::max(a, b)`` (``a < b ? b : a``: a NaN ``b`` is skipped, a NaN ``a``
sticks) or SSE's ``maxps(a, b)`` (``a > b ? a : b``: a NaN on either side gives
``b``). So this module replays the kernels, vectorised over rows and channels:

- MaxPool's generic kernel (float64, the Indices output, dilations,
  ``storage_order=1``): the first element of a window, then each one that is
  strictly greater; a window that starts with NaN is NaN, later NaNs are skipped.
- float32 MaxPool and GlobalMaxPool (float16 too, which ONNX Runtime runs in
  float32) go through MLAS, whose kernels (global, 2-D/3-D vectorised,
  generic) each reduce in their own order with their own comparison.
- ReduceMax/ReduceMin: ONNX Runtime merges adjacent kept and reduced axes and
  picks a path by the merged shape; Eigen's ``maxCoeff`` reduces in SSE packets
  whose layout depends on where each row starts in memory (rows are taken to
  start at offsets of a 16-byte aligned buffer, as ONNX Runtime allocates and
  numpy too), and the loops between them are first-element folds.

Only windows and slices whose maximum is not finite come here: otherwise every
order gives the same maximum (MLAS's pools start from the lowest float, so a
window of -inf gives that, not -inf).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import numpy as np

_F32 = np.dtype(np.float32)
#: Bytes in one SSE register: Eigen's packets (4 float32, 2 float64) and MLAS's vectors.
_PACKET_BYTES = 16
#: MLAS's stack reduction buffer for its vectorised pools, in floats, and its over-read.
_MLAS_BUFFER, _MLAS_OVERREAD = 2048, 3


def _beats(largest: bool):
    return np.greater if largest else np.less


def _std(largest: bool):
    """``std::max(acc, x)`` (``std::min``): ``x`` when it beats ``acc``, else ``acc``."""
    beats = _beats(largest)
    return lambda acc, x: np.where(beats(x, acc), x, acc)


def _sse(largest: bool):
    """``maxps(acc, x)``: ``acc`` when it beats ``x``, else ``x`` (NaN gives ``x``)."""
    beats = _beats(largest)
    return lambda acc, x: np.where(beats(acc, x), acc, x)


def _degree_of_parallelism() -> int:
    """The threads of ONNX Runtime's default intra-op pool: one per core of this process."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


# -- Eigen's reductions ---------------------------------------------------------------------------


def eigen_redux(rows: np.ndarray, offsets: np.ndarray, largest: bool) -> np.ndarray:
    """Eigen's ``maxCoeff()`` (``minCoeff()``) of each row of ``rows`` (R, L), each row
    starting ``offsets[r]`` elements past a 16-byte boundary: unaligned head and tail
    elements folded one by one, the aligned middle in two packet accumulators, combined
    and reduced across lanes (Eigen's ``pmax`` keeps its first operand on a NaN, as
    ``std::max``)."""
    packet = max(1, _PACKET_BYTES // rows.dtype.itemsize)
    fold = _std(largest)
    out = np.empty(rows.shape[0], dtype=rows.dtype)
    starts = (-np.asarray(offsets, dtype=np.int64)) % packet
    for start in np.unique(starts):
        pick = starts == start
        out[pick] = _redux(rows[pick], int(start), packet, fold)
    return out


def _redux(v: np.ndarray, start: int, packet: int, fold) -> np.ndarray:
    size = v.shape[1]
    start = min(start, size)
    body2 = (size - start) // (2 * packet) * (2 * packet)
    body = (size - start) // packet * packet
    end2, end = start + body2, start + body
    if not body:
        res = v[:, 0]
        for i in range(1, size):
            res = fold(res, v[:, i])
        return res
    r0 = v[:, start : start + packet]
    if body > packet:
        r1 = v[:, start + packet : start + 2 * packet]
        for i in range(start + 2 * packet, end2, 2 * packet):
            r0 = fold(r0, v[:, i : i + packet])
            r1 = fold(r1, v[:, i + packet : i + 2 * packet])
        r0 = fold(r0, r1)
        if end > end2:
            r0 = fold(r0, v[:, end2 : end2 + packet])
    while r0.shape[1] > 1:  # across lanes: lane i against lane i + half
        half = r0.shape[1] // 2
        r0 = fold(r0[:, :half], r0[:, half:])
    res = r0[:, 0]
    for i in [*range(0, start), *range(end, size)]:
        res = fold(res, v[:, i])
    return res


def _packetwise(columns: np.ndarray, fold) -> np.ndarray:
    """Eigen's vectorised ``rowwise().maxCoeff()`` of packets of rows: ``columns`` (C, ...)
    reduced over its first axis, the first one, then fours as a tree, then the rest."""
    size = columns.shape[0]
    p = columns[0]
    i = 1
    size4 = (size - 1) & ~3
    while i < size4:
        pair = fold(fold(columns[i], columns[i + 1]), fold(columns[i + 2], columns[i + 3]))
        p = fold(p, pair)
        i += 4
    for rest in range(i, size):
        p = fold(p, columns[rest])
    return p


def _first_fold(flat: np.ndarray, largest: bool) -> np.ndarray:
    """The first element, then every one that beats the result so far (last axis)."""
    fold = _std(largest)
    acc = flat[..., 0]
    for i in range(1, flat.shape[-1]):
        acc = fold(acc, flat[..., i])
    return acc


def ort_reduce_extreme(x: np.ndarray, axes: Sequence[int], largest: bool) -> np.ndarray:
    """ONNX Runtime's ReduceMax (``largest``) or ReduceMin of ``x`` over ``axes`` (sorted,
    non-empty), with the reduced axes kept as size 1. ``x`` holds a NaN."""
    work = x.astype(_F32) if x.dtype.itemsize < 4 else x
    reduce = [i in axes for i in range(x.ndim)]
    shape, kinds = [x.shape[0]], [reduce[0]]
    for size, red in zip(x.shape[1:], reduce[1:], strict=True):
        if red == kinds[-1]:
            shape[-1] *= size
        else:
            shape.append(size)
            kinds.append(red)
    data = np.ascontiguousarray(work).reshape(shape)
    kept_shape = [1 if r else n for n, r in zip(x.shape, reduce, strict=True)]
    many = max(2, _degree_of_parallelism())
    if len(shape) == 1:  # every axis: Eigen over the whole buffer
        y = eigen_redux(data.reshape(1, -1), np.zeros(1, np.int64), largest)
    elif kinds == [False, True]:  # KR: Eigen per row
        d0, d1 = shape
        y = eigen_redux(data, np.arange(d0) * d1, largest)
    elif kinds == [False, True, False] and shape[0] >= many:  # KRK: Eigen's rowwise
        y = _krk(data, largest)
    elif kinds == [True, False, True] and shape[1] >= many:  # RKR: Eigen per block
        y = _rkr(data, largest)
    else:  # RK, and the generic loop: a first-element fold in the input's order
        moved = np.moveaxis(data, [i for i, r in enumerate(kinds) if r], range(-sum(kinds), 0))
        flat = moved.reshape(*moved.shape[: len(kinds) - sum(kinds)], -1)
        y = _first_fold(flat, largest)
    return np.asarray(y).reshape(kept_shape).astype(x.dtype)


def _krk(data: np.ndarray, largest: bool) -> np.ndarray:
    """``out[j] = M_j.rowwise().maxCoeff()`` for each ``M_j = data[j].T`` (d2 x d1, column
    major): the output rows Eigen writes as packets (those from the first 16-byte
    boundary of ``out + j * d2``) take the packet tree, the others a first fold."""
    d0, d1, d2 = data.shape
    packet = max(1, _PACKET_BYTES // data.dtype.itemsize)
    fold = _std(largest)
    out = np.empty((d0, d2), dtype=data.dtype)
    for j in range(d0):
        head = min((-(j * d2)) % packet, d2)
        body = (d2 - head) // packet * packet
        columns = data[j]  # (d1, d2): column c of M_j is data[j, c]
        out[j] = _first_fold(columns.T, largest)
        if body:
            out[j, head : head + body] = _packetwise(columns[:, head : head + body], fold)
    return out


def _rkr(data: np.ndarray, largest: bool) -> np.ndarray:
    """For each middle index: the first element, then each block's Eigen reduction that
    beats the result so far."""
    d0, d1, d2 = data.shape
    beats = _beats(largest)
    out = data[0, :, 0].copy()
    for i in range(d0):
        offsets = np.arange(d1) * d2 + i * d1 * d2
        v = eigen_redux(data[i], offsets, largest)
        out = np.where(beats(v, out), v, out)
    return out


def ort_arg_extreme(x: np.ndarray, axis: int, largest: bool, last: bool) -> np.ndarray:
    """ONNX Runtime's ArgMax (``largest``) / ArgMin along ``axis``, kept as size 1: from the
    first element, each strictly better one (``>=`` / ``<=`` with ``select_last_index``)
    moves the index, so a NaN first element wins and later NaNs are skipped. (Over a 1-D
    input ONNX Runtime uses Eigen's vectorised ``maxCoeff(&index)``, which keeps a NaN that
    starts an SSE packet; that case is not replayed.)"""
    moved = np.moveaxis(x, axis, -1)
    acc = moved[..., 0]
    index = np.zeros(acc.shape, dtype=np.int64)
    for i in range(0 if last else 1, moved.shape[-1]):
        v = moved[..., i]
        if last:
            take = (v >= acc) if largest else (v <= acc)
        else:
            take = (v > acc) if largest else (v < acc)
        acc = np.where(take, v, acc)
        index = np.where(take, i, index)
    return np.expand_dims(index, axis)


def ort_hardmax(x: np.ndarray, axis: int) -> np.ndarray:
    """ONNX Runtime's Hardmax along ``axis``: the axis swapped with the last one (into a new
    buffer), each row's Eigen ``maxCoeff()``, then a 1 at the first element equal to it;
    a row whose maximum comes out NaN has none."""
    perm = list(range(x.ndim))
    perm[axis], perm[-1] = perm[-1], perm[axis]
    swapped = np.ascontiguousarray(np.transpose(x, perm))
    rows = swapped.reshape(-1, swapped.shape[-1])
    work = rows.astype(_F32) if rows.dtype.itemsize < 4 else rows
    best = eigen_redux(work, np.arange(rows.shape[0]) * rows.shape[1], True)
    hit = work == best[:, None]
    first = hit & (np.cumsum(hit, axis=1) == 1)
    return np.transpose(first.astype(x.dtype).reshape(swapped.shape), perm)


# -- pooling ---------------------------------------------------------------------------------------


def uses_mlas(dtype: np.dtype, dilations: Sequence[int], storage_order: int, outputs: int) -> bool:
    """Whether ONNX Runtime's MaxPool runs MLAS: float32 (float16 goes through float32), one
    output, row-major, no dilation."""
    return (
        np.dtype(dtype) in (_F32, np.dtype(np.float16))
        and outputs < 2
        and not storage_order
        and all(d == 1 for d in dilations)
    )


def generic_max_pool(
    x: np.ndarray,
    kernel: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    begin: Sequence[int],
    out: Sequence[int],
    storage_order: int,
) -> tuple[np.ndarray, np.ndarray]:
    """ONNX Runtime's MaxPool1D/2D/3DTask: per window, the first element inside the input,
    then each strictly greater one; the value and its flat index (-1 and the lowest value
    for a window of padding alone)."""
    n, c = x.shape[:2]
    spatial = x.shape[2:]
    rank = len(spatial)
    lowest = np.finfo(x.dtype).min if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    acc = np.full((n, c, *out), lowest, dtype=x.dtype)
    index = np.full(acc.shape, -1, dtype=np.int64)
    have = np.zeros((1, 1, *out), dtype=bool)
    if storage_order:
        scale = [math.prod(spatial[:i]) for i in range(rank)]
    else:
        scale = [math.prod(spatial[i + 1 :]) for i in range(rank)]
    plane = (np.arange(n * c, dtype=np.int64) * math.prod(spatial)).reshape(n, c, *[1] * rank)
    for tap in np.ndindex(*kernel):
        grids, valid, flat = [], np.ones((1,) * rank, dtype=bool), np.zeros((1,) * rank, np.int64)
        for axis in range(rank):
            pos = np.arange(out[axis]) * strides[axis] - begin[axis] + tap[axis] * dilations[axis]
            inside = (pos >= 0) & (pos < spatial[axis])
            shape = [1] * rank
            shape[axis] = out[axis]
            clipped = np.clip(pos, 0, spatial[axis] - 1).reshape(shape)
            grids.append(clipped)
            valid = valid & inside.reshape(shape)
            flat = flat + clipped * scale[axis]
        values = x[(slice(None), slice(None), *grids)]
        take = valid & (~have | (values > acc))
        acc = np.where(take, values, acc)
        index = np.where(take, plane + flat, index)
        have = have | valid
    return acc, index


def mlas_max_pool(
    x: np.ndarray,
    kernel: Sequence[int],
    strides: Sequence[int],
    begin: Sequence[int],
    end: Sequence[int],
    out: Sequence[int],
) -> np.ndarray:
    """MLAS's max pooling (float32; float16 through it), kernel by kernel as MLAS picks
    them: global, the 2-D/3-D vectorised kernels, or the generic loops."""
    n, c = x.shape[:2]
    spatial = tuple(x.shape[2:])
    rank = len(spatial)
    planes = np.ascontiguousarray(x, dtype=_F32).reshape(n * c, *spatial)
    if (
        tuple(kernel) == spatial
        and all(s == 1 for s in strides)
        and not any(begin)
        and not any(end)
    ):
        y = _mlas_global(planes.reshape(n * c, -1))
    elif (
        rank >= 2
        and strides[-1] <= 2
        and all(k <= 32 for k in kernel)
        and _MLAS_BUFFER - _MLAS_OVERREAD - max(begin[-1], 0) - max(end[-1], 0) >= spatial[-1]
    ):
        y = _mlas_vector(planes, kernel, strides, begin, end, out)
    else:
        y = _mlas_generic(planes, kernel, strides, begin, out)
    return y.reshape(n, c, *out).astype(x.dtype)


def _lowest() -> np.float32:
    return np.finfo(_F32).min


def _mlas_global(flat: np.ndarray) -> np.ndarray:
    """MlasPoolGlobalKernel: fours of values into a vector (``maxps``), the vector reduced
    across lanes (lanes 0 and 2, 1 and 3, then the two), the rest one by one
    (``std::max``)."""
    sse, std = _sse(True), _std(True)
    acc = np.full((flat.shape[0], 4), _lowest(), _F32)
    whole = flat.shape[1] // 4 * 4
    for i in range(0, whole, 4):
        acc = sse(acc, flat[:, i : i + 4])
    r = sse(sse(acc[:, 0], acc[:, 2]), sse(acc[:, 1], acc[:, 3]))
    for i in range(whole, flat.shape[1]):
        r = std(r, flat[:, i])
    return r


def _mlas_generic(
    planes: np.ndarray,
    kernel: Sequence[int],
    strides: Sequence[int],
    begin: Sequence[int],
    out: Sequence[int],
) -> np.ndarray:
    """MlasPool1D/2D/3DKernel: ``std::max`` from the lowest float over each window (clipped
    to the input): NaN is skipped, and a window of NaN or -inf alone gives the lowest
    float."""
    spatial = planes.shape[1:]
    filled = np.where(np.isnan(planes), _lowest(), planes)
    y = np.full((planes.shape[0], *out), _lowest(), _F32)
    for position in np.ndindex(*out):
        window = [slice(None)]
        for axis, o in enumerate(position):
            start = o * strides[axis] - begin[axis]
            window.append(slice(max(start, 0), max(min(start + kernel[axis], spatial[axis]), 0)))
        part = filled[tuple(window)].reshape(planes.shape[0], -1)
        if part.shape[1]:  # from the lowest float: -inf never beats it
            y[(slice(None), *position)] = np.maximum(part.max(axis=1), _lowest())
    return y


def _rows_of(start: int, size: int, count: int) -> tuple[int, int]:
    """MLAS's row range of a window (``size_t`` arithmetic): a start before the input or
    past its end restarts at row 0; the end is clipped to the input."""
    stop = min(start + count, size)
    return (start if 0 <= start < size else 0), stop


def _mlas_vector(
    planes: np.ndarray,
    kernel: Sequence[int],
    strides: Sequence[int],
    begin: Sequence[int],
    end: Sequence[int],
    out: Sequence[int],
) -> np.ndarray:
    """MlasPool2DVectorKernel / MlasPool3DVectorKernel: each input column reduced over the
    window's rows (and planes), the first ``4 * (width // 4)`` columns with ``maxps``, the
    rest with ``std::max`` (2-D: from the first row; 3-D: from the lowest float), into a
    buffer padded with the lowest float; then each output from ``kernel_w`` consecutive
    buffer entries with ``maxps``, from the first."""
    sse, std = _sse(True), _std(True)
    rank = planes.ndim - 1
    width = planes.shape[-1]
    vector = width // 4 * 4
    left, right = max(begin[-1], 0), max(end[-1], 0)
    stride_w, kernel_w = strides[-1], kernel[-1]
    last = (out[-1] - 1) * stride_w + kernel_w
    size = max(left + width + right + _MLAS_OVERREAD, last)
    picks = np.arange(out[-1]) * stride_w
    y = np.empty((planes.shape[0], *out), _F32)
    for position in np.ndindex(*out[:-1]):
        ranges = [
            _rows_of(p * strides[a] - begin[a], planes.shape[1 + a], kernel[a])
            for a, p in enumerate(position)
        ]
        block = planes[(slice(None), *[slice(lo, hi) for lo, hi in ranges])]
        lines = block.reshape(planes.shape[0], -1, width)  # planes, then rows, in order
        if rank == 2:
            columns = lines[:, 0, :].copy()
            for r in range(1, lines.shape[1]):
                columns[:, :vector] = sse(columns[:, :vector], lines[:, r, :vector])
                columns[:, vector:] = std(columns[:, vector:], lines[:, r, vector:])
        else:
            columns = np.full((planes.shape[0], width), _lowest(), _F32)
            for r in range(lines.shape[1]):
                columns[:, :vector] = sse(columns[:, :vector], lines[:, r, :vector])
                columns[:, vector:] = std(columns[:, vector:], lines[:, r, vector:])
        buffer = np.full((planes.shape[0], size), _lowest(), _F32)
        buffer[:, left : left + width] = columns
        acc = buffer[:, picks]
        for k in range(1, kernel_w):
            acc = sse(acc, buffer[:, picks + k])
        y[(slice(None), *position)] = acc
    return y

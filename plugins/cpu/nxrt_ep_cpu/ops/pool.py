"""Max and average pooling, reduced one axis at a time over padded strided views.

A window's max (or sum) is the max over its rows of the max over its
columns, so a ``k x k`` window takes ``2 (k - 1)`` whole-array passes
instead of ``k * k - 1``, and the second axis runs on the already reduced,
smaller array. Indices (MaxPool's second output) are computed only when the
node has that output.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, cast

import numpy as np

from nxrt.kernel import attribute_values
from nxrt_ep_cpu.compiling import compiled_kernel
from nxrt_ep_cpu.kernels import CpuKernel, compiled
from nxrt_ep_cpu.ops._nan_order import generic_max_pool, mlas_max_pool, uses_mlas
from nxrt_ep_cpu.ops._registry import op
from nxrt_ep_cpu.ops._spatial import Windows, lowest, pad_for, tap_views, windows

if TYPE_CHECKING:
    import onnx_ir as ir

    from nxrt.host_parallel import HostParallel
    from nxrt.kernel import Kernel
    from nxrt.provider import ExecutionProvider

#: Input values from which a compiled pool splits its planes across the session's pool:
#: about 200 µs of work on one core, so that the half saved outweighs waking a pool
#: thread (50-150 µs).
_PARALLEL_VALUES = 1 << 19

# One function per op serves every version: each version's attributes are a subset of
# the latest's, with the same defaults (the ONNX checker refuses the others). MaxPool 8
# adds the Indices output and ``storage_order``, 10 ``ceil_mode`` and ``dilations``;
# AveragePool 7 adds ``count_include_pad`` (padding is never counted before), 10
# ``ceil_mode``, 19 ``dilations``.


def _pool_kernel(ep: ExecutionProvider, node: ir.Node) -> Kernel:
    """A MaxPool's or AveragePool's kernel: its attributes bound with the session's thread
    pool; the compiled loops built through :func:`~nxrt_ep_cpu.compiling.compiled_kernel`
    (the numpy windows run until then)."""
    attrs = attribute_values(node)
    if node.op_type == "MaxPool":
        fn = max_pool
        attrs["_n_outputs"] = len(node.outputs)
    else:
        fn = average_pool
    attrs["_parallel"] = ep.parallel

    def fast() -> CpuKernel:
        from nxrt_ep_cpu.jit import pool as compiled

        # compiled (or loaded from the disk cache) now, with a run's argument types, no planes
        none, counts = np.zeros((0, 1, 1), np.float32), np.ones(1, np.int64)
        geometry = np.ones(9, np.int64)
        if node.op_type == "MaxPool":
            compiled.max_pool2d(none, none, geometry, 0, 0)
        else:
            compiled.average_pool2d(none, none, geometry, counts, counts, 0, 0)
        return CpuKernel(fn, attrs)

    return compiled_kernel(ep, node, fast, lambda: CpuKernel(fn, {**attrs, "_compiled": False}))


def _global_pool_kernel(ep: ExecutionProvider, node: ir.Node) -> Kernel:
    """GlobalAveragePool's kernel: the compiled mean of float32 planes once built (numpy's
    mean until then)."""
    return compiled_kernel(
        ep,
        node,
        lambda: CpuKernel(global_average_pool, {}),
        lambda: CpuKernel(global_average_pool, {"_compiled": False}),
    )


@op("MaxPool", since=(1, 8, 10, 11, 12, 22), factory=_pool_kernel)
def max_pool(
    x: np.ndarray,
    /,
    *,
    auto_pad: str = "NOTSET",
    ceil_mode: int = 0,
    dilations: list[int] | None = None,
    kernel_shape: list[int],
    pads: list[int] | None = None,
    storage_order: int = 0,
    strides: list[int] | None = None,
    _n_outputs: int = 2,
    _parallel: HostParallel | None = None,
    _compiled: bool = True,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Max over each window; the Indices output only when the node has it."""
    win = windows(
        x.shape[2:],
        kernel_shape,
        strides=strides,
        dilations=dilations,
        pads=pads,
        auto_pad=auto_pad,
        ceil_mode=ceil_mode,
    )
    if 0 in win.out:  # a window longer than its padded input: no output (the spec's size)
        y = np.empty(x.shape[:2] + win.out, dtype=x.dtype)
        return y if _n_outputs < 2 else (y, np.empty(y.shape, dtype=np.int64))
    if _n_outputs < 2:  # nobody reads Indices: skip computing them
        if _compiled and _compiled_suits(x, win) and max(win.strides) > 1:  # stride 1: numpy's
            y = _compiled_pool(x, win, None, _parallel)
        else:
            y = _max(x, win)
        if y.dtype.kind == "f" and not np.isfinite(y).all():
            return _nan_max_pool(x, win, storage_order, 1)[0]
        return y
    y, indices = _max_with_indices(x, win, storage_order)
    if y.dtype.kind == "f" and np.isnan(y).any():
        # two outputs: the generic loop, which gives the indices
        return cast("tuple[np.ndarray, np.ndarray]", _nan_max_pool(x, win, storage_order, 2))
    return y, indices


def _nan_max_pool(
    x: np.ndarray, win: Windows, storage_order: int, outputs: int
) -> tuple[np.ndarray, np.ndarray | None]:
    """MaxPool over windows holding NaN (or, through MLAS, -inf alone), where the spec
    says nothing: ONNX Runtime's result, whose kernels each skip or keep a NaN by where
    it sits (:mod:`._nan_order`)."""
    if uses_mlas(x.dtype, win.dilations, storage_order, outputs) and len(win.kernel) <= 3:
        return mlas_max_pool(x, win.kernel, win.strides, win.begin, win.end, win.out), None
    return generic_max_pool(
        x, win.kernel, win.strides, win.dilations, win.begin, win.out, storage_order
    )


@op("AveragePool", since=(1, 7, 10, 11, 19, 22), factory=_pool_kernel)
def average_pool(
    x: np.ndarray,
    /,
    *,
    auto_pad: str = "NOTSET",
    ceil_mode: int = 0,
    count_include_pad: int = 0,
    dilations: list[int] | None = None,
    kernel_shape: list[int],
    pads: list[int] | None = None,
    strides: list[int] | None = None,
    _parallel: HostParallel | None = None,
    _compiled: bool = True,
) -> np.ndarray:
    """Mean over each window, padding counted only with ``count_include_pad``."""
    win = windows(
        x.shape[2:],
        kernel_shape,
        strides=strides,
        dilations=dilations,
        pads=pads,
        auto_pad=auto_pad,
        ceil_mode=ceil_mode,
    )
    if _compiled and _compiled_suits(x, win):
        counts = _window_counts(x.shape[2:], win, count_include_pad)
        return _compiled_pool(x, win, counts, _parallel)
    return _average(x, win, count_include_pad)


@op("GlobalAveragePool", since=(1, 22), factory=_global_pool_kernel)
def global_average_pool(x: np.ndarray, /, *, _compiled: bool = True) -> np.ndarray:
    """Mean over every spatial axis, kept as size-1 axes (float32 in a compiled loop)."""
    if _compiled and x.dtype == np.float32 and x.ndim > 2 and x.size > 0:
        rows = np.ascontiguousarray(x).reshape(x.shape[0] * x.shape[1], -1)
        out = np.empty(x.shape[:2] + (1,) * (x.ndim - 2), np.float32)
        compiled("pool").global_average(rows, out.reshape(-1))
        return out
    return np.mean(x, axis=tuple(range(2, x.ndim)), keepdims=True)


@op("GlobalMaxPool", since=(1, 22))
def global_max_pool(x: np.ndarray, /) -> np.ndarray:
    """Max over every spatial axis, kept as size-1 axes; over a NaN, ONNX Runtime's result
    (its float32 kernel, which float16 goes through, is MLAS's global pool)."""
    y = np.max(x, axis=tuple(range(2, x.ndim)), keepdims=True)
    if x.dtype in (np.float32, np.float16) and 2 < x.ndim <= 5 and not np.isfinite(y).all():
        spatial = x.shape[2:]
        zeros = (0,) * len(spatial)
        return mlas_max_pool(x, spatial, (1,) * len(spatial), zeros, zeros, (1,) * len(spatial))
    return y


def _compiled_suits(x: np.ndarray, win: Windows) -> bool:
    """Whether the compiled loops (``jit/pool.py``) take this pool: float32, 1-D or 2-D,
    no cropping pads, a non-empty output."""
    return (
        x.dtype == np.float32
        and x.ndim in (3, 4)
        and x.size > 0
        and 0 not in win.out
        and min(*win.begin, *win.end) >= 0
    )


def _compiled_pool(
    x: np.ndarray,
    win: Windows,
    counts: tuple[np.ndarray, ...] | None,
    parallel: HostParallel | None,
) -> np.ndarray:
    """A 2-D max pool (``counts`` None) or average pool (``counts``: each window's element
    count per axis) through the compiled loops, planes split across ``parallel``."""
    from nxrt_ep_cpu.jit import pool as compiled

    one_d = x.ndim == 3
    if one_d:  # a 1-D pool is a 2-D one of height 1
        x = x[:, :, None, :]
        win = Windows(
            (1, *win.kernel),
            (1, *win.strides),
            (1, *win.dilations),
            (0, *win.begin),
            (0, *win.end),
            (1, *win.out),
        )
        if counts is not None:
            counts = (np.ones(1, np.int64), counts[0])
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (dh, dw) = win.kernel, win.strides, win.dilations
    ho, wo = win.out
    pl = win.begin[1]
    wq = max(-(-(w + pl) // sw), (kw - 1) * dw // sw + wo)
    geometry = np.array([kh, kw, sh, sw, dh, dw, win.begin[0], pl, wq], np.int64)
    planes = np.ascontiguousarray(x).reshape(n * c, h, w)
    out = np.empty((n * c, ho, wo), np.float32)

    def work(part: range) -> None:
        if counts is None:
            compiled.max_pool2d(planes, out, geometry, part.start, part.stop)
        else:
            compiled.average_pool2d(planes, out, geometry, *counts, part.start, part.stop)

    if parallel is None or parallel.threads < 2 or n * c < 2 or x.size < _PARALLEL_VALUES:
        work(range(n * c))
    else:
        parallel.map(work, parallel.split(n * c))
    out = out.reshape(n, c, ho, wo)
    return out[:, :, 0, :] if one_d else out


def _window_counts(
    spatial: tuple[int, ...], win: Windows, count_include_pad: int
) -> tuple[np.ndarray, ...]:
    """Per axis, how many of each window's taps an average counts: those inside the input,
    or inside the declared padding too with ``count_include_pad`` (never past it)."""
    counts = []
    for i, size in enumerate(spatial):
        b, e = win.begin[i], win.end[i]
        pos = np.arange(win.out[i])[:, None] * win.strides[i]
        pos = pos + np.arange(win.kernel[i])[None, :] * win.dilations[i]
        lo, hi = (0, size + b + e) if count_include_pad else (b, b + size)
        counts.append(((pos >= lo) & (pos < hi)).sum(axis=1).astype(np.int64))
    return tuple(counts)


def _max(x: np.ndarray, win: Windows) -> np.ndarray:
    return _reduce_windows(x, win, np.maximum, lowest(x.dtype))


def _max_padded(xp: np.ndarray, win: Windows) -> np.ndarray:
    """Max over the windows of an input already padded with the lowest value."""
    unpadded = Windows(
        win.kernel,
        win.strides,
        win.dilations,
        (0,) * len(win.kernel),
        (0,) * len(win.kernel),
        win.out,
    )
    return _reduce_windows(xp, unpadded, np.maximum, lowest(xp.dtype))


def _reduce_windows(
    x: np.ndarray, win: Windows, ufunc: np.ufunc, identity: float | int
) -> np.ndarray:
    """``ufunc``-reduce every window of ``x``, one spatial axis after the other.

    Padding is never materialised: each kernel tap updates only the outputs
    whose input lies inside ``x`` (padding counts as ``identity``). A tap
    that is inside for every output starts the result as a copy; otherwise
    it starts at ``identity``. Always returns a new array.
    """
    lead = x.ndim - len(win.kernel)
    if 0 in win.out:
        return np.empty(x.shape[:lead] + win.out, dtype=x.dtype)
    if _whole(x.shape[lead:], win):  # one window covering everything: a plain reduction
        flat = x.reshape(x.shape[:lead] + (-1,))
        return ufunc.reduce(flat, axis=-1).reshape(x.shape[:lead] + (1,) * len(win.kernel))
    y = x
    for axis, (k, s, d, n, p) in enumerate(
        zip(win.kernel, win.strides, win.dilations, win.out, win.begin, strict=True)
    ):
        before = (slice(None),) * (lead + axis)
        size = y.shape[lead + axis]
        spans = []  # per tap: the outputs [lo, hi) it reaches, and its input offset
        for t in range(k):
            offset = t * d - p
            lo = max(0, -(offset // s))  # first output whose input index is >= 0
            hi = min(n, (size - 1 - offset) // s + 1) if size - 1 - offset >= 0 else 0
            spans.append((lo, hi, offset))
        full = next((t for t, (lo, hi, _) in enumerate(spans) if (lo, hi) == (0, n)), None)
        if lead + axis == y.ndim - 1 and s == 1 and full is not None and y.flags.c_contiguous:
            y = _reduce_last_axis(y, spans, full, n, ufunc)
            continue
        if full is not None:
            offset = spans[full][2]
            acc = y[before + (slice(offset, offset + s * (n - 1) + 1, s),)].copy()
        else:
            shape = list(y.shape)
            shape[lead + axis] = n
            acc = np.full(shape, identity, dtype=y.dtype)
        for t, (lo, hi, offset) in enumerate(spans):
            if t == full or lo >= hi:
                continue
            source = slice(lo * s + offset, (hi - 1) * s + offset + 1, s)
            target = acc[before + (slice(lo, hi),)]
            ufunc(target, y[before + (source,)], out=target)
        y = acc
    return y


def _reduce_last_axis(
    y: np.ndarray, spans: list[tuple[int, int, int]], full: int, n: int, ufunc: np.ufunc
) -> np.ndarray:
    """The stride-1 last-axis pass on whole rows at once: each tap is a shift of the
    flattened array (one long, fast ufunc call instead of one short call per row), then
    the few edge columns, where a shift crosses into the neighbouring row, are redone."""
    size = y.shape[-1]
    offset = spans[full][2]
    acc = y[..., offset : offset + n].copy()  # a new array: y is read below
    flat_acc, flat_y = acc.reshape(-1), y.reshape(-1)
    edges: set[int] = set()
    for t, (lo, hi, shift) in enumerate(spans):
        if t == full or lo >= hi:
            continue
        if n == size:  # rows line up: one shifted call covers every row
            count = flat_acc.size - abs(shift)
            target = flat_acc[max(0, -shift) : max(0, -shift) + count]
            ufunc(target, flat_y[max(0, shift) : max(0, shift) + count], out=target)
            edges.update(range(0, lo))
            edges.update(range(hi, n))
        else:
            target = acc[..., lo:hi]
            ufunc(target, y[..., lo + shift : hi + shift], out=target)
    for column in sorted(edges):  # redo the columns the row-crossing shifts spoiled
        target = acc[..., column]
        first = y[..., column + spans[full][2]]
        for t, (lo, hi, shift) in enumerate(spans):
            if t != full and lo <= column < hi:
                ufunc(first, y[..., column + shift], out=target)
                first = target
        if first is not target:
            np.copyto(target, first)
    return acc


def _whole(spatial: tuple[int, ...], win: Windows) -> bool:
    """Whether the only window is the whole, unpadded input (a global pool in disguise)."""
    return (
        win.out == (1,) * len(spatial)
        and win.kernel == tuple(spatial)
        and not any(win.begin)
        and not any(win.end)
        and all(d == 1 for d in win.dilations)
    )


def _max_with_indices(
    x: np.ndarray, win: Windows, storage_order: int
) -> tuple[np.ndarray, np.ndarray]:
    """Max and the flat index of its first occurrence in ``x`` (ONNX's Indices rule).

    Indices ignore padding and count over ``N x C x spatial``; with
    ``storage_order=1`` the spatial part is column-major. An input position is
    ``o*s - begin + t*d`` per axis, so an index splits into a part from the
    output position and a part from the tap: only the winning tap number is
    tracked per output (a small-integer minimum, cheap in numpy).
    """
    n, c = x.shape[:2]
    spatial = x.shape[2:]
    rank = len(spatial)
    if storage_order:
        scale = [math.prod(spatial[:i]) for i in range(rank)]
    else:
        scale = [math.prod(spatial[i + 1 :]) for i in range(rank)]
    xp = pad_for(x, win, lowest(x.dtype))
    y = _max_padded(xp, win)
    taps = win.taps
    first = np.full(y.shape, taps, dtype=np.min_scalar_type(taps))  # `taps` means not found
    equal = np.empty(y.shape, dtype=bool)
    candidate = np.empty_like(first)
    tap_offset = np.zeros(taps + 1, dtype=np.int64)  # the extra entry: nothing matched
    # a NaN max is NaN's own index, the first one in the window (as numpy's argmax)
    nan_max = np.isnan(y) if y.dtype.kind == "f" else None
    if nan_max is not None and not nan_max.any():
        nan_max = None
    padded = any(win.begin) or any(win.end) or xp.shape[2:] != x.shape[2:]
    for i, (tap, view) in enumerate(tap_views(xp, win)):
        tap_offset[i] = sum(t * d * k for t, d, k in zip(tap, win.dilations, scale, strict=True))
        np.equal(view, y, out=equal)
        if nan_max is not None:
            equal |= np.isnan(view) & nan_max
        if padded:  # a padding tap holds the dtype's lowest value: it must never win
            equal &= _inside(tap, win, spatial)
        # candidate = i where equal, else `taps`
        np.multiply(equal.view(np.uint8), taps - i, out=candidate, casting="unsafe")
        np.subtract(taps, candidate, out=candidate, casting="unsafe")
        np.minimum(first, candidate, out=first)
    indices = tap_offset[first]
    for axis in range(rank):
        start = np.arange(win.out[axis], dtype=np.int64) * win.strides[axis] - win.begin[axis]
        shape = [1] * rank
        shape[axis] = win.out[axis]
        indices += (start * scale[axis]).reshape(shape)
    planes = np.arange(n * c, dtype=np.int64) * math.prod(spatial)
    indices += planes.reshape((n, c) + (1,) * rank)
    if padded:  # a window of padding alone has no element to point at
        indices[first == taps] = -1
    return y, indices


def _inside(tap: tuple[int, ...], win: Windows, spatial: tuple[int, ...]) -> np.ndarray:
    """For one kernel tap, which output positions read it from inside the input."""
    mask = np.ones((1,) * len(spatial), dtype=bool)
    for axis, (t, size) in enumerate(zip(tap, spatial, strict=True)):
        pos = (
            np.arange(win.out[axis]) * win.strides[axis] - win.begin[axis] + t * win.dilations[axis]
        )
        shape = [1] * len(spatial)
        shape[axis] = win.out[axis]
        mask = mask & ((pos >= 0) & (pos < size)).reshape(shape)
    return mask


def _average(x: np.ndarray, win: Windows, count_include_pad: int) -> np.ndarray:
    """Sum over taps on a zero-padded input, divided by each window's element count.

    The count is separable: per axis, how many of a window's taps land inside
    the input (or inside the declared padding when ``count_include_pad``).
    """
    total = _reduce_windows(x, win, np.add, 0)
    divisor = np.ones((), dtype=np.int64)
    for count in _window_counts(x.shape[2:], win, count_include_pad):
        divisor = np.multiply.outer(divisor, count)
    total /= divisor.astype(x.dtype)
    return total

"""Reductions (ReduceSum ... ReduceLogSumExp, ArgMax/ArgMin, CumSum/CumProd, LpPool).

Every Reduce op has two forms: ``axes`` as an attribute (before opset 18,
before 13 for ReduceSum) and ``axes`` as an optional input with
``noop_with_empty_axes``. Both resolve to a tuple of axes handed to one
shared kernel per op; ``()`` means "reduce over nothing", which still applies
the op's element transform (ReduceSumSquare squares, ReduceL1 takes abs), as
the ops' function bodies do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from nxrt.errors import KernelFailed
from nxrt_ep_cpu.ops._nan_order import ort_arg_extreme, ort_reduce_extreme
from nxrt_ep_cpu.ops._registry import op
from nxrt_ep_cpu.ops._spatial import pad_for, tap_views, windows

# -- axes -------------------------------------------------------------------------------------


def _axes_attr(data: np.ndarray, axes: Sequence[int] | None) -> tuple[int, ...]:
    """Axes given as an attribute: absent or empty means every axis."""
    if axes is None or len(axes) == 0:
        return tuple(range(data.ndim))
    return _normalize(data, [int(a) for a in axes])


def _axes_input(
    data: np.ndarray, axes: np.ndarray | None, noop_with_empty_axes: int
) -> tuple[int, ...]:
    """Axes given as an input: absent or empty means every axis, or none with ``noop``."""
    if axes is None or np.size(axes) == 0:
        return () if noop_with_empty_axes else tuple(range(data.ndim))
    return _normalize(data, np.asarray(axes).reshape(-1).tolist())


def _normalize(data: np.ndarray, axes: list[int]) -> tuple[int, ...]:
    rank = data.ndim
    if rank == 0:  # a scalar: axis 0 or -1 name it, and there is nothing to reduce
        if any(a not in (0, -1) for a in axes):
            raise KernelFailed(f"reduction axes {axes} are out of range for a scalar input")
        return ()
    out = []
    for a in axes:
        if not -rank <= a < rank:
            raise KernelFailed(f"reduction axis {a} is out of range for a rank-{rank} input")
        out.append(a + rank if a < 0 else a)
    if len(set(out)) != len(out):
        raise KernelFailed(f"reduction axes {axes} repeat an axis")
    return tuple(sorted(out))


def _finish(y, dtype: np.dtype, keepdims: int, axes: tuple[int, ...]) -> np.ndarray:
    """Drop the kept axes when ``keepdims=0`` and restore the input dtype."""
    y = np.asarray(y)
    if not keepdims and axes:
        y = np.squeeze(y, axis=axes)
    return y.astype(dtype, copy=False)


def _accumulator(dtype: np.dtype) -> np.dtype:
    """Sum small floats (float16, bfloat16 ...) in float32; keep every other dtype."""
    if dtype.kind == "V" or (dtype.kind == "f" and dtype.itemsize < 4):
        return np.dtype(np.float32)
    if dtype == np.bool_:
        return np.dtype(np.int64)
    return dtype


def _sum(x: np.ndarray, axes: tuple[int, ...], keepdims: int) -> np.ndarray:
    acc = _accumulator(x.dtype)
    return _finish(np.sum(x, axis=axes, dtype=acc, keepdims=True), x.dtype, keepdims, axes)


def _sum_square(x: np.ndarray, axes: tuple[int, ...], keepdims: int) -> np.ndarray:
    acc = _accumulator(x.dtype)
    xa = x.astype(acc, copy=False)
    return _finish(np.sum(xa * xa, axis=axes, keepdims=True), x.dtype, keepdims, axes)


def _l1(x: np.ndarray, axes: tuple[int, ...], keepdims: int) -> np.ndarray:
    acc = _accumulator(x.dtype)
    y = np.sum(np.abs(x.astype(acc, copy=False)), axis=axes, keepdims=True)
    return _finish(y, x.dtype, keepdims, axes)


def _l2(x: np.ndarray, axes: tuple[int, ...], keepdims: int) -> np.ndarray:
    acc = _accumulator(x.dtype)
    if acc.kind in "iu":  # the squares may overflow where the result does not
        acc = np.dtype(np.float64)
    xa = x.astype(acc, copy=False)
    y = np.sqrt(np.sum(xa * xa, axis=axes, keepdims=True))
    return _finish(y, x.dtype, keepdims, axes)


def _mean(x: np.ndarray, axes: tuple[int, ...], keepdims: int) -> np.ndarray:
    acc = _accumulator(x.dtype)
    if acc.kind not in "fc":
        acc = np.dtype(np.float64)
    if x.size == 0:  # the spec leaves the mean of nothing undefined; onnxruntime gives 0
        return _finish(np.sum(x, axis=axes, dtype=acc, keepdims=True), x.dtype, keepdims, axes)
    y = np.mean(x, axis=axes, dtype=acc, keepdims=True)
    return _finish(y, x.dtype, keepdims, axes)


def _prod(x: np.ndarray, axes: tuple[int, ...], keepdims: int) -> np.ndarray:
    acc = _accumulator(x.dtype)
    return _finish(np.prod(x, axis=axes, dtype=acc, keepdims=True), x.dtype, keepdims, axes)


def _extreme(
    fn: Callable, x: np.ndarray, axes: tuple[int, ...], keepdims: int, largest: bool
) -> np.ndarray:
    """Max or min; an empty set gives the dtype's lowest (max) or highest (min) value.

    Where a NaN is reduced (numpy's max is then NaN) the spec says nothing, and nxrt
    gives ONNX Runtime's answer, which depends on where the NaN sits
    (:func:`~nxrt_ep_cpu.ops._nan_order.ort_reduce_extreme`).
    """
    kwargs = {}
    if x.size == 0:
        kwargs["initial"] = _limit(x.dtype, lowest=largest)
    y = fn(x, axis=axes, keepdims=True, **kwargs)
    if axes and x.dtype.kind == "f" and x.size and np.isnan(y).any():
        y = ort_reduce_extreme(x, axes, largest)
    return _finish(y, x.dtype, keepdims, axes)


def _limit(dtype: np.dtype, lowest: bool):
    if dtype == np.bool_:
        return not lowest
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return info.min if lowest else info.max
    return -np.inf if lowest else np.inf


def _max(x: np.ndarray, axes: tuple[int, ...], keepdims: int) -> np.ndarray:
    return _extreme(np.max, x, axes, keepdims, largest=True)


def _min(x: np.ndarray, axes: tuple[int, ...], keepdims: int) -> np.ndarray:
    return _extreme(np.min, x, axes, keepdims, largest=False)


def _log_sum(x: np.ndarray, axes: tuple[int, ...], keepdims: int) -> np.ndarray:
    acc = _accumulator(x.dtype)
    if acc.kind not in "fc":
        acc = np.dtype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):  # an empty set gives -inf
        y = np.log(np.sum(x, axis=axes, dtype=acc, keepdims=True))
    return _finish(y, x.dtype, keepdims, axes)


def _log_sum_exp(x: np.ndarray, axes: tuple[int, ...], keepdims: int) -> np.ndarray:
    """``log(sum(exp(x)))`` shifted by the finite maximum so large values do not overflow."""
    acc = _accumulator(x.dtype)
    if acc.kind not in "fc":
        acc = np.dtype(np.float64)
    xa = x.astype(acc, copy=False)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if x.size == 0:
            shift = np.zeros([1 if i in axes else n for i, n in enumerate(x.shape)], acc)
        else:
            finite = np.where(np.isfinite(xa), xa, -np.inf)
            shift = np.max(finite, axis=axes, keepdims=True)
            shift = np.where(np.isfinite(shift), shift, 0).astype(acc, copy=False)
        y = np.log(np.sum(np.exp(xa - shift), axis=axes, keepdims=True)) + shift
    return _finish(y, x.dtype, keepdims, axes)


# -- the ops: axes as an attribute, then axes as an input --------------------------------------


@op("ReduceSum", since=(1, 11))
def reduce_sum_1(data: np.ndarray, /, *, axes: list[int] | None = None, keepdims: int = 1):
    """Sum over ``axes`` (an attribute; all axes when absent)."""
    return _sum(data, _axes_attr(data, axes), keepdims)


@op("ReduceSum", since=13)
def reduce_sum(
    data: np.ndarray,
    axes: np.ndarray | None = None,
    /,
    *,
    keepdims: int = 1,
    noop_with_empty_axes: int = 0,
) -> np.ndarray:
    """Sum over the ``axes`` input (opset 13 moved it from the attributes)."""
    return _sum(data, _axes_input(data, axes, noop_with_empty_axes), keepdims)


@op("ReduceSumSquare", since=(1, 11, 13))
def reduce_sum_square_1(
    data: np.ndarray, /, *, axes: list[int] | None = None, keepdims: int = 1
) -> np.ndarray:
    """Sum of squares over ``axes`` (an attribute)."""
    return _sum_square(data, _axes_attr(data, axes), keepdims)


@op("ReduceSumSquare", since=18)
def reduce_sum_square(
    data: np.ndarray,
    axes: np.ndarray | None = None,
    /,
    *,
    keepdims: int = 1,
    noop_with_empty_axes: int = 0,
) -> np.ndarray:
    """Sum of squares over the ``axes`` input."""
    return _sum_square(data, _axes_input(data, axes, noop_with_empty_axes), keepdims)


@op("ReduceMean", since=(1, 11, 13))
def reduce_mean_1(
    data: np.ndarray, /, *, axes: list[int] | None = None, keepdims: int = 1
) -> np.ndarray:
    """Mean over ``axes`` (an attribute)."""
    return _mean(data, _axes_attr(data, axes), keepdims)


@op("ReduceMean", since=18)
def reduce_mean(
    data: np.ndarray,
    axes: np.ndarray | None = None,
    /,
    *,
    keepdims: int = 1,
    noop_with_empty_axes: int = 0,
) -> np.ndarray:
    """Mean over the ``axes`` input."""
    return _mean(data, _axes_input(data, axes, noop_with_empty_axes), keepdims)


@op("ReduceProd", since=(1, 11, 13))
def reduce_prod_1(
    data: np.ndarray, /, *, axes: list[int] | None = None, keepdims: int = 1
) -> np.ndarray:
    """Product over ``axes`` (an attribute)."""
    return _prod(data, _axes_attr(data, axes), keepdims)


@op("ReduceProd", since=18)
def reduce_prod(
    data: np.ndarray,
    axes: np.ndarray | None = None,
    /,
    *,
    keepdims: int = 1,
    noop_with_empty_axes: int = 0,
) -> np.ndarray:
    """Product over the ``axes`` input."""
    return _prod(data, _axes_input(data, axes, noop_with_empty_axes), keepdims)


@op("ReduceMax", since=(1, 11, 12, 13))
def reduce_max_1(
    data: np.ndarray, /, *, axes: list[int] | None = None, keepdims: int = 1
) -> np.ndarray:
    """Maximum over ``axes`` (an attribute)."""
    return _max(data, _axes_attr(data, axes), keepdims)


@op("ReduceMax", since=(18, 20))
def reduce_max(
    data: np.ndarray,
    axes: np.ndarray | None = None,
    /,
    *,
    keepdims: int = 1,
    noop_with_empty_axes: int = 0,
) -> np.ndarray:
    """Maximum over the ``axes`` input (opset 20 adds bool)."""
    return _max(data, _axes_input(data, axes, noop_with_empty_axes), keepdims)


@op("ReduceMin", since=(1, 11, 12, 13))
def reduce_min_1(
    data: np.ndarray, /, *, axes: list[int] | None = None, keepdims: int = 1
) -> np.ndarray:
    """Minimum over ``axes`` (an attribute)."""
    return _min(data, _axes_attr(data, axes), keepdims)


@op("ReduceMin", since=(18, 20))
def reduce_min(
    data: np.ndarray,
    axes: np.ndarray | None = None,
    /,
    *,
    keepdims: int = 1,
    noop_with_empty_axes: int = 0,
) -> np.ndarray:
    """Minimum over the ``axes`` input (opset 20 adds bool)."""
    return _min(data, _axes_input(data, axes, noop_with_empty_axes), keepdims)


@op("ReduceL1", since=(1, 11, 13))
def reduce_l1_1(
    data: np.ndarray, /, *, axes: list[int] | None = None, keepdims: int = 1
) -> np.ndarray:
    """Sum of absolute values over ``axes`` (an attribute)."""
    return _l1(data, _axes_attr(data, axes), keepdims)


@op("ReduceL1", since=18)
def reduce_l1(
    data: np.ndarray,
    axes: np.ndarray | None = None,
    /,
    *,
    keepdims: int = 1,
    noop_with_empty_axes: int = 0,
) -> np.ndarray:
    """Sum of absolute values over the ``axes`` input."""
    return _l1(data, _axes_input(data, axes, noop_with_empty_axes), keepdims)


@op("ReduceL2", since=(1, 11, 13))
def reduce_l2_1(
    data: np.ndarray, /, *, axes: list[int] | None = None, keepdims: int = 1
) -> np.ndarray:
    """Euclidean norm over ``axes`` (an attribute)."""
    return _l2(data, _axes_attr(data, axes), keepdims)


@op("ReduceL2", since=18)
def reduce_l2(
    data: np.ndarray,
    axes: np.ndarray | None = None,
    /,
    *,
    keepdims: int = 1,
    noop_with_empty_axes: int = 0,
) -> np.ndarray:
    """Euclidean norm over the ``axes`` input."""
    return _l2(data, _axes_input(data, axes, noop_with_empty_axes), keepdims)


@op("ReduceLogSum", since=(1, 11, 13))
def reduce_log_sum_1(
    data: np.ndarray, /, *, axes: list[int] | None = None, keepdims: int = 1
) -> np.ndarray:
    """``log(sum(x))`` over ``axes`` (an attribute)."""
    return _log_sum(data, _axes_attr(data, axes), keepdims)


@op("ReduceLogSum", since=(18, 28))
def reduce_log_sum(
    data: np.ndarray,
    axes: np.ndarray | None = None,
    /,
    *,
    keepdims: int = 1,
    noop_with_empty_axes: int = 0,
) -> np.ndarray:
    """``log(sum(x))`` over the ``axes`` input (opset 28 allows floats only)."""
    return _log_sum(data, _axes_input(data, axes, noop_with_empty_axes), keepdims)


@op("ReduceLogSumExp", since=(1, 11, 13))
def reduce_log_sum_exp_1(
    data: np.ndarray, /, *, axes: list[int] | None = None, keepdims: int = 1
) -> np.ndarray:
    """``log(sum(exp(x)))`` over ``axes`` (an attribute)."""
    return _log_sum_exp(data, _axes_attr(data, axes), keepdims)


@op("ReduceLogSumExp", since=(18, 28))
def reduce_log_sum_exp(
    data: np.ndarray,
    axes: np.ndarray | None = None,
    /,
    *,
    keepdims: int = 1,
    noop_with_empty_axes: int = 0,
) -> np.ndarray:
    """``log(sum(exp(x)))`` over the ``axes`` input (opset 28 allows floats only)."""
    return _log_sum_exp(data, _axes_input(data, axes, noop_with_empty_axes), keepdims)


# -- ArgMax / ArgMin ----------------------------------------------------------------------------


def _arg(
    fn: Callable, data: np.ndarray, axis: int, keepdims: int, select_last_index: int
) -> np.ndarray:
    """Index of the first (or last) extreme along ``axis``, as int64."""
    rank = data.ndim
    if not -rank <= axis < max(rank, 1):
        raise KernelFailed(f"axis {axis} is out of range for a rank-{rank} input")
    axis = axis + rank if axis < 0 else axis
    if data.shape[axis] == 0:
        shape = list(data.shape)
        shape[axis] = 1
        if 0 not in shape:
            raise KernelFailed("ArgMax/ArgMin over an empty axis has no answer")
        if not keepdims:
            del shape[axis]
        return np.zeros(shape, dtype=np.int64)  # an empty result needs no answer
    if data.dtype.kind == "f" and np.isnan(data).any():  # the spec is silent: ORT's answer
        y = ort_arg_extreme(data, axis, fn is np.argmax, bool(select_last_index))
    elif select_last_index:
        last = data.shape[axis] - 1
        y = last - fn(np.flip(data, axis=axis), axis=axis, keepdims=True)
    else:
        y = fn(data, axis=axis, keepdims=True)
    if not keepdims:
        y = np.squeeze(y, axis=axis)
    return np.asarray(y, dtype=np.int64)


@op("ArgMax", since=(1, 11))
def arg_max_1(data: np.ndarray, /, *, axis: int = 0, keepdims: int = 1) -> np.ndarray:
    """Index of the first maximum along ``axis``."""
    return _arg(np.argmax, data, axis, keepdims, 0)


@op("ArgMax", since=(12, 13))
def arg_max(
    data: np.ndarray, /, *, axis: int = 0, keepdims: int = 1, select_last_index: int = 0
) -> np.ndarray:
    """Index of the first (or, with ``select_last_index``, last) maximum along ``axis``."""
    return _arg(np.argmax, data, axis, keepdims, select_last_index)


@op("ArgMin", since=(1, 11))
def arg_min_1(data: np.ndarray, /, *, axis: int = 0, keepdims: int = 1) -> np.ndarray:
    """Index of the first minimum along ``axis``."""
    return _arg(np.argmin, data, axis, keepdims, 0)


@op("ArgMin", since=(12, 13))
def arg_min(
    data: np.ndarray, /, *, axis: int = 0, keepdims: int = 1, select_last_index: int = 0
) -> np.ndarray:
    """Index of the first (or, with ``select_last_index``, last) minimum along ``axis``."""
    return _arg(np.argmin, data, axis, keepdims, select_last_index)


# -- CumSum / CumProd ---------------------------------------------------------------------------


def _scan(
    fn: Callable, identity: int, x: np.ndarray, axis: np.ndarray, exclusive: int, reverse: int
) -> np.ndarray:
    """Inclusive or exclusive running sum/product along ``axis``, either direction."""
    if np.size(axis) != 1:
        raise KernelFailed(f"the axis input must hold one value, got shape {np.shape(axis)}")
    a = int(np.asarray(axis).reshape(-1)[0])
    rank = x.ndim
    if not -rank <= a < rank:
        raise KernelFailed(f"axis {a} is out of range for a rank-{rank} input")
    a = a + rank if a < 0 else a
    if reverse:
        x = np.flip(x, axis=a)
    if exclusive and x.shape[a] > 0:
        head = np.full(x.shape[:a] + (1,) + x.shape[a + 1 :], identity, dtype=x.dtype)
        body = x[(slice(None),) * a + (slice(0, -1),)]
        x = np.concatenate([head, body], axis=a)
    acc = _accumulator(x.dtype) if x.dtype != np.bool_ else x.dtype
    y = fn(x, axis=a, dtype=acc).astype(x.dtype, copy=False)
    if reverse:
        y = np.flip(y, axis=a)
    return np.ascontiguousarray(y)


@op("CumSum", since=(11, 14))
def cum_sum(
    x: np.ndarray, axis: np.ndarray, /, *, exclusive: int = 0, reverse: int = 0
) -> np.ndarray:
    """Running sum along ``axis`` (opset 14 adds float16/bfloat16)."""
    return _scan(np.cumsum, 0, x, axis, exclusive, reverse)


@op("CumProd", since=26)
def cum_prod(
    x: np.ndarray, axis: np.ndarray, /, *, exclusive: int = 0, reverse: int = 0
) -> np.ndarray:
    """Running product along ``axis``; ``exclusive`` starts from 1."""
    return _scan(np.cumprod, 1, x, axis, exclusive, reverse)


# -- LpPool --------------------------------------------------------------------------------------


def _lp_pool(x: np.ndarray, win, p: float) -> np.ndarray:
    """``(sum |x|^p) ^ (1/p)`` over each window; padding counts as zero."""
    acc = _accumulator(x.dtype)
    xp = pad_for(np.abs(x.astype(acc, copy=False)), win, 0)
    total = None
    for _, view in tap_views(xp, win):
        term = np.power(view, p)
        total = term if total is None else total + term
    if total is None:
        raise KernelFailed("LpPool needs a kernel with at least one tap")
    return np.power(total, 1.0 / p).astype(x.dtype, copy=False)


@op("LpPool", since=1)
def lp_pool_1(
    x: np.ndarray,
    /,
    *,
    auto_pad: str = "NOTSET",
    kernel_shape: list[int] | None = None,
    p: float = 2.0,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> np.ndarray:
    """LpPool of opset 1 (``p`` a float)."""
    if kernel_shape is None:
        raise KernelFailed("LpPool needs the kernel_shape attribute")
    win = windows(x.shape[2:], kernel_shape, strides=strides, pads=pads, auto_pad=auto_pad)
    return _lp_pool(x, win, p)


@op("LpPool", since=(2, 11))
def lp_pool_2(
    x: np.ndarray,
    /,
    *,
    auto_pad: str = "NOTSET",
    kernel_shape: list[int],
    p: int = 2,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> np.ndarray:
    """LpPool with an integer ``p`` (opsets 2 and 11)."""
    win = windows(x.shape[2:], kernel_shape, strides=strides, pads=pads, auto_pad=auto_pad)
    return _lp_pool(x, win, p)


@op("LpPool", since=(18, 22))
def lp_pool(
    x: np.ndarray,
    /,
    *,
    auto_pad: str = "NOTSET",
    ceil_mode: int = 0,
    dilations: list[int] | None = None,
    kernel_shape: list[int],
    p: int = 2,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> np.ndarray:
    """LpPool with ``ceil_mode`` and ``dilations`` (opset 18 on)."""
    win = windows(
        x.shape[2:],
        kernel_shape,
        strides=strides,
        dilations=dilations,
        pads=pads,
        auto_pad=auto_pad,
        ceil_mode=ceil_mode,
    )
    return _lp_pool(x, win, p)

"""float32 normalizations and softmax, one row (or one group) at a time, in cache.

Each kernel takes its input as rows of contiguous values: the statistics of a
row (mean and variance, or max and sum of exponentials) take one or two passes
over it while it is in L1, and the result one more; every inner loop runs over
the contiguous axis, so LLVM vectorizes it. Sums are accumulated in float64
(a float32 sum of a few thousand values with a large offset would lose the
digits that the variance is made of), and the variance is the two-pass one,
``mean((x - mean)^2)``, which large offsets do not cancel.

The wrappers split the rows across the session's pool (``HostParallel``) when
a call is large enough to pay for waking it (:data:`PARALLEL_VALUES`); the
compiled loops are serial and release the GIL.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.extending import intrinsic

from nxrt_ep_cpu.jit import inline, mathf, njit
from nxrt_ep_cpu.jit.threads import bounds, size_team, split_team

if TYPE_CHECKING:
    from nxrt.host_parallel import HostParallel

#: Work (values; a softmax value counts 1.5, for its exponential) from which a call is
#: split across the pool: about 0.3 ms on one core (0.28 ns a LayerNorm value, 0.42 ns
#: a softmax value, measured). Waking the pool costs 50-150 µs and the caller waits for
#: the pool, so a smaller call gains little on an idle machine and loses on a busy one
#: (measured with other processes on both cores: a [1, 12, 197, 197] softmax took
#: 0.25 ms on one thread and 0.37 ms split).
PARALLEL_VALUES = 1 << 20
#: Blocks of rows per pool thread in a split call.
_BLOCKS_PER_THREAD = 8

#: Reductions may be reordered (vectorized) and fused; NaN and inf keep their meaning.
_REDUCE = {"reassoc", "contract"}
#: For the row maximum only: a NaN in the row makes the whole row NaN through the sum
#: of exponentials anyway, so the maximum may ignore NaN (which lets it vectorize).
_MAX = {"reassoc", "contract", "nnan", "nsz"}


def run_rows(
    work: Callable[[int, int], None],
    rows: int,
    values: int,
    parallel: HostParallel | None,
    split: Callable[[np.ndarray], None] | None = None,
) -> None:
    """``work(first, stop)`` over ``range(rows)``: in one call; or ``split(bounds)``, the
    same loop over pieces of rows on the EP's pool (``jit/threads.py``), from
    :data:`~nxrt_ep_cpu.jit.threads.TEAM_NS` of work (about ``values`` ns); or, without
    that pool, from :data:`PARALLEL_VALUES`, on every thread of the session's pool, each
    taking the next block of rows until none is left.

    Blocks rather than one fixed half per thread: on a shared machine one pool thread
    may lose its core for a while, and the other then does more blocks instead of
    waiting for it.
    """
    team = split_team(parallel, values) if split is not None and rows > 1 else 1
    if team > 1:
        assert split is not None  # a team only where split is given
        size_team(team)
        split(bounds(rows, team))
        return
    if parallel is None or parallel.threads < 2 or rows < 2 or values < PARALLEL_VALUES:
        work(0, rows)
        return
    threads = parallel.threads
    block = max(1, -(-rows // (_BLOCKS_PER_THREAD * threads)))
    starts = iter(range(0, rows, block))
    lock = threading.Lock()

    def worker(_: int) -> None:
        while True:
            with lock:
                first = next(starts, None)
            if first is None:
                return
            work(first, min(first + block, rows))

    parallel.map(worker, range(threads))


# -- LayerNormalization and RMSNormalization ---------------------------------------------------


@njit(fastmath=_REDUCE)
def _mean_var(row):  # pragma: no cover - compiled by numba
    """The float32 mean of ``row`` and its variance about it (two passes, float64 sums)."""
    n = row.size
    total = 0.0
    for i in range(n):
        total += row[i]
    mean = np.float32(total / n)
    squares = 0.0
    for i in range(n):
        d = np.float64(row[i] - mean)
        squares += d * d
    return mean, np.float32(squares / n)


@njit(fastmath=_REDUCE)
def _layer_norm_rows(x, scale, bias, y, means, inv_stds, epsilon, first, stop):  # pragma: no cover
    """Rows ``first..stop`` of ``(x - mean) / sqrt(var + epsilon) * scale + bias``; a
    ``bias`` of size 0 stands for none."""
    n = x.shape[1]
    eps = np.float32(epsilon)
    one = np.float32(1.0)
    for r in range(first, stop):
        row = x[r]
        out = y[r]
        mean, var = _mean_var(row)
        inv = one / np.float32(np.sqrt(var + eps))
        means[r] = mean
        inv_stds[r] = inv
        if bias.size:
            for i in range(n):
                out[i] = (row[i] - mean) * inv * scale[i] + bias[i]
        else:
            for i in range(n):
                out[i] = (row[i] - mean) * inv * scale[i]


def layer_norm(
    x: np.ndarray,
    scale: np.ndarray,
    bias: np.ndarray | None,
    epsilon: float,
    parallel: HostParallel | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """LayerNorm of the rows of a float32 ``(rows, n)`` array, ``n > 0``; ``scale`` and
    ``bias`` are float32 ``(n,)``. Returns Y and each row's mean and 1/std."""
    rows, n = x.shape
    y = np.empty_like(x)
    means = np.empty(rows, np.float32)
    inv_stds = np.empty(rows, np.float32)
    b = bias if bias is not None else np.empty(0, np.float32)

    def work(first: int, stop: int) -> None:
        _layer_norm_rows(x, scale, b, y, means, inv_stds, epsilon, first, stop)

    def split(parts: np.ndarray) -> None:
        _layer_norm_team(x, scale, b, y, means, inv_stds, epsilon, parts)

    run_rows(work, rows, x.size, parallel, split)
    return y, means, inv_stds


@njit(fastmath=_REDUCE)
def _rms_norm_rows(x, scale, y, epsilon, first, stop):  # pragma: no cover - compiled by numba
    """Rows ``first..stop`` of ``x / sqrt(mean(x^2) + epsilon) * scale``."""
    n = x.shape[1]
    eps = np.float32(epsilon)
    one = np.float32(1.0)
    for r in range(first, stop):
        row = x[r]
        out = y[r]
        squares = 0.0
        for i in range(n):
            v = np.float64(row[i])
            squares += v * v
        inv = one / np.float32(np.sqrt(np.float32(squares / n) + eps))
        for i in range(n):
            out[i] = row[i] * inv * scale[i]


def rms_norm(
    x: np.ndarray, scale: np.ndarray, epsilon: float, parallel: HostParallel | None
) -> np.ndarray:
    """RMSNorm of the rows of a float32 ``(rows, n)`` array, ``n > 0``; ``scale`` is (n,)."""
    rows = x.shape[0]
    y = np.empty_like(x)

    def work(first: int, stop: int) -> None:
        _rms_norm_rows(x, scale, y, epsilon, first, stop)

    def split(parts: np.ndarray) -> None:
        _rms_norm_team(x, scale, y, epsilon, parts)

    run_rows(work, rows, x.size, parallel, split)
    return y


# -- GroupNormalization and InstanceNormalization ----------------------------------------------


@njit(fastmath=_REDUCE)
def _group_norm_rows(x, scale, bias, y, groups, plane, epsilon, first, stop):  # pragma: no cover
    """Rows ``first..stop`` of ``(N * groups, channels_per_group * plane)``: each row
    normalised by its own statistics, each channel's ``plane`` values then scaled and
    shifted by that channel's ``scale`` and ``bias``."""
    per_group = x.shape[1] // plane
    eps = np.float32(epsilon)
    one = np.float32(1.0)
    for r in range(first, stop):
        row = x[r]
        out = y[r]
        mean, var = _mean_var(row)
        inv = one / np.float32(np.sqrt(var + eps))
        channel = (r % groups) * per_group
        for k in range(per_group):
            a = scale[channel + k]
            b = bias[channel + k]
            # slices, so the loop index starts at 0: an offset index would need numba's
            # negative-index check on every value, which stops the loop vectorizing
            values = row[k * plane : (k + 1) * plane]
            normed = out[k * plane : (k + 1) * plane]
            for i in range(plane):
                normed[i] = (values[i] - mean) * inv * a + b


def group_norm(
    x: np.ndarray,
    scale: np.ndarray,
    bias: np.ndarray,
    groups: int,
    epsilon: float,
    parallel: HostParallel | None,
) -> np.ndarray:
    """GroupNorm of a float32 ``(N, C, ...)`` array of ``C`` divisible by ``groups`` and
    no zero size; ``scale`` and ``bias`` are float32 ``(C,)``. ``groups == C`` is
    InstanceNormalization."""
    n, c = x.shape[:2]
    plane = math.prod(x.shape[2:])
    rows = x.reshape(n * groups, (c // groups) * plane)
    y = np.empty_like(rows)

    def work(first: int, stop: int) -> None:
        _group_norm_rows(rows, scale, bias, y, groups, plane, epsilon, first, stop)

    def split(parts: np.ndarray) -> None:
        _group_norm_team(rows, scale, bias, y, groups, plane, epsilon, parts)

    run_rows(work, n * groups, x.size, parallel, split)
    return y.reshape(x.shape)


# -- Softmax and LogSoftmax --------------------------------------------------------------------


@intrinsic
def _max_number(typingctx, a, b):  # pragma: no cover - numba typing
    """``llvm.maxnum``: the larger of two floats (the other where one is NaN), which LLVM
    vectorizes as a reduction where a compare-and-select is left scalar."""
    if not isinstance(a, types.Float) or a != b:
        return None

    def codegen(context, builder, signature, args):
        ty = args[0].type
        signature = ir.FunctionType(ty, [ty, ty])
        maxnum = builder.module.declare_intrinsic("llvm.maxnum", [ty], signature)
        return builder.call(maxnum, args)

    return a(a, b), codegen


@njit(fastmath=_MAX)
def _row_max(row):  # pragma: no cover - compiled by numba
    top = row[0]
    for i in range(row.size):
        top = _max_number(top, row[i])
    return top


@inline
def _exp_nonpositive(x):  # pragma: no cover - compiled by numba
    """:func:`~nxrt_ep_cpu.jit.mathf.exp` for ``x <= 0`` (or NaN), as softmax's
    ``x - max`` is: no overflow to handle, so ``2**n`` is one bit pattern and the
    loop a quarter faster; below the normal floats it is 0, as ``mathf.exp`` gives."""
    c = max(x, mathf._EXP_LO)
    n = np.float32(np.floor(c * mathf._LOG2E + mathf._HALF))
    r = c - n * mathf._LN2_HI - n * mathf._LN2_LO
    p = ((((mathf._E0 * r + mathf._E1) * r + mathf._E2) * r + mathf._E3) * r + mathf._E4) * r
    p = (p + mathf._E5) * r * r + r + mathf._ONE
    y = p * mathf._float_from_bits((np.int32(n) + 127) << 23)
    if x < mathf._EXP_LO:
        y = mathf._ZERO
    if x != x:
        y = x
    return np.float32(y)


@njit(fastmath=_REDUCE)
def _softmax_rows(x, y, log, first, stop):  # pragma: no cover - compiled by numba
    """Rows ``first..stop``: ``exp(x - max) / sum`` or, with ``log``, ``x - max - log(sum)``.

    A row holding NaN, or +inf, or only -inf is NaN throughout, as the formula gives.
    """
    n = x.shape[1]
    one = np.float32(1.0)
    for r in range(first, stop):
        row = x[r]
        out = y[r]
        top = _row_max(row)
        total = np.float32(0.0)
        if log:
            for i in range(n):
                total += _exp_nonpositive(row[i] - top)
            shift = np.float32(np.log(total))
            for i in range(n):
                out[i] = (row[i] - top) - shift
        else:
            for i in range(n):
                e = _exp_nonpositive(row[i] - top)
                out[i] = e
                total += e
            inv = one / total
            for i in range(n):
                out[i] *= inv


@njit(fastmath=_REDUCE)
def _softmax_columns(x, y, log, first, stop):  # pragma: no cover - compiled by numba
    """Softmax along the middle axis of ``(outer, n, inner)``, for ``outer`` indices
    ``first..stop``; the running maxima and sums are vectors over the inner axis."""
    n, inner = x.shape[1], x.shape[2]
    top = np.empty(inner, np.float32)
    total = np.empty(inner, np.float32)
    one = np.float32(1.0)
    for o in range(first, stop):
        top[:] = x[o, 0]
        for k in range(1, n):
            row = x[o, k]
            for j in range(inner):
                v = row[j]
                top[j] = v if v > top[j] or v != v else top[j]
        total[:] = 0
        for k in range(n):
            row = x[o, k]
            out = y[o, k]
            for j in range(inner):
                e = _exp_nonpositive(row[j] - top[j])
                total[j] += e
                if not log:
                    out[j] = e
        if log:
            for j in range(inner):
                total[j] = np.log(total[j])
            for k in range(n):
                row = x[o, k]
                out = y[o, k]
                for j in range(inner):
                    out[j] = (row[j] - top[j]) - total[j]
        else:
            for j in range(inner):
                total[j] = one / total[j]
            for k in range(n):
                out = y[o, k]
                for j in range(inner):
                    out[j] *= total[j]


def softmax(x: np.ndarray, axis: int, log: bool, parallel: HostParallel | None) -> np.ndarray:
    """Softmax (or LogSoftmax) of a float32 array along ``axis`` (non-negative), no zero
    size."""
    outer = math.prod(x.shape[:axis])
    n = x.shape[axis]
    inner = math.prod(x.shape[axis + 1 :])
    y = np.empty(x.shape, np.float32)
    if inner == 1:
        rows, out = np.ascontiguousarray(x).reshape(outer, n), y.reshape(outer, n)

        def work(first: int, stop: int) -> None:
            _softmax_rows(rows, out, log, first, stop)

        def split(parts: np.ndarray) -> None:
            _softmax_rows_team(rows, out, log, parts)

    else:
        rows, out = np.ascontiguousarray(x).reshape(outer, n, inner), y.reshape(outer, n, inner)

        def work(first: int, stop: int) -> None:
            _softmax_columns(rows, out, log, first, stop)

        def split(parts: np.ndarray) -> None:
            _softmax_columns_team(rows, out, log, parts)

    run_rows(work, outer, x.size + x.size // 2, parallel, split)
    return y


# -- the row loops over the EP's pool (``jit/threads.py``) -------------------------------------

# Each written out rather than made by one factory: numba's disk cache keys a closure by its
# constants only, and a compiled function a closure calls is not one of them, so every
# loop a factory made would load the first one cached (see ``elementwise._loops``).


@njit(parallel=True)
def _layer_norm_team(
    x, scale, bias, y, means, inv_stds, epsilon, parts
):  # pragma: no cover - compiled by numba
    """:func:`_layer_norm_rows` on each piece ``parts[p]..parts[p + 1]`` of rows, over the pool."""
    for p in prange(parts.size - 1):
        _layer_norm_rows(x, scale, bias, y, means, inv_stds, epsilon, parts[p], parts[p + 1])


@njit(parallel=True)
def _rms_norm_team(x, scale, y, epsilon, parts):  # pragma: no cover - compiled by numba
    """:func:`_rms_norm_rows` on each piece ``parts[p]..parts[p + 1]`` of rows, over the pool."""
    for p in prange(parts.size - 1):
        _rms_norm_rows(x, scale, y, epsilon, parts[p], parts[p + 1])


@njit(parallel=True)
def _group_norm_team(
    x, scale, bias, y, groups, plane, epsilon, parts
):  # pragma: no cover - compiled by numba
    """:func:`_group_norm_rows` on each piece ``parts[p]..parts[p + 1]`` of rows, over the pool."""
    for p in prange(parts.size - 1):
        _group_norm_rows(x, scale, bias, y, groups, plane, epsilon, parts[p], parts[p + 1])


@njit(parallel=True)
def _softmax_rows_team(x, y, log, parts):  # pragma: no cover - compiled by numba
    """:func:`_softmax_rows` on each piece ``parts[p]..parts[p + 1]`` of rows, over the pool."""
    for p in prange(parts.size - 1):
        _softmax_rows(x, y, log, parts[p], parts[p + 1])


@njit(parallel=True)
def _softmax_columns_team(x, y, log, parts):  # pragma: no cover - compiled by numba
    """:func:`_softmax_columns` on each piece ``parts[p]..parts[p + 1]`` of rows, over the pool."""
    for p in prange(parts.size - 1):
        _softmax_columns(x, y, log, parts[p], parts[p + 1])

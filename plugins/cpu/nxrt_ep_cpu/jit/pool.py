"""float32 2-D max and average pooling, one plane at a time, in cache.

A window's max (or sum) is separable: first over its rows, then over its
columns. Per output row, the kernel rows that lie inside the input are
combined column by column into one row (contiguous loops, vectorized); that
row is written into a buffer padded with the identity (``-inf`` for max, 0
for sums) and, for stride 2, split into even and odd columns (one loop
writes both, which LLVM vectorizes as paired loads and shuffles), so that
every kernel column reads a contiguous run of it. The buffer's padding is
written once per call.

Max keeps NaN as ``np.maximum`` does: a NaN anywhere in a window makes the
window's max NaN. Averages divide each window's sum by its element count,
given per axis.
"""

from __future__ import annotations

import numpy as np

from nxrt_ep_cpu.jit import inline, njit


@inline
def _combine(a, b, is_max):  # pragma: no cover - compiled by numba
    """``np.maximum(a, b)`` (NaN wins) or ``a + b``."""
    if is_max:
        return a if (a > b) | (a != a) else b
    return a + b


@inline
def _pool2d(x, out, geometry, rows_count, cols_count, is_max, first, stop):  # pragma: no cover
    """Planes ``first..stop`` of a 2-D max or average pool.

    ``x``: (planes, height, width); ``out``: (planes, out height, out width);
    ``geometry``: kernel height and width, strides, dilations, top and left pads,
    phase width ``wq`` of the padded row. For averages, ``rows_count[oy] x
    cols_count[ox]`` is each window's divisor.
    """
    kh, kw, sh, sw, dh, dw, pt, pl, wq = (
        geometry[0],
        geometry[1],
        geometry[2],
        geometry[3],
        geometry[4],
        geometry[5],
        geometry[6],
        geometry[7],
        geometry[8],
    )
    height, width = x.shape[1], x.shape[2]
    ho, wo = out.shape[1], out.shape[2]
    identity = np.float32(-np.inf) if is_max else np.float32(0.0)
    row = np.empty(width, np.float32)
    # the padded row, as ``sw`` phases of ``wq`` values each
    padded = np.full(sw * wq, identity, np.float32)
    count = np.uint64(width)
    pairs = np.uint64(width // 2)
    one, two = np.uint64(1), np.uint64(2)
    even = pl % 2  # the phase column 0 lands in, for stride 2
    at0 = np.uint64(even * wq + pl // 2)
    at1 = np.uint64((1 - even) * wq + (pl + 1) // 2)
    for plane in range(first, stop):
        source = x[plane]
        target = out[plane]
        for oy in range(ho):
            # the window's rows inside the input, combined
            started = False
            for ky in range(kh):
                iy = oy * sh - pt + ky * dh
                if iy < 0 or iy >= height:
                    continue
                line = source[iy]
                if not started:
                    for j in range(count):
                        row[j] = line[j]
                    started = True
                else:
                    for j in range(count):
                        row[j] = _combine(row[j], line[j], is_max)
            if not started:
                for j in range(count):
                    row[j] = identity
            # into the padded row's phases
            if sw == 1:
                at = np.uint64(pl)
                for j in range(count):
                    padded[at + j] = row[j]
            elif sw == 2:
                for k in range(pairs):
                    padded[at0 + k] = row[two * k]
                    padded[at1 + k] = row[two * k + one]
                if width % 2:
                    padded[at0 + pairs] = row[two * pairs]
            else:
                for j in range(width):
                    col = j + pl
                    padded[(col % sw) * wq + col // sw] = row[j]
            # then the window's columns
            dst = target[oy]
            for kx in range(kw):
                start = np.uint64(((kx * dw) % sw) * wq + (kx * dw) // sw)
                if kx == 0:
                    for ox in range(np.uint64(wo)):
                        dst[ox] = padded[start + ox]
                else:
                    for ox in range(np.uint64(wo)):
                        dst[ox] = _combine(dst[ox], padded[start + ox], is_max)
            if not is_max:
                rows = rows_count[oy]
                for ox in range(wo):
                    dst[ox] = dst[ox] / np.float32(rows * cols_count[ox])


@njit
def max_pool2d(x, out, geometry, first, stop):  # pragma: no cover - compiled by numba
    """:func:`_pool2d` for max (NaN wins, as ``np.maximum``)."""
    none = np.zeros(0, np.int64)
    _pool2d(x, out, geometry, none, none, True, first, stop)


@njit
def average_pool2d(x, out, geometry, rows_count, cols_count, first, stop):  # pragma: no cover
    """:func:`_pool2d` for averages."""
    _pool2d(x, out, geometry, rows_count, cols_count, False, first, stop)


@njit(fastmath={"reassoc", "contract"})
def global_average(x, out):  # pragma: no cover - compiled by numba
    """``out[r] = mean(x[r])`` for each row of ``x`` (rows, values): float32 sums, vectorized
    (reassociated: NaN and inf keep their meaning)."""
    n = x.shape[1]
    count = np.float32(n)
    for r in range(x.shape[0]):
        row = x[r]
        total = np.float32(0.0)
        for i in range(n):
            total += row[i]
        out[r] = total / count

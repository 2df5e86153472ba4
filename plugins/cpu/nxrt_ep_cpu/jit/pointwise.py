"""float32 1x1 convolution as a register-tiled product with weights packed once.

A pointwise convolution is ``out[m, p] = sum_c w[m, c] * x[c, p]`` per image:
a GEMM, but one whose columns (the pixels of a 7x7 to 56x56 map) are few.
Through BLAS each call packs both operands again, and the bias, the
residual and the activation are further passes over the output. Here the
weights are packed once per session (:func:`pack`: blocks of ``ROWS`` filters,
channel-major, so each step reads consecutive values) and each tile of ``ROWS``
filters by two vectors of pixels is held in vector registers: per input
channel two vector loads of ``x`` and ``2 x ROWS`` multiply-adds, each against
one weight broadcast from memory. A tile starts at its bias and is written out
once, its residual added and a Relu/Clip applied on the way (NaN stays NaN).

The tile is sized per instruction-set level (``isa.py``; :func:`kernels` builds
a level's loops): 8 filters x 32 pixels on AVX-512 (16 of its 32 zmm), 6 x 16
on AVX2 (12 of its 16 ymm: 8 x 32 would need 32 and spill), 4 x 8 elsewhere.

The work is items of (image, pixel chunk, filter block), so a chunk of input
stays in cache while every filter block reads it; a chunk's last tile is
shifted back to end at the chunk's end, recomputing a few pixels rather than
running a scalar tail, so a chunk must hold at least one vector of pixels.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numba
import numpy as np

from nxrt_ep_cpu.jit import isa
from nxrt_ep_cpu.jit.elementwise import NONE
from nxrt_ep_cpu.jit.elementwise import activate_range as _activate
from nxrt_ep_cpu.jit.vectors import operations
from nxrt_ep_cpu.jit.vectors import stack as _stack

#: Multiplies and adds may become FMAs (as in the activation loops); nothing else changes.
_FMA = {"contract"}


def pack(w: np.ndarray, rows: int) -> np.ndarray:
    """``w`` (filters, channels) as blocks of ``rows`` filters, channel-major: block ``t``'s
    weights of channel ``c`` at ``[t, c * rows : (c + 1) * rows]`` (zero filters pad the
    last block). A level's ``ROWS`` for :func:`pointwise`, its ``LANE_BLOCK`` for
    :func:`pointwise_lanes`."""
    m, k = w.shape
    blocks = -(-m // rows)
    padded = np.zeros((blocks * rows, k), np.float32)
    padded[:m] = w
    return np.ascontiguousarray(padded.reshape(blocks, rows, k).transpose(0, 2, 1)).reshape(
        blocks, k * rows
    )


def kernels(level: str | None = None) -> SimpleNamespace:
    """The loops below compiled for ``level`` (default: the target's, ``isa.level()``), with
    its tile shape: ``LANES`` (a vector's float32), ``ROWS`` and ``WIDTH`` (filters and
    pixels of :func:`pointwise`'s tile), ``LANE_BLOCK`` and ``LANE_PIXELS`` (filters and
    pixels of :func:`pointwise_lanes`'s), and :func:`pack`."""
    return _kernels(level or isa.level())


@functools.cache
def _kernels(level: str, cache: bool = True) -> SimpleNamespace:
    chosen = isa.LEVELS[level]
    lanes, rows, pixels = chosen.lanes, chosen.rows, chosen.lane_pixels
    constants = {
        "LEVEL": chosen.name,
        "LANES": lanes,
        "ROWS": rows,
        "WIDTH": 2 * lanes,
        "LANE_BLOCK": 2 * lanes,
        "LANE_PIXELS": pixels,
        "STACK": max(rows, pixels) * 2 * lanes,
        "pack": pack,
        **operations(lanes, chosen.fma),
    }
    return isa.specialize(globals(), chosen.name, constants, cache)


# The tiled loops read their level's constants (``kernels``) as globals: LANES, ROWS,
# WIDTH, LANE_BLOCK, LANE_PIXELS, STACK, and the vector operations _fmab, _fill, _add,
# _copy, _clamp and _transpose of ``vectors.operations``.
# ruff: noqa: F821


@isa.tiled(inline="always")
def _tile(acc, xs, w, bias, b0, k, pixels, at, width):  # pragma: no cover - numba
    """Accumulate one tile: ROWS filters (weights ``w``, biases from ``bias[b0]``) at pixels
    ``at..at+width`` (one or two vectors) of an image whose input starts at ``xs[0]``;
    ``acc`` starts at the bias."""
    for r in range(ROWS):
        _fill(acc, r * WIDTH, bias[b0 + r])
        _fill(acc, r * WIDTH + LANES, bias[b0 + r])
    step = np.uint64(ROWS)
    if width == WIDTH:
        for c in range(np.uint64(k)):
            xi = c * np.uint64(pixels) + np.uint64(at)
            wi = c * step
            for r in range(ROWS):  # unrolled by LLVM: the offsets are constants
                _fmab(acc, r * WIDTH, xs, xi, w, wi + np.uint64(r))
                _fmab(acc, r * WIDTH + LANES, xs, xi + np.uint64(LANES), w, wi + np.uint64(r))
    else:
        for c in range(np.uint64(k)):
            xi = c * np.uint64(pixels) + np.uint64(at)
            wi = c * step
            for r in range(ROWS):
                _fmab(acc, r * WIDTH, xs, xi, w, wi + np.uint64(r))


@isa.tiled(inline="always")
def _emit(acc, ys, zs, has_z, base, rows, pixels, at, width, epi, clamp):  # pragma: no cover
    """Write a tile's ``rows`` filters from ``acc`` to ``ys[base + r * pixels + at ...]``,
    the residual added and the clamp applied, a vector at a time."""
    for r in range(np.uint64(rows)):
        for part in range(np.uint64(width // LANES)):
            o = np.uint64(base) + r * np.uint64(pixels) + np.uint64(at) + part * np.uint64(LANES)
            a = r * np.uint64(WIDTH) + part * np.uint64(LANES)
            if has_z:
                _add(acc, a, zs, o)
            if clamp:
                _clamp(acc, a, epi[0], epi[1])
            _copy(ys, o, acc, a)


@isa.tiled(fastmath=_FMA)
def pointwise(x, w, bias, z, out, items, epi, clamp, kind, first, stop):  # pragma: no cover
    """Items ``first..stop`` of a 1x1 convolution.

    ``x``: (images, channels, pixels); ``out`` and ``z``: (images, filters, pixels), ``z``
    of size 0 for no residual; ``w``: :func:`pack`'s blocks; ``bias``: one per filter of
    each block, padded with zeros to whole blocks; ``items``: rows of (image, first pixel,
    stop pixel, filter block of the output, block of ``w`` and ``bias``), each pixel range
    at least ``LANES`` long (the two blocks differ for a grouped convolution, whose groups
    are images here, each group's weights its own blocks); ``epi``: the clamp's bounds and
    the activation's two parameters (float32); ``kind``: one of ``elementwise.FUSED`` or
    ``NONE``.
    """
    k, pixels = x.shape[1], x.shape[2]
    m = out.shape[1]
    has_z = z.size > 0
    zs = z.reshape(-1)
    ys = out.reshape(-1)
    acc = numba.carray(_stack(STACK), (STACK,))
    for item in range(first, stop):
        image, p0, p1, block = items[item, 0], items[item, 1], items[item, 2], items[item, 3]
        weights = items[item, 4]
        xs = x[image].reshape(-1)
        wb = w[weights]
        row0 = block * ROWS
        rows = min(ROWS, m - row0)
        base = (image * m + row0) * pixels
        p = p0
        while p < p1:
            width = WIDTH if p1 - p > LANES and p1 - p0 >= WIDTH else LANES
            at = min(p, p1 - width)
            _tile(acc, xs, wb, bias, weights * ROWS, k, pixels, at, width)
            _emit(acc, ys, zs, has_z, base, rows, pixels, at, width, epi, clamp)
            p = at + width
        if kind != NONE:  # on the item's rows while they are in cache: long loops vectorize
            for r in range(rows):
                start = np.uint64(base + r * pixels)
                _activate(ys, start + np.uint64(p0), start + np.uint64(p1), kind, epi[2], epi[3])


@isa.tiled(fastmath=_FMA, parallel=True)
def pointwise_team(x, w, bias, z, out, items, epi, clamp, kind, bounds):  # pragma: no cover
    """:func:`pointwise` on items ``bounds[p]..bounds[p + 1]`` for each part ``p``, the parts
    spread over the threads of numba's pool (``jit/threads.py``)."""
    for p in numba.prange(bounds.size - 1):
        pointwise(x, w, bias, z, out, items, epi, clamp, kind, bounds[p], bounds[p + 1])


# -- filters in the lanes, for small maps ------------------------------------------------------
#
# On a 7x7 map, 49 pixels fill 64 lanes (the tiles above compute 15 pixels twice). There
# the lanes hold filters instead: a tile is LANE_BLOCK filters (two vectors of the weights,
# packed filter-minor by :func:`pack`) by LANE_PIXELS pixels, each pixel's input value
# broadcast, and a last pixel or few take one-pixel tiles, so no pixel is computed twice.
# A block's tiles land pixel-major in a small buffer, which LANES x LANES register
# transposes move to the output's rows, then the residual and the clamp are applied to
# those rows while they are in cache.


@isa.tiled(inline="always")
def _lane_tile(acc, xs, w, bias, b0, k, pixels, p0, count, halves):  # pragma: no cover
    """Accumulate ``count`` (LANE_PIXELS or 1) pixels from ``p0`` of ``halves`` vectors of
    filters (biases from ``bias[b0]``); ``acc`` holds LANE_BLOCK values per pixel and starts
    at the bias."""
    step = np.uint64(LANE_BLOCK)
    for j in range(count):
        _copy(acc, j * LANE_BLOCK, bias, b0)
        if halves == 2:
            _copy(acc, j * LANE_BLOCK + LANES, bias, b0 + LANES)
    if count == LANE_PIXELS and halves == 2:
        for c in range(np.uint64(k)):
            wi = c * step
            xi = c * np.uint64(pixels) + np.uint64(p0)
            for j in range(LANE_PIXELS):  # unrolled by LLVM: the offsets are constants
                _fmab(acc, j * LANE_BLOCK, w, wi, xs, xi + np.uint64(j))
                _fmab(acc, j * LANE_BLOCK + LANES, w, wi + np.uint64(LANES), xs, xi + np.uint64(j))
    elif count == LANE_PIXELS:
        for c in range(np.uint64(k)):
            wi = c * step
            xi = c * np.uint64(pixels) + np.uint64(p0)
            for j in range(LANE_PIXELS):
                _fmab(acc, j * LANE_BLOCK, w, wi, xs, xi + np.uint64(j))
    else:
        for c in range(np.uint64(k)):
            wi = c * step
            xi = c * np.uint64(pixels) + np.uint64(p0)
            _fmab(acc, 0, w, wi, xs, xi)
            if halves == 2:
                _fmab(acc, LANES, w, wi + np.uint64(LANES), xs, xi)


@isa.tiled(fastmath=_FMA)
def pointwise_lanes(x, w, bias, z, out, items, epi, clamp, kind, first, stop):  # pragma: no cover
    """Items ``first..stop`` of a 1x1 convolution with the filters in the lanes.

    As :func:`pointwise`, but ``w`` is :func:`pack`'s blocks of LANE_BLOCK filters,
    ``bias`` is padded to whole blocks of those, and the items are (image, first pixel, stop
    pixel, block of LANE_BLOCK filters of the output, block of ``w`` and ``bias``), with
    pixel ranges of any length.
    """
    k, pixels = x.shape[1], x.shape[2]
    m = out.shape[1]
    has_z = z.size > 0
    zs = z.reshape(-1)
    ys = out.reshape(-1)
    acc = numba.carray(_stack(STACK), (STACK,))
    stage = np.empty(pixels * LANE_BLOCK, np.float32)  # one item, pixel-major
    for item in range(first, stop):
        image, p0, p1, block = items[item, 0], items[item, 1], items[item, 2], items[item, 3]
        weights = items[item, 4]
        xs = x[image].reshape(-1)
        wb = w[weights]
        m0 = block * LANE_BLOCK
        width = min(LANE_BLOCK, m - m0)
        halves = 2 if width > LANES else 1
        span = p1 - p0
        p = p0
        while p < p1:
            count = LANE_PIXELS if p1 - p >= LANE_PIXELS else 1
            _lane_tile(acc, xs, wb, bias, weights * LANE_BLOCK, k, pixels, p, count, halves)
            for j in range(count):
                _copy(stage, (p - p0 + j) * LANE_BLOCK, acc, j * LANE_BLOCK)
                if halves == 2:
                    _copy(stage, (p - p0 + j) * LANE_BLOCK + LANES, acc, j * LANE_BLOCK + LANES)
            p += count
        # to the output's rows: whole groups of LANES filters by register transposes (the
        # last LANES pixels overlap the group before: no scalar tail), a partial group value
        # by value
        base = (image * m + m0) * pixels + p0
        for g in range(0, width, LANES):
            row = base + g * pixels
            if g + LANES <= width and span >= LANES:
                for q in range(0, span, LANES):
                    q = min(q, span - LANES)
                    _transpose(ys, row + q, pixels, stage, q * LANE_BLOCK + g, LANE_BLOCK)
            else:
                for f in range(g, width):
                    for q in range(span):
                        ys[base + f * pixels + q] = stage[q * LANE_BLOCK + f]
        lo, hi = epi[0], epi[1]
        for f in range(width):
            first_value = np.uint64(base + f * pixels)
            stop_value = first_value + np.uint64(span)
            if has_z:
                for i in range(first_value, stop_value):
                    ys[i] += zs[i]
            if clamp:
                for i in range(first_value, stop_value):
                    v = ys[i]
                    v = lo if v < lo else v
                    ys[i] = hi if v > hi else v
            _activate(ys, first_value, stop_value, kind, epi[2], epi[3])


@isa.tiled(fastmath=_FMA, parallel=True)
def pointwise_lanes_team(x, w, bias, z, out, items, epi, clamp, kind, bounds):  # pragma: no cover
    """:func:`pointwise_lanes` over parts of items, as :func:`pointwise_team`."""
    for p in numba.prange(bounds.size - 1):
        pointwise_lanes(x, w, bias, z, out, items, epi, clamp, kind, bounds[p], bounds[p + 1])

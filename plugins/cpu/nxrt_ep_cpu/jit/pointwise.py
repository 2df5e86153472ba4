"""float32 1x1 convolution as a register-tiled product with weights packed once.

A pointwise convolution is ``out[m, p] = sum_c w[m, c] * x[c, p]`` per image:
a GEMM, but one whose columns (the pixels of a 7x7 to 56x56 map) are few.
Through BLAS each call packs both operands again, and the bias, the
residual and the activation are further passes over the output. Here the
weights are packed once per session (:func:`pack`: blocks of eight filters,
channel-major, so each step reads eight consecutive values) and each tile of
eight filters by 32 pixels is sixteen AVX-512 accumulators: per input channel
two vector loads of ``x`` and sixteen multiply-adds, each against one weight
broadcast from memory. A tile starts at its bias and is written out once, its
residual added and a Relu/Clip applied on the way (NaN stays NaN).

The work is items of (image, pixel chunk, filter block), so a chunk of input
stays in cache while every filter block reads it; a chunk's last tile is
shifted back to end at the chunk's end, recomputing a few pixels rather than
running a scalar tail, so a chunk must hold at least 16 pixels.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from nxrt_ep_cpu.jit import inline, njit
from nxrt_ep_cpu.jit.conv import (
    _VECTOR,
    _clamp16,
    _copy16,
    _stack,
    _transpose16,
    _vector_at,
)
from nxrt_ep_cpu.jit.elementwise import NONE
from nxrt_ep_cpu.jit.elementwise import activate_range as _activate

#: Multiplies and adds may become FMAs (as in the activation loops); nothing else changes.
_FMA = {"contract"}
#: Filters per block: the rows of one register tile.
ROWS = 8
#: Pixels one tile covers: two vectors of 16 float32.
WIDTH = 32
_ZERO = ir.Constant(ir.IntType(32), 0)
_LANES = ir.VectorType(ir.IntType(32), 16)


def _splat(builder, value):
    """``value`` in all 16 lanes of a vector."""
    lane = builder.insert_element(ir.Constant(_VECTOR, ir.Undefined), value, _ZERO)
    return builder.shuffle_vector(lane, lane, ir.Constant(_LANES, [0] * 16))


@intrinsic
def _fmab16(typingctx, acc, at, x, xi, w, wi):  # pragma: no cover - numba typing
    """``acc[at:at+16] += x[xi:xi+16] * w[wi]``: one vector multiply-add against a weight
    broadcast to every lane (``wi`` a literal offset added to ``w``'s start)."""
    signature = types.void(acc, at, x, xi, w, wi)

    def codegen(context, builder, sig, args):
        pa = _vector_at(context, builder, sig.args[0], args[0], args[1])
        px = _vector_at(context, builder, sig.args[2], args[2], args[3])
        data = context.make_array(sig.args[4])(context, builder, args[4]).data
        weight = builder.load(builder.gep(data, [args[5]]), align=4)
        fma = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_VECTOR, [_VECTOR] * 3), "llvm.fma.v16f32"
        )
        splat = _splat(builder, weight)
        value = builder.call(fma, [builder.load(px, align=4), splat, builder.load(pa, align=4)])
        builder.store(value, pa, align=4)
        return context.get_dummy_value()

    return signature, codegen


@intrinsic
def _splat16(typingctx, acc, at, s):  # pragma: no cover - numba typing
    """``acc[at:at+16] = s`` in every lane."""
    signature = types.void(acc, at, s)

    def codegen(context, builder, sig, args):
        pa = _vector_at(context, builder, sig.args[0], args[0], args[1])
        value = context.cast(builder, args[2], sig.args[2], types.float32)
        builder.store(_splat(builder, value), pa, align=4)
        return context.get_dummy_value()

    return signature, codegen


@intrinsic
def _add16(typingctx, acc, at, z, zi):  # pragma: no cover - numba typing
    """``acc[at:at+16] += z[zi:zi+16]``."""
    signature = types.void(acc, at, z, zi)

    def codegen(context, builder, sig, args):
        pa = _vector_at(context, builder, sig.args[0], args[0], args[1])
        pz = _vector_at(context, builder, sig.args[2], args[2], args[3])
        total = builder.fadd(builder.load(pa, align=4), builder.load(pz, align=4))
        builder.store(total, pa, align=4)
        return context.get_dummy_value()

    return signature, codegen


def pack(w: np.ndarray, rows: int = ROWS) -> np.ndarray:
    """``w`` (filters, channels) as blocks of ``rows`` filters, channel-major: block ``t``'s
    weights of channel ``c`` at ``[t, c * rows : (c + 1) * rows]`` (zero filters pad the
    last block). :data:`ROWS` for :func:`pointwise`, :data:`LANE_BLOCK` for
    :func:`pointwise_lanes`."""
    m, k = w.shape
    blocks = -(-m // rows)
    padded = np.zeros((blocks * rows, k), np.float32)
    padded[:m] = w
    return np.ascontiguousarray(padded.reshape(blocks, rows, k).transpose(0, 2, 1)).reshape(
        blocks, k * rows
    )


@inline
def _tile(acc, xs, w, bias, row0, k, pixels, at, width):  # pragma: no cover - numba
    """Accumulate one tile: filters ``row0..row0+8`` at pixels ``at..at+width`` (16 or 32)
    of an image whose input starts at ``xs[0]``; ``acc`` starts at the bias."""
    for r in range(ROWS):
        _splat16(acc, r * WIDTH, bias[row0 + r])
        _splat16(acc, r * WIDTH + 16, bias[row0 + r])
    step = np.uint64(ROWS)
    if width == WIDTH:
        for c in range(np.uint64(k)):
            xi = c * np.uint64(pixels) + np.uint64(at)
            wi = c * step
            for r in range(ROWS):  # unrolled by LLVM: the offsets are constants
                _fmab16(acc, r * WIDTH, xs, xi, w, wi + np.uint64(r))
                _fmab16(acc, r * WIDTH + 16, xs, xi + np.uint64(16), w, wi + np.uint64(r))
    else:
        for c in range(np.uint64(k)):
            xi = c * np.uint64(pixels) + np.uint64(at)
            wi = c * step
            for r in range(ROWS):
                _fmab16(acc, r * WIDTH, xs, xi, w, wi + np.uint64(r))


@inline
def _emit(acc, ys, zs, has_z, base, rows, pixels, at, width, epi, clamp):  # pragma: no cover
    """Write a tile's ``rows`` filters from ``acc`` to ``ys[base + r * pixels + at ...]``,
    the residual added and the clamp applied, a vector at a time."""
    for r in range(np.uint64(rows)):
        for half in range(np.uint64(width // 16)):
            o = np.uint64(base) + r * np.uint64(pixels) + np.uint64(at) + half * np.uint64(16)
            a = r * np.uint64(WIDTH) + half * np.uint64(16)
            if has_z:
                _add16(acc, a, zs, o)
            if clamp:
                _clamp16(acc, a, epi[0], epi[1])
            _copy16(ys, o, acc, a)


@njit(fastmath=_FMA)
def pointwise(x, w, bias, z, out, items, epi, clamp, kind, first, stop):  # pragma: no cover
    """Items ``first..stop`` of a 1x1 convolution.

    ``x``: (images, channels, pixels); ``out`` and ``z``: (images, filters, pixels), ``z``
    of size 0 for no residual; ``w``: :func:`pack`'s blocks; ``bias``: one per filter,
    padded with zeros to whole blocks; ``items``: rows of (image, first pixel, stop pixel,
    filter block), each pixel range at least 16 long; ``epi``: the clamp's bounds and the
    activation's two parameters (float32); ``kind``: one of ``elementwise.FUSED`` or ``NONE``.
    """
    k, pixels = x.shape[1], x.shape[2]
    m = out.shape[1]
    has_z = z.size > 0
    zs = z.reshape(-1)
    ys = out.reshape(-1)
    acc = numba.carray(_stack(256), (256,))
    for item in range(first, stop):
        image, p0, p1, block = items[item, 0], items[item, 1], items[item, 2], items[item, 3]
        xs = x[image].reshape(-1)
        wb = w[block]
        row0 = block * ROWS
        rows = min(ROWS, m - row0)
        base = (image * m + row0) * pixels
        p = p0
        while p < p1:
            width = WIDTH if p1 - p > 16 and p1 - p0 >= WIDTH else 16
            at = min(p, p1 - width)
            _tile(acc, xs, wb, bias, row0, k, pixels, at, width)
            _emit(acc, ys, zs, has_z, base, rows, pixels, at, width, epi, clamp)
            p = at + width
        if kind != NONE:  # on the item's rows while they are in cache: long loops vectorize
            for r in range(rows):
                start = np.uint64(base + r * pixels)
                _activate(ys, start + np.uint64(p0), start + np.uint64(p1), kind, epi[2], epi[3])


@njit(fastmath=_FMA, parallel=True)
def pointwise_team(x, w, bias, z, out, items, epi, clamp, kind, bounds):  # pragma: no cover
    """:func:`pointwise` on items ``bounds[p]..bounds[p + 1]`` for each part ``p``, the parts
    spread over the threads of numba's pool (``jit/threads.py``)."""
    for p in numba.prange(bounds.size - 1):
        pointwise(x, w, bias, z, out, items, epi, clamp, kind, bounds[p], bounds[p + 1])


# -- filters in the lanes, for small maps ------------------------------------------------------
#
# On a 7x7 map, 49 pixels fill 64 lanes (the tiles above compute 15 pixels twice). There
# the lanes hold filters instead: a tile is 32 filters (two vectors of the weights, packed
# filter-minor by :func:`pack`) by 8 pixels, each pixel's input value broadcast, and
# a last pixel or few take one-pixel tiles, so no pixel is computed twice. A block's tiles
# land pixel-major in a small buffer, which 16x16 register transposes move to the output's
# rows, then the residual and the clamp are applied to those rows while they are in cache.

#: Filters per block of the filter-lanes kernel, and pixels per tile.
LANE_BLOCK = 32
LANE_PIXELS = 8


@inline
def _lane_tile(acc, xs, w, bias, m0, k, pixels, p0, count, halves):  # pragma: no cover
    """Accumulate ``count`` (8 or 1) pixels from ``p0`` of ``halves`` x 16 filters from
    ``m0``; ``acc`` holds 32 values per pixel and starts at the bias."""
    step = np.uint64(LANE_BLOCK)
    for j in range(count):
        _copy16(acc, j * LANE_BLOCK, bias, m0)
        if halves == 2:
            _copy16(acc, j * LANE_BLOCK + 16, bias, m0 + 16)
    if count == LANE_PIXELS and halves == 2:
        for c in range(np.uint64(k)):
            wi = c * step
            xi = c * np.uint64(pixels) + np.uint64(p0)
            for j in range(LANE_PIXELS):  # unrolled by LLVM: the offsets are constants
                _fmab16(acc, j * LANE_BLOCK, w, wi, xs, xi + np.uint64(j))
                _fmab16(acc, j * LANE_BLOCK + 16, w, wi + np.uint64(16), xs, xi + np.uint64(j))
    elif count == LANE_PIXELS:
        for c in range(np.uint64(k)):
            wi = c * step
            xi = c * np.uint64(pixels) + np.uint64(p0)
            for j in range(LANE_PIXELS):
                _fmab16(acc, j * LANE_BLOCK, w, wi, xs, xi + np.uint64(j))
    else:
        for c in range(np.uint64(k)):
            wi = c * step
            xi = c * np.uint64(pixels) + np.uint64(p0)
            _fmab16(acc, 0, w, wi, xs, xi)
            if halves == 2:
                _fmab16(acc, 16, w, wi + np.uint64(16), xs, xi)


@njit(fastmath=_FMA)
def pointwise_lanes(x, w, bias, z, out, items, epi, clamp, kind, first, stop):  # pragma: no cover
    """Items ``first..stop`` of a 1x1 convolution with the filters in the lanes.

    As :func:`pointwise`, but ``w`` is :func:`pack`'s blocks of :data:`LANE_BLOCK` filters,
    ``bias`` is padded to whole blocks of those, and the items are (image, first pixel, stop
    pixel, block of 32 filters), with pixel ranges of any length.
    """
    k, pixels = x.shape[1], x.shape[2]
    m = out.shape[1]
    has_z = z.size > 0
    zs = z.reshape(-1)
    ys = out.reshape(-1)
    acc = numba.carray(_stack(256), (256,))
    stage = np.empty(pixels * LANE_BLOCK, np.float32)  # one item, pixel-major
    for item in range(first, stop):
        image, p0, p1, block = items[item, 0], items[item, 1], items[item, 2], items[item, 3]
        xs = x[image].reshape(-1)
        wb = w[block]
        m0 = block * LANE_BLOCK
        width = min(LANE_BLOCK, m - m0)
        halves = 2 if width > 16 else 1
        span = p1 - p0
        p = p0
        while p < p1:
            count = LANE_PIXELS if p1 - p >= LANE_PIXELS else 1
            _lane_tile(acc, xs, wb, bias, m0, k, pixels, p, count, halves)
            for j in range(count):
                _copy16(stage, (p - p0 + j) * LANE_BLOCK, acc, j * LANE_BLOCK)
                if halves == 2:
                    _copy16(stage, (p - p0 + j) * LANE_BLOCK + 16, acc, j * LANE_BLOCK + 16)
            p += count
        # to the output's rows: whole groups of 16 filters by register transposes (the last
        # 16 pixels overlap the group before: no scalar tail), a partial group value by value
        base = (image * m + m0) * pixels + p0
        for g in range(0, width, 16):
            row = base + g * pixels
            if g + 16 <= width and span >= 16:
                for q in range(0, span, 16):
                    q = min(q, span - 16)
                    _transpose16(ys, row + q, pixels, stage, q * LANE_BLOCK + g, LANE_BLOCK)
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


@njit(fastmath=_FMA, parallel=True)
def pointwise_lanes_team(x, w, bias, z, out, items, epi, clamp, kind, bounds):  # pragma: no cover
    """:func:`pointwise_lanes` over parts of items, as :func:`pointwise_team`."""
    for p in numba.prange(bounds.size - 1):
        pointwise_lanes(x, w, bias, z, out, items, epi, clamp, kind, bounds[p], bounds[p + 1])

"""float32 convolution loops for what a GEMM does badly: few channels per group, and
the column packing and output moves of GEMMs over several small images.

A depthwise convolution does a handful of multiply-adds per output value,
far too few for a GEMM to pay for its packing. :func:`direct_conv` convolves
each (image, group) directly. Its input channels are first copied into a
zero-padded buffer laid out as ``_conv_gemm._Layout`` lays it out: split by
stride phase, one flat block per channel, so that every kernel tap reads a
contiguous run of the buffer, at a fixed offset, for a whole band of output
rows (the ``wq - wo`` values past each row's end are computed and dropped).
The buffer's border is zeroed once per call and only its interior is
rewritten per (image, group), so the padding costs nothing after the first.
The output is computed a band of rows at a time into an accumulator that
stays in L1, nine taps per pass: one vectorized loop over the band reads
nine shifted runs and the accumulator once, two filters at a time when a
group has several (the runs are then read once for both). Tap lists are
padded with zero-weight taps that read a zeroed block (never the input:
``0 * inf`` would be NaN), to a multiple of nine, or of three for short
tails. The band is then written out with the bias, the residual and a
Relu/Clip clamp (NaN stays NaN, as ``np.maximum``).

On small maps those padded rows cost too much (a 7x7 kernel on a 7x7 map
computes 13 values per row to keep 7): :func:`depthwise_blocks` moves a
vector register's worth of channels at a time (16 on AVX-512, 8 on AVX2:
``isa.py``) to channels-last and computes each output pixel's channels in
one register (see the section below). On maps up to 64 wide but of 1024
pixels and more, :func:`depthwise_rows` does the same a row at a time: only
the rows the current output row reads are in channels-last, so the block
never leaves L1 (measured on 56-112 wide maps with AVX-512's 16 channels:
1.0-1.25x faster than whole planes on one core, 1.2x on two, 2.3x where one
block is cut in two bands).

:func:`image_columns` and :func:`columns_to_images` pack the GEMM columns of
several whole images and move the product back to ``(image, filter,
pixel)`` with the fused terms, for maps too small for a GEMM per image.

A clamp's bounds are compared as float32: against float64 bounds the clamp
loops stay scalar (measured 3x slower), and as rounding to float32 is
monotonic, clamping to the rounded bounds gives the same float32 values.

Hot loops index with unsigned integers: numba adds no negative-index
wraparound to those, which would stop the loops vectorizing, and flat
indices need no slices (whose reference counting costs more than a short
pass).
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numba
import numpy as np

from nxrt_ep_cpu.jit import inline, isa, njit
from nxrt_ep_cpu.jit.vectors import operations
from nxrt_ep_cpu.jit.vectors import stack as _stack

#: FMA contraction only: NaN and inf keep their meaning.
_FMA = {"contract"}
#: What the direct kernel rounds its passes up to: a multiple of every level's vector width
#: (16 float32 lanes of AVX-512, 8 of AVX2).
ROUND = 16


@inline
def _at(start, shift, zero):  # pragma: no cover - numba
    """Where a tap's run starts: ``start + shift``, or the zero block for a padding tap
    (``start < 0``); unsigned, as the hot loops' indices are."""
    return np.uint64(zero if start < 0 else start + shift)


@inline
def _at3(starts, t, shift, zero):  # pragma: no cover - numba
    """:func:`_at` for taps ``t``, ``t + 1`` and ``t + 2``."""
    return (
        _at(starts[t], shift, zero),
        _at(starts[t + 1], shift, zero),
        _at(starts[t + 2], shift, zero),
    )


@inline
def _pass9(acc, buf, starts, weights, t, shift, zero, n, first):  # pragma: no cover - numba
    """``acc[:n] (=|+=) sum of weights[t + k] * tap t + k's run``, for nine taps."""
    s0, s1, s2 = _at3(starts, t, shift, zero)
    s3, s4, s5 = _at3(starts, t + 3, shift, zero)
    s6, s7, s8 = _at3(starts, t + 6, shift, zero)
    w0, w1, w2 = weights[t], weights[t + 1], weights[t + 2]
    w3, w4, w5 = weights[t + 3], weights[t + 4], weights[t + 5]
    w6, w7, w8 = weights[t + 6], weights[t + 7], weights[t + 8]
    # three chains of three: a short dependency chain per value
    if first:
        for i in range(np.uint64(n)):
            acc[i] = (
                (w0 * buf[s0 + i] + w1 * buf[s1 + i] + w2 * buf[s2 + i])
                + (w3 * buf[s3 + i] + w4 * buf[s4 + i] + w5 * buf[s5 + i])
            ) + (w6 * buf[s6 + i] + w7 * buf[s7 + i] + w8 * buf[s8 + i])
    else:
        for i in range(np.uint64(n)):
            acc[i] += (
                (w0 * buf[s0 + i] + w1 * buf[s1 + i] + w2 * buf[s2 + i])
                + (w3 * buf[s3 + i] + w4 * buf[s4 + i] + w5 * buf[s5 + i])
            ) + (w6 * buf[s6 + i] + w7 * buf[s7 + i] + w8 * buf[s8 + i])


@inline
def _pass3(acc, buf, starts, weights, t, shift, zero, n, first):  # pragma: no cover - numba
    """:func:`_pass9` for three taps."""
    s0, s1, s2 = _at3(starts, t, shift, zero)
    w0, w1, w2 = weights[t], weights[t + 1], weights[t + 2]
    if first:
        for i in range(np.uint64(n)):
            acc[i] = w0 * buf[s0 + i] + w1 * buf[s1 + i] + w2 * buf[s2 + i]
    else:
        for i in range(np.uint64(n)):
            acc[i] += w0 * buf[s0 + i] + w1 * buf[s1 + i] + w2 * buf[s2 + i]


@inline
def _pair9(acc, other, buf, starts, wa, wb, t, shift, zero, n, first):  # pragma: no cover
    """:func:`_pass9` for two filters at once (``acc`` and ``acc[other:]``): the nine runs
    are read once for both."""
    s0, s1, s2 = _at3(starts, t, shift, zero)
    s3, s4, s5 = _at3(starts, t + 3, shift, zero)
    s6, s7, s8 = _at3(starts, t + 6, shift, zero)
    a0, a1, a2 = wa[t], wa[t + 1], wa[t + 2]
    a3, a4, a5 = wa[t + 3], wa[t + 4], wa[t + 5]
    a6, a7, a8 = wa[t + 6], wa[t + 7], wa[t + 8]
    b0, b1, b2 = wb[t], wb[t + 1], wb[t + 2]
    b3, b4, b5 = wb[t + 3], wb[t + 4], wb[t + 5]
    b6, b7, b8 = wb[t + 6], wb[t + 7], wb[t + 8]
    o = np.uint64(other)
    if first:
        for i in range(np.uint64(n)):
            x0, x1, x2 = buf[s0 + i], buf[s1 + i], buf[s2 + i]
            x3, x4, x5 = buf[s3 + i], buf[s4 + i], buf[s5 + i]
            x6, x7, x8 = buf[s6 + i], buf[s7 + i], buf[s8 + i]
            acc[i] = ((a0 * x0 + a1 * x1 + a2 * x2) + (a3 * x3 + a4 * x4 + a5 * x5)) + (
                a6 * x6 + a7 * x7 + a8 * x8
            )
            acc[o + i] = ((b0 * x0 + b1 * x1 + b2 * x2) + (b3 * x3 + b4 * x4 + b5 * x5)) + (
                b6 * x6 + b7 * x7 + b8 * x8
            )
    else:
        for i in range(np.uint64(n)):
            x0, x1, x2 = buf[s0 + i], buf[s1 + i], buf[s2 + i]
            x3, x4, x5 = buf[s3 + i], buf[s4 + i], buf[s5 + i]
            x6, x7, x8 = buf[s6 + i], buf[s7 + i], buf[s8 + i]
            acc[i] += ((a0 * x0 + a1 * x1 + a2 * x2) + (a3 * x3 + a4 * x4 + a5 * x5)) + (
                a6 * x6 + a7 * x7 + a8 * x8
            )
            acc[o + i] += ((b0 * x0 + b1 * x1 + b2 * x2) + (b3 * x3 + b4 * x4 + b5 * x5)) + (
                b6 * x6 + b7 * x7 + b8 * x8
            )


@inline
def _pair3(acc, other, buf, starts, wa, wb, t, shift, zero, n, first):  # pragma: no cover
    """:func:`_pair9` for three taps."""
    s0, s1, s2 = _at3(starts, t, shift, zero)
    a0, a1, a2 = wa[t], wa[t + 1], wa[t + 2]
    b0, b1, b2 = wb[t], wb[t + 1], wb[t + 2]
    o = np.uint64(other)
    if first:
        for i in range(np.uint64(n)):
            x0, x1, x2 = buf[s0 + i], buf[s1 + i], buf[s2 + i]
            acc[i] = a0 * x0 + a1 * x1 + a2 * x2
            acc[o + i] = b0 * x0 + b1 * x1 + b2 * x2
    else:
        for i in range(np.uint64(n)):
            x0, x1, x2 = buf[s0 + i], buf[s1 + i], buf[s2 + i]
            acc[i] += a0 * x0 + a1 * x1 + a2 * x2
            acc[o + i] += b0 * x0 + b1 * x1 + b2 * x2


@inline
def _emit(acc, src, ys, zs, dst, count, b, has_z, clamp, lo, hi):  # pragma: no cover - numba
    """``ys[dst:dst + count] = clamp(acc[src:] + b + zs[dst:])``: one output row."""
    if has_z and clamp:
        for i in range(count):
            v = acc[src + i] + b + zs[dst + i]
            v = lo if v < lo else v
            ys[dst + i] = hi if v > hi else v
    elif has_z:
        for i in range(count):
            ys[dst + i] = acc[src + i] + b + zs[dst + i]
    elif clamp:
        for i in range(count):
            v = acc[src + i] + b
            v = lo if v < lo else v
            ys[dst + i] = hi if v > hi else v
    else:
        for i in range(count):
            ys[dst + i] = acc[src + i] + b


@inline
def _fill(buf, base, x, plane, height, width, pt, pl, sh, sw, wq, hqwq):  # pragma: no cover
    """Copy the input channel at ``x[plane:]`` (flat, ``height x width``) into its stride
    phases at ``buf[base:]``, padded by ``pt`` rows and ``pl`` columns."""
    pairs = np.uint64(width // 2)
    one, two = np.uint64(1), np.uint64(2)
    for r in range(height):
        row = r + pt
        dst = base + (row % sh) * sw * hqwq + (row // sh) * wq
        src = np.uint64(plane + r * width)
        if sw == 1:
            at = np.uint64(dst + pl)
            for v in range(np.uint64(width)):
                buf[at + v] = x[src + v]
        elif sw == 2:
            # columns 2k and 2k + 1 land in the two phases: one loop writes both, which
            # LLVM vectorizes as paired loads and shuffles (one phase alone: a gather)
            even = pl % 2  # the phase of column 0
            at0 = np.uint64(dst + even * hqwq + pl // 2)
            at1 = np.uint64(dst + (1 - even) * hqwq + (pl + 1) // 2)
            for k in range(pairs):
                buf[at0 + k] = x[src + two * k]
                buf[at1 + k] = x[src + two * k + one]
            if width % 2:
                buf[at0 + pairs] = x[src + two * pairs]
        else:
            for j in range(width):
                col = j + pl
                buf[dst + (col % sw) * hqwq + col // sw] = x[src + np.uint64(j)]


@njit(fastmath=_FMA)
def direct_conv(
    x, weights, starts, bias, z, out, geometry, lo, hi, first, stop
):  # pragma: no cover - compiled by numba
    """Items ``first..stop`` of a grouped 2-D convolution.

    ``x``: (images x channels, height, width); ``out`` and ``z``: (images x filters,
    out height, out width), ``z`` of size 0 for no residual; ``weights``: (filters,
    taps) with the taps of all a group's channels in buffer order, padded with zero
    weights; ``starts``: each tap's offset in the buffer (-1: a padding tap);
    ``bias`` of size 0 for none; ``geometry``: groups, channels per group, filters per
    group, out height, out width, padded row width ``wq``, phase size ``hq x wq``,
    channel block size, buffer size, zero block start, band rows, clamp (0/1), top and
    left pads, strides, filters per item. Items run over (image, group, block of
    filters); filters are computed two at a time.
    """
    pt, pl, sh, sw, fb = geometry[12], geometry[13], geometry[14], geometry[15], geometry[16]
    groups, cg, mg, ho, wo, wq, hqwq, block, size, zero, band, clamp = (
        geometry[0],
        geometry[1],
        geometry[2],
        geometry[3],
        geometry[4],
        geometry[5],
        geometry[6],
        geometry[7],
        geometry[8],
        geometry[9],
        geometry[10],
        geometry[11],
    )
    lo, hi = np.float32(lo), np.float32(hi)  # a float32 clamp (module docstring)
    taps = starts.shape[0]
    channels = groups * cg
    filters = groups * mg
    has_bias = bias.size > 0
    has_z = z.size > 0
    xs = x.reshape(-1)
    ys = out.reshape(-1)
    zs = z.reshape(-1)
    plane_in = x.shape[1] * x.shape[2]
    plane_out = ho * wo
    buf = np.zeros(size, np.float32)
    acc = np.empty(2 * (band * wq + ROUND), np.float32)
    count = np.uint64(wo)
    blocks = -(-mg // fb)
    other = band * wq + ROUND
    for item in range(first, stop):
        image, rest = item // (groups * blocks), item % (groups * blocks)
        group, j0 = rest // blocks, (rest % blocks) * fb
        for ci in range(cg):
            plane = (image * channels + group * cg + ci) * plane_in
            _fill(buf, ci * block, xs, plane, x.shape[1], x.shape[2], pt, pl, sh, sw, wq, hqwq)
        j1 = min(mg, j0 + fb)
        # bands outermost: a band's input rows stay in cache for all the filters
        for r0 in range(0, ho, band):
            r1 = min(ho, r0 + band)
            n = -(-((r1 - r0) * wq) // ROUND) * ROUND
            shift = r0 * wq
            for j in range(j0, j1, 2):
                pair = j + 1 < j1
                m = group * mg + j
                wa = weights[m]
                wb = weights[m + 1] if pair else wa
                t = 0
                while t < taps:
                    if taps - t >= 9:
                        if pair:
                            _pair9(acc, other, buf, starts, wa, wb, t, shift, zero, n, t == 0)
                        else:
                            _pass9(acc, buf, starts, wa, t, shift, zero, n, t == 0)
                        t += 9
                    else:
                        if pair:
                            _pair3(acc, other, buf, starts, wa, wb, t, shift, zero, n, t == 0)
                        else:
                            _pass3(acc, buf, starts, wa, t, shift, zero, n, t == 0)
                        t += 3
                for k in range(2 if pair else 1):
                    b = bias[m + k] if has_bias else np.float32(0.0)
                    target = (image * filters + m + k) * plane_out
                    for r in range(r0, r1):
                        src = np.uint64(k * other + (r - r0) * wq)
                        dst = np.uint64(target + r * wo)
                        _emit(acc, src, ys, zs, dst, count, b, has_z, clamp, lo, hi)


# -- whole images per GEMM -----------------------------------------------------------------


@inline
def _shifted_plane(row, xs, base, source, top, shift, lo, hi, ho, wo, height):  # pragma: no cover
    """One tap's columns of one image where the output rows are as wide as the input's and
    the strides are 1: the tap's input is then the plane itself shifted by ``top`` rows
    and ``shift`` columns, copied in one run; the rows and the few columns it takes from
    the padding are zeroed after."""
    first_row = min(ho, max(0, -top))
    last_row = max(first_row, min(ho, height - top))
    for p in range(np.uint64(base), np.uint64(base + first_row * wo)):
        row[p] = 0.0
    for p in range(np.uint64(base + last_row * wo), np.uint64(base + ho * wo)):
        row[p] = 0.0
    offset = top * wo + shift  # where output position p reads: source + offset + p
    start = max(first_row * wo, -offset)
    stop = min(last_row * wo, height * wo - offset)
    if stop > start:
        dst = np.uint64(base + start)
        src = np.uint64(source + offset + start)
        for p in range(np.uint64(stop - start)):
            row[dst + p] = xs[src + p]
    for oy in range(first_row, last_row):
        at = base + oy * wo
        for ox in range(lo):
            row[at + ox] = 0.0
        for ox in range(hi, wo):
            row[at + ox] = 0.0


@njit
def image_columns(x, cols, geometry, first, stop):  # pragma: no cover - compiled by numba
    """The GEMM columns of images ``first..stop`` of a grouped 2-D convolution.

    ``x``: (images, channels, height, width); ``cols``: (groups, taps x channels per
    group, images x out pixels), row ``tap x cg + channel``, column ``image x pixels +
    out row x wo + out column``; values the windows take from the padding are 0.
    ``geometry``: groups, kernel height and width, strides, dilations, top and left
    pads, out height and width.
    """
    groups, kh, kw, sh, sw, dh, dw, pt, pl, ho, wo = (
        geometry[0],
        geometry[1],
        geometry[2],
        geometry[3],
        geometry[4],
        geometry[5],
        geometry[6],
        geometry[7],
        geometry[8],
        geometry[9],
        geometry[10],
    )
    height, width = x.shape[2], x.shape[3]
    cg = x.shape[1] // groups
    pixels = ho * wo
    xs = x.reshape(-1)
    plane = height * width
    step = np.uint64(sw)
    for g in range(groups):
        for ky in range(kh):
            for kx in range(kw):
                # the out columns whose input column lies inside the image
                shift = kx * dw - pl
                lo = min(wo, max(0, -(shift // sw)))
                hi = max(lo, min(wo, (width - 1 - shift) // sw + 1))
                for ci in range(cg):
                    row = cols[g, (ky * kw + kx) * cg + ci]
                    channel = g * cg + ci
                    for image in range(first, stop):
                        base = (image - first) * pixels
                        source = (image * x.shape[1] + channel) * plane
                        if sh == 1 and sw == 1 and wo == width:
                            _shifted_plane(
                                row, xs, base, source, ky * dh - pt, shift, lo, hi, ho, wo, height
                            )
                            continue
                        for oy in range(ho):
                            iy = oy * sh + ky * dh - pt
                            at = np.uint64(base + oy * wo)
                            if iy < 0 or iy >= height:
                                for ox in range(np.uint64(wo)):
                                    row[at + ox] = 0.0
                                continue
                            for ox in range(np.uint64(lo)):
                                row[at + ox] = 0.0
                            for ox in range(np.uint64(hi), np.uint64(wo)):
                                row[at + ox] = 0.0
                            src = np.uint64(source + iy * width + lo * sw + shift)
                            dst = np.uint64(at + lo)
                            if sw == 1:
                                for ox in range(np.uint64(hi - lo)):
                                    row[dst + ox] = xs[src + ox]
                            else:
                                for ox in range(np.uint64(hi - lo)):
                                    row[dst + ox] = xs[src + ox * step]


@njit
def columns_to_images(product, out, bias, z, first, lo, hi, clamp):  # pragma: no cover
    """``out[first + i, m] = clamp(product[m, i x pixels:] + bias[m] + z[first + i, m])``:
    the GEMM's ``(filters, images x pixels)`` product moved to ``(images, filters,
    pixels)`` with the fused terms; ``bias``/``z`` of size 0 for none."""
    filters, pixels = out.shape[1], out.shape[2]
    images = product.shape[1] // pixels
    lo, hi = np.float32(lo), np.float32(hi)  # a float32 clamp (module docstring)
    has_bias = bias.size > 0
    has_z = z.size > 0
    count = np.uint64(pixels)
    for i in range(images):
        for m in range(filters):
            src = product[m, i * pixels : (i + 1) * pixels]
            dst = out[first + i, m]
            b = bias[m] if has_bias else np.float32(0.0)
            if has_z:
                zr = z[first + i, m]
                for p in range(count):
                    dst[p] = src[p] + b + zr[p]
            else:
                for p in range(count):
                    dst[p] = src[p] + b
            if clamp:
                for p in range(count):
                    v = dst[p]
                    v = lo if v < lo else v
                    dst[p] = hi if v > hi else v


# -- depthwise, a vector of channels at a time ------------------------------------------------
#
# On small maps the padded rows above cost too much (a 7x7 kernel on a 7x7 map computes
# 13 values per row for 7 kept). There each block of LANES channels (a vector register:
# 16 on AVX-512, 8 on AVX2, see ``isa.py``) is moved to channels-last (LANES values per
# pixel) and each output pixel is one vector: a multiply-add per tap, eight pixels at a
# time sharing the tap's weight vector (eight accumulators: half of AVX2's registers),
# nothing computed in the padding. numba leaves fixed-width loops scalar (its SLP
# vectorizer is off), so the vector operations are LLVM IR (``vectors.py``); the loops
# read their level's LANES and those operations (_fma, _copy, _clamp, _transpose) as
# globals, laid over this module's by :func:`kernels`.
# ruff: noqa: F821


def kernels(level: str | None = None) -> SimpleNamespace:
    """The channel-blocked depthwise loops below compiled for ``level`` (default: the
    target's, ``isa.level()``), with its ``LANES``: the channels of a block."""
    return _kernels(level or isa.level())


@functools.cache
def _kernels(level: str) -> SimpleNamespace:
    chosen = isa.LEVELS[level]
    constants = {"LEVEL": chosen.name, "LANES": chosen.lanes, "STACK": 8 * chosen.lanes}
    constants.update(operations(chosen.lanes, chosen.fma))
    return isa.specialize(globals(), chosen.name, constants)


@inline
def _aligned(size):  # pragma: no cover - numba
    """``np.zeros(size)`` starting on a cache line: vector loads that straddle two lines
    cost twice (measured: the multiply-adds of a 56x56 map 137 against 99 us)."""
    buf = np.zeros(size + 16, np.float32)
    skip = (-buf.ctypes.data % 64) // 4
    return buf[skip : skip + size]


@isa.tiled()
def depthwise_blocks(
    x, weights, bias, offsets, z, out, geometry, lo, hi, first, stop
):  # pragma: no cover - compiled by numba
    """Items ``first..stop`` (over images x blocks of LANES channels) of a depthwise 2-D
    convolution, one filter per channel.

    ``x``: (images x channels, height, width); ``out`` and ``z``: (images x channels,
    out height, out width), ``z`` of size 0 for no residual; ``weights``: (blocks, taps x
    LANES), tap-major; ``bias``: (blocks, 4 x LANES), each block's biases four times (zeros
    for none); ``offsets``: each tap's offset in the padded channels-last buffer; ``geometry``:
    channels, height, width, out height, out width, top and left pads, strides, padded
    width and height, clamp (0/1).
    """
    channels, height, width, ho, wo, pt, pl, sh, sw, wp, hp, clamp = (
        geometry[0],
        geometry[1],
        geometry[2],
        geometry[3],
        geometry[4],
        geometry[5],
        geometry[6],
        geometry[7],
        geometry[8],
        geometry[9],
        geometry[10],
        geometry[11],
    )
    blocks = -(-channels // LANES)
    taps = offsets.shape[0]
    lo, hi = np.float32(lo), np.float32(hi)  # a float32 clamp (module docstring)
    xs = x.reshape(-1)
    ys = out.reshape(-1)
    zs = z.reshape(-1)
    has_z = z.size > 0
    pixels = height * width
    outputs = ho * wo
    padded = _aligned(hp * wp * LANES + 64)  # the border stays zero
    interleaved = np.zeros(pixels * LANES + LANES, np.float32)  # unused lanes stay finite
    result = _aligned(outputs * LANES + 64)
    step = sw * LANES
    acc = numba.carray(_stack(STACK), (STACK,))
    for item in range(first, stop):
        image, block = item // blocks, item % blocks
        c0 = block * LANES
        lanes = min(LANES, channels - c0)
        w = weights[block]
        b = bias[block]
        source = (image * channels + c0) * pixels
        # the block's channels to channels-last, LANES pixels per register transpose: straight
        # into the padded rows when they are that wide, else through the whole plane
        # (the last LANES of a row or plane overlap the chunk before: no scalar tail)
        if lanes == LANES and width >= LANES:
            for r in range(height):
                at = ((r + pt) * wp + pl) * LANES
                src = source + r * width
                for j0 in range(0, width, LANES):
                    j0 = min(j0, width - LANES)
                    _transpose(padded, at + j0 * LANES, LANES, xs, src + j0, pixels)
        else:
            if lanes == LANES and pixels >= LANES:
                for p0 in range(0, pixels, LANES):
                    p0 = min(p0, pixels - LANES)
                    _transpose(interleaved, p0 * LANES, LANES, xs, source + p0, pixels)
            else:
                for p in range(pixels):
                    for lane in range(lanes):
                        interleaved[p * LANES + lane] = xs[source + lane * pixels + p]
            for r in range(height):
                at = np.uint64(((r + pt) * wp + pl) * LANES)
                src = np.uint64(r * width * LANES)
                for i in range(np.uint64(width * LANES)):
                    padded[at + i] = interleaved[src + i]
        # eight output pixels at a time (then four, then one), their accumulators in registers
        for oy in range(ho):
            row = oy * sh * wp * LANES
            ox = 0
            while ox + 8 <= wo:
                base = row + ox * step
                for k in range(0, 8 * LANES, 4 * LANES):
                    _copy(acc, k, b, 0)
                    _copy(acc, k + 1 * LANES, b, 1 * LANES)
                    _copy(acc, k + 2 * LANES, b, 2 * LANES)
                    _copy(acc, k + 3 * LANES, b, 3 * LANES)
                for t in range(taps):
                    at = base + offsets[t]
                    _fma(acc, 0, padded, at, w, t * LANES)
                    _fma(acc, 1 * LANES, padded, at + step, w, t * LANES)
                    _fma(acc, 2 * LANES, padded, at + 2 * step, w, t * LANES)
                    _fma(acc, 3 * LANES, padded, at + 3 * step, w, t * LANES)
                    _fma(acc, 4 * LANES, padded, at + 4 * step, w, t * LANES)
                    _fma(acc, 5 * LANES, padded, at + 5 * step, w, t * LANES)
                    _fma(acc, 6 * LANES, padded, at + 6 * step, w, t * LANES)
                    _fma(acc, 7 * LANES, padded, at + 7 * step, w, t * LANES)
                done = (oy * wo + ox) * LANES
                for k in range(0, 8 * LANES, LANES):
                    _copy(result, done + k, acc, k)
                ox += 8
            while ox + 4 <= wo:
                base = row + ox * step
                _copy(acc, 0, b, 0)
                _copy(acc, 1 * LANES, b, 1 * LANES)
                _copy(acc, 2 * LANES, b, 2 * LANES)
                _copy(acc, 3 * LANES, b, 3 * LANES)
                for t in range(taps):
                    at = base + offsets[t]
                    _fma(acc, 0, padded, at, w, t * LANES)
                    _fma(acc, 1 * LANES, padded, at + step, w, t * LANES)
                    _fma(acc, 2 * LANES, padded, at + 2 * step, w, t * LANES)
                    _fma(acc, 3 * LANES, padded, at + 3 * step, w, t * LANES)
                done = (oy * wo + ox) * LANES
                _copy(result, done, acc, 0)
                _copy(result, done + 1 * LANES, acc, LANES)
                _copy(result, done + 2 * LANES, acc, 2 * LANES)
                _copy(result, done + 3 * LANES, acc, 3 * LANES)
                ox += 4
            while ox < wo:
                base = row + ox * step
                _copy(acc, 0, b, 0)
                for t in range(taps):
                    _fma(acc, 0, padded, base + offsets[t], w, t * LANES)
                _copy(result, (oy * wo + ox) * LANES, acc, 0)
                ox += 1
        # back to one plane per channel, then the residual and the clamp
        target = (image * channels + c0) * outputs
        if lanes == LANES and outputs >= LANES:
            for p0 in range(0, outputs, LANES):
                p0 = min(p0, outputs - LANES)
                _transpose(ys, target + p0, outputs, result, p0 * LANES, LANES)
        else:
            for lane in range(lanes):
                for p in range(outputs):
                    ys[target + lane * outputs + p] = result[p * LANES + lane]
        first_value, stop_value = np.uint64(target), np.uint64(target + lanes * outputs)
        if has_z:
            for i in range(first_value, stop_value):
                ys[i] += zs[i]
        if clamp:
            for i in range(first_value, stop_value):
                v = ys[i]
                v = lo if v < lo else v
                ys[i] = hi if v > hi else v


@isa.tiled(inline="always")
def _row_in(ring, at, xs, src, width, lanes, pixels):  # pragma: no cover - numba
    """Input row ``xs[src:src + width]`` of ``lanes`` channels (planes ``pixels`` apart) to
    channels-last at ``ring[at:]``, LANES pixels per register transpose where it can (the
    last LANES of a row overlap the chunk before: no scalar tail)."""
    if lanes == LANES and width >= LANES:
        for j0 in range(0, width, LANES):
            j0 = min(j0, width - LANES)
            _transpose(ring, at + j0 * LANES, LANES, xs, src + j0, pixels)
    else:
        for lane in range(lanes):
            for j in range(width):
                ring[at + j * LANES + lane] = xs[src + lane * pixels + j]


@isa.tiled(inline="always")
def _row_out(ys, dst, row, wo, lanes, outputs):  # pragma: no cover - numba
    """One channels-last output row ``row`` back to ``lanes`` planes at ``ys[dst:]``."""
    if lanes == LANES and wo >= LANES:
        for p0 in range(0, wo, LANES):
            p0 = min(p0, wo - LANES)
            _transpose(ys, dst + p0, outputs, row, p0 * LANES, LANES)
    else:
        for lane in range(lanes):
            for p in range(wo):
                ys[dst + lane * outputs + p] = row[p * LANES + lane]


@isa.tiled()
def depthwise_rows(
    x, weights, bias, columns, rows, z, out, geometry, lo, hi, first, stop
):  # pragma: no cover - compiled by numba
    """:func:`depthwise_blocks` a row at a time, for maps too large for a whole plane of LANES
    channels in channels-last to stay in cache (a 112x112 one is 800 KB).

    Only the input rows the current output row reads are held in channels-last, in a ring
    of ``span`` padded rows (``(kh - 1) x dh + 1``: each input row is moved once), and each
    output row goes back to its planes, with the residual and the clamp, as soon as it is
    computed: all of it stays in L1. Items run over images x blocks of LANES channels x
    ``parts`` bands of output rows (bands balance the pool where blocks are few).
    ``columns``/``rows``: each tap's column offset (x LANES) and padded row offset;
    ``geometry``: channels, height, width, out height, out width, top and left pads,
    strides, padded width, span, clamp (0/1), parts.
    """
    channels, height, width, ho, wo, pt, pl, sh, sw, wp, span, clamp, parts = (
        geometry[0],
        geometry[1],
        geometry[2],
        geometry[3],
        geometry[4],
        geometry[5],
        geometry[6],
        geometry[7],
        geometry[8],
        geometry[9],
        geometry[10],
        geometry[11],
        geometry[12],
    )
    blocks = -(-channels // LANES)
    taps = columns.shape[0]
    lo, hi = np.float32(lo), np.float32(hi)  # a float32 clamp (module docstring)
    xs = x.reshape(-1)
    ys = out.reshape(-1)
    zs = z.reshape(-1)
    has_z = z.size > 0
    pixels = height * width
    outputs = ho * wo
    slot = wp * LANES
    ring = _aligned(span * slot + 64)  # the border columns stay zero
    row = _aligned(wo * LANES + 64)
    zrow = _aligned(wo * LANES + 64)
    at = np.empty(taps, np.int64)
    step = sw * LANES
    acc = numba.carray(_stack(STACK), (STACK,))
    count = np.uint64(wo * LANES)
    early = clamp and not has_z  # clamped in registers (else after the residual)
    for item in range(first, stop):
        image, rest = item // (blocks * parts), item % (blocks * parts)
        block, part = rest // parts, rest % parts
        oy0, oy1 = part * ho // parts, (part + 1) * ho // parts
        c0 = block * LANES
        lanes = min(LANES, channels - c0)
        w = weights[block]
        b = bias[block]
        source = (image * channels + c0) * pixels
        target = (image * channels + c0) * outputs
        filled = oy0 * sh  # the next padded row to move into the ring
        for oy in range(oy0, oy1):
            while filled < oy * sh + span:
                base = (filled % span) * slot
                r = filled - pt
                if 0 <= r < height:
                    _row_in(ring, base + pl * LANES, xs, source + r * width, width, lanes, pixels)
                else:
                    for i in range(np.uint64(base), np.uint64(base + slot)):
                        ring[i] = 0.0
                filled += 1
            top = (oy * sh) % span  # the ring slot of the output row's first input row
            for t in range(taps):
                k = top + rows[t]
                at[t] = (k - span if k >= span else k) * slot + columns[t]
            # eight output pixels at a time (then four, then one), accumulators in registers
            ox = 0
            while ox + 8 <= wo:
                base = ox * step
                for k in range(0, 8 * LANES, 4 * LANES):
                    _copy(acc, k, b, 0)
                    _copy(acc, k + 1 * LANES, b, 1 * LANES)
                    _copy(acc, k + 2 * LANES, b, 2 * LANES)
                    _copy(acc, k + 3 * LANES, b, 3 * LANES)
                for t in range(taps):
                    a = base + at[t]
                    _fma(acc, 0, ring, a, w, t * LANES)
                    _fma(acc, 1 * LANES, ring, a + step, w, t * LANES)
                    _fma(acc, 2 * LANES, ring, a + 2 * step, w, t * LANES)
                    _fma(acc, 3 * LANES, ring, a + 3 * step, w, t * LANES)
                    _fma(acc, 4 * LANES, ring, a + 4 * step, w, t * LANES)
                    _fma(acc, 5 * LANES, ring, a + 5 * step, w, t * LANES)
                    _fma(acc, 6 * LANES, ring, a + 6 * step, w, t * LANES)
                    _fma(acc, 7 * LANES, ring, a + 7 * step, w, t * LANES)
                for k in range(0, 8 * LANES, LANES):
                    if early:
                        _clamp(acc, k, lo, hi)
                    _copy(row, ox * LANES + k, acc, k)
                ox += 8
            while ox + 4 <= wo:
                base = ox * step
                _copy(acc, 0, b, 0)
                _copy(acc, 1 * LANES, b, 1 * LANES)
                _copy(acc, 2 * LANES, b, 2 * LANES)
                _copy(acc, 3 * LANES, b, 3 * LANES)
                for t in range(taps):
                    a = base + at[t]
                    _fma(acc, 0, ring, a, w, t * LANES)
                    _fma(acc, 1 * LANES, ring, a + step, w, t * LANES)
                    _fma(acc, 2 * LANES, ring, a + 2 * step, w, t * LANES)
                    _fma(acc, 3 * LANES, ring, a + 3 * step, w, t * LANES)
                for k in range(0, 4 * LANES, LANES):
                    if early:
                        _clamp(acc, k, lo, hi)
                    _copy(row, ox * LANES + k, acc, k)
                ox += 4
            while ox < wo:
                base = ox * step
                _copy(acc, 0, b, 0)
                for t in range(taps):
                    _fma(acc, 0, ring, base + at[t], w, t * LANES)
                if early:
                    _clamp(acc, 0, lo, hi)
                _copy(row, ox * LANES, acc, 0)
                ox += 1
            # the residual (moved to channels-last too) and the clamp, then out to the planes
            dst = target + oy * wo
            if has_z:
                if lanes == LANES and wo >= LANES:
                    for p0 in range(0, wo, LANES):
                        p0 = min(p0, wo - LANES)
                        _transpose(zrow, p0 * LANES, LANES, zs, dst + p0, outputs)
                else:
                    for lane in range(lanes):
                        for p in range(wo):
                            zrow[p * LANES + lane] = zs[dst + lane * outputs + p]
                for i in range(count):
                    row[i] += zrow[i]
            if clamp and has_z:
                for i in range(count):
                    v = row[i]
                    v = lo if v < lo else v
                    row[i] = hi if v > hi else v
            _row_out(ys, dst, row, wo, lanes, outputs)


# -- the same loops over the EP's pool ----------------------------------------------------------


@njit(parallel=True)
def direct_conv_team(
    x, weights, starts, bias, z, out, geometry, lo, hi, bounds
):  # pragma: no cover - compiled by numba
    """:func:`direct_conv` on items ``bounds[p]..bounds[p + 1]`` for each part ``p``, the
    parts spread over the threads of numba's pool (``jit/threads.py``)."""
    for p in numba.prange(bounds.size - 1):
        direct_conv(x, weights, starts, bias, z, out, geometry, lo, hi, bounds[p], bounds[p + 1])


@isa.tiled(parallel=True)
def depthwise_blocks_team(
    x, weights, bias, offsets, z, out, geometry, lo, hi, bounds
):  # pragma: no cover - compiled by numba
    """:func:`depthwise_blocks` over parts of items, as :func:`direct_conv_team`."""
    for p in numba.prange(bounds.size - 1):
        depthwise_blocks(
            x, weights, bias, offsets, z, out, geometry, lo, hi, bounds[p], bounds[p + 1]
        )


@isa.tiled(parallel=True)
def depthwise_rows_team(
    x, weights, bias, columns, rows, z, out, geometry, lo, hi, bounds
):  # pragma: no cover - compiled by numba
    """:func:`depthwise_rows` over parts of items, as :func:`direct_conv_team`."""
    for p in numba.prange(bounds.size - 1):
        depthwise_rows(
            x, weights, bias, columns, rows, z, out, geometry, lo, hi, bounds[p], bounds[p + 1]
        )

"""Convolutions: Conv and FusedConv, planned per shape; ConvTranspose; DeformConv.

A session runs every Conv node, and the optimizer's ``pkg.nxrt::FusedConv``
(a Conv with a residual input and an activation fused in), as a
:class:`~nxrt_ep_cpu.ops._conv_gemm.ConvKernel`: its registered ``factory``,
which picks a variant per input shape (a GEMM, or for few channels per group
compiled loops; ``numba`` is loaded then, at session creation). The
registered functions are the ops' plain forms: ``conv`` is the reference
convolution (``_conv_reference``), which the quantised convolutions call
too, and ``fused_conv`` runs one ``ConvKernel`` call.
"""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING, cast

import numpy as np

from nxrt.contrib_ops import DOMAIN as FUSED_DOMAIN
from nxrt.errors import KernelFailed
from nxrt.kernel import Cost
from nxrt.registry import estimate_cost
from nxrt_ep_cpu.ops._conv_gemm import ConvKernel
from nxrt_ep_cpu.ops._conv_reference import conv_windows, convolve
from nxrt_ep_cpu.ops._registry import op
from nxrt_ep_cpu.ops._spatial import windows

if TYPE_CHECKING:
    from collections.abc import Sequence

    import onnx_ir as ir


def conv_cost(node: ir.Node) -> Cost:
    """Two flops per multiply-add of the GEMM; bytes of every known input and output."""
    base = estimate_cost(node)
    w = node.inputs[1] if len(node.inputs) > 1 else None
    dims = [v.shape if v is not None else None for v in (w, node.outputs[0])]
    if any(d is None or not all(isinstance(k, int) for k in d) for d in dims):
        return base
    known = cast("list[Sequence[int]]", dims)  # every dim an int: checked above
    return Cost(2 * math.prod(known[1]) * math.prod(known[0][1:]), base.bytes)


@op("Conv", since=(1, 11, 22), cost=conv_cost, factory=ConvKernel.create)
def conv(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None = None,
    /,
    *,
    auto_pad: str = "NOTSET",
    dilations: list[int] | None = None,
    group: int = 1,
    kernel_shape: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> np.ndarray:
    """N-D grouped convolution (cross-correlation), bias added per output channel."""
    win = conv_windows(
        x.shape,
        w.shape,
        auto_pad=auto_pad,
        dilations=dilations,
        group=group,
        kernel_shape=kernel_shape,
        pads=pads,
        strides=strides,
    )
    return convolve(x, w, b, win, group)


@op("FusedConv", since=1, domain=FUSED_DOMAIN, cost=conv_cost, factory=ConvKernel.create)
def fused_conv(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None = None,
    z: np.ndarray | None = None,
    s: np.ndarray | None = None,
    /,
    *,
    activation: str = "",
    activation_params: list[float] | None = None,
    auto_pad: str = "NOTSET",
    dilations: list[int] | None = None,
    group: int = 1,
    kernel_shape: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> np.ndarray:
    """``activation(conv(x * s, w) + b + z)``: a Conv with what surrounds it fused in.

    The optimizer makes it from [Mul by a per-channel scale ``s``] -> Conv ->
    Add/Sum (residual ``z``) -> activation (Relu, Clip, LeakyRelu, Sigmoid, Tanh;
    ONNX Runtime's FusedConv names, and more).
    """
    attrs = {
        "auto_pad": auto_pad,
        "dilations": dilations,
        "group": group,
        "kernel_shape": kernel_shape,
        "pads": pads,
        "strides": strides,
    }
    kernel = ConvKernel(attrs, activation=activation, activation_params=activation_params or ())
    return kernel.run(x, w, b, z, s)


@op("ConvTranspose", since=(1, 11, 22))
def conv_transpose(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None = None,
    /,
    *,
    auto_pad: str = "NOTSET",
    dilations: list[int] | None = None,
    group: int = 1,
    kernel_shape: list[int] | None = None,
    output_padding: list[int] | None = None,
    output_shape: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> np.ndarray:
    """N-D grouped transposed convolution: one matmul, then a strided add per kernel tap.

    Every input position spreads ``w`` over the output; the full result spans
    ``stride * (in - 1) + (kernel - 1) * dilation + 1`` per axis and the output
    is the window of it that ``pads``/``output_shape``/``auto_pad`` select
    (positions outside the full result, e.g. from ``output_padding``, are zero).
    """
    n, c = x.shape[:2]
    rank = x.ndim - 2
    kernel = w.shape[2:]
    if kernel_shape and tuple(kernel_shape) != kernel:
        raise KernelFailed(f"kernel_shape {list(kernel_shape)} does not match weights {w.shape}")
    if w.shape[0] != c or c % group:
        raise KernelFailed(
            f"weights {w.shape} need {c} input channels (first axis) divisible by group {group}"
        )
    m = w.shape[1] * group
    strides = tuple(strides) if strides else (1,) * rank
    dilations = tuple(dilations) if dilations else (1,) * rank
    extra = tuple(output_padding) if output_padding else (0,) * rank
    if isinstance(auto_pad, bytes):
        auto_pad = auto_pad.decode()
    if output_shape is not None and len(output_shape) == rank + 2:
        output_shape = output_shape[2:]
    if output_shape is not None and len(output_shape) != rank:
        raise KernelFailed(f"output_shape {output_shape} must have {rank} values")
    if len(strides) != rank or len(dilations) != rank or len(extra) != rank:
        raise KernelFailed(f"strides, dilations and output_padding need {rank} values each")
    full = tuple(
        s * (i - 1) + (k - 1) * d + 1
        for s, i, k, d in zip(strides, x.shape[2:], kernel, dilations, strict=True)
    )
    begin, out = [], []
    for i in range(rank):
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            size = output_shape[i] if output_shape else x.shape[2 + i] * strides[i]
            total = full[i] + extra[i] - size
            begin.append(total // 2 if auto_pad == "SAME_UPPER" else total - total // 2)
        elif auto_pad == "NOTSET" and output_shape:
            # the spec: a given output_shape generates the pads (explicit ones are ignored),
            # the odd one at the start: pads[start] = total - total / 2; a larger output
            # than the full result (a negative total) is zero-extended at its end, as in
            # onnxruntime and onnx.reference
            size = output_shape[i]
            total = full[i] + extra[i] - size
            begin.append(max(total - total // 2, 0))
        elif auto_pad in ("NOTSET", "VALID"):
            p = pads if pads and auto_pad == "NOTSET" else (0,) * (2 * rank)
            if len(p) != 2 * rank:
                raise KernelFailed(f"pads {list(p)} must have {2 * rank} values")
            size = output_shape[i] if output_shape else full[i] + extra[i] - p[i] - p[i + rank]
            begin.append(p[i])
        else:
            raise KernelFailed(f"unknown auto_pad {auto_pad!r}")
        out.append(max(size, 0))
    # buffer over the full result plus whatever the output reaches outside it
    before = tuple(max(-bg, 0) for bg in begin)
    after = tuple(max(bg + o - f, 0) for bg, o, f in zip(begin, out, full, strict=True))
    buffer = np.zeros(
        (n, m) + tuple(bf + f + a for bf, f, a in zip(before, full, after, strict=True)),
        dtype=np.result_type(x, w),
    )
    taps = math.prod(kernel)
    cols = np.matmul(
        w.reshape(group, c // group, (m // group) * taps).transpose(0, 2, 1),
        x.reshape(n, group, c // group, math.prod(x.shape[2:])),
    ).reshape((n, m) + kernel + x.shape[2:])
    lead = (slice(None), slice(None))
    for tap in itertools.product(*(range(k) for k in kernel)):
        index = tuple(
            slice(bf + t * d, bf + t * d + s * (i - 1) + 1, s)
            for bf, t, d, s, i in zip(before, tap, dilations, strides, x.shape[2:], strict=True)
        )
        buffer[lead + index] += cols[lead + tap]
    window = tuple(
        slice(bf + bg, bf + bg + o) for bf, bg, o in zip(before, begin, out, strict=True)
    )
    y = buffer[lead + window]
    if b is not None:
        y = y + b.reshape((m,) + (1,) * rank).astype(y.dtype, copy=False)
    return y.astype(x.dtype, copy=False)


@op("DeformConv", since=(19, 22))
def deform_conv(
    x: np.ndarray,
    w: np.ndarray,
    offset: np.ndarray,
    b: np.ndarray | None = None,
    mask: np.ndarray | None = None,
    /,
    *,
    dilations: list[int] | None = None,
    group: int = 1,
    kernel_shape: list[int] | None = None,
    offset_group: int = 1,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> np.ndarray:
    """N-D deformable convolution: each kernel tap samples the input at a learned offset.

    Samples are multilinear interpolations of the input (zero outside it),
    scaled by ``mask``; then one grouped matmul as in im2col.
    """
    n, c = x.shape[:2]
    m = w.shape[0]
    spatial = x.shape[2:]
    rank = len(spatial)
    kernel = tuple(kernel_shape) if kernel_shape else w.shape[2:]
    if tuple(kernel) != w.shape[2:]:
        raise KernelFailed(f"kernel_shape {list(kernel)} does not match weights {w.shape}")
    if c % group or m % group or w.shape[1] * group != c or c % offset_group:
        raise KernelFailed(
            f"{c} input channels, weights {w.shape}, group {group} and offset_group "
            f"{offset_group} do not agree"
        )
    win = windows(spatial, kernel, strides=strides, dilations=dilations, pads=pads)
    taps, points = win.taps, math.prod(win.out)
    if offset.shape != (n, offset_group * taps * rank) + win.out:
        raise KernelFailed(
            f"offset must have shape {[n, offset_group * taps * rank, *win.out]}, "
            f"got {list(offset.shape)}"
        )
    offset = offset.reshape(n, offset_group, taps, rank, points).astype(np.float64)
    weight = np.ones((n, offset_group, taps, points), dtype=np.float64)
    if mask is not None:
        weight = mask.reshape(n, offset_group, taps, points).astype(np.float64)
    # sampling position of every (tap, output point) along each axis, before the offsets
    grids = np.meshgrid(*(np.arange(k) for k in kernel), indexing="ij")
    outs = np.meshgrid(*(np.arange(o) for o in win.out), indexing="ij")
    pos = [
        (grids[d].reshape(taps, 1) * win.dilations[d])
        + (outs[d].reshape(1, points) * win.strides[d] - win.begin[d])
        + offset[:, :, :, d]
        for d in range(rank)
    ]
    low = [np.floor(p) for p in pos]
    flat = x.reshape(n, offset_group, c // offset_group, math.prod(spatial))
    cols = np.zeros((n, offset_group, c // offset_group, taps * points), dtype=x.dtype)
    for corner in itertools.product((0, 1), repeat=rank):
        index = np.zeros(low[0].shape, dtype=np.int64)
        scale = weight.copy()
        valid = np.ones(low[0].shape, dtype=bool)
        for d, step in enumerate(corner):
            at = low[d] + step
            scale *= 1.0 - np.abs(pos[d] - at)
            valid &= (at >= 0) & (at < spatial[d])
            index = index * spatial[d] + np.clip(at, 0, spatial[d] - 1).astype(np.int64)
        scale = scale.astype(x.dtype).reshape(n, offset_group, 1, -1)
        values = np.take_along_axis(flat, index.reshape(n, offset_group, 1, -1), axis=3)
        # a corner outside the input is zero, never read: a NaN or infinity at the clamped
        # position must not leak in as 0 * inf
        cols += np.where(valid.reshape(n, offset_group, 1, -1), values * scale, 0)
    cols = cols.reshape(n, group, (c // group) * taps, points)
    y = np.matmul(w.reshape(group, m // group, -1), cols).reshape((n, m) + win.out)
    if b is not None:
        y += b.reshape((m,) + (1,) * rank).astype(y.dtype, copy=False)
    return y.astype(x.dtype, copy=False)

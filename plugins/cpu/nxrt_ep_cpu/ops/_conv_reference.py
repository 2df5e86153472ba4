"""The reference convolution: any rank, any dtype, every padding, in plain numpy.

:func:`conv_windows` checks a Conv's attributes against its input and weight
shapes and resolves where its windows lie; :func:`convolve` computes the
convolution from them. Conv's registered function is these two in a row. The
GEMM-planned kernel (``_conv_gemm``) checks attributes with the same
:func:`conv_windows` and falls back to :func:`convolve` for what its variants
do not cover: N-D, half precision, integers (QLinearConv and ConvInteger
convolve in float64), cropping pads, empty tensors.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from nxrt.errors import KernelFailed
from nxrt_ep_cpu.ops._spatial import Windows, pad_for, tap_views, windows


def conv_windows(
    x_shape: Sequence[int],
    w_shape: Sequence[int],
    *,
    auto_pad: str | bytes = "NOTSET",
    dilations: Sequence[int] | None = None,
    group: int = 1,
    kernel_shape: Sequence[int] | None = None,
    pads: Sequence[int] | None = None,
    strides: Sequence[int] | None = None,
) -> Windows:
    """The windows of a Conv (ONNX's attributes), after checking them against the shapes."""
    c, m = x_shape[1], w_shape[0]
    kernel = tuple(w_shape[2:])
    if kernel_shape and tuple(kernel_shape) != kernel:
        raise KernelFailed(f"kernel_shape {list(kernel_shape)} does not match weights {w_shape}")
    if group < 1 or c % group or m % group or w_shape[1] * group != c:
        raise KernelFailed(
            f"{c} input channels, {m} filters of {w_shape[1]} channels and group {group} "
            "do not agree"
        )
    return windows(
        x_shape[2:], kernel, strides=strides, dilations=dilations, pads=pads, auto_pad=auto_pad
    )


def convolve(
    x: np.ndarray, w: np.ndarray, b: np.ndarray | None, win: Windows, group: int
) -> np.ndarray:
    """N-D grouped convolution (cross-correlation), bias added per output channel."""
    if x.dtype.itemsize < 4 and x.dtype.kind == "f":
        # Half-precision sums lose digits; accumulate in float32 and round once.
        wide = convolve(
            x.astype(np.float32),
            w.astype(np.float32),
            None if b is None else b.astype(np.float32),
            win,
            group,
        )
        return wide.astype(x.dtype)
    c, m = x.shape[1], w.shape[0]
    if group == c == m:
        y = _depthwise(x, w, win)
    elif all(k == 1 for k in win.kernel) and not any(win.begin) and not any(win.end):
        y = _pointwise(x, w, win, group)
    else:
        y = _im2col(x, w, win, group)
    if b is not None:
        y += b.reshape((m,) + (1,) * len(win.out)).astype(y.dtype, copy=False)
    return y


def _pointwise(x: np.ndarray, w: np.ndarray, win: Windows, group: int) -> np.ndarray:
    """1x1 kernel without padding: one (grouped) matmul over the strided input."""
    n, c = x.shape[:2]
    m = w.shape[0]
    if any(s != 1 for s in win.strides):
        x = x[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in win.strides)]
    cols = x.reshape(n, group, c // group, math.prod(win.out))
    y = np.matmul(w.reshape(group, m // group, c // group), cols)
    return y.reshape((n, m) + win.out)


def _im2col(x: np.ndarray, w: np.ndarray, win: Windows, group: int) -> np.ndarray:
    """Copy each kernel tap's strided view into columns, then one batched matmul."""
    n, c = x.shape[:2]
    m = w.shape[0]
    xp = pad_for(x, win, 0)
    cols = np.empty((n, c) + win.kernel + win.out, dtype=np.result_type(x, w))
    for tap, view in tap_views(xp, win):
        cols[(slice(None), slice(None)) + tap] = view
    cols = cols.reshape(n, group, (c // group) * win.taps, math.prod(win.out))
    y = np.matmul(w.reshape(group, m // group, -1), cols)
    return y.reshape((n, m) + win.out)


def _depthwise(x: np.ndarray, w: np.ndarray, win: Windows) -> np.ndarray:
    """One filter per channel: accumulate ``tap value * weight`` over the kernel taps."""
    c = x.shape[1]
    xp = pad_for(x, win, 0)
    # per tap, the weight of every channel, shaped to broadcast over the output
    weights = w.reshape(c, win.taps).T.reshape((win.taps, c) + (1,) * len(win.out))
    y = scratch = None
    for i, (_, view) in enumerate(tap_views(xp, win)):
        if y is None:
            y = np.multiply(view, weights[i])
            scratch = np.empty_like(y)
        else:
            np.multiply(view, weights[i], out=scratch)
            y += scratch
    assert y is not None  # a kernel has at least one tap
    return y

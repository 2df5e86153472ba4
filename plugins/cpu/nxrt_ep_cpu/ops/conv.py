"""Convolution as GEMM: 1x1 as a plain matmul, depthwise as a sum over taps, else im2col."""

from __future__ import annotations

import math

import numpy as np

from nxrt.errors import KernelFailed
from nxrt_ep_cpu.ops._registry import op
from nxrt_ep_cpu.ops._spatial import Windows, pad_for, tap_views, windows


@op("Conv", since=(1, 11, 22))
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
    n, c = x.shape[:2]
    m = w.shape[0]
    kernel = tuple(kernel_shape) if kernel_shape else w.shape[2:]
    if tuple(kernel) != w.shape[2:]:
        raise KernelFailed(f"kernel_shape {list(kernel)} does not match weights {w.shape}")
    if c % group or m % group or w.shape[1] * group != c:
        raise KernelFailed(
            f"{c} input channels, {m} filters of {w.shape[1]} channels and group {group} "
            "do not agree"
        )
    win = windows(
        x.shape[2:],
        kernel,
        strides=strides,
        dilations=dilations,
        pads=pads,
        auto_pad=auto_pad,
    )
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
    return y

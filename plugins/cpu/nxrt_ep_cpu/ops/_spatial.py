"""Window geometry shared by Conv and the pools: padding, output sizes, kernel-tap views.

Every spatial op here works on an ``(N, C, *spatial)`` array and visits its
windows one kernel tap at a time: for a tap ``t`` the strided slice
``xp[..., t*d : t*d + s*(o-1) + 1 : s]`` holds that tap's value for every
output position at once, so loops run over taps (9 for a 3x3 kernel), never
over pixels.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from nxrt.errors import KernelFailed

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


@dataclass(frozen=True)
class Windows:
    """Where the windows of one spatial op lie, per spatial axis.

    ``begin`` and ``end`` are the padding on each side (explicit negative
    ``pads`` crop); ``out`` is the number of windows.
    """

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    begin: tuple[int, ...]
    end: tuple[int, ...]
    out: tuple[int, ...]

    @property
    def taps(self) -> int:
        return math.prod(self.kernel)


def windows(
    spatial: Sequence[int],
    kernel: Sequence[int],
    *,
    strides: Sequence[int] | None = None,
    dilations: Sequence[int] | None = None,
    pads: Sequence[int] | None = None,
    auto_pad: str | bytes = "NOTSET",
    ceil_mode: int = 0,
) -> Windows:
    """Resolve ``auto_pad``/``pads`` and the output size of every spatial axis (ONNX rules).

    With ``ceil_mode`` the last window may run past the padded input, but a
    window that would start inside the right padding is dropped.
    """
    rank = len(spatial)
    kernel = tuple(int(k) for k in kernel)
    strides = tuple(int(s) for s in strides) if strides else (1,) * rank
    dilations = tuple(int(d) for d in dilations) if dilations else (1,) * rank
    pads = tuple(int(p) for p in pads) if pads else (0,) * (2 * rank)
    if isinstance(auto_pad, bytes):
        auto_pad = auto_pad.decode()
    if auto_pad not in AUTO_PADS:
        raise KernelFailed(f"unknown auto_pad {auto_pad!r}; expected one of {AUTO_PADS}")
    if len(kernel) != rank or len(strides) != rank or len(dilations) != rank:
        raise KernelFailed(
            f"kernel_shape {kernel}, strides {strides} and dilations {dilations} must each "
            f"have one value per spatial axis ({rank})"
        )
    if len(pads) != 2 * rank:
        raise KernelFailed(f"pads {pads} must have two values per spatial axis ({2 * rank})")
    begin, end, out = [], [], []
    for i, size in enumerate(spatial):
        k, s, d = kernel[i], strides[i], dilations[i]
        extent = (k - 1) * d + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            # SAME pads the input so that there are ceil(size / s) windows; when the
            # kernel is smaller than the stride the windows fit unpadded, and the total
            # padding is 0, never negative (which would crop the input's start).
            n = -(-size // s)
            total = max((n - 1) * s + extent - size, 0)
            small = total // 2
            b = total - small if auto_pad == "SAME_LOWER" else small
            begin.append(b)
            end.append(total - b)
            out.append(n)
            continue
        b, e = (0, 0) if auto_pad == "VALID" else (pads[i], pads[i + rank])
        span = size + b + e - extent
        if ceil_mode:
            n = -(-span // s) + 1
            if (n - 1) * s >= size + b:
                n -= 1
        else:
            n = span // s + 1
        begin.append(b)
        end.append(e)
        out.append(max(n, 0))
    return Windows(kernel, strides, dilations, tuple(begin), tuple(end), tuple(out))


def pad_for(x: np.ndarray, win: Windows, value: float | int) -> np.ndarray:
    """``x`` with exactly the padding its windows touch, filled with ``value``.

    Returns ``x`` itself (no copy) when the windows need no padding. Where a
    window runs past the declared pads (``ceil_mode``), that area gets ``value`` too.
    """
    lead = (slice(None),) * (x.ndim - len(win.kernel))
    x = x[lead + tuple(slice(max(-b, 0), None) for b in win.begin)]
    sizes = x.shape[len(lead) :]
    widths = []
    for i, size in enumerate(sizes):
        n, before = win.out[i], max(win.begin[i], 0)
        need = (n - 1) * win.strides[i] + (win.kernel[i] - 1) * win.dilations[i] + 1 if n else 0
        widths.append((before, max(need - size - before, 0)))
    if not any(b or a for b, a in widths):
        return x
    shape = x.shape[: len(lead)] + tuple(s + b + a for s, (b, a) in zip(sizes, widths, strict=True))
    padded = np.full(shape, value, dtype=x.dtype)
    padded[lead + tuple(slice(b, b + s) for s, (b, _) in zip(sizes, widths, strict=True))] = x
    return padded


def tap_views(xp: np.ndarray, win: Windows) -> Iterator[tuple[tuple[int, ...], np.ndarray]]:
    """Yield ``(tap, view)``: ``view[..., o]`` is the tap's input for output position ``o``."""
    lead = (slice(None),) * (xp.ndim - len(win.kernel))
    for tap in itertools.product(*(range(k) for k in win.kernel)):
        index = tuple(
            slice(t * d, t * d + s * (n - 1) + 1, s) if n else slice(0, 0)
            for t, s, d, n in zip(tap, win.strides, win.dilations, win.out, strict=True)
        )
        yield tap, xp[lead + index]


def lowest(dtype: np.dtype) -> float | int:
    """The identity of max: -inf for floats, the smallest value for integers."""
    if np.issubdtype(dtype, np.floating):
        return -np.inf
    return np.iinfo(dtype).min

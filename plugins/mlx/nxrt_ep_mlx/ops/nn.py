"""Matrix products, convolution, pooling, normalization, Softmax, LRN and Dropout.

ONNX lays images out channels-first (NCHW); MLX convolves channels-last. Conv
moves the channel axis around MLX's ``conv_general`` (constant weights are
moved once, when the claim is compiled); inside one compiled claim the
back-to-back moves between convolutions are views that MLX fuses away.
Pooling works on NCHW directly, as a max or sum over strided slices of the
padded input, one per kernel offset.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from nxrt_ep_mlx._backend import mx
from nxrt_ep_mlx._graph import constant_array
from nxrt_ep_mlx.ops._registry import op

if TYPE_CHECKING:
    import onnx_ir as ir

_AUTO_PADS = ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER")


@op("MatMul", since=(1, 9, 13))
def matmul(a: mx.array, b: mx.array, /) -> mx.array:
    return mx.matmul(a, b)


def _gemm_b(b: mx.array, attrs: Mapping[str, Any]) -> mx.array:
    """``B`` as ``(K, N)``, contiguous: MLX's product runs ~1.7x faster on it than on
    a transposed view (measured on AlexNet's 9216x4096 layer), and weights are constant."""
    return mx.contiguous(b.T) if attrs.get("transB", 0) else b


@op("Gemm", since=(7, 9, 11, 13), prepare={1: _gemm_b})
def gemm(
    a: mx.array,
    b: mx.array,
    c: mx.array | None = None,
    /,
    *,
    alpha: float = 1.0,
    beta: float = 1.0,
    transA: int = 0,  # noqa: N803 - ONNX attribute names
    transB: int = 0,  # noqa: N803
) -> mx.array:
    """``b`` arrives as ``(K, N)`` whatever ``transB`` says (see ``prepare``)."""
    a = a.T if transA else a
    if c is not None and beta != 0.0:
        return mx.addmm(c, a, b, alpha=alpha, beta=beta)
    y = mx.matmul(a, b)
    return y * alpha if alpha != 1.0 else y


def _channels_last_weight(w: mx.array, attrs: Mapping[str, Any]) -> mx.array:
    """ONNX weights ``(O, I/g, k...)`` as MLX wants them: ``(O, k..., I/g)``."""
    return mx.contiguous(mx.moveaxis(w, 1, -1))


def _check_spatial(node: ir.Node, attrs: Mapping[str, Any]) -> str:
    auto_pad = attrs.get("auto_pad", "NOTSET")
    if auto_pad not in _AUTO_PADS:
        return f"auto_pad={auto_pad!r}"
    x = node.inputs[0]
    if x is None or x.shape is None or len(x.shape) < 3:
        return "the input's rank is unknown or below 3"
    return ""


def _pads(
    spatial: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    auto_pad: str,
    pads: Sequence[int] | None,
) -> tuple[list[int], list[int]]:
    """Begin and end padding per spatial axis, ``auto_pad`` resolved."""
    n = len(spatial)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        lo, hi = [], []
        for size, k, s, d in zip(spatial, kernel, strides, dilations):
            total = max(0, (math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size)
            small = total // 2
            lo.append(small if auto_pad == "SAME_UPPER" else total - small)
            hi.append(total - lo[-1])
        return lo, hi
    if auto_pad == "VALID" or not pads:
        return [0] * n, [0] * n
    return list(pads[:n]), list(pads[n:])


@op("Conv", since=(1, 11, 22), prepare={1: _channels_last_weight}, check=_check_spatial)
def conv(
    x: mx.array,
    w: mx.array,
    b: mx.array | None = None,
    /,
    *,
    auto_pad: str = "NOTSET",
    dilations: Sequence[int] | None = None,
    group: int = 1,
    kernel_shape: Sequence[int] | None = None,
    pads: Sequence[int] | None = None,
    strides: Sequence[int] | None = None,
) -> mx.array:
    """``w`` arrives channels-last (see ``prepare``); the bias is added channels-last too.

    MLX's CPU convolution is slow with groups (about 50x at AlexNet's
    group=2): grouped convolutions run as one convolution per group, and
    depthwise ones as a multiply-add per kernel offset, which ``mx.compile`` fuses.
    """
    n = x.ndim - 2
    strides = list(strides or [1] * n)
    dilations = list(dilations or [1] * n)
    kernel = list(w.shape[1:-1])
    lo, hi = _pads(x.shape[2:], kernel, strides, dilations, auto_pad, pads)
    x = mx.moveaxis(x, 1, -1)
    if group == 1:
        y = mx.conv_general(x, w, stride=strides, padding=(lo, hi), kernel_dilation=dilations)
    elif group == x.shape[-1] == w.shape[0] and w.shape[-1] == 1:
        y = _depthwise(x, w, strides, dilations, lo, hi)
    else:
        y = mx.concatenate(
            [
                mx.conv_general(xg, wg, stride=strides, padding=(lo, hi), kernel_dilation=dilations)
                for xg, wg in zip(mx.split(x, group, axis=-1), mx.split(w, group, axis=0))
            ],
            axis=-1,
        )
    if b is not None:
        y = y + b
    return mx.moveaxis(y, -1, 1)


def _depthwise(
    x: mx.array,
    w: mx.array,
    strides: Sequence[int],
    dilations: Sequence[int],
    lo: Sequence[int],
    hi: Sequence[int],
) -> mx.array:
    """Channels-last depthwise convolution (one filter per channel, ``w``: ``(C, k..., 1)``)."""
    n = x.ndim - 2
    if any(lo) or any(hi):
        x = mx.pad(x, [(0, 0), *zip(lo, hi), (0, 0)])
    kernel = w.shape[1:-1]
    out = [
        (x.shape[1 + i] - (kernel[i] - 1) * dilations[i] - 1) // strides[i] + 1 for i in range(n)
    ]
    y = None
    for offset in itertools.product(*(range(k) for k in kernel)):
        index = [slice(None)]
        for o, s, d, size in zip(offset, strides, dilations, out):
            index.append(slice(o * d, o * d + (size - 1) * s + 1, s))
        term = x[tuple(index)] * w[(slice(None), *offset, 0)]
        y = term if y is None else y + term
    assert y is not None  # a kernel has at least one tap
    return y


def _check_pool(node: ir.Node, attrs: Mapping[str, Any]) -> str:
    if "kernel_shape" not in attrs:
        return "kernel_shape is missing"
    if attrs.get("storage_order", 0) != 0:
        return "storage_order=1 only changes the Indices output, which mlx does not produce"
    return _check_spatial(node, attrs)


def _pool_geometry(
    spatial: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int] | None,
    dilations: Sequence[int] | None,
    auto_pad: str,
    pads: Sequence[int] | None,
    ceil_mode: int,
) -> tuple[list[int], list[int], list[int], list[int], list[int]]:
    """Strides, dilations, begin/end padding (ceil mode's extra included), output size.

    In ceil mode the last window must start inside the input or its begin
    padding, as ONNX Runtime (and PyTorch) count it.
    """
    n = len(spatial)
    strides = list(strides or [1] * n)
    dilations = list(dilations or [1] * n)
    lo, hi = _pads(spatial, kernel, strides, dilations, auto_pad, pads)
    out = []
    for i in range(n):
        span = (kernel[i] - 1) * dilations[i] + 1
        room = spatial[i] + lo[i] + hi[i] - span
        size = (-(-room // strides[i]) if ceil_mode else room // strides[i]) + 1
        if ceil_mode and (size - 1) * strides[i] >= spatial[i] + lo[i]:
            size -= 1
        out.append(size)
    return strides, dilations, lo, hi, out


def _windows(x: Any, kernel: Sequence[int], strides, dilations, out) -> list[Any]:
    """One strided slice of ``x`` (padded, NC...) per kernel offset."""
    slices = []
    for offset in itertools.product(*(range(k) for k in kernel)):
        index = [slice(None), slice(None)]
        for o, s, d, size in zip(offset, strides, dilations, out):
            start = o * d
            index.append(slice(start, start + (size - 1) * s + 1, s))
        slices.append(x[tuple(index)])
    return slices


def _pad_spatial(x: mx.array, lo: Sequence[int], hi: Sequence[int], value: float) -> mx.array:
    if not any(lo) and not any(hi):
        return x
    widths = [(0, 0), (0, 0), *zip(lo, hi)]
    return mx.pad(x, widths, constant_values=value)


def _ceil_extra(spatial, kernel, strides, dilations, lo, hi, out) -> list[int]:
    """End padding beyond ``hi`` that ceil mode's last window reaches."""
    return [
        max(0, (o - 1) * s + (k - 1) * d + 1 - (size + a + b))
        for size, k, s, d, a, b, o in zip(spatial, kernel, strides, dilations, lo, hi, out)
    ]


@op("MaxPool", since=(1, 8, 10, 11, 12, 22), check=_check_pool)
def max_pool(
    x: mx.array,
    /,
    *,
    auto_pad: str = "NOTSET",
    ceil_mode: int = 0,
    dilations: Sequence[int] | None = None,
    kernel_shape: Sequence[int],
    pads: Sequence[int] | None = None,
    storage_order: int = 0,
    strides: Sequence[int] | None = None,
) -> mx.array:
    spatial = x.shape[2:]
    strides, dilations, lo, hi, out = _pool_geometry(
        spatial, kernel_shape, strides, dilations, auto_pad, pads, ceil_mode
    )
    extra = _ceil_extra(spatial, kernel_shape, strides, dilations, lo, hi, out)
    padded = _pad_spatial(x, lo, [h + e for h, e in zip(hi, extra)], -math.inf)
    windows = _windows(padded, kernel_shape, strides, dilations, out)
    result = windows[0]
    for window in windows[1:]:
        result = mx.maximum(result, window)
    return result


@op("AveragePool", since=(7, 10, 11, 19, 22), check=_check_pool)
def average_pool(
    x: mx.array,
    /,
    *,
    auto_pad: str = "NOTSET",
    ceil_mode: int = 0,
    count_include_pad: int = 0,
    dilations: Sequence[int] | None = None,
    kernel_shape: Sequence[int],
    pads: Sequence[int] | None = None,
    strides: Sequence[int] | None = None,
) -> mx.array:
    """The divisor per output position is computed once, with numpy, at trace time.

    It counts the cells of each window inside the input, plus the explicit
    padding when ``count_include_pad``; ceil mode's overhang never counts.
    """
    spatial = x.shape[2:]
    strides, dilations, lo, hi, out = _pool_geometry(
        spatial, kernel_shape, strides, dilations, auto_pad, pads, ceil_mode
    )
    extra = _ceil_extra(spatial, kernel_shape, strides, dilations, lo, hi, out)
    ends = [h + e for h, e in zip(hi, extra)]
    padded = _pad_spatial(x, lo, ends, 0.0)
    windows = _windows(padded, kernel_shape, strides, dilations, out)
    total = windows[0]
    for window in windows[1:]:
        total = total + window
    ones = np.ones((1, 1, *spatial), np.float32)
    counted = np.pad(ones, [(0, 0), (0, 0), *zip(lo, hi)], constant_values=count_include_pad)
    counted = np.pad(counted, [(0, 0), (0, 0), *((0, e) for e in extra)])
    count = sum(_windows(counted, kernel_shape, strides, dilations, out))
    return total * mx.array(1.0 / count).astype(x.dtype)


@op("GlobalAveragePool", since=(1, 22))
def global_average_pool(x: mx.array, /) -> mx.array:
    return mx.mean(x, axis=tuple(range(2, x.ndim)), keepdims=True)


@op("GlobalMaxPool", since=(1, 22))
def global_max_pool(x: mx.array, /) -> mx.array:
    return mx.max(x, axis=tuple(range(2, x.ndim)), keepdims=True)


def _check_batch_norm(node: ir.Node, attrs: Mapping[str, Any]) -> str:
    if attrs.get("training_mode", 0):
        return "training_mode=1 (only inference is compiled)"
    if attrs.get("spatial", 1) != 1:
        return "spatial=0"
    return ""


def _at_least_float32(v: mx.array) -> mx.array:
    return v.astype(mx.float32) if v.dtype in (mx.float16, mx.bfloat16) else v


@op("BatchNormalization", since=(7, 9, 14, 15), check=_check_batch_norm)
def batch_normalization(
    x: mx.array,
    scale: mx.array,
    b: mx.array,
    input_mean: mx.array,
    input_var: mx.array,
    /,
    *,
    epsilon: float = 1e-5,
    momentum: float = 0.9,
    spatial: int = 1,
    training_mode: int = 0,
) -> mx.array:
    """Inference form, folded to one multiply-add per element; the fold in float32 at
    least (float16 statistics, which opset 15 allows, would lose three digits in it)."""
    shape = (1, -1) + (1,) * (x.ndim - 2)
    scale, b, input_mean, input_var = (
        _at_least_float32(v) for v in (scale, b, input_mean, input_var)
    )
    factor = scale * mx.rsqrt(input_var + epsilon)
    shift = b - input_mean * factor
    return (x * factor.reshape(shape) + shift.reshape(shape)).astype(x.dtype)


@op("LayerNormalization", since=17, max_outputs=3)
def layer_normalization(
    x: mx.array,
    scale: mx.array,
    b: mx.array | None = None,
    /,
    *,
    axis: int = -1,
    epsilon: float = 1e-5,
    stash_type: int = 1,
) -> tuple[mx.array, mx.array, mx.array]:
    """``mx.fast.layer_norm`` for Y over the last axis; Mean and InvStdDev are computed
    only if the graph reads them (MLX drops what no output needs)."""
    first = axis % x.ndim
    axes = tuple(range(first, x.ndim))
    xs = x.astype(mx.float32) if stash_type == 1 else x
    mean = mx.mean(xs, axis=axes, keepdims=True)
    centered = xs - mean
    inv_std = mx.rsqrt(mx.mean(centered * centered, axis=axes, keepdims=True) + epsilon)
    if first == x.ndim - 1 and scale.ndim == 1 and (b is None or b.ndim == 1):
        y = mx.fast.layer_norm(x, scale, b, epsilon)
    else:
        y = (centered * inv_std).astype(x.dtype) * scale
        if b is not None:
            y = y + b
    return y, mean, inv_std


@op("Softmax", since=(1, 11))
def softmax_1(x: mx.array, /, *, axis: int = 1) -> mx.array:
    """Before opset 13 the input is flattened to 2-D at ``axis``, then normalized per row."""
    first = axis % x.ndim
    rows = math.prod(x.shape[:first])
    return mx.softmax(x.reshape(rows, -1), axis=-1, precise=True).reshape(x.shape)


@op("Softmax", since=13)
def softmax(x: mx.array, /, *, axis: int = -1) -> mx.array:
    return mx.softmax(x, axis=axis, precise=True)


@op("LRN", since=(1, 13))
def lrn(
    x: mx.array,
    /,
    *,
    alpha: float = 0.0001,
    beta: float = 0.75,
    bias: float = 1.0,
    size: int,
) -> mx.array:
    """Sum of squares over a window of ``size`` channels around each channel."""
    channels = x.shape[1]
    before = (size - 1) // 2
    widths = [(0, 0), (before, size - 1 - before)] + [(0, 0)] * (x.ndim - 2)
    squares = mx.pad(x * x, widths)
    total = squares[:, 0:channels]
    for i in range(1, size):
        total = total + squares[:, i : i + channels]
    return x / mx.power(bias + (alpha / size) * total, beta)


@op("Dropout", since=(7, 10))
def dropout_7(x: mx.array, /, *, ratio: float = 0.5) -> mx.array:
    """Inference: the identity."""
    return x


def _check_dropout(node: ir.Node, attrs: Mapping[str, Any]) -> str:
    training = node.inputs[2] if len(node.inputs) > 2 else None
    if training is not None:
        value = constant_array(training)
        if value is None or bool(np.asarray(value).reshape(-1)[0]):
            return "training_mode is not a constant false"
    return ""


@op("Dropout", since=(12, 13, 22), const_inputs=(1, 2), check=_check_dropout)
def dropout(
    x: mx.array,
    ratio: np.ndarray | None = None,
    training_mode: np.ndarray | None = None,
    /,
    *,
    seed: int | None = None,
) -> mx.array:
    """Inference (``training_mode`` absent or false): the identity."""
    return x

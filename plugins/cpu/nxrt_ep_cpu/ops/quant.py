"""Quantisation kernels: QuantizeLinear, DequantizeLinear, QLinear*, *Integer.

Integer products are computed as float64 matmuls/convolutions: every product of
two 8/16-bit values and their sums stay far below 2**53, so the result is exact
while numpy uses BLAS instead of its slow integer matmul loop.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
from onnx import helper

from nxrt.errors import KernelFailed
from nxrt_ep_cpu.ops._registry import op
from nxrt_ep_cpu.ops.conv import conv

#: Integer quantised types and their saturation ranges.
_INT_RANGES = {
    np.dtype(np.uint8): (0, 255),
    np.dtype(np.int8): (-128, 127),
    np.dtype(np.uint16): (0, 65535),
    np.dtype(np.int16): (-32768, 32767),
    np.dtype(ml_dtypes.uint4): (0, 15),
    np.dtype(ml_dtypes.int4): (-8, 7),
    np.dtype(ml_dtypes.uint2): (0, 3),
    np.dtype(ml_dtypes.int2): (-2, 1),
}
#: Float quantised types with an overflow encoding (Inf or NaN): ``saturate`` applies.
_FLOAT8 = {
    np.dtype(ml_dtypes.float8_e4m3fn),
    np.dtype(ml_dtypes.float8_e4m3fnuz),
    np.dtype(ml_dtypes.float8_e5m2),
    np.dtype(ml_dtypes.float8_e5m2fnuz),
}
#: Float quantised types without Inf/NaN: a cast saturates on its own.
_SMALL_FLOATS = {
    np.dtype(ml_dtypes.float4_e2m1fn),
    np.dtype(ml_dtypes.float6_e2m3fn),
    np.dtype(ml_dtypes.float6_e3m2fn),
}
_FLOAT_OUTPUTS = (np.float32, np.float16, ml_dtypes.bfloat16, np.float64)


def _np_dtype(onnx_type: int) -> np.dtype:
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(int(onnx_type)))
    except (KeyError, ValueError, TypeError) as e:
        raise KernelFailed(f"unknown ONNX data type {onnx_type}") from e


def _param(value: np.ndarray, shape: tuple[int, ...], axis: int, block_size: int) -> np.ndarray:
    """A scale or zero point shaped to broadcast against an input of ``shape``.

    Scalar (or one element): per tensor. 1-D: per axis. Same rank as the input
    with ``block_size``: every element repeated ``block_size`` times along ``axis``.
    """
    value = np.asarray(value)
    if value.size == 1:
        return value.reshape(())
    rank = len(shape)
    if not -rank <= axis < rank:
        raise KernelFailed(f"axis {axis} is out of range for an input of rank {rank}")
    axis %= rank
    if not block_size:
        if value.ndim != 1 or value.shape[0] != shape[axis]:
            raise KernelFailed(
                f"a per-axis scale or zero point must be 1-D of length {shape[axis]} "
                f"(input {list(shape)}, axis {axis}), got shape {list(value.shape)}"
            )
        dims = [1] * rank
        dims[axis] = shape[axis]
        return value.reshape(dims)
    if block_size < 0:
        raise KernelFailed(f"block_size must be positive, got {block_size}")
    expected = list(shape)
    expected[axis] = -(-shape[axis] // block_size)
    if list(value.shape) != expected:
        raise KernelFailed(
            f"a blocked scale or zero point for input {list(shape)}, axis {axis} and "
            f"block_size {block_size} must have shape {expected}, got {list(value.shape)}"
        )
    value = np.repeat(value, block_size, axis=axis)
    return value[(slice(None),) * axis + (slice(0, shape[axis]),)]


def _compute_dtype(scale: np.ndarray, precision: int) -> np.dtype:
    """The dtype of ``x / y_scale``: ``precision`` if set, else the scale's float type."""
    if precision:
        return _np_dtype(precision)
    if scale.dtype in (np.float32, np.float16, np.float64, ml_dtypes.bfloat16):
        return scale.dtype
    return np.dtype(np.float32)


def _quantize(
    x: np.ndarray,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray | None,
    *,
    axis: int = 1,
    saturate: int = 1,
    block_size: int = 0,
    output_dtype: int = 0,
    precision: int = 0,
) -> np.ndarray:
    """``saturate(round(x / y_scale) + y_zero_point)`` in the quantised type."""
    if y_zero_point is not None:
        dtype = y_zero_point.dtype
        if output_dtype and _np_dtype(output_dtype) != dtype:
            raise KernelFailed(
                f"output_dtype {_np_dtype(output_dtype)} differs from the zero point's "
                f"type {dtype}; they must agree"
            )
    else:
        dtype = _np_dtype(output_dtype) if output_dtype else np.dtype(np.uint8)
    compute = _compute_dtype(y_scale, precision)
    scale = _param(y_scale, x.shape, axis, block_size).astype(compute, copy=False)
    q = np.divide(x.astype(compute, copy=False), scale)
    if dtype in _INT_RANGES:
        q = np.asarray(np.rint(q), np.float64 if compute == np.float64 else np.float32)
        if y_zero_point is not None:
            q += _param(y_zero_point, x.shape, axis, block_size).astype(q.dtype)
        low, high = _INT_RANGES[dtype]
        np.clip(q, low, high, out=q)
        np.nan_to_num(q, copy=False, nan=low)  # NaN saturates to the lowest, as in onnxruntime
        return q.astype(np.int32).astype(dtype)
    if dtype in _FLOAT8:
        q = q.astype(np.float32, copy=False)
        if saturate:
            info = ml_dtypes.finfo(dtype)
            q = np.clip(q, float(info.min), float(info.max))
        return q.astype(dtype)
    if dtype in _SMALL_FLOATS:
        q = q.astype(np.float32, copy=False)
        if y_zero_point is not None:
            q = q + _param(y_zero_point, x.shape, axis, block_size).astype(np.float32)
        return q.astype(dtype)
    raise KernelFailed(f"QuantizeLinear cannot produce {dtype}; use an 8, 4 or 2-bit type")


@op("QuantizeLinear", since=10)
def quantize_linear_10(
    x: np.ndarray, y_scale: np.ndarray, y_zero_point: np.ndarray | None = None, /
) -> np.ndarray:
    """Per-tensor quantisation to uint8 (default) or int8."""
    return _quantize(x, y_scale, y_zero_point)


# Opset 13 on: two functions, each serving versions whose attributes are a subset of its
# own, with the same defaults (the ONNX checker refuses the others). 19 adds float8 and
# ``saturate``, 21 blocks, ``output_dtype`` and 4/16-bit integers, 23 ``precision`` (the
# dtype of the division) and float4/6 and 2-bit outputs.


@op("QuantizeLinear", since=(13, 19, 21))
def quantize_linear_13(
    x: np.ndarray,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray | None = None,
    /,
    *,
    axis: int = 1,
    block_size: int = 0,
    output_dtype: int = 0,
    saturate: int = 1,
) -> np.ndarray:
    """Quantisation before opset 23, which says nothing of the division's precision: a
    float16 scale divides in float32, as onnxruntime does (from 23, ``precision`` or the
    scale's own type decides)."""
    wide = np.dtype(np.float32 if y_scale.dtype.itemsize < 4 else y_scale.dtype)
    precision = helper.np_dtype_to_tensor_dtype(wide)
    return quantize_linear(
        x, y_scale, y_zero_point, axis=axis, block_size=block_size,
        output_dtype=output_dtype, precision=precision, saturate=saturate,
    )  # fmt: skip


@op("QuantizeLinear", since=(23, 24, 25, 28))
def quantize_linear(
    x: np.ndarray,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray | None = None,
    /,
    *,
    axis: int = 1,
    block_size: int = 0,
    output_dtype: int = 0,
    precision: int = 0,
    saturate: int = 1,
) -> np.ndarray:
    """Per-tensor, per-axis or blocked quantisation."""
    return _quantize(
        x,
        y_scale,
        y_zero_point,
        axis=axis,
        saturate=saturate,
        block_size=block_size,
        output_dtype=output_dtype,
        precision=precision,
    )


def _dequantize(
    x: np.ndarray,
    x_scale: np.ndarray,
    x_zero_point: np.ndarray | None,
    *,
    axis: int = 1,
    block_size: int = 0,
    output_dtype: int = 0,
) -> np.ndarray:
    """``(x - x_zero_point) * x_scale`` in the scale's type (or ``output_dtype``)."""
    if output_dtype:
        out = _np_dtype(output_dtype)
    elif x_scale.dtype in _FLOAT_OUTPUTS:
        out = x_scale.dtype
    else:
        raise KernelFailed(
            f"DequantizeLinear with a {x_scale.dtype} scale needs the output_dtype attribute"
        )
    wide = np.float64 if x.dtype in (np.int32, np.uint32) else np.float32
    dx = x.astype(wide)
    if x_zero_point is not None and x.dtype not in _FLOAT8 | _SMALL_FLOATS:
        if x_zero_point.dtype != x.dtype:
            raise KernelFailed(
                f"zero point type {x_zero_point.dtype} differs from the input's {x.dtype}"
            )
        dx -= _param(x_zero_point, x.shape, axis, block_size).astype(wide)
    dx *= _param(x_scale, x.shape, axis, block_size).astype(wide)
    return dx.astype(out, copy=False)


@op("DequantizeLinear", since=10)
def dequantize_linear_10(
    x: np.ndarray, x_scale: np.ndarray, x_zero_point: np.ndarray | None = None, /
) -> np.ndarray:
    """Per-tensor dequantisation."""
    return _dequantize(x, x_scale, x_zero_point)


@op("DequantizeLinear", since=(13, 19, 21, 23, 24, 25, 28))
def dequantize_linear(
    x: np.ndarray,
    x_scale: np.ndarray,
    x_zero_point: np.ndarray | None = None,
    /,
    *,
    axis: int = 1,
    block_size: int = 0,
    output_dtype: int = 0,
) -> np.ndarray:
    """Per-tensor, per-axis or blocked dequantisation (as QuantizeLinear, one function
    for every version from 13; 23 adds ``output_dtype``, needed for float8e8m0 scales)."""
    return _dequantize(
        x, x_scale, x_zero_point, axis=axis, block_size=block_size, output_dtype=output_dtype
    )


@op("DynamicQuantizeLinear", since=11)
def dynamic_quantize_linear(x: np.ndarray, /) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """uint8 quantisation whose range covers ``[min(x, 0), max(x, 0)]``.

    An all-zero (or empty) input has no range: the scale is then 1, as in
    onnxruntime and the C++ line onnx.reference quotes (the spec's formula
    would divide by a zero scale).
    """
    x32 = x.astype(np.float32, copy=False)
    high = np.float32(max(0.0, float(np.max(x32)))) if x.size else np.float32(0)
    low = np.float32(min(0.0, float(np.min(x32)))) if x.size else np.float32(0)
    scale = (high - low) / np.float32(255) if high != low else np.float32(1)
    # saturated as the C++ std::max(0, std::min(255, zp)) of onnxruntime and onnx.reference:
    # a NaN zero point (an infinite input) becomes 255, where np.clip would keep the NaN
    zero = np.rint(np.float32(max(0.0, min(255.0, float(np.float32(0) - low / scale)))))
    y = np.asarray(np.rint(x32 / scale))
    y += zero
    np.clip(y, 0, 255, out=y)
    return y.astype(np.uint8), np.array(scale, dtype=x.dtype), np.array(zero, dtype=np.uint8)


def _widen(v: np.ndarray, zero_point: np.ndarray | None, zp_shape=None) -> np.ndarray:
    """``v - zero_point`` as float64 (exact for 8/16-bit values)."""
    out = v.astype(np.float64)
    if zero_point is not None:
        zp = np.asarray(zero_point, dtype=np.float64)
        out -= zp.reshape(zp_shape) if zp_shape is not None else zp
    return out


def _row_shape(param: np.ndarray | None, a: np.ndarray) -> tuple[int, ...] | None:
    """Reshape for a per-row 1-D parameter of ``a`` (``[..., M, K]``) so it broadcasts."""
    if param is None or param.ndim != 1 or param.size == 1 or a.ndim < 2:
        return None
    if param.shape[0] != a.shape[-2]:
        raise KernelFailed(
            f"a per-row parameter of {param.shape[0]} values does not match {a.shape[-2]} rows"
        )
    return (param.shape[0], 1)


def _as_int32(y: np.ndarray) -> np.ndarray:
    return np.rint(y).astype(np.int32)


@op("MatMulInteger", since=10)
def mat_mul_integer(
    a: np.ndarray,
    b: np.ndarray,
    a_zero_point: np.ndarray | None = None,
    b_zero_point: np.ndarray | None = None,
    /,
) -> np.ndarray:
    """``(A - a_zero_point) @ (B - b_zero_point)`` in int32; zero points per tensor/row/column."""
    wa = _widen(a, a_zero_point, _row_shape(a_zero_point, a))
    wb = _widen(b, b_zero_point)
    return _as_int32(np.matmul(wa, wb))


@op("QLinearMatMul", since=(10, 21))
def q_linear_mat_mul(
    a: np.ndarray,
    a_scale: np.ndarray,
    a_zero_point: np.ndarray,
    b: np.ndarray,
    b_scale: np.ndarray,
    b_zero_point: np.ndarray,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray,
    /,
) -> np.ndarray:
    """Quantised matmul; scales and zero points per tensor, per row of A, per column of B."""
    rows = _row_shape(a_scale, a)
    wa = _widen(a, a_zero_point, _row_shape(a_zero_point, a))
    wb = _widen(b, b_zero_point)
    a_s = a_scale.reshape(rows) if rows else a_scale
    factor = (a_s * b_scale / y_scale).astype(np.float64)
    y = np.matmul(wa, wb) * factor
    return _requantize(y, y_zero_point, a.dtype)


def _requantize(y: np.ndarray, y_zero_point: np.ndarray | None, default: np.dtype) -> np.ndarray:
    """Round to nearest even, add the zero point and saturate to its integer type."""
    dtype = y_zero_point.dtype if y_zero_point is not None else np.dtype(default)
    if dtype not in _INT_RANGES:
        raise KernelFailed(f"quantised output type {dtype} is not supported; use uint8 or int8")
    y = np.asarray(np.rint(y))
    if y_zero_point is not None:
        y += y_zero_point.astype(np.float64)
    low, high = _INT_RANGES[dtype]
    np.clip(y, low, high, out=y)
    return y.astype(dtype)


def _out_channel_param(value: np.ndarray | None, m: int, rank: int) -> np.ndarray | None:
    """A per-tensor or per-output-channel parameter shaped to broadcast over ``(M, ...)``."""
    if value is None:
        return None
    value = np.asarray(value, dtype=np.float64)
    if value.size == 1:
        return value.reshape(())
    if value.ndim != 1 or value.shape[0] != m:
        raise KernelFailed(
            f"a per-channel parameter must be 1-D with {m} values, got shape {list(value.shape)}"
        )
    return value.reshape((m,) + (1,) * (rank - 1))


@op("ConvInteger", since=10)
def conv_integer(
    x: np.ndarray,
    w: np.ndarray,
    x_zero_point: np.ndarray | None = None,
    w_zero_point: np.ndarray | None = None,
    /,
    *,
    auto_pad: str = "NOTSET",
    dilations: list[int] | None = None,
    group: int = 1,
    kernel_shape: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> np.ndarray:
    """Integer convolution of ``x - x_zero_point`` and ``w - w_zero_point`` into int32.

    Padding stands for ``x_zero_point``, i.e. zero once the zero point is removed.
    """
    wx = _widen(x, x_zero_point)
    ww = w.astype(np.float64)
    zp = _out_channel_param(w_zero_point, w.shape[0], w.ndim)
    if zp is not None:
        ww -= zp
    y = conv(
        wx,
        ww,
        auto_pad=auto_pad,
        dilations=dilations,
        group=group,
        kernel_shape=kernel_shape,
        pads=pads,
        strides=strides,
    )
    return _as_int32(y)


@op("QLinearConv", since=10)
def q_linear_conv(
    x: np.ndarray,
    x_scale: np.ndarray,
    x_zero_point: np.ndarray,
    w: np.ndarray,
    w_scale: np.ndarray,
    w_zero_point: np.ndarray,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray,
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
    """Quantised convolution; weights quantised per tensor or per output channel.

    The int32 bias is in the accumulator's scale (``x_scale * w_scale``).
    """
    m, rank = w.shape[0], x.ndim - 1
    wx = _widen(x, x_zero_point)
    ww = w.astype(np.float64)
    zp = _out_channel_param(w_zero_point, m, w.ndim)
    if zp is not None:
        ww -= zp
    acc = conv(
        wx,
        ww,
        auto_pad=auto_pad,
        dilations=dilations,
        group=group,
        kernel_shape=kernel_shape,
        pads=pads,
        strides=strides,
    )
    if b is not None:
        acc += b.astype(np.float64).reshape((m,) + (1,) * (rank - 1))
    w_s = w_scale.reshape((m,) + (1,) * (rank - 1)) if w_scale.size > 1 else w_scale
    factor = (x_scale * w_s / y_scale).astype(np.float64)
    return _requantize(acc * factor, y_zero_point, x.dtype)

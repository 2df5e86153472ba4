"""Quantisation kernels: QuantizeLinear, DequantizeLinear, QLinear*, *Integer.

Here the numpy kernels: integer products are computed as float64
matmuls/convolutions (every product of two 8/16-bit values and their sums stay
far below 2**53, so the result is exact while numpy uses BLAS instead of its
slow integer matmul loop), requantized in float32 as ONNX Runtime does. The
compiled integer kernels (``_quant_gemm.py``: u8 x s8 products summed in int32)
compute the same numbers and replace them once built.
"""

from __future__ import annotations

import threading
from typing import Any, cast

import ml_dtypes
import numpy as np
import onnx
import onnx.defs
from onnx import helper

from nxrt.contrib_ops import DOMAIN as NXRT_DOMAIN
from nxrt.errors import KernelFailed
from nxrt_ep_cpu.ops._quant_gemm import (
    DequantizeKernel,
    DynamicQuantizeKernel,
    MatMulIntegerKernel,
    MatMulIntegerToFloatKernel,
    QGemmKernel,
    QLinearConvKernel,
    QLinearMatMulKernel,
    QuantizedAddKernel,
    QuantizeKernel,
    integer_kernel,
    multiplier,
    range_parameters,
)
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


def _quantizer(ep, node, fn):
    """QuantizeLinear's kernel: per-tensor float32 to 8 bits in one compiled pass."""
    return integer_kernel(ep, node, QuantizeKernel, fn)


def _dequantizer(ep, node, fn):
    """DequantizeLinear's kernel: per-tensor 8 bits to float32 in one compiled pass."""
    return integer_kernel(ep, node, DequantizeKernel, fn)


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
        rounded: type[np.floating] = np.float64 if compute == np.float64 else np.float32
        q = np.asarray(np.rint(q), rounded)
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


@op(
    "QuantizeLinear",
    since=10,
    factory=lambda ep, node: _quantizer(ep, node, quantize_linear_10),
)
def quantize_linear_10(
    x: np.ndarray, y_scale: np.ndarray, y_zero_point: np.ndarray | None = None, /
) -> np.ndarray:
    """Per-tensor quantisation to uint8 (default) or int8."""
    return _quantize(x, y_scale, y_zero_point)


# Opset 13 on: two functions, each serving versions whose attributes are a subset of its
# own, with the same defaults (the ONNX checker refuses the others). 19 adds float8 and
# ``saturate``, 21 blocks, ``output_dtype`` and 4/16-bit integers, 23 ``precision`` (the
# dtype of the division) and float4/6 and 2-bit outputs.


@op(
    "QuantizeLinear",
    since=(13, 19, 21),
    factory=lambda ep, node: _quantizer(ep, node, quantize_linear_13),
)
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


@op(
    "QuantizeLinear",
    since=(23, 24, 25, 28),
    factory=lambda ep, node: _quantizer(ep, node, quantize_linear),
)
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
    wide: type[np.floating] = np.float64 if x.dtype in (np.int32, np.uint32) else np.float32
    dx = x.astype(wide)
    if x_zero_point is not None and x.dtype not in _FLOAT8 | _SMALL_FLOATS:
        if x_zero_point.dtype != x.dtype:
            raise KernelFailed(
                f"zero point type {x_zero_point.dtype} differs from the input's {x.dtype}"
            )
        dx -= _param(x_zero_point, x.shape, axis, block_size).astype(wide)
    dx *= _param(x_scale, x.shape, axis, block_size).astype(wide)
    return dx.astype(out, copy=False)


@op(
    "DequantizeLinear",
    since=10,
    factory=lambda ep, node: _dequantizer(ep, node, dequantize_linear_10),
)
def dequantize_linear_10(
    x: np.ndarray, x_scale: np.ndarray, x_zero_point: np.ndarray | None = None, /
) -> np.ndarray:
    """Per-tensor dequantisation."""
    return _dequantize(x, x_scale, x_zero_point)


@op(
    "DequantizeLinear",
    since=(13, 19, 21, 23, 24, 25, 28),
    factory=lambda ep, node: _dequantizer(ep, node, dequantize_linear),
)
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


@op(
    "DynamicQuantizeLinear",
    since=11,
    factory=lambda ep, node: integer_kernel(
        ep, node, DynamicQuantizeKernel, dynamic_quantize_linear
    ),
)
def dynamic_quantize_linear(x: np.ndarray, /) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """uint8 quantisation whose range covers ``[min(x, 0), max(x, 0)]``.

    An all-zero (or empty) input has no range: the scale is then 1, as in
    onnxruntime and the C++ line onnx.reference quotes (the spec's formula
    would divide by a zero scale).
    """
    x32 = x.astype(np.float32, copy=False)
    if x.size:
        scale, zero = range_parameters(np.max(x32), np.min(x32))
    else:
        scale, zero = range_parameters(np.float32(0), np.float32(0))
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


@op(
    "MatMulInteger",
    since=10,
    factory=lambda ep, node: integer_kernel(ep, node, MatMulIntegerKernel, mat_mul_integer),
)
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


@op(
    "QLinearMatMul",
    since=(10, 21),
    factory=lambda ep, node: integer_kernel(ep, node, QLinearMatMulKernel, q_linear_mat_mul),
)
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
    return _requantize(np.matmul(wa, wb), multiplier(a_s, b_scale, y_scale), y_zero_point, a.dtype)


def _requantize(
    acc: np.ndarray, factor: np.ndarray, y_zero_point: np.ndarray | None, default: np.dtype
) -> np.ndarray:
    """``saturate(rint(float32(acc) * factor) + y_zero_point)``, float32 as ONNX Runtime's
    requantization (``acc`` holds exact integers; ``factor`` is float32)."""
    dtype = y_zero_point.dtype if y_zero_point is not None else np.dtype(default)
    if dtype not in _INT_RANGES:
        raise KernelFailed(f"quantised output type {dtype} is not supported; use uint8 or int8")
    y = np.rint(np.asarray(acc).astype(np.float32) * factor).astype(np.float64)
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


@op(
    "QLinearConv",
    since=10,
    factory=lambda ep, node: integer_kernel(ep, node, QLinearConvKernel, q_linear_conv),
)
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
    return _requantize(acc, multiplier(x_scale, w_s, y_scale), y_zero_point, x.dtype)


# -- com.microsoft ops that onnxruntime.quantization writes, and the optimizer's fusions make --

MS_DOMAIN = "com.microsoft"
NXRT_SINCE = 1
_lock = threading.Lock()


def _ms_schemas() -> list[onnx.defs.OpSchema]:
    """ONNX Runtime's contrib schemas of QGemm and MatMulIntegerToFloat (its docs'
    inputs, types and attribute defaults), so onnx's tools know the ops."""
    schema = onnx.defs.OpSchema
    param = schema.FormalParameter
    optional = schema.FormalParameterOption.Optional
    ints8 = ["tensor(uint8)", "tensor(int8)"]
    qgemm = schema(
        "QGemm",
        MS_DOMAIN,
        1,
        "Quantized Gemm: alpha * (A - a_zero_point) @ (B - b_zero_point) + C, C int32 at "
        "a_scale * b_scale; float output, or quantized with y_scale and y_zero_point.",
        inputs=[
            param("A", "TA", "Input A."),
            param("a_scale", "T", "Scale of A, per tensor."),
            param("a_zero_point", "TA", "Zero point of A, per tensor."),
            param("B", "TB", "Input B."),
            param("b_scale", "T", "Scale of B, per tensor or per column."),
            param("b_zero_point", "TB", "Zero point of B, as its scale."),
            param("C", "TC", "int32 bias.", param_option=optional),
            param("y_scale", "T", "Output scale.", param_option=optional),
            param("y_zero_point", "TYZ", "Output zero point.", param_option=optional),
        ],
        outputs=[param("Y", "TY", "Output.")],
        type_constraints=[
            ("T", ["tensor(float)"], "Scales."),
            ("TA", ints8, "A and its zero point."),
            ("TB", ints8, "B and its zero point."),
            ("TC", ["tensor(int32)"], "The bias."),
            ("TYZ", ints8, "The output zero point."),
            ("TY", ["tensor(float)", *ints8], "float32, or y_zero_point's type."),
        ],
        attributes=[
            schema.Attribute("alpha", helper.make_attribute("alpha", 1.0), "Scale of A @ B."),
            schema.Attribute("transA", helper.make_attribute("transA", 0), "Transpose A."),
            schema.Attribute("transB", helper.make_attribute("transB", 0), "Transpose B."),
        ],
    )
    to_float = schema(
        "MatMulIntegerToFloat",
        MS_DOMAIN,
        1,
        "float32(MatMulInteger(A, B, a_zero_point, b_zero_point)) * a_scale * b_scale + bias.",
        inputs=[
            param("A", "T1", "Input A."),
            param("B", "T2", "Input B."),
            param("a_scale", "T3", "Scale of A."),
            param("b_scale", "T3", "Scale of B, per tensor or per column."),
            param("a_zero_point", "T1", "Zero point of A.", param_option=optional),
            param("b_zero_point", "T2", "Zero point of B.", param_option=optional),
            param("bias", "T3", "Bias along the last axis.", param_option=optional),
        ],
        outputs=[param("Y", "T3", "Output.")],
        type_constraints=[
            ("T1", ints8, "A."),
            ("T2", ints8, "B."),
            ("T3", ["tensor(float)", "tensor(float16)"], "Scales, bias and output."),
        ],
    )
    return [qgemm, to_float]


def _nxrt_schemas() -> list[onnx.defs.OpSchema]:
    """``pkg.nxrt::QuantizedAdd``, which the cpu EP's QDQ passes make."""
    schema = onnx.defs.OpSchema
    param = schema.FormalParameter
    ints8 = ["tensor(uint8)", "tensor(int8)"]
    add = schema(
        "QuantizedAdd",
        NXRT_DOMAIN,
        NXRT_SINCE,
        "QuantizeLinear(Relu?(DequantizeLinear(A) + DequantizeLinear(B))), per tensor, in "
        "float32 exactly as the separate ops compute it.",
        inputs=[
            param("A", "TA", "First input."),
            param("a_scale", "T", "Scale of A."),
            param("a_zero_point", "TA", "Zero point of A."),
            param("B", "TB", "Second input, A's shape."),
            param("b_scale", "T", "Scale of B."),
            param("b_zero_point", "TB", "Zero point of B."),
            param("y_scale", "T", "Output scale."),
            param("y_zero_point", "TY", "Output zero point."),
        ],
        outputs=[param("Y", "TY", "Output.")],
        type_constraints=[
            ("T", ["tensor(float)"], "Scales."),
            ("TA", ints8, "A."),
            ("TB", ints8, "B."),
            ("TY", ints8, "Y."),
        ],
        attributes=[
            schema.Attribute("relu", helper.make_attribute("relu", 0), "1: a Relu before Q."),
        ],
    )
    return [add]


def _infer_zero_point_type(ctx) -> None:
    """QuantizedAdd's Y: y_zero_point's type and A's shape."""
    zero, a = ctx.get_input_type(7), ctx.get_input_type(0)
    if zero is None or not zero.HasField("tensor_type"):
        return
    out = onnx.TypeProto()
    out.tensor_type.elem_type = zero.tensor_type.elem_type
    if a is not None and a.HasField("tensor_type") and a.tensor_type.HasField("shape"):
        out.tensor_type.shape.CopyFrom(a.tensor_type.shape)
    ctx.set_output_type(0, out)


def _infer_float_or_zero_point(ctx) -> None:
    """QGemm's Y: y_zero_point's type, or float32 without one."""
    out = onnx.TypeProto()
    zero = ctx.get_input_type(8) if ctx.get_num_inputs() > 8 else None
    has_zero = zero is not None and zero.HasField("tensor_type")
    # has_zero: zero is not None
    out.tensor_type.elem_type = (
        cast(Any, zero).tensor_type.elem_type if has_zero else onnx.TensorProto.FLOAT
    )
    ctx.set_output_type(0, out)


def _infer_scale_type(ctx) -> None:
    """MatMulIntegerToFloat's Y: the scales' type."""
    scale = ctx.get_input_type(2)
    if scale is None or not scale.HasField("tensor_type"):
        return
    out = onnx.TypeProto()
    out.tensor_type.elem_type = scale.tensor_type.elem_type
    ctx.set_output_type(0, out)


def register_schemas() -> None:
    """Make onnx know the com.microsoft ops registered here (idempotent)."""
    inference = {
        "QGemm": _infer_float_or_zero_point,
        "MatMulIntegerToFloat": _infer_scale_type,
        "QuantizedAdd": _infer_zero_point_type,
    }
    with _lock:
        for schema in [*_ms_schemas(), *_nxrt_schemas()]:
            if not onnx.defs.has(schema.name, schema.since_version, schema.domain):
                schema.set_type_and_shape_inference_function(inference[schema.name])
                onnx.defs.register_schema(schema)


register_schemas()


@op(
    "QGemm",
    since=1,
    domain=MS_DOMAIN,
    factory=lambda ep, node: integer_kernel(ep, node, QGemmKernel, q_gemm),
)
def q_gemm(
    a: np.ndarray,
    a_scale: np.ndarray,
    a_zero_point: np.ndarray,
    b: np.ndarray,
    b_scale: np.ndarray,
    b_zero_point: np.ndarray,
    c: np.ndarray | None = None,
    y_scale: np.ndarray | None = None,
    y_zero_point: np.ndarray | None = None,
    /,
    *,
    alpha: float = 1.0,
    transA: int = 0,
    transB: int = 0,
) -> np.ndarray:
    """``alpha * (A' - a_zp) @ (B' - b_zp) + C`` (C int32 at ``a_scale * b_scale``), scaled
    to float32, or requantized to ``y_scale`` and ``y_zero_point`` when given; B per tensor
    or per column (of ``B'``)."""
    wa = _widen(a.T if transA else a, a_zero_point)
    bt = b.T if transB else b
    wb = bt.astype(np.float64)
    if b_zero_point is not None:
        wb -= np.asarray(b_zero_point, np.float64).reshape(-1)
    acc = np.matmul(wa, wb)
    if c is not None:
        acc += c.astype(np.float64)
    scale = np.float32(alpha) * multiplier(a_scale, b_scale.reshape(-1), np.float32(1.0))
    if y_scale is None:
        return np.asarray(acc).astype(np.float32) * scale
    factor = (scale / np.asarray(y_scale, np.float32)).astype(np.float32)
    return _requantize(acc, factor, y_zero_point, a.dtype)


@op(
    "MatMulIntegerToFloat",
    since=1,
    domain=MS_DOMAIN,
    factory=lambda ep, node: integer_kernel(
        ep, node, MatMulIntegerToFloatKernel, mat_mul_integer_to_float
    ),
)
def mat_mul_integer_to_float(
    a: np.ndarray,
    b: np.ndarray,
    a_scale: np.ndarray,
    b_scale: np.ndarray,
    a_zero_point: np.ndarray | None = None,
    b_zero_point: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    /,
) -> np.ndarray:
    """``float32(MatMulInteger(A, B)) * float32(a_scale * b_scale) + bias`` in float32, each
    step rounded as the separate ops round it (MatMulInteger, Cast, Mul, Add)."""
    acc = mat_mul_integer(a, b, a_zero_point, b_zero_point).astype(np.float32)
    y = acc * (a_scale.astype(np.float32) * b_scale.astype(np.float32))
    return y + bias if bias is not None else y


@op(
    "QuantizedAdd",
    since=NXRT_SINCE,
    domain=NXRT_DOMAIN,
    factory=lambda ep, node: integer_kernel(ep, node, QuantizedAddKernel, quantized_add),
)
def quantized_add(
    a: np.ndarray,
    a_scale: np.ndarray,
    a_zero_point: np.ndarray,
    b: np.ndarray,
    b_scale: np.ndarray,
    b_zero_point: np.ndarray,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray,
    /,
    *,
    relu: int = 0,
) -> np.ndarray:
    """``Q(Relu?(DQ(A) + DQ(B)))``: the separate ops, composed (the fusion changes no bit)."""
    total = _dequantize(a, a_scale, a_zero_point) + _dequantize(b, b_scale, b_zero_point)
    if relu:
        total = np.maximum(total, np.float32(0))
    return _quantize(total, y_scale, y_zero_point)

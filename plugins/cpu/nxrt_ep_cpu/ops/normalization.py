"""Normalization kernels: Layer, RMS, Group, Instance, Lp, MeanVariance.

Statistics are computed in the op's ``stash_type`` (float32 by default), or in
the input's dtype when that is wider, then the result is cast back.

The registered functions are the numpy references. A session runs Layer, RMS,
Group and Instance normalization through the kernel of :func:`pooled`: float32
inputs take the compiled row kernels of :mod:`nxrt_ep_cpu.jit.norm` (on the
session's pool for large inputs), every other case the reference, which also
runs until the loops are compiled.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from onnx.helper import tensor_dtype_to_np_dtype

from nxrt.errors import KernelFailed
from nxrt.kernel import attribute_values
from nxrt_ep_cpu.compiling import compiled_kernel
from nxrt_ep_cpu.kernels import CpuKernel, compiled
from nxrt_ep_cpu.ops._registry import op

if TYPE_CHECKING:
    import onnx_ir as ir

    from nxrt.host_parallel import HostParallel
    from nxrt.kernel import Kernel
    from nxrt.provider import ExecutionProvider

_EPSILON = float(np.float32(1e-5))  # the schema default, a float32 value
_FLOAT32 = np.dtype(np.float32)
_STASH_FLOAT = 1  # TensorProto.FLOAT


def pooled(
    fast: Callable[..., Any], reference: Callable[[], Callable[..., Any]]
) -> Callable[[ExecutionProvider, ir.Node], Kernel]:
    """A registry ``factory``: the node's kernel calls ``fast`` with its attributes and
    the session's pool (keyword ``parallel``), for kernels that split large calls; until
    its loops are compiled (:func:`~nxrt_ep_cpu.compiling.compiled_kernel`), the numpy
    ``reference()`` (given as a function that returns it: the op's registered function,
    defined below its decorator)."""

    def factory(ep: ExecutionProvider, node: ir.Node) -> Kernel:
        attrs = attribute_values(node)
        return compiled_kernel(
            ep,
            node,
            lambda: CpuKernel(fast, {**attrs, "parallel": ep.parallel}, variant="numba"),
            lambda: CpuKernel(reference(), attrs),
        )

    return factory


def _float32(*arrays: np.ndarray | None) -> bool:
    return all(a is None or a.dtype == _FLOAT32 for a in arrays)


def _per_value(param: np.ndarray, shape: tuple[int, ...]) -> np.ndarray | None:
    """``param`` broadcast to ``shape`` (the normalized axes), flat and contiguous; None
    when it broadcasts over other axes too (the reference handles that)."""
    if param.shape == shape and param.flags.c_contiguous:
        return param.reshape(-1)
    if param.ndim > len(shape):
        return None
    try:
        full = np.broadcast_to(param, shape)
    except ValueError:
        return None
    return np.ascontiguousarray(full).reshape(-1)


def _stash(stash_type: int, dtype: np.dtype) -> np.dtype:
    """The dtype the statistics are computed in: ``stash_type``, as the spec's function
    bodies cast to it, also when ``dtype`` is wider (float64 with the default float32)."""
    try:
        stash = np.dtype(tensor_dtype_to_np_dtype(stash_type))
    except (KeyError, ValueError) as exc:
        raise KernelFailed(f"stash_type {stash_type} is not a tensor dtype") from exc
    if stash.kind != "f" and stash.kind != "V":
        raise KernelFailed(f"stash_type {stash_type} must be a floating-point dtype")
    return stash


def _at_least_float32(dtype: np.dtype) -> np.dtype:
    """The dtype statistics of an op without ``stash_type`` are computed in: the input's,
    widened to float32 (float16 sums lose digits)."""
    return dtype if dtype.kind == "f" and dtype.itemsize > 4 else np.dtype(np.float32)


def _axis(axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise KernelFailed(f"axis {axis} is out of range for a rank-{rank} input")
    return axis + rank if axis < 0 else axis


def _fast_layer_normalization(
    x: np.ndarray,
    scale: np.ndarray,
    b: np.ndarray | None = None,
    /,
    *,
    parallel: HostParallel | None = None,
    axis: int = -1,
    epsilon: float = _EPSILON,
    stash_type: int = 1,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`layer_normalization`, compiled for float32."""
    axis = _axis(axis, x.ndim)
    inner = x.shape[axis:]
    if stash_type == _STASH_FLOAT and x.size and _float32(x, scale, b):
        scale_values = _per_value(scale, inner)
        bias_values = _per_value(b, inner) if b is not None else None
        if scale_values is not None and (b is None or bias_values is not None):
            rows = np.ascontiguousarray(x).reshape(-1, math.prod(inner))
            y, mean, inv_std = compiled("norm").layer_norm(
                rows, scale_values, bias_values, epsilon, parallel
            )
            stats = x.shape[:axis] + (1,) * len(inner)
            return y.reshape(x.shape), mean.reshape(stats), inv_std.reshape(stats)
    return layer_normalization(x, scale, b, axis=axis, epsilon=epsilon, stash_type=stash_type)


@op(
    "LayerNormalization",
    since=17,
    factory=pooled(_fast_layer_normalization, lambda: layer_normalization),
)
def layer_normalization(
    x: np.ndarray,
    scale: np.ndarray,
    b: np.ndarray | None = None,
    /,
    *,
    axis: int = -1,
    epsilon: float = _EPSILON,
    stash_type: int = 1,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Normalise over the axes ``axis..`` and apply ``scale`` and ``b``.

    Also returns Mean and InvStdDev (the reduced axes kept as size 1), in ``stash_type``.
    """
    axis = _axis(axis, x.ndim)
    axes = tuple(range(axis, x.ndim))
    out_stash = np.dtype(tensor_dtype_to_np_dtype(stash_type))
    work = _stash(stash_type, x.dtype)
    xw = x.astype(work, copy=False)
    mean = np.mean(xw, axis=axes, keepdims=True)
    y = xw - mean
    var = np.mean(np.square(y), axis=axes, keepdims=True)
    inv_std = 1 / np.sqrt(var + work.type(epsilon))
    y *= inv_std
    stage2 = np.result_type(x.dtype, work)  # the spec applies scale and bias in x's type
    y = y.astype(stage2, copy=False)
    y *= scale.astype(stage2, copy=False)
    if b is not None:
        y += b.astype(stage2, copy=False)
    return (
        y.astype(x.dtype, copy=False),
        mean.astype(out_stash, copy=False),
        inv_std.astype(out_stash, copy=False),
    )


def _fast_rms_normalization(
    x: np.ndarray,
    scale: np.ndarray,
    /,
    *,
    parallel: HostParallel | None = None,
    axis: int = -1,
    epsilon: float = _EPSILON,
    stash_type: int = 1,
) -> np.ndarray:
    """:func:`rms_normalization`, compiled for float32."""
    axis = _axis(axis, x.ndim)
    inner = x.shape[axis:]
    if stash_type == _STASH_FLOAT and x.size and _float32(x, scale):
        scale_values = _per_value(scale, inner)
        if scale_values is not None:
            from nxrt_ep_cpu.jit import norm

            rows = np.ascontiguousarray(x).reshape(-1, math.prod(inner))
            return norm.rms_norm(rows, scale_values, epsilon, parallel).reshape(x.shape)
    return rms_normalization(x, scale, axis=axis, epsilon=epsilon, stash_type=stash_type)


@op(
    "RMSNormalization", since=23, factory=pooled(_fast_rms_normalization, lambda: rms_normalization)
)
def rms_normalization(
    x: np.ndarray,
    scale: np.ndarray,
    /,
    *,
    axis: int = -1,
    epsilon: float = _EPSILON,
    stash_type: int = 1,
) -> np.ndarray:
    """``x / sqrt(mean(x^2) + epsilon) * scale`` over the axes ``axis..``; Y has scale's dtype."""
    axis = _axis(axis, x.ndim)
    axes = tuple(range(axis, x.ndim))
    work = _stash(stash_type, x.dtype)
    xw = x.astype(work, copy=False)
    mean_square = np.mean(xw * xw, axis=axes, keepdims=True)
    y = xw / np.sqrt(mean_square + work.type(epsilon)) * scale.astype(work, copy=False)
    return y.astype(scale.dtype, copy=False)


def _group_norm(
    x: np.ndarray,
    scale: np.ndarray,
    bias: np.ndarray,
    num_groups: int,
    epsilon: float,
    work: np.dtype,
) -> np.ndarray:
    """Normalise each group of ``C / num_groups`` channels; scale and bias are per channel."""
    if x.ndim < 2:
        raise KernelFailed(f"GroupNormalization needs an (N, C, ...) input, got shape {x.shape}")
    n, c = x.shape[:2]
    if num_groups <= 0 or c % num_groups:
        raise KernelFailed(f"num_groups {num_groups} must divide the channel count {c}")
    xw = x.astype(work, copy=False).reshape(n, num_groups, -1)
    mean = np.mean(xw, axis=-1, keepdims=True)
    # the spec's function: Var = E[x^2] - E[x]^2 (not E[(x - mean)^2]), rounded as it rounds
    var = np.mean(xw * xw, axis=-1, keepdims=True) - mean * mean
    normed = ((xw - mean) / np.sqrt(var + work.type(epsilon))).reshape(x.shape)
    shape = (c,) + (1,) * (x.ndim - 2)
    stage2 = np.result_type(x.dtype, work)  # the spec applies scale and bias in x's type
    y = normed.astype(stage2, copy=False) * scale.astype(stage2, copy=False).reshape(shape)
    y += bias.astype(stage2, copy=False).reshape(shape)
    return y.astype(x.dtype, copy=False)


def _fast_group_norm(
    x: np.ndarray,
    scale: np.ndarray,
    bias: np.ndarray,
    groups: int,
    epsilon: float,
    parallel: HostParallel | None,
) -> np.ndarray | None:
    """The compiled group norm for float32 ``(N, C, ...)`` with per-channel parameters;
    None where the reference must run (other dtypes, empty tensors, bad attributes)."""
    if x.ndim < 2 or not x.size or not _float32(x, scale, bias):
        return None
    c = x.shape[1]
    if groups <= 0 or c % groups or scale.size != c or bias.size != c:
        return None
    from nxrt_ep_cpu.jit import norm

    x = np.ascontiguousarray(x)
    scale, bias = np.ascontiguousarray(scale).reshape(-1), np.ascontiguousarray(bias).reshape(-1)
    return norm.group_norm(x, scale, bias, groups, epsilon, parallel)


def _fast_group_normalization_18(
    x: np.ndarray,
    scale: np.ndarray,
    bias: np.ndarray,
    /,
    *,
    parallel: HostParallel | None = None,
    epsilon: float = _EPSILON,
    num_groups: int,
) -> np.ndarray:
    """:func:`group_normalization_18`, compiled for float32."""
    c = x.shape[1] if x.ndim >= 2 else 0
    channel_scale, channel_bias = scale, bias
    if scale.size == num_groups and bias.size == num_groups and num_groups and c % num_groups == 0:
        channel_scale = np.repeat(scale.reshape(-1), c // num_groups)
        channel_bias = np.repeat(bias.reshape(-1), c // num_groups)
    y = _fast_group_norm(x, channel_scale, channel_bias, num_groups, epsilon, parallel)
    if y is None:
        return group_normalization_18(x, scale, bias, epsilon=epsilon, num_groups=num_groups)
    return y


@op(
    "GroupNormalization",
    since=18,
    factory=pooled(_fast_group_normalization_18, lambda: group_normalization_18),
)
def group_normalization_18(
    x: np.ndarray,
    scale: np.ndarray,
    bias: np.ndarray,
    /,
    *,
    epsilon: float = _EPSILON,
    num_groups: int,
) -> np.ndarray:
    """GroupNormalization of opset 18: ``scale`` and ``bias`` hold one value per group."""
    c = x.shape[1] if x.ndim >= 2 else 0
    if scale.size == num_groups and bias.size == num_groups and num_groups and c % num_groups == 0:
        scale = np.repeat(scale.reshape(-1), c // num_groups)
        bias = np.repeat(bias.reshape(-1), c // num_groups)
    work = _at_least_float32(x.dtype)
    return _group_norm(x, scale, bias, num_groups, epsilon, work)


def _fast_group_normalization(
    x: np.ndarray,
    scale: np.ndarray,
    bias: np.ndarray,
    /,
    *,
    parallel: HostParallel | None = None,
    epsilon: float = _EPSILON,
    num_groups: int,
    stash_type: int = 1,
) -> np.ndarray:
    """:func:`group_normalization`, compiled for float32."""
    y = None
    if stash_type == _STASH_FLOAT:
        y = _fast_group_norm(x, scale, bias, num_groups, epsilon, parallel)
    if y is None:
        return group_normalization(
            x, scale, bias, epsilon=epsilon, num_groups=num_groups, stash_type=stash_type
        )
    return y


@op(
    "GroupNormalization",
    since=21,
    factory=pooled(_fast_group_normalization, lambda: group_normalization),
)
def group_normalization(
    x: np.ndarray,
    scale: np.ndarray,
    bias: np.ndarray,
    /,
    *,
    epsilon: float = _EPSILON,
    num_groups: int,
    stash_type: int = 1,
) -> np.ndarray:
    """GroupNormalization of opset 21: ``scale`` and ``bias`` hold one value per channel."""
    return _group_norm(x, scale, bias, num_groups, epsilon, _stash(stash_type, x.dtype))


def _fast_instance_normalization(
    x: np.ndarray,
    scale: np.ndarray,
    b: np.ndarray,
    /,
    *,
    parallel: HostParallel | None = None,
    consumed_inputs: list[int] | None = None,
    epsilon: float = _EPSILON,
) -> np.ndarray:
    """:func:`instance_normalization`, compiled for float32: a group norm of one channel
    per group."""
    y = None
    if x.ndim >= 3:
        y = _fast_group_norm(x, scale, b, x.shape[1], epsilon, parallel)
    if y is None:
        return instance_normalization(x, scale, b, epsilon=epsilon)
    return y


@op(
    "InstanceNormalization",
    since=(1, 6, 22),
    factory=pooled(_fast_instance_normalization, lambda: instance_normalization),
)
def instance_normalization(
    x: np.ndarray,
    scale: np.ndarray,
    b: np.ndarray,
    /,
    *,
    consumed_inputs: list[int] | None = None,
    epsilon: float = _EPSILON,
) -> np.ndarray:
    """Normalise each (sample, channel) plane over its spatial axes, then scale and shift."""
    if x.ndim < 3:
        raise KernelFailed(f"InstanceNormalization needs (N, C, D1, ...), got shape {x.shape}")
    work = _at_least_float32(x.dtype)
    axes = tuple(range(2, x.ndim))
    xw = x.astype(work, copy=False)
    mean = np.mean(xw, axis=axes, keepdims=True)
    diff = xw - mean
    var = np.mean(diff * diff, axis=axes, keepdims=True)
    shape = (-1,) + (1,) * (x.ndim - 2)
    y = diff / np.sqrt(var + work.type(epsilon)) * scale.astype(work, copy=False).reshape(shape)
    y += b.astype(work, copy=False).reshape(shape)
    return y.astype(x.dtype, copy=False)


@op("LpNormalization", since=(1, 22))
def lp_normalization(x: np.ndarray, /, *, axis: int = -1, p: int = 2) -> np.ndarray:
    """``x`` divided by its L1 or L2 norm along ``axis``; a zero norm gives zeros."""
    axis = _axis(axis, x.ndim)
    work = _at_least_float32(x.dtype)
    xw = x.astype(work, copy=False)
    if p == 1:
        norm = np.sum(np.abs(xw), axis=axis, keepdims=True)
    elif p == 2:
        norm = np.sqrt(np.sum(xw * xw, axis=axis, keepdims=True))
    else:
        raise KernelFailed(f"LpNormalization supports p=1 or p=2, got p={p}")
    with np.errstate(invalid="ignore", divide="ignore"):
        y = np.where(norm == 0, work.type(0), xw / norm)
    return y.astype(x.dtype, copy=False)


_MVN_AXES = (0, 2, 3)


@op("MeanVarianceNormalization", since=(9, 13))
def mean_variance_normalization(x: np.ndarray, /, *, axes: Sequence[int] = _MVN_AXES) -> np.ndarray:
    """``(x - mean) / (std + 1e-9)`` over ``axes``; std from ``E[x^2] - E[x]^2`` as the body.

    The default axes are meant for NCHW ("each channel"); on an input of lower
    rank the ones it lacks are left out (N, C, L reduces over 0 and 2), as
    onnxruntime does. Axes the model names are checked.
    """
    if axes is _MVN_AXES:
        axes = [a for a in axes if a < x.ndim]
    axes = tuple(sorted(_axis(int(a), x.ndim) for a in axes))
    work = _at_least_float32(x.dtype)
    xw = x.astype(work, copy=False)
    mean = np.mean(xw, axis=axes, keepdims=True)
    mean_square = np.mean(xw * xw, axis=axes, keepdims=True)
    std = np.sqrt(np.maximum(mean_square - mean * mean, 0))
    y = (xw - mean) / (std + work.type(1e-9))
    return y.astype(x.dtype, copy=False)

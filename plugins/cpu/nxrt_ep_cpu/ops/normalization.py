"""Normalization kernels: Layer, RMS, Group, Instance, Lp, MeanVariance.

Statistics are computed in the op's ``stash_type`` (float32 by default), or in
the input's dtype when that is wider, then the result is cast back.
"""

from __future__ import annotations

import numpy as np
from onnx.helper import tensor_dtype_to_np_dtype

from nxrt.errors import KernelFailed
from nxrt_ep_cpu.ops._registry import op

_EPSILON = float(np.float32(1e-5))  # the schema default, a float32 value


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


@op("LayerNormalization", since=17)
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


@op("RMSNormalization", since=23)
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


@op("GroupNormalization", since=18)
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


@op("GroupNormalization", since=21)
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


@op("InstanceNormalization", since=(1, 6, 22))
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
def mean_variance_normalization(x: np.ndarray, /, *, axes: list[int] = _MVN_AXES) -> np.ndarray:
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

"""Random number kernels.

With a ``seed`` attribute each call draws from a fresh ``numpy.random.RandomState``
seeded with it (as ONNX's reference implementation does), so a seeded node gives the
same values on every run; without one each call draws from fresh OS entropy. No
generator state is kept between calls, so the kernels are thread-safe.
"""

from __future__ import annotations

import numpy as np
from onnx import helper

from nxrt.errors import KernelFailed
from nxrt_ep_cpu.ops._registry import op

_FLOAT_KINDS = "f"


def _state(seed: float | None) -> np.random.RandomState:
    if seed is None or np.isnan(seed):
        return np.random.RandomState()
    return np.random.RandomState(int(seed) & 0xFFFFFFFF)


def _dtype(onnx_type: int | None, like: np.ndarray | None, op_name: str) -> np.dtype:
    """The output dtype: the ``dtype`` attribute, else the input's dtype."""
    if onnx_type is None or onnx_type == 0:
        if like is None:
            raise KernelFailed(f"{op_name}: the dtype attribute is required")
        return like.dtype
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(int(onnx_type)))
    except (KeyError, ValueError) as exc:
        raise KernelFailed(f"{op_name}: unknown dtype {onnx_type}") from exc


def _float_dtype(dtype: np.dtype, op_name: str) -> np.dtype:
    if dtype.kind not in _FLOAT_KINDS and dtype.name != "bfloat16":
        raise KernelFailed(f"{op_name}: output must be a floating-point type, not {dtype}")
    return dtype


def _shape(shape: list[int], op_name: str) -> tuple[int, ...]:
    dims = tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        raise KernelFailed(f"{op_name}: shape {list(dims)} has a negative dimension")
    return dims


@op("RandomNormal", since=(1, 22))
def random_normal(
    *,
    dtype: int = 1,
    mean: float = 0.0,
    scale: float = 1.0,
    seed: float | None = None,
    shape: list[int],
) -> np.ndarray:
    """Samples of N(mean, scale²) of the given shape."""
    out = _float_dtype(_dtype(dtype, None, "RandomNormal"), "RandomNormal")
    values = _state(seed).normal(mean, scale, _shape(shape, "RandomNormal"))
    return values.astype(out)


@op("RandomUniform", since=(1, 22))
def random_uniform(
    *,
    dtype: int = 1,
    high: float = 1.0,
    low: float = 0.0,
    seed: float | None = None,
    shape: list[int],
) -> np.ndarray:
    """Samples of U[low, high) of the given shape."""
    out = _float_dtype(_dtype(dtype, None, "RandomUniform"), "RandomUniform")
    values = _state(seed).uniform(low, high, _shape(shape, "RandomUniform"))
    return values.astype(out)


@op("RandomNormalLike", since=(1, 22))
def random_normal_like(
    x: np.ndarray,
    /,
    *,
    dtype: int | None = None,
    mean: float = 0.0,
    scale: float = 1.0,
    seed: float | None = None,
) -> np.ndarray:
    """Samples of N(mean, scale²) shaped like ``x`` (of ``x``'s dtype unless ``dtype``)."""
    out = _float_dtype(_dtype(dtype, x, "RandomNormalLike"), "RandomNormalLike")
    return _state(seed).normal(mean, scale, x.shape).astype(out)


@op("RandomUniformLike", since=(1, 22))
def random_uniform_like(
    x: np.ndarray,
    /,
    *,
    dtype: int | None = None,
    high: float = 1.0,
    low: float = 0.0,
    seed: float | None = None,
) -> np.ndarray:
    """Samples of U[low, high) shaped like ``x`` (of ``x``'s dtype unless ``dtype``)."""
    out = _float_dtype(_dtype(dtype, x, "RandomUniformLike"), "RandomUniformLike")
    return _state(seed).uniform(low, high, x.shape).astype(out)


@op("Bernoulli", since=(15, 22))
def bernoulli(
    x: np.ndarray, /, *, dtype: int | None = None, seed: float | None = None
) -> np.ndarray:
    """1 with probability ``x``, else 0 (of ``x``'s dtype unless ``dtype``)."""
    out = _dtype(dtype, x, "Bernoulli")
    p = x.astype(np.float64)
    if np.any((p < 0) | (p > 1)) or np.any(np.isnan(p)):
        raise KernelFailed("Bernoulli: probabilities must lie in [0, 1]")
    return _state(seed).binomial(1, p).astype(out)


@op("Multinomial", since=(7, 22))
def multinomial(
    x: np.ndarray, /, *, dtype: int = 6, sample_size: int = 1, seed: float | None = None
) -> np.ndarray:
    """``sample_size`` class indices per row of unnormalised log-probabilities ``x``."""
    out = _dtype(dtype, None, "Multinomial")
    if out not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise KernelFailed(f"Multinomial: dtype must be int32 or int64, not {out}")
    if x.ndim != 2:
        raise KernelFailed(f"Multinomial: input must be [batch, classes], not {list(x.shape)}")
    logits = x.astype(np.float64)
    logits = logits - logits.max(axis=1, keepdims=True)
    cdf = np.cumsum(np.exp(logits), axis=1)
    cdf /= cdf[:, -1:]
    u = _state(seed).random_sample((x.shape[0], int(sample_size)))
    index = np.sum(u[:, :, None] >= cdf[:, None, :], axis=2)
    return np.minimum(index, x.shape[1] - 1).astype(out)

"""The numpy reference of ``pkg.nxrt::BlockQuantizedMoE``, and block quantisation.

Written to be obviously right rather than fast: it follows SPEC section 7
step by step in float64 and is what kernels, tests and the model generator
are checked against. :func:`quantize_blockwise` produces weights in the op's
storage format.
"""

from __future__ import annotations

import math

import numpy as np

ACTIVATIONS = ("relu", "gelu", "silu", "swiglu")


def unpack(packed: np.ndarray, bits: int) -> np.ndarray:
    """Stored integers of ``packed`` (uint8, last axis packed), as uint8 values."""
    packed = np.asarray(packed, dtype=np.uint8)
    if bits == 8:
        return packed
    if bits != 4:
        raise ValueError(f"bits must be 4 or 8, got {bits}")
    low = packed & 0x0F
    high = packed >> 4
    return np.stack([low, high], axis=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def pack(values: np.ndarray, bits: int) -> np.ndarray:
    """Inverse of :func:`unpack`: the lower-index element goes in the low nibble."""
    values = np.asarray(values, dtype=np.uint8)
    if bits == 8:
        return values.copy()
    pairs = values.reshape(*values.shape[:-1], values.shape[-1] // 2, 2)
    return (pairs[..., 0] | (pairs[..., 1] << 4)).astype(np.uint8)


def dequantize_blockwise(
    packed: np.ndarray,
    scales: np.ndarray,
    zero_points: np.ndarray | None,
    bits: int,
    block_size: int,
) -> np.ndarray:
    """Float64 weights ``[..., out, in]`` from their packed, block-quantised form."""
    q = unpack(packed, bits).astype(np.float64)
    *lead, n_in = q.shape
    blocks = q.reshape(*lead, n_in // block_size, block_size)
    if zero_points is None:
        z = np.float64(2 ** (bits - 1))
    else:
        z = np.asarray(zero_points, dtype=np.float64)[..., None]
    s = np.asarray(scales, dtype=np.float64)[..., None]
    return ((blocks - z) * s).reshape(*lead, n_in)


def quantize_blockwise(
    weights: np.ndarray,
    bits: int,
    block_size: int,
    *,
    zero_points: bool = False,
    scale_dtype: np.dtype | type = np.float32,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``(packed, scales, zero_points)`` of float weights ``[..., out, in]``.

    Symmetric (zero point 2^(bits-1)) unless ``zero_points`` asks for
    asymmetric blocks with their own zero point.
    """
    w = np.asarray(weights, dtype=np.float64)
    *lead, n_in = w.shape
    if n_in % block_size:
        raise ValueError(f"input size {n_in} is not a multiple of block_size {block_size}")
    blocks = w.reshape(*lead, n_in // block_size, block_size)
    qmax = 2**bits - 1
    if zero_points:
        low = np.minimum(blocks.min(-1), 0.0)
        high = np.maximum(blocks.max(-1), 0.0)
        scale = (high - low) / qmax
        scale = np.where(scale == 0, 1.0, scale).astype(scale_dtype)
        z = np.clip(np.round(-low / scale.astype(np.float64)), 0, qmax).astype(np.uint8)
        zf = z.astype(np.float64)[..., None]
    else:
        mid = 2 ** (bits - 1)
        scale = np.abs(blocks).max(-1) / (mid - 1)
        scale = np.where(scale == 0, 1.0, scale).astype(scale_dtype)
        z = None
        zf = np.float64(mid)
    q = np.clip(np.round(blocks / scale.astype(np.float64)[..., None] + zf), 0, qmax)
    packed = pack(q.astype(np.uint8).reshape(*lead, n_in), bits)
    return packed, scale, z


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax in float32, the routing probabilities."""
    x = np.asarray(logits, dtype=np.float32)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def route(
    router_logits: np.ndarray, top_k: int, normalize: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """``(experts [T, k], weights [T, k])``: largest p first, ties to the lower index."""
    p = softmax(router_logits)
    if not 1 <= top_k <= p.shape[-1]:
        raise ValueError(f"top_k={top_k} must be between 1 and the {p.shape[-1]} experts")
    experts = np.argsort(-p, axis=-1, kind="stable")[:, :top_k]
    weights = np.take_along_axis(p, experts, axis=-1).astype(np.float64)
    if normalize:
        weights = weights / weights.sum(axis=-1, keepdims=True)
    return experts, weights


def activate(h: np.ndarray, activation: str) -> np.ndarray:
    """The expert's activation; ``swiglu`` takes the gate half first, then the up half."""
    if activation == "relu":
        return np.maximum(h, 0.0)
    if activation == "gelu":
        erf = np.vectorize(math.erf, otypes=[np.float64])
        return 0.5 * h * (1.0 + erf(h / math.sqrt(2.0)))
    if activation == "silu":
        return h * _sigmoid(h)
    if activation == "swiglu":
        gate, up = np.split(h, 2, axis=-1)
        return gate * _sigmoid(gate) * up
    raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")


def _sigmoid(h: np.ndarray) -> np.ndarray:
    return np.exp(-np.logaddexp(0.0, -h))


def block_quantized_moe(
    x: np.ndarray,
    router_logits: np.ndarray,
    fc1_weight: np.ndarray,
    fc1_scales: np.ndarray,
    fc2_weight: np.ndarray,
    fc2_scales: np.ndarray,
    fc1_zero_points: np.ndarray | None = None,
    fc2_zero_points: np.ndarray | None = None,
    *,
    top_k: int,
    bits: int,
    block_size: int,
    activation: str,
    normalize_routing_weights: int = 0,
) -> np.ndarray:
    """``Y [T, H]`` of ``pkg.nxrt::BlockQuantizedMoE``, in X's dtype."""
    x = np.asarray(x)
    experts, weights = route(router_logits, top_k, normalize_routing_weights)
    y = np.zeros(x.shape, dtype=np.float64)
    for e in np.unique(experts):
        tokens, slot = np.nonzero(experts == e)
        w1 = dequantize_blockwise(
            fc1_weight[e], fc1_scales[e], _pick(fc1_zero_points, e), bits, block_size
        )
        w2 = dequantize_blockwise(
            fc2_weight[e], fc2_scales[e], _pick(fc2_zero_points, e), bits, block_size
        )
        h = activate(x[tokens].astype(np.float64) @ w1.T, activation)
        y[tokens] += weights[tokens, slot][:, None] * (h @ w2.T)
    return y.astype(x.dtype)


def _pick(zero_points: np.ndarray | None, e: int) -> np.ndarray | None:
    return None if zero_points is None else zero_points[e]


__all__ = [
    "ACTIVATIONS",
    "activate",
    "block_quantized_moe",
    "dequantize_blockwise",
    "pack",
    "quantize_blockwise",
    "route",
    "softmax",
    "unpack",
]

"""Attention and the transformer helpers (RotaryEmbedding, SwiGLU, LinearAttention ...).

Attention keeps its elementwise steps in the input dtype and runs its matrix
products in float32 rounded back once (what numpy does for float16), so
half-precision results match the ONNX reference bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
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

    from nxrt.kernel import Kernel
    from nxrt.provider import ExecutionProvider


def _work_dtype(dtype: np.dtype) -> np.dtype:
    """float32 for floats narrower than it (float16, bfloat16), else the dtype itself."""
    if dtype.kind == "V" or (dtype.kind == "f" and dtype.itemsize < 4):
        return np.dtype(np.float32)
    return dtype


def _matmul(a: np.ndarray, b: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``a @ b`` accumulated in float32 at least, rounded to ``dtype``."""
    work = _work_dtype(dtype)
    y = np.matmul(a.astype(work, copy=False), b.astype(work, copy=False))
    return y.astype(dtype, copy=False)


def _precision(tensor_type: int) -> np.dtype:
    try:
        dtype = np.dtype(tensor_dtype_to_np_dtype(tensor_type))
    except (KeyError, ValueError) as exc:
        raise KernelFailed(f"softmax_precision {tensor_type} is not a tensor dtype") from exc
    if dtype.kind not in "fV":
        raise KernelFailed(f"softmax_precision {tensor_type} must be a floating-point dtype")
    return dtype


def _split_heads(x: np.ndarray, heads: int, name: str) -> np.ndarray:
    """``(B, S, H*D)`` as ``(B, H, S, D)`` (a view)."""
    b, s, hidden = x.shape
    if heads <= 0 or hidden % heads:
        raise KernelFailed(f"{name}'s hidden size {hidden} is not divisible by {heads} heads")
    return x.reshape(b, s, heads, hidden // heads).transpose(0, 2, 1, 3)


def _softmax_rows(logits: np.ndarray, *, zero_empty: bool = True, jit: bool = False) -> np.ndarray:
    """Softmax over the last axis; an all ``-inf`` row gives zeros, not NaN, unless
    ``zero_empty`` is off (then it is the formula's NaN, and float32 takes the compiled
    softmax where ``jit``)."""
    if not zero_empty:
        if jit and logits.dtype == np.float32 and logits.size:
            return compiled("norm").softmax(logits, logits.ndim - 1, False, None)
        with np.errstate(invalid="ignore"):
            e = np.exp(logits - np.max(logits, axis=-1, keepdims=True))
            e /= np.sum(e, axis=-1, keepdims=True)
        return e
    top = np.max(logits, axis=-1, keepdims=True)
    top = np.where(np.isneginf(top), logits.dtype.type(0), top)
    e = np.exp(logits - top)
    total = np.sum(e, axis=-1, keepdims=True)
    total = np.where(total == 0, logits.dtype.type(1), total)
    e /= total
    return e


def _allowed(condition: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """An additive bias: 0 where ``condition`` holds, ``-inf`` elsewhere."""
    return np.where(condition, dtype.type(0), dtype.type(-np.inf))


def _attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    attn_mask: np.ndarray | None,
    past_key: np.ndarray | None,
    past_value: np.ndarray | None,
    nonpad_kv_seqlen: np.ndarray | None,
    *,
    scale: float | None,
    is_causal: int,
    q_num_heads: int | None,
    kv_num_heads: int | None,
    softmax_precision: int | None,
    softcap: float,
    qk_matmul_output_mode: int,
    left_window_size: int = -1,
    right_window_size: int = -1,
    heads_only_for_3d: bool = False,
    jit: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Scaled dot-product attention with every option of ONNX Attention (opsets 23-25).

    The additive bias combines the mask, the causal frontier (bottom-right
    aligned by the cache offset), the sliding window and the padding of
    ``nonpad_kv_seqlen``; a query row whose bias is all ``-inf`` yields zeros.
    GQA groups the query heads per KV head instead of repeating K and V.
    """
    if not q.ndim == k.ndim == v.ndim or q.ndim not in (3, 4):
        raise KernelFailed(
            f"Q, K and V must all be 3-D or all 4-D, got shapes {q.shape}, {k.shape}, {v.shape}"
        )
    if qk_matmul_output_mode not in (0, 1, 2, 3):
        raise KernelFailed(f"qk_matmul_output_mode must be 0..3, got {qk_matmul_output_mode}")
    if left_window_size < -1 or right_window_size < -1:
        raise KernelFailed("left_window_size and right_window_size must be -1 or nonnegative")
    if (past_key is None) != (past_value is None):
        raise KernelFailed("past_key and past_value must be given together")
    if nonpad_kv_seqlen is not None and past_key is not None:
        raise KernelFailed("nonpad_kv_seqlen cannot be combined with past_key/past_value")
    dtype = q.dtype
    three_d = q.ndim == 3
    if three_d:
        if q_num_heads is None or kv_num_heads is None:
            raise KernelFailed("3-D Q, K and V need the q_num_heads and kv_num_heads attributes")
        q = _split_heads(q, q_num_heads, "Q")
        k = _split_heads(k, kv_num_heads, "K")
        v = _split_heads(v, kv_num_heads, "V")
    elif heads_only_for_3d and (q_num_heads is not None or kv_num_heads is not None):
        raise KernelFailed("q_num_heads and kv_num_heads must not be given for 4-D inputs")
    if past_key is not None:
        k = np.concatenate([past_key, k], axis=2)
        v = np.concatenate([past_value, v], axis=2)
        present_key, present_value = k, v
    else:
        present_key, present_value = k.copy(), v.copy()
    b, hq, lq, d = q.shape
    hkv, lkv = k.shape[1], k.shape[2]
    if k.shape[0] != b or v.shape[:3] != k.shape[:3] or k.shape[3] != d:
        raise KernelFailed(f"K {k.shape} and V {v.shape} do not fit Q {q.shape}")
    if hq % hkv:
        raise KernelFailed(f"{hq} query heads are not a multiple of {hkv} key/value heads")
    group = hq // hkv

    # Q and K are each scaled by sqrt(scale), rounded to the input dtype as the spec's body does.
    if scale is None:
        scale = 1.0 / np.sqrt(d)
    root = np.asarray(np.sqrt(scale)).astype(dtype)
    qs = (q * root).reshape(b, hkv, group, lq, d)
    ks = np.swapaxes(k * root, -1, -2)[:, :, None]
    scores = _matmul(qs, ks, dtype).reshape(b, hq, lq, lkv)
    raw = scores
    if softcap > 0:
        cap = dtype.type(softcap)
        scores = np.tanh(scores / cap) * cap

    bias = _attention_bias(
        attn_mask,
        nonpad_kv_seqlen,
        lq,
        lkv,
        b,
        dtype,
        is_causal=is_causal,
        offset=past_key.shape[2] if past_key is not None else None,
        left=left_window_size,
        right=right_window_size,
    )
    logits = scores if bias is None else scores + bias
    soft = _precision(softmax_precision) if softmax_precision is not None else dtype
    # only a row the bias masks entirely is zero (the spec's errata); scores that are -inf
    # by themselves (an infinite query) give the softmax's NaN, as in onnxruntime
    probs = _softmax_rows(logits.astype(soft, copy=False), zero_empty=False, jit=jit)
    if bias is not None:
        masked_rows = np.isneginf(np.max(bias, axis=-1, keepdims=True))
        probs = np.where(masked_rows, probs.dtype.type(0), probs)
    probs = probs.astype(dtype, copy=False)

    pv = probs.reshape(b, hkv, group, lq, lkv)
    y = _matmul(pv, v[:, :, None], dtype).reshape(b, hq, lq, v.shape[3])
    if three_d:
        y = y.transpose(0, 2, 1, 3).reshape(b, lq, hq * v.shape[3])

    qk = (raw, scores, logits, probs)[qk_matmul_output_mode]
    qk = np.broadcast_to(qk, (b, hq, lq, lkv)).astype(dtype)
    return y, present_key, present_value, qk


def _attention_bias(
    attn_mask: np.ndarray | None,
    nonpad_kv_seqlen: np.ndarray | None,
    lq: int,
    lkv: int,
    batch: int,
    work: np.dtype,
    *,
    is_causal: int,
    offset: int | None,
    left: int,
    right: int,
) -> np.ndarray | None:
    """The additive bias broadcastable to ``(B, H, Lq, Lkv)``, or None when there is none."""
    bias = None
    if attn_mask is not None:
        pad = lkv - attn_mask.shape[-1]
        if pad < 0:
            raise KernelFailed(
                f"attn_mask's last axis {attn_mask.shape[-1]} is longer than the {lkv} keys"
            )
        if attn_mask.dtype == np.bool_:
            bias = _allowed(attn_mask, work)
        else:
            bias = attn_mask.astype(work)
        if pad:
            widths = [(0, 0)] * (bias.ndim - 1) + [(0, pad)]
            bias = np.pad(bias, widths, constant_values=-np.inf)
    if not (is_causal or left >= 0 or right >= 0 or nonpad_kv_seqlen is not None):
        return bias
    if nonpad_kv_seqlen is not None:
        valid = np.asarray(nonpad_kv_seqlen, dtype=np.int64).reshape(-1)
        if valid.shape[0] != batch:
            raise KernelFailed(f"nonpad_kv_seqlen must hold {batch} values, got {valid.shape[0]}")
        valid = valid.reshape(-1, 1, 1, 1)
    rows = np.arange(lq).reshape(lq, 1)
    cols = np.arange(lkv).reshape(1, lkv)
    if offset is not None:
        position = rows + offset
    elif nonpad_kv_seqlen is not None:
        position = rows + (valid - lq)  # (B, 1, Lq, 1): the frontier of an external cache
    else:
        position = rows
    allowed = np.ones((1, 1), dtype=bool)
    if is_causal:
        allowed = allowed & (cols <= position)
    if left >= 0:
        allowed = allowed & (position - cols <= left)
    if right >= 0:
        allowed = allowed & (cols - position <= right)
    if nonpad_kv_seqlen is not None:
        allowed = allowed & (cols < valid)
    extra = _allowed(allowed, work)
    if bias is None:
        bias = np.zeros((lq, lkv), dtype=work)
    return bias + extra


def _attention_kernel(ep: ExecutionProvider, node: ir.Node, fn: Callable[..., Any]) -> Kernel:
    """An Attention node's kernel: its float32 softmax compiled, built through
    :func:`~nxrt_ep_cpu.compiling.compiled_kernel` (numpy's softmax until then)."""
    attrs = attribute_values(node)
    return compiled_kernel(
        ep,
        node,
        lambda: CpuKernel(fn, attrs),
        lambda: CpuKernel(fn, {**attrs, "_compiled": False}),
    )


@op("Attention", since=(23, 24), factory=lambda ep, node: _attention_kernel(ep, node, attention_23))
def attention_23(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    attn_mask: np.ndarray | None = None,
    past_key: np.ndarray | None = None,
    past_value: np.ndarray | None = None,
    nonpad_kv_seqlen: np.ndarray | None = None,
    /,
    *,
    is_causal: int = 0,
    kv_num_heads: int | None = None,
    q_num_heads: int | None = None,
    qk_matmul_output_mode: int = 0,
    scale: float | None = None,
    softcap: float = 0.0,
    softmax_precision: int | None = None,
    _compiled: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Attention of opsets 23 and 24 (24 adds ``nonpad_kv_seqlen`` for an external KV
    cache): Y, present key/value and the chosen ``qk_matmul_output``."""
    return _attention(
        q,
        k,
        v,
        attn_mask,
        past_key,
        past_value,
        nonpad_kv_seqlen,
        scale=scale,
        is_causal=is_causal,
        q_num_heads=q_num_heads,
        kv_num_heads=kv_num_heads,
        softmax_precision=softmax_precision,
        softcap=softcap,
        qk_matmul_output_mode=qk_matmul_output_mode,
        jit=_compiled,
    )


@op("Attention", since=25, factory=lambda ep, node: _attention_kernel(ep, node, attention))
def attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    attn_mask: np.ndarray | None = None,
    past_key: np.ndarray | None = None,
    past_value: np.ndarray | None = None,
    nonpad_kv_seqlen: np.ndarray | None = None,
    /,
    *,
    is_causal: int = 0,
    kv_num_heads: int | None = None,
    left_window_size: int = -1,
    q_num_heads: int | None = None,
    qk_matmul_output_mode: int = 0,
    right_window_size: int = -1,
    scale: float | None = None,
    softcap: float = 0.0,
    softmax_precision: int | None = None,
    _compiled: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Attention of opset 25: adds sliding windows; head counts only for 3-D inputs."""
    return _attention(
        q,
        k,
        v,
        attn_mask,
        past_key,
        past_value,
        nonpad_kv_seqlen,
        scale=scale,
        is_causal=is_causal,
        q_num_heads=q_num_heads,
        kv_num_heads=kv_num_heads,
        softmax_precision=softmax_precision,
        softcap=softcap,
        qk_matmul_output_mode=qk_matmul_output_mode,
        left_window_size=left_window_size,
        right_window_size=right_window_size,
        heads_only_for_3d=True,
        jit=_compiled,
    )


@op("RotaryEmbedding", since=23)
def rotary_embedding(
    x: np.ndarray,
    cos_cache: np.ndarray,
    sin_cache: np.ndarray,
    position_ids: np.ndarray | None = None,
    /,
    *,
    interleaved: int = 0,
    num_heads: int | None = None,
    rotary_embedding_dim: int = 0,
) -> np.ndarray:
    """Rotate the first ``rotary_embedding_dim`` features of each head (all when 0).

    ``x`` is ``(B, H, S, D)`` or ``(B, S, H*D)`` (with ``num_heads``); the caches are
    ``(max_position, dim/2)`` indexed by ``position_ids``, or ``(B, S, dim/2)`` without them.
    """
    if x.ndim == 4:
        xh = x.transpose(0, 2, 1, 3)  # (B, S, H, D)
    elif x.ndim == 3:
        if not num_heads:
            raise KernelFailed("a 3-D RotaryEmbedding input needs the num_heads attribute")
        b, s, hidden = x.shape
        if hidden % num_heads:
            raise KernelFailed(f"hidden size {hidden} is not divisible by {num_heads} heads")
        xh = x.reshape(b, s, num_heads, hidden // num_heads)
    else:
        raise KernelFailed(f"RotaryEmbedding needs a 3-D or 4-D input, got shape {x.shape}")
    head = xh.shape[3]
    dim = rotary_embedding_dim or head
    if dim > head or dim % 2:
        raise KernelFailed(f"rotary_embedding_dim {dim} must be even and at most {head}")
    half = dim // 2
    if position_ids is not None:
        cos_cache = cos_cache[position_ids]
        sin_cache = sin_cache[position_ids]
    if cos_cache.shape[-1] != half or sin_cache.shape[-1] != half:
        raise KernelFailed(f"the cos/sin caches' last axis must be rotary_embedding_dim/2={half}")
    work = _work_dtype(x.dtype)
    cos = cos_cache.astype(work, copy=False)[:, :, None, :]  # (B, S, 1, half)
    sin = sin_cache.astype(work, copy=False)[:, :, None, :]
    rotate = xh[..., :dim].astype(work, copy=False)
    if interleaved:
        x1, x2 = rotate[..., 0::2], rotate[..., 1::2]
    else:
        x1, x2 = rotate[..., :half], rotate[..., half:]
    real = cos * x1 - sin * x2
    imag = sin * x1 + cos * x2
    out = np.empty(xh.shape, dtype=x.dtype)
    if interleaved:
        out[..., 0:dim:2] = real
        out[..., 1:dim:2] = imag
    else:
        out[..., :half] = real
        out[..., half:dim] = imag
    out[..., dim:] = xh[..., dim:]
    if x.ndim == 4:
        return np.ascontiguousarray(out.transpose(0, 2, 1, 3))
    return out.reshape(x.shape)


@op("SwiGLU", since=28)
def swi_glu(a: np.ndarray, b: np.ndarray, /, *, alpha: float = 1.0) -> np.ndarray:
    """``Swish_alpha(A) * B`` with ``Swish_alpha(a) = a * sigmoid(alpha * a)``; no broadcasting."""
    if a.shape != b.shape:
        raise KernelFailed(f"SwiGLU needs A and B of one shape, got {a.shape} and {b.shape}")
    work = _work_dtype(a.dtype)
    aw = a.astype(work, copy=False)
    with np.errstate(over="ignore"):
        gate = aw / (1 + np.exp(-work.type(alpha) * aw))
    return (gate * b.astype(work, copy=False)).astype(a.dtype, copy=False)


_UPDATE_RULES = ("linear", "gated", "delta", "gated_delta")


@op("LinearAttention", since=27)
def linear_attention(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    past_state: np.ndarray | None = None,
    decay: np.ndarray | None = None,
    beta: np.ndarray | None = None,
    /,
    *,
    chunk_size: int = 64,
    kv_num_heads: int,
    q_num_heads: int,
    scale: float = 0.0,
    update_rule: str = "gated_delta",
) -> tuple[np.ndarray, np.ndarray]:
    """Recurrent linear attention over a ``(d_k, d_v)`` state per KV head, in float32.

    Per step: decay the state by ``exp(decay)`` (gated rules), correct the value
    by what the state already recalls for the key (delta rules, scaled by
    ``beta``), add ``key x value``, and read it with the query. ``chunk_size``
    is only a tuning hint.
    """
    if isinstance(update_rule, bytes):
        update_rule = update_rule.decode()
    if update_rule not in _UPDATE_RULES:
        raise KernelFailed(f"update_rule must be one of {_UPDATE_RULES}, got {update_rule!r}")
    if q_num_heads <= 0 or kv_num_heads <= 0 or q_num_heads % kv_num_heads:
        raise KernelFailed(
            f"q_num_heads ({q_num_heads}) must be a positive multiple of kv_num_heads "
            f"({kv_num_heads})"
        )
    gated = update_rule in ("gated", "gated_delta")
    delta = update_rule in ("delta", "gated_delta")
    if gated != (decay is not None):
        raise KernelFailed(f"update_rule {update_rule!r} {'needs' if gated else 'forbids'} decay")
    if delta != (beta is not None):
        raise KernelFailed(f"update_rule {update_rule!r} {'needs' if delta else 'forbids'} beta")
    for name, arr in (("query", query), ("key", key), ("value", value)):
        if arr.ndim != 3:
            raise KernelFailed(f"{name} must be (B, T, H*D), got shape {arr.shape}")
    b, t, _ = query.shape
    f32 = np.float32
    q4 = _split_heads(query, q_num_heads, "query").astype(f32)  # (B, Hq, T, dk)
    k4 = _split_heads(key, kv_num_heads, "key").astype(f32)  # (B, Hkv, T, dk)
    v4 = _split_heads(value, kv_num_heads, "value").astype(f32)  # (B, Hkv, T, dv)
    dk, dv = q4.shape[3], v4.shape[3]
    if k4.shape[3] != dk:
        raise KernelFailed(f"key head size {k4.shape[3]} differs from query head size {dk}")
    group = q_num_heads // kv_num_heads
    if decay is not None:
        if decay.ndim != 3 or decay.shape[-1] not in (kv_num_heads, kv_num_heads * dk):
            raise KernelFailed(
                f"decay must be (B, T, {kv_num_heads}) or (B, T, {kv_num_heads * dk}), "
                f"got {decay.shape}"
            )
        per_key = decay.shape[-1] // kv_num_heads
        gate = np.exp(decay.astype(f32).reshape(b, t, kv_num_heads, per_key))
        gate = gate.transpose(0, 2, 1, 3)[..., None]  # (B, Hkv, T, dk or 1, 1)
    if beta is not None:
        if beta.ndim != 3 or beta.shape[-1] not in (kv_num_heads, 1):
            raise KernelFailed(
                f"beta must be (B, T, {kv_num_heads}) or (B, T, 1), got {beta.shape}"
            )
        strength = beta.astype(f32).transpose(0, 2, 1)[..., None]  # (B, H or 1, T, 1)
    if past_state is not None:
        if past_state.shape != (b, kv_num_heads, dk, dv):
            raise KernelFailed(
                f"past_state must be {(b, kv_num_heads, dk, dv)}, got {past_state.shape}"
            )
        state = past_state.astype(f32)
        state_dtype = past_state.dtype
    else:
        state = np.zeros((b, kv_num_heads, dk, dv), dtype=f32)
        state_dtype = query.dtype
    factor = f32(scale) if scale else f32(1.0 / np.sqrt(dk))
    qg = q4.reshape(b, kv_num_heads, group, t, dk)
    out = np.empty((b, kv_num_heads, group, t, dv), dtype=f32)
    for i in range(t):
        k_t = k4[:, :, i, :]  # (B, Hkv, dk)
        v_t = v4[:, :, i, :]  # (B, Hkv, dv)
        if gated:
            state = state * gate[:, :, i]
        if delta:
            recalled = np.matmul(k_t[:, :, None, :], state)[:, :, 0, :]  # (B, Hkv, dv)
            v_t = strength[:, :, i] * (v_t - recalled)
        state = state + k_t[..., :, None] * v_t[..., None, :]
        out[:, :, :, i, :] = np.matmul(qg[:, :, :, i, :], state) * factor
    output = out.reshape(b, q_num_heads, t, dv).transpose(0, 2, 1, 3).reshape(b, t, -1)
    return output.astype(query.dtype), state.astype(state_dtype)


@op("CausalConvWithState", since=27)
def causal_conv_with_state(
    x: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray | None = None,
    past_state: np.ndarray | None = None,
    /,
    *,
    activation: str = "none",
) -> tuple[np.ndarray, np.ndarray]:
    """Depthwise causal 1-D convolution carrying the last ``k - 1`` inputs as state.

    ``x`` is ``(B, C, L)``, ``weight`` ``(C, 1, k)``; the input is left-padded by
    ``past_state`` (zeros when absent) and the new state is the padded input's tail.
    """
    if isinstance(activation, bytes):
        activation = activation.decode()
    if activation not in ("none", "silu", "swish"):
        raise KernelFailed(f"activation must be 'none', 'silu' or 'swish', got {activation!r}")
    if x.ndim != 3 or weight.ndim != 3 or weight.shape[1] != 1 or weight.shape[0] != x.shape[1]:
        raise KernelFailed(
            f"need input (B, C, L) and weight (C, 1, k), got {x.shape} and {weight.shape}"
        )
    b, c, length = x.shape
    k = weight.shape[2]
    if past_state is None:
        past_state = np.zeros((b, c, k - 1), dtype=x.dtype)
    elif past_state.shape != (b, c, k - 1):
        raise KernelFailed(f"past_state must be {(b, c, k - 1)}, got {past_state.shape}")
    padded = np.concatenate([past_state.astype(x.dtype, copy=False), x], axis=2)
    work = _work_dtype(x.dtype)
    pw = padded.astype(work, copy=False)
    w = weight.astype(work, copy=False)[:, 0, :]  # (C, k)
    y = np.zeros((b, c, length), dtype=work)
    for j in range(k):
        y += pw[:, :, j : j + length] * w[:, j, None]
    if bias is not None:
        y += bias.astype(work, copy=False)[:, None]
    if activation != "none":
        y = y.astype(x.dtype).astype(np.float32)  # the convolution's result, rounded first
        with np.errstate(over="ignore"):
            y = y / (1 + np.exp(-y))
    present = padded[:, :, padded.shape[2] - (k - 1) :].copy()
    return y.astype(x.dtype), present


@op("FlexAttention", since=1, domain="ai.onnx.preview")
def flex_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    /,
    *,
    prob_mod: Callable | None = None,
    scale: float | None = None,
    score_mod: Callable | None = None,
    softmax_precision: int | None = None,
) -> np.ndarray:
    """Attention whose scores and probabilities may pass through user subgraphs.

    The softmax runs in ``softmax_precision`` (float32 for half inputs, else the
    input dtype); ``score_mod`` and ``prob_mod`` each take and return one
    ``(B, Hq, L, S)`` tensor in that precision.
    """
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise KernelFailed(f"FlexAttention needs 4-D Q, K, V, got {q.shape}, {k.shape}, {v.shape}")
    b, hq, lq, d = q.shape
    hkv, s = k.shape[1], k.shape[2]
    if v.shape[1] != hkv or v.shape[2] != s or k.shape[3] != d:
        raise KernelFailed(f"K {k.shape} and V {v.shape} do not fit Q {q.shape}")
    if hq % hkv:
        raise KernelFailed(f"{hq} query heads are not a multiple of {hkv} key/value heads")
    group = hq // hkv
    if softmax_precision is not None:
        soft = _precision(softmax_precision)
    else:
        soft = np.dtype(np.float32) if q.dtype.itemsize < 4 else q.dtype
    if scale is None:
        scale = 1.0 / np.sqrt(d)
    root = np.asarray(np.sqrt(np.float32(scale))).astype(q.dtype)
    work = _work_dtype(q.dtype)
    qs = (q * root).astype(work, copy=False).reshape(b, hkv, group, lq, d)
    ks = (k * root).astype(work, copy=False)
    scores = np.matmul(qs, np.swapaxes(ks, -1, -2)[:, :, None]).reshape(b, hq, lq, s)
    scores = scores.astype(q.dtype).astype(soft)
    if score_mod is not None:
        scores = _call_mod(score_mod, scores, soft, "score_mod")
    probs = _softmax_rows(scores)
    if prob_mod is not None:
        probs = _call_mod(prob_mod, probs, soft, "prob_mod")
    pv = probs.reshape(b, hkv, group, lq, s)
    y = np.matmul(pv, v.astype(soft, copy=False)[:, :, None]).reshape(b, hq, lq, v.shape[3])
    return y.astype(v.dtype)


def _call_mod(graph: Callable, x: np.ndarray, dtype: np.dtype, name: str) -> np.ndarray:
    """Run a modifier subgraph on ``x``; it must give one tensor of the same shape."""
    outputs = graph(x)
    if len(outputs) != 1:
        raise KernelFailed(f"{name} must have exactly one output, got {len(outputs)}")
    y = np.asarray(outputs[0]).astype(dtype, copy=False)
    if y.shape != x.shape:
        raise KernelFailed(f"{name} changed the shape {x.shape} to {y.shape}")
    return y

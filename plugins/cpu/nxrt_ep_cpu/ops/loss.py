"""Loss kernels: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.

Both gather ``-input[n, target[n, d...], d...]``, weight it by
``weight[target]`` (1 without weights), drop ``ignore_index`` positions (their
loss and weight become 0), then reduce: ``none`` keeps the target's shape,
``sum`` adds, ``mean`` divides the sum by the total weight kept.
"""

from __future__ import annotations

import numpy as np

from nxrt.errors import KernelFailed
from nxrt_ep_cpu.ops._registry import op

_REDUCTIONS = ("none", "sum", "mean")


def _work_dtype(dtype: np.dtype) -> np.dtype:
    """float32 for floats narrower than it (float16, bfloat16), else the dtype itself."""
    if dtype.kind == "V" or (dtype.kind == "f" and dtype.itemsize < 4):
        return np.dtype(np.float32)
    return dtype


def _nll(
    log_prob: np.ndarray,
    target: np.ndarray,
    weight: np.ndarray | None,
    reduction: str,
    ignore_index: int | None,
    dtype: np.dtype,
) -> np.ndarray:
    if isinstance(reduction, bytes):
        reduction = reduction.decode()
    if reduction not in _REDUCTIONS:
        raise KernelFailed(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    if log_prob.ndim < 2:
        raise KernelFailed(f"the input must be (N, C, d1, ...), got shape {log_prob.shape}")
    n, c = log_prob.shape[:2]
    if target.shape != (n,) + log_prob.shape[2:]:
        raise KernelFailed(
            f"target shape {target.shape} must be the input's {log_prob.shape} without axis 1"
        )
    t = target.astype(np.int64, copy=False)
    if ignore_index is None:
        ignored = np.zeros(t.shape, dtype=bool)
    else:
        ignored = t == ignore_index
    safe = np.where(ignored, 0, t)
    if safe.size and (safe.min() < 0 or safe.max() >= c):
        raise KernelFailed(f"target values must lie in [0, {c}) unless they equal ignore_index")
    picked = np.take_along_axis(log_prob, np.expand_dims(safe, 1), axis=1)
    loss = -np.squeeze(picked, axis=1)
    if weight is None:
        w = np.ones(t.shape, dtype=loss.dtype)
    else:
        w = weight.astype(loss.dtype, copy=False)[safe]
    w = np.where(ignored, loss.dtype.type(0), w)
    loss = np.where(ignored, loss.dtype.type(0), loss * w)
    if reduction == "none":
        return loss.astype(dtype, copy=False)
    total = np.sum(loss)
    if reduction == "mean":
        with np.errstate(invalid="ignore", divide="ignore"):  # nothing kept: NaN
            total = total / np.sum(w)
    return np.asarray(total).astype(dtype, copy=False)


@op("NegativeLogLikelihoodLoss", since=(12, 13, 22))
def negative_log_likelihood_loss(
    x: np.ndarray,
    target: np.ndarray,
    weight: np.ndarray | None = None,
    /,
    *,
    ignore_index: int | None = None,
    reduction: str = "mean",
) -> np.ndarray:
    """NLL loss of log-probabilities ``x`` (N, C, d1, ...) against class indices ``target``."""
    work = _work_dtype(x.dtype)
    return _nll(x.astype(work, copy=False), target, weight, reduction, ignore_index, x.dtype)


@op("SoftmaxCrossEntropyLoss", since=(12, 13))
def softmax_cross_entropy_loss(
    scores: np.ndarray,
    labels: np.ndarray,
    weights: np.ndarray | None = None,
    /,
    *,
    ignore_index: int | None = None,
    reduction: str = "mean",
) -> tuple[np.ndarray, np.ndarray]:
    """NLL of ``log_softmax(scores, axis=1)``; also returns those log-probabilities."""
    if scores.ndim < 2:
        raise KernelFailed(f"scores must be (N, C, d1, ...), got shape {scores.shape}")
    work = _work_dtype(scores.dtype)
    s = scores.astype(work, copy=False)
    log_prob = s - np.max(s, axis=1, keepdims=True)
    log_prob -= np.log(np.sum(np.exp(log_prob), axis=1, keepdims=True))
    loss = _nll(log_prob, labels, weights, reduction, ignore_index, scores.dtype)
    return loss, log_prob.astype(scores.dtype, copy=False)

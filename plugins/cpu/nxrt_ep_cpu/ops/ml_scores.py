"""Score post-transforms shared by the ai.onnx.ml classifiers and regressors.

The spec names the transforms (NONE, LOGISTIC, SOFTMAX, SOFTMAX_ZERO,
PROBIT) but leaves the binary case open: a classifier with one score column
and two labels must still output two columns. These helpers follow ONNX
Runtime's reading, so converted models give its numbers: the second column is
derived from the one score (``1 - s``, ``-s``, or ``logistic(-s)``) as
:func:`expand_binary` documents. All work is on whole ``[N, C]`` arrays in
float32, the scores' type in the spec.
"""

from __future__ import annotations

import math

import numpy as np

from nxrt.errors import KernelFailed

TRANSFORMS = ("NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO", "PROBIT")

#: How one binary score becomes two columns (ONNX Runtime's numbering):
#: 0 and 1: ``[1 - s, s]`` (weights all positive); 2 and 3: ``[-s, s]``, or
#: ``[logistic(-s), logistic(s)]`` under LOGISTIC (mixed weights).
ONE_MINUS, NEGATED = 0, 2


def check_transform(name: str) -> str:
    """The transform's name, or a :class:`KernelFailed` naming the valid ones."""
    text = name.decode() if isinstance(name, bytes) else str(name)
    if text not in TRANSFORMS:
        raise KernelFailed(f"unknown post_transform {text!r}; expected one of {TRANSFORMS}")
    return text


def logistic(x: np.ndarray) -> np.ndarray:
    """``1 / (1 + exp(-x))`` without overflow for large ``|x|``."""
    v = 1 / (1 + np.exp(-np.abs(x)))
    return np.where(x < 0, 1 - v, v)


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def softmax_zero(x: np.ndarray) -> np.ndarray:
    """Softmax over the nonzero scores; zeros stay (nearly) zero instead of becoming exp(0)."""
    top = x.max(axis=-1, keepdims=True)
    nonzero = np.abs(x) > 1e-7
    e = np.where(nonzero, np.exp(np.where(nonzero, x - top, 0)), x * np.exp(-top))
    total = np.where(nonzero, e, 0).sum(axis=-1, keepdims=True)
    return e / total


def probit(x: np.ndarray) -> np.ndarray:
    """``sqrt(2) * erfinv(2x - 1)``, the inverse of the standard normal CDF."""
    erfinv = np.vectorize(erf_inverse, otypes=[np.float64])
    return (math.sqrt(2) * erfinv(2 * np.asarray(x, dtype=np.float64) - 1)).astype(x.dtype)


def erf_inverse(y: float) -> float:
    """Inverse error function: a closed-form start refined by Newton steps."""
    if y <= -1:
        return -math.inf
    if y >= 1:
        return math.inf
    a = 0.147
    ln = math.log(1 - y * y)
    t = 2 / (math.pi * a) + ln / 2
    x = math.copysign(math.sqrt(math.sqrt(t * t - ln / a) - t), y)
    for _ in range(3):
        x -= (math.erf(x) - y) / (2 / math.sqrt(math.pi) * math.exp(-x * x))
    return x


def transform(scores: np.ndarray, name: str) -> np.ndarray:
    """Apply a post-transform to ``[N, C]`` scores row by row (C >= 2, or any C for NONE)."""
    if name == "NONE":
        return scores
    if name == "LOGISTIC":
        return logistic(scores)
    if name == "SOFTMAX":
        return softmax(scores)
    if name == "SOFTMAX_ZERO":
        return softmax_zero(scores)
    if name == "PROBIT":
        return probit(scores)
    raise KernelFailed(f"unknown post_transform {name!r}; expected one of {TRANSFORMS}")


def expand_binary(score: np.ndarray, name: str, mode: np.ndarray | int) -> np.ndarray:
    """Two score columns from one (``[N]`` -> ``[N, 2]``), per row by ``mode``.

    Under LOGISTIC both columns are ``[logistic(-s), logistic(s)]``. Otherwise
    ``mode`` (per row, or one for all) is :data:`ONE_MINUS` for ``[1 - s, s]``
    or :data:`NEGATED` for ``[-s, s]``; other transforms are not applied to a
    single binary score, as ONNX Runtime does not apply them.
    """
    score = score.reshape(-1)
    if name == "LOGISTIC":
        return np.stack([logistic(-score), logistic(score)], axis=1).astype(score.dtype)
    negated = np.stack([-score, score], axis=1)
    one_minus = np.stack([1 - score, score], axis=1)
    negate = np.asarray(mode) >= NEGATED
    return np.where(np.reshape(negate, (-1, 1)), negated, one_minus).astype(score.dtype)


def scores_out(scores: np.ndarray, name: str, binary_mode: np.ndarray | int | None) -> np.ndarray:
    """Post-transformed float32 scores: ``[N, C]`` with C >= 2 through :func:`transform`;
    one column through PROBIT, :func:`expand_binary` (``binary_mode`` set) or unchanged."""
    scores = np.asarray(scores, dtype=np.float32)
    if scores.shape[1] >= 2:
        return transform(scores, name).astype(np.float32)
    if name == "PROBIT":
        return probit(scores)
    if binary_mode is None:
        return scores
    return expand_binary(scores[:, 0], name, binary_mode)


def text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def labels_array(ints: list[int] | None, strings: list[str] | None) -> np.ndarray:
    """Class labels as an int64 or string (object) array; strings win when both are set."""
    if strings:
        return np.array([text(s) for s in strings], dtype=object)
    return np.asarray(ints or [], dtype=np.int64)


def as_rows(x: np.ndarray, op: str) -> np.ndarray:
    """``x`` as ``[N, F]`` float32 (a 1-D input is one row), as the ml classifiers read it."""
    if x.ndim == 0:
        raise KernelFailed(f"{op}: the input needs at least one dimension")
    if x.ndim == 1:
        x = x.reshape(1, -1)
    elif x.ndim > 2:
        x = x.reshape(x.shape[0], -1)
    return np.ascontiguousarray(x, dtype=np.float32)

"""ai.onnx.ml linear models and support vector machines.

LinearClassifier, LinearRegressor, SVMClassifier and SVMRegressor compute
their scores as matrix products over all rows at once. Where the spec leaves
the binary case open (one score column, two labels), the rules are ONNX
Runtime's, so converted scikit-learn models give its labels and scores.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np

from nxrt.errors import KernelFailed
from nxrt_ep_cpu.ops._registry import op
from nxrt_ep_cpu.ops.ml_scores import (
    NEGATED,
    ONE_MINUS,
    as_rows,
    check_transform,
    labels_array,
    logistic,
    scores_out,
    text,
    transform,
)

_ML = "ai.onnx.ml"


def _coefficient_rows(coefficients, rows: int | None, features: int, op_name: str) -> np.ndarray:
    coef = np.asarray(coefficients if coefficients is not None else [], dtype=np.float32)
    if rows is None:
        rows = coef.size // features if features else 0
    if rows * features != coef.size or not coef.size:
        raise KernelFailed(
            f"{op_name}: {coef.size} coefficients do not make {rows} rows of {features} features"
        )
    return coef.reshape(rows, features)


def _binary_labels(labels: np.ndarray) -> tuple[Any, Any]:
    """(negative, positive) labels of a one-score classifier: the two given, else 0 and 1."""
    if len(labels) == 2:
        return labels[0], labels[1]
    return ("0", "1") if labels.dtype == object else (0, 1)


def _label_dtype(labels: np.ndarray) -> type:
    return object if labels.dtype == object else np.int64


# -- LinearClassifier / LinearRegressor --------------------------------------------------------


@op("LinearClassifier", since=1, domain=_ML)
def linear_classifier(
    x: np.ndarray,
    /,
    *,
    classlabels_ints: list[int] | None = None,
    classlabels_strings: list[str] | None = None,
    coefficients: list[float],
    intercepts: list[float] | None = None,
    multi_class: int = 0,
    post_transform: str = "NONE",
) -> tuple[np.ndarray, np.ndarray]:
    """Labels and scores of ``x @ coefficients.T + intercepts``.

    One score column with two labels is the binary case: the label is the
    second one where the score is positive, and the scores become ``[1 - s, s]``.
    """
    post = check_transform(post_transform)
    rows = as_rows(x, "LinearClassifier")
    classes = len(intercepts) if intercepts else None
    coef = _coefficient_rows(coefficients, classes, rows.shape[1], "LinearClassifier")
    scores = rows @ coef.T
    if intercepts:
        scores += np.asarray(intercepts, dtype=np.float32)
    labels = labels_array(classlabels_ints, classlabels_strings)
    if coef.shape[0] == 1:
        negative, positive = _binary_labels(labels)
        label = np.where(scores[:, 0] > 0, positive, negative).astype(_label_dtype(labels))
        binary = ONE_MINUS if len(labels) == 2 else None
        return label, scores_out(scores, post, binary)
    if len(labels) < coef.shape[0]:
        raise KernelFailed(
            f"LinearClassifier: {coef.shape[0]} score columns but {len(labels)} class labels"
        )
    return labels[np.argmax(scores, axis=1)], scores_out(scores, post, None)


@op("LinearRegressor", since=1, domain=_ML)
def linear_regressor(
    x: np.ndarray,
    /,
    *,
    coefficients: list[float] | None = None,
    intercepts: list[float] | None = None,
    post_transform: str = "NONE",
    targets: int = 1,
) -> np.ndarray:
    """``x @ coefficients.T + intercepts``, ``[N, targets]`` in float32."""
    post = check_transform(post_transform)
    rows = as_rows(x, "LinearRegressor")
    coef = _coefficient_rows(coefficients, targets, rows.shape[1], "LinearRegressor")
    scores = rows @ coef.T
    if intercepts:
        scores += np.asarray(intercepts, dtype=np.float32)
    return scores_out(scores, post, None)


# -- SVMs ----------------------------------------------------------------------------------------

_KERNELS = ("LINEAR", "POLY", "RBF", "SIGMOID")


def _kernel(
    rows: np.ndarray, vectors: np.ndarray, kind: str, params: list[float] | None
) -> np.ndarray:
    """The kernel between every row and every support vector, ``[N, V]``.

    RBF uses ``|x|^2 + |v|^2 - 2 x.v`` in float64, which keeps the distance
    exact enough without an ``[N, V, F]`` temporary.
    """
    gamma, coef0, degree = (list(params) + [0.0, 0.0, 0.0])[:3] if params else (0.0, 0.0, 0.0)
    if kind == "RBF":
        x64, v64 = rows.astype(np.float64), vectors.astype(np.float64)
        dist = (x64 * x64).sum(1)[:, None] + (v64 * v64).sum(1)[None, :] - 2 * (x64 @ v64.T)
        return np.exp(-np.float32(gamma) * np.maximum(dist, 0)).astype(np.float32)
    dot = rows @ vectors.T
    if kind == "LINEAR":
        return dot
    dot = np.float32(gamma) * dot + np.float32(coef0)
    if kind == "POLY":
        return np.power(dot, np.float32(degree))
    if kind == "SIGMOID":
        return np.tanh(dot)
    raise KernelFailed(f"unknown kernel_type {kind!r}; expected one of {_KERNELS}")


def _sigmoid_probability(score: np.ndarray, a: float, b: float) -> np.ndarray:
    """Platt's pairwise probability, clipped away from 0 and 1."""
    value = score * np.float32(a) + np.float32(b)
    p = (1 - logistic(value)).astype(np.float32)
    return np.clip(p, np.float32(1e-7), np.float32(1 - 1e-7))


def _pairwise_coupling(r: np.ndarray) -> np.ndarray:
    """Class probabilities from pairwise ones (Wu, Lin and Weng's second method), per row.

    ``r[:, i, j]`` is P(class i | i or j). The iteration runs in float32 and
    stops per row as libsvm's does (at most 100 rounds, error below
    0.005 / k), so the probabilities agree with libsvm-derived runtimes to
    float32 precision rather than only to the stopping tolerance.
    """
    n, k, _ = r.shape
    f32 = np.float32
    q = np.zeros((n, k, k), dtype=f32)
    for i in range(k):
        for j in range(k):
            if j != i:
                q[:, i, i] += r[:, j, i] * r[:, j, i]
        for j in range(k):
            if j < i:
                q[:, i, j] = q[:, j, i]
            elif j > i:
                q[:, i, j] = -r[:, j, i] * r[:, i, j]
    p = np.full((n, k), f32(1.0) / f32(k), dtype=f32)
    eps = f32(0.005) / f32(k)
    active = np.ones(n, dtype=bool)
    for _ in range(100):
        qp = np.zeros((n, k), dtype=f32)
        for i in range(k):
            for j in range(k):
                qp[:, i] += q[:, i, j] * p[:, j]
        pqp = np.zeros(n, dtype=f32)
        for i in range(k):
            pqp += p[:, i] * qp[:, i]
        error = np.abs(qp - pqp[:, None]).max(axis=1)
        active &= ~(error < eps)
        if not active.any():
            break
        rows = np.flatnonzero(active)
        pa, qpa, pqpa, qa = p[rows], qp[rows], pqp[rows], q[rows]
        for i in range(k):
            diff = (-qpa[:, i] + pqpa) / qa[:, i, i]
            pa[:, i] += diff
            one = f32(1) + diff
            pqpa = (pqpa + diff * (diff * qa[:, i, i] + f32(2) * qpa[:, i])) / one / one
            qpa = (qpa + diff[:, None] * qa[:, i, :]) / one[:, None]
            pa /= one[:, None]
        p[rows] = pa
    return p


@op("SVMClassifier", since=1, domain=_ML)
def svm_classifier(
    x: np.ndarray,
    /,
    *,
    classlabels_ints: list[int] | None = None,
    classlabels_strings: list[str] | None = None,
    coefficients: list[float] | None = None,
    kernel_params: list[float] | None = None,
    kernel_type: str = "LINEAR",
    post_transform: str = "NONE",
    prob_a: list[float] | None = None,
    prob_b: list[float] | None = None,
    rho: list[float] | None = None,
    support_vectors: list[float] | None = None,
    vectors_per_class: list[int] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Labels and scores of a one-vs-one SVM (libsvm layout) or, without support
    vectors, of a linear one (liblinear layout: one coefficient row per class).

    With support vectors the label is the class with most pairwise votes; the
    scores are the pairwise decision values, or, given ``prob_a``/``prob_b``,
    class probabilities by pairwise coupling.
    """
    post = check_transform(post_transform)
    rows = as_rows(x, "SVMClassifier")
    labels = labels_array(classlabels_ints, classlabels_strings)
    classes = max(len(labels), 1)
    coef_all = np.asarray(coefficients or [], dtype=np.float32)
    all_positive = bool((coef_all >= 0).all())
    have_proba = bool(prob_a)
    rho_values = np.asarray(rho or [0.0], dtype=np.float32)
    per_class = [int(v) for v in vectors_per_class or []]
    vector_count = sum(per_class)
    if vector_count == 0:  # liblinear: scores = x @ coef.T + rho[0]
        coef = _coefficient_rows(coefficients, classes, rows.shape[1], "SVMClassifier")
        scores = rows @ coef.T + rho_values[0]
        maxclass = np.argmax(scores, axis=1)
        max_weight = scores[np.arange(len(scores)), maxclass]
        label = _choose(labels, maxclass, max_weight, have_proba, all_positive, classes)
        return label, scores_out(scores, post, None)

    kind = text(kernel_type)
    vectors = np.asarray(support_vectors or [], dtype=np.float32)
    if vectors.size != vector_count * rows.shape[1]:
        raise KernelFailed(
            f"SVMClassifier: {vectors.size} support vector values are not {vector_count} "
            f"vectors of {rows.shape[1]} features"
        )
    if len(per_class) != classes or coef_all.size != (classes - 1) * vector_count:
        raise KernelFailed(
            f"SVMClassifier: vectors_per_class has {len(per_class)} entries and coefficients "
            f"{coef_all.size} values for {classes} classes and {vector_count} support vectors"
        )
    kernel = _kernel(rows, vectors.reshape(vector_count, -1), kind, kernel_params).astype(
        np.float64
    )
    coef = coef_all.reshape(classes - 1, vector_count).astype(np.float64)
    starts = np.concatenate([[0], np.cumsum(per_class)]).astype(int)
    pairs = [(i, j) for i in range(classes) for j in range(i + 1, classes)]
    if len(rho_values) < len(pairs):
        raise KernelFailed(f"SVMClassifier: {len(pairs)} class pairs need as many rho values")
    decision = np.empty((len(rows), len(pairs)), dtype=np.float32)
    votes = np.zeros((len(rows), classes), dtype=np.int64)
    for index, (i, j) in enumerate(pairs):
        si, sj = slice(starts[i], starts[i + 1]), slice(starts[j], starts[j + 1])
        total = kernel[:, si] @ coef[j - 1, si] + kernel[:, sj] @ coef[i, sj] + rho_values[index]
        decision[:, index] = total
        wins_i = total > 0
        votes[:, i] += wins_i
        votes[:, j] += ~wins_i
    maxclass = np.argmax(votes, axis=1)
    label = _choose(labels, maxclass, np.zeros(len(rows)), have_proba, all_positive, classes)
    if have_proba:
        assert prob_a is not None  # have_proba
        if len(prob_a) < len(pairs) or len(prob_b or []) < len(pairs):
            raise KernelFailed(f"SVMClassifier: {len(pairs)} class pairs need prob_a and prob_b")
        r = np.zeros((len(rows), classes, classes), dtype=np.float32)
        for index, (i, j) in enumerate(pairs):
            b = cast("list[float]", prob_b)[index]  # as many as pairs: checked above
            p = _sigmoid_probability(decision[:, index], prob_a[index], b)
            r[:, i, j], r[:, j, i] = p, 1 - p
        return label, scores_out(_pairwise_coupling(r), post, None)
    if len(pairs) == 1:  # binary: two columns from the one decision value
        return label, scores_out(decision, post, NEGATED if post == "NONE" else ONE_MINUS)
    return label, transform(decision, post).astype(np.float32)


def _choose(
    labels: np.ndarray,
    maxclass: np.ndarray,
    max_weight: np.ndarray,
    have_proba: bool,
    all_positive: bool,
    classes: int,
) -> np.ndarray:
    """The label of each row: the top class, with the binary rules for two classes."""
    if len(labels) == 0:
        raise KernelFailed("SVMClassifier: set classlabels_ints or classlabels_strings")
    if classes != 2:
        return labels[maxclass]
    if len(labels) != 2:
        negative, positive = _binary_labels(np.empty(0, dtype=labels.dtype))
        return np.where(max_weight > 0, positive, negative).astype(_label_dtype(labels))
    top = labels[maxclass]
    if have_proba:
        return top
    second = (max_weight >= 0.5) if all_positive else (max_weight > 0)
    return np.where(second, labels[1], top).astype(_label_dtype(labels))


@op("SVMRegressor", since=1, domain=_ML)
def svm_regressor(
    x: np.ndarray,
    /,
    *,
    coefficients: list[float] | None = None,
    kernel_params: list[float] | None = None,
    kernel_type: str = "LINEAR",
    n_supports: int = 0,
    one_class: int = 0,
    post_transform: str = "NONE",
    rho: list[float] | None = None,
    support_vectors: list[float] | None = None,
) -> np.ndarray:
    """``[N, 1]``: ``kernel(x, support_vectors) @ coefficients + rho[0]``, or without
    support vectors ``x @ coefficients + rho[0]``; ``one_class`` gives +1 / -1."""
    post = check_transform(post_transform)
    rows = as_rows(x, "SVMRegressor")
    rho0 = np.float32((rho or [0.0])[0])
    if n_supports > 0:
        vectors = np.asarray(support_vectors or [], dtype=np.float32)
        if vectors.size != n_supports * rows.shape[1]:
            raise KernelFailed(
                f"SVMRegressor: {vectors.size} support vector values are not {n_supports} "
                f"vectors of {rows.shape[1]} features"
            )
        kernel = _kernel(rows, vectors.reshape(n_supports, -1), text(kernel_type), kernel_params)
        coef = _coefficient_rows(coefficients, 1, n_supports, "SVMRegressor")
        scores = kernel @ coef.T + rho0
    else:
        coef = _coefficient_rows(coefficients, 1, rows.shape[1], "SVMRegressor")
        scores = rows @ coef.T + rho0
    if one_class:
        scores = np.where(scores > 0, np.float32(1), np.float32(-1))
    return scores_out(scores.astype(np.float32), post, None)

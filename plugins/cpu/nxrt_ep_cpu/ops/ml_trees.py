"""ai.onnx.ml TreeEnsembleClassifier and TreeEnsembleRegressor (opsets 1 and 3).

Each node's ensemble becomes a :class:`~nxrt_ep_cpu.ops.ml_tree_walk.Forest`
once, when its kernel is created (the registered ``factory``); runs then only
walk it. The registered functions build the same plans per call, for
constant folding and single-op use.

How scores become outputs (base values, averaging, and the binary case with
one weighted class) follows ONNX Runtime, whose reading converted models
are checked against: see :meth:`ClassifierPlan.finish`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import numpy as np

from nxrt.errors import KernelFailed
from nxrt.kernel import Kernel, attribute_values
from nxrt_ep_cpu.compiling import compiled_kernel
from nxrt_ep_cpu.kernels import CpuKernel
from nxrt_ep_cpu.ops._registry import op
from nxrt_ep_cpu.ops.ml_scores import (
    check_transform,
    expand_binary,
    labels_array,
    probit,
    text,
    transform,
)
from nxrt_ep_cpu.ops.ml_tree_walk import Forest, leaf_scores, legacy_forest

_ML = "ai.onnx.ml"
_AGGREGATES = ("SUM", "AVERAGE", "MIN", "MAX")


def _values(plain: Any, as_tensor: Any, name: str, op_name: str) -> np.ndarray:
    """A float list attribute or its ``*_as_tensor`` twin (opset 3), as float64."""
    if plain is not None and len(plain) and as_tensor is not None and np.size(as_tensor):
        raise KernelFailed(f"{op_name}: set {name} or {name}_as_tensor, not both")
    chosen = as_tensor if as_tensor is not None and np.size(as_tensor) else plain
    return np.asarray(chosen if chosen is not None else [], dtype=np.float64).reshape(-1)


def prepared(build: Callable[..., Any]) -> Callable[[Any, Any], Kernel]:
    """A registry ``factory``: the plan is built from the node's attributes once, and walks
    its trees in numpy until the compiled walk is built
    (:func:`~nxrt_ep_cpu.compiling.compiled_kernel`)."""

    def factory(ep: Any, node: Any) -> Kernel:
        plan = build(parallel=ep.parallel, **attribute_values(node))
        return compiled_kernel(
            ep,
            node,
            lambda: CpuKernel(plan, {}),
            lambda: CpuKernel(plan, {"compiled": False}),
            key=("tree-walk",),
        )

    return factory


# -- regressor -----------------------------------------------------------------------------------
class RegressorPlan:
    """A TreeEnsembleRegressor node, ready to run: ``plan(x)`` is ``[N, n_targets]`` float32."""

    def __init__(
        self,
        *,
        parallel: Any = None,
        aggregate_function: str = "SUM",
        base_values: list[float] | None = None,
        base_values_as_tensor: np.ndarray | None = None,
        n_targets: int | None = None,
        nodes_falsenodeids: list[int] | None = None,
        nodes_featureids: list[int] | None = None,
        nodes_hitrates: list[float] | None = None,
        nodes_hitrates_as_tensor: np.ndarray | None = None,
        nodes_missing_value_tracks_true: list[int] | None = None,
        nodes_modes: list[str] | None = None,
        nodes_nodeids: list[int] | None = None,
        nodes_treeids: list[int] | None = None,
        nodes_truenodeids: list[int] | None = None,
        nodes_values: list[float] | None = None,
        nodes_values_as_tensor: np.ndarray | None = None,
        post_transform: str = "NONE",
        target_ids: list[int] | None = None,
        target_nodeids: list[int] | None = None,
        target_treeids: list[int] | None = None,
        target_weights: list[float] | None = None,
        target_weights_as_tensor: np.ndarray | None = None,
    ) -> None:
        name = "TreeEnsembleRegressor"
        self.parallel = parallel
        self.aggregate = text(aggregate_function)
        if self.aggregate not in _AGGREGATES:
            raise KernelFailed(f"{name}: unknown aggregate_function {self.aggregate!r}")
        self.post = check_transform(post_transform)
        self.base = _values(base_values, base_values_as_tensor, "base_values", name)
        ids = list(target_ids or [])
        if not n_targets:
            n_targets = max(ids) + 1 if ids else 1
        self.n_targets = int(n_targets)
        self.forest = legacy_forest(
            nodes_treeids=nodes_treeids or [],
            nodes_nodeids=nodes_nodeids or [],
            nodes_featureids=nodes_featureids or [],
            nodes_values=_values(nodes_values, nodes_values_as_tensor, "nodes_values", name),
            nodes_modes=nodes_modes or [],
            nodes_truenodeids=nodes_truenodeids or [],
            nodes_falsenodeids=nodes_falsenodeids or [],
            nodes_missing_value_tracks_true=nodes_missing_value_tracks_true,
            target_treeids=target_treeids or [],
            target_nodeids=target_nodeids or [],
            target_ids=ids,
            target_weights=_values(
                target_weights, target_weights_as_tensor, "target_weights", name
            ),
            n_targets=self.n_targets,
            op=name,
        )

    def __call__(self, x: np.ndarray, *, compiled: bool = True) -> np.ndarray:
        x = self.forest.check_input(x, "TreeEnsembleRegressor")
        single = self.n_targets == 1
        total, low, high, seen = leaf_scores(
            self.forest,
            x,
            first_weight_only=single,
            parallel=self.parallel,
            extremes=self.aggregate in ("MIN", "MAX"),
            compiled=compiled,
        )
        use_base = len(self.base) == self.n_targets
        base = self.base if use_base else np.zeros(self.n_targets)
        if self.aggregate == "SUM":
            scores = total + base
        elif self.aggregate == "AVERAGE":
            scores = total / max(self.forest.n_trees, 1) + base
        else:
            picked = cast(np.ndarray, low if self.aggregate == "MIN" else high)  # extremes
            scores = np.where(seen, picked, 0) + base
        scores = scores.astype(np.float32)
        if single:
            return probit(scores) if self.post == "PROBIT" else scores
        return transform(scores, self.post).astype(np.float32)


def _regressor(x: np.ndarray, **attrs: Any) -> np.ndarray:
    return RegressorPlan(**attrs)(x)


@op("TreeEnsembleRegressor", since=(1, 3), domain=_ML, factory=prepared(RegressorPlan))
def tree_ensemble_regressor(
    x: np.ndarray,
    /,
    *,
    aggregate_function: str = "SUM",
    base_values: list[float] | None = None,
    base_values_as_tensor: np.ndarray | None = None,
    n_targets: int | None = None,
    nodes_falsenodeids: list[int] | None = None,
    nodes_featureids: list[int] | None = None,
    nodes_hitrates: list[float] | None = None,
    nodes_hitrates_as_tensor: np.ndarray | None = None,
    nodes_missing_value_tracks_true: list[int] | None = None,
    nodes_modes: list[str] | None = None,
    nodes_nodeids: list[int] | None = None,
    nodes_treeids: list[int] | None = None,
    nodes_truenodeids: list[int] | None = None,
    nodes_values: list[float] | None = None,
    nodes_values_as_tensor: np.ndarray | None = None,
    post_transform: str = "NONE",
    target_ids: list[int] | None = None,
    target_nodeids: list[int] | None = None,
    target_treeids: list[int] | None = None,
    target_weights: list[float] | None = None,
    target_weights_as_tensor: np.ndarray | None = None,
) -> np.ndarray:
    """Each row's leaf weights over all trees, aggregated per target (SUM, AVERAGE, MIN, MAX)
    plus ``base_values``, then post-transformed.

    Opset 3 added the ``*_as_tensor`` attributes (double precision thresholds,
    weights and base values); opset 1 models simply do not set them.
    """
    return _regressor(x, **_keywords(locals()))


def _keywords(names: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in names.items() if k != "x"}


# -- classifier ----------------------------------------------------------------------------------
class ClassifierPlan:
    """A TreeEnsembleClassifier node, ready to run: ``plan(x)`` is (labels, scores)."""

    def __init__(
        self,
        *,
        parallel: Any = None,
        base_values: list[float] | None = None,
        base_values_as_tensor: np.ndarray | None = None,
        class_ids: list[int] | None = None,
        class_nodeids: list[int] | None = None,
        class_treeids: list[int] | None = None,
        class_weights: list[float] | None = None,
        class_weights_as_tensor: np.ndarray | None = None,
        classlabels_int64s: list[int] | None = None,
        classlabels_strings: list[str] | None = None,
        nodes_falsenodeids: list[int] | None = None,
        nodes_featureids: list[int] | None = None,
        nodes_hitrates: list[float] | None = None,
        nodes_hitrates_as_tensor: np.ndarray | None = None,
        nodes_missing_value_tracks_true: list[int] | None = None,
        nodes_modes: list[str] | None = None,
        nodes_nodeids: list[int] | None = None,
        nodes_treeids: list[int] | None = None,
        nodes_truenodeids: list[int] | None = None,
        nodes_values: list[float] | None = None,
        nodes_values_as_tensor: np.ndarray | None = None,
        post_transform: str = "NONE",
    ) -> None:
        name = "TreeEnsembleClassifier"
        self.parallel = parallel
        self.post = check_transform(post_transform)
        self.labels = labels_array(classlabels_int64s, classlabels_strings)
        if not len(self.labels):
            raise KernelFailed(f"{name}: set classlabels_int64s or classlabels_strings")
        self.strings = self.labels.dtype == object
        self.base = _values(base_values, base_values_as_tensor, "base_values", name)
        weights = _values(class_weights, class_weights_as_tensor, "class_weights", name)
        ids = list(class_ids or [])
        self.binary_case = len(self.labels) == 2 and len(set(ids)) == 1
        self.all_positive = bool((weights >= 0).all())
        self.forest: Forest = legacy_forest(
            nodes_treeids=nodes_treeids or [],
            nodes_nodeids=nodes_nodeids or [],
            nodes_featureids=nodes_featureids or [],
            nodes_values=_values(nodes_values, nodes_values_as_tensor, "nodes_values", name),
            nodes_modes=nodes_modes or [],
            nodes_truenodeids=nodes_truenodeids or [],
            nodes_falsenodeids=nodes_falsenodeids or [],
            nodes_missing_value_tracks_true=nodes_missing_value_tracks_true,
            target_treeids=class_treeids or [],
            target_nodeids=class_nodeids or [],
            target_ids=ids,
            target_weights=weights,
            n_targets=len(self.labels),
            op=name,
        )

    def __call__(self, x: np.ndarray, *, compiled: bool = True) -> tuple[np.ndarray, np.ndarray]:
        x = self.forest.check_input(x, "TreeEnsembleClassifier")
        single = len(self.labels) == 1
        total, _, _, seen = leaf_scores(
            self.forest, x, first_weight_only=single, parallel=self.parallel, compiled=compiled
        )
        return self.finish(total, seen)

    def finish(self, scores: np.ndarray, seen: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Labels and scores from the summed weights and which classes got any.

        More than two classes: base values are added, the label is the best
        class that got a weight, and scores of classes without one count as 0.
        Two classes: with ``base_values`` of two entries and weights on the
        second class the scores are ``[-(b1 + s0), b1 + s0]``; a row whose
        second class got no weight has one score, from which the second
        column is made (``1 - s`` when all weights are positive, ``-s`` when
        not; ``[logistic(-s), logistic(s)]`` under LOGISTIC either way), and the
        label is the second class where that score exceeds 0.5 (all weights
        positive) or 0.
        """
        n, classes = scores.shape
        if classes > 2:
            k = min(len(self.base), classes)
            scores[:, :k] += self.base[:k]
            seen[:, :k] = True
            best = np.argmax(np.where(seen, scores, -np.inf), axis=1)
            z = transform(np.where(seen, scores, 0).astype(np.float32), self.post)
            return self.labels[best], z.astype(np.float32)
        if classes == 1:
            s = scores[:, 0] + (self.base[0] if len(self.base) else 0)
            z = s.astype(np.float32).reshape(-1, 1)
            return np.repeat(self.labels[:1], n), probit(z) if self.post == "PROBIT" else z
        s0, s1 = scores[:, 0].copy(), scores[:, 1].copy()
        h0, h1 = seen[:, 0], seen[:, 1]
        two = np.ones(n, dtype=bool)
        mode = np.full(n, -1)
        if len(self.base) == 2:
            merged = self.base[1] + s0
            s1 = np.where(h1, merged, s1 + self.base[1])
            s0 = np.where(h1, -merged, s0 + self.base[0])
        elif len(self.base) == 1:
            s0 = s0 + self.base[0]
            two = h1.copy()
        elif not len(self.base):
            mode[:] = 3
            two = h1.copy()
        positive = np.where(two & h1, s1, np.where(h0, s0, 0))
        if self.binary_case:
            wins = positive > 0.5 if self.all_positive else positive > 0
            mode = np.where(wins, 0, 1) if self.all_positive else np.where(wins, 2, 3)
            label = np.where(wins, self.labels[1], self.labels[0])
        else:
            wins = positive > 0
            label = np.where(wins, self.labels[1], self.labels[0]) if self.strings else wins * 1
        label = label.astype(object if self.strings else np.int64)
        both = np.stack([np.where(h0, s0, 0), np.where(h1, s1, 0)], axis=1).astype(np.float32)
        z = transform(both, self.post).astype(np.float32)
        lone = ~two
        if lone.any():
            z[lone] = self._one_score(both[lone, 0], mode[lone])
        return label, z

    def _one_score(self, s: np.ndarray, mode: np.ndarray) -> np.ndarray:
        """Two columns from a row's one score, by ONNX Runtime's rule for the row's mode
        (:func:`expand_binary`: under LOGISTIC ``[logistic(-s), logistic(s)]`` whatever the
        weights' signs, as onnxruntime since its fix of issue 27533)."""
        zero = np.zeros_like(s)
        if self.post == "PROBIT":
            return np.stack([probit(s), zero], axis=1)
        expanded = expand_binary(s, self.post, np.maximum(mode, 0))
        return np.where(mode[:, None] < 0, np.stack([s, zero], axis=1), expanded)


def _classifier(x: np.ndarray, **attrs: Any) -> tuple[np.ndarray, np.ndarray]:
    return ClassifierPlan(**attrs)(x)


@op("TreeEnsembleClassifier", since=(1, 3), domain=_ML, factory=prepared(ClassifierPlan))
def tree_ensemble_classifier(
    x: np.ndarray,
    /,
    *,
    base_values: list[float] | None = None,
    base_values_as_tensor: np.ndarray | None = None,
    class_ids: list[int] | None = None,
    class_nodeids: list[int] | None = None,
    class_treeids: list[int] | None = None,
    class_weights: list[float] | None = None,
    class_weights_as_tensor: np.ndarray | None = None,
    classlabels_int64s: list[int] | None = None,
    classlabels_strings: list[str] | None = None,
    nodes_falsenodeids: list[int] | None = None,
    nodes_featureids: list[int] | None = None,
    nodes_hitrates: list[float] | None = None,
    nodes_hitrates_as_tensor: np.ndarray | None = None,
    nodes_missing_value_tracks_true: list[int] | None = None,
    nodes_modes: list[str] | None = None,
    nodes_nodeids: list[int] | None = None,
    nodes_treeids: list[int] | None = None,
    nodes_truenodeids: list[int] | None = None,
    nodes_values: list[float] | None = None,
    nodes_values_as_tensor: np.ndarray | None = None,
    post_transform: str = "NONE",
) -> tuple[np.ndarray, np.ndarray]:
    """The top class of each row and the per-class scores summed over all trees.

    Opset 3 added the ``*_as_tensor`` attributes; opset 1 models do not set them.
    """
    return _classifier(x, **_keywords(locals()))

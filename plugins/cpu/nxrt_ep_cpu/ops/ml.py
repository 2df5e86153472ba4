"""ai.onnx.ml kernels: LabelEncoder, TreeEnsemble, Binarizer, ArrayFeatureExtractor.

The rest of the domain lives in the ``ml_*`` modules: linear models and SVMs
(``ml_linear``), feature transforms (``ml_features``), map ops (``ml_maps``)
and the legacy tree ensembles (``ml_trees``), whose engine, shared with
TreeEnsemble here, is ``ml_tree_walk``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from nxrt.errors import KernelFailed
from nxrt_ep_cpu.ops._registry import op
from nxrt_ep_cpu.ops.ml_scores import transform
from nxrt_ep_cpu.ops.ml_tree_walk import LEAF, LEQ, MEMBER, Forest, check_acyclic, leaf_scores
from nxrt_ep_cpu.ops.ml_trees import prepared

_ML = "ai.onnx.ml"


def _text(s: str | bytes) -> str:
    return s.decode() if isinstance(s, bytes) else str(s)


def _as_strings(values: Sequence | np.ndarray) -> np.ndarray:
    """Strings (``str`` or ``bytes``, list or array) as an object array of ``str``."""
    flat = np.asarray(values, dtype=object).reshape(-1)
    return np.array([_text(v) for v in flat.tolist()], dtype=object)


def _is_strings(a: np.ndarray) -> bool:
    return a.dtype.kind in ("O", "U", "S")


# -- LabelEncoder ------------------------------------------------------------------------------


def _lookup(x: np.ndarray, keys: np.ndarray, values: np.ndarray, default) -> np.ndarray:
    """``values[i]`` where ``x == keys[i]`` (the last equal key wins), else ``default``.

    NaN keys match NaN inputs.
    """
    out_dtype = values.dtype
    if _is_strings(keys) != _is_strings(x):
        raise KernelFailed(
            f"LabelEncoder: input of type {x.dtype} does not match keys of type {keys.dtype}"
        )
    if _is_strings(keys):
        table = dict(zip(_as_strings(keys).tolist(), values.tolist()))
        flat = [table.get(_text(v), default) for v in x.reshape(-1).tolist()]
        return np.array(flat, dtype=out_dtype).reshape(x.shape)
    keys = keys.reshape(-1)
    order = np.argsort(keys, kind="stable")  # NaNs sort last
    sorted_keys = keys[order]
    pos = np.searchsorted(sorted_keys, x, side="right") - 1
    pos = np.clip(pos, 0, max(len(keys) - 1, 0))
    if len(keys):
        found = sorted_keys[pos] == x
        if keys.dtype.kind == "f" and x.dtype.kind == "f":
            nan_keys = np.flatnonzero(np.isnan(sorted_keys))
            if len(nan_keys):
                x_nan = np.isnan(x)
                pos = np.where(x_nan, nan_keys[-1], pos)
                found |= x_nan
        result = values[order][pos]
    else:
        found = np.zeros(x.shape, dtype=bool)
        result = np.empty(x.shape, dtype=out_dtype)
    return np.where(found, result, np.asarray(default, dtype=out_dtype)).astype(out_dtype)


@op("LabelEncoder", since=1, domain=_ML)
def label_encoder_1(
    x: np.ndarray,
    /,
    *,
    classes_strings: list[str] | None = None,
    default_int64: int = -1,
    default_string: str = "_Unused",
) -> np.ndarray:
    """Strings to their index in ``classes_strings``, or int64 indices to the strings."""
    classes = _as_strings(classes_strings or [])
    indices = np.arange(len(classes), dtype=np.int64)
    if _is_strings(x):
        return _lookup(x, classes, indices, default_int64)
    return _lookup(x.astype(np.int64), indices, classes, _text(default_string))


@op("LabelEncoder", since=2, domain=_ML)
def label_encoder_2(
    x: np.ndarray,
    /,
    *,
    default_float: float = -0.0,
    default_int64: int = -1,
    default_string: str = "_Unused",
    keys_floats: list[float] | None = None,
    keys_int64s: list[int] | None = None,
    keys_strings: list[str] | None = None,
    values_floats: list[float] | None = None,
    values_int64s: list[int] | None = None,
    values_strings: list[str] | None = None,
) -> np.ndarray:
    """Map each element through the parallel ``keys_*``/``values_*`` lists."""
    return label_encoder(
        x,
        default_float=default_float,
        default_int64=default_int64,
        default_string=default_string,
        keys_floats=keys_floats,
        keys_int64s=keys_int64s,
        keys_strings=keys_strings,
        values_floats=values_floats,
        values_int64s=values_int64s,
        values_strings=values_strings,
    )


@op("LabelEncoder", since=4, domain=_ML)
def label_encoder(
    x: np.ndarray,
    /,
    *,
    default_float: float = -0.0,
    default_int64: int = -1,
    default_string: str = "_Unused",
    default_tensor: np.ndarray | None = None,
    keys_floats: list[float] | None = None,
    keys_int64s: list[int] | None = None,
    keys_strings: list[str] | None = None,
    keys_tensor: np.ndarray | None = None,
    values_floats: list[float] | None = None,
    values_int64s: list[int] | None = None,
    values_strings: list[str] | None = None,
    values_tensor: np.ndarray | None = None,
) -> np.ndarray:
    """Map each element through parallel keys and values (lists or, from opset 4, tensors).

    The default is ``default_tensor`` when values come as a tensor, else the
    ``default_*`` attribute of the values' type.
    """
    key_options = [
        (keys_floats, np.float32),
        (keys_int64s, np.int64),
        (keys_strings, object),
        (keys_tensor, None),
    ]
    value_options = [
        (values_floats, np.float32, default_float),
        (values_int64s, np.int64, default_int64),
        (values_strings, object, _text(default_string)),
        (values_tensor, None, None),
    ]
    set_keys = [(k, t) for k, t in key_options if k is not None]
    set_values = [(v, t, d) for v, t, d in value_options if v is not None]
    if len(set_keys) != 1 or len(set_values) != 1:
        raise KernelFailed("LabelEncoder: set exactly one keys_* and one values_* attribute")
    keys = _attribute_array(*set_keys[0])
    values_attr, values_type, default = set_values[0]
    values = _attribute_array(values_attr, values_type)
    if values_attr is values_tensor:
        if default_tensor is not None:
            default = _attribute_array(default_tensor, None).reshape(-1)[0]
        elif values.dtype == object:
            default = "_Unused"
        elif values.dtype.kind == "f":
            default = -0.0
        else:
            default = -1
    if keys.size != values.size:
        raise KernelFailed(
            f"LabelEncoder: {keys.size} keys but {values.size} values; they must pair up"
        )
    if keys.dtype != object and x.dtype != keys.dtype and not _is_strings(x):
        x = x.astype(keys.dtype)
    return _lookup(x, keys, values.reshape(-1), default)


def _attribute_array(value, dtype) -> np.ndarray:
    """A list or tensor attribute as a flat array (strings as ``str`` objects)."""
    array = np.asarray(value) if dtype is None else None
    if dtype is object or (array is not None and _is_strings(array)):
        return _as_strings(value)
    if array is None:
        array = np.asarray(value, dtype=dtype)
    return array.reshape(-1)


# -- TreeEnsemble ------------------------------------------------------------------------------

#: TreeEnsemble's integer enums, by value.
_AGGREGATES = ("AVERAGE", "SUM", "MIN", "MAX")
_TRANSFORMS = ("NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT")


class EnsemblePlan:
    """A TreeEnsemble (opset 5) node as a :class:`~nxrt_ep_cpu.ops.ml_tree_walk.Forest`:
    interior nodes first, then one node per leaf holding its one weight."""

    def __init__(
        self,
        *,
        parallel: Any = None,
        aggregate_function: int = 1,
        leaf_targetids: list[int],
        leaf_weights: np.ndarray,
        membership_values: np.ndarray | None = None,
        n_targets: int | None = None,
        nodes_falseleafs: list[int],
        nodes_falsenodeids: list[int],
        nodes_featureids: list[int],
        nodes_hitrates: np.ndarray | None = None,
        nodes_missing_value_tracks_true: list[int] | None = None,
        nodes_modes: np.ndarray,
        nodes_splits: np.ndarray,
        nodes_trueleafs: list[int],
        nodes_truenodeids: list[int],
        post_transform: int = 0,
        tree_roots: list[int],
    ) -> None:
        if aggregate_function not in range(len(_AGGREGATES)):
            raise KernelFailed(f"TreeEnsemble: unknown aggregate_function {aggregate_function}")
        if post_transform not in range(len(_TRANSFORMS)):
            raise KernelFailed(f"TreeEnsemble: unknown post_transform {post_transform}")
        self.aggregate, self.post = _AGGREGATES[aggregate_function], _TRANSFORMS[post_transform]
        self.parallel = parallel
        modes = np.asarray(nodes_modes, dtype=np.int64).reshape(-1)
        n = len(modes)
        columns = [nodes_splits, nodes_featureids, nodes_truenodeids, nodes_falsenodeids]
        columns += [nodes_trueleafs, nodes_falseleafs]
        if any(len(np.asarray(c).reshape(-1)) != n for c in columns):
            raise KernelFailed(
                "TreeEnsemble: the nodes_* attributes must all have one entry per node"
            )
        if ((modes < LEQ) | (modes > MEMBER)).any():
            raise KernelFailed(
                f"TreeEnsemble: unknown node mode {int(modes[(modes < 0) | (modes > MEMBER)][0])}"
            )
        weights = np.asarray(leaf_weights, dtype=np.float64).reshape(-1)
        targets = np.asarray(leaf_targetids, dtype=np.int64)
        if len(targets) != len(weights):
            raise KernelFailed("TreeEnsemble: leaf_targetids and leaf_weights differ in length")
        if n_targets is None:
            n_targets = int(targets.max()) + 1 if len(targets) else 0
        if len(targets) and (targets.min() < 0 or targets.max() >= n_targets):
            raise KernelFailed(f"TreeEnsemble: a leaf target id is outside [0, {n_targets})")
        leaves = len(weights)

        def child(ids: list[int], is_leaf: list[int]) -> np.ndarray:
            ids_ = np.asarray(ids, dtype=np.int64)
            leaf = np.asarray(is_leaf, dtype=bool)
            limit = np.where(leaf, leaves, n)
            if ((ids_ < 0) | (ids_ >= limit)).any():
                raise KernelFailed(
                    "TreeEnsemble: a branch names a node or leaf that does not exist"
                )
            return np.where(leaf, n + ids_, ids_).astype(np.int32)

        true_next, false_next = (
            child(nodes_truenodeids, nodes_trueleafs),
            child(nodes_falsenodeids, nodes_falseleafs),
        )
        roots = np.asarray(tree_roots, dtype=np.int64)
        if len(roots) and ((roots < 0) | (roots >= n)).any():
            raise KernelFailed("TreeEnsemble: a tree root names a node that does not exist")
        # a tree that is one leaf: its root's two branches name the same leaf
        lone = (true_next[roots] == false_next[roots]) & (true_next[roots] >= n)
        roots = np.where(lone, true_next[roots], roots).astype(np.int32)
        tracks = np.zeros(n + leaves, dtype=bool)
        tracks[:n] = np.asarray(nodes_missing_value_tracks_true or [0] * n, dtype=bool)[:n]
        members = _member_table(modes, membership_values)
        self.forest = Forest(
            feature=np.concatenate([np.asarray(nodes_featureids), np.zeros(leaves)]).astype(
                np.int32
            ),
            threshold=np.concatenate(
                [np.asarray(nodes_splits, dtype=np.float64).reshape(-1), np.zeros(leaves)]
            ),
            mode=np.concatenate([modes, np.full(leaves, LEAF)]).astype(np.uint8),
            true_next=np.concatenate([true_next, np.arange(n, n + leaves)]).astype(np.int32),
            false_next=np.concatenate([false_next, np.arange(n, n + leaves)]).astype(np.int32),
            missing_true=tracks,
            weight_start=np.concatenate([np.zeros(n), np.arange(leaves)]).astype(np.int32),
            weight_count=np.concatenate([np.zeros(n), np.ones(leaves)]).astype(np.int32),
            weight_target=targets.astype(np.int32),
            weight_value=weights,
            roots=roots,
            n_targets=int(n_targets),
            members=None
            if members is None
            else np.vstack([members, np.full((leaves, members.shape[1]), np.nan)]),
        )
        check_acyclic(self.forest, "TreeEnsemble")

    def __call__(self, x: np.ndarray, *, compiled: bool = True) -> np.ndarray:
        if x.ndim != 2:
            raise KernelFailed(f"TreeEnsemble: input must be [N, features], not {list(x.shape)}")
        x = self.forest.check_input(x, "TreeEnsemble")
        extremes = self.aggregate in ("MIN", "MAX")
        total, low, high, seen = leaf_scores(
            self.forest, x, parallel=self.parallel, extremes=extremes, compiled=compiled
        )
        if self.aggregate == "SUM":
            out = total
        elif self.aggregate == "AVERAGE":
            out = total / self.forest.n_trees if self.forest.n_trees else total
        elif self.aggregate == "MIN":
            out = np.where(seen, cast(np.ndarray, low), float(np.finfo(x.dtype).max))
        else:  # MAX: with MIN, the aggregates that have extremes
            out = np.where(seen, cast(np.ndarray, high), float(np.finfo(x.dtype).min))
        return transform(out, self.post).astype(x.dtype)


def _ensemble(x: np.ndarray, **attrs: Any) -> np.ndarray:
    return EnsemblePlan(**attrs)(x)


@op("TreeEnsemble", since=5, domain=_ML, factory=prepared(EnsemblePlan))
def tree_ensemble(
    x: np.ndarray,
    /,
    *,
    aggregate_function: int = 1,
    leaf_targetids: list[int],
    leaf_weights: np.ndarray,
    membership_values: np.ndarray | None = None,
    n_targets: int | None = None,
    nodes_falseleafs: list[int],
    nodes_falsenodeids: list[int],
    nodes_featureids: list[int],
    nodes_hitrates: np.ndarray | None = None,
    nodes_missing_value_tracks_true: list[int] | None = None,
    nodes_modes: np.ndarray,
    nodes_splits: np.ndarray,
    nodes_trueleafs: list[int],
    nodes_truenodeids: list[int],
    post_transform: int = 0,
    tree_roots: list[int],
) -> np.ndarray:
    """Sum (or average, min, max) the leaf weights each row of ``x`` reaches in every tree.

    ``x`` is ``[N, F]``; the result is ``[N, n_targets]`` of ``x``'s dtype.
    """
    return _ensemble(x, **{k: v for k, v in locals().items() if k != "x"})


def _member_table(modes: np.ndarray, membership_values) -> np.ndarray | None:
    """One row per node of the set each BRANCH_MEMBER node tests (NaN-padded), or
    ``None`` without such nodes.

    ``membership_values`` lists the sets in node order, each ended by a NaN.
    """
    member_nodes = np.flatnonzero(modes == MEMBER)
    if not len(member_nodes):
        return None
    if membership_values is None:
        raise KernelFailed("TreeEnsemble: BRANCH_MEMBER nodes need membership_values")
    flat = np.asarray(membership_values, dtype=np.float64).reshape(-1)
    ends = np.flatnonzero(np.isnan(flat))
    if len(ends) < len(member_nodes):
        if len(ends) + 1 == len(member_nodes) and (not len(flat) or not np.isnan(flat[-1])):
            ends = np.append(ends, len(flat))  # the last set may go without its NaN
        else:
            raise KernelFailed(
                f"TreeEnsemble: membership_values holds {len(ends)} sets "
                f"for {len(member_nodes)} BRANCH_MEMBER nodes"
            )
    starts = np.concatenate([[0], ends[:-1] + 1])
    width = max(int((ends - starts).max()), 1)
    table = np.full((len(modes), width), np.nan)
    for node, start, end in zip(member_nodes, starts, ends):
        table[node, : end - start] = flat[start:end]
    return table


# -- small ops ---------------------------------------------------------------------------------


@op("Binarizer", since=1, domain=_ML)
def binarizer(x: np.ndarray, /, *, threshold: float = 0.0) -> np.ndarray:
    """1 where ``x > threshold``, else 0, in ``x``'s dtype."""
    return np.greater(x, threshold).astype(x.dtype)


@op("ArrayFeatureExtractor", since=1, domain=_ML)
def array_feature_extractor(x: np.ndarray, indices: np.ndarray, /) -> np.ndarray:
    """The ``indices`` entries of ``x``'s last axis; a 1-D ``x`` gives a ``[1, k]`` result."""
    index = np.asarray(indices, dtype=np.int64).reshape(-1)
    if x.ndim == 0:
        raise KernelFailed("ArrayFeatureExtractor: the input must have at least one dimension")
    last = x.shape[-1]
    if index.size and (index.min() < 0 or index.max() >= last):
        raise KernelFailed(
            f"ArrayFeatureExtractor: indices must lie in [0, {last}), got {index.tolist()}"
        )
    out = x[..., index]
    return out.reshape(1, -1) if x.ndim == 1 else out

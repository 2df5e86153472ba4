"""ai.onnx.ml kernels: LabelEncoder, TreeEnsemble, Binarizer, ArrayFeatureExtractor."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from nxrt.errors import KernelFailed
from nxrt_ep_cpu.ops._registry import op

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

_LEQ, _LT, _GTE, _GT, _EQ, _NEQ, _MEMBER = range(7)


@op("TreeEnsemble", since=5, domain=_ML)
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

    All rows and trees walk down together, one tree level per step. ``x`` is
    ``[N, F]``; the result is ``[N, n_targets]`` of ``x``'s dtype.
    """
    if x.ndim != 2:
        raise KernelFailed(f"TreeEnsemble: input must be [N, features], not {list(x.shape)}")
    modes = np.asarray(nodes_modes, dtype=np.int64).reshape(-1)
    splits = np.asarray(nodes_splits, dtype=np.float64).reshape(-1)
    features = np.asarray(nodes_featureids, dtype=np.int64)
    true_ids = np.asarray(nodes_truenodeids, dtype=np.int64)
    false_ids = np.asarray(nodes_falsenodeids, dtype=np.int64)
    true_leaf = np.asarray(nodes_trueleafs, dtype=bool)
    false_leaf = np.asarray(nodes_falseleafs, dtype=bool)
    n_nodes = len(modes)
    if any(len(a) != n_nodes for a in (splits, features, true_ids, false_ids, true_leaf)):
        raise KernelFailed("TreeEnsemble: the nodes_* attributes must all have one entry per node")
    if n_nodes and (features.min() < 0 or features.max() >= x.shape[1]):
        raise KernelFailed(f"TreeEnsemble: a feature id is outside [0, {x.shape[1]})")
    tracks = (
        np.asarray(nodes_missing_value_tracks_true, dtype=bool)
        if nodes_missing_value_tracks_true
        else np.zeros(n_nodes, dtype=bool)
    )
    weights = np.asarray(leaf_weights, dtype=np.float64).reshape(-1)
    targets = np.asarray(leaf_targetids, dtype=np.int64)
    if n_targets is None:
        n_targets = int(targets.max()) + 1 if len(targets) else 0
    if len(targets) and (targets.min() < 0 or targets.max() >= n_targets):
        raise KernelFailed(f"TreeEnsemble: a leaf target id is outside [0, {n_targets})")
    members = _member_table(modes, membership_values)

    roots = np.asarray(tree_roots, dtype=np.int64)
    n_rows, n_trees = x.shape[0], len(roots)
    rows = np.repeat(np.arange(n_rows), n_trees)
    node = np.tile(roots, n_rows)
    # A tree that is a single leaf: both branches name the same leaf.
    at_leaf = true_leaf[node] & false_leaf[node] & (true_ids[node] == false_ids[node])
    node = np.where(at_leaf, true_ids[node], node)
    values = x.astype(np.float64)
    for _ in range(n_nodes + 1):
        active = np.flatnonzero(~at_leaf)
        if not len(active):
            break
        n = node[active]
        v = values[rows[active], features[n]]
        go_true = _compare(modes[n], v, splits[n], members, n)
        go_true |= tracks[n] & np.isnan(v)
        node[active] = np.where(go_true, true_ids[n], false_ids[n])
        at_leaf[active] = np.where(go_true, true_leaf[n], false_leaf[n])
    else:
        raise KernelFailed("TreeEnsemble: the trees contain a cycle")
    if len(node) and node.max() >= len(weights):
        raise KernelFailed("TreeEnsemble: a branch names a leaf index past leaf_weights")

    leaf_w, leaf_t = weights[node], targets[node]
    if aggregate_function in (0, 1):
        out = np.zeros((n_rows, n_targets), dtype=np.float64)
        np.add.at(out, (rows, leaf_t), leaf_w)
        if aggregate_function == 0 and n_trees:
            out /= n_trees
    elif aggregate_function == 2:
        out = np.full((n_rows, n_targets), float(np.finfo(x.dtype).max))
        np.minimum.at(out, (rows, leaf_t), leaf_w)
    elif aggregate_function == 3:
        out = np.full((n_rows, n_targets), float(np.finfo(x.dtype).min))
        np.maximum.at(out, (rows, leaf_t), leaf_w)
    else:
        raise KernelFailed(f"TreeEnsemble: unknown aggregate_function {aggregate_function}")
    return _post_transform(out, post_transform).astype(x.dtype)


def _member_table(modes: np.ndarray, membership_values) -> np.ndarray:
    """One row per node of the set each BRANCH_MEMBER node tests (NaN-padded).

    ``membership_values`` lists the sets in node order, each ended by a NaN.
    """
    member_nodes = np.flatnonzero(modes == _MEMBER)
    if not len(member_nodes):
        return np.full((len(modes), 0), np.nan)
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


def _compare(
    modes: np.ndarray, v: np.ndarray, splits: np.ndarray, members: np.ndarray, nodes: np.ndarray
) -> np.ndarray:
    result = np.zeros(v.shape, dtype=bool)
    for mode, test in (
        (_LEQ, np.less_equal),
        (_LT, np.less),
        (_GTE, np.greater_equal),
        (_GT, np.greater),
        (_EQ, np.equal),
        (_NEQ, np.not_equal),
    ):
        sel = modes == mode
        if sel.any():
            result[sel] = test(v[sel], splits[sel])
    sel = modes == _MEMBER
    if sel.any():
        result[sel] = np.any(members[nodes[sel]] == v[sel, None], axis=1)
    unknown = (modes < _LEQ) | (modes > _MEMBER)
    if unknown.any():
        raise KernelFailed(f"TreeEnsemble: unknown node mode {int(modes[unknown][0])}")
    return result


def _post_transform(scores: np.ndarray, transform: int) -> np.ndarray:
    if transform == 0:  # NONE
        return scores
    if transform in (1, 3):  # SOFTMAX, SOFTMAX_ZERO
        if transform == 3:
            nonzero = scores != 0
            shifted = scores - np.max(np.where(nonzero, scores, -np.inf), axis=1, keepdims=True)
            e = np.where(nonzero, np.exp(np.where(nonzero, shifted, 0)), 0)
        else:
            e = np.exp(scores - scores.max(axis=1, keepdims=True))
        total = e.sum(axis=1, keepdims=True)
        return np.divide(e, total, out=np.zeros_like(e), where=total != 0)
    if transform == 2:  # LOGISTIC
        return 1 / (1 + np.exp(-scores))
    if transform == 4:  # PROBIT
        erfinv = np.vectorize(_erfinv, otypes=[np.float64])
        return math.sqrt(2) * erfinv(2 * scores - 1)
    raise KernelFailed(f"TreeEnsemble: unknown post_transform {transform}")


def _erfinv(y: float) -> float:
    """Inverse error function by Newton steps from a closed-form start."""
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

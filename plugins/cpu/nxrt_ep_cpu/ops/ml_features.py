"""ai.onnx.ml feature transforms: Scaler, Normalizer, Imputer, OneHotEncoder,
CategoryMapper and FeatureVectorizer.

Each works on whole arrays; lookups of categories go through a sorted copy
of the categories and ``searchsorted``, so strings are matched in numpy too.
"""

from __future__ import annotations

import numpy as np

from nxrt.errors import KernelFailed
from nxrt_ep_cpu.ops._registry import op
from nxrt_ep_cpu.ops.ml_scores import text

_ML = "ai.onnx.ml"


def _strings(values) -> np.ndarray:
    """Strings (``str`` or ``bytes``) as a numpy unicode array, which sorts and compares in C."""
    flat = np.asarray(values, dtype=object).reshape(-1)
    return np.array([text(v) for v in flat.tolist()], dtype=str).reshape(np.shape(values))


def index_of(values: np.ndarray, categories: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each value, the position of an equal category (the last one when categories
    repeat) and whether there is one; ``values`` and ``categories`` of one kind."""
    if not len(categories):
        return np.zeros(values.shape, dtype=np.int64), np.zeros(values.shape, dtype=bool)
    order = np.argsort(categories, kind="stable")
    ordered = categories[order]
    pos = np.searchsorted(ordered, values, side="right") - 1
    pos = np.clip(pos, 0, len(ordered) - 1)
    found = ordered[pos] == values
    return order[pos], np.asarray(found, dtype=bool)


def _float_rows(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


@op("Scaler", since=1, domain=_ML)
def scaler(
    x: np.ndarray, /, *, offset: list[float] | None = None, scale: list[float] | None = None
) -> np.ndarray:
    """``(x - offset) * scale`` in float32; one value, or one per feature (last axis)."""
    values = _float_rows(x)
    features = values.shape[-1] if values.ndim else 1
    offsets = np.asarray(offset if offset else [0.0], dtype=np.float32)
    scales = np.asarray(scale if scale else [1.0], dtype=np.float32)
    for name, arr in (("offset", offsets), ("scale", scales)):
        if arr.size not in (1, features):
            raise KernelFailed(f"Scaler: {name} has {arr.size} values for {features} features")
    return (values - offsets) * scales


@op("Normalizer", since=1, domain=_ML)
def normalizer(x: np.ndarray, /, *, norm: str = "MAX") -> np.ndarray:
    """Each row divided by its max, L1 or L2 norm (rows whose norm is 0 stay as they are)."""
    kind = text(norm)
    if x.ndim > 2:
        raise KernelFailed(f"Normalizer: the input must be 1-D or 2-D, not {x.ndim}-D")
    values = _float_rows(x)
    rows = values.reshape(1, -1) if values.ndim == 1 else values
    if kind == "MAX":
        scale = rows.max(axis=1, keepdims=True) if rows.shape[1] else np.zeros((len(rows), 1))
        out = np.divide(rows, scale, out=rows.copy(), where=scale != 0)
    elif kind == "L1":
        total = np.abs(rows).sum(axis=1, keepdims=True)
        out = np.divide(rows, total, out=rows.copy(), where=total != 0)
    elif kind == "L2":
        squares = (np.asarray(x) * np.asarray(x)).astype(np.float32).reshape(rows.shape)
        total = squares.sum(axis=1, keepdims=True)
        magnitude = np.sqrt(np.divide(squares, total, out=squares.copy(), where=total != 0))
        out = np.where(total != 0, np.where(rows < 0, -magnitude, magnitude), rows)
    else:
        raise KernelFailed(f"Normalizer: unknown norm {kind!r}; expected MAX, L1 or L2")
    return out.astype(np.float32).reshape(values.shape)


@op("Imputer", since=1, domain=_ML)
def imputer(
    x: np.ndarray,
    /,
    *,
    imputed_value_floats: list[float] | None = None,
    imputed_value_int64s: list[int] | None = None,
    replaced_value_float: float = 0.0,
    replaced_value_int64: int = 0,
) -> np.ndarray:
    """Values equal to the replaced value (NaN matches NaN) become the imputed value of
    their feature (or the single imputed value); the dtype stays ``x``'s."""
    if x.ndim == 0:
        raise KernelFailed("Imputer: the input needs at least one dimension")
    floating = x.dtype.kind == "f"
    imputed = imputed_value_floats if floating else imputed_value_int64s
    if not imputed:
        name = "imputed_value_floats" if floating else "imputed_value_int64s"
        raise KernelFailed(f"Imputer: a {x.dtype} input needs {name}")
    replaced = replaced_value_float if floating else replaced_value_int64
    fill = np.asarray(imputed, dtype=x.dtype)
    stride = x.shape[-1] if x.ndim == 1 else int(np.prod(x.shape[1:]))
    rows = x.reshape(-1, stride) if x.size else x.reshape(0, max(stride, 1))
    fill = fill if fill.size == stride else np.full(stride, fill[0], dtype=x.dtype)
    if floating and np.isnan(replaced):
        hit = np.isnan(rows)
    else:
        hit = rows == np.asarray(replaced).astype(x.dtype)
    return np.where(hit, fill, rows).astype(x.dtype).reshape(x.shape)


@op("OneHotEncoder", since=1, domain=_ML)
def one_hot_encoder(
    x: np.ndarray,
    /,
    *,
    cats_int64s: list[int] | None = None,
    cats_strings: list[str] | None = None,
    zeros: int = 1,
) -> np.ndarray:
    """``x``'s shape plus one axis of categories: 1.0 at each value's category.

    Numeric inputs are truncated to int64 and matched against ``cats_int64s``.
    An unknown value gives a row of zeros, or an error when ``zeros`` is 0.
    """
    if cats_strings:
        categories = _strings(cats_strings)
        if x.dtype.kind not in "OSU":
            raise KernelFailed(f"OneHotEncoder: string categories for a {x.dtype} input")
        values = _strings(x)
    elif cats_int64s:
        categories = np.asarray(cats_int64s, dtype=np.int64)
        if x.dtype.kind in "OSU":
            raise KernelFailed("OneHotEncoder: integer categories for a string input")
        values = x.astype(np.int64)
    else:
        raise KernelFailed("OneHotEncoder: set cats_int64s or cats_strings")
    index, found = index_of(values, categories)
    if not zeros and not found.all():
        raise KernelFailed("OneHotEncoder: a value is not among the categories and zeros is 0")
    out = np.zeros((*x.shape, len(categories)), dtype=np.float32)
    flat = out.reshape(-1, len(categories))
    hits = np.flatnonzero(found.reshape(-1))
    flat[hits, index.reshape(-1)[hits]] = 1.0
    return out


@op("CategoryMapper", since=1, domain=_ML)
def category_mapper(
    x: np.ndarray,
    /,
    *,
    cats_int64s: list[int] | None = None,
    cats_strings: list[str] | None = None,
    default_int64: int = -1,
    default_string: str = "_Unused",
) -> np.ndarray:
    """Strings to the int64 paired with them in ``cats_*``, or int64s to their strings."""
    ints = np.asarray(cats_int64s or [], dtype=np.int64)
    strings = _strings(cats_strings or [])
    if len(ints) != len(strings):
        raise KernelFailed(
            f"CategoryMapper: {len(strings)} cats_strings but {len(ints)} cats_int64s; "
            "they must pair up"
        )
    if x.dtype.kind in "OSU":
        index, found = index_of(_strings(x), strings)
        looked_up = ints[index] if len(ints) else np.zeros(x.shape, dtype=np.int64)
        return np.where(found, looked_up, np.int64(default_int64)).astype(np.int64)
    index, found = index_of(x.astype(np.int64), ints)
    names = strings.astype(object)
    looked_up = names[index] if len(names) else np.full(x.shape, "", dtype=object)
    out = np.where(found, looked_up, text(default_string))
    return out.astype(object)


@op("FeatureVectorizer", since=1, domain=_ML)
def feature_vectorizer(*inputs: np.ndarray, inputdimensions: list[int] | None = None) -> np.ndarray:
    """The inputs side by side, ``[N, sum(inputdimensions)]`` float32: each input's row
    cut or zero-padded to its dimension."""
    dims = [int(d) for d in inputdimensions or []]
    if len(dims) != len(inputs):
        raise KernelFailed(
            f"FeatureVectorizer: {len(inputs)} inputs but {len(dims)} inputdimensions values"
        )
    if not inputs:
        raise KernelFailed("FeatureVectorizer: needs at least one input")
    first = inputs[0]
    n = 1 if first.ndim <= 1 else first.shape[0]
    out = np.zeros((n, sum(dims)), dtype=np.float32)
    start = 0
    for array, width in zip(inputs, dims):
        rows = array.reshape(1, -1) if array.ndim <= 1 else array.reshape(array.shape[0], -1)
        if rows.shape[0] != n:
            raise KernelFailed(
                f"FeatureVectorizer: inputs have {rows.shape[0]} and {n} rows; they must agree"
            )
        take = min(rows.shape[1], width)
        out[:, start : start + take] = rows[:, :take]
        start += width
    return out

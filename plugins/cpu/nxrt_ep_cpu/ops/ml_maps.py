"""ai.onnx.ml ops on maps: ZipMap, DictVectorizer and CastMap.

A map is a Python ``dict`` and a sequence of maps a ``list`` of dicts, the
form ONNX Runtime takes and returns (see :mod:`nxrt.pipeline.values`). ZipMap builds
one dict per row, the output's very form; the other two read one map.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import numpy as np

from nxrt.errors import KernelFailed
from nxrt.pipeline.values import MapType
from nxrt_ep_cpu.kernels import CpuKernel
from nxrt_ep_cpu.ops._registry import op
from nxrt_ep_cpu.ops.ml_scores import text

if TYPE_CHECKING:
    import onnx_ir as ir

_ML = "ai.onnx.ml"


@op("ZipMap", since=1, domain=_ML)
def zip_map(
    x: np.ndarray,
    /,
    *,
    classlabels_int64s: list[int] | None = None,
    classlabels_strings: list[str] | None = None,
) -> list[dict]:
    """One ``{label: score}`` dict per row of ``x`` (``[N, C]``, or ``[C]`` for one row)."""
    if bool(classlabels_strings) == bool(classlabels_int64s):
        raise KernelFailed("ZipMap: set exactly one of classlabels_int64s and classlabels_strings")
    keys: list[Any] = (
        [text(s) for s in classlabels_strings]
        if classlabels_strings
        else [int(k) for k in cast("list[int]", classlabels_int64s)]  # exactly one is set
    )
    if x.ndim not in (1, 2):
        raise KernelFailed(f"ZipMap: the input must be 1-D or 2-D, not {x.ndim}-D")
    rows = np.asarray(x, dtype=np.float32).reshape(-1, x.shape[-1])
    if rows.shape[1] != len(keys):
        raise KernelFailed(f"ZipMap: {rows.shape[1]} scores per row but {len(keys)} class labels")
    order = sorted(range(len(keys)), key=lambda i: keys[i])  # ORT's maps iterate by key
    keys = [keys[i] for i in order]
    return [dict(zip(keys, row)) for row in rows[:, order].tolist()]


def _python_dtype(value: Any) -> np.dtype:
    if isinstance(value, str):
        return np.dtype(object)
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return np.dtype(np.int64)
    return np.dtype(np.float32)


@op("DictVectorizer", since=1, domain=_ML, factory=lambda ep, node: _dict_vectorizer_kernel(node))
def dict_vectorizer(
    x: dict,
    /,
    *,
    int64_vocabulary: list[int] | None = None,
    string_vocabulary: list[str] | None = None,
    _dtype: np.dtype | None = None,
) -> np.ndarray:
    """``[1, V]``: the map's value for each vocabulary entry, 0 where the map lacks it.

    The output's dtype is the map's value type (the model's, given by the
    kernel's factory as ``_dtype``; otherwise read from the values).
    """
    if not isinstance(x, dict):
        raise KernelFailed(
            f"DictVectorizer: the input must be a map (dict), not {type(x).__name__}"
        )
    vocabulary: list[Any] = (
        [text(s) for s in string_vocabulary]
        if string_vocabulary
        else [int(v) for v in int64_vocabulary or []]
    )
    if _dtype is None:
        _dtype = _python_dtype(next(iter(x.values()))) if x else np.dtype(np.float32)
    missing: Any = "" if np.dtype(_dtype).kind == "O" else 0
    values = [x.get(key, missing) for key in vocabulary]
    return np.array(values, dtype=_dtype).reshape(1, len(vocabulary))


def _dict_vectorizer_kernel(node: ir.Node) -> CpuKernel:
    """The kernel with the output dtype taken from the input's declared map type."""
    from nxrt.kernel import attribute_values

    attrs = attribute_values(node)
    declared = node.inputs[0].type if node.inputs and node.inputs[0] is not None else None
    if isinstance(declared, MapType):
        from nxrt.pipeline.model import numpy_dtype

        attrs["_dtype"] = numpy_dtype(int(declared.value_type.dtype))
    return CpuKernel(dict_vectorizer, attrs)


_CASTS = ("TO_FLOAT", "TO_STRING", "TO_INT64")


@op("CastMap", since=1, domain=_ML)
def cast_map(
    x: dict,
    /,
    *,
    cast_to: str = "TO_FLOAT",
    map_form: str = "DENSE",
    max_map: int = 1,
) -> np.ndarray:
    """A ``map(int64, string | float)`` as a ``[1, n]`` tensor, values in key order.

    DENSE: one column per entry. SPARSE: ``max_map`` columns, the value of key
    ``k`` in column ``k`` and the rest padded (0, or ``"0.f"`` for strings, as
    ONNX Runtime pads them).
    """
    if not isinstance(x, dict):
        raise KernelFailed(f"CastMap: the input must be a map (dict), not {type(x).__name__}")
    target, form = text(cast_to), text(map_form)
    if target not in _CASTS:
        raise KernelFailed(f"CastMap: unknown cast_to {target!r}; expected one of {_CASTS}")
    keys = sorted(x)
    if form == "DENSE":
        items = [x[k] for k in keys]
        width = len(items)
        index = list(range(width))
    elif form == "SPARSE":
        if keys and keys[0] < 0:
            raise KernelFailed(f"CastMap: SPARSE maps need keys >= 0, not {keys[0]}")
        width = int(max_map)
        kept = [k for k in keys if k < width]
        items = [x[k] for k in kept]
        index = kept
    else:
        raise KernelFailed(f"CastMap: unknown map_form {form!r}; expected DENSE or SPARSE")
    if target == "TO_STRING":
        out = np.full((1, width), "0.f", dtype=object)
        for i, v in zip(index, items):
            out[0, i] = v if isinstance(v, str) else f"{v:f}"
        return out
    dtype = np.float32 if target == "TO_FLOAT" else np.int64
    out = np.zeros((1, width), dtype=dtype)
    for i, v in zip(index, items):
        out[0, i] = float(v) if target == "TO_FLOAT" else int(float(v))
    return out

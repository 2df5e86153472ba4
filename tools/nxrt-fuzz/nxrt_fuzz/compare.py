"""How two runs' outputs are compared: exact for integers, per-dtype tolerances for floats.

NaN must sit at the same positions and infinities must match in sign: a
kernel that turns a NaN into a number (or the reverse) is a wrong result,
not a rounding difference. The float tolerances are relative to each
element plus an absolute part scaled by the output's largest finite
magnitude, so that a sum whose terms cancel is judged against the size of
what it summed rather than against a result near zero. float16 is looser:
onnxruntime computes many float16 ops in float32 and rounds once, while a
float16 kernel may round at every step.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: ``dtype: (rtol, atol)``; atol is scaled by ``1 + max |finite expected|``.
TOLERANCES: dict[np.dtype, tuple[float, float]] = {
    np.dtype(np.float16): (1e-2, 4e-3),
    np.dtype(np.float32): (1e-4, 1e-5),
    # float64 within float32's reach: onnxruntime computes many double ops through float
    # (windows, the float32 stash_type of the normalizations), as the spec sometimes asks
    np.dtype(np.float64): (1e-6, 1e-7),
}


def mismatch(got: Any, expected: Any, *, loose: float = 1.0) -> str:
    """Why ``got`` differs from ``expected`` ('' when it does not): shape, dtype or values.

    ``loose`` multiplies the float tolerances (the chained graph allows more
    than one node).
    """
    if isinstance(expected, (list, tuple)):
        if not isinstance(got, (list, tuple)) or len(got) != len(expected):
            return f"a sequence of {len(expected)} expected, got {_kind(got)}"
        for i, (g, e) in enumerate(zip(got, expected)):
            why = mismatch(g, e, loose=loose)
            if why:
                return f"sequence item {i}: {why}"
        return ""
    if expected is None or got is None:
        return (
            ""
            if got is None and expected is None
            else f"got {_kind(got)}, expected {_kind(expected)}"
        )
    got, expected = np.asarray(got), np.asarray(expected)
    if got.shape != expected.shape:
        return f"shape {list(got.shape)}, expected {list(expected.shape)}"
    if got.dtype != expected.dtype:
        return f"dtype {got.dtype}, expected {expected.dtype}"
    if expected.dtype.kind not in "fc":
        if expected.dtype.kind in "OUS":
            same = np.array(got.tolist(), dtype=object) == np.array(expected.tolist(), dtype=object)
        else:
            same = got == expected
        if np.all(same):
            return ""
        return _first_difference(got, expected, ~np.asarray(same))
    return _float_mismatch(got, expected, loose)


def _float_mismatch(got: np.ndarray, expected: np.ndarray, loose: float) -> str:
    rtol, atol = TOLERANCES.get(expected.dtype, TOLERANCES[np.dtype(np.float32)])
    g, e = got.astype(np.float64), expected.astype(np.float64)
    g_nan, e_nan = np.isnan(g), np.isnan(e)
    if np.any(g_nan != e_nan):
        return _first_difference(got, expected, g_nan != e_nan, "NaN positions differ: ")
    finite = np.isfinite(e) & np.isfinite(g)
    special = ~finite & ~e_nan
    if np.any(special & (g != e)):
        return _first_difference(got, expected, special & (g != e), "infinities differ: ")
    if not np.any(finite):
        return ""
    scale = 1.0 + float(np.max(np.abs(e[finite])))
    with np.errstate(invalid="ignore", over="ignore"):
        bad = finite & (np.abs(g - e) > loose * (atol * scale + rtol * np.abs(e)))
    if np.any(bad):
        return _first_difference(got, expected, bad)
    return ""


def _first_difference(
    got: np.ndarray, expected: np.ndarray, bad: np.ndarray, prefix: str = ""
) -> str:
    where = tuple(int(i) for i in np.argwhere(bad)[0])
    count = int(np.count_nonzero(bad))
    at = f"at {list(where)}: {got[where]!r} vs {expected[where]!r}"
    return f"{prefix}{count} of {bad.size} differ; {at}"


def _kind(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, (list, tuple)):
        return f"a sequence of {len(value)}"
    return f"an array {getattr(value, 'dtype', type(value).__name__)}"

"""Cast, CastLike and BitCast across every ONNX type (float8 and int4 through ml_dtypes).

Rounding is to nearest even (numpy and ml_dtypes); float8 targets saturate at
their largest finite value unless ``saturate=0``; float8e8m0 follows
``round_mode``. Strings are object arrays of ``str``.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
from onnx import TensorProto, helper

from nxrt.errors import KernelFailed
from nxrt_ep_cpu.ops._registry import op

_FLOAT8 = frozenset(
    np.dtype(t)
    for t in (
        ml_dtypes.float8_e4m3fn,
        ml_dtypes.float8_e4m3fnuz,
        ml_dtypes.float8_e5m2,
        ml_dtypes.float8_e5m2fnuz,
    )
)
_E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)


def _np_dtype(to: int) -> np.dtype:
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(to))
    except (KeyError, ValueError, TypeError) as exc:
        raise KernelFailed(f"Cast: 'to' = {to} is not a known ONNX tensor type") from exc


def _is_string(x: np.ndarray) -> bool:
    return x.dtype.kind in "OSU"


def _to_strings(x: np.ndarray) -> np.ndarray:
    """Numbers in plain notation (numpy's shortest round-trip form) as an object array."""
    if x.dtype.kind == "V":  # ml_dtypes types print through float32
        x = x.astype(np.float32)
    return x.astype(np.str_).astype(object)


def _from_strings(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Parse decimal or scientific strings; "INF", "+INF", "-INF", "NaN" in any case."""
    text = np.array(
        [s.decode() if isinstance(s, bytes) else str(s) for s in x.ravel()], dtype=np.str_
    ).reshape(x.shape)
    if dtype == np.bool_:
        return np.asarray(text.astype(np.float64) != 0)
    if dtype.kind in "iu":
        try:
            return text.astype(dtype)
        except ValueError:  # "100.5" to an integer: parse as a float and truncate
            return text.astype(np.float64).astype(dtype)
    try:
        return text.astype(np.float64)
    except ValueError as exc:
        raise KernelFailed(f"Cast: cannot parse a string as a number: {exc}") from exc


def _to_e8m0(x: np.ndarray, saturate: bool, round_mode: str) -> np.ndarray:
    """float8e8m0 (a bare power-of-two exponent) from the float32 exponent bits.

    ``up`` rounds any nonzero mantissa up, ``down`` truncates, ``nearest`` rounds
    on the guard bit; NaN and infinity map to the NaN code 0xFF; with
    ``saturate`` no finite value rounds past the largest exponent.
    """
    bits = np.asarray(x, dtype=np.float32).view(np.uint32)
    exponent = ((bits >> 23) & 0xFF).astype(np.uint16)
    special = exponent == 0xFF
    if round_mode == "up":
        round_up = ((bits & 0x7FFFFF) > 0) & ~special
    elif round_mode == "nearest":
        guard = (bits & 0x400000) > 0
        rest = (bits & 0x3FFFFF) > 0
        round_up = guard & (rest | (exponent > 0)) & ~special
    elif round_mode == "down":
        round_up = np.zeros(exponent.shape, dtype=bool)
    else:
        raise KernelFailed(f"Cast: round_mode must be 'up', 'down' or 'nearest': {round_mode!r}")
    if saturate:
        round_up &= exponent != 0xFE
    exponent = exponent + round_up
    out = np.where(special, 0xFF, exponent).astype(np.uint8)
    return out.view(_E8M0)


def cast_array(x: np.ndarray, dtype: np.dtype, saturate: int = 1, round_mode: str = "up"):
    """``x`` converted to ``dtype`` (a numpy dtype; ``object`` for ONNX strings)."""
    dtype = np.dtype(dtype)
    if dtype.kind in "OSU":
        return _to_strings(x)
    if _is_string(x):
        x = _from_strings(x, dtype)
    if x.dtype == dtype:
        return x.copy()
    if dtype == _E8M0:
        return _to_e8m0(x, bool(saturate), round_mode)
    if x.dtype.kind == "V" and dtype.kind == "V":
        x = x.astype(np.float32)  # between ml_dtypes types: float32 holds every value
    if dtype in _FLOAT8 and saturate and x.dtype.kind in "fiuV":
        info = ml_dtypes.finfo(dtype)
        work = x if x.dtype.kind == "f" else x.astype(np.float32)
        return np.asarray(np.clip(work, float(info.min), float(info.max))).astype(dtype)
    if dtype == np.bool_ and x.dtype.kind == "V":
        return np.asarray(x.astype(np.float32) != 0)
    with np.errstate(all="ignore"):
        return x.astype(dtype)


@op("Cast", since=(6, 9, 13))
def cast_6(x: np.ndarray, /, *, to: int) -> np.ndarray:
    return cast_array(x, _np_dtype(to))


@op("Cast", since=(19, 21, 23))
def cast_19(x: np.ndarray, /, *, saturate: int = 1, to: int) -> np.ndarray:
    return cast_array(x, _np_dtype(to), saturate)


@op("Cast", since=(24, 25, 28))
def cast(x: np.ndarray, /, *, round_mode: str = "up", saturate: int = 1, to: int) -> np.ndarray:
    return cast_array(x, _np_dtype(to), saturate, round_mode)


@op("CastLike", since=15)
def cast_like_15(x: np.ndarray, target_type: np.ndarray, /) -> np.ndarray:
    return cast_array(x, target_type.dtype)


@op("CastLike", since=(19, 21, 23))
def cast_like_19(x: np.ndarray, target_type: np.ndarray, /, *, saturate: int = 1) -> np.ndarray:
    return cast_array(x, target_type.dtype, saturate)


@op("CastLike", since=(24, 25))
def cast_like(
    x: np.ndarray, target_type: np.ndarray, /, *, round_mode: str = "up", saturate: int = 1
) -> np.ndarray:
    return cast_array(x, target_type.dtype, saturate, round_mode)


def _bits(dtype: np.dtype) -> int:
    """The width of one element in bits (4-bit and 2-bit ml_dtypes types use a byte each)."""
    if dtype.kind == "V":
        try:
            return ml_dtypes.iinfo(dtype).bits
        except ValueError:
            return ml_dtypes.finfo(dtype).bits
    return dtype.itemsize * 8


@op("BitCast", since=26)
def bit_cast(x: np.ndarray, /, *, to: int) -> np.ndarray:
    """Reinterpret the bits of each element as another type of the same width."""
    if to == TensorProto.STRING or _is_string(x):
        raise KernelFailed("BitCast does not apply to strings; use Cast")
    dtype = _np_dtype(to)
    if _bits(x.dtype) != _bits(dtype):
        raise KernelFailed(
            f"BitCast needs types of one width: {x.dtype} has {_bits(x.dtype)} bits, "
            f"{dtype} has {_bits(dtype)}"
        )
    return x.copy(order="C").view(dtype)

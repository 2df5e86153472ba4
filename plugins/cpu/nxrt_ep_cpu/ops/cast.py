"""Cast, CastLike and BitCast across every ONNX type (float8 and int4 through ml_dtypes).

Rounding is to nearest even (numpy and ml_dtypes); float8 targets saturate at
their largest finite value unless ``saturate=0``; float8e8m0 follows
``round_mode``. Strings are object arrays of ``str``, written and read as ONNX Runtime
does (C's ``%.8g``; C++'s ``stod`` and ``stoll``).
"""

from __future__ import annotations

import math
import re

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
    """Numbers as ONNX Runtime writes them: floats with C's ``%.8g`` (float16 and the
    ml_dtypes types through float32), ``NaN``, ``INF`` and ``-INF``; bools as 1 and 0."""
    if x.dtype.kind == "V":  # ml_dtypes types print through float32
        x = x.astype(np.float32)
    if x.dtype.kind == "f":
        items = [_float_text(v) for v in x.reshape(-1).tolist()]
    elif x.dtype.kind == "b":
        items = ["1" if v else "0" for v in x.reshape(-1).tolist()]
    elif x.dtype.kind in "OSU":
        items = [s.decode() if isinstance(s, bytes) else str(s) for s in x.reshape(-1).tolist()]
    else:
        items = [str(v) for v in x.reshape(-1).tolist()]
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out.reshape(x.shape)


def _float_text(v: float) -> str:
    if v != v:
        return "NaN"
    if v in (math.inf, -math.inf):
        return "INF" if v > 0 else "-INF"
    return format(v, ".8g")  # C's %.8g


#: What C's strtod and strtoll read from the start of a string (the rest is ignored).
_FLOAT_PREFIX = re.compile(
    r"\s*([+-]?(?:inf(?:inity)?|nan(?:\([0-9a-z_]*\))?"
    r"|0x(?:[0-9a-f]+\.?[0-9a-f]*|\.[0-9a-f]+)(?:p[+-]?\d+)?"
    r"|(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?))",
    re.IGNORECASE,
)
_INT_PREFIX = re.compile(r"\s*([+-]?\d+)")


def _c_float(text: str) -> float:
    """One number as strtod reads it: NaN with a payload, hexadecimal (0x1p3) too."""
    low = text.lower()
    if "nan" in low:
        return math.nan
    if "0x" in low:
        sign = -1.0 if low.startswith("-") else 1.0
        body = low.lstrip("+-")
        return sign * float.fromhex(body if "p" in body else body + "p0")
    return float(text)


def _from_strings(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Parse strings as ONNX Runtime does, with C++'s ``stod`` (floats) and ``stoll`` /
    ``stoull`` (integers and bool): the longest number at the start counts, the rest is
    ignored ("1.5" is 1 as an integer), a negative number wraps into an unsigned type,
    and a string without a number is refused."""
    texts = [s.decode() if isinstance(s, bytes) else str(s) for s in x.reshape(-1).tolist()]
    floating = dtype.kind not in "iub"
    pattern = _FLOAT_PREFIX if floating else _INT_PREFIX
    numbers = []
    for text in texts:
        found = pattern.match(text)
        if found is None:
            what = "a number" if floating else "an integer"
            raise KernelFailed(f"Cast: the string {text!r} does not start with {what}")
        numbers.append(found.group(1))
    if floating:
        values = [_c_float(n) for n in numbers]
        return np.array(values, dtype=np.float64).reshape(x.shape)
    values = [int(n) for n in numbers]
    if dtype == np.bool_:
        return np.array([v != 0 for v in values], dtype=bool).reshape(x.shape)
    info = np.iinfo(dtype)
    bits = info.bits
    limit = (-(2**63), 2**63 - 1) if info.min < 0 else (-(2**64) + 1, 2**64 - 1)
    for v in values:
        if not limit[0] <= v <= limit[1]:
            raise KernelFailed(f"Cast: {v} is out of the range C++ reads into {dtype}")
    wrapped = [v % (1 << bits) for v in values]  # the C++ cast keeps the low bits
    if info.min < 0:
        wrapped = [v - (1 << bits) if v > info.max else v for v in wrapped]
    return np.array(wrapped, dtype=dtype).reshape(x.shape)


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

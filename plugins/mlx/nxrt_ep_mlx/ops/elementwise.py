"""Element-wise arithmetic, activations, comparisons and logic.

MLX broadcasts like numpy (ONNX's multidirectional broadcasting). Scalars are
written as Python numbers, which MLX treats as weakly typed: an ``mx.array``
scalar would promote float16/bfloat16 inputs to float32.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import reduce
from typing import TYPE_CHECKING, Any

from nxrt_ep_mlx._backend import mx
from nxrt_ep_mlx._convert import mx_dtype
from nxrt_ep_mlx.ops._registry import BOOLS, FLOATS, INDICES, op

if TYPE_CHECKING:
    import onnx_ir as ir

_FLOAT_MAX = 3.4028234663852886e38


@op("Add", since=(7, 13, 14))
def add(a: mx.array, b: mx.array, /) -> mx.array:
    return a + b


@op("Sub", since=(7, 13, 14))
def sub(a: mx.array, b: mx.array, /) -> mx.array:
    return a - b


@op("Mul", since=(7, 13, 14))
def mul(a: mx.array, b: mx.array, /) -> mx.array:
    return a * b


@op("Div", since=(7, 13, 14))
def div(a: mx.array, b: mx.array, /) -> mx.array:
    return a / b


@op("Pow", since=(7, 12, 13, 15))
def pow_(x: mx.array, y: mx.array, /) -> mx.array:
    """The result has the base's type even when the exponent's differs."""
    return mx.power(x, y).astype(x.dtype)


@op("Sqrt", since=(6, 13))
def sqrt(x: mx.array, /) -> mx.array:
    return mx.sqrt(x)


@op("Exp", since=(6, 13))
def exp(x: mx.array, /) -> mx.array:
    return mx.exp(x)


@op("Log", since=(6, 13))
def log(x: mx.array, /) -> mx.array:
    return mx.log(x)


@op("Neg", since=(6, 13))
def neg(x: mx.array, /) -> mx.array:
    return -x


@op("Abs", since=(6, 13))
def abs_(x: mx.array, /) -> mx.array:
    return mx.abs(x)


@op("Relu", since=(6, 13, 14))
def relu(x: mx.array, /) -> mx.array:
    return mx.maximum(x, 0.0)


@op("LeakyRelu", since=(6, 16))
def leaky_relu(x: mx.array, /, *, alpha: float = 0.01) -> mx.array:
    return mx.where(x >= 0, x, x * alpha)


@op("Sigmoid", since=(6, 13))
def sigmoid(x: mx.array, /) -> mx.array:
    return mx.sigmoid(x)


@op("Tanh", since=(6, 13))
def tanh(x: mx.array, /) -> mx.array:
    return mx.tanh(x)


@op("Erf", since=(9, 13))
def erf(x: mx.array, /) -> mx.array:
    return mx.erf(x)


def _check_gelu(node: ir.Node, attrs: Mapping[str, Any]) -> str:
    approximate = attrs.get("approximate", "none")
    return "" if approximate in ("none", "tanh") else f"approximate={approximate!r}"


@op("Gelu", since=20, check=_check_gelu)
def gelu(x: mx.array, /, *, approximate: str = "none") -> mx.array:
    if approximate == "tanh":
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)
        return 0.5 * x * (1.0 + mx.tanh(inner))
    return 0.5 * x * (1.0 + mx.erf(x * (1.0 / math.sqrt(2.0))))


@op("Clip", since=6)
def clip_6(x: mx.array, /, *, min: float = -_FLOAT_MAX, max: float = _FLOAT_MAX) -> mx.array:
    return mx.minimum(mx.maximum(x, min), max)


@op("Clip", since=(11, 12, 13))
def clip(x: mx.array, min: mx.array | None = None, max: mx.array | None = None, /) -> mx.array:
    """Bounds are optional inputs from opset 11; an absent one does not clip."""
    if min is not None:
        x = mx.maximum(x, min)
    if max is not None:
        x = mx.minimum(x, max)
    return x


@op("Max", since=(6, 8, 12, 13))
def max_(*data: mx.array) -> mx.array:
    return reduce(mx.maximum, data)


@op("Min", since=(6, 8, 12, 13))
def min_(*data: mx.array) -> mx.array:
    return reduce(mx.minimum, data)


@op("Sum", since=(6, 8, 13))
def sum_(*data: mx.array) -> mx.array:
    return reduce(lambda a, b: a + b, data)


@op("Mean", since=(6, 8, 13))
def mean(*data: mx.array) -> mx.array:
    return reduce(lambda a, b: a + b, data) / len(data)


@op("Equal", since=(7, 11, 13, 19), output_types=BOOLS)
def equal(a: mx.array, b: mx.array, /) -> mx.array:
    return a == b


@op("Less", since=(7, 9, 13), output_types=BOOLS)
def less(a: mx.array, b: mx.array, /) -> mx.array:
    return a < b


@op("Greater", since=(7, 9, 13), output_types=BOOLS)
def greater(a: mx.array, b: mx.array, /) -> mx.array:
    return a > b


@op("Not", since=1, input_types={0: BOOLS}, output_types=BOOLS)
def not_(x: mx.array, /) -> mx.array:
    return mx.logical_not(x)


@op("And", since=7, input_types={0: BOOLS, 1: BOOLS}, output_types=BOOLS)
def and_(a: mx.array, b: mx.array, /) -> mx.array:
    return mx.logical_and(a, b)


@op("Or", since=7, input_types={0: BOOLS, 1: BOOLS}, output_types=BOOLS)
def or_(a: mx.array, b: mx.array, /) -> mx.array:
    return mx.logical_or(a, b)


@op("Where", since=(9, 16), input_types={0: BOOLS})
def where(condition: mx.array, x: mx.array, y: mx.array, /) -> mx.array:
    return mx.where(condition, x, y)


_CASTABLE = FLOATS | BOOLS | INDICES


def _check_cast(node: ir.Node, attrs: Mapping[str, Any]) -> str:
    """Casts between float types, and from booleans or indices to floats (masks)."""
    to = attrs.get("to")
    if to not in FLOATS | BOOLS:
        return f"casts to element type {to}"
    if attrs.get("saturate", 1) != 1 or attrs.get("round_mode", "up") != "up":
        return "saturate/round_mode apply to float8 types only"
    return ""


@op("Cast", since=(6, 9, 13, 19, 21, 23, 24, 25), input_types={0: _CASTABLE},
    output_types=FLOATS | BOOLS, check=_check_cast)  # fmt: skip
def cast(x: mx.array, /, *, to: int, saturate: int = 1, round_mode: str = "up") -> mx.array:
    return x.astype(mx_dtype(to))


@op("CastLike", since=(15, 19, 21, 23, 24, 25), input_types={0: _CASTABLE, 1: FLOATS | BOOLS},
    output_types=FLOATS | BOOLS)  # fmt: skip
def cast_like(
    x: mx.array, target: mx.array, /, *, saturate: int = 1, round_mode: str = "up"
) -> mx.array:
    return x.astype(target.dtype)


@op("Identity", since=(1, 13, 14, 16, 19, 21, 23, 24, 25))
def identity(x: mx.array, /) -> mx.array:
    return x

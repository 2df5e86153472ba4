"""Generators for the elementwise, reduction, shape, indexing and math ops.

Each generator takes a :class:`~nxrt_fuzz.build.Builder` and returns one node
(or a list: a small fragment) with every attribute the op's schema defines
drawn from its valid range, and left out now and then so defaults are
tested too. Inputs come from the builder: an earlier value when one fits,
else a new graph input. A generator raises :class:`~nxrt_fuzz.build.Skip`
when what it drew cannot make the op.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnx import helper

from nxrt_fuzz.build import (
    BOOL,
    DTYPES,
    F16,
    I32,
    I64,
    STR,
    WORDS,
    Builder,
    Skip,
    schema,
)

Generator = Callable[[Builder], "onnx.NodeProto | list[onnx.NodeProto]"]
GENERATORS: dict[str, Generator] = {}


def gen(*ops: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a generator for ``ops``; it receives the builder and the op's name."""

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        for op in ops:

            def generator(b: Builder, _op: str = op, _fn: Callable[..., Any] = fn) -> Any:
                return _fn(b, _op)

            GENERATORS[op] = generator
        return fn

    return register


def fl(b: Builder, default: float, lo: float = -2.0, hi: float = 3.0) -> float | None:
    """A float attribute: left out, its default, or a value in ``[lo, hi]``."""
    if b.maybe(0.3):
        return None
    if b.maybe(0.3):
        return default
    return round(float(b.rng.uniform(lo, hi)), 2)


def flag(b: Builder, p_omit: float = 0.3) -> int | None:
    """A 0/1 attribute, left out now and then."""
    return None if b.maybe(p_omit) else b.int(0, 1)


def since(op: str, b: Builder) -> int:
    s = schema(op, b.opset)
    if s is None:
        raise Skip(op)
    return s.since_version


def scalar_or_1d(b: Builder, value: Any, dtype: Any) -> np.ndarray:
    array = np.asarray(value, dtype=dtype)
    return array.reshape(1) if b.maybe(0.3) else array


# -- elementwise --------------------------------------------------------------------------------

UNARY = (
    "Abs Acos Acosh Asin Asinh Atan Atanh Ceil Cos Cosh Erf Exp Floor Log Neg Reciprocal "
    "Relu Round Sigmoid Sign Sin Sinh Softplus Softsign Sqrt Tan Tanh IsNaN Identity Not "
    "BitwiseNot"
).split()


@gen(*UNARY)
def unary(b: Builder, op: str) -> onnx.NodeProto:
    return b.node(op, [b.pick(b.types(op))])


@gen("Celu", "Elu", "LeakyRelu", "ThresholdedRelu")
def alpha_unary(b: Builder, op: str) -> onnx.NodeProto:
    default = {"LeakyRelu": 0.01}.get(op, 1.0)
    return b.node(op, [b.pick(b.types(op))], alpha=fl(b, default))


@gen("HardSigmoid")
def hard_sigmoid(b: Builder, op: str) -> onnx.NodeProto:
    return b.node(op, [b.pick(b.types(op))], alpha=fl(b, 0.2), beta=fl(b, 0.5))


@gen("Selu")
def selu(b: Builder, op: str) -> onnx.NodeProto:
    return b.node(op, [b.pick(b.types(op))], alpha=fl(b, 1.67, 0.1, 3), gamma=fl(b, 1.05, 0.1, 3))


@gen("Shrink")
def shrink(b: Builder, op: str) -> onnx.NodeProto:
    return b.node(op, [b.pick(b.types(op))], bias=fl(b, 0.0), lambd=fl(b, 0.5, 0.0, 2.0))


@gen("Gelu")
def gelu(b: Builder, op: str) -> onnx.NodeProto:
    approximate = None if b.maybe(0.3) else b.choice(["none", "tanh"])
    return b.node(op, [b.pick(b.types(op))], approximate=approximate)


@gen("IsInf")
def is_inf(b: Builder, op: str) -> onnx.NodeProto:
    return b.node(op, [b.pick(b.types(op))], detect_negative=flag(b), detect_positive=flag(b))


@gen("Softmax", "LogSoftmax", "Hardmax")
def softmax(b: Builder, op: str) -> onnx.NodeProto:
    x = b.pick(b.types(op), (1, 4))
    return b.node(op, [x], axis=None if b.maybe(0.3) else b.axis(b.value(x).ndim))


@gen("LpNormalization")
def lp_normalization(b: Builder, op: str) -> onnx.NodeProto:
    x = b.pick(b.types(op), (1, 4))
    axis = None if b.maybe(0.3) else b.axis(b.value(x).ndim)
    return b.node(op, [x], axis=axis, p=None if b.maybe(0.3) else b.choice([1, 2]))


@gen("Clip")
def clip(b: Builder, op: str) -> onnx.NodeProto:
    x = b.pick(b.types(op))
    dtype = b.value(x).dtype
    bounds = []
    for _ in range(b.choice([0, 1, 2, 2])):
        if b.maybe(0.2):
            bounds.append("")  # an optional input left out in the middle
        else:
            bounds.append(b.param(op, len(bounds) + 1, b.data(dtype, ()), dtype))
    while bounds and not bounds[-1]:
        bounds.pop()
    return b.node(op, [x, *bounds])


@gen("Dropout")
def dropout(b: Builder, op: str) -> onnx.NodeProto:
    x = b.pick(b.types(op))
    inputs = [x]
    training = b.choice([None, False, True])
    ratio = 0.0 if training else float(b.choice([0.0, 0.25, 0.5]))
    if training is not None or b.maybe(0.5):
        inputs.append(b.const(np.asarray(ratio, b.choice(b.types(op, 1)))))
    if training is not None:
        inputs.append(b.const(np.asarray(training)))
    return b.node(op, inputs, n_out=b.choice([1, 2]), seed=None if b.maybe(0.7) else 7)


@gen("Cast")
def cast(b: Builder, op: str) -> onnx.NodeProto:
    x = b.pick(b.types(op))
    to = b.choice(b.types(op, 0))
    saturate = flag(b, 0.7) if since(op, b) >= 19 else None
    return b.node(op, [x], to=helper.np_dtype_to_tensor_dtype(to), saturate=saturate)


def second(b: Builder, op: str, a: str, dtype: np.dtype | None = None) -> str:
    """An input that broadcasts with ``a`` (the same dtype unless ``dtype``)."""
    value = b.value(a)
    return b.like(dtype or value.dtype, b.broadcast_shape(value.shape), fresh=0.6)


@gen("Add", "Sub", "Mul", "Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual")
def binary(b: Builder, op: str) -> onnx.NodeProto:
    a = b.pick(b.types(op))
    other = second(b, op, a)
    return b.node(op, [a, other] if b.maybe() else [other, a])


@gen("And", "Or", "Xor", "BitwiseAnd", "BitwiseOr", "BitwiseXor")
def logical(b: Builder, op: str) -> onnx.NodeProto:
    a = b.pick(b.types(op))
    return b.node(op, [a, second(b, op, a)])


def nonzero_divisor(b: Builder, dtype: np.dtype, shape: tuple[int, ...]) -> str:
    """Integer divisors without 0 (onnxruntime dies on it) or -1 (INT_MIN / -1 overflows)."""
    values = b.rng.choice([-5, -4, -3, -2, 1, 2, 3, 4, 5, 7], size=shape)
    if dtype.kind == "u":
        values = np.abs(values)
    return b.input(values.astype(dtype))


@gen("Div", "Mod")
def division(b: Builder, op: str) -> onnx.NodeProto:
    a = b.pick(b.types(op))
    dtype = b.value(a).dtype
    shape = b.broadcast_shape(b.value(a).shape)
    if dtype.kind in "iu":
        divisor = nonzero_divisor(b, dtype, shape)
    else:
        divisor = b.like(dtype, shape)
    fmod = 1 if dtype.kind == "f" else flag(b)
    return b.node(op, [a, divisor], fmod=fmod if op == "Mod" else None)


@gen("Pow")
def pow_(b: Builder, op: str) -> onnx.NodeProto:
    a = b.pick(b.types(op))
    dtype = b.choice(b.types(op, 1))
    shape = b.broadcast_shape(b.value(a).shape)
    if dtype.kind in "iu":
        exponent = b.input(b.rng.integers(0 if dtype.kind == "u" else -2, 4, shape).astype(dtype))
    else:
        exponent = b.like(dtype, shape)
    return b.node(op, [a, exponent])


@gen("BitShift")
def bit_shift(b: Builder, op: str) -> onnx.NodeProto:
    a = b.pick(b.types(op))
    dtype = b.value(a).dtype
    shape = b.broadcast_shape(b.value(a).shape)
    amount = b.input(b.rng.integers(0, dtype.itemsize * 8, shape).astype(dtype))
    return b.node(op, [a, amount], direction=b.choice(["LEFT", "RIGHT"]))


@gen("Max", "Min", "Mean", "Sum")
def variadic(b: Builder, op: str) -> onnx.NodeProto:
    a = b.pick(b.types(op))
    others = [second(b, op, a) for _ in range(b.choice([0, 1, 1, 2]))]
    inputs = [a, *others]
    b.rng.shuffle(inputs)
    return b.node(op, inputs)


@gen("PRelu")
def prelu(b: Builder, op: str) -> onnx.NodeProto:
    x = b.pick(b.types(op))
    shape = b.value(x).shape
    slope_shape = tuple(1 if b.maybe(0.5) else d for d in shape)[b.int(0, len(shape)) :]
    return b.node(op, [x, b.like(b.value(x).dtype, slope_shape)])


@gen("Where")
def where(b: Builder, op: str) -> onnx.NodeProto:
    x = b.pick(b.types(op, 1))
    value = b.value(x)
    cond = b.like(BOOL, b.broadcast_shape(value.shape))
    return b.node(op, [cond, x, second(b, op, x)])


# -- reductions ---------------------------------------------------------------------------------

REDUCE = (
    "ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean ReduceMin "
    "ReduceProd ReduceSum ReduceSumSquare"
).split()


@gen(*REDUCE)
def reduce(b: Builder, op: str) -> onnx.NodeProto:
    x = b.pick(b.types(op))
    rank = b.value(x).ndim
    axes = None if b.maybe(0.2) else b.axes(rank)
    keepdims = flag(b)
    s = schema(op, b.opset)
    assert s is not None
    if "axes" in s.attributes:
        return b.node(op, [x], axes=axes or None, keepdims=keepdims)
    inputs = [x]
    if axes is not None:
        inputs.append(b.param(op, 1, axes))
    return b.node(op, inputs, keepdims=keepdims, noop_with_empty_axes=flag(b, 0.5))


@gen("ArgMax", "ArgMin")
def arg_reduce(b: Builder, op: str) -> onnx.NodeProto:
    x = b.pick(b.types(op), (1, 4))
    axis = None if b.maybe(0.2) else b.axis(b.value(x).ndim)
    return b.node(op, [x], axis=axis, keepdims=flag(b), select_last_index=flag(b))


@gen("CumSum", "CumProd")
def cumulative(b: Builder, op: str) -> onnx.NodeProto:
    x = b.pick(b.types(op), (1, 4))
    axis = b.param(op, 1, scalar_or_1d(b, b.axis(b.value(x).ndim), b.choice([I32, I64])), None)
    return b.node(op, [x, axis], exclusive=flag(b), reverse=flag(b))


@gen("TopK")
def top_k(b: Builder, op: str) -> onnx.NodeProto:
    x = b.pick(b.types(op), (1, 4))
    value = b.value(x)
    axis = b.axis(value.ndim)
    k = b.int(0, value.shape[axis])
    return b.node(
        op,
        [x, b.param(op, 1, [k])],
        n_out=2,
        axis=None if b.maybe(0.3) and axis in (-1, value.ndim - 1) else axis,
        largest=flag(b),
        sorted=None if b.maybe(0.5) else b.choice([1, 1, 0]),  # 0: onnxruntime's order
    )


# -- math ---------------------------------------------------------------------------------------


@gen("MatMul")
def matmul(b: Builder, op: str) -> onnx.NodeProto:
    a = b.pick(b.types(op), (1, 4))
    value = b.value(a)
    k = value.shape[-1]
    if b.maybe(0.2):
        shape: tuple[int, ...] = (k,)
    else:
        batch = b.broadcast_shape(value.shape[:-2]) if value.ndim > 2 else ()
        if value.ndim <= 2 and b.maybe(0.2):
            batch = (b.dim(),)
        shape = (*batch, k, b.dim(0))
    return b.node(op, [a, b.like(value.dtype, shape, fresh=0.7)])


@gen("Gemm")
def gemm(b: Builder, op: str) -> onnx.NodeProto:
    dtype = b.choice(b.types(op))
    m, k, n = b.dim(0), b.dim(0), b.dim(0)
    trans_a, trans_b = flag(b), flag(b)
    a = b.like(dtype, (k, m) if trans_a else (m, k))
    w = b.like(dtype, (n, k) if trans_b else (k, n))
    inputs = [a, w]
    if b.maybe(0.7):
        inputs.append(b.like(dtype, b.choice([(m, n), (n,), (1, n), (m, 1), (), (1,)])))
    return b.node(op, inputs, alpha=fl(b, 1.0), beta=fl(b, 1.0), transA=trans_a, transB=trans_b)


@gen("MatMulInteger")
def matmul_integer(b: Builder, op: str) -> onnx.NodeProto:
    dtype_a, dtype_b = b.choice(b.types(op, 0)), b.choice(b.types(op, 1))
    m, k, n = b.dim(), b.dim(), b.dim()
    batch = () if b.maybe(0.6) else (b.dim(),)
    inputs = [b.like(dtype_a, (*batch, m, k)), b.like(dtype_b, (k, n))]
    if b.maybe(0.6):
        inputs.append(b.const(b.data(dtype_a, b.choice([(), (m,)]))))
        if b.maybe(0.6):
            inputs.append(b.const(b.data(dtype_b, b.choice([(), (n,)]))))
    return b.node(op, inputs)


@gen("Det")
def det(b: Builder, op: str) -> onnx.NodeProto:
    n = b.int(1, 4)
    batch = b.shape(b.int(0, 2), hi=3)
    return b.node(op, [b.like(b.choice(b.types(op)), (*batch, n, n))])


EINSUM = [
    ("ij,jk->ik", 2),
    ("bij,bjk->bik", 2),
    ("ij->ji", 1),
    ("ii->i", 1),
    ("ii", 1),
    ("ij->", 1),
    ("ij->j", 1),
    ("i,j->ij", 2),
    ("i,i->", 2),
    ("...ij,...jk->...ik", 2),
    ("ij,jk", 2),
    ("bhqd,bhkd->bhqk", 2),
    ("ijk->kji", 1),
    ("ij,ij->ij", 2),
    ("i,i", 2),
]


@gen("Einsum")
def einsum(b: Builder, op: str) -> onnx.NodeProto:
    equation, _ = b.choice(EINSUM)
    dtype = b.choice(b.types(op))
    sizes = {c: b.dim(0 if b.maybe(0.1) else 1, 4) for c in "bhijkqd"}
    ellipsis = b.shape(b.int(0, 2), hi=3)
    operands = []
    for term in equation.split("->")[0].split(","):
        shape: list[int] = []
        for c in term.replace("...", "."):
            shape += list(ellipsis) if c == "." else [sizes[c]]
        operands.append(b.like(dtype, shape))
    return b.node(op, operands, equation=equation)


# -- shape --------------------------------------------------------------------------------------


def reshape_target(b: Builder, shape: tuple[int, ...]) -> list[int]:
    """A new shape of the same size: adjacent dims merged or split, one maybe -1."""
    dims = list(shape)
    if b.maybe(0.5) and len(dims) >= 2:
        i = b.int(0, len(dims) - 2)
        dims[i : i + 2] = [dims[i] * dims[i + 1]]
    if b.maybe(0.5) and dims:
        i = b.int(0, len(dims) - 1)
        d = dims[i]
        f = b.choice([f for f in range(1, d + 1) if d % f == 0] or [1])
        dims[i : i + 1] = [f, d // f] if d else [0, 1]
    if b.maybe(0.3):
        dims.insert(b.int(0, len(dims)), 1)
    if dims and 0 not in dims and b.maybe(0.5):
        dims[b.int(0, len(dims) - 1)] = -1
    return dims


@gen("Reshape")
def reshape(b: Builder, op: str) -> onnx.NodeProto:
    x = b.pick(b.types(op))
    shape = b.value(x).shape
    target = reshape_target(b, shape)
    allowzero = flag(b, 0.6) if since(op, b) >= 14 else None
    for i, d in enumerate(target):
        if i < len(shape) and shape[i] == d and d != 0 and b.maybe(0.2):
            target[i] = 0  # "copy this dim from the input"
    return b.node(op, [x, b.param(op, 1, target)], allowzero=allowzero)


@gen("Flatten")
def flatten(b: Builder, op: str) -> onnx.NodeProto:
    x = b.pick(b.types(op))
    rank = b.value(x).ndim
    axis = b.int(-rank, rank)
    return b.node(op, [x], axis=None if b.maybe(0.2) else axis)


@gen("Squeeze")
def squeeze(b: Builder, op: str) -> onnx.NodeProto:
    x = b.pick(b.types(op))
    shape = b.value(x).shape
    ones = [i for i, d in enumerate(shape) if d == 1]
    axes = [a - len(shape) if b.maybe(0.3) else a for a in ones if b.maybe(0.7)]
    if not axes and b.maybe(0.5):
        return b.node(op, [x])
    return axes_node(b, op, x, axes)


def axes_node(b: Builder, op: str, x: str, axes: list[int]) -> onnx.NodeProto:
    """``op(x)`` over ``axes``: an attribute before opset 13, an input from then on."""
    if since(op, b) < 13:
        return b.node(op, [x], axes=axes)
    return b.node(op, [x, b.param(op, 1, axes)])


@gen("Unsqueeze")
def unsqueeze(b: Builder, op: str) -> onnx.NodeProto:
    x = b.pick(b.types(op))
    out_rank = b.value(x).ndim + b.int(1, 2)
    axes = sorted(b.rng.choice(out_rank, size=out_rank - b.value(x).ndim, replace=False).tolist())
    return axes_node(b, op, x, [a - out_rank if b.maybe(0.3) else a for a in axes])


@gen("Transpose")
def transpose(b: Builder, op: str) -> onnx.NodeProto:
    x = b.pick(b.types(op))
    perm = b.rng.permutation(b.value(x).ndim).tolist()
    return b.node(op, [x], perm=None if b.maybe(0.2) or not perm else perm)


@gen("Expand")
def expand(b: Builder, op: str) -> onnx.NodeProto:
    x = b.pick(b.types(op))
    shape = b.value(x).shape
    target = [b.dim() if d == 1 and b.maybe(0.5) else (1 if b.maybe(0.2) else d) for d in shape]
    target = [b.dim() for _ in range(b.int(0, 2))] + target
    return b.node(op, [x, b.param(op, 1, target)])


@gen("Tile")
def tile(b: Builder, op: str) -> onnx.NodeProto:
    x = b.pick(b.types(op), (1, 4))
    repeats = [b.choice([0, 1, 1, 2, 3]) if b.maybe(0.9) else 1 for _ in b.value(x).shape]
    return b.node(op, [x, b.param(op, 1, repeats)])


@gen("Concat")
def concat(b: Builder, op: str) -> onnx.NodeProto:
    x = b.pick(b.types(op), (1, 4))
    value = b.value(x)
    axis = b.axis(value.ndim)
    parts = [x]
    for _ in range(b.choice([0, 1, 1, 2, 3])):
        shape = list(value.shape)
        shape[axis] = b.dim(0, 3)
        parts.append(b.like(value.dtype, shape, fresh=0.6))
    b.rng.shuffle(parts)
    return b.node(op, parts, axis=axis)


@gen("Split")
def split(b: Builder, op: str) -> onnx.NodeProto:
    x = b.pick(b.types(op), (1, 4))
    value = b.value(x)
    axis = b.axis(value.ndim)
    length = value.shape[axis]
    version = since(op, b)
    if version >= 18 and b.maybe(0.5):
        n = b.int(1, max(1, min(length, 4)))
        return b.node(op, [x], n_out=n, axis=axis, num_outputs=n)
    cuts = sorted(b.rng.integers(0, length + 1, size=b.int(0, 3)).tolist())
    sizes = np.diff([0, *cuts, length]).tolist()
    if version < 13:
        return b.node(op, [x], n_out=len(sizes), axis=axis, split=sizes)
    if b.maybe(0.2) and length % len(sizes) == 0 and version < 18:
        return b.node(op, [x], n_out=len(sizes), axis=axis)
    return b.node(op, [x, b.param(op, 1, sizes)], n_out=len(sizes), axis=axis)


@gen("Slice")
def slice_(b: Builder, op: str) -> onnx.NodeProto:
    x = b.pick(b.types(op), (1, 4))
    shape = b.value(x).shape
    axes = b.axes(len(shape), lo=1)
    b.rng.shuffle(axes)
    starts, ends, steps = [], [], []
    for a in axes:
        d = shape[a]
        step = b.choice([1, 1, 1, 2, 3, -1, -2])
        wide = [-(2**62), -d - 2, -d, -1, 0, 1, d // 2, d, d + 3, 2**62]
        starts.append(b.choice(wide) if b.maybe(0.3) else b.int(-d, d))
        ends.append(b.choice(wide) if b.maybe(0.3) else b.int(-d, d))
        steps.append(step)
    dtype = b.choice([I32, I64])
    if dtype == I32:
        starts, ends = (np.clip(v, -(2**31), 2**31 - 1).tolist() for v in (starts, ends))
    inputs = [x, b.param(op, 1, starts, dtype), b.param(op, 2, ends, dtype)]
    if b.maybe(0.8) or any(s != 1 for s in steps):
        inputs.append(b.param(op, 3, axes, dtype))
        if b.maybe(0.7) or any(s != 1 for s in steps):
            inputs.append(b.param(op, 4, steps, dtype))
    return b.node(op, inputs)


@gen("Pad")
def pad(b: Builder, op: str) -> onnx.NodeProto:
    x = b.pick(b.types(op), (1, 4))
    shape = b.value(x).shape
    version = since(op, b)
    modes = ["constant", "reflect", "edge"] + (["wrap"] if version >= 19 else [])
    mode = b.choice(modes)
    axes = list(range(len(shape)))
    if version >= 18 and b.maybe(0.4):
        axes = b.axes(len(shape), lo=1)
    pads = []
    for _side in range(2):
        for a in axes:
            d = shape[a]
            # reflect reaches at most d - 1 values, wrap d; a negative pad crops
            wide = [0, 0, 1, 2, -1, d - 1, d, -d, d + 1]
            pads.append(b.choice(wide) if d else b.choice([0, 1]))
    inputs = [x, b.param(op, 1, pads)]
    if b.maybe(0.6) and mode == "constant":
        inputs.append(b.param(op, 2, b.data(b.value(x).dtype, ()), b.value(x).dtype))
    if version >= 18 and axes != list(range(len(shape))):
        if len(inputs) == 2:
            inputs.append("")
        inputs.append(b.param(op, 3, axes, b.choice([I32, I64])))
    return b.node(op, inputs, mode=None if mode == "constant" and b.maybe(0.5) else mode)


@gen("Shape")
def shape_(b: Builder, op: str) -> onnx.NodeProto:
    x = b.pick(DTYPES)
    rank = b.value(x).ndim
    if since(op, b) < 15 or b.maybe(0.4):
        return b.node(op, [x])
    return b.node(
        op,
        [x],
        start=None if b.maybe(0.4) else b.int(-rank - 1, rank + 1),
        end=None if b.maybe(0.4) else b.int(-rank - 1, rank + 1),
    )


@gen("Size")
def size(b: Builder, op: str) -> onnx.NodeProto:
    return b.node(op, [b.pick(DTYPES)])


@gen("ConstantOfShape")
def constant_of_shape(b: Builder, op: str) -> onnx.NodeProto:
    shape = b.param(op, 0, b.shape(b.int(0, 3), lo=0, hi=4))
    if b.maybe(0.2):
        return b.node(op, [shape])
    dtype = b.choice([d for d in DTYPES if d != F16 or b.opset >= 9])
    value = onnx.numpy_helper.from_array(b.data(dtype, (1,)), "value")
    return b.node(op, [shape], value=value)


@gen("EyeLike")
def eye_like(b: Builder, op: str) -> onnx.NodeProto:
    x = b.pick(b.types(op), 2)
    dtype = None if b.maybe(0.5) else helper.np_dtype_to_tensor_dtype(b.choice(b.types(op)))
    return b.node(op, [x], k=None if b.maybe(0.3) else b.int(-3, 3), dtype=dtype)


@gen("Range")
def range_(b: Builder, op: str) -> onnx.NodeProto:
    dtype = b.choice(b.types(op))
    start = b.int(-5, 5)
    delta = b.choice([1, 2, 3, -1, -2]) if dtype.kind in "iu" else b.choice([0.5, 1.5, -0.75, 2.0])
    limit = start + delta * b.int(0, 8) + (0 if dtype.kind in "iu" else b.choice([0, 0.1]))
    if dtype.kind == "u":
        start, delta, limit = abs(start), abs(delta), abs(start) + abs(delta) * b.int(0, 6)
    return b.node(op, [b.param(op, i, v, dtype) for i, v in enumerate((start, limit, delta))])


@gen("Trilu")
def trilu(b: Builder, op: str) -> onnx.NodeProto:
    x = b.pick(b.types(op), (2, 4))
    inputs = [x]
    if b.maybe(0.6):
        inputs.append(b.param(op, 1, b.int(-4, 4)))
    return b.node(op, inputs, upper=flag(b))


@gen("DepthToSpace", "SpaceToDepth")
def depth_space(b: Builder, op: str) -> onnx.NodeProto:
    dtype = b.choice(b.types(op))
    bs = b.int(1, 3)
    n, c, h, w = b.dim(hi=2), b.dim(hi=3), b.dim(hi=3), b.dim(hi=3)
    if op == "DepthToSpace":
        x = b.like(dtype, (n, c * bs * bs, h, w))
        return b.node(
            op, [x], blocksize=bs, mode=None if b.maybe(0.3) else b.choice(["DCR", "CRD"])
        )
    return b.node(op, [b.like(dtype, (n, c, h * bs, w * bs))], blocksize=bs)


@gen("Compress")
def compress(b: Builder, op: str) -> onnx.NodeProto:
    x = b.pick(b.types(op), (1, 4))
    shape = b.value(x).shape
    axis = None if b.maybe(0.3) else b.axis(len(shape))
    length = int(np.prod(shape)) if axis is None else shape[axis]
    condition = b.param(op, 1, b.rng.random(b.int(0, length)) < 0.5, BOOL)
    return b.node(op, [x, condition], axis=axis)


@gen("OneHot")
def one_hot(b: Builder, op: str) -> onnx.NodeProto:
    depth = b.int(1, 5)
    indices = b.input(
        b.rng.integers(-depth, depth + 1, b.shape(b.int(0, 3), hi=4)).astype(
            b.choice(b.types(op, 0))
        )
    )
    rank = b.value(indices).ndim
    depth_dtype = b.choice(b.types(op, 1))
    values_dtype = b.choice(b.types(op, 2))
    return b.node(
        op,
        [
            indices,
            b.param(op, 1, scalar_or_1d(b, depth, depth_dtype), None),
            b.param(op, 2, b.data(values_dtype, (2,), special=False), values_dtype),
        ],
        axis=None if b.maybe(0.3) else b.int(-rank - 1, rank),
    )


@gen("NonZero")
def non_zero(b: Builder, op: str) -> onnx.NodeProto:
    return b.node(op, [b.pick(b.types(op))])


@gen("Unique")
def unique(b: Builder, op: str) -> onnx.NodeProto:
    x = b.pick(b.types(op), (1, 3))
    if b.value(x).dtype.kind == "f" and np.isnan(b.value(x)).any():
        raise Skip("NaN in Unique: no two NaNs compare equal, so the spec's order is open")
    axis = None if b.maybe(0.5) else b.axis(b.value(x).ndim)
    return b.node(op, [x], n_out=b.int(1, 4), axis=axis, sorted=flag(b))


@gen("ReverseSequence")
def reverse_sequence(b: Builder, op: str) -> onnx.NodeProto:
    x = b.pick(b.types(op), (2, 4), lo=1)
    shape = b.value(x).shape
    batch_axis = b.int(0, 1)
    time_axis = 1 - batch_axis
    lens = b.rng.integers(1, shape[time_axis] + 1, shape[batch_axis])
    return b.node(
        op,
        [x, b.param(op, 1, lens)],
        batch_axis=batch_axis if batch_axis or b.maybe() else None,
        time_axis=time_axis if time_axis != 0 or b.maybe() else None,
    )


def indices_for(b: Builder, op: str, index: int, shape: tuple[int, ...], bound: int) -> str:
    """Indices in ``[-bound, bound)`` of ``shape``, of an integer type ``op`` takes."""
    dtype = b.choice(b.types(op, index))
    if bound == 0:
        shape = tuple(0 if i == 0 else d for i, d in enumerate(shape)) or (0,)
        return b.param(op, index, np.zeros(shape, dtype), None)
    return b.param(op, index, b.rng.integers(-bound, bound, shape).astype(dtype), None)


@gen("Gather")
def gather(b: Builder, op: str) -> onnx.NodeProto:
    x = b.pick(b.types(op), (1, 4))
    shape = b.value(x).shape
    axis = b.axis(len(shape))
    idx_shape = b.shape(b.int(0, 2), hi=3)
    indices = indices_for(b, op, 1, idx_shape, shape[axis])
    return b.node(op, [x, indices], axis=None if axis == 0 and b.maybe() else axis)


@gen("GatherElements")
def gather_elements(b: Builder, op: str) -> onnx.NodeProto:
    x = b.pick(b.types(op), (1, 4))
    shape = b.value(x).shape
    axis = b.axis(len(shape))
    idx_shape = tuple(
        b.int(1 if d else 0, max(d, 1) + 1) if i == axis % len(shape) else b.int(0, d)
        for i, d in enumerate(shape)
    )
    indices = indices_for(b, op, 1, idx_shape, shape[axis])
    return b.node(op, [x, indices], axis=None if axis == 0 and b.maybe() else axis)


@gen("GatherND")
def gather_nd(b: Builder, op: str) -> onnx.NodeProto:
    x = b.pick(b.types(op), (1, 4))
    shape = b.value(x).shape
    batch_dims = b.int(0, min(len(shape) - 1, 2))
    k = b.int(1, len(shape) - batch_dims)
    middle = b.shape(b.int(0, 2), hi=3)
    tail = [shape[batch_dims + j] for j in range(k)]
    if 0 in tail:
        raise Skip("an empty dimension cannot be indexed")
    idx = np.stack([b.rng.integers(-d, d, (*shape[:batch_dims], *middle)) for d in tail], -1)
    return b.node(op, [x, b.param(op, 1, idx)], batch_dims=batch_dims or None)


def unique_along(b: Builder, shape: tuple[int, ...], axis: int, bound: int) -> np.ndarray:
    """Indices of ``shape`` into an axis of length ``bound``, never twice on one line."""
    length = shape[axis]
    moved = [d for i, d in enumerate(shape) if i != axis]
    lines = [b.rng.permutation(bound)[:length] for _ in range(int(np.prod(moved)))]
    stacked = np.asarray(lines).reshape(*moved, length) if lines else np.zeros((*moved, length))
    out = np.moveaxis(stacked, -1, axis).astype(np.int64)
    return np.where(b.rng.random(out.shape) < 0.3, out - bound, out)


@gen("ScatterElements")
def scatter_elements(b: Builder, op: str) -> onnx.NodeProto:
    x = b.pick(b.types(op), (1, 4), lo=1)
    value = b.value(x)
    shape = value.shape
    axis = b.axis(len(shape)) % len(shape)
    version = since(op, b)
    reductions = (
        ["none"]
        + (["add", "mul"] if version >= 16 else [])
        + (["max", "min"] if version >= 18 else [])
    )
    reduction = b.choice(reductions)
    idx_shape = tuple(b.int(0, d) if i == axis else b.int(0, d) for i, d in enumerate(shape))
    if reduction == "none":
        idx = unique_along(b, idx_shape, axis, shape[axis])
    else:
        idx = b.rng.integers(-shape[axis], shape[axis], idx_shape)
    indices = b.param(op, 1, idx.astype(b.choice(b.types(op, 1))), None)
    updates = b.like(value.dtype, idx_shape)
    attrs: dict[str, Any] = {"reduction": None if reduction == "none" and b.maybe() else reduction}
    if version < 16:
        attrs = {}
    return b.node(op, [x, indices, updates], axis=axis if axis or b.maybe() else None, **attrs)


@gen("ScatterND")
def scatter_nd(b: Builder, op: str) -> onnx.NodeProto:
    x = b.pick(b.types(op), (1, 4), lo=1)
    value = b.value(x)
    shape = value.shape
    k = b.int(1, len(shape))
    count = b.int(0, min(int(np.prod(shape[:k])), 4))
    version = since(op, b)
    reductions = (
        ["none"]
        + (["add", "mul"] if version >= 16 else [])
        + (["max", "min"] if version >= 18 else [])
    )
    reduction = b.choice(reductions)
    flat = b.rng.choice(int(np.prod(shape[:k])), size=count, replace=reduction != "none")
    idx = np.stack(np.unravel_index(flat, shape[:k]), -1) if count else np.zeros((0, k), int)
    idx = np.where(b.rng.random(idx.shape) < 0.3, idx - np.array(shape[:k]), idx)
    if b.maybe(0.3) and count:
        idx = idx.reshape(1, count, k)
    updates = b.like(value.dtype, (*idx.shape[:-1], *shape[k:]))
    attrs: dict[str, Any] = {"reduction": None if reduction == "none" and b.maybe() else reduction}
    return b.node(op, [x, b.param(op, 1, idx), updates], **(attrs if version >= 16 else {}))


__all__ = ["GENERATORS", "Generator", "gen"]


# -- strings, bit casts, caches -------------------------------------------------------------------


@gen("StringNormalizer")
def string_normalizer(b: Builder, op: str) -> onnx.NodeProto:
    shape = b.choice([(b.dim(),), (1, b.dim())])
    x = b.like(STR, shape)
    stopwords = None if b.maybe(0.5) else list(b.rng.choice(WORDS[1:], size=b.int(1, 3)))
    return b.node(
        op,
        [x],
        case_change_action=None if b.maybe(0.3) else b.choice(["LOWER", "UPPER", "NONE"]),
        is_case_sensitive=flag(b),
        stopwords=stopwords,
    )


@gen("StringSplit")
def string_split(b: Builder, op: str) -> onnx.NodeProto:
    x = b.pick([STR], (0, 2))
    delimiter = None if b.maybe(0.4) else b.choice([" ", ",", "b", ", "])
    return b.node(
        op, [x], n_out=2, delimiter=delimiter, maxsplit=None if b.maybe() else b.int(0, 2)
    )


@gen("RegexFullMatch")
def regex_full_match(b: Builder, op: str) -> onnx.NodeProto:
    pattern = b.choice(["[a-z]+", "a.*", ".*b", "\\d", "[A-Z][a-z]*", "(a|b)+ ?"])
    return b.node(op, [b.pick([STR])], pattern=pattern)


@gen("StringConcat")
def string_concat(b: Builder, op: str) -> onnx.NodeProto:
    x = b.pick([STR])
    return b.node(op, [x, second(b, op, x)])


@gen("TfIdfVectorizer")
def tfidf_vectorizer(b: Builder, op: str) -> onnx.NodeProto:
    strings = b.maybe(0.3)
    pool_values: list = list(WORDS[1:6]) if strings else list(range(1, 6))
    min_gram = b.int(1, 2)
    max_gram = b.int(min_gram, 3)
    pool: list[Any]
    pool, counts, next_index = [], [], 0
    for n in range(1, max_gram + 1):
        counts.append(len(pool))
        grams = {tuple(b.choice(pool_values) for _ in range(n)) for _ in range(b.int(1, 3))}
        for gram in sorted(grams):
            pool.extend(gram)
            next_index += 1
    indexes = b.rng.permutation(next_index).tolist()
    shape = b.choice([(b.int(1, 8),), (b.dim(hi=3), b.int(1, 8))])
    if strings:
        x = b.input(np.array(pool_values, dtype=object)[b.rng.integers(5, size=shape)])
    else:
        x = b.input(b.rng.integers(0, 6, shape).astype(b.choice([I32, I64])))
    attrs = {
        "min_gram_length": min_gram,
        "max_gram_length": max_gram,
        "max_skip_count": b.int(0, 2),
        "mode": b.choice(["TF", "IDF", "TFIDF"]),
        "ngram_counts": counts,
        "ngram_indexes": indexes,
        "pool_strings" if strings else "pool_int64s": pool,
    }
    if b.maybe(0.5):
        attrs["weights"] = [round(float(w), 2) for w in b.rng.uniform(0.1, 2, next_index)]
    return b.node(op, [x], **attrs)


@gen("BitCast")
def bit_cast(b: Builder, op: str) -> onnx.NodeProto:
    x = b.pick(b.types(op))
    width = b.value(x).dtype.itemsize
    targets = [d for d in DTYPES if d.itemsize == width and d != BOOL]
    if b.value(x).dtype == BOOL:
        targets = [BOOL, *targets]
    return b.node(op, [x], to=helper.np_dtype_to_tensor_dtype(b.choice(targets)))


@gen("TensorScatter")
def tensor_scatter(b: Builder, op: str) -> onnx.NodeProto:
    dtype = b.choice(b.types(op))
    batch, heads, capacity, width = b.dim(hi=3), b.dim(hi=2), b.int(1, 6), b.dim(hi=3)
    cache = b.like(dtype, (batch, heads, capacity, width))
    length = b.int(0, capacity)
    update = b.like(dtype, (batch, heads, length, width))
    mode = b.choice(["linear", "circular"])
    top = capacity - length if mode == "linear" else capacity + 2
    inputs = [cache, update]
    if b.maybe(0.7):
        inputs.append(b.param(op, 2, b.rng.integers(0, top + 1, batch)))
    axis = b.choice([2, -2])
    return b.node(op, inputs, mode=None if mode == "linear" and b.maybe() else mode, axis=axis)


# -- ops onnxruntime runs through their function bodies ------------------------------------------


@gen("HardSwish", "Mish")
def function_unary(b: Builder, op: str) -> onnx.NodeProto:
    return b.node(op, [b.pick(b.types(op))])


@gen("Swish")
def swish(b: Builder, op: str) -> onnx.NodeProto:
    return b.node(op, [b.pick(b.types(op))], alpha=fl(b, 1.0, 0.1, 2.0))


@gen("SwiGLU")
def swiglu(b: Builder, op: str) -> onnx.NodeProto:
    a = b.pick(b.types(op))
    other = b.like(b.value(a).dtype, b.value(a).shape)
    return b.node(op, [a, other], alpha=fl(b, 1.0, 0.1, 2.0))


@gen("CastLike")
def cast_like(b: Builder, op: str) -> onnx.NodeProto:
    x = b.pick(b.types(op))
    target = b.const(b.data(b.choice(b.types(op, 1)), (b.int(0, 2),), special=False))
    saturate = flag(b, 0.7) if since(op, b) >= 19 else None
    return b.node(op, [x, target], saturate=saturate)


@gen("GroupNormalization")
def group_normalization(b: Builder, op: str) -> onnx.NodeProto:
    dtype = b.choice(b.types(op))
    groups = b.int(1, 3)
    c = groups * b.int(1, 2)
    x = b.like(dtype, (b.dim(hi=2), c, *b.shape(b.int(0, 2), lo=1, hi=4)))
    per = c if since(op, b) >= 21 else groups  # opset 18 scales per group, 21 per channel
    scale, bias = (b.like(dtype, (per,), fresh=0.9) for _ in range(2))
    return b.node(
        op,
        [x, scale, bias],
        num_groups=groups,
        epsilon=fl(b, 1e-5, 1e-6, 0.1),
        stash_type=None if b.maybe(0.7) or since(op, b) < 21 else 1,
    )


@gen("CenterCropPad")
def center_crop_pad(b: Builder, op: str) -> onnx.NodeProto:
    x = b.pick(b.types(op), (1, 4))
    rank = b.value(x).ndim
    axes = b.axes(rank, lo=1) if b.maybe(0.6) else list(range(rank))
    shape = [b.int(0, 6) for _ in axes]
    return b.node(
        op,
        [x, b.param(op, 1, shape, b.choice([I32, I64]))],
        axes=None if axes == list(range(rank)) and b.maybe() else axes,
    )


def loss_inputs(b: Builder, op: str) -> tuple[list[str], int | None]:
    """Scores ``(N, C, d...)`` and integer targets ``(N, d...)`` (some ``ignore_index``)."""
    dtype = b.choice(b.types(op))
    n, c = b.dim(hi=3), b.int(1, 4)
    extra = b.shape(b.int(0, 2), hi=3)
    scores = b.like(dtype, (n, c, *extra))
    ignore = b.int(0, c - 1) if b.maybe(0.3) else None
    target = b.rng.integers(0, c, (n, *extra)).astype(b.choice(b.types(op, 1)))
    inputs = [scores, b.input(target)]
    if b.maybe(0.4):
        inputs.append(b.const(b.rng.uniform(0.1, 2, c).astype(dtype)))
    return inputs, ignore


@gen("NegativeLogLikelihoodLoss")
def nll_loss(b: Builder, op: str) -> onnx.NodeProto:
    inputs, ignore = loss_inputs(b, op)
    reduction = None if b.maybe(0.3) else b.choice(["none", "sum", "mean"])
    return b.node(op, inputs, reduction=reduction, ignore_index=ignore)


@gen("SoftmaxCrossEntropyLoss")
def softmax_cross_entropy(b: Builder, op: str) -> onnx.NodeProto:
    inputs, ignore = loss_inputs(b, op)
    reduction = None if b.maybe(0.3) else b.choice(["none", "sum", "mean"])
    return b.node(op, inputs, n_out=b.int(1, 2), reduction=reduction, ignore_index=ignore)


@gen("CausalConvWithState")
def causal_conv_with_state(b: Builder, op: str) -> onnx.NodeProto:
    dtype = b.choice(b.types(op))
    batch, channels, length, k = b.dim(hi=2), b.dim(hi=3), b.int(1, 5), b.int(1, 4)
    inputs = [b.like(dtype, (batch, channels, length)), b.like(dtype, (channels, 1, k))]
    if b.maybe(0.6):
        inputs.append(b.like(dtype, (channels,)) if b.maybe(0.7) else "")
        if b.maybe(0.6):
            inputs.append(b.like(dtype, (batch, channels, k - 1)))
    while inputs[-1] == "":
        inputs.pop()
    activation = None if b.maybe(0.5) else b.choice(["none", "silu", "swish"])
    return b.node(op, inputs, n_out=b.int(1, 2), activation=activation)


@gen("LinearAttention")
def linear_attention(b: Builder, op: str) -> onnx.NodeProto:
    dtype = b.choice(b.types(op))
    batch, steps, kv_heads = b.dim(hi=2), b.int(1, 4), b.choice([1, 2])
    q_heads = kv_heads * b.choice([1, 2])
    dk, dv = b.int(1, 3), b.int(1, 3)
    rule = b.choice(["linear", "gated", "delta", "gated_delta"])
    q = b.like(dtype, (batch, steps, q_heads * dk))
    k = b.like(dtype, (batch, steps, kv_heads * dk))
    v = b.like(dtype, (batch, steps, kv_heads * dv))
    state = b.input(b.data(dtype, (batch, kv_heads, dk, dv), special=False)) if b.maybe() else ""
    decay = ""
    if "gated" in rule:
        decay = b.input(-np.abs(b.data(dtype, (batch, steps, kv_heads * dk), special=False)))
    beta = ""
    if "delta" in rule:
        beta = b.input(b.rng.uniform(0, 1, (batch, steps, kv_heads)).astype(dtype))
    inputs = [q, k, v, state, decay, beta]
    while inputs[-1] == "":
        inputs.pop()
    return b.node(
        op,
        inputs,
        n_out=b.int(1, 2),
        q_num_heads=q_heads,
        kv_num_heads=kv_heads,
        update_rule=rule,
        scale=None if b.maybe(0.6) else 0.5,
    )

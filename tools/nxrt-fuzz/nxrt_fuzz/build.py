"""The graph builder the op generators draw into, and how each step is checked by onnxruntime.

A case grows one node (or one small fragment: a sequence and its consumer)
at a time. Each generator asks the builder for inputs of the dtypes and
ranks it needs: the builder hands back an earlier value that fits, or a new
graph input of random shape and contents. onnxruntime then runs the new
fragment on the concrete values, so every value in the graph has a known
shape and contents for the next generator to build on; a fragment
onnxruntime refuses is usually dropped, and sometimes kept as the last node
(to test that nxrt refuses it too, or note that nxrt runs it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper

from nxrt_fuzz.case import make_model

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
I8, U8, I16, U16 = np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int16), np.dtype(np.uint16)
I32, U32, I64, U64 = (
    np.dtype(np.int32),
    np.dtype(np.uint32),
    np.dtype(np.int64),
    np.dtype(np.uint64),
)
BOOL = np.dtype(bool)
#: String tensors are numpy object arrays of ``str``.
STR = np.dtype(object)
#: The words string inputs are made of: empty, spaced, mixed case, digits, delimiters.
WORDS = ("", "a", "ab", "B", "a b", "x,y", "Hello", " pad ", "1", "zz z", "ÄÖ", "a,b,,c")
FLOATS = (F32, F16, F64)
SIGNED = (I8, I16, I32, I64)
UNSIGNED = (U8, U16, U32, U64)
INTS = SIGNED + UNSIGNED
#: Every dtype the fuzzer draws (bfloat16 and the 4/8-bit floats have no numpy dtype).
DTYPES = FLOATS + INTS + (BOOL,)
#: The most elements a value may have; larger outputs are dropped (Tile, Expand, Resize).
MAX_ELEMENTS = 4096


class Skip(Exception):
    """A generator cannot build its op from what it drew; the builder tries another op."""


@dataclass
class Fragment:
    """What a generator returns: its nodes and the outputs later nodes may use."""

    nodes: list[onnx.NodeProto]


def type_dtypes(type_strs: Iterable[str]) -> tuple[np.dtype, ...]:
    """The fuzzable numpy dtypes among ONNX type strings such as ``tensor(float)``."""
    out = []
    for t in type_strs:
        if not t.startswith("tensor(") or t == "tensor(string)":
            continue
        try:
            elem = getattr(onnx.TensorProto, t[7:-1].upper())
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(elem))
        except (AttributeError, KeyError, TypeError):
            continue
        if dtype in DTYPES:
            out.append(dtype)
    return tuple(out)


@functools.cache
def schema(op: str, opset: int) -> onnx.defs.OpSchema | None:
    """The op's ONNX schema in effect at ``opset`` (``None`` before the op existed)."""
    try:
        return onnx.defs.get_schema(op, opset)
    except onnx.defs.SchemaError:
        return None


@functools.cache
def ort_types(op: str, since: int) -> frozenset[str]:
    """Every type onnxruntime's CPU kernels register for ``op`` at schema version ``since``."""
    from onnxruntime.capi import _pybind_state as C

    types: set[str] = set()
    for d in C.get_all_opkernel_def():
        if d.provider == "CPUExecutionProvider" and d.domain in ("", "ai.onnx"):
            if d.op_name == op and d.version_range[0] <= since <= d.version_range[1]:
                for allowed in d.type_constraints.values():
                    types |= set(allowed)
    return frozenset(types)


class Builder:
    """A growing graph: its inputs, constants and nodes, and the concrete value of each name.

    :param rng: The case's random generator; everything a case draws comes from it.
    :param opset: The case's opset; generators read schemas and choose forms by it.
    :param const_inputs: For an op, the input positions its kernel needs as constants.
    :param preferred: Dtypes to draw most of the time where an op allows them (an EP's
        own dtypes, so that its kernels, not the cpu fallback, get the node).
    """

    def __init__(
        self,
        rng: np.random.Generator,
        opset: int,
        const_inputs: Callable[[str], Sequence[int]] = lambda op: (),
        preferred: Sequence[np.dtype] = (),
    ) -> None:
        self.rng = rng
        self.opset = opset
        self.const_inputs = const_inputs
        self.preferred = tuple(preferred)
        self.values: dict[str, np.ndarray] = {}
        self.inputs: dict[str, np.ndarray] = {}
        self.consts: dict[str, np.ndarray] = {}
        self.nodes: list[onnx.NodeProto] = []
        self._count = 0

    # -- drawing ---------------------------------------------------------------------------

    def choice(self, options: Sequence[Any]) -> Any:
        return options[int(self.rng.integers(len(options)))]

    def maybe(self, p: float = 0.5) -> bool:
        return bool(self.rng.random() < p)

    def dim(self, lo: int = 1, hi: int = 5) -> int:
        """A dimension, often 1 (broadcasting, squeezing) and now and then 0 when ``lo`` is 0."""
        if lo == 0 and self.maybe(0.05):
            return 0
        lo = max(lo, 1)
        if lo <= 1 and self.maybe(0.25):
            return 1
        return self.int(lo, max(lo, hi))

    def shape(self, rank: int | None = None, *, lo: int = 0, hi: int = 5) -> tuple[int, ...]:
        if rank is None:
            rank = self.choice([0, 1, 1, 2, 2, 3, 3, 4])
        return tuple(self.dim(lo, hi) for _ in range(rank))

    def data(self, dtype: np.dtype, shape: Sequence[int], *, special: bool = True) -> np.ndarray:
        """Random contents: floats with NaN, infinities, signed zeros and ties now and then."""
        dtype, shape, rng = np.dtype(dtype), tuple(shape), self.rng
        if dtype == STR:
            return np.array(WORDS, dtype=object)[rng.integers(len(WORDS), size=shape)]
        if dtype == BOOL:
            return rng.random(shape) < 0.5
        if dtype.kind in "iu":
            info = np.iinfo(dtype)
            if self.maybe(0.15):
                lo, hi = info.min, info.max
            else:
                lo, hi = (0, 10) if dtype.kind == "u" else (-6, 6)
            return rng.integers(lo, hi, size=shape, endpoint=True, dtype=dtype)
        scale = self.choice([1.0, 1.0, 1.0, 3.0, 10.0, 0.1])
        x = rng.standard_normal(shape) * scale
        if self.maybe(0.2):
            x = np.round(x * 2) / 2  # ties for Round, nearest-pixel modes, comparisons
        x = np.asarray(x.astype(dtype))
        if special and x.ndim and x.size and self.maybe(0.25):
            # mostly a sprinkle; now and then so many that whole windows, rows and slices
            # are NaN or infinite (where a max, a pool or a comparison meets nothing else)
            rate = self.choice([0.15, 0.15, 0.15, 0.5, 0.9])
            mask = rng.random(shape) < rate
            specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0], dtype)
            if self.maybe(0.3):
                specials = np.array([np.nan, np.nan, -np.inf], dtype)
            x[mask] = specials[rng.integers(len(specials), size=int(mask.sum()))]
        return x

    # -- names -----------------------------------------------------------------------------

    def _name(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}{self._count}"

    def input(self, array: np.ndarray) -> str:
        """A new graph input fed ``array``."""
        name = self._name("x")
        self.inputs[name] = self.values[name] = np.asarray(array)
        return name

    def const(self, array: Any, dtype: Any = None) -> str:
        """A new initializer holding ``array``."""
        name = self._name("c")
        self.consts[name] = self.values[name] = np.asarray(array, dtype=dtype)
        return name

    def param(self, op: str, index: int, array: Any, dtype: Any = np.int64) -> str:
        """An op parameter (axes, pads, shape ...): an initializer, or now and then a graph
        input where the cpu kernel does not need it constant."""
        array = np.asarray(array, dtype=dtype)
        if index not in self.const_inputs(op) and self.maybe(0.15):
            return self.input(array)
        return self.const(array)

    def out(self) -> str:
        return self._name("v")

    def node(self, op: str, inputs: Sequence[str], n_out: int = 1, **attrs: Any) -> onnx.NodeProto:
        """A node with fresh output names; attributes given as ``None`` are left out."""
        attrs = {k: v for k, v in attrs.items() if v is not None}
        return helper.make_node(op, list(inputs), [self.out() for _ in range(n_out)], **attrs)

    # -- picking values --------------------------------------------------------------------

    def types(
        self, op: str, index: int = 0, *, among: Sequence[np.dtype] = DTYPES
    ) -> list[np.dtype]:
        """Dtypes input ``index`` of ``op`` may take, those onnxruntime runs listed first."""
        s = schema(op, self.opset)
        if s is None:
            raise Skip(op)
        formal = s.inputs[min(index, len(s.inputs) - 1)]
        allowed = [formal.type_str]
        for constraint in s.type_constraints:
            if constraint.type_param_str == formal.type_str:
                allowed = list(constraint.allowed_type_strs)
        dtypes = [d for d in type_dtypes(allowed) if d in among]
        if not dtypes:
            raise Skip(op)
        ort = ort_types(op, s.since_version)
        runs = [d for d in dtypes if _type_str(d) in ort or (d == F16 and "tensor(float)" in ort)]
        own = [d for d in runs if d in self.preferred]
        if own and self.maybe(0.9):
            return own
        if runs and self.maybe(0.9):
            return runs
        return dtypes

    def pick(
        self,
        dtypes: Sequence[np.dtype],
        rank: int | tuple[int, int] | None = None,
        *,
        fresh: float = 0.4,
        lo: int = 0,
        hi: int = 5,
        where: Callable[[np.ndarray], bool] | None = None,
    ) -> str:
        """An earlier value of one of ``dtypes`` and a rank in ``rank`` (``(lo, hi)`` or one
        rank), or with probability ``fresh`` (or when none fits) a new graph input."""
        ranks = (0, 5) if rank is None else (rank, rank) if isinstance(rank, int) else rank
        fits = [
            name
            for name, value in self.values.items()
            if value.dtype in dtypes
            and ranks[0] <= value.ndim <= ranks[1]
            and name not in self.consts
            and all(d >= lo for d in value.shape)
            and (where is None or where(value))
        ]
        if fits and not self.maybe(fresh):
            return self.choice(fits)
        r = self.int(*ranks) if rank is not None else self.choice([0, 1, 1, 2, 2, 3, 3, 4])
        r = max(ranks[0], min(r, ranks[1]))
        for _ in range(8):
            array = self.data(self.choice(list(dtypes)), self.shape(r, lo=lo, hi=hi))
            if where is None or where(array):
                return self.input(array)
        raise Skip("no value fits")

    def like(self, dtype: np.dtype, shape: Sequence[int], *, fresh: float = 0.5) -> str:
        """An earlier value of exactly this dtype and shape, or a new input."""
        shape = tuple(shape)
        fits = [
            n
            for n, v in self.values.items()
            if v.dtype == dtype and v.shape == shape and n not in self.consts
        ]
        if fits and not self.maybe(fresh):
            return self.choice(fits)
        return self.input(self.data(dtype, shape))

    def broadcast_shape(self, shape: Sequence[int]) -> tuple[int, ...]:
        """A shape that broadcasts with ``shape``: some dims made 1, leading dims dropped or
        added."""
        out = [1 if self.maybe(0.3) else d for d in shape]
        if out and self.maybe(0.3):
            out = out[self.int(1, len(out)) :]
        elif len(out) < 4 and self.maybe(0.15):
            out = [self.dim()] + out
        return tuple(out)

    def axes(self, rank: int, *, lo: int = 0, unique: bool = True) -> list[int]:
        """A random subset of ``range(rank)``, each axis maybe written negative."""
        count = self.int(min(lo, rank), rank)
        chosen = sorted(self.rng.choice(rank, size=count, replace=not unique).tolist())
        return [a - rank if self.maybe(0.3) else a for a in chosen]

    def axis(self, rank: int) -> int:
        a = self.int(0, rank - 1)
        return a - rank if self.maybe(0.3) else a

    def value(self, name: str) -> np.ndarray:
        return self.values[name]

    # last in the class: an annotation below it would name this method, not the builtin
    def int(self, lo: int, hi: int) -> int:
        """An integer in ``[lo, hi]``, both ends included."""
        return int(self.rng.integers(lo, hi + 1))


def _type_str(dtype: np.dtype) -> str:
    elem = helper.np_dtype_to_tensor_dtype(dtype)
    return f"tensor({onnx.TensorProto.DataType.Name(elem).lower()})"


def run_ort(
    nodes: Sequence[onnx.NodeProto], builder: Builder, outputs: Sequence[str]
) -> list[Any] | str:
    """onnxruntime's outputs of ``nodes`` on the builder's values, or why it refused them."""
    import onnxruntime as ort

    made = {o for n in nodes for o in n.output}
    used = [i for n in nodes for i in _all_inputs(n) if i and i not in made]
    inputs = {i: builder.values[i] for i in dict.fromkeys(used) if i not in builder.consts}
    consts = {i: builder.consts[i] for i in dict.fromkeys(used) if i in builder.consts}
    model = make_model(list(nodes), inputs, consts, list(outputs), builder.opset)
    try:
        options = ort.SessionOptions()
        options.log_severity_level = 4
        session = ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        return session.run(None, inputs)
    except Exception as exc:  # noqa: BLE001 - onnxruntime's refusal, reported as text
        return f"{type(exc).__name__}: {exc}"


def _all_inputs(node: onnx.NodeProto) -> list[str]:
    """A node's inputs, and the outer values its subgraphs capture."""
    names = list(node.input)
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            names += _captured(attr.g)
    return names


def _captured(graph: onnx.GraphProto) -> list[str]:
    made = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    out = []
    for node in graph.node:
        out += [i for i in _all_inputs(node) if i and i not in made]
        made |= set(node.output)
    return out

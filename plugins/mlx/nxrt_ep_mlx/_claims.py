"""Which nodes the mlx EP can run, and how they are grouped into claims.

A node is supported when its op has a translator at the node's opset, every
attribute is one the translator knows, its inputs and outputs have the
element types the op table allows, its shape-deciding inputs are constants,
and the op's own check passes. :func:`refusal` says why when it is not; the
EP's kernel-matching hook passes that reason on to the partition report.

Supported nodes are grouped greedily in the graph's (topological) order: a
node joins the claims of its producers, merging them, as long as every value
a claim reads from outside is produced *before the claim's first node*. Under
that rule the executor can run each claim where its first node stood, so no
claim can close a cycle, with the nodes outside or with another claim; a
producer that would break it starts a new claim instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
from onnx_ir import TensorType

from nxrt.kernel import attribute_values
from nxrt.registry import normalize_domain
from nxrt_ep_mlx.ops import MLX_OPS
from nxrt_ep_mlx.ops._registry import FLOATS, MlxOp

if TYPE_CHECKING:
    import onnx_ir as ir

_TYPE_NAMES = {1: "float32", 6: "int32", 7: "int64", 9: "bool", 10: "float16", 16: "bfloat16"}


def node_opset(node: ir.Node, opsets: Mapping[str, int]) -> int:
    """The opset a node follows: its own version if set, else the model's import."""
    if node.version is not None:
        return int(node.version)
    imports = {normalize_domain(d): v for d, v in opsets.items()}
    return int(imports.get(normalize_domain(node.domain), 0))


def constant_array(value: ir.Value) -> np.ndarray | None:
    """A value's data if it is known before any run: an initializer or a Constant's output."""
    if value.const_value is not None:
        return value.const_value.numpy()
    producer = value.producer()
    if producer is None or producer.op_type != "Constant" or normalize_domain(producer.domain):
        return None
    attrs = attribute_values(producer)
    if "value" in attrs:
        return np.asarray(attrs["value"])
    for name, dtype in (
        ("value_float", np.float32),
        ("value_floats", np.float32),
        ("value_int", np.int64),
        ("value_ints", np.int64),
    ):
        if name in attrs:
            return np.asarray(attrs[name], dtype)
    return None


def lookup(node: ir.Node, opset: int) -> MlxOp | None:
    if normalize_domain(node.domain):
        return None
    entry = MLX_OPS.lookup("", node.op_type, opset)
    return entry if isinstance(entry, MlxOp) else None


def is_used(value: ir.Value | None) -> bool:
    """A named output that some node or the graph reads."""
    return (
        value is not None and bool(value.name) and (bool(value.uses()) or value.is_graph_output())
    )


def _type_name(value: ir.Value) -> str:
    return _TYPE_NAMES.get(int(value.dtype), value.dtype.name) if value.dtype else "unknown"


def _types_text(types: Iterable[int]) -> str:
    return "/".join(sorted(_TYPE_NAMES.get(t, str(t)) for t in types))


def refusal(node: ir.Node, opset: int) -> str:
    """Why the mlx EP cannot run ``node`` ('' when it can)."""
    if normalize_domain(node.domain):
        return f"domain {node.domain!r} is not supported by mlx"
    entry = lookup(node, opset)
    if entry is None:
        if MLX_OPS.lookup("", node.op_type, 10**6) is None:
            return f"{node.op_type} is not supported by mlx"
        return f"{node.op_type} is not supported by mlx at opset {opset}"
    for name in node.attributes:
        if name not in entry.attributes or name.startswith("_"):
            return f"attribute {name!r} of {node.op_type} is not supported by mlx"
    for value in (*node.inputs, *node.outputs):
        if value is not None and value.type is not None and not isinstance(value.type, TensorType):
            return f"{value.name!r} is a {value.type}, not a tensor"
    for index, value in enumerate(node.inputs):
        if value is None:
            continue
        if index in entry.const_inputs:
            if constant_array(value) is None:
                return f"input {index} ({value.name!r}) must be a constant for mlx"
            continue
        allowed = entry.input_types.get(index, FLOATS)
        if value.dtype is None or int(value.dtype) not in allowed:
            return (
                f"input {index} ({value.name!r}) is {_type_name(value)}; "
                f"mlx takes {_types_text(allowed)} there"
            )
    used = [i for i, value in enumerate(node.outputs) if is_used(value)]
    if entry.max_outputs is not None and any(i >= entry.max_outputs for i in used):
        return f"output {max(used)} of {node.op_type} is not produced by mlx"
    for index in used:
        value = node.outputs[index]
        if value.dtype is None or int(value.dtype) not in entry.output_types:
            return (
                f"output {index} ({value.name!r}) is {_type_name(value)}; "
                f"mlx produces {_types_text(entry.output_types)} there"
            )
    if entry.check is not None:
        reason = entry.check(node, attribute_values(node))
        if reason:
            return f"{node.op_type} with {reason} is not supported by mlx"
    return ""


def claimable(nodes: Sequence[ir.Node], opsets: Mapping[str, int]) -> list[ir.Node]:
    """The nodes to claim: supported ones, except constant work only other EPs read.

    A node computed from constants alone is folded when its claim is
    compiled; if nothing mlx runs reads it, it is left to the next EP, whose
    session folds it once instead of a claim returning it on every run.
    """
    offered = {id(n) for n in nodes}
    supported = {id(n) for n in nodes if not refusal(n, node_opset(n, opsets))}
    static: set[int] = set()
    for node in nodes:
        if all(
            v is None or constant_array(v) is not None or id(v.producer()) in static
            for v in node.inputs
        ):
            static.add(id(node))
    chosen: set[int] = set()
    for node in reversed(list(nodes)):
        if id(node) not in supported:
            continue
        consumers = [c for c in node.successors()]
        if (
            id(node) not in static
            or not consumers
            or any(id(c) in chosen for c in consumers if id(c) in offered)
        ):
            chosen.add(id(node))
    return [n for n in nodes if id(n) in chosen]


class _Group:
    """Positions of a claim's nodes, its first position, and its outside producers."""

    __slots__ = ("external", "first", "members")

    def __init__(self, position: int, producers: set[int]) -> None:
        self.members = {position}
        self.first = position
        self.external = set(producers)

    def ok(self) -> bool:
        return not self.external or max(self.external) < self.first


def group(graph: ir.Graph, nodes: Sequence[ir.Node]) -> list[list[ir.Node]]:
    """Split ``nodes`` into weakly connected groups that are safe to contract (module doc)."""
    order = list(graph)
    position = {id(n): i for i, n in enumerate(order)}
    owner: dict[int, _Group] = {}
    for node in sorted(nodes, key=lambda n: position[id(n)]):
        here = position[id(node)]
        producers = {position[id(p)] for p in node.predecessors() if id(p) in position}
        touching = list({id(owner[p]): owner[p] for p in producers if p in owner}.values())
        placed = None
        if touching:
            placed = _merge(touching, here, producers, owner)
            if placed is None:
                for candidate in sorted(touching, key=lambda g: -len(g.members)):
                    placed = _merge([candidate], here, producers, owner)
                    if placed is not None:
                        break
        if placed is None:
            owner[here] = _Group(here, producers)
    groups = {id(g): g for g in owner.values()}.values()
    return [[order[i] for i in sorted(g.members)] for g in sorted(groups, key=lambda g: g.first)]


def _merge(
    groups: list[_Group], here: int, producers: set[int], owner: dict[int, _Group]
) -> _Group | None:
    """Join node ``here`` and ``groups`` into the largest of them, if the result is safe."""
    candidates = set(producers).union(*(g.external for g in groups))
    external = {e for e in candidates if not any(e in g.members for g in groups)}
    first = min(g.first for g in groups)
    if external and max(external) >= first:
        return None
    target = max(groups, key=lambda g: len(g.members))
    for other in groups:
        if other is not target:
            target.members |= other.members
            for member in other.members:
                owner[member] = target
    target.members.add(here)
    target.external = external
    target.first = first
    owner[here] = target
    return target

"""Which nodes the mlx EP can run, and which of them it claims.

A node is supported when its op has a translator at the node's opset, every
attribute is one the translator knows, its inputs and outputs have the
element types the op table allows, its shape-deciding inputs are constants,
and the op's own check passes. :func:`refusal` says why when it is not; the
EP's kernel-matching hook passes that reason on to the partition report.
:func:`claimable` then leaves out constant work that only other EPs read.
Grouping the claimable nodes into claims is core's
(:func:`nxrt.claims.group_claims`: maximal, and safe to contract).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from onnx_ir import TensorType

from nxrt.kernel import attribute_values
from nxrt.registry import normalize_domain
from nxrt_ep_mlx._graph import constant_array, is_used, node_opset
from nxrt_ep_mlx.ops import MLX_OPS
from nxrt_ep_mlx.ops._registry import FLOATS, MlxOp

if TYPE_CHECKING:
    import onnx_ir as ir

_TYPE_NAMES = {1: "float32", 6: "int32", 7: "int64", 9: "bool", 10: "float16", 16: "bfloat16"}


def lookup(node: ir.Node, opset: int) -> MlxOp | None:
    if normalize_domain(node.domain):
        return None
    entry = MLX_OPS.lookup("", node.op_type, opset)
    return entry if isinstance(entry, MlxOp) else None


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

"""Which nodes the mlx EP can run, and which of them it claims.

A node is supported when its op has a translator at the node's opset, every
attribute is one the translator knows, its inputs and outputs have the
element types the op table allows, its shape-deciding inputs are constants,
and the op's own check passes. :func:`refusal` says why when it is not; the
EP passes that reason on to the partition report. :func:`left_out` names the
supported nodes not worth claiming: constant work that only other EPs read.
Grouping the rest into claims is core's (:class:`nxrt.compiling.CompilingProvider`:
maximal, and safe to contract).
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Sequence
from typing import TYPE_CHECKING

from onnx_ir import TensorType

from nxrt.kernel import attribute_values
from nxrt.registry import normalize_domain
from nxrt_ep_mlx._graph import constant_array, is_used
from nxrt_ep_mlx.ops import MLX_OPS
from nxrt_ep_mlx.ops._registry import FLOATS, MlxOp

if TYPE_CHECKING:
    import onnx_ir as ir

_TYPE_NAMES = {1: "float32", 6: "int32", 7: "int64", 9: "bool", 10: "float16", 16: "bfloat16"}
#: Why a node mlx can run is in none of its claims.
LEFT_OUT = (
    "mlx runs whole claims only, and this node was left out of them "
    "(constant work that only other EPs read, or a refused claim)"
)


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


def left_out(nodes: Sequence[ir.Node], refused: Container[int]) -> list[ir.Node]:
    """The supported nodes not to claim: constant work that only other EPs read.

    A node computed from constants alone is folded when its claim is
    compiled; if nothing mlx runs reads it, it is left to the next EP, whose
    session folds it once instead of a claim returning it on every run.

    :param refused: The ids of the nodes mlx cannot run.
    """
    offered = {id(n) for n in nodes}
    static: set[int] = set()
    for node in nodes:
        if all(
            v is None or constant_array(v) is not None or id(v.producer()) in static
            for v in node.inputs
        ):
            static.add(id(node))
    chosen: set[int] = set()
    for node in reversed(list(nodes)):
        if id(node) in refused:
            continue
        consumers = [c for c in node.successors()]
        if (
            id(node) not in static
            or not consumers
            or any(id(c) in chosen for c in consumers if id(c) in offered)
        ):
            chosen.add(id(node))
    return [n for n in nodes if id(n) not in refused and id(n) not in chosen]

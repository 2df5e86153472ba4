"""What an ONNX Runtime provider can run, read from ORT's own kernel registry.

A node is supported when ORT knows its schema at the model's opset and the
provider registered a kernel for that schema version whose type constraints
accept the node's input and output types: the same lookup ORT's session does
when it assigns a node to a provider, done ahead of time so that nodes ORT
cannot run stay with other nxrt EPs. What ORT runs without a kernel of the
op's own is supported too: ``Constant`` (made an initializer), ops with an
ONNX function body whose ops it has kernels for (inlined), and float16 nodes
on the CPU provider that have a float32 kernel (ORT inserts Casts). Supported
nodes are then grouped into maximal weakly-connected sets that stay acyclic
once each is contracted into one node (core's :class:`nxrt.compiling.CompilingProvider`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from nxrt.claims import captured_values, nested_graphs
from nxrt.pipeline.model import type_string_of
from nxrt.registry import normalize_domain

if TYPE_CHECKING:
    import onnx_ir as ir

CPU_PROVIDER = "CPUExecutionProvider"


@dataclass(frozen=True)
class Formal:
    """One formal input or output of a schema."""

    name: str
    type_str: str
    variadic: bool


@dataclass(frozen=True)
class Schema:
    since: int
    inputs: tuple[Formal, ...]
    outputs: tuple[Formal, ...]


@dataclass(frozen=True)
class KernelDef:
    """One kernel a provider registered: a version range and its type constraints."""

    since: int
    end: int
    constraints: Mapping[str, frozenset[str]]


@functools.lru_cache(maxsize=1)
def ort_schemas() -> dict[tuple[str, str], list[Schema]]:
    """Every operator schema ORT knows (ONNX's and its own domains), by domain and op."""
    from onnxruntime.capi import _pybind_state as C

    def formals(params: Sequence[Any]) -> tuple[Formal, ...]:
        return tuple(Formal(p.name, p.typeStr, p.option.name == "Variadic") for p in params)

    table: dict[tuple[str, str], list[Schema]] = {}
    for s in C.get_all_operator_schema():
        key = (normalize_domain(s.domain), s.name)
        table.setdefault(key, []).append(
            Schema(s.since_version, formals(s.inputs), formals(s.outputs))
        )
    for versions in table.values():
        versions.sort(key=lambda schema: schema.since)
    return table


@functools.cache
def ort_kernel_defs(provider: str, library: bool = False) -> dict[tuple[str, str], list[KernelDef]]:
    """The kernels ORT registered for ``provider`` (a plugin library's when ``library``)."""
    from onnxruntime.capi import _pybind_state as C

    if library:
        raw = C.get_registered_ep_kernel_defs(provider)
    else:
        raw = [d for d in C.get_all_opkernel_def() if d.provider == provider]
    table: dict[tuple[str, str], list[KernelDef]] = {}
    for d in raw:
        constraints = {k: frozenset(v) for k, v in d.type_constraints.items()}
        since, end = d.version_range
        table.setdefault((normalize_domain(d.domain), d.op_name), []).append(
            KernelDef(since, end, constraints)
        )
    return table


class OrtCapability:
    """Answers "can this provider run this node?" with a reason when it cannot.

    :param provider: ORT's provider name, e.g. ``CPUExecutionProvider``.
    :param library: The provider comes from a plugin library registered by path.

    A provider that registers no kernels compiles whole subgraphs instead
    (TensorRT, most plugin libraries); ORT backs it with its CPU provider
    inside each claim's session, so the CPU kernels define what it can take.
    """

    def __init__(self, provider: str, *, library: bool = False) -> None:
        self.provider = provider
        kernels = ort_kernel_defs(provider, library)
        self.backing = provider
        self.on_cpu = provider == CPU_PROVIDER and not library
        if not kernels:
            kernels = ort_kernel_defs(CPU_PROVIDER)
            self.backing = f"{CPU_PROVIDER} (backing {provider}, which registers no kernels)"
            self.on_cpu = True
        self.kernels = kernels
        self.schemas = ort_schemas()

    def refusal(self, node: ir.Node, opsets: Mapping[str, int]) -> str:
        """Why ORT cannot run ``node`` ('' when it can)."""
        reason = self._kernel_refusal(node, opsets)
        if reason:
            return reason
        for value in node.inputs:
            if value is not None and value.name and _type_of(value) is None:
                if value.producer() is None and value.const_value is None:
                    return f"input {value.name!r} has no type, and ORT needs one for its inputs"
        return self._subgraph_refusal(node, opsets) if node.attributes else ""

    def _kernel_refusal(self, node: ir.Node, opsets: Mapping[str, int], depth: int = 0) -> str:
        domain = normalize_domain(node.domain)
        name = f"{domain or 'ai.onnx'}::{node.op_type}"
        opset = opsets.get(domain, 0)
        if not opset:
            return f"the model imports no opset for domain {domain or 'ai.onnx'!r}"
        schema = self._schema(domain, node.op_type, opset)
        if schema is None:
            return f"ONNX Runtime knows no schema for {name} at opset {opset}"
        if (domain, node.op_type) == ("", "Constant"):
            return ""  # ORT turns Constant nodes into initializers; no kernel runs them
        defs = [
            k
            for k in self.kernels.get((domain, node.op_type), ())
            if k.since <= schema.since <= k.end
        ]
        if not defs:
            reason = f"ONNX Runtime's {self.backing} has no kernel for {name} at opset {opset}"
            expanded = self._function_refusal(node, domain, opset, depth)
            if expanded is None:
                return reason
            return f"{reason}, nor for its function body's {expanded}" if expanded else ""
        if any(_types_accepted(k, schema, node) for k in defs):
            return ""
        # ORT's CPU provider runs float16 nodes it has no float16 kernel for in float32,
        # with Casts it inserts around them (its InsertCastTransformer).
        if self.on_cpu and any(_types_accepted(k, schema, node, as_float=True) for k in defs):
            return ""
        types = ", ".join(_type_of(v) or "?" for v in node.inputs if v is not None)
        return f"ONNX Runtime's {self.backing} has no {name} kernel for input types {types}"

    def _function_refusal(self, node: ir.Node, domain: str, opset: int, depth: int) -> str | None:
        """For an op without a kernel: ORT inlines its ONNX function body, if it has one.

        Returns '' when every op of the body is supported, the first refusal
        otherwise, and ``None`` when there is no body to inline.
        """
        import onnx
        import onnx_ir as ir

        if depth > 3:
            return None
        try:
            # Any: onnx's stub of OpSchema leaves out its function_* members
            schema: Any = onnx.defs.get_schema(node.op_type, opset, domain)
            static = [v for v in schema.function_opset_versions if v <= opset]
            dependent = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
            if static:
                blob = schema.get_function_with_opset_version(max(static))
            elif dependent:
                if depth:
                    return ""  # inside a body: ORT expands it with the types it infers there
                if any(v is not None and _type_of(v) is None for v in node.inputs):
                    return None
                types = [
                    ir.serde.serialize_type(cast(ir.TypeProtocol, v.type)).SerializeToString()
                    if v is not None
                    else onnx.TypeProto().SerializeToString()
                    for v in node.inputs
                ]
                node_bytes = ir.serde.serialize_node(node).SerializeToString()
                blob = schema.get_context_dependent_function_with_opset_version(
                    max(dependent), node_bytes, types
                )
            else:
                return None
            if not blob:
                return None
            body = onnx.FunctionProto()
            body.ParseFromString(blob)
        except Exception:  # noqa: BLE001 - no usable body: the op is simply unsupported
            return None
        body_opsets = {normalize_domain(o.domain): int(o.version) for o in body.opset_import}
        for proto in body.node:
            # Only the op and its arity matter here: body values carry no types.
            inputs = [ir.Value(name=name) if name else None for name in proto.input]
            inner = ir.Node(proto.domain, proto.op_type, inputs, num_outputs=len(proto.output))
            reason = self._kernel_refusal(inner, body_opsets, depth + 1)
            if reason:
                return f"{inner.op_type}: {reason}"
        return ""

    def _schema(self, domain: str, op_type: str, opset: int) -> Schema | None:
        found = None
        for schema in self.schemas.get((domain, op_type), ()):
            if schema.since > opset:
                break
            found = schema
        return found

    def _subgraph_refusal(self, node: ir.Node, opsets: Mapping[str, int]) -> str:
        """Subgraph ops are supported when every inner node is, and what they capture can come.

        A claim is given only its nodes' explicit inputs, so a value a subgraph
        reads from the enclosing graph reaches the standalone model only as an
        initializer or as the output of a node in the same claim (checked per
        claim by :func:`boundary_refusals`); never as a graph input.
        """
        graphs = nested_graphs(node)
        for graph in graphs:
            for inner in graph:
                reason = self._kernel_refusal(inner, opsets)
                if reason:
                    return f"subgraph node {inner.name or inner.op_type!r}: {reason}"
        for value in captured_values(node, graphs):
            if value.const_value is None and value.producer() is None:
                return f"a subgraph reads the graph input {value.name!r} from the enclosing graph"
        return ""


def _type_of(value: ir.Value) -> str | None:
    if value.type is None:
        return None
    type_str = type_string_of(value.type)
    return None if "undefined" in type_str else type_str


def _types_accepted(
    kernel: KernelDef, schema: Schema, node: ir.Node, *, as_float: bool = False
) -> bool:
    """Whether the node's types fit the kernel's constraints (ORT's own matching rule).

    A constraint is keyed by a formal parameter's type variable (``T``) or by
    its name (``shape``); values of unknown type are left to ORT to decide.
    """
    for formals, actuals in ((schema.inputs, node.inputs), (schema.outputs, node.outputs)):
        for i, value in enumerate(actuals):
            if value is None or not value.name:
                continue
            if i < len(formals):
                formal = formals[i]
            elif formals and formals[-1].variadic:
                formal = formals[-1]
            else:
                continue
            allowed = kernel.constraints.get(formal.type_str)
            if allowed is None:
                allowed = kernel.constraints.get(formal.name)
            actual = _type_of(value)
            if as_float and actual == "tensor(float16)":
                actual = "tensor(float)"
            if allowed is not None and actual is not None and actual not in allowed:
                return False
    return True


#: Types ORT's Python API cannot hand over: sub-byte tensors, packed in ORT but not in numpy.
UNEXCHANGEABLE_TYPES = frozenset(
    f"tensor({t})" for t in ("int4", "uint4", "int2", "uint2", "float4e2m1")
)


def unexchangeable(kind: str | None) -> bool:
    """Whether a value of this type cannot cross a claim's boundary: a packed sub-byte
    tensor, or a map (nxrt's own type, which a claim's standalone model cannot declare)."""
    return kind is not None and (kind in UNEXCHANGEABLE_TYPES or "map(" in kind)


def boundary_refusals(nodes: Sequence[ir.Node]) -> dict[int, str]:
    """Nodes of a group (by id) whose values cannot cross the claim's boundary, and why.

    ORT needs a type for every graph input of the standalone model, and its
    Python API cannot exchange packed sub-byte tensors, nor can a claim's model
    declare a map; such nodes are left to other EPs and the group is formed
    again without them.
    """
    inside = {id(n) for n in nodes}
    refusals: dict[int, str] = {}
    for node in nodes:
        for value in node.inputs:
            if value is None or not value.name or value.const_value is not None:
                continue
            producer = value.producer()
            if producer is not None and id(producer) in inside:
                continue
            kind = _type_of(value)
            if kind is None:
                refusals[id(node)] = (
                    f"reads {value.name!r}, of unknown type, from outside its claim"
                )
            elif unexchangeable(kind):
                refusals[id(node)] = f"reads {value.name!r} ({kind}) across the claim's boundary"
        for value in captured_values(node) if node.attributes else ():
            producer = value.producer()
            if value.const_value is None and (producer is None or id(producer) not in inside):
                refusals[id(node)] = f"a subgraph reads {value.name!r}, made outside its claim"
        for value in node.outputs:
            if not unexchangeable(_type_of(value)):
                continue
            leaves = value.is_graph_output() or any(id(u) not in inside for u, _ in value.uses())
            if leaves:
                refusals[id(node)] = f"writes {value.name!r} ({_type_of(value)}) out of its claim"
    return refusals

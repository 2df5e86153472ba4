"""What every compiling EP needs: cycle-safe claims and a claim as a model of its own.

An EP that compiles subgraphs (mlx, legacy_abi, openvino, a third-party one)
answers one question per node, "can I run it?", and leaves the rest here:

- :func:`maximal_claims` groups the supported nodes into maximal weakly
  connected sets that stay acyclic once each is contracted into one node,
  dropping nodes whose values cannot cross a claim's boundary when the EP
  says so, and returns every refusal with its reason;
- :func:`standalone_model` extracts a claim into an ``onnx.ModelProto``
  (boundary values as graph inputs and outputs with their types, the
  initializers it reads, values captured by its subgraphs, the model's
  opsets), the form ONNX Runtime and OpenVINO read;
- :func:`claim_boundary` names the values crossing a claim's boundary (the
  host fills ``SubgraphClaim.inputs`` / ``outputs`` with it).

The host still checks each accepted claim against the graph with every
earlier claim contracted (``nxrt.pipeline.partition``), so a claim built here is safe
on its own and among the claims of other EPs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, cast

import numpy as np

from nxrt.subgraph import subgraphs_of

if TYPE_CHECKING:
    import onnx
    import onnx_ir as ir

    from nxrt.kernel import SubgraphClaim

#: The ``location`` of an initializer that :func:`standalone_model` leaves out of the
#: model's bytes; the EP hands the array over in memory.
IN_MEMORY_LOCATION = "nxrt-in-memory"

#: Why a node cannot be claimed ('' when it can).
Refusal = Callable[["ir.Node"], str]
#: Nodes of a candidate claim (by ``id``) that must leave it, and why.
BoundaryCheck = Callable[[Sequence["ir.Node"]], dict[int, str]]


def nested_graphs(node: ir.Node) -> list[ir.Graph]:
    """Every graph nested in a node's attributes, at any depth."""
    found: list[ir.Graph] = []
    for graph in subgraphs_of(node):
        found.append(graph)
        for inner in graph:
            found.extend(nested_graphs(inner))
    return found


def captured_values(node: ir.Node, graphs: Sequence[ir.Graph] | None = None) -> list[ir.Value]:
    """Values of enclosing graphs that a node's subgraphs read (implicit inputs)."""
    graphs = nested_graphs(node) if graphs is None else graphs
    inside = {id(g) for g in graphs}
    seen: dict[int, ir.Value] = {}
    for graph in graphs:
        for inner in graph:
            for value in inner.inputs:
                if value is not None and value.name and id(value.graph) not in inside:
                    seen.setdefault(id(value), value)
    return list(seen.values())


def node_inputs(node: ir.Node) -> list[ir.Value]:
    """Explicit inputs, then values captured by subgraphs."""
    values = [v for v in node.inputs if v is not None and v.name]
    return values + captured_values(node) if node.attributes else values


class _Groups:
    """Union-find over group ids, each with the groups that reach it from outside."""

    def __init__(self) -> None:
        self.parent: list[int] = []
        self.outside: list[set[int]] = []  # groups that reach a member along a path leaving them

    def new(self) -> int:
        self.parent.append(len(self.parent))
        self.outside.append(set())
        return len(self.parent) - 1

    def find(self, g: int) -> int:
        while self.parent[g] != g:
            self.parent[g] = self.parent[self.parent[g]]
            g = self.parent[g]
        return g

    def reaches_from_outside(self, source: int, target: int) -> bool:
        return any(self.find(g) == source for g in self.outside[target])

    def union(self, a: int, b: int) -> int:
        self.parent[b] = a
        self.outside[a] |= self.outside[b]
        return a


def group_claims(
    graph_nodes: Sequence[ir.Node], supported: Iterable[ir.Node]
) -> list[list[ir.Node]]:
    """Maximal weakly-connected sets of ``supported`` nodes that are safe to contract.

    Contracting a set into one node creates a cycle exactly when a path leaves
    the set and comes back into it. Walking the graph in topological order,
    each node records the groups that reach it along a path that has left
    them; a supported node joins (and merges) the groups of its supported
    producers unless one of them reaches it that way, or two of them reach
    each other so. Edges include values captured by subgraphs.

    :param graph_nodes: Every node of the graph, in topological order.
    :param supported: The nodes that may be claimed.
    """
    supported_ids = {id(n) for n in supported}
    position = {id(n): i for i, n in enumerate(graph_nodes)}
    groups = _Groups()
    group_of: list[int | None] = [None] * len(graph_nodes)
    reached_by: list[set[int]] = [set() for _ in graph_nodes]
    for i, node in enumerate(graph_nodes):
        preds = []
        for value in node_inputs(node):
            producer = value.producer()
            if producer is not None and id(producer) in position:
                preds.append(position[id(producer)])
        base = {groups.find(g) for p in preds for g in reached_by[p]}
        mine: int | None = None
        if id(node) in supported_ids:
            candidates = {groups.find(g) for p in preds if (g := group_of[p]) is not None}
            for g in sorted(candidates - base):
                if mine is None:
                    mine = g
                elif not groups.reaches_from_outside(g, mine) and not (
                    groups.reaches_from_outside(mine, g)
                ):
                    mine = groups.union(mine, g)
            if mine is None:
                mine = groups.new()
            group_of[i] = mine
            groups.outside[mine] |= base
        reach = set(base)
        for p in preds:
            group = group_of[p]
            if group is not None:
                g = groups.find(group)
                if g != mine:
                    reach.add(g)
        reached_by[i] = reach
    members: dict[int, list[ir.Node]] = {}
    for i, node in enumerate(graph_nodes):
        group = group_of[i]
        if group is not None:
            members.setdefault(groups.find(group), []).append(node)
    return list(members.values())


def maximal_claims(
    graph: ir.Graph,
    nodes: Sequence[ir.Node],
    refusal: Refusal,
    boundary: BoundaryCheck | None = None,
) -> tuple[list[list[ir.Node]], dict[int, str]]:
    """Group the nodes an EP can run into maximal cycle-safe claims.

    :param graph: The graph the nodes belong to.
    :param nodes: The nodes offered to the EP (``nxrt_claim_subgraphs``'s ``nodes``).
    :param refusal: Why the EP cannot run a node ('' when it can).
    :param boundary: Optional: for a candidate claim, the nodes that must leave
        it because a value they exchange cannot cross the claim's boundary;
        the claims are then formed again without them, until none must leave.
    :returns: The node lists of the claims, in graph order, and the reason
        for every node offered but left out (by ``id(node)``), which the EP's
        ``nxrt_match_kernel`` passes on to the partition report.
    """
    refusals: dict[int, str] = {}
    supported = []
    for node in nodes:
        reason = refusal(node)
        if reason:
            refusals[id(node)] = reason
        else:
            supported.append(node)
    everything = list(graph)
    while True:
        groups = group_claims(everything, supported)
        if boundary is None:
            return groups, refusals
        crossing = {k: v for group in groups for k, v in boundary(group).items()}
        if not crossing:
            return groups, refusals
        refusals.update(crossing)
        supported = [n for n in supported if id(n) not in crossing]


def claim_boundary(claim: SubgraphClaim, graph: ir.Graph) -> tuple[list[str], list[str]]:
    """The value names a claim reads from outside and those read after it."""
    inside = {id(n) for n in claim.nodes}
    produced = {v.name for n in claim.nodes for v in n.outputs if v.name}
    graph_outputs = {v.name for v in graph.outputs}
    inputs: list[str] = []
    outputs: list[str] = []
    for node in claim.nodes:
        for value in node.inputs:
            if value is not None and value.name and value.name not in produced:
                if value.name not in inputs:
                    inputs.append(value.name)
        for value in node.outputs:
            if not value.name:
                continue
            used_outside = any(id(user) not in inside for user, _ in value.uses())
            if (used_outside or value.name in graph_outputs) and value.name not in outputs:
                outputs.append(value.name)
    return inputs, outputs


def is_weight(value: ir.Value) -> bool:
    """An initializer whose data is known at session creation."""
    return value.is_initializer() and value.const_value is not None


def standalone_model(
    claim: SubgraphClaim,
    graph: ir.Graph,
    *,
    external_threshold: int | None = None,
    producer_name: str = "nxrt",
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The claim as a model of its own, and the initializers left out of its bytes.

    Graph inputs are the claim's boundary inputs that are not initializers;
    initializers it reads (also through subgraphs) are copied in, or, when at
    least ``external_threshold`` bytes of a plain numpy dtype, declared as
    external data at :data:`IN_MEMORY_LOCATION` and returned separately so
    the EP can hand over nxrt's array without a copy. The IR version is at
    least 4, so the initializers are constants a backend may fold.
    """
    import onnx_ir as ir
    from onnx import helper

    values: dict[str, ir.Value] = {}
    for node in claim.nodes:
        for value in [*node_inputs(node), *node.outputs]:
            if value is not None and value.name:
                values.setdefault(value.name, value)
    initializers: list[onnx.TensorProto] = []
    external: dict[str, np.ndarray] = {}
    graph_inputs: list[onnx.ValueInfoProto] = []
    for name, value in values.items():
        if not is_weight(value):
            continue
        tensor = value.const_value
        assert tensor is not None  # is_weight
        if external_threshold is not None and tensor.nbytes >= external_threshold:
            array = tensor.numpy()
            if isinstance(array, np.ndarray) and array.dtype.kind in "biuf":
                external[name] = np.ascontiguousarray(array)
                initializers.append(_in_memory_tensor(name, value))
                continue
        proto = ir.serde.serialize_tensor(tensor)
        proto.name = name
        initializers.append(proto)
    for name in claim.inputs:
        value = values.get(name)
        if value is not None and not is_weight(value):
            graph_inputs.append(ir.serde.serialize_value(value))
    graph_outputs = [ir.serde.serialize_value(values[name]) for name in claim.outputs]
    nodes = [ir.serde.serialize_node(node) for node in claim.nodes]
    opsets = [
        helper.make_opsetid(domain, version) for domain, version in graph.opset_imports.items()
    ]
    body = helper.make_graph(
        nodes, claim.name or f"{producer_name}_claim", graph_inputs, graph_outputs, initializers
    )
    ir_version = max(4, helper.find_min_ir_version_for(opsets, ignore_unknown=True))
    model = helper.make_model(body, opset_imports=opsets, ir_version=ir_version)
    model.producer_name = producer_name
    return model, external


def _in_memory_tensor(name: str, value: ir.Value) -> onnx.TensorProto:
    import onnx

    tensor = value.const_value
    assert tensor is not None  # a weight's
    proto = onnx.TensorProto()
    proto.name = name
    proto.data_type = int(tensor.dtype)
    proto.dims.extend(int(d) for d in cast("Sequence[int]", tensor.shape))
    proto.data_location = onnx.TensorProto.EXTERNAL
    entry = proto.external_data.add()
    entry.key, entry.value = "location", IN_MEMORY_LOCATION
    return proto

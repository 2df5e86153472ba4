"""Partitioning: which EP runs each node, and why the others refused it.

Each node goes to the first EP, in the session's priority order, whose claim
covers it or whose kernel matches it. Placement is never silent: the
:class:`PartitionReport` lists every node's EP, the partitions, the copies
between devices, and each refusal by the EPs ahead of the winner.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from nxrt.claims import claim_boundary, node_inputs
from nxrt.errors import InvalidPlacement, NoEpForNodes
from nxrt.kernel import SubgraphClaim
from nxrt.pipeline.model import opset_of
from nxrt.registry import KernelMatch, normalize_domain

if TYPE_CHECKING:
    import onnx_ir as ir

    from nxrt.host import Host
    from nxrt.pipeline.selection import SelectionReport
    from nxrt.provider import ExecutionProvider


@dataclass
class NodePlacement:
    """Where one node runs, and what the EPs ahead of it answered."""

    node: str
    op_type: str
    ep: str
    claim: str = ""
    refusals: list[tuple[str, str]] = field(default_factory=list)
    match: KernelMatch | None = None
    domain: str = ""


@dataclass(frozen=True)
class Copy:
    """A value moved between devices before a node can read it."""

    value: str
    from_device: str
    to_device: str
    to_ep: str


@dataclass
class PartitionReport:
    """The placement of a whole graph, as ``session.get_partition()`` returns it."""

    providers: list[str]
    nodes: list[NodePlacement] = field(default_factory=list)
    claims: list[SubgraphClaim] = field(default_factory=list)
    refused_claims: list[tuple[str, str]] = field(default_factory=list)
    copies: list[Copy] = field(default_factory=list)
    folded: list[tuple[str, str]] = field(default_factory=list)  # (node, op) computed at creation
    fused: list[tuple[str, str]] = field(default_factory=list)  # (node, node it was fused into)
    #: How the EPs were chosen when the caller gave no providers (nxrt.pipeline.selection).
    selection: SelectionReport | None = None

    @property
    def partitions(self) -> list[tuple[str, list[str]]]:
        """Runs of consecutive nodes on one EP (a claim is always one partition)."""
        runs: list[tuple[str, list[str]]] = []
        last_key: tuple[str, str] | None = None
        for placement in self.nodes:
            key = (placement.ep, placement.claim)
            if key != last_key:
                runs.append((placement.ep, []))
                last_key = key
            runs[-1][1].append(placement.node)
        return runs

    def nodes_per_ep(self) -> dict[str, int]:
        counts = dict.fromkeys(self.providers, 0)
        for placement in self.nodes:
            counts[placement.ep] = counts.get(placement.ep, 0) + 1
        return counts

    def fallbacks(self) -> list[NodePlacement]:
        """Nodes that some EP ahead of the winner refused."""
        return [p for p in self.nodes if p.refusals]

    def to_dict(self) -> dict[str, Any]:
        return {
            "providers": self.providers,
            "nodes_per_ep": self.nodes_per_ep(),
            "partitions": [{"ep": ep, "nodes": nodes} for ep, nodes in self.partitions],
            "copies": [vars(c) for c in self.copies],
            "folded": [node for node, _ in self.folded],
            "fused": [{"node": node, "into": into} for node, into in self.fused],
            "fallbacks": [
                {"node": p.node, "op_type": p.op_type, "ep": p.ep, "refused_by": p.refusals}
                for p in self.fallbacks()
            ],
            "refused_claims": self.refused_claims,
            "selection": self.selection.to_dict() if self.selection is not None else None,
        }

    def __str__(self) -> str:
        lines = self.selection.lines() if self.selection is not None else []
        lines.append("EP          nodes")
        for ep, count in self.nodes_per_ep().items():
            lines.append(f"{ep:<11} {count}")
        parts = self.partitions
        folded = len(self.folded)
        lines.append(f"{len(parts)} partition(s), {len(self.copies)} copy(ies)")
        if folded:
            lines.append(f"{folded} node(s) folded into constants at session creation")
        if self.fused:
            lines.append(f"{len(self.fused)} node(s) fused into the node before them")
        for i, (ep, nodes) in enumerate(parts):
            shown = ", ".join(nodes[:4]) + (f", ... ({len(nodes)} nodes)" if len(nodes) > 4 else "")
            lines.append(f"  [{i}] {ep}: {shown}")
        for copy in self.copies:
            lines.append(f"  copy {copy.value}: {copy.from_device} -> {copy.to_device}")
        for placement in self.fallbacks():
            why = "; ".join(f"{ep}: {reason}" for ep, reason in placement.refusals)
            lines.append(
                f"  fallback {placement.node} ({placement.op_type}) -> {placement.ep}: {why}"
            )
        for claim, reason in self.refused_claims:
            lines.append(f"  refused claim {claim}: {reason}")
        return "\n".join(lines)


@dataclass(frozen=True)
class Placement:
    """What the planner needs: per node (by position) its EP, or its claim; and the
    placement's part of the session's report (nodes, claims, refused claims)."""

    report: PartitionReport
    node_ep: Sequence[str]
    node_claim: Sequence[int | None]
    matches: Sequence[KernelMatch | None]


def partition(
    model: ir.Model,
    eps: Sequence[tuple[ExecutionProvider, str]],
    host: Host,
    graph: ir.Graph | None = None,
    preplaced: dict[int, SubgraphClaim] | None = None,
) -> Placement:
    """Place every node of ``graph`` (default: the main graph) on one of ``eps``, in order.

    ``preplaced`` maps ``id(node)`` to a precompiled claim (an EPContext node
    loaded by its EP); those nodes are placed before any EP is asked.
    """
    graph = graph if graph is not None else model.graph
    nodes = list(graph)
    position = {id(n): i for i, n in enumerate(nodes)}
    report = PartitionReport([ep.id for ep, _ in eps])
    opsets = {normalize_domain(d): int(v) for d, v in model.opset_imports.items()}
    node_ep: list[str | None] = [None] * len(nodes)
    node_claim: list[int | None] = [None] * len(nodes)
    matches: list[KernelMatch | None] = [None] * len(nodes)
    refusals: list[list[tuple[str, str]]] = [[] for _ in nodes]
    for i, node in enumerate(nodes):
        claim = (preplaced or {}).get(id(node))
        if claim is not None:
            node_ep[i], node_claim[i] = claim.ep, len(report.claims)
            report.claims.append(claim)

    edges = Edges(nodes)
    for ep, owner in eps:
        free = [n for n in nodes if node_ep[position[id(n)]] is None]
        for claim in host.claim_subgraphs(ep, owner, graph, free, opsets):
            reason = check_claim(claim, nodes, position, node_ep, edges, node_claim)
            if reason:
                report.refused_claims.append((claim.name or ep.id, reason))
                continue
            claim.ep = ep.id
            claim.name = claim.name or f"{ep.id}_{len(report.claims)}"
            claim.inputs, claim.outputs = claim_boundary(claim, graph)
            for node in claim.nodes:
                node_ep[position[id(node)]] = ep.id
                node_claim[position[id(node)]] = len(report.claims)
            report.claims.append(claim)
        for i, node in enumerate(nodes):
            if node_ep[i] is not None:
                continue
            match = host.match_kernel(ep, owner, node, opset_of(model, node.domain))
            if match.supported:
                node_ep[i], matches[i] = ep.id, match
            else:
                refusals[i].append((ep.id, match.reason))

    unplaced = [
        (
            cast(str, node.name),
            node.domain or "ai.onnx",
            node.op_type,
            opset_of(model, node.domain),
            "; ".join(f"{ep}: {reason}" for ep, reason in refusals[i]) or "no EP",
        )
        for i, node in enumerate(nodes)
        if node_ep[i] is None
    ]
    if unplaced:  # every node no EP can run, at once (a NoEpForOp for the first)
        raise NoEpForNodes(unplaced)
    for i, node in enumerate(nodes):
        claim_index = node_claim[i]
        report.nodes.append(
            NodePlacement(
                cast(str, node.name),
                node.op_type,
                cast(str, node_ep[i]),  # all placed: unplaced nodes raised above
                claim=report.claims[claim_index].name if claim_index is not None else "",
                refusals=refusals[i],
                match=matches[i],
                domain=normalize_domain(node.domain),
            )
        )
    placed = cast("list[str]", node_ep)  # all placed: unplaced nodes raised above
    return Placement(report, tuple(placed), tuple(node_claim), tuple(matches))


class Edges:
    """Producer -> consumer edges between a graph's nodes, by position.

    Values that a node's subgraphs capture from the graph count as inputs of
    that node, so a claim and a control-flow node reading its result are
    ordered correctly.
    """

    def __init__(self, nodes: Sequence[ir.Node]) -> None:
        position = {id(n): i for i, n in enumerate(nodes)}
        self.preds: list[set[int]] = [set() for _ in nodes]
        self.succs: list[set[int]] = [set() for _ in nodes]
        for i, node in enumerate(nodes):
            for value in node_inputs(node):
                producer = value.producer()
                j = position.get(id(producer)) if producer is not None else None
                if j is not None and j != i:
                    self.preds[i].add(j)
                    self.succs[j].add(i)


def schedule(placement: Placement, nodes: list[ir.Node]) -> list[int]:
    """Node positions in run order, each claim contracted into one unit.

    A claim runs where all it reads is ready, which need not be where its
    first node stands; this is Kahn's order over the contracted graph,
    keeping the graph's own order wherever it is free to. A claim appears
    once, as the position of its first node. Claims that depend on each
    other in a cycle cannot be ordered: :class:`InvalidPlacement` names them.
    """
    import heapq

    edges = Edges(nodes)
    unit = [
        ("claim", c) if c is not None else ("node", i) for i, c in enumerate(placement.node_claim)
    ]
    first: dict[tuple[str, int], int] = {}
    for i, key in enumerate(unit):
        first.setdefault(key, i)
    depends: dict[tuple[str, int], set[tuple[str, int]]] = {key: set() for key in first}
    for i in range(len(nodes)):
        for j in edges.preds[i]:
            if unit[j] != unit[i]:
                depends[unit[i]].add(unit[j])
    users: dict[tuple[str, int], list[tuple[str, int]]] = {key: [] for key in first}
    for key, deps in depends.items():
        for dep in deps:
            users[dep].append(key)
    pending = {key: len(deps) for key, deps in depends.items()}
    ready = [(first[key], key) for key, count in pending.items() if count == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        index, key = heapq.heappop(ready)
        order.append(index)
        for user in users[key]:
            pending[user] -= 1
            if pending[user] == 0:
                heapq.heappush(ready, (first[user], user))
    if len(order) != len(first):
        stuck = sorted({key[1] for key, count in pending.items() if count and key[0] == "claim"})
        claims = placement.report.claims
        raise InvalidPlacement(
            [claims[c].name or claims[c].ep for c in stuck],
            f"{len(first) - len(order)} of {len(first)} units were never ready",
        )
    return order


def check_claim(
    claim: SubgraphClaim,
    nodes: list[ir.Node],
    position: dict[int, int],
    node_ep: list[str | None],
    edges: Edges | None = None,
    node_claim: Sequence[int | None] = (),
) -> str:
    """Why a claim cannot be accepted ('' when it can).

    ``node_claim`` gives the earlier accepted claim of each node (by
    position), which the cycle check contracts too: two claims can each be
    acyclic and still form a cycle between them.
    """
    if not claim.nodes:
        return "the claim is empty"
    members: set[int] = set()
    for node in claim.nodes:
        if id(node) not in position:
            return f"node {node.name!r} is not in the main graph"
        if node_ep[position[id(node)]] is not None:
            return f"node {node.name!r} is already placed on {node_ep[position[id(node)]]}"
        members.add(position[id(node)])
    earlier: dict[int, set[int]] = {}
    for i, c in enumerate(node_claim):
        if c is not None:
            earlier.setdefault(c, set()).add(i)
    if creates_cycle(members, nodes, position, edges, list(earlier.values())):
        return "contracting the claim into one node would create a cycle" + (
            " with the claims accepted before it" if earlier else ""
        )
    return ""


def creates_cycle(
    members: set[int],
    nodes: list[ir.Node],
    position: dict[int, int],
    edges: Edges | None = None,
    contracted: Sequence[set[int]] = (),
) -> bool:
    """True if a path leaves the claim and comes back into it.

    Each set in ``contracted`` (earlier claims, by position) counts as one
    node: reaching any of its members reaches all of their successors.
    """
    edges = edges or Edges(nodes)
    group_of = {i: k for k, group in enumerate(contracted) for i in group}
    expanded: set[int] = set()
    seen: set[int] = set()
    frontier = [j for m in members for j in edges.succs[m] if j not in members]
    while frontier:
        i = frontier.pop()
        if i in members:
            return True
        if i in seen:
            continue
        seen.add(i)
        reached = [i]
        k = group_of.get(i)
        if k is not None and k not in expanded:
            expanded.add(k)
            reached = list(contracted[k])
            seen.update(reached)
        for r in reached:
            frontier.extend(edges.succs[r])
    return False

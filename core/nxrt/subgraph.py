"""Subgraphs of control-flow ops (If, Loop, Scan...): compiled once, called by kernels.

A graph attribute reaches a kernel as a :class:`Subgraph`, a callable that
runs its own plan: ``then_branch()``, ``body(i, cond, *state)``. A subgraph
may read values of the graphs around it (outer scope); the step of the node
that owns it lists those values as extra inputs, and :class:`ScopedKernel`
makes them visible to the subgraph for the duration of that one call through
a context variable, so concurrent runs never see each other's values.
"""

from __future__ import annotations

import contextvars
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from nxrt.kernel import Kernel

if TYPE_CHECKING:
    import onnx_ir as ir

#: Outer-scope values visible to the subgraphs of the node being computed.
OUTER_SCOPE: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("nxrt_outer_scope")

GRAPH_ATTRIBUTES = ("GRAPH", "GRAPHS")


def subgraphs_of(node: ir.Node) -> list[ir.Graph]:
    """The graphs held in a node's attributes."""
    graphs: list[ir.Graph] = []
    for attr in node.attributes.values():
        if attr.type.name == "GRAPH":
            graphs.append(attr.value)
        elif attr.type.name == "GRAPHS":
            graphs.extend(attr.value)
    return graphs


def outer_names(graph: ir.Graph) -> list[str]:
    """Names ``graph`` (or a graph nested in it) reads but does not define, in first-use order."""
    defined = {v.name for v in graph.inputs} | set(graph.initializers)
    for node in graph:
        defined.update(v.name for v in node.outputs if v.name)
    used: list[str] = []
    for node in graph:
        names = [v.name for v in node.inputs if v is not None and v.name]
        for inner in subgraphs_of(node):
            names.extend(outer_names(inner))
        for name in names:
            if name not in defined and name not in used:
                used.append(name)
    return used


def implicit_inputs(node: ir.Node) -> list[str]:
    """Outer-scope names the subgraphs of ``node`` read."""
    names: list[str] = []
    for graph in subgraphs_of(node):
        for name in outer_names(graph):
            if name not in names:
                names.append(name)
    return names


class Runnable(Protocol):
    """What a subgraph runs: a plan (:class:`nxrt.pipeline.executor.Plan`, which the
    pipeline builds; the EP-author API names only what it calls)."""

    def execute(self, feeds: dict[str, Any], wanted: Sequence[str], profiler: Any) -> Any: ...


class Subgraph:
    """A compiled graph attribute; call it with the graph's inputs, get its outputs."""

    def __init__(
        self, plan: Runnable, inputs: Sequence[str], outputs: Sequence[str], outer: Sequence[str]
    ):
        self.plan = plan
        self.input_names = list(inputs)
        self.output_names = list(outputs)
        self.outer_names = list(outer)

    def __call__(self, *inputs: Any) -> list[Any]:
        if len(inputs) != len(self.input_names):
            raise TypeError(f"subgraph takes {len(self.input_names)} inputs, got {len(inputs)}")
        feeds = dict(zip(self.input_names, inputs))
        if self.outer_names:
            scope = OUTER_SCOPE.get()
            feeds.update({name: scope[name] for name in self.outer_names})
        return self.plan.execute(feeds, self.output_names, None)

    def __repr__(self) -> str:
        return f"Subgraph({self.input_names} -> {self.output_names})"


class ScopedKernel(Kernel):
    """Runs a control-flow kernel with its subgraphs' outer-scope values in view."""

    def __init__(self, inner: Kernel, regular_inputs: int, names: Sequence[str]) -> None:
        self.inner = inner
        self.regular_inputs = regular_inputs
        self.names = list(names)
        self.variant, self.variant_reason = inner.variant, inner.variant_reason

    def compute(self, inputs: Sequence[Any]) -> tuple[Any, ...]:
        outer = dict(OUTER_SCOPE.get({}))
        outer.update(zip(self.names, inputs[self.regular_inputs :]))
        token = OUTER_SCOPE.set(outer)
        try:
            return self.inner.compute(inputs[: self.regular_inputs])
        finally:
            OUTER_SCOPE.reset(token)

"""Core's graph passes, and the one place every pass runs through.

Core keeps only what is EP-neutral: constant folding (computed with the
session's own kernels, passed in as an ``evaluate`` callback, so core never
needs to know an op) and dead-code elimination. Fusions belong to the EP
whose kernels they serve and arrive through ``nxrt_optimizer_passes``.
:func:`run_passes` runs either kind through ``onnx_ir``'s pass manager, so
every pass's ``requires`` / ``ensures`` are checked, then checks the graph
is still one nxrt can plan.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np
import onnx_ir as ir

from nxrt.pipeline.model import validate_graph


def constant_array(value: ir.Value | None) -> np.ndarray | None:
    """The data of a value known at session creation (an initializer or folded constant)."""
    if value is None or value.const_value is None:
        return None
    return value.const_value.numpy()


def new_initializer(graph: ir.Graph, stem: str, array: np.ndarray) -> ir.Value:
    """Register ``array`` as a new initializer named after ``stem`` (made unique)."""
    name = stem
    taken = set(graph.initializers)
    suffix = 0
    while name in taken:
        suffix += 1
        name = f"{stem}_{suffix}"
    value = ir.Value(name=name, const_value=ir.tensor(array, name=name))
    value.shape = ir.Shape(array.shape)
    value.dtype = ir.DataType.from_numpy(array.dtype)
    graph.register_initializer(value)
    return value


#: Ops core never folds: an EP's passes read them (the QDQ form of quantized weights).
KEPT_FOR_EPS = frozenset({"DequantizeLinear"})


class FoldConstants(ir.passes.InPlacePass):
    """Replace every node whose inputs are all constants by its computed outputs.

    Light models, for one, build their weights with ConstantOfShape on every
    run; folded, that work happens once. Nodes the evaluator cannot compute
    (random ops, subgraphs, errors) stay in the graph, and so does every
    DequantizeLinear (:data:`KEPT_FOR_EPS`): a quantized model's weights are
    its integers and their scales, which an EP's passes fuse into integer
    kernels (ONNX Runtime's folding keeps them for its QDQ fusions too); an EP
    folds what it does not fuse.
    """

    def __init__(self, evaluate: Callable[[ir.Node], list[Any] | None]) -> None:
        super().__init__()
        self.evaluate = evaluate
        self.folded: list[tuple[str, str]] = []

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graph = model.graph
        for node in list(graph):
            if not all(v is None or v.const_value is not None for v in node.inputs):
                continue
            if node.op_type in KEPT_FOR_EPS and node.domain in ("", "ai.onnx"):
                continue
            results = self.evaluate(node)
            if results is None or len(results) < len(node.outputs):
                continue
            arrays = [r for r in results[: len(node.outputs)]]
            if not all(isinstance(a, np.ndarray) for a in arrays):
                continue
            for value, array in zip(node.outputs, arrays):
                if value.name:
                    folded = new_initializer(graph, value.name, array)
                    value.replace_all_uses_with(folded, replace_graph_outputs=True)
            graph.remove(node, safe=True)
            self.folded.append((cast(str, node.name), node.op_type))
        return ir.passes.PassResult(model, bool(self.folded))


class GraphStaysValid(ir.passes.InPlacePass):
    """A pass that changes nothing and checks the graph is still well formed."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        return ir.passes.PassResult(model, False)

    def ensures(self, model: ir.Model) -> None:
        validate_graph(model.graph)


def run_passes(model: ir.Model, passes: Sequence[ir.passes.PassBase]) -> list[tuple[str, str]]:
    """Run ``passes`` in order on ``model`` (in place) with their checks, then validate.

    :returns: The ``(node, into)`` pairs the passes report in a ``fused`` attribute.
    """
    if passes:
        ir.passes.PassManager([*passes, GraphStaysValid()])(model)
    return [pair for item in passes for pair in getattr(item, "fused", ())]


def fold_constants(
    model: ir.Model, evaluate: Callable[[ir.Node], list[Any] | None]
) -> list[tuple[str, str]]:
    """Core's passes: fold constants, then drop dead code. Returns ``(node, op)`` folded."""
    from onnx_ir.passes.common import RemoveUnusedNodesPass

    folding = FoldConstants(evaluate)
    run_passes(model, [folding, RemoveUnusedNodesPass()])
    return folding.folded

"""Graph rewrites run at session creation, before partitioning (``onnx_ir`` passes).

Each pass keeps the model's results (to float32 rounding) and only touches
what it proves safe: constants it owns, values no graph output exposes.
Constant folding computes nodes with the session's own kernels, passed in as
an ``evaluate`` callback, so core never needs to know an op.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import onnx_ir as ir

if TYPE_CHECKING:
    from collections.abc import Callable


def _constant(value: ir.Value | None) -> np.ndarray | None:
    if value is None or value.const_value is None:
        return None
    return value.const_value.numpy()


def _only_user(value: ir.Value, graph: ir.Graph) -> ir.Node | None:
    """The single node reading ``value``, if it is not also a graph output."""
    uses = list(value.uses())
    if len(uses) != 1 or value in graph.outputs:
        return None
    return uses[0][0]


class FuseConvBatchNorm(ir.passes.InPlacePass):
    """Fold an inference BatchNormalization into the Conv that feeds it.

    ``BN(conv(x, W) + B)`` is ``conv(x, W * s) + (B - mean) * s + bias`` with
    ``s = scale / sqrt(var + eps)`` per output channel; the BatchNormalization
    node disappears, so its whole pass over the activations is saved.
    """

    def __init__(self) -> None:
        super().__init__()
        self.fused: list[tuple[str, str]] = []

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graph = model.graph
        modified = False
        for conv in list(graph):
            if conv.op_type != "Conv" or conv.domain not in ("", "ai.onnx"):
                continue
            bn = _only_user(conv.outputs[0], graph)
            if bn is None or bn.op_type != "BatchNormalization" or len(bn.outputs) != 1:
                continue
            if bn.inputs[0] is not conv.outputs[0] or _training(bn):
                continue
            weights = _constant(conv.inputs[1])
            params = [_constant(v) for v in bn.inputs[1:5]]
            bias = _constant(conv.inputs[2]) if len(conv.inputs) > 2 else None
            if weights is None or any(p is None for p in params):
                continue
            if len(conv.inputs) > 2 and conv.inputs[2] is not None and bias is None:
                continue
            scale, offset, mean, var = (p.astype(np.float64) for p in params)
            epsilon = bn.attributes["epsilon"].value if "epsilon" in bn.attributes else 1e-5
            factor = scale / np.sqrt(var + epsilon)
            if factor.shape != (weights.shape[0],):
                continue
            shape = (-1,) + (1,) * (weights.ndim - 1)
            fused_w = (weights * factor.reshape(shape)).astype(weights.dtype)
            base = bias.astype(np.float64) if bias is not None else 0.0
            fused_b = ((base - mean) * factor + offset).astype(weights.dtype)
            w_value = _new_initializer(graph, f"{conv.name or 'conv'}_bn_weight", fused_w)
            b_value = _new_initializer(graph, f"{conv.name or 'conv'}_bn_bias", fused_b)
            conv.replace_input_with(1, w_value)
            if len(conv.inputs) > 2:
                conv.replace_input_with(2, b_value)
            else:
                conv.resize_inputs(3)
                conv.replace_input_with(2, b_value)
            out = bn.outputs[0]
            was_output = out in graph.outputs
            out.replace_all_uses_with(conv.outputs[0], replace_graph_outputs=True)
            if was_output:
                conv.outputs[0].name = out.name
            graph.remove(bn, safe=True)
            self.fused.append((bn.name, conv.name))
            modified = True
        return ir.passes.PassResult(model, modified)


def _training(bn: ir.Node) -> bool:
    attr = bn.attributes.get("training_mode")
    return bool(attr.value) if attr is not None else False


def _new_initializer(graph: ir.Graph, stem: str, array: np.ndarray) -> ir.Value:
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


class FoldConstants(ir.passes.InPlacePass):
    """Replace every node whose inputs are all constants by its computed outputs.

    Light models, for one, build their weights with ConstantOfShape on every
    run; folded, that work happens once. Nodes the evaluator cannot compute
    (random ops, subgraphs, errors) stay in the graph.
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
            results = self.evaluate(node)
            if results is None or len(results) < len(node.outputs):
                continue
            arrays = [r for r in results[: len(node.outputs)]]
            if not all(isinstance(a, np.ndarray) for a in arrays):
                continue
            for value, array in zip(node.outputs, arrays):
                if value.name:
                    folded = _new_initializer(graph, value.name, array)
                    value.replace_all_uses_with(folded, replace_graph_outputs=True)
            graph.remove(node, safe=True)
            self.folded.append((node.name, node.op_type))
        return ir.passes.PassResult(model, bool(self.folded))


def optimize(
    model: ir.Model, evaluate: Callable[[ir.Node], list[Any] | None]
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Fold constants, then fuse.

    :returns: ``(node, op)`` of every folded node and ``(node, into)`` of
        every node fused into another, for the partition report.
    """
    folding, fusing = FoldConstants(evaluate), FuseConvBatchNorm()
    folding(model)
    fusing(model)
    return folding.folded, fusing.fused

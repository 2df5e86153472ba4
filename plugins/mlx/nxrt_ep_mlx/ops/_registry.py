"""The mlx EP's op table: one translator per op, registered with ``@op`` at its definition.

A translator maps one ONNX node to MLX operations while a claim is traced:
inputs positional (``mx.array``, or ``None`` for an absent optional input;
numpy arrays for the inputs listed in ``const_inputs``, known when the claim
is compiled), attributes keyword-only with their ONNX defaults. It returns an
array, or a tuple when the node has several outputs.

Beyond the :class:`~nxrt.registry.KernelEntry` fields, an :class:`MlxOp`
says which element types each input and the outputs may have (float32,
float16 and bfloat16 unless stated; constant inputs may have any type),
which constant inputs get a one-off layout change
(``prepare``, e.g. Conv weights to channels-last), and an optional ``check``
that refuses nodes whose attributes the translator does not handle.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nxrt.registry import KernelEntry, OpRegistry

if TYPE_CHECKING:
    import onnx_ir as ir

#: ``check(node, attrs) -> reason`` ('' when the translator handles the node).
Check = Callable[["ir.Node", Mapping[str, Any]], str]

#: ``prepare(array, attrs) -> array``: an input's layout change, done once for constants.
Prepare = Callable[[Any, Mapping[str, Any]], Any]

# ONNX element types (TensorProto numbers), grouped as the op table uses them.
FLOAT, INT32, INT64, BOOL, FLOAT16, BFLOAT16 = 1, 6, 7, 9, 10, 16
FLOATS = frozenset({FLOAT, FLOAT16, BFLOAT16})
INDICES = frozenset({INT32, INT64})
BOOLS = frozenset({BOOL})


@dataclass
class MlxOp(KernelEntry):
    """A translator and what claiming needs to know about it.

    ``input_types`` maps an input index to the element types it may have
    (other inputs: :data:`FLOATS`); ``prepare`` maps an input index to a
    :data:`Prepare` whose result the translator receives instead (applied
    once when the input is a constant, in the traced graph otherwise);
    ``max_outputs=None`` means as many outputs as the node has (Split).
    """

    input_types: Mapping[int, frozenset[int]] = field(default_factory=dict)
    output_types: frozenset[int] = FLOATS
    prepare: Mapping[int, Prepare] = field(default_factory=dict)
    check: Check | None = None
    max_outputs: int | None = 1

    @functools.cached_property
    def attributes(self) -> frozenset[str]:
        """The attributes the translator takes: its keyword-only parameters."""
        return frozenset(
            name
            for name, p in inspect.signature(self.fn).parameters.items()
            if p.kind is inspect.Parameter.KEYWORD_ONLY
        )


class MlxOps(OpRegistry):
    """The op table; ``op`` takes the fields of :class:`MlxOp` besides the common ones."""

    entry_type = MlxOp


MLX_OPS = MlxOps("mlx")
op = MLX_OPS.op

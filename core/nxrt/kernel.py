"""Kernels, their costs, and subgraph claims.

A :class:`Kernel` is what the executor calls once per node (or once per
claimed subgraph) on every ``run``; everything it needs is decided when the
session is created, so ``compute`` is a plain call on arrays.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nxrt._moved import moved_attribute

if TYPE_CHECKING:
    import onnx_ir as ir

#: Trace argument names, as the seed's kernel module exports them.
ARG_FLOPS = "flops"
ARG_BYTES = "bytes"
ARG_DEVICE = "device"
ARG_KERNEL_VARIANT = "kernel_variant"
ARG_KERNEL_VARIANT_REASON = "kernel_variant_reason"


@dataclass(frozen=True)
class Cost:
    """Estimated work of one kernel call: arithmetic and memory traffic."""

    flops: int = 0
    bytes: float = 0  # a float where estimated from ``ir.DataType.itemsize``

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.flops + other.flops, self.bytes + other.bytes)


class Kernel:
    """Computes outputs from inputs; created once per node at session creation.

    The whole contract between a kernel and the executor:

    - :meth:`compute` receives one array (or ``None`` for an absent optional
      input) per input and returns a tuple with one array per output;
    - :attr:`direct_call` is what the executor's loop actually calls: the
      inputs as positional arguments, one value or a tuple back. The default
      wraps ``compute``; a kernel that is one plain function returns it, which
      saves a list and a tuple per call;
    - :meth:`translate_error` turns an exception the call raised into the
      error the user sees (the executor then adds node, op and EP to it);
    - :attr:`variant` / :attr:`variant_reason` (trace arguments) and
      :attr:`view_output` describe the kernel to the profiler and planner.

    Kernels must not modify their inputs and must be safe to call from
    several threads at once.
    """

    #: Which implementation was chosen for the node's shapes, and why (trace args).
    variant: str = ""
    variant_reason: str = ""
    #: Index of the input an output is a zero-copy view of, if any.
    view_output: int | None = None

    def compute(self, inputs: Sequence[Any]) -> tuple[Any, ...]:
        raise NotImplementedError

    @property
    def direct_call(self) -> Callable[..., Any]:
        """The callable the executor's loop calls (inputs positional; a value or a tuple)."""
        compute = self.compute
        return lambda *inputs: compute(inputs)

    def translate_error(self, exc: BaseException) -> BaseException:
        """The error to raise for ``exc`` (default: ``exc`` itself, an EP bug)."""
        return exc


class FunctionKernel(Kernel):
    """A kernel function with its node's attributes bound (the common case)."""

    def __init__(
        self,
        fn: Callable[..., Any],
        attrs: dict[str, Any],
        *,
        view_output: int | None = None,
        variant: str = "",
        variant_reason: str = "",
    ) -> None:
        self.fn = fn
        self.attrs = attrs
        self.view_output = view_output
        self.variant, self.variant_reason = variant, variant_reason
        self._call = functools.partial(fn, **attrs) if attrs else fn

    @property
    def direct_call(self) -> Callable[..., Any]:
        return self._call

    def compute(self, inputs: Sequence[Any]) -> tuple[Any, ...]:
        out = self._call(*inputs)
        return out if isinstance(out, tuple) else (out,)

    def __repr__(self) -> str:
        return f"FunctionKernel({self.fn.__qualname__}, {self.attrs})"


@dataclass
class SubgraphClaim:
    """A set of nodes one EP will compile into a single kernel.

    EPs fill ``ep`` and ``nodes``; the host fills ``inputs`` and ``outputs``
    (value names crossing the claim's boundary, in a stable order) once it has
    checked that the claim is acyclic and that its nodes are still free.
    ``kernel`` is set when the partition arrives precompiled (an EPContext
    node), so nothing needs compiling.
    """

    ep: str
    nodes: Sequence[ir.Node]
    name: str = ""
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    kernel: Kernel | None = None


def attribute_values(
    node: ir.Node, compile_subgraph: Callable[[Any], Any] | None = None
) -> dict[str, Any]:
    """A node's attributes as plain Python values (tensors become numpy arrays).

    Graph attributes go through ``compile_subgraph`` when given (the session
    passes one that returns callable subgraphs), else stay ``onnx_ir`` graphs.
    """
    import onnx_ir as ir

    from nxrt.pipeline.values import constant_array

    values: dict[str, Any] = {}
    for name, attr in node.attributes.items():
        value = attr.value
        if compile_subgraph is not None and attr.type == ir.AttributeType.GRAPH:
            value = compile_subgraph(value)
        elif compile_subgraph is not None and attr.type == ir.AttributeType.GRAPHS:
            value = [compile_subgraph(g) for g in value]
        elif attr.type == ir.AttributeType.TENSOR:
            value = constant_array(value)
        elif attr.type == ir.AttributeType.TENSORS:
            value = [constant_array(t) for t in value]
        elif attr.type in (ir.AttributeType.INTS, ir.AttributeType.FLOATS):
            value = list(value)
        elif attr.type == ir.AttributeType.STRINGS:
            value = list(value)
        values[name] = value
    return values


if not TYPE_CHECKING:  # so a type checker still reports a name that does not exist

    def __getattr__(name: str) -> Any:
        return moved_attribute(__name__, name)

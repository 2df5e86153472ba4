"""Which weight handle each EP receives, decided once at session creation.

An initializer that only ``pkg.nxrt::BlockQuantizedMoE`` nodes read as
weights may stay lazy (left in its mmap regions) — but only for an EP that
advertises the ``"nxrt"`` capability and so knows how to page it. Every other
EP receives the same weight materialised through the host fallback, as a
read-only numpy array, so stock EPs never see a handle they do not understand.
The executor's hot path is unchanged: the result is just the plan's constants.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import onnx_ir as ir

from nxrt.contrib_ops import DOMAIN, MOE_OP_TYPE
from nxrt.registry import normalize_domain
from nxrt.weight import (
    ExecutionProviderCapabilities,
    LazyWeight,
    NegotiatedWeight,
    ResidentWeight,
    WeightHandle,
)

if TYPE_CHECKING:
    from nxrt.provider import ExecutionProvider

#: ``Value.meta`` key under which loading records the mmap-backed tensor an initializer was
#: given; a handle still applies only while the value holds that very tensor.
EXTERNAL_TENSOR_META = "nxrt.external_tensor"
#: Input positions of ``BlockQuantizedMoE`` that hold expert weights (all after X and logits).
MOE_WEIGHT_INPUTS = range(2, 8)


@dataclass(frozen=True)
class LazyWeightCandidate:
    """An initializer read only as expert weights: ``(node position, input index)`` uses."""

    name: str
    consumers: tuple[tuple[int, int], ...]


def is_lazy_boundary(node: ir.Node) -> bool:
    return normalize_domain(node.domain) == DOMAIN and node.op_type == MOE_OP_TYPE


def lazy_weight_candidates(graph: ir.Graph) -> dict[str, LazyWeightCandidate]:
    """Initializers of ``graph`` that every reader takes as a BlockQuantizedMoE weight."""
    position = {id(node): i for i, node in enumerate(graph)}
    candidates: dict[str, LazyWeightCandidate] = {}
    for name, value in graph.initializers.items():
        if value.is_graph_output():
            continue
        uses = list(value.uses())
        consumers = []
        for node, index in uses:
            if id(node) not in position or not is_lazy_boundary(node):
                break
            if index not in MOE_WEIGHT_INPUTS:
                break
            consumers.append((position[id(node)], index))
        else:
            if consumers:
                candidates[name] = LazyWeightCandidate(name, tuple(consumers))
    return candidates


def resident_array(weight: ResidentWeight) -> np.ndarray:
    """A read-only numpy array of a resident weight; no copy unless it is bit-packed."""
    raw = np.frombuffer(weight.bytes(), dtype=np.uint8)
    if weight.dtype.bitwidth % 8:
        array = ir.PackedTensor(raw, weight.dtype, shape=weight.shape).numpy()
    else:
        array = raw.view(weight.dtype.numpy()).reshape(weight.shape)
    array.flags.writeable = False
    return array


def delivered(negotiated: NegotiatedWeight) -> LazyWeight | np.ndarray:
    """What a kernel receives for a negotiated weight: the lazy handle or an array."""
    if isinstance(negotiated, NegotiatedWeight.Lazy):
        return negotiated.weight
    return resident_array(negotiated.materialize_host_fallback())


def negotiate_weights(
    graph: ir.Graph,
    handles: Mapping[str, WeightHandle],
    placement: Any,
    eps: Mapping[str, ExecutionProvider],
    capabilities: Mapping[str, ExecutionProviderCapabilities],
) -> dict[str, LazyWeight | np.ndarray]:
    """The constant each handle becomes, given where its readers were placed.

    Handles of initializers that are not ``graph``'s, or that a rewrite has
    replaced since loading, are left out. A lazy handle stays lazy only when
    all its readers run as single nodes
    (not inside a claimed subgraph) on one host-memory EP advertising
    ``"nxrt"``; otherwise it is materialised.
    """
    candidates = lazy_weight_candidates(graph)
    stock = ExecutionProviderCapabilities.stock()
    constants: dict[str, LazyWeight | np.ndarray] = {}
    for name, handle in handles.items():
        value = graph.initializers.get(name)
        if value is None or value.const_value is not value.meta.get(EXTERNAL_TENSOR_META):
            continue  # not this graph's, or rewritten since (an optimizer pass owns it now)
        caps = stock
        candidate = candidates.get(name)
        if isinstance(handle, WeightHandle.Lazy) and candidate is not None:
            owners = {
                placement.node_ep[i] if placement.node_claim[i] is None else None
                for i, _ in candidate.consumers
            }
            if len(owners) == 1 and None not in owners:
                ep_id = cast(str, owners.pop())
                if eps[ep_id].device_type == "cpu":
                    caps = capabilities.get(ep_id, stock)
        constants[name] = delivered(handle.negotiate(caps))
    return constants


__all__ = [
    "EXTERNAL_TENSOR_META",
    "MOE_WEIGHT_INPUTS",
    "LazyWeightCandidate",
    "delivered",
    "is_lazy_boundary",
    "lazy_weight_candidates",
    "negotiate_weights",
    "resident_array",
]

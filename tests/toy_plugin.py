"""A small third-party-style plugin used by the host and session tests.

``ToyPlugin`` provides the EP ``toy`` with Add and Relu kernels; options turn
on subgraph claims, a non-host device (to force copies) or EPContext support.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

import nxrt
from nxrt.epcontext import EpContext
from nxrt.kernel import Kernel, SubgraphClaim
from nxrt.provider import ExecutionProvider
from nxrt.registry import OpRegistry
from nxrt.weight import ExecutionProviderCapabilities

TOY_OPS = OpRegistry("toy")


@TOY_OPS.op("Add", since=(7, 13, 14))
def add(a, b, /):
    return a + b


@TOY_OPS.op("Relu", since=(6, 13, 14))
def relu(x, /):
    return np.maximum(x, 0)


class DeviceArray:
    """A value living on the toy device: only the toy EP can read it."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array


class ToyEP(ExecutionProvider):
    id = "toy"

    def compile(self, claim: SubgraphClaim, graph: Any) -> Kernel:
        return ToyFusedKernel(claim)


class ToyDeviceEP(ToyEP):
    """The toy EP on a device of its own: every value crossing it is copied."""

    device_type = "toydev"

    def create_kernel(self, node, entry):
        inner = super().create_kernel(node, entry)
        return DeviceKernel(inner)

    def copy_from_host(self, array):
        return DeviceArray(np.array(array, copy=True))

    def copy_to_host(self, value):
        assert isinstance(value, DeviceArray), "a host array reached copy_to_host"
        return value.array


class DeviceKernel(Kernel):
    def __init__(self, inner: Kernel) -> None:
        self.inner = inner

    def compute(self, inputs: Sequence[Any]) -> tuple[Any, ...]:
        for value in inputs:
            assert isinstance(value, DeviceArray), "a host array reached the toy device"
        outs = self.inner.compute([v.array for v in inputs])
        return tuple(DeviceArray(o) for o in outs)


class ToyFusedKernel(Kernel):
    """Runs a claimed chain of Add/Relu nodes in one call."""

    def __init__(self, claim: SubgraphClaim) -> None:
        self.claim = claim
        self.variant = "fused"
        self.variant_reason = f"{len(claim.nodes)} nodes claimed"

    def compute(self, inputs: Sequence[Any]) -> tuple[Any, ...]:
        env = dict(zip(self.claim.inputs, inputs))
        for node in self.claim.nodes:
            args = [env[v.name] for v in node.inputs]
            env[node.outputs[0].name] = add(*args) if node.op_type == "Add" else relu(*args)
        return tuple(env[name] for name in self.claim.outputs)


class ToyPlugin:
    """Hook implementations of the toy EP; the flags choose what it offers."""

    def __init__(
        self,
        *,
        ep_id: str = "toy",
        claims: bool = False,
        device: bool = False,
        context: bool = False,
        claim_picker=None,
    ) -> None:
        self.ep_id = ep_id
        self.claims = claims
        self.device = device
        self.context = context
        self.claim_picker = claim_picker

    @nxrt.hookimpl
    def nxrt_register(self, registry):
        cls = ToyDeviceEP if self.device else ToyEP
        registry.add_provider(
            self.ep_id,
            lambda config: cls(config, TOY_OPS),
            device_type=cls.device_type,
            context_sources=("toy_ctx",) if self.context else (),
        )
        registry.add_kernels(self.ep_id, TOY_OPS)

    @nxrt.hookimpl
    def nxrt_ep_capabilities(self, ep):
        if ep.id != self.ep_id:
            return None
        flags = ["device:" + ep.device_type] + (["epcontext"] if self.context else [])
        return ExecutionProviderCapabilities.from_flags(flags)

    @nxrt.hookimpl
    def nxrt_claim_subgraphs(self, ep, graph, nodes):
        if ep.id != self.ep_id or not self.claims:
            return None
        if self.claim_picker is not None:
            return [SubgraphClaim(ep.id, self.claim_picker(nodes))]
        supported = [n for n in nodes if n.op_type in ("Add", "Relu")]
        return [SubgraphClaim(ep.id, supported, name="toy_fused")] if supported else []

    @nxrt.hookimpl
    def nxrt_save_context(self, ep, claim, kernel):
        if ep.id != self.ep_id or not self.context:
            return None
        blob = ",".join(n.op_type for n in claim.nodes).encode()
        return EpContext(
            source="toy_ctx",
            ep_cache_context=blob,
            partition_name=claim.name,
            inputs=list(claim.inputs),
            outputs=list(claim.outputs),
        )

    @nxrt.hookimpl
    def nxrt_load_context(self, ep, context):
        if ep.id != self.ep_id or not self.context:
            return None
        ops = context.ep_cache_context.decode().split(",")
        return ChainKernel(ops)


class ChainKernel(Kernel):
    """A context-loaded kernel: applies Relu steps in order to one input."""

    def __init__(self, ops: list[str]) -> None:
        self.ops = ops

    def compute(self, inputs: Sequence[Any]) -> tuple[Any, ...]:
        value = inputs[0]
        for op in self.ops:
            value = relu(value) if op == "Relu" else value
        return (value,)

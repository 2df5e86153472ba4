"""Hook implementations of the cpu EP (and nothing else)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import nxrt
from nxrt.weight import ExecutionProviderCapabilities

if TYPE_CHECKING:
    import onnx_ir as ir
    from onnx_ir.passes import PassBase

    from nxrt.ep_registry import Registrar
    from nxrt.provider import EpConfig, ExecutionProvider
    from nxrt.registry import KernelMatch, OpRegistry

EP_ID = "cpu"


def _create(config: EpConfig) -> ExecutionProvider:
    from nxrt_ep_cpu.provider import CpuExecutionProvider

    return CpuExecutionProvider(config)


def _kernels() -> OpRegistry:
    """The kernel table, imported when a session first needs it: the op modules import
    onnx and numpy's machinery, which listing providers must not pay for."""
    from nxrt_ep_cpu.ops import CPU_OPS

    return CPU_OPS


@nxrt.hookimpl
def nxrt_register(registry: Registrar) -> None:
    registry.add_provider(
        EP_ID,
        _create,
        device_type="cpu",
        aliases=("CPUExecutionProvider",),
        description="numpy kernels for the ONNX standard opset",
    )
    registry.add_kernels(EP_ID, _kernels)


@nxrt.hookimpl
def nxrt_ep_capabilities(ep: ExecutionProvider) -> ExecutionProviderCapabilities | None:
    if ep.id != EP_ID:
        return None
    return ExecutionProviderCapabilities.from_flags(
        ["device:cpu", "dtype:float32", "dtype:float64", "dtype:int64", "dtype:int32", "nxrt"]
    )


@nxrt.hookimpl
def nxrt_match_kernel(ep: ExecutionProvider, node: ir.Node, opset: int) -> KernelMatch | None:
    if ep.id != EP_ID or ep.ops is None:
        return None
    return ep.ops.match(node, opset)


@nxrt.hookimpl
def nxrt_optimizer_passes(ep: ExecutionProvider) -> list[PassBase] | None:
    if ep.id != EP_ID:
        return None
    from nxrt_ep_cpu.fusions import cpu_passes

    return cpu_passes(ep)


@nxrt.hookimpl
def nxrt_warmup(ep: ExecutionProvider, model: str | None) -> list[str] | None:
    if ep.id != EP_ID:
        return None
    from nxrt_ep_cpu.warmup import warmup

    return warmup(model, threads=ep.config.threads)

"""Hook implementations of the mlx EP (and nothing else).

Importing this module, and registering, does not import MLX: the EP imports
it when it is instantiated.

The EP works through claims only: ``nxrt_claim_subgraphs`` claims maximal
connected, cycle-safe groups of the nodes it supports (core's grouping), and
each claim is compiled into one MLX function. ``nxrt_match_kernel`` therefore
never matches a single node; it answers why a node was not claimed, which the
partition report shows beside the node's fallback EP.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import nxrt
from nxrt.claims import group_claims
from nxrt.kernel import KernelMatch, SubgraphClaim
from nxrt.weight import ExecutionProviderCapabilities

if TYPE_CHECKING:
    import onnx_ir as ir

    from nxrt.epcontext import EpContext
    from nxrt.kernel import Kernel
    from nxrt.provider import EpConfig, ExecutionProvider
    from nxrt.registry import Registrar

EP_ID = "mlx"
CONTEXT_SOURCE = "mlx"


def _create(config: EpConfig) -> ExecutionProvider:
    from nxrt_ep_mlx.provider import MlxExecutionProvider

    return MlxExecutionProvider(config)


@nxrt.hookimpl
def nxrt_register(registry: Registrar) -> None:
    from nxrt_ep_mlx.ops import MLX_OPS

    registry.add_provider(
        EP_ID,
        _create,
        # What discovery can tell without opening MLX; the instance decides (cpu: no copies).
        device_type="gpu" if sys.platform == "darwin" else "cpu",
        context_sources=(CONTEXT_SOURCE,),
        aliases=("MLXExecutionProvider",),
        description="MLX: claims subgraphs and compiles each with mx.compile",
        priority=20,  # declared order only; the device-aware preference below decides
    )
    registry.add_kernels(EP_ID, MLX_OPS)


@nxrt.hookimpl
def nxrt_ep_capabilities(ep: ExecutionProvider) -> ExecutionProviderCapabilities | None:
    if ep.id != EP_ID:
        return None
    info = getattr(ep, "blas_info", None)
    return ExecutionProviderCapabilities.from_flags(
        [
            "epcontext",
            f"device:{ep.device_type}",
            "dtype:float32",
            "dtype:float16",
            "dtype:bfloat16",
            # blas:NAME, blas-core:KERNEL, and blas-rejected:LIBRARY:CHECK when the library
            # found failed the GEMM self-check (nxrt_ep_mlx._backend.check_gemm)
            *(info.flags() if info is not None else ["blas:unknown"]),
            # first on a GPU (Metal, CUDA); on a CPU MLX is the slowest EP measured, so last
            f"preference:{40 if ep.device_type == 'gpu' else -10}",
        ]
    )


@nxrt.hookimpl
def nxrt_claim_subgraphs(
    ep: ExecutionProvider, graph: ir.Graph, nodes: list[ir.Node]
) -> list[SubgraphClaim] | None:
    if ep.id != EP_ID:
        return None
    from nxrt_ep_mlx._claims import claimable

    chosen = claimable(nodes, ep.opsets_for(graph))  # type: ignore[attr-defined]
    return [SubgraphClaim(ep.id, members) for members in group_claims(list(graph), chosen)]


@nxrt.hookimpl
def nxrt_match_kernel(ep: ExecutionProvider, node: ir.Node, opset: int) -> KernelMatch | None:
    if ep.id != EP_ID:
        return None
    from nxrt_ep_mlx._claims import refusal

    reason = refusal(node, opset)
    if not reason:
        reason = (
            "mlx runs whole claims only, and this node was left out of them "
            "(constant work that only other EPs read, or a refused claim)"
        )
    return KernelMatch.no(reason)


@nxrt.hookimpl
def nxrt_save_context(
    ep: ExecutionProvider, claim: SubgraphClaim, kernel: Kernel
) -> EpContext | None:
    if ep.id != EP_ID:
        return None
    return ep.save_context(claim, kernel)


@nxrt.hookimpl
def nxrt_load_context(ep: ExecutionProvider, context: EpContext) -> Kernel | None:
    if ep.id != EP_ID:
        return None
    return ep.load_context(context)

"""Hook implementations of the mlx EP (and nothing else).

Importing this module, and registering, does not import MLX: the EP imports
it when it is instantiated.

The EP works through claims only: it is a ``CompilingProvider`` (core's
base), which claims maximal connected, cycle-safe groups of the nodes it
supports, and each claim is compiled into one MLX function. Kernel matching
therefore never matches a single node; it answers why a node was not
claimed, which the partition report shows beside the node's fallback EP.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import nxrt
from nxrt.weight import ExecutionProviderCapabilities

if TYPE_CHECKING:
    from nxrt.ep_registry import Registrar
    from nxrt.provider import EpConfig, ExecutionProvider

EP_ID = "mlx"


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
        context_sources=(EP_ID,),  # the source key of its contexts is its id
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

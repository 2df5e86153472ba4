"""Hook implementations of the openvino EPs (and nothing else).

Registering does not import OpenVINO: ``openvino`` (the CPU) is always
offered, other devices only when ``NXRT_OPENVINO_DEVICES`` asks (see
:mod:`nxrt_ep_openvino.provider`), and OpenVINO opens when a session
instantiates an EP.

The EPs work through claims only: each is a ``CompilingProvider`` (core's
base), which claims maximal cycle-safe groups of the nodes OpenVINO converts
and compiles each claim into one OpenVINO model. Kernel matching therefore
never matches a single node; it answers why a node was not claimed
(OpenVINO's own reason), which the partition report shows beside the node's
fallback EP.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import nxrt
from nxrt.weight import ExecutionProviderCapabilities

if TYPE_CHECKING:
    from nxrt.ep_registry import Registrar
    from nxrt.provider import ExecutionProvider


def _ours(ep: ExecutionProvider) -> bool:
    from nxrt_ep_openvino.provider import OpenVinoExecutionProvider

    return isinstance(ep, OpenVinoExecutionProvider)


@nxrt.hookimpl
def nxrt_register(registry: Registrar) -> None:
    from nxrt_ep_openvino.provider import CPU, create_ep, discover_eps

    for spec in discover_eps():
        registry.add_provider(
            spec.id,
            functools.partial(create_ep, spec),
            device_type="cpu",
            context_sources=(spec.id,),
            aliases=("OpenVINOExecutionProvider",) if spec.device == CPU else (),
            description=spec.description,
            # By default after mlx and the ORT bridge, before the cpu EP: ask for it by name
            # (providers=["openvino", "cpu"]) to have it first.
            priority=5,
        )


@nxrt.hookimpl
def nxrt_ep_capabilities(ep: ExecutionProvider) -> ExecutionProviderCapabilities | None:
    if not _ours(ep):
        return None
    flags = [
        "epcontext",
        f"device:{ep.device_type}",
        f"openvino:{ep.device}",  # type: ignore[attr-defined]
        f"precision:{ep.precision}",  # type: ignore[attr-defined]
    ]
    flags += [f"dtype:{t}" for t in ("float32", "float16", "bfloat16", "int64", "int32", "bool")]
    flags.append("preference:20")  # the fastest CPU runtime measured here; measured first
    return ExecutionProviderCapabilities.from_flags(flags)

"""Hook implementations of the legacy_abi EPs (and nothing else).

EP ids are decided without importing onnxruntime, so discovery stays cheap:
``legacy_abi`` exists whenever an onnxruntime distribution is installed and
runs on ORT's CPUExecutionProvider unless its ``provider`` option names
another; distributions that ship more providers add an id each
(``onnxruntime-gpu`` adds ``legacy_abi_cuda`` and ``legacy_abi_tensorrt``),
and each ORT plugin-EP library named in ``NXRT_ORT_EP_LIBRARIES=name=path,...``
or registered with ``nxrt.register_execution_provider_library(name, path)``
adds ``legacy_abi_<name>``, which also answers to ``name``. Whether a provider
really loads is checked when its EP is instantiated, so a missing or broken
one fails (``EpLoadFailed``) only when a session asks for it.

Claims, refusal reasons and EPContext come from core's ``CompilingProvider``,
which :class:`~nxrt_ep_legacy_abi.provider.LegacyOrtEp` extends.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, TypeGuard

import nxrt
from nxrt.weight import ExecutionProviderCapabilities

if TYPE_CHECKING:
    from nxrt.ep_registry import Registrar
    from nxrt.provider import ExecutionProvider
    from nxrt_ep_legacy_abi.provider import LegacyOrtEp


def _ours(ep: ExecutionProvider) -> TypeGuard[LegacyOrtEp]:
    from nxrt_ep_legacy_abi.provider import LegacyOrtEp

    return isinstance(ep, LegacyOrtEp)


@nxrt.hookimpl
def nxrt_register(registry: Registrar) -> None:
    from nxrt_ep_legacy_abi.provider import create_ep, discover_eps

    for spec in discover_eps(libraries=getattr(registry, "ep_libraries", None)):
        registry.add_provider(
            spec.id,
            functools.partial(create_ep, spec),
            device_type=spec.device_type,
            context_sources=(spec.id,),
            aliases=(spec.provider,) if spec.library is not None else (),
            description=spec.description,
            priority=10,  # by default after native EPs such as mlx, before the cpu EP
        )


@nxrt.hookimpl
def nxrt_ep_capabilities(ep: ExecutionProvider) -> ExecutionProviderCapabilities | None:
    if not _ours(ep):
        return None
    flags = [f"device:{ep.device_type}", "epcontext", f"ort:{ep.ort_provider}"]
    flags += [f"dtype:{t}" for t in ("float32", "float16", "bfloat16", "float64", "int64", "int32")]
    # ORT's kernels beat nxrt's numpy ones on the CPU; a device provider comes before both
    flags.append(f"preference:{10 if ep.device_type == 'cpu' else 30}")
    return ExecutionProviderCapabilities.from_flags(flags)

"""nxrt: an ONNX inference runtime whose execution providers are installed plugins.

``import nxrt`` loads no plugin and no backend library: the plugin manager is
built on first use, and heavy modules are imported when first touched.
"""

from __future__ import annotations

import importlib
import threading
from typing import TYPE_CHECKING, Any

import pluggy

__version__ = "0.1.0"

#: The marker plugins put on their hook implementations: ``@nxrt.hookimpl``.
hookimpl = pluggy.HookimplMarker("nxrt")

_LAZY = {
    "InferenceSession": "nxrt.session",
    "SessionOptions": "nxrt.session",
    "RunOptions": "nxrt.session",
    "GraphOptimizationLevel": "nxrt.session",
    "NodeArg": "nxrt.session",
    "OrtExecutionProviderDevicePolicy": "nxrt.session",
    "ExecutionProvider": "nxrt.provider",
    "EpConfig": "nxrt.provider",
    "Kernel": "nxrt.kernel",
    "KernelMatch": "nxrt.kernel",
    "Cost": "nxrt.kernel",
    "SubgraphClaim": "nxrt.kernel",
    "OpKey": "nxrt.registry",
    "OpRegistry": "nxrt.registry",
    "EpRegistry": "nxrt.registry",
    "ExecutionProviderCapabilities": "nxrt.weight",
    "get_plugin_manager": "nxrt.host",
}

if TYPE_CHECKING:
    from nxrt.host import NxrtPluginManager, get_plugin_manager
    from nxrt.kernel import Cost, Kernel, KernelMatch, SubgraphClaim
    from nxrt.provider import EpConfig, ExecutionProvider
    from nxrt.registry import EpRegistry, OpKey, OpRegistry
    from nxrt.session import (
        GraphOptimizationLevel,
        InferenceSession,
        NodeArg,
        OrtExecutionProviderDevicePolicy,
        RunOptions,
        SessionOptions,
    )
    from nxrt.weight import ExecutionProviderCapabilities

_default_pm: NxrtPluginManager | None = None
_default_lock = threading.Lock()


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'nxrt' has no attribute {name!r}")


def default_plugin_manager() -> NxrtPluginManager:
    """The shared plugin manager of the public API, built on first use."""
    global _default_pm
    with _default_lock:
        if _default_pm is None:
            from nxrt.host import get_plugin_manager

            _default_pm = get_plugin_manager()
        return _default_pm


def get_available_providers() -> list[str]:
    """Ids of the installed EPs, in the default priority order (cpu last)."""
    from nxrt.host import Host

    return Host(default_plugin_manager()).build_registry().default_order()


__all__ = [
    "Cost",
    "EpConfig",
    "EpRegistry",
    "ExecutionProvider",
    "ExecutionProviderCapabilities",
    "GraphOptimizationLevel",
    "InferenceSession",
    "Kernel",
    "KernelMatch",
    "NodeArg",
    "OpKey",
    "OpRegistry",
    "OrtExecutionProviderDevicePolicy",
    "RunOptions",
    "SessionOptions",
    "SubgraphClaim",
    "default_plugin_manager",
    "get_available_providers",
    "get_plugin_manager",
    "hookimpl",
]

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
#: onnxruntime's names for the package and its version (nxrt's own; the ONNX Runtime API
#: version nxrt follows is ``ORT_API_VERSION``, which ``get_version_string()`` reports).
package_name = "nxrt"
version = __version__

#: The marker plugins put on their hook implementations: ``@nxrt.hookimpl``.
hookimpl = pluggy.HookimplMarker("nxrt")

_LAZY = {
    "InferenceSession": "nxrt.session",
    "SessionOptions": "nxrt.session",
    "RunOptions": "nxrt.session",
    "GraphOptimizationLevel": "nxrt.session",
    "NodeArg": "nxrt.session",
    "ModelMetadata": "nxrt.session",
    "ExecutionMode": "nxrt.session",
    "ExecutionOrder": "nxrt.session",
    "OrtExecutionProviderDevicePolicy": "nxrt.session",
    "OrtValue": "nxrt.ortvalue",
    "OrtMemoryInfo": "nxrt.ortvalue",
    "OrtMemType": "nxrt.ortvalue",
    "OrtAllocatorType": "nxrt.ortvalue",
    "OrtDeviceMemoryType": "nxrt.ortvalue",
    "OrtMemoryInfoDeviceType": "nxrt.ortvalue",
    "OrtDevice": "nxrt.devices",
    "OrtDeviceVendorId": "nxrt.devices",
    "OrtEpDevice": "nxrt.devices",
    "OrtHardwareDevice": "nxrt.devices",
    "OrtHardwareDeviceType": "nxrt.devices",
    "OrtSyncStream": "nxrt.devices",
    "OrtArenaCfg": "nxrt.devices",
    "OrtEpAssignedNode": "nxrt.devices",
    "OrtEpAssignedSubgraph": "nxrt.devices",
    "get_ep_devices": "nxrt.devices",
    "register_execution_provider_library": "nxrt.devices",
    "unregister_execution_provider_library": "nxrt.devices",
    "create_and_register_allocator": "nxrt.devices",
    "create_and_register_allocator_v2": "nxrt.devices",
    "SparseTensor": "nxrt.sparse",
    "OrtSparseFormat": "nxrt.sparse",
    "AdapterFormat": "nxrt.lora",
    "LoraAdapter": "nxrt.lora",
    "IOBinding": "nxrt.iobinding",
    "ORT_API_VERSION": "nxrt.runtime",
    "get_all_providers": "nxrt.runtime",
    "get_build_info": "nxrt.runtime",
    "get_device": "nxrt.runtime",
    "get_version_string": "nxrt.runtime",
    "has_collective_ops": "nxrt.runtime",
    "copy_tensors": "nxrt.ortvalue",
    "set_default_logger_callback": "nxrt.runtime",
    "set_default_logger_severity": "nxrt.runtime",
    "set_default_logger_verbosity": "nxrt.runtime",
    "disable_telemetry_events": "nxrt.runtime",
    "enable_telemetry_events": "nxrt.runtime",
    "ExecutionProvider": "nxrt.provider",
    "EpConfig": "nxrt.provider",
    "CompilingProvider": "nxrt.compiling",
    "ExportedKernel": "nxrt.compiling",
    "Kernel": "nxrt.kernel",
    "KernelMatch": "nxrt.kernel",
    "Cost": "nxrt.kernel",
    "SubgraphClaim": "nxrt.kernel",
    "OpKey": "nxrt.registry",
    "OpRegistry": "nxrt.registry",
    "EpRegistry": "nxrt.registry",
    "ExecutionProviderCapabilities": "nxrt.weight",
    "get_plugin_manager": "nxrt.host",
    "run_batched": "nxrt.batch",
}

if TYPE_CHECKING:
    from nxrt.batch import run_batched
    from nxrt.compiling import CompilingProvider, ExportedKernel
    from nxrt.devices import (
        OrtArenaCfg,
        OrtDevice,
        OrtDeviceVendorId,
        OrtEpAssignedNode,
        OrtEpAssignedSubgraph,
        OrtEpDevice,
        OrtHardwareDevice,
        OrtHardwareDeviceType,
        OrtSyncStream,
        create_and_register_allocator,
        create_and_register_allocator_v2,
        get_ep_devices,
        register_execution_provider_library,
        unregister_execution_provider_library,
    )
    from nxrt.host import NxrtPluginManager, get_plugin_manager
    from nxrt.iobinding import IOBinding
    from nxrt.kernel import Cost, Kernel, KernelMatch, SubgraphClaim
    from nxrt.lora import AdapterFormat, LoraAdapter
    from nxrt.ortvalue import (
        OrtAllocatorType,
        OrtDeviceMemoryType,
        OrtMemoryInfo,
        OrtMemoryInfoDeviceType,
        OrtMemType,
        OrtValue,
        copy_tensors,
    )
    from nxrt.provider import EpConfig, ExecutionProvider
    from nxrt.registry import EpRegistry, OpKey, OpRegistry
    from nxrt.runtime import (
        ORT_API_VERSION,
        disable_telemetry_events,
        enable_telemetry_events,
        get_all_providers,
        get_build_info,
        get_device,
        get_version_string,
        has_collective_ops,
        set_default_logger_callback,
        set_default_logger_severity,
        set_default_logger_verbosity,
    )
    from nxrt.session import (
        ExecutionMode,
        ExecutionOrder,
        GraphOptimizationLevel,
        InferenceSession,
        ModelMetadata,
        NodeArg,
        OrtExecutionProviderDevicePolicy,
        RunOptions,
        SessionOptions,
    )
    from nxrt.sparse import OrtSparseFormat, SparseTensor
    from nxrt.weight import ExecutionProviderCapabilities

_default_pm: NxrtPluginManager | None = None
_default_lock = threading.Lock()


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name == "capi":  # onnxruntime.capi.onnxruntime_pybind11_state and the like
        return importlib.import_module("nxrt.capi")
    if name == "SessionIOBinding":  # onnxruntime's name of the binding class in capi
        return importlib.import_module("nxrt.iobinding").IOBinding
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
    """The installed EPs in the default priority order (cpu last), by their ONNX Runtime
    names where they have one (``CPUExecutionProvider``), else by their nxrt ids; both
    kinds of name are accepted everywhere (docs/onnxruntime-compat.md)."""
    from nxrt.runtime import get_available_providers as available

    return available(default_plugin_manager())


__all__ = [
    "ORT_API_VERSION",
    "AdapterFormat",
    "LoraAdapter",
    "OrtArenaCfg",
    "OrtDevice",
    "OrtDeviceMemoryType",
    "OrtDeviceVendorId",
    "OrtEpAssignedNode",
    "OrtEpAssignedSubgraph",
    "OrtEpDevice",
    "OrtHardwareDevice",
    "OrtHardwareDeviceType",
    "OrtMemoryInfoDeviceType",
    "OrtSparseFormat",
    "OrtSyncStream",
    "SparseTensor",
    "create_and_register_allocator",
    "create_and_register_allocator_v2",
    "get_ep_devices",
    "register_execution_provider_library",
    "unregister_execution_provider_library",
    "CompilingProvider",
    "Cost",
    "EpConfig",
    "EpRegistry",
    "ExecutionMode",
    "ExecutionOrder",
    "ExecutionProvider",
    "ExecutionProviderCapabilities",
    "ExportedKernel",
    "GraphOptimizationLevel",
    "IOBinding",
    "InferenceSession",
    "Kernel",
    "KernelMatch",
    "ModelMetadata",
    "NodeArg",
    "OpKey",
    "OpRegistry",
    "OrtAllocatorType",
    "OrtExecutionProviderDevicePolicy",
    "OrtMemType",
    "OrtMemoryInfo",
    "OrtValue",
    "RunOptions",
    "SessionOptions",
    "SubgraphClaim",
    "copy_tensors",
    "default_plugin_manager",
    "disable_telemetry_events",
    "enable_telemetry_events",
    "get_all_providers",
    "get_available_providers",
    "get_build_info",
    "get_device",
    "get_plugin_manager",
    "get_version_string",
    "has_collective_ops",
    "hookimpl",
    "package_name",
    "run_batched",
    "set_default_logger_callback",
    "set_default_logger_severity",
    "set_default_logger_verbosity",
    "version",
]

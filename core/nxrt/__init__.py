"""nxrt: an ONNX inference runtime whose execution providers are installed plugins.

``import nxrt`` loads no plugin and no backend library: the plugin manager is
built on first use, and heavy modules are imported when first touched.
"""

from __future__ import annotations

import importlib
import threading
from typing import TYPE_CHECKING, Any

import pluggy

from nxrt import _moved

_moved.install()

__version__ = "0.1.0"
#: onnxruntime's names for the package and its version (nxrt's own; the ONNX Runtime API
#: version nxrt follows is ``ORT_API_VERSION``, which ``get_version_string()`` reports).
package_name = "nxrt"
version = __version__

#: The marker plugins put on their hook implementations: ``@nxrt.hookimpl``.
hookimpl = pluggy.HookimplMarker("nxrt")

_LAZY = {
    "InferenceSession": "nxrt.ort.session",
    "SessionOptions": "nxrt.ort.session",
    "RunOptions": "nxrt.ort.session",
    "GraphOptimizationLevel": "nxrt.ort.session",
    "NodeArg": "nxrt.ort.session",
    "ModelMetadata": "nxrt.ort.session",
    "ExecutionMode": "nxrt.ort.session",
    "ExecutionOrder": "nxrt.ort.session",
    "OrtExecutionProviderDevicePolicy": "nxrt.ort.session",
    "OrtValue": "nxrt.ort.ortvalue",
    "OrtMemoryInfo": "nxrt.ort.ortvalue",
    "OrtMemType": "nxrt.ort.ortvalue",
    "OrtAllocatorType": "nxrt.ort.ortvalue",
    "OrtDeviceMemoryType": "nxrt.ort.ortvalue",
    "OrtMemoryInfoDeviceType": "nxrt.ort.ortvalue",
    "OrtDevice": "nxrt.ort.devices",
    "OrtDeviceVendorId": "nxrt.ort.devices",
    "OrtEpDevice": "nxrt.ort.devices",
    "OrtHardwareDevice": "nxrt.ort.devices",
    "OrtHardwareDeviceType": "nxrt.ort.devices",
    "OrtSyncStream": "nxrt.ort.devices",
    "OrtArenaCfg": "nxrt.ort.devices",
    "OrtEpAssignedNode": "nxrt.ort.devices",
    "OrtEpAssignedSubgraph": "nxrt.ort.devices",
    "get_ep_devices": "nxrt.ort.devices",
    "register_execution_provider_library": "nxrt.ort.devices",
    "unregister_execution_provider_library": "nxrt.ort.devices",
    "create_and_register_allocator": "nxrt.ort.devices",
    "create_and_register_allocator_v2": "nxrt.ort.devices",
    "SparseTensor": "nxrt.ort.sparse",
    "OrtSparseFormat": "nxrt.ort.sparse",
    "AdapterFormat": "nxrt.ort.lora",
    "LoraAdapter": "nxrt.ort.lora",
    "IOBinding": "nxrt.ort.iobinding",
    "ORT_API_VERSION": "nxrt.ort.runtime",
    "get_all_providers": "nxrt.ort.runtime",
    "get_build_info": "nxrt.ort.runtime",
    "get_device": "nxrt.ort.runtime",
    "get_version_string": "nxrt.ort.runtime",
    "has_collective_ops": "nxrt.ort.runtime",
    "copy_tensors": "nxrt.ort.ortvalue",
    "set_default_logger_callback": "nxrt.ort.runtime",
    "set_default_logger_severity": "nxrt.ort.runtime",
    "set_default_logger_verbosity": "nxrt.ort.runtime",
    "disable_telemetry_events": "nxrt.ort.runtime",
    "enable_telemetry_events": "nxrt.ort.runtime",
    "ExecutionProvider": "nxrt.provider",
    "EpConfig": "nxrt.provider",
    "CompilingProvider": "nxrt.compiling",
    "ExportedKernel": "nxrt.compiling",
    "Kernel": "nxrt.kernel",
    "KernelMatch": "nxrt.registry",
    "Cost": "nxrt.kernel",
    "SubgraphClaim": "nxrt.kernel",
    "OpKey": "nxrt.registry",
    "OpRegistry": "nxrt.registry",
    "EpRegistry": "nxrt.ep_registry",
    "ExecutionProviderCapabilities": "nxrt.weight",
    "get_plugin_manager": "nxrt.host",
    "run_batched": "nxrt.tools.batch",
    "cache_folder": "nxrt._files",
}

if TYPE_CHECKING:
    from nxrt._files import cache_folder
    from nxrt.compiling import CompilingProvider, ExportedKernel
    from nxrt.ep_registry import EpRegistry
    from nxrt.host import NxrtPluginManager, get_plugin_manager
    from nxrt.kernel import Cost, Kernel, SubgraphClaim
    from nxrt.ort.devices import (
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
    from nxrt.ort.iobinding import IOBinding
    from nxrt.ort.lora import AdapterFormat, LoraAdapter
    from nxrt.ort.ortvalue import (
        OrtAllocatorType,
        OrtDeviceMemoryType,
        OrtMemoryInfo,
        OrtMemoryInfoDeviceType,
        OrtMemType,
        OrtValue,
        copy_tensors,
    )
    from nxrt.ort.runtime import (
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
    from nxrt.ort.session import (
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
    from nxrt.ort.sparse import OrtSparseFormat, SparseTensor
    from nxrt.provider import EpConfig, ExecutionProvider
    from nxrt.registry import KernelMatch, OpKey, OpRegistry
    from nxrt.tools.batch import run_batched
    from nxrt.weight import ExecutionProviderCapabilities

_default_pm: NxrtPluginManager | None = None
_default_lock = threading.Lock()


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name == "capi":  # onnxruntime.capi.onnxruntime_pybind11_state and the like
        return importlib.import_module("nxrt.capi")
    if name == "SessionIOBinding":  # onnxruntime's name of the binding class in capi
        return importlib.import_module("nxrt.ort.iobinding").IOBinding
    if f"nxrt.{name}" in _moved.MOVED:  # ``from nxrt import session``: the flat layout's path
        return importlib.import_module(f"nxrt.{name}")
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
    from nxrt.ort.runtime import get_available_providers as available

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
    "cache_folder",
    "set_default_logger_callback",
    "set_default_logger_severity",
    "set_default_logger_verbosity",
    "version",
]

"""What code written for onnxruntime imports from ``onnxruntime.capi.onnxruntime_pybind11_state``.

Its exception classes (``Fail``, ``InvalidArgument``, ``NoSuchFile``...), which
nxrt's own errors derive from (:mod:`nxrt.errors`), and the classes and
functions onnxruntime also exposes there, each the same object as in ``nxrt``.
"""

from __future__ import annotations

from nxrt._status import (
    DeviceReset,
    EngineError,
    EPFail,
    Fail,
    InvalidArgument,
    InvalidGraph,
    InvalidProtobuf,
    ModelLoadCanceled,
    ModelLoaded,
    ModelRequiresCompilation,
    NoModel,
    NoSuchFile,
    NotFound,
    NotImplemented,
    RuntimeException,
)
from nxrt.ort.devices import (
    OrtArenaCfg,
    OrtDevice,
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
from nxrt.ort.iobinding import IOBinding as SessionIOBinding
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


def get_default_session_options() -> SessionOptions:
    """A session's options when none are given."""
    return SessionOptions()


def get_available_providers() -> list[str]:
    """The installed EPs by their public names (see :func:`nxrt.get_available_providers`)."""
    from nxrt import get_available_providers as available

    return available()


__all__ = [
    "AdapterFormat",
    "DeviceReset",
    "LoraAdapter",
    "OrtArenaCfg",
    "OrtDevice",
    "OrtDeviceMemoryType",
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
    "EPFail",
    "EngineError",
    "ExecutionMode",
    "ExecutionOrder",
    "Fail",
    "GraphOptimizationLevel",
    "InferenceSession",
    "InvalidArgument",
    "InvalidGraph",
    "InvalidProtobuf",
    "ModelLoadCanceled",
    "ModelLoaded",
    "ModelMetadata",
    "ModelRequiresCompilation",
    "NoModel",
    "NoSuchFile",
    "NodeArg",
    "NotFound",
    "NotImplemented",
    "OrtAllocatorType",
    "OrtExecutionProviderDevicePolicy",
    "OrtMemType",
    "OrtMemoryInfo",
    "OrtValue",
    "RunOptions",
    "RuntimeException",
    "SessionIOBinding",
    "SessionOptions",
    "copy_tensors",
    "disable_telemetry_events",
    "enable_telemetry_events",
    "get_all_providers",
    "get_available_providers",
    "get_build_info",
    "get_default_session_options",
    "get_device",
    "get_version_string",
    "has_collective_ops",
    "set_default_logger_callback",
    "set_default_logger_severity",
    "set_default_logger_verbosity",
]

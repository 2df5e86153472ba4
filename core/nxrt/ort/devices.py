"""onnxruntime's plugin-EP API on nxrt: EP devices, EP libraries, allocators, assignment.

onnxruntime's newest API speaks of devices rather than provider names: each
execution provider offers its hardware as ``OrtEpDevice``s
(:func:`get_ep_devices`), a session is given devices
(``SessionOptions.add_provider_for_devices``), and a provider can come from
a library registered by path (:func:`register_execution_provider_library`).
nxrt's EPs are plugins, so the mapping is direct:

- every installed EP is one ``OrtEpDevice`` on its device (device 0), named
  by the EP's public name (docs/onnxruntime-compat.md), found without
  starting the EP;
- a library registered by path is handed to every plugin through the EP
  registry (``Registrar.ep_libraries``); the legacy_abi plugin makes an EP of
  it, which answers to the registration name;
- nxrt keeps no memory arena, so arena settings and shared allocators are
  accepted, checked as onnxruntime checks them, and change nothing.

``OrtDevice`` (the device kind sparse tensors and allocators name) and the
records of ``get_provider_graph_assignment_info()`` live here too.
"""

from __future__ import annotations

import ctypes
import enum
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nxrt.errors import InvalidArgument, RuntimeFailure
from nxrt.ort import runtime
from nxrt.ort.ortvalue import OrtAllocatorType, OrtDeviceMemoryType, OrtMemoryInfo, OrtMemType
from nxrt.registry import normalize_domain

if TYPE_CHECKING:
    from nxrt.ep_registry import EpDescriptor
    from nxrt.host import NxrtPluginManager
    from nxrt.pipeline.partition import PartitionReport


# -- OrtDevice ---------------------------------------------------------------------------------
class OrtDeviceVendorId(enum.IntEnum):
    """PCI vendor ids, as onnxruntime numbers device vendors."""

    NONE = 0x0000
    AMD = 0x1002
    NVIDIA = 0x10DE
    ARM = 0x13B5
    MICROSOFT = 0x1414
    HUAWEI = 0x19E5
    QUALCOMM = 0x5143
    INTEL = 0x8086


#: onnxruntime's device names, with their device type and default vendor.
_DEVICE_NAMES: dict[str, tuple[int, int]] = {
    "cpu": (0, OrtDeviceVendorId.NONE),
    "gpu": (1, OrtDeviceVendorId.NONE),
    "cuda": (1, OrtDeviceVendorId.NVIDIA),
    "webgpu": (1, OrtDeviceVendorId.NONE),
    "fpga": (2, OrtDeviceVendorId.NONE),
    "npu": (3, OrtDeviceVendorId.NONE),
    "cann": (3, OrtDeviceVendorId.HUAWEI),
    "dml": (4, OrtDeviceVendorId.MICROSOFT),
}


class OrtDevice:
    """A device as onnxruntime's sparse tensors and allocators name it: its type (the
    numbers of :meth:`cpu`, :meth:`gpu`...), memory kind, vendor and id."""

    def __init__(
        self, device_type: int = 0, mem_type: int = 0, vendor_id: int = 0, device_id: int = 0
    ) -> None:
        self._type, self._mem = int(device_type), int(mem_type)
        self._vendor, self._id = int(vendor_id), int(device_id)

    @staticmethod
    def make(
        ort_device_name: str, device_id: int, vendor_id: int | OrtDeviceVendorId = -1
    ) -> OrtDevice:
        """The device ``ort_device_name`` (``"cpu"``, ``"cuda"``, ``"gpu"``...) number
        ``device_id``; ``vendor_id`` -1 takes the name's vendor (NVIDIA for cuda)."""
        known = _DEVICE_NAMES.get(str(ort_device_name))
        if known is None:
            raise InvalidArgument(
                f"Unsupported device type: {ort_device_name}; use one of {sorted(_DEVICE_NAMES)}"
            )
        device_type, default_vendor = known
        vendor = default_vendor if int(vendor_id) < 0 else int(vendor_id)
        return OrtDevice(device_type, OrtDevice.default_memory(), vendor, device_id)

    # onnxruntime's device type and memory numbers
    @staticmethod
    def cpu() -> int:
        return 0

    @staticmethod
    def gpu() -> int:
        return 1

    @staticmethod
    def cuda() -> int:
        return 1

    @staticmethod
    def webgpu() -> int:
        return 1

    @staticmethod
    def fpga() -> int:
        return 2

    @staticmethod
    def npu() -> int:
        return 3

    @staticmethod
    def cann() -> int:
        return 3

    @staticmethod
    def dml() -> int:
        return 4

    @staticmethod
    def default_memory() -> int:
        return 0

    def device_id(self) -> int:
        return self._id

    def device_type(self) -> int:
        return self._type

    def device_vendor_id(self) -> int:
        return self._vendor

    def device_mem_type(self) -> int:
        return self._mem

    vendor_id = device_vendor_id  # the names of onnxruntime's capi class
    mem_type = device_mem_type

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OrtDevice) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def _key(self) -> tuple[int, int, int, int]:
        return (self._type, self._mem, self._vendor, self._id)

    def __repr__(self) -> str:
        return (
            f"OrtDevice(type={self._type}, mem={self._mem}, vendor={self._vendor:#x}, "
            f"id={self._id})"
        )


# -- EP devices --------------------------------------------------------------------------------
class OrtHardwareDeviceType(enum.IntEnum):
    CPU = 0
    GPU = 1
    NPU = 2


@dataclass(frozen=True)
class OrtHardwareDevice:
    """The hardware an EP device runs on."""

    type: OrtHardwareDeviceType
    vendor: str = ""
    vendor_id: int = 0
    device_id: int = 0
    metadata: dict[str, str] = field(default_factory=dict)

    def __hash__(self) -> int:
        return hash((self.type, self.vendor_id, self.device_id))


class OrtSyncStream:
    """A device stream; nxrt's EPs finish every kernel before returning, so there is no
    stream to hand out: the handle is 0."""

    def get_handle(self) -> int:
        return 0


@dataclass(frozen=True)
class OrtEpDevice:
    """An installed EP on one device: what ``get_ep_devices()`` lists and
    ``SessionOptions.add_provider_for_devices`` takes. ``ep_id`` is nxrt's id of the EP."""

    ep_name: str
    ep_vendor: str
    device: OrtHardwareDevice
    ep_metadata: dict[str, str] = field(default_factory=dict)
    ep_options: dict[str, str] = field(default_factory=dict)
    ep_id: str = ""

    def __hash__(self) -> int:
        return hash((self.ep_id, self.ep_name, self.device))

    def memory_info(self, memory_type: OrtDeviceMemoryType) -> OrtMemoryInfo | None:
        """The memory of a device EP (None on the host, as onnxruntime's CPU EP answers; no
        nxrt EP offers host-accessible device memory)."""
        if self.device.type == OrtHardwareDeviceType.CPU:
            return None
        if OrtDeviceMemoryType(memory_type) != OrtDeviceMemoryType.DEFAULT:
            return None
        return OrtMemoryInfo(
            self.ep_name,
            OrtAllocatorType.ORT_DEVICE_ALLOCATOR,
            self.device.device_id,
            OrtMemType.DEFAULT,
        )

    def create_sync_stream(self) -> OrtSyncStream:
        if self.device.type == OrtHardwareDeviceType.CPU:
            raise RuntimeFailure(
                "ep_device does not use DEFAULT memory of a non-CPU device: a host EP has no "
                "stream; streams exist only for device EPs"
            )
        return OrtSyncStream()


_HARDWARE_TYPES = {"cpu": OrtHardwareDeviceType.CPU, "npu": OrtHardwareDeviceType.NPU}


def _cpu_vendor() -> tuple[str, int]:
    """The host CPU's vendor, as onnxruntime reports it for its CPU device."""
    if sys.platform == "darwin":
        return "Apple", 0x106B
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    vendor = line.split(":", 1)[1].strip()
                    return {"GenuineIntel": ("Intel", 0x8086), "AuthenticAMD": ("AMD", 0x1022)}.get(
                        vendor, (vendor, 0)
                    )
    except OSError:
        pass
    return "", 0


def ep_device(descriptor: EpDescriptor, plugin_manager: NxrtPluginManager) -> OrtEpDevice:
    """The ``OrtEpDevice`` of an installed EP, from what discovery knows of it."""
    kind = _HARDWARE_TYPES.get(descriptor.device_type, OrtHardwareDeviceType.GPU)
    vendor, vendor_id = _cpu_vendor() if kind == OrtHardwareDeviceType.CPU else ("", 0)
    info = plugin_manager.plugin_info.get(descriptor.plugin)
    metadata = {"version": info.version} if info is not None and info.version else {}
    return OrtEpDevice(
        ep_name=runtime.public_name(descriptor),
        ep_vendor=(info.distribution if info is not None and info.distribution else "nxrt"),
        device=OrtHardwareDevice(
            kind, vendor, vendor_id, 0, {"nxrt_device": descriptor.device_type}
        ),
        ep_metadata=metadata,
        ep_id=descriptor.id,
    )


def _plugin_manager(plugin_manager: NxrtPluginManager | None) -> NxrtPluginManager:
    from nxrt import default_plugin_manager

    return plugin_manager or default_plugin_manager()


def get_ep_devices(plugin_manager: NxrtPluginManager | None = None) -> list[OrtEpDevice]:
    """One ``OrtEpDevice`` per installed EP, in the default priority order (cpu last)."""
    from nxrt.host import Host

    pm = _plugin_manager(plugin_manager)
    registry = Host(pm).build_registry()
    return [ep_device(registry.providers[i], pm) for i in registry.default_order()]


# -- EP libraries ------------------------------------------------------------------------------
#: The symbol every ONNX Runtime plugin-EP library exports.
EP_LIBRARY_ENTRY = "CreateEpFactories"


def register_execution_provider_library(
    registration_name: str,
    library_path: str | os.PathLike[str],
    plugin_manager: NxrtPluginManager | None = None,
) -> None:
    """Make an ONNX Runtime plugin-EP library an EP of this process's sessions.

    The library is checked as onnxruntime checks it (it loads and exports
    ``CreateEpFactories``); the plugins then see it in ``Registrar.ep_libraries``
    when they register their EPs, and legacy_abi adds an EP answering to
    ``registration_name``. A relative path is taken from the working directory.
    """
    name, path = str(registration_name), os.path.abspath(os.fspath(library_path))
    pm = _plugin_manager(plugin_manager)
    if name in pm.ep_libraries:
        raise RuntimeFailure(
            f"an execution provider library is already registered as {name!r} "
            f"({pm.ep_libraries[name]}); unregister_execution_provider_library({name!r}) first"
        )
    try:
        library = ctypes.CDLL(path)
    except OSError as exc:
        raise RuntimeFailure(f"Failed to load library {path} with error: {exc}") from exc
    if not hasattr(library, EP_LIBRARY_ENTRY):
        raise RuntimeFailure(
            f"Failed to get symbol {EP_LIBRARY_ENTRY} from {path}: it is not an ONNX Runtime "
            "plugin-EP library"
        )
    pm.ep_libraries[name] = path
    from nxrt.host import Host

    if Host(pm).build_registry().resolve(name) is None:
        runtime.logger.warning(
            "EP library %r registered, but no installed plugin runs ONNX Runtime plugin-EP "
            "libraries: install nxrt-ep-legacy-abi (and onnxruntime) to use it",
            name,
        )


def unregister_execution_provider_library(
    registration_name: str, plugin_manager: NxrtPluginManager | None = None
) -> None:
    """Forget a library registered with :func:`register_execution_provider_library`:
    sessions created afterwards no longer have its EP."""
    pm = _plugin_manager(plugin_manager)
    if pm.ep_libraries.pop(str(registration_name), None) is None:
        raise RuntimeFailure(
            f"Execution provider library: {registration_name} was not registered. Registered: "
            f"{sorted(pm.ep_libraries) or 'none'}"
        )


# -- arenas and shared allocators ----------------------------------------------------------------
class OrtArenaCfg:
    """onnxruntime's arena settings. nxrt keeps no arena (every buffer comes from its EP's
    allocator and is freed after its last use), so these are kept and change nothing.

    Takes ``(max_mem, arena_extend_strategy, initial_chunk_size_bytes,
    max_dead_bytes_per_chunk)`` or a dict of any of :attr:`KEYS`; -1 is onnxruntime's default.
    """

    KEYS = (
        "max_mem",
        "arena_extend_strategy",
        "initial_chunk_size_bytes",
        "max_dead_bytes_per_chunk",
        "initial_growth_chunk_size_bytes",
        "max_power_of_two_extend_bytes",
    )

    def __init__(self, *args: Any) -> None:
        values: Mapping[str, Any]
        if len(args) == 1 and isinstance(args[0], Mapping):
            values = args[0]
            unknown = [k for k in values if k not in self.KEYS]
            if unknown:
                raise RuntimeFailure(
                    f"Invalid OrtArenaCfg option: {unknown[0]}; the options are {self.KEYS}"
                )
        elif len(args) == 4:
            values = dict(zip(self.KEYS, args))
        else:
            raise TypeError(
                "OrtArenaCfg takes (max_mem, arena_extend_strategy, initial_chunk_size_bytes, "
                "max_dead_bytes_per_chunk) or a dict of options"
            )
        self.max_mem = 0 if "max_mem" not in values else int(values["max_mem"])
        for key in self.KEYS[1:]:
            setattr(self, key, int(values.get(key, -1)))

    def __repr__(self) -> str:
        settings = ", ".join(f"{k}={getattr(self, k)}" for k in self.KEYS)
        return f"OrtArenaCfg({settings})"


def create_and_register_allocator(
    mem_info: OrtMemoryInfo, arena_cfg: OrtArenaCfg | None = None
) -> None:
    """A shared CPU allocator for sessions with ``session.use_env_allocators`` set. nxrt's
    sessions allocate from their EPs (no arena), so this is checked as onnxruntime checks it
    and changes nothing."""
    if not isinstance(mem_info, OrtMemoryInfo):
        raise TypeError(f"mem_info must be an OrtMemoryInfo, got {type(mem_info).__name__}")
    if mem_info.name.lower() != "cpu":
        raise RuntimeFailure(
            "Error when creating and registering allocator: Only CPU devices are supported. "
            "Please call create_and_register_allocator_v2() for other device."
        )


def create_and_register_allocator_v2(
    provider_type: str,
    mem_info: OrtMemoryInfo,
    provider_options: Mapping[str, str],
    arena_cfg: OrtArenaCfg | None = None,
) -> None:
    """A shared allocator of an installed EP's device (see :func:`create_and_register_allocator`:
    accepted, no effect); a provider no installed EP answers to is refused."""
    from nxrt.host import Host

    if not isinstance(mem_info, OrtMemoryInfo):
        raise TypeError(f"mem_info must be an OrtMemoryInfo, got {type(mem_info).__name__}")
    registry = Host(_plugin_manager(None)).build_registry()
    if registry.resolve(str(provider_type)) is None:
        raise RuntimeFailure(
            "Error when creating and registering allocator in create_and_register_allocator_v2: "
            f"{provider_type} is not installed (installed: {', '.join(registry.default_order())})"
        )


# -- which EP got which node ---------------------------------------------------------------------
#: The session config entry onnxruntime requires for ``get_provider_graph_assignment_info()``.
RECORD_ASSIGNMENT = "session.record_ep_graph_assignment_info"


@dataclass(frozen=True)
class OrtEpAssignedNode:
    domain: str
    op_type: str
    name: str


@dataclass(frozen=True)
class OrtEpAssignedSubgraph:
    """Nodes one EP runs together: a claim (one compiled partition), or one node."""

    ep_name: str
    nodes: tuple[OrtEpAssignedNode, ...] = ()

    def get_nodes(self) -> list[OrtEpAssignedNode]:
        return list(self.nodes)


def assigned_subgraphs(
    report: PartitionReport, names: Mapping[str, str]
) -> list[OrtEpAssignedSubgraph]:
    """The partition report in onnxruntime's shape: one subgraph per claim and one per node
    an EP runs on its own, in graph order, each EP named as ``names`` (id -> name) says."""
    claims = {claim.name: claim for claim in report.claims}
    found: list[OrtEpAssignedSubgraph] = []
    done: set[str] = set()
    for placement in report.nodes:
        name = names.get(placement.ep, placement.ep)
        if not placement.claim:
            node = OrtEpAssignedNode(placement.domain, placement.op_type, placement.node)
            found.append(OrtEpAssignedSubgraph(name, (node,)))
        elif placement.claim not in done:
            done.add(placement.claim)
            nodes = tuple(
                OrtEpAssignedNode(normalize_domain(n.domain), n.op_type, n.name or "")
                for n in claims[placement.claim].nodes
            )
            found.append(OrtEpAssignedSubgraph(name, nodes))
    return found


def devices_of(ep_devices: Sequence[Any]) -> list[OrtEpDevice]:
    """``ep_devices`` checked as onnxruntime checks the argument of ``add_provider_for_devices``."""
    if not ep_devices:
        raise InvalidArgument("Must provide one or more OrtEpDevice instances.")
    for device in ep_devices:
        if not isinstance(device, OrtEpDevice):
            raise TypeError(
                f"add_provider_for_devices takes OrtEpDevice objects (from get_ep_devices()), "
                f"got {type(device).__name__}"
            )
    return list(ep_devices)


__all__ = [
    "OrtArenaCfg",
    "OrtDevice",
    "OrtDeviceVendorId",
    "OrtEpAssignedNode",
    "OrtEpAssignedSubgraph",
    "OrtEpDevice",
    "OrtHardwareDevice",
    "OrtHardwareDeviceType",
    "OrtSyncStream",
    "RECORD_ASSIGNMENT",
    "assigned_subgraphs",
    "create_and_register_allocator",
    "create_and_register_allocator_v2",
    "ep_device",
    "get_ep_devices",
    "register_execution_provider_library",
    "unregister_execution_provider_library",
]

"""Options of a session and of a run: ``SessionOptions``, ``RunOptions`` and their enums.

In a module of their own so that what a session is built from, and what a run is
given, can be named without the session (``IOBinding`` takes ``RunOptions``).
"""

from __future__ import annotations

import ctypes
import enum
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from nxrt.errors import InvalidArgument, RuntimeFailure
from nxrt.ort import runtime
from nxrt.ort.devices import OrtEpDevice, devices_of
from nxrt.ort.lora import LoraAdapter
from nxrt.ort.ortvalue import OrtValue
from nxrt.pipeline.selection import ExecutionProviderDevicePolicy


class GraphOptimizationLevel(enum.IntEnum):
    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_LAYOUT = 3
    ORT_ENABLE_ALL = 99


class ExecutionMode(enum.IntEnum):
    """How nodes are scheduled. nxrt runs its plan in order, each kernel using the session's
    threads; ``ORT_PARALLEL`` (independent branches at once) runs as ``ORT_SEQUENTIAL``,
    with a warning, as onnxruntime does for EPs that cannot run branches in parallel."""

    ORT_SEQUENTIAL = 0
    ORT_PARALLEL = 1


class ExecutionOrder(enum.IntEnum):
    """The order of the plan's nodes; nxrt's is its own topological schedule, so any value
    other than ``DEFAULT`` is reported with a warning and the schedule is kept."""

    DEFAULT = 0
    PRIORITY_BASED = 1
    MEMORY_EFFICIENT = 2


class SessionOptions:
    """Session settings, with ONNX Runtime's attribute names and defaults.

    Settings of onnxruntime features nxrt lacks behave as onnxruntime built
    without the feature (docs/onnxruntime-compat.md): nxrt keeps no memory
    arena and no memory patterns, so ``enable_cpu_mem_arena``,
    ``enable_mem_pattern`` and ``enable_mem_reuse`` set to False ask for what
    nxrt always does (every buffer comes from its EP's allocator and is
    released after its last use); ``execution_mode`` and ``execution_order``
    other than the defaults are reported with a warning when a session starts.
    """

    def __init__(self) -> None:
        self.intra_op_num_threads = 0
        self.inter_op_num_threads = 0
        self.graph_optimization_level = GraphOptimizationLevel.ORT_ENABLE_ALL
        self.execution_mode = ExecutionMode.ORT_SEQUENTIAL
        self.execution_order = ExecutionOrder.DEFAULT
        self.enable_profiling = False
        self.profile_file_prefix = "nxrt_profile"
        self.optimized_model_filepath = ""
        self.enable_cpu_mem_arena = True
        self.enable_mem_pattern = True
        self.enable_mem_reuse = True
        self.use_deterministic_compute = False
        self.use_per_session_threads = True
        self.log_severity_level = -1  # -1: the default logger's severity
        self.log_verbosity_level = 0
        self.logid = ""
        self._config: dict[str, str] = {}
        self._selection_policy = ExecutionProviderDevicePolicy.DEFAULT
        self._policy_set = False
        self._providers: list[tuple[str, dict[str, Any]]] = []
        self._initializers: dict[str, OrtValue] = {}
        self._external_initializers: dict[str, OrtValue] = {}
        self._free_dimensions: dict[str, int] = {}
        self._free_dimension_denotations: dict[str, int] = {}
        self._external_files: dict[str, np.ndarray] = {}
        self._custom_op_libraries: list[str] = []

    def set_provider_selection_policy(self, policy: ExecutionProviderDevicePolicy | str) -> None:
        """How a session given no ``providers`` picks its EPs (see :mod:`nxrt.pipeline.selection`).

        Takes an :class:`OrtExecutionProviderDevicePolicy` (ONNX Runtime's
        names: ``PREFER_CPU``, ``PREFER_GPU``, ``MAX_PERFORMANCE`` ..., plus
        nxrt's ``MEASURE``, the default, and ``PRIORITY``) or its name.
        """
        self._selection_policy = ExecutionProviderDevicePolicy.parse(policy)
        self._policy_set = True

    @property
    def provider_selection_policy(self) -> ExecutionProviderDevicePolicy:
        return self._selection_policy

    def add_provider(self, provider_name: str, provider_options: dict[str, Any]) -> None:
        """An EP (id or ONNX Runtime name) for sessions created without ``providers``."""
        self._providers.append((str(provider_name), dict(provider_options)))

    def add_provider_for_devices(
        self, ep_devices: Sequence[OrtEpDevice], provider_options: dict[str, str]
    ) -> None:
        """The EPs of ``ep_devices`` (from ``get_ep_devices()``) with ``provider_options``, for
        sessions created without ``providers``: onnxruntime's way to choose plugin EPs."""
        for device in devices_of(ep_devices):
            options = dict(provider_options)
            if device.device.device_id:
                options.setdefault("device_id", str(device.device.device_id))
            if all(name != device.ep_name for name, _ in self._providers):
                self.add_provider(device.ep_name, options)

    def has_providers(self) -> bool:
        """Whether EPs or a selection policy were set on these options."""
        return bool(self._providers) or self._policy_set

    def add_session_config_entry(self, key: str, value: str) -> None:
        self._config[str(key)] = str(value)

    def get_session_config_entry(self, key: str) -> str:
        return _config_entry(self._config, key, "SessionOptions", "add_session_config_entry")

    def config_flag(self, key: str) -> bool:
        return self._config.get(key, "0") not in ("", "0")

    def add_initializer(self, name: str, value: OrtValue) -> None:
        """Replace the model's initializer ``name`` by ``value``'s data, which the session
        reads without a copy (keep ``value`` unchanged while sessions use it)."""
        self._initializers[str(name)] = _host_ortvalue(value, "add_initializer")

    def add_external_initializers(self, names: Sequence[str], values: Sequence[OrtValue]) -> None:
        """Give the data of initializers the model keeps in external files (e.g. weights
        the application already holds in memory), instead of reading those files."""
        if len(names) != len(values):
            raise InvalidArgument(
                f"add_external_initializers got {len(names)} names and {len(values)} values; "
                "give one OrtValue per name"
            )
        for name, value in zip(names, values):
            self._external_initializers[str(name)] = _host_ortvalue(
                value, "add_external_initializers"
            )

    def add_free_dimension_override_by_name(self, dim_name: str, dim_value: int) -> None:
        """Fix the symbolic dimension ``dim_name`` of the model to ``dim_value``."""
        if int(dim_value) < 0:
            raise InvalidArgument(f"dimension {dim_name!r} cannot be {dim_value}: sizes are >= 0")
        self._free_dimensions[str(dim_name)] = int(dim_value)

    def add_free_dimension_override_by_denotation(
        self, dim_denotation: str, dim_value: int
    ) -> None:
        """Fix every free dimension denoted ``dim_denotation`` (``DATA_BATCH``...) to
        ``dim_value``."""
        if int(dim_value) < 0:
            raise InvalidArgument(
                f"dimensions denoted {dim_denotation!r} cannot be {dim_value}: sizes are >= 0"
            )
        self._free_dimension_denotations[str(dim_denotation)] = int(dim_value)

    def add_external_initializers_from_files_in_memory(
        self, file_names: Sequence[str], buffers: Sequence[Any], lengths: Sequence[int]
    ) -> None:
        """Give the contents of the external-data files the model names (``file_names``, as
        the model's ``location`` fields write them) from memory instead of the disk. The
        buffers are read in place (keep them alive and unchanged while sessions use them)."""
        if not len(file_names) == len(buffers) == len(lengths):
            raise InvalidArgument(
                f"add_external_initializers_from_files_in_memory got {len(file_names)} names, "
                f"{len(buffers)} buffers and {len(lengths)} lengths; give one of each per file"
            )
        for name, buffer, length in zip(file_names, buffers, lengths):
            data = np.frombuffer(buffer, dtype=np.uint8)
            if int(length) > data.size:
                raise InvalidArgument(
                    f"file {name!r} is given {length} bytes long, but its buffer has {data.size}"
                )
            self._external_files[os.fspath(name)] = data[: int(length)]

    def register_custom_ops_library(self, library_path: str) -> None:
        """Load an ONNX Runtime custom-op library, refusing it as onnxruntime does when it
        cannot be loaded or lacks ``RegisterCustomOps``.

        nxrt's kernels come from its EP plugins, so it runs none of the library's
        kernels: a warning says so, and a node of the library's ops needs an
        installed EP implementing it (else ``NoEpForOp`` names it).
        """
        path = os.fspath(library_path)
        try:
            library = ctypes.CDLL(path)
        except OSError as exc:
            raise RuntimeFailure(f"failed to load library {path}: {exc}") from exc
        if not hasattr(library, "RegisterCustomOps"):
            raise RuntimeFailure(
                f"failed to get symbol RegisterCustomOps from {path}: it is not an ONNX Runtime "
                "custom-op library"
            )
        runtime.logger.warning(
            "custom-op library %s loaded; nxrt runs no kernels from ONNX Runtime libraries: "
            "its ops need an installed nxrt EP that implements them",
            path,
        )
        self._custom_op_libraries.append(path)


def _host_ortvalue(value: Any, method: str) -> OrtValue:
    if not isinstance(value, OrtValue):
        raise RuntimeFailure(
            f"{method} takes an OrtValue, got {type(value).__name__}; wrap an array with "
            "OrtValue.ortvalue_from_numpy(array)"
        )
    return value


class RunOptions:
    """Per-run settings, with ONNX Runtime's attribute names and defaults.

    ``terminate`` set to True (before or during a run, from any thread) stops the runs
    using these options between two kernels; ``only_execute_path_to_fetches`` runs only
    the kernels the requested outputs depend on.
    """

    def __init__(self) -> None:
        self.log_severity_level = -1  # -1: the session's
        self.log_verbosity_level = 0
        self.logid = ""
        self.terminate = False
        self.only_execute_path_to_fetches = False
        self._config: dict[str, str] = {}
        self._adapters: list[LoraAdapter] = []

    @property
    def run_tag(self) -> str:
        """onnxruntime's former name of ``logid``."""
        return self.logid

    @run_tag.setter
    def run_tag(self, value: str) -> None:
        self.logid = value

    def add_active_adapter(self, adapter: LoraAdapter) -> None:
        """Run with ``adapter``'s parameters: each replaces the feed or initializer (one
        listed as a graph input) of its name; when two active adapters set one name, the
        first added wins, as in onnxruntime. The adapter is kept alive by these options."""
        if not isinstance(adapter, LoraAdapter):
            raise TypeError(f"add_active_adapter takes a LoraAdapter, got {type(adapter).__name__}")
        self._adapters.append(adapter)

    def add_run_config_entry(self, key: str, value: str) -> None:
        self._config[str(key)] = str(value)

    def get_run_config_entry(self, key: str) -> str:
        return _config_entry(self._config, key, "RunOptions", "add_run_config_entry")


def _config_entry(config: dict[str, str], key: str, owner: str, setter: str) -> str:
    """A config entry, or the RuntimeError onnxruntime raises (same message) for a key never
    set."""
    if key not in config:
        raise RuntimeFailure(
            f"{owner} does not have configuration with key: {key}; set it with {setter}"
        )
    return config[key]

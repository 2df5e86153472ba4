"""``LegacyOrtEp``: an nxrt EP that runs its claims on one ONNX Runtime provider.

Importing this module is cheap: onnxruntime is imported when an EP is
instantiated, never at discovery. :func:`discover_eps` decides which EP ids
exist from installed distributions and the environment only.

EP options (``providers=[("legacy_abi", {...})]``); every key not listed here
is passed to ORT as a provider option:

- ``provider`` — ORT's provider name (default: the EP id's own, e.g.
  ``CPUExecutionProvider`` for ``legacy_abi``);
- ``ep_libraries`` — ORT plugin-EP libraries to register first, as
  ``{name: path}`` or ``"name=path,..."``;
- ``ep_name`` — for a library EP, the EP name its devices report (default:
  the library's registration name);
- ``session_config`` — ORT session config entries, ``{key: value}``;
- ``graph_optimization_level`` — ORT's level (int or name; default: all);
- ``io_binding`` — bind inputs and outputs through IOBinding even on the host.
"""

from __future__ import annotations

import os
import re
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from nxrt.compiling import CompilingProvider, ExportedKernel
from nxrt.errors import EpLoadFailed, InvalidArgument, InvalidModel
from nxrt.kernel import Kernel, SubgraphClaim
from nxrt.provider import EpConfig
from nxrt.registry import normalize_domain

if TYPE_CHECKING:
    import onnx_ir as ir

    from nxrt.epcontext import EpContext
    from nxrt_ep_legacy_abi.abi import PluginCompiledKernel

EP_ID = "legacy_abi"
CPU_PROVIDER = "CPUExecutionProvider"
#: Environment variable naming ORT plugin-EP libraries: ``name=path,name=path``.
LIBRARIES_ENV = "NXRT_ORT_EP_LIBRARIES"
#: ORT distributions and the providers each adds (EP id suffix, provider name).
ORT_DISTRIBUTIONS: dict[str, tuple[tuple[str, str], ...]] = {
    "onnxruntime": (("coreml", "CoreMLExecutionProvider"),) if sys.platform == "darwin" else (),
    "onnxruntime-gpu": (
        ("cuda", "CUDAExecutionProvider"),
        ("tensorrt", "TensorrtExecutionProvider"),
    ),
    "onnxruntime-directml": (("dml", "DmlExecutionProvider"),),
    "onnxruntime-openvino": (("openvino", "OpenVINOExecutionProvider"),),
    "onnxruntime-qnn": (("qnn", "QNNExecutionProvider"),),
    "onnxruntime-migraphx": (("migraphx", "MIGraphXExecutionProvider"),),
    "onnxruntime-training": (),
}
#: Providers whose outputs can stay in device memory between claims (IOBinding).
#: The others take and return host arrays and move data inside ORT.
ORT_DEVICES = {"CUDAExecutionProvider": "cuda", "TensorrtExecutionProvider": "cuda"}


@dataclass(frozen=True)
class OrtEpSpec:
    """One EP id this plugin offers, known without importing onnxruntime."""

    id: str
    provider: str
    library: str | None = None
    description: str = ""

    @property
    def device(self) -> str:
        """ORT's device for the provider's outputs."""
        return ORT_DEVICES.get(self.provider, "cpu")

    @property
    def device_type(self) -> str:
        """nxrt's device name: values on an ORT device are ``OrtValue``s only ORT reads."""
        return "cpu" if self.device == "cpu" else f"ort_{self.device}"


def _installed(distribution: str) -> bool:
    from importlib_metadata import PackageNotFoundError
    from importlib_metadata import distribution as find

    try:
        find(distribution)
    except PackageNotFoundError:
        return False
    return True


def parse_libraries(text: str | Mapping[str, str], source: str = LIBRARIES_ENV) -> dict[str, str]:
    """``"name=path,name=path"`` (or a mapping) as ``{name: path}``."""
    if isinstance(text, Mapping):
        return {str(k): os.fspath(v) for k, v in text.items()}
    libraries = {}
    for item in str(text).split(","):
        if not item.strip():
            continue
        name, sep, path = item.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise InvalidArgument(f"{source}: {item.strip()!r} is not name=path")
        libraries[name.strip()] = path.strip()
    return libraries


def _slug(name: str) -> str:
    name = re.sub(r"ExecutionProvider$", "", name, flags=re.IGNORECASE)
    return re.sub(r"[^0-9a-zA-Z]+", "_", name).strip("_").lower() or "lib"


def discover_eps(
    environ: Mapping[str, str] = os.environ, libraries: Mapping[str, str] | None = None
) -> list[OrtEpSpec]:
    """The EP ids to register: ``legacy_abi``, one per extra provider, one per library.

    Read from installed distribution names (``onnxruntime-gpu`` brings CUDA),
    ``NXRT_ORT_EP_LIBRARIES`` and ``libraries`` (those registered with
    ``nxrt.register_execution_provider_library``, which win over the
    environment's of the same name); which providers really work is checked
    when an EP is instantiated, so a broken one fails only when asked for.
    """
    present = [name for name in ORT_DISTRIBUTIONS if _installed(name)]
    if not present:
        return []
    specs = [OrtEpSpec(EP_ID, CPU_PROVIDER, description="ONNX Runtime's providers (default: CPU)")]
    for dist in present:
        for suffix, provider in ORT_DISTRIBUTIONS[dist]:
            if all(s.provider != provider for s in specs):
                specs.append(
                    OrtEpSpec(f"{EP_ID}_{suffix}", provider, description=f"ONNX Runtime {provider}")
                )
    named = {**parse_libraries(environ.get(LIBRARIES_ENV, "")), **(libraries or {})}
    for name, path in named.items():
        ep_id = f"{EP_ID}_{_slug(name)}"
        while any(s.id == ep_id for s in specs):
            ep_id += "_lib"
        specs.append(
            OrtEpSpec(ep_id, name, library=path, description=f"ORT plugin EP {name} ({path})")
        )
    return specs


def create_ep(spec: OrtEpSpec, config: EpConfig) -> LegacyOrtEp:
    """The factory registered for each spec."""
    return LegacyOrtEp(config, spec)


# -- ORT plugin-EP libraries (process-wide in ORT, so recorded once here) ------------------------
_libraries: dict[str, str] = {}
_libraries_lock = threading.Lock()


def register_ep_library(name: str, path: str) -> None:
    """Register an ORT plugin-EP library; ``EpLoadFailed`` names the path and ORT's reason."""
    import onnxruntime as ort

    with _libraries_lock:
        known = _libraries.get(name)
        if known is not None:
            if known == path:
                return
            raise EpLoadFailed(path, f"an EP library named {name!r} is already loaded from {known}")
        try:
            ort.register_execution_provider_library(name, path)
        except Exception as exc:  # noqa: BLE001 - ORT raises its own Fail with the reason
            raise EpLoadFailed(path, f"ONNX Runtime refused the EP library: {exc}") from exc
        _libraries[name] = path


def _optimization_level(ort: Any, value: Any) -> Any:
    levels = ort.GraphOptimizationLevel
    if isinstance(value, str):
        try:
            return getattr(levels, value)
        except AttributeError:
            raise InvalidArgument(
                f"graph_optimization_level {value!r} is not one of ORT's"
            ) from None
    return {
        0: levels.ORT_DISABLE_ALL,
        1: levels.ORT_ENABLE_BASIC,
        2: levels.ORT_ENABLE_EXTENDED,
    }.get(int(value), levels.ORT_ENABLE_ALL)


class UnusedPartition(Kernel):
    """A claim whose results nothing reads (dead code): ORT refuses a model without outputs."""

    variant = "unused"

    def __init__(self, name: str) -> None:
        self.name = name

    def compute(self, inputs: Sequence[Any]) -> tuple[Any, ...]:
        return ()


class LegacyOrtEp(CompilingProvider):
    """An EP whose claims run as standalone models on one ONNX Runtime provider.

    :param config: The session's settings; ``config.options`` as described in
        the module docstring, ``threads`` becomes ORT's intra-op thread count.
    :param spec: Which provider (or plugin library) this EP id stands for.
    """

    uses_host_blas = False  # ORT computes on its own thread pool and its own GEMMs
    backend = "ONNX Runtime"

    def __init__(self, config: EpConfig | None = None, spec: OrtEpSpec | None = None) -> None:
        super().__init__(config)
        import onnxruntime as ort

        self._ort = ort
        spec = spec or OrtEpSpec(EP_ID, CPU_PROVIDER)
        options = dict(self.config.options)
        self.id = spec.id
        self.library = spec.library
        self.ort_provider = str(options.pop("provider", spec.provider))
        self.spec = OrtEpSpec(spec.id, self.ort_provider, spec.library, spec.description)
        self.device_type = self.spec.device_type
        device = self.spec.device
        self.ep_libraries = parse_libraries(options.pop("ep_libraries", {}) or {}, "ep_libraries")
        self.ep_name = str(options.pop("ep_name", self.ort_provider))
        self.session_config = {
            str(k): str(v) for k, v in dict(options.pop("session_config", {})).items()
        }
        self.optimization = _optimization_level(ort, options.pop("graph_optimization_level", 99))
        io_binding = options.pop("io_binding", None)
        self.provider_options = {str(k): str(v) for k, v in options.items()}
        if self.ort_provider != CPU_PROVIDER and self.library is None:
            self.provider_options.setdefault("device_id", str(self.config.device_id))
            if self.config.memory_limit and device == "cuda":
                self.provider_options.setdefault("gpu_mem_limit", str(self.config.memory_limit))
        from nxrt_ep_legacy_abi.abi import PluginExecutionPlan

        self.plan = PluginExecutionPlan(
            device,
            self.config.device_id,
            io_binding=None if io_binding is None else bool(io_binding),
        )
        self.capability: Any = None
        self._devices: list[Any] = []

    # -- lifecycle ------------------------------------------------------------------------------
    def initialize(self) -> None:
        """Load plugin libraries and check that the provider exists; ``EpLoadFailed`` if not."""
        from nxrt_ep_legacy_abi.capability import OrtCapability

        ort = self._ort
        libraries = dict(self.ep_libraries)
        if self.library is not None:
            libraries[self.ort_provider] = self.library
        for name, path in libraries.items():
            register_ep_library(name, path)
        is_library = self.ort_provider in libraries or self.ort_provider in _libraries
        if is_library:
            self._devices = [d for d in ort.get_ep_devices() if d.ep_name == self.ep_name]
            if not self._devices:
                offered = sorted({d.ep_name for d in ort.get_ep_devices()})
                raise EpLoadFailed(
                    libraries.get(self.ort_provider, _libraries.get(self.ort_provider, "")),
                    f"the library offers no device for EP {self.ep_name!r} (devices: {offered}); "
                    "set the option ep_name to one of them",
                )
        elif self.ort_provider not in ort.get_available_providers():
            raise EpLoadFailed(
                os.path.dirname(ort.__file__),
                f"ONNX Runtime {ort.__version__} has no {self.ort_provider}; available: "
                f"{', '.join(ort.get_available_providers())}. Install the onnxruntime package "
                "that ships it, or register its plugin library with the option ep_libraries.",
            )
        self.capability = OrtCapability(self.ort_provider, library=is_library)
        super().initialize()

    # -- capability ---------------------------------------------------------------------------
    def opsets_for(
        self, graph: ir.Graph, opsets: Mapping[str, int] | None = None
    ) -> dict[str, int]:
        """The graph's own imports only: a claim's standalone model takes its opsets from
        its graph, and an If/Loop body imports none, so its nodes are left to other EPs."""
        return {normalize_domain(d): int(v) for d, v in graph.opset_imports.items()}

    def refusal(self, node: ir.Node, graph: ir.Graph, opsets: Mapping[str, int]) -> str:
        return self.capability.refusal(node, opsets)

    def boundary_refusals(
        self, nodes: Sequence[ir.Node], graph: ir.Graph, opsets: Mapping[str, int]
    ) -> dict[int, str]:
        from nxrt_ep_legacy_abi.capability import boundary_refusals

        return boundary_refusals(nodes)

    # -- compiling ------------------------------------------------------------------------------
    def compile(self, claim: SubgraphClaim, graph: ir.Graph) -> PluginCompiledKernel | Kernel:
        """The claim as a standalone model in its own ORT session."""
        from nxrt_ep_legacy_abi.abi import PluginCompiledKernel

        self._require_initialized()
        if not claim.outputs:
            return UnusedPartition(claim.name)
        whole = len(claim.nodes) == graph.num_nodes()

        def make_session(blob: bytes, external: Mapping[str, np.ndarray]) -> Any:
            return self.make_session(blob, external, name=claim.name, spinning=whole)

        return PluginCompiledKernel.compile(claim, graph, self.plan, make_session)

    def make_session(
        self,
        blob: bytes,
        external: Mapping[str, np.ndarray] | None = None,
        *,
        name: str = "",
        spinning: bool = True,
    ) -> Any:
        """An ORT session for one standalone model, with this EP's provider and settings.

        ORT's intra-op threads spin after each call; when the model is split
        across several partitions that spinning competes with the next one,
        so it is turned off unless the claim is the whole graph.
        """
        ort = self._ort
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.graph_optimization_level = self.optimization
        if self.config.threads:
            options.intra_op_num_threads = int(self.config.threads)
        config = dict(self.session_config)
        if not spinning:
            config.setdefault("session.intra_op.allow_spinning", "0")
        for key, value in config.items():
            options.add_session_config_entry(key, value)
        if external:
            names = list(external)
            options.add_external_initializers(
                names, [ort.OrtValue.ortvalue_from_numpy(external[n]) for n in names]
            )
        try:
            if self._devices:
                options.add_provider_for_devices(self._devices, self.provider_options)
                return ort.InferenceSession(blob, options)
            providers: list[Any] = [(self.ort_provider, self.provider_options)]
            if self.ort_provider != CPU_PROVIDER:
                providers.append(CPU_PROVIDER)
            return ort.InferenceSession(blob, options, providers=providers)
        except Exception as exc:  # noqa: BLE001 - ORT's reason, shown whole
            raise InvalidModel(
                f"ONNX Runtime {ort.__version__} cannot build partition {name!r} on "
                f"{self.ort_provider}: {exc}"
            ) from exc

    # -- EPContext ------------------------------------------------------------------------------
    @property
    def sdk_version(self) -> str:
        return str(self._ort.__version__)

    @property
    def hardware(self) -> str:
        import platform

        return platform.machine()

    def export(self, claim: SubgraphClaim, kernel: Kernel) -> ExportedKernel:
        """The compiled claim's standalone model."""
        from nxrt_ep_legacy_abi.abi import PluginCompiledKernel

        if not isinstance(kernel, PluginCompiledKernel):
            raise InvalidArgument(
                f"partition {claim.name!r} computes nothing read later: no context"
            )
        return ExportedKernel(kernel.model_bytes(), notes=f"ONNX Runtime {self.ort_provider}")

    def load(self, context: EpContext) -> PluginCompiledKernel:
        """A kernel from a saved standalone model; any ORT version that reads its opsets will do."""
        from nxrt_ep_legacy_abi.abi import PluginCompiledKernel

        def make_session(blob: bytes, external: Mapping[str, np.ndarray]) -> Any:
            return self.make_session(blob, external, name=context.partition_name)

        return PluginCompiledKernel.from_bytes(
            context.ep_cache_context,
            context.inputs,
            context.outputs,
            self.plan,
            make_session,
            name=context.partition_name,
        )

    # -- memory ---------------------------------------------------------------------------------
    def copy_from_host(self, array: np.ndarray) -> Any:
        """Host arrays are bound as they are: ORT uploads only what a partition reads."""
        return array

    def copy_to_host(self, value: Any) -> np.ndarray:
        if isinstance(value, self._ort.OrtValue):
            return value.numpy()
        return np.asarray(value)

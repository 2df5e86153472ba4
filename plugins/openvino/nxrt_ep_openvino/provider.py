"""The openvino execution provider: claims what OpenVINO converts, compiles each claim once.

Importing this module, building an EP and asking its capabilities do not
import OpenVINO (``nxrt providers`` does all three); :meth:`initialize`
does, when a session is about to use the EP.

EP ids: ``openvino`` runs on OpenVINO's CPU device. Other devices get an id
each (``openvino_gpu``, ``openvino_npu``, ``openvino_gpu_1`` for ``GPU.1``)
when ``NXRT_OPENVINO_DEVICES`` names them (``GPU,NPU``), or lists whatever
OpenVINO finds when it is ``auto``. Enumerating devices opens OpenVINO and
its device plugins, which takes a noticeable part of a second, so it happens
only on request; any EP also takes a ``device`` option.

Options (``providers=[("openvino", {...})]``):

- ``device`` — OpenVINO's device name (default: the EP id's, ``CPU`` for ``openvino``);
- ``precision`` — ``f32`` (default), ``bf16`` or ``f16``: OpenVINO's
  ``INFERENCE_PRECISION_HINT``, always set, since on CPUs with AMX or
  AVX512-BF16 OpenVINO's own default is bf16, which changes results. bf16
  and f16 are faster where the device has them; bf16's largest error against
  ONNX Runtime on real models, measured by ``benchmarks/bench_openvino.py``, is
  1e-2 to 2.5e-1 (outputs of order one);
- ``num_threads`` — CPU threads (default: the session's ``intra_op_num_threads``,
  else OpenVINO's choice: every core);
- ``performance_hint`` — ``latency`` (default) or ``throughput`` (several
  streams: pays off when many threads call ``run`` at once);
- ``cache_dir`` — OpenVINO's model cache folder (``CACHE_DIR``): a second
  session compiling the same claim loads it from there;
- ``context_model`` — keep each claim's ONNX model beside OpenVINO's blob in
  an EPContext (default true), so a context made by another OpenVINO
  version or for another device is recompiled instead of refused;
- ``properties`` — further OpenVINO properties, ``{name: value}``, passed to
  ``compile_model`` as they are.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nxrt.compiling import CompilingProvider, ExportedKernel
from nxrt.errors import EpLoadFailed, InvalidArgument, InvalidModel
from nxrt.kernel import Kernel, SubgraphClaim
from nxrt.provider import EpConfig

if TYPE_CHECKING:
    import onnx_ir as ir

    from nxrt.epcontext import EpContext
    from nxrt_ep_openvino.capability import OpenVinoCapability
    from nxrt_ep_openvino.kernel import OpenVinoKernel

EP_ID = "openvino"
CPU = "CPU"
#: Which further OpenVINO devices get an EP: ``GPU,NPU``, or ``auto`` for all OpenVINO finds.
DEVICES_ENV = "NXRT_OPENVINO_DEVICES"
PRECISIONS = {
    "f32": "f32",
    "fp32": "f32",
    "float32": "f32",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "f16": "f16",
    "fp16": "f16",
    "float16": "f16",
}
#: The device capability (``OPTIMIZATION_CAPABILITIES``) each precision needs.
PRECISION_CAPABILITY = {"f32": "FP32", "bf16": "BF16", "f16": "FP16"}
HINTS = ("latency", "throughput", "cumulative_throughput")
OPTIONS = (
    "device",
    "precision",
    "num_threads",
    "performance_hint",
    "cache_dir",
    "context_model",
    "properties",
)
#: Keys the session puts into every EP's options; they mean nothing to OpenVINO here.
SESSION_KEYS = ("device_id", "memory_limit")


@dataclass(frozen=True)
class DeviceSpec:
    """One EP id this plugin offers, and the OpenVINO device it runs on."""

    id: str
    device: str

    @property
    def description(self) -> str:
        return f"OpenVINO {self.device}: claims subgraphs, compiles each with Core.compile_model"


def _slug(device: str) -> str:
    return re.sub(r"[^0-9a-zA-Z]+", "_", device).strip("_").lower()


def discover_eps(environ: Mapping[str, str] = os.environ) -> list[DeviceSpec]:
    """``openvino`` (CPU), then one EP per device ``NXRT_OPENVINO_DEVICES`` asks for."""
    specs = [DeviceSpec(EP_ID, CPU)]
    wanted = environ.get(DEVICES_ENV, "").strip()
    if wanted.lower() == "auto":
        devices = available_devices()
    else:
        devices = [d.strip() for d in wanted.split(",") if d.strip()]
    for device in devices:
        if device.upper() == CPU:
            continue
        ep_id = f"{EP_ID}_{_slug(device)}"
        if all(s.id != ep_id for s in specs):
            specs.append(DeviceSpec(ep_id, device.upper()))
    return specs


def available_devices() -> list[str]:
    """The devices OpenVINO lists (this opens OpenVINO and its device plugins)."""
    import openvino as ov

    return list(ov.Core().available_devices)


def create_ep(spec: DeviceSpec, config: EpConfig) -> OpenVinoExecutionProvider:
    """The factory registered for each device."""
    return OpenVinoExecutionProvider(config, spec)


def _flag(value: Any) -> bool:
    return str(value).strip().lower() not in ("0", "false", "no", "off", "")


_core: Any = None


def shared_core() -> Any:
    """One ``openvino.Core`` per process: its device plugins load once, its calls are
    thread-safe, and every setting this EP makes goes with ``compile_model``."""
    global _core
    if _core is None:
        import openvino as ov

        _core = ov.Core()
    return _core


class OpenVinoExecutionProvider(CompilingProvider):
    """An EP whose claims are standalone ONNX models compiled by OpenVINO for one device.

    :param config: The session's settings; ``config.options`` as the module docstring
        describes, ``threads`` the default ``num_threads``.
    :param spec: Which EP id and OpenVINO device this instance stands for.
    """

    uses_host_blas = False  # OpenVINO computes on its own thread pool
    backend = "OpenVINO"
    device_type = "cpu"  # values cross as host arrays; OpenVINO moves them to its device

    def __init__(self, config: EpConfig | None = None, spec: DeviceSpec | None = None) -> None:
        super().__init__(config)
        spec = spec or DeviceSpec(EP_ID, CPU)
        options = {k: v for k, v in self.config.options.items() if k not in SESSION_KEYS}
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise InvalidArgument(
                f"unknown openvino EP option(s) {unknown}; the options are {list(OPTIONS)} "
                "(OpenVINO's own properties go in the option 'properties')"
            )
        self.id = spec.id
        self.device = str(options.get("device", spec.device))
        precision = str(options.get("precision", "f32")).lower()
        if precision not in PRECISIONS:
            raise InvalidArgument(f"openvino precision must be f32, bf16 or f16, not {precision!r}")
        self.precision = PRECISIONS[precision]
        threads = options.get("num_threads", self.config.threads)
        self.num_threads = int(threads) if threads else 0
        if self.num_threads < 0:
            raise InvalidArgument(f"num_threads must be 0 or more, not {threads!r}")
        hint = str(options.get("performance_hint", "latency")).lower()
        if hint not in HINTS:
            raise InvalidArgument(f"performance_hint must be one of {HINTS}, not {hint!r}")
        self.performance_hint = hint
        self.cache_dir = os.fspath(options["cache_dir"]) if options.get("cache_dir") else ""
        self.context_model = _flag(options.get("context_model", True))
        self.properties = dict(options.get("properties") or {})
        self.version = ""
        self.core: Any = None
        self.compile_config: dict[Any, Any] = {}
        self.capability: OpenVinoCapability | None = None

    @property
    def base_device(self) -> str:
        """``GPU`` for ``GPU.1``: the device family, which decides what it supports."""
        return self.device.split(".")[0].split(":")[0].upper()

    # -- lifecycle ------------------------------------------------------------------------------
    def initialize(self) -> None:
        """Open OpenVINO and check the device and precision; ``EpLoadFailed`` if unusable."""
        try:
            import openvino as ov
            import openvino.properties as props
            import openvino.properties.hint as hints
        except ImportError as exc:
            raise EpLoadFailed(
                "openvino", f"OpenVINO is not importable ({exc}); `pip install openvino`"
            ) from exc
        from nxrt_ep_openvino.capability import OpenVinoCapability
        from nxrt_ep_openvino.guard import CrashGuard

        core = shared_core()
        self.version = ov.get_version()
        devices = list(core.available_devices)
        virtual = self.base_device in ("AUTO", "HETERO", "MULTI", "BATCH")
        if not virtual and not any(d.split(".")[0] == self.base_device for d in devices):
            raise EpLoadFailed(
                os.path.dirname(ov.__file__),
                f"OpenVINO {self.version} has no {self.device} device here; it lists "
                f"{', '.join(devices) or 'none'}",
            )
        if not virtual:
            offered = list(core.get_property(self.device, "OPTIMIZATION_CAPABILITIES"))
            needed = PRECISION_CAPABILITY[self.precision]
            if needed not in offered:
                raise InvalidArgument(
                    f"OpenVINO's {self.device} device has no {self.precision} "
                    f"(it offers {', '.join(offered)}); choose another precision"
                )
        config: dict[Any, Any] = {
            hints.inference_precision: getattr(ov.Type, self.precision),
            hints.performance_mode: getattr(hints.PerformanceMode, self.performance_hint.upper()),
        }
        if self.num_threads and self.base_device == CPU:
            config[props.inference_num_threads] = self.num_threads
        if self.cache_dir:
            config[props.cache_dir] = self.cache_dir
        config.update(self.properties)
        self.core = core
        self.compile_config = config
        self.capability = OpenVinoCapability(
            core,
            self.device,
            self.version,
            lambda model: core.compile_model(model, self.device, self.compile_config),
            CrashGuard(self.version, self.device, config),
        )
        super().initialize()

    # -- claims ---------------------------------------------------------------------------------
    def refusal(self, node: ir.Node, graph: ir.Graph, opsets: Mapping[str, int]) -> str:
        assert self.capability is not None  # initialized
        return self.capability.refusal(node, graph, opsets)

    def boundary_refusals(
        self, nodes: Sequence[ir.Node], graph: ir.Graph, opsets: Mapping[str, int]
    ) -> dict[int, str]:
        """What cannot cross the claim's edge, then what fails to compile as a whole: each
        candidate claim is compiled here, and kept for :meth:`compile`."""
        assert self.capability is not None  # initialized
        return self.capability.claim_refusals(self.id, nodes, graph, opsets)

    def claim(
        self, graph: ir.Graph, nodes: Sequence[ir.Node], opsets: Mapping[str, int] | None = None
    ) -> list[SubgraphClaim]:
        """Core's claims; the models compiled for candidates that were split again are dropped."""
        self._require_initialized()
        capability = self.capability
        assert capability is not None
        known = set(capability.compiled)
        claims = super().claim(graph, nodes, opsets)
        capability.forget([c.nodes for c in claims], added=set(capability.compiled) - known)
        return claims

    # -- compiling ------------------------------------------------------------------------------
    def compile(self, claim: SubgraphClaim, graph: ir.Graph) -> Kernel:
        """The claim as one compiled OpenVINO model (compiled while claiming, if it was)."""
        from nxrt_ep_openvino.capability import claim_model, short_reason
        from nxrt_ep_openvino.kernel import OpenVinoKernel

        self._require_initialized()
        capability = self.capability
        assert capability is not None
        opsets = self.opsets_for(graph)
        done = capability.take(claim)
        if done is not None:
            compiled, weights, feeds = done.model, done.weights, done.feeds
        else:
            try:
                converted = capability.convert(claim, graph, opsets)
            except RuntimeError as exc:
                raise InvalidModel(
                    f"OpenVINO {self.version} cannot convert partition {claim.name!r}: {exc}"
                ) from exc
            compiled = self._compile(converted.model, claim.name, short_reason)
            weights, feeds = converted.weights, converted.feeds

        def source() -> bytes:  # rebuilt when a context is saved, never kept
            return claim_model(claim, graph, opsets).SerializeToString()

        dynamic = any(port.get_partial_shape().is_dynamic for port in compiled.inputs)
        return OpenVinoKernel(
            compiled,
            claim.inputs,
            claim.outputs,
            feeds,
            name=claim.name,
            source=source,
            weights=weights,
            reason=f"{len(claim.nodes)} nodes on {self.device} at {self.precision}, "
            f"{'dynamic' if dynamic else 'static'} shapes",
        )

    def _compile(self, model: Any, name: str, short_reason: Any) -> Any:
        try:
            return self.core.compile_model(model, self.device, self.compile_config)
        except Exception as exc:  # noqa: BLE001 - OpenVINO's reason, shown whole
            raise InvalidModel(
                f"OpenVINO {self.version} cannot compile partition {name!r} for {self.device}: "
                f"{short_reason(exc)}"
            ) from exc

    # -- EPContext ------------------------------------------------------------------------------
    @property
    def sdk_version(self) -> str:
        return self.version

    @property
    def hardware(self) -> str:
        return self.device

    def export(self, claim: SubgraphClaim, kernel: Kernel) -> ExportedKernel:
        """OpenVINO's exported blob (and the ONNX model). Its inputs are the values the
        compiled model reads: weights travel in the blob."""
        from nxrt_ep_openvino.context import ContextBlob
        from nxrt_ep_openvino.kernel import OpenVinoKernel

        if not isinstance(kernel, OpenVinoKernel):
            raise InvalidArgument(f"partition {claim.name!r} computes nothing read later")
        exported = kernel.compiled.export_model()
        blob = exported.getvalue() if hasattr(exported, "getvalue") else bytes(exported)
        onnx_bytes = b""
        if self.context_model:
            try:
                onnx_bytes = kernel.model_bytes()
            except ValueError:  # over protobuf's 2 GiB: the blob alone
                onnx_bytes = b""
        data = ContextBlob(self.version, self.device, self.precision, blob, onnx_bytes)
        return ExportedKernel(
            data.pack(),
            inputs=kernel.feed_names,
            notes=f"OpenVINO {self.device} at {self.precision}"
            + (", with its ONNX model" if onnx_bytes else ""),
        )

    def load(self, context: EpContext) -> OpenVinoKernel:
        """Import a saved blob without compiling; recompile its ONNX model where the blob
        is not for this OpenVINO, device or precision, or refuse with advice when none is kept."""
        from nxrt_ep_openvino.capability import short_reason
        from nxrt_ep_openvino.context import ContextBlob
        from nxrt_ep_openvino.kernel import OpenVinoKernel

        name = context.partition_name
        data = ContextBlob.unpack(context.ep_cache_context, name)
        version = context.ep_sdk_version or data.openvino
        device = context.hardware_architecture or data.device
        problems = []
        if version != self.version:
            problems.append(f"was compiled by OpenVINO {version}, this is {self.version}")
        if device != self.device:
            problems.append(f"was compiled for {device}, this EP runs on {self.device}")
        if data.precision and data.precision != self.precision:
            problems.append(f"was compiled at {data.precision}, this EP runs at {self.precision}")
        compiled = None
        if not problems:
            try:
                compiled = self.core.import_model(data.blob, self.device, self.compile_config)
                reason = f"imported from its EPContext ({self.device}, {self.precision})"
            except Exception as exc:  # noqa: BLE001
                problems.append(f"has a blob OpenVINO cannot import ({short_reason(exc)})")
        if compiled is None:
            if not data.onnx:
                raise InvalidModel(
                    f"EPContext {name!r} {'; '.join(problems)}, and it keeps no ONNX model to "
                    f"recompile. Recompile the model with `nxrt compile MODEL -o OUT --ep "
                    f"{self.id},cpu`, or load it with the OpenVINO, device and precision it "
                    f"was made for (providers=[('{self.id}', {{'device': '{data.device}', "
                    f"'precision': '{data.precision}'}})])"
                )
            try:
                model = self.core.read_model(data.onnx)
            except Exception as exc:  # noqa: BLE001
                raise InvalidModel(
                    f"EPContext {name!r}: OpenVINO {self.version} cannot read its ONNX model: "
                    f"{short_reason(exc)}"
                ) from exc
            compiled = self._compile(model, name, short_reason)
            reason = f"recompiled from its ONNX model: the context {'; '.join(problems)}"
        onnx_bytes = data.onnx
        return OpenVinoKernel(
            compiled,
            context.inputs,
            context.outputs,
            context.inputs,
            name=name,
            source=(lambda: onnx_bytes) if onnx_bytes else None,
            reason=reason,
        )

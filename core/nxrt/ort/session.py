"""``InferenceSession``: ONNX Runtime's API over nxrt's plugin EPs.

Creation is :mod:`nxrt.pipeline.stages`'s; this module holds the ONNX Runtime-shaped
classes around it (options, node args, model metadata, the session) and the
feed checks of ``run``. ``OrtValue`` and ``IOBinding`` live in
:mod:`nxrt.ort.ortvalue` and :mod:`nxrt.ort.iobinding`; provider names, versions and
the default logger in :mod:`nxrt.ort.runtime`. docs/onnxruntime-compat.md lists
what each onnxruntime name does here.
"""

from __future__ import annotations

import copy
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import onnx

from nxrt.errors import InvalidArgument, NxrtError, RuntimeFailure
from nxrt.host import NxrtPluginManager
from nxrt.ort import runtime
from nxrt.ort.devices import (
    RECORD_ASSIGNMENT,
    OrtEpAssignedSubgraph,
    OrtEpDevice,
    assigned_subgraphs,
    ep_device,
)
from nxrt.ort.iobinding import IOBinding
from nxrt.ort.lora import LoraAdapter
from nxrt.ort.options import (
    ExecutionMode,
    ExecutionOrder,
    GraphOptimizationLevel,
    RunOptions,
    SessionOptions,
)
from nxrt.ort.ortvalue import HOST, OrtAllocatorType, OrtMemoryInfo, OrtMemType, OrtValue
from nxrt.pipeline import stages as pipeline
from nxrt.pipeline.executor import CopyKernel, Plan, Profiler
from nxrt.pipeline.model import numpy_dtype, type_string_of
from nxrt.pipeline.overrides import LOAD_CONFIG_FROM_MODEL, model_session_options
from nxrt.pipeline.partition import PartitionReport
from nxrt.pipeline.selection import ExecutionProviderDevicePolicy
from nxrt.pipeline.stages import DISABLE_CPU_EP_FALLBACK, DISABLE_MODEL_COMPILE, ProviderRequest
from nxrt.pipeline.values import is_map_type, map_feed
from nxrt.tensor import TensorMut, TensorView

#: ONNX Runtime's name for the provider-selection policies.
OrtExecutionProviderDevicePolicy = ExecutionProviderDevicePolicy

if TYPE_CHECKING:
    import onnx_ir as ir

    from nxrt.pipeline.executor import Step
    from nxrt.provider import ExecutionProvider
    from nxrt.weight import ExecutionProviderCapabilities

__all__ = [
    "DISABLE_CPU_EP_FALLBACK",
    "DISABLE_MODEL_COMPILE",
    "ExecutionMode",
    "ExecutionOrder",
    "GraphOptimizationLevel",
    "InferenceSession",
    "ModelMetadata",
    "NodeArg",
    "OrtExecutionProviderDevicePolicy",
    "RunOptions",
    "SessionOptions",
]


@dataclass(frozen=True)
class NodeArg:
    """A model input or output as ``get_inputs()`` describes it."""

    name: str
    shape: list[int | str | None]
    type: str


@dataclass(frozen=True)
class ModelMetadata:
    """The model's metadata, as ``get_modelmeta()`` returns it."""

    producer_name: str
    graph_name: str
    domain: str
    description: str
    graph_description: str
    version: int
    custom_metadata_map: dict[str, str] = field(default_factory=dict)


def _describe_values(values: Sequence[ir.Value]) -> list[NodeArg]:
    args = []
    for value in values:
        shape: list[int | str | None] = []
        if value.shape is not None:
            shape = [
                d if isinstance(d, int) else (d.value if d.value else None) for d in value.shape
            ]
        args.append(NodeArg(cast(str, value.name), shape, type_string_of(value.type)))
    return args


def _host_array(value: Any) -> np.ndarray:
    """A feed that is not a numpy array: DLPack producers and buffers arrive zero-copy
    through :class:`~nxrt.tensor.TensorView` (which checks dtype and alignment); anything
    else through ``np.asarray``."""
    if hasattr(value, "__dlpack__") or isinstance(value, (TensorView, TensorMut)):
        return TensorView(value).array
    return np.asarray(value)


def _decoded(array: np.ndarray) -> np.ndarray:
    """A bytes (``S``) or ``np.void`` string feed as the str objects string kernels take."""
    if array.dtype.kind == "V":
        array = array.view(np.dtype(("S", array.dtype.itemsize)))
    return np.char.decode(array, "utf-8").astype(object)


class _RunWatch:
    """Stands in for the profiler of a run given ``RunOptions``: after every kernel it
    stops the run if ``terminate`` was set (from any thread), and records the kernel's
    span when the session profiles."""

    def __init__(self, options: RunOptions, profiler: Profiler | None) -> None:
        self.options, self.profiler = options, profiler

    def record(self, step: Step, start: int, end: int) -> None:
        if self.profiler is not None:
            self.profiler.record(step, start, end)
        if self.options.terminate:
            raise _terminated()


def _terminated() -> RuntimeFailure:
    return RuntimeFailure(
        "the run was stopped: RunOptions.terminate is set; set it to False to run again"
    )


class InferenceSession:
    """Runs an ONNX model on the installed execution providers.

    The ONNX Runtime-shaped shell around :func:`nxrt.pipeline.stages.create`, which
    does all the work of creation; ``run`` validates the feeds and walks the plan.

    :param path_or_bytes: A model path, its bytes, or an ``onnx.ModelProto``.
    :param sess_options: :class:`SessionOptions`.
    :param providers: EP ids (or ONNX Runtime names such as
        ``CPUExecutionProvider``) or ``(id, options)`` pairs, highest priority
        first. Default: the EPs of ``sess_options.add_provider``, else every
        installed EP as the selection policy orders them, cpu last. cpu is
        appended as the fallback unless ``session.disable_cpu_ep_fallback`` is
        ``"1"``. ONNX Runtime names of providers not installed are left out
        with a warning, as onnxruntime does.
    :param provider_options: One options dict per entry of ``providers``.
    :param plugin_manager: The plugin manager to use (tests inject one);
        default: nxrt's shared one.
    """

    def __init__(
        self,
        path_or_bytes: str | os.PathLike[str] | bytes | onnx.ModelProto,
        sess_options: SessionOptions | None = None,
        providers: Sequence[ProviderRequest] | None = None,
        provider_options: Sequence[dict[str, Any]] | None = None,
        *,
        plugin_manager: NxrtPluginManager | None = None,
        **kwargs: Any,
    ) -> None:
        from nxrt import default_plugin_manager

        self._fallback = int(kwargs.pop("enable_fallback", 1)) == 1
        if kwargs:
            raise InvalidArgument(
                f"InferenceSession got unexpected keyword argument(s) {sorted(kwargs)}; it "
                "takes path_or_bytes, sess_options, providers, provider_options, enable_fallback"
            )
        self._source = path_or_bytes
        self._options = sess_options or SessionOptions()
        self._pm = plugin_manager or default_plugin_manager()
        self._create(providers, provider_options)

    def _create(
        self,
        providers: Sequence[ProviderRequest] | None,
        provider_options: Sequence[dict[str, Any]] | None,
    ) -> None:
        """Create (or re-create, for ``set_providers``) everything from the source model."""
        if os.environ.get(LOAD_CONFIG_FROM_MODEL, "") == "1":
            self._options = _with_model_options(self._options, self._source)
        options = self._options
        self._log = runtime.SessionLog(options.logid, options.log_severity_level)
        self._warn_unsupported_options()
        requests = pipeline.provider_requests(providers, provider_options)
        if requests is None and options._providers:
            requests = [(name, dict(values)) for name, values in options._providers]
        create_options = pipeline.CreateOptions(
            threads=options.intra_op_num_threads or None,
            optimize=options.graph_optimization_level >= GraphOptimizationLevel.ORT_ENABLE_BASIC,
            fallback=not options.config_flag(pipeline.DISABLE_CPU_EP_FALLBACK),
            allow_compile=not options.config_flag(pipeline.DISABLE_MODEL_COMPILE),
            policy=options.provider_selection_policy,
            config=dict(options._config),
            initializers={n: v.numpy() for n, v in options._initializers.items()},
            external_initializers={n: v.numpy() for n, v in options._external_initializers.items()},
            free_dimensions=dict(options._free_dimensions),
            free_dimension_denotations=dict(options._free_dimension_denotations),
            external_files=dict(options._external_files),
            optimized_model_path=os.fspath(options.optimized_model_filepath or ""),
            optional_providers=frozenset(runtime.ORT_PROVIDER_NAMES),
        )
        self._state = state = pipeline.create(self._source, requests, create_options, self._pm)
        self._model = state.loaded.model
        self._host = state.host
        self._eps = state.providers.eps
        self._plan = state.plan
        self._parallel = state.parallel
        self._report = state.report
        self._host_blas = state.uses_host_blas
        if self._host_blas:  # BLAS capped once, for the session's life, not per run
            state.parallel.hold_blas()
            weakref.finalize(self, state.parallel.release_blas)
        graph = self._model.graph
        initializer_names = set(graph.initializers)
        self._inputs = _describe_values(
            [v for v in graph.inputs if v.name not in initializer_names]
        )
        self._overridable = _describe_values(
            [v for v in graph.inputs if v.name in initializer_names]
        )
        self._outputs = _describe_values(graph.outputs)
        # every graph input's value, initializers listed as inputs too (feeds override them)
        self._input_dtypes = {v.name: v for v in graph.inputs}
        # built once: models that list their weights as inputs have hundreds of names
        self._expected_inputs = {a.name: a for a in self._inputs}
        self._required_inputs = [a.name for a in self._inputs if not a.type.startswith("optional")]
        self._overridable_names = frozenset(a.name for a in self._overridable)
        self._checked_inputs = {a.name: a for a in (*self._overridable, *self._inputs)}
        # outputs that are graph inputs or views of them: run hands out copies of those
        self._fed_outputs = self._outputs_aliasing_inputs()
        self._device_inputs = self._inputs_read_on_one_device()
        self._plain_inputs = self._plain_tensor_inputs()
        self._variants: dict[tuple[Any, ...], Plan] = {}
        self._variants_lock = threading.Lock()
        self._provider_names = self._name_providers(requests)
        self._profiler = None
        self._profiling_start_ns = 0
        if options.enable_profiling:
            stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
            self._profiler = Profiler(f"{options.profile_file_prefix}_{stamp}.json")
            self._profiling_start_ns = time.time_ns()
        placed = sorted({p.ep for p in self._report.nodes})
        self._log.log(1, "session created; nodes placed on %s", placed)

    def _warn_unsupported_options(self) -> None:
        """Say which requested onnxruntime features this session runs without."""
        options = self._options
        if options.execution_mode == ExecutionMode.ORT_PARALLEL:
            self._log.log(
                2,
                "execution_mode ORT_PARALLEL: nxrt runs the plan's kernels one after another "
                "(each uses intra_op_num_threads); the session runs as ORT_SEQUENTIAL",
            )
        if options.execution_order != ExecutionOrder.DEFAULT:
            self._log.log(
                2,
                "execution_order %s: nxrt keeps its own topological schedule",
                ExecutionOrder(options.execution_order).name,
            )

    def _name_providers(self, requests: list[tuple[str, dict[str, Any]]] | None) -> list[str]:
        """The names ``get_providers()`` reports: each EP the caller named, as the caller
        spelled it; the EPs the session chose itself (the cpu fallback, every EP when no
        providers were given) by their public name, or by their id when the caller named
        EPs by nxrt ids only (docs/onnxruntime-compat.md)."""
        registry = self._state.registry
        given: dict[str, str] = {}
        public = requests is None
        for name, _ in requests or []:
            descriptor = registry.resolve(name)
            if descriptor is not None:
                given.setdefault(descriptor.id, name)
                public = public or name != descriptor.id
        names = []
        for ep, _ in self._eps:
            if ep.id in given:
                names.append(given[ep.id])
            elif public and ep.id in registry.providers:
                names.append(runtime.public_name(registry.providers[ep.id]))
            else:
                names.append(ep.id)
        return names

    def _inputs_read_on_one_device(self) -> dict[str, tuple[str, int]]:
        """Inputs whose only readers are the copy to one device EP, with that device and
        the copy's step: a value already on that device skips the copy."""
        plan = self._plan
        readers: dict[int, list[int]] = {}
        for index, step in enumerate(plan.steps):
            for slot in step.inputs:
                readers.setdefault(slot, []).append(index)
        found = {}
        for name in self._expected_inputs:
            steps = readers.get(plan.input_slots.get(name, -2), [])
            if len(steps) != 1:
                continue
            step = plan.steps[steps[0]]
            kernel = step.kernel
            if isinstance(kernel, CopyKernel) and kernel.source is None and kernel.target:
                found[name] = (kernel.target.device_type, steps[0])
        return found

    # -- ONNX Runtime's API -------------------------------------------------------------------
    def get_inputs(self) -> list[NodeArg]:
        return list(self._inputs)

    def get_outputs(self) -> list[NodeArg]:
        return list(self._outputs)

    def get_overridable_initializers(self) -> list[NodeArg]:
        return list(self._overridable)

    def get_providers(self) -> list[str]:
        """The session's EPs, highest priority first (names: :meth:`_name_providers`)."""
        return list(self._provider_names)

    def get_provider_options(self) -> dict[str, dict[str, str]]:
        """Each EP's options as strings, keyed by the names :meth:`get_providers` reports."""
        return {
            name: {str(k): str(v) for k, v in ep.config.options.items()}
            for name, (ep, _) in zip(self._provider_names, self._eps)
        }

    def wait_for_compiled(self, timeout: float | None = None) -> bool:
        """Block until every kernel the session's EPs compile in the background is ready
        (the cpu EP's tiered kernels, ``nxrt.cpu.compile=background``): from then on runs
        are bit-identical. Returns False when ``timeout`` seconds ran out first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for ep, _ in self._eps:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not ep.wait_for_compiled(left):
                return False
        return True

    def set_providers(
        self,
        providers: Sequence[ProviderRequest] | None = None,
        provider_options: Sequence[dict[str, Any]] | None = None,
    ) -> None:
        """Re-create the session on other EPs (same model and options)."""
        self._create(providers, provider_options)

    def disable_fallback(self) -> None:
        """onnxruntime's run-time fallback re-creates a session on CPU when an EP reports
        EP_FAIL; nxrt's EPs never do (a failing EP raises ``EpPanicked``, and nodes an EP
        cannot run fall back to cpu at creation), so this and :meth:`enable_fallback`
        only record the setting."""
        self._fallback = False

    def enable_fallback(self) -> None:
        """See :meth:`disable_fallback`."""
        self._fallback = True

    def get_session_options(self) -> SessionOptions:
        return self._options

    def get_modelmeta(self) -> ModelMetadata:
        model = self._model
        return ModelMetadata(
            producer_name=model.producer_name or "",
            graph_name=model.graph.name or "",
            domain=model.domain or "",
            description=model.doc_string or "",
            graph_description=model.graph.doc_string or "",
            version=int(model.model_version or 0),
            custom_metadata_map=dict(model.metadata_props),
        )

    def get_input_memory_infos(self) -> list[OrtMemoryInfo]:
        """Where ``run`` takes each input: host memory from a device allocator (no arena)."""
        return [self._host_memory() for _ in self._inputs]

    def get_output_memory_infos(self) -> list[OrtMemoryInfo]:
        """Where ``run`` returns each output: host memory."""
        return [self._host_memory() for _ in self._outputs]

    def get_input_epdevices(self) -> list[OrtEpDevice | None]:
        """The EP device that reads each input first (None: no kernel reads it), as
        onnxruntime's plugin-EP API reports it."""
        readers: dict[int, str] = {}
        for step in self._plan.steps:
            for slot in step.inputs:
                readers.setdefault(slot, step.ep)
        slots = self._plan.input_slots
        found: list[OrtEpDevice | None] = []
        for arg in self._inputs:
            ep_id = readers.get(slots.get(arg.name, -2))
            descriptor = self._state.registry.providers.get(ep_id or "")
            found.append(ep_device(descriptor, self._pm) if descriptor is not None else None)
        return found

    def get_provider_graph_assignment_info(self) -> list[OrtEpAssignedSubgraph]:
        """Which EP runs which nodes, as onnxruntime reports it: one subgraph per compiled
        partition and one per node run alone. Needs the session config entry
        ``session.record_ep_graph_assignment_info`` set to "1", as onnxruntime does
        (:meth:`get_partition` reports the same and more, always)."""
        if self._options._config.get(RECORD_ASSIGNMENT) != "1":
            raise RuntimeFailure(
                f"Session configuration entry '{RECORD_ASSIGNMENT}' must be set to \"1\" to "
                "retrieve EP graph assignment information; set it with "
                "add_session_config_entry before creating the session, or read get_partition()"
            )
        names = {ep.id: name for name, (ep, _) in zip(self._provider_names, self._eps)}
        return assigned_subgraphs(self._report, names)

    @staticmethod
    def _host_memory() -> OrtMemoryInfo:
        return OrtMemoryInfo("Cpu", OrtAllocatorType.ORT_DEVICE_ALLOCATOR, 0, OrtMemType.DEFAULT)

    def get_tuning_results(self) -> list[dict[str, Any]]:
        """No nxrt kernel is tuned at run time (onnxruntime's TunableOp is for ROCm and CUDA):
        the results are always empty, as onnxruntime's on the CPU."""
        return []

    def get_partition(self) -> PartitionReport:
        """Which EP runs each node, the partitions, the copies, and every refusal."""
        return self._report

    def get_capabilities(self, ep_id: str) -> ExecutionProviderCapabilities:
        """An EP's capabilities, by id or by the name :meth:`get_providers` reports."""
        capabilities = self._state.providers.capabilities
        if ep_id not in capabilities and ep_id in self._provider_names:
            ep_id = self._eps[self._provider_names.index(ep_id)][0].id
        return capabilities[ep_id]

    def end_profiling(self) -> str:
        """Write the Chrome trace, stop profiling, and return the trace's path ('' when
        profiling is off or already ended)."""
        profiler, self._profiler = self._profiler, None
        return profiler.write() if profiler else ""

    def get_profiling_start_time_ns(self) -> int:
        """When profiling started, in ``time.time_ns()`` nanoseconds (0 when it is off)."""
        return self._profiling_start_ns

    def io_binding(self) -> IOBinding:
        return IOBinding(self)

    def create_ortvalue_from_shape_and_type(
        self,
        shape: Sequence[int],
        element_type: Any,
        device_type: str,
        device_id: int = 0,
        vendor_id: int = -1,
    ) -> OrtValue:
        return OrtValue.ortvalue_from_shape_and_type(
            shape, element_type, device_type, device_id, vendor_id
        )

    def run(
        self,
        output_names: Sequence[str] | None,
        input_feed: dict[str, Any],
        run_options: RunOptions | None = None,
    ) -> list[Any]:
        """Compute ``output_names`` (all when ``None``) from ``input_feed``. Each array comes
        back as the session computed it, without a copy (its ``base`` holds the buffer)."""
        wanted = self._check_output_names(output_names)
        if run_options is not None and run_options._adapters:
            input_feed = self._with_adapters(input_feed, run_options._adapters)
        on_device: set[str] = set()
        feeds = self._check_feeds(input_feed, on_device)
        if run_options is not None or on_device:
            results = self._execute(feeds, wanted, run_options, on_device)
        elif not self._host_blas:
            results = self._plan.execute(feeds, wanted, self._profiler)
        else:
            with self._parallel.run_limits():
                results = self._plan.execute(feeds, wanted, self._profiler)
        if self._fed_outputs:
            self._copy_fed_outputs(wanted, results, input_feed)
        return [r.view() if type(r) is np.ndarray and r.base is None else r for r in results]

    def run_with_ort_values(
        self,
        output_names: Sequence[str] | None,
        input_dict_ort_values: dict[str, OrtValue],
        run_options: RunOptions | None = None,
    ) -> list[OrtValue]:
        """``run`` with OrtValues in and out; outputs stay on the device computing them."""
        wanted = self._check_output_names(output_names)
        kept = frozenset(n for n in wanted if n in self._plan.output_hosts)
        results = self._run_values(input_dict_ort_values, wanted, kept, run_options)
        return [
            self.output_value(name, value, name in kept) for name, value in zip(wanted, results)
        ]

    def run_async(
        self,
        output_names: Sequence[str] | None,
        input_feed: dict[str, Any],
        callback: Callable[[list[Any], Any, str], None],
        user_data: Any,
        run_options: RunOptions | None = None,
    ) -> None:
        """Run in a thread of its own, then call ``callback(results, user_data, error)``:
        ``error`` is '' on success, else the message (``results`` then empty). Missing
        feeds are refused at once, as onnxruntime does."""
        self._check_required(input_feed)

        def work() -> None:
            try:
                results = self.run(output_names, input_feed, run_options)
            except Exception as exc:  # noqa: BLE001 - handed to the callback, as ORT does
                callback([], user_data, str(exc))
                return
            callback(results, user_data, "")

        threading.Thread(target=work, name="nxrt-run-async", daemon=True).start()

    def run_with_iobinding(self, iobinding: IOBinding, run_options: RunOptions | None = None):
        """Run on the values bound to ``iobinding``; its outputs take the results."""
        if iobinding.session is not self:
            raise InvalidArgument("IOBinding must be used with the session that created it")
        iobinding.run(run_options)

    # -- running ------------------------------------------------------------------------------
    def _execute(
        self,
        feeds: dict[str, Any],
        wanted: list[str],
        run_options: RunOptions | None,
        on_device: set[str] | frozenset[str] = frozenset(),
        kept: frozenset[str] = frozenset(),
    ) -> list[Any]:
        """Run a plan fitted to the call: inputs already on their device, outputs kept on
        theirs, the kernels the fetches need, ``terminate`` watched between kernels."""
        profiler: Any = self._profiler
        fetches = None
        if run_options is not None:
            if run_options.terminate:
                raise _terminated()
            if run_options.only_execute_path_to_fetches:
                fetches = tuple(wanted)
            severity = run_options.log_severity_level
            log = runtime.SessionLog(
                run_options.logid or self._log.logid,
                severity if severity >= 0 else self._log.severity,
            )
            log.log(1, "running with tag: %s", run_options.logid)
            profiler = _RunWatch(run_options, profiler)
        plan = self._plan
        if on_device or kept or fetches is not None:
            plan = self._variant(frozenset(on_device), kept, fetches)
        if not self._host_blas:
            return plan.execute(feeds, wanted, profiler)
        with self._parallel.run_limits():
            return plan.execute(feeds, wanted, profiler)

    def _variant(
        self, on_device: frozenset[str], kept: frozenset[str], fetches: tuple[str, ...] | None
    ) -> Plan:
        """The session's plan without the copies of inputs already on their device, without
        the host copies of ``kept`` outputs, and (``fetches``) without the kernels those
        outputs do not need; made once per combination."""
        key = (on_device, kept, fetches)
        plan = self._variants.get(key)
        if plan is not None:
            return plan
        with self._variants_lock:
            plan = self._variants.get(key)
            if plan is None:
                fed = {name: self._device_inputs[name][1] for name in on_device}
                plan = self._variants[key] = pipeline.fit_plan(self._plan, fed, kept, fetches)
        return plan

    def output_value(self, name: str, value: Any, kept: bool) -> OrtValue:
        """An output as an OrtValue: on its EP's device when ``kept``, else on the host."""
        if kept:
            ep = self._plan.output_hosts[name]
            return OrtValue(value, ep.device_type, ep.config.device_id, ep=ep)
        return OrtValue(value)

    def output_producer(self, name: str) -> ExecutionProvider | None:
        """The EP computing output ``name`` when it is not on the host (None: the host)."""
        return self._plan.output_hosts.get(name)

    def _copy_fed_outputs(
        self, wanted: list[str], results: list[Any], input_feed: dict[str, Any]
    ) -> None:
        """An output that is a graph input, or a zero-copy view of one, is handed out as a
        copy (onnxruntime's behaviour), so writing to a result never changes a feed."""
        for index, name in enumerate(wanted):
            for input_name in self._fed_outputs.get(name, ()):
                fed = input_feed.get(input_name)
                fed = fed.value if isinstance(fed, OrtValue) else fed
                result = results[index]
                if isinstance(fed, np.ndarray) and isinstance(result, np.ndarray):
                    if np.may_share_memory(result, fed):
                        results[index] = result.copy()
                        break

    def _outputs_aliasing_inputs(self) -> dict[str, frozenset[str]]:
        """The outputs that may be a graph input or a view of one (through kernels declaring
        ``view_output``, such as Identity or Reshape), with those inputs."""
        plan = self._plan
        aliases = {
            plan.input_slots[name]: {name}
            for name in self._expected_inputs
            if name in plan.input_slots
        }
        for step in plan.steps:
            viewed = step.kernel.view_output
            if viewed is not None and viewed < len(step.inputs) and step.outputs:
                source = aliases.get(step.inputs[viewed])
                if source:
                    aliases.setdefault(step.outputs[0], set()).update(source)
        found = {}
        for name, slot in plan.output_slots.items():
            if aliases.get(slot):
                found[name] = frozenset(aliases[slot])
        return found

    # -- feed checks --------------------------------------------------------------------------
    def _check_output_names(self, output_names: Sequence[str] | None) -> list[str]:
        if not output_names:
            return [o.name for o in self._outputs]
        known = [o.name for o in self._outputs]
        for name in output_names:
            if name not in known:
                raise InvalidArgument(f"{name!r} is not an output of the model; outputs: {known}")
        return list(output_names)

    def _check_required(self, input_feed: dict[str, Any]) -> None:
        if not isinstance(input_feed, dict):
            raise InvalidArgument("input_feed must be a dict of input name -> numpy array")
        missing = [n for n in self._required_inputs if n not in input_feed]
        if missing:
            raise InvalidArgument(
                f"Required inputs ({missing}) are missing from input feed ({list(input_feed)}). "
                f"The model's inputs: {self._describe_inputs()}"
            )

    def _check_feeds(self, input_feed: dict[str, Any], on_device: set[str]) -> dict[str, Any]:
        """The feeds ``run`` executes with; adds to ``on_device`` the inputs fed as values
        already on the device of the EP reading them."""
        self._check_required(input_feed)
        expected = self._expected_inputs
        overridable = self._overridable_names
        unknown = [n for n in input_feed if n not in expected and n not in overridable]
        if unknown:
            raise InvalidArgument(
                f"unknown input name(s) {unknown}; the model's inputs are {self._describe_inputs()}"
            )
        feeds: dict[str, Any] = {}
        plain = self._plain_inputs
        for name, value in input_feed.items():
            spec = plain.get(name)
            if (
                spec is not None
                and type(value) is np.ndarray
                and value.dtype == spec[0]
                and value.flags.c_contiguous
                and len(value.shape) == len(spec[1])
                and all(want is None or got == want for got, want in zip(value.shape, spec[1]))
            ):
                feeds[name] = value  # the common case, checked in one step
                continue
            if isinstance(value, OrtValue):
                device = value.device_name()
                if device != HOST and self._device_inputs.get(name, ("",))[0] == device:
                    feeds[name] = value.value
                    on_device.add(name)
                    continue
                value = value.value if device == HOST else value.numpy()
            value_info = self._input_dtypes.get(name)
            kind = type(value_info.type).__name__ if value_info is not None else "TensorType"
            if kind == "OptionalType" and value is not None:
                assert value_info is not None  # kind comes from it
                kind = type(cast("ir.OptionalType", value_info.type).elem_type).__name__
            if value_info is not None and is_map_type(value_info.type):
                feeds[name] = map_feed(name, value, value_info.type)  # dicts, as ORT takes them
                continue
            if kind == "SequenceType":
                if not isinstance(value, (list, tuple)):
                    raise InvalidArgument(f"input {name!r} is a sequence: pass a list of arrays")
                feeds[name] = [np.asarray(v) for v in value]
                continue
            if kind == "OptionalType" and value is None:
                feeds[name] = None
                continue
            if isinstance(value, np.ndarray):
                array = value
            elif isinstance(value, (list, tuple)) and value_info is not None:
                array = np.array(value, dtype=self._dtype_of(value_info))  # to the input's type
            else:
                array = _host_array(value)
            if name in self._checked_inputs and kind == "TensorType":
                array = self._check_feed(self._checked_inputs[name], array)
            if not array.flags.c_contiguous:
                array = np.ascontiguousarray(array)
            feeds[name] = array
        return feeds

    def _with_adapters(
        self, input_feed: dict[str, Any], adapters: Sequence[LoraAdapter]
    ) -> dict[str, Any]:
        """The feeds with the active adapters' parameters in place of the feeds and
        initializers of their names (the first adapter added wins a name)."""
        self._check_required(input_feed)
        merged = dict(input_feed)
        for adapter in reversed(adapters):
            for name, value in adapter.parameters.items():
                if name not in self._expected_inputs and name not in self._overridable_names:
                    raise InvalidArgument(
                        f"Invalid input name: {name} (a parameter of an active LoRA adapter); "
                        "an adapter replaces the model's inputs and the initializers listed as "
                        f"graph inputs: {self._describe_inputs()}"
                    )
                merged[name] = value
        return merged

    def _plain_tensor_inputs(self) -> dict[str, tuple[np.dtype, tuple[int | None, ...]]]:
        """Inputs an ndarray feeds as it is: numeric tensors of known type and rank, with
        each fixed dim (``None`` where the dim is free); ``_check_feeds`` takes a matching
        array without the general checks, and anything else the long way."""
        plain = {}
        for arg in self._inputs:
            value = self._input_dtypes[arg.name]
            if arg.name in self._device_inputs or not arg.type.startswith("tensor("):
                continue
            if value.dtype is None or value.shape is None or is_map_type(value.type):
                continue
            dtype = numpy_dtype(int(value.dtype))
            if dtype.kind in "OSUV":
                continue
            plain[arg.name] = (dtype, tuple(d if isinstance(d, int) else None for d in arg.shape))
        return plain

    @staticmethod
    def _dtype_of(value: ir.Value) -> np.dtype | None:
        dtype = value.dtype
        return numpy_dtype(int(dtype)) if dtype is not None else None

    def _check_feed(self, arg: NodeArg, array: np.ndarray) -> np.ndarray:
        """``array`` checked against the input's type and shape (bytes and ``np.void``
        strings decoded to the str objects string inputs take)."""
        value = self._input_dtypes[arg.name]
        if value.dtype is not None:
            want = numpy_dtype(int(value.dtype))
            if array.dtype != want:
                if want.kind == "O" and array.dtype.kind in "OSUV":
                    if array.dtype.kind in "SV":
                        array = _decoded(array)
                    elif array.dtype.kind == "U":  # str objects, as ONNX Runtime returns them
                        array = array.astype(object)
                else:
                    if want.kind == "O":
                        hint = "str"
                    else:
                        hint = f"np.{want.name}" if hasattr(np, want.name) else repr(str(want))
                    raise InvalidArgument(
                        f"input {arg.name!r} has dtype {array.dtype}, expected {want} "
                        f"({arg.type}); convert it with .astype({hint})"
                    )
        if value.shape is None:
            return array
        if array.ndim != len(arg.shape):
            raise InvalidArgument(
                f"input {arg.name!r} has rank {array.ndim} (shape {list(array.shape)}), "
                f"expected rank {len(arg.shape)} (shape {arg.shape})"
            )
        for axis, (got, want_dim) in enumerate(zip(array.shape, arg.shape)):
            if isinstance(want_dim, int) and got != want_dim:
                raise InvalidArgument(
                    f"input {arg.name!r} has dim {got} on axis {axis} (shape "
                    f"{list(array.shape)}), expected {want_dim} (shape {arg.shape})"
                )
        return array

    def _describe_inputs(self) -> str:
        return ", ".join(f"{a.name}: {a.type} {a.shape}" for a in self._inputs)

    def check_input_name(self, name: str) -> None:
        """Refuse a binding to a name the model does not take (as onnxruntime does)."""
        if name not in self._expected_inputs and name not in self._overridable_names:
            raise RuntimeFailure(
                f"{name!r} is not an input of the model; inputs: {self._describe_inputs()}"
            )

    @property
    def output_names(self) -> list[str]:
        return [o.name for o in self._outputs]

    def run_bound(
        self,
        inputs: dict[str, OrtValue],
        outputs: Sequence[str],
        kept: frozenset[str],
        run_options: RunOptions | None,
    ) -> list[Any]:
        """The results of ``outputs`` computed from OrtValue ``inputs`` (IOBinding's run);
        ``kept`` outputs stay on the device computing them. Failures are raised as
        onnxruntime raises them here (``RuntimeError``), the nxrt error as their cause."""
        try:
            return self._run_values(inputs, list(outputs), kept, run_options)
        except NxrtError as exc:
            if isinstance(exc, RuntimeError):
                raise
            raise RuntimeFailure(f"error in execution: {exc}") from exc

    def _run_values(
        self,
        inputs: dict[str, Any],
        wanted: list[str],
        kept: frozenset[str],
        run_options: RunOptions | None,
    ) -> list[Any]:
        if run_options is not None and run_options._adapters:
            inputs = self._with_adapters(inputs, run_options._adapters)
        on_device: set[str] = set()
        feeds = self._check_feeds(inputs, on_device)
        results = self._execute(feeds, wanted, run_options, on_device, kept)
        if self._fed_outputs:
            self._copy_fed_outputs(wanted, results, inputs)
        return results


def _with_model_options(options: SessionOptions, source: Any) -> SessionOptions:
    """A copy of ``options`` with the session options the model's ``ort_config`` metadata
    sets (onnxruntime's ``ORT_LOAD_CONFIG_FROM_MODEL=1``: the model's win)."""
    found = model_session_options(source)
    if not found:
        return options
    options = copy.copy(options)
    for key, value in found.items():
        if key == "graph_optimization_level":
            value = GraphOptimizationLevel(value)
        elif key == "execution_mode":
            value = ExecutionMode(value)
        elif key == "enable_profiling":
            value = bool(value)
        setattr(options, key, value)
    return options

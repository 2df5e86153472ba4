"""``InferenceSession``: ONNX Runtime's API over nxrt's plugin EPs.

Creation does all the work (load, check, shape inference, partition, plan,
kernel creation); ``run`` validates the feeds and walks the plan.
"""

from __future__ import annotations

import enum
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from nxrt import contrib_ops  # noqa: F401  (registers nxrt's op schemas with onnx)
from nxrt.epcontext import build_ep_context_registry, is_context_node, read_context
from nxrt.errors import EpLoadFailed, InvalidArgument, InvalidModel, NoEpForContext, NxrtError
from nxrt.executor import NO_SLOT, CopyKernel, Plan, Profiler, Step
from nxrt.external_data import resolve_external_data
from nxrt.host import Host, NxrtPluginManager
from nxrt.host_parallel import HostParallel
from nxrt.kernel import SubgraphClaim
from nxrt.memory import parse_bytes
from nxrt.model import load_model, numpy_dtype, opset_of, type_string_of
from nxrt.optimizer import optimize
from nxrt.partition import Copy, PartitionReport, partition, schedule
from nxrt.provider import EpConfig, ExecutionProvider
from nxrt.subgraph import ScopedKernel, Subgraph, implicit_inputs, outer_names, subgraphs_of
from nxrt.weight_binding import negotiate_weights

if TYPE_CHECKING:
    import onnx_ir as ir

    from nxrt.registry import EpDescriptor, EpRegistry
    from nxrt.weight import ExecutionProviderCapabilities

#: Session config entries, named like ONNX Runtime's.
DISABLE_CPU_EP_FALLBACK = "session.disable_cpu_ep_fallback"
DISABLE_MODEL_COMPILE = "session.disable_model_compile"
FALLBACK_EP = "cpu"
#: Ops whose result changes from run to run, and so are never constant-folded.
NONDETERMINISTIC_OPS = frozenset(
    {
        "RandomNormal",
        "RandomUniform",
        "RandomNormalLike",
        "RandomUniformLike",
        "Multinomial",
        "Bernoulli",
    }
)


class GraphOptimizationLevel(enum.IntEnum):
    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_ALL = 99


class SessionOptions:
    """Session settings, with ONNX Runtime's attribute names."""

    def __init__(self) -> None:
        self.intra_op_num_threads = 0
        self.inter_op_num_threads = 0
        self.graph_optimization_level = GraphOptimizationLevel.ORT_ENABLE_ALL
        self.enable_profiling = False
        self.profile_file_prefix = "nxrt_profile"
        self.log_severity_level = 2
        self.log_verbosity_level = 0
        self._config: dict[str, str] = {}

    def add_session_config_entry(self, key: str, value: str) -> None:
        self._config[str(key)] = str(value)

    def get_session_config_entry(self, key: str) -> str:
        if key not in self._config:
            raise InvalidArgument(f"session config entry {key!r} is not set")
        return self._config[key]

    def config_flag(self, key: str) -> bool:
        return self._config.get(key, "0") not in ("", "0")


class RunOptions:
    """Per-run settings, with ONNX Runtime's attribute names."""

    def __init__(self) -> None:
        self.log_severity_level = 2
        self.run_tag = ""


@dataclass(frozen=True)
class NodeArg:
    """A model input or output as ``get_inputs()`` describes it."""

    name: str
    shape: list[int | str | None]
    type: str


def _describe_values(values: Sequence[ir.Value]) -> list[NodeArg]:
    args = []
    for value in values:
        shape: list[int | str | None] = []
        if value.shape is not None:
            shape = [
                d if isinstance(d, int) else (d.value if d.value else None) for d in value.shape
            ]
        args.append(NodeArg(value.name, shape, type_string_of(value.type)))
    return args


def _provider_requests(
    providers: Sequence[str | tuple[str, dict[str, Any]]] | None,
    provider_options: Sequence[dict[str, Any]] | None,
) -> list[tuple[str, dict[str, Any]]] | None:
    if providers is None:
        return None
    if isinstance(providers, str):
        raise InvalidArgument("providers must be a list, e.g. ['cpu'], not a string")
    requests = []
    for i, item in enumerate(providers):
        if isinstance(item, str):
            options = dict(provider_options[i]) if provider_options else {}
            requests.append((item, options))
        elif isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[0], str):
            requests.append((item[0], dict(item[1])))
        else:
            raise InvalidArgument(f"providers[{i}] must be an EP id or (id, options), got {item!r}")
    return requests


class InferenceSession:
    """Runs an ONNX model on the installed execution providers.

    :param path_or_bytes: A model path, its bytes, or an ``onnx.ModelProto``.
    :param sess_options: :class:`SessionOptions`.
    :param providers: EP ids (or ONNX Runtime names such as
        ``CPUExecutionProvider``) or ``(id, options)`` pairs, highest priority
        first. Default: every installed EP, cpu last. cpu is appended as the
        fallback unless ``session.disable_cpu_ep_fallback`` is ``"1"``.
    :param plugin_manager: The plugin manager to use (tests inject one);
        default: nxrt's shared one.
    """

    def __init__(
        self,
        path_or_bytes: str | os.PathLike[str] | bytes | onnx.ModelProto,
        sess_options: SessionOptions | None = None,
        providers: Sequence[str | tuple[str, dict[str, Any]]] | None = None,
        provider_options: Sequence[dict[str, Any]] | None = None,
        *,
        plugin_manager: NxrtPluginManager | None = None,
        **kwargs: Any,
    ) -> None:
        from nxrt import default_plugin_manager

        self._options = sess_options or SessionOptions()
        self._parallel = HostParallel(self._options.intra_op_num_threads or None)
        self._host = Host(plugin_manager or default_plugin_manager())
        self._registry = self._host.build_registry()
        self._model, self._base_dir = load_model(path_or_bytes)
        self._weights = resolve_external_data(self._model, self._base_dir)
        graph = self._model.graph
        self._eps = self._create_providers(_provider_requests(providers, provider_options))
        self._capabilities: dict[str, ExecutionProviderCapabilities] = {
            ep.id: self._host.capabilities(ep, owner) for ep, owner in self._eps
        }
        folded: list[tuple[str, str]] = []
        fused: list[tuple[str, str]] = []
        if self._options.graph_optimization_level >= GraphOptimizationLevel.ORT_ENABLE_BASIC:
            folded, fused = optimize(self._model, self._evaluate_constant, self._first_ep_runs)
        placement = partition(self._model, self._eps, self._host, preplaced=self._load_contexts())
        self._check_compile_allowed(placement.report)
        self._report = placement.report
        self._report.folded, self._report.fused = folded, fused
        self._plan = self._build_plan(placement)
        running = {step.ep for step in self._plan.steps}
        self._host_blas = any(ep.uses_host_blas for ep, _ in self._eps if ep.id in running)
        initializer_names = set(graph.initializers)
        self._inputs = _describe_values(
            [v for v in graph.inputs if v.name not in initializer_names]
        )
        self._overridable = _describe_values(
            [v for v in graph.inputs if v.name in initializer_names]
        )
        self._outputs = _describe_values(graph.outputs)
        self._input_dtypes = {a.name: v for a, v in zip(self._inputs, self._input_values())}
        # built once: models that list their weights as inputs have hundreds of names
        self._expected_inputs = {a.name: a for a in self._inputs}
        self._overridable_names = frozenset(a.name for a in self._overridable)
        self._profiler = None
        if self._options.enable_profiling:
            stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
            self._profiler = Profiler(f"{self._options.profile_file_prefix}_{stamp}.json")

    # -- creation -----------------------------------------------------------------------------
    def _create_providers(
        self, requests: list[tuple[str, dict[str, Any]]] | None
    ) -> list[tuple[ExecutionProvider, str]]:
        registry: EpRegistry = self._registry
        explicit = requests is not None
        if requests is None:
            requests = [(ep_id, {}) for ep_id in registry.default_order()]
        no_fallback = self._options.config_flag(DISABLE_CPU_EP_FALLBACK)
        chosen: list[tuple[EpDescriptor, dict[str, Any]]] = []
        for name, options in requests:
            descriptor = registry.resolve(name)
            if descriptor is None:
                known = ", ".join(sorted(registry.providers)) or "none"
                broken = "; ".join(str(f) for f in self._host.failures)
                raise InvalidArgument(
                    f"execution provider {name!r} is not installed (installed: {known})"
                    + (f"; plugins that failed to load: {broken}" if broken else "")
                    + ". Install its package, e.g. `pip install nxrt-ep-<name>`."
                )
            if all(descriptor.id != d.id for d, _ in chosen):
                chosen.append((descriptor, options))
        fallback = registry.resolve(FALLBACK_EP)
        if not no_fallback and fallback is not None and all(d.id != FALLBACK_EP for d, _ in chosen):
            chosen.append((fallback, {}))
        eps = []
        for descriptor, options in chosen:
            try:
                eps.append((self._instantiate(descriptor, options), descriptor.plugin))
            except Exception as exc:  # noqa: BLE001 - the plugin's own failure, shown whole
                failure = (
                    exc
                    if isinstance(exc, NxrtError)
                    else EpLoadFailed(descriptor.plugin, f"creating EP {descriptor.id!r}: {exc!r}")
                )
                if explicit:
                    if failure is exc:
                        raise
                    raise failure from exc
                self._host.failures.append(failure)  # not asked for by name: skip it, say why
        if not eps:
            raise InvalidArgument("no execution provider is available; install nxrt-ep-cpu")
        return eps

    def _instantiate(self, descriptor: EpDescriptor, options: dict[str, Any]) -> ExecutionProvider:
        threads = self._options.intra_op_num_threads or None
        limit = options.get("memory_limit")
        config = EpConfig(
            options=dict(options),
            threads=threads,
            memory_limit=parse_bytes(limit) if limit is not None else None,
            device_id=int(options.get("device_id", 0)),
        )
        ep = descriptor.factory(config)
        if not isinstance(ep, ExecutionProvider):
            raise TypeError(f"factory returned {type(ep).__name__}, not an ExecutionProvider")
        ep.id = descriptor.id
        ep.parallel = self._parallel
        ep.subgraph_compiler = self._compile_subgraph
        if ep.ops is None:
            ep.ops = descriptor.ops
        ep.initialize()
        return ep

    def _build_plan(
        self, placement: Any, graph: ir.Graph | None = None, implicit: Sequence[str] = ()
    ) -> Plan:
        """The flat plan of the main graph, or of a subgraph reading ``implicit`` outer values."""
        import onnx_ir as ir

        graph = graph if graph is not None else self._model.graph
        eps = {ep.id: ep for ep, _ in self._eps}
        slots: dict[str, int] = {}

        def slot(name: str) -> int:
            if not name:
                return NO_SLOT
            if name not in slots:
                slots[name] = len(slots)
            return slots[name]

        constants: dict[int, Any] = {}
        weights = negotiate_weights(graph, self._weights, placement, eps, self._capabilities)
        for name, value in graph.initializers.items():
            if name in weights:  # external data, negotiated per EP (lazy or resident)
                constants[slot(name)] = weights[name]
                continue
            if value.const_value is None:
                raise InvalidModel(f"initializer {name!r} has no data")
            array = value.const_value.numpy()
            if isinstance(array, np.ndarray):
                if array.dtype.kind in "biufc":  # not strings, not ml_dtypes' (kind "V")
                    # the graph keeps this array instead of the protobuf's copy of the bytes,
                    # so the parsed model can be freed: one copy of every weight, not two
                    value.const_value = ir.Tensor(array, name=name)
                array = array.view()
                array.flags.writeable = False
            constants[slot(name)] = array
        input_slots = {name: slot(name) for name in [*(v.name for v in graph.inputs), *implicit]}
        location = {name: "cpu" for name in slots}  # device holding each value
        copies: dict[tuple[str, str], int] = {}
        steps: list[Step] = []
        report: PartitionReport = placement.report

        def read(name: str, ep: ExecutionProvider) -> int:
            """The slot ``ep`` reads ``name`` from, inserting a copy across devices."""
            if not name:
                return NO_SLOT
            source_device = location.get(name, "cpu")
            if source_device == ep.device_type:
                return slot(name)
            key = (name, ep.device_type)
            if key not in copies:
                producer = producers.get(name)
                copies[key] = slot(f"{name}@{ep.device_type}")
                steps.append(
                    Step(
                        CopyKernel(producer, ep),
                        [slot(name)],
                        [copies[key]],
                        f"copy {name}",
                        "MemcpyToDevice" if ep.device_type != "cpu" else "MemcpyToHost",
                        ep.id,
                        ep.device_type,
                    )
                )
                report.copies.append(Copy(name, source_device, ep.device_type, ep.id))
            return copies[key]

        producers: dict[str, ExecutionProvider] = {}
        nodes = list(graph)
        compiled: set[int] = set()
        for i in schedule(placement, nodes):
            node = nodes[i]
            ep = eps[placement.node_ep[i]]
            claim_index = placement.node_claim[i]
            if claim_index is not None:
                if claim_index in compiled:
                    continue
                compiled.add(claim_index)
                claim = report.claims[claim_index]
                kernel = claim.kernel if claim.kernel is not None else ep.compile(claim, graph)
                ins, outs, name, op_type = claim.inputs, claim.outputs, claim.name, "Subgraph"
                flops = bytes_ = 0
            else:
                match = placement.matches[i]
                entry = ep.ops.lookup(node.domain, node.op_type, opset_of(self._model, node.domain))
                if entry is None:
                    raise InvalidModel(f"EP {ep.id!r} matched {node.op_type} but has no kernel")
                kernel = ep.create_kernel(node, entry)
                ins = [v.name if v is not None else "" for v in node.inputs]
                if subgraphs_of(node):
                    outer = implicit_inputs(node)
                    kernel = ScopedKernel(kernel, len(ins), outer)
                    ins = ins + outer
                outs = [v.name for v in node.outputs]
                name, op_type = node.name, node.op_type
                flops = match.cost.flops if match and match.cost else 0
                bytes_ = match.cost.bytes if match and match.cost else 0
            step = Step(
                kernel,
                [read(n, ep) for n in ins],
                [slot(n) for n in outs],
                name,
                op_type,
                ep.id,
                ep.device_type,
                flops=flops,
                bytes=bytes_,
            )
            steps.append(step)
            for out in outs:
                if out:
                    location[out] = ep.device_type
                    producers[out] = ep
        output_slots = {v.name: slot(v.name) for v in graph.outputs}
        output_hosts = {
            name: producers[name] for name in output_slots if location.get(name, "cpu") != "cpu"
        }
        plan = Plan(list(slots), constants, input_slots, output_slots, steps, output_hosts)
        plan.finish()
        return plan

    def _load_contexts(self) -> dict[int, SubgraphClaim]:
        """Precompiled partitions: each EPContext node loaded by the EP owning its source."""
        nodes = [node for node in self._model.graph if is_context_node(node)]
        if not nodes:
            return {}
        registry = build_ep_context_registry(self._registry.providers.values())
        loaded = {}
        for node in nodes:
            context = read_context(node, self._base_dir)
            owner_id = registry.owner(context.source)
            session_eps = {ep.id: (ep, owner) for ep, owner in self._eps}
            if owner_id not in session_eps:
                raise NoEpForContext(
                    context.source,
                    f"EPContext {context.partition_name!r} is for EP {owner_id!r}, which is "
                    f"installed but not among this session's providers "
                    f"{list(session_eps)}; add {owner_id!r} to providers",
                )
            registry.require_support(owner_id)
            ep, plugin = session_eps[owner_id]
            kernel = self._host.load_context(ep, plugin, context)
            loaded[id(node)] = SubgraphClaim(
                ep.id,
                [node],
                name=context.partition_name,
                inputs=[v.name if v is not None else "" for v in node.inputs],
                outputs=[v.name for v in node.outputs],
                kernel=kernel,
            )
        return loaded

    def _check_compile_allowed(self, report: PartitionReport) -> None:
        """With ``session.disable_model_compile``, only precompiled partitions are accepted."""
        if not self._options.config_flag(DISABLE_MODEL_COMPILE):
            return
        for claim in report.claims:
            if claim.kernel is None:
                raise InvalidModel(
                    f"{DISABLE_MODEL_COMPILE} is set, but EP {claim.ep!r} would compile a "
                    f"partition of {len(claim.nodes)} node(s) starting at "
                    f"{claim.nodes[0].name!r}; compile the model first: "
                    f"`nxrt compile MODEL -o OUT --ep {claim.ep}`"
                )

    def compiled_partitions(self) -> list[tuple[SubgraphClaim, ExecutionProvider, str, Any]]:
        """Each claim with its EP, owning plugin and kernel (what ``nxrt compile`` saves)."""
        owners = {ep.id: (ep, owner) for ep, owner in self._eps}
        steps = self._plan.steps
        kernels = {step.name: step.kernel for step in steps if step.op_type == "Subgraph"}
        return [
            (claim, *owners[claim.ep], kernels[claim.name])
            for claim in self._report.claims
            if claim.name in kernels
        ]

    def _compile_subgraph(self, graph: ir.Graph) -> Subgraph:
        """Partition and plan a graph attribute with the session's EPs."""
        placement = partition(self._model, self._eps, self._host, graph=graph)
        outer = outer_names(graph)
        plan = self._build_plan(placement, graph, outer)
        return Subgraph(
            plan, [v.name for v in graph.inputs], [v.name for v in graph.outputs], outer
        )

    def _first_ep_runs(self, domain: str, op_type: str) -> bool:
        """Whether the highest-priority EP has a kernel for a fused op (optimizer fusions)."""
        ops = self._eps[0][0].ops
        return ops is not None and ops.lookup(domain, op_type, 1) is not None

    def _evaluate_constant(self, node: ir.Node) -> list[Any] | None:
        """Compute a node with constant inputs on the first host EP that runs it (folding)."""
        if node.op_type in NONDETERMINISTIC_OPS or subgraphs_of(node):
            return None
        for ep, owner in self._eps:
            if ep.device_type != "cpu" or ep.ops is None:
                continue
            opset = opset_of(self._model, node.domain)
            if not self._host.match_kernel(ep, owner, node, opset).supported:
                continue
            entry = ep.ops.lookup(node.domain, node.op_type, opset)
            if entry is None:
                return None
            inputs = [v.const_value.numpy() if v is not None else None for v in node.inputs]
            try:
                return list(ep.create_kernel(node, entry).compute(inputs))
            except Exception:  # noqa: BLE001 - left in the plan, so it fails at run time
                return None
        return None

    def _input_values(self) -> list[ir.Value]:
        names = {a.name for a in self._inputs}
        return [v for v in self._model.graph.inputs if v.name in names]

    # -- ONNX Runtime's API -------------------------------------------------------------------
    def get_inputs(self) -> list[NodeArg]:
        return list(self._inputs)

    def get_outputs(self) -> list[NodeArg]:
        return list(self._outputs)

    def get_overridable_initializers(self) -> list[NodeArg]:
        return list(self._overridable)

    def get_providers(self) -> list[str]:
        return [ep.id for ep, _ in self._eps]

    def get_provider_options(self) -> dict[str, dict[str, Any]]:
        return {ep.id: dict(ep.config.options) for ep, _ in self._eps}

    def get_session_options(self) -> SessionOptions:
        return self._options

    def get_modelmeta(self) -> dict[str, Any]:
        return {
            "producer_name": self._model.producer_name,
            "graph_name": self._model.graph.name,
            "doc_string": self._model.doc_string,
            "custom_metadata_map": dict(self._model.metadata_props),
        }

    def get_partition(self) -> PartitionReport:
        """Which EP runs each node, the partitions, the copies, and every refusal."""
        return self._report

    def get_capabilities(self, ep_id: str) -> ExecutionProviderCapabilities:
        return self._capabilities[ep_id]

    def end_profiling(self) -> str:
        """Write the Chrome trace and return its path ('' when profiling is off)."""
        return self._profiler.write() if self._profiler else ""

    def run(
        self,
        output_names: Sequence[str] | None,
        input_feed: dict[str, Any],
        run_options: RunOptions | None = None,
    ) -> list[Any]:
        """Compute ``output_names`` (all when ``None``) from ``input_feed``."""
        wanted = self._check_output_names(output_names)
        feeds = self._check_feeds(input_feed)
        if not self._host_blas:
            return self._plan.execute(feeds, wanted, self._profiler)
        with self._parallel.run_limits():
            return self._plan.execute(feeds, wanted, self._profiler)

    def _check_output_names(self, output_names: Sequence[str] | None) -> list[str]:
        if not output_names:
            return [o.name for o in self._outputs]
        known = [o.name for o in self._outputs]
        for name in output_names:
            if name not in known:
                raise InvalidArgument(f"{name!r} is not an output of the model; outputs: {known}")
        return list(output_names)

    def _check_feeds(self, input_feed: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(input_feed, dict):
            raise InvalidArgument("input_feed must be a dict of input name -> numpy array")
        expected = self._expected_inputs
        overridable = self._overridable_names
        unknown = [n for n in input_feed if n not in expected and n not in overridable]
        if unknown:
            raise InvalidArgument(
                f"unknown input name(s) {unknown}; the model's inputs are {self._describe_inputs()}"
            )
        missing = [n for n in expected if n not in input_feed]
        if missing:
            raise InvalidArgument(
                f"missing input(s) {missing}; the model's inputs are {self._describe_inputs()}"
            )
        feeds = {}
        for name, value in input_feed.items():
            value_info = self._input_dtypes.get(name)
            kind = type(value_info.type).__name__ if value_info is not None else "TensorType"
            if kind == "OptionalType" and value is not None:
                kind = type(value_info.type.elem_type).__name__
            if kind == "SequenceType":
                if not isinstance(value, (list, tuple)):
                    raise InvalidArgument(f"input {name!r} is a sequence: pass a list of arrays")
                feeds[name] = [np.asarray(v) for v in value]
                continue
            if kind == "OptionalType" and value is None:
                feeds[name] = None
                continue
            array = value if isinstance(value, np.ndarray) else np.asarray(value)
            if name in expected and kind == "TensorType":
                self._check_feed(expected[name], array)
            if not array.flags.c_contiguous:
                array = np.ascontiguousarray(array)
            feeds[name] = array
        return feeds

    def _check_feed(self, arg: NodeArg, array: np.ndarray) -> None:
        value = self._input_dtypes[arg.name]
        if value.dtype is not None:
            want = numpy_dtype(int(value.dtype))
            if array.dtype != want and not (want.kind in "OSU" and array.dtype.kind in "OSU"):
                raise InvalidArgument(
                    f"input {arg.name!r} has dtype {array.dtype}, expected {want} ({arg.type}); "
                    f"convert it with .astype(np.{want.name})"
                )
        if value.shape is None:
            return
        if array.ndim != len(arg.shape):
            raise InvalidArgument(
                f"input {arg.name!r} has rank {array.ndim} (shape {list(array.shape)}), "
                f"expected rank {len(arg.shape)} (shape {arg.shape})"
            )
        for axis, (got, want) in enumerate(zip(array.shape, arg.shape)):
            if isinstance(want, int) and got != want:
                raise InvalidArgument(
                    f"input {arg.name!r} has dim {got} on axis {axis} (shape "
                    f"{list(array.shape)}), expected {want} (shape {arg.shape})"
                )

    def _describe_inputs(self) -> str:
        return ", ".join(f"{a.name}: {a.type} {a.shape}" for a in self._inputs)

"""Session creation: one function per stage, small dataclasses between them.

:func:`create` runs the stages in this order; each takes what the stages
before it made and returns one dataclass:

1. :func:`load` -> :class:`LoadedModel` — parse the path, bytes or
   ``ModelProto``, run the checker and shape inference (on a copy without the
   weights' bytes), validate the graph and map external data (mmap, confined
   to the model's folder).
2. :func:`select_providers` -> :class:`Selection` — the EPs to use, highest
   priority first: the caller's ``providers`` list as given (cpu appended as
   the fallback unless ``session.disable_cpu_ep_fallback`` is set), or, when
   the caller gives none, what the session's provider-selection policy
   chooses (:mod:`nxrt.selection`; by default it builds each candidate plan
   through stages 3 to 7, times it, and keeps the fastest, cached on disk).
3. :func:`create_providers` -> :class:`Providers` — each selected EP
   instantiated, initialised, and asked for its capabilities
   (``nxrt_ep_capabilities``). An EP that fails to start is fatal when the
   caller named it, skipped (and recorded) otherwise.
4. :func:`optimize` -> :class:`Optimization` — core's EP-neutral passes
   (constant folding, computed with the session's own kernels through
   ``nxrt_match_kernel``, then dead code), then the first EP's
   ``nxrt_optimizer_passes``. Optimizing needs the EPs' kernels and passes,
   so it runs after the EPs are chosen; the placement and the plan it shapes
   are what the selection stage's policies compare.
5. :func:`place` -> :class:`~nxrt.partition.Placement` — EPContext nodes to
   the EPs owning their sources (``nxrt_load_context``), then each EP in
   order claims subgraphs (``nxrt_claim_subgraphs``) and matches single
   nodes (``nxrt_match_kernel``); claims are checked for cycles with every
   earlier claim contracted.
6. :func:`plan` -> :class:`PlanDraft` — the run order (every node or claim
   exactly once, or :class:`~nxrt.errors.InvalidPlacement`), a slot per value,
   the copies between devices, weights negotiated per EP.
7. :func:`instantiate` -> :class:`~nxrt.executor.Plan` — kernels created and
   claims compiled, buffer slots freed after their last use.

Around the stages, :func:`create` applies what ``SessionOptions`` changes in
the model (:mod:`nxrt.overrides`): after stage 1, the caller's initializers and
free-dimension sizes; after stage 7, the optimized model is written when
``optimized_model_filepath`` asks for it.

``InferenceSession`` is the ONNX Runtime-shaped shell around the
:class:`SessionState` that :func:`create` returns; ``nxrt compile`` and the
CLI use this module, not the session's internals.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from nxrt import contrib_ops  # noqa: F401  (registers nxrt's op schemas with onnx)
from nxrt.epcontext import build_ep_context_registry, is_context_node, read_context
from nxrt.errors import (
    EpLoadFailed,
    InvalidArgument,
    InvalidModel,
    NoEpForContext,
    NxrtError,
    UnknownProvider,
)
from nxrt.executor import NO_SLOT, CopyKernel, Plan, Step
from nxrt.external_data import resolve_external_data
from nxrt.host import Host, NxrtPluginManager
from nxrt.host_parallel import HostParallel
from nxrt.kernel import Kernel, SubgraphClaim
from nxrt.memory import parse_bytes
from nxrt.model import load_model, opset_of, value_names
from nxrt.optimizer import fold_constants, run_passes
from nxrt.overrides import (
    override_free_dimensions,
    private_ops,
    replace_initializers,
    save_optimized,
)
from nxrt.partition import Copy, Placement, partition, schedule
from nxrt.provider import EpConfig, ExecutionProvider
from nxrt.selection import ExecutionProviderDevicePolicy, SelectionReport
from nxrt.subgraph import ScopedKernel, Subgraph, implicit_inputs, outer_names, subgraphs_of
from nxrt.values import constant_array
from nxrt.weight_binding import negotiate_weights

if TYPE_CHECKING:
    import onnx
    import onnx_ir as ir

    from nxrt.registry import EpDescriptor, EpRegistry, KernelEntry
    from nxrt.selection import Candidate, EpInfo
    from nxrt.weight import ExecutionProviderCapabilities, WeightHandle

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

#: What ``providers`` may hold: EP ids (or ORT names), or ``(id, options)`` pairs.
ProviderRequest = str | tuple[str, dict[str, Any]]


# -- 1. load ---------------------------------------------------------------------------------------
@dataclass
class LoadedModel:
    """The checked, shape-inferred graph, the folder it came from, and its mapped weights."""

    model: ir.Model
    base_dir: str | None
    weights: dict[str, WeightHandle]


def load(
    source: str | os.PathLike[str] | bytes | onnx.ModelProto,
    files: dict[str, np.ndarray] | None = None,
    provided: Sequence[str] = (),
) -> LoadedModel:
    """Stage 1: read, check, infer and validate the model; map its external data (``files``:
    external-data files given in memory, by the location the model names them with;
    ``provided``: external initializers the caller gives, whose files are not read)."""
    model, base_dir = load_model(source)
    weights = resolve_external_data(model, base_dir, files, provided)
    return LoadedModel(model, base_dir, weights)


# -- 2. select EPs ---------------------------------------------------------------------------------
@dataclass
class Selection:
    """The EPs a session uses, highest priority first, and how they were chosen."""

    requests: list[tuple[EpDescriptor, dict[str, Any]]]
    explicit: bool
    policy: str = "explicit"
    report: SelectionReport | None = None


def provider_requests(
    providers: Sequence[ProviderRequest] | None,
    provider_options: Sequence[dict[str, Any]] | None = None,
) -> list[tuple[str, dict[str, Any]]] | None:
    """``providers`` / ``provider_options`` as ONNX Runtime takes them, as (name, options)."""
    if providers is None:
        return None
    if isinstance(providers, str):
        raise InvalidArgument("providers must be a list, e.g. ['cpu'], not a string")
    if provider_options is not None and len(provider_options) != len(providers):
        raise InvalidArgument(
            f"provider_options has {len(provider_options)} entries for {len(providers)} "
            "providers; give one dict per provider"
        )
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


def select_providers(
    registry: EpRegistry,
    host: Host,
    requests: list[tuple[str, dict[str, Any]]] | None,
    *,
    fallback: bool = True,
) -> Selection:
    """Stage 2: resolve the caller's providers, or take the installed ones in default order."""
    explicit = requests is not None
    if requests is None:
        requests = [(ep_id, {}) for ep_id in registry.default_order()]
    chosen: list[tuple[EpDescriptor, dict[str, Any]]] = []
    for name, options in requests:
        descriptor = registry.resolve(name)
        if descriptor is None:
            known = ", ".join(sorted(registry.providers)) or "none"
            broken = "; ".join(str(f) for f in host.failures)
            raise UnknownProvider(
                name,
                f"Execution provider {name!r} is not installed (installed: {known})"
                + (f"; plugins that failed to load: {broken}" if broken else "")
                + ". Install its package, e.g. `pip install nxrt-ep-<name>`.",
            )
        if all(descriptor.id != d.id for d, _ in chosen):
            chosen.append((descriptor, options))
    cpu = registry.resolve(FALLBACK_EP)
    if fallback and cpu is not None and all(d.id != FALLBACK_EP for d, _ in chosen):
        chosen.append((cpu, {}))
    return Selection(chosen, explicit, "explicit" if explicit else "priority")


# -- 3. create EPs ---------------------------------------------------------------------------------
@dataclass
class Providers:
    """The session's EP instances (with the plugin owning each) and their capabilities."""

    eps: list[tuple[ExecutionProvider, str]]
    capabilities: dict[str, ExecutionProviderCapabilities]

    def by_id(self) -> dict[str, ExecutionProvider]:
        return {ep.id: ep for ep, _ in self.eps}

    @property
    def uses_host_blas(self) -> bool:
        return any(ep.uses_host_blas for ep, _ in self.eps)


def create_providers(
    selection: Selection,
    host: Host,
    parallel: HostParallel,
    threads: int | None,
    session_config: dict[str, str] | None = None,
) -> Providers:
    """Stage 3: instantiate and initialise each selected EP, then ask its capabilities."""
    eps = []
    for descriptor, options in selection.requests:
        try:
            ep = instantiate_ep(descriptor, options, parallel, threads, session_config)
            eps.append((ep, descriptor.plugin))
        except Exception as exc:  # noqa: BLE001 - the plugin's own failure, shown whole
            failure = (
                exc
                if isinstance(exc, NxrtError)
                else EpLoadFailed(descriptor.plugin, f"creating EP {descriptor.id!r}: {exc!r}")
            )
            if selection.explicit:
                if failure is exc:
                    raise
                raise failure from exc
            host.failures.append(failure)  # not asked for by name: skip it, say why
    if not eps:
        raise InvalidArgument("no execution provider is available; install nxrt-ep-cpu")
    capabilities = {ep.id: host.capabilities(ep, owner) for ep, owner in eps}
    return Providers(eps, capabilities)


def instantiate_ep(
    descriptor: EpDescriptor,
    options: dict[str, Any],
    parallel: HostParallel,
    threads: int | None,
    session_config: dict[str, str] | None = None,
) -> ExecutionProvider:
    """One EP from its descriptor, configured (the session's config entries included) and
    initialised."""
    limit = options.get("memory_limit")
    config = EpConfig(
        options=dict(options),
        threads=threads,
        memory_limit=parse_bytes(limit) if limit is not None else None,
        device_id=int(options.get("device_id", 0)),
        session_config=dict(session_config or {}),
    )
    ep = descriptor.factory(config)
    if not isinstance(ep, ExecutionProvider):
        raise TypeError(f"factory returned {type(ep).__name__}, not an ExecutionProvider")
    ep.id = descriptor.id
    ep.parallel = parallel
    if ep.ops is None:
        ep.ops = descriptor.ops
    ep.initialize()
    return ep


# -- 4. optimize -----------------------------------------------------------------------------------
@dataclass
class Optimization:
    """What the passes changed, for the partition report."""

    folded: list[tuple[str, str]] = field(default_factory=list)  # (node, op)
    fused: list[tuple[str, str]] = field(default_factory=list)  # (node, into)


def optimize(loaded: LoadedModel, providers: Providers, host: Host) -> Optimization:
    """Stage 4: fold constants with the session's kernels, then the first EP's passes.

    The EP's passes run on a clone of the graph: if one fails, the session
    goes on with the graph as it was before them, and the failure is recorded.
    """
    model = loaded.model
    folded = fold_constants(model, lambda node: evaluate_constant(node, model, providers, host))
    first, owner = providers.eps[0]
    passes = host.optimizer_passes(first, owner)
    fused: list[tuple[str, str]] = []
    if passes:
        trial = model.clone()
        try:
            fused = run_passes(trial, passes)
        except Exception as exc:  # noqa: BLE001 - the plugin's pass, isolated
            root: BaseException = exc
            while root.__cause__ is not None:  # the pass manager wraps the pass's own error
                root = root.__cause__
            host.hook_failed(exc, ep=first.id, cause=f"optimizer pass failed: {root!r}")
        else:
            _adopt(model, trial)
    return Optimization(folded, fused)


def _adopt(model: ir.Model, rewritten: ir.Model) -> None:
    """Make ``model`` the rewritten one (callers hold ``model``, not the clone)."""
    model.graph = rewritten.graph
    model.opset_imports.update(rewritten.opset_imports)


def evaluate_constant(
    node: ir.Node, model: ir.Model, providers: Providers, host: Host
) -> list[Any] | None:
    """Compute a node with constant inputs on the first host EP that runs it (folding)."""
    if node.op_type in NONDETERMINISTIC_OPS or subgraphs_of(node):
        return None
    opset = opset_of(model, node.domain)
    for ep, owner in providers.eps:
        if ep.device_type != "cpu" or ep.ops is None:
            continue
        match = host.match_kernel(ep, owner, node, opset)
        if not match.supported:
            continue
        inputs = [constant_array(v.const_value) if v is not None else None for v in node.inputs]
        try:
            entry = cast("KernelEntry", match.entry)  # the host fills it in on a match
            return list(ep.create_kernel(node, entry).compute(inputs))
        except Exception:  # noqa: BLE001 - left in the plan, so it fails at run time
            return None
    return None


# -- 5. place --------------------------------------------------------------------------------------
def place(loaded: LoadedModel, providers: Providers, host: Host, registry: EpRegistry) -> Placement:
    """Stage 5: precompiled EPContext partitions first, then claims and kernel matches."""
    preplaced = load_contexts(loaded, providers, host, registry)
    return partition(loaded.model, providers.eps, host, preplaced=preplaced)


def load_contexts(
    loaded: LoadedModel, providers: Providers, host: Host, registry: EpRegistry
) -> dict[int, SubgraphClaim]:
    """Precompiled partitions: each EPContext node loaded by the EP owning its source."""
    nodes = [node for node in loaded.model.graph if is_context_node(node)]
    if not nodes:
        return {}
    contexts = build_ep_context_registry(registry.providers.values())
    session_eps = {ep.id: (ep, owner) for ep, owner in providers.eps}
    loaded_claims = {}
    for node in nodes:
        context = read_context(node, loaded.base_dir)
        owner_id = contexts.owner(context.source)
        if owner_id not in session_eps:
            raise NoEpForContext(
                context.source,
                f"EPContext {context.partition_name!r} is for EP {owner_id!r}, which is "
                f"installed but not among this session's providers "
                f"{list(session_eps)}; add {owner_id!r} to providers",
            )
        contexts.require_support(owner_id)
        ep, plugin = session_eps[owner_id]
        kernel = host.load_context(ep, plugin, context)
        loaded_claims[id(node)] = SubgraphClaim(
            ep.id,
            [node],
            name=context.partition_name,
            inputs=value_names(node.inputs),
            outputs=value_names(node.outputs),
            kernel=kernel,
        )
    return loaded_claims


def check_compile_allowed(placement: Placement) -> None:
    """With ``session.disable_model_compile``, only precompiled partitions are accepted."""
    for claim in placement.report.claims:
        if claim.kernel is None:
            raise InvalidModel(
                f"{DISABLE_MODEL_COMPILE} is set, but EP {claim.ep!r} would compile a "
                f"partition of {len(claim.nodes)} node(s) starting at "
                f"{claim.nodes[0].name!r}; compile the model first: "
                f"`nxrt compile MODEL -o OUT --ep {claim.ep}`"
            )


# -- 6. plan ---------------------------------------------------------------------------------------
@dataclass
class PlanDraft:
    """A plan whose steps know how to make their kernels, none made yet."""

    plan: Plan
    makers: list[Callable[[], Kernel] | None]  # per step; None for a step already holding one


def plan(
    loaded: LoadedModel,
    providers: Providers,
    placement: Placement,
    graph: ir.Graph | None = None,
    implicit: Sequence[str] = (),
) -> PlanDraft:
    """Stage 6: the run order, slots, copies between devices and negotiated weights.

    ``graph`` is a subgraph of a control-flow node reading the ``implicit``
    outer-scope values; default: the main graph.
    """
    import onnx_ir as ir

    graph = graph if graph is not None else loaded.model.graph
    eps = providers.by_id()
    slots: dict[str, int] = {}

    def slot(name: str) -> int:
        if not name:
            return NO_SLOT
        if name not in slots:
            slots[name] = len(slots)
        return slots[name]

    constants: dict[int, Any] = {}
    weights = negotiate_weights(graph, loaded.weights, placement, eps, providers.capabilities)
    for name, value in graph.initializers.items():
        if name in weights:  # external data, negotiated per EP (lazy or resident)
            constants[slot(name)] = weights[name]
            continue
        if value.const_value is None:
            raise InvalidModel(f"initializer {name!r} has no data")
        array = constant_array(value.const_value)
        if isinstance(array, np.ndarray):
            if array.dtype.kind in "biufc":  # not strings, not ml_dtypes' (kind "V")
                # the graph keeps this array instead of the protobuf's copy of the bytes,
                # so the parsed model can be freed: one copy of every weight, not two
                value.const_value = ir.Tensor(array, name=name)
            array = array.view()
            array.flags.writeable = False
        constants[slot(name)] = array
    input_slots = {name: slot(name) for name in [*value_names(graph.inputs), *implicit]}
    location = {name: "cpu" for name in slots}  # device holding each value
    copies: dict[tuple[str, str], int] = {}
    steps: list[Step] = []
    makers: list[Callable[[], Kernel] | None] = []
    report = placement.report
    producers: dict[str, ExecutionProvider] = {}

    def read(name: str, ep: ExecutionProvider) -> int:
        """The slot ``ep`` reads ``name`` from, inserting a copy across devices."""
        if not name:
            return NO_SLOT
        source_device = location.get(name, "cpu")
        if source_device == ep.device_type:
            return slot(name)
        key = (name, ep.device_type)
        if key not in copies:
            copies[key] = slot(f"{name}@{ep.device_type}")
            op = "MemcpyToDevice" if ep.device_type != "cpu" else "MemcpyToHost"
            kernel = CopyKernel(producers.get(name), ep)
            steps.append(
                Step(kernel, [slot(name)], [copies[key]], f"copy {name}", op, ep.id, ep.device_type)
            )
            makers.append(None)
            report.copies.append(Copy(name, source_device, ep.device_type, ep.id))
        return copies[key]

    nodes = list(graph)
    compiled: set[int] = set()
    for i in schedule(placement, nodes):
        node = nodes[i]
        ep = eps[placement.node_ep[i]]
        claim_index = placement.node_claim[i]
        flops = 0
        bytes_: float = 0
        if claim_index is not None:
            if claim_index in compiled:
                continue
            compiled.add(claim_index)
            claim = report.claims[claim_index]
            make = _claim_maker(claim, ep, graph)
            ins, outs, name, op_type = claim.inputs, claim.outputs, claim.name, "Subgraph"
        else:
            match = placement.matches[i]
            assert match is not None  # a node placed alone has its match
            ins = value_names(node.inputs)
            outer = implicit_inputs(node) if subgraphs_of(node) else []
            make = _node_maker(node, ep, match.entry, len(ins), outer)
            ins = ins + outer
            outs = value_names(node.outputs)
            name, op_type = cast(str, node.name), node.op_type
            if match.cost is not None:
                flops, bytes_ = match.cost.flops, match.cost.bytes
        step = Step(
            Kernel(), [read(n, ep) for n in ins], [slot(n) for n in outs], name, op_type, ep.id
        )
        step.device, step.flops, step.bytes = ep.device_type, flops, bytes_
        steps.append(step)
        makers.append(make)
        for out in outs:
            if out:
                location[out] = ep.device_type
                producers[out] = ep
    output_slots = {name: slot(name) for name in value_names(graph.outputs)}
    output_hosts = {
        name: producers[name] for name in output_slots if location.get(name, "cpu") != "cpu"
    }
    draft = Plan(list(slots), constants, input_slots, output_slots, steps, output_hosts)
    return PlanDraft(draft, makers)


def _claim_maker(
    claim: SubgraphClaim, ep: ExecutionProvider, graph: ir.Graph
) -> Callable[[], Kernel]:
    if claim.kernel is not None:
        kernel = claim.kernel
        return lambda: kernel
    return lambda: ep.compile(claim, graph)


def _node_maker(
    node: ir.Node, ep: ExecutionProvider, entry: Any, regular_inputs: int, outer: list[str]
) -> Callable[[], Kernel]:
    def make() -> Kernel:
        kernel = ep.create_kernel(node, entry)
        return ScopedKernel(kernel, regular_inputs, outer) if outer else kernel

    return make


# -- 7. instantiate --------------------------------------------------------------------------------
def instantiate(draft: PlanDraft) -> Plan:
    """Stage 7: create every kernel and compile every claim; the plan ``run`` walks."""
    for step, make in zip(draft.plan.steps, draft.makers):
        if make is not None:
            step.kernel = make()
    draft.plan.finish()
    return draft.plan


# -- the whole pipeline ----------------------------------------------------------------------------
@dataclass
class SessionState:
    """Everything a created session holds."""

    loaded: LoadedModel
    host: Host
    registry: EpRegistry
    parallel: HostParallel
    selection: Selection
    providers: Providers
    placement: Placement
    plan: Plan

    @property
    def uses_host_blas(self) -> bool:
        """Whether an EP that runs part of the plan computes through numpy's BLAS."""
        running = {step.ep for step in self.plan.steps}
        return any(ep.uses_host_blas for ep, _ in self.providers.eps if ep.id in running)

    def compiled_partitions(self) -> list[tuple[SubgraphClaim, ExecutionProvider, str, Kernel]]:
        """Each compiled claim with its EP, owning plugin and kernel (what compile saves)."""
        owners = {ep.id: (ep, owner) for ep, owner in self.providers.eps}
        kernels = {s.name: s.kernel for s in self.plan.steps if s.op_type == "Subgraph"}
        return [
            (claim, *owners[claim.ep], kernels[claim.name])
            for claim in self.placement.report.claims
            if claim.name in kernels
        ]


@dataclass
class CreateOptions:
    """The settings of session creation that come from ``SessionOptions``."""

    threads: int | None = None
    optimize: bool = True
    fallback: bool = True
    allow_compile: bool = True
    policy: ExecutionProviderDevicePolicy = ExecutionProviderDevicePolicy.DEFAULT
    config: dict[str, str] = field(default_factory=dict)
    #: Arrays replacing the model's initializers (``add_initializer``), and those replacing
    #: initializers with external data (``add_external_initializers``).
    initializers: dict[str, np.ndarray] = field(default_factory=dict)
    external_initializers: dict[str, np.ndarray] = field(default_factory=dict)
    #: Sizes fixing the model's symbolic dimensions (``add_free_dimension_override_by_name``),
    #: and the dimensions of a denotation (``..._by_denotation``).
    free_dimensions: dict[str, int] = field(default_factory=dict)
    free_dimension_denotations: dict[str, int] = field(default_factory=dict)
    #: External-data files given in memory (``add_external_initializers_from_files_in_memory``).
    external_files: dict[str, np.ndarray] = field(default_factory=dict)
    #: Where to write the optimized model ('': nowhere; ``optimized_model_filepath``).
    optimized_model_path: str = ""
    #: Provider names that, requested but not installed, are left out with a warning
    #: (ONNX Runtime's names) instead of being an error.
    optional_providers: frozenset[str] = frozenset()


def create(
    source: str | os.PathLike[str] | bytes | onnx.ModelProto,
    requests: list[tuple[str, dict[str, Any]]] | None,
    options: CreateOptions,
    plugin_manager: NxrtPluginManager,
) -> SessionState:
    """Run every stage (module docstring) and return what the session needs."""
    host = Host(plugin_manager)
    registry = host.build_registry()
    parallel = HostParallel(options.threads)
    loaded = load(source, options.external_files, list(options.external_initializers))
    replace_initializers(loaded.model, loaded.weights, options.initializers, external=False)
    replace_initializers(loaded.model, loaded.weights, options.external_initializers, external=True)
    override_free_dimensions(
        loaded.model, options.free_dimensions, options.free_dimension_denotations
    )
    as_loaded = loaded.model.clone() if options.optimized_model_path else None
    if requests is not None and options.optional_providers:
        requests = installed_requests(requests, registry, options.optional_providers)
    if requests is None and len(registry.providers) > 1:
        state = choose(source, loaded, host, registry, parallel, options)
    else:
        selection = select_providers(registry, host, requests, fallback=options.fallback)
        providers = create_providers(selection, host, parallel, options.threads, options.config)
        state = build(loaded, host, registry, parallel, selection, providers, options)
    if as_loaded is not None:
        optimized = state.loaded.model
        if private_ops(optimized):  # fusions only nxrt runs: write the EP-neutral passes' graph
            fold_constants(
                as_loaded,
                lambda node: evaluate_constant(node, as_loaded, state.providers, state.host),
            )
            optimized = as_loaded
        save_optimized(optimized, options.optimized_model_path, source, options.config)
    return state


def installed_requests(
    requests: list[tuple[str, dict[str, Any]]],
    registry: EpRegistry,
    optional: frozenset[str],
) -> list[tuple[str, dict[str, Any]]]:
    """``requests`` without the ``optional`` names no installed EP answers to, each left out
    with a warning (as ONNX Runtime does for providers its build lacks)."""
    import warnings

    kept = []
    for name, provider_options in requests:
        if name in optional and registry.resolve(name) is None:
            warnings.warn(
                f"execution provider {name!r} is not installed; the session runs without it "
                f"(installed: {', '.join(registry.default_order())})",
                stacklevel=5,  # the caller of InferenceSession() or set_providers()
            )
            continue
        kept.append((name, provider_options))
    return kept


class _Built:
    """A candidate plan as the measuring needs it: run once, and what fell back."""

    def __init__(self, state: SessionState) -> None:
        self.state = state
        self.outputs = value_names(state.loaded.model.graph.outputs)

    def run(self, feeds: dict[str, Any]) -> None:
        plan = self.state.plan
        if self.state.uses_host_blas:
            with self.state.parallel.run_limits():
                plan.execute(feeds, self.outputs, None)
        else:
            plan.execute(feeds, self.outputs, None)

    def wait_for_compiled(self, timeout: float) -> bool:
        """Whether the plan's EPs finished their background compiles within ``timeout`` s."""
        deadline = time.monotonic() + timeout
        return all(
            ep.wait_for_compiled(max(0.0, deadline - time.monotonic()))
            for ep, _ in self.state.providers.eps
        )

    def discard(self) -> None:
        """The candidate lost: its EPs drop the compiles they have not started."""
        for ep, _ in self.state.providers.eps:
            ep.cancel_compiles()

    def leftover(self) -> bool:
        """Whether the plan's first EP left nodes to the fallback."""
        first = self.state.providers.eps[0][0].id
        return first != FALLBACK_EP and any(
            p.ep == FALLBACK_EP for p in self.state.placement.report.nodes
        )


def choose(
    source: Any,
    loaded: LoadedModel,
    host: Host,
    registry: EpRegistry,
    parallel: HostParallel,
    options: CreateOptions,
) -> SessionState:
    """Stage 2 without ``providers``: the policy picks the EPs, then stages 3 to 7 run.

    A measured decision is written to the cache only when every candidate was
    measured (:attr:`~nxrt.selection.Measurement.complete`); one the budget cut
    short serves this session only.
    """
    import time

    from nxrt import selection as sel

    started = time.perf_counter()
    policy = options.policy
    config = options.config
    dims = sel.parse_dims(config.get(sel.DIMS, ""))
    shapes = sel.parse_shapes(config.get(sel.SHAPES, ""))
    graph = loaded.model.graph
    inputs = [v for v in graph.inputs if v.name not in graph.initializers]
    sel.check_shapes(inputs, shapes)
    fallback = FALLBACK_EP if options.fallback else ""
    use_cache = config.get(sel.CACHE, "1") not in ("0", "")
    installed = registry.default_order()
    measured_shapes: dict[str, tuple[int, ...]] | None = None
    cannot_measure = ""
    if policy.measures:
        try:
            measured_shapes = sel.feed_shapes(inputs, dims, shapes)
        except NxrtError as exc:  # e.g. map inputs: choose by preference instead of timing
            cannot_measure = f"not measured ({exc}); chose by preference"
    key = ""
    if use_cache and measured_shapes is not None:
        versions = [(i, plugin_version(host, registry.providers[i].plugin)) for i in installed]
        key = sel.cache_key(
            sel.model_digest(source), versions, parallel.threads, dims, shapes=measured_shapes
        )
    report = sel.read_cached(key, set(installed)) if key else None
    winner: SessionState | None = None
    infos, unstarted = (
        ep_infos(registry, host, parallel, options.threads) if report is None else ([], [])
    )
    feeds: dict[str, Any] | None = None
    if report is None and measured_shapes is not None:
        try:
            feeds = sel.synthesize_feeds(inputs, dims, shapes)
        except NxrtError as exc:
            cannot_measure = f"not measured ({exc}); chose by preference"
    if feeds is not None:

        def build_candidate(ids: list[str]) -> _Built:
            trial = LoadedModel(loaded.model.clone(), loaded.base_dir, loaded.weights)
            return _Built(_build_for(ids, trial, Host(host.pm), registry, parallel, options))

        found = sel.measure(
            infos,
            build_candidate,
            feeds,
            budget_ms=float(config.get(sel.BUDGET_MS, sel.DEFAULT_BUDGET_MS)),
            runs=int(config.get(sel.RUNS, sel.DEFAULT_RUNS)),
            settle_ms=float(config.get(sel.SETTLE_MS, sel.DEFAULT_SETTLE_MS)),
            fallback=fallback or FALLBACK_EP,
            started=started,  # starting the EPs (ep_infos) is part of the budget
        )
        report = sel.SelectionReport(
            policy.name, found.choice, found.candidates + unstarted, note=found.note
        )
        if found.built is not None and not loaded.weights:
            winner = found.built.state  # built on a clone; with mapped weights, rebuild
        report.seconds = time.perf_counter() - started
        if key and found.built is not None:
            report.cached = sel.write_cached(key, report)  # refused unless complete
    elif report is None:
        ordered = (
            sel.order_for_device(infos, policy)
            if policy in sel.DEVICE_ORDER
            else sel.order_by_preference(infos)
        )
        choice = [i.id for i in ordered if i.id != FALLBACK_EP] + [FALLBACK_EP]
        report = sel.SelectionReport(policy.name, choice, unstarted, note=cannot_measure)
    if winner is None:
        try:
            winner = _build_for(report.choice, loaded, host, registry, parallel, options)
        except NxrtError as exc:  # a chosen EP that cannot build this model: cpu alone
            if report.choice == [FALLBACK_EP] or FALLBACK_EP not in registry.providers:
                raise
            report.note = f"{','.join(report.choice)} failed to build ({exc}); cpu alone"
            report.choice = [FALLBACK_EP]
            winner = _build_for(report.choice, loaded, host, registry, parallel, options)
        report.seconds = time.perf_counter() - started
    winner.host.failures[:0] = [f for f in host.failures if f not in winner.host.failures]
    winner.selection.policy, winner.selection.report = policy.name, report
    winner.placement.report.selection = report
    return winner


def _build_for(
    ids: Sequence[str],
    loaded: LoadedModel,
    host: Host,
    registry: EpRegistry,
    parallel: HostParallel,
    options: CreateOptions,
) -> SessionState:
    """Stages 3 to 7 for the EPs ``ids`` (an EP that fails to start is an error)."""
    selection = select_providers(
        registry, host, [(i, {}) for i in ids if i in registry.providers], fallback=options.fallback
    )
    providers = create_providers(selection, host, parallel, options.threads, options.config)
    return build(loaded, host, registry, parallel, selection, providers, options)


def ep_infos(
    registry: EpRegistry, host: Host, parallel: HostParallel, threads: int | None
) -> tuple[list[EpInfo], list[Candidate]]:
    """Every installed EP's device and preference (starting it is what tells them), and a
    skipped candidate for each EP that fails to start (its failure recorded)."""
    from nxrt.selection import Candidate, EpInfo

    infos, unstarted = [], []
    for ep_id in registry.default_order():
        descriptor = registry.providers[ep_id]
        try:
            ep = instantiate_ep(descriptor, {}, parallel, threads)
        except Exception as exc:  # noqa: BLE001 - an EP that cannot start is no candidate
            host.failures.append(EpLoadFailed(descriptor.plugin, f"creating EP {ep_id!r}: {exc!r}"))
            unstarted.append(Candidate([ep_id, FALLBACK_EP], skipped=f"cannot start: {exc!r}"))
            continue
        capabilities = host.capabilities(ep, descriptor.plugin)
        infos.append(EpInfo(ep_id, ep.device_type, capabilities.preference, descriptor.priority))
    return infos, unstarted


def plugin_version(host: Host, plugin: str) -> str:
    """The plugin distribution's identity and those of what it depends on (its backend):
    version, and source folder for an editable install (:func:`~nxrt.selection.
    distribution_identity`), so a decision is never shared by code that differs."""
    import re

    from importlib_metadata import PackageNotFoundError, distribution

    from nxrt.selection import distribution_identity

    info = host.pm.plugin_info.get(plugin)
    if info is None or not info.distribution:
        return "unversioned"
    parts = [distribution_identity(info.distribution)]
    try:
        for requirement in distribution(info.distribution).requires or []:
            name = re.split(r"[ ;<>=!~\[]", requirement, maxsplit=1)[0]
            identity = distribution_identity(name)
            if not identity.endswith("=unversioned"):
                parts.append(identity)
    except PackageNotFoundError:
        pass
    return ";".join(parts)


def build(
    loaded: LoadedModel,
    host: Host,
    registry: EpRegistry,
    parallel: HostParallel,
    selection: Selection,
    providers: Providers,
    options: CreateOptions,
) -> SessionState:
    """Stages 4 to 7 for EPs already created."""

    def compile_subgraph(graph: ir.Graph) -> Subgraph:
        """Partition and plan a graph attribute with the session's EPs."""
        placement = partition(loaded.model, providers.eps, host, graph=graph)
        outer = outer_names(graph)
        sub_plan = instantiate(plan(loaded, providers, placement, graph, outer))
        return Subgraph(sub_plan, value_names(graph.inputs), value_names(graph.outputs), outer)

    for ep, _ in providers.eps:
        ep.subgraph_compiler = compile_subgraph
    optimization = optimize(loaded, providers, host) if options.optimize else Optimization()
    placement = place(loaded, providers, host, registry)
    if not options.allow_compile:
        check_compile_allowed(placement)
    placement.report.folded, placement.report.fused = optimization.folded, optimization.fused
    final = instantiate(plan(loaded, providers, placement))
    return SessionState(loaded, host, registry, parallel, selection, providers, placement, final)

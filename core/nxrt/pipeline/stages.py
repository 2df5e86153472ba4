"""Session creation: one function per stage, small frozen dataclasses between them.

:func:`create` runs the stages in this order. Each stage is a function of what
the stages before it returned and returns a new value: none writes into an
earlier stage's result, and an EP is complete once stage 3 has bound it
(:meth:`~nxrt.provider.ExecutionProvider.bind`).

1. :func:`load` -> :class:`LoadedModel` — parse the path, bytes or
   ``ModelProto``, run the checker and shape inference (on a copy without the
   weights' bytes), validate the graph, map external data (mmap, confined to
   the model's folder), apply what ``SessionOptions`` changes in the model
   (:mod:`nxrt.pipeline.overrides`: the caller's initializers and free-dimension
   sizes), and hold every other weight as one numpy array.
2. :func:`select_providers` -> :class:`Selection` — the EPs to use, highest
   priority first: the caller's ``providers`` list as given (cpu appended as
   the fallback unless ``session.disable_cpu_ep_fallback`` is set), or, when
   the caller gives none, what the session's provider-selection policy
   chooses (:func:`nxrt.pipeline.selection.decide`; by default it builds each candidate
   plan through stages 3 to 7, times it, and keeps the fastest, cached on disk).
3. :func:`create_providers` -> :class:`Providers` — each selected EP built by
   its factory, bound (its id, the session's pool, its kernel table, the
   session's :class:`SubgraphCompiler`), initialised, and asked for its
   capabilities (``nxrt_ep_capabilities``). An EP that fails to start is
   fatal when the caller named it, skipped (and recorded) otherwise.
4. :func:`optimize` -> :class:`Optimization` — on a clone of the model: core's
   EP-neutral passes (constant folding, computed with the session's own
   kernels through ``nxrt_match_kernel``, then dead code), then the first EP's
   ``nxrt_optimizer_passes``. Optimizing needs the EPs' kernels and passes,
   so it runs after the EPs are chosen; its model is the one stages 5 to 7 read.
5. :func:`place` -> :class:`~nxrt.pipeline.partition.Placement` — EPContext nodes to
   the EPs owning their sources (``nxrt_load_context``), then each EP in
   order claims subgraphs (``nxrt_claim_subgraphs``) and matches single
   nodes (``nxrt_match_kernel``); claims are checked for cycles with every
   earlier claim contracted.
6. :func:`plan` -> :class:`PlanDraft` — the run order (every node or claim
   exactly once, or :class:`~nxrt.errors.InvalidPlacement`), a slot per value,
   the copies between devices, weights negotiated per EP.
7. :func:`instantiate` -> :class:`~nxrt.pipeline.executor.Plan` — kernels created and
   claims compiled, buffer slots freed after their last use.

:func:`create` then assembles the :class:`~nxrt.pipeline.partition.PartitionReport`
once, from the parts the stages returned (placement, copies, folded and
fused nodes, the selection report), and writes the optimized model when
``optimized_model_filepath`` asks for it. :func:`fit_plan` derives from a
finished plan the variant one kind of run needs (inputs already on their
device, outputs kept there, only the fetched outputs' kernels).

``InferenceSession`` is the ONNX Runtime-shaped shell around the
:class:`SessionState` that :func:`create` returns; ``nxrt compile`` and the
CLI use this module, not the session's internals.
"""

from __future__ import annotations

import contextlib
import copy
import os
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
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
from nxrt.host import Host, NxrtPluginManager
from nxrt.host_parallel import HostParallel
from nxrt.kernel import Kernel, SubgraphClaim
from nxrt.memory import parse_bytes
from nxrt.pipeline import selection as sel
from nxrt.pipeline.executor import NO_SLOT, CopyKernel, Plan, Step
from nxrt.pipeline.external_data import resolve_external_data
from nxrt.pipeline.model import load_model, opset_of, value_names
from nxrt.pipeline.optimizer import fold_constants, run_passes
from nxrt.pipeline.overrides import (
    override_free_dimensions,
    private_ops,
    replace_initializers,
    save_optimized,
)
from nxrt.pipeline.partition import Copy, PartitionReport, Placement, partition, schedule
from nxrt.pipeline.selection import (
    Candidate,
    EpInfo,
    ExecutionProviderDevicePolicy,
    SelectionReport,
)
from nxrt.pipeline.values import constant_array
from nxrt.pipeline.weight_binding import EXTERNAL_TENSOR_META, negotiate_weights
from nxrt.provider import EpConfig, ExecutionProvider
from nxrt.subgraph import ScopedKernel, Subgraph, implicit_inputs, outer_names, subgraphs_of

if TYPE_CHECKING:
    from typing import TypeAlias

    import onnx
    import onnx_ir as ir

    from nxrt.ep_registry import EpDescriptor, EpRegistry
    from nxrt.registry import KernelEntry
    from nxrt.weight import ExecutionProviderCapabilities, LazyWeight, WeightHandle

    #: What a session is created from: a model's path, its bytes, or its ``ModelProto``.
    ModelSource: TypeAlias = str | os.PathLike[str] | bytes | onnx.ModelProto

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


# -- 1. load ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LoadedModel:
    """The checked, shape-inferred graph, the folder it came from, and its mapped weights."""

    model: ir.Model
    base_dir: str | None
    weights: Mapping[str, WeightHandle]


def load(source: ModelSource, options: CreateOptions | None = None) -> LoadedModel:
    """Stage 1: read, check, infer and validate the model; map its external data (the
    files ``options`` gives in memory, by the location the model names them with; not
    those of the external initializers it replaces); apply its initializers and
    free-dimension sizes."""
    options = options or CreateOptions()
    model, base_dir = load_model(source)
    weights = resolve_external_data(
        model, base_dir, options.external_files, list(options.external_initializers)
    )
    replace_initializers(model, weights, options.initializers, external=False)
    replace_initializers(model, weights, options.external_initializers, external=True)
    override_free_dimensions(model, options.free_dimensions, options.free_dimension_denotations)
    _hold_arrays(model, weights)
    return LoadedModel(model, base_dir, weights)


def _hold_arrays(model: ir.Model, weights: Mapping[str, WeightHandle]) -> None:
    """Each numeric initializer of every graph held as the numpy array the plan hands out,
    not as the protobuf's bytes, so the parsed model can be freed: one copy of every
    weight, not two (mapped external data stays mapped)."""
    import onnx_ir as ir

    for graph in model.graphs():
        for name, value in graph.initializers.items():
            tensor = value.const_value
            if tensor is None or (
                name in weights and tensor is value.meta.get(EXTERNAL_TENSOR_META)
            ):
                continue
            array = constant_array(tensor)
            if isinstance(array, np.ndarray) and array.dtype.kind in "biufc":
                # not strings, not ml_dtypes' (kind "V")
                value.const_value = ir.Tensor(array, name=name)


# -- 2. select EPs ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Selection:
    """The EPs a session uses, highest priority first, and how they were chosen."""

    requests: tuple[tuple[EpDescriptor, dict[str, Any]], ...]
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
    requests: Sequence[tuple[str, dict[str, Any]]] | None,
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
    return Selection(tuple(chosen), explicit, "explicit" if explicit else "priority")


# -- 3. create EPs ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Providers:
    """The session's EP instances (with the plugin owning each) and their capabilities."""

    eps: tuple[tuple[ExecutionProvider, str], ...]
    capabilities: Mapping[str, ExecutionProviderCapabilities]

    def by_id(self) -> dict[str, ExecutionProvider]:
        return {ep.id: ep for ep, _ in self.eps}

    @property
    def uses_host_blas(self) -> bool:
        return any(ep.uses_host_blas for ep, _ in self.eps)


class SubgraphCompiler:
    """Turns a graph attribute (an If, Loop or Scan body) into a callable
    :class:`~nxrt.subgraph.Subgraph`: stages 5 to 7 on that graph, with the session's EPs.

    The EPs are bound with it in stage 3, before the model they run exists
    (stage 4 makes it with them); :func:`build` attaches that model and those
    EPs once, before stage 7 makes the kernels that compile subgraphs.
    """

    def __init__(self, host: Host) -> None:
        self.host = host
        self._session: tuple[LoadedModel, Providers] | None = None

    def attach(self, loaded: LoadedModel, providers: Providers) -> None:
        """The optimized model and the session's EPs (once, by :func:`build`)."""
        self._session = (loaded, providers)

    def __call__(self, graph: ir.Graph) -> Subgraph:
        if self._session is None:
            raise InvalidModel("a subgraph was compiled before the session's model was optimized")
        loaded, providers = self._session
        placement = partition(loaded.model, providers.eps, self.host, graph=graph)
        outer = outer_names(graph)
        sub_plan = instantiate(plan(loaded, providers, placement, graph, outer))
        return Subgraph(sub_plan, value_names(graph.inputs), value_names(graph.outputs), outer)


def create_providers(
    selection: Selection,
    host: Host,
    parallel: HostParallel,
    options: CreateOptions,
    subgraph_compiler: SubgraphCompiler | None = None,
) -> Providers:
    """Stage 3: build, bind and initialise each selected EP, then ask its capabilities."""
    eps = []
    for descriptor, ep_options in selection.requests:
        try:
            ep = instantiate_ep(
                descriptor,
                ep_options,
                parallel,
                options.threads,
                options.config,
                subgraph_compiler=subgraph_compiler,
            )
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
    return Providers(tuple(eps), capabilities)


def instantiate_ep(
    descriptor: EpDescriptor,
    options: dict[str, Any],
    parallel: HostParallel,
    threads: int | None,
    session_config: dict[str, str] | None = None,
    *,
    subgraph_compiler: SubgraphCompiler | None = None,
) -> ExecutionProvider:
    """One EP from its descriptor: configured (the session's config entries included),
    bound, and initialised."""
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
    ep.bind(
        descriptor.id,
        parallel=parallel,
        ops=ep.ops if ep.ops is not None else descriptor.ops,
        subgraph_compiler=subgraph_compiler,
    )
    ep.initialize()
    return ep


# -- 4. optimize -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Optimization:
    """The optimized model (what stages 5 to 7 read), and what the passes changed."""

    loaded: LoadedModel
    folded: tuple[tuple[str, str], ...] = ()  # (node, op)
    fused: tuple[tuple[str, str], ...] = ()  # (node, into)


def optimize(loaded: LoadedModel, providers: Providers, host: Host) -> Optimization:
    """Stage 4: on a clone of the model, fold constants with the session's kernels, then
    run the first EP's passes.

    The EP's passes run on a clone of the folded graph: if one fails, the
    session goes on with the graph as it was before them, and the failure is
    recorded.
    """
    model, folded = fold(loaded.model, providers, host)
    first, owner = providers.eps[0]
    passes = host.optimizer_passes(first, owner)
    fused: list[tuple[str, str]] = []
    if passes:
        trial = _clone(model)
        try:
            fused = run_passes(trial, passes)
        except Exception as exc:  # noqa: BLE001 - the plugin's pass, isolated
            root: BaseException = exc
            while root.__cause__ is not None:  # the pass manager wraps the pass's own error
                root = root.__cause__
            host.hook_failed(exc, ep=first.id, cause=f"optimizer pass failed: {root!r}")
        else:
            model = trial
    return Optimization(replace(loaded, model=model), tuple(folded), tuple(fused))


def fold(
    model: ir.Model, providers: Providers, host: Host
) -> tuple[ir.Model, list[tuple[str, str]]]:
    """Core's EP-neutral passes on a clone of ``model`` (constants folded with the
    session's kernels, dead code dropped): the clone, and the ``(node, op)`` folded."""
    folded = _clone(model)
    nodes = fold_constants(folded, lambda node: evaluate_constant(node, folded, providers, host))
    return folded, nodes


def _clone(model: ir.Model) -> ir.Model:
    """A copy of ``model`` to rewrite (tensors shared), with the model's own metadata: the
    external-data registry that keeps its mappings open lives there."""
    clone = model.clone()
    clone.meta.update(model.meta)
    return clone


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
@dataclass(frozen=True)
class PlanDraft:
    """A plan whose steps know how to make their kernels, none made yet, and the copies
    between devices it inserted (for the partition report)."""

    plan: Plan
    makers: tuple[Callable[[], Kernel] | None, ...]  # per step; None for a step holding one
    copies: tuple[Copy, ...] = ()


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
    graph = graph if graph is not None else loaded.model.graph
    eps = providers.by_id()
    slots: dict[str, int] = {}

    def slot(name: str) -> int:
        if not name:
            return NO_SLOT
        if name not in slots:
            slots[name] = len(slots)
        return slots[name]

    constants: dict[int, np.ndarray | LazyWeight] = {}
    weights = negotiate_weights(graph, loaded.weights, placement, eps, providers.capabilities)
    for name, value in graph.initializers.items():
        if name in weights:  # external data, negotiated per EP (lazy or resident)
            constants[slot(name)] = weights[name]
            continue
        if value.const_value is None:
            raise InvalidModel(f"initializer {name!r} has no data")
        array = constant_array(value.const_value)
        if isinstance(array, np.ndarray):
            array = array.view()
            array.flags.writeable = False
        constants[slot(name)] = array
    input_slots = {name: slot(name) for name in [*value_names(graph.inputs), *implicit]}
    location = {name: "cpu" for name in slots}  # device holding each value
    copy_slots: dict[tuple[str, str], int] = {}
    copies: list[Copy] = []
    steps: list[Step] = []
    makers: list[Callable[[], Kernel] | None] = []
    claims = placement.report.claims
    producers: dict[str, ExecutionProvider] = {}

    def read(name: str, ep: ExecutionProvider) -> int:
        """The slot ``ep`` reads ``name`` from, inserting a copy across devices."""
        if not name:
            return NO_SLOT
        source_device = location.get(name, "cpu")
        if source_device == ep.device_type:
            return slot(name)
        key = (name, ep.device_type)
        if key not in copy_slots:
            copy_slots[key] = slot(f"{name}@{ep.device_type}")
            op = "MemcpyToDevice" if ep.device_type != "cpu" else "MemcpyToHost"
            kernel = CopyKernel(producers.get(name), ep)
            steps.append(
                Step(
                    kernel,
                    [slot(name)],
                    [copy_slots[key]],
                    f"copy {name}",
                    op,
                    ep.id,
                    ep.device_type,
                )
            )
            makers.append(None)
            copies.append(Copy(name, source_device, ep.device_type, ep.id))
        return copy_slots[key]

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
            claim = claims[claim_index]
            make = _claim_maker(claim, ep, graph)
            ins, outs, name, op_type = claim.inputs, claim.outputs, claim.name, "Subgraph"
        else:
            match = placement.matches[i]
            assert match is not None  # a node placed alone has its match
            ins = value_names(node.inputs)
            outer = implicit_inputs(node) if subgraphs_of(node) else []
            make = _node_maker(node, ep, cast("KernelEntry", match.entry), len(ins), outer)
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
    return PlanDraft(draft, tuple(makers), tuple(copies))


def _claim_maker(
    claim: SubgraphClaim, ep: ExecutionProvider, graph: ir.Graph
) -> Callable[[], Kernel]:
    if claim.kernel is not None:
        kernel = claim.kernel
        return lambda: kernel
    return lambda: ep.compile(claim, graph)


def _node_maker(
    node: ir.Node, ep: ExecutionProvider, entry: KernelEntry, regular_inputs: int, outer: list[str]
) -> Callable[[], Kernel]:
    def make() -> Kernel:
        kernel = ep.create_kernel(node, entry)
        return ScopedKernel(kernel, regular_inputs, outer) if outer else kernel

    return make


# -- 7. instantiate --------------------------------------------------------------------------------
def instantiate(draft: PlanDraft) -> Plan:
    """Stage 7: create every kernel and compile every claim; the plan ``run`` walks (a new
    one: the draft keeps its kernel-less steps)."""
    steps = [
        replace(step, kernel=make()) if make is not None else replace(step)
        for step, make in zip(draft.plan.steps, draft.makers)
    ]
    final = replace(draft.plan, steps=steps)
    final.finish()
    return final


def fit_plan(
    plan: Plan,
    fed: Mapping[str, int],
    kept: Collection[str] = frozenset(),
    fetches: Sequence[str] | None = None,
) -> Plan:
    """A new plan from ``plan`` for one kind of run: ``fed`` maps each input already on
    its device to the step of the copy it then skips (fed where that copy would write);
    the outputs in ``kept`` stay on their device; with ``fetches``, only the steps those
    outputs need run."""
    input_slots = dict(plan.input_slots)
    for name, index in fed.items():
        input_slots[name] = plan.steps[index].outputs[0]
    skipped = set(fed.values())
    steps = [copy.copy(s) for i, s in enumerate(plan.steps) if i not in skipped]
    if fetches is not None:
        needed = {plan.output_slots[name] for name in fetches}
        kept_steps = []
        for step in reversed(steps):
            if needed.intersection(step.outputs):
                needed.update(step.inputs)
                kept_steps.append(step)
        steps = kept_steps[::-1]
    hosts = {n: ep for n, ep in plan.output_hosts.items() if n not in kept}
    fitted = Plan(plan.slot_names, plan.constants, input_slots, plan.output_slots, steps, hosts)
    fitted.finish()
    return fitted


# -- the whole pipeline ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Built:
    """Stages 3 to 7 for one selection: a candidate plan, or the session's."""

    host: Host
    selection: Selection
    providers: Providers
    optimization: Optimization
    placement: Placement
    copies: tuple[Copy, ...]
    plan: Plan


def runs_host_blas(plan: Plan, providers: Providers) -> bool:
    """Whether an EP that runs part of ``plan`` computes through numpy's BLAS."""
    running = {step.ep for step in plan.steps}
    return any(ep.uses_host_blas for ep, _ in providers.eps if ep.id in running)


def build(
    loaded: LoadedModel,
    host: Host,
    registry: EpRegistry,
    parallel: HostParallel,
    selection: Selection,
    options: CreateOptions,
) -> Built:
    """Stages 3 to 7 for the selected EPs."""
    compiler = SubgraphCompiler(host)
    providers = create_providers(selection, host, parallel, options, compiler)
    optimization = optimize(loaded, providers, host) if options.optimize else Optimization(loaded)
    optimized = optimization.loaded
    compiler.attach(optimized, providers)
    placement = place(optimized, providers, host, registry)
    if not options.allow_compile:
        check_compile_allowed(placement)
    draft = plan(optimized, providers, placement)
    return Built(
        host, selection, providers, optimization, placement, draft.copies, instantiate(draft)
    )


def partition_report(built: Built, selection: SelectionReport | None) -> PartitionReport:
    """The session's report, assembled once from what the stages returned."""
    optimization, placed = built.optimization, built.placement.report
    return replace(
        placed,
        nodes=list(placed.nodes),
        claims=list(placed.claims),
        refused_claims=list(placed.refused_claims),
        copies=list(built.copies),
        folded=list(optimization.folded),
        fused=list(optimization.fused),
        selection=selection,
    )


@dataclass(frozen=True)
class SessionState:
    """Everything a created session holds."""

    loaded: LoadedModel  # the optimized model
    host: Host
    registry: EpRegistry
    parallel: HostParallel
    selection: Selection
    providers: Providers
    placement: Placement
    plan: Plan
    report: PartitionReport

    @property
    def uses_host_blas(self) -> bool:
        """Whether an EP that runs part of the plan computes through numpy's BLAS."""
        return runs_host_blas(self.plan, self.providers)

    def compiled_partitions(self) -> list[tuple[SubgraphClaim, ExecutionProvider, str, Kernel]]:
        """Each compiled claim with its EP, owning plugin and kernel (what compile saves)."""
        owners = {ep.id: (ep, owner) for ep, owner in self.providers.eps}
        kernels = {s.name: s.kernel for s in self.plan.steps if s.op_type == "Subgraph"}
        return [
            (claim, *owners[claim.ep], kernels[claim.name])
            for claim in self.placement.report.claims
            if claim.name in kernels
        ]


def create(
    source: ModelSource,
    requests: list[tuple[str, dict[str, Any]]] | None,
    options: CreateOptions,
    plugin_manager: NxrtPluginManager,
) -> SessionState:
    """Run every stage (module docstring) and return what the session needs."""
    host = Host(plugin_manager)
    registry = host.build_registry()
    parallel = HostParallel(options.threads)
    loaded = load(source, options)
    if requests is not None and options.optional_providers:
        requests = installed_requests(requests, registry, options.optional_providers)
    chosen: SelectionReport | None = None
    if requests is None and len(registry.providers) > 1:
        built, chosen = choose(source, loaded, host, registry, parallel, options)
        selection = replace(built.selection, policy=options.policy.name, report=chosen)
    else:
        selection = select_providers(registry, host, requests, fallback=options.fallback)
        built = build(loaded, host, registry, parallel, selection, options)
    state = SessionState(
        built.optimization.loaded,
        built.host,
        registry,
        parallel,
        selection,
        built.providers,
        built.placement,
        built.plan,
        partition_report(built, chosen),
    )
    if options.optimized_model_path:
        optimized = state.loaded.model
        if private_ops(optimized):  # fusions only nxrt runs: write the EP-neutral passes' graph
            optimized, _ = fold(loaded.model, state.providers, state.host)
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


class _Trial:
    """A candidate plan as selection measures it: run once, and what fell back."""

    def __init__(self, built: Built, parallel: HostParallel) -> None:
        self.built = built
        self.parallel = parallel
        self.outputs = value_names(built.optimization.loaded.model.graph.outputs)

    def run(self, feeds: dict[str, Any]) -> None:
        plan = self.built.plan
        if runs_host_blas(plan, self.built.providers):
            with self.parallel.run_limits():
                plan.execute(feeds, self.outputs, None)
        else:
            plan.execute(feeds, self.outputs, None)

    def wait_for_compiled(self, timeout: float) -> bool:
        """Whether the plan's EPs finished their background compiles within ``timeout`` s."""
        deadline = time.monotonic() + timeout
        return all(
            ep.wait_for_compiled(max(0.0, deadline - time.monotonic()))
            for ep, _ in self.built.providers.eps
        )

    def hold_compiles(self, timeout: float) -> contextlib.ExitStack[bool | None]:
        """While it is timed: the plan's EPs start no background compile."""
        stack = contextlib.ExitStack()
        deadline = time.monotonic() + timeout
        for ep, _ in self.built.providers.eps:
            stack.enter_context(ep.hold_compiles(max(0.0, deadline - time.monotonic())))
        return stack

    def discard(self) -> None:
        """The candidate lost: its EPs drop the compiles they have not started."""
        for ep, _ in self.built.providers.eps:
            ep.cancel_compiles()

    def leftover(self) -> bool:
        """Whether the plan's first EP left nodes to the fallback."""
        first = self.built.providers.eps[0][0].id
        return first != FALLBACK_EP and any(
            p.ep == FALLBACK_EP for p in self.built.placement.report.nodes
        )


def choose(
    source: ModelSource,
    loaded: LoadedModel,
    host: Host,
    registry: EpRegistry,
    parallel: HostParallel,
    options: CreateOptions,
) -> tuple[Built, SelectionReport]:
    """Stage 2 without ``providers``: the session's policy picks the EPs
    (:func:`nxrt.pipeline.selection.decide`), then stages 3 to 7 run for them.

    The winner measuring built is kept, unless the model maps weights (then it
    is built again); a chosen EP that cannot build the model leaves cpu alone.
    """
    started = time.perf_counter()
    graph = loaded.model.graph
    installed = registry.default_order()

    def identity() -> tuple[str, list[tuple[str, str]]]:
        versions = [(i, plugin_version(host, registry.providers[i].plugin)) for i in installed]
        return sel.model_digest(source), versions

    def trial(ids: list[str]) -> _Trial:
        return _Trial(_build_for(ids, loaded, Host(host.pm), registry, parallel, options), parallel)

    decision = sel.decide(
        options.policy,
        [v for v in graph.inputs if v.name not in graph.initializers],
        options.config,
        start=lambda: ep_infos(registry, host, parallel, options.threads),
        build=trial,
        identity=identity,
        installed=installed,
        threads=parallel.threads,
        fallback=FALLBACK_EP,
        started=started,
    )
    report = decision.report
    if isinstance(decision.built, _Trial) and not loaded.weights:
        winner = decision.built.built
    else:
        try:
            winner = _build_for(report.choice, loaded, host, registry, parallel, options)
        except NxrtError as exc:  # a chosen EP that cannot build this model: cpu alone
            if report.choice == [FALLBACK_EP] or FALLBACK_EP not in registry.providers:
                raise
            note = f"{','.join(report.choice)} failed to build ({exc}); cpu alone"
            report = replace(report, choice=[FALLBACK_EP], note=note)
            winner = _build_for(report.choice, loaded, host, registry, parallel, options)
        report = replace(report, seconds=time.perf_counter() - started)
    winner.host.failures[:0] = [f for f in host.failures if f not in winner.host.failures]
    return winner, report


def _build_for(
    ids: Sequence[str],
    loaded: LoadedModel,
    host: Host,
    registry: EpRegistry,
    parallel: HostParallel,
    options: CreateOptions,
) -> Built:
    """Stages 3 to 7 for the EPs ``ids`` (an EP that fails to start is an error)."""
    selection = select_providers(
        registry, host, [(i, {}) for i in ids if i in registry.providers], fallback=options.fallback
    )
    return build(loaded, host, registry, parallel, selection, options)


def ep_infos(
    registry: EpRegistry, host: Host, parallel: HostParallel, threads: int | None
) -> tuple[list[EpInfo], list[Candidate]]:
    """Every installed EP's device and preference (starting it is what tells them), and a
    skipped candidate for each EP that fails to start (its failure recorded)."""
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
    version, and source folder for an editable install (:func:`~nxrt.pipeline.selection.
    distribution_identity`), so a decision is never shared by code that differs."""
    import re

    from importlib_metadata import PackageNotFoundError, distribution

    info = host.pm.plugin_info.get(plugin)
    if info is None or not info.distribution:
        return "unversioned"
    parts = [sel.distribution_identity(info.distribution)]
    try:
        for requirement in distribution(info.distribution).requires or []:
            name = re.split(r"[ ;<>=!~\[]", requirement, maxsplit=1)[0]
            identity = sel.distribution_identity(name)
            if not identity.endswith("=unversioned"):
                parts.append(identity)
    except PackageNotFoundError:
        pass
    return ";".join(parts)

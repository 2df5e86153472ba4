"""Hook specifications: everything an execution-provider plugin can implement.

Plugins implement these with ``@nxrt.hookimpl``; they are found by that
marker only. The hooks fall in six families, in the order below:

- **registration** — a plugin adds its EPs and their kernel tables;
- **capability advertisement** — what an EP offers (weight paging,
  EPContext support, device type, dtypes);
- **kernel matching and subgraph claims** — which nodes an EP can run, at what
  cost, and which connected sets of nodes it will fuse into one kernel;
- **optimizer passes** — graph rewrites (fusions) an EP contributes;
- **EPContext** — turning a compiled partition into an ``EpContext`` and back;
- **ahead-of-time compiling** — filling an EP's on-disk caches before any
  session needs them (``nxrt warmup``).

Hooks run only while a session is created, never inside ``run``: a pluggy
call costs several microseconds, more than nxrt's whole per-node budget.
``nxrt.host.Host`` is the only caller; it calls each plugin separately, so
one plugin's exception becomes a record naming that plugin (``EpLoadFailed``
at load time, ``EpPanicked`` later) while every other plugin keeps working.
Under ``NXRT_STRICT_PLUGINS=1`` every such failure is raised instead.

Session creation calls the hooks in this order:

1. ``nxrt_register(registry)`` — once per plugin, when a session (or
   ``nxrt providers``) builds the registries from the plugin manager.
2. ``nxrt_ep_capabilities(ep)`` — once per EP the session uses, after the
   EP is instantiated and initialised.
3. ``nxrt_match_kernel(ep, node, opset)`` — already during constant
   folding: for each node whose inputs are all constants, core asks the
   session's host-memory EPs in priority order whether they run it, and
   computes it with the first matching EP's kernel.
4. ``nxrt_optimizer_passes(ep)`` — once, for the session's first EP.
5. ``nxrt_load_context(ep, context)`` — for each ``EPContext`` node of the
   model, on the EP that owns its ``source`` key.
6. For each EP in the session's priority order:

   - ``nxrt_claim_subgraphs(ep, graph, nodes, opsets)`` — once, with the
     nodes no EP ahead of it has taken;
   - ``nxrt_match_kernel(ep, node, opset)`` — for each node still unplaced.

7. ``nxrt_save_context(ep, claim, kernel)`` — only when ``nxrt compile``
   writes a model, once per compiled claim.
8. ``nxrt_warmup(ep, model)`` — never while a session is created: only when
   ``nxrt warmup`` runs, once per EP it warms.

Steps 3 and 4 run only with graph optimizations on (the default). The body
of an If, Loop or Scan goes through step 6 on its own. When the caller gives
no ``providers``, the provider-selection policy may build several candidate
sessions, and so call these hooks once per candidate.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    import onnx_ir as ir

    from nxrt.ep_registry import Registrar
    from nxrt.epcontext import EpContext
    from nxrt.kernel import Kernel, SubgraphClaim
    from nxrt.provider import ExecutionProvider
    from nxrt.registry import KernelMatch
    from nxrt.weight import ExecutionProviderCapabilities

hookspec = pluggy.HookspecMarker("nxrt")

# -------------------------------------------------------------------------------------------------
# registration
# -------------------------------------------------------------------------------------------------


@hookspec
def nxrt_register(registry: Registrar) -> None:
    """Register the plugin's execution providers and their kernel tables.

    Called once per plugin each time the host builds its registries (at every
    session creation and by ``nxrt providers``), so a plugin registered in a
    test takes effect for the next session.

    :param registry: The registrar. Call ``registry.add_provider(id, factory,
        ...)`` for each EP, where ``factory(config)`` returns the
        :class:`~nxrt.provider.ExecutionProvider` (import the backend library
        inside the factory, not at module import), and
        ``registry.add_kernels(id, ops)`` with the EP's
        :class:`~nxrt.registry.OpRegistry`, or with a function that imports and
        returns it: the table then loads when a session first needs it, so that
        listing providers imports none of the plugin's kernel modules.

    :returns: Nothing; additions go through ``registry``, which validates
        them and records which plugin made them.

    Ownership: register only EPs your plugin provides; an EP id that another
    plugin already registered is refused.

    If this hook raises or registers something malformed, the plugin becomes
    an ``EpLoadFailed`` record (shown by ``nxrt providers``), its partial
    registrations are discarded, and every other plugin keeps working
    (raised instead under ``NXRT_STRICT_PLUGINS=1``). Hook wrappers are not
    supported on this hook.

    .. versionadded:: 0.1
    .. versionchanged:: 0.1
       ``add_kernels`` takes a function returning the table.
    """


# -------------------------------------------------------------------------------------------------
# capability advertisement
# -------------------------------------------------------------------------------------------------


@hookspec
def nxrt_ep_capabilities(ep: ExecutionProvider) -> ExecutionProviderCapabilities | None:
    """Advertise what an execution provider offers.

    Called once per EP a session uses, after the EP is instantiated and
    initialised.

    :param ep: The EP instance being asked about.

    :returns: The EP's :class:`~nxrt.weight.ExecutionProviderCapabilities`
        (flags such as ``"nxrt"`` for lazy weight paging, ``"epcontext"``,
        ``"device:cpu"``, ``"dtype:float32"``), or ``None`` for EPs your
        plugin does not provide. An EP nobody answers for gets the stock
        (empty) capabilities.

    Ownership: return ``None`` for EPs your plugin does not provide; an
    answer for another plugin's EP is refused and recorded against your
    plugin.

    If this hook raises or returns another type, the plugin becomes an
    ``EpLoadFailed`` record and the EP is treated as stock (raised instead
    under ``NXRT_STRICT_PLUGINS=1``).

    .. versionadded:: 0.1
    """


# -------------------------------------------------------------------------------------------------
# kernel matching and subgraph claims
# -------------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def nxrt_claim_subgraphs(
    ep: ExecutionProvider, graph: ir.Graph, nodes: list[ir.Node], opsets: dict[str, int]
) -> list[SubgraphClaim] | None:
    """Claim connected sets of nodes that the EP will compile into one kernel each.

    Called once per session and EP, in the session's priority order, before
    that EP's per-node kernel matching.

    :param ep: The EP being asked.
    :param graph: The model's main graph (read-only: do not mutate it).
    :param nodes: The nodes not yet placed on an EP ahead of this one, in
        topological order; claims may contain only these.
    :param opsets: The model's opset per domain (``""`` for the default
        domain); a subgraph of If/Loop has no imports of its own.

    :returns: A list of :class:`~nxrt.kernel.SubgraphClaim`, possibly empty,
        or ``None`` for EPs your plugin does not provide (or that never
        fuse). The host refuses a claim that takes an already placed node or
        that would create a cycle once contracted into one node, and records
        why; refused nodes go through kernel matching as usual. Accepted
        claims are compiled with ``ep.compile(claim, graph)``.

    Stops at the first non-``None`` result.

    Ownership: the host asks only the plugin that registered ``ep``.

    If this hook raises or returns something other than claims, the EP makes
    no claims for this session and the failure is recorded against the
    plugin (``EpPanicked``; raised instead under ``NXRT_STRICT_PLUGINS=1``).

    .. versionadded:: 0.1

    .. versionchanged:: 0.1
        ``opsets`` added.
    """


@hookspec(firstresult=True)
def nxrt_match_kernel(ep: ExecutionProvider, node: ir.Node, opset: int) -> KernelMatch | None:
    """Say whether the EP can run one node, and at what cost.

    Called at session creation for each node × EP in priority order, until an
    EP matches: the first EP whose answer is supported wins the node. Called
    earlier too, during constant folding, for each node whose inputs are all
    constants, on the session's host-memory EPs in priority order: the first
    that matches computes the node's value once, with the kernel it matched.

    :param ep: The EP being asked.
    :param node: The node (read-only), with inferred shapes and dtypes on its
        values where shape inference found them.
    :param opset: The model's opset version for the node's domain.

    :returns: A :class:`~nxrt.registry.KernelMatch`: supported with a
        :class:`~nxrt.kernel.Cost`, or unsupported with a reason that
        ``session.get_partition()`` shows to the user. ``None`` means "not
        my EP"; when the owning plugin answers ``None``, the host answers
        from the kernels the plugin registered with ``add_kernels``.

    Stops at the first non-``None`` result.

    Ownership: the host asks only the plugin that registered ``ep``.

    If this hook raises, or answers supported for an op the EP registered no
    kernel for, the node is treated as unsupported by this EP with the
    exception as the reason, and the failure is recorded against the plugin
    (``EpPanicked``; raised instead under ``NXRT_STRICT_PLUGINS=1``).

    .. versionadded:: 0.1
    """


# -------------------------------------------------------------------------------------------------
# optimizer passes
# -------------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def nxrt_optimizer_passes(ep: ExecutionProvider) -> Sequence[ir.passes.PassBase] | None:
    """Contribute graph rewrites (fusions) that serve this EP's kernels.

    Called once per session, for the session's first EP only, after core's
    EP-neutral passes (constant folding) and before partitioning. The first
    EP is offered every node before any other, so its fusions never take a
    node away from an EP ahead of it; later EPs see the graph it left.

    :param ep: The session's first EP, initialised.

    :returns: ``onnx_ir`` passes (``ir.passes.PassBase``; in-place passes are
        the common case), run in order through ``onnx_ir``'s pass manager,
        each pass's ``requires`` / ``ensures`` checked, then core's graph
        validation; or ``None`` for EPs your plugin does not provide. A pass
        may list what it rewrote in a ``fused`` attribute of ``(node, into)``
        pairs, which the partition report shows.

    Stops at the first non-``None`` result.

    Ownership: the host asks only the plugin that registered ``ep``.

    If this hook or one of its passes raises, the session is created from
    the graph as it was before that EP's passes (nothing half-rewritten) and
    the failure is recorded against the plugin (raised under
    ``NXRT_STRICT_PLUGINS=1``).

    .. versionadded:: 0.1
    """


# -------------------------------------------------------------------------------------------------
# EPContext
# -------------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def nxrt_save_context(
    ep: ExecutionProvider, claim: SubgraphClaim, kernel: Kernel
) -> EpContext | None:
    """Turn a compiled partition into an :class:`~nxrt.epcontext.EpContext`.

    Called only when ``nxrt compile`` (``nxrt.tools.compile.compile_model``) writes
    a model, once per compiled claim, after the session that compiled it was
    created (without graph optimizations, so the written model keeps the
    input's nodes).

    :param ep: The EP that compiled the partition.
    :param claim: The claim, with its boundary ``inputs`` and ``outputs``.
    :param kernel: The kernel ``ep.compile`` returned for it.

    :returns: The context (its ``source`` must be one of the keys the EP
        declared with ``context_sources``), or ``None`` for EPs your plugin
        does not provide or that do not save contexts; the claim's nodes are
        then written as they were, and the compile report says why.

    Stops at the first non-``None`` result.

    Ownership: the host asks only the plugin that registered ``ep``.

    If this hook raises, ``nxrt compile`` fails with that error and writes
    nothing (the output is written atomically, at the end).

    .. versionadded:: 0.1
    """


@hookspec(firstresult=True)
def nxrt_load_context(ep: ExecutionProvider, context: EpContext) -> Kernel | None:
    """Rebuild a compiled partition's kernel from a saved EPContext.

    Called at session creation for each ``EPContext`` node, on the EP whose
    advertised ``context_sources`` contain the node's ``source``; the lookup
    is a dict keyed by source, never a chain of plugins.

    :param ep: The EP that owns the context's source key.
    :param context: The parsed context, its blob already read.

    :returns: A kernel taking the EPContext node's inputs and returning its
        outputs, or ``None`` when your plugin does not provide ``ep`` (the
        host then falls back to ``ep.load_context``, which raises
        ``UnsupportedContext`` unless the EP overrides it).

    Stops at the first non-``None`` result.

    Ownership: the host asks only the plugin that registered ``ep``.

    If this hook raises, session creation fails with that error, since the
    model cannot run without the partition.

    .. versionadded:: 0.1
    """


# -------------------------------------------------------------------------------------------------
# ahead-of-time compiling
# -------------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def nxrt_warmup(ep: ExecutionProvider, model: str | None) -> list[str] | None:
    """Compile, into the EP's on-disk caches, what its sessions would compile when they start.

    Called only by ``nxrt warmup [MODEL]`` (for images and CI), never while a
    session is created: once per EP the command warms (every installed EP, or
    those ``--ep`` names), after the EP is instantiated and initialised.

    :param ep: The EP to warm, initialised, with the threads the command was given
        (``ep.config.threads``; ``None``: the machine's).
    :param model: Path of the model whose kernels to compile, or ``None`` for
        every kernel the EP compiles (at shapes of the EP's own choosing).

    :returns: One line per thing compiled (for the command to print), or ``None``
        for EPs your plugin does not provide or that compile nothing ahead of time.

    Stops at the first non-``None`` result.

    Ownership: the host asks only the plugin that registered ``ep``.

    If this hook raises, ``nxrt warmup`` prints the failure for that EP, goes on
    with the other EPs and exits with status 1.

    .. versionadded:: 0.1
    """


__all__ = [
    "nxrt_claim_subgraphs",
    "nxrt_ep_capabilities",
    "nxrt_load_context",
    "nxrt_match_kernel",
    "nxrt_optimizer_passes",
    "nxrt_register",
    "nxrt_save_context",
    "nxrt_warmup",
]

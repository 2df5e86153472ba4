"""The base of every EP that compiles claimed subgraphs: a subclass is its backend's calls.

A compiling EP (mlx, openvino, legacy_abi, a third-party one) runs no single
node: it claims connected subgraphs, compiles each into one kernel, and may
save a compiled kernel as an EPContext. What surrounds the backend is the same
for all of them and lives here, in :class:`CompilingProvider`:

- :meth:`~CompilingProvider.claim` forms maximal cycle-safe claims from the
  nodes the backend accepts (core's :func:`nxrt.claims.maximal_claims`) and
  keeps the reason for every node it refused;
- :meth:`~CompilingProvider.match` answers kernel matching with that reason,
  so the partition report says why a node fell back;
- :meth:`~CompilingProvider.save_context` and :meth:`~CompilingProvider.load_context`
  wrap the backend's bytes in an EPContext (source key, partition name,
  boundary, backend version, hardware).

Core's builtin hooks answer ``nxrt_claim_subgraphs``, ``nxrt_match_kernel`` and
``nxrt_save_context`` for every ``CompilingProvider`` (and the host falls back to
its ``load_context``), so the EP's plugin only registers it and advertises its
capabilities. A subclass implements :meth:`~CompilingProvider.refusal` and
:meth:`~nxrt.provider.ExecutionProvider.compile`; for EPContext also
:meth:`~CompilingProvider.export`, :meth:`~CompilingProvider.load`,
:attr:`~CompilingProvider.sdk_version` and :attr:`~CompilingProvider.hardware`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nxrt.claims import maximal_claims
from nxrt.epcontext import EpContext
from nxrt.errors import UnsupportedContext
from nxrt.kernel import Kernel, SubgraphClaim
from nxrt.provider import EpConfig, ExecutionProvider
from nxrt.registry import KernelMatch, normalize_domain

if TYPE_CHECKING:
    import onnx_ir as ir

    from nxrt.registry import OpRegistry


@dataclass
class ExportedKernel:
    """A compiled kernel as bytes: what :meth:`CompilingProvider.export` returns."""

    blob: bytes
    #: The values the kernel rebuilt from ``blob`` takes, in order; ``None``: the claim's
    #: inputs (name fewer when weights travel inside the blob).
    inputs: Sequence[str] | None = None
    #: Free text for the EPContext's ``notes``.
    notes: str = ""


class CompilingProvider(ExecutionProvider):
    """An EP that runs claimed subgraphs, each compiled by its backend into one kernel.

    The backend's part, what a subclass implements: :meth:`refusal` (required),
    :meth:`compile` (required), :meth:`boundary_refusals` and :meth:`refusals_for`
    (optional), and for EPContext :meth:`export`, :meth:`load`, :attr:`sdk_version`
    and :attr:`hardware`. The rest is the base's.
    """

    #: The backend's name in messages, e.g. ``"OpenVINO"`` (default: the EP id).
    backend: str = ""

    def __init__(self, config: EpConfig | None = None, ops: OpRegistry | None = None) -> None:
        super().__init__(config, ops)
        self._refusals: dict[int, str] = {}  # by id(node), from the last claiming
        self._opsets: dict[str, int] = {}  # the last graph's with imports (bodies have none)

    # -- the backend's part ---------------------------------------------------------------------
    def refusal(self, node: ir.Node, graph: ir.Graph, opsets: Mapping[str, int]) -> str:
        """Why the backend cannot run ``node`` of ``graph`` ('' when it can).

        :param opsets: The opset per domain (``""`` for ONNX's), from :meth:`opsets_for`.
        """
        raise NotImplementedError(f"EP {self.id!r} claims subgraphs but implements no refusal()")

    def refusals_for(
        self, nodes: Sequence[ir.Node], graph: ir.Graph, opsets: Mapping[str, int]
    ) -> dict[int, str]:
        """The refusal of each offered node the EP will not claim, by ``id(node)``.

        The default asks :meth:`refusal` per node; override it when whether a node
        is worth claiming depends on the others (mlx leaves out constant work
        that only other EPs read).
        """
        return {id(n): reason for n in nodes if (reason := self.refusal(n, graph, opsets))}

    def boundary_refusals(
        self, nodes: Sequence[ir.Node], graph: ir.Graph, opsets: Mapping[str, int]
    ) -> dict[int, str]:
        """Nodes of a candidate claim (by id) that must leave it, and why: values the
        backend cannot exchange across a claim's edge, or a claim it fails to build as a
        whole. The claims are then formed again without them. The default: none."""
        return {}

    @property
    def sdk_version(self) -> str:
        """The backend's version, recorded in each EPContext (``ep_sdk_version``)."""
        return ""

    @property
    def hardware(self) -> str:
        """What a compiled kernel is for, recorded in each EPContext (``hardware_architecture``)."""
        return ""

    def export(self, claim: SubgraphClaim, kernel: Kernel) -> ExportedKernel:
        """A kernel :meth:`compile` made, as bytes :meth:`load` rebuilds it from."""
        raise UnsupportedContext(self.id)

    def load(self, context: EpContext) -> Kernel:
        """The kernel saved in ``context`` (its blob is ``context.ep_cache_context``);
        raise ``InvalidModel`` with advice when it was made for another version or device."""
        raise UnsupportedContext(self.id)

    def unclaimed_reason(self, node: ir.Node, opset: int) -> str:
        """Why a node not refused by the last claiming is in no claim (the host refused
        its claim, or kernel matching asks before any claiming)."""
        return f"{self.backend or self.id} can run it, but no claim of this EP holds it"

    # -- the base's part ------------------------------------------------------------------------
    def opsets_for(
        self, graph: ir.Graph, opsets: Mapping[str, int] | None = None
    ) -> dict[str, int]:
        """The opsets that apply to ``graph``'s nodes: the host's, else the graph's own
        imports, else those last seen (an If/Loop body imports none)."""
        imports = opsets or graph.opset_imports or self._opsets
        self._opsets = {normalize_domain(d): int(v) for d, v in imports.items()}
        return self._opsets

    def claim(
        self, graph: ir.Graph, nodes: Sequence[ir.Node], opsets: Mapping[str, int] | None = None
    ) -> list[SubgraphClaim]:
        """Maximal cycle-safe claims over the offered ``nodes`` the backend accepts."""
        self._require_initialized()
        opsets = self.opsets_for(graph, opsets)
        refused = self.refusals_for(nodes, graph, opsets)
        groups, self._refusals = maximal_claims(
            graph,
            nodes,
            lambda node: refused.get(id(node), ""),
            lambda group: self.boundary_refusals(group, graph, opsets),
        )
        return [SubgraphClaim(self.id, group) for group in groups]

    def match(self, node: ir.Node, opset: int) -> KernelMatch:
        """This EP runs nodes only inside claims: the answer says why a node is in none."""
        reason = self._refusals.get(id(node))
        return KernelMatch.no(reason if reason is not None else self.unclaimed_reason(node, opset))

    def save_context(self, claim: SubgraphClaim, kernel: Kernel) -> EpContext:
        """The compiled claim as an EPContext around the backend's :meth:`export`."""
        exported = self.export(claim, kernel)
        return EpContext(
            source=self.id,
            ep_cache_context=exported.blob,
            partition_name=claim.name,
            inputs=list(claim.inputs if exported.inputs is None else exported.inputs),
            outputs=list(claim.outputs),
            ep_sdk_version=self.sdk_version,
            hardware_architecture=self.hardware,
            notes=exported.notes,
        )

    def load_context(self, context: EpContext) -> Kernel:
        """The kernel of a saved EPContext, rebuilt by the backend's :meth:`load`."""
        self._require_initialized()
        return self.load(context)

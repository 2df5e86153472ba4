"""Core's own hook implementations: defaults that apply to every EP.

Each runs last, so a plugin's own answer wins. Kernel matching answers from
the EP's registered kernel table; a :class:`~nxrt.compiling.CompilingProvider`
gets its claims, its refusal reasons and its saved contexts from the base
class, so its plugin implements none of these hooks (the host loads its
contexts through ``ep.load_context`` when no plugin answers).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nxrt import hookimpl
from nxrt.compiling import CompilingProvider
from nxrt.errors import UnsupportedContext

if TYPE_CHECKING:
    import onnx_ir as ir

    from nxrt.epcontext import EpContext
    from nxrt.kernel import Kernel, SubgraphClaim
    from nxrt.provider import ExecutionProvider
    from nxrt.registry import KernelMatch


@hookimpl(trylast=True)
def nxrt_claim_subgraphs(
    ep: ExecutionProvider, graph: ir.Graph, nodes: list[ir.Node], opsets: dict[str, int]
) -> list[SubgraphClaim] | None:
    """A compiling EP's claims: maximal, cycle-safe, over the nodes its backend accepts."""
    return ep.claim(graph, nodes, opsets) if isinstance(ep, CompilingProvider) else None


@hookimpl(trylast=True)
def nxrt_match_kernel(ep: ExecutionProvider, node: ir.Node, opset: int) -> KernelMatch | None:
    """Answer from the EP's registered kernel table when its plugin does not; a compiling
    EP says why the node is in none of its claims."""
    if isinstance(ep, CompilingProvider):
        return ep.match(node, opset)
    return ep.ops.match(node, opset) if ep.ops is not None else None


@hookimpl(trylast=True)
def nxrt_save_context(
    ep: ExecutionProvider, claim: SubgraphClaim, kernel: Kernel
) -> EpContext | None:
    """A compiling EP's partition as an EPContext; ``None`` when its backend saves none."""
    if not isinstance(ep, CompilingProvider):
        return None
    try:
        return ep.save_context(claim, kernel)
    except UnsupportedContext:
        return None

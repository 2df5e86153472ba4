"""Core's own hook implementations: defaults that apply to every EP."""

from __future__ import annotations

from typing import TYPE_CHECKING

from nxrt import hookimpl

if TYPE_CHECKING:
    import onnx_ir as ir

    from nxrt.kernel import KernelMatch
    from nxrt.provider import ExecutionProvider


@hookimpl(trylast=True)
def nxrt_match_kernel(ep: ExecutionProvider, node: ir.Node, opset: int) -> KernelMatch | None:
    """Answer from the EP's registered kernel table when its plugin does not."""
    return ep.ops.match(node, opset) if ep.ops is not None else None

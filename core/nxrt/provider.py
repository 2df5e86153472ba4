"""The execution provider: configuration, lifecycle, kernels and device copies.

A plugin registers a factory for each EP it provides; the host instantiates
the EP (importing its backend library only then) when a session asks for it.
The base class is a complete host-memory EP: subclasses for other devices
override the buffer and copy methods, and EPs that fuse override ``compile``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from nxrt.errors import NotInitialized, UnsupportedContext
from nxrt.kernel import FunctionKernel, Kernel, SubgraphClaim, attribute_values
from nxrt.memory import Workspace
from nxrt.registry import OUTPUT_COUNT

if TYPE_CHECKING:
    import onnx_ir as ir

    from nxrt.epcontext import EpContext
    from nxrt.host_parallel import HostParallel
    from nxrt.moe.residency import ExpertResidencyManager
    from nxrt.registry import KernelEntry, OpRegistry
    from nxrt.subgraph import Subgraph

#: An EP's identifier, e.g. ``"cpu"``.
EpId = str


@dataclass
class EpConfig:
    """Per-session settings of one EP (ONNX Runtime's provider options)."""

    device_id: int = 0
    options: dict[str, Any] = field(default_factory=dict)
    memory_limit: int | None = None
    threads: int | None = None
    #: The session's config entries (``SessionOptions.add_session_config_entry``), for
    #: EP settings named as entries, such as the cpu EP's ``nxrt.cpu.compile``.
    session_config: dict[str, str] = field(default_factory=dict)


class ExecutionProvider:
    """Base class of every EP; a subclass sets ``id`` and ``device_type``.

    What the session gives the EP, in one :meth:`bind` before ``initialize``:
    ``id``, ``parallel`` (its thread pool), ``ops`` (the kernel table the
    plugin registered, when the EP has none of its own) and
    ``subgraph_compiler`` (for If/Loop/Scan bodies); nothing writes to the EP
    after that. What kernels may use for the EP's lifetime: ``workspace``
    (scratch buffers reused across runs) and ``expert_residency`` (the expert
    pager of ``pkg.nxrt::BlockQuantizedMoE``, made by the first such kernel).
    """

    id: EpId = ""
    device_type: str = "cpu"
    #: Whether kernels compute through the process's BLAS (numpy's), whose thread
    #: count the session then sets per run; an EP with its own thread pool says no.
    uses_host_blas: bool = True

    def __init__(self, config: EpConfig | None = None, ops: OpRegistry | None = None) -> None:
        self.config = config or EpConfig()
        self.ops = ops
        #: The session's thread pool, lent to kernels for intra-op work (given by ``bind``).
        self.parallel: HostParallel | None = None
        #: Turns a graph attribute into a callable Subgraph (given by ``bind``).
        self.subgraph_compiler: Callable[[ir.Graph], Subgraph] | None = None
        #: Scratch buffers kernels borrow for one call and give back (reused across runs).
        self.workspace = Workspace()
        #: Pages experts of BlockQuantizedMoE nodes in under a byte budget (one per EP).
        self.expert_residency: ExpertResidencyManager | None = None
        self._initialized = False

    # -- lifecycle ----------------------------------------------------------------------------
    def bind(
        self,
        id: EpId,
        *,
        parallel: HostParallel | None = None,
        ops: OpRegistry | None = None,
        subgraph_compiler: Callable[[ir.Graph], Subgraph] | None = None,
    ) -> None:
        """Receive what the session owns, once, after the factory and before ``initialize``:
        the ``id`` the EP was registered under, the session's thread pool, the kernel table
        (the EP's own, else the one its plugin registered) and the compiler of graph
        attributes. The factory only knows the ``EpConfig``; these are the session's."""
        self.id = id
        self.parallel = parallel
        self.ops = ops
        self.subgraph_compiler = subgraph_compiler

    def initialize(self) -> None:
        """Acquire the device; called once by the host before any other method."""
        self._initialized = True

    @property
    def initialized(self) -> bool:
        return self._initialized

    def _require_initialized(self) -> None:
        if not self._initialized:
            raise NotInitialized(self.id)

    # -- kernels ------------------------------------------------------------------------------
    def create_kernel(self, node: ir.Node, entry: KernelEntry) -> Kernel:
        """Build the kernel for ``node`` from its registry entry (attributes bound once).

        An entry registered with a ``factory`` builds its own kernel from the EP
        and the node (kernels that plan per shape or share EP state).
        """
        self._require_initialized()
        if entry.factory is not None:
            return entry.factory(self, node)
        attrs = self.kernel_attributes(node, entry)
        return FunctionKernel(entry.fn, attrs, view_output=entry.view_output)

    def kernel_attributes(self, node: ir.Node, entry: KernelEntry) -> dict[str, Any]:
        """The keywords a kernel is bound with: the node's attributes as Python values,
        graph attributes compiled to Subgraphs, and the output count when it asks for it."""
        attrs = attribute_values(node, self.subgraph_compiler)
        if entry.takes_output_count:
            attrs[OUTPUT_COUNT] = len(node.outputs)
        return attrs

    def wait_for_compiled(self, timeout: float | None = None) -> bool:
        """Block until the kernels this EP is still compiling in the background (its
        tiered kernels) are ready, so that runs are bit-identical from then on; returns
        False when ``timeout`` seconds ran out first. The default: nothing is pending."""
        return True

    def cancel_compiles(self) -> None:
        """Drop the background compiles this EP has not started: its session was
        discarded (a candidate selection did not choose). The default: none are pending."""

    def hold_compiles(
        self, timeout: float | None = None
    ) -> contextlib.AbstractContextManager[None]:
        """While selection times candidates: start no new background compile (a build in
        progress is waited for, at most ``timeout`` seconds), so that no candidate's time
        holds another's compiling. The default: nothing compiles in the background."""
        return contextlib.nullcontext()

    def compile(self, claim: SubgraphClaim, graph: ir.Graph) -> Kernel:
        """Compile a claimed subgraph into one kernel; EPs that claim must override it."""
        raise NotImplementedError(f"EP {self.id!r} made a claim but does not implement compile()")

    def save_context(self, claim: SubgraphClaim, kernel: Kernel) -> EpContext:
        """Turn a compiled partition into an EPContext (EPs advertising ``"epcontext"``)."""
        raise UnsupportedContext(self.id)

    def load_context(self, context: EpContext) -> Kernel:
        """Rebuild a compiled partition from a saved EPContext."""
        raise UnsupportedContext(self.id)

    # -- memory -------------------------------------------------------------------------------
    def copy_from_host(self, array: np.ndarray) -> Any:
        """Move a host array to this device (identity for host EPs)."""
        return array

    def copy_to_host(self, value: Any) -> np.ndarray:
        """Bring a device value back to a numpy array (identity for host EPs)."""
        return np.asarray(value)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} id={self.id!r} device={self.device_type!r}>"

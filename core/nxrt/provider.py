"""The execution provider: configuration, lifecycle, kernels and device copies.

A plugin registers a factory for each EP it provides; the host instantiates
the EP (importing its backend library only then) when a session asks for it.
The base class is a complete host-memory EP: subclasses for other devices
override the buffer and copy methods, and EPs that fuse override ``compile``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from nxrt.errors import NotInitialized, UnsupportedContext
from nxrt.kernel import FunctionKernel, Kernel, SubgraphClaim, attribute_values
from nxrt.registry import OUTPUT_COUNT

if TYPE_CHECKING:
    import onnx_ir as ir

    from nxrt.epcontext import EpContext
    from nxrt.host_parallel import HostParallel
    from nxrt.registry import KernelEntry, OpRegistry

#: An EP's identifier, e.g. ``"cpu"``.
EpId = str


@dataclass
class EpConfig:
    """Per-session settings of one EP (ONNX Runtime's provider options)."""

    device_id: int = 0
    options: dict[str, Any] = field(default_factory=dict)
    memory_limit: int | None = None
    threads: int | None = None


class Fence:
    """Signals completion of device work; host EPs complete synchronously."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def signal(self) -> None:
        self._event.set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._event.wait(timeout)

    @property
    def done(self) -> bool:
        return self._event.is_set()


class ExecutionProvider:
    """Base class of every EP; a subclass sets ``id`` and ``device_type``."""

    id: EpId = ""
    device_type: str = "cpu"
    #: Whether kernels compute through the process's BLAS (numpy's), whose thread
    #: count the session then sets per run; an EP with its own thread pool says no.
    uses_host_blas: bool = True

    def __init__(self, config: EpConfig | None = None, ops: OpRegistry | None = None) -> None:
        self.config = config or EpConfig()
        self.ops = ops
        #: The session's thread pool, lent to kernels for intra-op work (set by the session).
        self.parallel: HostParallel | None = None
        #: Turns a graph attribute into a callable Subgraph (set by the session).
        self.subgraph_compiler: Callable[[ir.Graph], Any] | None = None
        self._initialized = False

    # -- lifecycle ----------------------------------------------------------------------------
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
        """Build the kernel for ``node`` from its registry entry (attributes bound once)."""
        self._require_initialized()
        attrs = self.kernel_attributes(node, entry)
        return FunctionKernel(entry.fn, attrs, view_output=entry.view_output)

    def kernel_attributes(self, node: ir.Node, entry: KernelEntry) -> dict[str, Any]:
        """The keywords a kernel is bound with: the node's attributes as Python values,
        graph attributes compiled to Subgraphs, and the output count when it asks for it."""
        attrs = attribute_values(node, self.subgraph_compiler)
        if entry.takes_output_count:
            attrs[OUTPUT_COUNT] = len(node.outputs)
        return attrs

    def compile(self, claim: SubgraphClaim, graph: ir.Graph) -> Kernel:
        """Compile a claimed subgraph into one kernel; EPs that claim must override it."""
        raise NotImplementedError(f"EP {self.id!r} made a claim but does not implement compile()")

    def load_context(self, context: EpContext) -> Kernel:
        """Rebuild a compiled partition from a saved EPContext."""
        raise UnsupportedContext(self.id)

    # -- memory -------------------------------------------------------------------------------
    def allocate(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        """A device buffer for a tensor; host memory for the base class."""
        self._require_initialized()
        return np.empty(shape, dtype)

    def copy_from_host(self, array: np.ndarray) -> Any:
        """Move a host array to this device (identity for host EPs)."""
        return array

    def copy_to_host(self, value: Any) -> np.ndarray:
        """Bring a device value back to a numpy array (identity for host EPs)."""
        return np.asarray(value)

    def fence(self) -> Fence:
        """A fence signalled once queued work is done; immediate for host EPs."""
        fence = Fence()
        fence.signal()
        return fence

    def __repr__(self) -> str:
        return f"<{type(self).__name__} id={self.id!r} device={self.device_type!r}>"

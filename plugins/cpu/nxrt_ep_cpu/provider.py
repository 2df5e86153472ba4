"""The cpu execution provider: host memory, numpy kernels, loops compiled in the background.

Options (provider options; ``nxrt.cpu.compile`` may also be a session config entry):
``enable_cpu_mem_arena`` (ONNX Runtime's), ``nxrt.cpu.compile`` (``background`` or
``wait``, see :mod:`~nxrt_ep_cpu.compiling`), and the expert-paging options of
``pkg.nxrt::BlockQuantizedMoE``.
"""

from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING

from nxrt.provider import EpConfig, ExecutionProvider
from nxrt_ep_cpu.compiling import compiles_of, hold_compiles
from nxrt_ep_cpu.kernels import CpuKernel
from nxrt_ep_cpu.ops import CPU_OPS

if TYPE_CHECKING:
    import onnx_ir as ir

    from nxrt.kernel import Kernel
    from nxrt.registry import KernelEntry


class CpuExecutionProvider(ExecutionProvider):
    """Runs each node with its numpy kernel from :data:`CPU_OPS`."""

    id = "cpu"
    device_type = "cpu"

    def __init__(self, config: EpConfig | None = None) -> None:
        super().__init__(config, CPU_OPS)

    def initialize(self) -> None:
        super().initialize()
        compiles_of(self)  # reads nxrt.cpu.compile: a wrong value fails here, not later
        if str(self.config.options.get(ARENA_OPTION, "1")) not in ("0", "false", "False"):
            keep_freed_memory()

    def wait_for_compiled(self, timeout: float | None = None) -> bool:
        """Block until this EP's kernels compiling in the background are built
        (:mod:`~nxrt_ep_cpu.compiling`); False when ``timeout`` seconds ran out first."""
        return compiles_of(self).wait(timeout)

    def cancel_compiles(self) -> None:
        """Drop this EP's background compiles not yet started (its session was discarded)."""
        compiles_of(self).cancel()

    def hold_compiles(
        self, timeout: float | None = None
    ) -> contextlib.AbstractContextManager[None]:
        """Hold the process's compiling thread while selection times candidates (it is
        shared by every cpu EP: a compile slows whatever else runs)."""
        return hold_compiles(timeout)

    def create_kernel(self, node: ir.Node, entry: KernelEntry) -> Kernel:
        """The base class's kernel, as a :class:`CpuKernel` where it binds a function,
        so that numpy's errors become ``KernelFailed``."""
        if entry.factory is not None:
            return super().create_kernel(node, entry)
        self._require_initialized()
        attrs = self.kernel_attributes(node, entry)
        return CpuKernel(entry.fn, attrs, view_output=entry.view_output)


#: Provider option (ONNX Runtime's name): "0" leaves the C allocator's settings alone.
ARENA_OPTION = "enable_cpu_mem_arena"
#: Allocations above this are mmap-ed (and unmapped on free) by glibc; numpy's temporaries
#: stay below it and come from the heap.
_MMAP_THRESHOLD = 32 << 20
#: Free memory at the top of a heap glibc keeps instead of returning it to the system.
_TRIM_THRESHOLD = 512 << 20


@functools.cache
def keep_freed_memory() -> bool:
    """Make glibc keep freed memory for reuse, as ONNX Runtime's CPU arena does.

    By default glibc unmaps large blocks on free and trims the heap, so every
    run pays page faults again for the same activations and temporaries
    (measured: 1,500 faults per shufflenet run, 5,400 per vgg19 run, a few ms
    each time; 12 with this setting). The setting is process-wide; the
    process keeps its peak heap instead of shrinking after a run. Returns
    whether it was applied (glibc only).
    """
    import ctypes
    import ctypes.util
    import platform

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        return bool(
            libc.mallopt(m_mmap_threshold, _MMAP_THRESHOLD)
            and libc.mallopt(m_trim_threshold, _TRIM_THRESHOLD)
        )
    except (OSError, AttributeError):
        return False

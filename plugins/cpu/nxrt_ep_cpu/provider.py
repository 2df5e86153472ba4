"""The cpu execution provider: host memory, numpy kernels."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from nxrt.errors import KernelFailed, NxrtError
from nxrt.kernel import FunctionKernel, Kernel
from nxrt.provider import EpConfig, ExecutionProvider

if TYPE_CHECKING:
    import onnx_ir as ir

    from nxrt.registry import KernelEntry


class CpuKernel(FunctionKernel):
    """A numpy kernel; numpy's own errors (bad shapes at run time) become KernelFailed."""

    def compute(self, inputs: Sequence[Any]) -> tuple[Any, ...]:
        try:
            return super().compute(inputs)
        except NxrtError:
            raise
        except (ValueError, IndexError, TypeError, ArithmeticError) as exc:
            raise KernelFailed(f"{type(exc).__name__}: {exc}") from exc
        except MemoryError as exc:
            raise KernelFailed(f"not enough memory: {exc}; check the input sizes") from exc


class CpuExecutionProvider(ExecutionProvider):
    """Runs each node with its numpy kernel from :data:`CPU_OPS`."""

    id = "cpu"
    device_type = "cpu"

    def __init__(self, config: EpConfig | None = None) -> None:
        from nxrt_ep_cpu.ops import CPU_OPS

        super().__init__(config, CPU_OPS)

    def create_kernel(self, node: ir.Node, entry: KernelEntry) -> Kernel:
        self._require_initialized()
        factory = getattr(entry.fn, "kernel_factory", None)  # kernels that need the EP
        if factory is not None:
            return factory(self, node)
        attrs = self.kernel_attributes(node, entry)
        return CpuKernel(entry.fn, attrs, view_output=entry.view_output)

"""The mlx execution provider: compiles each claimed subgraph into one MLX function.

Options (``providers=[("mlx", {...})]``):

- ``device``: ``"cpu"`` or ``"gpu"``; default: the GPU when MLX has one
  (Metal, CUDA), else the CPU.
- ``memory_limit``: bytes, passed to ``mx.set_memory_limit`` (as is
  ``EpConfig.memory_limit`` when set).
- ``compile``: ``False`` runs claims eagerly instead of through ``mx.compile``
  (on the CPU, MLX builds fused kernels with the system C++ compiler the first
  time it meets them, a cost a short-lived process may not want).

On the CPU the EP shares host memory with numpy, so its ``device_type`` is
``"cpu"`` and the session inserts no copies; on a GPU it is ``"gpu"`` and
values crossing to other EPs are copied, as the partition report shows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from nxrt.compiling import CompilingProvider, ExportedKernel
from nxrt.errors import InvalidModel
from nxrt.provider import EpConfig
from nxrt_ep_mlx import _claims
from nxrt_ep_mlx._backend import blas_info, load_mlx
from nxrt_ep_mlx._graph import node_opset

if TYPE_CHECKING:
    import onnx_ir as ir

    from nxrt.epcontext import EpContext
    from nxrt.kernel import Kernel, SubgraphClaim

DEVICES = ("cpu", "gpu")


class MlxExecutionProvider(CompilingProvider):
    """Claims subgraphs of supported ops and runs each as one ``mx.compile``d function.

    Its EPContext ``source`` key is its id, ``mlx``.
    """

    id = "mlx"
    backend = "MLX"

    def __init__(self, config: EpConfig | None = None) -> None:
        from nxrt_ep_mlx.ops import MLX_OPS

        super().__init__(config, MLX_OPS)
        #: Which BLAS MLX's CPU matrix products run on, its kernel, and why another was not.
        self.blas_info = blas_info()
        #: Its name: "openblas", "reference", ...
        self.blas = self.blas_info.name
        self.mx = load_mlx()
        mx = self.mx
        options = self.config.options
        has_gpu = bool(mx.is_available(mx.gpu))
        wanted = str(options.get("device", "gpu" if has_gpu else "cpu")).lower()
        if wanted not in DEVICES:
            raise ValueError(f"mlx device must be one of {DEVICES}, got {wanted!r}")
        if wanted == "gpu" and not has_gpu:
            raise ValueError(
                "mlx has no GPU on this machine (this MLX build runs on the CPU); "
                "use providers=[('mlx', {'device': 'cpu'})]"
            )
        self.device = mx.gpu if wanted == "gpu" else mx.cpu
        self.device_type = wanted
        self.use_compile = str(options.get("compile", True)).lower() not in ("0", "false", "no")
        limit = options.get("memory_limit", self.config.memory_limit)
        if limit:
            mx.set_memory_limit(int(limit))

    # -- claims -------------------------------------------------------------------------------
    def refusal(self, node: ir.Node, graph: ir.Graph, opsets: Mapping[str, int]) -> str:
        return _claims.refusal(node, node_opset(node, opsets))

    def refusals_for(
        self, nodes: Sequence[ir.Node], graph: ir.Graph, opsets: Mapping[str, int]
    ) -> dict[int, str]:
        """Also leaves out constant work that only other EPs read (``_claims.left_out``)."""
        refusals = super().refusals_for(nodes, graph, opsets)
        refusals.update((id(node), _claims.LEFT_OUT) for node in _claims.left_out(nodes, refusals))
        return refusals

    def unclaimed_reason(self, node: ir.Node, opset: int) -> str:
        """The node's own refusal, if it has one: checking a node costs little here."""
        return _claims.refusal(node, opset) or _claims.LEFT_OUT

    # -- kernels ------------------------------------------------------------------------------
    def compile(self, claim: SubgraphClaim, graph: ir.Graph) -> Kernel:
        """Translate the claim's nodes to MLX, fold constants, wrap the rest in ``mx.compile``."""
        from nxrt_ep_mlx._compiler import MlxKernel, Program

        self._require_initialized()
        program = Program.build(claim, self.opsets_for(graph), self.device)
        return MlxKernel(
            program, self.device, to_host=self.device_type == "cpu", compiled=self.use_compile
        )

    # -- EPContext ----------------------------------------------------------------------------
    @property
    def sdk_version(self) -> str:
        return str(self.mx.__version__)

    @property
    def hardware(self) -> str:
        return self.device_type

    def export(self, claim: SubgraphClaim, kernel: Kernel) -> ExportedKernel:
        """The ``mx.export_function`` blob, constants inside. Its inputs are the claim's
        non-constant inputs: weights travel in the blob."""
        from nxrt_ep_mlx._compiler import MlxKernel

        if not isinstance(kernel, MlxKernel):
            raise TypeError(f"not a compiled mlx claim: {type(kernel).__name__}")
        program = kernel.program
        return ExportedKernel(
            kernel.export(),
            inputs=[program.inputs[i] for i in program.dynamic_inputs],
            notes=kernel.variant_reason,
        )

    def load(self, context: EpContext) -> Kernel:
        """A kernel from a saved blob; one made by another MLX version or device is refused."""
        from nxrt_ep_mlx._compiler import ImportedKernel

        if context.ep_sdk_version and context.ep_sdk_version != self.sdk_version:
            raise InvalidModel(
                f"EPContext {context.partition_name!r} was compiled by MLX "
                f"{context.ep_sdk_version}, this is MLX {self.sdk_version}; "
                "recompile the model with `nxrt compile`"
            )
        hardware = context.hardware_architecture
        if hardware and hardware != self.device_type:
            raise InvalidModel(
                f"EPContext {context.partition_name!r} was compiled for the mlx {hardware} "
                f"device, this EP runs on {self.device_type}; recompile the model or pass "
                f"providers=[('mlx', {{'device': {hardware!r}}})]"
            )
        return ImportedKernel(
            context.ep_cache_context, self.device, to_host=self.device_type == "cpu"
        )

    # -- memory -------------------------------------------------------------------------------
    def copy_from_host(self, array: np.ndarray) -> Any:
        """On a GPU, an ``mx.array`` (MLX copies numpy data in); on the CPU, the array itself."""
        if self.device_type == "cpu":
            return array
        return self.mx.array(array)

    def copy_to_host(self, value: Any) -> np.ndarray:
        from nxrt_ep_mlx._convert import to_numpy

        if isinstance(value, self.mx.array):
            self.mx.eval(value)
            return to_numpy(value)
        return np.asarray(value)

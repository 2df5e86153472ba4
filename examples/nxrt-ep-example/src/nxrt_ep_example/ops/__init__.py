"""The example EP's kernels; importing the family modules fills the table."""

from nxrt.registry import OpRegistry

EXAMPLE_OPS = OpRegistry("example")
op = EXAMPLE_OPS.op

from nxrt_ep_example.ops import activation  # noqa: E402, F401  (registers its kernels)

__all__ = ["EXAMPLE_OPS", "op"]

"""Kernels of the cpu EP, one module per op family.

Importing this package fills :data:`CPU_OPS`; the plugin hands it to the host.
"""

from nxrt_ep_cpu.ops import (  # noqa: F401  (imported for their registrations)
    conv,
    elementwise,
    generator,
    nn,
    pool,
    shape,
)
from nxrt_ep_cpu.ops._registry import CPU_OPS

__all__ = ["CPU_OPS"]

"""Translators of the mlx EP, one module per op family.

Importing this package fills :data:`MLX_OPS` without importing MLX: the
translators reach ``mlx.core`` through a lazy stand-in, when a claim is
compiled.
"""

from nxrt_ep_mlx.ops import (  # noqa: F401  (imported for their registrations)
    elementwise,
    nn,
    reduce,
    shape,
)
from nxrt_ep_mlx.ops._registry import MLX_OPS

__all__ = ["MLX_OPS"]

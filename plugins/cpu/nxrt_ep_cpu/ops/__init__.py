"""Kernels of the cpu EP, one module per op family.

Importing this package fills :data:`CPU_OPS`; the plugin hands it to the host.
"""

from nxrt_ep_cpu.ops import (  # noqa: F401  (imported for their registrations)
    attention,
    cast,
    control_flow,
    conv,
    detection,
    elementwise,
    generator,
    image,
    indexing,
    logical,
    loss,
    math,
    ml,
    ml_contrib,
    ml_features,
    ml_linear,
    ml_maps,
    ml_trees,
    moe,
    nn,
    normalization,
    pool,
    quant,
    random,
    reduce,
    resize,
    rnn,
    sequence,
    shape,
    signal,
    string,
    tensor,
    tokenizer,
    training,
)
from nxrt_ep_cpu.ops._registry import CPU_OPS

__all__ = ["CPU_OPS"]

"""Attention and the transformer helpers (RotaryEmbedding, SwiGLU ...)."""

from __future__ import annotations

import numpy as np  # noqa: F401

from nxrt_ep_cpu.ops._registry import op  # noqa: F401

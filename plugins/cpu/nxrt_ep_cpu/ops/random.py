"""Random number kernels (seeded when a seed attribute is given)."""

from __future__ import annotations

import numpy as np  # noqa: F401

from nxrt_ep_cpu.ops._registry import op  # noqa: F401

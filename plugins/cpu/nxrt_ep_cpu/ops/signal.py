"""Signal kernels: DFT, STFT, window functions, MelWeightMatrix."""

from __future__ import annotations

import numpy as np  # noqa: F401

from nxrt_ep_cpu.ops._registry import op  # noqa: F401

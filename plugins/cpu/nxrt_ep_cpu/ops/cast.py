"""Cast, CastLike and BitCast across every ONNX type (float8 and int4 through ml_dtypes)."""

from __future__ import annotations

import numpy as np  # noqa: F401

from nxrt_ep_cpu.ops._registry import op  # noqa: F401

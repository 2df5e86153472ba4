"""The instruction set the cpu EP's compiled loops are built for.

``make test-avx2`` reruns the kernel tests with ``NUMBA_CPU_NAME=haswell`` and an empty
``NUMBA_CPU_FEATURES``: the loops must then be AVX2 code (no 512-bit registers), so that an
AVX-512 machine runs, and tests, what an AVX2-only CPU runs. (Natively, LLVM itself keeps
auto-vectorized loops at 256 bits on most AVX-512 CPUs; the explicit 16-lane tiles use 512.)
"""

from __future__ import annotations

import os

import numba
import numpy as np
import pytest

from nxrt_ep_cpu.jit import njit


def _scale(x, y, a):  # pragma: no cover - compiled by numba
    for i in range(x.size):
        y[i] = x[i] * a + y[i]


def _assembly() -> str:
    kernel = njit(cache=False)(_scale)
    x = np.ones(1024, np.float32)
    kernel(x, x.copy(), np.float32(2.0))
    return "\n".join(kernel.inspect_asm().values())


@pytest.mark.skipif(
    os.environ.get("NUMBA_CPU_NAME") != "haswell", reason="runs under make test-avx2"
)
def test_a_forced_avx2_target_compiles_no_avx512_code():
    assert numba.config.CPU_NAME == "haswell"
    code = _assembly()
    assert "ymm" in code, "the loop is vectorized for AVX2"
    assert "zmm" not in code

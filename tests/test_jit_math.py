"""The cpu EP's numba foundation: vectorizable float32 math, the disk cache, lazy import."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import scipy.special

pytest.importorskip("numba")

from nxrt_ep_cpu.jit import mathf, njit  # noqa: E402


def _apply(function, cache: bool = True):
    @njit(cache=cache)
    def apply(x, y):  # pragma: no cover - compiled by numba
        for i in range(x.size):
            y[i] = function(x[i])

    return apply


SQRT_2_OVER_PI = np.sqrt(2 / np.pi)


def _exact(name: str, x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return {
            "exp": lambda: np.exp(x),
            "sigmoid": lambda: scipy.special.expit(x),
            "tanh": lambda: np.tanh(x),
            "erf": lambda: scipy.special.erf(x),
            "gelu": lambda: 0.5 * x * (1 + scipy.special.erf(x / np.sqrt(2))),
            "gelu_tanh": lambda: 0.5 * x * (1 + np.tanh(SQRT_2_OVER_PI * (x + 0.044715 * x**3))),
        }[name]()


#: Largest error in float32 ulps of the exact result (normal results only), and in absolute
#: terms: erf's rational form and GELU's ``1 + erf`` near -1 lose relative precision where
#: the value is tiny, as every float32 implementation of that formula does.
BOUNDS = {
    "exp": (2, None),
    "sigmoid": (4, None),
    "tanh": (3, None),
    "erf": (None, 5e-7),
    "gelu": (None, 2e-6),
    "gelu_tanh": (None, 1e-6),
}
SPECIAL = np.array(
    [np.nan, np.inf, -np.inf, 0.0, -0.0, 88.72, 88.73, -87.33, -87.34, -103.0, 1e-30, -1e-30, 4.0],
    np.float32,
)


@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_float32_math_is_accurate_over_the_whole_range(name):
    rng = np.random.default_rng(0)
    x = np.concatenate(
        [rng.uniform(-100, 100, 200_000), rng.uniform(-6, 6, 200_000), SPECIAL]
    ).astype(np.float32)
    y = np.empty_like(x)
    _apply(getattr(mathf, name))(x, y)
    exact = _exact(name, x.astype(np.float64))
    with np.errstate(all="ignore"):
        rounded = exact.astype(np.float32)
    finite = np.isfinite(rounded)
    np.testing.assert_array_equal(y[~finite], rounded[~finite])  # NaN stays NaN, limits at inf
    max_ulps, max_abs = BOUNDS[name]
    normal = finite & (np.abs(rounded) >= np.finfo(np.float32).tiny)
    if max_ulps is not None:
        ulps = np.abs(y[normal] - exact[normal]) / np.spacing(np.abs(rounded[normal]))
        assert ulps.max() <= max_ulps, f"{ulps.max():.1f} ulps at x={x[normal][ulps.argmax()]}"
    if max_abs is not None:
        assert np.abs(y[finite] - exact[finite]).max() <= max_abs
    assert np.all(np.abs(y[finite & ~normal]) <= np.finfo(np.float32).tiny)  # underflow to ~0


def test_the_loops_vectorize():
    """A loop over ``mathf.sigmoid`` compiles to packed AVX/SSE arithmetic, not a libm call."""
    kernel = _apply(mathf.sigmoid, cache=False)  # numba cannot inspect cached code
    x = np.zeros(64, np.float32)
    kernel(x, np.empty_like(x))
    assembly = next(iter(kernel.inspect_asm().values()))
    assert "expf" not in assembly
    packed = [line for line in assembly.splitlines() if "ps\t" in line and "mm" in line]
    assert any("mul" in line or "fmadd" in line for line in packed), "no packed multiply"


def test_numba_is_imported_by_kernels_only(tmp_path):
    """``import nxrt``, the cpu plugin's registration and ``nxrt providers`` never load numba;
    the JIT cache defaults to the user's cache folder, never beside the installed source,
    and numba's own setting (other libraries' caches) is left alone."""
    code = (
        "import sys, nxrt, nxrt_ep_cpu.plugin, nxrt_ep_cpu.ops\n"
        "from nxrt.tools.cli import main\n"
        "try:\n    main(['providers'])\nexcept SystemExit:\n    pass\n"
        "assert 'numba' not in sys.modules, 'numba imported'\n"
        "import numba, platformdirs\n"
        "from nxrt_ep_cpu.compiling import cache_folder\n"
        "from nxrt_ep_cpu.jit import pool\n"
        "assert cache_folder().startswith(platformdirs.user_cache_dir('nxrt'))\n"
        "assert pool.max_pool2d.stats.cache_path.startswith(cache_folder())\n"
        "assert not numba.config.CACHE_DIR\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["XDG_CACHE_HOME"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]

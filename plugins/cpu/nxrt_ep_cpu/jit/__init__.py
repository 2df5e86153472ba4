"""numba for the cpu EP's hot loops: imported only where a kernel needs it.

Importing this package imports numba, so only kernel modules import it, and
only from inside the functions that build kernels (session creation): ``import
nxrt``, ``nxrt providers`` and plugin discovery never load numba (a test checks).

Compiled kernels are cached on disk (``cache=True``) so each compiles once per
machine. numba's default cache sits beside the source, which a site-packages
install may not be able to write; unless ``NUMBA_CACHE_DIR`` is set, the cache
goes to the user's cache folder (``platformdirs.user_cache_dir("nxrt")/numba``).

Kernels release the GIL (``nogil=True``). Where numba's OpenMP layer runs, a
kernel that splits its work runs on numba's pool, GEMMs included, with BLAS
held at one thread (:mod:`~nxrt_ep_cpu.jit.threads`: one pool, never two
fighting over the cores); elsewhere the pieces run on the session's pool
(:meth:`nxrt.host_parallel.HostParallel.map`, which caps BLAS at one thread
meanwhile) and GEMMs on BLAS's own threads.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numba
import platformdirs

if not numba.config.CACHE_DIR:
    numba.config.CACHE_DIR = os.path.join(platformdirs.user_cache_dir("nxrt"), "numba")


def njit(*args: Any, **options: Any) -> Any:
    """``numba.njit`` with the cpu EP's defaults: cached on disk, GIL released.

    ``fastmath`` stays off unless a kernel asks (it drops NaN and inf
    semantics the ONNX ops keep); a kernel needing a vectorized reduction
    asks for ``fastmath={"reassoc", "contract"}`` only. Division follows numpy
    (``error_model="numpy"``: inf or NaN, no ZeroDivisionError check, whose branch
    would stop a loop vectorizing).
    """
    options.setdefault("cache", True)
    options.setdefault("error_model", "numpy")
    options.setdefault("nogil", True)
    return numba.njit(*args, **options)


def inline(function: Callable[..., Any]) -> Any:
    """A helper other kernels call, inlined into them so their loops still vectorize."""
    return njit(inline="always")(function)

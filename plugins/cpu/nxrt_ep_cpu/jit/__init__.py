"""numba for the cpu EP's hot loops: imported only where a kernel needs it.

Importing this package imports numba, so only kernel modules import it, and
only from inside the functions that build kernels (session creation): ``import
nxrt``, ``nxrt providers`` and plugin discovery never load numba (a test checks).

Compiled kernels are cached on disk (:mod:`~nxrt_ep_cpu.jit.cache`) so each
compiles once per machine and version: in the user's cache folder
(``platformdirs.user_cache_dir("nxrt")/numba``, or ``NUMBA_CACHE_DIR``), in a
folder named after the nxrt-ep-cpu and numba versions and the sources, never
after where they are installed, so every checkout and venv shares it. Kernels
are built through :func:`nxrt_ep_cpu.compiling.compiled_kernel`, which compiles
them in the background while the numpy kernels run.

Kernels release the GIL (``nogil=True``). Where numba's OpenMP layer runs, a
kernel that splits its work runs on numba's pool, GEMMs included, with BLAS
held at one thread (:mod:`~nxrt_ep_cpu.jit.threads`: one pool, never two
fighting over the cores); elsewhere the pieces run on the session's pool
(:meth:`nxrt.host_parallel.HostParallel.map`, which caps BLAS at one thread
meanwhile) and GEMMs on BLAS's own threads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numba

from nxrt_ep_cpu.jit.cache import KernelCache


def njit(*args: Any, **options: Any) -> Any:
    """``numba.njit`` with the cpu EP's defaults: cached on disk (:class:`KernelCache`,
    unless ``cache=False``), GIL released.

    ``fastmath`` stays off unless a kernel asks (it drops NaN and inf
    semantics the ONNX ops keep); a kernel needing a vectorized reduction
    asks for ``fastmath={"reassoc", "contract"}`` only. Division follows numpy
    (``error_model="numpy"``: inf or NaN, no ZeroDivisionError check, whose branch
    would stop a loop vectorizing).
    """
    cache = options.pop("cache", True)
    options.setdefault("error_model", "numpy")
    options.setdefault("nogil", True)
    if args and callable(args[0]):
        return _cached(numba.njit(**options)(args[0]), cache)
    decorate = numba.njit(*args, **options)
    return lambda function: _cached(decorate(function), cache)


def _cached(dispatcher: Any, cache: bool) -> Any:
    """``dispatcher`` with its disk cache in the cpu EP's folder (numba's ``cache=True``
    would key it by the source's path); uncached where that folder cannot be written."""
    if cache:
        try:
            dispatcher._cache = KernelCache(dispatcher.py_func)
        except RuntimeError:  # no writable folder: compiled in every process
            pass
    return dispatcher


def inline(function: Callable[..., Any]) -> Any:
    """A helper other kernels call, inlined into them so their loops still vectorize."""
    return njit(inline="always")(function)

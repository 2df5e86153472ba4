"""Loading MLX, with an optimized BLAS under it where the platform allows.

The ``mlx[cpu]`` wheel for Linux links the reference BLAS: its sgemm runs at a
few GFLOP/s. MLX resolves ``cblas_*`` through the global symbol scope, so a
BLAS exporting the standard CBLAS symbols that is loaded with
``RTLD_GLOBAL`` *before* mlx is first imported takes over (measured here with
Debian's ``libopenblas0-pthread``: 3.7 -> 90 GFLOP/s on a 1024² sgemm). Loading
it after mlx has been imported changes nothing, so :func:`load_mlx` is the
only way this package imports mlx.

``NXRT_MLX_BLAS`` overrides the search: a path to a library, or ``reference``
to keep the BLAS the wheel ships.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys
import threading
from types import ModuleType

#: Where Debian and Ubuntu install the pthread build of OpenBLAS.
OPENBLAS_PATHS = (
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib64/libopenblasp.so.0",
    "/usr/lib64/libopenblas.so.0",
)

logger = logging.getLogger("nxrt.mlx")
_lock = threading.Lock()
_blas: str | None = None


def find_openblas() -> str | None:
    """Path of an OpenBLAS shared library on this machine, or ``None``."""
    for path in OPENBLAS_PATHS:
        if os.path.exists(path):
            return path
    return ctypes.util.find_library("openblas")


def load_blas() -> str:
    """Put an optimized BLAS under MLX if possible; return which BLAS MLX will use.

    ``"accelerate"`` on macOS (the wheel links it), ``"openblas"`` when a
    library was loaded before mlx, ``"reference"`` otherwise (no library
    found, or mlx was imported before this ran).
    """
    global _blas
    with _lock:
        if _blas is not None:
            return _blas
        if sys.platform == "darwin":
            _blas = "accelerate"
            return _blas
        choice = os.environ.get("NXRT_MLX_BLAS", "")
        if choice == "reference":
            _blas = "reference"
            return _blas
        if "mlx.core" in sys.modules:
            _blas = "reference"
            if find_openblas():
                logger.warning(
                    "mlx was imported before the mlx EP could put OpenBLAS under it: MLX's "
                    "CPU matrix products use the reference BLAS (slow); create the EP, or "
                    "import nxrt_ep_mlx._backend and call load_blas(), before importing mlx"
                )
            return _blas
        path = choice or find_openblas()
        _blas = "reference"
        if path:
            try:
                library = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            except OSError:
                return _blas
            if hasattr(library, "cblas_sgemm"):
                _blas = "openblas" if "openblas" in os.path.basename(path) else "cblas"
        return _blas


def load_mlx() -> ModuleType:
    """``mlx.core``, imported after :func:`load_blas`."""
    load_blas()
    import mlx.core

    return mlx.core


class LazyMlx:
    """Stands for ``mlx.core`` in kernel modules, importing it on first use.

    Kernel tables are built at registration, which must not open MLX; the
    translators only touch ``mx`` when a claim is compiled.
    """

    _module: ModuleType | None = None

    def __getattr__(self, name: str):  # noqa: ANN204 - forwards anything mlx.core has
        module = LazyMlx._module
        if module is None:
            module = LazyMlx._module = load_mlx()
        return getattr(module, name)


mx = LazyMlx()

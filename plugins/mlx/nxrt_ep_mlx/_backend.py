"""Loading MLX, with an optimized BLAS under it where the platform allows.

The ``mlx[cpu]`` wheel for Linux links the reference BLAS: its sgemm runs at a
few GFLOP/s. MLX resolves ``cblas_*`` through the global symbol scope, so a
BLAS exporting the standard CBLAS symbols that is loaded with
``RTLD_GLOBAL`` *before* mlx is first imported takes over (measured here with
Debian's ``libopenblas0-pthread``: 3.7 -> 90 GFLOP/s on a 1024² sgemm). Loading
it after mlx has been imported changes nothing, so :func:`load_mlx` is the
only way this package imports mlx.

A library is trusted only after a self-check (:func:`check_gemm`): it is first
opened ``RTLD_LOCAL``, where MLX cannot see it, its ``cblas_sgemm`` is run
directly on the call patterns MLX makes (row-major, every transpose pair,
padded leading dimensions, ``beta=0`` over a NaN-filled C, M/N/K edges, and
the 1x1 convolution of squeezenet's classifier), and each result is held to
float32's forward error bound against a float64 product. Only a library
that passes is reopened ``RTLD_GLOBAL`` (which promotes the same object into
the global scope); one that fails stays invisible to MLX, which keeps its
reference BLAS, and :func:`blas_info` says why (the EP's capabilities show
it: ``nxrt providers -v``).

The check does not ask for bitwise equal results across columns: a BLAS
kernel may sum some blocks of columns (edges, a thread's share) in another
order than others, so columns that are mathematically equal can differ by
an ulp or two. OpenBLAS's Haswell/Zen sgemm kernels (the ones AVX2 CPUs without
AVX-512 get) do so on squeezenet's classifier conv, whose 1000 output
channels are equal in the light model; that is within float32's error, and
no reason to drop a 25x faster BLAS: an output that turns one ulp into a
different answer (softmax over equal logits of 9.5e9, where an ulp is 1024)
is ill-conditioned on any BLAS.

``NXRT_MLX_BLAS`` overrides the search: a path to a library (checked like
any other), or ``reference`` to keep the BLAS the wheel ships.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys
import threading
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

#: Where Debian and Ubuntu install the pthread build of OpenBLAS.
OPENBLAS_PATHS = (
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib64/libopenblasp.so.0",
    "/usr/lib64/libopenblas.so.0",
)

logger = logging.getLogger("nxrt.mlx")
_lock = threading.Lock()
_info: BlasInfo | None = None

# CBLAS enums
ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112

#: The self-check's cases: (name, transpose A, transpose B, M, N, K, alpha, beta, padding of
#: the leading dimensions, B's rows all equal). MLX calls ``cblas_sgemm`` row-major, with the
#: transposes its operands' strides give, ldc = N and ``beta=0`` over an uninitialised output.
GEMM_CHECKS: tuple[tuple[str, bool, bool, int, int, int, float, float, int, bool], ...] = (
    # squeezenet's conv10 (1x1, 512 -> 1000 channels over 13x13) as MLX lowers it, B being
    # the weights; the light model's are all 0.02, so B's rows are equal
    ("conv1x1-169x1000x512", False, True, 169, 1000, 512, 1.0, 0.0, 0, True),
    ("NN-17x33x65", False, False, 17, 33, 65, 1.0, 0.0, 3, False),
    ("NT-1x1000x128", False, True, 1, 1000, 128, 1.0, 0.0, 0, False),
    ("TN-33x17x129", True, False, 33, 17, 129, 1.0, 0.0, 5, False),
    ("TT-1000x1x31", True, True, 1000, 1, 31, 1.0, 0.0, 1, False),
    ("NT-100x24x1", False, True, 100, 24, 1, 1.0, 0.0, 0, False),
    ("NN-33x17x100-beta1", False, False, 33, 17, 100, 0.5, 1.0, 2, False),
)


@dataclass(frozen=True)
class BlasInfo:
    """Which BLAS MLX's CPU matrix products run on, and why."""

    #: ``"openblas"``, ``"cblas"`` (another library), ``"reference"`` (the wheel's) or
    #: ``"accelerate"`` (macOS).
    name: str
    path: str | None = None
    #: OpenBLAS's kernel (``openblas_get_corename``: ``Haswell``, ``SkylakeX``, ...).
    core: str | None = None
    #: OpenBLAS's build line (``openblas_get_config``).
    config: str | None = None
    #: Why the library found was not put under MLX, when it was not.
    rejected: str | None = None

    def flags(self) -> list[str]:
        """Capability flags: ``blas:NAME``, ``blas-core:CORE``, ``blas-rejected:LIB:WHY``."""
        flags = [f"blas:{self.name}"]
        if self.core:
            flags.append(f"blas-core:{self.core}")
        if self.rejected:
            flags.append(f"blas-rejected:{self.rejected}")
        return flags

    def describe(self) -> str:
        """One line for people: name, path, OpenBLAS's build line, why rejected."""
        text = self.name + (f" ({self.path})" if self.path else "")
        if self.config:
            text += f", {self.config}"
        if self.rejected:
            text += f"; rejected: {self.rejected}"
        return text


def find_openblas() -> str | None:
    """Path of an OpenBLAS shared library on this machine, or ``None``."""
    for path in OPENBLAS_PATHS:
        if os.path.exists(path):
            return path
    return ctypes.util.find_library("openblas")


def _openblas_string(library: ctypes.CDLL, name: str) -> str | None:
    function = getattr(library, name, None)
    if function is None:
        return None
    function.restype = ctypes.c_char_p
    function.argtypes = []
    value = function()
    return value.decode(errors="replace").strip() if value else None


def _operand(rng, rows: int, cols: int, pad: int, equal_rows: bool = False):
    """A float32 ``rows x cols`` matrix stored row-major with ``pad`` NaN columns after each
    row (a BLAS that reads past its leading dimension's valid part gets NaN)."""
    import numpy as np

    values = rng.standard_normal((1 if equal_rows else rows, cols)).astype(np.float32)
    if equal_rows:
        values = np.repeat(values, rows, axis=0)
    storage = np.full((rows, cols + pad), np.nan, np.float32)
    storage[:, :cols] = values
    return storage, values


def check_gemm(library: ctypes.CDLL) -> str | None:
    """Run :data:`GEMM_CHECKS` through ``library.cblas_sgemm``; ``None`` if all pass, else why.

    Each element must be within ``4 * (K + 2) * 2**-24 * |row of op(A)| * |column of op(B)|``
    (plus the C term) of the float64 product of the same float32 operands: float32's
    forward error bound (``K u |a||b|``, bounded by the norms), which any correct
    summation order meets with room; a wrong kernel, a NaN read from C or from a leading
    dimension's padding, or a mismatched ABI misses it by orders of magnitude.
    """
    import numpy as np

    sgemm = getattr(library, "cblas_sgemm", None)
    if sgemm is None:
        return "no-cblas_sgemm"
    pointer, integer = ctypes.c_void_p, ctypes.c_int
    sgemm.restype = None
    sgemm.argtypes = [integer] * 6 + [ctypes.c_float, pointer, integer, pointer, integer]
    sgemm.argtypes += [ctypes.c_float, pointer, integer]
    rng = np.random.default_rng(20250)
    for name, ta, tb, m, n, k, alpha, beta, pad, equal_rows in GEMM_CHECKS:
        # op(A) is m x k: stored k x m when transposed; op(B) is k x n: stored n x k when
        # transposed (B's "rows" in the conv case are the output channels)
        a_store, a = _operand(rng, k if ta else m, m if ta else k, pad)
        b_store, b = _operand(rng, n if tb else k, k if tb else n, pad, equal_rows)
        op_a, op_b = (a.T if ta else a), (b.T if tb else b)
        c_in = rng.standard_normal((m, n)).astype(np.float32)
        c_store = np.full((m, n + pad), np.nan, np.float32)
        if beta:
            c_store[:, :n] = c_in
        sgemm(
            ROW_MAJOR,
            TRANS if ta else NO_TRANS,
            TRANS if tb else NO_TRANS,
            m,
            n,
            k,
            alpha,
            a_store.ctypes.data,
            a_store.shape[1],
            b_store.ctypes.data,
            b_store.shape[1],
            beta,
            c_store.ctypes.data,
            c_store.shape[1],
        )
        got = c_store[:, :n].astype(np.float64)
        want = alpha * (op_a.astype(np.float64) @ op_b.astype(np.float64))
        # |op(A)| @ |op(B)| <= the outer product of row and column norms (Cauchy-Schwarz)
        norms_a = np.linalg.norm(op_a.astype(np.float64), axis=1)
        size = abs(alpha) * np.outer(norms_a, np.linalg.norm(op_b.astype(np.float64), axis=0))
        if beta:
            want += beta * c_in
            size += abs(beta) * np.abs(c_in)
        bound = 4 * (k + 2) * 2.0**-24 * size + 1e-30
        error = np.abs(got - want)
        if not np.all(error <= bound):  # NaN fails too
            nans = int(np.isnan(got).sum())
            if nans:
                return f"sgemm-{name}:{nans}/{m * n}-nan"
            return f"sgemm-{name}:error-{float(np.max(error / bound)):.3g}x-bound"
        if pad and not np.isnan(c_store[:, n:]).all():
            return f"sgemm-{name}:wrote-past-N"
    return None


def _load(path: str) -> BlasInfo:
    """Check the library at ``path`` unseen by MLX, then make it global if it passed."""
    name = "openblas" if "openblas" in os.path.basename(path) else "cblas"
    try:
        library = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
    except OSError as exc:
        logger.warning("the mlx EP could not load %s (%s): MLX keeps the reference BLAS", path, exc)
        return BlasInfo("reference", rejected=f"{os.path.basename(path)}:not-loadable")
    core = _openblas_string(library, "openblas_get_corename")
    config = _openblas_string(library, "openblas_get_config")
    try:
        reason = check_gemm(library)
    except Exception as exc:  # noqa: BLE001 - a check that cannot run is a failed check
        reason = f"self-check-error:{type(exc).__name__}"
    if reason is not None:
        logger.warning(
            "the mlx EP's GEMM self-check failed on %s (%s, kernel %s): %s; MLX keeps the "
            "reference BLAS (NXRT_MLX_BLAS=PATH picks another library)",
            path,
            config or name,
            core or "unknown",
            reason,
        )
        return BlasInfo(
            "reference", core=None, config=config, rejected=f"{os.path.basename(path)}:{reason}"
        )
    ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)  # promotes the checked object: no second copy
    info = BlasInfo(name, path=path, core=core, config=config)
    logger.debug("MLX's BLAS: %s (passed the GEMM self-check)", info.describe())
    return info


def blas_info() -> BlasInfo:
    """Put an optimized BLAS under MLX if possible (once); what MLX will use, and why."""
    global _info
    with _lock:
        if _info is not None:
            return _info
        if sys.platform == "darwin":
            _info = BlasInfo("accelerate")
            return _info
        choice = os.environ.get("NXRT_MLX_BLAS", "")
        if choice == "reference":
            _info = BlasInfo("reference")
            return _info
        if "mlx.core" in sys.modules:
            _info = BlasInfo("reference")
            if find_openblas():
                logger.warning(
                    "mlx was imported before the mlx EP could put OpenBLAS under it: MLX's "
                    "CPU matrix products use the reference BLAS (slow); create the EP, or "
                    "import nxrt_ep_mlx._backend and call load_blas(), before importing mlx"
                )
            return _info
        path = choice or find_openblas()
        _info = _load(path) if path else BlasInfo("reference")
        return _info


def load_blas() -> str:
    """Put an optimized BLAS under MLX if possible; return which BLAS MLX will use.

    ``"accelerate"`` on macOS (the wheel links it), ``"openblas"`` when a
    library was loaded before mlx, ``"reference"`` otherwise (no library
    found, one that failed :func:`check_gemm`, or mlx was imported before this
    ran). :func:`blas_info` tells more.
    """
    return blas_info().name


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


if TYPE_CHECKING:
    import mlx.core as mx
else:
    mx = LazyMlx()

"""``C += A @ B`` through the BLAS library numpy itself calls, when it can be found.

numpy's matmul always overwrites its output, so summing products costs a
temporary and a full pass per term; BLAS's GEMM takes ``beta`` and adds in
place. A convolution that sums one product per kernel tap (the ``taps``
variant) saves eight passes over its output per 3x3 kernel this way.

The library is the one numpy links (found through threadpoolctl, which
nxrt already uses to cap BLAS threads), so thread caps apply to these calls
as to numpy's. Without it (another BLAS, another platform), :data:`GEMM` is
``None`` and callers keep their numpy path.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

import numpy as np

_ROW_MAJOR, _NO_TRANS = 101, 111
#: Symbol names of ``cblas_sgemm``/``cblas_dgemm`` and whether their integers are 64-bit.
_NAMES = (
    ("scipy_cblas_{}gemm64_", True),  # numpy's wheels: scipy-openblas, ILP64
    ("cblas_{}gemm64_", True),
    ("cblas_{}gemm", False),
)


class Gemm:
    """``gemm(a, b, c, beta)``: ``c = a @ b + beta * c`` for 2-D float32/float64 arrays.

    ``a``, ``b`` and ``c`` need a unit stride along their rows (any row
    stride, as BLAS's leading dimensions allow); ``c`` must not overlap the
    others. Returns ``False`` (and does nothing) for arrays it cannot take.
    """

    def __init__(self, functions: dict[np.dtype, Any], int_type: Any) -> None:
        self._functions = functions
        self._int = int_type

    def address(self, dtype: np.dtype) -> tuple[int, bool]:
        """The C address of the checked ``cblas_?gemm`` for ``dtype`` and whether its integers
        are 64-bit, for compiled loops that call it themselves; address 0 where there is none."""
        function = self._functions.get(np.dtype(dtype))
        if function is None:
            return 0, False
        return ctypes.cast(function, ctypes.c_void_p).value or 0, ctypes.sizeof(self._int) == 8

    def __call__(self, a: np.ndarray, b: np.ndarray, c: np.ndarray, beta: float = 1.0) -> bool:
        function = self._functions.get(c.dtype)
        if function is None or a.dtype != c.dtype or b.dtype != c.dtype:
            return False
        if a.ndim != 2 or b.ndim != 2 or c.ndim != 2 or not c.flags.writeable:
            return False
        (m, k), (k2, n) = a.shape, b.shape
        if k != k2 or c.shape != (m, n) or 0 in (m, n, k):
            return False
        item = c.itemsize
        lda, ldb, ldc = (_leading(x, item) for x in (a, b, c))
        if lda < k or ldb < n or ldc < n:
            return False
        integer = self._int
        function(
            _ROW_MAJOR,
            _NO_TRANS,
            _NO_TRANS,
            integer(m),
            integer(n),
            integer(k),
            1.0,
            a.ctypes.data,
            integer(lda),
            b.ctypes.data,
            integer(ldb),
            beta,
            c.ctypes.data,
            integer(ldc),
        )
        return True


def _leading(x: np.ndarray, item: int) -> int:
    """The row stride of a 2-D array in elements, or -1 when its rows are not unit-stride."""
    if x.strides[1] != item and x.shape[1] > 1:
        return -1
    if x.strides[0] % item or x.strides[0] <= 0:
        return -1 if x.shape[0] > 1 else max(x.shape[1], 1)
    return max(x.strides[0] // item, 1)


def _numpy_blas_path() -> str | None:
    """The BLAS library numpy's own extension links to."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return None
    numpy_dir = os.path.dirname(os.path.dirname(os.path.abspath(np.__file__)))
    for info in threadpool_info():
        path = info.get("filepath", "")
        if info.get("user_api") == "blas" and os.path.abspath(path).startswith(numpy_dir):
            return path
    return None


def _load() -> Gemm | None:
    if os.environ.get("NXRT_CPU_DIRECT_BLAS", "1") == "0":
        return None
    path = _numpy_blas_path()
    if path is None:
        return None
    try:
        library = ctypes.CDLL(path)
    except OSError:
        return None
    for pattern, wide in _NAMES:
        int_type = ctypes.c_int64 if wide else ctypes.c_int
        functions = {}
        for letter, dtype, real in (
            ("s", np.float32, ctypes.c_float),
            ("d", np.float64, ctypes.c_double),
        ):
            function = getattr(library, pattern.format(letter), None)
            if function is None:
                break
            function.restype = None
            function.argtypes = [
                ctypes.c_int,
                ctypes.c_int,
                ctypes.c_int,
                int_type,
                int_type,
                int_type,
                real,
                ctypes.c_void_p,
                int_type,
                ctypes.c_void_p,
                int_type,
                real,
                ctypes.c_void_p,
                int_type,
            ]
            functions[np.dtype(dtype)] = function
        if len(functions) == 2:
            gemm = Gemm(functions, int_type)
            if _works(gemm):
                return gemm
    return None


def _works(gemm: Gemm) -> bool:
    """One small product checked against numpy before the library is trusted."""
    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float64):
        a, b = rng.standard_normal((3, 5)).astype(dtype), rng.standard_normal((5, 4)).astype(dtype)
        c = np.ones((3, 4), dtype)
        # numpy's stub loses the float dtype of astype(dtype) over a tuple of scalar types
        if not gemm(a, b, c, 1.0) or not np.allclose(c, a @ b + 1, rtol=1e-5, atol=1e-5):  # type: ignore[operator]
            return False
    return True


#: The accumulating GEMM, or ``None`` where numpy's BLAS is not reachable.
GEMM = _load()

__all__ = ["GEMM", "Gemm"]

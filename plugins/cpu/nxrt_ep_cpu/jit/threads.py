"""One pool of threads for the cpu EP's work: numba's OpenMP team, GEMMs included.

Measured on two cores, a parallel region costs about 1.5 us to start on
numba's OpenMP layer, where handing work to Python threads costs about 100 us,
more than most nodes of a small model take. But two pools on the same cores
slow each other down badly: OpenMP threads spinning beside OpenBLAS's turned
a 300 us pair of calls into 8 ms. So BLAS is held at one thread while a session
lives (:meth:`nxrt.host_parallel.HostParallel.hold_blas`) and GEMMs are split
here, each thread calling the single-threaded ``cblas_sgemm`` on its share of
the output, which matches OpenBLAS's own two threads on every shape measured.

Results never depend on the threads a run gets: a kernel splits its work into
``parts`` fixed when it is created (the session's thread count), and a run
with fewer threads takes the same parts in turn. OpenBLAS's sums change with
the shape it is given (a band of columns is not summed as the whole), so the
parts must not follow the run's thread count.

The pool is used only where numba's ``omp`` threading layer loads (numba's
``workqueue`` costs 100 us a region and is not safe from several threads) and
never in a process forked after it started (GNU OpenMP does not survive a
fork): there :func:`team` gives 1, and a kernel made before the fork takes its
parts in turn through the serial twin of its parallel loop. ``GOMP_SPINCOUNT``,
unless set, is lowered so that idle workers sleep after tens of microseconds
rather than spinning for milliseconds.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any

os.environ.setdefault("GOMP_SPINCOUNT", "20000")  # read once, when libgomp loads

import numba  # noqa: E402 - after the OpenMP setting above
import numpy as np  # noqa: E402
from llvmlite import ir  # noqa: E402
from numba import prange, types  # noqa: E402
from numba.extending import intrinsic  # noqa: E402

from nxrt_ep_cpu.jit import inline, njit  # noqa: E402
from nxrt_ep_cpu.ops._blas import GEMM  # noqa: E402

if TYPE_CHECKING:
    from nxrt.host_parallel import HostParallel

if "NUMBA_THREADING_LAYER" not in os.environ:
    numba.config.THREADING_LAYER = "omp"

_state = {"usable": None, "forked": False}
_lock = threading.Lock()
_FLOAT32 = np.dtype(np.float32)
#: FMA contraction only: no reassociation, so NaN and inf keep their meaning.
_CONTRACT = {"contract"}
#: GEMMs below this many multiply-adds run on one thread: a second one does not repay
#: its start (measured: [144, 576] x [576, 1] 4.5 us in numpy, 6.8 us split; [288, 48] x
#: [48, 49] 14.6 against 11.2 us).
_SPLIT_MACS = 1 << 17
#: ``cblas_sgemm``'s address and whether its integers are 64-bit.
_BLAS = GEMM.address(_FLOAT32) if GEMM is not None else (0, False)


def _forked() -> None:
    _state["forked"] = True


os.register_at_fork(after_in_child=_forked)


def _usable() -> bool:
    """Whether numba's OpenMP layer runs here, checked once by starting it."""
    if _state["usable"] is None:
        with _lock:
            if _state["usable"] is None:
                try:
                    _probe(np.zeros(2, np.float32))
                    _state["usable"] = numba.threading_layer() == "omp"
                except (ValueError, RuntimeError, ImportError):
                    _state["usable"] = False
    return bool(_state["usable"])


def team(threads: int) -> int:
    """How many of this pool's threads a kernel asked to use ``threads`` runs on: 1 where
    the pool cannot run (see the module's docstring)."""
    if threads < 2 or _state["forked"] or GEMM is None or not _usable():
        return 1
    return min(threads, numba.config.NUMBA_NUM_THREADS)


def claim(parallel: HostParallel | None) -> int:
    """The team a kernel created for a session's pool ``parallel`` runs on, and so the
    number of parts it splits its work into in every run."""
    return team(parallel.threads if parallel is not None else 1)


#: Estimated work (ns on one core) from which a loop is split over the pool: a parallel
#: region starts in about 1.5 us and the caller waits for the slower part.
TEAM_NS = 10_000


def split_team(parallel: HostParallel | None, work_ns: float) -> int:
    """The threads a loop of ``work_ns`` over independent outputs splits over in this
    run: 1 in a run the session makes on one thread, or where the work does not repay
    the start."""
    if parallel is None or parallel.active_threads < 2:
        return 1
    return team(parallel.threads) if work_ns >= TEAM_NS else 1


def bounds(n: int, parts: int, align: int = 1) -> np.ndarray:
    """``range(n)`` as at most ``parts`` pieces whose starts are multiples of ``align``: the
    boundaries ``[0, ..., n]`` the split loops take."""
    step = max(1, -(-n // (parts * align)) * align)
    return np.array([*range(0, n, step), n], np.int64)


_launcher = threading.local()


def size_team(threads: int) -> None:
    """Give the calling thread's next parallel regions ``threads`` threads (numba keeps the
    count per calling thread; set only when it changes, as a call costs about 1 us)."""
    if getattr(_launcher, "threads", 0) != threads:
        numba.set_num_threads(threads)
        _launcher.threads = threads


@njit(parallel=True)
def _probe(x):  # pragma: no cover - compiled by numba
    for i in prange(x.size):
        x[i] += 1.0


# -- cblas_sgemm from compiled code -------------------------------------------------------------


def _sgemm_intrinsic(bits: int):
    """An intrinsic calling ``cblas_sgemm`` at an address with integers of ``bits`` bits:
    ``c[c_at:] = alpha * op(a[a_at:]) @ op(b[b_at:]) + beta * c[c_at:]``, row-major, the
    transposes given as 0/1 and the leading dimensions given."""
    integer = ir.IntType(bits)
    int32 = ir.IntType(32)
    real = ir.FloatType()
    pointer = real.as_pointer()
    signature_ir = ir.FunctionType(
        ir.VoidType(),
        [int32] * 3
        + [integer] * 3
        + [real, pointer, integer, pointer, integer]
        + [real, pointer, integer],
    )

    @intrinsic
    def sgemm(
        typingctx, address, ta, tb, m, n, k, alpha, a, a_at, lda, b, b_at, ldb, beta, c, c_at, ldc
    ):  # pragma: no cover - numba typing
        arrays = (a, b, c)
        if not all(isinstance(x, types.Array) and x.dtype == types.float32 for x in arrays):
            return None
        signature = types.void(
            address, ta, tb, m, n, k, alpha, a, a_at, lda, b, b_at, ldb, beta, c, c_at, ldc
        )

        def codegen(context, builder, sig, args):
            def whole(index):
                value = context.cast(builder, args[index], sig.args[index], types.int64)
                return value if bits == 64 else builder.trunc(value, integer)

            def flag(index):  # CblasNoTrans 111, CblasTrans 112
                value = context.cast(builder, args[index], sig.args[index], types.int32)
                return builder.add(value, ir.Constant(int32, 111))

            def scalar(index):
                return context.cast(builder, args[index], sig.args[index], types.float32)

            def data(index, offset):
                array = context.make_array(sig.args[index])(context, builder, args[index])
                at = context.cast(builder, args[offset], sig.args[offset], types.int64)
                return builder.gep(array.data, [at])

            function = builder.inttoptr(args[0], signature_ir.as_pointer())
            builder.call(
                function,
                [ir.Constant(int32, 101), flag(1), flag(2), whole(3), whole(4), whole(5)]
                + [scalar(6), data(7, 8), whole(9), data(10, 11), whole(12)]
                + [scalar(13), data(14, 15), whole(16)],
            )
            return context.get_dummy_value()

        return signature, codegen

    return sgemm


_sgemm64 = _sgemm_intrinsic(64)
_sgemm32 = _sgemm_intrinsic(32)


@inline
def sgemm(blas, ta, tb, m, n, k, alpha, a, a_at, lda, b, b_at, ldb, beta, c, c_at, ldc):
    """``cblas_sgemm`` at ``blas = (address, whether its integers are 64-bit)``, from
    compiled code (arrays flat or not: offsets count elements from their start)."""
    address, wide = blas
    if wide:
        _sgemm64(address, ta, tb, m, n, k, alpha, a, a_at, lda, b, b_at, ldb, beta, c, c_at, ldc)
    else:
        _sgemm32(address, ta, tb, m, n, k, alpha, a, a_at, lda, b, b_at, ldb, beta, c, c_at, ldc)


@njit(fastmath=_CONTRACT)
def row_product(h, rt, j0, j1, out):  # pragma: no cover - compiled by numba
    """``out = h @ rt[:, j0:j1]`` for one row ``h``."""
    depth = h.shape[0]
    width = j1 - j0
    for j in range(width):
        out[j] = np.float32(0.0)
    k = 0
    while k + 4 <= depth:
        h0, h1, h2, h3 = h[k], h[k + 1], h[k + 2], h[k + 3]
        r0, r1, r2, r3 = rt[k, j0:j1], rt[k + 1, j0:j1], rt[k + 2, j0:j1], rt[k + 3, j0:j1]
        for j in range(width):
            out[j] += h0 * r0[j] + h1 * r1[j] + h2 * r2[j] + h3 * r3[j]
        k += 4
    while k < depth:
        h0 = h[k]
        r0 = rt[k, j0:j1]
        for j in range(width):
            out[j] += h0 * r0[j]
        k += 1


@inline
def _depth_part(blas, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc, partial, parts, p):
    """Part ``p`` of a GEMM cut along its depth: part 0 into ``c`` (with ``beta``), part
    ``p`` into ``partial[p - 1]``."""
    step = -(-k // parts)
    k0 = p * step
    k1 = min(k, k0 + step)
    a_at = k0 * lda if ta else k0
    b_at = k0 if tb else k0 * ldb
    if p == 0:
        sgemm(blas, ta, tb, m, n, k1 - k0, 1.0, a, a_at, lda, b, b_at, ldb, beta, c, 0, ldc)
    elif k1 > k0:
        out = partial[p - 1]
        sgemm(blas, ta, tb, m, n, k1 - k0, 1.0, a, a_at, lda, b, b_at, ldb, 0.0, out, 0, n)
    else:
        partial[p - 1][:] = 0.0


@inline
def _add_parts(m, n, c, ldc, partial):
    """``c += partial[0] + partial[1] + ...``, in that order."""
    for p in range(partial.shape[0]):
        for i in range(m):
            row = c[i * ldc : i * ldc + n]
            extra = partial[p][i * n : (i + 1) * n]
            for j in range(n):
                row[j] += extra[j]


@njit(parallel=True)
def _split_depth(
    blas, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc, partial, parts
):  # pragma: no cover - compiled by numba
    """One GEMM of few rows cut along its depth into ``parts``, one per thread, then the
    parts summed into ``c`` in order. Every part spans all columns, so each column is
    computed as in one call (OpenBLAS's sums change with a split of the columns)."""
    for p in prange(parts):
        _depth_part(blas, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc, partial, parts, p)
    _add_parts(m, n, c, ldc, partial)


@njit
def _split_depth_serial(
    blas, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc, partial, parts
):  # pragma: no cover - compiled by numba
    """:func:`_split_depth` on the calling thread: the same parts, in turn."""
    for p in range(parts):
        _depth_part(blas, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc, partial, parts, p)
    _add_parts(m, n, c, ldc, partial)


@inline
def _band(blas, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc, parts, p):
    """Band ``p`` of ``parts`` of a GEMM's output: whole vectors of columns, or rows where
    the output has fewer columns than rows."""
    if n >= m:
        step = -(-n // parts)
        step = -(-step // 16) * 16
        j0 = p * step
        j1 = min(n, j0 + step)
        if j1 > j0:
            b_at = j0 * ldb if tb else j0
            sgemm(blas, ta, tb, m, j1 - j0, k, 1.0, a, 0, lda, b, b_at, ldb, beta, c, j0, ldc)
    else:
        step = -(-m // parts)
        i0 = p * step
        i1 = min(m, i0 + step)
        if i1 > i0:
            a_at = i0 if ta else i0 * lda
            sgemm(blas, ta, tb, i1 - i0, n, k, 1.0, a, a_at, lda, b, 0, ldb, beta, c, i0 * ldc, ldc)


@njit(parallel=True)
def _split_gemm(
    blas, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc, parts
):  # pragma: no cover - compiled by numba
    """One GEMM cut into ``parts`` bands of its output (see :func:`_band`), one per thread."""
    for p in prange(parts):
        _band(blas, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc, parts, p)


@njit
def _split_gemm_serial(
    blas, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc, parts
):  # pragma: no cover - compiled by numba
    """:func:`_split_gemm` on the calling thread: the same bands, in turn."""
    for p in range(parts):
        _band(blas, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc, parts, p)


@inline
def _matrix(blas, ta, tb, m, n, k, a, a_step, lda, b, b_step, ldb, c, i):
    sgemm(blas, ta, tb, m, n, k, 1.0, a, i * a_step, lda, b, i * b_step, ldb, 0.0, c, i * m * n, n)


@njit(parallel=True)
def _batched_gemm(
    blas, ta, tb, m, n, k, a, a_step, lda, b, b_step, ldb, c
):  # pragma: no cover - compiled by numba
    """``c[i] = op(a[i]) @ op(b[i])`` for each matrix ``i`` of flat operands (``a_step`` or
    ``b_step`` 0 for an operand shared by all), the matrices spread over the threads."""
    for i in prange(c.size // (m * n)):
        _matrix(blas, ta, tb, m, n, k, a, a_step, lda, b, b_step, ldb, c, i)


@njit
def _batched_gemm_serial(
    blas, ta, tb, m, n, k, a, a_step, lda, b, b_step, ldb, c
):  # pragma: no cover - compiled by numba
    """:func:`_batched_gemm` on the calling thread."""
    for i in range(c.size // (m * n)):
        _matrix(blas, ta, tb, m, n, k, a, a_step, lda, b, b_step, ldb, c, i)


def _leading(x: np.ndarray) -> int:
    """The row stride, in elements, of a 2-D float32 array with unit-stride rows; -1 if not."""
    if x.shape[1] > 1 and x.strides[1] != 4:
        return -1
    if x.shape[0] == 1:
        return max(x.shape[1], 1)
    return x.strides[0] // 4 if x.strides[0] > 0 and x.strides[0] % 4 == 0 else -1


def _operand(x: np.ndarray) -> tuple[np.ndarray, int, int] | None:
    """``x`` as BLAS reads it: (array, transposed 0/1, leading dimension), or ``None``."""
    lead = _leading(x)
    if lead >= x.shape[1] and lead > 0:
        return x, 0, lead
    lead = _leading(x.T)
    if lead >= x.shape[0] and lead > 0:
        return x.T, 1, lead
    return None


def _on_team(threads: int) -> bool:
    """Whether this run's parts go to the pool (``threads`` of it, one included: the same
    compiled loop, so no second one compiles in the middle of a session's runs), else
    in turn through the serial twin, in a process forked since the pool started."""
    if _state["forked"]:
        return False
    size_team(max(1, min(threads, numba.config.NUMBA_NUM_THREADS)))
    return True


def gemm(
    a: np.ndarray, b: np.ndarray, c: np.ndarray, beta: float, parts: int, threads: int
) -> bool:
    """``c = a @ b + beta * c`` for 2-D float32 arrays, cut into ``parts`` (fixed for a
    kernel: the result never depends on ``threads``, the pool threads this run takes them
    on). ``a`` and ``b`` may be transposed views; ``c`` has unit-stride rows and overlaps
    neither. Returns ``False``, having done nothing, where it does not split the product:
    one part, a product too small to repay it, or operands BLAS cannot take."""
    (m, k), (k2, n) = a.shape, b.shape
    if (
        parts < 2
        or _BLAS[0] == 0
        or m * n * k < _SPLIT_MACS
        or c.dtype != _FLOAT32
        or a.dtype != _FLOAT32
        or b.dtype != _FLOAT32
        or k != k2
        or c.shape != (m, n)
        or not c.flags.writeable
    ):
        return False
    ldc = _leading(c)
    left, right = _operand(a), _operand(b)
    if ldc < n or left is None or right is None:
        return False
    (a_base, ta, lda), (b_base, tb, ldb) = left, right
    team = _on_team(threads)
    if m == 1:  # a row times a matrix: split along the depth (see _split_depth)
        flat_c = c.reshape(-1) if c.flags.c_contiguous else None
        if flat_c is None:
            return False
        partial = np.empty((parts - 1, n), _FLOAT32)
        loop = _split_depth if team else _split_depth_serial
        loop(_BLAS, ta, tb, m, n, k, a_base, lda, b_base, ldb, beta, flat_c, ldc, partial, parts)
        return True
    loop = _split_gemm if team else _split_gemm_serial
    loop(_BLAS, ta, tb, m, n, k, a_base, lda, b_base, ldb, beta, c, ldc, parts)
    return True


def matmul(a: np.ndarray, b: np.ndarray, parts: int, threads: int) -> np.ndarray | None:
    """``np.matmul(a, b)`` for float32 operands cut into ``parts`` (see :func:`gemm`): a
    2-D ``b`` as one GEMM on the rows of ``a``, same-shaped batches (or a 2-D ``a``) as
    one GEMM per matrix; ``None`` for anything else (the caller uses numpy)."""
    if parts < 2 or _BLAS[0] == 0 or a.dtype != _FLOAT32 or b.dtype != _FLOAT32:
        return None
    if a.ndim < 2 or b.ndim < 2:
        return None
    m, k = a.shape[-2:]
    k2, n = b.shape[-2:]
    if k != k2 or 0 in (m, n, k):
        return None
    if b.ndim == 2:
        rows = a.reshape(-1, k) if a.flags.c_contiguous else None
        if rows is None:
            return None
        out = np.empty((rows.shape[0], n), _FLOAT32)
        if not gemm(rows, b, out, 0.0, parts, threads):
            return None
        return out.reshape(a.shape[:-1] + (n,))
    if a.ndim != b.ndim and a.ndim != 2:
        return None
    batch = b.shape[:-2] if a.ndim == 2 else a.shape[:-2]
    if a.ndim != 2 and a.shape[:-2] != b.shape[:-2]:
        return None
    count = int(np.prod(batch))
    if count < 2 or count * m * n * k < _SPLIT_MACS:
        return None
    flat_a, ta, lda, a_step = _batch_operand(a, count)
    flat_b, tb, ldb, b_step = _batch_operand(b, count)
    if flat_a is None or flat_b is None:
        return None
    out = np.empty(batch + (m, n), _FLOAT32)
    loop = _batched_gemm if _on_team(threads) else _batched_gemm_serial
    loop(_BLAS, ta, tb, m, n, k, flat_a, a_step, lda, flat_b, b_step, ldb, out.reshape(-1))
    return out


def _batch_operand(x: np.ndarray, count: int) -> tuple[Any, int, int, int]:
    """A batch operand as one flat array, with its transpose flag, leading dimension and
    the elements between matrices (0 for one 2-D matrix shared by the batch)."""
    rows, cols = x.shape[-2:]
    if x.ndim == 2:
        if x.flags.c_contiguous:
            return x.reshape(-1), 0, cols, 0
        if x.T.flags.c_contiguous:
            return x.T.reshape(-1), 1, rows, 0
        return None, 0, 0, 0
    if x.flags.c_contiguous:
        return x.reshape(-1), 0, cols, rows * cols
    swapped = np.swapaxes(x, -1, -2)
    if swapped.flags.c_contiguous:  # a transposed view, as attention's K^T often is
        return swapped.reshape(-1), 1, rows, rows * cols
    return None, 0, 0, 0


__all__ = [
    "TEAM_NS",
    "bounds",
    "claim",
    "gemm",
    "matmul",
    "sgemm",
    "size_team",
    "split_team",
    "team",
]

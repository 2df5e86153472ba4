"""float32 activations in one pass each, and the epilogue of a fused GEMM while it is in cache.

numpy computes a sigmoid in four passes over the array (and an exact-erf GELU
in about thirty); here each activation is one loop over contiguous values
that LLVM vectorizes, built on the polynomials of :mod:`~nxrt_ep_cpu.jit.mathf`.
Three entry points share the loops:

* :meth:`Activation.map`: ``y = f(x)`` into a new array (the standalone ops);
* :meth:`Activation.__call__`: ``y = f(y)`` in place, for rows of contiguous
  values (what ``pkg.nxrt::FusedConv`` applies to its output bands);
* :meth:`Activation.epilogue`: ``y = f(y + bias)`` row by row, a row's bias
  add and activation done while it is in L1 (``pkg.nxrt::FusedMatMul``).

Each loop is compiled once per activation (:func:`_loops`): the activation
is a constant of the loop, resolved while numba compiles it, so the loop holds
that activation's code alone and a session compiles (or loads from the disk
cache) only the activations it uses. In-place loops read and write one array:
a loop ``y[i] = f(x[i])`` given the same array twice does not vectorize (LLVM's
overlap check fails and it takes the scalar loop, measured 10x slower).
Multiplies and adds may fuse into FMAs (``contract``: 25% faster, within the
same float32 rounding); NaN and inf keep their meaning.

The wrappers split a call over the EP's pool (``jit/threads.py``) from
:data:`~nxrt_ep_cpu.jit.threads.TEAM_NS` of estimated work where the session's GEMMs run there, else
across the session's pool (``HostParallel``) from :data:`PARALLEL_NS`; the
loops release the GIL.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numba
import numpy as np
from numba import types
from numba.core.errors import TypingError
from numba.extending import overload
from numpy.lib.stride_tricks import as_strided

from nxrt_ep_cpu.jit import inline, mathf, njit
from nxrt_ep_cpu.jit.threads import bounds as pieces
from nxrt_ep_cpu.jit.threads import size_team, split_team

if TYPE_CHECKING:
    from nxrt.host_parallel import HostParallel

RELU, CLIP, LEAKY_RELU, SIGMOID, TANH, ERF, GELU, FAST_GELU = range(8)
SWISH, HARD_SIGMOID, HARD_SWISH = range(8, 11)
#: No activation: the bias add alone.
NONE = -1
#: The activations the 1x1 convolution kernels apply themselves as they write their output
#: (:func:`activate_range`; Relu and Clip are their clamp).
FUSED = frozenset({SIGMOID, SWISH, HARD_SIGMOID, HARD_SWISH, LEAKY_RELU})

#: Activation names (the ``activation`` attribute of the fused ops; ONNX op names, and
#: ONNX Runtime's ``FastGelu`` for GELU's tanh approximation) and their codes.
CODES = {
    "Relu": RELU,
    "Clip": CLIP,
    "LeakyRelu": LEAKY_RELU,
    "Sigmoid": SIGMOID,
    "Tanh": TANH,
    "Erf": ERF,
    "Gelu": GELU,
    "FastGelu": FAST_GELU,
    "Swish": SWISH,
    "HardSigmoid": HARD_SIGMOID,
    "HardSwish": HARD_SWISH,
}
#: Parameter defaults (ONNX's): Clip min, max; LeakyRelu alpha; HardSigmoid alpha, beta;
#: Swish alpha.
_DEFAULTS = {
    CLIP: (-float(np.finfo(np.float32).max), float(np.finfo(np.float32).max)),
    LEAKY_RELU: (0.01,),
    SWISH: (1.0,),
    HARD_SIGMOID: (0.2, 0.5),
}
#: Nanoseconds per value on one core (measured, 64 K float32 values in cache; the
#: cheap ones are bound by memory traffic instead).
_COST_NS = {
    RELU: 0.1,
    CLIP: 0.1,
    LEAKY_RELU: 0.1,
    HARD_SIGMOID: 0.1,
    HARD_SWISH: 0.1,
    SIGMOID: 0.45,
    SWISH: 0.5,
    TANH: 0.6,
    ERF: 0.3,
    GELU: 0.35,
    FAST_GELU: 0.8,
}
#: Estimated work (ns on one core) from which a call is split across the pool. Waking
#: it costs 50-80 µs here and the caller waits for the slower half, so below ~200 µs
#: the second core saves less than the hand-off costs, and loses when another
#: process holds that core.
PARALLEL_NS = 200_000
#: Chunks start at multiples of this many values (64-byte lines), so two threads
#: never write the same cache line.
_ALIGN = 16

_FLOAT32_MAX = float(np.finfo(np.float32).max)
_ZERO = np.float32(0.0)
_ONE = np.float32(1.0)
_HALF = np.float32(0.5)
_SQRT_HALF = np.float32(math.sqrt(0.5))
_FLOAT32 = np.dtype(np.float32)
_NO_BIAS = np.empty(0, np.float32)
#: Multiplies and adds may become FMAs; nothing else about float semantics changes.
_FMA = {"contract"}


# -- the loops ----------------------------------------------------------------------------------


@inline
def _clamp(v, lo, hi):  # pragma: no cover - compiled by numba
    """``min(max(v, lo), hi)`` keeping NaN (``lo > hi`` gives ``hi``, as Clip does)."""
    v = lo if v < lo else v
    return hi if v > hi else v


def _relu(v, kind, a, b):  # pragma: no cover - compiled by numba
    return _ZERO if v < _ZERO else v


def _clip(v, kind, a, b):  # pragma: no cover - compiled by numba
    return _clamp(v, a, b)


def _leaky_relu(v, kind, a, b):  # pragma: no cover - compiled by numba
    return v * a if v < _ZERO else v


def _sigmoid(v, kind, a, b):  # pragma: no cover - compiled by numba
    # 1 / (1 + e**-x) directly: e**-x overflows to inf for x < -88, giving the right 0,
    # and nothing cancels; faster than mathf.sigmoid's two-sided form, as accurate
    # (2.2 ulps), and it keeps the results below mathf.exp's range that that form drops
    s = _ONE / (_ONE + mathf.exp_clamped(-v))
    return s if v == v else v


def _tanh(v, kind, a, b):  # pragma: no cover - compiled by numba
    return mathf.tanh(v)


def _erf(v, kind, a, b):  # pragma: no cover - compiled by numba
    # the rational erf may pass +-1 by a few 1e-7 near |x| = 4, where erf is +-1 in float32
    return _clamp(mathf.erf(v), -_ONE, _ONE)


def _gelu(v, kind, a, b):  # pragma: no cover - compiled by numba
    # erf clamped as above: 1 + erf(x / sqrt 2) stays >= 0, so x Phi(x) keeps the sign of x
    return _HALF * v * (_ONE + _clamp(mathf.erf(v * _SQRT_HALF), -_ONE, _ONE))


def _fast_gelu(v, kind, a, b):  # pragma: no cover - compiled by numba
    return mathf.gelu_tanh(v)


def _swish(v, kind, a, b):  # pragma: no cover - compiled by numba
    s = v / (_ONE + mathf.exp_clamped(-a * v))  # x sigmoid(alpha x), one division
    return s if v == v else v


def _hard_sigmoid(v, kind, a, b):  # pragma: no cover - compiled by numba
    return _clamp(a * v + b, _ZERO, _ONE)


def _hard_swish(v, kind, a, b):  # pragma: no cover - compiled by numba
    return v * _clamp(a * v + b, _ZERO, _ONE)


def _identity(v, kind, a, b):  # pragma: no cover - compiled by numba
    return v


#: Each activation of one float32 value ``v``, with its parameters ``a`` and ``b``.
_SCALARS = {
    RELU: _relu,
    CLIP: _clip,
    LEAKY_RELU: _leaky_relu,
    SIGMOID: _sigmoid,
    TANH: _tanh,
    ERF: _erf,
    GELU: _gelu,
    FAST_GELU: _fast_gelu,
    SWISH: _swish,
    HARD_SIGMOID: _hard_sigmoid,
    HARD_SWISH: _hard_swish,
    NONE: _identity,
}


def _apply(v, kind, a, b):  # pragma: no cover - replaced by numba
    """Activation ``kind`` of one value: resolved while numba compiles a loop (``kind`` is
    a constant there), so each loop holds one activation's code and no branch."""
    raise NotImplementedError("only callable from compiled code")


@overload(_apply, inline="always", prefer_literal=True)
def _apply_overload(v, kind, a, b):  # pragma: no cover - numba typing
    if not isinstance(kind, types.IntegerLiteral):
        raise TypingError("the activation kind must be a compile-time constant")
    return _SCALARS[kind.literal_value]


@inline
def activate_range(ys, first, stop, kind, a, b):  # pragma: no cover - numba
    """Activation ``kind`` (one of :data:`FUSED`, or :data:`NONE`) in place on
    ``ys[first:stop]``, for kernels that apply it to a piece of their output while it is in
    cache: a vectorized loop per activation, the code chosen once per call."""
    if kind == SWISH:
        for i in range(first, stop):
            ys[i] = _apply(ys[i], SWISH, a, b)
    elif kind == HARD_SWISH:
        for i in range(first, stop):
            ys[i] = _apply(ys[i], HARD_SWISH, a, b)
    elif kind == SIGMOID:
        for i in range(first, stop):
            ys[i] = _apply(ys[i], SIGMOID, a, b)
    elif kind == HARD_SIGMOID:
        for i in range(first, stop):
            ys[i] = _apply(ys[i], HARD_SIGMOID, a, b)
    elif kind == LEAKY_RELU:
        for i in range(first, stop):
            ys[i] = _apply(ys[i], LEAKY_RELU, a, b)


@functools.cache
def _loops(kind: int) -> tuple[Any, Any, Any, Any, Any, Any]:
    """The compiled loops of one activation (:data:`NONE`: a bias add alone): the three
    entry points' serial loops, then :meth:`Activation.map`'s and the epilogue's split
    over the EP's pool (``jit/threads.py``).

    ``kind`` is a constant of each closure: a session compiles (or loads from the disk
    cache) only the activations it uses, each loop with that activation's code alone.
    """

    @njit(fastmath=_FMA)
    def map_values(x, y, a, b):  # pragma: no cover - compiled by numba
        """``y = f(x)``, 1-D float32 arrays of one size that do not overlap."""
        for i in range(x.size):
            y[i] = _apply(x[i], kind, a, b)

    @njit(fastmath=_FMA)
    def rows_in_place(flat, rows, width, stride, a, b):  # pragma: no cover
        """``f`` in place on ``rows`` rows of ``width`` values, ``stride`` apart in ``flat``."""
        for r in range(rows):
            # a slice, so the loop's index starts at 0 and the row is contiguous to numba
            row = flat[r * stride : r * stride + width]
            for i in range(width):
                row[i] = _apply(row[i], kind, a, b)

    @njit(fastmath=_FMA)
    def bias_rows(y, bias, a, b, first, stop):  # pragma: no cover - compiled by numba
        """Rows ``first..stop`` of a 2-D float32 ``y``: ``y = f(y + bias)``, a row at a
        time while it is in L1 (a ``bias`` of size 0 stands for none)."""
        n = y.shape[1]
        for r in range(first, stop):
            row = y[r]
            if bias.size:
                for i in range(n):
                    row[i] += bias[i]
            for i in range(n):
                row[i] = _apply(row[i], kind, a, b)

    @njit(fastmath=_FMA, parallel=True)
    def map_parts(x, y, a, b, bounds):  # pragma: no cover - compiled by numba
        """:func:`map_values` on the pieces ``bounds[p]..bounds[p + 1]``, over the pool."""
        for p in numba.prange(bounds.size - 1):
            for i in range(bounds[p], bounds[p + 1]):
                y[i] = _apply(x[i], kind, a, b)

    @njit(fastmath=_FMA, parallel=True)
    def bias_rows_parts(y, bias, a, b, bounds):  # pragma: no cover - compiled by numba
        """:func:`bias_rows` on the row pieces ``bounds[p]..bounds[p + 1]``, over the pool."""
        # the loop written out again, not a call of ``bias_rows``: numba's disk cache keys a
        # closure by its constants, and a compiled closure it calls is not one of them, so
        # every activation's loop would load the first one cached (measured: Relu for Gelu)
        n = y.shape[1]
        for p in numba.prange(bounds.size - 1):
            for r in range(bounds[p], bounds[p + 1]):
                row = y[r]
                if bias.size:
                    for i in range(n):
                        row[i] += bias[i]
                for i in range(n):
                    row[i] = _apply(row[i], kind, a, b)

    @njit(fastmath=_FMA, parallel=True)
    def values_in_place_parts(flat, a, b, bounds):  # pragma: no cover - compiled by numba
        """``f`` in place on the pieces ``bounds[p]..bounds[p + 1]`` of a 1-D ``flat``, over
        the pool (one array read and written, as :func:`rows_in_place`, so it vectorizes)."""
        for p in numba.prange(bounds.size - 1):
            piece = flat[bounds[p] : bounds[p + 1]]
            for i in range(piece.size):
                piece[i] = _apply(piece[i], kind, a, b)

    return map_values, rows_in_place, bias_rows, map_parts, bias_rows_parts, values_in_place_parts


# -- the wrappers -------------------------------------------------------------------------------


def _parts(values: int, cost_ns: float, parallel: HostParallel | None) -> int:
    """How many pieces a call of ``values`` values is cut into: one per pool thread once
    its work reaches :data:`PARALLEL_NS`, else one."""
    if parallel is None or parallel.threads < 2 or values * cost_ns < PARALLEL_NS:
        return 1
    return parallel.threads


def _ranges(n: int, parts: int, align: int) -> list[tuple[int, int]]:
    """``range(n)`` as ``parts`` contiguous pieces whose starts are multiples of ``align``."""
    edges = pieces(n, parts, align).tolist()
    return list(zip(edges[:-1], edges[1:], strict=True))


def _rows_of(y: np.ndarray) -> tuple[np.ndarray, int, int, int] | None:
    """``y`` as ``(flat, rows, width, stride)``: ``rows`` runs of ``width`` contiguous values,
    ``stride`` values apart, in the 1-D array ``flat``; ``None`` when ``y`` is not laid out
    that way (its last axis strided, or its outer axes not one regular step)."""
    if y.flags.c_contiguous:
        return y.reshape(-1), 1, y.size, y.size
    item = y.itemsize
    axes = [(d, s) for d, s in zip(y.shape, y.strides, strict=True) if d != 1]
    if any(s <= 0 or s % item for _, s in axes):
        return None
    dims = [(d, s // item) for d, s in axes]
    width, inner = 1, len(dims)
    while inner and dims[inner - 1][1] == width:  # the contiguous trailing axes
        inner -= 1
        width *= dims[inner][0]
    if inner == 0:
        return y.reshape(-1), 1, y.size, y.size
    rows, stride = dims[inner - 1]
    for d, s in reversed(dims[: inner - 1]):  # outer axes must continue the same step
        if s != rows * stride:
            return None
        rows *= d
    span = (rows - 1) * stride + width
    return as_strided(y, shape=(span,), strides=(item,)), rows, width, stride


class Activation:
    """One activation and its parameters, compiled for float32.

    ``name`` is one of :data:`CODES`; ``params`` are those of ONNX's op or of the
    fused ops' ``activation_params`` (Clip: min, max; LeakyRelu: alpha;
    HardSigmoid: alpha, beta; Swish: alpha), missing ones taking ONNX's defaults.
    Each entry point compiles on its first call (or loads from the disk cache).
    """

    def __init__(self, name: str, params: Sequence[float] = ()) -> None:
        self.name = name
        self.kind = CODES[name]
        values = [float(p) for p in params]
        values += _DEFAULTS.get(self.kind, ())[len(values) :]
        # Clip's bounds stay as given: a missing one is float32's lowest or max (the
        # default, which clips infinities), an infinite one clips nothing, a NaN one too
        if self.kind == HARD_SWISH:  # HardSigmoid's alpha and beta inside HardSwish
            values = [1 / 6, 0.5]
        values += [0.0, 0.0]
        self.a, self.b = np.float32(values[0]), np.float32(values[1])
        self.cost_ns = _COST_NS[self.kind]
        loops = _loops(self.kind)
        self._map, self._rows, self._bias_rows = loops[:3]
        self._map_parts, self._bias_parts, self._in_place_parts = loops[3:]

    def map(
        self,
        x: np.ndarray,
        parallel: HostParallel | None = None,
        bounds: tuple[float, float] | None = None,
    ) -> np.ndarray:
        """``f(x)`` in a new array, for a C-contiguous float32 ``x``; ``bounds`` replace
        Clip's min and max (Clip's inputs, known at run time)."""
        a, b = self.a, self.b
        if bounds is not None:
            a, b = np.float32(bounds[0]), np.float32(bounds[1])
        y = np.empty_like(x)
        src, dst = x.reshape(-1), y.reshape(-1)
        n = src.size
        team = split_team(parallel, n * self.cost_ns)
        if team > 1:
            size_team(team)
            self._map_parts(src, dst, a, b, pieces(n, team, _ALIGN))
            return y
        parts = _parts(n, self.cost_ns, parallel)
        loop = self._map
        if parts == 1:
            loop(src, dst, a, b)
            return y

        def work(piece: tuple[int, int]) -> None:
            first, stop = piece
            loop(src[first:stop], dst[first:stop], a, b)

        assert parallel is not None  # parts above 1 are its threads
        parallel.map(work, _ranges(n, parts, _ALIGN))
        return y

    def __call__(self, y: np.ndarray, parallel: HostParallel | None = None) -> bool:
        """``y = f(y)`` in place for a float32 ``y`` whose values lie in rows of contiguous
        values (contiguous ones split over the EP's pool when large); returns False, having
        done nothing, for any other array."""
        if y.dtype != _FLOAT32 or not y.flags.writeable:
            return False
        if not y.size:
            return True
        rows = _rows_of(y)
        if rows is None:
            return False
        team = split_team(parallel, y.size * self.cost_ns) if rows[1] == 1 else 1
        if team > 1:
            size_team(team)
            self._in_place_parts(rows[0], self.a, self.b, pieces(y.size, team, _ALIGN))
            return True
        self._rows(*rows, self.a, self.b)
        return True

    def epilogue(
        self, y: np.ndarray, bias: np.ndarray | None, parallel: HostParallel | None = None
    ) -> None:
        """``y = f(y + bias)`` in place on a C-contiguous float32 ``(rows, n)`` array (a
        GEMM's result), ``bias`` float32 ``(n,)`` or ``None``."""
        loops = self._bias_rows, self._bias_parts
        _each_row(loops, y, bias, self.a, self.b, 0.1 + self.cost_ns, parallel)


def add_bias(y: np.ndarray, bias: np.ndarray, parallel: HostParallel | None = None) -> None:
    """``y += bias`` in place on a C-contiguous float32 ``(rows, n)`` array, ``bias`` (n,)."""
    _each_row(_loops(NONE)[2::2], y, bias, _ZERO, _ZERO, 0.1, parallel)


def _each_row(loops, y, bias, a, b, cost_ns: float, parallel: HostParallel | None) -> None:
    """The serial loop of ``loops`` (serial, split) over the rows of ``y``, or the split
    one over the EP's pool, or the serial one across the session's pool, by the work."""
    rows = y.shape[0]
    bias = _NO_BIAS if bias is None else bias
    loop, split = loops
    team = min(rows, split_team(parallel, y.size * cost_ns))
    if team > 1:
        size_team(team)
        split(y, bias, a, b, pieces(rows, team))
        return
    parts = min(rows, _parts(y.size, cost_ns, parallel))
    if parts <= 1:
        loop(y, bias, a, b, 0, rows)
        return
    assert parallel is not None  # parts above 1 are its threads
    parallel.map(lambda piece: loop(y, bias, a, b, *piece), _ranges(rows, parts, 1))


__all__ = ["CODES", "PARALLEL_NS", "Activation", "add_bias"]

"""Neural-network layers: normalisation, softmax, dense layers and Flatten."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from nxrt.contrib_ops import DOMAIN, FUSED_SINCE
from nxrt.errors import KernelFailed
from nxrt.kernel import attribute_values
from nxrt_ep_cpu.compiling import compiled_kernel
from nxrt_ep_cpu.kernels import CpuKernel, compiled, pool_team, run_team
from nxrt_ep_cpu.ops._nan_order import ort_hardmax
from nxrt_ep_cpu.ops._registry import op
from nxrt_ep_cpu.ops.elementwise import NUMPY_FASTER, inplace_activation
from nxrt_ep_cpu.ops.normalization import pooled

if TYPE_CHECKING:
    import onnx_ir as ir

    from nxrt.host_parallel import HostParallel
    from nxrt.kernel import Kernel
    from nxrt.provider import ExecutionProvider

_EPSILON = float(np.float32(1e-5))  # the schema default, a float32 value
_MOMENTUM = float(np.float32(0.9))


@op("BatchNormalization", since=7)
def batch_normalization_7(
    x: np.ndarray,
    scale: np.ndarray,
    b: np.ndarray,
    mean: np.ndarray,
    var: np.ndarray,
    /,
    *,
    epsilon: float = _EPSILON,
    momentum: float = _MOMENTUM,
    spatial: int = 1,
) -> np.ndarray:
    """Inference BatchNormalization; ``spatial=0`` gives per-activation statistics.

    With ``spatial=0`` the statistics have shape ``(C, D1, ..., Dn)`` (one
    value per activation) and broadcast over the batch only.
    """
    if spatial:
        return _batch_norm(x, scale, b, mean, var, epsilon)
    y = (x - mean) / np.sqrt(var + epsilon) * scale + b
    return y.astype(x.dtype, copy=False)


@op("BatchNormalization", since=9)
def batch_normalization_9(
    x: np.ndarray,
    scale: np.ndarray,
    b: np.ndarray,
    mean: np.ndarray,
    var: np.ndarray,
    /,
    *,
    epsilon: float = _EPSILON,
    momentum: float = _MOMENTUM,
) -> np.ndarray:
    """Inference BatchNormalization, statistics per channel (axis 1)."""
    return _batch_norm(x, scale, b, mean, var, epsilon)


@op("BatchNormalization", since=(14, 15))
def batch_normalization(
    x: np.ndarray,
    scale: np.ndarray,
    b: np.ndarray,
    input_mean: np.ndarray,
    input_var: np.ndarray,
    /,
    *,
    epsilon: float = _EPSILON,
    momentum: float = _MOMENTUM,
    training_mode: int = 0,
) -> np.ndarray | tuple[np.ndarray, np.ndarray, np.ndarray]:
    """BatchNormalization (opset 14 on; 15 lets statistics have their own dtype).

    With ``training_mode=1`` the batch's own statistics (population variance
    over every axis but 1) normalise ``x``, and the running statistics come
    back updated: ``running = input * momentum + batch * (1 - momentum)``.
    """
    if not training_mode:
        return _batch_norm(x, scale, b, input_mean, input_var, epsilon)
    axes = (0,) + tuple(range(2, x.ndim))
    wide: np.ndarray = x.astype(np.float64 if x.dtype == np.float64 else np.float32, copy=False)
    mean = np.mean(wide, axis=axes)
    var = np.var(wide, axis=axes)
    y = _batch_norm(x, scale, b, mean, var, epsilon)
    stats = input_mean.dtype
    running_mean = input_mean * momentum + mean * (1 - momentum)
    running_var = input_var * momentum + var * (1 - momentum)
    return y, running_mean.astype(stats, copy=False), running_var.astype(stats, copy=False)


def _batch_norm(x, scale, b, mean, var, epsilon: float) -> np.ndarray:
    """Fold the statistics into one multiply-add per channel, in the dtype of ``x``.

    The fold itself is computed in float32 at least: float16 statistics (opset
    15 lets them differ from ``x``) would lose three digits in it.
    """
    wide: type[np.floating] = (
        np.float64 if np.float64 in (x.dtype, scale.dtype, var.dtype) else np.float32
    )
    scale, b, mean, var = (np.asarray(v, dtype=wide) for v in (scale, b, mean, var))
    factor = scale / np.sqrt(var + epsilon)
    shift = b - mean * factor
    shape = (-1,) + (1,) * (x.ndim - 2)
    factor = factor.astype(x.dtype, copy=False).reshape(shape)
    shift = shift.astype(x.dtype, copy=False).reshape(shape)
    y = x * factor
    y += shift
    return y


@op("LRN", since=(1, 13))
def lrn(
    x: np.ndarray,
    /,
    *,
    alpha: float = float(np.float32(1e-4)),
    beta: float = 0.75,
    bias: float = 1.0,
    size: int,
) -> np.ndarray:
    """Local response normalisation across channels (axis 1), window of ``size`` channels."""
    c = x.shape[1]
    before = (size - 1) // 2  # floor((size - 1) / 2) channels before, the rest after
    widths = [(0, 0)] * x.ndim
    widths[1] = (before, size - 1 - before)
    wide = x.astype(np.float32) if x.dtype == np.float16 else x  # float16 squares overflow
    square = np.pad(np.square(wide), widths)
    total = square[:, 0:c].copy()
    for i in range(1, size):  # one pass per channel offset in the window
        total += square[:, i : i + c]
    return (wide / (bias + (alpha / size) * total) ** beta).astype(x.dtype, copy=False)


def _fast_flat(
    x: np.ndarray, /, *, log: bool, parallel: HostParallel | None = None, axis: int = 1
) -> np.ndarray:
    """Softmax or LogSoftmax of opsets 1 and 11, compiled for float32 (the references
    :func:`softmax_1` and :func:`log_softmax_1` run for the other dtypes)."""
    start = axis + x.ndim if axis < 0 else axis
    if x.dtype == np.float32 and x.size and 0 <= start <= x.ndim:
        return compiled("norm").softmax(_as_2d(x, start), 1, log, parallel).reshape(x.shape)
    return (log_softmax_1 if log else softmax_1)(x, axis=axis)


def _fast_along(
    x: np.ndarray, /, *, log: bool, parallel: HostParallel | None = None, axis: int = -1
) -> np.ndarray:
    """Softmax or LogSoftmax of opset 13, compiled for float32 (the references
    :func:`softmax` and :func:`log_softmax` run for the other dtypes)."""
    if x.dtype == np.float32 and x.size and -x.ndim <= axis < x.ndim:
        return compiled("norm").softmax(x, axis % x.ndim, log, parallel)
    return (log_softmax if log else softmax)(x, axis=axis)


@op("Softmax", since=(1, 11), factory=pooled(partial(_fast_flat, log=False), lambda: softmax_1))
def softmax_1(x: np.ndarray, /, *, axis: int = 1) -> np.ndarray:
    """Softmax over the flattened axes ``axis..`` (the input seen as 2-D, opsets 1 and 11)."""
    return _softmax(_as_2d(x, axis), axis=1).reshape(x.shape)


@op("Softmax", since=13, factory=pooled(partial(_fast_along, log=False), lambda: softmax))
def softmax(x: np.ndarray, /, *, axis: int = -1) -> np.ndarray:
    """Softmax along one axis (opset 13 semantics)."""
    return _softmax(x, axis)


@op(
    "LogSoftmax",
    since=(1, 11),
    factory=pooled(partial(_fast_flat, log=True), lambda: log_softmax_1),
)
def log_softmax_1(x: np.ndarray, /, *, axis: int = 1) -> np.ndarray:
    """LogSoftmax over the flattened axes ``axis..`` (opsets 1 and 11)."""
    return _log_softmax(_as_2d(x, axis), axis=1).reshape(x.shape)


@op("LogSoftmax", since=13, factory=pooled(partial(_fast_along, log=True), lambda: log_softmax))
def log_softmax(x: np.ndarray, /, *, axis: int = -1) -> np.ndarray:
    """LogSoftmax along one axis (opset 13 semantics)."""
    return _log_softmax(x, axis)


@op("Hardmax", since=(1, 11))
def hardmax_1(x: np.ndarray, /, *, axis: int = 1) -> np.ndarray:
    """One-hot of the first maximum over the flattened axes ``axis..`` (opsets 1 and 11)."""
    return _hardmax(_as_2d(x, axis), axis=1).reshape(x.shape)


@op("Hardmax", since=13)
def hardmax(x: np.ndarray, /, *, axis: int = -1) -> np.ndarray:
    """One-hot of the first maximum along one axis (opset 13 semantics)."""
    return _hardmax(x, axis)


def _hardmax(x: np.ndarray, axis: int) -> np.ndarray:
    axis = axis + x.ndim if axis < 0 else axis
    y = np.zeros(x.shape, dtype=x.dtype)
    if x.size:
        if x.dtype.kind == "f" and np.isnan(x).any():  # the spec is silent: ORT's choice
            return ort_hardmax(x, axis)
        else:
            first = np.expand_dims(np.argmax(x, axis=axis), axis)
        np.put_along_axis(y, first, 1, axis=axis)
    return y


def _as_2d(x: np.ndarray, axis: int) -> np.ndarray:
    axis = axis + x.ndim if axis < 0 else axis
    return x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    if not x.size:  # np.max has no identity for an empty axis; the result is empty too
        return x.copy()
    y = x - np.max(x, axis=axis, keepdims=True)
    np.exp(y, out=y)
    y /= np.sum(y, axis=axis, keepdims=True)
    return y


def _log_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    if not x.size:
        return x.copy()
    y = x - np.max(x, axis=axis, keepdims=True)
    y -= np.log(np.sum(np.exp(y), axis=axis, keepdims=True))
    return y


# -- dense layers: Gemm, MatMul, FusedMatMul ----------------------------------------------------

_BLAS_DTYPES = frozenset({np.dtype(np.float32), np.dtype(np.float64)})
_FLOAT32 = np.dtype(np.float32)


def _product(a: np.ndarray, b: np.ndarray, parts: int = 1, threads: int = 1) -> np.ndarray:
    """``a @ b`` of 2-D arrays: cut into ``parts`` above 1, taken by ``threads`` of the EP's
    pool (the result depends on ``parts`` only), else one BLAS call (BLAS runs on one
    thread while a session runs: see :mod:`nxrt.host_parallel`)."""
    if parts > 1:
        y = compiled("threads").matmul(a, b, parts, threads)
        if y is not None:
            return y
    return np.matmul(a, b)


def _rows_product(a: np.ndarray, b: np.ndarray, parts: int = 1, threads: int = 1) -> np.ndarray:
    """``a @ b`` for ``a`` of shape ``(..., K)`` and a 2-D ``b``: one GEMM on the rows of
    ``a`` (numpy's matmul runs one GEMM per matrix of a batch, each with a small M)."""
    y = _product(a.reshape(math.prod(a.shape[:-1]), a.shape[-1]), b, parts, threads)
    return y.reshape(a.shape[:-1] + (b.shape[1],))


class GemmKernel(CpuKernel):
    """Gemm of float32 operands: the product on BLAS (one thread for small ones), then
    ``C`` added as a row bias in one compiled pass split across the session's pool;
    other dtypes and C layouts run the numpy reference.

    The optimizer stores constant weights untransposed (``transB=1`` is slower in
    OpenBLAS for few rows: 42 against 10 µs for [8, 256] x [256, 256]).
    """

    def __init__(
        self, fn: Callable[..., np.ndarray], attrs: dict[str, Any], parallel: HostParallel | None
    ) -> None:
        super().__init__(fn, attrs, variant="blas")
        self.alpha = float(attrs.get("alpha", 1.0))
        self.beta = float(attrs.get("beta", 1.0))
        self.trans_a, self.trans_b = bool(attrs.get("transA", 0)), bool(attrs.get("transB", 0))
        self.parallel = parallel
        self.team = pool_team(parallel)
        from nxrt_ep_cpu.jit import elementwise as compiled_ops

        self._add_bias = compiled_ops.add_bias
        warm = np.zeros((1, 16), np.float32)
        self._add_bias(warm, warm[0])  # compiles, or loads from the disk cache, now

    @classmethod
    def create(cls, ep: ExecutionProvider, node: ir.Node, fn: Callable[..., np.ndarray]) -> Kernel:
        """The node's kernel, built through :func:`~nxrt_ep_cpu.compiling.compiled_kernel`
        (``fn``, the numpy reference, runs until its compiled pass is built)."""
        attrs = attribute_values(node)
        return compiled_kernel(
            ep, node, lambda: cls(fn, attrs, ep.parallel), lambda: CpuKernel(fn, attrs)
        )

    @property
    def direct_call(self) -> Callable[..., np.ndarray]:
        return self.run

    def run(self, a: np.ndarray, b: np.ndarray, c: np.ndarray | None = None) -> np.ndarray:
        if not _float32(a, b, c) or a.ndim != 2 or b.ndim != 2:
            return self._call(a, b, c)
        y = _product(
            a.T if self.trans_a else a,
            b.T if self.trans_b else b,
            self.team,
            run_team(self.team, self.parallel),
        )
        if self.alpha != 1.0:
            np.multiply(y, np.float32(self.alpha), out=y)
        if c is None or self.beta == 0.0:
            return y
        n = y.shape[1]
        if self.beta == 1.0 and c.ndim <= 2 and c.size == n and c.shape[-1:] == (n,) and n:
            self._add_bias(y, np.ascontiguousarray(c).reshape(n), self.parallel)
            return y
        np.add(y, c * np.float32(self.beta) if self.beta != 1.0 else c, out=y)
        return y


class MatMulKernel(CpuKernel):
    """MatMul of float32 or float64 operands by 2-D weights as one GEMM on the rows of
    the first (see :func:`_rows_product`); float32 batches on the EP's pool, one GEMM
    per matrix; every other case is numpy's matmul."""

    def __init__(
        self,
        fn: Callable[..., np.ndarray],
        attrs: dict[str, Any],
        parallel: HostParallel | None,
        *,
        compiled: bool = True,
    ) -> None:
        super().__init__(fn, attrs, variant="blas")
        self.parallel = parallel
        #: Parts of the EP's pool the products split into (1 without numba: ``compiled``).
        self.team = pool_team(parallel) if compiled else 1

    @classmethod
    def create(cls, ep: ExecutionProvider, node: ir.Node, fn: Callable[..., np.ndarray]) -> Kernel:
        """The node's kernel: on one thread numpy's alone; on several, the products split
        over the EP's pool once that is compiled (through ``compiled_kernel``), whole
        GEMMs until then."""
        attrs = attribute_values(node)
        if ep.parallel is None or ep.parallel.threads < 2:
            return cls(fn, attrs, ep.parallel)  # no numba: nothing to compile
        return compiled_kernel(
            ep,
            node,
            lambda: cls(fn, attrs, ep.parallel),
            lambda: cls(fn, attrs, ep.parallel, compiled=False),
        )

    @property
    def direct_call(self) -> Callable[..., np.ndarray]:
        return self.run

    def run(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        if a.dtype in _BLAS_DTYPES and b.dtype == a.dtype and b.ndim == 2 and a.ndim >= 1:
            return _rows_product(a, b, self.team, run_team(self.team, self.parallel))
        if self.team > 1:
            y = compiled("threads").matmul(a, b, self.team, run_team(self.team, self.parallel))
            if y is not None:
                return y
        return self._call(a, b)


class FusedMatMulKernel(CpuKernel):
    """FusedMatMul of float32 operands: one GEMM on the rows of ``a``, then the bias and
    the activation in one compiled pass over each row while it is in cache (split
    across the session's pool when large); other dtypes run the numpy reference."""

    def __init__(
        self, fn: Callable[..., np.ndarray], attrs: dict[str, Any], parallel: HostParallel | None
    ) -> None:
        super().__init__(fn, attrs, variant="numba")
        from nxrt_ep_cpu.jit import elementwise as compiled_ops

        name = attrs.get("activation", "")
        name = name.decode() if isinstance(name, bytes) else name
        self.parallel = parallel
        self.team = pool_team(parallel)
        params = attrs.get("activation_params") or ()
        #: An activation the compiled loops lack runs (and fails) in the reference.
        self.known = not name or name in compiled_ops.CODES
        self.compiled, self.activate = None, None
        if name in NUMPY_FASTER:  # the bias compiled, the activation numpy's
            self.activate = inplace_activation(name, params)
        elif name and self.known:
            self.compiled = compiled_ops.Activation(name, params)
        self._add_bias = compiled_ops.add_bias
        warm = np.zeros((1, 16), np.float32)
        if self.compiled is not None:  # compile, or load from the disk cache, now
            self.compiled.epilogue(warm, None)
        self._add_bias(warm, warm[0])

    @classmethod
    def create(cls, ep: ExecutionProvider, node: ir.Node, fn: Callable[..., np.ndarray]) -> Kernel:
        """The node's kernel, built through :func:`~nxrt_ep_cpu.compiling.compiled_kernel`
        (``fn`` in numpy alone runs until its compiled epilogue is built)."""
        attrs = attribute_values(node)
        return compiled_kernel(
            ep,
            node,
            lambda: cls(fn, attrs, ep.parallel),
            lambda: CpuKernel(fn, {**attrs, "_compiled": False}),
        )

    @property
    def direct_call(self) -> Callable[..., np.ndarray]:
        return self.run

    def run(self, a: np.ndarray, b: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        n = b.shape[-1]
        if not _float32(a, b, bias) or b.ndim != 2 or (bias is not None and bias.size != n):
            return self._call(a, b, bias)
        if not self.known:
            return self._call(a, b, bias)
        y = _rows_product(a, b, self.team, run_team(self.team, self.parallel))
        rows = y.reshape(math.prod(y.shape[:-1]), n)
        if bias is not None:
            bias = np.ascontiguousarray(bias).reshape(n)
        if self.compiled is not None:
            self.compiled.epilogue(rows, bias, self.parallel)
            return y
        if bias is not None:
            self._add_bias(rows, bias, self.parallel)
        if self.activate is not None:
            self.activate(rows)
        return y


def _float32(*arrays: np.ndarray | None) -> bool:
    return all(x is None or x.dtype == _FLOAT32 for x in arrays)


@op("Gemm", since=(1, 6), factory=lambda ep, node: GemmKernel.create(ep, node, gemm_1))
def gemm_1(
    a: np.ndarray,
    b: np.ndarray,
    c: np.ndarray,
    /,
    *,
    alpha: float = 1.0,
    beta: float = 1.0,
    broadcast: int = 0,
    transA: int = 0,
    transB: int = 0,
) -> np.ndarray:
    """Gemm before opset 7: C is required; ``broadcast`` only said whether C may broadcast."""
    return gemm(a, b, c, alpha=alpha, beta=beta, transA=transA, transB=transB)


@op("Gemm", since=(7, 9, 11, 13), factory=lambda ep, node: GemmKernel.create(ep, node, gemm))
def gemm(
    a: np.ndarray,
    b: np.ndarray,
    c: np.ndarray | None = None,
    /,
    *,
    alpha: float = 1.0,
    beta: float = 1.0,
    transA: int = 0,
    transB: int = 0,
) -> np.ndarray:
    """``alpha * A' @ B' + beta * C``; C broadcasts to ``(M, N)`` (optional from opset 11)."""
    y = np.asarray(np.matmul(a.T if transA else a, b.T if transB else b)).astype(
        a.dtype, copy=False
    )
    if alpha != 1.0:
        y = np.multiply(y, alpha, out=y, casting="unsafe")
    if c is not None and beta != 0.0:
        if beta != 1.0:
            c = c * beta
        np.add(y, c, out=y, casting="unsafe")
    return y


@op("MatMul", since=(1, 9, 13), factory=lambda ep, node: MatMulKernel.create(ep, node, mat_mul))
def mat_mul(a: np.ndarray, b: np.ndarray, /) -> np.ndarray:
    """Matrix product with numpy's rules for 1-D operands and batch broadcasting.

    numpy returns float32 for bfloat16 operands; the result is cast back.
    """
    return np.asarray(np.matmul(a, b)).astype(a.dtype, copy=False)


@op(
    "FusedMatMul",
    since=FUSED_SINCE,
    domain=DOMAIN,
    factory=lambda ep, node: FusedMatMulKernel.create(ep, node, fused_mat_mul),
)
def fused_mat_mul(
    a: np.ndarray,
    b: np.ndarray,
    bias: np.ndarray | None = None,
    /,
    *,
    activation: str = "",
    activation_params: list[float] | None = None,
    _compiled: bool = True,
) -> np.ndarray:
    """``activation(a @ b + bias)``, bias along the last axis: a MatMul by constant weights
    with the Add (and activation) after it fused in by the optimizer, applied in place
    (``_compiled=False``: in numpy alone)."""
    y = np.asarray(np.matmul(a, b)).astype(a.dtype, copy=False)
    if bias is not None:
        np.add(y, bias, out=y, casting="unsafe")
    act = inplace_activation(activation, activation_params or (), compiled=_compiled)
    if act is not None:
        act(y)
    return y


@op("Flatten", since=(1, 9, 11, 13, 21, 23, 24, 25), view_output=0)
def flatten(x: np.ndarray, /, *, axis: int = 1) -> np.ndarray:
    """The input as 2-D: axes before ``axis`` become rows, the rest columns (a view)."""
    return _as_2d(x, axis)


@op("Einsum", since=(12, 28))
def einsum(*inputs: np.ndarray, equation: str) -> np.ndarray:
    """Einstein summation; small floats (float16, bfloat16) are accumulated in float32."""
    if isinstance(equation, bytes):
        equation = equation.decode()
    equation = equation.replace(" ", "")
    if not inputs:
        raise KernelFailed("Einsum needs at least one input")
    dtype = inputs[0].dtype
    wide = _wide_float(dtype)
    operands = [t.astype(wide, copy=False) for t in inputs] if wide != dtype else inputs
    try:
        y = np.einsum(equation, *operands, optimize=len(operands) > 2)
    except ValueError as exc:
        raise KernelFailed(f"Einsum equation {equation!r} does not fit its inputs: {exc}") from exc
    return np.asarray(y).astype(dtype, copy=False)


@op("Det", since=(11, 22))
def det(x: np.ndarray, /) -> np.ndarray:
    """Determinant of each square matrix in the last two axes."""
    if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
        raise KernelFailed(f"Det needs square matrices in the last two axes, got shape {x.shape}")
    wide = x.dtype if x.dtype in (np.float32, np.float64) else np.dtype(np.float32)
    return np.asarray(np.linalg.det(x.astype(wide, copy=False))).astype(x.dtype, copy=False)


def _wide_float(dtype: np.dtype) -> np.dtype:
    """float32 for floats narrower than it (float16, bfloat16 ...), else the dtype itself."""
    if dtype.kind == "V" or (dtype.kind == "f" and dtype.itemsize < 4):
        return np.dtype(np.float32)
    return dtype

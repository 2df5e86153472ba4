"""Trigonometric, rounding, activation and other elementwise math kernels.

Every kernel returns the input's dtype. Types numpy cannot compute in
(bfloat16, float8: ml_dtypes types) are computed in float32 and rounded back;
attributes are Python floats, which numpy casts to the array's dtype.

The registered functions are the numpy references. A session runs the
activations real models use (here Erf, Gelu, HardSigmoid, HardSwish, Swish;
Relu, LeakyRelu, Sigmoid and Clip in ``elementwise``) through an
:class:`ActivationKernel`: float32 inputs take one compiled pass
(:mod:`nxrt_ep_cpu.jit.elementwise`), every other input the reference.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from nxrt.errors import KernelFailed
from nxrt.kernel import attribute_values
from nxrt_ep_cpu.compiling import compiled_kernel
from nxrt_ep_cpu.kernels import CpuKernel, pool_team
from nxrt_ep_cpu.ops._registry import op

if TYPE_CHECKING:
    import onnx_ir as ir

    from nxrt.host_parallel import HostParallel
    from nxrt.kernel import Kernel
    from nxrt.provider import ExecutionProvider

_FLOAT32 = np.dtype(np.float32)


class ActivationKernel(CpuKernel):
    """An activation whose float32 inputs take one compiled pass, split across the
    session's pool when large; other dtypes run the registered numpy function.

    A non-contiguous float32 input is copied first. Clip's bounds (inputs from
    opset 11) arrive with each call.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        attrs: dict[str, Any],
        compiled: Any,
        parallel: HostParallel | None,
    ) -> None:
        super().__init__(fn, attrs, variant="numba")
        self.compiled = compiled
        self.parallel = parallel
        pool_team(parallel)  # large calls split over the EP's pool

    @property
    def direct_call(self) -> Callable[..., np.ndarray]:
        return self.run

    def run(self, x: np.ndarray, *bounds: np.ndarray | None) -> np.ndarray:
        if x.dtype != _FLOAT32:
            return self._call(x, *bounds)
        limits = _clip_bounds(*bounds) if bounds else None
        if bounds and limits is None:
            return self._call(x, *bounds)
        if not x.flags.c_contiguous:  # (np.ascontiguousarray would make a 0-d x 1-d)
            x = np.ascontiguousarray(x)
        return self.compiled.map(x, self.parallel, limits)


def _clip_bounds(
    lo: np.ndarray | None = None, hi: np.ndarray | None = None
) -> tuple[float, float] | None:
    """Clip's ``min`` and ``max`` inputs as floats (absent: float32's lowest and max, the
    spec's defaults, which clip infinities); ``None`` when one is NaN or not a float32
    scalar (the reference then runs)."""
    values = []
    top = float(np.finfo(np.float32).max)
    for bound, default in ((lo, -top), (hi, top)):
        if bound is None:
            values.append(default)
            continue
        if bound.dtype != _FLOAT32 or bound.size != 1:
            return None
        value = float(bound.reshape(()))
        if value != value:
            return None
        values.append(value)
    return values[0], values[1]


def compiled_activation(op_type: str, attrs: dict[str, Any]) -> tuple[str, Sequence[float]] | None:
    """The compiled activation (name and parameters, as ``jit.elementwise.Activation`` takes
    them) that computes ``op_type`` with these attributes (defaults included), or ``None``."""
    if op_type == "Gelu":
        approximate = attrs["approximate"]
        approximate = approximate.decode() if isinstance(approximate, bytes) else approximate
        return {"none": ("Gelu", ()), "tanh": ("FastGelu", ())}.get(approximate)
    if op_type == "Clip":  # a missing bound is float32's lowest or max (the spec's default)
        top = float(np.finfo(np.float32).max)
        return "Clip", (attrs.get("min", -top), attrs.get("max", top))
    if op_type == "LeakyRelu" or op_type == "Swish":
        return op_type, (attrs["alpha"],)
    if op_type == "HardSigmoid":
        return op_type, (attrs["alpha"], attrs["beta"])
    return op_type, ()


def activation_kernel(ep: ExecutionProvider, node: ir.Node, fn: Callable[..., Any]) -> Kernel:
    """The kernel of an activation node: an :class:`ActivationKernel` around the numpy
    reference ``fn`` (its compiled pass built through
    :func:`~nxrt_ep_cpu.compiling.compiled_kernel`: the reference runs until then)."""
    attrs = attribute_values(node)
    defaults = {
        name: p.default
        for name, p in inspect.signature(fn).parameters.items()
        if p.kind is p.KEYWORD_ONLY and p.default is not p.empty
    }
    form = compiled_activation(node.op_type, {**defaults, **attrs})
    if form is None:
        return CpuKernel(fn, attrs)

    def fast() -> CpuKernel:
        from nxrt_ep_cpu.jit import elementwise as compiled_ops

        compiled = compiled_ops.Activation(*form)
        compiled.map(np.zeros(16, np.float32))  # compiles, or loads from the disk cache
        return ActivationKernel(fn, attrs, compiled, ep.parallel)

    threads = ep.parallel.threads if ep.parallel is not None else 1
    return compiled_kernel(
        ep, node, fast, lambda: CpuKernel(fn, attrs), key=("activation", form[0], threads)
    )


def _work(x: np.ndarray) -> np.ndarray:
    """``x`` in a dtype numpy's float ufuncs handle: ml_dtypes floats go to float32."""
    return x if x.dtype.kind in "fc" else x.astype(np.float32)


def _unary(fn, x: np.ndarray) -> np.ndarray:
    """``fn(x)`` computed in a numpy float type, returned in ``x``'s dtype.

    Domain errors (``acos(2)``, ``log(-1)``) give NaN as in IEEE arithmetic, so
    numpy's warnings are silenced.
    """
    with np.errstate(all="ignore"):
        y = fn(_work(x))
    return np.asarray(y).astype(x.dtype, copy=False)


# -- trigonometric and hyperbolic -------------------------------------------------------------


@op("Sin", since=(7, 22))
def sin(x: np.ndarray, /) -> np.ndarray:
    return _unary(np.sin, x)


@op("Cos", since=(7, 22))
def cos(x: np.ndarray, /) -> np.ndarray:
    return _unary(np.cos, x)


@op("Tan", since=(7, 22))
def tan(x: np.ndarray, /) -> np.ndarray:
    return _unary(np.tan, x)


@op("Asin", since=(7, 22))
def asin(x: np.ndarray, /) -> np.ndarray:
    return _unary(np.arcsin, x)


@op("Acos", since=(7, 22))
def acos(x: np.ndarray, /) -> np.ndarray:
    return _unary(np.arccos, x)


@op("Atan", since=(7, 22))
def atan(x: np.ndarray, /) -> np.ndarray:
    return _unary(np.arctan, x)


@op("Sinh", since=(9, 22))
def sinh(x: np.ndarray, /) -> np.ndarray:
    return _unary(np.sinh, x)


@op("Cosh", since=(9, 22))
def cosh(x: np.ndarray, /) -> np.ndarray:
    return _unary(np.cosh, x)


@op("Asinh", since=(9, 22))
def asinh(x: np.ndarray, /) -> np.ndarray:
    return _unary(np.arcsinh, x)


@op("Acosh", since=(9, 22))
def acosh(x: np.ndarray, /) -> np.ndarray:
    return _unary(np.arccosh, x)


@op("Atanh", since=(9, 22))
def atanh(x: np.ndarray, /) -> np.ndarray:
    return _unary(np.arctanh, x)


# -- rounding, sign, reciprocal ---------------------------------------------------------------


@op("Ceil", since=(6, 13))
def ceil(x: np.ndarray, /) -> np.ndarray:
    return _unary(np.ceil, x)


@op("Floor", since=(6, 13))
def floor(x: np.ndarray, /) -> np.ndarray:
    return _unary(np.floor, x)


@op("Round", since=(11, 22))
def round_(x: np.ndarray, /) -> np.ndarray:
    """Round half to even, as numpy does."""
    return _unary(np.round, x)


@op("Sign", since=(9, 13))
def sign(x: np.ndarray, /) -> np.ndarray:
    if x.dtype.kind in "iub":
        return np.asarray(np.sign(x))
    return _unary(np.sign, x)


@op("Reciprocal", since=(6, 13))
def reciprocal(x: np.ndarray, /) -> np.ndarray:
    return _unary(lambda v: np.divide(1, v, dtype=v.dtype), x)


# -- erf --------------------------------------------------------------------------------------

# Cephes' rational approximations (erf.c: erf for |x| <= 1, erfc above), accurate to
# float64 round-off.
_ERF_T = (
    9.60497373987051638749e0,
    9.00260197203842689217e1,
    2.23200534594684319226e3,
    7.00332514112805075473e3,
    5.55923013010394962768e4,
)
_ERF_U = (
    1.0,
    3.35617141647503099647e1,
    5.21357949780152679795e2,
    4.59432382970980127987e3,
    2.26290000613890934246e4,
    4.92673942608635921086e4,
)
_ERFC_P = (
    2.46196981473530512524e-10,
    5.64189564831068821977e-1,
    7.46321056442269912687e0,
    4.86371970985681366614e1,
    1.96520832956077098242e2,
    5.26445194995477358631e2,
    9.34528527171957607540e2,
    1.02755188689515710272e3,
    5.57535335369399327526e2,
)
_ERFC_Q = (
    1.0,
    1.32281951154744992508e1,
    8.67072140885989742329e1,
    3.54937778887819891062e2,
    9.75708501743205489753e2,
    1.82390916687909736289e3,
    2.24633760818710981792e3,
    1.65666309194161350182e3,
    5.57535340817727675546e2,
)


def _polyval(coefficients: tuple[float, ...], x: np.ndarray) -> np.ndarray:
    """Horner's rule, in place on one fresh array."""
    result = np.full_like(x, coefficients[0])
    for c in coefficients[1:]:
        result *= x
        result += c
    return result


def erf_float(x: np.ndarray) -> np.ndarray:
    """The error function (numpy has none), vectorised, in float64 for float64 input and
    float32 otherwise (about 1e-7 relative error there)."""
    x = np.asarray(x, dtype=np.float64 if x.dtype == np.float64 else np.float32)
    shape = x.shape
    x = x.reshape(-1)  # 1-d, so every ufunc below returns an array (0-d gives scalars)
    a = np.abs(x)
    with np.errstate(all="ignore"):
        z = x * x
        small = _polyval(_ERF_T, z)
        small *= x
        small /= _polyval(_ERF_U, z)
        # erfc(|x|) for |x| > 1, clamped at 8 where erfc < 1e-27 and 1 - erfc rounds to 1.
        b = np.minimum(a, 8)  # NaN stays NaN
        large = np.negative(b * b)
        np.exp(large, out=large)
        large *= _polyval(_ERFC_P, b)
        large /= _polyval(_ERFC_Q, b)
        np.subtract(1, large, out=large)
        np.copysign(large, x, out=large)
    return np.where(a <= 1, small, large).reshape(shape)


@op("Erf", since=(9, 13), factory=lambda ep, node: activation_kernel(ep, node, erf))
def erf(x: np.ndarray, /) -> np.ndarray:
    if x.dtype.kind in "iu":
        return np.asarray(np.rint(erf_float(x.astype(np.float64)))).astype(x.dtype)
    return erf_float(x).astype(x.dtype, copy=False)


# -- float classification ---------------------------------------------------------------------


@op("IsNaN", since=(9, 13, 20))
def is_nan(x: np.ndarray, /) -> np.ndarray:
    return np.asarray(np.isnan(_work(x)))


@op("IsInf", since=(10, 20))
def is_inf(x: np.ndarray, /, *, detect_negative: int = 1, detect_positive: int = 1) -> np.ndarray:
    x = _work(x)
    if detect_negative and detect_positive:
        return np.asarray(np.isinf(x))
    if detect_negative:
        return np.asarray(np.isneginf(x))
    if detect_positive:
        return np.asarray(np.isposinf(x))
    return np.zeros(x.shape, dtype=bool)


# -- integer and modular arithmetic -----------------------------------------------------------


@op("Mod", since=(10, 13, 28))
def mod(a: np.ndarray, b: np.ndarray, /, *, fmod: int = 0) -> np.ndarray:
    """``fmod=0``: the result takes the sign of ``b`` (floor); ``fmod=1``: the sign of ``a``.

    Integer division by zero gives 0 rather than an error.
    """
    if fmod not in (0, 1):
        raise KernelFailed(f"Mod: fmod must be 0 or 1, got {fmod}")
    if a.dtype.kind in "f" or a.dtype.kind in "iu":
        wa, wb = a, b
    else:
        wa, wb = _work(a), _work(b)
    with np.errstate(all="ignore"):
        y = np.fmod(wa, wb) if fmod else np.mod(wa, wb)
    return np.asarray(y).astype(a.dtype, copy=False)


# -- activations ------------------------------------------------------------------------------


@op("Elu", since=(6, 22))
def elu(x: np.ndarray, /, *, alpha: float = 1.0) -> np.ndarray:
    return _unary(lambda v: np.where(v < 0, alpha * np.expm1(v), v), x)


@op("Celu", since=(12, 28))
def celu(x: np.ndarray, /, *, alpha: float = 1.0) -> np.ndarray:
    """``max(0, x) + min(0, alpha * (exp(x / alpha) - 1))``, the spec's function evaluated
    as written (with ``alpha = 0`` the ``0 * inf`` of a positive ``x`` is NaN, as in
    onnx.reference and ONNX Runtime)."""

    def formula(v: np.ndarray) -> np.ndarray:
        return np.maximum(v, 0) + np.minimum(alpha * np.expm1(v / alpha), 0)

    return _unary(formula, x)


@op("Selu", since=(6, 22))
def selu(
    x: np.ndarray,
    /,
    *,
    alpha: float = float(np.float32(1.67326319217681884765625)),
    gamma: float = float(np.float32(1.05070102214813232421875)),
) -> np.ndarray:
    return _unary(lambda v: gamma * np.where(v > 0, v, alpha * np.expm1(v)), x)


@op(
    "HardSigmoid", since=(6, 22), factory=lambda ep, node: activation_kernel(ep, node, hard_sigmoid)
)
def hard_sigmoid(
    x: np.ndarray, /, *, alpha: float = float(np.float32(0.2)), beta: float = 0.5
) -> np.ndarray:
    return _unary(lambda v: np.clip(alpha * v + beta, 0, 1), x)


@op("HardSwish", since=(14, 22), factory=lambda ep, node: activation_kernel(ep, node, hard_swish))
def hard_swish(x: np.ndarray, /) -> np.ndarray:
    """``x * HardSigmoid(x)`` with ``alpha = 1/6``, ``beta = 0.5``."""
    return _unary(lambda v: v * np.clip(v * (1 / 6) + 0.5, 0, 1), x)


def _softplus(v: np.ndarray) -> np.ndarray:
    """``log(1 + exp(v))`` without overflow."""
    return np.logaddexp(0, v)


@op("Softplus", since=(1, 22))
def softplus(x: np.ndarray, /) -> np.ndarray:
    return _unary(_softplus, x)


@op("Softsign", since=(1, 22))
def softsign(x: np.ndarray, /) -> np.ndarray:
    return _unary(lambda v: v / (1 + np.abs(v)), x)


@op("Mish", since=(18, 22))
def mish(x: np.ndarray, /) -> np.ndarray:
    """``x * tanh(softplus(x))``."""
    return _unary(lambda v: v * np.tanh(_softplus(v)), x)


def _sigmoid(v: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(v))
    return np.where(v >= 0, 1 / (1 + e), e / (1 + e))


@op("Swish", since=24, factory=lambda ep, node: activation_kernel(ep, node, swish))
def swish(x: np.ndarray, /, *, alpha: float = 1.0) -> np.ndarray:
    """``x * sigmoid(alpha * x)``."""
    return _unary(lambda v: v * _sigmoid(alpha * v), x)


@op("ThresholdedRelu", since=(10, 22))
def thresholded_relu(x: np.ndarray, /, *, alpha: float = 1.0) -> np.ndarray:
    return _unary(lambda v: np.where(v > alpha, v, 0), x)


@op("Shrink", since=9)
def shrink(x: np.ndarray, /, *, bias: float = 0.0, lambd: float = 0.5) -> np.ndarray:
    """``x + bias`` below ``-lambd``, ``x - bias`` above ``lambd``, 0 between (any numeric type)."""
    w = x.astype(np.float64) if x.dtype.kind in "iu" else _work(x)
    y = np.where(w < -lambd, w + bias, np.where(w > lambd, w - bias, 0))
    return y.astype(x.dtype, copy=False)


@op("PRelu", since=(7, 9, 16))
def prelu(x: np.ndarray, slope: np.ndarray, /) -> np.ndarray:
    """``slope * x`` where ``x < 0``; ``slope`` broadcasts to ``x`` (unidirectionally)."""
    if x.dtype.kind in "iu":
        return np.where(x < 0, x * slope, x).astype(x.dtype, copy=False)
    w = _work(x)
    return np.where(w < 0, w * _work(slope), w).astype(x.dtype, copy=False)


_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)


@op("Gelu", since=20, factory=lambda ep, node: activation_kernel(ep, node, gelu))
def gelu(x: np.ndarray, /, *, approximate: str = "none") -> np.ndarray:
    """``x * Phi(x)``; ``approximate="tanh"`` uses the tanh formula."""
    if approximate == "tanh":

        def fn(v):
            inner = _SQRT_2_OVER_PI * (v + 0.044715 * v * v * v)
            return 0.5 * v * (1 + np.tanh(inner))

        return _unary(fn, x)
    if approximate != "none":
        raise KernelFailed(f"Gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    w = _work(x)
    y = erf_float(w * math.sqrt(0.5))
    y += 1
    y *= w
    y *= 0.5
    return y.astype(x.dtype, copy=False)

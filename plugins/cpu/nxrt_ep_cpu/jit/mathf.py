"""float32 exp, tanh, erf and the activations built on them, written so LLVM vectorizes them.

A loop that calls ``math.exp`` calls libm once per value and runs no faster
than numpy. These are polynomials and one bit cast, inlined into the calling
loop: the loop then runs 16 lanes at a time on AVX-512. Each is within a few
float32 ulps of the exact function over the whole float32 range, keeps NaN
a NaN and gives the limits at +-inf (the tests check all three against
numpy's float64 results).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from nxrt_ep_cpu.jit import inline


@intrinsic
def _float_from_bits(typingctx, bits):  # pragma: no cover - numba typing
    """The float32 whose bit pattern is the low 32 bits of the integer ``bits`` (a register
    move, no libm)."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        word = args[0]
        if bits.bitwidth != 32:
            word = builder.trunc(word, ir.IntType(32))
        return builder.bitcast(word, ir.FloatType())

    return types.float32(bits), codegen


_LOG2E = np.float32(1.4426950408889634)
_LN2_HI = np.float32(0.693359375)  # ln 2 split in two: n * hi is exact for |n| <= 128
_LN2_LO = np.float32(-2.12194440e-4)
#: exp's argument range: beyond it float32 exp is inf, or below the normal floats.
_EXP_HI = np.float32(88.72283)
_EXP_LO = np.float32(-87.33654)
# exp(r) - 1 - r on |r| <= ln2/2, Cephes' expf coefficients (Horner's rule in r)
_E0 = np.float32(1.9875691500e-4)
_E1 = np.float32(1.3981999507e-3)
_E2 = np.float32(8.3334519073e-3)
_E3 = np.float32(4.1665795894e-2)
_E4 = np.float32(1.6666665459e-1)
_E5 = np.float32(5.0000001201e-1)
_ONE = np.float32(1.0)
_HALF = np.float32(0.5)
_TWO = np.float32(2.0)
_ZERO = np.float32(0.0)
_INF = np.float32(np.inf)
_TANH_SMALL = np.float32(0.625)
_T0 = np.float32(-5.70498872745e-3)
_T1 = np.float32(2.06390887954e-2)
_T2 = np.float32(-5.37397155531e-2)
_T3 = np.float32(1.33314422036e-1)
_T4 = np.float32(-3.33332819422e-1)


@inline
def exp(x):  # pragma: no cover - compiled by numba
    """``e**x`` for a float32 ``x``: ``2**n * e**r`` with ``r = x - n ln 2``."""
    c = min(max(x, _EXP_LO), _EXP_HI)
    n = np.float32(np.floor(c * _LOG2E + _HALF))
    r = c - n * _LN2_HI - n * _LN2_LO
    p = ((((_E0 * r + _E1) * r + _E2) * r + _E3) * r + _E4) * r + _E5
    p = p * r * r + r + _ONE
    # 2**n as two halves, so n = 128 (x near the top of the range) stays a normal float
    k = np.int32(n)
    half = k >> 1
    y = p * _float_from_bits((half + 127) << 23) * _float_from_bits((k - half + 127) << 23)
    if x > _EXP_HI:
        y = _INF
    if x < _EXP_LO:
        y = _ZERO
    if x != x:
        y = x
    return np.float32(y)


@inline
def exp_clamped(x):  # pragma: no cover - compiled by numba
    """:func:`exp` without its edge cases, for ``1 / (1 + e**x)`` forms: ``x`` clamped to
    exp's range and one ``2**n`` scale, so that x above 88.03 gives inf (n = 128) and below
    -87.34 gives e**-87.34; such a form reaches the same limits there. NaN is the caller's
    to keep. A third fewer operations: Swish over 400 K values 0.54 -> 0.40 ns a value."""
    c = min(max(x, _EXP_LO), _EXP_HI)
    n = np.float32(np.floor(c * _LOG2E + _HALF))
    r = c - n * _LN2_HI - n * _LN2_LO
    p = ((((_E0 * r + _E1) * r + _E2) * r + _E3) * r + _E4) * r + _E5
    p = p * r * r + r + _ONE
    return np.float32(p * _float_from_bits((np.int32(n) + 127) << 23))


@inline
def sigmoid(x):  # pragma: no cover - compiled by numba
    """``1 / (1 + e**-x)``, computed from ``e**-|x|`` so neither side overflows."""
    e = exp(-abs(x))
    s = _ONE / (_ONE + e)
    return np.float32(s if x >= _ZERO else e * s) if x == x else x


@inline
def tanh(x):  # pragma: no cover - compiled by numba
    """``tanh x``: a rational approximation near 0, ``1 - 2 / (e**2|x| + 1)`` elsewhere
    (both computed, one kept: a branch would stop the loop vectorizing)."""
    a = abs(x)
    z = x * x  # Cephes' tanhf polynomial, within 2 ulps on |x| < 0.625
    p = (((_T0 * z + _T1) * z + _T2) * z + _T3) * z + _T4
    small = x + x * z * p
    big = _ONE - _TWO / (exp(_TWO * a) + _ONE)
    big = big if x > _ZERO else -big
    y = small if a < _TANH_SMALL else big
    return np.float32(y) if x == x else x


# erf on [-4, 4] as x P(x^2) / Q(x^2) (Eigen's float32 erf); outside it erf is +-1 in float32
_P0 = np.float32(-2.72614225801306e-10)
_P1 = np.float32(2.77068142495902e-08)
_P2 = np.float32(-2.10102402082508e-06)
_P3 = np.float32(-5.69250639462346e-05)
_P4 = np.float32(-7.34990630326855e-04)
_P5 = np.float32(-2.95459980854025e-03)
_P6 = np.float32(-1.60960333262415e-02)
_Q0 = np.float32(-1.45660718464996e-05)
_Q1 = np.float32(-2.13374055278905e-04)
_Q2 = np.float32(-1.68282697438203e-03)
_Q3 = np.float32(-7.37332916720468e-03)
_Q4 = np.float32(-1.42647390514189e-02)
_FOUR = np.float32(4.0)


@inline
def erf(x):  # pragma: no cover - compiled by numba
    """The error function, within 5e-7 of the exact value."""
    c = min(max(x, -_FOUR), _FOUR)
    z = c * c
    p = (((((_P0 * z + _P1) * z + _P2) * z + _P3) * z + _P4) * z + _P5) * z + _P6
    q = (((_Q0 * z + _Q1) * z + _Q2) * z + _Q3) * z + _Q4
    e = min(max(c * p / q, -_ONE), _ONE)  # the rational form overshoots 1 by 4e-7 near 4
    return np.float32(e) if x == x else x


_SQRT_HALF = np.float32(np.sqrt(0.5))
_SQRT_2_OVER_PI = np.float32(np.sqrt(2 / np.pi))
_GELU_CUBE = np.float32(0.044715)


@inline
def gelu(x):  # pragma: no cover - compiled by numba
    """``x Phi(x) = x (1 + erf(x / sqrt 2)) / 2`` (exact GELU)."""
    return np.float32(_HALF * x * (_ONE + erf(x * _SQRT_HALF)))


@inline
def gelu_tanh(x):  # pragma: no cover - compiled by numba
    """GELU's tanh approximation, ``x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) / 2``."""
    return np.float32(_HALF * x * (_ONE + tanh(_SQRT_2_OVER_PI * (x + _GELU_CUBE * x * x * x))))

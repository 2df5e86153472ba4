"""The integer kernels of the quantized ops: weights packed once, products exact in int32.

QLinearConv, QLinearMatMul, MatMulInteger and the com.microsoft QGemm and
MatMulIntegerToFloat run on :mod:`nxrt_ep_cpu.jit.qgemm`'s engine (VNNI's
u8 x s8 multiply-add where the CPU has it, int16 pairs elsewhere), and
DynamicQuantizeLinear in one compiled pass. Each kernel prepares its constant
operands (packs the weights, folds the zero points and the int32 bias into
one correction per output channel, computes the requantization multipliers)
on its first run and again only when they change, so the session's constants
are packed once. Anything the engine does not take (other dtypes, per-row
activation scales, a batch of weight matrices) runs the numpy kernel, which
computes the same numbers.

Requantization is ONNX Runtime's: ``rint(float32(acc + bias) * m) + zero_point``
saturated, with ``m = float32(x_scale * w_scale) / y_scale`` in float32 (the
numpy kernels in ``quant.py`` do the same, so both tiers agree bit for bit).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from nxrt.errors import KernelFailed
from nxrt.kernel import attribute_values
from nxrt_ep_cpu.compiling import compiled_kernel
from nxrt_ep_cpu.kernels import CpuKernel, compiled, pool_team, run_team
from nxrt_ep_cpu.ops._conv_reference import conv_windows

if TYPE_CHECKING:
    import onnx_ir as ir

    from nxrt.host_parallel import HostParallel
    from nxrt.provider import ExecutionProvider

_BYTES = (np.dtype(np.uint8), np.dtype(np.int8))
_RANGES = {np.dtype(np.uint8): (0, 255), np.dtype(np.int8): (-128, 127)}
#: Multiply-adds below which a product runs on one thread: about 100 us of VNNI work. A
#: parallel region starts in ~1.5 us on an idle machine, but waking a sleeping worker on a
#: loaded one takes a scheduler slot (measured on a shared 2-core machine: 1 ms median),
#: so only products that long are split.
_SPLIT_MACS = 1 << 24


def multiplier(
    a_scale: np.ndarray, b_scale: np.ndarray, y_scale: np.ndarray | np.floating
) -> np.ndarray:
    """``float32(a_scale * b_scale) / y_scale`` in float32: the requantization factor."""
    f32 = np.float32
    return (np.asarray(a_scale, f32) * np.asarray(b_scale, f32) / np.asarray(y_scale, f32)).astype(
        f32
    )


def _qlevel(values: np.ndarray) -> str:
    """The engine level for weights ``values`` (zero points removed): VNNI takes them where
    they fit signed bytes, else the int16 pairs, which take any 8-bit operands."""
    from nxrt_ep_cpu.jit import qgemm

    name = qgemm.level()
    if qgemm.LEVELS[name].vnni and (values.min(initial=0) < -128 or values.max(initial=0) > 127):
        return "pairs"
    return name


def _scalar(value: np.ndarray | None) -> bool:
    return value is None or np.asarray(value).size == 1


def _same(kept: tuple[Any, ...] | None, current: tuple[Any, ...]) -> bool:
    """Whether ``current`` are the very arrays a preparation was made from."""
    return (
        kept is not None
        and len(kept) == len(current)
        and all(a is b for a, b in zip(kept, current))
    )


def _parts(team: int, items: int, macs: int) -> int:
    return min(team, items) if team > 1 and macs > _SPLIT_MACS else 1


# -- matrix products -------------------------------------------------------------------------


class _Weights:
    """A constant ``(K, N)`` integer matrix packed for the engine, zero point removed."""

    def __init__(self, b: np.ndarray, zero: np.ndarray | None) -> None:
        from nxrt_ep_cpu.jit import qgemm

        values = b.astype(np.int32)
        if zero is not None:
            values = values - np.asarray(zero, np.int32).reshape(-1)  # per column broadcasts
        self.k, self.n = b.shape
        self.level = _qlevel(values)
        self.kernels = qgemm.kernels(self.level)
        chosen = qgemm.LEVELS[self.level]
        self.rows = chosen.rows
        self.panels = qgemm.pack_panels(values, self.level)
        self.padded = self.panels.shape[0] * chosen.width
        self.groups = self.panels.shape[1]
        self.vnni = chosen.vnni
        self.sums = np.zeros(self.padded, np.int64)
        self.sums[: self.n] = values.sum(axis=0, dtype=np.int64)
        self._warmed: set[tuple[Any, ...]] = set()

    def warm(self, a_dtype: Any, out_dtype: Any, mode: int, split: bool) -> None:
        """Compile the loops for these types now (see :meth:`_ConvPlan.warm`)."""
        a = np.zeros((0, self.k), a_dtype)
        words = np.zeros((0, self.groups), np.uint32)
        self.kernels.row_words(a, words, np.uint8(0), 0)
        out = np.zeros((0, self.n), out_dtype)
        none = np.zeros(0, np.float32)
        args = (words, self.panels, out, mode, np.zeros(0, np.int32), none, none, 0, 0, 0)
        self.kernels.matmul(*args, 0, 0)
        if split:
            self.kernels.matmul_team(*args, np.zeros(2, np.int64))

    def rows_of(self, a: np.ndarray, zero: int) -> tuple[np.ndarray, int]:
        """``a`` (M, K) as the engine's row words, and the zero point left to correct
        (VNNI reads bytes as they are, unsigned: int8 ones shifted by 128)."""
        m = a.shape[0]
        padded = -(-m // self.rows) * self.rows
        words = np.empty((padded, self.groups), np.uint32)
        if self.vnni:
            signed = a.dtype == np.int8
            self.kernels.row_words(a, words, np.uint8(0x80 if signed else 0), 0)
            return words, zero + (128 if signed else 0)
        self.kernels.row_words(a, words, np.uint8(0), zero)
        return words, 0

    def product(
        self,
        a: np.ndarray,
        zero: int,
        out: np.ndarray,
        mode: int,
        corr: np.ndarray,
        scale: np.ndarray,
        bias: np.ndarray,
        zy: int,
        low: int,
        high: int,
        team: int,
        parallel: HostParallel | None,
    ) -> None:
        """``out`` (M, N) from the rows ``a`` (M, K): see ``qgemm.matmul``'s modes; ``corr``
        (int64, padded) is added to every row, less ``zero`` times the column sums."""
        signature = (a.dtype, out.dtype, mode)
        if signature not in self._warmed:
            self.warm(a.dtype, out.dtype, mode, team > 1)
            self._warmed.add(signature)
        words, left = self.rows_of(a, zero)
        total = (corr - left * self.sums).astype(np.int32) if left else corr.astype(np.int32)
        items = self.panels.shape[0] * (words.shape[0] // self.rows)
        parts = _parts(team, items, a.shape[0] * self.k * self.n)
        threads = run_team(parts, parallel) if parts > 1 else 1
        args = (words, self.panels, out, mode, total, scale, bias, zy, low, high)
        if parts > 1 and threads > 1:
            pool = compiled("threads")
            pool.size_team(threads)
            self.kernels.matmul_team(*args, pool.bounds(items, parts))
        else:
            self.kernels.matmul(*args, 0, items)


def _padded(values: Any, size: int, dtype: Any, fill: float = 0) -> np.ndarray:
    """``values`` (one, or one per column) spread over ``size`` columns, ``fill`` after."""
    flat = np.asarray(values, dtype).reshape(-1)
    out = np.full(size, fill, dtype)
    if flat.size == 1:
        out[:] = flat[0]
    else:
        out[: flat.size] = flat
    return out


class _MatMulBase(CpuKernel):
    """A matrix product by constant weights on the integer engine; the numpy kernel for
    everything else (it is also what runs until the weights are known)."""

    #: Input positions of B and its zero point.
    weight_index = 1
    weight_zero_index = 3

    def __init__(self, fn: Callable[..., Any], attrs: dict[str, Any], parallel) -> None:
        super().__init__(fn, attrs, variant="integer", variant_reason=_reason())
        self.parallel = parallel
        self.team = pool_team(parallel)
        self._kept: tuple[Any, ...] | None = None
        self._weights: _Weights | None = None

    @property
    def direct_call(self) -> Callable[..., Any]:
        return self.run

    def run(self, *inputs: Any) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError

    def weights(self, b: np.ndarray, zero: np.ndarray | None) -> _Weights | None:
        """The packed weights, packed again only when ``b`` or ``zero`` change."""
        if not _same(self._kept, (b, zero)):
            self._weights = None
            self._kept = (b, zero)
            if b.ndim == 2 and b.dtype in _BYTES and (zero is None or zero.dtype == b.dtype):
                n = b.shape[1]
                if zero is None or zero.size in (1, n) and zero.ndim <= 1:
                    self._weights = _Weights(b, zero)
        return self._weights


def _rows(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a.reshape(math.prod(a.shape[:-1]), a.shape[-1]))


def _zero_of(zero: np.ndarray | None) -> int | None:
    """A per-tensor zero point as an int, ``None`` when it is not one value."""
    if zero is None:
        return 0
    return int(np.asarray(zero).reshape(-1)[0]) if zero.size == 1 else None


class MatMulIntegerKernel(_MatMulBase):
    """MatMulInteger by constant 2-D weights: int32 ``(A - a_zero_point) @ (B - b_zero_point)``."""

    def run(self, a, b, a_zero_point=None, b_zero_point=None):
        packed = self.weights(b, b_zero_point)
        zero = _zero_of(a_zero_point)
        if packed is None or a.dtype not in _BYTES or a.ndim < 2 or zero is None:
            return self._call(a, b, a_zero_point, b_zero_point)
        if a.shape[-1] != packed.k:
            return self._call(a, b, a_zero_point, b_zero_point)
        rows = _rows(a)
        out = np.empty((rows.shape[0], packed.n), np.int32)
        corr = np.zeros(packed.padded, np.int64)
        none = np.zeros(0, np.float32)
        packed.product(rows, zero, out, 0, corr, none, none, 0, 0, 0, self.team, self.parallel)
        return out.reshape(a.shape[:-1] + (packed.n,))


class MatMulIntegerToFloatKernel(_MatMulBase):
    """com.microsoft MatMulIntegerToFloat: ``float32(acc) * float32(a_scale * b_scale) +
    bias``, the int32 product never stored (what MatMulInteger, Cast, Mul and Add compute,
    bit for bit)."""

    weight_zero_index = 5

    def run(self, a, b, a_scale, b_scale, a_zero_point=None, b_zero_point=None, bias=None):
        packed = self.weights(b, b_zero_point)
        zero = _zero_of(a_zero_point)
        args = (a, b, a_scale, b_scale, a_zero_point, b_zero_point, bias)
        if packed is None or a.dtype not in _BYTES or a.ndim < 2 or zero is None:
            return self._call(*args)
        n = packed.n
        if a.shape[-1] != packed.k or not _scalar(a_scale) or b_scale.size not in (1, n):
            return self._call(*args)
        if bias is not None and (bias.size != n or bias.dtype != np.float32):
            return self._call(*args)
        if a_scale.dtype != np.float32 or b_scale.dtype != np.float32:
            return self._call(*args)
        rows = _rows(a)
        out = np.empty((rows.shape[0], n), np.float32)
        scale = _padded(a_scale.reshape(-1)[0] * b_scale.reshape(-1), packed.padded, np.float32)
        bias_ = (
            np.zeros(0, np.float32) if bias is None else _padded(bias, packed.padded, np.float32)
        )
        corr = np.zeros(packed.padded, np.int64)
        packed.product(rows, zero, out, 1, corr, scale, bias_, 0, 0, 0, self.team, self.parallel)
        return out.reshape(a.shape[:-1] + (n,))


class _Requantized(_MatMulBase):
    """A product requantized to 8 bits: the multipliers and the int32 bias are prepared
    with the weights."""

    def __init__(self, fn, attrs, parallel) -> None:
        super().__init__(fn, attrs, parallel)
        self._terms_kept: tuple[Any, ...] | None = None
        self._terms: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def terms(self, packed: _Weights, key: tuple[Any, ...], mult, bias_int) -> tuple[Any, ...]:
        if not _same(self._terms_kept, key):
            self._terms_kept = key
            corr = np.zeros(packed.padded, np.int64)
            if bias_int is not None:
                corr[: packed.n] = np.asarray(bias_int, np.int64).reshape(-1)
            self._terms = (corr, _padded(mult, packed.padded, np.float32, 1.0),
                           np.zeros(packed.padded, np.float32))  # fmt: skip
        assert self._terms is not None
        return self._terms

    def requantize(self, a, zero, packed, terms, y_zero_point, shape):
        dtype = y_zero_point.dtype if y_zero_point is not None else np.dtype(np.uint8)
        low, high = _RANGES[np.dtype(dtype)]
        zy = _zero_of(y_zero_point)
        rows = _rows(a)
        out = np.empty((rows.shape[0], packed.n), dtype)
        corr, mult, beta = terms
        packed.product(rows, zero, out, 2, corr, mult, beta, zy, low, high, self.team,
                       self.parallel)  # fmt: skip
        return out.reshape(shape)


class QLinearMatMulKernel(_Requantized):
    """QLinearMatMul by constant weights (per-tensor or per-column scale and zero point)."""

    weight_index, weight_zero_index = 3, 5

    def run(self, a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point):
        args = (a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point)
        packed = self.weights(b, b_zero_point)
        zero = _zero_of(a_zero_point)
        if packed is None or a.dtype not in _BYTES or a.ndim < 2 or zero is None:
            return self._call(*args)
        n = packed.n
        if a.shape[-1] != packed.k or not (_scalar(a_scale) and _scalar(y_scale)):
            return self._call(*args)
        if b_scale.size not in (1, n) or not _scalar(y_zero_point):
            return self._call(*args)
        if y_zero_point is None or y_zero_point.dtype not in _BYTES:
            return self._call(*args)
        key = (a_scale, b_scale, y_scale, packed)
        terms = self.terms(packed, key, multiplier(a_scale, b_scale, y_scale).reshape(-1), None)
        return self.requantize(a, zero, packed, terms, y_zero_point, a.shape[:-1] + (n,))


class QGemmKernel(_Requantized):
    """com.microsoft QGemm by constant ``B`` (``transB`` applied when packing), ``A`` not
    transposed: quantized output with ``y_scale``, float32 without."""

    weight_index, weight_zero_index = 3, 5

    def __init__(self, fn, attrs, parallel) -> None:
        super().__init__(fn, attrs, parallel)
        self.alpha = float(attrs.get("alpha", 1.0))
        self.trans_a = bool(attrs.get("transA", 0))
        self.trans_b = bool(attrs.get("transB", 0))
        self._b: tuple[Any, np.ndarray] | None = None

    def weights(self, b, zero):
        if self.trans_b and b.ndim == 2:
            if self._b is None or self._b[0] is not b:
                self._b = (b, np.ascontiguousarray(b.T))
            b = self._b[1]
        return super().weights(b, zero)

    def run(self, a, a_scale, a_zero_point, b, b_scale, b_zero_point, c=None, y_scale=None,
            y_zero_point=None):  # fmt: skip
        args = (a, a_scale, a_zero_point, b, b_scale, b_zero_point, c, y_scale, y_zero_point)
        packed = self.weights(b, b_zero_point)
        zero = _zero_of(a_zero_point)
        if packed is None or self.trans_a or a.ndim != 2 or a.dtype not in _BYTES or zero is None:
            return self._call(*args)
        n = packed.n
        if a.shape[1] != packed.k or not _scalar(a_scale) or b_scale.size not in (1, n):
            return self._call(*args)
        if c is not None and (c.dtype != np.int32 or c.size not in (1, n)):
            return self._call(*args)
        scale = np.float32(self.alpha) * multiplier(a_scale, b_scale, np.float32(1.0))
        if y_scale is None:
            key = (a_scale, b_scale, c, packed)
            terms = self.terms(packed, key, scale.reshape(-1), c)
            out = np.empty((a.shape[0], n), np.float32)
            corr, mult, _ = terms
            none = np.zeros(0, np.float32)
            packed.product(_rows(a), zero, out, 1, corr, mult, none, 0, 0, 0, self.team,
                           self.parallel)  # fmt: skip
            return out
        if not _scalar(y_scale) or y_zero_point is None or y_zero_point.dtype not in _BYTES:
            return self._call(*args)
        key = (a_scale, b_scale, c, y_scale, packed)
        mult = (scale / np.asarray(y_scale, np.float32)).astype(np.float32).reshape(-1)
        terms = self.terms(packed, key, mult, c)
        return self.requantize(a, zero, packed, terms, y_zero_point, (a.shape[0], n))


# -- convolution -------------------------------------------------------------------------------


class _ConvPlan:
    """A QLinearConv's constant operands packed for one input shape and dtype."""

    def __init__(self, x_shape, x_dtype, zero_x, w, w_zero, corr_bias, mult, y_dtype, zy, attrs):
        from nxrt_ep_cpu.jit import qgemm

        n, c, h, width = x_shape
        m = w.shape[0]
        group = int(attrs.get("group", 1))
        win = conv_windows(
            x_shape,
            w.shape,
            auto_pad=attrs.get("auto_pad", "NOTSET"),
            dilations=attrs.get("dilations"),
            group=group,
            kernel_shape=attrs.get("kernel_shape"),
            pads=attrs.get("pads"),
            strides=attrs.get("strides"),
        )
        if min(win.begin + win.end) < 0:
            raise KernelFailed("cropping pads")
        values = w.astype(np.int32)
        if w_zero is not None:
            values = values - np.asarray(w_zero, np.int32).reshape((-1, 1, 1, 1))
        self.level = _qlevel(values)
        self.kernels = qgemm.kernels(self.level)
        chosen = qgemm.LEVELS[self.level]
        g, per_in, per_out = group, c // group, m // group
        kh, kw = w.shape[2], w.shape[3]
        words_per = -(-per_in // chosen.group)
        (top, left), (bottom, right) = win.begin, win.end
        self.rows_p, self.cols_p = h + top + bottom, width + left + right
        self.top, self.left = top, left
        oh, ow = win.out
        # weights (groups, filters, taps, channels padded to whole words) as words
        spread = np.zeros((g, per_out, kh * kw, words_per * chosen.group), np.int32)
        spread[..., :per_in] = values.reshape(g, per_out, per_in, kh * kw).transpose(0, 1, 3, 2)
        flat = spread.reshape(g, per_out, -1)
        self.w = np.stack([qgemm.pack_rows(flat[i], self.level) for i in range(g)])
        dh, dw = win.dilations
        self.taps = np.array(
            [i * dh * self.cols_p + j * dw for i in range(kh) for j in range(kw)], np.int64
        )
        pixels = oh * ow
        panels = -(-pixels // chosen.width)
        sh, sw = win.strides
        self.geo = np.array([ow, sh, sw, pixels, per_out, panels], np.int64)
        self.items = g * panels
        self.shape = (n, m, oh, ow)
        self.groups, self.per_in, self.words_per = g, per_in, words_per
        self.macs = m * per_in * kh * kw * pixels
        signed = x_dtype == np.int8
        if chosen.vnni:  # bytes as they are (int8 shifted by 128), the zero point corrected
            self.flip, self.shift = (0x80 if signed else 0), 0
            pad_byte = (zero_x + (128 if signed else 0)) & 0xFF
            self.pad = np.uint32(pad_byte * 0x01010101)
            sums = values.reshape(m, -1).sum(axis=1, dtype=np.int64)
            corr = corr_bias - (zero_x + (128 if signed else 0)) * sums
        else:  # int16 x - zero point, padding 0
            self.flip, self.shift, self.pad = 0, zero_x, np.uint32(0)
            corr = corr_bias
        self.corr = corr.astype(np.int32)
        self.mult = mult
        self.beta = np.zeros(m, np.float32)
        self.y_dtype = y_dtype
        self.zy = zy
        self.low, self.high = _RANGES[np.dtype(y_dtype)]
        self.xb = None

    def warm(self, split: bool) -> None:
        """Compile the loops (or load them from the disk cache) for this plan's types now,
        the split one too where runs may split: no compile in the middle of a run."""
        xb = np.zeros((self.groups, self.words_per, self.rows_p, self.cols_p), np.uint32)
        out = np.empty(self.shape[1:], self.y_dtype)
        args = (xb, self.w, out, self.geo, self.taps, self.corr, self.mult, self.beta, self.zy,
                self.low, self.high)  # fmt: skip
        self.kernels.conv(*args, 0, 0)
        if split:
            self.kernels.conv_team(*args, np.zeros(2, np.int64))

    def run(self, x: np.ndarray, team: int, parallel) -> np.ndarray:
        n = x.shape[0]
        out = np.empty(self.shape, self.y_dtype)
        xb = np.empty((self.groups, self.words_per, self.rows_p, self.cols_p), np.uint32)
        parts = _parts(team, self.items, self.macs)
        threads = run_team(parts, parallel) if parts > 1 else 1
        k = self.kernels
        for image in range(n):
            grouped = x[image].reshape(self.groups, self.per_in, x.shape[2], x.shape[3])
            k.blocked_input(grouped, xb, np.uint8(self.flip), self.shift, self.pad, self.top,
                            self.left)  # fmt: skip
            args = (xb, self.w, out[image], self.geo, self.taps, self.corr, self.mult, self.beta,
                    self.zy, self.low, self.high)  # fmt: skip
            if parts > 1 and threads > 1:
                pool = compiled("threads")
                pool.size_team(threads)
                k.conv_team(*args, pool.bounds(self.items, parts))
            else:
                k.conv(*args, 0, self.items)
        return out


class _DepthwisePlan:
    """A depthwise QLinearConv (one filter per channel): direct int32 sums per output row,
    the input shifted by its zero point into int16 (so the padding is 0)."""

    def __init__(self, x_shape, zero_x, w, w_zero, corr_bias, mult, y_dtype, zy, win) -> None:
        from nxrt_ep_cpu.jit import qgemm

        self.loops = qgemm
        values = w.astype(np.int32)
        if w_zero is not None:
            values = values - np.asarray(w_zero, np.int32).reshape((-1, 1, 1, 1))
        c, kh, kw = w.shape[0], w.shape[2], w.shape[3]
        self.w = np.ascontiguousarray(values.reshape(c, kh * kw))
        (top, left), (bottom, right) = win.begin, win.end
        self.top, self.left = top, left
        self.padded = (c, x_shape[2] + top + bottom, x_shape[3] + left + right)
        self.geo = np.array([kh, kw, *win.strides, *win.dilations], np.int64)
        self.shape = (x_shape[0], c, *win.out)
        self.zero_x, self.corr, self.mult = zero_x, corr_bias.astype(np.int32), mult
        self.y_dtype, self.zy = y_dtype, zy
        self.low, self.high = _RANGES[np.dtype(y_dtype)]

    def warm(self, split: bool) -> None:
        x = np.zeros((0, 1, 1), np.uint8)
        self.loops.shifted_input(x, np.zeros((0, 1, 1), np.int16), 0, 0, 0)
        self.loops.depthwise(np.zeros((0, 1, 1), np.int16), self.w, np.zeros((0, 1, 1),
                             self.y_dtype), self.geo, self.corr, self.mult, self.zy, self.low,
                             self.high)  # fmt: skip

    def run(self, x: np.ndarray, team: int, parallel) -> np.ndarray:
        out = np.empty(self.shape, self.y_dtype)
        xp = np.empty(self.padded, np.int16)
        for image in range(x.shape[0]):
            self.loops.shifted_input(x[image], xp, self.zero_x, self.top, self.left)
            self.loops.depthwise(xp, self.w, out[image], self.geo, self.corr, self.mult,
                                 self.zy, self.low, self.high)  # fmt: skip
        return out


class QLinearConvKernel(CpuKernel):
    """2-D QLinearConv on the integer engine: per-tensor input and output quantization,
    weights per tensor or per output channel, an int32 bias; other ranks and dtypes run
    the numpy kernel."""

    def __init__(self, fn, attrs, parallel) -> None:
        super().__init__(fn, attrs, variant="integer", variant_reason=_reason())
        self.parallel = parallel
        self.team = pool_team(parallel)
        self._kept: tuple[Any, ...] | None = None
        self._plan: _ConvPlan | _DepthwisePlan | None = None

    @property
    def direct_call(self) -> Callable[..., Any]:
        return self.run

    def run(self, x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point,
            b=None):  # fmt: skip
        args = (x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, b)
        key = (x.shape, x.dtype, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale,
               y_zero_point, b)  # fmt: skip
        if self._kept is None or not (self._kept[:2] == key[:2] and _same(self._kept[2:], key[2:])):
            self._kept = key
            self._plan = self._prepare(*args)
        if self._plan is None:
            return self._call(*args)
        return self._plan.run(x, self.team, self.parallel)

    def _prepare(self, x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale,
                 y_zero_point, b) -> _ConvPlan | _DepthwisePlan | None:  # fmt: skip
        m = w.shape[0] if w.ndim else 0
        if x.ndim != 4 or w.ndim != 4 or x.dtype not in _BYTES or w.dtype not in _BYTES:
            return None
        if not (_scalar(x_scale) and _scalar(x_zero_point) and _scalar(y_scale)):
            return None
        if w_scale.size not in (1, m) or (
            w_zero_point is not None and w_zero_point.size not in (1, m)
        ):
            return None
        if y_zero_point is None or y_zero_point.dtype not in _BYTES or y_zero_point.size != 1:
            return None
        if b is not None and (b.dtype != np.int32 or b.size != m):
            return None
        corr = np.zeros(m, np.int64) if b is None else b.astype(np.int64).reshape(-1)
        factor = multiplier(x_scale.reshape(()), w_scale.reshape(-1), y_scale.reshape(()))
        mult = np.broadcast_to(factor, (m,)).astype(np.float32)
        group = int(self.attrs.get("group", 1))
        if group > 1 and group == x.shape[1] == m and w.shape[1] == 1:
            try:
                win = conv_windows(
                    x.shape,
                    w.shape,
                    auto_pad=self.attrs.get("auto_pad", "NOTSET"),
                    dilations=self.attrs.get("dilations"),
                    group=group,
                    kernel_shape=self.attrs.get("kernel_shape"),
                    pads=self.attrs.get("pads"),
                    strides=self.attrs.get("strides"),
                )
            except KernelFailed:
                return None
            if min(win.begin + win.end) < 0:
                return None
            zeros = (_zero_of(x_zero_point), _zero_of(y_zero_point))
            plan: Any = _DepthwisePlan(x.shape, zeros[0], w, w_zero_point, corr, mult,
                                       y_zero_point.dtype, zeros[1], win)  # fmt: skip
            plan.warm(False)
            return plan
        try:
            plan = _ConvPlan(x.shape, x.dtype, _zero_of(x_zero_point), w, w_zero_point, corr, mult,
                             y_zero_point.dtype, _zero_of(y_zero_point), self.attrs)  # fmt: skip
        except KernelFailed:
            return None
        plan.warm(self.team > 1)
        return plan


# -- DynamicQuantizeLinear -----------------------------------------------------------------------


def range_parameters(high: Any, low: Any) -> tuple[np.float32, np.float32]:
    """DynamicQuantizeLinear's ``(scale, zero point)`` from ``max(x)`` and ``min(x)``.

    The range covers 0; an all-zero input has no range and gets scale 1, as in
    onnxruntime and the C++ line onnx.reference quotes (the spec's formula would
    divide by a zero scale). The zero point saturates as onnxruntime's
    ``std::max(0, std::min(255, zp))``: an infinite input's NaN zero point is 255.
    """
    high = np.float32(max(0.0, float(high)))
    low = np.float32(min(0.0, float(low)))
    scale = (high - low) / np.float32(255) if high != low else np.float32(1)
    zero = np.rint(np.float32(max(0.0, min(255.0, float(np.float32(0) - low / scale)))))
    return np.float32(scale), np.float32(zero)


def dynamic_range(x: np.ndarray) -> tuple[np.float32, np.float32] | None:
    """:func:`range_parameters` of a non-empty float32 ``x`` whose values are all finite;
    ``None`` otherwise (the numpy kernel handles those)."""
    high, low = np.max(x), np.min(x)
    if not (np.isfinite(high) and np.isfinite(low)):
        return None
    return range_parameters(high, low)


class DynamicQuantizeKernel(CpuKernel):
    """DynamicQuantizeLinear of float32: the range from numpy's reductions, the division,
    rounding and saturation in one compiled pass (same operations as the numpy kernel)."""

    def __init__(self, fn, attrs) -> None:
        super().__init__(fn, attrs, variant="numba", variant_reason="float32 in one pass")
        from nxrt_ep_cpu.jit import qgemm

        self._quantize = qgemm.quantize_range

    @property
    def direct_call(self) -> Callable[..., Any]:
        return self.run

    def run(self, x):
        if x.dtype != np.float32 or not x.size:
            return self._call(x)
        params = dynamic_range(x)
        if params is None:
            return self._call(x)
        scale, zero = params
        y = np.empty(x.shape, np.uint8)
        self._quantize(np.ascontiguousarray(x), y, scale, zero)
        return y, np.array(scale, np.float32), np.array(zero, np.uint8)


# -- QuantizeLinear, DequantizeLinear, and the Add between them, per tensor ----------------------


def _per_tensor_param(scale: np.ndarray, zero: np.ndarray | None) -> bool:
    return scale.dtype == np.float32 and scale.size == 1 and (zero is None or zero.size == 1)


class _Elementwise(CpuKernel):
    """A per-tensor quantization op in one compiled pass; the numpy kernel for the rest."""

    #: The compiled op, defined by each subclass.
    run: Callable[..., Any]

    def __init__(self, fn, attrs) -> None:
        super().__init__(fn, attrs, variant="numba", variant_reason="per tensor, one pass")
        from nxrt_ep_cpu.jit import qgemm

        self.loops = qgemm
        self.plain = not attrs.get("block_size", 0) and attrs.get("precision", 0) in (0, 1)

    @property
    def direct_call(self) -> Callable[..., Any]:
        return self.run


class QuantizeKernel(_Elementwise):
    """QuantizeLinear of float32 to uint8 or int8 with one scale and zero point."""

    def __init__(self, fn, attrs) -> None:
        super().__init__(fn, attrs)
        self.output_dtype = int(attrs.get("output_dtype", 0))

    def run(self, x, y_scale, y_zero_point=None):
        dtype = y_zero_point.dtype if y_zero_point is not None else np.dtype(np.uint8)
        if (
            not self.plain
            or x.dtype != np.float32
            or not _per_tensor_param(y_scale, y_zero_point)
            or dtype not in _BYTES
            or self.output_dtype
        ):
            return self._call(x, y_scale, y_zero_point)
        low, high = _RANGES[np.dtype(dtype)]
        zero = np.float32(_zero_of(y_zero_point))
        y = np.empty(x.shape, dtype)
        self.loops.quantize(np.ascontiguousarray(x), y, np.float32(y_scale.reshape(())), zero,
                            low, high)  # fmt: skip
        return y


class DequantizeKernel(_Elementwise):
    """DequantizeLinear of uint8 or int8 to float32 with one scale and zero point."""

    def __init__(self, fn, attrs) -> None:
        super().__init__(fn, attrs)
        self.output_dtype = int(attrs.get("output_dtype", 0))

    def run(self, x, x_scale, x_zero_point=None):
        if (
            not self.plain
            or x.dtype not in _BYTES
            or not _per_tensor_param(x_scale, x_zero_point)
            or (x_zero_point is not None and x_zero_point.dtype != x.dtype)
            or self.output_dtype not in (0, 1)
        ):
            return self._call(x, x_scale, x_zero_point)
        y = np.empty(x.shape, np.float32)
        zero = np.float32(_zero_of(x_zero_point))
        self.loops.dequantize(np.ascontiguousarray(x), y, np.float32(x_scale.reshape(())), zero)
        return y


class QuantizedAddKernel(_Elementwise):
    """``pkg.nxrt::QuantizedAdd`` of same-shaped uint8/int8 inputs in one pass."""

    def __init__(self, fn, attrs) -> None:
        super().__init__(fn, attrs)
        self.relu = bool(attrs.get("relu", 0))

    def run(self, a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point):
        args = (a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point)
        if (
            a.shape != b.shape
            or a.dtype not in _BYTES
            or b.dtype not in _BYTES
            or y_zero_point.dtype not in _BYTES
            or not all(
                _per_tensor_param(s, z)
                for s, z in (
                    (a_scale, a_zero_point),
                    (b_scale, b_zero_point),
                    (y_scale, y_zero_point),
                )
            )
        ):
            return self._call(*args)
        low, high = _RANGES[np.dtype(y_zero_point.dtype)]
        y = np.empty(a.shape, y_zero_point.dtype)
        f32 = np.float32
        self.loops.quantized_add(
            np.ascontiguousarray(a), np.ascontiguousarray(b), y,
            f32(a_scale.reshape(())), f32(_zero_of(a_zero_point)),
            f32(b_scale.reshape(())), f32(_zero_of(b_zero_point)),
            f32(y_scale.reshape(())), f32(_zero_of(y_zero_point)), self.relu, low, high,
        )  # fmt: skip
        return y


# -- factories ---------------------------------------------------------------------------------


def _reason() -> str:
    from nxrt_ep_cpu.jit import qgemm

    return f"int32 accumulation on {qgemm.level()}"


def integer_kernel(
    ep: ExecutionProvider, node: ir.Node, cls: type[Any], fn: Callable[..., Any]
) -> Any:
    """The kernel of an integer op (the registered ``factory=``): ``cls``, compiled in the
    background through ``compiling.compiled_kernel``, the numpy ``fn`` until then."""
    attrs = attribute_values(node)

    def fast() -> Any:
        if issubclass(cls, (DynamicQuantizeKernel, _Elementwise)):
            return cls(fn, attrs)
        return cls(fn, attrs, ep.parallel)

    return compiled_kernel(ep, node, fast, lambda: CpuKernel(fn, attrs))

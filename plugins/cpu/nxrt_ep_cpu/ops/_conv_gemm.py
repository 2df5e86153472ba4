"""The GEMM-planned Conv kernel: one variant per input shape, chosen with its reason.

The :class:`ConvKernel` built for every Conv node (and for the optimizer's
``pkg.nxrt::FusedConv``: a Conv with a residual input and an activation
fused in) plans each input shape once and records the plan's variant, with
its reason, as ``variant``/``variant_reason`` (the profiler writes both).
The shapes the GEMM variants do not cover (N-D, half precision, integers,
cropping pads, empty tensors) run the reference convolution
(:func:`~nxrt_ep_cpu.ops._conv_reference.convolve`, variant ``generic``);
the others take the first of :data:`VARIANTS` that suits them:

* :class:`Pointwise`: a 1x1 kernel without padding is one GEMM on the input
  as it is (strided pixels gathered first);
* :class:`Depthwise`: one filter per channel: the taps of a channel block
  copied side by side, then a batched ``(1 x taps) @ (taps x pixels)`` matmul;
* :class:`Im2col`: the shifted rows copied into one column matrix (row
  copies from the flat layout of :class:`_Layout`, no transposing copy), then
  one GEMM with ``K = taps x channels``: for groups with few channels, where a
  GEMM per tap has too small a K, and for small feature maps, where the padded
  rows of ``taps`` would waste too much of the GEMM;
* :class:`Taps`: one GEMM per kernel tap, ``y += W_tap @ x_shifted``, each
  shifted input read in place from the flat padded copy, each product added
  in place by BLAS (``beta = 1``, see ``_blas.py``): no column matrix and no
  temporary at all.

The GEMM's output starts as ``bias + residual`` (one pass) and BLAS adds the
product to it in place; a Relu then costs one more pass, fused with the copy
out of the padded rows where there is one.

The GEMMs run on BLAS's own threads (the session caps them per run, see
:meth:`~nxrt.host_parallel.HostParallel.run_limits`): measured here,
OpenBLAS shares packed panels between its threads and scales 1.8-1.9x on
two cores, where splitting a GEMM across the session's pool reached
1.3-1.6x (each half packs its operands again, and waking a pool thread
costs 50-150 µs). Depthwise convolutions, whose many tiny GEMMs BLAS runs on
one thread, are split by output rows across the pool instead.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from nxrt.errors import NxrtError
from nxrt.kernel import attribute_values
from nxrt.memory import Workspace
from nxrt_ep_cpu.kernels import NumpyKernel
from nxrt_ep_cpu.ops._blas import GEMM
from nxrt_ep_cpu.ops._conv_reference import conv_windows, convolve
from nxrt_ep_cpu.ops._spatial import Windows
from nxrt_ep_cpu.ops.elementwise import inplace_activation, zeros

if TYPE_CHECKING:
    import onnx_ir as ir

    from nxrt.host_parallel import HostParallel
    from nxrt.provider import ExecutionProvider

#: dtypes the GEMM variants handle; the others take the reference path.
_GEMM_DTYPES = frozenset({np.dtype(np.float32), np.dtype(np.float64)})
#: Multiply-adds from which a depthwise convolution is split across the pool; below
#: it the hand-off (50-150 µs) costs more than the second thread saves.
_PARALLEL_MACS = 2_000_000
#: Padded row over output row above which exact columns beat the flat layout.
_MAX_WASTE = 1.1
#: Channels per group from which a GEMM per tap beats copying columns (measured).
_TAP_CHANNELS = 48
#: Values of a depthwise column block (about 1 MB of float32, so it stays in cache).
_DEPTHWISE_BLOCK = 1 << 18
#: Values of the temporaries (columns, accumulators) of one band of output rows.
_BAND_VALUES = 1 << 20
#: GEMM columns (output pixels) a band has at least.
_BAND_COLUMNS = 512
#: Multiply-adds per group from which several groups go to BLAS one call each (~8 µs of
#: ctypes per call) rather than through numpy's batched matmul and an add.
_DIRECT_GROUP_MACS = 1 << 21

#: One piece of a plan's work: (image, first, stop) along output rows (pixels for
#: :class:`Pointwise`).
Chunk = tuple[int, int, int]
Work = Callable[[Chunk], None]
Activation = Callable[[np.ndarray], Any] | None


# -- the kernel ---------------------------------------------------------------------------------


class ConvKernel(NumpyKernel):
    """Conv or FusedConv with its variant chosen per input shape.

    The variant is picked at creation when shape inference knows the input
    shape, else on the first call; plans are cached per input shape, so a
    call costs one dict lookup before the numpy work.
    """

    _MAX_PLANS = 8

    def __init__(
        self,
        attrs: dict[str, Any],
        *,
        parallel: HostParallel | None = None,
        workspace: Workspace | None = None,
        activation: str | bytes = "",
        activation_params: Sequence[float] = (),
        shapes: tuple[tuple[int, ...], tuple[int, ...], np.dtype] | None = None,
    ) -> None:
        self.attrs = attrs
        self.act = inplace_activation(activation, activation_params)
        name = activation.decode() if isinstance(activation, bytes) else activation
        self.relu = name == "Relu"
        self.parallel = parallel
        self.workspace = workspace if workspace is not None else Workspace()
        self._plans: dict[tuple[Any, ...], Reference | GemmPlan] = {}
        if shapes is not None:
            try:
                self._plan(*shapes)
            except (NxrtError, ValueError, TypeError):
                pass  # the same error is raised, with the node's name, when it runs

    @classmethod
    def create(cls, ep: ExecutionProvider, node: ir.Node) -> ConvKernel:
        """The kernel of one node: attributes bound, variant chosen from inferred shapes."""
        attrs = attribute_values(node)
        activation = attrs.pop("activation", "")
        params = attrs.pop("activation_params", ())
        return cls(
            attrs,
            parallel=ep.parallel,
            workspace=ep.workspace,
            activation=activation,
            activation_params=params,
            shapes=_static_shapes(node),
        )

    @property
    def direct_call(self) -> Callable[..., np.ndarray]:
        return self.run

    def run(
        self, x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None, z: np.ndarray | None = None
    ) -> np.ndarray:
        plan = self._plans.get((x.shape, w.shape, x.dtype))
        if plan is None:
            plan = self._plan(x.shape, w.shape, x.dtype)
        return plan.run(x, w, b, z)

    def _plan(
        self, x_shape: tuple[int, ...], w_shape: tuple[int, ...], dtype: np.dtype
    ) -> Reference | GemmPlan:
        plan = choose(tuple(x_shape), tuple(w_shape), np.dtype(dtype), self)
        self.variant, self.variant_reason = plan.variant, plan.reason
        if len(self._plans) >= self._MAX_PLANS:
            self._plans.clear()  # shapes that keep changing: keep the cache small
        self._plans[(tuple(x_shape), tuple(w_shape), np.dtype(dtype))] = plan
        return plan

    def __repr__(self) -> str:
        return f"ConvKernel({self.variant or 'unplanned'}, {self.attrs})"


def _static_shapes(node: ir.Node) -> tuple[tuple[int, ...], tuple[int, ...], np.dtype] | None:
    """Input and weight shapes and the dtype, when shape inference fixed them all."""
    try:
        x, w = node.inputs[0], node.inputs[1]
        shapes = [tuple(v.shape) for v in (x, w)]
        if not all(isinstance(d, int) for shape in shapes for d in shape):
            return None
        return shapes[0], shapes[1], np.dtype(x.dtype.numpy())
    except (AttributeError, IndexError, TypeError, ValueError):
        return None


def choose(
    x_shape: tuple[int, ...], w_shape: tuple[int, ...], dtype: np.dtype, kernel: ConvKernel
) -> Reference | GemmPlan:
    """The plan of one input shape: the reference where no GEMM variant applies, else the
    first of :data:`VARIANTS` that suits the shape, each with its reason."""
    win = conv_windows(x_shape, w_shape, **kernel.attrs)
    group = int(kernel.attrs.get("group", 1))
    reason = Reference.suits(x_shape, w_shape, dtype, win)
    if reason:
        return Reference(win, group, kernel.act, reason)
    shape = ConvShape.of(x_shape, w_shape, dtype, win, group)
    for variant in VARIANTS:
        reason = variant.suits(shape)
        if reason:
            return variant(shape, reason, kernel)
    raise AssertionError(f"no Conv variant suits {shape}")  # Taps suits every shape


class Reference:
    """The reference convolution, then the fused terms."""

    variant = "generic"

    @staticmethod
    def suits(
        x_shape: tuple[int, ...], w_shape: tuple[int, ...], dtype: np.dtype, win: Windows
    ) -> str:
        """Why the GEMM variants do not cover this shape ('' when they do)."""
        if dtype not in _GEMM_DTYPES:
            return f"{dtype} is computed through the float32 or integer path"
        if len(x_shape) not in (3, 4):
            return f"{len(x_shape) - 2}-D convolution"
        if any(p < 0 for p in (*win.begin, *win.end)):
            return "negative pads, which crop the input"
        if 0 in (*x_shape[:2], w_shape[0], *win.out):
            return "empty input or output"
        return ""

    def __init__(self, win: Windows, group: int, act: Activation, reason: str) -> None:
        self.win, self.group, self.act, self.reason = win, group, act, reason

    def run(self, x, w, b, z) -> np.ndarray:
        y = convolve(x, w, b, self.win, self.group)
        if z is not None:
            y = np.add(y, z, out=y) if np.broadcast_shapes(y.shape, z.shape) == y.shape else y + z
        if self.act is not None:
            self.act(y)
        return y


@dataclass(frozen=True)
class ConvShape:
    """A 2-D convolution as the GEMM variants see it (a 1-D one is 2-D of height 1)."""

    x: tuple[int, int, int, int]
    m: int
    group: int
    dtype: np.dtype
    win: Windows
    one_d: bool

    @classmethod
    def of(
        cls,
        x_shape: tuple[int, ...],
        w_shape: tuple[int, ...],
        dtype: np.dtype,
        win: Windows,
        group: int,
    ) -> ConvShape:
        one_d = len(x_shape) == 3
        if one_d:
            x_shape = (*x_shape[:2], 1, x_shape[2])
            win = Windows(
                (1, *win.kernel),
                (1, *win.strides),
                (1, *win.dilations),
                (0, *win.begin),
                (0, *win.end),
                (1, *win.out),
            )
        n, c, h, w = x_shape
        return cls((n, c, h, w), w_shape[0], group, dtype, win, one_d)

    @property
    def cg(self) -> int:
        """Input channels per group."""
        return self.x[1] // self.group

    @functools.cached_property
    def layout(self) -> _Layout:
        return _Layout.of(self.x, self.win)


# -- the GEMM variants ---------------------------------------------------------------------------


class GemmPlan:
    """One GEMM variant of a 2-D convolution for one input shape; subclasses are the variants.

    A variant says when it suits a shape (:meth:`suits`, with the reason the
    trace records), lays the weights out once (:meth:`prepare`) and returns
    the work of one call (:meth:`work`), which :meth:`run` applies to each
    image, or to bands of output rows across the pool where the variant
    splits.
    """

    #: The name the trace records.
    variant: ClassVar[str] = ""
    #: Whether the variant reads the input through a zero-padded :class:`_Layout`.
    padded: ClassVar[bool] = True
    #: Whether the variant's work is split across the session's pool (else BLAS threads).
    splits: ClassVar[bool] = False

    @classmethod
    def suits(cls, shape: ConvShape) -> str:
        """Why this variant computes ``shape`` ('' when it does not)."""
        raise NotImplementedError

    def __init__(self, shape: ConvShape, reason: str, kernel: ConvKernel) -> None:
        self.reason = reason
        n, c, _, _ = shape.x
        m, group = shape.m, shape.group
        self.x_shape, self.dtype, self.group, self.act = shape.x, shape.dtype, group, kernel.act
        self.relu = kernel.relu
        self.m, self.mg, self.cg = m, m // group, c // group
        self.taps = shape.win.taps
        self.strides = shape.win.strides
        self.one_d = shape.one_d
        self.out_shape = (n, m, *shape.win.out)
        self.layout = shape.layout if self.padded else None
        self.workspace = kernel.workspace
        self.parallel = kernel.parallel
        self._weight: tuple[Any, Any] = (None, None)
        ho, wo = shape.win.out
        threads = self.parallel.threads if self.parallel is not None else 1
        macs = n * m * ho * wo * self.cg * self.taps
        self.split = self.splits and threads > 1 and macs >= _PARALLEL_MACS
        count = self._extent(ho, wo)
        if not self.split or n >= threads:
            self.chunks = [(i, 0, count) for i in range(n)]
        else:
            self.chunks = [(i, r.start, r.stop) for i in range(n) for r in _split(count, threads)]

    def _extent(self, ho: int, wo: int) -> int:
        """The length of a chunk's range for one whole image: output rows."""
        return ho

    @property
    def _widths(self) -> tuple[int, int]:
        return self.layout.wq, self.layout.wo

    # -- weights, prepared once per weight array ------------------------------------------------
    def _prepared(self, w: np.ndarray) -> np.ndarray:
        source, prepared = self._weight
        if source is w:
            return prepared
        w4 = w.astype(self.dtype, copy=False).reshape(self.group, self.mg, self.cg, self.taps)
        prepared = self.prepare(w4)
        if not w.flags.writeable:  # a constant: the same array every run
            self._weight = (w, prepared)
        return prepared

    def prepare(self, w: np.ndarray) -> np.ndarray:
        """The weights, given as ``(group, filters, channels, taps)``, laid out for :meth:`work`."""
        raise NotImplementedError

    def work(
        self,
        src: np.ndarray,
        wp: np.ndarray,
        out: np.ndarray,
        b: np.ndarray | None,
        z: np.ndarray | None,
        act: Activation,
    ) -> Work:
        """What one call computes per chunk: ``out = act(conv(src, wp) + b + z)``.

        ``src`` is the padded layout's buffer, or the input itself where the
        variant is not :attr:`padded`.
        """
        raise NotImplementedError

    # -- one call -------------------------------------------------------------------------------
    def run(self, x, w, b, z) -> np.ndarray:
        if self.one_d:
            x = x[:, :, None, :]
        wp = self._prepared(w)
        out = np.empty(self.out_shape, self.dtype)
        if b is not None:
            b = b.astype(self.dtype, copy=False).reshape(self.m, 1, 1)
        late_z = None
        if z is not None:
            z = z.reshape(z.shape[:2] + (1,) + z.shape[2:]) if self.one_d and z.ndim == 3 else z
            if z.shape != self.out_shape:
                z, late_z = None, z  # a broadcast residual: added once the GEMMs are done
        act = self.act if late_z is None else None
        layout = self.layout
        if layout is None:
            self._each(self.work(x, wp, out, b, z, act))
        else:
            key = (layout, self.dtype)
            buf, targets = held = self.workspace.take(key, lambda: layout.buffer(self.dtype))
            try:
                layout.fill(targets, x)
                self._each(self.work(buf, wp, out, b, z, act))
            finally:
                self.workspace.give(key, held)
        if late_z is not None:
            np.add(out, late_z, out=out)
            if self.act is not None:
                self.act(out)
        return out[:, :, 0, :] if self.one_d else out

    def _each(self, work: Work) -> None:
        if self.split and len(self.chunks) > 1:
            self.parallel.map(work, self.chunks)
        else:
            for chunk in self.chunks:
                work(chunk)

    def _band(self, per_row: int, width: int) -> int:
        """Output rows per band, so that a band's temporaries stay in the core's cache,
        but with at least ``_BAND_COLUMNS`` GEMM columns, below which BLAS slows down."""
        return max(1, _BAND_VALUES // max(1, per_row), -(-_BAND_COLUMNS // width))


class Pointwise(GemmPlan):
    """A 1x1 kernel without padding: one GEMM per image on the input as it is."""

    variant = "pointwise"
    padded = False

    @classmethod
    def suits(cls, shape: ConvShape) -> str:
        win = shape.win
        if win.taps != 1 or any(win.begin) or any(win.end):
            return ""
        reason = "1x1 kernel without padding: one GEMM on the input as it is"
        if any(s > 1 for s in win.strides):
            reason += " (strided pixels gathered first)"
        return reason

    def _extent(self, ho: int, wo: int) -> int:
        return ho * wo  # chunks of output pixels

    def prepare(self, w: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(w.reshape(self.group, self.mg, self.cg))

    def work(self, src, wp, out, b, z, act) -> Work:
        n, c = self.x_shape[:2]
        g, mg, cg, m = self.group, self.mg, self.cg, self.m
        relu = self.relu and act is not None
        x = src
        if any(s > 1 for s in self.strides):
            sh, sw = self.strides
            x = x[:, :, ::sh, ::sw]
        pixels = out.shape[2] * out.shape[3]
        x = np.ascontiguousarray(x).reshape(n, g, cg, pixels)
        y = out.reshape(n, g, mg, pixels)
        flat_out = out.reshape(n, m, pixels)
        b2 = None if b is None else b.reshape(m, 1)
        flat_z = None if z is None else z.reshape(n, m, pixels)

        def work(chunk: Chunk) -> None:
            i, p0, p1 = chunk
            dst = flat_out[i, :, p0:p1]
            beta = _prefill(dst, b2, None if flat_z is None else flat_z[i, :, p0:p1])
            _gemm(wp, x[i, :, :, p0:p1], y[i, :, :, p0:p1], beta)
            _activate(dst, dst, act, relu)

        return work


class Depthwise(GemmPlan):
    """One filter per channel: per channel block, the taps copied side by side, then one
    small GEMM per channel (a batched matmul, 3-4 times faster than a multiply-add per tap).
    """

    variant = "depthwise"
    splits = True

    @classmethod
    def suits(cls, shape: ConvShape) -> str:
        if not shape.group == shape.x[1] == shape.m:
            return ""
        return "one filter per channel: taps copied per channel block, one batched matmul"

    def prepare(self, w: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(w.reshape(self.group, 1, self.taps))

    def work(self, src, wp, out, b, z, act) -> Work:
        layout, c, taps = self.layout, self.m, self.taps
        wq, wo = layout.wq, layout.wo

        def work(chunk: Chunk) -> None:
            i, r0, r1 = chunk
            size = (r1 - r0) * wq
            width = max(1, min(c, _DEPTHWISE_BLOCK // (taps * size)))
            cols = np.empty((width, taps, size), self.dtype)
            for c0 in range(0, c, width):
                c1 = min(c, c0 + width)
                block = cols[: c1 - c0]
                for t in range(taps):
                    block[:, t] = layout.block(src, i, t, r0, size)[c0:c1]
                acc = np.matmul(wp[c0:c1], block).reshape(c1 - c0, r1 - r0, wq)
                _finish(
                    acc[:, :, :wo],
                    out[i, c0:c1, r0:r1],
                    None if b is None else b[c0:c1],
                    None if z is None else z[i, c0:c1, r0:r1],
                    act,
                )

        return work


class Im2col(GemmPlan):
    """Columns copied from the flat layout, ordered (tap, channel), then one GEMM per band."""

    variant = "im2col"

    @classmethod
    def suits(cls, shape: ConvShape) -> str:
        layout, k = shape.layout, shape.win.taps * shape.cg
        if layout.waste > _MAX_WASTE:
            return (
                f"padded row of {layout.wq} for {layout.wo} outputs (waste "
                f"{layout.waste - 1:.0%}): exact columns, one GEMM with K={k}"
            )
        if shape.cg < _TAP_CHANNELS:
            return f"{shape.cg} channels per group: columns copied, one GEMM with K={k}"
        return ""

    def prepare(self, w: np.ndarray) -> np.ndarray:
        g, mg = self.group, self.mg
        return np.ascontiguousarray(w.transpose(0, 1, 3, 2)).reshape(g, mg, self.taps * self.cg)

    def work(self, src, wp, out, b, z, act) -> Work:
        relu = self.relu and act is not None
        layout, g, cg, mg, taps, wq, wo = (
            self.layout,
            self.group,
            self.cg,
            self.mg,
            self.taps,
            *self._widths,
        )
        band = self._band((taps * cg + self.m) * wo, wo)

        def work(chunk: Chunk) -> None:
            i, r0, r1 = chunk
            rows = min(band, r1 - r0)
            cols = np.empty((g, taps, cg, rows * wo), self.dtype)
            whole = rows == layout.ho  # one band: the GEMM writes the output itself
            scratch = None if whole else np.empty(self.m * rows * wo, self.dtype)
            for a in range(r0, r1, rows):
                e = min(r1, a + rows)
                size = (e - a) * wo
                grid = cols[:, :, :, :size].reshape(g, taps, cg, e - a, wo)
                for t in range(taps):
                    block = layout.block(src, i, t, a, (e - a) * wq).reshape(g, cg, e - a, wq)
                    grid[:, t] = block[:, :, :, :wo]
                flat = grid.reshape(g, taps * cg, size)
                dst = out[i, :, a:e]
                acc = (
                    out[i].reshape(g, mg, size)
                    if whole
                    else scratch[: self.m * size].reshape(g, mg, size)
                )
                valid = acc.reshape(self.m, e - a, wo)
                beta = _prefill(valid, b, None if z is None else z[i, :, a:e])
                _gemm(wp, flat, acc, beta)
                _activate(valid, dst, act, relu)

        return work


class Taps(GemmPlan):
    """A GEMM per kernel tap on shifted rows read in place, each added into one accumulator."""

    variant = "taps"

    @classmethod
    def suits(cls, shape: ConvShape) -> str:
        return (
            f"{shape.cg} channels per group: a GEMM per kernel tap ({shape.win.taps}) on "
            "shifted rows read in place, no column copy"
        )

    def prepare(self, w: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(w.transpose(3, 0, 1, 2))  # (taps, g, mg, cg)

    def work(self, src, wp, out, b, z, act) -> Work:
        relu = self.relu and act is not None
        layout, g, cg, m, wq, wo = self.layout, self.group, self.cg, self.m, *self._widths
        band = self._band(m * wq, wq)

        def work(chunk: Chunk) -> None:
            i, r0, r1 = chunk
            scratch = np.empty(m * min(band, r1 - r0) * wq, self.dtype)
            for a in range(r0, r1, band):
                e = min(r1, a + band)
                size = (e - a) * wq
                acc = scratch[: m * size].reshape(g, m // g, size)
                valid = acc.reshape(m, e - a, wq)[:, :, :wo]
                beta = _prefill_rows(acc, valid, b, None if z is None else z[i, :, a:e])
                for t in range(self.taps):
                    block = layout.block(src, i, t, a, size).reshape(g, cg, size)
                    _gemm(wp[t], block, acc, beta if t == 0 else 1.0)
                _activate(valid, out[i, :, a:e], act, relu)

        return work


#: The GEMM variants, in the order they are tried: the first that suits a shape is chosen
#: (a 1x1 depthwise convolution is pointwise; :class:`Taps` suits every shape).
VARIANTS: tuple[type[GemmPlan], ...] = (Pointwise, Depthwise, Im2col, Taps)


# -- the pieces the variants share --------------------------------------------------------------


def _finish(src: np.ndarray, dst: np.ndarray, b, z, act) -> None:
    """``dst = act(src + b + z)``, one pass per term; ``src`` may be ``dst`` itself."""
    if b is not None:
        np.add(src, b, out=dst)
    elif src is not dst:
        np.copyto(dst, src)
    if z is not None:
        np.add(dst, z, out=dst)
    if act is not None:
        act(dst)


def _prefill(target: np.ndarray, b, z) -> float:
    """Start ``target`` at ``b + z``, which BLAS then adds the product to; returns the
    ``beta`` of the first GEMM (0: nothing to add, the GEMM overwrites)."""
    if z is not None:
        if b is not None:
            np.add(z, b, out=target)
        else:
            np.copyto(target, z)
        return 1.0
    if b is not None:
        np.copyto(target, b)
        return 1.0
    return 0.0


def _prefill_rows(acc: np.ndarray, valid: np.ndarray, b, z) -> float:
    """:func:`_prefill` for an accumulator with padded rows: the bias fills every value
    (the dropped ones too, so none is left uninitialised), the residual the kept ones."""
    if z is None:
        if b is None:
            return 0.0
        np.copyto(acc.reshape(b.shape[0], -1), b.reshape(-1, 1))
        return 1.0
    np.copyto(acc, 0)
    return _prefill(valid, b, z)


def _gemm(a: np.ndarray, b: np.ndarray, c: np.ndarray, beta: float) -> None:
    """``c = a @ b + beta * c`` per group (3-D operands), in place through BLAS when it can."""
    groups = a.shape[0]
    direct = GEMM is not None and (groups == 1 or a[0].size * b.shape[-1] >= _DIRECT_GROUP_MACS)
    if direct and GEMM(a[0], b[0], c[0], beta):
        for j in range(1, groups):
            GEMM(a[j], b[j], c[j], beta)
    elif beta:
        c += np.matmul(a, b)
    else:
        np.matmul(a, b, out=c)


def _activate(src: np.ndarray, dst: np.ndarray, act, relu: bool) -> None:
    """``dst = act(src)``; Relu in one pass (a maximum against zeros), ``src`` may be ``dst``."""
    if relu:
        np.maximum(src, zeros(src.shape, src.dtype), out=dst)
        return
    if src is not dst:
        np.copyto(dst, src)
    if act is not None:
        act(dst)


def _split(n: int, parts: int) -> list[range]:
    """``range(n)`` in at most ``parts`` contiguous, near-equal, non-empty pieces."""
    parts = max(1, min(parts, n))
    size, extra = divmod(n, parts)
    pieces, start = [], 0
    for index in range(parts):
        stop = start + size + (1 if index < extra else 0)
        pieces.append(range(start, stop))
        start = stop
    return pieces


@dataclass(frozen=True)
class _Layout:
    """Where each kernel tap of a 2-D convolution finds its input: one flat 2-D block.

    The padded input is split into ``sh x sw`` phases (the rows and columns
    with one remainder modulo the stride), each stored flat with ``hq x wq``
    values per channel plus a short tail. Tap ``(i, j)`` reads one phase from
    a fixed offset, and its output row ``r`` starts ``r * wq`` values further
    on, so the tap's input for a band of output rows is the block
    ``buf[n, phase, :, offset + r0 * wq : offset + r1 * wq]``: channels by
    pixels, unit stride along pixels, which BLAS reads in place. The last
    ``wq - wo`` values of each row are computed and dropped (the waste).
    """

    shape: tuple[int, int, int, int]
    strides: tuple[int, int]
    hq: int
    wq: int
    flat: int
    ho: int
    wo: int
    taps: tuple[tuple[int, int], ...]
    fills: tuple[tuple[int, int, int, int, int, int, int], ...]

    @classmethod
    def of(cls, shape: tuple[int, int, int, int], win: Windows) -> _Layout:
        n, c, h, w = shape
        (pt, pl), (sh, sw), (dh, dw) = win.begin, win.strides, win.dilations
        kh, kw = win.kernel
        ho, wo = win.out
        hp = max(h + pt + win.end[0], (ho - 1) * sh + (kh - 1) * dh + 1)
        wp = max(w + pl + win.end[1], (wo - 1) * sw + (kw - 1) * dw + 1)
        hq, wq = -(-hp // sh), -(-wp // sw)
        taps = tuple(
            ((i * dh % sh) * sw + j * dw % sw, (i * dh // sh) * wq + j * dw // sw)
            for i in range(kh)
            for j in range(kw)
        )
        fills = []
        for a in range(sh):
            for b in range(sw):
                u0, v0 = max(0, -(-(pt - a) // sh)), max(0, -(-(pl - b) // sw))
                r0, c0 = a + u0 * sh - pt, b + v0 * sw - pl
                nu = min(len(range(r0, h, sh)), hq - u0)
                nv = min(len(range(c0, w, sw)), wq - v0)
                if nu > 0 and nv > 0:
                    fills.append((a * sw + b, u0, v0, r0, c0, nu, nv))
        flat = hq * wq + (kw - 1) * dw // sw + 1
        return cls(shape, (sh, sw), hq, wq, flat, ho, wo, taps, tuple(fills))

    @property
    def waste(self) -> float:
        return self.wq / self.wo

    def buffer(self, dtype: np.dtype) -> tuple[np.ndarray, list[np.ndarray]]:
        """A zeroed buffer, and the views of it that :meth:`fill` writes (one per phase)."""
        n, c = self.shape[:2]
        sh, sw = self.strides
        buf = np.zeros((n, sh * sw, c, self.flat), dtype)
        grid = np.lib.stride_tricks.as_strided(
            buf,
            shape=(n, sh * sw, c, self.hq, self.wq),
            strides=(*buf.strides[:3], self.wq * buf.itemsize, buf.itemsize),
        )
        targets = [
            grid[:, phase, :, u0 : u0 + nu, v0 : v0 + nv]
            for phase, u0, v0, _, _, nu, nv in self.fills
        ]
        return buf, targets

    def fill(self, targets: list[np.ndarray], x: np.ndarray) -> None:
        """Copy ``x`` into the phases; the zero padding around it is never written."""
        sh, sw = self.strides
        for target, (_, _, _, r0, c0, nu, nv) in zip(targets, self.fills, strict=True):
            rows = slice(r0, r0 + (nu - 1) * sh + 1, sh)
            cols = slice(c0, c0 + (nv - 1) * sw + 1, sw)
            np.copyto(target, x[:, :, rows, cols])

    def block(self, buf: np.ndarray, image: int, tap: int, row: int, size: int) -> np.ndarray:
        """Tap ``tap``'s input for ``size`` flat output positions from output row ``row``."""
        phase, offset = self.taps[tap]
        start = offset + row * self.wq
        return buf[image, phase, :, start : start + size]

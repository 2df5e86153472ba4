"""The planned Conv kernel: one variant per input shape, chosen with its reason.

The :class:`ConvKernel` built for every Conv node (and for the optimizer's
``pkg.nxrt::FusedConv``: a Conv with a residual input and an activation
fused in) plans each input shape once and records the plan's variant, with
its reason, as ``variant``/``variant_reason`` (the profiler writes both).
The shapes the variants do not cover (N-D, half precision, integers,
cropping pads, empty tensors) run the reference convolution
(:func:`~nxrt_ep_cpu.ops._conv_reference.convolve`, variant ``generic``);
the others take the first of :data:`VARIANTS` that suits them:

* :class:`Pointwise`: a 1x1 kernel without padding; in float32 with one
  group, register tiles on weights packed once (``jit/pointwise.py``: the
  bias, residual and activation applied as each tile is written; tiles
  sized per instruction-set level, ``jit/isa.py``); otherwise
  one GEMM per image on the input as it is (strided pixels gathered first),
  several small maps in one GEMM's columns, or numpy's batched matmul for few
  channels;
* :class:`Patches` (float32): kernel and stride equal, no padding (patch
  embeddings): the input rearranged as columns, then :class:`Pointwise`'s tiles;
* :class:`Blocked` (float32): one filter per channel on maps up to
  ``_BLOCKED_WIDTH`` wide, a vector of channels at a time in channels-last
  (16 on AVX-512, 8 on AVX2), each output pixel's channels one vector
  register (``jit/conv.py``); from
  ``_ROWS_PIXELS`` input pixels on, a row at a time;
* :class:`Direct` (float32): few channels per group (depthwise on larger
  maps, grouped convolutions, stems), convolved directly in numba a band of
  output rows at a time from the flat padded layout of :class:`_Layout`,
  nine taps per vectorized pass, two filters at a time;
* :class:`Depthwise` (float64, and strides above 2): one filter per
  channel: the taps of a channel block copied side by side, then a batched
  matmul;
* :class:`Im2col`: the shifted rows copied into one column matrix, then one
  GEMM with ``K = taps x channels``: for groups with few channels, where a
  GEMM per tap has too small a K, and for small feature maps, where the
  padded rows of ``taps`` would waste too much of the GEMM; maps smaller
  than ``_BAND_COLUMNS`` pixels go several whole images per GEMM (columns
  packed in numba for float32), never a GEMM per image;
* :class:`Taps`: one GEMM per kernel tap, ``y += W_tap @ x_shifted``, each
  shifted input read in place from the flat padded copy, each product added
  in place by BLAS (``beta = 1``, see ``_blas.py``): no column matrix and no
  temporary at all.

In the GEMM variants the output starts as ``bias + residual`` (one pass)
and BLAS adds the product to it in place; a Relu then costs one more pass,
fused with the copy out of the padded rows where there is one. The numba
variants add the bias, the residual and a Relu/Clip as they write each
output row; other activations run after, on the same block of output.

Where numba's OpenMP layer runs (``jit/threads.py``), the GEMMs are split
over its threads, each calling single-threaded BLAS on a band of the output,
and the numba variants run their pieces there too: a parallel region starts
in about 1.5 µs, so work from about 10 µs up is split. Elsewhere the GEMMs
run on BLAS's own threads (the session caps them, see
:meth:`~nxrt.host_parallel.HostParallel.run_limits`; OpenBLAS scales
1.8-1.9x on two cores) and the numba variants, and bands of whole small
images, on the session's pool, whose hand-off costs 50-150 µs, above a
measured amount of work.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, cast

import numpy as np

from nxrt.errors import KernelFailed, NxrtError
from nxrt.kernel import attribute_values
from nxrt.memory import Workspace
from nxrt_ep_cpu.compiling import compiled_kernel
from nxrt_ep_cpu.kernels import NumpyKernel, compiled, pool_team, run_team
from nxrt_ep_cpu.ops._blas import GEMM
from nxrt_ep_cpu.ops._conv_reference import conv_windows, convolve
from nxrt_ep_cpu.ops._spatial import Windows
from nxrt_ep_cpu.ops.elementwise import inplace_activation, zeros

if TYPE_CHECKING:
    import onnx_ir as ir

    from nxrt.host_parallel import HostParallel
    from nxrt.kernel import Kernel
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
#: Pixels from which a float32 pointwise convolution can put pixels in the vector lanes (a
#: tile is one or two vectors wide: 16 or 32 pixels on AVX-512; smaller maps of one image,
#: such as squeeze-and-excitation's 1x1, put filters there; of several, they go to one
#: GEMM, which reads the weights once).
_TILE_PIXELS = 16
#: Filters per group from which a grouped float32 1x1 convolution runs the register tiles
#: (each group as an image of its own; ShuffleNet's groups have 28-136): a tile's rows are
#: filters of one group, so fewer leave most of a tile idle.
_TILE_GROUP_FILTERS = 8
#: Input values of one pixel chunk of the register-tiled kernel (32 KB: it stays in L1
#: while every filter block reads it), and the pixels a chunk has at least (its last
#: tile recomputes up to a vector of pixels of the one before).
_TILE_CHUNK = 8192
_TILE_MIN_CHUNK = 256
#: Channels per group from which a pointwise convolution of several small images moves
#: them into one GEMM's columns (below, numpy's batched matmul is faster; measured).
_POINTWISE_COLUMNS_CHANNELS = 64
#: GEMM columns a band of whole small images reaches at most.
_BATCH_COLUMNS = 8192
#: Multiply-adds per group from which a GEMM goes to BLAS through ctypes (in place, with
#: ``beta``) rather than through numpy's matmul and an add: the ctypes call costs 6-10 us
#: more than numpy's (measured: [8, 16] x [16, 1] 7.1 against 1.0 us, [576, 96] x [96, 49]
#: 71 against 62 us), which only an add over a large output repays.
_DIRECT_MACS = 1 << 21

#: (channels per group, least share of its computed values kept) under which the direct
#: kernel beats a GEMM (measured on one core: 1.5-5x up to 16 channels per group,
#: 1.1-1.5x at 32 on large maps; small maps, whose padded rows it computes too, go to
#: the GEMMs). From 33 channels the GEMMs win, on the AVX-512 and the AVX2 target alike
#: (CPU time on one core: 1.35-1.45x on ResNet-50's 64-channel 3x3 at 56x56, 1.15-1.25x
#: at 28x28).
_DIRECT_CHANNELS = ((16, 0.7), (32, 0.85))
#: Where :class:`Unfolded` runs: from this many channels (fewer: the direct kernel), up to
#: this many rows of columns and values of one image's columns (1 MB: they stay in cache
#: while every filter block reads them). Measured on one core, CPU time, both targets:
#: 0.45-0.9x the GEMM variants' time on DenseNet's, SqueezeNet's and Inception's 7x7 to
#: 27x27 maps, 1.6-1.9x on columns of 2-4 MB (28x28 by 128 channels, 14x14 by 256).
_UNFOLD_CHANNELS = 16
_UNFOLD_DEPTH = 2048
_UNFOLD_VALUES = 1 << 18
#: Accumulator values of the direct kernel's band of output rows (in L1 with its inputs).
_DIRECT_BAND = 2048
#: Nanoseconds of one core's work from which the numba variants split it across the
#: pool: the half saved then outweighs waking a pool thread (50-150 µs).
_PARALLEL_NS = 200_000
#: Multiply-adds per nanosecond the direct kernel computes on one core (padded rows and
#: taps included): one filter at a time, and two (measured).
_DIRECT_RATE = (15, 35)
#: For the channel-blocked kernel: multiply-adds and moved values (to channels-last and
#: back) per nanosecond on one core (measured).
_BLOCKED_RATE = (20, 4)
#: Where both direct kernels' geometry holds the clamp flag (cleared for a late residual).
_CLAMP = 11
#: Output width up to which depthwise convolutions run 16 channels at a time (above, the
#: padded rows the plane-by-plane kernel computes cost less than moving to channels-last
#: and back; measured: 1.4-3x faster up to 56, even at 112).
_BLOCKED_WIDTH = 64
#: Input pixels from which the channel-blocked kernel moves a row at a time rather than the
#: whole plane (16 channels of a 32x32 plane in channels-last are 64 KB, all of L1).
_ROWS_PIXELS = 1024
#: SIMD lanes the direct kernel rounds its passes up to (reads run that far past a band).
_LANES = 16
#: Stand-ins for an absent bias and residual in the direct kernel's arguments.
_NONE = np.zeros(0, np.float32)
_NONE3 = np.zeros((0, 1, 1), np.float32)

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
        compiled: bool = True,
    ) -> None:
        self.attrs = attrs
        #: Whether the variants compiled by numba may run (``False``: the numpy tier, GEMMs
        #: and numpy copies only, while :func:`create`'s compiled kernel is being built).
        self.compiled = compiled
        self.act = inplace_activation(activation, activation_params, parallel, compiled=compiled)
        name = activation.decode() if isinstance(activation, bytes) else activation
        self.relu = name == "Relu"
        self.clamp = _clamp(name, activation_params)
        #: The fused activation's name and parameters (kernels that apply it themselves).
        self.activation = (name, tuple(activation_params))
        self.parallel = parallel
        self.workspace = workspace if workspace is not None else Workspace()
        #: Threads of the EP's own pool the GEMMs and loops split over (1: BLAS's threads).
        self.team = pool_team(parallel) if compiled else 1
        self._plans: dict[tuple[Any, ...], Reference | GemmPlan] = {}
        if shapes is not None:
            try:
                self._plan(*shapes)
            except (NxrtError, ValueError, TypeError):
                pass  # the same error is raised, with the node's name, when it runs

    @classmethod
    def create(cls, ep: ExecutionProvider, node: ir.Node) -> Kernel:
        """The kernel of one node: attributes bound, variant chosen from inferred shapes;
        the numba variants built through :func:`~nxrt_ep_cpu.compiling.compiled_kernel`
        (the numpy tier, GEMM variants only, runs until then)."""
        attrs = attribute_values(node)
        activation = attrs.pop("activation", "")
        params = attrs.pop("activation_params", ())

        def build(jit: bool) -> ConvKernel:
            return cls(
                attrs,
                parallel=ep.parallel,
                workspace=ep.workspace,
                activation=activation,
                activation_params=params,
                shapes=_static_shapes(node),
                compiled=jit,
            )

        return compiled_kernel(ep, node, lambda: build(True), lambda: build(False))

    @property
    def direct_call(self) -> Callable[..., np.ndarray]:
        return self.run

    def run(
        self,
        x: np.ndarray,
        w: np.ndarray,
        b: np.ndarray | None = None,
        z: np.ndarray | None = None,
        s: np.ndarray | None = None,
    ) -> np.ndarray:
        plan = self._plans.get((x.shape, w.shape, x.dtype))
        if plan is None:
            plan = self._plan(x.shape, w.shape, x.dtype)
        if s is not None:
            if isinstance(plan, Pointwise) and plan.tiles is not None:
                return plan.run_scaled(x, w, b, z, _scale(x, s))
            x, w = _scaled(x, w, s, int(self.attrs.get("group", 1)))
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


def _scale(x: np.ndarray, s: np.ndarray) -> np.ndarray:
    """FusedConv's per-input-channel scale ``s``, checked against the input ``x``."""
    n, c = x.shape[:2]
    if s.ndim != x.ndim or s.shape[1] != c or s.shape[0] not in (1, n) or s.size != s.shape[0] * c:
        raise KernelFailed(f"FusedConv's scale S must be (N, C, 1, ...), got {s.shape}")
    return s


def _scaled(
    x: np.ndarray, w: np.ndarray, s: np.ndarray, group: int
) -> tuple[np.ndarray, np.ndarray]:
    """The operands of ``conv(x * s, w)`` for a per-input-channel scale ``s``: for one image
    and one group, the weights scaled along their input channels (``filters x channels``
    multiplies instead of a pass over the whole input); else the input scaled."""
    n, c = x.shape[:2]
    s = _scale(x, s)
    if n == 1 and group == 1 and w.shape[1] == c and w.size <= x.size:
        scale = s.reshape((1, c) + (1,) * (w.ndim - 2)).astype(w.dtype, copy=False)
        return x, w * scale
    return np.multiply(x, s.astype(x.dtype, copy=False)), w


def _static_shapes(node: ir.Node) -> tuple[tuple[int, ...], tuple[int, ...], np.dtype] | None:
    """Input and weight shapes and the dtype, when shape inference fixed them all."""
    try:
        # Any: an absent input, shape or dtype raises, and is caught below
        x, w = cast(Any, node.inputs[0]), cast(Any, node.inputs[1])
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
        if variant.compiled_only and not kernel.compiled:
            continue
        reason = variant.suits(shape)
        if reason:
            return variant(shape, reason, kernel)
    raise AssertionError(f"no Conv variant suits {shape}")  # Taps suits every shape


def _clamp(name: str, params: Sequence[float]) -> tuple[float, float] | None:
    """The float32 bounds of a Relu or Clip activation (``None`` for the others), which the
    direct kernel applies as it writes its output; the bounds :func:`inplace_activation`
    uses, unbounded sides clipped to the finite range as Clip does."""
    if name == "Relu":
        return 0.0, float(np.inf)
    if name == "Clip":
        lo, hi = (*params, -np.inf, np.inf)[:2]
        info = np.finfo(np.float32)
        return float(max(lo, float(info.min))), float(min(hi, float(info.max)))
    return None


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
    variant: str = ""
    #: Whether the variant reads the input through a zero-padded :class:`_Layout`.
    padded: bool = True
    #: Whether the variant's work is split across the session's pool (else BLAS threads).
    splits: ClassVar[bool] = False
    #: Whether the variant runs numba's loops only (never in the numpy tier).
    compiled_only: ClassVar[bool] = False

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
        self.team = kernel.team
        threads = self.parallel.threads if self.parallel is not None else 1
        macs = n * m * ho * wo * self.cg * self.taps
        self.split = self.splits and self.team == 1 and threads > 1 and macs >= _PARALLEL_MACS
        count = self._extent(ho, wo)
        if not self.split or n >= threads:
            self.chunks = [(i, 0, count) for i in range(n)]
        else:
            self.chunks = [(i, r.start, r.stop) for i in range(n) for r in _split(count, threads)]

    def active_team(self) -> int:
        """The threads of the EP's pool this run splits over: :attr:`team`, or 1 in a run
        the session makes on one thread (see ``HostParallel.active_threads``)."""
        return run_team(self.team, self.parallel)

    def _extent(self, ho: int, wo: int) -> int:
        """The length of a chunk's range for one whole image: output rows."""
        return ho

    @property
    def _widths(self) -> tuple[int, int]:
        assert self.layout is not None  # a padded variant's
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
            assert self.parallel is not None  # a split runs on the pool
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

    def __init__(self, shape: ConvShape, reason: str, kernel: ConvKernel) -> None:
        super().__init__(shape, reason, kernel)
        n, pixels = shape.x[0], self.out_shape[2] * self.out_shape[3]
        self.clamp = kernel.clamp
        self.pixels = pixels
        #: One image, one group, unit strides: :meth:`run` takes the short path.
        self.single = (
            n == 1 and self.group == 1 and not self.one_d and all(s == 1 for s in self.strides)
        )
        self.batch = ""
        #: float32, one group or groups of at least ``_TILE_GROUP_FILTERS`` filters: register
        #: tiles on weights packed once (``jit/pointwise.py``).
        self.tiles = None
        #: Whether the product of several small maps moves out in numba (float32).
        self.jit_columns = kernel.compiled and shape.dtype == np.float32
        if (
            kernel.compiled
            and shape.dtype == np.float32
            and (self.group == 1 or self.mg >= _TILE_GROUP_FILTERS)
            and (n == 1 or pixels >= _TILE_PIXELS)
        ):
            g = self.group
            self.tiles = _Tiles(
                n * g, self.cg, self.mg, pixels, self.team, kernel.clamp, kernel.activation, g
            )
            #: Strided pixels (a view to gather) or a 1-D input; the output's shape as returned.
            self.strided = any(st > 1 for st in self.strides)
            self.final_shape = (
                self.out_shape[:2] + self.out_shape[3:] if self.one_d else self.out_shape
            )
            self.variant = "pointwise-tiled"
            kernels = self.tiles.kernels
            self.reason = (
                f"1x1 kernel without padding, float32: {kernels.ROWS} filters by "
                f"{kernels.WIDTH} pixels in registers per step ({kernels.LEVEL}), weights "
                "packed once, bias, residual and Relu/Clip as it writes"
            )
            return
        # small maps of several images: one GEMM over all their pixels (the input moved to
        # (channel, image x pixel) and back), or for small channel counts numpy's batched
        # matmul, whose per-image calls cost far less than a GEMM through ctypes
        if n > 1 and pixels < _BAND_COLUMNS:
            self.batch = "columns" if self.cg >= _POINTWISE_COLUMNS_CHANNELS else "matmul"
            self.chunks = [(0, 0, pixels)]
            self.reason = f"1x1 kernel without padding on {n} maps of {pixels} pixels: " + (
                "all of them in one GEMM's columns"
                if self.batch == "columns"
                else "numpy's batched matmul over the images"
            )
        if self.batch == "columns" and self.jit_columns:
            _warm_columns(self.m, pixels)

    def _extent(self, ho: int, wo: int) -> int:
        return ho * wo  # chunks of output pixels

    def run(self, x, w, b, z) -> np.ndarray:
        """:meth:`GemmPlan.run`, with a short path for one image: one GEMM from
        ``bias + residual`` and the activation, without the general path's chunks
        (a 1x1 Conv on a small map takes a few microseconds; the path around it
        cost twice that)."""
        if self.tiles is not None:
            return self._run_tiled(x, w, b, z)
        if not self.single or (z is not None and z.shape != self.out_shape):
            return super().run(x, w, b, z)
        m, pixels = self.m, self.pixels
        wp = self._prepared(w)[0]
        out = np.empty(self.out_shape, self.dtype)
        flat = out.reshape(m, pixels)
        source = np.ascontiguousarray(x).reshape(self.cg, pixels)
        bias = None if b is None else b.astype(self.dtype, copy=False).reshape(m, 1)
        beta = _prefill(flat, bias, None if z is None else z.reshape(m, pixels))
        _gemm(wp[None], source[None], flat[None], beta, self.team, self.active_team())
        _activate(flat, flat, self.act, self.relu)
        return out

    def run_scaled(self, x, w, b, z, s) -> np.ndarray:
        """``conv(x * s, w)`` for FusedConv's per-input-channel scale ``s`` (float32 tiles):
        the smaller operand scaled, for one image the packed weights along their channels
        (weights packed once stay packed); for several images or groups, the input."""
        if self.x_shape[0] > 1 or self.group > 1 or x.size <= self.m * self.cg:
            return self._run_tiled(np.multiply(x, s.astype(x.dtype, copy=False)), w, b, z)
        return self._run_tiled(x, w, b, z, s.reshape(-1).astype(np.float32, copy=False))

    def _run_tiled(self, x, w, b, z, scale=None) -> np.ndarray:
        """The register-tiled kernel: ``out = act(w @ x + b + z)`` per image in one pass
        (``scale``: one image's channel scale, applied to the packed weights)."""
        tiles = self.tiles
        assert tiles is not None  # run tiled only when tiles were made
        if self.strided:
            if self.one_d:
                x = x[:, :, None, :]
            sh, sw = self.strides
            x = x[:, :, ::sh, ::sw]
        if x.dtype != np.float32 or not x.flags.c_contiguous:
            x = np.ascontiguousarray(x, np.float32)
        source = x.reshape(tiles.x_shape)
        wp = self._prepared(w)
        if scale is not None:
            blocks = wp.shape[0]
            wp = (wp.reshape(blocks, self.cg, -1) * scale.reshape(1, -1, 1)).reshape(blocks, -1)
        out = np.empty(tiles.out_shape, np.float32)
        if z is None:
            residual, late_z, clamp, kind = _NONE3, None, tiles.clamp, tiles.kind
        else:
            residual, late_z = _residual(z, self.out_shape, self.one_d, tiles.out_shape)
            early = late_z is None  # the fused activation applies in the kernel
            clamp = tiles.clamp and early
            kind = tiles.kind if early else tiles.none
        epilogue = tiles.epilogue if clamp or kind != tiles.none else tiles.plain
        team = self.active_team()
        tiles.run(source, wp, tiles.bias(b), residual, out, epilogue, clamp, kind, team)
        y = out.reshape(self.final_shape)
        if late_z is not None:
            np.add(y, late_z, out=y)
        if self.act is not None and not clamp and kind == tiles.none:
            self.act(y)
        return y

    def prepare(self, w: np.ndarray) -> np.ndarray:
        if self.tiles is not None:
            return self.tiles.pack(w.reshape(self.m, self.cg))
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
        if self.batch:
            return self._batch_work(x, wp, out, b, z, act)
        x = np.ascontiguousarray(x).reshape(n, g, cg, pixels)
        y = out.reshape(n, g, mg, pixels)
        flat_out = out.reshape(n, m, pixels)
        b2 = None if b is None else b.reshape(m, 1)
        flat_z = None if z is None else z.reshape(n, m, pixels)

        def work(chunk: Chunk) -> None:
            i, p0, p1 = chunk
            dst = flat_out[i, :, p0:p1]
            beta = _prefill(dst, b2, None if flat_z is None else flat_z[i, :, p0:p1])
            _gemm(wp, x[i, :, :, p0:p1], y[i, :, :, p0:p1], beta, self.team, self.active_team())
            _activate(dst, dst, act, relu)

        return work

    def _batch_work(self, x, wp, out, b, z, act) -> Work:
        """Every image in one call: see :meth:`__init__`."""
        n = self.x_shape[0]
        g, mg, cg, m = self.group, self.mg, self.cg, self.m
        pixels = out.shape[2] * out.shape[3]
        flat_z = None if z is None else z.reshape(n, m, pixels)
        b2 = None if b is None else b.reshape(m, 1)

        def matmul(chunk: Chunk) -> None:
            y = out.reshape(n, g, mg, pixels)
            np.matmul(wp, x.reshape(n, g, cg, pixels), out=y)
            _finish(y.reshape(n, m, pixels), y.reshape(n, m, pixels), b2, flat_z, act)

        def columns(chunk: Chunk) -> None:
            cols = np.empty((g, cg, n, pixels), self.dtype)
            np.copyto(cols, x.reshape(n, g, cg, pixels).transpose(1, 2, 0, 3))
            product = np.empty((g, mg, n * pixels), self.dtype)
            _gemm(wp, cols.reshape(g, cg, n * pixels), product, 0.0, self.team, self.active_team())
            moved = product.reshape(m, n, pixels)
            if self.jit_columns:
                from nxrt_ep_cpu.jit.conv import columns_to_images

                clamp = self.clamp if act is not None else None
                lo, hi = clamp if clamp is not None else (0.0, 0.0)
                columns_to_images(
                    moved.reshape(m, n * pixels),
                    out.reshape(n, m, pixels),
                    _NONE if b is None else np.array(b.reshape(-1), np.float32),
                    _NONE3 if flat_z is None else flat_z,
                    0,
                    lo,
                    hi,
                    clamp is not None,
                )
                if clamp is None and act is not None:
                    act(out)
            else:
                _finish(moved.transpose(1, 0, 2), out.reshape(n, m, pixels), b2, flat_z, act)

        return columns if self.batch == "columns" else matmul


class Patches(GemmPlan):
    """Kernel and stride equal, no padding, one group, float32 (a patch embedding: ConvNeXt's
    4x4 stem, ViT's 16x16): the windows tile the input, so the columns are the input
    itself, rearranged, and the convolution is a 1x1 one on them (:class:`Pointwise`'s
    register tiles)."""

    variant = "patches"
    padded = False
    compiled_only = True

    @classmethod
    def suits(cls, shape: ConvShape) -> str:
        win = shape.win
        if shape.dtype != np.float32 or shape.group != 1 or win.taps == 1:
            return ""
        if (
            win.kernel != win.strides
            or any(win.begin)
            or any(win.end)
            or any(d != 1 for d in win.dilations)
        ):
            return ""
        kh, kw = win.kernel
        return (
            f"{kh}x{kw} patches side by side: the input rearranged as columns, then the "
            "1x1 kernel's register tiles"
        )

    def __init__(self, shape: ConvShape, reason: str, kernel: ConvKernel) -> None:
        super().__init__(shape, reason, kernel)
        n, c = shape.x[:2]
        (ho, wo), (kh, kw) = shape.win.out, shape.win.kernel
        self.k = c * kh * kw
        columns = (n, self.k, ho, wo)
        win = conv_windows(columns, (self.m, self.k, 1, 1))
        inner = ConvShape.of(columns, (self.m, self.k, 1, 1), shape.dtype, win, 1)
        self.inner = Pointwise(inner, reason, kernel)
        self.window = (kh, kw)
        self._flat: tuple[Any, Any] = (None, None)

    def prepare(self, w: np.ndarray) -> np.ndarray:
        return w  # the inner plan packs the weights

    def run(self, x, w, b, z) -> np.ndarray:
        if self.one_d:
            x = x[:, :, None, :]
            z = z[:, :, None, :] if z is not None and z.ndim == 3 else z
        n, c = x.shape[:2]
        (kh, kw), (ho, wo) = self.window, self.out_shape[2:]
        patches = x[:, :, : ho * kh, : wo * kw].reshape(n, c, ho, kh, wo, kw)
        columns = np.ascontiguousarray(patches.transpose(0, 1, 3, 5, 2, 4))
        y = self.inner.run(columns.reshape(n, self.k, ho, wo), self._flat_weights(w), b, z)
        return y[:, :, 0, :] if self.one_d else y

    def _flat_weights(self, w: np.ndarray) -> np.ndarray:
        """``w`` as 1x1 weights, the same array for the same constant (so the inner plan's
        packed copy is kept)."""
        source, flat = self._flat
        if source is not w:
            flat = w.reshape(self.m, self.k, 1, 1)
            if not w.flags.writeable:
                self._flat = (w, flat)
        return flat


class _Tiles:
    """The work of :class:`Pointwise`'s register-tiled kernels for one input shape.

    Pixels in the vector lanes (``jit/pointwise.py``'s :func:`pointwise`) by
    default: items of (image, pixel chunk, block of eight filters), chunk by chunk
    so that a chunk of input stays in cache while every filter block reads it.
    Filters in the lanes (:func:`pointwise_lanes`; items of image, pixel range
    and block of 32 filters, the map cut in ranges only where there are too few
    blocks to share) where tiles of 32 pixels would compute a sixth more than
    the map has (7x7: 64 for 49) and blocks of 16 filters waste less, and for
    maps under 16 pixels. Either way the items are split over the pool in equal
    runs. (Block and pixel counts here are AVX-512's; ``jit/isa.py`` has each level's.)

    A grouped convolution is ``n`` images of ``groups`` groups each as ``n x groups``
    images of ``k`` channels and ``m`` filters, each group's weights and biases blocks of
    their own (an item's fifth column): one pass of register tiles rather than a small
    GEMM per group.
    """

    def __init__(
        self,
        n: int,
        k: int,
        m: int,
        pixels: int,
        team: int,
        clamp: tuple[float, float] | None,
        activation: tuple[str, Sequence[float]],
        groups: int = 1,
    ) -> None:
        from nxrt_ep_cpu.jit import isa, pointwise
        from nxrt_ep_cpu.jit.elementwise import NONE
        from nxrt_ep_cpu.jit.threads import TEAM_NS, bounds

        #: The loops and tile shapes of the target's instruction-set level (``jit/isa.py``).
        self.kernels = kernels = pointwise.kernels()
        lanes = kernels.LANES
        #: The activation the kernel applies as it writes (``none``: a clamp, or none).
        self.none = NONE
        self.kind, a, b = _fused_activation(activation)
        lo, hi = clamp if clamp is not None else (0.0, 0.0)
        #: The kernel's float32 parameters: the clamp's bounds and the activation's.
        self.epilogue = np.array([lo, hi, a, b], np.float32)
        self.plain = np.zeros(4, np.float32)
        #: Whether the kernel clamps (Relu, Clip), and the shapes it reads and writes.
        self.clamp = clamp is not None
        self.x_shape, self.out_shape = (n, k, pixels), (n, m, pixels)
        chunk = max(_TILE_MIN_CHUNK, _TILE_CHUNK // k // kernels.WIDTH * kernels.WIDTH)
        ranges = [[p, min(pixels, p + chunk)] for p in range(0, pixels, chunk)]
        if len(ranges) > 1 and ranges[-1][1] - ranges[-1][0] < _TILE_PIXELS:
            last = ranges.pop()  # a chunk's tiles need a vector of pixels: the tail joins
            ranges[-1][1] = last[1]
        computed = sum(_tiled_pixels(p1 - p0, kernels.WIDTH, lanes) for p0, p1 in ranges)
        waste = isa.LEVELS[kernels.LEVEL].lane_waste
        self.lanes = pixels < _TILE_PIXELS or (
            computed > waste * pixels and -(-m // lanes) * lanes < waste * m
        )
        self.rows = kernels.LANE_BLOCK if self.lanes else kernels.ROWS
        self.blocks = -(-m // self.rows)
        ns = n * m * k * pixels / isa.LEVELS[kernels.LEVEL].tile_rate
        parts = team if team > 1 and ns >= TEAM_NS else 1
        if self.lanes:
            ranges = [[0, pixels]]  # no chunks: a tile reads 8 pixels' values of a channel
        if (n * len(ranges) * self.blocks) % parts:
            # items that do not share evenly over the threads: each range cut in as many
            # pieces, at whole tiles (of LANE_PIXELS, or WIDTH keeping a vector in each)
            tile, least = (kernels.LANE_PIXELS, 1) if self.lanes else (kernels.WIDTH, lanes)
            ranges = [piece for r in ranges for piece in _cut(r, parts, tile, least)]
        self.groups = groups
        self.items = np.array(
            [
                (i, p0, p1, t, i % groups * self.blocks + t)
                for i in range(n)
                for p0, p1 in ranges
                for t in range(self.blocks)
            ],
            np.int64,
        ).reshape(-1, 5)
        self.bounds = bounds(len(self.items), parts)
        self._bias: tuple[Any, Any] = (None, None)
        self._warm(k, m, pixels)

    def pack(self, w: np.ndarray) -> np.ndarray:
        """The weights, (filters, channels) with the groups' filters one after the other,
        packed for the kernel, each group's in blocks of its own, from a cache line."""
        groups, pack = self.groups, self.kernels.pack
        m = w.shape[0] // groups
        packed = np.concatenate([pack(w[g * m : (g + 1) * m], self.rows) for g in range(groups)])
        aligned = _aligned(packed.shape)
        aligned[:] = packed
        return aligned

    def bias(self, b: np.ndarray | None) -> np.ndarray:
        """The bias padded to whole filter blocks (zeros for none), kept while it is the same
        constant array."""
        source, padded = self._bias
        if padded is None or source is not b:
            groups, m = self.groups, self.out_shape[1]
            padded = np.zeros((groups, self.blocks * self.rows), np.float32)
            if b is not None:
                padded[:, :m] = b.reshape(groups, m)
            padded = padded.reshape(-1)
            if b is None or not b.flags.writeable:
                self._bias = (b, padded)
        return padded

    def run(self, x, wp, bias, z, out, epi, clamp: bool, kind: int, team: int) -> None:
        """The kernel over every item, split over ``team`` threads of the pool above 1."""
        kernels, split = self.kernels, team > 1 and len(self.bounds) > 2
        if split:
            compiled("threads").size_team(team)
        terms = (self.items, epi, clamp, kind)
        if self.lanes and split:
            kernels.pointwise_lanes_team(x, wp, bias, z, out, *terms, self.bounds)
        elif self.lanes:
            kernels.pointwise_lanes(x, wp, bias, z, out, *terms, 0, len(self.items))
        elif split:
            kernels.pointwise_team(x, wp, bias, z, out, *terms, self.bounds)
        else:
            kernels.pointwise(x, wp, bias, z, out, *terms, 0, len(self.items))

    def _warm(self, k: int, m: int, pixels: int) -> None:
        """Compile the kernels (or load them from the disk cache) now, while the session is
        created, with the argument types of a run and no items."""
        x = np.zeros((0, k, pixels), np.float32)
        wp = np.zeros((self.groups * self.blocks, k * self.rows), np.float32)
        args = (x, wp, self.bias(None), _NONE3, np.zeros((0, m, pixels), np.float32))
        kernels, split, none = self.kernels, len(self.bounds) > 2, np.zeros(2, np.int64)
        terms = (self.items, self.plain, False, self.none)
        if self.lanes:
            kernels.pointwise_lanes(*args, *terms, 0, 0)
            if split:
                kernels.pointwise_lanes_team(*args, *terms, none)
        else:
            kernels.pointwise(*args, *terms, 0, 0)
            if split:
                kernels.pointwise_team(*args, *terms, none)


def _fused_activation(activation: tuple[str, Sequence[float]]) -> tuple[int, float, float]:
    """The code and two float32 parameters of an activation the compiled 1x1 kernels apply
    themselves (``jit/elementwise.py``'s ``FUSED``), or ``NONE``'s."""
    from nxrt_ep_cpu.jit.elementwise import CODES, FUSED, NONE, Activation

    name, params = activation
    if CODES.get(name) not in FUSED:
        return NONE, 0.0, 0.0
    compiled = Activation(name, params)
    return compiled.kind, float(compiled.a), float(compiled.b)


def _cut(span: list[int], parts: int, tile: int, least: int) -> list[list[int]]:
    """``span`` ([first, stop) pixels) in up to ``parts`` near-equal pieces whose inner edges
    fall on multiples of ``tile`` from its start, each at least ``least`` long."""
    p0, p1 = span
    tiles = (p1 - p0) / tile
    edges = [p0 + round(i * tiles / parts) * tile for i in range(parts)] + [p1]
    pieces = [[a, b] for a, b in zip(edges, edges[1:], strict=False) if b > a]
    if any(b - a < least for a, b in pieces):
        return [span]
    return pieces


def _tiled_pixels(count: int, width: int, lanes: int) -> int:
    """Pixels the pixel-lane kernel computes for a chunk of ``count`` (its loop: tiles of
    ``width``, or one vector of ``lanes`` for that many or fewer left, the last one
    shifted back to end the chunk)."""
    at = done = 0
    while at < count:
        tile = width if count - at > lanes and count >= width else lanes
        at, done = min(at, count - tile) + tile, done + tile
    return done


class Unfolded(GemmPlan):
    """float32, one group, maps whose columns fit in cache: each image unfolded into its
    columns, (tap, channel) by output pixel (``jit/conv.py``'s :func:`image_columns`), then
    :class:`Pointwise`'s register tiles on them, the bias, residual and activation applied
    as they write (a GEMM through BLAS pays its packing and a call per image, and runs
    short maps slowly). Larger columns (a 28x28 map of 128 channels) go to the GEMMs,
    whose blocking keeps them in cache; several small maps to :class:`Im2col`'s one GEMM
    over all of them."""

    variant = "im2col-tiled"
    padded = False
    compiled_only = True

    @classmethod
    def suits(cls, shape: ConvShape) -> str:
        win, k = shape.win, shape.win.taps * shape.cg
        if shape.dtype != np.float32 or shape.group != 1 or win.taps == 1:
            return ""
        pixels = win.out[0] * win.out[1]
        if shape.cg < _UNFOLD_CHANNELS or k > _UNFOLD_DEPTH or k * pixels > _UNFOLD_VALUES:
            return ""
        if shape.x[0] > 1 and pixels < _BAND_COLUMNS:
            return ""  # several small maps: Im2col's one GEMM over all their columns
        return (
            f"{shape.cg} channels, {pixels} pixels: each image unfolded into {k} rows of "
            "columns, then the 1x1 kernel's register tiles"
        )

    def __init__(self, shape: ConvShape, reason: str, kernel: ConvKernel) -> None:
        super().__init__(shape, reason, kernel)
        n, c = shape.x[:2]
        win = shape.win
        (ho, wo), self.k = win.out, c * self.taps
        self.columns = (n, self.k, ho, wo)
        inner_win = conv_windows(self.columns, (self.m, self.k, 1, 1))
        inner = ConvShape.of(self.columns, (self.m, self.k, 1, 1), shape.dtype, inner_win, 1)
        self.inner = Pointwise(inner, reason, kernel)
        self.geometry = np.array(
            [1, *win.kernel, *win.strides, *win.dilations, *win.begin, *win.out], np.int64
        )
        from nxrt_ep_cpu.jit.conv import image_columns

        self.unfold = image_columns
        _warm_columns(self.m, ho * wo, shape.x)
        self._flat: tuple[Any, Any] = (None, None)

    def prepare(self, w: np.ndarray) -> np.ndarray:
        return w  # laid out by :meth:`_flat_weights`, packed by the inner plan

    def run(self, x, w, b, z) -> np.ndarray:
        if self.one_d:
            x = x[:, :, None, :]
            z = z[:, :, None, :] if z is not None and z.ndim == 3 else z
        x = np.ascontiguousarray(x, np.float32)
        n, k = x.shape[0], self.k
        key = ("conv-unfolded", self.columns)
        cols = self.workspace.take(key, lambda: np.empty(self.columns, np.float32))
        try:
            flat = cols.reshape(n, 1, k, -1)
            for i in range(n):
                self.unfold(x, flat[i], self.geometry, i, i + 1)
            y = self.inner.run(cols, self._flat_weights(w), b, z)
        finally:
            self.workspace.give(key, cols)
        return y[:, :, 0, :] if self.one_d else y

    def _flat_weights(self, w: np.ndarray) -> np.ndarray:
        """``w`` as 1x1 weights over the columns' rows, (tap, channel) order; the same array
        for the same constant (so the inner plan's packed copy is kept)."""
        source, flat = self._flat
        if source is not w:
            taps = w.reshape(self.m, self.cg, self.taps).transpose(0, 2, 1)
            flat = np.ascontiguousarray(taps, np.float32).reshape(self.m, self.k, 1, 1)
            if not w.flags.writeable:
                flat.flags.writeable = False
                self._flat = (w, flat)
        return flat


class Direct(GemmPlan):
    """Few channels per group (depthwise above all), float32: convolved directly in numba
    (``jit/conv.py``), a band of output rows at a time, nine taps per vectorized pass, the
    bias, residual and a Relu/Clip applied as the band is written out."""

    padded = False
    compiled_only = True

    @classmethod
    def suits(cls, shape: ConvShape) -> str:
        if shape.dtype != np.float32 or any(s > 2 for s in shape.win.strides):
            return ""  # larger strides split the input in too many phases
        layout, cg = shape.layout, shape.cg
        band = max(1, min(layout.ho, _DIRECT_BAND // layout.wq))
        computed = -(-band * layout.wq // _LANES) * _LANES
        used = band * layout.wo / computed  # outputs kept of the values computed
        if cg == 1:
            return "one channel per group: direct loops, nine taps per vectorized pass"
        for channels, least in _DIRECT_CHANNELS:
            if cg <= channels and used >= least:
                return (
                    f"{cg} channels per group, {used:.0%} of the computed values kept: "
                    "direct loops, nine taps per vectorized pass, two filters at a time"
                )
        return ""

    def __init__(self, shape: ConvShape, reason: str, kernel: ConvKernel) -> None:
        super().__init__(shape, reason, kernel)
        self.variant = "depthwise" if shape.cg == 1 else "direct"
        self.clamp = kernel.clamp
        layout, cg = shape.layout, shape.cg
        n = shape.x[0]
        phases = layout.strides[0] * layout.strides[1]
        hqwq = layout.hq * layout.wq
        block = phases * hqwq
        taps = [
            ci * block + phase * hqwq + offset for ci in range(cg) for phase, offset in layout.taps
        ]
        count = -(-len(taps) // 3) * 3
        if count % 9 == 6:
            count += 3  # one pass of nine rather than two of three
        self.width = count
        self.starts = np.array(taps + [-1] * (count - len(taps)), np.int64)
        band = max(1, min(layout.ho, _DIRECT_BAND // layout.wq))
        zero = max(cg * block, max(taps) + layout.ho * layout.wq + _LANES)
        size = zero + band * layout.wq + 2 * _LANES
        self.geometry = np.array(
            [
                self.group,
                cg,
                self.mg,
                layout.ho,
                layout.wo,
                layout.wq,
                hqwq,
                block,
                size,
                zero,
                band,
                int(self.clamp is not None),
                *shape.win.begin,
                *layout.strides,
                0,
            ],
            np.int64,
        )
        threads = self.parallel.threads if self.parallel is not None else 1
        bands = -(-layout.ho // band)
        computed = n * self.m * bands * (-(-band * layout.wq // _LANES) * _LANES) * count
        ns = computed / _DIRECT_RATE[self.mg > 1]
        parts = self._parts(ns, threads)
        # too few (image, group) pairs for the pool: their filters split in blocks too,
        # an even number each (the kernel computes filters two at a time)
        blocks = min(-(-self.mg // 2), -(-parts // (n * self.group)))
        self.filter_block = 2 * -(-self.mg // (2 * blocks)) if blocks > 1 else self.mg
        self.geometry[-1] = self.filter_block
        self.items = n * self.group * -(-self.mg // self.filter_block)
        self.ranges = _split(self.items, parts)
        self.bounds = np.array([r.start for r in self.ranges] + [self.items], np.int64)
        self._bias: tuple[Any, Any] = (None, None)
        from nxrt_ep_cpu.jit.conv import direct_conv, direct_conv_team

        self.kernel, self.team_kernel = direct_conv, direct_conv_team
        self._warm()

    def _parts(self, ns: float, threads: int) -> int:
        """Pieces of ``ns`` of work: one per thread of the EP's pool (or of the session's,
        without it) once the work repays starting them."""
        if self.team > 1:
            from nxrt_ep_cpu.jit.threads import TEAM_NS

            return self.team if ns >= TEAM_NS else 1
        return threads if threads > 1 and ns >= _PARALLEL_NS else 1

    def _warm(self) -> None:
        """Compile the kernel (or load it from the disk cache) now, while the session is
        created, with the argument types of a run and no work."""
        plane = np.zeros((1, 1, 1), np.float32)
        args = (plane, self.prepare(np.zeros(self.m * self.cg * self.taps)), _NONE, _NONE3)
        self._launch(*args, plane, self.geometry, 0.0, 0.0, range(0))
        if self.team > 1 and len(self.ranges) > 1:
            self._launch_team(*args, plane, self.geometry, 0.0, 0.0, np.zeros(2, np.int64))

    def _bias_vector(self, b: np.ndarray) -> np.ndarray:
        """The bias as a writeable float32 vector of the plan's own (the compiled kernel's
        argument types, read-only arrays included, would otherwise differ run to run),
        kept while the bias is the same constant array."""
        source, vector = self._bias
        if source is not b:
            vector = np.array(b, np.float32).reshape(-1)
            if not b.flags.writeable:
                self._bias = (b, vector)
        return vector

    def _launch(self, x, wp, bias, residual, planes, geometry, lo, hi, part: range) -> None:
        """The compiled kernel on work items ``part``."""
        self.kernel(
            x, wp, self.starts, bias, residual, planes, geometry, lo, hi, part.start, part.stop
        )

    def _launch_team(self, x, wp, bias, residual, planes, geometry, lo, hi, bounds) -> None:
        """The compiled kernel on the parts of items ``bounds`` gives, over the pool."""
        self.team_kernel(x, wp, self.starts, bias, residual, planes, geometry, lo, hi, bounds)

    def _plane(self, item: int) -> int:
        """The first output plane (image x filters + filter) of work item ``item``."""
        blocks = -(-self.mg // self.filter_block)
        image, rest = divmod(item, self.group * blocks)
        group, block = divmod(rest, blocks)
        return image * self.m + group * self.mg + min(block * self.filter_block, self.mg)

    def prepare(self, w: np.ndarray) -> np.ndarray:
        flat = np.zeros((self.m, self.width), np.float32)
        flat[:, : self.cg * self.taps] = w.reshape(self.m, self.cg * self.taps)
        return flat

    def run(self, x, w, b, z) -> np.ndarray:
        n = self.x_shape[0]
        _, c, h, width = self.x_shape
        x = np.ascontiguousarray(x, np.float32).reshape(n * c, h, width)
        wp = self._prepared(w)
        out = np.empty(self.out_shape, np.float32)
        planes = out.reshape(n * self.m, *self.out_shape[2:])
        bias = _NONE if b is None else self._bias_vector(b)
        residual, late_z = _residual(z, self.out_shape, self.one_d, planes.shape)
        lo, hi = self.clamp if self.clamp is not None and late_z is None else (0.0, 0.0)
        geometry = self.geometry
        if late_z is not None:
            geometry = geometry.copy()
            geometry[_CLAMP] = 0
        act = None if self.clamp is not None or late_z is not None else self.act
        pixels = planes.shape[1] * planes.shape[2]
        flat = planes.reshape(-1)
        terms = (x, wp, bias, residual, planes, geometry, lo, hi)

        def work(part: range) -> None:
            self._launch(*terms, part)
            if act is not None:
                first, stop = self._plane(part.start), self._plane(part.stop)
                act(flat[first * pixels : stop * pixels])

        if len(self.ranges) > 1 and self.team > 1:
            if self.active_team() > 1:
                compiled("threads").size_team(self.team)
                self._launch_team(*terms, self.bounds)
                if act is not None:
                    act(flat)
            else:
                work(range(self.items))
        elif len(self.ranges) > 1:
            assert self.parallel is not None  # several ranges: split for the pool
            self.parallel.map(work, self.ranges)
        else:
            work(range(self.items))
        if late_z is not None:
            np.add(out, late_z, out=out)
            if self.act is not None:
                self.act(out)
        return out[:, :, 0, :] if self.one_d else out


class Blocked(Direct):
    """Depthwise on small maps, float32: a vector register of channels at a time (16 on
    AVX-512, 8 on AVX2: :attr:`lanes`) in channels-last, each output pixel's channels one
    register (``jit/conv.py``), so that the padding is never computed; the bias, residual
    and a Relu/Clip applied as the block is written.
    Larger maps go a row at a time (:attr:`rows`), their blocks cut in bands of output
    rows (:attr:`parts`) where they do not split evenly over the EP's pool."""

    @classmethod
    def suits(cls, shape: ConvShape) -> str:
        c = shape.x[1]
        if shape.dtype != np.float32 or not shape.group == c == shape.m:
            return ""
        if c < 16 or shape.win.out[1] > _BLOCKED_WIDTH:
            return ""
        return (
            f"one filter per channel on a {shape.win.out[0]}x{shape.win.out[1]} map: a "
            "vector register of channels, eight pixels at a time"
        )

    def __init__(self, shape: ConvShape, reason: str, kernel: ConvKernel) -> None:
        GemmPlan.__init__(self, shape, reason, kernel)
        self.variant = "depthwise"
        self.clamp = kernel.clamp
        win = shape.win
        n, c, h, w = shape.x
        (kh, kw), (sh, sw), (dh, dw) = win.kernel, win.strides, win.dilations
        (pt, pl), (ho, wo) = win.begin, win.out
        hp = max(h + pt + win.end[0], (ho - 1) * sh + (kh - 1) * dh + 1)
        wp = max(w + pl + win.end[1], (wo - 1) * sw + (kw - 1) * dw + 1)
        from nxrt_ep_cpu.jit import conv

        #: The target's loops (``jit/isa.py``) and the channels of one block: a vector.
        kernels = conv.kernels()
        self.lanes = lanes = kernels.LANES
        self.blocks = -(-c // lanes)
        clamp = int(self.clamp is not None)
        #: A row at a time (``depthwise_rows``) where a whole plane of a block in
        #: channels-last would leave L1 and the rows are wide enough to transpose whole.
        self.rows = min(w, wo) >= lanes and h * w >= _ROWS_PIXELS
        self.parts = 1
        if self.rows:
            # bands of rows where the blocks do not split evenly over the EP's pool
            if self.team > 1 and (n * self.blocks) % self.team:
                self.parts = self.team // math.gcd(n * self.blocks, self.team)
            self.columns = np.array(
                [j * dw * lanes for _ in range(kh) for j in range(kw)], np.int64
            )
            self.tap_rows = np.array([i * dh for i in range(kh) for _ in range(kw)], np.int64)
            span = (kh - 1) * dh + 1
            self.geometry = np.array(
                [c, h, w, ho, wo, pt, pl, sh, sw, wp, span, clamp, self.parts], np.int64
            )
        else:
            self.offsets = np.array(
                [(i * dh * wp + j * dw) * lanes for i in range(kh) for j in range(kw)], np.int64
            )
            self.geometry = np.array([c, h, w, ho, wo, pt, pl, sh, sw, wp, hp, clamp], np.int64)
        self.items = n * self.blocks * self.parts
        self._tiles: tuple[Any, Any] = (None, None)
        threads = self.parallel.threads if self.parallel is not None else 1
        macs, moved = ho * wo * self.taps, h * w + ho * wo
        ns = n * self.blocks * lanes * (macs / _BLOCKED_RATE[0] + moved / _BLOCKED_RATE[1])
        self.ranges = _split(self.items, self._parts(ns, threads))
        self.bounds = np.array([r.start for r in self.ranges] + [self.items], np.int64)
        if self.rows:
            self.kernel, self.team_kernel = kernels.depthwise_rows, kernels.depthwise_rows_team
        else:
            self.kernel = kernels.depthwise_blocks
            self.team_kernel = kernels.depthwise_blocks_team
        self._warm()

    def prepare(self, w: np.ndarray) -> np.ndarray:
        lanes = self.lanes
        taps = np.zeros((self.blocks * lanes, self.taps), np.float32)
        taps[: self.m] = w.reshape(self.m, self.taps)
        blocks = taps.reshape(self.blocks, lanes, self.taps).transpose(0, 2, 1)
        prepared = _aligned((self.blocks, self.taps * lanes))
        prepared[:] = blocks.reshape(self.blocks, self.taps * lanes)
        return prepared

    def _bias_vector(self, b: np.ndarray) -> np.ndarray:
        return b  # tiled (and copied) by :meth:`_tiled`

    def _tiled(self, bias: np.ndarray) -> np.ndarray:
        """Each block's biases four times (the kernel's accumulators start at them); kept
        while the bias is the same constant array."""
        source, tiled = self._tiles
        if source is bias:
            return tiled
        lanes = self.lanes
        tiled = _aligned((self.blocks, 4 * lanes))
        if bias.size:
            padded = np.zeros(self.blocks * lanes, np.float32)
            padded[: bias.size] = bias
            tiled.reshape(self.blocks, 4, lanes)[:] = padded.reshape(self.blocks, 1, lanes)
        if not bias.flags.writeable or bias is _NONE:
            self._tiles = (bias, tiled)
        return tiled

    def _taps(self) -> tuple[np.ndarray, ...]:
        """Where the kernel finds each tap: column and row offsets for ``depthwise_rows``,
        offsets in the padded plane for ``depthwise_blocks``."""
        return (self.columns, self.tap_rows) if self.rows else (self.offsets,)

    def _launch(self, x, wp, bias, residual, planes, geometry, lo, hi, part: range) -> None:
        tiles = self._tiled(bias)
        self.kernel(
            x, wp, tiles, *self._taps(), residual, planes, geometry, lo, hi, part.start, part.stop
        )

    def _launch_team(self, x, wp, bias, residual, planes, geometry, lo, hi, bounds) -> None:
        tiles = self._tiled(bias)
        self.team_kernel(x, wp, tiles, *self._taps(), residual, planes, geometry, lo, hi, bounds)

    def _plane(self, item: int) -> int:
        image, block = divmod(item // self.parts, self.blocks)
        return image * self.m + min(block * self.lanes, self.m)


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
        assert layout is not None  # a padded variant's
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

    def __init__(self, shape: ConvShape, reason: str, kernel: ConvKernel) -> None:
        super().__init__(shape, reason, kernel)
        assert self.layout is not None  # padded until the columns move to numba below
        n, pixels = shape.x[0], self.layout.ho * self.layout.wo
        k = self.taps * self.cg
        self.images = _images_per_band(n, pixels, k + self.m)
        self.jit = None
        if self.images > 1:
            threads = self.parallel.threads if self.parallel is not None else 1
            macs = n * pixels * k * self.m
            if threads > 1 and macs >= _PARALLEL_MACS:
                # bands of whole images are independent: one per pool thread at least,
                # each with its own single-threaded GEMM
                self.images = min(self.images, -(-n // threads))
                self.split = True
            self.chunks = [(i, 0, self.layout.ho) for i in range(0, n, self.images)]
            self.reason += f", {self.images} images per GEMM"
            if shape.dtype == np.float32 and kernel.compiled:
                from nxrt_ep_cpu.jit.conv import columns_to_images, image_columns

                self.jit = (image_columns, columns_to_images)
                _warm_columns(self.m, self.out_shape[2] * self.out_shape[3], shape.x)
                self.padded = False
                self.layout = None
                win = shape.win
                self.clamp = kernel.clamp
                self.geometry = np.array(
                    [
                        self.group,
                        *win.kernel,
                        *win.strides,
                        *win.dilations,
                        *win.begin,
                        *win.out,
                    ],
                    np.int64,
                )

    def prepare(self, w: np.ndarray) -> np.ndarray:
        g, mg = self.group, self.mg
        return np.ascontiguousarray(w.transpose(0, 1, 3, 2)).reshape(g, mg, self.taps * self.cg)

    def work(self, src, wp, out, b, z, act) -> Work:
        if self.images > 1:
            return self._images_work(src, wp, out, b, z, act)
        relu = self.relu and act is not None
        layout, g, cg, mg, taps, wq, wo = (
            self.layout,
            self.group,
            self.cg,
            self.mg,
            self.taps,
            *self._widths,
        )
        assert layout is not None  # a padded variant's
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
                    else cast(np.ndarray, scratch)[: self.m * size].reshape(g, mg, size)
                )
                valid = acc.reshape(self.m, e - a, wo)
                beta = _prefill(valid, b, None if z is None else z[i, :, a:e])
                _gemm(wp, flat, acc, beta, self.team, self.active_team())
                _activate(valid, dst, act, relu)

        return work

    def _images_work(self, src, wp, out, b, z, act) -> Work:
        """Several whole images per GEMM: columns ``(tap, channel) x (image, pixel)``, one
        GEMM per group for the band, then the product moved to ``(image, filter, pixel)``
        with the fused terms."""
        if self.jit is not None:
            return self._jit_images_work(src, wp, out, b, z, act)
        layout, g, cg, mg, taps, wq, wo = (
            self.layout,
            self.group,
            self.cg,
            self.mg,
            self.taps,
            *self._widths,
        )
        assert layout is not None  # a padded variant's
        ho, n, m = layout.ho, self.x_shape[0], self.m
        count = self.images * ho * wo
        key = ("conv-image-grid", g, taps, cg, mg, count, self.dtype)

        def scratch() -> tuple[np.ndarray, np.ndarray]:
            return np.empty((g, taps, cg, count), self.dtype), np.empty((g, mg, count), self.dtype)

        def work(chunk: Chunk) -> None:
            i0 = chunk[0]
            i1 = min(n, i0 + self.images)
            images, size = i1 - i0, (i1 - i0) * ho * wo
            # each chunk its own columns and product: the chunks may run on the pool at once
            held = self.workspace.take(key, scratch)
            try:
                cols, acc = held
                grid = cols[:, :, :, :size].reshape(g, taps, cg, images, ho, wo)
                for t in range(taps):
                    phase, offset = layout.taps[t]
                    block = src[i0:i1, phase, :, offset : offset + ho * wq]
                    block = block.reshape(images, g, cg, ho, wq)[..., :wo]
                    grid[:, t] = block.transpose(1, 2, 0, 3, 4)
                product = acc[:, :, :size]
                flat = grid.reshape(g, taps * cg, size)
                _gemm(wp, flat, product, 0.0, self.team, self.active_team())
                moved = product.reshape(m, images, ho, wo).transpose(1, 0, 2, 3)
                _finish(moved, out[i0:i1], b, None if z is None else z[i0:i1], act)
            finally:
                self.workspace.give(key, held)

        return work

    def _jit_images_work(self, x, wp, out, b, z, act) -> Work:
        """:meth:`_images_work` with the columns packed straight from the input and the
        product moved out, bias, residual and Relu/Clip in the same pass, in numba."""
        assert self.jit is not None  # called only when the columns move in numba
        image_columns, columns_to_images = self.jit
        g, cg, mg, taps, m = self.group, self.cg, self.mg, self.taps, self.m
        n, (ho, wo) = self.x_shape[0], self.out_shape[2:]
        pixels = ho * wo
        count = self.images * pixels
        key = ("conv-image-columns", g, taps * cg, mg, count)
        flat_out = out.reshape(n, m, pixels)
        bias = _NONE if b is None else np.array(b.reshape(-1), np.float32)
        residual = _NONE3 if z is None else z.reshape(n, m, pixels)
        clamp = self.clamp if act is not None else None
        lo, hi = clamp if clamp is not None else (0.0, 0.0)
        rest = act if clamp is None else None
        x = np.ascontiguousarray(x)

        def work(chunk: Chunk) -> None:
            i0 = chunk[0]
            i1 = min(n, i0 + self.images)
            size = (i1 - i0) * pixels
            held = self.workspace.take(key, lambda: _image_scratch(g, taps * cg, mg, count))
            try:
                cols, acc = held
                image_columns(x, cols, self.geometry, i0, i1)
                product = acc[:, :, :size]
                _gemm(wp, cols[:, :, :size], product, 0.0, self.team, self.active_team())
                columns_to_images(
                    product.reshape(m, size),
                    flat_out,
                    bias,
                    residual,
                    i0,
                    lo,
                    hi,
                    clamp is not None,
                )
            finally:
                self.workspace.give(key, held)
            if rest is not None:
                rest(out[i0:i1])

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
        assert layout is not None  # a padded variant's
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
                    _gemm(wp[t], block, acc, beta if t == 0 else 1.0, self.team, self.active_team())
                _activate(valid, out[i, :, a:e], act, relu)

        return work


#: The GEMM variants, in the order they are tried: the first that suits a shape is chosen
#: (a 1x1 depthwise convolution is pointwise; :class:`Taps` suits every shape).
VARIANTS: tuple[type[GemmPlan], ...] = (
    Pointwise,
    Patches,
    Blocked,
    Unfolded,
    Direct,
    Depthwise,
    Im2col,
    Taps,
)


# -- the pieces the variants share --------------------------------------------------------------


def _images_per_band(n: int, pixels: int, per_pixel: int) -> int:
    """Whole images per GEMM for feature maps with fewer than ``_BAND_COLUMNS`` pixels (a
    GEMM that narrow runs slowly and its call costs more than it computes), up to
    ``_BATCH_COLUMNS`` columns and ``_BAND_VALUES`` values of temporaries; 1 for larger
    maps, whose GEMMs go image by image into the output itself."""
    if n < 2 or pixels >= _BAND_COLUMNS:
        return 1
    return max(1, min(n, _BATCH_COLUMNS // pixels, _BAND_VALUES // (per_pixel * pixels)))


def _residual(
    z: np.ndarray | None, out_shape: tuple[int, ...], one_d: bool, shape: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray | None]:
    """The residual as the numba kernels read it (float32, reshaped to ``shape``; size 0 for
    none), or, for one that broadcasts, a stand-in and the residual to add afterwards."""
    if z is None:
        return _NONE3, None
    if one_d and z.ndim == 3:
        z = z.reshape(z.shape[:2] + (1,) + z.shape[2:])
    if z.shape != out_shape:
        return _NONE3, z
    return np.ascontiguousarray(z, np.float32).reshape(shape), None


def _float_vector(b: np.ndarray) -> np.ndarray:
    """``b`` as a contiguous float32 vector: the array itself when it is one already, so
    that a constant bias keeps its identity (and what is prepared from it stays cached)."""
    if b.dtype == np.float32 and b.ndim == 1 and b.flags.c_contiguous:
        return b
    return np.ascontiguousarray(b, np.float32).reshape(-1)


def _warm_columns(m: int, pixels: int, x_shape: tuple[int, ...] | None = None) -> None:
    """Compile the column kernels (or load them from the disk cache) now, while the session
    is created, with the argument types of a run and no images."""
    from nxrt_ep_cpu.jit.conv import columns_to_images, image_columns

    product = np.zeros((m, 0), np.float32)
    columns_to_images(
        product, np.zeros((0, m, pixels), np.float32), _NONE, _NONE3, 0, 0.0, 0.0, False
    )
    if x_shape is not None:
        _, c, h, w = x_shape
        x = np.zeros((0, c, h, w), np.float32)
        image_columns(x, np.zeros((1, 1, 0), np.float32), np.zeros(11, np.int64), 0, 0)


def _image_scratch(groups: int, k: int, mg: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """The columns and the product of one band of whole images (float32)."""
    return np.empty((groups, k, count), np.float32), np.empty((groups, mg, count), np.float32)


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


def _gemm(
    a: np.ndarray, b: np.ndarray, c: np.ndarray, beta: float, parts: int = 1, threads: int = 1
) -> None:
    """``c = a @ b + beta * c`` per group (3-D operands), in place through BLAS when it can,
    each group's GEMM cut into ``parts`` above 1, taken by ``threads`` of the EP's pool
    (the result depends on ``parts`` only)."""
    groups = a.shape[0]
    if parts > 1:
        gemm = compiled("threads").gemm
        if gemm(a[0], b[0], c[0], beta, parts, threads):
            for j in range(1, groups):
                gemm(a[j], b[j], c[j], beta, parts, threads)
            return
    macs = a[0].size * b.shape[-1]
    if GEMM is not None and macs >= _DIRECT_MACS and GEMM(a[0], b[0], c[0], beta):
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


def _aligned(shape: tuple[int, int]) -> np.ndarray:
    """Zeroed float32 ``shape`` starting on a 64-byte cache line (the compiled kernels' vector
    loads of a row then never straddle two lines)."""
    size = shape[0] * shape[1]
    buf = np.zeros(size + 16, np.float32)
    skip = (-buf.ctypes.data % 64) // 4
    return buf[skip : skip + size].reshape(shape)


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

"""Convolution as GEMM, with the GEMM layout chosen per input shape.

The :class:`ConvKernel` built for every Conv node (and for the optimizer's
``pkg.nxrt::FusedConv``: a Conv with a residual input and an activation
fused in) picks one variant per input shape and records it, with its
reason, as ``variant``/``variant_reason`` (the profiler writes both):

* ``pointwise``: a 1x1 kernel without padding is one GEMM on the input as it
  is (strided pixels gathered first);
* ``taps``: one GEMM per kernel tap, ``y += W_tap @ x_shifted``, each shifted
  input read in place from a flat padded copy (see :class:`_Layout`), each
  product added in place by BLAS (``beta = 1``, see ``_blas.py``): no column
  matrix and no temporary at all;
* ``im2col``: the shifted rows copied into one column matrix (row copies
  from the same flat layout, no transposing copy), then one GEMM with
  ``K = taps x channels``: for groups with few channels, where a GEMM per
  tap has too small a K, and for small feature maps, where the padded rows
  of ``taps`` would waste too much of the GEMM;
* ``depthwise``: one filter per channel: the taps of a channel block copied
  side by side, then a batched ``(1 x taps) @ (taps x pixels)`` matmul;
* ``generic``: N-D, half precision, integers, cropping pads.

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

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from nxrt.contrib_ops import DOMAIN as FUSED_DOMAIN
from nxrt.errors import KernelFailed, NxrtError
from nxrt.kernel import Cost, Kernel, attribute_values
from nxrt.registry import estimate_cost
from nxrt_ep_cpu.ops._blas import GEMM
from nxrt_ep_cpu.ops._registry import op
from nxrt_ep_cpu.ops._spatial import Windows, pad_for, tap_views, windows
from nxrt_ep_cpu.ops.elementwise import inplace_activation, zeros
from nxrt_ep_cpu.provider import translate_error

if TYPE_CHECKING:
    import onnx_ir as ir

    from nxrt.host_parallel import HostParallel
    from nxrt.provider import ExecutionProvider

#: dtypes the GEMM variants handle; the others take the generic path.
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


def _conv_cost(node: ir.Node) -> Cost:
    """Two flops per multiply-add of the GEMM; bytes of every known input and output."""
    base = estimate_cost(node)
    w = node.inputs[1] if len(node.inputs) > 1 else None
    dims = [v.shape if v is not None else None for v in (w, node.outputs[0])]
    if any(d is None or not all(isinstance(k, int) for k in d) for d in dims):
        return base
    return Cost(2 * math.prod(dims[1]) * math.prod(dims[0][1:]), base.bytes)


@op("Conv", since=(1, 11, 22), cost=_conv_cost)
def conv(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None = None,
    /,
    *,
    auto_pad: str = "NOTSET",
    dilations: list[int] | None = None,
    group: int = 1,
    kernel_shape: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> np.ndarray:
    """N-D grouped convolution (cross-correlation), bias added per output channel."""
    n, c = x.shape[:2]
    m = w.shape[0]
    kernel = tuple(kernel_shape) if kernel_shape else w.shape[2:]
    if tuple(kernel) != w.shape[2:]:
        raise KernelFailed(f"kernel_shape {list(kernel)} does not match weights {w.shape}")
    if c % group or m % group or w.shape[1] * group != c:
        raise KernelFailed(
            f"{c} input channels, {m} filters of {w.shape[1]} channels and group {group} "
            "do not agree"
        )
    win = windows(
        x.shape[2:],
        kernel,
        strides=strides,
        dilations=dilations,
        pads=pads,
        auto_pad=auto_pad,
    )
    if x.dtype.itemsize < 4 and x.dtype.kind == "f":
        # Half-precision sums lose digits; accumulate in float32 and round once.
        wide = conv(
            x.astype(np.float32),
            w.astype(np.float32),
            None if b is None else b.astype(np.float32),
            auto_pad=auto_pad,
            dilations=dilations,
            group=group,
            kernel_shape=kernel_shape,
            pads=pads,
            strides=strides,
        )
        return wide.astype(x.dtype)
    if group == c == m:
        y = _depthwise(x, w, win)
    elif all(k == 1 for k in win.kernel) and not any(win.begin) and not any(win.end):
        y = _pointwise(x, w, win, group)
    else:
        y = _im2col(x, w, win, group)
    if b is not None:
        y += b.reshape((m,) + (1,) * len(win.out)).astype(y.dtype, copy=False)
    return y


def _pointwise(x: np.ndarray, w: np.ndarray, win: Windows, group: int) -> np.ndarray:
    """1x1 kernel without padding: one (grouped) matmul over the strided input."""
    n, c = x.shape[:2]
    m = w.shape[0]
    if any(s != 1 for s in win.strides):
        x = x[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in win.strides)]
    cols = x.reshape(n, group, c // group, math.prod(win.out))
    y = np.matmul(w.reshape(group, m // group, c // group), cols)
    return y.reshape((n, m) + win.out)


def _im2col(x: np.ndarray, w: np.ndarray, win: Windows, group: int) -> np.ndarray:
    """Copy each kernel tap's strided view into columns, then one batched matmul."""
    n, c = x.shape[:2]
    m = w.shape[0]
    xp = pad_for(x, win, 0)
    cols = np.empty((n, c) + win.kernel + win.out, dtype=np.result_type(x, w))
    for tap, view in tap_views(xp, win):
        cols[(slice(None), slice(None)) + tap] = view
    cols = cols.reshape(n, group, (c // group) * win.taps, math.prod(win.out))
    y = np.matmul(w.reshape(group, m // group, -1), cols)
    return y.reshape((n, m) + win.out)


def _depthwise(x: np.ndarray, w: np.ndarray, win: Windows) -> np.ndarray:
    """One filter per channel: accumulate ``tap value * weight`` over the kernel taps."""
    c = x.shape[1]
    xp = pad_for(x, win, 0)
    # per tap, the weight of every channel, shaped to broadcast over the output
    weights = w.reshape(c, win.taps).T.reshape((win.taps, c) + (1,) * len(win.out))
    y = scratch = None
    for i, (_, view) in enumerate(tap_views(xp, win)):
        if y is None:
            y = np.multiply(view, weights[i])
            scratch = np.empty_like(y)
        else:
            np.multiply(view, weights[i], out=scratch)
            y += scratch
    return y


@op("FusedConv", since=1, domain=FUSED_DOMAIN, cost=_conv_cost)
def fused_conv(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None = None,
    z: np.ndarray | None = None,
    /,
    *,
    activation: str = "",
    activation_params: list[float] | None = None,
    auto_pad: str = "NOTSET",
    dilations: list[int] | None = None,
    group: int = 1,
    kernel_shape: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> np.ndarray:
    """``activation(conv(x, w) + b + z)``: a Conv with what followed it fused in.

    The optimizer makes it from Conv -> Add/Sum (residual ``z``) -> activation
    (Relu, Clip, LeakyRelu, Sigmoid, Tanh; ONNX Runtime's FusedConv names).
    """
    attrs = {
        "auto_pad": auto_pad,
        "dilations": dilations,
        "group": group,
        "kernel_shape": kernel_shape,
        "pads": pads,
        "strides": strides,
    }
    kernel = ConvKernel(attrs, activation=activation, activation_params=activation_params or ())
    return kernel.run(x, w, b, z)


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


#: Multiply-adds per group from which several groups go to BLAS one call each (~8 µs of
#: ctypes per call) rather than through numpy's batched matmul and an add.
_DIRECT_GROUP_MACS = 1 << 21


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


# -- the kernel ---------------------------------------------------------------------------------


class ConvKernel(Kernel):
    """Conv or FusedConv with its GEMM variant chosen per input shape.

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
        scratch: ScratchPool | None = None,
        activation: str | bytes = "",
        activation_params: Sequence[float] = (),
        shapes: tuple[tuple[int, ...], tuple[int, ...], np.dtype] | None = None,
    ) -> None:
        self.attrs = attrs
        self.act = inplace_activation(activation, activation_params)
        name = activation.decode() if isinstance(activation, bytes) else activation
        self.relu = name == "Relu"
        self.parallel = parallel
        self.scratch = scratch if scratch is not None else ScratchPool()
        self._plans: dict[tuple[Any, ...], _GenericPlan | _GemmPlan] = {}
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
        scratch = getattr(ep, "scratch", None)
        return cls(
            attrs,
            parallel=ep.parallel,
            scratch=scratch,
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

    def compute(self, inputs: Sequence[Any]) -> tuple[Any, ...]:
        try:
            return (self.run(*inputs),)
        except NxrtError:
            raise
        except Exception as exc:
            error = translate_error(exc)
            if error is exc:
                raise
            raise error from exc

    def translate_error(self, exc: BaseException) -> BaseException:
        return translate_error(exc)

    def _plan(self, x_shape: tuple[int, ...], w_shape: tuple[int, ...], dtype: np.dtype):
        plan = _choose(tuple(x_shape), tuple(w_shape), np.dtype(dtype), self.attrs, self.act, self)
        self.variant, self.variant_reason = plan.variant, plan.reason
        if len(self._plans) >= self._MAX_PLANS:
            self._plans.clear()  # shapes that keep changing: keep the cache small
        self._plans[(tuple(x_shape), tuple(w_shape), np.dtype(dtype))] = plan
        return plan

    def __repr__(self) -> str:
        return f"ConvKernel({self.variant or 'unplanned'}, {self.attrs})"


fused_conv.kernel_factory = ConvKernel.create  # type: ignore[attr-defined]
conv.kernel_factory = ConvKernel.create  # type: ignore[attr-defined]


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


class ScratchPool:
    """Zero-bordered input buffers, shared by the kernels of one EP and reused across runs.

    A buffer is taken for one call and given back after it; concurrent runs
    simply get more buffers. Only the interior of a buffer is ever written,
    so its zero padding is paid for once.
    """

    def __init__(self) -> None:
        self._free: dict[tuple[Any, ...], list[np.ndarray]] = {}

    def take(self, key: tuple[Any, ...], make: Callable[[], Any]) -> Any:
        free = self._free.get(key)
        if free:
            try:
                return free.pop()
            except IndexError:
                pass  # another thread took the last one
        return make()

    def give(self, key: tuple[Any, ...], buffer: Any) -> None:
        self._free.setdefault(key, []).append(buffer)


_KNOWN_ATTRS = frozenset({"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"})


def _choose(
    x_shape: tuple[int, ...],
    w_shape: tuple[int, ...],
    dtype: np.dtype,
    attrs: dict[str, Any],
    act: Callable[[np.ndarray], Any] | None,
    kernel: ConvKernel,
) -> _GenericPlan | _GemmPlan:
    """Pick the variant for one input shape (see the module docstring), with its reason."""

    def generic(reason: str) -> _GenericPlan:
        return _GenericPlan(attrs, act, reason)

    if set(attrs) - _KNOWN_ATTRS or len(x_shape) < 3 or len(w_shape) != len(x_shape):
        return generic("attributes or ranks the GEMM variants do not cover")
    n, c = x_shape[:2]
    m = w_shape[0]
    group = int(attrs.get("group", 1))
    kernel_shape = attrs.get("kernel_shape")
    if kernel_shape and tuple(kernel_shape) != w_shape[2:]:
        raise KernelFailed(f"kernel_shape {list(kernel_shape)} does not match weights {w_shape}")
    if group < 1 or c % group or m % group or w_shape[1] * group != c:
        raise KernelFailed(
            f"{c} input channels, {m} filters of {w_shape[1]} channels and group {group} "
            "do not agree"
        )
    win = windows(
        x_shape[2:],
        w_shape[2:],
        strides=attrs.get("strides"),
        dilations=attrs.get("dilations"),
        pads=attrs.get("pads"),
        auto_pad=attrs.get("auto_pad", "NOTSET"),
    )
    if dtype not in _GEMM_DTYPES:
        return generic(f"{dtype} is computed through the float32 or integer path")
    if len(x_shape) not in (3, 4):
        return generic(f"{len(x_shape) - 2}-D convolution")
    if any(p < 0 for p in (*win.begin, *win.end)):
        return generic("padding that crops the input (SAME with a kernel below the stride)")
    if n == 0 or c == 0 or m == 0 or math.prod(win.out) == 0:
        return generic("empty input or output")
    one_d = len(x_shape) == 3
    if one_d:  # a 1-D convolution is a 2-D one of height 1
        x_shape = (n, c, 1, x_shape[2])
        w_shape = (*w_shape[:2], 1, w_shape[2])
        win = Windows(
            (1, *win.kernel),
            (1, *win.strides),
            (1, *win.dilations),
            (0, *win.begin),
            (0, *win.end),
            (1, *win.out),
        )
    cg = c // group
    taps = win.taps
    if taps == 1 and not any(win.begin) and not any(win.end):
        mode = "pointwise"
        reason = "1x1 kernel without padding: one GEMM on the input as it is"
        if any(s > 1 for s in win.strides):
            reason += " (strided pixels gathered first)"
    elif group == c and m == c:
        mode = "depthwise"
        reason = "one filter per channel: taps copied per channel block, one batched matmul"
    else:
        layout = _Layout.of(x_shape, win)
        if layout.waste > _MAX_WASTE:
            mode = "im2col"
            reason = (
                f"padded row of {layout.wq} for {layout.wo} outputs (waste "
                f"{layout.waste - 1:.0%}): exact columns, one GEMM with K={taps * cg}"
            )
        elif cg < _TAP_CHANNELS:
            mode = "im2col"
            reason = f"{cg} channels per group: columns copied, one GEMM with K={taps * cg}"
        else:
            mode = "taps"
            reason = (
                f"{cg} channels per group: a GEMM per kernel tap ({taps}) on shifted rows "
                "read in place, no column copy"
            )
    return _GemmPlan(mode, reason, x_shape, w_shape, dtype, win, group, act, kernel, one_d)


class _GenericPlan:
    """The plain :func:`conv` function, then the fused terms."""

    variant = "generic"

    def __init__(self, attrs: dict[str, Any], act, reason: str) -> None:
        self.attrs, self.act, self.reason = attrs, act, reason

    def run(self, x, w, b, z) -> np.ndarray:
        y = conv(x, w, b, **self.attrs)
        if z is not None:
            y = np.add(y, z, out=y) if np.broadcast_shapes(y.shape, z.shape) == y.shape else y + z
        if self.act is not None:
            self.act(y)
        return y


class _GemmPlan:
    """One variant of a 2-D convolution for one input shape (see the module docstring)."""

    def __init__(
        self,
        mode: str,
        reason: str,
        x_shape: tuple[int, int, int, int],
        w_shape: tuple[int, ...],
        dtype: np.dtype,
        win: Windows,
        group: int,
        act,
        kernel: ConvKernel,
        one_d: bool,
    ) -> None:
        self.variant, self.reason = mode, reason
        n, c, h, w = x_shape
        m = w_shape[0]
        self.x_shape, self.dtype, self.group, self.act = x_shape, dtype, group, act
        self.relu = kernel.relu
        self.m, self.mg, self.cg = m, m // group, c // group
        self.taps = win.taps
        self.strides = win.strides
        self.one_d = one_d
        self.out_shape = (n, m, *win.out)
        self.layout = _Layout.of(x_shape, win) if mode != "pointwise" else None
        self.scratch = kernel.scratch
        self.parallel = kernel.parallel
        self._weight: tuple[Any, Any] = (None, None)
        ho, wo = win.out
        threads = self.parallel.threads if self.parallel is not None else 1
        macs = n * m * ho * wo * self.cg * self.taps
        self.split = mode == "depthwise" and threads > 1 and macs >= _PARALLEL_MACS
        if mode == "pointwise":  # chunks of output pixels
            count, parts = ho * wo, threads
        else:  # chunks of output rows
            count, parts = ho, threads
        if not self.split or n >= threads:
            self.chunks = [(i, 0, count) for i in range(n)]
        else:
            self.chunks = [(i, r.start, r.stop) for i in range(n) for r in _split(count, parts)]

    @property
    def _widths(self) -> tuple[int, int]:
        return self.layout.wq, self.layout.wo

    # -- weights, prepared once per weight array ------------------------------------------------
    def _prepared(self, w: np.ndarray) -> np.ndarray:
        source, prepared = self._weight
        if source is w:
            return prepared
        prepared = self._prepare(w)
        if not w.flags.writeable:  # a constant: the same array every run
            self._weight = (w, prepared)
        return prepared

    def _prepare(self, w: np.ndarray) -> np.ndarray:
        g, mg, cg, taps = self.group, self.mg, self.cg, self.taps
        w = w.astype(self.dtype, copy=False).reshape(g, mg, cg, taps)
        if self.variant == "pointwise":
            return np.ascontiguousarray(w.reshape(g, mg, cg))
        if self.variant == "taps":
            return np.ascontiguousarray(w.transpose(3, 0, 1, 2))  # (taps, g, mg, cg)
        if self.variant == "depthwise":
            return np.ascontiguousarray(w.reshape(g, 1, taps))
        # columns are ordered (tap, channel)
        return np.ascontiguousarray(w.transpose(0, 1, 3, 2)).reshape(g, mg, taps * cg)

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
        if self.variant == "pointwise":
            work = self._pointwise(x, wp, out, b, z, act)
            self._each(work)
        else:
            layout = self.layout
            key = (layout, self.dtype)
            buf, targets = held = self.scratch.take(key, lambda: layout.buffer(self.dtype))
            try:
                layout.fill(targets, x)
                self._each(getattr(self, "_" + self.variant)(buf, wp, out, b, z, act))
            finally:
                self.scratch.give(key, held)
        if late_z is not None:
            np.add(out, late_z, out=out)
            if self.act is not None:
                self.act(out)
        return out[:, :, 0, :] if self.one_d else out

    def _each(self, work: Callable[[tuple[int, int, int]], None]) -> None:
        if self.split and len(self.chunks) > 1:
            self.parallel.map(work, self.chunks)
        else:
            for chunk in self.chunks:
                work(chunk)

    def _pointwise(self, x, wp, out, b, z, act):
        n, c = self.x_shape[:2]
        g, mg, cg, m = self.group, self.mg, self.cg, self.m
        relu = self.relu and act is not None
        if any(s > 1 for s in self.strides):
            sh, sw = self.strides
            x = x[:, :, ::sh, ::sw]
        pixels = out.shape[2] * out.shape[3]
        x = np.ascontiguousarray(x).reshape(n, g, cg, pixels)
        y = out.reshape(n, g, mg, pixels)
        flat_out = out.reshape(n, m, pixels)
        b2 = None if b is None else b.reshape(m, 1)
        flat_z = None if z is None else z.reshape(n, m, pixels)

        def work(chunk: tuple[int, int, int]) -> None:
            i, p0, p1 = chunk
            dst = flat_out[i, :, p0:p1]
            beta = _prefill(dst, b2, None if flat_z is None else flat_z[i, :, p0:p1])
            _gemm(wp, x[i, :, :, p0:p1], y[i, :, :, p0:p1], beta)
            _activate(dst, dst, act, relu)

        return work

    def _band(self, per_row: int, width: int) -> int:
        """Output rows per band, so that a band's temporaries stay in the core's cache,
        but with at least ``_BAND_COLUMNS`` GEMM columns, below which BLAS slows down."""
        return max(1, _BAND_VALUES // max(1, per_row), -(-_BAND_COLUMNS // width))

    def _taps(self, buf, wp, out, b, z, act):
        relu = self.relu and act is not None
        layout, g, cg, m, wq, wo = self.layout, self.group, self.cg, self.m, *self._widths
        band = self._band(m * wq, wq)

        def work(chunk: tuple[int, int, int]) -> None:
            i, r0, r1 = chunk
            scratch = np.empty(m * min(band, r1 - r0) * wq, self.dtype)
            for a in range(r0, r1, band):
                e = min(r1, a + band)
                size = (e - a) * wq
                acc = scratch[: m * size].reshape(g, m // g, size)
                valid = acc.reshape(m, e - a, wq)[:, :, :wo]
                beta = _prefill_rows(acc, valid, b, None if z is None else z[i, :, a:e])
                for t in range(self.taps):
                    block = layout.block(buf, i, t, a, size).reshape(g, cg, size)
                    _gemm(wp[t], block, acc, beta if t == 0 else 1.0)
                _activate(valid, out[i, :, a:e], act, relu)

        return work

    def _im2col(self, buf, wp, out, b, z, act):
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

        def work(chunk: tuple[int, int, int]) -> None:
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
                    block = layout.block(buf, i, t, a, (e - a) * wq).reshape(g, cg, e - a, wq)
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

    def _depthwise(self, buf, wp, out, b, z, act):
        """Per channel block: the taps copied side by side, then one small GEMM per channel
        (a batched matmul, 3-4 times faster than a multiply-add per tap)."""
        layout, c, taps = self.layout, self.m, self.taps
        wq, wo = layout.wq, layout.wo

        def work(chunk: tuple[int, int, int]) -> None:
            i, r0, r1 = chunk
            size = (r1 - r0) * wq
            width = max(1, min(c, _DEPTHWISE_BLOCK // (taps * size)))
            cols = np.empty((width, taps, size), self.dtype)
            for c0 in range(0, c, width):
                c1 = min(c, c0 + width)
                block = cols[: c1 - c0]
                for t in range(taps):
                    block[:, t] = layout.block(buf, i, t, r0, size)[c0:c1]
                acc = np.matmul(wp[c0:c1], block).reshape(c1 - c0, r1 - r0, wq)
                _finish(
                    acc[:, :, :wo],
                    out[i, c0:c1, r0:r1],
                    None if b is None else b[c0:c1],
                    None if z is None else z[i, c0:c1, r0:r1],
                    act,
                )

        return work


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


@op("ConvTranspose", since=(1, 11, 22))
def conv_transpose(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None = None,
    /,
    *,
    auto_pad: str = "NOTSET",
    dilations: list[int] | None = None,
    group: int = 1,
    kernel_shape: list[int] | None = None,
    output_padding: list[int] | None = None,
    output_shape: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> np.ndarray:
    """N-D grouped transposed convolution: one matmul, then a strided add per kernel tap.

    Every input position spreads ``w`` over the output; the full result spans
    ``stride * (in - 1) + (kernel - 1) * dilation + 1`` per axis and the output
    is the window of it that ``pads``/``output_shape``/``auto_pad`` select
    (positions outside the full result, e.g. from ``output_padding``, are zero).
    """
    n, c = x.shape[:2]
    rank = x.ndim - 2
    kernel = w.shape[2:]
    if kernel_shape and tuple(kernel_shape) != kernel:
        raise KernelFailed(f"kernel_shape {list(kernel_shape)} does not match weights {w.shape}")
    if w.shape[0] != c or c % group:
        raise KernelFailed(
            f"weights {w.shape} need {c} input channels (first axis) divisible by group {group}"
        )
    m = w.shape[1] * group
    strides = tuple(strides) if strides else (1,) * rank
    dilations = tuple(dilations) if dilations else (1,) * rank
    extra = tuple(output_padding) if output_padding else (0,) * rank
    if isinstance(auto_pad, bytes):
        auto_pad = auto_pad.decode()
    if output_shape is not None and len(output_shape) == rank + 2:
        output_shape = output_shape[2:]
    if output_shape is not None and len(output_shape) != rank:
        raise KernelFailed(f"output_shape {output_shape} must have {rank} values")
    if len(strides) != rank or len(dilations) != rank or len(extra) != rank:
        raise KernelFailed(f"strides, dilations and output_padding need {rank} values each")
    full = tuple(
        s * (i - 1) + (k - 1) * d + 1
        for s, i, k, d in zip(strides, x.shape[2:], kernel, dilations, strict=True)
    )
    begin, out = [], []
    for i in range(rank):
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            size = output_shape[i] if output_shape else x.shape[2 + i] * strides[i]
            total = full[i] + extra[i] - size
            begin.append(total // 2 if auto_pad == "SAME_UPPER" else total - total // 2)
        elif auto_pad in ("NOTSET", "VALID"):
            p = pads if pads and auto_pad == "NOTSET" else (0,) * (2 * rank)
            if len(p) != 2 * rank:
                raise KernelFailed(f"pads {list(p)} must have {2 * rank} values")
            size = output_shape[i] if output_shape else full[i] + extra[i] - p[i] - p[i + rank]
            begin.append(p[i])
        else:
            raise KernelFailed(f"unknown auto_pad {auto_pad!r}")
        out.append(max(size, 0))
    # buffer over the full result plus whatever the output reaches outside it
    before = tuple(max(-bg, 0) for bg in begin)
    after = tuple(max(bg + o - f, 0) for bg, o, f in zip(begin, out, full, strict=True))
    buffer = np.zeros(
        (n, m) + tuple(bf + f + a for bf, f, a in zip(before, full, after, strict=True)),
        dtype=np.result_type(x, w),
    )
    taps = math.prod(kernel)
    cols = np.matmul(
        w.reshape(group, c // group, (m // group) * taps).transpose(0, 2, 1),
        x.reshape(n, group, c // group, math.prod(x.shape[2:])),
    ).reshape((n, m) + kernel + x.shape[2:])
    lead = (slice(None), slice(None))
    for tap in itertools.product(*(range(k) for k in kernel)):
        index = tuple(
            slice(bf + t * d, bf + t * d + s * (i - 1) + 1, s)
            for bf, t, d, s, i in zip(before, tap, dilations, strides, x.shape[2:], strict=True)
        )
        buffer[lead + index] += cols[lead + tap]
    window = tuple(
        slice(bf + bg, bf + bg + o) for bf, bg, o in zip(before, begin, out, strict=True)
    )
    y = buffer[lead + window]
    if b is not None:
        y = y + b.reshape((m,) + (1,) * rank).astype(y.dtype, copy=False)
    return y.astype(x.dtype, copy=False)


@op("DeformConv", since=(19, 22))
def deform_conv(
    x: np.ndarray,
    w: np.ndarray,
    offset: np.ndarray,
    b: np.ndarray | None = None,
    mask: np.ndarray | None = None,
    /,
    *,
    dilations: list[int] | None = None,
    group: int = 1,
    kernel_shape: list[int] | None = None,
    offset_group: int = 1,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> np.ndarray:
    """N-D deformable convolution: each kernel tap samples the input at a learned offset.

    Samples are multilinear interpolations of the input (zero outside it),
    scaled by ``mask``; then one grouped matmul as in im2col.
    """
    n, c = x.shape[:2]
    m = w.shape[0]
    spatial = x.shape[2:]
    rank = len(spatial)
    kernel = tuple(kernel_shape) if kernel_shape else w.shape[2:]
    if tuple(kernel) != w.shape[2:]:
        raise KernelFailed(f"kernel_shape {list(kernel)} does not match weights {w.shape}")
    if c % group or m % group or w.shape[1] * group != c or c % offset_group:
        raise KernelFailed(
            f"{c} input channels, weights {w.shape}, group {group} and offset_group "
            f"{offset_group} do not agree"
        )
    win = windows(spatial, kernel, strides=strides, dilations=dilations, pads=pads)
    taps, points = win.taps, math.prod(win.out)
    if offset.shape != (n, offset_group * taps * rank) + win.out:
        raise KernelFailed(
            f"offset must have shape {[n, offset_group * taps * rank, *win.out]}, "
            f"got {list(offset.shape)}"
        )
    offset = offset.reshape(n, offset_group, taps, rank, points).astype(np.float64)
    weight = np.ones((n, offset_group, taps, points), dtype=np.float64)
    if mask is not None:
        weight = mask.reshape(n, offset_group, taps, points).astype(np.float64)
    # sampling position of every (tap, output point) along each axis, before the offsets
    grids = np.meshgrid(*(np.arange(k) for k in kernel), indexing="ij")
    outs = np.meshgrid(*(np.arange(o) for o in win.out), indexing="ij")
    pos = [
        (grids[d].reshape(taps, 1) * win.dilations[d])
        + (outs[d].reshape(1, points) * win.strides[d] - win.begin[d])
        + offset[:, :, :, d]
        for d in range(rank)
    ]
    low = [np.floor(p) for p in pos]
    flat = x.reshape(n, offset_group, c // offset_group, math.prod(spatial))
    cols = np.zeros((n, offset_group, c // offset_group, taps * points), dtype=x.dtype)
    for corner in itertools.product((0, 1), repeat=rank):
        index = np.zeros(low[0].shape, dtype=np.int64)
        scale = weight.copy()
        valid = np.ones(low[0].shape, dtype=bool)
        for d, step in enumerate(corner):
            at = low[d] + step
            scale *= 1.0 - np.abs(pos[d] - at)
            valid &= (at >= 0) & (at < spatial[d])
            index = index * spatial[d] + np.clip(at, 0, spatial[d] - 1).astype(np.int64)
        scale = np.where(valid, scale, 0.0).astype(x.dtype).reshape(n, offset_group, 1, -1)
        values = np.take_along_axis(flat, index.reshape(n, offset_group, 1, -1), axis=3)
        cols += values * scale
    cols = cols.reshape(n, group, (c // group) * taps, points)
    y = np.matmul(w.reshape(group, m // group, -1), cols).reshape((n, m) + win.out)
    if b is not None:
        y += b.reshape((m,) + (1,) * rank).astype(y.dtype, copy=False)
    return y.astype(x.dtype, copy=False)

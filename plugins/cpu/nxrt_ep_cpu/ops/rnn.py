"""Recurrent kernels: RNN, GRU, LSTM.

The input projection ``X @ W^T`` is one matmul over every time step; the loop
over time then only multiplies the hidden state by ``R^T``. ``sequence_lens``
is honoured per batch entry: past its length the state stops changing and
``Y`` is zero (a reverse pass starts at the entry's last valid step).

The loop over time is numpy here (the reference, and the path of every dtype
but float32 and of Softplus); a node's kernel runs float32 through
:class:`CompiledRecurrence`, whose loop is compiled by numba
(``nxrt_ep_cpu.jit.rnn``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from nxrt.errors import KernelFailed
from nxrt.kernel import attribute_values
from nxrt_ep_cpu.compiling import compiled_kernel
from nxrt_ep_cpu.kernels import CpuKernel
from nxrt_ep_cpu.ops._registry import op

if TYPE_CHECKING:
    import onnx_ir as ir

    from nxrt.host_parallel import HostParallel
    from nxrt.kernel import Kernel
    from nxrt.provider import ExecutionProvider


def _sigmoid(x: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    with np.errstate(over="ignore"):  # exp overflow gives inf, hence exactly 0
        return 1.0 / (1.0 + np.exp(-x))


def _hard_sigmoid(x: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    return np.clip(alpha * x + beta, 0.0, 1.0)


def _softplus(x: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    return np.logaddexp(0.0, x)


def _elu(x: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    return np.where(x >= 0, x, alpha * np.expm1(np.minimum(x, 0)))


#: Activation name (lower case) -> (function, default alpha, default beta, uses alpha, beta).
_ACTIVATIONS: dict[str, tuple[Callable[..., np.ndarray], float, float, bool, bool]] = {
    "sigmoid": (_sigmoid, 0.0, 0.0, False, False),
    "tanh": (lambda x, a, b: np.tanh(x), 0.0, 0.0, False, False),
    "relu": (lambda x, a, b: np.maximum(x, 0.0), 0.0, 0.0, False, False),
    "affine": (lambda x, a, b: a * x + b, 1.0, 0.0, True, True),
    "leakyrelu": (lambda x, a, b: np.where(x >= 0, x, a * x), 0.01, 0.0, True, False),
    "thresholdedrelu": (lambda x, a, b: np.where(x > a, x, 0.0), 1.0, 0.0, True, False),
    "scaledtanh": (lambda x, a, b: a * np.tanh(b * x), 1.0, 1.0, True, True),
    "hardsigmoid": (_hard_sigmoid, 0.2, 0.5, True, True),
    "elu": (_elu, 1.0, 0.0, True, False),
    "softsign": (lambda x, a, b: x / (1.0 + np.abs(x)), 0.0, 0.0, False, False),
    "softplus": (_softplus, 0.0, 0.0, False, False),
}


@dataclass(frozen=True)
class _Act:
    """One activation with its alpha and beta bound; ``name`` in lower case."""

    name: str
    fn: Callable[..., np.ndarray]
    alpha: float
    beta: float

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.fn(x, self.alpha, self.beta)


@functools.lru_cache(maxsize=64)
def _activations(
    names: tuple[str, ...] | None,
    defaults: tuple[str, ...],
    directions: int,
    alpha: tuple[float, ...] | None,
    beta: tuple[float, ...] | None,
) -> tuple[tuple[_Act, ...], ...]:
    """Per direction, the activations; alpha/beta go in order to those that take them.

    Cached: a node asks with the same attributes on every run.
    """
    count = len(defaults)
    names = list(names) if names else list(defaults) * directions
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
    if len(names) == count and directions == 2:
        names = names * 2
    if len(names) != count * directions:
        raise KernelFailed(
            f"expected {count * directions} activations ({count} per direction), got {names}"
        )
    alphas, betas = list(alpha or []), list(beta or [])
    acts = []
    for name in names:
        spec = _ACTIVATIONS.get(name.lower())
        if spec is None:
            raise KernelFailed(f"unknown activation {name!r}; known: {sorted(_ACTIVATIONS)}")
        fn, a, b, uses_a, uses_b = spec
        if uses_a and alphas:
            a = alphas.pop(0)
        if uses_b and betas:
            b = betas.pop(0)
        acts.append(_Act(name.lower(), fn, float(a), float(b)))
    return tuple(tuple(acts[d * count : (d + 1) * count]) for d in range(directions))


def _directions(direction: str, w: np.ndarray) -> list[bool]:
    """For each direction of the weights, whether it runs backwards in time."""
    if isinstance(direction, bytes):
        direction = direction.decode()
    if direction == "foward":  # the GRU-1 schema's default spells it so
        direction = "forward"
    expected = {"forward": [False], "reverse": [True], "bidirectional": [False, True]}
    if direction not in expected:
        raise KernelFailed(
            f"unknown direction {direction!r}; use forward, reverse or bidirectional"
        )
    if w.shape[0] != len(expected[direction]):
        raise KernelFailed(
            f"direction {direction!r} needs {len(expected[direction])} weight sets, "
            f"W has {w.shape[0]}"
        )
    return expected[direction]


def _run(
    kind: str,
    x: np.ndarray,
    w: np.ndarray,
    r: np.ndarray,
    b: np.ndarray | None,
    sequence_lens: np.ndarray | None,
    initial_h: np.ndarray | None,
    initial_c: np.ndarray | None = None,
    p: np.ndarray | None = None,
    *,
    activations: list[str] | None,
    activation_alpha: list[float] | None,
    activation_beta: list[float] | None,
    clip: float | None,
    direction: str,
    hidden_size: int | None,
    layout: int = 0,
    linear_before_reset: int = 0,
    input_forget: int = 0,
    recurrence: CompiledRecurrence | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every direction of an RNN, GRU or LSTM; returns ``(Y, Y_h, Y_c)``.

    ``recurrence`` runs the loop over time where it supports the node's
    dtype and attributes; otherwise, or without one, numpy runs it.
    """
    gates, defaults = {
        "RNN": (1, ("Tanh",)),
        "GRU": (3, ("Sigmoid", "Tanh")),
        "LSTM": (4, ("Sigmoid", "Tanh", "Tanh")),
    }[kind]
    if layout:
        x = x.swapaxes(0, 1)
        initial_h = None if initial_h is None else initial_h.swapaxes(0, 1)
        initial_c = None if initial_c is None else initial_c.swapaxes(0, 1)
    out_dtype = x.dtype
    dtype = out_dtype if out_dtype in (np.float32, np.float64) else np.dtype(np.float32)
    steps, batch, _ = x.shape
    hidden = r.shape[-1]
    if hidden_size is not None and hidden_size != hidden:
        raise KernelFailed(f"hidden_size {hidden_size} does not match R {list(r.shape)}")
    if w.shape[1] != gates * hidden or r.shape[1] != gates * hidden:
        raise KernelFailed(
            f"{kind} needs W and R with {gates * hidden} rows, got {w.shape} and {r.shape}"
        )
    backwards = _directions(direction, w)
    acts = _activations(
        None if activations is None else tuple(activations),
        defaults,
        len(backwards),
        None if activation_alpha is None else tuple(activation_alpha),
        None if activation_beta is None else tuple(activation_beta),
    )
    lens = None
    if sequence_lens is not None:
        lens = np.asarray(sequence_lens).astype(np.int64).reshape(-1)
        if lens.shape[0] != batch:
            raise KernelFailed(f"sequence_lens has {lens.shape[0]} values for batch {batch}")
        if np.any(lens < 0) or np.any(lens > steps):
            raise KernelFailed(f"sequence_lens {lens.tolist()} must lie in [0, {steps}]")
        if np.all(lens == steps):
            lens = None
    x = x.astype(dtype, copy=False)
    if recurrence is not None and recurrence.supports(x, r, acts, clip):
        y, y_h, y_c = recurrence.run(
            kind,
            x,
            w,
            r,
            b,
            lens,
            initial_h,
            initial_c,
            p,
            acts,
            clip,
            backwards,
            bool(linear_before_reset),
            bool(input_forget),
        )
    else:
        y, y_h, y_c = _reference_loop(
            kind,
            x,
            w,
            r,
            b,
            lens,
            initial_h,
            initial_c,
            p,
            acts,
            clip,
            backwards,
            linear_before_reset,
            input_forget,
        )
    if layout:
        y = y.transpose(2, 0, 1, 3)
        y_h, y_c = y_h.swapaxes(0, 1), y_c.swapaxes(0, 1)
    return (
        y.astype(out_dtype, copy=False),
        y_h.astype(out_dtype, copy=False),
        y_c.astype(out_dtype, copy=False),
    )


def _reference_loop(
    kind: str,
    x: np.ndarray,
    w: np.ndarray,
    r: np.ndarray,
    b: np.ndarray | None,
    lens: np.ndarray | None,
    initial_h: np.ndarray | None,
    initial_c: np.ndarray | None,
    p: np.ndarray | None,
    acts: tuple[tuple[_Act, ...], ...],
    clip: float | None,
    backwards: list[bool],
    linear_before_reset: int,
    input_forget: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The loop over time in numpy, one step at a time (layout 0)."""
    dtype = x.dtype
    steps, batch, _ = x.shape
    gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[kind]
    hidden = r.shape[-1]
    y = np.zeros((steps, len(backwards), batch, hidden), dtype=dtype)
    y_h = np.empty((len(backwards), batch, hidden), dtype=dtype)
    y_c = np.empty((len(backwards), batch, hidden), dtype=dtype)
    for d, backward in enumerate(backwards):
        wd, rd = w[d].astype(dtype, copy=False), r[d].astype(dtype, copy=False)
        if b is None:
            wb = rb = np.zeros(gates * hidden, dtype=dtype)
        else:
            wb = b[d, : gates * hidden].astype(dtype)
            rb = b[d, gates * hidden :].astype(dtype)
        h = (
            np.zeros((batch, hidden), dtype=dtype)
            if initial_h is None
            else initial_h[d].astype(dtype, copy=True)
        )
        c = (
            np.zeros((batch, hidden), dtype=dtype)
            if initial_c is None
            else initial_c[d].astype(dtype, copy=True)
        )
        xw = np.matmul(x, wd.T)
        cell = _Cell(kind, acts[d], rd, wb, rb, clip, linear_before_reset, input_forget, p, d)
        order = range(steps - 1, -1, -1) if backward else range(steps)
        for t in order:
            h_new, c_new = cell.step(xw[t], h, c)
            if lens is not None:
                active = (t < lens)[:, None]
                h_new = np.where(active, h_new, h)
                c_new = np.where(active, c_new, c)
                y[t, d] = np.where(active, h_new, 0)
            else:
                y[t, d] = h_new
            h, c = h_new, c_new
        y_h[d], y_c[d] = h, c
    return y, y_h, y_c


class _Cell:
    """One direction's step function: ``(X_t W^T, H_{t-1}, C_{t-1}) -> (H_t, C_t)``."""

    def __init__(self, kind, acts, r, wb, rb, clip, linear_before_reset, input_forget, p, d):
        self.kind, self.acts, self.clip = kind, acts, clip
        self.hidden = r.shape[-1]
        self.rt = r.T
        self.linear_before_reset = linear_before_reset
        self.input_forget = input_forget
        hs = self.hidden
        if kind == "GRU":
            # Rb of the candidate gate stays apart: with linear_before_reset it is gated by r
            self.bias = np.concatenate([wb[: 2 * hs] + rb[: 2 * hs], wb[2 * hs :]])
            self.rbh = rb[2 * hs :]
        else:
            self.bias = wb + rb
        self.peep = None
        if kind == "LSTM" and p is not None:
            pd = p[d].astype(r.dtype)
            self.peep = (pd[:hs], pd[hs : 2 * hs], pd[2 * hs :])  # i, o, f

    def _clip(self, v: np.ndarray) -> np.ndarray:
        return v if self.clip is None else np.clip(v, -self.clip, self.clip)

    def step(self, xw: np.ndarray, h: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        hs = self.hidden
        if self.kind == "RNN":
            f = self.acts[0]
            return f(self._clip(xw + h @ self.rt + self.bias)), c
        if self.kind == "GRU":
            f, g = self.acts
            gx = xw + self.bias
            hr = h @ self.rt
            zr = f(self._clip(gx[:, : 2 * hs] + hr[:, : 2 * hs]))
            z, r = zr[:, :hs], zr[:, hs:]
            if self.linear_before_reset:
                cand = gx[:, 2 * hs :] + r * (hr[:, 2 * hs :] + self.rbh)
            else:
                cand = gx[:, 2 * hs :] + (r * h) @ self.rt[:, 2 * hs :] + self.rbh
            hh = g(self._clip(cand))
            return (1 - z) * hh + z * h, c
        f, g, act_h = self.acts
        gates = xw + h @ self.rt + self.bias
        gi, go, gf, gc = (gates[:, k * hs : (k + 1) * hs] for k in range(4))
        if self.peep is not None:
            pi, po, pf = self.peep
            gi = gi + pi * c
            gf = gf + pf * c
        i = f(self._clip(gi))
        forget = 1 - i if self.input_forget else f(self._clip(gf))
        c_new = forget * c + i * g(self._clip(gc))
        if self.peep is not None:
            go = go + self.peep[1] * c_new
        o = f(self._clip(go))
        return o * act_h(c_new), c_new


#: Multiply-adds of the hidden products (steps x batch x hidden x gate rows) above which
#: the batch rows and directions are run on the session's threads: about 150 us of work
#: per part at the loop's 30 GMAC/s, to pay the pool's 50-150 us wake-up.
_PARALLEL_WORK = 4_000_000


@dataclass(frozen=True)
class _Weights:
    """One node's weights laid out for the compiled loop, per direction."""

    #: The arrays they come from, ``(W, R, B, P)``, compared by identity.
    sources: tuple[np.ndarray | None, ...]
    #: ``W^T`` of every direction side by side: inputs x (directions x gate rows).
    wt: np.ndarray
    #: ``R^T``: directions x hidden x gate rows.
    rt: np.ndarray
    #: What the loop adds to ``X W^T``: ``Wb + Rb``, but ``Wbh`` alone for GRU's h gate
    #: with ``linear_before_reset``.
    bias: np.ndarray
    #: GRU's ``Rbh`` with ``linear_before_reset`` (zeros otherwise).
    rbh: np.ndarray
    #: LSTM's peepholes ``P_i, P_o, P_f`` as directions x 3 x hidden (zeros without ``P``).
    peep: np.ndarray


class CompiledRecurrence:
    """The loop over time of float32 RNN, GRU and LSTM, compiled by numba.

    One per node kernel, built at session creation (which imports numba). The
    input projection of every step and direction is one GEMM; then each
    direction's steps run in one call of ``nxrt_ep_cpu.jit.rnn``, the batch cut
    in chunks of rows run on the session's threads when the work pays for it.
    ``W^T``, ``R^T`` and the summed biases are prepared once per run, or once
    for the session where ``W``, ``R``, ``B`` and ``P`` are the graph's
    constants (recognised by identity: those arrays are the session's own,
    read-only, passed on every run).
    """

    def __init__(self, parallel: HostParallel | None, constant_weights: bool) -> None:
        from nxrt_ep_cpu.jit import rnn as compiled

        self._compiled = compiled
        self._blas = _cblas_sgemm()
        self._parallel = parallel
        self._constant_weights = constant_weights
        self._prepared: _Weights | None = None
        self._activations: tuple[Any, ...] | None = None
        self._full_lens = np.zeros(0, np.int64)  # sequence_lens when absent, kept per shape

    def supports(
        self, x: np.ndarray, r: np.ndarray, acts: tuple[tuple[_Act, ...], ...], clip: float | None
    ) -> bool:
        """Whether the compiled loop computes this node (else numpy does)."""
        if x.dtype != np.float32 or r.shape[-1] == 0 or (clip is not None and clip <= 0):
            return False
        return self._activation_arrays(acts) is not None

    def _weights(
        self,
        kind: str,
        w: np.ndarray,
        r: np.ndarray,
        b: np.ndarray | None,
        p: np.ndarray | None,
        linear_before_reset: bool = False,
    ) -> _Weights:
        """The weights laid out for the compiled loop; cached for constant weights."""
        cached = self._prepared
        sources = (w, r, b, p)
        if cached is not None and all(c is s for c, s in zip(cached.sources, sources, strict=True)):
            return cached
        directions, width, hidden = r.shape
        inputs = w.shape[-1]
        w32 = w.astype(np.float32, copy=False).reshape(directions * width, inputs)
        rt = np.ascontiguousarray(r.astype(np.float32, copy=False).transpose(0, 2, 1))
        if b is None:
            wb = rb = np.zeros((directions, width), np.float32)
        else:
            wb = b[:, :width].astype(np.float32)
            rb = b[:, width:].astype(np.float32)
        bias, rbh = wb + rb, np.zeros((directions, hidden), np.float32)
        if kind == "GRU" and linear_before_reset:  # then the reset gate scales Rbh
            bias[:, 2 * hidden :] = wb[:, 2 * hidden :]
            rbh[...] = rb[:, 2 * hidden :]
        peep = np.zeros((directions, 3, hidden), np.float32)
        if kind == "LSTM" and p is not None:
            peep[...] = p.reshape(directions, 3, hidden)
        weights = _Weights(
            sources, np.ascontiguousarray(w32.T), rt, np.ascontiguousarray(bias), rbh, peep
        )
        if self._constant_weights:
            self._prepared = weights
        return weights

    def _activation_arrays(
        self, acts: tuple[tuple[_Act, ...], ...]
    ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]] | None:
        """Per direction, the activations' codes, alphas and betas as the loop takes them;
        ``None`` if one is not compiled."""
        cached = self._activations
        if cached is not None and cached[0] is acts:
            return cached[1]
        codes = self._compiled.ACTIVATION_CODES
        arrays = None
        if all(a.name in codes for d in acts for a in d):
            arrays = [
                (
                    np.array([codes[a.name] for a in d], np.int64),
                    np.array([a.alpha for a in d], np.float32),
                    np.array([a.beta for a in d], np.float32),
                )
                for d in acts
            ]
        self._activations = (acts, arrays)
        return arrays

    def _row_chunks(self, work: int, batch: int, directions: int) -> list[range] | None:
        """The batch rows of each part when the directions and chunks of rows should run
        on the pool (``None``: all on this thread); ``work`` is per direction.

        Chunks hold whole row pairs, which the hidden product takes together.
        """
        parallel = self._parallel
        if parallel is None or parallel.threads < 2 or work * directions < 2 * _PARALLEL_WORK:
            return None
        chunks = min(
            max(parallel.threads // directions, 1),
            (batch + 1) // 2,
            max(work // _PARALLEL_WORK, 1),
        )
        if chunks * directions < 2:
            return None
        pairs = parallel.split((batch + 1) // 2, chunks)
        return [range(2 * c.start, min(2 * c.stop, batch)) for c in pairs]

    def run(
        self,
        kind: str,
        x: np.ndarray,
        w: np.ndarray,
        r: np.ndarray,
        b: np.ndarray | None,
        lens: np.ndarray | None,
        initial_h: np.ndarray | None,
        initial_c: np.ndarray | None,
        p: np.ndarray | None,
        acts: tuple[tuple[_Act, ...], ...],
        clip: float | None,
        backwards: list[bool],
        linear_before_reset: bool,
        input_forget: bool,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(Y, Y_h, Y_c)`` in layout 0, as :func:`_reference_loop` computes them."""
        compiled = self._compiled
        steps, batch, inputs = x.shape
        directions, width, hidden = r.shape
        y = np.empty((steps, directions, batch, hidden), np.float32)
        y_h = np.zeros((directions, batch, hidden), np.float32)
        y_c = np.zeros((directions, batch, hidden), np.float32)
        if initial_h is not None:
            y_h[...] = initial_h
        if initial_c is not None and kind == "LSTM":
            y_c[...] = initial_c
        if steps == 0 or batch == 0:
            return y, y_h, y_c
        weights = self._weights(kind, w, r, b, p, linear_before_reset)
        rt, bias, rbh, peep = weights.rt, weights.bias, weights.rbh, weights.peep
        xw = np.matmul(x.reshape(steps * batch, inputs), weights.wt).reshape(steps, batch, -1)
        if lens is None:
            lens = self._full_lens
            if lens.shape[0] != batch or (batch and lens[0] != steps):
                lens = self._full_lens = np.full(batch, steps, np.int64)
        bound = np.float32(np.inf if clip is None else clip)
        block = compiled.column_block(hidden, width)
        activations = self._activation_arrays(acts)
        assert activations is not None  # supports() checked them

        def steps_of(part: tuple[int, range]) -> None:
            d, rows = part
            common = (y, d, lens, backwards[d], rows.start, rows.stop, bound)
            blas = self._blas if compiled.use_blas(len(rows), width) else (0, False)
            tail = (*activations[d], block, blas)
            col = d * width
            if kind == "RNN":
                compiled.rnn_steps(xw, col, bias[d], rt[d], y_h[d], *common, *tail)
            elif kind == "GRU":
                compiled.gru_steps(
                    xw, col, bias[d], rbh[d], rt[d], y_h[d], *common, linear_before_reset, *tail
                )
            else:
                compiled.lstm_steps(
                    xw,
                    col,
                    bias[d],
                    peep[d],
                    rt[d],
                    y_h[d],
                    y_c[d],
                    *common,
                    input_forget,
                    *tail,
                )

        rows = self._row_chunks(steps * batch * hidden * width, batch, directions)
        if rows is None:
            for d in range(directions):
                steps_of((d, range(batch)))
        else:
            parts = [(d, chunk) for d in range(directions) for chunk in rows]
            assert self._parallel is not None  # chunks of rows are for its pool
            self._parallel.map(steps_of, parts)
        return y, y_h, y_c


def _cblas_sgemm() -> tuple[int, bool]:
    """The address of ``cblas_sgemm`` in numpy's BLAS and whether its integers are 64-bit,
    for the compiled loop to call; address 0 where that BLAS is not reachable."""
    from nxrt_ep_cpu.ops._blas import GEMM

    return (0, False) if GEMM is None else GEMM.address(np.dtype(np.float32))


def _is_constant(node: ir.Node, index: int) -> bool:
    """Whether input ``index`` is absent or a constant no feed can replace."""
    value = node.inputs[index] if index < len(node.inputs) else None
    return value is None or (value.const_value is not None and not value.is_graph_input())


def _kernel(ep: ExecutionProvider, node: ir.Node, fn: Callable[..., Any]) -> Kernel:
    """A recurrent node's kernel: ``fn`` with the node's attributes and a compiled loop,
    built through :func:`~nxrt_ep_cpu.compiling.compiled_kernel` (``fn`` alone, the numpy
    reference, runs until then)."""
    weights = (1, 2, 3, 7) if node.op_type == "LSTM" else (1, 2, 3)
    attrs = attribute_values(node)
    constant = all(_is_constant(node, i) for i in weights)

    def fast() -> CpuKernel:
        recurrence = CompiledRecurrence(ep.parallel, constant_weights=constant)
        return CpuKernel(
            fn,
            {**attrs, "_recurrence": recurrence},
            variant="numba",
            variant_reason="float32 loop compiled; other dtypes, Softplus, clip <= 0 in numpy",
        )

    return compiled_kernel(ep, node, fast, lambda: CpuKernel(fn, attrs))


def _float_list(values) -> list[float] | None:
    return None if values is None else [float(v) for v in values]


# One function per op serves every version: a version's attributes are a subset of the
# latest's with the same defaults (the ONNX checker refuses the others), and opset 1's
# ``output_sequence`` only says whether Y is wanted, which the graph already says.
# ``_recurrence`` is set by the node's kernel (:func:`_kernel`) and runs the float32 loop
# compiled; called without it, each function is the numpy reference.


@op("RNN", since=(1, 7, 14, 22), factory=lambda ep, node: _kernel(ep, node, rnn))
def rnn(
    x: np.ndarray,
    w: np.ndarray,
    r: np.ndarray,
    b: np.ndarray | None = None,
    sequence_lens: np.ndarray | None = None,
    initial_h: np.ndarray | None = None,
    /,
    *,
    activation_alpha: list[float] | None = None,
    activation_beta: list[float] | None = None,
    activations: Sequence[str] = ("Tanh", "Tanh"),
    clip: float | None = None,
    direction: str = "forward",
    hidden_size: int | None = None,
    layout: int = 0,
    output_sequence: int = 0,
    _recurrence: CompiledRecurrence | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Simple RNN: ``H_t = f(X_t W^T + H_{t-1} R^T + Wb + Rb)``; ``layout=1`` is batch-first.

    The schema's default lists two activations (one per direction of a
    bidirectional RNN); a one-directional RNN uses the first.
    """
    directions = len(_directions(direction, w))
    if activations is not None and len(activations) == 2 and directions == 1:
        activations = list(activations)[:1]
    y, y_h, _ = _run(
        "RNN",
        x,
        w,
        r,
        b,
        sequence_lens,
        initial_h,
        activations=list(activations) if activations is not None else None,
        activation_alpha=_float_list(activation_alpha),
        activation_beta=_float_list(activation_beta),
        clip=clip,
        direction=direction,
        hidden_size=hidden_size,
        layout=layout,
        recurrence=_recurrence,
    )
    return y, y_h


@op("GRU", since=(3, 7, 14, 22), factory=lambda ep, node: _kernel(ep, node, gru))
def gru(
    x: np.ndarray,
    w: np.ndarray,
    r: np.ndarray,
    b: np.ndarray | None = None,
    sequence_lens: np.ndarray | None = None,
    initial_h: np.ndarray | None = None,
    /,
    *,
    activation_alpha: list[float] | None = None,
    activation_beta: list[float] | None = None,
    activations: list[str] | None = None,
    clip: float | None = None,
    direction: str = "forward",
    hidden_size: int | None = None,
    layout: int = 0,
    linear_before_reset: int = 0,
    output_sequence: int = 0,
    _recurrence: CompiledRecurrence | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """GRU, gates z, r, h; ``layout=1`` is batch-first."""
    y, y_h, _ = _run(
        "GRU",
        x,
        w,
        r,
        b,
        sequence_lens,
        initial_h,
        activations=activations,
        activation_alpha=_float_list(activation_alpha),
        activation_beta=_float_list(activation_beta),
        clip=clip,
        direction=direction,
        hidden_size=hidden_size,
        layout=layout,
        linear_before_reset=linear_before_reset,
        recurrence=_recurrence,
    )
    return y, y_h


@op("GRU", since=1, factory=lambda ep, node: _kernel(ep, node, gru_1))
def gru_1(
    x: np.ndarray,
    w: np.ndarray,
    r: np.ndarray,
    b: np.ndarray | None = None,
    sequence_lens: np.ndarray | None = None,
    initial_h: np.ndarray | None = None,
    /,
    *,
    activation_alpha: list[float] | None = None,
    activation_beta: list[float] | None = None,
    activations: list[str] | None = None,
    clip: float | None = None,
    direction: str = "foward",
    hidden_size: int | None = None,
    output_sequence: int = 0,
    _recurrence: CompiledRecurrence | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """GRU opset 1, whose schema spells the default direction "foward"."""
    return gru(
        x,
        w,
        r,
        b,
        sequence_lens,
        initial_h,
        activation_alpha=activation_alpha,
        activation_beta=activation_beta,
        activations=activations,
        clip=clip,
        direction=direction,
        hidden_size=hidden_size,
        _recurrence=_recurrence,
    )


@op("LSTM", since=(1, 7, 14, 22), factory=lambda ep, node: _kernel(ep, node, lstm))
def lstm(
    x: np.ndarray,
    w: np.ndarray,
    r: np.ndarray,
    b: np.ndarray | None = None,
    sequence_lens: np.ndarray | None = None,
    initial_h: np.ndarray | None = None,
    initial_c: np.ndarray | None = None,
    p: np.ndarray | None = None,
    /,
    *,
    activation_alpha: list[float] | None = None,
    activation_beta: list[float] | None = None,
    activations: list[str] | None = None,
    clip: float | None = None,
    direction: str = "forward",
    hidden_size: int | None = None,
    input_forget: int = 0,
    layout: int = 0,
    output_sequence: int = 0,
    _recurrence: CompiledRecurrence | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """LSTM, gates i, o, f, c, optional peepholes ``P``; ``layout=1`` is batch-first."""
    return _run(
        "LSTM",
        x,
        w,
        r,
        b,
        sequence_lens,
        initial_h,
        initial_c,
        p,
        activations=activations,
        activation_alpha=_float_list(activation_alpha),
        activation_beta=_float_list(activation_beta),
        clip=clip,
        direction=direction,
        hidden_size=hidden_size,
        input_forget=input_forget,
        layout=layout,
        recurrence=_recurrence,
    )

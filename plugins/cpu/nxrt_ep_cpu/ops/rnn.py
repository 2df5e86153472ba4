"""Recurrent kernels: RNN, GRU, LSTM.

The input projection ``X @ W^T`` is one matmul over every time step; the loop
over time then only multiplies the hidden state by ``R^T``. ``sequence_lens``
is honoured per batch entry: past its length the state stops changing and
``Y`` is zero (a reverse pass starts at the entry's last valid step).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from nxrt.errors import KernelFailed
from nxrt_ep_cpu.ops._registry import op


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
    """One activation with its alpha and beta bound."""

    fn: Callable[..., np.ndarray]
    alpha: float
    beta: float

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.fn(x, self.alpha, self.beta)


def _activations(
    names: list[str] | None,
    defaults: tuple[str, ...],
    directions: int,
    alpha: list[float] | None,
    beta: list[float] | None,
) -> list[list[_Act]]:
    """Per direction, the activations; alpha/beta go in order to those that take them."""
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
        acts.append(_Act(fn, float(a), float(b)))
    return [acts[d * count : (d + 1) * count] for d in range(directions)]


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
) -> tuple[np.ndarray, ...]:
    """Every direction of an RNN, GRU or LSTM; returns ``(Y, Y_h, Y_c)``."""
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
    acts = _activations(activations, defaults, len(backwards), activation_alpha, activation_beta)
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
    if layout:
        y = y.transpose(2, 0, 1, 3)
        y_h, y_c = y_h.swapaxes(0, 1), y_c.swapaxes(0, 1)
    return (
        y.astype(out_dtype, copy=False),
        y_h.astype(out_dtype, copy=False),
        y_c.astype(out_dtype, copy=False),
    )


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


def _float_list(values) -> list[float] | None:
    return None if values is None else [float(v) for v in values]


# One function per op serves every version: a version's attributes are a subset of the
# latest's with the same defaults (the ONNX checker refuses the others), and opset 1's
# ``output_sequence`` only says whether Y is wanted, which the graph already says.


@op("RNN", since=(1, 7, 14, 22))
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
    )
    return y, y_h


@op("GRU", since=(3, 7, 14, 22))
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
    )
    return y, y_h


@op("GRU", since=1)
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
    )


@op("LSTM", since=(1, 7, 14, 22))
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
    )

"""The float32 recurrences of RNN, GRU and LSTM: every time step of one direction in one call.

The input projection ``X W^T`` (all steps at once) is one GEMM done by the
caller; what is left per step is the hidden product ``H_{t-1} R^T`` and the
gates. A call runs the rows ``b0:b1`` of the batch for one direction ``d``
(rows are independent, so the caller may run chunks on several threads),
updating the state ``h`` (and ``c``) in place and writing ``y[t, d]``.

The hidden product is small (hidden 32-512, a few rows). It is either a loop
here (two batch rows at a time, so each ``R^T`` row is loaded once for both;
four ``R^T`` rows per pass over the accumulators) or, given its address, a
call of the BLAS ``cblas_sgemm`` straight from the compiled loop (no Python
call, no numpy overhead per step). Measured per step, one thread, gates
included: BLAS is ahead for products under 512 gate rows wide at any batch
(GRU hidden 128, one row: 3.1 us against 3.6), from 4 rows under 1024 (LSTM
hidden 128, 8 rows: 14.7 against 18.3) and from 16 rows at any width (LSTM
hidden 256, 32 rows: 315 against 385); the loop is ahead for a few rows of a
wide product, where OpenBLAS's small products are slow (LSTM hidden 256, one
row: 18 us against 35; hidden 512: 89 against 530). :func:`use_blas` holds
that threshold.

Per batch row and step past its ``sequence_lens`` entry, the state is left
unchanged and ``y`` is zero, as in the numpy reference.
"""

from __future__ import annotations

import numpy as np

from nxrt_ep_cpu.jit import inline, mathf, njit
from nxrt_ep_cpu.jit.threads import row_product, sgemm

SIGMOID = 0
TANH = 1
RELU = 2
AFFINE = 3
LEAKY_RELU = 4
THRESHOLDED_RELU = 5
SCALED_TANH = 6
HARD_SIGMOID = 7
ELU = 8
SOFTSIGN = 9

#: Activations compiled here, by their ONNX name in lower case (Softplus is not: it needs a
#: log, so such nodes keep the numpy path).
ACTIVATION_CODES = {
    "sigmoid": SIGMOID,
    "tanh": TANH,
    "relu": RELU,
    "affine": AFFINE,
    "leakyrelu": LEAKY_RELU,
    "thresholdedrelu": THRESHOLDED_RELU,
    "scaledtanh": SCALED_TANH,
    "hardsigmoid": HARD_SIGMOID,
    "elu": ELU,
    "softsign": SOFTSIGN,
}

#: FMA contraction only: no reassociation, so NaN, inf and the exp reduction stay exact.
_FASTMATH = {"contract"}
_ZERO = np.float32(0.0)
_ONE = np.float32(1.0)


def column_block(depth: int, width: int) -> int:
    """Columns of ``R^T`` per block: ``depth x block`` floats fit in 512 KiB (half an L2)."""
    block = max(64, (131072 // max(depth, 1)) // 16 * 16)
    return min(block, max(width, 1))


def use_blas(rows: int, width: int) -> bool:
    """Whether the hidden product of ``rows`` batch rows and ``width`` gate rows (``R``'s
    rows) goes to BLAS rather than the loop (measured, above)."""
    return rows >= 16 or width < 512 or (rows >= 4 and width < 1024)


@njit(fastmath=_FASTMATH)
def _product_pair(ha, hb, rt, j0, j1, outa, outb):  # pragma: no cover - compiled by numba
    """``outa = ha @ rt[:, j0:j1]``, ``outb = hb @ rt[:, j0:j1]``, sharing the loads of ``rt``."""
    depth = ha.shape[0]
    width = j1 - j0
    for j in range(width):
        outa[j] = _ZERO
        outb[j] = _ZERO
    k = 0
    while k + 4 <= depth:
        a0, a1, a2, a3 = ha[k], ha[k + 1], ha[k + 2], ha[k + 3]
        b0, b1, b2, b3 = hb[k], hb[k + 1], hb[k + 2], hb[k + 3]
        r0, r1, r2, r3 = rt[k, j0:j1], rt[k + 1, j0:j1], rt[k + 2, j0:j1], rt[k + 3, j0:j1]
        for j in range(width):
            s0, s1, s2, s3 = r0[j], r1[j], r2[j], r3[j]
            outa[j] += a0 * s0 + a1 * s1 + a2 * s2 + a3 * s3
            outb[j] += b0 * s0 + b1 * s1 + b2 * s2 + b3 * s3
        k += 4
    while k < depth:
        a0, b0 = ha[k], hb[k]
        r0 = rt[k, j0:j1]
        for j in range(width):
            outa[j] += a0 * r0[j]
            outb[j] += b0 * r0[j]
        k += 1


@njit(fastmath=_FASTMATH)
def hidden_product(h, rt, col0, col1, out, block, blas):  # pragma: no cover - compiled by numba
    """``out[:, col0:col1] = h @ rt[:, col0:col1]`` for every row of ``h`` (all C-contiguous).

    ``blas`` is ``(address of cblas_sgemm, whether its integers are 64-bit)``, address 0
    for the loop here.
    """
    rows, depth = h.shape
    if blas[0] != 0:
        n, ldb, ldc = col1 - col0, rt.shape[1], out.shape[1]
        sgemm(blas, 0, 0, rows, n, depth, 1.0, h, 0, depth, rt, col0, ldb, 0.0, out, col0, ldc)
        return
    for j0 in range(col0, col1, block):
        j1 = min(j0 + block, col1)
        b = 0
        while b + 2 <= rows:
            _product_pair(h[b], h[b + 1], rt, j0, j1, out[b, j0:j1], out[b + 1, j0:j1])
            b += 2
        if b < rows:
            row_product(h[b], rt, j0, j1, out[b, j0:j1])


@inline
def _clamp(x, bound):  # pragma: no cover - compiled by numba
    """``x`` clamped to ``[-bound, bound]`` (``bound`` inf: none); NaN stays NaN, as with
    ``np.clip``."""
    x = -bound if x < -bound else x
    return bound if x > bound else x


@inline
def _activate(v, code, alpha, beta, clip):  # pragma: no cover - compiled by numba
    """``v = f(clip(v))`` in place for activation ``code``: the default gate activations
    inlined, the others through :func:`_activate_other` (compiled once, not at every gate,
    which keeps the kernels' compile time down)."""
    if code == SIGMOID:
        for i in range(v.shape[0]):
            v[i] = mathf.sigmoid(_clamp(v[i], clip))
    elif code == TANH:
        for i in range(v.shape[0]):
            v[i] = mathf.tanh(_clamp(v[i], clip))
    else:
        _activate_other(v, code, alpha, beta, clip)


@njit(fastmath=_FASTMATH)
def _activate_other(v, code, alpha, beta, clip):  # pragma: no cover - compiled by numba
    """:func:`_activate` for every code but Sigmoid and Tanh (the branch is outside each loop)."""
    n = v.shape[0]
    if code == RELU:
        for i in range(n):
            x = _clamp(v[i], clip)
            v[i] = _ZERO if x < _ZERO else x
    elif code == AFFINE:
        for i in range(n):
            v[i] = alpha * _clamp(v[i], clip) + beta
    elif code == LEAKY_RELU:
        for i in range(n):
            x = _clamp(v[i], clip)
            v[i] = alpha * x if x < _ZERO else x
    elif code == THRESHOLDED_RELU:
        for i in range(n):
            x = _clamp(v[i], clip)
            v[i] = x if x > alpha else _ZERO
    elif code == SCALED_TANH:
        for i in range(n):
            v[i] = alpha * mathf.tanh(beta * _clamp(v[i], clip))
    elif code == HARD_SIGMOID:
        for i in range(n):
            z = alpha * _clamp(v[i], clip) + beta
            z = _ZERO if z < _ZERO else z
            v[i] = _ONE if z > _ONE else z
    elif code == ELU:
        for i in range(n):
            x = _clamp(v[i], clip)
            v[i] = alpha * (mathf.exp(x) - _ONE) if x < _ZERO else x
    else:  # SOFTSIGN
        for i in range(n):
            x = _clamp(v[i], clip)
            v[i] = x / (_ONE + abs(x))


@inline
def _add_input(g, x, bias):  # pragma: no cover - compiled by numba
    """``g += x + bias`` (the hidden product plus the input projection and bias)."""
    for j in range(g.shape[0]):
        g[j] += x[j] + bias[j]


@inline
def _store(v, h, y):  # pragma: no cover - compiled by numba
    """The new state ``v`` into the state ``h`` and the output ``y``."""
    for i in range(v.shape[0]):
        h[i] = v[i]
        y[i] = v[i]


@inline
def _active_rows(y, t, d, lens, b0, b1):  # pragma: no cover - compiled by numba
    """How many rows are still inside their sequence at step ``t``; ``y`` is zeroed for the rest."""
    active = 0
    for b in range(b0, b1):
        if t < lens[b]:
            active += 1
        else:
            y[t, d, b, :] = _ZERO
    return active


# Per row and step the gates go pass by pass over the hidden units, each loop touching at
# most four arrays: a loop fusing every gate reads and writes a dozen, more than LLVM
# checks for overlap at run time, and then is not vectorized (measured: 3x slower).
# ``clip`` is the bound, inf for none.


@njit(fastmath=_FASTMATH)
def rnn_steps(
    xw, col, bias, rt, h, y, d, lens, backward, b0, b1, clip, codes, alphas, betas, block, blas
):  # pragma: no cover - compiled by numba
    """Simple RNN: ``H_t = f(X_t W^T + H_{t-1} R^T + b)``."""
    steps = xw.shape[0]
    hidden = h.shape[1]
    rows = h[b0:b1]
    acc = np.empty((b1 - b0, hidden), np.float32)
    for s in range(steps):
        t = steps - 1 - s if backward else s
        if _active_rows(y, t, d, lens, b0, b1) == 0:
            continue
        hidden_product(rows, rt, 0, hidden, acc, block, blas)
        for q in range(b1 - b0):
            b = b0 + q
            if t >= lens[b]:
                continue
            g = acc[q]
            _add_input(g, xw[t, b, col : col + hidden], bias)
            _activate(g, codes[0], alphas[0], betas[0], clip)
            _store(g, rows[q], y[t, d, b])


@njit(fastmath=_FASTMATH)
def gru_steps(
    xw,
    col,
    bias,
    rbh,
    rt,
    h,
    y,
    d,
    lens,
    backward,
    b0,
    b1,
    clip,
    linear_before_reset,
    codes,
    alphas,
    betas,
    block,
    blas,
):  # pragma: no cover - compiled by numba
    """GRU, gates z, r, h. ``bias`` holds ``Wb + Rb``, but only ``Wbh`` for the h gate when
    ``linear_before_reset``: ``Rbh`` (``rbh``) is then scaled by the reset gate."""
    steps = xw.shape[0]
    hidden = h.shape[1]
    two = 2 * hidden
    rows = h[b0:b1]
    acc = np.empty((b1 - b0, 3 * hidden), np.float32)
    reset_h = np.zeros((b1 - b0, hidden), np.float32)
    bh = bias[two:]
    for s in range(steps):
        t = steps - 1 - s if backward else s
        if _active_rows(y, t, d, lens, b0, b1) == 0:
            continue
        hidden_product(rows, rt, 0, 3 * hidden if linear_before_reset else two, acc, block, blas)
        for q in range(b1 - b0):  # z and r; then the h gate's input, or r * H_{t-1}
            b = b0 + q
            if t >= lens[b]:
                continue
            g, x = acc[q], xw[t, b, col : col + 3 * hidden]
            zr, gr, gh, xh = g[:two], g[hidden:two], g[two:], x[two:]
            _add_input(zr, x[:two], bias[:two])
            _activate(zr, codes[0], alphas[0], betas[0], clip)
            if linear_before_reset:
                for i in range(hidden):
                    gh[i] = xh[i] + bh[i] + gr[i] * (gh[i] + rbh[i])
            else:
                hb, rh = rows[q], reset_h[q]
                for i in range(hidden):
                    rh[i] = gr[i] * hb[i]
        if not linear_before_reset:
            hidden_product(reset_h, rt, two, 3 * hidden, acc, block, blas)
        for q in range(b1 - b0):  # the h gate and the new state
            b = b0 + q
            if t >= lens[b]:
                continue
            g = acc[q]
            gz, gh = g[:hidden], g[two:]
            if not linear_before_reset:
                _add_input(gh, xw[t, b, col + two : col + 3 * hidden], bh)
            _activate(gh, codes[1], alphas[1], betas[1], clip)
            hb = rows[q]
            for i in range(hidden):
                gh[i] = (_ONE - gz[i]) * gh[i] + gz[i] * hb[i]
            _store(gh, hb, y[t, d, b])


@njit(fastmath=_FASTMATH)
def lstm_steps(
    xw,
    col,
    bias,
    peep,
    rt,
    h,
    c,
    y,
    d,
    lens,
    backward,
    b0,
    b1,
    clip,
    input_forget,
    codes,
    alphas,
    betas,
    block,
    blas,
):  # pragma: no cover - compiled by numba
    """LSTM, gates i, o, f, c; ``peep`` holds the peepholes ``P_i, P_o, P_f`` (zeros for none).

    ``codes`` are the activations f (gates), g (cell input) and h (cell output).
    """
    steps = xw.shape[0]
    hidden = h.shape[1]
    rows, cells = h[b0:b1], c[b0:b1]
    acc = np.empty((b1 - b0, 4 * hidden), np.float32)
    out = np.empty(hidden, np.float32)
    pi, po, pf = peep[0], peep[1], peep[2]
    unclipped = np.float32(np.inf)
    for s in range(steps):
        t = steps - 1 - s if backward else s
        if _active_rows(y, t, d, lens, b0, b1) == 0:
            continue
        hidden_product(rows, rt, 0, 4 * hidden, acc, block, blas)
        for q in range(b1 - b0):
            b = b0 + q
            if t >= lens[b]:
                continue
            g = acc[q]
            _add_input(g, xw[t, b, col : col + 4 * hidden], bias)
            gi, go = g[:hidden], g[hidden : 2 * hidden]
            gf, gc = g[2 * hidden : 3 * hidden], g[3 * hidden :]
            cb = cells[q]
            for i in range(hidden):
                gi[i] += pi[i] * cb[i]
            _activate(gi, codes[0], alphas[0], betas[0], clip)
            if input_forget:
                for i in range(hidden):
                    gf[i] = _ONE - gi[i]
            else:
                for i in range(hidden):
                    gf[i] += pf[i] * cb[i]
                _activate(gf, codes[0], alphas[0], betas[0], clip)
            _activate(gc, codes[1], alphas[1], betas[1], clip)
            for i in range(hidden):
                cb[i] = gf[i] * cb[i] + gi[i] * gc[i]
            for i in range(hidden):
                go[i] += po[i] * cb[i]
            _activate(go, codes[0], alphas[0], betas[0], clip)
            for i in range(hidden):
                out[i] = cb[i]
            _activate(out, codes[2], alphas[2], betas[2], unclipped)
            for i in range(hidden):
                out[i] *= go[i]
            _store(out, rows[q], y[t, d, b])

"""Training-op kernels of ai.onnx.preview.training (Adagrad, Adam, Momentum).

Each op takes the learning rate ``R`` and the update count ``T`` followed by groups
of tensors (all the Xs, then all the Gs, then the state tensors) and returns the
updated Xs followed by the updated states. Arithmetic runs in float64 and results
keep their input's dtype.
"""

from __future__ import annotations

import numpy as np

from nxrt.errors import KernelFailed
from nxrt_ep_cpu.ops._registry import op

_TRAINING = "ai.onnx.preview.training"


def _groups(tensors: tuple[np.ndarray, ...], per: int, op_name: str) -> list[tuple]:
    """Split the variadic inputs into ``per`` equal groups and zip them per tensor."""
    if not tensors or len(tensors) % per:
        raise KernelFailed(
            f"{op_name}: expected a multiple of {per} tensors after R and T, got {len(tensors)}"
        )
    n = len(tensors) // per
    groups = [tensors[i * n : (i + 1) * n] for i in range(per)]
    for parts in zip(*groups):
        if any(p.shape != parts[0].shape for p in parts):
            shapes = [list(p.shape) for p in parts]
            raise KernelFailed(f"{op_name}: tensors updated together differ in shape: {shapes}")
    return list(zip(*groups))


def _scalar(value: np.ndarray, op_name: str, name: str) -> float:
    value = np.asarray(value)
    if value.size != 1:
        raise KernelFailed(f"{op_name}: {name} must be a scalar, not shape {list(value.shape)}")
    return value.reshape(()).item()


@op("Adagrad", since=1, domain=_TRAINING)
def adagrad(
    r: np.ndarray,
    t: np.ndarray,
    /,
    *tensors: np.ndarray,
    decay_factor: float = 0.0,
    epsilon: float = float(np.float32(1e-6)),
    norm_coefficient: float = 0.0,
) -> tuple[np.ndarray, ...]:
    """Adagrad step for each (X, G, H): returns the new Xs, then the new Hs."""
    rate = _scalar(r, "Adagrad", "R") / (1 + _scalar(t, "Adagrad", "T") * decay_factor)
    xs, hs = [], []
    for x, g, h in _groups(tensors, 3, "Adagrad"):
        x64 = x.astype(np.float64)
        g_reg = norm_coefficient * x64 + g.astype(np.float64)
        h_new = h.astype(np.float64) + g_reg * g_reg
        x_new = x64 - rate * g_reg / (np.sqrt(h_new) + epsilon)
        xs.append(x_new.astype(x.dtype))
        hs.append(h_new.astype(h.dtype))
    return (*xs, *hs)


@op("Adam", since=1, domain=_TRAINING)
def adam(
    r: np.ndarray,
    t: np.ndarray,
    /,
    *tensors: np.ndarray,
    alpha: float = float(np.float32(0.9)),
    beta: float = float(np.float32(0.999)),
    epsilon: float = float(np.float32(1e-6)),
    norm_coefficient: float = 0.0,
    norm_coefficient_post: float = 0.0,
) -> tuple[np.ndarray, ...]:
    """Adam step for each (X, G, V, H): returns the new Xs, then the new Vs, then the new Hs.

    From the second update on (``T > 0``) the rate carries the bias correction
    ``sqrt(1 - beta**T) / (1 - alpha**T)``.
    """
    rate = _scalar(r, "Adam", "R")
    step = _scalar(t, "Adam", "T")
    if step > 0:
        rate = rate * np.sqrt(1 - beta**step) / (1 - alpha**step)
    xs, vs, hs = [], [], []
    for x, g, v, h in _groups(tensors, 4, "Adam"):
        x64 = x.astype(np.float64)
        g_reg = norm_coefficient * x64 + g.astype(np.float64)
        v_new = alpha * v.astype(np.float64) + (1 - alpha) * g_reg
        h_new = beta * h.astype(np.float64) + (1 - beta) * (g_reg * g_reg)
        x_new = x64 - rate * (v_new / (np.sqrt(h_new) + epsilon))
        xs.append(((1 - norm_coefficient_post) * x_new).astype(x.dtype))
        vs.append(v_new.astype(v.dtype))
        hs.append(h_new.astype(h.dtype))
    return (*xs, *vs, *hs)


@op("Momentum", since=1, domain=_TRAINING)
def momentum(
    r: np.ndarray,
    t: np.ndarray,
    /,
    *tensors: np.ndarray,
    alpha: float,
    beta: float,
    mode: str,
    norm_coefficient: float,
) -> tuple[np.ndarray, ...]:
    """SGD with momentum (``mode`` "standard" or "nesterov") for each (X, G, V).

    Returns the new Xs, then the new Vs; the gradient's coefficient is 1 on the first
    update (``T == 0``).
    """
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode not in ("standard", "nesterov"):
        raise KernelFailed(f"Momentum: mode must be 'standard' or 'nesterov', not {mode!r}")
    rate = _scalar(r, "Momentum", "R")
    beta_adjusted = beta if _scalar(t, "Momentum", "T") > 0 else 1.0
    xs, vs = [], []
    for x, g, v in _groups(tensors, 3, "Momentum"):
        x64 = x.astype(np.float64)
        g_reg = norm_coefficient * x64 + g.astype(np.float64)
        v_new = alpha * v.astype(np.float64) + beta_adjusted * g_reg
        if mode == "standard":
            x_new = x64 - rate * v_new
        else:
            x_new = x64 - rate * (g_reg + alpha * v_new)
        xs.append(x_new.astype(x.dtype))
        vs.append(v_new.astype(v.dtype))
    return (*xs, *vs)

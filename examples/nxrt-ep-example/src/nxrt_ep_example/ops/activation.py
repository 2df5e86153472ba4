"""Activation kernels: one function per op, registered where it is defined."""

from __future__ import annotations

import numpy as np

from nxrt_ep_example.ops import op


@op("Relu", since=(6, 13, 14))
def relu(x: np.ndarray, /) -> np.ndarray:
    return np.maximum(x, np.zeros((), x.dtype))


@op("LeakyRelu", since=(6, 16))
def leaky_relu(x: np.ndarray, /, *, alpha: float = float(np.float32(0.01))) -> np.ndarray:
    return np.where(x >= 0, x, x * np.asarray(alpha, x.dtype))


@op("Sigmoid", since=(6, 13))
def sigmoid(x: np.ndarray, /) -> np.ndarray:
    return (1 / (1 + np.exp(-x))).astype(x.dtype, copy=False)


@op("Softsign", since=(1, 22))
def softsign(x: np.ndarray, /) -> np.ndarray:
    return (x / (1 + np.abs(x))).astype(x.dtype, copy=False)

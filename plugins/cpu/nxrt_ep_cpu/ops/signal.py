"""Signal kernels: DFT, STFT, window functions, MelWeightMatrix.

Complex tensors are real tensors whose last axis (of size 2) holds the real and
imaginary parts; real signals have a last axis of size 1. Transforms run through
``numpy.fft`` in single precision (double for double tensors), as ONNX's reference
does, and results keep the input's dtype.
"""

from __future__ import annotations

import numpy as np
from onnx import helper

from nxrt.errors import KernelFailed
from nxrt_ep_cpu.ops._registry import op


def _scalar_int(value: np.ndarray, op_name: str, name: str) -> int:
    value = np.asarray(value)
    if value.size != 1:
        raise KernelFailed(f"{op_name}: {name} must be a scalar, not shape {list(value.shape)}")
    return int(value.reshape(()).item())


def _to_complex(x: np.ndarray, op_name: str) -> np.ndarray:
    """The signal of a ``[..., 1]`` (real) or ``[..., 2]`` (complex) tensor, last axis dropped."""
    if x.ndim < 2 or x.shape[-1] not in (1, 2):
        raise KernelFailed(
            f"{op_name}: the last axis must have size 1 (real) or 2 (complex), "
            f"input shape is {list(x.shape)}"
        )
    x = x.astype(_work_dtype(x.dtype))
    if x.shape[-1] == 1:
        return x[..., 0]
    return x[..., 0] + 1j * x[..., 1]


def _work_dtype(dtype: np.dtype) -> type:
    """float64 for double tensors, float32 for the narrower floats (numpy.fft keeps it)."""
    return np.float64 if dtype == np.float64 else np.float32


def _from_complex(z: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return np.stack([z.real, z.imag], axis=-1).astype(dtype)


def _dft(
    x: np.ndarray, dft_length: int | None, axis: int, inverse: int, onesided: int
) -> np.ndarray:
    rank = x.ndim
    if not (-rank <= axis <= -2 or 0 <= axis <= rank - 2):
        raise KernelFailed(f"DFT: axis {axis} is outside [-{rank}, -2] and [0, {rank - 2}]")
    axis %= rank
    signal = _to_complex(x, "DFT")
    if dft_length is None:
        n = 2 * (x.shape[axis] - 1) if inverse and onesided else x.shape[axis]
    else:
        n = dft_length
    if n < 1:
        raise KernelFailed(f"DFT: dft_length must be positive, not {n}")
    if inverse and onesided:
        if x.shape[-1] != 2:
            raise KernelFailed("DFT: an inverse one-sided DFT (IRFFT) needs a complex input")
        return np.fft.irfft(signal, n=n, axis=axis)[..., None].astype(x.dtype)
    if inverse:
        return _from_complex(np.fft.ifft(signal, n=n, axis=axis), x.dtype)
    result = np.fft.fft(signal, n=n, axis=axis)
    if onesided:
        result = np.take(result, np.arange(n // 2 + 1), axis=axis)
    return _from_complex(result, x.dtype)


@op("DFT", since=17)
def dft_17(
    x: np.ndarray,
    dft_length: np.ndarray | None = None,
    /,
    *,
    axis: int = 1,
    inverse: int = 0,
    onesided: int = 0,
) -> np.ndarray:
    """DFT along the ``axis`` attribute (opset 17); see :func:`dft`."""
    length = None if dft_length is None else _scalar_int(dft_length, "DFT", "dft_length")
    return _dft(x, length, int(axis), inverse, onesided)


@op("DFT", since=20)
def dft(
    x: np.ndarray,
    dft_length: np.ndarray | None = None,
    axis: np.ndarray | None = None,
    /,
    *,
    inverse: int = 0,
    onesided: int = 0,
) -> np.ndarray:
    """Forward or inverse DFT along ``axis`` (default -2), zero-padded or cut to ``dft_length``.

    ``onesided`` keeps the first ``n // 2 + 1`` bins of a forward transform (RFFT) or
    turns a one-sided complex spectrum back into a real signal (IRFFT).
    """
    length = None if dft_length is None else _scalar_int(dft_length, "DFT", "dft_length")
    ax = -2 if axis is None else _scalar_int(axis, "DFT", "axis")
    return _dft(x, length, ax, inverse, onesided)


@op("STFT", since=17)
def stft(
    signal: np.ndarray,
    frame_step: np.ndarray,
    window: np.ndarray | None = None,
    frame_length: np.ndarray | None = None,
    /,
    *,
    onesided: int = 1,
) -> np.ndarray:
    """DFTs of windowed frames: ``[batch, frames, bins, 2]``.

    ``frames = (signal_length - frame_length) // frame_step + 1``; ``bins`` is
    ``frame_length // 2 + 1`` when ``onesided``, else ``frame_length``.
    """
    if signal.ndim != 3:
        raise KernelFailed(
            f"STFT: signal must be [batch, length, 1 or 2], not {list(signal.shape)}"
        )
    z = _to_complex(signal, "STFT")
    length = z.shape[1]
    step = _scalar_int(frame_step, "STFT", "frame_step")
    if frame_length is not None:
        n = _scalar_int(frame_length, "STFT", "frame_length")
        if window is not None and window.shape[0] != n:
            raise KernelFailed(
                f"STFT: window length {window.shape[0]} differs from frame_length {n}"
            )
    else:
        n = window.shape[0] if window is not None else length
    if window is not None and window.ndim != 1:
        raise KernelFailed(f"STFT: window must be 1-D, not {list(window.shape)}")
    if step < 1 or n < 1 or n > length:
        raise KernelFailed(
            f"STFT: need frame_step >= 1 and 1 <= frame_length <= signal length ({length}); "
            f"got frame_step {step}, frame_length {n}"
        )
    frames = (length - n) // step + 1
    index = np.arange(frames)[:, None] * step + np.arange(n)
    framed = z[:, index]  # [batch, frames, n]
    if window is not None:
        framed = framed * window.astype(_work_dtype(signal.dtype))
    spectrum = np.fft.fft(framed, axis=-1)
    if onesided:
        spectrum = spectrum[..., : n // 2 + 1]
    return _from_complex(spectrum, signal.dtype)


def _window(size: np.ndarray, periodic: int, output_datatype: int, op_name: str):
    """``n / N`` for the samples ``n`` of a window of ``size``, and the output dtype.

    A symmetric window of one sample has ``N = 0``: the formula's ``0 / 0`` is NaN,
    as in onnx.reference and onnxruntime.
    """
    count = _scalar_int(size, op_name, "size")
    if count < 0:
        raise KernelFailed(f"{op_name}: size must not be negative, not {count}")
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(int(output_datatype)))
    denominator = count if periodic else count - 1
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.arange(count, dtype=np.float64) / np.float64(max(denominator, 0)), dtype


@op("HannWindow", since=17)
def hann_window(size: np.ndarray, /, *, output_datatype: int = 1, periodic: int = 1) -> np.ndarray:
    """``sin²(πn / N)``; ``N`` is ``size`` when ``periodic``, else ``size - 1``."""
    phase, dtype = _window(size, periodic, output_datatype, "HannWindow")
    return (np.sin(np.pi * phase) ** 2).astype(dtype)


@op("HammingWindow", since=17)
def hamming_window(
    size: np.ndarray, /, *, output_datatype: int = 1, periodic: int = 1
) -> np.ndarray:
    """``25/46 - 21/46 cos(2πn / N)``; ``N`` is ``size`` when ``periodic``, else ``size - 1``."""
    phase, dtype = _window(size, periodic, output_datatype, "HammingWindow")
    alpha = 25.0 / 46.0
    return (alpha - (1 - alpha) * np.cos(2 * np.pi * phase)).astype(dtype)


@op("BlackmanWindow", since=17)
def blackman_window(
    size: np.ndarray, /, *, output_datatype: int = 1, periodic: int = 1
) -> np.ndarray:
    """``0.42 - 0.5 cos(2πn / N) + 0.08 cos(4πn / N)``; ``N`` as for the other windows."""
    phase, dtype = _window(size, periodic, output_datatype, "BlackmanWindow")
    w = 0.42 - 0.5 * np.cos(2 * np.pi * phase) + 0.08 * np.cos(4 * np.pi * phase)
    return w.astype(dtype)


@op("MelWeightMatrix", since=17)
def mel_weight_matrix(
    num_mel_bins: np.ndarray,
    dft_length: np.ndarray,
    sample_rate: np.ndarray,
    lower_edge_hertz: np.ndarray,
    upper_edge_hertz: np.ndarray,
    /,
    *,
    output_datatype: int = 1,
) -> np.ndarray:
    """Triangular mel filters, ``[dft_length // 2 + 1, num_mel_bins]``, each peaking at 1.

    Band edges are ``num_mel_bins + 2`` points spaced evenly on the mel scale
    (``2595 log10(1 + f / 700)``) from the lower edge, mapped to DFT bins as
    ``floor((dft_length + 1) * f / sample_rate)``, computed in the edges' own
    precision as ONNX's reference does.
    """
    mels = _scalar_int(num_mel_bins, "MelWeightMatrix", "num_mel_bins")
    length = _scalar_int(dft_length, "MelWeightMatrix", "dft_length")
    rate = _scalar_int(sample_rate, "MelWeightMatrix", "sample_rate")
    if mels < 1 or length < 1 or rate < 1:
        raise KernelFailed(
            "MelWeightMatrix: num_mel_bins, dft_length and sample_rate must be positive"
        )
    low = np.asarray(lower_edge_hertz).reshape(())
    high = np.asarray(upper_edge_hertz).reshape(())
    if low.dtype.kind != "f":  # bfloat16 and the like: compute in float32
        low, high = low.astype(np.float32), high.astype(np.float32)
    bins = length // 2 + 1
    points = np.arange(mels + 2)
    low_mel = 2595 * np.log1p(low / 700) / np.log(10)
    high_mel = 2595 * np.log1p(high / 700) / np.log(10)
    step = (high_mel - low_mel) / points.shape[0]
    hertz = 700 * np.expm1((points * step + low_mel) / 2595 * np.log(10))
    edges = (((length + 1) * hertz) // rate).astype(np.int64)
    left, center, right = edges[:-2], edges[1:-1], edges[2:]
    j = np.arange(bins, dtype=np.float64)[:, None]
    rising = (j >= left) & (j <= center) & (center > left)
    falling = (j >= center) & (j < right) & (right > center)
    with np.errstate(divide="ignore", invalid="ignore"):
        up = (j - left) / (center - left)
        down = (right - j) / (right - center)
    out = np.zeros((bins, mels), dtype=np.float64)
    out = np.where(rising, up, out)
    out = np.where((j == center) & (center == left), 1.0, out)
    out = np.where(falling, down, out)
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(int(output_datatype)))
    return out.astype(dtype)

"""Resize and Upsample in every mode, plus GridSample and AffineGrid.

Resize is separable: each resized axis is handled on its own, by gathering
the few source taps every output position needs and summing them with their
weights, so the work is vectorised over whole axes. Coordinates and weights
are computed in float64; the result is cast back (truncated and saturated for
integer types).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import cast

import numpy as np

from nxrt.errors import KernelFailed
from nxrt_ep_cpu.ops._registry import op

_CUBIC_A = float(np.float32(-0.75))

_COORDINATE_MODES = (
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_crop_and_resize",
)
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil", "simple")


def _cast_back(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """float64 results in ``dtype``: integers are truncated toward zero and saturated.

    The spec does not say how an interpolated integer is rounded; onnxruntime
    casts (C++ truncation), so nxrt does too.
    """
    if values.dtype == dtype:
        return values
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return np.clip(np.trunc(values), info.min, info.max).astype(dtype)
    return values.astype(dtype)


# -- Resize --------------------------------------------------------------------------------------


@op("Resize", since=10)
def resize_10(x: np.ndarray, scales: np.ndarray, /, *, mode: str = "nearest") -> np.ndarray:
    """Resize by ``scales`` with asymmetric coordinates (opset 10, like Upsample)."""
    return _resize(
        x,
        None,
        scales,
        None,
        mode=mode,
        coordinate_mode="asymmetric",
        nearest_mode="simple",
        cubic_a=_CUBIC_A,
        exclude_outside=0,
        extrapolation_value=0.0,
    )


@op("Resize", since=(11, 13, 18, 19))
def resize(
    x: np.ndarray,
    roi: np.ndarray | None = None,
    scales: np.ndarray | None = None,
    sizes: np.ndarray | None = None,
    /,
    *,
    antialias: int = 0,
    axes: list[int] | None = None,
    coordinate_transformation_mode: str = "half_pixel",
    cubic_coeff_a: float = _CUBIC_A,
    exclude_outside: int = 0,
    extrapolation_value: float = 0.0,
    keep_aspect_ratio_policy: str = "stretch",
    mode: str = "nearest",
    nearest_mode: str = "round_prefer_floor",
) -> np.ndarray:
    """Resize by ``scales`` or to ``sizes`` (opset 11 on; 18 adds ``axes``, antialiasing
    and the aspect policy, whose defaults keep 11's behaviour)."""
    return _resize(
        x,
        roi,
        scales,
        sizes,
        mode=mode,
        coordinate_mode=coordinate_transformation_mode,
        nearest_mode=nearest_mode,
        cubic_a=cubic_coeff_a,
        exclude_outside=exclude_outside,
        extrapolation_value=extrapolation_value,
        antialias=antialias,
        axes=axes,
        aspect_policy=keep_aspect_ratio_policy,
    )


@op("Upsample", since=7)
def upsample_7(x: np.ndarray, /, *, mode: str = "nearest", scales: list[float]) -> np.ndarray:
    """Upsample by the ``scales`` attribute (asymmetric coordinates, opset 7)."""
    return resize_10(x, np.asarray(scales, dtype=np.float32), mode=mode)


@op("Upsample", since=9)
def upsample_9(x: np.ndarray, scales: np.ndarray, /, *, mode: str = "nearest") -> np.ndarray:
    """Upsample by the ``scales`` input (asymmetric coordinates, opset 9)."""
    return resize_10(x, scales, mode=mode)


def _resize(
    x: np.ndarray,
    roi,
    scales,
    sizes,
    *,
    mode: str,
    coordinate_mode: str,
    nearest_mode: str,
    cubic_a: float,
    exclude_outside: int,
    extrapolation_value: float,
    antialias: int = 0,
    axes: list[int] | None = None,
    aspect_policy: str = "stretch",
) -> np.ndarray:
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    if mode not in ("nearest", "linear", "cubic"):
        raise KernelFailed(f"Resize: mode must be nearest, linear or cubic, not {mode!r}")
    if coordinate_mode not in _COORDINATE_MODES:
        raise KernelFailed(f"Resize: unknown coordinate_transformation_mode {coordinate_mode!r}")
    if nearest_mode not in _NEAREST_MODES:
        raise KernelFailed(f"Resize: unknown nearest_mode {nearest_mode!r}")
    if aspect_policy not in ("stretch", "not_larger", "not_smaller"):
        raise KernelFailed(f"Resize: unknown keep_aspect_ratio_policy {aspect_policy!r}")
    rank = x.ndim
    axes = list(range(rank)) if axes is None else [a % rank for a in axes]
    if len(set(axes)) != len(axes):
        raise KernelFailed(f"Resize: axes {axes} repeat an axis")
    has_scales = scales is not None and np.asarray(scales).size > 0
    has_sizes = sizes is not None and np.asarray(sizes).size > 0
    if has_scales == has_sizes:
        raise KernelFailed("Resize: give exactly one of 'scales' and 'sizes' (non-empty)")

    scale = [1.0] * rank
    out_size = list(x.shape)
    if has_scales:
        given = np.asarray(scales, dtype=np.float64).reshape(-1)
        if given.size != len(axes):
            raise KernelFailed(f"Resize: scales has {given.size} values for {len(axes)} axes")
        if (given <= 0).any():
            raise KernelFailed(f"Resize: scales must be positive, got {given.tolist()}")
        for axis, s in zip(axes, given, strict=True):
            scale[axis] = float(s)
            out_size[axis] = int(math.floor(s * x.shape[axis]))
    else:
        given = [int(s) for s in np.asarray(sizes).reshape(-1)]
        if len(given) != len(axes):
            raise KernelFailed(f"Resize: sizes has {len(given)} values for {len(axes)} axes")
        ratios = [given[i] / x.shape[a] if x.shape[a] else 1.0 for i, a in enumerate(axes)]
        if aspect_policy == "stretch":
            for axis, size, ratio in zip(axes, given, ratios, strict=True):
                scale[axis], out_size[axis] = ratio, size
        else:
            common = min(ratios) if aspect_policy == "not_larger" else max(ratios)
            for axis in axes:
                scale[axis] = common
                out_size[axis] = int(common * x.shape[axis] + 0.5)

    roi_pairs = None
    if coordinate_mode == "tf_crop_and_resize":
        if roi is None or np.asarray(roi).size == 0:
            raise KernelFailed(
                "Resize: coordinate_transformation_mode tf_crop_and_resize needs roi"
            )
        # kept in its own float type: ties in nearest rounding then match the reference
        values = np.asarray(roi).reshape(-1)
        if values.dtype.kind != "f":
            values = values.astype(np.float64)
        if values.size != 2 * len(axes):
            raise KernelFailed(f"Resize: roi has {values.size} values for {len(axes)} axes")
        roi_pairs = {a: (values[i], values[len(axes) + i]) for i, a in enumerate(axes)}

    if mode == "nearest" and antialias:
        raise KernelFailed("Resize: antialias is not defined for mode 'nearest'")

    result = x if mode == "nearest" else x.astype(np.float64)
    for axis in axes:
        pair = roi_pairs[axis] if roi_pairs else None
        if out_size[axis] == x.shape[axis] and scale[axis] == 1.0 and pair in (None, (0.0, 1.0)):
            continue
        coords, outside = _source_coordinates(
            coordinate_mode, x.shape[axis], out_size[axis], scale[axis], pair
        )
        if mode == "nearest":
            index = _nearest_index(coords, nearest_mode, scale[axis], x.shape[axis])
            result = np.take(result, index, axis=axis)
            if outside is not None and outside.any():
                result = _extrapolate(result, axis, outside, extrapolation_value)
            continue
        taps, weights = _weights(
            coords, x.shape[axis], mode, cubic_a, scale[axis], antialias, exclude_outside
        )
        gathered = np.take(result, taps, axis=axis)  # axis becomes (out, taps)
        shape = [1] * gathered.ndim
        shape[axis], shape[axis + 1] = weights.shape
        result = (gathered * weights.reshape(shape)).sum(axis=axis + 1)
        if outside is not None and outside.any():
            result = _extrapolate(result, axis, outside, extrapolation_value)
    if result is x:
        return x.copy()
    return _cast_back(result, x.dtype)


def _source_coordinates(
    mode: str, in_size: int, out_size: int, scale: float, roi: tuple[float, float] | None
) -> tuple[np.ndarray, np.ndarray | None]:
    """Each output position's coordinate in the input; for crop-and-resize, which lie outside."""
    y = np.arange(out_size, dtype=np.float64)
    scaled_size = scale * in_size
    if mode == "half_pixel":
        return (y + 0.5) / scale - 0.5, None
    if mode == "half_pixel_symmetric":
        offset = in_size / 2 * (1 - out_size / scaled_size)
        return offset + (y + 0.5) / scale - 0.5, None
    if mode == "pytorch_half_pixel":
        if scaled_size == 1:  # the spec: "length_resized > 1 ? ... : 0" (onnxruntime too)
            return np.zeros(out_size), None
        return (y + 0.5) / scale - 0.5, None
    if mode == "align_corners":
        if scaled_size == 1:
            return np.zeros(out_size), None
        return y * (in_size - 1) / (scaled_size - 1), None
    if mode == "asymmetric":
        return y / scale, None
    start, end = cast("tuple[float, float]", roi)  # tf_crop_and_resize reads its roi
    if scaled_size == 1:
        coords = np.full(out_size, (end - start) * (in_size - 1) / 2)
    else:
        coords = y * (end - start) * (in_size - 1) / (scaled_size - 1)
    coords = coords + start * (in_size - 1)
    return coords, (coords < 0) | (coords > in_size - 1)


def _nearest_index(coords: np.ndarray, mode: str, scale: float, in_size: int) -> np.ndarray:
    """The pixel each coordinate rounds to, chosen as onnx.reference chooses it: between
    the two taps of a window placed on the coordinate plus one (so float64 noise just
    above 0, such as 1e-16 from half_pixel_symmetric's offset, lands on 0, as it does in
    the reference and in ONNX Runtime's float32); an exact integer is itself."""
    if mode == "simple":  # the rule of Upsample and Resize-10: ceil when shrinking
        index = np.ceil(coords) if scale < 1 else np.floor(coords)
        return np.clip(index, 0, in_size - 1).astype(np.intp)
    whole = np.floor(coords)
    ratio = coords - whole
    if mode == "round_prefer_floor":
        upper = ratio > 0.5
    elif mode == "round_prefer_ceil":
        upper = ratio >= 0.5
    else:
        upper = np.full(coords.shape, mode == "ceil")
    upper = upper | (coords == whole)
    padded = coords + 1
    start = np.floor(padded)
    lower = np.where(padded == start, start - 2, start - 1)
    return np.clip(lower + upper, 0, in_size - 1).astype(np.intp)


def _cubic_kernel(a: float) -> Callable[[np.ndarray], np.ndarray]:
    def kernel(d: np.ndarray) -> np.ndarray:
        d = np.abs(d)
        near = ((a + 2) * d - (a + 3)) * d * d + 1
        far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
        return np.where(d <= 1, near, np.where(d < 2, far, 0.0))

    return kernel


def _linear_kernel(d: np.ndarray) -> np.ndarray:
    return np.clip(1 - np.abs(d), 0, 1)


def _weights(
    coords: np.ndarray,
    in_size: int,
    mode: str,
    cubic_a: float,
    scale: float,
    antialias: int,
    exclude_outside: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Source taps ``(out, n)`` (clamped to the input: edge padding) and their weights."""
    kernel = _linear_kernel if mode == "linear" else _cubic_kernel(cubic_a)
    support = 1 if mode == "linear" else 2
    stretch = min(scale, 1.0) if antialias else 1.0
    half = math.ceil(support / stretch) if antialias else support  # taps on each side
    base = np.floor(coords)
    # an exactly integral coordinate takes the window one tap to the left, as the
    # reference does; the extra tap gets weight zero
    base = np.where(coords == base, base - 1, base)
    taps = base[:, None] + np.arange(1 - half, half + 1)[None, :]
    weights = kernel((taps - coords[:, None]) * stretch)
    if antialias:
        weights = weights / weights.sum(axis=1, keepdims=True)
    if exclude_outside:
        weights = np.where((taps < 0) | (taps >= in_size), 0.0, weights)
        total = weights.sum(axis=1, keepdims=True)
        weights = weights / np.where(total == 0, 1.0, total)
    return np.clip(taps, 0, in_size - 1).astype(np.intp), weights


def _extrapolate(result: np.ndarray, axis: int, outside: np.ndarray, value: float) -> np.ndarray:
    shape = [1] * result.ndim
    shape[axis] = outside.size
    return np.where(outside.reshape(shape), np.asarray(value, dtype=np.float64), result)


# -- GridSample ----------------------------------------------------------------------------------


@op("GridSample", since=16)
def grid_sample_16(
    x: np.ndarray,
    grid: np.ndarray,
    /,
    *,
    align_corners: int = 0,
    mode: str = "bilinear",
    padding_mode: str = "zeros",
) -> np.ndarray:
    """GridSample with the opset-16 mode names (bilinear, nearest, bicubic)."""
    return grid_sample(x, grid, align_corners=align_corners, mode=mode, padding_mode=padding_mode)


@op("GridSample", since=(20, 22))
def grid_sample(
    x: np.ndarray,
    grid: np.ndarray,
    /,
    *,
    align_corners: int = 0,
    mode: str = "linear",
    padding_mode: str = "zeros",
) -> np.ndarray:
    """Sample ``x`` at the normalised ``grid`` locations (any number of spatial axes).

    ``grid[..., 0]`` addresses the last spatial axis (x), ``grid[..., 1]`` the
    one before, as in PyTorch.
    """
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    if mode not in ("nearest", "linear", "cubic"):
        raise KernelFailed(f"GridSample: mode must be linear, nearest or cubic, not {mode!r}")
    if padding_mode not in ("zeros", "border", "reflection"):
        raise KernelFailed(f"GridSample: unknown padding_mode {padding_mode!r}")
    spatial = x.shape[2:]
    nd = len(spatial)
    if grid.ndim != nd + 2 or grid.shape[-1] != nd or grid.shape[0] != x.shape[0]:
        raise KernelFailed(
            f"GridSample: grid of shape {grid.shape} does not match input of shape {x.shape}"
        )
    n, c = x.shape[:2]
    out_spatial = grid.shape[1:-1]
    if 0 in (n, c, *out_spatial):
        return np.zeros((n, c, *out_spatial), dtype=x.dtype)
    coords = []
    for i, size in enumerate(spatial):
        g = grid[..., nd - 1 - i].astype(np.float64)
        pos = (g + 1) / 2 * (size - 1) if align_corners else ((g + 1) * size - 1) / 2
        coords.append(pos)
    lows = [0.0 if align_corners else -0.5] * nd
    highs = [s - 1.0 if align_corners else s - 0.5 for s in spatial]
    if mode == "nearest":
        coords = [np.rint(p) for p in coords]
    coords = [
        _grid_bound(p, lo, hi, size, padding_mode)
        for p, lo, hi, size in zip(coords, lows, highs, spatial, strict=True)
    ]
    batch = np.arange(n).reshape((n,) + (1,) * len(out_spatial))
    data = x.astype(np.float64)
    if mode == "nearest":
        taps_per_axis = [[(p.astype(np.int64), None)] for p in coords]
    else:
        taps_per_axis = [_grid_taps(p, mode) for p in coords]
    out = np.zeros((n, *out_spatial, c), dtype=np.float64)
    for combo in itertools.product(*taps_per_axis):
        index, weight, valid = [batch], None, None
        for axis, (tap, w) in enumerate(combo):
            size = spatial[axis]
            if padding_mode == "zeros":
                inside = (tap >= 0) & (tap < size)
                valid = inside if valid is None else valid & inside
                tap = np.clip(tap, 0, size - 1)
            elif padding_mode == "border":
                tap = np.clip(tap, 0, size - 1)
            else:
                tap = _reflect(tap.astype(np.float64), lows[axis], highs[axis]).astype(np.int64)
                tap = np.clip(tap, 0, size - 1)
            index.append(tap)
            if w is not None:
                weight = w if weight is None else weight * w
        # advanced indices around the channel slice: the result is (n, *out, c)
        # numpy's stub takes a starred index tuple for an array of indices
        values = data[(index[0], slice(None), *index[1:])]  # type: ignore[arg-type]
        if weight is not None:
            values = values * weight[..., None]
        if valid is not None:
            values = np.where(valid[..., None], values, 0.0)
        out += values
    return _cast_back(np.moveaxis(out, -1, 1), x.dtype)


def _grid_bound(p: np.ndarray, lo: float, hi: float, size: int, padding: str) -> np.ndarray:
    """Coordinates past the border are clamped (border) or mirrored (reflection) first."""
    if padding == "border":
        return np.where((p < lo) | (p > hi), np.clip(p, 0, size - 1), p)
    if padding == "reflection":
        return _reflect(p, lo, hi)
    return p


def _reflect(p: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Mirror coordinates at ``lo`` and ``hi`` until they fall inside."""
    span = hi - lo
    if span <= 0:
        return np.full_like(p, lo)
    below = p < lo
    d = np.where(below, lo - p, p - hi)
    flips = np.trunc(d / span)
    rest = d - flips * span
    even = flips % 2 == 0
    from_low = np.where(even, lo + rest, hi - rest)
    from_high = np.where(even, hi - rest, lo + rest)
    return np.where(below, from_low, np.where(p > hi, from_high, p))


def _grid_taps(p: np.ndarray, mode: str) -> list[tuple[np.ndarray, np.ndarray]]:
    base = np.floor(p)
    t = p - base
    base = base.astype(np.int64)
    if mode == "linear":
        return [(base, 1 - t), (base + 1, t)]
    a = -0.75
    kernel = _cubic_kernel(a)
    return [(base + k, kernel(t - k)) for k in (-1, 0, 1, 2)]


# -- AffineGrid ----------------------------------------------------------------------------------


@op("AffineGrid", since=20)
def affine_grid(theta: np.ndarray, size: np.ndarray, /, *, align_corners: int = 0) -> np.ndarray:
    """Normalised sampling grids ``theta @ [x, y, (z,) 1]`` for GridSample (2-D or 3-D)."""
    dims = [int(d) for d in np.asarray(size).reshape(-1)]
    spatial = dims[2:]
    nd = len(spatial)
    if nd not in (2, 3) or theta.shape[1:] != (nd, nd + 1):
        raise KernelFailed(
            f"AffineGrid: theta {theta.shape} and size {dims} must describe a 2-D or 3-D grid"
        )
    axes = []
    for length in spatial:
        if align_corners:
            axes.append(np.linspace(-1.0, 1.0, length) if length > 1 else np.full(length, -1.0))
        else:
            axes.append((2 * np.arange(length) + 1) / length - 1)
    mesh = np.meshgrid(*axes, indexing="ij")  # (D,) H, W order
    points = np.stack([*mesh[::-1], np.ones(spatial)], axis=-1)  # x, y, (z,) 1
    flat = points.reshape(-1, nd + 1)
    grid = np.einsum("npk,mk->nmp", theta.astype(np.float64), flat)
    return grid.reshape(theta.shape[0], *spatial, nd).astype(theta.dtype)

"""Tensor-building and rearranging kernels: Pad, Tile, Expand, Range, Trilu, DepthToSpace ..."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from onnx import TensorProto, helper

from nxrt.errors import KernelFailed
from nxrt.memory import check_elements
from nxrt_ep_cpu.ops._registry import op

_PAD_MODES: dict[str, Literal["constant", "reflect", "edge", "wrap"]] = {
    "constant": "constant",
    "reflect": "reflect",
    "edge": "edge",
    "wrap": "wrap",
}


def _ints(values) -> list[int]:
    return [int(v) for v in np.asarray(values).reshape(-1)]


def _owned(result: np.ndarray, source: np.ndarray) -> np.ndarray:
    """``result``, copied if it is still a view of ``source`` (blocksize 1, say)."""
    return result.copy() if np.shares_memory(result, source) else result


# -- Pad ----------------------------------------------------------------------------------------


@op("Pad", since=1)
def pad_1(
    data: np.ndarray, /, *, mode: str = "constant", paddings: list[int], value: float = 0.0
) -> np.ndarray:
    """Pad with the ``paddings`` attribute (opset 1)."""
    return _pad(data, paddings, mode, value, None)


@op("Pad", since=2)
def pad_2(
    data: np.ndarray, /, *, mode: str = "constant", pads: list[int], value: float = 0.0
) -> np.ndarray:
    """Pad with the ``pads`` attribute (opset 2)."""
    return _pad(data, pads, mode, value, None)


@op("Pad", since=(11, 13))
def pad_11(
    data: np.ndarray,
    pads: np.ndarray,
    constant_value: np.ndarray | None = None,
    /,
    *,
    mode: str = "constant",
) -> np.ndarray:
    """Pad with ``pads`` and the optional ``constant_value`` as inputs (opset 11)."""
    return _pad(data, pads, mode, constant_value, None)


@op("Pad", since=(18, 19, 21, 23, 24, 25))
def pad(
    data: np.ndarray,
    pads: np.ndarray,
    constant_value: np.ndarray | None = None,
    axes: np.ndarray | None = None,
    /,
    *,
    mode: str = "constant",
) -> np.ndarray:
    """Pad the listed ``axes`` (all by default); negative pads crop; modes as in numpy."""
    return _pad(data, pads, mode, constant_value, axes)


def _pad(data: np.ndarray, pads, mode: str, value, axes) -> np.ndarray:
    if mode not in _PAD_MODES:
        raise KernelFailed(f"Pad: mode must be one of {sorted(_PAD_MODES)}, not {mode!r}")
    pads = _ints(pads)
    rank = data.ndim
    axes = list(range(rank)) if axes is None else [a % rank for a in _ints(axes)]
    if len(pads) != 2 * len(axes):
        raise KernelFailed(
            f"Pad: pads has {len(pads)} values; expected 2 per padded axis ({2 * len(axes)})"
        )
    width = [[0, 0] for _ in range(rank)]
    for i, axis in enumerate(axes):
        width[axis] = [pads[i], pads[len(axes) + i]]
    # negative pads crop first; the rest pads the cropped tensor
    crop = tuple(slice(max(-b, 0), data.shape[a] - max(-e, 0)) for a, (b, e) in enumerate(width))
    data = data[crop]
    width = [(max(b, 0), max(e, 0)) for b, e in width]
    if not any(b or e for b, e in width):
        return data.copy()
    if mode == "constant":
        fill: Any = 0 if value is None else np.asarray(value).reshape(-1)
        if not np.isscalar(fill):
            fill = fill[0] if fill.size else 0
        return np.pad(data, width, mode="constant", constant_values=fill).astype(
            data.dtype, copy=False
        )
    out = tuple(d + b + e for d, (b, e) in zip(data.shape, width, strict=True))
    if 0 in out:  # nothing to fill: an empty axis elsewhere leaves no values to copy
        return np.zeros(out, dtype=data.dtype)
    for axis, (b, e) in enumerate(width):
        if (b or e) and data.shape[axis] == 0:
            raise KernelFailed(f"Pad: cannot {mode}-pad axis {axis}, which is empty")
    return np.pad(data, width, mode=_PAD_MODES[mode])


# -- Tile, Expand, Range, EyeLike, Trilu --------------------------------------------------------


@op("Tile", since=1)
def tile_1(data: np.ndarray, tiles: np.ndarray, axis: np.ndarray, /) -> np.ndarray:
    """Repeat the input ``tiles`` times along one ``axis`` (opset 1)."""
    repeats = [1] * data.ndim
    repeats[int(np.asarray(axis).reshape(-1)[0])] = int(np.asarray(tiles).reshape(-1)[0])
    return np.tile(data, repeats)


@op("Tile", since=(6, 13))
def tile(data: np.ndarray, repeats: np.ndarray, /) -> np.ndarray:
    """Repeat the input ``repeats[i]`` times along each axis ``i``."""
    repeats = _ints(repeats)
    if len(repeats) != data.ndim:
        raise KernelFailed(f"Tile: repeats {repeats} must have one value per axis ({data.ndim})")
    check_elements(data.size * math.prod(max(r, 0) for r in repeats), data.itemsize)
    return np.tile(data, repeats)


@op("Expand", since=(8, 13))
def expand(data: np.ndarray, shape: np.ndarray, /) -> np.ndarray:
    """Broadcast the input against ``shape`` (either side's 1s stretch)."""
    target = np.broadcast_shapes(data.shape, tuple(_ints(shape)))
    check_elements(math.prod(target), data.itemsize)
    return np.broadcast_to(data, target).copy()


_STASH = {TensorProto.FLOAT: np.float32, TensorProto.DOUBLE: np.float64}


@op("Range", since=11)
def range_11(start: np.ndarray, limit: np.ndarray, delta: np.ndarray, /) -> np.ndarray:
    """``start + i * delta`` for ``i < ceil((limit - start) / delta)``."""
    return _range(start, limit, delta, None)


@op("Range", since=27)
def range_(
    start: np.ndarray, limit: np.ndarray, delta: np.ndarray, /, *, stash_type: int = 1
) -> np.ndarray:
    """Range; float16/bfloat16 inputs are computed in the ``stash_type`` precision."""
    return _range(start, limit, delta, stash_type)


def _range(start, limit, delta, stash_type) -> np.ndarray:
    dtype = np.asarray(start).dtype
    if np.issubdtype(dtype, np.integer):
        first, stop, step = (int(np.asarray(v).reshape(-1)[0]) for v in (start, limit, delta))
        if step == 0:
            raise KernelFailed("Range: delta must not be 0")
        count = max(-(-(stop - first) // step), 0)
        check_elements(count, 8)
        return (first + np.arange(count, dtype=np.int64) * step).astype(dtype)
    compute = np.float64
    if stash_type is not None and dtype.itemsize == 2:
        if stash_type not in _STASH:
            raise KernelFailed(
                f"Range: stash_type must be 1 (float) or 11 (double), not {stash_type}"
            )
        compute = _STASH[stash_type]
    first, stop, step = (np.asarray(v, dtype=compute).reshape(-1)[0] for v in (start, limit, delta))
    if step == 0:
        raise KernelFailed("Range: delta must not be 0")
    count = max(int(np.ceil((stop - first) / step)), 0)
    check_elements(count, 8)
    return (first + np.arange(count, dtype=compute) * step).astype(dtype)


@op("EyeLike", since=(9, 22))
def eye_like(data: np.ndarray, /, *, dtype: int | None = None, k: int = 0) -> np.ndarray:
    """A matrix shaped like the 2-D input, ones on diagonal ``k``, in ``dtype`` or the input's."""
    if data.ndim != 2:
        raise KernelFailed(f"EyeLike: the input must be 2-D, got shape {data.shape}")
    out_dtype = data.dtype if dtype is None else helper.tensor_dtype_to_np_dtype(dtype)
    return np.eye(data.shape[0], data.shape[1], k=k, dtype=out_dtype)


@op("Trilu", since=14)
def trilu(data: np.ndarray, k: np.ndarray | None = None, /, *, upper: int = 1) -> np.ndarray:
    """Keep the upper (or lower) triangle of the last two axes, from diagonal ``k``."""
    diagonal = 0 if k is None else int(np.asarray(k).reshape(-1)[0])
    return np.triu(data, diagonal) if upper else np.tril(data, diagonal)


# -- DepthToSpace, SpaceToDepth -----------------------------------------------------------------


@op("DepthToSpace", since=1)
def depth_to_space_1(data: np.ndarray, /, *, blocksize: int) -> np.ndarray:
    """DepthToSpace in DCR order (opset 1)."""
    return _depth_to_space(data, blocksize, "DCR")


@op("DepthToSpace", since=(11, 13, 28))
def depth_to_space(data: np.ndarray, /, *, blocksize: int, mode: str = "DCR") -> np.ndarray:
    """Move channel blocks into ``blocksize`` x ``blocksize`` spatial tiles (DCR or CRD)."""
    return _depth_to_space(data, blocksize, mode)


def _depth_to_space(data: np.ndarray, blocksize: int, mode: str) -> np.ndarray:
    if data.ndim != 4:
        raise KernelFailed(f"DepthToSpace: the input must be 4-D, got shape {data.shape}")
    b, c, h, w = data.shape
    bs = blocksize
    if c % (bs * bs):
        raise KernelFailed(f"DepthToSpace: channels {c} are not divisible by blocksize^2")
    if mode == "DCR":
        tmp = data.reshape(b, bs, bs, c // (bs * bs), h, w).transpose(0, 3, 4, 1, 5, 2)
    elif mode == "CRD":
        tmp = data.reshape(b, c // (bs * bs), bs, bs, h, w).transpose(0, 1, 4, 2, 5, 3)
    else:
        raise KernelFailed(f"DepthToSpace: mode must be 'DCR' or 'CRD', not {mode!r}")
    return _owned(tmp.reshape(b, c // (bs * bs), h * bs, w * bs), data)


@op("SpaceToDepth", since=(1, 13))
def space_to_depth_1(data: np.ndarray, /, *, blocksize: int) -> np.ndarray:
    """SpaceToDepth in DCR order (before opset 28)."""
    return _space_to_depth(data, blocksize, "DCR")


@op("SpaceToDepth", since=28)
def space_to_depth(data: np.ndarray, /, *, blocksize: int, mode: str = "DCR") -> np.ndarray:
    """Move ``blocksize`` x ``blocksize`` spatial tiles into channels (DCR or CRD)."""
    return _space_to_depth(data, blocksize, mode)


def _space_to_depth(data: np.ndarray, blocksize: int, mode: str) -> np.ndarray:
    if data.ndim != 4:
        raise KernelFailed(f"SpaceToDepth: the input must be 4-D, got shape {data.shape}")
    b, c, h, w = data.shape
    bs = blocksize
    if h % bs or w % bs:
        raise KernelFailed(f"SpaceToDepth: height {h} and width {w} must divide by {bs}")
    tmp = data.reshape(b, c, h // bs, bs, w // bs, bs)
    if mode == "DCR":
        tmp = tmp.transpose(0, 3, 5, 1, 2, 4)
    elif mode == "CRD":
        tmp = tmp.transpose(0, 1, 3, 5, 2, 4)
    else:
        raise KernelFailed(f"SpaceToDepth: mode must be 'DCR' or 'CRD', not {mode!r}")
    return _owned(tmp.reshape(b, c * bs * bs, h // bs, w // bs), data)


# -- CenterCropPad, Col2Im, ReverseSequence -----------------------------------------------------


@op("CenterCropPad", since=18)
def center_crop_pad(
    data: np.ndarray, shape: np.ndarray, /, *, axes: list[int] | None = None
) -> np.ndarray:
    """Crop or zero-pad each listed axis to ``shape``, centred (odd remainders go right)."""
    rank = data.ndim
    axes = list(range(rank)) if axes is None else [a % rank for a in axes]
    sizes = _ints(shape)
    if len(sizes) != len(axes):
        raise KernelFailed(f"CenterCropPad: shape {sizes} must have one value per axis {axes}")
    out_shape = list(data.shape)
    source = [slice(None)] * rank
    target = [slice(None)] * rank
    for axis, size in zip(axes, sizes, strict=True):
        dim = data.shape[axis]
        out_shape[axis] = size
        if size < dim:
            begin = (dim - size) // 2
            source[axis] = slice(begin, begin + size)
        elif size > dim:
            begin = (size - dim) // 2
            target[axis] = slice(begin, begin + dim)
    out = np.zeros(out_shape, dtype=data.dtype)
    out[tuple(target)] = data[tuple(source)]
    return out


@op("Col2Im", since=18)
def col2im(
    data: np.ndarray,
    image_shape: np.ndarray,
    block_shape: np.ndarray,
    /,
    *,
    dilations: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> np.ndarray:
    """Sum column blocks ``(N, C*prod(block), L)`` back into images ``(N, C, *image_shape)``."""
    image = _ints(image_shape)
    block = _ints(block_shape)
    rank = len(image)
    dilations = list(dilations) if dilations else [1] * rank
    strides = list(strides) if strides else [1] * rank
    pads = list(pads) if pads else [0] * (2 * rank)
    n, cols, length = data.shape
    taps = math.prod(block)
    if cols % taps:
        raise KernelFailed(
            f"Col2Im: input dimension 1 ({cols}) must divide by prod(block_shape) ({taps})"
        )
    padded = [image[i] + pads[i] + pads[rank + i] for i in range(rank)]
    blocks = [
        (padded[i] - dilations[i] * (block[i] - 1) - 1) // strides[i] + 1 for i in range(rank)
    ]
    if math.prod(blocks) != length or min(blocks) < 1:
        raise KernelFailed(
            f"Col2Im: input dimension 2 ({length}) must equal the number of blocks {blocks}"
        )
    channels = cols // taps
    columns = data.reshape(n, channels, *block, *blocks)
    acc_dtype = np.float64 if data.dtype.kind == "f" else data.dtype
    out = np.zeros((n, channels, *padded), dtype=acc_dtype)
    for tap in itertools.product(*(range(b) for b in block)):
        window = tuple(
            slice(t * d, t * d + s * (o - 1) + 1, s)
            for t, d, s, o in zip(tap, dilations, strides, blocks, strict=True)
        )
        # numpy's stub takes a starred index tuple for an array of indices
        out[(slice(None), slice(None), *window)] += columns[(slice(None), slice(None), *tap)]  # type: ignore[arg-type]
    crop = tuple(slice(pads[i], pads[i] + image[i]) for i in range(rank))
    return out[(slice(None), slice(None), *crop)].astype(data.dtype)


@op("ReverseSequence", since=(10, 28))
def reverse_sequence(
    data: np.ndarray,
    sequence_lens: np.ndarray,
    /,
    *,
    batch_axis: int = 1,
    time_axis: int = 0,
) -> np.ndarray:
    """Reverse the first ``sequence_lens[b]`` steps along ``time_axis`` of each batch entry."""
    if {batch_axis, time_axis} != {0, 1}:
        raise KernelFailed("ReverseSequence: batch_axis and time_axis must be 0 and 1")
    steps = data.shape[time_axis]
    lens = _ints(sequence_lens)
    if len(lens) != data.shape[batch_axis] or any(not 0 <= n <= steps for n in lens):
        raise KernelFailed(
            f"ReverseSequence: sequence_lens {lens} must have one value in [0, {steps}] per batch"
        )
    lens_col = np.asarray(lens, dtype=np.int64)[:, None]  # (batch, 1)
    t = np.arange(steps)[None, :]  # (1, time)
    source = np.where(t < lens_col, lens_col - 1 - t, t)  # (batch, time)
    moved = np.moveaxis(data, (batch_axis, time_axis), (0, 1))
    out = moved[np.arange(len(lens))[:, None], source]
    return np.ascontiguousarray(np.moveaxis(out, (0, 1), (batch_axis, time_axis)))


# -- Split --------------------------------------------------------------------------------------


@op("Split", since=1)
def split_1(
    data: np.ndarray,
    split: np.ndarray | None = None,
    /,
    *,
    axis: int = 0,
    _n_outputs: int | None = None,
    **attrs,
) -> tuple[np.ndarray, ...]:
    """Split (opset 1): sizes from the ``split`` input or attribute, else equal parts."""
    sizes = attrs.get("split") if split is None else _ints(split)
    return _split(data, axis, sizes, None, _n_outputs)


@op("Split", since=(2, 11))
def split_2(
    data: np.ndarray,
    /,
    *,
    axis: int = 0,
    split: list[int] | None = None,
    _n_outputs: int | None = None,
) -> tuple[np.ndarray, ...]:
    """Split with sizes from the ``split`` attribute, else equal parts (opset 2, 11)."""
    return _split(data, axis, split, None, _n_outputs)


@op("Split", since=13)
def split_13(
    data: np.ndarray,
    split: np.ndarray | None = None,
    /,
    *,
    axis: int = 0,
    _n_outputs: int | None = None,
) -> tuple[np.ndarray, ...]:
    """Split with sizes from the optional ``split`` input, else equal parts (opset 13)."""
    return _split(data, axis, None if split is None else _ints(split), None, _n_outputs)


@op("Split", since=18)
def split(
    data: np.ndarray,
    split: np.ndarray | None = None,
    /,
    *,
    axis: int = 0,
    num_outputs: int | None = None,
    _n_outputs: int | None = None,
) -> tuple[np.ndarray, ...]:
    """Split by the ``split`` input, or into ``num_outputs`` parts (the last one smaller)."""
    sizes = None if split is None else _ints(split)
    return _split(data, axis, sizes, num_outputs, _n_outputs)


def _split(
    data: np.ndarray,
    axis: int,
    sizes: Sequence[int] | None,
    num_outputs: int | None,
    n_outputs: int | None,
) -> tuple[np.ndarray, ...]:
    if not -data.ndim <= axis < data.ndim:
        raise KernelFailed(f"Split: axis {axis} is out of range for rank {data.ndim}")
    axis %= data.ndim
    dim = data.shape[axis]
    if sizes is None:
        parts = num_outputs or n_outputs
        if not parts:
            raise KernelFailed(
                "Split: without a 'split' input or 'num_outputs' the kernel needs the node's "
                "output count, which the runtime did not provide"
            )
        # equal parts; when they cannot be, all but the last get the rounded-up size
        chunk = -(-dim // parts)
        sizes = [chunk] * (parts - 1) + [dim - chunk * (parts - 1)]
    sizes = [int(s) for s in sizes]
    if sum(sizes) != dim or min(sizes, default=0) < 0:
        raise KernelFailed(f"Split: sizes {sizes} must be non-negative and sum to {dim}")
    bounds = np.cumsum(sizes)[:-1]
    return tuple(part.copy() for part in np.split(data, bounds, axis=axis))

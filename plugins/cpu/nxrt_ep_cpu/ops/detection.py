"""Detection kernels: NonMaxSuppression, RoiAlign, MaxUnpool."""

from __future__ import annotations

import math

import numpy as np

from nxrt.errors import KernelFailed
from nxrt_ep_cpu.ops._registry import op

# -- NonMaxSuppression ---------------------------------------------------------------------------


@op("NonMaxSuppression", since=(10, 11))
def non_max_suppression(
    boxes: np.ndarray,
    scores: np.ndarray,
    max_output_boxes_per_class: np.ndarray | None = None,
    iou_threshold: np.ndarray | None = None,
    score_threshold: np.ndarray | None = None,
    /,
    *,
    center_point_box: int = 0,
) -> np.ndarray:
    """Greedy per-class box selection: ``(selected, 3)`` rows of [batch, class, box].

    Boxes are taken by descending score (the lower index first on ties); a box
    is dropped when its IoU with an already selected box exceeds the threshold.
    """
    if boxes.ndim != 3 or boxes.shape[2] != 4 or scores.ndim != 3:
        raise KernelFailed(
            f"NonMaxSuppression: boxes {boxes.shape} must be (batch, boxes, 4) and scores "
            f"{scores.shape} (batch, classes, boxes)"
        )
    if boxes.shape[0] != scores.shape[0] or boxes.shape[1] != scores.shape[2]:
        raise KernelFailed(
            f"NonMaxSuppression: boxes {boxes.shape} and scores {scores.shape} do not match"
        )
    limit = max(int(_scalar(max_output_boxes_per_class, 0)), 0)
    iou_limit = float(_scalar(iou_threshold, 0.0))
    min_score = _scalar(score_threshold, None)
    selected: list[tuple[int, int, int]] = []
    if limit == 0:
        return np.zeros((0, 3), dtype=np.int64)
    for b in range(boxes.shape[0]):
        suppresses = _suppression_matrix(boxes[b].astype(np.float64), center_point_box, iou_limit)
        for c in range(scores.shape[1]):
            class_scores = scores[b, c].astype(np.float64)
            order = np.argsort(-class_scores, kind="stable")
            if min_score is not None:
                order = order[class_scores[order] > float(min_score)]
            dropped = np.zeros(boxes.shape[1], dtype=bool)
            kept = 0
            for index in order:
                if dropped[index]:
                    continue
                selected.append((b, c, int(index)))
                kept += 1
                if kept >= limit:
                    break
                dropped |= suppresses[index]
    return np.array(selected, dtype=np.int64).reshape(-1, 3)


def _scalar(value, default):
    if value is None or not np.size(value):
        return default
    return np.asarray(value).reshape(-1)[0]


def _suppression_matrix(boxes: np.ndarray, center_point_box: int, threshold: float) -> np.ndarray:
    """``[i, j]``: whether box ``i`` suppresses box ``j`` (IoU above ``threshold``)."""
    if center_point_box:
        x_c, y_c, w, h = boxes.T
        x_min, x_max = x_c - w / 2, x_c + w / 2
        y_min, y_max = y_c - h / 2, y_c + h / 2
    else:
        y_min = np.minimum(boxes[:, 0], boxes[:, 2])
        y_max = np.maximum(boxes[:, 0], boxes[:, 2])
        x_min = np.minimum(boxes[:, 1], boxes[:, 3])
        x_max = np.maximum(boxes[:, 1], boxes[:, 3])
    inter_w = np.minimum(x_max[:, None], x_max[None, :]) - np.maximum(x_min[:, None], x_min)
    inter_h = np.minimum(y_max[:, None], y_max[None, :]) - np.maximum(y_min[:, None], y_min)
    overlap = (inter_w > 0) & (inter_h > 0)
    inter = np.where(overlap, inter_w * inter_h, 0.0)
    area = (x_max - x_min) * (y_max - y_min)
    union = area[:, None] + area[None, :] - inter
    valid = overlap & (area[:, None] > 0) & (area[None, :] > 0) & (union > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        iou = np.where(valid, inter / np.where(valid, union, 1.0), 0.0)
    return valid & (iou > threshold)


# -- RoiAlign ------------------------------------------------------------------------------------


@op("RoiAlign", since=10)
def roi_align_10(
    x: np.ndarray,
    rois: np.ndarray,
    batch_indices: np.ndarray,
    /,
    *,
    mode: str = "avg",
    output_height: int = 1,
    output_width: int = 1,
    sampling_ratio: int = 0,
    spatial_scale: float = 1.0,
) -> np.ndarray:
    """RoiAlign without the half-pixel shift (opset 10)."""
    return _roi_align(
        x, rois, batch_indices, mode, output_height, output_width, sampling_ratio,
        spatial_scale, half_pixel=False,
    )  # fmt: skip


@op("RoiAlign", since=(16, 22))
def roi_align(
    x: np.ndarray,
    rois: np.ndarray,
    batch_indices: np.ndarray,
    /,
    *,
    coordinate_transformation_mode: str = "half_pixel",
    mode: str = "avg",
    output_height: int = 1,
    output_width: int = 1,
    sampling_ratio: int = 0,
    spatial_scale: float = 1.0,
) -> np.ndarray:
    """Pool each ROI ``[x1, y1, x2, y2]`` to a fixed grid by bilinear sampling (avg or max)."""
    if coordinate_transformation_mode not in ("half_pixel", "output_half_pixel"):
        raise KernelFailed(
            "RoiAlign: coordinate_transformation_mode must be half_pixel or output_half_pixel"
        )
    return _roi_align(
        x, rois, batch_indices, mode, output_height, output_width, sampling_ratio,
        spatial_scale, half_pixel=coordinate_transformation_mode == "half_pixel",
    )  # fmt: skip


def _roi_align(
    x, rois, batch_indices, mode, out_h, out_w, sampling_ratio, spatial_scale, *, half_pixel
) -> np.ndarray:
    if mode not in ("avg", "max"):
        raise KernelFailed(f"RoiAlign: mode must be 'avg' or 'max', not {mode!r}")
    if x.ndim != 4 or rois.ndim != 2 or rois.shape[1] != 4:
        raise KernelFailed(f"RoiAlign: X {x.shape} must be 4-D and rois {rois.shape} (n, 4)")
    batch_indices = np.asarray(batch_indices).reshape(-1).astype(np.int64)
    if batch_indices.size != rois.shape[0]:
        raise KernelFailed("RoiAlign: batch_indices must have one entry per ROI")
    if batch_indices.size and (batch_indices.min() < 0 or batch_indices.max() >= x.shape[0]):
        raise KernelFailed(f"RoiAlign: batch_indices must lie in [0, {x.shape[0] - 1}]")
    _, channels, height, width = x.shape
    data = x.astype(np.float64)
    # the separable weight matrices multiply every pixel, also those no sample reads, by
    # its (zero) weight: a NaN or infinity there would spoil the bin, so such inputs
    # take the per-sample path, which reads only each sample's four corners
    separable = bool(np.isfinite(data).all())
    out = np.zeros((rois.shape[0], channels, out_h, out_w), dtype=np.float64)
    offset = 0.5 if half_pixel else 0.0
    for r, roi in enumerate(rois.astype(np.float64)):
        start_w, start_h, end_w, end_h = roi * spatial_scale - offset
        roi_w, roi_h = end_w - start_w, end_h - start_h
        if not half_pixel:  # malformed ROIs become 1x1
            roi_w, roi_h = max(roi_w, 1.0), max(roi_h, 1.0)
        bin_h, bin_w = roi_h / out_h, roi_w / out_w
        # an inverted ROI (possible with half_pixel) has no samples and pools to 0
        grid_h = sampling_ratio if sampling_ratio > 0 else max(math.ceil(roi_h / out_h), 0)
        grid_w = sampling_ratio if sampling_ratio > 0 else max(math.ceil(roi_w / out_w), 0)
        ys = _samples(start_h, bin_h, out_h, grid_h, height)
        xs = _samples(start_w, bin_w, out_w, grid_w, width)
        image = data[batch_indices[r]]
        if mode == "avg" and not separable:
            total = np.add.reduce(_corners(image, ys, xs))
            sums = total.reshape(channels, out_h, grid_h, out_w, grid_w).sum(axis=(2, 4))
            out[r] = sums / max(grid_h * grid_w, 1)
        elif mode == "avg":
            wy = _interp_matrix(*ys, out_h, grid_h, height)
            wx = _interp_matrix(*xs, out_w, grid_w, width)
            count = max(grid_h * grid_w, 1)
            out[r] = np.einsum("ph,chw,qw->cpq", wy, image, wx) / count
        else:
            out[r] = _roi_max(image, ys, xs, out_h, grid_h, out_w, grid_w)
    return out.astype(x.dtype)


def _samples(start: float, bin_size: float, bins: int, grid: int, size: int):
    """Sample positions along one axis, ``(bins*grid)`` each: low/high taps, their weights
    (0 for a sample outside the input) and whether the sample lies inside."""
    pos = (
        start
        + np.arange(bins)[:, None] * bin_size
        + (np.arange(grid)[None, :] + 0.5) * bin_size / max(grid, 1)
    ).reshape(-1)
    valid = (pos >= -1.0) & (pos <= size)
    pos = np.maximum(pos, 0.0)
    low = np.floor(pos).astype(np.int64)
    edge = low >= size - 1
    low = np.where(edge, size - 1, low)
    high = np.where(edge, size - 1, low + 1)
    pos = np.where(edge, low, pos)
    frac = pos - low
    return low, high, (1.0 - frac) * valid, frac * valid, valid


def _interp_matrix(low, high, w_low, w_high, valid, bins: int, grid: int, size: int) -> np.ndarray:
    """``(bins, size)`` weights summing each bin's samples along one axis."""
    matrix = np.zeros((bins, size), dtype=np.float64)
    rows = np.repeat(np.arange(bins), grid)
    np.add.at(matrix, (rows, low), w_low)
    np.add.at(matrix, (rows, high), w_high)
    return matrix


def _roi_max(image, ys, xs, out_h, grid_h, out_w, grid_w) -> np.ndarray:
    """Max mode: each sample is the largest of its four weighted corners, then max per bin."""
    channels = image.shape[0]
    if grid_h * grid_w == 0:
        return np.zeros((channels, out_h, out_w), dtype=np.float64)
    values = np.maximum.reduce(_corners(image, ys, xs))  # (C, out_h*grid_h, out_w*grid_w)
    values = values.reshape(channels, out_h, grid_h, out_w, grid_w)
    return values.max(axis=(2, 4))


def _corners(image, ys, xs) -> list[np.ndarray]:
    """Each sample's four bilinear corners times their weights, ``(C, y samples, x samples)``.

    A sample outside the input reads pixel (0, 0) with weight 0, as onnx.reference
    (and onnxruntime, whose code it follows) do: only a NaN or infinity there shows.
    """
    y_low, y_high, wy_low, wy_high, y_valid = ys
    x_low, x_high, wx_low, wx_high, x_valid = xs
    inside = y_valid[:, None] & x_valid[None, :]
    origin = image[:, :1, :1] * 0.0
    return [
        np.where(inside, image[:, yi[:, None], xi[None, :]] * (wy[:, None] * wx[None, :]), origin)
        for yi, wy in ((y_low, wy_low), (y_high, wy_high))
        for xi, wx in ((x_low, wx_low), (x_high, wx_high))
    ]


# -- MaxUnpool -----------------------------------------------------------------------------------


@op("MaxUnpool", since=(9, 11, 22))
def max_unpool(
    x: np.ndarray,
    indices: np.ndarray,
    output_shape: np.ndarray | None = None,
    /,
    *,
    kernel_shape: list[int],
    pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> np.ndarray:
    """Scatter pooled values back to the positions MaxPool's ``indices`` recorded.

    The unpooled size follows from the kernel, strides and pads; a larger
    ``output_shape`` gets that result in its leading corner, zeros elsewhere.
    """
    rank = len(kernel_shape)
    if x.ndim != rank + 2:
        raise KernelFailed(f"MaxUnpool: input of shape {x.shape} needs {rank} spatial axes")
    strides = list(strides) if strides else [1] * rank
    pads = list(pads) if pads else [0] * (2 * rank)
    inferred = list(x.shape[:2]) + [
        (x.shape[2 + i] - 1) * strides[i] - (pads[i] + pads[rank + i]) + kernel_shape[i]
        for i in range(rank)
    ]
    total = math.prod(inferred)
    flat_index = np.asarray(indices).reshape(-1).astype(np.int64)
    if flat_index.size != x.size:
        raise KernelFailed(f"MaxUnpool: indices {indices.shape} must match X {x.shape}")
    if flat_index.size and (flat_index.min() < 0 or flat_index.max() >= total):
        raise KernelFailed(f"MaxUnpool: indices must lie in [0, {total - 1}]")
    unpooled = np.zeros(total, dtype=x.dtype)
    unpooled[flat_index] = x.reshape(-1)
    unpooled = unpooled.reshape(inferred)
    if output_shape is None:
        return unpooled
    shape = [int(d) for d in np.asarray(output_shape).reshape(-1)]
    if len(shape) != x.ndim or any(s < i for s, i in zip(shape, inferred, strict=True)):
        raise KernelFailed(
            f"MaxUnpool: output_shape {shape} must not be smaller than the unpooled {inferred}"
        )
    out = np.zeros(shape, dtype=x.dtype)
    out[tuple(slice(0, i) for i in inferred)] = unpooled
    return out

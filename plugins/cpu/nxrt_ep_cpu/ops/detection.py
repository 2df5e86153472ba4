"""Detection kernels: NonMaxSuppression, RoiAlign, MaxUnpool."""

from __future__ import annotations

import functools
import math
import threading
from typing import TYPE_CHECKING

import numpy as np

from nxrt.errors import KernelFailed
from nxrt.kernel import attribute_values
from nxrt.memory import check_allocation
from nxrt_ep_cpu.compiling import compiled_kernel
from nxrt_ep_cpu.kernels import CpuKernel
from nxrt_ep_cpu.ops._registry import op

if TYPE_CHECKING:
    import onnx_ir as ir

    from nxrt.kernel import Kernel
    from nxrt.provider import ExecutionProvider

# -- NonMaxSuppression ---------------------------------------------------------------------------


#: Bytes of scratch per box: its corners and area, one class's scores and order, and the
#: overlap temporaries of one suppression step (all float64 or int64, about 20 arrays).
_NMS_BYTES_PER_BOX = 20 * 8


def _nms_kernel(ep: ExecutionProvider, node: ir.Node) -> Kernel:
    """NonMaxSuppression's kernel, told its session's memory budget (the EP's limit); its
    compiled loop built through :func:`~nxrt_ep_cpu.compiling.compiled_kernel` (the numpy
    loop runs until then)."""
    attrs = {**attribute_values(node), "_budget": ep.config.memory_limit}

    def fast() -> CpuKernel:
        # compiled (or loaded from the disk cache) now, with a run's argument types
        _keep(np.zeros((5, 1), np.float32), np.zeros(1, np.int64), 0.5, 1)
        return CpuKernel(non_max_suppression, attrs)

    return compiled_kernel(
        ep,
        node,
        fast,
        lambda: CpuKernel(non_max_suppression, {**attrs, "_compiled": False}),
        key=("nms",),
    )


@op("NonMaxSuppression", since=(10, 11), factory=_nms_kernel)
def non_max_suppression(
    boxes: np.ndarray,
    scores: np.ndarray,
    max_output_boxes_per_class: np.ndarray | None = None,
    iou_threshold: np.ndarray | None = None,
    score_threshold: np.ndarray | None = None,
    /,
    *,
    center_point_box: int = 0,
    _budget: int | None = None,
    _compiled: bool = True,
) -> np.ndarray:
    """Greedy per-class box selection: ``(selected, 3)`` rows of [batch, class, box].

    Per class, boxes are taken by descending score (the lower index first on
    ties); each box taken drops the remaining ones whose IoU with it exceeds
    the threshold. Corners, areas and IoU are float32 arithmetic, as ONNX
    Runtime computes them, so an IoU at the threshold (7/10 against 0.7) is
    judged the same way: float64 would make 7/10 exceed float32's 0.7. Each
    step compares one selected box with the candidates left, so memory stays
    linear in the number of boxes (a detection model's 27,000 candidates need
    about 4 MiB, not the 5.4 GiB of an N x N IoU matrix), checked against the
    session's budget before anything is allocated; time is (boxes kept) x
    (boxes), bounded by ``max_output_boxes_per_class``.
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
    iou_limit = float(np.float32(_scalar(iou_threshold, 0.0)))
    min_score = _scalar(score_threshold, None)
    if limit == 0:
        return np.zeros((0, 3), dtype=np.int64)
    check_allocation(_NMS_BYTES_PER_BOX * boxes.shape[1], _budget)
    selected: list[tuple[int, int, int]] = []
    for b in range(boxes.shape[0]):
        corners = _box_corners(boxes[b].astype(np.float32), center_point_box)
        for c in range(scores.shape[1]):
            class_scores = scores[b, c].astype(np.float64)
            order = np.argsort(-class_scores, kind="stable")
            if min_score is not None:
                order = order[class_scores[order] > float(min_score)]
            kept = _keep(corners, order, iou_limit, limit, compiled=_compiled)
            selected += [(b, c, i) for i in kept]
    return np.array(selected, dtype=np.int64).reshape(-1, 3)


def _scalar(value, default):
    if value is None or not np.size(value):
        return default
    return np.asarray(value).reshape(-1)[0]


def _box_corners(boxes: np.ndarray, center_point_box: int) -> np.ndarray:
    """``(5, N)``: y_min, x_min, y_max, x_max and area of each box (corners in any order)."""
    if center_point_box:
        x_c, y_c, w, h = boxes.T
        y_min, y_max, x_min, x_max = y_c - h / 2, y_c + h / 2, x_c - w / 2, x_c + w / 2
    else:
        y_min = np.minimum(boxes[:, 0], boxes[:, 2])
        y_max = np.maximum(boxes[:, 0], boxes[:, 2])
        x_min = np.minimum(boxes[:, 1], boxes[:, 3])
        x_max = np.maximum(boxes[:, 1], boxes[:, 3])
    return np.stack([y_min, x_min, y_max, x_max, (x_max - x_min) * (y_max - y_min)])


def _keep(
    corners: np.ndarray, order: np.ndarray, threshold: float, limit: int, compiled: bool = True
) -> list[int]:
    """:func:`greedy_nms`'s choice for one class, compiled by numba when it is installed
    (a Python loop over 27,000 boxes costs seconds; compiled, milliseconds) and
    ``compiled`` (the numpy tier runs the reference)."""
    loop = _compiled_nms() if compiled else None
    if loop is None or not order.size:
        return greedy_nms(corners, order, threshold, limit)
    y0, x0, y1, x1, area = np.ascontiguousarray(corners[:, order])
    by_x = np.argsort(x0, kind="stable")
    widths = x1 - x0
    reach = float(np.max(widths[np.isfinite(widths)], initial=0.0))
    chosen = np.empty(min(limit, order.size), dtype=np.int64)
    count = loop(y0, x0, y1, x1, area, by_x, x0[by_x], reach, threshold, chosen)
    return order[chosen[:count]].tolist()


def greedy_nms(corners: np.ndarray, order: np.ndarray, threshold: float, limit: int) -> list[int]:
    """The boxes kept from ``order`` (best first): each kept box removes the later candidates
    it overlaps by more than ``threshold`` IoU (a box without area overlaps nothing). The
    numpy reference of :func:`_greedy_loop`.

    Only boxes that overlap a kept one along x can be removed by it, so candidates
    are found by binary search in x order (between ``x_min - widest box`` and
    ``x_max``) rather than compared with every box left: with the class offsets
    detection exporters add, a kept box meets only its own class's boxes.
    """
    y0, x0, y1, x1, area = corners[:, order]
    count = order.size
    by_x = np.argsort(x0, kind="stable")  # NaN corners sort last and never overlap
    x0_sorted = x0[by_x]
    widths = x1 - x0
    reach = float(np.max(widths[np.isfinite(widths)], initial=0.0))
    alive = np.ones(count, dtype=bool)
    kept: list[int] = []
    for p in range(count):
        if not alive[p]:
            continue
        kept.append(int(order[p]))
        if len(kept) >= limit:
            break
        if not area[p] > 0:  # no area (or NaN corners): it removes nothing
            continue
        lo = np.searchsorted(x0_sorted, x0[p] - reach, side="left")
        hi = np.searchsorted(x0_sorted, x1[p], side="left")
        near = by_x[lo:hi]
        near = near[(near > p) & alive[near]]
        if not near.size:
            continue
        inter_h = np.minimum(y1[near], y1[p]) - np.maximum(y0[near], y0[p])
        inter_w = np.minimum(x1[near], x1[p]) - np.maximum(x0[near], x0[p])
        inter = np.where((inter_h > 0) & (inter_w > 0), inter_h * inter_w, 0.0)
        union = area[near] + area[p] - inter
        valid = (inter > 0) & (area[near] > 0) & (union > 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            suppressed = valid & (inter / np.where(valid, union, 1.0) > threshold)
        alive[near[suppressed]] = False
    return kept


def _greedy_loop(y0, x0, y1, x1, area, by_x, x0_sorted, reach, threshold, chosen):
    """:func:`greedy_nms` over boxes already in score order, one box pair at a time; writes
    the kept positions into ``chosen`` (its length is the limit) and returns their count."""
    alive = np.ones(y0.size, dtype=np.bool_)
    count = 0
    for p in range(y0.size):  # pragma: no cover - compiled by numba
        if not alive[p]:
            continue
        chosen[count] = p
        count += 1
        if count >= chosen.size:
            break
        if not area[p] > 0:
            continue
        for j in range(
            np.searchsorted(x0_sorted, x0[p] - reach), np.searchsorted(x0_sorted, x1[p])
        ):
            c = by_x[j]
            if c <= p or not alive[c] or not area[c] > 0:
                continue
            inter_h = min(y1[c], y1[p]) - max(y0[c], y0[p])
            inter_w = min(x1[c], x1[p]) - max(x0[c], x0[p])
            if not (inter_h > 0 and inter_w > 0):
                continue
            inter = inter_h * inter_w
            union = area[c] + area[p] - inter
            if union > 0 and inter / union > threshold:
                alive[c] = False
    return count


_compile_lock = threading.Lock()


@functools.cache
def _compiled_nms():
    """The numba-compiled :func:`_greedy_loop`, or ``None`` where numba is not installed."""
    try:
        from nxrt_ep_cpu.jit import njit  # imports numba
    except ImportError:
        return None

    with _compile_lock:  # sessions may run on several threads at once
        return njit(_greedy_loop)


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


def _samples(
    start: float, bin_size: float, bins: int, grid: int, size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
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
    """Max mode: each sample is the largest of its four weighted corners, then max per bin.

    Both maxima are taken in onnx.reference's (and onnxruntime's) order with their
    ``a if not a < b else b`` rule, so a NaN product counts only where that rule keeps it.
    """
    channels = image.shape[0]
    if grid_h * grid_w == 0:
        return np.zeros((channels, out_h, out_w), dtype=np.float64)
    first, *others = _corners(image, ys, xs)  # each (C, out_h*grid_h, out_w*grid_w)
    for corner in others:
        first = np.where(first < corner, corner, first)
    values = first.reshape(channels, out_h, grid_h, out_w, grid_w)
    best = values[:, :, 0, :, 0]
    for iy in range(grid_h):
        for ix in range(grid_w):
            if iy or ix:
                sample = values[:, :, iy, :, ix]
                best = np.where(best < sample, sample, best)
    return best


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

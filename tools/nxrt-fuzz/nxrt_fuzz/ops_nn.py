"""Generators for convolution, pooling, normalization, resampling, detection, recurrent,
attention, quantization, signal, sequence and control-flow ops.

Like :mod:`nxrt_fuzz.ops`: every schema attribute drawn from its valid
range (auto_pad modes, strides larger than the kernel, dilations, pads that
crop, ceil_mode, ...), left out now and then to test its default.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from nxrt_fuzz.build import BOOL, F32, FLOATS, I32, I64, Builder, Skip
from nxrt_fuzz.ops import fl, flag, gen, scalar_or_1d, since

# -- convolution and pooling --------------------------------------------------------------------


def spatial_attrs(b: Builder, kernel: list[int], *, dilations: bool = True) -> dict:
    """auto_pad, pads, strides and dilations for a window op over ``len(kernel)`` dims."""
    n = len(kernel)
    attrs: dict = {}
    auto_pad = b.choice(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"])
    if auto_pad != "NOTSET" or b.maybe(0.2):
        attrs["auto_pad"] = auto_pad
    if auto_pad == "NOTSET" and b.maybe(0.7):
        attrs["pads"] = [b.choice([0, 0, 1, 2, 3]) for _ in range(2 * n)]
    if b.maybe(0.7):
        attrs["strides"] = [b.choice([1, 1, 2, 3, 4]) for _ in range(n)]
    if dilations and b.maybe(0.4):
        attrs["dilations"] = [b.choice([1, 1, 2, 3]) for _ in range(n)]
    return attrs


def window_input(b: Builder, op: str, dtype_index: int = 0) -> tuple[str, int]:
    """An (N, C, spatial...) input with 1 to 3 spatial dims; returns it and its rank."""
    dtype = b.choice(b.types(op, dtype_index))
    spatial = b.choice([1, 2, 2, 2, 3])
    shape = (b.dim(hi=2), b.dim(hi=4), *[b.dim(hi=7) for _ in range(spatial)])
    return b.like(dtype, shape, fresh=0.7), spatial


@gen("Conv")
def conv(b: Builder, op: str) -> onnx.NodeProto:
    x, n = window_input(b, op)
    value = b.value(x)
    c = value.shape[1]
    group = b.choice([1, 1, 1, c]) if c > 1 else 1
    if group == 1 and c % 2 == 0 and b.maybe(0.2):
        group = 2
    m = group * b.int(1, 3)
    kernel = [b.int(1, 4) for _ in range(n)]
    w = b.like(value.dtype, (m, c // group, *kernel), fresh=0.8)
    inputs = [x, w]
    if b.maybe(0.5):
        inputs.append(b.like(value.dtype, (m,), fresh=0.8))
    attrs = spatial_attrs(b, kernel)
    return b.node(
        op,
        inputs,
        group=group if group > 1 or b.maybe(0.2) else None,
        kernel_shape=kernel if b.maybe(0.5) else None,
        **attrs,
    )


@gen("ConvTranspose")
def conv_transpose(b: Builder, op: str) -> onnx.NodeProto:
    x, n = window_input(b, op)
    value = b.value(x)
    c = value.shape[1]
    group = b.choice([1, 1, c]) if c > 1 else 1
    m = group * b.int(1, 2)
    kernel = [b.int(1, 3) for _ in range(n)]
    inputs = [x, b.like(value.dtype, (c, m // group, *kernel), fresh=0.8)]
    if b.maybe(0.5):
        inputs.append(b.like(value.dtype, (m,), fresh=0.8))
    attrs = spatial_attrs(b, kernel)
    strides = attrs.get("strides", [1] * n)
    dilations = attrs.get("dilations", [1] * n)
    if b.maybe(0.3):
        attrs["output_padding"] = [b.int(0, max(s, d) - 1) for s, d in zip(strides, dilations)]
    elif b.maybe(0.2):
        attrs["output_shape"] = [
            s * (i - 1) + d * (k - 1) + 1 + b.int(0, s - 1)
            for s, d, i, k in zip(strides, dilations, value.shape[2:], kernel)
        ]
    return b.node(op, inputs, group=group if group > 1 else None, **attrs)


@gen("ConvInteger")
def conv_integer(b: Builder, op: str) -> onnx.NodeProto:
    x, n = window_input(b, op)
    c = b.value(x).shape[1]
    kernel = [b.int(1, 3) for _ in range(n)]
    w_dtype = b.choice(b.types(op, 1))
    inputs = [x, b.like(w_dtype, (b.int(1, 3), c, *kernel), fresh=0.8)]
    if b.maybe(0.6):
        inputs.append(b.const(b.data(b.value(x).dtype, ())))
    attrs = spatial_attrs(b, kernel)
    return b.node(op, inputs, kernel_shape=kernel if b.maybe(0.5) else None, **attrs)


def pool_kernel(b: Builder, shape: tuple[int, ...], n: int) -> list[int]:
    return [b.int(1, max(1, min(4, d + 1))) for d in shape[-n:]]


@gen("AveragePool", "MaxPool", "LpPool")
def pool(b: Builder, op: str) -> onnx.NodeProto:
    x, n = window_input(b, op)
    kernel = pool_kernel(b, b.value(x).shape, n)
    version = since(op, b)
    has_dilations = (op == "MaxPool" and version >= 10) or version >= 18
    attrs = spatial_attrs(b, kernel, dilations=has_dilations)
    attrs["kernel_shape"] = kernel
    if op != "LpPool" or version >= 18:
        attrs["ceil_mode"] = flag(b, 0.5)
    if op == "AveragePool":
        attrs["count_include_pad"] = flag(b, 0.5)
    if op == "LpPool":
        attrs["p"] = None if b.maybe(0.3) else b.choice([1, 2, 3])
    n_out = 1
    if op == "MaxPool":
        n_out = b.choice([1, 2])
        if n_out == 2 and b.maybe(0.5):
            attrs["storage_order"] = b.int(0, 1)
    return b.node(op, [x], n_out=n_out, **attrs)


@gen("GlobalAveragePool", "GlobalMaxPool")
def global_pool(b: Builder, op: str) -> onnx.NodeProto:
    return b.node(op, [b.pick(b.types(op), (3, 5), lo=1)])


@gen("MaxUnpool")
def max_unpool(b: Builder, op: str) -> list[onnx.NodeProto]:
    dtype = b.choice(b.types(op))
    shape = (b.dim(hi=2), b.dim(hi=3), b.dim(2, 6), b.dim(2, 6))
    x = b.like(dtype, shape)
    kernel = [b.int(1, 2), b.int(1, 2)]
    strides = kernel if b.maybe(0.7) else [1, 1]
    pool = b.node("MaxPool", [x], n_out=2, kernel_shape=kernel, strides=strides)
    inputs = [pool.output[0], pool.output[1]]
    if b.maybe(0.3):
        out = [
            s * (i - 1) + k
            for s, i, k in zip(
                strides, [(d - k) // s + 1 for d, k, s in zip(shape[2:], kernel, strides)], kernel
            )
        ]
        inputs.append(b.param(op, 2, [*shape[:2], *[o + b.int(0, 1) for o in out]]))
    unpool = b.node(op, inputs, kernel_shape=kernel, strides=strides)
    return [pool, unpool]


# -- normalization ------------------------------------------------------------------------------


@gen("BatchNormalization")
def batch_norm(b: Builder, op: str) -> onnx.NodeProto:
    x = b.pick(b.types(op), (2, 4), lo=1)
    value = b.value(x)
    c = value.shape[1]
    stats_dtype = value.dtype if b.maybe(0.8) else b.choice(b.types(op, 1))
    params = [b.const(b.data(stats_dtype, (c,), special=False)) for _ in range(3)]
    var = b.const(np.abs(b.data(stats_dtype, (c,), special=False)))
    return b.node(
        op,
        [x, *params, var],
        epsilon=fl(b, 1e-5, 1e-6, 0.1),
        momentum=fl(b, 0.9, 0.0, 1.0),
        training_mode=None if b.maybe(0.7) else 0,
    )


@gen("InstanceNormalization")
def instance_norm(b: Builder, op: str) -> onnx.NodeProto:
    x = b.pick(b.types(op), (3, 4), lo=1)
    value = b.value(x)
    c = value.shape[1]
    params = [b.like(value.dtype, (c,), fresh=0.9) for _ in range(2)]
    return b.node(op, [x, *params], epsilon=fl(b, 1e-5, 1e-6, 0.1))


@gen("LayerNormalization", "RMSNormalization")
def layer_norm(b: Builder, op: str) -> onnx.NodeProto:
    x = b.pick(b.types(op), (1, 4))
    value = b.value(x)
    axis = b.axis(value.ndim)
    tail = value.shape[axis:]
    inputs = [x, b.like(value.dtype, tail[b.int(0, len(tail)) :] if b.maybe(0.2) else tail)]
    if op == "LayerNormalization" and b.maybe(0.5):
        inputs.append(b.like(value.dtype, tail))
    n_out = b.choice([1, 1, 2, 3]) if op == "LayerNormalization" else 1
    return b.node(
        op,
        inputs,
        n_out=n_out,
        axis=None if axis == -1 and b.maybe() else axis,
        epsilon=fl(b, 1e-5, 1e-6, 0.1),
        stash_type=None if b.maybe(0.6) else 1,
    )


@gen("MeanVarianceNormalization")
def mvn(b: Builder, op: str) -> onnx.NodeProto:
    x = b.pick(b.types(op), (1, 4))
    axes = None if b.maybe(0.3) else b.axes(b.value(x).ndim, lo=1)
    return b.node(op, [x], axes=axes)


@gen("LRN")
def lrn(b: Builder, op: str) -> onnx.NodeProto:
    x = b.pick(b.types(op), (3, 4), lo=1)
    return b.node(
        op,
        [x],
        size=b.choice([1, 2, 3, 5]),
        alpha=fl(b, 1e-4, 1e-5, 0.1),
        beta=fl(b, 0.75, 0.1, 1.5),
        bias=fl(b, 1.0, 0.5, 2.0),
    )


# -- resampling ---------------------------------------------------------------------------------

COORDINATE_MODES = [
    "half_pixel",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_crop_and_resize",
]


#: Scales drawn for Resize: whole factors, and ones whose output width is fractional for
#: most lengths (1.25, 0.75, 0.34 ...), which the coordinate modes treat differently.
RESIZE_SCALES = (0.5, 0.6, 0.75, 1.0, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 0.34, 0.9, 1.7)


@gen("Resize")
def resize(b: Builder, op: str) -> onnx.NodeProto:
    """Every attribute against every other: modes, coordinate modes, nearest rounding,
    cubic coefficient, exclude_outside (for cubic and antialiased linear, now and then for
    the others too, which onnxruntime refuses), extrapolation (read only by
    tf_crop_and_resize), antialias, axes (negative, out of order), the aspect policy,
    scales or sizes, a roi the mode ignores; ranks 1 to 5."""
    version = since(op, b)
    x = b.pick(b.types(op), (1, 5), lo=1, hi=5)
    value = b.value(x)
    rank = value.ndim
    mode = b.choice(["nearest", "linear", "cubic"])
    resized = list(range(rank))
    if version >= 18 and b.maybe(0.35):
        resized = sorted(b.axes(rank, lo=1), key=lambda a: a % rank)
        if len(resized) > 1 and b.maybe(0.2):
            b.rng.shuffle(resized)  # the spec allows axes in any order
    elif b.maybe(0.5) and rank >= 2:
        resized = list(range(rank - 2, rank))  # the usual: only H and W change
    modes = COORDINATE_MODES + (["half_pixel_symmetric"] if version >= 19 else [])
    ctm = b.choice(modes)
    attrs: dict = {
        "mode": None if mode == "nearest" and b.maybe(0.3) else mode,
        "coordinate_transformation_mode": None if b.maybe(0.2) else ctm,
    }
    ctm = attrs["coordinate_transformation_mode"] or "half_pixel"
    if (mode == "nearest" and b.maybe(0.7)) or b.maybe(0.1):
        attrs["nearest_mode"] = b.choice(
            ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]
        )
    if mode == "cubic" or b.maybe(0.1):
        attrs["cubic_coeff_a"] = fl(b, -0.75, -1.0, -0.5)
    antialias = version >= 18 and mode != "nearest" and b.maybe(0.3)
    if antialias:
        attrs["antialias"] = 1
    if mode == "cubic" or (antialias and b.maybe(0.5)) or b.maybe(0.05):
        attrs["exclude_outside"] = flag(b, 0.5)
    if ctm == "tf_crop_and_resize" or b.maybe(0.1):
        attrs["extrapolation_value"] = fl(b, 0.0, -2.0, 7.0)
    if version >= 18 and (len(resized) < rank or b.maybe(0.1)):
        attrs["axes"] = [a - rank if b.maybe(0.3) else a for a in resized]
    n = len(resized) if "axes" in attrs else rank
    moved = resized if "axes" in attrs else list(range(rank))
    roi = ""
    if ctm == "tf_crop_and_resize" or (version >= 11 and b.maybe(0.1)):
        starts = b.rng.uniform(-0.2, 0.5, n)
        ends = starts + b.rng.uniform(0.2, 1.0, n)
        roi = b.param(op, 1, np.concatenate([starts, ends]), b.choice([F32, value.dtype]))
    if b.maybe(0.5):
        scales = [float(b.choice(RESIZE_SCALES)) if a in resized else 1.0 for a in moved]
        inputs = [x, roi, b.param(op, 2, scales, F32)]
    else:
        sizes = [
            b.int(1, 2 * value.shape[a] + 2) if a in resized else value.shape[a] for a in moved
        ]
        if version >= 18 and b.maybe(0.35):
            attrs["keep_aspect_ratio_policy"] = b.choice(["stretch", "not_larger", "not_smaller"])
        scales_input = "" if b.maybe(0.7) else b.const(np.zeros(0, F32))
        inputs = [x, roi, scales_input, b.param(op, 3, sizes)]
    if version < 13 and not roi:
        inputs[1] = b.const(np.zeros(0, F32))
    if not roi and len(inputs) == 3 and b.maybe(0.5) and version >= 13:
        inputs[1] = ""
    return b.node(op, inputs, **attrs)


@gen("GridSample")
def grid_sample(b: Builder, op: str) -> onnx.NodeProto:
    version = since(op, b)
    spatial = 3 if version >= 20 and b.maybe(0.2) else 2
    dtype = b.choice(b.types(op))
    n, c = b.dim(hi=2), b.dim(hi=3)
    x = b.like(dtype, (n, c, *[b.dim(hi=5) for _ in range(spatial)]))
    out = [b.dim(hi=4) for _ in range(spatial)]
    reach = b.choice([1.0, 1.3, 1.3, 2.5])
    points = b.rng.uniform(-reach, reach, (n, *out, spatial))
    if b.maybe(0.3):  # the corners and the centre, where the align_corners modes differ
        exact = b.rng.random(points.shape) < 0.3
        points[exact] = b.rng.choice([-1.0, 0.0, 1.0], int(exact.sum()))
    if b.maybe(0.1):
        points.reshape(-1)[b.int(0, points.size - 1)] = np.nan
    grid = b.input(points.astype(b.choice(b.types(op, 1))))
    modes = ["linear", "nearest", "cubic"] if version >= 20 else ["bilinear", "nearest", "bicubic"]
    mode = b.choice(modes)
    if spatial == 3 and mode == "cubic":
        mode = "linear"
    return b.node(
        op,
        [x, grid],
        mode=None if b.maybe(0.2) else mode,
        padding_mode=None if b.maybe(0.3) else b.choice(["zeros", "border", "reflection"]),
        align_corners=flag(b),
    )


@gen("AffineGrid")
def affine_grid(b: Builder, op: str) -> onnx.NodeProto:
    n = b.dim(hi=2)
    spatial = b.choice([2, 2, 3])
    theta = b.input(b.data(b.choice(b.types(op)), (n, spatial, spatial + 1), special=False))
    size = [n, b.dim(hi=3), *[b.dim(hi=5) for _ in range(spatial)]]
    return b.node(op, [theta, b.param(op, 1, size)], align_corners=flag(b))


@gen("RoiAlign")
def roi_align(b: Builder, op: str) -> onnx.NodeProto:
    dtype = b.choice(b.types(op))
    n, c, h, w = b.dim(hi=2), b.dim(hi=3), b.dim(2, 6), b.dim(2, 6)
    x = b.like(dtype, (n, c, h, w))
    rois = b.int(0, 3)
    corners = b.rng.uniform(-2, max(h, w) + 2, (rois, 2, 2))
    boxes = np.concatenate([corners.min(1), corners.max(1)], axis=1)
    if rois and b.maybe(0.15):  # a box given upside down, or of no size
        boxes[0] = boxes[0][[2, 3, 0, 1]] if b.maybe() else boxes[0][[0, 1, 0, 1]]
    attrs: dict = {
        "mode": None if b.maybe(0.4) else b.choice(["avg", "max"]),
        "output_height": None if b.maybe(0.3) else b.int(1, 4),
        "output_width": None if b.maybe(0.3) else b.int(1, 4),
        "sampling_ratio": None if b.maybe(0.3) else b.int(0, 3),
        "spatial_scale": fl(b, 1.0, 0.25, 2.0),
    }
    if since(op, b) >= 16 and b.maybe(0.7):
        attrs["coordinate_transformation_mode"] = b.choice(["half_pixel", "output_half_pixel"])
    return b.node(
        op,
        [x, b.const(boxes.astype(dtype)), b.const(b.rng.integers(0, n, rois).astype(np.int64))],
        **attrs,
    )


@gen("Col2Im")
def col2im(b: Builder, op: str) -> onnx.NodeProto:
    dtype = b.choice(b.types(op))
    block = [b.int(1, 3), b.int(1, 3)]
    strides = [b.int(1, 2), b.int(1, 2)]
    dilations = [b.int(1, 2), b.int(1, 2)] if b.maybe(0.3) else [1, 1]
    pads = [b.int(0, 1) for _ in range(4)] if b.maybe(0.3) else [0, 0, 0, 0]
    image = [b.int(2, 6), b.int(2, 6)]
    blocks = 1
    for i in range(2):
        span = image[i] + pads[i] + pads[i + 2] - dilations[i] * (block[i] - 1) - 1
        if span < 0:
            raise Skip("the block does not fit the image")
        blocks *= span // strides[i] + 1
    c = b.dim(hi=2)
    x = b.like(dtype, (b.dim(hi=2), c * block[0] * block[1], blocks))
    return b.node(
        op,
        [x, b.param(op, 1, image), b.param(op, 2, block)],
        strides=strides,
        dilations=dilations,
        pads=pads,
    )


@gen("DeformConv")
def deform_conv(b: Builder, op: str) -> onnx.NodeProto:
    dtype = b.choice(b.types(op))
    n, c, h, w = b.dim(hi=2), b.dim(hi=2), b.dim(2, 5), b.dim(2, 5)
    kernel = [b.int(1, 2), b.int(1, 2)]
    strides = [b.int(1, 2), b.int(1, 2)]
    pads = [b.int(0, 1) for _ in range(4)]
    dilations = [b.int(1, 2), b.int(1, 2)]
    out = [
        (size + pads[i] + pads[i + 2] - dilations[i] * (kernel[i] - 1) - 1) // strides[i] + 1
        for i, size in enumerate((h, w))
    ]
    if min(out) < 1:
        raise Skip("empty output")
    group = b.choice([1, c]) if c > 1 else 1
    m = group * b.int(1, 2)
    offset_group = 1
    offsets = b.input(b.rng.uniform(-1.5, 1.5, (n, 2 * kernel[0] * kernel[1], *out)).astype(dtype))
    inputs = [
        b.like(dtype, (n, c, h, w)),
        b.like(dtype, (m, c // group, *kernel)),
        offsets,
    ]
    if b.maybe(0.5):
        inputs.append(b.like(dtype, (m,)))
        if b.maybe(0.5):
            mask = b.rng.uniform(0, 1, (n, kernel[0] * kernel[1], *out)).astype(dtype)
            inputs.append(b.input(mask))
    return b.node(
        op,
        inputs,
        kernel_shape=kernel if b.maybe() else None,
        strides=strides,
        pads=pads,
        dilations=dilations,
        group=group,
        offset_group=offset_group,
    )


@gen("NonMaxSuppression")
def non_max_suppression(b: Builder, op: str) -> onnx.NodeProto:
    batches, classes, boxes = b.dim(hi=2), b.dim(hi=3), b.int(0, 12)
    center = flag(b, 0.5)
    xy = b.rng.uniform(0, 10, (batches, boxes, 2))
    wh = b.rng.uniform(0.5, 5, (batches, boxes, 2))
    if center:
        box = np.concatenate([xy, wh], -1)
    else:
        corner = xy + wh * b.choice([1, -1])  # flipped corners are allowed
        box = (
            np.concatenate([xy, corner], -1)
            if b.maybe()
            else np.concatenate([xy[..., ::-1], corner[..., ::-1]], -1)
        )
    scores = b.rng.uniform(0, 1, (batches, classes, boxes))
    if b.maybe(0.3):
        scores = np.round(scores * 4) / 4  # equal scores: the spec keeps them in index order
    inputs = [b.input(box.astype(F32)), b.input(scores.astype(F32))]
    for value, dtype in (
        (b.int(0, 6), I64),
        (b.choice([0.0, 0.3, 0.5, 0.7, 1.0]), F32),
        (b.choice([0.0, 0.2, 0.5]), F32),
    ):
        if b.maybe(0.8):
            inputs.append(b.param(op, len(inputs), scalar_or_1d(b, value, dtype), None))
        else:
            break
    return b.node(op, inputs, center_point_box=center if center or b.maybe() else None)


# -- recurrent ----------------------------------------------------------------------------------


@gen("RNN", "GRU", "LSTM")
def recurrent(b: Builder, op: str) -> onnx.NodeProto:
    gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[op]
    dtype = b.choice(b.types(op))
    seq, batch, size, hidden = b.int(1, 4), b.dim(hi=3), b.dim(hi=4), b.int(1, 4)
    direction = b.choice(["forward", "reverse", "bidirectional"])
    dirs = 2 if direction == "bidirectional" else 1
    layout = flag(b, 0.6) if since(op, b) >= 14 else None
    x_shape = (batch, seq, size) if layout else (seq, batch, size)
    scale = 1 / np.sqrt(hidden)
    weights = [
        b.const((b.rng.standard_normal((dirs, gates * hidden, k)) * scale).astype(dtype))
        for k in (size, hidden)
    ]
    inputs = [b.like(dtype, x_shape), *weights]
    optional = [
        (b.rng.standard_normal((dirs, 2 * gates * hidden)) * scale).astype(dtype),
        b.rng.integers(1, seq + 1, batch).astype(np.int32),
        b.data(dtype, (batch, dirs, hidden) if layout else (dirs, batch, hidden), special=False),
    ]
    if op == "LSTM":
        optional.append(optional[-1].copy())
        optional.append((b.rng.standard_normal((dirs, 3 * hidden)) * scale).astype(dtype))
    for array in optional:
        if b.maybe(0.5):
            inputs.append(b.const(array) if array.dtype != dtype or b.maybe() else b.input(array))
        elif b.maybe(0.5):
            inputs.append("")
        else:
            break
    while inputs[-1] == "":
        inputs.pop()
    attrs: dict = {
        "hidden_size": hidden,
        "direction": None if direction == "forward" and b.maybe() else direction,
        "layout": layout,
        "clip": None if b.maybe(0.8) else 2.0,
    }
    if op == "GRU":
        attrs["linear_before_reset"] = flag(b, 0.5)
    if op == "LSTM":
        attrs["input_forget"] = flag(b, 0.8)
    if op == "RNN" and b.maybe(0.3):
        attrs["activations"] = [b.choice(["Tanh", "Relu", "Sigmoid"])] * dirs
    return b.node(op, inputs, n_out=b.choice([1, 2, 3 if op == "LSTM" else 2]), **attrs)


# -- attention ----------------------------------------------------------------------------------


@gen("Attention")
def attention(b: Builder, op: str) -> onnx.NodeProto:
    dtype = b.choice(b.types(op))
    batch, q_heads, q_len, kv_len, head = (
        b.dim(hi=2),
        b.choice([1, 2, 4]),
        b.int(1, 4),
        b.int(1, 4),
        b.int(1, 4),
    )
    kv_heads = b.choice([h for h in (1, 2, 4) if q_heads % h == 0])
    v_head = head if b.maybe(0.7) else b.int(1, 4)
    four_d = b.maybe(0.6)
    attrs: dict = {}
    if four_d:
        q = b.like(dtype, (batch, q_heads, q_len, head))
        k = b.like(dtype, (batch, kv_heads, kv_len, head))
        v = b.like(dtype, (batch, kv_heads, kv_len, v_head))
    else:
        q = b.like(dtype, (batch, q_len, q_heads * head))
        k = b.like(dtype, (batch, kv_len, kv_heads * head))
        v = b.like(dtype, (batch, kv_len, kv_heads * v_head))
        attrs["q_num_heads"], attrs["kv_num_heads"] = q_heads, kv_heads
    inputs = [q, k, v]
    if b.maybe(0.4):
        mask_dtype = b.choice([BOOL, dtype])
        inputs.append(b.input(b.data(mask_dtype, (q_len, kv_len), special=False)))
    attrs["is_causal"] = flag(b, 0.6)
    attrs["scale"] = None if b.maybe(0.7) else 0.5
    attrs["softcap"] = None if b.maybe(0.8) else 5.0
    return b.node(op, inputs, **attrs)


@gen("RotaryEmbedding")
def rotary_embedding(b: Builder, op: str) -> onnx.NodeProto:
    dtype = b.choice(b.types(op))
    batch, seq, heads, head = b.dim(hi=2), b.int(1, 4), b.choice([1, 2]), b.choice([2, 4, 6])
    rotary = b.choice([head, head // 2 if head % 4 == 0 else head])
    four_d = b.maybe(0.5)
    x_shape = (batch, heads, seq, head) if four_d else (batch, seq, heads * head)
    max_pos = seq + 2
    cache = (max_pos, rotary // 2)
    angles = b.rng.uniform(0, 3, cache)
    inputs = [
        b.like(dtype, x_shape),
        b.const(np.cos(angles).astype(dtype)),
        b.const(np.sin(angles).astype(dtype)),
        b.const(b.rng.integers(0, max_pos, (batch, seq)).astype(np.int64)),
    ]
    return b.node(
        op,
        inputs,
        interleaved=flag(b),
        num_heads=None if four_d else heads,
        rotary_embedding_dim=None if rotary == head and b.maybe() else rotary,
    )


# -- quantization -------------------------------------------------------------------------------


def scale_and_zero(
    b: Builder,
    op: str,
    shape: tuple[int, ...],
    zp_dtype: np.dtype | None,
    scale_dtype: np.dtype = F32,
) -> list[str]:
    scale = b.const((b.rng.uniform(0.01, 0.5, shape)).astype(scale_dtype))
    if zp_dtype is None:
        return [scale]
    info = np.iinfo(zp_dtype)
    zp = b.rng.integers(max(info.min, -10), min(info.max, 20), shape, endpoint=True)
    return [scale, b.const(zp.astype(zp_dtype))]


@gen("QuantizeLinear", "DequantizeLinear")
def quantize(b: Builder, op: str) -> onnx.NodeProto:
    version = since(op, b)
    quantized = [d for d in b.types(op, 2 if op == "QuantizeLinear" else 0) if d.kind in "iu"]
    if not quantized:
        raise Skip("no integer type")
    q_dtype = b.choice(quantized)
    if op == "QuantizeLinear":
        x = b.pick(b.types(op, 0), (0, 4))
    else:
        x = b.pick([q_dtype], (0, 4))
    value = b.value(x)
    attrs: dict = {}
    kind = b.choice(["tensor", "axis", "block"]) if value.ndim else "tensor"
    if kind == "block" and version < 21:
        kind = "axis"
    if kind == "tensor":
        shape: tuple[int, ...] = () if b.maybe(0.7) else (1,)
    else:
        axis = b.axis(value.ndim)
        attrs["axis"] = axis
        shape = (value.shape[axis],)
        if kind == "block":
            block = b.int(1, 3)
            attrs["block_size"] = block
            shape = tuple(
                -(-d // block) if i == axis % value.ndim else d for i, d in enumerate(value.shape)
            )
    scale_dtype = F32 if op == "DequantizeLinear" or b.maybe(0.7) else value.dtype
    params = scale_and_zero(
        b, op, shape, q_dtype if b.maybe(0.8) or op == "DequantizeLinear" else None, scale_dtype
    )
    if op == "QuantizeLinear" and version >= 19:
        attrs["saturate"] = None
    if op == "QuantizeLinear" and len(params) == 1 and version >= 21 and b.maybe(0.5):
        attrs["output_dtype"] = helper.np_dtype_to_tensor_dtype(q_dtype)
    return b.node(op, [x, *params], **attrs)


@gen("DynamicQuantizeLinear")
def dynamic_quantize(b: Builder, op: str) -> onnx.NodeProto:
    """Finite inputs only: a NaN or infinity makes the scale infinite or NaN, and what each
    runtime returns then is an accident of how its min and max treat NaN."""
    return b.node(op, [b.pick([F32], where=lambda v: bool(np.isfinite(v).all()))], n_out=3)


@gen("QLinearMatMul")
def qlinear_matmul(b: Builder, op: str) -> onnx.NodeProto:
    dtype = b.choice(b.types(op, 0))
    m, k, n = b.dim(), b.dim(), b.dim()
    a = b.like(dtype, (m, k))
    w = b.like(dtype, (k, n))
    return b.node(
        op,
        [
            a,
            *scale_and_zero(b, op, (), dtype),
            w,
            *scale_and_zero(b, op, (), dtype),
            *scale_and_zero(b, op, (), dtype),
        ],
    )


@gen("QLinearConv")
def qlinear_conv(b: Builder, op: str) -> onnx.NodeProto:
    dtype = b.choice(b.types(op, 0))
    spatial = b.choice([1, 2, 2])
    c = b.dim(hi=3)
    x = b.like(dtype, (b.dim(hi=2), c, *[b.dim(hi=6) for _ in range(spatial)]))
    kernel = [b.int(1, 3) for _ in range(spatial)]
    m = b.int(1, 3)
    w_dtype = b.choice(b.types(op, 3))
    w = b.like(w_dtype, (m, c, *kernel))
    inputs = [
        x,
        *scale_and_zero(b, op, (), dtype),
        w,
        *scale_and_zero(b, op, b.choice([(), (m,)]), w_dtype),
        *scale_and_zero(b, op, (), dtype),
    ]
    if b.maybe(0.5):
        inputs.append(b.const(b.rng.integers(-50, 50, m).astype(I32)))
    return b.node(op, inputs, **spatial_attrs(b, kernel))


# -- signal -------------------------------------------------------------------------------------


@gen("HannWindow", "HammingWindow", "BlackmanWindow")
def window(b: Builder, op: str) -> onnx.NodeProto:
    size = b.param(op, 0, b.int(0, 9), b.choice([I32, I64]))
    dtype = None if b.maybe(0.5) else helper.np_dtype_to_tensor_dtype(b.choice(FLOATS))
    return b.node(op, [size], periodic=flag(b), output_datatype=dtype)


@gen("DFT")
def dft(b: Builder, op: str) -> onnx.NodeProto:
    version = since(op, b)
    dtype = b.choice(b.types(op))
    batch, length = b.dim(hi=2), b.int(1, 8)
    complex_in = b.maybe(0.5)
    # finite input only: how a NaN or infinity spreads through a transform depends on the
    # FFT algorithm (which terms meet 0 * inf), which no spec fixes
    x = b.input(b.data(dtype, (batch, length, 2 if complex_in else 1), special=False))
    inverse = flag(b)
    onesided = flag(b, 0.5) if not complex_in and not inverse else None
    inputs = [x]
    if b.maybe(0.4):
        inputs.append(b.param(op, 1, b.int(1, 9), b.choice([I32, I64])))
    attrs: dict = {"inverse": inverse, "onesided": onesided}
    if version >= 20:
        if b.maybe(0.5):
            inputs += [""] * (2 - len(inputs))
            inputs.append(b.param(op, 2, b.choice([1, -2]), I64))
    else:
        attrs["axis"] = None if b.maybe() else 1
    return b.node(op, inputs, **attrs)


@gen("STFT")
def stft(b: Builder, op: str) -> onnx.NodeProto:
    dtype = b.choice(b.types(op))
    length = b.int(4, 12)
    frame = b.int(2, length)
    x = b.input(b.data(dtype, (b.dim(hi=2), length, b.choice([1, 1, 2])), special=False))
    inputs = [x, b.param(op, 1, b.int(1, 3), b.choice([I32, I64]))]
    if b.maybe(0.5):
        inputs.append(b.const(b.rng.uniform(0, 1, frame).astype(dtype)))
    else:
        inputs.append("")
    if b.maybe(0.7) or inputs[2] == "":
        inputs.append(b.param(op, 3, frame, I64))
    while inputs[-1] == "":
        inputs.pop()
    onesided = 0 if b.value(x).shape[-1] == 2 else flag(b)
    return b.node(op, inputs, onesided=onesided)


@gen("MelWeightMatrix")
def mel_weight_matrix(b: Builder, op: str) -> onnx.NodeProto:
    dtype = b.choice([I32, I64])
    rate = b.choice([8000, 16000])
    lower = b.choice([0.0, 100.0])
    inputs = [
        b.param(op, 0, b.int(1, 6), dtype),
        b.param(op, 1, b.choice([8, 16, 32]), dtype),
        b.param(op, 2, rate, dtype),
        b.param(op, 3, lower, F32),
        b.param(op, 4, b.choice([rate / 2, rate / 4]), F32),
    ]
    out = None if b.maybe() else helper.np_dtype_to_tensor_dtype(b.choice(FLOATS))
    return b.node(op, inputs, output_datatype=out)


# -- sequences, optionals, control flow ---------------------------------------------------------


@gen(
    "SequenceAt", "SequenceLength", "ConcatFromSequence", "SequenceInsert", "SequenceErase",
    "SplitToSequence", "SequenceConstruct", "SequenceEmpty",
)  # fmt: skip
def sequence(b: Builder, op: str) -> list[onnx.NodeProto]:
    """A sequence made (SequenceConstruct, SplitToSequence or SequenceEmpty + inserts),
    maybe edited, then turned back into a tensor; the items' shapes are tracked so that
    inserts and ConcatFromSequence stay valid."""
    x = b.pick(b.types("SequenceConstruct"), (1, 3), lo=1)
    value = b.value(x)
    nodes: list[onnx.NodeProto] = []
    make = b.choice(["SequenceConstruct", "SplitToSequence", "SplitToSequence"])
    if op in ("SequenceConstruct", "SplitToSequence", "SequenceEmpty"):
        make = op
    if make == "SequenceConstruct":
        items = [x] + [b.like(value.dtype, value.shape, fresh=0.7) for _ in range(b.int(0, 2))]
        shapes = [value.shape] * len(items)
        nodes.append(b.node(make, items))
    elif make == "SplitToSequence":
        axis = b.axis(value.ndim)
        length = value.shape[axis]
        attrs: dict = {"axis": axis}
        inputs = [x]
        if b.maybe(0.5):
            sizes = np.diff([0, *sorted(b.rng.integers(0, length + 1, b.int(0, 2))), length])
            inputs.append(b.param(make, 1, sizes))
        elif b.maybe(0.3):
            chunk = b.int(1, length)
            inputs.append(b.param(make, 1, chunk))
            sizes = [chunk] * (length // chunk) + ([length % chunk] if length % chunk else [])
        else:
            sizes = [1] * length
            attrs["keepdims"] = flag(b)
        shapes = []
        for size in sizes:
            shape = list(value.shape)
            shape[axis] = int(size)
            if attrs.get("keepdims") == 0:
                del shape[axis]
            shapes.append(tuple(shape))
        nodes.append(b.node(make, inputs, **attrs))
    else:
        elem = helper.np_dtype_to_tensor_dtype(value.dtype)
        nodes.append(b.node("SequenceEmpty", [], dtype=elem))
        nodes.append(b.node("SequenceInsert", [nodes[-1].output[0], x]))
        shapes = [value.shape]
    seq = nodes[-1].output[0]
    if op == "SequenceInsert" or b.maybe(0.3):
        shape = shapes[0] if shapes else value.shape
        count = len(shapes)
        at = b.int(-count, count)
        position = [] if b.maybe(0.5) else [b.param("SequenceInsert", 2, at)]
        nodes.append(b.node("SequenceInsert", [seq, b.like(value.dtype, shape), *position]))
        shapes.insert(at if position else count, shape)
        seq = nodes[-1].output[0]
    if (op == "SequenceErase" or b.maybe(0.2)) and len(shapes) > 1:
        at = b.int(-len(shapes), len(shapes) - 1)
        position = [] if b.maybe(0.5) else [b.param("SequenceErase", 1, at)]
        nodes.append(b.node("SequenceErase", [seq, *position]))
        del shapes[at if position else -1]
        seq = nodes[-1].output[0]
    consume = (
        op
        if op in ("SequenceAt", "SequenceLength", "ConcatFromSequence")
        else b.choice(["SequenceAt", "SequenceLength", "ConcatFromSequence"])
    )
    if consume == "ConcatFromSequence" and shapes:
        rank = len(shapes[0])
        same = all(s == shapes[0] for s in shapes)
        along = [
            a
            for a in range(rank)
            if all(s[:a] + s[a + 1 :] == shapes[0][:a] + shapes[0][a + 1 :] for s in shapes)
        ]
        if same and (not along or b.maybe(0.5)):
            axis = b.int(-rank - 1, rank)
            nodes.append(b.node(consume, [seq], axis=axis, new_axis=1))
            return nodes
        if along:
            axis = b.choice(along)
            axis = axis - rank if b.maybe(0.3) else axis
            nodes.append(b.node(consume, [seq], axis=axis, new_axis=None if b.maybe() else 0))
            return nodes
    if consume != "SequenceLength" and shapes:
        at = b.int(-len(shapes), len(shapes) - 1)
        nodes.append(b.node("SequenceAt", [seq, b.param("SequenceAt", 1, at)]))
    else:
        nodes.append(b.node("SequenceLength", [seq]))
    return nodes


@gen("Optional", "OptionalHasElement", "OptionalGetElement")
def optional(b: Builder, op: str) -> list[onnx.NodeProto]:
    x = b.pick(b.types("Optional"))
    made = b.node("Optional", [x])
    consume = b.choice(["OptionalHasElement", "OptionalGetElement"]) if op == "Optional" else op
    return [made, b.node(consume, [made.output[0]])]


def branch(b: Builder, name: str, x: str, dtype: np.dtype, ops: list[str]) -> onnx.GraphProto:
    """A subgraph computing one output from the outer value ``x`` with a few unary ops."""
    nodes, last = [], x
    for op in ops:
        nodes.append(helper.make_node(op, [last], [b.out()]))
        last = nodes[-1].output[0]
    out = helper.make_tensor_value_info(last, helper.np_dtype_to_tensor_dtype(dtype), None)
    if not nodes:
        nodes.append(helper.make_node("Identity", [x], [b.out()]))
        out = helper.make_tensor_value_info(
            nodes[-1].output[0], out.type.tensor_type.elem_type, None
        )
    return helper.make_graph(nodes, name, [], [out])


@gen("If")
def if_(b: Builder, op: str) -> onnx.NodeProto:
    x = b.pick([F32])
    cond = b.param(op, 0, b.maybe(), BOOL) if b.maybe(0.5) else b.pick([BOOL], 0)
    unary = ["Relu", "Neg", "Abs", "Sigmoid", "Tanh"]  # no Floor: a branch cannot drift
    then = branch(b, "then", x, F32, [b.choice(unary) for _ in range(b.int(0, 2))])
    other = branch(b, "else", x, F32, [b.choice(unary) for _ in range(b.int(0, 2))])
    return b.node(op, [cond], then_branch=then, else_branch=other)


@gen("Loop")
def loop(b: Builder, op: str) -> onnx.NodeProto:
    x = b.pick([F32], (0, 3))
    value = b.value(x)
    trips = b.param(op, 0, b.int(0, 4), I64)
    carried = f"carry{b.out()}"
    out_c = b.out()
    scan_out = b.out()
    body_nodes = [
        helper.make_node("Add", [carried, x], [out_c]),
        helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        helper.make_node("Sigmoid", [out_c], [scan_out]),
    ]
    elem = helper.np_dtype_to_tensor_dtype(value.dtype)
    body = helper.make_graph(
        body_nodes,
        "body",
        [
            helper.make_tensor_value_info("iter", onnx.TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", onnx.TensorProto.BOOL, []),
            helper.make_tensor_value_info(carried, elem, list(value.shape)),
        ],
        [
            helper.make_tensor_value_info("cond_out", onnx.TensorProto.BOOL, []),
            helper.make_tensor_value_info(out_c, elem, list(value.shape)),
            helper.make_tensor_value_info(scan_out, elem, list(value.shape)),
        ],
    )
    cond = b.param(op, 1, True, BOOL)
    return b.node(op, [trips, cond, b.like(value.dtype, value.shape)], n_out=2, body=body)


@gen("Scan")
def scan(b: Builder, op: str) -> onnx.NodeProto:
    x = b.pick([F32], (1, 3), lo=1)
    value = b.value(x)
    axis = b.axis(value.ndim) if b.maybe(0.5) else 0
    item_shape = [d for i, d in enumerate(value.shape) if i != axis % value.ndim]
    elem = helper.np_dtype_to_tensor_dtype(value.dtype)
    state_in, state_out, item, scan_out = b.out(), b.out(), b.out(), b.out()
    body = helper.make_graph(
        [
            helper.make_node("Add", [state_in, item], [state_out]),
            helper.make_node("Tanh", [state_out], [scan_out]),
        ],
        "body",
        [
            helper.make_tensor_value_info(state_in, elem, item_shape),
            helper.make_tensor_value_info(item, elem, item_shape),
        ],
        [
            helper.make_tensor_value_info(state_out, elem, item_shape),
            helper.make_tensor_value_info(scan_out, elem, item_shape),
        ],
    )
    init = b.like(value.dtype, item_shape)
    return b.node(
        op,
        [init, x],
        n_out=2,
        body=body,
        num_scan_inputs=1,
        scan_input_axes=[axis] if axis or b.maybe() else None,
        scan_input_directions=None if b.maybe(0.5) else [b.int(0, 1)],
        scan_output_directions=None if b.maybe(0.5) else [b.int(0, 1)],
    )


@gen("SequenceMap")
def sequence_map(b: Builder, op: str) -> list[onnx.NodeProto]:
    """Items of one shape mapped by a one-node body (a unary op, or Add with an extra
    input), then read back with SequenceAt or ConcatFromSequence."""
    x = b.pick([F32], (1, 3), lo=1)
    value = b.value(x)
    items = [x] + [b.like(value.dtype, value.shape, fresh=0.7) for _ in range(b.int(0, 2))]
    made = b.node("SequenceConstruct", items)
    elem = helper.np_dtype_to_tensor_dtype(value.dtype)
    item_in, extra_in, item_out = b.out(), b.out(), b.out()
    inputs = [made.output[0]]
    body_inputs = [helper.make_tensor_value_info(item_in, elem, None)]
    if b.maybe(0.5):
        body = [helper.make_node("Add", [item_in, extra_in], [item_out])]
        body_inputs.append(helper.make_tensor_value_info(extra_in, elem, None))
        inputs.append(b.like(value.dtype, b.broadcast_shape(value.shape)))
    else:
        body = [
            helper.make_node(b.choice(["Neg", "Relu", "Sigmoid", "Abs"]), [item_in], [item_out])
        ]
    graph = helper.make_graph(
        body, "map", body_inputs, [helper.make_tensor_value_info(item_out, elem, None)]
    )
    mapped = b.node(op, inputs, body=graph)
    if b.maybe(0.5):
        at = b.int(-len(items), len(items) - 1)
        read = b.node("SequenceAt", [mapped.output[0], b.param("SequenceAt", 1, at)])
    else:
        read = b.node("ConcatFromSequence", [mapped.output[0]], axis=0, new_axis=flag(b))
    return [made, mapped, read]

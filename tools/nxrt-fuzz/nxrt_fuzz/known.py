"""Where the ONNX spec and onnxruntime disagree, and nxrt follows the spec.

Each entry names its ops, explains what the spec says and what onnxruntime
does instead, recognises the one-node cases it covers (``situation``), and
confirms that nxrt's result is the spec's (``confirm``; by default nxrt must
agree with ``onnx.reference``, the ONNX project's executable reading of its
spec). Only a case that matches both is counted as a ``known difference``;
any other disagreement stays a failure. docs/fuzzing.md lists the entries.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import onnx
from onnx import helper

from nxrt_fuzz.case import Case
from nxrt_fuzz.compare import mismatch

Inputs = Sequence["np.ndarray | None"]


def reference_outputs(case: Case) -> list[np.ndarray] | str:
    """``onnx.reference``'s outputs for the case, or why it cannot run it."""
    from onnx.reference import ReferenceEvaluator

    try:
        with np.errstate(all="ignore"):
            return [np.asarray(v) for v in ReferenceEvaluator(case.model).run(None, case.feeds)]
    except Exception as exc:  # noqa: BLE001 - the reference's limits, reported as text
        return f"{type(exc).__name__}: {exc}"


def agrees_with_reference(
    case: Case, got: list[Any] | str, *, reshape: bool = False, slack: int = 0
) -> bool:
    """Whether nxrt's outputs are those of ``onnx.reference`` (float16 loosely); when nxrt
    refused the case (``got`` is its error), whether the reference refuses it too.

    ``reshape`` compares values only (the reference drops size-1 axes in a few ops);
    integers may differ by ``slack`` (where both round an interpolated value).
    """
    want = reference_outputs(case)
    if isinstance(want, str) or isinstance(got, str):
        return isinstance(want, str) and isinstance(got, str)
    if len(want) != len(got):
        return False
    for g, w in zip(got, want):
        g = np.asarray(g)
        if reshape and w.size == g.size:
            w = w.reshape(g.shape)
        if slack and g.dtype.kind in "iu" and g.shape == w.shape:
            if g.size and np.abs(g.astype(np.int64) - w.astype(np.int64)).max() > slack:
                return False
        elif mismatch(g, w.astype(g.dtype), loose=4):
            return False
    return True


def _finite(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The feeds with NaN made 0.5 and infinities +-100."""
    return {
        k: np.nan_to_num(v, nan=0.5, posinf=100.0, neginf=-100.0) if v.dtype.kind == "f" else v
        for k, v in feeds.items()
    }


def finite_twin_agrees(case: Case) -> bool:
    """Whether onnxruntime and nxrt agree once every NaN and infinity in the feeds is
    replaced by a finite number: then the two differ only in how non-finite values
    propagate."""
    from nxrt_fuzz.execute import outputs_mismatch, run_nxrt, run_onnxruntime

    twin = Case(case.model, _finite(case.feeds))
    expected, got = run_onnxruntime(twin), run_nxrt(twin)
    if isinstance(expected, str) or isinstance(got, str):
        return False
    # loosely: the replacements (+-100) make cancellations where rounding shows
    if not outputs_mismatch(twin, got, expected, loose=100):
        return True
    # the twin may differ for a reason of its own that another entry covers (a Resize
    # with a fractional output width, say); it has no NaN, so this cannot loop
    twin.expected = dict(zip(twin.output_names(), expected))
    return bool(known_difference(twin, got))


@dataclass(frozen=True)
class KnownDifference:
    """One documented disagreement: which ops, why, which cases it covers."""

    id: str
    ops: tuple[str, ...]
    explanation: str
    situation: Callable[[onnx.NodeProto, Inputs], bool]
    confirm: Callable[[Case, list[Any] | str], bool] = agrees_with_reference


def attrs_of(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _non_finite(node: onnx.NodeProto, inputs: Inputs) -> bool:
    if node.op_type in FOLLOWS_ORT_ON_NAN:
        return False
    return any(v is not None and v.dtype.kind == "f" and not np.all(np.isfinite(v)) for v in inputs)


def _nan_in_one_d(node: onnx.NodeProto, inputs: Inputs) -> bool:
    x = inputs[0] if inputs else None
    return x is not None and x.ndim == 1 and x.dtype.kind == "f" and bool(np.isnan(x).any())


def _non_finite_and_twin(case: Case, got: list[Any] | str) -> bool:
    """onnxruntime and nxrt agree on the finite twin, and nxrt agrees with onnx.reference;
    where the reference gets the finite twin wrong itself (its RNNs ignore sequence_lens,
    its Resize refuses negative axes), the twin alone decides."""
    if isinstance(got, str) or not finite_twin_agrees(case):
        return False
    if agrees_with_reference(case, got, reshape=True):
        return True
    from nxrt_fuzz.execute import run_nxrt

    twin = Case(case.model, _finite(case.feeds))
    return not agrees_with_reference(twin, run_nxrt(twin), reshape=True)


def _finite_twin_only(case: Case, got: list[Any] | str) -> bool:
    """nxrt runs it, and agrees with onnxruntime once the NaNs and infinities are gone."""
    return not isinstance(got, str) and finite_twin_agrees(case)


def _same_negative(node: onnx.NodeProto, inputs: Inputs) -> bool:
    """SAME auto_pad where a kernel shorter than its stride makes the padding negative."""
    a = attrs_of(node)
    x = inputs[0]
    if x is None or a.get("auto_pad") not in (b"SAME_UPPER", b"SAME_LOWER"):
        return False
    total = _same_totals(node, x, _weight(node, inputs))
    return any(t < 0 for t in total)


#: Where a convolution's weight sits among its inputs (its kernel is the weight's shape).
_WEIGHT_INPUT = {"Conv": 1, "ConvInteger": 1, "QLinearConv": 3}


def _weight(node: onnx.NodeProto, inputs: Inputs) -> np.ndarray | None:
    at = _WEIGHT_INPUT.get(node.op_type)
    return inputs[at] if at is not None and len(inputs) > at else None


def _same_totals(
    node: onnx.NodeProto, x: np.ndarray, weight: np.ndarray | None = None
) -> list[int]:
    a = attrs_of(node)
    rank = x.ndim - 2
    kernel = a.get("kernel_shape") or (list(weight.shape[2:]) if weight is not None else [1] * rank)
    strides = a.get("strides", [1] * rank)
    dilations = a.get("dilations", [1] * rank)
    return [
        (-(-size // s) - 1) * s + (k - 1) * d + 1 - size
        for size, k, s, d in zip(x.shape[2:], kernel, strides, dilations)
    ]


def _explicit_pads_reference(case: Case, got: list[Any] | str) -> bool:
    """nxrt agrees with onnx.reference on the same node given the spec's SAME padding
    explicitly: the total ``max(0, ...)``, its odd unit at the end (SAME_UPPER) or at the
    start (SAME_LOWER)."""
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    node = model.graph.node[0]
    init = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    inputs = [case.feeds.get(n, init.get(n)) if n else None for n in node.input]
    x = cast(np.ndarray, inputs[0])  # X: required
    upper = attrs_of(node)["auto_pad"] == b"SAME_UPPER"
    totals = [max(t, 0) for t in _same_totals(node, x, _weight(node, inputs))]
    begin = [t // 2 if upper else t - t // 2 for t in totals]
    kept = [a for a in node.attribute if a.name != "auto_pad"]
    del node.attribute[:]
    node.attribute.extend(kept)
    node.attribute.append(
        helper.make_attribute("pads", begin + [t - b for t, b in zip(totals, begin)])
    )
    return agrees_with_reference(Case(model, case.feeds), got)


def _cubic_padded(node: onnx.NodeProto, inputs: Inputs) -> bool:
    a = attrs_of(node)
    cubic = a.get("mode") in (b"cubic", b"bicubic")
    return cubic and a.get("padding_mode", b"zeros") in (b"border", b"reflection")


def _grid_sample_reference(case: Case, got: list[Any] | str) -> bool:
    """onnx.reference agrees, run at opset 20 (its opset-16 GridSample does nearest only)."""
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    for attr in model.graph.node[0].attribute:
        if attr.name == "mode":
            attr.s = {b"bicubic": b"cubic", b"bilinear": b"linear"}.get(attr.s, attr.s)
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx"):
            opset.version = max(opset.version, 20)
    feeds = dict(case.feeds)
    grid = model.graph.node[0].input[1]
    for value_info in model.graph.input:  # the reference computes in a float16 grid's type
        if value_info.name == grid and feeds[grid].dtype == np.float16:
            value_info.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
            feeds[grid] = feeds[grid].astype(np.float32)
    return agrees_with_reference(Case(model, feeds), got)


NORMALIZATIONS = ("InstanceNormalization", "LayerNormalization", "BatchNormalization",
                  "MeanVarianceNormalization", "RMSNormalization", "GroupNormalization",
                  "LpNormalization")  # fmt: skip


def _floats(node: onnx.NodeProto, inputs: Inputs) -> bool:
    return bool(inputs) and inputs[0] is not None and inputs[0].dtype.kind == "f"


def _closer_to_float64(case: Case, got: list[Any] | str) -> bool:
    """nxrt matches onnx.reference run in float64 (every float input widened), and
    onnxruntime's output is further from it than nxrt's: onnxruntime's own rounding,
    amplified by a near-zero variance, is what differs."""
    if isinstance(got, str) or not case.expected:
        return False
    dtype = next(v.dtype for v in case.feeds.values() if v.dtype.kind == "f")
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    for init in model.graph.initializer:
        value = onnx.numpy_helper.to_array(init)
        if value.dtype == dtype:
            init.CopyFrom(onnx.numpy_helper.from_array(value.astype(np.float64), init.name))
    for value_info in model.graph.input:
        if case.feeds[value_info.name].dtype == dtype:
            value_info.type.tensor_type.elem_type = onnx.TensorProto.DOUBLE
    feeds = {k: v.astype(np.float64) if v.dtype == dtype else v for k, v in case.feeds.items()}
    want = reference_outputs(Case(model, feeds))
    if isinstance(want, str):
        return False
    for g, w, e in zip(got, want, case.expected.values()):
        if mismatch(g, w.astype(g.dtype)):
            return False
        with np.errstate(all="ignore"):
            nxrt_error = np.nanmax(np.abs(g.astype(np.float64) - w), initial=0.0)
            ort_error = np.nanmax(np.abs(e.astype(np.float64) - w), initial=0.0)
        if not ort_error > nxrt_error:
            return False
    return True


def _convtranspose_zero_extended(case: Case, got: list[Any] | str) -> bool:
    """nxrt's output is onnxruntime's full result (where the padding is negative) placed
    where the spec's pads put it, ``pads[start] = total // 2`` (SAME_UPPER) or
    ``total - total // 2`` (SAME_LOWER), and the bias (or zero) elsewhere."""
    if isinstance(got, str) or not case.expected:
        return False
    node = case.model.graph.node[0]
    a = attrs_of(node)
    init = {t.name: onnx.numpy_helper.to_array(t) for t in case.model.graph.initializer}
    x, w = ((case.feeds | init)[n] for n in node.input[:2])
    full = next(iter(case.expected.values()))
    rank = x.ndim - 2
    strides = a.get("strides", [1] * rank)
    dilations = a.get("dilations", [1] * rank)
    extra = a.get("output_padding", [0] * rank)
    want = np.zeros(got[0].shape, dtype=got[0].dtype)
    if len(node.input) > 2 and node.input[2]:  # the extension holds the bias alone
        bias = (case.feeds | init)[node.input[2]]
        want += bias.reshape((1, -1) + (1,) * rank).astype(want.dtype)
    window, source = [slice(None), slice(None)], [slice(None), slice(None)]
    for i in range(rank):
        length = (
            strides[i] * (x.shape[2 + i] - 1) + extra[i] + (w.shape[2 + i] - 1) * dilations[i] + 1
        )
        total = length - _same_target(a, x)[i]
        start = total // 2 if a["auto_pad"] == b"SAME_UPPER" else total - total // 2
        # onnxruntime's output starts with the full result (padded at the end to an
        # output_shape); the spec's places it at -start
        window.append(slice(-start, -start + length) if total < 0 else slice(None))
        source.append(slice(0, length) if total < 0 else slice(None))
    try:
        want[tuple(window)] = full[tuple(source)]
    except ValueError:
        return False
    return not mismatch(got[0], want)


def _crop_on_unscaled_axis(node: onnx.NodeProto, inputs: Inputs) -> bool:
    """tf_crop_and_resize where an axis keeps its length but its roi is not [0, 1]."""
    a = attrs_of(node)
    x = inputs[0]
    roi = inputs[1] if len(inputs) > 1 else None
    if a.get("coordinate_transformation_mode") != b"tf_crop_and_resize" or x is None:
        return False
    if roi is None or not roi.size:
        return False
    axes = [ax % x.ndim for ax in a.get("axes") or range(x.ndim)]
    scales = inputs[2] if len(inputs) > 2 and inputs[2] is not None else np.zeros(0)
    sizes = inputs[3] if len(inputs) > 3 and inputs[3] is not None else np.zeros(0)
    half = roi.size // 2
    for i, axis in enumerate(axes):
        same = (scales.size and scales[i] == 1) or (sizes.size and sizes[i] == x.shape[axis])
        if same and (roi[i], roi[half + i]) != (0, 1):
            return True
    return False


def _resize_integers_in_float32(node: onnx.NodeProto, inputs: Inputs) -> bool:
    """An integer Resize that float32 cannot carry: values beyond 2**24, or values outside
    [0, 255] through antialiasing or cubic weights (onnxruntime clamps them to it)."""
    x = inputs[0]
    if x is None or x.dtype.kind not in "iu" or not x.size:
        return False
    a = attrs_of(node)
    wide = np.abs(x.astype(np.float64)).max() > 2**24
    clamped = bool(a.get("antialias")) or a.get("mode") == b"cubic"
    return wide or (clamped and (x.min() < 0 or x.max() > 255))


def _as_float64_resize(case: Case, got: list[Any] | str) -> bool:
    """nxrt's integers are, within 1, what it computes for the same values as float64
    (truncated and saturated): the integer path adds nothing but the final cast."""
    from nxrt_fuzz.execute import run_nxrt

    if isinstance(got, str):
        return False
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    x = model.graph.node[0].input[0]
    feeds = dict(case.feeds)
    for value_info in model.graph.input:
        if value_info.name == x:
            value_info.type.tensor_type.elem_type = onnx.TensorProto.DOUBLE
    dtype = feeds[x].dtype
    feeds[x] = feeds[x].astype(np.float64)
    wide = run_nxrt(Case(model, feeds))
    if isinstance(wide, str):
        return False
    info = np.iinfo(dtype)
    want = np.clip(np.trunc(wide[0]), info.min, info.max)
    return got[0].shape == want.shape and (
        not want.size or np.abs(got[0].astype(np.float64) - want).max() <= 1
    )


def _extrapolation_out_of_range(node: onnx.NodeProto, inputs: Inputs) -> bool:
    """An integer tf_crop_and_resize whose extrapolation_value its type cannot hold."""
    a = attrs_of(node)
    x = inputs[0]
    if (
        x is None
        or x.dtype.kind not in "iu"
        or a.get("coordinate_transformation_mode") != (b"tf_crop_and_resize")
    ):
        return False
    value, info = a.get("extrapolation_value", 0.0), np.iinfo(x.dtype)
    return not info.min <= np.trunc(value) <= info.max


def _nearest_near_boundary(node: onnx.NodeProto, inputs: Inputs) -> bool:
    """Nearest Resize where a source coordinate lies within 1e-5 of where its rounding
    flips (a whole number for floor and ceil, a half for the round modes): float32 and
    float64 then pick neighbouring pixels."""
    a = attrs_of(node)
    x = inputs[0]
    if x is None or a.get("mode", b"nearest") != b"nearest":
        return False
    ctm = a.get("coordinate_transformation_mode", b"half_pixel")
    rounding = a.get("nearest_mode", b"round_prefer_floor")
    edge = 0.0 if rounding in (b"floor", b"ceil") else 0.5
    axes = [ax % x.ndim for ax in a.get("axes") or range(x.ndim)]
    scales = inputs[2] if len(inputs) > 2 and inputs[2] is not None else np.zeros(0)
    sizes = inputs[3] if len(inputs) > 3 and inputs[3] is not None else np.zeros(0)
    for i, axis in enumerate(axes):
        length = x.shape[axis]
        out = int(sizes[i]) if sizes.size else int(np.floor(scales[i] * length))
        scale = out / length if sizes.size else float(scales[i])
        y = np.arange(out, dtype=np.float64)
        if ctm == b"align_corners" and out > 1:
            coords = y * (length - 1) / (scale * length - 1)
        elif ctm == b"asymmetric":
            coords = y / scale
        elif ctm == b"half_pixel_symmetric":
            coords = length / 2 * (1 - out / (scale * length)) + (y + 0.5) / scale - 0.5
        elif ctm in (b"half_pixel", b"pytorch_half_pixel"):
            coords = (y + 0.5) / scale - 0.5
        else:
            continue
        if np.any(np.abs((coords - edge) - np.round(coords - edge)) < 1e-5):
            return True
    return False


def _negative_axes_with_policy(node: onnx.NodeProto, inputs: Inputs) -> bool:
    a = attrs_of(node)
    policy = a.get("keep_aspect_ratio_policy", b"stretch")
    return policy != b"stretch" and any(axis < 0 for axis in a.get("axes", []))


def _integer_interpolation(node: onnx.NodeProto, inputs: Inputs) -> bool:
    mode = attrs_of(node).get("mode", b"nearest")
    return _integers(node, inputs) and mode in (b"linear", b"cubic", b"bilinear", b"bicubic")


def _within_one(case: Case, got: list[Any] | str) -> bool:
    """Every integer nxrt gives is within 1 of onnxruntime's."""
    if isinstance(got, str) or not case.expected:
        return False
    for g, e in zip(got, case.expected.values()):
        if g.shape != e.shape or g.dtype != e.dtype:
            return False
        if g.size and np.abs(g.astype(np.int64) - e.astype(np.int64)).max() > 1:
            return False
    return True


def _int32_max_backwards(node: onnx.NodeProto, inputs: Inputs) -> bool:
    """An int32 Slice whose starts or ends hold INT32_MAX or INT32_MIN on a backward step."""
    if len(inputs) < 5 or inputs[4] is None or inputs[1] is None:
        return False
    steps = inputs[4].reshape(-1)
    for bound in (inputs[1], inputs[2]):
        if bound is None or bound.dtype != np.int32:
            continue
        limits = np.isin(bound.reshape(-1), [2**31 - 1, -(2**31)])
        if np.any(limits & (steps < 0)):
            return True
    return False


def _any(node: onnx.NodeProto, inputs: Inputs) -> bool:
    return True


def _checker_refuses(case: Case, got: list[Any] | str) -> bool:
    """nxrt refused the model, and so does the ONNX checker (nxrt runs it on every model)."""
    if not isinstance(got, str):
        return False
    try:
        onnx.checker.check_model(case.model)
    except onnx.checker.ValidationError:
        return True
    return False


def _all_ignored(node: onnx.NodeProto, inputs: Inputs) -> bool:
    """A mean loss over no target that counts (all ignored, or none at all)."""
    a = attrs_of(node)
    target = inputs[1] if len(inputs) > 1 else None
    if a.get("reduction", b"mean") != b"mean" or target is None:
        return False
    return not target.size or ("ignore_index" in a and bool(np.all(target == a["ignore_index"])))


def _wide_integers(node: onnx.NodeProto, inputs: Inputs) -> bool:
    """An integer input holding values a float32 cannot represent exactly (|v| > 2**24)."""
    return any(
        v is not None
        and v.dtype.kind in "iu"
        and v.size
        and np.abs(v.astype(np.float64)).max() > 2**24
        for v in inputs
    )


def _fractional_output_width(node: onnx.NodeProto, inputs: Inputs) -> bool:
    """Resize by ``scales`` (or by ``sizes`` under an aspect policy, which makes one
    scale) in a mode whose formula divides by the output width, where ``scale * input
    length`` is not a whole number."""
    a = attrs_of(node)
    mode = a.get("coordinate_transformation_mode", b"half_pixel")
    x = inputs[0]
    scales = inputs[2] if len(inputs) > 2 and inputs[2] is not None else np.zeros(0)
    sizes = inputs[3] if len(inputs) > 3 and inputs[3] is not None else np.zeros(0)
    if x is None:
        return False
    # ONNX Runtime's trilinear kernel (linear mode on 3-D and 5-D inputs) divides by the
    # integer output length in every coordinate mode
    trilinear = a.get("mode", b"nearest") == b"linear" and x.ndim in (3, 5)
    if mode not in (b"align_corners", b"tf_crop_and_resize", b"pytorch_half_pixel"):
        if not trilinear:
            return False
    axes = [ax % x.ndim for ax in a.get("axes") or range(x.ndim)]
    policy = a.get("keep_aspect_ratio_policy", b"stretch")
    if sizes.size and policy != b"stretch":  # one scale for every axis, from the sizes
        ratios = [int(n) / x.shape[ax] for n, ax in zip(sizes.reshape(-1), axes) if x.shape[ax]]
        common = (min if policy == b"not_larger" else max)(ratios, default=1.0)
        scales = np.full(len(axes), common)
    if not scales.size:
        return False
    widths = [float(s) * x.shape[ax] for s, ax in zip(scales.reshape(-1), axes)]
    return any(w != int(w) for w in widths)


def _integer_overflow(node: onnx.NodeProto, inputs: Inputs) -> bool:
    """The op's exact result, computed over the whole input in Python integers (a bound
    on every partial result), leaves the integer type: the spec does not define it."""
    x = inputs[0] if inputs else None
    if x is None or x.dtype.kind not in "iu" or not x.size:
        return False
    values = [int(v) for v in x.ravel()]
    op = node.op_type
    if op in ("ReduceSumSquare", "ReduceL2"):
        bound = sum(v * v for v in values)
        bound = math.isqrt(bound) if op == "ReduceL2" else bound
    elif op in ("ReduceProd", "CumProd"):
        bound = 1
        for v in values:
            bound = min(abs(bound * v), 2**200)
    elif op == "Pow" and len(inputs) > 1 and inputs[1] is not None and inputs[1].size:
        top = int(np.max(inputs[1]))
        bound = max(abs(v) for v in values) ** top if 0 < top < 64 else 0
    elif op in ("MatMul", "Einsum") and len(inputs) > 1 and inputs[1] is not None:
        other = inputs[1]
        bound = sum(abs(v) for v in values) * int(np.abs(other.astype(object)).max() or 0)
    else:
        bound = sum(abs(v) for v in values)
    return bound > np.iinfo(x.dtype).max


def _undefined(case: Case, got: list[Any] | str) -> bool:
    """Nothing to confirm: the spec leaves the result undefined (nxrt must still run)."""
    return not isinstance(got, str)


def _scalar_input(node: onnx.NodeProto, inputs: Inputs) -> bool:
    return bool(inputs) and inputs[0] is not None and inputs[0].ndim == 0


def _nonzero_of_scalar(case: Case, got: list[Any] | str) -> bool:
    """The spec: "for scalar input, NonZero produces output shape (0, N)"."""
    if isinstance(got, str):
        return False
    x = next(iter(case.feeds.values()), None)
    if x is None:
        x = onnx.numpy_helper.to_array(case.model.graph.initializer[0])
    return len(got) == 1 and got[0].shape == (0, int(x != 0))


def _empty_window(node: onnx.NodeProto, inputs: Inputs) -> bool:
    return len(node.output) > 1 and bool(node.output[1])


def _indices_of_empty_windows(case: Case, got: list[Any] | str) -> bool:
    """The values agree with onnxruntime's, and every index that differs is nxrt's -1 for
    a window that holds padding alone (no element to point at)."""
    if isinstance(got, str) or len(got) < 2 or len(case.expected) < 2:
        return False
    values, indices = list(case.expected.values())[:2]
    if mismatch(got[0], values) or got[1].shape != indices.shape:
        return False
    return bool(np.all((got[1] == indices) | (got[1] == -1)))


def _unpool_shape_given(node: onnx.NodeProto, inputs: Inputs) -> bool:
    return len(inputs) > 2 and inputs[2] is not None


def _pool_geometry(node: onnx.NodeProto, x: np.ndarray) -> tuple[list[int], ...]:
    """kernel, pads, strides and dilations of a pooling node (VALID: no pads)."""
    a = attrs_of(node)
    kernel = list(a.get("kernel_shape", []))
    rank = len(kernel)
    pads = list(a.get("pads", [0] * 2 * rank))
    if a.get("auto_pad", b"NOTSET") == b"VALID":
        pads = [0] * 2 * rank
    return kernel, pads, list(a.get("strides", [1] * rank)), list(a.get("dilations", [1] * rank))


def _window_past_input(node: onnx.NodeProto, inputs: Inputs) -> bool:
    """A window (dilated kernel) longer than the padded input along some axis."""
    x = inputs[0]
    if (
        x is None
        or x.ndim < 3
        or attrs_of(node).get("auto_pad", b"NOTSET")
        not in (
            b"NOTSET",
            b"VALID",
        )
    ):
        return False
    kernel, pads, _, dilations = _pool_geometry(node, x)
    rank = len(kernel)
    return any(
        x.shape[2 + i] + pads[i] + pads[i + rank] < (kernel[i] - 1) * dilations[i] + 1
        for i in range(rank)
    )


def _pool_shape_by_formula(case: Case, got: list[Any] | str) -> bool:
    """The output has the spec's size, ``floor((in + pads - dilated kernel) / stride + 1)``
    (``ceil`` with ``ceil_mode``), which is 0 for a window longer than its input."""
    if isinstance(got, str):
        return False
    node = case.model.graph.node[0]
    x = next(iter(case.feeds.values()))
    kernel, pads, strides, dilations = _pool_geometry(node, x)
    rank = len(kernel)
    rounding = np.ceil if attrs_of(node).get("ceil_mode", 0) else np.floor
    want = []
    for i in range(rank):
        span = x.shape[2 + i] + pads[i] + pads[i + rank] - (kernel[i] - 1) * dilations[i] - 1
        want.append(max(int(rounding(span / strides[i] + 1)), 0))
    return all(tuple(g.shape[2:]) == tuple(want) for g in got)


def _same_dilated(node: onnx.NodeProto, inputs: Inputs) -> bool:
    a = attrs_of(node)
    return a.get("auto_pad") in (b"SAME_UPPER", b"SAME_LOWER") and any(
        d > 1 for d in a.get("dilations", [])
    )


def _same_output_shape(case: Case, got: list[Any] | str) -> bool:
    """SAME's output size is ``ceil(in / stride)``, whatever the dilation."""
    if isinstance(got, str):
        return False
    node = case.model.graph.node[0]
    x = next(iter(case.feeds.values()))
    strides = attrs_of(node).get("strides", [1] * (x.ndim - 2))
    want = tuple(-(-d // s) for d, s in zip(x.shape[2:], strides))
    return all(tuple(g.shape[2:]) == want for g in got)


def _same_padding_negative(node: onnx.NodeProto, inputs: Inputs) -> bool:
    """SAME ConvTranspose whose spec'd output ``in * stride`` is larger than the full
    result (a kernel smaller than its stride): the total padding is negative."""
    a = attrs_of(node)
    x, w = inputs[0], inputs[1]
    if x is None or w is None or a.get("auto_pad") not in (b"SAME_UPPER", b"SAME_LOWER"):
        return False
    rank = x.ndim - 2
    strides = a.get("strides", [1] * rank)
    dilations = a.get("dilations", [1] * rank)
    extra = a.get("output_padding", [0] * rank)
    target = _same_target(a, x)
    return any(
        strides[i] * (x.shape[2 + i] - 1) + extra[i] + (w.shape[2 + i] - 1) * dilations[i] + 1
        < target[i]
        for i in range(rank)
    )


def _same_target(a: dict[str, Any], x: np.ndarray) -> list[int]:
    """The spatial output a SAME ConvTranspose asks for: output_shape, else in * stride."""
    rank = x.ndim - 2
    shape = list(a.get("output_shape", []))
    if shape:
        return shape[-rank:]
    strides = a.get("strides", [1] * rank)
    return [x.shape[2 + i] * strides[i] for i in range(rank)]


def _mvn_axes(node: onnx.NodeProto, x: np.ndarray) -> tuple[int, ...]:
    """MVN's axes; the default (0, 2, 3) without those an input of lower rank lacks."""
    axes = attrs_of(node).get("axes", [0, 2, 3])
    return tuple(a % x.ndim for a in axes if -x.ndim <= a < x.ndim)


def _zero_variance(node: onnx.NodeProto, inputs: Inputs) -> bool:
    x = inputs[0]
    if x is None or x.dtype.kind != "f" or not x.size:
        return False
    wide = x.astype(np.float64)
    with np.errstate(all="ignore"):
        std = np.std(wide, axis=_mvn_axes(node, x))
        mean = np.mean(wide, axis=_mvn_axes(node, x))
    # where the 1e-9 shows, or where E[x^2] - E[x]^2 cancels most of its digits
    return bool(np.any(std < 1e-4) or np.any(std * std < 1e-2 * mean * mean))


def _mvn_by_formula(case: Case, got: list[Any] | str) -> bool:
    """nxrt's output is the spec's function body, ``(x - E[x]) / (sqrt(var) + 1e-9)``."""
    if isinstance(got, str):
        return False
    node = case.model.graph.node[0]
    x = next(iter(case.feeds.values())).astype(np.float64)
    axes = _mvn_axes(node, x)
    with np.errstate(all="ignore"):
        mean = np.mean(x, axis=axes, keepdims=True)
        square = np.mean(x * x, axis=axes, keepdims=True)
        var = square - mean * mean
        want = (x - mean) / (np.sqrt(np.maximum(var, 0)) + 1e-9)
    if not mismatch(got[0], want.astype(got[0].dtype), loose=4):
        return True
    # the body's E[x^2] - E[x]^2 in the input's type cancels to rounding noise where the
    # slice's variance is within a few roundings of E[x^2]: any summation order gives
    # another value there, so only the other slices must match the formula
    rounding = float(np.finfo(got[0].dtype).eps) if got[0].dtype.kind == "f" else 0.0
    noisy = np.broadcast_to(var <= 64 * rounding * np.abs(square), x.shape)
    if noisy.any() and not mismatch(
        np.where(noisy, 0, got[0]), np.where(noisy, 0, want).astype(got[0].dtype), loose=4
    ):
        return bool(np.isfinite(got[0][noisy]).all())
    return agrees_with_reference(case, got)


def _resize_reference(case: Case, got: list[Any] | str) -> bool:
    """onnx.reference agrees, once the case's negative ``axes`` (which it refuses) are
    written as positive ones."""
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    node = model.graph.node[0]
    rank = next(iter(case.feeds.values())).ndim
    for attr in node.attribute:
        if attr.name == "axes":
            attr.ints[:] = [a % rank for a in attr.ints]
    return agrees_with_reference(Case(model, case.feeds), got, slack=1)


def _log_sum_exp_of_integers(case: Case, got: list[Any] | str) -> bool:
    """nxrt's integer result is the spec's formula computed exactly and then truncated."""
    if isinstance(got, str):
        return False
    node = case.model.graph.node[0]
    x = next(iter(case.feeds.values()))
    a = attrs_of(node)
    axes = a.get("axes")
    if len(node.input) > 1 and node.input[1]:
        init = {t.name: onnx.numpy_helper.to_array(t) for t in case.model.graph.initializer}
        axes = (case.feeds | init)[node.input[1]].tolist()
    keep = bool(a.get("keepdims", 1))
    if not axes and a.get("noop_with_empty_axes", 0):
        return not mismatch(got[0], x)
    axis = tuple(axes) if axes else None
    wide = x.astype(np.float64)
    with np.errstate(all="ignore"):
        if node.op_type == "ReduceLogSum":
            want = np.log(np.sum(wide, axis=axis, keepdims=keep))
        elif wide.size == 0:
            want = np.log(np.sum(np.exp(wide), axis=axis, keepdims=keep))
        else:  # exactly, without exp overflowing: large integers have exp(x) = inf
            shift = np.max(wide, axis=axis, keepdims=True)
            want = np.log(np.sum(np.exp(wide - shift), axis=axis, keepdims=True)) + shift
            if not keep:
                want = want.reshape(np.sum(wide, axis=axis, keepdims=False).shape)
    return not mismatch(got[0], np.trunc(want).astype(x.dtype))


def _double_input(node: onnx.NodeProto, inputs: Inputs) -> bool:
    return bool(inputs) and inputs[0] is not None and inputs[0].dtype == np.float64


def _double_output(node: onnx.NodeProto, inputs: Inputs) -> bool:
    return attrs_of(node).get("output_datatype") == onnx.TensorProto.DOUBLE


def _single_point_axis(node: onnx.NodeProto, inputs: Inputs) -> bool:
    size = inputs[1] if len(inputs) > 1 else None
    return bool(attrs_of(node).get("align_corners")) and size is not None and 1 in size[2:]


def _integers(node: onnx.NodeProto, inputs: Inputs) -> bool:
    return bool(inputs) and inputs[0] is not None and inputs[0].dtype.kind in "iu"


NAN_MAX_MIN = ("ArgMax", "ArgMin")

#: Ops whose NaN and infinity handling nxrt takes from onnxruntime (the spec says nothing
#: of it): a disagreement over non-finite inputs is a failure, not a known difference.
FOLLOWS_ORT_ON_NAN = frozenset(
    "ReduceMax ReduceMin ArgMax ArgMin Hardmax MaxPool GlobalMaxPool TopK Max Min Clip "
    "ScatterND ScatterElements Less Greater LessOrEqual GreaterOrEqual Equal "
    "BatchNormalization".split()
)

#: Integer ops whose results can leave their type.
OVERFLOWING = (
    *"ReduceSum ReduceProd ReduceSumSquare ReduceL1 ReduceL2 ReduceMean".split(),
    *"CumSum CumProd MatMul Einsum Pow".split(),
)

KNOWN: list[KnownDifference] = [
    KnownDifference(
        "nan-in-max-min",
        NAN_MAX_MIN,
        "a NaN in ArgMax or ArgMin over a 1-D input: nxrt gives onnxruntime's index wherever "
        "its rule is known (the first element, then each strictly better one), but over a "
        "1-D input onnxruntime uses Eigen's vectorised maxCoeff(&index), which keeps a NaN "
        "that starts an SSE packet, and that is not replayed",
        _nan_in_one_d,
        _finite_twin_only,
    ),
    KnownDifference(
        "non-finite-arithmetic",
        (),  # every op not covered by nan-in-max-min
        "NaN or infinity in the inputs: nxrt evaluates the spec's formula in IEEE "
        "arithmetic, as onnx.reference does; onnxruntime regroups terms (inf - inf), skips "
        "zero-weight taps or clamps inside approximations (its tanh and sigmoid), so it "
        "reports a number where the formula gives NaN or an infinity, or the reverse",
        _non_finite,
        _non_finite_and_twin,
    ),
    KnownDifference(
        "non-finite-interpolation",
        ("Resize", "GridSample"),
        "NaN or infinity among the pixels a linear or cubic Resize or GridSample reads: the "
        "formula weights every tap, zero weights included, so 0 * inf makes NaN wherever an "
        "implementation reads such a tap; nxrt reads the spec's taps, onnxruntime and "
        "onnx.reference each read a different set (the reference also computes float16 in "
        "float32 and rounds infinities to 65504)",
        _non_finite,
        _finite_twin_only,
    ),
    KnownDifference(
        "non-finite-lrn-window",
        ("LRN",),
        "a NaN or infinity in LRN's channel window: nxrt sums each channel's own window "
        "(the spec's bounds, c - floor((size-1)/2) to c + ceil((size-1)/2)), so it reaches "
        "exactly the channels whose window holds it; onnxruntime's running sum carries it "
        "to later channels and onnx.reference's window misses a channel",
        _non_finite,
        _finite_twin_only,
    ),
    KnownDifference(
        "integer-overflow",
        OVERFLOWING,
        "an integer result that leaves its type: the spec does not define it; nxrt wraps "
        "around (two's complement, as numpy and onnx.reference), onnxruntime's reductions "
        "saturate or go through floating point",
        _integer_overflow,
        _undefined,
    ),
    KnownDifference(
        "wide-integer-precision",
        ("Einsum", "ReduceProd", "ReduceSum", "ReduceL1", "Shrink", "ReduceMean"),
        "integers too wide for a float: nxrt computes Einsum and the integer reductions "
        "exactly in the integer type, and Shrink in it too; onnxruntime goes through double "
        "(losing the low bits beyond 2**53) or, for Shrink, through float (beyond 2**24)",
        _wide_integers,
    ),
    KnownDifference(
        "resize-fractional-output-width",
        ("Resize",),
        "align_corners, tf_crop_and_resize and pytorch_half_pixel, or any coordinate mode in "
        "a linear Resize of a 3-D or 5-D input (onnxruntime's trilinear kernel), with a scale "
        "whose output width (scale * input length) is fractional: ONNX's node tests "
        "(test_resize_downsample_scales_linear_align_corners) and onnx.reference divide by "
        "that fractional width (the scale given); onnxruntime divides by the integer output "
        "length, and fails those node tests",
        _fractional_output_width,
        _resize_reference,
    ),
    KnownDifference(
        "log-sum-exp-of-integers",
        ("ReduceLogSumExp", "ReduceLogSum"),
        "integer ReduceLogSumExp / ReduceLogSum: nxrt computes the formula in float64 and "
        "truncates the result to the integer type; onnxruntime truncates each exp() to an "
        "integer on the way, so log(sum(exp(x))) comes out too small",
        _integers,
        _log_sum_exp_of_integers,
    ),
    KnownDifference(
        "shrink-float64-through-float",
        ("Shrink",),
        "a float64 Shrink: nxrt computes x - bias or x + bias in float64, as onnx.reference "
        "does; onnxruntime goes through float32, rounding every value to float32 and "
        "values beyond float32's range to infinity",
        _double_input,
    ),
    KnownDifference(
        "window-float64-precision",
        ("HannWindow", "HammingWindow", "BlackmanWindow"),
        "a float64 window: nxrt evaluates the formula in float64, as onnx.reference does; "
        "onnxruntime computes it with float32 constants, about 2e-8 off",
        _double_output,
    ),
    KnownDifference(
        "affine-grid-single-point",
        ("AffineGrid",),
        "align_corners=1 with a spatial size of 1: -1 and 1 both name the one pixel's "
        "centre; onnx.reference (and nxrt) put it at -1, onnxruntime at +1 (Eigen's "
        "LinSpaced of one value), PyTorch at 0",
        _single_point_axis,
    ),
    KnownDifference(
        "gridsample-cubic-padding",
        ("GridSample",),
        "cubic GridSample with border or reflection padding: the spec pads out-of-bound "
        "grid locations, so nxrt (as onnx.reference) moves the sampling location inside "
        "and interpolates there; onnxruntime, as PyTorch, interpolates at the original "
        "location and pads each of the 16 taps",
        _cubic_padded,
        _grid_sample_reference,
    ),
    KnownDifference(
        "normalization-rounding",
        NORMALIZATIONS,
        "a normalization whose slice is nearly constant divides by sqrt(variance + epsilon), "
        "amplifying every rounding error; nxrt agrees with onnx.reference computed in "
        "float64, and onnxruntime's float32 result is further from it",
        _floats,
        _closer_to_float64,
    ),
    KnownDifference(
        "resize-crop-unscaled-axis",
        ("Resize",),
        "tf_crop_and_resize with an axis that keeps its length but has a roi other than "
        "[0, 1]: the spec's formula crops that axis too (onnx.reference does); "
        "onnxruntime leaves axes of scale 1 untouched",
        _crop_on_unscaled_axis,
        _resize_reference,
    ),
    KnownDifference(
        "resize-negative-axes-aspect",
        ("Resize",),
        "keep_aspect_ratio_policy not_larger or not_smaller with negative axes: the spec "
        "counts a negative axis from the back, as everywhere; onnxruntime then leaves the "
        "axes out of the aspect ratio (even its own shape inference expects the spec's shape)",
        _negative_axes_with_policy,
        _resize_reference,
    ),
    KnownDifference(
        "resize-integers-in-float32",
        ("Resize",),
        "an integer Resize of values beyond 2**24, or of values outside [0, 255] with "
        "antialias or cubic weights: nxrt interpolates in float64 and saturates to the "
        "integer type; onnxruntime interpolates in float32 (losing the low bits) and its "
        "antialiased and cubic paths clamp to [0, 255] whatever the type (int8 -100 is 0)",
        _resize_integers_in_float32,
        _as_float64_resize,
    ),
    KnownDifference(
        "resize-extrapolation-cast",
        ("Resize",),
        "an integer tf_crop_and_resize whose extrapolation_value the type cannot hold "
        "(-1.5 for uint8): nxrt saturates it to the type's range, as onnx.reference does; "
        "onnxruntime casts it with C++ and wraps around (255)",
        _extrapolation_out_of_range,
        _resize_reference,
    ),
    KnownDifference(
        "resize-nearest-boundary",
        ("Resize",),
        "nearest Resize where a source coordinate falls (within 1e-5) exactly where its "
        "rounding flips: nxrt and onnx.reference compute coordinates in float64 and land "
        "on the exact value; onnxruntime's float32 lands just short and picks the pixel "
        "before",
        _nearest_near_boundary,
        _resize_reference,
    ),
    KnownDifference(
        "integer-interpolation-rounding",
        ("Resize", "GridSample"),
        "linear or cubic interpolation of integers: the interpolated value is cast back "
        "to the integer type (truncated, as onnxruntime does), and nxrt computes it in "
        "float64 where onnxruntime uses float32, so a value that is whole in one lands "
        "just below it in the other: the two differ by at most 1",
        _integer_interpolation,
        _within_one,
    ),
    KnownDifference(
        "slice-int32-max-backwards",
        ("Slice",),
        "int32 starts or ends of INT32_MAX or INT32_MIN with a negative step: the spec "
        "clamps them into the axis like any other value (onnx.reference does); "
        "onnxruntime reads them as 'to the far end' and keeps a different range",
        _int32_max_backwards,
    ),
    KnownDifference(
        "deprecated-op-version",
        ("GroupNormalization",),
        "GroupNormalization before opset 21: its opset-18 schema is deprecated and the ONNX "
        "checker refuses models that use it; nxrt checks every model and refuses them too, "
        "onnxruntime runs them",
        _any,
        _checker_refuses,
    ),
    KnownDifference(
        "loss-mean-of-nothing",
        ("NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"),
        "reduction 'mean' when no target counts (every one is ignore_index, or there are "
        "none): the spec's function divides a zero sum by a zero total weight, NaN, as "
        "onnx.reference gives; onnxruntime returns 0",
        _all_ignored,
    ),
    KnownDifference(
        "nonzero-of-scalar",
        ("NonZero",),
        'a scalar input: the spec says "for scalar input, NonZero produces output shape '
        "(0, N)\"; onnxruntime returns numpy's (1, N)",
        _scalar_input,
        _nonzero_of_scalar,
    ),
    KnownDifference(
        "maxpool-index-of-padding",
        ("MaxPool",),
        "a MaxPool window that holds padding alone (a dilated kernel over a tiny input): "
        "it has no element for the Indices output to point at; nxrt gives -1, "
        "onnxruntime another negative number (its offset into the padding)",
        _empty_window,
        _indices_of_empty_windows,
    ),
    KnownDifference(
        "maxunpool-output-shape",
        ("MaxUnpool",),
        "MaxUnpool given an output_shape larger than the inferred one: the indices address "
        "the inferred shape, which is then zero-padded (the spec's node test "
        "test_maxunpool_export_with_output_shape and onnx.reference); onnxruntime reads "
        "them as flat indices into output_shape, so the values land elsewhere",
        _unpool_shape_given,
    ),
    KnownDifference(
        "pool-window-past-input",
        ("MaxPool", "AveragePool", "LpPool"),
        "a window longer than the padded input: the spec's output size "
        "floor((in + pads - dilated kernel) / stride + 1) is 0; onnxruntime divides with "
        "C++ truncation toward zero and pools one partial window",
        _window_past_input,
        _pool_shape_by_formula,
    ),
    KnownDifference(
        "convtranspose-same-negative-padding",
        ("ConvTranspose",),
        "SAME auto_pad with a kernel smaller than its stride: the spec's output shape is "
        "input * stride, so the total padding is negative and the output is zero-extended "
        "(onnx.reference does this); onnxruntime clamps the padding to 0 and returns the "
        "smaller full result",
        _same_padding_negative,
        _convtranspose_zero_extended,
    ),
    KnownDifference(
        "mvn-zero-variance",
        ("MeanVarianceNormalization",),
        "a constant or nearly constant slice: the spec's function divides by "
        "sqrt(variance) + 1e-9 (0 for a constant slice), with the variance as "
        "E[x^2] - E[x]^2, which cancels to rounding noise when the slice's spread is small "
        "next to its mean; onnxruntime divides by sqrt(variance) alone (NaN for a constant "
        "slice) and computes the variance another way",
        _zero_variance,
        _mvn_by_formula,
    ),
    KnownDifference(
        "same-negative-padding",
        ("MaxPool", "AveragePool", "LpPool", "Conv", "ConvInteger", "QLinearConv"),
        "SAME auto_pad with a kernel shorter than its stride: the spec pads the input so "
        "that there are ceil(in / stride) windows, and a padding is never negative, so the "
        "windows start at the input's first element; onnxruntime's pools take the negative "
        "total and crop the input's start by it (its float32 MaxPool refuses instead), and "
        "so do its convolutions with SAME_UPPER once the total is -2 or less",
        _same_negative,
        _explicit_pads_reference,
    ),
    KnownDifference(
        "pool-same-dilated",
        ("MaxPool", "AveragePool", "LpPool"),
        "SAME auto_pad with dilations: the spec pads so that there are ceil(in / stride) "
        "windows of the dilated kernel; onnxruntime computes the padding for the undilated "
        "kernel and returns fewer windows (often none)",
        _same_dilated,
        _same_output_shape,
    ),
]


def known_difference(case: Case, got: list[Any] | str) -> str:
    """The id and explanation of the entry that covers this one-node case ('' if none)."""
    nodes = list(case.model.graph.node)
    if len(nodes) != 1:
        return ""
    node = nodes[0]
    init = {t.name: onnx.numpy_helper.to_array(t) for t in case.model.graph.initializer}
    inputs = [case.feeds.get(n, init.get(n)) if n else None for n in node.input]
    for entry in KNOWN:
        covers = node.op_type in entry.ops if entry.ops else node.op_type not in NAN_MAX_MIN
        if covers and entry.situation(node, inputs) and entry.confirm(case, got):
            return f"{entry.id}: {entry.explanation}"
    return ""

"""The cpu EP's kernels, one ONNX node at a time, against ONNX Runtime.

Every case builds a one-node model with ``onnx.helper`` (random inputs as
graph inputs, random weights as initializers), runs it through
``nxrt.InferenceSession`` pinned to the cpu EP and through ONNX Runtime's CPU
provider, and compares every output: dtype, shape and values.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

import nxrt

RTOL, ATOL = 1e-4, 1e-5
INT64_MAX = np.iinfo(np.int64).max


# --- harness -----------------------------------------------------------------------------


def make_model(
    op_type: str,
    inputs: dict[str, np.ndarray | None],
    *,
    opset: int,
    weights: tuple[str, ...] = (),
    outputs: int = 1,
    **attrs: Any,
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A one-node model and its feeds.

    ``inputs`` lists the node's inputs in order; ``None`` leaves an optional
    input out, names in ``weights`` become initializers, the rest graph inputs.
    """
    names = [name if value is not None else "" for name, value in inputs.items()]
    while names and names[-1] == "":
        names.pop()
    out_names = [f"out{i}" for i in range(outputs)]
    node = helper.make_node(op_type, names, out_names, **attrs)
    graph_inputs, initializers, feeds = [], [], {}
    for name, value in inputs.items():
        if value is None:
            continue
        if name in weights:
            initializers.append(onnx.numpy_helper.from_array(value, name))
        else:
            elem = helper.np_dtype_to_tensor_dtype(value.dtype)
            graph_inputs.append(helper.make_tensor_value_info(name, elem, value.shape))
            feeds[name] = value
    graph_outputs = [helper.make_value_info(name, onnx.TypeProto()) for name in out_names]
    graph = helper.make_graph([node], op_type.lower(), graph_inputs, graph_outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model, feeds


def run_both(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> tuple[list, list]:
    """Outputs of nxrt's cpu EP and of ONNX Runtime for the same model and feeds.

    ONNX Runtime runs first; its results declare the graph outputs' types and
    shapes, which the ONNX checker in nxrt requires.
    """
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, feeds)
    declared = onnx.ModelProto()
    declared.CopyFrom(model)
    for info, value in zip(declared.graph.output, expected, strict=True):
        elem = helper.np_dtype_to_tensor_dtype(value.dtype)
        info.CopyFrom(helper.make_tensor_value_info(info.name, elem, value.shape))
    got = nxrt.InferenceSession(declared.SerializeToString(), providers=["cpu"]).run(None, feeds)
    return got, expected


def check(op_type: str, inputs: dict[str, np.ndarray | None], **kwargs: Any) -> list:
    """Run one node both ways and assert that every output matches."""
    model, feeds = make_model(op_type, inputs, **kwargs)
    got, expected = run_both(model, feeds)
    assert len(got) == len(expected)
    for index, (a, b) in enumerate(zip(got, expected, strict=True)):
        a = np.asarray(a)
        assert a.dtype == b.dtype, f"output {index}: dtype {a.dtype}, expected {b.dtype}"
        assert a.shape == b.shape, f"output {index}: shape {a.shape}, expected {b.shape}"
        if b.dtype == object or b.dtype == bool or np.issubdtype(b.dtype, np.integer):
            np.testing.assert_array_equal(a, b, err_msg=f"output {index}")
        else:
            np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL, err_msg=f"output {index}")
    return got


def rand(*shape: int, seed: int = 0, dtype: type = np.float32, low=-1.0, high=1.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if np.issubdtype(dtype, np.integer):
        return rng.integers(int(low), int(high), size=shape).astype(dtype)
    return rng.uniform(low, high, size=shape).astype(dtype)


def cases(valid: Callable[..., bool], *axes: Iterable) -> list[tuple]:
    """The product of ``axes`` less the combinations ``valid`` rejects.

    For parameters whose valid values depend on each other (mostly: on the opset), so that
    a combination the spec does not have is never generated, rather than generated and skipped.
    """
    return [combo for combo in itertools.product(*axes) if valid(*combo)]


def negative_axes_ok(opset: int, axes: int | list[int] | None) -> bool:
    """Negative axes start at opset 11."""
    if axes is None:
        return True
    return opset >= 11 or min(np.atleast_1d(axes)) >= 0


def kernel(op_type: str, opset: int):
    from nxrt_ep_cpu.ops import CPU_OPS

    entry = CPU_OPS.lookup("", op_type, opset)
    assert entry is not None, f"no kernel for {op_type} at opset {opset}"
    return entry


# --- element-wise --------------------------------------------------------------------------

BROADCASTS = [((3, 4), (3, 4)), ((2, 3, 4), (4,)), ((2, 1, 4), (3, 1)), ((5,), ())]


@pytest.mark.parametrize("op_type", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("opset", [7, 13, 14])
@pytest.mark.parametrize("shapes", BROADCASTS)
def test_binary_arithmetic(op_type, opset, shapes):
    a = rand(*shapes[0], seed=1)
    b = rand(*shapes[1], seed=2, low=0.5, high=2.0)
    check(op_type, {"a": a, "b": b}, opset=opset)


@pytest.mark.parametrize("op_type", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_binary_arithmetic_integers(op_type, dtype):
    a = rand(4, 5, seed=1, dtype=dtype, low=-50, high=50)
    b = rand(4, 5, seed=2, dtype=dtype, low=1, high=7) * np.where(rand(4, 5, seed=3) > 0, 1, -1)
    check(op_type, {"a": a, "b": b.astype(dtype)}, opset=14)


@pytest.mark.parametrize(
    "opset, exponent",
    cases(
        # mixed exponent dtypes start at opset 12
        lambda opset, exponent: opset >= 12 or exponent in ("float", "broadcast"),
        [7, 12, 13, 15],
        ["float", "broadcast", "int64", "int32"],
    ),
)
def test_pow(opset, exponent):
    x = rand(3, 4, seed=1, low=0.1, high=3.0)
    if exponent == "float":
        y = rand(3, 4, seed=2, low=-2, high=2)
    elif exponent == "broadcast":
        y = rand(4, seed=2, low=-2, high=2)
    else:
        y = rand(3, 4, seed=2, dtype=np.dtype(exponent).type, low=-2, high=4)
    check("Pow", {"x": x, "y": y}, opset=opset)


@pytest.mark.parametrize("op_type", ["Sum", "Max", "Min", "Mean"])
@pytest.mark.parametrize("opset", [6, 8, 13])
@pytest.mark.parametrize("shapes", [[(3, 4)], [(3, 4), (3, 4)], [(3, 4), (3, 4), (3, 4)]])
def test_variadic(op_type, opset, shapes):
    inputs = {f"x{i}": rand(*s, seed=i) for i, s in enumerate(shapes)}
    check(op_type, inputs, opset=opset)


@pytest.mark.parametrize("op_type", ["Sum", "Max", "Min", "Mean"])
@pytest.mark.parametrize("shapes", [[(2, 1, 4), (3, 1)], [(4,), (2, 3, 4), (3, 1)]])
def test_variadic_broadcast(op_type, shapes):
    inputs = {f"x{i}": rand(*s, seed=i) for i, s in enumerate(shapes)}
    check(op_type, inputs, opset=13)


UNARY = {
    "Relu": (-1.0, 1.0),
    "Sigmoid": (-100.0, 100.0),
    "Tanh": (-5.0, 5.0),
    "Exp": (-5.0, 5.0),
    "Log": (0.01, 10.0),
    "Sqrt": (0.0, 10.0),
    "Neg": (-1.0, 1.0),
    "Abs": (-1.0, 1.0),
    "Identity": (-1.0, 1.0),
}


@pytest.mark.parametrize("op_type", sorted(UNARY))
@pytest.mark.parametrize("opset", [6, 13, 14])
def test_unary(op_type, opset):
    if op_type == "Identity" and opset == 6:
        opset = 1
    low, high = UNARY[op_type]
    check(op_type, {"x": rand(2, 3, 8, seed=4, low=low, high=high)}, opset=opset)


@pytest.mark.parametrize("op_type", ["Relu", "Neg", "Abs"])
def test_unary_integers(op_type):
    check(op_type, {"x": rand(3, 5, dtype=np.int32, low=-9, high=9)}, opset=14)


@pytest.mark.parametrize("opset", [6, 16])
@pytest.mark.parametrize("alpha", [None, 0.2, 3.0])
def test_leaky_relu(opset, alpha):
    attrs = {} if alpha is None else {"alpha": alpha}
    check("LeakyRelu", {"x": rand(4, 6, seed=5)}, opset=opset, **attrs)


@pytest.mark.parametrize("attrs", [{}, {"min": -0.2}, {"max": 0.3}, {"min": -0.5, "max": 0.25}])
def test_clip_6(attrs):
    check("Clip", {"x": rand(4, 6, seed=6)}, opset=6, **attrs)


@pytest.mark.parametrize("opset", [11, 12, 13])
@pytest.mark.parametrize("bounds", [(None, None), (-0.2, None), (None, 0.3), (-0.5, 0.25)])
def test_clip(opset, bounds):
    lo, hi = (None if b is None else np.array(b, dtype=np.float32) for b in bounds)
    check("Clip", {"x": rand(4, 6, seed=6), "min": lo, "max": hi}, opset=opset)


def test_clip_integers():
    x = rand(4, 6, dtype=np.int32, low=-20, high=20)
    lo, hi = np.array(-5, dtype=np.int32), np.array(7, dtype=np.int32)
    check("Clip", {"x": x, "min": lo, "max": hi}, opset=13)


@pytest.mark.parametrize("opset", [7, 10, 12, 13])
@pytest.mark.parametrize("outputs", [1, 2])
def test_dropout(opset, outputs):
    if opset < 12 and outputs == 2:
        # Before opset 12 the spec leaves the inference mask unfilled and ONNX Runtime
        # returns zeros (False); nxrt returns ones (nothing dropped), as from opset 12 on.
        model, feeds = make_model("Dropout", {"x": rand(3, 5)}, opset=opset, outputs=2)
        got, expected = run_both(model, feeds)
        np.testing.assert_array_equal(got[0], expected[0])
        assert got[1].dtype == expected[1].dtype and got[1].all()
        return
    check("Dropout", {"x": rand(3, 5)}, opset=opset, outputs=outputs)


@pytest.mark.parametrize("opset", [12, 13])
def test_dropout_inputs(opset):
    inputs = {"x": rand(3, 5), "ratio": np.array(0.3, np.float32), "training": np.array(False)}
    check("Dropout", inputs, opset=opset, outputs=2, seed=3)


def test_dropout_training_scales_the_kept_elements():
    x = rand(40, 50)
    inputs = {"x": x, "ratio": np.array(0.3, np.float32), "training": np.array(True)}
    model, feeds = make_model("Dropout", inputs, opset=13, outputs=2)
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("out0", 1, [40, 50]))
    model.graph.output[1].CopyFrom(helper.make_tensor_value_info("out1", 9, [40, 50]))
    session = nxrt.InferenceSession(model.SerializeToString(), providers=["cpu"])
    y, mask = session.run(None, feeds)
    assert mask.dtype == bool and 0.6 < mask.mean() < 0.8  # about 1 - ratio kept
    np.testing.assert_allclose(y, np.where(mask, x / 0.7, 0), rtol=1e-6)


# --- nn ------------------------------------------------------------------------------------


def batch_norm_inputs(shape, seed=0, stats_shape=None):
    c = shape[1]
    stats_shape = stats_shape or (c,)
    return {
        "x": rand(*shape, seed=seed, low=-3, high=3),
        "scale": rand(*stats_shape, seed=seed + 1, low=0.5, high=1.5),
        "b": rand(*stats_shape, seed=seed + 2),
        "mean": rand(*stats_shape, seed=seed + 3),
        "var": rand(*stats_shape, seed=seed + 4, low=0.1, high=2.0),
    }


@pytest.mark.parametrize("opset", [7, 9, 14, 15])
@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 5), (2, 4, 5, 6), (1, 3, 2, 3, 4)])
@pytest.mark.parametrize("epsilon", [None, 1e-3])
def test_batch_normalization(opset, shape, epsilon):
    attrs = {} if epsilon is None else {"epsilon": epsilon}
    inputs = batch_norm_inputs(shape)
    check("BatchNormalization", inputs, opset=opset, weights=tuple(inputs)[1:], **attrs)


def test_batch_normalization_per_activation():
    inputs = batch_norm_inputs((2, 3, 4, 5), stats_shape=(3, 4, 5))
    check("BatchNormalization", inputs, opset=7, weights=tuple(inputs)[1:], spatial=0)


@pytest.mark.parametrize("opset", [1, 13])
@pytest.mark.parametrize("size", [1, 3, 5])  # ONNX Runtime refuses even sizes
@pytest.mark.parametrize("attrs", [{}, {"alpha": 1e-2, "beta": 0.5, "bias": 2.0}])
def test_lrn(opset, size, attrs):
    check(
        "LRN", {"x": rand(2, 7, 5, 5, seed=size, low=-3, high=3)}, opset=opset, size=size, **attrs
    )


@pytest.mark.parametrize("op_type", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("opset", [9, 11, 13])
@pytest.mark.parametrize("axis", [None, 0, 1, 2, 3, -1, -3])
def test_softmax(op_type, opset, axis):
    attrs = {} if axis is None else {"axis": axis}
    check(op_type, {"x": rand(2, 3, 4, 5, seed=7, low=-10, high=10)}, opset=opset, **attrs)


@pytest.mark.parametrize("op_type", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("opset", [9, 13])
def test_softmax_2d(op_type, opset):
    check(op_type, {"x": rand(4, 10, seed=8, low=-50, high=50)}, opset=opset)


GEMM_C_SHAPES = [None, (4, 5), (5,), (1, 5), (4, 1), (1, 1), ()]


@pytest.mark.parametrize(
    "opset, c_shape",
    # C is optional from opset 11
    cases(lambda opset, c_shape: opset >= 11 or c_shape is not None, [7, 9, 11, 13], GEMM_C_SHAPES),
)
@pytest.mark.parametrize("trans", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("scales", [(1.0, 1.0), (0.5, 2.0), (1.5, 0.0)])
def test_gemm(opset, trans, c_shape, scales):
    m, k, n = 4, 6, 5
    a = rand(*((k, m) if trans[0] else (m, k)), seed=1)
    b = rand(*((n, k) if trans[1] else (k, n)), seed=2)
    c = None if c_shape is None else rand(*c_shape, seed=3)
    attrs = {"transA": trans[0], "transB": trans[1], "alpha": scales[0], "beta": scales[1]}
    check("Gemm", {"a": a, "b": b, "c": c}, opset=opset, weights=("b", "c"), **attrs)


def test_gemm_defaults():
    check("Gemm", {"a": rand(3, 4, seed=1), "b": rand(4, 2, seed=2)}, opset=13)


@pytest.mark.parametrize("opset", [1, 9, 13])
@pytest.mark.parametrize(
    "shapes",
    [
        ((3, 4), (4, 5)),
        ((2, 3, 4), (4, 5)),
        ((2, 3, 4), (2, 4, 5)),
        ((2, 1, 3, 4), (5, 4, 2)),
        ((4,), (4, 5)),
        ((3, 4), (4,)),
        ((4,), (4,)),
    ],
)
def test_mat_mul(opset, shapes):
    check("MatMul", {"a": rand(*shapes[0], seed=1), "b": rand(*shapes[1], seed=2)}, opset=opset)


@pytest.mark.parametrize(
    "opset, axis", cases(negative_axes_ok, [1, 9, 11, 13, 21], [None, 0, 1, 2, 4, -1, -3])
)
def test_flatten(opset, axis):
    attrs = {} if axis is None else {"axis": axis}
    check("Flatten", {"x": rand(2, 3, 4, 5)}, opset=opset, **attrs)


# --- conv ----------------------------------------------------------------------------------

CONV_CASES = {
    "3x3": dict(x=(1, 3, 7, 7), w=(4, 3, 3, 3)),
    "pad1-stride2": dict(x=(2, 3, 9, 8), w=(5, 3, 3, 3), pads=[1, 1, 1, 1], strides=[2, 2]),
    "asym-pads": dict(x=(1, 2, 6, 7), w=(3, 2, 3, 2), pads=[0, 1, 2, 1]),
    "dilation": dict(x=(1, 3, 10, 9), w=(4, 3, 3, 3), dilations=[2, 3], pads=[2, 1, 2, 3]),
    "stride-dilation": dict(x=(1, 2, 11, 11), w=(2, 2, 3, 3), dilations=[2, 2], strides=[3, 2]),
    "group2": dict(x=(2, 4, 6, 6), w=(6, 2, 3, 3), group=2, pads=[1, 1, 1, 1]),
    "group3-strided": dict(x=(1, 6, 9, 9), w=(3, 2, 3, 3), group=3, strides=[2, 2]),
    "depthwise": dict(x=(2, 4, 8, 8), w=(4, 1, 3, 3), group=4, pads=[1, 1, 1, 1]),
    "depthwise-stride": dict(x=(1, 5, 9, 9), w=(5, 1, 5, 5), group=5, strides=[2, 2], pads=[2] * 4),
    "depthwise-x2": dict(x=(1, 3, 6, 6), w=(6, 1, 3, 3), group=3),
    "1x1": dict(x=(2, 8, 5, 5), w=(4, 8, 1, 1)),
    "1x1-stride2": dict(x=(1, 8, 7, 7), w=(4, 8, 1, 1), strides=[2, 2]),
    "1x1-group": dict(x=(1, 8, 5, 5), w=(6, 4, 1, 1), group=2),
    "1x1-pad": dict(x=(1, 3, 4, 4), w=(2, 3, 1, 1), pads=[1, 0, 1, 2]),
    "stem-7x7": dict(x=(1, 3, 32, 32), w=(8, 3, 7, 7), strides=[2, 2], pads=[3, 3, 3, 3]),
    "kernel_shape": dict(x=(1, 2, 6, 6), w=(3, 2, 3, 2), kernel_shape=[3, 2]),
    "same-upper": dict(x=(1, 2, 7, 8), w=(3, 2, 3, 3), auto_pad="SAME_UPPER", strides=[2, 2]),
    "same-lower": dict(x=(1, 2, 7, 8), w=(3, 2, 4, 4), auto_pad="SAME_LOWER", strides=[2, 3]),
    "same-upper-even": dict(x=(1, 2, 8, 8), w=(3, 2, 2, 2), auto_pad="SAME_UPPER"),
    "same-lower-even": dict(x=(1, 2, 8, 8), w=(3, 2, 2, 2), auto_pad="SAME_LOWER"),
    "same-k1-s3": dict(x=(1, 2, 8, 7), w=(3, 2, 1, 1), auto_pad="SAME_UPPER", strides=[3, 3]),
    "same-k2-s3": dict(x=(1, 2, 8, 7), w=(3, 2, 2, 2), auto_pad="SAME_LOWER", strides=[3, 3]),
    "valid": dict(x=(1, 2, 9, 8), w=(3, 2, 3, 3), auto_pad="VALID", strides=[2, 2]),
    "1d": dict(x=(2, 3, 11), w=(4, 3, 3), pads=[1, 2], strides=[2]),
    "1d-dilated": dict(x=(1, 2, 12), w=(3, 2, 3), dilations=[3]),
    "1d-depthwise": dict(x=(1, 4, 10), w=(4, 1, 3), group=4, pads=[1, 1]),
    "3d": dict(x=(1, 2, 5, 6, 7), w=(3, 2, 3, 3, 3), pads=[1, 0, 1, 1, 1, 0], strides=[1, 2, 2]),
    "3d-1x1": dict(x=(1, 4, 3, 4, 5), w=(2, 4, 1, 1, 1)),
    "3d-depthwise": dict(x=(1, 3, 4, 5, 6), w=(3, 1, 2, 3, 3), group=3),
}


@pytest.mark.parametrize("case", sorted(CONV_CASES))
@pytest.mark.parametrize("bias", [True, False])
def test_conv(case, bias):
    attrs = dict(CONV_CASES[case])
    x, w = rand(*attrs.pop("x"), seed=1), rand(*attrs.pop("w"), seed=2)
    b = rand(w.shape[0], seed=3) if bias else None
    check("Conv", {"x": x, "w": w, "b": b}, opset=11, weights=("w", "b"), **attrs)


@pytest.mark.parametrize("opset", [1, 11, 22])
def test_conv_opsets(opset):
    x, w, b = rand(1, 4, 6, 6, seed=1), rand(6, 2, 3, 3, seed=2), rand(6, seed=3)
    attrs = dict(group=2, pads=[1, 0, 1, 0], strides=[1, 2])
    check("Conv", {"x": x, "w": w, "b": b}, opset=opset, weights=("w", "b"), **attrs)


def test_conv_weights_as_inputs():
    x, w, b = rand(2, 3, 5, 5, seed=1), rand(4, 3, 3, 3, seed=2), rand(4, seed=3)
    check("Conv", {"x": x, "w": w, "b": b}, opset=11, pads=[1, 1, 1, 1])


#: One shape per Conv variant the cpu EP picks (see nxrt_ep_cpu/ops/_conv_gemm.py).
CONV_VARIANTS = {
    "pointwise": dict(x=(2, 8, 6, 5), w=(5, 8, 1, 1), strides=[2, 1]),
    "pointwise-tiled": dict(x=(2, 8, 6, 7), w=(5, 8, 1, 1), strides=[2, 1]),
    "taps": dict(x=(1, 48, 20, 48), w=(16, 48, 3, 3), pads=[1, 1, 1, 1]),
    "grouped taps": dict(x=(1, 96, 10, 24), w=(8, 48, 3, 3), group=2, pads=[1, 1, 1, 1]),
    "strided taps": dict(x=(1, 48, 30, 40), w=(4, 48, 5, 5), strides=[2, 2], pads=[2] * 4),
    "im2col": dict(x=(2, 4, 6, 6), w=(6, 4, 3, 3), pads=[1, 0, 1, 2], strides=[1, 2]),
    "dilated im2col": dict(x=(1, 12, 6, 6), w=(6, 12, 3, 3), pads=[2] * 4, dilations=[2, 2]),
    "im2col-tiled": dict(x=(1, 24, 9, 7), w=(10, 24, 3, 3), pads=[1] * 4),
    "dilated im2col-tiled": dict(x=(1, 24, 6, 6), w=(6, 24, 3, 3), pads=[2] * 4, dilations=[2, 2]),
    "grouped im2col": dict(x=(1, 48, 6, 6), w=(8, 24, 3, 3), group=2, pads=[1] * 4),
    "strided im2col": dict(x=(1, 3, 20, 40), w=(4, 3, 4, 4), strides=[4, 3]),
    "patches": dict(x=(1, 3, 20, 40), w=(4, 3, 4, 4), strides=[4, 4]),
    "dilated direct": dict(x=(1, 4, 6, 30), w=(6, 4, 3, 3), pads=[1] * 4, dilations=[2, 1]),
    "grouped direct": dict(x=(1, 8, 10, 24), w=(8, 2, 3, 3), group=4, pads=[1, 1, 1, 1]),
    "strided direct": dict(x=(1, 3, 20, 40), w=(4, 3, 5, 5), strides=[2, 2], pads=[2] * 4),
    "depthwise": dict(x=(1, 6, 9, 9), w=(6, 1, 3, 3), group=6, strides=[2, 2], pads=[1] * 4),
    "generic": dict(x=(1, 2, 5, 6, 7), w=(3, 2, 3, 3, 3), pads=[1, 0, 1, 1, 1, 0]),
}


@pytest.mark.parametrize("case", sorted(CONV_VARIANTS))
def test_conv_variants_are_chosen_by_shape_and_recorded(case):
    attrs = dict(CONV_VARIANTS[case])
    x, w = rand(*attrs.pop("x"), seed=1), rand(*attrs.pop("w"), seed=2)
    b = rand(w.shape[0], seed=3)
    model, feeds = make_model(
        "Conv", {"x": x, "w": w, "b": b}, opset=11, weights=("w", "b"), **attrs
    )
    got, expected = run_both(model, feeds)
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-4, atol=1e-4)
    declared = onnx.shape_inference.infer_shapes(model)
    session = nxrt.InferenceSession(declared.SerializeToString(), providers=["cpu"])
    (step,) = session._plan.steps
    assert step.kernel.variant == case.split()[-1]  # chosen at creation from inferred shapes
    assert step.kernel.variant_reason


def test_conv_split_across_the_pool_matches_one_thread():
    from nxrt.host_parallel import HostParallel
    from nxrt_ep_cpu.ops.conv import ConvKernel

    x, w, b = rand(1, 64, 30, 30, seed=1), rand(64, 1, 3, 3, seed=2), rand(64, seed=3)
    attrs = {"group": 64, "pads": [1, 1, 1, 1]}
    with HostParallel(2) as pool:
        split = ConvKernel(attrs, parallel=pool, activation="Relu").run(x, w, b)
    single = ConvKernel(attrs, activation="Relu").run(x, w, b)
    np.testing.assert_allclose(split, single, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    ("activation", "params", "reference"),
    [
        ("Relu", [], lambda y: np.maximum(y, 0)),
        ("Clip", [0.0, 0.5], lambda y: np.clip(y, 0, 0.5)),
        ("LeakyRelu", [0.1], lambda y: np.where(y < 0, 0.1 * y, y)),
        ("Sigmoid", [], lambda y: 1 / (1 + np.exp(-y))),
        ("Tanh", [], np.tanh),
    ],
)
def test_fused_conv_applies_residual_and_activation(activation, params, reference):
    from nxrt_ep_cpu.ops.conv import conv, fused_conv

    x, w, b = rand(1, 3, 7, 7, seed=1), rand(4, 3, 3, 3, seed=2), rand(4, seed=3)
    z = rand(1, 4, 7, 7, seed=4)
    got = fused_conv(x, w, b, z, activation=activation, activation_params=params, pads=[1] * 4)
    want = reference(conv(x, w, b, pads=[1] * 4) + z)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_fused_mat_mul_and_exact_gelu():
    import math

    from nxrt_ep_cpu.ops.elementwise import gelu_inplace
    from nxrt_ep_cpu.ops.nn import fused_mat_mul

    a, b, bias = rand(2, 5, 8, seed=1, low=-3, high=3), rand(8, 300, seed=2), rand(300, seed=3)
    pre = a @ b + bias
    erf = np.vectorize(math.erf)
    want = pre * 0.5 * (1 + erf(pre.astype(np.float64) / math.sqrt(2)))
    got = fused_mat_mul(a, b, bias, activation="Gelu")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)
    wide = pre.astype(np.float64)
    gelu_inplace(wide)  # float64 takes the accurate erf
    np.testing.assert_allclose(wide, want, rtol=1e-12, atol=1e-12)


def test_relu_uses_shared_read_only_zeros():
    from nxrt_ep_cpu.ops.elementwise import relu, zeros

    x = rand(3, 5, seed=1)
    np.testing.assert_array_equal(relu(x), np.maximum(x, 0))
    assert not zeros((2, 3), np.float32).flags.writeable
    assert relu(np.array([-1, 2], np.int32)).tolist() == [0, 2]


# --- pooling -------------------------------------------------------------------------------

POOL_CASES = {
    "k2s2": dict(x=(1, 2, 8, 8), kernel_shape=[2, 2], strides=[2, 2]),
    "k3s2p1": dict(x=(2, 3, 9, 10), kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
    "k3s1": dict(x=(1, 2, 6, 7), kernel_shape=[3, 3]),
    "asym-pads": dict(x=(1, 2, 7, 6), kernel_shape=[3, 2], pads=[1, 0, 2, 1], strides=[2, 1]),
    "rect": dict(x=(1, 3, 9, 7), kernel_shape=[2, 3], strides=[3, 2]),
    "same-upper": dict(x=(1, 2, 7, 8), kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER"),
    "same-lower": dict(x=(1, 2, 7, 8), kernel_shape=[2, 2], strides=[2, 2], auto_pad="SAME_LOWER"),
    "same-s1": dict(x=(1, 2, 6, 6), kernel_shape=[4, 3], auto_pad="SAME_UPPER"),
    "valid": dict(x=(1, 2, 9, 8), kernel_shape=[3, 3], strides=[2, 2], auto_pad="VALID"),
    "same-k2-s3": dict(x=(1, 2, 8, 7), kernel_shape=[2, 2], strides=[3, 3], auto_pad="SAME_LOWER"),
    "1d": dict(x=(2, 3, 11), kernel_shape=[3], strides=[2], pads=[1, 1]),
    "3d": dict(
        x=(1, 2, 5, 6, 7), kernel_shape=[2, 3, 2], strides=[2, 2, 1], pads=[0, 1, 1, 1, 1, 0]
    ),
}
CEIL_CASES = {
    "ceil": dict(x=(1, 2, 8, 8), kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
    "ceil-pads": dict(
        x=(1, 2, 9, 7), kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4, ceil_mode=1
    ),
    "ceil-drop": dict(
        x=(1, 1, 4, 5), kernel_shape=[2, 2], strides=[2, 2], pads=[0, 0, 1, 1], ceil_mode=1
    ),
    "ceil-k3s3": dict(x=(1, 2, 10, 11), kernel_shape=[3, 3], strides=[3, 3], ceil_mode=1),
    "ceil-1d": dict(x=(1, 2, 10), kernel_shape=[4], strides=[3], pads=[1, 2], ceil_mode=1),
}
DILATED_CASES = {
    "dilated": dict(x=(1, 2, 10, 9), kernel_shape=[3, 2], dilations=[2, 3]),
    "dilated-pads": dict(x=(1, 2, 9, 9), kernel_shape=[2, 2], dilations=[2, 2], pads=[1] * 4),
    "dilated-ceil": dict(
        x=(1, 2, 10, 10), kernel_shape=[3, 3], dilations=[2, 2], strides=[2, 2], ceil_mode=1
    ),
}


def pool_case(cases: dict, name: str, seed: int = 0) -> tuple[np.ndarray, dict]:
    attrs = dict(cases[name])
    return rand(*attrs.pop("x"), seed=seed, low=-5, high=5), attrs


@pytest.mark.parametrize("case", sorted(POOL_CASES))
@pytest.mark.parametrize("opset", [1, 8, 10, 11, 12, 22])
def test_max_pool(case, opset):
    x, attrs = pool_case(POOL_CASES, case)
    check("MaxPool", {"x": x}, opset=opset, **attrs)


@pytest.mark.parametrize("case", sorted(POOL_CASES) + sorted(CEIL_CASES) + sorted(DILATED_CASES))
@pytest.mark.parametrize("storage_order", [0, 1])
def test_max_pool_indices(case, storage_order):
    cases = {**POOL_CASES, **CEIL_CASES, **DILATED_CASES}
    x, attrs = pool_case(cases, case)
    opset = 8 if case in POOL_CASES else 12
    check("MaxPool", {"x": x}, opset=opset, outputs=2, storage_order=storage_order, **attrs)


def test_max_pool_indices_batch():
    x, attrs = pool_case(POOL_CASES, "k3s2p1")
    check("MaxPool", {"x": x}, opset=12, outputs=2, **attrs)


@pytest.mark.parametrize("case", sorted(CEIL_CASES) + sorted(DILATED_CASES))
@pytest.mark.parametrize("opset", [10, 11, 12, 22])
def test_max_pool_ceil_dilations(case, opset):
    x, attrs = pool_case({**CEIL_CASES, **DILATED_CASES}, case)
    check("MaxPool", {"x": x}, opset=opset, **attrs)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_max_pool_integers(dtype):
    x = rand(1, 2, 7, 7, dtype=dtype, low=0 if dtype == np.uint8 else -100, high=100)
    check("MaxPool", {"x": x}, opset=12, kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4)


@pytest.mark.parametrize("case", sorted(POOL_CASES))
@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("opset", [7, 10, 11, 19, 22])
def test_average_pool(case, count_include_pad, opset):
    x, attrs = pool_case(POOL_CASES, case)
    check("AveragePool", {"x": x}, opset=opset, count_include_pad=count_include_pad, **attrs)


@pytest.mark.parametrize("case", sorted(POOL_CASES))
def test_average_pool_1(case):
    # ONNX Runtime has no AveragePool(1); opset 7 with its default count_include_pad=0
    # computes the same thing.
    x, attrs = pool_case(POOL_CASES, case)
    model_7, feeds = make_model("AveragePool", {"x": x}, opset=7, **attrs)
    _, expected = run_both(model_7, feeds)
    model_1, _ = make_model("AveragePool", {"x": x}, opset=1, **attrs)
    model_1.graph.output[0].CopyFrom(helper.make_tensor_value_info("out0", 1, expected[0].shape))
    got = nxrt.InferenceSession(model_1.SerializeToString(), providers=["cpu"]).run(None, feeds)
    np.testing.assert_allclose(got[0], expected[0], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("case", sorted(CEIL_CASES))
@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("opset", [10, 11, 19])
def test_average_pool_ceil(case, count_include_pad, opset):
    x, attrs = pool_case(CEIL_CASES, case)
    check("AveragePool", {"x": x}, opset=opset, count_include_pad=count_include_pad, **attrs)


@pytest.mark.parametrize("case", sorted(DILATED_CASES))
@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_average_pool_dilations(case, count_include_pad):
    x, attrs = pool_case(DILATED_CASES, case)
    check("AveragePool", {"x": x}, opset=19, count_include_pad=count_include_pad, **attrs)


@pytest.mark.parametrize("op_type", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 3, 4, 5), (1, 2, 3, 4, 5)])
@pytest.mark.parametrize("opset", [1, 22])
def test_global_pool(op_type, shape, opset):
    check(op_type, {"x": rand(*shape, low=-5, high=5)}, opset=opset)


# --- shape ---------------------------------------------------------------------------------


@pytest.mark.parametrize("opset", [5, 13, 14, 19, 21])
@pytest.mark.parametrize(
    "shape", [[6, 4], [0, -1], [-1], [2, 0, 2, 2], [4, 3, 2], [1, -1, 1], [0, 0, 4]]
)
def test_reshape(opset, shape):
    check("Reshape", {"x": rand(2, 3, 4), "shape": np.array(shape, np.int64)}, opset=opset)


@pytest.mark.parametrize("opset", [14, 19, 21])
@pytest.mark.parametrize(
    "case", [((2, 3, 4), [0, -1], 0), ((0, 3), [3, 0], 1), ((2, 3, 4), [2, 12], 1)]
)
def test_reshape_allowzero(opset, case):
    data_shape, shape, allowzero = case
    inputs = {"x": rand(*data_shape), "shape": np.array(shape, np.int64)}
    check("Reshape", inputs, opset=opset, allowzero=allowzero)


@pytest.mark.parametrize("opset", [1, 13, 21])
@pytest.mark.parametrize("perm", [None, [0, 1, 2, 3], [0, 2, 1, 3], [3, 2, 1, 0], [1, 3, 0, 2]])
def test_transpose(opset, perm):
    attrs = {} if perm is None else {"perm": perm}
    check("Transpose", {"x": rand(2, 3, 4, 5)}, opset=opset, **attrs)


@pytest.mark.parametrize("opset, axis", cases(negative_axes_ok, [4, 11, 13], [0, 1, 2, -1, -3]))
@pytest.mark.parametrize("count", [1, 2, 3])
def test_concat(opset, axis, count):
    inputs = {}
    for i in range(count):
        shape = [2, 3, 4]
        shape[axis] += i
        inputs[f"x{i}"] = rand(*shape, seed=i)
    check("Concat", inputs, opset=opset, axis=axis)


UNSQUEEZE_AXES = [[0], [1], [3], [-1], [0, 3], [1, -1], [0, 1, 2]]


@pytest.mark.parametrize("opset, axes", cases(negative_axes_ok, [1, 11], UNSQUEEZE_AXES))
def test_unsqueeze_1(opset, axes):
    check("Unsqueeze", {"x": rand(2, 3, 4)}, opset=opset, axes=axes)


@pytest.mark.parametrize("opset", [13, 21])
@pytest.mark.parametrize("axes", UNSQUEEZE_AXES)
def test_unsqueeze(opset, axes):
    check("Unsqueeze", {"x": rand(2, 3, 4), "axes": np.array(axes, np.int64)}, opset=opset)


SQUEEZE_AXES = [None, [0], [2], [-1], [0, -1], [0, 2, 4]]


@pytest.mark.parametrize("opset, axes", cases(negative_axes_ok, [1, 11], SQUEEZE_AXES))
def test_squeeze_1(opset, axes):
    attrs = {} if axes is None else {"axes": axes}
    check("Squeeze", {"x": rand(1, 3, 1, 4, 1)}, opset=opset, **attrs)


@pytest.mark.parametrize("opset", [13, 21])
@pytest.mark.parametrize("axes", SQUEEZE_AXES)
def test_squeeze(opset, axes):
    axes = None if axes is None else np.array(axes, np.int64)
    check("Squeeze", {"x": rand(1, 3, 1, 4, 1), "axes": axes}, opset=opset)


@pytest.mark.parametrize("opset", [1, 13, 15, 19, 21])
@pytest.mark.parametrize("shape", [(), (3,), (2, 3, 4, 5)])
def test_shape(opset, shape):
    check("Shape", {"x": rand(*shape)}, opset=opset)


@pytest.mark.parametrize("opset", [15, 21])
@pytest.mark.parametrize(
    "bounds", [(1, None), (0, 2), (-2, None), (-3, -1), (1, 100), (-100, 2), (3, 1)]
)
def test_shape_slice(opset, bounds):
    start, end = bounds
    attrs = {"start": start} if end is None else {"start": start, "end": end}
    check("Shape", {"x": rand(2, 3, 4, 5)}, opset=opset, **attrs)


@pytest.mark.parametrize("opset", [1, 11, 13])
@pytest.mark.parametrize("axis", [0, 1, 2, -1])
@pytest.mark.parametrize("indices", [[0, 2, 1], [[1, 0], [2, 2]], 1, [-1, 0, -3]])
@pytest.mark.parametrize("index_dtype", [np.int64, np.int32])
def test_gather(opset, axis, indices, index_dtype):
    inputs = {"x": rand(3, 4, 5), "i": np.array(indices, dtype=index_dtype)}
    check("Gather", inputs, opset=opset, axis=axis)


SLICES = [
    ([1], [3], None, None),
    ([0, 1], [2, -1], [0, 2], None),
    ([-3], [INT64_MAX], [1], None),
    ([0, 0, 0], [-1, 100, 4], None, [1, 2, 3]),
    ([-1], [-INT64_MAX], [2], [-1]),
    ([4, 10], [0, -10], [1, 2], [-2, -3]),
    ([2], [2], [0], None),
    ([1, 1], [3, 4], [-1, -2], [1, 1]),
]


@pytest.mark.parametrize("opset", [10, 11, 13])
@pytest.mark.parametrize("case", range(len(SLICES)))
def test_slice(opset, case):
    starts, ends, axes, steps = SLICES[case]
    if opset == 10 and axes and min(axes) < 0:
        opset = 11
    inputs = {
        "x": rand(4, 5, 6),
        "starts": np.array(starts, np.int64),
        "ends": np.array(ends, np.int64),
        "axes": None if axes is None else np.array(axes, np.int64),
        "steps": None if steps is None else np.array(steps, np.int64),
    }
    check("Slice", inputs, opset=opset)


@pytest.mark.parametrize("case", [c for c in SLICES if c[3] is None])
def test_slice_1(case):
    starts, ends, axes, _ = case
    attrs = {"starts": starts, "ends": ends} | ({} if axes is None else {"axes": axes})
    check("Slice", {"x": rand(4, 5, 6)}, opset=1, **attrs)


# --- generators ----------------------------------------------------------------------------


@pytest.mark.parametrize("opset", [9, 20, 21])
@pytest.mark.parametrize("shape", [[2, 3], [4], [], [2, 0, 3]])
@pytest.mark.parametrize(
    "value",
    [None, np.array([1.5], np.float32), np.array([7], np.int64), np.array([-2], np.int32)],
    ids=["default", "float32", "int64", "int32"],
)
def test_constant_of_shape(opset, shape, value):
    attrs = {} if value is None else {"value": onnx.numpy_helper.from_array(value)}
    check("ConstantOfShape", {"shape": np.array(shape, np.int64)}, opset=opset, **attrs)


CONSTANTS = {
    "value": {"value": onnx.numpy_helper.from_array(rand(2, 3))},
    "value-int": {"value": onnx.numpy_helper.from_array(np.arange(4, dtype=np.int32))},
    "value_float": {"value_float": 2.5},
    "value_floats": {"value_floats": [1.0, 2.5, -3.0]},
    "value_int": {"value_int": 7},
    "value_ints": {"value_ints": [1, -2, 3]},
    "value_string": {"value_string": "hello"},
    "value_strings": {"value_strings": ["a", "bc"]},
}


@pytest.mark.parametrize(
    "name, opset",
    cases(
        # value_* attributes start at opset 12
        lambda name, opset: opset >= 12 or not name.startswith("value_"),
        sorted(CONSTANTS),
        [1, 9, 11, 12, 13, 19, 21],
    ),
)
def test_constant(name, opset):
    check("Constant", {}, opset=opset, **CONSTANTS[name])


# --- direct calls: views and purity ----------------------------------------------------------


@pytest.mark.parametrize(
    "op_type, opset, args, attrs",
    [
        ("Reshape", 14, (np.array([4, -1], np.int64),), {}),
        ("Reshape", 5, (np.array([0, 12], np.int64),), {}),
        ("Squeeze", 13, (None,), {}),
        ("Squeeze", 11, (), {"axes": [0]}),
        ("Unsqueeze", 13, (np.array([0, -1], np.int64),), {}),
        ("Unsqueeze", 11, (), {"axes": [1]}),
        ("Flatten", 13, (), {"axis": 2}),
        ("Identity", 21, (), {}),
        ("Dropout", 13, (), {}),
    ],
)
def test_views_share_memory(op_type, opset, args, attrs):
    entry = kernel(op_type, opset)
    assert entry.view_output == 0
    x = rand(1, 4, 3, 1)
    out = entry.fn(x, *args, **attrs)
    out = out[0] if isinstance(out, tuple) else out
    assert np.shares_memory(out, x)


def test_copying_ops_do_not_alias():
    x = rand(2, 3, 4)
    for op_type, opset, args in [
        ("Transpose", 13, ()),
        ("Slice", 13, (np.array([0]), np.array([1]))),
        ("Concat", 13, ()),
        ("Sum", 13, ()),
        ("Clip", 13, ()),
    ]:
        attrs = {"axis": 0} if op_type == "Concat" else {}
        out = kernel(op_type, opset).fn(x, *args, **attrs)
        assert not np.shares_memory(out, x), op_type


@pytest.mark.parametrize(
    "op_type, opset, inputs, attrs",
    [
        ("Conv", 11, (rand(1, 3, 6, 6), rand(4, 3, 3, 3), rand(4)), {"pads": [1, 1, 1, 1]}),
        ("Conv", 11, (rand(1, 3, 6, 6), rand(3, 1, 3, 3), rand(3)), {"group": 3}),
        ("MaxPool", 12, (rand(1, 2, 5, 5),), {"kernel_shape": [2, 2], "pads": [1, 1, 1, 1]}),
        ("AveragePool", 19, (rand(1, 2, 5, 5),), {"kernel_shape": [3, 3], "ceil_mode": 1}),
        ("BatchNormalization", 15, tuple(batch_norm_inputs((2, 3, 4)).values()), {}),
        ("Softmax", 13, (rand(3, 4),), {}),
        ("Gemm", 13, (rand(3, 4), rand(4, 2), rand(2)), {"alpha": 2.0, "beta": 0.5}),
        ("Mean", 13, (rand(3, 4), rand(3, 4)), {}),
    ],
)
def test_kernels_keep_inputs_and_dtype(op_type, opset, inputs, attrs):
    before = [a.copy() for a in inputs]
    out = kernel(op_type, opset).fn(*inputs, **attrs)
    for a, b in zip(inputs, before, strict=True):
        np.testing.assert_array_equal(a, b)
    for array in out if isinstance(out, tuple) else (out,):
        assert array.dtype in (np.float32, np.int64)

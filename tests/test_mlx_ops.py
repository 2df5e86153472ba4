"""Every op the mlx EP claims, on one-node models with random inputs, against ONNX Runtime.

Each case runs through a real session pinned to mlx (no cpu fallback), so the
node really runs in a compiled MLX claim. float32 must match at rtol 1e-4 /
atol 1e-5; float16 and bfloat16 cases are compared with ONNX Runtime run in
float32 on the same (rounded) inputs, with tolerances fit for the type.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest

from nxrt.tools.testing import make_node_model, run_node

RNG = np.random.default_rng(1234)


def rand(*shape: int, low: float = -1.0, high: float = 1.0) -> np.ndarray:
    return RNG.uniform(low, high, shape).astype(np.float32)


def ints(values) -> np.ndarray:
    return np.asarray(values, np.int64)


X4 = rand(2, 3, 9, 9)
POS = rand(3, 4, 5, low=0.1, high=2.0)


class Case:
    """One node: inputs fed at run time, initializers known at compile time."""

    def __init__(self, op, inputs, attrs=None, *, inits=None, opset=21, outputs=("y",), id=""):
        self.op, self.inputs, self.attrs = op, inputs, attrs or {}
        self.inits, self.opset, self.outputs = inits or {}, opset, outputs
        self.id = id or op


def unary(op, x=None, **attrs):
    return Case(op, {"x": rand(3, 4, 5) if x is None else x}, attrs)


def binary(op, a_shape=(3, 4, 5), b_shape=(4, 5)):
    return Case(op, {"a": rand(*a_shape), "b": rand(*b_shape)}, id=f"{op}-broadcast")


CASES = [
    binary("Add"),
    binary("Sub"),
    binary("Mul"),
    Case("Div", {"a": rand(3, 4, 5), "b": rand(3, 4, 5, low=0.5, high=2)}),
    Case("Pow", {"a": POS, "b": rand(3, 4, 5)}),
    unary("Sqrt", POS),
    unary("Exp"),
    unary("Log", POS),
    unary("Neg"),
    unary("Abs"),
    unary("Relu"),
    unary("LeakyRelu", alpha=0.2),
    unary("Sigmoid"),
    unary("Tanh"),
    unary("Erf"),
    Case("Gelu", {"x": rand(3, 4, 5, low=-3, high=3)}, opset=20),
    Case(
        "Gelu",
        {"x": rand(3, 4, 5, low=-3, high=3)},
        {"approximate": "tanh"},
        opset=20,
        id="Gelu-tanh",
    ),  # fmt: skip
    Case("Clip", {"x": rand(3, 4, 5)}, {"min": -0.3, "max": 0.4}, opset=6, id="Clip-6"),
    Case(
        "Clip",
        {"x": rand(3, 4, 5)},
        inits={"lo": np.array(-0.3, np.float32), "hi": np.array(0.4, np.float32)},
        id="Clip-13",
    ),  # fmt: skip
    Case("Clip", {"x": rand(3, 4, 5), "lo": np.array(-0.2, np.float32)}, id="Clip-dynamic-min"),
    Case("Max", {"a": rand(3, 4), "b": rand(4), "c": rand(3, 1)}),
    Case("Min", {"a": rand(3, 4), "b": rand(4), "c": rand(3, 1)}),
    Case("Sum", {"a": rand(3, 4), "b": rand(4), "c": rand(3, 1)}),
    Case("Mean", {"a": rand(3, 4), "b": rand(4), "c": rand(3, 1)}),
    Case("Equal", {"a": np.round(rand(3, 4) * 2), "b": np.round(rand(4) * 2)}),
    binary("Less"),
    binary("Greater"),
    Case("Not", {"x": RNG.random((3, 4)) > 0.5}),
    Case("And", {"a": RNG.random((3, 4)) > 0.5, "b": RNG.random((4,)) > 0.5}),
    Case("Or", {"a": RNG.random((3, 4)) > 0.5, "b": RNG.random((4,)) > 0.5}),
    Case("Where", {"c": RNG.random((3, 4)) > 0.5, "a": rand(3, 4), "b": rand(4)}),
    Case("Cast", {"x": rand(3, 4)}, {"to": 10}, id="Cast-f32-f16"),
    Case("Cast", {"x": rand(3, 4).astype(np.float16)}, {"to": 1}, id="Cast-f16-f32"),
    Case("Cast", {"x": RNG.random((3, 4)) > 0.5}, {"to": 1}, id="Cast-bool-f32"),
    Case("Cast", {"x": ints([[1, -2], [3, 4]])}, {"to": 1}, id="Cast-i64-f32"),
    Case("Cast", {"x": np.round(rand(3, 4))}, {"to": 9}, id="Cast-f32-bool"),
    Case("CastLike", {"x": rand(3, 4).astype(np.float16), "t": rand(2)}),
    unary("Identity"),
    Case("MatMul", {"a": rand(2, 3, 5, 6), "b": rand(6, 4)}),
    Case("MatMul", {"a": rand(2, 3, 5, 6), "b": rand(2, 3, 6, 4)}, id="MatMul-batched"),
    Case("MatMul", {"a": rand(6), "b": rand(6, 4)}, id="MatMul-vector"),
    Case(
        "Gemm",
        {"a": rand(3, 5)},
        {"alpha": 0.5, "beta": 2.0, "transB": 1},
        inits={"b": rand(4, 5), "c": rand(4)},
    ),  # fmt: skip
    Case("Gemm", {"a": rand(5, 3), "b": rand(5, 4)}, {"transA": 1}, id="Gemm-transA-no-C"),
    Case(
        "Gemm",
        {"a": rand(3, 5), "b": rand(4, 5), "c": rand(3, 1)},
        {"transB": 1},
        id="Gemm-dynamic-transB",
    ),  # fmt: skip
    Case("Conv", {"x": X4}, {"pads": [1, 1, 1, 1]}, inits={"w": rand(4, 3, 3, 3), "b": rand(4)}),
    Case(
        "Conv",
        {"x": X4},
        {"strides": [2, 2], "dilations": [2, 1], "pads": [0, 1, 2, 0]},
        inits={"w": rand(5, 3, 3, 2)},
        id="Conv-strides-dilations-asymmetric",
    ),  # fmt: skip
    Case(
        "Conv",
        {"x": rand(1, 4, 8, 8)},
        {"group": 2, "pads": [1, 1, 1, 1]},
        inits={"w": rand(6, 2, 3, 3), "b": rand(6)},
        id="Conv-groups",
    ),  # fmt: skip
    Case(
        "Conv",
        {"x": rand(1, 6, 9, 9)},
        {"group": 6, "strides": [2, 2], "pads": [1, 1, 1, 1]},
        inits={"w": rand(6, 1, 3, 3)},
        id="Conv-depthwise",
    ),  # fmt: skip
    Case(
        "Conv",
        {"x": X4},
        {"auto_pad": "SAME_UPPER", "strides": [2, 2]},
        inits={"w": rand(4, 3, 4, 4)},
        id="Conv-same-upper",
    ),  # fmt: skip
    Case(
        "Conv",
        {"x": X4},
        {"auto_pad": "SAME_LOWER", "strides": [2, 2]},
        inits={"w": rand(4, 3, 4, 4)},
        id="Conv-same-lower",
    ),  # fmt: skip
    Case("Conv", {"x": X4, "w": rand(4, 3, 1, 1)}, id="Conv-dynamic-weight"),
    Case(
        "Conv", {"x": rand(2, 3, 11)}, {"pads": [2, 1]}, inits={"w": rand(4, 3, 3)}, id="Conv-1d"
    ),  # fmt: skip
    Case(
        "Conv",
        {"x": rand(1, 2, 5, 6, 7)},
        {"pads": [1, 0, 1, 1, 0, 1]},
        inits={"w": rand(3, 2, 3, 2, 3)},
        id="Conv-3d",
    ),  # fmt: skip
    Case("MaxPool", {"x": X4}, {"kernel_shape": [3, 3], "strides": [2, 2]}),
    Case(
        "MaxPool",
        {"x": X4},
        {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1, "pads": [1, 1, 0, 0]},
        id="MaxPool-ceil-pads",
    ),  # fmt: skip
    Case(
        "MaxPool", {"x": X4}, {"kernel_shape": [2, 2], "dilations": [2, 2]}, id="MaxPool-dilations"
    ),  # fmt: skip
    Case(
        "MaxPool",
        {"x": X4},
        {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2]},
        id="MaxPool-same",
    ),  # fmt: skip
    Case(
        "AveragePool", {"x": X4}, {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    ),
    Case(
        "AveragePool",
        {"x": X4},
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1},
        id="AveragePool-count-pad",
    ),  # fmt: skip
    Case(
        "AveragePool",
        {"x": X4},
        {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1},
        id="AveragePool-ceil",
    ),  # fmt: skip
    unary("GlobalAveragePool", X4),
    unary("GlobalMaxPool", X4),
    Case(
        "BatchNormalization",
        {"x": X4},
        {"epsilon": 1e-3},
        inits={"s": rand(3), "b": rand(3), "m": rand(3), "v": rand(3, low=0.5, high=2)},
    ),  # fmt: skip
    Case("LayerNormalization", {"x": rand(2, 5, 8)}, inits={"s": rand(8), "b": rand(8)}),
    Case(
        "LayerNormalization",
        {"x": rand(2, 5, 8)},
        {"axis": 1},
        inits={"s": rand(5, 8)},
        outputs=("y", "mean", "inv_std"),
        id="LayerNormalization-axis1-stats",
    ),  # fmt: skip
    Case("Softmax", {"x": rand(2, 3, 4, 5)}, {"axis": 1}, opset=11, id="Softmax-11-flatten"),
    Case("Softmax", {"x": rand(2, 3, 4, 5)}, {"axis": 1}, id="Softmax-13-axis"),
    Case("LRN", {"x": rand(2, 7, 4, 4)}, {"size": 3, "alpha": 1e-3, "beta": 0.6, "bias": 2.0}),
    Case("Dropout", {"x": rand(3, 4)}, {"ratio": 0.3}, opset=9, id="Dropout-9"),
    Case(
        "Dropout",
        {"x": rand(3, 4)},
        inits={"r": np.array(0.5, np.float32)},
        opset=13,
        id="Dropout-13",
    ),
    Case("Flatten", {"x": rand(2, 3, 4, 5)}, {"axis": 2}),
    Case("Reshape", {"x": rand(2, 3, 4)}, inits={"s": ints([0, -1, 2])}),
    Case("Transpose", {"x": rand(2, 3, 4)}, {"perm": [2, 0, 1]}),
    Case("Transpose", {"x": rand(2, 3, 4)}, id="Transpose-default"),
    Case("Concat", {"a": rand(2, 3), "b": rand(2, 1), "c": rand(2, 2)}, {"axis": -1}),
    Case(
        "Slice",
        {"x": rand(5, 6, 7)},
        {"starts": [1, -4], "ends": [100, -1], "axes": [0, 2]},
        opset=9,
        id="Slice-1",
    ),  # fmt: skip
    Case(
        "Slice",
        {"x": rand(5, 6, 7)},
        inits={"st": ints([-1, 1]), "en": ints([-100, 6]), "ax": ints([1, 2]), "sp": ints([-2, 2])},
        id="Slice-13-negative-steps",
    ),  # fmt: skip
    Case("Gather", {"x": rand(5, 4), "i": ints([[0, -1], [2, 3]])}, {"axis": 0}),
    Case("Gather", {"x": rand(5, 4)}, {"axis": 1}, inits={"i": ints(-2)}, id="Gather-scalar"),
    Case(
        "Split",
        {"x": rand(6, 4)},
        {"axis": 0, "split": [2, 4]},
        opset=11,
        outputs=("y", "z"),
        id="Split-11",
    ),  # fmt: skip
    Case(
        "Split",
        {"x": rand(6, 4)},
        {"axis": 1},
        inits={"s": ints([1, 3])},
        opset=13,
        outputs=("y", "z"),
        id="Split-13",
    ),  # fmt: skip
    Case(
        "Split",
        {"x": rand(7, 4)},
        {"num_outputs": 3},
        opset=18,
        outputs=("y", "z", "w"),
        id="Split-18",
    ),  # fmt: skip
    Case("Split", {"x": rand(6, 4)}, opset=13, outputs=("y", "z", "w"), id="Split-equal"),
    Case("Squeeze", {"x": rand(1, 3, 1, 4)}, {"axes": [0, -2]}, opset=11, id="Squeeze-11"),
    Case("Squeeze", {"x": rand(1, 3, 1, 4)}, inits={"a": ints([2])}, id="Squeeze-13"),
    Case("Squeeze", {"x": rand(1, 3, 1, 4)}, id="Squeeze-all"),
    Case("Unsqueeze", {"x": rand(3, 4)}, {"axes": [0, -1]}, opset=11, id="Unsqueeze-11"),
    Case("Unsqueeze", {"x": rand(3, 4)}, inits={"a": ints([1, 3])}, id="Unsqueeze-13"),
    Case(
        "ReduceMean",
        {"x": rand(3, 4, 5)},
        {"axes": [1], "keepdims": 0},
        opset=13,
        id="ReduceMean-13",
    ),  # fmt: skip
    Case("ReduceMean", {"x": rand(3, 4, 5)}, inits={"a": ints([-1, 0])}, id="ReduceMean-18"),
    Case("ReduceSum", {"x": rand(3, 4, 5)}, {"axes": [0, 2]}, opset=11, id="ReduceSum-11"),
    Case(
        "ReduceSum",
        {"x": rand(3, 4, 5)},
        {"keepdims": 0},
        inits={"a": ints([1])},
        id="ReduceSum-13",
    ),  # fmt: skip
    Case("ReduceSum", {"x": rand(3, 4, 5)}, id="ReduceSum-all"),
    Case("ReduceMax", {"x": rand(3, 4, 5)}, {"axes": [1]}, opset=13, id="ReduceMax-13"),
    Case("ReduceMax", {"x": rand(3, 4, 5)}, inits={"a": ints([2])}, id="ReduceMax-18"),
    Case("ReduceMin", {"x": rand(3, 4, 5)}, {"axes": [1]}, opset=13, id="ReduceMin-13"),
    Case(
        "ReduceMin",
        {"x": rand(3, 4, 5)},
        {"keepdims": 0},
        inits={"a": ints([0])},
        id="ReduceMin-18",
    ),  # fmt: skip
    Case("Constant", {}, {"value": np.asarray(rand(2, 3))}, id="Constant"),
    Case("Constant", {}, {"value_ints": [3, -1]}, id="Constant-ints"),
    Case(
        "ConstantOfShape", {}, {"value": np.asarray([1.5], np.float32)}, inits={"s": ints([2, 3])}
    ),  # fmt: skip
]


def _model_args(case: Case) -> dict:
    from onnx import numpy_helper

    attrs = {
        k: numpy_helper.from_array(v) if isinstance(v, np.ndarray) else v
        for k, v in case.attrs.items()
    }
    return {
        "attrs": attrs,
        "opset": case.opset,
        "initializers": case.inits,
        "outputs": case.outputs,
    }


def run_both(case: Case, inputs=None, inits=None) -> tuple[list, list]:
    """mlx through a pinned session, and ONNX Runtime in float32 on the same inputs."""
    inputs = case.inputs if inputs is None else inputs
    inits = case.inits if inits is None else inits
    args = _model_args(case)
    attrs = args.pop("attrs")
    args["initializers"] = inits
    got = run_node(case.op, inputs, attrs, ep="mlx", **args)
    ref_inputs = {k: _as_f32(v) for k, v in inputs.items()}
    args["initializers"] = {k: _as_f32(v) for k, v in inits.items()}
    model = make_node_model(case.op, ref_inputs, attrs, **args)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return got, session.run(None, ref_inputs)


def _as_f32(array):
    array = np.asarray(array)
    if array.dtype in (np.float16, ml_dtypes.bfloat16):
        return array.astype(np.float32)
    return array


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_op_float32_matches_onnxruntime(case: Case) -> None:
    got, want = run_both(case)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


LOW_PRECISION = [
    binary("Add"),
    binary("Mul"),
    unary("Relu"),
    unary("Sigmoid"),
    unary("Tanh"),
    Case("Gelu", {"x": rand(3, 4, 5, low=-3, high=3)}, opset=20),
    Case("MatMul", {"a": rand(2, 5, 16), "b": rand(16, 4)}),
    Case("Conv", {"x": X4}, {"pads": [1, 1, 1, 1]}, inits={"w": rand(4, 3, 3, 3), "b": rand(4)}),
    Case("MaxPool", {"x": X4}, {"kernel_shape": [3, 3], "strides": [2, 2]}),
    Case("AveragePool", {"x": X4}, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    Case(
        "BatchNormalization",
        {"x": X4},
        inits={"s": rand(3), "b": rand(3), "m": rand(3), "v": rand(3, low=0.5, high=2)},
    ),  # fmt: skip
    Case("LayerNormalization", {"x": rand(2, 5, 8)}, inits={"s": rand(8), "b": rand(8)}),
    Case("Softmax", {"x": rand(2, 3, 8)}),
    Case("ReduceMean", {"x": rand(3, 4, 5)}, inits={"a": ints([1])}),
    Case("Transpose", {"x": rand(2, 3, 4)}, {"perm": [1, 2, 0]}),
]
DTYPES = {
    "float16": (np.float16, 2e-2, 2e-2),
    "bfloat16": (ml_dtypes.bfloat16, 5e-2, 5e-2),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", LOW_PRECISION, ids=[c.id for c in LOW_PRECISION])
def test_op_low_precision(case: Case, dtype: str) -> None:
    np_type, rtol, atol = DTYPES[dtype]
    inputs = {k: v.astype(np_type) for k, v in case.inputs.items()}
    inits = {k: v.astype(np_type) if v.dtype == np.float32 else v for k, v in case.inits.items()}
    got, want = run_both(case, inputs, inits)
    for g, w in zip(got, want):
        assert g.dtype == np_type
        np.testing.assert_allclose(g.astype(np.float32), w, rtol=rtol, atol=atol)

"""Graph rewrites at session creation: constant folding and Conv+BatchNormalization fusion."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import nxrt

RNG = np.random.default_rng(7)


def conv_bn_model(with_bias: bool, second_user: bool):
    w = RNG.standard_normal((6, 3, 3, 3)).astype(np.float32)
    params = [
        RNG.uniform(0.5, 2, 6).astype(np.float32),  # scale
        RNG.standard_normal(6).astype(np.float32),  # bias
        RNG.standard_normal(6).astype(np.float32),  # mean
        RNG.uniform(0.1, 3, 6).astype(np.float32),  # var
    ]
    inits = [numpy_helper.from_array(w, "w")]
    conv_inputs = ["x", "w"]
    if with_bias:
        inits.append(numpy_helper.from_array(RNG.standard_normal(6).astype(np.float32), "b"))
        conv_inputs.append("b")
    names = ["s", "o", "m", "v"]
    inits += [numpy_helper.from_array(p, n) for p, n in zip(params, names)]
    nodes = [
        helper.make_node("Conv", conv_inputs, ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", *names], ["bn"], name="bn", epsilon=1e-3),
        helper.make_node("Relu", ["bn"], ["y"], name="relu"),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if second_user:
        nodes.append(helper.make_node("Neg", ["c"], ["z"], name="neg"))
        outputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, None))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8, 8])],
        outputs,
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])


@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("second_user", [False, True])
def test_conv_batchnorm_fusion_matches_onnxruntime(with_bias, second_user):
    model = conv_bn_model(with_bias, second_user)
    x = RNG.standard_normal((2, 3, 8, 8)).astype(np.float32)
    session = nxrt.InferenceSession(model, providers=["cpu"])
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    for got, expected in zip(session.run(None, {"x": x}), want):
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    ops = [step.op_type for step in session._plan.steps]
    if second_user:  # the Conv output is needed as it is: no fusion
        assert "BatchNormalization" in ops and session.get_partition().fused == []
    else:
        assert "BatchNormalization" not in ops
        assert session.get_partition().fused == [("bn", "conv")]


def test_fusion_is_off_when_optimizations_are_disabled():
    options = nxrt.SessionOptions()
    options.graph_optimization_level = nxrt.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = nxrt.InferenceSession(conv_bn_model(True, False), options, providers=["cpu"])
    assert "BatchNormalization" in [step.op_type for step in session._plan.steps]


def test_constant_chains_fold_but_random_ops_do_not():
    nodes = [
        helper.make_node(
            "ConstantOfShape",
            ["shape"],
            ["ones"],
            name="fill",
            value=numpy_helper.from_array(np.array([2.0], np.float32)),
        ),
        helper.make_node("Mul", ["ones", "ones"], ["four"], name="square"),
        helper.make_node("Add", ["x", "four"], ["y"], name="add"),
        helper.make_node("RandomUniformLike", ["x"], ["noise"], name="noise", seed=1.0),
        helper.make_node("Mul", ["noise", "zero"], ["nothing"], name="mute"),
        helper.make_node("Add", ["y", "nothing"], ["out"], name="out"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [3])],
        [
            numpy_helper.from_array(np.array([3], np.int64), "shape"),
            numpy_helper.from_array(np.zeros(3, np.float32), "zero"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = nxrt.InferenceSession(model, providers=["cpu"])
    assert session.get_partition().folded == [("fill", "ConstantOfShape"), ("square", "Mul")]
    np.testing.assert_allclose(
        session.run(None, {"x": np.arange(3, dtype=np.float32)})[0], [4, 5, 6]
    )

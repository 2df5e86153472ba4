"""Graph rewrites at session creation: constant folding and Conv+BatchNormalization fusion."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
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
        # the BatchNormalization folds into the Conv, then the Relu into a FusedConv
        assert session.get_partition().fused == [("bn", "conv"), ("relu", "conv")]


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


# -- fusions into pkg.nxrt ops and standard ops ---------------------------------------------------


def _model(nodes, inputs, outputs, initializers, opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _compare(model, feeds, providers=("cpu",)):
    session = nxrt.InferenceSession(model, providers=list(providers))
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    for got, expected in zip(session.run(None, feeds), want, strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    return session, [(step.op_type, step.kernel) for step in session._plan.steps]


def _value(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def residual_block(activation: str = "Relu"):
    """Conv -> BN -> Mul -> Add (per-channel, Caffe2 style) -> Add(residual) -> activation."""
    w = RNG.standard_normal((4, 4, 3, 3)).astype(np.float32)
    stats = [RNG.uniform(0.5, 2, 4), RNG.standard_normal(4), RNG.standard_normal(4)]
    stats.append(RNG.uniform(0.5, 2, 4))
    inits = [numpy_helper.from_array(w, "w")]
    inits += [numpy_helper.from_array(a.astype(np.float32), n) for a, n in zip(stats, "sbmv")]
    inits.append(numpy_helper.from_array(RNG.uniform(0.5, 2, (4, 1, 1)).astype(np.float32), "k"))
    inits.append(numpy_helper.from_array(RNG.standard_normal((4, 1, 1)).astype(np.float32), "c"))
    inits += [
        numpy_helper.from_array(np.array(v, np.float32), n) for v, n in ((0, "lo"), (6, "hi"))
    ]
    act = [helper.make_node(activation, ["sum"], ["y"], name="act")]
    if activation == "Clip":
        act = [helper.make_node("Clip", ["sum", "lo", "hi"], ["y"], name="act")]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c0"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c0", "s", "b", "m", "v"], ["c1"], name="bn"),
        helper.make_node("Mul", ["c1", "k"], ["c2"], name="scale"),
        helper.make_node("Add", ["c2", "c"], ["c3"], name="shift"),
        helper.make_node("Add", ["c3", "x"], ["sum"], name="residual"),
        *act,
    ]
    return _model(nodes, [_value("x", [1, 4, 6, 6])], [_value("y", [1, 4, 6, 6])], inits)


@pytest.mark.parametrize("activation", ["Relu", "Clip", "LeakyRelu", "Sigmoid"])
def test_conv_block_becomes_one_fused_conv(activation):
    x = RNG.standard_normal((1, 4, 6, 6)).astype(np.float32)
    session, steps = _compare(residual_block(activation), {"x": x})
    assert [op for op, _ in steps] == ["FusedConv"]
    fused = session.get_partition().fused
    assert fused == [
        ("bn", "conv"),
        ("scale", "conv"),
        ("shift", "conv"),
        ("residual", "conv"),
        ("act", "conv"),
    ]


def test_fused_ops_are_made_only_for_an_ep_that_has_them():
    from nxrt.pipeline.optimizer import run_passes
    from nxrt.provider import ExecutionProvider
    from nxrt.registry import OpRegistry
    from nxrt_ep_cpu.fusions import cpu_passes

    model = ir.from_proto(onnx.shape_inference.infer_shapes(residual_block()))
    run_passes(model, cpu_passes(ExecutionProvider(ops=OpRegistry("no fused kernels"))))
    ops = [node.op_type for node in model.graph]
    assert ops == ["Conv", "Add", "Relu"]  # BN, Mul and Add folded into the weights only
    assert all(node.domain in ("", "ai.onnx") for node in model.graph)


def test_affine_chain_after_batch_normalization_folds_into_it():
    stats = [RNG.uniform(0.5, 2, 3), RNG.standard_normal(3), RNG.standard_normal(3)]
    stats.append(RNG.uniform(0.5, 2, 3))
    inits = [numpy_helper.from_array(a.astype(np.float32), n) for a, n in zip(stats, "sbmv")]
    inits.append(numpy_helper.from_array(np.float32([2.0, -1.0, 0.5]).reshape(3, 1), "k"))
    inits.append(numpy_helper.from_array(np.float32(0.25), "c"))
    nodes = [
        helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["n"], name="bn"),
        helper.make_node("Mul", ["k", "n"], ["n1"], name="scale"),
        helper.make_node("Sub", ["n1", "c"], ["y"], name="shift"),
    ]
    model = _model(nodes, [_value("x", [2, 3, 4])], [_value("y", [2, 3, 4])], inits)
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    session, steps = _compare(model, {"x": x})
    assert [op for op, _ in steps] == ["BatchNormalization"]
    assert session.get_partition().fused == [("scale", "bn"), ("shift", "bn")]


def pre_activation_block(scale: np.ndarray, group: int = 1, pads=(0, 0, 0, 0)):
    """Concat -> BatchNormalization -> Relu -> Conv, as in a DenseNet layer."""
    channels = scale.size
    stats = [scale, RNG.standard_normal(channels), RNG.standard_normal(channels)]
    stats.append(RNG.uniform(0.5, 2, channels))
    w = RNG.standard_normal((4, channels // group, 3, 3)).astype(np.float32)
    inits = [numpy_helper.from_array(a.astype(np.float32), n) for a, n in zip(stats, "sbmv")]
    inits += [
        numpy_helper.from_array(w, "w"),
        numpy_helper.from_array(RNG.standard_normal(4).astype(np.float32), "wb"),
    ]
    nodes = [
        helper.make_node("Concat", ["x1", "x2"], ["x"], name="cat", axis=1),
        helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["n"], name="bn"),
        helper.make_node("Relu", ["n"], ["r"], name="relu"),
        helper.make_node("Conv", ["r", "w", "wb"], ["y"], name="conv", pads=pads, group=group),
    ]
    half = [1, channels // 2, 5, 5]
    return _model(nodes, [_value("x1", half), _value("x2", half)], [_value("y", None)], inits)


@pytest.mark.parametrize("group", [1, 2])
def test_batch_norm_and_relu_before_a_conv_become_one_max(group):
    model = pre_activation_block(RNG.uniform(0.2, 2, 6), group)
    feeds = {name: RNG.standard_normal((1, 3, 5, 5)).astype(np.float32) for name in ("x1", "x2")}
    session, steps = _compare(model, feeds)
    # the scale moves into the Conv's weights, the shift becomes a per-channel floor
    assert [op for op, _ in steps] == ["Concat", "Max", "Conv"]
    assert session.get_partition().fused == [("bn", "conv"), ("relu", "conv")]


@pytest.mark.parametrize(
    ("scale", "pads"),
    [
        # Relu(a x + b) is a * max(x, -b / a) + b only where a > 0
        (np.array([1.0, 0.5, -0.7, 2.0, 1.5, 0.3]), (0, 0, 0, 0)),
        # with padding, the border windows would take the shift from padding that has none
        (np.full(6, 0.8), (1, 1, 1, 1)),
    ],
)
def test_batch_norm_and_relu_stay_where_the_rewrite_would_change_results(scale, pads):
    model = pre_activation_block(scale, pads=pads)
    feeds = {name: RNG.standard_normal((1, 3, 5, 5)).astype(np.float32) for name in ("x1", "x2")}
    session, steps = _compare(model, feeds)
    assert [op for op, _ in steps] == ["Concat", "BatchNormalization", "Relu", "Conv"]


def test_matmul_add_becomes_gemm_in_2d_and_fused_matmul_with_gelu_in_3d():
    w1 = (RNG.standard_normal((8, 16)) * 0.5).astype(np.float32)
    w2 = (RNG.standard_normal((16, 8)) * 0.5).astype(np.float32)
    inits = [
        numpy_helper.from_array(w1, "w1"),
        numpy_helper.from_array(RNG.standard_normal(16).astype(np.float32), "b1"),
        numpy_helper.from_array(w2, "w2"),
        numpy_helper.from_array(RNG.standard_normal((1, 8)).astype(np.float32), "b2"),
        numpy_helper.from_array(np.float32(np.sqrt(2)), "sqrt2"),
        numpy_helper.from_array(np.float32(1), "one"),
        numpy_helper.from_array(np.float32(0.5), "half"),
    ]
    nodes = [  # BERT's feed-forward block as torch exports it
        helper.make_node("MatMul", ["x", "w1"], ["h0"], name="up"),
        helper.make_node("Add", ["h0", "b1"], ["h"], name="up_bias"),
        helper.make_node("Div", ["h", "sqrt2"], ["d"], name="div"),
        helper.make_node("Erf", ["d"], ["e"], name="erf"),
        helper.make_node("Add", ["e", "one"], ["e1"], name="plus"),
        helper.make_node("Mul", ["h", "e1"], ["g0"], name="times"),
        helper.make_node("Mul", ["g0", "half"], ["g"], name="half"),
        helper.make_node("MatMul", ["g", "w2"], ["o0"], name="down"),
        helper.make_node("Add", ["o0", "b2"], ["y"], name="down_bias"),
    ]
    x3 = RNG.standard_normal((2, 3, 8)).astype(np.float32)
    model = _model(nodes, [_value("x", [2, 3, 8])], [_value("y", [2, 3, 8])], inits)
    session, steps = _compare(model, {"x": x3})
    assert [op for op, _ in steps] == ["FusedMatMul", "FusedMatMul"]
    assert steps[0][1].attrs["activation"] == "Gelu"
    model2d = _model(nodes, [_value("x", [3, 8])], [_value("y", [3, 8])], inits)
    _, steps = _compare(model2d, {"x": x3[0]})
    assert [op for op, _ in steps] == ["Gemm", "Div", "Erf", "Add", "Mul", "Mul", "Gemm"]


def test_fusion_keeps_graph_output_names_and_second_users():
    w = RNG.standard_normal((3, 2, 1, 1)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
        helper.make_node("Relu", ["c"], ["y"], name="relu"),
        helper.make_node("Conv", ["y", "w2"], ["c2"], name="conv2"),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("Neg", ["c2"], ["n2"], name="neg"),
    ]
    w2 = RNG.standard_normal((2, 3, 1, 1)).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(w2, "w2")]
    model = _model(
        nodes,
        [_value("x", [1, 2, 4, 4])],
        [_value("y", None), _value("r2", None), _value("n2", None)],
        inits,
    )
    x = RNG.standard_normal((1, 2, 4, 4)).astype(np.float32)
    session, steps = _compare(model, {"x": x})
    assert [op for op, _ in steps] == ["FusedConv", "Conv", "Relu", "Neg"]
    assert [o.name for o in session.get_outputs()] == ["y", "r2", "n2"]


@pytest.mark.parametrize("activation", ["Relu", "Sigmoid", "Tanh", "LeakyRelu"])
def test_batched_matmul_add_activation_becomes_one_fused_matmul(activation):
    inits = [
        numpy_helper.from_array(RNG.standard_normal((8, 6)).astype(np.float32), "w"),
        numpy_helper.from_array(RNG.standard_normal(6).astype(np.float32), "b"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
        helper.make_node("Add", ["b", "m"], ["s"], name="bias"),
        helper.make_node(activation, ["s"], ["y"], name="act"),
    ]
    model = _model(nodes, [_value("x", [2, 3, 8])], [_value("y", [2, 3, 6])], inits)
    x = RNG.standard_normal((2, 3, 8)).astype(np.float32)
    session, steps = _compare(model, {"x": x})
    assert [op for op, _ in steps] == ["FusedMatMul"]
    assert steps[0][1].attrs["activation"] == activation
    assert session.get_partition().fused == [("bias", "mm"), ("act", "mm")]


def squeeze_excitation_block(batch: int, kernel: int, gate: str = "HardSigmoid"):
    """MobileNetV3's / EfficientNet's block end: the channel gates of a squeeze-and-
    excitation branch times its input, then the projection Conv."""
    c, m, hidden = 8, 5, 4
    inits = [
        numpy_helper.from_array(RNG.standard_normal((hidden, c, 1, 1)).astype(np.float32), "w1"),
        numpy_helper.from_array(RNG.standard_normal((c, hidden, 1, 1)).astype(np.float32), "w2"),
        numpy_helper.from_array(
            RNG.standard_normal((m, c, kernel, kernel)).astype(np.float32), "w3"
        ),
        numpy_helper.from_array(RNG.standard_normal(m).astype(np.float32), "b3"),
    ]
    pads = [kernel // 2] * 4
    nodes = [
        helper.make_node("GlobalAveragePool", ["x"], ["pooled"], name="squeeze"),
        helper.make_node("Conv", ["pooled", "w1"], ["h0"], name="fc1"),
        helper.make_node("Relu", ["h0"], ["h1"], name="relu"),
        helper.make_node("Conv", ["h1", "w2"], ["g0"], name="fc2"),
        helper.make_node(gate, ["g0"], ["gates"], name="gate"),
        helper.make_node("Mul", ["x", "gates"], ["scaled"], name="excite"),
        helper.make_node("Conv", ["scaled", "w3", "b3"], ["y"], name="project", pads=pads),
    ]
    shape = [batch, c, 7, 7]
    return _model(nodes, [_value("x", shape)], [_value("y", [batch, m, 7, 7])], inits)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("kernel", [1, 3])
@pytest.mark.parametrize("threads", [1, 2])
def test_channel_gates_fold_into_the_projection_conv(batch, kernel, threads):
    x = RNG.standard_normal((batch, 8, 7, 7)).astype(np.float32)
    model = squeeze_excitation_block(batch, kernel)
    options = nxrt.SessionOptions()
    options.intra_op_num_threads = threads
    session = nxrt.InferenceSession(model, options, providers=["cpu"])
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    np.testing.assert_allclose(session.run(None, {"x": x})[0], want[0], rtol=1e-4, atol=1e-5)
    assert ("excite", "project") in session.get_partition().fused
    assert "Mul" not in [step.op_type for step in session._plan.steps]


def test_a_gated_input_read_twice_keeps_its_mul():
    model = squeeze_excitation_block(1, 1)
    model.graph.output.append(_value("scaled", [1, 8, 7, 7]))
    x = RNG.standard_normal((1, 8, 7, 7)).astype(np.float32)
    session, steps = _compare(model, {"x": x})
    assert "Mul" in [op for op, _ in steps]

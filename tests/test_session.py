"""The session: ONNX Runtime's API, feed validation, errors, placement, plan, threads."""

from __future__ import annotations

import json
import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import nxrt
from nxrt.errors import (
    EpPanicked,
    InvalidArgument,
    InvalidModel,
    KernelFailed,
    NoEpForOp,
)
from nxrt.ort.session import DISABLE_CPU_EP_FALLBACK
from nxrt.registry import OpRegistry
from nxrt.tools.testing import register_plugin
from toy_plugin import DeviceArray, ToyPlugin


@pytest.fixture
def cpu_pm(nxrt_pm):
    import nxrt_ep_cpu.plugin

    with register_plugin(nxrt_pm, nxrt_ep_cpu.plugin, "cpu"):
        yield nxrt_pm


def mlp_model(batch="N"):
    """x[N,4] -> Gemm(W1) -> Relu -> Gemm(W2) -> Softmax -> probs, plus a Reshape view."""
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((4, 8)).astype(np.float32)
    w2 = rng.standard_normal((8, 3)).astype(np.float32)
    nodes = [
        helper.make_node("Gemm", ["x", "w1"], ["h"], name="fc1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("Gemm", ["r", "w2"], ["logits"], name="fc2"),
        helper.make_node("Softmax", ["logits"], ["probs"], name="softmax", axis=1),
        helper.make_node("Reshape", ["w2", "flat_shape"], ["w2_flat"], name="view"),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4])],
        [
            helper.make_tensor_value_info("probs", TensorProto.FLOAT, [batch, 3]),
            helper.make_tensor_value_info("w2_flat", TensorProto.FLOAT, [24]),
        ],
        [
            numpy_helper.from_array(w1, "w1"),
            numpy_helper.from_array(w2, "w2"),
            numpy_helper.from_array(np.array([24], np.int64), "flat_shape"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


X = np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32)


def ort_run(model, feeds):
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


# -- ONNX Runtime's API ------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["proto", "bytes", "path"])
def test_session_matches_onnxruntime(cpu_pm, tmp_path, form):
    model = mlp_model()
    source = {"proto": model, "bytes": model.SerializeToString()}.get(form)
    if form == "path":
        source = str(tmp_path / "mlp.onnx")
        onnx.save(model, source)
    session = nxrt.InferenceSession(source, providers=["cpu"], plugin_manager=cpu_pm)
    for got, want in zip(session.run(None, {"x": X}), ort_run(model, {"x": X})):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    (probs,) = session.run(["probs"], {"x": X})
    assert probs.shape == (5, 3)


def test_inputs_outputs_and_providers(cpu_pm):
    session = nxrt.InferenceSession(
        mlp_model(), providers=["CPUExecutionProvider"], plugin_manager=cpu_pm
    )
    (arg,) = session.get_inputs()
    assert (arg.name, arg.shape, arg.type) == ("x", ["N", 4], "tensor(float)")
    assert [(o.name, o.shape) for o in session.get_outputs()] == [
        ("probs", ["N", 3]),
        ("w2_flat", [24]),
    ]
    assert session.get_providers() == ["CPUExecutionProvider"]  # the name it was asked by
    assert {a.name for a in session.get_overridable_initializers()} == set()


def test_default_providers_are_chosen_among_every_installed_ep_cpu_last(cpu_pm):
    options = nxrt.SessionOptions()
    options.set_provider_selection_policy("PRIORITY")
    with register_plugin(cpu_pm, ToyPlugin(), "toy"):
        measured = nxrt.InferenceSession(mlp_model(), plugin_manager=cpu_pm)
        ordered = nxrt.InferenceSession(mlp_model(), options, plugin_manager=cpu_pm)
    candidates = [c.providers for c in measured.get_partition().selection.candidates]
    assert candidates == [["cpu"], ["toy", "cpu"]]  # cpu alone first: it compiles meanwhile
    # EPs the session chose are reported by their public names (cpu: CPUExecutionProvider)
    assert measured.get_providers() in [["toy", "CPUExecutionProvider"], ["CPUExecutionProvider"]]
    assert ordered.get_providers() == ["toy", "CPUExecutionProvider"]
    assert [p.ep for p in ordered.get_partition().nodes] == ["cpu", "toy", "cpu", "cpu"]


def test_get_available_providers_lists_installed_cpu():
    # by ONNX Runtime names where an EP has one, nxrt ids otherwise (docs/onnxruntime-compat.md)
    assert "CPUExecutionProvider" in nxrt.get_available_providers()
    assert nxrt.get_available_providers()[-1] == "CPUExecutionProvider"


def test_unknown_provider_is_a_clear_error(cpu_pm):
    with pytest.raises(InvalidArgument, match="'cuda' is not installed.*installed: cpu"):
        nxrt.InferenceSession(mlp_model(), providers=["cuda"], plugin_manager=cpu_pm)


# -- feeds ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "feeds, message",
    [
        (
            {},
            r"Required inputs \(\['x'\]\) are missing from input feed \(\[\]\)\. The model's "
            r"inputs: x: tensor\(float\) \['N', 4\]",
        ),
        ({"x": X, "z": X}, r"unknown input name\(s\) \['z'\]"),
        ({"x": X.astype(np.float64)}, "dtype float64, expected float32"),
        ({"x": X[0]}, r"rank 1 \(shape \[4\]\), expected rank 2"),
        ({"x": X[:, :3]}, r"dim 3 on axis 1 .* expected 4"),
        ("not a dict", "must be a dict"),
    ],
)
def test_feed_validation_lists_what_was_expected(cpu_pm, feeds, message):
    session = nxrt.InferenceSession(mlp_model(), providers=["cpu"], plugin_manager=cpu_pm)
    with pytest.raises(InvalidArgument, match=message):
        session.run(None, feeds)


def test_unknown_output_name(cpu_pm):
    session = nxrt.InferenceSession(mlp_model(), providers=["cpu"], plugin_manager=cpu_pm)
    with pytest.raises(InvalidArgument, match="'nope' is not an output"):
        session.run(["nope"], {"x": X})


def test_non_contiguous_and_read_only_feeds_are_accepted_and_left_alone(cpu_pm):
    session = nxrt.InferenceSession(mlp_model(), providers=["cpu"], plugin_manager=cpu_pm)
    wide = np.ascontiguousarray(np.repeat(X, 2, axis=1))
    strided = wide[:, ::2]
    assert not strided.flags.c_contiguous
    frozen = X.copy()
    frozen.flags.writeable = False
    before = wide.copy()
    np.testing.assert_allclose(
        session.run(None, {"x": strided})[0], session.run(None, {"x": frozen})[0]
    )
    np.testing.assert_array_equal(wide, before)


# -- the plan -------------------------------------------------------------------------------------


def test_buffers_are_freed_after_their_last_use(cpu_pm):
    session = nxrt.InferenceSession(mlp_model(), providers=["cpu"], plugin_manager=cpu_pm)
    plan = session._plan
    names = plan.slot_names
    freed = {names[s]: step.name for step in plan.steps for s in step.frees}
    assert freed == {"x": "fc1", "h": "relu", "r": "fc2", "logits": "softmax"}


def test_view_outputs_are_zero_copy_but_never_expose_weights(cpu_pm):
    options = nxrt.SessionOptions()
    options.graph_optimization_level = nxrt.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = nxrt.InferenceSession(mlp_model(), options, providers=["cpu"], plugin_manager=cpu_pm)
    view_step = next(s for s in session._plan.steps if s.op_type == "Reshape")
    assert view_step.kernel.view_output == 0
    weight = session._plan.constants[session._plan.slot_names.index("w2")]
    (out,) = view_step.kernel.compute([weight, np.array([24])])
    assert np.shares_memory(out, weight)  # the kernel makes no copy
    (flat,) = session.run(["w2_flat"], {"x": X})
    assert flat.flags.writeable and not np.shares_memory(flat, weight)
    flat[:] = 0  # the user may write to what they get; the weight is untouched
    np.testing.assert_allclose(
        session.run(None, {"x": X})[0], ort_run(mlp_model(), {"x": X})[0], rtol=1e-5, atol=1e-6
    )


def test_constant_subgraphs_are_folded_at_creation(cpu_pm):
    session = nxrt.InferenceSession(mlp_model(), providers=["cpu"], plugin_manager=cpu_pm)
    assert session.get_partition().folded == [("view", "Reshape")]
    assert [s.name for s in session._plan.steps] == ["fc1", "relu", "fc2", "softmax"]
    assert "1 node(s) folded into constants" in str(session.get_partition())
    (flat,) = session.run(["w2_flat"], {"x": X})
    flat[:] = 0  # a folded constant handed out is a copy: the next run is unaffected
    np.testing.assert_array_equal(
        session.run(["w2_flat"], {"x": X})[0], ort_run(mlp_model(), {"x": X})[1]
    )


def test_copies_are_inserted_between_devices_and_reported(cpu_pm):
    model = mlp_model()
    with register_plugin(cpu_pm, ToyPlugin(device=True), "toy"):
        session = nxrt.InferenceSession(model, providers=["toy"], plugin_manager=cpu_pm)
        got = session.run(None, {"x": X})
    for a, b in zip(got, ort_run(model, {"x": X})):
        assert not isinstance(a, DeviceArray)
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    copies = [(c.value, c.from_device, c.to_device) for c in session.get_partition().copies]
    assert copies == [("h", "cpu", "toydev"), ("r", "toydev", "cpu")]
    assert "copy h: cpu -> toydev" in str(session.get_partition())


def test_claims_with_a_device_get_copies_at_their_boundary(cpu_pm):
    model = mlp_model()
    with register_plugin(cpu_pm, ToyPlugin(claims=True), "toy"):
        session = nxrt.InferenceSession(model, providers=["toy"], plugin_manager=cpu_pm)
    report = session.get_partition()
    assert [n.name for n in report.claims[0].nodes] == ["relu"]
    assert report.partitions[1] == ("toy", ["relu"])


# -- placement strictness ---------------------------------------------------------------------


def test_disable_cpu_ep_fallback_turns_a_silent_fallback_into_an_error(cpu_pm):
    options = nxrt.SessionOptions()
    options.add_session_config_entry(DISABLE_CPU_EP_FALLBACK, "1")
    with register_plugin(cpu_pm, ToyPlugin(), "toy"):
        with pytest.raises(NoEpForOp, match="Gemm at opset 17.*refused by toy: Gemm is not impl"):
            nxrt.InferenceSession(mlp_model(), options, providers=["toy"], plugin_manager=cpu_pm)
        session = nxrt.InferenceSession(mlp_model(), providers=["toy"], plugin_manager=cpu_pm)
    assert session.get_providers() == ["toy", "cpu"]
    fallbacks = {p.node: p.refusals for p in session.get_partition().fallbacks()}
    assert fallbacks["fc1"] == [("toy", "Gemm is not implemented")]


def test_an_op_no_ep_has_is_refused_at_creation(cpu_pm):
    model = helper.make_model(
        helper.make_graph(
            [helper.make_node("Frobnicate", ["x"], ["y"], domain="com.example")],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        ),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)],
    )
    with pytest.raises(NoEpForOp, match="com.example::Frobnicate at opset 1") as info:
        nxrt.InferenceSession(model, plugin_manager=cpu_pm)
    assert info.value.op_type == "Frobnicate" and info.value.domain == "com.example"


# -- errors at run time -----------------------------------------------------------------------


def faulty_plugin(error: BaseException):
    ops = OpRegistry("faulty")

    @ops.op("Relu", since=(6, 13, 14))
    def relu(x, /):
        if np.abs(x).max() > 1e5:
            raise error
        return np.maximum(x, 0)

    class Faulty(ToyPlugin):
        @nxrt.hookimpl
        def nxrt_register(self, registry):
            from toy_plugin import ToyEP

            registry.add_provider("faulty", lambda config: ToyEP(config, ops))
            registry.add_kernels("faulty", ops)

    return Faulty(ep_id="faulty")


@pytest.mark.parametrize(
    "error, expected, message",
    [
        (KernelFailed("weights exploded"), KernelFailed, "node 'relu' \\(Relu\\) on EP 'faulty'"),
        (ZeroDivisionError("oops"), EpPanicked, "'faulty' failed in node 'relu' \\(Relu\\).*oops"),
    ],
)
def test_kernel_errors_are_typed_and_the_session_stays_usable(cpu_pm, error, expected, message):
    with register_plugin(cpu_pm, faulty_plugin(error), "faulty"):
        session = nxrt.InferenceSession(mlp_model(), providers=["faulty"], plugin_manager=cpu_pm)
    with pytest.raises(expected, match=message):
        session.run(None, {"x": np.full((5, 4), 1e6, np.float32)})
    np.testing.assert_allclose(
        session.run(None, {"x": X})[0], ort_run(mlp_model(), {"x": X})[0], rtol=1e-5, atol=1e-6
    )


def test_cpu_kernel_shape_errors_become_kernel_failed(cpu_pm):
    model = helper.make_model(
        helper.make_graph(
            [helper.make_node("Add", ["a", "b"], ["c"], name="add")],
            "g",
            [
                helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n"]),
                helper.make_tensor_value_info("b", TensorProto.FLOAT, ["m"]),
            ],
            [helper.make_tensor_value_info("c", TensorProto.FLOAT, ["k"])],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    session = nxrt.InferenceSession(model, providers=["cpu"], plugin_manager=cpu_pm)
    with pytest.raises(KernelFailed, match="node 'add' \\(Add\\) on EP 'cpu'.*broadcast"):
        session.run(None, {"a": np.ones(3, np.float32), "b": np.ones(4, np.float32)})


# -- bad models ------------------------------------------------------------------------------


def test_bad_model_sources_are_invalid_model(tmp_path):
    with pytest.raises(InvalidModel, match="not an ONNX model"):
        nxrt.InferenceSession(b"\x08\x07garbage\xff\xff")
    with pytest.raises(InvalidModel, match="does not exist"):
        nxrt.InferenceSession(str(tmp_path / "missing.onnx"))
    with pytest.raises(InvalidModel, match="cannot load a model from int"):
        nxrt.InferenceSession(42)


def test_a_cycle_is_invalid_model():
    nodes = [
        helper.make_node("Relu", ["b"], ["a"], name="first"),
        helper.make_node("Relu", ["a"], ["b"], name="second"),
    ]
    graph = helper.make_graph(
        nodes,
        "cycle",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("b", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(InvalidModel):
        nxrt.InferenceSession(model)


# -- threads and profiling --------------------------------------------------------------------


def test_run_from_eight_threads_matches_sequential_runs(cpu_pm):
    session = nxrt.InferenceSession(mlp_model(), providers=["cpu"], plugin_manager=cpu_pm)
    rng = np.random.default_rng(2)
    feeds = [rng.standard_normal((7, 4)).astype(np.float32) for _ in range(8)]
    sequential = [session.run(None, {"x": f})[0] for f in feeds]
    results: list = [None] * 8

    def work(i):
        for _ in range(20):
            results[i] = session.run(None, {"x": feeds[i]})[0]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for got, want in zip(results, sequential):
        np.testing.assert_array_equal(got, want)


def test_profiling_writes_a_chrome_trace(cpu_pm, tmp_path):
    options = nxrt.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(tmp_path / "trace")
    model = mlp_model(batch=5)
    session = nxrt.InferenceSession(model, options, providers=["cpu"], plugin_manager=cpu_pm)
    session.run(None, {"x": X})
    path = session.end_profiling()
    events = json.loads(open(path).read())["traceEvents"]
    assert [e["args"]["op_type"] for e in events] == ["Gemm", "Relu", "Gemm", "Softmax"]
    assert events[0]["args"]["ep"] == "cpu" and events[0]["args"]["flops"] > 0
    assert all(e["ph"] == "X" and e["dur"] >= 0 for e in events)


@pytest.mark.parametrize("typed", [True, False])
def test_outputs_without_a_shape_or_type_are_accepted_as_onnxruntime_does(typed):
    output = (
        helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
        if typed
        else helper.make_empty_tensor_value_info("y")
    )
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [output],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    before = model.SerializeToString()
    session = nxrt.InferenceSession(model)
    (y,) = session.run(None, {"x": np.array([-1, 2], np.float32)})
    np.testing.assert_array_equal(y, [0, 2])
    assert model.SerializeToString() == before  # the caller's model is left as it was


def _wide_linear_model() -> onnx.ModelProto:
    weight = np.random.default_rng(0).standard_normal((256, 512)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "wide",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(weight, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_checking_and_shape_inference_never_copy_the_weights():
    from nxrt.pipeline.model import _types_only, load_model

    model = _wide_linear_model()
    light = _types_only(model)
    assert light.ByteSize() < model.ByteSize() // 100, "the 512 KB weight stays out of the copy"
    ir_model, _ = load_model(model)
    hidden = next(v for n in ir_model.graph for v in n.outputs if v.name == "h")
    assert list(hidden.shape) == [2, 512], "types and shapes are still inferred"
    assert ir_model.graph.initializers["w"].const_value.numpy().shape == (256, 512)


def test_a_model_proto_passed_in_is_left_unchanged(cpu_pm):
    model = _wide_linear_model()
    before = model.SerializeToString()
    session = nxrt.InferenceSession(model, providers=["cpu"], plugin_manager=cpu_pm)
    (y,) = session.run(None, {"x": np.ones((2, 256), np.float32)})
    assert y.shape == (2, 512)
    assert model.SerializeToString() == before


def test_a_session_holds_one_copy_of_each_weight(cpu_pm):
    session = nxrt.InferenceSession(_wide_linear_model(), providers=["cpu"], plugin_manager=cpu_pm)
    plan = session._plan
    weight = plan.constants[plan.slot_names.index("w")]
    graph_copy = session._model.graph.initializers["w"].const_value.numpy()
    assert np.shares_memory(weight, graph_copy), "the graph keeps the plan's array, not its own"

"""Code written for onnxruntime, run unchanged on nxrt (``import nxrt as onnxruntime``).

Each test is parametrized over both runtimes and asserts onnxruntime's
documented behaviour, so a difference fails on one side: the installed
onnxruntime is the oracle. The few tests of what only nxrt has (device EPs,
bytes feeds onnxruntime misreads) say so in their names.
docs/onnxruntime-compat.md is the table of what each name does.
"""

from __future__ import annotations

import importlib
import os
import threading
import warnings

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import nxrt
from nxrt.provider import ExecutionProvider
from nxrt.registry import OpRegistry
from nxrt.tools.testing import register_plugin
from toy_plugin import DeviceArray, ToyPlugin

CPU = ["CPUExecutionProvider"]


@pytest.fixture(params=["onnxruntime", "nxrt"])
def rt(request):
    """The runtime under test, imported as code written for onnxruntime imports it."""
    return {"onnxruntime": onnxruntime, "nxrt": nxrt}[request.param]


def capi(rt):
    """``rt.capi.onnxruntime_pybind11_state``, reached the way onnxruntime code reaches it."""
    return rt.capi.onnxruntime_pybind11_state


# -- models -------------------------------------------------------------------------------------
def scale_model(batch="batch") -> onnx.ModelProto:
    """Y = X * W (W = [3, 3]), with X also returned as an output, and metadata set."""
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [batch, 2])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [batch, 2])
    w = numpy_helper.from_array(np.full((2,), 3, np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("Mul", ["X", "W"], ["Y"])],
        "scale",
        [x],
        [y, helper.make_tensor_value_info("X", TensorProto.FLOAT, [batch, 2])],
        initializer=[w],
        doc_string="the graph's doc",
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17)],
        producer_name="compat-tests",
        domain="org.example",
        model_version=7,
        doc_string="the model's doc",
    )
    helper.set_model_props(model, {"author": "nxrt", "purpose": "tests"})
    return model


def mul_1_model() -> onnx.ModelProto:
    """onnxruntime's sample mul_1.onnx: IR version 3, its initializer not a graph input."""
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [3, 2])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [3, 2])
    w = numpy_helper.from_array(np.arange(1, 7, dtype=np.float32).reshape(3, 2), "W")
    graph = helper.make_graph([helper.make_node("Mul", ["X", "W"], ["Y"])], "mul_1", [x], [y], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 7)])
    model.ir_version = 3
    return model


def string_model() -> onnx.ModelProto:
    s = helper.make_tensor_value_info("s", TensorProto.STRING, [None])
    t = helper.make_tensor_value_info("t", TensorProto.STRING, [None])
    graph = helper.make_graph([helper.make_node("Identity", ["s"], ["t"])], "strings", [s], [t])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def two_branch_model() -> onnx.ModelProto:
    """Y = Relu(X) and Z = Reshape(X, S): Z fails when S does not fit X."""
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [6])
    s = helper.make_tensor_value_info("S", TensorProto.INT64, [2])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [6])
    z = helper.make_tensor_value_info("Z", TensorProto.FLOAT, None)
    nodes = [helper.make_node("Relu", ["X"], ["Y"]), helper.make_node("Reshape", ["X", "S"], ["Z"])]
    graph = helper.make_graph(nodes, "branches", [x, s], [y, z])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def folding_model() -> onnx.ModelProto:
    """Y = Relu(Conv(X, W) + (A + B)): A + B folds; Conv + Relu is what EPs fuse."""
    rng = np.random.default_rng(0)
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 2, 5, 5])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 3, 5, 5])
    inits = [
        numpy_helper.from_array(rng.standard_normal((3, 2, 3, 3)).astype(np.float32), "W"),
        numpy_helper.from_array(rng.standard_normal((1, 3, 1, 1)).astype(np.float32), "A"),
        numpy_helper.from_array(rng.standard_normal((1, 3, 1, 1)).astype(np.float32), "B"),
    ]
    nodes = [
        helper.make_node("Add", ["A", "B"], ["AB"]),
        helper.make_node("Conv", ["X", "W"], ["C"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["C", "AB"], ["D"]),
        helper.make_node("Relu", ["D"], ["Y"]),
    ]
    graph = helper.make_graph(nodes, "folding", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def session(rt, model=None, options=None, **kwargs):
    source = (model if model is not None else scale_model()).SerializeToString()
    return rt.InferenceSession(source, options, providers=CPU, **kwargs)


X = np.array([[1, 2], [3, 4]], np.float32)


# -- provider names -----------------------------------------------------------------------------
def test_the_cpu_provider_has_onnxruntimes_name(rt):
    assert "CPUExecutionProvider" in rt.get_available_providers()
    assert rt.get_all_providers()[-1] == "CPUExecutionProvider"
    assert set(rt.get_available_providers()) <= set(rt.get_all_providers())


def test_a_session_reports_the_names_it_was_given(rt):
    sess = session(rt)
    assert sess.get_providers() == CPU
    assert sess.get_provider_options() == {"CPUExecutionProvider": {}}
    sess.set_providers(CPU)
    assert sess.get_providers() == CPU
    np.testing.assert_array_equal(sess.run(["Y"], {"X": X})[0], X * 3)


def test_a_provider_this_install_lacks_is_left_out_with_a_warning(rt):
    with pytest.warns(UserWarning, match="CUDAExecutionProvider"):
        sess = rt.InferenceSession(
            scale_model().SerializeToString(), providers=["CUDAExecutionProvider", *CPU]
        )
    assert sess.get_providers() == CPU


def test_nxrt_ids_keep_working_next_to_onnxruntime_names():
    sess = nxrt.InferenceSession(scale_model(), providers=["cpu"])
    assert sess.get_providers() == ["cpu"]
    assert sess.get_capabilities("cpu") is sess.get_capabilities("cpu")
    assert session(nxrt).get_capabilities("CPUExecutionProvider").flags


# -- versions, device, logging ------------------------------------------------------------------
def test_version_and_build_information(rt):
    major, minor, *_ = (int(p) for p in rt.get_version_string().split("."))
    assert (major, minor) >= (1, 16)
    assert isinstance(rt.get_build_info(), str) and rt.get_build_info()
    assert rt.get_device() in ("CPU", "GPU")
    assert isinstance(rt.__version__, str)


def test_nxrt_reports_its_own_version_and_the_api_level_it_follows():
    assert nxrt.__version__ == nxrt.version != nxrt.get_version_string()
    # the API level nxrt follows is that of the onnxruntime these tests compare it with
    assert nxrt.get_version_string() == nxrt.ORT_API_VERSION == onnxruntime.__version__
    assert nxrt.__version__ in nxrt.get_build_info() and nxrt.ORT_API_VERSION in (
        nxrt.get_build_info()
    )


@pytest.fixture
def quiet_logger(rt):
    yield
    rt.set_default_logger_callback(None)
    rt.set_default_logger_severity(3 if rt is onnxruntime else 2)


def test_the_default_logger_takes_a_severity_and_a_callback(rt, quiet_logger):
    rt.set_default_logger_severity(3)
    for bad in (-1, 7):
        with pytest.raises(RuntimeError):
            rt.set_default_logger_severity(bad)
    with pytest.raises(RuntimeError):
        rt.set_default_logger_callback(print, 9)
    calls = []
    rt.set_default_logger_callback(lambda *args: calls.append(args), 3)
    options = rt.SessionOptions()
    options.logid, options.log_severity_level = "compat-session", 0
    sess = session(rt, options=options)
    assert calls, "a session logging at severity 0 reached the callback"
    assert all(
        isinstance(severity, int) and all(isinstance(a, str) for a in rest)
        for severity, *rest in calls
    )
    assert any(logid == "compat-session" for _, _, logid, _, _ in calls)
    run_options = rt.RunOptions()
    run_options.logid, run_options.log_severity_level = "compat-run", 0
    calls.clear()
    sess.run(None, {"X": X}, run_options)
    assert any("compat-run" in message for *_, message in calls)
    rt.set_default_logger_callback(None)
    calls.clear()
    session(rt, options=options)
    assert calls == []
    rt.set_default_logger_verbosity(1)


# -- exceptions ---------------------------------------------------------------------------------
ERRORS = (
    "Fail InvalidArgument NoSuchFile NoModel EngineError RuntimeException InvalidProtobuf "
    "ModelLoaded NotImplemented InvalidGraph EPFail ModelLoadCanceled ModelRequiresCompilation "
    "NotFound DeviceReset"
).split()


def test_the_exception_classes_are_where_onnxruntime_puts_them(rt):
    for module in ("onnxruntime_pybind11_state", "_pybind_state"):
        state = importlib.import_module(f"{rt.__name__}.capi.{module}")
        for name in ERRORS:
            assert issubclass(getattr(state, name), Exception), name
    assert capi(rt).SessionOptions is rt.SessionOptions
    assert capi(rt).RunOptions is rt.RunOptions


def test_the_python_classes_are_where_onnxruntime_defines_them(rt):
    collection = importlib.import_module(f"{rt.__name__}.capi.onnxruntime_inference_collection")
    for name in ("InferenceSession", "Session", "IOBinding", "OrtValue", "copy_tensors"):
        assert hasattr(collection, name), name
    assert collection.OrtValue is rt.OrtValue and collection.IOBinding is rt.IOBinding


def test_nxrt_errors_are_caught_as_onnxruntimes():
    state = capi(nxrt)
    assert issubclass(nxrt.errors.InvalidArgument, state.InvalidArgument)
    assert issubclass(nxrt.errors.InvalidArgument, ValueError)
    assert issubclass(nxrt.errors.NoEpForOp, state.Fail)
    assert issubclass(nxrt.errors.NoEpForOp, state.NotImplemented)
    assert issubclass(nxrt.errors.KernelFailed, state.Fail)
    assert issubclass(nxrt.errors.KernelFailed, state.RuntimeException)
    assert issubclass(nxrt.errors.InvalidModel, state.Fail)
    assert issubclass(nxrt.errors.RuntimeFailure, RuntimeError)


def test_bad_model_sources_raise_onnxruntimes_classes(rt, tmp_path):
    with pytest.raises(capi(rt).NoSuchFile):
        rt.InferenceSession(str(tmp_path / "absent.onnx"), providers=CPU)
    with pytest.raises(capi(rt).InvalidProtobuf):
        rt.InferenceSession(b"these are not the bytes of a model", providers=CPU)
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [2])
    twice = [helper.make_node("Relu", ["X"], ["Y"]), helper.make_node("Relu", ["X"], ["Y"])]
    invalid = helper.make_model(
        helper.make_graph(twice, "g", [x], [helper.make_tensor_value_info("Y", 1, [2])]),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    with pytest.raises(capi(rt).Fail):
        rt.InferenceSession(invalid.SerializeToString(), providers=CPU)
    unknown_op = helper.make_model(
        helper.make_graph(
            [helper.make_node("Bar", ["X"], ["Y"], domain="example.ops")],
            "g",
            [x],
            [helper.make_tensor_value_info("Y", 1, [2])],
        ),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("example.ops", 1)],
    )
    with pytest.raises(capi(rt).Fail):
        rt.InferenceSession(unknown_op.SerializeToString(), providers=CPU)


@pytest.mark.parametrize(
    "feeds, outputs",
    [
        ({"X": X.astype(np.float64)}, None),
        ({"X": X[0]}, None),
        ({"X": np.ones((2, 3), np.float32)}, None),
        ({"X": X, "bogus": X}, None),
        ({"X": X}, ["bogus"]),
    ],
    ids=["dtype", "rank", "dim", "unknown-input", "unknown-output"],
)
def test_bad_feeds_raise_invalid_argument(rt, feeds, outputs):
    with pytest.raises(capi(rt).InvalidArgument):
        session(rt).run(outputs, feeds)


def test_a_missing_feed_is_named_as_onnxruntime_names_it(rt):
    with pytest.raises(
        ValueError, match=r"Required inputs \(\['X'\]\) are missing from input feed \(\[\]\)"
    ):
        session(rt).run(None, {})


def test_a_failing_kernel_raises_fail(rt):
    sess = session(rt, two_branch_model())
    with pytest.raises(capi(rt).Fail):
        sess.run(None, {"X": np.ones(6, np.float32), "S": np.array([4, 4])})
    assert sess.run(None, {"X": np.ones(6, np.float32), "S": np.array([2, 3])})[1].shape == (2, 3)


def test_unknown_config_entries_raise_runtime_error(rt):
    with pytest.raises(RuntimeError):
        rt.SessionOptions().get_session_config_entry("no.such.key")
    with pytest.raises(RuntimeError):
        rt.RunOptions().get_run_config_entry("no.such.key")
    options, run_options = rt.SessionOptions(), rt.RunOptions()
    options.add_session_config_entry("session.some_key", "1")
    run_options.add_run_config_entry("run.some_key", "2")
    assert options.get_session_config_entry("session.some_key") == "1"
    assert run_options.get_run_config_entry("run.some_key") == "2"


def test_nxrt_raises_a_fail_for_an_unknown_config_entry():
    with pytest.raises(capi(nxrt).Fail):
        nxrt.SessionOptions().get_session_config_entry("no.such.key")


def test_custom_op_libraries_are_refused_as_onnxruntime_refuses_them(rt, tmp_path):
    options = rt.SessionOptions()
    with pytest.raises(capi(rt).Fail):
        options.register_custom_ops_library(str(tmp_path / "absent.so"))
    import ctypes.util

    libm = ctypes.util.find_library("m")
    with pytest.raises(capi(rt).Fail):  # loads, but has no RegisterCustomOps
        options.register_custom_ops_library(libm)


# -- behaviour of run ---------------------------------------------------------------------------
def test_model_metadata_is_an_object_with_onnxruntimes_fields(rt):
    meta = session(rt).get_modelmeta()
    assert (meta.producer_name, meta.graph_name, meta.domain) == (
        "compat-tests",
        "scale",
        "org.example",
    )
    assert (meta.description, meta.graph_description, meta.version) == (
        "the model's doc",
        "the graph's doc",
        7,
    )
    assert meta.custom_metadata_map == {"author": "nxrt", "purpose": "tests"}


def test_an_ir_3_model_whose_initializers_are_not_inputs_loads(rt):
    sess = session(rt, mul_1_model())
    got = sess.run(None, {"X": np.ones((3, 2), np.float32)})[0]
    np.testing.assert_array_equal(got, np.arange(1, 7, dtype=np.float32).reshape(3, 2))
    assert sess.get_overridable_initializers() == []


def test_a_graph_input_returned_as_an_output_is_a_copy(rt):
    x = X.copy()
    y, echoed = session(rt).run(None, {"X": x})
    assert echoed is not x and not np.shares_memory(echoed, x)
    echoed[:] = 0
    np.testing.assert_array_equal(x, X)


def test_views_of_a_feed_are_copies(rt):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    outputs = [
        helper.make_tensor_value_info("flat", TensorProto.FLOAT, [6]),
        helper.make_tensor_value_info("same", TensorProto.FLOAT, [2, 3]),
    ]
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["flat"]),
        helper.make_node("Identity", ["x"], ["same"]),
    ]
    shape = numpy_helper.from_array(np.array([6], np.int64), "shape")
    model = helper.make_model(
        helper.make_graph(nodes, "views", [x], outputs, [shape]),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    fed = np.ones((2, 3), np.float32)
    for result in session(rt, model).run(None, {"x": fed}):
        assert not np.shares_memory(result, fed)


def test_nested_lists_are_converted_to_the_inputs_type(rt):
    y, echoed = session(rt).run(None, {"X": [[1, 2], [3, 4]]})
    assert y.dtype == np.float32 and echoed.dtype == np.float32
    np.testing.assert_array_equal(y, X * 3)


def test_void_string_feeds_are_accepted(rt):
    words = np.array([b"ab", b"cd"]).view(np.void)
    (got,) = session(rt, string_model()).run(None, {"s": words})
    assert list(got) == ["ab", "cd"]


def test_nxrt_accepts_bytes_string_feeds():
    # onnxruntime 1.32 misreads ``S`` arrays (its result depends on the bytes after them)
    (got,) = session(nxrt, string_model()).run(None, {"s": np.array([b"ab", "é".encode()])})
    assert list(got) == ["ab", "é"]


def test_a_numeric_feed_for_a_string_input_names_no_removed_numpy_type(rt):
    with pytest.raises(capi(rt).InvalidArgument) as info:
        session(rt, string_model()).run(None, {"s": np.ones(2, np.float32)})
    assert "np.object" not in str(info.value)


def test_ortvalues_are_accepted_as_feeds_of_run(rt):
    value = rt.OrtValue.ortvalue_from_numpy(X)
    np.testing.assert_array_equal(session(rt).run(["Y"], {"X": value})[0], X * 3)


# -- SessionOptions -----------------------------------------------------------------------------
def test_session_options_have_onnxruntimes_defaults(rt):
    options = rt.SessionOptions()
    assert options.enable_cpu_mem_arena is True
    assert options.enable_mem_pattern is True
    assert options.enable_mem_reuse is True
    assert options.execution_mode == rt.ExecutionMode.ORT_SEQUENTIAL
    assert options.execution_order == rt.ExecutionOrder.DEFAULT
    assert options.graph_optimization_level == rt.GraphOptimizationLevel.ORT_ENABLE_ALL
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (0, 0)
    assert (options.log_severity_level, options.log_verbosity_level, options.logid) == (-1, 0, "")
    assert options.optimized_model_filepath == ""
    assert options.use_deterministic_compute is False
    assert options.use_per_session_threads is True
    assert options.enable_profiling is False
    assert options.has_providers() is False
    assert list(rt.ExecutionMode.__members__) == ["ORT_SEQUENTIAL", "ORT_PARALLEL"]
    assert list(rt.ExecutionOrder.__members__) == ["DEFAULT", "PRIORITY_BASED", "MEMORY_EFFICIENT"]


def test_memory_and_execution_settings_change_no_result(rt):
    options = rt.SessionOptions()
    options.enable_cpu_mem_arena = False
    options.enable_mem_pattern = False
    options.enable_mem_reuse = False
    options.use_deterministic_compute = True
    options.execution_mode = rt.ExecutionMode.ORT_PARALLEL
    options.inter_op_num_threads = 2
    np.testing.assert_array_equal(session(rt, options=options).run(["Y"], {"X": X})[0], X * 3)


def test_nxrt_says_it_runs_parallel_mode_sequentially(caplog):
    options = nxrt.SessionOptions()
    options.execution_mode = nxrt.ExecutionMode.ORT_PARALLEL
    with caplog.at_level("WARNING", logger="nxrt"):
        session(nxrt, options=options)
    assert "ORT_PARALLEL" in caplog.text and "ORT_SEQUENTIAL" in caplog.text


def test_providers_can_come_from_the_session_options(rt):
    options = rt.SessionOptions()
    options.add_provider("CPUExecutionProvider", {})
    assert options.has_providers()
    sess = rt.InferenceSession(scale_model().SerializeToString(), options)
    assert sess.get_providers() == CPU


def test_memory_infos_describe_host_memory_without_an_arena(rt):
    options = rt.SessionOptions()
    options.enable_cpu_mem_arena = False
    sess = session(rt, options=options)
    infos = sess.get_input_memory_infos() + sess.get_output_memory_infos()
    assert len(infos) == 3
    for info in infos:
        assert (info.name, info.device_id) == ("Cpu", 0)
        assert (info.mem_type.name, info.allocator_type.name) == (
            "DEFAULT",
            "ORT_DEVICE_ALLOCATOR",
        )


def test_add_initializer_replaces_the_models_data(rt):
    options = rt.SessionOptions()
    weights = np.full((2,), 10, np.float32)
    value = rt.OrtValue.ortvalue_from_numpy(weights)  # it must outlive the sessions using it
    options.add_initializer("W", value)
    np.testing.assert_array_equal(session(rt, options=options).run(["Y"], {"X": X})[0], X * 10)
    unused = rt.SessionOptions()
    unused.add_initializer("not_in_the_model", value)
    np.testing.assert_array_equal(session(rt, options=unused).run(["Y"], {"X": X})[0], X * 3)
    with pytest.raises(RuntimeError):
        rt.SessionOptions().add_initializer("W", weights)  # an array, not an OrtValue


def test_add_external_initializers_supplies_external_data(rt, tmp_path):
    onnx.save(scale_model(), str(tmp_path / "m.onnx"), save_as_external_data=True,
              location="w.bin", size_threshold=0)  # fmt: skip
    options = rt.SessionOptions()
    weights = rt.OrtValue.ortvalue_from_numpy(np.full((2,), 7, np.float32))
    options.add_external_initializers(["W"], [weights])
    sess = rt.InferenceSession(str(tmp_path / "m.onnx"), options, providers=CPU)
    np.testing.assert_array_equal(sess.run(["Y"], {"X": X})[0], X * 7)
    inline = rt.SessionOptions()
    inline.add_external_initializers(["W"], [weights])
    with pytest.raises(capi(rt).Fail):
        session(rt, scale_model(), inline)  # W's data is inside this model


def test_free_dimension_overrides_fix_symbolic_dims(rt):
    options = rt.SessionOptions()
    options.add_free_dimension_override_by_name("batch", 3)
    sess = session(rt, options=options)
    assert sess.get_inputs()[0].shape == [3, 2]
    assert sess.get_outputs()[0].shape == [3, 2]
    with pytest.raises(capi(rt).InvalidArgument):
        sess.run(None, {"X": X})
    assert sess.run(["Y"], {"X": np.ones((3, 2), np.float32)})[0].shape == (3, 2)


def test_the_optimized_model_is_written_and_every_runtime_loads_it(rt, tmp_path):
    model_path = tmp_path / "model.onnx"
    onnx.save(folding_model(), str(model_path))
    before = model_path.read_bytes()
    options = rt.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    # past BASIC, onnxruntime writes ops only it has (its file says so in a warning)
    options.graph_optimization_level = rt.GraphOptimizationLevel.ORT_ENABLE_BASIC
    x = np.random.default_rng(1).standard_normal((1, 2, 5, 5)).astype(np.float32)
    expected = rt.InferenceSession(str(model_path), options, providers=CPU).run(None, {"X": x})[0]
    assert model_path.read_bytes() == before
    written = onnx.load(str(tmp_path / "optimized.onnx"))
    assert len(written.graph.node) < 4  # A + B was folded
    for other in (onnxruntime, nxrt):
        got = other.InferenceSession(str(tmp_path / "optimized.onnx"), providers=CPU).run(
            None, {"X": x}
        )[0]
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_nxrt_writes_an_optimized_model_onnxruntime_loads_at_every_level(tmp_path):
    options = nxrt.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    sess = nxrt.InferenceSession(folding_model(), options, providers=CPU)
    assert "pkg.nxrt" in {n.domain for n in sess._model.graph}  # the session runs its fusion
    written = onnx.load(str(tmp_path / "optimized.onnx"))
    assert {n.domain for n in written.graph.node} == {""} and len(written.graph.node) == 3
    x = np.random.default_rng(2).standard_normal((1, 2, 5, 5)).astype(np.float32)
    expected = sess.run(None, {"X": x})[0]
    got = onnxruntime.InferenceSession(str(tmp_path / "optimized.onnx"), providers=CPU).run(
        None, {"X": x}
    )[0]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_nxrt_never_writes_the_optimized_model_over_its_input(tmp_path):
    path = tmp_path / "model.onnx"
    onnx.save(folding_model(), str(path))
    before = path.read_bytes()
    options = nxrt.SessionOptions()
    options.optimized_model_filepath = str(path)
    with pytest.raises(nxrt.errors.InvalidArgument, match="never overwritten"):
        nxrt.InferenceSession(str(path), options, providers=CPU)
    assert path.read_bytes() == before


# -- RunOptions ---------------------------------------------------------------------------------
def test_run_options_have_onnxruntimes_defaults(rt):
    options = rt.RunOptions()
    assert (options.log_severity_level, options.log_verbosity_level, options.logid) == (-1, 0, "")
    assert options.terminate is False and options.only_execute_path_to_fetches is False


def test_a_run_with_terminate_set_fails(rt):
    sess = session(rt)
    options = rt.RunOptions()
    options.terminate = True
    with pytest.raises(capi(rt).Fail):
        sess.run(None, {"X": X}, options)
    options.terminate = False
    np.testing.assert_array_equal(sess.run(["Y"], {"X": X}, options)[0], X * 3)


class StoppingPlugin:
    """An EP ``stopping`` whose Relu sets ``RunOptions.terminate`` while the run goes on."""

    def __init__(self, options) -> None:
        self.calls = []
        self.ops = OpRegistry("stopping")

        @self.ops.op("Relu", since=(6, 13, 14))
        def relu(x, /):
            self.calls.append("Relu")
            options.terminate = True
            return np.maximum(x, 0)

    @nxrt.hookimpl
    def nxrt_register(self, registry):
        registry.add_provider("stopping", lambda config: ExecutionProvider(config, self.ops))
        registry.add_kernels("stopping", self.ops)


def test_nxrt_stops_a_run_between_kernels_when_terminate_is_set(nxrt_pm):
    import nxrt_ep_cpu.plugin

    nxrt_pm.register(nxrt_ep_cpu.plugin, name="cpu")
    options = nxrt.RunOptions()
    plugin = StoppingPlugin(options)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["y"])]
    model = helper.make_model(
        helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)]
    )
    with register_plugin(nxrt_pm, plugin, "stopping"):
        sess = nxrt.InferenceSession(model, providers=["stopping"], plugin_manager=nxrt_pm)
        assert [p.ep for p in sess.get_partition().nodes] == ["stopping", "cpu"]
        with pytest.raises(capi(nxrt).Fail, match="terminate"):
            sess.run(None, {"x": np.ones(2, np.float32)}, options)
    assert plugin.calls == ["Relu"]  # stopped before Neg


def test_only_the_path_to_the_fetches_can_be_run(rt):
    options = rt.RunOptions()
    options.only_execute_path_to_fetches = True
    sess = session(rt, two_branch_model())
    x = np.arange(6, dtype=np.float32) - 3
    (y,) = sess.run(["Y"], {"X": x, "S": np.array([2, 3])}, options)
    np.testing.assert_array_equal(y, np.maximum(x, 0))


def test_nxrt_skips_the_kernels_the_fetches_do_not_need():
    options = nxrt.RunOptions()
    options.only_execute_path_to_fetches = True
    sess = session(nxrt, two_branch_model())
    feeds = {"X": np.ones(6, np.float32), "S": np.array([4, 4])}  # Reshape would fail
    np.testing.assert_array_equal(sess.run(["Y"], feeds, options)[0], np.ones(6, np.float32))
    with pytest.raises(nxrt.errors.KernelFailed):
        sess.run(["Y"], feeds)


# -- other ways to run --------------------------------------------------------------------------
def test_run_async_calls_back_with_results_user_data_and_error(rt):
    sess = session(rt)
    done, got = threading.Event(), []

    def callback(results, user_data, error):
        got.append((results, user_data, error))
        done.set()

    assert sess.run_async(["Y"], {"X": X}, callback, "mine") is None
    assert done.wait(10)
    (results, user_data, error), = got  # fmt: skip
    np.testing.assert_array_equal(results[0], X * 3)
    assert (user_data, error) == ("mine", "")
    done.clear()
    got.clear()
    sess.run_async(["Y"], {"X": np.ones((2, 3), np.float32)}, callback, "mine")
    assert done.wait(10)
    assert got[0][0] == [] and got[0][1] == "mine" and got[0][2]
    with pytest.raises(ValueError, match="Required inputs"):
        sess.run_async(None, {}, callback, None)


def test_run_with_ort_values_returns_ortvalues(rt):
    sess = session(rt)
    (y,) = sess.run_with_ort_values(["Y"], {"X": rt.OrtValue.ortvalue_from_numpy(X)})
    assert isinstance(y, rt.OrtValue) and y.device_name() == "cpu"
    np.testing.assert_array_equal(y.numpy(), X * 3)
    assert len(sess.run_with_ort_values(None, {"X": rt.OrtValue.ortvalue_from_numpy(X)})) == 2


def test_profiling_start_time_and_end(rt, tmp_path):
    assert session(rt).get_profiling_start_time_ns() == 0
    assert session(rt).end_profiling() == ""
    options = rt.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(tmp_path / "trace")
    sess = session(rt, options=options)
    assert sess.get_profiling_start_time_ns() > 0
    sess.run(None, {"X": X})
    path = sess.end_profiling()
    assert os.path.exists(path) and os.path.basename(path).startswith("trace")
    assert sess.end_profiling() == ""


def test_fallback_switches_and_keyword(rt):
    sess = rt.InferenceSession(scale_model().SerializeToString(), providers=CPU, enable_fallback=0)
    sess.disable_fallback()
    sess.enable_fallback()
    assert sess.run(["Y"], {"X": X})[0].shape == (2, 2)


# -- IOBinding ----------------------------------------------------------------------------------
def test_iobinding_reads_a_bound_host_array_in_place(rt):
    sess = session(rt)
    x = X.copy()
    binding = sess.io_binding()
    binding.bind_cpu_input("X", x)
    binding.bind_output("Y")
    sess.run_with_iobinding(binding)
    (out,) = binding.get_outputs()
    assert isinstance(out, rt.OrtValue)
    assert (out.shape(), out.data_type(), out.device_name()) == ([2, 2], "tensor(float)", "cpu")
    np.testing.assert_array_equal(binding.copy_outputs_to_cpu()[0], X * 3)
    x[:] = 2  # the binding holds the array itself: the next run reads the new values
    sess.run_with_iobinding(binding)
    np.testing.assert_array_equal(binding.copy_outputs_to_cpu()[0], np.full((2, 2), 6))
    binding.synchronize_inputs()
    binding.synchronize_outputs()


def test_iobinding_writes_into_preallocated_outputs(rt):
    sess = session(rt)
    binding = sess.io_binding()
    binding.bind_cpu_input("X", X)
    buffer = np.zeros((2, 2), np.float32)
    binding.bind_output("Y", "cpu", 0, np.float32, list(buffer.shape), buffer.ctypes.data)
    sess.run_with_iobinding(binding)
    np.testing.assert_array_equal(buffer, X * 3)
    value = rt.OrtValue.ortvalue_from_shape_and_type([2, 2], np.float32)
    binding.bind_ortvalue_output("Y", value)
    sess.run_with_iobinding(binding)
    assert binding.get_outputs()[0].data_ptr() == value.data_ptr()
    np.testing.assert_array_equal(value.numpy(), X * 3)
    wrong = np.zeros((3, 2), np.float32)
    binding.bind_output("Y", "cpu", 0, np.float32, list(wrong.shape), wrong.ctypes.data)
    with pytest.raises(RuntimeError):
        sess.run_with_iobinding(binding)


def test_iobinding_binds_raw_host_pointers_and_ortvalues(rt):
    sess = session(rt)
    binding = sess.io_binding()
    x = X.copy()
    binding.bind_input("X", "cpu", 0, np.float32, list(x.shape), x.ctypes.data)
    binding.bind_output("Y")
    sess.run_with_iobinding(binding)
    np.testing.assert_array_equal(binding.copy_outputs_to_cpu()[0], X * 3)
    binding.bind_ortvalue_input("X", rt.OrtValue.ortvalue_from_numpy(X + 1))
    sess.run_with_iobinding(binding)
    np.testing.assert_array_equal(binding.get_outputs()[0].numpy(), (X + 1) * 3)


def test_iobinding_refusals(rt):
    sess = session(rt)
    binding = sess.io_binding()
    with pytest.raises(RuntimeError):
        binding.bind_cpu_input("bogus", X)
    binding.bind_cpu_input("X", X)
    binding.bind_output("bogus")  # refused when the binding runs
    with pytest.raises(RuntimeError):
        sess.run_with_iobinding(binding)
    binding.clear_binding_outputs()
    with pytest.raises(RuntimeError):  # no output bound
        sess.run_with_iobinding(binding)
    binding.bind_output("Y")
    binding.clear_binding_outputs()
    with pytest.raises(RuntimeError):
        sess.run_with_iobinding(binding)
    binding.bind_output("Y")
    binding.bind_cpu_input("X", X.astype(np.float64))
    with pytest.raises(RuntimeError):
        sess.run_with_iobinding(binding)
    with pytest.raises(ValueError):
        session(rt).run_with_iobinding(binding)  # another session's binding
    with pytest.raises(ValueError):
        binding.bind_output("Y", "cpu", 0, None, None, X.ctypes.data)  # a buffer, no type


@pytest.mark.parametrize("ep", ["cpu", "mlx", "openvino", "legacy_abi"])
def test_nxrt_iobinding_on_every_installed_ep(ep):
    """Host bindings on each shipped EP: inputs read in place, outputs written into the
    caller's buffer, run after run."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Sigmoid", ["r"], ["y"])]
    model = helper.make_model(
        helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)]
    )
    sess = nxrt.InferenceSession(model, providers=[ep])
    assert any(p.ep == ep for p in sess.get_partition().nodes), f"{ep} ran no node"
    array = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    out = np.zeros((2, 3), np.float32)
    binding = sess.io_binding()
    binding.bind_cpu_input("x", array)
    binding.bind_output("y", "cpu", 0, np.float32, [2, 3], out.ctypes.data)
    for scale in (1, -2):
        array[:] = scale * np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
        sess.run_with_iobinding(binding)
        np.testing.assert_allclose(out, 1 / (1 + np.exp(-np.maximum(array, 0))), rtol=1e-5)
        assert binding.get_outputs()[0].data_ptr() == out.ctypes.data


def test_nxrt_iobinding_keeps_values_on_a_device_ep(nxrt_pm, monkeypatch):
    """Bound on the toy device, an input reaches the toy EP run after run with no copy from
    the host, and an output bound to the device stays there."""
    import nxrt.ort.ortvalue

    monkeypatch.setattr(nxrt.ort.ortvalue, "_device_eps", {})
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    model = helper.make_model(
        helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    default = nxrt.default_plugin_manager()
    with register_plugin(default, ToyPlugin(device=True), "toy"):
        sess = nxrt.InferenceSession(model, providers=["toy"])
        value = nxrt.OrtValue.ortvalue_from_numpy(np.array([-1, 2], np.float32), "toydev")
        assert isinstance(value.value, DeviceArray) and value.device_name() == "toydev"
        from toy_plugin import ToyDeviceEP

        copies = []
        original = ToyDeviceEP.copy_from_host
        monkeypatch.setattr(
            ToyDeviceEP, "copy_from_host", lambda ep, a: copies.append(1) or original(ep, a)
        )
        binding = sess.io_binding()
        binding.bind_ortvalue_input("x", value)
        binding.bind_output("y", "toydev")
        for _ in range(2):
            sess.run_with_iobinding(binding)
        assert copies == []
        (out,) = binding.get_outputs()
        assert isinstance(out.value, DeviceArray) and out.device_name() == "toydev"
        np.testing.assert_array_equal(out.numpy(), [0, 2])
        np.testing.assert_array_equal(binding.copy_outputs_to_cpu()[0], [0, 2])
        np.testing.assert_array_equal(sess.run(None, {"x": value})[0], [0, 2])  # run: on host
        (kept,) = sess.run_with_ort_values(None, {"x": value})
        assert kept.device_name() == "toydev"


def test_nxrt_iobinding_on_the_mlx_ep_takes_mlx_arrays_through_dlpack():
    mx = pytest.importorskip("mlx.core", reason="the mlx EP is installed by `make test`")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    model = helper.make_model(
        helper.make_graph(
            [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["y"])],
            "g",
            [x],
            [y],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    sess = nxrt.InferenceSession(model, providers=["mlx"])
    array = mx.arange(6, dtype=mx.float32).reshape(2, 3) - 2
    value = nxrt.OrtValue.from_dlpack(array)
    binding = sess.io_binding()
    binding.bind_ortvalue_input("x", value)
    binding.bind_output("y", value.device_name())
    sess.run_with_iobinding(binding)
    expected = -np.maximum(np.arange(6, dtype=np.float32).reshape(2, 3) - 2, 0)
    np.testing.assert_array_equal(binding.get_outputs()[0].numpy(), expected)
    if value.device_name() == "cpu":  # unified memory: numpy sees MLX's buffer, no copy
        assert not value.numpy().flags.owndata


# -- OrtValue -----------------------------------------------------------------------------------
def test_an_ortvalue_from_numpy_shares_its_memory(rt):
    array = X.copy()
    value = rt.OrtValue.ortvalue_from_numpy(array)
    assert (value.shape(), value.data_type(), value.element_type()) == ([2, 2], "tensor(float)", 1)
    assert value.device_name() == "cpu" and value.is_tensor() and value.has_value()
    assert not value.is_tensor_sequence() and not value.is_sparse_tensor()
    assert value.tensor_size_in_bytes() == 16 and value.data_ptr() == array.ctypes.data
    assert np.shares_memory(value.numpy(), array) and np.shares_memory(np.asarray(value), array)
    value.update_inplace(np.full((2, 2), 5, np.float32))
    np.testing.assert_array_equal(array, np.full((2, 2), 5))
    with pytest.raises(RuntimeError):
        value.update_inplace(np.zeros(3, np.float32))


def test_ortvalues_from_shapes_types_and_dlpack(rt):
    value = rt.OrtValue.ortvalue_from_shape_and_type([2, 3], np.float32)
    assert value.shape() == [2, 3] and value.data_type() == "tensor(float)"
    value = rt.OrtValue.ortvalue_from_shape_and_type([4], TensorProto.INT64)
    assert value.data_type() == "tensor(int64)"
    bf16 = rt.OrtValue.ortvalue_from_numpy_with_onnx_type(
        np.zeros(3, np.uint16), TensorProto.BFLOAT16
    )
    assert bf16.data_type() == "tensor(bfloat16)"
    source = np.arange(3.0)
    shared = rt.OrtValue.from_dlpack(source)
    assert shared.data_type() == "tensor(double)" and shared.data_ptr() == source.ctypes.data
    np.testing.assert_array_equal(np.from_dlpack(shared), source)
    assert shared.__dlpack_device__() == (1, 0)
    sess = session(rt)
    made = sess.create_ortvalue_from_shape_and_type([2, 2], np.float32, "cpu")
    assert made.shape() == [2, 2]


def test_no_memory_on_a_device_no_installed_ep_has(rt):
    with pytest.raises(RuntimeError):
        rt.OrtValue.ortvalue_from_numpy(X, "cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(RuntimeError):
            rt.OrtValue.ortvalue_from_shape_and_type([2], np.float32, "cuda")


def test_nxrt_copy_tensors_copies_into_the_targets_memory():
    # onnxruntime 1.32 copies only between plugin-EP devices (host to host has no transfer)
    target = np.zeros((2, 2), np.float32)
    source = nxrt.OrtValue.ortvalue_from_numpy(X)
    nxrt.copy_tensors([source], [nxrt.OrtValue.ortvalue_from_numpy(target)], None)
    np.testing.assert_array_equal(target, X)


def test_what_a_cpu_build_reports_it_lacks(rt):
    assert rt.has_collective_ops() is False
    assert session(rt).get_tuning_results() == []
    defaults = capi(rt).get_default_session_options()
    assert defaults.graph_optimization_level == rt.GraphOptimizationLevel.ORT_ENABLE_ALL


def test_dimensions_the_model_leaves_unnamed_are_none(rt):
    # y's shape is inferred: its first dimension has no name (onnx calls it unk__0); a name
    # the model itself gives, even one that looks generated, is kept
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Relu", ["z"], ["w"])],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3]),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", "unk__7"]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("w", TensorProto.FLOAT, None),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = rt.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert [i.shape for i in session.get_inputs()] == [[None, 3], ["batch", "unk__7"]]
    assert [o.shape for o in session.get_outputs()] == [[None, 3], ["batch", "unk__7"]]

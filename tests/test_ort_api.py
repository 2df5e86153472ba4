"""The rest of onnxruntime's Python API, run unchanged on nxrt (``import nxrt as onnxruntime``).

Like tests/test_ort_compat.py, each test is parametrized over both runtimes
and asserts onnxruntime's behaviour, so a difference fails on one side: the
installed onnxruntime is the oracle. This file covers the plugin-EP API (EP
devices, EP libraries, graph assignment), devices and memory (``OrtDevice``,
memory infos, arenas, sparse tensors, DLPack capsules), LoRA adapters, the
optimized model's external initializers, session options from the model, and
the error texts code matches on. Tests of what only nxrt has say so in their
names. docs/onnxruntime-compat.md is the table of what each name does.
"""

from __future__ import annotations

import ctypes.util
import gc
import importlib
import json
import os
import shutil
import subprocess
import warnings

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import nxrt
from nxrt.tools.testing import register_plugin

CPU = ["CPUExecutionProvider"]
X = np.ones((2, 2), np.float32)


@pytest.fixture(params=["onnxruntime", "nxrt"])
def rt(request):
    """The runtime under test, imported as code written for onnxruntime imports it."""
    return {"onnxruntime": onnxruntime, "nxrt": nxrt}[request.param]


def capi(rt):
    return rt.capi.onnxruntime_pybind11_state


def opset(*nodes, inputs, outputs, initializers=(), props=None) -> onnx.ModelProto:
    model = helper.make_model(
        helper.make_graph(list(nodes), "g", inputs, outputs, list(initializers)),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    if props:
        helper.set_model_props(model, props)
    return model


def add_mul_add() -> onnx.ModelProto:
    """onnxruntime's add_mul_add.onnx: three named nodes in a chain."""
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 2])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 2])
    nodes = [
        helper.make_node("Add", ["X", "X"], ["a"], name="add_0"),
        helper.make_node("Mul", ["a", "X"], ["m"], name="mul_0"),
        helper.make_node("Add", ["m", "X"], ["Y"], name="add_1"),
    ]
    return opset(*nodes, inputs=[x], outputs=[y])


def lora_model() -> onnx.ModelProto:
    """Y = X * A + B + C: A an initializer listed as an input (an adapter may replace it),
    B a required input, C a plain constant (an adapter may not)."""
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 2])
    a = helper.make_tensor_value_info("A", TensorProto.FLOAT, [2])
    b = helper.make_tensor_value_info("B", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 2])
    nodes = [
        helper.make_node("Mul", ["X", "A"], ["t"]),
        helper.make_node("Add", ["t", "B"], ["u"]),
        helper.make_node("Add", ["u", "C"], ["Y"]),
    ]
    inits = [
        numpy_helper.from_array(np.full(2, 3, np.float32), "A"),
        numpy_helper.from_array(np.ones(2, np.float32), "C"),
    ]
    return opset(*nodes, inputs=[x, a, b], outputs=[y], initializers=inits)


# -- EP devices --------------------------------------------------------------------------------
def cpu_device(rt):
    (device,) = [d for d in rt.get_ep_devices() if d.ep_name == "CPUExecutionProvider"]
    return device


def test_every_ep_device_describes_its_ep_and_hardware(rt):
    device = cpu_device(rt)
    assert isinstance(device.ep_vendor, str) and device.ep_vendor
    assert isinstance(device.ep_metadata, dict) and isinstance(device.ep_options, dict)
    hardware = device.device
    assert hardware.type == rt.OrtHardwareDeviceType.CPU
    assert isinstance(hardware.vendor, str) and isinstance(hardware.vendor_id, int)
    assert hardware.device_id == 0 and isinstance(hardware.metadata, dict)
    assert device.memory_info(rt.OrtDeviceMemoryType.DEFAULT) is None  # the host's memory
    with pytest.raises(RuntimeError):
        device.create_sync_stream()
    assert capi(rt).OrtEpDevice is type(device)


def test_nxrt_lists_each_installed_ep_as_one_device():
    devices = nxrt.get_ep_devices()
    assert [d.ep_name for d in devices] == nxrt.get_available_providers()
    assert {d.ep_id for d in devices} >= {"cpu"}


def test_a_session_takes_ep_devices(rt):
    options = rt.SessionOptions()
    options.add_provider_for_devices([cpu_device(rt)], {})
    assert options.has_providers()
    sess = rt.InferenceSession(add_mul_add().SerializeToString(), options)
    assert sess.get_providers() == CPU
    (device,) = sess.get_input_epdevices()
    assert device.ep_name == "CPUExecutionProvider"
    np.testing.assert_array_equal(sess.run(None, {"X": X})[0], X * 3)
    with pytest.raises(capi(rt).InvalidArgument, match="Must provide one or more OrtEpDevice"):
        rt.SessionOptions().add_provider_for_devices([], {})
    with pytest.raises(TypeError):
        rt.SessionOptions().add_provider_for_devices(["CPUExecutionProvider"], {})


def test_the_graph_assignment_is_reported_per_node(rt):
    options = rt.SessionOptions()
    options.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    sess = rt.InferenceSession(add_mul_add().SerializeToString(), options, providers=CPU)
    subgraphs = sess.get_provider_graph_assignment_info()
    assert len(subgraphs) == 3
    assert all(s.ep_name == "CPUExecutionProvider" and len(s.get_nodes()) == 1 for s in subgraphs)
    ids = {f"{n.domain}:{n.op_type}/{n.name}" for s in subgraphs for n in s.get_nodes()}
    assert ids == {":Add/add_0", ":Add/add_1", ":Mul/mul_0"}
    plain = rt.InferenceSession(add_mul_add().SerializeToString(), providers=CPU)
    with pytest.raises(
        capi(rt).Fail,
        match="Session configuration entry 'session.record_ep_graph_assignment_info' must be "
        'set to "1"',
    ):
        plain.get_provider_graph_assignment_info()


def test_nxrt_reports_a_compiled_partition_as_one_subgraph():
    options = nxrt.SessionOptions()
    options.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    sess = nxrt.InferenceSession(add_mul_add(), options, providers=["legacy_abi"])
    (subgraph,) = sess.get_provider_graph_assignment_info()
    assert subgraph.ep_name == "legacy_abi"
    assert [n.name for n in subgraph.get_nodes()] == ["add_0", "mul_0", "add_1"]


# -- EP libraries --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def stub_library(tmp_path_factory):
    """A library exporting ONNX Runtime's plugin-EP entry points and offering no EP."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc builds the stub plugin-EP library")
    folder = tmp_path_factory.mktemp("ep_library")
    source = folder / "stub.c"
    source.write_text(
        "#include <stddef.h>\n"
        "void* CreateEpFactories(const char* n, const void* a, const void* l, void** f,\n"
        "                        size_t max, size_t* count) { *count = 0; return NULL; }\n"
        "void* ReleaseEpFactory(void* f) { return NULL; }\n"
    )
    library = folder / "libstub_ep.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    return str(library)


def test_an_ep_library_is_registered_once_and_unregistered(rt, stub_library, tmp_path):
    name = f"stub_{rt.__name__}"  # onnxruntime's registrations are per process
    rt.register_execution_provider_library(name, stub_library)
    try:
        with pytest.raises(capi(rt).Fail, match="already registered"):
            rt.register_execution_provider_library(name, stub_library)
    finally:
        rt.unregister_execution_provider_library(name)
    with pytest.raises(capi(rt).Fail, match=f"Execution provider library: {name} was not"):
        rt.unregister_execution_provider_library(name)
    with pytest.raises(capi(rt).Fail, match="Failed to load library"):
        rt.register_execution_provider_library("absent", str(tmp_path / "absent.so"))
    libm = ctypes.util.find_library("m")
    libm = next(
        (p for p in ("/lib/x86_64-linux-gnu/libm.so.6", libm) if p and os.path.isabs(p)), ""
    )
    if libm:
        with pytest.raises(capi(rt).Fail, match="CreateEpFactories"):
            rt.register_execution_provider_library("libm", libm)


def test_nxrt_runs_a_registered_library_through_legacy_abi(stub_library):
    nxrt.register_execution_provider_library("stub_nxrt_ep", stub_library)
    try:
        (device,) = [d for d in nxrt.get_ep_devices() if d.ep_id == "legacy_abi_stub_nxrt_ep"]
        assert device.ep_name == "legacy_abi_stub_nxrt_ep"
        # ONNX Runtime loads the library for the EP, and finds that it offers no device
        with pytest.raises(nxrt.errors.EpLoadFailed, match="offers no device"):
            nxrt.InferenceSession(add_mul_add(), providers=["stub_nxrt_ep"])
    finally:
        nxrt.unregister_execution_provider_library("stub_nxrt_ep")
    assert all(d.ep_id != "legacy_abi_stub_nxrt_ep" for d in nxrt.get_ep_devices())


def test_nxrt_hands_registered_libraries_to_every_plugin(nxrt_pm, stub_library):
    seen = []

    class Reader:
        @nxrt.hookimpl
        def nxrt_register(self, registry):
            seen.append(dict(registry.ep_libraries))

    with register_plugin(nxrt_pm, Reader(), "reader"):
        nxrt.register_execution_provider_library("lib", stub_library, plugin_manager=nxrt_pm)
        nxrt.get_ep_devices(nxrt_pm)
        assert seen[-1] == {"lib": stub_library}
        nxrt.unregister_execution_provider_library("lib", plugin_manager=nxrt_pm)
        nxrt.get_ep_devices(nxrt_pm)
        assert seen[-1] == {}


# -- devices and memory ------------------------------------------------------------------------
def test_ort_devices_by_name(rt):
    cpu = rt.OrtDevice.make("cpu", 0)
    assert (cpu.device_id(), cpu.device_type(), cpu.device_mem_type()) == (0, 0, 0)
    assert cpu.device_vendor_id() == rt.OrtDeviceVendorId.NONE
    cuda = rt.OrtDevice.make("cuda", 0)
    assert (
        cuda.device_type() == 1 and cuda.device_vendor_id() == rt.OrtDeviceVendorId.NVIDIA == 0x10DE
    )
    assert rt.OrtDevice.make("cuda", 1, 7).device_vendor_id() == 7
    numbers = capi(rt).OrtDevice
    assert (numbers.cpu(), numbers.gpu(), numbers.fpga(), numbers.npu(), numbers.dml()) == (
        0,
        1,
        2,
        3,
        4,
    )
    assert numbers.default_memory() == 0
    with pytest.raises(Exception, match="Unsupported device type: tpu"):
        rt.OrtDevice.make("tpu", 0)


def test_memory_infos_name_their_device_memory(rt):
    info = rt.OrtMemoryInfo(
        "Cpu", rt.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, rt.OrtMemType.DEFAULT
    )
    assert (info.name, info.device_id, info.device_vendor_id) == ("Cpu", 0, 0)
    assert info.mem_type == rt.OrtMemType.DEFAULT
    assert info.allocator_type == rt.OrtAllocatorType.ORT_ARENA_ALLOCATOR
    assert info.device_mem_type == rt.OrtDeviceMemoryType.DEFAULT
    made = rt.OrtMemoryInfo.create_v2(
        "Test",
        rt.OrtMemoryInfoDeviceType.CPU,
        0,
        0,
        rt.OrtDeviceMemoryType.DEFAULT,
        128,
        rt.OrtAllocatorType.ORT_ARENA_ALLOCATOR,
    )
    assert (made.name, made.device_id, made.mem_type) == ("Test", 0, rt.OrtMemType.DEFAULT)
    assert made.allocator_type == rt.OrtAllocatorType.ORT_ARENA_ALLOCATOR
    pinned = rt.OrtMemoryInfo.create_v2(
        "Pinned",
        rt.OrtMemoryInfoDeviceType.GPU,
        0x10DE,
        1,
        rt.OrtDeviceMemoryType.HOST_ACCESSIBLE,
        0,
        rt.OrtAllocatorType.ORT_DEVICE_ALLOCATOR,
    )
    assert (pinned.device_id, pinned.device_vendor_id) == (1, 0x10DE)
    assert pinned.device_mem_type == rt.OrtDeviceMemoryType.HOST_ACCESSIBLE
    assert pinned.mem_type == rt.OrtMemType.CPU_OUTPUT
    sess = rt.InferenceSession(add_mul_add().SerializeToString(), providers=CPU)
    (memory,) = sess.get_input_memory_infos()
    assert memory.name == "Cpu" and memory.device_mem_type == rt.OrtDeviceMemoryType.DEFAULT


def test_arena_settings_and_shared_allocators_are_accepted(rt):
    cfg = rt.OrtArenaCfg(8, 0, 4, 2)
    assert (cfg.max_mem, cfg.arena_extend_strategy) == (8, 0)
    assert (cfg.initial_chunk_size_bytes, cfg.max_dead_bytes_per_chunk) == (4, 2)
    settings = {
        "max_mem": 32,
        "arena_extend_strategy": 11,
        "initial_chunk_size_bytes": 18,
        "max_dead_bytes_per_chunk": 14,
        "initial_growth_chunk_size_bytes": 12,
        "max_power_of_two_extend_bytes": 17,
    }
    cfg = rt.OrtArenaCfg(settings)
    assert {k: getattr(cfg, k) for k in settings} == settings
    assert rt.OrtArenaCfg({}).initial_growth_chunk_size_bytes == -1
    with pytest.raises(RuntimeError, match="Invalid OrtArenaCfg option: bogus"):
        rt.OrtArenaCfg({"bogus": 1})
    cpu = rt.OrtMemoryInfo("Cpu", rt.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, rt.OrtMemType.DEFAULT)
    rt.create_and_register_allocator(cpu, None)
    rt.create_and_register_allocator(cpu, rt.OrtArenaCfg(0, -1, -1, -1))
    options = rt.SessionOptions()
    options.add_session_config_entry("session.use_env_allocators", "1")
    sess = rt.InferenceSession(add_mul_add().SerializeToString(), options, providers=CPU)
    np.testing.assert_array_equal(sess.run(None, {"X": X})[0], X * 3)
    cuda = rt.OrtMemoryInfo(
        "Cuda", rt.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, rt.OrtMemType.DEFAULT
    )
    with pytest.raises(RuntimeError, match="Only CPU devices are supported"):
        rt.create_and_register_allocator(cuda, None)
    with pytest.raises(RuntimeError, match="CUDAExecutionProvider"):
        rt.create_and_register_allocator_v2("CUDAExecutionProvider", cuda, {}, None)


# -- sparse tensors ------------------------------------------------------------------------------
def test_sparse_tensors_in_coo_format(rt):
    device = rt.OrtDevice.make("cpu", 0)
    values = np.array([1.0, 2.0, 3.0], np.float32)
    indices = np.array([3, 5, 15], np.int64)
    sparse = rt.SparseTensor.sparse_coo_from_numpy([9, 9], values, indices, device)
    assert sparse.format() == rt.OrtSparseFormat.ORT_SPARSE_COO
    assert sparse.dense_shape() == [9, 9]
    assert (sparse.data_type(), sparse.device_name()) == ("sparse_tensor(float)", "cpu")
    got_values, got_indices = sparse.values(), sparse.as_coo_view().indices()
    assert not got_values.flags.writeable and not got_indices.flags.writeable
    gc.collect()
    np.testing.assert_array_equal(got_values, values)
    np.testing.assert_array_equal(got_indices, indices)
    value = rt.OrtValue.ort_value_from_sparse_tensor(sparse)
    assert value.is_sparse_tensor() and not value.is_tensor()
    assert value.data_type() == "sparse_tensor(float)" and value.shape() == [9, 9]
    np.testing.assert_array_equal(value.as_sparse_tensor().values(), values)
    with pytest.raises(RuntimeError):
        rt.OrtValue.ortvalue_from_numpy(values).as_sparse_tensor()
    with pytest.raises(RuntimeError):
        sparse.as_csrc_view()
    coordinates = np.array([[0, 3], [0, 5], [1, 6]], np.int64)
    by_coordinates = rt.SparseTensor.sparse_coo_from_numpy([9, 9], values, coordinates, device)
    np.testing.assert_array_equal(by_coordinates.as_coo_view().indices(), coordinates)
    with pytest.raises(RuntimeError):
        rt.SparseTensor.sparse_coo_from_numpy([9, 9], values, indices[:2], device)
    strings = np.array(["xyz", "yxz", "zyx"], dtype=str)
    named = rt.SparseTensor.sparse_coo_from_numpy([9, 9], strings, indices, device)
    assert named.data_type() == "sparse_tensor(string)"
    assert np.array_equal(named.values(), strings)
    with pytest.raises(RuntimeError):  # neither build here keeps sparse tensors on CUDA
        sparse.to_cuda(rt.OrtDevice.make("cuda", 0))


def test_sparse_tensors_in_csr_format(rt):
    device = rt.OrtDevice.make("cpu", 0)
    values = np.array([1.0, 2.0, 3.0], np.float32)
    inner = np.array([1, 1, 1], np.int64)
    outer = np.array([0, 1, 2, 3, 3, 3, 3, 3, 3, 3], np.int64)
    sparse = rt.SparseTensor.sparse_csr_from_numpy([9, 9], values, inner, outer, device)
    assert sparse.format() == rt.OrtSparseFormat.ORT_SPARSE_CSRC
    assert (sparse.dense_shape(), sparse.data_type()) == ([9, 9], "sparse_tensor(float)")
    view = sparse.as_csrc_view()
    assert not view.inner().flags.writeable and not view.outer().flags.writeable
    np.testing.assert_array_equal(view.inner(), inner)
    np.testing.assert_array_equal(view.outer(), outer)
    strings = np.array(["xyz", "yxz", "zyx"], dtype=str)
    named = rt.SparseTensor.sparse_csr_from_numpy([9, 9], strings, inner, outer, device)
    assert named.data_type() == "sparse_tensor(string)"
    with pytest.raises(RuntimeError):
        sparse.as_coo_view()


# -- values --------------------------------------------------------------------------------------
def test_ortvalues_from_dlpack_capsules(rt):
    array = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], np.float32)
    value = rt.OrtValue.from_dlpack(array.__dlpack__())
    assert value.shape() == [3, 2] and value.data_ptr() == array.ctypes.data
    source = rt.OrtValue.ortvalue_from_numpy(array)
    np.testing.assert_array_equal(rt.OrtValue.from_dlpack(source.__dlpack__()).numpy(), array)
    assert source.__dlpack_device__() == (1, 0)
    again = capi(rt).OrtValue.from_dlpack(source._ortvalue.to_dlpack())
    assert again.data_ptr() == source._ortvalue.data_ptr()
    flags = rt.OrtValue.ortvalue_from_numpy(np.array([True, False, True]))
    assert rt.OrtValue.from_dlpack(flags).numpy().dtype == np.bool_
    small = rt.OrtValue.from_dlpack(rt.OrtValue.ortvalue_from_numpy(np.array([1, 255], np.uint8)))
    assert small.numpy().dtype == np.uint8
    empty = rt.OrtValue.from_dlpack(np.zeros((1, 8, 0, 128), np.float32).__dlpack__())
    assert empty.shape() == [1, 8, 0, 128]


def test_session_owned_outputs_come_back_without_a_copy(rt):
    sess = rt.InferenceSession(add_mul_add().SerializeToString(), providers=CPU)
    (y,) = sess.run(None, {"X": X})
    assert y.base is not None  # the array is a view of the buffer the session computed into


# -- LoRA adapters -------------------------------------------------------------------------------
@pytest.mark.parametrize("writer", ["onnxruntime", "nxrt"])
def test_adapter_files_are_shared_with_onnxruntime(rt, writer, tmp_path):
    """Written by one runtime, read by the other (and by itself)."""
    made = {"onnxruntime": onnxruntime, "nxrt": nxrt}[writer]
    params = {
        "param_1": np.arange(10, dtype=np.float32).reshape(5, 2),
        "param_2": np.arange(10, dtype=np.int64).reshape(2, 5),
        "half": np.ones(3, np.float16),
    }
    adapter = made.AdapterFormat()
    adapter.set_adapter_version(2)
    adapter.set_model_version(3)
    adapter.set_parameters({k: made.OrtValue.ortvalue_from_numpy(v) for k, v in params.items()})
    path = str(tmp_path / "test.onnx_adapter")
    adapter.export_adapter(path)
    read = rt.AdapterFormat.read_adapter(path)
    assert (read.get_format_version(), read.get_adapter_version(), read.get_model_version()) == (
        1,
        2,
        3,
    )
    got = read.get_parameters()
    assert sorted(got) == sorted(params)
    for name, value in got.items():
        assert value.is_tensor() and value.shape() == list(params[name].shape)
        assert (
            value.element_type() == made.OrtValue.ortvalue_from_numpy(params[name]).element_type()
        )
        np.testing.assert_array_equal(value.numpy(), params[name])
    empty = rt.AdapterFormat()
    assert (empty.get_format_version(), empty.get_adapter_version(), empty.get_parameters()) == (
        1,
        0,
        {},
    )


def test_active_adapters_replace_inputs_for_one_run(rt, tmp_path):
    sess = rt.InferenceSession(lora_model().SerializeToString(), providers=CPU)
    b0 = np.zeros(2, np.float32)
    kept = []

    def adapter(**params):
        path = str(tmp_path / f"a{len(kept)}.onnx_adapter")
        written = rt.AdapterFormat()
        written.set_parameters({k: rt.OrtValue.ortvalue_from_numpy(v) for k, v in params.items()})
        written.export_adapter(path)
        loaded = rt.LoraAdapter()
        loaded.Load(path)
        kept.append(loaded)  # onnxruntime's RunOptions do not keep the adapter alive
        return loaded

    def run(*adapters, **feeds):
        options = rt.RunOptions()
        for one in adapters:
            options.add_active_adapter(one)
        return sess.run(None, {"X": X, **feeds}, options)[0][0].tolist()

    ten = np.full(2, 10, np.float32)
    assert run(B=b0) == [4, 4]  # 1 * 3 + 0 + 1
    assert run(adapter(A=ten), B=b0) == [11, 11]
    assert run(adapter(A=ten), B=b0, A=b0) == [11, 11]  # the adapter's A over the feed's
    assert run(adapter(A=ten, B=np.full(2, 100, np.float32)), B=b0) == [111, 111]
    assert run(
        adapter(A=np.full(2, 5, np.float32)), adapter(A=np.full(2, 7, np.float32)), B=b0
    ) == [
        6,
        6,
    ]  # the first adapter added wins
    assert run(B=b0) == [4, 4]  # the model's own A again
    for bad in (dict(C=ten), dict(Nope=ten)):  # a plain constant, a name the model lacks
        with pytest.raises(capi(rt).InvalidArgument, match="Invalid input name"):
            run(adapter(**bad), B=b0)
    for bad in (np.ones(3, np.float32), np.ones(2, np.float64)):
        with pytest.raises(capi(rt).InvalidArgument):
            run(adapter(A=bad), B=b0)
    with pytest.raises(ValueError, match=r"Required inputs \(\['B'\]\) are missing"):
        run(adapter(B=ten))  # an adapter does not stand in for a required feed
    options = rt.RunOptions()
    options.add_active_adapter(adapter(A=ten))
    feeds = {"X": rt.OrtValue.ortvalue_from_numpy(X), "B": rt.OrtValue.ortvalue_from_numpy(b0)}
    assert sess.run_with_ort_values(None, feeds, options)[0].numpy()[0].tolist() == [11, 11]


# -- saving and loading models -------------------------------------------------------------------
def matmul_model() -> tuple[onnx.ModelProto, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 32)).astype(np.float32)
    b = rng.standard_normal(32).astype(np.float32)
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 64])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 32])
    nodes = [
        helper.make_node("MatMul", ["X", "W"], ["t"]),
        helper.make_node("Add", ["t", "B"], ["Y"]),
    ]
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")]
    return opset(*nodes, inputs=[x], outputs=[y], initializers=inits), w, b


def save_optimized(rt, source, path, data_file, min_size):
    options = rt.SessionOptions()
    options.optimized_model_filepath = str(path)
    options.add_session_config_entry(
        "session.optimized_model_external_initializers_file_name", data_file
    )
    options.add_session_config_entry(
        "session.optimized_model_external_initializers_min_size_in_bytes", str(min_size)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rt.InferenceSession(str(source), options, providers=CPU)


def test_the_optimized_model_keeps_large_initializers_in_a_file(rt, tmp_path):
    model, w, b = matmul_model()
    onnx.save(model, tmp_path / "mm.onnx")
    out = tmp_path / "out"
    out.mkdir()
    save_optimized(rt, tmp_path / "mm.onnx", out / "opt.onnx", "weights.bin", 1000)
    assert sorted(os.listdir(out)) == ["opt.onnx", "weights.bin"]  # next to the model
    saved = onnx.load(out / "opt.onnx", load_external_data=False)
    where = {t.name: t.data_location for t in saved.graph.initializer}
    assert where == {"W": TensorProto.EXTERNAL, "B": TensorProto.DEFAULT}  # B: 128 bytes
    x = np.random.default_rng(1).standard_normal((1, 64)).astype(np.float32)
    for reader in (onnxruntime, nxrt):
        sess = reader.InferenceSession(str(out / "opt.onnx"), providers=CPU)
        np.testing.assert_allclose(sess.run(None, {"X": x})[0], x @ w + b, rtol=1e-5, atol=1e-5)


def test_an_optimized_model_of_external_data_is_saved_with_its_own(rt, tmp_path, monkeypatch):
    model, w, b = matmul_model()
    monkeypatch.chdir(tmp_path)
    onnx.save(model, "orig.onnx", save_as_external_data=True, location="orig.bin", size_threshold=0)
    save_optimized(rt, "orig.onnx", "opt_1.onnx", "opt_1.bin", 100)
    save_optimized(rt, "opt_1.onnx", "opt_2.onnx", "opt_2.bin", 10)
    assert os.path.isfile("opt_2.bin")
    os.remove("opt_1.onnx")
    os.remove("opt_1.bin")  # the second stands alone
    x = np.ones((1, 64), np.float32)
    sess = rt.InferenceSession("opt_2.onnx", providers=CPU)
    np.testing.assert_allclose(sess.run(None, {"X": x})[0], x @ w + b, rtol=1e-5, atol=1e-5)


def external_data_model() -> onnx.ModelProto:
    """Y = X + C, with C's 12 bytes in a file ``C_not_on_disk.bin`` the caller provides."""
    constant = TensorProto(name="C", data_type=TensorProto.FLOAT, dims=[3])
    constant.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "C_not_on_disk.bin"), ("offset", "0"), ("length", "12")):
        entry = constant.external_data.add()
        entry.key, entry.value = key, value
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 3])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 3])
    node = helper.make_node("Add", ["X", "C"], ["Y"])
    return opset(node, inputs=[x], outputs=[y], initializers=[constant])


def test_external_data_files_can_come_from_memory(rt, tmp_path):
    onnx.save(external_data_model(), tmp_path / "ext.onnx")
    data = np.array([1, 2, 3], np.float32).tobytes()
    for source in (str(tmp_path / "ext.onnx"), external_data_model().SerializeToString()):
        options = rt.SessionOptions()
        options.add_external_initializers_from_files_in_memory(
            ["C_not_on_disk.bin"], [data], [len(data)]
        )
        sess = rt.InferenceSession(source, options, providers=CPU)
        assert sess.run(None, {"X": np.ones((1, 3), np.float32)})[0].tolist() == [[2, 3, 4]]
        options = rt.SessionOptions()  # or the initializer itself, its file never read
        constant = rt.OrtValue.ortvalue_from_numpy(np.array([1, 2, 3], np.float32))
        options.add_external_initializers(["C"], [constant])
        sess = rt.InferenceSession(source, options, providers=CPU)
        assert sess.run(None, {"X": np.ones((1, 3), np.float32)})[0].tolist() == [[2, 3, 4]]
    with pytest.raises(capi(rt).Fail):  # without either, the file is missing
        rt.InferenceSession(str(tmp_path / "ext.onnx"), providers=CPU)


def test_free_dimensions_are_fixed_by_denotation(rt):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["Dim1", "Dim2", 5])
    x.type.tensor_type.shape.dim[0].denotation = "DATA_BATCH"
    x.type.tensor_type.shape.dim[1].denotation = "DATA_CHANNEL"
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["Dim1", "Dim2", 5])
    model = opset(helper.make_node("Abs", ["x"], ["y"]), inputs=[x], outputs=[y])
    options = rt.SessionOptions()
    options.add_free_dimension_override_by_denotation("DATA_BATCH", 3)
    options.add_free_dimension_override_by_denotation("DATA_CHANNEL", 5)
    sess = rt.InferenceSession(model.SerializeToString(), options, providers=CPU)
    assert sess.get_inputs()[0].shape == [3, 5, 5] and sess.get_outputs()[0].shape == [3, 5, 5]
    with pytest.raises(capi(rt).InvalidArgument):
        sess.run(None, {"x": np.ones((2, 5, 5), np.float32)})


def test_session_options_can_come_from_the_model(rt, monkeypatch, tmp_path):
    config = {
        "session_options": {
            "inter_op_num_threads": 5,
            "intra_op_num_threads": 2,
            "graph_optimization_level": 99,
            "enable_profiling": 1,
            "not_an_option_it_reads": 1,
        }
    }
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2])
    model = opset(
        helper.make_node("Abs", ["X"], ["Y"]),
        inputs=[x],
        outputs=[y],
        props={"ort_config": json.dumps(config)},
    )
    monkeypatch.setenv("ORT_LOAD_CONFIG_FROM_MODEL", "1")
    mine = rt.SessionOptions()
    mine.profile_file_prefix = str(tmp_path / "profile")
    sess = rt.InferenceSession(model.SerializeToString(), mine, providers=CPU)
    used = sess.get_session_options()
    assert (used.inter_op_num_threads, used.intra_op_num_threads) == (5, 2)
    assert used.execution_mode == rt.ExecutionMode.ORT_SEQUENTIAL  # not in the config
    assert used.graph_optimization_level == rt.GraphOptimizationLevel.ORT_ENABLE_ALL
    assert used.enable_profiling is True and mine.enable_profiling is False
    os.remove(sess.end_profiling())
    config["session_options"] = {"execution_mode": 7}
    helper.set_model_props(model, {"ort_config": json.dumps(config)})
    with pytest.raises(RuntimeError, match="execution_mode"):
        rt.InferenceSession(model.SerializeToString(), providers=CPU, enable_fallback=False)
    monkeypatch.setenv("ORT_LOAD_CONFIG_FROM_MODEL", "0")
    assert rt.InferenceSession(model.SerializeToString(), providers=CPU).get_providers() == CPU


# -- errors and helpers onnxruntime code relies on ---------------------------------------------
def test_an_unknown_provider_in_set_providers(rt):
    sess = rt.InferenceSession(add_mul_add().SerializeToString(), providers=CPU)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # onnxruntime also warns it is not available
        with pytest.raises(RuntimeError, match="Unknown Provider Type: InvalidProvider"):
            sess.set_providers(["InvalidProvider"])


def test_config_entries_never_set_are_named_as_onnxruntime_names_them(rt):
    with pytest.raises(
        RuntimeError, match="SessionOptions does not have configuration with key: INVALID_KEY"
    ):
        rt.SessionOptions().get_session_config_entry("INVALID_KEY")
    with pytest.raises(RuntimeError, match="RunOptions does not have configuration with key: k"):
        rt.RunOptions().get_run_config_entry("k")


def test_provider_arguments_are_normalized_as_onnxruntime_does(rt):
    collection = importlib.import_module(f"{rt.__name__}.capi.onnxruntime_inference_collection")
    check = collection.check_and_normalize_provider_args
    valid = ["a", "b", "c"]
    assert check(None, None, valid) == ([], [])
    assert check(["a", "b"], None, valid) == (["a", "b"], [{}, {}])
    assert check([("a", {1: 2}), "b"], None, valid) == (["a", "b"], [{"1": "2"}, {}])
    assert check(["a", "b"], [{1: 2}, {}], valid) == (["a", "b"], [{"1": "2"}, {}])
    with pytest.warns(UserWarning):
        assert check(["a", "b", "a"], [{"x": 1}, {}, {"y": 2}], valid) == (
            ["a", "b"],
            [{"x": "1"}, {}],
        )
    with pytest.warns(UserWarning, match="'d'"):
        check(["d"], None, valid)
    for providers, options in (
        (3, None),
        ([3], None),
        (["a"], 3),
        (["a"], ["not dict"]),
        (["a", "b"], [{1: 2}]),
        ([("a", {1: 2})], [{3: 4}]),
    ):
        with pytest.raises(ValueError):
            check(providers, options, valid)
    for name in ("OrtDevice", "SparseTensor", "AdapterFormat", "OrtDeviceVendorId"):
        assert getattr(collection, name) is getattr(rt, name)


def test_the_capi_module_has_the_new_classes(rt):
    state = capi(rt)
    for name in (
        "OrtEpDevice OrtHardwareDevice OrtHardwareDeviceType OrtArenaCfg OrtSparseFormat "
        "SparseTensor AdapterFormat LoraAdapter OrtDeviceMemoryType OrtMemoryInfoDeviceType "
        "OrtEpAssignedNode OrtEpAssignedSubgraph OrtSyncStream get_ep_devices "
        "register_execution_provider_library unregister_execution_provider_library "
        "create_and_register_allocator create_and_register_allocator_v2"
    ).split():
        assert hasattr(state, name), name
        assert hasattr(rt, name), name


# -- numbers -------------------------------------------------------------------------------------
def tree_classifier(modes, values, true_ids, false_ids, leaf_nodes, weights, base=(-0.405,)):
    """onnxruntime's issue 27533: a binary TreeEnsembleClassifier under LOGISTIC."""
    count = len(modes)
    node = helper.make_node(
        "TreeEnsembleClassifier",
        ["X"],
        ["label", "probs"],
        domain="ai.onnx.ml",
        nodes_treeids=[0] * count,
        nodes_nodeids=list(range(count)),
        nodes_featureids=[0] * count,
        nodes_values=values,
        nodes_modes=modes,
        nodes_truenodeids=true_ids,
        nodes_falsenodeids=false_ids,
        nodes_missing_value_tracks_true=[0] * count,
        nodes_hitrates=[1.0] * count,
        class_treeids=[0] * len(weights),
        class_nodeids=leaf_nodes,
        class_ids=[0] * len(weights),
        class_weights=weights,
        classlabels_int64s=[0, 1],
        post_transform="LOGISTIC",
        base_values=list(base),
    )
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 3])
    label = helper.make_tensor_value_info("label", TensorProto.INT64, [None])
    probs = helper.make_tensor_value_info("probs", TensorProto.FLOAT, [None, 2])
    graph = helper.make_graph([node], "tree", [x], [label, probs])
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 15), helper.make_opsetid("ai.onnx.ml", 3)]
    )


@pytest.mark.parametrize(
    "model, score",
    [
        (
            tree_classifier(
                ["BRANCH_LT", "LEAF", "LEAF"],
                [0.5, 0, 0],
                [1, 0, 0],
                [2, 0, 0],
                [1, 2],
                [0.3, -0.3],
            ),
            -0.105,
        ),
        (tree_classifier(["LEAF"], [0.0], [0], [0], [0], [0.0]), -0.405),
        (tree_classifier(["LEAF"], [0.0], [0], [0], [0], [-0.405], base=(0.0,)), -0.405),
        (tree_classifier(["LEAF"], [0.0], [0], [0], [0], [1.5], base=(0.2,)), 1.7),
    ],
    ids=["split", "leaf", "negative-leaf", "positive-leaf"],
)
def test_a_logistic_tree_ensemble_gives_onnxruntimes_probabilities(rt, model, score):
    sess = rt.InferenceSession(model.SerializeToString(), providers=CPU)
    label, probs = sess.run(None, {"X": np.array([[0.1, 0.0, 0.0]], np.float32)})
    p1 = 1 / (1 + np.exp(-score))
    np.testing.assert_allclose(probs[0], [1 - p1, p1], atol=1e-5)
    assert label[0] == (1 if score > 0.5 else 0)

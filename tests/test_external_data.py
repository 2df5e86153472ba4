"""External data: mapped once per file, confined to the model's folder, checked before use."""

from __future__ import annotations

import hashlib
import os

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

import nxrt
from moe_models import add_model, external_tensor, save
from nxrt.errors import InvalidExternalData
from nxrt.pipeline.external_data import (
    ExternalDataRegistry,
    MappedFile,
    external_data_hidden_from_checker,
    has_external_data,
    mapped_file,
    resolve_external_data,
    resolve_location,
    storage_bytes,
)
from nxrt.pipeline.model import load_model
from nxrt.pipeline.weight_binding import resident_array
from nxrt.tools.testing import register_plugin
from nxrt.weight import WeightHandle


@pytest.fixture
def cpu_pm(nxrt_pm):
    import nxrt_ep_cpu.plugin

    with register_plugin(nxrt_pm, nxrt_ep_cpu.plugin, "cpu"):
        yield nxrt_pm


W = np.arange(12, dtype=np.float32).reshape(3, 4)


def session(path, pm, **kwargs):
    return nxrt.InferenceSession(path, providers=["cpu"], plugin_manager=pm, **kwargs)


def digest(folder) -> dict[str, tuple[str, int]]:
    out = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            if os.path.islink(path):
                continue
            with open(path, "rb") as f:
                out[path] = (hashlib.sha256(f.read()).hexdigest(), os.stat(path).st_mtime_ns)
    return out


# -- loading -----------------------------------------------------------------------------------


def test_external_weights_load_through_mmap_from_any_working_directory(tmp_path, cpu_pm):
    folder = tmp_path / "model"
    path = add_model(str(folder), external_tensor("w", W, str(folder)))
    before = digest(tmp_path)
    sess = session(path, cpu_pm)  # the test's working directory is not the model's folder
    x = np.ones((3, 4), np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], x + W)
    assert digest(tmp_path) == before, "the user's files must never be modified"


def test_resident_weight_is_a_zero_copy_read_only_view_of_the_mapping(tmp_path):
    folder = str(tmp_path)
    add_model(folder, external_tensor("w", W, folder))
    model, base = load_model(os.path.join(folder, "model.onnx"))
    handles = resolve_external_data(model, base)
    handle = handles["w"]
    assert isinstance(handle, WeightHandle.Resident)
    array = resident_array(handle.weight)
    np.testing.assert_array_equal(array, W)
    assert not array.flags.writeable
    registry = model.meta["nxrt.pipeline.external_data"]
    (mapping,) = registry._files.values()
    assert np.shares_memory(array, mapping._buffer)
    # The initializer's tensor reads the same mapping: nothing else opens the file.
    assert np.shares_memory(model.graph.initializers["w"].const_value.numpy(), mapping._buffer)


def test_session_constant_shares_memory_with_the_mapping(tmp_path, cpu_pm):
    folder = str(tmp_path)
    path = add_model(folder, external_tensor("w", W, folder))
    sess = session(path, cpu_pm)
    registry = sess._model.meta["nxrt.pipeline.external_data"]
    (mapping,) = registry._files.values()
    constants = [c for c in sess._plan.constants.values() if isinstance(c, np.ndarray)]
    assert any(np.shares_memory(c, mapping._buffer) for c in constants)


def test_one_mapping_per_file_shared_by_its_tensors_and_sessions(tmp_path, cpu_pm):
    folder = str(tmp_path)
    a = external_tensor("a", W, folder)
    b = external_tensor("b", W * 2, folder)
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["y"])],
        "g",
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])],
        [a, b],
    )
    path = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), folder)
    first = session(path, cpu_pm, sess_options=_no_folding())
    np.testing.assert_array_equal(first.run(None, {})[0], W * 3)
    registry = first._model.meta["nxrt.pipeline.external_data"]
    assert len(registry._files) == 1
    second = session(path, cpu_pm)
    assert second._model.meta["nxrt.pipeline.external_data"] is registry
    assert list(registry._files.values()) == [*registry._files.values()][:1]


def _no_folding():
    options = nxrt.SessionOptions()
    options.graph_optimization_level = nxrt.GraphOptimizationLevel.ORT_DISABLE_ALL
    return options


def test_mapping_ids_resolve_while_the_mapping_lives(tmp_path):
    data = tmp_path / "d.bin"
    data.write_bytes(bytes(range(64)))
    mapping = ExternalDataRegistry(str(tmp_path)).open("d.bin", "t")
    assert isinstance(mapping, MappedFile)
    assert mapped_file(mapping.mapping_id) is mapping
    region = mapping.region(8, 16)
    assert mapping.bytes_view(region).tobytes() == bytes(range(8, 24))
    owned = np.empty(16, np.uint8)
    mapping.copy_out(region, owned)
    assert owned.tobytes() == bytes(range(8, 24))
    assert not np.shares_memory(owned, mapping._buffer)
    with pytest.raises(InvalidExternalData, match="outside"):
        mapping.bytes_view(mapping.region(60, 8))
    with pytest.raises(InvalidExternalData, match="no external-data mapping"):
        mapped_file(10**9)


def test_constant_node_with_external_value(tmp_path, cpu_pm):
    folder = str(tmp_path)
    value = external_tensor("c", W, folder)
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["c"], value=value)],
        "g",
        [],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [3, 4])],
    )
    path = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), folder)
    np.testing.assert_array_equal(session(path, cpu_pm).run(None, {})[0], W)


def test_sub_byte_tensors_are_packed_per_onnx(tmp_path):
    values = np.array([1, -2, 3, -4, 5], dtype=ml_dtypes.int4)
    packed = ir.Tensor(values, ir.DataType.INT4).tobytes()
    assert len(packed) == 3 == storage_bytes(ir.DataType.INT4, (5,))
    folder = str(tmp_path)
    tensor = external_tensor("q", values, folder, raw=packed, data_type=TensorProto.INT4, dims=(5,))
    add_model(folder, tensor)
    model, base = load_model(os.path.join(folder, "model.onnx"))
    resolve_external_data(model, base)
    np.testing.assert_array_equal(model.graph.initializers["q"].const_value.numpy(), values)

    wrong = tmp_path / "wrong"
    wrong.mkdir()
    tensor = external_tensor(
        "q", values, str(wrong), raw=bytes(5), data_type=TensorProto.INT4, dims=(5,)
    )
    add_model(str(wrong), tensor)
    with pytest.raises(InvalidExternalData, match="length is 5 bytes but INT4 \\[5\\] needs 3"):
        load_and_resolve(wrong / "model.onnx")


def load_and_resolve(path):
    model, base = load_model(str(path))
    return resolve_external_data(model, base)


# -- refusals ----------------------------------------------------------------------------------


def test_absolute_location_is_refused(tmp_path, cpu_pm):
    outside = tmp_path / "outside.bin"
    outside.write_bytes(W.tobytes())
    folder = tmp_path / "model"
    folder.mkdir()
    path = add_model(str(folder), external_tensor("w", W, str(folder), str(outside), offset=0))
    with pytest.raises(InvalidExternalData) as info:
        session(path, cpu_pm)
    message = str(info.value)
    assert "'w'" in message and str(outside) in message and "absolute path" in message
    assert "relative path" in message  # what to do


@pytest.mark.parametrize("location", ["../outside.bin", "sub/../../outside.bin", "a/../w.bin"])
def test_dotdot_locations_are_refused(tmp_path, cpu_pm, location):
    (tmp_path / "outside.bin").write_bytes(W.tobytes())
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "w.bin").write_bytes(W.tobytes())
    path = add_model(str(folder), external_tensor("w", W, str(folder), location, offset=0))
    with pytest.raises(InvalidExternalData, match="'..' component") as info:
        session(path, cpu_pm)
    assert location in str(info.value)


def test_symlink_leaving_the_folder_is_refused(tmp_path, cpu_pm):
    outside = tmp_path / "secret.bin"
    outside.write_bytes(W.tobytes())
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "link.bin").symlink_to(outside)
    path = add_model(str(folder), external_tensor("w", W, str(folder), "link.bin", offset=0))
    with pytest.raises(InvalidExternalData, match="outside the model's folder"):
        session(path, cpu_pm)


def test_symlinked_folder_leaving_the_model_folder_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "w.bin").write_bytes(W.tobytes())
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "data").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(InvalidExternalData, match="symlink"):
        resolve_location(str(folder), "data/w.bin", "w")


def test_symlink_staying_inside_the_folder_is_accepted(tmp_path, cpu_pm):
    folder = tmp_path / "model"
    folder.mkdir()
    tensor = external_tensor("w", W, str(folder), "real.bin")
    (folder / "alias.bin").symlink_to(folder / "real.bin")
    tensor.external_data[0].value = "alias.bin"
    path = add_model(str(folder), tensor)
    x = np.zeros((3, 4), np.float32)
    np.testing.assert_array_equal(session(path, cpu_pm).run(None, {"x": x})[0], W)


def test_a_model_folder_reached_through_a_symlink_still_works(tmp_path, cpu_pm):
    real = tmp_path / "real"
    real.mkdir()
    add_model(str(real), external_tensor("w", W, str(real)))
    (tmp_path / "alias").symlink_to(real, target_is_directory=True)
    sess = session(str(tmp_path / "alias" / "model.onnx"), cpu_pm)
    np.testing.assert_array_equal(sess.run(None, {"x": np.zeros((3, 4), np.float32)})[0], W)


def test_missing_file_is_refused(tmp_path, cpu_pm):
    tensor = external_tensor("w", W, str(tmp_path), "absent.bin")
    os.remove(tmp_path / "absent.bin")
    path = add_model(str(tmp_path), tensor)
    with pytest.raises(InvalidExternalData, match="no such file"):
        session(path, cpu_pm)


def test_a_directory_is_not_a_data_file(tmp_path):
    (tmp_path / "dir").mkdir()
    with pytest.raises(InvalidExternalData, match="not a regular file"):
        resolve_location(str(tmp_path), "dir", "w")


@pytest.mark.parametrize(
    ("offset", "length", "match"),
    [
        (8, None, "lie outside the file"),
        (10**6, None, "lie outside the file"),
        (0, 44, "length is 44 bytes but FLOAT \\[3, 4\\] needs 48"),
        (0, 52, "length is 52 bytes"),
        (-4, None, "offset .-4. is not a byte count >= 0"),
    ],
)
def test_out_of_bounds_and_mis_sized_regions_are_refused(tmp_path, cpu_pm, offset, length, match):
    tensor = external_tensor("w", W, str(tmp_path), offset=offset, length=length)
    path = add_model(str(tmp_path), tensor)
    with pytest.raises(InvalidExternalData, match=match) as info:
        session(path, cpu_pm)
    assert "'w'" in str(info.value) and "weights.bin" in str(info.value)


def test_bytes_and_modelproto_with_external_data_need_a_folder(tmp_path, cpu_pm):
    path = add_model(str(tmp_path), external_tensor("w", W, str(tmp_path)))
    proto = onnx.load(path, load_external_data=False)
    assert has_external_data(proto)
    for source in (proto, proto.SerializeToString()):
        with pytest.raises(InvalidExternalData, match="pass the model's path"):
            session(source, cpu_pm)
    # With its data loaded, the same proto runs.
    loaded = onnx.load(path)
    assert not has_external_data(loaded)
    x = np.zeros((3, 4), np.float32)
    np.testing.assert_array_equal(session(loaded, cpu_pm).run(None, {"x": x})[0], W)


def test_the_checker_sees_external_tensors_only_while_hidden_then_they_are_restored(tmp_path):
    path = add_model(str(tmp_path), external_tensor("w", W, str(tmp_path)))
    proto = onnx.load(path, load_external_data=False)
    original = proto.SerializeToString()
    with external_data_hidden_from_checker(proto):
        onnx.checker.check_model(proto)  # would resolve 'weights.bin' against the cwd
    assert proto.SerializeToString() == original


def test_checker_errors_unrelated_to_external_data_still_surface(tmp_path, cpu_pm):
    tensor = external_tensor("w", W, str(tmp_path))
    graph = helper.make_graph(
        [helper.make_node("NoSuchOp", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])],
        [tensor],
    )
    path = save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path)
    with pytest.raises(nxrt.errors.InvalidModel, match="checker"):
        session(path, cpu_pm)


def test_files_are_untouched_after_refusals(tmp_path, cpu_pm):
    outside = tmp_path / "outside.bin"
    outside.write_bytes(W.tobytes())
    folder = tmp_path / "model"
    folder.mkdir()
    path = add_model(str(folder), external_tensor("w", W, str(folder), "../outside.bin", offset=0))
    before = digest(tmp_path)
    with pytest.raises(InvalidExternalData):
        session(path, cpu_pm)
    assert digest(tmp_path) == before

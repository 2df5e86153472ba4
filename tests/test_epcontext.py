"""EPContext end to end: compile once, load without compiling, every refusal with real files."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import nxrt
from nxrt.errors import (
    DuplicateContextSource,
    InvalidExternalData,
    InvalidModel,
    NoEpForContext,
    UnsupportedContext,
)
from nxrt.ort.session import DISABLE_MODEL_COMPILE
from nxrt.tools.compile import compile_model
from nxrt.tools.testing import dummy_feeds, light_model_path, register_plugin
from toy_plugin import ToyPlugin

ATTRIBUTES = {
    "main_context",
    "ep_cache_context",
    "embed_mode",
    "ep_sdk_version",
    "onnx_model_filename",
    "hardware_architecture",
    "partition_name",
    "source",
    "notes",
    "max_size",
}


@pytest.fixture
def squeezenet(tmp_path):
    path = tmp_path / "squeezenet.onnx"
    shutil.copy(light_model_path("squeezenet"), path)
    return path


def context_nodes(path):
    return [n for n in onnx.load(str(path)).graph.node if n.op_type == "EPContext"]


@pytest.mark.parametrize("ep", ["mlx", "legacy_abi"])
def test_compile_then_load_in_a_fresh_process(squeezenet, tmp_path, ep):
    before, mtime = squeezenet.read_bytes(), squeezenet.stat().st_mtime_ns
    out = tmp_path / "compiled.onnx"
    report = compile_model(squeezenet, out, [ep, "cpu"])
    assert [(saved_ep, nodes) for _, saved_ep, nodes in report.saved] == [(ep, 105)]
    assert squeezenet.read_bytes() == before and squeezenet.stat().st_mtime_ns == mtime
    assert sorted(os.listdir(tmp_path)) == ["compiled.onnx", "squeezenet.onnx"]  # no leftovers

    model = onnx.load(str(out))
    (node,) = context_nodes(out)
    assert node.domain == "com.microsoft" and {a.name for a in node.attribute} == ATTRIBUTES
    metadata = {p.key: p.value for p in model.metadata_props}
    assert f"ep_compatibility_info.{ep}" in metadata

    code = f"""
import json, sys, numpy as np, nxrt
from nxrt.tools.testing import dummy_feeds
options = nxrt.SessionOptions()
options.add_session_config_entry("{DISABLE_MODEL_COMPILE}", "1")
session = nxrt.InferenceSession({str(out)!r}, options, providers=[{ep!r}, "cpu"])
(y,) = session.run(None, dummy_feeds(session))
np.save(sys.argv[1], y)
print(json.dumps([p.ep for p in session.get_partition().nodes]))
"""
    result_path = tmp_path / "y.npy"
    done = subprocess.run(
        [sys.executable, "-c", code, str(result_path)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [ep]
    # the same EP, uncompiled: the light squeezenet's 1,000 logits are mathematically
    # equal (about 9.5e9), so another runtime's rounding of them gives other probabilities
    reference = nxrt.InferenceSession(str(squeezenet), providers=[ep, "cpu"])
    (want,) = reference.run(None, dummy_feeds(reference))
    np.testing.assert_allclose(np.load(result_path), want, rtol=1e-5, atol=1e-6)


def test_embed_mode_0_writes_a_side_file_and_loads_it(squeezenet, tmp_path):
    out = tmp_path / "side.onnx"
    report = compile_model(squeezenet, out, ["mlx", "cpu"], embed_mode=0)
    (side,) = report.side_files
    assert (tmp_path / side).is_file()
    (node,) = context_nodes(out)
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["embed_mode"] == 0 and attrs["ep_cache_context"] == side.encode()
    session = nxrt.InferenceSession(str(out), providers=["mlx", "cpu"])
    session.run(None, dummy_feeds(session))


def rewrite_context(path, **attrs):
    model = onnx.load(str(path))
    for node in model.graph.node:
        if node.op_type == "EPContext":
            keep = [a for a in node.attribute if a.name not in attrs]
            del node.attribute[:]
            node.attribute.extend(keep)
            node.attribute.extend(
                helper.make_attribute(k, v) for k, v in attrs.items() if v is not None
            )
    onnx.save(model, str(path))


@pytest.mark.parametrize("location", ["/etc/passwd", "../outside.ctx", "link.ctx"])
def test_side_files_outside_the_model_folder_are_refused(squeezenet, tmp_path, location):
    folder = tmp_path / "model"
    folder.mkdir()
    out = folder / "side.onnx"
    report = compile_model(squeezenet, out, ["mlx", "cpu"], embed_mode=0)
    outside = tmp_path / "outside.ctx"
    shutil.copy(folder / report.side_files[0], outside)
    (folder / "link.ctx").symlink_to(outside)
    rewrite_context(out, ep_cache_context=location.encode())
    with pytest.raises(InvalidExternalData, match="refused"):
        nxrt.InferenceSession(str(out), providers=["mlx", "cpu"])


def test_the_reader_is_permissive_about_attributes(squeezenet, tmp_path):
    out = tmp_path / "compiled.onnx"
    compile_model(squeezenet, out, ["mlx", "cpu"])
    rewrite_context(
        out, main_context=None, notes=None, max_size=None, partition_name=None, future_field="x"
    )
    session = nxrt.InferenceSession(str(out), providers=["mlx", "cpu"])
    assert [p.ep for p in session.get_partition().nodes] == ["mlx"]


def test_a_context_from_another_sdk_version_is_refused_with_advice(squeezenet, tmp_path):
    out = tmp_path / "compiled.onnx"
    compile_model(squeezenet, out, ["mlx", "cpu"])
    rewrite_context(out, ep_sdk_version="0.0.1")
    with pytest.raises(InvalidModel, match="recompile"):
        nxrt.InferenceSession(str(out), providers=["mlx", "cpu"])


def test_missing_owner_and_missing_provider(squeezenet, tmp_path):
    out = tmp_path / "compiled.onnx"
    compile_model(squeezenet, out, ["mlx", "cpu"])
    with pytest.raises(NoEpForContext, match="not among this session's providers"):
        nxrt.InferenceSession(str(out), providers=["cpu"])
    rewrite_context(out, source="nobody")
    with pytest.raises(NoEpForContext, match="'nobody'"):
        nxrt.InferenceSession(str(out), providers=["mlx", "cpu"])


def test_disable_model_compile_refuses_a_model_that_needs_compiling(squeezenet):
    options = nxrt.SessionOptions()
    options.add_session_config_entry(DISABLE_MODEL_COMPILE, "1")
    with pytest.raises(InvalidModel, match="compile the model first"):
        nxrt.InferenceSession(str(squeezenet), options, providers=["mlx", "cpu"])
    nxrt.InferenceSession(str(squeezenet), options, providers=["cpu"])  # nothing to compile


def toy_model(tmp_path):
    nodes = [
        helper.make_node("Add", ["x", "y"], ["s"], name="add"),
        helper.make_node("Relu", ["s"], ["r"], name="relu"),
        helper.make_node("Neg", ["r"], ["z"], name="neg"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in ("x", "y")],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])],
    )
    path = tmp_path / "toy.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.fixture
def cpu_pm(nxrt_pm):
    import nxrt_ep_cpu.plugin

    with register_plugin(nxrt_pm, nxrt_ep_cpu.plugin, "cpu"):
        yield nxrt_pm


def test_duplicate_sources_and_unsupported_loading(cpu_pm, tmp_path):
    out = tmp_path / "toy_ctx.onnx"
    with register_plugin(cpu_pm, ToyPlugin(claims=True, context=True), "toy"):
        compile_model(toy_model(tmp_path), out, ["toy", "cpu"], plugin_manager=cpu_pm)
        (node,) = context_nodes(out)
        assert list(node.input) == ["x", "y"] and list(node.output) == ["r"]
        with register_plugin(cpu_pm, ToyPlugin(ep_id="copycat", context=True), "copycat"):
            with pytest.raises(DuplicateContextSource, match="'toy_ctx'"):
                nxrt.InferenceSession(str(out), providers=["toy", "cpu"], plugin_manager=cpu_pm)
    broken = ToyPlugin(context=True)
    with register_plugin(cpu_pm, NoLoad(broken), "toy"):
        with pytest.raises(UnsupportedContext, match="toy"):
            nxrt.InferenceSession(str(out), providers=["toy", "cpu"], plugin_manager=cpu_pm)


class NoLoad:
    """Registers the toy EP with a context source but implements no load hook."""

    def __init__(self, inner: ToyPlugin) -> None:
        self.inner = inner

    @nxrt.hookimpl
    def nxrt_register(self, registry):
        self.inner.nxrt_register(registry)


def test_toy_context_model_runs_like_the_original(cpu_pm, tmp_path):
    out = tmp_path / "toy_ctx.onnx"
    with register_plugin(cpu_pm, ToyPlugin(claims=True, context=True), "toy"):
        compile_model(toy_model(tmp_path), out, ["toy", "cpu"], plugin_manager=cpu_pm)
        session = nxrt.InferenceSession(str(out), providers=["toy", "cpu"], plugin_manager=cpu_pm)
        x, y = np.array([-3.0, 1.0], np.float32), np.array([1.0, 1.0], np.float32)
        # the toy context replays Relu steps of its blob: max(x, 0), then Neg on cpu
        (z,) = session.run(None, {"x": x, "y": y})
    np.testing.assert_allclose(z, -np.maximum(x, 0))

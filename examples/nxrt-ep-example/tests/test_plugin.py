"""The example EP's own tests: installed, hook level, conformance."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
from onnx import TensorProto, helper

import nxrt
from nxrt.host import Host
from nxrt.tools.testing import register_plugin, run_node


def test_installed_and_listed():
    from importlib.metadata import entry_points

    (entry,) = [e for e in entry_points(group="nxrt") if e.name == "example"]
    assert entry.value == "nxrt_ep_example.plugin"
    assert "example" in nxrt.get_available_providers()


def test_hooks_register_advertise_and_match(nxrt_pm):
    import nxrt_ep_example.plugin

    with register_plugin(nxrt_pm, nxrt_ep_example.plugin, "example"):
        host = Host(nxrt_pm)
        descriptor = host.build_registry().providers["example"]
        ep = descriptor.factory(nxrt.EpConfig())
        ep.initialize()
        assert host.capabilities(ep, "example").advertises("dtype:float32")

        x = np.array([[-1.0, 2.0]], np.float32)
        (y,) = run_node("Relu", {"x": x}, ep="example", plugin_manager=nxrt_pm)
        np.testing.assert_array_equal(y, [[0.0, 2.0]])

        graph = helper.make_graph(
            [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Tanh", ["r"], ["y"])],
            "tiny",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        import onnx_ir as ir

        relu, tanh = list(ir.from_proto(model).graph)
        assert host.match_kernel(ep, "example", relu, 17).supported
        refusal = host.match_kernel(ep, "example", tanh, 17)
        assert not refusal.supported and refusal.reason == "Tanh is not implemented"


def test_conformance_with_the_nxrt_kit(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--nxrt-ep", "example", "-q", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout[-3000:]
    passed = int(re.search(r"(\d+) passed", result.stdout).group(1))
    assert passed >= 20  # the hook-level checks and the Relu/Sigmoid/... node cases

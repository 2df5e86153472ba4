"""A fourth compiling EP is its backend's calls: one written on ``nxrt.CompilingProvider``.

Its backend compiles a claim into a list of numpy calls; the base does the
rest (claims, the reasons nodes fall back, EPContext), here through real
sessions and ``nxrt compile``. docs/writing-an-ep.md shows the same EP.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import nxrt
from nxrt.ort.session import DISABLE_MODEL_COMPILE
from nxrt.tools.compile import compile_model
from nxrt.tools.testing import register_plugin
from nxrt.weight import ExecutionProviderCapabilities

#: What the backend compiles: ONNX op -> numpy function.
NUMPY_OPS = {"Add": np.add, "Mul": np.multiply, "Relu": lambda x: np.maximum(x, 0)}


class NumpyProgram(nxrt.Kernel):
    """A compiled claim: its nodes as numpy calls, replayed in order."""

    def __init__(self, steps, inputs, outputs):
        self.steps, self.inputs, self.outputs = steps, list(inputs), list(outputs)

    def compute(self, inputs):
        values = dict(zip(self.inputs, inputs))
        for op, args, out in self.steps:
            values[out] = NUMPY_OPS[op](*(values[a] for a in args))
        return tuple(values[name] for name in self.outputs)


class NumpyJitEp(nxrt.CompilingProvider):
    id = "numpy_jit"
    backend = "numpy"

    def refusal(self, node, graph, opsets):
        return "" if node.op_type in NUMPY_OPS else f"numpy_jit has no {node.op_type}"

    def compile(self, claim, graph):
        steps = [(n.op_type, [v.name for v in n.inputs], n.outputs[0].name) for n in claim.nodes]
        return NumpyProgram(steps, claim.inputs, claim.outputs)

    @property
    def sdk_version(self):
        return np.__version__

    def export(self, claim, kernel):
        return nxrt.ExportedKernel(json.dumps(kernel.steps).encode())

    def load(self, context):
        steps = json.loads(context.ep_cache_context)
        return NumpyProgram(steps, context.inputs, context.outputs)


class NumpyJitPlugin:
    """The plugin: registration and capabilities, nothing else."""

    @nxrt.hookimpl
    def nxrt_register(self, registry):
        registry.add_provider("numpy_jit", NumpyJitEp, context_sources=("numpy_jit",))

    @nxrt.hookimpl
    def nxrt_ep_capabilities(self, ep):
        if ep.id != "numpy_jit":
            return None
        return ExecutionProviderCapabilities.from_flags(["device:cpu", "epcontext"])


W = np.array([[1.0, -2.0, 3.0]], np.float32)
B = np.array([0.5, 0.25, -1.0], np.float32)
X = np.array([[-1.0, 2.0, 3.0], [4.0, -5.0, 0.5]], np.float32)
EXPECTED = np.sin(np.maximum(X, 0) * W) + B


def model() -> onnx.ModelProto:
    """Relu, Mul -> Sin (the backend has none) -> Add: two claims around a fallback."""
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["r"], name="relu"),
            helper.make_node("Mul", ["r", "w"], ["m"], name="mul"),
            helper.make_node("Sin", ["m"], ["s"], name="sin"),
            helper.make_node("Add", ["s", "b"], ["y"], name="add"),
        ],
        "numpy_jit",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(W, "w"), numpy_helper.from_array(B, "b")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture
def jit_pm(nxrt_pm):
    import nxrt_ep_cpu.plugin

    with register_plugin(nxrt_pm, nxrt_ep_cpu.plugin, "cpu"):
        with register_plugin(nxrt_pm, NumpyJitPlugin(), "numpy_jit"):
            yield nxrt_pm


def test_a_compiling_ep_claims_and_runs_through_a_session(jit_pm):
    session = nxrt.InferenceSession(
        model().SerializeToString(), providers=["numpy_jit", "cpu"], plugin_manager=jit_pm
    )
    report = session.get_partition()
    assert [[n.name for n in c.nodes] for c in report.claims] == [["relu", "mul"], ["add"]]
    (fallback,) = report.fallbacks()
    assert fallback.node == "sin" and fallback.ep == "cpu"
    assert fallback.refusals == [("numpy_jit", "numpy_jit has no Sin")]
    np.testing.assert_allclose(session.run(None, {"x": X})[0], EXPECTED, rtol=1e-6)


def test_a_compiling_ep_saves_and_loads_its_contexts(jit_pm, tmp_path):
    source, compiled = tmp_path / "model.onnx", tmp_path / "compiled.onnx"
    onnx.save(model(), source)
    report = compile_model(source, compiled, ["numpy_jit", "cpu"], plugin_manager=jit_pm)
    assert [(ep, nodes) for _, ep, nodes in report.saved] == [("numpy_jit", 2), ("numpy_jit", 1)]
    contexts = [n for n in onnx.load(compiled).graph.node if n.op_type == "EPContext"]
    attributes = {a.name: helper.get_attribute_value(a) for a in contexts[0].attribute}
    assert attributes["source"] == b"numpy_jit"
    assert attributes["ep_sdk_version"] == np.__version__.encode()
    assert list(contexts[0].input) == ["x", "w"] and list(contexts[0].output) == ["m"]

    options = nxrt.SessionOptions()
    options.add_session_config_entry(DISABLE_MODEL_COMPILE, "1")  # contexts only
    session = nxrt.InferenceSession(
        str(compiled), options, providers=["numpy_jit", "cpu"], plugin_manager=jit_pm
    )
    assert [p.ep for p in session.get_partition().nodes] == ["numpy_jit", "cpu", "numpy_jit"]
    np.testing.assert_allclose(session.run(None, {"x": X})[0], EXPECTED, rtol=1e-6)


def test_a_node_no_claim_holds_is_explained(jit_pm):
    """Asked before any claiming (as constant folding does), the base says what it knows."""
    from nxrt.host import Host
    from nxrt.pipeline.model import load_model

    host = Host(jit_pm)
    ep = host.build_registry().resolve("numpy_jit").factory(nxrt.EpConfig())
    ep.initialize()
    graph = load_model(model().SerializeToString())[0].graph
    relu = next(iter(graph))
    match = host.match_kernel(ep, "numpy_jit", relu, 17)
    assert match.reason == "numpy can run it, but no claim of this EP holds it"
    host.claim_subgraphs(ep, "numpy_jit", graph, list(graph))
    sin = [n for n in graph if n.op_type == "Sin"][0]
    assert host.match_kernel(ep, "numpy_jit", sin, 17).reason == "numpy_jit has no Sin"


def test_the_guide_shows_this_ep():
    guide = (Path(__file__).parent.parent / "docs" / "writing-an-ep.md").read_text("utf-8")
    blocks = re.findall(r"```python\n(.*?)```", guide, re.DOTALL)
    (ep,) = [b for b in blocks if "class NumpyJitEp(" in b]
    shown = ep[ep.index("class NumpyProgram") :]
    assert shown.strip() in Path(__file__).read_text("utf-8"), "the guide's EP is not this one"

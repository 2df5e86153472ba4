"""The creation pipeline's contracts: claims that cannot be scheduled, EPs whose hooks
misbehave, strict mode, and the optimizer-pass hook."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

import nxrt
from nxrt.errors import EpPanicked, InvalidArgument, InvalidPlacement
from nxrt.kernel import Kernel, SubgraphClaim
from nxrt.pipeline import stages as pipeline
from nxrt.pipeline.partition import PartitionReport, Placement, schedule
from nxrt.provider import ExecutionProvider
from nxrt.registry import KernelMatch, OpRegistry
from nxrt.tools.testing import register_plugin

NUMPY_OPS = {
    "Relu": lambda x: np.maximum(x, 0),
    "Neg": np.negative,
    "Add": np.add,
    "Sub": np.subtract,
    "Mul": np.multiply,
}
X = np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3)


@pytest.fixture
def cpu_pm(nxrt_pm):
    import nxrt_ep_cpu.plugin

    with register_plugin(nxrt_pm, nxrt_ep_cpu.plugin, "cpu"):
        yield nxrt_pm


class ClaimKernel(Kernel):
    """Runs a claim's nodes with numpy, in order."""

    def __init__(self, claim: SubgraphClaim) -> None:
        self.claim = claim

    def compute(self, inputs):
        env = dict(zip(self.claim.inputs, inputs))
        for node in self.claim.nodes:
            args = [env[v.name] for v in node.inputs]
            env[node.outputs[0].name] = NUMPY_OPS[node.op_type](*args)
        return tuple(env[name] for name in self.claim.outputs)


class ClaimingEP(ExecutionProvider):
    def compile(self, claim, graph):
        return ClaimKernel(claim)


class NamedClaims:
    """An EP that claims the nodes it is told to, by name, as one claim."""

    def __init__(self, ep_id: str, names: tuple[str, ...]) -> None:
        self.ep_id, self.names = ep_id, names

    @nxrt.hookimpl
    def nxrt_register(self, registry):
        registry.add_provider(self.ep_id, lambda config: ClaimingEP(config))

    @nxrt.hookimpl
    def nxrt_claim_subgraphs(self, ep, graph, nodes):
        if ep.id != self.ep_id:
            return None
        return [SubgraphClaim(ep.id, [n for n in nodes if n.name in self.names])]

    @nxrt.hookimpl
    def nxrt_match_kernel(self, ep, node, opset):
        return KernelMatch.no("runs claims only") if ep.id == self.ep_id else None


def crossing_model():
    """a1 = Relu(x), b2 = Neg(x); a2 = Add(a1, b2) and b1 = Sub(a1, b2) read both."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a1"], name="a1"),
        helper.make_node("Neg", ["x"], ["b2"], name="b2"),
        helper.make_node("Add", ["a1", "b2"], ["a2"], name="a2"),
        helper.make_node("Sub", ["a1", "b2"], ["b1"], name="b1"),
    ]
    value = helper.make_tensor_value_info
    graph = helper.make_graph(
        nodes,
        "crossing",
        [value("x", TensorProto.FLOAT, [2, 3])],
        [value("a2", TensorProto.FLOAT, [2, 3]), value("b1", TensorProto.FLOAT, [2, 3])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_claims_that_form_a_cycle_together_are_refused_and_the_model_runs(cpu_pm):
    first, second = NamedClaims("first", ("a1", "a2")), NamedClaims("second", ("b2", "b1"))
    with register_plugin(cpu_pm, first, "first"), register_plugin(cpu_pm, second, "second"):
        session = nxrt.InferenceSession(
            crossing_model(), providers=["first", "second"], plugin_manager=cpu_pm
        )
    report = session.get_partition()
    assert [c.ep for c in report.claims] == ["first"]
    (refused, reason), *_ = report.refused_claims
    assert "cycle" in reason and "claims accepted before it" in reason
    a2, b1 = session.run(None, {"x": X})
    relu, neg = np.maximum(X, 0), -X
    np.testing.assert_allclose(a2, relu + neg)
    np.testing.assert_allclose(b1, relu - neg)
    assert {p.node: p.ep for p in report.nodes} == {
        "a1": "first",
        "a2": "first",
        "b2": "cpu",
        "b1": "cpu",
    }


def test_a_placement_that_cannot_be_scheduled_is_a_typed_error_naming_the_claims():
    model = ir.from_proto(crossing_model())
    nodes = list(model.graph)
    report = PartitionReport(["first", "second"])
    report.claims = [
        SubgraphClaim("first", [nodes[0], nodes[2]], name="first_0"),
        SubgraphClaim("second", [nodes[1], nodes[3]], name="second_1"),
    ]
    placement = Placement(report, ["first", "second", "first", "second"], [0, 1, 0, 1], [None] * 4)
    with pytest.raises(InvalidPlacement, match="'first_0', 'second_1'"):
        schedule(placement, nodes)


class YesWithoutKernels:
    """Says it runs every node but registered no kernel table."""

    @nxrt.hookimpl
    def nxrt_register(self, registry):
        registry.add_provider("liar", lambda config: ExecutionProvider(config))

    @nxrt.hookimpl
    def nxrt_match_kernel(self, ep, node, opset):
        from nxrt.kernel import Cost

        return KernelMatch.yes(Cost()) if ep.id == "liar" else None


@pytest.fixture
def lenient(monkeypatch):
    """Plugin failures recorded, not raised (``nxrt_pm`` is strict by default)."""
    monkeypatch.delenv("NXRT_STRICT_PLUGINS", raising=False)


def test_an_ep_that_matches_without_kernels_is_refused_and_recorded(cpu_pm, lenient):
    with register_plugin(cpu_pm, YesWithoutKernels(), "liar"):
        session = nxrt.InferenceSession(crossing_model(), providers=["liar"], plugin_manager=cpu_pm)
    placements = session.get_partition().nodes
    assert {p.ep for p in placements} == {"cpu"}
    assert all("registered no kernel" in p.refusals[0][1] for p in placements)
    assert any(isinstance(f, EpPanicked) and f.ep == "liar" for f in session._host.failures)
    a2, _ = session.run(None, {"x": X})
    np.testing.assert_allclose(a2, np.maximum(X, 0) - X)


class RaisingHooks:
    """An EP whose claim and match hooks always raise."""

    def __init__(self, hook: str) -> None:
        self.hook = hook

    @nxrt.hookimpl
    def nxrt_register(self, registry):
        registry.add_provider("raiser", lambda config: ClaimingEP(config))

    @nxrt.hookimpl
    def nxrt_claim_subgraphs(self, ep, graph, nodes):
        if ep.id == "raiser" and self.hook == "claim":
            raise RuntimeError("claiming is broken")
        return None

    @nxrt.hookimpl
    def nxrt_match_kernel(self, ep, node, opset):
        if ep.id == "raiser" and self.hook == "match":
            raise RuntimeError("matching is broken")
        return None


@pytest.mark.parametrize("hook", ["claim", "match"])
def test_strict_mode_raises_from_claim_and_match_hooks(cpu_pm, lenient, monkeypatch, hook):
    with register_plugin(cpu_pm, RaisingHooks(hook), "raiser"):
        lenient = nxrt.InferenceSession(
            crossing_model(), providers=["raiser"], plugin_manager=cpu_pm
        )
        assert any(isinstance(f, EpPanicked) for f in lenient._host.failures)
        monkeypatch.setenv("NXRT_STRICT_PLUGINS", "1")
        with pytest.raises(EpPanicked, match="raiser") as caught:
            nxrt.InferenceSession(crossing_model(), providers=["raiser"], plugin_manager=cpu_pm)
    assert "is broken" in str(caught.value.__cause__)


def test_unknown_keyword_arguments_are_refused(cpu_pm):
    with pytest.raises(InvalidArgument, match="sess_option"):
        nxrt.InferenceSession(crossing_model(), sess_option=None, plugin_manager=cpu_pm)


# -- the optimizer-pass hook ---------------------------------------------------------------------


class DoubleNegToIdentity(ir.passes.InPlacePass):
    """Neg(Neg(x)) -> Identity(x): a test EP's fusion."""

    def __init__(self) -> None:
        super().__init__()
        self.fused: list[tuple[str, str]] = []

    def call(self, model):
        graph = model.graph
        for outer in list(graph):
            inner = outer.inputs[0].producer() if outer.op_type == "Neg" else None
            if inner is None or inner.op_type != "Neg" or len(inner.outputs[0].uses()) != 1:
                continue
            identity = ir.node("Identity", [inner.inputs[0]], name=outer.name)
            graph.insert_before(inner, identity)
            outer.outputs[0].replace_all_uses_with(identity.outputs[0], replace_graph_outputs=True)
            identity.outputs[0].name = outer.outputs[0].name
            graph.remove([outer, inner], safe=True)
            self.fused.append((inner.name, outer.name))
        return ir.passes.PassResult(model, bool(self.fused))


class BrokenPass(ir.passes.InPlacePass):
    """Rewrites half the graph, then fails."""

    def call(self, model):
        for node in model.graph:
            node.name = "renamed"
        raise RuntimeError("the pass is broken")


PASS_OPS = OpRegistry("passes")
for _op, _fn in [("Neg", np.negative), ("Identity", np.array)]:
    PASS_OPS.op(_op, since=1)(lambda x, /, fn=_fn: fn(x))


class PassPlugin:
    def __init__(self, passes) -> None:
        self.passes = passes

    @nxrt.hookimpl
    def nxrt_register(self, registry):
        registry.add_provider("passes", lambda config: ExecutionProvider(config, PASS_OPS))
        registry.add_kernels("passes", PASS_OPS)

    @nxrt.hookimpl
    def nxrt_optimizer_passes(self, ep):
        return self.passes() if ep.id == "passes" else None


def double_neg_model():
    nodes = [
        helper.make_node("Neg", ["x"], ["n1"], name="neg1"),
        helper.make_node("Neg", ["n1"], ["y"], name="neg2"),
    ]
    value = helper.make_tensor_value_info
    graph = helper.make_graph(
        nodes, "g", [value("x", TensorProto.FLOAT, [2, 3])], [value("y", TensorProto.FLOAT, [2, 3])]
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_hook_nxrt_optimizer_passes(cpu_pm, hook_recorder):
    with register_plugin(cpu_pm, PassPlugin(lambda: [DoubleNegToIdentity()]), "passes"):
        first = nxrt.InferenceSession(
            double_neg_model(), providers=["passes"], plugin_manager=cpu_pm
        )
        second = nxrt.InferenceSession(
            double_neg_model(), providers=["cpu", "passes"], plugin_manager=cpu_pm
        )
    calls = hook_recorder.calls("nxrt_optimizer_passes")
    assert [c.kwargs["ep"].id for c in calls] == ["passes", "cpu"]  # the first EP's only
    assert [s.op_type for s in first._plan.steps] == ["Identity"]
    assert first.get_partition().fused == [("neg1", "neg2")]
    assert [s.op_type for s in second._plan.steps] == ["Neg", "Neg"]
    for session in (first, second):
        np.testing.assert_array_equal(session.run(None, {"x": X})[0], X)


def test_a_failing_pass_leaves_the_graph_as_it_was(cpu_pm, lenient, monkeypatch):
    with register_plugin(cpu_pm, PassPlugin(lambda: [BrokenPass()]), "passes"):
        session = nxrt.InferenceSession(
            double_neg_model(), providers=["passes"], plugin_manager=cpu_pm
        )
        assert [p.node for p in session.get_partition().nodes] == ["neg1", "neg2"]
        assert any("the pass is broken" in str(f) for f in session._host.failures)
        monkeypatch.setenv("NXRT_STRICT_PLUGINS", "1")
        with pytest.raises(EpPanicked, match="optimizer pass"):
            nxrt.InferenceSession(double_neg_model(), providers=["passes"], plugin_manager=cpu_pm)


def test_a_pass_that_is_not_an_onnx_ir_pass_is_refused(cpu_pm, lenient):
    with register_plugin(cpu_pm, PassPlugin(lambda: ["not a pass"]), "passes"):
        session = nxrt.InferenceSession(
            double_neg_model(), providers=["passes"], plugin_manager=cpu_pm
        )
    assert any("onnx_ir passes" in str(f) for f in session._host.failures)


def conv_bn_relu_model():
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")]
    for name, array in zip("sbmv", [rng.uniform(0.5, 2, 4), rng.standard_normal(4)] * 2):
        inits.append(numpy_helper.from_array(np.abs(array).astype(np.float32), name))
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"], name="bn"),
        helper.make_node("Relu", ["n"], ["y"], name="relu"),
    ]
    value = helper.make_tensor_value_info
    graph = helper.make_graph(
        nodes,
        "g",
        [value("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [value("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])


def test_the_cpu_fusions_arrive_through_the_hook_only_when_cpu_is_first(cpu_pm):
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    cpu_first = nxrt.InferenceSession(
        conv_bn_relu_model(), providers=["cpu"], plugin_manager=cpu_pm
    )
    assert [s.op_type for s in cpu_first._plan.steps] == ["FusedConv"]
    assert cpu_first.get_partition().fused == [("bn", "conv"), ("relu", "conv")]
    with register_plugin(cpu_pm, PassPlugin(lambda: []), "passes"):
        behind = nxrt.InferenceSession(
            conv_bn_relu_model(), providers=["passes", "cpu"], plugin_manager=cpu_pm
        )
    assert [s.op_type for s in behind._plan.steps] == ["Conv", "BatchNormalization", "Relu"]
    np.testing.assert_allclose(
        cpu_first.run(None, {"x": x})[0], behind.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5
    )


def test_compile_uses_the_pipeline_state():
    state = pipeline.create(
        crossing_model(),
        pipeline.provider_requests(["cpu"]),
        pipeline.CreateOptions(),
        nxrt.default_plugin_manager(),
    )
    assert [p.ep for p in state.placement.report.nodes] == ["cpu"] * 4
    assert state.compiled_partitions() == []
    assert len(state.plan.steps) == 4


def test_feeds_may_be_tensor_views_or_dlpack_producers(cpu_pm):
    from nxrt.errors import AlignmentError
    from nxrt.tensor import TensorView

    class Producer:  # what torch, jax or cupy hand over: only the DLPack protocol
        def __init__(self, array):
            self.array = array

        def __dlpack__(self, **kwargs):
            return self.array.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return self.array.__dlpack_device__()

    session = nxrt.InferenceSession(crossing_model(), providers=["cpu"], plugin_manager=cpu_pm)
    want = session.run(None, {"x": X})
    for feed in (TensorView(X), Producer(X)):
        for got, expected in zip(session.run(None, {"x": feed}), want):
            np.testing.assert_array_equal(got, expected)
    misaligned = np.frombuffer(b"\0" + X.tobytes(), np.uint8)[1:].view(np.float32).reshape(2, 3)
    with pytest.raises(AlignmentError):
        session.run(None, {"x": Producer(misaligned)})

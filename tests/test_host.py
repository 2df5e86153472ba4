"""Hook-level tests of the plugin host: registration, discovery, isolation, each hook."""

from __future__ import annotations

import importlib_metadata
import numpy as np
import pluggy
import pytest
from onnx import TensorProto, helper

import nxrt
from nxrt import hookspecs
from nxrt.ep_registry import EpDescriptor
from nxrt.epcontext import EpContext, build_ep_context_registry
from nxrt.errors import (
    DuplicateContextSource,
    EpLoadFailed,
    NoEpForContext,
    UnsupportedContext,
)
from nxrt.host import Host, get_plugin_manager
from nxrt.kernel import SubgraphClaim
from nxrt.provider import EpConfig, ExecutionProvider
from nxrt.tools.testing import register_plugin
from nxrt.weight import ExecutionProviderCapabilities
from toy_plugin import TOY_OPS, ToyPlugin


def chain_model(ops=("Add", "Relu", "Neg", "Relu"), opset=17):
    """x, y -> Add -> Relu -> Neg -> Relu -> out (names n0, n1, ...)."""
    nodes, previous = [], None
    for i, op in enumerate(ops):
        inputs = ["x", "y"] if previous is None and op == "Add" else [previous or "x"]
        if op == "Add" and previous is not None:
            inputs = [previous, "y"]
        nodes.append(helper.make_node(op, inputs, [f"v{i}"], name=f"n{i}"))
        previous = f"v{i}"
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in ("x", "y")]
    out = [helper.make_tensor_value_info(previous, TensorProto.FLOAT, [2, 3])]
    graph = helper.make_graph(nodes, "chain", vi, out)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


FEEDS = {
    "x": np.arange(6, dtype=np.float32).reshape(2, 3) - 3,
    "y": np.ones((2, 3), np.float32),
}


def expected(ops):
    value = FEEDS["x"]
    for op in ops:
        value = {
            "Add": lambda v: v + FEEDS["y"],
            "Relu": lambda v: np.maximum(v, 0),
            "Neg": lambda v: -v,
        }[op](value)
    return value


@pytest.fixture
def cpu_pm(nxrt_pm):
    import nxrt_ep_cpu.plugin

    with register_plugin(nxrt_pm, nxrt_ep_cpu.plugin, "cpu"):
        yield nxrt_pm


# -- registration -------------------------------------------------------------------------------


def test_hook_nxrt_register(nxrt_pm, hook_recorder):
    with register_plugin(nxrt_pm, ToyPlugin(), "toy"):
        registry = Host(nxrt_pm).build_registry()
    descriptor = registry.providers["toy"]
    assert descriptor.plugin == "toy"
    assert descriptor.ops is TOY_OPS
    assert [c.hook for c in hook_recorder.calls_made] == ["nxrt_register"]


class LazyKernels:
    """An EP whose kernel table is registered as a loader, as the cpu EP's is."""

    def __init__(self, loader):
        self.loader = loader

    @nxrt.hookimpl
    def nxrt_register(self, registry):
        registry.add_provider("lazy", lambda config: ExecutionProvider(config))
        registry.add_kernels("lazy", self.loader)


def test_a_kernel_table_registered_as_a_loader_loads_when_a_session_needs_it(nxrt_pm):
    loads = []

    def loader():
        loads.append(1)
        return TOY_OPS

    with register_plugin(nxrt_pm, LazyKernels(loader), "lazy"):
        descriptor = Host(nxrt_pm).build_registry().providers["lazy"]
        assert loads == [] and not descriptor.ops_loaded  # listing EPs loads no kernels
        for _ in range(2):
            session = nxrt.InferenceSession(
                chain_model(("Relu",)), providers=["lazy"], plugin_manager=nxrt_pm
            )
            np.testing.assert_array_equal(session.run(None, FEEDS)[0], expected(("Relu",)))
        assert len(loads) == 2  # once per registry: each session builds its own


def test_a_kernel_loader_that_fails_is_the_plugins_load_failure(nxrt_pm):
    def loader():
        raise ImportError("libkernels.so: not found")

    with register_plugin(nxrt_pm, LazyKernels(loader), "lazy"):
        assert "lazy" in Host(nxrt_pm).build_registry().providers  # listed all the same
        with pytest.raises(EpLoadFailed, match="libkernels.so: not found") as caught:
            nxrt.InferenceSession(
                chain_model(("Relu",)), providers=["lazy"], plugin_manager=nxrt_pm
            )
    assert caught.value.path == "lazy" and "loading the kernels of EP 'lazy'" in caught.value.reason


def test_register_refuses_an_ep_id_already_taken(nxrt_pm, monkeypatch):
    monkeypatch.delenv("NXRT_STRICT_PLUGINS")
    nxrt_pm.register(ToyPlugin(), name="first")
    nxrt_pm.register(ToyPlugin(), name="second")
    host = Host(nxrt_pm)
    registry = host.build_registry()
    assert registry.providers["toy"].plugin == "first"
    assert len(host.failures) == 1
    assert "already provided by plugin 'first'" in host.failures[0].reason


@pytest.mark.parametrize(
    "bad_call, message",
    [
        (lambda r: r.add_provider("toy", "not callable"), "must be callable"),
        (lambda r: r.add_provider("bad id!", lambda c: None), "identifier"),
        (lambda r: r.add_kernels("other", TOY_OPS), "did not register"),
        (lambda r: r.add_kernels("toy", {"Add": 1}), "OpRegistry"),
    ],
)
def test_malformed_registration_becomes_a_record(nxrt_pm, monkeypatch, bad_call, message):
    monkeypatch.delenv("NXRT_STRICT_PLUGINS")

    class Malformed:
        @nxrt.hookimpl
        def nxrt_register(self, registry):
            registry.add_provider("toy", lambda config: None)
            bad_call(registry)

    nxrt_pm.register(Malformed(), name="malformed")
    nxrt_pm.register(ToyPlugin(ep_id="good"), name="good")
    host = Host(nxrt_pm)
    registry = host.build_registry()
    assert list(registry.providers) == ["good"]  # nothing of the broken plugin survives
    assert isinstance(host.failures[0], EpLoadFailed)
    assert message in host.failures[0].reason


def test_strict_mode_raises_instead_of_recording(nxrt_pm):
    class Raising:
        @nxrt.hookimpl
        def nxrt_register(self, registry):
            raise RuntimeError("boom in register")

    nxrt_pm.register(Raising(), name="raising")
    with pytest.raises(EpLoadFailed, match="boom in register"):
        Host(nxrt_pm).build_registry()


# -- discovery ---------------------------------------------------------------------------------


def fake_entry_points(monkeypatch, tmp_path, modules: dict[str, str]):
    """Entry points of group nxrt pointing at modules written into tmp_path."""
    for name, source in modules.items():
        (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    eps = importlib_metadata.EntryPoints(
        importlib_metadata.EntryPoint(name, name, "nxrt") for name in modules
    )

    def entry_points(**params):
        return eps.select(**params)

    monkeypatch.setattr(importlib_metadata, "entry_points", entry_points)


GOOD_PLUGIN = """
import nxrt
from toy_plugin import ToyPlugin
_plugin = ToyPlugin(ep_id="{ep_id}")


@nxrt.hookimpl
def nxrt_register(registry):
    _plugin.nxrt_register(registry)
"""


def test_a_plugin_whose_import_raises_is_recorded_and_others_load(monkeypatch, tmp_path):
    monkeypatch.delenv("NXRT_STRICT_PLUGINS", raising=False)
    fake_entry_points(
        monkeypatch,
        tmp_path,
        {
            "broken_import": "raise ImportError('libfoo.so: cannot open shared object')",
            "unknown_hook": "import nxrt\n@nxrt.hookimpl\ndef nxrt_no_such_hook():\n    pass\n",
            "good": GOOD_PLUGIN.format(ep_id="good"),
        },
    )
    pm = get_plugin_manager()
    assert pm.has_plugin("good") and not pm.has_plugin("broken_import")
    assert not pm.has_plugin("unknown_hook")
    failures = {f.path: f.reason for f in pm.load_failures}
    assert "libfoo.so: cannot open shared object" in failures["broken_import"]
    assert "nxrt_no_such_hook" in failures["unknown_hook"]
    assert list(Host(pm).build_registry().providers) == ["good"]


def test_strict_plugins_shows_the_full_cause(monkeypatch, tmp_path):
    monkeypatch.setenv("NXRT_STRICT_PLUGINS", "1")
    fake_entry_points(monkeypatch, tmp_path, {"broken_import": "raise ImportError('missing')"})
    with pytest.raises(EpLoadFailed, match="ImportError: missing") as info:
        get_plugin_manager()
    assert isinstance(info.value.__cause__, ImportError)


def test_plugin_selection_switches(monkeypatch, tmp_path):
    monkeypatch.delenv("NXRT_STRICT_PLUGINS", raising=False)
    fake_entry_points(
        monkeypatch,
        tmp_path,
        {"one": GOOD_PLUGIN.format(ep_id="one"), "two": GOOD_PLUGIN.format(ep_id="two")},
    )
    monkeypatch.setenv("NXRT_PLUGINS", "two")
    assert not get_plugin_manager().has_plugin("one")
    assert get_plugin_manager().has_plugin("two")
    monkeypatch.setenv("NXRT_PLUGINS", "")
    assert not get_plugin_manager().has_plugin("two")
    monkeypatch.delenv("NXRT_PLUGINS")
    assert get_plugin_manager(blocked=["one"]).has_plugin("two")
    assert not get_plugin_manager(blocked=["one"]).has_plugin("one")
    monkeypatch.setenv("NXRT_DISABLE_PLUGIN_AUTOLOAD", "1")
    pm = get_plugin_manager()
    assert not pm.has_plugin("one") and not pm.has_plugin("two")


def test_import_nxrt_loads_no_plugin():
    import subprocess
    import sys

    code = (
        "import sys, nxrt; "
        "print(sorted(m for m in sys.modules if m.startswith(('nxrt_ep', 'onnxruntime', 'mlx'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_trace_hooks_prints_each_call(monkeypatch, capsys):
    monkeypatch.setenv("NXRT_TRACE_HOOKS", "1")
    pm = get_plugin_manager(autoload=False)
    pm.register(ToyPlugin(), name="toy")
    Host(pm).build_registry()
    assert "nxrt hook nxrt_register" in capsys.readouterr().err


# -- capability advertisement ------------------------------------------------------------------


def test_hook_nxrt_ep_capabilities(nxrt_pm, monkeypatch):
    monkeypatch.delenv("NXRT_STRICT_PLUGINS")

    class Impostor:
        @nxrt.hookimpl
        def nxrt_ep_capabilities(self, ep):
            return ExecutionProviderCapabilities.nxrt_weight_paging()

    nxrt_pm.register(ToyPlugin(context=True), name="toy")
    nxrt_pm.register(Impostor(), name="impostor")
    host = Host(nxrt_pm)
    descriptor = host.build_registry().providers["toy"]
    ep = descriptor.factory(EpConfig())
    capabilities = host.capabilities(ep, "toy")
    assert capabilities.advertises("epcontext")
    assert not capabilities.advertises("nxrt")  # the impostor's answer was refused
    assert "does not own" in host.failures[0].reason


# -- kernel matching and claims ----------------------------------------------------------------


def test_hook_nxrt_match_kernel(cpu_pm, hook_recorder):
    with register_plugin(cpu_pm, ToyPlugin(), "toy"):
        session = nxrt.InferenceSession(chain_model(), providers=["toy"], plugin_manager=cpu_pm)
        out = session.run(None, FEEDS)[0]
    np.testing.assert_allclose(out, expected(("Add", "Relu", "Neg", "Relu")))
    report = session.get_partition()
    assert [p.ep for p in report.nodes] == ["toy", "toy", "cpu", "toy"]
    (fallback,) = report.fallbacks()
    assert fallback.node == "n2" and fallback.refusals == [("toy", "Neg is not implemented")]
    matches = [c for c in hook_recorder.calls("nxrt_match_kernel") if c.kwargs["ep"].id == "toy"]
    assert [c.kwargs["node"].name for c in matches] == ["n0", "n1", "n2", "n3"]
    assert all(c.kwargs["opset"] == 17 for c in matches)
    assert matches[0].result.supported and matches[0].result.cost.flops == 6


def test_hook_order_of_session_creation(cpu_pm, hook_recorder):
    with register_plugin(cpu_pm, ToyPlugin(claims=True), "toy"):
        nxrt.InferenceSession(chain_model(), providers=["toy"], plugin_manager=cpu_pm)
    assert hook_recorder.names() == [
        "nxrt_register",
        "nxrt_ep_capabilities",
        "nxrt_optimizer_passes",
        "nxrt_claim_subgraphs",
        "nxrt_match_kernel",
        "nxrt_claim_subgraphs",
        "nxrt_match_kernel",
    ]


def test_hook_nxrt_claim_subgraphs(cpu_pm):
    ops = ("Add", "Relu", "Relu", "Neg")
    with register_plugin(cpu_pm, ToyPlugin(claims=True), "toy"):
        session = nxrt.InferenceSession(chain_model(ops), providers=["toy"], plugin_manager=cpu_pm)
        out = session.run(None, FEEDS)[0]
    np.testing.assert_allclose(out, expected(ops))
    report = session.get_partition()
    (claim,) = report.claims
    assert [n.name for n in claim.nodes] == ["n0", "n1", "n2"]
    assert claim.inputs == ["x", "y"] and claim.outputs == ["v2"]
    assert [p.claim for p in report.nodes] == ["toy_fused"] * 3 + [""]
    assert report.partitions == [("toy", ["n0", "n1", "n2"]), ("cpu", ["n3"])]


def test_a_claim_that_would_create_a_cycle_is_refused(cpu_pm):
    # n0 (Add) -> n1 (Neg, cpu only) -> n2 (Relu): claiming {n0, n2} would make a cycle.
    ops = ("Add", "Neg", "Relu")

    def pick(nodes):
        return [n for n in nodes if n.name in ("n0", "n2")]

    with register_plugin(cpu_pm, ToyPlugin(claims=True, claim_picker=pick), "toy"):
        session = nxrt.InferenceSession(chain_model(ops), providers=["toy"], plugin_manager=cpu_pm)
        out = session.run(None, FEEDS)[0]
    np.testing.assert_allclose(out, expected(ops))
    report = session.get_partition()
    assert report.claims == []
    assert "cycle" in report.refused_claims[0][1]
    assert [p.ep for p in report.nodes] == ["toy", "cpu", "toy"]  # matched one by one instead


def test_a_claim_of_a_node_taken_ahead_is_refused(cpu_pm):
    def pick(nodes):
        return list(nodes)

    with register_plugin(cpu_pm, ToyPlugin(ep_id="first"), "first"):
        with register_plugin(
            cpu_pm, ToyPlugin(ep_id="second", claims=True, claim_picker=pick), "s"
        ):
            # "first" takes Add and Relu; "second" is only offered what is left.
            session = nxrt.InferenceSession(
                chain_model(), providers=["first", "second"], plugin_manager=cpu_pm
            )
    report = session.get_partition()
    assert [p.ep for p in report.nodes] == ["first", "first", "second", "first"]
    assert report.claims[0].inputs == ["v1"]


# -- EPContext ---------------------------------------------------------------------------------


def test_hook_nxrt_save_context(nxrt_pm):
    with register_plugin(nxrt_pm, ToyPlugin(context=True), "toy"):
        host = Host(nxrt_pm)
        ep = host.build_registry().providers["toy"].factory(EpConfig())
        claim = SubgraphClaim("toy", [], name="p0", inputs=["x"], outputs=["y"])
        context = host.save_context(ep, "toy", claim, kernel=None)
    assert context.source == "toy_ctx" and context.partition_name == "p0"
    assert context.inputs == ["x"] and context.outputs == ["y"]


def test_hook_nxrt_load_context(nxrt_pm):
    with register_plugin(nxrt_pm, ToyPlugin(context=True), "toy"):
        host = Host(nxrt_pm)
        registry = host.build_registry()
        ep = registry.providers["toy"].factory(EpConfig())
        contexts = build_ep_context_registry(registry.providers.values())
        assert contexts.owner("toy_ctx") == "toy"
        kernel = host.load_context(ep, "toy", EpContext("toy_ctx", b"Relu,Relu"))
    (out,) = kernel.compute([np.array([-1.0, 2.0])])
    np.testing.assert_array_equal(out, [0.0, 2.0])


def test_epcontext_registry_errors(nxrt_pm):
    a = EpDescriptor("a", lambda c: None, context_sources=("key",))
    b = EpDescriptor("b", lambda c: None, context_sources=("key",))
    with pytest.raises(DuplicateContextSource, match="'key'.*'a'.*'b'"):
        build_ep_context_registry([a, b])
    registry = build_ep_context_registry([a])
    with pytest.raises(NoEpForContext, match="'other'"):
        registry.owner("other")
    with pytest.raises(UnsupportedContext):
        registry.require_support("b")
    # An EP that does not implement loading refuses through its base class.
    with register_plugin(nxrt_pm, ToyPlugin(ep_id="plain"), "plain"):
        host = Host(nxrt_pm)
        ep = host.build_registry().providers["plain"].factory(EpConfig())
        ep.id = "plain"
        with pytest.raises(UnsupportedContext):
            host.load_context(ep, "plain", EpContext("key"))


# -- the spec module itself --------------------------------------------------------------------


def spec_functions():
    return [getattr(hookspecs, name) for name in hookspecs.__all__]


@pytest.mark.parametrize("spec", spec_functions(), ids=lambda f: f.__name__)
def test_every_hookspec_is_documented_and_tested(spec):
    import inspect
    import pathlib

    doc = inspect.getdoc(spec) or ""
    for param in inspect.signature(spec).parameters:
        assert f":param {param}:" in doc, f"{spec.__name__} does not document {param}"
    assert ":returns:" in doc and "versionadded" in doc
    assert "Implemented by:" not in doc  # derived from the plugins in docs/hooks.md
    tests = "".join(p.read_text() for p in pathlib.Path(__file__).parent.glob("test_*.py"))
    assert f"def test_hook_{spec.__name__}(" in tests


def test_hookspecs_are_found_by_marker_only():
    pm = pluggy.PluginManager("nxrt")
    pm.add_hookspecs(hookspecs)
    assert {h for h in dir(pm.hook) if h.startswith("nxrt_")} == set(hookspecs.__all__)


def test_a_claim_runs_after_everything_it_reads(cpu_pm):
    # n0 Relu(x) -> a, n1 Neg(x) -> b (cpu), n2 Add(a, b): the claim {n0, n2} must wait for n1.
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="n0"),
        helper.make_node("Neg", ["x"], ["b"], name="n1"),
        helper.make_node("Add", ["a", "b"], ["c"], name="n2"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [2, 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    def pick(free):
        return [n for n in free if n.name in ("n0", "n2")]

    with register_plugin(cpu_pm, ToyPlugin(claims=True, claim_picker=pick), "toy"):
        session = nxrt.InferenceSession(model, providers=["toy"], plugin_manager=cpu_pm)
    assert [n.name for n in session.get_partition().claims[0].nodes] == ["n0", "n2"]
    (out,) = session.run(None, {"x": FEEDS["x"]})
    np.testing.assert_allclose(out, np.maximum(FEEDS["x"], 0) - FEEDS["x"])
    assert [step.op_type for step in session._plan.steps] == ["Neg", "Subgraph"]


# -- ahead-of-time compiling -------------------------------------------------------------------


class WarmingPlugin(ToyPlugin):
    """The toy EP, warming up by recording what it was asked for."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.fail = fail
        self.asked: list[tuple[str, str | None]] = []

    @nxrt.hookimpl
    def nxrt_warmup(self, ep, model):
        if ep.id != "toy":
            return None
        self.asked.append((ep.id, model))
        if self.fail:
            raise RuntimeError("no compiler here")
        return [f"compiled {model or 'everything'}", 2]


def test_hook_nxrt_warmup(nxrt_pm, tmp_path):
    plugin = WarmingPlugin()
    with register_plugin(nxrt_pm, plugin, "toy"):
        host = Host(nxrt_pm)
        ep = host.build_registry().providers["toy"].factory(EpConfig())
        assert host.warmup(ep, "toy", "m.onnx") == ["compiled m.onnx", "2"]  # lines, as text
        assert host.warmup(ep, "toy", None) == ["compiled everything", "2"]
        assert plugin.asked == [("toy", "m.onnx"), ("toy", None)]
        # a session never warms up: only `nxrt warmup` does
        graph = helper.make_graph(
            [helper.make_node("Relu", ["x"], ["y"])],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        session = nxrt.InferenceSession(model, providers=["toy"], plugin_manager=nxrt_pm)
        session.run(None, {"x": np.array([-1.0, 1.0], np.float32)})
        assert len(plugin.asked) == 2


def test_a_failing_warmup_propagates_to_its_caller(nxrt_pm):
    with register_plugin(nxrt_pm, WarmingPlugin(fail=True), "toy"):
        host = Host(nxrt_pm)
        ep = host.build_registry().providers["toy"].factory(EpConfig())
        with pytest.raises(RuntimeError, match="no compiler here"):
            host.warmup(ep, "toy", None)

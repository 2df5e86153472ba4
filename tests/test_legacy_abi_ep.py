"""The legacy_abi EP: claims run as standalone models on ONNX Runtime's providers."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import nxrt
import nxrt_ep_legacy_abi.plugin as legacy_plugin
from nxrt.claims import claim_boundary, group_claims
from nxrt.epcontext import build_ep_context_registry
from nxrt.errors import EpLoadFailed, KernelFailed
from nxrt.host import Host
from nxrt.pipeline.model import load_model
from nxrt.provider import EpConfig
from nxrt.registry import OpRegistry
from nxrt.tools.testing import LIGHT_MODELS, dummy_feeds, light_model_path, register_plugin
from nxrt_ep_legacy_abi.provider import LIBRARIES_ENV

RTOL, ATOL = 1e-3, 1e-4


@pytest.fixture
def pm(nxrt_pm):
    """A plugin manager with the cpu and legacy_abi plugins."""
    import nxrt_ep_cpu.plugin

    with register_plugin(nxrt_pm, nxrt_ep_cpu.plugin, "cpu"):
        with register_plugin(nxrt_pm, legacy_plugin, "legacy_abi"):
            yield nxrt_pm


def ort_session(model) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if isinstance(model, onnx.ModelProto):
        model = model.SerializeToString()
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def assert_matches_ort(model, session, feeds) -> None:
    reference = ort_session(model)
    expected = reference.run(None, {i.name: feeds[i.name] for i in reference.get_inputs()})
    got = session.run(None, feeds)
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)


def transformer_block(
    seq: int = 128, hidden: int = 256, heads: int = 4, ffn: int = 1024, seed: int = 0
) -> onnx.ModelProto:
    """One pre-norm transformer encoder block (attention + GELU MLP), opset 17."""
    rng = np.random.default_rng(seed)
    head = hidden // heads
    weights: list[TensorProto] = []

    def weight(name: str, *shape: int, scale: float = 0.05) -> str:
        data = (rng.standard_normal(shape) * scale).astype(np.float32)
        weights.append(numpy_helper.from_array(data, name))
        return name

    def const(name: str, values, dtype=np.int64) -> str:
        weights.append(numpy_helper.from_array(np.asarray(values, dtype), name))
        return name

    n = helper.make_node
    nodes = [
        n("LayerNormalization", ["x", weight("ln1_g", hidden, scale=1.0), weight("ln1_b", hidden)],
          ["ln1"], axis=-1, epsilon=1e-5),
    ]  # fmt: skip
    split = const("split_shape", [1, seq, heads, head])
    for part in ("q", "k", "v"):
        nodes += [
            n("MatMul", ["ln1", weight(f"w{part}", hidden, hidden)], [f"{part}_mm"]),
            n("Add", [f"{part}_mm", weight(f"b{part}", hidden)], [f"{part}_lin"]),
            n("Reshape", [f"{part}_lin", split], [f"{part}_heads"]),
        ]
    nodes += [
        n("Transpose", ["q_heads"], ["q_t"], perm=[0, 2, 1, 3]),
        n("Transpose", ["k_heads"], ["k_t"], perm=[0, 2, 3, 1]),
        n("Transpose", ["v_heads"], ["v_t"], perm=[0, 2, 1, 3]),
        n("MatMul", ["q_t", "k_t"], ["scores_raw"]),
        n("Mul", ["scores_raw", const("scale", 1.0 / np.sqrt(head), np.float32)], ["scores"]),
        n("Softmax", ["scores"], ["probs"], axis=-1),
        n("MatMul", ["probs", "v_t"], ["ctx_t"]),
        n("Transpose", ["ctx_t"], ["ctx_heads"], perm=[0, 2, 1, 3]),
        n("Reshape", ["ctx_heads", const("merge_shape", [1, seq, hidden])], ["ctx"]),
        n("MatMul", ["ctx", weight("wo", hidden, hidden)], ["o_mm"]),
        n("Add", ["o_mm", weight("bo", hidden)], ["attn"]),
        n("Add", ["x", "attn"], ["h"]),
        n("LayerNormalization", ["h", weight("ln2_g", hidden, scale=1.0), weight("ln2_b", hidden)],
          ["ln2"], axis=-1, epsilon=1e-5),
        n("MatMul", ["ln2", weight("w1", hidden, ffn)], ["f1_mm"]),
        n("Add", ["f1_mm", weight("b1", ffn)], ["f1"]),
        n("Div", ["f1", const("sqrt2", np.sqrt(2.0), np.float32)], ["f1_s"]),
        n("Erf", ["f1_s"], ["f1_erf"]),
        n("Add", ["f1_erf", const("one", 1.0, np.float32)], ["f1_1"]),
        n("Mul", ["f1", "f1_1"], ["f1_m"]),
        n("Mul", ["f1_m", const("half", 0.5, np.float32)], ["gelu"]),
        n("MatMul", ["gelu", weight("w2", ffn, hidden)], ["f2_mm"]),
        n("Add", ["f2_mm", weight("b2", hidden)], ["f2"]),
        n("Add", ["h", "f2"], ["y"]),
    ]  # fmt: skip
    graph = helper.make_graph(
        nodes,
        "transformer_block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, hidden])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, hidden])],
        weights,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def transformer_feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return {"x": np.random.default_rng(1).standard_normal(shape).astype(np.float32)}


# -- discovery and registration ----------------------------------------------------------------


def test_importing_and_registering_does_not_import_onnxruntime():
    code = (
        "import sys\n"
        "import nxrt_ep_legacy_abi.plugin as plugin\n"
        "from nxrt.host import Host, get_plugin_manager\n"
        "pm = get_plugin_manager(autoload=False)\n"
        "pm.register(plugin, name='legacy_abi')\n"
        "registry = Host(pm).build_registry()\n"
        "assert 'legacy_abi' in registry.providers, registry.providers\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'onnxruntime'))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("NXRT_")}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert done.stdout.strip() == "[]"


def test_hook_nxrt_register(nxrt_pm, monkeypatch):
    monkeypatch.setenv(LIBRARIES_ENV, "MyVendorExecutionProvider=/opt/vendor/libvendor_ep.so")
    with register_plugin(nxrt_pm, legacy_plugin, "legacy_abi"):
        registry = Host(nxrt_pm).build_registry()
    main = registry.providers["legacy_abi"]
    assert main.plugin == "legacy_abi" and main.device_type == "cpu"
    assert main.context_sources == ("legacy_abi",)
    library = registry.providers["legacy_abi_myvendor"]
    assert library.context_sources == ("legacy_abi_myvendor",)
    assert "/opt/vendor/libvendor_ep.so" in library.description
    contexts = build_ep_context_registry(registry.providers.values())
    assert contexts.owner("legacy_abi") == "legacy_abi"


def test_each_installed_ort_distribution_adds_its_providers(pm, monkeypatch):
    import nxrt_ep_legacy_abi.provider as provider

    monkeypatch.setattr(provider, "_installed", lambda name: name in ("onnxruntime-gpu",))
    registry = Host(pm).build_registry()
    cuda = registry.providers["legacy_abi_cuda"]
    assert cuda.device_type == "ort_cuda" and cuda.context_sources == ("legacy_abi_cuda",)
    assert "legacy_abi_tensorrt" in registry.providers
    # Not really there: only a session that asks for it fails, naming what ORT has.
    with pytest.raises(EpLoadFailed, match="has no CUDAExecutionProvider; available: .*CPU"):
        nxrt.InferenceSession(bf16_neg_model(), providers=["legacy_abi_cuda"], plugin_manager=pm)
    session = nxrt.InferenceSession(bf16_neg_model(), providers=["legacy_abi"], plugin_manager=pm)
    assert session.get_providers() == ["legacy_abi", "cpu"]


def test_a_malformed_library_list_is_reported(nxrt_pm, monkeypatch):
    monkeypatch.setenv(LIBRARIES_ENV, "just-a-path.so")
    with register_plugin(nxrt_pm, legacy_plugin, "legacy_abi"):
        with pytest.raises(EpLoadFailed, match="is not name=path"):
            Host(nxrt_pm).build_registry()


def test_hook_nxrt_ep_capabilities(pm):
    host = Host(pm)
    ep = host.build_registry().providers["legacy_abi"].factory(EpConfig())
    capabilities = host.capabilities(ep, "legacy_abi")
    assert capabilities.advertises("epcontext")
    assert capabilities.advertises("device:cpu")
    assert capabilities.advertises("ort:CPUExecutionProvider")


# -- whole models ------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_model_is_one_claim_and_matches_onnxruntime(pm, name):
    path = light_model_path(name)
    session = nxrt.InferenceSession(path, providers=["legacy_abi", "cpu"], plugin_manager=pm)
    report = session.get_partition()
    assert len(report.claims) == 1
    assert report.nodes_per_ep() == {"legacy_abi": len(report.nodes), "cpu": 0}
    assert report.refused_claims == []
    assert_matches_ort(path, session, dummy_feeds(session))


def test_transformer_block_matches_onnxruntime(pm):
    model = transformer_block()
    session = nxrt.InferenceSession(model, providers=["legacy_abi", "cpu"], plugin_manager=pm)
    (claim,) = session.get_partition().claims
    assert claim.inputs[0] == "x" and claim.outputs == ["y"]
    assert_matches_ort(model, session, transformer_feeds(model))


def test_a_session_run_wholly_by_ort_leaves_blas_threads_alone(pm, monkeypatch):
    from nxrt.host_parallel import HostParallel

    model = transformer_block(seq=16, hidden=32, heads=2, ffn=64)
    feeds = {"x": np.full((1, 16, 32), 0.1, np.float32)}
    capped = []
    real = HostParallel.run_limits
    monkeypatch.setattr(HostParallel, "run_limits", lambda self: capped.append(1) or real(self))
    session = nxrt.InferenceSession(model, providers=["legacy_abi", "cpu"], plugin_manager=pm)
    session.run(None, feeds)
    assert capped == [], "ORT has its own thread pool: no BLAS cap per run"
    mixed = nxrt.InferenceSession(model, providers=["cpu"], plugin_manager=pm)
    mixed.run(None, feeds)
    assert capped == [1]


def test_runs_from_several_threads(pm):
    model = transformer_block(seq=16, hidden=32, heads=2, ffn=64)
    session = nxrt.InferenceSession(model, providers=["legacy_abi"], plugin_manager=pm)
    feeds = [{"x": np.full((1, 16, 32), i / 10, np.float32)} for i in range(8)]
    expected = [session.run(None, f)[0] for f in feeds]
    results: dict[int, np.ndarray] = {}

    def work(i: int) -> None:
        for _ in range(20):
            results[i] = session.run(None, feeds[i])[0]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(8):
        np.testing.assert_array_equal(results[i], expected[i])


# -- split models ------------------------------------------------------------------------------


def bf16_neg_model() -> onnx.ModelProto:
    """MatMul -> Cast(bfloat16) -> Neg -> Cast(float) -> Mul(with the MatMul) -> Softmax.

    ORT's CPU provider has no bfloat16 Neg, while nxrt's cpu EP has no Cast: the
    model needs both EPs. The supported nodes are weakly connected through the
    MatMul -> Mul edge, yet one claim of all of them would wrap around the Neg.
    """
    w = numpy_helper.from_array(np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8), "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["a"], name="matmul"),
        helper.make_node("Cast", ["a"], ["a16"], to=TensorProto.BFLOAT16, name="to_bf16"),
        helper.make_node("Neg", ["a16"], ["n16"], name="neg"),
        helper.make_node("Cast", ["n16"], ["n"], to=TensorProto.FLOAT, name="to_float"),
        helper.make_node("Mul", ["n", "a"], ["m"], name="mul"),
        helper.make_node("Softmax", ["m"], ["y"], axis=-1, name="softmax"),
    ]
    graph = helper.make_graph(
        nodes,
        "mixed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
        [w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def bf16_neg_reference(x: np.ndarray, model: onnx.ModelProto) -> np.ndarray:
    import ml_dtypes

    w = numpy_helper.to_array(model.graph.initializer[0])
    a = x @ w
    m = -(a.astype(ml_dtypes.bfloat16).astype(np.float32)) * a
    e = np.exp(m - m.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_a_type_ort_lacks_splits_the_model_across_both_eps(pm):
    model = bf16_neg_model()
    session = nxrt.InferenceSession(model, providers=["legacy_abi", "cpu"], plugin_manager=pm)
    report = session.get_partition()
    placed = {p.node: p.ep for p in report.nodes}
    assert placed == {
        "matmul": "legacy_abi",
        "to_bf16": "legacy_abi",
        "neg": "cpu",
        "to_float": "legacy_abi",
        "mul": "legacy_abi",
        "softmax": "legacy_abi",
    }
    assert report.refused_claims == []  # split before the host had to refuse anything
    assert [sorted(n.name for n in c.nodes) for c in report.claims] == [
        ["matmul", "to_bf16"],
        ["mul", "softmax", "to_float"],
    ]
    (fallback,) = report.fallbacks()
    assert "no ai.onnx::Neg kernel for input types tensor(bfloat16)" in fallback.refusals[0][1]
    x = np.linspace(-2, 2, 32, dtype=np.float32).reshape(4, 8)
    np.testing.assert_allclose(
        session.run(None, {"x": x})[0], bf16_neg_reference(x, model), rtol=RTOL, atol=ATOL
    )


def test_nxrt_partition_shows_the_split(tmp_path):
    path = tmp_path / "mixed.onnx"
    onnx.save(bf16_neg_model(), path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NXRT_")}
    env["NXRT_PLUGINS"] = "cpu,legacy_abi"
    done = subprocess.run(
        [sys.executable, "-m", "nxrt.tools.cli", "partition", str(path), "--ep", "legacy_abi,cpu"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "3 partition(s)" in out
    assert "[0] legacy_abi: matmul, to_bf16" in out
    assert "[1] cpu: neg" in out
    assert "[2] legacy_abi: to_float, mul, softmax" in out


CUSTOM_OPS = OpRegistry("custom")


@CUSTOM_OPS.op("Twice", since=1, domain="pkg.nxrt")
def twice(x, /):
    return x * 2


class CustomOpPlugin:
    """A test EP with one op in a custom domain, which ONNX Runtime has never heard of."""

    @nxrt.hookimpl
    def nxrt_register(self, registry):
        from nxrt.provider import ExecutionProvider

        registry.add_provider("custom", lambda config: ExecutionProvider(config, CUSTOM_OPS))
        registry.add_kernels("custom", CUSTOM_OPS)


def custom_op_model(typed: bool = True) -> onnx.ModelProto:
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Twice", ["r"], ["t"], domain="pkg.nxrt", name="twice"),
        helper.make_node("Neg", ["t"], ["n"], name="neg"),
        helper.make_node("Add", ["n", "x"], ["y"], name="add"),
    ]
    value_info = [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2, 3])] if typed else []
    graph = helper.make_graph(
        nodes,
        "custom",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        value_info=value_info,
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("pkg.nxrt", 1)]
    return helper.make_model(graph, opset_imports=opsets)


def test_a_custom_domain_op_falls_back_to_the_ep_that_has_it(pm):
    x = np.array([[-1.0, 2.0, -3.0], [4.0, -5.0, 6.0]], np.float32)
    with register_plugin(pm, CustomOpPlugin(), "custom"):
        session = nxrt.InferenceSession(
            custom_op_model(), providers=["legacy_abi", "custom"], plugin_manager=pm
        )
        out = session.run(None, {"x": x})[0]
    np.testing.assert_allclose(out, -2 * np.maximum(x, 0) + x)
    report = session.get_partition()
    assert report.partitions == [
        ("legacy_abi", ["relu"]),
        ("custom", ["twice"]),
        ("legacy_abi", ["neg", "add"]),
    ]
    (fallback,) = report.fallbacks()
    assert fallback.refusals == [
        ("legacy_abi", "ONNX Runtime knows no schema for pkg.nxrt::Twice at opset 1")
    ]


def test_a_value_of_unknown_type_stays_outside_claims(pm):
    # Without a value_info nothing knows the type of Twice's output, nor of what follows it,
    # and ORT needs the type of every input of a standalone model.
    x = np.ones((2, 3), np.float32)
    with register_plugin(pm, CustomOpPlugin(), "custom"):
        session = nxrt.InferenceSession(
            custom_op_model(typed=False), providers=["legacy_abi", "custom"], plugin_manager=pm
        )
        np.testing.assert_allclose(session.run(None, {"x": x})[0], -x)
    placed = {p.node: p.ep for p in session.get_partition().nodes}
    assert placed == {"relu": "legacy_abi", "twice": "custom", "neg": "cpu", "add": "cpu"}
    neg = next(p for p in session.get_partition().nodes if p.node == "neg")
    assert "unknown type" in neg.refusals[0][1]


def test_ops_ort_runs_without_a_kernel_of_their_own_are_claimed(pm):
    # Constant becomes an initializer, CastLike is inlined from its ONNX function body,
    # and a float16 Sigmoid runs in float32 between Casts that ORT inserts itself.
    nodes = [
        helper.make_node("Constant", [], ["k"], value_float=0.5, name="constant"),
        helper.make_node("CastLike", ["k", "x"], ["k16"], name="castlike"),
        helper.make_node("Mul", ["x", "k16"], ["h"], name="mul"),
        helper.make_node("Sigmoid", ["h"], ["y"], name="sigmoid"),
    ]
    graph = helper.make_graph(
        nodes,
        "no_kernels",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    host = Host(pm)
    ep = host.build_registry().providers["legacy_abi"].factory(EpConfig())
    ep.initialize()
    graph = load_model(model)[0].graph
    (claim,) = host.claim_subgraphs(ep, "legacy_abi", graph, list(graph))
    assert {n.op_type for n in claim.nodes} >= {"CastLike", "Sigmoid"}
    session = nxrt.InferenceSession(model, providers=["legacy_abi"], plugin_manager=pm)
    x = np.array([-2.0, 0.0, 2.0], np.float16)
    expected = 1 / (1 + np.exp(-(x.astype(np.float32) * 0.5)))
    np.testing.assert_allclose(session.run(None, {"x": x})[0], expected, rtol=1e-3)


def test_claims_are_safe_to_contract():
    # matmul -> ... -> neg (unsupported) -> ... -> mul, and matmul -> mul.
    model = load_model(bf16_neg_model())[0]
    nodes = list(model.graph)
    supported = [n for n in nodes if n.name != "neg"]
    groups = group_claims(nodes, supported)
    assert [[n.name for n in g] for g in groups] == [
        ["matmul", "to_bf16"],
        ["to_float", "mul", "softmax"],
    ]
    # Contracting {matmul, mul} would also wrap around the unsupported path between them.
    assert len(group_claims(nodes, [n for n in nodes if n.name in ("matmul", "mul")])) == 2
    # With every node supported, the two paths that meet again stay one claim.
    assert [len(g) for g in group_claims(nodes, nodes)] == [len(nodes)]


def random_dag(rng: np.random.Generator, size: int) -> onnx.ModelProto:
    """Add/Neg nodes, each reading one or two earlier values."""
    values, nodes = ["x"], []
    for i in range(size):
        inputs = list(
            rng.choice(values, size=min(len(values), int(rng.integers(1, 3))), replace=False)
        )
        op = "Add" if len(inputs) == 2 else "Neg"
        nodes.append(helper.make_node(op, inputs, [f"v{i}"], name=f"n{i}"))
        values.append(f"v{i}")
    info = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])]
    out = [helper.make_tensor_value_info(f"v{size - 1}", TensorProto.FLOAT, [1])]
    graph = helper.make_graph(nodes, "dag", info, out)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("seed", range(20))
def test_claims_on_random_graphs_are_connected_and_contract_without_cycles(seed):
    from nxrt.pipeline.partition import creates_cycle

    rng = np.random.default_rng(seed)
    nodes = list(load_model(random_dag(rng, 30))[0].graph)
    supported = [n for n in nodes if rng.random() < 0.7]
    groups = group_claims(nodes, supported)
    position = {id(n): i for i, n in enumerate(nodes)}
    assert sorted(position[id(n)] for g in groups for n in g) == sorted(
        position[id(n)] for n in supported
    )
    group_of = {id(n): k for k, g in enumerate(groups) for n in g}
    for k, group in enumerate(groups):
        members = {position[id(n)] for n in group}
        assert not creates_cycle(members, nodes, position)
        linked, frontier = {id(group[0])}, [group[0]]
        while frontier:  # weakly connected through edges inside the group
            node = frontier.pop()
            for other in [*node.predecessors(), *node.successors()]:
                if group_of.get(id(other)) == k and id(other) not in linked:
                    linked.add(id(other))
                    frontier.append(other)
        assert len(linked) == len(group)


# -- plugin-EP libraries -----------------------------------------------------------------------


def library_session(pm, path):
    return nxrt.InferenceSession(
        bf16_neg_model(),
        providers=[("legacy_abi", {"ep_libraries": {"NxrtTestEp": str(path)}})],
        plugin_manager=pm,
    )


def test_a_library_path_that_does_not_exist_is_ep_load_failed(pm, tmp_path):
    path = tmp_path / "missing" / "libnxrt_test_ep.so"
    with pytest.raises(EpLoadFailed) as info:
        library_session(pm, path)
    assert info.value.path == str(path)
    assert "cannot open shared object file" in info.value.reason
    assert str(path) in str(info.value)


def test_a_file_that_is_not_a_library_is_ep_load_failed(pm, tmp_path):
    path = tmp_path / "libnot_a_library.so"
    path.write_text("this is a text file, not a shared library\n")
    with pytest.raises(EpLoadFailed) as info:
        library_session(pm, path)
    assert info.value.path == str(path)
    assert "Failed to load library" in info.value.reason


def test_a_library_that_is_no_ep_library_is_ep_load_failed(pm):
    # A real shared library, but not an EP library: ORT refuses it for its missing entry points.
    capi = os.path.join(os.path.dirname(ort.__file__), "capi")
    path = os.path.join(capi, "libonnxruntime_providers_shared.so")
    assert os.path.exists(path)
    with pytest.raises(EpLoadFailed) as info:
        library_session(pm, path)
    assert info.value.path == path
    assert "ONNX Runtime refused the EP library" in info.value.reason


def test_a_library_from_the_environment_fails_only_its_own_ep(nxrt_pm, monkeypatch, tmp_path):
    import nxrt_ep_cpu.plugin

    path = tmp_path / "libbroken_ep.so"
    path.write_bytes(b"\x7fELF broken")
    monkeypatch.setenv(LIBRARIES_ENV, f"BrokenExecutionProvider={path}")
    with register_plugin(nxrt_pm, nxrt_ep_cpu.plugin, "cpu"):
        with register_plugin(nxrt_pm, legacy_plugin, "legacy_abi"):
            with pytest.raises(EpLoadFailed, match="libbroken_ep.so"):
                nxrt.InferenceSession(
                    bf16_neg_model(), providers=["legacy_abi_broken"], plugin_manager=nxrt_pm
                )
            session = nxrt.InferenceSession(
                bf16_neg_model(), providers=["legacy_abi"], plugin_manager=nxrt_pm
            )
    assert session.get_providers() == ["legacy_abi", "cpu"]


def test_a_provider_onnxruntime_lacks_is_ep_load_failed(pm):
    with pytest.raises(EpLoadFailed, match="has no NoSuchExecutionProvider"):
        nxrt.InferenceSession(
            bf16_neg_model(),
            providers=[("legacy_abi", {"provider": "NoSuchExecutionProvider"})],
            plugin_manager=pm,
        )


# -- options, binding and errors ---------------------------------------------------------------


def compiled_kernels(session):
    return [s.kernel for s in session._plan.steps if s.ep == "legacy_abi"]


def test_options_reach_the_ort_session(pm):
    options = nxrt.SessionOptions()
    options.intra_op_num_threads = 1
    session = nxrt.InferenceSession(
        transformer_block(seq=8, hidden=16, heads=2, ffn=32),
        options,
        providers=[("legacy_abi", {"session_config": {"session.intra_op.allow_spinning": "0"}})],
        plugin_manager=pm,
    )
    (kernel,) = compiled_kernels(session)
    ort_options = kernel.session.get_session_options()
    assert ort_options.intra_op_num_threads == 1
    assert ort_options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert kernel.providers == ["CPUExecutionProvider"]


def test_io_binding_gives_the_same_results(pm):
    model = transformer_block(seq=16, hidden=32, heads=2, ffn=64)
    feeds = transformer_feeds(model)
    plain = nxrt.InferenceSession(model, providers=["legacy_abi"], plugin_manager=pm)
    bound = nxrt.InferenceSession(
        model, providers=[("legacy_abi", {"io_binding": True})], plugin_manager=pm
    )
    np.testing.assert_array_equal(plain.run(None, feeds)[0], bound.run(None, feeds)[0])


def test_bfloat16_and_float8_values_cross_the_boundary(pm):
    import ml_dtypes

    nodes = [
        helper.make_node("Cast", ["x"], ["f"], to=TensorProto.FLOAT),
        helper.make_node("Relu", ["f"], ["r"]),
        helper.make_node("Cast", ["r"], ["y"], to=TensorProto.BFLOAT16),
        helper.make_node("Cast", ["r"], ["z"], to=TensorProto.FLOAT8E4M3FN),
    ]
    graph = helper.make_graph(
        nodes,
        "raw_types",
        [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [3])],
        [
            helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [3]),
            helper.make_tensor_value_info("z", TensorProto.FLOAT8E4M3FN, [3]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    session = nxrt.InferenceSession(model, providers=["legacy_abi"], plugin_manager=pm)
    y, z = session.run(None, {"x": np.array([-1.5, 2.25, 3.0], ml_dtypes.bfloat16)})
    assert y.dtype == ml_dtypes.bfloat16 and z.dtype == ml_dtypes.float8_e4m3fn
    np.testing.assert_array_equal(y.astype(np.float32), [0.0, 2.25, 3.0])
    np.testing.assert_array_equal(z.astype(np.float32), [0.0, 2.25, 3.0])


def test_a_claim_nothing_reads_compiles_to_nothing(pm):
    # ORT refuses a model without outputs; a dead Constant is a claim of its own.
    graph = helper.make_graph(
        [
            helper.make_node("Constant", [], ["unused"], value_float=1.0, name="dead"),
            helper.make_node("Relu", ["x"], ["y"], name="relu"),
        ],
        "dead_code",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    graph = load_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))[
        0
    ].graph
    host = Host(pm)
    ep = host.build_registry().providers["legacy_abi"].factory(EpConfig())
    ep.initialize()
    claims = host.claim_subgraphs(ep, "legacy_abi", graph, list(graph))
    kernels = []
    for claim in claims:
        claim.inputs, claim.outputs = claim_boundary(claim, graph)
        kernels.append(ep.compile(claim, graph))
    assert sorted(
        len(k.compute([np.ones(2, np.float32)] * len(c.inputs))) for k, c in zip(kernels, claims)
    ) == [0, 1]


def test_an_ort_error_at_run_time_is_kernel_failed(pm):
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")],
        "bad_reshape",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("shape", TensorProto.INT64, [2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = nxrt.InferenceSession(model, providers=["legacy_abi"], plugin_manager=pm)
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(KernelFailed, match="on EP 'legacy_abi'.*ONNX Runtime") as info:
        session.run(None, {"x": x, "shape": np.array([4, 4], np.int64)})
    assert info.value.node == "legacy_abi_0"
    assert session.run(None, {"x": x, "shape": np.array([3, 2], np.int64)})[0].shape == (3, 2)


def test_a_loop_without_captures_is_claimed(pm):
    # nxrt's cpu EP has no Loop; a body that reads only its own inputs can go to ORT.
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Add", ["v_in", "v_in"], ["v_out"]),
        ],
        "double",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [2]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [2]),
        ],
    )
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["r"], name="relu"),
            helper.make_node("Loop", ["trips", "go", "r"], ["y"], body=body, name="loop"),
        ],
        "loop",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [
            numpy_helper.from_array(np.array(3, np.int64), "trips"),
            numpy_helper.from_array(np.array(True), "go"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = nxrt.InferenceSession(model, providers=["legacy_abi", "cpu"], plugin_manager=pm)
    (claim,) = session.get_partition().claims
    assert [n.name for n in claim.nodes] == ["relu", "loop"]
    out = session.run(None, {"x": np.array([-1.0, 2.0], np.float32)})[0]
    np.testing.assert_array_equal(out, [0.0, 16.0])


def test_subgraphs_that_capture_outer_values_are_not_claimed(pm):
    def branch(name, op):
        out = helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, [2])
        return helper.make_graph([helper.make_node(op, ["x"], [f"{name}_out"])], name, [], [out])

    node = helper.make_node(
        "If", ["c"], ["y"], then_branch=branch("then", "Relu"), else_branch=branch("else", "Neg")
    )
    graph = helper.make_graph(
        [node],
        "if",
        [
            helper.make_tensor_value_info("c", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = load_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))[0]
    host = Host(pm)
    ep = host.build_registry().providers["legacy_abi"].factory(EpConfig())
    ep.initialize()
    assert host.claim_subgraphs(ep, "legacy_abi", model.graph, list(model.graph)) == []
    match = host.match_kernel(ep, "legacy_abi", next(iter(model.graph)), 17)
    assert match.reason == "a subgraph reads the graph input 'x' from the enclosing graph"


# -- EPContext ---------------------------------------------------------------------------------


def test_epcontext_round_trip_through_the_host(pm):
    model = transformer_block(seq=16, hidden=32, heads=2, ffn=64)
    feeds = transformer_feeds(model)
    expected = ort_session(model).run(None, feeds)[0]
    host = Host(pm)
    registry = host.build_registry()
    ep = registry.providers["legacy_abi"].factory(EpConfig())
    ep.initialize()
    graph = load_model(model)[0].graph
    (claim,) = host.claim_subgraphs(ep, "legacy_abi", graph, list(graph))
    claim.name = "block"
    claim.inputs, claim.outputs = claim_boundary(claim, graph)
    kernel = ep.compile(claim, graph)
    context = host.save_context(ep, "legacy_abi", claim, kernel)
    assert context.source == "legacy_abi" and context.partition_name == "block"
    assert context.inputs == claim.inputs and context.outputs == ["y"]
    assert context.ep_sdk_version == ort.__version__ and context.hardware_architecture
    saved = onnx.load_from_string(context.ep_cache_context)
    assert {i.name for i in saved.graph.input} == {"x"}
    assert len(saved.graph.node) == len(claim.nodes)

    assert (
        build_ep_context_registry(registry.providers.values()).owner("legacy_abi") == "legacy_abi"
    )
    fresh = registry.providers["legacy_abi"].factory(EpConfig())
    fresh.initialize()
    loaded = host.load_context(fresh, "legacy_abi", context)
    initializers = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    args = [feeds[n] if n in feeds else initializers[n] for n in context.inputs]
    (out,) = loaded.compute(args)
    np.testing.assert_allclose(out, expected, rtol=RTOL, atol=ATOL)

"""The openvino EP: claims compiled by OpenVINO, checked against ONNX Runtime."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import nxrt_ep_openvino.plugin as openvino_plugin
import onnx
import onnx.parser
import onnxruntime as ort
import openvino as ov
import pytest
from nxrt_ep_openvino.capability import OpenVinoCapability
from nxrt_ep_openvino.context import ContextBlob
from nxrt_ep_openvino.provider import DEVICES_ENV
from onnx import helper, numpy_helper

import nxrt
from nxrt.claims import claim_boundary
from nxrt.errors import EpLoadFailed, InvalidArgument, InvalidModel, KernelFailed
from nxrt.host import Host
from nxrt.pipeline.model import load_model
from nxrt.provider import EpConfig
from nxrt.tools.testing import LIGHT_MODELS, dummy_feeds, light_model_path, register_plugin

RTOL, ATOL = 1e-3, 1e-4
#: What the subprocesses load: only the plugins these tests are about.
PLUGINS_ENV = {"NXRT_PLUGINS": "cpu,openvino"}


@pytest.fixture
def pm(nxrt_pm):
    """A plugin manager with the cpu and openvino plugins."""
    import nxrt_ep_cpu.plugin

    with register_plugin(nxrt_pm, nxrt_ep_cpu.plugin, "cpu"):
        with register_plugin(nxrt_pm, openvino_plugin, "openvino"):
            yield nxrt_pm


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NXRT_")}
    return {**env, **PLUGINS_ENV, **extra}


def ort_run(model, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if isinstance(model, onnx.ModelProto):
        model = model.SerializeToString()
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    return session.run(None, {i.name: feeds[i.name] for i in session.get_inputs()})


def assert_close(got, want) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)


def openvino_kernels(session) -> list:
    return [step.kernel for step in session._plan.steps if step.ep == "openvino"]


def with_weights(text: str, seed: int = 0, **shapes: tuple[int, ...]) -> onnx.ModelProto:
    """A model in ONNX's text form, with seeded random float32 weights of the given shapes."""
    model = onnx.parser.parse_model(text)
    rng = np.random.default_rng(seed)
    for name, shape in shapes.items():
        array = (rng.standard_normal(shape) * 0.3).astype(np.float32)
        model.graph.initializer.append(numpy_helper.from_array(array, name))
    return model


def mlp() -> onnx.ModelProto:
    """Two layers with an erf GELU, LayerNormalization and Softmax; the batch is dynamic."""
    return with_weights(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        mlp (float[N, 16] x) => (float[N, 16] y) {
            h = MatMul(x, w1)
            hb = Add(h, b1)
            half = Constant <value = float {0.5}> ()
            one = Constant <value = float {1.0}> ()
            root = Constant <value = float {1.4142135}> ()
            scaled = Div(hb, root)
            erf = Erf(scaled)
            erf1 = Add(erf, one)
            g = Mul(hb, erf1)
            gelu = Mul(g, half)
            o = MatMul(gelu, w2)
            n = LayerNormalization <axis = -1> (o, gamma, beta)
            y = Softmax <axis = -1> (n)
        }
        """,
        w1=(16, 64),
        b1=(64,),
        w2=(64, 16),
        gamma=(16,),
        beta=(16,),
    )


def mlp_feeds(batch: int = 4, seed: int = 1) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((batch, 16)).astype(np.float32)}


def det_model() -> onnx.ModelProto:
    """MatMul -> Relu -> {Det, ReduceSum} -> Mul -> Softmax: OpenVINO has no Det."""
    model = with_weights(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        mixed (float[4, 3, 3] x) => (float[4, 3] y) {
            a = MatMul(x, w)
            r = Relu(a)
            d = Det(r)
            one = Constant <value = int64[1] {1}> ()
            two = Constant <value = int64[1] {2}> ()
            du = Unsqueeze(d, one)
            s = ReduceSum <keepdims = 0> (r, two)
            m = Mul(s, du)
            y = Softmax <axis = -1> (m)
        }
        """,
        w=(3, 3),
    )
    for node in model.graph.node:
        node.name = node.output[0]
    return model


# -- discovery and registration ----------------------------------------------------------------


def test_discovery_registration_and_listing_do_not_import_openvino():
    code = (
        "import sys\n"
        "from nxrt.tools.cli import providers_info\n"
        "info = providers_info()\n"
        "ep = [p for p in info['providers'] if p['id'] == 'openvino'][0]\n"
        "print(ep['distribution'], ' '.join(ep['capabilities']))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'openvino'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(), check=True
    )
    listing, modules = done.stdout.strip().splitlines()
    assert listing.startswith("nxrt-ep-openvino ") and "epcontext" in listing
    assert "precision:f32" in listing
    assert modules == "[]"


def test_hook_nxrt_register(nxrt_pm, monkeypatch):
    monkeypatch.delenv(DEVICES_ENV, raising=False)
    with register_plugin(nxrt_pm, openvino_plugin, "openvino"):
        registry = Host(nxrt_pm).build_registry()
    main = registry.providers["openvino"]
    assert main.plugin == "openvino" and main.device_type == "cpu"
    assert main.context_sources == ("openvino",)
    assert registry.resolve("OpenVINOExecutionProvider") is main
    assert [i for i in registry.providers if i.startswith("openvino")] == ["openvino"]


def test_devices_named_in_the_environment_get_an_ep_each(pm, monkeypatch):
    monkeypatch.setenv(DEVICES_ENV, "GPU,NPU.1")
    registry = Host(pm).build_registry()
    assert registry.providers["openvino_gpu"].context_sources == ("openvino_gpu",)
    assert "openvino_npu_1" in registry.providers
    # Registered without opening OpenVINO; only a session that asks finds the device missing.
    with pytest.raises(EpLoadFailed, match="has no GPU device here; it lists CPU"):
        nxrt.InferenceSession(mlp(), providers=["openvino_gpu"], plugin_manager=pm)
    monkeypatch.setenv(DEVICES_ENV, "auto")  # what OpenVINO lists: the CPU alone here
    registry = Host(pm).build_registry()
    assert [i for i in registry.providers if i.startswith("openvino")] == ["openvino"]


def test_hook_nxrt_ep_capabilities(pm):
    host = Host(pm)
    factory = host.build_registry().providers["openvino"].factory
    capabilities = host.capabilities(factory(EpConfig()), "openvino")
    for flag in ("epcontext", "device:cpu", "openvino:CPU", "precision:f32", "dtype:float32"):
        assert capabilities.advertises(flag)
    bf16 = host.capabilities(factory(EpConfig(options={"precision": "bf16"})), "openvino")
    assert bf16.advertises("precision:bf16")


def test_unknown_or_bad_options_are_refused(pm):
    with pytest.raises(InvalidArgument, match="unknown openvino EP option"):
        nxrt.InferenceSession(
            mlp(), providers=[("openvino", {"precison": "f32"})], plugin_manager=pm
        )
    with pytest.raises(InvalidArgument, match="precision must be f32, bf16 or f16"):
        nxrt.InferenceSession(
            mlp(), providers=[("openvino", {"precision": "int8"})], plugin_manager=pm
        )


# -- options -----------------------------------------------------------------------------------


def test_f32_is_set_explicitly_and_threads_come_from_the_session(pm):
    options = nxrt.SessionOptions()
    options.intra_op_num_threads = 1
    session = nxrt.InferenceSession(mlp(), options, providers=["openvino"], plugin_manager=pm)
    (kernel,) = openvino_kernels(session)
    # On CPUs with AMX or AVX512-BF16 OpenVINO's own default is bf16: never left to it.
    assert str(kernel.compiled.get_property("INFERENCE_PRECISION_HINT")) == "<Type: 'float32'>"
    assert kernel.compiled.get_property("INFERENCE_NUM_THREADS") == 1
    assert str(kernel.compiled.get_property("PERFORMANCE_HINT")) == "LATENCY"


def test_precision_hint_and_cache_options_reach_openvino(pm, tmp_path):
    cache = tmp_path / "cache"
    providers = [
        ("openvino", {"performance_hint": "throughput", "num_threads": 2, "cache_dir": str(cache)})
    ]
    session = nxrt.InferenceSession(mlp(), providers=providers, plugin_manager=pm)
    (kernel,) = openvino_kernels(session)
    assert str(kernel.compiled.get_property("PERFORMANCE_HINT")) == "THROUGHPUT"
    assert kernel.compiled.get_property("INFERENCE_NUM_THREADS") == 2
    assert any(cache.iterdir()), "OpenVINO writes its compiled model to cache_dir"
    assert_close(session.run(None, mlp_feeds()), ort_run(mlp(), mlp_feeds()))


def test_bf16_is_opt_in_and_stays_near_f32(pm):
    core = ov.Core()
    if "BF16" not in core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
        with pytest.raises(InvalidArgument, match="has no bf16"):
            nxrt.InferenceSession(mlp(), providers=[("openvino", {"precision": "bf16"})])
        return
    session = nxrt.InferenceSession(
        mlp(), providers=[("openvino", {"precision": "bf16"})], plugin_manager=pm
    )
    (kernel,) = openvino_kernels(session)
    assert str(kernel.compiled.get_property("INFERENCE_PRECISION_HINT")) == "<Type: 'bfloat16'>"
    (got,) = session.run(None, mlp_feeds())
    (want,) = ort_run(mlp(), mlp_feeds())
    assert np.abs(got - want).max() < 0.05  # bf16 keeps 8 bits of mantissa


# -- whole models ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_model_is_one_claim_and_matches_onnxruntime(pm, name):
    """Every node in one claim; logits and probabilities within 1e-3 / 1e-4 of ORT.

    The light models' weights are all one constant, so their logits are equal in
    exact arithmetic and large (squeezenet's reach 1e10). Where one float32 step of
    a logit exceeds 0.01 the Softmax over them is decided by rounding order alone,
    and only the logits can be compared.
    """
    model = onnx.load(light_model_path(name))
    last = model.graph.node[-1]
    logits = last.input[0] if last.op_type == "Softmax" else None
    if logits is not None:
        model.graph.output.append(
            helper.make_tensor_value_info(logits, onnx.TensorProto.FLOAT, None)
        )
    session = nxrt.InferenceSession(model, providers=["openvino", "cpu"], plugin_manager=pm)
    report = session.get_partition()
    assert len(report.claims) == 1
    assert report.nodes_per_ep() == {"openvino": len(report.nodes), "cpu": 0}
    feeds = dummy_feeds(session)
    got, want = session.run(None, feeds), ort_run(model, feeds)
    np.testing.assert_allclose(got[-1], want[-1], rtol=RTOL, atol=ATOL)
    if logits is not None and np.abs(want[-1]).max() * np.finfo(np.float32).eps > 0.01:
        return
    assert_close(got, want)


def test_large_read_only_weights_stay_in_one_claim(pm):
    """Weights of 64 KiB and more reach OpenVINO from nxrt's own (read-only) arrays."""
    model = with_weights(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        wide (float[2, 256] x) => (float[2, 256] y) {
            h = MatMul(x, w1)
            r = Relu(h)
            y = MatMul(r, w2)
        }
        """,
        w1=(256, 512),
        w2=(512, 256),
    )
    session = nxrt.InferenceSession(model, providers=["openvino", "cpu"], plugin_manager=pm)
    assert session.get_partition().nodes_per_ep() == {"openvino": 3, "cpu": 0}
    x = {"x": np.random.default_rng(0).standard_normal((2, 256)).astype(np.float32)}
    assert_close(session.run(None, x), ort_run(model, x))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mobilenet_v2", "bert_base"])
def test_real_architectures_match_onnxruntime(pm, name, tmp_path):
    """torch.onnx.export of seeded random weights, built as benchmarks/bench_openvino.py does."""
    pytest.importorskip("torch")
    if importlib.util.find_spec("torchvision") is None:  # imported by the builder, not here
        pytest.skip("torchvision is not installed")
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
    import bench_openvino

    path, _ = bench_openvino.build(name, str(tmp_path))
    session = nxrt.InferenceSession(path, providers=["openvino", "cpu"], plugin_manager=pm)
    assert len(session.get_partition().claims) == 1
    feeds = bench_openvino.feeds_for(name, session)
    assert_close(session.run(None, feeds), ort_run(path, feeds))


def test_a_second_session_asks_openvino_nothing(pm):
    path = light_model_path("squeezenet")
    nxrt.InferenceSession(path, providers=["openvino"], plugin_manager=pm)
    session = nxrt.InferenceSession(path, providers=["openvino"], plugin_manager=pm)
    ep = next(ep for ep in session._eps if ep[0].id == "openvino")[0]
    assert ep.capability.questions == 0, "node answers are cached by signature"


# -- split models ------------------------------------------------------------------------------


def test_a_node_openvino_cannot_convert_runs_on_the_cpu_ep(pm):
    model = det_model()
    session = nxrt.InferenceSession(model, providers=["openvino", "cpu"], plugin_manager=pm)
    report = session.get_partition()
    placed = {p.node: p.ep for p in report.nodes}
    assert placed.pop("d") == "cpu"
    assert set(placed.values()) == {"openvino"}
    (fallback,) = report.fallbacks()
    ep, reason = fallback.refusals[0]
    assert ep == "openvino"
    assert "OpenVINO's ONNX frontend cannot convert ai.onnx::Det" in reason
    assert "No conversion rule found for operations: Det" in reason
    x = np.random.default_rng(0).standard_normal((4, 3, 3)).astype(np.float32)
    assert_close(session.run(None, {"x": x}), ort_run(model, {"x": x}))


def test_nxrt_partition_names_openvinos_reason(tmp_path):
    path = tmp_path / "mixed.onnx"
    onnx.save(det_model(), path)
    done = subprocess.run(
        [sys.executable, "-m", "nxrt.tools.cli", "partition", str(path), "--ep", "openvino,cpu"],
        capture_output=True,
        text=True,
        env=clean_env(),
    )
    assert done.returncode == 0, done.stderr
    assert "cpu: d" in done.stdout
    assert "cannot convert ai.onnx::Det" in done.stdout


def test_float64_is_left_to_an_ep_that_computes_it_exactly(pm):
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "x"], ["y"], name="add")],
        "double",
        [helper.make_tensor_value_info("x", onnx.TensorProto.DOUBLE, [2])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.DOUBLE, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = nxrt.InferenceSession(model, providers=["openvino", "cpu"], plugin_manager=pm)
    (placement,) = session.get_partition().nodes
    assert placement.ep == "cpu"
    assert "float64, which OpenVINO's CPU plugin computes as float32" in placement.refusals[0][1]
    x = np.array([1.0, 1e-12], np.float64)
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], x + x)


def test_a_claim_that_fails_as_a_whole_loses_the_first_node_that_breaks_it():
    """The bisection over prefixes finds the shortest failing one in log2(n) attempts."""
    nodes = list(range(13))
    asked = []

    def fails(part):
        asked.append(len(part))
        return "broken" if 9 in part else ""

    assert OpenVinoCapability._first_failing(nodes, fails) == (9, "broken")
    assert len(asked) <= 5


# -- runs --------------------------------------------------------------------------------------


def test_dynamic_batch_is_compiled_once_and_right_for_every_size(pm):
    session = nxrt.InferenceSession(mlp(), providers=["openvino"], plugin_manager=pm)
    (kernel,) = openvino_kernels(session)
    assert "dynamic shapes" in kernel.variant_reason
    for batch in (1, 3, 8, 2):
        feeds = mlp_feeds(batch, seed=batch)
        assert_close(session.run(None, feeds), ort_run(mlp(), feeds))


def test_runs_from_several_threads(pm):
    """Each thread gets its own infer request; the compiled model is shared."""
    session = nxrt.InferenceSession(mlp(), providers=["openvino"], plugin_manager=pm)
    feeds = [mlp_feeds(batch=1 + i % 3, seed=i) for i in range(8)]
    expected = [session.run(None, f)[0] for f in feeds]
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(
            pool.map(lambda i: [session.run(None, feeds[i])[0] for _ in range(20)], range(8))
        )
    for runs, want in zip(results, expected):
        assert len(runs) == 20
        for got in runs:
            np.testing.assert_array_equal(got, want)


def test_outputs_belong_to_the_caller(pm):
    session = nxrt.InferenceSession(mlp(), providers=["openvino"], plugin_manager=pm)
    (first,) = session.run(None, mlp_feeds(seed=1))
    kept = first.copy()
    session.run(None, mlp_feeds(seed=2))
    np.testing.assert_array_equal(first, kept)  # not a view of OpenVINO's output buffer
    # session-owned, as onnxruntime's outputs: a view whose base is the array nxrt computed
    owner = first if first.base is None else first.base
    assert first.flags.writeable and owner.flags.owndata


def test_an_openvino_error_at_run_time_is_kernel_failed(pm):
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")],
        "bad_reshape",
        [
            helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("shape", onnx.TensorProto.INT64, [2]),
        ],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = nxrt.InferenceSession(model, providers=["openvino"], plugin_manager=pm)
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(KernelFailed, match="on EP 'openvino'.*OpenVINO"):
        session.run(None, {"x": x, "shape": np.array([4, 4], np.int64)})
    assert session.run(None, {"x": x, "shape": np.array([3, 2], np.int64)})[0].shape == (3, 2)


# -- EPContext ---------------------------------------------------------------------------------

LOAD_AND_RUN = """
import json, sys
import numpy as np
import nxrt
options = nxrt.SessionOptions()
options.add_session_config_entry("session.disable_model_compile", "1")
session = nxrt.InferenceSession(sys.argv[1], options, providers=["openvino", "cpu"])
feeds = dict(np.load(sys.argv[2]))
np.save(sys.argv[3], session.run(None, feeds)[0])
reasons = [s.kernel.variant_reason for s in session._plan.steps if s.ep == "openvino"]
print(json.dumps(reasons))
"""


def compile_cli(source, output, embed_mode: int) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "nxrt.tools.cli", "compile", str(source), "-o", str(output)]
        + ["--ep", "openvino,cpu", "--embed-mode", str(embed_mode)],
        capture_output=True,
        text=True,
        env=clean_env(),
    )
    assert done.returncode == 0, done.stderr


def context_nodes(path) -> list[onnx.NodeProto]:
    return [n for n in onnx.load(path).graph.node if n.op_type == "EPContext"]


def attribute(node: onnx.NodeProto, name: str):
    return next(helper.get_attribute_value(a) for a in node.attribute if a.name == name)


@pytest.mark.parametrize("embed_mode", [1, 0])
def test_epcontext_round_trip_in_a_fresh_process(tmp_path, embed_mode):
    source, compiled = tmp_path / "mixed.onnx", tmp_path / "mixed_ctx.onnx"
    model = det_model()
    onnx.save(model, source)
    compile_cli(source, compiled, embed_mode)
    nodes = context_nodes(compiled)
    assert len(nodes) == 2  # the two claims around the Det, which stays a node
    assert "Det" in [n.op_type for n in onnx.load(compiled).graph.node]
    for node in nodes:
        assert attribute(node, "source") == b"openvino"
        assert attribute(node, "ep_sdk_version").decode() == ov.get_version()
        assert attribute(node, "hardware_architecture") == b"CPU"
        assert attribute(node, "embed_mode") == embed_mode
    metadata = {p.key: p.value for p in onnx.load(compiled).metadata_props}
    assert metadata["ep_compatibility_info.openvino"] == f"{ov.get_version()};CPU"
    if embed_mode == 0:
        assert sorted(p.name for p in tmp_path.glob("*.ctx")) == [
            f"mixed_ctx_{attribute(n, 'partition_name').decode()}.ctx" for n in nodes
        ]
    x = np.random.default_rng(3).standard_normal((4, 3, 3)).astype(np.float32)
    np.savez(tmp_path / "feeds.npz", x=x)
    done = subprocess.run(
        [sys.executable, "-c", LOAD_AND_RUN, str(compiled), str(tmp_path / "feeds.npz")]
        + [str(tmp_path / "out.npy")],
        capture_output=True,
        text=True,
        env=clean_env(),
    )
    assert done.returncode == 0, done.stderr
    reasons = json.loads(done.stdout.strip().splitlines()[-1])
    assert reasons and all(r.startswith("imported from its EPContext") for r in reasons)
    np.testing.assert_allclose(
        np.load(tmp_path / "out.npy"), ort_run(model, {"x": x})[0], RTOL, ATOL
    )


def rewrite_contexts(path, out, **changes) -> None:
    """Change attributes of every EPContext node (``onnx`` to drop the kept ONNX model)."""
    model = onnx.load(path)
    for node in model.graph.node:
        if node.op_type != "EPContext":
            continue
        for attr in node.attribute:
            if attr.name in changes:
                attr.s = changes[attr.name].encode()
            if attr.name == "ep_cache_context" and changes.get("onnx") == "":
                data = ContextBlob.unpack(attr.s)
                attr.s = ContextBlob(data.openvino, data.device, data.precision, data.blob).pack()
    onnx.save(model, out)


def test_a_context_from_another_openvino_is_recompiled_or_refused(pm, tmp_path):
    source, compiled = tmp_path / "m.onnx", tmp_path / "m_ctx.onnx"
    onnx.save(mlp(), source)
    compile_cli(source, compiled, 1)
    options = nxrt.SessionOptions()
    options.add_session_config_entry("session.disable_model_compile", "1")

    older = tmp_path / "older.onnx"
    rewrite_contexts(compiled, older, ep_sdk_version="2020.1.0")
    session = nxrt.InferenceSession(str(older), options, providers=["openvino"], plugin_manager=pm)
    (kernel,) = openvino_kernels(session)
    assert kernel.variant_reason.startswith("recompiled from its ONNX model")
    assert "was compiled by OpenVINO 2020.1.0" in kernel.variant_reason
    assert_close(session.run(None, mlp_feeds()), ort_run(mlp(), mlp_feeds()))

    bare = tmp_path / "bare.onnx"
    rewrite_contexts(compiled, bare, ep_sdk_version="2020.1.0", onnx="")
    with pytest.raises(InvalidModel, match=r"2020\.1\.0.*keeps no ONNX model.*nxrt compile"):
        nxrt.InferenceSession(str(bare), options, providers=["openvino"], plugin_manager=pm)

    elsewhere = tmp_path / "gpu.onnx"
    rewrite_contexts(compiled, elsewhere, hardware_architecture="GPU", onnx="")
    with pytest.raises(InvalidModel, match="compiled for GPU, this EP runs on CPU"):
        nxrt.InferenceSession(str(elsewhere), options, providers=["openvino"], plugin_manager=pm)


def test_context_model_false_saves_the_blob_alone(pm):
    host = Host(pm)
    descriptor = host.build_registry().providers["openvino"]
    ep = descriptor.factory(EpConfig(options={"context_model": False}))
    ep.initialize()
    graph = load_model(mlp())[0].graph
    (claim,) = host.claim_subgraphs(ep, "openvino", graph, list(graph), dict(graph.opset_imports))
    claim.name = "mlp"
    claim.inputs, claim.outputs = claim_boundary(claim, graph)
    kernel = ep.compile(claim, graph)
    context = host.save_context(ep, "openvino", claim, kernel)
    assert context.inputs == ["x"] and context.outputs == ["y"]  # weights are in the blob
    data = ContextBlob.unpack(context.ep_cache_context)
    assert data.onnx == b"" and data.blob and data.precision == "f32"
    loaded = host.load_context(ep, "openvino", context)
    feeds = mlp_feeds()
    (out,) = loaded.compute([feeds["x"]])
    np.testing.assert_allclose(out, ort_run(mlp(), feeds)[0], RTOL, ATOL)


# -- the EP authors' kit -----------------------------------------------------------------------


@pytest.mark.slow
def test_the_kit_passes_for_openvino(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--nxrt-ep", "openvino", "-q", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=clean_env(),
    )
    assert done.returncode == 0, done.stdout[-4000:]
    passed = int(re.search(r"(\d+) passed", done.stdout).group(1))
    assert passed > 1000, done.stdout[-2000:]

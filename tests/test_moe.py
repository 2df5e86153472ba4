"""pkg.nxrt::BlockQuantizedMoE: schema, cpu kernel vs the numpy reference, negotiation, paging."""

from __future__ import annotations

import itertools
import json
import os

import numpy as np
import onnx
import onnx.defs
import pytest
from onnx import TensorProto

import nxrt
import nxrt_ep_cpu.ops.moe as cpu_moe
from moe_models import (
    SMALL,
    MoeConfig,
    RecordingMoePlugin,
    expert_tensors,
    make_moe_model,
    moe_node_model,
)
from nxrt import contrib_ops
from nxrt.errors import InvalidModel, KernelFailed, OutOfMemory
from nxrt.moe.reference import (
    block_quantized_moe,
    dequantize_blockwise,
    pack,
    quantize_blockwise,
    route,
    unpack,
)
from nxrt.pipeline.external_data import ExternalLazyWeight
from nxrt.tools.testing import register_plugin
from nxrt.weight import LazyWeight

ATTRS = {"top_k": 2, "bits": 4, "block_size": 16, "activation": "silu"}


@pytest.fixture
def cpu_pm(nxrt_pm):
    import nxrt_ep_cpu.plugin

    with register_plugin(nxrt_pm, nxrt_ep_cpu.plugin, "cpu"):
        yield nxrt_pm


def weights_for(
    experts=4, hidden=32, inter=48, bits=4, block=16, activation="silu", zp=False, dtype="float32"
):
    config = MoeConfig(
        experts=experts,
        hidden=hidden,
        intermediate=inter,
        bits=bits,
        block_size=block,
        activation=activation,
        zero_points=zp,
        dtype=dtype,
    )
    return expert_tensors(config)


def inputs_for(tokens, hidden, experts, dtype=np.float32, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((tokens, hidden)).astype(dtype)
    logits = rng.standard_normal((tokens, experts)).astype(dtype)
    return x, logits


# -- schema ------------------------------------------------------------------------------------


def test_schema_is_registered_idempotently_with_types_and_defaults():
    contrib_ops.register()
    contrib_ops.register()
    schema = onnx.defs.get_schema("BlockQuantizedMoE", 1, "pkg.nxrt")
    assert [i.name for i in schema.inputs][:2] == ["X", "router_logits"]
    assert schema.inputs[6].option == onnx.defs.OpSchema.FormalParameterOption.Optional
    constraints = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    assert constraints == {"T": {"tensor(float)", "tensor(float16)"}, "T1": {"tensor(uint8)"}}
    assert schema.attributes["normalize_routing_weights"].default_value.i == 0
    assert schema.attributes["top_k"].required and schema.attributes["activation"].required


def test_checker_and_shape_inference_know_the_op():
    model = moe_node_model(weights_for(), **ATTRS)
    onnx.checker.check_model(model, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    (y,) = [o for o in inferred.graph.output if o.name == "Y"]
    assert y.type.tensor_type.elem_type == TensorProto.FLOAT
    bad = moe_node_model(weights_for(), **{**ATTRS, "top_k": 1.5})
    with pytest.raises(onnx.checker.ValidationError, match="top_k"):
        onnx.checker.check_model(bad)


def test_shape_inference_reports_inconsistent_weights():
    model = moe_node_model(weights_for(), **{**ATTRS, "bits": 8})  # weights packed for 4 bits
    with pytest.raises(onnx.shape_inference.InferenceError, match="H\\*bits/8"):
        onnx.shape_inference.infer_shapes(model, strict_mode=True)
    model = moe_node_model(weights_for(), **{**ATTRS, "block_size": 24})
    with pytest.raises(onnx.shape_inference.InferenceError, match="power of two"):
        onnx.shape_inference.infer_shapes(model, strict_mode=True)


# -- reference building blocks -----------------------------------------------------------------


def test_pack_puts_the_lower_index_element_in_the_low_nibble():
    assert pack(np.array([[1, 2, 15, 0]]), 4).tolist() == [[0x21, 0x0F]]
    assert unpack(np.array([[0x21, 0x0F]], np.uint8), 4).tolist() == [[1, 2, 15, 0]]


@pytest.mark.parametrize(("bits", "zp"), list(itertools.product((4, 8), (False, True))))
def test_quantize_then_dequantize_is_close(bits, zp):
    w = np.random.default_rng(0).standard_normal((6, 64))
    packed, scales, zeros = quantize_blockwise(w, bits, 16, zero_points=zp)
    restored = dequantize_blockwise(packed, scales, zeros, bits, 16)
    step = np.abs(w).max() / (2 ** (bits - 1) - 1)
    assert np.abs(restored - w).max() <= step
    cpu = cpu_moe.dequantize(packed, scales, zeros, bits, 16)
    np.testing.assert_allclose(cpu, restored, rtol=1e-6, atol=1e-6)


def test_top_k_ties_go_to_the_lower_expert_index():
    logits = np.array(
        [[1.0, 3.0, 3.0, 3.0], [0.0, 0.0, 0.0, 0.0], [2.0, 1.0, 2.0, 1.0]], np.float32
    )
    experts, weights = route(logits, 2)
    assert experts.tolist() == [[1, 2], [0, 1], [0, 2]]
    cpu_experts, _ = cpu_moe.route(logits, 2, 0)
    assert cpu_experts.tolist() == experts.tolist()
    _, normalized = route(logits, 2, normalize=1)
    np.testing.assert_allclose(normalized.sum(axis=1), 1.0)


def test_tied_routing_gives_the_same_output_as_explicit_experts():
    w = weights_for()
    x, _ = inputs_for(3, 32, 4)
    tied = np.zeros((3, 4), np.float32)  # every expert equally likely: experts 0 and 1 win
    forced = np.full((3, 4), -30.0, np.float32)
    forced[:, :2] = 0.0
    a = cpu_moe.block_quantized_moe(x, tied, *w.values(), **ATTRS, normalize_routing_weights=1)
    b = cpu_moe.block_quantized_moe(x, forced, *w.values(), **ATTRS, normalize_routing_weights=1)
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


# -- the cpu kernel against the reference ------------------------------------------------------


@pytest.mark.parametrize(
    ("activation", "bits", "zp", "normalize", "dtype"),
    list(
        itertools.product(
            ("relu", "gelu", "silu", "swiglu"),
            (4, 8),
            (False, True),
            (0, 1),
            ("float32", "float16"),
        )
    ),
)
def test_cpu_kernel_matches_the_reference(activation, bits, zp, normalize, dtype):
    w = weights_for(bits=bits, activation=activation, zp=zp, dtype=dtype)
    x, logits = inputs_for(5, 32, 4, dtype=np.dtype(dtype))
    attrs = {
        "top_k": 2,
        "bits": bits,
        "block_size": 16,
        "activation": activation,
        "normalize_routing_weights": normalize,
    }
    expected = block_quantized_moe(x, logits, *w.values(), **attrs)
    got = cpu_moe.block_quantized_moe(x, logits, *w.values(), **attrs)
    assert got.dtype == np.dtype(dtype) and got.shape == x.shape
    tol = 1e-5 if dtype == "float32" else 2e-3
    scale = np.abs(expected.astype(np.float64)).max()
    np.testing.assert_allclose(got, expected, rtol=tol, atol=tol * scale)


def test_session_runs_an_embedded_moe_against_the_reference(cpu_pm):
    w = weights_for(activation="swiglu", zp=True)
    model = moe_node_model(w, **{**ATTRS, "activation": "swiglu", "top_k": 3})
    x, logits = inputs_for(7, 32, 4)
    sess = nxrt.InferenceSession(model, providers=["cpu"], plugin_manager=cpu_pm)
    (y,) = sess.run(None, {"X": x, "router_logits": logits})
    expected = block_quantized_moe(
        x, logits, *w.values(), **{**ATTRS, "activation": "swiglu", "top_k": 3}
    )
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)


def test_only_routed_experts_are_dequantised(monkeypatch):
    calls = []
    real = cpu_moe.dequantize

    def spy(packed, *args):
        calls.append(packed.shape)
        return real(packed, *args)

    monkeypatch.setattr(cpu_moe, "dequantize", spy)
    w = weights_for(experts=8)
    x, _ = inputs_for(4, 32, 8)
    logits = np.full((4, 8), -10.0, np.float32)
    logits[:, 3] = logits[:, 5] = 1.0  # every token picks experts 3 and 5
    cpu_moe.block_quantized_moe(x, logits, *w.values(), **ATTRS)
    assert len(calls) == 4  # fc1 and fc2 of two experts, not of eight


@pytest.mark.parametrize(
    ("attrs", "match"),
    [
        ({**ATTRS, "bits": 3}, "bits must be 4 or 8"),
        ({**ATTRS, "block_size": 8}, "power of two >= 16"),
        ({**ATTRS, "activation": "tanh"}, "activation must be one of"),
        ({**ATTRS, "top_k": 0}, "top_k must be >= 1"),
        ({**ATTRS, "normalize_routing_weights": 2}, "normalize_routing_weights"),
    ],
)
def test_bad_attributes_are_refused_at_session_creation(cpu_pm, attrs, match):
    model = moe_node_model(weights_for(), **attrs)
    with pytest.raises(InvalidModel, match=match):
        nxrt.InferenceSession(model, providers=["cpu"], plugin_manager=cpu_pm)


def test_bad_shapes_fail_the_run_with_a_clear_message(cpu_pm):
    w = weights_for()
    model = moe_node_model(w, **{**ATTRS, "activation": "swiglu"})  # fc1 is I rows, not 2I
    sess = nxrt.InferenceSession(model, providers=["cpu"], plugin_manager=cpu_pm)
    x, logits = inputs_for(2, 32, 4)
    with pytest.raises(KernelFailed, match="swiglu with I=48 needs 96"):
        sess.run(None, {"X": x, "router_logits": logits})
    with pytest.raises(KernelFailed, match="top_k=5 must be between 1 and E=4"):
        cpu_moe.block_quantized_moe(x, logits, *w.values(), **{**ATTRS, "top_k": 5})


# -- negotiation -------------------------------------------------------------------------------


def test_an_ep_advertising_nxrt_receives_lazy_handles(tmp_path, nxrt_pm):
    w = weights_for()
    path = moe_node_model(w, folder=str(tmp_path), **ATTRS)
    plugin = RecordingMoePlugin(flags=("nxrt",))
    with register_plugin(nxrt_pm, plugin, "rec"):
        sess = nxrt.InferenceSession(path, providers=["rec"], plugin_manager=nxrt_pm)
        x, logits = inputs_for(3, 32, 4)
        (y,) = sess.run(None, {"X": x, "router_logits": logits})
    assert plugin.received == [[ExternalLazyWeight] * 4]
    np.testing.assert_allclose(y, block_quantized_moe(x, logits, *w.values(), **ATTRS), rtol=1e-6)


def test_a_stock_ep_receives_resident_arrays(tmp_path, nxrt_pm):
    w = weights_for()
    path = moe_node_model(w, folder=str(tmp_path), **ATTRS)
    plugin = RecordingMoePlugin(flags=("device:cpu",))
    with register_plugin(nxrt_pm, plugin, "rec"):
        sess = nxrt.InferenceSession(path, providers=["rec"], plugin_manager=nxrt_pm)
        x, logits = inputs_for(3, 32, 4)
        (y,) = sess.run(None, {"X": x, "router_logits": logits})
    assert plugin.received == [[np.ndarray] * 4]
    np.testing.assert_allclose(y, block_quantized_moe(x, logits, *w.values(), **ATTRS), rtol=1e-6)


def test_a_weight_also_read_by_another_node_is_resident(tmp_path, nxrt_pm):
    import nxrt_ep_cpu.plugin

    w = weights_for()
    path = moe_node_model(w, folder=str(tmp_path), extra_reader=True, **ATTRS)
    plugin = RecordingMoePlugin(flags=("nxrt",))
    with (
        register_plugin(nxrt_pm, plugin, "rec"),
        register_plugin(nxrt_pm, nxrt_ep_cpu.plugin, "cpu"),
    ):
        sess = nxrt.InferenceSession(path, providers=["rec", "cpu"], plugin_manager=nxrt_pm)
        x, logits = inputs_for(3, 32, 4)
        y, copy = sess.run(None, {"X": x, "router_logits": logits})
    assert plugin.received == [
        [ExternalLazyWeight, np.ndarray, ExternalLazyWeight, ExternalLazyWeight]
    ]
    np.testing.assert_array_equal(copy, w["fc1_scales"])


def test_the_cpu_ep_advertises_nxrt_and_pages_lazy_weights(tmp_path, cpu_pm):
    w = weights_for()
    path = moe_node_model(w, folder=str(tmp_path), **ATTRS)
    sess = nxrt.InferenceSession(path, providers=["cpu"], plugin_manager=cpu_pm)
    assert sess.get_capabilities("cpu").advertises("nxrt")
    lazy = [c for c in sess._plan.constants.values() if isinstance(c, LazyWeight)]
    assert len(lazy) == 4
    x, logits = inputs_for(3, 32, 4)
    (y,) = sess.run(None, {"X": x, "router_logits": logits})
    np.testing.assert_allclose(y, block_quantized_moe(x, logits, *w.values(), **ATTRS), rtol=1e-5)
    manager = sess._eps[0][0].expert_residency
    assert manager.stats["page_ins"] == 4  # the whole bank, brought in at the first run


# -- budgets -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("moe_small")
    info = make_moe_model(str(folder), SMALL)
    return str(folder), info


def run_small(small_model, pm, options=None):
    folder, _ = small_model
    expected = np.load(os.path.join(folder, "expected.npz"))
    sess = nxrt.InferenceSession(
        os.path.join(folder, "model.onnx"), providers=[("cpu", options or {})], plugin_manager=pm
    )
    outputs = [sess.run(None, {"X": expected["X"]})[0] for _ in range(2)]
    return sess, outputs, expected["Y"]


def test_generated_model_is_the_same_fully_resident_and_under_an_eighth(small_model, cpu_pm):
    folder, info = small_model
    with open(os.path.join(folder, "moe.json"), encoding="utf-8") as f:
        assert json.load(f)["bank_bytes"] == info["bank_bytes"]
    resident, (r1, r2), expected = run_small(small_model, cpu_pm)
    budget = info["bank_bytes"] // 8
    paged, (p1, p2), _ = run_small(small_model, cpu_pm, {"nxrt.expert_memory_budget": budget})
    np.testing.assert_allclose(r1, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(r1, p1)
    np.testing.assert_array_equal(p1, p2)
    np.testing.assert_array_equal(r1, r2)
    full = resident._eps[0][0].expert_residency
    small = paged._eps[0][0].expert_residency
    assert full.resident_bytes == info["bank_bytes"] and not full.plan.degraded
    assert small.resident_bytes <= budget and small.plan.degraded
    assert small.governor.peak <= budget
    assert small.stats["evictions"] > 0


def test_budget_option_accepts_units_and_the_static_profile_policy(small_model, cpu_pm):
    _, info = small_model
    kib = -(-info["bank_bytes"] // 2 // 1024)
    options = {
        "nxrt.expert_memory_budget": f"{kib}KiB",
        "nxrt.expert_residency_policy": "static_profile",
        "nxrt.expert_usage_profile": "0,9,0,0,0,0,0,5",
    }
    sess, (y, _), expected = run_small(small_model, cpu_pm, options)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)
    manager = sess._eps[0][0].expert_residency
    assert manager.budget == kib * 1024
    assert {(0, 1), (0, 7)} <= set(manager.plan.resident)
    assert manager.policy.name == "static-profile"


def test_a_budget_smaller_than_one_expert_is_out_of_memory(small_model, cpu_pm):
    _, info = small_model
    with pytest.raises(OutOfMemory) as error:
        run_small(small_model, cpu_pm, {"nxrt.expert_memory_budget": info["expert_bytes"] - 1})
    assert error.value.requested == info["expert_bytes"]
    assert error.value.available == info["expert_bytes"] - 1


def test_bad_residency_options_are_refused(small_model, cpu_pm):
    with pytest.raises(nxrt.errors.InvalidArgument, match="byte count"):
        run_small(small_model, cpu_pm, {"nxrt.expert_memory_budget": "lots"})
    with pytest.raises(nxrt.errors.InvalidArgument, match="whole_bank"):
        run_small(small_model, cpu_pm, {"nxrt.expert_residency_policy": "random"})
    with pytest.raises(nxrt.errors.InvalidArgument, match="expert_usage_profile"):
        run_small(small_model, cpu_pm, {"nxrt.expert_residency_policy": "static_profile"})


def test_float16_generated_model(tmp_path, cpu_pm):
    config = MoeConfig(**{**SMALL.__dict__, "dtype": "float16", "zero_points": True, "bits": 8})
    info = make_moe_model(str(tmp_path), config)
    expected = np.load(tmp_path / "expected.npz")
    for options in ({}, {"nxrt.expert_memory_budget": info["bank_bytes"] // 8}):
        sess = nxrt.InferenceSession(
            info["model"], providers=[("cpu", options)], plugin_manager=cpu_pm
        )
        (y,) = sess.run(None, {"X": expected["X"]})
        assert y.dtype == np.float16
        np.testing.assert_allclose(y, expected["Y"], rtol=2e-3, atol=2e-3)


def test_concurrent_runs_under_a_budget_agree(small_model, cpu_pm):
    from concurrent.futures import ThreadPoolExecutor

    folder, info = small_model
    expected = np.load(os.path.join(folder, "expected.npz"))
    sess = nxrt.InferenceSession(
        os.path.join(folder, "model.onnx"),
        providers=[("cpu", {"nxrt.expert_memory_budget": 2 * info["expert_bytes"]})],
        plugin_manager=cpu_pm,
    )
    x = expected["X"]
    rows = [x[i : i + 2] for i in range(0, len(x), 2)]
    serial = [sess.run(None, {"X": r})[0] for r in rows]
    with ThreadPoolExecutor(4) as pool:
        parallel = list(pool.map(lambda r: sess.run(None, {"X": r})[0], rows * 4))
    for got, want in zip(parallel, serial * 4):
        np.testing.assert_array_equal(got, want)
    assert sess._eps[0][0].expert_residency.governor.peak <= 2 * info["expert_bytes"]

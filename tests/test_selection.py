"""EP selection for sessions given no providers: measured, reported, cached."""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest
from onnx import TensorProto, helper

import nxrt
from nxrt.errors import InvalidArgument
from nxrt.kernel import KernelMatch
from nxrt.provider import ExecutionProvider
from nxrt.registry import OpRegistry
from nxrt.selection import ExecutionProviderDevicePolicy, cache_dir
from nxrt.testing import register_plugin
from nxrt.weight import ExecutionProviderCapabilities


def sleepy_ops(name: str, delay: float) -> OpRegistry:
    ops = OpRegistry(name)

    @ops.op("Relu", since=1)
    def relu(x, /):
        time.sleep(delay)
        return np.maximum(x, 0)

    return ops


class TimedEP:
    """An EP whose Relu takes ``delay`` seconds; optionally fails to start, or claims a device."""

    def __init__(self, ep_id, delay, *, preference=0, device="cpu", broken=False):
        self.ep_id, self.ops = ep_id, sleepy_ops(ep_id, delay)
        self.preference, self.device, self.broken = preference, device, broken

    @nxrt.hookimpl
    def nxrt_register(self, registry):
        def factory(config):
            if self.broken:
                raise RuntimeError(f"{self.ep_id} cannot start")
            ep = ExecutionProvider(config, self.ops)
            ep.device_type = self.device
            return ep

        registry.add_provider(self.ep_id, factory, device_type=self.device)
        registry.add_kernels(self.ep_id, self.ops)

    @nxrt.hookimpl
    def nxrt_ep_capabilities(self, ep):
        if ep.id != self.ep_id:
            return None
        return ExecutionProviderCapabilities([f"preference:{self.preference}"])

    @nxrt.hookimpl
    def nxrt_match_kernel(self, ep, node, opset):
        if ep.id != self.ep_id:
            return None
        return (
            self.ops.match(node, opset) if node.op_type == "Relu" else KernelMatch.no("Relu only")
        )


def relu_model(dims=(2, 3)):
    value = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        "relu",
        [value("x", TensorProto.FLOAT, list(dims))],
        [value("y", TensorProto.FLOAT, list(dims))],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture
def cpu_pm(nxrt_pm, monkeypatch, tmp_path):
    import nxrt_ep_cpu.plugin

    monkeypatch.setenv("NXRT_CACHE_DIR", str(tmp_path))
    with register_plugin(nxrt_pm, nxrt_ep_cpu.plugin, "cpu"):
        yield nxrt_pm


def reported(choice):
    """EP ids as a session reports the EPs it chose: cpu by its ONNX Runtime name."""
    return ["CPUExecutionProvider" if ep == "cpu" else ep for ep in choice]


def fast_and_slow(pm):
    return register_plugin(pm, TimedEP("slow", 0.02, preference=5), "slow"), register_plugin(
        pm, TimedEP("fast", 0.0), "fast"
    )


def test_the_faster_ep_is_chosen_and_the_report_names_every_time(cpu_pm):
    slow, fast = fast_and_slow(cpu_pm)
    with slow, fast:
        session = nxrt.InferenceSession(relu_model(), plugin_manager=cpu_pm)
        report = session.get_partition().selection
        assert session.get_providers()[0] in ("fast", "CPUExecutionProvider")
        times = {",".join(c.providers): c.time_ms for c in report.candidates}
        assert set(times) == {"slow,cpu", "fast,cpu", "cpu"}
        assert times["slow,cpu"] > 15 > times["fast,cpu"]
        assert reported(report.choice) == session.get_providers() and not report.from_cache
        shown = str(session.get_partition())
        assert "slow,cpu" in shown and "fast,cpu" in shown and "policy DEFAULT" in shown
        x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
        np.testing.assert_array_equal(session.run(None, {"x": x})[0], np.maximum(x, 0))


def test_a_second_session_decides_from_the_cache(cpu_pm):
    slow, fast = fast_and_slow(cpu_pm)
    with slow, fast:
        first = nxrt.InferenceSession(relu_model(), plugin_manager=cpu_pm)
        second = nxrt.InferenceSession(relu_model(), plugin_manager=cpu_pm)
    one, two = first.get_partition().selection, second.get_partition().selection
    assert not one.from_cache and two.from_cache
    assert reported(two.choice) == reported(one.choice) == second.get_providers()
    assert [c.time_ms for c in two.candidates] == [c.time_ms for c in one.candidates]
    assert len(os.listdir(cache_dir())) == 1


def test_a_corrupt_cache_entry_is_ignored_and_rewritten(cpu_pm):
    slow, fast = fast_and_slow(cpu_pm)
    with slow, fast:
        nxrt.InferenceSession(relu_model(), plugin_manager=cpu_pm)
        (entry,) = [os.path.join(cache_dir(), n) for n in os.listdir(cache_dir())]
        with open(entry, "w") as f:
            f.write("{not json")
        session = nxrt.InferenceSession(relu_model(), plugin_manager=cpu_pm)
        assert not session.get_partition().selection.from_cache
        with open(entry) as f:
            assert reported(json.load(f)["choice"]) == session.get_providers()
        with open(entry, "w") as f:  # a stale entry: names an EP that is not installed
            json.dump({"policy": "DEFAULT", "choice": ["gone", "cpu"], "candidates": []}, f)
        session = nxrt.InferenceSession(relu_model(), plugin_manager=cpu_pm)
        assert "gone" not in session.get_providers()


def test_a_candidate_that_cannot_start_is_skipped_and_reported(cpu_pm, monkeypatch):
    monkeypatch.delenv("NXRT_STRICT_PLUGINS", raising=False)
    with register_plugin(cpu_pm, TimedEP("broken", 0.0, broken=True), "broken"):
        with register_plugin(cpu_pm, TimedEP("fine", 0.0), "fine"):
            session = nxrt.InferenceSession(relu_model(), plugin_manager=cpu_pm)
    skipped = {
        ",".join(c.providers): c.skipped for c in session.get_partition().selection.candidates
    }
    assert (
        "cannot start" in skipped["broken,cpu"] and "broken cannot start" in skipped["broken,cpu"]
    )
    assert any("broken" in str(f) for f in session._host.failures)
    assert session.get_providers()[0] in ("fine", "CPUExecutionProvider")


def test_an_explicit_providers_list_is_always_honoured(cpu_pm):
    slow, fast = fast_and_slow(cpu_pm)
    with slow, fast:
        session = nxrt.InferenceSession(relu_model(), providers=["slow"], plugin_manager=cpu_pm)
    assert session.get_providers() == ["slow", "cpu"]
    assert session.get_partition().selection is None


def test_the_priority_policy_orders_by_advertised_preference(cpu_pm):
    options = nxrt.SessionOptions()
    options.set_provider_selection_policy("PRIORITY")
    slow, fast = fast_and_slow(cpu_pm)
    with slow, fast:
        session = nxrt.InferenceSession(relu_model(), options, plugin_manager=cpu_pm)
    # slow advertises preference 5
    assert session.get_providers() == ["slow", "fast", "CPUExecutionProvider"]
    assert session.get_partition().selection.candidates == []


def test_device_policies_put_that_device_first(cpu_pm):
    options = nxrt.SessionOptions()
    options.set_provider_selection_policy(nxrt.OrtExecutionProviderDevicePolicy.PREFER_GPU)
    with register_plugin(cpu_pm, TimedEP("gpu_ep", 0.0, device="gpu"), "gpu_ep"):
        with register_plugin(cpu_pm, TimedEP("host_ep", 0.0, preference=9), "host_ep"):
            session = nxrt.InferenceSession(relu_model(), options, plugin_manager=cpu_pm)
    assert session.get_providers()[0] == "gpu_ep"
    with pytest.raises(InvalidArgument, match="PREFER_GPU"):
        options.set_provider_selection_policy("fastest please")


def test_the_budget_stops_measuring_and_the_best_so_far_wins(cpu_pm):
    options = nxrt.SessionOptions()
    options.add_session_config_entry("nxrt.selection.budget_ms", "1")
    slow, fast = fast_and_slow(cpu_pm)
    with slow, fast:
        session = nxrt.InferenceSession(relu_model(), options, plugin_manager=cpu_pm)
    report = session.get_partition().selection
    measured = [c.providers for c in report.candidates if c.time_ms is not None]
    # the first by preference and the cpu baseline are always measured; "fast" was not
    assert measured == [["slow", "cpu"], ["cpu"]] and "budget" in report.note
    assert session.get_providers() == ["CPUExecutionProvider"]


def test_symbolic_dims_take_the_configured_values(cpu_pm):
    options = nxrt.SessionOptions()
    options.add_session_config_entry("nxrt.selection.dims", "batch=4")
    with register_plugin(cpu_pm, TimedEP("fast", 0.0), "fast"):
        session = nxrt.InferenceSession(relu_model(("batch", 3)), options, plugin_manager=cpu_pm)
        assert session.get_partition().selection.candidates[0].time_ms is not None
        options.add_session_config_entry("nxrt.selection.dims", "batch=four")
        with pytest.raises(InvalidArgument, match="name=value"):
            nxrt.InferenceSession(relu_model(("batch", 3)), options, plugin_manager=cpu_pm)


def test_policies_have_onnx_runtime_names():
    names = {p.name for p in ExecutionProviderDevicePolicy}
    assert {"DEFAULT", "PREFER_CPU", "PREFER_GPU", "PREFER_NPU", "MAX_PERFORMANCE"} <= names
    assert nxrt.OrtExecutionProviderDevicePolicy is ExecutionProviderDevicePolicy


def test_string_inputs_are_measured_and_inputs_without_a_feed_choose_by_preference(cpu_pm):
    value = helper.make_tensor_value_info
    strings = helper.make_model(
        helper.make_graph(
            [helper.make_node("Identity", ["s"], ["t"])],
            "strings",
            [value("s", TensorProto.STRING, ["n"])],
            [value("t", TensorProto.STRING, ["n"])],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    seq = helper.make_tensor_sequence_value_info("seq", TensorProto.FLOAT, None)
    sequences = helper.make_model(
        helper.make_graph(
            [helper.make_node("SequenceLength", ["seq"], ["n"])],
            "sequences",
            [seq],
            [value("n", TensorProto.INT64, [])],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    with register_plugin(cpu_pm, TimedEP("fast", 0.0, preference=3), "fast"):
        text = nxrt.InferenceSession(strings, plugin_manager=cpu_pm)
        listed = nxrt.InferenceSession(sequences, plugin_manager=cpu_pm)
    assert all(c.time_ms is not None for c in text.get_partition().selection.candidates)
    report = listed.get_partition().selection
    assert "chose by preference" in report.note and report.choice == ["fast", "cpu"]
    assert listed.run(None, {"seq": [np.zeros(2, np.float32)] * 3})[0] == 3

"""EP selection for sessions given no providers: measured, reported, cached."""

from __future__ import annotations

import contextlib
import json
import os
import time

import numpy as np
import pytest
from onnx import TensorProto, helper

import nxrt
from nxrt.errors import InvalidArgument
from nxrt.kernel import Kernel
from nxrt.pipeline.selection import (
    NOT_MEASURED,
    EpInfo,
    ExecutionProviderDevicePolicy,
    cache_dir,
    cache_key,
    hardware,
    measure,
)
from nxrt.provider import ExecutionProvider
from nxrt.registry import KernelMatch, OpRegistry
from nxrt.tools.testing import register_plugin
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


def test_the_budget_stops_measuring_and_the_choice_is_not_cached(cpu_pm):
    options = nxrt.SessionOptions()
    options.add_session_config_entry("nxrt.selection.budget_ms", "1")
    slow, fast = fast_and_slow(cpu_pm)
    with slow, fast:
        session = nxrt.InferenceSession(relu_model(), options, plugin_manager=cpu_pm)
        report = session.get_partition().selection
        measured = [c.providers for c in report.candidates if c.time_ms is not None]
        # only the first, cpu alone, is built once the budget is spent: the others wait
        assert measured == [["cpu"]] and "budget" in report.note
        assert {",".join(c.providers) for c in report.candidates if c.skipped} == {
            "slow,cpu",
            "fast,cpu",
        }
        assert session.get_providers() == ["CPUExecutionProvider"]
        assert not report.cached and not os.path.exists(cache_dir())  # this session only
        assert "not cached" in str(session.get_partition())
        again = nxrt.InferenceSession(relu_model(), plugin_manager=cpu_pm)  # default budget
    report = again.get_partition().selection
    assert not report.from_cache and report.cached and len(os.listdir(cache_dir())) == 1
    assert all(c.time_ms is not None for c in report.candidates)


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


# -- one-time costs, the budget, and what may be cached (issue 28) ----------------------------
class ColdKernel(Kernel):
    """A Relu whose first call stands for compiling: it sleeps, the later ones do not."""

    def __init__(self, first_delay):
        self.first_delay, self.calls = first_delay, 0

    def compute(self, inputs):
        self.calls += 1
        if self.calls == 1:
            time.sleep(self.first_delay)
        return (np.maximum(inputs[0], 0),)


class ColdStartEP(TimedEP):
    """Slow to build and slow on its first run, fast on every later run."""

    def __init__(self, ep_id, *, build_delay, first_delay, preference=0):
        super().__init__(ep_id, 0.0, preference=preference)
        self.ops = OpRegistry(ep_id)
        self.ops.op("Relu", since=1, factory=lambda ep, node: ColdKernel(first_delay))(
            lambda x, /: x
        )
        self.build_delay, self.builds = build_delay, 0

    @nxrt.hookimpl
    def nxrt_register(self, registry):
        def factory(config):
            self.builds += 1
            time.sleep(self.build_delay)
            return ExecutionProvider(config, self.ops)

        registry.add_provider(self.ep_id, factory)
        registry.add_kernels(self.ep_id, self.ops)


def test_one_time_costs_are_reported_apart_and_kept_out_of_the_time(cpu_pm):
    cold = ColdStartEP("cold", build_delay=0.2, first_delay=0.3, preference=5)
    with register_plugin(cpu_pm, cold, "cold"):
        with register_plugin(cpu_pm, TimedEP("slow", 0.02, preference=3), "slow"):
            session = nxrt.InferenceSession(relu_model(), plugin_manager=cpu_pm)
    report = session.get_partition().selection
    (candidate,) = [c for c in report.candidates if c.providers == ["cold", "cpu"]]
    assert candidate.first_run_ms >= 300 > 30 > candidate.time_ms  # compiling is not speed
    assert candidate.build_ms >= 200
    assert session.get_providers()[0] in ("cold", "CPUExecutionProvider")  # not "slow"
    assert "one-time: build" in str(session.get_partition())


def test_every_candidate_is_measured_before_a_decision_is_cached(cpu_pm):
    options = nxrt.SessionOptions()
    options.add_session_config_entry("nxrt.selection.budget_ms", "150")
    slow_builds = [ColdStartEP(f"b{i}", build_delay=0.2, first_delay=0.0) for i in range(3)]
    with register_plugin(cpu_pm, slow_builds[0], "b0"):
        with register_plugin(cpu_pm, slow_builds[1], "b1"):
            with register_plugin(cpu_pm, slow_builds[2], "b2"):
                cut = nxrt.InferenceSession(relu_model(), options, plugin_manager=cpu_pm)
                report = cut.get_partition().selection
                assert not report.complete and not report.cached
                assert not os.path.exists(cache_dir())
                # building stopped once the budget was spent: one build past it, no more
                built = [c for c in report.candidates if c.build_ms is not None]
                assert len(built) < len(report.candidates)
                options.add_session_config_entry("nxrt.selection.budget_ms", "60000")
                full = nxrt.InferenceSession(relu_model(), options, plugin_manager=cpu_pm)
                again = nxrt.InferenceSession(relu_model(), options, plugin_manager=cpu_pm)
    report = full.get_partition().selection
    assert report.complete and report.cached and not report.from_cache
    assert sorted(",".join(c.providers) for c in report.candidates) == [
        "b0,cpu",
        "b1,cpu",
        "b2,cpu",
        "cpu",
    ]
    assert all(c.time_ms is not None for c in report.candidates)
    assert again.get_partition().selection.from_cache


def test_an_incomplete_cache_entry_is_never_used(cpu_pm):
    slow, fast = fast_and_slow(cpu_pm)
    with slow, fast:
        nxrt.InferenceSession(relu_model(), plugin_manager=cpu_pm)
        (entry,) = [os.path.join(cache_dir(), n) for n in os.listdir(cache_dir())]
        with open(entry) as f:
            data = json.load(f)
        data["choice"] = ["slow", "cpu"]
        data["candidates"][-1] = {"providers": ["fast", "cpu"], "skipped": NOT_MEASURED}
        with open(entry, "w") as f:
            json.dump(data, f)
        session = nxrt.InferenceSession(relu_model(), plugin_manager=cpu_pm)
    assert not session.get_partition().selection.from_cache
    assert session.get_providers()[0] != "slow"


def test_with_the_real_plugins_a_choice_with_an_unmeasured_candidate_is_not_cached(
    monkeypatch, tmp_path
):
    from nxrt.host import Host, get_plugin_manager

    monkeypatch.setenv("NXRT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("NXRT_PLUGINS", raising=False)
    pm = get_plugin_manager()
    installed = Host(pm).build_registry().default_order()
    if len(installed) < 2 or "cpu" not in installed:
        pytest.skip(f"needs the cpu EP and another one installed, have {installed}")
    options = nxrt.SessionOptions()
    options.add_session_config_entry("nxrt.selection.budget_ms", "1")
    session = nxrt.InferenceSession(relu_model(), options, plugin_manager=pm)
    report = session.get_partition().selection
    assert [c.skipped for c in report.candidates].count(NOT_MEASURED) >= 1
    assert not report.cached and not os.path.exists(cache_dir())
    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], np.maximum(x, 0))
    options.add_session_config_entry("nxrt.selection.budget_ms", "600000")
    full = nxrt.InferenceSession(relu_model(), options, plugin_manager=pm).get_partition()
    assert full.selection.complete and full.selection.cached
    tried = {tuple(c.providers) for c in full.selection.candidates}
    assert {(ep, "cpu") for ep in installed if ep != "cpu"} | {("cpu",)} <= tried
    assert len(os.listdir(cache_dir())) == 1


def test_the_budget_counts_from_the_start_and_stops_new_builds():
    built = []

    class Plan:
        def run(self, feeds):
            pass

        def leftover(self):
            return False

    def build(providers):
        built.append(providers)
        return Plan()

    eps = [EpInfo(i, "cpu", p, 0) for i, p in (("a", 2), ("b", 1), ("cpu", 0))]
    found = measure(eps, build, {}, budget_ms=50, runs=3, started=time.perf_counter() - 1)
    assert built == [["cpu"]] and found.choice == ["cpu"] and not found.complete
    assert [c.skipped for c in found.candidates[1:]] == [NOT_MEASURED, NOT_MEASURED]
    assert found.candidates[0].time_ms is not None  # its first warm run is its sample
    found = measure(eps, build, {}, budget_ms=60000, runs=3, settle_ms=0)
    assert found.complete and all(c.time_ms is not None for c in found.candidates)


def test_a_candidate_still_compiling_is_timed_after_its_compiles_and_losers_are_discarded():
    events = []
    compiles = {"a": 0.0, "cpu": 0.3}
    a_ms = [0.001]
    held = []

    class Plan:
        """``a`` runs in 1 ms; ``cpu`` in 3 ms on its interim kernels, then at once. Each
        run notes whether background compiles were held meanwhile."""

        def __init__(self, name):
            self.name, self.ready_at = name, time.perf_counter() + compiles[name]
            self.runs_held = []

        def run(self, feeds):
            self.runs_held.append(bool(held))
            ready = time.perf_counter() >= self.ready_at
            time.sleep(a_ms[0] if self.name == "a" else 0.0 if ready else 0.003)

        def leftover(self):
            return False

        def wait_for_compiled(self, timeout):
            time.sleep(max(0.0, min(self.ready_at - time.perf_counter(), timeout)))
            return time.perf_counter() >= self.ready_at

        @contextlib.contextmanager
        def hold_compiles(self, timeout):
            held.append(self.name)
            yield
            held.remove(self.name)

        def discard(self):
            events.append(("discarded", self.name))

    plans = []

    def build(ids):
        plans.append(Plan(ids[0]))
        return plans[-1]

    eps = [EpInfo(i, "cpu", p, 0) for i, p in (("a", 1), ("cpu", 0))]
    found = measure(eps, build, {}, budget_ms=60000, runs=3)
    alone, mixed = found.candidates  # cpu, timed once compiled, wins; its wait is one-time
    assert [c.providers for c in found.candidates] == [["cpu"], ["a", "cpu"]]
    assert found.choice == ["cpu"] and found.complete and not alone.compiling
    assert alone.compile_ms is not None and alone.compile_ms >= 200
    assert events == [("discarded", "a")]
    # every timed run ran with compiles held; only the two untimed runs after a build not
    for plan in plans:
        assert plan.runs_held[:2] == [False, False] and all(plan.runs_held[2:])
    assert not held
    # a budget spent while a candidate compiles: timed on its interim kernels; a loser
    # still compiling keeps the choice from the cache
    compiles["cpu"] = 30.0
    found = measure(eps, build, {}, budget_ms=300, runs=3)
    assert found.choice == ["a", "cpu"] and found.candidates[0].compiling and not found.complete
    assert "still compiling" in found.note and "not cached" in found.note
    # a winner still compiling stands: its compiled kernels only make it faster
    a_ms[0] = 0.01
    found = measure(eps, build, {}, budget_ms=300, runs=3)
    assert found.choice == ["cpu"] and found.candidates[0].compiling and found.complete
    assert "still the fastest" in found.note and "not cached" not in found.note


def test_candidates_are_measured_at_the_configured_shapes(cpu_pm):
    seen = []
    ops = OpRegistry("shapes")

    @ops.op("Relu", since=1)
    def relu(x, /):
        seen.append(x.shape)
        return np.maximum(x, 0)

    ep = TimedEP("shapes", 0.0)
    ep.ops = ops
    options = nxrt.SessionOptions()
    options.add_session_config_entry("nxrt.selection.shapes", "x:8x3")
    options.add_session_config_entry("nxrt.selection.dims", "batch=4")
    with register_plugin(cpu_pm, ep, "shapes"):
        nxrt.InferenceSession(relu_model(("batch", 3)), options, plugin_manager=cpu_pm)
        assert set(seen) == {(8, 3)}
        seen.clear()
        options.add_session_config_entry("nxrt.selection.shapes", "")
        nxrt.InferenceSession(relu_model(("batch", 3)), options, plugin_manager=cpu_pm)
        assert set(seen) == {(4, 3)}
        for wrong, message in (("x:8x4", "it is \\?x3"), ("y:8x3", "names input"), ("x", "")):
            options.add_session_config_entry("nxrt.selection.shapes", wrong)
            with pytest.raises(InvalidArgument, match=message or "name:shape"):
                nxrt.InferenceSession(relu_model(("batch", 3)), options, plugin_manager=cpu_pm)
    assert len(os.listdir(cache_dir())) == 2  # one decision per measured shape


def test_the_cache_key_holds_what_makes_a_decision_valid(monkeypatch):
    def key(**changes):
        args = {"shapes": {"x": (1, 3)}, "runtime": "nxrt=0.1.0", **changes}
        return cache_key("digest", [("cpu", "nxrt-ep-cpu=0.1.0")], 2, {}, **args)

    assert key() == key()
    assert key(shapes={"x": (450, 3)}) != key()  # the batch measured
    assert key(runtime="nxrt=0.1.0@file:///elsewhere") != key()  # another checkout
    assert cache_key("digest", [("cpu", "nxrt-ep-cpu=0.2.0")], 2, {}, shapes={"x": (1, 3)}) != (
        cache_key("digest", [("cpu", "nxrt-ep-cpu=0.1.0")], 2, {}, shapes={"x": (1, 3)})
    )
    before = key()
    monkeypatch.setenv("NUMBA_CPU_NAME", "haswell")  # a forced AVX2 target is another CPU
    assert key() != before and "NUMBA_CPU_NAME=haswell" in hardware()

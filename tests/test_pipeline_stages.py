"""The creation stages are sealed: each, run twice on the same input, returns equal values
and leaves its input as it was; the partition report is assembled once, at the end."""

from __future__ import annotations

import copy
from importlib import resources
from types import SimpleNamespace
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from nxrt.host import Host
from nxrt.host_parallel import HostParallel
from nxrt.pipeline import stages as pipeline
from nxrt.pipeline.selection import (
    EpInfo,
    ExecutionProviderDevicePolicy,
    SelectionReport,
    decide,
    synthesize_feeds,
)
from nxrt.tools.light_models import light_model_path
from nxrt.tools.testing import register_plugin
from toy_plugin import ToyPlugin

W = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5


def toy_model() -> onnx.ModelProto:
    """y = Neg(Relu(x + w)): Add and Relu run on a toy EP, Neg on cpu; w is an initializer."""
    nodes = [
        helper.make_node("Add", ["x", "w"], ["s"], name="add"),
        helper.make_node("Relu", ["s"], ["r"], name="relu"),
        helper.make_node("Neg", ["r"], ["y"], name="neg"),
    ]
    value = helper.make_tensor_value_info
    graph = helper.make_graph(
        nodes,
        "toy",
        [value("x", TensorProto.FLOAT, [2, 3])],
        [value("y", TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(W, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


#: Each case: how to get the model, and the providers it is created for.
CASES = {
    "digits": (
        lambda: (resources.files("nxrt") / "data" / "digits_cnn.onnx").read_bytes(),
        ["cpu"],
    ),
    "squeezenet": (lambda: onnx.load(light_model_path("squeezenet")), ["cpu"]),
    # values cross to the toy device and back, the initializer w among them: plan copies
    "toy_device": (toy_model, ["toy", "cpu"]),
    # Add and Relu claimed as one partition, compiled by the EP
    "toy_claims": (toy_model, ["toyc", "cpu"]),
}


@pytest.fixture
def pm(nxrt_pm):
    import nxrt_ep_cpu.plugin

    with (
        register_plugin(nxrt_pm, nxrt_ep_cpu.plugin, "cpu"),
        register_plugin(nxrt_pm, ToyPlugin(device=True), "toy"),
        register_plugin(nxrt_pm, ToyPlugin(ep_id="toyc", claims=True), "toyc"),
    ):
        yield nxrt_pm


@pytest.fixture(params=list(CASES))
def case(request, pm):
    """Every stage's output for one model, each stage fed the ones before it."""
    make_source, providers = CASES[request.param]
    host = Host(pm)
    registry = host.build_registry()
    parallel = HostParallel(1)
    options = pipeline.CreateOptions()
    source = make_source()
    loaded = pipeline.load(source, options)
    requests = pipeline.provider_requests(providers)
    selection = pipeline.select_providers(registry, host, requests)
    compiler = pipeline.SubgraphCompiler(host)
    eps = pipeline.create_providers(selection, host, parallel, options, compiler)
    optimization = pipeline.optimize(loaded, eps, host)
    compiler.attach(optimization.loaded, eps)
    placement = pipeline.place(optimization.loaded, eps, host, registry)
    draft = pipeline.plan(optimization.loaded, eps, placement)
    return SimpleNamespace(
        name=request.param,
        host=host,
        registry=registry,
        parallel=parallel,
        options=options,
        source=source,
        requests=requests,
        loaded=loaded,
        selection=selection,
        compiler=compiler,
        providers=eps,
        optimization=optimization,
        placement=placement,
        draft=draft,
    )


# -- what each stage's value is, compared by content --------------------------------------------
def model_bytes(model: ir.Model) -> bytes:
    return ir.serde.serialize_model(model).SerializeToString()


def source_view(source: Any) -> bytes:
    return source if isinstance(source, bytes) else source.SerializeToString()


def loaded_view(loaded: pipeline.LoadedModel) -> tuple:
    return model_bytes(loaded.model), loaded.base_dir, sorted(loaded.weights)


def selection_view(selection: pipeline.Selection) -> tuple:
    requests = [(d.id, d.plugin, options) for d, options in selection.requests]
    return requests, selection.explicit, selection.policy, selection.report


def providers_view(providers: pipeline.Providers) -> tuple:
    eps = [
        (type(ep).__name__, ep.id, ep.device_type, owner, ep.initialized, ep.ops is not None)
        for ep, owner in providers.eps
    ]
    return eps, {ep_id: sorted(c.flags) for ep_id, c in providers.capabilities.items()}


def optimization_view(optimization: pipeline.Optimization) -> tuple:
    return loaded_view(optimization.loaded), optimization.folded, optimization.fused


def placement_view(placement: pipeline.Placement) -> tuple:
    report = placement.report
    claims = [
        (c.name, c.ep, [n.name for n in c.nodes], list(c.inputs), list(c.outputs))
        for c in report.claims
    ]
    matches = [(m.supported, m.key) if m is not None else None for m in placement.matches]
    return (
        report.to_dict(),
        claims,
        list(placement.node_ep),
        list(placement.node_claim),
        matches,
    )


def plan_view(plan: pipeline.Plan) -> tuple:
    constants = {
        slot: (value.dtype.str, value.shape, value.tobytes())
        for slot, value in plan.constants.items()
        if isinstance(value, np.ndarray)
    }
    steps = [
        (
            s.name,
            s.op_type,
            s.ep,
            s.device,
            list(s.inputs),
            list(s.outputs),
            list(s.frees),
            type(s.kernel).__name__,
        )
        for s in plan.steps
    ]
    return (
        list(plan.slot_names),
        constants,
        dict(plan.input_slots),
        dict(plan.output_slots),
        steps,
        {name: ep.id for name, ep in plan.output_hosts.items()},
    )


def draft_view(draft: pipeline.PlanDraft) -> tuple:
    return plan_view(draft.plan), [m is None for m in draft.makers], list(draft.copies)


def feeds_for(case) -> dict[str, np.ndarray]:
    graph = case.optimization.loaded.model.graph
    return synthesize_feeds([v for v in graph.inputs if v.name not in graph.initializers], {})


# -- the stages ----------------------------------------------------------------------------------
def test_load_is_pure(case):
    before = source_view(case.source)
    first, second = (pipeline.load(case.source, case.options) for _ in range(2))
    assert first.model is not second.model
    assert loaded_view(first) == loaded_view(second) == loaded_view(case.loaded)
    assert source_view(case.source) == before


def test_select_providers_is_pure(case):
    before = copy.deepcopy(case.requests)
    first, second = (
        pipeline.select_providers(case.registry, case.host, case.requests) for _ in range(2)
    )
    assert selection_view(first) == selection_view(second) == selection_view(case.selection)
    assert case.requests == before


def test_create_providers_is_pure_and_binds_each_ep_once(case):
    before = selection_view(case.selection)
    first, second = (
        pipeline.create_providers(
            case.selection, case.host, case.parallel, case.options, case.compiler
        )
        for _ in range(2)
    )
    assert providers_view(first) == providers_view(second) == providers_view(case.providers)
    assert {id(ep) for ep, _ in first.eps}.isdisjoint(id(ep) for ep, _ in second.eps)
    for ep, _ in first.eps:  # what bind gave it: the session's pool and compiler
        assert ep.parallel is case.parallel and ep.subgraph_compiler is case.compiler
    assert selection_view(case.selection) == before


def test_optimize_is_pure(case):
    before = loaded_view(case.loaded)
    first, second = (pipeline.optimize(case.loaded, case.providers, case.host) for _ in range(2))
    assert optimization_view(first) == optimization_view(second)
    assert optimization_view(first) == optimization_view(case.optimization)
    assert first.loaded.model is not case.loaded.model
    assert loaded_view(case.loaded) == before
    if case.name == "squeezenet":  # its weights are ConstantOfShape nodes: folded
        assert first.folded and first.fused


def test_place_is_pure(case):
    optimized = case.optimization.loaded
    before = loaded_view(optimized), providers_view(case.providers)
    first, second = (
        pipeline.place(optimized, case.providers, case.host, case.registry) for _ in range(2)
    )
    assert placement_view(first) == placement_view(second) == placement_view(case.placement)
    assert (loaded_view(optimized), providers_view(case.providers)) == before


def test_plan_is_pure(case):
    optimized = case.optimization.loaded
    before = loaded_view(optimized), placement_view(case.placement)
    first, second = (pipeline.plan(optimized, case.providers, case.placement) for _ in range(2))
    assert draft_view(first) == draft_view(second) == draft_view(case.draft)
    assert (loaded_view(optimized), placement_view(case.placement)) == before
    assert not case.placement.report.copies
    if case.name == "toy_device":
        assert {c.value for c in first.copies} == {"x", "w", "r"}


def test_instantiate_is_pure(case):
    before = draft_view(case.draft)
    first, second = (pipeline.instantiate(case.draft) for _ in range(2))
    assert plan_view(first) == plan_view(second)
    assert first is not case.draft.plan and draft_view(case.draft) == before
    assert {type(s.kernel).__name__ for s in case.draft.plan.steps} <= {"Kernel", "CopyKernel"}
    feeds = feeds_for(case)
    outputs = list(first.output_slots)
    for a, b in zip(first.execute(feeds, outputs, None), second.execute(feeds, outputs, None)):
        np.testing.assert_array_equal(a, b)


def test_fit_plan_is_pure(case):
    plan = pipeline.instantiate(case.draft)
    before = plan_view(plan)
    copy_x = [i for i, s in enumerate(plan.steps) if s.name == "copy x"]
    fed = {"x": copy_x[0]} if copy_x else {}
    fetches = list(plan.output_slots)[:1]
    first, second = (pipeline.fit_plan(plan, fed, frozenset(), fetches) for _ in range(2))
    assert plan_view(first) == plan_view(second)
    assert first is not plan and plan_view(plan) == before
    assert len(first.steps) == len(plan.steps) - len(fed)


# -- the whole pipeline --------------------------------------------------------------------------
def test_the_report_is_assembled_once_from_the_stages_parts(pm):
    state = pipeline.create(
        toy_model(), pipeline.provider_requests(["toy", "cpu"]), pipeline.CreateOptions(), pm
    )
    placed, report = state.placement.report, state.report
    assert report is not placed and not placed.copies and placed.selection is None
    assert [c.value for c in report.copies] == ["x", "w", "r"]
    assert [(p.node, p.ep) for p in report.nodes] == [(p.node, p.ep) for p in placed.nodes]
    x = np.ones((2, 3), np.float32)
    (y,) = state.plan.execute({"x": x}, ["y"], None)
    np.testing.assert_array_equal(y, -np.maximum(x + W, 0))


def test_the_policy_is_decided_in_selection_without_building_when_it_does_not_measure():
    infos = [EpInfo("slow", "cpu", 5, 0), EpInfo("gpu_ep", "gpu", 0, 0), EpInfo("cpu", "cpu", 0, 0)]

    def build(ids):
        raise AssertionError("a policy that does not measure builds nothing")

    graph = ir.from_proto(toy_model()).graph
    inputs = [v for v in graph.inputs if v.name not in graph.initializers]
    chosen = {}
    for policy in ("PRIORITY", "PREFER_GPU"):
        decision = decide(
            ExecutionProviderDevicePolicy.parse(policy),
            inputs,
            {},
            start=lambda: (infos, []),
            build=build,
            identity=lambda: ("digest", []),
            installed=["slow", "gpu_ep", "cpu"],
            threads=1,
        )
        assert isinstance(decision.report, SelectionReport) and decision.built is None
        chosen[policy] = decision.report.choice
    assert chosen == {
        "PRIORITY": ["slow", "gpu_ep", "cpu"],
        "PREFER_GPU": ["gpu_ep", "slow", "cpu"],
    }

"""The checks ``pytest --nxrt-ep NAME`` adds to a test run: one EP, hook by hook.

Hook level: the EP registers and builds, its capabilities are well formed,
its kernel matches carry a cost or a reason, its claims are connected and
cycle-free, and an EP that advertises EPContext round-trips a compiled
partition (one that does not refuses cleanly); a check during which the
EP's hooks raised fails, though a session would survive it. Then the ONNX node
conformance cases the EP accepts, each its own test id; known failures come
from the ``conformance_exclusions.txt`` the EP's package ships.

The EP is taken from the installed plugins (entry points), exactly as users
get it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import numpy as np

from nxrt.ep_registry import EpRegistry
from nxrt.epcontext import EpContext
from nxrt.errors import EpLoadFailed, EpPanicked, MissingExtra, NxrtError, UnsupportedContext
from nxrt.host import Host, get_plugin_manager
from nxrt.kernel import Cost
from nxrt.pipeline.partition import check_claim
from nxrt.provider import EpConfig, ExecutionProvider
from nxrt.registry import KernelMatch
from nxrt.tools.conformance import check_case, node_cases, package_exclusions, run_cases
from nxrt.tools.light_models import LIGHT_MODELS, dummy_feeds, light_model_path
from nxrt.weight import ExecutionProviderCapabilities

try:
    import pytest
except ImportError as exc:  # the runtime installs without pytest: the kit is an extra
    raise MissingExtra("the EP checks of `pytest --nxrt-ep`", "pytest", "kit") from exc


@functools.cache
def _host() -> Host:
    return Host(get_plugin_manager())


@functools.cache
def _registry() -> EpRegistry:
    return _host().build_registry()


def _descriptor(ep_id: str) -> Any:
    descriptor = _registry().resolve(ep_id)
    if descriptor is None:
        failures = "; ".join(str(f) for f in _host().failures) or "none"
        pytest.fail(f"EP {ep_id!r} is not installed (plugins that failed to load: {failures})")
    return descriptor


def _provider(ep_id: str) -> ExecutionProvider:
    descriptor = _descriptor(ep_id)
    ep = descriptor.factory(EpConfig())
    ep.bind(descriptor.id, ops=ep.ops or descriptor.ops)
    ep.initialize()
    return ep


@functools.cache
def _conformance(ep_id: str) -> dict[str, Any]:
    return run_cases(ep_id, list(node_cases()), workers=2)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    ep_id = metafunc.config.getoption("nxrt_ep")
    if "conformance_case" in metafunc.fixturenames:
        results = _conformance(ep_id)
        supported = [name for name, r in results.items() if r.status != "unsupported"]
        metafunc.parametrize("conformance_case", sorted(supported))
    if "light_model" in metafunc.fixturenames:
        metafunc.parametrize("light_model", LIGHT_MODELS)


@pytest.fixture
def ep_id(request: pytest.FixtureRequest) -> str:
    return request.config.getoption("nxrt_ep")


@pytest.fixture(autouse=True)
def hook_failures_fail_the_ep(ep_id: str) -> Iterator[None]:
    """Fail a check during which the EP's hooks raised or answered malformed.

    A session survives a broken hook: the host records the failure and
    carries on (no claim, no match). The kit must not be as forgiving, or an
    EP whose ``nxrt_match_kernel`` always raises would pass every check.
    """
    before = len(_host().failures)
    yield
    caused = list(
        dict.fromkeys(
            f"{type(f).__name__}: {f}" for f in _host().failures[before:] if _caused_by(f, ep_id)
        )
    )
    if caused:
        shown = caused[:5] + ([f"... and {len(caused) - 5} more"] if len(caused) > 5 else [])
        pytest.fail(
            f"EP {ep_id!r}'s hooks failed {len(caused)} way(s) during this check:\n  "
            + "\n  ".join(shown),
            pytrace=False,
        )


def _caused_by(failure: NxrtError, ep_id: str) -> bool:
    """Whether a recorded failure is this EP's (not another installed plugin's)."""
    if isinstance(failure, EpPanicked):
        return failure.ep == ep_id
    descriptor = _registry().resolve(ep_id)
    if not isinstance(failure, EpLoadFailed) or descriptor is None:
        return False
    info = _host().pm.plugin_info.get(descriptor.plugin)
    return failure.path in {descriptor.plugin, info.value if info else descriptor.plugin}


def test_ep_registers_and_initializes(ep_id: str) -> None:
    descriptor = _descriptor(ep_id)
    assert descriptor.plugin, "the EP must come from a named plugin"
    ep = _provider(ep_id)
    assert isinstance(ep, ExecutionProvider) and ep.initialized


def test_ep_capabilities_are_well_formed(ep_id: str) -> None:
    descriptor = _descriptor(ep_id)
    capabilities = _host().capabilities(_provider(ep_id), descriptor.plugin)
    assert isinstance(capabilities, ExecutionProviderCapabilities)
    if capabilities.advertises("epcontext"):
        assert descriptor.context_sources, "an EP advertising epcontext must declare its sources"


def test_kernel_matches_give_a_cost_or_a_reason(ep_id: str) -> None:
    import onnx
    import onnx_ir as ir

    descriptor = _descriptor(ep_id)
    ep = _provider(ep_id)
    model = ir.from_proto(onnx.load(light_model_path("squeezenet")))
    for node in model.graph:
        match = _host().match_kernel(ep, descriptor.plugin, node, 9)
        assert isinstance(match, KernelMatch)
        if match.supported:
            assert isinstance(match.cost, Cost) and match.cost.flops >= 0 and match.cost.bytes >= 0
        else:
            assert match.reason, f"refusing {node.op_type} needs a reason for the user"


def test_claims_are_connected_and_cycle_free(ep_id: str, light_model: str) -> None:
    import onnx
    import onnx_ir as ir

    descriptor = _descriptor(ep_id)
    model = ir.from_proto(onnx.load(light_model_path(light_model)))
    nodes = list(model.graph)
    position = {id(n): i for i, n in enumerate(nodes)}
    claims = _host().claim_subgraphs(_provider(ep_id), descriptor.plugin, model.graph, nodes)
    taken: list[str | None] = [None] * len(nodes)
    for claim in claims:
        assert claim.nodes, "a claim must not be empty"
        assert check_claim(claim, nodes, position, taken) == ""
        assert _connected(claim.nodes), "a claim must be one connected subgraph"
        for node in claim.nodes:
            taken[position[id(node)]] = ep_id


def _connected(nodes: Any) -> bool:
    members = {id(n) for n in nodes}
    seen = {id(nodes[0])}
    frontier = [nodes[0]]
    while frontier:
        node = frontier.pop()
        for other in [*node.predecessors(), *node.successors()]:
            if id(other) in members and id(other) not in seen:
                seen.add(id(other))
                frontier.append(other)
    return len(seen) == len(members)


def test_epcontext_round_trip(ep_id: str, tmp_path: Any) -> None:
    """Compile a model, save its partitions as EPContext nodes, load them back: same results."""
    import nxrt
    from nxrt.ort.session import DISABLE_MODEL_COMPILE
    from nxrt.tools.compile import compile_model

    descriptor = _descriptor(ep_id)
    ep = _provider(ep_id)
    if not _host().capabilities(ep, descriptor.plugin).advertises("epcontext"):
        with pytest.raises(UnsupportedContext):
            _host().load_context(ep, descriptor.plugin, EpContext(descriptor.id))
        return
    source, compiled = light_model_path("squeezenet"), str(tmp_path / "compiled.onnx")
    report = compile_model(source, compiled, [ep_id, "cpu"])
    assert report.saved, "an EP advertising epcontext should save at least one partition here"
    options = nxrt.SessionOptions()
    options.add_session_config_entry(DISABLE_MODEL_COMPILE, "1")
    loaded = nxrt.InferenceSession(compiled, options, providers=[ep_id, "cpu"])
    original = nxrt.InferenceSession(source, providers=[ep_id, "cpu"])
    feeds = dummy_feeds(original)
    for got, want in zip(loaded.run(None, feeds), original.run(None, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_conformance_case(ep_id: str, conformance_case: str) -> None:
    descriptor = _descriptor(ep_id)
    plugin = _host().pm.get_plugin(descriptor.plugin)
    assert plugin is not None  # its registry entry came from it
    module = plugin.__name__
    excluded = package_exclusions(module)
    result = _conformance(ep_id)[conformance_case]
    check_case(conformance_case, result, excluded)

"""The EP authors' kit run against the shipped EPs, as an EP author runs it: `pytest --nxrt-ep`.

Also the kit's own promises: it fails an EP whose hooks raise (a session
would survive them), and its hook recorder keeps every call.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from onnx import TensorProto, helper

import nxrt
from nxrt.host import Host
from nxrt.registry import KernelMatch
from nxrt.tools.testing import register_plugin
from toy_plugin import ToyPlugin


def run_kit(ep: str, cwd, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("NXRT_")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "pytest", "--nxrt-ep", ep, "-q", "-p", "no:cacheprovider"],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=full_env,
    )


@pytest.mark.slow
@pytest.mark.parametrize("ep", ["cpu", "mlx", "legacy_abi"])
def test_the_kit_passes_for_a_shipped_ep(ep, tmp_path):
    registry = Host(nxrt.default_plugin_manager()).build_registry()
    if ep not in registry.providers:  # by id: get_available_providers() lists public names
        pytest.fail(f"the {ep} EP is not installed; `make test` installs every plugin")
    result = run_kit(ep, tmp_path)
    assert result.returncode == 0, result.stdout[-4000:]
    passed = int(re.search(r"(\d+) passed", result.stdout).group(1))
    assert passed > 20, result.stdout[-2000:]


#: An installed EP with one Relu kernel whose hook named by RAISES always raises.
RAISING_PLUGIN = """
import numpy as np

import nxrt
from nxrt.provider import ExecutionProvider
from nxrt.registry import OpRegistry

RAISES = {hook!r}
OPS = OpRegistry("raising")


@OPS.op("Relu", since=(6, 13, 14))
def relu(x, /):
    return np.maximum(x, 0)


class RaisingEP(ExecutionProvider):
    id = "raising"


@nxrt.hookimpl
def nxrt_register(registry):
    registry.add_provider("raising", lambda config: RaisingEP(config, OPS))
    registry.add_kernels("raising", OPS)


@nxrt.hookimpl
def nxrt_claim_subgraphs(ep, graph, nodes):
    if ep.id == "raising" and RAISES == "nxrt_claim_subgraphs":
        raise RuntimeError("claiming always fails")


@nxrt.hookimpl
def nxrt_match_kernel(ep, node, opset):
    if ep.id == "raising" and RAISES == "nxrt_match_kernel":
        raise RuntimeError("matching always fails")
"""


def install_fake_plugin(site, module: str, source: str) -> None:
    """Make ``module`` an installed distribution with an ``nxrt`` entry point, without pip."""
    dist = site / f"{module}-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[nxrt]\nraising = {module}\n")
    (site / f"{module}.py").write_text(textwrap.dedent(source))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("hook", "check"),
    [
        ("nxrt_claim_subgraphs", "test_claims_are_connected_and_cycle_free"),
        ("nxrt_match_kernel", "test_kernel_matches_give_a_cost_or_a_reason"),
    ],
)
def test_the_kit_fails_an_ep_whose_hook_always_raises(hook, check, tmp_path):
    site, run = tmp_path / "site", tmp_path / "run"
    run.mkdir()
    install_fake_plugin(site, "nxrt_ep_raising", RAISING_PLUGIN.format(hook=hook))
    result = run_kit("raising", run, env={"PYTHONPATH": str(site)})
    assert result.returncode != 0, result.stdout[-4000:]
    assert "hooks failed" in result.stdout and "always fails" in result.stdout
    assert re.search(rf"ERROR \S*::{check}\b", result.stdout), result.stdout[-4000:]
    assert re.search(r"\d+ passed", result.stdout)  # the EP itself installs and registers


def two_op_model():
    """x -> Relu -> Add(r, x) -> y."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Add", ["r", "x"], ["y"], name="add"),
    ]
    graph = helper.make_graph(
        nodes,
        "two_ops",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


class PickyPlugin(ToyPlugin):
    """The toy EP under another id, refusing Add (so the plain toy EP gets it)."""

    @nxrt.hookimpl
    def nxrt_match_kernel(self, ep, node, opset):
        if ep.id == self.ep_id and node.op_type == "Add":
            return KernelMatch.no("picky refuses Add")
        return None


def test_the_hook_recorder_keeps_every_call_with_its_own_result(nxrt_pm, hook_recorder):
    with (
        register_plugin(nxrt_pm, PickyPlugin(ep_id="picky"), "picky"),
        register_plugin(nxrt_pm, ToyPlugin(), "toy"),
    ):
        for _ in range(2):
            session = nxrt.InferenceSession(
                two_op_model(), providers=["picky", "toy"], plugin_manager=nxrt_pm
            )
    (y,) = session.run(None, {"x": np.array([-1, 2], np.float32)})
    np.testing.assert_array_equal(y, [-1, 4])
    picky = [c for c in hook_recorder.calls("nxrt_match_kernel") if c.kwargs["ep"].id == "picky"]
    assert [c.kwargs["node"].name for c in picky] == ["relu", "add"] * 2
    assert [c.result.supported for c in picky] == [True, False] * 2
    assert all(c.exception is None for c in hook_recorder.calls_made)
    every = hook_recorder.names(collapse_repeats=False)
    assert every.count("nxrt_register") == 2 * 2  # two plugins, two sessions
    assert len(every) == len(hook_recorder.calls_made) > len(hook_recorder.names())
    assert hook_recorder.last("nxrt_match_kernel") is hook_recorder.calls("nxrt_match_kernel")[-1]


def test_the_hook_recorder_records_a_hook_that_raised(nxrt_pm, hook_recorder):
    class Failing:
        @nxrt.hookimpl
        def nxrt_register(self, registry):
            raise RuntimeError("no registry today")

    from nxrt.host import Host

    nxrt_pm.register(Failing(), name="failing")
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("NXRT_STRICT_PLUGINS", raising=False)
        Host(nxrt_pm).build_registry()
    (call,) = hook_recorder.calls("nxrt_register")
    assert isinstance(call.exception, RuntimeError) and call.result is None

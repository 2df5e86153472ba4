"""Packaging: plugins installed with real pip into a fresh virtual environment are discovered."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from fresh_venv import ROOT, create, pip_install, run

pytestmark = pytest.mark.slow  # real pip into fresh virtual environments


@pytest.fixture
def python(tmp_path) -> Path:
    return create(tmp_path)


def providers(python: Path) -> dict:
    out = run([str(python), "-m", "nxrt.tools.cli", "providers", "--json"])
    return json.loads(out.stdout)


def test_cpu_plugin_installed_with_pip_is_discovered_and_runs(python, tmp_path):
    pip_install(python, ROOT, tmp_path)
    assert providers(python)["providers"] == []  # core alone has no EP

    pip_install(python, ROOT / "plugins" / "cpu", tmp_path)
    (cpu,) = providers(python)["providers"]
    assert cpu["id"] == "cpu" and cpu["distribution"] == "nxrt-ep-cpu"
    assert cpu["ops"] > 20

    out = run([str(python), "-m", "nxrt.tools.cli", "run"]).stdout
    assert re.search(r"^cpu +\d+$", out, re.M) and "accuracy: 98.22%" in out
    where = run([str(python), "-c", "import nxrt_ep_cpu; print(nxrt_ep_cpu.__file__)"]).stdout
    assert str(python.parent.parent) in where  # installed into the new environment, not linked
    assert sys.prefix not in where


def test_the_example_ep_installs_is_partitioned_to_and_passes_its_own_tests(python, tmp_path):
    example = ROOT / "examples" / "nxrt-ep-example"
    pip_install(python, ROOT, tmp_path)
    pip_install(python, ROOT / "plugins" / "cpu", tmp_path)
    pip_install(python, example, tmp_path)
    assert [p["id"] for p in providers(python)["providers"]] == ["example", "cpu"]

    from nxrt.tools.testing import light_model_path

    partition = [str(python), "-m", "nxrt.tools.cli", "partition", light_model_path("squeezenet")]
    default = json.loads(run([*partition, "--json"]).stdout)
    measured = [c["providers"] for c in default["selection"]["candidates"]]
    assert measured == [["cpu"], ["example", "cpu"]]  # installed, so a default candidate
    report = json.loads(run([*partition, "--ep", "example", "--json"]).stdout)
    assert report["nodes_per_ep"]["example"] == 26  # every Relu
    assert report["nodes_per_ep"]["cpu"] > 0

    tests = tmp_path / "example-tests"
    shutil.copytree(example / "tests", tests)
    out = run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tests)]).stdout
    assert "3 passed" in out

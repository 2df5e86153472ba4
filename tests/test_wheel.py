"""The runtime wheel holds the runtime: no fuzzer, no test data, and it runs without pytest.

The wheel is built with ``python -m build`` from a copy of the checkout and
installed with real pip, no index, into a fresh virtual environment that has
its runtime requirements (and the cpu EP's) but not pytest; pip must find
everything it needs there. The EP kit is the ``kit`` extra: without pytest,
using it raises :class:`~nxrt.errors.MissingExtra` naming that extra.
"""

from __future__ import annotations

import email
import json
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from email.message import Message
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from fresh_venv import ROOT, create, pip_install, run

#: The wheel's only files that are not Python: the embedded model and held-out digits of
#: ``nxrt run``. Anything else (regression cases, conformance lists, test models, the
#: fuzzer's known-differences table) is test data, which stays out of the wheel.
DATA = {"nxrt/data/digits_cnn.onnx", "nxrt/data/digits_test.npz"}
KIT_HINT = 'pip install "nxrt[kit]"'


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """nxrt's wheel, built from a copy of the checkout, so the build leaves it untouched."""
    source = tmp_path_factory.mktemp("checkout") / "nxrt"
    ignore = shutil.ignore_patterns(
        ".venv", ".git", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis"
    )
    shutil.copytree(ROOT, source, ignore=ignore)
    out = tmp_path_factory.mktemp("dist")
    build = [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out)]
    run([*build, str(source)])
    (path,) = out.glob("nxrt-*.whl")
    return path


def metadata(wheel: Path) -> Message:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return email.message_from_bytes(archive.read(name))


def runtime_requirements(wheel: Path) -> list[str]:
    """The names of what the wheel needs with no extra."""
    requires = [Requirement(line) for line in metadata(wheel).get_all("Requires-Dist", [])]
    return [r.name for r in requires if r.marker is None or r.marker.evaluate({"extra": ""})]


@pytest.mark.slow
def test_the_wheel_holds_no_fuzzer_and_no_test_data(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"nxrt"}  # no nxrt_fuzz, no tests
    assert not [n for n in names if "fuzz" in n]
    assert {n for n in names if n.startswith("nxrt/") and not n.endswith(".py")} == DATA


@pytest.mark.slow
def test_pytest_is_required_only_by_the_kit_and_test_extras(wheel):
    meta = metadata(wheel)
    extras = meta.get_all("Provides-Extra", [])
    assert "kit" in extras
    assert "pytest" not in runtime_requirements(wheel)
    pytest_lines = [Requirement(line) for line in meta.get_all("Requires-Dist", [])]
    wanted_by = {
        extra
        for r in pytest_lines
        if r.name == "pytest" and r.marker is not None
        for extra in extras
        if r.marker.evaluate({"extra": extra})
    }
    assert wanted_by == {"kit", "test"}


@pytest.mark.slow
def test_the_wheel_installs_and_runs_without_pytest(wheel, tmp_path):
    python = create(tmp_path, needs=[*runtime_requirements(wheel), "nxrt-ep-cpu"])
    installed = run([str(python), "-m", "pip", "install", "--no-index", str(wheel)]).stdout
    assert re.search(r"^Installing collected packages: nxrt$", installed, re.M), installed
    pip_install(python, ROOT / "plugins" / "cpu", tmp_path)
    no_pytest = subprocess.run([str(python), "-c", "import pytest"], capture_output=True)
    assert no_pytest.returncode != 0 and b"No module named 'pytest'" in no_pytest.stderr

    providers = json.loads(run([str(python), "-m", "nxrt.tools.cli", "providers", "--json"]).stdout)
    assert [p["id"] for p in providers["providers"]] == ["cpu"]
    assert "accuracy: 98.22%" in run([str(python), "-m", "nxrt.tools.cli", "run"]).stdout

    probe = textwrap.dedent(
        """
        from importlib import resources
        import numpy as np
        import nxrt
        from nxrt.errors import MissingExtra

        print(nxrt.get_available_providers())
        data = resources.files("nxrt") / "data"
        session = nxrt.InferenceSession((data / "digits_cnn.onnx").read_bytes())
        with (data / "digits_test.npz").open("rb") as f:
            held_out = np.load(f)
            pixels, labels = held_out["pixels"], held_out["labels"]
        (probabilities,) = session.run(None, {session.get_inputs()[0].name: pixels})
        print(f"accuracy {(probabilities.argmax(axis=1) == labels).mean():.4f}")
        try:
            from nxrt.tools import testing
        except MissingExtra as exc:
            print(f"kit: {exc}")
        """
    )
    out = run([str(python), "-c", probe]).stdout
    assert "CPUExecutionProvider" in out and "accuracy 0.9822" in out
    assert "kit: nxrt's EP testing kit (nxrt.tools.testing) needs pytest" in out and KIT_HINT in out


def test_without_pytest_the_runtime_runs_and_the_kit_names_its_extra():
    """pytest made unimportable in this environment: the CLI works, the kit refuses, typed."""
    script = textwrap.dedent(
        """
        import sys
        sys.modules["pytest"] = None  # import pytest now fails, as where it is not installed
        from nxrt.tools.cli import main
        from nxrt.errors import MissingExtra

        assert main(["providers", "--json"]) == 0
        for module in ("nxrt.tools.testing", "nxrt.tools.ep_suite"):
            try:
                __import__(module)
            except MissingExtra as exc:
                assert isinstance(exc, ImportError) and exc.name == "pytest"
                print(f"{module}: {exc}")
            else:
                raise SystemExit(f"{module} imported without pytest")
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    for module in ("nxrt.tools.testing", "nxrt.tools.ep_suite"):
        line = next(line for line in out.stdout.splitlines() if line.startswith(module))
        assert KIT_HINT in line

"""Packaging: plugins/cpu installed with real pip into a fresh virtual environment is discovered.

No network: the new environment sees nxrt's dependencies (numpy, onnx, ...)
through a ``.pth`` file pointing at a folder of links to exactly those
distributions, so neither nxrt nor any plugin is visible until pip installs it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import importlib_metadata
import pytest

ROOT = Path(__file__).resolve().parent.parent


def dependency_closure(name: str) -> set[str]:
    """Every distribution ``name`` needs at run time (extras left out), plus setuptools."""
    seen: set[str] = set()
    pending = [name]
    while pending:
        dist = importlib_metadata.distribution(pending.pop())
        for requirement in dist.requires or []:
            if "extra ==" in requirement:
                continue
            dep = re.match(r"[A-Za-z0-9_.\-]+", requirement).group(0)
            key = dep.lower().replace("_", "-")
            if key not in seen:
                seen.add(key)
                pending.append(dep)
    return (seen - {"nxrt"}) | {"setuptools"}


def link_distributions(names: set[str], target: Path) -> None:
    """Symlink each distribution's top-level files and folders into ``target``."""
    for name in names:
        dist = importlib_metadata.distribution(name)
        base = Path(dist.locate_file(""))
        for top in {Path(str(f)).parts[0] for f in dist.files or []}:
            source, link = base / top, target / top
            if source.exists() and not link.exists() and top != "..":
                link.symlink_to(source)


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NXRT_", "PYTHON"))}
    env["PIP_NO_INDEX"] = "1"
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, **kwargs)
    assert result.returncode == 0, f"{cmd} failed:\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def fresh_env(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("venv")
    deps = home / "deps"
    deps.mkdir()
    link_distributions(dependency_closure("nxrt"), deps)
    env_dir = home / "env"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    site = run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    Path(site.stdout.strip(), "nxrt_deps.pth").write_text(str(deps) + "\n")
    # The bundled setuptools may predate the pyproject features we use: take the linked one.
    run([str(python), "-m", "pip", "uninstall", "-q", "-y", "setuptools"])
    return python


def pip_install(python: Path, source: Path, scratch: Path) -> None:
    """pip-install a copy of ``source``, so the build leaves the checkout untouched."""
    copy = scratch / source.name
    ignore = shutil.ignore_patterns(".venv", ".git", "build", "*.egg-info", "__pycache__", "tests")
    shutil.copytree(source, copy, ignore=ignore)
    run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", str(copy)])


def providers(python: Path) -> dict:
    out = run([str(python), "-m", "nxrt.cli", "providers", "--json"])
    return json.loads(out.stdout)


def test_cpu_plugin_installed_with_pip_is_discovered_and_runs(fresh_env, tmp_path):
    python = fresh_env
    pip_install(python, ROOT, tmp_path)
    assert providers(python)["providers"] == []  # core alone has no EP

    pip_install(python, ROOT / "plugins" / "cpu", tmp_path)
    (cpu,) = providers(python)["providers"]
    assert cpu["id"] == "cpu" and cpu["distribution"] == "nxrt-ep-cpu"
    assert cpu["ops"] > 20

    out = run([str(python), "-m", "nxrt.cli", "run"]).stdout
    assert "cpu         9" in out and "accuracy: 9" in out
    where = run([str(python), "-c", "import nxrt_ep_cpu; print(nxrt_ep_cpu.__file__)"]).stdout
    assert str(python.parent.parent) in where  # installed into the new environment, not linked
    assert sys.prefix not in where

"""Fresh virtual environments for packaging tests, with no network.

The new environment sees the dependencies of nxrt and of its cpu EP (numpy, onnx,
numba, ...), and pytest for the example EP's own tests, through a ``.pth`` file
pointing at a folder of links to exactly those distributions, so neither nxrt
nor any plugin is visible until pip installs it from the local source tree.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import venv
from collections.abc import Iterable
from pathlib import Path

import importlib_metadata
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent


def dependency_closure(*names: str) -> set[str]:
    """Every distribution ``names`` need at run time (extras left out), plus setuptools."""
    seen: set[str] = set()
    pending = list(names)
    while pending:
        dist = importlib_metadata.distribution(pending.pop())
        for line in dist.requires or []:
            requirement = Requirement(line)
            if requirement.marker and not requirement.marker.evaluate({"extra": ""}):
                continue
            dep = requirement.name
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
    """Run a command with a clean environment; fail with its output when it fails."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NXRT_", "PYTHON"))}
    env["PIP_NO_INDEX"] = "1"
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, **kwargs)
    output = f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    assert result.returncode == 0, f"{cmd} failed:\n{output}"
    return result


def create(home: Path, needs: Iterable[str] = ("nxrt", "nxrt-ep-cpu", "pytest")) -> Path:
    """A new virtual environment under ``home`` with ``needs`` and their dependencies linked,
    nxrt and its cpu EP left out (pip installs those); its python."""
    names = set(needs)
    deps = home / "deps"
    deps.mkdir()
    link_distributions((dependency_closure(*names) | names) - {"nxrt", "nxrt-ep-cpu"}, deps)
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

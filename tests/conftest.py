"""Test-wide settings: a private cache folder, so no test reads or writes the user's; cpu
sessions that compile before they return."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True, scope="session")
def private_nxrt_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Default sessions cache their EP choice on disk; keep it inside the test run."""
    patch = pytest.MonkeyPatch()
    patch.setenv("NXRT_CACHE_DIR", str(tmp_path_factory.mktemp("nxrt-cache")))
    # cpu sessions return with their compiled kernels in place, so tests that look at a
    # plan's kernels see the compiled ones (NXRT_CPU_COMPILE=background runs the suite
    # tiered; tests of the tiers set nxrt.cpu.compile themselves)
    patch.setenv("NXRT_CPU_COMPILE", os.environ.get("NXRT_CPU_COMPILE", "wait"))
    yield
    patch.undo()

"""Test-wide settings: a private cache folder, so no test reads or writes the user's."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="session")
def private_nxrt_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Default sessions cache their EP choice on disk; keep it inside the test run."""
    patch = pytest.MonkeyPatch()
    patch.setenv("NXRT_CACHE_DIR", str(tmp_path_factory.mktemp("nxrt-cache")))
    yield
    patch.undo()

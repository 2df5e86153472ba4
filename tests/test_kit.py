"""The EP authors' kit run against the shipped EPs, as an EP author runs it: `pytest --nxrt-ep`."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

import nxrt


@pytest.mark.parametrize("ep", ["cpu", "mlx", "legacy_abi"])
def test_the_kit_passes_for_a_shipped_ep(ep, tmp_path):
    if ep not in nxrt.get_available_providers():
        pytest.fail(f"the {ep} EP is not installed; `make test` installs every plugin")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--nxrt-ep", ep, "-q", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout[-4000:]
    passed = int(re.search(r"(\d+) passed", result.stdout).group(1))
    assert passed > 20, result.stdout[-2000:]

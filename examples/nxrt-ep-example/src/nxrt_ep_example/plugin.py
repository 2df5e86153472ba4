"""Every hook implementation of the example EP, and nothing else.

nxrt finds this module through the entry point in pyproject.toml. Keep it
cheap to import: the backend (here numpy, in real EPs a device SDK) is only
imported when the EP is created.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import nxrt
from nxrt.weight import ExecutionProviderCapabilities

if TYPE_CHECKING:
    from nxrt.ep_registry import Registrar
    from nxrt.provider import EpConfig, ExecutionProvider

EP_ID = "example"


def _create(config: EpConfig) -> ExecutionProvider:
    from nxrt_ep_example.provider import ExampleExecutionProvider

    return ExampleExecutionProvider(config)


@nxrt.hookimpl
def nxrt_register(registry: Registrar) -> None:
    """Declare the EP and hand nxrt its kernel table."""
    from nxrt_ep_example.ops import EXAMPLE_OPS

    registry.add_provider(EP_ID, _create, device_type="cpu", description="elementwise numpy")
    registry.add_kernels(EP_ID, EXAMPLE_OPS)


@nxrt.hookimpl
def nxrt_ep_capabilities(ep: ExecutionProvider) -> ExecutionProviderCapabilities | None:
    """Say what the EP offers; None for EPs this plugin does not provide."""
    if ep.id != EP_ID:
        return None
    return ExecutionProviderCapabilities.from_flags(["device:cpu", "dtype:float32"])

"""The example EP: host memory, so the base class's buffers and copies serve as they are."""

from __future__ import annotations

from nxrt.provider import EpConfig, ExecutionProvider


class ExampleExecutionProvider(ExecutionProvider):
    """Runs each node it matched with its kernel from the example table."""

    id = "example"
    device_type = "cpu"

    def __init__(self, config: EpConfig | None = None) -> None:
        from nxrt_ep_example.ops import EXAMPLE_OPS

        super().__init__(config, EXAMPLE_OPS)

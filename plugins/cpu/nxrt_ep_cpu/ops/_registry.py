"""The cpu EP's kernel table; every family module registers into it with ``@op``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from nxrt.registry import OpRegistry

if TYPE_CHECKING:
    from nxrt_ep_cpu.provider import CpuExecutionProvider

#: Its kernel factories receive the cpu EP (its pool, its compiled-kernel tiers).
CPU_OPS: OpRegistry[CpuExecutionProvider] = OpRegistry("cpu")
op = CPU_OPS.op

"""The flat execution plan and the loop that runs it.

Everything is decided at session creation: each step holds its kernel and
the slot numbers of its inputs and outputs, and the slots to free after it
(last use). ``run`` only walks the list, so it costs a few list operations
per node and is safe from several threads at once (each run has its own
slots).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from nxrt.errors import EpPanicked, KernelFailed, NxrtError
from nxrt.kernel import ARG_DEVICE, ARG_KERNEL_VARIANT, ARG_KERNEL_VARIANT_REASON, Kernel

if TYPE_CHECKING:
    from nxrt.provider import ExecutionProvider

NO_SLOT = -1


@dataclass
class Step:
    """One kernel call: where its inputs come from and where its outputs go."""

    kernel: Kernel
    inputs: list[int]
    outputs: list[int]
    name: str
    op_type: str
    ep: str
    device: str = "cpu"
    frees: list[int] = field(default_factory=list)
    flops: int = 0
    bytes: int = 0


class CopyKernel(Kernel):
    """Moves one value between devices, through the host."""

    def __init__(self, source: ExecutionProvider | None, target: ExecutionProvider | None) -> None:
        self.source, self.target = source, target

    def compute(self, inputs: Sequence[Any]) -> tuple[Any, ...]:
        value = inputs[0]
        if self.source is not None:
            value = self.source.copy_to_host(value)
        if self.target is not None:
            value = self.target.copy_from_host(value)
        return (value,)


@dataclass
class Plan:
    """Slots, constants and steps of one session."""

    slot_names: list[str]
    constants: dict[int, Any]
    input_slots: dict[str, int]
    output_slots: dict[str, int]
    steps: list[Step]
    output_hosts: dict[str, ExecutionProvider] = field(default_factory=dict)

    def finish(self) -> None:
        """Compute each step's frees: slots whose last reader (or writer) it is."""
        last_use: dict[int, int] = {}
        for index, step in enumerate(self.steps):
            for slot in (*step.inputs, *step.outputs):
                if slot != NO_SLOT:
                    last_use[slot] = index
        keep = set(self.constants) | set(self.output_slots.values())
        for step in self.steps:
            step.frees = []
        for slot, index in last_use.items():
            if slot not in keep:
                self.steps[index].frees.append(slot)
        self._template = [None] * len(self.slot_names)
        for slot, value in self.constants.items():
            self._template[slot] = value

    def execute(self, feeds: dict[str, Any], wanted: Sequence[str], profiler: Profiler | None):
        """Run every step; return the wanted outputs as host arrays."""
        values = list(self._template)
        for name, value in feeds.items():
            values[self.input_slots[name]] = value
        for step in self.steps:
            args = [values[i] if i != NO_SLOT else None for i in step.inputs]
            start = time.perf_counter_ns() if profiler else 0
            try:
                results = step.kernel.compute(args)
            except KernelFailed as exc:
                if exc.node:
                    raise
                where = {"node": step.name, "op_type": step.op_type, "ep": step.ep}
                raise KernelFailed(exc.message, **where) from exc.__cause__
            except NxrtError as exc:
                raise KernelFailed(
                    f"{type(exc).__name__}: {exc}", node=step.name, op_type=step.op_type, ep=step.ep
                ) from exc
            except Exception as exc:  # noqa: BLE001 - a foreign error from an EP
                raise EpPanicked(
                    node=step.name, op_type=step.op_type, ep=step.ep, cause=repr(exc)
                ) from exc
            if profiler:
                profiler.record(step, start, time.perf_counter_ns())
            for slot, result in zip(step.outputs, results):
                if slot != NO_SLOT:
                    values[slot] = result
            for slot in step.frees:
                values[slot] = None
        outputs = []
        for name in wanted:
            value = values[self.output_slots[name]]
            host = self.output_hosts.get(name)
            if host is not None:
                value = host.copy_to_host(value)
            if isinstance(value, np.ndarray) and not value.flags.writeable:
                value = value.copy()  # never hand out a view of a weight or of a feed
            outputs.append(value)
        return outputs


class Profiler:
    """Chrome-trace spans, one per kernel call (``SessionOptions.enable_profiling``)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.origin = time.perf_counter_ns()
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def record(self, step: Step, start: int, end: int) -> None:
        event = {
            "name": step.name or step.op_type,
            "cat": "kernel",
            "ph": "X",
            "ts": (start - self.origin) / 1000,
            "dur": (end - start) / 1000,
            "pid": 0,
            "tid": threading.get_ident() % 100000,
            "args": {
                "op_type": step.op_type,
                "ep": step.ep,
                ARG_DEVICE: step.device,
                "flops": step.flops,
                "bytes": step.bytes,
                ARG_KERNEL_VARIANT: step.kernel.variant,
                ARG_KERNEL_VARIANT_REASON: step.kernel.variant_reason,
            },
        }
        with self._lock:
            self.events.append(event)

    def write(self) -> str:
        with self._lock:
            events = list(self.events)
        with open(self.path, "w", encoding="utf-8") as f:
            json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
        return self.path

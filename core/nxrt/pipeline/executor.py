"""The flat execution plan and the loop that runs it.

Everything is decided at session creation: each step holds its kernel and
the slot numbers of its inputs and outputs, and the slots to free after it
(last use). :meth:`Plan.finish` turns the steps into tuples of plain
callables (the kernel's direct call, an ``itemgetter`` for its inputs, its
output and free slots), so ``run`` walks a list at a few hundred
nanoseconds per node and is safe from several threads at once (each run
has its own slots).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import TYPE_CHECKING, Any

import numpy as np

from nxrt._files import write_atomically
from nxrt.errors import EpPanicked, KernelFailed, NxrtError, OutOfMemory
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
    bytes: float = 0


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


def _input_getter(slots: Sequence[int]) -> Callable[[list[Any]], Sequence[Any]]:
    """An ``itemgetter`` returning a step's inputs as a sequence, whatever their count."""
    if len(slots) == 1:
        slot = slots[0]
        return itemgetter(slice(slot, slot + 1 if slot != -1 else None))
    if not slots:
        return itemgetter(slice(0, 0))
    return itemgetter(*slots)


def _failure(step: Step, exc: BaseException) -> NxrtError:
    """The error a failing step raises: its kernel's translation, then node and EP added."""
    if not isinstance(exc, NxrtError):
        translated = step.kernel.translate_error(exc)
        if translated is not None and translated is not exc:
            translated.__cause__ = exc
            exc = translated
    where = {"node": step.name, "op_type": step.op_type, "ep": step.ep}
    if isinstance(exc, OutOfMemory):  # stays itself: callers catch it to retry smaller
        if exc.where:
            return exc
        error: NxrtError = OutOfMemory(
            exc.requested, exc.available, f"node '{step.name}' ({step.op_type}) on EP '{step.ep}'"
        )
        error.__cause__ = exc
        return error
    if isinstance(exc, KernelFailed):
        if exc.node:
            return exc
        error = KernelFailed(exc.message, **where)
        error.__cause__ = exc.__cause__
        return error
    if isinstance(exc, NxrtError):
        error = KernelFailed(f"{type(exc).__name__}: {exc}", **where)
    else:
        error = EpPanicked(**where, cause=repr(exc))
    error.__cause__ = exc
    return error


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
        """Compute each step's frees (slots whose last reader or writer it is), then the
        tuples the fast loop walks.

        The values list of a run has two extra entries: ``sink`` takes the
        outputs nobody reads (``NO_SLOT``), and the last one (index -1, which
        is ``NO_SLOT``) is always ``None``, read by absent optional inputs.
        """
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
        sink = len(self.slot_names)
        self._template: list[Any] = [None] * (sink + 2)
        for slot, value in self.constants.items():
            self._template[slot] = value
        self._fast = [
            (
                step.kernel.direct_call,
                _input_getter(step.inputs),
                tuple(sink if s == NO_SLOT else s for s in step.outputs) or (sink,),
                tuple(step.frees),
                index,
            )
            for index, step in enumerate(self.steps)
        ]

    def execute(self, feeds: dict[str, Any], wanted: Sequence[str], profiler: Profiler | None):
        """Run every step; return the wanted outputs as host arrays."""
        values = self._template.copy()
        for name, value in feeds.items():
            values[self.input_slots[name]] = value
        if profiler is not None:
            self._run_profiled(values, profiler)
        else:
            index = 0
            try:
                for call, inputs, out_slots, frees, index in self._fast:  # noqa: B007
                    results = call(*inputs(values))
                    if isinstance(results, tuple):
                        for slot, result in zip(out_slots, results):
                            values[slot] = result
                    else:
                        values[out_slots[0]] = results
                    for slot in frees:
                        values[slot] = None
            except Exception as exc:  # noqa: BLE001 - translated into an nxrt error
                raise _failure(self.steps[index], exc)  # noqa: B904 - cause set there
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

    def _run_profiled(self, values: list[Any], profiler: Profiler) -> None:
        """The same loop with one trace span per kernel call."""
        for (call, inputs, outputs, frees, _index), step in zip(self._fast, self.steps):
            args = inputs(values)
            start = time.perf_counter_ns()
            try:
                results = call(*args)
            except Exception as exc:  # noqa: BLE001 - translated into an nxrt error
                raise _failure(step, exc)  # noqa: B904 - cause set there
            profiler.record(step, start, time.perf_counter_ns())
            if not isinstance(results, tuple):
                results = (results,)
            for slot, result in zip(outputs, results):
                values[slot] = result
            for slot in frees:
                values[slot] = None


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
        trace = {"traceEvents": events, "displayTimeUnit": "ms"}
        write_atomically(self.path, json.dumps(trace).encode())
        return self.path

"""``IOBinding``: a session's inputs and outputs bound once, then run again and again.

What onnxruntime's IOBinding is for, on every nxrt EP: an input bound as a
host array is read in place (no copy, so changing the array changes the next
run's input); an input bound as an OrtValue on a device EP's device is handed
to that EP as it is, run after run, without a trip through the host; an
output bound to a device stays there; an output bound to a preallocated
buffer (``bind_output`` with a pointer, ``bind_ortvalue_output``) is written
into that buffer.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from nxrt.errors import InvalidArgument, RuntimeFailure
from nxrt.ort.ortvalue import HOST, OrtValue, device_ep, element_dtype

if TYPE_CHECKING:
    from nxrt.ort.options import RunOptions
    from nxrt.provider import ExecutionProvider


class BoundSession(Protocol):
    """What a binding calls on its session (:class:`nxrt.ort.session.InferenceSession`,
    which makes bindings: named here so the two modules need not name each other)."""

    @property
    def output_names(self) -> list[str]: ...

    def check_input_name(self, name: str) -> None: ...

    def output_producer(self, name: str) -> ExecutionProvider | None: ...

    def output_value(self, name: str, value: Any, kept: bool) -> OrtValue: ...

    def run_bound(
        self,
        inputs: dict[str, OrtValue],
        outputs: Sequence[str],
        kept: frozenset[str],
        run_options: RunOptions | None,
    ) -> list[Any]: ...


@dataclass
class _Output:
    """Where a bound output goes: a device, and the caller's buffer when preallocated."""

    device: str = HOST
    buffer: OrtValue | None = None


def _pointer_array(
    device_type: str, element_type: Any, shape: Sequence[int], buffer_ptr: int
) -> np.ndarray:
    """The host memory at ``buffer_ptr`` as an array of ``shape`` (not copied)."""
    if device_type.lower() != HOST:
        raise RuntimeFailure(
            f"cannot bind a raw pointer on device {device_type!r}: nxrt's device EPs hold "
            "their own arrays; bind an OrtValue made with OrtValue.ortvalue_from_numpy(array, "
            f"{device_type!r}) or OrtValue.from_dlpack(array) instead"
        )
    dtype = element_dtype(element_type)
    count = int(np.prod([int(d) for d in shape], dtype=np.int64))
    memory = (ctypes.c_char * (count * dtype.itemsize)).from_address(int(buffer_ptr))
    # numpy's stub leaves out ctypes arrays, which export the buffer protocol
    return np.frombuffer(memory, dtype).reshape([int(d) for d in shape])  # type: ignore[call-overload]


class IOBinding:
    """Inputs and outputs bound to a session, for :meth:`InferenceSession.run_with_iobinding`."""

    def __init__(self, session: BoundSession) -> None:
        self.session = session
        self._inputs: dict[str, OrtValue] = {}
        self._outputs: dict[str, _Output] = {}  # in binding order, the order of get_outputs
        self._results: list[OrtValue] = []

    # -- inputs ---------------------------------------------------------------------------------
    def bind_cpu_input(self, name: str, arr_on_cpu: np.ndarray) -> None:
        """Bind a host array, read in place by every run until rebound."""
        self.session.check_input_name(name)
        self._inputs[name] = OrtValue(np.asarray(arr_on_cpu))

    def bind_input(
        self,
        name: str,
        device_type: str,
        device_id: int,
        element_type: Any,
        shape: Sequence[int],
        buffer_ptr: int,
    ) -> None:
        """Bind the host memory at ``buffer_ptr`` (the caller keeps it alive and unchanged
        while bound)."""
        self.session.check_input_name(name)
        self._inputs[name] = OrtValue(_pointer_array(device_type, element_type, shape, buffer_ptr))

    def bind_ortvalue_input(self, name: str, ortvalue: OrtValue) -> None:
        """Bind an OrtValue; one on a device EP's device is read there, without copies."""
        self.session.check_input_name(name)
        self._inputs[name] = ortvalue

    def synchronize_inputs(self) -> None:
        """Nothing to wait for: nxrt reads bound inputs when a run starts."""

    def clear_binding_inputs(self) -> None:
        self._inputs.clear()

    # -- outputs --------------------------------------------------------------------------------
    def bind_output(
        self,
        name: str,
        device_type: str = HOST,
        device_id: int = 0,
        element_type: Any = None,
        shape: Sequence[int] | None = None,
        buffer_ptr: int | None = None,
    ) -> None:
        """Bind an output to a device (results stay there), or to the preallocated host
        buffer at ``buffer_ptr`` (results are written into it)."""
        if buffer_ptr is None:
            self._outputs[name] = _Output(device_type.lower())
            return
        if element_type is None or shape is None:
            raise InvalidArgument(
                "element_type and shape are needed when a preallocated buffer_ptr is bound"
            )
        array = _pointer_array(device_type, element_type, shape, buffer_ptr)
        self._outputs[name] = _Output(HOST, OrtValue(array))

    def bind_ortvalue_output(self, name: str, ortvalue: OrtValue) -> None:
        """Bind an output to ``ortvalue``, which each run's result is written into."""
        self._outputs[name] = _Output(ortvalue.device_name(), ortvalue)

    def synchronize_outputs(self) -> None:
        """Nothing to wait for: a run returns once its outputs are computed."""

    def clear_binding_outputs(self) -> None:
        self._outputs.clear()

    def get_outputs(self) -> list[OrtValue]:
        """The results of the last run, one OrtValue per bound output, in binding order."""
        return list(self._results)

    def get_outputs_as_ortvaluevector(self) -> list[OrtValue]:
        return self.get_outputs()

    def copy_outputs_to_cpu(self) -> list[Any]:
        """The last run's results as host values (copies: later runs do not change them)."""
        copies: list[Any] = []
        for value in self._results:
            if value.is_tensor():
                copies.append(np.array(value.numpy(), copy=True))
            else:
                copies.append(value.value)
        return copies

    # -- running --------------------------------------------------------------------------------
    def run(self, run_options: RunOptions | None = None) -> None:
        """One run on the bound values (``InferenceSession.run_with_iobinding``)."""
        if not self._outputs:
            raise RuntimeFailure("bind at least one output before running (bind_output)")
        session = self.session
        names = list(self._outputs)
        unknown = [name for name in names if name not in session.output_names]
        if unknown:
            raise RuntimeFailure(
                f"error in execution: bound output(s) {unknown} are not outputs of the model; "
                f"outputs: {session.output_names}"
            )
        kept = frozenset(
            name
            for name, output in self._outputs.items()
            if output.device != HOST
            and (producer := session.output_producer(name)) is not None
            and producer.device_type == output.device
        )
        results = session.run_bound(self._inputs, names, kept, run_options)
        self._results = [
            self._deliver(name, self._outputs[name], result, name in kept)
            for name, result in zip(names, results)
        ]

    def _deliver(self, name: str, output: _Output, result: Any, kept: bool) -> OrtValue:
        """The OrtValue an output's result ends in: the caller's buffer, written in place;
        a value on the output's device; or a host value."""
        value = self.session.output_value(name, result, kept)
        buffer = output.buffer
        if buffer is None:
            if output.device == HOST or kept:
                return value
            ep = device_ep(output.device)
            return OrtValue(ep.copy_from_host(value.numpy()), ep.device_type, ep=ep)
        if kept and not isinstance(buffer.value, np.ndarray):
            buffer._value = result  # a device array: the buffer now holds the new one
            return buffer
        host = value.numpy()
        if list(host.shape) != buffer.shape():
            raise RuntimeFailure(
                f"output {name!r} has shape {list(host.shape)} this run, but the buffer bound "
                f"to it has shape {buffer.shape()}; bind a buffer of the output's shape, or "
                "bind the output without one (bind_output(name)) for dynamic shapes"
            )
        buffer.update_inplace(host)
        return buffer

"""A compiled claim as an nxrt kernel: one ``openvino.CompiledModel``, one infer request per thread.

An ``InferRequest`` holds its own input and output tensors, so two threads
must never share one; each thread that runs the kernel gets its own the first
time (``threading.local``), and the compiled model is shared. Inputs are
handed to OpenVINO without a copy (``share_inputs``); outputs are copied out of
the request's buffers (``share_outputs=False``), because the request reuses
them on its next call while the caller keeps the arrays.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from nxrt.errors import KernelFailed
from nxrt.kernel import Kernel


def _port_names(port: Any) -> set[str]:
    return set(port.get_names())


def _contiguous(value: Any) -> np.ndarray:
    """A C-contiguous array OpenVINO can read in place (0-d arrays stay 0-d)."""
    if type(value) is np.ndarray and value.flags.c_contiguous:
        return value
    return np.asarray(value, order="C")


class OpenVinoKernel(Kernel):
    """Runs one compiled claim.

    :param compiled: The ``openvino.CompiledModel``.
    :param inputs: The value names ``compute`` receives, in order (a claim's
        boundary inputs; weights among them are already in the compiled model).
    :param outputs: The value names ``compute`` returns, in order.
    :param feeds: The values the compiled model's inputs stand for, in port order
        (OpenVINO may rename a parameter after the output it passes through, so the
        port's own names are checked first, then this order).
    :param name: The partition name, for traces and contexts.
    :param source: Rebuilds the claim's standalone ONNX bytes (kept in an EPContext
        so a later OpenVINO can recompile it); ``None`` when there is none.
    :param weights: nxrt's weight arrays the compiled model's constants were made
        over without a copy: kept alive as long as the kernel.
    :param reason: How it was made (the trace's variant reason).
    """

    variant = "openvino"

    def __init__(
        self,
        compiled: Any,
        inputs: Sequence[str],
        outputs: Sequence[str],
        feeds: Sequence[str],
        *,
        name: str = "",
        source: Callable[[], bytes] | None = None,
        weights: Mapping[str, np.ndarray] | None = None,
        reason: str = "",
    ) -> None:
        self.compiled = compiled
        self._weights = dict(weights or {})
        self.name = name
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.source = source
        position = {n: i for i, n in enumerate(self.inputs)}
        self.feeds: list[int] = []  # index in ``inputs`` of each compiled input, in port order
        for i, port in enumerate(compiled.inputs):
            names = _port_names(port) & position.keys()
            if not names and i < len(feeds) and feeds[i] in position:
                names = {feeds[i]}
            if not names:
                raise KernelFailed(
                    f"the compiled partition {name!r} reads {sorted(_port_names(port))}, "
                    f"which it is not given (given: {self.inputs})"
                )
            self.feeds.append(position[min(names, key=position.__getitem__)])
        #: The names of the values the compiled model reads, in port order (EPContext inputs).
        self.feed_names = [self.inputs[i] for i in self.feeds]
        ports = [_port_names(port) for port in compiled.outputs]
        self.order: list[int] = []  # compiled output index of each of ``outputs``
        for i, value in enumerate(self.outputs):
            found = [k for k, names in enumerate(ports) if value in names]
            self.order.append(found[0] if found else i)
        if len(ports) < len(self.outputs) or any(k >= len(ports) for k in self.order):
            raise KernelFailed(f"the compiled partition {name!r} lacks outputs of {self.outputs}")
        self.variant_reason = reason or f"{len(self.feeds)} -> {len(self.outputs)} values"
        self._local = threading.local()

    def _request(self) -> Any:
        request = getattr(self._local, "request", None)
        if request is None:
            request = self._local.request = self.compiled.create_infer_request()
        return request

    def compute(self, inputs: Sequence[Any]) -> tuple[Any, ...]:
        request = self._request()
        feeds = [_contiguous(inputs[i]) for i in self.feeds]
        try:
            results = request.infer(feeds, share_inputs=True, share_outputs=False)
        except Exception as exc:  # noqa: BLE001 - OpenVINO's errors carry its own reason
            raise KernelFailed(f"OpenVINO: {exc}") from exc
        values = results.to_tuple()
        return tuple(values[k] for k in self.order)

    def model_bytes(self) -> bytes:
        """The claim's standalone ONNX model ('' when this kernel was imported without one)."""
        return self.source() if self.source is not None else b""

    def __repr__(self) -> str:
        return f"OpenVinoKernel({self.name!r}, {self.variant_reason})"

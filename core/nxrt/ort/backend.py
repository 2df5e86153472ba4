"""``onnx.backend.base.Backend`` over nxrt, so ONNX's own test runner can drive it.

``NxrtBackend`` uses every installed EP (cpu last); :func:`backend_for` gives
a backend pinned to one EP with no cpu fallback, which is how the
conformance suite judges a single EP.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep, Device, DeviceType

from nxrt.ort.session import DISABLE_CPU_EP_FALLBACK, InferenceSession, SessionOptions


class NxrtBackendRep(BackendRep):
    """A prepared model: feeds are matched to the graph inputs in order."""

    def __init__(self, session: InferenceSession) -> None:
        self.session = session
        self.input_names = [arg.name for arg in session.get_inputs()]

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        if isinstance(inputs, dict):
            feeds = dict(inputs)
        elif isinstance(inputs, (list, tuple)):
            feeds = dict(zip(self.input_names, inputs))
        else:
            feeds = {self.input_names[0]: inputs}
        return tuple(self.session.run(None, feeds))


class NxrtBackend(Backend):
    """nxrt as an ONNX backend; ``providers`` (class attribute) pins the EPs."""

    providers: Sequence[str] | None = None
    disable_fallback: bool = False

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> NxrtBackendRep:
        options = SessionOptions()
        if cls.disable_fallback:
            options.add_session_config_entry(DISABLE_CPU_EP_FALLBACK, "1")
        return NxrtBackendRep(InferenceSession(model, options, providers=cls.providers))

    @classmethod
    def run_model(
        cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any
    ) -> tuple[Any, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(
        cls,
        node: onnx.NodeProto,
        inputs: Any,
        device: str = "CPU",
        outputs_info: Sequence[tuple[np.dtype, tuple[int, ...]]] | None = None,
        **kwargs: Any,
    ) -> tuple[Any, ...]:
        """Run one node by wrapping it in a model typed from its inputs."""
        from onnx import helper

        arrays = [np.asarray(x) for x in inputs]
        names = [name for name in node.input if name]
        graph_inputs = [
            helper.make_tensor_value_info(
                name, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape)
            )
            for name, a in zip(names, arrays)
        ]
        graph_outputs = [helper.make_empty_tensor_value_info(name) for name in node.output]
        graph = helper.make_graph([node], "run_node", graph_inputs, graph_outputs)
        opset = kwargs.get("opset_version", onnx.defs.onnx_opset_version())
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        return cls.run_model(model, dict(zip(names, arrays)), device)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return Device(device).type == DeviceType.CPU


def backend_for(ep: str) -> type[NxrtBackend]:
    """A backend that runs everything on ``ep`` alone (no silent cpu fallback)."""
    return type(f"NxrtBackend_{ep}", (NxrtBackend,), {"providers": [ep], "disable_fallback": True})


prepare = NxrtBackend.prepare
run_model = NxrtBackend.run_model
run_node = NxrtBackend.run_node
supports_device = NxrtBackend.supports_device

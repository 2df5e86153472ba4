"""Small models with external data, and a test EP that records the weights it receives.

Shared by the external-data, MoE and residency tests: every model here is a
few kB, written into a pytest ``tmp_path``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

import nxrt
from nxrt.moe.reference import block_quantized_moe
from nxrt.pipeline.weight_binding import resident_array
from nxrt.provider import ExecutionProvider
from nxrt.registry import KernelMatch, OpRegistry
from nxrt.weight import ExecutionProviderCapabilities, LazyWeight

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

from make_moe_model import SMALL, MoeConfig, expert_tensors, make_moe_model  # noqa: E402

__all__ = [
    "SMALL",
    "MoeConfig",
    "RecordingMoePlugin",
    "add_model",
    "expert_tensors",
    "external_tensor",
    "make_moe_model",
    "moe_node_model",
    "save",
]


def external_tensor(
    name: str,
    array: np.ndarray,
    folder: str,
    location: str = "weights.bin",
    *,
    offset: int | None = None,
    length: int | None = None,
    raw: bytes | None = None,
    data_type: int | None = None,
    dims: tuple[int, ...] | None = None,
) -> TensorProto:
    """A TensorProto whose bytes are appended to ``folder/location`` (unless it points away).

    ``offset`` and ``length`` override what is recorded (not what is written);
    ``location`` may be anything, for the path-escape tests.
    """
    data = raw if raw is not None else np.ascontiguousarray(array).tobytes()
    target = os.path.join(folder, location)
    written_at = 0
    if not os.path.isabs(location) and ".." not in location and not os.path.islink(target):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "ab") as f:
            written_at = f.tell()
            f.write(data)
    tensor = TensorProto()
    tensor.name = name
    tensor.data_type = data_type or helper.np_dtype_to_tensor_dtype(array.dtype)
    tensor.dims.extend(dims if dims is not None else array.shape)
    tensor.data_location = TensorProto.EXTERNAL
    entries = {"location": location, "offset": written_at if offset is None else offset}
    entries["length"] = len(data) if length is None else length
    for key, value in entries.items():
        entry = tensor.external_data.add()
        entry.key, entry.value = key, str(value)
    return tensor


def save(model: onnx.ModelProto, folder: str, name: str = "model.onnx") -> str:
    """Write ``model`` as is (``onnx.save`` would rewrite external data)."""
    path = os.path.join(folder, name)
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    return path


def add_model(folder: str, weight: TensorProto, shape: list[int] | None = None) -> str:
    """``y = x + w`` with ``w`` stored externally; returns the model's path."""
    shape = shape if shape is not None else list(weight.dims)
    elem = weight.data_type
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", weight.name], ["y"])],
        "add",
        [helper.make_tensor_value_info("x", elem, shape)],
        [helper.make_tensor_value_info("y", elem, shape)],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return save(model, folder)


def moe_node_model(
    weights: Mapping[str, np.ndarray],
    *,
    folder: str | None = None,
    dtype: np.dtype | type = np.float32,
    extra_reader: bool = False,
    **attrs: Any,
) -> onnx.ModelProto | str:
    """One BlockQuantizedMoE node reading X and router_logits; weights as initializers.

    With ``folder`` the weights are external (the model's path is returned),
    otherwise embedded. ``extra_reader`` adds an Identity node that also
    reads ``fc1_scales`` (which then may not stay lazy).
    """
    from onnx import numpy_helper

    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    names = ["fc1_weight", "fc1_scales", "fc2_weight", "fc2_scales"]
    names += [n for n in ("fc1_zero_points", "fc2_zero_points") if n in weights]
    if folder is None:
        initializers = [numpy_helper.from_array(weights[n], n) for n in names]
    else:
        initializers = [external_tensor(n, weights[n], folder) for n in names]
    hidden = weights["fc2_weight"].shape[1]
    experts = weights["fc1_weight"].shape[0]
    nodes = [
        helper.make_node(
            "BlockQuantizedMoE",
            ["X", "router_logits", *names],
            ["Y"],
            name="moe",
            domain="pkg.nxrt",
            **attrs,
        )
    ]
    outputs = [helper.make_tensor_value_info("Y", elem, ["T", hidden])]
    if extra_reader:
        nodes.append(helper.make_node("Identity", ["fc1_scales"], ["scales_copy"], name="copy"))
        outputs.append(
            helper.make_tensor_value_info("scales_copy", elem, list(weights["fc1_scales"].shape))
        )
    graph = helper.make_graph(
        nodes,
        "moe",
        [
            helper.make_tensor_value_info("X", elem, ["T", hidden]),
            helper.make_tensor_value_info("router_logits", elem, ["T", experts]),
        ],
        outputs,
        initializers,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("pkg.nxrt", 1)],
    )
    return model if folder is None else save(model, folder)


class RecordingMoePlugin:
    """A third-party EP ``rec`` with a BlockQuantizedMoE kernel that records its inputs.

    ``flags`` are its advertised capabilities: with ``"nxrt"`` it should receive
    lazy handles, without it resident arrays.
    """

    def __init__(self, flags: tuple[str, ...] = ("nxrt",), ep_id: str = "rec") -> None:
        self.flags = flags
        self.ep_id = ep_id
        self.received: list[list[type]] = []
        self.ops = OpRegistry(ep_id)
        plugin = self

        @self.ops.op("BlockQuantizedMoE", since=1, domain="pkg.nxrt")
        def moe(x, router_logits, *weights, **attrs):
            plugin.received.append([type(w) for w in weights])
            arrays = [
                resident_array(w.materialize()) if isinstance(w, LazyWeight) else w for w in weights
            ]
            return block_quantized_moe(x, router_logits, *arrays, **attrs)

    @nxrt.hookimpl
    def nxrt_register(self, registry):
        ops = self.ops

        class RecordingEP(ExecutionProvider):
            pass

        registry.add_provider(self.ep_id, lambda config: RecordingEP(config, ops))
        registry.add_kernels(self.ep_id, ops)

    @nxrt.hookimpl
    def nxrt_ep_capabilities(self, ep):
        if ep.id != self.ep_id:
            return None
        return ExecutionProviderCapabilities.from_flags(self.flags)

    @nxrt.hookimpl
    def nxrt_match_kernel(self, ep, node, opset):
        if ep.id != self.ep_id:
            return None
        return ep.ops.match(node, opset) if ep.ops is not None else KernelMatch.no("no ops")

"""A fuzz case: a model, the feeds it runs on, and (once known) the outputs it must give.

A case travels between processes and into the regression folder as one
``.npz`` file: the serialized model as a ``uint8`` array, each feed as
``in.<name>`` and each expected output as ``out.<name>``, plus a short note.
One file per case keeps a regression self-contained and diffable by name.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper

MODEL_KEY = "__model__"
NOTE_KEY = "__note__"


@dataclass
class Case:
    """One model and its feeds; ``expected`` holds the outputs it must give, when known."""

    model: onnx.ModelProto
    feeds: dict[str, np.ndarray]
    expected: dict[str, np.ndarray] = field(default_factory=dict)
    note: str = ""

    @property
    def opset(self) -> int:
        return next(o.version for o in self.model.opset_import if o.domain in ("", "ai.onnx"))

    @property
    def ops(self) -> list[str]:
        return [n.op_type for n in self.model.graph.node]

    def output_names(self) -> list[str]:
        return [o.name for o in self.model.graph.output]

    def save(self, path: str | os.PathLike[str]) -> None:
        arrays = {MODEL_KEY: np.frombuffer(self.model.SerializeToString(), np.uint8)}
        arrays |= {f"in.{k}": _storable(v) for k, v in self.feeds.items()}
        arrays |= {f"out.{k}": _storable(v) for k, v in self.expected.items()}
        arrays[NOTE_KEY] = np.array(self.note)
        buffer = io.BytesIO()
        # mypy checks the arrays unpacked by ** against savez_compressed's allow_pickle: bool
        np.savez_compressed(buffer, **arrays)  # type: ignore[arg-type]
        tmp = f"{path}.tmp"
        with open(tmp, "wb") as f:
            f.write(buffer.getvalue())
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Case:
        with np.load(path, allow_pickle=False) as data:
            model = onnx.load_from_string(data[MODEL_KEY].tobytes())
            feeds = {k[3:]: _loaded(data[k]) for k in data.files if k.startswith("in.")}
            expected = {k[4:]: _loaded(data[k]) for k in data.files if k.startswith("out.")}
            note = str(data[NOTE_KEY]) if NOTE_KEY in data.files else ""
        return cls(model, feeds, expected, note)

    def describe(self) -> str:
        """One line per node with its attributes, and the feeds' shapes and dtypes."""
        lines = [f"opset {self.opset}"]
        for name, value in self.feeds.items():
            lines.append(f"  input {name}: {value.dtype}{list(value.shape)}")
        for init in self.model.graph.initializer:
            value = onnx.numpy_helper.to_array(init)
            shown = value.tolist() if value.size <= 8 else f"{value.dtype}{list(value.shape)}"
            lines.append(f"  const {init.name}: {shown}")
        for node in self.model.graph.node:
            attrs = {a.name: _attr_text(a) for a in node.attribute}
            lines.append(
                f"  {node.op_type}({', '.join(node.input)}) -> {', '.join(node.output)} {attrs}"
            )
        return "\n".join(lines)


def _storable(value: np.ndarray) -> np.ndarray:
    """String tensors (object arrays) as numpy unicode, which needs no pickle."""
    return value.astype(str) if value.dtype == object else value


def _loaded(value: np.ndarray) -> np.ndarray:
    return value.astype(object) if value.dtype.kind == "U" else value


def _attr_text(attr: onnx.AttributeProto) -> object:
    value = helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value).tolist()
    if isinstance(value, onnx.GraphProto):
        return f"<graph {len(value.node)} nodes>"
    return value


def make_model(
    nodes: list[onnx.NodeProto],
    inputs: dict[str, np.ndarray],
    initializers: dict[str, np.ndarray],
    outputs: list[str],
    opset: int,
) -> onnx.ModelProto:
    """A model over ``nodes``: typed, shaped graph inputs and untyped outputs."""
    graph = helper.make_graph(
        nodes,
        "fuzz",
        [helper.make_tensor_value_info(n, _elem(v), list(v.shape)) for n, v in inputs.items()],
        [helper.make_value_info(n, onnx.TypeProto()) for n in outputs],
        [onnx.numpy_helper.from_array(v, n) for n, v in initializers.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = min(model.ir_version, 10)  # onnxruntime reads up to IR 10 (or 11)
    return model


def _elem(value: np.ndarray) -> int:
    return helper.np_dtype_to_tensor_dtype(value.dtype)

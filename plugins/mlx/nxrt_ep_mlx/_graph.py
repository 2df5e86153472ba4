"""What the mlx EP reads off an ONNX graph: a node's opset, constant values, used outputs.

The claim rules (``_claims``), the compiler (``_compiler``) and the
translators' own checks (``ops``) all read them; this module imports none of
those, so each of them can import it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from nxrt.kernel import attribute_values
from nxrt.registry import normalize_domain

if TYPE_CHECKING:
    import onnx_ir as ir


def node_opset(node: ir.Node, opsets: Mapping[str, int]) -> int:
    """The opset a node follows: its own version if set, else the model's import."""
    if node.version is not None:
        return int(node.version)
    imports = {normalize_domain(d): v for d, v in opsets.items()}
    return int(imports.get(normalize_domain(node.domain), 0))


def constant_array(value: ir.Value) -> np.ndarray | None:
    """A value's data if it is known before any run: an initializer or a Constant's output."""
    if value.const_value is not None:
        return value.const_value.numpy()
    producer = value.producer()
    if producer is None or producer.op_type != "Constant" or normalize_domain(producer.domain):
        return None
    attrs = attribute_values(producer)
    if "value" in attrs:
        return np.asarray(attrs["value"])
    for name, dtype in (
        ("value_float", np.float32),
        ("value_floats", np.float32),
        ("value_int", np.int64),
        ("value_ints", np.int64),
    ):
        if name in attrs:
            return np.asarray(attrs[name], dtype)
    return None


def is_used(value: ir.Value | None) -> bool:
    """A named output that some node or the graph reads."""
    return (
        value is not None and bool(value.name) and (bool(value.uses()) or value.is_graph_output())
    )

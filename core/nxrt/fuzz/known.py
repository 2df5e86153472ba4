"""Where the ONNX spec and onnxruntime disagree, and nxrt follows the spec.

Each entry names the op, says what the spec says and what onnxruntime does,
and recognises the one-node cases it covers as narrowly as it can: a case
that matches is counted as a ``known difference`` rather than a failure.
docs/fuzzing.md lists the same entries for readers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper

from nxrt.fuzz.case import Case


@dataclass(frozen=True)
class KnownDifference:
    """One documented disagreement: which op, why, and which cases it covers."""

    id: str
    op: str
    explanation: str
    matches: Callable[[onnx.NodeProto, dict[str, np.ndarray], Case, list[Any]], bool]


def attrs_of(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _inputs(case: Case, node: onnx.NodeProto) -> list[np.ndarray | None]:
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in case.model.graph.initializer}
    return [case.feeds.get(n, inits.get(n)) if n else None for n in node.input]


KNOWN: list[KnownDifference] = []


def known_difference(case: Case, got: list[Any]) -> str:
    """The id and explanation of the entry that covers this one-node case ('' if none)."""
    nodes = list(case.model.graph.node)
    if len(nodes) != 1:
        return ""
    node = nodes[0]
    values = dict(zip(node.input, _inputs(case, node)))
    for entry in KNOWN:
        if entry.op == node.op_type and entry.matches(node, values, case, got):
            return f"{entry.id}: {entry.explanation}"
    return ""

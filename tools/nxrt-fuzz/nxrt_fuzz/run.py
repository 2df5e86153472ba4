"""Running one case on onnxruntime and on nxrt, and naming what happened.

Outcomes (:data:`KINDS`): both ran and agree; both refused the model; nxrt
gave a wrong result; only nxrt raised (onnxruntime ran it); only
onnxruntime raised (nxrt ran a model onnxruntime refuses: fine, counted);
nxrt crashed its process or raised a non-nxrt exception; nxrt hung. A
wrong result is *localized*: every node is run alone, on onnxruntime's
values for its inputs, and the first node that disagrees alone is the
culprit (its one-node case is what gets minimized and saved). A graph whose
every node agrees alone but whose outputs drift apart (a Floor or a
comparison after a rounding difference) is ``drift``, unless nxrt without
its graph optimizations agrees: then nxrt's optimizer is the culprit. A
culprit that matches an entry of :mod:`nxrt_fuzz.known` (where the ONNX spec
and onnxruntime disagree and nxrt follows the spec) is a ``known
difference``, not a failure.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from nxrt_fuzz.build import _all_inputs
from nxrt_fuzz.case import Case, make_model
from nxrt_fuzz.execute import (
    NxrtCrashed,
    outputs_mismatch,
    run_nxrt,
    run_onnxruntime,
)

AGREED, BOTH_REFUSED, WRONG, NXRT_ERROR, ORT_ERROR = (
    "agreed",
    "both refused",
    "wrong result",
    "nxrt-only error",
    "ort-only error",
)
CRASH, HANG, KNOWN, DRIFT, ORT_CRASH = "crash", "hang", "known difference", "drift", "ort crash"
#: The generator itself failed (a bug in the fuzzer, shown but not counted against nxrt).
FUZZER_ERROR = "fuzzer error"
KINDS = (
    AGREED, BOTH_REFUSED, WRONG, NXRT_ERROR, ORT_ERROR, CRASH, HANG, KNOWN, DRIFT, ORT_CRASH,
    FUZZER_ERROR,
)  # fmt: skip
#: The outcomes that count against nxrt; every one is minimized and saved.
FAILURES = (WRONG, NXRT_ERROR, CRASH, HANG)


@dataclass
class Outcome:
    """What one case did: its kind, the mismatch or error text, and the op at fault."""

    kind: str
    detail: str = ""
    op: str = ""
    culprit: Case | None = None
    on_ep: int = 0  # nodes the tested EP (not its cpu fallback) was given

    def signature(self) -> str:
        """What makes two failures "the same": kind, op, and the error's first words."""
        return f"{self.kind}|{self.op}|{error_key(self.detail) if self.kind != WRONG else ''}"


def error_key(detail: str) -> str:
    """An error message without the node's name and numbers: its type and first words."""
    text = re.sub(r"^.*? on EP '[^']*': ", "", detail)
    return re.sub(r"[-\d]+", "#", text)[:60]


def evaluate(case: Case, ep: str = "cpu") -> Outcome:
    """Run ``case`` on both runtimes and classify it (see the module docstring)."""
    expected = run_onnxruntime(case)
    placed: Counter[str] = Counter()
    try:
        got = run_nxrt(case, ep, placed=placed)
    except NxrtCrashed as exc:
        return Outcome(CRASH, str(exc), _op_named(case, str(exc)))
    outcome = _classify(case, ep, expected, got)
    outcome.on_ep = placed.get(ep, 0)
    return outcome


def _classify(case: Case, ep: str, expected: list[Any] | str, got: list[Any] | str) -> Outcome:
    from nxrt_fuzz.known import known_difference

    if isinstance(expected, str) and isinstance(got, str):
        return Outcome(BOTH_REFUSED, f"ort: {expected[:300]} | nxrt: {got[:300]}")
    if isinstance(expected, str):
        return Outcome(ORT_ERROR, expected[:500], case.ops[-1])
    case.expected = dict(zip(case.output_names(), expected))
    if isinstance(got, str):
        culprit = localize(case, ep)
        if culprit is not None:
            return culprit
        return Outcome(NXRT_ERROR, got[:500], _op_named(case, got))
    why = outputs_mismatch(case, got, expected)
    if not why:
        return Outcome(AGREED)
    culprit = localize(case, ep)
    if culprit is not None:
        return culprit
    try:
        unoptimized = run_nxrt(case, ep, optimize=False)
    except NxrtCrashed as exc:
        return Outcome(CRASH, f"without optimizations: {exc}", _op_named(case, str(exc)))
    if not isinstance(unoptimized, str) and not outputs_mismatch(case, unoptimized, expected):
        return Outcome(WRONG, f"optimized graph only: {why}", "optimizer", case)
    known = known_difference(case, got)
    if known:
        return Outcome(KNOWN, known, case.ops[-1], case)
    return Outcome(DRIFT, why)


def localize(case: Case, ep: str) -> Outcome | None:
    """The first node that, run alone on onnxruntime's values, nxrt gets wrong or refuses."""
    from nxrt_fuzz.known import known_difference

    values = intermediates(case)
    if values is None:
        return None
    nodes = list(case.model.graph.node)
    for index, node in enumerate(nodes):
        if not any(isinstance(values.get(o), np.ndarray) for o in node.output):
            continue
        single = cut(case, index, values)
        if single is None:
            continue
        expected = run_onnxruntime(single)
        if isinstance(expected, str):
            continue
        single.expected = dict(zip(single.output_names(), expected))
        try:
            got = run_nxrt(single, ep)
        except NxrtCrashed as exc:
            return Outcome(CRASH, str(exc), node.op_type, single)
        if isinstance(got, str):
            known = known_difference(single, got)
            if known:
                return Outcome(KNOWN, known, node.op_type, single)
            return Outcome(NXRT_ERROR, got[:500], node.op_type, single)
        why = outputs_mismatch(single, got, expected)
        if why:
            known = known_difference(single, got)
            if known:
                return Outcome(KNOWN, known, node.op_type, single)
            return Outcome(WRONG, why, node.op_type, single)
    return None


def intermediates(case: Case) -> dict[str, Any] | None:
    """Every value of the case as onnxruntime computes it (``None`` when it cannot)."""
    names = [o for n in case.model.graph.node for o in n.output if o]
    result = run_onnxruntime(case, names)
    if isinstance(result, str):
        return None
    values: dict[str, Any] = dict(zip(names, result))
    values |= {t.name: onnx.numpy_helper.to_array(t) for t in case.model.graph.initializer}
    return values | dict(case.feeds)


def cut(case: Case, index: int, values: dict[str, Any]) -> Case | None:
    """Node ``index`` alone (with the producers of any sequence or optional it reads), fed
    ``values`` for the rest."""
    graph = case.model.graph
    nodes = list(graph.node)
    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in graph.initializer}
    keep, todo = set(), [index]
    while todo:
        i = todo.pop()
        keep.add(i)
        for name in _all_inputs(nodes[i]):
            j = producer.get(name)
            if j is not None and j not in keep and not isinstance(values.get(name), np.ndarray):
                todo.append(j)
    kept = [nodes[i] for i in sorted(keep)]
    made = {o for n in kept for o in n.output}
    needed = [i for n in kept for i in _all_inputs(n) if i and i not in made]
    feeds, consts = {}, {}
    for name in dict.fromkeys(needed):
        if name in inits:
            consts[name] = inits[name]
        elif isinstance(values.get(name), np.ndarray):
            feeds[name] = values[name]
        else:
            return None
    outputs = [o for o in nodes[index].output if o]
    model = make_model(kept, feeds, consts, outputs, case.opset)
    return Case(model, feeds, note=f"{case.note}; node {index} ({nodes[index].op_type}) alone")


def _op_named(case: Case, text: str) -> str:
    """The op an error message names (nxrt's errors name the node's op), else the last op."""
    for op in sorted(set(case.ops), key=len, reverse=True):
        if op in text:
            return op
    return case.ops[-1] if case.ops else ""

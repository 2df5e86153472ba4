"""Running one case on onnxruntime and on nxrt, and comparing their outputs.

Its own module so that both the classifier (:mod:`nxrt_fuzz.run`) and the
known-difference predicates (:mod:`nxrt_fuzz.known`) can run cases without
importing each other.
"""

from __future__ import annotations

import traceback
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx

from nxrt_fuzz.case import Case
from nxrt_fuzz.compare import mismatch


def _no_phase(phase: str) -> None:
    """The default phase hook: nobody is listening."""


#: Called with ``"ort"`` or ``"nxrt"`` before each run (the worker reports it to the driver).
PHASE_HOOK: Callable[[str], None] = _no_phase


class NxrtCrashed(Exception):
    """nxrt raised something that is not an :class:`~nxrt.errors.NxrtError` (an EP bug)."""


def run_onnxruntime(case: Case, outputs: list[str] | None = None) -> list[Any] | str:
    import onnxruntime as ort

    PHASE_HOOK("ort")
    model = case.model if outputs is None else _with_outputs(case.model, outputs)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 4
    try:
        session = ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        return session.run(None, case.feeds)
    except Exception as exc:  # noqa: BLE001 - a refusal, reported as text
        return f"{type(exc).__name__}: {exc}"


def run_nxrt(
    case: Case, ep: str = "cpu", *, optimize: bool = True, placed: Counter[str] | None = None
) -> list[Any] | str:
    """nxrt's outputs, the text of an :class:`NxrtError` it raised, or :class:`NxrtCrashed`;
    ``placed`` counts the nodes each EP was given."""
    import nxrt
    from nxrt.errors import NxrtError

    options = nxrt.SessionOptions()
    options.intra_op_num_threads = 1
    if not optimize:
        options.graph_optimization_level = nxrt.GraphOptimizationLevel.ORT_DISABLE_ALL
    providers = [ep] if ep == "cpu" else [ep, "cpu"]
    PHASE_HOOK("nxrt")
    try:
        with np.errstate(all="ignore"):
            session = nxrt.InferenceSession(case.model, options, providers=providers)
            if placed is not None:
                placed.update(session.get_partition().nodes_per_ep())
            return session.run(None, dict(case.feeds))
    except NxrtError as exc:
        return f"{type(exc).__name__}: {exc}"
    except Exception as exc:
        raise NxrtCrashed(_last_lines(traceback.format_exc())) from exc


def outputs_mismatch(case: Case, got: list[Any], expected: list[Any], loose: float = 1.0) -> str:
    """Why nxrt's outputs differ from onnxruntime's ('' when they agree); see
    :func:`~nxrt_fuzz.compare.mismatch` for ``loose``."""
    if len(got) != len(expected):
        return f"{len(got)} outputs, expected {len(expected)}"
    for name, g, e in zip(case.output_names(), got, expected):
        why = mismatch(g, e, loose=loose)
        if why:
            return f"output {name}: {why}"
    return ""


def _with_outputs(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    del copy.graph.output[:]
    copy.graph.output.extend(onnx.helper.make_value_info(n, onnx.TypeProto()) for n in names)
    return copy


def _last_lines(text: str, count: int = 4) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return " | ".join(line.strip() for line in lines[-count:])[:800]

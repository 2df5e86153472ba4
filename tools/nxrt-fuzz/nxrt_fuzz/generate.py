"""Random cases: graphs of 1 to 8 nodes over the ops an EP and onnxruntime both run.

A case is a pure function of ``(seed, index)``: the same pair gives the same
model and feeds on any machine, so a run's report names cases by their pair
and anyone can regenerate one (``python -m nxrt_fuzz --seed S --only I``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import onnx

from nxrt_fuzz import ops_nn  # noqa: F401  (imported for its registrations)
from nxrt_fuzz.build import F16, F32, MAX_ELEMENTS, Builder, Skip, _all_inputs, run_ort, schema
from nxrt_fuzz.case import Case, make_model
from nxrt_fuzz.ops import GENERATORS

#: Opsets a case is drawn at: the issue's 17 to 21 most often, older and newer ones too.
OPSETS = (13, 15, 16, 17, 17, 18, 18, 19, 19, 20, 20, 21, 21, 21, 22, 23, 24, 25, 26, 27, 28)

#: Ops both runtimes have that the fuzzer leaves out, and why.
NOT_FUZZED = {
    "RandomNormal": "random output: no two runtimes draw the same numbers",
    "RandomNormalLike": "random output",
    "RandomUniform": "random output",
    "RandomUniformLike": "random output",
    "Multinomial": "random output",
    "Bernoulli": "random output",
    "Scatter": "deprecated at opset 11; cases start at opset 13",
    "Upsample": "deprecated at opset 10; cases start at opset 13 (Resize covers it)",
}

#: The dtypes an EP other than cpu computes in: drawn most of the time for its cases.
EP_DTYPES = {"mlx": (F32, F16)}

#: How often a fragment onnxruntime refuses is kept as the case's last node.
KEEP_REFUSED = 0.15


@functools.cache
def ort_ops() -> frozenset[str]:
    """Every ai.onnx op onnxruntime's CPU provider runs: those it has a kernel for, and
    those with an ONNX function body, which it inlines (HardSwish, GroupNormalization ...)."""
    from onnxruntime.capi import _pybind_state as C

    kernels = {
        d.op_name
        for d in C.get_all_opkernel_def()
        if d.provider == "CPUExecutionProvider" and d.domain in ("", "ai.onnx")
    }
    functions = {
        s.name
        for s in onnx.defs.get_all_schemas()
        if s.domain in ("", "ai.onnx")
        # onnx's stub leaves out these two properties of OpSchema
        and (s.has_function or s.has_context_dependent_function)  # type: ignore[attr-defined]
    }
    return frozenset(kernels | functions)


@functools.cache
def ep_ops(ep: str) -> tuple[frozenset[str], dict[str, tuple[int, ...]]]:
    """The ai.onnx ops ``ep`` registers kernels for, and the inputs each needs constant.

    An EP with no kernel table (one that claims through ONNX Runtime, as
    legacy_abi does) is taken to run every op onnxruntime does.
    """
    from nxrt.host import Host, get_plugin_manager

    descriptor = Host(get_plugin_manager()).build_registry().resolve(ep)
    if descriptor is None:
        raise ValueError(f"no EP named {ep!r} is installed")
    if descriptor.ops is None:
        return ort_ops(), {}
    ops = frozenset(o for d, o in descriptor.ops.op_types if d == "")
    consts = {}
    for op in ops:
        entry = descriptor.ops.lookup("", op, 26)
        consts[op] = tuple(entry.const_inputs) if entry is not None else ()
    return ops, consts


def fuzzed_ops(ep: str = "cpu") -> list[str]:
    """The ops the fuzzer draws for ``ep``: it and onnxruntime both run them, and a generator
    exists (each op left out is in :data:`NOT_FUZZED` with its reason)."""
    ops, _ = ep_ops(ep)
    return sorted(op for op in ops & ort_ops() if op in GENERATORS and op not in NOT_FUZZED)


def generate_case(seed: int, index: int, ep: str = "cpu", ops: Sequence[str] | None = None) -> Case:
    """The case ``(seed, index)``: a random graph over ``ops`` (default: :func:`fuzzed_ops`)."""
    rng = np.random.default_rng([seed, index])
    opset = int(rng.choice(OPSETS))
    _, consts = ep_ops(ep)
    builder = Builder(rng, opset, lambda op: consts.get(op, ()), EP_DTYPES.get(ep, ()))
    pool = [op for op in (ops or fuzzed_ops(ep)) if schema(op, opset) is not None]
    wanted = int(rng.integers(1, 9))
    refused = ""
    for _ in range(wanted * 6):
        if len(builder.nodes) >= wanted:
            break
        op = str(rng.choice(pool))
        try:
            made = GENERATORS[op](builder)
        except Skip:
            continue
        nodes = made if isinstance(made, list) else [made]
        fragment_out = [o for o in nodes[-1].output if o]
        result = run_ort(nodes, builder, fragment_out)
        if isinstance(result, str):
            if builder.nodes and rng.random() > KEEP_REFUSED:
                continue
            if not builder.nodes and rng.random() > 2 * KEEP_REFUSED:
                continue
            builder.nodes += nodes
            refused = result
            break
        if any(isinstance(r, np.ndarray) and r.size > MAX_ELEMENTS for r in result):
            continue
        builder.nodes += nodes
        for name, value in zip(fragment_out, result):
            if isinstance(value, np.ndarray):
                builder.values[name] = value
    if not builder.nodes:
        raise Skip(f"case {seed}/{index}: no node could be built")
    return finish(
        builder, note=f"seed {seed} index {index}" + (f"; ort: {refused[:200]}" if refused else "")
    )


def finish(builder: Builder, note: str = "") -> Case:
    """The case of a builder's nodes: unused inputs dropped, dangling values as outputs."""
    used = {i for n in builder.nodes for i in _all_inputs(n)}
    inputs = {k: v for k, v in builder.inputs.items() if k in used}
    consts = {k: v for k, v in builder.consts.items() if k in used}
    outputs = [o for n in builder.nodes for o in n.output if o and o not in used]
    model = make_model(builder.nodes, inputs, consts, outputs, builder.opset)
    return Case(model, inputs, note=note)


def case_values(case: Case) -> dict[str, np.ndarray]:
    """Every initializer of a case by name (for cutting a graph apart)."""
    return {t.name: onnx.numpy_helper.to_array(t) for t in case.model.graph.initializer}

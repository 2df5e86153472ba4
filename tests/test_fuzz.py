"""Property-based fuzzing: random graphs agree with onnxruntime; mutated models fail typed.

Bounded for CI (``NXRT_FUZZ_EXAMPLES`` raises the count on demand). Every
outcome is one of: nxrt and onnxruntime agree; both refuse the model; or
nxrt refuses it with a typed nxrt error. A crash, a hang or a foreign
exception fails the test. Each test counts and prints its own outcomes, so
any one of them can run alone.
"""

from __future__ import annotations

import os
from collections import Counter

import numpy as np
import onnxruntime as ort
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import nxrt
from nxrt.errors import NxrtError
from nxrt.testing import light_model_path

EXAMPLES = int(os.environ.get("NXRT_FUZZ_EXAMPLES", "60"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

UNARY = ["Relu", "Neg", "Abs", "Exp", "Tanh", "Sigmoid", "Softsign", "Floor", "Sqrt", "Identity"]
BINARY = ["Add", "Sub", "Mul", "Div", "Max", "Min", "Pow"]
REDUCE = ["ReduceSum", "ReduceMean", "ReduceMax"]
SHAPE = (2, 3, 4)


@st.composite
def graphs(draw):
    """A random DAG over float32 [2,3,4] values from a small grammar of ops."""
    values = ["x", "y"]
    nodes = []
    for i in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["unary", "binary", "reduce", "softmax", "transpose"]))
        out = f"v{i}"
        if kind == "unary":
            nodes.append(
                helper.make_node(
                    draw(st.sampled_from(UNARY)), [draw(st.sampled_from(values))], [out]
                )
            )
        elif kind == "binary":
            a, b = draw(st.sampled_from(values)), draw(st.sampled_from(values))
            nodes.append(helper.make_node(draw(st.sampled_from(BINARY)), [a, b], [out]))
        elif kind == "reduce":
            op = draw(st.sampled_from(REDUCE))
            src = draw(st.sampled_from(values))
            nodes.append(
                helper.make_node(op, [src], [out], keepdims=1, axes=[draw(st.integers(-3, 2))])
            )
        elif kind == "softmax":
            axis = draw(st.integers(-3, 2))
            nodes.append(
                helper.make_node("Softmax", [draw(st.sampled_from(values))], [out], axis=axis)
            )
        else:
            perm = draw(st.permutations([0, 1, 2]))
            nodes.append(
                helper.make_node("Transpose", [draw(st.sampled_from(values))], [out], perm=perm)
            )
        values.append(out)
    outputs = [helper.make_tensor_value_info(values[-1], TensorProto.FLOAT, None)]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(SHAPE)) for n in ("x", "y")]
    graph = helper.make_graph(nodes, "fuzz", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def feeds(seed):
    rng = np.random.default_rng(seed)
    return {n: rng.uniform(0.1, 2.0, SHAPE).astype(np.float32) for n in ("x", "y")}


def report(title: str, outcomes: Counter[str], capsys) -> None:
    """Print a test's outcome counts, and check that every example was counted."""
    with capsys.disabled():
        print(f"\nfuzz outcomes, {title}: {dict(sorted(outcomes.items()))}")
    assert sum(outcomes.values()) >= EXAMPLES


def test_random_graphs_agree_with_onnxruntime(capsys):
    outcomes: Counter[str] = Counter()
    random_graph_agrees(outcomes=outcomes)
    report("random graphs", outcomes, capsys)


@FUZZ
@given(model=graphs(), seed=st.integers(0, 2**16))
def random_graph_agrees(model, seed, outcomes):
    data = model.SerializeToString()
    try:
        expected = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(
            None, feeds(seed)
        )
    except Exception:  # noqa: BLE001 - onnxruntime refuses it: nxrt must refuse typed or run
        expected = None
    try:
        got = nxrt.InferenceSession(data, providers=["cpu"]).run(None, feeds(seed))
    except NxrtError:
        assert expected is None, "nxrt refused a model onnxruntime runs"
        outcomes["both refused"] += 1
        return
    outcomes["agreed" if expected is not None else "only nxrt ran"] += 1
    if expected is not None:
        for a, b in zip(got, expected):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, equal_nan=True)


SQUEEZENET = open(light_model_path("squeezenet"), "rb").read()


def test_mutated_model_bytes_give_typed_errors(capsys):
    outcomes: Counter[str] = Counter()
    mutated_bytes_fail_typed(outcomes=outcomes)
    report("mutated bytes", outcomes, capsys)


@FUZZ
@given(
    edits=st.lists(
        st.tuples(st.integers(0, len(SQUEEZENET) - 1), st.integers(0, 255)), min_size=1, max_size=8
    ),
    cut=st.integers(1, len(SQUEEZENET)),
)
def mutated_bytes_fail_typed(edits, cut, outcomes):
    data = bytearray(SQUEEZENET[:cut])
    for position, byte in edits:
        if position < len(data):
            data[position] = byte
    try:
        session = nxrt.InferenceSession(bytes(data), providers=["cpu"])
        shapes = {
            a.name: [d if isinstance(d, int) else 1 for d in a.shape] for a in session.get_inputs()
        }
        if any(np.prod(shape) > 2_000_000 for shape in shapes.values()):
            outcomes["created, inputs too large to feed"] += 1
            return
        session.run(None, {name: np.zeros(shape, np.float32) for name, shape in shapes.items()})
        outcomes["ran"] += 1
    except NxrtError as exc:
        outcomes[type(exc).__name__] += 1

"""The compiled float32 loop of RNN, GRU and LSTM against the numpy reference and ONNX Runtime.

The reference is the same op function without a compiled recurrence; the
ONNX Runtime cases run one-node models through ``nxrt.InferenceSession``
(whose kernels carry the compiled loop) and through ORT's CPU provider.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import nxrt
from nxrt.host_parallel import HostParallel

pytest.importorskip("numba")

from nxrt_ep_cpu.ops import rnn as ops  # noqa: E402

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
FUNCTIONS = {"RNN": ops.rnn, "GRU": ops.gru, "LSTM": ops.lstm}
INPUT_NAMES = ("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P")


def make_inputs(
    kind: str,
    steps: int,
    batch: int,
    inputs: int,
    hidden: int,
    *,
    directions: int = 1,
    lens: list[int] | None = None,
    initial: bool = False,
    peepholes: bool = False,
    layout: int = 0,
    dtype: Any = np.float32,
    seed: int = 0,
) -> list[np.ndarray | None]:
    """The op's inputs in order (``None`` for an absent optional one), weights scaled so
    the state neither saturates nor vanishes."""
    rng = np.random.default_rng(seed)
    rows = GATES[kind] * hidden

    def normal(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(dtype)

    x_shape = (batch, steps, inputs) if layout else (steps, batch, inputs)
    state = (batch, directions, hidden) if layout else (directions, batch, hidden)
    values: list[np.ndarray | None] = [
        normal(*x_shape),
        normal(directions, rows, inputs, scale=1 / np.sqrt(max(inputs, 1))),
        normal(directions, rows, hidden, scale=1 / np.sqrt(hidden)),
        normal(directions, 2 * rows, scale=0.3),
        None if lens is None else np.array(lens, np.int32),
        normal(*state) if initial else None,
    ]
    if kind == "LSTM":
        values.append(normal(*state) if initial else None)
        values.append(normal(directions, 3 * hidden, scale=0.5) if peepholes else None)
    return values


def compiled(parallel: HostParallel | None = None) -> ops.CompiledRecurrence:
    return ops.CompiledRecurrence(parallel, constant_weights=False)


def assert_same(got, want, *, rtol: float = 1e-5, atol: float = 2e-5) -> None:
    assert len(got) == len(want)
    for index, (a, b) in enumerate(zip(got, want, strict=True)):
        assert a.dtype == b.dtype, f"output {index}: dtype {a.dtype}, expected {b.dtype}"
        assert a.shape == b.shape, f"output {index}: shape {a.shape}, expected {b.shape}"
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=f"output {index}")


@pytest.fixture(params=["loop", "blas"])
def product(request, monkeypatch):
    """Each case with the hidden product in the compiled loop and through BLAS."""
    from nxrt_ep_cpu.jit import rnn as jit_rnn

    if request.param == "blas" and ops._cblas_sgemm()[0] == 0:
        pytest.skip("numpy's BLAS is not reachable")
    monkeypatch.setattr(jit_rnn, "use_blas", lambda rows, width: request.param == "blas")
    return request.param


def check_reference(kind: str, values, parallel: HostParallel | None = None, **attrs) -> None:
    """The compiled loop gives the reference's outputs (and does run: float32 inputs)."""
    fn = FUNCTIONS[kind]
    recurrence = compiled(parallel)
    got = fn(*values, _recurrence=recurrence, **attrs)
    want = fn(*values, **attrs)
    assert_same(got, want)


#: (op, attributes, peepholes): every gate variant the compiled loop has.
VARIANTS = [
    ("RNN", {}, False),
    ("GRU", {"linear_before_reset": 0}, False),
    ("GRU", {"linear_before_reset": 1}, False),
    ("LSTM", {}, False),
    ("LSTM", {}, True),
    ("LSTM", {"input_forget": 1}, True),
    ("LSTM", {"clip": 0.7}, True),
    ("GRU", {"clip": 0.5, "linear_before_reset": 1}, False),
    ("RNN", {"clip": 0.4}, False),
]
VARIANT_IDS = [
    f"{k}-{'-'.join(f'{a}{v}' for a, v in at.items())}{'-P' if p else ''}" for k, at, p in VARIANTS
]
DIRECTIONS = ["forward", "reverse", "bidirectional"]
#: (steps, batch, inputs, hidden): one step, one row, odd sizes, a hidden size below the
#: product's four-row unrolling, and one with several column blocks and row pairs.
SHAPES = [(1, 1, 3, 5), (6, 3, 5, 3), (9, 5, 7, 17), (4, 6, 16, 160)]


@pytest.mark.parametrize(("kind", "attrs", "peepholes"), VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_compiled_loop_matches_the_numpy_reference(
    kind, attrs, peepholes, direction, shape, product
):
    steps, batch, inputs, hidden = shape
    directions = 2 if direction == "bidirectional" else 1
    values = make_inputs(
        kind, steps, batch, inputs, hidden, directions=directions, initial=True, peepholes=peepholes
    )
    check_reference(kind, values, direction=direction, hidden_size=hidden, **attrs)


@pytest.mark.parametrize(("kind", "attrs", "peepholes"), VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_sequence_lens_mixed_lengths_including_zero(kind, attrs, peepholes, direction, product):
    directions = 2 if direction == "bidirectional" else 1
    lens = [7, 0, 3, 1, 7]
    values = make_inputs(
        kind, 7, 5, 4, 6, directions=directions, lens=lens, initial=True, peepholes=peepholes
    )
    check_reference(kind, values, direction=direction, **attrs)
    y = FUNCTIONS[kind](*values, direction=direction, _recurrence=compiled(), **attrs)[0]
    for b, n in enumerate(lens):
        assert not np.any(y[n:, :, b]), "Y is zero past each entry's length"


@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_layout_1_with_initial_states(kind, direction, product):
    directions = 2 if direction == "bidirectional" else 1
    values = make_inputs(
        kind, 5, 3, 4, 7, directions=directions, lens=[5, 2, 4], initial=True, layout=1
    )
    check_reference(kind, values, direction=direction, layout=1)


@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("shape", [(0, 3, 4, 5), (4, 0, 4, 5), (3, 2, 0, 5)], ids=str)
def test_empty_steps_batch_or_input(kind, shape):
    values = make_inputs(kind, *shape, initial=True)
    check_reference(kind, values)


@pytest.mark.parametrize(
    ("kind", "direction", "activations", "alpha", "beta"),
    [
        ("RNN", "forward", ["Relu"], None, None),
        ("RNN", "forward", ["Affine"], [0.7], [0.2]),
        ("RNN", "reverse", ["LeakyRelu"], [0.1], None),
        ("RNN", "forward", ["ThresholdedRelu"], [0.3], None),
        ("RNN", "forward", ["ScaledTanh"], [1.2], [0.8]),
        ("RNN", "forward", ["HardSigmoid"], [0.3], [0.4]),
        ("RNN", "forward", ["Elu"], [0.9], None),
        ("RNN", "bidirectional", ["Softsign", "Relu"], None, None),
        ("GRU", "forward", ["HardSigmoid", "Softsign"], None, None),
        ("LSTM", "forward", ["HardSigmoid", "ScaledTanh", "Elu"], [0.25, 1.1, 0.5], [0.5, 0.9]),
        (
            "LSTM",
            "bidirectional",
            ["Sigmoid", "Tanh", "Tanh", "HardSigmoid", "Relu", "Softsign"],
            None,
            None,
        ),
    ],
)
def test_other_activations(kind, direction, activations, alpha, beta):
    directions = 2 if direction == "bidirectional" else 1
    values = make_inputs(kind, 6, 3, 4, 9, directions=directions, initial=True)
    check_reference(
        kind,
        values,
        direction=direction,
        activations=activations,
        activation_alpha=alpha,
        activation_beta=beta,
    )


@pytest.mark.filterwarnings("ignore:invalid value encountered in matmul")
def test_nan_and_inf_propagate_as_in_numpy(product):
    for kind in GATES:
        values = make_inputs(kind, 5, 4, 3, 6, initial=True, peepholes=True)
        values[0][1, 0, 0] = np.nan
        values[0][2, 2, 1] = np.inf
        values[0][3, 3, 2] = -np.inf
        check_reference(kind, values)
        check_reference(kind, values, clip=0.9)


def test_float16_runs_compiled_in_float32_and_float64_stays_numpy():
    values = make_inputs("GRU", 5, 3, 4, 6, initial=True, dtype=np.float16)
    check_reference("GRU", values)
    values = make_inputs("LSTM", 5, 3, 4, 6, initial=True, peepholes=True, dtype=np.float64)
    recurrence = compiled()
    assert not recurrence.supports(values[0], values[2], (), None)
    got = ops.lstm(*values, _recurrence=recurrence)
    assert_same(got, ops.lstm(*values))
    assert got[0].dtype == np.float64


def test_softplus_and_non_positive_clip_keep_the_numpy_loop():
    values = make_inputs("RNN", 4, 2, 3, 5)
    check_reference("RNN", values, activations=["Softplus"])
    check_reference("RNN", values, clip=0.0)


@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_chunks_on_the_pool_match_one_thread(kind, direction, product):
    directions = 2 if direction == "bidirectional" else 1
    # 30 x 9 x 128 x 4*128 multiply-adds per direction: above the split threshold
    values = make_inputs(
        kind,
        30,
        9,
        8,
        128,
        directions=directions,
        lens=[30, 2, 29, 0, 30, 17, 30, 1, 30],
        initial=True,
        peepholes=True,
    )
    recurrence = compiled(HostParallel(2))
    work = 30 * 9 * 128 * GATES[kind] * 128
    assert kind == "RNN" or recurrence._row_chunks(work, 9, directions) is not None
    fn = FUNCTIONS[kind]
    got = fn(*values, direction=direction, _recurrence=recurrence)
    assert_same(got, fn(*values, direction=direction))
    assert_same(got, fn(*values, direction=direction, _recurrence=compiled()))


def test_row_chunks_are_whole_pairs_and_cover_the_batch():
    recurrence = compiled(HostParallel(2))
    assert recurrence._row_chunks(10, 16, 1) is None  # too little work
    assert recurrence._row_chunks(10**9, 1, 1) is None  # one row: one part
    assert recurrence._row_chunks(10**9, 16, 1) == [range(0, 8), range(8, 16)]
    assert recurrence._row_chunks(10**9, 7, 1) == [range(0, 4), range(4, 7)]
    assert recurrence._row_chunks(10**9, 7, 2) == [range(0, 7)]  # one part per direction
    assert compiled(None)._row_chunks(10**9, 16, 1) is None


def test_constant_weights_are_prepared_once_and_fed_weights_every_run():
    values = make_inputs("GRU", 4, 2, 3, 5)
    weights = (values[1], values[2], values[3], None)
    constant = ops.CompiledRecurrence(None, constant_weights=True)
    first = constant._weights("GRU", *weights)
    assert constant._weights("GRU", *weights) is first
    other = make_inputs("GRU", 4, 2, 3, 5, seed=1)[2]
    assert constant._weights("GRU", values[1], other, values[3], None) is not first
    fed = compiled()
    assert fed._weights("GRU", *weights) is not fed._weights("GRU", *weights)


# --- against ONNX Runtime, through sessions ----------------------------------------------


def one_node_model(
    kind: str,
    values,
    *,
    constants: tuple[str, ...] = ("W", "R", "B", "P"),
    opset: int = 22,
    **attrs,
) -> tuple[bytes, dict[str, np.ndarray]]:
    """A one-node model: ``constants`` as initializers, the other inputs fed."""
    names = [n if v is not None else "" for n, v in zip(INPUT_NAMES, values, strict=False)]
    while names and names[-1] == "":
        names.pop()
    outputs = ["Y", "Y_h"] + (["Y_c"] if kind == "LSTM" else [])
    node = helper.make_node(kind, names, outputs, **attrs)
    graph_inputs, initializers, feeds = [], [], {}
    for name, value in zip(INPUT_NAMES, values, strict=False):
        if value is None:
            continue
        if name in constants:
            initializers.append(numpy_helper.from_array(value, name))
        else:
            elem = helper.np_dtype_to_tensor_dtype(value.dtype)
            graph_inputs.append(helper.make_tensor_value_info(name, elem, value.shape))
            feeds[name] = value
    elem = helper.np_dtype_to_tensor_dtype(values[0].dtype)
    ranks = {"Y": 4, "Y_h": 3, "Y_c": 3}
    graph_outputs = [helper.make_tensor_value_info(n, elem, [None] * ranks[n]) for n in outputs]
    graph = helper.make_graph([node], "rnn", graph_inputs, graph_outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model.SerializeToString(), feeds


def run_nxrt(model: bytes, feeds: list[dict[str, np.ndarray]]) -> list:
    """nxrt's outputs for each of ``feeds``, from one session with two threads."""
    options = nxrt.SessionOptions()
    options.intra_op_num_threads = 2
    session = nxrt.InferenceSession(model, options, providers=["cpu"])
    return [session.run(None, f) for f in feeds]


def run_ort(model: bytes, feeds: list[dict[str, np.ndarray]]) -> list:
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    return [session.run(None, f) for f in feeds]


def to_layout_0(values: list[np.ndarray | None]) -> list[np.ndarray | None]:
    """Batch-first inputs as sequence-first ones (ORT runs only layout 0)."""
    moved = list(values)
    moved[0] = np.ascontiguousarray(values[0].swapaxes(0, 1))
    for index in (5, 6):
        if index < len(values) and values[index] is not None:
            moved[index] = np.ascontiguousarray(values[index].swapaxes(0, 1))
    return moved


ORT_CASES = [
    # (op, attributes, peepholes, (steps, batch, inputs, hidden), lens, initial, layout)
    ("RNN", {}, False, (8, 1, 5, 16), None, False, 0),
    ("RNN", {}, False, (8, 3, 5, 16), [8, 3, 1], True, 1),
    ("GRU", {"linear_before_reset": 0}, False, (10, 4, 6, 20), [10, 1, 7, 10], True, 0),
    ("GRU", {"linear_before_reset": 1}, False, (10, 4, 6, 20), None, True, 1),
    ("GRU", {"linear_before_reset": 1}, False, (1, 2, 3, 8), None, False, 0),
    ("LSTM", {}, False, (10, 4, 6, 20), [2, 10, 9, 5], True, 0),
    ("LSTM", {}, True, (10, 3, 6, 20), None, True, 1),
    ("LSTM", {"input_forget": 1}, True, (6, 2, 4, 12), [6, 3], True, 0),
    ("LSTM", {"clip": 0.6}, True, (6, 2, 4, 12), None, True, 0),
    ("GRU", {"clip": 0.6}, False, (6, 2, 4, 12), None, True, 0),
    # large enough for the rows to be split across the two threads
    (
        "GRU",
        {"linear_before_reset": 1},
        False,
        (30, 8, 16, 128),
        [30, 29, 1, 30, 30, 5, 30, 30],
        True,
        0,
    ),
    ("LSTM", {}, True, (30, 8, 16, 128), None, True, 0),
]


@pytest.mark.parametrize(
    ("kind", "attrs", "peepholes", "shape", "lens", "initial", "layout"), ORT_CASES
)
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_matches_onnx_runtime(kind, attrs, peepholes, shape, lens, initial, layout, direction):
    steps, batch, inputs, hidden = shape
    directions = 2 if direction == "bidirectional" else 1
    values = make_inputs(
        kind,
        steps,
        batch,
        inputs,
        hidden,
        directions=directions,
        lens=lens,
        initial=initial,
        peepholes=peepholes,
        layout=layout,
    )
    model, feeds = one_node_model(
        kind, values, direction=direction, hidden_size=hidden, layout=layout, **attrs
    )
    (got,) = run_nxrt(model, [feeds])
    if not layout:
        (want,) = run_ort(model, [feeds])
    else:  # ORT has no layout 1: it runs the same inputs moved to layout 0
        ort_model, ort_feeds = one_node_model(
            kind, to_layout_0(values), direction=direction, hidden_size=hidden, **attrs
        )
        (want,) = run_ort(ort_model, [ort_feeds])
        want = [want[0].transpose(2, 0, 1, 3)] + [state.swapaxes(0, 1) for state in want[1:]]
    assert_same(got, want, rtol=1e-4, atol=3e-5)


@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
def test_weights_fed_as_inputs_change_between_runs(kind):
    feeds = []
    for seed in (1, 2):
        values = make_inputs(kind, 5, 3, 4, 8, initial=True, seed=seed)
        model, fed = one_node_model(kind, values, constants=(), hidden_size=8)
        feeds.append(fed)
    got, want = run_nxrt(model, feeds), run_ort(model, feeds)
    for a, b in zip(got, want, strict=True):
        assert_same(a, b, rtol=1e-4, atol=3e-5)


@pytest.mark.parametrize(
    ("kind", "activations", "alpha", "beta"),
    [
        ("RNN", ["Relu"], None, None),
        ("RNN", ["ScaledTanh"], [1.2], [0.8]),
        ("GRU", ["HardSigmoid", "Softsign"], [0.3], [0.45]),
        ("LSTM", ["HardSigmoid", "Elu", "LeakyRelu"], [0.25, 0.5, 0.1], [0.5]),
    ],
)
def test_other_activations_match_onnx_runtime(kind, activations, alpha, beta):
    values = make_inputs(kind, 6, 3, 4, 9, initial=True)
    attrs: dict[str, Any] = {"activations": activations}
    if alpha:
        attrs["activation_alpha"] = alpha
    if beta:
        attrs["activation_beta"] = beta
    model, feeds = one_node_model(kind, values, hidden_size=9, **attrs)
    (got,), (want,) = run_nxrt(model, [feeds]), run_ort(model, [feeds])
    assert_same(got, want, rtol=1e-4, atol=3e-5)


def test_sessions_run_the_compiled_loop(monkeypatch):
    calls = []
    run = ops.CompiledRecurrence.run

    def counted(self, *args, **kwargs):
        calls.append(args[0])
        return run(self, *args, **kwargs)

    monkeypatch.setattr(ops.CompiledRecurrence, "run", counted)
    for kind in GATES:
        values = make_inputs(kind, 3, 2, 4, 5)
        model, feeds = one_node_model(kind, values, hidden_size=5)
        run_nxrt(model, [feeds])
    # (a kernel compiled at creation also runs once on stand-in inputs, compiling its loop)
    assert list(dict.fromkeys(calls)) == ["RNN", "GRU", "LSTM"]

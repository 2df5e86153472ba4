"""One output per input: a session gives the same bits on every run, from concurrent callers
and whichever thread count a run takes (``HostParallel.run_limits`` switches between the
session's threads and one; every 16th run tries the other count).

The models: the light models (real architectures), and small ones at the shapes users meet
(a single row, odd batches, short sequences, small maps) built here, on the cpu EP alone and
beside each other EP that is installed.
"""

from __future__ import annotations

import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import nxrt
from nxrt.tools.light_models import LIGHT_MODELS, dummy_feeds, light_model_path

SEQUENTIAL_RUNS = 50
CALLERS = 8
#: The light models whose runs take a second or more here: fewer runs, still two counts.
HEAVY = {"vgg19": 20, "zfnet512": 20, "bvlc_alexnet": 20}


def _session(model: onnx.ModelProto | str, providers: list[str], threads: int = 2):
    options = nxrt.SessionOptions()
    options.intra_op_num_threads = threads
    source = model if isinstance(model, str) else model.SerializeToString()
    session = nxrt.InferenceSession(source, options, providers=providers)
    # the cpu EP's kernels compile in the background on a cold cache; the outputs are
    # bit-identical only once every node runs its compiled kernel
    assert session.wait_for_compiled()
    return session


def _digest(outputs: list[np.ndarray]) -> tuple[bytes, ...]:
    return tuple(np.ascontiguousarray(o).tobytes() for o in outputs)


def distinct_outputs(session, feeds: dict[str, np.ndarray], runs: int) -> set[tuple[bytes, ...]]:
    """Every distinct output of ``runs`` sequential runs and of ``CALLERS`` threads that run
    the session at once (about ``runs`` runs in all)."""
    seen = {_digest(session.run(None, feeds)) for _ in range(runs)}
    barrier = threading.Barrier(CALLERS)
    errors: list[BaseException] = []

    def call() -> None:
        try:
            barrier.wait()
            for _ in range(max(2, runs // CALLERS)):
                seen.add(_digest(session.run(None, feeds)))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    callers = [threading.Thread(target=call) for _ in range(CALLERS)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join()
    assert not errors, errors
    return seen


# -- small models at users' shapes -------------------------------------------------------------

RNG = np.random.default_rng(11)


def _weight(weights: list, name: str, *shape: int, scale: float = 0.05) -> str:
    data = (RNG.standard_normal(shape) * scale).astype(np.float32)
    weights.append(numpy_helper.from_array(data, name))
    return name


def _model(nodes, inputs, outputs, weights, opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def mlp(sizes=(784, 512, 256, 10)) -> onnx.ModelProto:
    weights: list = []
    nodes, x = [], "x"
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        nodes.append(
            helper.make_node(
                "Gemm",
                [x, _weight(weights, f"w{i}", a, b), _weight(weights, f"b{i}", b)],
                [f"g{i}"],
            )
        )
        x = f"g{i}"
        if i < len(sizes) - 2:
            nodes.append(helper.make_node("Relu", [x], [f"r{i}"]))
            x = f"r{i}"
    nodes.append(helper.make_node("Softmax", [x], ["y"], axis=-1))
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", sizes[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        weights,
    )  # fmt: skip


def cnn() -> onnx.ModelProto:
    """Conv + BatchNorm + Relu blocks (3x3, depthwise, 1x1), pooling and a dense head, on
    28x28 maps."""
    w: list = []
    n = helper.make_node

    def bn(name: str, channels: int) -> list[str]:
        scale = numpy_helper.from_array((1 + RNG.random(channels)).astype(np.float32), name + "s")
        mean = numpy_helper.from_array(RNG.standard_normal(channels).astype(np.float32), name + "m")
        var = numpy_helper.from_array((0.5 + RNG.random(channels)).astype(np.float32), name + "v")
        w.extend([scale, mean, var])
        return [name + "s", _weight(w, name + "b", channels), name + "m", name + "v"]

    nodes = [
        n("Conv", ["x", _weight(w, "c1", 16, 1, 3, 3, scale=0.3)], ["c1o"], pads=[1, 1, 1, 1]),
        n("BatchNormalization", ["c1o", *bn("bn1", 16)], ["b1"]),
        n("Relu", ["b1"], ["r1"]),
        n("Conv", ["r1", _weight(w, "dw", 16, 1, 3, 3, scale=0.3)], ["dwo"], group=16,
          pads=[1, 1, 1, 1], strides=[2, 2]),
        n("Relu", ["dwo"], ["r2"]),
        n("Conv", ["r2", _weight(w, "pw", 48, 16, 1, 1, scale=0.2)], ["pwo"]),
        n("BatchNormalization", ["pwo", *bn("bn2", 48)], ["b2"]),
        n("Relu", ["b2"], ["r3"]),
        n("Conv", ["r3", _weight(w, "c3", 64, 48, 3, 3, scale=0.05)], ["c3o"], pads=[1, 1, 1, 1]),
        n("Relu", ["c3o"], ["r4"]),
        n("MaxPool", ["r4"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        n("GlobalAveragePool", ["p"], ["gap"]),
        n("Flatten", ["gap"], ["flat"]),
        n("Gemm", ["flat", _weight(w, "fc", 64, 10), _weight(w, "fcb", 10)], ["y"]),
    ]  # fmt: skip
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, 28, 28])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        w,
    )


def attention(hidden: int = 128, heads: int = 4, ffn: int = 512) -> onnx.ModelProto:
    """A pre-norm encoder block with dynamic batch and sequence: batched MatMuls, Softmax,
    LayerNormalization and an erf GELU."""
    w: list = []
    head = hidden // heads
    n = helper.make_node
    w.append(numpy_helper.from_array(np.array([0, 0, heads, head], np.int64), "split"))
    w.append(numpy_helper.from_array(np.array([0, 0, hidden], np.int64), "merge"))
    w.append(numpy_helper.from_array(np.array(1 / np.sqrt(head), np.float32), "scale"))
    w.append(numpy_helper.from_array(np.array(np.sqrt(2), np.float32), "sqrt2"))
    w.append(numpy_helper.from_array(np.array(1, np.float32), "one"))
    nodes = [n("LayerNormalization", ["x", _weight(w, "g1", hidden, scale=1.0),
                                      _weight(w, "b1", hidden)], ["ln"], axis=-1)]  # fmt: skip
    for part in "qkv":
        nodes += [
            n("MatMul", ["ln", _weight(w, "w" + part, hidden, hidden)], [part + "m"]),
            n("Add", [part + "m", _weight(w, "b" + part, hidden)], [part + "a"]),
            n("Reshape", [part + "a", "split"], [part + "h"]),
        ]
    nodes += [
        n("Transpose", ["qh"], ["qt"], perm=[0, 2, 1, 3]),
        n("Transpose", ["kh"], ["kt"], perm=[0, 2, 3, 1]),
        n("Transpose", ["vh"], ["vt"], perm=[0, 2, 1, 3]),
        n("MatMul", ["qt", "kt"], ["s0"]),
        n("Mul", ["s0", "scale"], ["s"]),
        n("Softmax", ["s"], ["p"], axis=-1),
        n("MatMul", ["p", "vt"], ["ct"]),
        n("Transpose", ["ct"], ["ch"], perm=[0, 2, 1, 3]),
        n("Reshape", ["ch", "merge"], ["c"]),
        n("MatMul", ["c", _weight(w, "wo", hidden, hidden)], ["om"]),
        n("Add", ["x", "om"], ["h"]),
        n("LayerNormalization", ["h", _weight(w, "g2", hidden, scale=1.0),
                                 _weight(w, "b2", hidden)], ["ln2"], axis=-1),
        n("MatMul", ["ln2", _weight(w, "w1", hidden, ffn)], ["f1"]),
        n("Div", ["f1", "sqrt2"], ["f1s"]),
        n("Erf", ["f1s"], ["f1e"]),
        n("Add", ["f1e", "one"], ["f1p"]),
        n("Mul", ["f1", "f1p"], ["gelu"]),
        n("MatMul", ["gelu", _weight(w, "w2", ffn, hidden)], ["f2"]),
        n("Add", ["h", "f2"], ["y"]),
    ]  # fmt: skip
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", hidden])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        w,
    )


def gru(inputs: int = 64, hidden: int = 128) -> onnx.ModelProto:
    w: list = []
    node = helper.make_node(
        "GRU",
        ["x", _weight(w, "W", 1, 3 * hidden, inputs), _weight(w, "R", 1, 3 * hidden, hidden),
         _weight(w, "B", 1, 6 * hidden)],
        ["y", "yh"],
        hidden_size=hidden,
    )  # fmt: skip
    return _model(
        [node],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", "N", inputs])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("yh", TensorProto.FLOAT, None)],
        w,
    )  # fmt: skip


def _normal(*shape: int) -> np.ndarray:
    return np.random.default_rng(3).standard_normal(shape).astype(np.float32)


SMALL = {
    "mlp_row": (mlp, lambda: {"x": _normal(1, 784)}),
    "mlp_batch7": (mlp, lambda: {"x": _normal(7, 784)}),
    "cnn_batch1": (cnn, lambda: {"x": _normal(1, 1, 28, 28)}),
    "cnn_batch7": (cnn, lambda: {"x": _normal(7, 1, 28, 28)}),
    "attention_b2_s48": (attention, lambda: {"x": _normal(2, 48, 128)}),
    "attention_b1_s7": (attention, lambda: {"x": _normal(1, 7, 128)}),
    "gru_t32_b3": (gru, lambda: {"x": _normal(32, 3, 64)}),
}


@pytest.mark.parametrize("name", sorted(SMALL))
def test_small_models_give_one_output(name):
    build, feeds = SMALL[name]
    session = _session(build(), ["cpu"])
    assert len(distinct_outputs(session, feeds(), SEQUENTIAL_RUNS)) == 1


@pytest.mark.parametrize("threads", [1, 2])
def test_one_output_whatever_the_session_thread_count_on_one_row(threads):
    """A session of one thread gives the same bits run after run too (its GEMMs are whole
    BLAS calls on one thread)."""
    session = _session(mlp(), ["cpu"], threads)
    assert len(distinct_outputs(session, {"x": _normal(1, 784)}, 20)) == 1


@pytest.mark.slow
@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_models_give_one_output(name):
    session = _session(light_model_path(name), ["cpu"])
    runs = HEAVY.get(name, SEQUENTIAL_RUNS)
    assert len(distinct_outputs(session, dummy_feeds(session), runs)) == 1


@pytest.mark.parametrize("ep", ["legacy_abi", "openvino", "mlx"])
@pytest.mark.parametrize("name", ["mlp_row", "cnn_batch7", "attention_b2_s48"])
def test_every_shipped_ep_gives_one_output(ep, name):
    """Each other EP beside the cpu EP (their backends are deterministic on these models:
    ONNX Runtime's and OpenVINO's CPU kernels split over outputs, MLX's CPU kernels run on
    one BLAS held at one thread while the session lives)."""
    build, feeds = SMALL[name]
    session = _session(build(), [ep, "cpu"])
    assert len(distinct_outputs(session, feeds(), 30)) == 1

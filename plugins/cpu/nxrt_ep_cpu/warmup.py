"""Compile the cpu EP's kernels into the disk cache ahead of time (``nxrt warmup``).

For images and CI: after ``nxrt warmup`` (every compiled kernel the cpu EP has,
at the shapes of a catalogue of models) or ``nxrt warmup MODEL`` (the kernels
that model uses), sessions find their compiled code in the cache
(:mod:`~nxrt_ep_cpu.compiling`) and use it from their first run. Each model is
opened in a cpu session with ``nxrt.cpu.compile=wait``, so its kernels are
compiled (or found) before the next one starts; at the session's thread count,
which decides the split variants (``threads``, default: the machine's).

The catalogue: the onnx package's light models (real CNNs), the embedded digits
model, and small models for the kernel families those lack (activations,
normalizations, softmax, dense layers, recurrences, trees, NMS, attention,
the Conv variants of patch embeddings and depthwise stems).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from nxrt_ep_cpu import compiling

if TYPE_CHECKING:
    import onnx

#: A catalogue entry: a name and what builds its model (a path or a ModelProto).
Entry = tuple[str, Callable[[], Any]]


def warmup(
    model: str | os.PathLike[str] | None = None,
    *,
    threads: int | None = None,
    echo: Callable[[str], None] | None = None,
) -> list[str]:
    """Compile into the cache the compiled kernels of ``model`` (a path), or without one
    those of the whole catalogue; one line per model (``echo`` gets each as it is done).

    A catalogue model that fails (an op the installed onnx lacks) is reported in its
    line and the others go on; a failure of ``model`` itself is raised.
    """
    entries: list[Entry] = (
        [(os.fspath(model), lambda: os.fspath(model))] if model is not None else catalogue()
    )
    lines = []
    for name, build in entries:
        try:
            line = f"{name}: {_warm_one(build(), threads)}"
        except Exception as exc:  # noqa: BLE001 - reported; the catalogue goes on
            if model is not None:
                raise
            line = f"{name}: failed: {type(exc).__name__}: {exc}"
        lines.append(line)
        if echo is not None:
            echo(line)
    return lines


def _warm_one(model: Any, threads: int | None) -> str:
    import nxrt

    options = nxrt.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    before = dict(compiling.counts)
    start = time.perf_counter()
    source = model.SerializeToString() if hasattr(model, "SerializeToString") else model
    nxrt.InferenceSession(
        source, options, providers=[("cpu", {compiling.MODE_OPTION: compiling.WAIT})]
    )
    seconds = time.perf_counter() - start
    made = {k: compiling.counts[k] - before.get(k, 0) for k in ("compiled", "cached", "memory")}
    total = sum(made.values())
    return (
        f"{total} compiled kernels ({made['compiled']} compiled now, {made['cached']} found "
        f"in the cache, {made['memory']} already built) in {seconds:.1f} s"
    )


# -- the catalogue ---------------------------------------------------------------------------------


def catalogue() -> list[Entry]:
    """Every model ``nxrt warmup`` without a model compiles, by name."""
    from nxrt.tools.light_models import LIGHT_MODELS, light_model_path

    entries: list[Entry] = [
        # cast: mypy cannot infer a lambda that binds a default
        (name, cast(Callable[[], Any], lambda name=name: light_model_path(name)))
        for name in LIGHT_MODELS
        if os.path.exists(light_model_path(name))
    ]
    entries.append(("digits (nxrt run's model)", _digits))
    return entries + small_models()


def small_models() -> list[Entry]:
    """The catalogue's small models: the kernel families the CNNs lack."""
    return [
        ("activations", _activations),
        ("normalizations", _normalizations),
        ("dense layers", _dense),
        ("recurrences", _recurrences),
        ("conv variants", _convolutions),
        ("attention", _attention),
        ("trees", _trees),
        ("non-max suppression", _nms),
    ]


def _digits() -> bytes:
    from importlib import resources

    return (resources.files("nxrt") / "data" / "digits_cnn.onnx").read_bytes()


_RNG = np.random.default_rng(0)


def _model(
    nodes: list[Any],
    inputs: dict[str, list[int]],
    outputs: list[str],
    weights: dict[str, np.ndarray] | None = None,
    opset: int = 22,
    ml: bool = False,
    output_type: int = 1,
) -> onnx.ModelProto:
    """A float32 model of ``nodes`` (``output_type``: the outputs' ONNX element type)."""
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        nodes,
        "warmup",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, output_type, None) for n in outputs],
        [numpy_helper.from_array(a, n) for n, a in (weights or {}).items()],
    )
    opsets = [helper.make_opsetid("", opset)] + (
        [helper.make_opsetid("ai.onnx.ml", 3)] if ml else []
    )
    return helper.make_model(graph, opset_imports=opsets)


def _w(*shape: int) -> np.ndarray:
    return _RNG.standard_normal(shape).astype(np.float32)


def _activations() -> onnx.ModelProto:
    from onnx import helper

    chain: list[tuple[str, dict[str, Any]]] = [
        ("Relu", {}),
        ("Sigmoid", {}),
        ("LeakyRelu", {"alpha": 0.1}),
        ("Clip", {}),
        ("HardSigmoid", {}),
        ("HardSwish", {}),
        ("Erf", {}),
        ("Gelu", {}),
        ("Gelu", {"approximate": "tanh"}),
        ("Swish", {}),
    ]
    nodes, last = [], "x"
    for i, (op, attrs) in enumerate(chain):
        nodes.append(helper.make_node(op, [last], [f"a{i}"], **attrs))
        last = f"a{i}"
    return _model(nodes, {"x": [1, 64, 56, 56]}, [last], opset=24)


def _normalizations() -> onnx.ModelProto:
    from onnx import helper

    h = 768
    nodes = [
        helper.make_node("LayerNormalization", ["x", "g", "b"], ["ln"], axis=-1),
        helper.make_node("RMSNormalization", ["ln", "g"], ["rms"], axis=-1),
        helper.make_node("Softmax", ["rms"], ["sm"], axis=-1),
        helper.make_node("LogSoftmax", ["sm"], ["lsm"], axis=-1),
        helper.make_node("GroupNormalization", ["m", "gs", "gb"], ["gn"], num_groups=8),
        helper.make_node("InstanceNormalization", ["gn", "gs", "gb"], ["inorm"]),
    ]
    weights = {"g": _w(h), "b": _w(h), "gs": _w(32), "gb": _w(32)}
    return _model(nodes, {"x": [1, 128, h], "m": [1, 32, 28, 28]}, ["lsm", "inorm"], weights, 23)


def _dense() -> onnx.ModelProto:
    from onnx import helper

    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["p"]),
        helper.make_node("Add", ["p", "b1"], ["q"]),
        helper.make_node("Gelu", ["q"], ["r"]),  # MatMul + Add + Gelu: FusedMatMul
        helper.make_node("MatMul", ["r", "w2"], ["s"]),
        helper.make_node("Gemm", ["v", "w3", "c3"], ["t"]),
        helper.make_node("Relu", ["t"], ["u"]),
    ]
    weights = {"w1": _w(256, 512), "b1": _w(512), "w2": _w(512, 256)}
    weights |= {"w3": _w(256, 128), "c3": _w(128)}
    return _model(nodes, {"x": [1, 64, 256], "v": [8, 256]}, ["s", "u"], weights, 22)


def _recurrences() -> onnx.ModelProto:
    from onnx import helper

    hidden, size = 32, 16
    nodes = [
        helper.make_node("RNN", ["x", "rw", "rr", "rb"], ["y1"], hidden_size=hidden),
        helper.make_node("GRU", ["x", "gw", "gr", "gb"], ["y2"], hidden_size=hidden),
        helper.make_node("LSTM", ["x", "lw", "lr", "lb"], ["y3"], hidden_size=hidden),
    ]
    weights = {}
    for prefix, gates in (("r", 1), ("g", 3), ("l", 4)):
        weights[f"{prefix}w"] = _w(1, gates * hidden, size)
        weights[f"{prefix}r"] = _w(1, gates * hidden, hidden)
        weights[f"{prefix}b"] = _w(1, 2 * gates * hidden)
    return _model(nodes, {"x": [8, 2, size]}, ["y1", "y2", "y3"], weights, 22)


def _convolutions() -> onnx.ModelProto:
    from onnx import helper

    nodes = [
        # a patch embedding (kernel = stride), then a depthwise stem and grouped convs
        helper.make_node("Conv", ["x", "wp"], ["p"], kernel_shape=[4, 4], strides=[4, 4]),
        helper.make_node("Conv", ["x", "wd"], ["d"], kernel_shape=[3, 3], pads=[1] * 4, group=3),
        helper.make_node("Conv", ["d", "ws"], ["s"], kernel_shape=[3, 3], strides=[2, 2]),
        helper.make_node("HardSwish", ["s"], ["sh"]),  # FusedConv with HardSwish
        helper.make_node("Conv", ["sh", "wg"], ["g"], kernel_shape=[3, 3], pads=[1] * 4, group=4),
        helper.make_node("Sigmoid", ["g"], ["gs"]),
        helper.make_node("Conv", ["gs", "w1"], ["o"], kernel_shape=[1, 1], strides=[2, 2]),
        helper.make_node("Conv", ["o", "wb"], ["b"], kernel_shape=[3, 3], pads=[1] * 4, group=64),
        helper.make_node("MaxPool", ["b"], ["mp"], kernel_shape=[3, 3], strides=[2, 2]),
        helper.make_node("AveragePool", ["p"], ["ap"], kernel_shape=[3, 3], pads=[1] * 4),
        helper.make_node("GlobalAveragePool", ["ap"], ["gap"]),
    ]
    weights = {
        "wp": _w(32, 3, 4, 4),
        "wd": _w(3, 1, 3, 3),
        "ws": _w(32, 3, 3, 3),
        "wg": _w(32, 8, 3, 3),
        "w1": _w(64, 32, 1, 1),
        "wb": _w(64, 1, 3, 3),
    }
    return _model(nodes, {"x": [1, 3, 224, 224]}, ["mp", "gap"], weights, 22)


def _attention() -> onnx.ModelProto:
    from onnx import helper

    node = helper.make_node("Attention", ["q", "k", "v"], ["y"])
    shape = [1, 4, 64, 32]
    return _model([node], {"q": shape, "k": shape, "v": shape}, ["y"], opset=23)


def _trees() -> onnx.ModelProto:
    from onnx import helper

    node = helper.make_node(
        "TreeEnsembleRegressor",
        ["x"],
        ["y"],
        domain="ai.onnx.ml",
        n_targets=1,
        nodes_treeids=[0, 0, 0],
        nodes_nodeids=[0, 1, 2],
        nodes_featureids=[0, 0, 0],
        nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"],
        nodes_values=[0.5, 0.0, 0.0],
        nodes_truenodeids=[1, 0, 0],
        nodes_falsenodeids=[2, 0, 0],
        target_treeids=[0, 0],
        target_nodeids=[1, 2],
        target_ids=[0, 0],
        target_weights=[1.0, 2.0],
    )
    return _model([node], {"x": [16, 4]}, ["y"], opset=22, ml=True)


def _nms() -> onnx.ModelProto:
    from onnx import helper

    node = helper.make_node("NonMaxSuppression", ["boxes", "scores", "limit"], ["y"])
    weights = {"limit": np.array([10], np.int64)}
    inputs = {"boxes": [1, 100, 4], "scores": [1, 2, 100]}
    return _model([node], inputs, ["y"], weights, opset=22, output_type=7)  # int64

"""Float models and their int8 forms as ``onnxruntime.quantization`` writes them.

* CNNs: the onnx package's light models (:mod:`nxrt.tools.light_models`) with their
  constant synthetic weights replaced by seeded random ones (He-scaled
  convolutions, batch-norm statistics near 1), upgraded to opset 13 so
  per-channel QDQ applies, then ``quantize_static`` (QDQ, per-channel int8
  weights, uint8 activations) calibrated on a few seeded random batches.
* Transformers: :func:`encoder` (a BERT-shaped encoder of a few layers built
  with ``benchmarks/transformer_models.py``), :func:`block` (one pre-norm
  attention block), quantized with ``quantize_dynamic`` (MatMulInteger and
  DynamicQuantizeLinear) and also with ``quantize_static``.

Constant weights would quantize to one value per channel and every class would
tie, so the random weights are what makes a top-class comparison mean
something. Every model is written into a folder the caller gives (a temporary
one), never into the repository.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper, version_converter

from nxrt.tools.light_models import light_model_path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import transformer_models  # noqa: E402

#: The light models quantized statically, and the transformers dynamically.
CNNS = ("resnet50", "squeezenet", "shufflenet", "densenet121", "inception_v1")
TRANSFORMERS = ("encoder", "block")
Feeds = dict[str, np.ndarray]
#: The spread (standard deviation) given to a CNN's logits.
_LOGIT_SPREAD = 2.0


def _random_weight(name: str, shape: tuple[int, ...], use: str, rng: np.random.Generator):
    """A seeded stand-in for a constant weight, scaled for what reads it."""
    if use == "conv_w" or use == "gemm_w":
        fan_in = int(np.prod(shape[1:])) if use == "conv_w" else int(shape[-1])
        return rng.standard_normal(shape) * np.sqrt(2.0 / max(fan_in, 1))
    if use in ("bn_scale", "mul"):
        return rng.uniform(0.6, 1.4, shape)
    if use == "bn_var":
        return rng.uniform(0.5, 1.5, shape)
    return rng.standard_normal(shape) * 0.1  # biases, means


def _uses(model: onnx.ModelProto) -> dict[str, str]:
    uses: dict[str, str] = {}
    for node in model.graph.node:
        for i, name in enumerate(node.input):
            if node.op_type == "Conv" and i == 1:
                uses[name] = "conv_w"
            elif node.op_type == "Gemm" and i == 1:
                uses[name] = "gemm_w"
            elif node.op_type == "BatchNormalization":
                uses[name] = {1: "bn_scale", 3: "mean", 4: "bn_var"}.get(i, "bias")
            elif node.op_type == "Unsqueeze" and i == 0:
                uses.setdefault(name, "unsqueeze")
    for node in model.graph.node:  # densenet's batch norm as Unsqueeze -> Mul / Add
        if node.op_type in ("Mul", "Add"):
            for name in node.input:
                for producer in model.graph.node:
                    if producer.op_type == "Unsqueeze" and name in producer.output:
                        uses[producer.input[0]] = "mul" if node.op_type == "Mul" else "bias"
    return uses


def cnn(name: str, seed: int = 0) -> onnx.ModelProto:
    """A light model with random weights as initializers, at opset 13 and IR 8."""
    model = onnx.load(light_model_path(name))
    rng = np.random.default_rng(seed)
    shapes = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    uses = _uses(model)
    init, nodes = [], []
    for node in model.graph.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in shapes:
            out = node.output[0]
            shape = tuple(int(d) for d in shapes[node.input[0]])
            value = _random_weight(out, shape, uses.get(out, "bias"), rng)
            init.append(numpy_helper.from_array(value.astype(np.float32), out))
        else:
            nodes.append(node)
    outputs = list(model.graph.output)
    if nodes[-1].op_type == "Softmax" and nodes[-1].output[0] == outputs[0].name:
        # logits out, as torch exports a classifier: the quantized softmax of 1000 classes
        # is a handful of levels, where the top class ties
        last = nodes.pop()
        for node in nodes:
            node.output[:] = [outputs[0].name if o == last.input[0] else o for o in node.output]
        outputs = [helper.make_tensor_value_info(outputs[0].name, TensorProto.FLOAT, None)]
    used = {name for node in nodes for name in node.input}
    init += [t for t in model.graph.initializer if t.name in used]
    names = {t.name for t in init}
    inputs = [i for i in model.graph.input if i.name not in names and i.name in used]
    graph = helper.make_graph(nodes, model.graph.name, inputs, outputs, init)
    out = helper.make_model(graph, opset_imports=list(model.opset_import))
    out.ir_version = 8
    out = version_converter.convert_version(out, 13)
    out.ir_version = 8
    return _unit_gain(onnx.shape_inference.infer_shapes(out))


def _unit_gain(model: onnx.ModelProto, rounds: int = 3) -> onnx.ModelProto:
    """Batch norms folded (ONNX Runtime's basic level), then every Conv and Gemm scaled so
    the spread of its output matches its input's on a random image: a random deep network
    otherwise grows its activations a hundredfold per stage."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.log_severity_level = 3
    with tempfile.TemporaryDirectory() as folder:
        options.optimized_model_filepath = os.path.join(folder, "basic.onnx")
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        model = onnx.load(options.optimized_model_filepath)
    weights = {t.name: t for t in model.graph.initializer}
    layers = [n for n in model.graph.node if n.op_type in ("Conv", "Gemm")]
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    watched = {v for n in layers for v in (n.input[0], n.output[0])}
    known = {o.name for o in probe.graph.output}
    probe.graph.output.extend(onnx.ValueInfoProto(name=v) for v in watched - known)
    feeds = feeds_for(model, 99)
    for _ in range(rounds):
        for t in probe.graph.initializer:
            t.CopyFrom(weights[t.name])
        session = ort.InferenceSession(
            probe.SerializeToString(), providers=["CPUExecutionProvider"]
        )
        names = [o.name for o in session.get_outputs()]
        spread = {k: float(np.std(v)) for k, v in zip(names, session.run(None, feeds))}
        for node in layers:
            gain = spread[node.output[0]] / max(spread[node.input[0]], 1e-6)
            for name in node.input[1:3]:
                if name in weights:
                    scaled = numpy_helper.to_array(weights[name]) / np.float32(gain)
                    weights[name].CopyFrom(numpy_helper.from_array(scaled, name))
    last = spread[model.graph.output[0].name] / _LOGIT_SPREAD  # logits as a trained net's
    for name in layers[-1].input[1:3]:
        if name in weights:
            scaled = numpy_helper.to_array(weights[name]) / np.float32(last)
            weights[name].CopyFrom(numpy_helper.from_array(scaled, name))
    return model


def encoder(layers: int = 2, hidden: int = 384, heads: int = 6, seq: int = 128) -> onnx.ModelProto:
    """A BERT-shaped encoder (MatMul + Add projections, erf GELU, LayerNormalization)."""
    return transformer_models.bert_encoder(layers=layers, hidden=hidden, heads=heads, seq=seq)


def block(hidden: int = 256, heads: int = 4, ffn: int = 1024, seq: int = 64) -> onnx.ModelProto:
    """One pre-norm attention block on ``x [1, seq, hidden]`` (as in the determinism tests)."""
    b = transformer_models._Builder(7)
    head = hidden // heads
    x = "x"
    ln = b.layer_norm(x, hidden, "ln1")
    split = b.shape(1, seq, heads, head)
    qkv = []
    for part, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        y = b.op("Reshape", [b.linear(ln, hidden, hidden, part), split])
        qkv.append(b.op("Transpose", [y], perm=perm))
    scores = b.op("Mul", [b.op("MatMul", qkv[:2]), b.scalar(1 / np.sqrt(head))])
    probs = b.op("Softmax", [scores], axis=-1)
    context = b.op("Transpose", [b.op("MatMul", [probs, qkv[2]])], perm=[0, 2, 1, 3])
    context = b.op("Reshape", [context, b.shape(1, seq, hidden)])
    h = b.op("Add", [x, b.linear(context, hidden, hidden, "o")])
    up = b.linear(b.layer_norm(h, hidden, "ln2"), hidden, ffn, "up")
    gelu = b.op("Relu", [up])
    y = b.op("Add", [h, b.linear(gelu, ffn, hidden, "down")])
    b.nodes.append(helper.make_node("Identity", [y], ["y"], name="output"))
    graph = helper.make_graph(
        b.nodes,
        "block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, hidden])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, hidden])],
        b.initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def float_model(name: str) -> onnx.ModelProto:
    if name in CNNS:
        return cnn(name)
    return {"encoder": encoder, "block": block}[name]()


def feeds_for(model: onnx.ModelProto, seed: int = 0) -> Feeds:
    """Seeded inputs: N(0, 1) images or activations, random token ids with a mask."""
    rng = np.random.default_rng(seed)
    feeds: Feeds = {}
    for arg in model.graph.input:
        dims = [d.dim_value or 1 for d in arg.type.tensor_type.shape.dim]
        if arg.type.tensor_type.elem_type == TensorProto.INT64:
            if arg.name == "attention_mask":
                mask = np.ones(dims, np.int64)
                mask[..., dims[-1] - dims[-1] // 8 :] = 0
                feeds[arg.name] = mask
            else:
                feeds[arg.name] = rng.integers(0, 30522, dims, dtype=np.int64)
        else:
            feeds[arg.name] = rng.standard_normal(dims).astype(np.float32)
    return feeds


class _Reader:
    """The calibration data reader ``quantize_static`` pulls batches from."""

    def __init__(self, batches: list[Feeds]) -> None:
        self.batches = iter(batches)

    def get_next(self) -> Feeds | None:
        return next(self.batches, None)


def quantize(
    float_path: str, out_path: str, mode: str, feeds: Callable[[int], Feeds], batches: int = 4
) -> str:
    """Write ``float_path`` quantized as ``mode``: ``static`` (QDQ, per-channel int8 weights,
    uint8 activations, MinMax calibration on ``batches`` seeded batches) or ``dynamic``
    (MatMulInteger / DynamicQuantizeLinear, int8 weights)."""
    from onnxruntime.quantization import (
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    pre = out_path + ".pre.onnx"
    quant_pre_process(float_path, pre, skip_symbolic_shape=True)
    if mode == "static":
        quantize_static(
            pre,
            out_path,
            _Reader([feeds(seed) for seed in range(batches)]),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=CalibrationMethod.MinMax,
        )
    else:
        quantize_dynamic(pre, out_path, weight_type=QuantType.QInt8)
    os.remove(pre)
    return out_path


def build(name: str, folder: str, mode: str | None = None) -> tuple[str, str, Feeds]:
    """``(float_path, int8_path, feeds)`` of model ``name`` written into ``folder``; ``mode``
    defaults to static for CNNs and dynamic for transformers."""
    mode = mode or ("static" if name in CNNS else "dynamic")
    model = float_model(name)
    float_path = os.path.join(folder, f"{name}.onnx")
    int8_path = os.path.join(folder, f"{name}.{mode}.onnx")
    if not os.path.exists(float_path):
        onnx.save(model, float_path)
    if not os.path.exists(int8_path):
        quantize(float_path, int8_path, mode, lambda seed: feeds_for(model, 100 + seed))
    return float_path, int8_path, feeds_for(model, 0)

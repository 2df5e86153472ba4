"""The cpu EP's graph rewrites, contributed through ``nxrt_optimizer_passes``.

Each pass keeps the model's results (to float32 rounding) and only touches
what it proves safe: constants it owns, values no graph output exposes.
Rewrites that produce standard ops (Conv+BatchNormalization, MatMul+Add into
Gemm, Gemm weights stored untransposed) always run; fusions into nxrt's own
``pkg.nxrt`` ops (FusedConv, FusedMatMul, with the activations of
:func:`_fused_activation`) run where ``supports(domain, op_type)`` says the EP
has a kernel for the fused op. Quantized models go first through
:mod:`~nxrt_ep_cpu.quant_fusions` (QDQ chains and dynamic quantization into
integer kernels).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import onnx_ir as ir

from nxrt.contrib_ops import DOMAIN as FUSED_DOMAIN
from nxrt.contrib_ops import FUSED_SINCE as FUSED_VERSION
from nxrt.kernel import attribute_values
from nxrt.pipeline.optimizer import constant_array as _constant
from nxrt.pipeline.optimizer import new_initializer as _new_initializer
from nxrt_ep_cpu.kernels import CpuKernel
from nxrt_ep_cpu.quant_fusions import quant_passes

if TYPE_CHECKING:
    from nxrt.provider import ExecutionProvider


#: Single-node activations a FusedConv or FusedMatMul applies (ONNX Runtime's FusedConv
#: names, and HardSwish). The fused ops also apply subgraphs that compute one activation:
#: ``x * Sigmoid(x)`` (Swish), ``x * HardSigmoid(x)`` with HardSwish's constants, and
#: GELU in its erf and tanh forms (Gelu, FastGelu); see :func:`_fused_activation`.
FUSABLE_ACTIVATIONS = ("Relu", "Clip", "LeakyRelu", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish")
#: An opset above every registered version: "is there a kernel at all".
_ANY_OPSET = 1 << 16
#: HardSigmoid's parameters inside HardSwish (``x * HardSigmoid(x)``), as float32.
_HARD_SWISH_ALPHA, _HARD_SWISH_BETA = float(np.float32(1 / 6)), 0.5


def _only_user(value: ir.Value, graph: ir.Graph) -> ir.Node | None:
    """The single node reading ``value``, if it is not also a graph output."""
    uses = list(value.uses())
    if len(uses) != 1 or value in graph.outputs:
        return None
    return uses[0][0]


class FuseConvBatchNorm(ir.passes.InPlacePass):
    """Fold an inference BatchNormalization into the Conv that feeds it.

    ``BN(conv(x, W) + B)`` is ``conv(x, W * s) + (B - mean) * s + bias`` with
    ``s = scale / sqrt(var + eps)`` per output channel; the BatchNormalization
    node disappears, so its whole pass over the activations is saved.
    """

    def __init__(self) -> None:
        super().__init__()
        self.fused: list[tuple[str | None, str | None]] = []

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graph = model.graph
        modified = False
        for conv in list(graph):
            if conv.op_type != "Conv" or conv.domain not in ("", "ai.onnx"):
                continue
            bn = _only_user(conv.outputs[0], graph)
            if bn is None or bn.inputs[0] is not conv.outputs[0]:
                continue
            affine, (known, bias) = _batch_norm_affine(bn), _conv_bias(conv)
            weights = _constant(conv.inputs[1])
            if weights is None or affine is None or not known:
                continue
            factor, shift = affine
            if factor.shape != (weights.shape[0],):
                continue
            shape = (-1,) + (1,) * (weights.ndim - 1)
            fused_w = (weights * factor.reshape(shape)).astype(weights.dtype)
            base = bias.astype(np.float64) if bias is not None else 0.0
            fused_b = (base * factor + shift).astype(weights.dtype)
            stem = conv.name or "conv"
            _set_conv_parameters(
                conv,
                _new_initializer(graph, f"{stem}_bn_weight", fused_w),
                _new_initializer(graph, f"{stem}_bn_bias", fused_b),
            )
            out = bn.outputs[0]
            was_output = out in graph.outputs
            out.replace_all_uses_with(conv.outputs[0], replace_graph_outputs=True)
            if was_output:
                conv.outputs[0].name = out.name
            graph.remove(bn, safe=True)
            self.fused.append((bn.name, conv.name))
            modified = True
        return ir.passes.PassResult(model, modified)


def _training(bn: ir.Node) -> bool:
    attr = bn.attributes.get("training_mode")
    return bool(attr.value) if attr is not None else False


def _batch_norm_affine(bn: ir.Node) -> tuple[np.ndarray, np.ndarray] | None:
    """``(a, b)``, float64 per channel, with ``bn(x) = a * x + b``: when ``bn`` is an
    inference BatchNormalization with constant per-channel statistics, else ``None``."""
    if not _standard(bn, "BatchNormalization") or len(bn.outputs) != 1 or _training(bn):
        return None
    spatial = bn.attributes.get("spatial")  # opset 7's per-activation statistics
    params = [_constant(v) for v in bn.inputs[1:5]]
    if (spatial is not None and not spatial.value) or any(p is None for p in params):
        return None
    scale, bias, mean, var = (cast(np.ndarray, p).astype(np.float64) for p in params)
    epsilon = bn.attributes["epsilon"].value if "epsilon" in bn.attributes else 1e-5
    factor = scale / np.sqrt(var + epsilon)
    if factor.ndim != 1:
        return None
    return factor, bias - mean * factor


def _conv_bias(conv: ir.Node) -> tuple[bool, np.ndarray | None]:
    """``(known, bias)``: a Conv's constant bias, or ``None`` when it has none; ``known`` is
    False when the bias is computed at run time."""
    if len(conv.inputs) < 3 or conv.inputs[2] is None:
        return True, None
    bias = _constant(conv.inputs[2])
    return bias is not None, bias


def _set_conv_parameters(conv: ir.Node, weights: ir.Value, bias: ir.Value) -> None:
    """Point a Conv at new weight and bias initializers (adding the bias input if absent)."""
    conv.replace_input_with(1, weights)
    if len(conv.inputs) < 3:
        conv.resize_inputs(3)
    conv.replace_input_with(2, bias)


def _standard(node: ir.Node, *op_types: str) -> bool:
    return node.op_type in op_types and node.domain in ("", "ai.onnx")


def _static_shape(value: ir.Value | None) -> tuple[int, ...] | None:
    shape = value.shape if value is not None else None
    if shape is None or not all(isinstance(d, int) for d in shape):
        return None
    return cast("tuple[int, ...]", tuple(shape))


def _activation(node: ir.Node) -> tuple[str, list[float]] | None:
    """``(name, params)`` when ``node`` is an activation a fused op can apply in place."""
    if node.domain not in ("", "ai.onnx") or node.op_type not in FUSABLE_ACTIVATIONS:
        return None
    if node.op_type == "LeakyRelu":
        alpha = node.attributes.get("alpha")
        return "LeakyRelu", [float(alpha.value) if alpha is not None else 0.01]
    if node.op_type == "HardSigmoid":
        return "HardSigmoid", list(_hard_sigmoid_parameters(node))
    if node.op_type != "Clip":
        return (node.op_type, []) if len(node.inputs) == 1 else None
    bounds = [-np.inf, np.inf]
    if "min" in node.attributes or "max" in node.attributes:  # opset 6: attributes
        for i, name in enumerate(("min", "max")):
            if name in node.attributes:
                bounds[i] = float(node.attributes[name].value)
        return "Clip", bounds
    for i, value in enumerate(node.inputs[1:3]):  # opset 11: optional constant inputs
        if value is None:
            continue
        array = _constant(value)
        if array is None or array.size != 1:
            return None
        bounds[i] = float(array.reshape(()))
    return "Clip", bounds


def _hard_sigmoid_parameters(node: ir.Node) -> tuple[float, float]:
    """A HardSigmoid node's ``alpha`` and ``beta``, with ONNX's defaults."""
    alpha, beta = node.attributes.get("alpha"), node.attributes.get("beta")
    return (
        float(alpha.value) if alpha is not None else float(np.float32(0.2)),
        float(beta.value) if beta is not None else 0.5,
    )


def _scalar(value: ir.Value | None, want: float, relative: float | None = None) -> bool:
    """Whether ``value`` is a constant scalar close to ``want`` (exporters round them):
    within 1e-4, or within ``relative`` of ``want`` when given."""
    array = _constant(value)
    if array is None or array.size != 1:
        return False
    got = float(array.reshape(()))
    if relative is not None:
        return abs(got - want) <= relative * abs(want)
    return abs(got - want) < 1e-4


def _other_input(node: ir.Node, value: ir.Value) -> ir.Value | None:
    """The input of a two-input node that is not ``value``."""
    if len(node.inputs) != 2:
        return None
    first, second = node.inputs
    return second if first is value else first if second is value else None


def _fused_activation(
    value: ir.Value, graph: ir.Graph
) -> tuple[list[ir.Node], ir.Value, tuple[str, list[float]]] | None:
    """The activation applied to ``value`` and nothing else, as a fused op names it: its
    nodes (in graph order), its result, and ``(name, params)``; ``None`` when ``value``
    has other readers or no activation follows.

    A single activation node (:data:`FUSABLE_ACTIVATIONS`); ``x * Sigmoid(x)`` (Swish,
    EfficientNet's SiLU); ``x * HardSigmoid(x)`` with alpha 1/6 and beta 0.5 (HardSwish
    as exported before opset 14); GELU in its erf form or its tanh form (BERT, GPT-2).
    """
    user = _only_user(value, graph)
    if user is not None:
        activation = _activation(user)
        if activation is not None:
            return [user], user.outputs[0], activation
    gated = _gated(value, graph)
    if gated is not None:
        return gated
    gelu = _gelu_chain(value, graph)
    if gelu is not None:
        return gelu
    return None


def _gated(
    value: ir.Value, graph: ir.Graph
) -> tuple[list[ir.Node], ir.Value, tuple[str, list[float]]] | None:
    """``x * Sigmoid(x)`` as Swish, ``x * HardSigmoid(x)`` (HardSwish's constants) as
    HardSwish: ``value`` read by the gate and the Mul only, the gate by the Mul only."""
    uses = [use[0] for use in value.uses()]
    if value in graph.outputs or len(uses) != 2 or uses[0] is uses[1]:
        return None
    for gate in uses:
        if not _standard(gate, "Sigmoid", "HardSigmoid") or len(gate.inputs) != 1:
            continue
        times = next(node for node in uses if node is not gate)
        if (
            not _standard(times, "Mul")
            or _only_user(gate.outputs[0], graph) is not times
            or _other_input(times, value) is not gate.outputs[0]
        ):
            return None
        if gate.op_type == "Sigmoid":
            return [gate, times], times.outputs[0], ("Swish", [])
        alpha, beta = _hard_sigmoid_parameters(gate)
        if abs(alpha - _HARD_SWISH_ALPHA) > 1e-7 or beta != _HARD_SWISH_BETA:
            return None
        return [gate, times], times.outputs[0], ("HardSwish", [])
    return None


def _gelu_chain(
    value: ir.Value, graph: ir.Graph
) -> tuple[list[ir.Node], ir.Value, tuple[str, list[float]]] | None:
    """The nodes of GELU computed from ``value``, its result and the fused name: the erf
    form ``0.5 x (1 + erf(x / sqrt 2))`` (Gelu), the tanh form
    ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`` (FastGelu), or the standard
    Gelu op.

    Matches the orders exporters write (``x * 0.5`` first, last, or on the
    ``1 + f`` factor; ``x^3`` as Pow or as two Muls; operands either way round).
    Every reader of ``value`` must belong to the chain.
    """
    uses = [use[0] for use in value.uses()]
    if value in graph.outputs or not uses:
        return None
    if len(uses) == 1 and _standard(uses[0], "Gelu"):
        mode = uses[0].attributes.get("approximate")
        mode = "none" if mode is None else mode.value
        mode = mode.decode() if isinstance(mode, bytes) else mode
        name = {"none": "Gelu", "tanh": "FastGelu"}.get(mode)
        return ([uses[0]], uses[0].outputs[0], (name, [])) if name else None
    for first in uses:
        inner = _erf_part(first, value, graph) or _tanh_part(first, value, graph)
        if inner is None:
            continue
        nodes, plus, name = inner
        tail = _half_product(value, plus, graph)
        if tail is None:
            continue
        chain = nodes + tail[0]
        if all(any(use is node for node in chain) for use in uses):
            return chain, tail[1], (name, [])
    return None


def _erf_part(
    scale: ir.Node, value: ir.Value, graph: ir.Graph
) -> tuple[list[ir.Node], ir.Node, str] | None:
    """``1 + erf(x / sqrt 2)`` (or ``x * sqrt(1/2)``) from its first node, ``scale``:
    its nodes and the ``1 +`` node."""
    if not _standard(scale, "Div", "Mul") or scale.inputs[0] is not value:
        return None
    want = math.sqrt(2.0) if scale.op_type == "Div" else math.sqrt(0.5)
    if not _scalar(_other_input(scale, value), want):
        return None
    erf = _only_user(scale.outputs[0], graph)
    if erf is None or not _standard(erf, "Erf"):
        return None
    plus = _plus_one(erf, graph)
    return ([scale, erf, plus], plus, "Gelu") if plus is not None else None


def _tanh_part(
    start: ir.Node, value: ir.Value, graph: ir.Graph
) -> tuple[list[ir.Node], ir.Node, str] | None:
    """``1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))`` from its first node, ``start`` (the Pow
    or the first Mul of ``x^3``): its nodes and the ``1 +`` node."""
    cube = _cube(start, value, graph)
    if cube is None:
        return None
    nodes, cubed = cube
    scaled = _only_user(cubed.outputs[0], graph)
    if (
        scaled is None
        or not _standard(scaled, "Mul")
        or not _scalar(_other_input(scaled, cubed.outputs[0]), 0.044715, relative=1e-6)
    ):
        return None
    inner = _only_user(scaled.outputs[0], graph)
    if (
        inner is None
        or not _standard(inner, "Add")
        or _other_input(inner, scaled.outputs[0]) is not value
    ):
        return None
    argument = _only_user(inner.outputs[0], graph)
    if (
        argument is None
        or not _standard(argument, "Mul")
        or not _scalar(
            _other_input(argument, inner.outputs[0]), math.sqrt(2 / math.pi), relative=1e-6
        )
    ):
        return None
    tanh = _only_user(argument.outputs[0], graph)
    if tanh is None or not _standard(tanh, "Tanh"):
        return None
    plus = _plus_one(tanh, graph)
    if plus is None:
        return None
    return [*nodes, scaled, inner, argument, tanh, plus], plus, "FastGelu"


def _cube(start: ir.Node, value: ir.Value, graph: ir.Graph) -> tuple[list[ir.Node], ir.Node] | None:
    """``x^3`` from its first node: ``Pow(x, 3)``, or ``Mul(x, x)`` then a Mul by ``x``
    (either way round). Returns its nodes and the last one."""
    if _standard(start, "Pow") and start.inputs[0] is value and len(start.inputs) == 2:
        exponent = _constant(start.inputs[1])
        if exponent is not None and exponent.size == 1 and float(exponent.reshape(())) == 3.0:
            return [start], start
        return None
    if not _standard(start, "Mul") or list(start.inputs) != [value, value]:
        return None
    cubed = _only_user(start.outputs[0], graph)
    if cubed is None or not _standard(cubed, "Mul"):
        return None
    if _other_input(cubed, start.outputs[0]) is not value:
        return None
    return [start, cubed], cubed


def _plus_one(node: ir.Node, graph: ir.Graph) -> ir.Node | None:
    """The only reader of ``node``'s output when it is ``Add(output, 1)``."""
    plus = _only_user(node.outputs[0], graph)
    if (
        plus is None
        or not _standard(plus, "Add")
        or not _scalar(_other_input(plus, node.outputs[0]), 1.0)
    ):
        return None
    return plus


def _half_product(
    value: ir.Value, plus: ir.Node, graph: ir.Graph
) -> tuple[list[ir.Node], ir.Value] | None:
    """``0.5 * x * (1 + f)`` from the ``1 + f`` node: ``(x * (1 + f)) * 0.5``,
    ``(x * 0.5) * (1 + f)`` or ``x * ((1 + f) * 0.5)``. Returns the nodes after ``plus``
    (in graph order) and the result."""
    factor = plus.outputs[0]
    user = _only_user(factor, graph)
    if user is None or not _standard(user, "Mul"):
        return None
    other = _other_input(user, factor)
    if other is value:  # x * (1 + f), then * 0.5
        half = _only_user(user.outputs[0], graph)
        if half is None or not _standard(half, "Mul"):
            return None
        if not _scalar(_other_input(half, user.outputs[0]), 0.5):
            return None
        return [user, half], half.outputs[0]
    if _scalar(other, 0.5):  # x * ((1 + f) * 0.5)
        times = _only_user(user.outputs[0], graph)
        if times is None or not _standard(times, "Mul"):
            return None
        if _other_input(times, user.outputs[0]) is not value:
            return None
        return [user, times], times.outputs[0]
    producer = other.producer() if other is not None else None  # (x * 0.5) * (1 + f)
    if (
        other is None
        or producer is None
        or not _standard(producer, "Mul")
        or _only_user(other, graph) is not user
        or _other_input(producer, value) is None
        or not _scalar(_other_input(producer, value), 0.5)
    ):
        return None
    return [producer, user], user.outputs[0]


def _replace_chain(graph: ir.Graph, chain: list[ir.Node], fused: ir.Node, result: ir.Value) -> None:
    """Put ``fused`` after the last node of ``chain``, take over ``result``'s readers and
    name, and remove the chain (inputs of the fused node all exist at that point)."""
    out = fused.outputs[0]
    out.shape, out.type = result.shape, result.type
    graph.insert_after(chain[-1], fused)
    name = result.name
    result.replace_all_uses_with(out, replace_graph_outputs=True)
    for node in reversed(chain):
        graph.remove(node, safe=True)
    out.name = name


def _along_inputs(values: np.ndarray, weight_shape: tuple[int, ...], group: int) -> np.ndarray:
    """One value per input channel, laid out to multiply Conv weights of ``weight_shape``:
    group ``g``'s filters read channels ``g * per_group`` onwards."""
    outputs, per_group = weight_shape[:2]
    grouped = np.broadcast_to(
        values.reshape(group, 1, per_group), (group, outputs // group, per_group)
    )
    return grouped.reshape(outputs, per_group, *(1,) * (len(weight_shape) - 2))


def _padded(conv: ir.Node) -> bool:
    """Whether some window of ``conv`` may reach past its input (explicit or SAME pads)."""
    auto_pad = conv.attributes.get("auto_pad")
    mode = auto_pad.value if auto_pad is not None else "NOTSET"
    if isinstance(mode, bytes):
        mode = mode.decode()
    if mode in ("SAME_UPPER", "SAME_LOWER"):
        return True
    pads = conv.attributes.get("pads")
    return mode != "VALID" and pads is not None and any(pads.value)


def _per_channel(array: np.ndarray, channels: int, rank: int) -> np.ndarray | None:
    """``array`` as one value per channel (axis 1 of a rank-``rank`` tensor), if it
    broadcasts that way; ``None`` when it varies along another axis."""
    if rank < 2 or array.ndim > rank or array.dtype.kind != "f":
        return None
    shape = (1,) * (rank - array.ndim) + array.shape
    if any(d != 1 for i, d in enumerate(shape) if i != 1) or shape[1] not in (1, channels):
        return None
    return np.broadcast_to(array.reshape(-1).astype(np.float64), (channels,))


class FoldChannelAffine(ir.passes.InPlacePass):
    """Fold per-channel Mul/Add/Sub by constants into the Conv or BatchNormalization before them.

    Models exported from Caffe2 write a BatchNormalization as BN -> Mul -> Add
    with per-channel constants; every such node is a full pass over the
    activations. After a Conv they go into its weights and bias, after a
    BatchNormalization into its scale and bias (with mean 0, variance 1 and
    epsilon 0, so ``y = x * scale + bias`` exactly).
    """

    def __init__(self) -> None:
        super().__init__()
        self.fused: list[tuple[str | None, str | None]] = []

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graph = model.graph
        for node in list(graph):
            if node.graph is not graph:
                continue
            if _standard(node, "Conv"):
                weights = _constant(node.inputs[1])
                known, bias = _conv_bias(node)
                if weights is None or not known:
                    continue
                channels, rank = weights.shape[0], weights.ndim
            elif (affine := _batch_norm_affine(node)) is not None:
                shape = node.outputs[0].shape
                if shape is None:
                    continue
                channels, rank = affine[0].size, len(shape)
            else:
                continue
            scale, shift = np.ones(channels), np.zeros(channels)
            absorbed, value = [], node.outputs[0]
            while (user := _only_user(value, graph)) is not None:
                if not _standard(user, "Mul", "Add", "Sub") or len(user.inputs) != 2:
                    break
                other = user.inputs[1] if user.inputs[0] is value else user.inputs[0]
                if other is value or (user.op_type == "Sub" and user.inputs[0] is not value):
                    break
                array = _constant(other)
                per = _per_channel(array, channels, rank) if array is not None else None
                if per is None or user.outputs[0].dtype != value.dtype:
                    break
                if user.op_type == "Mul":
                    scale, shift = scale * per, shift * per
                else:
                    shift = shift + per if user.op_type == "Add" else shift - per
                absorbed.append(user)
                value = user.outputs[0]
            if not absorbed:
                continue
            stem = node.name or node.op_type.lower()
            if node.op_type == "Conv":
                assert weights is not None  # checked for a Conv above
                view = (-1,) + (1,) * (rank - 1)
                new_w = (weights * scale.reshape(view)).astype(weights.dtype)
                base = bias.astype(np.float64) if bias is not None else 0.0
                new_b = (base * scale + shift).astype(weights.dtype)
                _set_conv_parameters(
                    node,
                    _new_initializer(graph, f"{stem}_affine_w", new_w),
                    _new_initializer(graph, f"{stem}_affine_b", new_b),
                )
            else:
                assert affine is not None  # not a Conv: a BatchNormalization
                factor, offset = affine
                dtype = cast(np.ndarray, _constant(node.inputs[1])).dtype  # a constant scale
                new = [
                    factor * scale,
                    offset * scale + shift,
                    np.zeros(channels),
                    np.ones(channels),
                ]
                for index, (array, suffix) in enumerate(zip(new, ("scale", "bias", "mean", "var"))):
                    folded = _new_initializer(graph, f"{stem}_affine_{suffix}", array.astype(dtype))
                    node.replace_input_with(index + 1, folded)
                node.attributes["epsilon"] = ir.AttrFloat32("epsilon", 0.0)
            out = node.outputs[0]
            name, was_output = value.name, value in graph.outputs
            value.replace_all_uses_with(out, replace_graph_outputs=True)
            for user in reversed(absorbed):
                graph.remove(user, safe=True)
            if was_output:
                out.name = name
            out.shape, out.type = value.shape or out.shape, value.type or out.type
            self.fused.extend((user.name, node.name) for user in absorbed)
        return ir.passes.PassResult(model, bool(self.fused))


class FoldPreActivation(ir.passes.InPlacePass):
    """Rewrite BatchNormalization -> Relu -> Conv (DenseNet's pre-activation) as Max -> Conv.

    With ``a = scale / sqrt(var + eps)`` and ``shift = bias - mean * a``,
    ``relu(a * x + shift)`` is ``a * max(x, -shift / a) + shift`` wherever
    ``a > 0``: ``a`` moves into the Conv's weights along their input
    channels and ``shift`` into its bias, so three passes over the
    activations (multiply, add, Relu) become one Max against a per-channel
    floor. The bias takes ``shift`` exactly only when every window lies
    inside the input, so Convs with padding are left alone, as are channels
    whose ``a`` is not positive and opsets before 8 (where Max cannot
    broadcast).
    """

    def __init__(self) -> None:
        super().__init__()
        self.fused: list[tuple[str | None, str | None]] = []

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graph = model.graph
        if model.opset_imports.get("", 1) < 8:
            return ir.passes.PassResult(model, False)
        for bn in list(graph):
            if bn.graph is not graph or (affine := _batch_norm_affine(bn)) is None:
                continue
            relu = _only_user(bn.outputs[0], graph)
            if relu is None or not _standard(relu, "Relu"):
                continue
            conv = _only_user(relu.outputs[0], graph)
            if conv is None or not _standard(conv, "Conv") or conv.inputs[0] is not relu.outputs[0]:
                continue
            weights, (known, conv_bias), x = (
                _constant(conv.inputs[1]),
                _conv_bias(conv),
                cast(ir.Value, bn.inputs[0]),  # X: required
            )
            if weights is None or weights.ndim < 3 or not known:
                continue
            if x.dtype is None or x.dtype.numpy().kind != "f":
                continue
            factor, shift = affine
            group = conv.attributes["group"].value if "group" in conv.attributes else 1
            outputs, per_group = weights.shape[:2]
            if per_group * group != factor.size or outputs % group:
                continue
            if not (np.all(factor > 0) and np.all(np.isfinite(factor))) or _padded(conv):
                continue
            floor = (-shift / factor).astype(x.dtype.numpy())
            if not np.all(np.isfinite(floor)):
                continue
            wide = weights.astype(np.float64)
            spread = _along_inputs(shift, weights.shape, group)
            new_bias = (wide * spread).sum(axis=tuple(range(1, weights.ndim)))
            if conv_bias is not None:
                new_bias = new_bias + conv_bias.astype(np.float64)
            stem = conv.name or "conv"
            scaled = (wide * _along_inputs(factor, weights.shape, group)).astype(weights.dtype)
            new_w = _new_initializer(graph, f"{stem}_preact_weight", scaled)
            b_value = _new_initializer(graph, f"{stem}_preact_bias", new_bias.astype(weights.dtype))
            floor_shape = (factor.size,) + (1,) * (weights.ndim - 2)
            floor_value = _new_initializer(
                graph, f"{stem}_preact_floor", floor.reshape(floor_shape)
            )
            clamp = ir.Node("", "Max", [x, floor_value], num_outputs=1, name=relu.name)
            _set_conv_parameters(conv, new_w, b_value)
            _replace_chain(graph, [bn, relu], clamp, relu.outputs[0])
            self.fused.extend([(bn.name, conv.name), (relu.name, conv.name)])
        return ir.passes.PassResult(model, bool(self.fused))


class _FusingPass(ir.passes.InPlacePass):
    """A pass making ``pkg.nxrt`` ops, only those the EP has kernels for (``supports``);
    ``fused`` lists the ``(node, into)`` pairs for the partition report."""

    def __init__(self, supports: Callable[[str, str], bool] | None) -> None:
        super().__init__()
        self.supports = supports
        self.fused: list[tuple[str | None, str | None]] = []

    def has(self, op_type: str) -> bool:
        return self.supports is not None and self.supports(FUSED_DOMAIN, op_type)


class FuseConvActivation(_FusingPass):
    """Turn Conv -> [Add/Sum residual] -> [activation] into one ``pkg.nxrt::FusedConv``.

    The residual input ``Z`` (same shape as the Conv output) and the
    activation are applied in place on the Conv result: each fused node
    saves a pass over the activations and an allocation. Runs after
    :class:`FuseConvBatchNorm`, so ResNet's Conv -> BN -> Add -> Relu
    becomes one node, and EfficientNet's Conv -> BN -> Sigmoid, Mul (SiLU) and
    MobileNetV3's Conv -> BN -> HardSwish do too (see :func:`_fused_activation`).
    """

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        if not self.has("FusedConv"):
            return ir.passes.PassResult(model, False)
        graph = model.graph
        for conv in list(graph):
            if not _standard(conv, "Conv") or conv.graph is not graph:
                continue
            chain, value, z, activation = [conv], conv.outputs[0], None, None
            user = _only_user(value, graph)
            if user is not None and _standard(user, "Add", "Sum") and len(user.inputs) == 2:
                other = user.inputs[1] if user.inputs[0] is value else user.inputs[0]
                shape = _static_shape(value)
                if (
                    other is not None
                    and other is not value
                    and shape is not None
                    and _static_shape(other) == shape
                    and other.dtype == value.dtype
                ):
                    z = other
                    chain.append(user)
                    value = user.outputs[0]
            if (fused_activation := _fused_activation(value, graph)) is not None:
                nodes, value, activation = fused_activation
                chain.extend(nodes)
            if len(chain) == 1:
                continue
            bias = conv.inputs[2] if len(conv.inputs) > 2 else None
            inputs = [conv.inputs[0], conv.inputs[1], bias] + ([z] if z is not None else [])
            attributes = [ir.Attr(a.name, a.type, a.value) for a in conv.attributes.values()]
            if activation is not None:
                attributes.append(ir.AttrString("activation", activation[0]))
                if activation[1]:
                    attributes.append(ir.AttrFloat32s("activation_params", activation[1]))
            fused = ir.Node(
                FUSED_DOMAIN,
                "FusedConv",
                inputs,
                attributes,
                num_outputs=1,
                version=FUSED_VERSION,
                name=conv.name,
            )
            _replace_chain(graph, chain, fused, value)
            self.fused.extend((node.name, conv.name) for node in chain[1:])
        if self.fused:
            model.opset_imports.setdefault(FUSED_DOMAIN, FUSED_VERSION)
        return ir.passes.PassResult(model, bool(self.fused))


class FuseChannelScale(_FusingPass):
    """Fold ``Mul(x, s)``, ``s`` one scale per channel (``[N, C, 1, 1]``), into the Conv that
    alone reads it: a ``pkg.nxrt::FusedConv`` with input ``S``.

    That is how a squeeze-and-excitation block (MobileNetV3, EfficientNet) ends:
    the block's input times its channel gates, then the 1x1 projection. The
    kernel scales the weights instead (``filters x channels`` multiplies, not a
    read and a write of the whole activation). Runs after
    :class:`FuseConvActivation`, so the Conv may already be fused.
    """

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        if not self.has("FusedConv"):
            return ir.passes.PassResult(model, False)
        graph = model.graph
        for conv in list(graph):
            fused_conv = conv.op_type == "FusedConv" and conv.domain == FUSED_DOMAIN
            if not (fused_conv or _standard(conv, "Conv")) or conv.graph is not graph:
                continue
            if len(conv.inputs) > 4 or not conv.inputs or conv.inputs[0] is None:
                continue
            mul = conv.inputs[0].producer()
            if mul is None or not _standard(mul, "Mul") or mul.graph is not graph:
                continue
            if _only_user(mul.outputs[0], graph) is not conv or len(mul.inputs) != 2:
                continue
            split = _channel_scale(mul)
            if split is None:
                continue
            x, scale = split
            inputs = list(conv.inputs) + [None] * (4 - len(conv.inputs))
            inputs[0] = x
            attributes = [ir.Attr(a.name, a.type, a.value) for a in conv.attributes.values()]
            fused = ir.Node(
                FUSED_DOMAIN,
                "FusedConv",
                [*inputs, scale],
                attributes,
                num_outputs=1,
                version=FUSED_VERSION,
                name=conv.name,
            )
            _replace_chain(graph, [mul, conv], fused, conv.outputs[0])
            self.fused.append((mul.name, conv.name))
        if self.fused:
            model.opset_imports.setdefault(FUSED_DOMAIN, FUSED_VERSION)
        return ir.passes.PassResult(model, bool(self.fused))


def _channel_scale(mul: ir.Node) -> tuple[ir.Value, ir.Value] | None:
    """``(x, s)`` of a Mul whose one operand ``x`` is ``[N, C, ...]`` and other ``s`` one
    value per channel (``[N or 1, C, 1, ...]``) of the same dtype; ``None`` otherwise."""
    for x, scale in (mul.inputs, reversed(mul.inputs)):
        shape, per = _static_shape(x), _static_shape(scale)
        if x is None or scale is None or shape is None or per is None:
            continue
        if len(shape) < 3 or len(per) != len(shape):
            continue
        if x.dtype != scale.dtype or shape != _static_shape(mul.outputs[0]):
            continue
        if per[0] in (1, shape[0]) and per[1] == shape[1] and all(d == 1 for d in per[2:]):
            return x, scale
    return None


class FuseMatMulAdd(_FusingPass):
    """Fold the bias Add (and an activation) that follows a MatMul by constant weights.

    A 2-D product becomes a standard Gemm; a batched one (a transformer's
    ``[batch, sequence, hidden]`` activations) a ``pkg.nxrt::FusedMatMul``
    when the first EP has it. Either way the bias is added in place instead
    of through a second full-size array.
    """

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graph = model.graph
        fused_ok = self.has("FusedMatMul")
        for matmul in list(graph):
            if not _standard(matmul, "MatMul") or matmul.graph is not graph:
                continue
            a, b = matmul.inputs[0], matmul.inputs[1]
            weights = _constant(b)
            add = _only_user(matmul.outputs[0], graph)
            if weights is None or weights.ndim != 2 or weights.dtype.kind != "f":
                continue
            if add is None or not _standard(add, "Add"):
                continue
            other = add.inputs[1] if add.inputs[0] is matmul.outputs[0] else add.inputs[0]
            bias = _constant(other)
            n = weights.shape[1]
            if other is None or bias is None or bias.size != n or bias.dtype != weights.dtype:
                continue
            if bias.ndim > 1 and bias.shape[-1] != n:
                continue
            a_shape = a.shape if a is not None else None
            rank = len(a_shape) if a_shape is not None else None
            out_rank = len(add.outputs[0].shape) if add.outputs[0].shape is not None else None
            if bias.ndim > (out_rank or 1):
                continue
            chain, value = [matmul, add], add.outputs[0]
            flat_bias = bias.reshape(n)
            if rank == 2 and model.opset_imports.get("", 0) >= 7:  # Gemm broadcasts C from 7
                bias_value = other
                if bias.ndim != 1:
                    bias_value = _new_initializer(graph, f"{other.name}_flat", flat_bias)
                fused = ir.Node("", "Gemm", [a, b, bias_value], num_outputs=1, name=matmul.name)
            elif fused_ok and rank is not None and rank > 2:
                activation, attributes = None, []
                if (fused_activation := _fused_activation(value, graph)) is not None:
                    nodes, value, activation = fused_activation
                    chain.extend(nodes)
                if activation is not None:
                    attributes.append(ir.AttrString("activation", activation[0]))
                    if activation[1]:
                        attributes.append(ir.AttrFloat32s("activation_params", activation[1]))
                bias_value = other
                if bias.ndim != 1:
                    bias_value = _new_initializer(graph, f"{other.name}_flat", flat_bias)
                fused = ir.Node(
                    FUSED_DOMAIN,
                    "FusedMatMul",
                    [a, b, bias_value],
                    attributes,
                    num_outputs=1,
                    version=FUSED_VERSION,
                    name=matmul.name,
                )
                model.opset_imports.setdefault(FUSED_DOMAIN, FUSED_VERSION)
            else:
                continue
            _replace_chain(graph, chain, fused, value)
            self.fused.extend((node.name, matmul.name) for node in chain[1:])
        return ir.passes.PassResult(model, bool(self.fused))


class TransposeGemmWeights(ir.passes.InPlacePass):
    """Store the constant ``B`` of a ``transB=1`` Gemm transposed, and clear ``transB``.

    torch exports every Linear layer as ``Gemm(x, W, b, transB=1)``. OpenBLAS
    multiplies by a transposed operand more slowly when the product has few
    rows (measured, one thread: [8, 256] x [256, 256] 42 against 10 µs,
    [8, 768] x [768, 768] 371 against 168 µs; 5-10% at 197 rows), so the
    weights are transposed once here; the product is the same sum of the same
    terms. Weights another node also reads are left as they are (a second copy
    would double their memory), and so are those of a Gemm known to have one row
    (a classifier at batch 1): its matrix-vector product reads the weights faster
    as they are with two threads (measured, [1, 768] x [768, 3072]: 61 against 74 µs).
    """

    def __init__(self) -> None:
        super().__init__()
        self.transposed: list[str | None] = []

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graph = model.graph
        for gemm in list(graph):
            if not _standard(gemm, "Gemm") or len(gemm.inputs) < 2:
                continue
            trans = gemm.attributes.get("transB")
            weights = gemm.inputs[1]
            if trans is None or not trans.value or weights is None:
                continue
            array = _constant(weights)
            if array is None or array.ndim != 2 or array.dtype.kind != "f":
                continue
            if len(list(weights.uses())) != 1 or weights in graph.outputs:
                continue
            if weights in graph.inputs or weights.name not in graph.initializers:
                continue
            if _rows(gemm) == 1:
                continue
            transposed = _new_initializer(graph, f"{weights.name}_t", np.ascontiguousarray(array.T))
            gemm.replace_input_with(1, transposed)
            gemm.attributes["transB"] = ir.AttrInt64("transB", 0)
            graph.initializers.pop(cast(str, weights.name))  # an initializer's: named
            self.transposed.append(gemm.name)
        return ir.passes.PassResult(model, bool(self.transposed))


def _rows(gemm: ir.Node) -> int | None:
    """The row count of a Gemm's product, when shape inference fixed it."""
    shape = _static_shape(gemm.inputs[0])
    if shape is None or len(shape) != 2:
        return None
    trans = gemm.attributes.get("transA")
    return shape[1] if trans is not None and trans.value else shape[0]


def cpu_passes(ep: ExecutionProvider) -> list[ir.passes.PassBase]:
    """The cpu EP's fusions, in the order they build on each other."""

    def supports(domain: str, op_type: str) -> bool:
        return ep.ops is not None and ep.ops.lookup(domain, op_type, 1) is not None

    def has_kernel(domain: str, op_type: str) -> bool:  # at any opset
        return ep.ops is not None and ep.ops.lookup(domain, op_type, _ANY_OPSET) is not None

    def evaluate(node: ir.Node, opset: int) -> list[Any] | None:
        """A node of constants computed once by its numpy kernel (no compiled one is built
        for a node about to disappear)."""
        entry = ep.ops.lookup(node.domain, node.op_type, opset) if ep.ops is not None else None
        if entry is None:
            return None
        inputs = [  # the inputs of a node folded are constants
            cast("ir.TensorProtocol", v.const_value).numpy() if v is not None else None
            for v in node.inputs
        ]
        try:
            return list(CpuKernel(entry.fn, attribute_values(node)).compute(inputs))
        except Exception:  # noqa: BLE001 - left in the graph, to fail (or run) at run time
            return None

    return [
        *quant_passes(has_kernel, evaluate),
        FuseConvBatchNorm(),
        FoldChannelAffine(),
        FoldPreActivation(),
        FuseConvActivation(supports),
        FuseChannelScale(supports),
        FuseMatMulAdd(supports),
        TransposeGemmWeights(),
    ]

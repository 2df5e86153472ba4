"""The cpu EP's graph rewrites, contributed through ``nxrt_optimizer_passes``.

Each pass keeps the model's results (to float32 rounding) and only touches
what it proves safe: constants it owns, values no graph output exposes.
Fusions that produce standard ops (Conv+BatchNormalization, MatMul+Add into
Gemm) always run; fusions into nxrt's own ``pkg.nxrt`` ops (FusedConv,
FusedMatMul) run where ``supports(domain, op_type)`` says the EP has a
kernel for the fused op.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import onnx_ir as ir

from nxrt.contrib_ops import DOMAIN as FUSED_DOMAIN
from nxrt.contrib_ops import FUSED_SINCE as FUSED_VERSION
from nxrt.optimizer import constant_array as _constant
from nxrt.optimizer import new_initializer as _new_initializer

if TYPE_CHECKING:
    from nxrt.provider import ExecutionProvider


#: Activations a FusedConv or FusedMatMul applies (ONNX Runtime's FusedConv names).
FUSABLE_ACTIVATIONS = ("Relu", "Clip", "LeakyRelu", "Sigmoid", "Tanh")  # and Gelu, for MatMul


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
        self.fused: list[tuple[str, str]] = []

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
    scale, bias, mean, var = (p.astype(np.float64) for p in params)
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
    return tuple(shape)


def _activation(node: ir.Node) -> tuple[str, list[float]] | None:
    """``(name, params)`` when ``node`` is an activation a fused op can apply in place."""
    if node.domain not in ("", "ai.onnx") or node.op_type not in FUSABLE_ACTIVATIONS:
        return None
    if node.op_type == "LeakyRelu":
        alpha = node.attributes.get("alpha")
        return "LeakyRelu", [float(alpha.value) if alpha is not None else 0.01]
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


def _scalar(value: ir.Value | None, want: float) -> bool:
    """Whether ``value`` is a constant scalar close to ``want`` (exporters round them)."""
    array = _constant(value)
    return array is not None and array.size == 1 and abs(float(array.reshape(())) - want) < 1e-4


def _other_input(node: ir.Node, value: ir.Value) -> ir.Value | None:
    """The input of a two-input node that is not ``value``."""
    if len(node.inputs) != 2:
        return None
    first, second = node.inputs
    return second if first is value else first if second is value else None


def _gelu_chain(value: ir.Value, graph: ir.Graph) -> tuple[list[ir.Node], ir.Value] | None:
    """The nodes of ``0.5 x (1 + erf(x / sqrt 2))`` computed from ``value``, and its result.

    Matches the orders exporters write (``x * 0.5`` first, last, or on the
    ``1 + erf`` factor), and the standard Gelu op (``approximate="none"``).
    """
    uses = [use[0] for use in value.uses()]
    if value in graph.outputs:
        return None
    if len(uses) == 1 and _standard(uses[0], "Gelu"):
        mode = uses[0].attributes.get("approximate")
        return ([uses[0]], uses[0].outputs[0]) if mode is None or mode.value == "none" else None
    if len(uses) != 2 or uses[0] is uses[1]:
        return None
    for scale in uses:
        other = _other_input(scale, value) if _standard(scale, "Div", "Mul") else None
        want = math.sqrt(2.0) if scale.op_type == "Div" else math.sqrt(0.5)
        if other is not None and scale.inputs[0] is value and _scalar(other, want):
            break
    else:
        return None
    erf = _only_user(scale.outputs[0], graph)
    plus = _only_user(erf.outputs[0], graph) if erf is not None and _standard(erf, "Erf") else None
    if (
        plus is None
        or not _standard(plus, "Add")
        or not _scalar(_other_input(plus, erf.outputs[0]), 1.0)
    ):
        return None
    times = next(n for n in uses if n is not scale)
    if not _standard(times, "Mul"):
        return None
    nodes = [scale, erf, plus, times]
    if _other_input(times, value) is plus.outputs[0]:  # x * (1 + erf), then * 0.5
        half = _only_user(times.outputs[0], graph)
        if (
            _only_user(plus.outputs[0], graph) is not times
            or half is None
            or not _standard(half, "Mul")
            or not _scalar(_other_input(half, times.outputs[0]), 0.5)
        ):
            return None
        return [*nodes, half], half.outputs[0]
    if _scalar(_other_input(times, value), 0.5):  # (x * 0.5) * (1 + erf)
        last = _only_user(times.outputs[0], graph)
        if last is None or _only_user(plus.outputs[0], graph) is not last:
            return None
        if not _standard(last, "Mul"):
            return None
        return [*nodes, last], last.outputs[0]
    half = _only_user(plus.outputs[0], graph)  # x * ((1 + erf) * 0.5)
    if (
        half is None
        or not _standard(half, "Mul")
        or not _scalar(_other_input(half, plus.outputs[0]), 0.5)
    ):
        return None
    if (
        _only_user(half.outputs[0], graph) is not times
        or _other_input(times, value) is not half.outputs[0]
    ):
        return None
    return [scale, erf, plus, half, times], times.outputs[0]


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
        self.fused: list[tuple[str, str]] = []

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
                factor, offset = affine
                dtype = _constant(node.inputs[1]).dtype
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
        self.fused: list[tuple[str, str]] = []

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
                bn.inputs[0],
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


class FuseConvActivation(ir.passes.InPlacePass):
    """Turn Conv -> [Add/Sum residual] -> [activation] into one ``pkg.nxrt::FusedConv``.

    The residual input ``Z`` (same shape as the Conv output) and the
    activation are applied in place on the Conv result: each fused node
    saves a pass over the activations and an allocation. Runs after
    :class:`FuseConvBatchNorm`, so ResNet's Conv -> BN -> Add -> Relu
    becomes one node.
    """

    def __init__(self, supports: Callable[[str, str], bool] | None) -> None:
        super().__init__()
        self.supports = supports
        self.fused: list[tuple[str, str]] = []

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        if self.supports is None or not self.supports(FUSED_DOMAIN, "FusedConv"):
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
                    user = _only_user(value, graph)
            if user is not None and (activation := _activation(user)) is not None:
                chain.append(user)
                value = user.outputs[0]
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


class FuseMatMulAdd(ir.passes.InPlacePass):
    """Fold the bias Add (and an activation) that follows a MatMul by constant weights.

    A 2-D product becomes a standard Gemm; a batched one (a transformer's
    ``[batch, sequence, hidden]`` activations) a ``pkg.nxrt::FusedMatMul``
    when the first EP has it. Either way the bias is added in place instead
    of through a second full-size array.
    """

    def __init__(self, supports: Callable[[str, str], bool] | None) -> None:
        super().__init__()
        self.supports = supports
        self.fused: list[tuple[str, str]] = []

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graph = model.graph
        fused_ok = self.supports is not None and self.supports(FUSED_DOMAIN, "FusedMatMul")
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
            if bias is None or bias.size != n or bias.dtype != weights.dtype:
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
                user = _only_user(value, graph)
                activation = _activation(user) if user is not None else None
                attributes = []
                if activation is not None:
                    chain.append(user)
                    value = user.outputs[0]
                elif (gelu := _gelu_chain(value, graph)) is not None:
                    activation = ("Gelu", [])
                    chain.extend(gelu[0])
                    value = gelu[1]
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


def cpu_passes(ep: ExecutionProvider) -> list[ir.passes.PassBase]:
    """The cpu EP's fusions, in the order they build on each other."""

    def supports(domain: str, op_type: str) -> bool:
        return ep.ops is not None and ep.ops.lookup(domain, op_type, 1) is not None

    return [
        FuseConvBatchNorm(),
        FoldChannelAffine(),
        FoldPreActivation(),
        FuseConvActivation(supports),
        FuseMatMulAdd(supports),
    ]

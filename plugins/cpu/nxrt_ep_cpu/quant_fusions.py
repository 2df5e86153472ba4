"""The cpu EP's passes for quantized models: QDQ chains and dynamic quantization into
integer kernels.

``onnxruntime.quantization`` writes two forms. Static QDQ wraps each float op in
DequantizeLinear / QuantizeLinear pairs (int8 weights per channel, uint8
activations); :class:`FoldQdqConv`, :class:`FoldQdqMatMul` and :class:`FoldQdqGemm`
turn ``DQ(x), DQ(w) [, DQ(b)] -> Conv/MatMul/Gemm [-> Relu] -> Q`` into one
QLinearConv, QLinearMatMul or com.microsoft QGemm reading the integers
themselves (the bias as int32 at ``x_scale * w_scale``), as ONNX Runtime's QDQ
transformers do. Dynamic quantization writes ``MatMulInteger -> Cast -> Mul(scale)
[-> Add(bias)]``; :class:`FoldIntegerMatMul` makes it one com.microsoft
MatMulIntegerToFloat, whose kernel rounds exactly as those four ops do, so
that fusion changes no bit. :class:`FoldDequantizedConstants` then folds the
DequantizeLinear of constants no fusion took (core leaves them for these
passes), so what stays float runs on float weights.

Every pass rewrites only what the EP has a kernel for (``supports``) and only
chains whose intermediate values nothing else reads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeGuard, cast

import numpy as np
import onnx_ir as ir

from nxrt.contrib_ops import DOMAIN as NXRT_DOMAIN
from nxrt.pipeline.optimizer import constant_array as _constant
from nxrt.pipeline.optimizer import new_initializer as _new_initializer

MS_DOMAIN = "com.microsoft"
_STANDARD = ("", "ai.onnx")
_BYTES = (np.dtype(np.uint8), np.dtype(np.int8))
_LOWEST = {np.dtype(np.uint8): 0, np.dtype(np.int8): -128}

Supports = Callable[[str, str], bool]
Evaluate = Callable[[ir.Node, int], "list[Any] | None"]


def _standard(node: ir.Node | None, *op_types: str) -> TypeGuard[ir.Node]:
    return node is not None and node.op_type in op_types and node.domain in _STANDARD


def _only_user(value: ir.Value, graph: ir.Graph) -> ir.Node | None:
    """The single node reading ``value``, if it is not also a graph output."""
    uses = list(value.uses())
    if len(uses) != 1 or value in graph.outputs:
        return None
    return uses[0][0]


def _attr(node: ir.Node, name: str, default: Any) -> Any:
    attr = node.attributes.get(name)
    return attr.value if attr is not None else default


class _Quantized:
    """What a DequantizeLinear reads: the integers, their scale, zero point and axis."""

    def __init__(self, node: ir.Node) -> None:
        self.node = node
        self.value = cast(ir.Value, node.inputs[0])  # x: required
        self.scale = node.inputs[1]
        self.zero = node.inputs[2] if len(node.inputs) > 2 else None
        self.axis = _attr(node, "axis", 1)
        self.blocked = _attr(node, "block_size", 0) != 0

    def scale_array(self) -> np.ndarray | None:
        return _constant(self.scale)

    def zero_array(self) -> np.ndarray | None:
        """The zero point as an array (zeros of the integers' type when it is absent); ``None``
        when it is computed at run time."""
        if self.zero is None:
            dtype = self.value.dtype.numpy() if self.value.dtype is not None else np.uint8
            return np.zeros((), dtype)
        return _constant(self.zero)


def _dequantized(value: ir.Value | None, graph: ir.Graph) -> _Quantized | None:
    """The DequantizeLinear producing ``value`` in ``graph``, unblocked, of 8-bit integers."""
    node = value.producer() if value is not None else None
    if not _standard(node, "DequantizeLinear") or node.graph is not graph:
        return None
    found = _Quantized(node)
    dtype = found.value.dtype
    if found.blocked or dtype is None or np.dtype(dtype.numpy()) not in _BYTES:
        return None
    return found


def _per_tensor(q: _Quantized) -> bool:
    """Scale and zero point constant and one value each (an activation's)."""
    scale, zero = q.scale_array(), q.zero_array()
    return scale is not None and zero is not None and scale.size == 1 and zero.size == 1


def _weights(q: _Quantized | None, axis: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """``(integers, scale, zero point)`` of constant weights quantized per tensor or per
    slice of ``axis`` (scale and zero point 1-D along it)."""
    if q is None:
        return None
    values, scale, zero = _constant(q.value), q.scale_array(), q.zero_array()
    if values is None or scale is None or zero is None or scale.dtype != np.float32:
        return None
    if scale.size == 1 and zero.size == 1:
        return values, scale.reshape(()), zero.reshape(())
    rank = values.ndim
    if q.axis % max(rank, 1) != axis % max(rank, 1) or scale.ndim != 1:
        return None
    if scale.size != values.shape[axis] or zero.size not in (1, scale.size):
        return None
    return values, scale, np.broadcast_to(zero.reshape(-1), scale.shape).copy()


def _output_quantizer(value: ir.Value, graph: ir.Graph) -> tuple[list[ir.Node], ir.Node] | None:
    """``([Relu], Q)``: the per-tensor QuantizeLinear alone reading ``value``, through a Relu
    it absorbs (its zero point is its type's lowest value, so saturation is the Relu)."""
    user = _only_user(value, graph)
    passed: list[ir.Node] = []
    if _standard(user, "Relu"):
        passed, user = [user], _only_user(user.outputs[0], graph)
    if not _standard(user, "QuantizeLinear") or user.inputs[0] is not (
        passed[0].outputs[0] if passed else value
    ):
        return None
    scale = _constant(user.inputs[1])
    zero = _constant(user.inputs[2]) if len(user.inputs) > 2 else None
    if scale is None or scale.size != 1 or scale.dtype != np.float32:
        return None
    if zero is None or zero.size != 1 or zero.dtype not in _BYTES:
        return None  # without a zero point the type comes from output_dtype: left alone
    if _attr(user, "block_size", 0) or _attr(user, "output_dtype", 0):
        return None
    if passed and int(zero.reshape(())) != _LOWEST[zero.dtype]:
        return None
    return passed, user


def _int_bias(
    bias: ir.Value | None, graph: ir.Graph, accumulator_scale: np.ndarray
) -> tuple[bool, np.ndarray | None]:
    """``(ok, int32 bias)`` at the accumulator's scale (``x_scale * w_scale``, float32): a
    DequantizeLinear of int32 at that very scale as it is, another constant bias rounded to
    it (as ONNX Runtime's quantizer rounds it)."""
    if bias is None:
        return True, None
    q = bias.producer()
    if _standard(q, "DequantizeLinear") and q.graph is graph:
        found = _Quantized(q)
        values, scale, zero = _constant(found.value), found.scale_array(), found.zero_array()
        if values is None or scale is None or zero is None or values.dtype != np.int32:
            return False, None
        if np.any(zero != 0) or found.blocked:
            return False, None
        values = values.reshape(-1)
        scale = np.broadcast_to(scale.reshape(-1), values.shape)
        if np.array_equal(scale, np.broadcast_to(accumulator_scale, values.shape)):
            return True, values
        real = values.astype(np.float64) * scale.astype(np.float64)
    else:
        real = _constant(bias)
        if real is None or real.dtype.kind != "f":
            return False, None
        real = real.reshape(-1).astype(np.float64)
    rounded = np.rint(real / accumulator_scale.astype(np.float64))
    if not np.all(np.abs(rounded) < 2**31 - 1):
        return False, None
    return True, rounded.astype(np.int32)


class _QuantPass(ir.passes.InPlacePass):
    """A pass making integer ops, only those the EP has kernels for; ``fused`` lists the
    ``(node, into)`` pairs for the partition report."""

    def __init__(self, supports: Supports | None) -> None:
        super().__init__()
        self.supports = supports
        self.fused: list[tuple[str | None, str | None]] = []

    def has(self, domain: str, op_type: str) -> bool:
        return self.supports is not None and self.supports(domain, op_type)

    def replace(
        self,
        graph: ir.Graph,
        chain: list[ir.Node],
        fused: ir.Node,
        result: ir.Value,
        readers: list[_Quantized | None],
    ) -> None:
        """Put ``fused`` where ``chain[0]`` was, give it ``result``'s readers and name, drop
        the chain and the DequantizeLinear nodes nothing reads any more."""
        out = fused.outputs[0]
        out.shape, out.type = result.shape, result.type
        graph.insert_before(chain[0], fused)
        name = result.name
        result.replace_all_uses_with(out, replace_graph_outputs=True)
        for node in reversed(chain):
            graph.remove(node, safe=True)
        out.name = name
        for q in readers:
            if q is not None and q.node.graph is graph and not list(q.node.outputs[0].uses()):
                if q.node.outputs[0] not in graph.outputs:
                    graph.remove(q.node, safe=True)
        self.fused.extend((node.name, fused.name) for node in chain)


def _zero_input(graph: ir.Graph, q: _Quantized, stem: str) -> ir.Value:
    """``q``'s zero point, or a constant zero of its integers' type where it has none."""
    if q.zero is not None:
        return q.zero
    zeros = cast(np.ndarray, q.zero_array())  # zeros of its type: there is no zero point
    return _new_initializer(graph, f"{stem}_zero_point", zeros)


def _shape_of(value: ir.Value | None) -> tuple[int, ...] | None:
    shape = value.shape if value is not None else None
    if shape is None or not all(isinstance(d, int) for d in shape):
        return None
    return cast("tuple[int, ...]", tuple(shape))


def _dequantized_operands(
    node: ir.Node, graph: ir.Graph, *, axis: int, rank: int
) -> tuple[_Quantized, _Quantized, tuple[np.ndarray, np.ndarray, np.ndarray]] | None:
    """A Conv's or MatMul's two dequantized operands, the first per tensor, and the
    second's constant weights (per-channel along ``axis``, of ``rank``); ``None`` when
    the node is not such a pair."""
    x = _dequantized(node.inputs[0], graph)
    wq = _dequantized(node.inputs[1], graph)
    weights = _weights(wq, axis)
    if x is None or wq is None or weights is None or not _per_tensor(x):
        return None
    return (x, wq, weights) if weights[0].ndim == rank else None


class FoldQdqConv(_QuantPass):
    """``DQ(x), DQ(w) [, DQ(b)] -> Conv [-> Relu] -> Q`` into one QLinearConv."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        if not self.has("", "QLinearConv") or model.opset_imports.get("", 0) < 10:
            return ir.passes.PassResult(model, False)
        graph = model.graph
        for conv in list(graph):
            if not _standard(conv, "Conv") or conv.graph is not graph:
                continue
            operands = _dequantized_operands(conv, graph, axis=0, rank=4)
            if operands is None:
                continue
            x, wq, weights = operands
            tail = _output_quantizer(conv.outputs[0], graph)
            if tail is None:
                continue
            passed, q = tail
            w, w_scale, _ = weights
            x_scale = np.float32(cast(np.ndarray, x.scale_array()).reshape(()))  # per tensor
            ok, bias = _int_bias(
                conv.inputs[2] if len(conv.inputs) > 2 else None,
                graph,
                np.broadcast_to(x_scale * w_scale.astype(np.float32), (w.shape[0],)),
            )
            if not ok:
                continue
            stem = conv.name or "conv"
            inputs = [x.value, x.scale, _zero_input(graph, x, f"{stem}_x"), wq.value, wq.scale,
                      _zero_input(graph, wq, f"{stem}_w"), q.inputs[1], q.inputs[2]]  # fmt: skip
            if bias is not None:
                inputs.append(_new_initializer(graph, f"{stem}_bias_int32", bias))
            attributes = [ir.Attr(a.name, a.type, a.value) for a in conv.attributes.values()]
            fused = ir.Node("", "QLinearConv", inputs, attributes, num_outputs=1, name=stem)
            bias_q = conv.inputs[2].producer() if len(conv.inputs) > 2 and conv.inputs[2] else None
            readers = [x, wq, _Quantized(bias_q) if _standard(bias_q, "DequantizeLinear") else None]
            self.replace(graph, [conv, *passed, q], fused, q.outputs[0], readers)
        return ir.passes.PassResult(model, bool(self.fused))


class FoldQdqMatMul(_QuantPass):
    """``DQ(a), DQ(b) -> MatMul -> Q`` into QLinearMatMul, and without the Q into
    com.microsoft MatMulIntegerToFloat (constant 2-D ``b``, per tensor or per column)."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        if model.opset_imports.get("", 0) < 10:
            return ir.passes.PassResult(model, False)
        graph = model.graph
        for matmul in list(graph):
            if not _standard(matmul, "MatMul") or matmul.graph is not graph:
                continue
            operands = _dequantized_operands(matmul, graph, axis=1, rank=2)
            if operands is None:
                continue
            a, bq, weights = operands
            stem = matmul.name or "matmul"
            tail = _output_quantizer(matmul.outputs[0], graph)
            to_integer = tail is not None and not tail[0] and self.has("", "QLinearMatMul")
            to_float = tail is None and self.has(MS_DOMAIN, "MatMulIntegerToFloat")
            if not (to_integer or to_float):
                continue
            a_zero = _zero_input(graph, a, f"{stem}_a")
            b_zero = _zero_input(graph, bq, f"{stem}_b")
            if to_integer:
                assert tail is not None  # to_integer
                q = tail[1]
                inputs = [a.value, a.scale, a_zero, bq.value, bq.scale, b_zero, q.inputs[1],
                          q.inputs[2]]  # fmt: skip
                fused = ir.Node("", "QLinearMatMul", inputs, num_outputs=1, name=stem)
                self.replace(graph, [matmul, q], fused, q.outputs[0], [a, bq])
            else:
                inputs = [a.value, bq.value, a.scale, bq.scale, a_zero, b_zero]
                fused = ir.Node(MS_DOMAIN, "MatMulIntegerToFloat", inputs, num_outputs=1,
                                name=stem)  # fmt: skip
                model.opset_imports.setdefault(MS_DOMAIN, 1)
                self.replace(graph, [matmul], fused, matmul.outputs[0], [a, bq])
        return ir.passes.PassResult(model, bool(self.fused))


class FoldQdqGemm(_QuantPass):
    """``DQ(a), DQ(b) [, DQ(c)] -> Gemm [-> Relu] [-> Q]`` into one com.microsoft QGemm
    (``beta`` 1, ``A`` not transposed, constant 2-D ``B``): quantized output with the Q,
    float32 without."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        if not self.has(MS_DOMAIN, "QGemm"):
            return ir.passes.PassResult(model, False)
        graph = model.graph
        for gemm in list(graph):
            if not _standard(gemm, "Gemm") or gemm.graph is not graph:
                continue
            trans_b = _attr(gemm, "transB", 0)
            if _attr(gemm, "transA", 0) or _attr(gemm, "beta", 1.0) != 1.0:
                continue
            a = _dequantized(gemm.inputs[0], graph)
            bq = _dequantized(gemm.inputs[1], graph)
            weights = _weights(bq, 0 if trans_b else 1)
            if (
                a is None
                or bq is None
                or weights is None
                or not _per_tensor(a)
                or weights[0].ndim != 2
            ):
                continue
            b, b_scale, _ = weights
            n = b.shape[0] if trans_b else b.shape[1]
            a_scale = np.float32(cast(np.ndarray, a.scale_array()).reshape(()))  # per tensor
            c = gemm.inputs[2] if len(gemm.inputs) > 2 else None
            c_shape = _shape_of(c)
            if c is not None and (c_shape is None or int(np.prod(c_shape)) != n):
                continue
            ok, bias = _int_bias(c, graph, np.broadcast_to(a_scale * b_scale, (n,)))
            if not ok:
                continue
            stem = gemm.name or "gemm"
            tail = _output_quantizer(gemm.outputs[0], graph)
            inputs = [a.value, a.scale, _zero_input(graph, a, f"{stem}_a"), bq.value, bq.scale,
                      _zero_input(graph, bq, f"{stem}_b")]  # fmt: skip
            inputs.append(_new_initializer(graph, f"{stem}_bias_int32", bias) if bias is not None
                          else None)  # fmt: skip
            chain: list[ir.Node] = [gemm]
            result = gemm.outputs[0]
            if tail is not None:
                passed, q = tail
                inputs += [q.inputs[1], q.inputs[2]]
                chain += [*passed, q]
                result = q.outputs[0]
            while inputs and inputs[-1] is None:
                inputs.pop()
            attributes = [
                ir.AttrFloat32("alpha", float(_attr(gemm, "alpha", 1.0))),
                ir.AttrInt64("transA", 0),
                ir.AttrInt64("transB", int(trans_b)),
            ]
            fused = ir.Node(MS_DOMAIN, "QGemm", inputs, attributes, num_outputs=1, name=stem)
            model.opset_imports.setdefault(MS_DOMAIN, 1)
            c_q = c.producer() if c is not None else None
            readers = [a, bq, _Quantized(c_q) if _standard(c_q, "DequantizeLinear") else None]
            self.replace(graph, chain, fused, result, readers)
        return ir.passes.PassResult(model, bool(self.fused))


class FoldQdqAdd(_QuantPass):
    """``DQ(a) + DQ(b) [-> Relu] -> Q`` (Add or a two-input Sum, same shapes) into one
    ``pkg.nxrt::QuantizedAdd``: the same float32 operations in one pass (a residual
    connection of a QDQ ResNet)."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        if not self.has(NXRT_DOMAIN, "QuantizedAdd"):
            return ir.passes.PassResult(model, False)
        graph = model.graph
        for add in list(graph):
            if not _standard(add, "Add", "Sum") or add.graph is not graph or len(add.inputs) != 2:
                continue
            a, b = (_dequantized(v, graph) for v in add.inputs)
            if a is None or b is None or not (_per_tensor(a) and _per_tensor(b)):
                continue
            if add.inputs[0] is add.inputs[1]:
                continue
            shape = _shape_of(a.value)
            if shape is None or shape != _shape_of(b.value):
                continue
            user = _only_user(add.outputs[0], graph)
            relu = _standard(user, "Relu")
            q = _only_user(cast(ir.Node, user).outputs[0], graph) if relu else user
            if not _standard(q, "QuantizeLinear") or _attr(q, "block_size", 0):
                continue
            scale = _constant(q.inputs[1])
            zero = _constant(q.inputs[2]) if len(q.inputs) > 2 else None
            if scale is None or scale.size != 1 or zero is None or zero.size != 1:
                continue
            if zero.dtype not in _BYTES or _attr(q, "output_dtype", 0):
                continue
            stem = add.name or "add"
            inputs = [a.value, a.scale, _zero_input(graph, a, f"{stem}_a"), b.value, b.scale,
                      _zero_input(graph, b, f"{stem}_b"), q.inputs[1], q.inputs[2]]  # fmt: skip
            fused = ir.Node(NXRT_DOMAIN, "QuantizedAdd", inputs, [ir.AttrInt64("relu", int(relu))],
                            num_outputs=1, version=1, name=stem)  # fmt: skip
            model.opset_imports.setdefault(NXRT_DOMAIN, 1)
            chain = [add, cast(ir.Node, user), q] if relu else [add, q]
            self.replace(graph, chain, fused, q.outputs[0], [a, b])
        return ir.passes.PassResult(model, bool(self.fused))


#: Ops that only move values (or, for MaxPool, pick among them): between a DQ and a Q of one
#: scale and zero point they may run on the integers themselves.
MOVING_OPS = ("MaxPool", "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze")


class FoldQdqMovement(_QuantPass):
    """``DQ(x) -> op -> Q`` with the same scale and zero point on both sides, ``op`` one of
    :data:`MOVING_OPS`, into ``op`` on the integers: dequantizing is increasing and the Q
    rounds each dequantized value back to its integer, so the result is the same, bit for
    bit (ShuffleNet's channel shuffle, a ResNet's stem MaxPool)."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        opset = model.opset_imports.get("", 0)
        graph = model.graph
        for node in list(graph):
            if not _standard(node, *MOVING_OPS) or node.graph is not graph:
                continue
            if node.op_type == "MaxPool" and opset < 12:  # MaxPool of 8-bit integers from 12
                continue
            if len(node.outputs) > 1 and list(node.outputs[1].uses()):
                continue
            x = _dequantized(node.inputs[0], graph)
            q = _only_user(node.outputs[0], graph)
            if x is None or not _per_tensor(x) or not _standard(q, "QuantizeLinear"):
                continue
            scale = _constant(q.inputs[1])
            zero = _constant(q.inputs[2]) if len(q.inputs) > 2 else None
            if scale is None or zero is None or _attr(q, "output_dtype", 0):
                continue
            x_scale, x_zero = x.scale_array(), x.zero_array()
            assert x_scale is not None and x_zero is not None  # per tensor
            if scale.dtype != x_scale.dtype or zero.dtype != x_zero.dtype:
                continue
            if scale.size != 1 or zero.size != 1:
                continue
            if scale.reshape(()) != x_scale.reshape(()) or zero.reshape(()) != x_zero.reshape(()):
                continue
            attributes = [ir.Attr(a.name, a.type, a.value) for a in node.attributes.values()]
            inputs = [x.value, *node.inputs[1:]]
            fused = ir.Node("", node.op_type, inputs, attributes, num_outputs=1, name=node.name)
            self.replace(graph, [node, q], fused, q.outputs[0], [x])
        return ir.passes.PassResult(model, bool(self.fused))


class FoldIntegerMatMul(_QuantPass):
    """``MatMulInteger(a, B) -> Cast(float) -> Mul(s) [-> Add(bias)]`` (dynamic quantization)
    into one com.microsoft MatMulIntegerToFloat with ``s`` as ``a_scale`` and 1 as
    ``b_scale``: ``float32(acc) * s + bias``, the very roundings of the four ops."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        if not self.has(MS_DOMAIN, "MatMulIntegerToFloat"):
            return ir.passes.PassResult(model, False)
        graph = model.graph
        for matmul in list(graph):
            if not _standard(matmul, "MatMulInteger") or matmul.graph is not graph:
                continue
            b = _constant(matmul.inputs[1])
            if b is None or b.ndim != 2 or b.dtype not in _BYTES:
                continue
            n = b.shape[1]
            cast = _only_user(matmul.outputs[0], graph)
            if not _standard(cast, "Cast") or _attr(cast, "to", 0) != ir.DataType.FLOAT:
                continue
            mul = _only_user(cast.outputs[0], graph)
            if not _standard(mul, "Mul") or len(mul.inputs) != 2:
                continue
            scale = mul.inputs[1] if mul.inputs[0] is cast.outputs[0] else mul.inputs[0]
            if scale is None or scale is cast.outputs[0] or scale.dtype != ir.DataType.FLOAT:
                continue
            if _shape_of(scale) not in ((), (1,), (n,)):
                continue
            chain, result, bias = [matmul, cast, mul], mul.outputs[0], None
            add = _only_user(mul.outputs[0], graph)
            if _standard(add, "Add") and len(add.inputs) == 2:
                other = add.inputs[1] if add.inputs[0] is mul.outputs[0] else add.inputs[0]
                value = _constant(other)
                if value is not None and value.dtype == np.float32 and value.shape == (n,):
                    chain.append(add)
                    result, bias = add.outputs[0], other
            stem = matmul.name or "matmul_integer"
            one = _new_initializer(graph, f"{stem}_one", np.ones((), np.float32))
            inputs = [matmul.inputs[0], matmul.inputs[1], scale, one]
            extra = [matmul.inputs[2] if len(matmul.inputs) > 2 else None,
                     matmul.inputs[3] if len(matmul.inputs) > 3 else None, bias]  # fmt: skip
            while extra and extra[-1] is None:
                extra.pop()
            fused = ir.Node(MS_DOMAIN, "MatMulIntegerToFloat", inputs + extra, num_outputs=1,
                            name=stem)  # fmt: skip
            model.opset_imports.setdefault(MS_DOMAIN, 1)
            self.replace(graph, chain, fused, result, [])
        return ir.passes.PassResult(model, bool(self.fused))


class FoldDequantizedConstants(ir.passes.InPlacePass):
    """Fold every DequantizeLinear of constants that no fusion took into float32 weights,
    computed by the EP's own kernel (``evaluate``)."""

    def __init__(self, evaluate: Evaluate) -> None:
        super().__init__()
        self.evaluate = evaluate
        self.folded: list[str | None] = []

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graph = model.graph
        opset = model.opset_imports.get("", 1)
        for node in list(graph):
            if not _standard(node, "DequantizeLinear") or node.graph is not graph:
                continue
            if not all(v is None or v.const_value is not None for v in node.inputs):
                continue
            results = self.evaluate(node, opset)
            if not results or not isinstance(results[0], np.ndarray):
                continue
            out = node.outputs[0]
            folded = _new_initializer(graph, out.name or "dequantized", results[0])
            out.replace_all_uses_with(folded, replace_graph_outputs=True)
            graph.remove(node, safe=True)
            self.folded.append(node.name)
        return ir.passes.PassResult(model, bool(self.folded))


def quant_passes(supports: Supports | None, evaluate: Evaluate) -> list[ir.passes.PassBase]:
    """The passes above in the order they build on each other (the float fusions after)."""
    return [
        FoldQdqConv(supports),
        FoldQdqMatMul(supports),
        FoldQdqGemm(supports),
        FoldQdqAdd(supports),
        FoldQdqMovement(supports),
        FoldIntegerMatMul(supports),
        FoldDequantizedConstants(evaluate),
    ]

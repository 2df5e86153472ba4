"""Schemas of nxrt's own operators, registered with onnx so its tools know them.

With the schema registered, ``onnx.checker`` validates a
``pkg.nxrt::BlockQuantizedMoE`` node's inputs, types and attributes, and
``onnx.shape_inference`` gives its output a type and shape. Registration
happens when :mod:`nxrt.ort.session` is imported and is idempotent.
"""

from __future__ import annotations

import threading
from typing import Any

import onnx
import onnx.defs
from onnx import helper

#: The one domain of nxrt's own ops: BlockQuantizedMoE and the optimizer's fused ops.
DOMAIN = "pkg.nxrt"
MOE_OP_TYPE = "BlockQuantizedMoE"
MOE_SINCE = 1
ACTIVATIONS = ("relu", "gelu", "silu", "swiglu")

MOE_DOC = """\
Mixture of experts whose expert weights are block-quantised (4 or 8 bits).

Per token t: p = softmax(router_logits[t]); the top_k experts with the largest
p (ties: lower expert index first) are chosen, with weights w = their p,
divided by their sum when normalize_routing_weights is 1. Weights are stored
like torch Linear ([out, in]), quantised in blocks of block_size along `in`:
element = (q - z) * scale, q the stored integer (4-bit: two per byte, the
lower-index element in the low nibble), z the block's zero point or
2^(bits-1) when no zero points are given. h = x W1^T; for swiglu
h = silu(h[:I]) * h[I:] (gate first, then up), otherwise h = act(h) (gelu in
its erf form). y_e = h W2^T and Y[t] = sum of w_e * y_e, in X's type.
F = I, or 2I for swiglu.
"""

_lock = threading.Lock()


def _moe_schema() -> onnx.defs.OpSchema:
    schema = onnx.defs.OpSchema
    param = schema.FormalParameter
    optional = schema.FormalParameterOption.Optional
    attr_type = schema.AttrType

    def required(name: str, kind: Any, doc: str) -> Any:
        return schema.Attribute(name, kind, doc, required=True)

    return schema(
        MOE_OP_TYPE,
        DOMAIN,
        MOE_SINCE,
        MOE_DOC,
        inputs=[
            param("X", "T", "Token activations [T, H]."),
            param("router_logits", "T", "Router logits [T, E]."),
            param("fc1_weight", "T1", "Packed first-layer weights [E, F, H*bits/8]."),
            param("fc1_scales", "T", "First-layer block scales [E, F, H/block_size]."),
            param("fc2_weight", "T1", "Packed second-layer weights [E, H, I*bits/8]."),
            param("fc2_scales", "T", "Second-layer block scales [E, H, I/block_size]."),
            param(
                "fc1_zero_points",
                "T1",
                "First-layer zero points [E, F, H/block_size].",
                param_option=optional,
            ),
            param(
                "fc2_zero_points",
                "T1",
                "Second-layer zero points [E, H, I/block_size].",
                param_option=optional,
            ),
        ],
        outputs=[param("Y", "T", "Output [T, H], in X's type.")],
        type_constraints=[
            ("T", ["tensor(float)", "tensor(float16)"], "Activations, logits and scales."),
            ("T1", ["tensor(uint8)"], "Packed quantised weights and zero points."),
        ],
        attributes=[
            required("top_k", attr_type.INT, "Experts per token (>= 1)."),
            required("bits", attr_type.INT, "Bits per weight: 4 or 8."),
            required("block_size", attr_type.INT, "Quantisation block: a power of two >= 16."),
            required("activation", attr_type.STRING, "relu, gelu, silu or swiglu."),
            schema.Attribute(
                "normalize_routing_weights",
                helper.make_attribute("normalize_routing_weights", 0),
                "1: divide the chosen experts' weights by their sum.",
            ),
        ],
    )


def _dims(type_proto: Any) -> list[int | None] | None:
    if not type_proto.HasField("tensor_type") or not type_proto.tensor_type.HasField("shape"):
        return None
    return [
        d.dim_value if d.HasField("dim_value") else None for d in type_proto.tensor_type.shape.dim
    ]


def _fail(message: str) -> None:
    raise onnx.shape_inference.InferenceError(f"[{DOMAIN}::{MOE_OP_TYPE}] {message}")


def _infer_moe(ctx: Any) -> None:
    """Y has X's type and shape; obvious inconsistencies are reported."""
    x_type = ctx.get_input_type(0)
    if x_type is None:
        return
    attrs = {}
    for name in ("top_k", "bits", "block_size"):
        attr = ctx.get_attribute(name)
        attrs[name] = attr.i if attr is not None else None
    bits, block = attrs["bits"], attrs["block_size"]
    if bits is not None and bits not in (4, 8):
        _fail(f"bits must be 4 or 8, got {bits}")
    if block is not None and (block < 16 or block & (block - 1)):
        _fail(f"block_size must be a power of two >= 16, got {block}")
    if attrs["top_k"] is not None and attrs["top_k"] < 1:
        _fail(f"top_k must be >= 1, got {attrs['top_k']}")
    x_dims = _dims(x_type)
    if x_dims is not None and len(x_dims) != 2:
        _fail(f"X must have rank 2 [T, H], got rank {len(x_dims)}")
    if x_dims and bits and block:
        hidden = x_dims[1]
        fc1 = ctx.get_input_type(2)
        fc1_dims = _dims(fc1) if fc1 is not None else None
        if hidden is not None and hidden % block:
            _fail(f"H={hidden} is not a multiple of block_size={block}")
        if hidden is not None and fc1_dims and len(fc1_dims) == 3 and fc1_dims[2] is not None:
            if fc1_dims[2] != hidden * bits // 8:
                _fail(
                    f"fc1_weight's last dim is {fc1_dims[2]}, expected H*bits/8 = "
                    f"{hidden * bits // 8}"
                )
    out = onnx.TypeProto()
    out.CopyFrom(x_type)
    ctx.set_output_type(0, out)


#: The opset version of the optimizer's fused ops (made at session creation, never by
#: exporters).
FUSED_SINCE = 1
_FLOATS = ["tensor(float)", "tensor(double)", "tensor(float16)"]


def _fused_schemas() -> list[onnx.defs.OpSchema]:
    """``pkg.nxrt::FusedConv`` and ``pkg.nxrt::FusedMatMul`` (see nxrt.pipeline.optimizer)."""
    schema = onnx.defs.OpSchema
    param = schema.FormalParameter
    optional = schema.FormalParameterOption.Optional
    attr_type = schema.AttrType

    def attr(name: str, kind: Any, doc: str, default: Any = None) -> Any:
        if default is None:
            return schema.Attribute(name, kind, doc, required=False)
        return schema.Attribute(name, helper.make_attribute(name, default), doc)

    activation = [
        attr(
            "activation",
            attr_type.STRING,
            "Relu, Clip, LeakyRelu, Sigmoid, Tanh, HardSigmoid, HardSwish, Swish, Gelu, "
            "FastGelu (GELU's tanh form) or ''.",
            "",
        ),
        attr(
            "activation_params",
            attr_type.FLOATS,
            "Clip: min, max; LeakyRelu: alpha; HardSigmoid: alpha, beta; Swish: alpha.",
        ),
    ]
    conv = schema(
        "FusedConv",
        DOMAIN,
        FUSED_SINCE,
        "activation(Conv(X * S, W, B) + Z): a Conv with the per-channel scale Mul before it "
        "and the residual Add and the activation after it fused in.",
        inputs=[
            param("X", "T", "Input, as Conv's."),
            param("W", "T", "Weights, as Conv's."),
            param("B", "T", "Bias per output channel.", param_option=optional),
            param("Z", "T", "Added to the Conv result (same shape).", param_option=optional),
            param(
                "S",
                "T",
                "Scale of each input channel, (N, C, 1, ...) or (1, C, 1, ...): the Conv reads "
                "X * S (a squeeze-and-excitation block's output).",
                param_option=optional,
            ),
        ],
        outputs=[param("Y", "T", "Output, as Conv's.")],
        type_constraints=[("T", _FLOATS, "Floating-point tensors.")],
        attributes=[
            *activation,
            attr("auto_pad", attr_type.STRING, "As Conv's.", "NOTSET"),
            attr("dilations", attr_type.INTS, "As Conv's."),
            attr("group", attr_type.INT, "As Conv's.", 1),
            attr("kernel_shape", attr_type.INTS, "As Conv's."),
            attr("pads", attr_type.INTS, "As Conv's."),
            attr("strides", attr_type.INTS, "As Conv's."),
        ],
    )
    matmul = schema(
        "FusedMatMul",
        DOMAIN,
        FUSED_SINCE,
        "activation(MatMul(A, B) + bias), bias along the last axis: a MatMul with the "
        "bias Add (and activation) after it fused in.",
        inputs=[
            param("A", "T", "Left operand, as MatMul's."),
            param("B", "T", "Right operand, 2-D weights."),
            param("bias", "T", "Bias of length N.", param_option=optional),
        ],
        outputs=[param("Y", "T", "Output, as MatMul's.")],
        type_constraints=[("T", _FLOATS, "Floating-point tensors.")],
        attributes=activation,
    )
    return [conv, matmul]


def _infer_same_type(ctx: Any) -> None:
    """The output has the first input's element type (its shape is left to the runtime)."""
    x_type = ctx.get_input_type(0)
    if x_type is None or not x_type.HasField("tensor_type"):
        return
    out = onnx.TypeProto()
    out.tensor_type.elem_type = x_type.tensor_type.elem_type
    ctx.set_output_type(0, out)


def register() -> None:
    """Register every nxrt operator schema with onnx (once per process)."""
    with _lock:
        if not onnx.defs.has(MOE_OP_TYPE, MOE_SINCE, DOMAIN):
            schema = _moe_schema()
            schema.set_type_and_shape_inference_function(_infer_moe)
            onnx.defs.register_schema(schema)
        for fused in _fused_schemas():
            if not onnx.defs.has(fused.name, FUSED_SINCE, DOMAIN):
                fused.set_type_and_shape_inference_function(_infer_same_type)
                onnx.defs.register_schema(fused)


register()

__all__ = [
    "ACTIVATIONS",
    "DOMAIN",
    "FUSED_SINCE",
    "MOE_OP_TYPE",
    "MOE_SINCE",
    "register",
]

"""Transformer benchmark models, built with ``onnx.helper`` from seeded random weights.

* :func:`bert_encoder`: a BERT-base-shaped encoder (12 layers, hidden 768, 12
  heads, sequence 128), written the way ``torch.onnx.export`` writes BERT at
  opset 17: MatMul + Add projections, Reshape/Transpose heads, scaled
  ``Q @ K^T`` with an additive mask from an int64 ``attention_mask``,
  Softmax, erf GELU, LayerNormalization.
* :func:`gpt2_decoder_step`: one decoding step of a GPT-2-small-style decoder
  (12 layers, hidden 768, 12 heads, vocabulary 50257) with a key/value cache
  of ``past`` positions: fused QKV projection, Split, Concat onto the cache,
  tanh GELU, a final LayerNormalization and the language-model head.

The weights are random (``N(0, 0.02)``, seeded), so outputs mean nothing, but
every op sees realistic shapes and value ranges. The models are about 440 MB
and 650 MB: write them to a temporary folder, never into the repository::

    python benchmarks/transformer_models.py --out /tmp/nxrt-bench
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


class _Builder:
    """Nodes and initializers of one graph, with unique names."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = 0

    def name(self, stem: str) -> str:
        self._count += 1
        return f"{stem}_{self._count}"

    def const(self, stem: str, array: np.ndarray) -> str:
        name = self.name(stem)
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def weight(self, stem: str, *shape: int, scale: float = 0.02) -> str:
        array = (self.rng.standard_normal(shape) * scale).astype(np.float32)
        return self.const(stem, array)

    def op(self, op_type: str, inputs: list[str], stem: str = "", **attrs) -> str:
        out = self.name(stem or op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out

    def ops(self, op_type: str, inputs: list[str], count: int, **attrs) -> list[str]:
        outs = [self.name(op_type.lower()) for _ in range(count)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=outs[0], **attrs))
        return outs

    def linear(self, x: str, n_in: int, n_out: int, stem: str) -> str:
        """``x @ W + b``, as exporters write an ``nn.Linear`` on 3-D activations."""
        y = self.op("MatMul", [x, self.weight(f"{stem}_w", n_in, n_out)], stem)
        bias = (self.rng.standard_normal(n_out) * 0.02).astype(np.float32)
        return self.op("Add", [y, self.const(f"{stem}_b", bias)], f"{stem}_add")

    def layer_norm(self, x: str, hidden: int, stem: str) -> str:
        gamma = (1.0 + self.rng.standard_normal(hidden) * 0.02).astype(np.float32)
        beta = (self.rng.standard_normal(hidden) * 0.02).astype(np.float32)
        return self.op(
            "LayerNormalization",
            [x, self.const(f"{stem}_g", gamma), self.const(f"{stem}_b", beta)],
            stem,
            axis=-1,
            epsilon=1e-5,
        )

    def shape(self, *dims: int) -> str:
        return self.const("shape", np.array(dims, dtype=np.int64))

    def scalar(self, value: float) -> str:
        return self.const("scalar", np.array(value, dtype=np.float32))


def bert_encoder(
    layers: int = 12, hidden: int = 768, heads: int = 12, seq: int = 128, seed: int = 0
) -> onnx.ModelProto:
    """A BERT-base-shaped encoder: ``(input_ids, attention_mask) -> last_hidden_state``."""
    b = _Builder(seed)
    head = hidden // heads
    vocab, ffn = 30522, 4 * hidden
    ids = "input_ids"
    emb = b.op("Gather", [b.weight("word_embeddings", vocab, hidden), ids], "embed")
    pos = b.weight("position_embeddings", 1, seq, hidden)
    h = b.layer_norm(b.op("Add", [emb, pos], "embed_add"), hidden, "embed_ln")
    # additive mask: 0 where attended, -10000 where masked, shaped [batch, 1, 1, seq]
    mask = b.op("Cast", ["attention_mask"], "mask_float", to=TensorProto.FLOAT)
    mask = b.op("Sub", [b.scalar(1.0), mask], "mask_inv")
    mask = b.op("Mul", [mask, b.scalar(-10000.0)], "mask_bias")
    mask = b.op("Unsqueeze", [mask, b.const("axes", np.array([1, 2], np.int64))], "mask_4d")
    split_heads = b.shape(1, seq, heads, head)
    merged = b.shape(1, seq, hidden)
    scale = b.scalar(math.sqrt(head))
    for i in range(layers):
        p = f"l{i}"
        q = b.op("Reshape", [b.linear(h, hidden, hidden, f"{p}_q"), split_heads])
        k = b.op("Reshape", [b.linear(h, hidden, hidden, f"{p}_k"), split_heads])
        v = b.op("Reshape", [b.linear(h, hidden, hidden, f"{p}_v"), split_heads])
        q = b.op("Transpose", [q], perm=[0, 2, 1, 3])
        k = b.op("Transpose", [k], perm=[0, 2, 3, 1])
        v = b.op("Transpose", [v], perm=[0, 2, 1, 3])
        scores = b.op("Div", [b.op("MatMul", [q, k], f"{p}_qk"), scale])
        probs = b.op("Softmax", [b.op("Add", [scores, mask])], axis=-1)
        context = b.op("Transpose", [b.op("MatMul", [probs, v], f"{p}_pv")], perm=[0, 2, 1, 3])
        context = b.op("Reshape", [context, merged])
        attn = b.op("Add", [b.linear(context, hidden, hidden, f"{p}_o"), h], f"{p}_res1")
        h = b.layer_norm(attn, hidden, f"{p}_ln1")
        up = b.linear(h, hidden, ffn, f"{p}_ffn1")
        erf = b.op("Erf", [b.op("Div", [up, b.scalar(math.sqrt(2.0))])])
        gelu = b.op("Mul", [b.op("Mul", [up, b.op("Add", [erf, b.scalar(1.0)])]), b.scalar(0.5)])
        down = b.linear(gelu, ffn, hidden, f"{p}_ffn2")
        h = b.layer_norm(b.op("Add", [down, h], f"{p}_res2"), hidden, f"{p}_ln2")
    b.nodes.append(helper.make_node("Identity", [h], ["last_hidden_state"], name="output"))
    graph = helper.make_graph(
        b.nodes,
        "bert_encoder",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, seq]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, seq]),
        ],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, [1, seq, hidden])],
        b.initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def gpt2_decoder_step(
    layers: int = 12,
    hidden: int = 768,
    heads: int = 12,
    past: int = 128,
    vocab: int = 50257,
    positions: int = 1024,
    seed: int = 1,
) -> onnx.ModelProto:
    """One GPT-2 decoding step: ``(input_ids, position_ids, past_*) -> (logits, present_*)``."""
    b = _Builder(seed)
    head = hidden // heads
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, 1]),
        helper.make_tensor_value_info("position_ids", TensorProto.INT64, [1, 1]),
    ]
    outputs = []
    tok = b.op("Gather", [b.weight("wte", vocab, hidden), "input_ids"], "wte_gather")
    pos = b.op("Gather", [b.weight("wpe", positions, hidden, scale=0.01), "position_ids"])
    h = b.op("Add", [tok, pos], "embed")
    split_heads = b.shape(1, 1, heads, head)
    merged = b.shape(1, 1, hidden)
    sizes = b.const("qkv_sizes", np.array([hidden] * 3, np.int64))
    scale = b.scalar(1.0 / math.sqrt(head))
    c1, c2, half = b.scalar(math.sqrt(2.0 / math.pi)), b.scalar(0.044715), b.scalar(0.5)
    one, three = b.scalar(1.0), b.scalar(3.0)
    for i in range(layers):
        p = f"h{i}"
        for kind in ("key", "value"):
            inputs.append(
                helper.make_tensor_value_info(
                    f"past_{kind}_{i}", TensorProto.FLOAT, [1, heads, past, head]
                )
            )
        a = b.layer_norm(h, hidden, f"{p}_ln1")
        qkv = b.linear(a, hidden, 3 * hidden, f"{p}_attn")
        q, k, v = b.ops("Split", [qkv, sizes], 3, axis=-1)
        q, k, v = (
            b.op("Transpose", [b.op("Reshape", [t, split_heads])], perm=[0, 2, 1, 3])
            for t in (q, k, v)
        )
        keys = f"present_key_{i}"
        values = f"present_value_{i}"
        b.nodes.append(helper.make_node("Concat", [f"past_key_{i}", k], [keys], axis=2))
        b.nodes.append(helper.make_node("Concat", [f"past_value_{i}", v], [values], axis=2))
        for name in (keys, values):
            outputs.append(
                helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, heads, past + 1, head])
            )
        scores = b.op("MatMul", [q, b.op("Transpose", [keys], perm=[0, 1, 3, 2])], f"{p}_qk")
        probs = b.op("Softmax", [b.op("Mul", [scores, scale])], axis=-1)
        context = b.op("Transpose", [b.op("MatMul", [probs, values], f"{p}_pv")], perm=[0, 2, 1, 3])
        context = b.op("Reshape", [context, merged])
        h = b.op("Add", [b.linear(context, hidden, hidden, f"{p}_proj"), h], f"{p}_res1")
        m = b.linear(b.layer_norm(h, hidden, f"{p}_ln2"), hidden, 4 * hidden, f"{p}_fc")
        # gelu_new: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        cube = b.op("Mul", [b.op("Pow", [m, three]), c2])
        inner = b.op("Mul", [b.op("Add", [m, cube]), c1])
        gelu = b.op("Mul", [b.op("Mul", [m, half]), b.op("Add", [b.op("Tanh", [inner]), one])])
        h = b.op("Add", [b.linear(gelu, 4 * hidden, hidden, f"{p}_mlp_proj"), h], f"{p}_res2")
    h = b.layer_norm(h, hidden, "ln_f")
    logits = b.op("MatMul", [h, b.weight("lm_head", hidden, vocab)], "lm_head")
    b.nodes.append(helper.make_node("Identity", [logits], ["logits"], name="logits"))
    outputs.insert(0, helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 1, vocab]))
    graph = helper.make_graph(b.nodes, "gpt2_decoder_step", inputs, outputs, b.initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def node_chain(count: int = 1000, width: int = 16) -> onnx.ModelProto:
    """``count`` Add nodes in a row on a ``[1, width]`` tensor: per-node overhead, not work."""
    nodes, previous = [], "x"
    for i in range(count):
        out = "y" if i == count - 1 else f"t{i}"
        nodes.append(helper.make_node("Add", [previous, "c"], [out], name=f"add{i}"))
        previous = out
    const = numpy_helper.from_array(np.full((1, width), 1e-3, np.float32), "c")
    graph = helper.make_graph(
        nodes,
        f"chain_{count}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])],
        [const],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def bert_feeds(seq: int = 128, seed: int = 0, batch: int = 1) -> dict[str, np.ndarray]:
    """Random token ids and a mask that hides the last eighth of the sequence."""
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, seq), np.int64)
    mask[:, seq - seq // 8 :] = 0
    ids = rng.integers(0, 30522, (batch, seq), dtype=np.int64)
    return {"input_ids": ids, "attention_mask": mask}


def gpt2_feeds(
    layers: int = 12, heads: int = 12, past: int = 128, head: int = 64, seed: int = 0
) -> dict[str, np.ndarray]:
    """One token at position ``past``, and a random key/value cache."""
    rng = np.random.default_rng(seed)
    feeds = {
        "input_ids": np.array([[464]], np.int64),
        "position_ids": np.array([[past]], np.int64),
    }
    for i in range(layers):
        for kind in ("key", "value"):
            feeds[f"past_{kind}_{i}"] = rng.standard_normal((1, heads, past, head)).astype(
                np.float32
            )
    return feeds


#: name -> (builder, feeds)
MODELS = {
    "bert_base": (bert_encoder, bert_feeds),
    "gpt2_step": (gpt2_decoder_step, gpt2_feeds),
}


def write(name: str, folder: str) -> str:
    """Build model ``name`` into ``folder`` (once: an existing file is reused); return its path."""
    path = os.path.join(folder, f"{name}.onnx")
    if not os.path.exists(path):
        os.makedirs(folder, exist_ok=True)
        model = MODELS[name][0]()
        onnx.save(model, path + ".tmp")
        os.replace(path + ".tmp", path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder to write the models into")
    args = parser.parse_args(argv)
    for name in MODELS:
        print(write(name, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The light models' outputs compared where they are well-conditioned: their logits.

Shared by the tests that compare whole light models between EPs or kernel tiers.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper


def with_logits(path: str) -> onnx.ModelProto:
    """The model with the input of each Softmax that makes a graph output as an output too.

    The light models' weights are constants (squeezenet's all 0.02), so with the backend
    runner's input their 1000 logits are equal and large (squeezenet: 9.5e9, where a float32
    ulp is 1024): softmax turns a one-ulp difference between two of them into exp(-1024) = 0
    next to 1/992. A BLAS may round equal columns differently (OpenBLAS's Haswell/Zen sgemm
    does, block by block of columns), as two implementations may round any value differently,
    so the probabilities cannot be compared to ONNX Runtime's; the logits, and each EP's softmax
    of its own logits, can (:func:`assert_close_with_logits`).
    """
    model = onnx.load(path)
    outputs = {o.name for o in model.graph.output}
    for node in model.graph.node:
        if node.op_type == "Softmax" and node.output[0] in outputs and node.input[0] not in outputs:
            logits = helper.make_tensor_value_info(node.input[0], TensorProto.FLOAT, None)
            model.graph.output.append(logits)
            outputs.add(node.input[0])
    return model


def softmax_of(x: np.ndarray, node: onnx.NodeProto, opset: int) -> np.ndarray:
    axis = next((a.i for a in node.attribute if a.name == "axis"), -1 if opset >= 13 else 1)
    axis %= x.ndim
    x = x.astype(np.float64)
    flat = x.reshape(int(np.prod(x.shape[:axis])), -1) if opset < 13 else x
    e = np.exp(flat - flat.max(axis=-1 if opset < 13 else axis, keepdims=True))
    return (e / e.sum(axis=-1 if opset < 13 else axis, keepdims=True)).reshape(x.shape)


def assert_close_with_logits(model: onnx.ModelProto, got: list, want: list) -> None:
    """Everything but softmax probabilities close to ``want`` (ONNX Runtime's, or another
    run's); probabilities close to the softmax of ``got``'s own logits (well-conditioned
    whatever the logits are)."""
    names = [o.name for o in model.graph.output]
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    softmaxes = {n.output[0]: n for n in model.graph.node if n.op_type == "Softmax"}
    for name, g, w in zip(names, got, want):
        node = softmaxes.get(name)
        if node is not None and node.input[0] in names:
            logits = got[names.index(node.input[0])]
            np.testing.assert_allclose(g, softmax_of(logits, node, opset), rtol=1e-3, atol=1e-6)
        else:
            np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-4, err_msg=name)

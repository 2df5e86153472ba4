"""Build the small digits model that ``nxrt run`` executes when given no model.

The default model has to ship inside the package, be small, and compute something a
person can check: it classifies scikit-learn's 8x8 handwritten digits (bundled with
scikit-learn, so nothing is downloaded). A tiny convolutional network is trained here in
plain numpy, seeded, so that the result is reproducible, then written by hand with
``onnx.helper`` so that it exercises Conv, MaxPool and Gemm with nothing else attached.

Network (input ``pixels`` [batch, 1, 8, 8], raw pixel values 0..16)::

    Div(16) -> Conv 3x3 (12 channels, pad 1) -> Relu -> MaxPool 2x2
            -> Flatten -> Gemm (192 -> 64) -> Relu -> Gemm (64 -> 10) -> Softmax

Outputs ``probabilities`` [batch, 10]. Writes ``core/nxrt/data/digits_cnn.onnx`` and the
held-out split ``core/nxrt/data/digits_test.npz`` (``pixels`` float32 [N, 1, 8, 8] raw
values, ``labels`` int64 [N]), then checks the saved model with onnxruntime.

Run: ``python scripts/make_default_model.py``
"""

from __future__ import annotations

import os
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from threadpoolctl import threadpool_limits

SEED = 0
TEST_SIZE = 0.25
CHANNELS = 12
HIDDEN = 64
EPOCHS = 40
BATCH = 32
LEARNING_RATE = 2e-3
WEIGHT_DECAY = 1e-4
PIXEL_MAX = 16.0

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA_DIR = os.path.join(ROOT, "core", "nxrt", "data")
MODEL_PATH = os.path.join(DATA_DIR, "digits_cnn.onnx")
TEST_PATH = os.path.join(DATA_DIR, "digits_test.npz")


def im2col(x: np.ndarray) -> np.ndarray:
    """Patches of a 3x3 convolution with padding 1: [B, 1, 8, 8] -> [B, 64, 9]."""
    b = x.shape[0]
    padded = np.pad(x[:, 0], ((0, 0), (1, 1), (1, 1)))
    cols = np.empty((b, 8, 8, 9), dtype=x.dtype)
    for i in range(3):
        for j in range(3):
            cols[:, :, :, i * 3 + j] = padded[:, i : i + 8, j : j + 8]
    return cols.reshape(b, 64, 9)


def init_params(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """He-initialised weights, laid out the way the ONNX graph wants them."""

    def he(shape: tuple[int, ...], fan_in: int) -> np.ndarray:
        return rng.normal(0.0, np.sqrt(2.0 / fan_in), size=shape)

    flat = CHANNELS * 4 * 4
    return {
        "conv_w": he((CHANNELS, 9), 9),
        "conv_b": np.zeros(CHANNELS),
        "fc1_w": he((HIDDEN, flat), flat),
        "fc1_b": np.zeros(HIDDEN),
        "fc2_w": he((10, HIDDEN), HIDDEN),
        "fc2_b": np.zeros(10),
    }


def forward(p: dict[str, np.ndarray], x: np.ndarray) -> tuple[np.ndarray, dict]:
    """Logits for scaled inputs x [B, 1, 8, 8], plus what backward() needs."""
    b = x.shape[0]
    cols = im2col(x)  # [B, 64, 9]
    conv = cols @ p["conv_w"].T + p["conv_b"]  # [B, 64, C]
    conv = conv.transpose(0, 2, 1).reshape(b, CHANNELS, 8, 8)
    relu1 = np.maximum(conv, 0.0)
    windows = relu1.reshape(b, CHANNELS, 4, 2, 4, 2)
    pooled = windows.max(axis=(3, 5))  # [B, C, 4, 4]
    flat = pooled.reshape(b, -1)  # NCHW flatten order, as ONNX Flatten
    h1 = flat @ p["fc1_w"].T + p["fc1_b"]
    relu2 = np.maximum(h1, 0.0)
    logits = relu2 @ p["fc2_w"].T + p["fc2_b"]
    cache = {
        "cols": cols,
        "conv": conv,
        "windows": windows,
        "pooled": pooled,
        "flat": flat,
        "h1": h1,
        "relu2": relu2,
    }
    return logits, cache


def backward(p: dict[str, np.ndarray], cache: dict, dlogits: np.ndarray) -> dict:
    """Gradients of the loss with respect to every parameter."""
    b = dlogits.shape[0]
    g = {
        "fc2_w": dlogits.T @ cache["relu2"],
        "fc2_b": dlogits.sum(0),
    }
    dh1 = (dlogits @ p["fc2_w"]) * (cache["h1"] > 0)
    g["fc1_w"] = dh1.T @ cache["flat"]
    g["fc1_b"] = dh1.sum(0)
    dpooled = (dh1 @ p["fc1_w"]).reshape(b, CHANNELS, 4, 4)
    windows = cache["windows"]
    mask = windows == cache["pooled"][:, :, :, None, :, None]
    drelu1 = (mask * dpooled[:, :, :, None, :, None]).reshape(b, CHANNELS, 8, 8)
    dconv = drelu1 * (cache["conv"] > 0)
    dconv = dconv.reshape(b, CHANNELS, 64).transpose(0, 2, 1)  # [B, 64, C]
    g["conv_w"] = np.einsum("bpc,bpk->ck", dconv, cache["cols"])
    g["conv_b"] = dconv.sum(axis=(0, 1))
    return g


def softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def train(x: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
    """Adam on softmax cross-entropy; x holds scaled pixels [N, 1, 8, 8]."""
    rng = np.random.default_rng(SEED)
    params = init_params(rng)
    m = {k: np.zeros_like(v) for k, v in params.items()}
    v = {k: np.zeros_like(val) for k, val in params.items()}
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    step = 0
    n = x.shape[0]
    onehot = np.eye(10)[y]
    for epoch in range(EPOCHS):
        lr = LEARNING_RATE * 0.5 * (1 + np.cos(np.pi * epoch / EPOCHS))  # cosine decay
        order = rng.permutation(n)
        total = 0.0
        for start in range(0, n, BATCH):
            idx = order[start : start + BATCH]
            logits, cache = forward(params, x[idx])
            probs = softmax(logits)
            total += -np.log(probs[np.arange(len(idx)), y[idx]] + 1e-12).sum()
            grads = backward(params, cache, (probs - onehot[idx]) / len(idx))
            step += 1
            for k in params:
                gk = grads[k] + WEIGHT_DECAY * params[k]
                m[k] = beta1 * m[k] + (1 - beta1) * gk
                v[k] = beta2 * v[k] + (1 - beta2) * gk * gk
                m_hat = m[k] / (1 - beta1**step)
                v_hat = v[k] / (1 - beta2**step)
                params[k] -= lr * m_hat / (np.sqrt(v_hat) + eps)
        if epoch % 10 == 9 or epoch == EPOCHS - 1:
            print(f"epoch {epoch + 1:3d}  loss {total / n:.4f}")
    return params


def build_model(params: dict[str, np.ndarray], metadata: dict[str, str]) -> onnx.ModelProto:
    """Write the trained network as an opset-13 ONNX graph that takes raw pixels."""

    def init(name: str, value: np.ndarray) -> onnx.TensorProto:
        return numpy_helper.from_array(np.asarray(value, dtype=np.float32), name)

    initializers = [
        init("pixel_scale", np.array(PIXEL_MAX)),
        init("conv_w", params["conv_w"].reshape(CHANNELS, 1, 3, 3)),
        init("conv_b", params["conv_b"]),
        init("fc1_w", params["fc1_w"]),
        init("fc1_b", params["fc1_b"]),
        init("fc2_w", params["fc2_w"]),
        init("fc2_b", params["fc2_b"]),
    ]
    nodes = [
        helper.make_node("Div", ["pixels", "pixel_scale"], ["scaled"], name="scale"),
        helper.make_node(
            "Conv",
            ["scaled", "conv_w", "conv_b"],
            ["conv"],
            name="conv",
            kernel_shape=[3, 3],
            pads=[1, 1, 1, 1],
            strides=[1, 1],
        ),
        helper.make_node("Relu", ["conv"], ["conv_relu"], name="conv_relu"),
        helper.make_node(
            "MaxPool", ["conv_relu"], ["pool"], name="pool", kernel_shape=[2, 2], strides=[2, 2]
        ),
        helper.make_node("Flatten", ["pool"], ["flat"], name="flatten", axis=1),
        helper.make_node("Gemm", ["flat", "fc1_w", "fc1_b"], ["fc1"], name="fc1", transB=1),
        helper.make_node("Relu", ["fc1"], ["fc1_relu"], name="fc1_relu"),
        helper.make_node("Gemm", ["fc1_relu", "fc2_w", "fc2_b"], ["logits"], name="fc2", transB=1),
        helper.make_node("Softmax", ["logits"], ["probabilities"], name="softmax", axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "digits_cnn",
        [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, ["batch", 1, 8, 8])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", 10])],
        initializer=initializers,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 13)],
        producer_name="nxrt-make-default-model",
        producer_version="1",
    )
    model.ir_version = 8
    model.doc_string = (
        "Handwritten digit classifier (scikit-learn 8x8 digits). Input 'pixels' "
        "[batch, 1, 8, 8] holds raw pixel values 0..16; output 'probabilities' [batch, 10] "
        "gives the probability of each digit 0..9."
    )
    helper.set_model_props(model, metadata)
    return model


def ort_accuracy(path: str, pixels: np.ndarray, labels: np.ndarray) -> float:
    """Accuracy of the saved model on the held-out set, run through onnxruntime."""
    import onnxruntime as ort

    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    (probs,) = sess.run(None, {"pixels": pixels})
    return float((probs.argmax(axis=1) == labels).mean())


def main() -> None:
    start = time.perf_counter()
    digits = load_digits()
    images = digits.images.astype(np.float32)[:, None, :, :]  # [N, 1, 8, 8], 0..16
    labels = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        images, labels, test_size=TEST_SIZE, random_state=SEED, stratify=labels
    )
    # One BLAS thread keeps the floating-point summation order, hence the result, fixed.
    with threadpool_limits(limits=1):
        params = train(x_train.astype(np.float64) / PIXEL_MAX, y_train)
        logits, _ = forward(params, x_test.astype(np.float64) / PIXEL_MAX)
    numpy_acc = float((logits.argmax(axis=1) == y_test).mean())
    print(f"numpy held-out accuracy: {numpy_acc:.4f}")

    os.makedirs(DATA_DIR, exist_ok=True)
    metadata = {
        "dataset": "scikit-learn load_digits (8x8, 10 classes)",
        "split": f"train_test_split(test_size={TEST_SIZE}, random_state={SEED}, stratified)",
        "train_size": str(len(y_train)),
        "test_size": str(len(y_test)),
        "input_range": "raw pixel values 0..16",
    }
    model = build_model(params, metadata)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, MODEL_PATH)
    accuracy = ort_accuracy(MODEL_PATH, x_test, y_test)
    # Record the accuracy measured on the saved file, then check it survives the rewrite.
    helper.set_model_props(model, {**metadata, "test_accuracy": f"{accuracy:.4f}"})
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, MODEL_PATH)
    np.savez_compressed(TEST_PATH, pixels=x_test, labels=y_test)

    saved = np.load(TEST_PATH)
    check = ort_accuracy(MODEL_PATH, saved["pixels"], saved["labels"])
    if check != accuracy:
        raise RuntimeError(f"saved model gives {check:.4f}, expected {accuracy:.4f}")
    size_kb = os.path.getsize(MODEL_PATH) / 1024
    print(f"wrote {MODEL_PATH} ({size_kb:.1f} KB) and {TEST_PATH} ({len(y_test)} samples)")
    print(f"onnxruntime held-out accuracy: {accuracy:.4f} ({len(y_test)} samples)")
    print(f"done in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()

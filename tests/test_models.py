"""Whole models through the cpu EP: the onnx package's nine light models and the default model."""

from __future__ import annotations

import os
from importlib import resources

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import nxrt

LIGHT_DIR = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
LIGHT_MODELS = [
    "bvlc_alexnet",
    "densenet121",
    "inception_v1",
    "inception_v2",
    "resnet50",
    "shufflenet",
    "squeezenet",
    "vgg19",
    "zfnet512",
]


def dummy_input(arg) -> np.ndarray:
    """The input ONNX's backend runner feeds light models: arange / n."""
    shape = [d if isinstance(d, int) else 1 for d in arg.shape]
    n = int(np.prod(shape))
    return (np.arange(n).reshape(shape) / n).astype(np.float32)


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_model_matches_stored_output_and_onnxruntime(name):
    path = os.path.join(LIGHT_DIR, f"light_{name}.onnx")
    session = nxrt.InferenceSession(path, providers=["cpu"])
    (arg,) = session.get_inputs()
    feeds = {arg.name: dummy_input(arg)}
    (got,) = session.run(None, feeds)
    stored = numpy_helper.to_array(onnx.load_tensor(path.replace(".onnx", "_output_0.pb")))
    options = ort.SessionOptions()
    options.log_severity_level = 3
    (want,) = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(got, stored, rtol=1e-3, atol=1e-4)
    assert {p.ep for p in session.get_partition().nodes} == {"cpu"}


def test_default_model_classifies_held_out_digits():
    data_dir = resources.files("nxrt") / "data"
    model = (data_dir / "digits_cnn.onnx").read_bytes()
    with (data_dir / "digits_test.npz").open("rb") as f:
        data = np.load(f)
        pixels, labels = data["pixels"], data["labels"]
    session = nxrt.InferenceSession(model)
    (probs,) = session.run(None, {"pixels": pixels})
    (want,) = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(
        None, {"pixels": pixels}
    )
    np.testing.assert_allclose(probs, want, rtol=1e-4, atol=1e-5)
    accuracy = (probs.argmax(axis=1) == labels).mean()
    assert accuracy >= 0.95
    metadata = {p.key: p.value for p in onnx.load_from_string(model).metadata_props}
    assert accuracy == pytest.approx(float(metadata["test_accuracy"]), abs=1e-3)

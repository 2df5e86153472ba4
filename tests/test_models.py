"""Whole models through the cpu EP: the onnx package's nine light models and the default model."""

from __future__ import annotations

from importlib import resources

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import nxrt
from nxrt.tools.testing import LIGHT_MODELS, dummy_feeds, light_model_path


@pytest.mark.slow
@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_model_matches_stored_output_and_onnxruntime(name):
    path = light_model_path(name)
    session = nxrt.InferenceSession(path, providers=["cpu"])
    feeds = dummy_feeds(session)
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

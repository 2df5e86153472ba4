"""torchvision's detection post-processing, exported by ``torch.onnx.export``, against ORT.

SSD's ``postprocess_detections`` becomes Softmax, per-class score thresholds
(Greater, NonZero, GatherND), TopK, Gather, one NonMaxSuppression over all
classes (boxes offset per class) and a final Slice: every tie rule of those
ops shows in its output order. The crafted cases repeat logit rows, so many
scores are exactly equal across anchors and across classes, and repeat boxes,
so equal-score boxes overlap; there nxrt must pick what onnxruntime picks.

SSDLite320 itself (seeded random weights) is compared on seeded images with
:func:`assert_same_detections`, which lets two detections trade places when
their scores differ by less than float32 noise (see its docstring).

``tests/regressions/ssd_postprocess_equal_scores_*.npz`` hold an export of
the crafted post-processing for CI, where torch is not installed; rewrite them
with ``python tests/test_torchvision_detection.py``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import warnings

import numpy as np
import pytest

import nxrt

torch = pytest.importorskip("torch")
if importlib.util.find_spec("torchvision") is None:
    pytest.skip("torchvision is not installed", allow_module_level=True)
ort = pytest.importorskip("onnxruntime")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import torch_models  # noqa: E402

pytestmark = pytest.mark.slow

IMAGE = 64  # the crafted cases' image side, in pixels
CLASSES = 4  # the background and three classes


@pytest.fixture(scope="module")
def tv():
    return torch_models.import_torchvision()


def ort_run(path: str, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"]).run(None, feeds)


def export(module, args: tuple, path: str, inputs: list[str]) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notes
        torch.onnx.export(
            module,
            args,
            path,
            input_names=inputs,
            output_names=["boxes", "scores", "labels"],
            opset_version=17,
            dynamo=False,
        )
    return path


# -- the post-processing alone, with exact ties ----------------------------------------------------


def crafted_anchors() -> np.ndarray:
    """``(48, 4)`` boxes: a 4x4 grid of 16-pixel squares 8 pixels apart (neighbours overlap
    at IoU 1/3), each there three times: itself, an exact copy (IoU 1) and one moved 2
    pixels (IoU 7/9, above SSD's 0.55)."""
    boxes = []
    for y in range(4):
        for x in range(4):
            x0, y0 = 8.0 * x + 4, 8.0 * y + 4
            boxes += [(x0, y0, x0 + 16, y0 + 16)] * 2 + [(x0 + 2, y0, x0 + 18, y0 + 16)]
    return np.array(boxes, np.float32)


def crafted_feeds(seed: int) -> dict[str, np.ndarray]:
    """Three integer logit rows shared by the 48 anchors (equal scores across anchors, and
    across classes where a row repeats a logit); box offsets zero (boxes are the anchors)
    or, for odd seeds, quarter steps."""
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, 3, (3, CLASSES)).astype(np.float32)
    logits = rows[rng.integers(0, 3, 48)][None]
    regression = np.zeros((1, 48, 4), np.float32)
    if seed % 2:
        regression = (rng.integers(-2, 3, (1, 48, 4)) / 4).astype(np.float32)
    return {"cls_logits": logits, "bbox_regression": regression}


def postprocess_module(tv):
    """A module that runs SSD's own ``postprocess_detections`` on given head outputs, with
    10 candidates per class and 20 detections kept, so both cuts fall among ties."""
    ssd = tv.models.detection.ssdlite320_mobilenet_v3_large(
        weights=None, weights_backbone=None, num_classes=CLASSES
    )
    ssd.topk_candidates, ssd.detections_per_img = 10, 20
    anchors = torch.from_numpy(crafted_anchors())

    class PostProcess(torch.nn.Module):
        def forward(self, cls_logits, bbox_regression):
            head = {"cls_logits": cls_logits, "bbox_regression": bbox_regression}
            (found,) = ssd.postprocess_detections(head, [anchors], [(IMAGE, IMAGE)])
            return found["boxes"], found["scores"], found["labels"]

    return PostProcess().eval()


@pytest.fixture(scope="module")
def postprocess(tv, tmp_path_factory) -> str:
    feeds = crafted_feeds(0)
    args = tuple(torch.from_numpy(feeds[k]) for k in ("cls_logits", "bbox_regression"))
    path = str(tmp_path_factory.mktemp("ssd") / "postprocess.onnx")
    return export(postprocess_module(tv), args, path, ["cls_logits", "bbox_regression"])


@pytest.mark.parametrize("seed", range(6))
def test_postprocess_with_equal_scores_matches_onnxruntime(postprocess, seed):
    feeds = crafted_feeds(seed)
    want = ort_run(postprocess, feeds)
    got = nxrt.InferenceSession(postprocess, providers=["cpu"]).run(None, feeds)
    scores = want[1]
    assert len(np.unique(scores)) < len(scores), "the case must hold equal scores"
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        if w.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
        else:
            assert g.tolist() == w.tolist()


# -- SSDLite320 ------------------------------------------------------------------------------------


def assert_same_detections(got, want, rtol=1e-3, atol=1e-4, tie=1e-5):
    """``got`` (boxes, scores, labels) are ``want``'s, in its order except among near-ties.

    Scores, sorted, agree within ``rtol``/``atol``. Rows agree one for one, except
    that detections whose scores (onnxruntime's) lie within ``tie`` (relative) of
    each other may come in any order: both runtimes round a 3,000-node network's
    float32 differently (to about 1e-6 relative, torch eager as much), so two
    detections scored 3e-7 apart are ordered by that rounding, not by the model.
    """
    (got_boxes, got_scores, got_labels), (boxes, scores, labels) = got, want
    assert got_boxes.shape == boxes.shape
    np.testing.assert_allclose(got_scores, scores, rtol=rtol, atol=atol)
    start = 0
    while start < len(scores):  # one run of near-equal scores at a time
        stop = start + 1
        while stop < len(scores) and scores[stop - 1] - scores[stop] <= tie * scores[stop]:
            stop += 1
        left = list(range(start, stop))
        for i in range(start, stop):
            match = [
                j
                for j in left
                if got_labels[i] == labels[j]
                and np.allclose(got_boxes[i], boxes[j], rtol=rtol, atol=atol)
            ]
            assert match, (
                f"detection {i} (label {got_labels[i]}, box {got_boxes[i]}, score "
                f"{got_scores[i]}) is not among onnxruntime's rows {start}..{stop - 1}"
            )
            left.remove(match[0])
        start = stop


def ssdlite(tv, calibrate: bool):
    """SSDLite320-MobileNetV3 with seeded random weights. Fresh, BatchNorm's statistics
    shrink the head's input to nothing and every score is 1/91 (all tie); ``calibrate``
    gathers them over random batches, as :func:`torch_models.calibrated` does."""
    torch.manual_seed(0)
    model = tv.models.detection.ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None)
    if calibrate:
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                    module.momentum = None
            model.train()
            for _ in range(4):
                model.head(list(model.backbone(torch.randn(8, 3, 320, 320)).values()))
    return model.eval()


@pytest.fixture(scope="module", params=["calibrated", "fresh"])
def ssdlite_sessions(request, tv, tmp_path_factory):
    model = ssdlite(tv, calibrate=request.param == "calibrated")
    path = str(tmp_path_factory.mktemp("ssdlite") / f"{request.param}.onnx")
    export(model, ([torch.rand(3, 320, 320)],), path, ["image"])
    options = ort.SessionOptions()
    options.log_severity_level = 3
    reference = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    return nxrt.InferenceSession(path, providers=["cpu"]), reference


@pytest.mark.parametrize("seed", range(5))
def test_ssdlite320_matches_onnxruntime(ssdlite_sessions, seed):
    session, reference = ssdlite_sessions
    feeds = {"image": np.random.default_rng(seed).random((3, 320, 320), dtype=np.float32)}
    want = reference.run(None, feeds)
    assert want[0].shape == (300, 4)
    assert_same_detections(session.run(None, feeds), want)


# -- the regression cases CI runs without torch ----------------------------------------------------

#: Regression name and the crafted feeds' seed: boxes equal to the anchors, and offset ones.
REGRESSIONS = {
    "ssd_postprocess_equal_scores_anchor_boxes": 0,
    "ssd_postprocess_equal_scores_offset_boxes": 1,
}
NOTE = (
    "torchvision SSD postprocess_detections (torch.onnx.export, opset 17) on repeated "
    "logit rows and boxes: TopK and NonMaxSuppression ties"
)


def save_regressions(folder: str) -> None:
    """Write the crafted post-processing, each seed's feeds and onnxruntime's outputs as
    regression cases (``tests/test_differential.py`` runs them on the cpu EP)."""
    import tempfile

    import onnx

    from nxrt_fuzz.case import Case
    from nxrt_fuzz.regress import keep

    with tempfile.TemporaryDirectory() as tmp:
        feeds = crafted_feeds(0)
        args = tuple(torch.from_numpy(feeds[k]) for k in ("cls_logits", "bbox_regression"))
        model_path = os.path.join(tmp, "postprocess.onnx")
        export(postprocess_module(torch_models.import_torchvision()), args, model_path, list(feeds))
        model = onnx.load(model_path)
        for name, seed in REGRESSIONS.items():
            source = os.path.join(tmp, f"{name}.npz")
            Case(model, crafted_feeds(seed), note=NOTE).save(source)
            print(keep(source, name, folder))


if __name__ == "__main__":
    save_regressions(os.path.join(os.path.dirname(__file__), "regressions"))

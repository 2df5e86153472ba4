"""Kernels allocate memory linear in their inputs where the op allows, and check big requests.

NonMaxSuppression on a detection model's 27,000 candidate boxes once asked
for a 5.4 GiB IoU matrix; it now keeps one box's overlaps at a time, and a
workspace that does not fit the session's budget (or the machine) is an
:class:`~nxrt.errors.OutOfMemory` raised before anything is allocated.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

import nxrt
from nxrt.errors import OutOfMemory
from nxrt.memory import available_memory, check_allocation
from nxrt_ep_cpu.ops.detection import _box_corners, _keep, greedy_nms

BOXES = 27_000
CLASSES = 91
MiB = 2**20


def nms_model(max_boxes: int, iou: float, score: float) -> bytes:
    consts = {
        "max": np.array([max_boxes], np.int64),
        "iou": np.array([iou], np.float32),
        "score": np.array([score], np.float32),
    }
    graph = helper.make_graph(
        [helper.make_node("NonMaxSuppression", ["boxes", "scores", *consts], ["selected"])],
        "nms",
        [
            helper.make_tensor_value_info("boxes", onnx.TensorProto.FLOAT, [1, BOXES, 4]),
            helper.make_tensor_value_info("scores", onnx.TensorProto.FLOAT, [1, 1, BOXES]),
        ],
        [helper.make_value_info("selected", onnx.TypeProto())],
        [onnx.numpy_helper.from_array(v, k) for k, v in consts.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model.SerializeToString()


def detections(seed: int = 0) -> dict[str, np.ndarray]:
    """Candidates as torchvision's SSD exports them: 91 classes' boxes in one call, each
    class shifted by its own offset so that classes never overlap."""
    rng = np.random.default_rng(seed)
    corner = rng.uniform(0, 300, (BOXES, 2))
    size = rng.uniform(5, 60, (BOXES, 2))
    offset = (np.arange(BOXES) % CLASSES)[:, None] * 400.0
    boxes = np.concatenate([corner + offset, corner + size + offset], axis=1)
    return {
        "boxes": boxes[None].astype(np.float32),
        "scores": rng.uniform(0, 1, (1, 1, BOXES)).astype(np.float32),
    }


def test_nms_at_detection_size_stays_linear_within_a_1_gib_budget():
    model = nms_model(2**40, 0.5, 0.01)
    feeds = detections()
    expected = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    session = nxrt.InferenceSession(model, providers=[("cpu", {"memory_limit": "1GiB"})])
    tracemalloc.start()
    try:
        got = session.run(None, feeds)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(got[0], expected[0])
    assert len(got[0]) > 10_000  # most boxes survive: every kept box was compared
    # an N x N float64 IoU matrix alone would be 27,000**2 * 8 bytes = 5.4 GiB
    assert peak < 128 * MiB, f"peak {peak / MiB:.0f} MiB"


def test_nms_workspace_over_the_budget_is_out_of_memory_before_allocating():
    session = nxrt.InferenceSession(
        nms_model(100, 0.5, 0.0), providers=[("cpu", {"memory_limit": "64KiB"})]
    )
    with pytest.raises(OutOfMemory, match="NonMaxSuppression") as caught:
        session.run(None, detections())
    error = caught.value
    assert error.available == 64 * 1024 and error.requested > error.available


def test_check_allocation_compares_with_the_budget_and_the_machine():
    check_allocation(1024, budget=4096)
    with pytest.raises(OutOfMemory) as caught:
        check_allocation(8192, budget=4096)
    assert (caught.value.requested, caught.value.available) == (8192, 4096)
    machine = available_memory()
    assert machine is not None and machine > 0
    with pytest.raises(OutOfMemory) as caught:
        check_allocation(machine * 4)
    assert caught.value.requested == machine * 4 and caught.value.available <= machine * 2


@pytest.mark.parametrize("seed", range(6))
def test_compiled_nms_keeps_what_the_numpy_reference_keeps(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 300))
    boxes = rng.uniform(0, 50, (n, 4))
    flat = rng.random(n) < 0.1
    boxes[flat, 2] = boxes[flat, 0]  # no height (or no width, with centre boxes): no area
    boxes[rng.random(n) < 0.05, 1] = np.nan
    scores = np.round(rng.uniform(0, 1, n) * 8) / 8  # ties: the lower index goes first
    corners = _box_corners(boxes, center_point_box=int(seed % 2))
    order = np.argsort(-scores, kind="stable")
    for threshold in (0.0, 0.3, 0.7):
        for limit in (1, 5, n):
            want = greedy_nms(corners, order, threshold, limit)
            assert _keep(corners, order, threshold, limit) == want


@pytest.mark.parametrize(
    ("op", "inputs"),
    [
        ("ConstantOfShape", {"shape": np.array([2**20, 2**20, 2**10], np.int64)}),
        ("Expand", {"x": np.ones((1, 1), np.float32), "shape": np.array([2**30, 2**30])}),
        ("Tile", {"x": np.ones((2, 2), np.float32), "repeats": np.array([2**30, 2**30])}),
        (
            "Range",
            {
                "start": np.array(0, np.int64),
                "limit": np.array(2**62, np.int64),
                "delta": np.array(1, np.int64),
            },
        ),
    ],
)
def test_outputs_sized_by_values_are_checked_before_allocating(op, inputs):
    """A small model can ask for an output of any size; one bigger than the machine is an
    OutOfMemory before numpy allocates (with overcommit it would be an OOM kill later)."""
    graph = helper.make_graph(
        [helper.make_node(op, list(inputs), ["y"])],
        "g",
        [],
        [helper.make_value_info("y", onnx.TypeProto())],
        [onnx.numpy_helper.from_array(v, k) for k, v in inputs.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = nxrt.InferenceSession(model.SerializeToString(), providers=["cpu"])
    with pytest.raises(OutOfMemory, match=op) as caught:
        session.run(None, {})
    assert caught.value.requested > (available_memory() or 0)

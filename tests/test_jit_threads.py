"""The cpu EP's own pool (``jit/threads.py``): split GEMMs and batches against numpy, the
same bits whatever threads take the parts, and serial kernels after a fork."""

from __future__ import annotations

import multiprocessing

import numpy as np
import pytest

from nxrt.host_parallel import HostParallel
from nxrt_ep_cpu.jit import threads

RNG = np.random.default_rng(5)
pytestmark = pytest.mark.skipif(threads.team(2) < 2, reason="numba's OpenMP layer is absent")


def _random(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize(
    ("m", "k", "n"),
    [(576, 96, 49), (96, 576, 49), (7, 300, 70), (128, 768, 770), (3, 17, 4000), (1, 2047, 77)],
)
@pytest.mark.parametrize("beta", [0.0, 1.0, 0.5])
@pytest.mark.parametrize("layout", ["plain", "a transposed", "b transposed"])
def test_split_gemm_matches_numpy(m, k, n, beta, layout):
    a, b = _random(m, k), _random(k, n)
    if layout == "a transposed":
        a = np.ascontiguousarray(a.T).T
    if layout == "b transposed":
        b = np.ascontiguousarray(b.T).T
    c = _random(m, n)
    want = a.astype(np.float64) @ b + beta * c
    serial = c.copy()
    assert threads.gemm(a, b, c, beta, 2, 2)
    np.testing.assert_allclose(c, want, rtol=1e-4, atol=1e-3)
    assert threads.gemm(a, b, serial, beta, 2, 1)
    np.testing.assert_array_equal(serial, c, "one thread takes the same parts in turn")


@pytest.mark.parametrize("parts", [2, 3, 4])
@pytest.mark.parametrize(("m", "k", "n"), [(1, 2048, 1000), (49, 576, 64), (300, 64, 12)])
def test_the_threads_taking_the_parts_never_change_the_bits(parts, m, k, n, monkeypatch):
    """One thread, several, or the serial twins a forked child takes: the same bits."""
    a, b = _random(m, k), _random(k, n)
    batch_a, batch_b = _random(6, m, k), _random(6, k, n)
    results, batches = [], []
    for forked in (False, True):
        monkeypatch.setitem(threads._state, "forked", forked)
        for count in (1, 2, parts):
            c = np.empty((m, n), np.float32)
            assert threads.gemm(a, b, c, 0.0, parts, count)
            results.append(c)
            batches.append(threads.matmul(batch_a, batch_b, parts, count))
    for c in results[1:]:
        np.testing.assert_array_equal(c, results[0])
    for c in batches[1:]:
        np.testing.assert_array_equal(c, batches[0])


def test_a_row_times_a_matrix_splits_along_the_depth_keeping_equal_columns_equal():
    """Split by columns, OpenBLAS's sums change at the cut: a uniform row times a uniform
    matrix would no longer give equal values (a softmax after them then picks one)."""
    a = np.full((1, 2048), 3.7e15, np.float32) * (1 + RNG.random((1, 2048), np.float32))
    b = np.full((2048, 1000), 0.013, np.float32)
    c = np.empty((1, 1000), np.float32)
    assert threads.gemm(a, b, c, 0.0, 2, 2)
    assert np.ptp(c) == 0.0
    np.testing.assert_allclose(c, a.astype(np.float64) @ b, rtol=1e-5)


def test_gemm_declines_what_it_does_not_split():
    assert not threads.gemm(_random(4, 4), _random(4, 4), np.zeros((4, 4), np.float32), 0.0, 2, 2)
    assert not threads.gemm(_random(64, 64), _random(64, 64), np.zeros((64, 64)), 0.0, 2, 2)
    one_part = np.zeros((64, 64), np.float32)
    assert not threads.gemm(_random(64, 64), _random(64, 64), one_part, 0, 1, 2)


@pytest.mark.parametrize(
    ("shape_a", "shape_b"),
    [
        ((2, 12, 128, 64), (2, 12, 64, 128)),
        ((12, 50, 64), (12, 64, 30)),
        ((96, 64), (3, 64, 50)),
        ((16, 49, 96), (96, 384)),
    ],
)
def test_matmul_matches_numpy(shape_a, shape_b):
    a, b = _random(*shape_a), _random(*shape_b)
    want = np.matmul(a.astype(np.float64), b)
    np.testing.assert_allclose(threads.matmul(a, b, 2, 2), want, rtol=1e-4, atol=1e-3)
    b_t = np.ascontiguousarray(np.swapaxes(b, -1, -2)).swapaxes(-1, -2)  # as attention's K^T
    np.testing.assert_allclose(threads.matmul(a, b_t, 2, 2), want, rtol=1e-4, atol=1e-3)


def test_matmul_leaves_broadcast_batches_and_other_dtypes_to_numpy():
    assert threads.matmul(_random(2, 1, 5, 7), _random(3, 7, 4), 2, 2) is None
    assert threads.matmul(_random(8, 8).astype(np.float64), _random(8, 8), 2, 2) is None


def test_a_kernel_splits_into_the_sessions_thread_count():
    with HostParallel(2) as parallel:
        assert threads.claim(parallel) == 2
    with HostParallel(1) as parallel:
        assert threads.claim(parallel) == 1


def _in_child(queue, session, feeds) -> None:
    a, b = np.ones((256, 256), np.float32), np.ones((256, 256), np.float32)
    y = threads.matmul(a, b, 2, 2)
    (out,) = session.run(None, feeds)  # kernels made before the fork, for two threads
    queue.put((threads.team(2), y, out))


def test_a_forked_child_runs_serially():
    """GNU OpenMP does not survive a fork: a child's kernels take their serial paths,
    those of a session created before the fork too."""
    from onnx import TensorProto, helper, numpy_helper

    import nxrt

    weights = numpy_helper.from_array(_random(64, 64, 1, 1), "w")
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w"], ["c"]),
            helper.make_node("MatMul", ["c", "c"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 64, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 64, 64])],
        [weights],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    options = nxrt.SessionOptions()
    options.intra_op_num_threads = 2
    session = nxrt.InferenceSession(model.SerializeToString(), options, providers=["cpu"])
    feeds = {"x": _random(1, 64, 64, 64)}
    (want,) = session.run(None, feeds)  # the pool has started
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_in_child, args=(queue, session, feeds))
    child.start()
    team, product, got = queue.get(timeout=120)  # before join: the child flushes it first
    child.join(60)
    assert child.exitcode == 0
    assert team == 1
    np.testing.assert_array_equal(product, np.full((256, 256), 256, np.float32))
    np.testing.assert_array_equal(got, want, "the same parts, taken in turn")


@pytest.mark.parametrize("name", ["Relu", "Sigmoid", "Gelu", "HardSwish"])
def test_activations_split_over_the_pool_match_the_serial_loops(name):
    from nxrt_ep_cpu.jit.elementwise import Activation, add_bias

    activation = Activation(name)
    x, bias = _random(300, 1000), _random(1000)
    serial_map, serial_rows = activation.map(x), x.copy()
    activation.epilogue(serial_rows, bias)
    with HostParallel(2) as parallel:
        threads.claim(parallel)
        split_map = activation.map(x, parallel)
        split_rows = x.copy()
        activation.epilogue(split_rows, bias, parallel)
        plain = x.copy()
        add_bias(plain, bias, parallel)
        in_place = x.copy()
        assert activation(in_place, parallel)
    np.testing.assert_array_equal(split_map, serial_map)
    np.testing.assert_array_equal(split_rows, serial_rows)
    np.testing.assert_array_equal(plain, x + bias)
    serial_in_place = x.copy()
    assert activation(serial_in_place)
    np.testing.assert_array_equal(in_place, serial_in_place)


def test_normalizations_split_over_the_pool_match_the_serial_loops():
    from nxrt_ep_cpu.jit import norm

    x = _random(256, 768)
    scale, bias = _random(768), _random(768)
    images = _random(2, 32, 28, 28)
    channel_scale, channel_bias = _random(32), _random(32)

    def each(parallel):
        return [
            *norm.layer_norm(x, scale, bias, 1e-5, parallel),
            norm.rms_norm(x, scale, 1e-6, parallel),
            norm.group_norm(images, channel_scale, channel_bias, 8, 1e-5, parallel),
            norm.softmax(x, 1, False, parallel),
            norm.softmax(images, 1, True, parallel),  # along an axis that is not the last
        ]

    serial = each(None)
    with HostParallel(2) as parallel:
        threads.claim(parallel)
        split = each(parallel)
    for got, want in zip(split, serial, strict=True):
        np.testing.assert_array_equal(got, want)

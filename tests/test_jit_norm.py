"""The compiled float32 normalizations and softmax against their numpy references and
ONNX Runtime: random inputs with offsets, edge shapes, every axis, NaN and inf."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import nxrt
from nxrt.errors import KernelFailed
from nxrt.host_parallel import HostParallel
from nxrt.tools.testing import make_node_model

pytest.importorskip("numba")

from nxrt_ep_cpu.jit import norm  # noqa: E402
from nxrt_ep_cpu.ops import nn, normalization  # noqa: E402

RTOL = ATOL = 1e-5


@pytest.fixture(params=["serial", "pool"])
def parallel(request, monkeypatch):
    """No pool, or a two-thread pool that every call is split across."""
    if request.param == "serial":
        yield None
        return
    monkeypatch.setattr(norm, "PARALLEL_VALUES", 0)
    with HostParallel(2) as pool:
        yield pool


def _random(shape, offset=0.0, scale=1.0, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * scale + offset).astype(dtype)


def _close(got, want, rtol=RTOL, atol=ATOL):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def _both(op_type, inputs, attrs, opset, outputs=("y",)):
    """(ONNX Runtime's, nxrt's) outputs of a one-node model on the cpu EP."""
    model = make_node_model(op_type, inputs, attrs, opset=opset, outputs=outputs)
    blob = model.SerializeToString()
    options = ort.SessionOptions()
    options.log_severity_level = 3
    want = ort.InferenceSession(blob, options, providers=["CPUExecutionProvider"]).run(None, inputs)
    got = nxrt.InferenceSession(blob, providers=["cpu"]).run(None, inputs)
    return want, got


# -- LayerNormalization -------------------------------------------------------------------------

LAYER_CASES = [
    ((1, 128, 768), -1),
    ((2, 197, 768), 2),
    ((1, 7, 7, 96), -1),
    ((3, 5, 17), 1),  # two normalized axes
    ((3, 5, 17), -2),
    ((4, 33), 0),  # every axis
    ((6, 1), -1),  # inner size 1: Y is the bias
    ((1, 1, 1), -1),
    ((5,), 0),
]


@pytest.mark.parametrize("offset", [0.0, 10.0, 1000.0])
@pytest.mark.parametrize(("shape", "axis"), LAYER_CASES)
def test_layer_norm_matches_reference(shape, axis, offset, parallel):
    x = _random(shape, offset, seed=1)
    inner = x.shape[axis:]
    scale, bias = _random(inner, 1.0, seed=2), _random(inner, seed=3)
    got = normalization._fast_layer_normalization(x, scale, bias, axis=axis, parallel=parallel)
    want = normalization.layer_normalization(x, scale, bias, axis=axis)
    # values differ by their float32 rounding: rounding x itself moves it by offset * 2^-24
    tol = ATOL + abs(offset) * 2e-7
    for g, w in zip(got, want, strict=True):
        _close(g, w, atol=tol * max(1.0, float(np.abs(w).max(initial=0))))


def test_layer_norm_is_accurate_with_a_large_offset():
    """The two-pass variance: a float32 E[x^2] - E[x]^2 would cancel every digit here."""
    x = _random((8, 768), 3000.0, scale=0.01, seed=4)
    y, mean, inv_std = normalization._fast_layer_normalization(x, np.ones(768, np.float32), axis=-1)
    wide = x.astype(np.float64)
    exact_mean = wide.mean(-1, keepdims=True)
    exact_inv = 1 / np.sqrt(wide.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(inv_std, exact_inv, rtol=2e-3)  # mean rounded to 2.4e-4
    np.testing.assert_allclose(mean, exact_mean, rtol=1e-7)
    np.testing.assert_allclose(y, (wide - exact_mean) * exact_inv, atol=0.03)


@pytest.mark.parametrize("epsilon", [1e-5, 1e-12, 0.5])
def test_layer_norm_epsilon_bias_and_broadcast_scale(epsilon):
    x = _random((4, 6, 10), 2.0, seed=5)
    scale = _random((1, 10), seed=6)  # broadcasts over the normalized axes
    for bias in (None, _random((10,), seed=7)):
        got = normalization._fast_layer_normalization(x, scale, bias, axis=1, epsilon=epsilon)
        want = normalization.layer_normalization(x, scale, bias, axis=1, epsilon=epsilon)
        for g, w in zip(got, want, strict=True):
            _close(g, w)


def test_layer_norm_non_float32_and_odd_inputs_keep_the_reference():
    x = _random((3, 8), seed=8, dtype=np.float64)
    scale = _random((8,), seed=9, dtype=np.float64)
    for g, w in zip(
        normalization._fast_layer_normalization(x, scale),
        normalization.layer_normalization(x, scale),
        strict=True,
    ):
        np.testing.assert_array_equal(g, w)
    half = x.astype(np.float16)
    got = normalization._fast_layer_normalization(half, scale.astype(np.float16))
    assert got[0].dtype == np.float16
    # a scale broadcasting over the batch axis too, an empty input, stash_type float64
    x32 = _random((3, 8), seed=10)
    cases = [
        (x32, _random((3, 8), seed=11), {}),
        (np.zeros((0, 8), np.float32), np.ones(8, np.float32), {}),
        (x32, np.ones(8, np.float32), {"stash_type": 11}),
    ]
    for xs, scale32, attrs in cases:
        with np.errstate(invalid="ignore", divide="ignore"):
            got = normalization._fast_layer_normalization(xs, scale32, **attrs)
            want = normalization.layer_normalization(xs, scale32, **attrs)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w)


def test_layer_norm_nan_and_inf_rows():
    x = _random((5, 20), seed=12)
    x[1, 3] = np.nan
    x[2, 0] = np.inf
    x[3, :] = -np.inf
    scale = np.ones(20, np.float32)
    with np.errstate(invalid="ignore"):
        got = normalization._fast_layer_normalization(x, scale)
        want = normalization.layer_normalization(x, scale)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)  # NaN where the reference is


@pytest.mark.parametrize(("shape", "axis"), [((2, 128, 768), -1), ((3, 4, 5, 6), 1), ((5, 1), 1)])
def test_layer_norm_matches_onnxruntime(shape, axis):
    x = _random(shape, 5.0, seed=13)
    inner = x.shape[axis:]
    inputs = {"x": x, "scale": _random(inner, seed=14), "b": _random(inner, seed=15)}
    want, got = _both(
        "LayerNormalization", inputs, {"axis": axis}, 17, outputs=("y", "mean", "inv_std")
    )
    for g, w in zip(got, want, strict=True):
        _close(g, w, atol=2e-5)


# -- RMSNormalization ---------------------------------------------------------------------------


@pytest.mark.parametrize(("shape", "axis"), [((2, 64, 768), -1), ((3, 5, 7), 1), ((4, 1), -1)])
def test_rms_norm_matches_reference_and_onnxruntime(shape, axis, parallel):
    x = _random(shape, 3.0, seed=16)
    scale = _random(x.shape[axis:], seed=17)
    got = normalization._fast_rms_normalization(x, scale, axis=axis, parallel=parallel)
    _close(got, normalization.rms_normalization(x, scale, axis=axis))
    want, (session,) = _both("RMSNormalization", {"x": x, "scale": scale}, {"axis": axis}, 23)
    _close(session, want[0])


# -- GroupNormalization and InstanceNormalization -----------------------------------------------

GROUP_CASES = [
    ((1, 64, 56, 56), 32),
    ((2, 6, 5, 7), 3),
    ((3, 4, 9), 4),
    ((2, 4), 2),
    ((1, 5, 3), 1),
]


@pytest.mark.parametrize(("shape", "groups"), GROUP_CASES)
def test_group_norm_matches_reference(shape, groups, parallel):
    x = _random(shape, 0.5, seed=18)
    c = shape[1]
    scale, bias = _random((c,), 1.0, seed=19), _random((c,), seed=20)
    got = normalization._fast_group_normalization(
        x, scale, bias, num_groups=groups, parallel=parallel
    )
    _close(got, normalization.group_normalization(x, scale, bias, num_groups=groups))
    group_scale, group_bias = scale[:groups], bias[:groups]
    got = normalization._fast_group_normalization_18(
        x, group_scale, group_bias, num_groups=groups, parallel=parallel
    )
    want = normalization.group_normalization_18(x, group_scale, group_bias, num_groups=groups)
    _close(got, want)


def test_group_norm_is_accurate_with_a_large_offset():
    """Two-pass statistics, where the spec's E[x^2] - E[x]^2 in float32 loses the variance."""
    x = _random((2, 8, 6, 6), 100.0, seed=21)
    ones = np.ones(8, np.float32)
    got = normalization._fast_group_normalization(x, ones, ones * 0, num_groups=4)
    wide = x.astype(np.float64).reshape(2, 4, -1)
    exact = (wide - wide.mean(-1, keepdims=True)) / np.sqrt(wide.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(got, exact.reshape(x.shape), atol=2e-5)


@pytest.mark.parametrize("shape", [(1, 64, 56, 56), (2, 3, 5, 7), (2, 3, 1), (1, 2, 3, 4, 5)])
def test_instance_norm_matches_reference_and_onnxruntime(shape, parallel):
    x = _random(shape, 2.0, seed=22)
    scale, bias = _random(shape[1:2], seed=23), _random(shape[1:2], seed=24)
    got = normalization._fast_instance_normalization(x, scale, bias, parallel=parallel)
    _close(got, normalization.instance_normalization(x, scale, bias))
    want, (session,) = _both(
        "InstanceNormalization", {"x": x, "scale": scale, "b": bias}, {"epsilon": 1e-3}, 6
    )
    _close(session, want[0])


@pytest.mark.parametrize(("shape", "groups"), [((2, 8, 5, 5), 4), ((1, 6, 9), 2), ((3, 4), 4)])
def test_group_norm_matches_onnxruntime(shape, groups):
    """Opset 21 (the ONNX checker refuses the deprecated opset 18 form)."""
    x = _random(shape, seed=25)
    c = shape[1]
    inputs = {"x": x, "scale": _random((c,), seed=26), "bias": _random((c,), seed=27)}
    want, (got,) = _both("GroupNormalization", inputs, {"num_groups": groups}, 21)
    _close(got, want[0])


def test_group_and_instance_norm_other_inputs_keep_the_reference():
    x64 = _random((2, 4, 3), seed=28, dtype=np.float64)
    ones = np.ones(4)
    np.testing.assert_array_equal(
        normalization._fast_instance_normalization(x64, ones, ones),
        normalization.instance_normalization(x64, ones, ones),
    )
    np.testing.assert_array_equal(
        normalization._fast_group_normalization(x64, ones, ones, num_groups=2),
        normalization.group_normalization(x64, ones, ones, num_groups=2),
    )
    empty = np.zeros((1, 4, 0), np.float32)
    ones32 = np.ones(4, np.float32)
    with np.errstate(invalid="ignore"), pytest.warns(RuntimeWarning, match="empty slice"):
        got = normalization._fast_group_normalization(empty, ones32, ones32, num_groups=2)
    assert got.shape == empty.shape
    with pytest.raises(KernelFailed, match="must divide"):  # the reference's error
        normalization._fast_group_normalization(
            x64.astype(np.float32), ones32, ones32, num_groups=3
        )


# -- Softmax and LogSoftmax ---------------------------------------------------------------------

SOFTMAX_CASES = [
    ((1, 12, 128, 128), -1),
    ((1, 12, 197, 197), 3),
    ((2, 3, 17), 1),  # along a middle axis
    ((2, 3, 17), 0),
    ((2, 3, 17), -3),
    ((5, 1), 1),  # a single value: 1 (0 for LogSoftmax)
    ((1, 31), 0),
    ((7,), 0),
]


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize(("shape", "axis"), SOFTMAX_CASES)
def test_softmax_matches_reference(shape, axis, log, parallel):
    x = _random(shape, 3.0, scale=4.0, seed=29)
    got = nn._fast_along(x, log=log, axis=axis, parallel=parallel)
    _close(got, (nn.log_softmax if log else nn.softmax)(x, axis=axis), atol=2e-6)
    flat_axis = axis if axis >= 0 else axis + x.ndim
    got = nn._fast_flat(x, log=log, axis=flat_axis, parallel=parallel)
    _close(got, (nn.log_softmax_1 if log else nn.softmax_1)(x, axis=flat_axis), atol=2e-6)


def _special_rows(shape=(6, 9)):
    x = _random(shape, seed=30)
    x[0, 2] = np.inf  # +inf: NaN throughout, as the formula gives
    x[1, :] = -np.inf  # only -inf: NaN
    x[2, 3] = -np.inf  # some -inf: their probability is 0
    x[3, 1] = np.nan
    x[4, :] = np.float32(80.0)  # large equal values: uniform
    x[5, :4] = np.float32(-3e38)
    return x


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("axis", [-1, 0])
def test_softmax_nan_and_inf_follow_the_reference_and_onnxruntime(axis, log):
    x = _special_rows()
    with np.errstate(invalid="ignore", over="ignore"):
        want = (nn.log_softmax if log else nn.softmax)(x, axis=axis)
    got = nn._fast_along(x, log=log, axis=axis)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=2e-6)  # NaN where the reference is
    op_type = "LogSoftmax" if log else "Softmax"
    (runtime,), (session,) = _both(op_type, {"x": x}, {"axis": axis}, 13)
    np.testing.assert_allclose(session, runtime, rtol=RTOL, atol=2e-6)


@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("op_type", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_softmax_matches_onnxruntime(op_type, opset, axis):
    x = _random((3, 12, 33), 1.0, scale=3.0, seed=31)
    (want,), (got,) = _both(op_type, {"x": x}, {"axis": axis}, opset)
    _close(got, want, atol=2e-6)


def test_softmax_other_inputs_keep_the_reference():
    x64 = _random((3, 5), seed=32, dtype=np.float64)
    np.testing.assert_array_equal(nn._fast_along(x64, log=False), nn.softmax(x64))
    np.testing.assert_array_equal(nn._fast_flat(x64, log=True), nn.log_softmax_1(x64))
    half = x64.astype(np.float16)
    np.testing.assert_array_equal(nn._fast_along(half, log=True), nn.log_softmax(half))
    empty = np.zeros((2, 0, 3), np.float32)
    assert nn._fast_along(empty, log=False, axis=1).shape == empty.shape
    scalar = np.float32(2.0).reshape(())
    with pytest.raises(TypeError):  # as the reference (a KernelFailed in a session)
        nn._fast_along(scalar, log=False)


def test_session_kernels_are_compiled():
    x = _random((2, 4), seed=33)
    model = make_node_model("Softmax", {"x": x}, {"axis": -1}, opset=13)
    session = nxrt.InferenceSession(model.SerializeToString(), providers=["cpu"])
    (step,) = session._plan.steps
    assert step.kernel.variant == "numba"

"""The cpu EP's compiled convolution and pooling: each variant against the numpy reference
(``_conv_reference.convolve``, ``pool._reduce_windows``) and against ONNX Runtime."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("numba")

import nxrt  # noqa: E402
from nxrt.host_parallel import HostParallel  # noqa: E402
from nxrt_ep_cpu.ops import pool  # noqa: E402
from nxrt_ep_cpu.ops._conv_gemm import ConvKernel  # noqa: E402
from nxrt_ep_cpu.ops._conv_reference import conv_windows, convolve  # noqa: E402
from nxrt_ep_cpu.ops._spatial import windows  # noqa: E402


def rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, size=shape).astype(np.float32)


def reference(x, w, b, attrs, z=None, activation=None):
    """The numpy reference convolution in float64, then the fused terms."""
    win = conv_windows(x.shape, w.shape, **attrs)
    wide = [None if a is None else a.astype(np.float64) for a in (x, w, b, z)]
    with np.errstate(invalid="ignore"):  # 0 * inf
        y = convolve(wide[0], wide[1], wide[2], win, attrs.get("group", 1))
    if z is not None:
        y = y + wide[3]
    return y if activation is None else activation(y)


def run_kernel(x, w, b, attrs, *, z=None, activation="", params=(), threads=1):
    """One ConvKernel call (on a pool of ``threads``), and the variant it chose."""
    with HostParallel(threads) as parallel:
        kernel = ConvKernel(
            attrs, parallel=parallel, activation=activation, activation_params=params
        )
        y = kernel.run(x, w, b, z)
    return y, kernel.variant


def assert_close(got, want, tol=2e-5):
    assert got.dtype == np.float32
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol, equal_nan=True)


RELU = ("Relu", (), lambda y: np.maximum(y, 0))

# -- depthwise -------------------------------------------------------------------------------

#: (x, w, attrs): kernel sizes, strides, dilations, pads (asymmetric, auto_pad), batch,
#: channel counts that are not a multiple of 16, size-1 spatial axes, channel multipliers.
#: From 16 channels on small maps they run 16 channels at a time (``Blocked``), else
#: plane by plane (``Direct``); most shapes appear both ways.
DEPTHWISE = {
    "3x3": ((1, 17, 12, 12), (17, 1, 3, 3), dict(group=17, pads=[1] * 4)),
    "3x3-few": ((1, 7, 12, 12), (7, 1, 3, 3), dict(group=7, pads=[1] * 4)),
    "3x3-s2": ((3, 5, 13, 12), (5, 1, 3, 3), dict(group=5, pads=[1] * 4, strides=[2, 2])),
    "3x3-s2-blocks": ((3, 37, 13, 12), (37, 1, 3, 3), dict(group=37, pads=[1] * 4, strides=[2, 2])),
    "3x3-s2-odd-pad": (
        (1, 4, 9, 11),
        (4, 1, 3, 3),
        dict(group=4, pads=[1, 0, 0, 1], strides=[2, 2]),
    ),
    "3x3-s2-odd-pad-blocks": (
        (1, 32, 9, 11),
        (32, 1, 3, 3),
        dict(group=32, pads=[1, 0, 0, 1], strides=[2, 2]),
    ),
    "5x5-s2": ((2, 33, 15, 15), (33, 1, 5, 5), dict(group=33, pads=[2] * 4, strides=[2, 2])),
    "5x5-s2-few": ((2, 3, 15, 15), (3, 1, 5, 5), dict(group=3, pads=[2] * 4, strides=[2, 2])),
    "5x5": ((1, 24, 14, 14), (24, 1, 5, 5), dict(group=24, pads=[2] * 4)),
    "7x7": ((1, 20, 14, 14), (20, 1, 7, 7), dict(group=20, pads=[3] * 4)),
    "7x7-small-map": ((2, 48, 7, 7), (48, 1, 7, 7), dict(group=48, pads=[3] * 4)),
    "7x7-small-map-few": ((2, 8, 7, 7), (8, 1, 7, 7), dict(group=8, pads=[3] * 4)),
    "dilated": ((1, 6, 16, 15), (6, 1, 3, 3), dict(group=6, pads=[2] * 4, dilations=[2, 2])),
    "dilated-blocks": (
        (1, 16, 16, 15),
        (16, 1, 3, 3),
        dict(group=16, pads=[2] * 4, dilations=[2, 2]),
    ),
    "dilated-strided": (
        (1, 3, 17, 16),
        (3, 1, 3, 3),
        dict(group=3, dilations=[2, 3], strides=[2, 1]),
    ),
    "dilated-strided-blocks": (
        (1, 18, 17, 16),
        (18, 1, 3, 3),
        dict(group=18, dilations=[2, 3], strides=[2, 1]),
    ),
    "asym-pads": ((1, 7, 10, 9), (7, 1, 3, 2), dict(group=7, pads=[0, 2, 1, 0])),
    "asym-pads-blocks": ((1, 21, 10, 9), (21, 1, 3, 2), dict(group=21, pads=[0, 2, 1, 0])),
    "mixed-strides": ((1, 5, 11, 12), (5, 1, 3, 3), dict(group=5, pads=[1] * 4, strides=[1, 2])),
    "mixed-strides-blocks": (
        (1, 16, 11, 12),
        (16, 1, 3, 3),
        dict(group=16, pads=[1] * 4, strides=[3, 2]),
    ),
    "same-upper": (
        (1, 6, 9, 8),
        (6, 1, 4, 4),
        dict(group=6, auto_pad="SAME_UPPER", strides=[2, 2]),
    ),
    "same-upper-blocks": (
        (1, 26, 9, 8),
        (26, 1, 4, 4),
        dict(group=26, auto_pad="SAME_UPPER", strides=[2, 2]),
    ),
    "same-lower": ((2, 6, 9, 8), (6, 1, 4, 4), dict(group=6, auto_pad="SAME_LOWER")),
    "same-lower-blocks": ((2, 32, 9, 8), (32, 1, 4, 4), dict(group=32, auto_pad="SAME_LOWER")),
    "valid": ((1, 9, 10, 10), (9, 1, 3, 3), dict(group=9, auto_pad="VALID")),
    "valid-blocks": ((1, 17, 10, 10), (17, 1, 3, 3), dict(group=17, auto_pad="VALID")),
    "height-1": ((2, 5, 1, 13), (5, 1, 1, 3), dict(group=5, pads=[0, 1, 0, 1])),
    "height-1-blocks": ((2, 16, 1, 13), (16, 1, 1, 3), dict(group=16, pads=[0, 1, 0, 1])),
    "width-1": ((1, 5, 13, 1), (5, 1, 3, 1), dict(group=5, pads=[1, 0, 1, 0])),
    "width-1-blocks": ((1, 35, 13, 1), (35, 1, 3, 1), dict(group=35, pads=[1, 0, 1, 0])),
    "1x1-map": ((3, 4, 1, 1), (4, 1, 3, 3), dict(group=4, pads=[1] * 4)),
    "1x1-map-blocks": ((3, 20, 1, 1), (20, 1, 3, 3), dict(group=20, pads=[1] * 4)),
    "batch-16": ((16, 19, 8, 8), (19, 1, 3, 3), dict(group=19, pads=[1] * 4)),
    "multiplier-2": ((2, 3, 9, 9), (6, 1, 3, 3), dict(group=3, pads=[1] * 4)),
    "multiplier-2-many": ((2, 20, 9, 9), (40, 1, 3, 3), dict(group=20, pads=[1] * 4)),
    "multiplier-8": ((5, 1, 8, 8), (8, 1, 3, 3), dict(pads=[1] * 4)),
    "tall-band": ((1, 2, 90, 70), (2, 1, 3, 3), dict(group=2, pads=[1] * 4)),
    "wide-map": ((1, 16, 20, 70), (16, 1, 3, 3), dict(group=16, pads=[1] * 4)),
    "1d": ((2, 6, 20), (6, 1, 5), dict(group=6, pads=[2, 2], strides=[2])),
    # maps large enough for ``Blocked`` to move a row at a time (``depthwise_rows``)
    "rows-3x3": ((1, 32, 40, 40), (32, 1, 3, 3), dict(group=32, pads=[1] * 4)),
    "rows-s2-odd": ((2, 20, 45, 37), (20, 1, 3, 3), dict(group=20, pads=[1] * 4, strides=[2, 2])),
    "rows-5x5-dilated": (
        (1, 48, 34, 33),
        (48, 1, 5, 5),
        dict(group=48, pads=[4] * 4, dilations=[2, 2]),
    ),
    "rows-asym-s3": (
        (1, 17, 50, 64),
        (17, 1, 3, 2),
        dict(group=17, pads=[0, 2, 1, 0], strides=[3, 2]),
    ),
    "rows-valid": ((3, 16, 40, 30), (16, 1, 3, 3), dict(group=16, auto_pad="VALID")),
    "1d-blocks": ((2, 22, 20), (22, 1, 5), dict(group=22, pads=[2, 2], strides=[2])),
}


def expected_depthwise_kernel(xs, ws) -> str:
    """The plan class a depthwise shape should run on (see ``_conv_gemm.Blocked``)."""
    return "Blocked" if xs[1] >= 16 and xs[1] == ws[0] and xs[-1] <= 64 else "Direct"


def plan_of(kernel: ConvKernel) -> str:
    (plan,) = kernel._plans.values()
    return type(plan).__name__


@pytest.mark.parametrize("case", sorted(DEPTHWISE))
@pytest.mark.parametrize("bias", [True, False])
def test_depthwise_matches_the_reference(case, bias):
    xs, ws, attrs = DEPTHWISE[case]
    x, w = rand(*xs, seed=1), rand(*ws, seed=2)
    b = rand(ws[0], seed=3) if bias else None
    got, variant = run_kernel(x, w, b, attrs)
    assert variant == "depthwise"
    assert_close(got, reference(x, w, b, attrs))
    kernel = ConvKernel(attrs)
    kernel.run(x, w, b)
    assert plan_of(kernel) == expected_depthwise_kernel(xs, ws)


@pytest.mark.parametrize(
    "case",
    ["3x3", "3x3-few", "5x5-s2", "7x7-small-map", "1d", "1d-blocks", "multiplier-2", "rows-s2-odd"],
)
@pytest.mark.parametrize(
    ("activation", "params", "apply"),
    [
        RELU,
        ("Clip", (0.0, 0.5), lambda y: np.clip(y, 0, 0.5)),
        ("Clip", (), lambda y: np.clip(y, np.finfo(np.float32).min, np.finfo(np.float32).max)),
        ("LeakyRelu", (0.1,), lambda y: np.where(y < 0, 0.1 * y, y)),
        ("Sigmoid", (), lambda y: 1 / (1 + np.exp(-y))),
        # applied by the kernels as they write, like the clamp (``elementwise.FUSED``)
        ("Swish", (), lambda y: y / (1 + np.exp(-y))),
        ("HardSwish", (), lambda y: y * np.clip(y / 6 + 0.5, 0, 1)),
        ("HardSigmoid", (0.3, 0.4), lambda y: np.clip(0.3 * y + 0.4, 0, 1)),
    ],
)
def test_depthwise_fuses_residual_and_activation(case, activation, params, apply):
    xs, ws, attrs = DEPTHWISE[case]
    x, w, b = rand(*xs, seed=1), rand(*ws, seed=2), rand(ws[0], seed=3)
    z = rand(*reference(x, w, b, attrs).shape, seed=4)
    got, _ = run_kernel(x, w, b, attrs, z=z, activation=activation, params=params)
    assert_close(got, reference(x, w, b, attrs, z, apply))
    split, _ = run_kernel(x, w, b, attrs, z=z, activation=activation, params=params, threads=2)
    np.testing.assert_array_equal(split, got)
    broadcast = z[:1, :, :1]  # a residual that broadcasts is added after the convolution
    got, _ = run_kernel(x, w, None, attrs, z=broadcast, activation=activation, params=params)
    assert_close(got, reference(x, w, None, attrs, broadcast, apply))


@pytest.mark.parametrize("case", ["5x5-s2", "5x5-s2-few", "rows-s2-odd"])
def test_depthwise_keeps_nan_and_inf(case):
    xs, ws, attrs = DEPTHWISE[case]
    x, w, b = rand(*xs, seed=1), rand(*ws, seed=2), rand(ws[0], seed=3)
    c = xs[1]
    x[0, 1 % c, 3, 4], x[1, 2 % c, 7, 7], x[1, 5 % c, 0, 0] = np.nan, np.inf, -np.inf
    w[3 % c, 0, 2, 2] = 0.0  # 0 * inf in the reference is NaN: the kernel must agree
    x[0, 3 % c, 6, 6] = np.inf
    got, _ = run_kernel(x, w, b, attrs, activation="Relu")
    want = reference(x, w, b, attrs, activation=RELU[2])
    assert np.isnan(want).any() and np.isinf(want).any()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert_close(got, want)


@pytest.mark.parametrize("width", [30, 120])
def test_depthwise_split_across_the_pool_matches_one_thread(width):
    x, w, b = rand(3, 64, 30, width, seed=1), rand(64, 1, 3, 3, seed=2), rand(64, seed=3)
    attrs = {"group": 64, "pads": [1, 1, 1, 1]}
    split, _ = run_kernel(x, w, b, attrs, activation="Relu", threads=2)
    single, _ = run_kernel(x, w, b, attrs, activation="Relu")
    np.testing.assert_array_equal(split, single)


ROWS = sorted(k for k in DEPTHWISE if k.startswith("rows-"))


@pytest.mark.parametrize("case", ROWS)
@pytest.mark.parametrize("threads", [1, 2])
def test_depthwise_rows_fuse_residual_and_clamp(case, threads):
    """Large maps move a row at a time; over two threads, an odd count of (image, block of
    a vector of channels) items is cut into bands of output rows too."""
    xs, ws, attrs = DEPTHWISE[case]
    x, w, b = rand(*xs, seed=1), rand(*ws, seed=2), rand(ws[0], seed=3)
    z = rand(*reference(x, w, b, attrs).shape, seed=4)
    with HostParallel(threads) as parallel:
        kernel = ConvKernel(
            attrs, parallel=parallel, activation="Clip", activation_params=(-0.2, 0.3)
        )
        got = kernel.run(x, w, b, z)
        (plan,) = kernel._plans.values()
        assert type(plan).__name__ == "Blocked" and plan.rows
        if kernel.team > 1 and (xs[0] * -(-xs[1] // plan.lanes)) % 2:
            assert plan.parts == 2
        single = ConvKernel(attrs, activation="Clip", activation_params=(-0.2, 0.3)).run(x, w, b, z)
    assert_close(got, reference(x, w, b, attrs, z, lambda y: np.clip(y, -0.2, 0.3)))
    np.testing.assert_array_equal(got, single)


# -- few channels per group ------------------------------------------------------------------

DIRECT = {
    "group-2ch": ((1, 16, 14, 14), (16, 2, 3, 3), dict(group=8, pads=[1] * 4)),
    "group-4ch-odd-filters": ((2, 12, 13, 11), (9, 4, 3, 3), dict(group=3, pads=[1] * 4)),
    "group-8ch-s2": ((2, 32, 16, 16), (32, 8, 3, 3), dict(group=4, pads=[1] * 4, strides=[2, 2])),
    "group-16ch": ((1, 32, 28, 28), (32, 16, 3, 3), dict(group=2, pads=[1] * 4)),
    "group-32ch-large-map": ((1, 64, 40, 40), (8, 32, 3, 3), dict(group=2, pads=[1] * 4)),
    "dense-3ch-stem": ((1, 3, 40, 40), (8, 3, 7, 7), dict(pads=[3] * 4, strides=[2, 2])),
    "dense-3ch-5x5": ((3, 3, 20, 17), (5, 3, 5, 5), dict(pads=[2, 1, 2, 3])),
    "dense-dilated": ((1, 4, 12, 30), (6, 4, 3, 3), dict(pads=[1] * 4, dilations=[2, 1])),
    "dense-same": ((2, 5, 15, 16), (7, 5, 3, 3), dict(auto_pad="SAME_LOWER", strides=[2, 2])),
    "batch-16": ((16, 8, 12, 12), (16, 8, 3, 3), dict(pads=[1] * 4)),
    "digits-8x8": ((450, 8, 8, 8), (16, 8, 3, 3), dict(pads=[1] * 4)),
    "1d": ((2, 8, 40), (4, 4, 3), dict(group=2, pads=[1, 1])),
}


@pytest.mark.parametrize("case", sorted(DIRECT))
@pytest.mark.parametrize("bias", [True, False])
def test_direct_matches_the_reference(case, bias):
    xs, ws, attrs = DIRECT[case]
    x, w = rand(*xs, seed=1), rand(*ws, seed=2)
    b = rand(ws[0], seed=3) if bias else None
    got, variant = run_kernel(x, w, b, attrs)
    assert variant == "direct"
    assert_close(got, reference(x, w, b, attrs), tol=5e-5)


@pytest.mark.parametrize("case", ["group-4ch-odd-filters", "dense-3ch-stem", "1d"])
@pytest.mark.parametrize("threads", [1, 2])
def test_direct_fuses_residual_and_activation(case, threads):
    xs, ws, attrs = DIRECT[case]
    x, w, b = rand(*xs, seed=1), rand(*ws, seed=2), rand(ws[0], seed=3)
    z = rand(*reference(x, w, b, attrs).shape, seed=4)
    got, _ = run_kernel(x, w, b, attrs, z=z, activation="Relu", threads=threads)
    assert_close(got, reference(x, w, b, attrs, z, RELU[2]), tol=5e-5)
    got, _ = run_kernel(x, w, b, attrs, z=z, activation="Tanh", threads=threads)
    assert_close(got, reference(x, w, b, attrs, z, np.tanh), tol=5e-5)
    got, _ = run_kernel(x, w, b, attrs, z=z, activation="Swish", threads=threads)
    assert_close(got, reference(x, w, b, attrs, z, lambda y: y / (1 + np.exp(-y))), tol=5e-5)


def test_direct_splits_filters_across_the_pool_for_one_image():
    x, w, b = rand(1, 3, 64, 64, seed=1), rand(30, 3, 3, 3, seed=2), rand(30, seed=3)
    attrs = {"pads": [1, 1, 1, 1], "strides": [2, 2]}
    split, _ = run_kernel(x, w, b, attrs, activation="Sigmoid", threads=2)
    single, _ = run_kernel(x, w, b, attrs, activation="Sigmoid")
    np.testing.assert_array_equal(split, single)


def test_direct_keeps_nan():
    xs, ws, attrs = DIRECT["group-8ch-s2"]
    x, w, b = rand(*xs, seed=1), rand(*ws, seed=2), rand(ws[0], seed=3)
    x[1, 9, 5, 5] = np.nan
    got, _ = run_kernel(x, w, b, attrs)
    want = reference(x, w, b, attrs)
    assert np.isnan(want).sum() > 1
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))


# -- several images per GEMM -----------------------------------------------------------------

BATCHED = {
    "small-8x8": ((450, 24, 8, 8), (16, 24, 3, 3), dict(pads=[1] * 4), "im2col"),
    "digits-4x4": ((450, 16, 4, 4), (16, 16, 3, 3), dict(pads=[1] * 4), "im2col"),
    "resnet-7x7": ((16, 40, 7, 7), (24, 40, 3, 3), dict(pads=[1] * 4), "im2col"),
    "grouped-small-map": ((3, 64, 5, 5), (32, 32, 3, 3), dict(group=2, pads=[1] * 4), "im2col"),
    "strided-asym": (
        (7, 20, 9, 6),
        (4, 20, 3, 2),
        dict(pads=[0, 1, 2, 1], strides=[2, 1]),
        "im2col",
    ),
    "same-upper": (
        (9, 24, 4, 4),
        (5, 24, 3, 3),
        dict(auto_pad="SAME_UPPER", strides=[2, 2]),
        "im2col",
    ),
    "1x1-tiled": ((16, 96, 7, 7), (40, 96, 1, 1), {}, "pointwise-tiled"),
    "1x1-tiled-strided": ((3, 64, 9, 10), (24, 64, 1, 1), dict(strides=[2, 2]), "pointwise-tiled"),
    "1x1-columns": ((16, 96, 3, 3), (40, 96, 1, 1), {}, "pointwise"),
    "1x1-columns-strided": ((3, 64, 5, 6), (24, 64, 1, 1), dict(strides=[2, 2]), "pointwise"),
    "1x1-matmul": ((450, 16, 2, 3), (32, 16, 1, 1), {}, "pointwise"),
    "1x1-grouped": ((5, 8, 6, 6), (6, 4, 1, 1), dict(group=2), "pointwise"),
}


@pytest.mark.parametrize("case", sorted(BATCHED))
@pytest.mark.parametrize("threads", [1, 2])
def test_several_images_per_gemm_match_the_reference(case, threads):
    xs, ws, attrs, variant = BATCHED[case]
    x, w, b = rand(*xs, seed=1), rand(*ws, seed=2), rand(ws[0], seed=3)
    z = rand(*reference(x, w, b, attrs).shape, seed=4)
    got, chosen = run_kernel(x, w, b, attrs, threads=threads)
    assert chosen == variant
    assert_close(got, reference(x, w, b, attrs), tol=1e-4)
    for activation, params, apply in (RELU, ("Clip", (-0.2, 0.3), lambda y: np.clip(y, -0.2, 0.3))):
        got, _ = run_kernel(
            x, w, None, attrs, z=z, activation=activation, params=params, threads=threads
        )
        assert_close(got, reference(x, w, None, attrs, z, apply), tol=1e-4)
    got, _ = run_kernel(x, w, b, attrs, z=z, activation="Sigmoid", threads=threads)
    assert_close(got, reference(x, w, b, attrs, z, lambda y: 1 / (1 + np.exp(-y))), tol=1e-4)


def test_several_images_per_gemm_plan_one_gemm_per_band():
    kernel = ConvKernel({"pads": [1] * 4})
    kernel.run(rand(450, 24, 8, 8), rand(16, 24, 3, 3, seed=1))
    (plan,) = kernel._plans.values()
    assert plan.images > 1 and len(plan.chunks) == -(-450 // plan.images)
    assert "images per GEMM" in kernel.variant_reason


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_other_dtypes_keep_the_numpy_paths(dtype):
    for xs, ws, attrs in (
        DEPTHWISE["5x5-s2"],
        DIRECT["group-4ch-odd-filters"],
        BATCHED["digits-4x4"][:3],
    ):
        x, w, b = (a.astype(dtype) for a in (rand(*xs, seed=1), rand(*ws, seed=2), rand(ws[0])))
        kernel = ConvKernel(attrs, activation="Relu")
        got = kernel.run(x, w, b)
        (plan,) = kernel._plans.values()
        assert type(plan).__name__ != "Direct" and getattr(plan, "jit", None) is None
        assert got.dtype == dtype
        want = reference(x, w, b, attrs, activation=RELU[2])
        tol = 2e-2 if dtype == np.float16 else 1e-6
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


# -- against ONNX Runtime --------------------------------------------------------------------


def conv_model(x_shape, w, b, attrs, activation=None):
    inits = [numpy_helper.from_array(w, "w")]
    inputs = ["x", "w"]
    if b is not None:
        inits.append(numpy_helper.from_array(b, "b"))
        inputs.append("b")
    nodes = [helper.make_node("Conv", inputs, ["c" if activation else "y"], **attrs)]
    if activation == "Relu":
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    elif activation == "Clip":
        inits += [numpy_helper.from_array(np.float32(v), n) for v, n in ((0, "lo"), (6, "hi"))]
        nodes.append(helper.make_node("Clip", ["c", "lo", "hi"], ["y"]))
    graph = helper.make_graph(
        nodes,
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def run_both(model, feeds):
    data = model.SerializeToString()
    expected = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    inferred = onnx.shape_inference.infer_shapes(model).SerializeToString()
    session = nxrt.InferenceSession(inferred, providers=["cpu"])
    return session.run(None, feeds), expected, session


ORT_CASES = {
    **{f"depthwise-{k}": v for k, v in DEPTHWISE.items()},
    **{f"direct-{k}": v for k, v in DIRECT.items()},
    **{f"batched-{k}": v[:3] for k, v in BATCHED.items()},
}


@pytest.mark.parametrize("case", sorted(ORT_CASES))
def test_conv_matches_onnxruntime(case):
    xs, ws, attrs = ORT_CASES[case]
    x, w, b = rand(*xs, seed=5), rand(*ws, seed=6), rand(ws[0], seed=7)
    activation = "Clip" if "depthwise" in case else "Relu"
    got, expected, _ = run_both(conv_model(xs, w, b, attrs, activation), {"x": x})
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "shape, variant",
    [
        ((1, 32, 28, 28), "depthwise"),
        ((4, 16, 9, 9), "depthwise"),
        ((16, 24, 7, 7), "depthwise"),
        ((1, 48, 40, 40), "depthwise"),
    ],
)
def test_fused_depthwise_conv_in_a_session_matches_onnxruntime(shape, variant):
    """Conv -> Add -> Relu, which the optimizer fuses into one FusedConv."""
    c = shape[1]
    w, b = rand(c, 1, 3, 3, seed=1), rand(c, seed=2)
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], group=c, pads=[1] * 4),
        helper.make_node("Add", ["c", "r"], ["s"]),
        helper.make_node("Relu", ["s"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "fused",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape)),
            helper.make_tensor_value_info("r", TensorProto.FLOAT, list(shape)),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    feeds = {"x": rand(*shape, seed=3), "r": rand(*shape, seed=4)}
    got, expected, session = run_both(model, feeds)
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-5, atol=1e-5)
    variants = [getattr(step.kernel, "variant", "") for step in session._plan.steps]
    assert variant in variants


# -- pooling ---------------------------------------------------------------------------------

POOLS = {
    "3x3-s2-pad": ((2, 5, 17, 16), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4)),
    "2x2-s2": ((3, 7, 9, 8), dict(kernel_shape=[2, 2], strides=[2, 2])),
    "3x3-s2-ceil": (
        (1, 4, 10, 9),
        dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4, ceil_mode=1),
    ),
    "2x2-s2-ceil-odd": ((1, 3, 7, 9), dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)),
    "asym-dilated": (
        (2, 3, 12, 11),
        dict(kernel_shape=[3, 2], strides=[1, 3], pads=[0, 1, 2, 1], dilations=[2, 1]),
    ),
    "3x3-s3": ((1, 2, 11, 13), dict(kernel_shape=[3, 3], strides=[3, 3], pads=[1, 1, 1, 1])),
    "same-upper": ((1, 3, 7, 7), dict(kernel_shape=[3, 3], auto_pad="SAME_UPPER", strides=[2, 2])),
    "same-lower": ((1, 3, 8, 7), dict(kernel_shape=[4, 4], auto_pad="SAME_LOWER", strides=[3, 2])),
    "valid": ((1, 3, 8, 8), dict(kernel_shape=[3, 3], auto_pad="VALID", strides=[2, 2])),
    "global-window": ((2, 3, 5, 5), dict(kernel_shape=[5, 5], strides=[2, 2])),
    "height-1": ((2, 3, 1, 9), dict(kernel_shape=[1, 3], strides=[1, 2], pads=[0, 1, 0, 1])),
    "1x1-map": ((2, 3, 1, 1), dict(kernel_shape=[1, 1], strides=[2, 2])),
    "1d": ((2, 3, 13), dict(kernel_shape=[3], strides=[2], pads=[1, 1])),
    "batch-16": ((16, 17, 12, 12), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4)),
    "large": ((2, 64, 56, 56), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4)),
}


def pool_windows(x, attrs):
    return windows(
        x.shape[2:],
        attrs["kernel_shape"],
        strides=attrs.get("strides"),
        dilations=attrs.get("dilations"),
        pads=attrs.get("pads"),
        auto_pad=attrs.get("auto_pad", "NOTSET"),
        ceil_mode=attrs.get("ceil_mode", 0),
    )


def special_values(x):
    x = x.copy()
    x.flat[::7] = np.nan
    x.flat[3::11] = -np.inf
    x.flat[5::13] = np.inf
    return x


@pytest.mark.parametrize("case", sorted(POOLS))
@pytest.mark.parametrize("threads", [1, 2])
def test_max_pool_matches_the_numpy_path(case, threads):
    xs, attrs = POOLS[case]
    for x in (rand(*xs, seed=1), special_values(rand(*xs, seed=1))):
        with HostParallel(threads) as parallel:
            got = pool.max_pool(x, _n_outputs=1, _parallel=parallel, **attrs)
        want = pool.max_pool(x, _n_outputs=1, _compiled=False, **attrs)
        np.testing.assert_array_equal(got, want)
        if np.isfinite(x).all():  # the windows' plain max (NaN goes by ONNX Runtime's order)
            np.testing.assert_array_equal(got, pool._max(x, pool_windows(x, attrs)))


@pytest.mark.parametrize("case", sorted(POOLS))
@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_average_pool_matches_the_numpy_path(case, count_include_pad):
    xs, attrs = POOLS[case]
    for x in (rand(*xs, seed=1), special_values(rand(*xs, seed=1))):
        with HostParallel(2) as parallel:
            got = pool.average_pool(
                x, count_include_pad=count_include_pad, _parallel=parallel, **attrs
            )
        with np.errstate(invalid="ignore"):  # inf - inf
            want = pool._average(x, pool_windows(x, attrs), count_include_pad)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)


def pool_model(op_type, x_shape, outputs=1, **attrs):
    names = ["y", "indices"][:outputs]
    graph = helper.make_graph(
        [helper.make_node(op_type, ["x"], names, **attrs)],
        "pool",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [
            helper.make_tensor_value_info(name, elem, None)
            for name, elem in zip(names, (TensorProto.FLOAT, TensorProto.INT64), strict=False)
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    return model


@pytest.mark.parametrize("case", sorted(set(POOLS) - {"1x1-map"}))
@pytest.mark.parametrize("op_type", ["MaxPool", "AveragePool"])
def test_pools_match_onnxruntime(case, op_type):
    xs, attrs = POOLS[case]
    if op_type == "AveragePool" and "dilations" in attrs:
        attrs = {k: v for k, v in attrs.items() if k != "dilations"}
    extra = {"count_include_pad": 1} if op_type == "AveragePool" and "pads" in attrs else {}
    model = pool_model(op_type, xs, **attrs, **extra)
    feeds = {"x": rand(*xs, seed=2)}
    got, expected, _ = run_both(model, feeds)
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-5, atol=1e-6)


def test_max_pool_indices_stay_on_the_numpy_path():
    xs, attrs = POOLS["3x3-s2-pad"]
    model = pool_model("MaxPool", xs, outputs=2, **attrs)
    feeds = {"x": rand(*xs, seed=2)}
    got, expected, _ = run_both(model, feeds)
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_array_equal(got[1], expected[1])


@pytest.mark.parametrize(
    "shape",
    [(1, 2048, 7, 7), (3, 5, 9, 9), (2, 3, 11), (1, 4, 1, 1), (2, 3, 2, 3, 4), (0, 3, 4, 4)],
)
def test_global_average_pool_matches_numpy(shape):
    x = rand(*shape, seed=1)
    if x.size:
        x.flat[1] = np.nan
    got = pool.global_average_pool(x)
    want = np.mean(x, axis=tuple(range(2, x.ndim)), keepdims=True)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7, equal_nan=True)


def test_importing_the_ops_does_not_import_numba():
    code = (
        "import sys, nxrt, nxrt_ep_cpu.plugin, nxrt_ep_cpu.ops, nxrt_ep_cpu.ops.conv, "
        "nxrt_ep_cpu.ops.pool; assert 'numba' not in sys.modules"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)

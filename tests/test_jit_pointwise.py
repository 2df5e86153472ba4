"""The cpu EP's register-tiled 1x1 convolution (``jit/pointwise.py``): against the numpy
reference in float64 on edge shapes, bit for bit across thread counts, and against ONNX
Runtime in a session."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("numba")

import nxrt  # noqa: E402
from nxrt.host_parallel import HostParallel  # noqa: E402
from nxrt_ep_cpu.jit import isa  # noqa: E402
from nxrt_ep_cpu.jit.pointwise import pack  # noqa: E402
from nxrt_ep_cpu.ops._conv_gemm import ConvKernel  # noqa: E402


def rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, size=shape).astype(np.float32)


def reference(x, w, b=None, z=None, strides=(1, 1)):
    """``w @ x + b + z`` per image in float64 (a 1x1 convolution, strided pixels taken)."""
    if x.ndim == 3:
        x = x[:, :, None, :]
        z = None if z is None or z.ndim != 3 else z[:, :, None, :]
    x = x[:, :, :: strides[0], :: strides[1]].astype(np.float64)
    y = np.einsum("mc,nchw->nmhw", w.reshape(w.shape[0], -1).astype(np.float64), x)
    if b is not None:
        y = y + b.astype(np.float64).reshape(1, -1, 1, 1)
    if z is not None:
        y = y + z.astype(np.float64)
    return y


def run(x, w, b=None, z=None, *, threads=1, activation="", params=(), attrs=None):
    with HostParallel(threads) as parallel:
        kernel = ConvKernel(
            dict(attrs or {}), parallel=parallel, activation=activation, activation_params=params
        )
        y = kernel.run(x, w, b, z)
    return y, kernel.variant


def plan_of(x, w):
    kernel = ConvKernel({})
    kernel.run(x, w)
    (plan,) = kernel._plans.values()
    return plan


#: (x shape, filters): pixel counts around the 16- and 32-wide tiles and the chunk
#: boundaries, filter counts around the blocks of eight, one channel, many channels.
SHAPES = {
    "16px": ((1, 5, 4, 4), 8),
    "17px": ((1, 5, 1, 17), 9),
    "31px": ((2, 3, 1, 31), 7),
    "32px": ((1, 24, 4, 8), 1),
    "33px": ((1, 24, 3, 11), 13),
    "49px": ((1, 96, 7, 7), 40),
    "one-channel": ((1, 1, 6, 6), 12),
    "many-channels": ((1, 600, 7, 7), 24),
    "chunk-tail": ((1, 16, 1, 512 + 512 + 5), 12),  # 8192 / 16 = 512 pixels per chunk
    "chunk-even": ((1, 16, 32, 32), 20),
    "chunk-least": ((1, 96, 1, 256 + 256 + 20), 8),  # 8192 / 96 < 256: chunks of 256
    "batch": ((3, 40, 14, 14), 33),
    # filters in the lanes: maps that 32-pixel tiles cover badly
    "lanes-49px": ((1, 96, 7, 7), 64),
    "lanes-one-block": ((1, 30, 7, 7), 16),
    "lanes-partial-group": ((2, 40, 5, 5), 56),
    "lanes-batch": ((3, 200, 7, 7), 96),
    "lanes-17px": ((1, 8, 1, 17), 32),
    "lanes-one-pixel": ((1, 96, 1, 1), 24),  # squeeze-and-excitation's 1x1
    "lanes-cut": ((1, 576, 7, 7), 96),  # three blocks for two threads: the map is cut
    "lanes-few-pixels": ((1, 20, 3, 3), 40),
}
#: The cases whose filters go in the lanes, per instruction-set level (``jit/isa.py``): AVX2's
#: groups of 8 filters hold 24 and 40 exactly, and its 16-pixel tiles waste more on 7x7;
#: the generic level's 8-pixel tiles waste little anywhere.
LANES = {case for case in SHAPES if case.startswith("lanes")}
LANES_AT = {
    "avx512": LANES,
    "avx2": LANES | {"49px", "many-channels"},
    "generic": {"lanes-17px", "lanes-one-pixel", "lanes-few-pixels"},
}


def _sigmoid(y):
    return 1 / (1 + np.exp(-y))


#: The activations the kernels apply themselves, with their numpy forms.
ACTIVATIONS = [
    ("Sigmoid", (), _sigmoid),
    ("Swish", (), lambda y: y * _sigmoid(y)),
    ("Swish", (1.5,), lambda y: y * _sigmoid(1.5 * y)),
    ("HardSwish", (), lambda y: y * np.clip(y / 6 + 0.5, 0, 1)),
    ("HardSigmoid", (0.3, 0.4), lambda y: np.clip(0.3 * y + 0.4, 0, 1)),
    ("LeakyRelu", (0.1,), lambda y: np.where(y < 0, 0.1 * y, y)),
    ("Tanh", (), np.tanh),  # not fused: applied to the output after the kernel
]


@pytest.mark.parametrize("case", sorted(SHAPES))
def test_tiled_pointwise_matches_the_reference(case):
    xs, m = SHAPES[case]
    x, w, b = rand(*xs, seed=1), rand(m, xs[1], 1, 1, seed=2), rand(m, seed=3)
    z = rand(xs[0], m, *xs[2:], seed=4)
    y, variant = run(x, w, b)
    assert variant == "pointwise-tiled"
    assert plan_of(x, w).tiles.lanes == (case in LANES_AT[isa.level()])
    np.testing.assert_allclose(y, reference(x, w, b), rtol=1e-5, atol=1e-5)
    y, _ = run(x, w, None, z, activation="Relu")
    np.testing.assert_allclose(y, np.maximum(reference(x, w, None, z), 0), rtol=1e-5, atol=1e-5)
    y, _ = run(x, w, b, z, activation="Clip", params=(-0.5, 0.25))
    np.testing.assert_allclose(y, np.clip(reference(x, w, b, z), -0.5, 0.25), rtol=1e-5, atol=1e-5)
    for activation, params, apply in ACTIVATIONS:  # applied as each tile is written
        y, _ = run(x, w, b, z, activation=activation, params=params)
        np.testing.assert_allclose(y, apply(reference(x, w, b, z)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "case",
    [
        "49px",
        "chunk-tail",
        "batch",
        "many-channels",
        "lanes-batch",
        "lanes-partial-group",
        "lanes-cut",
    ],
)
def test_tiled_pointwise_gives_the_same_bits_on_two_threads(case):
    xs, m = SHAPES[case]
    x, w, b = rand(*xs, seed=1), rand(m, xs[1], 1, 1, seed=2), rand(m, seed=3)
    z = rand(xs[0], m, *xs[2:], seed=4)
    one, _ = run(x, w, b, z, activation="Clip", params=(0.0, 6.0))
    two, _ = run(x, w, b, z, activation="Clip", params=(0.0, 6.0), threads=2)
    np.testing.assert_array_equal(one, two)


def test_tiled_pointwise_strided_one_d_and_broadcast_residual():
    x, w, b = rand(2, 12, 9, 10, seed=1), rand(10, 12, 1, 1, seed=2), rand(10, seed=3)
    y, variant = run(x, w, b, attrs=dict(strides=[2, 2]))
    assert variant == "pointwise-tiled"
    np.testing.assert_allclose(y, reference(x, w, b, strides=(2, 2)), rtol=1e-5, atol=1e-5)
    line, w1 = rand(2, 12, 40, seed=4), rand(10, 12, 1, seed=5)
    z = rand(2, 10, 40, seed=6)
    y, _ = run(line, w1, b, z, activation="Relu")
    want = np.maximum(reference(line, w1, b, z), 0)[:, :, 0, :]
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    gates = rand(1, 10, 1, 1, seed=7)  # broadcast: added once the product is done
    for activation, apply in (("Relu", lambda y: np.maximum(y, 0)), ("Sigmoid", _sigmoid)):
        y, _ = run(x[:, :, :4, :4], w, b, gates, activation=activation)
        want = apply(reference(x[:, :, :4, :4], w, b) + gates)
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_tiled_pointwise_keeps_nan_and_inf_through_the_clamp():
    x, w = rand(1, 4, 4, 8, seed=1), rand(9, 4, 1, 1, seed=2)
    x[0, 0, 0, :3] = [np.nan, np.inf, -np.inf]
    with np.errstate(invalid="ignore"):
        want = reference(x, w)
    y, _ = run(x, w, activation="Clip", params=(0.0, 6.0))
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(np.isnan(y), np.isnan(want))
        np.testing.assert_allclose(y, np.clip(want, 0, 6), rtol=1e-5, atol=1e-5)


def test_weights_that_change_between_runs_are_packed_again():
    x = rand(1, 8, 6, 6, seed=1)
    with HostParallel(1) as parallel:
        kernel = ConvKernel({}, parallel=parallel)
        for seed in (2, 3):
            w = rand(5, 8, 1, 1, seed=seed)  # writeable: not a constant
            np.testing.assert_allclose(kernel.run(x, w), reference(x, w), rtol=1e-5, atol=1e-5)


def test_pack_lays_eight_filters_channel_major():
    w = np.arange(11 * 3, dtype=np.float32).reshape(11, 3)
    rows = 8  # AVX-512's filters per block (the layout is the same for any count)
    packed = pack(w, rows)
    assert packed.shape == (2, 3 * rows)
    for m in range(11):
        for c in range(3):
            assert packed[m // rows, c * rows + m % rows] == w[m, c]
    assert not packed[1].reshape(3, rows)[:, 3:].any()  # the padding filters are zero


def test_small_maps_of_several_images_grouped_and_float64_keep_the_gemm_paths():
    _, variant = run(rand(4, 8, 3, 3), rand(5, 8, 1, 1))
    assert variant == "pointwise"
    _, variant = run(rand(1, 8, 6, 6), rand(6, 4, 1, 1), attrs=dict(group=2))
    assert variant == "pointwise"
    x, w = rand(1, 8, 6, 6).astype(np.float64), rand(5, 8, 1, 1).astype(np.float64)
    y, variant = run(x, w)
    assert variant == "pointwise" and y.dtype == np.float64


@pytest.mark.parametrize("activation", ["Relu", "Clip", "HardSwish"])
@pytest.mark.parametrize(
    "shape, m",
    [((1, 96, 7, 7), 40), ((1, 96, 7, 7), 64), ((2, 24, 28, 28), 40), ((1, 16, 20, 30), 40)],
)
def test_tiled_pointwise_in_a_session_matches_onnxruntime(shape, m, activation):
    """Conv -> Add (residual) -> activation: the optimizer fuses them into a FusedConv."""
    w, b = rand(m, shape[1], 1, 1, seed=1), rand(m, seed=2)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    act_inputs = ["s"]
    if activation == "Clip":
        inits += [numpy_helper.from_array(np.float32(v), n) for v, n in ((0, "lo"), (6, "hi"))]
        act_inputs += ["lo", "hi"]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"]),
        helper.make_node("Add", ["c", "r"], ["s"]),
        helper.make_node(activation, act_inputs, ["y"]),
    ]
    out = [shape[0], m, *shape[2:]]
    graph = helper.make_graph(
        nodes,
        "pointwise",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape)),
            helper.make_tensor_value_info("r", TensorProto.FLOAT, out),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    feeds = {"x": rand(*shape, seed=3), "r": rand(*out, seed=4)}
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = expected.run(None, feeds)[0]
    inferred = onnx.shape_inference.infer_shapes(model).SerializeToString()
    options = nxrt.SessionOptions()
    options.intra_op_num_threads = 2
    session = nxrt.InferenceSession(inferred, options, providers=["cpu"])
    np.testing.assert_allclose(session.run(None, feeds)[0], want, rtol=1e-4, atol=1e-4)
    variants = [getattr(step.kernel, "variant", "") for step in session._plan.steps]
    assert "pointwise-tiled" in variants


@pytest.mark.parametrize("n, pixels", [(1, (3, 3)), (1, (14, 14)), (2, (7, 7))])
def test_channel_scale_is_applied_to_the_packed_weights(n, pixels):
    """FusedConv's S (a squeeze-and-excitation gate folded in): ``conv(x * s, w)``, the
    smaller operand scaled: the input on a 3x3 map or for two images, else the weights."""
    x, w, b = rand(n, 48, *pixels, seed=1), rand(64, 48, 1, 1, seed=2), rand(64, seed=3)
    w.flags.writeable = False  # a constant: packed once
    kernel = ConvKernel({}, activation="HardSwish")
    for seed in (4, 5):  # a new gate each run, the same packed weights
        s = rand(n, 48, 1, 1, seed=seed)
        want = reference(x * s, w, b)
        want = want * np.clip(want / 6 + 0.5, 0, 1)
        got = kernel.run(x, w, b, None, s)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert kernel.variant == "pointwise-tiled"


# -- patch embeddings: kernel and stride equal ---------------------------------------------------

PATCHES = {
    "convnext-stem": ((1, 3, 32, 32), (24, 3, 4, 4)),
    "vit-like": ((2, 3, 32, 48), (40, 3, 16, 16)),
    "leftover-rows": ((1, 5, 30, 31), (9, 5, 4, 4)),  # the last 2 and 3 are in no window
    "one-d": ((2, 6, 40), (12, 6, 4)),
    "non-square": ((1, 4, 12, 12), (8, 4, 2, 3)),
}


@pytest.mark.parametrize("case", sorted(PATCHES))
def test_patch_embeddings_match_the_reference(case):
    from nxrt_ep_cpu.ops._conv_reference import conv_windows, convolve

    xs, ws = PATCHES[case]
    attrs = dict(strides=list(ws[2:]))
    x, w, b = rand(*xs, seed=1), rand(*ws, seed=2), rand(ws[0], seed=3)
    w.flags.writeable = False
    win = conv_windows(x.shape, w.shape, **attrs)
    want = convolve(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64), win, 1)
    z = rand(*want.shape, seed=4)
    for threads in (1, 2):
        y, variant = run(x, w, b, threads=threads, attrs=attrs)
        assert variant == "patches"
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
        y, _ = run(x, w, b, z, threads=threads, attrs=attrs, activation="Clip", params=(0, 0.5))
        np.testing.assert_allclose(y, np.clip(want + z, 0, 0.5), rtol=1e-5, atol=1e-5)

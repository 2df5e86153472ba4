"""The cpu EP's tiles per instruction-set level (``jit/isa.py``): the level read from numba's
target, and every level's 1x1 and channel-blocked depthwise loops against the numpy
reference at shapes their tiles do not divide, on whatever target this run compiles for
(a level's loops run on any x86-64 target, only slower off their own), with the same bits
at every level and thread count."""

from __future__ import annotations

import dataclasses
import os

import llvmlite.binding as llvm
import numpy as np
import pytest

pytest.importorskip("numba")

from nxrt.host_parallel import HostParallel  # noqa: E402
from nxrt_ep_cpu.jit import isa  # noqa: E402
from nxrt_ep_cpu.ops._conv_gemm import ConvKernel  # noqa: E402
from nxrt_ep_cpu.ops._conv_reference import conv_windows, convolve  # noqa: E402

LEVELS = sorted(isa.LEVELS)


def rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, size=shape).astype(np.float32)


# -- the level ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "features", "level"),
    [
        ("emeraldrapids", "+avx2,+fma,+avx512f,+avx512bw", "avx512"),
        ("znver3", "+avx,+avx2,+fma,-avx512f", "avx2"),
        ("haswell", "+avx,+avx2,-fma,-avx512f", "generic"),  # no FMA: not the AVX2 level
        ("sandybridge", "+avx,-avx2,-fma", "generic"),
        ("haswell", "", "avx2"),  # an empty list: the CPU's own features, as LLVM gives them
        ("skylake-avx512", "", "avx512"),
        ("znver4", "", "avx512"),
        ("x86-64", "", "generic"),
    ],
)
def test_the_level_follows_the_target_features(name, features, level):
    assert isa._level_of(name, features) == level


def test_the_level_is_the_one_numba_compiles_for():
    import numba

    name, features = isa.target()
    assert name == (numba.config.CPU_NAME or llvm.get_host_cpu_name())
    if numba.config.CPU_NAME == "haswell" and not numba.config.CPU_FEATURES:
        assert isa.level() == "avx2"  # make test-avx2's target
    assert isa.level() == isa._level_of(name, features)


def test_a_forced_level_applies_inside_its_block_only():
    native = isa.level()
    with isa.forced("generic") as level:
        assert isa.level() == "generic" and level.lanes == 4
    assert isa.level() == native


@pytest.mark.parametrize("name", LEVELS)
def test_tiles_fit_the_level_registers(name):
    """The accumulators of each tile, plus a register for the loads and the broadcast, fit
    the level's vector registers (the tile must never spill)."""
    level = isa.LEVELS[name]
    assert 2 * level.rows + 2 <= level.registers
    assert 2 * level.lane_pixels + 2 <= level.registers
    assert 8 + 2 <= level.registers  # the depthwise tile: eight pixels of one vector


# -- 1x1 convolutions ---------------------------------------------------------------------------


def pointwise_reference(x, w, b, z):
    y = np.einsum("mc,nchw->nmhw", w[:, :, 0, 0].astype(np.float64), x.astype(np.float64))
    return y + b.astype(np.float64).reshape(1, -1, 1, 1) + z


def run(level, x, w, b, z=None, *, threads=1, activation="", params=(), attrs=None):
    with isa.forced(level), HostParallel(threads) as parallel:
        kernel = ConvKernel(
            dict(attrs or {}), parallel=parallel, activation=activation, activation_params=params
        )
        y = kernel.run(x, w, b, z)
    (plan,) = kernel._plans.values()
    return y, plan


#: (x shape, filters): pixel counts that are no multiple of any level's tile width (8, 16
#: or 32), filter counts no multiple of any level's rows (4, 6 or 8) or lane blocks.
POINTWISE = {
    "pixels-13": ((1, 7, 1, 13), 5),
    "pixels-23": ((1, 9, 1, 23), 11),
    "pixels-47": ((2, 10, 1, 47), 13),
    "pixels-49": ((1, 33, 7, 7), 19),
    "pixels-81": ((1, 20, 9, 9), 29),
    "pixels-99": ((3, 17, 9, 11), 7),
    "pixels-200": ((1, 5, 10, 20), 23),
    "map-5x5": ((2, 12, 5, 5), 37),
    "map-3x3": ((1, 40, 3, 3), 21),
    "one-pixel": ((1, 64, 1, 1), 45),
    "many-channels": ((1, 300, 7, 7), 17),
    "chunk-tail": ((1, 16, 1, 1029), 9),
}


@pytest.mark.parametrize("case", sorted(POINTWISE))
@pytest.mark.parametrize("level", LEVELS)
def test_every_level_pointwise_matches_the_reference(level, case):
    xs, m = POINTWISE[case]
    x, w, b = rand(*xs, seed=1), rand(m, xs[1], 1, 1, seed=2), rand(m, seed=3)
    z = rand(xs[0], m, *xs[2:], seed=4)
    y, plan = run(level, x, w, b)
    assert plan.variant == "pointwise-tiled" and plan.tiles.kernels.LEVEL == level
    np.testing.assert_allclose(y, pointwise_reference(x, w, b, 0.0), rtol=1e-5, atol=1e-5)
    y, _ = run(level, x, w, b, z, activation="Clip", params=(-0.5, 0.25))
    want = np.clip(pointwise_reference(x, w, b, z), -0.5, 0.25)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    y, _ = run(level, x, w, b, z, activation="HardSwish")
    want = pointwise_reference(x, w, b, z)
    np.testing.assert_allclose(y, want * np.clip(want / 6 + 0.5, 0, 1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["pixels-49", "pixels-81", "pixels-200", "many-channels"])
@pytest.mark.parametrize("lanes", [False, True])
def test_pointwise_gives_the_same_bits_at_every_level_and_thread_count(case, lanes, monkeypatch):
    """Both 1x1 kernels (pixels or filters in the lanes, forced) sum each output in the same
    order whatever the tile: one result per input at every level, on one thread or two."""
    from nxrt_ep_cpu.ops import _conv_gemm

    xs, m = POINTWISE[case]
    x, w, b = rand(*xs, seed=1), rand(m, xs[1], 1, 1, seed=2), rand(m, seed=3)
    z = rand(xs[0], m, *xs[2:], seed=4)
    if lanes:  # as for a map too small for pixel tiles
        monkeypatch.setattr(_conv_gemm, "_TILE_PIXELS", 1 << 30)
    else:  # never filters in the lanes
        levels = {k: dataclasses.replace(v, lane_waste=100.0) for k, v in isa.LEVELS.items()}
        monkeypatch.setattr(isa, "LEVELS", levels)
    results = {}
    for level in LEVELS:
        for threads in (1, 2):
            y, plan = run(level, x, w, b, z, threads=threads, activation="Relu")
            assert plan.tiles.lanes == lanes
            results[level, threads] = y
    first = results[LEVELS[0], 1]
    np.testing.assert_allclose(first, np.maximum(pointwise_reference(x, w, b, z), 0), 1e-5, 1e-5)
    for key, y in results.items():
        np.testing.assert_array_equal(y, first, err_msg=str(key))


# -- depthwise, a vector of channels at a time ----------------------------------------------------

#: (x, kernel, attrs): channel counts that are no multiple of 4, 8 or 16, output widths that
#: are no multiple of the eight-pixel tile; the ``rows-`` ones move a row at a time.
DEPTHWISE = {
    "3x3-c19": ((1, 19, 11, 13), 3, dict(pads=[1] * 4)),
    "3x3-s2-c37": ((3, 37, 13, 12), 3, dict(pads=[1] * 4, strides=[2, 2])),
    "5x5-c21": ((2, 21, 9, 10), 5, dict(pads=[2] * 4)),
    "7x7-c18-map7": ((1, 18, 7, 7), 7, dict(pads=[3] * 4)),
    "3x3-c27-map3": ((2, 27, 3, 3), 3, dict(pads=[1] * 4)),
    "rows-c22": ((1, 22, 33, 35), 3, dict(pads=[1] * 4)),
    "rows-s2-c29": ((2, 29, 45, 37), 3, dict(pads=[1] * 4, strides=[2, 2])),
}


def depthwise_inputs(case):
    xs, k, attrs = DEPTHWISE[case]
    c = xs[1]
    attrs = dict(attrs, group=c)
    x, w, b = rand(*xs, seed=1), rand(c, 1, k, k, seed=2), rand(c, seed=3)
    win = conv_windows(x.shape, w.shape, **attrs)
    want = convolve(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64), win, c)
    return x, w, b, attrs, want, rand(*want.shape, seed=4)


@pytest.mark.parametrize("case", sorted(DEPTHWISE))
@pytest.mark.parametrize("level", LEVELS)
def test_every_level_depthwise_matches_the_reference(level, case):
    x, w, b, attrs, want, z = depthwise_inputs(case)
    y, plan = run(level, x, w, b, attrs=attrs)
    assert type(plan).__name__ == "Blocked" and plan.lanes == isa.LEVELS[level].lanes
    assert plan.rows == case.startswith("rows-")
    np.testing.assert_allclose(y, want, rtol=2e-5, atol=2e-5)
    y, _ = run(level, x, w, b, z, attrs=attrs, activation="Clip", params=(-0.2, 0.3))
    np.testing.assert_allclose(y, np.clip(want + z, -0.2, 0.3), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("case", ["3x3-s2-c37", "7x7-c18-map7", "rows-s2-c29"])
def test_depthwise_gives_the_same_bits_at_every_level_and_thread_count(case):
    x, w, b, attrs, want, z = depthwise_inputs(case)
    results = {
        (level, threads): run(level, x, w, b, z, attrs=attrs, threads=threads, activation="Relu")[0]
        for level in LEVELS
        for threads in (1, 2)
    }
    first = results[LEVELS[0], 1]
    np.testing.assert_allclose(first, np.maximum(want + z, 0), rtol=2e-5, atol=2e-5)
    for key, y in results.items():
        np.testing.assert_array_equal(y, first, err_msg=str(key))


# -- grouped 1x1 convolutions: each group an image of the register tiles ------------------------

#: (x shape, filters, groups): ShuffleNet's shapes, and odd group sizes and maps.
GROUPED = {
    "shufflenet-14x14": ((1, 272, 14, 14), 272, 4),
    "shufflenet-7x7": ((1, 544, 7, 7), 544, 4),
    "odd-groups": ((2, 21, 5, 9), 27, 3),
    "batch-small-map": ((3, 30, 4, 5), 40, 2),
    "one-pixel": ((1, 24, 1, 1), 48, 4),
    "strided": ((2, 24, 9, 11), 36, 3),
}


@pytest.mark.parametrize("case", sorted(GROUPED))
@pytest.mark.parametrize("level", LEVELS)
def test_grouped_pointwise_runs_the_tiles_and_matches_the_reference(level, case):
    xs, m, g = GROUPED[case]
    attrs = dict(group=g, strides=[2, 2] if case == "strided" else [1, 1])
    x, w, b = rand(*xs, seed=1), rand(m, xs[1] // g, 1, 1, seed=2), rand(m, seed=3)
    win = conv_windows(x.shape, w.shape, **attrs)
    want = convolve(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64), win, g)
    z = rand(*want.shape, seed=4)
    y, plan = run(level, x, w, b, attrs=attrs)
    assert plan.variant == "pointwise-tiled"
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    one, _ = run(level, x, w, b, z, attrs=attrs, activation="Clip", params=(-0.5, 0.25))
    np.testing.assert_allclose(one, np.clip(want + z, -0.5, 0.25), rtol=1e-5, atol=1e-5)
    two, _ = run(level, x, w, b, z, attrs=attrs, activation="Clip", params=(-0.5, 0.25), threads=2)
    np.testing.assert_array_equal(one, two)
    s = rand(xs[0], xs[1], 1, 1, seed=5)  # FusedConv's channel scale: the input scaled
    with isa.forced(level):
        got = ConvKernel(attrs).run(x, w, b, None, s)
    want = convolve((x * s).astype(np.float64), w.astype(np.float64), b.astype(np.float64), win, g)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_groups_of_few_filters_keep_the_gemm_path():
    _, plan = run(isa.level(), rand(1, 16, 6, 6), rand(8, 4, 1, 1), None, attrs=dict(group=4))
    assert plan.variant == "pointwise"


@pytest.mark.skipif(
    os.environ.get("NUMBA_CPU_NAME") != "haswell", reason="runs under make test-avx2"
)
def test_the_avx2_tile_holds_its_accumulators_in_ymm_registers():
    """The AVX2 level's 1x1 tile, compiled for Haswell: its inner loop is the 6x16 micro-kernel
    (twelve 256-bit multiply-adds per channel) with nothing spilled to the stack."""
    import re

    from nxrt_ep_cpu.jit import pointwise

    kernels = pointwise._kernels("avx2", cache=False)  # uncached: numba shows its assembly
    x, w = np.zeros((1, 8, 64), np.float32), np.zeros((1, 8 * kernels.ROWS), np.float32)
    out, items = np.zeros((1, 6, 64), np.float32), np.array([[0, 0, 64, 0, 0]], np.int64)
    z, epi = np.zeros((0, 1, 1), np.float32), np.zeros(4, np.float32)
    kernels.pointwise(x, w, np.zeros(6, np.float32), z, out, items, epi, False, 0, 0, 1)
    code = "\n".join(kernels.pointwise.inspect_asm().values())
    assert "zmm" not in code
    blocks = [b.split("\n\tj")[0] for b in re.split(r"\n\.LBB\S+:", code)]  # to the branch
    loops = [b for b in blocks if len(re.findall(r"vfmadd\w+\s+.*%ymm", b)) == 12]
    assert loops, code
    for loop in loops:  # the channel loop (and its unrolled copy)
        assert "rsp" not in loop and "rbp" not in loop, loop


# -- KxK convolutions on columns that fit in cache: the 1x1 tiles on unfolded images ----------

#: (x, w, attrs): channel and filter counts no tile divides, odd maps, pads, strides,
#: dilations, a 1-D convolution, and several large-enough maps.
UNFOLDED = {
    "cnn-14x14": ((1, 48, 14, 14), (64, 48, 3, 3), dict(pads=[1] * 4)),
    "densenet-7x7": ((1, 128, 7, 7), (32, 128, 3, 3), dict(pads=[1] * 4)),
    "odd": ((1, 19, 11, 13), (13, 19, 3, 3), dict(pads=[1, 0, 2, 1])),
    "strided-dilated": ((1, 20, 17, 13), (7, 20, 3, 2), dict(strides=[2, 1], dilations=[1, 2])),
    "5x5": ((1, 17, 9, 10), (33, 17, 5, 5), dict(pads=[2] * 4)),
    "batch-of-large-maps": ((2, 16, 24, 23), (9, 16, 3, 3), dict(pads=[1] * 4)),
    "1d": ((2, 24, 600), (11, 24, 5), dict(pads=[2, 2])),
}


@pytest.mark.parametrize("case", sorted(UNFOLDED))
@pytest.mark.parametrize("level", LEVELS)
def test_unfolded_convolutions_match_the_reference(level, case):
    xs, ws, attrs = UNFOLDED[case]
    x, w, b = rand(*xs, seed=1), rand(*ws, seed=2), rand(ws[0], seed=3)
    win = conv_windows(x.shape, w.shape, **attrs)
    want = convolve(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64), win, 1)
    z = rand(*want.shape, seed=4)
    y, plan = run(level, x, w, b, attrs=attrs)
    assert plan.variant == "im2col-tiled"
    np.testing.assert_allclose(y, want, rtol=5e-5, atol=5e-5)
    one, _ = run(level, x, w, b, z, attrs=attrs, activation="Clip", params=(-0.5, 0.25))
    np.testing.assert_allclose(one, np.clip(want + z, -0.5, 0.25), rtol=5e-5, atol=5e-5)
    two, _ = run(level, x, w, b, z, attrs=attrs, activation="Clip", params=(-0.5, 0.25), threads=2)
    np.testing.assert_array_equal(one, two)
    gate = z[:1, :1]  # a residual that broadcasts, added once the product is done
    y, _ = run(level, x, w, None, gate, attrs=attrs, activation="Sigmoid")
    unbiased = want - b.reshape((1, -1) + (1,) * (want.ndim - 2))
    np.testing.assert_allclose(y, 1 / (1 + np.exp(-(unbiased + gate))), rtol=5e-5, atol=5e-5)


def test_unfolded_convolutions_give_the_same_bits_at_every_level():
    xs, ws, attrs = UNFOLDED["densenet-7x7"]
    x, w, b = rand(*xs, seed=1), rand(*ws, seed=2), rand(ws[0], seed=3)
    first, _ = run(LEVELS[0], x, w, b, attrs=attrs, activation="Relu")
    for level in LEVELS[1:]:
        np.testing.assert_array_equal(run(level, x, w, b, attrs=attrs, activation="Relu")[0], first)

"""The cpu EP's random ops, checked by their distribution rather than by values.

ONNX's node cases for Bernoulli store draws from the case generator's own
numpy state, which no runtime can reproduce (they are excluded from the
conformance tests); what a caller relies on is checked here instead: the
support, dtype and shape, the edge probabilities, seed reproducibility, and
sample means close to the probabilities.
"""

from __future__ import annotations

import numpy as np
import pytest

from nxrt.errors import KernelFailed
from nxrt.tools.testing import run_node


def test_bernoulli_draws_zeros_and_ones_of_the_input_dtype():
    p = np.random.default_rng(0).uniform(0.0, 1.0, (4, 25)).astype(np.float32)
    (y,) = run_node("Bernoulli", {"x": p}, opset=22)
    assert y.dtype == np.float32 and y.shape == p.shape
    assert set(np.unique(y)) <= {0.0, 1.0}
    (z,) = run_node("Bernoulli", {"x": p}, {"dtype": 7}, opset=22)  # int64
    assert z.dtype == np.int64 and set(np.unique(z)) <= {0, 1}


def test_bernoulli_edge_probabilities_are_certain():
    p = np.array([0.0, 1.0] * 50, np.float64)
    (y,) = run_node("Bernoulli", {"x": p}, opset=22)
    np.testing.assert_array_equal(y, p)


def test_bernoulli_with_a_seed_repeats_and_its_mean_follows_the_probability():
    p = np.full(20_000, 0.3, np.float32)
    (a,) = run_node("Bernoulli", {"x": p}, {"seed": 5.0}, opset=22)
    (b,) = run_node("Bernoulli", {"x": p}, {"seed": 5.0}, opset=22)
    np.testing.assert_array_equal(a, b)
    assert abs(float(a.mean()) - 0.3) < 0.02  # 6 standard deviations of the mean
    (c,) = run_node("Bernoulli", {"x": p}, {"seed": 6.0}, opset=22)
    assert not np.array_equal(a, c)


def test_bernoulli_refuses_probabilities_outside_zero_one():
    with pytest.raises(KernelFailed, match=r"\[0, 1\]"):
        run_node("Bernoulli", {"x": np.array([0.5, 1.5], np.float32)}, opset=22)

"""Property-based fuzzing of model bytes: a mutated or cut model fails with a typed error.

Random graphs against onnxruntime are :mod:`nxrt_fuzz`'s job
(tests/test_differential.py). Bounded for CI (``NXRT_FUZZ_EXAMPLES`` raises
the count on demand): every mutated model either runs or is refused with an
nxrt error; a crash, a hang or a foreign exception fails the test.
"""

from __future__ import annotations

import os
from collections import Counter

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import nxrt
from nxrt.errors import NxrtError
from nxrt.tools.testing import light_model_path

EXAMPLES = int(os.environ.get("NXRT_FUZZ_EXAMPLES", "60"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def report(title: str, outcomes: Counter[str], capsys) -> None:
    """Print a test's outcome counts, and check that every example was counted."""
    with capsys.disabled():
        print(f"\nfuzz outcomes, {title}: {dict(sorted(outcomes.items()))}")
    assert sum(outcomes.values()) >= EXAMPLES


SQUEEZENET = open(light_model_path("squeezenet"), "rb").read()


def test_mutated_model_bytes_give_typed_errors(capsys):
    outcomes: Counter[str] = Counter()
    mutated_bytes_fail_typed(outcomes=outcomes)
    report("mutated bytes", outcomes, capsys)


@FUZZ
@given(
    edits=st.lists(
        st.tuples(st.integers(0, len(SQUEEZENET) - 1), st.integers(0, 255)), min_size=1, max_size=8
    ),
    cut=st.integers(1, len(SQUEEZENET)),
)
def mutated_bytes_fail_typed(edits, cut, outcomes):
    data = bytearray(SQUEEZENET[:cut])
    for position, byte in edits:
        if position < len(data):
            data[position] = byte
    try:
        session = nxrt.InferenceSession(bytes(data), providers=["cpu"])
        shapes = {
            a.name: [d if isinstance(d, int) else 1 for d in a.shape] for a in session.get_inputs()
        }
        if any(np.prod(shape) > 2_000_000 for shape in shapes.values()):
            outcomes["created, inputs too large to feed"] += 1
            return
        session.run(None, {name: np.zeros(shape, np.float32) for name, shape in shapes.items()})
        outcomes["ran"] += 1
    except NxrtError as exc:
        outcomes[type(exc).__name__] += 1

"""The differential fuzzer in CI: random graphs against onnxruntime, and every regression case.

``test_random_graphs_agree_with_onnxruntime`` runs a few hundred cases of
:mod:`nxrt_fuzz` (``NXRT_DIFFERENTIAL_CASES`` changes how many; the large
run is ``python -m nxrt_fuzz --cases 10000 --seed 0``). Each file in
``tests/regressions`` is a failure the fuzzer found, minimized, with the
outputs it must give: onnxruntime's, or for a known difference (where
onnxruntime departs from the ONNX spec, :mod:`nxrt_fuzz.known`) the spec's.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nxrt_fuzz import FAILURES, fuzz
from nxrt_fuzz.case import Case
from nxrt_fuzz.generate import ep_ops
from nxrt_fuzz.known import KNOWN
from nxrt_fuzz.regress import KNOWN_PREFIX, REFUSES
from nxrt_fuzz.run import AGREED, evaluate, outputs_mismatch, run_nxrt
from nxrt_fuzz.run import KNOWN as KNOWN_KIND

REGRESSIONS = Path(__file__).parent / "regressions"
CASES = int(os.environ.get("NXRT_DIFFERENTIAL_CASES", "300"))
SEED = 21
DOCS = Path(__file__).parent.parent / "docs" / "fuzzing.md"


def regression_names() -> list[str]:
    return sorted(p.stem for p in REGRESSIONS.glob("*.npz"))


def test_random_graphs_agree_with_onnxruntime(tmp_path, capsys):
    report = fuzz(SEED, range(CASES), out=str(tmp_path))
    with capsys.disabled():
        print(f"\n{report.summary()}")
    assert report.cases == CASES
    found = [
        f"{f.seed}/{f.index}: {f.outcome.kind} [{f.outcome.op}] {f.outcome.detail[:300]}"
        + (f" (minimized: {tmp_path / f.saved})" if f.saved else "")
        for f in report.findings
    ]
    assert not found, "\n".join(found)
    assert not report.fuzzer_errors, report.fuzzer_errors[0]
    assert not any(report.counts.get(kind) for kind in FAILURES)


@pytest.mark.parametrize("name", regression_names())
def test_regression(name):
    """Each case on the EP that failed it: ``mlx_*`` cases on mlx, the rest on cpu."""
    ep = name.split("_", 1)[0] if name.startswith("mlx_") else "cpu"
    try:
        ep_ops(ep)
    except ValueError:
        pytest.skip(f"the {ep} EP is not installed")
    case = Case.load(REGRESSIONS / f"{name}.npz")
    got = run_nxrt(case, ep)
    if REFUSES in case.note:  # a model the spec refuses (a known difference): nxrt must too
        assert isinstance(got, str), f"nxrt ran a model the spec refuses\n{case.note}"
        return
    assert not isinstance(got, str), f"nxrt refused it: {got}\n{case.describe()}"
    expected = [case.expected[n] for n in case.output_names()]
    why = outputs_mismatch(case, got, expected)
    assert not why, f"{why}\n{case.note}\n{case.describe()}"


@pytest.mark.parametrize(
    "name", [n for n in regression_names() if n.startswith("known_")] or ["(none)"]
)
def test_known_difference_is_recognised(name):
    """A known-difference case is classified as one, so it never counts as a failure."""
    if name == "(none)":
        assert not KNOWN, "every known difference needs a regression case named known_*"
        return
    case = Case.load(REGRESSIONS / f"{name}.npz")
    assert case.note.startswith(KNOWN_PREFIX), case.note
    outcome = evaluate(case)
    assert outcome.kind in (KNOWN_KIND, AGREED), f"{outcome.kind}: {outcome.detail}"
    if outcome.kind == KNOWN_KIND:
        assert outcome.detail.startswith(case.note[len(KNOWN_PREFIX) :].split(";")[0])


def test_every_known_difference_has_a_case_and_a_doc_entry():
    text = DOCS.read_text(encoding="utf-8")
    notes = [Case.load(REGRESSIONS / f"{n}.npz").note for n in regression_names()]
    for entry in KNOWN:
        assert f"`{entry.id}`" in text, f"docs/fuzzing.md does not explain {entry.id}"
        assert any(n.startswith(f"{KNOWN_PREFIX}{entry.id};") for n in notes), entry.id

"""The ONNX node conformance suite on the cpu EP: every case is its own test id.

The whole suite runs once, in worker processes with a per-case timeout
(:func:`nxrt.tools.conformance.run_cases`); each test then checks its case's
result. Known failures are listed, with reasons, in the EP's
``conformance_exclusions.txt``: they are expected to fail, and one that
starts passing fails here so the list stays honest, except cases marked
``random:``, whose expected values are random draws a run may match by chance.
"""

from __future__ import annotations

import pytest

from nxrt.tools.conformance import Summary, check_case, node_cases, package_exclusions, run_cases

pytestmark = pytest.mark.slow  # the whole ONNX node suite, in worker processes

CASES = node_cases()
EXCLUDED = package_exclusions("nxrt_ep_cpu.plugin")


@pytest.fixture(scope="module")
def results():
    return run_cases("cpu", list(CASES), workers=2)


def test_exclusions_name_real_cases():
    unknown = sorted(set(EXCLUDED) - set(CASES))
    assert not unknown, f"conformance_exclusions.txt lists cases that do not exist: {unknown}"


@pytest.mark.parametrize("case", list(CASES))
def test_node_case(case, results):
    check_case(case, results[case], EXCLUDED)


def test_report_the_pass_count(results, capsys):
    summary = Summary.of("cpu", results.values())
    with capsys.disabled():
        print(f"\nnode conformance on cpu: {dict(summary.counts)} of {len(CASES)} cases")
    assert summary.counts["pass"] + len(EXCLUDED) >= len(CASES)

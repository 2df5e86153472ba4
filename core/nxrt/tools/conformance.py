"""The ONNX node conformance suite, run against one EP (or onnxruntime) in worker processes.

Each case is one of ``onnx/backend/test/data/node`` (a model, inputs and
expected outputs), run by ONNX's own test runner through :mod:`nxrt.ort.backend`.
Cases run in a small pool of worker processes: a case that hangs past the
timeout or crashes its worker is recorded as an error and the run goes on
with a fresh worker.

Used by ``nxrt check-ep``, by the conformance tests, and by ``nxrt.tools.testing``.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from importlib import resources

from nxrt.errors import MissingExtra

#: The pseudo-EP name that runs the suite through onnxruntime, for comparison.
ORT = "onnxruntime"
DEFAULT_TIMEOUT = 60.0
#: A case the EP refuses at session creation (an op it does not have) is "unsupported":
#: its error is a NoEpForOp, or NoEpForNodes (several nodes no EP runs).
UNSUPPORTED_PREFIXES = ("nxrt.errors.NoEpForOp", "nxrt.errors.NoEpForNodes")


@dataclass(frozen=True)
class CaseResult:
    """One case's outcome: ``pass``, ``fail`` (wrong result), ``error`` or ``unsupported``."""

    name: str
    status: str
    op_type: str = ""
    message: str = ""


def node_cases() -> dict[str, str]:
    """Every node case name (``test_...``) with the op it tests, sorted by name."""
    import warnings

    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the case generators divide by zero on purpose
        cases = {case.name: _op_of(case) for case in load_model_tests(kind="node")}
    for name in cases:  # an expanded case tests the op of its unexpanded twin
        twin = name.split("_expanded")[0]
        if twin != name and twin in cases:
            cases[name] = cases[twin]
    return dict(sorted(cases.items()))


def _op_of(case) -> str:
    """The op a case exercises: its first node's op (an expanded case names its op first)."""
    nodes = case.model.graph.node if case.model is not None else []
    return nodes[0].op_type if len(nodes) == 1 else case.name.removeprefix("test_").split("_")[0]


def load_exclusions(path: str | os.PathLike[str] | None) -> dict[str, str]:
    """``case_name: reason`` lines (``#`` comments allowed); every exclusion needs a reason."""
    if path is None or not os.path.exists(path):
        return {}
    exclusions = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            name, sep, reason = line.partition(":")
            if not sep or not reason.strip():
                raise ValueError(f"{path}:{number}: write 'case_name: reason'")
            exclusions[name.strip()] = reason.strip()
    return exclusions


#: An exclusion reason with this prefix marks a case whose expected values are random
#: draws: a run may match them by chance, so a pass is not news.
RANDOM_REASON = "random:"


def check_case(case: str, result: CaseResult, excluded: dict[str, str]) -> None:
    """pytest's verdict on one case: a pass, a known failure (xfail), or an assertion.

    An excluded case that passes fails the test, so exclusion lists stay
    honest, unless its reason marks it :data:`RANDOM_REASON`.
    """
    try:
        import pytest
    except ImportError as exc:  # nxrt check-ep runs without pytest; this needs the kit
        raise MissingExtra("conformance verdicts under pytest", "pytest", "kit") from exc

    reason = excluded.get(case)
    if reason is not None:
        if not reason.startswith(RANDOM_REASON):
            assert result.status != "pass", f"{case} passes now: remove its exclusion"
        pytest.xfail(f"known failure: {reason}")
    assert result.status == "pass", f"{result.status}: {result.message}"


def package_exclusions(module_name: str) -> dict[str, str]:
    """The ``conformance_exclusions.txt`` an EP package ships beside its plugin module."""
    package = module_name.rsplit(".", 1)[0]
    try:
        path = resources.files(package) / "conformance_exclusions.txt"
    except (ModuleNotFoundError, TypeError):
        return {}
    return load_exclusions(str(path)) if path.is_file() else {}


# -- the worker -------------------------------------------------------------------------------


def _backend(ep: str):
    if ep == ORT:
        import onnxruntime.backend

        return onnxruntime.backend
    from nxrt.ort.backend import backend_for

    return backend_for(ep)


def _worker(ep: str) -> None:
    """Read case names on stdin, write one JSON result per line on the original stdout."""
    import unittest
    import warnings

    from onnx.backend.test.runner import Runner

    warnings.simplefilter("ignore")
    results = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray prints must not corrupt results
    case_class = Runner(_backend(ep)).test_cases["OnnxBackendNodeModelTest"]
    for line in sys.stdin:
        name = line.strip()
        result = unittest.TestResult()
        try:
            case_class(f"{name}_cpu").run(result)
            if result.failures:
                status, message = "fail", _last_line(result.failures[0][1])
            elif result.errors:
                message = _last_line(result.errors[0][1])
                status = "unsupported" if message.startswith(UNSUPPORTED_PREFIXES) else "error"
            elif result.skipped:
                status, message = "error", f"skipped: {result.skipped[0][1]}"
            else:
                status, message = "pass", ""
        except BaseException as exc:  # noqa: BLE001 - report, never die quietly
            status, message = "error", _last_line(traceback.format_exc()) or repr(exc)
        results.write(json.dumps({"name": name, "status": status, "message": message}) + "\n")


def _last_line(text: str) -> str:
    """The most telling line of a traceback: the exception's first line, shortened.

    That is the line after the last frame (``  File ...`` and its indented
    source lines), so a message of several lines is still found by its start.
    """
    lines = [line for line in text.strip().splitlines() if line.strip()]
    frames = [i for i, line in enumerate(lines) if line.startswith('  File "')]
    start = frames[-1] + 1 if frames else 0
    while start < len(lines) and lines[start].startswith("    "):
        start += 1
    if start < len(lines):
        return lines[start][:500]
    return lines[-1][:500] if lines else ""


# -- the pool ----------------------------------------------------------------------------------


class _Worker:
    def __init__(self, ep: str) -> None:
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")
        env.setdefault("OPENBLAS_NUM_THREADS", "1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nxrt.tools.conformance", "--worker", ep],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            bufsize=1,
            env=env,
        )
        self.case: str | None = None
        self.started = 0.0

    def send(self, name: str) -> None:
        self.case, self.started = name, time.monotonic()
        assert self.proc.stdin is not None
        self.proc.stdin.write(name + "\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def run_cases(
    ep: str,
    names: Sequence[str],
    *,
    workers: int = 2,
    timeout: float = DEFAULT_TIMEOUT,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, CaseResult]:
    """Run ``names`` on ``ep`` (or ``"onnxruntime"``); results keyed by case name."""
    ops = node_cases()
    pending = list(reversed(names))
    results: dict[str, CaseResult] = {}
    selector = selectors.DefaultSelector()
    pool: list[_Worker] = []

    def start() -> _Worker:
        worker = _Worker(ep)
        assert worker.proc.stdout is not None
        selector.register(worker.proc.stdout, selectors.EVENT_READ, worker)
        pool.append(worker)
        return worker

    def retire(worker: _Worker, status: str, message: str) -> None:
        assert worker.case is not None and worker.proc.stdout is not None
        results[worker.case] = CaseResult(worker.case, status, ops.get(worker.case, ""), message)
        selector.unregister(worker.proc.stdout)
        worker.kill()
        pool.remove(worker)

    def feed(worker: _Worker) -> None:
        if pending:
            worker.send(pending.pop())
        else:
            worker.case = None

    for _ in range(min(workers, len(names))):
        feed(start())
    try:
        while any(w.case is not None for w in pool):
            for key, _ in selector.select(timeout=1.0):
                worker: _Worker = key.data
                line = worker.proc.stdout.readline() if worker.proc.stdout else ""
                if not line:  # the worker died: a crash in that case
                    code = worker.proc.poll()
                    retire(worker, "error", f"worker crashed (exit code {code})")
                    feed(start())
                    continue
                data = json.loads(line)
                results[data["name"]] = CaseResult(
                    data["name"], data["status"], ops.get(data["name"], ""), data["message"]
                )
                feed(worker)
                if progress:
                    progress(len(results), len(names))
            now = time.monotonic()
            for worker in list(pool):
                if worker.case is not None and now - worker.started > timeout:
                    retire(worker, "error", f"timed out after {timeout:.0f} s")
                    feed(start())
                    if progress:
                        progress(len(results), len(names))
    finally:
        for worker in pool:
            if worker.proc.stdin:
                worker.proc.stdin.close()
            worker.kill()
    return results


@dataclass
class Summary:
    """Counts of one run, and its failures grouped by operator."""

    ep: str
    counts: Counter[str]
    failures_by_op: dict[str, list[CaseResult]]
    excluded: dict[str, str]

    @classmethod
    def of(
        cls, ep: str, results: Iterable[CaseResult], excluded: dict[str, str] | None = None
    ) -> Summary:
        counts: Counter[str] = Counter()
        by_op: dict[str, list[CaseResult]] = defaultdict(list)
        for result in results:
            counts[result.status] += 1
            if result.status != "pass":
                by_op[result.op_type].append(result)
        return cls(ep, counts, dict(sorted(by_op.items())), dict(excluded or {}))

    def to_dict(self) -> dict:
        return {
            "ep": self.ep,
            "counts": dict(self.counts),
            "failures": {op: [asdict(r) for r in rs] for op, rs in self.failures_by_op.items()},
        }


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        _worker(sys.argv[2])
    else:
        sys.exit("usage: python -m nxrt.tools.conformance --worker EP")

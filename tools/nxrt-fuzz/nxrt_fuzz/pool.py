"""Worker processes that run cases with a timeout, the run driver, and the minimizer.

Every case runs in a worker process, never in the driver: a case that
crashes the process (a segfault in a kernel) or runs past the timeout
kills only its worker, and the driver records a ``crash`` or a ``hang``
(or an ``ort crash`` when onnxruntime was the one running) and starts a
fresh worker. The timeout detects hangs; it is not a speed limit, so it is
generous. Workers tell the driver which runtime they are in before each
run, which is how a crash is attributed.

Each failure is minimized here, in the driver, by asking a worker to run
smaller candidates: one node instead of the graph, fewer attributes,
smaller inputs; a candidate is kept when it fails the same way (same
outcome, same op). The result is saved as a regression case.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import onnx

from nxrt_fuzz.case import Case
from nxrt_fuzz.run import (
    CRASH,
    DRIFT,
    FAILURES,
    FUZZER_ERROR,
    HANG,
    KINDS,
    KNOWN,
    ORT_CRASH,
    Outcome,
)

DEFAULT_TIMEOUT = 300.0


class Worker:
    """One worker process; :meth:`request` sends a command and waits for its answer.

    A reader thread moves the worker's lines into a queue, so waiting with a
    timeout never depends on what a buffered pipe has already read ahead.
    """

    def __init__(self, ep: str) -> None:
        self.ep = ep
        self.proc: subprocess.Popen[str] | None = None
        self.lines: queue.Queue[str | None] = queue.Queue()

    def _start(self) -> subprocess.Popen[str]:
        env = dict(os.environ)
        for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            env.setdefault(name, "1")
        proc = subprocess.Popen(
            [sys.executable, "-m", "nxrt_fuzz.worker", self.ep],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            bufsize=1,
            env=env,
        )
        self.lines = queue.Queue()
        threading.Thread(target=_pump, args=(proc, self.lines), daemon=True).start()
        return proc

    def request(self, command: dict, timeout: float) -> tuple[dict | None, str]:
        """The worker's answer, or ``None`` and ``crash:<phase>`` / ``hang:<phase>``."""
        if self.proc is None or self.proc.poll() is not None:
            self.proc = self._start()
        assert self.proc.stdin is not None
        phase = "start"
        try:
            self.proc.stdin.write(json.dumps(command) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            self.close()
            return None, f"crash:{phase}"
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(deadline - time.monotonic(), 0))
            except queue.Empty:
                self.close()
                return None, f"hang:{phase}"
            if line is None:
                code = self.proc.wait()
                self.proc = None
                return None, f"crash:{phase} (exit code {code})"
            message = json.loads(line)
            if "phase" in message:
                phase = message["phase"]
            else:
                return message, ""

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def _pump(proc: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.put(line)
    lines.put(None)


def outcome_of(answer: dict | None, failure: str) -> Outcome:
    """The outcome a worker reported, or the one its death or silence implies."""
    if answer is not None:
        culprit = Case.load(answer["culprit"]) if answer.get("culprit") else None
        return Outcome(answer["kind"], answer["detail"], answer["op"], culprit)
    how, _, phase = failure.partition(":")
    if not phase.startswith("nxrt"):
        return Outcome(ORT_CRASH, f"{how} while {phase}")
    return Outcome(CRASH if how == "crash" else HANG, f"{how} while running nxrt ({phase})")


@dataclass
class Finding:
    """One failure: where it came from, what it was, and its minimized case once made."""

    seed: int
    index: int
    outcome: Outcome
    saved: str = ""


@dataclass
class Report:
    """Counts by outcome, and the failures found."""

    ep: str
    seed: int
    counts: Counter[str] = field(default_factory=Counter)
    findings: list[Finding] = field(default_factory=list)
    ops: Counter[str] = field(default_factory=Counter)
    #: Cases that gave the tested EP at least one node, and how many nodes in all.
    ep_cases: int = 0
    ep_nodes: int = 0
    fuzzer_errors: list[tuple[int, str]] = field(default_factory=list)
    #: Known differences by entry id, and the cases that drifted (index, why).
    known: Counter[str] = field(default_factory=Counter)
    drifts: list[tuple[int, str]] = field(default_factory=list)

    @property
    def cases(self) -> int:
        return sum(self.counts.values())

    def summary(self) -> str:
        """The one line a run ends with."""
        parts = ", ".join(f"{k} {self.counts.get(k, 0)}" for k in KINDS if self.counts.get(k))
        failed = sum(self.counts.get(k, 0) for k in FAILURES)
        placed = ""
        if self.ep != "cpu":
            placed = f"; {self.ep_cases} cases gave {self.ep_nodes} nodes to {self.ep}"
        return (
            f"nxrt_fuzz {self.ep} seed {self.seed}: {self.cases} cases: {parts or 'none'}; "
            f"failures {failed} (wrong result {self.counts.get('wrong result', 0)}, "
            f"nxrt-only error {self.counts.get('nxrt-only error', 0)}, "
            f"crash {self.counts.get('crash', 0)}, hang {self.counts.get('hang', 0)}){placed}"
        )

    def to_dict(self) -> dict:
        return {
            "ep": self.ep,
            "seed": self.seed,
            "counts": dict(self.counts),
            "summary": self.summary(),
            "failures": [
                {
                    "seed": f.seed,
                    "index": f.index,
                    "kind": f.outcome.kind,
                    "op": f.outcome.op,
                    "detail": f.outcome.detail,
                    "saved": f.saved,
                }
                for f in self.findings
            ],
            "known": dict(self.known.most_common()),
            "drifts": [{"index": i, "detail": d} for i, d in sorted(self.drifts)],
        }


def fuzz(
    seed: int,
    indices: range | list[int],
    *,
    ep: str = "cpu",
    workers: int = 1,
    timeout: float = DEFAULT_TIMEOUT,
    out: str | None = None,
    minimize_each: int = 1,
    progress: Callable[[Report], None] | None = None,
    ops: list[str] | None = None,
) -> Report:
    """Run cases ``(seed, i)`` for ``i`` in ``indices``; minimize and save failures in ``out``.

    ``minimize_each`` failures of each signature (kind, op, error type) are
    minimized; the rest are counted and listed. ``ops`` narrows the ops drawn.
    """
    report = Report(ep, seed)
    work: queue.Queue[int] = queue.Queue()
    for i in indices:
        work.put(i)
    lock = threading.Lock()
    minimized: Counter[str] = Counter()
    scratch = tempfile.mkdtemp(prefix="nxrt-fuzz-")
    if out:
        os.makedirs(out, exist_ok=True)

    def drive() -> None:
        worker = Worker(ep)
        try:
            while True:
                try:
                    index = work.get_nowait()
                except queue.Empty:
                    return
                command = {"cmd": "gen", "seed": seed, "index": index, "dir": scratch, "ops": ops}
                answer, failure = worker.request(command, timeout)
                outcome = outcome_of(answer, failure)
                with lock:
                    report.counts[outcome.kind] += 1
                    for op in (answer or {}).get("ops", []):
                        report.ops[op] += 1
                    on_ep = (answer or {}).get("on_ep", 0)
                    report.ep_cases += bool(on_ep)
                    report.ep_nodes += on_ep
                    if progress:
                        progress(report)
                with lock:
                    if outcome.kind == FUZZER_ERROR:
                        report.fuzzer_errors.append((index, outcome.detail))
                    elif outcome.kind == KNOWN:
                        report.known[outcome.detail.split(":", 1)[0]] += 1
                    elif outcome.kind == DRIFT:
                        report.drifts.append((index, outcome.detail))
                if outcome.kind not in FAILURES:
                    continue
                finding = Finding(seed, index, outcome)
                with lock:
                    report.findings.append(finding)
                    take = minimized[outcome.signature()] < minimize_each and out is not None
                    minimized[outcome.signature()] += 1
                if take:
                    case = outcome.culprit or regenerate(worker, command, timeout)
                    if case is not None:
                        small = minimize(case, outcome, worker, scratch, timeout)
                        name = f"{outcome.kind.replace(' ', '-')}-{outcome.op}-{seed}-{index}.npz"
                        assert out is not None
                        small.note = (
                            f"{outcome.kind} ({outcome.op}): {outcome.detail}; {small.note}"
                        )
                        small.save(os.path.join(out, name))
                        finding.saved = name
        finally:
            worker.close()

    threads = [threading.Thread(target=drive) for _ in range(max(1, workers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    report.findings.sort(key=lambda f: f.index)
    if out:
        with open(os.path.join(out, f"report-{ep}-{seed}.json"), "w") as f:
            json.dump(report.to_dict(), f, indent=1)
    return report


def regenerate(worker: Worker, command: dict, timeout: float) -> Case | None:
    """The case a ``gen`` command made, as built (for a crash or hang, whose worker died)."""
    answer, _ = worker.request({**command, "cmd": "make"}, timeout)
    return Case.load(answer["case"]) if answer and "case" in answer else None


def evaluate_in(worker: Worker, case: Case, scratch: str, timeout: float) -> Outcome:
    """Classify ``case`` in the worker (the driver never runs a case itself)."""
    path = os.path.join(scratch, f"candidate-{os.getpid()}-{threading.get_ident()}.npz")
    case.save(path)
    answer, failure = worker.request({"cmd": "eval", "path": path, "dir": scratch}, timeout)
    return outcome_of(answer, failure)


def minimize(
    case: Case, outcome: Outcome, worker: Worker, scratch: str, timeout: float, budget: int = 120
) -> Case:
    """A smaller case that fails like ``outcome`` did: one node, fewer attributes, smaller
    inputs. Stops after ``budget`` candidates."""
    tries = 0
    if outcome.kind in (CRASH, HANG):
        budget = min(budget, 12)  # each candidate that still hangs costs a whole timeout

    def same(candidate: Case) -> bool:
        nonlocal tries
        tries += 1
        got = evaluate_in(worker, candidate, scratch, timeout)
        if got.signature() == outcome.signature():
            if got.culprit is not None and got.kind not in (CRASH, HANG):
                candidate.expected = got.culprit.expected
            return True
        return False

    best = case
    if len(best.model.graph.node) > 1:
        for candidate in prefixes(best):
            if tries < budget and same(candidate):
                best = candidate
                break
    for candidate_of in (fewer_attributes, fewer_inputs, smaller_feeds):
        improved = True
        while improved and tries < budget:
            improved = False
            for candidate in candidate_of(best):
                if tries >= budget:
                    break
                if same(candidate):
                    best, improved = candidate, True
                    break
    if not best.expected and outcome.culprit is not None:
        best.expected = outcome.culprit.expected
    return best


def _copy(case: Case) -> Case:
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    return Case(model, dict(case.feeds), note=case.note)


def prefixes(case: Case) -> Iterator[Case]:
    """The graph cut after each of its first nodes, shortest first."""
    nodes = list(case.model.graph.node)
    for k in range(1, len(nodes)):
        small = _copy(case)
        del small.model.graph.node[k:]
        made = [o for n in small.model.graph.node for o in n.output if o]
        used = {i for n in small.model.graph.node for i in n.input}
        del small.model.graph.output[:]
        small.model.graph.output.extend(
            onnx.helper.make_value_info(o, onnx.TypeProto()) for o in made if o not in used
        )
        yield _drop_unused(small)


def fewer_attributes(case: Case) -> Iterator[Case]:
    for n, node in enumerate(case.model.graph.node):
        for a in range(len(node.attribute)):
            if node.attribute[a].type == onnx.AttributeProto.GRAPH:
                continue
            small = _copy(case)
            del small.model.graph.node[n].attribute[a]
            yield small


def fewer_inputs(case: Case) -> Iterator[Case]:
    """Trailing optional inputs left out."""
    for n, node in enumerate(case.model.graph.node):
        if len(node.input) > 1 and node.input[-1]:
            small = _copy(case)
            del small.model.graph.node[n].input[-1]
            yield _drop_unused(small)


def smaller_feeds(case: Case) -> Iterator[Case]:
    """Each feed cut to length 1, then to half, along each of its axes."""
    for name, value in case.feeds.items():
        for axis, length in enumerate(value.shape):
            for new in dict.fromkeys((1, length // 2)):
                if 0 < new < length:
                    small = _copy(case)
                    small.feeds[name] = np.take(value, range(new), axis=axis)
                    _retype(small, name)
                    yield small


def _retype(case: Case, name: str) -> None:
    for value_info in case.model.graph.input:
        if value_info.name == name:
            shape = case.feeds[name].shape
            dims = value_info.type.tensor_type.shape.dim
            for dim, size in zip(dims, shape):
                dim.dim_value = size


def _drop_unused(case: Case) -> Case:
    used = {i for n in case.model.graph.node for i in n.input}
    graph = case.model.graph
    keep_inputs = [i for i in graph.input if i.name in used]
    keep_inits = [t for t in graph.initializer if t.name in used]
    del graph.input[:]
    graph.input.extend(keep_inputs)
    del graph.initializer[:]
    graph.initializer.extend(keep_inits)
    case.feeds = {k: v for k, v in case.feeds.items() if k in used}
    return case

"""Choosing the EPs of a session the caller gave no ``providers`` for.

An explicit ``providers`` list is always honoured, as in ONNX Runtime. With
none, the session's provider-selection policy decides
(``SessionOptions.set_provider_selection_policy``, named like ONNX Runtime's
``OrtExecutionProviderDevicePolicy``):

- ``MEASURE`` (nxrt's default, also ``DEFAULT`` and ``MAX_PERFORMANCE``):
  build every candidate plan — cpu alone, each installed EP with the cpu
  fallback, and mixes where a second EP takes what the first left to cpu — run
  each once untimed (its one-time costs: building, compiling, first-run
  allocation, reported beside its time but never part of it), then time it on
  feeds made from the model's input types and shapes, and keep the fastest.
  Candidates that fail to build or run are skipped and reported. A candidate
  whose EPs compile in the background (the cpu EP's tiered kernels) is timed
  once its own kernels are built (``ExecutionProvider.wait_for_compiled``; the
  wait is a one-time cost), so its time is its steady speed; every time is
  taken with background compiling held (``ExecutionProvider.hold_compiles``),
  so no candidate is timed beside another's compile. One still compiling when
  the budget runs out is timed on its interim kernels: if it wins anyway the
  decision stands (compiled kernels only make it faster), else the decision
  serves this session only. The candidates not chosen drop the compiles they
  have not started (``ExecutionProvider.cancel_compiles``). The budget is
  wall-clock time from the start of selection: no candidate is built, and no
  timing round started, once it is spent, so selection ends within the budget
  plus one candidate's build. The decision is cached on disk only when every
  candidate was measured (or failed): one taken with candidates unmeasured, as
  on a cold machine where compiling ate the budget, serves this session only,
  and the next session measures again. The cache key holds what makes a
  decision valid: nxrt's version, every installed EP's distribution and
  version (with its backend's, and the source folder of an editable install),
  the model's digest, the CPU (model, cores, instruction sets, forced targets),
  the thread count and the input shapes measured.
- ``PRIORITY``: the EPs in the order of their device-aware preference (the
  ``preference:N`` capability an EP advertises; mlx, for one, is high on a
  GPU and low on a CPU), then declared priority. No measuring.
- ``PREFER_CPU`` / ``PREFER_GPU`` / ``PREFER_NPU``: EPs on that device type
  first (by preference), then the others; ``MAX_EFFICIENCY`` and
  ``MIN_OVERALL_POWER`` prefer NPU, then GPU, then CPU.

This module knows policies, candidates, feeds, timing and the cache, and
:func:`decide` is the one place that dispatches on the policy; the pipeline
starts the EPs and builds each candidate for it (callbacks), so nothing here
imports the pipeline.

Config entries (``SessionOptions.add_session_config_entry``):

- ``nxrt.selection.budget_ms`` — the wall-clock budget of selection, starting the
  EPs included (default 5000);
- ``nxrt.selection.runs`` — timing rounds over the candidates (default 7);
- ``nxrt.selection.dims`` — values for symbolic dims, e.g. ``batch=8,seq=128``;
  any other dynamic dim is 1;
- ``nxrt.selection.shapes`` — whole input shapes, e.g. ``x:450x1x28x28,mask:450x128``
  (trtexec's form; a name may hold ``:``, the last one separates), ahead of
  ``dims``: ``nxrt run`` passes its feeds' shapes, so candidates are measured at
  the batch about to run;
- ``nxrt.selection.cache`` — ``0`` turns the on-disk cache off. The cache
  folder is ``platformdirs.user_cache_dir("nxrt")/selection``, or
  ``$NXRT_CACHE_DIR/selection``.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np

from nxrt._files import cache_folder, write_atomically
from nxrt.errors import InvalidArgument, NxrtError
from nxrt.pipeline.model import numpy_dtype

if TYPE_CHECKING:
    import onnx
    import onnx_ir as ir

BUDGET_MS = "nxrt.selection.budget_ms"
RUNS = "nxrt.selection.runs"
DIMS = "nxrt.selection.dims"
SHAPES = "nxrt.selection.shapes"
CACHE = "nxrt.selection.cache"
DEFAULT_BUDGET_MS = 5000.0
DEFAULT_RUNS = 7
#: Untimed run-in before each candidate's timed block (config ``nxrt.selection.settle_ms``).
SETTLE_MS = "nxrt.selection.settle_ms"
DEFAULT_SETTLE_MS = 100.0
#: The longest wait (ms) for a background build in progress before timing, once the
#: budget is spent (before, the rest of the budget).
HOLD_WAIT_MS = 1000.0
#: Timed blocks per candidate; ``runs`` samples are spread over them.
BLOCKS = 2
CACHE_FORMAT = 4
#: What a candidate skipped for lack of time says; a report holding one is never cached.
NOT_MEASURED = "not measured: budget spent"


class ExecutionProviderDevicePolicy(enum.Enum):
    """How a session without ``providers`` picks its EPs (ONNX Runtime's names, plus nxrt's)."""

    DEFAULT = "default"
    PREFER_CPU = "prefer_cpu"
    PREFER_NPU = "prefer_npu"
    PREFER_GPU = "prefer_gpu"
    MAX_PERFORMANCE = "max_performance"
    MAX_EFFICIENCY = "max_efficiency"
    MIN_OVERALL_POWER = "min_overall_power"
    MEASURE = "measure"
    PRIORITY = "priority"

    @classmethod
    def parse(cls, value: Any) -> ExecutionProviderDevicePolicy:
        """A policy from itself, its name or its value (case-insensitive)."""
        if isinstance(value, cls):
            return value
        text = str(getattr(value, "name", value)).lower()
        for policy in cls:
            if text in (policy.value, policy.name.lower()):
                return policy
        names = ", ".join(p.name for p in cls)
        raise InvalidArgument(f"unknown provider selection policy {value!r}; one of {names}")

    @property
    def measures(self) -> bool:
        return self in (
            ExecutionProviderDevicePolicy.DEFAULT,
            ExecutionProviderDevicePolicy.MAX_PERFORMANCE,
            ExecutionProviderDevicePolicy.MEASURE,
        )


#: Device types each device policy puts first, best first.
DEVICE_ORDER = {
    ExecutionProviderDevicePolicy.PREFER_CPU: ("cpu",),
    ExecutionProviderDevicePolicy.PREFER_GPU: ("gpu", "cuda", "metal"),
    ExecutionProviderDevicePolicy.PREFER_NPU: ("npu",),
    ExecutionProviderDevicePolicy.MAX_EFFICIENCY: ("npu", "gpu", "cuda", "metal"),
    ExecutionProviderDevicePolicy.MIN_OVERALL_POWER: ("npu", "gpu", "cuda", "metal"),
}


@dataclass(frozen=True)
class EpInfo:
    """What selection knows of one installed EP."""

    id: str
    device_type: str
    preference: int
    priority: int


def order_by_preference(eps: Sequence[EpInfo]) -> list[EpInfo]:
    """Highest advertised preference first, then declared priority, then id."""
    return sorted(eps, key=lambda e: (-e.preference, -e.priority, e.id))


def order_for_device(eps: Sequence[EpInfo], policy: ExecutionProviderDevicePolicy) -> list[EpInfo]:
    """The EPs of the policy's device types first (in its order), each group by preference."""
    wanted = DEVICE_ORDER.get(policy, ())

    def rank(info: EpInfo) -> int:
        device = info.device_type.lower()
        return next((i for i, d in enumerate(wanted) if device.startswith(d)), len(wanted))

    return sorted(order_by_preference(eps), key=rank)


def candidates(eps: Sequence[EpInfo], fallback: str = "cpu") -> list[list[str]]:
    """The single-EP candidates in the order they are built: the fallback alone first (the
    baseline, and the candidate that compiles in the background on a cold machine: built
    first, it compiles while the others build), then every other EP with the fallback,
    by preference. Mixes are added by :func:`measure` once a plan shows what its first EP
    left to the fallback."""
    others = [[e.id, fallback] for e in order_by_preference(eps) if e.id != fallback]
    return [[fallback], *others]


# -- feeds -----------------------------------------------------------------------------------------
def parse_dims(text: str) -> dict[str, int]:
    """``"batch=8,seq=128"`` -> ``{"batch": 8, "seq": 128}``."""
    dims: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition("=")
        try:
            dims[name.strip()] = int(value)
        except ValueError:
            raise InvalidArgument(
                f"{DIMS} takes name=value pairs, e.g. batch=8,seq=128; got {item!r}"
            ) from None
    return dims


def parse_shapes(text: str) -> dict[str, tuple[int, ...]]:
    """``"x:450x1x28x28,mask:450x128"`` -> ``{"x": (450, 1, 28, 28), "mask": (450, 128)}``."""
    shapes: dict[str, tuple[int, ...]] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, dims = item.rpartition(":")
        try:
            if not sep or not name:
                raise ValueError(item)
            shape = tuple(int(d) for d in dims.split("x")) if dims.strip() else ()
            if any(d < 0 for d in shape):
                raise ValueError(item)
        except ValueError:
            raise InvalidArgument(
                f"{SHAPES} takes name:shape pairs, e.g. x:8x3x224x224,mask:8x128; got {item!r}"
            ) from None
        shapes[name.strip()] = shape
    return shapes


def check_shapes(inputs: Sequence[ir.Value], shapes: Mapping[str, Sequence[int]]) -> None:
    """Refuse ``shapes`` that name no input, or disagree with an input's rank or fixed dims."""
    by_name = {cast(str, value.name): value for value in inputs}
    for name, shape in shapes.items():
        value = by_name.get(name)
        if value is None:
            known = ", ".join(by_name) or "none"
            raise InvalidArgument(f"{SHAPES} names input {name!r}; the model's inputs: {known}")
        declared = value.shape
        if declared is None:
            continue
        fixed = [d if isinstance(d, int) else None for d in declared]
        if len(fixed) != len(shape) or any(f is not None and f != d for f, d in zip(fixed, shape)):
            want = "x".join("?" if f is None else str(f) for f in fixed)
            have = "x".join(str(d) for d in shape)
            raise InvalidArgument(f"{SHAPES} gives input {name!r} shape {have}; it is {want}")


def feed_shapes(
    inputs: Sequence[ir.Value],
    dims: Mapping[str, int],
    shapes: Mapping[str, Sequence[int]] | None = None,
) -> dict[str, tuple[int, ...]]:
    """The shape each input is measured at: from ``shapes``, else its declared shape with
    symbolic dims from ``dims`` (else 1). A non-tensor input is an ``InvalidArgument``."""
    result: dict[str, tuple[int, ...]] = {}
    for value in inputs:
        name = cast(str, value.name)  # graph inputs are named
        if type(value.type).__name__ != "TensorType" or value.dtype is None:
            raise InvalidArgument(f"input {name!r} is not a tensor of known type")
        if shapes and name in shapes:
            result[name] = tuple(int(d) for d in shapes[name])
            continue
        shape = []
        for dim in value.shape or ():
            if isinstance(dim, int):
                shape.append(dim)
            else:
                shape.append(int(dims.get(str(getattr(dim, "value", dim)), 1)))
        result[name] = tuple(shape)
    return result


def synthesize_feeds(
    inputs: Sequence[ir.Value],
    dims: Mapping[str, int],
    shapes: Mapping[str, Sequence[int]] | None = None,
) -> dict[str, Any]:
    """Seeded feeds for the model's inputs, at :func:`feed_shapes`.

    Integer inputs get small non-negative values (indices and ids stay in range
    for most models); floats are standard normal.
    """
    rng = np.random.default_rng(0)
    feeds: dict[str, Any] = {}
    resolved = feed_shapes(inputs, dims, shapes)
    for value in inputs:
        name = cast(str, value.name)  # graph inputs are named
        shape = resolved[name]
        dtype = numpy_dtype(int(cast("ir.DataType", value.dtype)))  # checked by feed_shapes
        if dtype.kind == "f":
            feeds[name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind in "iu":
            feeds[name] = rng.integers(0, 2, shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[name] = rng.integers(0, 2, shape).astype(bool)
        elif dtype.kind in "OSU":  # text: a short word per element
            feeds[name] = np.full(shape, "text", dtype=object)
        else:
            raise InvalidArgument(f"cannot make a feed of {dtype} for input {name!r}")
    return feeds


# -- the report ------------------------------------------------------------------------------------
@dataclass
class Candidate:
    """One candidate plan: its providers, its time (median warm sample) or why it was
    skipped, and its one-time costs, kept apart from its time."""

    providers: list[str]
    time_ms: float | None = None
    skipped: str = ""
    #: Building the plan: EPs started, kernels created, claims compiled.
    build_ms: float | None = None
    #: Its first run, untimed: first-run allocation and whatever compiles lazily.
    first_run_ms: float | None = None
    #: Waiting, before timing, for the kernels its EPs compile in the background.
    compile_ms: float | None = None
    #: Whether it was still compiling when timed: its time is then its interim kernels'.
    compiling: bool = False

    @property
    def measured(self) -> bool:
        """Whether the candidate was tried: timed at its steady speed, or failed (a budget
        skip is neither, nor a time taken while its kernels were still compiling)."""
        if self.time_ms is not None:
            return not self.compiling
        return bool(self.skipped) and self.skipped != NOT_MEASURED


def decided(tried: Sequence[Candidate], choice: Sequence[str]) -> bool:
    """Whether a choice among ``tried`` holds for every later session: each candidate was
    measured (or failed), the chosen one possibly while still compiling (timed on its
    interim kernels and still the fastest, its compiled kernels only make it faster)."""
    return all(
        c.measured or (c.compiling and c.time_ms is not None and c.providers == list(choice))
        for c in tried
    )


@dataclass
class SelectionReport:
    """How a session's EPs were chosen (shown by ``get_partition()`` and the CLI)."""

    policy: str
    choice: list[str]
    candidates: list[Candidate] = field(default_factory=list)
    from_cache: bool = False
    seconds: float = 0.0
    note: str = ""
    #: Whether the decision was written to the cache (only when every candidate was tried).
    cached: bool = False

    @property
    def complete(self) -> bool:
        """Whether every candidate was measured (or failed): only such a decision is cached."""
        return decided(self.candidates, self.choice)

    def lines(self) -> list[str]:
        how = "from the cache" if self.from_cache else f"in {self.seconds:.2f} s"
        lines = [f"selection: policy {self.policy}, chose {','.join(self.choice)} ({how})"]
        for c in self.candidates:
            mark = "*" if c.providers == self.choice else " "
            what = f"{c.time_ms:.3f} ms" if c.time_ms is not None else f"skipped: {c.skipped}"
            costs = (
                ("build", c.build_ms),
                ("first run", c.first_run_ms),
                ("compile", c.compile_ms),
            )
            once = [f"{label} {_duration(ms)}" for label, ms in costs if ms is not None]
            if once and c.time_ms is not None:
                what = f"{what:<12} (one-time: {', '.join(once)})"
            if c.compiling:
                what += ", timed while still compiling"
            lines.append(f"  {mark} {','.join(c.providers):<28} {what}")
        if self.note:
            lines.append(f"  {self.note}")
        return lines

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _duration(ms: float) -> str:
    return f"{ms / 1000:.2f} s" if ms >= 1000 else f"{ms:.1f} ms"


# -- measuring -------------------------------------------------------------------------------------
class CandidatePlan(Protocol):
    """A built candidate as :func:`measure` uses it. It may also have
    ``wait_for_compiled(timeout) -> bool``, ``hold_compiles(timeout)`` (a context in which
    no background compile starts) and ``discard()``: its EPs' background compiles."""

    def run(self, feeds: dict[str, Any]) -> None:
        """Run the plan once."""

    def leftover(self) -> bool:
        """Whether the plan's first EP left nodes to the fallback EP."""


#: Builds a candidate from its providers.
BuildCandidate = Callable[[list[str]], CandidatePlan]


@dataclass
class Measurement:
    """What :func:`measure` found: the winner, its built object, and every candidate."""

    choice: list[str]
    #: The winner's built object (``None`` when no candidate was built and run).
    built: CandidatePlan | None
    candidates: list[Candidate]
    note: str = ""

    @property
    def complete(self) -> bool:
        """Whether every candidate was measured (or failed): only then may it be cached."""
        return decided(self.candidates, self.choice)


@dataclass
class _Timed:
    candidate: Candidate
    plan: CandidatePlan
    repeat: int  # runs per sample, so a fast plan's sample spans about a millisecond
    samples: list[float] = field(default_factory=list)


def measure(
    eps: Sequence[EpInfo],
    build: BuildCandidate,
    feeds: dict[str, Any],
    *,
    budget_ms: float,
    runs: int,
    settle_ms: float = DEFAULT_SETTLE_MS,
    fallback: str = "cpu",
    started: float | None = None,
) -> Measurement:
    """Build and run every candidate, then time them in interleaved blocks; the fastest wins.

    Candidates are built in the order of :func:`candidates`; a candidate whose
    first EP left nodes to the fallback adds a mix with the next EP ahead of the
    fallback. Each built candidate runs once untimed — its build and this first
    run are its one-time costs (compiling, first-run allocation), recorded
    apart — then once more for its first warm sample.

    Timing goes through the built candidates in :data:`BLOCKS` blocks of
    ``runs / BLOCKS`` samples, the order rotating each block so drift favours
    none; each block starts with ``settle_ms`` of untimed runs, so the previous
    candidate's spinning threads have gone idle, as they have when a session
    runs on its own. A candidate's time is its median sample, the figure a
    user's steady runs see (its first warm sample when no block reached it).

    The budget is wall-clock time from ``started`` (default: now; the pipeline
    passes the start of selection, so starting the EPs counts too). Once it is
    spent nothing new starts: no build but the first, no timing of another
    candidate; so selection ends within the budget plus one candidate's build
    and first runs. Candidates never built are reported as
    :data:`NOT_MEASURED`, which makes the result incomplete (never cached).

    :returns: The :class:`Measurement`; its note says when the budget cut
        measuring short.
    """
    queue = candidates(eps, fallback)
    ids = {e.id for e in eps}
    results: list[Candidate] = []
    built: list[_Timed] = []
    start = time.perf_counter() if started is None else started
    note = ""

    def spent() -> float:
        return (time.perf_counter() - start) * 1000

    while queue:
        providers = queue.pop(0)
        if any(p not in ids for p in providers):
            continue
        if results and spent() >= budget_ms:
            skipped = [providers, *(p for p in queue if all(i in ids for i in p))]
            results.extend(Candidate(p, skipped=NOT_MEASURED) for p in skipped)
            note = (
                f"budget of {budget_ms:.0f} ms spent; {len(skipped)} candidate(s) not "
                "measured, so this choice serves this session only (not cached)"
            )
            break
        candidate = Candidate(providers)
        results.append(candidate)
        try:
            t0 = time.perf_counter()
            plan = build(providers)
            t1 = time.perf_counter()
            candidate.build_ms = (t1 - t0) * 1000
            plan.run(feeds)  # one-time costs: first-run allocations, lazy compilation
            t2 = time.perf_counter()
            candidate.first_run_ms = (t2 - t1) * 1000
            plan.run(feeds)  # sizes its samples; timed later, with compiles held
            warm_ms = (time.perf_counter() - t2) * 1000
        except Exception as exc:  # noqa: BLE001 - a candidate that fails is skipped, never fatal
            candidate.skipped = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            continue
        repeat = min(50, max(1, int(1.0 / max(warm_ms, 1e-3))))
        built.append(_Timed(candidate, plan, repeat))
        if len(providers) == 2 and plan.leftover():
            for other in order_by_preference(eps):
                mix = [providers[0], other.id, fallback]
                if other.id not in providers and other.id != fallback and mix not in queue:
                    queue.insert(0, mix)
                    break
    compiling = _wait_for_compiles(built, spent, budget_ms)
    blocks = max(1, min(BLOCKS, runs))
    per_block = max(1, -(-runs // blocks))
    first_samples: dict[int, list[float]] = {}
    # every time is taken with background compiles held, even once the budget is spent
    with _holding([t.plan for t in built], max(budget_ms - spent(), HOLD_WAIT_MS)):
        for t in built:  # one sample each, whatever the budget: a choice needs them
            _time_block(t, feeds, 0.0, 1, lambda: 0.0, budget_ms)
            first_samples[id(t)], t.samples = t.samples, []
        for block in range(blocks):
            order = [built[(block + k) % len(built)] for k in range(len(built))] if built else []
            if any(_time_block(t, feeds, settle_ms, per_block, spent, budget_ms) for t in order):
                note = note or f"budget of {budget_ms:.0f} ms spent in timing block {block + 1}"
                break
    best: _Timed | None = None
    for t in built:
        if t.candidate.skipped:
            continue
        t.candidate.time_ms = statistics.median(t.samples or first_samples[id(t)])
        if best is None or t.candidate.time_ms < (best.candidate.time_ms or 0.0):
            best = t
    for t in built:  # the losers' background compiles would only slow the winner down
        if t is not best and hasattr(t.plan, "discard"):
            t.plan.discard()
    if best is None:
        return Measurement([fallback], None, results, note or "every candidate failed")
    if compiling:
        still = f"{', '.join(compiling)} still compiling when the budget of {budget_ms:.0f} ms "
        if decided(results, best.candidate.providers):
            still += "was spent, timed on interim kernels and still the fastest"
        else:
            still += (
                "was spent, so timed on interim kernels: this choice serves this session "
                "only (not cached)"
            )
        note = f"{note}; {still}" if note else still
    return Measurement(best.candidate.providers, best.plan, results, note)


def _holding(
    plans: Sequence[CandidatePlan], timeout_ms: float
) -> contextlib.ExitStack[bool | None]:
    """A context in which none of ``plans``' EPs starts a background compile (each waits
    for the build in progress, within ``timeout_ms``): a time taken in it is the plan's."""
    stack = contextlib.ExitStack()
    deadline = time.perf_counter() + max(0.0, timeout_ms) / 1000
    for plan in plans:
        hold = getattr(plan, "hold_compiles", None)
        if hold is not None:
            stack.enter_context(hold(max(0.0, deadline - time.perf_counter())))
    return stack


def _wait_for_compiles(
    built: Sequence[_Timed], spent: Callable[[], float], budget_ms: float
) -> list[str]:
    """Before timing, let every built candidate's background compiles finish (within the
    budget), so that each is timed at its steady speed and none is slowed by another's
    compiling; what waiting took is a one-time cost. Returns the candidates still
    compiling when the budget ran out (their times are their interim kernels')."""
    still = []
    for t in built:
        wait = getattr(t.plan, "wait_for_compiled", None)
        if wait is None:
            continue
        t0 = time.perf_counter()
        done = wait(max(0.0, (budget_ms - spent()) / 1000))
        waited = (time.perf_counter() - t0) * 1000
        if waited >= 0.1:
            t.candidate.compile_ms = waited
        if not done:
            t.candidate.compiling = True
            still.append(",".join(t.candidate.providers))
    return still


def _time_block(
    timed: _Timed,
    feeds: dict[str, Any],
    settle_ms: float,
    samples: int,
    spent: Callable[[], float],
    budget_ms: float,
) -> bool:
    """One candidate's share of a timing block; ``True`` when the budget stopped it."""
    if timed.candidate.skipped:
        return False
    if spent() >= budget_ms:
        return True
    try:
        _settle(timed.plan, feeds, settle_ms)
        for _ in range(samples):
            t0 = time.perf_counter()
            for _ in range(timed.repeat):
                timed.plan.run(feeds)
            timed.samples.append((time.perf_counter() - t0) * 1000 / timed.repeat)
            if spent() >= budget_ms:
                return True
    except Exception as exc:  # noqa: BLE001 - fails on a later run: skipped too
        timed.candidate.skipped = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    return False


def _settle(plan: CandidatePlan, feeds: dict[str, Any], settle_ms: float) -> None:
    """Run ``plan`` untimed for ``settle_ms`` (at least once): the candidate timed before it
    leaves threads spinning (ONNX Runtime's pool, OpenVINO's, OpenBLAS's for about 0.1 s)
    that would slow this one's first runs, and this one's caches and pools warm up."""
    end = time.perf_counter() + settle_ms / 1000
    plan.run(feeds)
    while time.perf_counter() < end:
        plan.run(feeds)


# -- the policy ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Decision:
    """What a policy chose: its report, and the winner as measuring built it (``None``:
    the caller builds ``report.choice``)."""

    report: SelectionReport
    built: CandidatePlan | None = None


def decide(
    policy: ExecutionProviderDevicePolicy,
    inputs: Sequence[ir.Value],
    config: Mapping[str, str],
    *,
    start: Callable[[], tuple[list[EpInfo], list[Candidate]]],
    build: BuildCandidate,
    identity: Callable[[], tuple[str, list[tuple[str, str]]]],
    installed: Sequence[str],
    threads: int,
    fallback: str = "cpu",
    started: float | None = None,
) -> Decision:
    """The EPs ``policy`` chooses for a model with these graph ``inputs`` (module
    docstring): a valid cached decision, else the measured fastest candidate, else the EPs
    in the policy's order.

    :param config: The session's config entries (the ``nxrt.pipeline.selection.*`` ones).
    :param start: Starts every installed EP, for its device and preference; returns them
        and a skipped candidate for each EP that cannot start. Called only on a cache miss.
    :param build: Builds one candidate from its providers (:func:`measure`).
    :param identity: The model's digest and every installed EP's ``(id, version)``, for
        the cache key (:func:`cache_key`); called only when the cache is used.
    :param installed: The installed EPs' ids.
    :param threads: The session's intra-op thread count.
    :param started: When selection started (default: now); the budget counts from it.
    """
    started = time.perf_counter() if started is None else started
    dims = parse_dims(config.get(DIMS, ""))
    shapes = parse_shapes(config.get(SHAPES, ""))
    check_shapes(inputs, shapes)
    measured_shapes: dict[str, tuple[int, ...]] | None = None
    cannot_measure = ""
    if policy.measures:
        try:
            measured_shapes = feed_shapes(inputs, dims, shapes)
        except NxrtError as exc:  # e.g. map inputs: choose by preference instead of timing
            cannot_measure = f"not measured ({exc}); chose by preference"
    key = ""
    if config.get(CACHE, "1") not in ("0", "") and measured_shapes is not None:
        digest, versions = identity()
        key = cache_key(digest, versions, threads, dims, shapes=measured_shapes)
    cached = read_cached(key, set(installed)) if key else None
    if cached is not None:
        return Decision(cached)
    infos, unstarted = start()
    feeds: dict[str, Any] | None = None
    if measured_shapes is not None:
        try:
            feeds = synthesize_feeds(inputs, dims, shapes)
        except NxrtError as exc:
            cannot_measure = f"not measured ({exc}); chose by preference"
    if feeds is None:
        ordered = (
            order_for_device(infos, policy)
            if policy in DEVICE_ORDER
            else order_by_preference(infos)
        )
        choice = [i.id for i in ordered if i.id != fallback] + [fallback]
        return Decision(SelectionReport(policy.name, choice, unstarted, note=cannot_measure))
    found = measure(
        infos,
        build,
        feeds,
        budget_ms=float(config.get(BUDGET_MS, DEFAULT_BUDGET_MS)),
        runs=int(config.get(RUNS, DEFAULT_RUNS)),
        settle_ms=float(config.get(SETTLE_MS, DEFAULT_SETTLE_MS)),
        fallback=fallback,
        started=started,  # starting the EPs is part of the budget
    )
    report = SelectionReport(
        policy.name, found.choice, found.candidates + unstarted, note=found.note
    )
    report.seconds = time.perf_counter() - started
    if key and found.built is not None:
        report.cached = write_cached(key, report)  # refused unless complete
    return Decision(report, found.built)


# -- the cache -------------------------------------------------------------------------------------
def cache_dir() -> str:
    return cache_folder("selection")


#: CPU flags that change which kernels run (and how fast): instruction-set levels.
ISA_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "asimd",
    "sve",
)
#: Environment variables that force a code-generation target (SPEC 10's AVX2 CI runs).
TARGET_ENV = ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES", "OPENBLAS_CORETYPE")


def hardware() -> str:
    """The machine a measurement is valid for: architecture, CPU model, core count, the
    instruction sets it has, and any code-generation target forced by the environment."""
    found: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            for line in info:
                key, _, value = line.partition(":")
                key = "flags" if key.strip() == "Features" else key.strip()
                if key in ("model name", "flags"):
                    found.setdefault(key, value.strip())
                if len(found) == 2:
                    break
    except OSError:
        pass
    model = found.get("model name", platform.processor())
    flags = set(found.get("flags", "").split())
    isa = "+".join(f for f in ISA_FLAGS if f in flags)
    forced = ";".join(f"{k}={os.environ[k]}" for k in TARGET_ENV if os.environ.get(k))
    return f"{platform.system()}-{platform.machine()}-{model}-{os.cpu_count()}-{isa}-{forced}"


def distribution_identity(name: str) -> str:
    """``name=version`` of an installed distribution, with its source folder when it is an
    editable install (checkouts of one version differ in code, so they share no decision);
    ``name=unversioned`` when it is not installed."""
    from importlib_metadata import PackageNotFoundError, distribution

    try:
        dist = distribution(name)
    except PackageNotFoundError:
        return f"{name}=unversioned"
    identity = f"{name}={dist.version}"
    try:
        direct = json.loads(dist.read_text("direct_url.json") or "{}")
    except ValueError:
        direct = {}
    if direct.get("dir_info", {}).get("editable"):
        identity += f"@{direct.get('url', '')}"
    return identity


def cache_key(
    model_digest: str,
    eps: Sequence[tuple[str, str]],
    threads: int,
    dims: Mapping[str, int],
    *,
    shapes: Mapping[str, Sequence[int]] | None = None,
    runtime: str | None = None,
) -> str:
    """The key of a decision: everything that makes it valid (module docstring).

    :param model_digest: :func:`model_digest` of the model.
    :param eps: Every candidate EP's ``(id, version)``, versions as
        :func:`distribution_identity` gives them.
    :param threads: The session's intra-op thread count.
    :param dims: The configured symbolic dims.
    :param shapes: The input shapes measured (:func:`feed_shapes`).
    :param runtime: nxrt's own identity; default :func:`distribution_identity` of nxrt.
    """
    from nxrt import __version__

    parts = {
        "format": CACHE_FORMAT,
        "nxrt": runtime if runtime is not None else distribution_identity("nxrt"),
        "nxrt_version": __version__,
        "model": model_digest,
        "eps": sorted(f"{ep_id}={version}" for ep_id, version in eps),
        "hardware": hardware(),
        "threads": threads,
        "dims": sorted(dims.items()),
        "shapes": sorted((k, list(v)) for k, v in (shapes or {}).items()),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def read_cached(key: str, installed: set[str]) -> SelectionReport | None:
    """A cached decision, or ``None`` when there is none or it is unreadable or stale."""
    path = os.path.join(cache_dir(), f"{key}.json")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        report = SelectionReport(
            policy=str(data["policy"]),
            choice=[str(p) for p in data["choice"]],
            candidates=[Candidate(**c) for c in data["candidates"]],
            seconds=float(data.get("seconds", 0.0)),
            note=str(data.get("note", "")),
            cached=True,
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not report.choice or any(p not in installed for p in report.choice):
        return None
    if not report.complete:  # written by an older nxrt that cached incomplete decisions
        return None
    report.from_cache = True
    return report


def write_cached(key: str, report: SelectionReport) -> bool:
    """Store a complete decision; returns whether it was written. An incomplete one (a
    candidate not measured) is refused: it would spoil every later session. A cache that
    cannot be written only costs the next session time."""
    if not report.complete:
        return False
    data = report.to_dict()
    data.pop("from_cache", None)
    data.pop("cached", None)
    try:
        os.makedirs(cache_dir(), exist_ok=True)
        write_atomically(os.path.join(cache_dir(), f"{key}.json"), json.dumps(data).encode())
    except OSError:
        return False
    return True


def model_digest(source: str | os.PathLike[str] | bytes | onnx.ModelProto) -> str:
    """SHA-256 of the model's bytes (a path's file, bytes, or a serialized ModelProto)."""
    digest = hashlib.sha256()
    if isinstance(source, (str, os.PathLike)):
        with open(source, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    elif isinstance(source, (bytes, bytearray, memoryview)):
        digest.update(source)
    else:
        digest.update(source.SerializeToString())
    return digest.hexdigest()

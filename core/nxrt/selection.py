"""Choosing the EPs of a session the caller gave no ``providers`` for.

An explicit ``providers`` list is always honoured, as in ONNX Runtime. With
none, the session's provider-selection policy decides
(``SessionOptions.set_provider_selection_policy``, named like ONNX Runtime's
``OrtExecutionProviderDevicePolicy``):

- ``MEASURE`` (nxrt's default, also ``DEFAULT`` and ``MAX_PERFORMANCE``):
  build every candidate plan — each installed EP with the cpu fallback, cpu
  alone, and mixes where a second EP takes what the first left to cpu — run
  each a few times on feeds made from the model's input types and shapes, and
  keep the fastest. Candidates that fail to build or run are skipped and
  reported. Measuring stops when the creation budget is spent; the best
  plan so far wins. The decision is cached on disk, keyed by the model's
  digest, every candidate EP's id and version, the hardware and the thread
  count, so later sessions cost a lookup.
- ``PRIORITY``: the EPs in the order of their device-aware preference (the
  ``preference:N`` capability an EP advertises; mlx, for one, is high on a
  GPU and low on a CPU), then declared priority. No measuring.
- ``PREFER_CPU`` / ``PREFER_GPU`` / ``PREFER_NPU``: EPs on that device type
  first (by preference), then the others; ``MAX_EFFICIENCY`` and
  ``MIN_OVERALL_POWER`` prefer NPU, then GPU, then CPU.

This module knows policies, candidates, feeds, timing and the cache; the
pipeline builds each candidate for it (``build`` callbacks), so nothing here
imports the pipeline.

Config entries (``SessionOptions.add_session_config_entry``):

- ``nxrt.selection.budget_ms`` — the measuring budget (default 5000);
- ``nxrt.selection.runs`` — timing rounds over the candidates (default 7);
- ``nxrt.selection.dims`` — values for symbolic dims, e.g. ``batch=8,seq=128``;
  any other dynamic dim is 1;
- ``nxrt.selection.cache`` — ``0`` turns the on-disk cache off. The cache
  folder is ``platformdirs.user_cache_dir("nxrt")/selection``, or
  ``$NXRT_CACHE_DIR/selection``.
"""

from __future__ import annotations

import enum
import hashlib
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from nxrt.errors import InvalidArgument
from nxrt.files import write_atomically
from nxrt.model import numpy_dtype

if TYPE_CHECKING:
    import onnx_ir as ir

BUDGET_MS = "nxrt.selection.budget_ms"
RUNS = "nxrt.selection.runs"
DIMS = "nxrt.selection.dims"
CACHE = "nxrt.selection.cache"
DEFAULT_BUDGET_MS = 5000.0
DEFAULT_RUNS = 7
#: Untimed run-in before each candidate's timed block (config ``nxrt.selection.settle_ms``).
SETTLE_MS = "nxrt.selection.settle_ms"
DEFAULT_SETTLE_MS = 100.0
#: Timed blocks per candidate; ``runs`` samples are spread over them.
BLOCKS = 2
CACHE_FORMAT = 3


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
    """The single-EP candidates in the order they are built: the EP of highest preference
    with the fallback, the fallback alone (the baseline, so the choice is never slower
    than it), then every other EP with the fallback. Mixes are added by :func:`measure`
    once a plan shows what its first EP left to the fallback."""
    others = [[e.id, fallback] for e in order_by_preference(eps) if e.id != fallback]
    return [*others[:1], [fallback], *others[1:]]


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


def synthesize_feeds(inputs: Sequence[ir.Value], dims: Mapping[str, int]) -> dict[str, Any]:
    """Seeded feeds for the model's inputs; symbolic dims from ``dims``, else 1.

    Integer inputs get small non-negative values (indices and ids stay in range
    for most models); floats are standard normal.
    """
    rng = np.random.default_rng(0)
    feeds: dict[str, Any] = {}
    for value in inputs:
        if type(value.type).__name__ != "TensorType" or value.dtype is None:
            raise InvalidArgument(f"input {value.name!r} is not a tensor of known type")
        shape = []
        for dim in value.shape or ():
            if isinstance(dim, int):
                shape.append(dim)
            else:
                shape.append(int(dims.get(str(getattr(dim, "value", dim)), 1)))
        dtype = numpy_dtype(int(value.dtype))
        if dtype.kind == "f":
            feeds[value.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind in "iu":
            feeds[value.name] = rng.integers(0, 2, shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[value.name] = rng.integers(0, 2, shape).astype(bool)
        elif dtype.kind in "OSU":  # text: a short word per element
            feeds[value.name] = np.full(shape, "text", dtype=object)
        else:
            raise InvalidArgument(f"cannot make a feed of {dtype} for input {value.name!r}")
    return feeds


# -- the report ------------------------------------------------------------------------------------
@dataclass
class Candidate:
    """One candidate plan: its providers, and its time (median sample) or why it was skipped."""

    providers: list[str]
    time_ms: float | None = None
    skipped: str = ""


@dataclass
class SelectionReport:
    """How a session's EPs were chosen (shown by ``get_partition()`` and the CLI)."""

    policy: str
    choice: list[str]
    candidates: list[Candidate] = field(default_factory=list)
    from_cache: bool = False
    seconds: float = 0.0
    note: str = ""

    def lines(self) -> list[str]:
        how = "from the cache" if self.from_cache else f"in {self.seconds:.2f} s"
        lines = [f"selection: policy {self.policy}, chose {','.join(self.choice)} ({how})"]
        for c in self.candidates:
            mark = "*" if c.providers == self.choice else " "
            what = f"{c.time_ms:.3f} ms" if c.time_ms is not None else f"skipped: {c.skipped}"
            lines.append(f"  {mark} {','.join(c.providers):<28} {what}")
        if self.note:
            lines.append(f"  {self.note}")
        return lines

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- measuring -------------------------------------------------------------------------------------
#: Builds a candidate from its providers; returns an object whose ``run(feeds)`` runs the
#: plan once, and whose ``leftover()`` lists the nodes left to the fallback EP.
BuildCandidate = Callable[[list[str]], Any]


def measure(
    eps: Sequence[EpInfo],
    build: BuildCandidate,
    feeds: dict[str, Any],
    *,
    budget_ms: float,
    runs: int,
    settle_ms: float = DEFAULT_SETTLE_MS,
    fallback: str = "cpu",
) -> tuple[list[str], Any, list[Candidate], str]:
    """Build every candidate, then time them in interleaved blocks; the fastest wins.

    Candidates are built (and run twice, which warms them up) in the order of
    :func:`candidates`, the first two always, the others until the budget is
    spent; a candidate whose first EP
    left nodes to the fallback adds a mix with the next EP ahead of the
    fallback. Timing goes through the built candidates in :data:`BLOCKS`
    blocks of ``runs / BLOCKS`` samples, the order rotating each block so
    drift favours none; each block starts with ``settle_ms`` of untimed runs,
    so the previous candidate's spinning threads have gone idle, as they have
    when a session runs on its own. A fast plan runs several times per sample
    so each spans about a millisecond. A candidate's time is its median
    sample, the figure a user's steady runs see.

    :returns: The winner's providers, its built object (``None`` when every
        candidate failed), every candidate's result, and a note when the
        budget cut measuring short.
    """
    queue = candidates(eps, fallback)
    ids = {e.id for e in eps}
    results: list[Candidate] = []
    built: list[tuple[Candidate, Any, int]] = []  # candidate, built plan, runs per sample
    start = time.perf_counter()
    note = ""

    def spent() -> float:
        return (time.perf_counter() - start) * 1000

    while queue:
        providers = queue.pop(0)
        if any(p not in ids for p in providers):
            continue
        if len(built) >= 2 and spent() > budget_ms:
            skipped = [providers, *queue]
            note = f"budget of {budget_ms:.0f} ms spent; {len(skipped)} candidate(s) not measured"
            results.extend(Candidate(p, skipped="not measured: budget spent") for p in skipped)
            break
        candidate = Candidate(providers)
        results.append(candidate)
        try:
            plan = build(providers)
            plan.run(feeds)  # warm-up: first-run allocations, lazy compilation
            t0 = time.perf_counter()
            plan.run(feeds)
            first_ms = (time.perf_counter() - t0) * 1000
        except Exception as exc:  # noqa: BLE001 - a candidate that fails is skipped, never fatal
            candidate.skipped = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            continue
        built.append((candidate, plan, min(50, max(1, int(1.0 / max(first_ms, 1e-3))))))
        if len(providers) == 2 and plan.leftover():
            for other in order_by_preference(eps):
                mix = [providers[0], other.id, fallback]
                if other.id not in providers and other.id != fallback and mix not in queue:
                    queue.insert(0, mix)
                    break
    samples: dict[int, list[float]] = {i: [] for i in range(len(built))}
    blocks = max(1, min(BLOCKS, runs))
    per_block = max(1, -(-runs // blocks))
    for block in range(blocks):
        if block >= 1 and spent() > budget_ms:
            note = note or f"budget of {budget_ms:.0f} ms spent after {block} timing block(s)"
            break
        for i in [(block + k) % len(built) for k in range(len(built))] if built else []:
            candidate, plan, repeat = built[i]
            try:
                _settle(plan, feeds, settle_ms)
                for _ in range(per_block):
                    t0 = time.perf_counter()
                    for _ in range(repeat):
                        plan.run(feeds)
                    samples[i].append((time.perf_counter() - t0) * 1000 / repeat)
            except Exception as exc:  # noqa: BLE001 - fails on a later run: skipped too
                candidate.skipped = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    best: tuple[float, int] | None = None
    for i, (candidate, _, _) in enumerate(built):
        if candidate.skipped or not samples[i]:
            continue
        candidate.time_ms = statistics.median(samples[i])
        if best is None or candidate.time_ms < best[0]:
            best = (candidate.time_ms, i)
    if best is None:
        return [fallback], None, results, note or "every candidate failed"
    winner, plan, _ = built[best[1]]
    return winner.providers, plan, results, note


def _settle(plan: Any, feeds: dict[str, Any], settle_ms: float) -> None:
    """Run ``plan`` untimed for ``settle_ms`` (at least once): the candidate timed before it
    leaves threads spinning (ONNX Runtime's pool, OpenVINO's, OpenBLAS's for about 0.1 s)
    that would slow this one's first runs, and this one's caches and pools warm up."""
    end = time.perf_counter() + settle_ms / 1000
    plan.run(feeds)
    while time.perf_counter() < end:
        plan.run(feeds)


# -- the cache -------------------------------------------------------------------------------------
def cache_dir() -> str:
    root = os.environ.get("NXRT_CACHE_DIR")
    if not root:
        import platformdirs

        root = platformdirs.user_cache_dir("nxrt")
    return os.path.join(root, "selection")


def hardware() -> str:
    """The machine a measurement is valid for: architecture, CPU model, core count."""
    model = platform.processor()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            for line in info:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{platform.system()}-{platform.machine()}-{model}-{os.cpu_count()}"


def cache_key(
    model_digest: str,
    eps: Sequence[tuple[str, str]],
    threads: int,
    dims: Mapping[str, int],
) -> str:
    """The key of a decision: model, every candidate EP's (id, version), hardware, threads."""
    parts = {
        "format": CACHE_FORMAT,
        "model": model_digest,
        "eps": sorted(f"{ep_id}={version}" for ep_id, version in eps),
        "hardware": hardware(),
        "threads": threads,
        "dims": sorted(dims.items()),
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
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not report.choice or any(p not in installed for p in report.choice):
        return None
    report.from_cache = True
    return report


def write_cached(key: str, report: SelectionReport) -> None:
    """Store a decision; a cache that cannot be written only costs the next session time."""
    data = report.to_dict()
    data.pop("from_cache", None)
    try:
        os.makedirs(cache_dir(), exist_ok=True)
        write_atomically(os.path.join(cache_dir(), f"{key}.json"), json.dumps(data).encode())
    except OSError:
        pass


def model_digest(source: Any) -> str:
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

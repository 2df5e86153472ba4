"""The ``nxrt`` command: list providers, run a model, show a partition, warm the caches."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any, cast

import numpy as np

if TYPE_CHECKING:
    from nxrt.errors import EpLoadFailed

DEFAULT_MODEL = "digits_cnn.onnx"
DEFAULT_DATA = "digits_test.npz"
#: ``nxrt run``'s timed runs and untimed warm-up runs, after the first run (shown apart).
DEFAULT_REPEAT = 20
DEFAULT_WARMUP = 3
#: The selection budget of ``nxrt warmup MODEL`` (ms): it measures every candidate.
WARMUP_BUDGET_MS = 120_000


def _table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    cells = [[str(c) for c in header]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def providers_info(details: bool = True) -> dict[str, Any]:
    """Installed plugins, their EPs and capabilities, and plugins that failed to load.

    ``plugins`` lists every entry point of group ``nxrt`` that loaded, also one
    that registered no EP: a plugin that installs but adds nothing is a bug
    its author has to be able to see.

    With ``details`` each EP is started, to ask its capabilities, and its kernel
    table is loaded, to count its ops: that imports the plugins' kernel modules
    and backends (onnx, onnxruntime, MLX...), seconds on a cold machine. Without,
    nothing beyond the plugins' registration modules is imported, and
    ``capabilities``, ``ops`` and ``kernels`` are ``None``.
    """
    import nxrt
    from nxrt.host import Host

    pm = nxrt.default_plugin_manager()
    host = Host(pm)
    registry = host.build_registry()
    eps = []
    for ep_id in registry.default_order():
        descriptor = registry.providers[ep_id]
        info = pm.plugin_info.get(descriptor.plugin)
        eps.append(
            {
                "id": ep_id,
                "plugin": descriptor.plugin,
                "distribution": info.distribution if info else "",
                "version": info.version if info else "",
                "device_type": descriptor.device_type,
                "aliases": list(descriptor.aliases),
                "context_sources": list(descriptor.context_sources),
                "description": descriptor.description,
                **(_details(host, descriptor) if details else dict.fromkeys(_DETAILS)),
                "hooks": sorted(
                    c.name for c in pm.get_hookcallers(pm.get_plugin(descriptor.plugin)) or []
                ),
            }
        )
    plugins = [
        {
            "name": name,
            "value": info.value,
            "distribution": info.distribution,
            "version": info.version,
            "eps": [e["id"] for e in eps if e["plugin"] == name],
            "hooks": sorted(c.name for c in pm.get_hookcallers(pm.get_plugin(name)) or []),
        }
        for name, info in sorted(pm.plugin_info.items())
        if pm.has_plugin(name)
    ]
    # registration and capabilities record load failures alone
    load_failures = cast("list[EpLoadFailed]", host.failures)
    failures = [{"path": f.path, "reason": f.reason} for f in load_failures]
    return {"plugins": plugins, "providers": eps, "failed": failures}


#: What ``providers_info(details=True)`` adds to each EP.
_DETAILS = ("ops", "kernels", "capabilities")


def _details(host: Any, descriptor: Any) -> dict[str, Any]:
    """The EP's op and kernel counts (its loaded table) and capabilities (it is started)."""
    try:
        ops = descriptor.ops
        counts: dict[str, Any] = {
            "ops": len(ops.op_types) if ops else 0,
            "kernels": len(ops) if ops else 0,
        }
    except Exception as exc:  # noqa: BLE001 - shown, not raised: the listing must go on
        counts = {"ops": f"unavailable: {exc}", "kernels": 0}
    return {**counts, "capabilities": _capabilities(host, descriptor)}


def _capabilities(host: Any, descriptor: Any) -> list[str] | str:
    from nxrt.provider import EpConfig

    try:
        ep = descriptor.factory(EpConfig())
        ep.bind(descriptor.id, ops=ep.ops or descriptor.ops)
        return sorted(host.capabilities(ep, descriptor.plugin).flags)
    except Exception as exc:  # noqa: BLE001 - shown, not raised: the listing must go on
        return f"unavailable: {exc!r}"


def cmd_providers(args: argparse.Namespace) -> int:
    """List the installed EPs. The table alone starts no EP and loads no kernel table, so it
    costs what ``get_available_providers()`` does; ``-v`` and ``--json`` start each EP for
    its capabilities and count its ops (seconds: kernel modules and backends import)."""
    info = providers_info(details=bool(args.verbose or args.json))
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    plugin_rows = [
        (
            p["name"],
            f"{p['distribution']} {p['version']}".strip(),
            f"{len(p['eps'])} ({', '.join(p['eps'])})" if p["eps"] else "0",
        )
        for p in info["plugins"]
    ]
    print(_table(plugin_rows, ("plugin", "distribution", "EPs")))
    print()
    if args.verbose:
        rows = [
            (
                p["id"],
                p["plugin"],
                f"{p['distribution']} {p['version']}".strip(),
                p["device_type"],
                p["ops"],
                ", ".join(p["capabilities"])
                if isinstance(p["capabilities"], list)
                else p["capabilities"],
            )
            for p in info["providers"]
        ]
        print(_table(rows, ("EP", "plugin", "distribution", "device", "ops", "capabilities")))
        for p in info["providers"]:
            print(f"\n{p['id']}: hooks {', '.join(p['hooks'])}; {p['kernels']} kernel versions")
    else:
        rows = [
            (
                p["id"],
                p["plugin"],
                f"{p['distribution']} {p['version']}".strip(),
                p["device_type"],
                p["description"],
            )
            for p in info["providers"]
        ]
        print(_table(rows, ("EP", "plugin", "distribution", "device", "description")))
        if rows:
            print("\n(`nxrt providers -v` starts each EP: capabilities, op counts, hooks)")
    if info["failed"]:
        print("\nplugins that failed to load:")
        for failure in info["failed"]:
            print(f"  {failure['path']}: {failure['reason']}")
    return 0


def _make_session(model: Any, args: argparse.Namespace, feeds: dict[str, Any] | None = None) -> Any:
    """The session ``args`` ask for. Given ``feeds``, the default selection measures its
    candidates at their shapes (``nxrt.selection.shapes``), not at batch 1."""
    import nxrt
    from nxrt.pipeline.selection import SHAPES

    options = nxrt.SessionOptions()
    options.enable_profiling = bool(getattr(args, "profile", False))
    if getattr(args, "threads", 0):
        options.intra_op_num_threads = args.threads
    if feeds:
        shapes = ",".join(
            f"{name}:{'x'.join(str(d) for d in np.shape(value))}" for name, value in feeds.items()
        )
        options.add_session_config_entry(SHAPES, shapes)
    providers = args.ep.split(",") if args.ep else None
    return nxrt.InferenceSession(model, options, providers=providers)


def _parse_inputs(items: Sequence[str]) -> dict[str, np.ndarray]:
    feeds = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep:
            raise SystemExit(f"--input takes name=file.npy, got {item!r}")
        feeds[name] = np.load(path)
    return feeds


def _summary(name: str, value: Any) -> str:
    array = np.asarray(value)
    if array.dtype.kind in "fiub" and array.size:
        return (
            f"{name}: {array.dtype}{list(array.shape)} min {array.min():.4g} "
            f"max {array.max():.4g} mean {array.mean():.4g}"
        )
    return f"{name}: {array.dtype}{list(array.shape)}"


@dataclass
class Timing:
    """A benchmark of one session: the first run apart, then warm runs after a warm-up."""

    first_ms: float
    warmup: int
    times: list[float]


def _benchmark(
    session: Any, feeds: dict[str, Any], repeat: int, warmup: int
) -> tuple[list[Any], Timing]:
    """Run like a benchmark: the first run timed on its own (it includes compiling and
    first-run allocation), then, once every kernel compiling in the background has
    taken over, ``warmup`` untimed runs and ``repeat`` timed runs: the model's speed."""
    start = time.perf_counter()
    outputs = session.run(None, feeds)
    first_ms = (time.perf_counter() - start) * 1000
    session.wait_for_compiled()
    for _ in range(max(warmup, 0)):
        session.run(None, feeds)
    times = []
    for _ in range(max(repeat, 1)):
        start = time.perf_counter()
        outputs = session.run(None, feeds)
        times.append((time.perf_counter() - start) * 1000)
    return outputs, Timing(first_ms, max(warmup, 0), times)


def cmd_run(args: argparse.Namespace) -> int:
    from nxrt.errors import NxrtError

    try:
        if args.model is None:
            return _run_default(args)
        given = _parse_inputs(args.input or [])
        start = time.perf_counter()
        session = _make_session(args.model, args, given)
        created = time.perf_counter() - start
        from nxrt.tools.light_models import dummy_feeds

        feeds = {**dummy_feeds(session), **given}
        outputs, timing = _benchmark(session, feeds, args.repeat, args.warmup)
    except NxrtError as exc:
        print(f"nxrt: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"model: {args.model}")
    _print_placement(session)
    print(f"session created in {created:.2f} s")
    for arg, value in zip(session.get_outputs(), outputs):
        print(_summary(arg.name, value))
    _print_latency(timing)
    _finish_profile(session)
    return 0


def _run_default(args: argparse.Namespace) -> int:
    import onnx

    data_dir = resources.files("nxrt") / "data"
    model_bytes = (data_dir / DEFAULT_MODEL).read_bytes()
    with (data_dir / DEFAULT_DATA).open("rb") as f:
        data = np.load(f)
        pixels, labels = data["pixels"], data["labels"]
    graph = onnx.load_model_from_string(model_bytes).graph
    initializers = {t.name for t in graph.initializer}
    (name,) = [i.name for i in graph.input if i.name not in initializers]
    start = time.perf_counter()
    session = _make_session(model_bytes, args, {name: pixels})
    created = time.perf_counter() - start
    meta = session.get_modelmeta()
    print(f"model: embedded {DEFAULT_MODEL} — {meta.description.splitlines()[0]}")
    _print_placement(session)
    print(f"session created in {created:.2f} s")
    (probabilities,), timing = _benchmark(session, {name: pixels}, args.repeat, args.warmup)
    predicted = probabilities.argmax(axis=1)
    accuracy = float((predicted == labels).mean())
    print(_summary(session.get_outputs()[0].name, probabilities))
    print(f"held-out digits: {len(labels)} images, {int((predicted == labels).sum())} correct")
    print(f"accuracy: {accuracy:.2%}")
    print(f"first 10 predicted: {predicted[:10].tolist()}  true: {labels[:10].tolist()}")
    _print_latency(timing, per=len(labels))
    _finish_profile(session)
    return 0


def _print_placement(session: Any) -> None:
    """The partition (with how the EPs were chosen), then which EPs ran the model."""
    report = session.get_partition()
    print(report)
    ran = [f"{ep} ({count} nodes)" for ep, count in report.nodes_per_ep().items() if count]
    print(f"ran on: {', '.join(ran)}")


def _print_latency(timing: Timing, per: int = 0) -> None:
    """The first run on its own line, then the median of the warm runs: the model's speed."""
    print(f"first run {timing.first_ms:.1f} ms, includes compiling")
    median = statistics.median(timing.times)
    line = (
        f"latency: median {median:.3f} ms over {len(timing.times)} run(s), "
        f"after {timing.warmup} warm-up run(s)"
    )
    if per:
        line += f" ({median * 1000 / per:.1f} µs per image)"
    print(line)


def _finish_profile(session: Any) -> None:
    path = session.end_profiling()
    if path:
        print(f"profile: {os.path.abspath(path)} (open in chrome://tracing or Perfetto)")
        _print_top_ops(path)


def _print_top_ops(path: str, limit: int = 10) -> None:
    """The operators (and kernel variants) that took the most time in the trace."""
    with open(path, encoding="utf-8") as f:
        events = json.load(f).get("traceEvents", [])
    totals: dict[tuple[str, str], list[float]] = {}
    for event in events:
        args = event.get("args", {})
        key = (args.get("op_type", event.get("name", "?")), args.get("kernel_variant", ""))
        entry = totals.setdefault(key, [0.0, 0])
        entry[0] += event.get("dur", 0.0) / 1000.0
        entry[1] += 1
    overall = sum(ms for ms, _ in totals.values()) or 1.0
    rows = sorted(totals.items(), key=lambda item: -item[1][0])[:limit]
    table = [
        (op, variant or "-", f"{ms:.2f}", f"{100 * ms / overall:.1f}%", str(calls))
        for (op, variant), (ms, calls) in rows
    ]
    print(f"top {len(table)} operators by kernel time (all runs):")
    print(_table(table, ("op", "variant", "ms", "share", "calls")))


def cmd_partition(args: argparse.Namespace) -> int:
    from nxrt.errors import NxrtError

    try:
        session = _make_session(args.model, args)
    except NxrtError as exc:
        print(f"nxrt: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    report = session.get_partition()
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
        return 0
    rows = [(p.node, p.op_type, p.ep, p.claim) for p in report.nodes]
    print(_table(rows, ("node", "op", "EP", "claim")))
    print()
    print(report)
    return 0


def _progress(label: str) -> Any:
    """A one-line progress bar on stderr (only when it is a terminal or forced)."""
    start = time.monotonic()
    show = sys.stderr.isatty()

    def update(done: int, total: int) -> None:
        if not show:
            return
        width = 30
        filled = width * done // max(total, 1)
        bar = "#" * filled + "." * (width - filled)
        elapsed = time.monotonic() - start
        print(f"\r{label} [{bar}] {done}/{total} {elapsed:.0f}s", end="", file=sys.stderr)
        if done == total:
            print(file=sys.stderr)

    return update


def cmd_check_ep(args: argparse.Namespace) -> int:
    import re

    import nxrt
    from nxrt.host import Host
    from nxrt.tools.conformance import ORT, Summary, load_exclusions, node_cases, package_exclusions

    cases = node_cases()
    ops = set(args.ops.split(",")) if args.ops else None
    pattern = re.compile(args.cases) if args.cases else None
    names = [
        name
        for name, op in cases.items()
        if (ops is None or op in ops) and (pattern is None or pattern.search(name))
    ]
    if args.exclusions:
        excluded = load_exclusions(args.exclusions)
    else:
        pm = nxrt.default_plugin_manager()
        descriptor = Host(pm).build_registry().resolve(args.ep)
        if descriptor is None:
            print(f"nxrt: EP {args.ep!r} is not installed (see `nxrt providers`)", file=sys.stderr)
            return 1
        plugin = pm.get_plugin(descriptor.plugin)
        assert plugin is not None  # its registry entry came from it
        excluded = package_exclusions(plugin.__name__)
    from nxrt.tools.conformance import run_cases

    runs = [args.ep] + ([] if args.no_compare else [ORT])
    summaries = {}
    for ep in runs:
        results = run_cases(
            ep, names, workers=args.workers, timeout=args.timeout, progress=_progress(ep)
        )
        summaries[ep] = Summary.of(ep, results.values(), excluded if ep == args.ep else None)
    if args.json:
        print(json.dumps({ep: s.to_dict() for ep, s in summaries.items()}, indent=2))
        return 0
    rows = [
        (
            ep,
            len(names),
            s.counts["pass"],
            s.counts["fail"],
            s.counts["error"],
            s.counts["unsupported"],
        )
        for ep, s in summaries.items()
    ]
    header = ("runtime", "cases", "pass", "fail (wrong result)", "error", "op not supported")
    print(_table(rows, header))
    mine = summaries[args.ep]
    print(f"\nfailures of {args.ep} by operator:")
    for op, failures in mine.failures_by_op.items():
        listed = [f for f in failures if f.name not in excluded]
        known = len(failures) - len(listed)
        note = f" ({known} listed as known)" if known else ""
        print(f"  {op}: {len(failures)}{note}")
        for failure in listed[: args.show]:
            print(f"    {failure.status:5} {failure.name}: {failure.message[:160]}")
    return 0


def cmd_compile(args: argparse.Namespace) -> int:
    from nxrt.errors import NxrtError
    from nxrt.tools.compile import compile_model

    try:
        report = compile_model(
            args.model, args.output, args.ep.split(","), embed_mode=args.embed_mode
        )
    except NxrtError as exc:
        print(f"nxrt: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    rows: list[tuple[str, str, int | str, str]]
    rows = [(name, ep, nodes, "EPContext") for name, ep, nodes in report.saved]
    rows += [(name, ep, "-", f"left as nodes: {why}") for name, ep, why in report.not_saved]
    if rows:
        print(_table(rows, ("partition", "EP", "nodes", "written as")))
    else:
        print("no EP compiled a partition of this model; it is written unchanged")
    for side in report.side_files:
        print(f"side file: {side}")
    print(f"wrote {report.output}")
    return 0


def cmd_warmup(args: argparse.Namespace) -> int:
    """Fill the EPs' compile caches (``nxrt_warmup``): the kernels of ``args.model``, or
    every kernel the EPs compile; each EP found through the plugin host, by id."""
    import nxrt
    from nxrt.host import Host
    from nxrt.host_parallel import HostParallel
    from nxrt.pipeline.stages import instantiate_ep

    pm = nxrt.default_plugin_manager()
    host = Host(pm)
    registry = host.build_registry()
    warming = {impl.plugin_name for impl in pm.hook.nxrt_warmup.get_hookimpls()}
    ids = (
        args.ep.split(",")
        if args.ep
        else [i for i in registry.default_order() if registry.providers[i].plugin in warming]
    )
    if args.model is not None and not os.path.exists(args.model):
        print(f"nxrt: no model at {args.model}", file=sys.stderr)
        return 1
    status = 0
    for ep_id in ids:
        descriptor = registry.resolve(ep_id)
        if descriptor is None:
            print(f"nxrt: EP {ep_id!r} is not installed (see `nxrt providers`)", file=sys.stderr)
            status = 1
            continue
        what = args.model or "every compiled kernel (minutes on a cold cache)"
        print(f"{descriptor.id}: warming up {what}", flush=True)
        started = time.perf_counter()
        try:
            threads = args.threads or None
            ep = instantiate_ep(descriptor, {}, HostParallel(threads), threads)
            lines = host.warmup(ep, descriptor.plugin, args.model)
        except Exception as exc:  # noqa: BLE001 - reported per EP; the others go on
            print(f"{descriptor.id}: failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            status = 1
            continue
        if lines is None:
            print(f"{descriptor.id}: compiles nothing ahead of time")
            continue
        for line in lines:
            print(f"  {line}")
        print(f"{descriptor.id}: done in {time.perf_counter() - started:.1f} s")
    if args.model is not None and not args.ep and status == 0:
        status = _warm_selection(args.model, args.threads)
    return status


def _warm_selection(model: str, threads: int | None) -> int:
    """Decide the model's default selection once its kernels are in the caches, so that
    every later session without ``providers`` reads it from the selection cache."""
    import nxrt
    from nxrt.errors import NxrtError

    options = nxrt.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    # time enough to measure every candidate: a decision with one unmeasured is not cached
    options.add_session_config_entry("nxrt.selection.budget_ms", str(WARMUP_BUDGET_MS))
    try:
        session = nxrt.InferenceSession(model, options)
    except NxrtError as exc:
        print(f"selection: failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    report = session.get_partition().selection
    if report is None:
        return 0
    for line in report.lines():
        print(line)
    if not (report.cached or report.from_cache):
        print("selection: not cached (see the note above)", file=sys.stderr)
        return 1
    return 0


def _pairs(items: Sequence[str] | None, flag: str) -> dict[str, str]:
    """``LEFT=RIGHT`` flags as a dict (a repeated LEFT: the last one wins)."""
    pairs = {}
    for item in items or []:
        left, sep, right = item.partition("=")
        if not sep or not left or not right:
            raise SystemExit(f"nxrt: {flag} takes LEFT=RIGHT, got {item!r}")
        pairs[left] = right
    return pairs


def cmd_batch(args: argparse.Namespace) -> int:
    """Run a model over a dataset with Ray Data (``nxrt.tools.batch.run_job``); exit 0 when every
    row ran, 3 when the job ran but some rows failed (each listed), 1 on an nxrt error."""
    from nxrt.errors import NxrtError
    from nxrt.tools import batch

    try:
        import ray.data  # noqa: F401 - only to say what to install
    except ImportError:
        print("nxrt: `nxrt batch` needs Ray Data: pip install 'nxrt[ray]'", file=sys.stderr)
        return 1
    inputs: dict[str, list[str]] = {}
    for column, model_input in _pairs(args.input_column, "--input-column").items():
        inputs.setdefault(model_input, []).extend(column.split(","))
    providers = [p for item in args.providers or [] for p in item.split(",") if p] or None
    try:
        result = batch.run_job(
            args.model,
            args.input,
            args.output,
            workers=args.workers,
            threads=args.threads,
            batch_size=args.batch_size,
            address=args.address,
            providers=providers,
            input_columns=inputs or None,
            output_columns=_pairs(args.output_column, "--output-column") or None,
            keep=[k for item in args.keep or [] for k in item.split(",") if k],
            cast=args.cast,
            fmt=args.format,
            errors_path=args.errors,
            overwrite=args.overwrite,
            ship=args.ship,
        )
    except NxrtError as exc:
        print(f"nxrt: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"providers: {','.join(map(str, result.providers))}; output: {result.output}")
    for failure in result.failures[:5]:
        where = {k: v for k, v in failure.items() if k != "error"}
        print(f"failed row {where}: {failure['error']}", file=sys.stderr)
    if result.failed > 5:
        print(f"... and {result.failed - 5} more in {result.errors_path}", file=sys.stderr)
    print(result.line())
    return batch.EXIT_ROWS_FAILED if result.failed else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nxrt", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("providers", help="installed plugins, EPs, capabilities, broken plugins")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="start each EP: capabilities, op and kernel counts, hooks",
    )
    p.set_defaults(func=cmd_providers)

    p = sub.add_parser("run", help="run a model (default: the embedded digits classifier)")
    p.add_argument("model", nargs="?", help="path to a .onnx model")
    p.add_argument("--ep", help="comma-separated EP ids in priority order")
    p.add_argument("--input", action="append", metavar="NAME=FILE.npy", help="a feed")
    p.add_argument(
        "--repeat",
        type=int,
        default=DEFAULT_REPEAT,
        help=f"timed runs after the warm-up; their median is printed (default {DEFAULT_REPEAT})",
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=DEFAULT_WARMUP,
        help=f"untimed runs after the first one (default {DEFAULT_WARMUP})",
    )
    p.add_argument("--threads", type=int, default=0, help="intra-op threads")
    p.add_argument("--profile", action="store_true", help="write a Chrome trace")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("check-ep", help="the ONNX node conformance suite for one EP")
    p.add_argument("ep", help="EP id, e.g. cpu")
    p.add_argument("--ops", help="only the cases of these ops (comma-separated)")
    p.add_argument("--cases", help="only case names matching this regular expression")
    p.add_argument("--exclusions", help="file of known failures (default: the EP's own list)")
    p.add_argument("--workers", type=int, default=2, help="worker processes")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per case")
    p.add_argument("--no-compare", action="store_true", help="skip the onnxruntime run")
    p.add_argument("--show", type=int, default=5, help="failures shown per operator")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_check_ep)

    p = sub.add_parser("compile", help="save compiled partitions as EPContext nodes")
    p.add_argument("model", help="path to a .onnx model (never modified)")
    p.add_argument("-o", "--output", required=True, help="path of the model to write")
    p.add_argument("--ep", required=True, help="comma-separated EP ids, e.g. mlx,cpu")
    p.add_argument(
        "--embed-mode", type=int, choices=(0, 1), default=1, help="1: blobs inside; 0: side files"
    )
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser("partition", help="which EP runs which nodes, partitions and copies")
    p.add_argument("model", help="path to a .onnx model")
    p.add_argument("--ep", help="comma-separated EP ids in priority order")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_partition)

    p = sub.add_parser(
        "warmup",
        help="compile kernels into the disk cache, and with MODEL decide its default selection "
        "(images, CI)",
    )
    p.add_argument("model", nargs="?", help="a .onnx model (default: every compiled kernel)")
    p.add_argument(
        "--ep", help="comma-separated EP ids (default: every installed EP that compiles ahead)"
    )
    p.add_argument("--threads", type=int, default=0, help="the sessions' intra-op threads")
    p.set_defaults(func=cmd_warmup)

    p = sub.add_parser(
        "batch",
        help="run a model over a dataset (.npy, Parquet) with Ray Data (pip install 'nxrt[ray]')",
        description="Run MODEL over every row of INPUT on Ray Data workers and write Parquet "
        "to OUTPUT: one column per model output, the --keep columns, and nxrt_error ('' for "
        "rows that ran). Every input row is written once; failed rows are listed in "
        "OUTPUT.errors.jsonl and the exit status is 3. See docs/scale-out.md.",
    )
    p.add_argument("model", help="path to a .onnx model")
    p.add_argument("input", help="a .npy or .parquet file, a folder of them, or a glob")
    p.add_argument("output", help="the Parquet folder to write")
    p.add_argument("--workers", type=int, help="actors (default: one per --threads CPUs)")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per worker")
    p.add_argument("--batch-size", type=int, default=64, help="rows per batch (default 64)")
    p.add_argument("--address", help="join this Ray cluster (default: a local Ray instance)")
    p.add_argument(
        "--providers",
        action="append",
        help="EPs, comma-separated (default: nxrt's selection, decided once in the driver)",
    )
    p.add_argument(
        "--input-column",
        action="append",
        metavar="COL=INPUT",
        help="feed model input INPUT from column COL (COL1,COL2,...: stacked on a last axis)",
    )
    p.add_argument(
        "--output-column", action="append", metavar="OUTPUT=COL", help="name an output's column"
    )
    p.add_argument("--keep", action="append", metavar="COL", help="pass a column through (an id)")
    p.add_argument("--cast", action="store_true", help="cast columns to the inputs' dtypes")
    p.add_argument("--format", choices=("auto", "npy", "parquet"), default="auto")
    p.add_argument("--errors", help="where failed rows go (default OUTPUT.errors.jsonl)")
    p.add_argument("--overwrite", action="store_true", help="replace OUTPUT if it exists")
    p.add_argument(
        "--ship",
        choices=("auto", "path", "object-store"),
        default="auto",
        help="how workers get the model: its path (a shared filesystem) or Ray's object store",
    )
    p.set_defaults(func=cmd_batch)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())

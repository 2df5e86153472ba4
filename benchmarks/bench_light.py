"""Latency of nxrt against onnxruntime on the ONNX package's "light" models.

The light models ship with the ``onnx`` package (``onnx/backend/test/data/light``), so this
benchmark needs no download. Both runtimes load the same model in one process, use the same
thread count, and are run alternately so that drift in machine load or clock speed affects
both equally: in each round one runtime runs a block of ``--block`` timed calls, then the
other does, and the order swaps every round.

Before each block the runtime runs untimed for at least ``--settle-ms`` (one call at
least). ORT's worker threads spin-wait for a while after a call returns, and so do
OpenBLAS's (nxrt's GEMMs), for about 0.1 s; without the settle period those spinning threads
would slow the other runtime's block, and the woken-up runtime would pay for waking its own
threads. Both keep their default spinning, since that is what their users get.

Run::

    python benchmarks/bench_light.py                       # light_resnet50, 2 threads
    python benchmarks/bench_light.py --models all --threads 4 --repeat 50
    python benchmarks/bench_light.py --models squeezenet path/to/model.onnx --json out.json

The input is the dummy input the ONNX backend test runner uses for light models,
``np.arange(n).reshape(shape) / n`` as float32 (dynamic dimensions set to 1).

What the figures mean:

* ``median ms``: median wall-clock latency of one ``run`` call, after ``--warmup`` runs;
  the JSON also holds p90, min and mean.
* ``ratio``: nxrt median / ORT median; below 1 means nxrt is faster.
* ``max abs diff``: largest absolute difference between the two runtimes' outputs, over
  all outputs; it should be near float32 rounding error (about 1e-5 or less).

Thread settings: ORT gets ``intra_op_num_threads = --threads`` and
``inter_op_num_threads = 1``; nxrt gets ``intra_op_num_threads = --threads``; BLAS and
OpenMP pools are capped at ``--threads`` with threadpoolctl for the whole measurement.
ORT keeps its default graph optimisations, as a user would get them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np
import onnxruntime as ort
from threadpoolctl import threadpool_limits

import nxrt
from nxrt.tools.light_models import LIGHT_MODELS, dummy_feeds, light_model_path


def resolve_models(names: list[str]) -> list[tuple[str, str]]:
    """Map names (``resnet50``, ``light_resnet50``, ``all``) or paths to (label, path)."""
    if "all" in names:
        names = LIGHT_MODELS
    resolved = []
    for name in names:
        if os.path.exists(name):
            resolved.append((os.path.splitext(os.path.basename(name))[0], name))
            continue
        path = light_model_path(name)
        stem = os.path.splitext(os.path.basename(path))[0]
        if not os.path.exists(path):
            known = ", ".join(LIGHT_MODELS)
            raise SystemExit(f"unknown model {name!r}: not a file and not one of: {known}")
        resolved.append((stem, path))
    return resolved


def summarise(times: list[float]) -> dict[str, float]:
    ms = sorted(t * 1000.0 for t in times)
    p90 = ms[min(len(ms) - 1, int(np.ceil(0.9 * len(ms))) - 1)]
    return {
        "median_ms": statistics.median(ms),
        "p90_ms": p90,
        "min_ms": ms[0],
        "mean_ms": statistics.fmean(ms),
    }


def max_abs_diff(a: list, b: list) -> float:
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        x, y = np.asarray(x), np.asarray(y)
        if x.shape != y.shape:
            return float("inf")
        if x.size:
            worst = max(worst, float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64)))))
    return worst


def bench_model(label: str, path: str, args: argparse.Namespace) -> dict:
    """Load one model in both runtimes and time them alternately."""
    result: dict = {"model": label, "path": path}
    ort_opts = ort.SessionOptions()
    ort_opts.intra_op_num_threads = args.threads
    ort_opts.inter_op_num_threads = 1
    ort_opts.log_severity_level = 3  # the light models carry unused initializers it warns about
    ort_sess = ort.InferenceSession(path, sess_options=ort_opts, providers=["CPUExecutionProvider"])
    feeds = dummy_feeds(ort_sess)

    try:
        nx_opts = nxrt.SessionOptions()
        nx_opts.intra_op_num_threads = args.threads
        nx_sess = nxrt.InferenceSession(path, sess_options=nx_opts, providers=["cpu"])
        nx_feeds = {i.name: feeds[i.name] for i in nx_sess.get_inputs()}
        nx_sess.run(None, nx_feeds)
    except Exception as exc:  # a benchmark reports a failing model and moves on
        result["error"] = f"nxrt: {type(exc).__name__}: {exc}"
        return result
    ort_feeds = {i.name: feeds[i.name] for i in ort_sess.get_inputs()}

    for _ in range(args.warmup):
        nx_sess.run(None, nx_feeds)
        ort_sess.run(None, ort_feeds)

    runners = {
        "nxrt": lambda: nx_sess.run(None, nx_feeds),
        "ort": lambda: ort_sess.run(None, ort_feeds),
    }
    times: dict[str, list[float]] = {"nxrt": [], "ort": []}
    outputs: dict[str, list] = {}
    rounds = -(-args.repeat // args.block)
    for i in range(rounds):
        # Swap the order each round so neither runtime always follows the other.
        for which in ("nxrt", "ort") if i % 2 == 0 else ("ort", "nxrt"):
            run = runners[which]
            settle_end = time.perf_counter() + args.settle_ms / 1000.0
            run()
            while time.perf_counter() < settle_end:
                run()
            for _ in range(min(args.block, args.repeat - len(times[which]))):
                start = time.perf_counter()
                outputs[which] = run()
                times[which].append(time.perf_counter() - start)

    result["nxrt"] = summarise(times["nxrt"])
    result["ort"] = summarise(times["ort"])
    result["ratio"] = result["nxrt"]["median_ms"] / result["ort"]["median_ms"]
    result["max_abs_diff"] = max_abs_diff(outputs["nxrt"], outputs["ort"])
    return result


def markdown_table(results: list[dict]) -> str:
    lines = [
        "| model | nxrt median ms | ORT median ms | ratio | max abs diff |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['model']} | error | | | {r['error'][:80]} |")
            continue
        lines.append(
            f"| {r['model']} | {r['nxrt']['median_ms']:.2f} | {r['ort']['median_ms']:.2f} "
            f"| {r['ratio']:.2f} | {r['max_abs_diff']:.2e} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models",
        nargs="+",
        default=["light_resnet50"],
        help="light model names (resnet50 or light_resnet50), paths to .onnx files, or 'all'",
    )
    parser.add_argument("--threads", type=int, default=2, help="threads for both runtimes")
    parser.add_argument("--repeat", type=int, default=20, help="timed runs per runtime")
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs per runtime")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--block", type=int, default=5, help="timed runs per runtime in a row")
    parser.add_argument(
        "--settle-ms",
        type=float,
        default=200.0,
        help="untimed running before each block, so the other runtime's threads go idle",
    )
    args = parser.parse_args(argv)
    if min(args.threads, args.repeat, args.block) < 1 or args.warmup < 0 or args.settle_ms < 0:
        parser.error("--threads, --repeat and --block must be >= 1; --warmup, --settle-ms >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    models = resolve_models(args.models)
    results = []
    with threadpool_limits(limits=args.threads):
        for label, path in models:
            result = bench_model(label, path, args)
            results.append(result)
            print(f"{label}: {'error' if 'error' in result else 'done'}", file=sys.stderr)
    print(
        f"threads={args.threads} repeat={args.repeat} warmup={args.warmup} "
        f"block={args.block} settle_ms={args.settle_ms:g} "
        f"onnxruntime={ort.__version__} nxrt={getattr(nxrt, '__version__', '?')}\n"
    )
    print(markdown_table(results))
    if args.json:
        payload = {
            "settings": {
                "threads": args.threads,
                "repeat": args.repeat,
                "warmup": args.warmup,
                "block": args.block,
                "settle_ms": args.settle_ms,
                "onnxruntime": ort.__version__,
                "nxrt": getattr(nxrt, "__version__", None),
                "numpy": np.__version__,
                "python": platform.python_version(),
                "machine": platform.machine(),
                "cpu_count": os.cpu_count(),
            },
            "results": results,
        }
        with open(args.json, "w") as f:
            json.dump(payload, f, indent=2)
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())

"""nxrt's cpu EP against ONNX Runtime on real architectures and small models, at batch 1 and 16.

Models (``torch_models.py``, exported with ``torch.onnx.export`` at opset 17 from seeded
random weights, BatchNorm statistics calibrated on random batches, into ``--model-dir``, a
temporary folder by default, never the repository): ResNet-50, MobileNetV2,
MobileNetV3-Small, EfficientNet-B0, ConvNeXt-T, ViT-B/16 (torchvision, 224x224), BERT-base
(sequence 128) and GPT-2 small with its language-model head (sequence 64; transformers);
and three small ones: an MLP (784-512-256-10), a GRU (64 -> 128, 32 steps) and a small BERT
(2 layers, hidden 128). Each at every batch of ``--batches``. The export runs in a child
process, so this one never imports torch (whose thread pools would share the cores).

Method:

* Latency: one process holds an nxrt session (``providers=["cpu"]``,
  ``intra_op_num_threads = --threads``) and an ONNX Runtime session (CPUExecutionProvider,
  ``intra_op_num_threads = --threads``, ``inter_op_num_threads = 1``) of the model and times
  them interleaved (``bench_models.interleaved``: blocks of ``--block`` runs, their order
  rotating, each block preceded by ``--settle-ms`` of untimed runs so the other runtime's
  spinning threads have gone idle); BLAS pools are capped at ``--threads``. Medians.
* Correctness: nxrt's outputs against ORT's, ``rtol=1e-3, atol=1e-4`` (the largest absolute
  difference is shown, with the largest absolute output for scale in the JSON).
* Reference: ``onnx.reference.ReferenceEvaluator`` runs once (one run, no warm-up), unless
  it would take minutes: at batch ``b`` it is skipped ("skipped" in the table) where the
  batch-1 run of this benchmark times ``b`` exceeds :data:`REFERENCE_LIMIT_S` (on 2 busy
  cores: ViT-B/16 and ConvNeXt-T at batch 16). ``--no-reference`` skips it everywhere.
* Peak memory (``bench_models.peak_memory``): per runtime a fresh process imports the
  runtime (nxrt: with its plugins and numba), reads its RSS, loads the model, runs it 4
  times and reads its own high-water mark ``VmHWM``; the table gives the difference in MB.
  (Not ``ru_maxrss``: on Linux it survives exec, so a child reports its parent's peak.)
* Per-node overhead (``bench_models.bench_chain``): chains of 1 and 1000 Add nodes on
  ``[1, 16]``, ``(median(1000) - median(1)) / 999`` in microseconds.
* Start (skipped with ``--no-start``): ``import nxrt`` and ``nxrt providers`` in fresh
  processes (median of 3; each checks numba was not imported); then a fresh process with an
  empty ``NUMBA_CACHE_DIR`` creates and runs a session of each batch-1 model in turn (cold:
  numba compiles every kernel the models use), and a second fresh process does the same
  with that cache (warm).

Summary lines: the geometric mean of nxrt/ORT over the real architectures at batch 1 and at
batch 16 (target: at most 1.5, none above 2.5), the median over the small models (target: at
most 2.5), the per-node overhead (target: at most 1 us) and the start times.

Needs torch, torchvision and transformers to export the models (``pip install torch
torchvision transformers``; torch's CPU build is enough); once exported into ``--model-dir``
they are not needed again. Run::

    python benchmarks/bench_cpu.py                                  # everything: 45 min on 2 cores
    python benchmarks/bench_cpu.py --models mlp gru resnet50 --batches 1 --repeat 3
    python benchmarks/bench_cpu.py --model-dir /tmp/models --no-memory --no-start --json out.json
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import onnxruntime as ort
from threadpoolctl import threadpool_limits

import nxrt

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_models  # noqa: E402
import torch_models  # noqa: E402

REAL, SMALL = torch_models.REAL, torch_models.SMALL
#: The reference evaluator is skipped where its batch-1 run, times the batch, passes this.
REFERENCE_LIMIT_S = 60.0
TARGET_REAL, TARGET_REAL_WORST, TARGET_SMALL, TARGET_NODE_US = 1.5, 2.5, 2.5, 1.0


# -- models -------------------------------------------------------------------------------------


def key(name: str, batch: int) -> str:
    return f"{name}@{batch}"


def resolve(model_key: str, model_dir: str) -> tuple[str, str, Callable[[Any], dict]]:
    """``(label, path, feeds(session))`` of ``name@batch``, for ``bench_models.peak_memory``."""
    name, batch = model_key.split("@")
    path = torch_models.model_path(name, model_dir, int(batch))
    feeds = torch_models.feeds_for(name, int(batch))
    return model_key, path, lambda session: feeds


def export_missing(models: list[str], batches: list[int], model_dir: str) -> None:
    """Export the models ``model_dir`` lacks, in a child process: torch stays out of this one."""
    missing = [
        (n, b)
        for n in models
        for b in batches
        if not os.path.exists(torch_models.model_path(n, model_dir, b))
    ]
    if not missing:
        return
    names = sorted({n for n, _ in missing}, key=models.index)
    packages = torch_models.missing_packages(names)
    if packages:
        raise SystemExit(
            f"exporting {', '.join(names)} needs {', '.join(packages)}, not installed: "
            "pip install torch torchvision transformers (torch's CPU build is enough), "
            "or pass --model-dir with the models already exported"
        )
    started = time.perf_counter()
    for name in names:
        command = [sys.executable, os.path.join(HERE, "torch_models.py"), "--out", model_dir]
        command += ["--models", name, "--batches", *(str(b) for n, b in missing if n == name)]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    print(f"exported {len(missing)} models: {time.perf_counter() - started:.0f} s", file=sys.stderr)


# -- one model ----------------------------------------------------------------------------------


def bench(
    name: str, batch: int, args: argparse.Namespace, reference_ms: dict[str, float]
) -> dict[str, Any]:
    """Time, check and measure ``name`` at ``batch``; ``reference_ms``: the evaluator's batch-1
    times so far, which say where it would take minutes (and which this adds to)."""
    started = time.perf_counter()
    path = torch_models.model_path(name, args.model_dir, batch)
    feeds = torch_models.feeds_for(name, batch)
    result: dict[str, Any] = {"model": name, "batch": batch}
    ort_session = bench_models.ort_session(path, args.threads)
    ort_feeds = {i.name: feeds[i.name] for i in ort_session.get_inputs()}
    runners: dict[str, Callable[[], Any]] = {
        "ort": lambda s=ort_session, f=ort_feeds: s.run(None, f)
    }
    session = None
    try:
        session = bench_models.nxrt_session(path, ["cpu"], args.threads)
        own = {i.name: feeds[i.name] for i in session.get_inputs()}
        session.run(None, own)
        runners["nxrt"] = lambda s=session, f=own: s.run(None, f)
    except Exception as exc:  # a benchmark reports a failing runtime and goes on
        result["error"] = f"{type(exc).__name__}: {exc}"[:300]
    stats, outputs = bench_models.interleaved(runners, args)
    result["ms"] = {runtime: s["median_ms"] for runtime, s in stats.items()}
    result["scale"] = max(float(np.abs(o).max()) for o in outputs["ort"] if np.size(o))
    if "nxrt" in stats:
        result["ratio"] = result["ms"]["nxrt"] / result["ms"]["ort"]
        result["diff"] = bench_models.compare(outputs["nxrt"], outputs["ort"])
    del runners, outputs, ort_session, session
    gc.collect()
    if not args.reference:
        result["reference"] = "off"
    elif reference_ms.get(name, 0.0) * batch / 1000.0 > REFERENCE_LIMIT_S:
        result["reference"] = "skipped"
    else:
        from onnx.reference import ReferenceEvaluator

        reference = None
        try:
            reference = ReferenceEvaluator(path)
            ref_feeds = {n: feeds[n] for n in reference.input_names if n in feeds}
            start = time.perf_counter()
            reference.run(None, ref_feeds)
            result["reference_ms"] = (time.perf_counter() - start) * 1000.0
            if batch == 1:
                reference_ms[name] = result["reference_ms"]
        except Exception as exc:  # the evaluator has bugs of its own; reported, not raised
            result["reference"] = "fails"
            result["reference_error"] = f"{type(exc).__name__}: {exc}"[:200]
        del reference
        gc.collect()
    if args.memory:
        result["peak_mb"] = {
            runtime: bench_models.peak_memory(runtime, key(name, batch), args, "bench_cpu")
            for runtime in ("nxrt", "ort")
        }
    seconds = time.perf_counter() - started
    print(f"{name} batch {batch}: {seconds:.0f} s", file=sys.stderr, flush=True)
    return result


# -- start: import, providers, first session cold and warm --------------------------------------

_IMPORT_SCRIPT = r"""
import contextlib, io, json, sys, time
def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS:"))
start = time.perf_counter()
import nxrt
imported = time.perf_counter() - start
numba_at_import = "numba" in sys.modules
start = time.perf_counter()
from nxrt.tools import cli
with contextlib.redirect_stdout(io.StringIO()):
    cli.main(["providers"])
providers = time.perf_counter() - start
numba_at_providers = "numba" in sys.modules
before = rss()
import nxrt_ep_cpu.jit
print(json.dumps({"import_s": imported, "providers_s": providers, "numba_import_mb":
    (rss() - before) / 2**20, "numba_at_import": numba_at_import,
    "numba_at_providers": numba_at_providers}))
"""

_START_SCRIPT = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
model_dir, threads = sys.argv[2], int(sys.argv[3])
import torch_models
from threadpoolctl import threadpool_limits
import nxrt
nxrt.get_available_providers()
print(json.dumps({"numba": "numba" in sys.modules}), flush=True)
with threadpool_limits(threads):
    for name in sys.argv[4:]:
        options = nxrt.SessionOptions()
        options.intra_op_num_threads = threads
        feeds = torch_models.feeds_for(name, 1)
        start = time.perf_counter()
        session = nxrt.InferenceSession(
            torch_models.model_path(name, model_dir, 1), sess_options=options, providers=["cpu"]
        )
        created = time.perf_counter()
        session.run(None, {i.name: feeds[i.name] for i in session.get_inputs()})
        ran = time.perf_counter()
        print(json.dumps({"model": name, "create_s": created - start, "first_run_s": ran - created,
                          "numba": "numba" in sys.modules}), flush=True)
        del session
"""


def _json_lines(command: list[str], env: dict[str, str] | None = None) -> list[dict]:
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode:
        raise RuntimeError(f"{command[:3]} failed: {done.stderr[-2000:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def start_times(models: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """Import and ``nxrt providers`` times; first sessions with a cold and a warm numba cache."""
    imports = [_json_lines([sys.executable, "-c", _IMPORT_SCRIPT])[0] for _ in range(3)]
    cli = os.path.join(os.path.dirname(sys.executable), "nxrt")
    walls = []
    for _ in range(3 if os.path.exists(cli) else 0):
        start = time.perf_counter()
        subprocess.run([cli, "providers"], capture_output=True, check=True)
        walls.append(time.perf_counter() - start)
    result: dict[str, Any] = {
        "import_s": statistics.median(i["import_s"] for i in imports),
        "providers_s": statistics.median(i["providers_s"] for i in imports),
        "providers_command_s": statistics.median(walls) if walls else None,
        "numba_import_mb": statistics.median(i["numba_import_mb"] for i in imports),
        "numba_at_import": any(i["numba_at_import"] for i in imports),
        "numba_at_providers": any(i["numba_at_providers"] for i in imports),
        "models": models,
    }
    with tempfile.TemporaryDirectory(prefix="nxrt_numba_cache_") as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache}
        command = [sys.executable, "-c", _START_SCRIPT, HERE, args.model_dir, str(args.threads)]
        for label in ("cold", "warm"):
            lines = _json_lines([*command, *models], env)
            result[f"{label}_numba_at_providers"] = lines[0]["numba"]
            result[label] = {line["model"]: line for line in lines[1:]}
            result[f"{label}_numba_imported"] = any(line["numba"] for line in lines[1:])
    return result


# -- report -------------------------------------------------------------------------------------


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def table(results: list[dict[str, Any]]) -> str:
    head = ["model", "batch", "ORT ms", "nxrt ms", "nxrt/ORT", "ref ms (once)"]
    head += ["peak MB nxrt / ORT", "outputs ok (max abs diff)"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for r in results:
        row = [r["model"], str(r["batch"]), f"{r['ms']['ort']:.2f}"]
        if "ratio" in r:
            row += [f"{r['ms']['nxrt']:.2f}", f"**{r['ratio']:.2f}**"]
        else:
            row += ["error", ""]
        row.append(f"{r['reference_ms']:.0f}" if "reference_ms" in r else r["reference"])
        peaks = r.get("peak_mb")
        if peaks:
            row.append(" / ".join("?" if peaks[k] is None else f"{peaks[k]:.0f}" for k in peaks))
        else:
            row.append("-")
        if "diff" in r:
            diff, ok = r["diff"]
            row.append(f"{'yes' if ok else 'NO'} ({diff:.1e})")
        else:
            row.append("-")
        lines.append("| " + " | ".join(row) + " |")
    for r in results:
        if "error" in r:
            lines.append(f"\n{r['model']} batch {r['batch']}: nxrt failed: {r['error']}")
    return "\n".join(lines)


def _verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def summary(results: list[dict[str, Any]], chain: dict | None, start: dict | None) -> str:
    lines = []
    for batch in sorted({r["batch"] for r in results}):
        real = [r for r in results if r["model"] in REAL and r["batch"] == batch and "ratio" in r]
        if not real:
            continue
        ratios = [r["ratio"] for r in real]
        worst = max(real, key=lambda r: r["ratio"])
        mean = geomean(ratios)
        ok = mean <= TARGET_REAL and worst["ratio"] <= TARGET_REAL_WORST
        lines.append(
            f"real architectures, batch {batch}: nxrt/ORT geomean {mean:.2f} over {len(real)} "
            f"models, worst {worst['ratio']:.2f} ({worst['model']}) "
            f"(target: <= {TARGET_REAL}, none above {TARGET_REAL_WORST}: {_verdict(ok)})"
        )
    small = [r["ratio"] for r in results if r["model"] in SMALL and "ratio" in r]
    if small:
        median = statistics.median(small)
        lines.append(
            f"small models: nxrt/ORT median {median:.2f} over {len(small)} runs "
            f"(target: <= {TARGET_SMALL}: {_verdict(median <= TARGET_SMALL)})"
        )
    failed = [f"{r['model']}@{r['batch']}" for r in results if "ratio" not in r]
    mismatched = [f"{r['model']}@{r['batch']}" for r in results if "diff" in r and not r["diff"][1]]
    lines.append(
        f"outputs within rtol 1e-3 / atol 1e-4 of ORT: "
        f"{'all' if not mismatched else 'NOT ' + ', '.join(mismatched)}"
        + (f"; nxrt failed on {', '.join(failed)}" if failed else "")
    )
    if chain:
        node = chain["nxrt us/node"]
        lines.append(
            f"per-node overhead (1000 Add nodes on [1, 16]): nxrt {node:.2f} us, "
            f"ORT {chain['ort us/node']:.2f} us; per run of 1 node: nxrt "
            f"{chain['nxrt us/run']:.1f} us, ORT {chain['ort us/run']:.1f} us "
            f"(target: <= {TARGET_NODE_US} us: {_verdict(node <= TARGET_NODE_US)})"
        )
    if start:
        numba = "imports numba" if start["numba_at_import"] else "numba not imported"
        lines.append(f"import nxrt: {start['import_s'] * 1000:.0f} ms ({numba})")
        numba = "imports numba" if start["numba_at_providers"] else "numba not imported"
        command = start["providers_command_s"]
        lines.append(
            f"nxrt providers: {start['providers_s'] * 1000:.0f} ms after import"
            + (f", {command * 1000:.0f} ms the whole command" if command else "")
            + f" ({numba}); importing numba itself: {start['numba_import_mb']:.0f} MB RSS"
        )
        for label in ("cold", "warm"):
            runs = start[label]
            if not runs:
                continue
            first = runs[start["models"][0]]
            total = sum(r["create_s"] + r["first_run_s"] for r in runs.values())
            cache = "empty numba cache" if label == "cold" else "numba cache from the cold run"
            numba = "imported" if start[f"{label}_numba_imported"] else "not imported"
            lines.append(
                f"first session, {label} ({cache}): {first['model']} created in "
                f"{first['create_s']:.2f} s, first run {first['first_run_s']:.2f} s; "
                f"create + first run of all {len(runs)} batch-1 models: {total:.1f} s "
                f"(numba {numba} by these sessions)"
            )
    skipped = [f"{r['model']}@{r['batch']}" for r in results if r.get("reference") == "skipped"]
    if skipped:
        lines.append(f"reference evaluator skipped (minutes per run): {', '.join(skipped)}")
    for r in results:
        if "reference_error" in r:
            lines.append(
                f"reference evaluator fails on {r['model']}@{r['batch']}: {r['reference_error']}"
            )
    return "\n".join(lines)


def start_table(start: dict[str, Any], results: list[dict[str, Any]]) -> str:
    steady = {r["model"]: r["ms"].get("nxrt") for r in results if r["batch"] == 1}
    head = (
        "| model | cold create s | cold first run s | warm create s | warm first run s | run ms |"
    )
    lines = [head, "|---|---:|---:|---:|---:|---:|"]
    for name in start["models"]:
        cold, warm = start["cold"].get(name), start["warm"].get(name)
        if not cold or not warm:
            continue
        ms = steady.get(name)
        lines.append(
            f"| {name} | {cold['create_s']:.2f} | {cold['first_run_s']:.2f} | "
            f"{warm['create_s']:.2f} | {warm['first_run_s']:.2f} | "
            f"{'-' if ms is None else f'{ms:.1f}'} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    all_models = list(torch_models.ALL)
    parser.add_argument("--models", nargs="+", default=["all"], help=f"'all' or of: {all_models}")
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 16])
    parser.add_argument("--threads", type=int, default=2, help="threads for both runtimes")
    parser.add_argument("--repeat", type=int, default=10, help="timed runs per runtime")
    parser.add_argument("--warmup", type=int, default=2, help="untimed runs per runtime")
    parser.add_argument("--block", type=int, default=5, help="timed runs per runtime in a row")
    parser.add_argument("--settle-ms", type=float, default=200.0, help="untimed run-in per block")
    parser.add_argument("--model-dir", help="where exported models go (default: a temp dir)")
    parser.add_argument("--no-memory", dest="memory", action="store_false", help="skip peak RSS")
    parser.add_argument(
        "--no-reference", dest="reference", action="store_false", help="skip the evaluator"
    )
    parser.add_argument(
        "--no-start", dest="start", action="store_false", help="skip import and first-session times"
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    args.models = all_models if "all" in args.models else args.models
    unknown = [m for m in args.models if m not in all_models]
    if unknown:
        parser.error(f"unknown models {unknown}; known: {all_models}")
    args.model_dir = args.model_dir or os.path.join(tempfile.gettempdir(), "nxrt-bench-cpu")
    args.providers = "cpu"  # what bench_models' helpers read
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    batches = sorted({*args.batches, *([1] if args.start else [])})  # start uses batch 1
    export_missing(args.models, batches, args.model_dir)
    with threadpool_limits(limits=args.threads):
        reference_ms: dict[str, float] = {}
        batches = sorted(args.batches)  # batch 1 first: its reference time says what to skip
        results = [bench(n, b, args, reference_ms) for b in batches for n in args.models]
        chain = bench_models.bench_chain(args)
    start = None
    if args.start:
        start = start_times(args.models, args)
    print(
        f"{datetime.date.today()}: threads={args.threads} repeat={args.repeat} "
        f"warmup={args.warmup} block={args.block} settle_ms={args.settle_ms:g} "
        f"onnxruntime={ort.__version__} nxrt={getattr(nxrt, '__version__', '?')} "
        f"numpy={np.__version__} cpus={os.cpu_count()} load={os.getloadavg()[0]:.1f}\n"
    )
    print(table(results))
    print()
    print(summary(results, chain, start))
    if start:
        print()
        print(start_table(start, results))
    if args.json:
        bench_models.write_json(args.json, args, results=results, chain=chain, start=start)
    return 0


if __name__ == "__main__":
    sys.exit(main())

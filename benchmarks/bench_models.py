"""nxrt against ONNX Runtime and the ONNX reference evaluator: latency, memory, overhead.

For every model, one process loads it in nxrt (cpu EP, and any EP named in
``--providers``), in ONNX Runtime's CPU EP and in ``onnx.reference.ReferenceEvaluator``,
all with the same thread count, and prints one table of median latencies and ratios.

Models: the nine light models of the ``onnx`` package; ``bert_base`` (a BERT-base-shaped
encoder: 12 layers, hidden 768, 12 heads, sequence 128) and ``gpt2_step`` (one decoding step
of a GPT-2-small-style decoder with a 128-position key/value cache), both built by
``transformer_models.py`` from seeded random weights into ``--model-dir`` (a temporary folder
by default, never the repository); and ``chain``, 1,000 Add nodes on a ``[1, 16]`` tensor, for
the per-node overhead.

Method:

* Latency: nxrt and ORT are timed alternately, in blocks of ``--block`` calls whose order
  rotates each round; before each block the runtime runs untimed for ``--settle-ms`` so the
  other runtime's spinning threads have gone idle (see ``bench_light.py``). The default,
  200 ms, outlasts both spins: ORT's pool spins briefly, OpenBLAS's threads (nxrt's GEMMs)
  for about 0.1 s after a call, and either slows the other runtime while it lasts. The
  evaluator is slow, so it runs ``--ref-runs`` times, without warm-up, after the others; its
  ratio is reported as how many times slower than nxrt it is (ref / nxrt).
* Threads: nxrt ``intra_op_num_threads`` and ORT ``intra_op_num_threads`` are ``--threads``
  (ORT ``inter_op_num_threads`` 1); BLAS and OpenMP pools are capped at ``--threads`` with
  threadpoolctl for the whole process, which also bounds the reference evaluator's numpy.
* Correctness: every nxrt output is compared with ORT's (``rtol=1e-3, atol=1e-4``); the
  table gives the largest absolute difference and whether all outputs matched.
* Peak memory: for each runtime a fresh subprocess imports numpy, onnx and that runtime
  (for nxrt also the EP plugins and numba, which the cpu EP imports at session creation),
  reads its resident set size (RSS), loads the model, runs it ``1 + 3`` times and reads its
  peak RSS (``VmHWM``). The table gives peak minus post-import RSS, in MB: everything the
  runtime needed for the model (weights as loaded, arenas, activations), not import costs.
  (``tracemalloc`` would miss ONNX Runtime's and numpy's C allocations.) ``VmHWM`` is the
  child's own: exec starts it afresh, whereas ``ru_maxrss`` keeps the high-water mark of
  the process that exec'd, here this one, which has loaded every model so far.
* Per-node overhead (``chain``): ``(median(1000 nodes) - median(1 node)) / 999`` per
  runtime, in microseconds: the cost of one more node, without the fixed per-run cost.

Run::

    python benchmarks/bench_models.py                          # everything, 2 threads
    python benchmarks/bench_models.py --models resnet50 bert_base --no-memory
    python benchmarks/bench_models.py --providers mlx,cpu      # adds an nxrt[mlx] column
"""

from __future__ import annotations

import argparse
import json
import os
import platform
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
from nxrt.tools.light_models import LIGHT_MODELS, dummy_feeds, light_model_path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import transformer_models  # noqa: E402

TRANSFORMERS = list(transformer_models.MODELS)
CHAIN = "chain"
ALL = [*LIGHT_MODELS, *TRANSFORMERS, CHAIN]
RTOL, ATOL = 1e-3, 1e-4


# -- models -------------------------------------------------------------------------------------


def resolve(name: str, model_dir: str) -> tuple[str, str, Callable[[Any], dict[str, np.ndarray]]]:
    """``(label, path, feeds(session))`` of a model name."""
    if name in TRANSFORMERS:
        path = transformer_models.write(name, model_dir)
        feeds = transformer_models.MODELS[name][1]()
        return name, path, lambda session: feeds
    path = light_model_path(name)
    if not os.path.exists(path):
        raise SystemExit(f"unknown model {name!r}; known: {', '.join(ALL)}")
    return os.path.splitext(os.path.basename(path))[0], path, dummy_feeds


def nxrt_session(path: str, providers: list[str], threads: int) -> Any:
    options = nxrt.SessionOptions()
    options.intra_op_num_threads = threads
    return nxrt.InferenceSession(path, sess_options=options, providers=providers)


def ort_session(path: str, threads: int) -> Any:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3  # light models carry unused initializers it warns about
    return ort.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])


def provider_columns(spec: str) -> dict[str, list[str]]:
    """``--providers mlx,cpu`` -> ``{"nxrt": ["cpu"], "nxrt[mlx]": ["mlx", "cpu"]}``."""
    columns = {"nxrt": ["cpu"]}
    for ep in (p.strip() for p in spec.split(",")):
        if ep and ep != "cpu":
            columns[f"nxrt[{ep}]"] = [ep, "cpu"]
    return columns


# -- timing -------------------------------------------------------------------------------------


def interleaved(runners: dict[str, Callable[[], Any]], args: argparse.Namespace) -> dict:
    """Median and spread of each runner, timed in alternating blocks; last outputs too."""
    for _ in range(args.warmup):
        for run in runners.values():
            run()
    names = list(runners)
    times: dict[str, list[float]] = {name: [] for name in names}
    outputs: dict[str, Any] = {}
    rounds = -(-args.repeat // args.block)
    for i in range(rounds):
        order = names[i % len(names) :] + names[: i % len(names)]
        for name in order:
            run = runners[name]
            settle_end = time.perf_counter() + args.settle_ms / 1000.0
            run()
            while time.perf_counter() < settle_end:
                run()
            for _ in range(min(args.block, args.repeat - len(times[name]))):
                start = time.perf_counter()
                outputs[name] = run()
                times[name].append(time.perf_counter() - start)
    return {name: summarise(times[name]) for name in names}, outputs


def summarise(times: list[float]) -> dict[str, float]:
    ms = sorted(t * 1000.0 for t in times)
    return {
        "median_ms": statistics.median(ms),
        "p90_ms": ms[min(len(ms) - 1, int(np.ceil(0.9 * len(ms))) - 1)],
        "min_ms": ms[0],
        "runs": len(ms),
    }


def compare(got: list, want: list) -> tuple[float, bool]:
    """Largest absolute difference and whether every output is within tolerance."""
    worst, ok = 0.0, True
    for x, y in zip(got, want, strict=True):
        x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
        if x.shape != y.shape:
            return float("inf"), False
        if x.size:
            worst = max(worst, float(np.max(np.abs(x - y))))
            ok = ok and bool(np.allclose(x, y, rtol=RTOL, atol=ATOL))
    return worst, ok


def bench_model(name: str, args: argparse.Namespace) -> dict:
    label, path, make_feeds = resolve(name, args.model_dir)
    result: dict = {"model": label}
    ort_sess = ort_session(path, args.threads)
    feeds = make_feeds(ort_sess)
    runners: dict[str, Callable[[], Any]] = {}
    for column, providers in provider_columns(args.providers).items():
        try:
            session = nxrt_session(path, providers, args.threads)
            own = {i.name: feeds[i.name] for i in session.get_inputs()}
            session.run(None, own)
        except Exception as exc:  # a benchmark reports a failing runtime and goes on
            result.setdefault("errors", {})[column] = f"{type(exc).__name__}: {exc}"[:200]
            continue
        runners[column] = lambda s=session, f=own: s.run(None, f)
    ort_feeds = {i.name: feeds[i.name] for i in ort_sess.get_inputs()}
    runners["ort"] = lambda: ort_sess.run(None, ort_feeds)
    stats, outputs = interleaved(runners, args)
    result.update(stats)
    for column in runners:
        if column != "ort":
            result[f"{column}/ort"] = stats[column]["median_ms"] / stats["ort"]["median_ms"]
            result[f"{column} diff"] = compare(outputs[column], outputs["ort"])
    if args.ref_runs:
        from onnx.reference import ReferenceEvaluator

        reference = ReferenceEvaluator(path)
        ref_feeds = {n: feeds[n] for n in reference.input_names if n in feeds}
        times = []
        for _ in range(args.ref_runs):
            start = time.perf_counter()
            reference.run(None, ref_feeds)
            times.append(time.perf_counter() - start)
        result["reference"] = summarise(times)
        if "nxrt" in stats:
            result["reference/nxrt"] = result["reference"]["median_ms"] / stats["nxrt"]["median_ms"]
    if args.memory:
        runtimes = [*(c for c in provider_columns(args.providers)), "ort"]
        runtimes += ["reference"] if args.ref_runs else []
        result["peak_mb"] = {rt: peak_memory(rt, name, args) for rt in runtimes}
    return result


def bench_chain(args: argparse.Namespace) -> dict:
    """Per-node overhead from a 1-node and a 1000-node chain."""
    result: dict = {"model": CHAIN}
    x = {"x": np.ones((1, 16), np.float32)}
    medians: dict[int, dict[str, float]] = {}
    chain_args = argparse.Namespace(**{**vars(args), "repeat": max(args.repeat, 200), "block": 50})
    for count in (1, 1000):
        data = transformer_models.node_chain(count).SerializeToString()
        runners: dict[str, Callable[[], Any]] = {}
        for column, providers in provider_columns(args.providers).items():
            session = nxrt_session(data, providers, args.threads)
            runners[column] = lambda s=session: s.run(None, x)
        ort_sess = ort_session(data, args.threads)
        runners["ort"] = lambda s=ort_sess: s.run(None, x)
        stats, _ = interleaved(runners, chain_args)
        medians[count] = {k: v["median_ms"] for k, v in stats.items()}
    for column in medians[1]:
        result[f"{column} us/node"] = (medians[1000][column] - medians[1][column]) * 1000 / 999
        result[f"{column} us/run"] = medians[1][column] * 1000
    return result


# -- peak memory, one subprocess per runtime ----------------------------------------------------

_PEAK_SCRIPT = r"""
import json, sys
def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0
import numpy as np, onnx, onnxruntime
from threadpoolctl import threadpool_limits
runtime, name, model_dir, threads = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
sys.path.insert(0, sys.argv[5])
import importlib
import bench_models as bm
resolve = importlib.import_module(sys.argv[7]).resolve
import nxrt
if runtime == "reference":
    from onnx.reference import ReferenceEvaluator
elif runtime != "ort":
    nxrt.get_available_providers()  # load the EP plugins before the baseline
    try:
        import nxrt_ep_cpu.jit  # numba: an import cost, paid at the first session
    except ImportError:
        pass
base = status("VmRSS")
with threadpool_limits(threads):
    label, path, make_feeds = resolve(name, model_dir)
    if runtime == "ort":
        session = bm.ort_session(path, threads)
        feeds, runs = make_feeds(session), 4
        call = lambda: session.run(None, {i.name: feeds[i.name] for i in session.get_inputs()})
    elif runtime == "reference":
        session = ReferenceEvaluator(path)
        feeds, runs = make_feeds(bm.ort_session(path, 1)), 1
        call = lambda: session.run(None, {n: feeds[n] for n in session.input_names if n in feeds})
    else:
        providers = bm.provider_columns(sys.argv[6])[runtime]
        session = bm.nxrt_session(path, providers, threads)
        feeds, runs = make_feeds(session), 4
        call = lambda: session.run(None, {i.name: feeds[i.name] for i in session.get_inputs()})
    for _ in range(runs):
        call()
print(json.dumps({"peak": status("VmHWM"), "base": base}))
"""


def peak_memory(
    runtime: str, name: str, args: argparse.Namespace, resolver: str = "bench_models"
) -> float | None:
    """Peak RSS minus post-import RSS of a fresh process running the model, in MB.

    ``resolver`` names the module (in this folder) whose ``resolve(name, model_dir)``
    gives ``(label, path, feeds(session))``.
    """
    here = os.path.dirname(os.path.abspath(__file__))
    command = [sys.executable, "-c", _PEAK_SCRIPT, runtime, name, args.model_dir]
    command += [str(args.threads), here, args.providers, resolver]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=True)
        sample = json.loads(done.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError):
        return None
    return (sample["peak"] - sample["base"]) / 2**20


# -- report -------------------------------------------------------------------------------------


def table(results: list[dict], args: argparse.Namespace) -> str:
    columns = [c for c in provider_columns(args.providers) if c != "nxrt"]
    head = ["model", "nxrt ms", "ORT ms", "nxrt/ORT"]
    for column in columns:
        head += [f"{column} ms", f"{column}/ORT"]
    head += ["ref ms", "ref/nxrt", "peak MB nxrt / ORT / ref", "max abs diff (ok)"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for r in results:
        if r["model"] == CHAIN:
            continue
        if "nxrt" not in r:
            lines.append(f"| {r['model']} | error: {r.get('errors')} |")
            continue
        row = [r["model"], f"{r['nxrt']['median_ms']:.2f}", f"{r['ort']['median_ms']:.2f}"]
        row.append(f"**{r['nxrt/ort']:.2f}**")
        for column in columns:
            if column in r:
                row += [f"{r[column]['median_ms']:.2f}", f"{r[f'{column}/ort']:.2f}"]
            else:
                row += ["error", ""]
        if "reference" in r:
            row += [f"{r['reference']['median_ms']:.0f}", f"{r['reference/nxrt']:.0f}x"]
        else:
            row += ["", ""]
        peaks = r.get("peak_mb", {})
        order = ["nxrt", "ort", "reference"]
        row.append(" / ".join("?" if peaks.get(k) is None else f"{peaks[k]:.0f}" for k in order))
        diff, ok = r["nxrt diff"]
        row.append(f"{diff:.1e} ({'yes' if ok else 'NO'})")
        lines.append("| " + " | ".join(row) + " |")
    for r in results:
        if r["model"] == CHAIN:
            lines.append("")
            lines.append("| 1000-node chain | µs per node | µs per run (1 node) |")
            lines.append("|---|---:|---:|")
            for column in [*provider_columns(args.providers), "ort"]:
                label = "ORT" if column == "ort" else column
                lines.append(
                    f"| {label} | {r[f'{column} us/node']:.2f} | {r[f'{column} us/run']:.1f} |"
                )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["all"], help=f"'all' or of: {ALL}")
    parser.add_argument("--threads", type=int, default=2, help="threads for every runtime")
    parser.add_argument("--providers", default="cpu", help="nxrt EPs, e.g. mlx,cpu")
    parser.add_argument("--repeat", type=int, default=20, help="timed runs per runtime")
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs per runtime")
    parser.add_argument("--block", type=int, default=5, help="timed runs per runtime in a row")
    parser.add_argument("--settle-ms", type=float, default=200.0, help="untimed run-in per block")
    parser.add_argument("--ref-runs", type=int, default=1, help="reference runs (0: skip)")
    parser.add_argument("--no-memory", dest="memory", action="store_false", help="skip peak RSS")
    parser.add_argument("--model-dir", help="where the transformer models go (default: a temp dir)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    if "all" in args.models:
        args.models = ALL
    if args.model_dir is None:
        args.model_dir = os.path.join(tempfile.gettempdir(), "nxrt-bench-models")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = []
    with threadpool_limits(limits=args.threads):
        for name in args.models:
            start = time.perf_counter()
            result = bench_chain(args) if name == CHAIN else bench_model(name, args)
            results.append(result)
            print(f"{name}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    settings = (
        f"threads={args.threads} repeat={args.repeat} warmup={args.warmup} block={args.block} "
        f"settle_ms={args.settle_ms:g} ref_runs={args.ref_runs} providers={args.providers} "
        f"onnxruntime={ort.__version__} nxrt={getattr(nxrt, '__version__', '?')} "
        f"numpy={np.__version__} cpus={os.cpu_count()} load={os.getloadavg()[0]:.1f}"
    )
    print(settings + "\n")
    print(table(results, args))
    if args.json:
        write_json(args.json, args, results=results)
    return 0


def write_json(path: str, args: argparse.Namespace, **parts: Any) -> None:
    """The run's settings and results as JSON, for comparing runs later."""
    payload = {
        "settings": {**vars(args), "onnxruntime": ort.__version__, "numpy": np.__version__},
        "python": platform.python_version(),
        **parts,
    }
    with open(path, "w") as f:
        json.dump(payload, f, indent=2, default=str)


if __name__ == "__main__":
    sys.exit(main())

"""int8 models as ``onnxruntime.quantization`` writes them: nxrt against ONNX Runtime.

For each model (``int8_models.py``: light-model CNNs with seeded random weights,
quantized statically as QDQ with per-channel int8 weights; BERT-shaped
transformer blocks quantized dynamically, MatMulInteger and
DynamicQuantizeLinear), written into ``--folder`` (a temporary one by default)
and calibrated on seeded random inputs, this times side by side, in one
process and interleaved:

* ``nxrt int8``: the int8 model on nxrt's cpu EP (its QDQ and dynamic
  quantization passes fold the chains into integer kernels);
* ``nxrt fp32``: the float model on nxrt's cpu EP;
* ``ORT int8`` and ``ORT fp32``: the same two models on ONNX Runtime's CPU EP
  with its default optimizations;
* ``nxrt ov int8`` (with ``--openvino``): the int8 model with
  ``providers=["openvino", "cpu"]``.

Each model runs in a process of its own. Batch 1, ``--threads`` threads for every
runtime (ORT: intra-op threads, one inter-op thread; nxrt: ``intra_op_num_threads``),
BLAS and OpenMP pools capped with threadpoolctl. In each round every runtime runs
``--block`` timed calls after at least ``--settle-ms`` of untimed ones, and the order
turns every round.
Figures are medians; ratios are nxrt int8 over the others.

Correctness, as issue 31 states it: ``d(x)`` is the largest absolute difference of
``x``'s outputs from ONNX Runtime with ``ORT_DISABLE_ALL`` (the operators as the ONNX
spec writes them). The bar: ``d(nxrt int8) <= d(ORT int8)`` on every model, and a
classifier's top class is one ONNX Runtime gives with or without its
optimizations. Run::

    python benchmarks/bench_int8.py                        # every model, 2 threads
    python benchmarks/bench_int8.py --models resnet50 encoder --repeat 40 --openvino
    python benchmarks/bench_int8.py --folder /tmp/int8-models --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np
import onnxruntime as ort
from threadpoolctl import threadpool_limits

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import int8_models  # noqa: E402

import nxrt  # noqa: E402

RUNTIMES = ("nxrt int8", "nxrt fp32", "ORT int8", "ORT fp32")
OPENVINO = "nxrt ov int8"


def cpu_model() -> str:
    """The CPU's model name and the integer instruction sets nxrt's kernels may use."""
    name, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                elif line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8")
    return f"{name} ({', '.join(f for f in wanted if f in flags) or 'no AVX2'})"


def kernel_level() -> str:
    from nxrt_ep_cpu.jit import qgemm

    return qgemm.level()


def _ort(path: str, threads: int, level: ort.GraphOptimizationLevel | None = None):
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    if level is not None:
        options.graph_optimization_level = level
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def _nxrt(path: str, threads: int, providers: list[str]):
    options = nxrt.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("nxrt.cpu.compile", "wait")  # steady state from run 1
    return nxrt.InferenceSession(path, options, providers=providers)


def openvino_crash(path: str) -> str:
    """Why the openvino EP is not measured on ``path``: OpenVINO crashed compiling it in a
    process of its own (it segfaults on some QDQ graphs, which must not end the benchmark);
    "" otherwise."""
    probe = (
        "import sys, openvino as ov; core = ov.Core(); "
        "core.compile_model(core.read_model(sys.argv[1]), 'CPU')"
    )
    done = subprocess.run([sys.executable, "-c", probe, path], capture_output=True, timeout=900)
    if done.returncode < 0:  # an error is the EP's to handle (it claims less); a crash is not
        return f"OpenVINO's compile_model crashed (signal {-done.returncode}) on this model"
    return ""


def max_abs_diff(a: list, b: list) -> float:
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        if x.shape != y.shape:
            return math.inf
        if x.size:
            worst = max(worst, float(np.max(np.abs(x - y))))
    return worst


def _top(outputs: list) -> int | None:
    """The top class of a classifier's logits (one row of 1000), else ``None``."""
    first = np.asarray(outputs[0])
    return int(np.argmax(first)) if first.size == 1000 else None


def bench_model(name: str, folder: str, args: argparse.Namespace) -> dict:
    float_path, int8_path, feeds = int8_models.build(name, folder)
    result: dict = {"model": name, "quantization": "static QDQ" if name in int8_models.CNNS
                    else "dynamic"}  # fmt: skip
    makers: dict[str, Callable[[], object]] = {
        "nxrt int8": lambda: _nxrt(int8_path, args.threads, ["cpu"]),
        "nxrt fp32": lambda: _nxrt(float_path, args.threads, ["cpu"]),
        "ORT int8": lambda: _ort(int8_path, args.threads),
        "ORT fp32": lambda: _ort(float_path, args.threads),
    }
    if args.openvino:
        crash = openvino_crash(int8_path)
        if crash:
            result[f"{OPENVINO} error"] = crash
        else:
            makers[OPENVINO] = lambda: _nxrt(int8_path, args.threads, ["openvino", "cpu"])
    sessions, runners = {}, {}
    for label, make in makers.items():
        try:
            sessions[label] = make()
        except Exception as exc:  # a benchmark reports a failing runtime and moves on
            result[f"{label} error"] = f"{type(exc).__name__}: {exc}"[:200]
            continue
        runners[label] = (lambda s: lambda: s.run(None, feeds))(sessions[label])
    reference = _ort(int8_path, args.threads, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    expected = reference.run(None, feeds)
    outputs = {label: run() for label, run in runners.items()}
    for _ in range(args.warmup):
        for run in runners.values():
            run()
    times: dict[str, list[float]] = {label: [] for label in runners}
    order = list(runners)
    for round_ in range(-(-args.repeat // args.block)):
        for label in order if round_ % 2 == 0 else reversed(order):
            run = runners[label]
            settle = time.perf_counter() + args.settle_ms / 1000
            run()
            while time.perf_counter() < settle:
                run()
            for _ in range(min(args.block, args.repeat - len(times[label]))):
                start = time.perf_counter()
                run()
                times[label].append(time.perf_counter() - start)
        order = order[1:] + order[:1]
    result["median_ms"] = {label: statistics.median(t) * 1e3 for label, t in times.items()}
    medians = result["median_ms"]
    if "nxrt int8" in medians:
        result["ratios"] = {
            f"nxrt int8 / {label}": medians["nxrt int8"] / medians[label]
            for label in medians
            if label != "nxrt int8"
        }
    int8_labels = [label for label in outputs if "int8" in label]
    result["diff_to_unfused"] = {label: max_abs_diff(outputs[label], expected)
                                 for label in int8_labels}  # fmt: skip
    diffs = result["diff_to_unfused"]
    if "nxrt int8" in diffs and "ORT int8" in diffs:
        result["bar_diff"] = diffs["nxrt int8"] <= diffs["ORT int8"]
    top_ref = _top(expected)
    if top_ref is not None and "nxrt int8" in outputs:
        allowed = {top_ref, _top(outputs.get("ORT int8", expected))}
        result["top"] = {label: _top(outputs[label]) for label in int8_labels}
        result["top"]["ORT unfused"] = top_ref
        result["bar_top"] = result["top"]["nxrt int8"] in allowed
    return result


def _cell(value: float | None, digits: int = 2) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def markdown(results: list[dict], labels: list[str]) -> str:
    head = "| model | quant | " + " | ".join(f"{label} ms" for label in labels)
    head += " | int8 / ORT int8 | int8 / nxrt fp32 | d(nxrt int8) | d(ORT int8) |"
    if OPENVINO in labels:
        head += " d(ov int8) |"
    head += " top (nxrt, ORT, unfused) | bar |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['model']} | error: {r['error']} |")
            continue
        medians, diffs = r.get("median_ms", {}), r.get("diff_to_unfused", {})
        ratios = r.get("ratios", {})
        cells = [_cell(medians.get(label)) for label in labels]
        cells += [
            _cell(ratios.get("nxrt int8 / ORT int8")),
            _cell(ratios.get("nxrt int8 / nxrt fp32")),
            f"{diffs.get('nxrt int8', float('nan')):.3g}",
            f"{diffs.get('ORT int8', float('nan')):.3g}",
        ]
        if OPENVINO in labels:
            cells.append(f"{diffs.get(OPENVINO, float('nan')):.3g}")
        top = r.get("top")
        cells.append(
            f"{top['nxrt int8']}, {top.get('ORT int8')}, {top['ORT unfused']}" if top else ""
        )
        bar = r.get("bar_diff", False) and r.get("bar_top", True)
        cells.append("pass" if bar else "FAIL")
        lines.append(f"| {r['model']} | {r['quantization']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def geometric_mean(values: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else math.nan


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    models = [*int8_models.CNNS, *int8_models.TRANSFORMERS]
    parser.add_argument("--models", nargs="+", default=models, choices=models)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=20, help="timed runs per runtime")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--block", type=int, default=5, help="timed runs in a row")
    parser.add_argument("--settle-ms", type=float, default=100.0)
    parser.add_argument("--folder", help="where the models are written (kept); a temporary one")
    parser.add_argument("--openvino", action="store_true", help="also the openvino EP")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: one model, this process
    return parser.parse_args(argv)


def _in_own_process(name: str, folder: str, args: argparse.Namespace) -> dict:
    """:func:`bench_model` in a fresh process: one model's sessions (their thread pools,
    OpenVINO's spinning workers) never slow the next model's timings."""
    with tempfile.TemporaryDirectory() as scratch:
        out = os.path.join(scratch, "result.json")
        command = [sys.executable, os.path.abspath(__file__), "--one", name, "--folder", folder,
                   "--json", out, "--threads", str(args.threads), "--repeat", str(args.repeat),
                   "--warmup", str(args.warmup), "--block", str(args.block),
                   "--settle-ms", str(args.settle_ms)]  # fmt: skip
        command += ["--openvino"] if args.openvino else []
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0 or not os.path.exists(out):
            tail = (done.stderr or "").strip().splitlines()[-1:] or [f"exit {done.returncode}"]
            return {"model": name, "quantization": "", "error": tail[0][:200]}
        with open(out, encoding="utf-8") as f:
            return json.load(f)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.one:  # one model, in the process the parent started
        with threadpool_limits(limits=args.threads):
            result = bench_model(args.one, args.folder, args)
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f)
        return 0
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.folder or scratch
        os.makedirs(folder, exist_ok=True)
        for name in args.models:
            results.append(_in_own_process(name, folder, args))
            print(f"{name}: done", file=sys.stderr, flush=True)
    labels = [*RUNTIMES, *([OPENVINO] if args.openvino else [])]
    print(f"CPU: {cpu_model()}; nxrt integer kernels: {kernel_level()}")
    print(f"threads={args.threads} repeat={args.repeat} block={args.block} batch=1")
    print(markdown(results, labels))
    to_ort = [r["ratios"]["nxrt int8 / ORT int8"] for r in results if "ratios" in r]
    print(f"geometric mean nxrt int8 / ORT int8: {geometric_mean(to_ort):.2f}")
    for r in results:
        for key, value in r.items():
            if key.endswith("error"):
                print(f"{r['model']}: {key}: {value}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"cpu": cpu_model(), "results": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

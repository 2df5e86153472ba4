"""First use against ONNX Runtime: session creation, first run and warm latency, cold and warm.

What a new user meets: a fresh process creates a session and runs it once. Each
case runs in a fresh process; a *cold* case also gets fresh, empty cache
folders (``NUMBA_CACHE_DIR``, ``NXRT_CACHE_DIR`` and ``XDG_CACHE_HOME``: numba's
compiled kernels, nxrt's selection decisions, anything else under the user's
cache), and the *warm* case is a second fresh process on the folders the cold
one filled. ONNX Runtime keeps no cache, so its two processes differ only in
the file system's and CPU caches.

Per model and runtime::

    create   InferenceSession(...) returned (s), in the fresh process, imports not counted
    first    the first run (s)
    total    create + first
    ready    nxrt, background compiling: until every compiled kernel took over (s)
    warm ms  median of --repeat runs after that (ms): the steady-state speed

Runtimes: ``cpu`` (nxrt, ``providers=["cpu"]``, the default ``nxrt.cpu.compile``),
``cpu-wait`` (``nxrt.cpu.compile=wait``), ``default`` (nxrt's default selection,
no ``providers``), ``ort`` (onnxruntime's CPUExecutionProvider). Models: the
embedded digits classifier ``nxrt run`` runs (its batch of 450), the onnx
package's light models (``resnet50`` is the onnx package's), and the real
architectures of ``torch_models.py`` named ``torch:NAME`` (``torch:resnet50``,
``torch:mobilenet_v2``, ``torch:bert_base``, ...: exported once, before any case,
into ``--model-dir``; they need torch). It also times ``nxrt.get_available_providers()`` and
``import onnxruntime`` in fresh processes.

Run::

    python benchmarks/bench_start.py             # digits, resnet50, squeezenet, shufflenet
    python benchmarks/bench_start.py --models squeezenet --runtimes cpu,ort
    python benchmarks/bench_start.py --models torch:resnet50 torch:mobilenet_v2 \
        torch:efficientnet_b0 torch:bert_base --runtimes cpu,default,ort
    python benchmarks/bench_start.py --plugin-path /tmp/old/plugins/cpu   # another nxrt-ep-cpu
    python benchmarks/bench_start.py --json out.json

Ratios are nxrt / ONNX Runtime: cold total against ORT's cold total, warm
creation against ORT's warm creation, warm latency against ORT's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DEFAULT_MODELS = ("digits", "resnet50", "squeezenet", "shufflenet")
RUNTIMES = ("cpu", "cpu-wait", "default", "ort")
#: The prefix of a model of torch_models.py.
TORCH = "torch:"


def cpu_name() -> str:
    """The CPU this ran on, from ``/proc/cpuinfo`` (model, cores, the vector extensions)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        import platform

        return platform.processor() or "unknown CPU"
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in text.splitlines()
            if line.startswith("model name")
        ),
        "unknown",
    )
    flags = next(
        (line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")),
        [],
    )
    isa = [f for f in ("avx2", "fma", "avx512f", "avx512_vnni", "amx_tile") if f in flags]
    return f"{model}, {os.cpu_count()} logical CPUs, {' '.join(isa) or 'no AVX2'}"


# -- the child: one measurement in a fresh process -----------------------------------------------


def _load(model: str, model_dir: str) -> tuple[Any, Any]:
    """The model (path or bytes) and its feeds."""
    import numpy as np

    if model.startswith(TORCH):  # exported by main() into model_dir
        import torch_models

        name = model.removeprefix(TORCH)
        return torch_models.model_path(name, model_dir), torch_models.feeds_for(name)

    if model == "digits":
        from importlib import resources

        data = resources.files("nxrt") / "data"
        pixels = np.load(data / "digits_test.npz")["pixels"].astype(np.float32)
        return (data / "digits_cnn.onnx").read_bytes(), {"pixels": pixels}
    from nxrt.tools.light_models import light_model_path

    return light_model_path(model), None


def child(runtime: str, model: str, repeat: int, threads: int, model_dir: str) -> dict[str, Any]:
    started = time.perf_counter()
    source, feeds = _load(model, model_dir)
    if runtime == "ort":
        import onnxruntime as ort

        imported = time.perf_counter()
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        begin = time.perf_counter()
        session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    else:
        import nxrt

        imported = time.perf_counter()
        options = nxrt.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        if runtime == "cpu-wait":
            options.add_session_config_entry("nxrt.cpu.compile", "wait")
        providers = None if runtime == "default" else ["cpu"]
        begin = time.perf_counter()
        session = nxrt.InferenceSession(source, options, providers=providers)
    created = time.perf_counter()
    if feeds is None:
        from nxrt.tools.light_models import dummy_feeds

        feeds = dummy_feeds(session)
    session.run(None, feeds)
    first = time.perf_counter()
    waited = getattr(session, "wait_for_compiled", lambda: True)()
    ready = time.perf_counter()
    session.run(None, feeds)  # the compiled kernels' first run
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - t)
    return {
        "import_s": imported - started,
        "create_s": created - begin,
        "first_s": first - created,
        "ready_s": ready - begin if waited else None,
        "warm_ms": statistics.median(times) * 1000,
        "providers": list(session.get_providers()),
    }


def probe(what: str) -> float:
    """Seconds of ``import onnxruntime`` or ``nxrt.get_available_providers()``, this process."""
    start = time.perf_counter()
    if what == "ort-import":
        import onnxruntime  # noqa: F401
    else:
        import nxrt

        nxrt.get_available_providers()
    return time.perf_counter() - start


# -- the parent ---------------------------------------------------------------------------------


def run_child(args: list[str], env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "--child", *args], env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def environment(folder: str, plugin_path: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NXRT_", "NUMBA_CACHE"))}
    env |= {
        "NUMBA_CACHE_DIR": os.path.join(folder, "numba"),
        "NXRT_CACHE_DIR": os.path.join(folder, "nxrt"),
        "XDG_CACHE_HOME": os.path.join(folder, "xdg"),
    }
    if plugin_path:
        env["PYTHONPATH"] = os.pathsep.join([plugin_path, env.get("PYTHONPATH", "")]).rstrip(
            os.pathsep
        )
    return env


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS))
    parser.add_argument("--runtimes", default="cpu,cpu-wait,ort", help=f"of {', '.join(RUNTIMES)}")
    parser.add_argument("--repeat", type=int, default=20, help="warm runs timed")
    parser.add_argument("--threads", type=int, default=0, help="intra-op threads (0: default)")
    parser.add_argument("--plugin-path", help="a folder holding another nxrt_ep_cpu, put first")
    parser.add_argument("--json", help="write every figure here")
    parser.add_argument(
        "--model-dir", help="where torch_models.py's models are exported (default: a temporary one)"
    )
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, *rest = args.child
        if kind == "probe":
            print(json.dumps({"s": probe(rest[0])}))
        else:
            print(json.dumps(child(kind, rest[0], int(rest[1]), int(rest[2]), rest[3])))
        return 0

    runtimes = args.runtimes.split(",")
    print(f"CPU: {cpu_name()}")
    print(f"python {sys.version.split()[0]}; plugin path: {args.plugin_path or 'installed'}")
    results: dict[str, Any] = {"cpu": cpu_name(), "rows": [], "probes": {}}
    with tempfile.TemporaryDirectory(prefix="bench_start_") as root:
        model_dir = args.model_dir or os.path.join(root, "models")
        for model in args.models:
            if model.startswith(TORCH):
                import torch_models

                torch_models.build(model.removeprefix(TORCH), model_dir)
        for what in ("nxrt-providers", "ort-import"):
            env = environment(os.path.join(root, what), args.plugin_path)
            results["probes"][what] = run_child(["probe", what], env)["s"]
        for model in args.models:
            for runtime in runtimes:
                folder = os.path.join(root, f"{model}-{runtime}")
                env = environment(folder, args.plugin_path)
                common = [model, str(args.repeat), str(args.threads), model_dir]
                cold = run_child([runtime, *common], env)
                warm = run_child([runtime, *common], env)
                row = {"model": model, "runtime": runtime, "cold": cold, "warm": warm}
                results["rows"].append(row)
                print(f"  measured {model} {runtime}", file=sys.stderr, flush=True)
    _report(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


def _report(results: dict[str, Any]) -> None:
    probes = results["probes"]
    print(
        f"\nfresh process: nxrt.get_available_providers() {probes['nxrt-providers']:.2f} s, "
        f"import onnxruntime {probes['ort-import']:.2f} s"
    )
    header = ("model", "runtime", "cold create", "first", "total", "ready")
    header += ("warm create", "first", "total", "warm ms")
    rows = []
    for r in results["rows"]:
        c, w = r["cold"], r["warm"]
        ready = "" if c["ready_s"] is None else f"{c['ready_s']:.2f}"
        cold = (c["create_s"], c["first_s"], c["create_s"] + c["first_s"])
        warm = (w["create_s"], w["first_s"], w["create_s"] + w["first_s"])
        rows.append((r["model"], r["runtime"], *_s(cold), ready, *_s(warm), f"{w['warm_ms']:.2f}"))
    _table(header, rows)
    by = {(r["model"], r["runtime"]): r for r in results["rows"]}
    ratio_rows = []
    for r in results["rows"]:
        ort = by.get((r["model"], "ort"))
        if ort is None or r["runtime"] == "ort":
            continue
        c, w, oc, ow = r["cold"], r["warm"], ort["cold"], ort["warm"]
        ratio_rows.append(
            (
                r["model"], r["runtime"],
                f"{(c['create_s'] + c['first_s']) / (oc['create_s'] + oc['first_s']):.1f}",
                f"{w['create_s'] / ow['create_s']:.1f}",
                f"{(w['create_s'] + w['first_s']) / (ow['create_s'] + ow['first_s']):.1f}",
                f"{w['warm_ms'] / ow['warm_ms']:.2f}",
            )
        )  # fmt: skip
    if ratio_rows:
        print("\nnxrt / ONNX Runtime:")
        _table(
            ("model", "runtime", "cold total", "warm create", "warm total", "warm ms"), ratio_rows
        )


def _s(values: tuple[float, ...]) -> tuple[str, ...]:
    return tuple(f"{v:.2f}" for v in values)


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    for line in (header, *rows):
        print(
            "  ".join(
                str(x).rjust(n) if i > 1 else str(x).ljust(n)
                for i, (x, n) in enumerate(zip(line, widths, strict=True))
            )
        )


if __name__ == "__main__":
    sys.exit(main())

"""nxrt's cpu EP against ONNX Runtime on the instruction-set level numba compiles for.

The cpu EP's compiled kernels pick their tile shapes per level (``jit/isa.py``: AVX-512,
AVX2, generic), from the target numba compiles for. On an AVX-512 machine the AVX2 code
runs with ``--avx2`` (this script then re-runs itself with ``NUMBA_CPU_NAME=haswell``, an
empty ``NUMBA_CPU_FEATURES`` and ``OPENBLAS_CORETYPE=Haswell``); ONNX Runtime keeps its
own AVX-512 kernels there, so that ratio is the harder one.

Models: light models of the ``onnx`` package at batch 1 (``dummy_feeds``), and small
models at users' shapes built by ``tests/test_determinism.py`` (a CNN on 28x28 maps, an
MLP, a pre-norm attention block, a GRU) plus a MobileNetV2-shaped network built here
(inverted residuals with depthwise 3x3 convolutions, random weights).

Method: one process holds an nxrt session (``providers=["cpu"]``,
``intra_op_num_threads=--threads``, compiled kernels built before it returns:
``NXRT_CPU_COMPILE=wait``) and an ONNX Runtime session (CPUExecutionProvider,
``intra_op_num_threads=--threads``, one inter-op thread) of each model and times them
interleaved (``bench_models.interleaved``: blocks whose order rotates, each preceded by
untimed settling runs); BLAS pools capped at ``--threads``. Medians, the ratio
nxrt / ORT, and the geometric mean (light models) and median (small models) of the ratios.
The machine's load average is printed before and after: on shared cores wall-clock ratios
move, and a team of threads waits for a descheduled member; ``--threads 1 --cpu-time``
times the calling thread's CPU time instead, which other processes barely change.

Run::

    python benchmarks/bench_isa.py                  # the native target
    python benchmarks/bench_isa.py --avx2           # AVX2 forced
    python benchmarks/bench_isa.py --models resnet50 cnn_b7 --repeat 60
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
AVX2_ENV = {"NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": "", "OPENBLAS_CORETYPE": "Haswell"}


def _rerun_forced() -> None:
    """With ``--avx2`` and the target not yet forced: this script again, AVX2 forced (numba
    and OpenBLAS read the settings when they load, so it must be a fresh process)."""
    if "--avx2" in sys.argv and os.environ.get("NUMBA_CPU_NAME") != "haswell":
        env = {**os.environ, **AVX2_ENV}
        sys.exit(subprocess.call([sys.executable, *sys.argv], env=env))


_rerun_forced()
# compiled kernels built before the session returns: no numpy tier in the timed runs
os.environ.setdefault("NXRT_CPU_COMPILE", "wait")

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

import nxrt  # noqa: E402
from nxrt.tools.light_models import dummy_feeds, light_model_path  # noqa: E402

sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))
import bench_models  # noqa: E402

import test_determinism as small  # noqa: E402

LIGHT = ("resnet50", "squeezenet", "shufflenet", "densenet121", "inception_v1")


def _normal(*shape: int) -> np.ndarray:
    return np.random.default_rng(3).standard_normal(shape).astype(np.float32)


def mobilenet_v2(width: int = 224) -> onnx.ModelProto:
    """MobileNetV2's layout (stem, 17 inverted residuals, 1x1 head, pooled classifier) with
    random weights, BatchNorm folded away and Clip(0, 6) activations."""
    rng = np.random.default_rng(5)
    weights: list = []
    nodes: list = []
    count = [0]

    def conv(x: str, cin: int, cout: int, k: int, stride: int, group: int, act: bool) -> str:
        count[0] += 1
        i = count[0]
        scale = math.sqrt(2.0 / (k * k * cin // group))
        w = (rng.standard_normal((cout, cin // group, k, k)) * scale).astype(np.float32)
        b = (rng.standard_normal(cout) * 0.1).astype(np.float32)
        weights.extend([numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")])
        pad = k // 2
        nodes.append(
            helper.make_node(
                "Conv",
                [x, f"w{i}", f"b{i}"],
                [f"c{i}"],
                kernel_shape=[k, k],
                strides=[stride, stride],
                pads=[pad] * 4,
                group=group,
            )
        )
        if not act:
            return f"c{i}"
        nodes.append(helper.make_node("Clip", [f"c{i}", "lo", "hi"], [f"a{i}"]))
        return f"a{i}"

    weights += [
        numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
        numpy_helper.from_array(np.array(6.0, np.float32), "hi"),
    ]
    x = conv("x", 3, 32, 3, 2, 1, True)
    cin = 32
    settings = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1)]
    settings += [(6, 160, 3, 2), (6, 320, 1, 1)]
    for t, c, n, s in settings:
        for j in range(n):
            stride = s if j == 0 else 1
            hidden = cin * t
            y = conv(x, cin, hidden, 1, 1, 1, True) if t != 1 else x
            y = conv(y, hidden, hidden, 3, stride, hidden, True)
            y = conv(y, hidden, c, 1, 1, 1, False)
            if stride == 1 and cin == c:
                count[0] += 1
                nodes.append(helper.make_node("Add", [x, y], [f"r{count[0]}"]))
                y = f"r{count[0]}"
            x, cin = y, c
    x = conv(x, cin, 1280, 1, 1, 1, True)
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["gap"]))
    nodes.append(helper.make_node("Flatten", ["gap"], ["flat"]))
    fc = (rng.standard_normal((1280, 1000)) * 0.03).astype(np.float32)
    weights.append(numpy_helper.from_array(fc, "fc"))
    weights.append(numpy_helper.from_array(np.zeros(1000, np.float32), "fcb"))
    nodes.append(helper.make_node("Gemm", ["flat", "fc", "fcb"], ["y"]))
    graph = helper.make_graph(
        nodes,
        "mobilenet_v2",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, width, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        weights,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


#: Small models: (builder, feeds), as users meet them.
SMALL: dict[str, tuple[Callable[[], onnx.ModelProto], Callable[[], dict]]] = {
    "cnn_b1": (small.cnn, lambda: {"x": _normal(1, 1, 28, 28)}),
    "cnn_b7": (small.cnn, lambda: {"x": _normal(7, 1, 28, 28)}),
    "mlp_b1": (small.mlp, lambda: {"x": _normal(1, 784)}),
    "mlp_b7": (small.mlp, lambda: {"x": _normal(7, 784)}),
    "attention_b2_s48": (small.attention, lambda: {"x": _normal(2, 48, 128)}),
    "gru_t32_b3": (small.gru, lambda: {"x": _normal(32, 3, 64)}),
    "mobilenet_v2_b1": (mobilenet_v2, lambda: {"x": _normal(1, 3, 224, 224)}),
    "mobilenet_v2_96_b3": (lambda: mobilenet_v2(96), lambda: {"x": _normal(3, 3, 96, 96)}),
}


def cpu_model() -> str:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def target() -> str:
    """The target numba compiles for, and the level the cpu EP's kernels chose from it."""
    import numba

    name = numba.config.CPU_NAME or "host"
    features = numba.config.CPU_FEATURES
    try:
        from nxrt_ep_cpu.jit import isa

        level = isa.level()
    except ImportError:
        level = "(no jit/isa.py)"
    shown = "host" if features is None else repr(features)
    coretype = os.environ.get("OPENBLAS_CORETYPE", "auto")
    return f"numba cpu {name}, features {shown}, OpenBLAS {coretype}; kernels: {level}"


def cpu_interleaved(runners: dict[str, Callable[[], Any]], args: argparse.Namespace) -> tuple:
    """:func:`bench_models.interleaved` timed by the calling thread's CPU time: with one
    thread each runtime computes on the calling thread, and its CPU time leaves out the
    time the scheduler gives other processes (shared cores); medians per runtime."""
    for _ in range(args.warmup):
        for run in runners.values():
            run()
    names = list(runners)
    times: dict[str, list[float]] = {name: [] for name in names}
    outputs: dict[str, Any] = {}
    for i in range(-(-args.repeat // args.block)):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            for _ in range(min(args.block, args.repeat - len(times[name]))):
                start = time.thread_time()
                outputs[name] = runners[name]()
                times[name].append(time.thread_time() - start)
    return {name: bench_models.summarise(times[name]) for name in names}, outputs


def bench_one(name: str, args: argparse.Namespace) -> dict[str, Any]:
    if name in SMALL:
        build, make_feeds = SMALL[name]
        source: Any = build().SerializeToString()
        feeds = make_feeds()
    else:
        source = light_model_path(name)
        feeds = None
    options = nxrt.SessionOptions()
    options.intra_op_num_threads = args.threads
    session = nxrt.InferenceSession(source, options, providers=["cpu"])
    if hasattr(session, "wait_for_compiled"):
        session.wait_for_compiled()
    ort_options = ort.SessionOptions()
    ort_options.intra_op_num_threads = args.threads
    ort_options.inter_op_num_threads = 1
    ort_options.log_severity_level = 3
    ort_session = ort.InferenceSession(
        source, sess_options=ort_options, providers=["CPUExecutionProvider"]
    )
    if feeds is None:
        feeds = dummy_feeds(ort_session)
    runners = {
        "nxrt": lambda: session.run(None, feeds),
        "ort": lambda: ort_session.run(None, feeds),
    }
    if args.cpu_time:
        stats, outputs = cpu_interleaved(runners, args)
    else:
        stats, outputs = bench_models.interleaved(runners, args)
    diff, ok = bench_models.compare(outputs["nxrt"], outputs["ort"])
    nx, ox = stats["nxrt"]["median_ms"], stats["ort"]["median_ms"]
    return {"model": name, "nxrt_ms": nx, "ort_ms": ox, "ratio": nx / ox, "diff": diff, "ok": ok}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=[*LIGHT, *SMALL])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=40, help="timed runs per runtime")
    parser.add_argument("--block", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--settle-ms", type=float, default=50.0)
    parser.add_argument("--avx2", action="store_true", help="force the AVX2 target")
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="time by the calling thread's CPU time (with --threads 1: robust on busy cores)",
    )
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    print(f"cpu: {cpu_model()}")
    print(f"target: {target()}")
    clock = "calling thread's CPU time" if args.cpu_time else "wall clock"
    print(f"threads: {args.threads}, {clock}; load average {os.getloadavg()[0]:.1f}")
    rows = []
    with threadpool_limits(limits=args.threads):
        for name in args.models:
            row = bench_one(name, args)
            rows.append(row)
            print(
                f"{name:22s} nxrt {row['nxrt_ms']:9.3f} ms  ort {row['ort_ms']:9.3f} ms  "
                f"ratio {row['ratio']:5.2f}  max diff {row['diff']:.1e}"
                + ("" if row["ok"] else "  MISMATCH"),
                flush=True,
            )
    print(f"load average {os.getloadavg()[0]:.1f}")
    light = [r["ratio"] for r in rows if r["model"] in LIGHT]
    smalls = [r["ratio"] for r in rows if r["model"] in SMALL]
    if light:
        geomean = math.exp(statistics.fmean(math.log(r) for r in light))
        print(f"light models: geomean {geomean:.2f}, worst {max(light):.2f}")
    if smalls:
        print(f"small models: median {statistics.median(smalls):.2f}, worst {max(smalls):.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu_model(), "target": target(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

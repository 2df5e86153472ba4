"""How close the cpu EP can come to ONNX Runtime while its GEMMs run on OpenBLAS.

For every model, one process times nxrt (cpu EP) and ONNX Runtime alternately, as
``bench_models.py`` does, with the EP's direct BLAS calls (``nxrt_ep_cpu.ops._blas.GEMM``,
which every GEMM-backed Conv variant calls) timed during nxrt's runs; timing them costs
well under a microsecond per call. It prints, per model, the median run of each runtime,
the median time per nxrt run spent inside those calls, and the *floor*: that GEMM time
over ORT's whole run, the ratio nxrt would reach if everything around its GEMMs (column
copies, bias, Relu, pooling, Python) took no time. Convolutions that go through
``np.matmul`` instead (depthwise, small groups) are not counted, so on shufflenet the floor
is an underestimate; the transformers' MatMuls all go through it, so they are left out.

Run::

    python benchmarks/bench_gemm_floor.py                      # the nine light models
    python benchmarks/bench_gemm_floor.py --models resnet50 squeezenet
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from threadpoolctl import threadpool_limits

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_models import interleaved, nxrt_session, ort_session, resolve  # noqa: E402

import nxrt_ep_cpu.ops._conv_gemm as conv_ops  # noqa: E402
from nxrt.tools.light_models import LIGHT_MODELS  # noqa: E402


class TimedGemm:
    """Wraps the EP's GEMM and adds up the seconds spent in it."""

    def __init__(self, gemm) -> None:
        self.gemm, self.seconds = gemm, 0.0

    def __call__(self, *args, **kwargs) -> bool:
        start = time.perf_counter()
        try:
            return self.gemm(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(LIGHT_MODELS), choices=LIGHT_MODELS)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=20, help="timed runs per runtime")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--block", type=int, default=5)
    parser.add_argument("--settle-ms", type=float, default=200.0)
    return parser.parse_args(argv)


def bench_model(name: str, args: argparse.Namespace) -> tuple[str, float, float, float]:
    """``(label, nxrt ms, ORT ms, median GEMM ms of an nxrt run)`` of one light model.

    The GEMM time is taken in the same interleaved runs that give the latencies, so both
    see the same BLAS thread count (the session picks it per run).
    """
    label, path, feeds_of = resolve(name, "")  # light models only: no folder needed
    session, reference = nxrt_session(path, ["cpu"], args.threads), ort_session(path, args.threads)
    feeds = feeds_of(reference)
    timed = TimedGemm(conv_ops.GEMM)
    per_run: list[float] = []

    def run_nxrt():
        timed.seconds = 0.0
        outputs = session.run(None, feeds)
        per_run.append(timed.seconds)
        return outputs

    conv_ops.GEMM = timed
    try:
        stats, _ = interleaved({"nxrt": run_nxrt, "ORT": lambda: reference.run(None, feeds)}, args)
    finally:
        conv_ops.GEMM = timed.gemm
    gemm_ms = statistics.median(per_run) * 1000.0
    return label, stats["nxrt"]["median_ms"], stats["ORT"]["median_ms"], gemm_ms


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if conv_ops.GEMM is None:
        raise SystemExit("numpy's BLAS is not reachable here: the cpu EP has no direct GEMM")
    rows = []
    with threadpool_limits(args.threads):
        for name in args.models:
            rows.append(bench_model(name, args))
            print(f"{name}: done", file=sys.stderr)
    print(f"threads={args.threads} repeat={args.repeat}\n")
    print(
        "| model | nxrt ms | ORT ms | nxrt/ORT | GEMM ms in nxrt | floor (GEMM / ORT) | rest ms |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, nxrt_ms, ort_ms, gemm_ms in rows:
        print(
            f"| {label} | {nxrt_ms:.2f} | {ort_ms:.2f} | **{nxrt_ms / ort_ms:.2f}** | "
            f"{gemm_ms:.2f} | {gemm_ms / ort_ms:.2f} | {nxrt_ms - gemm_ms:.2f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""nxrt's differential fuzzer: random graphs, run on nxrt and on onnxruntime, compared.

A case is a graph of 1 to 8 nodes over every op the EP and onnxruntime both
run (:func:`~nxrt_fuzz.generate.fuzzed_ops`), each attribute drawn from its
schema's valid range, dtypes from float16 to bool, shapes with 0 and 1
dims, NaN and infinities in the inputs. Each case runs in a worker process
with a timeout (:mod:`nxrt_fuzz.pool`), is classified
(:mod:`nxrt_fuzz.run`), and every failure is minimized and saved as a
regression case (``.npz``, :class:`~nxrt_fuzz.case.Case`)::

    python -m nxrt_fuzz --cases 10000 --seed 0             # the large run
    python -m nxrt_fuzz --cases 300 --seed 1 --ep mlx      # another EP, on the ops it claims
    python -m nxrt_fuzz --seed 0 --only 4711 --show        # one case, printed and classified

onnxruntime is the oracle, imported only here: this distribution
(``tools/nxrt-fuzz``) depends on it, the nxrt runtime does not.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from nxrt_fuzz.case import Case
from nxrt_fuzz.pool import DEFAULT_TIMEOUT, Report, fuzz
from nxrt_fuzz.run import FAILURES, KINDS, Outcome, evaluate

__all__ = ["Case", "FAILURES", "KINDS", "Outcome", "Report", "evaluate", "fuzz", "main"]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m nxrt_fuzz", description=__doc__.split("\n")[0])
    parser.add_argument("--cases", type=int, default=300, help="how many cases (default 300)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--start", type=int, default=0, help="index of the first case")
    parser.add_argument("--ep", default="cpu", help="the nxrt EP to test (default cpu)")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="hang detector, s")
    parser.add_argument("--out", default="fuzz-out", help="folder for minimized failures")
    parser.add_argument(
        "--minimize-each",
        type=int,
        default=1,
        help="failures minimized per signature (kind, op, error type)",
    )
    parser.add_argument("--only", type=int, nargs="*", help="run just these case indices")
    parser.add_argument("--ops", nargs="*", help="draw only these ops (default: every op)")
    parser.add_argument("--show", action="store_true", help="print each --only case first")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    if args.only and args.show:
        from nxrt_fuzz.generate import generate_case

        for index in args.only:
            case = generate_case(args.seed, index, args.ep, args.ops)
            print(f"case {args.seed}/{index}:\n{case.describe()}")
    indices = args.only or range(args.start, args.start + args.cases)
    started = time.monotonic()

    def progress(report: Report) -> None:
        if not args.quiet:
            rate = report.cases / max(time.monotonic() - started, 1e-9)
            print(
                f"\r{report.cases}/{len(indices)} cases, {rate:.1f}/s, "
                f"{len(report.findings)} failures",
                end="",
                file=sys.stderr,
                flush=True,
            )

    report = fuzz(
        args.seed,
        indices,
        ep=args.ep,
        workers=args.workers,
        timeout=args.timeout,
        out=args.out,
        minimize_each=args.minimize_each,
        progress=progress,
        ops=args.ops,
    )
    if not args.quiet:
        print(file=sys.stderr)
    for finding in report.findings:
        o = finding.outcome
        saved = f" -> {args.out}/{finding.saved}" if finding.saved else ""
        print(f"{finding.seed}/{finding.index}: {o.kind} [{o.op}] {o.detail[:300]}{saved}")
    for index, detail in report.fuzzer_errors[:5]:
        print(f"{args.seed}/{index}: fuzzer error: {detail}")
    print(report.summary())
    sys.exit(1 if any(report.counts.get(k) for k in FAILURES) else 0)

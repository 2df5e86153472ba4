"""Latency of nxrt's legacy_abi EP against onnxruntime run directly.

nxrt runs each model with ``providers=["legacy_abi", "cpu"]``, so whatever ORT
can run is claimed and executed by ORT sessions inside nxrt's plan; the ratio
shows what the bridge costs (target: at most 1.05). Models: the onnx package's
nine light models and a transformer encoder block. The measuring method is
``bench_light.py``'s (its helpers are imported from there): both runtimes in one
process, same thread count, timed in alternating blocks with a settle period
before each, since ORT's spinning worker threads would bias strict alternation.

Run::

    python benchmarks/bench_legacy_abi.py                  # all models, 2 threads
    python benchmarks/bench_legacy_abi.py --models resnet50 transformer --repeat 50
    python benchmarks/bench_legacy_abi.py --control        # plus ORT vs ORT, the noise floor
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import onnxruntime as ort
from threadpoolctl import threadpool_limits

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(os.path.dirname(HERE), "tests")]

from bench_light import markdown_table, max_abs_diff, summarise  # noqa: E402

import nxrt  # noqa: E402
from nxrt.tools.light_models import LIGHT_MODELS, dummy_feeds, light_model_path  # noqa: E402

TRANSFORMER = "transformer_block"


def load(name: str) -> tuple[str, object]:
    """A model name and what both runtimes accept for it (a path, or bytes)."""
    if name in ("transformer", TRANSFORMER):
        from test_legacy_abi_ep import transformer_block

        return TRANSFORMER, transformer_block().SerializeToString()
    path = light_model_path(name)
    return os.path.splitext(os.path.basename(path))[0], path


def bench_model(label: str, model: object, args: argparse.Namespace, control: bool = False) -> dict:
    """Time both runtimes on one model in alternating blocks.

    With ``control``, a second ORT session stands in for nxrt: its ratio is
    the noise floor of the machine and method.
    """
    ort_opts = ort.SessionOptions()
    ort_opts.intra_op_num_threads = args.threads
    ort_opts.inter_op_num_threads = 1
    ort_opts.log_severity_level = 3
    ort_sess = ort.InferenceSession(model, ort_opts, providers=["CPUExecutionProvider"])
    if control:
        nx_sess = ort.InferenceSession(model, ort_opts, providers=["CPUExecutionProvider"])
    else:
        nx_opts = nxrt.SessionOptions()
        nx_opts.intra_op_num_threads = args.threads
        nx_sess = nxrt.InferenceSession(model, nx_opts, providers=["legacy_abi", "cpu"])
    feeds = dummy_feeds(ort_sess)
    ort_feeds = {i.name: feeds[i.name] for i in ort_sess.get_inputs()}
    nx_feeds = {i.name: feeds[i.name] for i in nx_sess.get_inputs()}
    runners = {
        "nxrt": lambda: nx_sess.run(None, nx_feeds),
        "ort": lambda: ort_sess.run(None, ort_feeds),
    }
    for _ in range(args.warmup):
        for run in runners.values():
            run()
    times: dict[str, list[float]] = {"nxrt": [], "ort": []}
    outputs: dict[str, list] = {}
    for i in range(-(-args.repeat // args.block)):
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
    result = {"model": label, "nxrt": summarise(times["nxrt"]), "ort": summarise(times["ort"])}
    result["ratio"] = result["nxrt"]["median_ms"] / result["ort"]["median_ms"]
    result["max_abs_diff"] = max_abs_diff(outputs["nxrt"], outputs["ort"])
    if not control:
        result["claims"] = len(nx_sess.get_partition().claims)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=[*LIGHT_MODELS, "transformer"])
    parser.add_argument("--threads", type=int, default=2, help="threads for both runtimes")
    parser.add_argument("--repeat", type=int, default=30, help="timed runs per runtime")
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs per runtime")
    parser.add_argument("--block", type=int, default=5, help="timed runs per runtime in a row")
    parser.add_argument("--settle-ms", type=float, default=50.0, help="untimed running per block")
    parser.add_argument(
        "--control", action="store_true", help="also time ORT against a second ORT session"
    )
    args = parser.parse_args(argv)
    results, controls = [], []
    with threadpool_limits(limits=args.threads):
        for name in args.models:
            label, model = load(name)
            results.append(bench_model(label, model, args))
            if args.control:
                controls.append(bench_model(label, model, args, control=True))
            print(f"{label}: done", file=sys.stderr)
    print(
        f"providers=['legacy_abi', 'cpu'] vs onnxruntime {ort.__version__} CPU; "
        f"threads={args.threads} repeat={args.repeat} block={args.block} "
        f"settle_ms={args.settle_ms:g}\n"
    )
    print(markdown_table(results))
    print("\nclaims per model: " + ", ".join(f"{r['model']}={r['claims']}" for r in results))
    worst = max(r["ratio"] for r in results)
    print(f"worst ratio {worst:.3f} (target <= 1.05)")
    if controls:
        print("\ncontrol, ORT against a second ORT session (the noise floor):\n")
        print(markdown_table(controls))
    return 0


if __name__ == "__main__":
    sys.exit(main())

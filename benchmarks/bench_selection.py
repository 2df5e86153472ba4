"""Default EP selection against every explicit choice, in one run.

For each model, one process creates the default session (``providers=None``,
every installed EP, the measuring policy, a fresh selection cache in a
temporary folder) twice — the second decides from the cache — and one session
per explicit choice (each installed EP with ``cpu``, and ``cpu`` alone). All
sessions are then timed in interleaved blocks (the order rotates each round;
before each block the process sleeps ``--settle-ms``, so the previous runtime's
spinning threads go idle, and runs once untimed),
and the table gives each median, the default's ratio to the fastest explicit
choice, what the default chose, and both creation times of the default.

Models: the light models of the ``onnx`` package, ``bert_base`` and ``gpt2_step``
(``transformer_models.py``), and the models of ``torch_models.py`` (torchvision's
architectures, transformers' BERT-base, GPT-2 and a Llama-style decoder, and small models
of our own: an MLP, a GRU, a small BERT, a U-Net; exported with seeded random weights,
they need torch, torchvision and transformers), all built into a temporary folder.

Run::

    python benchmarks/bench_selection.py
    python benchmarks/bench_selection.py --models light_resnet50 bert_base --rounds 5
    python benchmarks/bench_selection.py --models resnet50 efficientnet_b0 mobilenet_v2
    python benchmarks/bench_selection.py --models llama_small unet_small mlp --model-dir /tmp/m
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import nxrt
from nxrt.tools.light_models import LIGHT_MODELS, dummy_feeds, light_model_path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_models  # noqa: E402  (exports the real architectures and small models)
import transformer_models  # noqa: E402

DEFAULT_MODELS = [*(f"light_{name}" for name in LIGHT_MODELS), "bert_base", "gpt2_step"]


def resolve(name: str, folder: str) -> tuple[str, Callable[[Any], dict[str, np.ndarray]]]:
    if name in torch_models.ALL:  # torchvision / transformers / torch, seeded random weights
        path, _ = torch_models.build(name, folder)
        feeds = torch_models.feeds_for(name)
        return path, lambda session: feeds
    if name in transformer_models.MODELS:
        feeds = transformer_models.MODELS[name][1]()
        return transformer_models.write(name, folder), lambda session: feeds
    return light_model_path(name), dummy_feeds


def session(path: str, providers: list[str] | None, threads: int) -> nxrt.InferenceSession:
    options = nxrt.SessionOptions()
    options.intra_op_num_threads = threads
    return nxrt.InferenceSession(path, options, providers=providers)


def bench(label: str, path: str, feeds_of: Callable, args: argparse.Namespace) -> dict:
    start = time.perf_counter()
    default = session(path, None, args.threads)
    first_creation = time.perf_counter() - start
    start = time.perf_counter()
    cached = session(path, None, args.threads)
    second_creation = time.perf_counter() - start
    report = cached.get_partition().selection
    runners: dict[str, Any] = {"default": default}
    for ep in nxrt.get_available_providers():  # ONNX Runtime's names: CPUExecutionProvider
        providers = ["cpu"] if ep in ("cpu", "CPUExecutionProvider") else [ep, "cpu"]
        try:
            runners[",".join(providers)] = session(path, providers, args.threads)
        except nxrt.errors.NxrtError as exc:
            print(f"  {label}: {providers} failed: {exc}", file=sys.stderr)
    feeds = feeds_of(default)
    for s in runners.values():
        s.run(None, feeds)  # warm-up
    times: dict[str, list[float]] = {name: [] for name in runners}
    names = list(runners)
    for round_ in range(args.rounds):
        order = names[round_ % len(names) :] + names[: round_ % len(names)]
        for name in order:
            time.sleep(args.settle_ms / 1000)  # the last runtime's spinning threads go idle
            runners[name].run(None, feeds)
            for _ in range(args.block):
                t0 = time.perf_counter()
                runners[name].run(None, feeds)
                times[name].append((time.perf_counter() - t0) * 1000)
    medians = {name: statistics.median(t) for name, t in times.items()}
    explicit = {k: v for k, v in medians.items() if k != "default"}
    best = min(explicit, key=explicit.get)
    return {
        "model": label,
        "medians": medians,
        "best": best,
        "ratio": medians["default"] / explicit[best],
        "choice": ",".join(default.get_providers()),
        "cached": report.from_cache,
        "creation": (first_creation, second_creation),
    }


def table(results: list[dict]) -> str:
    columns = sorted({k for r in results for k in r["medians"] if k != "default"})
    head = ["model", "default ms", *[f"{c} ms" for c in columns]]
    head += ["best", "default/best", "chose", "create 1st s", "create 2nd s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        cells = [r["model"], f"{r['medians']['default']:.3f}"]
        cells += [f"{r['medians'][c]:.3f}" if c in r["medians"] else "-" for c in columns]
        cells += [r["best"], f"{r['ratio']:.3f}", r["choice"]]
        cells += [
            f"{r['creation'][0]:.2f}",
            f"{r['creation'][1]:.2f}" + ("" if r["cached"] else "!"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    ratios = [r["ratio"] for r in results]
    lines.append(
        f"\nworst default/best {max(ratios):.3f}; geometric mean "
        f"{float(np.exp(np.mean(np.log(ratios)))):.3f}; '!' marks a second session "
        "that did not decide from the cache"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=DEFAULT_MODELS)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--block", type=int, default=3)
    parser.add_argument("--settle-ms", type=float, default=200.0)
    parser.add_argument("--model-dir", help="where exported models go (default: a temp dir)")
    args = parser.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory() as folder:
        os.environ["NXRT_CACHE_DIR"] = os.path.join(folder, "cache")  # always a fresh cache
        for name in args.models:
            path, feeds_of = resolve(name, args.model_dir or folder)
            results.append(bench(name, path, feeds_of, args))
            print(f"  {name}: done", file=sys.stderr)
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

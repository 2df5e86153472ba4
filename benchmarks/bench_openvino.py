"""The openvino EP at f32 and bf16 against ONNX Runtime's CPU EP and nxrt's cpu EP.

One process, one model at a time: ONNX Runtime (CPUExecutionProvider), nxrt on its cpu
EP, and nxrt on the openvino EP (``providers=["openvino", "cpu"]``) at f32 (the default)
and at bf16, timed in alternating blocks (``bench_models.interleaved``: each block is
preceded by untimed runs so the other runtimes' spinning threads have gone idle), all
with ``--threads`` intra-op threads. For each it prints the median latency, its ratio to
ORT's, the session-creation time and the largest absolute difference from ORT's outputs
(with whether all are within ``rtol=1e-3, atol=1e-4``).

Models: the nine light models of the ``onnx`` package, and real architectures exported
with ``torch.onnx.export`` (opset 17) from seeded random weights into ``--model-dir``
(a temporary folder by default, never the repository) by ``torch_models.py``:
torchvision's ResNet-50, EfficientNet-B0, MobileNetV2, ViT-B/16 and ConvNeXt-T at batch 1
and 224x224, and BERT-base (transformers' ``BertModel``, sequence 128; where transformers
is missing, ``transformer_models.bert_encoder``, the same shapes written with ``onnx.helper``).

Summary lines: the geometric mean of the f32 ratios over the real architectures (target:
at most 0.95, none above 1.25), and of the bf16 ratios over the transformers (ViT-B/16,
BERT-base; target: at most 0.6), with bf16's error.

Run::

    python benchmarks/bench_openvino.py                      # everything, 2 threads
    python benchmarks/bench_openvino.py --models resnet50 bert_base --repeat 10
"""

from __future__ import annotations

import argparse
import math
import os
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
import bench_models  # noqa: E402
import torch_models  # noqa: E402
from torch_models import BERT, build, calibrated, import_torchvision  # noqa: E402, F401

#: torchvision constructor names of the vision architectures.
VISION = ("resnet50", "efficientnet_b0", "mobilenet_v2", "vit_b_16", "convnext_tiny")
REAL = (*VISION, BERT)
TRANSFORMERS = ("vit_b_16", BERT)
#: The onnx package's light models, by file name (``light_resnet50``: not torchvision's).
LIGHT = tuple(f"light_{name}" for name in LIGHT_MODELS)
ALL = (*LIGHT, *REAL)
#: column -> nxrt providers (ORT is the column "ort").
COLUMNS: dict[str, list[Any]] = {
    "cpu": ["cpu"],
    "ov f32": ["openvino", "cpu"],
    "ov bf16": [("openvino", {"precision": "bf16"}), "cpu"],
}


# -- models -------------------------------------------------------------------------------------


def feeds_for(name: str, session: Any) -> dict[str, np.ndarray]:
    if name in REAL:
        return torch_models.feeds_for(name)
    return dummy_feeds(session)


# -- one model ----------------------------------------------------------------------------------


def timed(make: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    made = make()
    return made, time.perf_counter() - start


def bench(name: str, args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    if name in REAL:
        path, how = build(name, args.model_dir)
    elif name in LIGHT:
        path, how = light_model_path(name), "onnx light model"
    else:
        raise SystemExit(f"unknown model {name!r}; known: {', '.join(ALL)}")
    result: dict[str, Any] = {"model": name, "source": how, "create_s": {}, "errors": {}}
    ort_session, result["create_s"]["ort"] = timed(
        lambda: bench_models.ort_session(path, args.threads)
    )
    feeds = feeds_for(name, ort_session)
    runners: dict[str, Callable[[], Any]] = {}
    ort_feeds = {i.name: feeds[i.name] for i in ort_session.get_inputs()}
    runners["ort"] = lambda: ort_session.run(None, ort_feeds)
    for column, providers in COLUMNS.items():
        if column not in args.columns:
            continue
        try:
            session, seconds = timed(
                lambda p=providers: bench_models.nxrt_session(path, p, args.threads)
            )
            own = {i.name: feeds[i.name] for i in session.get_inputs()}
            session.run(None, own)
        except Exception as exc:  # a benchmark reports a failing runtime and goes on
            result["errors"][column] = f"{type(exc).__name__}: {exc}"[:300]
            continue
        result["create_s"][column] = seconds
        runners[column] = lambda s=session, f=own: s.run(None, f)
    stats, outputs = bench_models.interleaved(runners, args)
    print(f"{name}: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    result["ms"] = {column: s["median_ms"] for column, s in stats.items()}
    result["ratio"] = {c: ms / result["ms"]["ort"] for c, ms in result["ms"].items()}
    result["diff"] = {
        c: bench_models.compare(outputs[c], outputs["ort"]) for c in runners if c != "ort"
    }
    result["scale"] = max(float(np.abs(o).max()) for o in outputs["ort"] if np.size(o))
    return result


# -- report -------------------------------------------------------------------------------------


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def table(results: list[dict[str, Any]], columns: list[str]) -> str:
    head = ["model", "ORT ms", "max abs ORT output"]
    for column in columns:
        head += [f"{column} ms", f"{column}/ORT"]
    head += ["create s: ORT / " + " / ".join(columns)]
    head += [f"max abs diff {c} (ok)" for c in columns]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for r in results:
        row = [r["model"], f"{r['ms']['ort']:.2f}", f"{r['scale']:.1e}"]
        for column in columns:
            if column in r["ms"]:
                row += [f"{r['ms'][column]:.2f}", f"**{r['ratio'][column]:.2f}**"]
            else:
                row += ["error", ""]
        create = r["create_s"]
        row.append(
            " / ".join(f"{create[c]:.2f}" if c in create else "-" for c in ["ort", *columns])
        )
        for column in columns:
            if column in r["diff"]:
                diff, ok = r["diff"][column]
                row.append(f"{diff:.1e} ({'yes' if ok else 'NO'})")
            else:
                row.append("-")
        lines.append("| " + " | ".join(row) + " |")
    for r in results:
        for column, error in r["errors"].items():
            lines.append(f"\n{r['model']} [{column}]: {error}")
    return "\n".join(lines)


def summary(results: list[dict[str, Any]]) -> str:
    lines = []
    real = [r for r in results if r["model"] in REAL and "ov f32" in r["ratio"]]
    if real:
        ratios = [r["ratio"]["ov f32"] for r in real]
        within = all(r["diff"]["ov f32"][1] for r in real)
        lines.append(
            f"ov f32 / ORT over {len(real)} real architectures: geomean {geomean(ratios):.3f}, "
            f"worst {max(ratios):.3f} ({real[ratios.index(max(ratios))]['model']}); "
            f"all outputs within rtol 1e-3 / atol 1e-4: {'yes' if within else 'NO'} "
            "(target: geomean <= 0.95, none above 1.25)"
        )
    transformers = [r for r in results if r["model"] in TRANSFORMERS and "ov bf16" in r["ratio"]]
    if transformers:
        ratios = [r["ratio"]["ov bf16"] for r in transformers]
        errors = ", ".join(f"{r['model']} {r['diff']['ov bf16'][0]:.1e}" for r in transformers)
        lines.append(
            f"ov bf16 / ORT over the transformers: geomean {geomean(ratios):.3f} "
            f"(target: <= 0.6); max abs error vs ORT: {errors}"
        )
    for r in results:
        if r["source"] not in ("torchvision", "onnx light model"):
            lines.append(f"{r['model']}: built with {r['source']}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["all"], help=f"'all' or of: {ALL}")
    parser.add_argument(
        "--columns", default=",".join(COLUMNS), help=f"nxrt columns, of {list(COLUMNS)}"
    )
    parser.add_argument("--threads", type=int, default=2, help="threads for every runtime")
    parser.add_argument("--repeat", type=int, default=10, help="timed runs per runtime")
    parser.add_argument("--warmup", type=int, default=2, help="untimed runs per runtime")
    parser.add_argument("--block", type=int, default=5, help="timed runs per runtime in a row")
    parser.add_argument("--settle-ms", type=float, default=100.0, help="untimed run-in per block")
    parser.add_argument("--model-dir", help="where exported models go (default: a temp dir)")
    args = parser.parse_args(argv)
    args.models = list(ALL) if "all" in args.models else args.models
    args.columns = [c.strip() for c in args.columns.split(",") if c.strip()]
    args.model_dir = args.model_dir or os.path.join(tempfile.gettempdir(), "nxrt-bench-openvino")
    return args


def main(argv: list[str] | None = None) -> int:
    import openvino as ov

    args = parse_args(argv)
    with threadpool_limits(limits=args.threads):
        results = [bench(name, args) for name in args.models]
    columns = [c for c in COLUMNS if c in args.columns]
    print(
        f"threads={args.threads} repeat={args.repeat} warmup={args.warmup} block={args.block} "
        f"settle_ms={args.settle_ms:g} onnxruntime={ort.__version__} "
        f"openvino={ov.get_version().split('-')[0]} nxrt={getattr(nxrt, '__version__', '?')}\n"
    )
    print(table(results, columns))
    print()
    print(summary(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

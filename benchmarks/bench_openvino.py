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
(a temporary folder by default, never the repository): torchvision's ResNet-50,
EfficientNet-B0, MobileNetV2, ViT-B/16 and ConvNeXt-T at batch 1 and 224x224, and
BERT-base (transformers' ``BertModel``, sequence 128; where transformers is missing,
``transformer_models.bert_encoder``, the same shapes written with ``onnx.helper``).

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
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import onnxruntime as ort
from threadpoolctl import threadpool_limits

import nxrt
from nxrt.testing import LIGHT_MODELS, dummy_feeds, light_model_path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_models  # noqa: E402
import transformer_models  # noqa: E402

#: torchvision constructor names of the vision architectures.
VISION = ("resnet50", "efficientnet_b0", "mobilenet_v2", "vit_b_16", "convnext_tiny")
BERT = "bert_base"
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

_torchvision_schemas: Any = None  # the torch.library that declares them, kept alive


def import_torchvision() -> Any:
    """torchvision, importable beside torch's CPU build.

    The PyPI wheel of torchvision is built against torch's CUDA build, so next to the
    CPU build its C++ extension does not load, and ``import torchvision`` then fails
    when it registers Python code for ``torchvision::nms``, an operator the extension
    would have declared. The classification models use no torchvision operator, so
    declaring the two the import looks for (without kernels) is all they need.
    """
    global _torchvision_schemas
    import importlib.util

    import torch

    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        raise SystemExit("torchvision is not installed: pip install torchvision")
    try:
        torch.ops.load_library(os.path.join(os.path.dirname(spec.origin), "_C.so"))
    except (OSError, RuntimeError):
        if _torchvision_schemas is None:
            schemas = torch.library.Library("torchvision", "DEF")
            for op in ("nms", "qnms"):
                schemas.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
            _torchvision_schemas = schemas
    import torchvision

    return torchvision


def _export(module: Any, args: tuple, path: str, inputs: list[str], outputs: list[str]) -> None:
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer notes
        torch.onnx.export(
            module,
            args,
            path + ".tmp",
            input_names=inputs,
            output_names=outputs,
            opset_version=17,
            dynamo=False,
        )
    os.replace(path + ".tmp", path)


def build(name: str, folder: str) -> tuple[str, str]:
    """Export ``name`` into ``folder`` (once: an existing file is reused); (path, how)."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{name}.onnx")
    if name == BERT:
        return _build_bert(path)
    if not os.path.exists(path):
        import torch

        torchvision = import_torchvision()
        torch.manual_seed(0)
        model = calibrated(getattr(torchvision.models, name)(weights=None))
        _export(model, (torch.randn(1, 3, 224, 224),), path, ["image"], ["logits"])
    return path, "torchvision"


def calibrated(model: Any) -> Any:
    """A freshly initialised torchvision model made to behave like a trained one, in eval mode.

    At initialisation BatchNorm's running statistics are 0 and 1, which do not match
    the activations, so those shrink layer by layer (EfficientNet's logits come out
    near 1e-17) and any error looks small; and ViT's head starts at zero, so its
    logits are exactly 0. Statistics gathered over a few random batches and a random
    head give logits of order one, where a difference of 1e-4 means something.
    """
    import torch

    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear) and not module.weight.any():
                torch.nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                module.momentum = None  # running statistics: the plain mean over the batches
        model.train()
        for _ in range(4):
            model(torch.randn(8, 3, 224, 224))
    return model.eval()


def _build_bert(path: str) -> tuple[str, str]:
    try:
        import_torchvision()  # transformers imports torchvision when it is installed
        import torch
        from transformers import BertConfig, BertModel
    except ImportError:
        fallback = transformer_models.write(BERT, os.path.dirname(path))
        return fallback, "onnx.helper (transformers is not installed)"
    if not os.path.exists(path):

        class Encoder(torch.nn.Module):
            """BertModel called by keyword, its two outputs as a tuple (what the exporter
            traces; the model's own forward takes more positional arguments)."""

            def __init__(self) -> None:
                super().__init__()
                self.bert = BertModel(BertConfig(attn_implementation="eager"))  # BERT-base

            def forward(self, input_ids: Any, attention_mask: Any) -> tuple[Any, Any]:
                out = self.bert(input_ids=input_ids, attention_mask=attention_mask)
                return out.last_hidden_state, out.pooler_output

        torch.manual_seed(0)
        model = Encoder().eval()
        feeds = transformer_models.bert_feeds()
        args = tuple(torch.from_numpy(feeds[k]) for k in ("input_ids", "attention_mask"))
        outputs = ["last_hidden_state", "pooler_output"]
        _export(model, args, path, ["input_ids", "attention_mask"], outputs)
    return path, "transformers"


def feeds_for(name: str, session: Any) -> dict[str, np.ndarray]:
    if name == BERT:
        return transformer_models.bert_feeds()
    if name in VISION:
        rng = np.random.default_rng(0)
        return {"image": rng.standard_normal((1, 3, 224, 224)).astype(np.float32)}
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

"""Real architectures and small models exported with ``torch.onnx.export``, seeded random weights.

Shared by the benchmarks that run exported models (``bench_cpu.py``, ``bench_openvino.py``,
``bench_selection.py``). Every model is exported at opset 17 with the TorchScript exporter at a
fixed batch (``{name}.onnx`` at batch 1, ``{name}_b{batch}.onnx`` otherwise) into a folder given
by the caller, a temporary one, never the repository; an existing file is reused.

* Vision (torchvision, 224x224): ResNet-50, MobileNetV2, MobileNetV3-Small, EfficientNet-B0,
  ConvNeXt-T, ViT-B/16, their BatchNorm statistics calibrated on random batches
  (:func:`calibrated`) so activations keep the scale of a trained model's.
* Transformers (transformers): BERT-base (sequence 128, outputs ``last_hidden_state`` and
  ``pooler_output``), GPT-2 small with its language-model head (sequence 64, no cache).
* Small models of our own: ``mlp`` (784-512-256-10, ReLU), ``gru`` (one GRU layer, 64 -> 128,
  32 steps, and a linear head on the last step), ``bert_small`` (BERT with 2 layers, hidden 128,
  2 heads: the shape of BERT-tiny, sequence 128), ``llama_small`` (transformers'
  ``LlamaForCausalLM``: 4 layers, hidden 512, 8 heads with 2 key/value heads, SwiGLU 1376,
  RMSNorm, rotary positions; sequence 64, no cache) and ``unet_small`` (a two-level U-Net on
  1x3x128x128: Conv-BatchNorm-ReLU pairs, MaxPool down, ConvTranspose up, skip Concats).

Needs torch, torchvision and transformers; they are imported only when a model is built, so
reading feeds (:func:`feeds_for`) does not need them. Build from the command line::

    python benchmarks/torch_models.py --out /tmp/nxrt-bench-cpu --models mlp resnet50 --batches 1 16
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import transformer_models  # noqa: E402

#: torchvision constructor names of the vision architectures.
VISION = (
    "resnet50",
    "mobilenet_v2",
    "mobilenet_v3_small",
    "efficientnet_b0",
    "convnext_tiny",
    "vit_b_16",
)
BERT = "bert_base"
GPT2 = "gpt2"
REAL = (*VISION, BERT, GPT2)
SMALL = ("mlp", "gru", "bert_small", "llama_small", "unet_small")
ALL = (*REAL, *SMALL)
BERT_SEQ, GPT2_SEQ = 128, 64
MLP_SIZES = (784, 512, 256, 10)
GRU_STEPS, GRU_INPUT, GRU_HIDDEN = 32, 64, 128
LLAMA_SEQ, LLAMA_VOCAB = 64, 32000
UNET_SIZE, UNET_WIDTH = 128, 32
#: What each model needs beyond torch (checked by :func:`missing_packages`).
_NEEDS = {**dict.fromkeys(VISION, "torchvision"), BERT: "transformers", GPT2: "transformers"}
_NEEDS["bert_small"] = _NEEDS["llama_small"] = "transformers"


def missing_packages(names: list[str] | tuple[str, ...] = ALL) -> list[str]:
    """The packages that building ``names`` needs and that are not installed."""
    import importlib.util

    needed = {"torch", *(_NEEDS[n] for n in names if n in _NEEDS)}
    return sorted(p for p in needed if importlib.util.find_spec(p) is None)


def model_path(name: str, folder: str, batch: int = 1) -> str:
    return os.path.join(folder, f"{name}.onnx" if batch == 1 else f"{name}_b{batch}.onnx")


_torchvision_schemas: Any = None  # the torch.library that declares them, kept alive


def import_torchvision() -> Any:
    """torchvision, importable beside torch's CPU build.

    The PyPI wheel of torchvision is built against torch's CUDA build, so next to the
    CPU build its C++ extension does not load, and ``import torchvision`` then fails
    when it registers Python code for ``torchvision::nms``, an operator the extension
    would have declared. So the two the import looks for are declared here, and ``nms``
    (all detection post-processing calls, and what the exporter writes as
    NonMaxSuppression) gets a CPU kernel in Python, :func:`_nms_cpu`.
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
            schemas.impl("nms", _nms_cpu, "CPU")
            _torchvision_schemas = schemas
    import torchvision
    import torchvision.extension

    if _torchvision_schemas is not None:  # torchvision.ops.nms asks first whether _C loaded
        torchvision.extension._has_ops = _has_nms
    return torchvision


def _has_nms() -> bool:
    """Stands in for ``torchvision.extension._has_ops``: ``nms`` has a kernel now."""
    return True


def _nms_cpu(boxes: Any, scores: Any, iou_threshold: float) -> Any:
    """torchvision's CPU ``nms`` in torch: boxes by descending score (the first of equal
    scores first, a stable sort), each kept box dropping the later ones whose IoU with it
    exceeds ``iou_threshold``; the kept indices, best first."""
    import torch

    x1, y1, x2, y2 = boxes.detach().unbind(1)
    areas = (x2 - x1) * (y2 - y1)
    order = torch.sort(scores.detach(), descending=True, stable=True).indices
    removed = torch.zeros(boxes.shape[0], dtype=torch.bool)
    keep = []
    for i in order.tolist():
        if removed[i]:
            continue
        keep.append(i)
        w = (torch.minimum(x2[i], x2) - torch.maximum(x1[i], x1)).clamp(min=0)
        h = (torch.minimum(y2[i], y2) - torch.maximum(y1[i], y1)).clamp(min=0)
        inter = w * h
        removed |= inter / (areas[i] + areas - inter) > iou_threshold
    return torch.tensor(keep, dtype=torch.int64)


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


def build(name: str, folder: str, batch: int = 1) -> tuple[str, str]:
    """Export ``name`` at ``batch`` into ``folder``, once (a file there is reused): (path, how)."""
    os.makedirs(folder, exist_ok=True)
    path = model_path(name, folder, batch)
    if name == BERT:
        return _build_bert(path, batch)
    if name not in ALL:
        raise SystemExit(f"unknown model {name!r}; known: {', '.join(ALL)}")
    how = "torchvision" if name in VISION else "transformers" if name in _NEEDS else "torch"
    if os.path.exists(path):
        return path, how
    import torch

    feeds = feeds_for(name, batch)
    args = tuple(torch.from_numpy(v) for v in feeds.values())
    torch.manual_seed(0)
    if name in VISION:
        model = calibrated(getattr(import_torchvision().models, name)(weights=None))
        _export(model, args, path, ["image"], ["logits"])
    elif name == GPT2:
        _export(_gpt2().eval(), args, path, ["input_ids"], ["logits"])
    elif name == "bert_small":
        model = _bert_encoder(hidden_size=128, num_hidden_layers=2, num_attention_heads=2)
        _export(model.eval(), args, path, list(feeds), ["last_hidden_state", "pooler_output"])
    elif name == "llama_small":
        _export(_llama().eval(), args, path, ["input_ids"], ["logits"])
    elif name == "unet_small":
        _export(calibrated(_unet(), (8, 3, UNET_SIZE, UNET_SIZE)), args, path, ["image"], ["mask"])
    elif name == "mlp":
        _export(_mlp().eval(), args, path, ["x"], ["y"])
    else:
        _export(_gru().eval(), args, path, ["x"], ["y"])
    return path, how


def calibrated(model: Any, shape: tuple[int, ...] = (8, 3, 224, 224)) -> Any:
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
            model(torch.randn(*shape))
    return model.eval()


def _bert_encoder(**config: Any) -> Any:
    """transformers' ``BertModel`` (BERT-base unless ``config`` says otherwise), called by
    keyword, its two outputs as a tuple (what the exporter traces; the model's own forward
    takes more positional arguments)."""
    import_torchvision()  # transformers imports torchvision when it is installed
    import torch
    from transformers import BertConfig, BertModel

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = BertModel(BertConfig(attn_implementation="eager", **config))

        def forward(self, input_ids: Any, attention_mask: Any) -> tuple[Any, Any]:
            out = self.bert(input_ids=input_ids, attention_mask=attention_mask)
            return out.last_hidden_state, out.pooler_output

    return Encoder()


def _build_bert(path: str, batch: int) -> tuple[str, str]:
    try:
        import_torchvision()
        import torch
        import transformers  # noqa: F401
    except ImportError as exc:
        if batch != 1:
            raise SystemExit("BERT-base at batch > 1 needs transformers: pip install it") from exc
        fallback = transformer_models.write(BERT, os.path.dirname(path))
        return fallback, "onnx.helper (transformers is not installed)"
    if not os.path.exists(path):
        torch.manual_seed(0)
        model = _bert_encoder().eval()
        feeds = feeds_for(BERT, batch)
        args = tuple(torch.from_numpy(feeds[k]) for k in ("input_ids", "attention_mask"))
        outputs = ["last_hidden_state", "pooler_output"]
        _export(model, args, path, ["input_ids", "attention_mask"], outputs)
    return path, "transformers"


def _gpt2() -> Any:
    """GPT-2 small with its language-model head: ``input_ids -> logits``, no key/value cache."""
    import_torchvision()
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    class LanguageModel(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            config = GPT2Config(attn_implementation="eager", use_cache=False)
            self.gpt2 = GPT2LMHeadModel(config)

        def forward(self, input_ids: Any) -> Any:
            # an explicit mask: without one, transformers looks for packed sequences with
            # torch.diff, which the exporter cannot write
            mask = torch.ones_like(input_ids)
            return self.gpt2(input_ids=input_ids, attention_mask=mask, use_cache=False).logits

    return LanguageModel()


def _llama() -> Any:
    """A Llama-style decoder with its language-model head: ``input_ids -> logits``."""
    import_torchvision()
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    class Decoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            config = LlamaConfig(
                vocab_size=LLAMA_VOCAB,
                hidden_size=512,
                intermediate_size=1376,
                num_hidden_layers=4,
                num_attention_heads=8,
                num_key_value_heads=2,
                max_position_embeddings=256,
                attn_implementation="eager",
                use_cache=False,
            )
            self.llama = LlamaForCausalLM(config)

        def forward(self, input_ids: Any) -> Any:
            mask = torch.ones_like(input_ids)  # explicit, as for GPT-2
            return self.llama(input_ids=input_ids, attention_mask=mask, use_cache=False).logits

    return Decoder()


def _unet() -> Any:
    """A two-level U-Net: what segmentation and diffusion models are built from."""
    import torch
    from torch import nn

    def block(n_in: int, n_out: int) -> Any:
        return nn.Sequential(
            nn.Conv2d(n_in, n_out, 3, padding=1),
            nn.BatchNorm2d(n_out),
            nn.ReLU(),
            nn.Conv2d(n_out, n_out, 3, padding=1),
            nn.BatchNorm2d(n_out),
            nn.ReLU(),
        )

    w = UNET_WIDTH

    class UNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.down1, self.down2, self.bottom = block(3, w), block(w, 2 * w), block(2 * w, 4 * w)
            self.pool = nn.MaxPool2d(2)
            self.up2 = nn.ConvTranspose2d(4 * w, 2 * w, 2, stride=2)
            self.dec2 = block(4 * w, 2 * w)
            self.up1 = nn.ConvTranspose2d(2 * w, w, 2, stride=2)
            self.dec1 = block(2 * w, w)
            self.head = nn.Conv2d(w, 1, 1)

        def forward(self, x: Any) -> Any:
            d1 = self.down1(x)
            d2 = self.down2(self.pool(d1))
            b = self.bottom(self.pool(d2))
            u2 = self.dec2(torch.cat([self.up2(b), d2], 1))
            u1 = self.dec1(torch.cat([self.up1(u2), d1], 1))
            return self.head(u1)

    return UNet()


def _mlp() -> Any:
    import torch

    layers: list[Any] = []
    for n_in, n_out in zip(MLP_SIZES, MLP_SIZES[1:], strict=False):
        layers += [torch.nn.Linear(n_in, n_out), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def _gru() -> Any:
    import torch

    class Recurrent(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gru = torch.nn.GRU(GRU_INPUT, GRU_HIDDEN, batch_first=True)
            self.head = torch.nn.Linear(GRU_HIDDEN, 10)

        def forward(self, x: Any) -> Any:
            out, _ = self.gru(x)
            return self.head(out[:, -1])

    return Recurrent()


def feeds_for(name: str, batch: int = 1) -> dict[str, np.ndarray]:
    """Seeded inputs of model ``name`` at ``batch`` (the first row does not depend on it)."""
    rng = np.random.default_rng(0)
    if name in VISION:
        return {"image": rng.standard_normal((batch, 3, 224, 224)).astype(np.float32)}
    if name in (BERT, "bert_small"):
        return transformer_models.bert_feeds(BERT_SEQ, batch=batch)
    if name == GPT2:
        return {"input_ids": rng.integers(0, 50257, (batch, GPT2_SEQ), dtype=np.int64)}
    if name == "llama_small":
        return {"input_ids": rng.integers(0, LLAMA_VOCAB, (batch, LLAMA_SEQ), dtype=np.int64)}
    if name == "unet_small":
        return {"image": rng.standard_normal((batch, 3, UNET_SIZE, UNET_SIZE)).astype(np.float32)}
    if name == "mlp":
        return {"x": rng.standard_normal((batch, MLP_SIZES[0])).astype(np.float32)}
    if name == "gru":
        return {"x": rng.standard_normal((batch, GRU_STEPS, GRU_INPUT)).astype(np.float32)}
    raise SystemExit(f"unknown model {name!r}; known: {', '.join(ALL)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder to write the models into")
    parser.add_argument("--models", nargs="+", default=list(ALL), help=f"of: {list(ALL)}")
    parser.add_argument("--batches", nargs="+", type=int, default=[1])
    args = parser.parse_args(argv)
    missing = missing_packages(args.models)
    if missing:
        raise SystemExit(f"building these models needs {', '.join(missing)}: pip install them")
    for name in args.models:
        for batch in args.batches:
            path, how = build(name, args.out, batch)
            print(f"{name}\t{batch}\t{path}\t{how}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

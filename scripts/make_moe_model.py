"""Generate a mixture-of-experts ONNX model with external data, and its expected outputs.

The model is one MoE layer, as in a transformer block::

    router_logits = MatMul(X, router_weight)
    Y = pkg.nxrt::BlockQuantizedMoE(X, router_logits, fc1_weight, fc1_scales,
                                    fc2_weight, fc2_scales[, fc1_zero_points, fc2_zero_points])

Every initializer is stored in ``model.onnx.data`` next to ``model.onnx``, each at
a page-aligned offset. The quantised weights are random bytes and the scales
are sized so activations stay near unit scale; ``expected.npz`` holds the input
``X`` and the output ``Y`` computed by the numpy reference
(:mod:`nxrt.moe.reference`), and ``moe.json`` the configuration and byte sizes.

Defaults (64 experts, hidden 1024, intermediate 2816, 4-bit, block 32, swiglu)
make about 350 MB of expert weights; ``--small`` makes a model of a few
hundred kB for tests.

Run: ``python scripts/make_moe_model.py --out /tmp/moe [--small]``
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict, dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper

from nxrt import contrib_ops
from nxrt.moe.reference import block_quantized_moe

DATA_FILE = "model.onnx.data"
MODEL_FILE = "model.onnx"
EXPECTED_FILE = "expected.npz"
INFO_FILE = "moe.json"
_ALIGN = 4096


@dataclass(frozen=True)
class MoeConfig:
    """The layer's sizes and attributes (``tokens``: rows of the sample input)."""

    experts: int = 64
    hidden: int = 1024
    intermediate: int = 2816
    bits: int = 4
    block_size: int = 32
    top_k: int = 2
    activation: str = "swiglu"
    normalize_routing_weights: int = 1
    zero_points: bool = False
    dtype: str = "float32"
    tokens: int = 16
    seed: int = 0

    @property
    def fc1_out(self) -> int:
        return 2 * self.intermediate if self.activation == "swiglu" else self.intermediate


SMALL = MoeConfig(experts=8, hidden=64, intermediate=96, tokens=6)


def expert_tensors(config: MoeConfig) -> dict[str, np.ndarray]:
    """Random quantised expert weights in the op's storage format."""
    rng = np.random.default_rng(config.seed)
    e, h, i, f = config.experts, config.hidden, config.intermediate, config.fc1_out
    bits, block = config.bits, config.block_size
    dtype = np.dtype(config.dtype)
    # Uniform q in [0, 2^bits) has spread ~2^bits/sqrt(12) around the midpoint; scales
    # are chosen so each matmul keeps unit-scale inputs near unit scale.
    spread = 2**bits / np.sqrt(12.0)

    def scales(rows: int, inner: int) -> np.ndarray:
        base = 1.0 / (spread * np.sqrt(inner))
        return (base * rng.uniform(0.5, 1.5, (e, rows, inner // block))).astype(dtype)

    tensors = {
        "fc1_weight": rng.integers(0, 256, (e, f, h * bits // 8), dtype=np.uint8),
        "fc1_scales": scales(f, h),
        "fc2_weight": rng.integers(0, 256, (e, h, i * bits // 8), dtype=np.uint8),
        "fc2_scales": scales(h, i),
    }
    if config.zero_points:
        top = 2**bits
        low, high = top // 4, 3 * top // 4
        tensors["fc1_zero_points"] = rng.integers(low, high, (e, f, h // block), dtype=np.uint8)
        tensors["fc2_zero_points"] = rng.integers(low, high, (e, h, i // block), dtype=np.uint8)
    return tensors


def _external(name: str, array: np.ndarray, data: object, location: str) -> TensorProto:
    """A TensorProto whose bytes go to ``data`` (an open file) at a page-aligned offset."""
    offset = data.seek(0, os.SEEK_END)  # type: ignore[attr-defined]
    pad = -offset % _ALIGN
    data.write(b"\0" * pad)  # type: ignore[attr-defined]
    offset += pad
    raw = np.ascontiguousarray(array).tobytes()
    data.write(raw)  # type: ignore[attr-defined]
    tensor = TensorProto()
    tensor.name = name
    tensor.data_type = helper.np_dtype_to_tensor_dtype(array.dtype)
    tensor.dims.extend(array.shape)
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", offset), ("length", len(raw))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, str(value)
    return tensor


def make_moe_model(out: str, config: MoeConfig = MoeConfig()) -> dict[str, object]:
    """Write ``model.onnx``, its data, ``expected.npz`` and ``moe.json`` into ``out``."""
    os.makedirs(out, exist_ok=True)
    contrib_ops.register()
    rng = np.random.default_rng(config.seed + 1)
    dtype = np.dtype(config.dtype)
    elem = helper.np_dtype_to_tensor_dtype(dtype)
    experts = expert_tensors(config)
    router = (rng.standard_normal((config.hidden, config.experts)) / np.sqrt(config.hidden)).astype(
        dtype
    )
    x = rng.standard_normal((config.tokens, config.hidden)).astype(dtype)
    logits = x @ router
    y = block_quantized_moe(
        x,
        logits,
        **experts,
        top_k=config.top_k,
        bits=config.bits,
        block_size=config.block_size,
        activation=config.activation,
        normalize_routing_weights=config.normalize_routing_weights,
    )

    data_path = os.path.join(out, DATA_FILE)
    with open(data_path, "wb") as data:
        initializers = [_external("router_weight", router, data, DATA_FILE)]
        initializers += [_external(n, a, data, DATA_FILE) for n, a in experts.items()]
    names = ["X", "router_logits", "fc1_weight", "fc1_scales", "fc2_weight", "fc2_scales"]
    if config.zero_points:
        names += ["fc1_zero_points", "fc2_zero_points"]
    nodes = [
        helper.make_node("MatMul", ["X", "router_weight"], ["router_logits"], name="router"),
        helper.make_node(
            "BlockQuantizedMoE",
            names,
            ["Y"],
            name="moe",
            domain=contrib_ops.DOMAIN,
            top_k=config.top_k,
            bits=config.bits,
            block_size=config.block_size,
            activation=config.activation,
            normalize_routing_weights=config.normalize_routing_weights,
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "moe_layer",
        [helper.make_tensor_value_info("X", elem, ["tokens", config.hidden])],
        [helper.make_tensor_value_info("Y", elem, ["tokens", config.hidden])],
        initializers,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(contrib_ops.DOMAIN, 1)],
        producer_name="nxrt make_moe_model",
    )
    model_path = os.path.join(out, MODEL_FILE)
    with open(model_path, "wb") as f:
        f.write(model.SerializeToString())
    onnx.checker.check_model(model_path)  # resolves the external data against ``out``
    np.savez(os.path.join(out, EXPECTED_FILE), X=x, Y=y)
    expert_bytes = sum(a.nbytes for a in experts.values()) // config.experts
    info = {
        **asdict(config),
        "model": model_path,
        "expert_bytes": expert_bytes,
        "bank_bytes": expert_bytes * config.experts,
        "data_bytes": os.path.getsize(data_path),
    }
    with open(os.path.join(out, INFO_FILE), "w", encoding="utf-8") as f:
        json.dump(info, f, indent=2)
    return info


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder to write the model into")
    parser.add_argument("--small", action="store_true", help="a tiny model for tests")
    parser.add_argument("--experts", type=int)
    parser.add_argument("--hidden", type=int)
    parser.add_argument("--intermediate", type=int)
    parser.add_argument("--bits", type=int, choices=(4, 8))
    parser.add_argument("--block-size", type=int)
    parser.add_argument("--top-k", type=int)
    parser.add_argument("--activation", choices=("relu", "gelu", "silu", "swiglu"))
    parser.add_argument("--normalize-routing-weights", type=int, choices=(0, 1))
    parser.add_argument("--zero-points", action="store_true", default=None)
    parser.add_argument("--dtype", choices=("float32", "float16"))
    parser.add_argument("--tokens", type=int)
    parser.add_argument("--seed", type=int)
    args = parser.parse_args(argv)
    defaults = SMALL if args.small else MoeConfig()
    chosen = {
        field: getattr(args, field)
        for field in MoeConfig.__dataclass_fields__
        if getattr(args, field, None) is not None
    }
    config = MoeConfig(**{**asdict(defaults), **chosen})
    start = time.perf_counter()
    info = make_moe_model(args.out, config)
    print(
        f"wrote {info['model']}: {config.experts} experts of {info['expert_bytes'] / 2**20:.2f} "
        f"MiB ({info['bank_bytes'] / 2**20:.1f} MiB of experts, {info['data_bytes'] / 2**20:.1f} "
        f"MiB of external data) in {time.perf_counter() - start:.1f} s"
    )


if __name__ == "__main__":
    main()

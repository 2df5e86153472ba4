"""``pkg.nxrt::BlockQuantizedMoE``: a mixture of experts with block-quantised weights.

Only the experts the router picks are dequantised, one at a time, so a call
costs memory for one expert's float weights, never the whole bank. The cpu
EP advertises the ``"nxrt"`` capability: expert weights stored as external
data reach this kernel as lazy handles, and its EP's
:class:`~nxrt.moe.residency.ExpertResidencyManager` pages the routed experts in
under a byte budget. EP options (``providers=[("cpu", {...})]``):

- ``nxrt.expert_memory_budget``: bytes of expert weights kept in memory
  (``268435456``, ``"256MiB"``, ``"1.5GB"``); default: unlimited, every
  expert resident.
- ``nxrt.expert_residency_policy``: ``whole_bank`` (default: all resident when
  it fits, else paged on demand) or ``static_profile`` (the experts hottest in
  ``nxrt.expert_usage_profile`` stay resident).
- ``nxrt.expert_usage_profile``: routing counts per expert, e.g. ``"9,0,4,1"``.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from nxrt.contrib_ops import DOMAIN, MOE_OP_TYPE, MOE_SINCE  # the schema, registered
from nxrt.errors import InvalidArgument, InvalidModel, KernelFailed, NxrtError, OutOfMemory
from nxrt.kernel import Cost, Kernel, attribute_values
from nxrt.memory import parse_bytes
from nxrt.moe.residency import (
    ExpertResidencyManager,
    FinalizedExpertBank,
    StaticProfileResidencyPolicy,
    WholeBankResidentPolicy,
)
from nxrt.pipeline.weight_binding import resident_array
from nxrt.weight import LazyWeight
from nxrt_ep_cpu.ops._registry import op

if TYPE_CHECKING:
    import onnx_ir as ir

    from nxrt.provider import ExecutionProvider

EXPERT_MEMORY_BUDGET = "nxrt.expert_memory_budget"
EXPERT_RESIDENCY_POLICY = "nxrt.expert_residency_policy"
EXPERT_USAGE_PROFILE = "nxrt.expert_usage_profile"
ACTIVATIONS = ("relu", "gelu", "silu", "swiglu")
_WEIGHT_INPUTS = (2, 3, 4, 5, 6, 7)  # fc1_weight, fc1_scales, fc2_weight, fc2_scales, zps
_managers_lock = threading.Lock()


def residency_manager(ep: ExecutionProvider) -> ExpertResidencyManager:
    """The EP's expert residency manager (one per EP instance, shared by its MoE nodes)."""
    with _managers_lock:
        if ep.expert_residency is None:
            options = ep.config.options
            budget = parse_bytes(options.get(EXPERT_MEMORY_BUDGET))
            ep.expert_residency = ExpertResidencyManager(budget, _policy(options))
        return ep.expert_residency


def _policy(options: dict[str, Any]) -> Any:
    name = str(options.get(EXPERT_RESIDENCY_POLICY, "whole_bank")).replace("-", "_")
    if name == "whole_bank":
        return WholeBankResidentPolicy()
    if name == "static_profile":
        profile = options.get(EXPERT_USAGE_PROFILE)
        if profile is None:
            raise InvalidArgument(
                f"{EXPERT_RESIDENCY_POLICY}=static_profile needs {EXPERT_USAGE_PROFILE}, e.g. "
                "'9,0,4,1' (routing counts per expert)"
            )
        if isinstance(profile, str):
            profile = [float(v) for v in profile.replace(" ", "").split(",") if v]
        return StaticProfileResidencyPolicy(profile)
    raise InvalidArgument(
        f"{EXPERT_RESIDENCY_POLICY} must be 'whole_bank' or 'static_profile', got {name!r}"
    )


# -- numerics ---------------------------------------------------------------------------------


def route(router_logits: np.ndarray, top_k: int, normalize: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k experts per token by softmax probability (ties: lower index) and their weights."""
    logits = np.asarray(router_logits, dtype=np.float32)
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    p = e / e.sum(axis=-1, keepdims=True)
    experts = np.argsort(-p, axis=-1, kind="stable")[:, :top_k]
    weights = np.take_along_axis(p, experts, axis=-1)
    if normalize:
        weights = weights / weights.sum(axis=-1, keepdims=True)
    return experts, weights


def dequantize(
    packed: np.ndarray,
    scales: np.ndarray,
    zero_points: np.ndarray | None,
    bits: int,
    block_size: int,
) -> np.ndarray:
    """One expert's float32 ``[out, in]`` weights from packed blocks."""
    rows, width = packed.shape
    if bits == 4:
        q = np.empty((rows, width * 2), np.float32)
        q[:, 0::2] = packed & 0x0F
        q[:, 1::2] = packed >> 4
    else:
        q = packed.astype(np.float32)
    blocks = q.reshape(rows, -1, block_size)
    if zero_points is None:
        blocks -= np.float32(2 ** (bits - 1))
    else:
        blocks -= zero_points.astype(np.float32)[..., None]
    blocks *= scales.astype(np.float32)[..., None]
    return q


def _sigmoid(h: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(h))
    return np.where(h >= 0, 1 / (1 + e), e / (1 + e))


def _erf(x: np.ndarray) -> np.ndarray:
    """erf to ~1e-7 (Abramowitz and Stegun 7.1.26), computed in float64."""
    x = x.astype(np.float64)
    t = 1.0 / (1.0 + 0.3275911 * np.abs(x))
    poly = t * (
        0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))
    )
    return np.sign(x) * (1.0 - poly * np.exp(-x * x))


def activate(h: np.ndarray, activation: str) -> np.ndarray:
    if activation == "relu":
        return np.maximum(h, 0, out=h)
    if activation == "gelu":
        return (0.5 * h * (1.0 + _erf(h / math.sqrt(2.0)))).astype(np.float32)
    if activation == "silu":
        return h * _sigmoid(h)
    gate, up = np.split(h, 2, axis=-1)
    return gate * _sigmoid(gate) * up


# -- the kernel -------------------------------------------------------------------------------


class _Weights:
    """The six weight inputs of one call: resident arrays, and the bank paging the rest."""

    def __init__(
        self, key: tuple[int, ...], resident: dict[int, np.ndarray | None], inputs: list[Any]
    ) -> None:
        self.key = key
        self.inputs = inputs  # held, so the ids in ``key`` cannot be reused while cached
        self.resident = resident
        self.bank: FinalizedExpertBank | None = None
        self.shapes: dict[int, tuple[int, ...]] = {}


class BlockQuantizedMoEKernel(Kernel):
    """The cpu kernel; pages lazy expert weights through the EP's residency manager."""

    def __init__(
        self, attrs: dict[str, Any], manager: ExpertResidencyManager | None = None
    ) -> None:
        self.top_k, self.bits, self.block_size, self.activation, self.normalize = _attributes(attrs)
        self.manager = manager
        self._weights: _Weights | None = None
        self._lock = threading.Lock()
        self.variant = "resident"
        self.variant_reason = "expert weights are resident arrays"

    @classmethod
    def create(cls, ep: ExecutionProvider, node: ir.Node) -> BlockQuantizedMoEKernel:
        """Kernel factory used by the cpu EP: one residency manager per EP instance."""
        manager = residency_manager(ep)
        kernel = cls(attribute_values(node), manager)
        budget = manager.budget
        if budget is not None:
            needed = _expert_bytes(node)
            if needed > budget:
                raise OutOfMemory(needed, budget)
        return kernel

    def compute(self, inputs: Sequence[Any]) -> tuple[Any, ...]:
        try:
            return (self._compute(list(inputs) + [None] * (8 - len(inputs))),)
        except NxrtError:
            raise
        except (ValueError, IndexError, TypeError, ArithmeticError) as exc:
            raise KernelFailed(f"{type(exc).__name__}: {exc}") from exc

    def _compute(self, inputs: list[Any]) -> np.ndarray:
        x = np.asarray(inputs[0])
        logits = np.asarray(inputs[1])
        if x.ndim != 2 or logits.ndim != 2 or logits.shape[0] != x.shape[0]:
            raise KernelFailed(
                f"X must be [T, H] and router_logits [T, E]; got {list(x.shape)} and "
                f"{list(logits.shape)}"
            )
        num_experts = logits.shape[1]
        if not 1 <= self.top_k <= num_experts:
            raise KernelFailed(f"top_k={self.top_k} must be between 1 and E={num_experts}")
        weights = self._weights_for(inputs[2:8], num_experts, x.shape[1])
        experts, routing = route(logits, self.top_k, self.normalize)
        x32 = x.astype(np.float32, copy=False)
        y = np.zeros(x.shape, np.float32)
        routed = np.unique(experts)
        if weights.bank is None or self.manager is None:
            for e in routed:
                self._expert(int(e), weights.resident, {}, x32, experts, routing, y)
            return y.astype(x.dtype, copy=False)
        manager = self.manager
        manager.safe_point()
        for wave in manager.waves(weights.bank, routed):
            with manager.prove(weights.bank, wave) as proof:
                for e in wave:
                    self._expert(e, weights.resident, proof.weights(e), x32, experts, routing, y)
        return y.astype(x.dtype, copy=False)

    def _expert(
        self,
        e: int,
        resident: dict[int, np.ndarray | None],
        paged: Any,
        x: np.ndarray,
        experts: np.ndarray,
        routing: np.ndarray,
        y: np.ndarray,
    ) -> None:
        def part(index: int) -> np.ndarray | None:
            if index in paged:
                return paged[index]
            array = resident.get(index)
            return None if array is None else array[e]

        tokens, slot = np.nonzero(experts == e)
        # the packed weights and their scales (parts 2 to 5) are required inputs
        packed1, scales1 = cast(np.ndarray, part(2)), cast(np.ndarray, part(3))
        w1 = dequantize(packed1, scales1, part(6), self.bits, self.block_size)
        h = activate(x[tokens] @ w1.T, self.activation)
        del w1
        packed2, scales2 = cast(np.ndarray, part(4)), cast(np.ndarray, part(5))
        w2 = dequantize(packed2, scales2, part(7), self.bits, self.block_size)
        y[tokens] += routing[tokens, slot][:, None] * (h @ w2.T)

    def _weights_for(self, raw: list[Any], num_experts: int, hidden: int) -> _Weights:
        """Resident arrays and the paged bank of these inputs, built once and cached."""
        key = tuple(id(w) for w in raw)
        with self._lock:
            cached = self._weights
            if cached is not None and cached.key == key:
                return cached
            resident: dict[int, np.ndarray | None] = {}
            lazy: dict[int, LazyWeight] = {}
            shapes: dict[int, tuple[int, ...]] = {}
            for index, weight in zip(_WEIGHT_INPUTS, raw):
                if isinstance(weight, LazyWeight):
                    if self.manager is not None and getattr(weight, "shape", None) is not None:
                        lazy[index] = weight
                        shapes[index] = tuple(cast(Any, weight).shape)  # checked above
                        continue
                    weight = resident_array(weight.materialize())
                resident[index] = None if weight is None else np.asarray(weight)
                if weight is not None:
                    shapes[index] = cast(np.ndarray, resident[index]).shape
            self._check_shapes(shapes, num_experts, hidden)
            built = _Weights(key, resident, raw)
            built.shapes = shapes
            if lazy:
                assert self.manager is not None
                built.bank = self.manager.register_bank(lazy, num_experts)
                self.variant = "paged"
                self.variant_reason = (
                    f"{len(lazy)} lazy weight inputs paged per expert: "
                    f"{self.manager.plan.describe()}"
                )
            self._weights = built
            return built

    def _check_shapes(self, shapes: dict[int, tuple[int, ...]], e: int, h: int) -> None:
        names = {2: "fc1_weight", 3: "fc1_scales", 4: "fc2_weight", 5: "fc2_scales"}
        for index, name in names.items():
            if index not in shapes:
                raise KernelFailed(f"input {name} is missing")
        bits, block = self.bits, self.block_size
        fc1, fc2 = shapes[2], shapes[4]
        if len(fc1) != 3 or len(fc2) != 3:
            raise KernelFailed("fc1_weight and fc2_weight must be 3-D [E, out, in*bits/8]")
        f = fc1[1]
        i = fc2[2] * 8 // bits
        expected = {
            2: (e, f, h * bits // 8),
            3: (e, f, h // block),
            4: (e, h, i * bits // 8),
            5: (e, h, i // block),
            6: (e, f, h // block),
            7: (e, h, i // block),
        }
        if h % block or i % block:
            raise KernelFailed(f"H={h} and I={i} must be multiples of block_size={block}")
        if f != (2 * i if self.activation == "swiglu" else i):
            raise KernelFailed(
                f"fc1 has {f} outputs but {self.activation} with I={i} needs "
                f"{2 * i if self.activation == 'swiglu' else i}"
            )
        labels = {**names, 6: "fc1_zero_points", 7: "fc2_zero_points"}
        for index, shape in shapes.items():
            if tuple(shape) != expected[index]:
                raise KernelFailed(
                    f"{labels[index]} has shape {list(shape)}, expected {list(expected[index])}"
                )


def _attributes(attrs: dict[str, Any]) -> tuple[int, int, int, str, int]:
    missing = [n for n in ("top_k", "bits", "block_size", "activation") if n not in attrs]
    if missing:
        raise InvalidModel(f"BlockQuantizedMoE needs attribute(s) {missing}")
    top_k, bits, block = int(attrs["top_k"]), int(attrs["bits"]), int(attrs["block_size"])
    activation = attrs["activation"]
    if isinstance(activation, bytes):
        activation = activation.decode()
    normalize = int(attrs.get("normalize_routing_weights", 0))
    if top_k < 1:
        raise InvalidModel(f"BlockQuantizedMoE top_k must be >= 1, got {top_k}")
    if bits not in (4, 8):
        raise InvalidModel(f"BlockQuantizedMoE bits must be 4 or 8, got {bits}")
    if block < 16 or block & (block - 1):
        raise InvalidModel(
            f"BlockQuantizedMoE block_size must be a power of two >= 16, got {block}"
        )
    if activation not in ACTIVATIONS:
        raise InvalidModel(
            f"BlockQuantizedMoE activation must be one of {list(ACTIVATIONS)}, got {activation!r}"
        )
    if normalize not in (0, 1):
        raise InvalidModel(f"normalize_routing_weights must be 0 or 1, got {normalize}")
    return top_k, bits, block, activation, normalize


def _expert_bytes(node: ir.Node) -> int:
    """Bytes of one expert's initializer weights, from their shapes (0 when unknown)."""
    total = 0
    for index in _WEIGHT_INPUTS:
        value = node.inputs[index] if index < len(node.inputs) else None
        tensor = value.const_value if value is not None else None
        if tensor is None or not tensor.shape or not isinstance(tensor.shape[0], int):
            continue
        total += tensor.nbytes // max(int(tensor.shape[0]), 1)
    return total


def _static_dims(value: ir.Value | None, rank: int) -> tuple[int, ...]:
    shape = value.shape if value is not None else None
    if shape is None or len(shape) != rank or not all(isinstance(d, int) for d in shape):
        raise ValueError("shape not static")
    return cast("tuple[int, ...]", tuple(shape))


def _cost(node: ir.Node) -> Cost:
    """Flops of the routed experts' matmuls and bytes of their weights, where shapes are known."""
    try:
        tokens, hidden = _static_dims(node.inputs[0], 2)
        e, f, _ = _static_dims(node.inputs[2], 3)
        _, _, packed = _static_dims(node.inputs[4], 3)
        bits = int(node.attributes["bits"].value)
        top_k = int(node.attributes["top_k"].value)
    except (TypeError, ValueError, KeyError, AttributeError, IndexError):
        return Cost()
    inner = packed * 8 // bits
    flops = 2 * tokens * top_k * (hidden * f + inner * hidden)
    used = min(e, tokens * top_k)
    weight_bytes = used * (f * hidden + hidden * inner) * bits // 8
    return Cost(flops, weight_bytes + 2 * tokens * hidden * 4)


@op(MOE_OP_TYPE, since=MOE_SINCE, domain=DOMAIN, cost=_cost, factory=BlockQuantizedMoEKernel.create)
def block_quantized_moe(
    x: np.ndarray,
    router_logits: np.ndarray,
    fc1_weight: Any,
    fc1_scales: Any,
    fc2_weight: Any,
    fc2_scales: Any,
    fc1_zero_points: Any = None,
    fc2_zero_points: Any = None,
    /,
    *,
    top_k: int,
    bits: int,
    block_size: int,
    activation: str,
    normalize_routing_weights: int = 0,
) -> np.ndarray:
    """Stateless form: resident arrays (lazy handles are materialised)."""
    attrs = {
        "top_k": top_k,
        "bits": bits,
        "block_size": block_size,
        "activation": activation,
        "normalize_routing_weights": normalize_routing_weights,
    }
    kernel = BlockQuantizedMoEKernel(attrs)
    inputs = [x, router_logits, fc1_weight, fc1_scales, fc2_weight, fc2_scales]
    return kernel.compute([*inputs, fc1_zero_points, fc2_zero_points])[0]

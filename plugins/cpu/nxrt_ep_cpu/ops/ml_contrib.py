"""``com.microsoft::CDist`` and ``com.microsoft::MurmurHash3``, ONNX Runtime's contrib ops
that skl2onnx emits.

CDist is what the ``{"optim": "cdist"}`` option of skl2onnx's nearest-neighbour,
Gaussian-process, KernelPCA and LocalOutlierFactor converters writes in place of
a Scan over the training rows; MurmurHash3 is how FeatureHasher hashes. The ops
are ONNX Runtime's, not ONNX's, so their schemas are registered with onnx here
(once, when the cpu EP's kernels load): the checker then validates such nodes
and shape inference types what follows them. Semantics are ONNX Runtime's,
down to the order CDist adds its terms in (ties between neighbours then break
the same way) and the bytes MurmurHash3 hashes.
"""

from __future__ import annotations

import threading

import numpy as np
import onnx
import onnx.defs

from nxrt.errors import KernelFailed
from nxrt_ep_cpu.ops._registry import op

DOMAIN = "com.microsoft"
_lock = threading.Lock()

_NUMERIC = ["tensor(float)", "tensor(double)"]
_HASHABLE = [
    "tensor(uint32)",
    "tensor(int32)",
    "tensor(uint64)",
    "tensor(int64)",
    "tensor(float)",
    "tensor(double)",
    "tensor(string)",
]


def _schemas() -> list[onnx.defs.OpSchema]:
    schema = onnx.defs.OpSchema
    param = schema.FormalParameter
    attr = schema.AttrType
    cdist = schema(
        "CDist",
        DOMAIN,
        1,
        "Distances between every row of A [N, K] and every row of B [M, K], as [N, M].",
        inputs=[param("A", "T", "2-D input [N, K]."), param("B", "T", "2-D input [M, K].")],
        outputs=[param("C", "T", "Distances [N, M].")],
        type_constraints=[("T", _NUMERIC, "Floats only.")],
        attributes=[
            schema.Attribute(
                "metric",
                attr.STRING,
                "sqeuclidean (default) or euclidean.",
                required=False,
            )
        ],
    )
    hash3 = schema(
        "MurmurHash3",
        DOMAIN,
        1,
        "The 32-bit MurmurHash3 (x86) of each element's bytes, or of each string's UTF-8.",
        inputs=[param("X", "T1", "Keys to hash.")],
        outputs=[param("Y", "T2", "uint32 hashes (positive=1) or int32 (positive=0).")],
        type_constraints=[
            ("T1", _HASHABLE, "Numbers and strings."),
            ("T2", ["tensor(uint32)", "tensor(int32)"], "The hash's type."),
        ],
        attributes=[
            schema.Attribute("seed", attr.INT, "Seed of the hash (default 0).", required=False),
            schema.Attribute(
                "positive", attr.INT, "1 (default): uint32 output; 0: int32.", required=False
            ),
        ],
    )
    return [cdist, hash3]


def _infer_cdist(ctx) -> None:
    """C is [N, M] of A's type."""
    a, b = ctx.get_input_type(0), ctx.get_input_type(1)
    out = onnx.TypeProto()
    if a is None or not a.HasField("tensor_type"):
        return
    out.tensor_type.elem_type = a.tensor_type.elem_type
    dims = []
    for t in (a, b):
        shape = t.tensor_type.shape if t is not None and t.HasField("tensor_type") else None
        dims.append(shape.dim[0] if shape is not None and len(shape.dim) == 2 else None)
    if all(d is not None for d in dims):
        out.tensor_type.shape.dim.extend(dims)
    ctx.set_output_type(0, out)


def _infer_hash(ctx) -> None:
    """Y has X's shape; uint32 unless ``positive`` is 0."""
    x = ctx.get_input_type(0)
    positive = ctx.get_attribute("positive")
    signed = positive is not None and onnx.helper.get_attribute_value(positive) == 0
    out = onnx.TypeProto()
    out.tensor_type.elem_type = onnx.TensorProto.INT32 if signed else onnx.TensorProto.UINT32
    if x is not None and x.HasField("tensor_type") and x.tensor_type.HasField("shape"):
        out.tensor_type.shape.dim.extend(x.tensor_type.shape.dim)
    ctx.set_output_type(0, out)


def register_schemas() -> None:
    """Make onnx know ``com.microsoft::CDist`` and ``::MurmurHash3`` (idempotent)."""
    with _lock:
        for schema, infer in zip(_schemas(), (_infer_cdist, _infer_hash), strict=True):
            if not onnx.defs.has(schema.name, 1, DOMAIN):
                schema.set_type_and_shape_inference_function(infer)
                onnx.defs.register_schema(schema)


register_schemas()


@op("CDist", since=1, domain=DOMAIN)
def cdist(a: np.ndarray, b: np.ndarray, /, *, metric: str = "sqeuclidean") -> np.ndarray:
    """Squared (or plain) euclidean distances of the rows, as ONNX Runtime sums them:
    ``(-2 A B^T + |a|^2) + |b|^2``, then the absolute value (the sum can cancel to a
    tiny negative) and, for euclidean, its square root."""
    metric = metric.decode() if isinstance(metric, bytes) else metric
    if metric not in ("sqeuclidean", "euclidean"):
        raise KernelFailed(f"CDist: metric must be sqeuclidean or euclidean, not {metric!r}")
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1] or a.shape[1] <= 0:
        raise KernelFailed(
            f"CDist: inputs of shapes {a.shape} and {b.shape} are not [N, K], [M, K]"
        )
    if a.dtype != b.dtype or a.dtype.kind != "f":
        raise KernelFailed(f"CDist: inputs must be float or double, got {a.dtype} and {b.dtype}")
    a_ss = np.einsum("ij,ij->i", a, a)
    b_ss = np.einsum("ij,ij->i", b, b)
    out = (a @ b.T) * a.dtype.type(-2)
    out += a_ss[:, None]
    out += b_ss[None, :]
    np.abs(out, out=out)
    if metric == "euclidean":
        np.sqrt(out, out=out)
    return out


_C1, _C2 = np.uint32(0xCC9E2D51), np.uint32(0x1B873593)


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def _fmix(h: np.ndarray) -> np.ndarray:
    h ^= h >> np.uint32(16)
    h *= np.uint32(0x85EBCA6B)
    h ^= h >> np.uint32(13)
    h *= np.uint32(0xC2B2AE35)
    h ^= h >> np.uint32(16)
    return h


def _hash_rows(data: np.ndarray, length: int, seed: int) -> np.ndarray:
    """MurmurHash3_x86_32 of each row of ``data`` (uint8, [n, length])."""
    h = np.full(data.shape[0], seed & 0xFFFFFFFF, dtype=np.uint32)
    blocks = length // 4
    with np.errstate(over="ignore"):
        if blocks:
            words = np.ascontiguousarray(data[:, : 4 * blocks]).view("<u4")
            for i in range(blocks):
                k = words[:, i].astype(np.uint32) * _C1
                k = _rotl(k, 15) * _C2
                h ^= k
                h = _rotl(h, 13) * np.uint32(5) + np.uint32(0xE6546B64)
        tail = data[:, 4 * blocks : length].astype(np.uint32)
        if tail.shape[1]:
            k = np.zeros(data.shape[0], dtype=np.uint32)
            for i in reversed(range(tail.shape[1])):
                k ^= tail[:, i] << np.uint32(8 * i)
            k = _rotl(k * _C1, 15) * _C2
            h ^= k
        h ^= np.uint32(length & 0xFFFFFFFF)
        return _fmix(h)


def _hash_bytes(value: bytes, seed: int) -> int:
    row = np.frombuffer(value, dtype=np.uint8).reshape(1, -1)
    return int(_hash_rows(row, len(value), seed)[0])


@op("MurmurHash3", since=1, domain=DOMAIN)
def murmur_hash3(x: np.ndarray, /, *, positive: int = 1, seed: int = 0) -> np.ndarray:
    """The hash of each element: a number's own bytes (4 for int32 and float, 8 for
    int64 and double, little-endian), a string's UTF-8; uint32, or int32 when
    ``positive`` is 0 (the same bits)."""
    if x.dtype.kind in "OSU":
        texts = [v if isinstance(v, bytes) else str(v).encode() for v in x.reshape(-1).tolist()]
        out = np.array([_hash_bytes(t, seed) for t in texts], dtype=np.uint32).reshape(x.shape)
    elif x.dtype.kind in "iuf" and x.dtype.itemsize in (4, 8):
        flat = np.ascontiguousarray(x.reshape(-1), dtype=x.dtype.newbyteorder("<"))
        rows = flat.view(np.uint8).reshape(flat.size, x.dtype.itemsize)
        out = _hash_rows(rows, x.dtype.itemsize, seed).reshape(x.shape)
    else:
        raise KernelFailed(f"MurmurHash3: cannot hash {x.dtype} keys (32 or 64-bit numbers, text)")
    return out if positive else out.view(np.int32)

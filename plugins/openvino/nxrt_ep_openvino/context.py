"""The bytes of an openvino EPContext: OpenVINO's exported blob, and the claim's ONNX model.

``CompiledModel.export_model()`` is valid only for the OpenVINO version and
device that made it, so the blob travels with a small header saying which
(also in the node's ``ep_sdk_version`` and ``hardware_architecture``) and,
unless the user asked otherwise, with the claim's standalone ONNX model, from
which a newer OpenVINO or another device recompiles it instead of refusing.

Layout: ``MAGIC``, the header's length (8 bytes, little endian), the header
(JSON: ``openvino``, ``device``, ``precision``, ``blob_bytes``, ``onnx_bytes``),
the blob, the ONNX model.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

from nxrt.errors import InvalidModel

MAGIC = b"NXRT-OPENVINO\x00\x01\x00"


@dataclass
class ContextBlob:
    """What an openvino EPContext holds."""

    openvino: str
    device: str
    precision: str
    blob: bytes
    onnx: bytes = b""

    def pack(self) -> bytes:
        header = json.dumps(
            {
                "openvino": self.openvino,
                "device": self.device,
                "precision": self.precision,
                "blob_bytes": len(self.blob),
                "onnx_bytes": len(self.onnx),
            }
        ).encode()
        return b"".join([MAGIC, struct.pack("<Q", len(header)), header, self.blob, self.onnx])

    @classmethod
    def unpack(cls, data: bytes, name: str = "") -> ContextBlob:
        """Parse the bytes; ``InvalidModel`` when they are not an openvino context."""
        where = f"EPContext {name!r}"
        if not data.startswith(MAGIC):
            raise InvalidModel(
                f"{where} is not an openvino context (its blob does not start with the "
                "nxrt-openvino header); recompile the model with `nxrt compile --ep openvino,cpu`"
            )
        start = len(MAGIC) + 8
        try:
            (size,) = struct.unpack_from("<Q", data, len(MAGIC))
            header = json.loads(data[start : start + size])
            blob_end = start + size + int(header["blob_bytes"])
            onnx_end = blob_end + int(header.get("onnx_bytes", 0))
        except (struct.error, ValueError, KeyError, TypeError) as exc:
            raise InvalidModel(f"{where} has a damaged header: {exc}") from exc
        if onnx_end > len(data):
            raise InvalidModel(f"{where} is truncated: {len(data)} bytes, {onnx_end} expected")
        return cls(
            openvino=str(header.get("openvino", "")),
            device=str(header.get("device", "")),
            precision=str(header.get("precision", "")),
            blob=data[start + size : blob_end],
            onnx=data[blob_end:onnx_end],
        )

"""LoRA adapters in onnxruntime's adapter format: ``AdapterFormat`` and ``LoraAdapter``.

An adapter file holds named tensors (LoRA weights) and two version numbers.
``RunOptions.add_active_adapter(adapter)`` makes a run use them: each
parameter is fed as the model input of its name, so it replaces the feed or
the initializer (one listed as a graph input) of that name for that run, as
in onnxruntime.

The file is onnxruntime's: a FlatBuffer with identifier ``TORT`` holding an
``Adapter`` table (``format_version``, ``adapter_version``,
``model_version``, ``parameters``), each ``Parameter`` a table of ``name``,
``dims`` (int64), ``data_type`` (ONNX's element type numbers) and
``raw_data`` (8-byte aligned). Files written here are read by onnxruntime and
the other way round; the format is small enough to read and write with
:mod:`struct`, without the flatbuffers package.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

from nxrt._files import write_atomically
from nxrt.errors import InvalidArgument, RuntimeFailure
from nxrt.ort.ortvalue import OrtValue, onnx_element_type
from nxrt.pipeline.model import numpy_dtype

#: The FlatBuffer file identifier and the format version onnxruntime reads and writes.
IDENTIFIER = b"TORT"
FORMAT_VERSION = 1


# -- reading -------------------------------------------------------------------------------------
class _Table:
    """One FlatBuffer table: fields found through its vtable."""

    def __init__(self, data: memoryview, pos: int) -> None:
        self.data, self.pos = data, pos
        vtable = pos - struct.unpack_from("<i", data, pos)[0]
        size = struct.unpack_from("<H", data, vtable)[0]
        self.offsets = struct.unpack_from(f"<{(size - 4) // 2}H", data, vtable + 4)

    def _field(self, index: int) -> int:
        offset = self.offsets[index] if index < len(self.offsets) else 0
        return self.pos + offset if offset else 0

    def int32(self, index: int) -> int:
        at = self._field(index)
        return struct.unpack_from("<i", self.data, at)[0] if at else 0

    def target(self, index: int) -> int:
        """Where the offset field ``index`` points (0: absent)."""
        at = self._field(index)
        return at + struct.unpack_from("<I", self.data, at)[0] if at else 0

    def vector(self, index: int) -> tuple[int, int]:
        """(start of the elements, count) of the vector field ``index``."""
        at = self.target(index)
        return (at + 4, struct.unpack_from("<I", self.data, at)[0]) if at else (0, 0)


def read_adapter_bytes(
    data: bytes | bytearray | memoryview,
) -> tuple[int, int, int, dict[str, np.ndarray]]:
    """(format, adapter and model versions, {name: array}) of an adapter file's bytes; the
    arrays are views of ``data`` (no copy)."""
    view = memoryview(data)
    try:
        if len(view) < 8 or bytes(view[4:8]) != IDENTIFIER:
            raise ValueError("no TORT identifier")
        adapter = _Table(view, struct.unpack_from("<I", view, 0)[0])
        versions = adapter.int32(0), adapter.int32(1), adapter.int32(2)
        start, count = adapter.vector(3)
        parameters = {}
        for i in range(count):
            at = start + 4 * i
            param = _Table(view, at + struct.unpack_from("<I", view, at)[0])
            name_at, name_len = param.vector(0)
            name = bytes(view[name_at : name_at + name_len]).decode("utf-8")
            dims_at, rank = param.vector(1)
            dims = struct.unpack_from(f"<{rank}q", view, dims_at) if rank else ()
            raw_at, size = param.vector(3)
            raw = np.frombuffer(view, np.uint8, count=size, offset=raw_at) if size else None
            dtype = numpy_dtype(param.int32(2))
            array = raw.view(dtype) if raw is not None else np.empty(0, dtype)
            parameters[name] = array.reshape(dims)
    except (ValueError, struct.error, KeyError, IndexError, TypeError) as exc:
        raise InvalidArgument(
            f"The buffer does not appear to be a valid lora parameter format ({exc}); write "
            "adapters with AdapterFormat.export_adapter or onnxruntime's"
        ) from exc
    if versions[0] != FORMAT_VERSION:
        raise InvalidArgument(
            f"adapter format version {versions[0]} is not supported (this nxrt reads version "
            f"{FORMAT_VERSION})"
        )
    return versions[0], versions[1], versions[2], parameters


def _read_file(path: str | os.PathLike[str]) -> tuple[int, int, int, dict[str, np.ndarray]]:
    try:
        with open(path, "rb") as f:
            data = bytearray(f.read())  # writable, as onnxruntime's parameters are
    except OSError as exc:
        raise RuntimeFailure(f"cannot read adapter file {os.fspath(path)!r}: {exc}") from exc
    return read_adapter_bytes(data)


# -- writing -------------------------------------------------------------------------------------
class _Writer:
    """Lays a FlatBuffer out front to back: every object after the offsets pointing to it."""

    def __init__(self) -> None:
        self.buf = bytearray(8)
        self.buf[4:8] = IDENTIFIER

    def pad(self, align: int, ahead: int = 0) -> None:
        """Pad so that ``ahead`` bytes from here the buffer is ``align``-aligned."""
        self.buf.extend(b"\0" * (-(len(self.buf) + ahead) % align))

    def table(self, fields: int) -> int:
        """A table of ``fields`` 4-byte fields, its vtable just before it; its position."""
        vtable = struct.pack(
            f"<HH{fields}H", 4 + 2 * fields, 4 + 4 * fields, *range(4, 4 + 4 * fields, 4)
        )
        self.pad(4, len(vtable))
        start = len(self.buf)
        self.buf += vtable
        pos = len(self.buf)
        self.buf += struct.pack("<i", pos - start) + bytes(4 * fields)
        return pos

    def set_int32(self, table: int, index: int, value: int) -> None:
        struct.pack_into("<i", self.buf, table + 4 + 4 * index, value)

    def point(self, at: int, target: int | None = None) -> None:
        """Make the offset field at ``at`` point to ``target`` (default: here)."""
        target = len(self.buf) if target is None else target
        struct.pack_into("<I", self.buf, at, target - at)

    def vector(self, at: int, count: int, payload: bytes, align: int = 4) -> int:
        """The vector ``payload`` of ``count`` elements (aligned to ``align``), pointed to by
        the offset field at ``at``; where its elements start."""
        self.pad(max(align, 4), 4)
        self.point(at)
        self.buf += struct.pack("<I", count)
        start = len(self.buf)
        self.buf += payload
        return start


def adapter_bytes(
    adapter_version: int, model_version: int, parameters: Mapping[str, np.ndarray]
) -> bytes:
    """An adapter file's bytes."""
    out = _Writer()
    adapter = out.table(4)
    struct.pack_into("<I", out.buf, 0, adapter)
    for index, value in enumerate((FORMAT_VERSION, adapter_version, model_version)):
        out.set_int32(adapter, index, int(value))
    items = list(parameters.items())
    first = out.vector(adapter + 16, len(items), bytes(4 * len(items)))
    for i, (name, array) in enumerate(items):
        array = np.ascontiguousarray(array)
        param = out.table(4)
        out.point(first + 4 * i, param)
        encoded = str(name).encode("utf-8")
        out.vector(param + 4, len(encoded), encoded + b"\0")
        out.vector(param + 8, array.ndim, struct.pack(f"<{array.ndim}q", *array.shape), 8)
        out.set_int32(param, 2, onnx_element_type(array.dtype))
        out.vector(param + 16, array.nbytes, array.tobytes(), 8)
    return bytes(out.buf)


# -- the Python API --------------------------------------------------------------------------------
def _host_arrays(params: Mapping[str, Any]) -> dict[str, np.ndarray]:
    arrays = {}
    for name, value in params.items():
        if not isinstance(value, OrtValue) or not value.is_tensor():
            raise InvalidArgument(
                f"adapter parameter {name!r} must be an OrtValue holding a tensor"
            )
        array = value.numpy()
        if array.dtype.kind in "OSU":
            raise InvalidArgument(f"adapter parameter {name!r}: strings cannot be adapter weights")
        arrays[str(name)] = array
    return arrays


class AdapterFormat:
    """An adapter file's content: read one (:meth:`read_adapter`) or write one
    (:meth:`export_adapter`)."""

    def __init__(self, adapter: AdapterFormat | None = None) -> None:
        self.format_version = FORMAT_VERSION
        self.adapter_version = 0
        self.model_version = 0
        self.parameters: dict[str, OrtValue] = {}
        if adapter is not None:
            self.format_version = adapter.format_version
            self.adapter_version, self.model_version = (
                adapter.adapter_version,
                adapter.model_version,
            )
            self.parameters = dict(adapter.parameters)

    @staticmethod
    def read_adapter(file_path: str | os.PathLike[str]) -> AdapterFormat:
        """An adapter file's content; the parameters are views of the file's bytes."""
        found = AdapterFormat()
        version, found.adapter_version, found.model_version, arrays = _read_file(file_path)
        found.format_version = version
        found.parameters = {name: OrtValue(array) for name, array in arrays.items()}
        return found

    def export_adapter(self, file_path: str | os.PathLike[str]) -> None:
        """Write the adapter file (atomically), in the format onnxruntime reads."""
        data = adapter_bytes(
            self.adapter_version, self.model_version, _host_arrays(self.parameters)
        )
        write_atomically(os.fspath(file_path), data)

    def get_format_version(self) -> int:
        return self.format_version

    def set_adapter_version(self, adapter_version: int) -> None:
        self.adapter_version = int(adapter_version)

    def get_adapter_version(self) -> int:
        return self.adapter_version

    def set_model_version(self, model_version: int) -> None:
        self.model_version = int(model_version)

    def get_model_version(self) -> int:
        return self.model_version

    def set_parameters(self, params: Mapping[str, OrtValue]) -> None:
        _host_arrays(params)
        self.parameters = dict(params)

    def get_parameters(self) -> dict[str, OrtValue]:
        return dict(self.parameters)


class LoraAdapter:
    """An adapter's parameters, activated for a run by ``RunOptions.add_active_adapter``."""

    def __init__(self) -> None:
        self.parameters: dict[str, OrtValue] = {}

    def Load(self, adapter_file_path: str | os.PathLike[str]) -> None:  # noqa: N802 - ORT's name
        """Read the parameters from an adapter file (``AdapterFormat.export_adapter``'s)."""
        _, _, _, arrays = _read_file(adapter_file_path)
        self.parameters = {name: OrtValue(array) for name, array in arrays.items()}


__all__ = ["AdapterFormat", "LoraAdapter", "adapter_bytes", "read_adapter_bytes"]

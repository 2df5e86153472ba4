"""External tensor data, mapped with mmap and confined to the model's folder.

A model's ``location`` strings come from the file the user was given, so they
are untrusted: before anything reads a byte, every reference is checked to
name a regular file inside the model's folder (no absolute path, no ``..``, no
symlink whose real path leaves the folder), to lie within that file, and to
have exactly the tensor's storage size. Each file is mapped once, read-only
(the user's files are never modified); tensors become zero-copy numpy views
of the mapping, so only the pages a kernel touches are ever read.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import os
import stat
import threading
import weakref
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import onnx
import onnx_ir as ir

from nxrt.errors import InvalidExternalData
from nxrt.pipeline.weight_binding import EXTERNAL_TENSOR_META, lazy_weight_candidates
from nxrt.tensor import ExternalMmapRegion
from nxrt.weight import (
    LazyWeight,
    LazyWeightBoundary,
    ResidentWeight,
    WeightHandle,
)

_PAGE = mmap.PAGESIZE
_COPY_CHUNK = 1 << 18  # bytes copied out of a mapping between two page drops
# Page faults map neighbouring pages too (Linux "fault-around", 64 KiB by default), so
# drops cover whole windows of this size; other tensors' pages simply fault in again.
_DROP_WINDOW = max(_PAGE, 1 << 16)
_ids = itertools.count(1)
_ids_lock = threading.Lock()
_by_id: weakref.WeakValueDictionary[int, MappedFile] = weakref.WeakValueDictionary()


class MappedFile:
    """One read-only mapping of one external-data file, shared by all its tensors."""

    def __init__(self, path: str, fd: int, size: int) -> None:
        with _ids_lock:
            self.mapping_id = next(_ids)
        self.path = path
        self.size = size
        # A zero-length file cannot be mapped; it can only back zero-length tensors.
        self._map = mmap.mmap(fd, size, access=mmap.ACCESS_READ) if size else None
        self._buffer = (
            np.frombuffer(self._map, dtype=np.uint8) if self._map else np.empty(0, np.uint8)
        )
        _by_id[self.mapping_id] = self

    @classmethod
    def in_memory(cls, path: str, data: np.ndarray) -> MappedFile:
        """A "file" whose bytes the caller holds in memory (a ``uint8`` array, not copied),
        read as a mapping is (``add_external_initializers_from_files_in_memory``)."""
        found = cls.__new__(cls)
        with _ids_lock:
            found.mapping_id = next(_ids)
        found.path, found.size, found._map = path, int(data.size), None
        found._buffer = data
        _by_id[found.mapping_id] = found
        return found

    def region(self, offset: int, length: int) -> ExternalMmapRegion:
        return ExternalMmapRegion(self.mapping_id, offset, length)

    def bytes_view(self, region: ExternalMmapRegion) -> np.ndarray:
        """A read-only ``uint8`` view of ``region`` (no copy, no read until touched)."""
        self._check(region)
        return self._buffer[region.offset : region.end]

    def array(self, region: ExternalMmapRegion, dtype: np.dtype, shape: tuple[int, ...]) -> Any:
        """The region as a read-only numpy array of ``dtype`` and ``shape`` (zero-copy)."""
        return self.bytes_view(region).view(dtype).reshape(shape)

    def copy_out(self, region: ExternalMmapRegion, into: np.ndarray) -> None:
        """Copy ``region`` into ``into`` (owned memory), dropping the mapped pages as it goes.

        The pages read through the mapping would otherwise stay counted in the
        process's resident set; after the copy the owned buffer holds the data.
        Copying in chunks keeps the mapped pages in memory at once to one chunk.
        """
        source = self.bytes_view(region)
        if into.shape != source.shape:
            raise InvalidExternalData(
                f"cannot copy {source.size} bytes of mapping {self.mapping_id} into a buffer "
                f"of {into.size}"
            )
        start = 0
        while start < source.size:
            # Chunk ends fall on page boundaries of the file, so no page is read twice.
            end = min(source.size, _COPY_CHUNK - (region.offset + start) % _PAGE + start)
            np.copyto(into[start:end], source[start:end])
            self.drop_pages(ExternalMmapRegion(self.mapping_id, region.offset + start, end - start))
            start = end

    def drop_pages(self, region: ExternalMmapRegion) -> None:
        """Tell the kernel the pages under ``region`` are not needed (MADV_DONTNEED)."""
        advise = getattr(self._map, "madvise", None)
        dontneed = getattr(mmap, "MADV_DONTNEED", None)
        if advise is None or dontneed is None or region.len == 0:
            return
        start = region.offset - region.offset % _DROP_WINDOW
        end = min(self.size, region.end + -region.end % _DROP_WINDOW)
        with contextlib.suppress(OSError, ValueError):
            advise(dontneed, start, end - start)

    def _check(self, region: ExternalMmapRegion) -> None:
        if region.mapping_id != self.mapping_id:
            raise InvalidExternalData(
                f"region of mapping {region.mapping_id} read through mapping {self.mapping_id}"
            )
        if region.end > self.size:
            raise InvalidExternalData(
                f"region [{region.offset}, {region.end}) lies outside {self.path!r} "
                f"({self.size} bytes)"
            )

    def __repr__(self) -> str:
        return f"MappedFile(id={self.mapping_id}, path={self.path!r}, size={self.size})"


def mapped_file(mapping_id: int) -> MappedFile:
    """The live mapping with ``mapping_id`` (the id in an :class:`ExternalMmapRegion`)."""
    found = _by_id.get(mapping_id)
    if found is None:
        raise InvalidExternalData(
            f"no external-data mapping with id {mapping_id} is open; keep the session that "
            "loaded the model alive while its weights are used"
        )
    return found


class ExternalDataRegistry:
    """The mappings of one model folder: one per file, reused by every tensor and session."""

    _folders: weakref.WeakValueDictionary[str, ExternalDataRegistry] = weakref.WeakValueDictionary()
    _lock = threading.Lock()

    def __init__(self, base_dir: str) -> None:
        self.base_dir = os.path.realpath(base_dir)
        self._files: dict[tuple[int, int, int, int], MappedFile] = {}
        self._mutex = threading.Lock()

    @classmethod
    def for_folder(cls, base_dir: str) -> ExternalDataRegistry:
        key = os.path.realpath(base_dir)
        with cls._lock:
            registry = cls._folders.get(key)
            if registry is None:
                registry = cls(key)
                cls._folders[key] = registry
            return registry

    def open(self, location: str, tensor: str) -> MappedFile:
        """The mapping of ``location``, checked to be a regular file inside the folder."""
        path = resolve_location(self.base_dir, location, tensor)
        flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(path, flags)
        except OSError as exc:
            raise _refuse(tensor, location, f"it cannot be opened ({exc.strerror})") from exc
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise _refuse(tensor, location, "it is not a regular file")
            key = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
            with self._mutex:
                found = self._files.get(key)
                if found is None:
                    found = MappedFile(path, fd, info.st_size)
                    self._files[key] = found
                return found
        finally:
            os.close(fd)


def _refuse(tensor: str, location: str, why: str, fix: str = "") -> InvalidExternalData:
    fix = fix or (
        "keep external data files inside the model's folder and name them by a relative path "
        "without '..'"
    )
    return InvalidExternalData(
        f"external data of tensor {tensor!r} at location {location!r} is refused: {why}; {fix}"
    )


def resolve_location(base_dir: str, location: str, tensor: str) -> str:
    """The real path ``location`` names, refused unless it stays inside ``base_dir``."""
    if not location:
        raise _refuse(tensor, location, "the location is empty")
    if "\0" in location:
        raise _refuse(tensor, location, "the location contains a NUL byte")
    parts = location.replace("\\", "/").split("/")
    if (
        os.path.isabs(location)
        or location.startswith(("/", "\\"))
        or (len(location) > 1 and location[0].isalpha() and location[1] == ":")
    ):
        raise _refuse(tensor, location, "the location is an absolute path")
    if ".." in parts:
        raise _refuse(tensor, location, "the location contains a '..' component")
    base = os.path.realpath(base_dir)
    real = os.path.realpath(os.path.join(base, *[p for p in parts if p not in ("", ".")]))
    if os.path.commonpath([base, real]) != base:
        raise _refuse(
            tensor,
            location,
            f"it resolves (through a symlink) to {real!r}, outside the model's folder {base!r}",
        )
    if not os.path.exists(real):
        raise _refuse(
            tensor,
            location,
            f"no such file in the model's folder {base!r}",
            "copy the data file next to the model, or re-save the model with its data",
        )
    if not os.path.isfile(real):
        raise _refuse(tensor, location, "it is not a regular file")
    return real


def storage_bytes(dtype: ir.DataType, shape: tuple[int, ...]) -> int:
    """Bytes ``shape`` of ``dtype`` occupies on disk; sub-byte types packed, per ONNX."""
    count = 1
    for dim in shape:
        count *= int(dim)
    return (count * dtype.bitwidth + 7) // 8


@dataclass(frozen=True)
class ExternalTensorRef:
    """A validated external tensor: its mapping, byte region, dtype and shape."""

    name: str
    file: MappedFile
    region: ExternalMmapRegion
    dtype: ir.DataType
    shape: tuple[int, ...]

    def resident(self) -> ResidentWeight:
        """The tensor's bytes as a :class:`ResidentWeight` over the mapping (no copy)."""
        return ResidentWeight(self.dtype, self.shape, self.file.bytes_view(self.region))

    def tensor(self) -> ir.TensorProtocol:
        """An ``onnx_ir`` tensor whose ``numpy()`` reads the mapping (zero-copy when it can)."""
        view = self.file.bytes_view(self.region)
        if self.dtype.bitwidth % 8:
            return ir.PackedTensor(view, self.dtype, shape=self.shape, name=self.name)
        return ir.Tensor(
            view.view(self.dtype.numpy()).reshape(self.shape), self.dtype, name=self.name
        )


class ExternalLazyWeight(LazyWeight):
    """A :class:`LazyWeight` that also knows its tensor's name, dtype, shape and mapping.

    An EP that pages the weight needs the layout to cut it into pieces; the
    regions alone say where the bytes are, not what they are.
    """

    __slots__ = ("dtype", "file", "name", "shape")

    def __init__(self, ref: ExternalTensorRef) -> None:
        super().__init__(LazyWeightBoundary.BLOCK_QUANTIZED_MOE, [ref.region], ref.resident)
        self.name = ref.name
        self.dtype: ir.DataType = ref.dtype
        self.shape: tuple[int, ...] = ref.shape
        self.file: MappedFile = ref.file


def validate_external_tensor(
    registry: ExternalDataRegistry | None,
    tensor: ir.ExternalTensor,
    name: str = "",
    files: dict[str, MappedFile] | None = None,
) -> ExternalTensorRef:
    """Check one external tensor's location, bounds and length; map its file (or take the
    file of that location from ``files``, those given in memory)."""
    name = name or tensor.name or "<unnamed>"
    location = os.fspath(tensor.location)
    dtype = tensor.dtype
    if dtype in (ir.DataType.STRING, ir.DataType.UNDEFINED):
        raise _refuse(
            name, location, f"{dtype.name} tensors cannot be stored externally", "embed it"
        )
    shape = tuple(int(d) for d in cast("Collection[int]", tensor.shape))  # a tensor's: concrete
    expected = storage_bytes(dtype, shape)
    offset = 0 if tensor.offset is None else int(tensor.offset)
    length = expected if tensor.length is None else int(tensor.length)
    if offset < 0 or length < 0:
        raise _refuse(name, location, f"offset {offset} and length {length} must be >= 0")
    if length != expected:
        raise _refuse(
            name,
            location,
            f"its length is {length} bytes but {dtype.name} {list(shape)} needs {expected}",
            "re-save the model so the recorded length matches the tensor",
        )
    file = (files or {}).get(_normalized(location))
    if file is None:
        if registry is None:
            raise _no_folder(name)
        file = registry.open(location, name)
    if offset + length > file.size:
        raise _refuse(
            name,
            location,
            f"bytes [{offset}, {offset + length}) lie outside the file ({file.size} bytes)",
            "the data file is truncated or belongs to another model; re-save the model",
        )
    return ExternalTensorRef(name, file, file.region(offset, length), dtype, shape)


def _tensor_holders(model: ir.Model) -> Iterator[tuple[str, Any, Any]]:
    """Every place an external tensor can sit: initializers and tensor attributes.

    Yields ``(name, holder, attr)``: an initializer value with ``attr=None``, or
    a node and its ``TENSOR`` attribute.
    """
    graphs: list[Any] = [model.graph, *model.graph.subgraphs()]
    for function in model.functions.values():
        graphs.extend([function, *function.subgraphs()])
    for graph in graphs:
        for name, value in getattr(graph, "initializers", {}).items():
            yield name, value, None
        for node in graph:
            for attr in node.attributes.values():
                if attr.type in (ir.AttributeType.TENSOR, ir.AttributeType.TENSORS):
                    yield attr.name, node, attr


def _held(holder: Any, attr: Any) -> list[Any]:
    if attr is None:
        return [holder.const_value]
    return [attr.value] if attr.type == ir.AttributeType.TENSOR else list(attr.value)


def has_external_data(proto: onnx.ModelProto) -> bool:
    """Whether any tensor of ``proto`` keeps its data in an external file."""
    return any(True for _ in _external_protos(proto))


def _external_protos(proto: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    def graph_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
        yield from graph.initializer
        for node in graph.node:
            yield from node_tensors(node)

    def node_tensors(node: onnx.NodeProto) -> Iterator[onnx.TensorProto]:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from graph_tensors(attr.g)
            for graph in attr.graphs:
                yield from graph_tensors(graph)

    tensors = itertools.chain(
        graph_tensors(proto.graph),
        *(node_tensors(n) for f in proto.functions for n in f.node),
    )
    for tensor in tensors:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            yield tensor


def _check_entries(tensor: onnx.TensorProto) -> None:
    """Refuse external-data fields that cannot even be parsed (before anything reads them)."""
    entries = {e.key: e.value for e in tensor.external_data}
    location = entries.get("location", "")
    if not location:
        raise _refuse(tensor.name, location, "it names no location")
    for key in ("offset", "length"):
        text = entries.get(key)
        if text is None:
            continue
        try:
            number = int(text)
        except ValueError:
            number = -1
        if number < 0:
            raise _refuse(
                tensor.name,
                location,
                f"its {key} {text!r} is not a byte count >= 0",
                "re-save the model with valid external data fields",
            )


@contextlib.contextmanager
def external_data_hidden_from_checker(proto: onnx.ModelProto) -> Iterator[None]:
    """Let the ONNX checker see external tensors as empty ones, restored afterwards.

    The checker resolves ``location`` against the working directory and
    refuses every symlink, so it would reject valid models; nxrt checks
    external data itself against the model's folder (:func:`resolve_external_data`).
    Fields that cannot even be parsed are refused here, before anything reads them.
    """
    tensors = list(_external_protos(proto))
    for tensor in tensors:
        _check_entries(tensor)
    saved = []
    for tensor in tensors:
        saved.append((tensor, list(tensor.dims), [(e.key, e.value) for e in tensor.external_data]))
        tensor.data_location = onnx.TensorProto.DEFAULT
        del tensor.external_data[:]
        del tensor.dims[:]
        tensor.dims.append(0)
    try:
        yield
    finally:
        for tensor, dims, entries in saved:
            del tensor.dims[:]
            tensor.dims.extend(dims)
            tensor.data_location = onnx.TensorProto.EXTERNAL
            for key, value in entries:
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value


def _normalized(location: str) -> str:
    return os.path.normpath(location.replace("\\", "/"))


def _no_folder(name: str) -> InvalidExternalData:
    return InvalidExternalData(
        f"tensor {name!r} keeps its data in an external file, but the model was given as "
        "bytes or a ModelProto, so there is no folder to find it in; pass the model's path "
        "instead, give the file with add_external_initializers_from_files_in_memory, or load "
        "the data first (onnx.load(path) loads it)"
    )


def resolve_external_data(
    model: ir.Model,
    base_dir: str | None,
    files: dict[str, np.ndarray] | None = None,
    provided: Collection[str] = (),
) -> dict[str, WeightHandle]:
    """Validate and map every external tensor of ``model``; handles for its initializers.

    Each external tensor's data becomes an mmap-backed tensor (so nothing
    reads the file through an unchecked path afterwards). The main graph's
    external initializers get a :class:`WeightHandle`: lazy when only
    ``pkg.nxrt::BlockQuantizedMoE`` weight inputs read it, resident otherwise.
    ``files`` are data files given in memory (``uint8`` arrays), by the location
    the model names them with; they are read instead of the folder's. The main
    graph's initializers named in ``provided`` are left as they are: the caller
    gives their data (``add_external_initializers``), so their files are not read.
    """
    main = model.graph.initializers
    holders = [
        (name, holder, attr)
        for name, holder, attr in _tensor_holders(model)
        if any(isinstance(t, ir.ExternalTensor) for t in _held(holder, attr))
        and not (attr is None and name in provided and main.get(name) is holder)
    ]
    if not holders:
        return {}
    memory = {_normalized(k): MappedFile.in_memory(k, v) for k, v in (files or {}).items()}
    registry = ExternalDataRegistry.for_folder(base_dir) if base_dir is not None else None
    candidates = lazy_weight_candidates(model.graph)
    handles: dict[str, WeightHandle] = {}
    for name, holder, attr in holders:
        if attr is None:
            ref = validate_external_tensor(registry, holder.const_value, name, memory)
            holder.const_value = ref.tensor()
            holder.meta[EXTERNAL_TENSOR_META] = holder.const_value
            if main.get(name) is holder:
                if name in candidates and ref.region.len:
                    handles[name] = WeightHandle.Lazy(ExternalLazyWeight(ref))
                else:
                    handles[name] = WeightHandle.Resident(ref.resident())
            continue
        tensors = [
            validate_external_tensor(registry, t, t.name or name, memory).tensor()
            if isinstance(t, ir.ExternalTensor)
            else t
            for t in _held(holder, attr)
        ]
        if attr.type == ir.AttributeType.TENSOR:
            holder.attributes[attr.name] = ir.AttrTensor(attr.name, tensors[0])
        else:
            holder.attributes[attr.name] = ir.AttrTensors(attr.name, tensors)
    # Keep the folder's registry and the files in memory (the mappings) alive with the model.
    model.meta["nxrt.pipeline.external_data"] = registry
    model.meta["nxrt.external_files"] = memory
    return handles


__all__ = [
    "ExternalDataRegistry",
    "ExternalLazyWeight",
    "ExternalTensorRef",
    "MappedFile",
    "external_data_hidden_from_checker",
    "has_external_data",
    "mapped_file",
    "resolve_external_data",
    "resolve_location",
    "storage_bytes",
    "validate_external_tensor",
]

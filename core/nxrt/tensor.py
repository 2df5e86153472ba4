"""Zero-copy tensor views that kernels read from and write into.

Kernels receive :class:`TensorView` inputs and :class:`TensorMut` outputs.
Both wrap memory someone else owns (a numpy array, a DLPack producer, an mmap
of external weight data, a raw buffer) without copying it, and check on
construction that the dtype, shape, strides, byte length and alignment agree,
so a kernel never reads past a buffer or through a misaligned pointer.
"""

from __future__ import annotations

import operator
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx_ir as ir

from nxrt.errors import AlignmentError, InvalidArgument, InvalidTensorView

_U64_MAX = 2**64 - 1


@dataclass(frozen=True)
class ExternalMmapRegion:
    """A byte range ``[offset, offset + len)`` of one mapped external-data file."""

    mapping_id: int
    offset: int
    len: int

    def __post_init__(self) -> None:
        for name in ("mapping_id", "offset", "len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise InvalidArgument(
                    f"ExternalMmapRegion.{name} must be an integer, got {value!r}"
                )
            if value < 0:
                raise InvalidArgument(f"ExternalMmapRegion.{name} must be >= 0, got {value}")
            object.__setattr__(self, name, int(value))
        if self.offset + self.len > _U64_MAX:
            raise InvalidArgument(
                f"ExternalMmapRegion offset {self.offset} + len {self.len} overflows 64 bits"
            )

    @property
    def end(self) -> int:
        """One past the last byte of the region."""
        return self.offset + self.len


def _resolve_dtype(dtype: Any) -> np.dtype:
    try:
        resolved = dtype.numpy() if isinstance(dtype, ir.DataType) else np.dtype(dtype)
    except (TypeError, ValueError):
        raise InvalidTensorView(f"unknown dtype {dtype!r}") from None
    if resolved.hasobject or resolved.itemsize == 0:
        raise InvalidTensorView(f"dtype {resolved} has no fixed-size binary layout")
    return resolved


def _required_alignment(dtype: np.dtype) -> int:
    size = dtype.itemsize
    return size if size & (size - 1) == 0 else dtype.alignment


def _index(value: Any, what: str) -> int:
    if isinstance(value, bool):
        raise InvalidTensorView(f"{what} must be an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise InvalidTensorView(f"{what} must be an integer, got {value!r}") from None


def _address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


def _check_alignment(array: np.ndarray) -> None:
    if array.size == 0:
        return
    required = _required_alignment(array.dtype)
    address = _address(array)
    if address % required:
        raise AlignmentError(
            f"data address {address:#x} is not aligned to {required} bytes, as {array.dtype} "
            "requires; copy the data into an aligned buffer or pick an aligned offset"
        )
    for dim, stride in zip(array.shape, array.strides, strict=True):
        if dim > 1 and stride % required:
            raise AlignmentError(
                f"stride {stride} is not a multiple of the {required}-byte alignment of "
                f"{array.dtype}"
            )


def _source_array(data: Any) -> np.ndarray | None:
    if isinstance(data, np.ndarray):
        return data
    if isinstance(data, np.generic):
        # Scalars are immutable; their 0-d array is read-only so TensorMut refuses it.
        scalar = np.asarray(data)
        scalar.flags.writeable = False
        return scalar
    if hasattr(data, "__dlpack__") and not isinstance(data, (bytes, bytearray, memoryview)):
        try:
            return np.from_dlpack(data)
        except (TypeError, ValueError, BufferError, RuntimeError) as exc:
            raise InvalidTensorView(
                f"cannot import {type(data).__name__} via DLPack: {exc}"
            ) from exc
    return None


def _raw_bytes(data: Any, array: np.ndarray | None) -> np.ndarray:
    """A flat ``uint8`` array over the source's bytes, without copying."""
    if array is not None:
        if not array.flags.c_contiguous:
            raise InvalidTensorView(
                "an explicit dtype/shape/strides/offset needs a C-contiguous source array"
            )
        return array.reshape(-1).view(np.uint8)
    try:
        return np.frombuffer(data, dtype=np.uint8)
    except (TypeError, ValueError, BufferError) as exc:
        raise InvalidTensorView(
            f"{type(data).__name__} is not a numpy array, a DLPack producer or a contiguous "
            f"buffer ({exc})"
        ) from None


def _layout(
    raw: np.ndarray,
    dtype: np.dtype,
    shape: Sequence[int],
    strides: Sequence[int] | None,
    offset: int,
) -> np.ndarray:
    """Check a dtype/shape/strides/offset against ``raw`` and return the view it describes."""
    try:
        dims = tuple(_index(d, "dimension") for d in shape)
    except TypeError:
        raise InvalidTensorView(f"shape must be a sequence of integers, got {shape!r}") from None
    for dim in dims:
        if dim < 0:
            raise InvalidTensorView(f"negative dimension {dim} in shape {list(dims)}")
    offset = _index(offset, "offset")
    if offset < 0:
        raise InvalidTensorView(f"offset must be >= 0, got {offset}")
    count = 1
    for dim in dims:
        count *= dim
        if count > sys.maxsize:
            raise InvalidTensorView(f"element count of shape {list(dims)} overflows")
    itemsize = dtype.itemsize
    if strides is None:
        steps: list[int] = []
        step = itemsize
        for dim in reversed(dims):
            steps.append(step)
            step *= max(dim, 1)
        byte_strides = tuple(reversed(steps))
    else:
        byte_strides = tuple(_index(s, "stride") for s in strides)
        if len(byte_strides) != len(dims):
            raise InvalidTensorView(
                f"{len(byte_strides)} strides given for a {len(dims)}-d shape {list(dims)}"
            )
    if count == 0:
        low = high = offset
    else:
        spans = [(d - 1) * s for d, s in zip(dims, byte_strides, strict=True)]
        low = offset + sum(span for span in spans if span < 0)
        high = offset + sum(span for span in spans if span > 0) + itemsize
    if high > sys.maxsize:
        raise InvalidTensorView(
            f"byte extent of shape {list(dims)} with strides {list(byte_strides)} overflows"
        )
    if low < 0:
        raise InvalidTensorView(
            f"strides {list(byte_strides)} reach {-low} bytes before the start of the buffer"
        )
    if high > raw.size:
        raise InvalidTensorView(
            f"buffer has {raw.size} bytes but shape {list(dims)} of {dtype} at offset {offset} "
            f"needs {high}"
        )
    if count == 0:
        return np.empty(dims, dtype=dtype)
    required = _required_alignment(dtype)
    address = _address(raw) + offset
    if address % required:
        raise AlignmentError(
            f"data address {address:#x} (buffer start + offset {offset}) is not aligned to "
            f"{required} bytes, as {dtype} requires; pick an offset that is a multiple of "
            f"{required} or copy the data into an aligned buffer"
        )
    view = np.ndarray(dims, dtype=dtype, buffer=raw, offset=offset, strides=byte_strides)
    _check_alignment(view)
    return view


class _Tensor:
    __slots__ = ("_array",)

    def __init__(
        self,
        data: Any,
        dtype: Any = None,
        shape: Sequence[int] | None = None,
        strides: Sequence[int] | None = None,
        offset: int = 0,
    ) -> None:
        source = _source_array(data)
        if (
            source is not None
            and dtype is None
            and shape is None
            and strides is None
            and not offset
        ):
            _resolve_dtype(source.dtype)
            _check_alignment(source)
            array = source
        else:
            raw = _raw_bytes(data, source)
            if dtype is None:
                if source is None:
                    raise InvalidTensorView("a raw buffer needs a dtype")
                dtype = source.dtype
            if shape is None:
                raise InvalidTensorView("a reinterpreted buffer needs a shape")
            array = _layout(raw, _resolve_dtype(dtype), shape, strides, offset)
        self._array = self._finish(array)

    def _finish(self, array: np.ndarray) -> np.ndarray:
        view = array.view()
        view.flags.writeable = False
        return view

    @classmethod
    def _wrap(cls, array: np.ndarray) -> Any:
        tensor = object.__new__(cls)
        tensor._array = tensor._finish(array)
        return tensor

    @property
    def array(self) -> np.ndarray:
        """The numpy view over the wrapped memory (never a copy)."""
        return self._array

    @property
    def dtype(self) -> np.dtype:
        return self._array.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self._array.shape

    @property
    def strides(self) -> tuple[int, ...]:
        """Byte strides of each dimension."""
        return self._array.strides

    @property
    def ndim(self) -> int:
        return self._array.ndim

    @property
    def nbytes(self) -> int:
        return self._array.nbytes

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        if dtype is not None and np.dtype(dtype) != self._array.dtype:
            if copy is False:
                raise ValueError(f"converting {self._array.dtype} to {dtype} needs a copy")
            return self._array.astype(dtype)
        return self._array.copy() if copy else self._array

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._array.__dlpack_device__()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(dtype={self.dtype}, shape={list(self.shape)})"


class TensorView(_Tensor):
    """A read-only, zero-copy view: kernel inputs.

    ``data`` is a numpy array, a DLPack producer, or a buffer (``bytes``,
    ``memoryview``, ``mmap``...). ``dtype``/``shape``/``strides`` (in bytes)/
    ``offset`` (in bytes) describe how to read a buffer; an array or DLPack
    producer is taken as it is unless they are given.
    """

    __slots__ = ()


class TensorMut(_Tensor):
    """A writable, zero-copy view: kernel outputs. Refuses read-only memory."""

    __slots__ = ()

    def _finish(self, array: np.ndarray) -> np.ndarray:
        if not array.flags.writeable:
            raise InvalidTensorView(
                "TensorMut needs writable memory but the buffer is read-only; pass a "
                "bytearray, a writable mmap or a writable array"
            )
        return array.view()

    def as_view(self) -> TensorView:
        """A read-only view of the same memory."""
        return TensorView._wrap(self._array)


__all__ = ["ExternalMmapRegion", "TensorMut", "TensorView"]

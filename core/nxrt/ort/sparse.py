"""``SparseTensor``: onnxruntime's sparse tensors (COO, CSR, block-sparse) on the host.

A sparse tensor is its dense shape, its non-zero values and the indices
saying where they go, held over the caller's numpy arrays without a copy
(as onnxruntime holds them on the CPU); the views it returns are read-only.
Every nxrt EP computes on dense tensors, and none keeps sparse tensors in
device memory, so :meth:`SparseTensor.to_cuda` is refused as by an
onnxruntime build without CUDA.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx

from nxrt.errors import RuntimeFailure
from nxrt.pipeline.model import type_string


class OrtSparseFormat(enum.IntEnum):
    ORT_SPARSE_UNDEFINED = 0
    ORT_SPARSE_COO = 1
    ORT_SPARSE_CSRC = 2
    ORT_SPARSE_BLOCK_SPARSE = 4


def _read_only(array: np.ndarray) -> np.ndarray:
    view = array.view()
    view.flags.writeable = False
    return view


class _IndexView:
    """The indices of one format, as ``as_coo_view()`` and friends return them."""

    def __init__(self, *arrays: np.ndarray) -> None:
        self._arrays = [_read_only(a) for a in arrays]

    def indices(self) -> np.ndarray:
        return self._arrays[0]

    def inner(self) -> np.ndarray:
        return self._arrays[0]

    def outer(self) -> np.ndarray:
        return self._arrays[1]


def _host_device(ort_device: Any) -> None:
    if ort_device is not None and ort_device.device_type() != 0:
        raise RuntimeFailure(
            "nxrt keeps sparse tensors on the host only: make them with OrtDevice.make('cpu', 0)"
        )


def _indices(array: Any, what: str) -> np.ndarray:
    indices = np.asarray(array)
    if indices.dtype != np.int64:
        raise RuntimeFailure(f"{what} must be int64, got {indices.dtype}")
    return indices


class SparseTensor:
    """A sparse tensor on the host; make one with the ``sparse_*_from_numpy`` methods."""

    def __init__(
        self,
        sparse_format: OrtSparseFormat,
        dense_shape: Sequence[int],
        values: np.ndarray,
        indices: tuple[np.ndarray, ...],
    ) -> None:
        self._format = OrtSparseFormat(sparse_format)
        self._shape = [int(d) for d in dense_shape]
        self._values = values
        self._indices = indices

    @classmethod
    def sparse_coo_from_numpy(
        cls,
        dense_shape: Sequence[int],
        values: np.ndarray,
        coo_indices: np.ndarray,
        ort_device: Any,
    ) -> SparseTensor:
        """COO: ``coo_indices`` holds one linear index per value, or one row of
        ``len(dense_shape)`` coordinates per value."""
        _host_device(ort_device)
        values, indices = np.asarray(values), _indices(coo_indices, "coo_indices")
        if indices.size not in (values.size, values.size * len(dense_shape)):
            raise RuntimeFailure(
                f"COO indices have {indices.size} entries for {values.size} values: give one "
                "linear index per value, or one coordinate per dimension of each value"
            )
        return cls(OrtSparseFormat.ORT_SPARSE_COO, dense_shape, values, (indices,))

    @classmethod
    def sparse_csr_from_numpy(
        cls,
        dense_shape: Sequence[int],
        values: np.ndarray,
        inner_indices: np.ndarray,
        outer_indices: np.ndarray,
        ort_device: Any,
    ) -> SparseTensor:
        """CSR of a 2-D tensor: ``inner_indices`` the column of each value, ``outer_indices``
        where each row starts (rows + 1 entries)."""
        _host_device(ort_device)
        values = np.asarray(values)
        inner = _indices(inner_indices, "inner_indices")
        outer = _indices(outer_indices, "outer_indices")
        if len(dense_shape) != 2 or inner.size != values.size or outer.size != dense_shape[0] + 1:
            raise RuntimeFailure(
                f"CSR needs a 2-D shape (got {list(dense_shape)}), one inner index per value "
                f"({inner.size} for {values.size}) and rows + 1 outer indices ({outer.size})"
            )
        return cls(OrtSparseFormat.ORT_SPARSE_CSRC, dense_shape, values, (inner, outer))

    @classmethod
    def blocksparse_from_numpy(
        cls, dense_shape: Sequence[int], values: np.ndarray, indices: np.ndarray, ort_device: Any
    ) -> SparseTensor:
        """Block-sparse: ``values`` holds the dense blocks, ``indices`` their block coordinates."""
        _host_device(ort_device)
        return cls(
            OrtSparseFormat.ORT_SPARSE_BLOCK_SPARSE,
            dense_shape,
            np.asarray(values),
            (_indices(indices, "indices"),),
        )

    def format(self) -> OrtSparseFormat:
        return self._format

    def dense_shape(self) -> list[int]:
        return list(self._shape)

    def values(self) -> np.ndarray:
        """The non-zero values, read-only."""
        return _read_only(self._values)

    def _view(self, wanted: OrtSparseFormat, name: str) -> _IndexView:
        if self._format != wanted:
            raise RuntimeFailure(
                f"This sparse tensor does not contain {name} format; it is {self._format.name}"
            )
        return _IndexView(*self._indices)

    def as_coo_view(self) -> _IndexView:
        return self._view(OrtSparseFormat.ORT_SPARSE_COO, "COO")

    def as_csrc_view(self) -> _IndexView:
        return self._view(OrtSparseFormat.ORT_SPARSE_CSRC, "CSR(C)")

    def as_blocksparse_view(self) -> _IndexView:
        return self._view(OrtSparseFormat.ORT_SPARSE_BLOCK_SPARSE, "BlockSparse")

    def to_cuda(self, ort_device: Any) -> SparseTensor:
        raise RuntimeFailure(
            "Cuda is not available: nxrt's EPs keep no sparse tensors in device memory; "
            "compute with the dense tensor instead"
        )

    def element_type(self) -> int:
        """The values' ONNX element type number."""
        if self._values.dtype.kind in "OSU":
            return onnx.TensorProto.STRING
        return int(onnx.helper.np_dtype_to_tensor_dtype(self._values.dtype))

    def data_type(self) -> str:
        """``sparse_tensor(float)``, as onnxruntime names the type."""
        return "sparse_" + type_string(self.element_type())

    def device_name(self) -> str:
        return "cpu"

    def __repr__(self) -> str:
        return f"SparseTensor({self._format.name}, {self.data_type()}, shape={self._shape})"


__all__ = ["OrtSparseFormat", "SparseTensor"]

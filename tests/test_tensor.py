"""Tensor views: zero-copy wrapping and the checks done on construction."""

from __future__ import annotations

import mmap
import sys
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest

from nxrt.errors import AlignmentError, InvalidArgument, InvalidTensorView
from nxrt.tensor import ExternalMmapRegion, TensorMut, TensorView


def test_views_share_memory_with_the_array() -> None:
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    view = TensorView(data)
    assert np.shares_memory(view.array, data)
    assert view.shape == (3, 4) and view.dtype == np.float32 and view.nbytes == 48
    assert not view.array.flags.writeable
    assert data.flags.writeable, "wrapping must not change the caller's array"
    out = TensorMut(data)
    out.array[0, 0] = 7.0
    assert data[0, 0] == 7.0
    assert np.shares_memory(np.asarray(out), data)
    assert np.shares_memory(out.as_view().array, data)


def test_non_contiguous_arrays_are_viewed_as_they_are() -> None:
    data = np.arange(20, dtype=np.int64).reshape(4, 5)
    view = TensorView(data[:, ::2].T)
    assert view.shape == (3, 4)
    assert np.shares_memory(view.array, data)
    np.testing.assert_array_equal(view.array, data[:, ::2].T)


def test_raw_buffer_with_dtype_shape_strides_and_offset() -> None:
    raw = bytearray(np.arange(8, dtype=np.int32).tobytes())
    view = TensorView(raw, dtype=np.int32, shape=(2, 3), offset=8)
    np.testing.assert_array_equal(view.array, [[2, 3, 4], [5, 6, 7]])
    column = TensorView(raw, dtype="int32", shape=(4,), strides=(8,), offset=4)
    np.testing.assert_array_equal(column.array, [1, 3, 5, 7])
    backwards = TensorView(raw, dtype=np.int32, shape=(3,), strides=(-4,), offset=8)
    np.testing.assert_array_equal(backwards.array, [2, 1, 0])
    typed = TensorMut(raw, dtype=ir.DataType.INT32, shape=(8,))
    typed.array[0] = 99
    assert np.frombuffer(raw, dtype=np.int32)[0] == 99


def test_short_buffer_is_refused() -> None:
    with pytest.raises(InvalidTensorView, match="buffer has 16 bytes"):
        TensorView(bytes(16), dtype=np.float32, shape=(5,))
    with pytest.raises(InvalidTensorView, match="needs 20"):
        TensorView(bytes(16), dtype=np.float32, shape=(4,), offset=4)
    with pytest.raises(InvalidTensorView, match="before the start"):
        TensorView(bytes(16), dtype=np.float32, shape=(2,), strides=(-4,))


def test_overflowing_extent_is_refused() -> None:
    with pytest.raises(InvalidTensorView, match="overflow"):
        TensorView(bytes(16), dtype=np.float64, shape=(sys.maxsize // 2, 4))
    with pytest.raises(InvalidTensorView, match="overflow"):
        TensorView(bytes(16), dtype=np.uint8, shape=(2,), strides=(sys.maxsize,))


def test_misaligned_offset_raises_alignment_error() -> None:
    raw = np.zeros(32, dtype=np.uint8)
    with pytest.raises(AlignmentError) as info:
        TensorView(raw, dtype=np.float32, shape=(2,), offset=2)
    address = raw.__array_interface__["data"][0] + 2
    assert f"{address:#x}" in str(info.value) and "4 bytes" in str(info.value)
    with pytest.raises(AlignmentError, match="stride 6"):
        TensorView(raw, dtype=np.float32, shape=(2,), strides=(6,))
    misaligned = raw[1:9].view(np.float32)
    with pytest.raises(AlignmentError):
        TensorView(misaligned)


def test_bad_shapes_dtypes_and_strides() -> None:
    with pytest.raises(InvalidTensorView, match="negative dimension -1"):
        TensorView(bytes(16), dtype=np.float32, shape=(-1, 4))
    with pytest.raises(InvalidTensorView, match="unknown dtype"):
        TensorView(bytes(16), dtype="not-a-dtype", shape=(1,))
    with pytest.raises(InvalidTensorView, match="fixed-size"):
        TensorView(bytes(16), dtype=object, shape=(1,))
    with pytest.raises(InvalidTensorView, match="2 strides given for a 1-d"):
        TensorView(bytes(16), dtype=np.float32, shape=(4,), strides=(4, 4))
    with pytest.raises(InvalidTensorView, match="needs a dtype"):
        TensorView(bytes(16), shape=(4,))
    with pytest.raises(InvalidTensorView, match="not a numpy array"):
        TensorView([1, 2, 3], dtype=np.int64, shape=(3,))


def test_tensor_mut_refuses_read_only_memory() -> None:
    with pytest.raises(InvalidTensorView, match="read-only"):
        TensorMut(bytes(16), dtype=np.float32, shape=(4,))
    frozen = np.zeros(4)
    frozen.flags.writeable = False
    with pytest.raises(InvalidTensorView, match="read-only"):
        TensorMut(frozen)
    assert TensorView(frozen).shape == (4,)


def test_dlpack_round_trip() -> None:
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    view = TensorView(data)
    assert view.__dlpack_device__() == data.__dlpack_device__()
    back = np.from_dlpack(view)
    assert np.shares_memory(back, data)
    np.testing.assert_array_equal(back, data)

    class Producer:
        """A foreign DLPack producer (not an ndarray)."""

        def __init__(self, array: np.ndarray) -> None:
            self._array = array

        def __dlpack__(self, **kwargs: object) -> object:
            return self._array.__dlpack__(**kwargs)

        def __dlpack_device__(self) -> tuple[int, int]:
            return self._array.__dlpack_device__()

    out = TensorMut(Producer(data))
    assert np.shares_memory(out.array, data)
    out.array[1, 2] = -1.0
    assert data[1, 2] == -1.0
    assert np.shares_memory(np.from_dlpack(out), data)


def test_mmap_backed_view_of_a_file(tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    payload = np.arange(10, dtype=np.float32)
    path.write_bytes(b"\0" * 16 + payload.tobytes())
    with path.open("rb") as handle:
        mapping = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    region = ExternalMmapRegion(mapping_id=0, offset=16, len=payload.nbytes)
    view = TensorView(mapping, dtype=np.float32, shape=(2, 5), offset=region.offset)
    np.testing.assert_array_equal(view.array.ravel(), payload)
    assert view.array.base is not None
    with pytest.raises(InvalidTensorView, match="read-only"):
        TensorMut(mapping, dtype=np.float32, shape=(10,), offset=16)
    with pytest.raises(InvalidTensorView, match="buffer has"):
        TensorView(mapping, dtype=np.float32, shape=(11,), offset=16)
    del view
    mapping.close()


def test_writable_mmap_is_written_through(tmp_path: Path) -> None:
    path = tmp_path / "out.bin"
    path.write_bytes(bytes(16))
    with path.open("r+b") as handle, mmap.mmap(handle.fileno(), 0) as mapping:
        out = TensorMut(mapping, dtype=np.int32, shape=(4,))
        out.array[:] = [1, 2, 3, 4]
        del out
        mapping.flush()
    assert np.frombuffer(path.read_bytes(), dtype=np.int32).tolist() == [1, 2, 3, 4]


def test_external_mmap_region_validates() -> None:
    region = ExternalMmapRegion(1, 8, 24)
    assert region.end == 32
    assert region == ExternalMmapRegion(mapping_id=1, offset=8, len=24)
    with pytest.raises(InvalidArgument, match="offset must be >= 0"):
        ExternalMmapRegion(1, -8, 24)
    with pytest.raises(InvalidArgument, match="integer"):
        ExternalMmapRegion(1, 8.0, 24)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="overflows"):
        ExternalMmapRegion(1, 2**64 - 1, 1)

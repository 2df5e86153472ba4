"""``OrtValue``: a value and the device its data lives on, with onnxruntime's methods.

On the host an OrtValue holds the numpy array it was made from, without a
copy: a session reads it in place, and ``update_inplace`` writes into it. On
another device it holds that device's own array (an ``mx.array`` on an MLX
GPU, any DLPack producer), which a session passes to the EP that runs there
without a trip through the host. Values a model takes or returns that are
not tensors (sequences, maps) are held as the lists and dicts ``run`` uses.

Devices are named as onnxruntime names them (``"cpu"``, ``"cuda"``, ``"gpu"``...)
or by an installed EP's id or name (``"mlx"``): a value is placed on a device
by the first installed EP computing there (``copy_from_host``), and there is
no device no installed EP has (onnxruntime's error for a device its build
lacks).
"""

from __future__ import annotations

import ctypes
import enum
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from nxrt.errors import InvalidArgument, RuntimeFailure
from nxrt.ort.sparse import SparseTensor
from nxrt.pipeline.model import numpy_dtype, type_string
from nxrt.tensor import TensorView

if TYPE_CHECKING:
    from nxrt.provider import ExecutionProvider

HOST = "cpu"
#: DLPack device types (``__dlpack_device__()[0]``) by onnxruntime's device names.
_DLPACK_DEVICES = {
    1: "cpu",
    2: "cuda",
    3: "cpu",
    4: "gpu",
    7: "gpu",
    8: "gpu",
    10: "gpu",
    13: "cpu",
}
#: onnxruntime's device names and the nxrt device type an EP declares for each.
_DEVICE_TYPES = {"cpu": "cpu", "cuda": "gpu", "gpu": "gpu", "dml": "gpu", "webgpu": "gpu"}


class OrtMemType(enum.IntEnum):
    """onnxruntime's memory kinds of an input or output."""

    CPU_INPUT = -2
    CPU_OUTPUT = -1
    CPU = -1
    DEFAULT = 0


class OrtAllocatorType(enum.IntEnum):
    """onnxruntime's allocator kinds; nxrt keeps no arena, so its memory is a device
    allocator's (what onnxruntime reports with ``enable_cpu_mem_arena`` off)."""

    INVALID = -1
    ORT_DEVICE_ALLOCATOR = 0
    ORT_ARENA_ALLOCATOR = 1


class OrtDeviceMemoryType(enum.IntEnum):
    """A device's memory: its own (``DEFAULT``) or memory the host can read (pinned)."""

    DEFAULT = 0
    HOST_ACCESSIBLE = 5


class OrtMemoryInfoDeviceType(enum.IntEnum):
    """The kind of device a :meth:`OrtMemoryInfo.create_v2` memory belongs to."""

    CPU = 0
    GPU = 1
    FPGA = 2
    NPU = 3


class OrtMemoryInfo:
    """Where an input or output of a session lives (``get_input_memory_infos``)."""

    def __init__(
        self,
        name: str,
        allocator_type: OrtAllocatorType = OrtAllocatorType.ORT_DEVICE_ALLOCATOR,
        device_id: int = 0,
        mem_type: OrtMemType = OrtMemType.DEFAULT,
    ) -> None:
        self.name = name
        self.allocator_type = OrtAllocatorType(allocator_type)
        self.device_id = int(device_id)
        self.mem_type = OrtMemType(mem_type)
        self.device_vendor_id = 0
        #: CPU_INPUT and CPU_OUTPUT memory is the host-readable memory of its device.
        self.device_mem_type = (
            OrtDeviceMemoryType.DEFAULT
            if self.mem_type == OrtMemType.DEFAULT
            else OrtDeviceMemoryType.HOST_ACCESSIBLE
        )

    @staticmethod
    def create_v2(
        name: str,
        device_type: OrtMemoryInfoDeviceType,
        vendor_id: int,
        device_id: int,
        device_mem_type: OrtDeviceMemoryType,
        alignment: int = 0,
        allocator_type: OrtAllocatorType = OrtAllocatorType.ORT_DEVICE_ALLOCATOR,
    ) -> OrtMemoryInfo:
        """onnxruntime's newer constructor, by device kind, vendor and memory kind (the
        alignment is onnxruntime's allocators'; nxrt's EPs align as their kernels need)."""
        OrtMemoryInfoDeviceType(device_type)
        memory = OrtDeviceMemoryType(device_mem_type)
        kind = OrtMemType.DEFAULT if memory == OrtDeviceMemoryType.DEFAULT else OrtMemType.CPU
        info = OrtMemoryInfo(name, allocator_type, device_id, kind)
        info.device_vendor_id = int(vendor_id)
        return info

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OrtMemoryInfo) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def _key(self) -> tuple[Any, ...]:
        return (
            self.name,
            self.allocator_type,
            self.device_id,
            self.mem_type,
            self.device_vendor_id,
        )

    def __repr__(self) -> str:
        return (
            f"OrtMemoryInfo(name={self.name!r}, device_id={self.device_id}, "
            f"mem_type={self.mem_type.name}, allocator_type={self.allocator_type.name})"
        )


def element_dtype(element_type: Any) -> np.dtype:
    """A numpy dtype from a numpy type or an ONNX element type number."""
    if isinstance(element_type, (int, np.integer)) and not isinstance(element_type, bool):
        return numpy_dtype(int(element_type))
    return np.dtype(element_type)


def onnx_element_type(dtype: np.dtype) -> int:
    """The ONNX element type number of a numpy dtype (strings of every kind: STRING)."""
    import onnx_ir as ir

    if dtype.kind in "OSU":
        return onnx.TensorProto.STRING
    try:
        return int(ir.DataType.from_numpy(dtype))  # ml_dtypes' (bfloat16...) are kind V too
    except TypeError:
        if dtype.kind == "V":
            return onnx.TensorProto.STRING
        raise


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _Capsule:
    """A bare DLPack capsule as the producer object ``np.from_dlpack`` and the device EPs
    take: its device read from the ``DLTensor`` the capsule holds."""

    #: Where the DLTensor's device sits in the capsule's struct, by capsule name: after the
    #: data pointer in ``DLManagedTensor``; after version, context, deleter and flags, then
    #: the data pointer, in ``DLManagedTensorVersioned``.
    _DEVICE_AT = {b"dltensor": 8, b"dltensor_versioned": 40}

    #: Python's capsule functions, typed here (not on the shared ``ctypes.pythonapi``).
    _get_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(
        ("PyCapsule_GetName", ctypes.pythonapi)
    )
    _get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
        ("PyCapsule_GetPointer", ctypes.pythonapi)
    )

    def __init__(self, capsule: Any) -> None:
        name = _Capsule._get_name(capsule)
        if name not in self._DEVICE_AT:
            raise InvalidArgument(
                f"the capsule is {name!r}, not an unused DLPack capsule ('dltensor'); a capsule "
                "can be consumed once: call __dlpack__() again for a new one"
            )
        pointer = _Capsule._get_pointer(capsule, name)
        device = _DLDevice.from_address(pointer + self._DEVICE_AT[name])
        self.capsule, self.device = capsule, (int(device.device_type), int(device.device_id))

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.device


_device_eps: dict[str, ExecutionProvider] = {}
_device_eps_lock = threading.Lock()


def device_ep(device: str) -> ExecutionProvider:
    """An initialised EP computing on ``device`` (a device name or an EP's id or name),
    made once per device name: OrtValues use it to place values on its device."""
    with _device_eps_lock:
        ep = _device_eps.get(device)
        if ep is None:
            ep = _device_eps[device] = _start_device_ep(device)
        return ep


def _start_device_ep(device: str) -> ExecutionProvider:
    from nxrt import default_plugin_manager
    from nxrt.host import Host
    from nxrt.pipeline.stages import instantiate_ep

    host = Host(default_plugin_manager())
    registry = host.build_registry()
    descriptor = registry.resolve(device)
    if descriptor is None:
        wanted = _DEVICE_TYPES.get(device.lower(), device.lower())
        for ep_id in registry.default_order():
            if registry.providers[ep_id].device_type == wanted:
                descriptor = registry.providers[ep_id]
                break
    if descriptor is None:
        devices = sorted({d.device_type for d in registry.providers.values()})
        raise RuntimeFailure(
            f"can't allocate memory on device {device!r}: no installed EP computes there "
            f"(installed EPs compute on {devices}); install the EP for that device"
        )
    from nxrt.host_parallel import HostParallel

    return instantiate_ep(descriptor, {}, HostParallel(1), 1)


class OrtValue:
    """A tensor (or a sequence, a map, an absent optional) and the device holding it.

    Make one with the class methods, as with onnxruntime; the constructor takes
    the value as nxrt holds it and its device name.
    """

    def __init__(
        self,
        value: Any,
        device: str = HOST,
        device_id: int = 0,
        ep: ExecutionProvider | None = None,
    ) -> None:
        self._value = value
        self._device = device
        self._device_id = device_id
        self._ep = ep  # the EP whose device holds the value (brings it to the host)

    # -- making one ---------------------------------------------------------------------------
    @classmethod
    def ortvalue_from_numpy(
        cls,
        numpy_obj: np.ndarray,
        /,
        device_type: str = HOST,
        device_id: int = 0,
        vendor_id: int = -1,
    ) -> OrtValue:
        """A value over ``numpy_obj``: on the host, the array itself (no copy, so writes to
        either are seen by both); on another device, a copy there."""
        array = np.asarray(numpy_obj)
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
        if device_type.lower() == HOST:
            return cls(array)
        ep = device_ep(device_type)
        return cls(ep.copy_from_host(array), ep.device_type, device_id, ep)

    @classmethod
    def ortvalue_from_numpy_with_onnx_type(
        cls, data: np.ndarray, /, onnx_element_type: int
    ) -> OrtValue:
        """The same bytes seen as ONNX element type ``onnx_element_type`` (e.g. bfloat16 data
        held in a uint16 array), without a copy."""
        dtype = numpy_dtype(int(onnx_element_type))
        if dtype.itemsize != data.dtype.itemsize:
            raise InvalidArgument(
                f"element type {type_string(int(onnx_element_type))} has {dtype.itemsize} "
                f"bytes, the array's {data.dtype} has {data.dtype.itemsize}; pass an array "
                "of the same element size"
            )
        return cls(np.ascontiguousarray(data).view(dtype))

    @classmethod
    def ortvalue_from_shape_and_type(
        cls,
        shape: Sequence[int],
        element_type: Any,
        device_type: str = HOST,
        device_id: int = 0,
        vendor_id: int = -1,
        memory_info: OrtMemoryInfo | None = None,
    ) -> OrtValue:
        """A zero-filled tensor of ``shape`` and ``element_type`` (numpy type or ONNX number)."""
        if memory_info is not None:
            device_type = memory_info.name.lower()
        array = np.zeros([int(d) for d in shape], element_dtype(element_type))
        return cls.ortvalue_from_numpy(array, device_type, device_id)

    @classmethod
    def from_dlpack(cls, data: Any, /) -> OrtValue:
        """A value sharing ``data``'s memory: any DLPack producer (numpy, MLX, torch...) or
        a DLPack capsule (what ``__dlpack__()`` returns, consumed by this call).

        A host producer is seen through numpy, zero-copy; a device producer is
        kept as it is, so a session hands it to the EP on that device."""
        if type(data).__name__ == "PyCapsule":
            data = _Capsule(data)
        device = HOST
        if hasattr(data, "__dlpack_device__"):
            kind, device_id = data.__dlpack_device__()
            device = _DLPACK_DEVICES.get(int(kind), "gpu")
        if device == HOST:
            return cls(TensorView(data).array)
        return cls(data, device, int(device_id))

    # -- what it holds --------------------------------------------------------------------------
    @property
    def value(self) -> Any:
        """The value as sessions take it: a numpy array, a device array, a list, a dict."""
        return self._value

    def numpy(self) -> np.ndarray:
        """The tensor as a numpy array: on the host the held array itself, else a copy."""
        if not self.is_tensor():
            raise InvalidArgument(
                f"numpy() is for tensors; this OrtValue holds {self.data_type()} "
                "(read .value for sequences and maps)"
            )
        if isinstance(self._value, np.ndarray):
            return self._value
        if self._ep is not None:
            return self._ep.copy_to_host(self._value)
        return np.asarray(self._value)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        array = self.numpy()
        if copy:
            return np.array(array, dtype=dtype, copy=True)
        return array if dtype is None else array.astype(dtype, copy=False)

    def __dlpack__(self, *, stream: Any = None, **kwargs: Any) -> Any:
        if isinstance(self._value, np.ndarray) or not hasattr(self._value, "__dlpack__"):
            return self.numpy().__dlpack__(stream=stream, **kwargs)
        return self._value.__dlpack__(stream=stream, **kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        if hasattr(self._value, "__dlpack_device__") and not isinstance(self._value, np.ndarray):
            return self._value.__dlpack_device__()
        return (1, 0)

    def to_dlpack(self) -> Any:
        """A DLPack capsule of the tensor (onnxruntime's capi name of ``__dlpack__()``)."""
        return self.__dlpack__()

    @property
    def _ortvalue(self) -> OrtValue:
        """onnxruntime's inner value object; nxrt's OrtValue is its own (code reaching
        ``value._ortvalue.data_ptr()`` works unchanged)."""
        return self

    def is_tensor(self) -> bool:
        return self._value is not None and not isinstance(
            self._value, (list, tuple, dict, SparseTensor)
        )

    def is_tensor_sequence(self) -> bool:
        return isinstance(self._value, (list, tuple))

    def is_sparse_tensor(self) -> bool:
        return isinstance(self._value, SparseTensor)

    @classmethod
    def ort_value_from_sparse_tensor(cls, sparse_tensor: SparseTensor) -> OrtValue:
        """A value holding ``sparse_tensor`` (no copy)."""
        if not isinstance(sparse_tensor, SparseTensor):
            raise TypeError(f"expected a SparseTensor, got {type(sparse_tensor).__name__}")
        return cls(sparse_tensor)

    def as_sparse_tensor(self) -> SparseTensor:
        if not isinstance(self._value, SparseTensor):
            raise RuntimeFailure(
                "This OrtValue does not contain SparseTensor. Check data_type() value: "
                f"{self.data_type()}"
            )
        return self._value

    def has_value(self) -> bool:
        """False for an absent optional."""
        return self._value is not None

    def shape(self) -> list[int]:
        if isinstance(self._value, SparseTensor):
            return self._value.dense_shape()
        if not self.is_tensor():
            raise InvalidArgument(f"shape() is for tensors; this OrtValue holds {self.data_type()}")
        shape = getattr(self._value, "shape", None)
        return [int(d) for d in (shape if shape is not None else self.numpy().shape)]

    def _dtype(self) -> np.dtype:
        dtype = getattr(self._value, "dtype", None)
        if isinstance(dtype, np.dtype):
            return dtype
        if dtype is not None:  # a device array's: mlx.core.float32, torch.float16 ...
            try:
                return np.dtype(str(dtype).rsplit(".", 1)[-1])
            except TypeError:
                pass
        return self.numpy().dtype

    def element_type(self) -> int:
        """The ONNX element type number of a tensor's elements."""
        if isinstance(self._value, SparseTensor):
            return self._value.element_type()
        return onnx_element_type(self._dtype())

    def data_type(self) -> str:
        """onnxruntime's type string: ``tensor(float)``, ``seq(tensor(int64))``..."""
        if self._value is None:
            return "optional"
        if isinstance(self._value, dict):
            return "map"
        if isinstance(self._value, SparseTensor):
            return self._value.data_type()
        if isinstance(self._value, (list, tuple)):
            inner = OrtValue(self._value[0]).data_type() if self._value else "tensor(undefined)"
            return f"seq({inner})"
        return type_string(self.element_type())

    def device_name(self) -> str:
        return self._device

    def tensor_size_in_bytes(self) -> int:
        return int(np.prod(self.shape(), dtype=np.int64)) * self._dtype().itemsize

    def data_ptr(self) -> int:
        """The address of the first element (host tensors only)."""
        if not isinstance(self._value, np.ndarray):
            raise RuntimeFailure(
                f"data_ptr() is for host tensors; this value lives on {self._device!r}"
            )
        return int(self._value.ctypes.data)

    def update_inplace(self, data: np.ndarray | OrtValue) -> None:
        """Copy ``data`` into this value's memory (same element count), so everything bound
        to it sees the new contents; a device array that cannot be written in place (MLX
        arrays are immutable) is replaced by one holding ``data``."""
        source = data.numpy() if isinstance(data, OrtValue) else data
        if not isinstance(source, np.ndarray):
            raise TypeError("data must be a numpy.ndarray or an OrtValue")
        if source.size != int(np.prod(self.shape(), dtype=np.int64)):
            raise RuntimeFailure(
                f"update_inplace got {source.size} elements for an OrtValue of shape "
                f"{self.shape()}; pass an array of the same size"
            )
        if isinstance(self._value, np.ndarray):
            np.copyto(self._value, source.reshape(self._value.shape), casting="same_kind")
            return
        if self._ep is None:
            self._ep = device_ep(self._device)
        self._value = self._ep.copy_from_host(np.ascontiguousarray(source).reshape(self.shape()))

    def __repr__(self) -> str:
        if self.is_tensor():
            return f"OrtValue({self.data_type()}, shape={self.shape()}, device={self._device!r})"
        return f"OrtValue({self.data_type()})"


def copy_tensors(src: Sequence[OrtValue], dst: Sequence[OrtValue], stream: Any = None) -> None:
    """Copy each of ``src`` into the memory of the ``dst`` at the same place (sizes must
    match); a device EP's values go through its copies."""
    if len(src) != len(dst):
        raise InvalidArgument(f"copy_tensors got {len(src)} sources for {len(dst)} targets")
    for source, target in zip(src, dst):
        target.update_inplace(source)


__all__ = [
    "OrtAllocatorType",
    "OrtDeviceMemoryType",
    "OrtMemType",
    "OrtMemoryInfo",
    "OrtMemoryInfoDeviceType",
    "OrtValue",
    "copy_tensors",
]

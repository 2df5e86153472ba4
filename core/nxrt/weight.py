"""Capability-negotiated lazy weight handles for executor-to-EP delivery.

A large model's weights should not all be read into memory just because one
execution provider might page them. The executor therefore hands each EP a
:class:`WeightHandle`: resident bytes today, or a lazy handle (mmap regions
plus a deferred materializer) when the weight sits at a lazy-weight boundary.
Negotiation decides what an EP actually receives: an EP that advertises the
``"nxrt"`` capability gets the lazy handle and can page it itself; every other
EP gets the materialised :class:`ResidentWeight`, so stock EPs keep working
unchanged. :class:`LazyDeviceWeightBinder` is the seam for device paging; the
:class:`HostOnlyBinder` refuses it and points at the host route.
"""

from __future__ import annotations

import enum
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar, runtime_checkable

import numpy as np

from nxrt.errors import InvalidResident, MissingRegions, Unsupported

if TYPE_CHECKING:
    # onnx_ir (and nxrt.tensor, which imports it) pull in onnx and ml_dtypes, about a
    # second; plugins import this module for ExecutionProviderCapabilities while they are
    # discovered, so both are imported where a weight is made, not at module import.
    import onnx_ir as ir

    from nxrt.tensor import ExternalMmapRegion

#: Capability flag advertised by paging-aware execution providers.
NXRT_WEIGHT_PAGING_CAPABILITY = "nxrt"

# Rust's ``isize::MAX`` / ``usize::MAX`` on this platform: the largest element
# count and byte count a buffer may have, and the overflow bound of the products.
_ISIZE_MAX = sys.maxsize
_USIZE_MAX = 2 * sys.maxsize + 1


#: Prefix of the capability flag carrying an EP's device-aware preference.
PREFERENCE_PREFIX = "preference:"


@dataclass(frozen=True, init=False)
class ExecutionProviderCapabilities:
    """The capability flags an EP advertises; an immutable set of strings."""

    flags: frozenset[str]

    def __init__(self, flags: Iterable[str] = ()) -> None:
        if isinstance(flags, str):
            flags = (flags,)
        flags = frozenset(flags)
        for flag in flags:
            if not isinstance(flag, str):
                raise TypeError(f"capability flags must be strings, got {flag!r}")
        object.__setattr__(self, "flags", flags)

    @classmethod
    def stock(cls) -> ExecutionProviderCapabilities:
        """No flags: an EP that only understands resident weights."""
        return cls()

    @classmethod
    def nxrt_weight_paging(cls) -> ExecutionProviderCapabilities:
        """An EP that pages lazy weights itself."""
        return cls.from_flags([NXRT_WEIGHT_PAGING_CAPABILITY])

    @classmethod
    def from_flags(cls, flags: Iterable[str]) -> ExecutionProviderCapabilities:
        return cls(flags)

    def advertises(self, capability: str) -> bool:
        return capability in self.flags

    @property
    def preference(self) -> int:
        """How strongly the EP should come first on this device (flag ``preference:N``).

        Default selection orders EPs by it before measuring, and the
        ``PRIORITY`` policy by it alone, so an EP declares it from the device
        it actually got (mlx: high on a GPU, low on a CPU). 0 when absent.
        """
        for flag in self.flags:
            if flag.startswith(PREFERENCE_PREFIX):
                try:
                    return int(flag[len(PREFERENCE_PREFIX) :])
                except ValueError:
                    return 0
        return 0

    def __repr__(self) -> str:
        return f"ExecutionProviderCapabilities(flags={sorted(self.flags)!r})"


def _as_data_type(dtype: Any) -> ir.DataType:
    import onnx_ir as ir

    if isinstance(dtype, ir.DataType):
        return dtype
    if isinstance(dtype, int) and not isinstance(dtype, bool):
        try:
            return ir.DataType(dtype)
        except ValueError:
            raise InvalidResident(f"unknown ONNX data type {dtype}") from None
    try:
        return ir.DataType.from_numpy(np.dtype(dtype))
    except (TypeError, ValueError):
        raise InvalidResident(f"unknown data type {dtype!r}") from None


def _checked_shape_product(shape: tuple[int, ...]) -> int:
    """Element count of ``shape``; zero dims give 0, overflow past isize max is refused."""
    product = 1
    has_zero = False
    for dimension in shape:
        if dimension == 0:
            has_zero = True
        else:
            product *= dimension
            if product > _ISIZE_MAX:
                raise InvalidResident("resident weight element count overflow")
    return 0 if has_zero else product


def _checked_storage_bytes(dtype: ir.DataType, elements: int) -> int | None:
    """Storage bytes of ``elements`` values, sub-byte types packed; None on overflow."""
    try:
        bits = dtype.bitwidth
    except TypeError:
        raise InvalidResident(f"data type {dtype.name} has no fixed storage size") from None
    if bits % 8 == 0:
        total = elements * (bits // 8)
        return None if total > _USIZE_MAX else total
    total_bits = elements * bits
    if total_bits + 7 > _USIZE_MAX:
        return None
    return (total_bits + 7) // 8


def _byte_view(data: Any) -> memoryview:
    """A flat, read-only ``uint8`` memoryview over ``data`` without copying it."""
    try:
        view = memoryview(data)
    except TypeError:
        raise InvalidResident(
            f"resident weight bytes must support the buffer protocol, got {type(data).__name__}"
        ) from None
    if not view.c_contiguous:
        raise InvalidResident("resident weight bytes must be contiguous")
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view.toreadonly()


class ResidentWeight:
    """A weight whose bytes are in host memory, checked against its dtype and shape.

    ``data`` may be ``bytes``, ``bytearray``, a ``memoryview``, an mmap or a
    contiguous numpy buffer; it is kept by reference, never copied.
    """

    __slots__ = ("_bytes", "_dtype", "_shape")

    def __init__(self, dtype: ir.DataType | Any, shape: Iterable[int], data: Any) -> None:
        dtype = _as_data_type(dtype)
        dims: list[int] = []
        for dimension in shape:
            if isinstance(dimension, bool) or not isinstance(dimension, (int, np.integer)):
                raise InvalidResident(f"dimension {dimension!r} is not an integer")
            if dimension < 0:
                raise InvalidResident(f"dimension {int(dimension)} is negative")
            dims.append(int(dimension))
        elements = _checked_shape_product(tuple(dims))
        expected = _checked_storage_bytes(dtype, elements)
        if expected is None:
            raise InvalidResident("resident weight byte count overflow")
        if expected > _ISIZE_MAX:
            raise InvalidResident(
                f"resident weight byte count exceeds the largest buffer size ({_ISIZE_MAX})"
            )
        view = _byte_view(data)
        if view.nbytes != expected:
            raise InvalidResident(f"resident weight has {view.nbytes} bytes, expected {expected}")
        self._dtype = dtype
        self._shape = tuple(dims)
        self._bytes = view

    @property
    def dtype(self) -> ir.DataType:
        return self._dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    def bytes(self) -> memoryview:
        """The stored bytes as a read-only ``uint8`` memoryview (no copy)."""
        return self._bytes

    def numpy(self) -> np.ndarray:
        """A read-only numpy view of the weight; sub-byte types are packed and refused."""
        if self._dtype.bitwidth % 8 != 0:
            raise Unsupported(
                f"{self._dtype.name} is stored packed ({self._dtype.bitwidth} bits per value); "
                "read bytes() and unpack it"
            )
        return np.frombuffer(self._bytes, dtype=self._dtype.numpy()).reshape(self._shape)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ResidentWeight):
            return NotImplemented
        return (
            self._dtype == other._dtype
            and self._shape == other._shape
            and self._bytes == other._bytes
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"ResidentWeight(dtype={self._dtype.name}, shape={list(self._shape)}, "
            f"bytes=<{self._bytes.nbytes} bytes>)"
        )


class LazyWeightBoundary(enum.Enum):
    """Ops at which a weight may stay lazy and be paged by the EP."""

    #: ``pkg.nxrt::BlockQuantizedMoE``, the offload binding boundary.
    BLOCK_QUANTIZED_MOE = "pkg.nxrt::BlockQuantizedMoE"

    def matches(self, domain: str, op_type: str) -> bool:
        return (
            self is LazyWeightBoundary.BLOCK_QUANTIZED_MOE and f"{domain}::{op_type}" == self.value
        )


@runtime_checkable
class ResidentWeightMaterializer(Protocol):
    """Builds the resident form of a lazy weight when a host copy is needed."""

    def __call__(self) -> ResidentWeight: ...


class LazyWeight:
    """A weight left in its mmap regions, with a deferred route to resident bytes."""

    __slots__ = ("_materializer", "boundary", "regions")

    def __init__(
        self,
        boundary: LazyWeightBoundary,
        regions: Iterable[ExternalMmapRegion],
        resident_materializer: ResidentWeightMaterializer | Callable[[], ResidentWeight],
    ) -> None:
        if not isinstance(boundary, LazyWeightBoundary):
            raise TypeError(f"boundary must be a LazyWeightBoundary, got {boundary!r}")
        from nxrt.tensor import ExternalMmapRegion

        regions = tuple(regions)
        if not regions:
            raise MissingRegions()
        for region in regions:
            if not isinstance(region, ExternalMmapRegion):
                raise TypeError(f"regions must be ExternalMmapRegion values, got {region!r}")
        if not callable(resident_materializer):
            materialize = getattr(resident_materializer, "materialize", None)
            if not callable(materialize):
                raise TypeError("resident_materializer must be callable: () -> ResidentWeight")
            resident_materializer = materialize
        self.boundary = boundary
        #: Validated external mmap ranges that back this initializer.
        self.regions: tuple[ExternalMmapRegion, ...] = regions
        self._materializer = resident_materializer

    @classmethod
    def block_quantized_moe(
        cls,
        regions: Iterable[ExternalMmapRegion],
        resident_materializer: ResidentWeightMaterializer | Callable[[], ResidentWeight],
    ) -> LazyWeight:
        """A lazy weight at the ``pkg.nxrt::BlockQuantizedMoE`` boundary."""
        return cls(LazyWeightBoundary.BLOCK_QUANTIZED_MOE, regions, resident_materializer)

    def materialize(self) -> ResidentWeight:
        """Materialise the unchanged stock-EP resident behaviour."""
        weight = self._materializer()
        if not isinstance(weight, ResidentWeight):
            raise InvalidResident(
                f"materializer returned {type(weight).__name__}, expected ResidentWeight"
            )
        return weight

    def __repr__(self) -> str:
        return (
            f"LazyWeight(boundary={self.boundary}, regions={list(self.regions)!r}, "
            "resident_materializer=<deferred>)"
        )


B_co = TypeVar("B_co", covariant=True)


@runtime_checkable
class LazyDeviceWeightBinder(Protocol[B_co]):
    """EP seam for live device paging of lazy weights."""

    def bind_block_quantized_moe(self, weight: LazyWeight) -> B_co: ...


@dataclass(frozen=True)
class HostOnlyBinder:
    """A binder for EPs without device paging: callers must take the host route."""

    def bind_block_quantized_moe(self, weight: LazyWeight) -> None:
        raise Unsupported(
            "live device weight paging is not available on this EP; use materialize_host_fallback()"
        )


#: The name the weight-handle design gives the host-only binder.
Phase3aHostOnlyBinder = HostOnlyBinder


class WeightHandle:
    """General executor weight input: ``WeightHandle.Resident(w)`` or ``WeightHandle.Lazy(w)``.

    Resident today; lazy when the weight sits at a lazy boundary and an EP opts in.
    Match on it with ``isinstance`` or ``match handle: case WeightHandle.Lazy(weight): ...``.
    """

    __slots__ = ()

    if TYPE_CHECKING:
        Resident: ClassVar[type[ResidentWeightHandle]]
        Lazy: ClassVar[type[LazyWeightHandle]]
        weight: ResidentWeight | LazyWeight

    def __new__(cls, *args: Any, **kwargs: Any) -> WeightHandle:
        if cls is WeightHandle:
            raise TypeError("use WeightHandle.Resident(weight) or WeightHandle.Lazy(weight)")
        return super().__new__(cls)

    def negotiate(self, capabilities: ExecutionProviderCapabilities) -> NegotiatedWeight:
        """What an EP with ``capabilities`` receives: the lazy handle, or resident bytes."""
        if isinstance(self, ResidentWeightHandle):
            return NegotiatedResident(self.weight)
        assert isinstance(self, LazyWeightHandle)
        if capabilities.advertises(NXRT_WEIGHT_PAGING_CAPABILITY):
            return NegotiatedLazy(self.weight)
        return NegotiatedResident(self.weight.materialize())

    def is_lazy_for(self, capabilities: ExecutionProviderCapabilities) -> bool:
        return isinstance(self, LazyWeightHandle) and capabilities.advertises(
            NXRT_WEIGHT_PAGING_CAPABILITY
        )


@dataclass(frozen=True)
class ResidentWeightHandle(WeightHandle):
    weight: ResidentWeight

    def __post_init__(self) -> None:
        if not isinstance(self.weight, ResidentWeight):
            raise TypeError(f"WeightHandle.Resident needs a ResidentWeight, got {self.weight!r}")


@dataclass(frozen=True)
class LazyWeightHandle(WeightHandle):
    weight: LazyWeight

    def __post_init__(self) -> None:
        if not isinstance(self.weight, LazyWeight):
            raise TypeError(f"WeightHandle.Lazy needs a LazyWeight, got {self.weight!r}")


class NegotiatedWeight:
    """What an EP received: ``NegotiatedWeight.Resident(w)`` or ``NegotiatedWeight.Lazy(w)``."""

    __slots__ = ()

    if TYPE_CHECKING:
        Resident: ClassVar[type[NegotiatedResident]]
        Lazy: ClassVar[type[NegotiatedLazy]]
        weight: ResidentWeight | LazyWeight

    def __new__(cls, *args: Any, **kwargs: Any) -> NegotiatedWeight:
        if cls is NegotiatedWeight:
            raise TypeError(
                "use NegotiatedWeight.Resident(weight) or NegotiatedWeight.Lazy(weight)"
            )
        return super().__new__(cls)

    def materialize_host_fallback(self) -> ResidentWeight:
        """Explicit host route available to every executor and EP."""
        if isinstance(self, NegotiatedResident):
            return self.weight
        assert isinstance(self, NegotiatedLazy)
        return self.weight.materialize()

    def try_bind_device(self, binder: LazyDeviceWeightBinder[B_co]) -> B_co:
        """Bind a lazy weight to the device at ``pkg.nxrt::BlockQuantizedMoE`` binding time."""
        if isinstance(self, NegotiatedResident):
            raise Unsupported("resident weights do not require lazy device binding")
        assert isinstance(self, NegotiatedLazy)
        return binder.bind_block_quantized_moe(self.weight)


@dataclass(frozen=True)
class NegotiatedResident(NegotiatedWeight):
    weight: ResidentWeight

    def __post_init__(self) -> None:
        if not isinstance(self.weight, ResidentWeight):
            raise TypeError(
                f"NegotiatedWeight.Resident needs a ResidentWeight, got {self.weight!r}"
            )


@dataclass(frozen=True)
class NegotiatedLazy(NegotiatedWeight):
    weight: LazyWeight

    def __post_init__(self) -> None:
        if not isinstance(self.weight, LazyWeight):
            raise TypeError(f"NegotiatedWeight.Lazy needs a LazyWeight, got {self.weight!r}")


def _attach(owner: type, name: str, variant: type) -> None:
    variant.__qualname__ = f"{owner.__name__}.{name}"
    setattr(owner, name, variant)


_attach(WeightHandle, "Resident", ResidentWeightHandle)
_attach(WeightHandle, "Lazy", LazyWeightHandle)
_attach(NegotiatedWeight, "Resident", NegotiatedResident)
_attach(NegotiatedWeight, "Lazy", NegotiatedLazy)


def __getattr__(name: str) -> Any:
    """``ExternalMmapRegion``, re-exported from :mod:`nxrt.tensor` on first use (it imports
    onnx_ir, which discovery must not)."""
    if name == "ExternalMmapRegion":
        from nxrt.tensor import ExternalMmapRegion

        return ExternalMmapRegion
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "NXRT_WEIGHT_PAGING_CAPABILITY",
    "ExecutionProviderCapabilities",
    "ExternalMmapRegion",
    "HostOnlyBinder",
    "LazyDeviceWeightBinder",
    "LazyWeight",
    "LazyWeightBoundary",
    "LazyWeightHandle",
    "NegotiatedLazy",
    "NegotiatedResident",
    "NegotiatedWeight",
    "Phase3aHostOnlyBinder",
    "ResidentWeight",
    "ResidentWeightHandle",
    "ResidentWeightMaterializer",
    "WeightHandle",
]

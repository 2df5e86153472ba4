"""Weight handles: capability negotiation, the host fallback and resident validation."""

from __future__ import annotations

import sys

import numpy as np
import onnx_ir as ir
import pytest

from nxrt.errors import InvalidResident, MissingRegions, Unsupported, WeightHandleError
from nxrt.tensor import ExternalMmapRegion
from nxrt.weight import (
    NXRT_WEIGHT_PAGING_CAPABILITY,
    ExecutionProviderCapabilities,
    HostOnlyBinder,
    LazyDeviceWeightBinder,
    LazyWeight,
    LazyWeightBoundary,
    NegotiatedWeight,
    Phase3aHostOnlyBinder,
    ResidentWeight,
    WeightHandle,
)


def resident() -> ResidentWeight:
    return ResidentWeight(ir.DataType.UINT8, [4], bytes([1, 2, 3, 4]))


def region() -> ExternalMmapRegion:
    return ExternalMmapRegion(mapping_id=7, offset=100, len=4)


def lazy() -> WeightHandle:
    return WeightHandle.Lazy(LazyWeight.block_quantized_moe([region()], resident))


# The seed's three tests.


def test_stock_ep_materializes_the_resident_fallback() -> None:
    negotiated = lazy().negotiate(ExecutionProviderCapabilities.stock())
    assert isinstance(negotiated, NegotiatedWeight.Resident), (
        "stock EP must receive resident materialization"
    )
    assert negotiated.weight.bytes() == bytes([1, 2, 3, 4])


def test_nxrt_capability_preserves_lazy_block_quantized_moe_handle() -> None:
    materializations = 0

    def counting() -> ResidentWeight:
        nonlocal materializations
        materializations += 1
        return resident()

    handle = WeightHandle.Lazy(LazyWeight.block_quantized_moe([region()], counting))
    negotiated = handle.negotiate(ExecutionProviderCapabilities.nxrt_weight_paging())
    assert isinstance(negotiated, NegotiatedWeight.Lazy), "nxrt EP must receive lazy weight handle"
    weight = negotiated.weight
    assert weight.boundary == LazyWeightBoundary.BLOCK_QUANTIZED_MOE
    assert list(weight.regions) == [region()]
    assert materializations == 0
    assert weight.materialize().bytes() == bytes([1, 2, 3, 4])
    assert materializations == 1


def test_phase3a_device_binding_is_explicitly_unsupported_with_host_route() -> None:
    negotiated = lazy().negotiate(ExecutionProviderCapabilities.nxrt_weight_paging())
    with pytest.raises(Unsupported) as info:
        negotiated.try_bind_device(Phase3aHostOnlyBinder())
    assert info.value == Unsupported(
        "live device weight paging is not available on this EP; use materialize_host_fallback()"
    )
    assert negotiated.materialize_host_fallback().bytes() == bytes([1, 2, 3, 4])


# Negotiation details.


def test_capabilities_flags_and_equality() -> None:
    assert not ExecutionProviderCapabilities.stock().advertises(NXRT_WEIGHT_PAGING_CAPABILITY)
    paging = ExecutionProviderCapabilities.nxrt_weight_paging()
    assert paging.advertises("nxrt")
    assert paging == ExecutionProviderCapabilities.from_flags(["nxrt"])
    assert paging == ExecutionProviderCapabilities("nxrt")
    assert paging != ExecutionProviderCapabilities.stock()
    assert hash(paging) == hash(ExecutionProviderCapabilities.from_flags({"nxrt"}))
    with pytest.raises(TypeError):
        ExecutionProviderCapabilities.from_flags([1])


def test_is_lazy_for_and_resident_negotiation() -> None:
    paging = ExecutionProviderCapabilities.nxrt_weight_paging()
    stock = ExecutionProviderCapabilities.stock()
    assert lazy().is_lazy_for(paging)
    assert not lazy().is_lazy_for(stock)
    handle = WeightHandle.Resident(resident())
    assert not handle.is_lazy_for(paging)
    negotiated = handle.negotiate(paging)
    assert isinstance(negotiated, NegotiatedWeight.Resident)
    assert negotiated.weight is handle.weight
    with pytest.raises(Unsupported, match="resident weights do not require lazy device binding"):
        negotiated.try_bind_device(HostOnlyBinder())


def test_handles_match_like_the_enum() -> None:
    match lazy():
        case WeightHandle.Lazy(weight):
            assert weight.boundary is LazyWeightBoundary.BLOCK_QUANTIZED_MOE
        case _:
            pytest.fail("expected a lazy handle")
    assert repr(WeightHandle.Resident(resident())).startswith("WeightHandle.Resident(")
    with pytest.raises(TypeError):
        WeightHandle()
    with pytest.raises(TypeError):
        WeightHandle.Lazy(resident())


def test_device_binder_receives_the_lazy_weight() -> None:
    class RecordingBinder:
        def bind_block_quantized_moe(self, weight: LazyWeight) -> str:
            return f"bound {len(weight.regions)} region(s)"

    binder = RecordingBinder()
    assert isinstance(binder, LazyDeviceWeightBinder)
    negotiated = lazy().negotiate(ExecutionProviderCapabilities.nxrt_weight_paging())
    assert negotiated.try_bind_device(binder) == "bound 1 region(s)"


def test_boundary_matches_only_block_quantized_moe() -> None:
    boundary = LazyWeightBoundary.BLOCK_QUANTIZED_MOE
    assert boundary.matches("pkg.nxrt", "BlockQuantizedMoE")
    assert not boundary.matches("", "BlockQuantizedMoE")
    assert not boundary.matches("pkg.nxrt", "MoE")


def test_lazy_weight_requires_regions_and_hides_the_materializer() -> None:
    with pytest.raises(MissingRegions) as info:
        LazyWeight.block_quantized_moe([], resident)
    assert isinstance(info.value, WeightHandleError)
    assert str(info.value) == "lazy weight requires at least one external mmap region"
    text = repr(LazyWeight.block_quantized_moe([region()], resident))
    assert "<deferred>" in text and "mapping_id=7" in text


def test_materializer_errors_propagate_through_negotiation() -> None:
    def broken() -> ResidentWeight:
        raise InvalidResident("file changed on disk")

    handle = WeightHandle.Lazy(LazyWeight.block_quantized_moe([region()], broken))
    with pytest.raises(InvalidResident, match="file changed on disk"):
        handle.negotiate(ExecutionProviderCapabilities.stock())
    # A paging EP never triggers the materializer.
    assert handle.negotiate(ExecutionProviderCapabilities.nxrt_weight_paging())


# ResidentWeight validation.


def test_resident_wrong_byte_count() -> None:
    with pytest.raises(InvalidResident) as info:
        ResidentWeight(ir.DataType.FLOAT, [2, 2], bytes(15))
    assert info.value == InvalidResident("resident weight has 15 bytes, expected 16")


def test_resident_zero_dims_hold_no_bytes() -> None:
    weight = ResidentWeight(ir.DataType.FLOAT, [3, 0, 5], b"")
    assert weight.bytes().nbytes == 0
    assert weight.numpy().shape == (3, 0, 5)
    with pytest.raises(InvalidResident, match="has 4 bytes, expected 0"):
        ResidentWeight(ir.DataType.FLOAT, [0], bytes(4))


def test_resident_overflow_is_refused() -> None:
    big = sys.maxsize // 2 + 1
    with pytest.raises(InvalidResident, match="element count overflow"):
        ResidentWeight(ir.DataType.UINT8, [big, 3], b"")
    # A zero dimension wins over an overflowing product, as in the seed.
    assert ResidentWeight(ir.DataType.UINT8, [big, 0], b"").bytes().nbytes == 0
    with pytest.raises(InvalidResident, match="byte count overflow"):
        ResidentWeight(ir.DataType.COMPLEX128, [sys.maxsize], b"")
    with pytest.raises(InvalidResident, match="byte count exceeds"):
        ResidentWeight(ir.DataType.INT64, [sys.maxsize // 4], b"")
    with pytest.raises(InvalidResident, match="negative"):
        ResidentWeight(ir.DataType.UINT8, [-1], b"")


def test_resident_sub_byte_types_are_packed() -> None:
    assert ResidentWeight(ir.DataType.INT4, [5], bytes(3)).bytes().nbytes == 3
    assert ResidentWeight(ir.DataType.UINT4, [2, 4], bytes(4)).shape == (2, 4)
    with pytest.raises(InvalidResident, match="has 5 bytes, expected 3"):
        ResidentWeight(ir.DataType.INT4, [5], bytes(5))
    assert ResidentWeight(ir.DataType.INT2, [5], bytes(2)).bytes().nbytes == 2
    with pytest.raises(Unsupported, match="packed"):
        ResidentWeight(ir.DataType.INT4, [2], bytes(1)).numpy()


def test_resident_keeps_the_buffer_without_copying() -> None:
    backing = np.arange(6, dtype=np.float32)
    weight = ResidentWeight(ir.DataType.FLOAT, [2, 3], backing.view(np.uint8))
    view = weight.numpy()
    assert view.shape == (2, 3) and view.dtype == np.float32
    assert np.shares_memory(view, backing)
    assert not view.flags.writeable
    backing[0] = 42.0
    assert view[0, 0] == 42.0
    raw = bytearray(4)
    weight = ResidentWeight(ir.DataType.UINT8, [4], memoryview(raw))
    raw[1] = 9
    assert weight.bytes()[1] == 9
    assert weight.bytes().readonly
    assert weight == ResidentWeight(ir.DataType.UINT8, [4], bytes([0, 9, 0, 0]))


def test_resident_rejects_unsized_dtypes_and_non_buffers() -> None:
    with pytest.raises(InvalidResident, match="STRING"):
        ResidentWeight(ir.DataType.STRING, [1], b"")
    with pytest.raises(InvalidResident, match="buffer protocol"):
        ResidentWeight(ir.DataType.UINT8, [1], [1])
    assert ResidentWeight(np.float16, [1], bytes(2)).dtype == ir.DataType.FLOAT16

"""The kernel tables: OpRegistry's versioning rules, and the cpu table checked against onnx.defs."""

from __future__ import annotations

import inspect

import onnx
import pytest
from onnx import helper

from nxrt.ep_registry import EpRegistry
from nxrt.registry import KernelEntry, OpKey, OpRegistry
from nxrt_ep_cpu.ops import CPU_OPS


def test_end_versions_come_from_the_next_registration():
    ops = OpRegistry("t")

    @ops.op("Softmax", since=(1, 11))
    def softmax_1(x, /, *, axis=1):
        return x

    @ops.op("Softmax", since=13)
    def softmax_13(x, /, *, axis=-1):
        return x

    assert sorted(ops.keys()) == [
        OpKey("", "Softmax", 1, 10),
        OpKey("", "Softmax", 11, 12),
        OpKey("", "Softmax", 13, None),
    ]
    assert ops.lookup("", "Softmax", 9).fn is softmax_1
    assert ops.lookup("ai.onnx", "Softmax", 12).key.since_version == 11
    assert ops.lookup("", "Softmax", 21).fn is softmax_13
    assert ops.lookup("", "Softmax", 0) is None


def test_overlaps_and_duplicates_are_refused():
    ops = OpRegistry("t")
    ops.add(KernelEntry(OpKey("", "Relu", 6), lambda x: x))
    with pytest.raises(ValueError, match="registered twice"):
        ops.add(KernelEntry(OpKey("", "Relu", 6), lambda x: x))
    with pytest.raises(ValueError, match="overlaps"):
        ops.add(KernelEntry(OpKey("", "Relu", 1, 7), lambda x: x))


def test_match_explains_a_refusal():
    ops = OpRegistry("t")
    ops.op("Add", since=7)(lambda a, b: a + b)
    node = onnx_ir_node("Add", opset=6)
    assert ops.match(node, 6).reason == "Add has kernels from opsets 7, not 6"
    assert ops.match(onnx_ir_node("Sub"), 17).reason == "Sub is not implemented"
    assert ops.match(node, 17).supported


def onnx_ir_node(op_type, opset=17):
    import onnx_ir as ir

    model = helper.make_model(
        helper.make_graph(
            [helper.make_node(op_type, ["a", "b"], ["c"])],
            "g",
            [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [2]) for n in "ab"],
            [helper.make_tensor_value_info("c", onnx.TensorProto.FLOAT, [2])],
        ),
        opset_imports=[helper.make_opsetid("", opset)],
    )
    return next(iter(ir.from_proto(model).graph))


def test_ep_registry_resolves_aliases_and_orders_cpu_last():
    from nxrt.ep_registry import EpDescriptor

    registry = EpRegistry()
    for ep_id, aliases in [("cpu", ("CPUExecutionProvider",)), ("mlx", ()), ("aa", ())]:
        registry.add(EpDescriptor(ep_id, lambda c: None, aliases=aliases))
    assert registry.default_order() == ["aa", "mlx", "cpu"]
    assert registry.resolve("CPUExecutionProvider").id == "cpu"
    with pytest.raises(ValueError, match="already provided"):
        registry.add(EpDescriptor("cpu", lambda c: None))


CPU_KEYS = sorted(CPU_OPS.keys())


@pytest.mark.parametrize("key", CPU_KEYS, ids=str)
def test_cpu_kernel_versions_and_defaults_match_onnx_defs(key):
    schema = onnx.defs.get_schema(key.op_type, key.since_version, key.domain)
    assert schema.since_version == key.since_version, f"{key} is not a schema version"
    entry = CPU_OPS.lookup(key.domain, key.op_type, key.since_version)
    params = inspect.signature(entry.fn).parameters
    missing = [a for a in schema.attributes if a not in params]
    assert not missing, f"{key} does not accept attributes {missing}"
    for name, param in params.items():
        if param.kind is not inspect.Parameter.KEYWORD_ONLY or name not in schema.attributes:
            continue
        attr = schema.attributes[name]
        if not attr.default_value.name:  # required, or no default in the schema
            continue
        default = helper.get_attribute_value(attr.default_value)
        if isinstance(default, bytes):
            default = default.decode()
        if isinstance(default, list) and default and isinstance(default[0], bytes):
            default = [item.decode() for item in default]
        if isinstance(default, onnx.TensorProto):
            continue
        if isinstance(default, list) and default and isinstance(default[0], str):
            assert list(param.default) == default, f"{key}: default of {name}"
        else:
            assert param.default == pytest.approx(default), f"{key}: default of {name}"
    assert "/" in str(inspect.signature(entry.fn)) or not any(
        p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params.values()
    ), f"{key}: inputs must be positional-only"


def test_default_order_follows_declared_priority_with_cpu_last():
    from nxrt.ep_registry import EpDescriptor

    registry = EpRegistry()
    for ep_id, priority in [("cpu", 100), ("bridge", 10), ("accel", 20), ("zeta", 0)]:
        registry.add(EpDescriptor(ep_id, lambda c: None, priority=priority))
    assert registry.default_order() == ["accel", "bridge", "zeta", "cpu"]
